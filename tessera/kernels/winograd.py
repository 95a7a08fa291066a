"""Winograd F(2x2, 3x3) convolution for 3x3, stride-1, dilation-1, ungrouped 2-d convolutions
(and their input gradients, which are such convolutions too), in C inside the threaded
convolution drivers of ``tessera.kernels.conv``.

Each 2x2 block of outputs (a tile) takes 16 multiplies per (input, output) channel pair
instead of 36: the filters become U = G g G^T (4x4 each, once per call), each 4x4 input
tile V = B^T d B, then for each of the 16 positions of a tile one GEMM
M[p] (O, tiles) = U[p] (O, C) @ V[p] (C, tiles), and each tile's outputs Y = A^T M A
(Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2015). A work item
is a block of tile rows of the whole batch (rows of several images when they are small,
so that its GEMMs are wide); each thread transforms its block's input, runs the 16 GEMMs
on BLAS single-threaded and writes the outputs with the bias, all in its own workspace,
as the im2col drivers do. With few tiles (batch 1), such items would make skinny GEMMs
that each read all of U, so there the whole batch is one block in three passes, the
threads sharing its V and M: the filter and input transforms (items: output channels'
filters, then input channels), the 16 GEMMs (items: positions), the output transform
(items: output channels). In items of tile rows the threads transform the filters first
(items: output channels). The passes of a call meet at counters in C (a thread yields
until the previous pass's items are all done), not at the kernel pool's barrier, because
waking a blocked thread on a busy host costs more than a pass (bench models: resnet18 infer
b1). One pass for the GEMMs and the output transform would pack all of V again per block of
output channels, which is slower. ``chosen`` is the rule, measured per layer shape, for
when this beats im2col + GEMM.

The input gradient of a 3x3 stride-1 convolution with low padding p is the correlation of
the output gradient with the filters turned 180 degrees and their channels swapped, with
low padding 2 - p; the filter transform does the turn and the swap (FLIP). The weight
gradient sums, per tile position, (A g A^T)[p] @ (B^T d B)[p]^T over the tiles, each
thread over a fixed run of them (a sum that does not depend on thread timing), then
takes G^T s G; ``chosen_weight_grad`` keeps it to the shapes where it measured faster.

Over enough tiles (``four``) the forward, input and weight gradients run as F(4x4, 3x3)
instead (``tessera.kernels.winograd4``: the same drivers with 6x6 tiles).

``TESSERA_WINOGRAD=0`` turns the path off (read once), so benchmarks can compare it with
im2col + GEMM; ``TESSERA_WINOGRAD4=0`` keeps it to F(2x2).

>>> import numpy as np
>>> x, w = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32)
>>> y = np.empty((1, 1, 4, 4), np.float32)
>>> conv2d_winograd(x, w, None, (1, 1), y) if usable(np.float32) else y.fill(9)
>>> float(y[0, 0, 1, 1])
9.0
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["enabled", "usable", "chosen", "chosen_weight_grad", "conv2d_winograd",
           "conv2d_input_grad_winograd", "conv2d_weight_grad_winograd", "WINOGRAD_C"]

# C without backslashes: _macro() continues every line (so comments are /* */ only)
_BODY = r"""
/* G k G^T of filter c of the gathered k (9, 64) -> d[p * US], p = 0..15 */
static inline __attribute__((always_inline)) void wino_gkg_##S(T k[9][64], int64_t c, T* d,
                                                              int64_t US) {
    const T h = (T)0.5;
    T a[4][3];
    for (int j = 0; j < 3; j++) {
        a[0][j] = k[j][c];
        a[1][j] = h * (k[j][c] + k[3 + j][c] + k[6 + j][c]);
        a[2][j] = h * (k[j][c] - k[3 + j][c] + k[6 + j][c]);
        a[3][j] = k[6 + j][c];
    }
    for (int i = 0; i < 4; i++) {
        d[(4 * i + 0) * US] = a[i][0];
        d[(4 * i + 1) * US] = h * (a[i][0] + a[i][1] + a[i][2]);
        d[(4 * i + 2) * US] = h * (a[i][0] - a[i][1] + a[i][2]);
        d[(4 * i + 3) * US] = a[i][2];
    }
}

WINO_WEIGHT(T, S, wino, WGEOMETRY)

/* the tile rows [r0, r1) of the batch (row r: image r / TH, tile row r % TH) -> v (16, C,
   NC): B^T d B of each 4x4 input tile d, tile tw of the block's row i at column
   i * (TW + 1) + tw (the column after each row's last tile is a spare, computed and not
   used: so that each pass below is one long unit-stride loop over a channel's rows).
   Per (image, channel): the input rows copied into zero-padded planes pe (even rows) and
   po (odd rows), L = 2 (TW + 1) columns each; the column transform d -> B^T d split into
   its even and odd columns e and q (4 each); then the row transform, tile f reading
   columns f and f + 1 of e and q. Channels [c0, c1) only. */
static void wino_in_##S(const T* x, T* v, T* pe, const int64_t* wg, int64_t r0,
                        int64_t r1, int64_t c0, int64_t c1) {
    WGEOMETRY;
    T* po = pe + (RB + 2) * L;
    T* e = po + (RB + 2) * L;
    T* q = e + 4 * EQ;
    int64_t ja = PW < L ? PW : L, jb = PW + W < L ? PW + W : L;
    for (int64_t r = r0; r < r1;) {
        int64_t n = r / TH, th0 = r - n * TH;
        int64_t R = th0 + (r1 - r) < TH ? r1 - r : TH - th0, F = R * (TW + 1);
        for (int64_t c = c0; c < c1; c++) {
            for (int64_t k = 0; k < 2 * R + 2 && ja < jb; k++) {
                int64_t ih = 2 * th0 - PH + k;
                T* dst = (k & 1 ? po : pe) + (k >> 1) * L + ja;
                if (ih >= 0 && ih < H)
                    memcpy(dst, x + ((n * C + c) * H + ih) * W + ja - PW,
                           (jb - ja) * sizeof(T));
                else
                    memset(dst, 0, (jb - ja) * sizeof(T));
            }
            _Pragma("omp simd")
            for (int64_t f = 0; f <= F; f++) {
                T a0 = pe[2 * f], a1 = po[2 * f], a2 = pe[2 * f + L], a3 = po[2 * f + L];
                T b0 = pe[2 * f + 1], b1 = po[2 * f + 1], b2 = pe[2 * f + 1 + L];
                T b3 = po[2 * f + 1 + L];
                e[f] = a0 - a2;          q[f] = b0 - b2;
                e[EQ + f] = a1 + a2;     q[EQ + f] = b1 + b2;
                e[2 * EQ + f] = a2 - a1; q[2 * EQ + f] = b2 - b1;
                e[3 * EQ + f] = a1 - a3; q[3 * EQ + f] = b1 - b3;
            }
            T* dst = v + c * NC + (r - r0) * (TW + 1);
            for (int i = 0; i < 4; i++) {
                const T* ei = e + i * EQ;
                const T* qi = q + i * EQ;
                T* di = dst + 4 * i * VS;
                _Pragma("omp simd")
                for (int64_t f = 0; f < F; f++) {
                    di[f] = ei[f] - ei[f + 1];
                    di[VS + f] = qi[f] + ei[f + 1];
                    di[2 * VS + f] = ei[f + 1] - qi[f];
                    di[3 * VS + f] = qi[f] - qi[f + 1];
                }
            }
        }
        r += R;
    }
}

/* m (16, O, NC) of tile rows [r0, r1) -> y (N, O, OH, OW) + bias: A^T m A. First each
   channel's row of m at once (one long vector loop), each tile's 2x2 outputs going in
   place to positions 0-3; then row by row into y. The second row of a tile on an odd last
   row goes to the spare row at the end of the thread's scratch buf, the second column of
   one on an odd last column is not written. Output channels [o0, o1) only. */
static void wino_out_##S(T* m, const T* bias, T* y, T* buf, const int64_t* wg,
                         int64_t r0, int64_t r1, int64_t o0, int64_t o1) {
    WGEOMETRY;
    T* spare = buf + WROWS - (OW + 1);
    int64_t full = OW / 2, cols = (r1 - r0) * (TW + 1);
    for (int64_t o = o0; o < o1; o++) {
        T* mo = m + o * NC;
        _Pragma("omp simd")
        for (int64_t i = 0; i < cols; i++) {
            T a0[4], a1[4];
            for (int j = 0; j < 4; j++) {
                a0[j] = mo[j * MS + i] + mo[(4 + j) * MS + i] + mo[(8 + j) * MS + i];
                a1[j] = mo[(4 + j) * MS + i] - mo[(8 + j) * MS + i] - mo[(12 + j) * MS + i];
            }
            mo[i] = a0[0] + a0[1] + a0[2];
            mo[MS + i] = a0[1] - a0[2] - a0[3];
            mo[2 * MS + i] = a1[0] + a1[1] + a1[2];
            mo[3 * MS + i] = a1[1] - a1[2] - a1[3];
        }
    }
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / TH, th = r - n * TH;
        for (int64_t o = o0; o < o1; o++) {
            T bo = bias ? bias[o] : (T)0;
            const T* z = m + o * NC + (r - r0) * (TW + 1);
            T* y0 = y + ((n * O + o) * OH + 2 * th) * OW;
            T* y1 = 2 * th + 1 < OH ? y0 + OW : spare;
            _Pragma("omp simd")
            for (int64_t tw = 0; tw < full; tw++) {
                y0[2 * tw] = z[tw] + bo;
                y0[2 * tw + 1] = z[MS + tw] + bo;
                y1[2 * tw] = z[2 * MS + tw] + bo;
                y1[2 * tw + 1] = z[3 * MS + tw] + bo;
            }
            if (full < TW) {
                y0[2 * full] = z[full] + bo;
                y1[2 * full] = z[2 * MS + full] + bo;
            }
        }
    }
}

/* one output-gradient tile (a b; c e) -> d[p * MS], p = 0..15: A g A^T */
static inline __attribute__((always_inline)) void wino_tile_gz_##S(T a, T b, T c, T e, T* d,
                                                                   int64_t MS) {
    T u[4] = {a, a + b, a - b, -b}, w[4] = {c, c + e, c - e, -e};
    for (int j = 0; j < 4; j++) {
        d[j * MS] = u[j];
        d[(4 + j) * MS] = u[j] + w[j];
        d[(8 + j) * MS] = u[j] - w[j];
        d[(12 + j) * MS] = -w[j];
    }
}

/* the output gradient's tiles of rows [r0, r1) -> z (16, O, NC): A g A^T of each 2x2 tile
   g (zero past the last row and column; rows past it read the zero row at the end of the
   thread's zeroed scratch buf), each row's spare column zero */
static void wino_gz_##S(const T* gy, T* z, const T* buf, const int64_t* wg, int64_t r0,
                        int64_t r1) {
    WGEOMETRY;
    const T* zero = buf + WROWS - (OW + 1);
    int64_t full = OW / 2;
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / TH, th = r - n * TH;
        for (int64_t o = 0; o < O; o++) {
            const T* g0 = gy + ((n * O + o) * OH + 2 * th) * OW;
            const T* g1 = 2 * th + 1 < OH ? g0 + OW : zero;
            T* d = z + o * NC + (r - r0) * (TW + 1);
            _Pragma("omp simd")
            for (int64_t tw = 0; tw < full; tw++)
                wino_tile_gz_##S(g0[2 * tw], g0[2 * tw + 1], g1[2 * tw], g1[2 * tw + 1],
                                 d + tw, MS);
            if (full < TW) wino_tile_gz_##S(g0[2 * full], 0, g1[2 * full], 0, d + full, MS);
            for (int p = 0; p < 16; p++) d[p * MS + TW] = (T)0;
        }
    }
}

"""


def _macro(head: str, body: str) -> str:
    return f"#define {head} \\\n" + " \\\n".join(body.strip("\n").splitlines()) + "\n"

# The drivers of F(2x2) and F(4x4) alike: WINO_FWD, WINO_WIDE and WINO_WGRAD (T, S, V,
# GEOM, NP) define tsr_conv_V_fwd_S, tsr_conv_V_wide_S and tsr_conv_V_wgrad_S over the
# transforms V_weight_S, V_in_S, V_out_S and V_gz_S (WINOGRAD(T, S) or WINOGRAD4(T, S)
# before them), geometry GEOM (which gives TC, a tile row's columns in v and m: F(2x2)
# keeps a spare one) and NP tile positions (conv_kernels._definitions).
# WINO_WEIGHT(T, S, V, GEOM) defines the filter transform V_weight_S over V_gkg_S, one
# filter's G k G^T.
_WEIGHT = r"""
/* U (NP, O, C), positions US apart, = G k G^T of output channel o's filters k (O, C, 3, 3);
   with FLIP, of the filters of w (C, O, 3, 3) turned 180 degrees (the input gradient).
   Gathered 64 channels at a time into k (9, 64), so that the transform (V_gkg) runs
   across channels in vector lanes. */
static void V##_weight_##S(const T* w, T* u, const int64_t* wg, int64_t o) {
    GEOM;
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
        int64_t nc = C - c0 < 64 ? C - c0 : 64;
        T k[9][64];
        for (int64_t c = 0; c < nc; c++) {
            const T* f = w + (FLIP ? (c0 + c) * O + o : o * C + c0 + c) * 9;
            for (int i = 0; i < 9; i++) k[i][c] = f[FLIP ? 8 - i : i];
        }
        T* dst = u + o * C + c0;
        _Pragma("omp simd")
        for (int64_t c = 0; c < nc; c++) V##_gkg_##S(k, c, dst + c, US);
    }
}
"""

_DRIVER_FWD = r"""
/* y = w (*) x + b through the transformed filters u (NP, O, C). First u (items from
   next[2]: output channels, next[3] counting them done), then blocks of RB tile rows of
   the batch (items from next[0]), each waiting for all of u after its input transform;
   thread t's workspace work + t * ws holds the zeroed scratch of the transforms (WROWS),
   then v (NP, C, NC) and m (NP, O, NC), positions VS and MS apart. */
void tsr_conv_##V##_fwd_##S(const T* x, const T* w, T* u, const T* b, T* y, T* work,
                            int64_t ws, int64_t* next, const int64_t* wg, void* gemm,
                            int64_t t, int64_t t1) {
    GEOM;
    (void)t1;
    T* rows = work + t * ws;
    T* v = rows + WROWS;
    T* m = v + NP * VS;
    memset(rows, 0, WROWS * sizeof(T));
    for (;;) {
        int64_t o = __atomic_fetch_add(next + 2, 1, __ATOMIC_RELAXED);
        if (o >= O) break;
        V##_weight_##S(w, u, wg, o);
        __atomic_fetch_add(next + 3, 1, __ATOMIC_RELEASE);
    }
    int64_t items = (N * TH + RB - 1) / RB;
    for (;;) {
        int64_t it = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
        if (it >= items) break;
        int64_t r0 = it * RB, r1 = r0 + RB < N * TH ? r0 + RB : N * TH;
        int64_t cols = (r1 - r0) * TC;
        V##_in_##S(x, v, rows, wg, r0, r1, 0, C);
        conv_wait(next + 3, O);
        for (int p = 0; p < NP; p++)
            ((gemm_##S)gemm)(ROW, NT, NT, O, cols, C, 1, u + p * US, C, v + p * VS, NC,
                             0, m + p * MS, NC);
        V##_out_##S(m, b, y, rows, wg, r0, r1, 0, O);
    }
}
"""

_DRIVER_WIDE = r"""
/* The wide forward, for few tiles (batch-1 layers), where items of tile rows would make
   skinny GEMMs that each read all of u: the whole batch is one block (RB = N TH) whose v
   and m (positions VS and MS apart) all threads share, in three passes: u = the filter
   transform and v = the input transform (items: output channels' filters, then input
   channels; neither needs the other), the NP GEMMs m[p] (O, NC) = u[p] (O, C) @ v[p]
   (C, NC) (items: positions), the output transform into y plus the bias (items: output
   channels). next[0], next[2] and next[4] hand out the items of passes 1-3, next[1] and
   next[3] count those of passes 1 and 2 done; thread t's scratch (passes 1 and 3) at
   work + t * ws. */
void tsr_conv_##V##_wide_##S(const T* x, const T* w, T* u, T* v, T* m, const T* b, T* y,
                             T* work, int64_t ws, int64_t* next, const int64_t* wg,
                             void* gemm, int64_t t, int64_t t1) {
    GEOM;
    (void)t1;
    T* rows = work + t * ws;
    memset(rows, 0, WROWS * sizeof(T));
    for (;;) {
        int64_t it = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
        if (it >= O + C) break;
        if (it < O) V##_weight_##S(w, u, wg, it);
        else V##_in_##S(x, v, rows, wg, 0, N * TH, it - O, it - O + 1);
        __atomic_fetch_add(next + 1, 1, __ATOMIC_RELEASE);
    }
    conv_wait(next + 1, O + C);
    for (;;) {
        int64_t p = __atomic_fetch_add(next + 2, 1, __ATOMIC_RELAXED);
        if (p >= NP) break;
        ((gemm_##S)gemm)(ROW, NT, NT, O, NC, C, 1, u + p * US, C, v + p * VS, NC, 0,
                         m + p * MS, NC);
        __atomic_fetch_add(next + 3, 1, __ATOMIC_RELEASE);
    }
    conv_wait(next + 3, NP);
    for (;;) {
        int64_t o = __atomic_fetch_add(next + 4, 1, __ATOMIC_RELAXED);
        if (o >= O) break;
        V##_out_##S(m, b, y, rows, wg, 0, N * TH, o, o + 1);
    }
}
"""

_DRIVER_WGRAD = r"""
/* s[t] (NP, O, C), positions US apart, = the sum over thread t's items of
   z[p] (O, NC) @ v[p]^T (NC, C): the weight gradient before its filter transform
   G^T s G. Thread t of nt takes a fixed run of items, so that the sum's order (and the
   result) does not depend on which thread ran first; v's spare columns, where a tile row
   has one, are zeroed (z's are zero too, and garbage times zero could still be a NaN). */
void tsr_conv_##V##_wgrad_##S(const T* x, const T* gy, T* s, T* work, int64_t ws,
                              int64_t* next, const int64_t* wg, void* gemm, int64_t t,
                              int64_t nt) {
    GEOM;
    (void)next;
    T* rows = work + t * ws;
    T* v = rows + WROWS;
    T* z = v + NP * VS;
    T* acc = s + t * NP * US;
    memset(rows, 0, WROWS * sizeof(T));
    int64_t items = (N * TH + RB - 1) / RB;
    T beta = 0;
    for (int64_t it = items * t / nt; it < items * (t + 1) / nt; it++) {
        int64_t r0 = it * RB, r1 = r0 + RB < N * TH ? r0 + RB : N * TH;
        int64_t cols = (r1 - r0) * TC;
        V##_in_##S(x, v, rows, wg, r0, r1, 0, C);
        for (int p = 0; p < NP && TC > TW; p++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t i = TW; i < cols; i += TC) v[p * VS + c * NC + i] = (T)0;
        V##_gz_##S(gy, z, rows, wg, r0, r1);
        for (int p = 0; p < NP; p++)
            ((gemm_##S)gemm)(ROW, NT, TR, O, C, cols, 1, z + p * MS, NC, v + p * VS, NC,
                             beta, acc + p * US, C);
        beta = 1;
    }
    if (beta == 0)
        for (int p = 0; p < NP; p++) memset(acc + p * US, 0, O * C * sizeof(T));
}
"""


# appended to the drivers' source after its %-formatting (so '%' is literal C); it uses
# their blasint, ROW/NT and gemm_<S> typedefs
WINOGRAD_C = r"""
/* the Winograd geometry wg[]: C H W O PH PW OH OW N RB FLIP, of the convolution run (for
   the input gradient: C = O of the layer, H W = its output size, O = its C); RB tile rows
   an item, NC columns (tiles and each row's spare) in its v and m */
#define WGEOMETRY                                                                         \
    int64_t C = wg[0], H = wg[1], W = wg[2], O = wg[3], PH = wg[4], PW = wg[5],           \
            OH = wg[6], OW = wg[7], N = wg[8], RB = wg[9], FLIP = wg[10];                 \
    int64_t TH = (OH + 1) / 2, TW = (OW + 1) / 2, TC = TW + 1, NC = RB * TC;              \
    int64_t L = 2 * (TW + 1), EQ = NC + 1;                                                \
    int64_t WROWS = (2 * (RB + 2) * L + 8 * EQ + OW + 1 + 15) / 16 * 16;                  \
    /* the 16 positions' matrices sit a cache line more than their size apart: at a      \
       multiple of 4 KiB they would share cache sets (and thrash them) */                 \
    int64_t US = O * C + 16, VS = C * NC + 16, MS = O * NC + 16;                          \
    (void)H; (void)PH; (void)PW; (void)FLIP; (void)WROWS; (void)L; (void)EQ; (void)N;     \
    (void)US; (void)VS; (void)MS; (void)TH; (void)OH; (void)TC

""" + _macro("WINO_WEIGHT(T, S, V, GEOM)", _WEIGHT) \
    + "".join(_macro(f"WINO_{k}(T, S, V, GEOM, NP)", body) for k, body in (
        ("FWD", _DRIVER_FWD), ("WIDE", _DRIVER_WIDE), ("WGRAD", _DRIVER_WGRAD))) \
    + _macro("WINOGRAD(T, S)", _BODY)  # instantiated per dtype by conv_kernels._driver

_ON = os.environ.get("TESSERA_WINOGRAD", "1") not in ("0", "", "false", "off")


def enabled() -> bool:
    """Whether ``TESSERA_WINOGRAD`` (read once, at import) lets the Winograd path run."""
    return _ON


def chosen(n: int, c: int, o: int, oh: int, ow: int, dtype) -> bool:
    """Whether a stride-1 3x3 convolution of ``n`` images, ``c`` -> ``o`` channels and output
    ``oh`` x ``ow`` runs as Winograd rather than im2col + GEMM (the rule measured on
    ResNet-18's and the benchmark CNN's layers: bench models: resnet18 infer b1/b8, bench
    training: cnn).

    >>> chosen(8, 64, 64, 56, 56, np.float32) == usable(np.float32)
    True
    """
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    tiles = n * th * tw
    # transforms cost per channel, GEMM savings per channel pair: few channels lose
    return (min(c, o) >= 32
            # below 10x10, 4x4 tiles (and each tile row's spare column) waste much of the
            # GEMMs (7x7 computes 80 outputs for 49) unless they run wide (bench models:
            # resnet18 infer b8)
            and (oh * ow >= 100 or _wide(c, o, th, tw, n, np.dtype(dtype).itemsize))
            # the filter transform and each item's reading of the 16 (o, c) matrices pay off
            # only over enough tiles (bench models: resnet18 infer b1)
            and tiles * 8 >= max(c, o)
            and usable(dtype))


def chosen_weight_grad(n: int, c: int, o: int, oh: int, ow: int, dtype) -> bool:
    """Whether the weight gradient of such a convolution runs as Winograd: only up to 64
    channels, where it is faster; from 128 channels its (O, C) sums over short runs of tiles
    lose to im2col + GEMM (bench training: cnn). As F(4x4) where ``four`` says.

    >>> chosen_weight_grad(64, 32, 64, 28, 28, np.float32) == usable(np.float32)
    True
    """
    return max(c, o) <= 64 and oh * ow >= 100 and chosen(n, c, o, oh, ow, dtype)


def usable(dtype) -> bool:
    """Whether the Winograd kernels can run for ``dtype``: switched on, and the threaded
    convolution drivers (which hold them) built."""
    from tessera.kernels.conv import threaded
    return _ON and threaded(dtype)


class Tiles(NamedTuple):
    """An F(m x m, 3x3) as its Python side sees it: the drivers' prefix, m, the columns
    a tile row keeps in v and m past its last tile (F(2x2): one spare), the filter transform
    G ((m + 2) x 3), and a thread's scratch before its v (WROWS in the C) from (rb, th, tw,
    ow)."""

    name: str
    m: int
    spare: int
    g: np.ndarray
    wrows: Callable[[int, int, int, int], int]

    def shape(self, oh: int, ow: int) -> tuple[int, int, int, int]:
        """(tile rows, tiles a row, columns a tile row in v and m, positions)."""
        th, tw = -(-oh // self.m), -(-ow // self.m)
        return th, tw, tw + self.spare, (self.m + 2) ** 2


_G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]])
F2 = Tiles("wino", 2, 1, _G, lambda rb, th, tw, ow: (2 * (rb + 2) * 2 * (tw + 1) + 8 * (
    rb * (tw + 1) + 1) + ow + 1 + 15) // 16 * 16)


def _tiles(n: int, c: int, o: int, oh: int, ow: int) -> Tiles:
    if four(n, c, o, oh, ow):
        from tessera.kernels.winograd4 import F4
        return F4
    return F2


def _rows_per_item(v: Tiles, c: int, o: int, oh: int, ow: int, n: int, threads: int,
                   itemsize: int) -> int:
    """Tile rows per work item: v and m of an item fill about half of a core's L2 (written,
    read by the GEMMs, read again), but its GEMMs have at least _MIN_COLS columns (each item
    reads all of u: with many channels and few columns that read dominates); at least 2
    items per thread so that a late thread only takes fewer."""
    th, _, tc, p = v.shape(oh, ow)
    rb = max(_L2_BYTES // 2 // (p * (c + o) * tc * itemsize), -(-_MIN_COLS // tc))
    return int(max(1, min(rb, -(-n * th // (2 * threads)))))


_L2_BYTES = 1 << 20
# columns: the GEMMs' per-call packing of u and their short rows cost more than v and m
# spilling from L2 (bench models: resnet18 infer b8)
_MIN_COLS = 256


def _winograd(x: np.ndarray, w: np.ndarray, b, pads, y: np.ndarray, flip: int) -> None:
    """``y`` = the stride-1 3x3 correlation of ``x`` (N, C, H, W) with the filters of ``w``
    (turned and channel-swapped when ``flip``), low paddings ``pads``, plus ``b``: F(4x4)
    where ``four`` says, else F(2x2)."""
    from tessera.kernels.conv import _run, _threads, _workspace
    n, c, h, wd = x.shape
    o, oh, ow = y.shape[1:]
    v = _tiles(n, c, o, oh, ow)
    th, tw, tc, p = v.shape(oh, ow)
    threads = _threads(n * o * c * 9 * oh * ow)
    wide = _fits_wide(v, c, o, oh, ow, n, x.itemsize)
    rb = n * th if wide else _rows_per_item(v, c, o, oh, ow, n, threads, x.itemsize)
    ws = v.wrows(rb, th, tw, ow) + (0 if wide else p * ((c + o) * rb * tc + 32))
    work = _workspace(ws * threads, x.dtype)
    u = _workspace(p * (o * c + 16), x.dtype, "winograd")
    geometry = [c, h, wd, o, *pads, oh, ow, n, rb, flip]
    if not wide:
        _run(f"{v.name}_fwd", x.dtype, (x, w, u, b, y), work, ws, geometry, threads)
        return
    nc = rb * tc
    vm = _workspace(p * ((c + o) * nc + 32), x.dtype, "winograd_wide")
    vv, m = vm[:p * (c * nc + 16)], vm[p * (c * nc + 16):]
    _run(f"{v.name}_wide", x.dtype, (x, w, u, vv, m, b, y), work, ws, geometry, threads)


def four(n: int, c: int, o: int, oh: int, ow: int) -> bool:
    """Whether a Winograd forward (or input gradient) runs as F(4x4, 3x3)
    (``tessera.kernels.winograd4``) rather than F(2x2): over enough 4x4 tiles to
    amortise its filter transform, 2.25x F(2x2)'s (36 positions of O x C) (bench models:
    resnet18 infer b1/b8; bench training: cnn).

    >>> four(1, 64, 64, 56, 56), four(1, 256, 256, 14, 14)
    (True, False)
    """
    return _FOUR and n * ((oh + 3) // 4) * ((ow + 3) // 4) * 8 >= max(c, o)


def prefetch(kind: str, n: int, c: int, o: int, oh: int, ow: int, dtype) -> None:
    """Start compiling, in the background, the driver that the ``kind`` ("forward", which
    the input gradient is too, or "weight_grad") of a Winograd convolution of ``n`` images,
    ``c`` -> ``o`` channels and output ``oh`` x ``ow`` will run."""
    from tessera.kernels import conv as conv_kernels
    v = _tiles(n, c, o, oh, ow)
    if kind == "weight_grad":
        name = f"{v.name}_wgrad"
    else:
        wide = _fits_wide(v, c, o, oh, ow, n, np.dtype(dtype).itemsize)
        name = f"{v.name}_{'wide' if wide else 'fwd'}"
    conv_kernels.prefetch(name, dtype)


_FOUR = os.environ.get("TESSERA_WINOGRAD4", "1") not in ("0", "", "false", "off")


def _wide(c: int, o: int, th: int, tw: int, n: int, itemsize: int) -> bool:
    """Whether the F(2x2) forward of ``th`` x ``tw`` tiles runs wide (``_fits_wide``)."""
    return _fits_wide(F2, c, o, 2 * th, 2 * tw, n, itemsize)


def _fits_wide(v: Tiles, c: int, o: int, oh: int, ow: int, n: int, itemsize: int) -> bool:
    """Whether the forward runs wide: the whole batch one block, its three passes split
    over input channels, positions and output channels, rather than in items of tile rows.
    Items of a few tile rows make skinny GEMMs, each reading all of u, and at batch 1
    only a few items share out unevenly; one block's v and m (positions' GEMMs of every
    tile) take memory, so only up to _WIDE_BYTES (bench models: resnet18 infer b1/b8)."""
    th, _, tc, p = v.shape(oh, ow)
    return p * (c + o) * n * th * tc * itemsize <= _WIDE_BYTES


_WIDE_BYTES = 32 << 20


def conv2d_weight_grad_winograd(x: np.ndarray, g: np.ndarray, pads) -> np.ndarray:
    """The weight gradient (O, C, 3, 3) of a stride-1 3x3 convolution with low paddings
    ``pads`` from C-contiguous ``x`` (N, C, H, W) and ``g`` (N, O, OH, OW): per tile
    position the sum over tiles of (A g A^T)[p] (O, tiles) @ (B^T d B)[p]^T (tiles, C), each
    thread over a fixed run of tile rows (a sum whose order does not depend on thread
    timing), then G^T s G; F(4x4) where ``four`` says.

    >>> x, g = np.ones((1, 2, 3, 3)), np.ones((1, 1, 1, 1))
    >>> dw = conv2d_weight_grad_winograd(x, g, (0, 0)) if usable(np.float64) else x[None, 0]
    >>> dw.shape, round(float(dw.sum()), 6)   # exact up to the transforms' rounding
    ((1, 2, 3, 3), 18.0)
    """
    from tessera.kernels.conv import _run, _threads, _workspace
    n, c, h, wd = x.shape
    o, oh, ow = g.shape[1:]
    v = _tiles(n, c, o, oh, ow)
    th, tw, tc, p = v.shape(oh, ow)
    threads = min(_threads(n * o * c * 9 * oh * ow), n * th)
    # the GEMMs sum over an item's tiles into an (O, C) block: long sums (many tile rows per
    # item, v and z in L3 rather than L2) run at GEMM speed, short ones at memory speed
    rb = max(1, min(-(-n * th // threads), _WGRAD_BYTES // (p * (c + o) * tc * x.itemsize)))
    ws = v.wrows(rb, th, tw, ow) + p * ((c + o) * rb * tc + 32)
    work = _workspace(ws * threads, x.dtype)
    s = np.empty((threads, p, o * c + 16), x.dtype)
    geometry = [c, h, wd, o, *pads, oh, ow, n, rb, 0]
    _run(f"{v.name}_wgrad", x.dtype, (x, g, s), work, ws, geometry, threads)
    # (the padding columns are not written)
    s = s[:, :, :o * c].sum(0).reshape(v.m + 2, v.m + 2, o, c)
    gt = v.g.T.astype(x.dtype)
    t = np.tensordot(gt, s, axes=(1, 0))                                  # (3, m + 2, O, C)
    return np.ascontiguousarray(np.tensordot(t, gt, axes=(1, 1)).transpose(1, 2, 0, 3))


_WGRAD_BYTES = 1 << 20  # v and z of an item; much larger items are slower (bench training: cnn)


def conv2d_winograd(x: np.ndarray, w: np.ndarray, b, pads, y: np.ndarray) -> None:
    """``y`` (N, O, OH, OW) = the stride-1 3x3 convolution of C-contiguous ``x`` (N, C, H, W)
    with C-contiguous ``w`` (O, C, 3, 3) plus ``b`` (O,) if given; ``pads`` are the low
    paddings (the output size gives the high ones); ``y`` C-contiguous.

    >>> x, w = np.ones((1, 2, 3, 3)), np.ones((1, 2, 3, 3))
    >>> y = np.empty((1, 1, 1, 1))
    >>> conv2d_winograd(x, w, None, (0, 0), y) if usable(np.float64) else y.fill(18)
    >>> float(y[0, 0, 0, 0])
    18.0
    """
    _winograd(x, w, b, pads, y, 0)


def conv2d_input_grad_winograd(g: np.ndarray, w: np.ndarray, pads, dx: np.ndarray) -> None:
    """``dx`` (N, C, H, W) = the input gradient of a stride-1 3x3 convolution with low
    paddings ``pads`` (each at most 2) and filters ``w`` (O, C, 3, 3), from C-contiguous
    ``g`` (N, O, OH, OW): the convolution of ``g`` with the turned, channel-swapped filters
    and low paddings 2 - p.

    >>> g, w = np.ones((1, 1, 1, 1)), np.ones((1, 2, 3, 3))
    >>> dx = np.empty((1, 2, 3, 3))
    >>> conv2d_input_grad_winograd(g, w, (0, 0), dx) if usable(np.float64) else dx.fill(1)
    >>> round(float(dx.sum()), 6)   # exact up to the transforms' rounding
    18.0
    """
    _winograd(g, w, None, tuple(2 - p for p in pads), dx, 1)
