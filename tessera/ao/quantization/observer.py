"""Observers: modules that watch the values passing through and choose a scale and zero
point for them (PyTorch's ``torch.ao.quantization.observer``).

>>> import tessera
>>> obs = MinMaxObserver(dtype=tessera.quint8)
>>> _ = obs(tessera.tensor([-1.0, 3.0]))
>>> [round(float(v), 6) for v in obs.calculate_qparams()]
[0.015686, 64.0]
"""
from __future__ import annotations

import functools

import numpy as np

from tessera import _dtype as D, nn
from tessera._tensor import Tensor
from tessera.ops import quantized as Q
from tessera.ops.creation import tensor

__all__ = ["ObserverBase", "MinMaxObserver", "MovingAverageMinMaxObserver",
           "PerChannelMinMaxObserver", "MovingAveragePerChannelMinMaxObserver",
           "PlaceholderObserver", "default_observer", "default_weight_observer",
           "default_per_channel_weight_observer"]

_EPS = float(np.finfo(np.float32).eps)


class _PartialWithArgs:
    """``Observer.with_args(...)``: a factory with its keywords (``.p.keywords``)."""

    def __init__(self, cls, **kwargs):
        self.p = functools.partial(cls, **kwargs)

    def __call__(self, **more):
        return self.p(**more)

    def with_args(self, **kwargs):
        return _PartialWithArgs(self.p.func, **{**self.p.keywords, **kwargs})


class ObserverBase(nn.Module):
    """Records statistics of the values it sees; ``calculate_qparams()`` gives (scale,
    zero_point) tensors."""

    def __init__(self, dtype=D.quint8, qscheme=Q.per_tensor_affine,
                 reduce_range: bool = False, quant_min: int | None = None,
                 quant_max: int | None = None, eps: float = _EPS, **kwargs):
        super().__init__()
        self.dtype, self.qscheme, self.reduce_range, self.eps = dtype, qscheme, reduce_range, eps
        self.quant_min, self.quant_max = self._range(dtype, reduce_range, quant_min, quant_max)

    @staticmethod
    def _range(dtype, reduce_range, qmin, qmax) -> tuple[int, int]:
        if qmin is not None and qmax is not None:  # a custom range, halved as PyTorch's
            return (int(qmin) // 2, int(qmax) // 2) if reduce_range else (int(qmin), int(qmax))
        if dtype is D.qint8:
            return (-64, 63) if reduce_range else (-128, 127)
        if dtype is D.quint8:
            return (0, 127) if reduce_range else (0, 255)
        if dtype is D.qint32:
            return -(1 << 31), (1 << 31) - 1
        raise ValueError(f"observer: unsupported dtype {dtype}")

    @classmethod
    def with_args(cls, **kwargs):
        return _PartialWithArgs(cls, **kwargs)

    def _symmetric(self) -> bool:
        return self.qscheme in (Q.per_tensor_symmetric, Q.per_channel_symmetric)

    def _qparams(self, lo: np.ndarray, hi: np.ndarray) -> tuple[Tensor, Tensor]:
        """PyTorch's ``_calculate_qparams`` in float32."""
        lo = np.minimum(lo.astype(np.float32), 0)
        hi = np.maximum(hi.astype(np.float32), 0)
        qmin, qmax = self.quant_min, self.quant_max
        if self._symmetric():
            amax = np.maximum(-lo, hi)
            scale = amax / np.float32((qmax - qmin) / 2)
            scale = np.maximum(scale, np.float32(self.eps))
            zp = np.full(scale.shape, 128 if self.dtype is D.quint8 else 0, np.int64)
        else:
            scale = (hi - lo) / np.float32(qmax - qmin)
            scale = np.maximum(scale, np.float32(self.eps))
            zp = np.clip(qmin - np.rint(lo / scale).astype(np.int64), qmin, qmax)
        return (Tensor._from_numpy(np.asarray(scale, np.float32)),
                Tensor._from_numpy(np.asarray(zp, np.int64)))


class MinMaxObserver(ObserverBase):
    """The running minimum and maximum of everything seen."""

    def __init__(self, dtype=D.quint8, qscheme=Q.per_tensor_affine,
                 reduce_range: bool = False, quant_min=None, quant_max=None, eps=_EPS,
                 **kwargs):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps)
        self.min_val: Tensor
        self.max_val: Tensor
        self.register_buffer("min_val", tensor(float("inf")))
        self.register_buffer("max_val", tensor(float("-inf")))

    def _update(self, lo: float, hi: float) -> None:
        self.min_val = tensor(min(lo, float(self.min_val)))
        self.max_val = tensor(max(hi, float(self.max_val)))

    def forward(self, x: Tensor) -> Tensor:
        a = x.detach()._to_numpy()
        if a.size:
            self._update(float(a.min()), float(a.max()))
        return x

    def calculate_qparams(self):
        s, z = self._qparams(np.array(float(self.min_val)), np.array(float(self.max_val)))
        return s, z


class MovingAverageMinMaxObserver(MinMaxObserver):
    """An exponential moving average of each batch's minimum and maximum."""

    def __init__(self, averaging_constant: float = 0.01, dtype=D.quint8,
                 qscheme=Q.per_tensor_affine, reduce_range: bool = False, quant_min=None,
                 quant_max=None, eps=_EPS, **kwargs):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps)
        self.averaging_constant = averaging_constant

    def _update(self, lo: float, hi: float) -> None:
        c = np.float32(self.averaging_constant)
        old_lo, old_hi = float(self.min_val), float(self.max_val)
        if old_lo == float("inf"):
            new_lo, new_hi = lo, hi
        else:
            new_lo = float(np.float32(old_lo) + c * (np.float32(lo) - np.float32(old_lo)))
            new_hi = float(np.float32(old_hi) + c * (np.float32(hi) - np.float32(old_hi)))
        self.min_val, self.max_val = tensor(new_lo), tensor(new_hi)


class PerChannelMinMaxObserver(ObserverBase):
    """The minimum and maximum of each slice along ``ch_axis``."""

    def __init__(self, ch_axis: int = 0, dtype=D.quint8,
                 qscheme=Q.per_channel_affine, reduce_range: bool = False, quant_min=None,
                 quant_max=None, eps=_EPS, **kwargs):
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps)
        self.ch_axis = ch_axis
        self.min_val: Tensor
        self.max_val: Tensor
        self.register_buffer("min_val", tensor([]))
        self.register_buffer("max_val", tensor([]))

    def _combine(self, old, new, pick):
        return new if old.size == 0 else pick(old, new)

    def forward(self, x: Tensor) -> Tensor:
        a = np.moveaxis(x.detach()._to_numpy(), self.ch_axis, 0).reshape(x.shape[self.ch_axis], -1)
        lo, hi = a.min(1), a.max(1)
        self.min_val = Tensor._from_numpy(
            self._combine(self.min_val._to_numpy(), lo, np.minimum).astype(np.float32))
        self.max_val = Tensor._from_numpy(
            self._combine(self.max_val._to_numpy(), hi, np.maximum).astype(np.float32))
        return x

    def calculate_qparams(self):
        return self._qparams(self.min_val._to_numpy(), self.max_val._to_numpy())


class MovingAveragePerChannelMinMaxObserver(PerChannelMinMaxObserver):
    """Per-channel minimum and maximum, as exponential moving averages."""

    def __init__(self, averaging_constant: float = 0.01, ch_axis: int = 0,
                 dtype=D.quint8, qscheme=Q.per_channel_affine,
                 reduce_range: bool = False, quant_min=None, quant_max=None, eps=_EPS,
                 **kwargs):
        super().__init__(ch_axis, dtype, qscheme, reduce_range, quant_min, quant_max, eps)
        self.averaging_constant = averaging_constant

    def _combine(self, old, new, pick):
        if old.size == 0:
            return new
        c = np.float32(self.averaging_constant)
        return old + c * (new.astype(np.float32) - old)


class PlaceholderObserver(ObserverBase):
    """Observes nothing: marks a dtype (dynamic quantization's float activations)."""

    def forward(self, x: Tensor) -> Tensor:
        return x


default_observer = MinMaxObserver.with_args(quant_min=0, quant_max=127)
default_weight_observer = MinMaxObserver.with_args(dtype=D.qint8,
                                                   qscheme=Q.per_tensor_symmetric)
default_per_channel_weight_observer = PerChannelMinMaxObserver.with_args(
    dtype=D.qint8, qscheme=Q.per_channel_symmetric)
