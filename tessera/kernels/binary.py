"""Binary (1-bit) convolution and matrix products on bit-packed operands (``c/binary.c``),
and their NumPy reference.

A value in {-1, +1} is one bit, 1 for -1: ``x < 0`` binarizes, so ``sign(0) = +1`` as in
Larq and dabnn. ``packbits`` packs the last axis 64 values to a uint64 word (bit ``i`` of
word ``j`` is element ``64 j + i``; the tail of the last word is zero): the layout of
dabnn, channel-last, so conv weights ``(O, I, KH, KW)`` pack as ``(O, KH, KW, ceil(I/64))``.
A dot product of ``K`` such values is ``K - 2 * popcount(a xor b)``.

``conv2d`` and ``linear`` binarize float activations on the fly and multiply them with
packed weights; the result is ``float32(dot) * scale`` (a per-output-channel ``alpha``, or
1), the integer dot exact, so every instruction set and ``reference`` agree bit for bit.
Padding counts as ``pad_value``: -1 (dabnn: a padded bit is 1, free), +1 (a zero bit,
Larq's ``pad_values=1``, free) or 0 (as a float convolution; the +1 result less the padded
taps' weight sums, an integer correction).

The instruction set is chosen from the CPU (``isa()``): AVX-512 VPOPCNTDQ, AVX2 (nibble
table popcount) or portable C. ``TESSERA_BINARY_ISA=vpopcnt|avx2|c|numpy`` forces one;
forcing one this CPU lacks is an error. ``TESSERA_MAX_ISA=avx2`` (``cc.max_isa()``) leaves
the AVX-512 path out, and ``portable`` all but C and NumPy.

>>> import numpy as np
>>> packbits(np.array([[-1.0, 2.0, -0.5]])).tolist()
[[5]]
>>> w = packbits(np.array([[1.0, -1.0, 1.0]]))          # one output, three inputs
>>> linear(np.array([[-1.0, 2.0, -0.5]]), w, 3).tolist()  # (-1)(1) + (1)(-1) + (-1)(1)
[[-3.0]]
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
import weakref

import numpy as np

from tessera.kernels import cc, threadpool
from tessera.kernels.gemm import _address

__all__ = ["packbits", "unpackbits", "conv2d", "linear", "reference_conv2d",
           "reference_linear", "isa", "available", "ISAS", "PAD_VALUES"]

# fastest first
ISAS = ("vpopcnt", "avx2", "c", "numpy")
_BITS = {"avx2": 1, "vpopcnt": 2}
# each path's level in cc.ISA_LEVELS (portable, avx2, avx512), for TESSERA_MAX_ISA
_LEVEL = {"vpopcnt": 2, "avx2": 1, "c": 0, "numpy": 0}
PAD_VALUES = (-1, 0, 1)
_TW = 16           # the kernels' tile width (columns)
_SPLIT_OPS = 1 << 18  # word products below which one thread does the whole product


# the address of an array's data, read from the array object (``gemm._address``: a tenth
# of ``a.ctypes.data``, half of the buffer protocol's, a per-call cost of small layers)
_addr = _address


@functools.lru_cache(maxsize=1)
def _lib():
    """The compiled kernels, or None without a C compiler."""
    try:
        from tessera.kernels import cc
        from tessera.kernels.csource import source
        if cc.compiler() is None:
            return None
        lib = cc.load(source("binary.c"))
    except Exception:  # a broken toolchain: the NumPy reference still runs
        return None
    for name in ("c", "avx2", "vpopcnt"):
        f = getattr(lib, f"tsr_bin_gemm_{name}")
        f.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 4
        f.restype = None
    lib.tsr_bin_pack_planar.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    lib.tsr_bin_pack_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                      ctypes.c_void_p]
    lib.tsr_bin_columns.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                    ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.tsr_bin_columns_bits.argtypes = lib.tsr_bin_columns.argtypes
    P, I = ctypes.c_void_p, ctypes.c_int64
    lib.tsr_bin_direct.argtypes = [P, I, P, P, P, P, I, I, P, P]
    lib.tsr_bin_direct.restype = ctypes.c_int64
    lib.tsr_bin_direct_pack.argtypes = [P, P, P]
    lib.tsr_bin_direct_bits.argtypes = [P, P, P]
    lib.tsr_bin_direct_conv.argtypes = [P, I, P, P, P, I, I, P]
    for f in (lib.tsr_bin_pack_planar, lib.tsr_bin_pack_rows, lib.tsr_bin_columns,
              lib.tsr_bin_columns_bits, lib.tsr_bin_direct_pack, lib.tsr_bin_direct_bits,
              lib.tsr_bin_direct_conv):
        f.restype = None
    lib.tsr_bin_direct_block.restype = ctypes.c_int64
    lib.tsr_bin_direct_scratch.argtypes = [P]
    lib.tsr_bin_direct_scratch.restype = ctypes.c_int64
    lib.tsr_bin_direct_nibbles.argtypes = [P, P]
    lib.tsr_bin_direct_nibbles.restype = None
    lib.tsr_bin_cpu.restype = ctypes.c_int
    lib.tsr_bin_planes_lists.argtypes = [P, I, I, I, I, P, P]
    lib.tsr_bin_planes_lists.restype = ctypes.c_int64
    return lib


@functools.lru_cache(maxsize=1)
def _cpu_bits() -> int | None:
    lib = _lib()
    return None if lib is None else lib.tsr_bin_cpu()


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


# the raw values of $TESSERA_BINARY_ISA and $TESSERA_MAX_ISA last read and the path they
# named: a call compares them with one dict lookup each (``os.environ``'s own mapping of
# encoded names, which every write through ``os.environ`` updates), not ``environ.get``'s
# encoding and decoding
_ENV = getattr(os.environ, "_data", None)
if isinstance(_ENV, dict) and hasattr(os.environ, "encodekey"):
    _env_get = _ENV.get
    _ENV_KEYS = (os.environ.encodekey("TESSERA_BINARY_ISA"),
                 os.environ.encodekey("TESSERA_MAX_ISA"))
else:  # another Python's os.environ: its own get
    _env_get, _ENV_KEYS = os.environ.get, ("TESSERA_BINARY_ISA", "TESSERA_MAX_ISA")
_ISA: list = [None, None]


def isa() -> str:
    """The path the kernels take: ``$TESSERA_BINARY_ISA`` if set (RuntimeError when this CPU
    lacks it), else the fastest available."""
    raw = _env_get(_ENV_KEYS[0]), _env_get(_ENV_KEYS[1])
    if raw == _ISA[0]:
        return _ISA[1]
    return _isa(raw)


def _isa(key: tuple) -> str:
    env = os.environ.get("TESSERA_BINARY_ISA", "")
    forced = env.strip().lower()
    have = available()
    if forced in have or not forced:
        _ISA[:] = key, forced or have[0]
    if not forced:
        return have[0]
    if forced not in ISAS:
        raise ValueError(f"TESSERA_BINARY_ISA={forced!r}: expected one of {', '.join(ISAS)}")
    if forced not in have and _LEVEL[forced] > cc.ISA_LEVELS.index(cc.max_isa()):
        raise RuntimeError(f"TESSERA_BINARY_ISA={forced!r}: TESSERA_MAX_ISA={cc.max_isa()} "
                           "excludes it")
    if forced not in have:
        raise RuntimeError(f"TESSERA_BINARY_ISA={forced!r}: this CPU (or C compiler) cannot "
                           f"run it; available: {', '.join(have)}")
    return forced


# ---- packing -------------------------------------------------------------------------------

def packbits(x: np.ndarray) -> np.ndarray:
    """The signs of ``x`` along its last axis, 64 to a uint64 word (1 where ``x < 0``).

    >>> packbits(np.array([1.0] * 64 + [-1.0])).tolist()
    [0, 1]
    """
    x = np.asarray(x)
    bits = np.packbits(x < 0, axis=-1, bitorder="little")
    nbytes = -(-x.shape[-1] // 64) * 8
    if bits.shape[-1] != nbytes:
        bits = np.concatenate(
            [bits, np.zeros(bits.shape[:-1] + (nbytes - bits.shape[-1],), np.uint8)], -1)
    return np.ascontiguousarray(bits).view("<u8").astype(np.uint64, copy=False)


def unpackbits(words: np.ndarray, n: int) -> np.ndarray:
    """The inverse of ``packbits``: ``n`` float32 values in {-1, +1} along the last axis.

    >>> unpackbits(np.array([5], np.uint64), 3).tolist()
    [-1.0, 1.0, -1.0]
    """
    words = np.ascontiguousarray(words, np.uint64)
    if words.shape[-1] * 64 < n:
        raise ValueError(f"unpackbits: {words.shape[-1]} words hold {words.shape[-1] * 64} "
                         f"bits, fewer than {n}")
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")[..., :n]
    return (1.0 - 2.0 * bits).astype(np.float32)


def _rows_of(x: np.ndarray) -> np.ndarray:
    """``packbits`` of a float32 matrix, in C when it can."""
    lib = _lib()
    if lib is None or x.dtype != np.float32 or not x.flags.c_contiguous:
        return packbits(x)
    r, c = x.shape
    out = np.empty((r, -(-c // 64)), np.uint64)
    lib.tsr_bin_pack_rows(x.ctypes.data, r, c, out.ctypes.data)
    return out


# ---- the product ---------------------------------------------------------------------------

def _gemm(path: str, a: np.ndarray, mi: int, b: np.ndarray, out: np.ndarray, ldo: int,
          kbits: int, corr: np.ndarray | None, scale: np.ndarray | None,
          scale_m: bool, ostride: int = 0) -> None:
    """``out[img * ostride + n * ldo + pix] = float32(kbits - 2 popcount(a[:, m] ^ b[n]) +
    corr[n, pix]) * scale`` for column ``m = img * MIp + pix`` (``pix < mi``; each image's
    columns padded to a multiple of 16); ``a``: (K, images * MIp) and ``b``: (N, K), uint32
    halves of words."""
    lib = _lib()
    k, mp = a.shape
    n = b.shape[0]
    if mi == 0 or n == 0 or mp == 0:
        return
    mip = -(-mi // _TW) * _TW
    params = np.array([mi, mp, n, k, a.ctypes.data, b.ctypes.data, out.ctypes.data, ldo,
                       kbits, 0 if corr is None else corr.ctypes.data,
                       0 if scale is None else scale.ctypes.data, int(scale_m), mi, mip,
                       ostride], np.int64)
    f = getattr(lib, f"tsr_bin_gemm_{path}")
    ptr = params.ctypes.data
    if mp * n * k >= _SPLIT_OPS:
        from tessera.kernels import threadpool
        if threadpool.usable():
            t = 2 * threadpool._threads()
            if n >= 8 * t:  # split the rows (each part's weights stay in L1)
                step = -(-n // t)
                step = -(-step // 8) * 8
                parts = [(ptr, 0, mp, j, min(j + step, n)) for j in range(0, n, step)]
            else:
                step = -(-(mp // _TW) // t) * _TW
                parts = [(ptr, i, min(i + step, mp), 0, n) for i in range(0, mp, step)]
            if threadpool.run(f, parts) is not None:
                return
    f(ptr, 0, mp, 0, n)


def _check_pad(pad_value) -> int:
    if pad_value not in PAD_VALUES:
        raise ValueError(f"binary conv2d: pad_value must be -1, 0 or 1, got {pad_value!r}")
    return int(pad_value)


def _out_size(n: int, k: int, s: int, p: int, d: int) -> int:
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


class _Conv:
    """Packed weights (O, KH, KW, Cw) as the kernels' rows, and their geometry."""

    def __init__(self, words: np.ndarray, cin: int):
        o, kh, kw, cw = words.shape
        self.o, self.kh, self.kw, self.cw, self.cin = o, kh, kw, cw, cin
        self.rows = np.ascontiguousarray(words.reshape(o, kh * kw * cw), np.uint64).view(
            np.uint32)
        self.words = words
        # what the cached forms were made from: weights written in place since (copy_,
        # load_state_dict) are prepared again, not read through stale blocked copies; as
        # bytes, whose comparison costs a tenth of np.array_equal's on a layer's words
        self.src = np.ascontiguousarray(words).tobytes()
        self.src_words = np.frombuffer(self.src, np.uint8)  # the same, for the C kernels
        self._corr: dict[tuple, np.ndarray] = {}
        self._plans: dict[tuple, _Direct] = {}
        self._blocked: np.ndarray | None = None

    def current(self, words: np.ndarray) -> bool:
        """Whether ``words`` (uint64, or int64 holding the same bits) still hold the values
        this was prepared from."""
        return words.tobytes() == self.src

    def plan(self, h: int, w: int, stride, padding, dilation, pad_value: int) -> _Direct | None:
        """The direct kernels' plan for inputs of ``h`` x ``w``, or None where the columns
        run instead: a stride other than 1, or sums of 2^24 products or more (the float
        epilogue's are then no longer exact). The one rule, for eager calls and for the
        programs ``tessera.deploy`` emits."""
        if tuple(stride) != (1, 1) or self.cin * self.kh * self.kw >= 1 << 24:
            return None
        return self.direct(h, w, tuple(padding), tuple(dilation), pad_value)

    def direct(self, h: int, w: int, padding, dilation, pad_value: int) -> _Direct:
        """The plan of the direct (stride 1) kernels for inputs of ``h`` x ``w``."""
        key = (h, w, padding, dilation, pad_value)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _Direct(self, h, w, padding, dilation, pad_value)
        return plan

    def blocked(self, nb: int) -> np.ndarray:
        """The weights as the direct kernels read them: (ceil(O / nb), K, nb) words, word k
        of channel n at ``[n // nb, k, n % nb]`` (the extra channels zero)."""
        if self._blocked is None:
            k = self.kh * self.kw * self.cw
            ob = -(-self.o // nb) * nb
            wb = np.zeros((ob, k), np.uint64)
            wb[:self.o] = self.words.reshape(self.o, k)
            self._blocked = np.ascontiguousarray(wb.reshape(ob // nb, nb, k).transpose(0, 2, 1))
        return self._blocked

    def corr(self, h: int, w: int, stride, padding, dilation, oh: int, ow: int) -> np.ndarray:
        """(O, OH*OW) int32: minus the weight sums of the taps that fall in the padding."""
        key = (h, w, stride, padding, dilation)
        hit = self._corr.get(key)
        if hit is not None:
            return hit
        iy = (np.arange(oh)[:, None] * stride[0] - padding[0]
              + np.arange(self.kh)[None, :] * dilation[0])
        ix = (np.arange(ow)[:, None] * stride[1] - padding[1]
              + np.arange(self.kw)[None, :] * dilation[1])
        oy_out = (iy < 0) | (iy >= h)                     # (OH, KH)
        ox_out = (ix < 0) | (ix >= w)                     # (OW, KW)
        padded = oy_out[:, None, :, None] | ox_out[None, :, None, :]  # (OH, OW, KH, KW)
        # per tap, the sum of the weights over the input channels
        tapsum = unpackbits(self.words, self.cin).astype(np.int32).sum(-1).reshape(self.o, -1)
        c = -(padded.reshape(oh * ow, -1).astype(np.int32) @ tapsum.T).T
        self._corr[key] = c = np.ascontiguousarray(c, np.int32)
        return c


class _Direct:
    """The direct kernels' plan (``g`` in ``c/binary.c``) for one layer and input size: no
    column building, the input packed into a padded planar image the kernels read in place.
    Everything but the input, the scale and the output is fixed here, once."""

    def __init__(self, conv: _Conv, h: int, w: int, padding, dilation, pad_value: int):
        lib = _lib()
        self.conv = conv
        nb = lib.tsr_bin_direct_block()
        ph, pw = padding
        hp, wp = h + 2 * ph, w + 2 * pw
        oh = _out_size(h, conv.kh, 1, ph, dilation[0])
        ow = _out_size(w, conv.kw, 1, pw, dilation[1])
        self.oh, self.ow = oh, ow
        self.wb = conv.blocked(nb)
        self.corr = self.base = None
        if pad_value == 0 and any(padding):
            self.corr = conv.corr(h, w, (1, 1), padding, dilation, oh, ow)
            kbits = conv.cin * conv.kh * conv.kw
            self.base = (self.corr + kbits).astype(np.float32)  # exact: below 2^24
        last = conv.cin - 64 * (conv.cw - 1)
        ones = (1 << 64) - 1
        pad, pad_last = (ones, ones >> (64 - last)) if pad_value == -1 else (0, 0)
        off = [cw * hp * wp + ky * dilation[0] * wp + kx * dilation[1]
               for ky in range(conv.kh) for kx in range(conv.kw) for cw in range(conv.cw)]
        k = len(off)
        g = [conv.cw, conv.cin, h, w, ph, pw, hp, wp, oh, ow, conv.o, k, conv.cin * conv.kh *
             conv.kw, pad - (1 << 64) if pad >> 63 else pad,
             pad_last - (1 << 64) if pad_last >> 63 else pad_last,
             self.wb.ctypes.data, 0 if self.corr is None else self.corr.ctypes.data,
             0 if self.base is None else self.base.ctypes.data, conv.src_words.ctypes.data,
             conv.src_words.nbytes, 0, 0] + off
        self.g = np.array(g, np.int64)
        self.gp = self.g.ctypes.data
        # the image, the thresholds' table of a thresholded call and the AVX2 path's nibble
        # planes (``c/binary.c``)
        self.img_words = lib.tsr_bin_direct_scratch(self.gp)
        # the AVX2 path's bit planes (``c/binary_planes.h``), when its counters fit 16 bits
        self.geo = (h, w, ph, pw, hp, wp, tuple(dilation))
        self.pl_words = 0
        if conv.cin * conv.kh * conv.kw < 1 << 15:
            self.pl_words = _planes_words(conv, self.geo, oh, ow)
            self.img_words += self.pl_words + 8
        self.nb, self.k = nb, k
        self.tables: np.ndarray | None = None  # the AVX2 path's, made on its first call
        # one packed image kept for the calls on one thread (a concurrent call makes its own)
        self.img = np.empty(self.img_words, np.uint64)
        self.img_ptr = self.img.ctypes.data
        self.img_free = threading.Lock()
        self.out_shape = (conv.o, oh, ow)
        self.out: np.ndarray | None = None  # the last output, reused once nothing holds it
        self.bits_shape = (oh, ow, -(-conv.o // 64))
        self.bout: np.ndarray | None = None  # the same, of a thresholded (bit-packed) call
        self.in_bytes = (conv.cin * h * w * 4, h * w * conv.cw * 8)  # an image, float, bits
        self.o = conv.o
        self.work = conv.o * oh * ow * k

    def nibble_tables(self) -> None:
        """The AVX2 path's tables: the bit planes' plan (``D_PLN``) where it applies, else
        (``D_NIB``) for each weight nibble ``w`` the 16 bytes ``popcount(i xor w)``, at
        ``[o // nb, k, nibble, o % nb]``."""
        if self.tables is None and self.pl_words:
            self.planes = _planes_plan(self.conv, self.wb, self.geo, self.oh, self.ow)
            self.tables = self.planes[0]
            self.g[_D_PLN] = self.planes[0].ctypes.data
        if self.tables is None:
            nib = (self.wb[..., None] >> (4 * np.arange(16, dtype=np.uint64))) & np.uint64(15)
            nib = nib.astype(np.uint8).transpose(0, 1, 3, 2)         # (O / nb, K, 16, nb)
            pop4 = np.array([bin(i).count("1") for i in range(16)], np.uint8)
            self.tables = np.ascontiguousarray(pop4[nib[..., None] ^ np.arange(16,
                                                                               dtype=np.uint8)])
            self.g[_D_NIB] = self.tables.ctypes.data


def _planes_layout(conv: _Conv, geo: tuple, oh: int, ow: int) -> dict:
    """The bit planes' geometry (``c/binary_planes.h``): segments a word ``s`` of width
    ``sw``, words a row ``J``, words a padded input row ``JW``, the length of a source row
    ``RS``, bands, the words of the source rows ``R`` and of the transposed rows."""
    h, w, ph, pw, hp, wp, (dh, dw) = geo
    if ow <= 32:
        sw = 1 << (ow - 1).bit_length()
        s, j = 64 // sw, 1
        slots = -(-oh // s)
    else:
        sw, s, j = 64, 1, -(-ow // 64)
        slots = oh * j
    bands = -(-slots // 4)
    hp4 = -(-hp // 4) * 4
    jw = -(-wp // 64)
    khc = 1 if s == 1 else conv.kh
    rs = hp4 * j + 4 if s == 1 else 4 * bands
    r = conv.cin * khc * conv.kw * rs
    rw = 0 if s == 1 and jw == 1 else conv.cin * hp4 * (jw + 1)
    return dict(s=s, sw=sw, j=j, jw=jw, rs=rs, bands=bands, khc=khc, hp4=hp4, r=r, rw=rw)


def _planes_words(conv: _Conv, geo: tuple, oh: int, ow: int) -> int:
    lay = _planes_layout(conv, geo, oh, ow)
    return lay["r"] + lay["rw"]


def _planes_plan(conv: _Conv, wb: np.ndarray, geo: tuple, oh: int, ow: int) -> tuple:
    """The bit planes' plan ``pl`` and the arrays it points to: per output channel the
    smaller of its sets of planes with weight bit 0 (mode 0) and 1 (mode 1), as byte offsets
    of the planes, tap-major then channel, as the weights' bits (``tsr_bin_planes_lists``,
    from the blocked weights ``wb``: the C a library runs at load)."""
    lay = _planes_layout(conv, geo, oh, ow)
    dh, dw = geo[6]
    lib, taps = _lib(), conv.kh * conv.kw
    chan = np.empty((conv.o, 4), np.int64)
    args = (wb.ctypes.data, conv.o, conv.cin, conv.cw, taps, chan.ctypes.data)
    idx = np.zeros(max(1, lib.tsr_bin_planes_lists(*args, None)), np.int32)
    lib.tsr_bin_planes_lists(*args, idx.ctypes.data)
    n_planes = taps * conv.cin
    width = max(5, int(n_planes).bit_length() + 1)
    pl = np.array([conv.kh, conv.kw, dh, dw, lay["s"], lay["sw"], lay["j"], lay["jw"],
                   lay["rs"], lay["bands"], width, n_planes, lay["khc"], lay["hp4"],
                   chan.ctypes.data, idx.ctypes.data, lay["r"]], np.int64)
    return pl, chan, idx


_PACKED: dict[tuple, tuple[weakref.ref, _Conv]] = {}


def _prepared(words: np.ndarray, cin: int) -> _Conv:
    """``words`` as the kernels read them, cached for as long as the array that owns its
    memory lives (a module's weights are prepared once, through any view of them)."""
    owner = words
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    key = (id(owner), _addr(words), words.shape, words.strides, cin)
    hit = _PACKED.get(key)
    if hit is not None and hit[0]() is owner and hit[1].current(words):
        return hit[1]
    p = _Conv(words, cin)

    def forget(_ref, key: tuple = key, table: dict = _PACKED) -> None:
        table.pop(key, None)  # the table itself: at exit the module's globals are gone
    try:
        _PACKED[key] = (weakref.ref(owner, forget), p)
    except TypeError:
        pass
    return p


# the weights a layer's calls pass, by id, with their input size and geometry: a weak
# reference to the array (its id is its own while it lives) and the plan to run
_SEEN: dict[tuple, tuple[weakref.ref, _Direct]] = {}
_F32 = np.dtype(np.float32)


def _remember(key: tuple, words: np.ndarray, plan: _Direct) -> None:
    def forget(_ref, key: tuple = key, table: dict = _SEEN) -> None:
        table.pop(key, None)
    try:
        _SEEN[key] = (weakref.ref(words, forget), plan)
    except TypeError:  # unhashable geometry (lists): no fast path for such calls
        pass


def _geometry(x, words, cin, stride, padding, dilation):
    if _is_bits(x):   # bit-packed: (N, H, W, ceil(C / 64)) words
        if x.ndim != 4 or x.shape[3] != -(-cin // 64) or words.ndim != 4 or \
                words.shape[3] * 64 < cin:
            raise RuntimeError(f"binary conv2d: bit-packed input {tuple(x.shape)} and packed "
                               f"weights {tuple(words.shape)} for {cin} input channels do not "
                               f"fit: expected (N, H, W, {-(-cin // 64)}) words")
        hw = x.shape[1:3]
    elif x.ndim != 4 or x.shape[1] != cin or words.ndim != 4 or words.shape[3] * 64 < cin:
        raise RuntimeError(f"binary conv2d: input {tuple(x.shape)} and packed weights "
                           f"{tuple(words.shape)} for {cin} input channels do not fit")
    else:
        hw = x.shape[2:]
    oh = _out_size(hw[0], words.shape[1], stride[0], padding[0], dilation[0])
    ow = _out_size(hw[1], words.shape[2], stride[1], padding[1], dilation[1])
    if oh <= 0 or ow <= 0:
        raise RuntimeError(f"binary conv2d: the output would be empty (input "
                           f"{tuple(x.shape)}, kernel {tuple(words.shape[1:3])})")
    return oh, ow


def _is_bits(x: np.ndarray) -> bool:
    """Whether ``x`` holds bit-packed words (64-bit integers) rather than values."""
    return x.dtype.kind in "iu" and x.dtype.itemsize == 8


def _check_threshold(threshold: np.ndarray | None, o: int) -> np.ndarray | None:
    if threshold is None:
        return None
    if threshold.dtype != np.int64 or threshold.shape != (o, 2):
        raise RuntimeError(f"binary: thresholds must be int64 of shape ({o}, 2), one (t, flip) "
                           f"per output channel, got {threshold.shape} of {threshold.dtype}")
    return np.ascontiguousarray(threshold)


def conv2d(x: np.ndarray, words: np.ndarray, cin: int, *, stride=(1, 1), padding=(0, 0),
           dilation=(1, 1), pad_value: int = -1, scale: np.ndarray | None = None,
           threshold: np.ndarray | None = None, path: str | None = None) -> np.ndarray:
    """The binary convolution of ``x`` with packed weights ``words`` (O, KH, KW, ceil(C/64)).

    ``x`` is float (N, C, H, W), binarized, or bit-packed words (int64 or uint64,
    (N, H, W, ceil(C/64)): ``packbits`` of the channels, as a thresholded call writes them).
    The result is float32 (N, O, OH, OW), ``float32(dot) * scale[o]``; or, with
    ``threshold`` (int64 (O, 2): per channel ``(t, flip)``), the signs ``(dot < t) xor
    flip`` (set: -1) bit-packed, int64 (N, OH, OW, ceil(O/64)).

    >>> x = np.ones((1, 1, 3, 3), np.float32); w = packbits(-np.ones((1, 3, 3, 1)))
    >>> conv2d(x, w, 1, padding=(1, 1), pad_value=-1)[0, 0, 0].tolist()  # 4 in, 5 padded
    [1.0, -3.0, 1.0]
    >>> t = np.array([[0, 0]])                                          # dot < 0: -1
    >>> conv2d(x, w, 1, padding=(1, 1), threshold=t)[0, 0].ravel().tolist()  # one word each
    [0, 1, 0]
    """
    path = path or isa()
    if path != "numpy":
        # a layer's next call at an input size it has seen: its plan holds the rest
        try:
            hit = _SEEN.get((id(words), x.shape, x.dtype.char, cin, stride, padding, dilation,
                             pad_value))
        except TypeError:  # lists for tuples: the long way
            hit = None
        if hit is not None and hit[0]() is words:
            bits = _is_bits(x)
            if bits:
                x = np.ascontiguousarray(x)
            elif x.dtype != _F32 or not x.flags.c_contiguous:
                x = np.ascontiguousarray(x, np.float32)
            if scale is not None and (scale.dtype != _F32 or not scale.flags.c_contiguous):
                scale = np.ascontiguousarray(scale, np.float32)
            if threshold is not None:
                threshold = _check_threshold(threshold, hit[1].o)
            # None: the weights were written in place since the plan was made
            out = _direct(_lib(), path, x, hit[1], scale, words, threshold, bits)
            if out is not None:
                return out
    key = (id(words), x.shape, x.dtype.char, cin, stride, padding, dilation, pad_value)
    words_in = words
    pad_value = _check_pad(pad_value)
    stride, padding, dilation = tuple(stride), tuple(padding), tuple(dilation)
    if words.dtype == np.int64:  # int64 tensors hold the words (``binary_pack``)
        words = words.view(np.uint64)
    bits = _is_bits(x)
    if bits:
        x = np.ascontiguousarray(x).view(np.uint64)
    oh, ow = _geometry(x, words, cin, stride, padding, dilation)
    threshold = _check_threshold(threshold, words.shape[0])
    scale = None if scale is None else np.ascontiguousarray(scale, np.float32)
    if path == "numpy":
        return reference_conv2d(x, words, cin, stride=stride, padding=padding,
                                dilation=dilation, pad_value=pad_value, scale=scale,
                                threshold=threshold)
    lib = _lib()
    if not bits:
        x = np.ascontiguousarray(x, np.float32)
    n = x.shape[0]
    h, w = x.shape[1:3] if bits else x.shape[2:]
    pw = _prepared(words, cin)
    plan = pw.plan(h, w, stride, padding, dilation, pad_value)
    if plan is not None:
        _remember(key, words_in, plan)
        return _direct(lib, path, x, plan, scale, None, threshold, bits)  # type: ignore
    m = oh * ow
    mip = -(-m // _TW) * _TW
    halves = 2 * pw.kh * pw.kw * pw.cw
    cols = np.empty((halves, n * mip), np.uint32)
    geo = np.array([pw.cw, h, w, pw.kh, pw.kw, *stride, *padding, *dilation, oh, ow, mip,
                    n * mip], np.int64)
    last = cin - 64 * (pw.cw - 1)
    ones = (1 << 64) - 1
    fill, fill_last = (ones, ones >> (64 - last)) if pad_value == -1 else (0, 0)
    corr = None
    if pad_value == 0 and any(padding):
        corr = pw.corr(h, w, stride, padding, dilation, oh, ow)
    out = np.empty((n, pw.o, oh, ow), np.float32)
    kbits = cin * pw.kh * pw.kw
    _columns(lib, x, cin, geo, fill, fill_last, cols, pw.cw * h * w, halves * m, bits)
    if threshold is not None:  # the exact dot products, then their signs
        _gemm(path, cols, m, pw.rows, out, m, kbits, corr, None, False, pw.o * m)
        return _signs_packed(out, threshold, 1)
    _gemm(path, cols, m, pw.rows, out, m, kbits, corr, scale, False, pw.o * m)
    return out


_PATH = {"c": 0, "avx2": 1, "vpopcnt": 2}
# the slots of the plan ``g`` that hold pointers (``D_WB`` .. ``D_PLN`` in ``c/binary.c``):
# the blocked weights, the padding's corrections, their float bases, the weights' copy and
# its size, the AVX2 tables and the AVX2 bit planes' plan; and those of the planes' plan
# (``PL_CH``, ``PL_IDX`` in ``c/binary_planes.h``)
_D_WB, _D_CORR, _D_BASE, _D_SRC, _D_SRC_BYTES, _D_NIB, _D_PLN = range(15, 22)
_PL_CH, _PL_IDX = 14, 15
_refs = sys.getrefcount


def _signs_packed(dot: np.ndarray, threshold: np.ndarray, axis: int) -> np.ndarray:
    """``(dot < t) xor flip`` along the channel ``axis`` of exact integer dot products,
    moved last and bit-packed: int64 words."""
    shape = [1] * dot.ndim
    shape[axis] = -1
    neg = (dot < threshold[:, 0].reshape(shape)) != (threshold[:, 1] & 1).astype(bool).reshape(
        shape)
    neg = np.moveaxis(neg, axis, -1)
    return packbits(np.where(neg, -1.0, 1.0).astype(np.float32)).view(np.int64)


def _direct(lib, path: str, x: np.ndarray, plan: _Direct, scale: np.ndarray | None,
            words: np.ndarray | None, threshold: np.ndarray | None = None,
            bits: bool = False) -> np.ndarray | None:
    """The stride-1 convolution on the direct kernels: each image packed once (or, bit-packed
    already, copied) into a padded image the kernels read in place; one C call on one
    thread, else the images (or, for one image, the output channels) split over the kernel
    threads. With ``threshold``, the output is bit-packed. With ``words``, None if they no
    longer hold the values the plan was made from (checked in the C call on one thread).
    The output is the plan's last one when nothing else holds it (an output the caller
    still has, or any view of it, keeps it; then a new one)."""
    n = x.shape[0]
    # two references when nothing else holds it: the plan's and getrefcount's argument
    if threshold is None:
        out = plan.out
        if out is None or _refs(out) != 2 or out.shape[0] != n:
            plan.out = out = np.empty((n,) + plan.out_shape, np.float32)
        tp = 0
    else:
        out = plan.bout
        if out is None or _refs(out) != 2 or out.shape[0] != n:
            plan.bout = out = np.empty((n,) + plan.bits_shape, np.int64)
        tp = _addr(threshold)
    sp = 0 if scale is None else _addr(scale)
    xp, op, code = _addr(x), _addr(out), _PATH[path]
    if code == 1 and plan.tables is None:
        plan.nibble_tables()
    if n * plan.work >= _SPLIT_OPS and threadpool.usable():
        if words is not None and not plan.conv.current(words):
            return None
        t = threadpool._threads()
        if n >= t:
            step = -(-n // t)
            imgs = [np.empty(plan.img_words, np.uint64) for _ in range(0, n, step)]
            parts = [(plan.gp, code | 4 * bits, xp, sp, op, im.ctypes.data, i,
                      min(i + step, n), 0, tp) for im, i in zip(imgs, range(0, n, step))]
            if threadpool.run(lib.tsr_bin_direct, parts) is not None:
                return out
        else:
            nb = lib.tsr_bin_direct_block()
            img = np.empty(plan.img_words, np.uint64)
            ip = img.ctypes.data
            step = -(-plan.o // t)
            step = -(-step // nb) * nb   # bit-packed: parts never share a byte
            osz = out[0].nbytes
            fill = lib.tsr_bin_direct_bits if bits else lib.tsr_bin_direct_pack
            for i in range(n):
                fill(plan.gp, xp + i * plan.in_bytes[bits], ip)
                if code == 1:
                    lib.tsr_bin_direct_nibbles(plan.gp, ip)
                chunks = [(plan.gp, code, ip, sp, op + i * osz, j, min(j + step, plan.o), tp)
                          for j in range(0, plan.o, step)]
                if threadpool.run(lib.tsr_bin_direct_conv, chunks) is None:
                    for c in chunks:
                        lib.tsr_bin_direct_conv(*c)
            return out
    wp = 0
    if words is not None:
        if words.flags.c_contiguous:
            wp = _addr(words)
        elif not plan.conv.current(words):
            return None
    if bits:
        code |= 4
    if plan.img_free.acquire(blocking=False):
        try:
            stale = lib.tsr_bin_direct(plan.gp, code, xp, sp, op, plan.img_ptr, 0, n, wp, tp)
        finally:
            plan.img_free.release()
    else:
        img = np.empty(plan.img_words, np.uint64)
        stale = lib.tsr_bin_direct(plan.gp, code, xp, sp, op, img.ctypes.data, 0, n, wp, tp)
    return None if stale else out


def _columns(lib, x: np.ndarray, c: int, geo: np.ndarray, fill: int, fill_last: int,
             cols: np.ndarray, plane: int, work: int, bits: bool = False) -> None:
    """The binarized columns of every image of ``x`` (float, or bit-packed words), split
    over the kernel threads."""
    n = x.shape[0]
    from tessera.kernels import threadpool
    t = threadpool._threads() if n > 1 and n * work >= _SPLIT_OPS and threadpool.usable() else 1
    step = -(-n // t)
    bounds = list(range(0, n, step))
    scratch = [np.empty(plane, np.uint64) for _ in bounds]
    f = lib.tsr_bin_columns_bits if bits else lib.tsr_bin_columns
    parts = [(x.ctypes.data, c, geo.ctypes.data, fill, fill_last, s.ctypes.data,
              cols.ctypes.data, i, min(i + step, n)) for i, s in zip(bounds, scratch)]
    if len(parts) > 1 and threadpool.run(f, parts) is not None:
        return
    for p in parts:
        f(*p)


def _rows_of_bits(x: np.ndarray, cin: int) -> np.ndarray:
    """Bit-packed rows as the product reads them: uint64, the last word's unused bits
    cleared."""
    rows = np.ascontiguousarray(x).view(np.uint64)
    if cin % 64:
        rows = rows.copy()
        rows[:, -1] &= np.uint64((1 << (cin % 64)) - 1)
    return rows


def linear(x: np.ndarray, words: np.ndarray, cin: int, *, scale: np.ndarray | None = None,
           threshold: np.ndarray | None = None, path: str | None = None) -> np.ndarray:
    """The binary product of ``x`` and packed weights ``words`` (O, ceil(cin/64)): ``x``
    float (B, cin), binarized, or bit-packed words (int64 or uint64, (B, ceil(cin/64))).
    The result is float32 (B, O), ``float32(dot) * scale[o]``, or with ``threshold``
    (int64 (O, 2)) the signs ``(dot < t) xor flip`` bit-packed, int64 (B, ceil(O/64)).

    >>> w = packbits(np.array([[1.0, -1.0, 1.0]]))
    >>> linear(packbits(np.array([[-1.0, 2.0, -0.5]])), w, 3).tolist()
    [[-3.0]]
    """
    path = path or isa()
    bits = _is_bits(x)
    width = -(-cin // 64) if bits else cin
    if x.ndim != 2 or x.shape[1] != width or words.ndim != 2 or words.shape[1] * 64 < cin:
        what = "bit-packed input" if bits else "input"
        raise RuntimeError(f"binary linear: {what} {tuple(x.shape)} and packed weights "
                           f"{tuple(words.shape)} for {cin} inputs do not fit")
    threshold = _check_threshold(threshold, words.shape[0])
    scale = None if scale is None else np.ascontiguousarray(scale, np.float32)
    if path == "numpy":
        return reference_linear(x, words, cin, scale=scale, threshold=threshold)
    rows = _rows_of_bits(x, cin) if bits else _rows_of(np.ascontiguousarray(x, np.float32))
    o = words.shape[0]
    # the weights are the columns: a batch of one still fills the 16-wide tiles
    op = -(-o // _TW) * _TW
    a = np.zeros((2 * words.shape[1], op), np.uint32)
    a[:, :o] = np.ascontiguousarray(words).view(np.uint64).view(np.uint32).T
    out = np.empty((x.shape[0], o), np.float32)
    _gemm(path, a, o, rows.view(np.uint32), out, o, cin, None,
          None if threshold is not None else scale, True)
    return out if threshold is None else _signs_packed(out, threshold, 1)


# ---- the reference ---------------------------------------------------------------------------

def _scaled(dot: np.ndarray, scale: np.ndarray | None, axis_shape) -> np.ndarray:
    v = dot.astype(np.float32)
    if scale is not None:
        v = v * np.asarray(scale, np.float32).reshape(axis_shape)
    return v


def _signs_of(x: np.ndarray, cin: int) -> np.ndarray:
    """-1/+1 int64 values (N, C, H, W) of float ``x`` or of bit-packed words
    (N, H, W, ceil(C/64))."""
    if _is_bits(x):
        return unpackbits(x, cin).astype(np.int64).transpose(0, 3, 1, 2)
    return np.where(np.asarray(x) < 0, -1, 1).astype(np.int64)


def reference_conv2d(x: np.ndarray, words: np.ndarray, cin: int, *, stride=(1, 1),
                     padding=(0, 0), dilation=(1, 1), pad_value: int = -1,
                     scale: np.ndarray | None = None,
                     threshold: np.ndarray | None = None) -> np.ndarray:
    """The definition of ``conv2d`` in NumPy integers.

    >>> x = np.ones((1, 1, 3, 3), np.float32); w = packbits(-np.ones((1, 3, 3, 1)))
    >>> reference_conv2d(x, w, 1, padding=(1, 1), pad_value=0)[0, 0, 0].tolist()
    [-4.0, -6.0, -4.0]
    """
    pad_value = _check_pad(pad_value)
    oh, ow = _geometry(x, words, cin, stride, padding, dilation)
    o, kh, kw, _ = words.shape
    xs = np.pad(_signs_of(x, cin), ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2),
                constant_values=pad_value)
    ws = unpackbits(words, cin).astype(np.int64)          # (O, KH, KW, C)
    _check_threshold(threshold, o)
    dot = np.zeros((x.shape[0], o, oh, ow), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            y0, x0 = ky * dilation[0], kx * dilation[1]
            win = xs[:, :, y0:y0 + (oh - 1) * stride[0] + 1:stride[0],
                     x0:x0 + (ow - 1) * stride[1] + 1:stride[1]]
            dot += np.einsum("nchw,oc->nohw", win, ws[:, ky, kx])
    if threshold is not None:
        return _signs_packed(dot, threshold, 1)
    return _scaled(dot, scale, (1, o, 1, 1))


def reference_linear(x: np.ndarray, words: np.ndarray, cin: int, *,
                     scale: np.ndarray | None = None,
                     threshold: np.ndarray | None = None) -> np.ndarray:
    """The definition of ``linear`` in NumPy integers.

    >>> reference_linear(np.array([[-1.0, 2.0]]), packbits(np.array([[1.0, 1.0]])), 2)
    array([[0.]], dtype=float32)
    """
    if _is_bits(x):
        xs = unpackbits(x, cin).astype(np.int64)
    else:
        xs = np.where(np.asarray(x) < 0, -1, 1).astype(np.int64)
    ws = unpackbits(words, cin).astype(np.int64)
    if threshold is not None:
        _check_threshold(threshold, ws.shape[0])
        return _signs_packed(xs @ ws.T, threshold, 1)
    return _scaled(xs @ ws.T, scale, (1, -1))
