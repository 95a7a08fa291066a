"""ZeRO in ``nn.Graph`` (``graph.config.enable_zero(True, stage=1|2)``), with SBP.

The eager ``ZeroRedundancyOptimizer``'s recipe, applied while the optimizer step is
traced: each data-parallel parameter (global, broadcast, at least ``shard_min_size``
elements) is stepped as a *shard*, the parameter boxed to split(d) on its first dim with a
row per rank (``zero.shard_sbp``; a local slice). Its gradient is boxed to the same split
(partial_sum -> split: a reduce-scatter), the user's optimizer runs on the shard, so every
state tensor it creates (``zeros_like``) is split and each rank keeps ``1/n`` of it, and
the updated shard is written back into the parameter (split -> broadcast: an all-gather).
One all-reduce's bytes in all, as in ZeRO.

Stage 1 reduce-scatters the gradients at the step; stage 2 as soon as backward has
accumulated each one (a post-accumulate-grad hook, so the full gradient dies at once in
the compiled program's memory plan). Meanwhile the parameter's all-reduce hook
(``Module.to_global``) is suspended: the reduce-scatter replaces it.

>>> import tessera
>>> from tessera.distributed.graph_zero import GraphZero
>>> GraphZero(0, 1024, []).stage
0
"""
from __future__ import annotations

from contextlib import contextmanager

from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.distributed import _module
from tessera.distributed.optim.zero import shard_sbp

__all__ = ["GraphZero"]


class GraphZero:
    """What ZeRO changes in one trace of a graph's step (a no-op at stage 0)."""

    def __init__(self, stage: int, shard_min_size: int, params):
        self.stage = stage
        self.shards: dict[int, tuple] = {}  # id(param) -> (param, shard SBP)
        self._handles: list = []
        if not stage:
            return
        for p in params:
            s = shard_sbp(p)
            if s is None:
                raise ValueError("nn.Graph.config.enable_zero: ZeRO needs global "
                                 "data-parallel parameters (model.to_global(placement, "
                                 f"tessera.sbp.broadcast)); got a local parameter of shape "
                                 f"{list(p.shape)}")
            if p.is_global and s != p.sbp[0] and p.numel() >= shard_min_size:
                self.shards[id(p)] = (p, s)

    # ---- during the trace of build(): gradients ------------------------------------------
    def __enter__(self):
        for p, s in self.shards.values():
            _module.DEFERRED.add(id(p))
            if self.stage == 2:
                self._handles.append(p.register_post_accumulate_grad_hook(_scatter(s)))
        return self

    def __exit__(self, *exc):
        for p, _ in self.shards.values():
            _module.DEFERRED.discard(id(p))
        for h in self._handles:
            h.remove()
        self._handles = []
        return False

    # ---- the optimizer step on shards ---------------------------------------------------
    @contextmanager
    def sharded(self, opt):
        """``opt`` steps the shards of the sharded parameters; afterwards they are gathered
        back into the parameters and the state is keyed by the parameters again."""
        if not self.shards:
            yield
            return
        from tessera.graph.trace import current_tracer
        tracer = current_tracer()
        swapped = []  # (group, index, param, shard)
        with no_grad():
            for g in opt.param_groups:
                for i, p in enumerate(g["params"]):
                    if id(p) not in self.shards or p.grad is None:
                        continue
                    s = self.shards[id(p)][1]
                    current = Tensor._make(tracer.traced_data(p), p._dtype, p._device,
                                           p._shape)
                    shard = current.to_global(sbp=s)  # a local slice of the parameter
                    shard.grad = p.grad.detach().to_global(sbp=s)  # stage 1: reduce-scatter
                    if p in opt.state:
                        opt.state[shard] = opt.state.pop(p)
                    g["params"][i] = shard
                    swapped.append((g, i, p, shard))
        try:
            yield
        finally:
            with no_grad():
                for g, i, p, shard in swapped:
                    g["params"][i] = p
                    if shard in opt.state:
                        opt.state[p] = opt.state.pop(shard)
                    p.copy_(shard)  # split -> broadcast: an all-gather


def _scatter(sbp):
    def hook(p: Tensor) -> None:
        if p.grad is not None and p.grad.sbp[0] != sbp:
            p.grad = p.grad.detach().to_global(sbp=sbp)
    return hook
