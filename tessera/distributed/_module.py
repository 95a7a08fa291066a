"""``nn.Module.to_global``: a module's parameters and buffers made global in place.

A local parameter is read as the module's whole value, the way
``oneflow.utils.global_view.to_global`` reads a state dict: every rank built the module
(usually from the same seed), the placement's first rank's value is broadcast (OneFlow's
``sync_data``), and the tensor is then boxed to the requested SBP, so ``split(0)`` keeps
this rank's rows of the single-process weight. A global parameter is boxed to the new SBP.
Parameters stay the same objects (optimizers hold them) and keep ``requires_grad``.

Each global parameter's gradient is boxed to the parameter's own SBP in backward, so that
the optimizer then runs locally. (Left partial, every optimizer op reading it would box it
again.) Each gradient is boxed by a hook as it arrives, except where a gradient bucketing
is registered (``register_grad_buckets``; ``tessera.parallel.grad_buckets``): the
partial_sum gradients of broadcast parameters under a split batch are then summed
together, by one all-reduce of a flat buffer once the last has arrived, as DDP's bucket
is. ``ZeroRedundancyOptimizer`` removes the hook to reduce-scatter instead.

>>> import tessera
>>> lin = tessera.nn.Linear(2, 2).to_global(tessera.placement("cpu", [0]),
...                                         tessera.sbp.broadcast)
>>> GRAD_HOOK in lin.weight.__dict__
True
"""
from __future__ import annotations

import numpy as np

from tessera._tensor import Tensor
from tessera.distributed import comm as C
from tessera.distributed.global_tensor import _check_placement, is_global, make_global
from tessera.sbp import broadcast, sbp as Sbp

__all__ = ["module_to_global", "whole_to_global", "register_grad_buckets", "GRAD_HOOK",
           "DEFERRED"]

GRAD_HOOK = "_tessera_grad_sbp_hook"  # the attribute holding a parameter's hook handle
# ids of parameters whose gradient boxing is left to a ZeRO step being traced in an
# nn.Graph (it reduce-scatters the partial gradient instead of all-reducing it)
DEFERRED: set[int] = set()
_GRAD_BUCKETS: list = []  # the registered bucketing's install(params, deferred)


def register_grad_buckets(install) -> None:
    """Let ``install(params, deferred)`` -> {id(param): hook handle} sum the gradients of
    the parameters it takes in buckets (``tessera.parallel.grad_buckets`` registers itself);
    a handle's ``remove()`` undoes it, and it leaves a gradient alone while
    ``deferred(param)``. The other parameters keep a hook per gradient."""
    _GRAD_BUCKETS[:] = [install]


def whole_to_global(t: Tensor, placement, sbp) -> Tensor:
    """The global tensor whose logical value is ``t`` (the first rank's copy of it), with
    ``sbp``; a global ``t`` is boxed (``placement=None`` keeps its placement)."""
    if is_global(t):
        return t.to_global(placement, sbp)
    if placement is None or sbp is None:
        raise ValueError("to_global: a module with local tensors needs both placement= and "
                         f"sbp= (got placement={placement!r}, sbp={sbp!r})")
    p = _check_placement(placement, "Module.to_global")
    comm = C.current()
    local = None
    if p.has_rank(comm.rank):
        local = np.array(t.detach()._data, order="C")  # (ascontiguousarray makes 0-d 1-d)
        if p.size > 1:
            local = comm.broadcast(local, p.flat_ranks[0], p.flat_ranks).reshape(local.shape)
    whole = make_global(local, t._dtype, p, (broadcast,) * p.ndim, tuple(t._shape))
    return whole.to_global(sbp=sbp)


def module_to_global(module, placement=None, sbp=None):
    """``module.to_global(placement, sbp)``; ``sbp`` may be a callable ``sbp(tensor)``
    giving each parameter and buffer its own SBP."""
    def convert(t: Tensor) -> Tensor:
        s = sbp
        if callable(sbp) and not isinstance(sbp, (Sbp, tuple, list)):
            s = sbp(t)
        return whole_to_global(t, placement, s)
    module._apply(convert)
    params = list(module.parameters())
    for p in params:
        old = p.__dict__.pop(GRAD_HOOK, None)
        if old is not None:
            old.remove()
    bucketed = _GRAD_BUCKETS[0](params, _deferred) if _GRAD_BUCKETS else {}
    for p in params:
        if id(p) in bucketed:
            p.__dict__[GRAD_HOOK] = bucketed[id(p)]
        elif p.requires_grad:
            p.__dict__[GRAD_HOOK] = p.register_hook(_grad_to_sbp_of(p))
    return module


def _deferred(p: Tensor) -> bool:
    return id(p) in DEFERRED


def _grad_to_sbp_of(p: Tensor):
    def hook(grad: Tensor):
        if id(p) in DEFERRED:
            return None
        if grad.is_global and is_global(p) and grad.sbp != p.sbp:
            return grad.to_global(sbp=p.sbp)
        return None
    return hook
