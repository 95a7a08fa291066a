"""Quantization-aware training modules (``torch.ao.nn.qat``): the float layer with its
weights (and, through ``activation_post_process``, its output) fake-quantized.

>>> import tessera
>>> from tessera.ao import quantization as tq
>>> m = Linear.from_float(_with(tessera.nn.Linear(2, 3), tq.get_default_qat_qconfig()))
>>> m(tessera.ones(1, 2)).shape
tessera.Size([1, 3])
"""
from __future__ import annotations

from tessera import nn
from tessera.nn import functional as F

__all__ = ["Linear", "Conv2d"]


def _with(mod, qconfig):
    mod.qconfig = qconfig
    return mod


class Linear(nn.Linear):
    """``nn.Linear`` with fake-quantized weights."""

    _FLOAT = nn.Linear

    def __init__(self, in_features, out_features, bias=True, qconfig=None):
        super().__init__(in_features, out_features, bias)
        self.qconfig = qconfig
        self.weight_fake_quant = qconfig.weight()

    def forward(self, x):
        return F.linear(x, self.weight_fake_quant(self.weight), self.bias)

    @classmethod
    def from_float(cls, mod):
        q = cls(mod.in_features, mod.out_features, mod.bias is not None, qconfig=mod.qconfig)
        q.weight, q.bias = mod.weight, mod.bias
        return q


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` with fake-quantized weights."""

    _FLOAT = nn.Conv2d

    def __init__(self, *args, qconfig=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.qconfig = qconfig
        self.weight_fake_quant = qconfig.weight()

    def forward(self, x):
        return self._conv_forward(x, self.weight_fake_quant(self.weight), self.bias)

    @classmethod
    def from_float(cls, mod):
        q = cls(mod.in_channels, mod.out_channels, mod.kernel_size, stride=mod.stride,
                padding=mod.padding, dilation=mod.dilation, groups=mod.groups,
                bias=mod.bias is not None, qconfig=mod.qconfig)
        q.weight, q.bias = mod.weight, mod.bias
        return q
