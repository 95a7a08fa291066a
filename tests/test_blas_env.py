"""tessera sets OpenBLAS's worker spin when it is imported before NumPy."""
from __future__ import annotations

import os
import subprocess
import sys

_CHILD = "import os\n{first}\nprint(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"


def _run(first: str, **env) -> str:
    full = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", _CHILD.format(first=first)], env=full,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_set_when_tessera_comes_before_numpy():
    assert _run("import tessera\nimport numpy") == "20"


def test_too_late_after_numpy():
    assert _run("import numpy\nimport tessera") == "None"


def test_the_users_value_is_kept():
    assert _run("import tessera", OPENBLAS_THREAD_TIMEOUT="26") == "26"
