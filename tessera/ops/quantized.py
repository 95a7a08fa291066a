"""Quantization: fake quantization (for training), quantize and dequantize, and the INT8
ops of quantized inference, PyTorch's ``torch.fake_quantize_*``, ``torch.quantize_*``
and ``torch.ops.quantized.*``.

A quantized tensor (``QTensor``: dtype ``qint8``, ``quint8`` or ``qint32``) holds integers
``q`` meaning ``(q - zero_point) * scale``, with one scale and zero point (per tensor) or
one per slice along ``axis`` (per channel). The ops read and write the integers; the
scales and zero points are attributes (per tensor) or float/int tensors (per channel).

Fake quantization rounds in float exactly as quantize-then-dequantize would, and its
gradient is the straight-through estimator with PyTorch's clipping mask: the incoming
gradient where ``zero_point + round(x / scale)`` falls in ``[quant_min, quant_max]``, zero
elsewhere. The learnable form (LSQ) also differentiates scale and zero point.

The quantized products (``linear``, ``conv2d``) run on the INT8 kernels of
``tessera.kernels.int8``: uint8 activations times int8 weights summed in int32, the bias
quantized to int32 with scale ``x_scale * w_scale``, and the sum requantized to the
output's scale and zero point (rounded half to even, clamped; ReLU fused).

>>> import tessera
>>> q = tessera.quantize_per_tensor(tessera.tensor([-1.0, 0.0, 0.26]), 0.1, 10, tessera.quint8)
>>> q.int_repr().tolist(), q.dequantize().tolist()
([0, 10, 13], [-1.0, 0.0, 0.30000001192092896])
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.ops import _relax, cost
from tessera.ops.registry import Meta, defop
from tessera.sbp import SbpRule, Signature, broadcast as B, split as S

__all__ = ["qint8", "quint8", "qint32", "QTensor", "per_tensor_affine", "per_channel_affine",
           "per_tensor_symmetric", "per_channel_symmetric", "quantize_per_tensor",
           "quantize_per_channel", "dequantize", "fake_quantize_per_tensor_affine",
           "fake_quantize_per_channel_affine", "_fake_quantize_learnable_per_tensor_affine",
           "_fake_quantize_learnable_per_tensor_affine_backward"]

qint8, quint8, qint32 = D.qint8, D.quint8, D.qint32
_RANGE = {qint8: (-128, 127), quint8: (0, 255), qint32: (-(1 << 31), (1 << 31) - 1)}


class qscheme:
    """A quantization scheme (``tessera.per_tensor_affine``...), compared by identity."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"tessera.{self.name}"

    def __reduce__(self):  # copies and pickles are the singleton it is
        return (_qscheme_by_name, (self.name,))


def _qscheme_by_name(name: str) -> qscheme:
    return globals()[name]


per_tensor_affine = qscheme("per_tensor_affine")
per_channel_affine = qscheme("per_channel_affine")
per_tensor_symmetric = qscheme("per_tensor_symmetric")
per_channel_symmetric = qscheme("per_channel_symmetric")


# ---- the quantized tensor ---------------------------------------------------------------

class QTensor(Tensor):
    """A quantized tensor: integers and the scale(s) and zero point(s) that give them
    meaning. ``int_repr()`` is the integers as a plain tensor; ``dequantize()`` the floats.

    >>> import tessera
    >>> q = tessera.quantize_per_tensor(tessera.ones(2), 0.5, 0, tessera.qint8)
    >>> q.dtype, q.q_scale(), q.q_zero_point(), q.qscheme()
    (tessera.qint8, 0.5, 0, tessera.per_tensor_affine)
    """

    _qscale: Any     # a float, or a float64 tensor of one scale per channel
    _qzp: Any        # an int, or an int64 tensor
    _qaxis: int | None

    @staticmethod
    def _wrap(t: Tensor, scale, zero_point, axis: int | None = None) -> QTensor:
        q = object.__new__(QTensor)
        for k in Tensor.__slots__[:-2]:
            object.__setattr__(q, k, getattr(t, k))
        q._qscale, q._qzp, q._qaxis = scale, zero_point, axis
        return q

    is_quantized = True

    def int_repr(self) -> Tensor:
        int_dt = {qint8: D.int8, quint8: D.uint8, qint32: D.int32}[self._dtype]
        return Tensor._make(self._data, int_dt, self._device, self._shape)

    def qscheme(self) -> qscheme:
        return per_tensor_affine if self._qaxis is None else per_channel_affine

    def _per_tensor(self, what: str) -> None:
        if self._qaxis is not None:
            raise RuntimeError(f"Expected quantizer->qscheme() == kPerTensorAffine to be true, "
                               f"but got false. ({what} of a per-channel quantized tensor)")

    def q_scale(self) -> float:
        self._per_tensor("q_scale")
        return float(self._qscale)

    def q_zero_point(self) -> int:
        self._per_tensor("q_zero_point")
        return int(self._qzp)

    def q_per_channel_scales(self) -> Tensor:
        return self._qscale.to(D.float64)

    def q_per_channel_zero_points(self) -> Tensor:
        return self._qzp.to(D.int64)

    def q_per_channel_axis(self) -> int:
        if self._qaxis is None:
            raise RuntimeError("Expected quantizer->qscheme() == kPerChannelAffine to be "
                               "true, but got false. (q_per_channel_axis of a per-tensor "
                               "quantized tensor)")
        return self._qaxis

    def dequantize(self) -> Tensor:
        if self._qaxis is None:
            return dispatch(_DEQUANTIZE, self, scale=float(self._qscale),
                            zero_point=int(self._qzp))
        return dispatch(_DEQUANTIZE_PC, self, self._qscale, self._qzp, axis=self._qaxis)

    # ---- what keeps a tensor quantized (PyTorch's quantized CPU kernels) --------------
    def _like(self, ints: Tensor) -> QTensor:
        """``ints`` (of this tensor's integer type) with this tensor's qparams."""
        t = Tensor._make(ints._data, self._dtype, ints._device, ints._shape)
        return QTensor._wrap(t, self._qscale, self._qzp, self._qaxis)

    def _reshaped(self, what: str, fn) -> QTensor:
        self._per_tensor(what)  # a per-channel axis has no meaning after a reshape
        return self._like(fn(self.int_repr()))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> QTensor:
        return self._reshaped("flatten", lambda t: t.flatten(start_dim, end_dim))

    def reshape(self, *shape) -> QTensor:
        return self._reshaped("reshape", lambda t: t.reshape(*shape))

    def view(self, *shape) -> QTensor:
        return self._reshaped("view", lambda t: t.view(*shape))

    def relu(self) -> QTensor:
        return relu(self)

    def __repr__(self) -> str:
        body = repr(self.dequantize())[:-1]
        if self._qaxis is None:
            q = f"quantization_scheme={per_tensor_affine}, scale={self.q_scale()}, " \
                f"zero_point={self.q_zero_point()}"
        else:
            q = f"quantization_scheme={per_channel_affine}, scale={self._qscale}, " \
                f"zero_point={self._qzp}, axis={self._qaxis}"
        return f"{body}, size={tuple(self._shape)}, dtype={self._dtype}, {q})"

    def __reduce_ex__(self, proto):
        return (_rebuild, (self.int_repr(), self._dtype.name, self._qscale, self._qzp,
                           self._qaxis))


def _rebuild(ints: Tensor, dtype: str, scale, zero_point, axis) -> QTensor:
    t = Tensor._make(ints._data, D._by_name(dtype), ints._device, ints._shape)
    return QTensor._wrap(t, scale, zero_point, axis)


def _qdtype(dtype, op: str) -> D.dtype:
    d = D.as_dtype(dtype)
    if d not in _RANGE:
        raise RuntimeError(f"{op}(): expected a quantized dtype (qint8, quint8, qint32), "
                           f"got {d}")
    return d


def _float_in(x, op: str) -> Meta:
    if type(x) is not Meta:
        raise TypeError(f"{op}(): argument 'input' (position 1) must be Tensor, not "
                        f"{type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"{op}(): expected a floating-point input, got {x.dtype}")
    return x


def _check_range(op: str, quant_min: int, quant_max: int) -> None:
    if quant_min > quant_max:
        raise RuntimeError(f"`quant_min` should be less than or equal to `quant_max`. "
                           f"({op}: quant_min={quant_min}, quant_max={quant_max})")


def _compute(x: np.ndarray) -> np.ndarray:
    """x in the type PyTorch's kernels compute in: float32, or float64 for float64."""
    return x if x.dtype == np.float64 else x.astype(np.float32, copy=False)


def _scalar(v, op: str, name: str):
    if isinstance(v, Tensor):
        if v.numel() != 1:
            raise RuntimeError(f"{op}(): {name} must be a one-element tensor, got shape "
                               f"{tuple(v.shape)}")
        return v.item()
    return v


# ---- SBP and cost vocabulary ------------------------------------------------------------

def _pointwise_sbp(nparams: int = 0, axis_attr: str | None = None):
    """Split any dim of the input (the per-channel parameters whole, or split with it
    along the channel axis), or all broadcast."""
    def rule(x, *params, **attrs):
        n = len(x.shape)
        axis = attrs.get(axis_attr) if axis_attr else None
        sigs = []
        for d in range(n):
            ps = (S(0) if axis is not None and d == axis % n else B,) * len(params)
            sigs.append(Signature((S(d),) + ps, (S(d),)))
        sigs.append(Signature((B,) * (1 + len(params)), (B,)))
        return sigs
    return SbpRule(rule)


def _batch_sbp(ninputs: int, nout: int = 1):
    """Split the batch (dim 0) of the first input, the others whole; or all broadcast."""
    def rule(*metas, **attrs):
        ins = tuple(None if m is None else B for m in metas)
        return [Signature((S(0),) + ins[1:], (S(0),) * nout), Signature(ins, (B,) * nout)]
    return SbpRule(rule)


# ---- compiler rules ---------------------------------------------------------------------
# The integer arithmetic exactly as the kernels do it: float32 products and sums (float64
# for a float64 input), NumPy's round half to even, the clamp, then the integer dtype.

def _jx_c(jnp, x):
    return x if x.dtype == jnp.float64 else x.astype(jnp.float32)


def _jx_channel(v, ndim: int, axis: int):
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return v.reshape(shape)


def _jx_fq(jnp, x, inv, scale, zp, qmin, qmax):
    c = _jx_c(jnp, x)
    q = jnp.round(c * jnp.asarray(inv, c.dtype)) + jnp.asarray(zp, c.dtype)
    mask = (q >= qmin) & (q <= qmax)
    return ((jnp.clip(q, qmin, qmax) - jnp.asarray(zp, c.dtype)) * jnp.asarray(scale, c.dtype),
            mask)


def _jax_fq_pt(jnp, lax, a, at):
    s = np.float32(at["scale"])
    return _jx_fq(jnp, a[0], np.float32(1.0) / s, s, at["zero_point"], at["quant_min"],
                  at["quant_max"])


def _jx_zp(jnp, zp):
    return jnp.round(zp) if jnp.issubdtype(zp.dtype, jnp.floating) else zp


def _jax_fq_pc(jnp, lax, a, at):
    x, scale, zp = a
    n, axis = x.ndim, at["axis"]
    s = _jx_channel(scale.astype(jnp.float32), n, axis)
    return _jx_fq(jnp, x, jnp.float32(1.0) / s, s, _jx_channel(_jx_zp(jnp, zp), n, axis),
                  at["quant_min"], at["quant_max"])


def _jx_quantize(jnp, v, zp, dtype: str):
    lo, hi = _RANGE[D._by_name(dtype)]
    return jnp.clip(jnp.round(v) + zp, lo, hi).astype(D._by_name(dtype).np)


def _jax_qpt(jnp, lax, a, at):
    s = np.float32(at["scale"])
    v = a[0].astype(jnp.float32) * (np.float32(1.0) / s)
    return _jx_quantize(jnp, v, jnp.float32(at["zero_point"]), at["dtype"])


def _jax_qpc(jnp, lax, a, at):
    x, scale, zp = a
    n, axis = x.ndim, at["axis"]
    v = x.astype(jnp.float32) / _jx_channel(scale.astype(jnp.float32), n, axis)
    return _jx_quantize(jnp, v, _jx_channel(zp, n, axis).astype(jnp.float32), at["dtype"])


def _jx_deq(jnp, q, zp, scale):
    return (q.astype(jnp.int32) - zp).astype(jnp.float32) * scale


def _jax_deq(jnp, lax, a, at):
    return _jx_deq(jnp, a[0], jnp.int32(at["zero_point"]), jnp.float32(at["scale"]))


def _jax_deq_pc(jnp, lax, a, at):
    q, scale, zp = a
    n, axis = q.ndim, at["axis"]
    return _jx_deq(jnp, q, _jx_channel(zp.astype(jnp.int32), n, axis),
                   _jx_channel(scale.astype(jnp.float32), n, axis))


def _add_range(dtype: str, out_zp: int, relu: bool):
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    return (max(lo, out_zp) if relu else lo), hi


def _jax_qadd(jnp, lax, a, at):
    x, y = a
    f = _jx_deq(jnp, x, jnp.int32(at["a_zp"]), jnp.float32(at["a_scale"])) + \
        _jx_deq(jnp, y, jnp.int32(at["b_zp"]), jnp.float32(at["b_scale"]))
    lo, hi = _add_range(str(x.dtype), at["out_zp"], at["relu"])
    v = jnp.round(f / jnp.float32(at["out_scale"])) + jnp.float32(at["out_zp"])
    return jnp.clip(v, lo, hi).astype(x.dtype)


def _jax_qcat(jnp, lax, a, at):
    lo, hi = (0, 255) if str(a[0].dtype) == "uint8" else (-128, 127)
    parts = [jnp.clip(jnp.round(_jx_deq(jnp, x, jnp.int32(z), jnp.float32(s))
                                / jnp.float32(at["out_scale"])) + jnp.float32(at["out_zp"]),
                      lo, hi).astype(x.dtype)
             for x, s, z in zip(a, at["scales"], at["zero_points"])]
    return jnp.concatenate(parts, axis=at["dim"])


def _jax_qmaxpool(jnp, lax, a, at):
    x = a[0]
    (kh, kw), (sh, sw), (ph, pw) = at["kernel_size"], at["stride"], at["padding"]
    low = np.iinfo(np.dtype(str(x.dtype))).min
    return lax.reduce_window(x, np.array(low, x.dtype), lax.max, (1, 1, kh, kw),
                             (1, 1, sh, sw), ((0, 0), (0, 0), (ph, ph), (pw, pw)))


def _rx_channel(R, v, ndim: int, axis: int):
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return R.reshape(v, shape)


def _rx_c(R, x):
    return x if R.dtype(x) == "float64" else R.astype(x, "float32")


def _rx_fq(R, x, inv, scale, zp, qmin, qmax):
    c = _rx_c(R, x)
    dt = R.dtype(c)
    cast = (lambda v: R.astype(v, dt) if R.dtype(v) != dt else v)
    zp = R.emit(cast(zp))
    q = R.emit(R.add(_relax.round_(R, [R.multiply(c, cast(inv))], {}), zp))
    mask = R.logical_and(R.greater_equal(q, R.const(qmin, dt)), R.less_equal(q, R.const(qmax, dt)))
    out = R.multiply(R.subtract(R.clip(q, qmin, qmax), zp), cast(scale))
    return out, mask


def _relax_fq_pt(R, a, at):
    s = np.float32(at["scale"])
    return _rx_fq(R, a[0], R.const(np.float32(1.0) / s, "float32"), R.const(s, "float32"),
                  R.const(at["zero_point"], "float32"), at["quant_min"], at["quant_max"])


def _relax_fq_pc(R, a, at):
    x, scale, zp = a
    n, axis = len(R.shape(x)), at["axis"]
    s = R.emit(_rx_channel(R, R.astype(scale, "float32"), n, axis))
    if R.dtype(zp).startswith("float"):
        zp = _relax.round_(R, [zp], {})
    return _rx_fq(R, x, R.divide(R.const(1.0, "float32"), s), s,
                  _rx_channel(R, zp, n, axis), at["quant_min"], at["quant_max"])


def _rx_quantize(R, v, zp, dtype: str):
    lo, hi = _RANGE[D._by_name(dtype)]
    q = R.add(_relax.round_(R, [v], {}), zp)
    return R.astype(R.clip(q, lo, hi), str(D._by_name(dtype).np))


def _relax_qpt(R, a, at):
    s = np.float32(at["scale"])
    v = R.multiply(R.astype(a[0], "float32"), R.const(np.float32(1.0) / s, "float32"))
    return _rx_quantize(R, v, R.const(at["zero_point"], "float32"), at["dtype"])


def _relax_qpc(R, a, at):
    x, scale, zp = a
    n, axis = len(R.shape(x)), at["axis"]
    v = R.divide(R.astype(x, "float32"), _rx_channel(R, R.astype(scale, "float32"), n, axis))
    return _rx_quantize(R, v, _rx_channel(R, R.astype(zp, "float32"), n, axis), at["dtype"])


def _rx_deq(R, q, zp, scale):
    return R.multiply(R.astype(R.subtract(R.astype(q, "int32"), zp), "float32"), scale)


def _relax_deq(R, a, at):
    return _rx_deq(R, a[0], R.const(at["zero_point"], "int32"),
                   R.const(np.float32(at["scale"]), "float32"))


def _relax_deq_pc(R, a, at):
    q, scale, zp = a
    n, axis = len(R.shape(q)), at["axis"]
    return _rx_deq(R, q, _rx_channel(R, R.astype(zp, "int32"), n, axis),
                   _rx_channel(R, R.astype(scale, "float32"), n, axis))


def _rx_requantize(R, f, out_scale, out_zp, lo, hi, dtype):
    v = _relax.round_(R, [R.divide(f, R.const(np.float32(out_scale), "float32"))], {})
    return R.astype(R.clip(R.add(v, R.const(out_zp, "float32")), lo, hi), dtype)


def _relax_qadd(R, a, at):
    x, y = a
    f = R.add(_rx_deq(R, x, R.const(at["a_zp"], "int32"),
                      R.const(np.float32(at["a_scale"]), "float32")),
              _rx_deq(R, y, R.const(at["b_zp"], "int32"),
                      R.const(np.float32(at["b_scale"]), "float32")))
    lo, hi = _add_range(R.dtype(x), at["out_zp"], at["relu"])
    return _rx_requantize(R, f, at["out_scale"], at["out_zp"], lo, hi, R.dtype(x))


def _relax_qcat(R, a, at):
    lo, hi = (0, 255) if R.dtype(a[0]) == "uint8" else (-128, 127)
    parts = [_rx_requantize(R, _rx_deq(R, x, R.const(z, "int32"),
                                       R.const(np.float32(s), "float32")),
                            at["out_scale"], at["out_zp"], lo, hi, R.dtype(x))
             for x, s, z in zip(a, at["scales"], at["zero_points"])]
    return R.concat(parts, at["dim"])


def _relax_qmaxpool(R, a, at):
    x = a[0]
    (ph, pw) = at["padding"]
    low = int(np.iinfo(np.dtype(R.dtype(x))).min)
    if ph or pw:
        x = R.nn.pad(x, [0, 0, 0, 0, ph, ph, pw, pw], "constant", low)
    return R.nn.max_pool2d(x, list(at["kernel_size"]), list(at["stride"]), [0, 0, 0, 0])


def _jx_qparams(jnp, w_scale, bias, x_scale, out_scale):
    """``_qparams_of`` on the graph's tensors: the float32 multipliers and the int32 bias."""
    acc = jnp.float64(x_scale) * w_scale.astype(jnp.float64)
    mult = (acc / (out_scale if out_scale is not None else 1.0)).astype(jnp.float32)
    b = None if bias is None else \
        jnp.round(bias.astype(jnp.float64) / acc).astype(jnp.int32)
    return mult, b


def _jx_requant(jnp, acc, wsum, at, mult, b, shape):
    """``int8.reference``'s epilogue on int32 sums ``acc`` (output channels along
    ``shape``'s -1 axis)."""
    acc = acc - jnp.int32(at["x_zp"]) * wsum.reshape(shape)
    if b is not None:
        acc = acc + b.reshape(shape)
    v = acc.astype(jnp.float32) * mult.reshape(shape)
    zp = at["out_zp"]
    lo, hi = (max(0, zp) if at["relu"] else 0), 255
    q = jnp.clip(jnp.round(v), jnp.float32(lo - zp), jnp.float32(hi - zp))
    return (q.astype(jnp.int32) + zp).astype(jnp.uint8)


def _jax_qlinear(jnp, lax, a, at):
    x, w, w_scale, bias = a
    mult, b = _jx_qparams(jnp, w_scale, bias, at["x_scale"], at["out_scale"])
    w32 = w.astype(jnp.int32)
    acc = jnp.matmul(x.astype(jnp.int32), w32.T, preferred_element_type=jnp.int32)
    return _jx_requant(jnp, acc, w32.sum(1), at, mult, b, (-1,))


def _jax_qconv(jnp, lax, a, at):
    x, w, w_scale, bias = a
    mult, b = _jx_qparams(jnp, w_scale, bias, at["x_scale"], at["out_scale"])
    (ph, pw), zp = at["padding"], at["x_zp"]
    xp = jnp.pad(x.astype(jnp.int32), ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=zp)
    w32 = w.astype(jnp.int32)
    acc = lax.conv_general_dilated(xp, w32, tuple(at["stride"]), "VALID",
                                   rhs_dilation=tuple(at["dilation"]),
                                   feature_group_count=at["groups"],
                                   preferred_element_type=jnp.int32)
    return _jx_requant(jnp, acc, w32.sum((1, 2, 3)), at, mult, b, (1, -1, 1, 1))


def _jax_qavgpool(jnp, lax, a, at):
    x = a[0]
    _, _, h, w = x.shape
    oh, ow = at["output_size"]
    rows = []
    for i in range(oh):
        h0, h1 = (i * h) // oh, -(-((i + 1) * h) // oh)
        row = []
        for j in range(ow):
            w0, w1 = (j * w) // ow, -(-((j + 1) * w) // ow)
            row.append(jnp.round(jnp.mean(x[:, :, h0:h1, w0:w1].astype(jnp.float32),
                                          axis=(-2, -1))))
        rows.append(jnp.stack(row, -1))
    return jnp.stack(rows, -2).astype(x.dtype)


def _jax_qlinear_dyn(jnp, lax, a, at):
    """``_lin_dyn_kernel``: the input's uint8 parameters from its range (``dynamic_qparams``
    in float64, the scale then rounded to float32), then the float32 epilogue."""
    x, w, w_scale, bias = a
    k = x.shape[-1]
    a2 = x.reshape(-1, k)
    qmax = 127 if at["reduce_range"] else 255
    lo = jnp.minimum(jnp.min(a2, initial=0.0).astype(jnp.float64), 0.0)
    hi = jnp.maximum(jnp.max(a2, initial=0.0).astype(jnp.float64), 0.0)
    scale = (hi - lo) / qmax
    scale = jnp.where(scale == 0.0, 1.0, scale)
    zp = jnp.clip(jnp.round(-lo / scale), 0, qmax).astype(jnp.int32)
    s32 = scale.astype(jnp.float32)
    aq = jnp.clip(jnp.round(a2.astype(jnp.float32) * (jnp.float32(1.0) / s32))
                  + zp.astype(jnp.float32), 0, qmax).astype(jnp.int32)
    w32 = w.astype(jnp.int32)
    acc = jnp.matmul(aq, w32.T, preferred_element_type=jnp.int32) - zp * w32.sum(1)
    y = acc.astype(jnp.float32) * (s32 * w_scale.astype(jnp.float32))
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.reshape(x.shape[:-1] + (w.shape[0],))


def _rx_qparams(R, w_scale, bias, x_scale, out_scale):
    acc = R.emit(R.multiply(R.const(x_scale, "float64"), R.astype(w_scale, "float64")))
    mult = R.astype(R.divide(acc, R.const(out_scale if out_scale is not None else 1.0,
                                          "float64")), "float32")
    b = None if bias is None else R.astype(
        _relax.round_(R, [R.divide(R.astype(bias, "float64"), acc)], {}), "int32")
    return mult, b


def _rx_requant(R, acc, wsum, at, mult, b, shape):
    acc = R.subtract(acc, R.multiply(R.const(at["x_zp"], "int32"), R.reshape(wsum, shape)))
    if b is not None:
        acc = R.add(acc, R.reshape(b, shape))
    v = R.multiply(R.astype(acc, "float32"), R.reshape(mult, shape))
    zp = at["out_zp"]
    lo = max(0, zp) if at["relu"] else 0
    q = R.clip(_relax.round_(R, [v], {}), lo - zp, 255 - zp)
    return R.astype(R.add(R.astype(q, "int32"), R.const(zp, "int32")), "uint8")


def _relax_qavgpool(R, a, at):
    x = a[0]
    _, _, h, w = R.shape(x)
    oh, ow = at["output_size"]
    xf = R.emit(R.astype(x, "float32"))
    rows = []
    for i in range(oh):
        h0, h1 = (i * h) // oh, -(-((i + 1) * h) // oh)
        row = []
        for j in range(ow):
            w0, w1 = (j * w) // ow, -(-((j + 1) * w) // ow)
            win = R.strided_slice(xf, [2, 3], [h0, w0], [h1, w1])
            row.append(_relax.round_(R, [R.mean(win, [2, 3], True)], {}))
        rows.append(R.concat(row, 3))
    return R.astype(R.concat(rows, 2), R.dtype(x))


def _relax_qlinear_dyn(R, a, at):
    """``_jax_qlinear_dyn`` in Relax."""
    x, w, w_scale, bias = a
    shape = R.shape(x)
    a2 = R.emit(R.reshape(x, [-1, shape[-1]]))
    qmax = 127 if at["reduce_range"] else 255
    zero = R.const(0.0, "float64")
    lo = R.emit(R.minimum(R.astype(R.min(a2), "float64"), zero))
    hi = R.emit(R.maximum(R.astype(R.max(a2), "float64"), zero))
    scale = R.emit(R.divide(R.subtract(hi, lo), R.const(qmax, "float64")))
    scale = R.emit(R.where(R.equal(scale, zero), R.const(1.0, "float64"), scale))
    zp = R.emit(R.clip(_relax.round_(R, [R.divide(R.negative(lo), scale)], {}), 0, qmax))
    s32 = R.emit(R.astype(scale, "float32"))
    inv = R.divide(R.const(1.0, "float32"), s32)
    q = R.add(_relax.round_(R, [R.multiply(R.astype(a2, "float32"), inv)], {}),
              R.astype(zp, "float32"))
    aq = R.astype(R.clip(q, 0, qmax), "int32")
    w32 = R.emit(R.astype(w, "int32"))
    acc = R.subtract(R.matmul(aq, R.permute_dims(w32, [1, 0]), "int32"),
                     R.multiply(R.astype(zp, "int32"), R.sum(w32, [1])))
    y = R.multiply(R.astype(acc, "float32"), R.multiply(s32, R.astype(w_scale, "float32")))
    if bias is not None:
        y = R.add(y, R.astype(bias, "float32"))
    return R.reshape(y, list(shape[:-1]) + [R.shape(w)[0]])


def _relax_qlinear(R, a, at):
    x, w, w_scale, bias = a
    mult, b = _rx_qparams(R, w_scale, bias, at["x_scale"], at["out_scale"])
    w32 = R.emit(R.astype(w, "int32"))
    acc = R.matmul(R.astype(x, "int32"), R.permute_dims(w32, [1, 0]), "int32")
    return _rx_requant(R, acc, R.sum(w32, [1]), at, mult, b, [-1])


def _relax_qconv(R, a, at):
    x, w, w_scale, bias = a
    mult, b = _rx_qparams(R, w_scale, bias, at["x_scale"], at["out_scale"])
    (ph, pw), zp = at["padding"], at["x_zp"]
    xp = R.astype(x, "int32")
    if ph or pw:
        xp = R.nn.pad(xp, [0, 0, 0, 0, ph, ph, pw, pw], "constant", zp)
    w32 = R.emit(R.astype(w, "int32"))
    acc = R.nn.conv2d(xp, w32, list(at["stride"]), [0, 0, 0, 0], list(at["dilation"]),
                      at["groups"], out_dtype="int32")
    return _rx_requant(R, acc, R.sum(w32, [1, 2, 3]), at, mult, b, [1, -1, 1, 1])


def _jx_lsq_params(jnp, scale, zero_point, qmin, qmax):
    s = scale.reshape(()).astype(jnp.float32)
    zp = jnp.clip(jnp.floor(zero_point.reshape(()).astype(jnp.float32) + jnp.float32(0.5)),
                  qmin, qmax)
    return s, jnp.float32(1.0) / s, zp


def _jax_lsq(jnp, lax, a, at):
    s, inv, zp = _jx_lsq_params(jnp, a[1], a[2], at["quant_min"], at["quant_max"])
    return _jx_fq(jnp, a[0], inv, s, zp, at["quant_min"], at["quant_max"])[0]


def _jax_lsq_backward(jnp, lax, a, at):
    g, x, scale, zero_point = a
    qmin, qmax = at["quant_min"], at["quant_max"]
    s, inv, zp = _jx_lsq_params(jnp, scale, zero_point, qmin, qmax)
    c, gc = _jx_c(jnp, x), _jx_c(jnp, g)
    t = c.dtype
    s, inv, zp = s.astype(t), inv.astype(t), zp.astype(t)
    q = jnp.round(c * inv) + zp
    inside = (q >= qmin) & (q <= qmax)
    xfq = (jnp.clip(q, qmin, qmax) - zp) * s
    end = jnp.where(q < qmin, qmin - zp, qmax - zp)
    gf = jnp.asarray(at["grad_factor"], t)
    ds = jnp.where(inside, gc * (xfq - c) * inv, gc * end) * gf
    dz = jnp.where(inside, jnp.zeros((), t), -gc * s) * gf
    return jnp.where(inside, gc, 0), ds.sum().reshape(1), dz.sum().reshape(1)


def _rx_lsq_params(R, scale, zero_point, qmin, qmax):
    s = R.emit(R.astype(R.reshape(scale, []), "float32"))
    zp = R.floor(R.add(R.astype(R.reshape(zero_point, []), "float32"), R.const(0.5, "float32")))
    return s, R.emit(R.divide(R.const(1.0, "float32"), s)), R.emit(R.clip(zp, qmin, qmax))


def _relax_lsq(R, a, at):
    s, inv, zp = _rx_lsq_params(R, a[1], a[2], at["quant_min"], at["quant_max"])
    return _rx_fq(R, a[0], inv, s, zp, at["quant_min"], at["quant_max"])[0]


def _relax_lsq_backward(R, a, at):
    g, x, scale, zero_point = a
    qmin, qmax = at["quant_min"], at["quant_max"]
    s, inv, zp = _rx_lsq_params(R, scale, zero_point, qmin, qmax)
    c, gc = R.emit(_rx_c(R, x)), R.emit(_rx_c(R, g))
    t = R.dtype(c)
    if t != "float32":
        s, inv, zp = (R.emit(R.astype(v, t)) for v in (s, inv, zp))
    q = R.emit(R.add(_relax.round_(R, [R.multiply(c, inv)], {}), zp))
    inside = R.emit(R.logical_and(R.greater_equal(q, R.const(qmin, t)),
                                  R.less_equal(q, R.const(qmax, t))))
    xfq = R.multiply(R.subtract(R.clip(q, qmin, qmax), zp), s)
    end = R.where(R.less(q, R.const(qmin, t)), R.subtract(R.const(qmin, t), zp),
                  R.subtract(R.const(qmax, t), zp))
    gf = R.const(at["grad_factor"], t)
    zero = R.const(0.0, t)
    ds = R.multiply(R.where(inside, R.multiply(R.multiply(gc, R.subtract(xfq, c)), inv),
                            R.multiply(gc, end)), gf)
    dz = R.multiply(R.where(inside, zero, R.negative(R.multiply(gc, s))), gf)
    nd = list(range(len(R.shape(c))))
    total = (lambda v: R.reshape(R.sum(v, nd), [1])) if nd else (lambda v: R.reshape(v, [1]))
    return R.where(inside, gc, zero), total(ds), total(dz)


# ---- fake quantization ------------------------------------------------------------------

def _fq(x: np.ndarray, inv_scale, scale, zp, qmin: int, qmax: int):
    """(fake-quantized x, mask of the values inside the range), as PyTorch rounds."""
    c = _compute(x)
    q = np.rint(c * c.dtype.type(inv_scale)) + zp
    mask = (q >= qmin) & (q <= qmax)
    out = (np.clip(q, qmin, qmax) - zp) * c.dtype.type(scale)
    return out.astype(x.dtype, copy=False), mask


def _fq_pt_infer(x, scale, zero_point, quant_min, quant_max):
    _float_in(x, "fake_quantize_per_tensor_affine")
    _check_range("fake_quantize_per_tensor_affine", quant_min, quant_max)
    if not quant_min <= zero_point <= quant_max:
        raise RuntimeError("`zero_point` must be between `quant_min` and `quant_max`.")
    return Meta(x.shape, x.dtype), Meta(x.shape, D.bool_)


def _fq_pt_kernel(x, scale, zero_point, quant_min, quant_max):
    s = np.float32(scale)
    return _fq(x, np.float32(1.0) / s, s, zero_point, quant_min, quant_max)


def _fq_grad(ctx, g, _gm):
    mask = ctx.outputs[1]
    return (g * mask,) + (None,) * (len(ctx.input_metas) - 1)


_FQ_PT = defop("fake_quantize_per_tensor_affine", _fq_pt_infer, _fq_pt_kernel, grad=_fq_grad,
               save=("outputs",), nondiff_outputs=(1,), sbp=_pointwise_sbp(),
               cost=cost.elementwise(6), to_jax=_jax_fq_pt, to_relax=_relax_fq_pt)


def fake_quantize_per_tensor_affine(input: Tensor, scale, zero_point, quant_min: int,
                                    quant_max: int) -> Tensor:
    """``(clamp(round(x / scale) + zero_point, quant_min, quant_max) - zero_point) * scale``;
    its gradient passes where the value was not clamped.

    >>> import tessera
    >>> x = tessera.tensor([-1.0, 0.12, 5.0], requires_grad=True)
    >>> y = tessera.fake_quantize_per_tensor_affine(x, 0.1, 0, -5, 5); y.sum().backward()
    >>> y.tolist(), x.grad.tolist()
    ([-0.5, 0.10000000149011612, 0.5], [0.0, 1.0, 0.0])
    """
    op = "fake_quantize_per_tensor_affine"
    return dispatch(_FQ_PT, input, scale=float(_scalar(scale, op, "scale")),
                    zero_point=int(_scalar(zero_point, op, "zero_point")),
                    quant_min=int(quant_min), quant_max=int(quant_max))[0]


def _fq_pc_infer(x, scale, zero_point, axis, quant_min, quant_max):
    op = "fake_quantize_per_channel_affine"
    _float_in(x, op)
    _check_range(op, quant_min, quant_max)
    if type(scale) is not Meta or type(zero_point) is not Meta:
        raise TypeError(f"{op}(): scale and zero_point must be tensors")
    n = len(x.shape)
    if not 0 <= axis < max(n, 1):
        raise RuntimeError(f"`axis` must be between 0 and number of dimensions of input "
                           f"({op}: axis={axis}, input of {n} dims)")
    ch = x.shape[axis % n]
    if scale.shape != (ch,) or zero_point.shape != (ch,):
        raise RuntimeError(f"dimensions of scale and zero-point are not consistent with input "
                           f"tensor ({op}: input {tuple(x.shape)} on axis {axis}, scale "
                           f"{tuple(scale.shape)}, zero_point {tuple(zero_point.shape)})")
    if zero_point.dtype not in (D.int32, D.int64, D.float32, D.float16, D.bfloat16):
        raise RuntimeError(f"{op}(): zero_point must be int32 or a float tensor, got "
                           f"{zero_point.dtype}")
    return Meta(x.shape, x.dtype), Meta(x.shape, D.bool_)


def _channel(v: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return v.reshape(shape)


def _fq_pc_kernel(x, scale, zero_point, axis, quant_min, quant_max):
    s = _channel(scale.astype(np.float32), x.ndim, axis)
    zp = _channel(np.rint(zero_point).astype(np.int64) if zero_point.dtype.kind == "f"
                  else zero_point.astype(np.int64), x.ndim, axis)
    return _fq(x, np.float32(1.0) / s, s, zp, quant_min, quant_max)


_FQ_PC = defop("fake_quantize_per_channel_affine", _fq_pc_infer, _fq_pc_kernel, grad=_fq_grad,
               save=("outputs",), nondiff_outputs=(1,), sbp=_pointwise_sbp(2, "axis"),
               cost=cost.elementwise(6), to_jax=_jax_fq_pc, to_relax=_relax_fq_pc)


def fake_quantize_per_channel_affine(input: Tensor, scale: Tensor, zero_point: Tensor,
                                     axis: int, quant_min: int, quant_max: int) -> Tensor:
    """Fake quantization with one scale and zero point per slice along ``axis``.

    >>> import tessera
    >>> x = tessera.tensor([[0.26, 0.26], [0.26, 0.26]])
    >>> tessera.fake_quantize_per_channel_affine(
    ...     x, tessera.tensor([0.1, 0.2]), tessera.tensor([0, 0], dtype=tessera.int32),
    ...     1, -128, 127).tolist()
    [[0.30000001192092896, 0.20000000298023224], [0.30000001192092896, 0.20000000298023224]]
    """
    return dispatch(_FQ_PC, input, scale, zero_point, axis=int(axis),
                    quant_min=int(quant_min), quant_max=int(quant_max))[0]


def _lsq_infer(x, scale, zero_point, quant_min, quant_max, grad_factor):
    op = "_fake_quantize_learnable_per_tensor_affine"
    _float_in(x, op)
    _check_range(op, quant_min, quant_max)
    for name, m in (("scale", scale), ("zero_point", zero_point)):
        if type(m) is not Meta or len(m.shape) != 1 or m.shape[0] != 1:
            raise IndexError(f"{op}(): {name} must be a tensor of shape (1,)")
    return Meta(x.shape, x.dtype)


def _lsq_params(scale, zero_point, quant_min, quant_max):
    s = np.float32(scale.reshape(-1)[0])
    zp = int(np.clip(np.floor(np.float32(zero_point.reshape(-1)[0]) + np.float32(0.5)),
                     quant_min, quant_max))
    return s, zp


def _lsq_kernel(x, scale, zero_point, quant_min, quant_max, grad_factor):
    s, zp = _lsq_params(scale, zero_point, quant_min, quant_max)
    return _fq(x, np.float32(1.0) / s, s, zp, quant_min, quant_max)[0]


def _lsq_grad(ctx, g):
    x, scale, zp = ctx.inputs
    dx, ds, dz = dispatch(_LSQ_BACKWARD, g, x, scale, zp, **ctx.attrs)
    return dx, ds, dz


_LSQ = defop("_fake_quantize_learnable_per_tensor_affine", _lsq_infer, _lsq_kernel,
             grad=_lsq_grad, sbp=_pointwise_sbp(2), cost=cost.elementwise(6), to_jax=_jax_lsq,
             to_relax=_relax_lsq)


def _fake_quantize_learnable_per_tensor_affine(input: Tensor, scale: Tensor,
                                               zero_point: Tensor, quant_min: int,
                                               quant_max: int,
                                               grad_factor: float = 1.0) -> Tensor:
    """Fake quantization with a learnable scale and zero point (LSQ, Esser et al.): the
    gradient of the scale is ``round(x/s) - x/s`` inside the range and the clamped end
    outside it, each times ``grad_factor``.

    >>> import tessera
    >>> s = tessera.tensor([0.1], requires_grad=True)
    >>> y = tessera._fake_quantize_learnable_per_tensor_affine(
    ...     tessera.tensor([0.26, 9.0]), s, tessera.tensor([0.0]), 0, 10, 1.0)
    >>> y.sum().backward(); [round(v, 4) for v in s.grad.tolist()]
    [10.4]
    """
    return dispatch(_LSQ, input, scale, zero_point, quant_min=int(quant_min),
                    quant_max=int(quant_max), grad_factor=float(grad_factor))


def _lsq_backward_infer(g, x, scale, zero_point, quant_min, quant_max, grad_factor):
    _lsq_infer(x, scale, zero_point, quant_min, quant_max, grad_factor)
    return Meta(x.shape, x.dtype), Meta(scale.shape, scale.dtype), \
        Meta(zero_point.shape, zero_point.dtype)


def _lsq_backward_kernel(g, x, scale, zero_point, quant_min, quant_max, grad_factor):
    s, zp = _lsq_params(scale, zero_point, quant_min, quant_max)
    inv = np.float32(1.0) / s
    c, gc = _compute(x), _compute(g)
    t = c.dtype.type
    q = np.rint(c * t(inv)) + zp
    inside = (q >= quant_min) & (q <= quant_max)
    xfq = (np.clip(q, quant_min, quant_max) - zp) * t(s)
    dx = np.where(inside, gc, 0)
    end = np.where(q < quant_min, t(quant_min - zp), t(quant_max - zp))
    gf = t(grad_factor)
    ds = np.where(inside, gc * (xfq - c) * t(inv), gc * end) * gf
    dz = np.where(inside, 0, -gc * t(s)) * gf
    return (dx.astype(x.dtype, copy=False), np.array([ds.sum()], scale.dtype),
            np.array([dz.sum()], zero_point.dtype))


_LSQ_BACKWARD = defop("_fake_quantize_learnable_per_tensor_affine_backward",
                      _lsq_backward_infer, _lsq_backward_kernel, grad=None,
                      sbp=SbpRule(lambda *m, **a: [Signature((B,) * 4, (B,) * 3)]),
                      cost=cost.elementwise(12), to_jax=_jax_lsq_backward,
                      to_relax=_relax_lsq_backward)


def _fake_quantize_learnable_per_tensor_affine_backward(grad: Tensor, input: Tensor,
                                                        scale: Tensor, zero_point: Tensor,
                                                        quant_min: int, quant_max: int,
                                                        grad_factor: float = 1.0):
    """The gradients (input, scale, zero point) of the learnable fake quantization.

    >>> import tessera
    >>> gs = tessera._fake_quantize_learnable_per_tensor_affine_backward(
    ...     tessera.ones(1), tessera.tensor([9.0]), tessera.tensor([0.1]), tessera.tensor([0.0]),
    ...     0, 10, 1.0)
    >>> [t.tolist() for t in gs]
    [[0.0], [10.0], [-0.10000000149011612]]
    """
    return dispatch(_LSQ_BACKWARD, grad, input, scale, zero_point, quant_min=int(quant_min),
                    quant_max=int(quant_max), grad_factor=float(grad_factor))


# ---- quantize and dequantize ------------------------------------------------------------

def _quantize(x: np.ndarray, inv_or_scale, zp, lo: int, hi: int, np_dt, divide: bool):
    c = x.astype(np.float32, copy=False)
    v = c / inv_or_scale if divide else c * inv_or_scale
    return np.clip(np.rint(v) + zp, lo, hi).astype(np_dt)


def _qpt_infer(x, scale, zero_point, dtype):
    _float_in(x, "quantize_per_tensor")
    return Meta(x.shape, _qdtype(dtype, "quantize_per_tensor"))


def _qpt_kernel(x, scale, zero_point, dtype):
    d = D._by_name(dtype)
    s = np.float32(scale)
    return _quantize(x, np.float32(1.0) / s, zero_point, *_RANGE[d], d.np, False)


_QPT = defop("quantize_per_tensor", _qpt_infer, _qpt_kernel, grad=None,
             sbp=_pointwise_sbp(), cost=cost.elementwise(3), to_jax=_jax_qpt,
             to_relax=_relax_qpt)


def quantize_per_tensor(input=None, scale=None, zero_point=None, dtype=None, *, tensors=None,
                        scales=None, zero_points=None):
    """The quantized tensor ``clamp(round(x / scale) + zero_point)`` of ``dtype``; PyTorch's
    list form (``tensors``, with one scale and zero point each in the tensors ``scales`` and
    ``zero_points``) gives a tuple of them.

    >>> import tessera
    >>> tessera.quantize_per_tensor(tessera.tensor([0.5]), 0.25, 1, tessera.qint8).int_repr()
    tensor([3], dtype=tessera.int8)
    """
    if tensors is not None or isinstance(input, (list, tuple)):
        items = tensors if tensors is not None else input
        sc = scales if scales is not None else scale
        zp = zero_points if zero_points is not None else zero_point
        return tuple(quantize_per_tensor(t, sc[i], zp[i], dtype) for i, t in enumerate(items))
    d = _qdtype(dtype, "quantize_per_tensor")
    s = float(_scalar(scale, "quantize_per_tensor", "scale"))
    z = int(_scalar(zero_point, "quantize_per_tensor", "zero_point"))
    t = dispatch(_QPT, input, scale=s, zero_point=z, dtype=d.name)
    return QTensor._wrap(t, s, z)


def _qpc_infer(x, scales, zero_points, axis, dtype):
    _fq_pc_infer(x, scales, zero_points, axis, 0, 0)
    return Meta(x.shape, _qdtype(dtype, "quantize_per_channel"))


def _qpc_kernel(x, scales, zero_points, axis, dtype):
    d = D._by_name(dtype)
    s = _channel(scales.astype(np.float32), x.ndim, axis)
    zp = _channel(zero_points.astype(np.int64), x.ndim, axis)
    return _quantize(x, s, zp, *_RANGE[d], d.np, True)


_QPC = defop("quantize_per_channel", _qpc_infer, _qpc_kernel, grad=None,
             sbp=_pointwise_sbp(2, "axis"), cost=cost.elementwise(3), to_jax=_jax_qpc,
             to_relax=_relax_qpc)


def quantize_per_channel(input: Tensor, scales: Tensor, zero_points: Tensor, axis: int,
                         dtype) -> QTensor:
    """The quantized tensor with one scale and zero point per slice along ``axis``.

    >>> import tessera
    >>> q = tessera.quantize_per_channel(tessera.ones(2, 2), tessera.tensor([0.5, 0.25]),
    ...                                  tessera.tensor([0, 0]), 1, tessera.qint8)
    >>> q.int_repr().tolist(), q.q_per_channel_axis()
    ([[2, 4], [2, 4]], 1)
    """
    d = _qdtype(dtype, "quantize_per_channel")
    axis = int(axis) % max(len(input.shape), 1)
    t = dispatch(_QPC, input, scales, zero_points, axis=axis, dtype=d.name)
    return QTensor._wrap(t, scales.detach().to(D.float64), zero_points.detach().to(D.int64),
                         axis)


# the integer dtypes the quantized ops also take (see _U8 below)
_INTS = (D.int8, D.uint8, D.int32)


def _int_in(q, op: str) -> Meta:
    if type(q) is not Meta or (q.dtype not in _RANGE and q.dtype not in _INTS):
        raise RuntimeError(f"{op}(): expected a quantized tensor, got "
                           f"{q.dtype if type(q) is Meta else type(q).__name__}")
    return q


def _deq_infer(q, scale, zero_point):
    return Meta(_int_in(q, "dequantize").shape, D.float32)


def _deq_kernel(q, scale, zero_point):
    return ((q.astype(np.int32) - np.int32(zero_point)).astype(np.float32)
            * np.float32(scale))


_DEQUANTIZE = defop("dequantize", _deq_infer, _deq_kernel, grad=None,
                    sbp=_pointwise_sbp(), cost=cost.elementwise(2), to_jax=_jax_deq,
                    to_relax=_relax_deq)


def _deq_pc_infer(q, scales, zero_points, axis):
    _int_in(q, "dequantize")
    return Meta(q.shape, D.float32)


def _deq_pc_kernel(q, scales, zero_points, axis):
    s = _channel(scales.astype(np.float32), q.ndim, axis)
    zp = _channel(zero_points.astype(np.int32), q.ndim, axis)
    return (q.astype(np.int32) - zp).astype(np.float32) * s


_DEQUANTIZE_PC = defop("dequantize_per_channel", _deq_pc_infer, _deq_pc_kernel, grad=None,
                       sbp=_pointwise_sbp(2, "axis"), cost=cost.elementwise(2),
                       to_jax=_jax_deq_pc, to_relax=_relax_deq_pc)


def dequantize(input=None, *, tensors=None):
    """The float values of a quantized tensor (a float tensor is returned as it is); of each
    tensor of a list (``tensors``), as a tuple.

    >>> import tessera
    >>> tessera.dequantize(tessera.quantize_per_tensor(tessera.ones(1), 0.5, 0, tessera.qint8))
    tensor([1.])
    """
    if tensors is not None or isinstance(input, (list, tuple)):
        return tuple(dequantize(t) for t in (tensors if tensors is not None else input))
    if isinstance(input, QTensor):
        return input.dequantize()
    return input


# ---- the quantized ops of INT8 inference --------------------------------------------------

_QPARAMS: dict = {}


def _qparams(x_scale: float, w_scale: np.ndarray, out_scale: float | None, bias):
    """(the requantization multipliers, the int32 bias) of a quantized product, remembered
    by value (a layer computes the same ones at every call)."""
    key = (x_scale, out_scale, w_scale.dtype.str, w_scale.tobytes(),
           None if bias is None else (bias.dtype.str, bias.tobytes()))
    hit = _QPARAMS.get(key)
    if hit is None:
        if len(_QPARAMS) >= 1024:
            _QPARAMS.clear()
        hit = _QPARAMS[key] = _qparams_of(x_scale, w_scale, out_scale, bias)
    return hit


def _qparams_of(x_scale: float, w_scale: np.ndarray, out_scale: float | None, bias):
    acc_scale = np.float64(x_scale) * w_scale.astype(np.float64)
    mult = (acc_scale / (out_scale if out_scale is not None else 1.0)).astype(np.float32)
    b = None if bias is None else np.rint(bias.astype(np.float64) / acc_scale).astype(np.int32)
    return mult, b


# the quantized products also take the plain integer dtypes of the same data: a graph
# imported from ONNX holds the integers between QuantizeLinear and DequantizeLinear as
# uint8/int8 values (the scales are the op's attributes either way)
_U8, _S8 = (quint8, D.uint8), (qint8, D.int8)


def forget_packed(w: np.ndarray) -> None:
    """Drop the kernels' packed copy of the weights ``w`` (their values changed in place).

    >>> forget_packed(np.zeros((1, 1), np.int8))
    """
    from tessera.kernels import int8
    int8.forget(w)


def _linear_infer(x, w, w_scale, bias, x_scale, x_zp, out_scale, out_zp, relu):
    if type(x) is not Meta or x.dtype not in _U8:
        raise RuntimeError("quantized::linear: expected a quint8 input, got "
                           f"{x.dtype if type(x) is Meta else type(x).__name__}")
    if w.dtype not in _S8 or len(w.shape) != 2:
        raise RuntimeError(f"quantized::linear: expected 2-d qint8 weights, got {w.dtype} of "
                           f"shape {tuple(w.shape)}")
    if not x.shape or x.shape[-1] != w.shape[1]:
        raise RuntimeError(f"quantized::linear: mat1 and mat2 shapes cannot be multiplied "
                           f"({tuple(x.shape)} and {tuple(w.shape[::-1])})")
    return Meta(x.shape[:-1] + (w.shape[0],), quint8)


def _linear_kernel(x, w, w_scale, bias, x_scale, x_zp, out_scale, out_zp, relu):
    from tessera.kernels import int8
    mult, b = _qparams(x_scale, w_scale, out_scale, bias)
    a = x.reshape(-1, x.shape[-1])
    y = int8.gemm(a, w, a_zp=x_zp, mult=mult, out_zp=out_zp, bias=b, relu=relu)
    return y.reshape(x.shape[:-1] + (w.shape[0],))


def _gemm_cost(ins, outs, **attrs) -> cost.Cost:
    """Two ops per multiply-add of the int8 product."""
    w = ins[1]
    k = int(np.prod(w.shape[1:]))
    return cost.Cost(2 * cost.numel(outs[0]) * k, *cost.io(ins, outs))


_QLINEAR = defop("quantized_linear", _linear_infer, _linear_kernel, grad=None,
                 sbp=_batch_sbp(4), cost=_gemm_cost, to_jax=_jax_qlinear,
                 to_relax=_relax_qlinear)


def _conv_infer(x, w, w_scale, bias, stride, padding, dilation, groups, x_scale, x_zp,
                out_scale, out_zp, relu):
    if type(x) is not Meta or x.dtype not in _U8 or len(x.shape) != 4:
        raise RuntimeError("quantized::conv2d: expected a 4-d quint8 input (N, C, H, W)")
    if w.dtype not in _S8 or len(w.shape) != 4 or w.shape[1] * groups != x.shape[1]:
        raise RuntimeError(f"quantized::conv2d: weights {tuple(w.shape)} of {w.dtype} do not "
                           f"fit an input of {x.shape[1]} channels in {groups} groups")
    oh, ow = (_out_size(x.shape[2 + i], w.shape[2 + i], stride[i], padding[i], dilation[i])
              for i in range(2))
    if oh <= 0 or ow <= 0:
        raise RuntimeError(f"quantized::conv2d: the output would be empty (input "
                           f"{tuple(x.shape)}, kernel {tuple(w.shape[2:])})")
    return Meta((x.shape[0], w.shape[0], oh, ow), quint8)


def _out_size(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def im2col(x: np.ndarray, kh: int, kw: int, stride, padding, dilation, fill: int):
    """(N*OH*OW, C*KH*KW) columns of an NCHW uint8 input, padded with ``fill`` (the
    input's zero point, which means 0.0)."""
    n, c, h, w = x.shape
    ph, pw = padding
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    oh = _out_size(h, kh, stride[0], ph, dilation[0])
    ow = _out_size(w, kw, stride[1], pw, dilation[1])
    cols = np.empty((n, oh, ow, c, kh, kw), x.dtype)
    for i in range(kh):
        for j in range(kw):
            r, s = i * dilation[0], j * dilation[1]
            patch = xp[:, :, r:r + stride[0] * (oh - 1) + 1:stride[0],
                       s:s + stride[1] * (ow - 1) + 1:stride[1]]
            cols[..., i, j] = patch.transpose(0, 2, 3, 1)
    return cols.reshape(n * oh * ow, c * kh * kw), oh, ow


def _conv_kernel(x, w, w_scale, bias, stride, padding, dilation, groups, x_scale, x_zp,
                 out_scale, out_zp, relu):
    from tessera.kernels import int8
    mult, b = _qparams(x_scale, w_scale, out_scale, bias)
    y = int8.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups,
                    a_zp=x_zp, mult=mult, out_zp=out_zp, bias=b, relu=relu)
    if y is not None:
        return y
    return conv_reference(x, w, w_scale, bias, stride, padding, dilation, groups, x_scale,
                          x_zp, out_scale, out_zp, relu)


def conv_reference(x, w, w_scale, bias, stride, padding, dilation, groups, x_scale, x_zp,
                   out_scale, out_zp, relu):
    """``quantized_conv2d`` as NumPy im2col and ``int8.gemm`` per group (the definition the C
    convolution is tested against).

    >>> x = np.full((1, 1, 2, 2), 3, np.uint8); w = np.ones((1, 1, 2, 2), np.int8)
    >>> conv_reference(x, w, np.ones(1, np.float32), None, (1, 1), (0, 0), (1, 1), 1, 1.0, 0,
    ...                1.0, 0, False).tolist()
    [[[[12]]]]
    """
    from tessera.kernels import int8
    n, cin = x.shape[:2]
    cout, cg, kh, kw = w.shape
    og = cout // groups
    mult, b = _qparams(x_scale, w_scale, out_scale, bias)
    outs = []
    for g in range(groups):
        cols, oh, ow = im2col(x[:, g * cg:(g + 1) * cg], kh, kw, stride, padding, dilation,
                              x_zp)
        sl = slice(g * og, (g + 1) * og)
        y = int8.gemm(cols, w[sl].reshape(og, -1), a_zp=x_zp, mult=mult[sl], out_zp=out_zp,
                      bias=None if b is None else b[sl], relu=relu)
        outs.append(y.reshape(n, oh, ow, og))
    y = outs[0] if groups == 1 else np.concatenate(outs, axis=-1)
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2))


_QCONV = defop("quantized_conv2d", _conv_infer, _conv_kernel, grad=None, sbp=_batch_sbp(4),
               cost=_gemm_cost, to_jax=_jax_qconv, to_relax=_relax_qconv)


def _lin_dyn_infer(x, w, w_scale, bias, reduce_range):
    if type(x) is not Meta or x.dtype is not D.float32:
        raise RuntimeError("quantized::linear_dynamic: expected a float32 input")
    if w.dtype not in _S8 or x.shape[-1:] != w.shape[1:]:
        raise RuntimeError(f"quantized::linear_dynamic: input {tuple(x.shape)} and weights "
                           f"{tuple(w.shape)} of {w.dtype} do not fit")
    return Meta(x.shape[:-1] + (w.shape[0],), D.float32)


def dynamic_qparams(lo: float, hi: float, reduce_range: bool) -> tuple[float, int]:
    """The uint8 scale and zero point of a range (PyTorch's ``choose_qparams``)."""
    qmax = 127 if reduce_range else 255
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / qmax
    if scale == 0.0:
        scale = 1.0
    zp = int(np.clip(np.rint(-lo / scale), 0, qmax))
    return float(np.float32(scale)), zp


def _lin_dyn_kernel(x, w, w_scale, bias, reduce_range):
    from tessera.kernels import int8
    a = x.reshape(-1, x.shape[-1])
    s, zp = dynamic_qparams(float(a.min(initial=0.0)), float(a.max(initial=0.0)),
                            reduce_range)
    hi = 127 if reduce_range else 255
    aq = _quantize(a, np.float32(1.0) / np.float32(s), zp, 0, hi, np.uint8, False)
    mult = (np.float32(s) * w_scale.astype(np.float32)).astype(np.float32)
    y = int8.gemm(aq, w, a_zp=zp, mult=mult, out_dtype=np.float32,
                  bias_f=None if bias is None else bias.astype(np.float32))
    return y.reshape(x.shape[:-1] + (w.shape[0],))


_QLINEAR_DYN = defop("quantized_linear_dynamic", _lin_dyn_infer, _lin_dyn_kernel, grad=None,
                     sbp=_batch_sbp(4), cost=_gemm_cost, to_jax=_jax_qlinear_dyn,
                     to_relax=_relax_qlinear_dyn)


def _qadd_infer(a, b, a_scale, a_zp, b_scale, b_zp, out_scale, out_zp, relu):
    for m in (a, b):
        _int_in(m, "quantized::add")
    if a.shape != b.shape or a.dtype is not b.dtype:
        raise RuntimeError(f"quantized::add: operands differ: {tuple(a.shape)} {a.dtype} and "
                           f"{tuple(b.shape)} {b.dtype}")
    return Meta(a.shape, a.dtype)


def _qadd_kernel(a, b, a_scale, a_zp, b_scale, b_zp, out_scale, out_zp, relu):
    from tessera.kernels import int8
    lo, hi = _RANGE[D.from_numpy_dtype(a.dtype) is D.uint8 and quint8 or qint8]
    if relu:
        lo = max(lo, out_zp)
    y = int8.add(a, b, a_scale=a_scale, a_zp=a_zp, b_scale=b_scale, b_zp=b_zp,
                 out_scale=out_scale, out_zp=out_zp, lo=lo, hi=hi)
    return y if y is not None else add_reference(a, b, a_scale, a_zp, b_scale, b_zp,
                                                 out_scale, out_zp, relu)


def add_reference(a, b, a_scale, a_zp, b_scale, b_zp, out_scale, out_zp, relu):
    """``quantized_add`` in NumPy float32 (the definition the C kernel is tested against).

    >>> add_reference(np.array([10], np.uint8), np.array([20], np.uint8), 0.1, 0, 0.1, 0,
    ...               0.1, 0, False).tolist()
    [30]
    """
    fa = (a.astype(np.int32) - a_zp).astype(np.float32) * np.float32(a_scale)
    fb = (b.astype(np.int32) - b_zp).astype(np.float32) * np.float32(b_scale)
    lo, hi = _RANGE[D.from_numpy_dtype(a.dtype) is D.uint8 and quint8 or qint8]
    if relu:
        lo = max(lo, out_zp)
    return _quantize(fa + fb, np.float32(out_scale), out_zp, lo, hi, a.dtype, True)


_QADD = defop("quantized_add", _qadd_infer, _qadd_kernel, grad=None,
              sbp=_pointwise_sbp(1), cost=cost.elementwise(6), to_jax=_jax_qadd,
              to_relax=_relax_qadd)


def _qrelu_infer(x, zero_point):
    return Meta(_int_in(x, "quantized::relu").shape, x.dtype)


_QRELU = defop("quantized_relu", _qrelu_infer,
               lambda x, zero_point: np.maximum(x, x.dtype.type(zero_point)), grad=None,
               sbp=_pointwise_sbp(), cost=cost.elementwise(1),
               to_jax=lambda jnp, lax, a, at: jnp.maximum(a[0], np.array(at["zero_point"],
                                                                         a[0].dtype)),
               to_relax=lambda R, a, at: R.maximum(a[0], R.const(at["zero_point"],
                                                                 R.dtype(a[0]))))


def _qpool_infer(x, kernel_size, stride, padding):
    _int_in(x, "quantized::max_pool2d")
    n, c, h, w = x.shape
    oh, ow = (_out_size((h, w)[i], kernel_size[i], stride[i], padding[i], 1) for i in range(2))
    return Meta((n, c, oh, ow), x.dtype)


def _qpool_kernel(x, kernel_size, stride, padding):
    """Max pooling on the integers: the maximum commutes with the monotone dequantization.
    A channels-last input (a quantized convolution's) is pooled as NHWC and stays so."""
    low = np.iinfo(x.dtype).min
    last = x.ndim == 4 and x.transpose(0, 2, 3, 1).flags.c_contiguous and x.shape[1] > 1
    v = x.transpose(0, 2, 3, 1) if last else x     # the spatial axes: 1, 2 or 2, 3
    ax = 1 if last else 2
    pads = [(0, 0)] * 4
    pads[ax], pads[ax + 1] = (padding[0],) * 2, (padding[1],) * 2
    xp = np.pad(v, pads, constant_values=low)
    oh = (xp.shape[ax] - kernel_size[0]) // stride[0] + 1
    ow = (xp.shape[ax + 1] - kernel_size[1]) // stride[1] + 1
    # the maximum of the window's strided slices, one pass each (a reduction over a
    # sliding-window view walks the windows element by element)
    out: np.ndarray | None = None
    for i in range(kernel_size[0]):
        for j in range(kernel_size[1]):
            idx: list = [slice(None)] * 4
            idx[ax] = slice(i, i + stride[0] * (oh - 1) + 1, stride[0])
            idx[ax + 1] = slice(j, j + stride[1] * (ow - 1) + 1, stride[1])
            win = xp[tuple(idx)]
            out = win.copy() if out is None else np.maximum(out, win, out=out)
    assert out is not None
    return out.transpose(0, 3, 1, 2) if last else out


_QMAXPOOL = defop("quantized_max_pool2d", _qpool_infer, _qpool_kernel, grad=None,
                  sbp=_batch_sbp(1), cost=cost.reduction(1), to_jax=_jax_qmaxpool,
                  to_relax=_relax_qmaxpool)


def _qavg_infer(x, output_size, zero_point):
    _int_in(x, "quantized::adaptive_avg_pool2d")
    return Meta(x.shape[:2] + tuple(output_size), x.dtype)


def _qavg_kernel(x, output_size, zero_point):
    """Adaptive average pooling on the integers, in the input's scale and zero point."""
    n, c, h, w = x.shape
    oh, ow = output_size
    out = np.empty((n, c, oh, ow), x.dtype)
    for i in range(oh):
        h0, h1 = (i * h) // oh, -(-((i + 1) * h) // oh)
        for j in range(ow):
            w0, w1 = (j * w) // ow, -(-((j + 1) * w) // ow)
            m = x[:, :, h0:h1, w0:w1].astype(np.float32).mean(axis=(-2, -1))
            out[:, :, i, j] = np.rint(m)
    return out


_QAVGPOOL = defop("quantized_adaptive_avg_pool2d", _qavg_infer, _qavg_kernel, grad=None,
                  sbp=_batch_sbp(1), cost=cost.reduction(1), to_jax=_jax_qavgpool,
                  to_relax=_relax_qavgpool)


def _qcat_infer(*args, dim, scales, zero_points, out_scale, out_zp):
    for m in args:
        _int_in(m, "quantized::cat")
    shape = list(args[0].shape)
    shape[dim] = sum(m.shape[dim] for m in args)
    return Meta(tuple(shape), args[0].dtype)


def _qcat_kernel(*args, dim, scales, zero_points, out_scale, out_zp):
    lo, hi = (0, 255) if args[0].dtype == np.uint8 else (-128, 127)
    parts = [_quantize((a.astype(np.int32) - z).astype(np.float32) * np.float32(s),
                       np.float32(out_scale), out_zp, lo, hi, a.dtype, True)
             for a, s, z in zip(args, scales, zero_points)]
    return np.concatenate(parts, axis=dim)


_QCAT = defop("quantized_cat", _qcat_infer, _qcat_kernel, grad=None,
              sbp=SbpRule(lambda *m, **a: [Signature((B,) * len(m), (B,))]),
              cost=cost.movement(), to_jax=_jax_qcat, to_relax=_relax_qcat)


# ---- the functions the quantized modules call ---------------------------------------------

def _q(x: QTensor, op: str) -> QTensor:
    if not isinstance(x, QTensor):
        raise RuntimeError(f"{op}: expected a quantized tensor, got a {x.dtype} tensor "
                           "(quantize it first: QuantStub or tessera.quantize_per_tensor)")
    return x


def linear(x: QTensor, w: QTensor, bias: Tensor | None, scale: float, zero_point: int,
           relu: bool = False) -> QTensor:
    """``quantized::linear``: a quint8 input times per-channel (or per-tensor) qint8
    weights, requantized to ``scale`` and ``zero_point``.

    >>> import tessera
    >>> x = tessera.quantize_per_tensor(tessera.ones(1, 2), 0.1, 0, tessera.quint8)
    >>> w = tessera.quantize_per_tensor(tessera.ones(3, 2), 0.1, 0, tessera.qint8)
    >>> linear(x, w, None, 0.1, 0).dequantize().tolist()
    [[2.0, 2.0, 2.0]]
    """
    x = _q(x, "quantized::linear")
    ws = _w_scales(w)
    t = dispatch(_QLINEAR, x, w, ws, bias, x_scale=x.q_scale(), x_zp=x.q_zero_point(),
                 out_scale=float(scale), out_zp=int(zero_point), relu=bool(relu))
    return QTensor._wrap(t, float(scale), int(zero_point))


def _w_scales(w: QTensor) -> Tensor:
    if w._qaxis is None:
        return Tensor._from_numpy(np.full(w.shape[0], w.q_scale(), np.float32))
    s = w._qscale
    return s if s.dtype is D.float32 else s.to(D.float32)


def conv2d(x: QTensor, w: QTensor, bias: Tensor | None, stride, padding, dilation,
           groups: int, scale: float, zero_point: int, relu: bool = False) -> QTensor:
    """``quantized::conv2d`` (im2col in C and the INT8 GEMM, or the depthwise kernel),
    requantized to ``scale`` and ``zero_point``.

    >>> import tessera
    >>> x = tessera.quantize_per_tensor(tessera.ones(1, 1, 3, 3), 0.1, 0, tessera.quint8)
    >>> w = tessera.quantize_per_tensor(tessera.ones(2, 1, 3, 3), 0.1, 0, tessera.qint8)
    >>> conv2d(x, w, None, (1, 1), (0, 0), (1, 1), 1, 0.1, 0).dequantize().flatten().tolist()
    [9.0, 9.0]
    """
    x = _q(x, "quantized::conv2d")
    t = dispatch(_QCONV, x, w, _w_scales(w), bias, stride=tuple(stride),
                 padding=tuple(padding), dilation=tuple(dilation), groups=int(groups),
                 x_scale=x.q_scale(), x_zp=x.q_zero_point(), out_scale=float(scale),
                 out_zp=int(zero_point), relu=bool(relu))
    return QTensor._wrap(t, float(scale), int(zero_point))


def linear_dynamic(x: Tensor, w: QTensor, bias: Tensor | None,
                   reduce_range: bool = True) -> Tensor:
    """``quantized::linear_dynamic``: the input quantized to uint8 from its own range at each
    call, the product in int8, a float result.

    >>> import tessera
    >>> w = tessera.quantize_per_tensor(tessera.ones(3, 2), 0.1, 0, tessera.qint8)
    >>> [round(v, 2) for v in linear_dynamic(tessera.ones(1, 2), w, None)[0].tolist()]
    [2.0, 2.0, 2.0]
    """
    return dispatch(_QLINEAR_DYN, x, w, _w_scales(w), bias, reduce_range=bool(reduce_range))


def add(a: QTensor, b: QTensor, scale: float, zero_point: int, relu: bool = False) -> QTensor:
    """``quantized::add``: the sum of two quantized tensors in a third scale and zero point.

    >>> import tessera
    >>> a = tessera.quantize_per_tensor(tessera.ones(2), 0.1, 0, tessera.quint8)
    >>> add(a, a, 0.2, 0).dequantize().tolist()
    [2.0, 2.0]
    """
    a, b = _q(a, "quantized::add"), _q(b, "quantized::add")
    t = dispatch(_QADD, a, b, a_scale=a.q_scale(), a_zp=a.q_zero_point(), b_scale=b.q_scale(),
                 b_zp=b.q_zero_point(), out_scale=float(scale), out_zp=int(zero_point),
                 relu=bool(relu))
    return QTensor._wrap(t, float(scale), int(zero_point))


def relu(x: QTensor) -> QTensor:
    """ReLU of a quantized tensor: its integers clamped below at the zero point.

    >>> import tessera
    >>> q = tessera.quantize_per_tensor(tessera.tensor([-1.0, 1.0]), 0.1, 20, tessera.quint8)
    >>> relu(q).dequantize().tolist()
    [0.0, 1.0]
    """
    x = _q(x, "quantized::relu")
    t = dispatch(_QRELU, x, zero_point=x.q_zero_point())
    return QTensor._wrap(t, x._qscale, x._qzp)


def max_pool2d(x: QTensor, kernel_size, stride=None, padding=0) -> QTensor:
    """Max pooling of a quantized tensor (same scale and zero point).

    >>> import tessera
    >>> q = tessera.quantize_per_tensor(tessera.arange(4.0).view(1, 1, 2, 2), 1.0, 0,
    ...                                 tessera.quint8)
    >>> max_pool2d(q, 2).int_repr().flatten().tolist()
    [3]
    """
    x = _q(x, "quantized::max_pool2d")
    k = _pair(kernel_size)
    t = dispatch(_QMAXPOOL, x, kernel_size=k, stride=_pair(stride) if stride else k,
                 padding=_pair(padding))
    return QTensor._wrap(t, x._qscale, x._qzp)


def adaptive_avg_pool2d(x: QTensor, output_size) -> QTensor:
    """Adaptive average pooling of a quantized tensor (same scale and zero point).

    >>> import tessera
    >>> q = tessera.quantize_per_tensor(tessera.ones(1, 1, 2, 2), 1.0, 0, tessera.quint8)
    >>> adaptive_avg_pool2d(q, 1).int_repr().flatten().tolist()
    [1]
    """
    x = _q(x, "quantized::adaptive_avg_pool2d")
    t = dispatch(_QAVGPOOL, x, output_size=_pair(output_size), zero_point=x.q_zero_point())
    return QTensor._wrap(t, x._qscale, x._qzp)


def cat(xs, dim: int, scale: float, zero_point: int) -> QTensor:
    """Concatenation of quantized tensors, requantized to ``scale`` and ``zero_point``.

    >>> import tessera
    >>> q = tessera.quantize_per_tensor(tessera.ones(2), 0.5, 0, tessera.quint8)
    >>> cat([q, q], 0, 0.25, 0).int_repr().tolist()
    [4, 4, 4, 4]
    """
    xs = [_q(x, "quantized::cat") for x in xs]
    t = dispatch(_QCAT, *xs, dim=int(dim) % len(xs[0].shape),
                 scales=tuple(x.q_scale() for x in xs),
                 zero_points=tuple(x.q_zero_point() for x in xs), out_scale=float(scale),
                 out_zp=int(zero_point))
    return QTensor._wrap(t, float(scale), int(zero_point))


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))
