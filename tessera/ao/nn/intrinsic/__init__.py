"""Fused modules (``torch.ao.nn.intrinsic``): a layer and the ReLU after it, as one module
that quantization treats as one op.

>>> from tessera import nn
>>> ConvReLU2d(nn.Conv2d(1, 2, 3), nn.ReLU())[0].out_channels
2
"""
from __future__ import annotations

from tessera import nn

__all__ = ["ConvReLU2d", "LinearReLU"]


class ConvReLU2d(nn.Sequential):
    """``Conv2d`` then ``ReLU``."""


class LinearReLU(nn.Sequential):
    """``Linear`` then ``ReLU``."""
