"""``Variable``, the pre-0.4 wrapper that older scripts still import.

Tensors and Variables were merged long ago; ``Variable(t)`` now returns a detached tensor
sharing ``t``'s data (a leaf, with ``requires_grad`` as given), and every tensor passes
``isinstance(t, Variable)``, as in PyTorch.

>>> import tessera
>>> from tessera.autograd import Variable
>>> t = tessera.ones(2)
>>> v = Variable(t, requires_grad=True)
>>> v.requires_grad, v.is_leaf, isinstance(t, Variable)
(True, True, True)
"""
from __future__ import annotations

import warnings
from typing import Any

__all__ = ["Variable", "VariableMeta"]


class VariableMeta(type):
    """Makes ``isinstance(x, Variable)`` mean ``isinstance(x, Tensor)``."""

    def __instancecheck__(cls, other: Any) -> bool:
        from tessera._tensor import Tensor
        return isinstance(other, Tensor)


class Variable(metaclass=VariableMeta):
    """``Variable(data=None, requires_grad=False, volatile=False)``: a detached tensor."""

    def __new__(cls, data: Any = None, requires_grad: bool = False,
                volatile: bool = False) -> Any:
        from tessera._tensor import Tensor
        if volatile:
            warnings.warn("volatile was removed and now has no effect. Use `with torch.no_grad():`"
                          " instead.", UserWarning, stacklevel=2)
        if data is None:
            from tessera.ops.creation import empty
            data = empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Variable data has to be a tensor, but got {type(data).__name__}")
        out = data.detach()
        if requires_grad:
            out.requires_grad_(True)
        return out
