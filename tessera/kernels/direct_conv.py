"""Direct 2-d convolution in C for small ungrouped stride-1 convolutions (LeNet-sized), with
its input and weight gradients, where im2col + GEMM leaves BLAS skinny products (6 x 25 x
784 for LeNet's first layer) running far below its peak.

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

# C without backslashes: _macro() continues every line (so comments are /* */ only)
_COMMON = r"""
/* image x (C, H, W) -> xp (C, HP, WP), xp[c, r, j] = x[c, r - PH, j - PW] (zero outside
   x; negative paddings crop), then SL zeros (read by the last tiles, multiplied by zero
   gradients in the weight gradient: they must not be NaN) */
static void pad_##S(const T* x, T* xp, const int64_t* d) {
    DGEOMETRY;
    int64_t ja = PW > 0 ? PW : 0, jb = PW + W < WP ? PW + W : WP;
    for (int64_t c = 0; c < C; c++)
        for (int64_t r = 0; r < HP; r++) {
            T* dst = xp + (c * HP + r) * WP;
            int64_t ih = r - PH;
            if (ih < 0 || ih >= H || ja >= jb) { memset(dst, 0, WP * sizeof(T)); continue; }
            memset(dst, 0, ja * sizeof(T));
            memcpy(dst + ja, x + (c * H + ih) * W + ja - PW, (jb - ja) * sizeof(T));
            memset(dst + jb, 0, (WP - jb) * sizeof(T));
        }
    memset(xp + C * HP * WP, 0, SL * sizeof(T));
}

/* one image's output gradient g (O, OH, OW) -> gp (rows, QR) in the flat layout (row
   pitch WP): zero in the dropped columns, past OH * WP and in rows from O on */
static void flat_##S(const T* g, T* gp, int64_t rows, const int64_t* d) {
    DGEOMETRY;
    for (int64_t o = 0; o < rows; o++) {
        T* row = gp + o * QR;
        if (o >= O) { memset(row, 0, QR * sizeof(T)); continue; }
        for (int64_t oh = 0; oh < OH; oh++) {
            memcpy(row + oh * WP, g + (o * OH + oh) * OW, OW * sizeof(T));
            memset(row + oh * WP + OW, 0, (WP - OW) * sizeof(T));
        }
        memset(row + OH * WP, 0, (QR - OH * WP) * sizeof(T));
    }
}
"""

_FWD = r"""
/* yf (OB, QR) at q0 = sum over taps k of wb (CK, OB) [k] times the scratch at q0 + off[k];
   the loops over OB and NV unrolled, so that the tile stays in registers */
static inline void fwd_tile_##S##_##OB(const T* xs, const T* wb, const int64_t* off,
                                       int64_t CK, T* yf, int64_t QR) {
    V acc[OB][NV];
    UNROLL for (int o = 0; o < OB; o++)
        UNROLL for (int v = 0; v < NV; v++) acc[o][v] = (V){0};
    for (int64_t k = 0; k < CK; k++) {
        const T* p = xs + off[k];
        V xv[NV];
        UNROLL for (int v = 0; v < NV; v++) xv[v] = *(const U*)(p + v * L);
        UNROLL for (int o = 0; o < OB; o++) {
            T wv = wb[k * OB + o];
            UNROLL for (int v = 0; v < NV; v++) acc[o][v] += xv[v] * wv;
        }
    }
    UNROLL for (int o = 0; o < OB; o++)
        UNROLL for (int v = 0; v < NV; v++) *(U*)(yf + o * QR + v * L) = acc[o][v];
}

/* y (N, O, OH, OW) = x (*) w + b, w (O, C, KH, KW); with FLIP, w (C, O, KH, KW) turned
   (the input gradient). One image an item, from the shared counter; thread t's scratch
   is work + t * ws: the padded image, the flat outputs yf and the filters packed
   (NB, CK, OB), zero past O */
void tsr_dconv_fwd_##S##_##OB(const T* x, const T* w, const T* b, T* y, T* work,
                              int64_t ws, int64_t* next, const int64_t* d, int64_t t) {
    DGEOMETRY;
    T* xp = work + t * ws;
    T* yf = xp + C * HP * WP + SL;
    T* wp = yf + NB * OB * QR;
    int64_t* off = offsets(d);
    if (!off) return;
    for (int64_t o = 0; o < NB * OB; o++)
        for (int64_t k = 0; k < CK; k++) {
            int64_t c = k / (KH * KW), r = k - c * KH * KW;
            T v = o >= O ? (T)0 : FLIP ? w[(c * O + o) * KH * KW + KH * KW - 1 - r]
                                       : w[o * CK + k];
            wp[(o / OB * CK + k) * OB + o - o / OB * OB] = v;
        }
    for (;;) {
        int64_t n = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
        if (n >= N) break;
        pad_##S(x + n * C * H * W, xp, d);
        for (int64_t q = 0; q < QR; q += NV * L)
            for (int64_t ob = 0; ob < NB; ob++)
                fwd_tile_##S##_##OB(xp + q, wp + ob * CK * OB, off, CK, yf + ob * OB * QR + q,
                                    QR);
        for (int64_t o = 0; o < O; o++) {
            T bo = b ? b[o] : (T)0;
            for (int64_t oh = 0; oh < OH; oh++) {
                T* dst = y + ((n * O + o) * OH + oh) * OW;
                const T* src = yf + o * QR + oh * WP;
                _Pragma("omp simd")
                for (int64_t ow = 0; ow < OW; ow++) dst[ow] = src[ow] + bo;
            }
        }
    }
    free(off);
}
"""

_WGRAD = r"""
/* acc (OB, TB taps, L lanes; rows NK * L apart) += the lane-wise dot products of gradient
   rows gp (OB, QR) with the scratch at off[j] */
static inline void wgrad_tile_##S##_##OB(const T* gp, const T* xp, const int64_t* off,
                                         int64_t QR, T* acc, int64_t NK) {
    V s[OB][TB];
    const T* xj[TB];
    UNROLL for (int j = 0; j < TB; j++) xj[j] = xp + off[j];
    UNROLL for (int o = 0; o < OB; o++)
        UNROLL for (int j = 0; j < TB; j++) s[o][j] = (V){0};
    for (int64_t q = 0; q < QR; q += L) {
        V gv[OB];
        UNROLL for (int o = 0; o < OB; o++) gv[o] = *(const U*)(gp + o * QR + q);
        UNROLL for (int j = 0; j < TB; j++) {
            V xv = *(const U*)(xj[j] + q);
            UNROLL for (int o = 0; o < OB; o++) s[o][j] += gv[o] * xv;
        }
    }
    UNROLL for (int o = 0; o < OB; o++)
        UNROLL for (int j = 0; j < TB; j++) *(U*)(acc + (o * NK + j) * L) += s[o][j];
}

/* dw[j] (NB * OB, NK, L): the lane sums of the weight gradient over chunk j of the
   images (of NJ chunks), each image's sums added to its chunk's: chunks, not threads, own
   the sums, so their order does not depend on thread timing, and a late thread only
   takes fewer chunks from the shared counter. Thread t's scratch: the padded image, then
   the output gradient in the flat layout gp (NB * OB, QR) */
void tsr_dconv_wgrad_##S##_##OB(const T* x, const T* gy, T* dw, T* work, int64_t ws,
                                int64_t NJ, int64_t* next, const int64_t* d, int64_t t) {
    DGEOMETRY;
    T* xp = work + t * ws;
    T* gp = xp + C * HP * WP + SL;
    int64_t* off = offsets(d);
    if (!off) return;
    for (;;) {
        int64_t j = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
        if (j >= NJ) break;
        T* acc = dw + j * NB * OB * NK * L;
        memset(acc, 0, NB * OB * NK * L * sizeof(T));
        for (int64_t n = N * j / NJ; n < N * (j + 1) / NJ; n++) {
            pad_##S(x + n * C * H * W, xp, d);
            flat_##S(gy + n * O * OH * OW, gp, NB * OB, d);
            for (int64_t ob = 0; ob < NB; ob++)
                for (int64_t k = 0; k < NK; k += TB)
                    wgrad_tile_##S##_##OB(gp + ob * OB * QR, xp, off + k, QR,
                                          acc + (ob * OB * NK + k) * L, NK);
        }
    }
    free(off);
}
"""

_WGRADC = r"""
/* acc (TB taps, rows OS apart; OV vectors of output channels) += the sums over one image's
   outputs q = (oh, ow) of the transposed gradient gt (OH * OW, OS) times the scratch at
   oh * WP + ow + off[j] */
static inline void wgradc_tile_##S##_##OV##_##TB(const T* gt, const T* xp, const int64_t* off,
                                          const int64_t* d, int64_t OS, T* acc) {
    DGEOMETRY;
    V s[OV][TB];
    const T* xj[TB];
    UNROLL for (int j = 0; j < TB; j++) xj[j] = xp + off[j];
    UNROLL for (int i = 0; i < OV; i++)
        UNROLL for (int j = 0; j < TB; j++) s[i][j] = (V){0};
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
            const T* gq = gt + (oh * OW + ow) * OS;
            int64_t p = oh * WP + ow;
            V gv[OV];
            UNROLL for (int i = 0; i < OV; i++) gv[i] = *(const U*)(gq + i * L);
            UNROLL for (int j = 0; j < TB; j++) {
                T xs = xj[j][p];
                UNROLL for (int i = 0; i < OV; i++) s[i][j] += gv[i] * xs;
            }
        }
    UNROLL for (int i = 0; i < OV; i++)
        UNROLL for (int j = 0; j < TB; j++) *(U*)(acc + j * OS + i * L) += s[i][j];
}

/* dw[j] (NK, OS): as tsr_dconv_wgrad, vectors over output channels instead of outputs:
   each image's gradient transposed into gt (OH * OW, OS), OS its channels rounded up to
   blocks of OV vectors (zero past O); no dropped columns, no split loads, and a tile's
   loop runs over all the image's outputs */
void tsr_dconv_wgradc_##S##_##OV##_##TB(const T* x, const T* gy, T* dw, T* work,
                                        int64_t ws, int64_t NJ, int64_t* next,
                                        const int64_t* d, int64_t t) {
    DGEOMETRY;
    int64_t OS = NB * OV * L;
    T* xp = work + t * ws;
    T* gt = xp + C * HP * WP + SL;
    int64_t* off = offsets(d);
    if (!off) return;
    for (;;) {
        int64_t j = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
        if (j >= NJ) break;
        T* acc = dw + j * NK * OS;
        memset(acc, 0, NK * OS * sizeof(T));
        for (int64_t n = N * j / NJ; n < N * (j + 1) / NJ; n++) {
            pad_##S(x + n * C * H * W, xp, d);
            const T* g = gy + n * O * OH * OW;
            for (int64_t q = 0; q < OH * OW; q++)
                for (int64_t o = 0; o < OS; o++) gt[q * OS + o] = o < O ? g[o * OH * OW + q] : 0;
            for (int64_t ob = 0; ob < NB; ob++)
                for (int64_t k = 0; k < NK; k += TB)
                    wgradc_tile_##S##_##OV##_##TB(gt + ob * OV * L, xp, off + k, d, OS,
                                           acc + k * OS + ob * OV * L);
        }
    }
    free(off);
}
"""

_IGRAD = r"""
/* the CB padded input-gradient planes at dst (PS apart), from q0 on, += the sum over
   output channels o of wb (O, CB) [o] times the flat output gradient gp (O, QR) at q0 */
static inline void igrad_tile_##S##_##CB(const T* gp, const T* wb, int64_t O, int64_t QR,
                                         T* dst, int64_t PS) {
    V acc[CB][NV];
    UNROLL for (int c = 0; c < CB; c++)
        UNROLL for (int v = 0; v < NV; v++) acc[c][v] = (V){0};
    for (int64_t o = 0; o < O; o++) {
        V gv[NV];
        UNROLL for (int v = 0; v < NV; v++) gv[v] = *(const U*)(gp + o * QR + v * L);
        UNROLL for (int c = 0; c < CB; c++) {
            T wv = wb[o * CB + c];
            UNROLL for (int v = 0; v < NV; v++) acc[c][v] += gv[v] * wv;
        }
    }
    UNROLL for (int c = 0; c < CB; c++)
        UNROLL for (int v = 0; v < NV; v++) *(U*)(dst + c * PS + v * L) += acc[c][v];
}

/* dx (N, C, H, W) = the input gradient of gy (N, O, OH, OW) for filters w (O, C, KH, KW),
   scattered: each tap adds its products into the padded planes dxp (NB * CB, HP, WP) at
   its offset, then dx is cropped out of them. One image an item, from the shared counter;
   thread t's scratch: dxp and its slack, the flat gradient gp (O, QR) and the filters
   packed (NB, KH * KW, O, CB), zero past C */
void tsr_dconv_igrad_##S##_##CB(const T* gy, const T* w, T* dx, T* work, int64_t ws,
                                int64_t* next, const int64_t* d, int64_t t) {
    DGEOMETRY;
    int64_t DH = d[17], DW = d[18], KK = KH * KW, PS = HP * WP;
    T* dxp = work + t * ws;
    T* gp = dxp + NB * CB * PS + SL;
    T* wp = gp + O * QR;
    for (int64_t cb = 0; cb < NB * CB; cb++)
        for (int64_t k = 0; k < KK; k++)
            for (int64_t o = 0; o < O; o++)
                wp[((cb / CB * KK + k) * O + o) * CB + cb - cb / CB * CB] =
                    cb < C ? w[(o * C + cb) * KK + k] : (T)0;
    int64_t ja = PW < 0 ? -PW : 0, jb = WP - PW < W ? WP - PW : W;
    for (;;) {
        int64_t n = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
        if (n >= N) break;
        flat_##S(gy + n * O * OH * OW, gp, O, d);
        memset(dxp, 0, (NB * CB * PS + SL) * sizeof(T));
        for (int64_t q = 0; q < QR; q += NV * L)
            for (int64_t cb = 0; cb < NB; cb++)
                for (int64_t k = 0; k < KK; k++) {
                    int64_t kh = k / KW, kw = k - kh * KW;
                    igrad_tile_##S##_##CB(gp + q, wp + (cb * KK + k) * O * CB, O, QR,
                                          dxp + cb * CB * PS + q + kh * DH * WP + kw * DW,
                                          PS);
                }
        for (int64_t c = 0; c < C; c++)
            for (int64_t ih = 0; ih < H; ih++) {
                T* dst = dx + ((n * C + c) * H + ih) * W;
                int64_t r = ih + PH;
                if (r < 0 || r >= HP || ja >= jb) { memset(dst, 0, W * sizeof(T)); continue; }
                memset(dst, 0, ja * sizeof(T));
                memcpy(dst + ja, dxp + (c * HP + r) * WP + ja + PW, (jb - ja) * sizeof(T));
                memset(dst + jb, 0, (W - jb) * sizeof(T));
            }
    }
}
"""

_HEAD = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* the geometry d[]: C H W O PH PW OH OW N HP WP QR NB CK SL KH KW DH DW FLIP NK, then
   the work counter. The scratch is (C, HP, WP) plus SL zeros; QR the flat outputs
   rounded up to a tile; NB blocks of output channels; CK = C KH KW taps, NK rounded up
   to a weight-gradient tile */
#define DGEOMETRY                                                                         \
    int64_t C = d[0], H = d[1], W = d[2], O = d[3], PH = d[4], PW = d[5], OH = d[6],      \
            OW = d[7], N = d[8], HP = d[9], WP = d[10], QR = d[11], NB = d[12],           \
            CK = d[13], SL = d[14], KH = d[15], KW = d[16], FLIP = d[19], NK = d[20];     \
    (void)O; (void)OH; (void)OW; (void)N; (void)QR; (void)NB; (void)CK; (void)KH;         \
    (void)KW; (void)FLIP; (void)NK

#define UNROLL _Pragma("GCC unroll 16")

/* each tap's (c, kh, kw) offset into the flat scratch, zeros up to NK (NULL: no memory) */
static int64_t* offsets(const int64_t* d) {
    DGEOMETRY;
    int64_t DH = d[17], DW = d[18];
    int64_t* off = malloc(NK * sizeof(int64_t));
    if (!off) return off;
    for (int64_t k = 0; k < NK; k++) {
        int64_t c = k / (KH * KW), r = k - c * KH * KW, kh = r / KW, kw = r - kh * KW;
        off[k] = k < CK ? (c * HP + kh * DH) * WP + kw * DW : 0;
    }
    return off;
}
"""


def _macro(head: str, body: str) -> str:
    return f"#define {head} \\\n" + " \\\n".join(body.strip("\n").splitlines()) + "\n"


def _header(s: str) -> str:
    """The macros and types every kernel of dtype ``s`` (f32 or f64) is built from."""
    t = {"f32": "float", "f64": "double"}[s]
    return "\n".join([
        _HEAD, _macro("COMMON(T, S)", _COMMON), _macro("FWD(T, S, V, U, L, OB, NV)", _FWD),
        _macro("WGRAD(T, S, V, U, L, OB, TB)", _WGRAD),
        _macro("IGRAD(T, S, V, U, L, CB, NV)", _IGRAD),
        _macro("WGRADC(T, S, V, U, L, OV, TB)", _WGRADC),
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
    its layers take: the benchmark CNN 2 of a dtype's 16 (all 16 would be most of its cold
    compile: bench compile: cnn train)."""
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
    "weight_grad") directly rather than as im2col + GEMM, the rule measured per kernel
    (bench demo; bench training: cnn):

    * filters of more than one tap and c * kh * kw * o <= 8192, where the GEMMs are
      skinny (1x1 filters have no im2col to save);
    * the input gradient also needs o <= 8 c: it runs as a convolution with c outputs, and
      few of them use the load-bound tiles;
    * the weight gradient also needs c * kh * kw >= 32 (its channel-vector kernel) or, for
      the flat kernel, oh * ow >= 196: its dot products run over one image's outputs, and
      short ones lose.

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
    d, xs = _geometry(x, o, pads, *y.shape[2:], ksize, dilation, nv * _lanes(x.dtype),
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
# adds its sums into the padded planes once per tap (bench demo: LeNet-5's 6 -> 16 5x5)
_SCATTER = 0.65


def _scatter(g: np.ndarray, w: np.ndarray, pads, dilation, dx: np.ndarray) -> None:
    from tessera.kernels.conv import _threads, _workspace
    n, o = g.shape[:2]
    c = dx.shape[1]
    cb, nv = _fwd_tile(c)
    kk = w.shape[2] * w.shape[3]
    nb = -(-c // cb)
    d, _ = _geometry(dx, o, pads, *g.shape[2:], w.shape[2:], dilation,
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
# LeNet-5's 6 -> 16 5x5)
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
