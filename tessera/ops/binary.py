"""Binary (1-bit) network ops: the sign with straight-through gradients, binarized
convolution and linear (latent float weights, for training), their bit-packed forms (for
inference, on the xnor-popcount kernels of ``tessera.kernels.binary``), and bit packing.

Values binarize as ``x < 0 -> -1``, else ``+1`` (``sign(0) = +1``, as Larq and dabnn;
``tessera.sign`` keeps PyTorch's ``sign(0) = 0``). The sign's gradient is the
straight-through estimator: the incoming gradient where ``|x| <= 1``, zero elsewhere
(``estimator="ste"``), or Bi-Real Net's ApproxSign, ``(2 - 2|x|)`` there
(``estimator="approx"``).

``binary_conv2d(x, w, alpha)`` is ``conv2d(pad(sign(x), pad_value), sign(w)) * alpha[o]``:
padded positions count as ``pad_value`` (-1 as dabnn, +1, or 0 as a float convolution).
Its gradients pass straight through the binarization of its inputs (the layers apply
``binary_sign`` first, whose estimator clips); ``alpha`` (one scale per output channel,
XNOR-Net's ``mean |w|``) gets the gradient of a product. The packed ops take weights as
int64 tensors holding the bits of uint64 words (``binary_pack``), and have no gradient.
The ``bitpacked_`` ops also take and give activations as bits, as a layer inside a binary
network passes them on: the input may be ``binary_pack`` of the channels (channel-last
words), and with ``threshold`` (per output channel ``(t, flip)``, which ``tessera.nn.binary``
derives from the batch norm that follows) the output is the signs ``(dot < t) xor flip``
(set: -1), bit-packed the same way.

>>> import tessera
>>> from tessera.ops.binary import binary_sign
>>> binary_sign(tessera.tensor([-2.0, 0.0, 0.5])).tolist()
[-1.0, 1.0, 1.0]
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.ops import cost
from tessera.ops._sbp import pointwise
from tessera.ops.registry import Meta, defop
from tessera.sbp import SbpRule, Signature, broadcast as B, split as S

__all__ = ["binary_sign", "binary_conv2d", "binary_linear", "packed_binary_conv2d",
           "packed_binary_linear", "bitpacked_binary_conv2d", "bitpacked_binary_linear",
           "binary_pack", "binary_unpack", "ESTIMATORS"]

ESTIMATORS = ("ste", "approx")


def _float(op: str, m: Meta, what: str = "input") -> None:
    if not m.dtype.is_floating_point:
        raise RuntimeError(f"{op}: expected a floating point {what}, got {m.dtype}")


def _batch_sbp(*metas, **attrs):
    """Split the batch (dim 0) of the input, the weights whole; or all broadcast."""
    ins = tuple(None if m is None else B for m in metas)
    return [Signature((S(0),) + ins[1:], (S(0),)), Signature(ins, (B,))]


# ---- compiler rules: XLA (``jnp``, ``lax``) and TVM Relax (``R``) ---------------------------
# The same arithmetic as the kernels: signs as floats, the padding in sign space, a float
# convolution or product of +-1 values (integer sums, exact below 2^24), one product by
# alpha. Packed weights unpack by shifts of the int64 words (bit i of word j: channel
# 64 j + i); both backends keep int64 tensors.

def _sign_jax(jnp, lax, a, at):
    x = a[0]
    return jnp.where(x < 0, -jnp.ones_like(x), jnp.ones_like(x))


def _sign_relax(R, a, at):
    x = a[0]
    dt = R.dtype(x)
    return R.where(R.less(x, R.const(0, dt)), R.const(-1, dt), R.const(1, dt))


def _bits_jax(jnp, words, n, dtype):
    """+-1 values of ``dtype`` from int64 words: (..., Cw) -> (..., n)."""
    bits = (words[..., None] >> jnp.arange(64, dtype=words.dtype)) & 1
    bits = bits.reshape(words.shape[:-1] + (-1,))[..., :n]
    return (1 - 2 * bits).astype(dtype)


def _bits_relax(R, words, n, dtype):
    shape = list(R.shape(words))
    wide = R.reshape(words, shape + [1])
    bits = R.bitwise_and(R.right_shift(wide, R.const(np.arange(64), "int64")),
                         R.const(1, "int64"))
    bits = R.reshape(bits, shape[:-1] + [shape[-1] * 64])
    if shape[-1] * 64 != n:
        bits = R.strided_slice(bits, [len(shape) - 1], [0], [n])
    return R.subtract(R.const(1, dtype), R.multiply(R.const(2, dtype), R.astype(bits, dtype)))


def _conv_signed_jax(jnp, lax, sx, sw, alpha, at):
    (ph, pw), pv = at["padding"], at["pad_value"]
    if ph or pw:
        sx = jnp.pad(sx, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=pv)
    y = lax.conv_general_dilated(sx, sw, window_strides=tuple(at["stride"]),
                                 padding=[(0, 0), (0, 0)], rhs_dilation=tuple(at["dilation"]),
                                 precision=lax.Precision.HIGHEST)
    return y if alpha is None else y * alpha.reshape(1, -1, 1, 1)


def _conv_signed_relax(R, sx, sw, alpha, at):
    (ph, pw), pv = at["padding"], at["pad_value"]
    if ph or pw:
        sx = R.nn.pad(sx, [0, 0, 0, 0, ph, ph, pw, pw], "constant", float(pv))
    y = R.nn.conv2d(sx, sw, strides=list(at["stride"]), padding=[0, 0, 0, 0],
                    dilation=list(at["dilation"]))
    return y if alpha is None else R.multiply(y, R.reshape(alpha, [1, -1, 1, 1]))


def _conv_jax(jnp, lax, a, at):
    x, w, alpha = a
    return _conv_signed_jax(jnp, lax, _sign_jax(jnp, lax, [x], at),
                            _sign_jax(jnp, lax, [w], at), alpha, at)


def _conv_relax(R, a, at):
    x, w, alpha = a
    return _conv_signed_relax(R, _sign_relax(R, [x], at), _sign_relax(R, [w], at), alpha, at)


def _pconv_jax(jnp, lax, a, at):
    x, words, alpha = a
    sw = _bits_jax(jnp, words, at["in_channels"], x.dtype).transpose(0, 3, 1, 2)
    return _conv_signed_jax(jnp, lax, _sign_jax(jnp, lax, [x], at), sw, alpha, at)


def _pconv_relax(R, a, at):
    x, words, alpha = a
    sw = R.permute_dims(_bits_relax(R, words, at["in_channels"], R.dtype(x)), [0, 3, 1, 2])
    return _conv_signed_relax(R, _sign_relax(R, [x], at), sw, alpha, at)


def _linear_signed_jax(sx, sw, alpha):
    y = sx @ sw.T
    return y if alpha is None else y * alpha


def _linear_signed_relax(R, sx, sw, alpha):
    y = R.matmul(sx, R.permute_dims(sw, [1, 0]))
    return y if alpha is None else R.multiply(y, alpha)


def _linear_jax(jnp, lax, a, at):
    x, w, alpha = a
    return _linear_signed_jax(_sign_jax(jnp, lax, [x], at), _sign_jax(jnp, lax, [w], at), alpha)


def _linear_relax(R, a, at):
    x, w, alpha = a
    return _linear_signed_relax(R, _sign_relax(R, [x], at), _sign_relax(R, [w], at), alpha)


def _plinear_jax(jnp, lax, a, at):
    x, words, alpha = a
    sw = _bits_jax(jnp, words, at["in_features"], x.dtype)
    return _linear_signed_jax(_sign_jax(jnp, lax, [x], at), sw, alpha)


def _plinear_relax(R, a, at):
    x, words, alpha = a
    sw = _bits_relax(R, words, at["in_features"], R.dtype(x))
    return _linear_signed_relax(R, _sign_relax(R, [x], at), sw, alpha)


def _pack_jax(jnp, lax, a, at):
    x = a[0]
    c = x.shape[-1]
    cw = -(-c // 64)
    bits = (x < 0).astype(jnp.int64)
    if cw * 64 != c:
        bits = jnp.pad(bits, [(0, 0)] * (x.ndim - 1) + [(0, cw * 64 - c)])
    bits = bits.reshape(x.shape[:-1] + (cw, 64))
    # distinct bits: the sum is their or, bit 63 included (two's complement, no carry)
    return jnp.sum(bits << jnp.arange(64, dtype=jnp.int64), axis=-1)


def _pack_relax(R, a, at):
    x = a[0]
    shape = list(R.shape(x))
    c = shape[-1]
    cw = -(-c // 64)
    bits = R.astype(R.less(x, R.const(0, R.dtype(x))), "int64")
    if cw * 64 != c:
        bits = R.nn.pad(bits, [0, 0] * (len(shape) - 1) + [0, cw * 64 - c], "constant", 0.0)
    bits = R.reshape(bits, shape[:-1] + [cw, 64])
    return R.sum(R.left_shift(bits, R.const(np.arange(64), "int64")), axis=[-1])


def _unpack_jax(jnp, lax, a, at):
    return _bits_jax(jnp, a[0], at["n"], jnp.float32)


def _unpack_relax(R, a, at):
    return _bits_relax(R, a[0], at["n"], "float32")


# ---- sign ----------------------------------------------------------------------------------

def _sign_infer(x, estimator):
    _float("binary_sign", x)
    if estimator not in ESTIMATORS:
        raise ValueError(f"binary_sign: estimator must be 'ste' or 'approx', got {estimator!r}")
    return Meta(x.shape, x.dtype)


def _sign_kernel(x, estimator):
    return np.where(x < 0, -1, 1).astype(x.dtype)


def _sign_grad(ctx, g):
    from tessera.ops.ternary import where
    x = ctx.inputs[0]
    a = x.abs()
    if ctx.attrs["estimator"] == "approx":
        g = g * (2 - 2 * a)
    return (where(a <= 1, g, 0.0),)


def _sign_c(c, a, at):
    return f"(({c.T})({a[0]} < 0 ? -1 : 1))"


_SIGN = defop("binary_sign", _sign_infer, _sign_kernel, grad=_sign_grad, sbp=pointwise(),
              cost=cost.elementwise(1), to_c=_sign_c,
              to_jax=_sign_jax, to_relax=_sign_relax)


def binary_sign(x: Tensor, estimator: str = "ste") -> Tensor:
    """``-1`` where ``x < 0``, else ``+1``, with a straight-through gradient.

    >>> import tessera
    >>> x = tessera.tensor([-2.0, -0.5, 0.5], requires_grad=True)
    >>> binary_sign(x).sum().backward(); x.grad.tolist()
    [0.0, 1.0, 1.0]
    """
    return dispatch(_SIGN, x, estimator=estimator)


# ---- binarized convolution and linear (latent float weights) --------------------------------

def _pair(v) -> tuple[int, int]:
    if type(v) is tuple and len(v) == 2 and type(v[0]) is int and type(v[1]) is int:
        return v  # a layer's own (its calls' common case)
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _conv_infer(x, w, alpha, stride, padding, dilation, pad_value, op="binary_conv2d"):
    _float(op, x)
    if len(x.shape) != 4 or len(w.shape) != 4 or w.shape[1] != x.shape[1]:
        raise RuntimeError(f"{op}: input {tuple(x.shape)} and weight {tuple(w.shape)} do not "
                           f"fit: expected (N, C, H, W) and (O, C, KH, KW)")
    if pad_value not in (-1, 0, 1):
        raise ValueError(f"{op}: pad_value must be -1, 0 or 1, got {pad_value!r}")
    if alpha is not None and tuple(alpha.shape) != (w.shape[0],):
        raise RuntimeError(f"{op}: alpha of shape {tuple(alpha.shape)}, expected "
                           f"({w.shape[0]},), one per output channel")
    oh, ow = ((x.shape[2 + i] + 2 * padding[i] - dilation[i] * (w.shape[2 + i] - 1) - 1)
              // stride[i] + 1 for i in range(2))
    if oh <= 0 or ow <= 0:
        raise RuntimeError(f"{op}: the output would be empty (input {tuple(x.shape)}, kernel "
                           f"{tuple(w.shape[2:])})")
    return Meta((x.shape[0], w.shape[0], oh, ow), x.dtype)


def _scaled(dot: np.ndarray, alpha, dtype, shape) -> np.ndarray:
    out = dot.astype(dtype, copy=False)
    if alpha is not None:
        out = out * alpha.astype(dtype).reshape(shape)
    return out


def _conv_kernel(x, w, alpha, stride, padding, dilation, pad_value):
    from tessera.kernels import binary as K
    words = K.packbits(w.transpose(0, 2, 3, 1))
    dot = K.conv2d(np.ascontiguousarray(x, np.float32), words, x.shape[1], stride=stride,
                   padding=padding, dilation=dilation, pad_value=pad_value)
    return _scaled(dot, alpha, x.dtype, (1, -1, 1, 1))


def _conv_grad(ctx, g):
    from tessera.ops.conv import conv_input_grad, conv_weight_grad
    from tessera.ops.vision import constant_pad
    x, w, alpha = ctx.inputs
    a = ctx.attrs
    need = ctx.needs_input_grad
    gy = g if alpha is None else g * alpha.reshape(1, -1, 1, 1)
    geo = dict(stride=a["stride"], dilation=a["dilation"], groups=1)
    pads = tuple((p, p) for p in a["padding"])
    gx = gw = ga = None
    if need[0]:
        gx = conv_input_grad(gy, binary_sign(w), input_shape=tuple(x.shape), pads=pads, **geo)
    if need[1]:
        sx = binary_sign(x)
        if a["pad_value"] != 0 and any(a["padding"]):
            sx = constant_pad(sx, pads, float(a["pad_value"]))
            pads = ((0, 0), (0, 0))
        gw = conv_weight_grad(sx, gy, weight_shape=tuple(w.shape), pads=pads, **geo)
    if alpha is not None and need[2]:
        raw = dispatch(_CONV, x, w, None, **a)
        ga = (g * raw).sum((0, 2, 3))
    return gx, gw, ga


def _conv_cost(ins, outs, **attrs) -> cost.Cost:
    w = ins[1]
    macs = cost.numel(outs[0]) * int(np.prod(w.shape[1:]))
    return cost.Cost(2 * macs // 64, *cost.io(ins, outs))  # 64 products a word


_CONV = defop("binary_conv2d", _conv_infer, _conv_kernel, grad=_conv_grad,
              sbp=SbpRule(_batch_sbp), cost=_conv_cost, to_jax=_conv_jax,
              to_relax=_conv_relax)


def binary_conv2d(x: Tensor, w: Tensor, alpha: Tensor | None = None, *, stride=1, padding=0,
                  dilation=1, pad_value: int = -1) -> Tensor:
    """``conv2d(pad(sign(x), pad_value), sign(w)) * alpha[o]`` on the xnor-popcount kernels.

    >>> import tessera
    >>> x, w = tessera.ones(1, 1, 3, 3), -tessera.ones(1, 1, 3, 3)
    >>> binary_conv2d(x, w, padding=1, pad_value=0)[0, 0, 0].tolist()
    [-4.0, -6.0, -4.0]
    """
    return dispatch(_CONV, x, w, alpha, stride=_pair(stride), padding=_pair(padding),
                    dilation=_pair(dilation), pad_value=int(pad_value))


def _linear_infer(x, w, alpha, op="binary_linear"):
    _float(op, x)
    if len(x.shape) < 1 or len(w.shape) != 2 or x.shape[-1] != w.shape[1]:
        raise RuntimeError(f"{op}: mat1 and mat2 shapes cannot be multiplied (input "
                           f"{tuple(x.shape)}, weight {tuple(w.shape)})")
    if alpha is not None and tuple(alpha.shape) != (w.shape[0],):
        raise RuntimeError(f"{op}: alpha of shape {tuple(alpha.shape)}, expected "
                           f"({w.shape[0]},), one per output feature")
    return Meta(tuple(x.shape[:-1]) + (w.shape[0],), x.dtype)


def _linear_kernel(x, w, alpha):
    from tessera.kernels import binary as K
    flat = np.ascontiguousarray(x.reshape(-1, x.shape[-1]), np.float32)
    dot = K.linear(flat, K.packbits(w), w.shape[1])
    return _scaled(dot, alpha, x.dtype, (1, -1)).reshape(x.shape[:-1] + (w.shape[0],))


def _linear_grad(ctx, g):
    x, w, alpha = ctx.inputs
    need = ctx.needs_input_grad
    gy = g if alpha is None else g * alpha
    gx = gw = ga = None
    if need[0]:
        gx = gy @ binary_sign(w)
    if need[1]:
        g2 = gy.reshape(-1, gy.shape[-1])
        gw = g2.t() @ binary_sign(x).reshape(-1, x.shape[-1])
    if alpha is not None and need[2]:
        raw = dispatch(_LINEAR, x, w, None)
        ga = (g * raw).reshape(-1, g.shape[-1]).sum(0)
    return gx, gw, ga


def _linear_cost(ins, outs, **attrs) -> cost.Cost:
    return cost.Cost(2 * cost.numel(outs[0]) * ins[1].shape[1] // 64, *cost.io(ins, outs))


_LINEAR = defop("binary_linear", _linear_infer, _linear_kernel, grad=_linear_grad,
                sbp=SbpRule(_batch_sbp), cost=_linear_cost, to_jax=_linear_jax,
                to_relax=_linear_relax)


def binary_linear(x: Tensor, w: Tensor, alpha: Tensor | None = None) -> Tensor:
    """``sign(x) @ sign(w).T * alpha`` on the xnor-popcount kernels.

    >>> import tessera
    >>> binary_linear(tessera.tensor([[-1.0, 2.0]]), tessera.tensor([[3.0, 0.0]])).tolist()
    [[0.0]]
    """
    return dispatch(_LINEAR, x, w, alpha)


# ---- packed (inference) --------------------------------------------------------------------

def _words(op: str, m: Meta, ndim: int, n: int) -> None:
    if m.dtype is not D.int64 or len(m.shape) != ndim or m.shape[-1] * 64 < n:
        raise RuntimeError(f"{op}: packed weights must be int64 words {ndim}-d with at least "
                           f"{n} bits in the last dim, got {tuple(m.shape)} of {m.dtype}")


def _pconv_infer(x, words, alpha, in_channels, stride, padding, dilation, pad_value):
    _words("packed_binary_conv2d", words, 4, in_channels)
    o, kh, kw, _ = words.shape
    w = Meta((o, in_channels, kh, kw), D.float32)
    return _conv_infer(x, w, alpha, stride, padding, dilation, pad_value,
                       op="packed_binary_conv2d")


def _pconv_kernel(x, words, alpha, in_channels, stride, padding, dilation, pad_value):
    from tessera.kernels import binary as K
    # the words as they are (int64): the kernels know a layer's weights by this array
    f32 = x.dtype == np.float32
    out = K.conv2d(x, words, in_channels, stride=stride, padding=padding, dilation=dilation,
                   pad_value=pad_value, scale=alpha if f32 else None)
    return out if f32 else _scaled(out, alpha, x.dtype, (1, -1, 1, 1))


def _pconv_cost(ins, outs, in_channels, **attrs) -> cost.Cost:
    w = ins[1]
    macs = cost.numel(outs[0]) * in_channels * int(w.shape[1]) * int(w.shape[2])
    return cost.Cost(2 * macs // 64, *cost.io(ins, outs))


_PCONV = defop("packed_binary_conv2d", _pconv_infer, _pconv_kernel, grad=None,
               sbp=SbpRule(_batch_sbp), cost=_pconv_cost, to_jax=_pconv_jax,
               to_relax=_pconv_relax)


def packed_binary_conv2d(x: Tensor, words: Tensor, alpha: Tensor | None, in_channels: int, *,
                         stride=1, padding=0, dilation=1, pad_value: int = -1) -> Tensor:
    """``binary_conv2d`` with weights packed by ``binary_pack`` (int64, (O, KH, KW, Cw)).

    >>> import tessera
    >>> words = binary_pack(-tessera.ones(1, 3, 3, 1))
    >>> packed_binary_conv2d(tessera.ones(1, 1, 3, 3), words, None, 1, padding=1)[0, 0, 0]
    tensor([ 1., -3.,  1.])
    """
    return dispatch(_PCONV, x, words, alpha, in_channels=int(in_channels), stride=_pair(stride),
                    padding=_pair(padding), dilation=_pair(dilation), pad_value=int(pad_value))


def _plinear_infer(x, words, alpha, in_features):
    _words("packed_binary_linear", words, 2, in_features)
    w = Meta((words.shape[0], in_features), D.float32)
    return _linear_infer(x, w, alpha, op="packed_binary_linear")


def _plinear_kernel(x, words, alpha, in_features):
    from tessera.kernels import binary as K
    flat = np.ascontiguousarray(x.reshape(-1, x.shape[-1]), np.float32)
    f32 = x.dtype == np.float32
    out = K.linear(flat, words.view(np.uint64), in_features, scale=alpha if f32 else None)
    out = out if f32 else _scaled(out, alpha, x.dtype, (1, -1))
    return out.reshape(x.shape[:-1] + (words.shape[0],))


_PLINEAR = defop("packed_binary_linear", _plinear_infer, _plinear_kernel, grad=None,
                 sbp=SbpRule(_batch_sbp),
                 cost=lambda ins, outs, in_features: cost.Cost(
                     2 * cost.numel(outs[0]) * in_features // 64, *cost.io(ins, outs)),
                 to_jax=_plinear_jax, to_relax=_plinear_relax)


def packed_binary_linear(x: Tensor, words: Tensor, alpha: Tensor | None,
                         in_features: int) -> Tensor:
    """``binary_linear`` with weights packed by ``binary_pack`` (int64, (O, ceil(I/64))).

    >>> import tessera
    >>> w = binary_pack(tessera.tensor([[3.0, 0.0]]))
    >>> packed_binary_linear(tessera.tensor([[-1.0, 2.0]]), w, None, 2).tolist()
    [[0.0]]
    """
    return dispatch(_PLINEAR, x, words, alpha, in_features=int(in_features))


# ---- bit-packed activations (inference) -----------------------------------------------------

def _bits_in(op: str, x: Meta, n: int, spatial: int) -> Meta:
    """The float meta a bit-packed input ``x`` stands for, or ``x`` when it is float."""
    if x.dtype is D.int64:
        cw = -(-n // 64)
        if len(x.shape) != spatial + 2 or x.shape[-1] != cw:
            want = "(N, H, W, {})" if spatial == 2 else "(B, {})"
            raise RuntimeError(f"{op}: a bit-packed input holds {n} channels as int64 words "
                               f"{want.format(cw)}, got {tuple(x.shape)}")
        if spatial == 2:
            return Meta((x.shape[0], n, x.shape[1], x.shape[2]), D.float32)
        return Meta((x.shape[0], n), D.float32)
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"{op}: expected a floating point input or int64 bit-packed words, "
                           f"got {x.dtype}")
    return x


def _threshold(op: str, t, alpha, o: int) -> None:
    if t is None:
        return
    if t.dtype is not D.int64 or tuple(t.shape) != (o, 2):
        raise RuntimeError(f"{op}: threshold must be int64 of shape ({o}, 2), one (t, flip) "
                           f"per output channel, got {tuple(t.shape)} of {t.dtype}")
    if alpha is not None:
        raise RuntimeError(f"{op}: alpha scales a float output; with a threshold (a "
                           f"bit-packed output) it is folded into the threshold: pass None")


def _bconv_infer(x, words, alpha, threshold, in_channels, stride, padding, dilation,
                 pad_value):
    op = "bitpacked_binary_conv2d"
    _words(op, words, 4, in_channels)
    o, kh, kw, _ = words.shape
    _threshold(op, threshold, alpha, o)
    m = _conv_infer(_bits_in(op, x, in_channels, 2), Meta((o, in_channels, kh, kw), D.float32),
                    alpha, stride, padding, dilation, pad_value, op=op)
    if threshold is not None:
        return Meta((m.shape[0], m.shape[2], m.shape[3], -(-o // 64)), D.int64)
    return m


# compared as dtypes (identity first), not as NumPy scalar types (a conversion each)
_F32_OR_BITS = (np.dtype(np.float32), np.dtype(np.int64))


def _bconv_kernel(x, words, alpha, threshold, in_channels, stride, padding, dilation,
                  pad_value):
    from tessera.kernels import binary as K
    f32 = x.dtype in _F32_OR_BITS
    out = K.conv2d(x, words, in_channels, stride=stride, padding=padding, dilation=dilation,
                   pad_value=pad_value, scale=alpha if f32 else None, threshold=threshold)
    return out if f32 or threshold is not None else _scaled(out, alpha, x.dtype, (1, -1, 1, 1))


def _bconv_cost(ins, outs, in_channels, **attrs) -> cost.Cost:
    w, y = ins[1], outs[0]
    pixels = cost.numel(y) // y.shape[-1] if ins[3] is not None else cost.numel(y) // w.shape[0]
    macs = pixels * int(w.shape[0]) * in_channels * int(w.shape[1]) * int(w.shape[2])
    return cost.Cost(2 * macs // 64, *cost.io(ins, outs))


_BCONV = defop("bitpacked_binary_conv2d", _bconv_infer, _bconv_kernel, grad=None,
               sbp=SbpRule(_batch_sbp), cost=_bconv_cost)


def bitpacked_binary_conv2d(x: Tensor, words: Tensor, alpha: Tensor | None,
                            threshold: Tensor | None, in_channels: int, *, stride=1,
                            padding=0, dilation=1, pad_value: int = -1) -> Tensor:
    """``packed_binary_conv2d`` whose input may be bit-packed (int64 ``(N, H, W,
    ceil(C/64))``: ``binary_pack`` of the channels) and whose output, given ``threshold``
    (int64 ``(O, 2)``: per channel ``(t, flip)``), is the signs ``(dot < t) xor flip``
    bit-packed the same way, ``(N, OH, OW, ceil(O/64))``; else float ``dot * alpha``.

    >>> import tessera
    >>> words = binary_pack(-tessera.ones(1, 3, 3, 1))
    >>> x = binary_pack(tessera.ones(1, 3, 3, 1))               # (N, H, W, words)
    >>> bitpacked_binary_conv2d(x, words, None, None, 1, padding=1)[0, 0, 0]
    tensor([ 1., -3.,  1.])
    >>> t = tessera.tensor([[0, 0]])                            # -1 where dot < 0
    >>> bitpacked_binary_conv2d(x, words, None, t, 1, padding=1)[0, 0].flatten().tolist()
    [0, 1, 0]
    """
    return dispatch(_BCONV, x, words, alpha, threshold, in_channels=int(in_channels),
                    stride=_pair(stride), padding=_pair(padding), dilation=_pair(dilation),
                    pad_value=int(pad_value))


def _blinear_infer(x, words, alpha, threshold, in_features):
    op = "bitpacked_binary_linear"
    _words(op, words, 2, in_features)
    o = words.shape[0]
    _threshold(op, threshold, alpha, o)
    m = _linear_infer(_bits_in(op, x, in_features, 0), Meta((o, in_features), D.float32),
                      alpha, op=op)
    if len(m.shape) != 2:
        raise RuntimeError(f"{op}: expected a 2-d input (B, features), got {tuple(x.shape)}")
    return Meta((m.shape[0], -(-o // 64)), D.int64) if threshold is not None else m


def _blinear_kernel(x, words, alpha, threshold, in_features):
    from tessera.kernels import binary as K
    f32 = x.dtype in (np.float32, np.int64)
    out = K.linear(x if f32 else np.asarray(x, np.float32), words.view(np.uint64),
                   in_features, scale=alpha if f32 else None, threshold=threshold)
    return out if f32 or threshold is not None else _scaled(out, alpha, x.dtype, (1, -1))


_BLINEAR = defop("bitpacked_binary_linear", _blinear_infer, _blinear_kernel, grad=None,
                 sbp=SbpRule(_batch_sbp),
                 cost=lambda ins, outs, in_features: cost.Cost(
                     2 * ins[0].shape[0] * ins[1].shape[0] * in_features // 64,
                     *cost.io(ins, outs)))


def bitpacked_binary_linear(x: Tensor, words: Tensor, alpha: Tensor | None,
                            threshold: Tensor | None, in_features: int) -> Tensor:
    """``packed_binary_linear`` of a 2-d input that may be bit-packed (int64
    ``(B, ceil(I/64))``), whose output, given ``threshold`` (int64 ``(O, 2)``), is the signs
    ``(dot < t) xor flip`` bit-packed, ``(B, ceil(O/64))``; else float ``dot * alpha``.

    >>> import tessera
    >>> w = binary_pack(tessera.tensor([[3.0, 0.0]]))
    >>> x = binary_pack(tessera.tensor([[-1.0, -2.0]]))
    >>> bitpacked_binary_linear(x, w, None, None, 2).tolist()
    [[-2.0]]
    """
    return dispatch(_BLINEAR, x, words, alpha, threshold, in_features=int(in_features))


# ---- packing -------------------------------------------------------------------------------

def _pack_infer(x):
    _float("binary_pack", x)
    if len(x.shape) == 0:
        raise RuntimeError("binary_pack: expected at least one dimension, got a scalar")
    return Meta(tuple(x.shape[:-1]) + (-(-x.shape[-1] // 64),), D.int64)


def _pack_kernel(x):
    from tessera.kernels import binary as K
    return K.packbits(x).view(np.int64)


def _last_dim_kept(*metas, **attrs):
    x = metas[0]
    return [Signature((S(d),), (S(d),)) for d in range(len(x.shape) - 1)] + \
        [Signature((B,), (B,))]


_PACK = defop("binary_pack", _pack_infer, _pack_kernel, grad=None,
              sbp=SbpRule(_last_dim_kept), cost=cost.elementwise(1), to_jax=_pack_jax,
              to_relax=_pack_relax)


def binary_pack(x: Tensor) -> Tensor:
    """The signs of ``x`` along its last dim, 64 to a word (bit ``i`` of word ``j``: element
    ``64 j + i`` is negative), as int64 tensors holding uint64 words: dabnn's channel-last
    layout when the channels are last.

    >>> import tessera
    >>> binary_pack(tessera.tensor([-1.0, 2.0, -0.5])).tolist()
    [5]
    """
    return dispatch(_PACK, x)


def _unpack_infer(words, n):
    if words.dtype is not D.int64 or len(words.shape) == 0 or words.shape[-1] * 64 < n or n < 0:
        raise RuntimeError(f"binary_unpack: {tuple(words.shape)} words of {words.dtype} do not "
                           f"hold {n} values (int64 words, 64 values each)")
    return Meta(tuple(words.shape[:-1]) + (n,), D.float32)


def _unpack_kernel(words, n):
    from tessera.kernels import binary as K
    return K.unpackbits(words.view(np.uint64), n)


_UNPACK = defop("binary_unpack", _unpack_infer, _unpack_kernel, grad=None,
                sbp=SbpRule(_last_dim_kept), cost=cost.elementwise(1), to_jax=_unpack_jax,
                to_relax=_unpack_relax)


def binary_unpack(words: Tensor, n: int) -> Tensor:
    """The inverse of ``binary_pack``: ``n`` values in {-1, +1} (float32) along the last dim.

    >>> import tessera
    >>> binary_unpack(tessera.tensor([5]), 3).tolist()
    [-1.0, 1.0, -1.0]
    """
    return dispatch(_UNPACK, words, n=int(n))
