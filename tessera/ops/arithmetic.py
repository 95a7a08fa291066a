"""Arithmetic ops of two operands: add, sub, mul, div, remainder, fmod, pow, maximum and
minimum (fmax, fmin), atan2, hypot, logaddexp and logaddexp2. They broadcast like PyTorch
and promote dtypes with ``result_type``; the gradients sum broadcast dims back to each
input's shape.

>>> import tessera
>>> (tessera.tensor([1, 2]) / 2).dtype, tessera.add(tessera.tensor([1.0]), 2, alpha=3)
(tessera.float32, tensor([7.]))
"""
from __future__ import annotations

import math

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.kernels.c_expr import alpha as alpha_c, fmt, libm
from tessera.ops import _jax, _relax, cost
from tessera.ops._elementwise import (
    ONE,
    POINTWISE,
    _binary_infer,
    _down,
    _first_dtype,
    _inplace_kernel,
    _is_int_scalar,
    _kernel,
    _np_result_type,
    _operands,
    _reduce_pair,
    _scalar,
    _wrap_int,
    checked_scalar,
)
from tessera.ops._sbp import pointwise
from tessera.ops._util import call
from tessera.ops.comparison import isnan
from tessera.ops.registry import Meta, defop
from tessera.ops.sparse import SparseTensor, binary as _sparse_binary
from tessera.ops.ternary import where
from tessera.ops.unary import exp, exp2, log

__all__ = ["add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide",
           "floor_divide", "remainder", "fmod", "pow", "float_power", "maximum", "minimum", "fmax",
           "fmin", "atan2", "arctan2", "hypot", "logaddexp", "logaddexp2"]



# traits (``tessera.ops.registry.TRAITS``) of the cheapest ops, one instruction per element:
# NumPy's ufunc is at memory speed, recomputing beats storing, and the in-place kernel is a
# general out-form
_BASIC = frozenset({"numpy_fast", "cheap", "out_form"})


# ---- add, sub, mul, div ----------------------------------------------------------------

def _alpha(alpha, dt: np.dtype):
    return _wrap_int(alpha, dt) if dt.kind in "iu" and _is_int_scalar(alpha) else alpha


def _add_kernel(a, b, alpha=1):
    return a + b if alpha == 1 else a + _alpha(alpha, _first_dtype(a, b)) * b


def _sub_kernel(a, b, alpha=1):
    return a - b if alpha == 1 else a - _alpha(alpha, _first_dtype(a, b)) * b


def _add_grad(ctx, g):
    alpha = ctx.attrs.get("alpha", 1)
    return _reduce_pair(ctx, g, g if alpha == 1 else g * alpha)


def _sub_grad(ctx, g):
    alpha = ctx.attrs.get("alpha", 1)
    return _reduce_pair(ctx, g, -g if alpha == 1 else g * (-alpha))


def _add_infer(name):
    base = _binary_infer(name)

    def infer(a, b, alpha=1):
        if name == "sub" and any(m is D.bool_ or isinstance(m, (bool, np.bool_))
                                 for m in (a.dtype if type(a) is Meta else a,
                                           b.dtype if type(b) is Meta else b)):
            raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not "
                               "supported. If you are trying to invert a mask, use the `~` or "
                               "`logical_not()` operator instead.")
        if not isinstance(alpha, (int, float, complex, np.number, np.bool_, Tensor)):
            raise TypeError(f"{name}(): argument 'alpha' must be Number, not "
                            f"{type(alpha).__name__}")
        m = base(a, b)
        if isinstance(alpha, (bool, np.bool_)) and m.dtype is not D.bool_:
            raise RuntimeError("Boolean alpha only supported for Boolean results.")
        if m.dtype.category < 2 and not isinstance(alpha, (int, np.integer)):
            raise RuntimeError("For integral input tensors, argument alpha must not be a "
                               "floating point number.")
        return m
    return infer


def _inplace_add(t, a, b, alpha=1):
    if alpha != 1 and _axpy(t, a, b, alpha):
        return
    np.add(a, b if alpha == 1 else np.multiply(b, _alpha(alpha, t.dtype)), out=t,
           casting="unsafe")


def _inplace_sub(t, a, b, alpha=1):
    if alpha != 1 and _axpy(t, a, b, -alpha):
        return
    np.subtract(a, b if alpha == 1 else np.multiply(b, _alpha(alpha, t.dtype)), out=t,
                casting="unsafe")


AXPY_MIN = 1 << 15  # elements: below this NumPy's two calls cost less than BLAS's one


def _axpy(t, a, b, alpha) -> bool:
    """``t += alpha * b`` (``t`` is ``a``: an in-place ``add_`` such as an optimizer's
    ``p.add_(g, alpha=-lr)``) as one BLAS axpy, without NumPy's temporary ``alpha * b`` of
    the parameter's size (freshly faulted memory for a large one, every step); whether it
    ran. Rounds ``a + alpha * b`` once (a fused multiply-add) where NumPy rounds twice."""
    if a is not t or type(b) is not np.ndarray or b.dtype != t.dtype or \
            b.shape != t.shape or t.size < AXPY_MIN or type(alpha) not in (int, float) or \
            not (t.flags.c_contiguous and b.flags.c_contiguous) or \
            np.may_share_memory(t, b):
        return False
    from tessera.kernels.conv import _blas
    blas = _blas()
    f = None if blas is None else blas.axpy.get(t.dtype)
    if f is None:
        return False
    f(t.size, alpha, b.ctypes.data, 1, t.ctypes.data, 1)
    return True


def _alpha_cost(ins, outs, alpha=1):
    """``a + alpha * b``: a multiply-add unless alpha is 1."""
    return cost.elementwise(1 if type(alpha) in (int, float) and alpha == 1 else 2)(ins, outs)


def _add_rules(sign: str, inplace) -> dict:
    return dict(save=(), promote=True, sbp=pointwise(joint=(0, 1)), cost=_alpha_cost,
                to_c=alpha_c(sign), traits=_BASIC | {"single_pass", "c_int"},
                inplace_kernels={"cpu": _inplace_kernel(inplace)})


_ADD = defop("add", _add_infer("add"), _kernel(_add_kernel), grad=_add_grad,
             operator=("__add__", {"alpha": 1}), **_add_rules("+", _inplace_add),
             to_relax=_relax.add, to_jax=_jax.add)
_SUB = defop("sub", _add_infer("sub"), _kernel(_sub_kernel), grad=_sub_grad,
             operator=("__sub__", {"alpha": 1}), **_add_rules("-", _inplace_sub),
             to_relax=_relax.sub, to_jax=_jax.sub)


def _sparse(input, other) -> bool:
    return type(input) is SparseTensor or type(other) is SparseTensor


# A sparse operand makes dispatch raise NotImplementedError (the sparse device has no
# kernels): add, sub and mul catch it and take the sparse way, so the dense calls pay nothing.

def add(input, other, *, alpha=1, out=None):
    """``input + alpha * other``, broadcasting and promoting like PyTorch."""
    if out is None:
        try:
            return call(_ADD, input, other, alpha=alpha)
        except NotImplementedError:
            if not _sparse(input, other):
                raise
    elif not _sparse(input, other):
        return call(_ADD, input, other, alpha=alpha, out=out)
    return _sparse_binary("add", input, other, alpha, out)


def sub(input, other, *, alpha=1, out=None):
    """``input - alpha * other``."""
    if out is None:
        try:
            return call(_SUB, input, other, alpha=alpha)
        except NotImplementedError:
            if not _sparse(input, other):
                raise
    elif not _sparse(input, other):
        return call(_SUB, input, other, alpha=alpha, out=out)
    return _sparse_binary("sub", input, other, alpha, out)


subtract = sub


def _mul_grad(ctx, g):
    a, b = ctx.inputs
    need = ctx.needs_input_grad
    return _reduce_pair(ctx, g * b if need[0] else None, g * a if need[1] else None)


_MUL = defop("mul", _binary_infer("mul"), _kernel(np.multiply), grad=_mul_grad, promote=True,
             operator=("__mul__", {}),
             sbp=pointwise(each=(0, 1)), cost=ONE, to_c=fmt("({0} * {1})"),
             traits=_BASIC | {"single_pass", "c_int"},
             inplace_kernels={"cpu": _inplace_kernel(
                 lambda t, a, b: np.multiply(a, b, out=t, casting="unsafe"))},
             to_relax=_relax.mul, to_jax=lambda jnp, lax, a, at: a[0] * a[1])


def mul(input, other, *, out=None):
    """``input * other``."""
    if out is None:
        try:
            return call(_MUL, input, other)
        except NotImplementedError:
            if not _sparse(input, other):
                raise
    elif not _sparse(input, other):
        return call(_MUL, input, other, out=out)
    return _sparse_binary("mul", input, other, 1, out)


multiply = mul


def _div_out(dt):
    return dt if dt.category >= 2 else D.get_default_dtype()


def _div_infer(a, b, rounding_mode=None):
    if rounding_mode not in (None, "trunc", "floor"):
        raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' "
                         f"but found '{rounding_mode}'")
    if rounding_mode is None:
        m = _binary_infer("div")(a, b)
        return Meta(m.shape, _div_out(m.dtype))
    return _binary_infer(f"div_{rounding_mode}", bool_ok=False)(a, b)


def _check_int_zero(b):
    if (np.asarray(b) == 0).any():
        raise RuntimeError("ZeroDivisionError")


def _div_kernel(a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return np.true_divide(a, b)
    if _first_dtype(a, b).kind in "iu":
        _check_int_zero(b)
        q = np.floor_divide(a, b)
        if rounding_mode == "trunc":  # floor, plus one where the division was inexact and
            q = q + ((np.remainder(a, b) != 0) & ((np.asarray(a) < 0) != (np.asarray(b) < 0)))
        return q
    if rounding_mode == "floor":
        return np.floor_divide(a, b)  # Python's rule, as PyTorch: 1.0 // 0.1 == 9.0
    return np.trunc(np.true_divide(a, b))


def _div_float_kernel(a, b, rounding_mode=None):
    ct = _np_result_type(a, b)
    if rounding_mode is None and ct.kind in "biu":
        default = D.get_default_dtype().np  # true division of integers: in the float result type
        assert default is not None  # float32 or float64
        ct = default
    with np.errstate(all="ignore"):
        return _down(_div_kernel(*_operands([a, b], ct), rounding_mode=rounding_mode), ct)


def _div_grad(ctx, g):
    a, b = ctx.inputs
    if ctx.attrs.get("rounding_mode"):
        return _reduce_pair(ctx, g * 0, g * 0)
    need = ctx.needs_input_grad
    return _reduce_pair(ctx, g / b if need[0] else None,
                        -g * a / (b * b) if need[1] else None)


def _div_c(c, a, at):
    mode = at.get("rounding_mode")
    if mode is None:
        return f"({a[0]} / {a[1]})"
    if mode == "trunc":
        return f"{c.fn('trunc')}({a[0]} / {a[1]})"
    return f"{c.tsr('floordiv')}({a[0]}, {a[1]})"


# (not c_int: an integer zero divisor must raise)
_DIV = defop("div", _div_infer, _div_float_kernel, grad=_div_grad, promote=True,
             operator=("__truediv__", {"rounding_mode": None}),
             sbp=pointwise(each=(0,)), cost=ONE, to_c=_div_c, traits=_BASIC,
             inplace_kernels={"cpu": _inplace_kernel(
                 lambda t, a, b, rounding_mode=None: np.copyto(
                     t, _div_float_kernel(a, b, rounding_mode), casting="unsafe"))},
             to_relax=_relax.div, to_jax=_jax.div)


def div(input, other, *, rounding_mode=None, out=None):
    """True division (integers give floats); ``rounding_mode='trunc'|'floor'``."""
    return call(_DIV, input, other, rounding_mode=rounding_mode, out=out)


divide = true_divide = div


def floor_divide(input, other, *, out=None):
    """``input // other`` (rounds toward minus infinity, like Python)."""
    return div(input, other, rounding_mode="floor", out=out)


# ---- remainder, fmod, pow -------------------------------------------------------------

def _remainder_kernel(a, b):
    if _first_dtype(a, b).kind in "iu":
        _check_int_zero(b)
    return np.remainder(a, b)


def _fmod_kernel(a, b):
    if _first_dtype(a, b).kind in "iu":
        _check_int_zero(b)
    return np.fmod(a, b)


def _mod_grad(kind):
    def grad(ctx, g):
        a, b = ctx.inputs
        q = div(a, b, rounding_mode="floor" if kind == "remainder" else "trunc") \
            if ctx.needs_input_grad[1] else None
        return _reduce_pair(ctx, g, -g * q if q is not None else None)
    return grad


def _into(kernel):
    """The out-form of a binary op whose kernel allocates: computed, then copied."""
    return {"cpu": _inplace_kernel(
        lambda t, a, b: np.copyto(t, _kernel(kernel)(a, b), casting="unsafe"))}


def _remainder_c(c, a, at):  # floats only: an integer zero divisor raises, as in PyTorch
    return f"{c.tsr('rem')}({a[0]}, {a[1]})"


_REMAINDER = defop("remainder", _binary_infer("remainder", bool_ok=False),
                   _kernel(_remainder_kernel), grad=_mod_grad("remainder"), promote=True,
                   sbp=POINTWISE, cost=ONE, to_c=_remainder_c, traits={"out_form"},
                   inplace_kernels=_into(_remainder_kernel),
                   to_relax=_relax.remainder,
                   to_jax=lambda jnp, lax, a, at: jnp.remainder(a[0], a[1]))
_FMOD = defop("fmod", _binary_infer("fmod", bool_ok=False, scalar_first=False),
              _kernel(_fmod_kernel), grad=_mod_grad("fmod"), promote=True, sbp=POINTWISE,
              cost=ONE, to_c=libm("fmod"), traits={"out_form"},
              inplace_kernels=_into(_fmod_kernel),
              to_relax=_relax.fmod, to_jax=lambda jnp, lax, a, at: jnp.fmod(a[0], a[1]))


def remainder(input, other, *, out=None):
    """Python's ``%``: the result has the sign of the divisor."""
    return call(_REMAINDER, input, other, out=out)


def fmod(input, other, *, out=None):
    """C's fmod: the result has the sign of the dividend."""
    return call(_FMOD, input, other, out=out)


def _pow_infer(a, b):
    m = _binary_infer("pow")(a, b)
    if type(a) is Meta and a.dtype.category < 2 and _is_int_scalar(b):
        if b < 0:
            raise RuntimeError("Integers to negative integer powers are not allowed.")
        checked_scalar(b, a.dtype)
    return m


def _int_pow(a, b):
    """Integer powers; a negative exponent gives 1 for base 1, ±1 for base -1, else 0."""
    neg = np.asarray(b) < 0
    if not neg.any():
        return np.power(a, b)
    bb = np.asarray(b)
    res = np.power(a, np.where(neg, np.zeros((), bb.dtype), bb))
    aa = np.asarray(a)
    special = np.where(aa == 1, 1, np.where(aa == -1, np.where(bb % 2 == 0, 1, -1), 0))
    return np.where(neg, special.astype(res.dtype), res)


def _pow_kernel(a, b):
    if _first_dtype(a, b).kind in "biu":
        return _int_pow(a, b)
    if type(b) in (int, float) and isinstance(a, np.ndarray):
        return _pow_scalar(a, b)
    return np.power(a, b)


def _pow_scalar(a: np.ndarray, b: float) -> np.ndarray:
    """A floating array to a Python number's power, as PyTorch's pow_tensor_scalar computes
    the common exponents: products, square roots and reciprocals, each a NumPy SIMD loop,
    where ``np.power`` runs libm's pow per element (25x slower for ``x ** 3``: GELU's tanh
    form; bench overhead: tanh GELU)."""
    if b == 2:
        return a * a
    if b == 3:
        return a * a * a
    if b == 0.5:
        return np.sqrt(a)
    if b == -0.5:
        return 1 / np.sqrt(a)
    if b == -1:
        return 1 / a
    if b == -2:
        return 1 / (a * a)
    return np.power(a, b)


def _scalar_log(a: float) -> float:
    return math.log(a) if a > 0 else -math.inf if a == 0 else math.nan


def _pow_grad(ctx, g):
    """PyTorch's rules: no gradient through exponent 0 for the base, none through base 0
    (with exponent >= 0) for the exponent."""
    a, b = ctx.inputs
    need = ctx.needs_input_grad
    ga = gb = None
    if need[0]:
        if _scalar(ctx, 1):
            ga = g * 0 if b == 0 else g * (b * pow(a, b - 1))
        else:
            ga = where(b == 0, 0.0, g * (b * pow(a, b - 1)))
    if need[1]:
        out = pow(a, b)
        if _scalar(ctx, 0):
            gb = g * (out * _scalar_log(a))
            if a == 0:
                gb = where(b >= 0, 0.0, gb)
        else:
            gb = where((a == 0) & (b >= 0), 0.0, g * (out * log(a)))
    return _reduce_pair(ctx, ga, gb)


_POW = defop("pow", _pow_infer, _kernel(_pow_kernel), grad=_pow_grad, promote=True,
             sbp=POINTWISE, cost=ONE, to_c=lambda c, a, at: f"{c.tsr('pow')}({a[0]}, {a[1]})",
             traits={"out_form"}, inplace_kernels=_into(_pow_kernel),
             to_relax=_relax.power, to_jax=lambda jnp, lax, a, at: jnp.power(a[0], a[1]))


def pow(input, exponent, *, out=None):
    """``input ** exponent``."""
    return call(_POW, input, exponent, out=out)


def float_power(input, exponent, *, out=None):
    """``pow`` computed in float64."""
    x = input.double() if isinstance(input, Tensor) else float(input)
    e = exponent.double() if isinstance(exponent, Tensor) else float(exponent)
    return pow(x, e, out=out)


# ---- maximum, minimum, atan2, hypot ----------------------------------------------------

def _minmax_grad(a_wins, b_wins):
    """maximum/minimum: ties share the gradient; where neither side wins (NaN) both get it."""
    def grad(ctx, g):
        a, b = ctx.inputs
        half = where(a == b, g / 2, g)
        return _reduce_pair(ctx, where(b_wins(a, b), 0.0, half), where(a_wins(a, b), 0.0, half))
    return grad


def _fminmax_grad(a_keeps):
    """fmax/fmin: the gradient goes to ``input`` where it is picked (ties and NaN ``other``
    included), else to ``other``."""
    def grad(ctx, g):
        a, b = ctx.inputs
        keep = a_keeps(a, b) | isnan(b)
        return _reduce_pair(ctx, where(keep, g, 0.0), where(keep, 0.0, g))
    return grad


def _tensors_op(name, kernel, grad, to_c, traits=frozenset(), cost=ONE, **kw):
    return defop(name, _binary_infer(name, tensors=True, **kw), _kernel(kernel), grad=grad,
                 promote=True, sbp=POINTWISE, cost=cost, to_c=to_c, traits=traits,
                 to_relax=_relax.rule(name), to_jax=_jax.rule(name))


def _max_c(c, a, at):  # a NaN operand wins, as NumPy's maximum
    return f"(({a[0]} > {a[1]} || {a[0]} != {a[0]}) ? {a[0]} : {a[1]})"


def _min_c(c, a, at):
    return f"(({a[0]} < {a[1]} || {a[0]} != {a[0]}) ? {a[0]} : {a[1]})"


_SINGLE = frozenset({"single_pass"})
_MAXIMUM = _tensors_op("maximum", np.maximum, _minmax_grad(lambda a, b: a > b,
                                                           lambda a, b: a < b),
                       _max_c, _SINGLE | {"c_int"})
_MINIMUM = _tensors_op("minimum", np.minimum, _minmax_grad(lambda a, b: a < b,
                                                           lambda a, b: a > b),
                       _min_c, _SINGLE | {"c_int"})
_FMAX = _tensors_op("fmax", np.fmax, _fminmax_grad(lambda a, b: a >= b), libm("fmax"), _SINGLE)
_FMIN = _tensors_op("fmin", np.fmin, _fminmax_grad(lambda a, b: a <= b), libm("fmin"), _SINGLE)


def maximum(input, other, *, out=None):
    """Elementwise max; NaN propagates."""
    return call(_MAXIMUM, input, other, out=out)


def minimum(input, other, *, out=None):
    """Elementwise min; NaN propagates."""
    return call(_MINIMUM, input, other, out=out)


def fmax(input, other, *, out=None):
    """Elementwise max ignoring NaN."""
    return call(_FMAX, input, other, out=out)


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


_ATAN2 = defop("atan2", _binary_infer("atan2", out_dtype=_div_out, tensors=True),
               _kernel(np.arctan2, float_compute=True), grad=_atan2_grad, promote=True,
               sbp=POINTWISE, cost=ONE, to_c=libm("atan2"),
               to_relax=_relax.atan2, to_jax=lambda jnp, lax, a, at: jnp.arctan2(a[0], a[1]))
_HYPOT = _tensors_op("hypot", np.hypot, _hypot_grad, libm("hypot"), int_ok=False,
                     bool_ok=False)


def atan2(input, other, *, out=None):
    """The angle of (other, input), in (-pi, pi]."""
    return call(_ATAN2, input, other, out=out)


arctan2 = atan2


def hypot(input, other, *, out=None):
    """sqrt(input**2 + other**2) without overflow."""
    return call(_HYPOT, input, other, out=out)


# ---- logaddexp, logaddexp2 --------------------------------------------------------------

def _logaddexp_grad(base_exp):
    """d/da log(e^a + e^b) = 1 / (1 + e^(b - a)) (PyTorch's form; base 2 for logaddexp2)."""
    def grad(ctx, g):
        a, b = ctx.inputs
        return _reduce_pair(ctx, g / (1 + base_exp(b - a)), g / (1 + base_exp(a - b)))
    return grad


def _logaddexp_c(exp_fn: str, log1p_scale: str, same: str):
    """max(a, b) + log1p(exp(-|a - b|)) (scaled for base 2); equal operands (infinities
    included) give a + log(2), as NumPy's kernel does."""
    def rule(c, a, at):
        x, y = a
        exp = c.tsr("exp") if exp_fn == "exp" else c.fn("exp2")
        tail = f"{c.tsr('log1p')}({exp}(-{c.fn('fabs')}(d)))"
        if log1p_scale:
            tail = f"({tail} * {c.lit(float(log1p_scale))})"
        return (f"({{ {c.T} d = {x} - {y}; ({x} == {y}) ? {x} + {c.lit(float(same))} : "
                f"(({x} > {y} || {x} != {x}) ? {x} : {y}) + {tail}; }})")
    return rule


_LOGADDEXP = _tensors_op("logaddexp", np.logaddexp, _logaddexp_grad(exp),
                         _logaddexp_c("exp", "", "0.6931471805599453"), int_ok=False,
                         bool_ok=False, cost=cost.elementwise(5))
_LOGADDEXP2 = _tensors_op("logaddexp2", np.logaddexp2, _logaddexp_grad(exp2),
                          _logaddexp_c("exp2", "1.4426950408889634", "1.0"), int_ok=False,
                          bool_ok=False, cost=cost.elementwise(5))


def logaddexp(input, other, *, out=None):
    """``log(exp(input) + exp(other))`` without overflow.

    >>> import tessera
    >>> x = tessera.tensor([0.0, 100.0])  # exp(100) overflows float32
    >>> tessera.logaddexp(x, x) - x
    tensor([0.6931, 0.6931])
    """
    return call(_LOGADDEXP, input, other, out=out)


def logaddexp2(input, other, *, out=None):
    """``log2(2**input + 2**other)`` without overflow.

    >>> import tessera
    >>> tessera.logaddexp2(tessera.tensor([1.0]), tessera.tensor([1.0]))
    tensor([2.])
    """
    return call(_LOGADDEXP2, input, other, out=out)
