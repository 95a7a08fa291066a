"""``tessera.cuda``: PyTorch's ``torch.cuda`` as its CPU-only build answers it.

Tessera runs on the CPU (and on devices registered as plug-ins), so ``is_available()`` is
False and the common script idiom picks the CPU:

>>> import tessera as torch
>>> device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
>>> torch.ones(2).to(device).device
device(type='cpu')

Seeding is a no-op, memory statistics are zero, and what needs a GPU raises PyTorch's
``AssertionError: Torch not compiled with CUDA enabled``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Literal

from tessera.cuda import amp

__all__ = ["amp", "device", "device_count", "current_device", "empty_cache",
           "get_device_capability", "get_device_name", "get_device_properties",
           "get_rng_state", "get_rng_state_all", "init", "initial_seed", "is_available",
           "is_bf16_supported", "is_initialized", "manual_seed", "manual_seed_all",
           "max_memory_allocated", "max_memory_reserved", "mem_get_info", "memory_allocated",
           "memory_reserved", "memory_stats", "reset_max_memory_allocated",
           "reset_peak_memory_stats", "seed", "seed_all", "set_device", "set_rng_state",
           "set_rng_state_all", "synchronize", "stream", "current_stream", "default_stream",
           "Stream", "Event", "get_arch_list", "ipc_collect", "is_tf32_supported"]

_NOT_COMPILED = "Torch not compiled with CUDA enabled"


def _lazy_init() -> None:
    raise AssertionError(_NOT_COMPILED)


def is_available() -> bool:
    """False: this build has no CUDA.

    >>> import tessera
    >>> tessera.cuda.is_available(), tessera.cuda.device_count()
    (False, 0)
    """
    return False


def device_count() -> int:
    return 0


def is_initialized() -> bool:
    return False


def init() -> None:
    _lazy_init()


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return False


def is_tf32_supported() -> bool:
    return False


def get_arch_list() -> list[str]:
    return []


def _index(device) -> int:
    if device is None:
        return -1
    if isinstance(device, str):
        from tessera.device import device as _device
        device = _device(device)
    return device if isinstance(device, int) else (device.index if device.index is not None
                                                   else -1)


def current_device() -> int:
    _lazy_init()
    return 0


def set_device(device) -> None:
    """Raises (there is no CUDA device to select); a negative index is a no-op, as in
    PyTorch."""
    if _index(device) >= 0:
        raise AttributeError(f"tessera.cuda.set_device: {_NOT_COMPILED}")


def get_device_name(device=None) -> str:
    _lazy_init()
    return ""


def get_device_capability(device=None) -> tuple[int, int]:
    _lazy_init()
    return (0, 0)


def get_device_properties(device=None) -> Any:
    _lazy_init()


def synchronize(device=None) -> None:
    _lazy_init()


def ipc_collect() -> None:
    _lazy_init()


def mem_get_info(device=None) -> tuple[int, int]:
    _lazy_init()
    return (0, 0)


# seeding is queued until CUDA initialises, which never happens here: a no-op
def manual_seed(seed: int) -> None:
    """Seeds the CUDA generators: nothing to seed in this build (a no-op, as in PyTorch's
    CPU build, so ``torch.cuda.manual_seed_all(0)`` in a script is harmless)."""


def manual_seed_all(seed: int) -> None:
    """See ``manual_seed``."""


def seed() -> None:
    """See ``manual_seed``."""


def seed_all() -> None:
    """See ``manual_seed``."""


def initial_seed() -> int:
    _lazy_init()
    return 0


def get_rng_state(device="cuda") -> Any:
    _lazy_init()


def get_rng_state_all() -> list:
    return []


def set_rng_state(new_state, device="cuda") -> None:
    """Queued until CUDA initialises: a no-op here."""


def set_rng_state_all(new_states) -> None:
    """See ``set_rng_state``."""


# memory statistics: nothing is ever allocated on a CUDA device here
def empty_cache() -> None:
    """Frees cached CUDA memory: there is none (a no-op)."""


def memory_allocated(device=None) -> int:
    return 0


def max_memory_allocated(device=None) -> int:
    return 0


def memory_reserved(device=None) -> int:
    return 0


def max_memory_reserved(device=None) -> int:
    return 0


def memory_stats(device=None) -> dict:
    return {}


def reset_peak_memory_stats(device=None) -> None:
    """Raises as PyTorch's CPU build does (it has no CUDA allocator to reset)."""
    raise AttributeError(f"tessera.cuda.reset_peak_memory_stats: {_NOT_COMPILED}")


def reset_max_memory_allocated(device=None) -> None:
    raise AttributeError(f"tessera.cuda.reset_max_memory_allocated: {_NOT_COMPILED}")


class device:
    """``with torch.cuda.device(i):``: selects nothing here (entering with a
    non-negative index raises, as ``set_device`` does)."""

    def __init__(self, device: Any) -> None:
        self.idx = _index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx >= 0:
            _lazy_init()

    def __exit__(self, *exc: Any) -> Literal[False]:
        return False


class Stream:
    def __new__(cls, *args: Any, **kwargs: Any):
        raise RuntimeError("torch.cuda.Stream requires CUDA support")


class Event:
    def __new__(cls, *args: Any, **kwargs: Any):
        raise RuntimeError("Tried to instantiate dummy base class Event")


def stream(stream: Any) -> contextlib.AbstractContextManager:
    """``with torch.cuda.stream(s):``: only ``None`` makes sense here."""
    return contextlib.nullcontext()


def current_stream(device=None) -> Any:
    _lazy_init()


def default_stream(device=None) -> Any:
    _lazy_init()
