"""Building global tensors from whole NumPy arrays, independently of boxing, and running
code on simulated ranks."""
from __future__ import annotations

import itertools

import numpy as np

import tessera
from tessera.distributed import comm as C
from tessera.distributed.comm.fake import FakeWorld
from tessera.distributed.global_tensor import local_index, make_global
from tessera.sbp import broadcast, partial_sum, split

B, P = broadcast, partial_sum
S = split


def run(n: int, fn, *args, **kwargs) -> list:
    return FakeWorld(n).run(fn, *args, **kwargs)


def share(shape, rank_coords, hierarchy, sbps):
    """The part of a partial_sum value a rank holds: the first rank of the P axes holds the
    value minus the others' constant 0.5 shares (so partial tiles are not trivial)."""
    p_axes = [a for a, s in enumerate(sbps) if s == P]
    k = int(np.prod([hierarchy[a] for a in p_axes])) if p_axes else 1
    first = all(rank_coords[a] == 0 for a in p_axes)
    return (lambda t: t - 0.5 * (k - 1)) if first else (lambda t: np.full_like(t, 0.5))


def global_from(full: np.ndarray, placement, sbps, requires_grad=False) -> tessera.Tensor:
    """The global tensor with value ``full`` and SBP ``sbps`` (a tuple, one per mesh axis)."""
    sbps = tuple(sbps) if isinstance(sbps, (tuple, list)) else (sbps,)
    rank = C.current().rank
    local = None
    if placement.has_rank(rank):
        tile = np.ascontiguousarray(full[local_index(full.shape, placement, sbps, rank)])
        if full.dtype.kind == "f":
            tile = share(tile.shape, placement.coords(rank), placement.hierarchy, sbps)(tile)
        local = np.ascontiguousarray(tile.astype(full.dtype))
    t = make_global(local, tessera.tensor(full[(0,) * full.ndim] if full.ndim else full).dtype,
                    placement, sbps, full.shape)
    return t.requires_grad_() if requires_grad else t


def sbps_1d(ndim: int, partial: bool = True):
    out = [S(d) for d in range(ndim)] + [B]
    return out + [P] if partial else out


def sbps_nd(ndim: int, mesh_ndim: int, partial: bool = True):
    return list(itertools.product(sbps_1d(ndim, partial), repeat=mesh_ndim))
