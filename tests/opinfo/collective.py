"""Op-info entries for the collective ops of ``nn.Graph`` on global tensors (``boxing``,
``sbp_local``, ``all_reduce_bucket``, ``reduce_scatter_bucket``, ``all_gather_bucket``,
``send``/``recv``: ``tessera.distributed.graph_ops``).

They act on one rank's tile, so the table checks what one process can: the conversions
that need no peer (B->S slices, B->P and S->P, and any conversion on a mesh axis of one
rank, where every collective is the identity), a split ``mean``'s local computation, an
all-reduce bucket on one rank, and that a send or receive without a peer raises. ZeRO's
buckets run on simulated ranks (``FakeWorld``), each its own thread, the way a test of
``tests/distributed`` does, since a reduce-scatter on one rank would show nothing. Run as a
compiled step does (``in_step``: their kernels refuse to run anywhere else). The values
across ranks are tested against one process in ``tests/distributed``.
"""
from __future__ import annotations

import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register

# (src, dst, mesh axis size, this rank's index)
_CONVERSIONS = [("B", "S(0)", 2, 0), ("B", "S(0)", 2, 1), ("B", "S(1)", 3, 2),
                ("B", "P", 2, 0), ("B", "P", 2, 1), ("S(0)", "P", 2, 1), ("S(1)", "P", 3, 0),
                ("P", "B", 1, 0), ("S(0)", "B", 1, 0), ("P", "S(1)", 1, 0),
                ("S(0)", "S(1)", 1, 0)]


def _range(size: int, n: int, k: int) -> tuple[int, int]:
    """OneFlow's split: the first ``size % n`` ranks take one more."""
    q, r = divmod(size, n)
    start = k * q + min(k, r)
    return start, start + q + (k < r)


def _torch_box(torch, x, shape, src, dst, n, k):
    if src[0] == "S" and dst == "P":  # the tile in its place, zeros elsewhere
        d = int(src[2:-1])
        out = torch.zeros(shape, dtype=x.dtype)
        index = [slice(None)] * len(shape)
        index[d] = slice(*_range(shape[d], n, k))
        out[tuple(index)] = x
        return out
    if src == "B" and dst == "P":
        return x.clone() if k == 0 else torch.zeros_like(x)
    if src == "B" and dst[0] == "S":
        d = int(dst[2:-1])
        return x.narrow(d, *(lambda a, b: (a, b - a))(*_range(shape[d], n, k))).clone()
    return x.clone()  # a mesh axis of one rank: the tile is the whole


def _boxing(L, x, shape, src, dst, n, k):
    if L.__name__ != "tessera":
        return _torch_box(L, x, shape, src, dst, n, k)
    from tessera._dispatch import dispatch
    from tessera.distributed.graph_ops import BOXING_OP, in_step
    with in_step():
        return dispatch(BOXING_OP, x, shape=tuple(shape), src=src, dst=dst,
                        group=tuple(range(n)), index=k, seq=0)


def _boxing_samples(rng, dt):
    for shape in [(5, 4), (3, 7)]:
        for src, dst, n, k in _CONVERSIONS:
            tile = list(shape)
            if src[0] == "S":
                d = int(src[2:-1])
                a, b = _range(shape[d], n, k)
                tile[d] = b - a
            yield Sample((make(rng, tile, dt), shape, src, dst, n, k))


def _split_mean(L, x, dim, keepdim, ranks):
    """``mean`` of a logical tensor split on dim 0 over ``ranks``, of which ``x`` is one
    tile: its local part (the tiles' results then add up to the mean)."""
    logical = (x.shape[0] * ranks,) + tuple(x.shape[1:])
    count = int(np.prod([logical[d] for d in (range(x.dim()) if dim is None else dim)]))
    if L.__name__ != "tessera":
        return (x.sum() if dim is None else x.sum(dim, keepdim=keepdim)) / count
    from tessera._dispatch import dispatch
    from tessera.distributed.graph_ops import SBP_LOCAL_OP, in_step
    from tessera.ops.registry import REGISTRY, Meta
    from tessera.sbp import split
    metas = (Meta(logical, x.dtype),)
    attrs = dict(dim=dim, keepdim=keepdim, dtype=None)
    sigs = REGISTRY["mean"].sbp(*metas, mesh_size=ranks, **attrs)
    index = next(i for i, s in enumerate(sigs) if s.ins == (split(0),))
    out = REGISTRY["mean"].infer(Meta(tuple(x.shape), x.dtype), **attrs)  # (dim 0 reduced)
    with in_step():
        return dispatch(SBP_LOCAL_OP, x, **attrs, sbp_op="mean", sbp_sig=index,
                        sbp_metas=metas, sbp_group=tuple(range(ranks)),
                        sbp_outs=(out,), sbp_logical=(), seq=0)


def _split_mean_samples(rng, dt):
    # dim 0 (the split one) is reduced: the signature split(0) -> partial_sum
    for shape, dim, keepdim in [((3, 4), None, False), ((3, 4), (0,), True),
                                ((2, 3, 4), (0, 2), True), ((4,), (0,), False)]:
        for ranks in (1, 2, 3):
            yield Sample((make(rng, shape, dt), dim, keepdim, ranks))


def _bucket(L, *xs):
    """An all-reduce bucket on a mesh axis of one rank (the world of one process): every
    tile comes back whole."""
    if L.__name__ != "tessera":
        return tuple(x.clone() for x in xs)
    from tessera._dispatch import dispatch
    from tessera.distributed.graph_ops import ALL_REDUCE_BUCKET_OP, in_step
    with in_step():
        return dispatch(ALL_REDUCE_BUCKET_OP, *xs, group=(0,), index=0, seq=0)


def _bucket_samples(rng, dt):
    for shapes in [[(2, 3), (4,)], [(5,), (), (3, 1, 2)], [(0, 3), (2,)]]:
        yield Sample(tuple(make(rng, s, dt) for s in shapes))


def _on_ranks(n: int, fn):
    """``fn(rank)`` on each of ``n`` simulated ranks, inside a compiled step (on one rank:
    in this thread, so that an ``nn.Graph`` can trace it)."""
    from tessera.distributed import comm as C
    from tessera.distributed.comm.fake import FakeWorld
    from tessera.distributed.graph_ops import in_step
    if n == 1:
        with in_step():
            return [fn(0)]

    def body():
        with in_step():
            return fn(C.current().rank)
    return FakeWorld(n).run(body)


def _scatter_bucket(L, n, index, *xs):
    """ZeRO's reduce-scatter bucket over ``n`` ranks, rank ``k`` holding ``(k + 1) * x`` of
    each: rank ``index``'s rows of every sum."""
    scale = n * (n + 1) // 2
    if L.__name__ != "tessera":
        return tuple((x * scale).narrow(0, *(lambda a, b: (a, b - a))(
            *_range(x.shape[0], n, index))).clone() for x in xs)
    from tessera._dispatch import dispatch
    from tessera.distributed.graph_ops import REDUCE_SCATTER_BUCKET_OP
    return _on_ranks(n, lambda k: dispatch(REDUCE_SCATTER_BUCKET_OP, *[x * (k + 1) for x in xs],
                                           group=tuple(range(n)), index=k, seq=0))[index]


def _scatter_bucket_whole(L, n, index, whole, *xs):
    """The same bucket with the members at ``whole`` all-reduced within it (the gradients
    of parameters ZeRO leaves whole): their whole sums, the others' rows."""
    scale = n * (n + 1) // 2
    if L.__name__ != "tessera":
        return tuple((x * scale).clone() if j in whole else (x * scale).narrow(
            0, *(lambda a, b: (a, b - a))(*_range(x.shape[0], n, index))).clone()
            for j, x in enumerate(xs))
    from tessera._dispatch import dispatch
    from tessera.distributed.graph_ops import REDUCE_SCATTER_BUCKET_OP
    return _on_ranks(n, lambda k: dispatch(REDUCE_SCATTER_BUCKET_OP, *[x * (k + 1) for x in xs],
                                           group=tuple(range(n)), index=k, seq=0,
                                           whole=whole))[index]


def _scatter_whole_samples(rng, dt):
    # (ranks, which rank's result, whole members, shapes): one rank first (as above), a
    # whole member shorter than the ranks, a scalar one, one of more elements than rows
    for n, index, whole, shapes in [(1, 0, (1,), [(2, 3), (4,)]),
                                    (1, 0, (0,), [(3,), (2, 2)]),
                                    (2, 1, (0, 2), [(1,), (4, 3), (), (5,)]),
                                    (3, 2, (1,), [(3, 2, 2), (2, 5), (4, 5)])]:
        yield Sample((n, index, whole) + tuple(make(rng, s, dt) for s in shapes))


def _gather_bucket(L, n, index, *xs):
    """ZeRO's all-gather bucket over ``n`` ranks, each holding its rows of every ``x``: the
    whole tensors on rank ``index``."""
    if L.__name__ != "tessera":
        return tuple(x.clone() for x in xs)
    from tessera._dispatch import dispatch
    from tessera.distributed.graph_ops import ALL_GATHER_BUCKET_OP

    def rows(x, k):
        a, b = _range(x.shape[0], n, k)
        return x[a:b]
    return _on_ranks(n, lambda k: dispatch(
        ALL_GATHER_BUCKET_OP, *[rows(x, k) for x in xs], shapes=tuple(tuple(x.shape) for x in xs),
        group=tuple(range(n)), index=k, seq=0))[index]


def _rows_bucket_samples(rng, dt):
    # (ranks, which rank's result, tensor shapes): one rank first (what the graph-mode
    # table traces: simulated ranks are threads of their own), uneven splits, a rank
    # of one row
    for n, index, shapes in [(1, 0, [(2, 3)]), (1, 0, [(3,), (2, 2)]), (2, 0, [(4, 3), (5,)]),
                             (2, 1, [(4, 3), (5,)]), (3, 2, [(3, 2, 2), (7,), (4, 5)])]:
        yield Sample((n, index) + tuple(make(rng, s, dt) for s in shapes))


def _send_recv(L, x, peer):
    """A send and a receive on a world of one process: there is no peer, and both raise
    (the communicator's error, naming the peer)."""
    if L.__name__ != "tessera":
        raise RuntimeError(f"send to rank {peer}: this is a world of one process")
    from tessera._dispatch import dispatch
    from tessera.distributed.graph_ops import RECV_OP, SEND_OP, in_step
    with in_step():
        dispatch(SEND_OP, x, dst=peer, tag=0, seq=0)
        return dispatch(RECV_OP, shape=tuple(x.shape), dtype=x.dtype, src=peer, tag=0, seq=1)


def _send_recv_samples(rng, dt):
    yield Sample((make(rng, (3, 4), dt), 1))


register(
    OpInfo("boxing", _boxing, _boxing_samples, differentiable=False, gradcheck=False),
    OpInfo("sbp_local", _split_mean, _split_mean_samples, differentiable=False,
           gradcheck=False),
    OpInfo("all_reduce_bucket", _bucket, _bucket_samples, differentiable=False,
           gradcheck=False),
    OpInfo("reduce_scatter_bucket", _scatter_bucket, _rows_bucket_samples,
           differentiable=False, gradcheck=False),
    OpInfo("reduce_scatter_bucket whole", _scatter_bucket_whole, _scatter_whole_samples,
           covers=("reduce_scatter_bucket",), differentiable=False, gradcheck=False),
    OpInfo("all_gather_bucket", _gather_bucket, _rows_bucket_samples, differentiable=False,
           gradcheck=False),
    OpInfo("send_recv", _send_recv, _send_recv_samples, covers=("send", "recv"),
           differentiable=False, gradcheck=False),
)
