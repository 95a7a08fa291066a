"""``DistributedDataParallel``: data parallelism with PyTorch's interface.

Every rank holds a replica of the module (rank 0's parameters and buffers are broadcast at
construction) and runs it on its own share of the batch. As backward produces gradients,
parameters are grouped into buckets of about ``bucket_cap_mb`` (in reverse registration
order, the order gradients usually arrive); a full bucket's gradients are copied, divided
by the number of ranks, into the bucket's flat buffer and its all-reduce started in place,
in bucket order on every rank. Under MPI on one machine the buffers are shared memory and
the all-reduce sums them directly, with two barriers and no messages (``comm/shm.py``).
When the last gradient has arrived, the reductions are waited for and each parameter's
``.grad`` becomes the average over ranks: the same gradient one process would compute on
the whole batch when the loss is a mean over equal shares.
With ``gradient_as_bucket_view=True`` (PyTorch's option) each ``.grad`` then is a view of its
bucket's buffer: nothing is copied out after the all-reduce, and a gradient accumulated
into it (``zero_grad(set_to_none=False)``, ``no_sync``) is averaged in place. A gradient
arriving for a ``.grad`` of None (``zero_grad()``'s default) goes straight into the bucket,
divided, instead of into a fresh copy first (``_Bucket.take``, called by AccumulateGrad):
as in PyTorch's reducer, each gradient is then copied once per step.

An early start overlaps communication with the rest of the backward only where something
moves the collective forward meanwhile (a network card, a spare core): MPICH progresses it
inside MPI calls only, and with one core per rank the copies and sums of a shared-memory
all-reduce are CPU work of the rank itself. On 2 ranks x 1 core the MLP's 7 MB of gradients
reduce fastest as one bucket (the default 25 MB cap): 1 MB buckets, with or without
polling the started reductions from every gradient hook, measured slower.

>>> import tessera
>>> from tessera.nn.parallel import DistributedDataParallel as DDP
>>> model = DDP(tessera.nn.Linear(3, 2))
>>> model(tessera.ones(4, 3)).sum().backward()
>>> model.module.weight.grad.shape
tessera.Size([2, 3])
"""
from __future__ import annotations

import contextlib

import numpy as np

from tessera.autograd.grad_mode import STATE
from tessera.autograd.graph import AccumulateGrad
from tessera.distributed import comm as C
from tessera.nn.modules.module import Module

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(Module):
    """Wraps ``module``; gradients are averaged over the ranks of ``process_group``."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, process_group=None,
                 bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False,
                 static_graph: bool = False, **kwargs):
        super().__init__()
        self.module = module
        self.process_group = process_group
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.bucket_bytes_cap = int((25 if bucket_cap_mb is None else bucket_cap_mb) * 2 ** 20)
        seen, params = set(), []
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        self._params = params
        self._buckets = [_Bucket(ps) for ps in _buckets(params, self.bucket_bytes_cap)]
        self._bucket_of = {id(p): b for b, bk in enumerate(self._buckets) for p in bk.params}
        self._slot = {id(p): (bk, i) for bk in self._buckets for i, p in enumerate(bk.params)}
        self._reduction: _Reduction | None = None
        self._sync_module_states()
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)
            if gradient_as_bucket_view:
                p.__dict__["_grad_taker"] = self._take

    # ---- plumbing -------------------------------------------------------------------------
    def _group(self):
        g = self.process_group
        return None if g is None else tuple(getattr(g, "ranks", g))

    def _world(self) -> int:
        g = self._group()
        return C.current().world_size if g is None else len(g)

    def _sync_module_states(self) -> None:
        """Every replica starts from rank 0's parameters and buffers."""
        if self._world() == 1:
            return
        comm, group = C.current(), self._group()
        root = 0 if group is None else group[0]
        for t in list(self.module.parameters()) + list(self.module.buffers()):
            if t._data is not None:
                np.copyto(t._data, comm.broadcast(t._data, root, group))

    def _grad_ready(self, p) -> None:
        if self._reduction is not None:
            self._reduction.ready(p)

    def _take(self, p, grad):
        """AccumulateGrad's gradient for a ``p`` without one, in a synchronized backward:
        stored divided into its bucket segment, which becomes ``p.grad`` (None: declined)."""
        if self._reduction is None:
            return None
        bucket, i = self._slot[id(p)]
        return bucket.take(i, grad, self._world())

    # ---- the PyTorch surface ------------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        red = self._reduction
        if red is not None and red.started and not red.finished:
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration before starting a "
                "new one. This error indicates that your module has parameters that were not "
                "used in producing loss. You can enable unused parameter detection by passing "
                "the keyword argument `find_unused_parameters=True` to "
                "`tessera.nn.parallel.DistributedDataParallel`.")
        sync = STATE.enabled and self.require_backward_grad_sync and self._world() > 1
        self._reduction = _Reduction(self) if sync else None
        if self.broadcast_buffers and self._world() > 1:
            comm, group = C.current(), self._group()
            root = 0 if group is None else group[0]
            for b in self.module.buffers():
                if b._data is not None:
                    np.copyto(b._data, comm.broadcast(b._data, root, group))
        out = self.module(*inputs, **kwargs)
        if self._reduction is not None and self.find_unused_parameters:
            used = _reachable_leaves(out)
            for p in self._params:
                if id(p) not in used:
                    self._reduction.ready(p, unused=True)
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally inside; the backward after it averages the sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old


def _buckets(params, cap: int) -> list[list]:
    """Reverse registration order, one dtype per bucket, about ``cap`` bytes each."""
    out: list[list] = []
    current: list = []
    size, dtype = 0, None
    for p in reversed(params):
        nbytes = p.numel() * p.dtype.itemsize
        if current and (size + nbytes > cap or p.dtype is not dtype):
            out.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
        dtype = p.dtype
    if current:
        out.append(current)
    return out


def _reachable_leaves(out) -> set:
    """ids of the leaf tensors whose gradients backward from ``out`` would reach."""
    from tessera._tensor import Tensor
    roots = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
             if isinstance(t, Tensor)]
    if isinstance(out, dict):
        roots = [t for t in out.values() if isinstance(t, Tensor)]
    leaves, seen = set(), set()
    stack = [t.grad_fn for t in roots if t.grad_fn is not None]
    for t in roots:
        if t.grad_fn is None and t.requires_grad:
            leaves.add(id(t))
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, AccumulateGrad):
            leaves.add(id(node.variable))
            continue
        for edge in node.next_functions:
            if edge is not None and edge[0] is not None:
                stack.append(edge[0])
    return leaves


class _Bucket:
    """Parameters whose gradients are averaged by one all-reduce, and its flat buffer.

    The buffer is made once and reduced in place every step. Each gradient is copied in
    memory order: a Linear weight's gradient is the transpose of a contiguous matmul
    result, and reading it in C order strides across pages (bench distributed: mlp, DDP).
    The ranks agree once, on the first reduction,
    which gradients they all lay out with reversed axes, so every rank puts the same
    element at the same offset; a gradient that later comes in another layout is still
    copied correctly, only slower.
    """

    def __init__(self, params: list):
        self.params = params
        self.sizes = [p.numel() for p in params]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64).tolist()
        dt = params[0].dtype.np
        # MPI reduces float32/float64 natively; float16/bfloat16 are summed in float32
        self.dtype = np.dtype(dt) if np.dtype(dt).char in "fdFD" else np.dtype(np.float32)
        self.buffer: np.ndarray | None = None
        self.reversed: list[bool] | None = None
        # gradient_as_bucket_view: the .grad tensors made as views of the buffer; a
        # gradient still among them is reduced in place, without a copy in or out
        self.handed: list = [None] * len(params)
        self.viewable = self.dtype == np.dtype(dt)
        # take(): gradients stored (divided) into their segments during this backward, and
        # the arrays they came in, kept until the next step's replace them (see take)
        self.taken = [False] * len(params)
        self.held: list = [None] * len(params)

    def _agree(self, comm, group) -> None:
        """Collective, once: reversed axes for a gradient iff some rank holds it that way
        and none holds it another way (votes summed over the ranks)."""
        votes = np.zeros(2 * len(self.params), np.int64)
        for i, p in enumerate(self.params):
            if p._grad is not None and p._grad._data is not None:
                votes[i if _reversed_layout(p._grad._data) else len(self.params) + i] = 1
        votes = comm.all_reduce(votes, group)
        k = len(self.params)
        self.reversed = [bool(votes[i] > 0 and votes[k + i] == 0) for i in range(k)]

    def _views(self):
        """(parameter, its segment of the buffer as an array, reversed axes?)"""
        assert self.buffer is not None and self.reversed is not None  # made by fill
        for p, o, k, rev in zip(self.params, self.offsets, self.sizes, self.reversed):
            shape = tuple(p._shape)
            yield p, self.buffer[o:o + k].reshape(shape[::-1] if rev else shape), rev

    def fill(self, comm, group, n: int) -> np.ndarray:
        """The buffer holding every gradient of the bucket divided by ``n`` (PyTorch's
        reducer also divides before the all-reduce; the division rides on the copy)."""
        if self.reversed is None:
            self._agree(comm, group)
        if self.buffer is None:  # shared memory under MPI on one machine (comm/shm.py)
            self.buffer = comm.reduce_buffer(self.offsets[-1], self.dtype, group)
        for i, (p, seg, rev) in enumerate(self._views()):
            g = p._grad
            taken, self.taken[i] = self.taken[i], False
            if taken and g is self.handed[i]:  # stored divided by take()
                continue
            if g is None or g._data is None:
                seg.fill(0)
            elif g is self.handed[i]:  # accumulated into its segment already
                np.divide(seg, n, out=seg)
            else:
                np.divide(g._data.T if rev else g._data, n, out=seg, dtype=self.dtype,
                          casting="unsafe")
        return self.buffer

    def take(self, i: int, grad, n: int):
        """``grad`` (the first gradient of parameter ``i`` this step) divided by ``n`` into
        its segment, which becomes the parameter's ``.grad`` (gradient_as_bucket_view):
        one copy, where AccumulateGrad's own copy and then the bucket's were two. None
        before the first reduction (the ranks have not agreed the layouts yet).

        The array ``grad`` came in is kept until the next step's replaces it. Freed at once,
        it left the heap with a large free top that glibc returned to the OS in the middle
        of each step, and a rank that faulted the pages back in made the other wait (bench
        distributed: mlp, DDP)."""
        g = grad._data
        p = self.params[i]
        if self.reversed is None or self.buffer is None or not self.viewable or \
                type(g) is not np.ndarray or g.shape != tuple(p._shape):
            return None
        o, k, rev = self.offsets[i], self.sizes[i], self.reversed[i]
        seg = self.buffer[o:o + k].reshape(g.shape[::-1] if rev else g.shape)
        np.divide(g.T if rev else g, n, out=seg, casting="unsafe")
        h = self.handed[i]
        if h is None:
            from tessera._tensor import Tensor
            h = self.handed[i] = Tensor._from_numpy(seg.T if rev else seg)
        h._version[0] += 1
        self.taken[i] = True
        self.held[i] = grad
        return h

    def unload(self, as_view: bool = False) -> None:
        """Each parameter's ``.grad`` becomes its reduced segment: copied into the
        gradient, or (``as_view``, PyTorch's ``gradient_as_bucket_view``) the segment
        itself, which the next backward then accumulates into."""
        from tessera._tensor import Tensor
        as_view = as_view and self.viewable
        for i, (p, seg, rev) in enumerate(self._views()):
            g = p._grad
            if as_view and (g is not None or seg.any()):
                if g is not self.handed[i]:
                    g = p._grad = self.handed[i] = Tensor._from_numpy(seg.T if rev else seg)
                g._version[0] += 1
                continue
            if g is None:
                if not seg.any():
                    continue  # unused on every rank: stays None, as in PyTorch
                value = seg.T if rev else seg
                p._grad = Tensor._from_numpy(np.array(value, dtype=p.dtype.np,
                                                      order="F" if rev else "C"))
            else:
                np.copyto(g._data.T if rev else g._data, seg, casting="unsafe")
                g._version[0] += 1


def _reversed_layout(a: np.ndarray) -> bool:
    """``a`` (2+ dims, not C-contiguous) lies in memory in reversed-axes order, as a
    transposed contiguous array or a row block of one does: copying ``a.T`` in C order
    reads memory in runs instead of striding across it."""
    if a.ndim < 2 or a.flags.c_contiguous:
        return False
    st = [s for s, d in zip(a.strides, a.shape) if d > 1]
    return len(st) > 1 and all(0 < x <= y for x, y in zip(st, st[1:]))


class _Reduction:
    """One iteration's gradient averaging: buckets start their all-reduce in order."""

    def __init__(self, ddp: DistributedDataParallel):
        self.ddp = ddp
        self.count = [0] * len(ddp._buckets)
        self.works: list = [None] * len(ddp._buckets)
        self.next = 0
        self.marked: set = set()
        self.started = self.finished = False

    def ready(self, p, unused: bool = False) -> None:
        if id(p) in self.marked:
            raise RuntimeError(
                "Expected to mark a variable ready only once. A parameter got its gradient "
                "twice in one iteration (backward ran twice through the DDP model, or a "
                "parameter marked unused still took part); use no_sync() to accumulate.")
        self.marked.add(id(p))
        self.started = True
        b = self.ddp._bucket_of[id(p)]
        self.count[b] += 1
        buckets = self.ddp._buckets
        while self.next < len(buckets) and \
                self.count[self.next] == len(buckets[self.next].params):
            self._launch(self.next)
            self.next += 1
        if self.next == len(buckets):
            self._finish()

    def _launch(self, b: int) -> None:
        comm, group = C.current(), self.ddp._group()
        buf = self.ddp._buckets[b].fill(comm, group, self.ddp._world())
        self.works[b] = comm.iall_reduce_(buf, group)

    def _finish(self) -> None:
        for bucket, work in zip(self.ddp._buckets, self.works):
            work.wait()
            bucket.unload(self.ddp.gradient_as_bucket_view)
        self.finished = True
