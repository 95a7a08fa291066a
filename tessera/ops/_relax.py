"""The vocabulary of ``to_relax`` rules: how an op computes, as TVM Relax expressions.

A rule is ``rule(R, a, at) -> expr | tuple``: ``a`` holds the node's inputs (Relax
expressions for tensors, already cast to the op's compute type; Python values for constants;
None for absent optional tensors), ``at`` its attrs. ``R`` is the TVM backend's builder
(``tessera.compiler.tvm.Builder``): its attributes are ``tvm.relax.op``'s functions
(``R.add``, ``R.nn.conv2d``, ...), plus ``R.const(value, dtype)``, ``R.shape(x)`` and
``R.dtype(x)`` (the static shape and dtype name of an expression), ``R.emit(x)`` (bind it)
and ``R.pair(x, y)`` (two operands, Python numbers lifted, in one dtype). The backend casts
results to the dtypes ``infer`` gave, so a rule computes and never converts; a rule may
decline a case with ``NotImplementedError`` (the node then runs on tessera's executor).
Nothing here imports TVM. Ops made by a family's factory find their rule by name in the
tables below; every other op writes its own in its ``defop``.

>>> rule("tanh") is UNARY["tanh"], rule("no such op")
(True, None)
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["UNARY", "ACTIVATION", "COMPARE", "REDUCE", "BINARY", "add", "sub", "mul", "div",
           "remainder", "fmod", "power", "atan2", "conv", "conv_input_grad",
           "conv_weight_grad", "max_pool", "max_pool_values", "max_pool_backward", "avg_pool",
           "batch_norm", "layer_norm", "nll_loss", "nll_loss_backward", "interpolate",
           "split_view", "split_backward", "expand", "view", "unsqueeze", "permute",
           "slice_", "cat", "flip", "cast", "identity", "copy", "matmul", "gather",
           "index_select", "embedding", "embedding_backward", "where", "masked_fill",
           "addcmul", "addcdiv", "softmax", "log_softmax", "softmax_backward",
           "log_softmax_backward", "lerp", "clamp", "gelu_backward", "silu_backward",
           "cumulative", "arg", "logical", "tri", "constant_pad", "group_norm", "constant", "rule"]

_SQRT1_2 = 1 / math.sqrt(2)
_SQRT_2_PI = math.sqrt(2 / math.pi)


def _k(R, v, like):
    """The Python number ``v`` as a constant of ``like``'s dtype."""
    return R.const(v, R.dtype(like))


def _wide(R, x):
    """Half-precision floats computed in float32 (LLVM has no half-precision asin, sinh,
    ...; tessera's kernels compute them in float32 too); the backend rounds the result."""
    return R.astype(x, "float32") if R.dtype(x) in ("float16", "bfloat16") else x


def _one(f):
    """A rule of one tensor input and no attrs."""
    return lambda R, a, at: f(R, _wide(R, a[0]) if not isinstance(a[0], (int, float)) else a[0])


def _expm1(R, x):
    # Kahan's trick keeps expm1's relative accuracy near 0 without an expm1 primitive
    u = R.emit(R.exp(x))
    one = _k(R, 1.0, x)
    um1 = R.subtract(u, one)
    safe = R.where(R.equal(u, one), one, R.log(u))
    ratio = R.multiply(um1, R.divide(x, safe))
    return R.where(R.equal(u, one), x, R.where(R.equal(um1, _k(R, -1.0, x)), um1,
                                               R.where(R.isinf(u), u, ratio)))


def _log1p(R, x):
    # Goldberg's trick: log(u) * x / (u - 1), exact where 1 + x rounds to 1
    one = _k(R, 1.0, x)
    u = R.emit(R.add(x, one))
    d = R.subtract(u, one)
    safe = R.where(R.equal(d, _k(R, 0.0, x)), one, d)
    ratio = R.multiply(R.log(u), R.divide(x, safe))
    return R.where(R.equal(u, one), x, R.where(R.isinf(u), u, ratio))


def _sign(R, x):
    zero = _k(R, 0, x)
    pos = R.astype(R.greater(x, zero), R.dtype(x))
    neg = R.astype(R.less(x, zero), R.dtype(x))
    return R.where(R.isnan(x), x, R.subtract(pos, neg)) if R.dtype(x).startswith("float") \
        else R.subtract(pos, neg)


UNARY = {
    "exp": _one(lambda R, x: R.exp(x)),
    "exp2": _one(lambda R, x: R.power(_k(R, 2.0, x), x)),
    "expm1": _one(_expm1),
    "log": _one(lambda R, x: R.log(x)),
    "log2": _one(lambda R, x: R.divide(R.log(x), _k(R, math.log(2), x))),
    "log10": _one(lambda R, x: R.divide(R.log(x), _k(R, math.log(10), x))),
    "log1p": _one(_log1p),
    "sqrt": _one(lambda R, x: R.sqrt(x)),
    "rsqrt": _one(lambda R, x: R.rsqrt(x)),
    "reciprocal": _one(lambda R, x: R.divide(_k(R, 1.0, x), x)),
    "sin": _one(lambda R, x: R.sin(x)),
    "cos": _one(lambda R, x: R.cos(x)),
    "tan": _one(lambda R, x: R.tan(x)),
    "asin": _one(lambda R, x: R.asin(x)),
    "acos": _one(lambda R, x: R.acos(x)),
    "atan": _one(lambda R, x: R.atan(x)),
    "sinh": _one(lambda R, x: R.sinh(x)),
    "cosh": _one(lambda R, x: R.cosh(x)),
    "tanh": _one(lambda R, x: R.tanh(x)),
    "asinh": _one(lambda R, x: R.asinh(x)),
    "acosh": _one(lambda R, x: R.acosh(x)),
    "atanh": _one(lambda R, x: R.atanh(x)),
    "sigmoid": _one(lambda R, x: R.sigmoid(x)),
    "erf": _one(lambda R, x: R.erf(x)),
    "abs": _one(lambda R, x: R.abs(x)),
    "neg": _one(lambda R, x: R.negative(x)),
    "positive": _one(lambda R, x: x),
    "sign": _one(_sign),
    "floor": _one(lambda R, x: R.floor(x)),
    "ceil": _one(lambda R, x: R.ceil(x)),
    "trunc": _one(lambda R, x: R.trunc(x)),
    "frac": _one(lambda R, x: R.subtract(x, R.trunc(x))),
    "square": _one(lambda R, x: R.multiply(x, x)),
    "relu": _one(lambda R, x: R.maximum(x, _k(R, 0, x))),
    "isnan": _one(lambda R, x: R.isnan(x)),
    "isinf": _one(lambda R, x: R.isinf(x)),
    "isfinite": _one(lambda R, x: R.isfinite(x)),
    "isposinf": _one(lambda R, x: R.logical_and(R.isinf(x), R.greater(x, _k(R, 0, x)))),
    "isneginf": _one(lambda R, x: R.logical_and(R.isinf(x), R.less(x, _k(R, 0, x)))),
    "logical_not": _one(lambda R, x: R.logical_not(R.astype(x, "bool"))),
}


def _gelu(R, a, at):
    x = a[0]
    half = _k(R, 0.5, x)
    if at.get("approximate", "none") == "tanh":
        cube = R.multiply(R.multiply(x, x), x)
        inner = R.multiply(_k(R, _SQRT_2_PI, x), R.add(x, R.multiply(_k(R, 0.044715, x),
                                                                     cube)))
        return R.multiply(R.multiply(half, x), R.add(_k(R, 1.0, x), R.tanh(inner)))
    return R.multiply(R.multiply(half, x),
                      R.add(_k(R, 1.0, x), R.erf(R.multiply(x, _k(R, _SQRT1_2, x)))))


def _log1pexp(R, x):
    """log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))."""
    return R.add(R.maximum(x, _k(R, 0.0, x)), _log1p(R, R.exp(R.negative(R.abs(x)))))


def _softplus(R, a, at):
    x, beta, th = a[0], at.get("beta", 1.0), at.get("threshold", 20.0)
    z = R.emit(R.multiply(x, _k(R, beta, x)))
    soft = R.divide(_log1pexp(R, R.minimum(z, _k(R, th, x))), _k(R, beta, x))
    return R.where(R.greater(z, _k(R, th, x)), x, soft)


def _elu(R, a, at):
    x = a[0]
    scale, alpha = at.get("scale", 1.0), at.get("alpha", 1.0)
    neg = R.multiply(_expm1(R, R.multiply(x, _k(R, at.get("input_scale", 1.0), x))),
                     _k(R, alpha * scale, x))
    return R.where(R.less_equal(x, _k(R, 0, x)), neg, R.multiply(x, _k(R, scale, x)))


def _hardsig(R, x):
    return R.divide(R.clip(R.add(x, _k(R, 3.0, x)), 0.0, 6.0), _k(R, 6.0, x))


def _shrink(R, a, at, soft):
    x, lam = a[0], at.get("lambd", 0.5)
    zero = _k(R, 0, x)
    if not soft:
        return R.where(R.greater(R.abs(x), _k(R, lam, x)), x, zero)
    return R.where(R.greater(x, _k(R, lam, x)), R.subtract(x, _k(R, lam, x)),
                   R.where(R.less(x, _k(R, -lam, x)), R.add(x, _k(R, lam, x)), zero))


ACTIVATION = {
    "gelu": _gelu,
    "silu": _one(lambda R, x: R.multiply(x, R.sigmoid(x))),
    "mish": _one(lambda R, x: R.multiply(x, R.tanh(_log1pexp(R, x)))),
    "softplus": _softplus,
    "leaky_relu": lambda R, a, at: R.where(
        R.greater(a[0], _k(R, 0, a[0])), a[0],
        R.multiply(a[0], _k(R, at.get("negative_slope", 0.01), a[0]))),
    "elu": _elu,
    "hardtanh": lambda R, a, at: R.minimum(R.maximum(a[0], _k(R, at.get("min_val", -1.0), a[0])),
                                           _k(R, at.get("max_val", 1.0), a[0])),
    "threshold": lambda R, a, at: R.where(R.less_equal(a[0], _k(R, at["threshold"], a[0])),
                                          _k(R, at["value"], a[0]), a[0]),
    "hardsigmoid": _one(_hardsig),
    "hardswish": _one(lambda R, x: R.multiply(x, _hardsig(R, x))),
    "log_sigmoid": _one(lambda R, x: R.negative(_log1pexp(R, R.negative(x)))),
    "softshrink": lambda R, a, at: _shrink(R, a, at, True),
    "hardshrink": lambda R, a, at: _shrink(R, a, at, False),
}


def _cmp(name):
    return lambda R, a, at: getattr(R, name)(*R.pair(a[0], a[1]))


def _logical(name):
    return lambda R, a, at: getattr(R, name)(R.astype(a[0], "bool"), R.astype(a[1], "bool"))


COMPARE = {
    "eq": _cmp("equal"), "ne": _cmp("not_equal"), "lt": _cmp("less"),
    "le": _cmp("less_equal"), "gt": _cmp("greater"), "ge": _cmp("greater_equal"),
    "logical_and": _logical("logical_and"), "logical_or": _logical("logical_or"),
    "logical_xor": _logical("logical_xor"),
    "bitwise_and": _cmp("bitwise_and"), "bitwise_or": _cmp("bitwise_or"),
    "bitwise_xor": _cmp("bitwise_xor"),
}


def _fminmax(name):
    def rule(R, a, at):
        x, y = R.pair(a[0], a[1])
        m = getattr(R, name)(x, y)
        if not R.dtype(x).startswith("float"):
            return m
        return R.where(R.isnan(x), y, R.where(R.isnan(y), x, m))
    return rule


def _logaddexp(R, x, y):
    m = R.emit(R.maximum(x, y))
    d = R.negative(R.abs(R.subtract(x, y)))
    out = R.add(m, _log1p(R, R.exp(d)))
    return R.where(R.isinf(m), m, out)


def _logaddexp2(R, a, at):
    ln2 = math.log(2)
    x, y = R.pair(a[0], a[1])
    e = _logaddexp(R, R.multiply(x, _k(R, ln2, x)), R.multiply(y, _k(R, ln2, y)))
    return R.divide(e, _k(R, ln2, x))


BINARY = {
    "maximum": _cmp("maximum"), "minimum": _cmp("minimum"),
    "fmax": _fminmax("maximum"), "fmin": _fminmax("minimum"),
    "hypot": lambda R, a, at: (lambda x, y: R.sqrt(R.add(R.multiply(x, x), R.multiply(y, y)))
                               )(*R.pair(a[0], a[1])),
    "logaddexp": lambda R, a, at: _logaddexp(R, *R.pair(a[0], a[1])),
    "logaddexp2": _logaddexp2,
}


def _dims(R, x, at) -> list:
    nd = len(R.shape(x))
    dim = at.get("dim")
    if dim is None or dim == ():
        return list(range(nd))
    dim = dim if isinstance(dim, (tuple, list)) else (dim,)
    return [d % max(nd, 1) for d in dim] if nd else []


_NARROW_INTS = ("bool", "int8", "int16", "int32", "uint8")


def _reduce(name: str):
    def rule(R, a, at):
        x = a[0]
        dt = at.get("dtype")
        if dt is not None:
            x = R.astype(x, str(dt.np))
        dims, keep = _dims(R, x, at), at.get("keepdim", False)
        if not dims:  # a 0-d tensor: the reduction over nothing
            return x
        if name in ("sum", "prod") and R.dtype(x) in _NARROW_INTS:
            x = R.astype(x, "int64")  # PyTorch's sum of bools or int32s counts in int64
        return getattr(R, name)(x, dims, keep)
    return rule


def _nanreduce(mean: bool):
    def rule(R, a, at):
        x = a[0]
        dims, keep = _dims(R, x, at), at.get("keepdim", False)
        nan = R.isnan(x)
        total = R.sum(R.where(nan, _k(R, 0, x), x), dims, keep)
        if not mean:
            return total
        count = R.sum(R.astype(R.logical_not(nan), R.dtype(x)), dims, keep)
        return R.divide(total, count)
    return rule


def _logsumexp(R, a, at):
    x = a[0]
    dims, keep = _dims(R, x, at), at.get("keepdim", False)
    m = R.emit(R.max(x, dims, True))
    m = R.emit(R.where(R.isfinite(m), m, _k(R, 0, x)))
    out = R.add(R.log(R.sum(R.exp(R.subtract(x, m)), dims, True)), m)
    return out if keep else R.squeeze(out, dims)


REDUCE = {"sum": _reduce("sum"), "mean": _reduce("mean"), "amax": _reduce("max"),
          "amin": _reduce("min"), "prod": _reduce("prod"), "nansum": _nanreduce(False),
          "nanmean": _nanreduce(True), "logsumexp": _logsumexp}


# ---- arithmetic ---------------------------------------------------------------------------

def _scaled(R, y, alpha):
    return y if alpha == 1 else R.multiply(y, _k(R, alpha, y))


def add(R, a, at):
    x, y = R.pair(a[0], a[1])
    return R.add(x, _scaled(R, y, at.get("alpha", 1)))


def sub(R, a, at):
    x, y = R.pair(a[0], a[1])
    return R.subtract(x, _scaled(R, y, at.get("alpha", 1)))


def mul(R, a, at):
    return R.multiply(*R.pair(a[0], a[1]))


def div(R, a, at):
    x, y = R.pair(a[0], a[1])
    mode = at.get("rounding_mode")
    if mode == "floor":
        return R.floor_divide(x, y)
    q = R.divide(x, y)
    return R.trunc(q) if mode == "trunc" and R.dtype(x).startswith("float") else q


def remainder(R, a, at):
    return R.floor_mod(*R.pair(a[0], a[1]))


def fmod(R, a, at):
    return R.mod(*R.pair(a[0], a[1]))


def power(R, a, at):
    return R.power(*R.pair(a[0], a[1]))


def atan2(R, a, at):
    x, y = R.pair(a[0], a[1])
    return R.atan2(_wide(R, x), _wide(R, y))


def lerp(R, a, at):
    """PyTorch's formula: exact at both ends, from whichever end the weight is nearer."""
    s, e = R.pair(a[0], a[1])
    w = R.pair(a[2], s)[0]
    diff = R.emit(R.subtract(e, s))
    near = R.less(R.abs(w), _k(R, 0.5, s))
    return R.where(near, R.add(s, R.multiply(w, diff)),
                   R.subtract(e, R.multiply(diff, R.subtract(_k(R, 1.0, s), w))))


def clamp(R, a, at):
    x, lo, hi = a
    if lo is not None:
        x = R.maximum(*R.pair(x, lo))
    if hi is not None:
        x = R.minimum(*R.pair(x, hi))
    return x


def where(R, a, at):
    x, y = R.pair(a[1], a[2])
    return R.where(R.astype(a[0], "bool"), x, y)


def masked_fill(R, a, at):
    x, v = R.pair(a[0], a[2])
    return R.where(R.astype(a[1], "bool"), v, x)


def addcmul(R, a, at):
    x, t1 = R.pair(a[0], a[1])
    t2 = R.pair(a[2], x)[0]
    return R.add(x, _scaled(R, R.multiply(t1, t2), at.get("value", 1)))


def addcdiv(R, a, at):
    x, t1 = R.pair(a[0], a[1])
    t2 = R.pair(a[2], x)[0]
    return R.add(x, _scaled(R, R.divide(t1, t2), at.get("value", 1)))


# ---- shapes -------------------------------------------------------------------------------

def view(R, a, at):
    return R.reshape(a[0], list(at["shape"]))


def unsqueeze(R, a, at):
    return R.expand_dims(a[0], at["dim"])


def permute(R, a, at):
    return R.permute_dims(a[0], list(at["dims"]))


def expand(R, a, at):
    x, shape = a[0], tuple(at["shape"])
    xs = R.shape(x)
    lead = len(shape) - len(xs)
    full = [xs[i - lead] if s == -1 else s for i, s in enumerate(shape)]
    return R.broadcast_to(x, full)


def cat(R, a, at):
    ts = [R.pair(t, a[0])[0] for t in a]
    return R.concat(ts, axis=at.get("dim", 0))


def flip(R, a, at):
    x = a[0]
    for d in at["dims"]:
        x = R.flip(x, d)
    return x


def cast(R, a, at):
    return R.astype(a[0], str(at["dtype"].np))


def identity(R, a, at):
    return a[0]


def copy(R, a, at):
    return R.broadcast_to(R.astype(a[1], R.dtype(a[0])), list(R.shape(a[0])))


def _slice_dim(R, x, d, lo, hi, step=1):
    return R.strided_slice(x, [d], [lo], [hi], [step])


def slice_(R, a, at):
    """Basic indexing: slices with positive steps, integers, None and Ellipsis."""
    x, key = a[0], at["key"]
    key = key if isinstance(key, tuple) else (key,)
    skip = len(R.shape(x)) - sum(1 for k in key if k is not None and k is not Ellipsis)
    d = 0
    for k in key:
        if k is None:
            x = R.expand_dims(x, d)
            d += 1
        elif k is Ellipsis:
            d += skip
        elif isinstance(k, slice):
            lo, hi, st = k.indices(R.shape(x)[d])
            if st < 0:
                raise NotImplementedError("slice: no Relax rule for a negative step")
            if (lo, hi, st) != (0, R.shape(x)[d], 1):
                x = R.emit(_slice_dim(R, x, d, lo, max(hi, lo), st))
            d += 1
        else:
            i = int(k) % R.shape(x)[d]
            x = R.squeeze(_slice_dim(R, x, d, i, i + 1), [d])
    return x


def split_view(R, a, at):
    x, dim = a[0], at["dim"]
    pieces = [_slice_dim(R, x, dim, lo, hi) for lo, hi in at["bounds"]]
    if at.get("squeeze"):
        pieces = [R.squeeze(p, [dim]) for p in pieces]
    return tuple(pieces)


def split_backward(R, a, at):
    shape, dim = tuple(at["shape"]), at["dim"]
    dt = next(R.dtype(g) for g in a if g is not None)
    parts = []
    for g, (lo, hi) in zip(a, at["bounds"]):
        if g is None:
            part = shape[:dim] + (hi - lo,) + shape[dim + 1:]
            g = R.zeros(part, dt)
        elif at.get("squeeze"):
            g = R.expand_dims(g, dim)
        parts.append(g)
    return R.concat(parts, axis=dim)


# ---- linear algebra, convolution, pooling ---------------------------------------------------

def matmul(R, a, at):
    x, y = R.pair(a[0], a[1])
    return R.matmul(x, y)


_CONV = {1: "conv1d", 2: "conv2d", 3: "conv3d"}


def _conv_raw(R, x, w, at):
    nd = len(R.shape(x)) - 2
    if nd not in _CONV:
        raise NotImplementedError(f"conv: no Relax rule for {nd} spatial dims")
    pads = [lo for lo, _ in at["pads"]] + [hi for _, hi in at["pads"]]
    return getattr(R.nn, _CONV[nd])(x, w, strides=list(at["stride"]), padding=pads,
                                    dilation=list(at["dilation"]), groups=at["groups"])


def conv(R, a, at):
    x, w, b = a
    out = _conv_raw(R, x, w, at)
    if b is not None:
        nd = len(R.shape(x)) - 2
        out = R.add(out, R.reshape(b, [1, -1] + [1] * nd))
    return out


def conv_pointwise(R, a, at):
    x, w, b, r = a
    y = conv(R, (x, w, b), at)
    first = r is not None and at["residual_first"]
    if first:
        y = R.add(y, r)
    if at["activation"] == "relu":
        y = R.maximum(y, _k(R, 0, y))
    elif at["activation"] == "clamp":
        lo, hi = at["bounds"]
        y = R.minimum(R.maximum(y, _k(R, lo, y)), _k(R, hi, y))
    return R.add(y, r) if r is not None and not first else y


def conv_input_grad(R, a, at):
    """The transposed convolution, with output padding making up the rows the forward's
    stride left unread."""
    g, w = a
    shape = tuple(at["input_shape"])
    nd = len(shape) - 2
    if nd != 2 or at["groups"] != 1:
        raise NotImplementedError("conv_input_grad: Relax rule for 2-d, ungrouped convs only")
    st, dl, pads = list(at["stride"]), list(at["dilation"]), at["pads"]
    k, gs = R.shape(w)[2:], R.shape(g)[2:]
    extra = [shape[2 + i] - ((gs[i] - 1) * st[i] + dl[i] * (k[i] - 1) + 1 - pads[i][0]
                             - pads[i][1]) for i in range(nd)]
    if any(e < 0 or e >= max(st[i], dl[i]) for i, e in enumerate(extra)):
        raise NotImplementedError("conv_input_grad: no Relax rule for this padding")
    padding = [lo for lo, _ in pads] + [hi for _, hi in pads]
    return R.nn.conv2d_transpose(g, w, strides=st, padding=padding, output_padding=extra,
                                 dilation=dl, kernel_layout="IOHW")


def conv_weight_grad(R, a, at):
    """A convolution of the input with the gradient as its kernel, batch and channels
    swapped (stride and dilation trade places), cropped to the kernel's size."""
    x, g = a
    wshape = tuple(at["weight_shape"])
    nd = len(wshape) - 2
    if nd not in _CONV or at["groups"] != 1:
        raise NotImplementedError("conv_weight_grad: Relax rule for ungrouped convs only")
    perm = [1, 0] + list(range(2, nd + 2))
    xt, gt = R.permute_dims(x, perm), R.permute_dims(g, perm)
    pads = [lo for lo, _ in at["pads"]] + [hi for _, hi in at["pads"]]
    out = getattr(R.nn, _CONV[nd])(xt, gt, strides=list(at["dilation"]), padding=pads,
                                   dilation=list(at["stride"]))
    out = R.emit(R.permute_dims(out, perm))
    have = R.shape(out)
    if have[2:] != wshape[2:]:
        out = R.strided_slice(out, list(range(2, nd + 2)), [0] * nd, list(wshape[2:]))
    return out


def _pool_out(n, span, s, p, ceil_mode) -> int:
    num = n + 2 * p - span
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _windows(R, x, at, pad_value):
    """The input padded, and for each kernel offset the strided slice of it each output
    element sees at that offset (with that offset's position in the unpadded input)."""
    shape = R.shape(x)
    nd = len(shape) - 2
    k, s = tuple(at["kernel_size"]), tuple(at["stride"])
    p, d = tuple(at["padding"]), tuple(at.get("dilation", (1,) * nd))
    outs, pw = [], [0, 0, 0, 0]
    for i in range(nd):
        span = d[i] * (k[i] - 1) + 1
        o = _pool_out(shape[2 + i], span, s[i], p[i], at.get("ceil_mode", False))
        outs.append(o)
        pw += [p[i], max((o - 1) * s[i] + span - shape[2 + i] - p[i], 0)]
    xp = R.emit(R.nn.pad(x, pw, "constant", pad_value))
    views = []
    for off in np.ndindex(*k):
        begin = [off[i] * d[i] for i in range(nd)]
        end = [begin[i] + (outs[i] - 1) * s[i] + 1 for i in range(nd)]
        views.append((off, R.strided_slice(xp, list(range(2, nd + 2)), begin, end, list(s))))
    return views, outs, (k, s, p, d)


def max_pool_values(R, a, at):
    views, _, _ = _windows(R, a[0], at, float("-inf"))
    out = views[0][1]
    for _, v in views[1:]:
        out = R.maximum(out, v)
    return out


def max_pool(R, a, at):
    """Values and PyTorch's indices (flat positions in each (n, c) plane), the first
    maximum kept, as PyTorch's scan."""
    x = a[0]
    views, outs, (k, s, p, d) = _windows(R, x, at, float("-inf"))
    plane = R.shape(x)[2:]
    nd = len(plane)
    best, idx = None, None
    for off, v in views:
        v = R.emit(v)
        pos = np.zeros(outs, np.int64)
        for i in range(nd):
            coord = np.arange(outs[i]) * s[i] - p[i] + off[i] * d[i]
            pos = pos * plane[i] + coord.reshape([-1 if j == i else 1 for j in range(nd)])
        here = R.const(pos, "int64")
        if best is None:
            best, idx = v, R.broadcast_to(here, list(R.shape(v)))
            continue
        take = R.emit(R.logical_or(R.greater(v, best), R.isnan(v)))
        best = R.emit(R.where(take, v, best))
        idx = R.emit(R.where(take, here, idx))
    return best, idx


def max_pool_backward(R, a, at):
    g, idx = a
    shape = tuple(at["input_shape"])
    rows, plane = math.prod(shape[:2]), math.prod(shape[2:])
    per = math.prod(R.shape(g)[2:])
    flat = R.zeros((rows, plane), R.dtype(g))
    out = R.scatter_elements(flat, R.reshape(idx, [rows, per]), R.reshape(g, [rows, per]),
                             axis=1, reduction="add")
    return R.reshape(out, list(shape))


def avg_pool(R, a, at):
    x = a[0]
    views, outs, (k, s, p, d) = _windows(R, x, at, 0.0)
    total = views[0][1]
    for _, v in views[1:]:
        total = R.add(total, v)
    div = at.get("divisor_override")
    if div:
        return R.divide(total, _k(R, float(div), x))
    # the count of each window: with padding it counts the zero padding (not past it), as
    # PyTorch's count_include_pad; without, only the input's elements
    plane = R.shape(x)[2:]
    nd = len(plane)
    count = np.zeros(outs)
    inside = np.ones([n + 2 * q for n, q in zip(plane, p)]) if at.get("count_include_pad", True) \
        else np.pad(np.ones(plane), [(q, q) for q in p])
    for off in np.ndindex(*k):
        sl = tuple(slice(off[i] * d[i], off[i] * d[i] + (outs[i] - 1) * s[i] + 1, s[i])
                   for i in range(nd))
        part = inside[sl]
        count[tuple(slice(0, n) for n in part.shape)] += part
    return R.divide(total, R.const(count.astype(R.dtype(x)), R.dtype(x)))


def batch_norm(R, a, at):
    x, w, b, rm, rv = a
    nd = len(R.shape(x))
    axes = [0] + list(range(2, nd))
    bshape = [1, -1] + [1] * (nd - 2)
    if at["training"]:
        mean = R.emit(R.mean(x, axes))
        c = R.subtract(x, R.reshape(mean, bshape))
        var = R.emit(R.mean(R.multiply(c, c), axes))
    else:
        mean, var = rm, rv
    scale = R.rsqrt(R.add(var, _k(R, at["eps"], x)))
    if w is not None:
        scale = R.multiply(scale, w)
    out = R.multiply(R.subtract(x, R.reshape(mean, bshape)), R.reshape(scale, bshape))
    if b is not None:
        out = R.add(out, R.reshape(b, bshape))
    return out, mean, var


def layer_norm(R, a, at):
    x, w, b = a[0], a[1], a[2]
    nd = len(R.shape(x))
    axes = list(range(nd - len(at["normalized_shape"]), nd))
    mean = R.emit(R.mean(x, axes, True))
    c = R.emit(R.subtract(x, mean))
    var = R.mean(R.multiply(c, c), axes, True)
    out = R.multiply(c, R.rsqrt(R.add(var, _k(R, at["eps"], x))))
    if w is not None:
        out = R.multiply(out, w)
    if b is not None:
        out = R.add(out, b)
    return out


def softmax(R, a, at):
    x, dim = a[0], at["dim"]
    e = R.emit(R.exp(R.subtract(x, R.max(x, [dim], True))))
    return R.divide(e, R.sum(e, [dim], True))


def log_softmax(R, a, at):
    x, dim = a[0], at["dim"]
    z = R.emit(R.subtract(x, R.max(x, [dim], True)))
    return R.subtract(z, R.log(R.sum(R.exp(z), [dim], True)))


def softmax_backward(R, a, at):
    g, y = a
    return R.multiply(R.subtract(g, R.sum(R.multiply(g, y), [at["dim"]], True)), y)


def log_softmax_backward(R, a, at):
    g, y = a
    return R.subtract(g, R.multiply(R.exp(y), R.sum(g, [at["dim"]], True)))


def gelu_backward(R, a, at):
    g, x = a
    one, half = _k(R, 1.0, x), _k(R, 0.5, x)
    x2 = R.emit(R.multiply(x, x))
    if at.get("approximate", "none") == "tanh":
        inner = R.multiply(_k(R, _SQRT_2_PI, x),
                           R.add(x, R.multiply(_k(R, 0.044715, x), R.multiply(x2, x))))
        t = R.emit(R.tanh(inner))
        d_inner = R.multiply(_k(R, _SQRT_2_PI, x),
                             R.add(one, R.multiply(_k(R, 3 * 0.044715, x), x2)))
        left = R.multiply(half, R.add(one, t))
        right = R.multiply(R.multiply(R.multiply(half, x), R.subtract(one, R.multiply(t, t))),
                           d_inner)
        return R.multiply(g, R.add(left, right))
    cdf = R.multiply(half, R.add(one, R.erf(R.multiply(x, _k(R, _SQRT1_2, x)))))
    pdf = R.divide(R.exp(R.multiply(_k(R, -0.5, x), x2)), _k(R, math.sqrt(2 * math.pi), x))
    return R.multiply(g, R.add(cdf, R.multiply(x, pdf)))


def silu_backward(R, a, at):
    g, x = a
    s = R.emit(R.sigmoid(x))
    one = _k(R, 1.0, x)
    return R.multiply(g, R.multiply(s, R.add(one, R.multiply(x, R.subtract(one, s)))))


# ---- indexing -------------------------------------------------------------------------------

def gather(R, a, at):
    return R.gather_elements(a[0], a[1], axis=at["dim"] % len(R.shape(a[0])))


def index_select(R, a, at):
    return R.take(a[0], a[1], axis=at["dim"] % len(R.shape(a[0])))


def embedding(R, a, at):
    return R.take(a[0], a[1], axis=0)


def embedding_backward(R, a, at):
    g, idx = a
    n, pad = at["num_weights"], at.get("padding_idx", -1)
    t = math.prod(R.shape(idx))
    flat = R.emit(R.reshape(idx, [t]))
    rows = R.reshape(g, [t, -1])
    dt = R.dtype(g)
    w = R.ones((t,), dt)
    if at.get("scale_grad_by_freq"):
        counts = R.scatter_elements(R.zeros((n,), dt), flat, R.ones((t,), dt),
                                    reduction="add")
        w = R.divide(w, R.take(counts, flat, axis=0))
    if pad is not None and pad >= 0:
        w = R.where(R.equal(flat, R.const(pad, R.dtype(flat))), R.zeros((t,), dt), w)
    upd = R.emit(R.multiply(rows, R.expand_dims(w, 1)))
    d = R.shape(upd)[1]
    return R.scatter_nd(R.zeros((n, d), dt), R.expand_dims(flat, 1), upd, reduction="add")


# ---- losses ---------------------------------------------------------------------------------

def _nll_layout(R, shape, t):
    if len(shape) == 1:
        return (1, shape[0], 1), R.reshape(t, [1, 1])
    rest = math.prod(shape[2:])
    return (shape[0], shape[1], rest), R.reshape(t, [shape[0], rest])


def _nll_weights(R, t2, w, ignore, dtype):
    valid = R.emit(R.not_equal(t2, R.const(ignore, R.dtype(t2))))
    safe = R.emit(R.where(valid, t2, R.const(0, R.dtype(t2))))
    zero = R.zeros(R.shape(t2), dtype)
    wt = R.ones(R.shape(t2), dtype) if w is None else R.take(w, safe, axis=0)
    return valid, safe, R.emit(R.where(valid, wt, zero))


def nll_loss(R, a, at):
    x, t, w = a
    red = at.get("reduction", "mean")
    shape = R.shape(x)
    s3, t2 = _nll_layout(R, shape, t)
    x3 = R.reshape(x, list(s3))
    valid, safe, wt = _nll_weights(R, t2, w, at.get("ignore_index", -100), R.dtype(x))
    picked = R.squeeze(R.gather_elements(x3, R.expand_dims(safe, 1), axis=1), [1])
    loss = R.emit(R.multiply(R.negative(picked), wt))
    if red == "none":
        return R.reshape(loss, list(R.shape(t)) if len(shape) > 1 else [])
    total = R.sum(loss)
    return total if red == "sum" else R.divide(total, R.sum(wt))


def nll_loss_backward(R, a, at):
    g, t, w = a
    shape, red = tuple(at["shape"]), at.get("reduction", "mean")
    s3, t2 = _nll_layout(R, shape, t)
    dt = R.dtype(g)
    _, safe, wt = _nll_weights(R, t2, w, at.get("ignore_index", -100), dt)
    if red == "none":
        scale = R.multiply(R.reshape(g, list(R.shape(t2))), wt)
    elif red == "sum":
        scale = R.multiply(g, wt)
    else:
        scale = R.divide(R.multiply(g, wt), R.sum(wt))
    classes = R.const(np.arange(s3[1]).reshape(1, -1, 1), R.dtype(safe))
    hit = R.equal(R.expand_dims(safe, 1), classes)
    out = R.where(hit, R.negative(R.expand_dims(scale, 1)), R.zeros(s3, dt))
    return R.reshape(out, list(shape))


# ---- resampling -----------------------------------------------------------------------------

def interpolate(R, a, at):
    """``area`` (adaptive average pooling) and ``nearest``; other modes have no rule here."""
    x, mode, size = a[0], at["mode"], tuple(at["size"])
    if mode not in ("area", "nearest"):
        raise NotImplementedError(f"interpolate: no Relax rule for mode '{mode}'")
    for i, n_out in enumerate(size):
        d, n_in = 2 + i, R.shape(x)[2 + i]
        if n_in == n_out:
            continue
        if mode == "area":
            parts = [R.mean(_slice_dim(R, x, d, (j * n_in) // n_out,
                                       -(-((j + 1) * n_in) // n_out)), [d], True)
                     for j in range(n_out)]
            x = R.emit(R.concat(parts, axis=d))
        else:
            scale = at["scales"][i] if at.get("scales") else None
            s = (1.0 / scale) if scale else n_in / n_out
            src = [min(int(math.floor(j * s)), n_in - 1) for j in range(n_out)]
            x = R.emit(R.take(x, R.const(np.array(src, np.int64), "int64"), axis=d))
    return x


# ---- scans, triangles, padding, group norm, constants ---------------------------------------

def cumulative(name: str):
    """``cumsum``/``cumprod`` along ``dim``, run backwards for ``reverse``."""
    def rule(R, a, at):
        x, dt = a[0], at.get("dtype")
        if dt is not None:
            x = R.astype(x, str(dt.np))
        elif R.dtype(x) in _NARROW_INTS:
            x = R.astype(x, "int64")
        nd = len(R.shape(x))
        if nd == 0:
            return x
        d = at["dim"] % nd
        f = getattr(R, name)
        if at.get("reverse"):
            return R.flip(f(R.flip(x, d), axis=d), d)
        return f(x, axis=d)
    return rule


def arg(name: str):
    """``argmax``/``argmin``, flattened when ``dim`` is None."""
    def rule(R, a, at):
        x, dim, keep = a[0], at.get("dim"), at.get("keepdim", False)
        shape = R.shape(x)
        if dim is None:
            i = getattr(R, name)(R.reshape(x, [math.prod(shape)]), 0)
            return R.reshape(i, [1] * len(shape) if keep else [])
        if not shape:
            return R.zeros((), "int64")
        return getattr(R, name)(x, dim % len(shape), keep)
    return rule


def logical(name: str):
    """``all``/``any`` over ``dim`` (every dim when None; ``dim=()`` reduces nothing)."""
    def rule(R, a, at):
        x, dim = a[0], at.get("dim")
        nd = len(R.shape(x))
        dims = list(range(nd)) if dim is None else [
            d % max(nd, 1) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))]
        dims = [d for d in dims if d < nd]
        b = R.astype(R.astype(x, "bool"), "int8")
        if not dims:
            return R.astype(b, "bool")
        out = (R.min if name == "all" else R.max)(b, dims, at.get("keepdim", False))
        return R.astype(out, "bool")
    return rule


def tri(name: str):
    return lambda R, a, at: getattr(R, name)(a[0], at.get("diagonal", 0))


def constant_pad(R, a, at):
    """Negative pads crop (a strided slice), positive ones pad with ``value``."""
    x, pads = a[0], at["pads"]
    shape = R.shape(x)
    lead = len(shape) - len(pads)
    axes = list(range(lead, len(shape)))
    lo = [max(-p, 0) for p, _ in pads]
    hi = [shape[lead + i] - max(-q, 0) for i, (_, q) in enumerate(pads)]
    if any(lo) or any(h != shape[lead + i] for i, h in enumerate(hi)):
        x = R.strided_slice(x, axes, lo, hi)
    width = [0, 0] * lead + [w for p, q in pads for w in (max(p, 0), max(q, 0))]
    if not any(width):
        return x
    return R.nn.pad(x, width, "constant", float(at.get("value", 0)))


def group_norm(R, a, at):
    x, w, b = a
    shape = R.shape(x)
    n, c, g = shape[0], shape[1], at["num_groups"]
    xr = R.emit(R.reshape(x, [n, g, math.prod(shape[1:]) // g]))
    mean = R.emit(R.mean(xr, [2], True))
    cen = R.emit(R.subtract(xr, mean))
    var = R.mean(R.multiply(cen, cen), [2], True)
    out = R.reshape(R.multiply(cen, R.rsqrt(R.add(var, _k(R, at["eps"], x)))),
                    [n, c, math.prod(shape[2:])])
    if w is not None:
        out = R.multiply(out, R.expand_dims(w, 1))
    if b is not None:
        out = R.add(out, R.expand_dims(b, 1))
    return R.reshape(out, list(shape))


def constant(kernel):
    """A creation op without tensor inputs (``arange``, ``full``): its value, computed by
    its kernel when the graph is lowered, as a constant of the function."""
    def rule(R, a, at):
        v = np.asarray(kernel(*a, **at))
        return R.const(v, str(v.dtype))
    return rule


_TABLES = (UNARY, ACTIVATION, COMPARE, BINARY, REDUCE)


def rule(name: str):
    """The rule of the factory-made op ``name`` from the tables here, or None.

    >>> rule("exp") is UNARY["exp"]
    True
    """
    for table in _TABLES:
        if name in table:
            return table[name]
    return None
