"""A rank that leaves a two-rank job early fails the job within seconds, naming it.

Rank 1 of a short training loop raises, exits (``sys.exit(0)``, ``sys.exit(3)``,
``os._exit(0)``), is killed (SIGKILL) or hangs (with a small ``TESSERA_COMM_TIMEOUT``) in its
fourth step, under ``mpiexec -n 2 python script.py`` and under
``python -m tessera.distributed.launch``. The job must end nonzero, say on stderr that rank 1
is the one, and rank 0 must not get past the loop. Jobs where every rank finishes (without
``destroy_process_group``), or where rank 1 exits after its last collective while rank 0
still computes alone, end with status 0; ranks that all finish with ``sys.exit(5)`` end the
job with status 5.

Every job runs at once in a thread pool (each is mostly waiting for its processes); the
subprocess timeout is a hang guard: a rank that waits for a dead peer until the default
communication timeout would exceed it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.distributed._mpi import MPIEXEC, ROOT

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC),
                                reason="mpiexec is not installed (pip install mpich)")

TRAIN = """
    import os, signal, sys, time
    import tessera
    import tessera.distributed as dist

    fault = os.environ["FAULT"]
    rank = dist.get_rank()
    x = tessera.ones(4)
    for step in range(8):
        if rank == 1 and step == 3:
            if fault == "raise":
                raise ValueError("a bad batch")
            if fault == "exit0":
                sys.exit(0)
            if fault == "exit3":
                sys.exit(3)
            if fault == "os_exit0":
                os._exit(0)
            if fault == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if fault == "hang":
                time.sleep(300)
        dist.all_reduce(x)
        time.sleep(0.02)
    if rank == 1 and fault == "done_early":
        sys.exit(0)  # after its last collective: rank 0 still computes alone
    if rank == 0 and fault == "done_early":
        time.sleep(1.0)
        (x * 2).sum()
    print(f"rank {rank}: training finished", flush=True)
    if fault == "status5":
        sys.exit(5)
"""

FAULTS = ("raise", "exit0", "exit3", "os_exit0", "sigkill", "hang")
FINE = ("none", "done_early", "status5")
RUNNERS = ("mpiexec", "launch")
HANG_GUARD = 60  # seconds; a detected fault ends a job in a few


def _command(runner: str, script: str) -> list[str]:
    if runner == "mpiexec":
        return [MPIEXEC, "-n", "2", sys.executable, script]
    return [sys.executable, "-m", "tessera.distributed.launch", "--nproc-per-node", "2",
            "--threads-per-proc", "1", script]


def _run(case: tuple[str, str], script: str) -> subprocess.CompletedProcess:
    runner, fault = case
    # a collective that waited for its dead peer until the timeout would exceed the guard
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", FAULT=fault,
               TESSERA_COMM_TIMEOUT="5" if fault == "hang" else "600")
    try:
        return subprocess.run(_command(runner, script), cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=HANG_GUARD)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, "hang", str(e.stdout), str(e.stderr))


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict:
    script = tmp_path_factory.mktemp("rank_faults") / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    cases = [(r, f) for r in RUNNERS for f in FAULTS + FINE]
    with ThreadPoolExecutor(6) as pool:
        done = pool.map(lambda c: _run(c, str(script)), cases)
        return dict(zip(cases, done))


def _report(p: subprocess.CompletedProcess) -> str:
    return f"status {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"


# MPICH's own mpiexec kills every rank at once when one ends without MPI's finalize (by
# os._exit or a signal), and would report os._exit(0) as the job's status 0: under it, each
# rank runs under a supervisor that names such a rank and ends nonzero (the launcher's, or
# the one tessera forks under a bare mpiexec: see tessera/distributed/launch.py). Rank 0's
# own report, as it waits, may not get out before mpiexec's clean-up kills it.
_MPIEXEC_CLEANS_UP = {("mpiexec", "os_exit0"), ("mpiexec", "sigkill")}


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("fault", FAULTS)
def test_a_rank_that_leaves_early_fails_the_job_naming_it(jobs, runner, fault):
    p = jobs[runner, fault]
    assert p.returncode != "hang", f"the job hung for {HANG_GUARD} s\n" + _report(p)
    assert "training finished" not in p.stdout, _report(p)
    assert p.returncode != 0, _report(p)
    assert re.search(r"\brank 1\b", p.stderr), _report(p)
    if fault in ("exit0", "os_exit0", "sigkill") and (runner, fault) not in _MPIEXEC_CLEANS_UP:
        # rank 0 names it while it waits
        assert "rank 1 left the job before the others" in p.stderr, _report(p)
        assert "all_reduce(sum) on ranks [0, 1]" in p.stderr, _report(p)
    if fault == "os_exit0" and runner == "mpiexec":
        assert re.search(r"rank 1 \(process \d+\) ended with status 0 without Python's exit "
                         "handlers", p.stderr), _report(p)
    if fault == "raise":
        assert "rank 1 ended with an uncaught ValueError" in p.stderr, _report(p)
    if fault == "hang":
        assert "CommTimeout" in p.stderr and "rank 1 did not join it" in p.stderr, _report(p)
    if fault == "sigkill":
        assert "rank 1 (process" in p.stderr and "SIGKILL" in p.stderr, _report(p)


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("fault", FINE)
def test_ranks_that_finish_end_the_job_with_their_status(jobs, runner, fault):
    """Without destroy_process_group, and with a rank that exits after its last collective
    while another computes alone: nobody left early, status 0; every rank ending with
    ``sys.exit(5)``: status 5 (mpi4py's runner, under the launcher, ends it by MPI_Abort)."""
    p = jobs[runner, fault]
    assert p.returncode == (5 if fault == "status5" else 0), _report(p)
    assert "rank 0: training finished" in p.stdout, _report(p)
    if fault in ("none", "status5"):
        assert "rank 1: training finished" in p.stdout, _report(p)
    assert "left the job" not in p.stderr and "without Python's exit" not in p.stderr, \
        _report(p)
    if fault != "status5":
        assert "Abort" not in p.stderr, _report(p)
