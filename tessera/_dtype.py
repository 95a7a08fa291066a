"""Data types and PyTorch's type-promotion rules, as one table.

>>> import tessera
>>> tessera.promote_types(tessera.uint8, tessera.int8)
tessera.int16
"""
from __future__ import annotations

import numpy as np

try:  # bfloat16 comes from ml_dtypes, which registers it with NumPy
    import ml_dtypes

    _BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a declared dependency
    _BF16 = None

# category order: bool < integer < floating < complex (PyTorch's promotion tiers)
_BOOL, _INT, _FLOAT, _COMPLEX = 0, 1, 2, 3


class dtype:
    """A tensor element type, e.g. ``tessera.float32``. Compared by identity."""

    __slots__ = ("name", "np", "itemsize", "category", "is_signed", "_rank")

    def __init__(self, name: str, np_dtype: np.dtype | None, category: int, is_signed: bool,
                 rank: int):
        self.name = name
        self.np = np_dtype
        self.itemsize = np_dtype.itemsize if np_dtype is not None else 2
        self.category = category
        self.is_signed = is_signed
        self._rank = rank

    @property
    def is_floating_point(self) -> bool:
        return self.category == _FLOAT

    @property
    def is_complex(self) -> bool:
        return self.category == _COMPLEX

    def to_complex(self) -> dtype:
        return complex128 if self is float64 else complex64

    def to_real(self) -> dtype:
        return float64 if self is complex128 else float32 if self is complex64 else self

    def __repr__(self) -> str:
        return f"tessera.{self.name}"

    def __reduce__(self):  # pickles as the singleton it is
        return (_by_name, (self.name,))


bool_ = dtype("bool", np.dtype(np.bool_), _BOOL, False, 0)
uint8 = dtype("uint8", np.dtype(np.uint8), _INT, False, 1)
int8 = dtype("int8", np.dtype(np.int8), _INT, True, 1)
int16 = dtype("int16", np.dtype(np.int16), _INT, True, 2)
int32 = dtype("int32", np.dtype(np.int32), _INT, True, 3)
int64 = dtype("int64", np.dtype(np.int64), _INT, True, 4)
float16 = dtype("float16", np.dtype(np.float16), _FLOAT, True, 1)
bfloat16 = dtype("bfloat16", _BF16, _FLOAT, True, 1)
float32 = dtype("float32", np.dtype(np.float32), _FLOAT, True, 2)
float64 = dtype("float64", np.dtype(np.float64), _FLOAT, True, 3)
complex64 = dtype("complex64", np.dtype(np.complex64), _COMPLEX, True, 1)
complex128 = dtype("complex128", np.dtype(np.complex128), _COMPLEX, True, 2)

ALL = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64,
       complex64, complex128)
_NAMES = {d.name: d for d in ALL}
_ALIASES = {"half": float16, "float": float32, "double": float64, "short": int16,
            "int": int32, "long": int64, "cfloat": complex64, "cdouble": complex128}
_FROM_NP = {d.np: d for d in ALL if d.np is not None}


# quantized types (PyTorch's qint8, quint8, qint32): the element type of a quantized
# tensor's integer values, which mean ``(q - zero_point) * scale``. They take no part in
# promotion: arithmetic on quantized tensors goes through the quantized ops
# (``tessera.ops.quantized``), which read and write their integer representation.
qint8 = dtype("qint8", np.dtype(np.int8), _INT, True, 1)
quint8 = dtype("quint8", np.dtype(np.uint8), _INT, False, 1)
qint32 = dtype("qint32", np.dtype(np.int32), _INT, True, 3)
QUANTIZED = (qint8, quint8, qint32)
_NAMES.update({d.name: d for d in QUANTIZED})


def _by_name(name: str) -> dtype:
    return _NAMES[name]


def from_numpy_dtype(npd: np.dtype) -> dtype:
    """The tessera dtype of a NumPy dtype; TypeError for ones tessera lacks (e.g. uint32)."""
    try:
        return _FROM_NP[np.dtype(npd)]
    except KeyError:
        raise TypeError(f"can't convert np.ndarray of type numpy.{np.dtype(npd)}. The only "
                        "supported types are: float64, float32, float16, bfloat16, complex64, "
                        "complex128, int64, int32, int16, int8, uint8, and bool.") from None


def as_dtype(d) -> dtype:
    """Accept a tessera dtype, a NumPy dtype, a name ('float32') or a Python type."""
    if isinstance(d, dtype):
        return d
    if d is float:
        return get_default_dtype()
    if d is int:
        return int64
    if d is bool:
        return bool_
    if d is complex:
        return get_default_dtype().to_complex()
    if isinstance(d, str):
        d = d.removeprefix("torch.").removeprefix("tessera.")
        if d in _NAMES:
            return _NAMES[d]
        if d in _ALIASES:
            return _ALIASES[d]
    try:
        return from_numpy_dtype(np.dtype(d))
    except (TypeError, ValueError):
        raise TypeError(f"{d!r} is not a tessera dtype") from None


def dtype_arg(fn: str, d) -> dtype:
    """The ``dtype=`` argument of the public function ``fn``, checked as PyTorch's argument
    parser checks it: a dtype, or the Python type float (float64), int, bool or complex
    (complex128); anything else (a name, a NumPy dtype) is a ``TypeError``.

    >>> dtype_arg("zeros", float)
    tessera.float64
    >>> dtype_arg("zeros", "float32")
    Traceback (most recent call last):
    TypeError: zeros(): argument 'dtype' must be torch.dtype, not str
    """
    if isinstance(d, dtype):
        return d
    py = _PYTHON_TYPES.get(d) if isinstance(d, type) else None
    if py is None:
        raise TypeError(f"{fn}(): argument 'dtype' must be torch.dtype, not {type_name(d)}")
    return py


_PYTHON_TYPES = {float: float64, int: int64, bool: bool_, complex: complex128}


def type_name(v) -> str:
    """The name of ``v``'s type as PyTorch's messages print it (``str``, ``numpy.bool``)."""
    t = type(v)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


# ---- promotion -------------------------------------------------------------------------

def _promote_pair(a: dtype, b: dtype) -> dtype:
    if a is b:
        return a
    if a.category != b.category:
        hi, lo = (a, b) if a.category > b.category else (b, a)
        if hi.category == _COMPLEX and lo is float64:
            return complex128
        return hi
    if a.category == _INT:
        if a.is_signed != b.is_signed:  # uint8 with a signed int: smallest signed that holds both
            s = a if a.is_signed else b
            return int16 if s is int8 else s
        return a if a._rank >= b._rank else b
    if a.category == _FLOAT:
        if {a, b} == {float16, bfloat16}:
            return float32
        return a if a._rank >= b._rank else b
    return a if a._rank >= b._rank else b


_PROMOTE = {(a, b): _promote_pair(a, b) for a in ALL for b in ALL}


def promote_types(type1: dtype, type2: dtype) -> dtype:
    """The smallest dtype both ``type1`` and ``type2`` convert to (PyTorch's table)."""
    return _PROMOTE[(type1, type2)]


_default = float32


def get_default_dtype() -> dtype:
    """The dtype of Python floats and of float factories; float32 unless set."""
    return _default


def set_default_dtype(d) -> None:
    """Set the default floating dtype (float32 or float64, also float16/bfloat16)."""
    global _default
    d = as_dtype(d)
    if not d.is_floating_point:
        raise TypeError(f"only floating-point types are supported as the default type, got {d}")
    _default = d


def scalar_dtype(x) -> dtype:
    """The dtype PyTorch gives a Python scalar standing alone (``tensor(3.0)``)."""
    if isinstance(x, bool):
        return bool_
    if isinstance(x, int):
        return int64
    if isinstance(x, float):
        return _default
    if isinstance(x, complex):
        return _default.to_complex()
    if isinstance(x, np.generic):
        return from_numpy_dtype(x.dtype)
    raise TypeError(f"expected a number, got {type(x).__name__}")


def result_type(*args) -> dtype:
    """PyTorch's ``result_type`` over tensors (as (dtype, ndim) pairs) and Python scalars.

    Three tiers take part in this order: tensors with dimensions, 0-d tensors, Python
    scalars. A lower tier only matters when its category is higher than the result so far.
    """
    dim_t = zero_t = wrapped = None
    for a in args:
        if a is None:
            continue
        if isinstance(a, tuple):
            d, ndim = a
            if ndim:
                dim_t = d if dim_t is None else _PROMOTE[(dim_t, d)]
            else:
                zero_t = d if zero_t is None else _PROMOTE[(zero_t, d)]
        else:
            d = scalar_dtype(a)
            wrapped = d if wrapped is None else _PROMOTE[(wrapped, d)]
    out = dim_t
    for tier in (zero_t, wrapped):
        if tier is None:
            continue
        if out is None:
            out = tier
        elif tier.category > out.category:
            out = _PROMOTE[(out, tier)]
    if out is None:
        raise TypeError("result_type needs at least one tensor or scalar")
    return out


# ---- numeric limits (torch.finfo / torch.iinfo) ------------------------------------------

class finfo:
    """Limits of a floating dtype: bits, eps, max, min, tiny (smallest_normal), resolution."""

    def __init__(self, type: dtype | None = None):
        dt = get_default_dtype() if type is None else as_dtype(type)
        if dt.category != 2 and dt.category != 3:
            raise TypeError(f"finfo(): expected a floating point dtype, got {dt}")
        info = np.finfo(dt.to_real().np) if dt is not bfloat16 else _bf16_info()
        self.dtype = dt.to_real().name
        self.bits = int(info.bits)
        self.eps = float(info.eps)
        self.max = float(info.max)
        self.min = float(info.min)
        self.tiny = self.smallest_normal = float(info.tiny)
        self.resolution = 10.0 ** -int(info.precision)

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution}, min={self.min}, max={self.max}, "
                f"eps={self.eps}, smallest_normal={self.tiny}, tiny={self.tiny}, "
                f"dtype={self.dtype})")


def _bf16_info():
    import ml_dtypes
    return ml_dtypes.finfo(ml_dtypes.bfloat16)


class iinfo:
    """Limits of an integer dtype: bits, min, max."""

    def __init__(self, type: dtype):
        dt = as_dtype(type)
        if dt.category > 1:
            raise TypeError(f"iinfo(): expected an integer dtype, got {dt}")
        info = np.iinfo(dt.np) if dt is not bool_ else None
        self.dtype = dt.name
        self.bits = 8 if info is None else int(info.bits)
        self.min = 0 if info is None else int(info.min)
        self.max = 1 if info is None else int(info.max)

    def __repr__(self) -> str:
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"
