"""``python -m tessera.distributed.launch``: run a script on N processes through MPI.

It only builds the ``mpiexec`` command line and environment; MPI starts the processes. Each
rank runs ``python -m mpi4py script.py args``, so a rank that raises prints its traceback
and aborts every rank of the job, under a small supervisor (``_supervise``) that names the
rank when a signal kills it. A rank that leaves before the others (exits, is killed, or
calls ``os._exit``) makes the ranks waiting for it fail naming it, and the job end nonzero
within seconds (``comm/mpi.py``); for that, MPICH's mpiexec runs without its own clean-up
on one machine, which would end every rank at once and report ``os._exit(0)`` as success.

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

__all__ = ["build_command", "main"]


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


def _supervise(cmd: list[str]) -> int:
    """Run one rank's process ``cmd`` and return its exit status; when a signal ends it,
    say which rank it was and return 128 + the signal's number (an exit status: MPICH's
    mpiexec then leaves the other ranks to notice the missing one and name it).
    Interrupts and terminations are passed on to the rank."""
    rank = next((os.environ[k] for k in _RANK_ENV if k in os.environ), "?")
    # close_fds=False: the rank inherits the MPI launcher's connection (PMI_FD), which only
    # it keeps: the launcher takes that connection closing for the rank's end
    child = subprocess.Popen(cmd, close_fds=False, preexec_fn=_die_with_parent)
    pmi = os.environ.get("PMI_FD", "")
    if pmi.isdigit():
        os.close(int(pmi))

    def forward(signum, frame):
        child.send_signal(signum)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    # MPICH's mpiexec sends it when another rank fails: meant for MPI inside the rank,
    # which finds out by itself; its default action would end this process
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    status = child.wait()
    if status < 0:
        sys.stderr.write(f"tessera.distributed.launch: rank {rank} (process {child.pid}) was "
                         f"killed by {signal.Signals(-status).name}\n")
        sys.stderr.flush()
        return 128 - status
    return status


if __name__ == "__main__":
    if sys.argv[1:2] == [_SUPERVISE]:
        code = _supervise(sys.argv[2:])
        os._exit(code)  # no interpreter shutdown: it would restore SIGUSR1's default action
    sys.exit(main())
