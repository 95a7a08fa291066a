"""``FakeQuantize``: an observer and fake quantization in one module, for quantization-aware
training (PyTorch's ``torch.ao.quantization.fake_quantize``).

>>> import tessera
>>> fq = default_fake_quant()
>>> fq(tessera.tensor([0.0, 1.0])).tolist()
[0.0, 1.0]
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D, nn
from tessera._tensor import Tensor
from tessera.ao.quantization.observer import (
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    _PartialWithArgs,
)
from tessera.graph.trace import is_tracing
from tessera.ops import quantized as Q
from tessera.ops.creation import tensor

__all__ = ["FakeQuantize", "FusedMovingAvgObsFakeQuantize", "choose_qparams",
           "default_fake_quant", "default_weight_fake_quant", "default_fused_act_fake_quant",
           "default_fused_wt_fake_quant", "default_fused_per_channel_wt_fake_quant",
           "disable_observer", "enable_observer", "disable_fake_quant", "enable_fake_quant",
           "default_per_channel_weight_fake_quant"]


class FakeQuantize(nn.Module):
    """Observe (while ``observer_enabled``), then fake-quantize with the observer's current
    scale and zero point (while ``fake_quant_enabled``)."""

    def __init__(self, observer=MovingAverageMinMaxObserver, quant_min=None, quant_max=None,
                 **observer_kwargs):
        super().__init__()
        if quant_min is not None:
            observer_kwargs.update(quant_min=quant_min, quant_max=quant_max)
        self.activation_post_process = observer(**observer_kwargs)
        obs = self.activation_post_process
        self.quant_min, self.quant_max = obs.quant_min, obs.quant_max
        self.dtype, self.qscheme = obs.dtype, obs.qscheme
        self.ch_axis = getattr(obs, "ch_axis", -1)
        self.register_buffer("fake_quant_enabled", tensor([1], dtype=D.uint8))
        self.register_buffer("observer_enabled", tensor([1], dtype=D.uint8))
        self.register_buffer("scale", tensor([1.0]))
        self.register_buffer("zero_point", tensor([0], dtype=D.int32))

    @classmethod
    def with_args(cls, **kwargs):
        return _PartialWithArgs(cls, **kwargs)

    def enable_fake_quant(self, enabled: bool = True) -> FakeQuantize:
        self.fake_quant_enabled[0] = 1 if enabled else 0
        return self

    def disable_fake_quant(self) -> FakeQuantize:
        return self.enable_fake_quant(False)

    def enable_observer(self, enabled: bool = True) -> FakeQuantize:
        self.observer_enabled[0] = 1 if enabled else 0
        return self

    def disable_observer(self) -> FakeQuantize:
        return self.enable_observer(False)

    def calculate_qparams(self):
        return self.activation_post_process.calculate_qparams()

    def _forward_qparams(self):
        """The qparams training fake-quantizes with (``scale``, ``zero_point``)."""
        return self.calculate_qparams()

    def forward(self, x: Tensor) -> Tensor:
        # the flags and a per-tensor scale are read without ops, and a traced module (ONNX
        # export) fake-quantizes with the qparams observed so far: they are constants of
        # the exported graph, which its observers must not change
        if _flag(self.observer_enabled) and not is_tracing():
            self.activation_post_process(x.detach())
            s, z = self._forward_qparams()
            self.scale, self.zero_point = s.reshape(-1), z.to(D.int32).reshape(-1)
        if _flag(self.fake_quant_enabled):
            if self.ch_axis >= 0 and self.scale.numel() > 1:
                return Q.fake_quantize_per_channel_affine(
                    x, self.scale, self.zero_point, self.ch_axis, self.quant_min,
                    self.quant_max)
            return Q.fake_quantize_per_tensor_affine(
                x, _flag(self.scale), int(_flag(self.zero_point)), self.quant_min,
                self.quant_max)
        return x


def disable_observer(mod: nn.Module) -> None:
    """Freeze the qparams of ``mod`` if it is a ``FakeQuantize`` (``model.apply(...)``).

    >>> fq = default_fake_quant(); disable_observer(fq); int(fq.observer_enabled[0])
    0
    """
    if isinstance(mod, FakeQuantize):
        mod.disable_observer()


def enable_observer(mod: nn.Module) -> None:
    """Let ``mod``'s observer update its qparams again (if it is a ``FakeQuantize``).

    >>> fq = default_fake_quant(); enable_observer(fq); int(fq.observer_enabled[0])
    1
    """
    if isinstance(mod, FakeQuantize):
        mod.enable_observer()


def disable_fake_quant(mod: nn.Module) -> None:
    """Pass values through ``mod`` unquantized (if it is a ``FakeQuantize``).

    >>> fq = default_fake_quant(); disable_fake_quant(fq); int(fq.fake_quant_enabled[0])
    0
    """
    if isinstance(mod, FakeQuantize):
        mod.disable_fake_quant()


def enable_fake_quant(mod: nn.Module) -> None:
    """Fake-quantize in ``mod`` again (if it is a ``FakeQuantize``).

    >>> fq = default_fake_quant(); enable_fake_quant(fq); int(fq.fake_quant_enabled[0])
    1
    """
    if isinstance(mod, FakeQuantize):
        mod.enable_fake_quant()


def _flag(t: Tensor):
    """The value of a one-element buffer (read without an op)."""
    return t._to_numpy().reshape(-1)[0].item()


_SMALL_SCALE = np.float32(6.1e-5)


def choose_qparams(lo: np.ndarray, hi: np.ndarray, qmin: int, qmax: int,
                   symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """(float32 scales, int64 zero points) as ATen's ``ChooseQuantizationParams``, which
    PyTorch's fused fake quantization uses: a symmetric range is widened to
    ``max(-lo / 128, hi / 127)`` steps each side, a tiny scale is raised to 6.1e-5, and the
    zero point comes from whichever end of the range gives the smaller rounding error.

    >>> s, z = choose_qparams(np.array([-1.0]), np.array([0.5]), -128, 127, True)
    >>> float(s[0]) * 128, int(z[0])
    (1.0, 0)
    """
    lo = np.minimum(np.asarray(lo, np.float32), np.float32(0))
    hi = np.maximum(np.asarray(hi, np.float32), np.float32(0))
    both = (lo < 0) & (hi > 0)
    if symmetric:
        sq_min, sq_max = -((qmax - qmin) // 2 + 1), (qmax - qmin) // 2
        ms = np.maximum(np.abs(lo / np.float32(sq_min)), np.abs(hi / np.float32(sq_max)))
        lo = np.where(both, (ms.astype(np.float64) * sq_min).astype(np.float32), lo)
        hi = np.where(both, (ms.astype(np.float64) * sq_max).astype(np.float32), hi)
    scale = (hi.astype(np.float64) - lo) / (qmax - qmin)
    bad = (scale.astype(np.float32) == 0) | np.isinf(np.float32(1) / scale.astype(np.float32))
    scale = np.where(bad, 0.1, scale)
    small = scale < _SMALL_SCALE
    if small.any():  # the range grows with the scale (around 0 where it ends at 0)
        amp = _SMALL_SCALE / scale.astype(np.float32)
        full = _SMALL_SCALE * np.float32(qmax - qmin)
        lo2 = np.where(lo == 0, lo, np.where(hi == 0, -full, lo * amp))
        hi2 = np.where(lo == 0, full, np.where(hi == 0, hi, hi * amp))
        lo, hi = np.where(small, lo2, lo), np.where(small, hi2, hi)
        scale = np.where(small, np.float64(_SMALL_SCALE), scale)
    from_min = qmin - lo / scale
    from_max = qmax - hi / scale
    err_min = abs(qmin) - np.abs(lo / scale)
    err_max = abs(qmax) - np.abs(hi / scale)
    zp = np.where(err_min < err_max, from_min, from_max)
    if symmetric:
        zp = np.where(both, (qmin + qmax) / 2, zp)
    zp = np.clip(np.rint(zp), qmin, qmax).astype(np.int64)
    return scale.astype(np.float32), zp


class FusedMovingAvgObsFakeQuantize(FakeQuantize):
    """``FakeQuantize`` training with the qparams of PyTorch's fused kernel
    (``torch.fused_moving_avg_obs_fake_quant``, what its default QAT qconfigs use): the
    moving-average observer's range through ``choose_qparams``. ``calculate_qparams``
    (what ``convert`` quantizes with) is the observer's, as in PyTorch."""

    def _forward_qparams(self):
        obs = self.activation_post_process
        lo, hi = obs.min_val._to_numpy(), obs.max_val._to_numpy()
        s, z = choose_qparams(lo.reshape(-1), hi.reshape(-1), self.quant_min, self.quant_max,
                              obs._symmetric())
        return Tensor._from_numpy(s), Tensor._from_numpy(z)


default_fake_quant = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, quant_min=0,
                                            quant_max=255, dtype=D.quint8,
                                            qscheme=Q.per_tensor_affine,
                                            reduce_range=True)
default_weight_fake_quant = FakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, dtype=D.qint8,
    qscheme=Q.per_tensor_symmetric, reduce_range=False)
default_per_channel_weight_fake_quant = FakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
    dtype=D.qint8, qscheme=Q.per_channel_symmetric, reduce_range=False, ch_axis=0)
default_fused_act_fake_quant = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255, dtype=D.quint8)
default_fused_wt_fake_quant = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, dtype=D.qint8,
    qscheme=Q.per_tensor_symmetric)
default_fused_per_channel_wt_fake_quant = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
    dtype=D.qint8, qscheme=Q.per_channel_symmetric)
