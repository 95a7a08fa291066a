"""OpenBLAS's idle workers: spin 2^20 cycles (~0.4 ms) after a threaded call, not 2^28.

After every multi-threaded BLAS call OpenBLAS's worker threads busy-wait (``sched_yield``
in a loop) for ``2 ** OPENBLAS_THREAD_TIMEOUT`` cycles before they sleep; its default, 28,
is ~0.1 s. On a machine with as many cores as threads that spinning worker holds a core
through the kernels that follow a GEMM, so tessera's own kernel threads (convolutions,
fused loops) wait for it: on 2 cores the CNN training graph ran no faster on two threads
than on one. With 20 the convolution-heavy steps are much faster and a GEMM-bound one is
unchanged (bench training: cnn, mlp; bench models: resnet18 infer b1).

OpenBLAS reads the variable once, when NumPy loads it, so this works only when tessera is
imported before NumPy; a value the user set is kept.

>>> tune_openblas() in (True, False)
True
"""
from __future__ import annotations

import os
import sys

__all__ = ["tune_openblas", "THREAD_TIMEOUT"]

THREAD_TIMEOUT = "20"


def tune_openblas() -> bool:
    """Set ``OPENBLAS_THREAD_TIMEOUT`` for this process (and its children) unless NumPy is
    loaded already or the user set it; whether it was set."""
    if "numpy" in sys.modules or "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return False
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = THREAD_TIMEOUT
    return True
