"""One all-reduce for the gradients of a global module's broadcast parameters.

Under a split batch, the gradient of a broadcast parameter arrives ``partial_sum`` and must
become broadcast before the optimizer reads it. Boxed one by one as they arrive (the hook
``Module.to_global`` used to register), each gradient is one blocking all-reduce: a copy
into the reduce buffer (across pages, for the transposed layout of a Linear weight's
gradient), the exchange, a copy out, and a point where the ranks wait for each other, six
times a step on a 3-layer MLP. DDP instead sums all its gradients in one bucket.

``GradBucket`` does what DDP does, for global parameters (``Module.to_global`` installs
its hooks through ``install``, which ``tessera.parallel`` registers with
``tessera.distributed._module``): each partial gradient is copied
into its segment of one flat buffer (shared memory under MPI on one machine: the
all-reduce then sums the buffers directly), and becomes the parameter's ``.grad`` as a
partial_sum global tensor whose tile is that segment. When every parameter of the bucket
has had its gradient this backward, one in-place all-reduce of the buffer runs and each
such ``.grad`` becomes broadcast, with no copy out.

The buffer is made, and the ranks agree which gradients they lay out with reversed axes
(so each is copied in memory order and every rank puts an element at the same offset), in
the first backward that gives every parameter a gradient; until then, and for a gradient
that does not fit (accumulated into an existing ``.grad``, ``create_graph``, traced by
``nn.Graph``, not partial_sum), the gradient is boxed to the parameter's SBP as it arrives,
as before. A backward that leaves some parameter without a gradient leaves the others'
partial (the optimizer's ops box them where they read them): correct, only slower.

As with DDP's ``gradient_as_bucket_view``, a ``.grad`` handed out this way is a view of
the buffer, which the next backward's gradients overwrite after ``zero_grad()``.
"""
from __future__ import annotations

import numpy as np

from tessera._tensor import Tensor
from tessera.distributed import comm as C
from tessera.distributed.global_tensor import make_global
from tessera.graph.trace import is_tracing
from tessera.sbp import broadcast, partial_sum

__all__ = ["GradBucket", "BucketHooks", "bucket_params", "install"]


def _reversed_layout(a: np.ndarray) -> bool:
    """``a`` (2+ dims, not C-contiguous) lies in memory in reversed-axes order (a transposed
    contiguous array): copying ``a.T`` in C order reads memory in runs."""
    if a.ndim < 2 or a.flags.c_contiguous:
        return False
    st = [s for s, d in zip(a.strides, a.shape) if d > 1]
    return len(st) > 1 and all(0 < x <= y for x, y in zip(st, st[1:]))


def install(params: list, deferred) -> dict:
    """{id(param): ``BucketHooks``} for the bucketable ``params`` (``bucket_params``); the
    hooks leave a gradient alone while ``deferred(param)`` (a traced ZeRO step
    reduce-scatters it instead)."""
    return {id(p): BucketHooks(bucket, p, deferred)
            for bucket in bucket_params(params) for p in bucket.params}


def bucket_params(params: list) -> list[GradBucket]:
    """Buckets (one per placement and dtype) of the global ``params`` that are broadcast on
    every mesh axis and require grad, on the ranks of their placement; the others keep
    the per-gradient boxing."""
    rank = C.current().rank
    groups: dict = {}
    for p in params:
        if not (p.is_global and p.requires_grad) or p.grad_fn is not None:
            continue
        data = p._data
        pl = data.placement
        if pl.size < 2 or not pl.has_rank(rank) or type(data.local) is not np.ndarray or \
                any(s != broadcast for s in data.sbp) or data.dtype.char not in "fd":
            continue
        groups.setdefault((pl, data.dtype), []).append(p)
    return [GradBucket(ps) for ps in groups.values()]


class GradBucket:
    """The broadcast parameters of one placement and dtype whose partial gradients are
    summed by one all-reduce per backward."""

    def __init__(self, params: list):
        self.params = list(params)
        self.placement = params[0]._data.placement
        self.dtype = params[0]._data.dtype
        self.group = tuple(self.placement.flat_ranks)
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.active = [True] * len(self.params)  # False: removed (ZeRO reduce-scatters it)
        sizes = [int(np.prod(p._shape, dtype=np.int64)) for p in self.params]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
        self.buffer: np.ndarray | None = None
        self.reversed: list[bool] | None = None
        self.votes = np.zeros(2 * len(self.params), np.int64)  # (reversed, not) seen
        self.handed: list = [None] * len(self.params)  # the .grad tensors on segments
        self.pending = [False] * len(self.params)  # pre-hook left the gradient to take()
        self.taken = [False] * len(self.params)  # this backward's gradient is in its segment
        self.reported: set[int] = set()
        self.seen: dict = {}  # parameter -> its .grad when it reported

    # ---- per parameter, from AccumulateGrad -------------------------------------------
    def pre_hook(self, p: Tensor, grad: Tensor):
        """The gradient hook: None to leave ``grad`` partial for ``take``, else ``grad``
        boxed to ``p``'s SBP (or None when it has it)."""
        i = self.index[id(p)]
        if i in self.reported:  # a new backward (the last one left some parameter out)
            self._new_round()
        if not grad.is_global or grad._data.sbp == p._data.sbp:
            return None
        if self._fits(p, grad):
            self.pending[i] = True
            return None
        if not is_tracing() and self.reversed is None and type(grad._data.local) is np.ndarray:
            rev = _reversed_layout(grad._data.local)
            self.votes[i if rev else len(self.params) + i] = 1
        return grad.to_global(sbp=p._data.sbp)

    def _fits(self, p: Tensor, grad: Tensor) -> bool:
        data = grad._data
        return (self.buffer is not None and self.active[self.index[id(p)]] and
                p._grad is None and not grad.requires_grad and not is_tracing() and
                type(data.local) is np.ndarray and data.local.shape == tuple(p._shape) and
                all(s == partial_sum for s in data.sbp) and data.placement == self.placement)

    def _segment(self, i: int) -> np.ndarray:
        assert self.buffer is not None and self.reversed is not None  # made by _setup
        shape = tuple(self.params[i]._shape)
        seg = self.buffer[self.offsets[i]:self.offsets[i + 1]]
        return seg.reshape(shape[::-1]).T if self.reversed[i] else seg.reshape(shape)

    def take(self, p: Tensor, grad: Tensor):
        """AccumulateGrad's gradient for ``p`` without one: copied into its segment, which
        becomes ``p.grad`` (partial_sum until the all-reduce); None: declined."""
        i = self.index[id(p)]
        if not self.pending[i]:
            return None
        self.pending[i] = False
        seg = self._segment(i)
        np.copyto(seg, grad._data.local, casting="unsafe")
        h = self.handed[i]
        if h is None:
            h = self.handed[i] = make_global(seg, p._dtype, self.placement,
                                             grad._data.sbp, tuple(p._shape))
        h._data.sbp = grad._data.sbp
        h._version[0] += 1
        self.taken[i] = True
        return h

    def post_hook(self, p: Tensor) -> None:
        """After ``p.grad`` was updated: once every parameter has reported, the
        all-reduce (or, the first time, the agreement on layouts and the buffer)."""
        if is_tracing():
            return
        i = self.index[id(p)]
        # a parameter whose gradient changed since it reported (set to None by zero_grad)
        # reported in an earlier backward that left some parameter out: it reports again
        # in this one (not always first: autograd runs a new accumulator late)
        for k in [k for k in self.reported if self.params[k]._grad is not self.seen[k]]:
            self.reported.discard(k)
            self.taken[k] = False
        self.reported.add(i)
        self.seen[i] = p._grad
        if any(self.active[k] and k not in self.reported for k in range(len(self.params))):
            return
        if self.buffer is None:
            self._setup()
        elif any(self.taken):
            self._reduce()
        self._new_round()

    # ---- collective ----------------------------------------------------------------------
    def _setup(self) -> None:
        """Collective, once: the layouts and the buffer."""
        comm = C.current()
        votes = comm.all_reduce(self.votes, self.group)
        k = len(self.params)
        self.reversed = [bool(votes[i] > 0 and votes[k + i] == 0) for i in range(k)]
        self.buffer = comm.reduce_buffer(self.offsets[-1], self.dtype, self.group)

    def _reduce(self) -> None:
        assert self.buffer is not None  # made by _setup
        C.current().iall_reduce_(self.buffer, self.group).wait()
        for i, h in enumerate(self.handed):
            if self.taken[i]:
                p = self.params[i]
                if p._grad is h:
                    h._data.sbp = p._data.sbp
                    h._version[0] += 1

    def _new_round(self) -> None:
        self.reported.clear()
        self.seen.clear()
        self.taken = [False] * len(self.params)
        self.pending = [False] * len(self.params)

    def remove(self, p: Tensor) -> None:
        """``p``'s gradient leaves the bucket (its hooks are removed by the caller)."""
        self.active[self.index[id(p)]] = False


class BucketHooks:
    """The handle stored under ``GRAD_HOOK`` for a bucketed parameter: ``remove()``
    takes it out of its bucket and unregisters its hooks."""

    def __init__(self, bucket: GradBucket, p: Tensor, deferred):
        self.bucket = bucket
        self.param = p

        def pre(grad):  # (deferred: a traced ZeRO step reduce-scatters it instead)
            return None if deferred(p) else bucket.pre_hook(p, grad)
        self.handles = [p.register_hook(pre),
                        p.register_post_accumulate_grad_hook(bucket.post_hook)]
        p.__dict__["_grad_taker"] = bucket.take

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        if self.param.__dict__.get("_grad_taker") == self.bucket.take:
            del self.param.__dict__["_grad_taker"]
        self.bucket.remove(self.param)
