"""Fused modules (``torch.ao.nn.intrinsic``): a layer and the ReLU after it, as one module
that quantization treats as one op.

>>> from tessera import nn
>>> ConvReLU2d(nn.Conv2d(1, 2, 3), nn.ReLU())[0].out_channels
2
"""
from __future__ import annotations

from tessera import nn

__all__ = ["ConvReLU2d", "LinearReLU", "ConvBn2d", "ConvBnReLU2d"]


class ConvReLU2d(nn.Sequential):
    """``Conv2d`` then ``ReLU``."""


class LinearReLU(nn.Sequential):
    """``Linear`` then ``ReLU``."""


class ConvBn2d(nn.Sequential):
    """``Conv2d`` then ``BatchNorm2d``, fused for quantization-aware training (the batch
    norm stays until ``convert`` folds it)."""


class ConvBnReLU2d(nn.Sequential):
    """``Conv2d``, ``BatchNorm2d`` then ``ReLU``, fused for quantization-aware training."""
