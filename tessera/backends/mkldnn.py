"""``tessera.backends.mkldnn``: oneDNN's switches, recorded (tessera's CPU kernels are its
own; ``is_available()`` answers as PyTorch's x86 build does).

>>> import tessera.backends.mkldnn as mkldnn
>>> with mkldnn.flags(enabled=False):
...     mkldnn.enabled
False
"""
from __future__ import annotations

import sys
from typing import Literal

from tessera.backends._flags import set_flags

enabled = True
deterministic = False
allow_tf32 = True
fp32_precision = "none"
VERBOSE_OFF, VERBOSE_ON, VERBOSE_ON_CREATION = 0, 1, 2


def is_available() -> bool:
    return True


def flags(enabled: bool = False, deterministic: bool = False, allow_tf32: bool = True,
          fp32_precision: str = "none"):
    """Sets the switches for a ``with`` block."""
    return set_flags(sys.modules[__name__], enabled=enabled, deterministic=deterministic,
                     allow_tf32=allow_tf32, fp32_precision=fp32_precision)


class verbose:
    """``with mkldnn.verbose(level):``: oneDNN's logging, nothing to log here."""

    def __init__(self, level: int) -> None:
        self.level = level

    def __enter__(self) -> verbose:
        return self

    def __exit__(self, *exc) -> Literal[False]:
        return False
