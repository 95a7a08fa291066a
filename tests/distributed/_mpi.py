"""Running a script under ``mpiexec -n N`` from a test (with a timeout)."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def run_mpi(tmp_path, code: str, n: int = 2, timeout: float = 90, env: dict | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    """Run ``code`` as a script on ``n`` ranks (``python -m mpi4py``: a rank that raises
    aborts the job); returns the completed process (stdout of every rank)."""
    if not os.path.exists(MPIEXEC):
        pytest.skip("mpiexec is not installed (pip install mpich)")
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    full_env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", TESSERA_COMM_TIMEOUT="60",
                    TESSERA_TEST_OUT=str(tmp_path))
    full_env.update(env or {})
    proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, "-m", "mpi4py", str(script)],
                          cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"mpiexec exited with {proc.returncode}\nstdout:\n{proc.stdout}\n"
                             f"stderr:\n{proc.stderr}")
    return proc


def emit(obj) -> None:
    """In a script run by ``run_mpi``: hand ``obj`` back to the test (one per rank)."""
    from tessera.distributed import get_rank
    with open(os.path.join(os.environ["TESSERA_TEST_OUT"], f"out{get_rank()}.pkl"), "wb") as f:
        pickle.dump(obj, f)


def outputs(tmp_path, n: int = 2) -> list:
    """What each rank ``emit``-ted."""
    res = []
    for r in range(n):
        with open(tmp_path / f"out{r}.pkl", "rb") as f:
            res.append(pickle.load(f))
    return res
