"""Fused optimizer updates in C (``c/optim.c``): one pass over a parameter and its state per
step.

Adam's update written with tensor ops is eight to ten kernel calls per parameter, each a
pass over memory and a few microseconds of dispatch, which small models' many small
parameters make most of a step (bench demo: LeNet-5 with Adam). ``adam_step`` does the same
arithmetic, in the same order and the same precision (the parameter's dtype, Python
numbers rounded to it, as NumPy's weak scalars are), element by element in one loop;
results differ from the op-by-op update only where the C compiler fuses a multiply-add (one
rounding fewer).

>>> import numpy as np
>>> p, g = np.ones(4, np.float32), np.full(4, 0.5, np.float32)
>>> m, v = np.zeros(4, np.float32), np.zeros(4, np.float32)
>>> if available(np.float32):
...     adam_step(p, g, m, v, None, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8,
...               weight_decay=0.0, decoupled=False, maximize=False, step=1)
... else:
...     p[:] = 0.9
>>> p.round(4)
array([0.9, 0.9, 0.9, 0.9], dtype=float32)
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from tessera.kernels.csource import source

__all__ = ["available", "adam_step"]

_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
MAXIMIZE, DECOUPLED, AMSGRAD = 1, 2, 4


@functools.lru_cache(maxsize=1)
def _lib():
    from tessera.kernels.cc import load
    lib = load(source("optim.c"))
    for s in _SUFFIX.values():
        f = getattr(lib, f"tsr_adam_{s}")
        f.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 3
        f.restype = None
    return lib


def available(dtype) -> bool:
    """Whether the fused kernels run for ``dtype``: the C kernels of
    ``tessera.kernels.window`` can (float32/float64, a compiler, code generation on) and
    these built."""
    from tessera.kernels.window import available as kernels_available
    if not kernels_available(dtype):
        return False
    try:
        _lib()
    except Exception:  # a broken toolchain: the op-by-op update still works
        return False
    return True


def adam_step(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, vmax, *,
              lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
              decoupled: bool, maximize: bool, step: float) -> None:
    """One Adam (or AdamW: ``decoupled``) step of C-contiguous arrays of one dtype, in
    place: parameter ``p``, gradient ``g``, moments ``m`` and ``v`` and, for AMSGrad, the
    running maximum ``vmax`` (else None); ``step`` is the step count after this step."""
    bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
    s = np.array([1 - lr * weight_decay, weight_decay, 1 - beta1, beta2, 1 - beta2, eps,
                  -(lr / bc1), bc2 ** 0.5, 1 - (1 - beta1)], np.float64)
    flags = (MAXIMIZE if maximize else 0) | (DECOUPLED if decoupled else 0) | \
        (AMSGRAD if vmax is not None else 0)
    f = getattr(_lib(), f"tsr_adam_{_SUFFIX[p.dtype]}")
    f(p.ctypes.data, g.ctypes.data, m.ctypes.data, v.ctypes.data,
      None if vmax is None else vmax.ctypes.data, s.ctypes.data, flags, 0, p.size)
