"""The CPU thread count, as in PyTorch: ``set_num_threads`` / ``get_num_threads``.

BLAS (matrix products, convolutions) and tessera's own kernel threads use as many threads;
a layer that keeps its own threads registers with ``on_change`` to hear of a new count.

>>> n = get_num_threads(); set_num_threads(n); get_num_threads() == n
True
"""
from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["set_num_threads", "get_num_threads", "on_change"]

_ON_CHANGE: list[Callable[[], None]] = []


def on_change(callback: Callable[[], None]) -> None:
    """Call ``callback()`` after each ``set_num_threads``.

    >>> on_change(lambda: None)
    """
    _ON_CHANGE.append(callback)


_LIMITER = None


def set_num_threads(n: int) -> None:
    """Threads BLAS (matmul, conv) and generated kernels may use.

    >>> set_num_threads(get_num_threads())
    """
    global _LIMITER
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"set_num_threads expects a positive integer, got {n!r}")
    from threadpoolctl import ThreadpoolController
    _LIMITER = ThreadpoolController().limit(limits=n, user_api="blas")
    for callback in _ON_CHANGE:  # the kernel threads split across as many
        callback()


def get_num_threads() -> int:
    """Threads BLAS uses now."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - declared dependency
        return os.cpu_count() or 1
    n = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    return max(n) if n else 1
