"""What the elementwise families share: operand preparation, kernel wrappers, the infer
rules of binary ops, and their cost and SBP rules.

The families are ``unary`` (math functions, rounding, relu), ``arithmetic`` (add ... pow,
maximum, atan2), ``comparison`` (comparisons, logic, bitwise, tests of values) and
``ternary`` (where, lerp, clamp ...). Kernels see their operands through ``_operands``:
Python ints are cast to an integer tensor's dtype with wrap-around (PyTorch casts wrapped
scalars so: ``uint8 + 300`` adds 44), and float16/bfloat16 compute in float32 and round once
(PyTorch's "opmath" type on the CPU).

>>> import numpy as np
>>> _kernel(np.add)(np.array([250], np.uint8), 300)
array([38], dtype=uint8)
"""
from __future__ import annotations

import builtins
import math

import numpy as np

from tessera import _dtype as D
from tessera.ops import cost
from tessera.ops._sbp import pointwise
from tessera.ops._util import broadcast_shapes, dtype_arg, shape_of, sum_to
from tessera.ops.registry import Meta

builtins_abs = builtins.abs  # the families define ``abs`` as the tensor op

# the rules most elementwise ops declare: one operation per output element, and any split
# of the broadcast output (no partial_sum: the op is not linear)
ONE = cost.elementwise(1)
POINTWISE = pointwise()

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


# c10's names of the dtypes, as PyTorch's overflow messages print them
_C_NAMES = {"int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "int32": "int",
            "int64": "int64_t", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
            "float32": "float", "float64": "double", "complex64": "c10::complex<float>",
            "complex128": "c10::complex<double>", "bool": "bool"}


def checked_scalar(v, dt: D.dtype):
    """A Python number as a ``Scalar`` argument of ``dt`` (fill values, clamp bounds): values
    that do not fit raise as PyTorch's checked conversion does. An int must fit 64 bits
    (``OverflowError``, as when PyTorch reads it); then, converted to ``dt``, NaN and inf fit
    only float types, a complex fits a real type only with no imaginary part, and an int
    fits an unsigned type down to -max (it wraps, as ``uint8 - 1`` does)."""
    if isinstance(v, (bool, np.bool_)):
        return v
    if isinstance(v, (int, np.integer)):
        v = int(v)
        if v >= 1 << 64:
            raise OverflowError("int too big to convert")
        if v < -(1 << 63):
            raise OverflowError("can't convert negative int to unsigned")
        bad = _int_overflows(v, dt) if dt.category == 1 else \
            dt.category > 1 and builtins_abs(v) > _float_max(dt)  # (float16's range)
    elif isinstance(v, (float, np.floating)):
        bad = dt is not D.bool_ and _float_overflows(float(v), dt)
    elif isinstance(v, (complex, np.complexfloating)):
        v = complex(v)
        bad = dt is not D.bool_ and (
            (not dt.is_complex and v.imag != 0) or _float_overflows(v.real, dt)
            or _float_overflows(v.imag, dt))
    else:
        return v
    if bad:
        raise RuntimeError(f"value cannot be converted to type {_C_NAMES[dt.name]} without "
                           "overflow")
    return v


def checked_tensor_scalar(value, dt: np.dtype):
    """A 0-d array passed where PyTorch takes a ``Scalar`` (``masked_fill``'s and
    ``index_fill``'s value tensor), checked against ``dt`` as ``checked_scalar`` checks a
    number: PyTorch reads such a tensor with ``item()`` first, so a NaN or an out-of-range
    value for an integer tensor raises instead of writing ``INT_MIN``.

    >>> checked_tensor_scalar(np.array(2.5), np.dtype(np.int64))
    array(2.5)
    >>> checked_tensor_scalar(np.array(float("nan")), np.dtype(np.int32))
    Traceback (most recent call last):
    RuntimeError: value cannot be converted to type int without overflow
    """
    if isinstance(value, np.ndarray) and value.size == 1:
        kind = value.dtype.kind
        v = value.reshape(())[()]
        number = bool(v) if kind == "b" else int(v) if kind in "iu" else \
            complex(v) if kind == "c" else float(v)
        checked_scalar(number, D.from_numpy_dtype(dt))
    return value


def int_bounds(dt: D.dtype) -> tuple[int, int]:
    """(min, max) of an integer dtype, where an unsigned type's min is -max: the ints that
    PyTorch converts to it (negative ones wrap)."""
    bounds = _INT_BOUNDS.get(dt)
    if bounds is None:
        info = np.iinfo(dt.np)
        bounds = _INT_BOUNDS[dt] = (int(info.min) if dt.is_signed else -int(info.max),
                                    int(info.max))
    return bounds


_INT_BOUNDS: dict[D.dtype, tuple[int, int]] = {}


def _int_overflows(v: int, dt: D.dtype) -> bool:
    lo, hi = int_bounds(dt)
    return not lo <= v <= hi


def _float_overflows(v: float, dt: D.dtype) -> bool:
    if dt.category == 1:  # compared as doubles, as c10 does (2.0**63 passes for int64)
        lo, hi = int_bounds(dt)
        return math.isnan(v) or not float(lo if dt.is_signed else 0) <= v <= float(hi)
    return math.isfinite(v) and builtins_abs(v) > _float_max(dt)


def _float_max(dt: D.dtype) -> float:
    if dt is D.bfloat16:
        import ml_dtypes
        return float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    if dt.is_complex:
        dt = D.float32 if dt is D.complex64 else D.float64
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
    dt = D.result_type(*[(D.from_numpy_dtype(v.dtype), v.ndim) if isinstance(v, np.ndarray)
                         else v for v in vals if v is not None]).np
    assert dt is not None  # every dtype of an array has its NumPy dtype
    return dt


def _kernel(fn, float_compute=False):
    """Wrap ``fn(*arrays, **attrs)``: promoted operands (see ``_operands``), quiet inf/nan.
    ``float_compute``: integer operands compute in the default float dtype (div, atan2)."""
    def k(*args, **attrs):
        ct = _np_result_type(*args)
        if float_compute and ct.kind in "biu":
            default = D.get_default_dtype().np
            assert default is not None  # float32 or float64
            ct = default
        return _down(fn(*_operands(args, ct), **attrs), ct)
    k.__name__ = getattr(fn, "__name__", "kernel")
    # what ``k`` reduces to on float32/float64 operands (dispatch's fast path)
    k.plain = fn  # type: ignore[attr-defined]
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


def _need_tensor(name, x, arg="input"):
    if type(x) is not Meta:
        raise TypeError(f"{name}(): argument '{arg}' (position 1) must be Tensor, not "
                        f"{type(x).__name__}")
    return x



# ---- binary ----------------------------------------------------------------------------

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

