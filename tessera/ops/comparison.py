"""Elementwise ops with bool results or bitwise meaning, none differentiable: comparisons
(eq, lt...), logic (logical_and...), bitwise ops and shifts, tests of values (isnan,
isfinite, signbit...) and isclose; allclose and equal reduce them to one bool.

>>> import tessera
>>> tessera.lt(tessera.tensor([1, 5]), 3), tessera.isnan(tessera.tensor([float("nan")]))
(tensor([ True, False]), tensor([True]))
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera.kernels.c_expr import fmt
from tessera.ops import _jax, _relax, cost
from tessera.ops._elementwise import (
    _LOWP,
    ONE,
    POINTWISE,
    _binary_infer,
    _first_dtype,
    _kernel,
    _need_tensor,
)
from tessera.ops._util import broadcast_shapes, call
from tessera.ops.registry import Meta, defop

__all__ = ["isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit", "eq", "ne", "lt", "le",
           "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not", "not_equal",
           "less", "less_equal", "greater", "greater_equal", "bitwise_and", "bitwise_or",
           "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "bitwise_not", "isclose",
           "allclose", "equal"]



# traits (``tessera.ops.registry.TRAITS``): NumPy's ufunc is one pass at memory speed, and
# the C rule is exact on integers too
_SINGLE_INT = frozenset({"single_pass", "c_int"})


# ---- tests of values --------------------------------------------------------------------

def _bool_unary(name, kernel, **rules):
    op = defop(name, lambda x: Meta(_need_tensor(name, x).shape, D.bool_), kernel, grad=None,
               sbp=POINTWISE, cost=ONE, **rules, to_relax=_relax.rule(name), to_jax=_jax.rule(name))

    def fn(input, *, out=None):
        return call(op, input, out=out)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}``; a bool tensor."
    return fn


def _float_only(fn, default):
    return lambda x: fn(x) if x.dtype.kind == "f" else np.full(x.shape, default)


def _test_c(expr: str, on_ints: str):
    """The C rule of a test of a value (``{0}``), computed in the input's own type (the
    trait ``compare``); integers and bools are never NaN or infinite."""
    return lambda c, a, at: on_ints if c.is_int or c.T == "unsigned char" \
        else "(" + expr.format(a[0]) + ")"


def _value_test(name, kernel, expr, on_ints):
    return _bool_unary(name, kernel, to_c=_test_c(expr, on_ints), traits={"compare"})


isnan = _value_test("isnan", np.isnan, "{0} != {0}", "0")
isinf = _value_test("isinf", _float_only(np.isinf, False), "{0} == INFINITY || {0} == -INFINITY",
                    "0")
isfinite = _value_test("isfinite", _float_only(np.isfinite, True), "{0} - {0} == 0", "1")
isposinf = _value_test("isposinf", _float_only(np.isposinf, False), "{0} == INFINITY", "0")
isneginf = _value_test("isneginf", _float_only(np.isneginf, False), "{0} == -INFINITY", "0")
signbit = _bool_unary("signbit", lambda x: np.signbit(x) if x.dtype.kind != "b" else
                      np.zeros(x.shape, bool))


# ---- comparisons and logic ----------------------------------------------------------------

def _compare(name, kernel, to_c, traits, **kw):
    op = defop(name, _binary_infer(name, out_dtype=lambda d: D.bool_, **kw), _kernel(kernel),
               grad=None, promote=True, sbp=POINTWISE, cost=ONE, to_c=to_c, traits=traits,
               to_relax=_relax.rule(name), to_jax=_jax.rule(name))

    def fn(input, other, *, out=None):
        return call(op, input, other, out=out)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}``; a bool tensor."
    return fn


def _logic_c(op: str):
    return lambda c, a, at: f"(({a[0]} != 0) {op} ({a[1]} != 0))"


# comparisons: C computes them in the operands' promoted type; NumPy's ufunc is at memory
# speed on operands of one dtype
_COMPARE = _SINGLE_INT | {"compare", "numpy_fast"}
_LOGICAL = _SINGLE_INT | {"logical"}
eq = _compare("eq", np.equal, fmt("({0} == {1})"), _COMPARE, scalar_first=False)
ne = _compare("ne", np.not_equal, fmt("({0} != {1})"), _COMPARE, scalar_first=False)
lt = _compare("lt", np.less, fmt("({0} < {1})"), _COMPARE, scalar_first=False)
le = _compare("le", np.less_equal, fmt("({0} <= {1})"), _COMPARE, scalar_first=False)
gt = _compare("gt", np.greater, fmt("({0} > {1})"), _COMPARE, scalar_first=False)
ge = _compare("ge", np.greater_equal, fmt("({0} >= {1})"), _COMPARE, scalar_first=False)
logical_and = _compare("logical_and", np.logical_and, _logic_c("&&"), _LOGICAL, tensors=True)
logical_or = _compare("logical_or", np.logical_or, _logic_c("||"), _LOGICAL, tensors=True)
logical_xor = _compare("logical_xor", np.logical_xor, _logic_c("!="), _LOGICAL, tensors=True)
logical_not = _bool_unary("logical_not", np.logical_not, to_c=fmt("(!{0})"), traits=_LOGICAL)
not_equal, less, less_equal, greater, greater_equal = ne, lt, le, gt, ge


# ---- bitwise --------------------------------------------------------------------------------

def _shift(left: bool):
    """PyTorch's shifts: a shift by a negative amount or by the bit width or more gives 0
    (left) or the sign fill (right), never C's undefined behaviour."""
    def kernel(a, b):
        dt = _first_dtype(a, b)
        bits = dt.itemsize * 8
        bb = np.asarray(b)
        ok = (bb >= 0) & (bb < bits)
        safe = np.where(ok, bb, np.zeros((), bb.dtype)).astype(bb.dtype)
        if left:
            return np.where(ok, np.left_shift(a, safe), np.zeros((), dt))
        fill = np.right_shift(a, bits - 1) if dt.kind == "i" else np.zeros((), dt)
        return np.where(ok, np.right_shift(a, safe), fill)
    return kernel


def _bitwise_c(op: str, logical: str):
    """Bitwise on integers, logical on bools (whose 0/1 bytes must stay 0/1)."""
    def rule(c, a, at):
        if c.is_int:
            return f"({a[0]} {op} {a[1]})"
        return f"(({a[0]} != 0) {logical} ({a[1]} != 0))"
    return rule


def _bitwise(name, kernel, **rules):
    base = _binary_infer(name)

    def infer(a, b):
        m = base(a, b)
        if m.dtype.category >= 2:
            raise NotImplementedError(f'"{name}_cpu" not implemented for \'{m.dtype.name}\'')
        return m
    op = defop(name, infer, _kernel(kernel), grad=None, promote=True, sbp=POINTWISE, cost=ONE,
               **rules, to_relax=_relax.rule(name), to_jax=_jax.rule(name))

    def fn(input, other, *, out=None):
        return call(op, input, other, out=out)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}`` of integer or bool tensors."
    return fn


bitwise_and = _bitwise("bitwise_and", np.bitwise_and, to_c=_bitwise_c("&", "&&"),
                       traits=_SINGLE_INT)
bitwise_or = _bitwise("bitwise_or", np.bitwise_or, to_c=_bitwise_c("|", "||"),
                      traits=_SINGLE_INT)
bitwise_xor = _bitwise("bitwise_xor", np.bitwise_xor, to_c=_bitwise_c("^", "!="),
                       traits=_SINGLE_INT)
bitwise_left_shift = _bitwise("bitwise_left_shift", _shift(True))
bitwise_right_shift = _bitwise("bitwise_right_shift", _shift(False))


def _bitwise_not_infer(x):
    _need_tensor("bitwise_not", x)
    if x.dtype.category >= 2:
        raise TypeError("~ (operator.invert) is only implemented on integer and Boolean-type "
                        f"tensors, not {x.dtype.name}")
    return Meta(x.shape, x.dtype)


_BITWISE_NOT = defop("bitwise_not", _bitwise_not_infer, np.invert, grad=None, sbp=POINTWISE,
                     cost=ONE, traits=_SINGLE_INT,
                     to_c=lambda c, a, at: f"(~{a[0]})" if c.is_int else f"(!{a[0]})",
                     to_jax=_jax.rule("bitwise_not"), to_relax=_relax.rule("bitwise_not"))


def bitwise_not(input, *, out=None):
    """``~input`` for integer and bool tensors."""
    return call(_BITWISE_NOT, input, out=out)


# ---- isclose ----------------------------------------------------------------------------

def _isclose_infer(a, b, rtol=1e-5, atol=1e-8, equal_nan=False):
    if type(a) is not Meta or type(b) is not Meta:
        bad, pos = (a, 1) if type(a) is not Meta else (b, 2)
        raise TypeError(f"isclose(): argument '{'input' if pos == 1 else 'other'}' (position "
                        f"{pos}) must be Tensor, not {type(bad).__name__}")
    if a.dtype is not b.dtype:
        raise RuntimeError(f"isclose: {a.dtype} did not match {b.dtype}")
    return Meta(broadcast_shapes("isclose", a.shape, b.shape), D.bool_)


def _isclose_kernel(a, b, rtol=1e-5, atol=1e-8, equal_nan=False):
    """PyTorch's algorithm: equal, or a finite |a - b| (in the input dtype) within
    atol + |rtol * b| (in the float type)."""
    close = a == b
    if equal_nan and a.dtype.kind == "f":
        close |= np.isnan(a) & np.isnan(b)
    if rtol == 0 and atol == 0:
        return close
    if a.dtype == np.bool_:
        a, b = (x.astype(D.get_default_dtype().np) for x in (a, b))
    ft = a.dtype if a.dtype.kind == "f" else D.get_default_dtype().np
    ft = np.dtype(np.float32) if ft in _LOWP else ft
    assert ft is not None  # the default dtype is float32 or float64
    with np.errstate(all="ignore"):
        allowed = ft.type(atol) + np.abs(b.astype(ft) * ft.type(rtol))
        actual = np.abs(a - b)
        actual = actual.astype(ft) if a.dtype in _LOWP else actual
        return close | (np.isfinite(actual) & (actual <= allowed))


# |a - b| <= atol + |rtol * b|, or a == b: six operations per element
_ISCLOSE = defop("isclose", _isclose_infer, _isclose_kernel, grad=None, sbp=POINTWISE,
                 cost=cost.elementwise(6), to_jax=_jax.isclose, to_relax=_relax.isclose)


def isclose(input, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False):
    """|input - other| <= atol + rtol * |other|, elementwise."""
    return call(_ISCLOSE, input, other, rtol=rtol, atol=atol, equal_nan=equal_nan)


def allclose(input, other, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: bool = False) -> bool:
    """True when every element ``isclose``."""
    return bool(isclose(input, other, rtol, atol, equal_nan).all())


def equal(input, other) -> bool:
    """True when both have the same shape and elements."""
    return tuple(input.shape) == tuple(other.shape) and bool(eq(input, other).all())
