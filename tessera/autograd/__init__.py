"""Reverse-mode automatic differentiation.

``backward`` and ``grad`` run the engine over the graph recorded by dispatch; grad rules
are tessera code, so ``create_graph=True`` gives higher derivatives.

>>> import tessera
>>> x = tessera.tensor([1.0, 2.0], requires_grad=True)
>>> tessera.autograd.grad((x * x).sum(), x)
(tensor([2., 4.]),)
"""
from __future__ import annotations

from collections.abc import Sequence

from tessera._tensor_methods import _OPS
from tessera.autograd.engine import run_backward
from tessera.autograd.function import Function, FunctionCtx, once_differentiable
from tessera.autograd.grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from tessera.autograd.graph import Node
from tessera.autograd.variable import Variable

__all__ = ["backward", "grad", "Function", "FunctionCtx", "no_grad", "enable_grad",
           "set_grad_enabled", "inference_mode", "is_grad_enabled", "Node",
           "is_inference_mode_enabled", "once_differentiable", "gradcheck", "gradgradcheck",
           "Variable"]


def _seq(x) -> list:
    from tessera._tensor import Tensor
    if isinstance(x, Tensor) or x is None:
        return [x]
    return list(x)


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None,
             create_graph: bool = False, inputs=None) -> None:
    """Accumulate the gradients of ``tensors`` into the ``.grad`` of the leaves."""
    outs = _seq(tensors)
    grads = _seq(grad_tensors) if grad_tensors is not None else [None] * len(outs)
    if len(grads) != len(outs):
        raise RuntimeError(f"grad_tensors has {len(grads)} entries but tensors has {len(outs)}")
    if retain_graph is None:
        retain_graph = create_graph
    ins = _seq(inputs) if inputs is not None else None
    if ins is not None:
        captured = run_backward(outs, grads, retain_graph, create_graph, inputs=ins,
                                accumulate=False, allow_unused=True)
        for t, g in zip(ins, captured):
            if g is None:
                continue
            if t.grad_fn is not None and not t._retains_grad:
                continue
            t.grad = (g if create_graph else g.detach().clone()) if t.grad is None \
                else t.grad + g
        return
    run_backward(outs, grads, retain_graph, create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool | None = None,
         is_grads_batched: bool = False, materialize_grads: bool = False) -> tuple:
    """The gradients of ``outputs`` with respect to ``inputs``, without touching ``.grad``."""
    outs = _seq(outputs)
    ins = _seq(inputs)
    grads = _seq(grad_outputs) if grad_outputs is not None else [None] * len(outs)
    if retain_graph is None:
        retain_graph = create_graph
    if materialize_grads:
        allow_unused = True
    res = run_backward(outs, grads, retain_graph, create_graph, inputs=ins, accumulate=False,
                       allow_unused=bool(allow_unused))
    if materialize_grads:
        from tessera.ops.creation import zeros_like
        res = [zeros_like(t) if g is None else g for g, t in zip(res, ins)]
    return tuple(res)


def gradcheck(*args, **kwargs):
    from tessera.autograd.checks import gradcheck as _gc
    return _gc(*args, **kwargs)


def gradgradcheck(*args, **kwargs):
    from tessera.autograd.checks import gradgradcheck as _ggc
    return _ggc(*args, **kwargs)


Sequence  # re-exported type for annotations in user code


_OPS["backward"] = backward  # Tensor.backward (Tensor sits below the engine)
