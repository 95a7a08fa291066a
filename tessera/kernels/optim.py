"""Fused optimizer updates in C: one pass over a parameter and its state per step.

Adam's update written with tensor ops is eight to ten kernel calls per parameter, each a
pass over memory and a few microseconds of dispatch (bench demo: LeNet-5 with Adam).
``adam_step`` does the same arithmetic, in the same order and
the same precision (the parameter's dtype, Python numbers rounded to it, as NumPy's weak
scalars are), element by element in one loop; results differ from the op-by-op update
only where the C compiler fuses a multiply-add (one rounding fewer).

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

__all__ = ["available", "adam_step"]

_SOURCE = r"""
#include <math.h>
#include <stdint.h>

enum { MAXIMIZE = 1, DECOUPLED = 2, AMSGRAD = 4 };

/* one element of Adam: the ops of tessera.optim.adam._adam_update, in their order and
   precision. L2 and AMS are constants in each expansion, so the loop has no branches
   (flags tested inside it kept GCC's vectorised loop from running: 10x slower) */
#define ADAM_LOOP(T, SQRT, L2, AMS)                                                      \
    _Pragma("omp simd")                                                                  \
    for (int64_t i = lo; i < hi; i++) {                                                  \
        T gi = g[i] * sign, pi = p[i] * decay;                                           \
        if (L2) gi = gi + wd * pi;                                                       \
        T d = gi - m[i];                                                                 \
        T mi = near ? m[i] + d * w : gi - d * w1;                                        \
        T vi = v[i] * b2;                                                                \
        vi = vi + c2 * gi * gi;                                                          \
        m[i] = mi;                                                                       \
        v[i] = vi;                                                                       \
        if (AMS) { vi = vmax[i] > vi || vmax[i] != vmax[i] ? vmax[i] : vi; vmax[i] = vi; } \
        T denom = SQRT(vi) / bc2 + eps;                                                  \
        p[i] = pi + value * mi / denom;                                                  \
    }

/* Adam on [lo, hi). s[]: decay (1 - lr wd), wd, w (1 - beta1), beta2, 1 - beta2, eps,
   -step_size, sqrt(1 - beta2^t), 1 - w. Negating the gradient (maximize) and the decay
   (decoupled weight decay) are multiplications by -1 and 1 - lr wd, exact when off (1) */
#define ADAM(T, S, SQRT)                                                                 \
void tsr_adam_##S(T* restrict p, const T* restrict g, T* restrict m, T* restrict v,      \
                  T* restrict vmax, const double* s, int64_t flags, int64_t lo,          \
                  int64_t hi) {                                                          \
    const int dec = flags & DECOUPLED, on = s[1] != 0, near = fabs(s[2]) < 0.5;          \
    const T sign = flags & MAXIMIZE ? (T)-1 : (T)1, decay = dec && on ? (T)s[0] : (T)1,  \
            wd = (T)s[1], w = (T)s[2], b2 = (T)s[3], c2 = (T)s[4], eps = (T)s[5],        \
            value = (T)s[6], bc2 = (T)s[7], w1 = (T)s[8];                                \
    int l2 = !dec && on, ams = (flags & AMSGRAD) != 0;                                   \
    if (l2 && ams) { ADAM_LOOP(T, SQRT, 1, 1) }                                          \
    else if (l2) { ADAM_LOOP(T, SQRT, 1, 0) }                                            \
    else if (ams) { ADAM_LOOP(T, SQRT, 0, 1) }                                           \
    else { ADAM_LOOP(T, SQRT, 0, 0) }                                                    \
}

ADAM(float, f32, sqrtf)
ADAM(double, f64, sqrt)
"""

_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
MAXIMIZE, DECOUPLED, AMSGRAD = 1, 2, 4


@functools.lru_cache(maxsize=1)
def _lib():
    from tessera.kernels.cc import load
    lib = load(_SOURCE)
    for s in _SUFFIX.values():
        f = getattr(lib, f"tsr_adam_{s}")
        f.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 3
        f.restype = None
    return lib


def available(dtype) -> bool:
    """Whether the fused kernels run for ``dtype``: the C kernels of ``tessera.codegen.
    kernels`` can (float32/float64, a compiler, code generation on) and these built."""
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
