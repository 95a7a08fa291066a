"""``python -m tessera.distributed.launch``: run a script on N processes through MPI.

It only builds the ``mpiexec`` command line and environment; MPI starts the processes. Each
rank runs ``python -m mpi4py script.py args``, so a rank that raises prints its traceback
and aborts every rank of the job, under a small supervisor (``_supervise``) that names the
rank when a signal kills it. A rank that leaves before the others (exits, is killed, or
calls ``os._exit``) makes the ranks waiting for it fail naming it, and the job end nonzero
within seconds (``comm/mpi.py``); for that, MPICH's mpiexec runs without its own clean-up
on one machine, which would end every rank at once and report ``os._exit(0)`` as success.
Under a bare MPICH ``mpiexec``, the MPI communicator forks each rank under a supervisor of
the same kind (``supervise_bare_rank``) before MPI starts.

    python -m tessera.distributed.launch --nproc-per-node 2 train.py --epochs 3
    python -m tessera.distributed.launch --nnodes 2 --nproc-per-node 4 --hostfile hosts train.py

>>> build_command(["--nproc-per-node", "2", "--mpiexec", "mpiexec", "train.py", "--lr", "0.1"]
...               )[0][:3]
['mpiexec', '-n', '2']
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

__all__ = ["build_command", "main", "bare_hydra_rank", "supervise_bare_rank"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tessera.distributed.launch",
        description="Run a tessera script on several processes with mpiexec.")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1,
                   help="processes per node (default 1)")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--hostfile", default=None, help="MPI host file naming the nodes")
    p.add_argument("--mpiexec", default=None,
                   help="the mpiexec to run (default: next to this Python, then on PATH)")
    p.add_argument("--threads-per-proc", type=int, default=None,
                   help="OMP_NUM_THREADS of each rank (default: the cores of a node shared "
                        "out, unless OMP_NUM_THREADS is set)")
    p.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    p.add_argument("-m", "--module", action="store_true",
                   help="the target is a module name (python -m module)")
    p.add_argument("script", help="the script (or module, with -m) to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def _find_mpiexec(given: str | None) -> str:
    if given:
        return given
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return here
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise SystemExit("tessera.distributed.launch: no mpiexec found; install one with "
                         "'pip install mpich mpi4py' (or pass --mpiexec)")
    return found


def _flavour(mpiexec: str) -> str:
    """"open-mpi", "hydra" (MPICH's mpiexec) or "" (unknown), from ``mpiexec --version``."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    text = out.stdout + out.stderr
    if "Open MPI" in text or "OpenRTE" in text:
        return "open-mpi"
    return "hydra" if "HYDRA" in text else ""


def build_command(argv: list[str]) -> tuple[list[str], dict]:
    """The mpiexec command line and the environment for ``argv`` (the launcher's args)."""
    a = _parser().parse_args(argv)
    if a.nproc_per_node < 1 or a.nnodes < 1:
        raise SystemExit("tessera.distributed.launch: --nproc-per-node and --nnodes must be "
                         "at least 1")
    mpiexec = _find_mpiexec(a.mpiexec)
    n = a.nproc_per_node * a.nnodes
    cmd = [mpiexec, "-n", str(n)]
    flavour = _flavour(mpiexec)
    if a.hostfile or a.nnodes > 1:
        if flavour == "open-mpi":
            cmd += (["--hostfile", a.hostfile] if a.hostfile else []) + \
                ["--map-by", f"ppr:{a.nproc_per_node}:node"]
        else:  # MPICH (hydra)
            cmd += (["-f", a.hostfile] if a.hostfile else []) + ["-ppn", str(a.nproc_per_node)]
    elif flavour == "hydra":
        # a rank that ends without MPI's finalize (os._exit) makes hydra kill the others
        # at once and report the job's status as that rank's, 0 for os._exit(0): a failed
        # job that looks done. Without that clean-up the others see its process gone,
        # fail naming it, and the job ends nonzero (comm/mpi.py); on several machines
        # they could not see it, and hydra's clean-up stays
        cmd += ["-disable-auto-cleanup"]
    # each rank under a small supervisor (this file, run alone: no tessera import), which
    # names the rank when a signal kills it: MPI's launchers name only a process id
    cmd += [sys.executable, "-I", os.path.abspath(__file__), _SUPERVISE, sys.executable, "-m",
            "mpi4py"]
    cmd += (["-m", a.script] if a.module else [a.script]) + list(a.args)
    env = dict(os.environ, TESSERA_LAUNCHED="1")
    if a.threads_per_proc is not None:
        env["OMP_NUM_THREADS"] = str(a.threads_per_proc)
    elif "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // a.nproc_per_node))
    return cmd, env


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmd, env = build_command(argv)
    if _parser().parse_args(argv).dry_run:
        print(" ".join(cmd))
        return 0
    return subprocess.run(cmd, env=env).returncode


_SUPERVISE = "--supervise-rank"
_RANK_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def _die_with_parent() -> None:
    # in the rank's process before it starts: when MPI's launcher kills the supervisor
    # (SIGKILL cannot be passed on), the kernel kills the rank too (Linux)
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _rank() -> str:
    return next((os.environ[k] for k in _RANK_ENV if k in os.environ), "?")


def _watch(pid: int) -> int:
    """Wait for the rank's process ``pid`` with interrupts and terminations passed on to
    it; its wait status as ``os.waitstatus_to_exitcode`` gives it (negative: a signal)."""
    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    # MPICH's mpiexec sends it when another rank fails: meant for MPI inside the rank,
    # which finds out by itself; its default action would end this process
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _killed(rank: str, pid: int, status: int) -> int:
    """Say on stderr which rank a signal killed and return 128 + the signal's number (an
    exit status: MPICH's mpiexec then leaves the other ranks to notice the missing one
    and name it)."""
    os.write(2, f"tessera.distributed.launch: rank {rank} (process {pid}) was killed by "
                f"{signal.Signals(-status).name}\n".encode())
    return 128 - status


def _supervise(cmd: list[str]) -> int:
    """Run one rank's process ``cmd`` and return its exit status; when a signal ends it,
    say which rank it was (``_killed``)."""
    rank = _rank()
    # close_fds=False: the rank inherits the MPI launcher's connection (PMI_FD), which only
    # it keeps: the launcher takes that connection closing for the rank's end
    child = subprocess.Popen(cmd, close_fds=False, preexec_fn=_die_with_parent)
    pmi = os.environ.get("PMI_FD", "")
    if pmi.isdigit():
        os.close(int(pmi))
    status = _watch(child.pid)
    child.returncode = status  # (reaped here: Popen must not wait for it again)
    return _killed(rank, child.pid, status) if status < 0 else status


# ---- a supervisor under a bare mpiexec -----------------------------------------------------
# Under ``mpiexec -n 2 python train.py`` (MPICH's hydra, with its clean-up), a rank whose
# process ends without MPI's finalize makes hydra kill every rank at once and report that
# rank's own status as the job's: 0 for ``os._exit(0)``, a failed job that looks done, with
# no rank named. ``supervise_bare_rank`` (from the MPI communicator, before MPI starts)
# forks: the child goes on as the rank, and the process hydra started waits for it and
# ends with its status, or nonzero, naming the rank, when it ends without Python's exit
# handlers or by a signal.

_LINGER_SECONDS = 1.0  # a failed rank's supervisor waits so that its peers can report it
_CLEAN = b"c"          # what a rank writes at interpreter exit


def bare_hydra_rank() -> bool:
    """Whether this process is a rank of a job of several that MPICH's own ``mpiexec``
    started without tessera's launcher, and whose MPI has not started yet: where
    ``supervise_bare_rank`` applies. ``TESSERA_RANK_SUPERVISOR=0`` turns it off.

    >>> bare_hydra_rank() if "PMI_FD" not in os.environ else False
    False
    """
    env = os.environ
    if env.get("TESSERA_LAUNCHED") == "1" or env.get("TESSERA_RANK_SUPERVISOR") == "0" or \
            "PMI_FD" not in env or env.get("PMI_SIZE", "1") in ("", "1") or \
            "mpi4py.MPI" in sys.modules or not hasattr(os, "fork") or \
            not sys.platform.startswith("linux"):
        return False
    import threading
    # forking copies only the calling thread into the rank: another Python thread of the
    # script would go on in the supervisor instead. Tessera's own may: a compiling thread
    # only fills the kernel cache, and the kernel pool starts afresh in a forked child
    me = threading.current_thread()
    return me is threading.main_thread() and all(
        t is me or t.name.startswith("tessera-") for t in threading.enumerate())


def supervise_bare_rank() -> None:
    """Fork (``bare_hydra_rank`` must hold): return in the child, which goes on as the rank;
    in this process, wait for it and end with its exit status, or, when it ends without
    Python's exit handlers (``os._exit``, a crash in C) or by a signal, say which rank on
    stderr and end nonzero. This process keeps hydra's connection (``PMI_FD``) open, so
    hydra sees the rank end only when this process does, with that status."""
    sys.stdout.flush()
    sys.stderr.flush()
    rank = _rank()
    parent = os.getpid()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the rank
        os.close(r)
        _die_with_parent()
        if os.getppid() != parent:  # the supervisor already ended
            os._exit(1)
        import atexit

        def clean_exit() -> None:
            if os.getpid() == me:  # (not in a process the rank forks in turn)
                try:
                    os.write(w, _CLEAN)
                except OSError:
                    pass
        me = os.getpid()
        atexit.register(clean_exit)
        return
    os.close(w)
    os.set_blocking(r, False)
    status = _watch(pid)
    try:
        clean = os.read(r, 1) == _CLEAN
    except BlockingIOError:
        clean = False
    if status < 0:
        code = _killed(rank, pid, status)
    elif clean:
        os._exit(status)
    else:
        os.write(2, f"tessera: rank {rank} (process {pid}) ended with status {status} without "
                    "Python's exit handlers (os._exit, or a crash in C code); the job did not "
                    "finish\n".encode())
        code = status or 1
    time.sleep(_LINGER_SECONDS)
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == [_SUPERVISE]:
        code = _supervise(sys.argv[2:])
        os._exit(code)  # no interpreter shutdown: it would restore SIGUSR1's default action
    sys.exit(main())
