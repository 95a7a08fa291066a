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
           "HistogramObserver",
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
        if qscheme is Q.per_tensor_symmetric and reduce_range and dtype is D.quint8:
            raise NotImplementedError("Cannot reduce range for symmetric quantization for "
                                      "quint8")
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


def _histc(x: np.ndarray, bins: int, lo, hi) -> np.ndarray:
    """``torch.histc`` in float32: values outside [lo, hi] are dropped, the maximum falls
    in the last bin, and an empty range widens to [lo - 1, hi + 1]."""
    lo, hi = np.float32(lo), np.float32(hi)
    if lo == hi:
        lo, hi = lo - np.float32(1), hi + np.float32(1)
    x = x[(x >= lo) & (x <= hi)]
    pos = ((x - lo) * np.float32(bins) / (hi - lo)).astype(np.int64)
    pos[pos == bins] = bins - 1
    return np.bincount(pos, minlength=bins).astype(np.float32)


def _linspace(lo, hi, n: int) -> np.ndarray:
    """``torch.linspace`` in float32 (each half stepped from its own end)."""
    lo, hi = np.float32(lo), np.float32(hi)
    step = (hi - lo) / np.float32(n - 1)
    i = np.arange(n)
    half = n // 2
    return np.where(i < half, lo + step * i.astype(np.float32),
                    hi - step * (n - 1 - i).astype(np.float32)).astype(np.float32)


class HistogramObserver(ObserverBase):
    """A running histogram of the values seen (``bins`` bins over the running range); the
    range quantized is the one of least L2 quantization error, found by PyTorch's search
    (caffe2's norm minimization): shrink the range from the side holding less mass, one
    ``1e-5`` quantile at a time, while the error falls.

    >>> import tessera
    >>> obs = HistogramObserver(bins=64)
    >>> _ = obs(tessera.cat([tessera.linspace(-1, 1, 1000), tessera.tensor([40.0])]))
    >>> obs.histogram.sum().item(), obs.max_val.item(), obs.calculate_qparams()[1].tolist()
    (1001.0, 40.0, [6])
    """

    def __init__(self, bins: int = 2048, dtype=D.quint8, qscheme=Q.per_tensor_affine,
                 reduce_range: bool = False, quant_min=None, quant_max=None, eps=_EPS,
                 **kwargs):
        if qscheme not in (Q.per_tensor_affine, Q.per_tensor_symmetric):
            raise NotImplementedError("HistogramObserver's qscheme only support "
                                      "torch.per_tensor_symmetric and "
                                      "torch.per_tensor_affine.")
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps)
        self.bins = bins
        self.histogram: Tensor
        self.min_val: Tensor
        self.max_val: Tensor
        self.register_buffer("histogram", Tensor._from_numpy(np.zeros(bins, np.float32)))
        self.register_buffer("min_val", tensor(float("inf")))
        self.register_buffer("max_val", tensor(float("-inf")))
        self.dst_nbins = 2 ** (8 * dtype.itemsize)
        self.upsample_rate = 16  # spreads an old bin over the new ones it overlaps

    def forward(self, x: Tensor) -> Tensor:
        a = x.detach()._to_numpy().astype(np.float32, copy=False).reshape(-1)
        if np.isinf(a).any():
            a = a[~np.isinf(a)]  # infinite values would be clamped anyway
        if a.size == 0:
            return x
        lo, hi = a.min(), a.max()
        old_lo, old_hi = np.float32(float(self.min_val)), np.float32(float(self.max_val))
        hist = self.histogram._to_numpy()
        if old_lo == np.inf or old_hi == -np.inf:
            new_lo, new_hi, hist = lo, hi, _histc(a, self.bins, lo, hi)
        else:
            new_lo, new_hi = min(old_lo, lo), max(old_hi, hi)
            update = _histc(a, self.bins, new_lo, new_hi)
            hist = update + self._rebin(hist, old_lo, old_hi, new_lo, new_hi)
        self.histogram = Tensor._from_numpy(hist.astype(np.float32))
        self.min_val, self.max_val = tensor(float(new_lo)), tensor(float(new_hi))
        return x

    def _rebin(self, hist, lo, hi, new_lo, new_hi) -> np.ndarray:
        """The histogram over [lo, hi] redistributed over the bins of [new_lo, new_hi]."""
        if lo == new_lo and hi == new_hi:
            return hist
        if lo == hi:
            return _histc(np.array([lo], np.float32), self.bins, new_lo, new_hi) * hist.sum()
        n = self.bins * self.upsample_rate
        up = np.repeat(hist, self.upsample_rate) / np.float32(self.upsample_rate)
        mids = _linspace(lo, hi, n + 1)[:-1] + np.float32(0.5) * ((hi - lo) / np.float32(n))
        edges = _linspace(new_lo, new_hi, self.bins + 1)
        idx = np.clip(np.searchsorted(edges, mids, side="right") - 1, 0, self.bins - 1)
        return np.bincount(idx, weights=up, minlength=self.bins).astype(np.float32)

    def _error(self, hist, width: float, start: int, end: int) -> float:
        """The L2 error of quantizing the histogram's mass to ``dst_nbins`` levels over
        bins ``start..end`` (mass spread uniformly in each bin)."""
        f = np.float32
        dst = width * (end - start + 1) / self.dst_nbins
        if dst == 0.0:
            return 0.0
        w, d = f(width), f(dst)
        begin = (np.arange(self.bins) - start).astype(f) * w
        stop = begin + w
        first = np.clip(np.floor(begin / d), 0, self.dst_nbins - 1)
        last = np.clip(np.floor(stop / d), 0, self.dst_nbins - 1)
        density = hist / w

        def norm(a, b):
            return density * ((b * b * b - a * a * a) / f(3))
        err = norm(begin - (first + f(0.5)) * d, np.full(self.bins, d / f(2), f))
        err = err + (last - first - f(1)) * norm(-d / f(2), d / f(2))
        err = err + norm(-d / f(2), stop - (last * d + d / f(2)))
        return float(err.sum(dtype=f))

    def _search(self) -> tuple[float, float]:
        hist = self.histogram._to_numpy()
        lo, hi = np.float32(float(self.min_val)), np.float32(float(self.max_val))
        width = (hi - lo) / np.float32(self.bins)
        total = float(hist.sum(dtype=np.float32))
        csum = np.cumsum(hist, dtype=np.float32)
        step, alpha, beta = 1e-5, 0.0, 1.0
        start, end = 0, self.bins - 1
        best = float("inf")
        while alpha < beta:
            next_alpha, next_beta = alpha + step, beta - step
            left, right = start, end
            while left < end and csum[left] < np.float32(next_alpha * total):
                left += 1
            while right > start and csum[right] > np.float32(next_beta * total):
                right -= 1
            next_start, next_end = start, end
            if left - start > end - right:
                next_start, alpha = left, next_alpha
            else:
                next_end, beta = right, next_beta
            if (next_start, next_end) == (start, end):
                continue
            err = self._error(hist, (float(hi) - float(lo)) / self.bins, next_start, next_end)
            if err > best:
                break
            best, start, end = err, next_start, next_end
        return float(lo + width * np.float32(start)), float(lo + width * np.float32(end + 1))

    def calculate_qparams(self):
        if float(self.min_val) == float("inf") and float(self.max_val) == float("-inf"):
            return tensor([1.0]), tensor([0])
        lo, hi = self._search()
        s, z = self._qparams(np.array([lo], np.float32), np.array([hi], np.float32))
        return s, z


class PlaceholderObserver(ObserverBase):
    """Observes nothing: marks a dtype (dynamic quantization's float activations)."""

    def forward(self, x: Tensor) -> Tensor:
        return x


default_observer = MinMaxObserver.with_args(quant_min=0, quant_max=127)
default_weight_observer = MinMaxObserver.with_args(dtype=D.qint8,
                                                   qscheme=Q.per_tensor_symmetric)
default_per_channel_weight_observer = PerChannelMinMaxObserver.with_args(
    dtype=D.qint8, qscheme=Q.per_channel_symmetric)
