"""Activation modules: PyTorch's classes, constructor arguments and reprs, each a thin
wrapper of the ``tessera.nn.functional`` function of the same name.

>>> import tessera.nn as nn
>>> nn.LeakyReLU(0.2, inplace=True)
LeakyReLU(negative_slope=0.2, inplace=True)
"""
from __future__ import annotations

import warnings

from tessera.nn import functional as F, init
from tessera.nn.modules.module import Module
from tessera.nn.parameter import Parameter
from tessera.ops.creation import empty
from tessera.ops.unary import sigmoid, tanh

__all__ = ["Threshold", "ReLU", "RReLU", "Hardtanh", "ReLU6", "Sigmoid", "Hardsigmoid", "Tanh",
           "SiLU", "Mish", "Hardswish", "ELU", "CELU", "SELU", "GLU", "GELU", "Hardshrink",
           "LeakyReLU", "LogSigmoid", "Softplus", "Softshrink", "PReLU", "Softsign",
           "Tanhshrink", "Softmin", "Softmax", "Softmax2d", "LogSoftmax"]


def _inplace_repr(inplace: bool, first: bool = False) -> str:
    if not inplace:
        return ""
    return "inplace=True" if first else ", inplace=True"


class Threshold(Module):
    """``value`` where ``x <= threshold``, else ``x``."""

    def __init__(self, threshold: float, value: float, inplace: bool = False) -> None:
        super().__init__()
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, input):
        return F.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}, value={self.value}{_inplace_repr(self.inplace)}"


class _InplaceActivation(Module):
    """An activation whose only argument is ``inplace``."""

    # the F function by name, looked up when called: fx records a call on a Proxy there
    _fn = "relu"
    _show_inplace = True

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return getattr(F, type(self)._fn)(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace, True) if self._show_inplace else ""


class ReLU(_InplaceActivation):
    """``max(0, x)``."""

    _fn = "relu"


class SiLU(_InplaceActivation):
    """``x * sigmoid(x)``."""

    _fn = "silu"


class Mish(_InplaceActivation):
    """``x * tanh(softplus(x))``."""

    _fn = "mish"


class SELU(_InplaceActivation):
    """Scaled ELU with the self-normalising constants."""

    _fn = "selu"


class Hardsigmoid(_InplaceActivation):
    """``relu6(x + 3) / 6``."""

    _fn = "hardsigmoid"
    _show_inplace = False


class Hardswish(_InplaceActivation):
    """``x * relu6(x + 3) / 6``."""

    _fn = "hardswish"
    _show_inplace = False


class RReLU(Module):
    """Randomized leaky ReLU: random negative slopes in [lower, upper] when training."""

    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3,
                 inplace: bool = False) -> None:
        super().__init__()
        self.lower, self.upper, self.inplace = lower, upper, inplace

    def forward(self, input):
        return F.rrelu(input, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"lower={self.lower}, upper={self.upper}{_inplace_repr(self.inplace)}"


class Hardtanh(Module):
    """Clamp to [min_val, max_val]."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False,
                 min_value: float | None = None, max_value: float | None = None) -> None:
        super().__init__()
        if min_value is not None:
            warnings.warn("keyword argument `min_value` is deprecated and renamed to `min_val`",
                          FutureWarning, stacklevel=2)
            min_val = min_value
        if max_value is not None:
            warnings.warn("keyword argument `max_value` is deprecated and renamed to `max_val`",
                          FutureWarning, stacklevel=2)
            max_val = max_value
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace
        if self.max_val <= self.min_val:
            raise AssertionError(f"max_val ({self.max_val}) must be greater than min_val "
                                 f"({self.min_val})")

    def forward(self, input):
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}{_inplace_repr(self.inplace)}"


class ReLU6(Hardtanh):
    """``min(max(0, x), 6)``."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace, True)


class Sigmoid(Module):
    """``1 / (1 + exp(-x))``."""

    def forward(self, input):
        return sigmoid(input)


class Tanh(Module):
    """``tanh(x)``."""

    def forward(self, input):
        return tanh(input)


class _AlphaActivation(Module):
    _fn = "elu"

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input):
        return getattr(F, type(self)._fn)(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}{_inplace_repr(self.inplace)}"


class ELU(_AlphaActivation):
    """``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere."""

    _fn = "elu"


class CELU(_AlphaActivation):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""

    _fn = "celu"


class GLU(Module):
    """``a * sigmoid(b)`` for the halves ``a, b`` of the input along ``dim``."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.glu(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class GELU(Module):
    """``x * Phi(x)`` (``approximate='tanh'`` for the tanh formula)."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class _Shrink(Module):
    _fn = "hardshrink"

    def __init__(self, lambd: float = 0.5) -> None:
        super().__init__()
        self.lambd = lambd

    def forward(self, input):
        return getattr(F, type(self)._fn)(input, self.lambd)

    def extra_repr(self) -> str:
        return f"{self.lambd}"


class Hardshrink(_Shrink):
    """``x`` outside [-lambd, lambd], 0 inside."""

    _fn = "hardshrink"


class Softshrink(_Shrink):
    """Shrink towards zero by ``lambd``."""

    _fn = "softshrink"


class LeakyReLU(Module):
    """``x`` where positive, ``negative_slope * x`` elsewhere."""

    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, input):
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}{_inplace_repr(self.inplace)}"


class LogSigmoid(Module):
    """``log(sigmoid(x))``."""

    def forward(self, input):
        return F.logsigmoid(input)


class Softplus(Module):
    """``log(1 + exp(beta x)) / beta``, linear above ``threshold``."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, input):
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class PReLU(Module):
    """Leaky ReLU with a learned slope (one, or one per channel), initialised to ``init``."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None,
                 dtype=None) -> None:
        self.num_parameters = num_parameters
        super().__init__()
        self.init = init
        self.weight = Parameter(empty(num_parameters, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.constant_(self.weight, self.init)

    def forward(self, input):
        return F.prelu(input, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class Softsign(Module):
    """``x / (1 + |x|)``."""

    def forward(self, input):
        return F.softsign(input)


class Tanhshrink(Module):
    """``x - tanh(x)``."""

    def forward(self, input):
        return F.tanhshrink(input)


class _DimSoftmax(Module):
    _fn = "softmax"

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        if not hasattr(self, "dim"):
            self.dim = None

    def forward(self, input):
        return getattr(F, type(self)._fn)(input, self.dim, _stacklevel=5)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmin(_DimSoftmax):
    """``softmax(-x)`` along ``dim``."""

    _fn = "softmin"


class Softmax(_DimSoftmax):
    """``exp(x) / sum(exp(x))`` along ``dim``."""

    _fn = "softmax"


class LogSoftmax(_DimSoftmax):
    """``log(softmax(x))`` along ``dim``."""

    _fn = "log_softmax"


class Softmax2d(Module):
    """Softmax over the channels (dim -3) of a (C, H, W) or (N, C, H, W) input."""

    def forward(self, input):
        if input.dim() not in (3, 4):
            raise ValueError(f"Softmax2d: expected input to be 3D or 4D, got {input.dim()}D "
                             "instead")
        return F.softmax(input, -3, _stacklevel=5)


# PyTorch defines MultiheadAttention in torch.nn.modules.activation; tessera keeps it with
# the attention code, and names this path as its home so pickles refer to it where
# PyTorch's do
from tessera.nn.modules.attention import MultiheadAttention  # noqa: E402

MultiheadAttention.__module__ = __name__
__all__.append("MultiheadAttention")
