"""``nn.Module.to_global``: a module's parameters and buffers made global in place.

A local parameter is read as the module's whole value, the way
``oneflow.utils.global_view.to_global`` reads a state dict: every rank built the module
(usually from the same seed), the placement's first rank's value is broadcast (OneFlow's
``sync_data``), and the tensor is then boxed to the requested SBP, so ``split(0)`` keeps
this rank's rows of the single-process weight. A global parameter is boxed to the new SBP.
Parameters stay the same objects (optimizers hold them) and keep ``requires_grad``.

Each global parameter's gradient is boxed to the parameter's own SBP in backward, so that
the optimizer then runs locally. (Left partial, every optimizer op reading it would box it
again.) The partial_sum gradients of broadcast parameters under a split batch are summed
together, by one all-reduce of a flat buffer once the last has arrived, as DDP's bucket
is (``_grad_bucket.py``); any other gradient is boxed by a hook as it arrives.
``ZeroRedundancyOptimizer`` removes the hook to reduce-scatter instead.
"""
from __future__ import annotations

import numpy as np

from tessera._tensor import Tensor
from tessera.distributed import comm as C
from tessera.distributed._grad_bucket import BucketHooks, bucket_params
from tessera.distributed.global_tensor import _check_placement, is_global, make_global
from tessera.sbp import broadcast, sbp as Sbp

__all__ = ["module_to_global", "whole_to_global", "GRAD_HOOK", "DEFERRED"]

GRAD_HOOK = "_tessera_grad_sbp_hook"  # the attribute holding a parameter's hook handle
# ids of parameters whose gradient boxing is left to a ZeRO step being traced in an
# nn.Graph (it reduce-scatters the partial gradient instead of all-reducing it)
DEFERRED: set[int] = set()


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
    bucketed = set()
    for bucket in bucket_params(params):
        for p in bucket.params:
            p.__dict__[GRAD_HOOK] = BucketHooks(bucket, p, _deferred)
            bucketed.add(id(p))
    for p in params:
        if p.requires_grad and id(p) not in bucketed:
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
