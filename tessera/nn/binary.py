"""Binary neural networks: 1-bit layers trained with straight-through estimators, and
``pack()``, which turns a trained model into bit-packed weights that run on the
xnor-popcount kernels (AVX-512 VPOPCNTDQ, AVX2, portable C).

Layers keep float *latent* weights for training; the forward pass binarizes inputs and
weights with ``sign`` (``x < 0 -> -1``, else ``+1``: ``sign(0) = +1``, as Larq and dabnn)
and the backward pass goes straight through it, clipped to ``|x| <= 1`` (or Bi-Real Net's
ApproxSign). ``scale="channel"`` multiplies each output channel by XNOR-Net's
``alpha = mean |w|`` of its weights. Convolutions pad with ``pad_value``: -1 (dabnn's, the
default; free on the packed kernels), +1 (Larq's ``pad_values=1``, also free) or 0 (as a
float convolution; the kernels subtract the padded taps). As usual, the first and the last
layer of a network stay in float.

``pack(model)`` replaces every binary layer of a copy of ``model`` with its packed form
(``PackedBinaryConv2d``, ``PackedBinaryLinear``: weights as uint64 words in int64 tensors,
dabnn's channel-last layout), which gives exactly the outputs of the float layers it
replaces; its ``state_dict`` and ``tessera.save`` hold the packed bits (32x smaller).

>>> import tessera
>>> from tessera import nn
>>> import tessera.nn.binary as bnn
>>> _ = tessera.manual_seed(0)
>>> model = nn.Sequential(bnn.BinaryConv2d(3, 8, 3, padding=1, scale="channel"),
...                       nn.BatchNorm2d(8)).eval()
>>> x = tessera.randn(1, 3, 8, 8)
>>> packed = bnn.pack(model)
>>> type(packed[0]).__name__, bool((packed(x) == model(x)).all())
('PackedBinaryConv2d', True)
"""
from __future__ import annotations

import copy
import math
from typing import Any

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.nn import init
from tessera.nn.modules.module import Module
from tessera.nn.parameter import Parameter
from tessera.ops import binary as _B
from tessera.ops.creation import empty, ones, zeros

__all__ = ["sign", "approx_sign", "xnor_alpha", "BinaryConv2d", "BinaryLinear",
           "BiRealShortcut", "PackedBinaryConv2d", "PackedBinaryLinear", "pack", "packbits",
           "unpackbits", "SCALES"]

SCALES = (None, "channel")


def sign(input: Tensor, estimator: str = "ste") -> Tensor:
    """-1 where ``input < 0``, else +1; gradient straight through where ``|x| <= 1``
    (``estimator="approx"``: Bi-Real Net's ApproxSign, ``2 - 2|x|`` there).

    >>> import tessera
    >>> sign(tessera.tensor([-0.5, 0.0, 3.0])).tolist()
    [-1.0, 1.0, 1.0]
    """
    return _B.binary_sign(input, estimator)


def approx_sign(input: Tensor) -> Tensor:
    """``sign`` with Bi-Real Net's ApproxSign gradient.

    >>> import tessera
    >>> x = tessera.tensor([0.25, 2.0], requires_grad=True)
    >>> approx_sign(x).sum().backward(); x.grad.tolist()
    [1.5, 0.0]
    """
    return _B.binary_sign(input, "approx")


def xnor_alpha(weight: Tensor) -> Tensor:
    """XNOR-Net's scale of each output channel: ``mean |w|`` over all but dim 0.

    >>> import tessera
    >>> xnor_alpha(tessera.tensor([[1.0, -3.0], [0.5, 0.5]])).tolist()
    [2.0, 0.5]
    """
    return weight.abs().reshape(weight.shape[0], -1).mean(1)


def packbits(x: Tensor) -> Tensor:
    """The signs of ``x`` along its last dim, 64 to a word (int64 tensors of uint64 bits).

    >>> import tessera
    >>> packbits(tessera.tensor([1.0, -1.0])).tolist()
    [2]
    """
    return _B.binary_pack(x)


def unpackbits(words: Tensor, n: int) -> Tensor:
    """``n`` values in {-1, +1} along the last dim from ``packbits``' words.

    >>> import tessera
    >>> unpackbits(tessera.tensor([2]), 2).tolist()
    [1.0, -1.0]
    """
    return _B.binary_unpack(words, n)


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _check_scale(scale) -> None:
    if scale not in SCALES:
        raise ValueError(f"scale must be None or 'channel', got {scale!r}")


class BinaryConv2d(Module):
    """A 2-d convolution of binarized inputs and weights (float latent weights, trained
    through the straight-through estimator). ``scale="channel"``: XNOR-Net's per-channel
    ``alpha = mean |w|``; ``pad_value``: what padded positions count as (-1, 0 or +1).

    >>> import tessera
    >>> conv = BinaryConv2d(4, 2, 3, padding=1)
    >>> conv(tessera.randn(1, 4, 5, 5)).shape
    tessera.Size([1, 2, 5, 5])
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, bias: bool = False, scale: str | None = None, pad_value: int = -1,
                 estimator: str = "ste"):
        super().__init__()
        _check_scale(scale)
        if pad_value not in (-1, 0, 1):
            raise ValueError(f"BinaryConv2d: pad_value must be -1, 0 or 1, got {pad_value!r}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(dilation)
        self.scale, self.pad_value, self.estimator = scale, pad_value, estimator
        self.weight = Parameter(empty(out_channels, in_channels, *self.kernel_size))
        self.bias = Parameter(zeros(out_channels)) if bias else None
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def _attrs(self) -> dict:
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation,
                    pad_value=self.pad_value)

    def forward(self, input: Tensor) -> Tensor:
        alpha = xnor_alpha(self.weight) if self.scale == "channel" else None
        y = _B.binary_conv2d(sign(input, self.estimator), sign(self.weight), alpha,
                             **self._attrs())
        return y if self.bias is None else y + self.bias.reshape(1, -1, 1, 1)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, scale={self.scale!r}, "
                f"pad_value={self.pad_value}")


class BinaryLinear(Module):
    """A linear layer of binarized inputs and weights (``scale="channel"``: XNOR-Net's
    ``alpha = mean |w|`` per output feature).

    >>> import tessera
    >>> BinaryLinear(100, 10, scale="channel")(tessera.randn(2, 100)).shape
    tessera.Size([2, 10])
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 scale: str | None = None, estimator: str = "ste"):
        super().__init__()
        _check_scale(scale)
        self.in_features, self.out_features = in_features, out_features
        self.scale, self.estimator = scale, estimator
        self.weight = Parameter(empty(out_features, in_features))
        self.bias = Parameter(zeros(out_features)) if bias else None
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, input: Tensor) -> Tensor:
        alpha = xnor_alpha(self.weight) if self.scale == "channel" else None
        y = _B.binary_linear(sign(input, self.estimator), sign(self.weight), alpha)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, scale={self.scale!r}"


class BiRealShortcut(Module):
    """Bi-Real Net's shortcut: ``body(x) + shortcut(x)``, a real-valued identity around each
    binary block (``shortcut``: e.g. average pooling and a 1x1 float convolution where the
    block changes the shape; identity by default).

    >>> import tessera
    >>> from tessera import nn
    >>> block = BiRealShortcut(BinaryConv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4))
    >>> block(tessera.randn(1, 4, 6, 6)).shape
    tessera.Size([1, 4, 6, 6])
    """

    def __init__(self, *body: Module, shortcut: Module | None = None):
        super().__init__()
        from tessera.nn import Sequential
        self.body = body[0] if len(body) == 1 else Sequential(*body)
        self.shortcut = shortcut

    def forward(self, input: Tensor) -> Tensor:
        return self.body(input) + (input if self.shortcut is None else self.shortcut(input))


# ---- packed inference ------------------------------------------------------------------------

class PackedBinaryConv2d(Module):
    """A ``BinaryConv2d`` with its weights as bits (``weight_packed``: int64 words of shape
    (O, KH, KW, ceil(I/64)), dabnn's layout) and ``alpha`` folded in; inference only.

    >>> import tessera
    >>> conv = BinaryConv2d(4, 2, 3, padding=1)
    >>> PackedBinaryConv2d.from_float(conv).weight_packed.shape
    tessera.Size([2, 3, 3, 1])
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, bias: bool = False, scale: str | None = None, pad_value: int = -1):
        super().__init__()
        _check_scale(scale)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(dilation)
        self.scale, self.pad_value = scale, pad_value
        kh, kw = self.kernel_size
        self.register_buffer("weight_packed", zeros(
            out_channels, kh, kw, -(-in_channels // 64), dtype=D.int64))
        self.register_buffer("alpha", ones(out_channels) if scale else None)
        self.register_buffer("bias", zeros(out_channels) if bias else None)

    @classmethod
    def from_float(cls, m: BinaryConv2d) -> PackedBinaryConv2d:
        p = cls(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation,
                m.bias is not None, m.scale, m.pad_value)
        with no_grad():
            p.weight_packed = packbits(m.weight.detach().permute(0, 2, 3, 1).contiguous())
            if m.scale == "channel":
                p.alpha = xnor_alpha(m.weight.detach())
            if m.bias is not None:
                p.bias = m.bias.detach().clone()
        return p

    def forward(self, input: Tensor) -> Tensor:
        b = self._buffers  # read once: a buffer by attribute costs a __getattr__ each
        y = _B.packed_binary_conv2d(input, b["weight_packed"], b["alpha"], self.in_channels,
                                    stride=self.stride, padding=self.padding,
                                    dilation=self.dilation, pad_value=self.pad_value)
        bias = b["bias"]
        return y if bias is None else y + bias.reshape(1, -1, 1, 1)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, scale={self.scale!r}, "
                f"pad_value={self.pad_value}")


class PackedBinaryLinear(Module):
    """A ``BinaryLinear`` with its weights as bits (``weight_packed``: int64 words of shape
    (O, ceil(I/64))); inference only.

    >>> PackedBinaryLinear(100, 10).weight_packed.shape
    tessera.Size([10, 2])
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 scale: str | None = None):
        super().__init__()
        _check_scale(scale)
        self.in_features, self.out_features, self.scale = in_features, out_features, scale
        self.register_buffer("weight_packed", zeros(
            out_features, -(-in_features // 64), dtype=D.int64))
        self.register_buffer("alpha", ones(out_features) if scale else None)
        self.register_buffer("bias", zeros(out_features) if bias else None)

    @classmethod
    def from_float(cls, m: BinaryLinear) -> PackedBinaryLinear:
        p = cls(m.in_features, m.out_features, m.bias is not None, m.scale)
        with no_grad():
            p.weight_packed = packbits(m.weight.detach())
            if m.scale == "channel":
                p.alpha = xnor_alpha(m.weight.detach())
            if m.bias is not None:
                p.bias = m.bias.detach().clone()
        return p

    def forward(self, input: Tensor) -> Tensor:
        y = _B.packed_binary_linear(input, self.weight_packed, self.alpha, self.in_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, scale={self.scale!r}"


_PACKED: dict[type, Any] = {BinaryConv2d: PackedBinaryConv2d, BinaryLinear: PackedBinaryLinear}


def pack(model: Module) -> Module:
    """A copy of ``model`` with every ``BinaryConv2d`` and ``BinaryLinear`` replaced by its
    packed form (the original is left as it is). Call it on a model in eval mode.

    >>> import tessera
    >>> pack(BinaryLinear(3, 2))
    PackedBinaryLinear(3, 2, scale=None)
    """
    model = copy.deepcopy(model)
    if type(model) in _PACKED:
        return _PACKED[type(model)].from_float(model)
    _swap(model)
    return model


def _swap(module: Module) -> None:
    for name, child in list(module.named_children()):
        cls = _PACKED.get(type(child))
        if cls is not None:
            setattr(module, name, cls.from_float(child))
        else:
            _swap(child)
