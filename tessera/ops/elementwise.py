"""Elementwise ops: unary math, binary arithmetic, comparisons, logic, clamp and where.

Unary float functions are one table (name, NumPy function, derivative), so adding one is a
line. Every op broadcasts like PyTorch and promotes dtypes with ``result_type``.

>>> import tessera
>>> (tessera.tensor([1, 2]) / 2).dtype
tessera.float32
"""
from __future__ import annotations

import math

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.ops._util import broadcast_shapes, call, dtype_arg, float_dtype, shape_of, sum_to
from tessera.ops.registry import Meta, defop

__all__ = []  # filled by _public


def _public(fn):
    __all__.append(fn.__name__)
    return fn


def _errstate(fn):
    """Kernels whose edge cases (log(0), 1/0) must give inf/nan quietly, as PyTorch does."""
    def k(*a, **kw):
        with np.errstate(all="ignore"):
            return fn(*a, **kw)
    k.__name__ = fn.__name__
    return k


def _special():
    import scipy.special  # lazily: only erf/erfinv-like kernels need it
    return scipy.special


# ---- unary ---------------------------------------------------------------------------

def _unary_infer(name: str, float_out: bool, allow_bool: bool = True):
    def infer(x, **attrs):
        if type(x) is not Meta:
            raise TypeError(f"{name}(): argument 'input' must be Tensor, not {type(x).__name__}")
        if not allow_bool and x.dtype is D.bool_:
            raise RuntimeError(f"{name}: not supported for bool tensors")
        return Meta(x.shape, float_dtype(x.dtype) if float_out else x.dtype)
    return infer


LN2, LN10 = math.log(2.0), math.log(10.0)


def _gx(ctx):
    return ctx.inputs[0]


def _go(ctx):
    return ctx.outputs[0]


# name: (kernel, grad(ctx, g) -> g_input, save, float_out)
_UNARY = {
    "exp": (np.exp, lambda c, g: g * _go(c), "outputs", True),
    "exp2": (np.exp2, lambda c, g: g * _go(c) * LN2, "outputs", True),
    "expm1": (np.expm1, lambda c, g: g * (_go(c) + 1), "outputs", True),
    "log": (np.log, lambda c, g: g / _gx(c), "inputs", True),
    "log2": (np.log2, lambda c, g: g / (_gx(c) * LN2), "inputs", True),
    "log10": (np.log10, lambda c, g: g / (_gx(c) * LN10), "inputs", True),
    "log1p": (np.log1p, lambda c, g: g / (_gx(c) + 1), "inputs", True),
    "sqrt": (np.sqrt, lambda c, g: g / (2 * _go(c)), "outputs", True),
    "rsqrt": (lambda x: 1 / np.sqrt(x), lambda c, g: -0.5 * g * _go(c) ** 3, "outputs", True),
    "reciprocal": (lambda x: 1 / x, lambda c, g: -g * _go(c) * _go(c), "outputs", True),
    "sin": (np.sin, lambda c, g: g * cos(_gx(c)), "inputs", True),
    "cos": (np.cos, lambda c, g: -g * sin(_gx(c)), "inputs", True),
    "tan": (np.tan, lambda c, g: g * (1 + _go(c) * _go(c)), "outputs", True),
    "asin": (np.arcsin, lambda c, g: g * rsqrt(1 - _gx(c) * _gx(c)), "inputs", True),
    "acos": (np.arccos, lambda c, g: -g * rsqrt(1 - _gx(c) * _gx(c)), "inputs", True),
    "atan": (np.arctan, lambda c, g: g / (1 + _gx(c) * _gx(c)), "inputs", True),
    "sinh": (np.sinh, lambda c, g: g * cosh(_gx(c)), "inputs", True),
    "cosh": (np.cosh, lambda c, g: g * sinh(_gx(c)), "inputs", True),
    "tanh": (np.tanh, lambda c, g: g * (1 - _go(c) * _go(c)), "outputs", True),
    "asinh": (np.arcsinh, lambda c, g: g * rsqrt(_gx(c) * _gx(c) + 1), "inputs", True),
    "acosh": (np.arccosh, lambda c, g: g * rsqrt(_gx(c) * _gx(c) - 1), "inputs", True),
    "atanh": (np.arctanh, lambda c, g: g / (1 - _gx(c) * _gx(c)), "inputs", True),
    "sigmoid": (lambda x: _sigmoid_np(x), lambda c, g: g * _go(c) * (1 - _go(c)), "outputs",
                True),
    "erf": (lambda x: _special().erf(x),
            lambda c, g: g * (2 / math.sqrt(math.pi)) * exp(-_gx(c) * _gx(c)), "inputs", True),
    "erfc": (lambda x: _special().erfc(x),
             lambda c, g: g * (-2 / math.sqrt(math.pi)) * exp(-_gx(c) * _gx(c)), "inputs", True),
    "erfinv": (lambda x: _special().erfinv(x),
               lambda c, g: g * (math.sqrt(math.pi) / 2) * exp(_go(c) * _go(c)), "outputs",
               True),
    "square": (np.square, lambda c, g: g * 2 * _gx(c), "inputs", False),
    "frac": (lambda x: x - np.trunc(x), lambda c, g: g, "", False),
}


def _sigmoid_np(x):
    # exp of -|x| only, so large |x| never overflows
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def _make_unary(name, kernel, grad, save, float_out):
    def cpu(x):
        if float_out and x.dtype.kind in "biu":
            x = x.astype(D.get_default_dtype().np)
        return kernel(x)
    op = defop(name, _unary_infer(name, float_out, allow_bool=float_out), _errstate(cpu),
               grad=lambda ctx, g: (grad(ctx, g),), save=(save,) if save else ())

    def fn(input, *, out=None):
        return call(op, input, out=out)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}`` (``tessera.{name}(tessera.tensor([0.5]))``)."
    return _public(fn)


for _n, _spec in _UNARY.items():
    globals()[_n] = _make_unary(_n, *_spec)


def _zero_grad(ctx, g):
    return (g * 0,)


def _int_preserving(name, kernel, grad=_zero_grad, save=()):
    """Unary ops that keep the input dtype (floor of an int is that int)."""
    op = defop(name, _unary_infer(name, False), kernel, grad=grad, save=save)

    def fn(input, *, out=None):
        return call(op, input, out=out)
    fn.__name__ = name
    return _public(fn), op


def _neg_infer(x):
    if x.dtype is D.bool_:
        raise RuntimeError("neg: Negation, the `-` operator, on a bool tensor is not supported. "
                           "If you are trying to invert a mask, use the `~` or `logical_not()` "
                           "operator instead.")
    return Meta(x.shape, x.dtype)


_NEG = defop("neg", _neg_infer, np.negative, grad=lambda c, g: (-g,), save=())
_NEG.inplace_kernels["cpu"] = lambda t, x: np.negative(x, out=t)


@_public
def neg(input, *, out=None):
    """``-input``."""
    return call(_NEG, input, out=out)


negative = neg
__all__.append("negative")

positive, _ = _int_preserving("positive", lambda x: x, grad=lambda c, g: (g,))
abs, _ = _int_preserving("abs", np.abs, grad=lambda c, g: (g * sign(c.inputs[0]),),
                         save=("inputs",))
absolute = abs
__all__.append("absolute")
sign, _ = _int_preserving("sign", lambda x: np.sign(x) if x.dtype != np.bool_ else x)
sgn = sign
__all__.append("sgn")
floor, _ = _int_preserving("floor", lambda x: np.floor(x) if x.dtype.kind == "f" else x)
ceil, _ = _int_preserving("ceil", lambda x: np.ceil(x) if x.dtype.kind == "f" else x)
trunc, _ = _int_preserving("trunc", lambda x: np.trunc(x) if x.dtype.kind == "f" else x)
fix = trunc
__all__.append("fix")


def _round_kernel(x, decimals=0):
    if x.dtype.kind != "f":
        return x
    return np.round(x, decimals)  # half to even, like PyTorch


_ROUND = defop("round", lambda x, decimals=0: _unary_infer("round", False)(x),
               _round_kernel, grad=_zero_grad, save=())


@_public
def round(input, *, decimals: int = 0, out=None):
    """Round half to even, to ``decimals`` places."""
    return call(_ROUND, input, decimals=decimals, out=out)


def _relu_kernel(x):
    return np.maximum(x, 0).astype(x.dtype, copy=False)


_RELU = defop("relu", _unary_infer("relu", False, allow_bool=False), _relu_kernel,
              grad=lambda c, g: (g * (c.outputs[0] > 0),), save=("outputs",))


@_public
def relu(input, *, out=None):
    """max(input, 0)."""
    return call(_RELU, input, out=out)


def _logit_kernel(x, eps=None):
    if eps is not None:
        x = np.clip(x, eps, 1 - eps)
    return np.log(x / (1 - x))


def _logit_grad(ctx, g):
    x = ctx.inputs[0]
    eps = ctx.attrs.get("eps")
    d = g / (x * (1 - x))
    if eps is not None:
        d = where((x < eps) | (x > 1 - eps), 0.0, d)
    return (d,)


_LOGIT = defop("logit", lambda x, eps=None: _unary_infer("logit", True)(x),
               _errstate(_logit_kernel), grad=_logit_grad)


@_public
def logit(input, eps: float | None = None, *, out=None):
    """log(p / (1 - p)), with p clamped to [eps, 1 - eps] when eps is given."""
    return call(_LOGIT, input, eps=eps, out=out)


def _nan_to_num_kernel(x, nan=0.0, posinf=None, neginf=None):
    if x.dtype.kind not in "fc":
        return x
    return np.nan_to_num(x, nan=nan, posinf=posinf, neginf=neginf)


_NAN_TO_NUM = defop("nan_to_num", lambda x, **k: _unary_infer("nan_to_num", False)(x),
                    _nan_to_num_kernel,
                    grad=lambda c, g: (g * isfinite(c.inputs[0]),))


@_public
def nan_to_num(input, nan: float = 0.0, posinf: float | None = None,
               neginf: float | None = None, *, out=None):
    """Replace NaN, +inf and -inf by finite numbers (dtype max/min by default)."""
    return call(_NAN_TO_NUM, input, nan=nan, posinf=posinf, neginf=neginf, out=out)


def _bool_unary(name, kernel):
    op = defop(name, lambda x: Meta(_tensor_meta(name, x).shape, D.bool_), kernel, grad=None)

    def fn(input):
        return call(op, input)
    fn.__name__ = name
    return _public(fn)


def _tensor_meta(name, x):
    if type(x) is not Meta:
        raise TypeError(f"{name}(): argument 'input' must be Tensor, not {type(x).__name__}")
    return x


isnan = _bool_unary("isnan", np.isnan)
isinf = _bool_unary("isinf", lambda x: np.isinf(x) if x.dtype.kind in "fc" else
                    np.zeros(x.shape, bool))
isfinite = _bool_unary("isfinite", lambda x: np.isfinite(x) if x.dtype.kind in "fc" else
                       np.ones(x.shape, bool))
isposinf = _bool_unary("isposinf", lambda x: np.isposinf(x) if x.dtype.kind == "f" else
                       np.zeros(x.shape, bool))
isneginf = _bool_unary("isneginf", lambda x: np.isneginf(x) if x.dtype.kind == "f" else
                       np.zeros(x.shape, bool))
signbit = _bool_unary("signbit", lambda x: np.signbit(x) if x.dtype.kind != "b" else
                      np.zeros(x.shape, bool))
logical_not = _bool_unary("logical_not", np.logical_not)


def _bitwise_not_infer(x):
    if x.dtype.category >= 2:
        raise RuntimeError(f"bitwise_not: not implemented for '{x.dtype}'; it takes integer "
                           "or bool tensors")
    return Meta(x.shape, x.dtype)


_BITWISE_NOT = defop("bitwise_not", _bitwise_not_infer, np.invert, grad=None)


@_public
def bitwise_not(input, *, out=None):
    """``~input`` for integer and bool tensors."""
    return call(_BITWISE_NOT, input, out=out)


# ---- binary --------------------------------------------------------------------------

def _binary_infer(name, out_dtype=None, int_ok=True, bool_ok=True):
    def infer(a, b, **attrs):
        if type(a) is not Meta and type(b) is not Meta:
            raise TypeError(f"{name}(): expected at least one Tensor argument, got "
                            f"{type(a).__name__} and {type(b).__name__}")
        for m in (a, b):
            if type(m) is not Meta and not isinstance(m, (int, float, bool, complex,
                                                            np.generic)):
                raise TypeError(f"{name}(): argument 'other' must be Tensor or Number, not "
                                f"{type(m).__name__}")
        shape = broadcast_shapes(name, shape_of(a), shape_of(b))
        dt = D.result_type(dtype_arg(a), dtype_arg(b))
        if not int_ok and dt.category < 2:
            raise RuntimeError(f"{name}: not implemented for '{dt}'; it takes floating-point "
                               "tensors")
        if not bool_ok and dt is D.bool_:
            raise RuntimeError(f"{name}: not supported for bool tensors")
        return Meta(shape, out_dtype(dt) if out_dtype else dt)
    return infer


def _scalar(ctx, i):
    return not isinstance(ctx.input_metas[i], Meta)


def _shape(ctx, i):
    return ctx.input_metas[i].shape


def _reduce_pair(ctx, ga, gb):
    """Sum broadcast gradients back to each input's shape; None for scalar inputs."""
    need = ctx.needs_input_grad
    return (sum_to(ga, _shape(ctx, 0)) if need[0] and ga is not None else None,
            sum_to(gb, _shape(ctx, 1)) if need[1] and gb is not None else None)


def _add_kernel(a, b, alpha=1):
    return a + b if alpha == 1 else a + alpha * b


def _sub_kernel(a, b, alpha=1):
    return a - b if alpha == 1 else a - alpha * b


def _add_grad(ctx, g):
    alpha = ctx.attrs.get("alpha", 1)
    return _reduce_pair(ctx, g, g if alpha == 1 else g * alpha)


def _sub_grad(ctx, g):
    alpha = ctx.attrs.get("alpha", 1)
    return _reduce_pair(ctx, g, -g if alpha == 1 else g * (-alpha))


_ADD = defop("add", _binary_infer("add"), _add_kernel, grad=_add_grad, save=(), promote=True)
_SUB = defop("sub", _binary_infer("sub", bool_ok=False), _sub_kernel, grad=_sub_grad, save=(),
             promote=True)


def _inplace_add(t, a, b, alpha=1):
    if alpha == 1:
        np.add(a, b, out=t, casting="unsafe")
    else:
        np.add(a, np.multiply(b, alpha), out=t, casting="unsafe")


def _inplace_sub(t, a, b, alpha=1):
    _inplace_add(t, a, -b if np.ndim(b) else -b, alpha)


_ADD.inplace_kernels["cpu"] = _inplace_add
_SUB.inplace_kernels["cpu"] = _inplace_sub


@_public
def add(input, other, *, alpha=1, out=None):
    """``input + alpha * other``, broadcasting and promoting like PyTorch."""
    return call(_ADD, input, other, alpha=alpha, out=out)


@_public
def sub(input, other, *, alpha=1, out=None):
    """``input - alpha * other``."""
    return call(_SUB, input, other, alpha=alpha, out=out)


subtract = sub
__all__.append("subtract")


def _mul_grad(ctx, g):
    a, b = ctx.inputs
    need = ctx.needs_input_grad
    return _reduce_pair(ctx, g * b if need[0] else None, g * a if need[1] else None)


_MUL = defop("mul", _binary_infer("mul"), lambda a, b: a * b if a.dtype != np.bool_ else a & b,
             grad=_mul_grad, promote=True)
_MUL.inplace_kernels["cpu"] = lambda t, a, b: np.multiply(a, b, out=t, casting="unsafe")


@_public
def mul(input, other, *, out=None):
    """``input * other``."""
    return call(_MUL, input, other, out=out)


multiply = mul
__all__.append("multiply")


def _div_out(dt):
    return dt if dt.category >= 2 else D.get_default_dtype()


def _div_infer(a, b, rounding_mode=None):
    if rounding_mode not in (None, "trunc", "floor"):
        raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' "
                         f"but found '{rounding_mode}'")
    m = _binary_infer("div")(a, b)
    return m if rounding_mode else Meta(m.shape, _div_out(m.dtype))


def _check_int_zero(name, b):
    if np.ndim(b) == 0 and b == 0 or (isinstance(b, np.ndarray) and (b == 0).any()):
        raise RuntimeError(f"{name}: ZeroDivisionError (integer division by zero)")


def _div_kernel(a, b, rounding_mode=None):
    if rounding_mode is None:
        return np.true_divide(a, b)
    if a.dtype.kind in "biu":
        _check_int_zero("div", b)
        if rounding_mode == "floor":
            return np.floor_divide(a, b)
        q = np.abs(a) // np.abs(b)
        return np.where((a < 0) ^ (np.asarray(b) < 0), -q, q).astype(a.dtype)
    q = np.true_divide(a, b)
    return np.floor(q) if rounding_mode == "floor" else np.trunc(q)


def _div_grad(ctx, g):
    a, b = ctx.inputs
    if ctx.attrs.get("rounding_mode"):
        return _reduce_pair(ctx, g * 0, g * 0)
    need = ctx.needs_input_grad
    return _reduce_pair(ctx, g / b if need[0] else None,
                        -g * a / (b * b) if need[1] else None)


_DIV = defop("div", _div_infer, _errstate(_div_kernel), grad=_div_grad, promote=True)


@_public
def div(input, other, *, rounding_mode=None, out=None):
    """True division (integers give floats); ``rounding_mode='trunc'|'floor'``."""
    return call(_DIV, input, other, rounding_mode=rounding_mode, out=out)


divide = true_divide = div
__all__ += ["divide", "true_divide"]


@_public
def floor_divide(input, other, *, out=None):
    """``input // other`` (rounds toward minus infinity, like Python)."""
    return div(input, other, rounding_mode="floor", out=out)


def _remainder_kernel(a, b):
    if a.dtype.kind in "biu":
        _check_int_zero("remainder", b)
    return np.mod(a, b)


def _fmod_kernel(a, b):
    if a.dtype.kind in "biu":
        _check_int_zero("fmod", b)
    return np.fmod(a, b)


def _mod_grad(kind):
    def grad(ctx, g):
        a, b = ctx.inputs
        q = div(a, b, rounding_mode="floor" if kind == "remainder" else "trunc")
        return _reduce_pair(ctx, g, -g * q)
    return grad


_REMAINDER = defop("remainder", _binary_infer("remainder", bool_ok=False),
                   _errstate(_remainder_kernel), grad=_mod_grad("remainder"), promote=True)
_FMOD = defop("fmod", _binary_infer("fmod", bool_ok=False), _errstate(_fmod_kernel),
              grad=_mod_grad("fmod"), promote=True)


@_public
def remainder(input, other, *, out=None):
    """Python's ``%``: the result has the sign of the divisor."""
    return call(_REMAINDER, input, other, out=out)


@_public
def fmod(input, other, *, out=None):
    """C's fmod: the result has the sign of the dividend."""
    return call(_FMOD, input, other, out=out)


def _pow_kernel(a, b):
    if a.dtype.kind in "iu" and np.any(np.asarray(b) < 0):
        raise RuntimeError("pow: Integers to negative integer powers are not allowed.")
    return np.power(a, b)


def _pow_grad(ctx, g):
    a, b = ctx.inputs
    need = ctx.needs_input_grad
    ga = gb = None
    if need[0]:
        ga = g * b * pow(a, b - 1) if not _scalar(ctx, 1) or b != 0 else g * 0
        if _scalar(ctx, 1) and b == 0:
            ga = g * 0
    if need[1]:
        out = pow(a, b)
        gb = where((a == 0) & (b >= 0), 0.0, g * out * log(a))
    return _reduce_pair(ctx, ga, gb)


_POW = defop("pow", _binary_infer("pow"), _errstate(_pow_kernel), grad=_pow_grad,
             promote=True)


@_public
def pow(input, exponent, *, out=None):
    """``input ** exponent``."""
    return call(_POW, input, exponent, out=out)


@_public
def float_power(input, exponent, *, out=None):
    """``pow`` computed in float64."""
    x = input.double() if isinstance(input, Tensor) else input
    e = exponent.double() if isinstance(exponent, Tensor) else exponent
    return pow(x, e, out=out)


def _minmax_grad(pick_a):
    def grad(ctx, g):
        a, b = ctx.inputs
        sel = pick_a(a, b)
        tie = a == b
        ga = where(tie, g / 2, where(sel, g, 0.0))
        gb = where(tie, g / 2, where(sel, 0.0, g))
        return _reduce_pair(ctx, ga, gb)
    return grad


_MAXIMUM = defop("maximum", _binary_infer("maximum"), np.maximum,
                 grad=_minmax_grad(lambda a, b: a > b), promote=True)
_MINIMUM = defop("minimum", _binary_infer("minimum"), np.minimum,
                 grad=_minmax_grad(lambda a, b: a < b), promote=True)
_FMAX = defop("fmax", _binary_infer("fmax"), np.fmax,
              grad=_minmax_grad(lambda a, b: (a > b) | isnan(b)), promote=True)
_FMIN = defop("fmin", _binary_infer("fmin"), np.fmin,
              grad=_minmax_grad(lambda a, b: (a < b) | isnan(b)), promote=True)


@_public
def maximum(input, other, *, out=None):
    """Elementwise max; NaN propagates."""
    return call(_MAXIMUM, input, other, out=out)


@_public
def minimum(input, other, *, out=None):
    """Elementwise min; NaN propagates."""
    return call(_MINIMUM, input, other, out=out)


@_public
def fmax(input, other, *, out=None):
    """Elementwise max ignoring NaN."""
    return call(_FMAX, input, other, out=out)


@_public
def fmin(input, other, *, out=None):
    """Elementwise min ignoring NaN."""
    return call(_FMIN, input, other, out=out)


def _atan2_grad(ctx, g):
    a, b = ctx.inputs
    den = a * a + b * b
    return _reduce_pair(ctx, g * b / den, -g * a / den)


def _hypot_grad(ctx, g):
    a, b = ctx.inputs
    h = hypot(a, b)
    return _reduce_pair(ctx, g * a / h, g * b / h)


_FLOAT_OUT = _div_out
_ATAN2 = defop("atan2", _binary_infer("atan2", out_dtype=_FLOAT_OUT), _errstate(np.arctan2),
               grad=_atan2_grad, promote=True)
_HYPOT = defop("hypot", _binary_infer("hypot", int_ok=False), np.hypot, grad=_hypot_grad,
               promote=True)


@_public
def atan2(input, other, *, out=None):
    """The angle of (other, input), in (-pi, pi]."""
    return call(_ATAN2, input, other, out=out)


arctan2 = atan2
__all__.append("arctan2")


@_public
def hypot(input, other, *, out=None):
    """sqrt(input**2 + other**2) without overflow."""
    return call(_HYPOT, input, other, out=out)


# ---- comparisons and logic (bool results, no gradient) ------------------------------

def _compare(name, kernel):
    op = defop(name, _binary_infer(name, out_dtype=lambda d: D.bool_), kernel, grad=None,
               promote=True)

    def fn(input, other, *, out=None):
        return call(op, input, other, out=out)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}``; a bool tensor."
    return _public(fn)


eq = _compare("eq", np.equal)
ne = _compare("ne", np.not_equal)
lt = _compare("lt", np.less)
le = _compare("le", np.less_equal)
gt = _compare("gt", np.greater)
ge = _compare("ge", np.greater_equal)
logical_and = _compare("logical_and", np.logical_and)
logical_or = _compare("logical_or", np.logical_or)
logical_xor = _compare("logical_xor", np.logical_xor)
not_equal, less, less_equal, greater, greater_equal = ne, lt, le, gt, ge
__all__ += ["not_equal", "less", "less_equal", "greater", "greater_equal"]


def _bitwise(name, kernel):
    def infer(a, b):
        m = _binary_infer(name)(a, b)
        if m.dtype.category >= 2:
            raise RuntimeError(f"{name}: not implemented for '{m.dtype}'; it takes integer or "
                               "bool tensors")
        return m
    op = defop(name, infer, kernel, grad=None, promote=True)

    def fn(input, other, *, out=None):
        return call(op, input, other, out=out)
    fn.__name__ = name
    return _public(fn)


bitwise_and = _bitwise("bitwise_and", np.bitwise_and)
bitwise_or = _bitwise("bitwise_or", np.bitwise_or)
bitwise_xor = _bitwise("bitwise_xor", np.bitwise_xor)
bitwise_left_shift = _bitwise("bitwise_left_shift", np.left_shift)
bitwise_right_shift = _bitwise("bitwise_right_shift", np.right_shift)


def _isclose_infer(a, b, rtol=1e-5, atol=1e-8, equal_nan=False):
    if type(a) is not Meta or type(b) is not Meta:
        raise TypeError("isclose(): arguments must be Tensors")
    if a.dtype is not b.dtype:
        raise RuntimeError(f"isclose: {a.dtype} did not match {b.dtype}")
    return Meta(broadcast_shapes("isclose", a.shape, b.shape), D.bool_)


_ISCLOSE = defop("isclose", _isclose_infer,
                 lambda a, b, rtol=1e-5, atol=1e-8, equal_nan=False:
                 np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan), grad=None)


@_public
def isclose(input, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False):
    """|input - other| <= atol + rtol * |other|, elementwise."""
    return call(_ISCLOSE, input, other, rtol=rtol, atol=atol, equal_nan=equal_nan)


@_public
def allclose(input, other, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: bool = False) -> bool:
    """True when every element ``isclose``."""
    return bool(isclose(input, other, rtol, atol, equal_nan).all())


@_public
def equal(input, other) -> bool:
    """True when both have the same shape and elements."""
    return tuple(input.shape) == tuple(other.shape) and bool(eq(input, other).all())


# ---- ternary: where, lerp, addcmul, addcdiv, clamp, masked_fill ----------------------

def _where_infer(cond, a, b):
    if type(cond) is not Meta:
        raise TypeError(f"where(): argument 'condition' must be Tensor, not "
                        f"{type(cond).__name__}")
    if cond.dtype is not D.bool_ and cond.dtype is not D.uint8:
        raise RuntimeError(f"where expected condition to be a boolean tensor, but got a tensor "
                           f"with dtype {cond.dtype.name.capitalize()}")
    shape = broadcast_shapes("where", cond.shape, shape_of(a), shape_of(b))
    return Meta(shape, D.result_type(dtype_arg(a), dtype_arg(b)))


def _where_kernel(c, a, b):
    return np.where(c, a, b)


def _where_grad(ctx, g):
    c = ctx.inputs[0]
    need = ctx.needs_input_grad
    ga = sum_to(where(c, g, 0.0), _shape(ctx, 1)) if need[1] else None
    gb = sum_to(where(c, 0.0, g), _shape(ctx, 2)) if need[2] else None
    return None, ga, gb


_WHERE = defop("where", _where_infer, _where_kernel, grad=_where_grad)


@_public
def where(condition, input=None, other=None, *, out=None):
    """``input`` where ``condition`` else ``other``; ``where(cond)`` is ``nonzero(as_tuple)``."""
    if input is None and other is None:
        from tessera.ops.indexing import nonzero
        return nonzero(condition, as_tuple=True)
    return call(_WHERE, condition, input, other, out=out)


def _lerp_infer(a, b, w):
    shape = broadcast_shapes("lerp", shape_of(a), shape_of(b), shape_of(w))
    if type(a) is Meta and type(b) is Meta and a.dtype is not b.dtype:
        raise RuntimeError(f"lerp: expected dtype {a.dtype} for `end` but got dtype {b.dtype}")
    return Meta(shape, a.dtype)


def _lerp_grad(ctx, g):
    a, b, w = ctx.inputs
    need = ctx.needs_input_grad
    ga = sum_to(g * (1 - w), _shape(ctx, 0)) if need[0] else None
    gb = sum_to(g * w, _shape(ctx, 1)) if need[1] else None
    gw = sum_to(g * (b - a), _shape(ctx, 2)) if need[2] else None
    return ga, gb, gw


_LERP = defop("lerp", _lerp_infer, lambda a, b, w: a + w * (b - a), grad=_lerp_grad)


@_public
def lerp(input, end, weight, *, out=None):
    """``input + weight * (end - input)``."""
    return call(_LERP, input, end, weight, out=out)


def _addc_infer(name):
    def infer(a, t1, t2, value=1):
        shape = broadcast_shapes(name, shape_of(a), shape_of(t1), shape_of(t2))
        return Meta(shape, D.result_type(dtype_arg(a), dtype_arg(t1), dtype_arg(t2)))
    return infer


def _addcmul_grad(ctx, g):
    a, t1, t2 = ctx.inputs
    v = ctx.attrs.get("value", 1)
    need = ctx.needs_input_grad
    return (sum_to(g, _shape(ctx, 0)) if need[0] else None,
            sum_to(g * t2 * v, _shape(ctx, 1)) if need[1] else None,
            sum_to(g * t1 * v, _shape(ctx, 2)) if need[2] else None)


def _addcdiv_grad(ctx, g):
    a, t1, t2 = ctx.inputs
    v = ctx.attrs.get("value", 1)
    need = ctx.needs_input_grad
    return (sum_to(g, _shape(ctx, 0)) if need[0] else None,
            sum_to(g * v / t2, _shape(ctx, 1)) if need[1] else None,
            sum_to(-g * v * t1 / (t2 * t2), _shape(ctx, 2)) if need[2] else None)


_ADDCMUL = defop("addcmul", _addc_infer("addcmul"), lambda a, t1, t2, value=1:
                 a + value * t1 * t2, grad=_addcmul_grad, promote=True)
_ADDCDIV = defop("addcdiv", _addc_infer("addcdiv"), _errstate(lambda a, t1, t2, value=1:
                 a + value * (t1 / t2)), grad=_addcdiv_grad, promote=True)
_ADDCMUL.inplace_kernels["cpu"] = lambda t, a, t1, t2, value=1: np.add(
    a, value * (t1 * t2) if value != 1 else t1 * t2, out=t, casting="unsafe")
_ADDCDIV.inplace_kernels["cpu"] = lambda t, a, t1, t2, value=1: np.add(
    a, value * (t1 / t2) if value != 1 else t1 / t2, out=t, casting="unsafe")


@_public
def addcmul(input, tensor1, tensor2, *, value=1, out=None):
    """``input + value * tensor1 * tensor2``."""
    return call(_ADDCMUL, input, tensor1, tensor2, value=value, out=out)


@_public
def addcdiv(input, tensor1, tensor2, *, value=1, out=None):
    """``input + value * tensor1 / tensor2``."""
    if isinstance(tensor1, Tensor) and isinstance(tensor2, Tensor) and \
            tensor1.dtype.category < 2 and tensor2.dtype.category < 2:
        raise RuntimeError("addcdiv: Integer division with addcdiv is no longer supported, "
                           "and in a future release addcdiv will perform a true division of "
                           "tensor1 and tensor2.")
    return call(_ADDCDIV, input, tensor1, tensor2, value=value, out=out)


def _clamp_infer(x, lo, hi):
    if type(x) is not Meta:
        raise TypeError(f"clamp(): argument 'input' must be Tensor, not {type(x).__name__}")
    if lo is None and hi is None:
        raise RuntimeError("clamp: At least one of 'min' or 'max' must not be None")
    shape = broadcast_shapes("clamp", x.shape, shape_of(lo), shape_of(hi))
    return Meta(shape, D.result_type(*[dtype_arg(m) for m in (x, lo, hi) if m is not None]))


def _clamp_kernel(x, lo, hi):
    out = x
    if lo is not None:
        out = np.where(np.isnan(out) if out.dtype.kind == "f" else False, out,
                       np.maximum(out, lo))
    if hi is not None:
        out = np.where(np.isnan(out) if out.dtype.kind == "f" else False, out,
                       np.minimum(out, hi))
    return out


def _clamp_grad(ctx, g):
    x, lo, hi = ctx.inputs
    need = ctx.needs_input_grad
    inside = None
    if lo is not None:
        inside = x >= lo
    if hi is not None:
        m = x <= hi
        inside = m if inside is None else inside & m
    gx = sum_to(where(inside, g, 0.0), _shape(ctx, 0)) if need[0] else None
    glo = ghi = None
    if need[1]:
        glo = sum_to(where(x < lo, g, 0.0), _shape(ctx, 1))
    if need[2]:
        ghi = sum_to(where(x > hi, g, 0.0), _shape(ctx, 2))
    return gx, glo, ghi


_CLAMP = defop("clamp", _clamp_infer, _clamp_kernel, grad=_clamp_grad, promote=True)
_CLAMP.inplace_kernels["cpu"] = lambda t, x, lo, hi: np.copyto(
    t, _clamp_kernel(x, lo, hi), casting="unsafe")


@_public
def clamp(input, min=None, max=None, *, out=None):
    """Limit values to [min, max]; either bound may be a tensor or None."""
    return call(_CLAMP, input, min, max, out=out)


clip = clamp
__all__.append("clip")


@_public
def clamp_min(input, min, *, out=None):
    return clamp(input, min, None, out=out)


@_public
def clamp_max(input, max, *, out=None):
    return clamp(input, None, max, out=out)


def _masked_fill_infer(x, mask, value):
    if type(mask) is not Meta or mask.dtype is not D.bool_:
        raise RuntimeError("masked_fill_ only supports boolean masks, but got mask with dtype "
                           f"{mask.dtype if type(mask) is Meta else type(mask).__name__}")
    if type(value) is Meta and value.shape != ():
        raise RuntimeError("masked_fill_ only supports a 0-dimensional value tensor, but got "
                           f"tensor with {len(value.shape)} dimension(s).")
    shape = broadcast_shapes("masked_fill", x.shape, mask.shape)
    return Meta(shape, x.dtype)


def _masked_fill_grad(ctx, g):
    mask = ctx.inputs[1]
    need = ctx.needs_input_grad
    gx = sum_to(where(mask, 0.0, g), _shape(ctx, 0)) if need[0] else None
    gv = where(mask, g, 0.0).sum() if need[2] else None
    return gx, None, gv


_MASKED_FILL = defop("masked_fill", _masked_fill_infer,
                     lambda x, mask, value: np.where(mask, np.asarray(value, x.dtype), x),
                     grad=_masked_fill_grad)
_MASKED_FILL.inplace_kernels["cpu"] = lambda t, x, mask, value: np.copyto(
    t, np.asarray(value, t.dtype), where=np.broadcast_to(mask, t.shape))


@_public
def masked_fill(input, mask, value, *, out=None):
    """``value`` where ``mask`` is True, else ``input``."""
    return call(_MASKED_FILL, input, mask, value, out=out)

