"""Dynamically quantized modules (``torch.ao.nn.quantized.dynamic``): INT8 weights (per
output channel), float activations quantized from their own range at each call, to 7 bits
only where the CPU's INT8 kernels run 8 at twice the cost (``needs_reduce_range``).

>>> import tessera
>>> Linear.from_float(tessera.nn.Linear(4, 3))(tessera.ones(2, 4)).shape
tessera.Size([2, 3])
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D, nn
from tessera._tensor import Tensor
from tessera.ops import quantized as Q

__all__ = ["Linear", "needs_reduce_range"]


def needs_reduce_range() -> bool:
    """Whether activations keep to 7 bits by default on this CPU: only on AVX2 without
    VNNI, whose kernel splits 8-bit activations in two to keep its int16 pair sums from
    saturating, at twice the work (PyTorch always reduces the range; with VNNI, or in
    portable C, the 8th bit is free precision). Either range gives exact integer sums.

    >>> needs_reduce_range() in (True, False)
    True
    """
    from tessera.kernels import int8
    return int8.isa() == "avx2"


class Linear(nn.Module):
    """``quantized::linear_dynamic`` with per-channel int8 weights."""

    def __init__(self, in_features: int, out_features: int, reduce_range: bool | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.reduce_range = needs_reduce_range() if reduce_range is None else reduce_range

    def forward(self, x):
        w = Tensor._make(self.weight._data, D.qint8, self.weight.device,
                         tuple(self.weight.shape))
        # the float32 scales as they are (no cast node when traced)
        qw = Q.QTensor._wrap(w, self.weight_scale,
                             Tensor._from_numpy(np.zeros(w.shape[0], np.int64)), 0)
        return Q.linear_dynamic(x, qw, self.bias, self.reduce_range)

    @classmethod
    def from_float(cls, mod, reduce_range: bool | None = None):
        from tessera.ao.nn.quantized import _quantize_weight
        from tessera.ao.quantization.observer import PerChannelMinMaxObserver
        obs = PerChannelMinMaxObserver(dtype=D.qint8,
                                       qscheme=Q.per_channel_symmetric)
        qw = _quantize_weight(mod.weight, obs)
        q = cls(mod.in_features, mod.out_features, reduce_range)
        q.register_buffer("weight", qw.int_repr())
        q.register_buffer("weight_scale", qw.q_per_channel_scales().to(D.float32))
        q.register_buffer("bias", None if mod.bias is None else mod.bias.detach().clone())
        return q
