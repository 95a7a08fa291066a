"""Tessera's own float32 matrix product (``c/gemm.c``), with no NumPy or BLAS underneath:
the building block of a compiled model's dependency-free C library and of fused linear
layers.

``gemm(a, b)`` is ``alpha * op(a) @ op(b) + beta * out``, then a fused epilogue on each
tile while it is in cache: ``bias`` (one value per column, or per row with
``bias_rows=True``: a convolution's output channels), ``activation`` (``"relu"``,
``"relu6"``, ``"clamp"`` to ``bounds``, ``"silu"``, ``"gelu"``, ``"gelu_tanh"``) and
``residual`` (added after the activation, or before it with ``residual_first=True``).
``pack_b`` packs a constant right operand (a weight) once into the micro-kernel's panel
layout, and ``gemm_packed`` multiplies by it as often as needed. Any 2-d float32 view
is read in place (a transpose swaps the strides).

The micro-kernel is picked from the CPU when the library loads: AVX-512, AVX2 with FMA, or
portable C (``isa()`` says which), the widest within ``TESSERA_MAX_ISA`` (``cc.max_isa()``).
``TESSERA_GEMM_ISA=avx512|avx2|portable`` forces one; naming one the CPU lacks, or one above
the cap, raises RuntimeError (never an illegal instruction). The library is
compiled for baseline x86-64 and each micro-kernel for its own instruction set, as a
deployed C library is, so the same binary would run on any x86-64.

Threads: the blocks of the output (``MC`` rows by ``NC`` columns) are the parts of one job
of ``tessera.kernels.threadpool``; a ``b`` that several blocks of rows share is packed
once, in parallel, first. A product of at most 4 rows (batch-1 inference) is a GEMV: ``b``
streams once from where it lies (packed panels, rows, or a transposed weight's rows read
as dot products), never packed per call, the threads splitting its columns. The result
depends neither on the thread count nor on whether ``b`` was packed beforehand (each
element sums its products in the same order).

>>> import numpy as np
>>> a = np.arange(6, dtype=np.float32).reshape(2, 3)
>>> w = np.ones((4, 3), np.float32)              # a linear layer's weight (out, in)
>>> gemm(a, w, trans_b=True, bias=np.arange(4, dtype=np.float32), activation="relu")
array([[ 3.,  4.,  5.,  6.],
       [12., 13., 14., 15.]], dtype=float32)
>>> packed = pack_b(w, trans_b=True)
>>> np.array_equal(gemm_packed(a, packed), a @ w.T)
True
>>> isa() in ISAS
True
"""
from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

from tessera._runtime import threads as _runtime_threads
from tessera.kernels import threadpool
from tessera.kernels.csource import source

__all__ = ["gemm", "gemm_into", "pack_b", "gemm_packed", "PackedB", "isa", "available", "ISAS",
           "ACTIVATIONS", "default_threads"]

ISAS = ("portable", "avx2", "avx512")          # c/gemm.h's TSR_GEMM_* in order
ACTIVATIONS = {None: 0, "relu": 1, "gelu_tanh": 2, "gelu": 3, "clamp": 4, "silu": 5,
               "relu6": 4}   # TSR_ACT_*; relu6 is clamp to [0, 6]
_RESIDUAL_FIRST, _BIAS_ROWS = 1, 8
_F32 = np.dtype(np.float32)


class _Gemm(ctypes.Structure):
    """c/gemm.h's ``tsr_gemm_t``."""
    _fields_ = [("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("a", ctypes.c_void_p), ("rsa", ctypes.c_int64), ("csa", ctypes.c_int64),
                ("b", ctypes.c_void_p), ("rsb", ctypes.c_int64), ("csb", ctypes.c_int64),
                ("bp", ctypes.c_void_p), ("c", ctypes.c_void_p), ("ldc", ctypes.c_int64),
                ("bias", ctypes.c_void_p), ("r", ctypes.c_void_p), ("ldr", ctypes.c_int64),
                ("alpha", ctypes.c_float), ("beta", ctypes.c_float),
                ("act", ctypes.c_int32), ("flags", ctypes.c_int32), ("isa", ctypes.c_int32),
                ("path", ctypes.c_int32),
                ("mc", ctypes.c_int64), ("kc", ctypes.c_int64), ("nc", ctypes.c_int64),
                ("lo", ctypes.c_float), ("hi", ctypes.c_float)]


@functools.lru_cache(maxsize=1)
def _lib():
    from tessera.kernels.cc import load_dispatching
    P, I, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    return load_dispatching(source("gemm_py.c"), (
        ("tsr_gemm_isa_supported", [i32], i32), ("tsr_gemm_isa_best", [], i32),
        ("tsr_gemm_mr", [i32], i32), ("tsr_gemm_nr", [i32], i32),
        ("tsr_gemm_packed_size", [i32, I, I], I),
        ("tsr_gemm_pack_b_range", [i32, I, I, P, I, I, P, I, I], i32),
        ("tsr_gemm_plan", [P, i32], I), ("tsr_gemm_range", [P, I, I], I),
        ("tsr_gemm_run", [P], i32), ("tsr_gemm_exec", [P, i32, P], I),
        ("tsr_gemm_py_setup", [P, P], None), ("tsr_gemm_py_probe", [P, P], None),
        # every parameter as c_void_p, ``how`` (an int64) included: ctypes converts an int
        # to it in half the time it takes for c_int64, a fair part of a batch-1 call
        ("tsr_gemm_py", [P, P, P, P], I), ("tsr_gemm_py_b", [P, P, P, P, P], I)))


def available() -> bool:
    """Whether the GEMM library can be built here (code generation on, a C compiler).

    >>> isinstance(available(), bool)
    True
    """
    from tessera import kernels
    if not kernels.enabled():
        return False
    try:
        _lib()
    except Exception:  # a broken toolchain
        return False
    return True


def select_isa(variable: str, best, supported) -> int:
    """The index in ``ISAS`` of the path a kernel family runs: ``$variable`` if set (ValueError
    for an unknown name, RuntimeError when the CPU lacks it or ``TESSERA_MAX_ISA`` excludes
    it), else the widest path the CPU runs (``best()``) within ``TESSERA_MAX_ISA``;
    ``supported(i)`` asks the family's library. Shared by the families compiled per ISA (GEMM,
    attention), whose ``ISAS`` are ``cc.ISA_LEVELS``."""
    from tessera.kernels.cc import max_isa
    cap = ISAS.index(max_isa())
    forced = os.environ.get(variable, "")
    if not forced:
        index = min(int(best()), cap)
        while index > 0 and not supported(index):
            index -= 1
        return index
    if forced not in ISAS:
        raise ValueError(f"{variable}={forced!r}: expected one of {', '.join(ISAS)}")
    index = ISAS.index(forced)
    if not supported(index):
        need = {"avx2": "AVX2 and FMA", "avx512": "AVX-512F"}[forced]
        raise RuntimeError(f"{variable}={forced}: this CPU (or its OS) lacks {need}; "
                           f"it runs {ISAS[best()]}")
    if index > cap:
        raise RuntimeError(f"{variable}={forced}: TESSERA_MAX_ISA={ISAS[cap]} excludes it")
    return index


@functools.lru_cache(maxsize=1)
def _isa() -> int:
    lib = _lib()
    return select_isa("TESSERA_GEMM_ISA", lib.tsr_gemm_isa_best, lib.tsr_gemm_isa_supported)


def isa() -> str:
    """The micro-kernel in use: ``"avx512"``, ``"avx2"`` or ``"portable"`` (the fastest the
    CPU runs within ``TESSERA_MAX_ISA``, unless ``TESSERA_GEMM_ISA`` names another).

    >>> isa() in ("avx512", "avx2", "portable")
    True
    """
    return ISAS[_isa()]


def _probe_data_offset() -> int | None:
    """Where an ndarray keeps its data pointer within its object: ``PyArrayObject_fields``'
    ``data``, right after the object header. Reading it there (``_address``) costs a tenth
    of ``x.ctypes.data``, which is most of a batch-1 product's call otherwise. None (use
    ``ctypes.data``) when probes disagree, as on an interpreter of another layout."""
    off = object.__basicsize__
    try:
        base = np.arange(12, dtype=_F32).reshape(3, 4)
        for x in (base, base[1:, 2:], base.T, np.empty(0, _F32)):
            if ctypes.c_void_p.from_address(id(x) + off).value != x.ctypes.data:
                return None
    except (ValueError, OverflowError):
        return None
    return off


_DATA_OFFSET = _probe_data_offset()
_VOID_P = ctypes.c_void_p


def _address(x: np.ndarray) -> int:
    """The address of ``x``'s first element."""
    if _DATA_OFFSET is None:
        return x.ctypes.data
    return _VOID_P.from_address(id(x) + _DATA_OFFSET).value or 0


def _aligned(floats: int) -> np.ndarray:
    """An uninitialised float32 array, 64-byte aligned (the micro-kernels' aligned loads)."""
    raw = np.empty(max(floats, 1) + 16, _F32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip:skip + max(floats, 1)]


def _strided(x, name: str, fn: str) -> tuple[np.ndarray, int, int]:
    """(``x`` as float32 2-d, its row stride, its column stride) in elements."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{fn}: {name} must be a NumPy array, got {type(x).__name__}")
    if x.dtype is not _F32 and x.dtype != _F32:
        raise TypeError(f"{fn}: {name} must be float32, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{fn}: {name} must be 2-d, got shape {x.shape}")
    rs, cs = x.strides
    if rs % 4 or cs % 4:
        x = np.ascontiguousarray(x)
        rs, cs = x.strides
    return x, rs // 4, cs // 4


def _template(isa_index: int, k: int = 0, n: int = 0, bp: int = 0) -> _Gemm:
    g = _Gemm()
    g.k, g.n, g.bp, g.isa, g.alpha = k, n, bp, isa_index, 1.0
    return g


@functools.cache
def _plain(isa_index: int) -> int:
    """The address of the template of ``gemm``'s plain products (B from the call)."""
    g = _PLAIN[isa_index] = _template(isa_index)
    return ctypes.addressof(g)


_PLAIN: dict = {}   # isa index -> its template, kept alive


_FAST: list = []   # _fast()'s answer, until the thread count changes


def _fast() -> list:
    """[``tsr_gemm_py``, ``tsr_gemm_py_b`` (``c/gemm_py.c``), ``how`` for the default thread
    count], or [None] when they cannot be used: no C pool (the general path runs the threads
    in Python then), or NumPy arrays whose object headers they would misread
    (``tsr_gemm_py_probe`` checked against what NumPy says of a few arrays)."""
    if _FAST:
        return _FAST
    lib, pool = _lib(), threadpool._lib()
    _FAST[:] = [None]
    if pool is None:
        return _FAST
    got = (ctypes.c_int64 * 7)()
    base = np.arange(24, dtype=_F32).reshape(4, 6)
    for x in (base, base[1:, 2:], base.T, base[::2, ::-3], np.empty((0, 3), _F32),
              np.empty(5, _F32), np.ones((2, 3))):
        lib.tsr_gemm_py_probe(id(x), got)
        two = x.ndim == 2
        want = (x.ctypes.data, x.ndim, *(x.shape if two else (-1, -1)),
                *(x.strides if two else (-1, -1)), id(x.dtype))
        if tuple(got) != want:
            return _FAST
    lib.tsr_gemm_py_setup(id(_F32), pool.run_address)
    _FAST[:] = [lib.tsr_gemm_py, lib.tsr_gemm_py_b, 4 * threadpool.c_pool()[1]]
    return _FAST


_runtime_threads.on_change(_FAST.clear)


def _how(fast: list, threads: int | None, trans_a: bool, trans_b: bool = False) -> int:
    """``tsr_gemm_py``'s ``how``: the thread count (at most the kernel threads whose workers
    run), then trans_a and trans_b as bits."""
    how = fast[2] if threads is None else 4 * min(_threads(threads), fast[2] // 4)
    return how + (2 if trans_a else 0) + (1 if trans_b else 0)


class PackedB:
    """A right operand ``b`` (k x n) packed once into the panel layout of the micro-kernel
    in use; ``gemm_packed`` multiplies by it. Keeps no reference to the original.

    >>> w = np.ones((8, 5), np.float32)
    >>> pack_b(w, trans_b=True).shape
    (5, 8)
    """

    def __init__(self, data: np.ndarray, k: int, n: int, isa_index: int):
        self.data, self.k, self.n, self.isa_index = data, k, n, isa_index
        self.address = _address(data)
        # the product by this b, all but A and C filled in, as tsr_gemm_py copies it
        self._template = _template(isa_index, k, n, self.address)
        self.template = ctypes.addressof(self._template)

    @property
    def shape(self) -> tuple[int, int]:
        """(k, n): the shape of op(b), the matrix multiplied by."""
        return self.k, self.n

    def __repr__(self) -> str:
        return f"PackedB(k={self.k}, n={self.n}, isa={ISAS[self.isa_index]!r})"


def pack_b(b: np.ndarray, trans_b: bool = False, threads: int | None = None) -> PackedB:
    """``b`` (or ``b.T`` with ``trans_b``, as for a weight of shape (out, in)) packed for
    ``gemm_packed``: worth it when the same ``b`` multiplies many times (inference weights).

    >>> w = np.arange(12, dtype=np.float32).reshape(3, 4)
    >>> p = pack_b(w)
    >>> np.array_equal(gemm_packed(np.eye(3, dtype=np.float32), p), w)
    True
    """
    b, rs, cs = _strided(b, "b", "pack_b")
    if trans_b:
        rs, cs = cs, rs
    k, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    return PackedB(_pack(b, rs, cs, k, n, _threads(threads)), k, n, _isa())


def _pack(b: np.ndarray, rs: int, cs: int, k: int, n: int, threads: int) -> np.ndarray:
    lib, index = _lib(), _isa()
    data = _aligned(int(lib.tsr_gemm_packed_size(index, k, n)))
    panels = -(-n // int(lib.tsr_gemm_nr(index)))
    args = (index, k, n, b.ctypes.data, rs, cs, data.ctypes.data)
    if threads > 1 and panels > 1 and k * n >= 1 << 16:
        from tessera.kernels.threadpool import fork_join
        parts = min(threads, panels)
        cut = [panels * i // parts for i in range(parts + 1)]
        fork_join(lib.tsr_gemm_pack_b_range, [(*args, lo, hi) for lo, hi in zip(cut, cut[1:])])
    else:
        lib.tsr_gemm_pack_b_range(*args, 0, panels)
    return data


def default_threads() -> int:
    """The threads a product uses when ``threads`` is not given (``tessera.get_num_threads``,
    read once per setting).

    >>> default_threads() >= 1
    True
    """
    return _threads(None)


def _threads(threads: int | None) -> int:
    if threads is None:
        return threadpool._threads()
    if threads.__class__ is int and threads >= 1:
        return threads
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"gemm: threads must be a positive integer, got {threads!r}")
    return threads


def gemm(a: np.ndarray, b: np.ndarray, *, trans_a: bool = False, trans_b: bool = False,
         alpha: float = 1.0, beta: float = 0.0, bias: np.ndarray | None = None,
         activation: str | None = None, residual: np.ndarray | None = None,
         residual_first: bool = False, out: np.ndarray | None = None,
         threads: int | None = None, bias_rows: bool = False,
         bounds: tuple[float, float] | None = None) -> np.ndarray:
    """``act(alpha * op(a) @ op(b) + beta * out + bias) + residual`` in float32 (the
    residual inside the activation with ``residual_first``), written into ``out`` when
    given (``beta`` scales its old value, which is not read when ``beta`` is 0), else into a
    new array. ``op(x)`` is ``x.T`` when ``trans_x``. ``bias`` has one value per column,
    or per row with ``bias_rows``; ``activation="clamp"`` clamps to ``bounds`` (lo, hi).
    ``threads``: at most this many (default: ``tessera.get_num_threads()``).

    >>> x = np.ones((2, 3), np.float32)
    >>> gemm(x, np.full((3, 2), -1, np.float32), activation="relu",
    ...      residual=np.ones((2, 2), np.float32))
    array([[1., 1.],
           [1., 1.]], dtype=float32)
    """
    if (a.__class__ is np.ndarray and b.__class__ is np.ndarray and alpha == 1.0 and not beta
            and bias is None and activation is None and residual is None and out is None
            and a.ndim == 2 and b.ndim == 2 and (fast := _FAST or _fast())[0] is not None):
        # the plain product in one C call (gemm_py.c), or 1 when it is not one it takes
        c = np.empty((a.shape[1 if trans_a else 0], b.shape[0 if trans_b else 1]), _F32)
        code = fast[1](_plain(_isa()), id(a), id(b), id(c), _how(fast, threads, trans_a, trans_b))
        if code == 0:
            return c
        _raise_code(code, c.shape[0], c.shape[1], a.shape[0 if trans_a else 1])
    b, rsb, csb = _strided(b, "b", "gemm")
    if trans_b:
        rsb, csb = csb, rsb
    kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    return _run("gemm", a, trans_a, (b, rsb, csb), None, kb, n, alpha, beta, bias,
                activation, residual, residual_first, out, threads, bias_rows, bounds)


def gemm_into(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``out[...] = a @ b`` for 2-d float32 ``a`` and ``b`` of any strides (a transposed
    view is read in place, never copied): a compiled graph's matrix products.

    >>> a = np.arange(6, dtype=np.float32).reshape(2, 3)
    >>> out = np.empty((3, 3), np.float32)
    >>> gemm_into(out, a.T, a)
    >>> np.array_equal(out, a.T @ a)
    True
    """
    gemm(a, b, out=out)


def gemm_packed(a: np.ndarray, packed: PackedB, *, trans_a: bool = False, alpha: float = 1.0,
                beta: float = 0.0, bias: np.ndarray | None = None,
                activation: str | None = None, residual: np.ndarray | None = None,
                residual_first: bool = False, out: np.ndarray | None = None,
                threads: int | None = None, bias_rows: bool = False,
                bounds: tuple[float, float] | None = None) -> np.ndarray:
    """``gemm(a, b, ...)`` with ``b`` packed beforehand by ``pack_b``.

    >>> w = np.ones((3, 2), np.float32)
    >>> gemm_packed(np.ones((1, 3), np.float32), pack_b(w), bias=np.ones(2, np.float32))
    array([[4., 4.]], dtype=float32)
    """
    if (a.__class__ is np.ndarray and packed.__class__ is PackedB and alpha == 1.0 and not beta
            and bias is None and activation is None and residual is None and out is None
            and a.ndim == 2 and packed.isa_index == _isa()
            and (fast := _FAST or _fast())[0] is not None):
        # the plain product in one C call (gemm_py.c), or 1 when it is not one it takes
        c = np.empty((a.shape[1 if trans_a else 0], packed.n), _F32)
        code = fast[0](packed.template, id(a), id(c),
                       fast[2] if threads is None and not trans_a else _how(fast, threads, trans_a))
        if code == 0:
            return c
        _raise_code(code, c.shape[0], packed.n, packed.k)
    if not isinstance(packed, PackedB):
        raise TypeError(f"gemm_packed: expected a PackedB from pack_b, got "
                        f"{type(packed).__name__}")
    if packed.isa_index != _isa():
        raise ValueError(f"gemm_packed: b was packed for {ISAS[packed.isa_index]}, but the "
                         f"GEMM runs {isa()}; pack it again")
    return _run("gemm_packed", a, trans_a, None, packed, packed.k, packed.n, alpha, beta,
                bias, activation, residual, residual_first, out, threads, bias_rows, bounds)


def _run(fn: str, a, trans_a: bool, bview, packed: PackedB | None, kb: int, n: int,
         alpha: float, beta: float, bias, activation, residual, residual_first: bool,
         out, threads, bias_rows: bool = False, bounds=None) -> np.ndarray:
    a, rsa, csa = _strided(a, "a", fn)
    if trans_a:
        rsa, csa = csa, rsa
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    if k != kb:
        raise RuntimeError(f"{fn}: mat1 and mat2 shapes cannot be multiplied ({m}x{k} and "
                           f"{kb}x{n})")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{fn}: activation must be one of "
                         f"{', '.join(map(repr, ACTIVATIONS))}, got {activation!r}")
    if activation == "relu6":
        bounds = (0.0, 6.0)
    elif activation == "clamp":
        if bounds is None or len(bounds) != 2:
            raise ValueError(f"{fn}: activation 'clamp' needs bounds=(lo, hi), got {bounds!r}")
    # fields set one by one, the zero ones left: a batch-1 product takes microseconds, and
    # the keyword constructor alone costs one
    g = _Gemm()
    g.m, g.n, g.k, g.rsa, g.csa, g.isa = m, n, k, rsa, csa, _isa()
    g.a = _address(a)
    if alpha != 0:
        g.alpha = alpha
    if beta != 0:
        g.beta = beta
    if activation is not None:
        g.act = ACTIVATIONS[activation]
        if activation in ("clamp", "relu6"):
            g.lo, g.hi = bounds
    if residual_first or bias_rows:
        g.flags = (_RESIDUAL_FIRST if residual_first else 0) | (_BIAS_ROWS if bias_rows else 0)
    keep = [a]   # the arrays the structure points into
    if packed is not None:
        g.bp = packed.address
    else:
        b, g.rsb, g.csb = bview
        g.b = _address(b)
        keep.append(b)
    if bias is not None:
        bias = np.ascontiguousarray(_checked(bias, (m,) if bias_rows else (n,), "bias", fn))
        g.bias = _address(bias)
        keep.append(bias)
    if residual is not None:
        r = np.broadcast_to(_checked(residual, None, "residual", fn), (m, n))
        if r.strides[1] != 4 or r.strides[0] % 4:
            r = np.ascontiguousarray(r)
        g.r, g.ldr = _address(r), r.strides[0] // 4
        keep.append(r)
    c = _output(out, m, n, beta, fn)
    g.c, g.ldc = _address(c), c.strides[0] // 4
    _execute(g, packed is None, (b if packed is None else None), _threads(threads))
    if out is not None and c is not out:
        out[...] = c
        return out
    return c


def _checked(x, shape, name: str, fn: str) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != _F32:
        raise TypeError(f"{fn}: {name} must be a float32 NumPy array, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if shape is not None and x.shape != shape:
        raise ValueError(f"{fn}: {name} must have shape {shape}, got {x.shape}")
    return x


def _output(out, m: int, n: int, beta: float, fn: str) -> np.ndarray:
    """The array the C writes: ``out`` itself when its rows are contiguous, else a copy."""
    if out is None:
        if beta != 0:
            raise ValueError(f"{fn}: beta={beta} scales out, but no out was given")
        return np.empty((m, n), _F32)
    _checked(out, (m, n), "out", fn)
    if out.strides[1] == 4 and out.strides[0] % 4 == 0 and out.flags.writeable:
        return out
    return np.ascontiguousarray(out) if beta != 0 else np.empty((m, n), _F32)


def _execute(g: _Gemm, unpacked: bool, b, threads: int) -> None:
    lib = _lib()
    if threads < 2:
        _raise(lib.tsr_gemm_run(ctypes.byref(g)), g)
        return
    blocks = int(lib.tsr_gemm_plan(ctypes.byref(g), threads))
    addr = ctypes.addressof(g)
    if threads < 2 or blocks < 2:
        _raise(lib.tsr_gemm_range(addr, 0, blocks), g)
        return
    packed = None
    if unpacked and -(-g.m // g.mc) > 1:
        # blocks of the same columns would each pack them: pack b once, in parallel
        packed = _pack(b, g.rsb, g.csb, g.k, g.n, threads)
        g.bp = packed.ctypes.data
    code = threadpool.run_blocks(lib.tsr_gemm_range, addr, blocks, threads)
    if code is None:   # no C pool: Python threads
        for r in threadpool.fork_join(lib.tsr_gemm_range,
                                      [(addr, i, i + 1) for i in range(blocks)]):
            _raise(r, g)
    else:
        _raise(code, g)


def _raise(code: int, g: _Gemm) -> None:
    _raise_code(code, g.m, g.n, g.k)


def _raise_code(code: int, m: int, n: int, k: int) -> None:
    """Nothing for 0 (done) and 1 (``tsr_gemm_py`` did not take the call), else the error."""
    if code == -2:
        raise MemoryError(f"gemm: no memory for the scratch of a {m}x{n}x{k} product")
    if code and code != 1:
        raise RuntimeError(f"gemm: the C library refused the product ({code})")
