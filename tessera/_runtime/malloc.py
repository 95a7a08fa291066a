"""Keep freed memory for reuse: glibc's allocator tuned for tensor workloads on import.

Eager mode allocates every intermediate and frees it a moment later. glibc hands large
blocks back to the operating system (blocks above its mmap threshold, and the top of the
heap once more than the trim threshold is free), so the next step's arrays arrive as
fresh pages, each one a page fault: thousands a step, a large share of an eager step's
CPU time (bench cputime: transformer, cnn). Raising the two thresholds keeps freed blocks
in the process, as PyTorch's
caching allocators keep device memory: the process's resident size stays near its peak
instead of falling back between steps.

It applies to glibc only, and not when the user has tuned glibc through its own
environment variables (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_TOP_PAD_``) or set ``TESSERA_KEEP_FREED_MEMORY=0``.

>>> keep_freed_memory() in (True, False)
True
"""
from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["keep_freed_memory", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

# mallopt's parameter numbers (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# blocks up to this size come from the heap and are reused; larger ones stay mmap'd
MMAP_THRESHOLD = 32 << 20      # glibc's ceiling for its own adaptive threshold
# free memory at the heap's top kept rather than returned to the OS
TRIM_THRESHOLD = 512 << 20

_GLIBC_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
_applied: list[bool] = []


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (once per process); whether they are set."""
    if _applied:
        return _applied[0]
    ok = False
    if os.environ.get("TESSERA_KEEP_FREED_MEMORY", "1") != "0" and \
            sys.platform.startswith("linux") and not any(v in os.environ for v in _GLIBC_VARS):
        try:
            libc = ctypes.CDLL(None)
            libc.gnu_get_libc_version   # glibc only: musl's mallopt does nothing
            ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
                bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        except (OSError, AttributeError):
            ok = False
    _applied.append(ok)
    return ok
