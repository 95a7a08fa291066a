"""ZeRO in ``nn.Graph`` (``graph.config.enable_zero(True, stage=1|2|3)``), with SBP.

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

Stage 3 (OneFlow's) keeps the parameters themselves split between steps: at the first
compile each sharded parameter becomes its shard in place (the same Parameter object, its
SBP now split: each rank stores ``1/n``). While ``build()`` is traced, a module called
reads its parameters all-gathered (split -> broadcast, one node per parameter, at the
module's first call, read by the backward too); the backward of that all-gather is the
reduce-scatter of the gradient into the shard's SBP, and the optimizer steps the
parameter, which is the shard, so nothing is gathered after the step. Outside the graph
the parameter is an ordinary split global tensor (``numpy()`` gathers it).

>>> import tessera
>>> from tessera.parallel.graph_zero import GraphZero
>>> GraphZero(0, 1024, []).stage
0
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.distributed import _module
from tessera.nn.modules import module as _module_mod
from tessera.parallel.zero import shard_sbp

__all__ = ["GraphZero", "ZERO3"]

ZERO3 = "_tessera_zero3"  # set in a parameter's __dict__: stage 3 keeps it as its shard


class GraphZero:
    """What ZeRO changes in one trace of a graph's step (a no-op at stage 0)."""

    def __init__(self, stage: int, shard_min_size: int, params, optimizers=()):
        self.stage = stage
        self.shards: dict[int, tuple] = {}  # id(param) -> (param, shard SBP)
        self.split: list[Tensor] = []  # stage 3: the parameters kept as their shards
        self._handles: list = []
        self._swapped: list = []  # stage 3: (module._parameters, key, parameter)
        # stage 3: the module-call wrapper gathering parameters
        self._wrapper: Callable | None = None
        if not stage:
            return
        for p in params:
            s = shard_sbp(p)
            if s is None:
                raise ValueError("nn.Graph.config.enable_zero: ZeRO needs global "
                                 "data-parallel parameters (model.to_global(placement, "
                                 f"tessera.sbp.broadcast)); got a local parameter of shape "
                                 f"{list(p.shape)}")
            if p.__dict__.get(ZERO3):
                self.split.append(p)
            elif p.is_global and s != p.sbp[0] and p.numel() >= shard_min_size:
                if stage == 3:
                    _split_in_place(p, s, optimizers)
                    self.split.append(p)
                else:
                    self.shards[id(p)] = (p, s)

    # ---- during the trace of build(): gradients ------------------------------------------
    def __enter__(self):
        if self.split:
            self._gather()
        for p, s in self.shards.values():
            _module.DEFERRED.add(id(p))
            if self.stage == 2:
                self._handles.append(p.register_post_accumulate_grad_hook(_scatter(s)))
        return self

    def __exit__(self, *exc):
        if self._wrapper is not None:
            _module_mod._CALL_WRAPPERS.remove(self._wrapper)
            self._wrapper = None
        for params, key, p in reversed(self._swapped):
            params[key] = p
        self._swapped = []
        for p, _ in self.shards.values():
            _module.DEFERRED.discard(id(p))
        for h in self._handles:
            h.remove()
        self._handles = []
        return False

    def _gather(self) -> None:
        """Stage 3: a module reads its split parameters all-gathered, gathered when it is
        first called (one node per parameter, as late as its first use; tied parameters
        gathered once); their gradients flow back to the shards."""
        from tessera.sbp import broadcast
        split = {id(p) for p in self.split}
        whole: dict[int, Tensor] = {}
        prev = _module_mod._CALL_WRAPPERS[-1] if _module_mod._CALL_WRAPPERS else None

        def wrapper(module, call, args, kwargs):
            for key, p in list(module._parameters.items()):
                if p is not None and id(p) in split:
                    if id(p) not in whole:
                        whole[id(p)] = p.to_global(sbp=broadcast)
                    self._swapped.append((module._parameters, key, p))
                    module._parameters[key] = whole[id(p)]
            return prev(module, call, args, kwargs) if prev else call(*args, **kwargs)
        _module_mod._CALL_WRAPPERS.append(wrapper)
        self._wrapper = wrapper

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


def _split_in_place(p: Tensor, sbp, optimizers) -> None:
    """``p`` becomes its shard: the same Parameter (optimizers and modules hold it), its
    data boxed broadcast -> ``sbp`` (a local slice), marked as stage 3's. Optimizer state
    already made for it (by eager steps) is split the same way."""
    with no_grad():
        p.data = p.detach().to_global(sbp=sbp)
        for opt in optimizers:
            st = opt.state.get(p, {})
            for key, v in st.items():
                if isinstance(v, Tensor) and v.is_global and v.shape == p.shape:
                    st[key] = v.to_global(sbp=sbp)
    p.__dict__[ZERO3] = True


def _scatter(sbp):
    def hook(p: Tensor) -> None:
        if p.grad is not None and p.grad.sbp[0] != sbp:
            p.grad = p.grad.detach().to_global(sbp=sbp)
    return hook
