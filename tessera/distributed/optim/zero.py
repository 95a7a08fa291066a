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
from tessera.distributed.sbp import broadcast, split

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
    ``zero_grad``, ``step``, ``state_dict``/``load_state_dict`` (of the shards)."""

    def __init__(self, params, optimizer_class, process_group=None,
                 parameters_as_bucket_view: bool = False, overlap_with_ddp: bool = False,
                 stage: int = 1, **defaults):
        from tessera.nn.parameter import Parameter
        if stage not in (1, 2):
            raise ValueError(f"ZeroRedundancyOptimizer: stage must be 1 or 2, got {stage}")
        if process_group is not None or overlap_with_ddp:
            raise NotImplementedError("ZeroRedundancyOptimizer shards over the placement of "
                                      "the (global) parameters; process_group and "
                                      "overlap_with_ddp are not supported")
        params = list(params)
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        self.stage = stage
        self._pairs: list[tuple[Tensor, Tensor]] = []
        inner_groups = []
        for g in groups:
            shards = []
            for p in g["params"]:
                s = shard_sbp(p)
                if s is None:
                    raise ValueError("ZeroRedundancyOptimizer needs global parameters (make "
                                     "the model global: model.to_global(placement, "
                                     "tessera.sbp.broadcast))")
                shard = p if s == p.sbp[0] else Parameter(p.detach().to_global(sbp=s))
                if shard is not p:  # reduce-scatter the partial gradient, not all-reduce
                    hook = p.__dict__.pop(GRAD_HOOK, None)
                    if hook is not None:
                        hook.remove()
                self._pairs.append((p, shard))
                shards.append(shard)
                if stage == 2 and shard is not p:
                    p.register_post_accumulate_grad_hook(_scatter_grad(s))
            inner_groups.append(dict(g, params=shards))
        self.optim = optimizer_class(inner_groups, **defaults)

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
        for p, shard in self._pairs:
            if shard is not p:
                shard.grad = None if p.grad is None else \
                    p.grad.detach().to_global(sbp=shard.sbp)
        self.optim.step()
        with no_grad():
            for p, shard in self._pairs:
                if shard is not p and p.grad is not None:
                    p.copy_(shard)
        return loss

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


def _scatter_grad(sbp):
    def hook(p: Tensor) -> None:
        if p.grad is not None and p.grad.sbp[0] != sbp:
            p.grad = p.grad.detach().to_global(sbp=sbp)
    return hook
