"""tessera.distributed: global tensors (placement + SBP), boxing, and the process API.

A program runs as N processes (``python -m tessera.distributed.launch --nproc-per-node N
script.py``, which calls ``mpiexec``). Each process holds the local tiles of every global
tensor; ``tensor.to_global(placement, sbp)`` says how the tiles make up the whole, ops on
global tensors choose an SBP signature from the op registry and insert the collectives
(boxing) they need. The PyTorch-style process API (``get_rank``, ``all_reduce`` on local
tensors, ...) works on the same communicator. Without a launcher the world is this one
process, and MPI is never imported.

>>> import tessera
>>> import tessera.distributed as dist
>>> dist.get_rank(), dist.get_world_size()
(0, 1)
"""
from __future__ import annotations

from tessera import sbp as _sbp_vocabulary
from tessera.distributed import comm as _comm
from tessera.distributed._api import (
    Group,
    ReduceOp,
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_reduce,
    barrier,
    broadcast,
    broadcast_object_list,
    destroy_process_group,
    get_backend,
    init_process_group,
    new_group,
    recv,
    reduce,
    reduce_scatter,
    send,
)
from tessera.distributed.comm import CommError, CommTimeout, Communicator
from tessera.distributed.placement import placement
from tessera.graph.trace import GlobalHooks as _GlobalHooks, register_global as _register_global

__all__ = ["placement", "Communicator", "CommError", "CommTimeout", "get_rank",
           "get_world_size", "get_local_rank", "is_initialized", "is_available", "Group",
           "ReduceOp", "all_gather", "all_gather_into_tensor", "all_gather_object",
           "all_reduce", "barrier", "broadcast", "broadcast_object_list",
           "destroy_process_group", "get_backend", "init_process_group", "new_group", "recv",
           "reduce", "reduce_scatter", "send"]


def is_available() -> bool:
    return True


def get_rank(group=None) -> int:
    """This process's rank in the world (0 in a single process)."""
    c = _comm.current()
    return c.rank if group is None else list(_ranks(group)).index(c.rank)


def get_world_size(group=None) -> int:
    """How many processes take part (1 without a launcher)."""
    return _comm.current().world_size if group is None else len(_ranks(group))


def get_local_rank() -> int:
    """This process's rank among the processes of its node."""
    return _comm.current().local_rank


def is_initialized() -> bool:
    """True once the process belongs to a multi-process world (started by the launcher or
    ``mpiexec``, or after ``init_process_group``)."""
    return _comm.is_initialized()


def _ranks(group):
    return tuple(group.ranks) if hasattr(group, "ranks") else tuple(group)


# the global device, placement= factories and the collective ops graphs hold (registered)
from tessera.distributed import (  # noqa: E402,F401
    _factory,
    global_tensor as _global_tensor,
    graph_ops,
    sbp,
    sbp_dispatch as _sbp_dispatch,
)

# ops' sbp rules reach this rank's comm and the number of the compiled step running
_sbp_vocabulary.set_communicator(_comm.current)
_sbp_vocabulary.set_step_serial(graph_ops.step_serial)
_register_global(_GlobalHooks(get_rank, _global_tensor.GlobalData, _sbp_dispatch.run,
                              _global_tensor.to_global))  # tracing global tensors
