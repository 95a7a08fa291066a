"""Pooling of ``nn.functional``: argument handling over the ops of ``tessera.ops.pool``
(strided window views) and ``tessera.ops.vision`` (adaptive average pooling).

>>> import tessera
>>> import tessera.nn.functional as F
>>> F.max_pool2d(tessera.arange(16.).reshape(1, 4, 4), 2).tolist()
[[[5.0, 7.0], [13.0, 15.0]]]
"""
from __future__ import annotations

import numpy as np

from tessera._tensor import Tensor
from tessera.autograd.grad_mode import is_grad_enabled
from tessera.nn.functional.conv import _is_int, _tensor
from tessera.ops import quantized
from tessera.ops.pool import (
    adaptive_max_pool,
    avg_pool,
    max_pool,
    max_pool_backward,
    max_pool_values,
)
from tessera.ops.quantized import QTensor
from tessera.ops.vision import interpolate as _resample

__all__ = ["max_pool1d", "max_pool2d", "max_pool3d", "max_pool1d_with_indices",
           "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d",
           "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
           "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
           "adaptive_max_pool1d_with_indices", "adaptive_max_pool2d_with_indices",
           "adaptive_max_pool3d_with_indices", "lp_pool1d", "lp_pool2d", "lp_pool3d",
           "max_unpool1d", "max_unpool2d", "max_unpool3d"]

_WORDS = {1: "one int", 2: "two ints", 3: "three ints"}


def _pool_tuple(value, nd: int, name: str, fn: str, default=None) -> tuple[int, ...]:
    """An int or a sequence of 1 or ``nd`` ints; None / [] give ``default`` (the kernel)."""
    if default is not None and (value is None or (isinstance(value, (tuple, list))
                                                  and len(value) == 0)):
        return default
    if _is_int(value):
        return (int(value),) * nd
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{fn}(): argument '{name}' must be tuple of ints, not "
                        f"{type(value).__name__}")
    vals = list(value)
    if any(not _is_int(v) for v in vals):
        raise TypeError(f"{fn}(): argument '{name}' must be tuple of ints")
    if len(vals) == 1:
        return (int(vals[0]),) * nd
    if len(vals) != nd:
        raise RuntimeError(f"{fn}: {name} must either be a single int, or a tuple of "
                           f"{_WORDS[nd]}")
    return tuple(int(v) for v in vals)


def _batch(fn: str, x, nd: int, exc=RuntimeError) -> tuple[Tensor, bool]:
    _tensor(fn, x, "input")
    if x.dim() == nd + 2:
        return x, True
    if x.dim() == nd + 1:
        return x.unsqueeze(0), False
    raise exc(f"{fn}: Expected {nd + 1}D or {nd + 2}D (batch mode) tensor with optional 0 dim "
              f"batch size for input, but got:{list(x.shape)}")


def _unbatch(out, batched: bool):
    if batched:
        return out
    if isinstance(out, tuple):
        return tuple(o.squeeze(0) for o in out)
    return out.squeeze(0)


# ---- max pooling -----------------------------------------------------------------------

def _max_pool(nd, fn, input, kernel_size, stride, padding, dilation, ceil_mode,
              return_indices):
    x, batched = _batch(fn, input, nd)
    k = _pool_tuple(kernel_size, nd, "kernel_size", fn)
    s = _pool_tuple(stride, nd, "stride", fn, default=k)
    p = _pool_tuple(padding, nd, "padding", fn)
    d = _pool_tuple(dilation, nd, "dilation", fn)
    if not return_indices and not (x.requires_grad and is_grad_enabled()):
        # nothing will read the indices: the faster values-only op
        y = max_pool_values(x, kernel_size=k, stride=s, padding=p, dilation=d,
                            ceil_mode=ceil_mode)
        return _unbatch(y, batched)
    y, idx = max_pool(x, kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil_mode)
    return _unbatch((y, idx) if return_indices else y, batched)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """1-d max pooling over (N, C, L) or (C, L); ``return_indices`` also gives the argmax."""
    return _max_pool(1, "max_pool1d", input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """2-d max pooling over (N, C, H, W) or (C, H, W); indices are flat in each H*W plane.
    A quantized tensor stays quantized (its integers pooled)."""
    if type(input) is QTensor and dilation in (1, (1, 1)) and not ceil_mode \
            and not return_indices:
        return quantized.max_pool2d(input, kernel_size, stride, padding)
    return _max_pool(2, "max_pool2d", input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """3-d max pooling over (N, C, D, H, W) or (C, D, H, W)."""
    return _max_pool(3, "max_pool3d", input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


def max_pool1d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1,
                            ceil_mode=False, return_indices=False):
    return _max_pool(1, "max_pool1d", input, kernel_size, stride, padding, dilation, ceil_mode,
                     True)


def max_pool2d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1,
                            ceil_mode=False, return_indices=False):
    return _max_pool(2, "max_pool2d", input, kernel_size, stride, padding, dilation, ceil_mode,
                     True)


def max_pool3d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1,
                            ceil_mode=False, return_indices=False):
    return _max_pool(3, "max_pool3d", input, kernel_size, stride, padding, dilation, ceil_mode,
                     True)


# ---- average pooling ---------------------------------------------------------------------

def _avg_pool(nd, fn, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
              divisor_override):
    _tensor(fn, input, "input")
    if fn == "avg_pool2d" and input.dim() < 3:   # PyTorch reads input.size(-3) first
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[{-max(input.dim(), 1)}, {max(input.dim(), 1) - 1}], but got -3)")
    x, batched = _batch(fn, input, nd)
    k = _pool_tuple(kernel_size, nd, "kernel_size", fn)
    s = _pool_tuple(stride, nd, "stride", fn, default=k)
    p = _pool_tuple(padding, nd, "padding", fn)
    if divisor_override is not None and not _is_int(divisor_override):
        raise TypeError(f"{fn}(): argument 'divisor_override' must be int")
    y = avg_pool(x, kernel_size=k, stride=s, padding=p, ceil_mode=ceil_mode,
                 count_include_pad=count_include_pad, divisor_override=divisor_override)
    return _unbatch(y, batched)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True):
    """1-d average pooling over (N, C, L) or (C, L)."""
    return _avg_pool(1, "avg_pool1d", input, kernel_size, stride, padding, ceil_mode,
                     count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """2-d average pooling over (N, C, H, W) or (C, H, W).

    >>> import tessera
    >>> avg_pool2d(tessera.arange(16.).reshape(1, 4, 4), 2).tolist()
    [[[2.5, 4.5], [10.5, 12.5]]]
    """
    return _avg_pool(2, "avg_pool2d", input, kernel_size, stride, padding, ceil_mode,
                     count_include_pad, divisor_override)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """3-d average pooling over (N, C, D, H, W) or (C, D, H, W)."""
    return _avg_pool(3, "avg_pool3d", input, kernel_size, stride, padding, ceil_mode,
                     count_include_pad, divisor_override)


# ---- adaptive pooling --------------------------------------------------------------------

def _adaptive_size(fn, output_size, nd, in_spatial) -> tuple[int, ...]:
    if _is_int(output_size):
        return (int(output_size),) * nd
    if not isinstance(output_size, (tuple, list)):
        raise TypeError(f"{fn}(): argument 'output_size' must be tuple of ints, not "
                        f"{type(output_size).__name__}")
    if len(output_size) != nd:
        raise RuntimeError(f"{fn}: output_size must be {nd}")
    out = []
    for o, s in zip(output_size, in_spatial):
        if o is None:
            out.append(int(s))
        elif _is_int(o):
            out.append(int(o))
        else:
            raise TypeError(f"{fn}(): argument 'output_size' must be tuple of ints")
    return tuple(out)


def _adaptive_batch(fn, input, nd):
    _tensor(fn, input, "input")
    if input.dim() not in (nd + 1, nd + 2):
        raise RuntimeError(f"{fn}(): Expected {nd + 1}D or {nd + 2}D tensor, but got "
                           f"{list(input.shape)}")
    return _batch(fn, input, nd)


def _adaptive_avg(nd, fn, input, output_size):
    x, batched = _adaptive_batch(fn, input, nd)
    size = _adaptive_size(fn, output_size, nd, x.shape[2:])
    y = _resample(x, mode="area", size=size, scales=(None,) * nd, align_corners=False)
    return _unbatch(y, batched)


def adaptive_avg_pool1d(input, output_size):
    """Average pooling to a fixed output length (PyTorch's window formula)."""
    return _adaptive_avg(1, "adaptive_avg_pool1d", input, output_size)


def adaptive_avg_pool2d(input, output_size):
    """Average pooling to a fixed (H, W); ``None`` keeps that input size.

    >>> import tessera
    >>> adaptive_avg_pool2d(tessera.arange(16.).reshape(1, 4, 4), 1).tolist()
    [[[7.5]]]
    """
    if type(input) is QTensor:  # a quantized tensor stays quantized (same qparams)
        return quantized.adaptive_avg_pool2d(input, output_size)
    return _adaptive_avg(2, "adaptive_avg_pool2d", input, output_size)


def adaptive_avg_pool3d(input, output_size):
    """Average pooling to a fixed (D, H, W)."""
    return _adaptive_avg(3, "adaptive_avg_pool3d", input, output_size)


def _adaptive_max(nd, fn, input, output_size, return_indices):
    x, batched = _adaptive_batch(fn, input, nd)
    size = _adaptive_size(fn, output_size, nd, x.shape[2:])
    y, idx = adaptive_max_pool(x, size)
    return _unbatch((y, idx) if return_indices else y, batched)


def adaptive_max_pool1d(input, output_size, return_indices=False):
    """Max pooling to a fixed output length."""
    return _adaptive_max(1, "adaptive_max_pool1d", input, output_size, return_indices)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """Max pooling to a fixed (H, W); ``return_indices`` gives flat H*W argmax positions."""
    return _adaptive_max(2, "adaptive_max_pool2d", input, output_size, return_indices)


def adaptive_max_pool3d(input, output_size, return_indices=False):
    """Max pooling to a fixed (D, H, W)."""
    return _adaptive_max(3, "adaptive_max_pool3d", input, output_size, return_indices)


def adaptive_max_pool1d_with_indices(input, output_size, return_indices=False):
    return _adaptive_max(1, "adaptive_max_pool1d", input, output_size, True)


def adaptive_max_pool2d_with_indices(input, output_size, return_indices=False):
    return _adaptive_max(2, "adaptive_max_pool2d", input, output_size, True)


def adaptive_max_pool3d_with_indices(input, output_size, return_indices=False):
    return _adaptive_max(3, "adaptive_max_pool3d", input, output_size, True)


# ---- power-average pooling -----------------------------------------------------------------

def _lp_pool(nd, input, norm_type, kernel_size, stride, ceil_mode):
    fn = f"lp_pool{nd}d"
    k = _pool_tuple(kernel_size, nd, "kernel_size", fn)
    max_fn = (max_pool1d, max_pool2d, max_pool3d)[nd - 1]
    avg_fn = (avg_pool1d, avg_pool2d, avg_pool3d)[nd - 1]
    if isinstance(norm_type, (int, float)) and norm_type == float("inf"):
        return max_fn(input.abs(), kernel_size, stride, 0, 1, ceil_mode)
    if isinstance(norm_type, (int, float)) and norm_type == -float("inf"):
        return -max_fn(-input.abs(), kernel_size, stride, 0, 1, ceil_mode)
    out = avg_fn(input.pow(norm_type), kernel_size, stride, 0, ceil_mode)
    from tessera.ops.unary import relu
    return (out.sign() * relu(out.abs())).mul(int(np.prod(k))).pow(1.0 / norm_type)


def lp_pool1d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    """Power-average pooling: (sum over the window of x**p) ** (1/p)."""
    return _lp_pool(1, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool2d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    """Power-average pooling over 2-d windows."""
    return _lp_pool(2, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool3d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    """Power-average pooling over 3-d windows."""
    return _lp_pool(3, input, norm_type, kernel_size, stride, ceil_mode)


# ---- max unpooling ---------------------------------------------------------------------

def _unpool_size(x: Tensor, kernel, stride, padding, output_size) -> tuple[int, ...]:
    nd = len(kernel)
    default = [(x.shape[-nd + d] - 1) * stride[d] + kernel[d] - 2 * padding[d]
               for d in range(nd)]
    if output_size is None:
        out = default
    else:
        output_size = list(output_size)
        if len(output_size) == nd + 2:
            output_size = output_size[2:]
        if len(output_size) != nd:
            raise ValueError(f"output_size should be a sequence containing {nd} or {nd + 2} "
                             f"elements, but it has a length of '{len(output_size)}'")
        for d in range(nd):
            lo, hi = default[d] - stride[d], default[d] + stride[d]
            if not lo < output_size[d] < hi:
                raise ValueError(f'invalid output_size "{output_size}" (dim {d} must be '
                                 f"between {lo} and {hi})")
        out = output_size
    for d in range(nd):
        if out[d] < 0:
            raise ValueError(f"max_unpooling: output_size must contain non-negative spatial "
                             f"dimensions, but got output_size[{d}]={out[d]}")
    return tuple(int(o) for o in out)


def _max_unpool(nd, input, indices, kernel_size, stride, padding, output_size):
    fn = f"max_unpool{nd}d"
    k = _pool_tuple(kernel_size, nd, "kernel_size", fn)
    s = _pool_tuple(stride, nd, "stride", fn, default=k)
    p = _pool_tuple(padding, nd, "padding", fn)
    x, batched = _batch(fn, input, nd)
    _tensor(fn, indices, "indices")
    if tuple(indices.shape) != tuple(input.shape):
        raise RuntimeError(f"{fn}: Expected shape of indices to be same as that of the input "
                           f"tensor ({list(input.shape)}) but got indices tensor with shape: "
                           f"{list(indices.shape)}")
    idx = indices if batched else indices.unsqueeze(0)
    size = _unpool_size(x, k, s, p, output_size)
    # with non-overlapping windows each index appears once, so the scatter-add of
    # max pooling's backward is exactly the unpooling scatter
    y = max_pool_backward(x, idx, tuple(x.shape[:2]) + size)
    return _unbatch(y, batched)


def max_unpool1d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    """Partial inverse of max_pool1d: values placed at their indices, zeros elsewhere."""
    return _max_unpool(1, input, indices, kernel_size, stride, padding, output_size)


def max_unpool2d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    """Partial inverse of max_pool2d."""
    return _max_unpool(2, input, indices, kernel_size, stride, padding, output_size)


def max_unpool3d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    """Partial inverse of max_pool3d."""
    return _max_unpool(3, input, indices, kernel_size, stride, padding, output_size)
