"""Hand-written C kernels for ops that are not elementwise regions: 2-d im2col/col2im for
convolution and 2-d max pooling with its backward. Compiled once (through the same disk
cache as generated code) and called on NumPy arrays; sizes are run-time arguments, so one
library serves every shape. ``available()`` is False when code generation is off or there
is no compiler, and the ops then use their NumPy kernels.

Why C here: im2col is a strided gather that NumPy does as a multi-dimensional copy with a
poor access order, and col2im a loop of strided adds; in C each is one sequential pass.
Max pooling's window loop with PyTorch's tie/NaN rule is a few selects per element, and
its backward a scatter-add NumPy can only do through ``bincount``.

>>> import numpy as np
>>> if available():
...     x = np.arange(16, dtype=np.float32).reshape(1, 4, 4)
...     cols = np.empty((4, 9), np.float32)
...     im2col(x, cols, (2, 2), (1, 1), (0, 0), (1, 1), (3, 3))
...     print(cols[0])
... else:
...     print([0., 1., 2., 4., 5., 6., 8., 9., 10.])
[ 0.  1.  2.  4.  5.  6.  8.  9. 10.]
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

__all__ = ["available", "im2col", "col2im", "depthwise_conv2d", "max_pool2d",
           "max_pool2d_values", "max_pool2d_backward"]

# the window bounds, im2col and col2im, also compiled into the convolution drivers
# (``tessera.kernels.conv``)
WINDOW_C = r"""
/* the output columns ow whose input column ow*SW + off lies inside [0, W): [*a, *b) */
static inline void inside(int64_t off, int64_t SW, int64_t W, int64_t OW, int64_t* a,
                          int64_t* b) {
    int64_t lo = off < 0 ? (-off + SW - 1) / SW : 0;
    int64_t hi = W - 1 - off < 0 ? 0 : (W - 1 - off) / SW + 1;
    if (hi > OW) hi = OW;
    if (lo > hi) lo = hi;
    *a = lo; *b = hi;
}

/* one image x (C, H, W): window rows [lo, hi) of cols (C*KH*KW, ...) for output rows
   [oh0, oh1), each cols row LD apart and starting at output row oh0; zero where the window
   is padding. Row r is (c, kh, kw): c = r / (KH*KW), kh and kw its remainder's row and
   column (no modulo sign: conv_kernels formats this source with Python). */
#define IM2COL_BLOCK(T, NAME)                                                             \
static void NAME(const T* x, T* cols, int64_t H, int64_t W, int64_t KH, int64_t KW,       \
                 int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW,  \
                 int64_t OW, int64_t LD, int64_t lo, int64_t hi, int64_t oh0,             \
                 int64_t oh1) {                                                           \
    for (int64_t r = lo; r < hi; r++) {                                                   \
        int64_t c = r / (KH * KW), k = r - c * KH * KW, kh = k / KW, kw = k - kh * KW;    \
        T* row = cols + r * LD - oh0 * OW;                                                \
        int64_t off = kw * DW - PW, a, b;                                                 \
        inside(off, SW, W, OW, &a, &b);                                                   \
        for (int64_t oh = oh0; oh < oh1; oh++) {                                          \
            int64_t ih = oh * SH - PH + kh * DH;                                          \
            T* dst = row + oh * OW;                                                       \
            if (ih < 0 || ih >= H) { memset(dst, 0, OW * sizeof(T)); continue; }          \
            const T* src = x + (c * H + ih) * W + off;                                    \
            for (int64_t ow = 0; ow < a; ow++) dst[ow] = (T)0;                            \
            if (SW == 1) memcpy(dst + a, src + a, (b - a) * sizeof(T));                   \
            else for (int64_t ow = a; ow < b; ow++) dst[ow] = src[ow * SW];               \
            for (int64_t ow = b; ow < OW; ow++) dst[ow] = (T)0;                           \
        }                                                                                 \
    }                                                                                     \
}

/* one image, channels [lo, hi): dx (C, H, W) = sum of the window columns cols
   (C*KH*KW, OH*OW), rows LD apart */
#define COL2IM(T, NAME)                                                                   \
void NAME(const T* cols, T* dx, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,  \
          int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW,         \
          int64_t OH, int64_t OW, int64_t LD, int64_t lo, int64_t hi) {                   \
    (void)C;                                                                              \
    memset(dx + lo * H * W, 0, (hi - lo) * H * W * sizeof(T));                            \
    for (int64_t c = lo; c < hi; c++)                                                     \
    for (int64_t kh = 0; kh < KH; kh++)                                                   \
    for (int64_t kw = 0; kw < KW; kw++) {                                                 \
        const T* row = cols + ((c * KH + kh) * KW + kw) * LD;                             \
        int64_t off = kw * DW - PW, a, b;                                                 \
        inside(off, SW, W, OW, &a, &b);                                                   \
        for (int64_t oh = 0; oh < OH; oh++) {                                             \
            int64_t ih = oh * SH - PH + kh * DH;                                          \
            if (ih < 0 || ih >= H) continue;                                              \
            T* dst = dx + (c * H + ih) * W + off;                                         \
            const T* src = row + oh * OW;                                                 \
            if (SW == 1) {                                                                \
                _Pragma("omp simd")                                                       \
                for (int64_t ow = a; ow < b; ow++) dst[ow] += src[ow];                    \
            } else {                                                                      \
                for (int64_t ow = a; ow < b; ow++) dst[ow * SW] += src[ow];               \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}

"""

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

""" + WINDOW_C + r"""
/* one image: x (C, H, W) -> rows [lo, hi) of cols (C*KH*KW, OH*OW), rows LD apart (OH*OW,
   or N*OH*OW when the images' columns sit side by side) */
#define IM2COL(T, NAME, BLOCK)                                                            \
void NAME(const T* x, T* cols, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,   \
          int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW,         \
          int64_t OH, int64_t OW, int64_t LD, int64_t lo, int64_t hi) {                   \
    (void)C;                                                                              \
    BLOCK(x, cols, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OW, LD, lo, hi, 0, OH);          \
}

/* planes [lo, hi) of x (P, H, W): PyTorch's rule, the first maximum and the last NaN */
/* planes [lo, hi): dx = 0, then scatter-add g at idx; returns an invalid index + 1 or 0 */
#define MAXPOOL_BWD(T, NAME)                                                              \
int64_t NAME(const T* g, const int64_t* idx, T* dx, int64_t in_plane, int64_t out_plane,  \
             int64_t lo, int64_t hi) {                                                    \
    int64_t bad = 0;                                                                      \
    for (int64_t p = lo; p < hi; p++) {                                                   \
        T* d = dx + p * in_plane;                                                         \
        memset(d, 0, in_plane * sizeof(T));                                               \
        for (int64_t o = p * out_plane; o < (p + 1) * out_plane; o++) {                   \
            int64_t i = idx[o];                                                           \
            if (i < 0 || i >= in_plane) { bad = i < 0 ? i - 1 : i + 1; continue; }        \
            d[i] += g[o];                                                                 \
        }                                                                                 \
    }                                                                                     \
    return bad;                                                                           \
}

IM2COL_BLOCK(float, im2col_block_f32)
IM2COL_BLOCK(double, im2col_block_f64)
IM2COL(float, tsr_im2col_f32, im2col_block_f32)
IM2COL(double, tsr_im2col_f64, im2col_block_f64)
COL2IM(float, tsr_col2im_f32)
COL2IM(double, tsr_col2im_f64)
MAXPOOL_BWD(float, tsr_maxpool2d_bwd_f32)
MAXPOOL_BWD(double, tsr_maxpool2d_bwd_f64)
"""

# Max pooling is compiled per window geometry (kernel, stride, padding, dilation as
# constants): the window loops then unroll into straight-line selects, 3x faster than
# loops over run-time sizes. Each geometry compiles once per machine (the disk cache).
_MAXPOOL = r"""
#include <math.h>
#include <stdint.h>
enum { KH = %(kh)d, KW = %(kw)d, SH = %(sh)d, SW = %(sw)d, PH = %(ph)d, PW = %(pw)d,
       DH = %(dh)d, DW = %(dw)d };
#define WITH_INDEX %(index)d  /* 0: values only (idx is not touched) */
typedef %(T)s T;

/* one output: the window scanned in (kh, kw) order with bounds checks */
static inline void edge(const T* xp, T* y, int64_t* idx, int64_t o, int64_t h0, int64_t w0,
                        int64_t H, int64_t W) {
    int64_t hs = h0, ws = w0;
    while (hs < 0) hs += DH;
    while (ws < 0) ws += DW;
    T best = -INFINITY;
    int64_t arg = hs * W + ws;
    for (int kh = 0; kh < KH; kh++) {
        int64_t ih = h0 + kh * DH;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < KW; kw++) {
            int64_t iw = w0 + kw * DW;
            if (iw < 0 || iw >= W) continue;
            T v = xp[ih * W + iw];
            int take = (v > best) | (v != v);
            best = take ? v : best;
            arg = take ? ih * W + iw : arg;
        }
    }
    y[o] = best;
#if WITH_INDEX
    idx[o] = arg;
#endif
}

/* planes [lo, hi) of x (P, H, W): PyTorch's rule, the first maximum and the last NaN.
   Windows wholly inside the image (most of them) take a branch-free loop over ow that
   the compiler unrolls over the window and vectorises; the border ones take edge(). */
void tsr_maxpool(const T* x, T* y, int64_t* idx, int64_t H, int64_t W, int64_t OH,
                 int64_t OW, int64_t lo, int64_t hi) {
    /* interior columns: PW <= ow*SW and ow*SW - PW + (KW-1)*DW < W */
    int64_t a = (PW + SW - 1) / SW;
    int64_t b = W - (KW - 1) * DW + PW > 0 ? (W - (KW - 1) * DW + PW - 1) / SW + 1 : 0;
    if (b > OW) b = OW;
    if (a > b) a = b;
    for (int64_t p = lo; p < hi; p++) {
        const T* xp = x + p * H * W;
        T* yp = y + p * OH * OW;
        int64_t* ip = WITH_INDEX ? idx + p * OH * OW : 0;
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t h0 = oh * SH - PH;
            T* yr = yp + oh * OW;
            int64_t* ir = WITH_INDEX ? ip + oh * OW : 0;
            if (h0 < 0 || h0 + (KH - 1) * DH >= H) {
                for (int64_t ow = 0; ow < OW; ow++)
                    edge(xp, yp, ip, oh * OW + ow, h0, ow * SW - PW, H, W);
                continue;
            }
            for (int64_t ow = 0; ow < a; ow++)
                edge(xp, yp, ip, oh * OW + ow, h0, ow * SW - PW, H, W);
            #pragma omp simd
            for (int64_t ow = a; ow < b; ow++) {
                int64_t w0 = ow * SW - PW;
                T best = -INFINITY;
                int64_t arg = h0 * W + w0;
                for (int kh = 0; kh < KH; kh++)
                    for (int kw = 0; kw < KW; kw++) {
                        int64_t at = (h0 + kh * DH) * W + w0 + kw * DW;
                        T v = xp[at];
                        int take = (v > best) | (v != v);
                        best = take ? v : best;
                        arg = take ? at : arg;
                    }
                yr[ow] = best;
#if WITH_INDEX
                ir[ow] = arg;
#endif
            }
            for (int64_t ow = b; ow < OW; ow++)
                edge(xp, yp, ip, oh * OW + ow, h0, ow * SW - PW, H, W);
        }
    }
}
"""


# Depthwise convolution (groups == in channels == out channels), direct: each output plane
# is a KHxKW stencil over its input plane. Compiled per geometry like max pooling; interior
# output columns run without bounds checks (a stride-1 row is a vectorised sum of shifted
# rows). Planes split across the kernel threads.
_DEPTHWISE = r"""
#include <stdint.h>
enum { KH = %(kh)d, KW = %(kw)d, SH = %(sh)d, SW = %(sw)d, PH = %(ph)d, PW = %(pw)d,
       DH = %(dh)d, DW = %(dw)d };
typedef %(T)s T;

/* one output with bounds checks (border windows) */
static inline T edge(const T* xp, const T* wc, T bias, int64_t h0, int64_t w0, int64_t H,
                     int64_t W) {
    T acc = bias;
    for (int kh = 0; kh < KH; kh++) {
        int64_t ih = h0 + kh * DH;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < KW; kw++) {
            int64_t iw = w0 + kw * DW;
            if (iw >= 0 && iw < W) acc += wc[kh * KW + kw] * xp[ih * W + iw];
        }
    }
    return acc;
}

/* planes [lo, hi) of the (N*C) planes: y = x (*) w[c] + b[c] (b may be NULL); windows
   wholly inside the plane accumulate in registers over an unrolled window, vectorised
   across the output row */
void tsr_depthwise(const T* x, const T* w, const T* b, T* y, int64_t C, int64_t H,
                   int64_t W, int64_t OH, int64_t OW, int64_t lo, int64_t hi) {
    int64_t a = (PW + SW - 1) / SW;   /* interior columns: every tap inside [0, W) */
    int64_t e = W - (KW - 1) * DW + PW > 0 ? (W - (KW - 1) * DW + PW - 1) / SW + 1 : 0;
    if (e > OW) e = OW;
    if (a > e) a = e;
    for (int64_t p = lo; p < hi; p++) {
        int64_t c = p %% C;
        const T* xp = x + p * H * W;
        T wc[KH * KW];
        for (int k = 0; k < KH * KW; k++) wc[k] = w[c * KH * KW + k];
        T* yp = y + p * OH * OW;
        T bias = b ? b[c] : (T)0;
        for (int64_t oh = 0; oh < OH; oh++) {
            T* yr = yp + oh * OW;
            int64_t h0 = oh * SH - PH;
            if (h0 < 0 || h0 + (KH - 1) * DH >= H) {
                for (int64_t ow = 0; ow < OW; ow++)
                    yr[ow] = edge(xp, wc, bias, h0, ow * SW - PW, H, W);
                continue;
            }
            for (int64_t ow = 0; ow < a; ow++)
                yr[ow] = edge(xp, wc, bias, h0, ow * SW - PW, H, W);
            const T* x0 = xp + h0 * W - PW;
            #pragma omp simd
            for (int64_t ow = a; ow < e; ow++) {
                T acc = bias;
                for (int kh = 0; kh < KH; kh++)
                    for (int kw = 0; kw < KW; kw++)
                        acc += wc[kh * KW + kw] * x0[kh * DH * W + ow * SW + kw * DW];
                yr[ow] = acc;
            }
            for (int64_t ow = e; ow < OW; ow++)
                yr[ow] = edge(xp, wc, bias, h0, ow * SW - PW, H, W);
        }
    }
}
"""


@functools.lru_cache(maxsize=64)
def _depthwise_fn(dtype: str, ksize, stride, pads, dilation):
    from tessera.kernels.cc import load
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = ksize, stride, pads, dilation
    lib = load(_DEPTHWISE % dict(T="float" if dtype == "f32" else "double", kh=kh, kw=kw,
                                 sh=sh, sw=sw, ph=ph, pw=pw, dh=dh, dw=dw))
    f = lib.tsr_depthwise
    f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 7
    f.restype = None
    return f


def depthwise_conv2d(x: np.ndarray, w: np.ndarray, b, stride, pads, dilation, out_sp,
                     out: np.ndarray | None = None) -> np.ndarray:
    """Depthwise 2-d convolution of C-contiguous ``x`` (N, C, H, W) with ``w`` (C, 1, KH,
    KW) and optional bias ``b`` (C,), into ``out`` when given; ``pads`` are the low
    paddings."""
    from tessera.kernels.threadpool import split_call
    n, c, h, wd = x.shape
    y = np.empty((n, c) + tuple(out_sp), x.dtype) if out is None else out
    w = np.ascontiguousarray(w, x.dtype)
    b = None if b is None else np.ascontiguousarray(b, x.dtype)
    f = _depthwise_fn(_SUFFIX[x.dtype], *(tuple(map(int, a)) for a in
                                           (w.shape[2:], stride, pads, dilation)))
    split_call(f, (x.ctypes.data, w.ctypes.data, None if b is None else b.ctypes.data,
                   y.ctypes.data, c, h, wd, *out_sp), n * c, y.size * w.shape[2] * w.shape[3])
    return y


@functools.lru_cache(maxsize=64)
def _maxpool_fn(dtype: str, ksize, stride, pads, dilation, index: bool = True):
    from tessera.kernels.cc import load
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = ksize, stride, pads, dilation
    lib = load(_MAXPOOL % dict(T="float" if dtype == "f32" else "double", kh=kh, kw=kw,
                               sh=sh, sw=sw, ph=ph, pw=pw, dh=dh, dw=dw, index=int(index)))
    f = lib.tsr_maxpool
    f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 6
    f.restype = None
    return f


_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


@functools.lru_cache(maxsize=1)
def _lib():
    from tessera.kernels.cc import load
    lib = load(_SOURCE)
    P, I = ctypes.c_void_p, ctypes.c_int64
    for s in ("f32", "f64"):
        f = getattr(lib, f"tsr_im2col_{s}")
        f.argtypes, f.restype = [P, P] + [I] * 16, None
        f = getattr(lib, f"tsr_col2im_{s}")
        f.argtypes, f.restype = [P, P] + [I] * 16, None
        f = getattr(lib, f"tsr_maxpool2d_bwd_{s}")
        f.argtypes, f.restype = [P, P, P] + [I] * 4, ctypes.c_int64
    return lib


def available(dtype=np.float32) -> bool:
    """Whether the C kernels can run for ``dtype`` (code generation on, a compiler found)."""
    if np.dtype(dtype) not in _SUFFIX:
        return False
    from tessera import kernels
    if not kernels.enabled():
        return False
    try:
        _lib()
    except Exception:  # a broken toolchain: the NumPy kernels still work
        return False
    return True


def _geometry(ksize, stride, pads, dilation, out_sp) -> list[int]:
    return [*ksize, *stride, *pads, *dilation, *out_sp]


def im2col(x: np.ndarray, cols: np.ndarray, ksize, stride, pads, dilation, out_sp) -> None:
    """One image ``x`` (C, H, W), C-contiguous -> ``cols`` (C*KH*KW, OH*OW), a C-contiguous
    array or a column block of a wider one (rows keep its stride); ``pads`` are the low
    paddings (the high side follows from ``out_sp``). Rows split across the kernel
    threads when the buffer is large."""
    from tessera.kernels.threadpool import split_call
    f = getattr(_lib(), f"tsr_im2col_{_SUFFIX[x.dtype]}")
    rows = cols.shape[0]
    split_call(f, (x.ctypes.data, cols.ctypes.data, *x.shape,
                   *_geometry(ksize, stride, pads, dilation, out_sp),
                   cols.strides[0] // cols.itemsize), rows, rows * cols.shape[1])


def col2im(cols: np.ndarray, dx: np.ndarray, ksize, stride, pads, dilation, out_sp) -> None:
    """The adjoint of ``im2col``: ``dx`` (C, H, W) = the sum of each input element's window
    entries in ``cols``. Channels split across the kernel threads when large."""
    from tessera.kernels.threadpool import split_call
    f = getattr(_lib(), f"tsr_col2im_{_SUFFIX[cols.dtype]}")
    split_call(f, (cols.ctypes.data, dx.ctypes.data, *dx.shape,
                   *_geometry(ksize, stride, pads, dilation, out_sp),
                   cols.strides[0] // cols.itemsize), dx.shape[0], cols.size)


def max_pool2d(x: np.ndarray, ksize, stride, pads, dilation, out_sp):
    """(values, flat per-plane indices) of 2-d max pooling of C-contiguous ``x`` (N, C, H,
    W), planes split across the kernel threads."""
    from tessera.kernels.threadpool import split_call
    n, c, h, w = x.shape
    y = np.empty((n, c) + tuple(out_sp), x.dtype)
    idx = np.empty((n, c) + tuple(out_sp), np.int64)
    f = _maxpool_fn(_SUFFIX[x.dtype], *(tuple(map(int, a)) for a in
                                         (ksize, stride, pads, dilation)))
    args = (x.ctypes.data, y.ctypes.data, idx.ctypes.data, h, w, *out_sp)
    split_call(f, args, n * c, y.size)
    return y, idx


def max_pool2d_values(x: np.ndarray, ksize, stride, pads, dilation, out_sp) -> np.ndarray:
    """The values of 2-d max pooling of C-contiguous ``x`` (N, C, H, W), without indices;
    planes split across the kernel threads."""
    from tessera.kernels.threadpool import split_call
    n, c, h, w = x.shape
    y = np.empty((n, c) + tuple(out_sp), x.dtype)
    f = _maxpool_fn(_SUFFIX[x.dtype], *(tuple(map(int, a)) for a in
                                         (ksize, stride, pads, dilation)), index=False)
    split_call(f, (x.ctypes.data, y.ctypes.data, None, h, w, *out_sp), n * c, y.size)
    return y


def max_pool2d_backward(g: np.ndarray, idx: np.ndarray, input_shape) -> np.ndarray:
    """Scatter-add of ``g`` at ``idx`` into zeros of ``input_shape``; a ValueError names an
    index outside its plane."""
    from tessera.kernels.threadpool import split_call
    n, c = input_shape[:2]
    in_plane = int(np.prod(input_shape[2:]))
    out_plane = int(np.prod(g.shape[2:]))
    dx = np.empty(tuple(input_shape), g.dtype)
    f = getattr(_lib(), f"tsr_maxpool2d_bwd_{_SUFFIX[g.dtype]}")
    bad = split_call(f, (g.ctypes.data, idx.ctypes.data, dx.ctypes.data, in_plane, out_plane),
                     n * c, g.size)
    if bad:
        raise ValueError(bad - 1 if bad > 0 else bad + 1)
    return dx
