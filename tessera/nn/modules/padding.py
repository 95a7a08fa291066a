"""Padding layers: Zero/Constant/Reflection/Replication/Circular pads for 1-d to 3-d, with
PyTorch's padding tuples (last dim first) and repr.

>>> import tessera.nn as nn
>>> nn.ReflectionPad2d((1, 1, 2, 0))
ReflectionPad2d((1, 1, 2, 0))
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tessera._tensor import Tensor
from tessera.nn.functional.vision import pad as _pad
from tessera.nn.modules.conv import _ntuple, _pair
from tessera.nn.modules.module import Module

__all__ = ["ZeroPad1d", "ZeroPad2d", "ZeroPad3d", "ConstantPad1d", "ConstantPad2d",
           "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d",
           "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "CircularPad1d",
           "CircularPad2d", "CircularPad3d"]

_quadruple, _sextuple = _ntuple(4), _ntuple(6)


class _CircularPadNd(Module):
    _dims = 1
    _tup: Callable[[Any], tuple] = None  # type: ignore[assignment]  # set by each subclass

    def __init__(self, padding) -> None:
        super().__init__()
        self.padding = type(self)._tup(padding)

    def _check_input_dim(self, input) -> None:
        d = type(self)._dims
        if input.dim() not in (d + 1, d + 2):
            raise ValueError(f"expected {d + 1}D or {d + 2}D input (got {input.dim()}D input)")

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        return _pad(input, self.padding, "circular")

    def extra_repr(self) -> str:
        return f"{self.padding}"


class CircularPad1d(_CircularPadNd):
    """Wrap-around padding of the last dim: (left, right)."""

    _dims, _tup = 1, staticmethod(_pair)


class CircularPad2d(_CircularPadNd):
    """Wrap-around padding of the last two dims: (left, right, top, bottom)."""

    _dims, _tup = 2, staticmethod(_quadruple)


class CircularPad3d(_CircularPadNd):
    """Wrap-around padding of the last three dims."""

    _dims, _tup = 3, staticmethod(_sextuple)


class _ConstantPadNd(Module):
    _tup: Callable[[Any], tuple] = None  # type: ignore[assignment]  # set by each subclass

    def __init__(self, padding, value: float) -> None:
        super().__init__()
        self.value = value
        self.padding = type(self)._tup(padding)

    def forward(self, input: Tensor) -> Tensor:
        return _pad(input, self.padding, "constant", self.value)

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPadNd):
    """Pad the last dim with a constant ``value``."""

    _tup = staticmethod(_pair)


class ConstantPad2d(_ConstantPadNd):
    """Pad the last two dims with a constant ``value``."""

    _tup = staticmethod(_quadruple)


class ConstantPad3d(_ConstantPadNd):
    """Pad the last three dims with a constant ``value``."""

    _tup = staticmethod(_sextuple)


class ZeroPad1d(ConstantPad1d):
    """Pad the last dim with zeros."""

    def __init__(self, padding) -> None:
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ZeroPad2d(ConstantPad2d):
    """Pad the last two dims with zeros: (left, right, top, bottom)."""

    def __init__(self, padding) -> None:
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ZeroPad3d(ConstantPad3d):
    """Pad the last three dims with zeros."""

    def __init__(self, padding) -> None:
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _ModePadNd(Module):
    _tup: Callable[[Any], tuple] = None  # type: ignore[assignment]  # set by each subclass
    _mode = ""

    def __init__(self, padding) -> None:
        super().__init__()
        self.padding = type(self)._tup(padding)

    def forward(self, input: Tensor) -> Tensor:
        return _pad(input, self.padding, type(self)._mode)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ReflectionPad1d(_ModePadNd):
    """Mirror padding (without repeating the edge) of the last dim."""

    _tup, _mode = staticmethod(_pair), "reflect"


class ReflectionPad2d(_ModePadNd):
    """Mirror padding of the last two dims."""

    _tup, _mode = staticmethod(_quadruple), "reflect"


class ReflectionPad3d(_ModePadNd):
    """Mirror padding of the last three dims."""

    _tup, _mode = staticmethod(_sextuple), "reflect"


class ReplicationPad1d(_ModePadNd):
    """Edge-repeating padding of the last dim."""

    _tup, _mode = staticmethod(_pair), "replicate"


class ReplicationPad2d(_ModePadNd):
    """Edge-repeating padding of the last two dims."""

    _tup, _mode = staticmethod(_quadruple), "replicate"


class ReplicationPad3d(_ModePadNd):
    """Edge-repeating padding of the last three dims."""

    _tup, _mode = staticmethod(_sextuple), "replicate"
