"""``QConfig``: which observers (or fake quantizers) a module's activations and weights get.

>>> get_default_qconfig("x86").activation.p.keywords["reduce_range"]
True
"""
from __future__ import annotations

from typing import Any, NamedTuple

from tessera import _dtype as D
from tessera.ao.quantization.fake_quantize import (
    FakeQuantize,
    FusedMovingAvgObsFakeQuantize,
    default_fused_per_channel_wt_fake_quant,
    default_fused_wt_fake_quant,
    default_per_channel_weight_fake_quant,
    default_weight_fake_quant,
)
from tessera.ao.quantization.observer import (
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
    default_weight_observer,
)
from tessera.ops import quantized as Q

__all__ = ["QConfig", "QConfigMapping", "get_default_qconfig", "get_default_qat_qconfig",
           "default_qconfig", "default_dynamic_qconfig", "get_default_qconfig_mapping"]


class QConfig(NamedTuple):
    """Factories of the activation and weight observers."""

    activation: Any
    weight: Any


_BACKENDS = ("x86", "fbgemm", "qnnpack", "onednn")


def _check(backend: str) -> None:
    if backend not in _BACKENDS:
        raise AssertionError(f"Unknown backend {backend!r}: expected one of {_BACKENDS}")


def get_default_qconfig(backend: str = "x86", version: int = 0) -> QConfig:
    """Post-training static quantization, PyTorch's choices: activations through a
    histogram observer (the range of least L2 error; 7 bits on x86, where AVX2's int16
    pairs would overflow at 8), weights per channel (per tensor for qnnpack)."""
    _check(backend)
    if backend == "qnnpack":
        return QConfig(HistogramObserver.with_args(reduce_range=False),
                       default_weight_observer)
    return QConfig(HistogramObserver.with_args(reduce_range=backend != "onednn"),
                   PerChannelMinMaxObserver.with_args(dtype=D.qint8,
                                                      qscheme=Q.per_channel_symmetric))


def get_default_qat_qconfig(backend: str = "x86", version: int = 1) -> QConfig:
    """Quantization-aware training: moving-average observers inside fake quantizers; with
    ``version=1`` (the default, as PyTorch's) the fused fake quantizers' qparams."""
    _check(backend)
    fq = FusedMovingAvgObsFakeQuantize if version == 1 else FakeQuantize
    act = fq.with_args(observer=MovingAverageMinMaxObserver, quant_min=0,
                       quant_max=255, reduce_range=backend != "qnnpack")
    if version == 1:
        weight = default_fused_wt_fake_quant if backend == "qnnpack" else \
            default_fused_per_channel_wt_fake_quant
    else:
        weight = default_weight_fake_quant if backend == "qnnpack" else \
            default_per_channel_weight_fake_quant
    return QConfig(act, weight)


default_qconfig = QConfig(MinMaxObserver.with_args(reduce_range=True), default_weight_observer)
default_dynamic_qconfig = QConfig(PlaceholderObserver.with_args(dtype=D.float32),
                                  default_weight_observer)


class QConfigMapping:
    """A global qconfig, with overrides by module type and by module name."""

    def __init__(self):
        self.global_qconfig: QConfig | None = None
        self.object_type_qconfigs: dict = {}
        self.module_name_qconfigs: dict = {}

    def set_global(self, qconfig) -> QConfigMapping:
        self.global_qconfig = qconfig
        return self

    def set_object_type(self, t, qconfig) -> QConfigMapping:
        self.object_type_qconfigs[t] = qconfig
        return self

    def set_module_name(self, name: str, qconfig) -> QConfigMapping:
        self.module_name_qconfigs[name] = qconfig
        return self

    def lookup(self, name: str, module) -> QConfig | None:
        if name in self.module_name_qconfigs:
            return self.module_name_qconfigs[name]
        return self.object_type_qconfigs.get(type(module), self.global_qconfig)


def get_default_qconfig_mapping(backend: str = "x86") -> QConfigMapping:
    return QConfigMapping().set_global(get_default_qconfig(backend))
