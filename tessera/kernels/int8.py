"""INT8 matrix products with a fused requantization (``c/int8.c``), and their NumPy reference.

``gemm(a, w, ...)`` computes ``requant(a @ w.T)`` for uint8 activations ``a`` (M x K) and
int8 weights ``w`` (N x K): the int32 sums, less ``a_zp`` times each weight row's sum, plus
an int32 bias, times a float multiplier per output column, rounded half to even, clamped
and shifted by the output's zero point (uint8 or int8 out), or, for dynamic quantization,
``acc * mult + bias`` as float32. ``reference`` is the same computation in NumPy integers,
the definition the C paths are tested against bit for bit.

``conv2d`` is the quantized convolution on the same kernels, NCHW-shaped in and out but
channels-last in memory (as PyTorch's x86 quantized convolution), so that a network's
activations stay NHWC from one layer to the next: each output pixel's columns gathered
from the NHWC input one kernel row or tap at a time (the border its zero point; a 1x1
convolution of stride 1 multiplies the input itself), and the GEMM's epilogue writing NHWC
rows; a depthwise convolution has a kernel of its own (exact int32 sums over the taps,
16 channels a vector). The weights are packed once per array (``forget`` drops them when
they change in place). ``add`` is the quantized sum (in memory order for operands of one
layout).

The instruction set is chosen at run time from the CPU (``isa()``): AMX-INT8 (``tdpbusd``
on tiles, where the CPU has it, the OS grants this process its tile state and the compiler
knows it; ``c/int8_amx.h``), AVX-512 VNNI (``vpdpbusd`` on zmm), AVX-VNNI (on ymm), AVX2
(``vpmaddubsw`` + ``vpmaddwd``: exact, at twice the work for tiles whose activations use
their 8th bit), or portable C. ``TESSERA_INT8_ISA=amx|vnni512|avxvnni|avx2|
c|numpy`` forces one; forcing one this CPU lacks is an error. ``TESSERA_MAX_ISA=avx2``
(``cc.max_isa()``) leaves the AMX and AVX-512 paths out, and ``portable`` all but C and
NumPy. ``amx-emulated`` (forced only, for tests) runs the AMX kernel on a C model of the
tile instructions, on any CPU with AVX-512 VNNI: slow, but the AMX path's arithmetic.

>>> import numpy as np
>>> a = np.arange(6, dtype=np.uint8).reshape(2, 3); w = np.ones((2, 3), np.int8)
>>> gemm(a, w, a_zp=0, mult=np.ones(2, np.float32), out_zp=0).tolist()
[[3, 3], [12, 12]]
"""
from __future__ import annotations

import ctypes
import functools
import os
import weakref

import numpy as np

from tessera.kernels import cc

__all__ = ["gemm", "reference", "isa", "available", "amx_built", "ISAS", "EMULATED", "pack",
           "Packed", "forget", "conv2d", "nhwc", "add"]

# fastest first
ISAS = ("amx", "vnni512", "avxvnni", "avx2", "c", "numpy")
# the AMX kernel on emulated tiles: never chosen, only forced (tests)
EMULATED = "amx-emulated"
_BITS = {"avx2": 1, "avxvnni": 2, "vnni512": 4, "amx": 8}
# each path's level in cc.ISA_LEVELS (portable, avx2, avx512), for TESSERA_MAX_ISA
# (AVX-VNNI counts as above the avx2 cap: Haswell and Zen 3, what that cap stands for, lack it)
_LEVEL = {"amx": 2, "vnni512": 2, "avxvnni": 2, "avx2": 1, "c": 0, "numpy": 0, EMULATED: 2}
_NPARAMS = 20
# rows x column blocks of 16 below which one thread does the whole product
_SPLIT_MACS = 1 << 20


@functools.lru_cache(maxsize=1)
def _lib():
    """The compiled kernels, or None without a C compiler."""
    try:
        from tessera.kernels import cc
        from tessera.kernels.csource import source
        if cc.compiler() is None:
            return None
        lib = cc.load(source("int8.c"), ("-ffp-contract=off",))
    except Exception:  # a broken toolchain: the NumPy reference still runs
        return None
    for name in ("c", "avx2", "avxvnni", "vnni512", "amx"):
        f = getattr(lib, f"tsr_int8_gemm_{name}")
        f.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 4
        f.restype = None
    for name in ("nhwc", "im2col", "depthwise", "add", "im2col_nhwc", "dw_nhwc"):
        f = getattr(lib, f"tsr_int8_{name}")
        f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        f.restype = None
    lib.tsr_int8_cpu.restype = ctypes.c_int
    return lib


@functools.lru_cache(maxsize=1)
def _emulated():
    """The GEMM of the AMX kernel on emulated tiles (``c/int8.c`` built with
    ``-DTSR_INT8_AMX_EMULATE``), or None without a C compiler or an AVX-512 VNNI CPU (its
    epilogue's instructions, which every AMX CPU has)."""
    bits = _cpu_bits()
    if bits is None or not bits & _BITS["vnni512"]:
        return None
    from tessera.kernels.csource import source
    lib = cc.load(source("int8.c"), ("-ffp-contract=off", "-DTSR_INT8_AMX_EMULATE"))
    f = lib.tsr_int8_gemm_amx_emulated
    f.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 4
    f.restype = None
    return f


def _gemm_fn(path: str):
    """The C function of ``path``'s GEMM (a path ``available()`` lists, or ``EMULATED``)."""
    if path == EMULATED:
        f = _emulated()
        if f is None:
            raise RuntimeError(f"int8: the {EMULATED} path needs a C compiler and a CPU with "
                               "AVX-512 VNNI")
        return f
    return getattr(_lib(), f"tsr_int8_gemm_{path}")


@functools.lru_cache(maxsize=1)
def amx_built() -> bool:
    """Whether the compiled kernels hold the AMX path (False for a compiler without AMX,
    whatever the CPU).

    >>> amx_built() in (True, False)
    True
    """
    lib = _lib()
    return lib is not None and bool(lib.tsr_int8_amx_built())


@functools.lru_cache(maxsize=1)
def _cpu_bits() -> int | None:
    lib = _lib()
    return None if lib is None else lib.tsr_int8_cpu()


def available() -> tuple[str, ...]:
    """The paths this CPU (and toolchain) can run within ``TESSERA_MAX_ISA``, fastest first.

    >>> available()[-1]
    'numpy'
    """
    bits = _cpu_bits()
    if bits is None:
        return ("numpy",)
    cap = cc.ISA_LEVELS.index(cc.max_isa())
    return tuple(n for n in ISAS if (n in ("c", "numpy") or bits & _BITS[n])
                 and _LEVEL[n] <= cap)


def isa() -> str:
    """The path ``gemm`` takes: ``$TESSERA_INT8_ISA`` if set (RuntimeError when this CPU lacks
    it), else the fastest available."""
    forced = os.environ.get("TESSERA_INT8_ISA", "").strip().lower()
    have = available()
    if not forced:
        return have[0]
    if forced not in ISAS and forced != EMULATED:
        raise ValueError(f"TESSERA_INT8_ISA={forced!r}: expected one of {', '.join(ISAS)}")
    if forced == EMULATED:
        _gemm_fn(EMULATED)   # (raises where it cannot run)
        return forced
    if forced not in have and _LEVEL[forced] > cc.ISA_LEVELS.index(cc.max_isa()):
        raise RuntimeError(f"TESSERA_INT8_ISA={forced!r}: TESSERA_MAX_ISA={cc.max_isa()} "
                           "excludes it")
    if forced not in have:
        raise RuntimeError(f"TESSERA_INT8_ISA={forced!r}: this CPU (or C compiler) cannot run "
                           f"it; available: {', '.join(have)}")
    return forced


class Packed:
    """Int8 weights (N x K) in the kernels' layout, with each row's sum."""

    def __init__(self, w: np.ndarray):
        n, k = w.shape
        self.n, self.k = n, k
        self.kp, self.np_ = -(-k // 4) * 4, -(-n // 16) * 16
        full = np.zeros((self.np_, self.kp), np.int8)
        full[:n, :k] = w
        # [N/16][K/4][16][4]
        self.data = np.ascontiguousarray(
            full.reshape(self.np_ // 16, 16, self.kp // 4, 4).transpose(0, 2, 1, 3))
        self.colsum = np.zeros(self.np_, np.int32)
        self.colsum[:n] = w.astype(np.int32).sum(1)
        self._epilogues: dict = {}

    def epilogue(self, mult, bias, bias_f) -> tuple:
        """(int32 bias or None, float32 multipliers, float32 bias) padded to whole column
        blocks, remembered by value: a layer passes the same ones at every call."""
        key = tuple(None if v is None else np.asarray(v).tobytes() for v in (mult, bias, bias_f))
        hit = self._epilogues.get(key)
        if hit is None:
            if len(self._epilogues) >= 64:
                self._epilogues.clear()
            hit = self._epilogues[key] = (
                _pad(bias, self.np_, np.int32) if bias is not None else None,
                _pad(mult, self.np_, np.float32), _pad(bias_f, self.np_, np.float32))
        return hit


_PACKED: dict[int, tuple[weakref.ref, Packed]] = {}


def pack(w: np.ndarray) -> Packed:
    """``w`` packed, cached for as long as the array lives (a module's weights are packed
    once)."""
    hit = _PACKED.get(id(w))
    if hit is not None and hit[0]() is w:
        return hit[1]
    p = Packed(w)
    key = id(w)

    def forget(_ref, key: int = key, cache: dict = _PACKED) -> None:
        cache.pop(key, None)
    try:
        ref = weakref.ref(w, forget)
    except TypeError:
        return p
    _PACKED[key] = (ref, p)
    return p


def forget(w: np.ndarray) -> None:
    """Drop what was packed from ``w`` (its values changed in place).

    >>> forget(np.zeros((2, 2), np.int8))
    """
    _PACKED.pop(id(w), None)
    _CONVS.pop(id(w), None)


def _pad(v: np.ndarray | None, n: int, dtype) -> np.ndarray:
    out = np.zeros(n, dtype)
    if v is not None:
        out[:len(v)] = v
    return out


def gemm(a: np.ndarray, w: np.ndarray, *, a_zp: int, mult: np.ndarray, out_zp: int = 0,
         bias: np.ndarray | None = None, out_dtype=np.uint8, relu: bool = False,
         qmin: int | None = None, qmax: int | None = None,
         bias_f: np.ndarray | None = None, path: str | None = None) -> np.ndarray:
    """``requant(a @ w.T)`` (see the module's docstring). ``a``: uint8 (M, K); ``w``: int8
    (N, K); ``mult``: float32 (N,); ``bias``: int32 (N,) or None. ``out_dtype`` uint8, int8
    or float32 (then ``acc * mult + bias_f``, no rounding). ``path``: one of ``ISAS`` or
    ``EMULATED`` (default ``isa()``)."""
    path = path or isa()
    out_dtype = np.dtype(out_dtype)
    lo, hi = _range(out_dtype, qmin, qmax, relu, out_zp)
    if path == "numpy":
        return reference(a, w, a_zp=a_zp, mult=mult, out_zp=out_zp, bias=bias,
                         out_dtype=out_dtype, relu=relu, qmin=qmin, qmax=qmax, bias_f=bias_f)
    m, k = a.shape
    pw = pack(w)
    if a.dtype != np.uint8 or k != pw.kp or not a.flags.c_contiguous:
        ap = np.zeros((m, pw.kp), np.uint8)
        ap[:, :k] = a
        a = ap
    out = np.empty((m, pw.n), out_dtype)
    _gemm_packed(path, a, pw, out, a_zp=a_zp, mult=mult, out_zp=out_zp, bias=bias,
                 lo=lo, hi=hi, bias_f=bias_f)
    return out


def _gemm_packed(path: str, a: np.ndarray, pw: Packed, out: np.ndarray, *, a_zp: int,
                 mult: np.ndarray, out_zp: int, bias, lo: int, hi: int, bias_f=None,
                 pix: int = 0, ntot: int = 0, noff: int = 0, ldc: int = 0) -> None:
    """``out`` = requant(a @ w.T) for ``a`` uint8 (M, kp), C-contiguous. ``pix`` > 0: ``out``
    is NCHW (images of ``pix`` pixels, ``ntot`` channels, these from channel ``noff``);
    else row-major, rows ``ldc`` wide (default N), these columns from ``noff``."""
    m = a.shape[0]
    params = _gemm_params(pw, m, out.dtype, a_zp=a_zp, mult=mult, out_zp=out_zp, bias=bias,
                          lo=lo, hi=hi, bias_f=bias_f, pix=pix, ntot=ntot, noff=noff, ldc=ldc)
    params[_P_A], params[_P_C] = a.ctypes.data, out.ctypes.data
    if m == 0 or pw.n == 0:
        return
    _run(_gemm_fn(path), params, m, pw.np_ // 16, pw.kp)


_P_A, _P_C = 3, 9   # the operands' slots in the GEMM's parameters (P_A, P_C in int8.c)


def _gemm_params(pw: Packed, m: int, out_dtype, *, a_zp: int, mult, out_zp: int, bias,
                 lo: int, hi: int, bias_f=None, pix: int = 0, ntot: int = 0, noff: int = 0,
                 ldc: int = 0) -> np.ndarray:
    """The GEMM's parameters but for its operands' addresses (``_P_A``, ``_P_C``)."""
    keep = pw.epilogue(mult, bias, bias_f)
    return np.array([m, pw.n, pw.kp, 0, pw.kp, pw.data.ctypes.data,
                     pw.colsum.ctypes.data, 0 if keep[0] is None else keep[0].ctypes.data,
                     keep[1].ctypes.data, 0, ldc or pw.n, a_zp, out_zp, lo, hi,
                     {"u": 0, "i": 1, "f": 2}[np.dtype(out_dtype).kind], keep[2].ctypes.data,
                     pix, ntot, noff], np.int64)


def _run(f, params: np.ndarray, m: int, nblocks: int, k: int) -> None:
    from tessera.kernels import threadpool
    ptr = params.ctypes.data
    if m * nblocks * 16 * k >= _SPLIT_MACS and threadpool.usable():
        t = threadpool._threads()
        # split the columns (weights stay in each cache) where every part gets pairs of
        # blocks (the 8 x 32 kernel's width), else the rows
        if nblocks >= 4 * t or m < 16:
            step = -(-nblocks // (2 * t))
            step += step % 2
            parts = [(ptr, 0, m, j, min(j + step, nblocks)) for j in range(0, nblocks, step)]
        else:
            step = -(-m // (2 * t))
            step = -(-step // 8) * 8
            parts = [(ptr, i, min(i + step, m), 0, nblocks) for i in range(0, m, step)]
        if threadpool.run(f, parts) is not None:
            return
    f(ptr, 0, m, 0, nblocks)


def _range(out_dtype: np.dtype, qmin, qmax, relu: bool, out_zp: int) -> tuple[int, int]:
    if out_dtype.kind == "f":
        return 0, 0
    lo0, hi0 = (0, 255) if out_dtype.kind == "u" else (-128, 127)
    lo = lo0 if qmin is None else qmin
    hi = hi0 if qmax is None else qmax
    if relu:
        lo = max(lo, out_zp)
    return lo, hi


def reference(a: np.ndarray, w: np.ndarray, *, a_zp: int, mult: np.ndarray, out_zp: int = 0,
              bias: np.ndarray | None = None, out_dtype=np.uint8, relu: bool = False,
              qmin: int | None = None, qmax: int | None = None,
              bias_f: np.ndarray | None = None) -> np.ndarray:
    """The definition of ``gemm`` in NumPy integers.

    >>> reference(np.full((1, 2), 200, np.uint8), np.full((1, 2), 100, np.int8), a_zp=0,
    ...           mult=np.ones(1, np.float32), out_dtype=np.float32)
    array([[40000.]], dtype=float32)
    """
    out_dtype = np.dtype(out_dtype)
    a32, w32 = a.astype(np.int32), w.astype(np.int32)
    acc = (a32.astype(np.int64) @ w32.T.astype(np.int64)).astype(np.int32)
    with np.errstate(over="ignore"):
        acc = acc - np.int32(a_zp) * w32.sum(1, dtype=np.int32)
        if bias is not None:
            acc = acc + bias.astype(np.int32)
    v = acc.astype(np.float32) * np.asarray(mult, np.float32)
    if out_dtype.kind == "f":
        return v + (np.zeros(w.shape[0], np.float32) if bias_f is None
                    else np.asarray(bias_f, np.float32))
    lo, hi = _range(out_dtype, qmin, qmax, relu, out_zp)
    q = np.clip(np.rint(v), np.float32(lo - out_zp), np.float32(hi - out_zp))
    return (q.astype(np.int32) + out_zp).astype(out_dtype)


# ---- convolution ---------------------------------------------------------------------------

class _Conv:
    """A convolution's weights as its kernels take them: per group, packed for the GEMM;
    for a depthwise convolution (one input channel per group), as they are."""

    def __init__(self, w: np.ndarray, groups: int):
        cout, cg = w.shape[:2]
        self.groups, self.og = groups, cout // groups
        self.kernel = tuple(w.shape[2:])
        self.plans: dict = {}
        self.depthwise = cg == 1 and groups > 1
        if self.depthwise:
            self.w = np.ascontiguousarray(w, np.int8)
            # the NHWC kernel's operands: int32 [KH*KW][C], and each channel's sum
            self.taps = np.ascontiguousarray(
                self.w.reshape(cout, -1).T.astype(np.int32))
            self.wsum = self.w.reshape(cout, -1).sum(1, dtype=np.int32)
            self.packed: list[Packed] = []
        else:
            og = self.og
            # (out, kh, kw, in): the columns' order, each tap's channels contiguous
            self.packed = [Packed(np.ascontiguousarray(
                w[g * og:(g + 1) * og].transpose(0, 2, 3, 1)).reshape(og, -1))
                for g in range(groups)]


_CONVS: dict[int, tuple[weakref.ref, _Conv]] = {}


def _conv_weights(w: np.ndarray, groups: int) -> _Conv:
    """``w`` prepared for ``conv2d``, cached for as long as the array lives (``forget``
    drops it when the values change in place)."""
    hit = _CONVS.get(id(w))
    if hit is not None and hit[0]() is w and hit[1].groups == groups:
        return hit[1]
    c = _Conv(w, groups)
    key = id(w)

    def drop(_ref, key: int = key, cache: dict = _CONVS) -> None:
        cache.pop(key, None)  # (the dict bound now: module globals are gone at exit)
    try:
        _CONVS[key] = (weakref.ref(w, drop), c)
    except TypeError:
        pass
    return c


def nhwc(x: np.ndarray) -> np.ndarray:
    """The NHWC array of an NCHW-shaped ``x``: a view when ``x`` is channels-last (what
    ``conv2d`` returns), else a copy.

    >>> nhwc(np.arange(4, dtype=np.uint8).reshape(1, 2, 1, 2)).tolist()
    [[[[0, 2], [1, 3]]]]
    """
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def conv2d(x: np.ndarray, w: np.ndarray, *, stride, padding, dilation, groups: int,
           a_zp: int, mult: np.ndarray, out_zp: int, bias: np.ndarray | None,
           relu: bool, path: str | None = None) -> np.ndarray | None:
    """The quantized convolution of an NCHW-shaped uint8 ``x`` with OIHW int8 ``w``,
    requantized as ``gemm`` does, into an NCHW-shaped uint8 result that is channels-last in
    memory (an NHWC array's transposed view, as PyTorch's x86 quantized convolution gives):
    the next convolution reads it as it is. A depthwise convolution has a kernel of its own,
    the others are a GEMM over the output pixels (on the input itself for a 1x1 convolution
    of stride 1, else on im2col's columns). None on the ``numpy`` path (the caller runs the
    reference).

    >>> x = np.full((1, 1, 3, 3), 2, np.uint8); w = np.ones((1, 1, 3, 3), np.int8)
    >>> y = conv2d(x, w, stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, a_zp=0,
    ...            mult=np.ones(1, np.float32), out_zp=0, bias=None, relu=False)
    >>> y is None or y[0, 0].tolist() == [[8, 12, 8], [12, 18, 12], [8, 12, 8]]
    True
    """
    path = path or isa()
    if path == "numpy":
        return None
    cw = _conv_weights(w, groups)
    key = (x.shape, tuple(stride), tuple(padding), tuple(dilation), a_zp, out_zp, relu, path,
           np.asarray(mult).tobytes(), None if bias is None else np.asarray(bias).tobytes())
    plan = cw.plans.get(key)
    if plan is None:
        if len(cw.plans) >= 16:
            cw.plans.clear()
        plan = cw.plans[key] = _ConvPlan(x.shape, cw, stride, padding, dilation, a_zp, mult,
                                         out_zp, bias, relu, path)
    return plan(x)


class _ConvPlan:
    """One convolution's calls into C for one input shape and set of quantization
    parameters, made once: each call fills in the operands' addresses and runs them.
    ``steps``: (C function, parameters, [(slot, buffer name, byte offset)], how to split)."""

    def __init__(self, shape, cw: _Conv, stride, padding, dilation, a_zp, mult, out_zp,
                 bias, relu, path):
        lib = _lib()
        n, cin, h, wd = shape
        cout, cg, kh, kw = (len(cw.wsum) if cw.depthwise else cw.og * cw.groups,
                            cin // cw.groups, *cw.kernel)
        oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
        ow = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
        lo, hi = _range(np.dtype(np.uint8), None, None, relu, out_zp)
        self.nchw = cw.depthwise and cw.og != 1
        self.args = (lib, cw, stride, padding, dilation, oh, ow, a_zp, mult, out_zp, bias,
                     lo, hi)
        self.shape = (n, oh, ow, cout)
        self.steps: list = []
        self.cols: list = []
        self.keep: list = []
        if self.nchw or n * cout * oh * ow == 0:
            return
        geo = [cin, cg, h, wd, kh, kw, stride[0], stride[1], padding[0], padding[1],
               dilation[0], dilation[1], oh, ow, 0, a_zp]
        if cw.depthwise:
            off = cw.wsum * np.int32(-a_zp)
            if bias is not None:
                off += np.asarray(bias, np.int32)
            m32 = np.ascontiguousarray(mult, np.float32)
            self.keep += [off, m32]
            params = np.array(geo + [0, 0, cw.taps.ctypes.data, off.ctypes.data,
                                     m32.ctypes.data, 0, out_zp, lo, hi, 1, 0], np.int64)
            self.steps.append((lib.tsr_int8_dw_nhwc, params, [(14, "x", 0), (21, "out", 0)],
                               ("split", n * oh, ow * cout * kh * kw)))
            return
        og, m = cout // cw.groups, n * oh * ow
        direct = kh == kw == 1 and stride == (1, 1) and padding == (0, 0) and cw.groups == 1
        f = _gemm_fn(path)
        for g, pw in enumerate(cw.packed):
            src = "x"
            if not (direct and cg == pw.kp):
                src = f"cols{g}"
                self.cols.append((src, (m, pw.kp)))
                params = np.array(geo + [0, pw.kp], np.int64)
                self.steps.append((lib.tsr_int8_im2col_nhwc, params,
                                   [(14, "x", g * cg), (16, src, 0)], ("split", m, pw.kp)))
            sl = slice(g * og, (g + 1) * og)
            bsl = None if bias is None else bias[sl]
            # (the arrays the parameters point at, held here should the cache drop them)
            self.keep.append(pw.epilogue(mult[sl], bsl, None))
            params = _gemm_params(pw, m, np.uint8, a_zp=a_zp, mult=mult[sl], out_zp=out_zp,
                                  bias=bsl, lo=lo, hi=hi, noff=g * og, ldc=cout)
            self.steps.append((f, params, [(_P_A, src, 0), (_P_C, "out", 0)],
                               ("gemm", m, pw.np_ // 16, pw.kp)))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.nchw:
            return _depthwise_nchw(x, *self.args)
        xn = nhwc(np.asarray(x, np.uint8))
        out = np.empty(self.shape, np.uint8)
        bufs = {"x": xn, "out": out}
        for name, shape in self.cols:
            bufs[name] = np.empty(shape, np.uint8)
        addr = {k: v.ctypes.data for k, v in bufs.items()}
        for f, tmpl, fills, how in self.steps:
            params = tmpl.copy()
            for slot, name, offset in fills:
                params[slot] = addr[name] + offset
            if how[0] == "split":
                _split(f, params, how[1], how[2])
            else:
                _run(f, params, *how[1:])
        return out.transpose(0, 3, 1, 2)


def _depthwise_nchw(x, lib, cw, stride, padding, dilation, oh, ow, a_zp, mult, out_zp,
                    bias, lo, hi) -> np.ndarray:
    """A depthwise convolution of several outputs per channel, on NCHW planes."""
    x = np.ascontiguousarray(x, np.uint8)
    n, cin, h, wd = x.shape
    cout, _, kh, kw = cw.w.shape
    out = np.empty((n, cout, oh, ow), np.uint8)
    if out.size == 0:
        return out
    geo = [cin, 1, h, wd, kh, kw, stride[0], stride[1], padding[0], padding[1],
           dilation[0], dilation[1], oh, ow, x.ctypes.data, a_zp]
    keep = (np.ascontiguousarray(mult, np.float32),
            None if bias is None else np.ascontiguousarray(bias, np.int32))
    params = np.array(geo + [0, 0, cw.w.ctypes.data,
                             0 if keep[1] is None else keep[1].ctypes.data,
                             keep[0].ctypes.data, out.ctypes.data, out_zp, lo, hi, cw.og,
                             0], np.int64)
    _split(lib.tsr_int8_depthwise, params, n * cout, oh * ow * kh * kw * 4)
    return out


def _split(f, params: np.ndarray, items: int, cost: int) -> None:
    """``f(params, i0, i1)`` over ``[0, items)``, in parts on the kernel threads when the
    work (``cost`` per item) is worth it."""
    from tessera.kernels import threadpool
    ptr = params.ctypes.data
    if items > 1 and items * cost >= _SPLIT_MACS and threadpool.usable():
        t = threadpool._threads()
        step = -(-items // (2 * t))
        parts = [(ptr, i, min(i + step, items)) for i in range(0, items, step)]
        if threadpool.run(f, parts) is not None:
            return
    f(ptr, 0, items)


def _dense(a: np.ndarray) -> bool:
    """Whether ``a``'s elements fill its memory with no gaps, in some order of its axes."""
    order = sorted(range(a.ndim), key=lambda d: -a.strides[d])
    return a.transpose(order).flags.c_contiguous


def add(a: np.ndarray, b: np.ndarray, *, a_scale: float, a_zp: int, b_scale: float,
        b_zp: int, out_scale: float, out_zp: int, lo: int, hi: int) -> np.ndarray | None:
    """The quantized sum of two uint8 (or two int8) arrays of one shape, in C: ``(a - a_zp)
    * a_scale + (b - b_zp) * b_scale`` in float32, divided by ``out_scale``, rounded half to
    even, plus ``out_zp``, clamped to ``[lo, hi]``. None without the C kernels (or on the
    ``numpy`` path).

    >>> a = np.array([10, 20], np.uint8)
    >>> y = add(a, a, a_scale=0.1, a_zp=0, b_scale=0.1, b_zp=0, out_scale=0.2, out_zp=0, lo=0,
    ...         hi=255)
    >>> y is None or y.tolist() == [10, 20]
    True
    """
    lib = _lib()
    if lib is None or isa() == "numpy" or a.dtype != b.dtype or a.shape != b.shape:
        return None
    if a.strides != b.strides or not _dense(a):  # (same-layout operands: in memory order)
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    out = np.empty_like(a)  # (in a's layout: channels-last stays channels-last)
    scales = np.array([a_scale, b_scale, out_scale], np.float32)
    params = np.array([a.ctypes.data, b.ctypes.data, out.ctypes.data, a_zp, b_zp,
                       scales.ctypes.data, out_zp, lo, hi, a.dtype == np.int8], np.int64)
    _split(lib.tsr_int8_add, params, a.size, 8)
    return out
