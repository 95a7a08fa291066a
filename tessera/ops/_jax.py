"""The vocabulary of ``to_jax`` rules: how an op computes, as ``jax.numpy`` and ``lax`` calls.

A rule is ``rule(jnp, lax, a, at) -> array | tuple``: ``a`` holds the node's inputs (JAX
arrays for tensors, Python values for constants, None for absent optional tensors), already
cast to the op's compute type; ``at`` its attrs. The XLA backend (``tessera.compiler.xla``)
casts the results to the dtypes ``infer`` gave, so a rule computes and never converts.
Nothing here imports JAX: the backend hands its modules to the rules, and the few rules
that differentiate through another (the convolutions' gradients) import it when they run.
Ops made by a family's factory (unary functions, activations, reductions, comparisons) find
their rule by name in the tables below; every other op writes its own in its ``defop``.

>>> import numpy as np
>>> UNARY["neg"](np, None, [np.array([1.0, -2.0])], {})
array([-1.,  2.])
"""
from __future__ import annotations

import math

__all__ = ["UNARY", "ACTIVATION", "COMPARE", "REDUCE", "BINARY", "add", "sub", "div", "conv",
           "conv_input_grad", "conv_weight_grad", "max_pool", "max_pool_values",
           "max_pool_backward", "avg_pool", "batch_norm", "nll_loss", "nll_loss_backward",
           "interpolate", "split_view", "split_backward", "expand", "softmax", "log_softmax",
           "softmax_backward", "log_softmax_backward", "layer_norm", "lerp", "clamp",
           "gelu_backward", "silu_backward", "embedding_backward", "cumulative", "sort", "topk",
           "arg", "logical", "scatter", "scatter_add", "scatter_reduce", "cumulative_extremum",
           "index_add", "index_copy", "index_fill", "take", "index", "index_put", "constant_pad",
           "pad", "group_norm", "tri", "constant", "extremum", "extremum_dim", "variance", "round_",
           "squeeze", "roll", "rms_norm", "logit", "nan_to_num", "order_statistic",
           "median_all", "isclose", "one_hot", "searchsorted", "variance_mean",
           "aminmax", "prelu", "vdot", "diagonal",
           "binary_cross_entropy", "layer_norm_backward",
           "batch_norm_backward", "rule"]

_SQRT1_2 = 1 / math.sqrt(2)
_SQRT_2_PI = math.sqrt(2 / math.pi)


def _one(f):
    """A rule of one tensor input and no attrs."""
    return lambda jnp, lax, a, at: f(jnp, lax, a[0])


UNARY = {
    "exp": _one(lambda jnp, lax, x: jnp.exp(x)),
    "exp2": _one(lambda jnp, lax, x: jnp.exp2(x)),
    "expm1": _one(lambda jnp, lax, x: jnp.expm1(x)),
    "log": _one(lambda jnp, lax, x: jnp.log(x)),
    "log2": _one(lambda jnp, lax, x: jnp.log2(x)),
    "log10": _one(lambda jnp, lax, x: jnp.log10(x)),
    "log1p": _one(lambda jnp, lax, x: jnp.log1p(x)),
    "sqrt": _one(lambda jnp, lax, x: jnp.sqrt(x)),
    "rsqrt": _one(lambda jnp, lax, x: lax.rsqrt(x)),
    "reciprocal": _one(lambda jnp, lax, x: 1 / x),
    "sin": _one(lambda jnp, lax, x: jnp.sin(x)),
    "cos": _one(lambda jnp, lax, x: jnp.cos(x)),
    "tan": _one(lambda jnp, lax, x: jnp.tan(x)),
    "asin": _one(lambda jnp, lax, x: jnp.arcsin(x)),
    "acos": _one(lambda jnp, lax, x: jnp.arccos(x)),
    "atan": _one(lambda jnp, lax, x: jnp.arctan(x)),
    "sinh": _one(lambda jnp, lax, x: jnp.sinh(x)),
    "cosh": _one(lambda jnp, lax, x: jnp.cosh(x)),
    "tanh": _one(lambda jnp, lax, x: jnp.tanh(x)),
    "asinh": _one(lambda jnp, lax, x: jnp.arcsinh(x)),
    "acosh": _one(lambda jnp, lax, x: jnp.arccosh(x)),
    "atanh": _one(lambda jnp, lax, x: jnp.arctanh(x)),
    "sigmoid": _one(lambda jnp, lax, x: lax.logistic(x)),
    "erf": _one(lambda jnp, lax, x: lax.erf(x)),
    "erfc": _one(lambda jnp, lax, x: lax.erfc(x)),
    "erfinv": _one(lambda jnp, lax, x: lax.erf_inv(x)),
    "lgamma": _one(lambda jnp, lax, x: lax.lgamma(x)),
    "digamma": _one(lambda jnp, lax, x: lax.digamma(x)),
    "abs": _one(lambda jnp, lax, x: jnp.abs(x)),
    "neg": _one(lambda jnp, lax, x: -x),
    "positive": _one(lambda jnp, lax, x: x),
    "sign": _one(lambda jnp, lax, x: jnp.sign(x)),
    "floor": _one(lambda jnp, lax, x: jnp.floor(x)),
    "ceil": _one(lambda jnp, lax, x: jnp.ceil(x)),
    "trunc": _one(lambda jnp, lax, x: jnp.trunc(x)),
    "frac": _one(lambda jnp, lax, x: x - jnp.trunc(x)),
    "square": _one(lambda jnp, lax, x: x * x),
    "relu": _one(lambda jnp, lax, x: jnp.maximum(x, 0)),
    "isnan": _one(lambda jnp, lax, x: jnp.isnan(x)),
    "isinf": _one(lambda jnp, lax, x: jnp.isinf(x)),
    "isfinite": _one(lambda jnp, lax, x: jnp.isfinite(x)),
    "isposinf": _one(lambda jnp, lax, x: jnp.isposinf(x)),
    "isneginf": _one(lambda jnp, lax, x: jnp.isneginf(x)),
    "signbit": _one(lambda jnp, lax, x: jnp.signbit(x)),
    "logical_not": _one(lambda jnp, lax, x: jnp.logical_not(x)),
    "bitwise_not": _one(lambda jnp, lax, x: jnp.invert(x)),
}


def _gelu(jnp, lax, a, at):
    x = a[0]
    if at.get("approximate", "none") == "tanh":
        return 0.5 * x * (1 + jnp.tanh(_SQRT_2_PI * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1 + lax.erf(x * _SQRT1_2))


def _softplus(jnp, lax, a, at):
    x, beta, th = a[0], at.get("beta", 1.0), at.get("threshold", 20.0)
    z = x * beta
    return jnp.where(z > th, x, jnp.log1p(jnp.exp(jnp.minimum(z, th))) / beta)


ACTIVATION = {
    "gelu": _gelu,
    "silu": _one(lambda jnp, lax, x: x * lax.logistic(x)),
    "mish": _one(lambda jnp, lax, x: x * jnp.tanh(jnp.logaddexp(x, 0))),
    "softplus": _softplus,
    "leaky_relu": lambda jnp, lax, a, at: jnp.where(a[0] > 0, a[0],
                                                    a[0] * at.get("negative_slope", 0.01)),
    "elu": lambda jnp, lax, a, at: jnp.where(
        a[0] <= 0, jnp.expm1(a[0] * at.get("input_scale", 1.0)) * (at.get("alpha", 1.0) *
                                                                   at.get("scale", 1.0)),
        a[0] * at.get("scale", 1.0)),
    "hardtanh": lambda jnp, lax, a, at: jnp.clip(a[0], at.get("min_val", -1.0),
                                                 at.get("max_val", 1.0)),
    "threshold": lambda jnp, lax, a, at: jnp.where(a[0] <= at["threshold"], at["value"], a[0]),
    "hardsigmoid": _one(lambda jnp, lax, x: jnp.clip(x + 3, 0, 6) / 6),
    "hardswish": _one(lambda jnp, lax, x: x * jnp.clip(x + 3, 0, 6) / 6),
    "log_sigmoid": _one(lambda jnp, lax, x: -jnp.logaddexp(-x, 0)),
    "softshrink": lambda jnp, lax, a, at: jnp.where(
        a[0] > at.get("lambd", 0.5), a[0] - at.get("lambd", 0.5),
        jnp.where(a[0] < -at.get("lambd", 0.5), a[0] + at.get("lambd", 0.5), 0)),
    "hardshrink": lambda jnp, lax, a, at: jnp.where(jnp.abs(a[0]) > at.get("lambd", 0.5),
                                                    a[0], 0),
}

COMPARE = {
    "eq": lambda jnp, lax, a, at: a[0] == a[1],
    "ne": lambda jnp, lax, a, at: a[0] != a[1],
    "lt": lambda jnp, lax, a, at: a[0] < a[1],
    "le": lambda jnp, lax, a, at: a[0] <= a[1],
    "gt": lambda jnp, lax, a, at: a[0] > a[1],
    "ge": lambda jnp, lax, a, at: a[0] >= a[1],
    "logical_and": lambda jnp, lax, a, at: jnp.logical_and(a[0], a[1]),
    "logical_or": lambda jnp, lax, a, at: jnp.logical_or(a[0], a[1]),
    "logical_xor": lambda jnp, lax, a, at: jnp.logical_xor(a[0], a[1]),
    "bitwise_and": lambda jnp, lax, a, at: jnp.bitwise_and(a[0], a[1]),
    "bitwise_or": lambda jnp, lax, a, at: jnp.bitwise_or(a[0], a[1]),
    "bitwise_xor": lambda jnp, lax, a, at: jnp.bitwise_xor(a[0], a[1]),
    "bitwise_left_shift": lambda jnp, lax, a, at: _shift(jnp, a, True),
    "bitwise_right_shift": lambda jnp, lax, a, at: _shift(jnp, a, False),
}


def _shift(jnp, a, left: bool):
    """PyTorch's shifts: by a negative amount or by the bit width or more, 0 (left) or the
    sign fill (right), as tessera's kernel."""
    x, b = jnp.asarray(a[0]), jnp.asarray(a[1])
    dt = jnp.result_type(x, b)
    if dt == jnp.bool_:
        raise NotImplementedError("shift of bool")
    x, b = x.astype(dt), b.astype(dt)
    bits = jnp.iinfo(dt).bits
    ok = (b >= 0) & (b < bits)
    safe = jnp.where(ok, b, 0)
    if left:
        return jnp.where(ok, jnp.left_shift(x, safe), 0).astype(dt)
    fill = jnp.right_shift(x, bits - 1) if jnp.issubdtype(dt, jnp.signedinteger) else \
        jnp.zeros_like(x)
    return jnp.where(ok, jnp.right_shift(x, safe), fill)

BINARY = {
    "maximum": lambda jnp, lax, a, at: jnp.maximum(a[0], a[1]),
    "minimum": lambda jnp, lax, a, at: jnp.minimum(a[0], a[1]),
    "fmax": lambda jnp, lax, a, at: jnp.fmax(a[0], a[1]),
    "fmin": lambda jnp, lax, a, at: jnp.fmin(a[0], a[1]),
    "hypot": lambda jnp, lax, a, at: jnp.hypot(a[0], a[1]),
    "logaddexp": lambda jnp, lax, a, at: jnp.logaddexp(a[0], a[1]),
    "logaddexp2": lambda jnp, lax, a, at: jnp.logaddexp2(a[0], a[1]),
}


def _dims(x, at) -> tuple:
    dim = at.get("dim")
    if dim is None or dim == ():  # PyTorch's amax(dim=()): every dim
        return tuple(range(x.ndim))
    dim = dim if isinstance(dim, (tuple, list)) else (dim,)
    return tuple(d % max(x.ndim, 1) for d in dim) if x.ndim else ()


def _reduce(name: str):
    def rule(jnp, lax, a, at):
        x = a[0]
        dt = at.get("dtype")
        if dt is not None:
            x = x.astype(dt.np)
        return getattr(jnp, name)(x, axis=_dims(x, at), keepdims=at.get("keepdim", False))
    return rule


REDUCE = {"sum": _reduce("sum"), "mean": _reduce("mean"), "amax": _reduce("max"),
          "amin": _reduce("min"), "prod": _reduce("prod"), "nansum": _reduce("nansum"),
          "nanmean": _reduce("nanmean"), "all": _reduce("all"), "any": _reduce("any"),
          "logsumexp": lambda jnp, lax, a, at: _logsumexp(jnp, a[0], _dims(a[0], at),
                                                          at.get("keepdim", False)),
          "count_nonzero": lambda jnp, lax, a, at: jnp.sum(a[0] != 0, axis=_dims(a[0], at)),
          "norm": lambda jnp, lax, a, at: _norm(jnp, a[0], at)}


def _norm(jnp, x, at):
    """The vector p-norm over ``dim`` (half precision accumulates in float32)."""
    if jnp.iscomplexobj(x):
        raise NotImplementedError("norm of a complex tensor")
    if at.get("dtype") is not None:
        x = x.astype(at["dtype"].np)
    if x.dtype in (jnp.float16, jnp.bfloat16):
        x = x.astype(jnp.float32)
    ax, p, keep = _dims(x, at), at.get("ord", 2.0), at.get("keepdim", False)
    a = jnp.abs(x)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=ax, keepdims=keep))
    if p == 1:
        return jnp.sum(a, axis=ax, keepdims=keep)
    if p == math.inf:
        return jnp.max(a, axis=ax, keepdims=keep)
    if p == -math.inf:
        return jnp.min(a, axis=ax, keepdims=keep)
    if p == 0:
        return jnp.sum(a != 0, axis=ax, keepdims=keep).astype(a.dtype)
    return jnp.sum(a ** p, axis=ax, keepdims=keep) ** (1.0 / p)


def _logsumexp(jnp, x, dims, keepdim):
    m = jnp.max(x, axis=dims, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0)
    out = jnp.log(jnp.sum(jnp.exp(x - m), axis=dims, keepdims=True)) + m
    return out if keepdim else jnp.squeeze(out, dims)


# ---- arithmetic ---------------------------------------------------------------------------

def add(jnp, lax, a, at):
    alpha = at.get("alpha", 1)
    return a[0] + (a[1] if alpha == 1 else alpha * a[1])


def sub(jnp, lax, a, at):
    alpha = at.get("alpha", 1)
    return a[0] - (a[1] if alpha == 1 else alpha * a[1])


def div(jnp, lax, a, at):
    mode = at.get("rounding_mode")
    q = a[0] / a[1]
    if mode == "trunc":
        return jnp.trunc(q)
    if mode == "floor":
        return jnp.floor_divide(a[0], a[1])
    return q


# ---- shapes -------------------------------------------------------------------------------

def expand(jnp, lax, a, at):
    x, shape = a[0], tuple(at["shape"])
    lead = len(shape) - x.ndim
    full = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(shape))
    return jnp.broadcast_to(x, full)


def split_view(jnp, lax, a, at):
    x, dim = a[0], at["dim"]
    pieces = [lax.slice_in_dim(x, lo, hi, axis=dim) for lo, hi in at["bounds"]]
    if at.get("squeeze"):
        pieces = [jnp.squeeze(p, dim) for p in pieces]
    return tuple(pieces)


def split_backward(jnp, lax, a, at):
    shape, dim = tuple(at["shape"]), at["dim"]
    out = None
    for g, (lo, hi) in zip(a, at["bounds"]):
        if g is None:
            continue
        if at.get("squeeze"):
            g = jnp.expand_dims(g, dim)
        if out is None:
            out = jnp.zeros(shape, g.dtype)
        idx = (slice(None),) * dim + (slice(lo, hi),)
        out = out.at[idx].add(g)
    return out


# ---- linear algebra, convolution, pooling ---------------------------------------------------

def _conv_raw(lax, x, w, at):
    return lax.conv_general_dilated(x, w, window_strides=tuple(at["stride"]),
                                    padding=[tuple(p) for p in at["pads"]],
                                    rhs_dilation=tuple(at["dilation"]),
                                    feature_group_count=at["groups"],
                                    precision=lax.Precision.HIGHEST)


def conv(jnp, lax, a, at):
    x, w, b = a
    out = _conv_raw(lax, x, w, at)
    if b is not None:
        out = out + b.reshape((1, -1) + (1,) * (out.ndim - 2))
    return out


def conv_pointwise(jnp, lax, a, at):
    x, w, b, r = a
    y = conv(jnp, lax, (x, w, b), at)
    first = r is not None and at["residual_first"]
    if first:
        y = y + r
    if at["activation"] == "relu":
        y = jnp.maximum(y, 0)
    elif at["activation"] == "clamp":
        y = jnp.minimum(jnp.maximum(y, at["bounds"][0]), at["bounds"][1])
    return y + r if r is not None and not first else y


def conv_input_grad(jnp, lax, a, at):
    import jax  # the transpose of the convolution, which XLA folds into one
    g, w = a
    _, pull = jax.vjp(lambda x: _conv_raw(lax, x, w, at), jnp.zeros(at["input_shape"], g.dtype))
    return pull(g)[0]


def conv_weight_grad(jnp, lax, a, at):
    import jax
    x, g = a
    _, pull = jax.vjp(lambda w: _conv_raw(lax, x, w, at), jnp.zeros(at["weight_shape"], x.dtype))
    return pull(g)[0]


def _window(x, at, pad_value, jnp, lax):
    """(padded x, window dims, strides, window dilation) over every dim, N and C included."""
    nd = x.ndim - 2
    k, s = tuple(at["kernel_size"]), tuple(at["stride"])
    p, d = tuple(at["padding"]), tuple(at.get("dilation", (1,) * nd))
    pads = []
    for i in range(nd):
        n = x.shape[2 + i]
        span = d[i] * (k[i] - 1) + 1
        out = _pool_out(n, span, s[i], p[i], at.get("ceil_mode", False))
        hi = max((out - 1) * s[i] + span - n - p[i], 0)
        pads.append((p[i], hi))
    return pads, (1, 1) + k, (1, 1) + s, (1, 1) + d


def _pool_out(n, span, s, p, ceil_mode) -> int:
    num = n + 2 * p - span
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def max_pool_values(jnp, lax, a, at):
    x = a[0]
    pads, win, st, dil = _window(x, at, None, jnp, lax)
    return lax.reduce_window(x, -jnp.inf, lax.max, win, st, [(0, 0), (0, 0)] + pads,
                             window_dilation=dil)


def max_pool(jnp, lax, a, at):
    """Values and PyTorch's indices (flat positions in each (n, c) plane): a variadic window
    reduction over (value, index) pairs that keeps the first maximum, as PyTorch's scan."""
    x = a[0]
    pads, win, st, dil = _window(x, at, None, jnp, lax)
    plane = x.shape[2:]
    idx = jnp.broadcast_to(jnp.arange(math.prod(plane), dtype=jnp.int64).reshape(plane),
                           x.shape)

    def pick(p, q):
        (va, ia), (vb, ib) = p, q
        take_b = (vb > va) | ((vb == va) & (ib < ia)) | jnp.isnan(vb)
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)
    vals, inds = lax.reduce_window((x, idx), (jnp.array(-jnp.inf, x.dtype),
                                              jnp.array(0, jnp.int64)),
                                   pick, win, st, [(0, 0), (0, 0)] + pads,
                                   window_dilation=dil)
    return vals, inds


def max_pool_backward(jnp, lax, a, at):
    g, idx = a
    shape = tuple(at["input_shape"])
    rows = math.prod(shape[:2])
    plane, per = math.prod(shape[2:]), math.prod(g.shape[2:])
    flat = jnp.zeros((rows, plane), g.dtype)
    r = jnp.arange(rows)[:, None]
    flat = flat.at[r, idx.reshape(rows, per)].add(g.reshape(rows, per))
    return flat.reshape(shape)


def avg_pool(jnp, lax, a, at):
    x = a[0]
    pads, win, st, dil = _window(x, at, None, jnp, lax)
    allp = [(0, 0), (0, 0)] + pads
    total = lax.reduce_window(x, jnp.array(0, x.dtype), lax.add, win, st, allp)
    div = at.get("divisor_override")
    if div:
        return total / div
    nd = x.ndim - 2
    k, s, p = tuple(at["kernel_size"]), tuple(at["stride"]), tuple(at["padding"])
    # the count of each window: with padding it counts the zero padding (not past it), as
    # PyTorch's count_include_pad; without, only the input's elements
    ones = jnp.ones(x.shape[2:], x.dtype)
    if at.get("count_include_pad", True):
        ones = jnp.pad(ones, [(p[i], p[i]) for i in range(nd)], constant_values=1)
        inner = [(0, max(lo + hi - 2 * p[i], 0)) for i, (lo, hi) in enumerate(pads)]
    else:
        inner = pads
    count = lax.reduce_window(ones, jnp.array(0, x.dtype), lax.add, k, s, inner)
    return total / count


def batch_norm(jnp, lax, a, at):
    x, w, b, rm, rv = a
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    if at["training"]:
        mean = jnp.mean(x, axis=axes)
        var = jnp.mean(jnp.square(x - mean.reshape(bshape)), axis=axes)
    else:
        mean, var = rm, rv
    scale = lax.rsqrt(var + at["eps"])
    if w is not None:
        scale = scale * w
    out = (x - mean.reshape(bshape)) * scale.reshape(bshape)
    if b is not None:
        out = out + b.reshape(bshape)
    return out, mean, var


def layer_norm(jnp, lax, a, at):
    x, w, b = a[0], a[1], a[2]
    axes = tuple(range(x.ndim - len(at["normalized_shape"]), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + at["eps"])
    out = (x - mean) * rstd
    if w is not None:
        out = out * w
    if b is not None:
        out = out + b
    return out


def softmax(jnp, lax, a, at):
    x = a[0]
    m = jnp.max(x, axis=at["dim"], keepdims=True)
    e = jnp.exp(x - m)
    return e / jnp.sum(e, axis=at["dim"], keepdims=True)


def log_softmax(jnp, lax, a, at):
    x = a[0]
    m = jnp.max(x, axis=at["dim"], keepdims=True)
    return x - m - jnp.log(jnp.sum(jnp.exp(x - m), axis=at["dim"], keepdims=True))


def softmax_backward(jnp, lax, a, at):
    g, y = a
    return (g - jnp.sum(g * y, axis=at["dim"], keepdims=True)) * y


def log_softmax_backward(jnp, lax, a, at):
    g, y = a
    return g - jnp.exp(y) * jnp.sum(g, axis=at["dim"], keepdims=True)


# ---- losses ---------------------------------------------------------------------------------

def _nll_layout(jnp, x, t):
    if x.ndim == 1:
        return x.reshape(1, -1, 1), t.reshape(1, 1)
    return x.reshape(x.shape[0], x.shape[1], -1), t.reshape(t.shape[0], -1)


def _nll_picks(jnp, t2, c, w, ignore, dtype):
    valid = t2 != ignore
    safe = jnp.where(valid, t2, 0)
    wt = jnp.ones_like(safe, dtype) if w is None else w[safe]
    return valid, safe, jnp.where(valid, wt, 0)


def nll_loss(jnp, lax, a, at):
    x, t, w = a
    red = at.get("reduction", "mean")
    x3, t2 = _nll_layout(jnp, x, t)
    valid, safe, wt = _nll_picks(jnp, t2, x3.shape[1], w, at.get("ignore_index", -100),
                                 x.dtype)
    picked = jnp.take_along_axis(x3, safe[:, None, :], axis=1)[:, 0, :]
    loss = jnp.where(valid, -picked * wt, 0)
    if red == "none":
        return loss.reshape(t.shape if x.ndim > 1 else ())
    if red == "sum":
        return jnp.sum(loss)
    return jnp.sum(loss) / jnp.sum(wt)


def nll_loss_backward(jnp, lax, a, at):
    g, t, w = a
    shape, red = tuple(at["shape"]), at.get("reduction", "mean")
    x3 = jnp.zeros(shape, g.dtype)
    x3, t2 = _nll_layout(jnp, x3, t)
    valid, safe, wt = _nll_picks(jnp, t2, x3.shape[1], w, at.get("ignore_index", -100),
                                 g.dtype)
    if red == "none":
        scale = g.reshape(t2.shape) * wt
    elif red == "sum":
        scale = g * wt
    else:
        scale = g * wt / jnp.sum(wt)
    n, k = t2.shape
    out = x3.at[jnp.arange(n)[:, None], safe, jnp.arange(k)[None, :]].set(-scale)
    return out.reshape(shape)


# ---- resampling -----------------------------------------------------------------------------

def interpolate(jnp, lax, a, at):
    """``area`` (adaptive average pooling) and ``nearest``; other modes have no rule here."""
    x, mode, size = a[0], at["mode"], tuple(at["size"])
    if mode not in ("area", "nearest"):
        raise NotImplementedError(f"interpolate: no XLA rule for mode '{mode}'")
    for i, n_out in enumerate(size):
        d, n_in = 2 + i, x.shape[2 + i]
        if n_in == n_out:
            continue
        if mode == "area":
            if n_in % n_out == 0:
                shp = x.shape[:d] + (n_out, n_in // n_out) + x.shape[d + 1:]
                x = jnp.mean(x.reshape(shp), axis=d + 1)
            else:
                parts = [jnp.mean(lax.slice_in_dim(x, (j * n_in) // n_out,
                                                   -(-((j + 1) * n_in) // n_out), axis=d),
                                  axis=d, keepdims=True) for j in range(n_out)]
                x = jnp.concatenate(parts, axis=d)
        else:
            scale = at["scales"][i] if at.get("scales") else None
            s = (1.0 / scale) if scale else n_in / n_out
            src = [min(int(math.floor(j * s)), n_in - 1) for j in range(n_out)]
            x = jnp.take(x, jnp.array(src), axis=d)
    return x


def lerp(jnp, lax, a, at):
    """PyTorch's formula: exact at both ends, from whichever end the weight is nearer."""
    s, e, w = a
    diff = e - s
    return jnp.where(jnp.abs(w) < 0.5, s + w * diff, e - diff * (1 - w))


def clamp(jnp, lax, a, at):
    x, lo, hi = a
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


def gelu_backward(jnp, lax, a, at):
    g, x = a
    if at.get("approximate", "none") == "tanh":
        inner = _SQRT_2_PI * (x + 0.044715 * x * x * x)
        t = jnp.tanh(inner)
        d_inner = _SQRT_2_PI * (1 + 3 * 0.044715 * x * x)
        return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * d_inner)
    cdf = 0.5 * (1 + lax.erf(x * _SQRT1_2))
    pdf = jnp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return g * (cdf + x * pdf)


def silu_backward(jnp, lax, a, at):
    g, x = a
    s = lax.logistic(x)
    return g * (s * (1 + x * (1 - s)))


def embedding_backward(jnp, lax, a, at):
    g, idx = a
    n, pad = at["num_weights"], at.get("padding_idx", -1)
    flat = idx.reshape(-1)
    rows = g.reshape(flat.shape[0], -1)
    w = jnp.ones(flat.shape, g.dtype)
    if at.get("scale_grad_by_freq"):
        counts = jnp.zeros((n,), g.dtype).at[flat].add(1)
        w = w / counts[flat]
    if pad is not None and pad >= 0:
        w = jnp.where(flat == pad, 0, w)
    return jnp.zeros((n, rows.shape[1]), g.dtype).at[flat].add(rows * w[:, None])


# ---- scans, sorting, scatter, padding, group norm ------------------------------------------

def cumulative(name: str):
    """``cumsum``/``cumprod``: along ``dim``, run backwards for ``reverse`` (a scan's
    gradient)."""
    def rule(jnp, lax, a, at):
        x, dt = a[0], at.get("dtype")
        if dt is not None:
            x = x.astype(dt.np)
        if x.ndim == 0:
            return x
        d, f = at["dim"] % x.ndim, getattr(jnp, name)
        if at.get("reverse"):
            return jnp.flip(f(jnp.flip(x, d), axis=d), d)
        return f(x, axis=d)
    return rule


def _stable_order(jnp, x, d, descending):
    """Stable argsort along ``d``, NaN the largest, as ``tessera.ops.sorting``'s kernel."""
    if not descending:
        return jnp.argsort(x, axis=d, stable=True)
    idx = jnp.argsort(jnp.flip(x, d), axis=d, stable=True)
    return (x.shape[d] - 1) - jnp.flip(idx, d)


def sort(jnp, lax, a, at):
    x = a[0]
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = at.get("dim", -1) % x.ndim
    idx = _stable_order(jnp, x, d, at.get("descending", False))
    return jnp.take_along_axis(x, idx, d), idx


def topk(jnp, lax, a, at):
    x = a[0]
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = at.get("dim", -1) % x.ndim
    idx = lax.slice_in_dim(_stable_order(jnp, x, d, at.get("largest", True)), 0, at["k"],
                           axis=d)
    return jnp.take_along_axis(x, idx, d), idx


def arg(name: str):
    """``argmax``/``argmin``: the first of ties; flattened when ``dim`` is None."""
    def rule(jnp, lax, a, at):
        x, dim, keep = a[0], at.get("dim"), at.get("keepdim", False)
        f = getattr(jnp, name)
        if dim is None:
            i = f(x.reshape(-1))
            return i.reshape((1,) * x.ndim if keep else ())
        if x.ndim == 0:
            return jnp.zeros((), jnp.int64)
        return f(x, axis=dim % x.ndim, keepdims=keep)
    return rule


def logical(name: str):
    """``all``/``any`` over ``dim`` (every dim when None; ``dim=()`` reduces nothing)."""
    def rule(jnp, lax, a, at):
        x, dim = a[0], at.get("dim")
        nd = x.ndim
        dims = tuple(range(nd)) if dim is None else tuple(
            d % max(nd, 1) for d in (dim if isinstance(dim, (tuple, list)) else (dim,)))
        dims = tuple(d for d in dims if d < nd)
        return getattr(jnp, name)(x.astype(bool), axis=dims, keepdims=at.get("keepdim", False))
    return rule


def _scatter_key(jnp, index, d):
    """The full index of each element of ``index`` with its value along ``d``."""
    grids = jnp.meshgrid(*[jnp.arange(n) for n in index.shape], indexing="ij")
    return tuple(index if k == d else g for k, g in enumerate(grids))


def scatter(jnp, lax, a, at):
    """``scatter`` (``reduce`` None, "add" or "multiply") and ``scatter_add``: ``src`` (or a
    number) written at ``index`` along ``dim``."""
    t, index, src = a
    if index.size == 0:
        return t
    reduce = "add" if at.get("_add") else at.get("reduce")
    if t.ndim == 0:  # one element, written (or combined) once
        src = jnp.reshape(jnp.asarray(src, t.dtype), ())
        return t + src if reduce == "add" else t * src if reduce == "multiply" else src
    d = at["dim"] % t.ndim
    key = _scatter_key(jnp, index, d)
    if hasattr(src, "shape") and src.ndim:
        src = src[tuple(slice(0, n) for n in index.shape)]
    ref = t.at[key]
    if reduce == "add":
        return ref.add(src)
    if reduce == "multiply":
        return ref.multiply(src)
    return ref.set(src)


def scatter_add(jnp, lax, a, at):
    return scatter(jnp, lax, a, dict(at, _add=True))


def cumulative_extremum(name: str):
    """``cummax``/``cummin``: an associative scan of (value, index) pairs along ``dim``; the
    later element wins a tie and every NaN wins, as in PyTorch."""
    largest = name == "cummax"

    def rule(jnp, lax, a, at):
        x = a[0]
        if x.ndim == 0:
            return x, jnp.zeros((), jnp.int64)
        d = at["dim"] % x.ndim
        x = x.astype(jnp.int8) if x.dtype == bool else x
        shape = [1] * x.ndim
        shape[d] = x.shape[d]
        i = jnp.broadcast_to(jnp.arange(x.shape[d]).reshape(shape), x.shape)

        def pick(early, late):
            (ev, ei), (lv, li) = early, late
            keep = lv >= ev if largest else lv <= ev
            if jnp.issubdtype(x.dtype, jnp.floating):
                keep = jnp.isnan(lv) | (~jnp.isnan(ev) & keep)
            return jnp.where(keep, lv, ev), jnp.where(keep, li, ei)
        return lax.associative_scan(pick, (x, i), axis=d)
    return rule


def scatter_reduce(jnp, lax, a, at):
    """``include_self=False`` first writes the reduction's identity at the indexed places;
    ``mean`` divides a sum by a scattered count (floor division for integers)."""
    t, index, src = a
    if index.size == 0:
        return t
    d = at["dim"] % t.ndim
    reduce = at["reduce"]
    key = _scatter_key(jnp, index, d)
    src = src[tuple(slice(0, n) for n in index.shape)]
    if not at.get("include_self", True):
        if reduce in ("amax", "amin"):
            big = jnp.inf if jnp.issubdtype(t.dtype, jnp.floating) else jnp.iinfo(t.dtype).max
            init = -big if reduce == "amax" else big
        else:
            init = 1 if reduce == "prod" else 0
        t = t.at[key].set(jnp.asarray(init, t.dtype))
    ref = t.at[key]
    if reduce == "sum":
        return ref.add(src)
    if reduce == "prod":
        return ref.multiply(src)
    if reduce == "amax":
        return ref.max(src)
    if reduce == "amin":
        return ref.min(src)
    total = ref.add(src)
    count = jnp.full(t.shape, int(at.get("include_self", True)), t.dtype).at[key].add(1)
    count = jnp.maximum(count, 1)
    return total / count if jnp.issubdtype(t.dtype, jnp.floating) else total // count


def _along(jnp, x, d, index):
    return (slice(None),) * d + (index.reshape(-1),)


def _index_write(mode):
    """``index_add`` (``alpha`` times ``source`` added) and ``index_copy`` along ``dim``."""
    def rule(jnp, lax, a, at):
        x, index, src = a
        if x.ndim == 0:
            src = src.reshape(())
            return x + src * at.get("alpha", 1) if mode == "add" else src
        d = at["dim"] % x.ndim
        k = index.size
        src = src.reshape(x.shape[:d] + (k,) + x.shape[d + 1:])
        ref = x.at[_along(jnp, x, d, index)]
        if mode == "add":
            alpha = at.get("alpha", 1)
            return ref.add(src if alpha == 1 or x.dtype == bool
                           else src * jnp.asarray(alpha, x.dtype))
        return ref.set(src)
    return rule


index_add = _index_write("add")
index_copy = _index_write("set")


def index_fill(jnp, lax, a, at):
    x, index, value = a
    if x.ndim == 0:
        return jnp.broadcast_to(jnp.asarray(value, x.dtype), ())
    d = at["dim"] % x.ndim
    return x.at[_along(jnp, x, d, index)].set(jnp.asarray(value).astype(x.dtype))


def take(jnp, lax, a, at):
    x, index = a
    return jnp.take(x.reshape(-1), index, mode="wrap")


def _np_key(key, idx):
    it = iter(idx)
    return tuple(k if isinstance(k, slice) else next(it) for k in key)


def index(jnp, lax, a, at):
    return a[0][_np_key(at["key"], a[1:])]


def index_put(jnp, lax, a, at):
    x, values, idx = a[0], a[1], a[2:]
    ref = x.at[_np_key(at["key"], idx)]
    values = jnp.asarray(values, x.dtype)
    return ref.add(values) if at.get("accumulate") else ref.set(values)


# ---- extrema, variance, rounding, squeeze, roll, RMS norm -----------------------------------

def extremum(name: str):
    """``max``/``min`` of every element (NaN wins, as jnp's)."""
    return lambda jnp, lax, a, at: getattr(jnp, name)(a[0])


def extremum_dim(name: str):
    """``max_dim``/``min_dim``: values and the first index of the extremum along ``dim``
    (the first NaN where there is one, as NumPy's argmax)."""
    def rule(jnp, lax, a, at):
        x = a[0]
        if x.ndim == 0:
            return x, jnp.zeros((), jnp.int64)
        d, keep = at["dim"] % x.ndim, at.get("keepdim", False)
        idx = getattr(jnp, "arg" + name)(x, axis=d, keepdims=True)
        vals = jnp.take_along_axis(x, idx, d)
        return (vals, idx) if keep else (jnp.squeeze(vals, d), jnp.squeeze(idx, d))
    return rule


def isclose(jnp, lax, a, at):
    """Equal, or a finite |a - b| (in the input dtype) within atol + |rtol * b| (in the
    float type), as tessera's kernel."""
    x, y = a
    rtol, atol = at.get("rtol", 1e-5), at.get("atol", 1e-8)
    close = x == y
    flt = jnp.issubdtype(x.dtype, jnp.floating)
    if at.get("equal_nan", False) and flt:
        close = close | (jnp.isnan(x) & jnp.isnan(y))
    if rtol == 0 and atol == 0:
        return close
    if x.dtype == jnp.bool_:
        x, y = x.astype(jnp.float32), y.astype(jnp.float32)
    ft = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
    ft = jnp.float32 if ft in (jnp.float16, jnp.bfloat16) else ft
    allowed = jnp.asarray(atol, ft) + jnp.abs(y.astype(ft) * jnp.asarray(rtol, ft))
    actual = jnp.abs(x - y)
    actual = actual.astype(ft) if x.dtype in (jnp.float16, jnp.bfloat16) else actual
    fin = jnp.isfinite(actual) if jnp.issubdtype(actual.dtype, jnp.floating) else True
    return close | (fin & (actual <= allowed))


def one_hot(jnp, lax, a, at):
    n = at.get("num_classes", -1)
    if n < 0:
        raise NotImplementedError("one_hot without num_classes: its shape depends on the data")
    return (a[0][..., None] == jnp.arange(n)).astype(jnp.int64)


def searchsorted(jnp, lax, a, at):
    """The kernel's binary search, step for step (NaN goes last), vectorised over the
    values: ceil(log2(n + 1)) + 1 rounds of a gather and a comparison."""
    seq, v, sorter = a
    right = at.get("right", False)
    n = seq.shape[-1]
    if n == 0:
        raise NotImplementedError("searchsorted in an empty sequence")
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    vv = jnp.asarray(v)
    ct = jnp.result_type(seq, vv) if not isinstance(v, (int, float)) else \
        (seq.dtype if isinstance(v, int) or jnp.issubdtype(seq.dtype, jnp.floating)
         else jnp.float32)
    seq, vv = seq.astype(ct), vv.astype(ct)
    rows = seq[None] if seq.ndim == 1 else seq.reshape(-1, n)
    vals = vv.reshape(rows.shape[0], -1)
    lo = jnp.zeros(vals.shape, jnp.int32)
    hi = jnp.full(vals.shape, n, jnp.int32)
    for _ in range(n.bit_length() + 1):
        active = lo < hi
        mid = (lo + hi) >> 1
        mv = jnp.take_along_axis(rows, jnp.minimum(mid, n - 1), axis=-1)
        go = ~(mv > vals) if right else ~(mv >= vals)
        lo = jnp.where(active & go, mid + 1, lo)
        hi = jnp.where(active & ~go, mid, hi)
    return lo.reshape(vv.shape)


def _keep(jnp, v, i, d, keep):
    return (v, i) if keep else (jnp.squeeze(v, d), jnp.squeeze(i, d))


def order_statistic(kind: str, all_equal_nth=None):
    """``median_dim``, ``nanmedian_dim``, ``kthvalue``, ``mode``: (values, indices) along
    ``dim`` from the stable order (NaN last), picking what tessera's kernels pick: the lower
    median (a slice holding NaN: its first NaN), the median of the non-NaN values (an
    all-NaN slice: ``all_equal_nth(n)``, libstdc++'s pick), the k-th, and the most frequent
    value (the smallest among equally frequent ones) at its last occurrence."""
    def rule(jnp, lax, a, at):
        x = a[0]
        if x.ndim == 0:
            return x, jnp.zeros((), jnp.int64)
        if x.dtype == jnp.bool_:
            raise NotImplementedError(f"{kind} of bool")
        d, keep = at["dim"] % x.ndim, at.get("keepdim", False)
        n, flt = x.shape[d], jnp.issubdtype(x.dtype, jnp.floating)
        order = jnp.argsort(x, axis=d, stable=True)
        one = x.shape[:d] + (1,) + x.shape[d + 1:]
        if kind == "mode":
            m = jnp.moveaxis(order, d, -1)
            s = jnp.take_along_axis(jnp.moveaxis(x, d, -1), m, -1)
            neq = s[..., 1:] != s[..., :-1]  # NaN != NaN: each NaN a run of its own
            end = jnp.concatenate([neq, jnp.ones(s.shape[:-1] + (1,), bool)], -1)
            start = jnp.concatenate([jnp.ones(s.shape[:-1] + (1,), bool), neq], -1)
            pos = jnp.arange(n)
            first = lax.cummax(jnp.where(start, pos, 0), axis=s.ndim - 1)
            best = jnp.argmax(jnp.where(end, pos - first + 1, 0), axis=-1, keepdims=True)
            idx = jnp.moveaxis(jnp.take_along_axis(m, best, -1), -1, d)
            return _keep(jnp, jnp.take_along_axis(x, idx, d), idx, d, keep)
        if kind == "kthvalue":
            place = jnp.full(one, at.get("k", 1) - 1)
        elif kind == "median_dim":
            place = jnp.full(one, (n - 1) // 2)
        else:
            count = jnp.sum(jnp.isnan(x), axis=d, keepdims=True) if flt else \
                jnp.zeros(one, jnp.int64)
            place = jnp.maximum((n - count - 1) // 2, 0)
        idx = jnp.take_along_axis(order, place, d)
        if kind == "median_dim" and flt:
            nan = jnp.isnan(x)
            idx = jnp.where(nan.any(axis=d, keepdims=True),
                            jnp.argmax(nan, axis=d, keepdims=True), idx)
        if kind == "nanmedian_dim" and n > 3:
            idx = jnp.where(count == n, all_equal_nth(n), idx)
        return _keep(jnp, jnp.take_along_axis(x, idx, d), idx, d, keep)
    return rule


def median_all(ignore_nan: bool):
    """``median``/``nanmedian`` of every element: the lower median (NaN if the input holds
    one; of the non-NaN values for ``nanmedian``)."""
    def rule(jnp, lax, a, at):
        f = a[0].reshape(-1)
        if f.size == 0 or f.dtype == jnp.bool_:
            raise NotImplementedError("median of an empty or bool tensor")
        s = jnp.sort(f)
        if not jnp.issubdtype(f.dtype, jnp.floating):
            return s[(f.size - 1) // 2]
        nan = jnp.isnan(f)
        if ignore_nan:
            return s[jnp.maximum((f.size - jnp.sum(nan) - 1) // 2, 0)]
        return jnp.where(nan.any(), jnp.nan, s[(f.size - 1) // 2])
    return rule


def variance(root: bool):
    """``var``/``std`` over ``dim``, dividing by max(N - correction, 0)."""
    def rule(jnp, lax, a, at):
        x = a[0]
        dims, keep = _dims(x, at), at.get("keepdim", False)
        n = math.prod(x.shape[d] for d in dims)
        c = x - jnp.mean(x, axis=dims, keepdims=True)
        v = jnp.sum(c * c, axis=dims, keepdims=keep) / max(n - at.get("correction", 1), 0)
        return jnp.sqrt(v) if root else v
    return rule


def variance_mean(root: bool):
    """``var_mean``/``std_mean``: the variance (or its root) and the mean over ``dim``."""
    var = variance(root)

    def rule(jnp, lax, a, at):
        x = a[0]
        return var(jnp, lax, a, at), jnp.mean(x, axis=_dims(x, at),
                                              keepdims=at.get("keepdim", False))
    return rule


def aminmax(jnp, lax, a, at):
    """(min, max) over one ``dim`` (all elements when None); NaN wins both."""
    x, dim, keep = a[0], at.get("dim"), at.get("keepdim", False)
    dims = tuple(range(x.ndim)) if dim is None else ((dim % x.ndim,) if x.ndim else ())
    if not dims:
        return x, x
    return jnp.min(x, axis=dims, keepdims=keep), jnp.max(x, axis=dims, keepdims=keep)


def prelu(jnp, lax, a, at):
    """max(0, x) + w min(0, x), ``w`` one value or one per channel (dim 1)."""
    x, w = a
    if x.dtype in (jnp.float16, jnp.bfloat16):
        x, w = x.astype(jnp.float32), w.astype(jnp.float32)
    if w.size != 1 and x.ndim >= 2:
        w = w.reshape((w.size,) + (1,) * (x.ndim - 2))
    else:
        w = w.reshape(())
    return jnp.where(x > 0, x, w * x)


def vdot(jnp, lax, a, at):
    if jnp.iscomplexobj(a[0]):
        raise NotImplementedError("vdot of complex tensors")
    return jnp.dot(a[0], a[1], precision=lax.Precision.HIGHEST)


def diagonal(jnp, lax, a, at):
    x = a[0]
    d1, d2 = at.get("dim1", 0) % x.ndim, at.get("dim2", 1) % x.ndim
    return jnp.diagonal(x, at.get("offset", 0), d1, d2)


def binary_cross_entropy(jnp, lax, a, at):
    """-(t log x + (1 - t) log(1 - x)), each log clamped at -100, weighted, reduced."""
    x, t, w = a
    if x.dtype in (jnp.float16, jnp.bfloat16):
        x, t = x.astype(jnp.float32), t.astype(jnp.float32)
    loss = (t - 1) * jnp.maximum(jnp.log1p(-x), -100) - t * jnp.maximum(jnp.log(x), -100)
    if w is not None:
        loss = loss * w.astype(loss.dtype)
    red = at.get("reduction", "mean")
    if red == "none":
        return loss
    return loss.sum() if red == "sum" else loss.sum() / loss.size


def layer_norm_backward(jnp, lax, a, at):
    """(dx, dweight, dbias) of ``layer_norm``, as its fused backward kernel computes them
    (half precision in float32)."""
    g, x, w = a
    half = x.dtype in (jnp.float16, jnp.bfloat16)
    if half:
        g, x = g.astype(jnp.float32), x.astype(jnp.float32)
        w = None if w is None else w.astype(jnp.float32)
    k = len(at["normalized_shape"])
    d = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    xc = x - jnp.mean(x, axis=d, keepdims=True)
    rstd = 1.0 / jnp.sqrt(jnp.mean(xc * xc, axis=d, keepdims=True) + at["eps"])
    xhat = xc * rstd
    dw, db = jnp.sum(g * xhat, axis=lead), jnp.sum(g, axis=lead)
    gw = g if w is None else g * w
    c1 = jnp.mean(gw, axis=d, keepdims=True)
    c2 = jnp.mean(gw * xhat, axis=d, keepdims=True)
    return (gw - c1 - xhat * c2) * rstd, dw, db


def batch_norm_backward(jnp, lax, a, at):
    """(dx, dweight, dbias) of ``batch_norm``, as its fused backward kernel computes them:
    per-channel coefficients, then ``dx = k1 g + k2 xhat + k3`` (the last two in training)."""
    g, x, w, rm, rv = a
    if x.dtype in (jnp.float16, jnp.bfloat16):
        g, x = g.astype(jnp.float32), x.astype(jnp.float32)
    c = x.shape[1]
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = (1, c) + (1,) * (x.ndim - 2)
    if at["training"]:
        xc = x - jnp.mean(x, axis=axes, keepdims=True)
        var = jnp.mean(xc * xc, axis=axes)
    else:
        xc, var = x - rm.reshape(bshape).astype(x.dtype), rv.reshape(c).astype(x.dtype)
    rstd = 1.0 / jnp.sqrt(var + jnp.asarray(at["eps"], x.dtype))
    xhat = xc * rstd.reshape(bshape)
    db, dw = jnp.sum(g, axis=axes), jnp.sum(g * xhat, axis=axes)
    k = rstd if w is None else rstd * w.reshape(c).astype(x.dtype)
    dx = g * k.reshape(bshape)
    if at["training"]:
        m = max(x.size // max(c, 1), 1)
        dx = dx + xhat * (-k * dw / m).reshape(bshape) - (k * db / m).reshape(bshape)
    return dx, dw, db


def round_(jnp, lax, a, at):
    """NumPy's ``rint`` (half to even); ``decimals`` scales first, as PyTorch."""
    x, dec = a[0], at.get("decimals", 0)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x
    if dec > 0:
        return jnp.rint(x * 10.0 ** dec) / 10.0 ** dec
    if dec < 0:
        return jnp.rint(x / 10.0 ** -dec) * 10.0 ** -dec
    return jnp.rint(x)


def squeeze(jnp, lax, a, at):
    return jnp.squeeze(a[0], tuple(at["dims"]))


def roll(jnp, lax, a, at):
    dims = at["dims"]
    if not dims:
        return jnp.roll(a[0], at["shifts"][0])
    return jnp.roll(a[0], tuple(at["shifts"]), tuple(d % a[0].ndim for d in dims))


def rms_norm(jnp, lax, a, at):
    x, w = a
    axes = tuple(range(x.ndim - len(at["normalized_shape"]), x.ndim))
    out = x * lax.rsqrt(jnp.mean(x * x, axis=axes, keepdims=True) + at["eps"])
    return out if w is None else out * w


def logit(jnp, lax, a, at):
    x, eps = a[0], at.get("eps")
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x))


def nan_to_num(jnp, lax, a, at):
    x = a[0]
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x
    return jnp.nan_to_num(x, nan=at.get("nan", 0.0), posinf=at.get("posinf"),
                          neginf=at.get("neginf"))


def constant_pad(jnp, lax, a, at):
    """Negative pads crop, as ``lax.pad`` does."""
    x, pads = a[0], at["pads"]
    lead = x.ndim - len(pads)
    cfg = [(0, 0, 0)] * lead + [(lo, hi, 0) for lo, hi in pads]
    return lax.pad(x, jnp.array(at.get("value", 0), x.dtype), cfg)


_PAD_MODES = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def pad(jnp, lax, a, at):
    x, pads = a[0], at["pads"]
    mode = _PAD_MODES.get(at["mode"])
    if mode is None or any(lo < 0 or hi < 0 for lo, hi in pads):
        raise NotImplementedError(f"pad: no XLA rule for mode '{at['mode']}' with {pads}")
    lead = x.ndim - len(pads)
    return jnp.pad(x, [(0, 0)] * lead + [tuple(p) for p in pads], mode=mode)


def group_norm(jnp, lax, a, at):
    x, w, b = a
    n, c, g = x.shape[0], x.shape[1], at["num_groups"]
    xr = x.reshape(n, g, -1)
    mean = jnp.mean(xr, axis=2, keepdims=True)
    var = jnp.mean(jnp.square(xr - mean), axis=2, keepdims=True)
    out = ((xr - mean) * lax.rsqrt(var + at["eps"])).reshape(n, c, -1)
    if w is not None:
        out = out * w[:, None]
    if b is not None:
        out = out + b[:, None]
    return out.reshape(x.shape)


def tri(name: str):
    return lambda jnp, lax, a, at: getattr(jnp, name)(a[0], k=at.get("diagonal", 0))


def constant(kernel):
    """A creation op without tensor inputs (``arange``, ``full``): its value, computed by
    its kernel when the graph is lowered, as a constant of the function."""
    return lambda jnp, lax, a, at: jnp.asarray(kernel(*a, **at))


_TABLES = (UNARY, ACTIVATION, COMPARE, BINARY, REDUCE)


def rule(name: str):
    """The rule of the factory-made op ``name`` from the tables here, or None.

    >>> rule("tanh") is UNARY["tanh"], rule("no such op")
    (True, None)
    """
    for table in _TABLES:
        if name in table:
            return table[name]
    return None
