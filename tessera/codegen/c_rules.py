"""C rules: how each elementwise op computes one element, as a C expression.

A rule is ``rule(c, args, attrs) -> str``: ``args`` are C expressions already converted to
the compute type, ``c`` says which type that is (``c.T`` is ``float`` or ``double``, ``c.f``
the libm suffix, ``c.lit(v)`` a literal of the compute type). The table is the op's
``to_c`` rule; attaching it here keeps every lowering of the code generator in one place,
as ONNX converters are kept in theirs. An op is fusible exactly when it has a ``to_c`` rule.

Each rule follows what the op's NumPy kernel computes (the reference the generated code is
tested against), including NaN propagation: a comparison with NaN is false, so selects are
written to fall through to the NaN operand.

>>> from tessera.codegen.c_rules import CType
>>> RULES["mul"](CType("float32"), ["x", "y"], {})
'(x * y)'
"""
from __future__ import annotations

import math

from tessera.ops.registry import REGISTRY

__all__ = ["RULES", "CType", "COMPARE", "LOGICAL", "INT_OPS", "compute_dtype", "attach"]


class CType:
    """The C side of a dtype name: type, libm suffix, literals."""

    NAMES = {"float32": "float", "float64": "double", "bool": "unsigned char",
             "int32": "int32_t", "int64": "int64_t"}

    def __init__(self, dtype: str):
        self.dtype = dtype
        self.T = self.NAMES[dtype]
        self.f = "f" if dtype == "float32" else ""
        self.is_int = dtype in ("int32", "int64")

    def lit(self, v) -> str:
        """``v`` (a Python number) as a C constant of this type."""
        if isinstance(v, bool) or self.dtype == "bool":
            return "1" if v else "0"
        if self.is_int:
            return f"(({self.T}){int(v)}LL)"
        v = float(v)
        if math.isnan(v):
            return f"(({self.T})NAN)"
        if math.isinf(v):
            return f"(({self.T})INFINITY)" if v > 0 else f"(-({self.T})INFINITY)"
        if self.dtype == "float32":
            return f"{v!r}f" if v == float(_f32(v)) else f"((float){v!r})"
        return repr(v)

    def fn(self, name: str) -> str:
        """libm's ``name`` for this type (``expf`` or ``exp``)."""
        return name + self.f

    def tsr(self, name: str) -> str:
        """The prelude's helper ``tsr_<name>`` for this type."""
        return f"tsr_{name}{self.f}"


def _f32(v: float):
    import numpy as np
    return np.float32(v)


COMPARE = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
LOGICAL = frozenset({"logical_and", "logical_or", "logical_xor", "logical_not"})
# ops whose rules are right for int32/int64 too (C's signed overflow wraps: -fwrapv); not
# division or remainder, where a zero divisor must raise
INT_OPS = frozenset({"neg", "positive", "add", "sub", "mul", "abs", "square", "sign",
                     "maximum", "minimum", "clamp", "where", "masked_fill", "cast",
                     "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not"}
                    | COMPARE | LOGICAL)


def compute_dtype(op: str, in_dtypes: list[str], out_dtype: str,
                  float_scalar: bool = False) -> str:
    """The dtype an op computes in: comparisons in their promoted input type, logic on bools,
    everything else in its output type."""
    if op in COMPARE:
        if float_scalar and not any(d.startswith("float") for d in in_dtypes):
            return "float32"   # an int tensor against 1.5 compares as floats
        for d in ("float64", "float32", "int64", "int32"):
            if d in in_dtypes:
                return d
        return "bool"
    if op in LOGICAL:
        return "bool"
    return out_dtype


def _fmt(template: str):
    def rule(c, a, at):
        return template.format(*a, f=c.f, T=c.T)
    return rule


def _math(name: str):
    return lambda c, a, at: f"{c.fn(name)}({', '.join(a)})"


def _tsr(name: str):
    """The prelude's vectorisable ``tsr_<name>`` (libm's would keep the loop scalar)."""
    return lambda c, a, at: f"{c.tsr(name)}({', '.join(a)})"


def _alpha(sign: str):
    def rule(c, a, at):
        alpha = at.get("alpha", 1)
        rhs = a[1] if alpha == 1 else f"({c.lit(alpha)} * {a[1]})"
        return f"({a[0]} {sign} {rhs})"
    return rule


def _div(c, a, at):
    mode = at.get("rounding_mode")
    if mode is None:
        return f"({a[0]} / {a[1]})"
    if mode == "trunc":
        return f"{c.fn('trunc')}({a[0]} / {a[1]})"
    return f"{c.tsr('floordiv')}({a[0]}, {a[1]})"


def _pow(c, a, at):
    return f"{c.fn('pow')}({a[0]}, {a[1]})"


def _clamp(c, a, at):
    x = a[0]
    if a[1] is not None:  # a NaN bound makes the result NaN
        x = f"(({x} < {a[1]} || {a[1]} != {a[1]}) ? {a[1]} : {x})"
    if a[2] is not None:
        x = f"(({x} > {a[2]} || {a[2]} != {a[2]}) ? {a[2]} : {x})"
    return x


def _hardtanh(c, a, at):
    lo, hi = c.lit(at.get("min_val", -1.0)), c.lit(at.get("max_val", 1.0))
    return f"({a[0]} < {lo} ? {lo} : ({a[0]} > {hi} ? {hi} : {a[0]}))"


def _relu6(c, x):
    return f"({x} < 0 ? ({c.T})0 : ({x} > 6 ? ({c.T})6 : {x}))"


def _gelu(c, a, at):
    x = a[0]
    if at.get("approximate", "none") == "tanh":
        inner = f"{c.lit(0.7978845608028654)} * ({x} + {c.lit(0.044715)} * {x} * {x} * {x})"
        return f"(({c.T})0.5 * {x} * (({c.T})1 + {c.tsr('tanh')}({inner})))"
    return f"({x} * {c.tsr('phi')}({x}))"


def _gelu_backward(c, a, at):
    g, x = a
    if at.get("approximate", "none") == "tanh":
        k, s = c.lit(0.044715), c.lit(0.7978845608028654)
        return (f"({{ {c.T} x2 = {x} * {x}; {c.T} t = {c.tsr('tanh')}({s} * ({x} + {k} * x2 * "
                f"{x})); {g} * (({c.T})0.5 * (1 + t) + ({c.T})0.5 * {x} * (1 - t * t) * ({s} * "
                f"(1 + 3 * {k} * x2))); }})")
    # Phi(x) + x phi(x); float32 shares one exponential between the two terms
    return f"({g} * {c.tsr('gelu_grad')}({x}))"


def _silu_backward(c, a, at):
    g, x = a
    return (f"({{ {c.T} s = {c.tsr('sigmoid')}({x}); {g} * (s * (1 + {x} * (1 - s))); }})")


def _leaky_relu(c, a, at):
    return f"({a[0]} > 0 ? {a[0]} : {a[0]} * {c.lit(at.get('negative_slope', 0.01))})"


def _elu(c, a, at):
    x = a[0]
    alpha, scale = at.get("alpha", 1.0), at.get("scale", 1.0)
    inner = at.get("input_scale", 1.0)
    return (f"({x} <= 0 ? {c.tsr('expm1')}({x} * {c.lit(inner)}) * {c.lit(alpha * scale)} : "
            f"{x} * {c.lit(scale)})")


def _softplus_of(c, z):
    """log(1 + exp(z)) without overflow: max(z, 0) + log1p(exp(-|z|))."""
    return (f"(({z} > 0 ? {z} : ({c.T})0) + {c.tsr('log1p')}({c.tsr('exp')}(-{c.fn('fabs')}"
            f"({z}))))")


def _softplus(c, a, at):
    beta, th = at.get("beta", 1.0), at.get("threshold", 20.0)
    z = f"({a[0]} * {c.lit(beta)})"
    return (f"({z} > {c.lit(th)} ? {a[0]} : {c.tsr('log1p')}({c.tsr('exp')}({z})) / "
            f"{c.lit(beta)})")


def _threshold(c, a, at):
    return f"({a[0]} <= {c.lit(at.get('threshold', 0.0))} ? {c.lit(at.get('value', 0.0))} " \
           f": {a[0]})"


def _lerp(c, a, at):
    s, e, w = a
    return f"({w} < ({c.T})0.5 ? {s} + {w} * ({e} - {s}) : {e} - ({e} - {s}) * (1 - {w}))"


def _max(c, a, at):
    return f"(({a[0]} > {a[1]} || {a[0]} != {a[0]}) ? {a[0]} : {a[1]})"


def _min(c, a, at):
    return f"(({a[0]} < {a[1]} || {a[0]} != {a[0]}) ? {a[0]} : {a[1]})"


def _cast(c, a, at):
    if c.dtype == "bool":
        return f"({a[0]} != 0)"
    return f"(({c.T}){a[0]})"


def _sign(c, a, at):
    return f"(({c.T})(({a[0]} > 0) - ({a[0]} < 0)))"  # 0 for NaN and -0, as PyTorch


def _logic(op: str):
    return lambda c, a, at: f"(({a[0]} != 0) {op} ({a[1]} != 0))"


def _bitwise(op: str, logical: str):
    """Bitwise on integers, logical on bools (whose 0/1 bytes must stay 0/1)."""
    def rule(c, a, at):
        if c.is_int:
            return f"({a[0]} {op} {a[1]})"
        return f"(({a[0]} != 0) {logical} ({a[1]} != 0))"
    return rule


def _abs(c, a, at):
    return f"({a[0]} < 0 ? -{a[0]} : {a[0]})" if c.is_int else f"{c.fn('fabs')}({a[0]})"


def _remainder(c, a, at):  # floats only: an integer zero divisor raises, as in PyTorch
    return f"{c.tsr('rem')}({a[0]}, {a[1]})"


RULES = {
    # arithmetic
    "neg": _fmt("(-{0})"), "positive": _fmt("{0}"),
    "add": _alpha("+"), "sub": _alpha("-"), "mul": _fmt("({0} * {1})"), "div": _div,
    "remainder": _remainder,
    "fmod": _math("fmod"), "pow": _pow, "reciprocal": _fmt("(({T})1 / {0})"),
    "square": _fmt("({0} * {0})"), "abs": _abs, "sign": _sign,
    "lerp": _lerp, "addcmul": lambda c, a, at: (
        f"({a[0]} + {c.lit(at.get('value', 1))} * {a[1]} * {a[2]})"),
    "addcdiv": lambda c, a, at: f"({a[0]} + {c.lit(at.get('value', 1))} * ({a[1]} / {a[2]}))",
    "maximum": _max, "minimum": _min, "fmax": _math("fmax"), "fmin": _math("fmin"),
    "clamp": _clamp, "where": _fmt("({0} ? {1} : {2})"),
    "masked_fill": _fmt("({1} ? {2} : {0})"), "cast": _cast,
    # exponentials, logs, roots
    "exp": _tsr("exp"), "exp2": _math("exp2"),
    "expm1": _tsr("expm1"), "log": _tsr("log"), "log2": _math("log2"),
    "log10": _math("log10"), "log1p": _tsr("log1p"), "sqrt": _math("sqrt"),
    "rsqrt": _fmt("(({T})1 / sqrt{f}({0}))"),
    # trigonometry and friends
    "sin": _math("sin"), "cos": _math("cos"), "tan": _math("tan"), "asin": _math("asin"),
    "acos": _math("acos"), "atan": _math("atan"), "sinh": _math("sinh"),
    "cosh": _math("cosh"), "asinh": _math("asinh"), "acosh": _math("acosh"),
    "atanh": _math("atanh"), "atan2": _math("atan2"), "hypot": _math("hypot"),
    "erf": _tsr("erf"), "erfc": _tsr("erfc"),
    "floor": _math("floor"), "ceil": _math("ceil"), "trunc": _math("trunc"),
    "frac": _fmt("({0} - trunc{f}({0}))"),
    # activations
    "relu": _fmt("({0} < 0 ? ({T})0 : {0})"),
    "sigmoid": _tsr("sigmoid"), "tanh": _tsr("tanh"),
    "gelu": _gelu, "gelu_backward": _gelu_backward,
    "silu": lambda c, a, at: f"({a[0]} * {c.tsr('sigmoid')}({a[0]}))",
    "silu_backward": _silu_backward,
    "leaky_relu": _leaky_relu, "elu": _elu, "softplus": _softplus, "threshold": _threshold,
    "hardtanh": _hardtanh,
    "hardsigmoid": lambda c, a, at: f"({_relu6(c, f'({a[0]} + 3)')} / 6)",
    "hardswish": lambda c, a, at: f"({a[0]} * {_relu6(c, f'({a[0]} + 3)')} / 6)",
    "mish": lambda c, a, at: f"({a[0]} * {c.tsr('tanh')}({_softplus_of(c, a[0])}))",
    "log_sigmoid": lambda c, a, at: (
        f"(({a[0]} < 0 ? {a[0]} : ({c.T})0) - {c.tsr('log1p')}({c.tsr('exp')}(-{c.fn('fabs')}"
        f"({a[0]}))))"),
    # comparisons and logic (their compute type is the inputs'; the result is 0 or 1)
    "eq": _fmt("({0} == {1})"), "ne": _fmt("({0} != {1})"), "lt": _fmt("({0} < {1})"),
    "le": _fmt("({0} <= {1})"), "gt": _fmt("({0} > {1})"), "ge": _fmt("({0} >= {1})"),
    "logical_not": _fmt("(!{0})"), "logical_and": _logic("&&"), "logical_or": _logic("||"),
    "logical_xor": _logic("!="), "bitwise_and": _bitwise("&", "&&"),
    "bitwise_or": _bitwise("|", "||"), "bitwise_xor": _bitwise("^", "!="),
    "bitwise_not": lambda c, a, at: f"(~{a[0]})" if c.is_int else f"(!{a[0]})",
}


def attach() -> None:
    """Fill each registered op's ``to_c`` slot from ``RULES``."""
    for name, rule in RULES.items():
        op = REGISTRY.get(name)
        if op is not None:
            op.to_c = rule


attach()
