"""Factories of global tensors: ``tessera.zeros(..., placement=p, sbp=s)``, ``zeros_like``.

A factory builds the whole logical value on every rank of the world and keeps this rank's
tile, so every tile comes from one tensor. Random factories first agree on a seed (drawn on
the placement's first rank and broadcast) unless a generator is given, so a broadcast
random tensor is the same on every rank.
"""
from __future__ import annotations

import numpy as np

from tessera._tensor import Tensor
from tessera.distributed import comm as C
from tessera.distributed.global_tensor import (
    _check_placement,
    local_index,
    local_shape,
    make_global,
)
from tessera.ops.creation import GlobalFactories, register_global_factories
from tessera.ops.random import Generator, randint
from tessera.sbp import as_sbp_tuple, broadcast, partial_sum

__all__ = ["global_factory", "like"]


def global_factory(make, placement, sbp, requires_grad: bool, random: bool = False,
                   generator=None, name: str = "factory") -> Tensor:
    """``make(generator)`` -> the whole tensor (local); the global tensor of its tiles."""
    if placement is None or sbp is None:
        raise ValueError(f"{name}: a global tensor needs both placement= and sbp= (got "
                         f"placement={placement!r}, sbp={sbp!r})")
    p = _check_placement(placement, name)
    if random and generator is None:
        comm = C.current()
        root = p.flat_ranks[0]
        seed = np.array([int(randint(0, 2 ** 62, ()).item())
                         if comm.rank == root else 0], np.int64)
        if comm.world_size > 1:
            seed = comm.broadcast(seed, root)
        generator = Generator().manual_seed(int(seed[0]))
    full = make(generator) if random else make()
    sbps = as_sbp_tuple(sbp, p.ndim, full.ndim, name)
    if any(s == partial_sum for s in sbps):
        raise ValueError(f"{name}: a factory makes broadcast or split tensors, not "
                         "partial_sum ones")
    rank = C.current().rank
    local = None
    if p.has_rank(rank):
        local = np.ascontiguousarray(full._data[local_index(full._shape, p, sbps, rank)])
    out = make_global(local, full._dtype, p, sbps, full._shape)
    return out.requires_grad_(True) if requires_grad else out


def like(input: Tensor, value, dtype, requires_grad: bool) -> Tensor:
    """A global tensor with ``input``'s placement and SBP (broadcast where it is
    partial_sum), filled with ``value`` (zeros for ``empty_like``)."""
    data = input._data
    sbps = tuple(broadcast if s == partial_sum else s for s in data.sbp)
    shape = local_shape(input._shape, data.placement, sbps)
    local = None
    if shape is not None:
        from tessera.ops.creation import _fill_value
        local = np.full(shape, 0 if value is None else _fill_value(value, dtype.np), dtype.np)
    out = make_global(local, dtype, data.placement, sbps, input._shape)
    return out.requires_grad_(True) if requires_grad else out


register_global_factories(GlobalFactories(global_factory, like))  # placement= factories
