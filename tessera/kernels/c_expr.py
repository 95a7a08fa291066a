"""The vocabulary of ``to_c`` rules: how an op computes one element, as a C expression.

A rule is ``rule(c, args, attrs) -> str``: ``args`` are C expressions already converted to
the compute type, ``c`` says which type that is (``c.T`` is ``float`` or ``double``, ``c.f``
the libm suffix, ``c.lit(v)`` a literal of the compute type). The eager elementwise kernels
(``tessera.kernels.elementwise``) and the graph's code generator render the same rules; each
op declares its own in its ``defop``, built from the helpers here.

>>> alpha("+")(CType("float32"), ["x", "y"], {"alpha": 2})
'(x + (2.0f * y))'
"""
from __future__ import annotations

import math

__all__ = ["CType", "fmt", "libm", "tsr", "alpha", "compute_dtype", "is_compare", "is_logical",
           "exact_on_ints"]


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


def fmt(template: str):
    """A rule from a template: ``{0}``, ``{1}``... the operands, ``{T}`` the C type, ``{f}``
    the libm suffix.

    >>> fmt("({0} * {1})")(CType("float32"), ["x", "y"], {})
    '(x * y)'
    """
    def rule(c, a, at):
        return template.format(*a, f=c.f, T=c.T)
    return rule


def libm(name: str):
    """libm's function ``name`` of the operands (``sinf(x)`` in float32)."""
    return lambda c, a, at: f"{c.fn(name)}({', '.join(a)})"


def tsr(name: str):
    """The prelude's vectorisable ``tsr_<name>`` (libm's would keep the loop scalar)."""
    return lambda c, a, at: f"{c.tsr(name)}({', '.join(a)})"


def alpha(sign: str):
    """``a + alpha * b`` (``add``/``sub`` with their ``alpha`` attribute)."""
    def rule(c, a, at):
        alpha = at.get("alpha", 1)
        rhs = a[1] if alpha == 1 else f"({c.lit(alpha)} * {a[1]})"
        return f"({a[0]} {sign} {rhs})"
    return rule


def is_compare(op) -> bool:
    """Whether ``op`` (an OpDef) is a comparison (trait ``compare``)."""
    return "compare" in op.traits


def is_logical(op) -> bool:
    """Whether ``op`` (an OpDef) is a logical op (trait ``logical``)."""
    return "logical" in op.traits


def exact_on_ints(op) -> bool:
    """Whether ``op``'s C rule is right for int32/int64 too (trait ``c_int``: C's signed
    overflow wraps, -fwrapv; never division or remainder, where a zero divisor must raise)."""
    return "c_int" in op.traits


def compute_dtype(op, in_dtypes: list[str], out_dtype: str,
                  float_scalar: bool = False) -> str:
    """The dtype ``op`` (an OpDef) computes in: comparisons in their promoted input type,
    logic on bools, everything else in its output type."""
    if is_compare(op):
        if float_scalar and not any(d.startswith("float") for d in in_dtypes):
            return "float32"   # an int tensor against 1.5 compares as floats
        for d in ("float64", "float32", "int64", "int32"):
            if d in in_dtypes:
                return d
        return "bool"
    if is_logical(op):
        return "bool"
    return out_dtype
