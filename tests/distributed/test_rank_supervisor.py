"""The supervisor a rank forks under a bare MPICH ``mpiexec`` (``launch.supervise_bare_rank``),
run here without MPI: the process that calls it must end as the rank ends (status, output),
except that a rank ending without Python's exit handlers or by a signal fails it nonzero,
naming the rank. The oracle is the same script run without the supervisor. The rank-fault
matrix under a real ``mpiexec -n 2`` is ``tests/adversarial/test_rank_faults.py``."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.distributed._mpi import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the supervisor forks (Linux)")

SCRIPT = """
    import importlib.util, os, signal, sys
    # launch.py alone (it imports no tessera module): a rank's start-up is not under test
    spec = importlib.util.spec_from_file_location("launch", os.environ["LAUNCH"])
    launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch)
    launch._LINGER_SECONDS = 0
    print("before", end=" ")  # (buffered: printed once, not by both processes)
    if os.environ.get("SUPERVISE") == "1":
        launch.supervise_bare_rank()
    print("after", flush=True)
    fault = os.environ["FAULT"]
    if fault == "exit3":
        sys.exit(3)
    if fault == "raise":
        raise ValueError("a bad batch")
    if fault == "os_exit0":
        os._exit(0)
    if fault == "os_exit4":
        os._exit(4)
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "fork_child_exits":  # a process the rank forks exits normally: not the rank
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
        os._exit(0)
"""


def _run(tmp_path, fault: str, supervise: bool) -> subprocess.CompletedProcess:
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ, FAULT=fault, SUPERVISE="1" if supervise else "0", PMI_RANK="1",
               LAUNCH=os.path.join(ROOT, "tessera", "distributed", "launch.py"))
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("fault", ["none", "exit3", "raise"])
def test_a_rank_that_ends_through_python_ends_the_same_supervised(tmp_path, fault):
    want, got = _run(tmp_path, fault, False), _run(tmp_path, fault, True)
    assert got.returncode == want.returncode, got.stderr
    assert got.stdout == want.stdout == "before after\n"
    assert got.stderr == want.stderr


@pytest.mark.parametrize("fault,status", [("os_exit0", 1), ("os_exit4", 4),
                                          ("fork_child_exits", 1)])
def test_a_rank_that_ends_without_exit_handlers_fails_naming_it(tmp_path, fault, status):
    assert _run(tmp_path, fault, False).returncode == status - (status == 1)
    got = _run(tmp_path, fault, True)
    assert got.returncode == status, got.stderr
    assert got.stdout == "before after\n"
    assert "rank 1 (process " in got.stderr and \
        f"ended with status {status - (status == 1)} without Python's exit handlers" \
        in got.stderr, got.stderr


def test_a_rank_killed_by_a_signal_is_named(tmp_path):
    assert _run(tmp_path, "sigkill", False).returncode == -9
    got = _run(tmp_path, "sigkill", True)
    assert got.returncode == 128 + 9, got.stderr
    assert "rank 1 (process " in got.stderr and "was killed by SIGKILL" in got.stderr


def test_where_the_supervisor_applies(monkeypatch):
    import threading

    from tessera.distributed import launch
    main = threading.main_thread()
    monkeypatch.setattr(threading, "enumerate", lambda: [main])
    hydra = {"PMI_FD": "5", "PMI_SIZE": "2", "PMI_RANK": "0"}
    for k in ("TESSERA_LAUNCHED", "TESSERA_RANK_SUPERVISOR", "PMI_FD", "PMI_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert not launch.bare_hydra_rank()  # not started by mpiexec
    for k, v in hydra.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    assert launch.bare_hydra_rank()
    for off in ({"TESSERA_LAUNCHED": "1"}, {"TESSERA_RANK_SUPERVISOR": "0"},
                {"PMI_SIZE": "1"}):
        with monkeypatch.context() as m:
            for k, v in off.items():
                m.setenv(k, v)
            assert not launch.bare_hydra_rank(), off
    with monkeypatch.context() as m:  # MPI already started (python -m mpi4py)
        m.setitem(sys.modules, "mpi4py.MPI", object())
        assert not launch.bare_hydra_rank()
    # a thread of the script's own would stay with the supervisor; tessera's may
    script_thread, kernel_thread = threading.Thread(), threading.Thread(name="tessera-cc")
    monkeypatch.setattr(threading, "enumerate", lambda: [main, kernel_thread])
    assert launch.bare_hydra_rank()
    monkeypatch.setattr(threading, "enumerate", lambda: [main, script_thread])
    assert not launch.bare_hydra_rank()
