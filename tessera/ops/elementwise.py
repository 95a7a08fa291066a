"""Elementwise ops: unary math, binary arithmetic, comparisons, logic, clamp and where.

Unary float functions are one table (name, NumPy function, derivative), so adding one is a
line. Every op broadcasts like PyTorch and promotes dtypes with ``result_type``. Kernels see
their operands through ``_operands``: Python ints are cast to an integer tensor's dtype with
wrap-around (PyTorch casts wrapped scalars so: ``uint8 + 300`` adds 44), and float16/bfloat16
compute in float32 and round once (PyTorch's "opmath" type on the CPU).

>>> import tessera
>>> (tessera.tensor([1, 2]) / 2).dtype
tessera.float32
"""
from __future__ import annotations

import builtins
import math

import numpy as np

from tessera import _dtype as D
from tessera._tensor import FAST_OPERATORS, Tensor
from tessera.ops._util import broadcast_shapes, call, dtype_arg, float_dtype, shape_of, sum_to
from tessera.ops.registry import Meta, defop

__all__ = []  # filled by _public
builtins_abs = builtins.abs  # ``abs`` is redefined below as the tensor op


def _public(fn):
    __all__.append(fn.__name__)
    return fn


def _special():
    import scipy.special  # lazily: only erf/erfinv-like kernels need it
    return scipy.special


# ---- operands: scalar casts and the float16/bfloat16 compute type ----------------------

_LOWP = (np.dtype(np.float16), D.bfloat16.np)
_NUMBER = (int, float, bool, complex, np.generic)


def _is_int_scalar(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _wrap_int(v, dt: np.dtype):
    """A Python int cast to an integer dtype modulo 2**bits, as PyTorch casts wrapped
    scalars (``int8 + 300`` adds 44)."""
    v = int(v)
    if not -(1 << 63) <= v < (1 << 64):
        raise OverflowError("int too big to convert")
    return np.array(v % (1 << 64), np.uint64).astype(dt)[()]


_C_NAMES = {"int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "int32": "int",
            "int64": "long", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
            "float32": "float", "float64": "double", "bool": "bool"}


def checked_scalar(v, dt: D.dtype):
    """A Python number as a ``Scalar`` argument of ``dt`` (fill values, clamp bounds): values
    that do not fit raise, as PyTorch's checked conversion does (unsigned types accept
    negatives down to -max; NaN and inf fit every float type)."""
    if isinstance(v, (bool, np.bool_)) or dt is D.bool_ or \
            not isinstance(v, (int, float, np.integer, np.floating)):
        return v
    if dt.category == 1:
        info = np.iinfo(dt.np)
        lo = info.min if dt.is_signed else -int(info.max)
        bad = not lo <= v <= info.max if not math.isnan(v) else False
    else:
        bad = math.isfinite(v) and builtins_abs(v) > _float_max(dt)
    if bad:
        raise RuntimeError(f"value cannot be converted to type {_C_NAMES[dt.name]} without "
                           "overflow")
    return v


def _float_max(dt: D.dtype) -> float:
    if dt is D.bfloat16:
        import ml_dtypes
        return float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    return float(np.finfo(dt.np).max)


def _operands(args, compute=None):
    """Kernel operands made ready for NumPy. ``compute``: the dtype arrays are cast to (by
    default the first array's); float16/bfloat16 become float32, Python ints wrap into an
    integer compute dtype."""
    dt = compute
    if dt is None:
        dt = next((a.dtype for a in args if isinstance(a, np.ndarray)), None)
        if dt is None:
            return args
    up = np.dtype(np.float32) if dt in _LOWP else dt
    out = []
    for a in args:
        if isinstance(a, np.ndarray):
            if a.dtype != up and (compute is not None or a.dtype in _LOWP):
                a = a.astype(up)
        elif dt.kind in "iu" and _is_int_scalar(a):
            a = _wrap_int(a, dt)
        out.append(a)
    return out


def _np_result_type(*vals) -> np.dtype:
    """``result_type`` of kernel operands (arrays keep their ndim, so the 0-d rule holds)."""
    return D.result_type(*[(D.from_numpy_dtype(v.dtype), v.ndim) if isinstance(v, np.ndarray)
                           else v for v in vals if v is not None]).np


def _kernel(fn, float_compute=False):
    """Wrap ``fn(*arrays, **attrs)``: promoted operands (see ``_operands``), quiet inf/nan.
    ``float_compute``: integer operands compute in the default float dtype (div, atan2)."""
    def k(*args, **attrs):
        ct = _np_result_type(*args)
        if float_compute and ct.kind in "biu":
            ct = D.get_default_dtype().np
        return _down(fn(*_operands(args, ct), **attrs), ct)
    k.__name__ = getattr(fn, "__name__", "kernel")
    k.plain = fn  # what ``k`` reduces to on float32/float64 operands (dispatch's fast path)
    return k


def _down(res, dt: np.dtype):
    """A float32 result of a float16/bfloat16 computation rounded back (quietly: overflow to
    inf is the answer)."""
    if dt in _LOWP and isinstance(res, np.ndarray) and res.dtype == np.float32:
        return res.astype(dt)
    return res


def _inplace_kernel(fn):
    """In-place fast kernels write into ``t`` with unsafe casting; operands as ``_kernel``."""
    def k(t, *args, **attrs):
        fn(t, *_operands(args), **attrs)
    return k


# ---- unary -------------------------------------------------------------------------------

def _need_tensor(name, x, arg="input"):
    if type(x) is not Meta:
        raise TypeError(f"{name}(): argument '{arg}' (position 1) must be Tensor, not "
                        f"{type(x).__name__}")
    return x


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


def _gx(ctx):
    return ctx.inputs[0]


def _go(ctx):
    return ctx.outputs[0]


def _u(name: str):
    """A unary op function by name: the table's gradients use ops the table itself defines."""
    return globals()[name]


# name: (kernel, grad(ctx, g) -> g_input, save)
_UNARY = {
    "exp": (np.exp, lambda c, g: g * _go(c), "outputs"),
    "exp2": (np.exp2, lambda c, g: g * _go(c) * LN2, "outputs"),
    "expm1": (np.expm1, lambda c, g: g * (_go(c) + 1), "outputs"),
    "log": (np.log, lambda c, g: g / _gx(c), "inputs"),
    "log2": (np.log2, lambda c, g: g / (_gx(c) * LN2), "inputs"),
    "log10": (np.log10, lambda c, g: g / (_gx(c) * LN10), "inputs"),
    "log1p": (np.log1p, lambda c, g: g / (_gx(c) + 1), "inputs"),
    "sqrt": (np.sqrt, lambda c, g: g / (2 * _go(c)), "outputs"),
    "rsqrt": (lambda x: 1 / np.sqrt(x), lambda c, g: -0.5 * g * _go(c) ** 3, "outputs"),
    "reciprocal": (lambda x: 1 / x, lambda c, g: -g * _go(c) * _go(c), "outputs"),
    "sin": (np.sin, lambda c, g: g * _u("cos")(_gx(c)), "inputs"),
    "cos": (np.cos, lambda c, g: -g * _u("sin")(_gx(c)), "inputs"),
    "tan": (np.tan, lambda c, g: g * (1 + _go(c) * _go(c)), "outputs"),
    "asin": (np.arcsin, lambda c, g: g * _u("rsqrt")(1 - _gx(c) * _gx(c)), "inputs"),
    "acos": (np.arccos, lambda c, g: -g * _u("rsqrt")(1 - _gx(c) * _gx(c)), "inputs"),
    "atan": (np.arctan, lambda c, g: g / (1 + _gx(c) * _gx(c)), "inputs"),
    "sinh": (np.sinh, lambda c, g: g * _u("cosh")(_gx(c)), "inputs"),
    "cosh": (np.cosh, lambda c, g: g * _u("sinh")(_gx(c)), "inputs"),
    "tanh": (np.tanh, lambda c, g: g * (1 - _go(c) * _go(c)), "outputs"),
    "asinh": (np.arcsinh, lambda c, g: g * _u("rsqrt")(_gx(c) * _gx(c) + 1), "inputs"),
    "acosh": (np.arccosh, lambda c, g: g * _u("rsqrt")(_gx(c) * _gx(c) - 1), "inputs"),
    "atanh": (np.arctanh, lambda c, g: g / (1 - _gx(c) * _gx(c)), "inputs"),
    "sigmoid": (lambda x: _sigmoid_np(x), lambda c, g: g * _go(c) * (1 - _go(c)), "outputs"),
    "erf": (lambda x: _special().erf(x),
            lambda c, g: g * (2 / math.sqrt(math.pi)) * _u("exp")(-_gx(c) * _gx(c)), "inputs"),
    "erfc": (lambda x: _special().erfc(x),
             lambda c, g: g * (-2 / math.sqrt(math.pi)) * _u("exp")(-_gx(c) * _gx(c)), "inputs"),
    "erfinv": (lambda x: _special().erfinv(x),
               lambda c, g: g * (math.sqrt(math.pi) / 2) * _u("exp")(_go(c) * _go(c)), "outputs"),
}


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
    cpu.plain = kernel
    return cpu


def _make_unary(name, kernel, grad, save):
    op = defop(name, _unary_infer(name, True), _float_kernel(kernel),
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
                   bool_to=None, infer=None):
    """Unary ops that keep the input dtype (floor of an int is that int)."""
    op = defop(name, infer or _unary_infer(name, False, bool_ok, int_ok, bool_to), kernel,
               grad=grad, save=save)

    def fn(input, *, out=None):
        return call(op, input, out=out)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}``, keeping the input dtype."
    return _public(fn), op


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


neg, _NEG = _dtype_keeping("neg", np.negative, grad=lambda c, g: (-g,), infer=_neg_infer)
_NEG.inplace_kernels["cpu"] = lambda t, x: np.negative(x, out=t)
negative = neg
positive, _ = _dtype_keeping("positive", np.positive, grad=lambda c, g: (g,),
                             infer=_positive_infer)
abs, _ = _dtype_keeping("abs", np.abs, grad=lambda c, g: (g * sign(c.inputs[0]),),
                        save=("inputs",))
absolute = abs


def _sign_kernel(x):
    if x.dtype == np.bool_:
        return x.copy()
    # (0 < x) - (x < 0): NaN gives 0 as in PyTorch (np.sign gives NaN)
    return ((x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)).astype(x.dtype)


sign, _ = _dtype_keeping("sign", _sign_kernel, bool_ok=True)
sgn = sign
floor, _ = _dtype_keeping("floor", _same_kernel(np.floor))
ceil, _ = _dtype_keeping("ceil", _same_kernel(np.ceil))
trunc, _ = _dtype_keeping("trunc", _same_kernel(np.trunc))
fix = trunc
frac, _ = _dtype_keeping("frac", _same_kernel(lambda x: x - np.trunc(x)),
                         grad=lambda c, g: (g,), int_ok=False)
square, _ = _dtype_keeping("square", lambda x: np.square(x.astype(np.int64)) if
                           x.dtype == np.bool_ else _same_kernel(np.square)(x) if
                           x.dtype.kind == "f" else np.square(x),
    grad=lambda c, g: (g * 2 * c.inputs[0],), save=("inputs",), bool_ok=True, bool_to=D.int64)
__all__ += ["negative", "absolute", "sgn", "fix"]


def _relu_kernel(x):
    return np.maximum(x, np.zeros((), x.dtype))


relu, _RELU = _dtype_keeping("relu", _relu_kernel,
                             grad=lambda c, g: (g * (c.outputs[0] > 0),), save=("outputs",))


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


_ROUND = defop("round", _round_infer, _same_kernel(_round_float), grad=_zero_grad, save=())


@_public
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
               grad=_logit_grad)


@_public
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


_NAN_TO_NUM = defop("nan_to_num", _unary_infer("nan_to_num", False), _nan_to_num_kernel,
                    grad=lambda c, g: (g * isfinite(c.inputs[0]),))


@_public
def nan_to_num(input, nan: float = 0.0, posinf: float | None = None,
               neginf: float | None = None, *, out=None):
    """Replace NaN, +inf and -inf by finite numbers (dtype max/min by default)."""
    return call(_NAN_TO_NUM, input, nan=nan, posinf=posinf, neginf=neginf, out=out)


def _bool_unary(name, kernel):
    op = defop(name, lambda x: Meta(_need_tensor(name, x).shape, D.bool_), kernel, grad=None)

    def fn(input, *, out=None):
        return call(op, input, out=out)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}``; a bool tensor."
    return _public(fn)


def _float_only(fn, default):
    return lambda x: fn(x) if x.dtype.kind == "f" else np.full(x.shape, default)


isnan = _bool_unary("isnan", np.isnan)
isinf = _bool_unary("isinf", _float_only(np.isinf, False))
isfinite = _bool_unary("isfinite", _float_only(np.isfinite, True))
isposinf = _bool_unary("isposinf", _float_only(np.isposinf, False))
isneginf = _bool_unary("isneginf", _float_only(np.isneginf, False))
signbit = _bool_unary("signbit", lambda x: np.signbit(x) if x.dtype.kind != "b" else
                      np.zeros(x.shape, bool))
logical_not = _bool_unary("logical_not", np.logical_not)


def _bitwise_not_infer(x):
    _need_tensor("bitwise_not", x)
    if x.dtype.category >= 2:
        raise TypeError("~ (operator.invert) is only implemented on integer and Boolean-type "
                        f"tensors, not {x.dtype.name}")
    return Meta(x.shape, x.dtype)


_BITWISE_NOT = defop("bitwise_not", _bitwise_not_infer, np.invert, grad=None)


@_public
def bitwise_not(input, *, out=None):
    """``~input`` for integer and bool tensors."""
    return call(_BITWISE_NOT, input, out=out)


# ---- binary --------------------------------------------------------------------------

def _binary_infer(name, out_dtype=None, int_ok=True, bool_ok=True, tensors=False,
                  scalar_first=True):
    """Broadcast shapes and promote dtypes. ``tensors``: both operands must be tensors;
    ``scalar_first=False``: only ``other`` may be a Python number (``eq(2, t)`` is a
    TypeError in PyTorch)."""
    def infer(a, b, **attrs):
        if type(a) is not Meta and type(b) is not Meta:
            raise TypeError(f"{name}(): expected at least one Tensor argument, got "
                            f"{type(a).__name__} and {type(b).__name__}")
        for pos, m in ((1, a), (2, b)):
            if type(m) is not Meta and (tensors or (pos == 1 and not scalar_first) or
                                        not isinstance(m, _NUMBER)):
                raise TypeError(f"{name}(): argument '{'input' if pos == 1 else 'other'}' "
                                f"(position {pos}) must be Tensor, not {type(m).__name__}")
        shape = broadcast_shapes(name, shape_of(a), shape_of(b))
        dt = D.result_type(dtype_arg(a), dtype_arg(b))
        if (not int_ok and dt.category < 2) or (not bool_ok and dt is D.bool_):
            raise NotImplementedError(f'"{name}_cpu" not implemented for \'{dt.name}\'')
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


def _first_dtype(*args) -> np.dtype:
    return next(a.dtype for a in args if isinstance(a, np.ndarray))


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


_ADD = defop("add", _add_infer("add"), _kernel(_add_kernel), grad=_add_grad, save=(),
             promote=True)
_SUB = defop("sub", _add_infer("sub"), _kernel(_sub_kernel), grad=_sub_grad, save=(),
             promote=True)


FAST_OPERATORS.update({"__add__": (_ADD, {"alpha": 1}), "__sub__": (_SUB, {"alpha": 1})})


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


_ADD.inplace_kernels["cpu"] = _inplace_kernel(_inplace_add)
_SUB.inplace_kernels["cpu"] = _inplace_kernel(_inplace_sub)


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


_MUL = defop("mul", _binary_infer("mul"), _kernel(np.multiply), grad=_mul_grad, promote=True)
_MUL.inplace_kernels["cpu"] = _inplace_kernel(
    lambda t, a, b: np.multiply(a, b, out=t, casting="unsafe"))


FAST_OPERATORS["__mul__"] = (_MUL, {})


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
    if rounding_mode is None:
        m = _binary_infer("div")(a, b)
        return Meta(m.shape, _div_out(m.dtype))
    return _binary_infer(f"div_{rounding_mode}", bool_ok=False)(a, b)


def _check_int_zero(b):
    if (np.asarray(b) == 0).any():
        raise RuntimeError("ZeroDivisionError")


def _div_kernel(a, b, rounding_mode=None):
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
        ct = D.get_default_dtype().np  # true division of integers: in the float result type
    with np.errstate(all="ignore"):
        return _down(_div_kernel(*_operands([a, b], ct), rounding_mode=rounding_mode), ct)


def _div_grad(ctx, g):
    a, b = ctx.inputs
    if ctx.attrs.get("rounding_mode"):
        return _reduce_pair(ctx, g * 0, g * 0)
    need = ctx.needs_input_grad
    return _reduce_pair(ctx, g / b if need[0] else None,
                        -g * a / (b * b) if need[1] else None)


_DIV = defop("div", _div_infer, _div_float_kernel, grad=_div_grad, promote=True)
_DIV.inplace_kernels["cpu"] = _inplace_kernel(
    lambda t, a, b, rounding_mode=None: np.copyto(
        t, _div_float_kernel(a, b, rounding_mode), casting="unsafe"))


FAST_OPERATORS["__truediv__"] = (_DIV, {"rounding_mode": None})


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


_REMAINDER = defop("remainder", _binary_infer("remainder", bool_ok=False),
                   _kernel(_remainder_kernel), grad=_mod_grad("remainder"), promote=True)
_FMOD = defop("fmod", _binary_infer("fmod", bool_ok=False, scalar_first=False),
              _kernel(_fmod_kernel), grad=_mod_grad("fmod"), promote=True)
for _op, _k in ((_REMAINDER, _remainder_kernel), (_FMOD, _fmod_kernel)):
    _op.inplace_kernels["cpu"] = _inplace_kernel(
        lambda t, a, b, k=_k: np.copyto(t, _kernel(k)(a, b), casting="unsafe"))


@_public
def remainder(input, other, *, out=None):
    """Python's ``%``: the result has the sign of the divisor."""
    return call(_REMAINDER, input, other, out=out)


@_public
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
            gb = where((a == 0) & (b >= 0), 0.0, g * (out * _u("log")(a)))
    return _reduce_pair(ctx, ga, gb)


_POW = defop("pow", _pow_infer, _kernel(_pow_kernel), grad=_pow_grad, promote=True)
_POW.inplace_kernels["cpu"] = _inplace_kernel(
    lambda t, a, b: np.copyto(t, _kernel(_pow_kernel)(a, b), casting="unsafe"))


@_public
def pow(input, exponent, *, out=None):
    """``input ** exponent``."""
    return call(_POW, input, exponent, out=out)


@_public
def float_power(input, exponent, *, out=None):
    """``pow`` computed in float64."""
    x = input.double() if isinstance(input, Tensor) else float(input)
    e = exponent.double() if isinstance(exponent, Tensor) else float(exponent)
    return pow(x, e, out=out)


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


def _tensors_op(name, kernel, grad, **kw):
    return defop(name, _binary_infer(name, tensors=True, **kw), _kernel(kernel), grad=grad,
                 promote=True)


_MAXIMUM = _tensors_op("maximum", np.maximum, _minmax_grad(lambda a, b: a > b,
                                                           lambda a, b: a < b))
_MINIMUM = _tensors_op("minimum", np.minimum, _minmax_grad(lambda a, b: a < b,
                                                           lambda a, b: a > b))
_FMAX = _tensors_op("fmax", np.fmax, _fminmax_grad(lambda a, b: a >= b))
_FMIN = _tensors_op("fmin", np.fmin, _fminmax_grad(lambda a, b: a <= b))


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


_ATAN2 = defop("atan2", _binary_infer("atan2", out_dtype=_div_out, tensors=True),
               _kernel(np.arctan2, float_compute=True), grad=_atan2_grad, promote=True)
_HYPOT = _tensors_op("hypot", np.hypot, _hypot_grad, int_ok=False, bool_ok=False)


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

def _compare(name, kernel, **kw):
    op = defop(name, _binary_infer(name, out_dtype=lambda d: D.bool_, **kw), _kernel(kernel),
               grad=None, promote=True)

    def fn(input, other, *, out=None):
        return call(op, input, other, out=out)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}``; a bool tensor."
    return _public(fn)


eq = _compare("eq", np.equal, scalar_first=False)
ne = _compare("ne", np.not_equal, scalar_first=False)
lt = _compare("lt", np.less, scalar_first=False)
le = _compare("le", np.less_equal, scalar_first=False)
gt = _compare("gt", np.greater, scalar_first=False)
ge = _compare("ge", np.greater_equal, scalar_first=False)
logical_and = _compare("logical_and", np.logical_and, tensors=True)
logical_or = _compare("logical_or", np.logical_or, tensors=True)
logical_xor = _compare("logical_xor", np.logical_xor, tensors=True)
not_equal, less, less_equal, greater, greater_equal = ne, lt, le, gt, ge
__all__ += ["not_equal", "less", "less_equal", "greater", "greater_equal"]


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


def _bitwise(name, kernel):
    base = _binary_infer(name)

    def infer(a, b):
        m = base(a, b)
        if m.dtype.category >= 2:
            raise NotImplementedError(f'"{name}_cpu" not implemented for \'{m.dtype.name}\'')
        return m
    op = defop(name, infer, _kernel(kernel), grad=None, promote=True)

    def fn(input, other, *, out=None):
        return call(op, input, other, out=out)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}`` of integer or bool tensors."
    return _public(fn)


bitwise_and = _bitwise("bitwise_and", np.bitwise_and)
bitwise_or = _bitwise("bitwise_or", np.bitwise_or)
bitwise_xor = _bitwise("bitwise_xor", np.bitwise_xor)
bitwise_left_shift = _bitwise("bitwise_left_shift", _shift(True))
bitwise_right_shift = _bitwise("bitwise_right_shift", _shift(False))


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
    with np.errstate(all="ignore"):
        allowed = ft.type(atol) + np.abs(b.astype(ft) * ft.type(rtol))
        actual = np.abs(a - b)
        actual = actual.astype(ft) if a.dtype in _LOWP else actual
        return close | (np.isfinite(actual) & (actual <= allowed))


_ISCLOSE = defop("isclose", _isclose_infer, _isclose_kernel, grad=None)


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


# the ternary ops live in their own module; re-exported here, where callers look for them
# (and where the grad rules above find ``where`` when they run)
from tessera.ops import ternary as _ternary  # noqa: E402
from tessera.ops.ternary import (  # noqa: E402,F401
    _fill_value,
    _number_or_tensor,
    addcdiv,
    addcmul,
    clamp,
    clamp_max,
    clamp_min,
    clip,
    lerp,
    masked_fill,
    where,
)

__all__ += _ternary.__all__
