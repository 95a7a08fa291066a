"""Activation functions of ``tessera.nn.functional``: PyTorch's signatures, defaults,
``inplace=`` flags and errors, over the ops in ``tessera.ops.activation``.

>>> import tessera
>>> import tessera.nn.functional as F
>>> F.relu6(tessera.tensor([-1., 3., 9.]))
tensor([0., 3., 6.])
"""
from __future__ import annotations

import warnings

from tessera.autograd.grad_mode import no_grad
from tessera.ops import activation as A, quantized, ternary, unary
from tessera.ops._util import call, wrap_dim
from tessera.ops.activation import need_float
from tessera.ops.creation import empty_like, zeros_like
from tessera.ops.quantized import QTensor

__all__ = ["relu", "relu_", "relu6", "leaky_relu", "leaky_relu_", "elu", "elu_", "selu",
           "selu_", "celu", "celu_", "gelu", "silu", "mish", "softplus", "softsign",
           "softshrink", "hardshrink", "tanhshrink", "threshold", "threshold_", "hardtanh",
           "hardtanh_", "hardsigmoid", "hardswish", "prelu", "rrelu", "rrelu_", "glu",
           "logsigmoid", "sigmoid", "tanh", "softmax", "log_softmax", "softmin",
           "gumbel_softmax"]

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _run(op, input, inplace: bool, **attrs):
    """The op's result, written into ``input`` when ``inplace``."""
    return call(op, input, out=input if inplace else None, **attrs)


def relu(input, inplace: bool = False):
    """``max(0, x)``.

    >>> F.relu(tessera.tensor([-1., 2.]))
    tensor([0., 2.])
    """
    if type(input) is QTensor:  # a quantized tensor stays quantized, as in PyTorch
        return quantized.relu(input)
    return unary.relu(input, out=input if inplace else None)


def relu_(input):
    return unary.relu(input, out=input)


def hardtanh(input, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
    """Clamp to [min_val, max_val]."""
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    return _run(A._HARDTANH, input, inplace, min_val=min_val, max_val=max_val)


def hardtanh_(input, min_val: float = -1.0, max_val: float = 1.0):
    return hardtanh(input, min_val, max_val, inplace=True)


def relu6(input, inplace: bool = False):
    """``min(max(0, x), 6)``."""
    return hardtanh(input, 0.0, 6.0, inplace)


def leaky_relu(input, negative_slope: float = 0.01, inplace: bool = False):
    """``x`` where positive, ``negative_slope * x`` elsewhere."""
    return _run(A._LEAKY, input, inplace, negative_slope=negative_slope)


def leaky_relu_(input, negative_slope: float = 0.01):
    return leaky_relu(input, negative_slope, inplace=True)


def elu(input, alpha: float = 1.0, inplace: bool = False):
    """``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere."""
    return _run(A._ELU, input, inplace, alpha=alpha, scale=1.0, input_scale=1.0)


def elu_(input, alpha: float = 1.0):
    return elu(input, alpha, inplace=True)


def selu(input, inplace: bool = False):
    """``scale * elu(x, alpha)`` with the self-normalising constants."""
    return _run(A._ELU, input, inplace, alpha=SELU_ALPHA, scale=SELU_SCALE, input_scale=1.0)


def selu_(input):
    return selu(input, inplace=True)


def celu(input, alpha: float = 1.0, inplace: bool = False):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""
    if alpha == 0:
        raise RuntimeError("ZeroDivisionError: alpha cannot be 0 for CELU")
    return _run(A._ELU, input, inplace, alpha=alpha, scale=1.0, input_scale=1.0 / alpha)


def celu_(input, alpha: float = 1.0):
    return celu(input, alpha, inplace=True)


def gelu(input, approximate: str = "none"):
    """``x * Phi(x)``; ``approximate='tanh'`` uses the tanh formula."""
    return call(A._GELU, input, approximate=approximate)


def silu(input, inplace: bool = False):
    """``x * sigmoid(x)``."""
    return _run(A._SILU, input, inplace)


def mish(input, inplace: bool = False):
    """``x * tanh(softplus(x))``."""
    return _run(A._MISH, input, inplace)


def softplus(input, beta: float = 1.0, threshold: float = 20.0):
    """``log(1 + exp(beta x)) / beta``, linear where ``beta x > threshold``."""
    return A.softplus(input, beta, threshold)


def softsign(input):
    """``x / (1 + |x|)``."""
    return input / (input.abs() + 1)


def softshrink(input, lambd: float = 0.5):
    """``x - lambd`` above lambd, ``x + lambd`` below -lambd, 0 between."""
    return call(A._SOFTSHRINK, input, lambd=lambd)


def hardshrink(input, lambd: float = 0.5):
    """``x`` outside [-lambd, lambd], 0 inside."""
    return call(A._HARDSHRINK, input, lambd=lambd)


def tanhshrink(input):
    """``x - tanh(x)``."""
    return input - input.tanh()


def threshold(input, threshold: float, value: float, inplace: bool = False):
    """``value`` where ``x <= threshold``, else ``x``."""
    return _run(A._THRESHOLD, input, inplace, threshold=threshold, value=value)


def threshold_(input, threshold: float, value: float):
    return _run(A._THRESHOLD, input, True, threshold=threshold, value=value)


def hardsigmoid(input, inplace: bool = False):
    """``relu6(x + 3) / 6``."""
    return _run(A._HARDSIGMOID, input, inplace)


def hardswish(input, inplace: bool = False):
    """``x * relu6(x + 3) / 6``."""
    return _run(A._HARDSWISH, input, inplace)


def prelu(input, weight):
    """``max(0, x) + weight * min(0, x)`` with a learned slope per channel (dim 1)."""
    return A.prelu(input, weight)


def rrelu(input, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False,
          inplace: bool = False):
    """Leaky ReLU with a random slope in [lower, upper] per negative element when training,
    the mean slope ``(lower + upper) / 2`` otherwise."""
    if lower > upper:
        raise RuntimeError("Lower bound should be less than or equal to the upper bound")
    if not training:
        return leaky_relu(input, (lower + upper) / 2, inplace)
    need_float("rrelu_with_noise_cpu", input.meta())
    with no_grad():
        noise = empty_like(input).uniform_(lower, upper)
        noise = ternary.where(input >= 0, 1.0, noise) if input.numel() else noise
    return input.mul_(noise) if inplace else input * noise


def rrelu_(input, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False):
    return rrelu(input, lower, upper, training, inplace=True)


def glu(input, dim: int = -1):
    """``a * sigmoid(b)`` where ``a, b`` are the two halves of ``input`` along ``dim``."""
    if input.dim() == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    need_float("glu_cpu", input.meta())
    d = wrap_dim(dim, input.dim(), "glu")
    n = input.shape[d]
    if n % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {d} is size {n}")
    a, b = input.narrow(d, 0, n // 2), input.narrow(d, n // 2, n // 2)
    return a * b.sigmoid()


def logsigmoid(input):
    """``log(sigmoid(x))``, computed without overflow."""
    return call(A._LOGSIGMOID, input)


def sigmoid(input):
    return input.sigmoid()


def tanh(input):
    return input.tanh()


def _softmax_dim(name: str, ndim: int, stacklevel: int) -> int:
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call "
                  "to include dim=X as an argument.", stacklevel=stacklevel)
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input, dim: int | None = None, _stacklevel: int = 3, dtype=None):
    """``exp(x) / sum(exp(x))`` along ``dim`` (legacy rule when ``dim`` is None).

    >>> F.softmax(tessera.tensor([0., 0.]), dim=0)
    tensor([0.5000, 0.5000])
    """
    if dim is None:
        dim = _softmax_dim("softmax", input.dim(), _stacklevel)
    return A.softmax(input, dim, dtype)


def log_softmax(input, dim: int | None = None, _stacklevel: int = 3, dtype=None):
    """``log(softmax(x))`` along ``dim``, computed stably."""
    if dim is None:
        dim = _softmax_dim("log_softmax", input.dim(), _stacklevel)
    return A.log_softmax(input, dim, dtype)


def softmin(input, dim: int | None = None, _stacklevel: int = 3, dtype=None):
    """``softmax(-x)`` along ``dim``."""
    if dim is None:
        dim = _softmax_dim("softmin", input.dim(), _stacklevel)
    return A.softmax(-input, dim, dtype)


def gumbel_softmax(logits, tau: float = 1, hard: bool = False, eps: float = 1e-10,
                   dim: int = -1):
    """Samples from the Gumbel-softmax distribution; ``hard`` gives one-hot samples whose
    gradient is the soft sample's (straight-through)."""
    if eps != 1e-10:
        warnings.warn("`eps` parameter is deprecated and has no effect.", stacklevel=2)
    gumbels = -empty_like(logits).exponential_().log()
    y_soft = A.softmax((logits + gumbels) / tau, dim)
    if not hard:
        return y_soft
    index = y_soft.max(dim, keepdim=True)[1]
    y_hard = zeros_like(logits).scatter_(dim, index, 1.0)
    return y_hard - y_soft.detach() + y_soft
