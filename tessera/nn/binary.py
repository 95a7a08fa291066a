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
Where a binary layer is followed by a batch norm and then a binary layer that nothing else
reads, as in XNOR-Net, dabnn and Larq Compute Engine, the activations between them stay bits:
the batch norm and the next sign fold into one integer threshold per channel, the first layer
writes bit-packed signs and the second reads them (``bitpacked_binary_conv2d``), with the
same outputs, bit for bit.

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

_NEVER = 1 << 40   # a threshold no dot product reaches: a constant sign

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
        # set by ``pack``: (t, flip) per output channel, the output's signs bit-packed
        self.register_buffer("threshold", None)

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

    input_bits = False  # set by ``pack``: the input is bit-packed, (N, H, W, ceil(C/64))

    def forward(self, input: Tensor) -> Tensor:
        b = self._buffers  # read once: a buffer by attribute costs a __getattr__ each
        t = b.get("threshold")
        s, p, d, v = self.stride, self.padding, self.dilation, self.pad_value
        if t is not None:  # alpha, the bias and the batch norm are in the threshold
            return _B.bitpacked_binary_conv2d(input, b["weight_packed"], None, t,
                                              self.in_channels, stride=s, padding=p,
                                              dilation=d, pad_value=v)
        if self.input_bits:
            y = _B.bitpacked_binary_conv2d(input, b["weight_packed"], b["alpha"], None,
                                           self.in_channels, stride=s, padding=p, dilation=d,
                                           pad_value=v)
        else:
            y = _B.packed_binary_conv2d(input, b["weight_packed"], b["alpha"],
                                        self.in_channels, stride=s, padding=p, dilation=d,
                                        pad_value=v)
        bias = b["bias"]
        return y if bias is None else y + bias.reshape(1, -1, 1, 1)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, scale={self.scale!r}, "
                f"pad_value={self.pad_value}{_bits_repr(self)}")


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
        self.register_buffer("threshold", None)  # as PackedBinaryConv2d's

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

    input_bits = False  # set by ``pack``: the input is bit-packed, (B, ceil(I/64))

    def forward(self, input: Tensor) -> Tensor:
        b = self._buffers
        t = b.get("threshold")
        if t is not None:
            return _B.bitpacked_binary_linear(input, b["weight_packed"], None, t,
                                              self.in_features)
        if self.input_bits:
            y = _B.bitpacked_binary_linear(input, b["weight_packed"], b["alpha"], None,
                                           self.in_features)
        else:
            y = _B.packed_binary_linear(input, b["weight_packed"], b["alpha"], self.in_features)
        bias = b["bias"]
        return y if bias is None else y + bias

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, scale={self.scale!r}{_bits_repr(self)}"


def _bits_repr(m: Module) -> str:
    return ((", input=bits" if m.input_bits else "") +
            (", output=bits" if m._buffers.get("threshold") is not None else ""))


_PACKED: dict[type, Any] = {BinaryConv2d: PackedBinaryConv2d, BinaryLinear: PackedBinaryLinear}


def pack(model: Module, bitpacked: bool = True) -> Module:
    """A copy of ``model`` with every ``BinaryConv2d`` and ``BinaryLinear`` replaced by its
    packed form (the original is left as it is). Call it on a model in eval mode.

    With ``bitpacked`` (the default), wherever a ``Sequential`` runs a binary layer, an
    eval-mode batch norm and another binary layer of the same kind one after the other, the
    activations between them stay bits: the batch norm becomes an ``Identity``, its
    arithmetic and the next sign fold into the first layer's per-channel ``threshold``, and
    the next layer reads bit-packed input. The outputs are those of the float path, bit for
    bit. (Elsewhere, e.g. a batch norm whose output a shortcut also reads, the float path
    stays.)

    >>> import tessera
    >>> from tessera import nn
    >>> pack(BinaryLinear(3, 2))
    PackedBinaryLinear(3, 2, scale=None)
    >>> net = nn.Sequential(BinaryConv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
    ...                     BinaryConv2d(8, 4, 3, padding=1)).eval()
    >>> p = pack(net)
    >>> p[0].extra_repr().endswith("output=bits"), type(p[1]).__name__, p[2].input_bits
    (True, 'Identity', True)
    >>> x = tessera.randn(1, 3, 6, 6)
    >>> bool((p(x) == net(x)).all())
    True
    """
    model = copy.deepcopy(model)
    if type(model) in _PACKED:
        return _PACKED[type(model)].from_float(model)
    _swap(model)
    if bitpacked:
        _chain(model)
    return model


def _swap(module: Module) -> None:
    for name, child in list(module.named_children()):
        cls = _PACKED.get(type(child))
        if cls is not None:
            setattr(module, name, cls.from_float(child))
        else:
            _swap(child)


def _chain(module: Module) -> None:
    """Bit-packed activations between the binary layers of ``module``'s Sequentials that a
    batch norm alone separates (see ``pack``)."""
    from tessera.nn import BatchNorm1d, BatchNorm2d, Identity, Sequential
    for child in module.children():
        _chain(child)
    if not isinstance(module, Sequential):
        return
    items = list(module.named_children())
    for (_, a), (name, bn), (_, c) in zip(items, items[1:], items[2:]):
        kind = type(a)
        want = {PackedBinaryConv2d: BatchNorm2d, PackedBinaryLinear: BatchNorm1d}.get(kind)
        if want is None or type(bn) is not want or type(c) is not kind:
            continue
        o = a.out_channels if kind is PackedBinaryConv2d else a.out_features
        cin = c.in_channels if kind is PackedBinaryConv2d else c.in_features
        if cin != o or bn.num_features != o:
            continue
        t = _fold(a, bn)
        if t is None:
            continue
        a.threshold = t
        c.input_bits = True
        setattr(module, name, Identity())


def _fold(layer, bn) -> Tensor | None:
    """``layer``'s thresholds ``(t, flip)`` (int64 (O, 2)) such that the sign of ``bn``
    applied to the layer's float output is -1 exactly where ``(dot < t) xor flip``; None
    where that cannot be relied on (a batch norm in training, non-finite parameters,
    float64 layers).

    The float path computes ``z(dot) = bn(float32(dot) * alpha + bias)``, a chain of
    float32 operations each monotone in its input (rounding is monotone): ``z`` is monotone
    in the integer ``dot``, increasing or decreasing with the sign of the batch norm's scale
    (or of alpha), constant where a scale is zero. So ``z < 0`` holds below or above one
    point: found by bisection over ``[-kbits, kbits]`` on that very arithmetic (the modules'
    own forward), so that every rounding is the float path's, and checked against every
    ``dot`` where that is cheap."""
    import numpy as np

    from tessera.ops.creation import tensor
    b = layer._buffers
    params = [p for p in (b["alpha"], b["bias"], bn.weight, bn.bias, bn.running_mean,
                          bn.running_var) if p is not None]
    if bn.training or bn.running_mean is None or bn.running_var is None or any(
            p.dtype is not D.float32 or not bool(p.isfinite().all()) for p in params):
        return None
    conv = isinstance(layer, PackedBinaryConv2d)
    o = layer.out_channels if conv else layer.out_features
    kbits = layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1] if conv \
        else layer.in_features

    def negative(dot: np.ndarray) -> np.ndarray:
        """z(dot) < 0 for a (M, O) array of integer dot products."""
        y = dot.astype(np.float32)
        if b["alpha"] is not None:
            y = y * b["alpha"].numpy()
        t = tensor(y.reshape(dot.shape + ((1, 1) if conv else ())))
        if b["bias"] is not None:
            t = t + (b["bias"].reshape(1, -1, 1, 1) if conv else b["bias"])
        return (bn(t).numpy() < 0).reshape(dot.shape)

    with no_grad():
        lo, hi = np.full((1, o), -kbits), np.full((1, o), kbits)
        neg_lo, neg_hi = negative(lo)[0], negative(hi)[0]
        lo, hi = lo[0], hi[0]
        moving = neg_lo != neg_hi
        while True:
            active = moving & (hi - lo > 1)
            if not active.any():
                break
            mid = (lo + hi) // 2
            same = negative(mid[None])[0] == neg_lo
            lo = np.where(active & same, mid, lo)
            hi = np.where(active & ~same, mid, hi)
        # the first dot whose sign differs from -kbits' is hi: increasing, -1 below it
        # (flip 0); decreasing, -1 from it on (flip 1); constant, a threshold never reached
        t = np.where(moving, hi, _NEVER)
        flip = (~neg_lo).astype(np.int64)
        thr = np.stack([t, flip], 1).astype(np.int64)
        if (2 * kbits + 1) * o <= 1 << 22:   # every dot product, where that is cheap
            dots = np.arange(-kbits, kbits + 1)[:, None].repeat(o, 1)
            if not np.array_equal(negative(dots), (dots < thr[:, 0]) != thr[:, 1].astype(bool)):
                return None
    return tensor(thr)
