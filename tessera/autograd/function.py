"""``tessera.autograd.Function``: user-defined ops with a hand-written backward.

>>> import tessera
>>> class Square(tessera.autograd.Function):
...     @staticmethod
...     def forward(ctx, x):
...         ctx.save_for_backward(x)
...         return x * x
...     @staticmethod
...     def backward(ctx, g):
...         (x,) = ctx.saved_tensors
...         return 2 * x * g
>>> x = tessera.tensor([3.0], requires_grad=True)
>>> Square.apply(x).backward(); x.grad
tensor([6.])
"""
from __future__ import annotations

from typing import Any

from tessera.autograd.grad_mode import STATE, no_grad
from tessera.ops.registry import Meta, OpDef


class FunctionCtx:
    """The ``ctx`` of a custom Function: save tensors and flags between forward and backward."""

    def __init__(self):
        self.saved_tensors_: tuple | None = ()
        self.needs_input_grad: tuple[bool, ...] = ()
        self.non_differentiable: set[int] = set()
        self.materialize_grads = True
        self._versions: tuple[int | None, ...] = ()

    def save_for_backward(self, *tensors) -> None:
        self.saved_tensors_ = tensors
        self._versions = tuple(t._version[0] if t is not None else None for t in tensors)

    @property
    def saved_tensors(self) -> tuple:
        if self.saved_tensors_ is None:
            from tessera.autograd.graph import FREED_MSG
            raise RuntimeError(FREED_MSG)
        for t, v in zip(self.saved_tensors_, self._versions):
            if t is not None and t._version[0] != v:
                raise RuntimeError("one of the variables needed for gradient computation has "
                                   "been modified by an inplace operation: "
                                   f"[{t.dtype} {list(t.shape)}] is at version "
                                   f"{t._version[0]}; expected version {v} instead.")
        return self.saved_tensors_

    def mark_non_differentiable(self, *tensors) -> None:
        self.non_differentiable.update(id(t) for t in tensors)

    def mark_dirty(self, *tensors) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value


class _FunctionMeta(type):
    def __init__(cls, name, bases, ns):
        super().__init__(name, bases, ns)
        # every subclass is one OpDef, outside the global registry (it is the user's op)
        # (no infer rule: ``apply`` records the node itself, never through dispatch)
        cls._opdef = OpDef(f"{name}", infer=None,  # type: ignore[arg-type]
                           grad=_custom_grad, save=())
        cls._opdef.node_name = f"{name}Backward"  # PyTorch names a Function's node so


def _custom_grad(node, *grads):
    ctx = node.attrs["ctx"]
    cls = node.attrs["cls"]
    if not ctx.materialize_grads:
        grads = tuple(grads)
    res = cls.backward(ctx, *grads)
    if not isinstance(res, tuple):
        res = (res,)
    n_in = len(node.next_functions)
    if len(res) < n_in:
        raise RuntimeError(f"function {cls.__name__}Backward returned an incorrect number of "
                           f"gradients (expected {n_in}, got {len(res)})")
    return tuple(res[:n_in])


class Function(metaclass=_FunctionMeta):
    """Subclass with static ``forward(ctx, *args)`` and ``backward(ctx, *grads)``; call
    ``.apply(*args)``."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("You must implement the forward function for custom "
                                  "autograd.Function.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("You must implement the backward function for custom "
                                  "autograd.Function.")

    @classmethod
    def apply(cls, *args, **kwargs):
        from tessera._tensor import Tensor
        from tessera.autograd.graph import Node
        ctx = FunctionCtx()
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        with no_grad():
            out = cls.forward(ctx, *args, **kwargs)
        outs = out if isinstance(out, tuple) else (out,)
        if STATE.enabled and any(ctx.needs_input_grad):
            edges: list[tuple[Any, int] | None] = []
            for a in args:
                if isinstance(a, Tensor) and a.requires_grad:
                    edges.append((a.grad_fn, a._output_nr) if a.grad_fn is not None
                                 else (a._grad_accumulator(), 0))
                else:
                    edges.append(None)
            metas = [Meta(a._shape, a._dtype) if isinstance(a, Tensor) else a for a in args]
            out_metas = tuple(Meta(o._shape, o._dtype) if isinstance(o, Tensor) else None
                              for o in outs)
            op = cls._opdef
            node = Node(op, {"ctx": ctx, "cls": cls}, tuple(edges), metas, out_metas)
            op.nondiff_outputs = tuple(i for i, o in enumerate(outs)
                                       if id(o) in ctx.non_differentiable)
            new_outs = []
            for i, o in enumerate(outs):
                if not isinstance(o, Tensor):
                    new_outs.append(o)
                    continue
                if any(o is a for a in args):
                    o = o.view_as(o)  # an input returned as is: a new tensor for the history
                    o = o.detach()
                if id(outs[i]) in ctx.non_differentiable or not o.dtype.is_floating_point:
                    new_outs.append(o)
                    continue
                o.grad_fn, o._output_nr, o._requires_grad = node, i, True
                new_outs.append(o)
            outs = tuple(new_outs)
        return outs if isinstance(out, tuple) else outs[0]


class once_differentiable:  # noqa: N801  (PyTorch's decorator name)
    def __new__(cls, fn):
        return fn
