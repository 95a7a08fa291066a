"""Quantized modules (``torch.ao.nn.quantized``): INT8 weights and the scale and zero point
of their output; they take and give quantized tensors.

>>> import tessera
>>> q = Quantize(0.1, 0, tessera.quint8)(tessera.ones(1, 2))
>>> DeQuantize()(q).tolist()
[[1.0, 1.0]]
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D, nn
from tessera._tensor import Tensor
from tessera.nn.functional.activation import relu
from tessera.ops import quantized as Q
from tessera.ops.creation import tensor
from tessera.ops.shape import cat

__all__ = ["Quantize", "DeQuantize", "Linear", "Conv2d", "ReLU", "MaxPool2d",
           "AdaptiveAvgPool2d", "Flatten", "FloatFunctional", "QFunctional"]


def _const(t: Tensor) -> float:
    """The value of a one-element buffer, read without an op: quantization parameters are
    constants of inference, so a traced model (ONNX export, nn.Graph) keeps them as
    attributes rather than graph values."""
    return t._to_numpy().reshape(-1)[0].item()


def _qparams_of(observer) -> tuple[float, int]:
    s, z = observer.calculate_qparams()
    return float(s.reshape(-1)[0]), int(z.reshape(-1)[0])


def _quantize_weight(w: Tensor, observer) -> Q.QTensor:
    observer(w.detach())
    s, z = observer.calculate_qparams()
    if getattr(observer, "ch_axis", None) is not None and s.numel() > 1:
        return Q.quantize_per_channel(w.detach(), s.to(D.float64), z,
                                            observer.ch_axis, D.qint8)
    return Q.quantize_per_tensor(w.detach(), float(s.reshape(-1)[0]),
                                       int(z.reshape(-1)[0]), D.qint8)


class Quantize(nn.Module):
    """Float in, quantized out (what ``QuantStub`` becomes)."""

    def __init__(self, scale: float, zero_point: int, dtype=D.quint8):
        super().__init__()
        self.register_buffer("scale", tensor([float(scale)]))
        self.register_buffer("zero_point", tensor([int(zero_point)]))
        self.dtype = dtype

    def forward(self, x: Tensor) -> Q.QTensor:
        return Q.quantize_per_tensor(x, float(_const(self.scale)),
                                     int(_const(self.zero_point)), self.dtype)

    @classmethod
    def from_float(cls, mod):
        s, z = _qparams_of(mod.activation_post_process)
        return cls(s, z, mod.activation_post_process.dtype)


class DeQuantize(nn.Module):
    """Quantized in, float out (what ``DeQuantStub`` becomes)."""

    def forward(self, x):
        return Q.dequantize(x)

    @classmethod
    def from_float(cls, mod):
        return cls()


class _Weighted(nn.Module):
    """A quantized layer's state: INT8 weights (with their scales), a float bias, and the
    output's scale and zero point, all in ``state_dict``."""

    _RELU = False

    @classmethod
    def _build(cls, mod) -> _Weighted:
        raise NotImplementedError

    def _set(self, qweight: Q.QTensor, bias: Tensor | None, scale: float, zero_point: int):
        self.register_buffer("weight", qweight.int_repr())
        self.register_buffer("weight_scale", tensor(
            Q._w_scales(qweight)._to_numpy()))
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.register_buffer("scale", tensor([float(scale)]))
        self.register_buffer("zero_point", tensor([int(zero_point)]))

    def _qweight(self) -> Q.QTensor:
        weight, scale = self.weight, self.weight_scale
        v = weight._version[0]
        if self.__dict__.get("_packed_version", v) != v:
            # written in place (load_state_dict, copy_): its packed form is stale
            Q.forget_packed(weight._data)
        self.__dict__["_packed_version"] = v
        key = (v, id(weight._data), id(scale))
        hit = self.__dict__.get("_qw")
        if hit is not None and hit[0] == key:
            return hit[1]
        w = Tensor._make(weight._data, D.qint8, weight.device, tuple(weight.shape))
        # the float32 scales as they are (no cast node when traced)
        qw = Q.QTensor._wrap(w, scale, self._weight_zp(), 0)
        self.__dict__["_qw"] = (key, qw)
        return qw

    def _weight_zp(self) -> Tensor:
        return Tensor._from_numpy(np.zeros(self.weight.shape[0], np.int64))

    @classmethod
    def from_float(cls, mod):
        inner = mod[0] if isinstance(mod, nn.Sequential) else mod
        qconfig = mod.qconfig
        wobs = getattr(inner, "weight_fake_quant", None) or qconfig.weight()
        qw = _quantize_weight(inner.weight, wobs)
        s, z = _qparams_of(mod.activation_post_process)
        q = cls._build(inner)
        q._set(qw, inner.bias, s, z)
        q._RELU = isinstance(mod, nn.Sequential) or cls._RELU
        return q


class Linear(_Weighted):
    """``quantized::linear``."""

    @classmethod
    def _build(cls, mod):
        q = cls()
        q.in_features, q.out_features = mod.in_features, mod.out_features
        return q

    def forward(self, x):
        return Q.linear(x, self._qweight(), self.bias, _const(self.scale),
                        int(_const(self.zero_point)), relu=self._RELU)


class Conv2d(_Weighted):
    """``quantized::conv2d``."""

    @classmethod
    def _build(cls, mod):
        q = cls()
        q.stride, q.padding, q.dilation, q.groups = (mod.stride, mod.padding, mod.dilation,
                                                     mod.groups)
        return q

    def forward(self, x):
        return Q.conv2d(x, self._qweight(), self.bias, self.stride, self.padding,
                        self.dilation, self.groups, _const(self.scale),
                        int(_const(self.zero_point)), relu=self._RELU)


class ReLU(nn.Module):
    def forward(self, x):
        return Q.relu(x)


class MaxPool2d(nn.Module):
    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        return Q.max_pool2d(x, self.kernel_size, self.stride, self.padding)


class AdaptiveAvgPool2d(nn.Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return Q.adaptive_avg_pool2d(x, self.output_size)


class Flatten(nn.Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        flat = x.int_repr().flatten(self.start_dim, self.end_dim)
        t = Tensor._make(flat._data, x.dtype, x.device, tuple(flat.shape))
        return Q.QTensor._wrap(t, x._qscale, x._qzp)


class FloatFunctional(nn.Module):
    """Float ``add``/``cat`` whose output an observer watches (becomes ``QFunctional``)."""

    def __init__(self):
        super().__init__()
        self.activation_post_process = nn.Identity()

    def add(self, a, b):
        return self.activation_post_process(a + b)

    def add_relu(self, a, b):
        return self.activation_post_process(relu(a + b))

    def cat(self, xs, dim: int = 0):
        return self.activation_post_process(cat(xs, dim))


class QFunctional(nn.Module):
    """``add``/``cat`` of quantized tensors in the observed scale and zero point."""

    def __init__(self, scale: float = 1.0, zero_point: int = 0):
        super().__init__()
        self.scale, self.zero_point = scale, zero_point

    def add(self, a, b):
        return Q.add(a, b, self.scale, self.zero_point)

    def add_relu(self, a, b):
        return Q.add(a, b, self.scale, self.zero_point, relu=True)

    def cat(self, xs, dim: int = 0):
        return Q.cat(xs, dim, self.scale, self.zero_point)

    @classmethod
    def from_float(cls, mod):
        return cls(*_qparams_of(mod.activation_post_process))
