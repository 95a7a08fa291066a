"""``tessera.accelerator``: PyTorch's device-generic accelerator API. Tessera has no
accelerator (devices other than the CPU are plug-ins or global tensors), so it answers as
PyTorch's CPU build: nothing is available, and asking for a device raises.

>>> import tessera
>>> tessera.accelerator.is_available(), tessera.accelerator.current_accelerator()
(False, None)
>>> device = tessera.accelerator.current_accelerator() or tessera.device("cpu")
>>> tessera.ones(1, device=device).device
device(type='cpu')
"""
from __future__ import annotations

import warnings
from typing import Any, Literal

__all__ = ["current_accelerator", "current_device_idx", "current_device_index",
           "current_stream", "device_count", "device_index", "empty_cache",
           "get_device_capability", "get_memory_info", "is_available", "max_memory_allocated",
           "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_stats",
           "reset_accumulated_memory_stats", "reset_peak_memory_stats", "set_device_idx",
           "set_device_index", "set_stream", "synchronize"]

_NONE = "Cannot access accelerator device when none is available."


def _none(*args: Any) -> Any:
    raise RuntimeError(_NONE)


def is_available() -> bool:
    return False


def current_accelerator(check_available: bool = False):
    """The accelerator device type (a ``tessera.device``), or None: there is none."""
    return None


def device_count() -> int:
    return 0


def current_device_index() -> int:
    return _none()


def current_device_idx() -> int:
    warnings.warn("Use `current_device_index` instead.", FutureWarning, stacklevel=2)
    return _none()


def set_device_index(device, /) -> None:
    _none()


def set_device_idx(device, /) -> None:
    warnings.warn("Use `set_device_index` instead.", FutureWarning, stacklevel=2)
    _none()


def set_stream(stream) -> None:
    _none()


current_stream = synchronize = get_device_capability = get_memory_info = _none
memory_allocated = max_memory_allocated = memory_reserved = max_memory_reserved = _none
memory_stats = reset_peak_memory_stats = reset_accumulated_memory_stats = _none


def empty_cache() -> None:
    _none()


class device_index:
    """``with tessera.accelerator.device_index(i):``; ``None`` selects nothing."""

    def __init__(self, device: int | None, /) -> None:
        self.idx = device

    def __enter__(self) -> None:
        if self.idx is not None:
            _none()

    def __exit__(self, *exc: Any) -> Literal[False]:
        return False
