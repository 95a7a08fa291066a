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
           "cumulative", "arg", "logical", "tri", "constant_pad", "group_norm", "constant", "sort",
           "topk", "cumulative_extremum", "scatter", "scatter_add", "scatter_reduce",
           "index_add", "index_copy", "index_fill", "take", "index", "index_put", "extremum",
           "extremum_dim", "variance", "round_", "squeeze", "roll", "rms_norm", "logit",
           "nan_to_num", "order_statistic", "median_all", "isclose",
           "one_hot", "searchsorted", "variance_mean", "aminmax",
           "prelu", "vdot", "diagonal", "binary_cross_entropy",
           "layer_norm_backward", "batch_norm_backward",
           "rule"]

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
    "bitwise_not": lambda R, a, at: R.bitwise_not(a[0]) if R.dtype(a[0]) != "bool"
    else R.logical_not(a[0]),
    "square": _one(lambda R, x: R.multiply(x, x)),
    "relu": _one(lambda R, x: R.maximum(x, _k(R, 0, x))),
    "isnan": _one(lambda R, x: R.isnan(x)),
    "isinf": _one(lambda R, x: R.isinf(x)),
    "isfinite": _one(lambda R, x: R.isfinite(x)),
    "isposinf": _one(lambda R, x: R.logical_and(R.isinf(x), R.greater(x, _k(R, 0, x)))),
    "isneginf": _one(lambda R, x: R.logical_and(R.isinf(x), R.less(x, _k(R, 0, x)))),
    "logical_not": _one(lambda R, x: R.logical_not(R.astype(x, "bool"))),
}


# ---- special functions: Relax has erf only; the rest are series in its elementwise ops --------

def _poly(R, t, coeffs, like):
    """Horner's ``coeffs[0] + t * (coeffs[1] + ...)``."""
    p = _k(R, coeffs[-1], like)
    for c in reversed(coeffs[:-1]):
        p = R.add(_k(R, c, like), R.multiply(t, p))
    return p


# Numerical Recipes' erfcc: relative error below 1.2e-7 everywhere, the tail included
_ERFC = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
         -1.13520398, 1.48851587, -0.82215223, 0.17087277)


def _erfc(R, x):
    z = R.emit(R.abs(x))
    t = R.emit(R.divide(_k(R, 1.0, x), R.add(_k(R, 1.0, x), R.multiply(_k(R, 0.5, x), z))))
    tail = R.emit(R.multiply(t, R.exp(R.add(R.negative(R.multiply(z, z)),
                                            _poly(R, t, _ERFC, x)))))
    return R.where(R.less(x, _k(R, 0.0, x)), R.subtract(_k(R, 2.0, x), tail), tail)


# Giles's single-precision erfinv (two rational pieces in w = -log(1 - x^2))
_ERFINV_LO = (1.50140941, 0.246640727, -0.00417768164, -0.00125372503, 0.00021858087,
              -4.39150654e-06, -3.5233877e-06, 3.43273939e-07, 2.81022636e-08)
_ERFINV_HI = (2.83297682, 1.00167406, 0.00943887047, -0.0076224613, 0.00573950773,
              -0.00367342844, 0.00134934322, 0.000100950558, -0.000200214257)


def _erfinv(R, x):
    x = R.emit(R.astype(x, "float64"))  # then one Newton step on erf, which is exact enough
    one = _k(R, 1.0, x)
    w = R.emit(R.negative(R.log(R.multiply(R.subtract(one, x), R.add(one, x)))))
    lo = _poly(R, R.subtract(w, _k(R, 2.5, x)), _ERFINV_LO, x)
    hi = _poly(R, R.subtract(R.sqrt(w), _k(R, 3.0, x)), _ERFINV_HI, x)
    y = R.emit(R.multiply(R.where(R.less(w, _k(R, 5.0, x)), lo, hi), x))
    step = R.divide(R.subtract(R.erf(y), x),
                    R.multiply(_k(R, 2 / math.sqrt(math.pi), x),
                               R.exp(R.negative(R.multiply(y, y)))))
    return R.where(R.less(R.abs(x), one), R.subtract(y, step), y)


# Lanczos's approximation, g = 7, nine terms (double precision for x >= 1/2)
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012,
            9.9843695780195716e-6, 1.5056327351493116e-7)


def _pole(R, x):
    """Where ``x`` is 0 or a negative integer."""
    return R.logical_and(R.less_equal(x, _k(R, 0.0, x)), R.equal(x, R.floor(x)))


def _lgamma(R, x):
    x = R.emit(R.astype(x, "float64"))
    half, one = _k(R, 0.5, x), _k(R, 1.0, x)
    refl = R.emit(R.less(x, half))
    w = R.emit(R.where(refl, R.subtract(one, x), x))  # log|gamma(x)| by reflection below 1/2
    z = R.emit(R.subtract(w, one))
    s = _k(R, _LANCZOS[0], x)
    for i, c in enumerate(_LANCZOS[1:], 1):
        s = R.add(s, R.divide(_k(R, c, x), R.add(z, _k(R, float(i), x))))
    t = R.emit(R.add(z, _k(R, 7.5, x)))
    lg = R.emit(R.add(R.subtract(R.multiply(R.add(z, half), R.log(t)), t),
                      R.add(R.log(s), _k(R, 0.5 * math.log(2 * math.pi), x))))
    sin = R.abs(R.sin(R.multiply(_k(R, math.pi, x), x)))
    out = R.where(refl, R.subtract(R.log(R.divide(_k(R, math.pi, x), sin)), lg), lg)
    inf = _k(R, float("inf"), x)
    return R.where(R.logical_or(R.isinf(x), _pole(R, x)), inf, out)


def _digamma(R, x):
    x = R.emit(R.astype(x, "float64"))
    one = _k(R, 1.0, x)
    refl = R.emit(R.less(x, _k(R, 0.5, x)))
    w = R.emit(R.where(refl, R.subtract(one, x), x))
    # psi(w) = psi(w + 6) - sum 1/(w + k), then the asymptotic series at w + 6
    shift = R.divide(one, w)
    for k in range(1, 6):
        shift = R.add(shift, R.divide(one, R.add(w, _k(R, float(k), x))))
    y = R.emit(R.add(w, _k(R, 6.0, x)))
    inv2 = R.emit(R.divide(one, R.multiply(y, y)))
    series = R.multiply(inv2, _poly(R, inv2, (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132), x))
    psi = R.emit(R.subtract(R.subtract(R.subtract(R.log(y), R.divide(_k(R, 0.5, x), y)),
                                       series), shift))
    out = R.where(refl, R.subtract(psi, R.divide(_k(R, math.pi, x),
                                                 R.tan(R.multiply(_k(R, math.pi, x), x)))), psi)
    # PyTorch: -inf at 0, NaN at the negative integers
    out = R.where(_pole(R, x), _k(R, float("nan"), x), out)
    return R.where(R.equal(x, _k(R, 0.0, x)), _k(R, float("-inf"), x), out)


UNARY.update({"erfc": _one(_erfc), "erfinv": _one(_erfinv), "lgamma": _one(_lgamma),
              "digamma": _one(_digamma)})


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
    "bitwise_left_shift": lambda R, a, at: _shift(R, a, True),
    "bitwise_right_shift": lambda R, a, at: _shift(R, a, False),
}


def _shift(R, a, left: bool):
    """PyTorch's shifts: by a negative amount or by the bit width or more, 0 (left) or the
    sign fill (right), as tessera's kernel."""
    x, b = R.pair(a[0], a[1])
    dt = R.dtype(x)
    if dt == "bool":
        raise NotImplementedError("shift of bool")
    bits = np.iinfo(np.dtype(dt)).bits
    ok = R.emit(R.logical_and(R.greater_equal(b, _k(R, 0, b)), R.less(b, _k(R, bits, b))))
    safe = R.where(ok, b, _k(R, 0, b))
    if left:
        return R.where(ok, R.left_shift(x, safe), _k(R, 0, x))
    fill = R.right_shift(x, _k(R, bits - 1, x)) if dt.startswith("int") else _k(R, 0, x)
    return R.where(ok, R.right_shift(x, safe), fill)


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


def _count_nonzero(R, a, at):
    x = a[0]
    dims = _dims(R, x, at)
    nz = R.astype(R.not_equal(x, _k(R, 0, x)), "int64")
    return R.sum(nz, dims, False) if dims else nz


def _norm(R, a, at):
    """The vector p-norm over ``dim`` (half precision accumulates in float32; NaN wins the
    inf-norms, as NumPy's max)."""
    x = a[0]
    if R.dtype(x).startswith("complex"):
        raise NotImplementedError("norm of a complex tensor")
    if at.get("dtype") is not None:
        x = R.astype(x, str(at["dtype"].np))
    x = _wide(R, x)
    dims, p, keep = _dims(R, x, at), at.get("ord", 2.0), at.get("keepdim", False)
    ab = R.emit(R.abs(x))
    if not dims:  # a 0-d tensor: every p-norm of one element is its magnitude
        return R.astype(R.not_equal(ab, _k(R, 0, ab)), R.dtype(ab)) if p == 0 else ab
    if p == 2:
        return R.sqrt(R.sum(R.multiply(ab, ab), dims, keep))
    if p == 1:
        return R.sum(ab, dims, keep)
    if math.isinf(p):
        m = (R.max if p > 0 else R.min)(ab, dims, keep)
        return R.where(_nan_any(R, ab, dims, keep), _k(R, float("nan"), ab), m)
    if p == 0:
        return R.sum(R.astype(R.not_equal(ab, _k(R, 0, ab)), R.dtype(ab)), dims, keep)
    return R.power(R.sum(R.power(ab, _k(R, p, ab)), dims, keep), _k(R, 1.0 / p, ab))


REDUCE = {"sum": _reduce("sum"), "mean": _reduce("mean"), "amax": _reduce("max"),
          "amin": _reduce("min"), "prod": _reduce("prod"), "nansum": _nanreduce(False),
          "nanmean": _nanreduce(True), "logsumexp": _logsumexp,
          "count_nonzero": _count_nonzero, "norm": _norm}


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


def _dilate(R, g, stride):
    """Zeros inserted between the spatial elements of ``g`` (``stride - 1`` after each but
    the last): an expand, a pad and a reshape per strided dim."""
    for i, s in enumerate(stride):
        if s == 1:
            continue
        shape = list(R.shape(g))
        d, n = 2 + i, shape[2 + i]
        g = R.expand_dims(g, d + 1)
        width = [0, 0] * (len(shape) + 1)
        width[2 * (d + 1) + 1] = s - 1
        g = R.nn.pad(g, width, "constant", 0.0)
        g = R.reshape(g, shape[:d] + [n * s] + shape[d + 1:])
        g = R.emit(_slice_dim(R, g, d, 0, (n - 1) * s + 1))
    return g


def _grouped_transpose(R, w, groups):
    """A weight (out, in/groups, k...) as the weight of its transposed convolution
    (in, out/groups, k...), its kernel flipped."""
    shape = R.shape(w)
    cout, cin_g, k = shape[0], shape[1], list(shape[2:])
    w = R.reshape(w, [groups, cout // groups, cin_g] + k)
    w = R.permute_dims(w, [0, 2, 1] + list(range(3, 3 + len(k))))
    w = R.reshape(w, [groups * cin_g, cout // groups] + k)
    for i in range(len(k)):
        w = R.flip(w, 2 + i)
    return w


def conv_input_grad(R, a, at):
    """The transposed convolution: TVM's conv2d_transpose for 2-d, ungrouped convs; else a
    stride-1 convolution of the dilated gradient with the transposed, flipped kernel
    (padded, or cropped, so that the output has the input's size)."""
    g, w = a
    shape = tuple(at["input_shape"])
    nd = len(shape) - 2
    if nd not in _CONV:
        raise NotImplementedError(f"conv_input_grad: no Relax rule for {nd} spatial dims")
    st, dl, pads, groups = list(at["stride"]), list(at["dilation"]), at["pads"], at["groups"]
    k, gs = R.shape(w)[2:], R.shape(g)[2:]
    extra = [shape[2 + i] - ((gs[i] - 1) * st[i] + dl[i] * (k[i] - 1) + 1 - pads[i][0]
                             - pads[i][1]) for i in range(nd)]
    if nd == 2 and groups == 1 and all(0 <= e < max(st[i], dl[i]) for i, e in enumerate(extra)):
        padding = [lo for lo, _ in pads] + [hi for _, hi in pads]
        return R.nn.conv2d_transpose(g, w, strides=st, padding=padding, output_padding=extra,
                                     dilation=dl, kernel_layout="IOHW")
    gd = _dilate(R, g, st)
    lo = [dl[i] * (k[i] - 1) - pads[i][0] for i in range(nd)]
    hi = [dl[i] * (k[i] - 1) - pads[i][1] + extra[i] for i in range(nd)]
    gd = constant_pad(R, [gd], {"pads": list(zip(lo, hi)), "value": 0.0})
    return getattr(R.nn, _CONV[nd])(gd, _grouped_transpose(R, w, groups), strides=[1] * nd,
                                    padding=[0] * (2 * nd), dilation=dl, groups=groups)


def conv_weight_grad(R, a, at):
    """A convolution of the input with the gradient as its kernel, batch and channels
    swapped (stride and dilation trade places), cropped to the kernel's size. Grouped: the
    input's channels of a group side by side with the batch, so that each group's gradient
    channels see their own."""
    x, g = a
    wshape = tuple(at["weight_shape"])
    nd = len(wshape) - 2
    if nd not in _CONV:
        raise NotImplementedError(f"conv_weight_grad: no Relax rule for {nd} spatial dims")
    groups = at["groups"]
    xs = R.shape(x)
    n, cin_g, sp = xs[0], xs[1] // groups, list(xs[2:])
    xt = R.reshape(x, [n, groups, cin_g] + sp)  # -> (cin/groups, groups * n, ...)
    xt = R.reshape(R.permute_dims(xt, [2, 1, 0] + list(range(3, 3 + nd))),
                   [cin_g, groups * n] + sp)
    gt = R.permute_dims(g, [1, 0] + list(range(2, nd + 2)))
    pads = [lo for lo, _ in at["pads"]] + [hi for _, hi in at["pads"]]
    out = getattr(R.nn, _CONV[nd])(xt, gt, strides=list(at["dilation"]), padding=pads,
                                   dilation=list(at["stride"]), groups=groups)
    out = R.emit(R.permute_dims(out, [1, 0] + list(range(2, nd + 2))))
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


# ---- sorting, scans of extrema ------------------------------------------------------------

def _stable_order(R, x, d, descending):
    """Stable argsort along ``d``, NaN the largest, as ``tessera.ops.sorting``'s kernel.
    TVM's sort is stable but leaves NaN anywhere: floats sort by value with NaN read as
    inf, then (stably) by whether they are NaN."""
    if not R.dtype(x).startswith("float"):
        return R.emit(R.argsort(x, d, descending, "int64"))
    nan = R.emit(R.isnan(x))
    by_value = R.emit(R.argsort(R.where(nan, _k(R, float("inf"), x), x), d, descending,
                                "int64"))
    flag = R.gather_elements(R.astype(nan, "int32"), by_value, axis=d)
    return R.emit(R.gather_elements(by_value, R.argsort(flag, d, descending, "int64"), axis=d))


def sort(R, a, at):
    x = a[0]
    shape = R.shape(x)
    if not shape:
        return x, R.zeros((), "int64")
    d = at.get("dim", -1) % len(shape)
    idx = _stable_order(R, x, d, at.get("descending", False))
    return R.gather_elements(x, idx, axis=d), idx


def topk(R, a, at):
    """The first ``k`` of the stable order: ties keep their order, as tessera's kernel."""
    x = a[0]
    shape = R.shape(x)
    if not shape:
        return x, R.zeros((), "int64")
    d = at.get("dim", -1) % len(shape)
    idx = R.emit(_slice_dim(R, _stable_order(R, x, d, at.get("largest", True)), d, 0, at["k"]))
    return R.gather_elements(x, idx, axis=d), idx


def _low(R, x, largest: bool):
    """The value every element beats in a running max (or min): -inf, or the int's least."""
    dt = R.dtype(x)
    if dt.startswith("float"):
        return _k(R, float("-inf") if largest else float("inf"), x)
    info = np.iinfo(np.dtype(dt))
    return _k(R, int(info.min if largest else info.max), x)


def cumulative_extremum(name: str):
    """``cummax``/``cummin``: a log-step (Hillis-Steele) scan of (value, index) pairs along
    ``dim``. The later element wins a tie and every NaN wins, as in PyTorch: the max of the
    key (is NaN, value, index)."""
    largest = name == "cummax"

    def rule(R, a, at):
        x = a[0]
        if R.dtype(x) == "bool":
            x = R.astype(x, "int8")
        shape = R.shape(x)
        if not shape:
            return x, R.zeros((), "int64")
        d, n = at["dim"] % len(shape), shape[at["dim"] % len(shape)]
        pos = np.arange(n).reshape([-1 if i == d else 1 for i in range(len(shape))])
        v = R.emit(x)
        i = R.emit(R.broadcast_to(R.const(pos, "int64"), list(shape)))
        low = _low(R, x, largest)
        is_float = R.dtype(x).startswith("float")
        s = 1
        while s < n:
            fill = list(shape[:d]) + [s] + list(shape[d + 1:])
            pv = R.emit(R.concat([R.broadcast_to(low, fill),
                                  _slice_dim(R, v, d, 0, n - s)], axis=d))
            pi = R.emit(R.concat([R.zeros(fill, "int64"), _slice_dim(R, i, d, 0, n - s)],
                                 axis=d))
            keep = R.greater_equal(v, pv) if largest else R.less_equal(v, pv)
            if is_float:
                keep = R.logical_or(R.isnan(v), R.logical_and(R.logical_not(R.isnan(pv)), keep))
            keep = R.emit(keep)
            v, i = R.emit(R.where(keep, v, pv)), R.emit(R.where(keep, i, pi))
            s *= 2
        return v, i
    return rule


# ---- scatter, indexed writes, advanced indexing -------------------------------------------

_SCATTER_REDUCTION = {None: "update", "add": "add", "multiply": "mul"}


def _fit(R, src, shape, dt):
    """``src`` (a number or a tensor at least ``shape``) as a tensor of ``shape``."""
    if isinstance(src, (bool, int, float)):
        return R.broadcast_to(R.const(src, dt), list(shape))
    if R.shape(src) != tuple(shape):
        src = R.strided_slice(src, list(range(len(shape))), [0] * len(shape), list(shape))
    return src


def scatter(R, a, at):
    """``scatter`` (``reduce`` None, "add" or "multiply") and ``scatter_add``."""
    t, index, src = a
    reduce = "add" if at.get("_add") else at.get("reduce")
    shape, ishape, dt = R.shape(t), R.shape(index), R.dtype(t)
    if math.prod(ishape) == 0:
        return t
    if not shape or len(ishape) != len(shape):
        raise NotImplementedError("scatter: Relax rule for index of the input's rank only")
    return R.scatter_elements(t, index, _fit(R, src, ishape, dt), axis=at["dim"] % len(shape),
                              reduction=_SCATTER_REDUCTION[reduce])


def scatter_add(R, a, at):
    return scatter(R, a, dict(at, _add=True))


_REDUCE_INIT = {"sum": 0, "mean": 0, "prod": 1}


def scatter_reduce(R, a, at):
    """``include_self=False`` first writes the reduction's identity at the indexed places;
    ``mean`` divides a sum by a scattered count (floor division for integers)."""
    t, index, src = a
    reduce, incl = at["reduce"], at.get("include_self", True)
    shape, ishape, dt = R.shape(t), R.shape(index), R.dtype(t)
    if math.prod(ishape) == 0:
        return t
    if not shape or len(ishape) != len(shape):
        raise NotImplementedError("scatter_reduce: Relax rule for index of the input's rank "
                                  "only")
    d = at["dim"] % len(shape)
    src = _fit(R, src, ishape, dt)
    if not incl:
        init = _REDUCE_INIT.get(reduce)
        fill = _low(R, t, reduce == "amax") if init is None else R.const(init, dt)
        t = R.emit(R.scatter_elements(t, index, R.broadcast_to(fill, list(ishape)), axis=d))
    if reduce != "mean":
        red = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}[reduce]
        return R.scatter_elements(t, index, src, axis=d, reduction=red)
    total = R.emit(R.scatter_elements(t, index, src, axis=d, reduction="add"))
    count = R.scatter_elements(R.full(list(shape), R.const(int(incl), dt), dt), index,
                               R.ones(list(ishape), dt), axis=d, reduction="add")
    count = R.emit(R.maximum(count, R.const(1, dt)))
    return R.divide(total, count) if dt.startswith("float") else R.floor_divide(total, count)


def _along(R, index, d, shape):
    """A 1-d (or 0-d) index of dim ``d`` broadcast over a tensor of ``shape``."""
    k = shape[d]
    lay = [k if i == d else 1 for i in range(len(shape))]
    return R.broadcast_to(R.reshape(index, lay), list(shape))


def _index_write(reduction):
    """``index_add`` (``alpha`` times ``source`` added) and ``index_copy`` along ``dim``."""
    def rule(R, a, at):
        x, index, src = a
        shape = R.shape(x)
        if not shape:
            raise NotImplementedError("index_add/index_copy: no Relax rule for a 0-d input")
        d = at["dim"] % len(shape)
        k = math.prod(R.shape(index))
        if k == 0:
            return x
        sshape = list(shape[:d]) + [k] + list(shape[d + 1:])
        src = R.reshape(src, sshape)
        alpha = at.get("alpha", 1)
        if alpha != 1 and R.dtype(x) != "bool":
            src = R.multiply(src, R.const(alpha, R.dtype(x)))
        return R.scatter_elements(x, _along(R, index, d, sshape), src, axis=d,
                                  reduction=reduction)
    return rule


index_add = _index_write("add")
index_copy = _index_write("update")


def _wrapped(R, index, n):
    """Negative indices counted from the end."""
    index = R.emit(R.astype(index, "int64"))
    return R.where(R.less(index, R.const(0, "int64")), R.add(index, R.const(n, "int64")), index)


def index_fill(R, a, at):
    x, index, value = a
    shape = R.shape(x)
    if not shape:
        raise NotImplementedError("index_fill: no Relax rule for a 0-d input")
    d = at["dim"] % len(shape)
    n = shape[d]
    flat = _wrapped(R, R.reshape(index, [math.prod(R.shape(index))]), n)
    hit = R.max(R.astype(R.equal(R.expand_dims(flat, 1),
                                 R.const(np.arange(n).reshape(1, n), "int64")), "int8"), [0])
    mask = R.reshape(R.astype(hit, "bool"), [n if i == d else 1 for i in range(len(shape))])
    v = R.const(value, R.dtype(x)) if isinstance(value, (bool, int, float)) \
        else R.astype(value, R.dtype(x))
    return R.where(mask, v, x)


def take(R, a, at):
    x, index = a
    n = math.prod(R.shape(x))
    return R.take(R.reshape(x, [n]), _wrapped(R, index, n), axis=0)


def _key_dims(R, x, key, idx):
    """For ``x[key]`` (full slices and one slot per index tensor): the indexed dims, the
    other dims, the index tensors broadcast (negatives wrapped), and where NumPy puts their
    broadcast dims in the result (in place when adjacent, else first)."""
    shape = R.shape(x)
    key = tuple(key) + (slice(None),) * (len(shape) - len(key))
    pos = [i for i, k in enumerate(key) if not isinstance(k, slice)]
    rest = [d for d in range(len(shape)) if d not in pos]
    b = np.broadcast_shapes(*[R.shape(i) for i in idx])
    idx = [R.broadcast_to(_wrapped(R, i, shape[p]), list(b)) for i, p in zip(idx, pos)]
    at = pos[0] if pos[-1] - pos[0] == len(pos) - 1 else 0
    return pos, rest, idx, tuple(b), at


def _flat_rows(R, x, pos, rest, idx):
    """``x`` with its indexed dims first and merged into one, and each index's row in it."""
    shape = R.shape(x)
    xt = R.permute_dims(x, pos + rest) if pos + rest != list(range(len(shape))) else x
    rows = math.prod(shape[p] for p in pos)
    xf = R.emit(R.reshape(xt, [rows] + [shape[d] for d in rest]))
    lin, stride = None, 1
    for i, p in reversed(list(zip(idx, pos))):
        term = i if stride == 1 else R.multiply(i, R.const(stride, "int64"))
        lin = term if lin is None else R.add(lin, term)
        stride *= shape[p]
    return xf, R.emit(lin)


def index(R, a, at):
    """Advanced indexing: a take of rows of ``x`` with its indexed dims merged."""
    x, idx = a[0], list(a[1:])
    pos, rest, idx, b, at_ = _key_dims(R, x, at["key"], idx)
    xf, lin = _flat_rows(R, x, pos, rest, idx)
    out = R.emit(R.take(xf, lin, axis=0))  # b + rest
    nb = len(b)
    if at_ == 0:
        return out
    order = list(range(nb, nb + at_)) + list(range(nb)) + list(range(nb + at_, nb + len(rest)))
    return R.permute_dims(out, order)


def index_put(R, a, at):
    """``x[key] = values`` (``+=`` with ``accumulate``): a scatter of rows into ``x`` with its
    indexed dims merged, then put back in place."""
    x, values, idx = a[0], a[1], list(a[2:])
    shape, dt = R.shape(x), R.dtype(x)
    pos, rest, idx, b, at_ = _key_dims(R, x, at["key"], idx)
    nb, n = len(b), math.prod(b)
    if n == 0:
        return x
    xf, lin = _flat_rows(R, x, pos, rest, idx)
    rest_shape = [shape[d] for d in rest]
    sub = list(b) + rest_shape if at_ == 0 else rest_shape[:at_] + list(b) + rest_shape[at_:]
    v = R.broadcast_to(R.const(values, dt) if isinstance(values, (bool, int, float))
                       else values, sub)
    if at_:
        v = R.permute_dims(v, list(range(at_, at_ + nb)) + list(range(at_))
                           + list(range(at_ + nb, len(sub))))
    v = R.reshape(v, [n] + rest_shape)
    red = "add" if at.get("accumulate") else "update"
    out = R.emit(R.scatter_nd(xf, R.reshape(lin, [n, 1]), v, reduction=red))
    out = R.reshape(out, [shape[p] for p in pos] + rest_shape)
    perm = pos + rest
    if perm == list(range(len(shape))):
        return out
    return R.permute_dims(out, [perm.index(d) for d in range(len(shape))])


# ---- extrema, variance, rounding, squeeze, roll, RMS norm -----------------------------------

def _nan_any(R, x, dims, keep):
    return R.greater(R.max(R.astype(R.isnan(x), "int8"), dims, keep), R.const(0, "int8"))


def extremum(name: str):
    """``max``/``min`` of every element; NaN wins, as in NumPy and PyTorch."""
    def rule(R, a, at):
        x = a[0]
        if R.dtype(x) == "bool":
            x = R.astype(x, "int8")
        dims = list(range(len(R.shape(x))))
        if not dims:
            return x
        out = getattr(R, name)(x, dims)
        if not R.dtype(x).startswith("float"):
            return out
        return R.where(_nan_any(R, x, dims, False), _k(R, float("nan"), x), out)
    return rule


def extremum_dim(name: str):
    """``max_dim``/``min_dim``: values and the first index of the extremum along ``dim``
    (the first NaN where there is one)."""
    def rule(R, a, at):
        x = a[0]
        if R.dtype(x) == "bool":
            x = R.astype(x, "int8")
        shape = R.shape(x)
        if not shape:
            return x, R.zeros((), "int64")
        d, keep = at["dim"] % len(shape), at.get("keepdim", False)
        idx = (R.argmax if name == "max" else R.argmin)(x, d, True)
        if R.dtype(x).startswith("float"):
            nan = R.emit(R.astype(R.isnan(x), "int8"))
            idx = R.where(_nan_any(R, x, [d], True), R.argmax(nan, d, True), idx)
        idx = R.emit(R.astype(idx, "int64"))
        vals = R.gather_elements(x, idx, axis=d)
        if keep:
            return vals, idx
        return R.squeeze(vals, [d]), R.squeeze(idx, [d])
    return rule


def isclose(R, a, at):
    """Equal, or a finite |a - b| (in the input dtype) within atol + |rtol * b| (in the
    float type), as tessera's kernel."""
    x, y = a
    rtol, atol = at.get("rtol", 1e-5), at.get("atol", 1e-8)
    close = R.emit(R.equal(x, y))
    dt = R.dtype(x)
    if at.get("equal_nan", False) and dt.startswith("float"):
        close = R.emit(R.logical_or(close, R.logical_and(R.isnan(x), R.isnan(y))))
    if rtol == 0 and atol == 0:
        return close
    if dt == "bool":
        x, y, dt = R.astype(x, "float32"), R.astype(y, "float32"), "float32"
    half = dt in ("float16", "bfloat16")
    ft = "float32" if half or not dt.startswith("float") else dt
    yf = R.astype(y, ft) if ft != dt else y
    allowed = R.add(R.const(atol, ft), R.abs(R.multiply(yf, R.const(rtol, ft))))
    actual = R.abs(R.subtract(x, y))
    if half:
        actual = R.astype(actual, ft)
    actual = R.emit(actual)
    if not R.dtype(actual).startswith("float"):
        return R.logical_or(close, R.less_equal(R.astype(actual, ft), allowed))
    return R.logical_or(close, R.logical_and(R.isfinite(actual), R.less_equal(actual, allowed)))


def one_hot(R, a, at):
    n = at.get("num_classes", -1)
    if n < 0:
        raise NotImplementedError("one_hot without num_classes: its shape depends on the data")
    x = a[0]
    return R.astype(R.equal(R.expand_dims(x, len(R.shape(x))), R.arange(0, n, 1, R.dtype(x))),
                    "int64")


def searchsorted(R, a, at):
    """The kernel's binary search, step for step (NaN goes last), vectorised over the
    values: ceil(log2(n + 1)) + 1 rounds of a gather and a comparison."""
    seq, v, sorter = a
    right = at.get("right", False)
    shape = R.shape(seq)
    n = shape[-1]
    if n == 0:
        raise NotImplementedError("searchsorted in an empty sequence")
    if sorter is not None:
        seq = R.gather_elements(seq, sorter, axis=len(shape) - 1)
    seq, v = R.pair(seq, v)
    vshape = R.shape(v)
    rows = R.emit(R.reshape(seq, [1 if len(shape) == 1 else math.prod(shape[:-1]), n]))
    b = R.shape(rows)[0]
    m = math.prod(vshape) // b
    vals = R.emit(R.reshape(v, [b, m]))
    lo = R.zeros((b, m), "int64")
    hi = _full(R, (b, m), n)
    one, last = _full(R, (b, m), 1), _full(R, (b, m), n - 1)
    for _ in range(n.bit_length() + 1):
        active = R.emit(R.less(lo, hi))
        mid = R.emit(R.right_shift(R.add(lo, hi), one))
        mv = R.gather_elements(rows, R.minimum(mid, last), axis=1)
        go = R.logical_not(R.greater(mv, vals) if right else R.greater_equal(mv, vals))
        go = R.emit(go)
        lo = R.emit(R.where(R.logical_and(active, go), R.add(mid, one), lo))
        hi = R.emit(R.where(R.logical_and(active, R.logical_not(go)), mid, hi))
    return R.reshape(lo, list(vshape))


def _keep(R, v, i, d, keep):
    return (v, i) if keep else (R.squeeze(v, [d]), R.squeeze(i, [d]))


def _full(R, shape, v, dtype="int64"):
    return R.const(np.full(shape, v, dtype), dtype)


def order_statistic(kind: str, all_equal_nth=None):
    """``median_dim``, ``nanmedian_dim``, ``kthvalue``, ``mode``: (values, indices) along
    ``dim`` from the stable order (NaN last), picking what tessera's kernels pick: the lower
    median (a slice holding NaN: its first NaN), the median of the non-NaN values (an
    all-NaN slice: ``all_equal_nth(n)``, libstdc++'s pick), the k-th, and the most frequent
    value (the smallest among equally frequent ones) at its last occurrence: each sorted
    element's count of equals (n x n comparisons a slice; a NaN counts once) is largest
    first at the start of that value's run, which ends count - 1 places later."""
    def rule(R, a, at):
        x = a[0]
        shape = R.shape(x)
        if not shape:
            return x, R.zeros((), "int64")
        if R.dtype(x) == "bool":
            raise NotImplementedError(f"{kind} of bool")
        d, keep = at["dim"] % len(shape), at.get("keepdim", False)
        n, flt = shape[d], R.dtype(x).startswith("float")
        one = shape[:d] + (1,) + shape[d + 1:]
        order = _stable_order(R, x, d, False)
        if kind == "mode":
            s = R.emit(R.gather_elements(x, order, axis=d))
            cnt = R.sum(R.astype(R.equal(R.expand_dims(s, d), R.expand_dims(s, d + 1)),
                                 "int64"), [d + 1])
            if flt:
                cnt = R.where(R.isnan(s), R.ones(shape, "int64"), cnt)
            cnt = R.emit(cnt)
            start = R.emit(R.astype(R.argmax(cnt, d, True), "int64"))
            end = R.subtract(R.add(start, R.gather_elements(cnt, start, axis=d)),
                             _full(R, one, 1))
            idx = R.emit(R.gather_elements(order, end, axis=d))
            return _keep(R, R.gather_elements(x, idx, axis=d), idx, d, keep)
        if kind == "kthvalue":
            place = _full(R, one, at.get("k", 1) - 1)
        elif kind == "median_dim":
            place = _full(R, one, (n - 1) // 2)
        else:
            count = R.emit(R.sum(R.astype(R.isnan(x), "int64"), [d], True)) if flt \
                else _full(R, one, 0)
            place = R.maximum(R.floor_divide(R.subtract(_full(R, one, n - 1), count),
                                             _full(R, one, 2)), _full(R, one, 0))
        idx = R.emit(R.gather_elements(order, place, axis=d))
        if kind == "median_dim" and flt:
            nan = R.emit(R.astype(R.isnan(x), "int8"))
            idx = R.where(_nan_any(R, x, [d], True), R.astype(R.argmax(nan, d, True), "int64"),
                          idx)
        if kind == "nanmedian_dim" and n > 3:
            idx = R.where(R.equal(count, _full(R, one, n)), _full(R, one, all_equal_nth(n)),
                          idx)
        idx = R.emit(idx)
        return _keep(R, R.gather_elements(x, idx, axis=d), idx, d, keep)
    return rule


def median_all(ignore_nan: bool):
    """``median``/``nanmedian`` of every element: the lower median (NaN if the input holds
    one; of the non-NaN values for ``nanmedian``)."""
    def rule(R, a, at):
        x = a[0]
        size = math.prod(R.shape(x))
        if size == 0 or R.dtype(x) == "bool":
            raise NotImplementedError("median of an empty or bool tensor")
        f = R.emit(R.reshape(x, [size]))
        s = R.emit(R.gather_elements(f, _stable_order(R, f, 0, False), axis=0))
        mid = R.take(s, _full(R, (), (size - 1) // 2), 0)
        if not R.dtype(x).startswith("float"):
            return mid
        nan = R.emit(R.sum(R.astype(R.isnan(f), "int64"), [0]))
        if ignore_nan:
            place = R.maximum(R.floor_divide(R.subtract(_full(R, (), size - 1), nan),
                                             _full(R, (), 2)), _full(R, (), 0))
            return R.take(s, place, 0)
        return R.where(R.greater(nan, _full(R, (), 0)), _k(R, float("nan"), x), mid)
    return rule


def variance(root: bool):
    """``var``/``std`` over ``dim``, dividing by max(N - correction, 0)."""
    def rule(R, a, at):
        x = a[0]
        dims, keep = _dims(R, x, at), at.get("keepdim", False)
        shape = R.shape(x)
        n = math.prod(shape[d] for d in dims)
        c = R.emit(R.subtract(x, R.mean(x, dims, True) if dims else x))
        ss = R.sum(R.multiply(c, c), dims, keep) if dims else R.multiply(c, c)
        free = n - at.get("correction", 1)
        # no degrees of freedom: NumPy's 0/0 (NaN) or x/0 (inf); TVM rejects a constant 0
        # divisor, so multiply by inf
        v = R.divide(ss, _k(R, float(free), x)) if free > 0 \
            else R.multiply(ss, _k(R, float("inf"), x))
        return R.sqrt(v) if root else v
    return rule


def variance_mean(root: bool):
    """``var_mean``/``std_mean``: the variance (or its root) and the mean over ``dim``."""
    var = variance(root)

    def rule(R, a, at):
        return var(R, a, at), REDUCE["mean"](R, a, at)
    return rule


def aminmax(R, a, at):
    """(min, max) over one ``dim`` (all elements when None); NaN wins both."""
    x, dim, keep = a[0], at.get("dim"), at.get("keepdim", False)
    if R.dtype(x) == "bool":
        x = R.astype(x, "int8")
    nd = len(R.shape(x))
    dims = list(range(nd)) if dim is None else ([dim % nd] if nd else [])
    if not dims:
        return x, x
    lo, hi = R.min(x, dims, keep), R.max(x, dims, keep)
    if not R.dtype(x).startswith("float"):
        return lo, hi
    nan = R.emit(_nan_any(R, x, dims, keep))
    return (R.where(nan, _k(R, float("nan"), x), lo), R.where(nan, _k(R, float("nan"), x), hi))


def prelu(R, a, at):
    """max(0, x) + w min(0, x), ``w`` one value or one per channel (dim 1)."""
    x, w = _wide(R, a[0]), _wide(R, a[1])
    nd, n = len(R.shape(x)), math.prod(R.shape(w))
    w = R.reshape(w, [n] + [1] * (nd - 2) if n != 1 and nd >= 2 else [])
    return R.where(R.greater(x, _k(R, 0, x)), x, R.multiply(w, x))


def vdot(R, a, at):
    if R.dtype(a[0]).startswith("complex"):
        raise NotImplementedError("vdot of complex tensors")
    return R.sum(R.multiply(a[0], a[1]), [0])


def diagonal(R, a, at):
    """The diagonal of dims ``dim1``, ``dim2`` (from ``offset``), a last dim: both moved
    last, flattened, and the diagonal's flat positions taken."""
    x = a[0]
    shape = R.shape(x)
    nd, off = len(shape), at.get("offset", 0)
    d1, d2 = at.get("dim1", 0) % nd, at.get("dim2", 1) % nd
    n1, n2 = shape[d1], shape[d2]
    rest = [i for i in range(nd) if i not in (d1, d2)]
    flat = R.reshape(R.permute_dims(x, rest + [d1, d2]), [shape[i] for i in rest] + [n1 * n2])
    i = np.arange(max(0, min(n1, n2 - off) if off >= 0 else min(n1 + off, n2)))
    pos = (i * n2 + i + off) if off >= 0 else ((i - off) * n2 + i)
    return R.take(flat, R.const(pos.astype("int64"), "int64"), len(rest))


def binary_cross_entropy(R, a, at):
    """-(t log x + (1 - t) log(1 - x)), each log clamped at -100, weighted, reduced."""
    x, t, w = _wide(R, a[0]), _wide(R, a[1]), a[2]
    low = _k(R, -100.0, x)
    one = _k(R, 1.0, x)
    loss = R.subtract(R.multiply(R.subtract(t, one), R.maximum(_log1p(R, R.negative(x)), low)),
                      R.multiply(t, R.maximum(R.log(x), low)))
    if w is not None:
        loss = R.multiply(loss, R.astype(w, R.dtype(x)))
    loss = R.emit(loss)
    red = at.get("reduction", "mean")
    if red == "none":
        return loss
    shape = R.shape(loss)
    total = R.sum(loss, list(range(len(shape)))) if shape else loss
    return total if red == "sum" else R.divide(total, _k(R, float(math.prod(shape)), x))


def layer_norm_backward(R, a, at):
    """(dx, dweight, dbias) of ``layer_norm``, as its fused backward kernel computes them
    (half precision in float32)."""
    g, x, w = _wide(R, a[0]), _wide(R, a[1]), a[2]
    w = None if w is None else _wide(R, w)
    nd, k = len(R.shape(x)), len(at["normalized_shape"])
    d, lead = list(range(nd - k, nd)), list(range(nd - k))
    xc = R.emit(R.subtract(x, R.mean(x, d, True)))
    rstd = R.emit(R.rsqrt(R.add(R.mean(R.multiply(xc, xc), d, True), _k(R, at["eps"], x))))
    xhat = R.emit(R.multiply(xc, rstd))
    gxh = R.emit(R.multiply(g, xhat))
    dw = R.sum(gxh, lead) if lead else gxh
    db = R.sum(g, lead) if lead else g
    gw = R.emit(g if w is None else R.multiply(g, w))
    c1 = R.mean(gw, d, True)
    c2 = R.mean(R.multiply(gw, xhat), d, True)
    return R.multiply(R.subtract(R.subtract(gw, c1), R.multiply(xhat, c2)), rstd), dw, db


def batch_norm_backward(R, a, at):
    """(dx, dweight, dbias) of ``batch_norm``, as its fused backward kernel computes them:
    per-channel coefficients, then ``dx = k1 g + k2 xhat + k3`` (the last two in training)."""
    g, x, w, rm, rv = a
    g, x = _wide(R, g), _wide(R, x)
    shape = R.shape(x)
    c, nd, dt = shape[1], len(shape), R.dtype(x)
    axes = [0] + list(range(2, nd))
    bshape = [1, c] + [1] * (nd - 2)
    if at["training"]:
        xc = R.emit(R.subtract(x, R.mean(x, axes, True)))
        var = R.mean(R.multiply(xc, xc), axes)
    else:
        xc = R.emit(R.subtract(x, R.reshape(R.astype(rm, dt), bshape)))
        var = R.reshape(R.astype(rv, dt), [c])
    rstd = R.emit(R.rsqrt(R.add(var, _k(R, at["eps"], x))))
    xhat = R.emit(R.multiply(xc, R.reshape(rstd, bshape)))
    db, dw = R.emit(R.sum(g, axes)), R.emit(R.sum(R.multiply(g, xhat), axes))
    k = R.emit(rstd if w is None else R.multiply(rstd, R.reshape(R.astype(w, dt), [c])))
    dx = R.multiply(g, R.reshape(k, bshape))
    if at["training"]:
        m = _k(R, float(max(math.prod(shape) // max(c, 1), 1)), x)
        k2 = R.divide(R.negative(R.multiply(k, dw)), m)
        k3 = R.divide(R.multiply(k, db), m)
        dx = R.subtract(R.add(dx, R.multiply(xhat, R.reshape(k2, bshape))),
                        R.reshape(k3, bshape))
    return dx, dw, db


def round_(R, a, at):
    """Half to even, as NumPy's rint and PyTorch's nearbyint; ``decimals`` scales first."""
    x, dec = a[0], at.get("decimals", 0)
    if not R.dtype(x).startswith("float"):
        return x
    x = _wide(R, x)
    if dec:
        x = R.multiply(x, _k(R, 10.0 ** dec, x)) if dec > 0 \
            else R.divide(x, _k(R, 10.0 ** -dec, x))
    f = R.emit(R.floor(x))
    diff = R.emit(R.subtract(x, f))
    half, one = _k(R, 0.5, x), _k(R, 1.0, x)
    r = R.where(R.greater(diff, half), R.add(f, one),
                R.where(R.less(diff, half), f, R.add(f, R.floor_mod(f, _k(R, 2.0, x)))))
    if dec:
        r = R.divide(r, _k(R, 10.0 ** dec, x)) if dec > 0 \
            else R.multiply(r, _k(R, 10.0 ** -dec, x))
    return r


def squeeze(R, a, at):
    dims = at["dims"]
    return R.reshape(a[0], [s for i, s in enumerate(R.shape(a[0])) if i not in dims])


def roll(R, a, at):
    """Two slices of each rolled dim, swapped; no dims rolls the flattened tensor."""
    x, shifts, dims = a[0], at["shifts"], at["dims"]
    shape = R.shape(x)
    if not dims:
        flat = roll(R, [R.reshape(x, [math.prod(shape)])], {"shifts": shifts[:1], "dims": [0]})
        return R.reshape(flat, list(shape))
    for s, d in zip(shifts, dims):
        d = d % len(shape)
        n = shape[d]
        s = s % n if n else 0
        if s:
            x = R.emit(R.concat([_slice_dim(R, x, d, n - s, n), _slice_dim(R, x, d, 0, n - s)],
                                axis=d))
    return x


def rms_norm(R, a, at):
    x, w = a
    nd = len(R.shape(x))
    axes = list(range(nd - len(at["normalized_shape"]), nd))
    ms = R.mean(R.multiply(x, x), axes, True)
    out = R.multiply(x, R.rsqrt(R.add(ms, _k(R, at["eps"], x))))
    return out if w is None else R.multiply(out, w)


def logit(R, a, at):
    """log(p / (1 - p)), p clamped to [eps, 1 - eps] when eps is given."""
    x, eps = _wide(R, a[0]), at.get("eps")
    if eps is not None:
        x = R.minimum(R.maximum(x, _k(R, eps, x)), _k(R, 1 - eps, x))
    x = R.emit(x)
    return R.log(R.divide(x, R.subtract(_k(R, 1.0, x), x)))


def nan_to_num(R, a, at):
    x = a[0]
    dt = R.dtype(x)
    if not dt.startswith("float"):
        return x
    big = float(np.finfo(np.dtype(dt)).max)
    pos, neg = at.get("posinf"), at.get("neginf")
    x = R.emit(R.where(R.isnan(x), _k(R, at.get("nan", 0.0), x), x))
    x = R.emit(R.where(R.logical_and(R.isinf(x), R.greater(x, _k(R, 0.0, x))),
                       _k(R, big if pos is None else pos, x), x))
    return R.where(R.isinf(x), _k(R, -big if neg is None else neg, x), x)


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
