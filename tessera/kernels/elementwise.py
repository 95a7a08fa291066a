"""Eager elementwise ops on large tensors through the ops' own C rules.

NumPy runs every ufunc on one core, and some of them slowly (``maximum`` against a scalar,
casts from bool, transcendentals); PyTorch splits elementwise ops of more than 32k elements
over its threads. ``run(op, args, attrs, out)`` does what a compiled graph does for one
fused node, in eager mode: it renders the op's ``to_c`` expression (the same rule the
graph compiler fuses) into a flat vectorised loop over
``[lo, hi)``, compiles it once per (op, operand dtypes, attributes) through the disk cache,
and runs it (on the kernel threads only for very large tensors: see ``PARALLEL_MIN``).
Python numbers among the operands are run-time arguments, so that ``x * 0.5`` and
``x * 0.25`` share a kernel. One vectorised pass replaces NumPy's single-core and
sometimes scalar loops (bench kernels: chain, in eager mode).

It applies only where the flat loop is the whole story: every tensor operand C-contiguous
with the output's shape (no broadcasting), float32/float64 computation, at least
``EAGER_MIN`` elements; anything else returns None and the op's NumPy kernel runs.
``TESSERA_EAGER_C=0`` (or ``TESSERA_CODEGEN=0``) turns it off.

>>> import numpy as np, tessera
>>> x = tessera.from_numpy(np.linspace(-1, 1, EAGER_MIN, dtype=np.float32))
>>> y = tessera.relu(x)           # one C kernel (when a compiler is present)
>>> bool((y.numpy() == np.maximum(x.numpy(), 0)).all())
True
"""
from __future__ import annotations

import ctypes
import os
import re

import numpy as np

from tessera.kernels.c_expr import CType, compute_dtype, is_logical

__all__ = ["run", "EAGER_MIN", "enabled"]

EAGER_MIN = 1 << 15     # elements: PyTorch's grain size; below it NumPy's call is cheaper
# elements: below this one thread runs the whole loop, since handing chunks to the pool
# costs more than it saves on a shorter one-core pass (bench kernels: chain)
PARALLEL_MIN = 1 << 22
_NUMERIC_KEYS = 4       # distinct numeric attribute sets per op that may compile a kernel
_C_NAMES = CType.NAMES  # C's types of the dtypes it takes
_TYPES = {np.dtype(k): k for k in _C_NAMES}

# libm functions GCC does not vectorise
# (and the prelude's pow, whose exponent is a run-time argument here: its libm branch
# stays scalar, while the op's NumPy kernel picks a product or a square root once)
_SCALAR_LIBM = re.compile(
    r"\b(a?sinh?|a?cosh?|a?tanh?|atan2|hypot|exp2|log2|log10|pow|tsr_pow|fmod|fmax|fmin)f?\(")

_KERNELS: dict = {}     # key -> ctypes function, or None (not compilable: NumPy runs)
_NUMERIC: dict = {}     # op name -> count of numeric attribute sets compiled so far
_STATE = [None]         # True/False: forced on or off (tests); None: as the environment says


def enabled() -> bool:
    """Whether eager elementwise ops may run as C kernels: ``TESSERA_EAGER_C`` and
    ``TESSERA_CODEGEN`` not 0 and a C compiler present (read per call: it is reached only
    for large tensors). Without a compiler nothing warns: eager mode keeps NumPy's."""
    if _STATE[0] is not None:
        return _STATE[0]
    from tessera.kernels.cc import compiler
    off = ("0", "", "false", "off")
    return os.environ.get("TESSERA_EAGER_C", "1") not in off and \
        os.environ.get("TESSERA_CODEGEN", "1") not in off and compiler() is not None


def run(op, args, attrs: dict, out) -> np.ndarray | None:
    """``op`` on ``args`` (NumPy arrays and Python numbers) with ``attrs`` into a new array
    of ``out``'s shape and dtype (a Meta) by the op's C rule, or None when the rule does not
    apply here (the caller runs the NumPy kernel). Attributes are baked into the kernel:
    numeric ones count toward a small per-op limit of compiled variants, so an attribute
    that changes every call never compiles more than a few."""
    out_t = out.dtype.name
    if out_t not in _C_NAMES:
        return None
    # NumPy's ufunc is at memory speed when every operand has the output's dtype: a C loop
    # gains nothing there and its call costs more (bench kernels: triad, the eager column)
    if "numpy_fast" in op.traits:
        dts = {a.dtype for a in args if type(a) is np.ndarray}
        if len(dts) == 1 and (out_t == "bool" or out.dtype.np in dts):
            return None
    shape = out.shape
    ptrs: list[int | float | None]  # the output's address first, then each operand's
    kinds: list[str | None]
    ptrs, kinds = [None], []
    for a in args:
        if type(a) is np.ndarray:
            t = _TYPES.get(a.dtype)
            if t is None or a.shape != shape or not a.flags.c_contiguous:
                return None
            ptrs.append(a.ctypes.data)
            kinds.append(t)
        elif a is None:
            kinds.append(None)
        elif type(a) in (float, int, bool):
            ptrs.append(float(a))
            kinds.append(type(a).__name__)
        else:
            return None
    akey: tuple = ()
    if attrs:
        akey = tuple(sorted(attrs.items()))
        try:
            hash(akey)
        except TypeError:
            return None
    key = (op.name, tuple(kinds), out_t, akey)
    f = _KERNELS.get(key, False)
    if f is False:
        if any(type(v) in (int, float) for _, v in akey):
            if _NUMERIC.get(op.name, 0) >= _NUMERIC_KEYS:
                return None
            _NUMERIC[op.name] = _NUMERIC.get(op.name, 0) + 1
        f = _KERNELS[key] = _compile(op, kinds, out_t, attrs)
    if f is None:
        return None
    res = np.empty(shape, out.dtype.np)
    ptrs[0] = res.ctypes.data
    n = res.size
    if n < PARALLEL_MIN:
        f(*ptrs, 0, n)
    else:
        from tessera.kernels.threadpool import split_call
        split_call(f, tuple(ptrs), n, 1 << 62)
    return res


def source(op, kinds, out_t: str, attrs: dict) -> str | None:
    """The C function ``tsr_e`` computing ``op`` element by element: ``kinds`` are the
    operands' dtype names (arrays), ``"float"``/``"int"``/``"bool"`` (Python numbers,
    passed as doubles) or None; None when the rule does not apply."""
    tensor_dtypes = [k for k in kinds if k in _C_NAMES]
    float_scalar = "float" in kinds
    ct = compute_dtype(op, tensor_dtypes, out_t, float_scalar)
    if ct not in ("float32", "float64") or is_logical(op) or op.name == "cast":
        return None
    c = CType(ct)
    params = [f"{CType.NAMES[out_t]}* restrict out"]
    args: list[str | None]
    loads, args = [], []
    arrays = scalars = 0
    for k in kinds:
        if k is None:
            args.append(None)
        elif k in CType.NAMES:
            v = f"v{arrays}"
            params.append(f"const {CType.NAMES[k]}* restrict in{arrays}")
            loads.append(f"{c.T} {v} = ({c.T})in{arrays}[i];")
            args.append(v)
            arrays += 1
        else:
            params.append(f"double s{scalars}")
            args.append(f"(({c.T})s{scalars})")
            scalars += 1
    try:
        expr = op.to_c(c, args, attrs)
    except Exception:  # a rule that needs what eager calls do not give (a literal)
        return None
    if _SCALAR_LIBM.search(expr):  # NumPy's SIMD loop beats a scalar libm call per element
        return None
    body = " ".join(loads + [f"out[i] = ({CType.NAMES[out_t]})({expr});"])
    return (f"void tsr_e({', '.join(params)}, int64_t lo, int64_t hi) {{\n"
            f"  #pragma omp simd\n"
            f"  for (int64_t i = lo; i < hi; i++) {{ {body} }}\n"
            f"}}\n")


def _compile(op, kinds, out_t: str, attrs: dict):
    from tessera.kernels import cc
    from tessera.kernels.prelude import PRELUDE
    text = source(op, kinds, out_t, attrs)
    if text is None:
        return None
    try:
        lib = cc.load(PRELUDE + text)
    except Exception:  # a broken toolchain or a rule rendered wrongly: NumPy's kernel runs
        return None
    f = lib.tsr_e
    f.argtypes = [ctypes.c_void_p] + [ctypes.c_void_p if k in _C_NAMES else ctypes.c_double
                                      for k in kinds if k is not None] + [ctypes.c_int64] * 2
    f.restype = None
    return f
