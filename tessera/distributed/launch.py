"""``python -m tessera.distributed.launch``: run a script on N processes through MPI.

It only builds the ``mpiexec`` command line and environment; MPI starts the processes. Each
rank runs ``python -m mpi4py script.py args``, so a rank that raises prints its traceback
and aborts every rank of the job.

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
    cmd += [sys.executable, "-m", "mpi4py"]
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


if __name__ == "__main__":
    sys.exit(main())
