"""ZeRO's flat buckets: ``ZeroRedundancyOptimizer(..., parameters_as_bucket_view=True)``.

PyTorch's option of that name packs the parameters into flat buckets and makes each
parameter a view of its bucket. Here a bucket holds the data-parallel parameters of one
placement and dtype whose shard is ``split(0)`` (each rank's rows are one range of the
flat bucket), in two flat buffers from ``Communicator.reduce_buffer`` (shared memory under
MPI on one machine):

* ``weights``: each parameter's tile becomes a view of its segment, and its shard (what
  the inner optimizer steps) a view of this rank's rows of it, so the step updates the
  parameter's own rows in place; ``all_gather_ranges_`` then copies every other rank's
  rows in. (Unpacked, the shards were copies: packed, gathered by MPI messages and copied
  out again.)
* ``grads``: each partial_sum gradient is copied into its segment as it arrives (the copy
  ``AccumulateGrad`` makes anyway) and becomes ``param.grad``; when every parameter of the
  bucket has its gradient, ``reduce_scatter_ranges_`` sums each rank's rows over the ranks
  in place, and ``param.grad`` becomes the split view of this rank's rows.

On one machine both collectives are shared-memory sums and copies between two barriers,
no messages. As with DDP's ``gradient_as_bucket_view``, a ``.grad`` handed out is a view
of the bucket, which the next backward's gradients overwrite after ``zero_grad()``; the
gradient buffer lives as long as the optimizer (the unpacked stage 2 frees each full
gradient after its reduce-scatter). Anything else (a gradient accumulated into an
existing ``.grad``, replaced by a hook, traced by ``nn.Graph``; a parameter whose data
was replaced) takes the unpacked path, with the same values.
"""
from __future__ import annotations

import numpy as np

from tessera._tensor import Tensor
from tessera.distributed import comm as C
from tessera.distributed.global_tensor import make_global
from tessera.graph.trace import is_tracing
from tessera.nn.parameter import Parameter
from tessera.sbp import partial_sum, split, split_range

__all__ = ["ZeroBucket", "make_buckets"]


def _fits(p: Tensor, rank: int) -> bool:
    """``p`` can live in a bucket: global on a 1-D placement holding ``rank``, broadcast,
    its tile an array on this rank, sharded on dim 0 (a row per rank at least)."""
    if not (p.is_global and p.requires_grad) or p.grad_fn is not None:
        return False
    data = p._data
    pl = data.placement
    return (pl.ndim == 1 and pl.has_rank(rank) and data.sbp[0].kind == "B" and
            type(data.local) is np.ndarray and len(p._shape) > 0 and
            p._shape[0] >= pl.size and data.dtype.char in "fd")


def make_buckets(params: list) -> dict:
    """``id(param) -> (bucket, index)`` for the ``params`` that fit a bucket, one bucket per
    placement and dtype, made in the order of ``params`` (collective: every rank of a
    placement makes its buckets in the same order).

    >>> import tessera
    >>> p = tessera.placement("cpu", ranks=[0])
    >>> w = tessera.nn.Parameter(tessera.ones(4, 2).to_global(p, tessera.sbp.broadcast))
    >>> (bucket, i), = make_buckets([w]).values()
    >>> bucket.ranges, bucket.shard(i).sbp  # rank 0's rows: elements 0-8 of the bucket
    ([[(0, 8)]], (tessera.sbp.split(dim=0),))
    """
    if is_tracing():
        return {}
    rank = C.current().rank
    groups: dict = {}
    seen: set[int] = set()
    for p in params:
        if id(p) not in seen and _fits(p, rank):
            seen.add(id(p))
            groups.setdefault((p._data.placement, p._data.dtype), []).append(p)
    out = {}
    for ps in groups.values():
        bucket = ZeroBucket(ps)
        for i, p in enumerate(ps):
            out[id(p)] = (bucket, i)
    return out


class ZeroBucket:
    """The flat weight and gradient buffers of some data-parallel parameters of one
    placement and dtype (see the module docstring)."""

    def __init__(self, params: list):
        comm = C.current()
        data = params[0]._data
        self.params = list(params)
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.placement, self.dtype = data.placement, data.dtype
        self.group = tuple(self.placement.flat_ranks)
        n, self.me = len(self.group), self.group.index(comm.rank)
        sizes = [int(np.prod(p._shape, dtype=np.int64)) for p in self.params]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
        total = self.offsets[-1]
        self.weights = comm.reduce_buffer(total, self.dtype, self.group)
        self.grads = comm.reduce_buffer(total, self.dtype, self.group)
        self.ranges: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.rows: list[tuple[int, int]] = []  # this rank's rows of each parameter
        self.tiles: list[np.ndarray] = []  # each parameter's tile: its segment of weights
        for p, o in zip(self.params, self.offsets):
            shape = tuple(p._shape)
            seg = self.weights[o:o + int(np.prod(shape, dtype=np.int64))].reshape(shape)
            np.copyto(seg, p._data.local)
            p._data.local = seg
            p._version[0] += 1
            self.tiles.append(seg)
            row = seg.size // shape[0]
            for k in range(n):
                a, b = split_range(shape[0], n, k)
                self.ranges[k].append((o + a * row, o + b * row))
            self.rows.append(split_range(shape[0], n, self.me))
        self.handed: list = [None] * len(self.params)  # the partial .grad of this round

    def shard(self, i: int) -> Tensor:
        """Parameter ``i``'s shard: split(0), its tile a view of this rank's rows of the
        parameter's tile."""
        p = self.params[i]
        a, b = self.rows[i]
        return Parameter(make_global(self.tiles[i][a:b], p._dtype, self.placement,
                                     (split(0),), tuple(p._shape)))

    def _grad_segment(self, i: int) -> np.ndarray:
        shape = tuple(self.params[i]._shape)
        return self.grads[self.offsets[i]:self.offsets[i + 1]].reshape(shape)

    def take(self, p: Tensor, grad: Tensor) -> Tensor | None:
        """``AccumulateGrad``'s gradient for ``p`` (without a ``.grad``): copied into its
        segment, which becomes ``p.grad`` (partial_sum); None: declined."""
        data = grad._data
        if is_tracing() or not grad.is_global or type(data.local) is not np.ndarray or \
                data.sbp != (partial_sum,) or data.placement != self.placement or \
                data.local.shape != tuple(p._shape):
            return None
        i = self.index[id(p)]
        seg = self._grad_segment(i)
        np.copyto(seg, data.local, casting="unsafe")
        h = make_global(seg, p._dtype, self.placement, (partial_sum,), tuple(p._shape))
        self.handed[i] = h
        return h

    def ready(self) -> bool:
        """Every parameter's ``.grad`` is its segment, still partial: the bucket may be
        reduce-scattered as a whole."""
        return all(h is not None and p._grad is h and h._data.sbp == (partial_sum,)
                   for p, h in zip(self.params, self.handed))

    def reduce_scatter(self) -> None:
        """Each ``.grad`` (``ready()``) becomes split(0): this rank's rows summed over the
        ranks, in place in the bucket."""
        C.current().reduce_scatter_ranges_(self.grads, self.ranges, self.group)
        for i, p in enumerate(self.params):
            a, b = self.rows[i]
            p.grad = make_global(self._grad_segment(i)[a:b], p._dtype, self.placement,
                                 (split(0),), tuple(p._shape))
            self.handed[i] = None

    def aliased(self) -> bool:
        """Every parameter's tile is still its segment (``p.data = ...`` replaces it)."""
        return all(p._data.local is t for p, t in zip(self.params, self.tiles))

    def all_gather(self) -> None:
        """Every parameter's rows from the rank that stepped them (``aliased()``)."""
        C.current().all_gather_ranges_(self.weights, self.ranges, self.group)
        for p in self.params:
            p._version[0] += 1
