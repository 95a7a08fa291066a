"""``finfo``/``iinfo`` (numeric limits of a dtype) and the CPU thread count, as in PyTorch.

>>> import tessera
>>> tessera.finfo(tessera.float32).eps
1.1920928955078125e-07
>>> tessera.iinfo(tessera.int8).max
127
"""
from __future__ import annotations

import os

import numpy as np

from tessera import _dtype as D

__all__ = ["finfo", "iinfo", "set_num_threads", "get_num_threads"]


class finfo:
    """Limits of a floating dtype: bits, eps, max, min, tiny (smallest_normal), resolution."""

    def __init__(self, type: D.dtype | None = None):
        dt = D.get_default_dtype() if type is None else D.as_dtype(type)
        if dt.category != 2 and dt.category != 3:
            raise TypeError(f"finfo(): expected a floating point dtype, got {dt}")
        info = np.finfo(dt.to_real().np) if dt is not D.bfloat16 else _bf16_info()
        self.dtype = dt.to_real().name
        self.bits = int(info.bits)
        self.eps = float(info.eps)
        self.max = float(info.max)
        self.min = float(info.min)
        self.tiny = self.smallest_normal = float(info.tiny)
        self.resolution = 10.0 ** -int(info.precision)

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution}, min={self.min}, max={self.max}, "
                f"eps={self.eps}, smallest_normal={self.tiny}, tiny={self.tiny}, "
                f"dtype={self.dtype})")


def _bf16_info():
    import ml_dtypes
    return ml_dtypes.finfo(ml_dtypes.bfloat16)


class iinfo:
    """Limits of an integer dtype: bits, min, max."""

    def __init__(self, type: D.dtype):
        dt = D.as_dtype(type)
        if dt.category > 1:
            raise TypeError(f"iinfo(): expected an integer dtype, got {dt}")
        info = np.iinfo(dt.np) if dt is not D.bool_ else None
        self.dtype = dt.name
        self.bits = 8 if info is None else int(info.bits)
        self.min = 0 if info is None else int(info.min)
        self.max = 1 if info is None else int(info.max)

    def __repr__(self) -> str:
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"


_LIMITER = None


def set_num_threads(n: int) -> None:
    """Threads BLAS (matmul, conv) and generated kernels may use.

    >>> tessera.set_num_threads(tessera.get_num_threads())
    """
    global _LIMITER
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"set_num_threads expects a positive integer, got {n!r}")
    from threadpoolctl import ThreadpoolController
    _LIMITER = ThreadpoolController().limit(limits=n, user_api="blas")
    import sys
    runtime = sys.modules.get("tessera.codegen.runtime")
    if runtime is not None:  # generated kernels split across as many threads
        runtime.reset_threads()


def get_num_threads() -> int:
    """Threads BLAS uses now."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - declared dependency
        return os.cpu_count() or 1
    n = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    return max(n) if n else 1
