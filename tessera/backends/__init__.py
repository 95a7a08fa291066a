"""``tessera.backends``: PyTorch's ``torch.backends`` switches, settable and readable as
scripts set and read them (``torch.backends.cudnn.benchmark = True``).

Tessera's CPU kernels are deterministic and have no TF32 or cuDNN path, so the CUDA-side
switches are recorded and change nothing; ``is_available()`` answers as PyTorch's CPU
build does.

>>> import tessera as torch
>>> torch.backends.cudnn.benchmark = True
>>> torch.backends.cudnn.benchmark, torch.backends.cudnn.is_available()
(True, False)
"""
from __future__ import annotations

import warnings
from typing import Any

from tessera.backends import cpu, cuda, cudnn, mkl, mkldnn, mps, openmp, opt_einsum

__all__ = ["cpu", "cuda", "cudnn", "mkl", "mkldnn", "mps", "openmp", "opt_einsum",
           "get_float32_matmul_precision", "set_float32_matmul_precision",
           "use_deterministic_algorithms", "are_deterministic_algorithms_enabled",
           "is_deterministic_algorithms_warn_only_enabled"]

_SETTINGS: dict[str, Any] = {"matmul_precision": "highest", "deterministic": False,
                             "warn_only": False}


def get_float32_matmul_precision() -> str:
    """``"highest"`` unless set: tessera's float32 products are always full precision.

    >>> import tessera
    >>> tessera.get_float32_matmul_precision()
    'highest'
    """
    return _SETTINGS["matmul_precision"]


def set_float32_matmul_precision(precision: str) -> None:
    """Records ``"highest"``, ``"high"`` or ``"medium"`` (PyTorch's TF32/bfloat16 hint; the
    CPU kernels compute in float32 either way)."""
    if precision not in ("highest", "high", "medium"):
        warnings.warn(f"{precision} is not one of 'highest', 'high', or 'medium'; the current"
                      "setFloat32MatmulPrecision call has no effect.", stacklevel=2)
        return
    _SETTINGS["matmul_precision"] = precision
    cuda.matmul._set("allow_tf32", precision != "highest")


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """Records the request: every tessera kernel is already deterministic."""
    if not isinstance(mode, bool):
        raise TypeError(f"use_deterministic_algorithms(): argument 'mode' (position 1) must "
                        f"be bool, not {type(mode).__name__}")
    _SETTINGS["deterministic"], _SETTINGS["warn_only"] = mode, bool(warn_only)


def are_deterministic_algorithms_enabled() -> bool:
    return _SETTINGS["deterministic"]


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    return _SETTINGS["warn_only"]
