"""Linear layers: ``Identity``, ``Linear``, ``Bilinear`` and ``LazyLinear``.

>>> import tessera
>>> tessera.nn.Linear(3, 2)(tessera.ones(4, 3)).shape
tessera.Size([4, 2])
"""
from __future__ import annotations

import math

from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.nn import init
from tessera.nn.functional.linear import bilinear, linear
from tessera.nn.modules.module import Module
from tessera.nn.parameter import Parameter

__all__ = ["Identity", "Linear", "Bilinear", "LazyLinear"]


def _empty(shape, device=None, dtype=None) -> Tensor:
    from tessera.ops.creation import empty
    return empty(shape, device=device, dtype=dtype)


class Identity(Module):
    """Returns its input; any constructor arguments are ignored (PyTorch's placeholder)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def forward(self, input: Tensor) -> Tensor:
        return input


class Linear(Module):
    """``y = x @ weight.T + bias`` with ``weight`` (out_features, in_features).

    Initialised like PyTorch: ``kaiming_uniform_(a=sqrt(5))`` for the weight and
    ``U(-1/sqrt(in_features), 1/sqrt(in_features))`` for the bias.
    """

    __constants__ = ["in_features", "out_features"]

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(_empty((out_features, in_features), device, dtype))
        if bias:
            self.bias = Parameter(_empty((out_features,), device, dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor) -> Tensor:
        return linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class NonDynamicallyQuantizableLinear(Linear):
    """``Linear`` under another name (PyTorch's attention output projection uses it)."""


class Bilinear(Module):
    """``y = x1^T A x2 + b`` with ``weight`` (out_features, in1_features, in2_features)."""

    __constants__ = ["in1_features", "in2_features", "out_features"]

    def __init__(self, in1_features: int, in2_features: int, out_features: int,
                 bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.in1_features = in1_features
        self.in2_features = in2_features
        self.out_features = out_features
        self.weight = Parameter(_empty((out_features, in1_features, in2_features), device,
                                       dtype))
        if bias:
            self.bias = Parameter(_empty((out_features,), device, dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.weight.size(1))
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1: Tensor, input2: Tensor) -> Tensor:
        return bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


class LazyLinear(Linear):
    """A ``Linear`` whose ``in_features`` is read from the first input; it then becomes a
    ``Linear`` (its parameters keep their identity, so an optimizer made before the first
    call still updates them)."""

    cls_to_become = Linear

    def __init__(self, out_features: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        Module.__init__(self)
        self.in_features = 0
        self.out_features = out_features
        self._factory = {"device": device, "dtype": dtype}
        self.weight = Parameter(_empty((0,), device, dtype))
        if bias:
            self.bias = Parameter(_empty((0,), device, dtype))
        else:
            self.register_parameter("bias", None)

    def has_uninitialized_params(self) -> bool:
        return self.weight.numel() == 0 and self.out_features > 0

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params() and self.in_features != 0:
            super().reset_parameters()

    def initialize_parameters(self, input: Tensor) -> None:
        """Give the parameters their shapes from ``input`` and initialise them."""
        self.in_features = int(input.shape[-1])
        with no_grad():
            self.weight.data = _empty((self.out_features, self.in_features), **self._factory)
            if self.bias is not None:
                self.bias.data = _empty((self.out_features,), **self._factory)
            self.reset_parameters()
        del self._factory
        self.__class__ = self.cls_to_become  # type: ignore[assignment]

    def forward(self, input: Tensor) -> Tensor:
        if self.has_uninitialized_params():
            self.initialize_parameters(input)
        return linear(input, self.weight, self.bias)
