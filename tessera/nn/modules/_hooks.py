"""Calling a Module that has hooks: forward pre/post hooks and full backward hooks.

Backward hooks follow PyTorch's ``BackwardHook``: the tensor inputs and outputs pass
through identity autograd Functions; the one on the outputs sees ``grad_output`` (and runs
the backward pre-hooks), the one on the inputs sees ``grad_input`` and runs the hooks.
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.autograd.function import Function


class _Identity(Function):
    """Passes tensors through; its backward hands the gradients to a callback."""

    @staticmethod
    def forward(ctx, callback, *xs):
        ctx.callback = callback
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        new = ctx.callback(grads)
        return (None,) + tuple(new if new is not None else grads)


def _tensors(obj) -> list[Tensor]:
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [o for o in obj if isinstance(o, Tensor)]
    return []


def _replace(obj, new: list[Tensor]):
    if isinstance(obj, Tensor):
        return new[0]
    it = iter(new)
    return type(obj)(next(it) if isinstance(o, Tensor) else o for o in obj)


def call_with_hooks(module, args: tuple, kwargs: dict):
    try:
        return _call(module, args, kwargs)
    except Exception:
        # hooks registered with always_call=True run even when forward raises
        for hid, hook in list(module._forward_hooks.items()):
            if module._forward_hooks_always_called.get(hid):
                if module._forward_hooks_with_kwargs.get(hid):
                    hook(module, args, kwargs, None)
                else:
                    hook(module, args, None)
        raise


def _call(module, args: tuple, kwargs: dict):
    for hid, hook in list(module._forward_pre_hooks.items()):
        if module._forward_pre_hooks_with_kwargs.get(hid):
            res = hook(module, args, kwargs)
            if res is not None:
                args, kwargs = res
        else:
            res = hook(module, args)
            if res is not None:
                args = res if isinstance(res, tuple) else (res,)
    state = {"grad_output": None}
    use_bw = bool(module._backward_hooks or module._backward_pre_hooks)
    if use_bw:
        args = _wrap_inputs(module, args, state)
    out = module.forward(*args, **kwargs)
    for hid, hook in list(module._forward_hooks.items()):
        if module._forward_hooks_with_kwargs.get(hid):
            res = hook(module, args, kwargs, out)
        else:
            res = hook(module, args, out)
        if res is not None:
            out = res
    if use_bw:
        out = _wrap_outputs(module, out, state, any_input_grad=state.get("inputs_wrapped"))
    return out


def _wrap_inputs(module, args, state):
    tensors = [a for a in args if isinstance(a, Tensor) and a.requires_grad]
    if not tensors:
        return args

    def on_grad_input(grads):
        return _run_backward_hooks(module, tuple(grads), state["grad_output"])
    wrapped = _Identity.apply(on_grad_input, *tensors)
    wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
    state["inputs_wrapped"] = True
    it = iter(wrapped)
    return tuple(next(it) if isinstance(a, Tensor) and a.requires_grad else a for a in args)


def _wrap_outputs(module, out, state, any_input_grad):
    tensors = [t for t in _tensors(out) if t.requires_grad]
    if not tensors:
        return out

    def on_grad_output(grads):
        grads = tuple(grads)
        for hook in list(module._backward_pre_hooks.values()):
            res = hook(module, grads)
            if res is not None:
                grads = tuple(res) if isinstance(res, (tuple, list)) else (res,)
        state["grad_output"] = grads
        if not any_input_grad:  # nothing upstream needs grad: hooks see grad_input = None
            _run_backward_hooks(module, (None,), grads)
        return grads
    wrapped = _Identity.apply(on_grad_output, *tensors)
    wrapped = list(wrapped) if isinstance(wrapped, tuple) else [wrapped]
    all_t = _tensors(out)
    it = iter(wrapped)
    new = [next(it) if t.requires_grad else t for t in all_t]
    return _replace(out, new)


def _run_backward_hooks(module, grad_input, grad_output):
    for hook in list(module._backward_hooks.values()):
        res = hook(module, grad_input, grad_output)
        if res is not None:
            grad_input = tuple(res) if isinstance(res, (tuple, list)) else (res,)
    return grad_input
