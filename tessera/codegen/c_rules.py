"""C rules: how each elementwise op computes one element, as a C expression.

A rule is ``rule(c, args, attrs) -> str``: ``args`` are C expressions already converted to
the compute type, ``c`` says which type that is (``c.T`` is ``float`` or ``double``, ``c.f``
the libm suffix, ``c.lit(v)`` a literal of the compute type). The table is the op's
``to_c`` rule; attaching it here keeps every lowering of the code generator in one place,
as ONNX converters are kept in theirs. An op is fusible exactly when it has a ``to_c`` rule.

Each rule follows what the op's NumPy kernel computes (the reference the generated code is
tested against), including NaN propagation: a comparison with NaN is false, so selects are
written to fall through to the NaN operand.

>>> from tessera.kernels.c_expr import CType
>>> RULES["mul"](CType("float32"), ["x", "y"], {})
'(x * y)'
"""
from __future__ import annotations

from tessera.kernels.c_expr import (
    COMPARE,
    INT_OPS,
    LOGICAL,
    CType,
    alpha,
    compute_dtype,
    fmt,
    libm,
    tsr,
)
from tessera.ops.registry import REGISTRY

__all__ = ["RULES", "CType", "COMPARE", "LOGICAL", "INT_OPS", "compute_dtype", "attach"]


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
    "neg": fmt("(-{0})"), "positive": fmt("{0}"),
    "add": alpha("+"), "sub": alpha("-"), "mul": fmt("({0} * {1})"), "div": _div,
    "remainder": _remainder,
    "fmod": libm("fmod"), "pow": _pow, "reciprocal": fmt("(({T})1 / {0})"),
    "square": fmt("({0} * {0})"), "abs": _abs, "sign": _sign,
    "lerp": _lerp, "addcmul": lambda c, a, at: (
        f"({a[0]} + {c.lit(at.get('value', 1))} * {a[1]} * {a[2]})"),
    "addcdiv": lambda c, a, at: f"({a[0]} + {c.lit(at.get('value', 1))} * ({a[1]} / {a[2]}))",
    "maximum": _max, "minimum": _min, "fmax": libm("fmax"), "fmin": libm("fmin"),
    "clamp": _clamp, "where": fmt("({0} ? {1} : {2})"),
    "masked_fill": fmt("({1} ? {2} : {0})"), "cast": _cast,
    # exponentials, logs, roots
    "exp": tsr("exp"), "exp2": libm("exp2"),
    "expm1": tsr("expm1"), "log": tsr("log"), "log2": libm("log2"),
    "log10": libm("log10"), "log1p": tsr("log1p"), "sqrt": libm("sqrt"),
    "rsqrt": fmt("(({T})1 / sqrt{f}({0}))"),
    # trigonometry and friends
    "sin": libm("sin"), "cos": libm("cos"), "tan": libm("tan"), "asin": libm("asin"),
    "acos": libm("acos"), "atan": libm("atan"), "sinh": libm("sinh"),
    "cosh": libm("cosh"), "asinh": libm("asinh"), "acosh": libm("acosh"),
    "atanh": libm("atanh"), "atan2": libm("atan2"), "hypot": libm("hypot"),
    "erf": tsr("erf"), "erfc": tsr("erfc"),
    "floor": libm("floor"), "ceil": libm("ceil"), "trunc": libm("trunc"),
    "frac": fmt("({0} - trunc{f}({0}))"),
    # activations
    "relu": fmt("({0} < 0 ? ({T})0 : {0})"),
    "sigmoid": tsr("sigmoid"), "tanh": tsr("tanh"),
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
    "eq": fmt("({0} == {1})"), "ne": fmt("({0} != {1})"), "lt": fmt("({0} < {1})"),
    "le": fmt("({0} <= {1})"), "gt": fmt("({0} > {1})"), "ge": fmt("({0} >= {1})"),
    "logical_not": fmt("(!{0})"), "logical_and": _logic("&&"), "logical_or": _logic("||"),
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
