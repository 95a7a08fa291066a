"""PyTorch's process API (``torch.distributed``) on local tensors, over the communicator.

Collectives write into the given tensors in place, as in PyTorch; ``async_op=True``
returns a ``Work`` whose ``wait()`` completes the write.
"""
from __future__ import annotations

import datetime
import os

import numpy as np

from tessera._tensor import Tensor
from tessera.distributed import comm as C

__all__ = ["ReduceOp", "Group", "init_process_group", "destroy_process_group", "new_group",
           "get_backend", "barrier", "all_reduce", "all_gather", "all_gather_into_tensor",
           "broadcast", "reduce", "reduce_scatter", "send", "recv", "all_gather_object",
           "broadcast_object_list"]


class ReduceOp:
    """The reductions of ``all_reduce`` and ``reduce_scatter`` (PyTorch's names)."""

    SUM = "sum"
    PRODUCT = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"


class Group:
    """A subset of the world's ranks (``new_group(ranks)``)."""

    def __init__(self, ranks):
        self.ranks = tuple(int(r) for r in ranks)

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        r = C.current().rank
        return self.ranks.index(r) if r in self.ranks else -1

    def __repr__(self) -> str:
        return f"Group(ranks={list(self.ranks)})"


def _group(group) -> tuple | None:
    if group is None:
        return None
    return group.ranks if isinstance(group, Group) else tuple(group)


def _op(op) -> str:
    op = getattr(op, "value", op)
    if isinstance(op, str) and op.lower() in C.REDUCE_OPS:
        return op.lower()
    raise ValueError(f"unknown reduce op {op!r}; use tessera.distributed.ReduceOp")


def init_process_group(backend: str | None = None, init_method=None, timeout=None,
                       world_size: int = -1, rank: int = -1, **kwargs) -> None:
    """Join the world: MPI when started by ``mpiexec`` (the launcher), else a world of one.

    Any backend name (``"mpi"``, and ``"gloo"``/``"nccl"`` from PyTorch scripts) runs over
    MPI. ``timeout`` (a ``timedelta`` or seconds) sets ``TESSERA_COMM_TIMEOUT``.
    """
    if timeout is not None:
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) \
            else float(timeout)
        os.environ["TESSERA_COMM_TIMEOUT"] = str(seconds)
    comm: C.Communicator
    if C.launched_by_mpi() or world_size > 1:
        from tessera.distributed.comm.mpi import MPICommunicator
        comm = MPICommunicator()
    else:
        comm = C.SelfCommunicator()
    if world_size not in (-1, comm.world_size) or rank not in (-1, comm.rank):
        raise RuntimeError(f"init_process_group: asked for rank {rank} of {world_size}, but "
                           f"MPI started this process as rank {comm.rank} of "
                           f"{comm.world_size}")
    C.set_process_comm(comm)


def destroy_process_group(group=None) -> None:
    if group is None:
        C.set_process_comm(None, explicit=False)


def new_group(ranks=None, timeout=None, backend=None, **kwargs) -> Group:
    return Group(range(C.current().world_size) if ranks is None else ranks)


def get_backend(group=None) -> str:
    return C.current().name


def _array(t: Tensor, what: str) -> np.ndarray:
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: expected a Tensor, got {type(t).__name__}")
    if t.is_global:
        raise TypeError(f"{what}: takes local tensors; a global tensor's collectives are "
                        "implied by its sbp (use to_global)")
    if t._data is None or t._device.type != "cpu":
        raise RuntimeError(f"{what}: only CPU tensors can be communicated, got {t.device}")
    return t._data


def _write(t: Tensor, value: np.ndarray) -> None:
    np.copyto(t._data, value.reshape(t._data.shape), casting="unsafe")
    t._version[0] += 1


def _done(work: C.Work, async_op: bool):
    if async_op:
        return work
    work.wait()
    return None


def barrier(group=None, async_op: bool = False, device_ids=None):
    """Wait until every rank of ``group`` gets here."""
    C.current().barrier(_group(group))
    return C.Work() if async_op else None


def all_reduce(tensor: Tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """``tensor`` becomes the reduction of every rank's ``tensor`` (in place)."""
    x = _array(tensor, "all_reduce")
    work = C.current().iall_reduce(x, _group(group), _op(op))
    return _done(C.Work(wait=lambda: _write(tensor, work.wait())), async_op)


def reduce(tensor: Tensor, dst: int, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """The reduction lands in ``tensor`` on rank ``dst`` (computed as an all-reduce)."""
    x = _array(tensor, "reduce")
    res = C.current().all_reduce(x, _group(group), _op(op))
    if C.current().rank == dst:
        _write(tensor, res)
    return C.Work() if async_op else None


def all_gather(tensor_list: list, tensor: Tensor, group=None, async_op: bool = False):
    """``tensor_list[i]`` becomes rank ``i``'s ``tensor``."""
    parts = C.current().all_gather(_array(tensor, "all_gather"), _group(group))
    if len(tensor_list) != len(parts):
        raise ValueError(f"all_gather: tensor_list has {len(tensor_list)} tensors for a group "
                         f"of {len(parts)}")
    for t, p in zip(tensor_list, parts):
        _write(t, p)
    return C.Work() if async_op else None


def all_gather_into_tensor(output_tensor: Tensor, input_tensor: Tensor, group=None,
                           async_op: bool = False):
    """The ranks' ``input_tensor`` concatenated along dim 0 into ``output_tensor``."""
    parts = C.current().all_gather(_array(input_tensor, "all_gather_into_tensor"),
                                   _group(group))
    _write(output_tensor, np.concatenate(parts, axis=0))
    return C.Work() if async_op else None


def broadcast(tensor: Tensor, src: int, group=None, async_op: bool = False):
    """``tensor`` becomes rank ``src``'s ``tensor``."""
    _write(tensor, C.current().broadcast(_array(tensor, "broadcast"), src, _group(group)))
    return C.Work() if async_op else None


def reduce_scatter(output: Tensor, input_list: list, op=ReduceOp.SUM, group=None,
                   async_op: bool = False):
    """``output`` becomes the reduction over ranks of their ``input_list[this rank]``."""
    chunks = [_array(t, "reduce_scatter") for t in input_list]
    _write(output, C.current().reduce_scatter(chunks, _group(group), _op(op)))
    return C.Work() if async_op else None


def send(tensor: Tensor, dst: int, group=None, tag: int = 0) -> None:
    C.current().send(_array(tensor, "send"), dst, tag)


def recv(tensor: Tensor, src: int | None = None, group=None, tag: int = 0) -> int:
    """Receive into ``tensor`` from rank ``src`` (a source is required)."""
    if src is None:
        raise NotImplementedError("recv: receiving from any source is not supported; give src")
    x = _array(tensor, "recv")
    _write(tensor, C.current().recv(x.shape, x.dtype, src, tag))
    return src


def all_gather_object(object_list: list, obj, group=None) -> None:
    got = C.current().all_gather_object(obj, _group(group))
    object_list[:] = got


def broadcast_object_list(object_list: list, src: int = 0, group=None, device=None) -> None:
    got = C.current().all_gather_object(list(object_list), _group(group))
    g = _group(group) or tuple(range(C.current().world_size))
    object_list[:] = got[g.index(src)]
