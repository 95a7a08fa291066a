"""``tessera.multiprocessing``: the standard ``multiprocessing`` module with tensors shared
through shared memory (PyTorch's ``torch.multiprocessing``).

Every name of ``multiprocessing`` is here. A tensor sent to another process, through a
queue, a pipe or a ``Process``'s arguments, arrives as a view of the same memory: its
storage moves into shared memory on the way (``Tensor.share_memory_``), so in-place updates
in one process are seen by all. ``Module.share_memory()`` does that for a model's
parameters, which is how several processes train one model (Hogwild).

>>> import tessera, tessera.multiprocessing as mp
>>> w = tessera.zeros(3).share_memory_()
>>> w.is_shared(), mp.get_sharing_strategy()
(True, 'file_descriptor')
"""
from __future__ import annotations

import multiprocessing
import sys
from multiprocessing import *  # noqa: F403

from tessera import _tensor_methods
from tessera.multiprocessing._shared import init_reductions, is_shared, share_memory_
from tessera.multiprocessing.spawn import (
    ProcessContext,
    ProcessExitedException,
    ProcessRaisedException,
    SpawnContext,
    spawn,
    start_processes,
)

__all__ = ["set_sharing_strategy", "get_sharing_strategy", "get_all_sharing_strategies",
           "spawn", "start_processes", "ProcessContext", "ProcessRaisedException",
           "ProcessExitedException", "SpawnContext", "init_reductions"]
__all__ += multiprocessing.__all__

if sys.platform in ("darwin", "win32"):
    _sharing_strategy = "file_system"
    _all_sharing_strategies = {"file_system"}
else:
    _sharing_strategy = "file_descriptor"
    _all_sharing_strategies = {"file_descriptor", "file_system"}


def set_sharing_strategy(new_strategy: str) -> None:
    """Chooses how tensors are shared (``get_all_sharing_strategies()``). Both strategies
    map the same shared pages; the choice is kept for PyTorch's API.

    >>> import tessera.multiprocessing as mp
    >>> mp.set_sharing_strategy(mp.get_sharing_strategy())
    """
    global _sharing_strategy
    if new_strategy not in _all_sharing_strategies:
        raise AssertionError(f"invalid sharing strategy {new_strategy!r}, expected one of "
                             f"{_all_sharing_strategies}")
    _sharing_strategy = new_strategy


def get_sharing_strategy() -> str:
    """The current sharing strategy.

    >>> import tessera.multiprocessing as mp
    >>> mp.get_sharing_strategy() in mp.get_all_sharing_strategies()
    True
    """
    return _sharing_strategy


def get_all_sharing_strategies() -> set[str]:
    """The sharing strategies this system supports."""
    return _all_sharing_strategies


# Tensor.share_memory_ / is_shared reach this layer through the method table
_tensor_methods._OPS.update(share_memory_=share_memory_, is_shared=is_shared)
init_reductions()
