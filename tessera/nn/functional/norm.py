"""Normalisation functions: batch, instance, layer, group, RMS and local response norm.

The normalisation itself is one op each (``tessera.ops.norm``); this module checks
arguments like PyTorch and updates running statistics in place (without autograd).

>>> import tessera
>>> import tessera.nn.functional as F
>>> F.layer_norm(tessera.tensor([[1., 3.]]), (2,), eps=0.0).tolist()
[[-1.0, 1.0]]
"""
from __future__ import annotations

import numpy as np

from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.ops import norm as N
from tessera.ops._util import ensure_tensor

__all__ = ["batch_norm", "instance_norm", "layer_norm", "group_norm", "rms_norm",
           "local_response_norm"]


def _verify_batch_size(size) -> None:
    prods = size[0]
    for s in size[2:]:
        prods *= s
    if prods == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input "
                         f"size {_size_str(size)}")


def _size_str(size) -> str:
    """A list prints as a list, a shape as ``tessera.Size([...])`` (PyTorch's messages)."""
    return str(size) if isinstance(size, list) else repr(size)


def _update_running(running: Tensor, stat: Tensor, momentum: float) -> None:
    """``running = (1 - momentum) * running + momentum * stat``, in place."""
    with no_grad():
        running.mul_(1.0 - momentum).add_(stat.to(running.dtype), alpha=momentum)


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalise each channel (dim 1) over the batch and spatial dims.

    In training the batch statistics normalise and update ``running_mean``/``running_var``
    (with the unbiased variance, like PyTorch); in eval the running ones normalise.
    """
    ensure_tensor("batch_norm", input)
    if training and input.dim() >= 2:
        _verify_batch_size(input.shape)
    if training and eps <= 0.0:
        raise ValueError(f"batch_norm eps must be positive during training, but got {eps}")
    if eps < 0.0:
        raise ValueError(f"batch_norm eps must be non-negative, but got {eps}")
    if (running_mean is None) != (running_var is None) and training:
        raise ValueError("running_mean and running_var must either both be None or neither "
                         "be None")
    if training:
        out, mean, var = N.batch_norm(input, weight, bias, None, None, training=True, eps=eps)
        if running_mean is not None and running_var is not None and input.numel():
            # (an empty batch updates nothing, like PyTorch)
            n = input.numel() // max(input.shape[1], 1)
            _check_running(running_mean, running_var, input.shape[1])
            _update_running(running_mean, mean, momentum)
            _update_running(running_var, var * (n / (n - 1) if n > 1 else float("nan")),
                            momentum)
        return out
    return N.batch_norm(input, weight, bias, running_mean, running_var, training=False,
                        eps=eps)[0]


def _check_running(running_mean: Tensor, running_var: Tensor, c: int) -> None:
    for name, t in (("running_mean", running_mean), ("running_var", running_var)):
        if t.numel() != c:
            raise RuntimeError(f"{name} should contain {c} elements not {t.numel()}")


def _verify_spatial_size(size) -> None:
    prods = 1
    for s in size[2:]:
        prods *= s
    if prods == 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input "
                         f"size {_size_str(size)}")


def instance_norm(input: Tensor, running_mean: Tensor | None = None,
                  running_var: Tensor | None = None, weight: Tensor | None = None,
                  bias: Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalise each channel of each sample over its spatial dims (batch norm over a
    ``(1, N*C, *)`` view, PyTorch's decomposition)."""
    ensure_tensor("instance_norm", input)
    if use_input_stats:
        _verify_spatial_size(input.shape)
    if input.dim() < 2:
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[{-max(input.dim(), 1)}, {max(input.dim(), 1) - 1}], but got 1)")
    n, c = input.shape[:2]
    x = input.reshape((1, n * c) + tuple(input.shape[2:]))
    w = weight.repeat(n) if weight is not None else None
    b = bias.repeat(n) if bias is not None else None
    if use_input_stats:
        out, mean, var = N.batch_norm(x, w, b, None, None, training=True, eps=eps)
        if running_mean is not None and running_var is not None:
            m = input.numel() // max(n * c, 1)
            _check_running(running_mean.repeat(n), running_var.repeat(n), n * c)
            _update_running(running_mean, mean.reshape(n, c).mean(0), momentum)
            unbiased = var * (m / (m - 1)) if m > 1 else var * float("nan")
            _update_running(running_var, unbiased.reshape(n, c).mean(0), momentum)
    else:
        rm = running_mean.repeat(n) if running_mean is not None else None
        rv = running_var.repeat(n) if running_var is not None else None
        out = N.batch_norm(x, w, b, rm, rv, training=False, eps=eps)[0]
    return out.reshape(input.shape)


def _shape_arg(op: str, normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, (int, np.integer)) or \
            not isinstance(normalized_shape, (tuple, list)):
        raise TypeError(f"{op}(): argument 'normalized_shape' (position 2) must be tuple of "
                        f"ints, not {type(normalized_shape).__name__}")
    return tuple(int(s) for s in normalized_shape)


def layer_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalise over the trailing dims given by ``normalized_shape``.

    >>> import tessera
    >>> layer_norm(tessera.ones(2, 3), (3,)).tolist()
    [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    """
    ensure_tensor("layer_norm", input)
    shape = _shape_arg("layer_norm", normalized_shape)
    return N.layer_norm(input, weight, bias, normalized_shape=shape, eps=eps)


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """``input / sqrt(mean(input**2) + eps) * weight`` over the trailing dims; ``eps``
    defaults to the machine epsilon of ``input``'s dtype."""
    ensure_tensor("rms_norm", input)
    shape = _shape_arg("rms_norm", normalized_shape)
    if eps is None:
        eps = float(np.finfo(input.dtype.np).eps) if input.dtype.is_floating_point else 0.0
    return N.rms_norm(input, weight, normalized_shape=shape, eps=eps)


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalise each of ``num_groups`` channel groups of every sample."""
    ensure_tensor("group_norm", input)
    if input.dim() < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received "
                           f"{input.dim()}")
    if num_groups > 0:
        n, c = input.shape[:2]
        _verify_batch_size([n * c // num_groups, num_groups] + list(input.shape[2:]))
    return N.group_norm(input, weight, bias, num_groups=num_groups, eps=eps)


def local_response_norm(input: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75,
                        k: float = 1.0) -> Tensor:
    """Divide each element by ``(k + alpha * mean of squares over a window of `size`
    neighbouring channels) ** beta`` (zero-padded, the window counts its padding)."""
    ensure_tensor("local_response_norm", input)
    dim = input.dim()
    if dim < 3:
        raise ValueError(f"Expected 3D or higher dimensionality                          "
                         f"input (got {dim} dimensions)")
    if input.numel() == 0:
        return input
    from tessera.ops.creation import zeros
    from tessera.ops.shape import cat
    sq = input * input
    c = input.shape[1]
    rest = tuple(input.shape[2:])
    front = zeros((input.shape[0], size // 2) + rest, dtype=input.dtype, device=input.device)
    back = zeros((input.shape[0], (size - 1) // 2) + rest, dtype=input.dtype,
                 device=input.device)
    padded = cat([front, sq, back], 1)
    # the window sum as `size` shifted slices: a loop over the window, not the elements
    acc = padded.narrow(1, 0, c)
    for i in range(1, size):
        acc = acc + padded.narrow(1, i, c)
    div = (acc * (alpha / size) + k).pow(beta)
    return input / div
