"""``tessera.backends.cudnn``: cuDNN's switches. No cuDNN here: ``is_available()`` is False
and the switches are recorded only.

>>> import tessera.backends.cudnn as cudnn
>>> cudnn.deterministic = True; cudnn.benchmark = False
>>> cudnn.is_available(), cudnn.version()
(False, None)
"""
from __future__ import annotations

import sys

from tessera.backends._flags import set_flags

enabled = True
benchmark = False
benchmark_limit = 10
deterministic = False
allow_tf32 = True
fp32_precision = "none"


def is_available() -> bool:
    return False


def version() -> int | None:
    return None


def is_acceptable(tensor) -> bool:
    return False


def flags(enabled: bool = False, benchmark: bool = False, benchmark_limit: int = 10,
          deterministic: bool = False, allow_tf32: bool = True, fp32_precision: str = "none",
          depthwise_kernel: str = "auto"):
    """Sets the switches for a ``with`` block."""
    return set_flags(sys.modules[__name__], enabled=enabled, benchmark=benchmark,
                     benchmark_limit=benchmark_limit, deterministic=deterministic,
                     allow_tf32=allow_tf32, fp32_precision=fp32_precision)
