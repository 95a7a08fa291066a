"""Boxing: turning the local tiles of a global tensor from one SBP into another.

One small function per (source, destination) SBP pair on one mesh axis, kept in ``BOXING``
(OneFlow's boxing table): P->B all-reduce, P->S reduce-scatter, S->B all-gather, S(i)->S(j)
all-to-all, B->S a local slice, B->P and S->P local (zeros elsewhere). A conversion on an
N-D mesh runs one 1-D boxing per mesh axis that changes (``box``); a pair without an entry
raises an error that names it. ``cost`` estimates the bytes a conversion moves per rank,
which is how dispatch picks the cheapest SBP signature of an op.

>>> from tessera.sbp import split, broadcast, partial_sum
>>> [cost(s, broadcast, 100, 2) for s in (broadcast, split(0), partial_sum)]
[0.0, 50.0, 100.0]
>>> cost(broadcast, partial_sum, 100, 2)  # local, charged the reduction it defers
50.0
"""
from __future__ import annotations

import numpy as np

from tessera.sbp import broadcast, sbp, split_range, split_sizes

__all__ = ["BOXING", "box_1d", "box", "move", "cost", "BoxingError", "tile_shape"]


class BoxingError(NotImplementedError):
    """A conversion between two SBPs (or placements) that boxing does not support."""


def _take(x: np.ndarray, dim: int, start: int, stop: int) -> np.ndarray:
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, stop)
    return x[tuple(index)]


# Each function: (local tile, the shape the tiles make up on this axis, src, dst, the ranks
# of the mesh axis, this rank's index among them, the communicator) -> the new local tile.

def _same(x, shape, src, dst, group, i, comm):
    return x


def _p_to_b(x, shape, src, dst, group, i, comm):
    return comm.all_reduce(x, group)


def _p_to_s(x, shape, src, dst, group, i, comm):
    n, d = len(group), dst.dim
    return comm.reduce_scatter([_take(x, d, *split_range(shape[d], n, k)) for k in range(n)],
                               group)


def _s_to_b(x, shape, src, dst, group, i, comm):
    d = src.dim
    shapes = [shape[:d] + (s,) + shape[d + 1:] for s in split_sizes(shape[d], len(group))]
    return np.concatenate(comm.all_gather(x, group, shapes), axis=d)


def _s_to_s(x, shape, src, dst, group, i, comm):
    if src.dim == dst.dim:
        return x
    n, a, b = len(group), src.dim, dst.dim
    chunks = [_take(x, b, *split_range(shape[b], n, k)) for k in range(n)]
    mine = split_sizes(shape[b], n)[i]
    recv = []
    for size in split_sizes(shape[a], n):
        s = list(x.shape)
        s[a], s[b] = size, mine
        recv.append(tuple(s))
    return np.concatenate(comm.all_to_all(chunks, group, recv), axis=a)


def _b_to_s(x, shape, src, dst, group, i, comm):
    return _take(x, dst.dim, *split_range(shape[dst.dim], len(group), i))


def _b_to_p(x, shape, src, dst, group, i, comm):
    return x if i == 0 else np.zeros_like(x)


def _s_to_p(x, shape, src, dst, group, i, comm):
    out = np.zeros(shape, x.dtype)
    index = [slice(None)] * len(shape)
    index[src.dim] = slice(*split_range(shape[src.dim], len(group), i))
    out[tuple(index)] = x
    return out


BOXING = {
    ("B", "B"): _same, ("P", "P"): _same, ("S", "S"): _s_to_s,
    ("P", "B"): _p_to_b, ("P", "S"): _p_to_s, ("S", "B"): _s_to_b,
    ("B", "S"): _b_to_s, ("B", "P"): _b_to_p, ("S", "P"): _s_to_p,
}


def box_1d(x: np.ndarray, shape: tuple, src: sbp, dst: sbp, group: tuple, i: int, comm
           ) -> np.ndarray:
    """One mesh axis: the local tile ``x`` of a tensor of ``shape`` from ``src`` to ``dst``."""
    fn = BOXING.get((src.kind, dst.kind))
    if fn is None:
        raise BoxingError(f"boxing {src.short()} -> {dst.short()} is not supported")
    if type(x) is not np.ndarray and _symbolic(x):  # nn.Graph tracing: a node, run later
        from tessera.distributed.graph_ops import traced_box
        return traced_box(x, tuple(shape), src, dst, tuple(group), i)
    return fn(x, tuple(shape), src, dst, group, i, comm)


def _symbolic(x) -> bool:
    from tessera.graph.trace import Symbol
    return type(x) is Symbol


# ---- N-D meshes ---------------------------------------------------------------------------

def tile_shape(shape: tuple, sbps: tuple, coords: tuple, hierarchy: tuple, skip=()) -> tuple:
    """The shape of the tile at mesh ``coords``: each axis's split applied in mesh order
    (outer axes first, so nested splits of one dim split the outer tile), except ``skip``."""
    sizes = list(shape)
    for axis, (s, c, n) in enumerate(zip(sbps, coords, hierarchy)):
        if s.kind == "S" and axis not in skip:
            a, b = split_range(sizes[s.dim], n, c)
            sizes[s.dim] = b - a
    return tuple(sizes)


def _commutes(s: sbp, dims: set) -> bool:
    """Whether an inner axis holding ``s`` can stay while an outer axis converts ``dims``."""
    return s.kind != "S" or s.dim not in dims


def box(x: np.ndarray, shape: tuple, placement, src: tuple, dst: tuple, rank: int, comm
        ) -> np.ndarray:
    """The local tile of this rank after converting a tensor of logical ``shape`` on
    ``placement`` from the SBP tuple ``src`` to ``dst``.

    Axes change from the outermost that differs. An inner axis whose tiles do not commute
    with that change (it splits a dim the change involves) goes to broadcast first and to
    its destination afterwards.
    """
    if src == dst:
        return x
    hier = placement.hierarchy
    coords = placement.coords(rank)
    cur = list(src)

    def step(axis, to):
        nonlocal x
        if cur[axis] == to:
            return
        group = placement.group(rank, axis)
        sub = tile_shape(shape, tuple(cur), coords, hier, skip=(axis,))
        x = box_1d(x, sub, cur[axis], to, group, coords[axis], comm)
        cur[axis] = to

    first = next(a for a in range(len(hier)) if src[a] != dst[a])
    dims = {s.dim for s in (src[first], dst[first]) if s.kind == "S"}
    # an inner P must not be summed at the outer axis (the outer boxing would reduce tiles
    # that are themselves partial): it commutes, being linear, so it may stay too.
    moved = [a for a in range(first + 1, len(hier))
             if not (src[a] == dst[a] and _commutes(src[a], dims))]
    for a in reversed(moved):
        step(a, broadcast)
    for a in range(first, len(hier)):
        if a == first or a in moved or cur[a] != dst[a]:
            step(a, dst[a])
    return x


# ---- placement changes -------------------------------------------------------------------

def move(x, shape: tuple, dtype, src_p, src: tuple, dst_p, dst: tuple, rank: int, comm,
         tag: int = 0):
    """This rank's tile after moving a tensor of logical ``shape`` from placement ``src_p``
    with SBP ``src`` to ``dst_p`` with ``dst`` (None on ranks outside ``dst_p``).

    The same mesh shape and SBP: the k-th rank of ``src_p`` sends its tile to the k-th of
    ``dst_p`` (a pipeline stage boundary). Otherwise the tensor is made broadcast on
    ``src_p``, each rank of ``dst_p`` missing it receives the whole from a rank of
    ``src_p``, and it is boxed to ``dst`` there. Every rank walks the transfers in the
    same order, so blocking sends cannot deadlock.
    """
    b = (broadcast,) * src_p.ndim
    if src_p.hierarchy == dst_p.hierarchy and src == dst:
        out = None
        for a, r in zip(src_p.flat_ranks, dst_p.flat_ranks):
            if rank in (a, r):
                tile = tile_shape(shape, dst, dst_p.coords(r), dst_p.hierarchy)
                got = _p2p(x, tile, dtype, a, r, rank, comm, tag)
                if rank == r:
                    out = got
        return out
    whole = box(x, shape, src_p, src, b, rank, comm) if x is not None else None
    out = None
    for k, r in enumerate(dst_p.flat_ranks):
        a = r if src_p.has_rank(r) else src_p.flat_ranks[k % src_p.size]
        if rank in (a, r):
            got = _p2p(whole, shape, dtype, a, r, rank, comm, tag)
            if rank == r:
                out = got
    if out is None:
        return None
    return box(out, shape, dst_p, (broadcast,) * dst_p.ndim, dst, rank, comm)


def _p2p(x, shape, dtype, a: int, r: int, rank: int, comm, tag: int):
    """Rank ``a``'s ``x`` on rank ``r`` (returned there; None on ``a``)."""
    if a == r:
        return x
    if rank == a:
        if type(x) is not np.ndarray and _symbolic(x):
            from tessera.distributed.graph_ops import traced_send
            traced_send(x, r, tag)
        else:
            comm.send(np.ascontiguousarray(x), r, tag)
        return None
    from tessera.graph.trace import is_tracing
    if is_tracing():
        from tessera.distributed.graph_ops import traced_recv
        return traced_recv(tuple(shape), dtype, a, tag)
    return comm.recv(tuple(shape), dtype, a, tag)


_LOCAL = {("B", "S"): 1e-3}


def cost(src: sbp, dst: sbp, nbytes: float, n: int) -> float:
    """Bytes a rank sends to convert a tensor of ``nbytes`` from ``src`` to ``dst`` on a mesh
    axis of ``n`` ranks (ring algorithms); a local slice costs a little, so that an exact
    match wins a tie. Making a partial_sum (B->P, S->P) is local, but it is charged the
    reduce-scatter the partial result will need later: otherwise a reshape that cannot keep
    a split would pick the free S->P and push a full-size reduction downstream."""
    if src == dst or n == 1:
        return 0.0
    k = (src.kind, dst.kind)
    if k in _LOCAL:
        return _LOCAL[k] * nbytes
    if k == ("P", "B"):
        return 2.0 * (n - 1) / n * nbytes
    if k == ("S", "S"):
        return (n - 1) / n / n * nbytes
    return (n - 1) / n * nbytes  # P->S, S->B
