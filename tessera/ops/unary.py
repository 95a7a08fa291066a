"""Unary elementwise ops: math functions (exp, log, trigonometry, erf...), sign and rounding,
relu, logit and nan_to_num.

The float functions are one table (name, NumPy function, C rule, derivative), so adding one
is a line; integer and bool inputs compute in the default float dtype. The dtype-keeping
ops (neg, abs, floor...) return integers unchanged in type.

>>> import tessera
>>> tessera.exp(tessera.tensor([0.0])), tessera.floor(tessera.tensor([3])).dtype
(tensor([1.]), tessera.int64)
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tessera import _dtype as D
from tessera.kernels.c_expr import fmt, libm, tsr
from tessera.ops import _jax, _relax, cost
from tessera.ops._elementwise import (
    _LOWP,
    ONE,
    POINTWISE,
    _down,
    _float_max,
    _need_tensor,
)
from tessera.ops._sbp import pointwise
from tessera.ops._util import call, float_dtype
from tessera.ops.comparison import isfinite
from tessera.ops.registry import Meta, defop
from tessera.ops.ternary import where

__all__ = ["exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal",
           "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
           "atanh", "arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh", "sigmoid",
           "erf", "erfc", "erfinv", "neg", "positive", "abs", "sign", "floor", "ceil", "trunc",
           "frac", "square", "negative", "absolute", "sgn", "fix", "relu", "round", "logit",
           "nan_to_num", "lgamma", "digamma", "polygamma"]



def _special():
    import scipy.special  # lazily: only erf/erfinv-like kernels need it
    return scipy.special


def _unary_infer(name: str, float_out: bool, bool_ok: bool = True, int_ok: bool = True,
                 bool_to=None):
    def infer(x, **attrs):
        _need_tensor(name, x)
        if x.dtype is D.bool_ and not bool_ok:
            raise NotImplementedError(f'"{name}_cpu" not implemented for \'Bool\'')
        if x.dtype.category == 1 and not int_ok:
            raise NotImplementedError(f'"{name}_cpu" not implemented for \'{x.dtype.name}\'')
        if float_out:
            return Meta(x.shape, float_dtype(x.dtype))
        return Meta(x.shape, bool_to if bool_to and x.dtype is D.bool_ else x.dtype)
    return infer


LN2, LN10 = math.log(2.0), math.log(10.0)
# traits (``tessera.ops.registry.TRAITS``): NumPy's ufunc is one pass at memory speed, and
# for the _FAST ones faster than a C loop's call when the operand needs no cast
_SINGLE = frozenset({"single_pass"})
_FAST = frozenset({"single_pass", "numpy_fast"})


def _gx(ctx):
    return ctx.inputs[0]


def _go(ctx):
    return ctx.outputs[0]


def _u(name: str):
    """A unary op function by name: the table's gradients use ops the table itself defines."""
    return globals()[name]


# name: (kernel, to_c, grad(ctx, g) -> g_input, save, traits)
_UNARY = {
    "exp": (np.exp, tsr("exp"), lambda c, g: g * _go(c), "outputs", _SINGLE),
    "exp2": (np.exp2, libm("exp2"), lambda c, g: g * _go(c) * LN2, "outputs"),
    "expm1": (np.expm1, tsr("expm1"), lambda c, g: g * (_go(c) + 1), "outputs"),
    "log": (np.log, tsr("log"), lambda c, g: g / _gx(c), "inputs", _SINGLE),
    "log2": (np.log2, libm("log2"), lambda c, g: g / (_gx(c) * LN2), "inputs"),
    "log10": (np.log10, libm("log10"), lambda c, g: g / (_gx(c) * LN10), "inputs"),
    "log1p": (np.log1p, tsr("log1p"), lambda c, g: g / (_gx(c) + 1), "inputs"),
    "sqrt": (np.sqrt, libm("sqrt"), lambda c, g: g / (2 * _go(c)), "outputs", _FAST),
    "rsqrt": (lambda x: 1 / np.sqrt(x), fmt("(({T})1 / sqrt{f}({0}))"),
              lambda c, g: -0.5 * g * _go(c) ** 3, "outputs"),
    "reciprocal": (lambda x: 1 / x, fmt("(({T})1 / {0})"),
                   lambda c, g: -g * _go(c) * _go(c), "outputs", _FAST),
    "sin": (np.sin, libm("sin"), lambda c, g: g * _u("cos")(_gx(c)), "inputs", _SINGLE),
    "cos": (np.cos, libm("cos"), lambda c, g: -g * _u("sin")(_gx(c)), "inputs", _SINGLE),
    "tan": (np.tan, libm("tan"), lambda c, g: g * (1 + _go(c) * _go(c)), "outputs"),
    "asin": (np.arcsin, libm("asin"), lambda c, g: g * _u("rsqrt")(1 - _gx(c) * _gx(c)),
             "inputs"),
    "acos": (np.arccos, libm("acos"), lambda c, g: -g * _u("rsqrt")(1 - _gx(c) * _gx(c)),
             "inputs"),
    "atan": (np.arctan, libm("atan"), lambda c, g: g / (1 + _gx(c) * _gx(c)), "inputs"),
    "sinh": (np.sinh, libm("sinh"), lambda c, g: g * _u("cosh")(_gx(c)), "inputs"),
    "cosh": (np.cosh, libm("cosh"), lambda c, g: g * _u("sinh")(_gx(c)), "inputs"),
    "tanh": (np.tanh, tsr("tanh"), lambda c, g: g * (1 - _go(c) * _go(c)), "outputs"),
    "asinh": (np.arcsinh, libm("asinh"), lambda c, g: g * _u("rsqrt")(_gx(c) * _gx(c) + 1),
              "inputs"),
    "acosh": (np.arccosh, libm("acosh"), lambda c, g: g * _u("rsqrt")(_gx(c) * _gx(c) - 1),
              "inputs"),
    "atanh": (np.arctanh, libm("atanh"), lambda c, g: g / (1 - _gx(c) * _gx(c)), "inputs"),
    "sigmoid": (lambda x: _sigmoid_np(x), tsr("sigmoid"),
                lambda c, g: g * _go(c) * (1 - _go(c)), "outputs"),
    "erf": (lambda x: _special().erf(x), tsr("erf"),
            lambda c, g: g * (2 / math.sqrt(math.pi)) * _u("exp")(-_gx(c) * _gx(c)), "inputs"),
    "erfc": (lambda x: _special().erfc(x), tsr("erfc"),
             lambda c, g: g * (-2 / math.sqrt(math.pi)) * _u("exp")(-_gx(c) * _gx(c)), "inputs"),
    "erfinv": (lambda x: _special().erfinv(x), None,
               lambda c, g: g * (math.sqrt(math.pi) / 2) * _u("exp")(_go(c) * _go(c)), "outputs"),
    "lgamma": (lambda x: _lgamma_np(x), libm("lgamma"),
               lambda c, g: g * _u("digamma")(_gx(c)), "inputs"),
    "digamma": (lambda x: _special().psi(x), None,
                lambda c, g: g * _u("polygamma")(1, _gx(c)), "inputs"),
}


def _lgamma_np(x):
    # log|gamma(x)|; at -inf PyTorch (and C's lgamma) give +inf where SciPy gives -inf
    out = _special().gammaln(x)
    return np.where(x == -np.inf, np.inf, out).astype(out.dtype, copy=False)


def _sigmoid_np(x):
    # exp of -|x| only, so large |x| never overflows
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def _float_kernel(kernel):
    """Integer and bool inputs compute in the default float dtype; float16/bfloat16 in
    float32 (dispatch rounds the result to the inferred dtype)."""
    def cpu(x):
        if x.dtype.kind in "biu":
            x = x.astype(D.get_default_dtype().np)
        dt = x.dtype
        if dt in _LOWP:
            x = x.astype(np.float32)
        with np.errstate(all="ignore"):
            return _down(kernel(x), dt)
    # float32/float64 inputs: the bare ufunc (dispatch's fast path; tessera's warnings
    # filter already keeps NumPy's overflow warnings quiet, without errstate's ~1 us)
    cpu.plain = kernel  # type: ignore[attr-defined]
    return cpu


def _make_unary(name, kernel, to_c, grad, save, traits=frozenset()):
    op = defop(name, _unary_infer(name, True), _float_kernel(kernel),
               grad=lambda ctx, g: (grad(ctx, g),), save=(save,) if save else (),
               sbp=POINTWISE, cost=ONE, to_c=to_c, traits=traits,
               to_relax=_relax.rule(name), to_jax=_jax.rule(name))

    def fn(input, *, out=None):
        return call(op, input, out=out)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}`` (``tessera.{name}(tessera.tensor([0.5]))``)."
    return fn


exp = _make_unary("exp", *_UNARY["exp"])
exp2 = _make_unary("exp2", *_UNARY["exp2"])
expm1 = _make_unary("expm1", *_UNARY["expm1"])
log = _make_unary("log", *_UNARY["log"])
log2 = _make_unary("log2", *_UNARY["log2"])
log10 = _make_unary("log10", *_UNARY["log10"])
log1p = _make_unary("log1p", *_UNARY["log1p"])
sqrt = _make_unary("sqrt", *_UNARY["sqrt"])
rsqrt = _make_unary("rsqrt", *_UNARY["rsqrt"])
reciprocal = _make_unary("reciprocal", *_UNARY["reciprocal"])
sin = _make_unary("sin", *_UNARY["sin"])
cos = _make_unary("cos", *_UNARY["cos"])
tan = _make_unary("tan", *_UNARY["tan"])
asin = _make_unary("asin", *_UNARY["asin"])
acos = _make_unary("acos", *_UNARY["acos"])
atan = _make_unary("atan", *_UNARY["atan"])
sinh = _make_unary("sinh", *_UNARY["sinh"])
cosh = _make_unary("cosh", *_UNARY["cosh"])
tanh = _make_unary("tanh", *_UNARY["tanh"])
asinh = _make_unary("asinh", *_UNARY["asinh"])
acosh = _make_unary("acosh", *_UNARY["acosh"])
atanh = _make_unary("atanh", *_UNARY["atanh"])
sigmoid = _make_unary("sigmoid", *_UNARY["sigmoid"])
erf = _make_unary("erf", *_UNARY["erf"])
erfc = _make_unary("erfc", *_UNARY["erfc"])
erfinv = _make_unary("erfinv", *_UNARY["erfinv"])
lgamma = _make_unary("lgamma", *_UNARY["lgamma"])
digamma = _make_unary("digamma", *_UNARY["digamma"])


def _zero_grad(ctx, g):
    return (g * 0,)


def _same_kernel(float_fn):
    """Kernels of dtype-keeping ops: ``float_fn`` on floats (in float32 for float16 and
    bfloat16), a copy of integers (the result never aliases the input)."""
    def k(x, **attrs):
        if x.dtype.kind != "f":
            return x.copy()
        with np.errstate(all="ignore"):
            return _down(float_fn(x.astype(np.float32) if x.dtype in _LOWP else x, **attrs),
                         x.dtype)
    return k


def _dtype_keeping(name, kernel, grad=_zero_grad, save=(), bool_ok=False, int_ok=True,
                   bool_to=None, infer=None, **rules):
    """Unary ops that keep the input dtype (floor of an int is that int). ``rules``: the
    op's other rules (``to_c``, ``traits``...); every one is pointwise."""
    rules.setdefault("sbp", POINTWISE)
    op = defop(name, infer or _unary_infer(name, False, bool_ok, int_ok, bool_to), kernel,
               grad=grad, save=save, cost=ONE, **rules,
               to_relax=_relax.rule(name), to_jax=_jax.rule(name))

    def fn(input, *, out=None):
        return call(op, input, out=out)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}``, keeping the input dtype."
    return fn, op


def _neg_infer(x):
    _need_tensor("neg", x)
    if x.dtype is D.bool_:
        raise RuntimeError("neg: Negation, the `-` operator, on a bool tensor is not supported. "
                           "If you are trying to invert a mask, use the `~` or `logical_not()` "
                           "operator instead.")
    return Meta(x.shape, x.dtype)


def _positive_infer(x):
    _need_tensor("positive", x)
    if x.dtype is D.bool_:
        raise RuntimeError("The `+` operator, on a bool tensor is not supported.")
    return Meta(x.shape, x.dtype)


def _abs_c(c, a, at):
    return f"({a[0]} < 0 ? -{a[0]} : {a[0]})" if c.is_int else f"{c.fn('fabs')}({a[0]})"


def _sign_c(c, a, at):
    return f"(({c.T})(({a[0]} > 0) - ({a[0]} < 0)))"  # 0 for NaN and -0, as PyTorch


_LINEAR = pointwise(each=(0,))  # neg, positive: partial_sum passes through
neg, _NEG = _dtype_keeping(
    "neg", np.negative, grad=lambda c, g: (-g,), infer=_neg_infer, sbp=_LINEAR,
    to_c=fmt("(-{0})"), traits=_FAST | {"cheap", "c_int", "out_form"},
    inplace_kernels={"cpu": lambda t, x: np.negative(x, out=t)})
negative = neg
positive, _ = _dtype_keeping("positive", np.positive, grad=lambda c, g: (g,),
                             infer=_positive_infer, sbp=_LINEAR, to_c=fmt("{0}"),
                             traits=_FAST | {"c_int"})
sign: Callable  # defined below, read by abs's gradient when it runs
abs, _ = _dtype_keeping("abs", np.abs, grad=lambda c, g: (g * sign(c.inputs[0]),),
                        save=("inputs",), to_c=_abs_c, traits=_FAST | {"c_int"})
absolute = abs
# NumPy's names, which PyTorch also takes
arcsin, arccos, arctan, arcsinh, arccosh, arctanh = asin, acos, atan, asinh, acosh, atanh


def _sign_kernel(x):
    if x.dtype == np.bool_:
        return x.copy()
    # (0 < x) - (x < 0): NaN gives 0 as in PyTorch (np.sign gives NaN)
    return ((x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)).astype(x.dtype)


sign, _ = _dtype_keeping("sign", _sign_kernel, bool_ok=True, to_c=_sign_c, traits={"c_int"})
sgn = sign
floor, _ = _dtype_keeping("floor", _same_kernel(np.floor), to_c=libm("floor"), traits=_FAST)
ceil, _ = _dtype_keeping("ceil", _same_kernel(np.ceil), to_c=libm("ceil"), traits=_FAST)
trunc, _ = _dtype_keeping("trunc", _same_kernel(np.trunc), to_c=libm("trunc"), traits=_FAST)
fix = trunc
frac, _ = _dtype_keeping("frac", _same_kernel(lambda x: x - np.trunc(x)),
                         grad=lambda c, g: (g,), int_ok=False,
                         to_c=fmt("({0} - trunc{f}({0}))"))
square, _ = _dtype_keeping("square", lambda x: np.square(x.astype(np.int64)) if
                           x.dtype == np.bool_ else _same_kernel(np.square)(x) if
                           x.dtype.kind == "f" else np.square(x),
    grad=lambda c, g: (g * 2 * c.inputs[0],), save=("inputs",), bool_ok=True, bool_to=D.int64,
    to_c=fmt("({0} * {0})"), traits=_FAST | {"c_int"})


def _relu_kernel(x):
    return np.maximum(x, np.zeros((), x.dtype))


# (not single_pass: NumPy's relu allocates its result, a C kernel writes into the arena on
# all threads: bench training: cnn)
relu, _RELU = _dtype_keeping("relu", _relu_kernel,
                             grad=lambda c, g: (g * (c.outputs[0] > 0),), save=("outputs",),
                             to_c=fmt("({0} < 0 ? ({T})0 : {0})"))


def _round_infer(x, decimals=0):
    m = _unary_infer("round", False, bool_ok=False)(x)
    if decimals != 0 and x.dtype.category < 2:
        raise NotImplementedError(f'"round_cpu" not implemented for \'{x.dtype.name}\'')
    return m


def _round_float(x, decimals=0):
    # PyTorch: nearbyint(x * 10**d) / 10**d (x / 10**-d ... for d < 0), in the input dtype
    if decimals == 0:
        return np.rint(x)
    if decimals > 0:
        p = x.dtype.type(10.0 ** decimals)
        return np.rint(x * p) / p
    p = x.dtype.type(10.0 ** -decimals)
    return np.rint(x / p) * p


def _round_c(c, a, at):
    """As the kernel: rint (half to even in C's default rounding mode) of x times or over
    the power of ten rounded to the dtype; an integer is its own rounding."""
    d = at.get("decimals", 0)
    if c.is_int:
        return a[0]
    if d == 0:
        return f"{c.fn('rint')}({a[0]})"
    ten = np.float32 if c.dtype == "float32" else np.float64
    p = c.lit(float(ten(10.0 ** (d if d > 0 else -d))))
    return f"({c.fn('rint')}({a[0]} * {p}) / {p})" if d > 0 else \
        f"({c.fn('rint')}({a[0]} / {p}) * {p})"


_ROUND = defop("round", _round_infer, _same_kernel(_round_float), grad=_zero_grad, save=(),
               sbp=POINTWISE, cost=ONE, to_relax=_relax.round_, to_jax=_jax.round_,
               to_c=_round_c, traits={"c_int"})


def round(input, *, decimals: int = 0, out=None):
    """Round half to even, to ``decimals`` places."""
    return call(_ROUND, input, decimals=decimals, out=out)


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
               lambda x, eps=None: _float_kernel(lambda y: _logit_kernel(y, eps))(x),
               grad=_logit_grad, sbp=POINTWISE, cost=cost.elementwise(3),
               to_relax=_relax.logit, to_jax=_jax.logit)


def logit(input, eps: float | None = None, *, out=None):
    """log(p / (1 - p)), with p clamped to [eps, 1 - eps] when eps is given."""
    return call(_LOGIT, input, eps=eps, out=out)


def _nan_to_num_kernel(x, nan=0.0, posinf=None, neginf=None):
    if x.dtype.kind != "f":
        return x.copy()
    big = _float_max(D.from_numpy_dtype(x.dtype))
    posinf = big if posinf is None else posinf
    neginf = -big if neginf is None else neginf
    out = np.where(np.isnan(x), nan, x)
    out = np.where(out == np.inf, posinf, out)
    return np.where(out == -np.inf, neginf, out).astype(x.dtype)


def _nan_to_num_c(c, a, at):
    if c.dtype not in ("float32", "float64"):   # integers and bools have no NaN or inf
        return a[0]
    big = _float_max(getattr(D, c.dtype))
    posinf, neginf = at.get("posinf"), at.get("neginf")
    nan, pos = c.lit(at.get("nan", 0.0)), c.lit(big if posinf is None else posinf)
    neg = c.lit(-big if neginf is None else neginf)
    inf = f"(({c.T})INFINITY)"
    return f"({a[0]} != {a[0]} ? {nan} : ({a[0]} == {inf} ? {pos} : " \
           f"({a[0]} == -{inf} ? {neg} : {a[0]})))"


_NAN_TO_NUM = defop("nan_to_num", _unary_infer("nan_to_num", False), _nan_to_num_kernel,
                    grad=lambda c, g: (g * isfinite(c.inputs[0]),), sbp=POINTWISE, cost=ONE,
                    to_c=_nan_to_num_c, traits={"c_int"},
                    to_relax=_relax.nan_to_num, to_jax=_jax.nan_to_num)


def nan_to_num(input, nan: float = 0.0, posinf: float | None = None,
               neginf: float | None = None, *, out=None):
    """Replace NaN, +inf and -inf by finite numbers (dtype max/min by default)."""
    return call(_NAN_TO_NUM, input, nan=nan, posinf=posinf, neginf=neginf, out=out)


def _polygamma_infer(x, n):
    _unary_infer("polygamma", True)(x)
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    return Meta(x.shape, float_dtype(x.dtype))


_POLYGAMMA = defop("polygamma", _polygamma_infer,
                   lambda x, n: _float_kernel(lambda y: _special().polygamma(n, y))(x),
                   grad=lambda c, g: (g * polygamma(c.attrs["n"] + 1, c.inputs[0]),),
                   sbp=POINTWISE, cost=cost.elementwise(20))


def polygamma(n: int, input, *, out=None):
    """The ``n``-th derivative of the digamma function (``n = 0`` is digamma itself).

    >>> import tessera
    >>> tessera.polygamma(1, tessera.tensor([1.0]))  # pi ** 2 / 6
    tensor([1.6449])
    """
    return call(_POLYGAMMA, input, n=int(n), out=out)
