"""Convolution layers: Conv1d/2d/3d and ConvTranspose1d/2d/3d, with PyTorch's constructor
arguments, attributes (tuples), default initialisation and repr.

>>> import tessera
>>> import tessera.nn as nn
>>> nn.Conv2d(3, 8, 3, padding=1)
Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))
"""
from __future__ import annotations

import collections.abc
import math
from itertools import repeat

from tessera._tensor import Tensor
from tessera.nn import init
from tessera.nn.functional import conv as FC
from tessera.nn.functional.vision import pad as _pad
from tessera.nn.modules.module import Module
from tessera.nn.parameter import Parameter
from tessera.ops.creation import empty

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
           "ConvTranspose3d"]


def _ntuple(n: int):
    """PyTorch's nn.modules.utils._ntuple: iterables become tuples as they are."""
    def parse(x):
        if isinstance(x, collections.abc.Iterable) and not isinstance(x, str):
            return tuple(x)
        return tuple(repeat(x, n))
    return parse


_single, _pair, _triple = _ntuple(1), _ntuple(2), _ntuple(3)


def _reverse_repeat_tuple(t, n: int) -> tuple:
    return tuple(x for x in reversed(t) for _ in range(n))


class _ConvNd(Module):
    """Shared state of the convolution layers (weight, bias, padding bookkeeping)."""

    _nd = 2   # spatial dims, set per layer class

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation,
                 transposed, output_padding, groups, bias, padding_mode, device=None,
                 dtype=None) -> None:
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        valid_padding_strings = {"same", "valid"}
        if isinstance(padding, str):
            if padding not in valid_padding_strings:
                raise ValueError(f"Invalid padding string {padding!r}, should be one of "
                                 f"{valid_padding_strings}")
            if padding == "same" and any(s != 1 for s in stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
        valid_padding_modes = {"zeros", "reflect", "replicate", "circular"}
        if padding_mode not in valid_padding_modes:
            raise ValueError(f"padding_mode must be one of {valid_padding_modes}, but got "
                             f"padding_mode='{padding_mode}'")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.transposed = transposed
        self.output_padding = output_padding
        self.groups = groups
        self.padding_mode = padding_mode
        if isinstance(self.padding, str):
            rpad = [0, 0] * len(kernel_size)
            if padding == "same":
                for d, k, i in zip(dilation, kernel_size, range(len(kernel_size) - 1, -1, -1)):
                    total = d * (k - 1)
                    rpad[2 * i] = total // 2
                    rpad[2 * i + 1] = total - total // 2
            self._reversed_padding_repeated_twice = rpad
        else:
            self._reversed_padding_repeated_twice = list(_reverse_repeat_tuple(self.padding, 2))
        shape = ((in_channels, out_channels // groups) if transposed else
                 (out_channels, in_channels // groups)) + tuple(kernel_size)
        self.weight = Parameter(empty(shape, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: kaiming_uniform_(a=sqrt(5)) weights, uniform(+-1/sqrt(fan_in))
        bias."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        s = "{in_channels}, {out_channels}, kernel_size={kernel_size}, stride={stride}"
        if self.padding != (0,) * len(self.padding):
            s += ", padding={padding}"
        if self.dilation != (1,) * len(self.dilation):
            s += ", dilation={dilation}"
        if self.output_padding != (0,) * len(self.output_padding):
            s += ", output_padding={output_padding}"
        if self.groups != 1:
            s += ", groups={groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += ", padding_mode={padding_mode}"
        return s.format(**self.__dict__)

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        if not hasattr(self, "padding_mode"):
            self.padding_mode = "zeros"

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        fn = (FC.conv1d, FC.conv2d, FC.conv3d)[self._nd - 1]
        if self.padding_mode != "zeros":
            return fn(_pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode),
                      weight, bias, self.stride, 0, self.dilation, self.groups)
        return fn(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input: Tensor) -> Tensor:
        return self._conv_forward(input, self.weight, self.bias)


def _conv_init(self, tup, in_channels, out_channels, kernel_size, stride, padding,
               dilation, groups, bias, padding_mode, device, dtype):
    padding_ = padding if isinstance(padding, str) else tup(padding)
    _ConvNd.__init__(self, in_channels, out_channels, tup(kernel_size), tup(stride), padding_,
                     tup(dilation), False, tup(0), groups, bias, padding_mode, device, dtype)


class Conv1d(_ConvNd):
    """1-d convolution layer over (N, C_in, L) (or unbatched (C_in, L))."""

    _nd = 1

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device=None, dtype=None) -> None:
        _conv_init(self, _single, in_channels, out_channels, kernel_size, stride, padding,
                   dilation, groups, bias, padding_mode, device, dtype)


class Conv2d(_ConvNd):
    """2-d convolution layer over (N, C_in, H, W) (or unbatched (C_in, H, W))."""

    _nd = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device=None, dtype=None) -> None:
        _conv_init(self, _pair, in_channels, out_channels, kernel_size, stride, padding,
                   dilation, groups, bias, padding_mode, device, dtype)


class Conv3d(_ConvNd):
    """3-d convolution layer over (N, C_in, D, H, W) (or unbatched)."""

    _nd = 3

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device=None, dtype=None) -> None:
        _conv_init(self, _triple, in_channels, out_channels, kernel_size, stride, padding,
                   dilation, groups, bias, padding_mode, device, dtype)


# ---- transposed ------------------------------------------------------------------------

class _ConvTransposeNd(_ConvNd):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation,
                 transposed, output_padding, groups, bias, padding_mode, device=None,
                 dtype=None) -> None:
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for '
                             f"{self.__class__.__name__}")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         transposed, output_padding, groups, bias, padding_mode, device, dtype)

    def _output_padding(self, input, output_size, stride, padding, kernel_size,
                        num_spatial_dims, dilation=None) -> list[int] | tuple:
        """The output_padding that gives ``output_size`` (PyTorch's rule and errors)."""
        if output_size is None:
            return _single(self.output_padding)
        has_batch_dim = input.dim() == num_spatial_dims + 2
        num_non_spatial = 2 if has_batch_dim else 1
        output_size = list(output_size)
        if len(output_size) == num_non_spatial + num_spatial_dims:
            output_size = output_size[num_non_spatial:]
        if len(output_size) != num_spatial_dims:
            raise ValueError(f"ConvTranspose{num_spatial_dims}D: for {input.dim()}D input, "
                             f"output_size must have {num_spatial_dims} or "
                             f"{num_non_spatial + num_spatial_dims} elements (got "
                             f"{len(output_size)})")
        min_sizes, max_sizes = [], []
        for d in range(num_spatial_dims):
            dil = dilation[d] if dilation is not None else 1
            size = ((input.size(d + num_non_spatial) - 1) * stride[d] - 2 * padding[d] +
                    dil * (kernel_size[d] - 1) + 1)
            min_sizes.append(size)
            max_sizes.append(size + stride[d] - 1)
        for size, lo, hi in zip(output_size, min_sizes, max_sizes):
            if size < lo or size > hi:
                raise ValueError(f"requested an output size of {output_size}, but valid sizes "
                                 f"range from {min_sizes} to {max_sizes} (for an input of "
                                 f"{input.size()[num_non_spatial:]})")
        return [output_size[d] - min_sizes[d] for d in range(num_spatial_dims)]

    def forward(self, input: Tensor, output_size=None) -> Tensor:
        if self.padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for '
                             f"{self.__class__.__name__}")
        nd = self._nd
        output_padding = self._output_padding(input, output_size, self.stride, self.padding,
                                              self.kernel_size, nd, self.dilation)
        return FC.conv_transpose(nd, f"conv_transpose{nd}d", input, self.weight, self.bias,
                                 self.stride, self.padding, output_padding, self.groups,
                                 self.dilation)


def _convt_init(self, tup, in_channels, out_channels, kernel_size, stride, padding,
                output_padding, groups, bias, dilation, padding_mode, device, dtype):
    _ConvTransposeNd.__init__(self, in_channels, out_channels, tup(kernel_size), tup(stride),
                              tup(padding), tup(dilation), True, tup(output_padding), groups,
                              bias, padding_mode, device, dtype)


class ConvTranspose1d(_ConvTransposeNd):
    """1-d transposed convolution layer; weight (C_in, C_out / groups, K)."""

    _nd = 1

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1,
                 padding_mode: str = "zeros", device=None, dtype=None) -> None:
        _convt_init(self, _single, in_channels, out_channels, kernel_size, stride, padding,
                    output_padding, groups, bias, dilation, padding_mode, device, dtype)


class ConvTranspose2d(_ConvTransposeNd):
    """2-d transposed convolution layer; ``forward(input, output_size=None)``."""

    _nd = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1,
                 padding_mode: str = "zeros", device=None, dtype=None) -> None:
        _convt_init(self, _pair, in_channels, out_channels, kernel_size, stride, padding,
                    output_padding, groups, bias, dilation, padding_mode, device, dtype)


class ConvTranspose3d(_ConvTransposeNd):
    """3-d transposed convolution layer."""

    _nd = 3

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1,
                 padding_mode: str = "zeros", device=None, dtype=None) -> None:
        _convt_init(self, _triple, in_channels, out_channels, kernel_size, stride, padding,
                    output_padding, groups, bias, dilation, padding_mode, device, dtype)
