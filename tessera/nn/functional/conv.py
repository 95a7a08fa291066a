"""Convolutions of ``nn.functional``: argument handling over the conv ops of
``tessera.ops.conv`` (im2col + GEMM; the transposed convolution is ``conv_input_grad``).

>>> import tessera
>>> import tessera.nn.functional as F
>>> F.conv2d(tessera.ones(1, 2, 5, 5), tessera.ones(3, 2, 3, 3), padding="same").shape
tessera.Size([1, 3, 5, 5])
"""
from __future__ import annotations

import numpy as np

from tessera._dispatch import _MODES, composite_args
from tessera._tensor import Tensor
from tessera.ops.conv import conv, conv_input_grad

__all__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d"]


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def ntuple(value, n: int, name: str, fn: str, exc=RuntimeError) -> tuple[int, ...]:
    """An int or a sequence of 1 or ``n`` ints as an ``n``-tuple (PyTorch's expansion rule)."""
    if _is_int(value):
        return (int(value),) * n
    if isinstance(value, Tensor) or not isinstance(value, (tuple, list)):
        raise TypeError(f"{fn}(): argument '{name}' must be tuple of ints, not "
                        f"{type(value).__name__}")
    vals = list(value)
    for v in vals:
        if not _is_int(v):
            raise TypeError(f"{fn}(): argument '{name}' must be tuple of ints, but found "
                            f"element of type {type(v).__name__}")
    if len(vals) == 1:
        return (int(vals[0]),) * n
    if len(vals) != n:
        raise exc(f"{fn}: expected {name} to be a single integer value or a list of {n} "
                  f"values to match the convolution dimensions, but got {name}={vals}")
    return tuple(int(v) for v in vals)


def _tensor(fn: str, x, name: str):
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}(): argument '{name}' must be Tensor, not {type(x).__name__}")
    return x


def batch(fn: str, x: Tensor, nd: int, what: str = "input to") -> tuple[Tensor, bool]:
    """(N, C, *S) view of a batched or unbatched input, and whether it was batched."""
    if x.dim() == nd + 2:
        return x, True
    if x.dim() == nd + 1:
        return x.unsqueeze(0), False
    raise RuntimeError(f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) {what} {fn}, but "
                       f"got input of size: {list(x.shape)}")


def _same_pads(fn, weight, stride, dilation):
    if any(s != 1 for s in stride):
        raise RuntimeError(f"{fn}: padding='same' is not supported for strided convolutions")
    pads = []
    for d, k in zip(dilation, weight.shape[2:]):
        total = d * (k - 1)
        pads.append((total // 2, total - total // 2))
    return tuple(pads)


def _convnd(nd, fn, input, weight, bias, stride, padding, dilation, groups):
    _tensor(fn, input, "input")
    _tensor(fn, weight, "weight")
    x, batched = batch(fn, input, nd)
    if weight.dim() != nd + 2:
        raise RuntimeError(f"{fn}: expected weight to be {nd + 2}-dimensional, but got weight "
                           f"of size {list(weight.shape)}")
    stride = ntuple(stride, nd, "stride", fn)
    dilation = ntuple(dilation, nd, "dilation", fn)
    if isinstance(padding, str):
        if padding == "valid":
            pads = ((0, 0),) * nd
        elif padding == "same":
            if any(d < 1 for d in dilation):
                raise RuntimeError(f"{fn}: non-positive dilation is not supported")
            pads = _same_pads(fn, weight, stride, dilation)
        else:
            raise RuntimeError(f"{fn}: Invalid padding string: '{padding}'")
    else:
        pads = tuple((p, p) for p in ntuple(padding, nd, "padding", fn))
    if not _is_int(groups):
        raise TypeError(f"{fn}(): argument 'groups' must be int, not {type(groups).__name__}")
    y = conv(x, weight, bias, stride=stride, pads=pads, dilation=dilation, groups=groups)
    return y if batched else y.squeeze(0)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor:
    """1-d convolution over (N, C, L) or (C, L); ``padding`` may be 'same' or 'valid'."""
    return _convnd(1, "conv1d", input, weight, bias, stride, padding, dilation, groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor:
    """2-d convolution over (N, C, H, W) or (C, H, W); ``padding`` may be 'same' or 'valid'.

    >>> import tessera
    >>> conv2d(tessera.ones(1, 1, 3, 3), tessera.ones(1, 1, 2, 2)).flatten().tolist()
    [4.0, 4.0, 4.0, 4.0]
    """
    return _convnd(2, "conv2d", input, weight, bias, stride, padding, dilation, groups)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor:
    """3-d convolution over (N, C, D, H, W) or (C, D, H, W)."""
    return _convnd(3, "conv3d", input, weight, bias, stride, padding, dilation, groups)


# ---- transposed convolution ------------------------------------------------------------

def transpose_output_shape(fn, x_shape, w_shape, stride, padding, output_padding, groups,
                           dilation) -> tuple[int, ...]:
    """(N, C_out, *S_out) of a transposed convolution (PyTorch's formula)."""
    for op, s, d in zip(output_padding, stride, dilation):
        if op >= s and op >= d:
            raise RuntimeError(f"{fn}: output padding must be smaller than either stride or "
                               f"dilation, but got output_padding={list(output_padding)} "
                               f"stride={list(stride)} dilation={list(dilation)}")
    spatial = tuple((i - 1) * s - 2 * p + d * (k - 1) + op + 1 for i, s, p, d, k, op in
                    zip(x_shape[2:], stride, padding, dilation, w_shape[2:], output_padding))
    return (x_shape[0], w_shape[1] * groups) + spatial


def conv_transpose(nd, fn, input, weight, bias, stride, padding, output_padding, groups,
                   dilation) -> Tensor:
    """The shared body of conv_transpose{1,2,3}d (also used by the ConvTranspose modules)."""
    _tensor(fn, input, "input")
    _tensor(fn, weight, "weight")
    if _MODES:  # autocast casts input, weight and bias as one op
        input, weight, bias = composite_args("conv_transpose", (input, weight, bias))
    if isinstance(padding, str):
        raise TypeError(f"{fn}(): argument 'padding' must be tuple of ints, not str")
    x, batched = batch(fn, input, nd)
    if weight.dim() != nd + 2:
        raise RuntimeError(f"{fn}: expected weight to be {nd + 2}-dimensional, but got weight "
                           f"of size {list(weight.shape)}")
    stride = ntuple(stride, nd, "stride", fn)
    padding = ntuple(padding, nd, "padding", fn)
    output_padding = ntuple(output_padding, nd, "output_padding", fn)
    dilation = ntuple(dilation, nd, "dilation", fn)
    if not _is_int(groups):
        raise TypeError(f"{fn}(): argument 'groups' must be int, not {type(groups).__name__}")
    if any(s < 1 for s in stride) or any(d < 1 for d in dilation):
        raise RuntimeError(f"{fn}: non-positive stride or dilation is not supported")
    if any(p < 0 for p in padding) or any(p < 0 for p in output_padding):
        raise RuntimeError(f"{fn}: negative padding is not supported")
    shape = transpose_output_shape(fn, tuple(x.shape), tuple(weight.shape), stride, padding,
                                   output_padding, groups, dilation)
    # the transposed conv is the adjoint of the conv whose input has the output's shape and
    # whose high-side padding is reduced by output_padding (negative = cropped): then the
    # two shapes match exactly and conv / conv_input_grad stay each other's gradients
    pads = tuple((p, p - op) for p, op in zip(padding, output_padding))
    y = conv_input_grad(x, weight, input_shape=shape, stride=stride, pads=pads,
                        dilation=dilation, groups=groups)
    if bias is not None:
        _tensor(fn, bias, "bias")
        if bias.dim() != 1 or bias.shape[0] != shape[1]:
            raise RuntimeError(f"{fn}: Given transposed weight of size {list(weight.shape)}, "
                               f"expected bias to be 1-dimensional with {shape[1]} elements, "
                               f"but got bias of size {list(bias.shape)} instead")
        if bias.dtype is not y.dtype:
            raise RuntimeError(f"{fn}: Input type ({y.dtype}) and bias type ({bias.dtype}) "
                               "should be the same")
        y = y + bias.reshape((1, -1) + (1,) * nd)
    return y if batched else y.squeeze(0)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups=1, dilation=1) -> Tensor:
    """1-d transposed convolution; ``weight`` is (C_in, C_out / groups, K)."""
    return conv_transpose(1, "conv_transpose1d", input, weight, bias, stride, padding,
                          output_padding, groups, dilation)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups=1, dilation=1) -> Tensor:
    """2-d transposed convolution; ``weight`` is (C_in, C_out / groups, kH, kW).

    >>> import tessera
    >>> conv_transpose2d(tessera.ones(1, 1, 2, 2), tessera.ones(1, 1, 2, 2), stride=2).shape
    tessera.Size([1, 1, 4, 4])
    """
    return conv_transpose(2, "conv_transpose2d", input, weight, bias, stride, padding,
                          output_padding, groups, dilation)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups=1, dilation=1) -> Tensor:
    """3-d transposed convolution; ``weight`` is (C_in, C_out / groups, kD, kH, kW)."""
    return conv_transpose(3, "conv_transpose3d", input, weight, bias, stride, padding,
                          output_padding, groups, dilation)
