"""``FakeQuantize``: an observer and fake quantization in one module, for quantization-aware
training (PyTorch's ``torch.ao.quantization.fake_quantize``).

>>> import tessera
>>> fq = default_fake_quant()
>>> fq(tessera.tensor([0.0, 1.0])).tolist()
[0.0, 1.0]
"""
from __future__ import annotations

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

__all__ = ["FakeQuantize", "default_fake_quant", "default_weight_fake_quant",
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

    def forward(self, x: Tensor) -> Tensor:
        # the flags and a per-tensor scale are read without ops, and a traced module (ONNX
        # export) fake-quantizes with the qparams observed so far: they are constants of
        # the exported graph, which its observers must not change
        if _flag(self.observer_enabled) and not is_tracing():
            self.activation_post_process(x.detach())
            s, z = self.calculate_qparams()
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
