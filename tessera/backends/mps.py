"""``tessera.backends.mps``: Apple's Metal backend, absent from this build.

>>> import tessera
>>> tessera.backends.mps.is_available(), tessera.backends.mps.is_built()
(False, False)
"""
from __future__ import annotations


def is_available() -> bool:
    return False


def is_built() -> bool:
    return False


def is_macos_or_newer(major: int, minor: int) -> bool:
    return False


def is_macos13_or_newer(minor: int = 0) -> bool:
    return False
