"""Elementwise ops, both directions: math functions, comparisons, logical and bitwise ops,
arithmetic with PyTorch's rounding, NaN/inf tests, casts, ``where`` and ``clamp``.

The one-to-one pairs are ``simple`` declarations, which give both rules; the rest export
as a few ONNX nodes (``round(decimals=2)``, floor division) or import a more general ONNX
op (variadic ``Max``, ``Mod`` with its ``fmod`` attribute).

>>> from tessera.onnx.converters.registry import EXPORT, IMPORT
>>> sorted(EXPORT["bitwise_and"]), 1 in IMPORT["BitwiseAnd"]
([13, 18], True)
"""
from __future__ import annotations

import math

import numpy as np

from tessera import _dtype as D
from tessera.onnx.converters.helpers import (
    common_dtype,
    operand,
    same_dtype,
    tessera_dtype,
    unary_composite,
)
from tessera.onnx.converters.registry import EXPORT, export_rule, import_rule, simple
from tessera.ops.arithmetic import (
    add,
    div as _div,
    fmod,
    maximum,
    minimum,
    pow as _pow,
    remainder,
)
from tessera.ops.comparison import isinf, isneginf, isposinf
from tessera.ops.creation import zeros
from tessera.ops.ternary import clamp, where

# ---- unary -----------------------------------------------------------------------------

for _name in ("abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh",
              "erf", "exp", "floor", "log", "neg", "reciprocal", "sigmoid", "sign", "sin",
              "sinh", "sqrt", "tan", "tanh"):
    simple(_name, _name.capitalize())
simple("positive", "Identity", inverse=False)
simple("clone", "Identity", inverse=False)
simple("logical_not", "Not", inputs="bool")


@import_rule("Identity")
def _identity(c, x):
    return x


_UNARY_COMPOSITE = {
    "expm1": lambda b, x, dt, a: b.op("Sub", [b.op("Exp", [x]), b.const(1, dt)]),
    "log1p": lambda b, x, dt, a: b.op("Log", [b.op("Add", [x, b.const(1, dt)])]),
    "log2": lambda b, x, dt, a: b.op("Div", [b.op("Log", [x]), b.const(math.log(2), dt)]),
    "log10": lambda b, x, dt, a: b.op("Div", [b.op("Log", [x]), b.const(math.log(10), dt)]),
    "exp2": lambda b, x, dt, a: b.op("Pow", [b.const(2, dt), x]),
    "square": lambda b, x, dt, a: b.op("Mul", [x, x]),
    "rsqrt": lambda b, x, dt, a: b.op("Reciprocal", [b.op("Sqrt", [x])]),
    "erfc": lambda b, x, dt, a: b.op("Sub", [b.const(1, dt), b.op("Erf", [x])]),
}
for _name, _fn in _UNARY_COMPOSITE.items():
    export_rule(_name)(unary_composite(_fn))


def trunc_of(b, x, dt):
    """ONNX nodes computing ``trunc(x)`` (ONNX has no Trunc)."""
    return b.op("Mul", [b.op("Sign", [x]), b.op("Floor", [b.op("Abs", [x])])])


@export_rule("trunc")
def _trunc(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    return trunc_of(b, x, dt) if dt.is_floating_point else b.op("Identity", [x])


@export_rule("frac")
def _frac(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    return b.op("Sub", [x, trunc_of(b, x, dt)])


def _round(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    d = n.attrs.get("decimals", 0)
    if not dt.is_floating_point:
        return b.op("Identity", [x])
    if not d:
        return b.op("Round", [x])
    s = b.const(10.0 ** d, dt)
    return b.op("Div", [b.op("Round", [b.op("Mul", [x, s])]), s])


simple("round", "Round", export=_round, fixed={"decimals": 0})


@export_rule("nan_to_num")
def _nan_to_num(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    if not dt.is_floating_point:
        return b.op("Identity", [x])
    fi = np.finfo(dt.np)
    if dt in (D.float16, D.bfloat16):
        ct = D.float32
        x = b.cast(x, dt, ct)
    else:
        ct = dt
    a = n.attrs
    pos = a.get("posinf")
    neg = a.get("neginf")
    x = b.op("Where", [b.op("IsNaN", [x]), b.const(a.get("nan") or 0.0, ct), x])
    x = b.op("Where", [b.op("IsInf", [x], detect_negative=0),
                       b.const(fi.max if pos is None else pos, ct), x])
    x = b.op("Where", [b.op("IsInf", [x], detect_positive=0),
                       b.const(fi.min if neg is None else neg, ct), x])
    return b.cast(x, ct, dt)


def _float_in(b, n):
    """Input 0; float16/bfloat16 as float32 (IsInf and IsNaN take no half types)."""
    dt = n.dtype(0)
    if dt in (D.float16, D.bfloat16):
        return operand(b, n, 0, D.float32), D.float32
    return operand(b, n, 0), dt


def _isnan(b, n):
    x, dt = _float_in(b, n)
    if not dt.is_floating_point:
        return b.op("Not", [b.op("Equal", [x, x])])
    return b.op("IsNaN", [x])


simple("isnan", "IsNaN", export=_isnan)


def _isinf(pos: int, neg: int):
    def rule(b, n):
        x, dt = _float_in(b, n)
        if not dt.is_floating_point:
            return b.op("Not", [b.op("Equal", [x, x])])
        return b.op("IsInf", [x], detect_positive=pos, detect_negative=neg)
    return rule


export_rule("isinf")(_isinf(1, 1))
export_rule("isposinf")(_isinf(1, 0))
export_rule("isneginf")(_isinf(0, 1))


@import_rule("IsInf")
def _import_isinf(c, x):
    pos, neg = c.attr("detect_positive", 1), c.attr("detect_negative", 1)
    if pos and neg:
        return isinf(x)
    if pos:
        return isposinf(x)
    if neg:
        return isneginf(x)
    return zeros(x.shape, dtype=D.bool_)


@export_rule("isfinite")
def _isfinite(b, n):
    x, dt = _float_in(b, n)
    if not dt.is_floating_point:
        return b.op("Equal", [x, x])
    return b.op("Not", [b.op("Or", [b.op("IsNaN", [x]), b.op("IsInf", [x])])])


@export_rule("signbit")
def _signbit(b, n):
    x, dt = _float_in(b, n)
    if not dt.is_floating_point:
        return b.op("Less", [x, b.const(0, dt)])
    zero = b.const(0, dt)
    negzero = b.op("And", [b.op("Equal", [x, zero]),
                           b.op("Less", [b.op("Reciprocal", [x]), zero])])
    return b.op("Or", [b.op("Less", [x, zero]), negzero])


@export_rule("cast")
def _cast(b, n):
    return b.cast(operand(b, n, 0), n.dtype(0), n.out_dtype())


@import_rule("Cast")
def _import_cast(c, x):
    to = tessera_dtype(c.attr("to"))
    if x.dtype.is_floating_point and to is D.bool_:
        return x != 0
    return x.to(to)


@import_rule("CastLike")
def _import_cast_like(c, x, like):
    return x.to(like.dtype)


@export_rule("bitwise_not")
def _bitwise_not(b, n):
    dt = n.out_dtype()
    if dt is not D.bool_:
        raise NotImplementedError("integer bitwise ops need opset 18")
    return b.op("Not", [operand(b, n, 0, dt)])


def _bitwise_not18(b, n):
    dt = n.out_dtype()
    return b.op("Not" if dt is D.bool_ else "BitwiseNot", [operand(b, n, 0, dt)])


simple("bitwise_not", "BitwiseNot", opset=18, export=_bitwise_not18)


# ---- binary ----------------------------------------------------------------------------

simple("mul", "Mul")
for _name, _op in {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater",
                   "ge": "GreaterOrEqual"}.items():
    simple(_name, _op, inputs="common")
for _name, _op in {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}.items():
    simple(_name, _op, inputs="bool")
# ONNX's Max and Min take any number of inputs, its Pow two types: imported by hand below
simple("maximum", "Max", inverse=False)
simple("minimum", "Min", inverse=False)
simple("pow", "Pow", inverse=False)


@export_rule("ne")
def _ne(b, n):
    return b.op("Not", [EXPORT["eq"][13](b, n)])


def _alpha_op(onnx_op: str):
    def rule(b, n):
        dt = n.out_dtype()
        x, y = operand(b, n, 0, dt), operand(b, n, 1, dt)
        alpha = n.attrs.get("alpha", 1)
        if alpha != 1:
            y = b.op("Mul", [y, b.const(alpha, dt)])
        return b.op(onnx_op, [x, y])
    return rule


simple("add", "Add", export=_alpha_op("Add"), fixed={"alpha": 1})
simple("sub", "Sub", export=_alpha_op("Sub"), fixed={"alpha": 1})


def _bitwise(logical: str, onnx_op: str | None):
    def rule(b, n):
        dt = n.out_dtype()
        if dt is D.bool_:
            return b.op(logical, [operand(b, n, 0, dt), operand(b, n, 1, dt)])
        if onnx_op is None:
            raise NotImplementedError("integer bitwise ops need opset 18")
        return b.op(onnx_op, [operand(b, n, 0, dt), operand(b, n, 1, dt)])
    return rule


for _name, (_logical, _op) in {"bitwise_and": ("And", "BitwiseAnd"),
                               "bitwise_or": ("Or", "BitwiseOr"),
                               "bitwise_xor": ("Xor", "BitwiseXor")}.items():
    export_rule(_name)(_bitwise(_logical, None))
    simple(_name, _op, opset=18, export=_bitwise(_logical, _op))


def _variadic(fn):
    def rule(c, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out
    return rule


import_rule("Max")(_variadic(maximum))
import_rule("Min")(_variadic(minimum))
import_rule("Sum")(_variadic(add))


@import_rule("Mean")
def _import_mean(c, *xs):
    return _variadic(add)(c, *xs) / len(xs)


@import_rule("Pow")
def _import_pow(c, a, b):
    if a.dtype.is_floating_point:
        return _pow(a, b.to(a.dtype))
    return _pow(a.double(), b.double()).to(a.dtype)


def _floor_divmod(b, x, y, dt):
    """(floor(x / y), x mod y) as NumPy and PyTorch compute them: from fmod, so a quotient
    that is exactly an integer is not lost to the rounding of x / y."""
    zero = b.const(0, dt)
    mod = b.op("Mod", [x, y], fmod=1)
    div = b.op("Div", [b.op("Sub", [x, mod]), y])
    fix = b.op("And", [b.op("Not", [b.op("Equal", [mod, zero])]),
                       b.op("Xor", [b.op("Less", [y, zero]), b.op("Less", [mod, zero])])])
    div = b.op("Sub", [div, b.cast(fix, D.bool_, dt)])
    mod = b.op("Where", [fix, b.op("Add", [mod, y]), mod])
    fl = b.op("Floor", [div])
    up = b.op("Greater", [b.op("Sub", [div, fl]), b.const(0.5, dt)])
    fl = b.op("Add", [fl, b.cast(up, D.bool_, dt)])
    # division by zero: x / y as is (inf or nan), like the kernels
    q = b.op("Div", [x, y])
    fl = b.op("Where", [b.op("Equal", [y, zero]), q, fl])
    return fl, mod


@export_rule("div")
def _export_div(b, n):
    dt = n.out_dtype()
    mode = n.attrs.get("rounding_mode")
    if dt.is_floating_point:
        x, y = operand(b, n, 0, dt), operand(b, n, 1, dt)
        if mode == "floor":
            return _floor_divmod(b, x, y, dt)[0]
        q = b.op("Div", [x, y])
        return trunc_of(b, q, dt) if mode == "trunc" else q
    if mode == "trunc":
        return b.op("Div", [operand(b, n, 0, dt), operand(b, n, 1, dt)])
    q = _floor_divmod(b, operand(b, n, 0, D.float64), operand(b, n, 1, D.float64),
                      D.float64)[0]
    return b.cast(q, D.float64, dt)


@import_rule("Div")
def _import_div(c, a, b):
    a, b = same_dtype(a, b)
    if a.dtype.is_floating_point:
        return a / b
    return _div(a, b, rounding_mode="trunc")


@export_rule("remainder")
def _remainder(b, n):
    dt = n.out_dtype()
    x, y = operand(b, n, 0, dt), operand(b, n, 1, dt)
    if not dt.is_floating_point:
        return b.op("Mod", [x, y], fmod=0)
    return _floor_divmod(b, x, y, dt)[1]


@export_rule("fmod")
def _fmod(b, n):
    dt = n.out_dtype()
    return b.op("Mod", [operand(b, n, 0, dt), operand(b, n, 1, dt)], fmod=1)  # C's, ints too


@import_rule("Mod")
def _import_mod(c, a, b):
    a, b = same_dtype(a, b)
    if c.attr("fmod", 0):
        return fmod(a, b)
    return remainder(a, b)


def _nan_ignoring(onnx_op: str):
    def rule(b, n):
        dt = n.out_dtype()
        x, y = operand(b, n, 0, dt), operand(b, n, 1, dt)
        m = b.op(onnx_op, [x, y])
        if not dt.is_floating_point:
            return m
        m = b.op("Where", [b.op("IsNaN", [y]), x, m])
        return b.op("Where", [b.op("IsNaN", [x]), y, m])
    return rule


export_rule("fmax")(_nan_ignoring("Max"))
export_rule("fmin")(_nan_ignoring("Min"))


@export_rule("hypot")
def _hypot(b, n):
    dt = n.out_dtype()
    x, y = operand(b, n, 0, dt), operand(b, n, 1, dt)
    return b.op("Sqrt", [b.op("Add", [b.op("Mul", [x, x]), b.op("Mul", [y, y])])])


@export_rule("logaddexp")
@export_rule("logaddexp2")
def _logaddexp(b, n):
    """max(a, b) + log1p(exp(-|a - b|)) (in base 2 for logaddexp2; ONNX has no such op);
    equal operands, infinities included, give a + log(2)."""
    dt = n.out_dtype()
    two = n.name == "logaddexp2"
    x, y = operand(b, n, 0, dt), operand(b, n, 1, dt)
    d = b.op("Neg", [b.op("Abs", [b.op("Sub", [x, y])])])
    e = b.op("Pow", [b.const(2.0, dt), d]) if two else b.op("Exp", [d])
    tail = b.op("Log", [b.op("Add", [b.const(1.0, dt), e])])
    if two:
        tail = b.op("Mul", [tail, b.const(1 / math.log(2), dt)])
    out = b.op("Add", [b.op("Max", [x, y]), tail])
    same = b.op("Add", [x, b.const(1.0 if two else math.log(2), dt)])
    return b.op("Where", [b.op("Equal", [x, y]), same, out])


@export_rule("atan2")
def _atan2(b, n):
    dt = n.out_dtype()
    y, x = operand(b, n, 0, dt), operand(b, n, 1, dt)
    zero = b.const(0, dt)
    base = b.op("Atan", [b.op("Div", [y, x])])
    # x < 0: add pi with the sign of y (atan2(+-0, -x) = +-pi); x == 0: +-pi/2 or 0
    sign_y = b.op("Where", [b.op("Or", [b.op("Less", [y, zero]), b.op("And", [
        b.op("Equal", [y, zero]), b.op("Less", [b.op("Reciprocal", [y]), zero])])]),
        b.const(-1, dt), b.const(1, dt)])
    left = b.op("Add", [base, b.op("Mul", [sign_y, b.const(math.pi, dt)])])
    out = b.op("Where", [b.op("Less", [x, zero]), left, base])
    return out


# ---- ternary and more ------------------------------------------------------------------

@export_rule("lerp")
def _lerp(b, n):
    dt = n.out_dtype()
    a, e, w = operand(b, n, 0, dt), operand(b, n, 1, dt), operand(b, n, 2, dt)
    return b.op("Add", [a, b.op("Mul", [w, b.op("Sub", [e, a])])])


def _addc(onnx_op: str):
    def rule(b, n):
        dt = n.out_dtype()
        x, t1, t2 = operand(b, n, 0, dt), operand(b, n, 1, dt), operand(b, n, 2, dt)
        v = b.op(onnx_op, [t1, t2])
        if n.attrs.get("value", 1) != 1:
            v = b.op("Mul", [v, b.const(n.attrs["value"], dt)])
        return b.op("Add", [x, v])
    return rule


export_rule("addcmul")(_addc("Mul"))
export_rule("addcdiv")(_addc("Div"))


@export_rule("where")
def _where(b, n):
    dt = n.out_dtype()
    return b.op("Where", [operand(b, n, 0, D.bool_), operand(b, n, 1, dt),
                          operand(b, n, 2, dt)])


@import_rule("Where")
def _import_where(c, cond, a, b):
    return where(cond, a, b)


@export_rule("masked_fill")
def _masked_fill(b, n):
    dt = n.out_dtype()
    return b.op("Where", [operand(b, n, 1, D.bool_), operand(b, n, 2, dt),
                          operand(b, n, 0, dt)])


@export_rule("clamp")
def _clamp(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    lo, hi = n.ins[1], n.ins[2]
    if not n.is_tensor(1) and not n.is_tensor(2):
        return b.op("Clip", [x, None if lo is None else b.const(lo, dt),
                             None if hi is None else b.const(hi, dt)])
    if lo is not None:
        x = b.op("Max", [x, operand(b, n, 1, dt)])
    if hi is not None:
        x = b.op("Min", [x, operand(b, n, 2, dt)])
    return x


@import_rule("Clip", since=11)
def _import_clip(c, x, lo=None, hi=None):
    from tessera.graph.trace import is_symbolic
    if lo is None and hi is None:
        return x
    if not any(t is not None and (is_symbolic(t) or t.requires_grad) for t in (lo, hi)):
        return clamp(x, None if lo is None else c.value(lo).item(),
                             None if hi is None else c.value(hi).item())
    if lo is not None:
        x = maximum(x, lo)
    if hi is not None:
        x = minimum(x, hi)
    return x


@import_rule("Clip")
def _import_clip6(c, x):
    return clamp(x, c.attr("min", -3.4028234663852886e38),
                         c.attr("max", 3.4028234663852886e38))


@export_rule("isclose")
def _isclose(b, n):
    dt = common_dtype(n, (0, 1))
    x, y = operand(b, n, 0, dt), operand(b, n, 1, dt)
    a = n.attrs
    diff = b.op("Abs", [b.op("Sub", [x, y])])
    tol = b.op("Add", [b.const(a["atol"], dt), b.op("Mul", [b.const(a["rtol"], dt),
                                                            b.op("Abs", [y])])])
    out = b.op("Or", [b.op("Equal", [x, y]), b.op("LessOrEqual", [diff, tol])])
    if a.get("equal_nan") and dt.is_floating_point:
        out = b.op("Or", [out, b.op("And", [b.op("IsNaN", [x]), b.op("IsNaN", [y])])])
    return out


@export_rule("copy", "fill")
def _copy(b, n):
    return b.op("Expand", [operand(b, n, 1, n.out_dtype()), b.ints(n.out_shape())])

