"""Direct 2-d convolution in C (``c/direct_conv.h``) for small ungrouped stride-1
convolutions (LeNet-sized), with its input and weight gradients, where im2col + GEMM leaves
BLAS skinny products (6 x 25 x 784 for LeNet's first layer) running far below its peak.

Each thread copies an image's channel planes into a zero-padded scratch (C, HP, WP), so no
inner loop checks bounds. Read flat, output q = oh * WP + ow then takes tap (c, kh, kw)
from scratch element q + c * HP * WP + kh * DH * WP + kw * DW: the whole image is one
unit-stride loop over q per tap (the WP - OW columns past each output row are computed and
dropped). The forward kernel keeps a tile of OB output channels by NV vectors of q in
registers; per tap it loads the NV input vectors once and uses them for all OB channels.
The input gradient is the same kernel run on the output gradient with the filters turned
180 degrees and their channels swapped (low paddings DH (KH - 1) - PH, DW (KW - 1) - PW:
negative ones crop); when the padding is narrower than the filter, most of that padded
work is zeros, and it is scattered instead: the output gradient copied into the flat
layout (zeros in the dropped columns), each tap's products added into padded planes at
its offset, then cropped. The weight gradient takes dot products of that flat output
gradient with the shifted scratch, a tile of OB channels by TB taps in registers; over
enough taps, each image's gradient is transposed instead and the tile's vectors run over
output channels (broadcasting the input), so no dropped column is computed. Fixed chunks
of the images each sum into their own buffer, and the buffers add up in a fixed order, so
results repeat run to run. Images (chunks of them for the weight gradient) are the work
items, taken by the kernel threads from a shared counter. Each kernel (a kind, a tile and a
dtype) compiles on its first call, or when a graph's trace asks for it (``prefetch``), as a
library of its own.

``chosen`` is the rule, measured per layer shape, for when this beats im2col + GEMM.
``TESSERA_DIRECT_CONV=0`` turns the path off (read once).

>>> x, w = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32)
>>> y = np.empty((1, 1, 4, 4), np.float32)
>>> conv2d_direct(x, w, None, (1, 1), (1, 1), y) if usable(np.float32) else y.fill(9)
>>> float(y[0, 0, 1, 1])
9.0
"""
from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

from tessera.kernels.csource import source
from tessera.kernels.window import check_conv

__all__ = ["enabled", "usable", "chosen", "conv2d_direct", "conv2d_input_grad_direct",
           "conv2d_weight_grad_direct"]

# forward tiles (OB output channels, NV vectors of outputs): OB * NV accumulators, NV input
# vectors and a broadcast weight fit the 16 vector registers of AVX2; the scattered input
# gradient's tiles (CB input channels, NV vectors) are the same
_FWD_TILES = ((6, 2), (4, 3), (3, 4), (2, 5), (1, 8))
# weight-gradient tiles (OB output channels, TB taps): OB * TB accumulators, OB gradient
# vectors and one input vector
_WGRAD_TILES = ((2, 6), (3, 4))
# the channel-vector weight gradient's (OV vectors of output channels, TB taps): OV * TB
# accumulators, OV gradient vectors and a broadcast input
_WGRADC_TILES = ((2, 6), (2, 5), (1, 12), (1, 9))
_VECTOR_BYTES = 32


def _header(s: str) -> str:
    """The macros and types every kernel of dtype ``s`` (f32 or f64) is built from: the
    kernels' macros (``c/direct_conv.h``), this dtype's vectors and its ``COMMON`` helpers."""
    t = {"f32": "float", "f64": "double"}[s]
    return "\n".join([
        source("direct_conv.h"),
        # U: the same vector at any element address (unaligned loads and stores)
        f"typedef {t} v_{s} __attribute__((vector_size({_VECTOR_BYTES})));",
        f"typedef {t} u_{s} __attribute__((vector_size({_VECTOR_BYTES}), "
        f"aligned(sizeof({t})), may_alias));",
        f"COMMON({t}, {s})"])


def _instances(s: str) -> dict[str, str]:
    """The kernels of dtype ``s`` by name (``fwd_f32_6`` is ``tsr_dconv_fwd_f32_6``): the
    macro call defining each."""
    t = {"f32": "float", "f64": "double"}[s]
    a = f"{t}, {s}, v_{s}, u_{s}, {_VECTOR_BYTES // (4 if s == 'f32' else 8)}"
    out = {f"fwd_{s}_{ob}": f"FWD({a}, {ob}, {nv})" for ob, nv in _FWD_TILES}
    out |= {f"wgrad_{s}_{ob}": f"WGRAD({a}, {ob}, {tb})" for ob, tb in _WGRAD_TILES}
    out |= {f"igrad_{s}_{cb}": f"IGRAD({a}, {cb}, {nv})" for cb, nv in _FWD_TILES}
    out |= {f"wgradc_{s}_{ov}_{tb}": f"WGRADC({a}, {ov}, {tb})" for ov, tb in _WGRADC_TILES}
    return out


_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
_P, _I = ctypes.c_void_p, ctypes.c_int64
_ARGTYPES = {"fwd": [_P] * 5 + [_I, _P, _P, _I], "igrad": [_P] * 4 + [_I, _P, _P, _I],
             "wgrad": [_P] * 4 + [_I, _I, _P, _P, _I], "wgradc": [_P] * 4 + [_I, _I, _P, _P, _I]}


@functools.cache
def _kernel(name: str):
    """The C function ``tsr_dconv_<name>`` (``fwd_f32_6``, ...), compiled on its first use
    (or by ``prefetch``) as a library of its own, so that a graph compiles only the tiles
    its layers take, not a dtype's 16 (bench compile: cnn train)."""
    from tessera.kernels.conv import once
    f = getattr(once(("direct", name), functools.partial(_build, name)), f"tsr_dconv_{name}")
    f.argtypes, f.restype = _ARGTYPES[name.split("_")[0]], None
    return f


def _build(name: str):
    from tessera.kernels.cc import load
    s = name.split("_")[1]
    return load([_header(s), _instances(s)[name]])


def prefetch(kind: str, c: int, o: int, ksize, out_sp, in_sp, dilation, dtype) -> None:
    """Start compiling, in the background, the kernel that the ``kind`` ("forward",
    "input_grad", "weight_grad") of a direct convolution (``chosen``) of ``c`` -> ``o``
    channels, filters ``ksize``, output ``out_sp`` and input ``in_sp`` will call."""
    from tessera.kernels.conv import background
    s = _SUFFIX[np.dtype(dtype)]
    if kind == "weight_grad":
        name = _wgrad_name(o, c * ksize[0] * ksize[1], dtype)
    elif kind == "input_grad":
        name = f"{'igrad' if _scatters(out_sp, in_sp, ksize, dilation) else 'fwd'}_{s}_" \
               f"{_fwd_tile(c)[0]}"
    else:
        name = f"fwd_{s}_{_fwd_tile(o)[0]}"
    background(("direct", name), functools.partial(_build, name))


_ON = os.environ.get("TESSERA_DIRECT_CONV", "1") not in ("0", "", "false", "off")


def enabled() -> bool:
    """Whether ``TESSERA_DIRECT_CONV`` (read once, at import) lets the direct path run."""
    return _ON


def usable(dtype) -> bool:
    """Whether the direct kernels can run for ``dtype``: switched on and C kernels
    available (the toolchain works; each kernel compiles on its first call)."""
    from tessera.kernels.window import available
    return _ON and available(dtype)


def chosen(n: int, c: int, o: int, oh: int, ow: int, kh: int, kw: int, dtype,
           kind: str = "forward") -> bool:
    """Whether a stride-1 convolution of ``n`` images, ``c`` -> ``o`` channels, ``kh`` x
    ``kw`` filters and output ``oh`` x ``ow`` runs its ``kind`` ("forward", "input_grad",
    "weight_grad") directly rather than as im2col + GEMM (bench demo: LeNet-5's layers;
    bench training: cnn):

    * filters of more than one tap (a 1x1 filter has no im2col to save) and
      c * kh * kw * o <= 8192, where the GEMMs are skinny;
    * the input gradient also needs o <= 8 c: it runs as a convolution with c outputs, and
      few of them use the load-bound tiles;
    * the weight gradient also needs c * kh * kw >= 32 (its channel-vector kernel) or, for
      the flat kernel, oh * ow >= 196: its dot products run over one image's outputs, and
      short ones do not pay.

    >>> chosen(64, 1, 6, 28, 28, 5, 5, np.float32) == usable(np.float32)
    True
    """
    if kh * kw == 1 or c * kh * kw * o > 8192:
        return False
    if kind == "input_grad" and o > 8 * c \
            or kind == "weight_grad" and oh * ow < 196 and c * kh * kw < _CHANNEL_TAPS:
        return False
    return usable(dtype)


def _lanes(dtype) -> int:
    return _VECTOR_BYTES // np.dtype(dtype).itemsize


@functools.cache
def _fwd_tile(o: int) -> tuple[int, int]:
    """The forward tile for ``o`` output channels with the fewest cycles per output vector
    (a tile step is bound by its OB * NV FMAs or its NV + OB loads, two of each a cycle),
    counting the padding channels of the last block; the larger OB on a tie."""
    return min(_FWD_TILES, key=lambda t: -(-o // t[0]) * max(t[0] * t[1], t[0] + t[1]) / t[1])


@functools.cache
def _wgrad_tile(o: int, ck: int) -> tuple[int, int]:
    """The weight-gradient tile wasting the fewest padding channels and taps."""
    return min(_WGRAD_TILES, key=lambda t: -(-o // t[0]) * t[0] * (-(-ck // t[1]) * t[1]))


@functools.cache
def _wgradc_tile(o: int, ck: int, lanes: int) -> tuple[int, int]:
    """The channel-vector weight-gradient tile wasting the fewest padding channels and
    taps; the one with more vectors on a tie (fewer broadcasts per multiply-add)."""
    return min(_WGRADC_TILES, key=lambda t: (-(-o // (t[0] * lanes)) * t[0] * lanes
                                             * (-(-ck // t[1]) * t[1]), -t[0]))


def _run(f, args: tuple, threads: int, d: np.ndarray) -> None:
    """``f(*args, t)`` for t in range(threads), on the kernel pool's threads. A thread
    that cannot allocate its tap table takes no item and the others take them all; when
    none could, the shared counter (``d``'s last entry) never moved: an error, not an
    output left unwritten."""
    if threads < 2:
        f(*args, 0)
    else:
        from tessera.kernels import threadpool as runtime
        runtime.fork_join(f, [(*args, t) for t in range(threads)])
    if d[-1] == 0:
        raise MemoryError("direct convolution: no thread could allocate its tap table")


def _geometry(x: np.ndarray, o: int, pads, oh: int, ow: int, ksize, dilation, q: int,
              blocks: int, taps: int, flip: int) -> tuple[np.ndarray, int]:
    """(the C kernels' geometry d, with a zero work counter last; the scratch elements of
    the padded image plus its slack) for outputs rounded up to ``q`` a tile and ``blocks``
    blocks of channels."""
    n, c, h, wd = x.shape
    kh, kw = ksize
    hp, wp = oh + dilation[0] * (kh - 1), ow + dilation[1] * (kw - 1)
    qr = -(-oh * wp // q) * q
    sl = qr - oh * wp + dilation[1] * (kw - 1)
    d = np.array([c, h, wd, o, *pads, oh, ow, n, hp, wp, qr, blocks, c * kh * kw, sl,
                  kh, kw, *dilation, flip, taps, 0], np.int64)
    return d, c * hp * wp + sl


def _forward(x: np.ndarray, w: np.ndarray, b, pads, dilation, y: np.ndarray,
             flip: int) -> None:
    """``y`` = the stride-1 correlation of ``x`` with ``w`` (turned when ``flip``)."""
    from tessera.kernels.conv import _threads, _workspace
    n, o = x.shape[0], y.shape[1]
    ob, nv = _fwd_tile(o)
    ksize = w.shape[2:]
    ck = x.shape[1] * ksize[0] * ksize[1]
    d, xs = _geometry(x, o, pads, y.shape[2], y.shape[3], ksize, dilation, nv * _lanes(x.dtype),
                      -(-o // ob), ck, flip)
    nb, qr = int(d[12]), int(d[11])
    threads = min(_threads(n * o * ck * y.shape[2] * y.shape[3]), n)
    ws = xs + nb * ob * (qr + ck)
    work = _workspace(ws * threads, x.dtype, "direct")
    f = _kernel(f"fwd_{_SUFFIX[x.dtype]}_{ob}")
    dp = d.ctypes.data
    _run(f, (x.ctypes.data, w.ctypes.data, None if b is None else b.ctypes.data,
             y.ctypes.data, work.ctypes.data, ws, dp + 8 * (d.size - 1), dp), threads, d)


def conv2d_direct(x: np.ndarray, w: np.ndarray, b, pads, dilation, y: np.ndarray) -> None:
    """``y`` (N, O, OH, OW) = the stride-1 convolution of C-contiguous ``x`` (N, C, H, W)
    with ``w`` (O, C, KH, KW) plus ``b`` (O,) if given (C-contiguous); ``pads`` are the low
    paddings (the output size gives the high ones); ``y`` C-contiguous.

    >>> x, w = np.ones((1, 2, 3, 3)), np.ones((1, 2, 3, 3))
    >>> y = np.empty((1, 1, 1, 1))
    >>> conv2d_direct(x, w, None, (0, 0), (1, 1), y) if usable(np.float64) else y.fill(18)
    >>> float(y[0, 0, 0, 0])
    18.0
    """
    check_conv("conv2d_direct", x.shape, w.shape, y.shape, (1, 1), pads, dilation, (x, w, y),
               b)
    _forward(x, w, b, pads, dilation, y, 0)


def conv2d_input_grad_direct(g: np.ndarray, w: np.ndarray, pads, dilation,
                             dx: np.ndarray) -> None:
    """``dx`` (N, C, H, W) = the input gradient of a stride-1 convolution with C-contiguous
    filters ``w`` (O, C, KH, KW) and low paddings ``pads``, from C-contiguous ``g`` (N, O,
    OH, OW): scattered from ``g``'s flat layout when that is smaller than the padded one
    of the gathering form (the correlation of ``g`` with the turned, channel-swapped
    filters), i.e. when the padding is narrower than the filter.

    >>> g, w = np.ones((1, 1, 1, 1)), np.ones((1, 2, 3, 3))
    >>> dx = np.empty((1, 2, 3, 3))
    >>> conv2d_input_grad_direct(g, w, (0, 0), (1, 1), dx) if usable(np.float64) else dx.fill(1)
    >>> float(dx.sum())
    18.0
    """
    check_conv("conv2d_input_grad_direct", dx.shape, w.shape, g.shape, (1, 1), pads,
               dilation, (g, w, dx))
    kh, kw = w.shape[2:]
    if _scatters(g.shape[2:], dx.shape[2:], (kh, kw), dilation):
        _scatter(g, w, pads, dilation, dx)
        return
    reach = (dilation[0] * (kh - 1), dilation[1] * (kw - 1))
    _forward(g, w, None, (reach[0] - pads[0], reach[1] - pads[1]), dilation, dx, 1)


def _scatters(out_sp, in_sp, ksize, dilation) -> bool:
    """Whether the input gradient scatters: ``g``'s flat layout (outputs ``out_sp``) is
    under _SCATTER of the gathering form's padded one (inputs ``in_sp``)."""
    reach = dilation[1] * (ksize[1] - 1)
    return out_sp[0] * (out_sp[1] + reach) < _SCATTER * in_sp[0] * (in_sp[1] + reach)


# the share of the gathering form's flat size below which scattering beats it, though it
# adds its sums into the padded planes once per tap (bench demo: LeNet-5's 6 -> 16 layer)
_SCATTER = 0.65


def _scatter(g: np.ndarray, w: np.ndarray, pads, dilation, dx: np.ndarray) -> None:
    from tessera.kernels.conv import _threads, _workspace
    n, o = g.shape[:2]
    c = dx.shape[1]
    cb, nv = _fwd_tile(c)
    kk = w.shape[2] * w.shape[3]
    nb = -(-c // cb)
    d, _ = _geometry(dx, o, pads, g.shape[2], g.shape[3], w.shape[2:], dilation,
                     nv * _lanes(g.dtype), nb, c * kk, 0)
    qr, hp, wp, sl = (int(d[i]) for i in (11, 9, 10, 14))
    threads = min(_threads(n * o * c * kk * g.shape[2] * g.shape[3]), n)
    ws = nb * cb * hp * wp + sl + o * qr + nb * kk * o * cb
    work = _workspace(ws * threads, g.dtype, "direct")
    f = _kernel(f"igrad_{_SUFFIX[g.dtype]}_{cb}")
    dp = d.ctypes.data
    _run(f, (g.ctypes.data, w.ctypes.data, dx.ctypes.data, work.ctypes.data, ws,
             dp + 8 * (d.size - 1), dp), threads, d)


def _wgrad_name(o: int, ck: int, dtype) -> str:
    """The weight-gradient kernel for ``o`` output channels and ``ck`` taps: over output
    channels from _CHANNEL_TAPS taps on, else over the flat outputs."""
    lanes, s = _lanes(dtype), _SUFFIX[np.dtype(dtype)]
    if ck >= _CHANNEL_TAPS:
        ov, tb = _wgradc_tile(o, ck, lanes)
        return f"wgradc_{s}_{ov}_{tb}"
    return f"wgrad_{s}_{_wgrad_tile(o, ck)[0]}"


# weight-gradient chunks per thread: a thread late by a chunk's time costs 1 / _CHUNKS of
# the call's length, against a partial sum more to zero and add per chunk
_CHUNKS = 4
# taps (C * KH * KW) from which the weight gradient's vectors run over output channels:
# each image's gradient is transposed for it, which only pays over enough taps (bench demo:
# LeNet-5's 6 -> 16 layer, 150 taps, against its 1 -> 6, 25)
_CHANNEL_TAPS = 32


def conv2d_weight_grad_direct(x: np.ndarray, g: np.ndarray, wshape, pads,
                              dilation) -> np.ndarray:
    """The weight gradient (O, C, KH, KW) of a stride-1 convolution with low paddings
    ``pads`` from C-contiguous ``x`` (N, C, H, W) and ``g`` (N, O, OH, OW): with at least
    ``_CHANNEL_TAPS`` taps, vectors over output channels, else over the flat outputs.

    >>> x, g = np.ones((1, 2, 3, 3)), np.ones((1, 1, 1, 1))
    >>> dw = conv2d_weight_grad_direct(x, g, (1, 2, 3, 3), (0, 0), (1, 1)) \\
    ...     if usable(np.float64) else x[None, 0]
    >>> dw.shape, float(dw.sum())
    ((1, 2, 3, 3), 18.0)
    """
    from tessera.kernels.conv import _threads, _workspace
    check_conv("conv2d_weight_grad_direct", x.shape, tuple(wshape), g.shape, (1, 1), pads,
               dilation, (x, g))
    n, o, oh, ow = g.shape
    ck = x.shape[1] * wshape[2] * wshape[3]
    lanes = _lanes(x.dtype)
    by_channel = ck >= _CHANNEL_TAPS
    if by_channel:
        ov, tb = _wgradc_tile(o, ck, lanes)
        blocks, q = -(-o // (ov * lanes)), 1
    else:
        ob, tb = _wgrad_tile(o, ck)
        blocks, q = -(-o // ob), lanes
    taps = -(-ck // tb) * tb
    d, xs = _geometry(x, o, pads, oh, ow, wshape[2:], dilation, q, blocks, taps, 0)
    threads = min(_threads(n * o * ck * oh * ow), n)
    chunks = 1 if threads < 2 else min(n, _CHUNKS * threads)
    shape: tuple[int, ...]
    if by_channel:
        ws, shape = xs + oh * ow * blocks * ov * lanes, (taps, blocks * ov * lanes)
    else:
        ws, shape = xs + blocks * ob * int(d[11]), (blocks * ob, taps, lanes)
    work = _workspace(ws * threads, x.dtype, "direct")
    dw = np.empty((chunks,) + shape, x.dtype)
    dp = d.ctypes.data
    f = _kernel(_wgrad_name(o, ck, x.dtype))
    _run(f, (x.ctypes.data, g.ctypes.data, dw.ctypes.data, work.ctypes.data, ws, chunks,
             dp + 8 * (d.size - 1), dp), threads, d)
    if by_channel:
        return np.ascontiguousarray(dw.sum(0)[:ck, :o].T).reshape(tuple(wshape))
    return dw[:, :o, :ck].sum(axis=(0, 3)).reshape(tuple(wshape))
