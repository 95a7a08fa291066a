"""``nn.Parameter``: a Tensor that a Module registers as one of its parameters.

>>> import tessera
>>> p = tessera.nn.Parameter(tessera.zeros(2))
>>> p.requires_grad, isinstance(p, tessera.Tensor)
(True, True)
"""
from __future__ import annotations

from tessera._tensor import Tensor


class Parameter(Tensor):
    """Shares storage with ``data``; ``requires_grad`` defaults to True."""

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True):
        if data is None:
            from tessera.ops.creation import empty
            data = empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter expects a Tensor, got {type(data).__name__}")
        p = object.__new__(cls)
        p._adopt(data.detach())
        p._version = data._version
        p.requires_grad_(requires_grad)
        return p

    def __init__(self, data: Tensor | None = None, requires_grad: bool = True):
        pass  # everything happened in __new__

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        result = type(self)(self.detach().clone(), self.requires_grad)
        if self.grad is not None:
            result.grad = self.grad.clone()
        memo[id(self)] = result
        return result

    def __reduce_ex__(self, proto):
        from tessera.nn.parameter import _rebuild_parameter
        return (_rebuild_parameter, (self.detach(), self.requires_grad))


def _rebuild_parameter(data: Tensor, requires_grad: bool) -> Parameter:
    return Parameter(data, requires_grad)


class Buffer(Tensor):
    """``nn.Buffer(t, persistent=True)``: assigning one to a Module attribute registers it
    as a buffer (PyTorch >= 2.5)."""

    persistent: bool

    def __new__(cls, data: Tensor | None = None, *, persistent: bool = True):
        if data is None:
            from tessera.ops.creation import empty
            data = empty(0)
        b = object.__new__(cls)
        b._adopt(data.detach())
        b._version = data._version
        b.persistent = persistent
        return b

    def __init__(self, data=None, *, persistent: bool = True):
        pass
