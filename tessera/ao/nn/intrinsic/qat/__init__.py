"""Fused modules for quantization-aware training (``torch.ao.nn.intrinsic.qat``): a
convolution and its batch norm (and ReLU) trained with the batch norm folded into the
fake-quantized weights, as they will be after ``convert``.

The forward is PyTorch's approximation: the weights are scaled by
``gamma / sqrt(running_var + eps)`` and fake-quantized, the convolution's output is divided
by that scale again and goes through the batch norm, which in training uses (and updates)
the batch statistics. ``freeze_bn_stats`` puts the batch norm in eval mode for the rest of
training (PyTorch's ``freeze_bn``); ``convert`` folds it into the INT8 convolution.

>>> import tessera
>>> from tessera import nn
>>> from tessera.ao import quantization as tq
>>> m = tq.fuse_modules_qat(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)).train(),
...                         [["0", "1"]])
>>> m.qconfig = tq.get_default_qat_qconfig("x86")
>>> q = tq.prepare_qat(m); type(q[0]).__name__, q[0](tessera.randn(2, 1, 5, 5)).shape
('ConvBn2d', tessera.Size([2, 2, 3, 3]))
"""
from __future__ import annotations

from tessera import nn
from tessera.ao.nn import intrinsic as nni, qat as nnqat
from tessera.autograd import no_grad
from tessera.nn import functional as F
from tessera.ops.creation import zeros

__all__ = ["ConvBn2d", "ConvBnReLU2d", "freeze_bn_stats", "update_bn_stats"]


class ConvBn2d(nnqat.Conv2d):
    """A convolution and its batch norm, trained with fake-quantized folded weights."""

    _FLOAT_MODULE: type[nn.Sequential] = nni.ConvBn2d
    _RELU = False

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=None, padding_mode="zeros", eps=1e-05,
                 momentum=0.1, freeze_bn=False, qconfig=None):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride,
                         padding=padding, dilation=dilation, groups=groups, bias=bool(bias),
                         padding_mode=padding_mode, qconfig=qconfig)
        self.bn = nn.BatchNorm2d(out_channels, eps, momentum, True, True)
        self.freeze_bn = freeze_bn if self.training else True
        if self.freeze_bn:
            self.freeze_bn_stats()
        else:
            self.update_bn_stats()

    def train(self, mode: bool = True):
        """Train mode leaves a frozen batch norm in eval mode (PyTorch's rule)."""
        self.training = mode
        if not self.freeze_bn:
            for m in self.children():
                m.train(mode)
        return self

    def freeze_bn_stats(self):
        self.freeze_bn = True
        self.bn.training = False
        return self

    def update_bn_stats(self):
        self.freeze_bn = False
        self.bn.training = True
        return self

    def _scale(self):
        return self.bn.weight / (self.bn.running_var + self.bn.eps).sqrt()

    def forward(self, x):
        s = self._scale()
        w = self.weight_fake_quant(self.weight * s.reshape(-1, 1, 1, 1))
        y = self._conv_forward(x, w, zeros(self.out_channels, dtype=x.dtype))
        y = y / s.reshape(1, -1, 1, 1)
        if self.bias is not None:
            y = y + self.bias.reshape(1, -1, 1, 1)
        y = self.bn(y)
        return F.relu(y) if self._RELU else y

    def folded(self) -> nn.Conv2d:
        """The float convolution with the batch norm's running statistics folded in."""
        conv = nn.Conv2d(self.in_channels, self.out_channels, self.kernel_size,
                         stride=self.stride, padding=self.padding, dilation=self.dilation,
                         groups=self.groups, bias=True, padding_mode=self.padding_mode)
        with no_grad():
            s = self._scale()
            conv.weight = nn.Parameter(self.weight * s.reshape(-1, 1, 1, 1))
            b = self.bias if self.bias is not None else zeros(self.out_channels)
            conv.bias = nn.Parameter((b - self.bn.running_mean) * s + self.bn.bias)
        return conv

    @classmethod
    def from_float(cls, mod):
        conv, bn = mod[0], mod[1]
        q = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                bias=conv.bias is not None, padding_mode=conv.padding_mode, eps=bn.eps,
                momentum=bn.momentum, freeze_bn=False, qconfig=mod.qconfig)
        q.weight, q.bias = conv.weight, conv.bias
        q.bn.weight, q.bn.bias = bn.weight, bn.bias
        q.bn.running_mean, q.bn.running_var = bn.running_mean, bn.running_var
        q.bn.num_batches_tracked = bn.num_batches_tracked
        q.train(mod.training)
        return q


class ConvBnReLU2d(ConvBn2d):
    """``ConvBn2d`` then ReLU."""

    _FLOAT_MODULE = nni.ConvBnReLU2d
    _RELU = True


def freeze_bn_stats(mod: nn.Module) -> None:
    """Batch norm statistics frozen from now on (``model.apply(freeze_bn_stats)``)."""
    if isinstance(mod, ConvBn2d):
        mod.freeze_bn_stats()


def update_bn_stats(mod: nn.Module) -> None:
    """Batch norm statistics updated by training again (``model.apply(update_bn_stats)``)."""
    if isinstance(mod, ConvBn2d):
        mod.update_bn_stats()
