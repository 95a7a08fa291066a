"""Helpers shared by the distributions: broadcasting parameters, probabilities and logits,
and ``lazy_property``.

>>> import tessera
>>> from tessera.distributions.utils import broadcast_all, probs_to_logits
>>> [t.shape for t in broadcast_all(tessera.zeros(2, 1), 1.0, tessera.zeros(3))]
[tessera.Size([2, 3]), tessera.Size([2, 3]), tessera.Size([2, 3])]
>>> probs_to_logits(tessera.tensor([0.5]), is_binary=True)
tensor([0.])
"""
from __future__ import annotations

import numbers
from functools import update_wrapper

from tessera.distributions import _ops as T

__all__ = ["broadcast_all", "logits_to_probs", "probs_to_logits", "clamp_probs",
           "lazy_property", "euler_constant"]

euler_constant = 0.57721566490153286060  # Euler-Mascheroni


def broadcast_all(*values):
    """Tensors and numbers broadcast to one shape; numbers become tensors of the first
    tensor's dtype (the default dtype when there is none)."""
    if not all(isinstance(v, (T.Tensor, numbers.Number)) for v in values):
        raise ValueError("Input arguments must all be instances of numbers.Number, "
                         "torch.Tensor or objects implementing __torch_function__.")
    if all(isinstance(v, T.Tensor) for v in values):
        return T.broadcast_tensors(*values)
    like = next((v for v in values if isinstance(v, T.Tensor)), None)
    dtype = like.dtype if like is not None else T.get_default_dtype()
    tensors = [v if isinstance(v, T.Tensor) else T.tensor(v, dtype=dtype) for v in values]
    return T.broadcast_tensors(*tensors)


def _standard_normal(shape, dtype):
    return T.randn(tuple(shape), dtype=dtype)


def _sum_rightmost(value, dim: int):
    """``value`` summed over its ``dim`` rightmost dims."""
    if dim == 0:
        return value
    return value.reshape(tuple(value.shape[:value.dim() - dim]) + (-1,)).sum(-1)


def _xlogy(x, y):
    """``x * log(y)``, 0 where ``x`` is 0 (``torch.xlogy``)."""
    return T.where(x == 0, 0.0, x * T.log(y))


def logits_to_probs(logits, is_binary: bool = False):
    """Probabilities from logits: sigmoid (binary) or softmax over the last dim."""
    return T.sigmoid(logits) if is_binary else T.softmax(logits, -1)


def clamp_probs(probs):
    """``probs`` clamped to [eps, 1 - eps] of its dtype, so logs stay finite."""
    eps = T.finfo(probs.dtype).eps
    return probs.clamp(min=eps, max=1 - eps)


def probs_to_logits(probs, is_binary: bool = False):
    """Logits from probabilities (clamped first): ``log p - log(1 - p)`` when binary, else
    ``log p``."""
    p = clamp_probs(probs)
    return T.log(p) - T.log1p(-p) if is_binary else T.log(p)


class lazy_property:
    """A property computed on first access and then stored on the instance; under
    ``no_grad`` when read from the class (a dependent constraint lookup)."""

    def __init__(self, wrapped):
        self.wrapped = wrapped
        update_wrapper(self, wrapped)  # type: ignore[arg-type]

    def __get__(self, instance, obj_type=None):
        if instance is None:
            return _lazy_property_and_property(self.wrapped)
        with T.enable_grad():
            value = self.wrapped(instance)
        setattr(instance, self.wrapped.__name__, value)
        return value


class _lazy_property_and_property(lazy_property, property):
    def __init__(self, wrapped):
        property.__init__(self, wrapped)

