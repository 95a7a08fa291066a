"""Quantization, both directions: fake quantization, quantize/dequantize and the INT8 ops
of quantized inference (``tessera.ops.quantized``) as standard QDQ ONNX, and QDQ and
QOperator models (QuantizeLinear, DequantizeLinear, QLinearConv, QLinearMatMul,
MatMulInteger, ConvInteger, DynamicQuantizeLinear, and onnxruntime's com.microsoft
QLinearAdd, QGemm, QLinearGlobalAveragePool, QLinearConcat, QLinearSigmoid and
QLinearLeakyRelu) back into tessera's quantized ops.

Export writes the QDQ form onnxruntime's ``quantize_static`` writes: a quantized product is
``DequantizeLinear`` of its input and of its int8 weights (per output channel, axis 0),
the float ``Conv``/``Gemm`` with an int32 bias dequantized at ``x_scale * w_scale``, then
``QuantizeLinear`` to the output's scale and zero point, which onnxruntime fuses into its
INT8 kernels (QLinearConv, QGemm). Integer-only ops (ReLU, max pooling) stay on the
integers; fake quantization is a QuantizeLinear/DequantizeLinear pair.

Import maps QuantizeLinear and DequantizeLinear to ``quantize_per_tensor`` /
``dequantize`` (per channel where the scale is 1-D); QLinearConv and QLinearMatMul
become ``quantized_conv2d`` / ``quantized_linear`` where tessera's kernels take their
types (uint8 activations, int8 weights with zero point 0), and the dequantize-compute-
quantize composite otherwise.

>>> from tessera.onnx.converters.registry import EXPORT, IMPORT
>>> "quantized_conv2d" in EXPORT, "QLinearConv" in IMPORT
(True, True)
"""
from __future__ import annotations

import functools

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.graph.trace import is_symbolic
from tessera.onnx.converters.helpers import operand
from tessera.onnx.converters.registry import export_rule, import_rule
from tessera.ops import quantized as Q
from tessera.ops.registry import REGISTRY

_INT = {D.qint8: np.int8, D.quint8: np.uint8, D.qint32: np.int32}
# a traced value may carry the integer dtype of the same data (int_repr, views of it)
_NP = {**_INT, D.int8: np.int8, D.uint8: np.uint8, D.int32: np.int32}
_QOF = {np.dtype(np.int8): D.qint8, np.dtype(np.uint8): D.quint8,
        np.dtype(np.int32): D.qint32}


# ---- export ------------------------------------------------------------------------------

def _zp(b, zp, qdt) -> str:
    return b.const(np.array(zp, _NP[qdt]))


def _quant(b, x: str, scale: float, zp: int, qdt) -> str:
    """QuantizeLinear of float32 ``x`` to ``qdt`` (per tensor)."""
    if qdt is D.qint32:
        raise NotImplementedError("QuantizeLinear to int32 (qint32) needs opset 21")
    return b.op("QuantizeLinear", [x, b.const(np.float32(scale)), _zp(b, zp, qdt)])


def _dequant(b, q: str, scale: float, zp: int, qdt) -> str:
    return b.op("DequantizeLinear", [q, b.const(np.float32(scale)), _zp(b, zp, qdt)])


def _init(b, name):
    """The constant value of ONNX tensor ``name`` (an initializer), or None."""
    return b.initializers.get(name) if isinstance(name, str) else None


@export_rule("quantize_per_tensor")
def _quantize_per_tensor(b, n):
    a = n.attrs
    return _quant(b, operand(b, n, 0, D.float32), a["scale"], a["zero_point"],
                  D._by_name(a["dtype"]))


@export_rule("quantize_per_channel")
def _quantize_per_channel(b, n):
    qdt = D._by_name(n.attrs["dtype"])
    if qdt is D.qint32:
        raise NotImplementedError("QuantizeLinear to int32 (qint32) needs opset 21")
    return b.op("QuantizeLinear", [operand(b, n, 0, D.float32), operand(b, n, 1, D.float32),
                                   b.cast(n.ins[2], n.dtype(2), _int_dtype(qdt))],
                axis=n.attrs["axis"])


def _int_dtype(qdt):
    return {D.qint8: D.int8, D.quint8: D.uint8, D.qint32: D.int32}[qdt]


@export_rule("dequantize")
def _dequantize(b, n):
    return _dequant(b, n.ins[0], n.attrs["scale"], n.attrs["zero_point"], n.dtype(0))


@export_rule("dequantize_per_channel")
def _dequantize_per_channel(b, n):
    zp = n.ins[2]
    if n.dtype(2) is not _int_dtype(n.dtype(0)):
        zp = b.cast(zp, n.dtype(2), _int_dtype(n.dtype(0)))
    return b.op("DequantizeLinear", [n.ins[0], operand(b, n, 1, D.float32), zp],
                axis=n.attrs["axis"])


def _fq_dtype(qmin: int, qmax: int):
    """The integer type whose QuantizeLinear saturation holds ``[qmin, qmax]`` (a narrower
    range adds a Clip on the integers)."""
    for qdt, (lo, hi) in ((D.quint8, (0, 255)), (D.qint8, (-128, 127))):
        if lo <= qmin and qmax <= hi:
            return qdt
    raise NotImplementedError(f"fake quantization to [{qmin}, {qmax}] (ONNX quantizes to "
                              "int8 or uint8)")


def _clip_ints(b, q: str, qdt, qmin: int, qmax: int) -> str:
    lo, hi = {D.quint8: (0, 255), D.qint8: (-128, 127)}[qdt]
    if (qmin, qmax) == (lo, hi):
        return q
    return b.op("Clip", [q, _zp(b, qmin, qdt), _zp(b, qmax, qdt)])


@export_rule("fake_quantize_per_tensor_affine")
def _fake_quantize_per_tensor(b, n):
    a = n.attrs
    qdt = _fq_dtype(a["quant_min"], a["quant_max"])
    q = _quant(b, operand(b, n, 0, D.float32), a["scale"], a["zero_point"], qdt)
    q = _clip_ints(b, q, qdt, a["quant_min"], a["quant_max"])
    y = _dequant(b, q, a["scale"], a["zero_point"], qdt)
    return [b.cast(y, D.float32, n.out_dtype()), None]


@export_rule("fake_quantize_per_channel_affine")
def _fake_quantize_per_channel(b, n):
    a = n.attrs
    qdt = _fq_dtype(a["quant_min"], a["quant_max"])
    scale = operand(b, n, 1, D.float32)
    zp = n.ins[2]
    if n.dtype(2).is_floating_point:  # PyTorch rounds a float zero point
        zp = b.op("Round", [zp])
    zp = b.cast(zp, n.dtype(2), _int_dtype(qdt))
    q = b.op("QuantizeLinear", [operand(b, n, 0, D.float32), scale, zp], axis=a["axis"])
    q = _clip_ints(b, q, qdt, a["quant_min"], a["quant_max"])
    y = b.op("DequantizeLinear", [q, scale, zp], axis=a["axis"])
    return [b.cast(y, D.float32, n.out_dtype()), None]


@export_rule("_fake_quantize_learnable_per_tensor_affine")
def _fake_quantize_learnable(b, n):
    """LSQ's fake quantization in inference: the scale and zero point are tensors of one
    element (the zero point a float, rounded half up and clamped as the kernel does),
    reshaped to the scalars QuantizeLinear takes."""
    a = n.attrs
    qdt = _fq_dtype(a["quant_min"], a["quant_max"])
    scalar = b.ints([])
    scale = b.op("Reshape", [operand(b, n, 1, D.float32), scalar])
    zp = b.op("Floor", [b.op("Add", [operand(b, n, 2, D.float32), b.const(np.float32(0.5))])])
    zp = b.op("Clip", [zp, b.const(np.float32(a["quant_min"])),
                       b.const(np.float32(a["quant_max"]))])
    zp = b.op("Reshape", [b.cast(zp, D.float32, _int_dtype(qdt)), scalar])
    q = b.op("QuantizeLinear", [operand(b, n, 0, D.float32), scale, zp])
    q = _clip_ints(b, q, qdt, a["quant_min"], a["quant_max"])
    y = b.op("DequantizeLinear", [q, scale, zp])
    return b.cast(y, D.float32, n.out_dtype())


def _weight(b, n) -> str:
    """DequantizeLinear of the int8 weights (input 1) with their per-channel scales
    (input 2), zero points 0, along the output channels."""
    cout = n.shape(1)[0]
    return b.op("DequantizeLinear", [n.ins[1], operand(b, n, 2, D.float32),
                                     b.const(np.zeros(cout, np.int8))], axis=0)


def _bias(b, n, x_scale: float) -> str | None:
    """The bias (input 3) as tessera's kernels add it: int32 at scale ``x_scale *
    w_scale``, dequantized (constant weights and bias fold to initializers, the form
    onnxruntime fuses)."""
    if n.ins[3] is None:
        return None
    bias, ws = _init(b, n.ins[3]), _init(b, n.ins[2])
    if bias is not None and ws is not None:
        acc = np.float64(x_scale) * ws.astype(np.float64)
        bq = np.rint(bias.astype(np.float64) / acc).astype(np.int32)
        return b.op("DequantizeLinear", [b.const(bq), b.const(acc.astype(np.float32)),
                                         b.const(np.zeros(bq.shape, np.int32))], axis=0)
    acc = b.op("Mul", [operand(b, n, 2, D.float32), b.const(np.float32(x_scale))])
    bq = b.op("Cast", [b.op("Round", [b.op("Div", [operand(b, n, 3, D.float32), acc])])],
              to=6)
    return b.op("DequantizeLinear", [bq, acc], axis=0)


def _requant(b, n, y: str) -> str:
    a = n.attrs
    if a["relu"]:
        y = b.op("Relu", [y])
    return _quant(b, y, a["out_scale"], a["out_zp"], n.out_dtype())


@export_rule("quantized_linear")
def _quantized_linear(b, n):
    a = n.attrs
    x = _dequant(b, n.ins[0], a["x_scale"], a["x_zp"], n.dtype(0))
    k = n.shape(1)[1]
    if n.rank(0) != 2:
        x = b.op("Reshape", [x, b.ints([-1, k])])
    y = b.op("Gemm", [x, _weight(b, n), _bias(b, n, a["x_scale"])], transB=1)
    if n.rank(0) != 2:
        y = b.op("Reshape", [y, b.ints(n.out_shape())])
    return _requant(b, n, y)


@export_rule("quantized_conv2d")
def _quantized_conv2d(b, n):
    a = n.attrs
    x = _dequant(b, n.ins[0], a["x_scale"], a["x_zp"], n.dtype(0))
    p = list(a["padding"])
    y = b.op("Conv", [x, _weight(b, n), _bias(b, n, a["x_scale"])],
             kernel_shape=list(n.shape(1)[2:]), strides=list(a["stride"]), pads=p + p,
             dilations=list(a["dilation"]), group=int(a["groups"]))
    return _requant(b, n, y)


@export_rule("quantized_linear_dynamic")
def _quantized_linear_dynamic(b, n):
    """onnxruntime's dynamic form: the input quantized to uint8 from its own range
    (DynamicQuantizeLinear; with ``reduce_range`` the same computation to [0, 127]),
    MatMulInteger with the transposed int8 weights, then the scales and the bias."""
    x = operand(b, n, 0, D.float32)
    if n.attrs["reduce_range"]:
        xq, xs, xz = _dynamic_quantize(b, x, 127)
    else:
        xq, xs, xz = b.op("DynamicQuantizeLinear", [x], n_out=3)
    w = _init(b, n.ins[1])
    wt = b.const(np.ascontiguousarray(w.T)) if w is not None else \
        b.op("Transpose", [n.ins[1]], perm=[1, 0])
    acc = b.op("MatMulInteger", [xq, wt, xz])
    y = b.op("Mul", [b.op("Cast", [acc], to=1),
                     b.op("Mul", [xs, operand(b, n, 2, D.float32)])])
    if n.ins[3] is not None:
        y = b.op("Add", [y, operand(b, n, 3, D.float32)])
    return y


def _dynamic_quantize(b, x: str, qmax: int):
    """(uint8 x, scale, zero point) with PyTorch's ``choose_qparams`` over [0, qmax]."""
    zero = b.const(np.float32(0))
    lo = b.op("Min", [b.op("ReduceMin", [x], keepdims=0), zero])
    hi = b.op("Max", [b.op("ReduceMax", [x], keepdims=0), zero])
    s = b.op("Div", [b.op("Sub", [hi, lo]), b.const(np.float32(qmax))])
    s = b.op("Where", [b.op("Equal", [s, zero]), b.const(np.float32(1)), s])
    zp = b.op("Clip", [b.op("Round", [b.op("Div", [b.op("Neg", [lo]), s])]), zero,
                       b.const(np.float32(qmax))])
    zp = b.op("Cast", [zp], to=2)
    q = b.op("QuantizeLinear", [x, s, zp])
    return b.op("Clip", [q, b.const(np.uint8(0)), b.const(np.uint8(qmax))]), s, zp


@export_rule("quantized_add")
def _quantized_add(b, n):
    a = n.attrs
    qdt = n.dtype(0)
    y = b.op("Add", [_dequant(b, n.ins[0], a["a_scale"], a["a_zp"], qdt),
                     _dequant(b, n.ins[1], a["b_scale"], a["b_zp"], qdt)])
    return _requant(b, n, y)


@export_rule("quantized_relu")
def _quantized_relu(b, n):
    """On the integers: the zero point is 0.0, so ReLU clamps below at it."""
    return b.op("Max", [n.ins[0], _zp(b, n.attrs["zero_point"], n.dtype(0))])


@export_rule("quantized_max_pool2d")
def _quantized_max_pool2d(b, n):
    a = n.attrs
    p = list(a["padding"])
    return b.op("MaxPool", [n.ins[0]], kernel_shape=list(a["kernel_size"]),
                strides=list(a["stride"]), pads=p + p)


@export_rule("quantized_adaptive_avg_pool2d")
def _quantized_adaptive_avg_pool2d(b, n):
    """The mean of the integers, rounded half to even (same scale and zero point)."""
    h, w = n.shape(0)[2:]
    oh, ow = n.attrs["output_size"]
    x = b.op("Cast", [n.ins[0]], to=1)
    if (oh, ow) == (1, 1):
        m = b.op("GlobalAveragePool", [x])
    elif isinstance(h, int) and isinstance(w, int) and h % oh == 0 and w % ow == 0:
        m = b.op("AveragePool", [x], kernel_shape=[h // oh, w // ow],
                 strides=[h // oh, w // ow])
    else:
        raise NotImplementedError(f"adaptive average pooling of {h}x{w} to {oh}x{ow} "
                                  "(unequal windows)")
    return b.op("Cast", [b.op("Round", [m])], to=2 if n.dtype(0) is D.quint8 else 3)


@export_rule("quantized_cat")
def _quantized_cat(b, n):
    a = n.attrs
    qdt = n.dtype(0)
    parts = [_dequant(b, x, s, z, qdt) for x, s, z in zip(n.ins, a["scales"],
                                                           a["zero_points"])]
    y = b.op("Concat", parts, axis=a["dim"])
    return _quant(b, y, a["out_scale"], a["out_zp"], qdt)


# ---- import ------------------------------------------------------------------------------

def _as_quantized(t: Tensor) -> Tensor:
    """An int8/uint8/int32 tensor seen as the quantized dtype of the same integers."""
    if t.dtype in _INT:
        return t
    q = None if t.dtype.is_floating_point else _QOF.get(np.dtype(t.dtype.np))
    if q is None:
        raise NotImplementedError(f"of a {t.dtype} tensor (expected int8, uint8 or int32)")
    return Tensor._make(t._data, q, t._device, t._shape)


def _as_int(t: Tensor) -> Tensor:
    return Tensor._make(t._data, _int_dtype(t.dtype), t._device, t._shape)


def _known(*ts) -> bool:
    """Every tensor is a constant whose value the import can read."""
    return all(t is None or not is_symbolic(t) for t in ts)


def _item(t: Tensor | None, default=0):
    return default if t is None else t._to_numpy().reshape(-1)[0].item()


def _unblocked(c) -> None:
    if c.attr("block_size", 0):
        raise NotImplementedError("with block_size (blocked quantization) is not supported")


@import_rule("QuantizeLinear", since=10)
def _import_quantize(c, x, scale, zp=None):
    _unblocked(c)
    qdt = D.quint8 if zp is None else _QOF.get(np.dtype(zp.dtype.np))
    if qdt is None or qdt is D.qint32:
        raise NotImplementedError(f"to {zp.dtype} (tessera quantizes to int8 or uint8)")
    if scale.dim() == 0 and _known(scale, zp):
        q = Q.quantize_per_tensor(x.float(), _item(scale), int(_item(zp)), qdt)
    else:
        axis = c.axis("axis", x.dim(), 1)
        q = Q.quantize_per_channel(x.float(), scale, _zero_points(zp, scale, np.int64), axis,
                                   qdt)
    return _as_int(q)


@import_rule("DequantizeLinear", since=10)
def _import_dequantize(c, x, scale, zp=None):
    _unblocked(c)
    q = _as_quantized(x)
    if scale.dim() == 0 and _known(scale, zp):
        return dispatch(Q._DEQUANTIZE, q, scale=float(_item(scale)),
                        zero_point=int(_item(zp)))
    axis = c.axis("axis", x.dim(), 1)
    return dispatch(Q._DEQUANTIZE_PC, q, scale, _zero_points(zp, scale, np.int32), axis=axis)


def _zero_points(zp, scale, dtype) -> Tensor:
    """Per-channel zero points as ``dtype`` (a constant stays a constant: no cast node)."""
    if zp is None:
        return Tensor._from_numpy(np.zeros(scale.shape, dtype))
    if not is_symbolic(zp):
        return Tensor._from_numpy(zp._to_numpy().astype(dtype))
    return zp.to(D.from_numpy_dtype(np.dtype(dtype)))


def _dq(x, scale, zp):
    """The float values of integers ``x`` (per tensor or along axis 0 for 1-D scales)."""
    if scale.dim() == 0:
        return (x.to(D.int32) - (0 if zp is None else zp.to(D.int32))).float() * scale
    shape = (-1,) + (1,) * (x.dim() - 1)
    z = 0 if zp is None else zp.to(D.int32).reshape(shape)
    return (x.to(D.int32) - z).float() * scale.reshape(shape)


def _q(y, scale, zp):
    qdt = _QOF[np.dtype(zp.dtype.np)] if zp is not None else D.quint8
    lo, hi = Q._RANGE[qdt]
    z = 0.0 if zp is None else zp.float()
    return (y / scale).round().add(z).clamp(lo, hi).to(_int_dtype(qdt))


def _direct(x, w, wz, *scalars) -> bool:
    """Whether tessera's INT8 kernels take these operands as they are."""
    return (x.dtype is D.uint8 and w.dtype is D.int8 and _known(wz, *scalars)
            and (wz is None or not wz._to_numpy().any())
            and all(s is None or s.dim() == 0 for s in scalars))


@import_rule("QLinearConv")
def _import_qlinear_conv(c, x, xs, xz, w, ws, wz, ys, yz, bias=None):
    from tessera.onnx.converters.nn import _pads
    nd = x.dim() - 2
    kernel = c.attr("kernel_shape") or list(w.shape[2:])
    strides = c.attr("strides") or [1] * nd
    dil = c.attr("dilations") or [1] * nd
    pads = _pads(c, x, kernel, strides, dil)
    group = c.attr("group", 1)
    acc = ws.float() * xs.float()
    bf = None if bias is None else bias.float() * acc
    if nd == 2 and all(lo == hi for lo, hi in pads) and _direct(x, w, wz, xs, xz, ys, yz):
        scales = ws.float().reshape(-1).expand(w.shape[0]).contiguous()
        t = dispatch(Q._QCONV, _as_quantized(x), _as_quantized(w), scales,
                     bf, stride=tuple(strides), padding=tuple(p[0] for p in pads),
                     dilation=tuple(dil), groups=int(group), x_scale=float(_item(xs)),
                     x_zp=int(_item(xz)), out_scale=float(_item(ys)), out_zp=int(_item(yz)),
                     relu=False)
        return _as_int(t)
    y = dispatch(REGISTRY["conv"], _dq(x, xs, xz), _dq(w, ws, wz), bf,
                 stride=tuple(strides), pads=pads, dilation=tuple(dil), groups=group)
    return _q(y, ys, yz)


@import_rule("QLinearMatMul")
def _import_qlinear_matmul(c, a, as_, az, b, bs, bz, ys, yz):
    from tessera.ops.linalg import matmul
    if b.dim() == 2 and _direct(a, b, bz, as_, az, ys, yz, bs):
        w = b.transpose(0, 1).contiguous() if is_symbolic(b) else \
            Tensor._from_numpy(np.ascontiguousarray(b._to_numpy().T))
        scales = Tensor._from_numpy(np.full(w.shape[0], _item(bs), np.float32))
        t = dispatch(Q._QLINEAR, _as_quantized(a), _as_quantized(w), scales, None,
                     x_scale=float(_item(as_)), x_zp=int(_item(az)),
                     out_scale=float(_item(ys)), out_zp=int(_item(yz)), relu=False)
        return _as_int(t)
    fa = _dq(a, as_, az)
    fb = (b.to(D.int32) - (0 if bz is None else bz.to(D.int32))).float() * bs
    return _q(matmul(fa, fb), ys, yz)


@import_rule("MatMulInteger")
def _import_matmul_integer(c, a, b, az=None, bz=None):
    from tessera.ops.linalg import matmul
    ia = a.to(D.int32) - (0 if az is None else az.to(D.int32))
    ib = b.to(D.int32) - (0 if bz is None else bz.to(D.int32))
    return matmul(ia, ib)


@import_rule("ConvInteger")
def _import_conv_integer(c, x, w, xz=None, wz=None):
    """The int32 sums, as a float64 convolution of the integers (exact below 2**53)."""
    from tessera.onnx.converters.nn import _pads
    nd = x.dim() - 2
    kernel = c.attr("kernel_shape") or list(w.shape[2:])
    strides = c.attr("strides") or [1] * nd
    dil = c.attr("dilations") or [1] * nd
    fx = (x.to(D.int32) - (0 if xz is None else xz.to(D.int32))).double()
    fw = (w.to(D.int32) - (0 if wz is None else _dq_shape(wz, w))).double()
    y = dispatch(REGISTRY["conv"], fx, fw, None, stride=tuple(strides),
                 pads=_pads(c, x, kernel, strides, dil), dilation=tuple(dil),
                 groups=c.attr("group", 1))
    return y.to(D.int32)


def _dq_shape(zp, w):
    """A weight zero point: one for all, or one per output channel."""
    z = zp.to(D.int32)
    return z if z.dim() == 0 else z.reshape((-1,) + (1,) * (w.dim() - 1))


@import_rule("DynamicQuantizeLinear", since=11)
def _import_dynamic_quantize(c, x):
    from tessera.ops.reduce import amax, amin
    lo = amin(x).clamp(max=0.0)
    hi = amax(x).clamp(min=0.0)
    s = (hi - lo) / 255.0
    s = s + (s == 0).float()  # a zero range quantizes with scale 1
    zp = (-lo / s).round().clamp(0, 255)
    q = (x / s).round().add(zp).clamp(0, 255)
    return q.to(D.uint8), s, zp.to(D.uint8)


# ---- onnxruntime's QOperator contrib ops (com.microsoft) ---------------------------------
# ``quantize_static(..., quant_format=QOperator)`` writes these next to QLinearConv: the
# residual adds, the global pooling, the classifier and a few activations. Each imports as
# tessera's INT8 op where one computes it, else as dequantize-compute-quantize in float32.

MS_DOMAIN = "com.microsoft"


@functools.cache
def register_schemas() -> None:
    """Register the schemas of onnxruntime's quantized contrib ops with ``onnx`` (once).

    >>> register_schemas()
    >>> from onnx import defs
    >>> defs.has("QLinearAdd", MS_DOMAIN)
    True
    """
    from onnx import defs
    if defs.has("QLinearAdd", MS_DOMAIN):
        return
    S = defs.OpSchema
    opt, var = S.FormalParameterOption.Optional, S.FormalParameterOption.Variadic

    def p(name, t, optional=False):
        return S.FormalParameter(name, t, param_option=opt if optional else
                                 S.FormalParameterOption.Single)
    q8 = [("T", ["tensor(uint8)", "tensor(int8)"], "8-bit integers")]
    f = "tensor(float)"

    def schema(name, inputs, outputs, types=q8, attrs=()):
        defs.register_schema(S(name, MS_DOMAIN, 1, doc=f"onnxruntime's {name}.",
                               inputs=inputs, outputs=outputs, type_constraints=types,
                               attributes=[S.Attribute(a, k, "", required=False)
                                           for a, k in attrs]))
    unary = [p("X", "T"), p("X_scale", f), p("X_zero_point", "T", True), p("Y_scale", f),
             p("Y_zero_point", "T", True)]
    schema("QLinearAdd", [p("A", "T"), p("A_scale", f), p("A_zero_point", "T", True),
                          p("B", "T"), p("B_scale", f), p("B_zero_point", "T", True),
                          p("C_scale", f), p("C_zero_point", "T", True)], [p("C", "T")])
    schema("QLinearSigmoid", unary, [p("Y", "T")])
    schema("QLinearLeakyRelu", unary, [p("Y", "T")], attrs=[("alpha", S.AttrType.FLOAT)])
    schema("QLinearGlobalAveragePool", [p("X", "T"), p("x_scale", f), p("x_zero_point", "T"),
                                        p("y_scale", f), p("y_zero_point", "T")],
           [p("Y", "T")], attrs=[("channels_last", S.AttrType.INT)])
    schema("QLinearConcat", [p("Y_scale", f), p("Y_zero_point", "T"),
                             S.FormalParameter("inputs", "TV", param_option=var,
                                               is_homogeneous=False)],
           [p("Y", "T")], types=q8 + [("TV", ["tensor(uint8)", "tensor(int8)", f],
                                       "the inputs, scales and zero points")],
           attrs=[("axis", S.AttrType.INT)])
    i8 = ["tensor(uint8)", "tensor(int8)"]
    schema("QGemm", [p("A", "TA"), p("a_scale", f), p("a_zero_point", "TA"), p("B", "TB"),
                     p("b_scale", f), p("b_zero_point", "TB"), p("C", "TC", True),
                     p("y_scale", f, True), p("y_zero_point", "TYZ", True)], [p("Y", "TR")],
           types=[("TA", i8, ""), ("TB", i8, ""), ("TC", ["tensor(int32)"], ""),
                  ("TYZ", i8, ""), ("TR", i8 + [f], "")],
           attrs=[("alpha", S.AttrType.FLOAT), ("transA", S.AttrType.INT),
                  ("transB", S.AttrType.INT)])


def _scalars(*ts) -> bool:
    return _known(*ts) and all(t is None or t.numel() == 1 for t in ts)


@import_rule("QLinearAdd")
def _import_qlinear_add(c, a, as_, az, b, bs, bz, cs, cz=None):
    if a.shape == b.shape and a.dtype is b.dtype and _scalars(as_, az, bs, bz, cs, cz):
        t = dispatch(Q._QADD, _as_quantized(a), _as_quantized(b), a_scale=float(_item(as_)),
                     a_zp=int(_item(az)), b_scale=float(_item(bs)), b_zp=int(_item(bz)),
                     out_scale=float(_item(cs)), out_zp=int(_item(cz)), relu=False)
        return _as_int(t)
    return _q(_dq(a, as_, az) + _dq(b, bs, bz), cs, _zp_like(cz, a))


def _zp_like(zp, x):
    """An absent output zero point: 0 of the input's integer type."""
    return zp if zp is not None else Tensor._from_numpy(np.zeros((), x.dtype.np))


@import_rule("QLinearGlobalAveragePool")
def _import_qlinear_gap(c, x, xs, xz, ys, yz):
    dims = tuple(range(1, x.dim() - 1)) if c.attr("channels_last", 0) else \
        tuple(range(2, x.dim()))
    return _q(_dq(x, xs, xz).mean(dim=dims, keepdim=True), ys, yz)


@import_rule("QLinearSigmoid")
def _import_qlinear_sigmoid(c, x, xs, xz, ys, yz=None):
    return _q(_dq(x, xs, xz).sigmoid(), ys, _zp_like(yz, x))


@import_rule("QLinearLeakyRelu")
def _import_qlinear_leaky_relu(c, x, xs, xz, ys, yz=None):
    from tessera.nn.functional import leaky_relu
    return _q(leaky_relu(_dq(x, xs, xz), c.attr("alpha", 0.01)), ys, _zp_like(yz, x))


@import_rule("QLinearConcat")
def _import_qlinear_concat(c, ys, yz, *inputs):
    from tessera.ops.shape import cat
    xs = [_dq(inputs[k], inputs[k + 1], inputs[k + 2]) for k in range(0, len(inputs), 3)]
    return _q(cat(xs, c.axis("axis", inputs[0].dim())), ys, yz)


@import_rule("QGemm")
def _import_qgemm(c, a, as_, az, b, bs, bz, bias=None, ys=None, yz=None):
    """``alpha * A @ B`` (each transposed where asked) plus the int32 bias ``C`` (of scale
    ``alpha * a_scale * b_scale``), requantized to ``y_scale`` or float without it."""
    from tessera.ops.linalg import matmul
    alpha = float(c.attr("alpha", 1.0))
    if c.attr("transA", 0):
        a = a.transpose(0, 1)
    acc = as_.float() * bs.float() * alpha
    bf = None if bias is None else bias.float() * acc
    wq = b if c.attr("transB", 0) else b.transpose(0, 1)   # (N, K)
    if ys is not None and alpha == 1.0 and a.dim() == 2 and \
            _direct(a, wq, bz, as_, az, ys, yz) and bs.numel() in (1, wq.shape[0]):
        w = wq.contiguous() if is_symbolic(wq) else \
            Tensor._from_numpy(np.ascontiguousarray(wq._to_numpy()))
        scales = bs.float().reshape(-1).expand(w.shape[0]).contiguous()
        t = dispatch(Q._QLINEAR, _as_quantized(a), _as_quantized(w), scales,
                     None if bf is None else bf.reshape(-1),
                     x_scale=float(_item(as_)), x_zp=int(_item(az)),
                     out_scale=float(_item(ys)), out_zp=int(_item(yz)), relu=False)
        return _as_int(t)
    fa = _dq(a, as_, az)
    fw = _dq(wq, bs, bz)   # per output channel along axis 0 of (N, K)
    y = matmul(fa, fw.transpose(0, 1)) * alpha
    if bf is not None:
        y = y + bf
    return y if ys is None else _q(y, ys, yz)
