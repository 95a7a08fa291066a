"""Pooling layers with PyTorch's constructor arguments, attributes and repr: MaxPool,
AvgPool, AdaptiveAvgPool, AdaptiveMaxPool, LPPool (1-d to 3-d) and MaxUnpool.

>>> import tessera.nn as nn
>>> nn.MaxPool2d(2)
MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tessera._tensor import Tensor
from tessera.nn.functional import pooling as FP
from tessera.nn.modules.conv import _pair, _single, _triple
from tessera.nn.modules.module import Module

__all__ = ["MaxPool1d", "MaxPool2d", "MaxPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d",
           "AvgPool1d", "AvgPool2d", "AvgPool3d", "LPPool1d", "LPPool2d", "LPPool3d",
           "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "AdaptiveAvgPool1d",
           "AdaptiveAvgPool2d", "AdaptiveAvgPool3d"]


class _MaxPoolNd(Module):
    _fn: Callable[..., Any] = None  # type: ignore[assignment]  # set by each subclass

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if (stride is not None) else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode

    def extra_repr(self) -> str:
        return ("kernel_size={kernel_size}, stride={stride}, padding={padding}"
                ", dilation={dilation}, ceil_mode={ceil_mode}".format(**self.__dict__))

    def forward(self, input: Tensor):
        return type(self)._fn(input, self.kernel_size, self.stride, self.padding, self.dilation,
                              ceil_mode=self.ceil_mode, return_indices=self.return_indices)


class MaxPool1d(_MaxPoolNd):
    """Max over sliding windows of (N, C, L); ``return_indices`` also gives the argmax."""

    _fn = staticmethod(FP.max_pool1d)


class MaxPool2d(_MaxPoolNd):
    """Max over sliding windows of (N, C, H, W)."""

    _fn = staticmethod(FP.max_pool2d)


class MaxPool3d(_MaxPoolNd):
    """Max over sliding windows of (N, C, D, H, W)."""

    _fn = staticmethod(FP.max_pool3d)


class _MaxUnpoolNd(Module):
    _fn: Callable[..., Any] = None  # type: ignore[assignment]  # set by each subclass
    _tup: Callable[[Any], tuple] = None  # type: ignore[assignment]  # set by each subclass

    def __init__(self, kernel_size, stride=None, padding=0) -> None:
        super().__init__()
        tup = type(self)._tup
        self.kernel_size = tup(kernel_size)
        self.stride = tup(stride if (stride is not None) else kernel_size)
        self.padding = tup(padding)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"

    def forward(self, input: Tensor, indices: Tensor, output_size=None) -> Tensor:
        return type(self)._fn(input, indices, self.kernel_size, self.stride, self.padding,
                              output_size)


class MaxUnpool1d(_MaxUnpoolNd):
    """Partial inverse of MaxPool1d: values at their indices, zeros elsewhere."""

    _fn = staticmethod(FP.max_unpool1d)
    _tup = staticmethod(_single)


class MaxUnpool2d(_MaxUnpoolNd):
    """Partial inverse of MaxPool2d."""

    _fn = staticmethod(FP.max_unpool2d)
    _tup = staticmethod(_pair)


class MaxUnpool3d(_MaxUnpoolNd):
    """Partial inverse of MaxPool3d."""

    _fn = staticmethod(FP.max_unpool3d)
    _tup = staticmethod(_triple)


class _AvgPoolNd(Module):
    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool1d(_AvgPoolNd):
    """Average over sliding windows of (N, C, L)."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True) -> None:
        super().__init__()
        self.kernel_size = _single(kernel_size)
        self.stride = _single(stride if stride is not None else kernel_size)
        self.padding = _single(padding)
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad

    def forward(self, input: Tensor) -> Tensor:
        return FP.avg_pool1d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                             self.count_include_pad)


class _AvgPool23(_AvgPoolNd):
    _fn: Callable[..., Any] = None  # type: ignore[assignment]  # set by each subclass

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override=None) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if (stride is not None) else kernel_size
        self.padding = padding
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input: Tensor) -> Tensor:
        return type(self)._fn(input, self.kernel_size, self.stride, self.padding,
                              self.ceil_mode, self.count_include_pad, self.divisor_override)


class AvgPool2d(_AvgPool23):
    """Average over sliding windows of (N, C, H, W)."""

    _fn = staticmethod(FP.avg_pool2d)


class AvgPool3d(_AvgPool23):
    """Average over sliding windows of (N, C, D, H, W)."""

    _fn = staticmethod(FP.avg_pool3d)

    def __setstate__(self, d) -> None:
        super().__setstate__(d)
        self.__dict__.setdefault("padding", 0)
        self.__dict__.setdefault("ceil_mode", False)
        self.__dict__.setdefault("count_include_pad", True)


class _LPPoolNd(Module):
    _fn: Callable[..., Any] = None  # type: ignore[assignment]  # set by each subclass

    def __init__(self, norm_type: float, kernel_size, stride=None,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        self.norm_type = norm_type
        self.kernel_size = kernel_size
        self.stride = stride
        self.ceil_mode = ceil_mode

    def extra_repr(self) -> str:
        return ("norm_type={norm_type}, kernel_size={kernel_size}, stride={stride}, "
                "ceil_mode={ceil_mode}".format(**self.__dict__))

    def forward(self, input: Tensor) -> Tensor:
        return type(self)._fn(input, float(self.norm_type), self.kernel_size, self.stride,
                              self.ceil_mode)


class LPPool1d(_LPPoolNd):
    """Power-average pooling over (N, C, L)."""

    _fn = staticmethod(FP.lp_pool1d)


class LPPool2d(_LPPoolNd):
    """Power-average pooling over (N, C, H, W)."""

    _fn = staticmethod(FP.lp_pool2d)


class LPPool3d(_LPPoolNd):
    """Power-average pooling over (N, C, D, H, W)."""

    _fn = staticmethod(FP.lp_pool3d)


class _AdaptiveMaxPoolNd(Module):
    _fn: Callable[..., Any] = None  # type: ignore[assignment]  # set by each subclass

    def __init__(self, output_size, return_indices: bool = False) -> None:
        super().__init__()
        self.output_size = output_size
        self.return_indices = return_indices

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"

    def forward(self, input: Tensor):
        return type(self)._fn(input, self.output_size, self.return_indices)


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    """Max pooling to a fixed output length."""

    _fn = staticmethod(FP.adaptive_max_pool1d)


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    """Max pooling to a fixed (H, W)."""

    _fn = staticmethod(FP.adaptive_max_pool2d)


class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    """Max pooling to a fixed (D, H, W)."""

    _fn = staticmethod(FP.adaptive_max_pool3d)


class _AdaptiveAvgPoolNd(Module):
    _fn: Callable[..., Any] = None  # type: ignore[assignment]  # set by each subclass

    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = output_size

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"

    def forward(self, input: Tensor) -> Tensor:
        return type(self)._fn(input, self.output_size)


class AdaptiveAvgPool1d(_AdaptiveAvgPoolNd):
    """Average pooling to a fixed output length."""

    _fn = staticmethod(FP.adaptive_avg_pool1d)


class AdaptiveAvgPool2d(_AdaptiveAvgPoolNd):
    """Average pooling to a fixed (H, W) (``AdaptiveAvgPool2d(1)``: global average pool)."""

    _fn = staticmethod(FP.adaptive_avg_pool2d)


class AdaptiveAvgPool3d(_AdaptiveAvgPoolNd):
    """Average pooling to a fixed (D, H, W)."""

    _fn = staticmethod(FP.adaptive_avg_pool3d)
