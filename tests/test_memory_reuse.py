"""tessera keeps freed memory for reuse (glibc's thresholds raised on import)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

_CHILD = """
import resource
import numpy as np
import tessera
print(tessera._runtime.malloc.keep_freed_memory())
def step():   # a training step's worth of 8 MB intermediates, freed at its end
    arrays = [np.ones(2 << 20, np.float32) for _ in range(4)]
    del arrays
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _run(**env) -> tuple[str, int]:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("MALLOC_") and k != "TESSERA_KEEP_FREED_MEMORY"}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", _CHILD], env=full, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    applied, faults = out.stdout.split()
    return applied, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_memory_is_reused_without_page_faults():
    applied, faults = _run()
    if applied != "True":
        pytest.skip("not glibc")
    # 20 steps x 4 arrays x 2048 pages would fault ~160k times if each came back fresh
    assert faults < 2000, faults
    off, off_faults = _run(TESSERA_KEEP_FREED_MEMORY="0")
    assert off == "False"
    assert off_faults > 10 * 2048, off_faults   # glibc's default returns them to the OS


def test_the_users_own_glibc_settings_win():
    applied, _ = _run(MALLOC_TRIM_THRESHOLD_="1000000")
    assert applied == "False"
