"""ZeRO stage 1 and 2 for eager optimizers, expressed with SBP.

A data-parallel model holds its parameters broadcast and gets partial_sum gradients. ZeRO
keeps, for each such parameter, a *shard* parameter split(d) over the same ranks (on its
first dim with at least one row per rank) and runs the wrapped optimizer on the shards
only, so every optimizer state (``zeros_like`` of a shard) is split too: each rank holds
``1/n`` of it. A step boxes each gradient into its shard's SBP (partial_sum -> split: a
reduce-scatter), steps the inner optimizer, and writes each shard back into its broadcast
parameter (split -> broadcast: an all-gather); together the bytes of one all-reduce, as in
ZeRO. Stage 2 does the reduce-scatter as soon as backward has accumulated a gradient (a
post-accumulate-grad hook), so the full gradients do not stay alive either.

Parameters that are already split (tensor parallel) or too small to split (fewer rows than
ranks in every dim, 0-d) are stepped as they are.

>>> import tessera
>>> from tessera.distributed.optim import ZeroRedundancyOptimizer
>>> p = tessera.placement("cpu", ranks=[0])
>>> w = tessera.nn.Parameter(tessera.ones(4, 2).to_global(p, tessera.sbp.broadcast))
>>> opt = ZeroRedundancyOptimizer([w], tessera.optim.AdamW, lr=0.1)
>>> (w * w).sum().backward(); opt.step(); round(w.detach().numpy()[0, 0].item(), 4)
0.899
"""
from __future__ import annotations

import numpy as np

from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.distributed._module import GRAD_HOOK
from tessera.graph.trace import is_tracing
from tessera.nn.parameter import Parameter
from tessera.parallel.zero_buckets import make_buckets
from tessera.sbp import broadcast, partial_sum, split, split_range, split_sizes

__all__ = ["ZeroRedundancyOptimizer", "shard_sbp"]


def shard_sbp(p: Tensor):
    """The SBP ZeRO keeps ``p``'s optimizer state in: split on the first dim with at least
    one row per rank, or ``p``'s own SBP when it is not broadcast or cannot be split."""
    if not p.is_global or p.placement.ndim != 1 or p.sbp[0] != broadcast:
        return p.sbp[0] if p.is_global else None
    n = p.placement.size
    for d, size in enumerate(p.shape):
        if size >= n:
            return split(d)
    return broadcast


class ZeroRedundancyOptimizer:
    """``optimizer_class`` over shards of the (global, data-parallel) ``params``:
    ``ZeroRedundancyOptimizer(model.parameters(), tessera.optim.AdamW, lr=1e-3, stage=2)``.
    Has the wrapped optimizer's ``param_groups`` (for LR schedulers), ``state``,
    ``zero_grad``, ``step``, ``state_dict``/``load_state_dict`` (of the shards).

    ``parameters_as_bucket_view=True`` (PyTorch's name) puts the parameters and their
    gradients in flat buckets, each parameter a view of its bucket and each shard a view of
    this rank's rows of its parameter, so both collectives run on the buckets in place
    (in shared memory under MPI on one machine): see ``zero_buckets.py``."""

    def __init__(self, params, optimizer_class, process_group=None,
                 parameters_as_bucket_view: bool = False, overlap_with_ddp: bool = False,
                 stage: int = 1, **defaults):
        if stage not in (1, 2):
            raise ValueError(f"ZeroRedundancyOptimizer: stage must be 1 or 2, got {stage}")
        if process_group is not None or overlap_with_ddp:
            raise NotImplementedError("ZeroRedundancyOptimizer shards over the placement of "
                                      "the (global) parameters; process_group and "
                                      "overlap_with_ddp are not supported")
        params = list(params)
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        groups = [dict(g, params=list(g["params"])) for g in groups]
        self.stage = stage
        self._pairs: list[tuple[Tensor, Tensor]] = []
        for g in groups:
            if any(shard_sbp(p) is None for p in g["params"]):
                raise ValueError("ZeroRedundancyOptimizer needs global parameters (make "
                                 "the model global: model.to_global(placement, "
                                 "tessera.sbp.broadcast))")
        # parameters_as_bucket_view: flat buckets, the shards views of the parameters
        packed = make_buckets([p for g in groups for p in g["params"]]) \
            if parameters_as_bucket_view else {}
        self._buckets = list({id(b): b for b, _ in packed.values()}.values())
        inner_groups = []
        for g in groups:
            shards = []
            for p in g["params"]:
                s = shard_sbp(p)
                if id(p) in packed:
                    bucket, i = packed[id(p)]
                    shard = bucket.shard(i)
                else:
                    shard = p if s == p.sbp[0] else Parameter(p.detach().to_global(sbp=s))
                if shard is not p:  # reduce-scatter the partial gradient, not all-reduce
                    hook = p.__dict__.pop(GRAD_HOOK, None)
                    if hook is not None:
                        hook.remove()
                if id(p) in packed:
                    p.__dict__["_grad_taker"] = packed[id(p)][0].take
                self._pairs.append((p, shard))
                shards.append(shard)
            inner_groups.append(dict(g, params=shards))
        self.optim = optimizer_class(inner_groups, **defaults)
        self._sharded = [(p, shard) for p, shard in self._pairs if shard is not p]
        self._reported: dict = {}  # stage 2: id(p) -> p.grad when its gradient arrived
        if stage == 2:
            for p, shard in self._sharded:
                p.register_post_accumulate_grad_hook(self._grad_arrived)

    # ---- the optimizer surface -----------------------------------------------------------
    @property
    def param_groups(self) -> list[dict]:
        return self.optim.param_groups

    @property
    def state(self):
        return self.optim.state

    @property
    def defaults(self) -> dict:
        return self.optim.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p, shard in self._pairs:
            for t in {id(p): p, id(shard): shard}.values():
                if t.grad is None:
                    continue
                if set_to_none:
                    t.grad = None
                else:
                    t.grad.detach_().zero_()

    def step(self, closure=None):
        """Reduce-scatter the gradients (stage 1; stage 2 did it in backward), step the
        shards, all-gather them into the parameters."""
        loss = None
        if closure is not None:
            from tessera.autograd.grad_mode import enable_grad
            with enable_grad():
                loss = closure()
        self._reduce_scatter()
        for p, shard in self._sharded:
            shard.grad = None if p.grad is None else p.grad.detach().to_global(sbp=shard.sbp)
        self.optim.step()
        with no_grad():
            self._all_gather()
        return loss

    def _reduce_scatter(self) -> None:
        """Every partial gradient boxed to its shard's split: a bucket whose gradients are
        all in it in one ``reduce_scatter_ranges_``, the others packed by placement."""
        done: set[int] = set()
        for b in self._buckets:
            if b.ready():
                b.reduce_scatter()
                done.update(id(p) for p in b.params)
        _reduce_scatter([(p, shard) for p, shard in self._sharded
                         if p.grad is not None and id(p) not in done])

    def _all_gather(self) -> None:
        """Every stepped shard written into its parameter: a bucket (the shards are its
        parameters' rows) in one ``all_gather_ranges_``, the others packed by placement."""
        done: set[int] = set()
        for b in self._buckets:
            if b.aliased() and any(p.grad is not None for p in b.params):
                b.all_gather()
                done.update(id(p) for p in b.params)
        _all_gather([(p, shard) for p, shard in self._sharded
                     if p.grad is not None and id(p) not in done])

    def _grad_arrived(self, p: Tensor) -> None:
        """Stage 2: once every sharded parameter has its gradient of this backward, all are
        reduce-scattered together (a parameter's gradient that changed since it arrived,
        set to None by zero_grad, came in an earlier backward that left some out)."""
        if is_tracing():
            return _scatter_grad(p)
        rep = self._reported
        for k in [k for k, (q, g) in rep.items() if q._grad is not g]:
            del rep[k]
        rep[id(p)] = (p, p._grad)
        if len(rep) < len(self._sharded):
            return
        rep.clear()
        self._reduce_scatter()

    def state_dict(self) -> dict:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optim.load_state_dict(state_dict)

    def local_state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (its tiles)."""
        total = 0
        for st in self.optim.state.values():
            for v in st.values():
                if isinstance(v, Tensor):
                    data = v._data
                    local = data.local if v.is_global else data
                    total += 0 if local is None else np.asarray(local).nbytes
        return total

    def __repr__(self) -> str:
        return f"ZeroRedundancyOptimizer(stage={self.stage}, {self.optim!r})"


def _scatter_grad(p: Tensor) -> None:
    shard_s = shard_sbp(p)
    if p.grad is not None and p.grad.sbp[0] != shard_s:
        p.grad = p.grad.detach().to_global(sbp=shard_s)


def _packable(pairs) -> list:
    """Groups (one per placement and dtype) of the ``(param, shard)`` pairs whose tiles are
    arrays on this rank's 1-D placement, for one collective each; the others are boxed one by
    one (returned as a group of their own, marked None)."""
    if not pairs:
        return []
    from tessera.distributed import comm as C
    rank = C.current().rank
    groups: dict = {}
    for p, shard in pairs:
        data = p._data
        ok = not is_tracing() and data.placement.ndim == 1 and \
            data.placement.has_rank(rank) and type(data.local) is np.ndarray and \
            shard.sbp[0].kind == "S"
        groups.setdefault((data.placement, data.dtype) if ok else None, []).append((p, shard))
    return list(groups.items())


def _rows(shape: tuple, d: int, n: int, k: int) -> tuple:
    """The index of part ``k`` of ``shape`` split over ``n`` on dim ``d``."""
    index = [slice(None)] * len(shape)
    index[d] = slice(*split_range(shape[d], n, k))
    return tuple(index)


def _reduce_scatter(pairs) -> None:
    """Each partial_sum ``param.grad`` becomes split like its shard: one reduce-scatter per
    placement and dtype of every gradient's rows, packed rank by rank, instead of one per
    gradient (each a point where the ranks wait for each other; 16 in a Transformer layer)."""
    from tessera.distributed import comm as C
    from tessera.distributed.global_tensor import make_global
    pairs = [(p, s) for p, s in pairs if p.grad.sbp[0] == partial_sum]
    for key, group in _packable(pairs):
        if key is None or len(group) == 1 or any(
                type(p.grad._data.local) is not np.ndarray or p.grad.sbp != (partial_sum,)
                for p, _ in group):
            for p, _ in group:
                _scatter_grad(p)
            continue
        placement = key[0]
        comm, ranks = C.current(), placement.flat_ranks
        n, me = len(ranks), ranks.index(C.current().rank)
        parts = [[p.grad._data.local[_rows(p._shape, s.sbp[0].dim, n, k)] for p, s in group]
                 for k in range(n)]
        sizes = [sum(a.size for a in row) for row in parts]
        buf = np.empty(sum(sizes), key[1])  # rank k's rows of every gradient, then k+1's
        chunks, o = [], 0
        for row, size in zip(parts, sizes):
            chunks.append(buf[o:o + size])
            for a in row:
                buf[o:o + a.size].reshape(a.shape)[...] = a
                o += a.size
        mine = comm.reduce_scatter(chunks, ranks)
        o = 0
        for p, s in group:
            d = s.sbp[0].dim
            shape = tuple(p._shape)
            tile = shape[:d] + (split_sizes(shape[d], n)[me],) + shape[d + 1:]
            size = int(np.prod(tile, dtype=np.int64))
            p.grad = make_global(mine[o:o + size].reshape(tile), p.grad._dtype, placement,
                                 (s.sbp[0],), shape)
            o += size


def _all_gather(pairs) -> None:
    """Each parameter gets its shard's updated rows from every rank: one all-gather per
    placement and dtype of every shard's tile, instead of one per parameter."""
    from tessera.distributed import comm as C
    for key, group in _packable(pairs):
        if key is None or len(group) == 1 or any(
                type(s._data.local) is not np.ndarray for _, s in group):
            for p, s in group:
                p.copy_(s)
            continue
        placement = key[0]
        comm, ranks = C.current(), placement.flat_ranks
        n = len(ranks)
        flat = np.concatenate([s._data.local.reshape(-1) for _, s in group])
        sizes = [sum(int(np.prod(p._shape, dtype=np.int64)) // p._shape[s.sbp[0].dim] *
                     split_sizes(p._shape[s.sbp[0].dim], n)[k] for p, s in group)
                 for k in range(n)]
        parts = comm.all_gather(flat, ranks, shapes=[(z,) for z in sizes])
        for k, part in enumerate(parts):
            o = 0
            for p, s in group:
                index = _rows(tuple(p._shape), s.sbp[0].dim, n, k)
                dst = p._data.local[index]
                dst[...] = part[o:o + dst.size].reshape(dst.shape)
                o += dst.size
        for p, _ in group:
            p._version[0] += 1
