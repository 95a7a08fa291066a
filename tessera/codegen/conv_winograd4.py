"""Winograd F(4x4, 3x3): the larger-tile variant of ``tessera.codegen.winograd`` (same
drivers' shape, same work items, compiled into the same library of the threaded
convolution drivers of ``tessera.codegen.conv_kernels``).

Each 4x4 block of outputs takes 36 multiplies per (input, output) channel pair instead of
144 (F(2x2): 64 for the same 16 outputs): U = G g G^T (6x6 per filter), V = B^T d B per
6x6 input tile (tiles 4 apart), 36 GEMMs M[p] (O, tiles) = U[p] (O, C) @ V[p] (C, tiles),
Y = A^T M A (Lavin and Gray 2015, with the points 0, +-1, +-2). Both the GEMMs' flops and
V and M, the transforms' traffic, are 1.78x smaller than F(2x2)'s over the same outputs;
the price is rounding: the transforms weigh terms by up to 8 (A) and 1/24 (G), so float32
results carry a few times F(2x2)'s error (still ~1e-5 of the output's scale here).

The input transform goes row by row: each input row of a tile-row segment, zero-padded
into ``lin``, gives B^T along its columns for every tile (6 values a tile), stored by row
phase (input row 4t + k at h[jj][k % 4][t + k / 4]) so that the transform along the rows
is one long unit-stride loop over all the segment's tiles. M has no spare columns (F(2x2)
keeps one a tile row): its output transform is one loop over all tiles of an item too.

>>> import numpy as np
>>> from tessera.codegen import winograd
>>> x, w = np.ones((1, 1, 6, 6), np.float32), np.ones((1, 1, 3, 3), np.float32)
>>> y = np.empty((1, 1, 4, 4), np.float32)
>>> winograd4(x, w, None, (0, 0), y, 0) if winograd.usable(np.float32) else y.fill(9)
>>> float(y[0, 0, 3, 3])
9.0
"""
from __future__ import annotations

import numpy as np

from tessera.codegen.winograd import _macro

__all__ = ["WINOGRAD4_C", "winograd4", "wide4", "weight_grad4"]

# C without backslashes: _macro() continues every line (so comments are /* */ only).
# Uses the drivers' gemm_<S> typedef, ROW/NT and conv_wait.
_BODY = r"""
/* U (36, O, C), positions US apart, = G k G^T of output channel o's filters k (O, C, 3, 3)
   (with FLIP, of w (C, O, 3, 3) turned 180 degrees); 64 channels at a time across the
   vector lanes, as wino_weight */
static void wino4_weight_##S(const T* w, T* u, const int64_t* wg, int64_t o) {
    W4GEOMETRY;
    const T q4 = (T)0.25, q6 = (T)(1.0 / 6), q12 = (T)(1.0 / 12), q24 = (T)(1.0 / 24);
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
        int64_t nc = C - c0 < 64 ? C - c0 : 64;
        T k[9][64];
        for (int64_t c = 0; c < nc; c++) {
            const T* f = w + (FLIP ? (c0 + c) * O + o : o * C + c0 + c) * 9;
            for (int i = 0; i < 9; i++) k[i][c] = f[FLIP ? 8 - i : i];
        }
        T* dst = u + o * C + c0;
        _Pragma("omp simd")
        for (int64_t c = 0; c < nc; c++) {
            T a[6][3];
            for (int j = 0; j < 3; j++) {
                T g0 = k[j][c], g1 = k[3 + j][c], g2 = k[6 + j][c];
                a[0][j] = q4 * g0;
                a[1][j] = -q6 * (g0 + g1 + g2);
                a[2][j] = -q6 * (g0 - g1 + g2);
                a[3][j] = q24 * g0 + q12 * g1 + q6 * g2;
                a[4][j] = q24 * g0 - q12 * g1 + q6 * g2;
                a[5][j] = g2;
            }
            for (int i = 0; i < 6; i++) {
                T g0 = a[i][0], g1 = a[i][1], g2 = a[i][2];
                T* d = dst + 6 * i * US + c;
                d[0] = q4 * g0;
                d[US] = -q6 * (g0 + g1 + g2);
                d[2 * US] = -q6 * (g0 - g1 + g2);
                d[3 * US] = q24 * g0 + q12 * g1 + q6 * g2;
                d[4 * US] = q24 * g0 - q12 * g1 + q6 * g2;
                d[5 * US] = g2;
            }
        }
    }
}

/* the tile rows [r0, r1) of the batch (row r: image r / TH, tile row r % TH) -> v (36, C,
   NC): B^T d B of each 6x6 input tile d, tile f of the block's row i at column i TW + f.
   Per (image segment, channel): each of the 4R + 2 input rows copied into the zero-padded
   lin, B^T along it into h (6 values a tile, by row phase: row 4t + k at
   h[jj][k % 4][t + k / 4]), then B^T down the columns, one loop over the segment's tiles.
   Channels [c0, c1) only; buf: the thread's WROWS scratch. */
static void wino4_in_##S(const T* x, T* v, T* buf, const int64_t* wg, int64_t r0,
                         int64_t r1, int64_t c0, int64_t c1) {
    W4GEOMETRY;
    T* lin = buf;
    T* h = buf + LW;
    int64_t ja = PW < LW ? PW : LW, jb = PW + W < LW ? PW + W : LW;
    memset(lin, 0, LW * sizeof(T));
    for (int64_t r = r0; r < r1;) {
        int64_t n = r / TH, th0 = r - n * TH;
        int64_t R = th0 + (r1 - r) < TH ? r1 - r : TH - th0;
        for (int64_t c = c0; c < c1; c++) {
            for (int64_t k = 0; k < 4 * R + 2; k++) {
                int64_t ih = 4 * th0 - PH + k;
                if (ja < jb) {
                    if (ih >= 0 && ih < H)
                        memcpy(lin + ja, x + ((n * C + c) * H + ih) * W + ja - PW,
                               (jb - ja) * sizeof(T));
                    else
                        memset(lin + ja, 0, (jb - ja) * sizeof(T));
                }
                T* hk = h + (k & 3) * HP + (k >> 2) * TW;
                _Pragma("omp simd")
                for (int64_t f = 0; f < TW; f++) {
                    const T* d = lin + 4 * f;
                    T d0 = d[0], d1 = d[1], d2 = d[2], d3 = d[3], d4 = d[4], d5 = d[5];
                    hk[f] = 4 * d0 - 5 * d2 + d4;
                    hk[4 * HP + f] = (d3 + d4) - 4 * (d1 + d2);
                    hk[8 * HP + f] = (d4 - d3) + 4 * (d1 - d2);
                    hk[12 * HP + f] = (d4 - d2) + 2 * (d3 - d1);
                    hk[16 * HP + f] = (d4 - d2) - 2 * (d3 - d1);
                    hk[20 * HP + f] = 4 * d1 - 5 * d3 + d5;
                }
            }
            T* dst = v + c * NC + (r - r0) * TW;
            int64_t q1 = R * TW;
            for (int jj = 0; jj < 6; jj++) {
                const T* a = h + 4 * jj * HP;
                T* d = dst + jj * VS;
                _Pragma("omp simd")
                for (int64_t q = 0; q < q1; q++) {
                    T d0 = a[q], d1 = a[HP + q], d2 = a[2 * HP + q], d3 = a[3 * HP + q];
                    T d4 = a[TW + q], d5 = a[HP + TW + q];
                    d[q] = 4 * d0 - 5 * d2 + d4;
                    d[6 * VS + q] = (d3 + d4) - 4 * (d1 + d2);
                    d[12 * VS + q] = (d4 - d3) + 4 * (d1 - d2);
                    d[18 * VS + q] = (d4 - d2) + 2 * (d3 - d1);
                    d[24 * VS + q] = (d4 - d2) - 2 * (d3 - d1);
                    d[30 * VS + q] = 4 * d1 - 5 * d3 + d5;
                }
            }
        }
        r += R;
    }
}

/* m (36, O, NC) of tile rows [r0, r1) -> y (N, O, OH, OW) + bias: A^T m A, each tile's
   4x4 outputs in place to positions 0-15 (one loop over the item's tiles), then row by
   row into y, rows and columns past the output's edge dropped (buf, the thread's scratch,
   unused: wino_out's signature). Output channels [o0, o1). */
static void wino4_out_##S(T* m, const T* bias, T* y, T* buf, const int64_t* wg,
                          int64_t r0, int64_t r1, int64_t o0, int64_t o1) {
    W4GEOMETRY;
    (void)buf;
    int64_t full = OW / 4, cols = (r1 - r0) * TW;
    for (int64_t o = o0; o < o1; o++) {
        T* mo = m + o * NC;
        _Pragma("omp simd")
        for (int64_t q = 0; q < cols; q++) {
            T s[4][6];
            for (int j = 0; j < 6; j++) {
                T m0 = mo[j * MS + q], m1 = mo[(6 + j) * MS + q], m2 = mo[(12 + j) * MS + q];
                T m3 = mo[(18 + j) * MS + q], m4 = mo[(24 + j) * MS + q];
                T m5 = mo[(30 + j) * MS + q];
                s[0][j] = m0 + (m1 + m2) + (m3 + m4);
                s[1][j] = (m1 - m2) + 2 * (m3 - m4);
                s[2][j] = (m1 + m2) + 4 * (m3 + m4);
                s[3][j] = (m1 - m2) + 8 * (m3 - m4) + m5;
            }
            for (int i = 0; i < 4; i++) {
                T* d = mo + 4 * i * MS + q;
                d[0] = s[i][0] + (s[i][1] + s[i][2]) + (s[i][3] + s[i][4]);
                d[MS] = (s[i][1] - s[i][2]) + 2 * (s[i][3] - s[i][4]);
                d[2 * MS] = (s[i][1] + s[i][2]) + 4 * (s[i][3] + s[i][4]);
                d[3 * MS] = (s[i][1] - s[i][2]) + 8 * (s[i][3] - s[i][4]) + s[i][5];
            }
        }
    }
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / TH, th = r - n * TH;
        for (int64_t o = o0; o < o1; o++) {
            T bo = bias ? bias[o] : (T)0;
            const T* z = m + o * NC + (r - r0) * TW;
            for (int64_t i = 0; i < 4 && 4 * th + i < OH; i++) {
                T* yr = y + ((n * O + o) * OH + 4 * th + i) * OW;
                const T* zi = z + 4 * i * MS;
                _Pragma("omp simd")
                for (int64_t f = 0; f < full; f++) {
                    yr[4 * f] = zi[f] + bo;
                    yr[4 * f + 1] = zi[MS + f] + bo;
                    yr[4 * f + 2] = zi[2 * MS + f] + bo;
                    yr[4 * f + 3] = zi[3 * MS + f] + bo;
                }
                for (int64_t j = 0; j < OW - 4 * full; j++)
                    yr[4 * full + j] = zi[j * MS + full] + bo;
            }
        }
    }
}

/* the output gradient's tiles of rows [r0, r1) -> z (36, O, NC): A g A^T of each 4x4 tile
   g (zero past the output's edge), A = (A^T)^T: each row of a tile through A into h (6
   values a tile), then down the columns */
static void wino4_gz_##S(const T* gy, T* z, T* buf, const int64_t* wg, int64_t r0,
                         int64_t r1) {
    W4GEOMETRY;
    T* lin = buf;
    T* h = buf + LW;
    memset(lin, 0, LW * sizeof(T));
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / TH, th = r - n * TH;
        for (int64_t o = 0; o < O; o++) {
            for (int a = 0; a < 4; a++) {
                if (4 * th + a < OH)
                    memcpy(lin, gy + ((n * O + o) * OH + 4 * th + a) * OW, OW * sizeof(T));
                else
                    memset(lin, 0, OW * sizeof(T));
                T* ha = h + 6 * a * TW;
                _Pragma("omp simd")
                for (int64_t f = 0; f < TW; f++) {
                    T g0 = lin[4 * f], g1 = lin[4 * f + 1], g2 = lin[4 * f + 2];
                    T g3 = lin[4 * f + 3];
                    ha[f] = g0;
                    ha[TW + f] = (g0 + g2) + (g1 + g3);
                    ha[2 * TW + f] = (g0 + g2) - (g1 + g3);
                    ha[3 * TW + f] = (g0 + 4 * g2) + 2 * (g1 + 4 * g3);
                    ha[4 * TW + f] = (g0 + 4 * g2) - 2 * (g1 + 4 * g3);
                    ha[5 * TW + f] = g3;
                }
            }
            T* d = z + o * NC + (r - r0) * TW;
            for (int j = 0; j < 6; j++) {
                const T* hj = h + j * TW;
                T* dj = d + j * MS;
                _Pragma("omp simd")
                for (int64_t f = 0; f < TW; f++) {
                    T a0 = hj[f], a1 = hj[6 * TW + f], a2 = hj[12 * TW + f];
                    T a3 = hj[18 * TW + f];
                    dj[f] = a0;
                    dj[6 * MS + f] = (a0 + a2) + (a1 + a3);
                    dj[12 * MS + f] = (a0 + a2) - (a1 + a3);
                    dj[18 * MS + f] = (a0 + 4 * a2) + 2 * (a1 + 4 * a3);
                    dj[24 * MS + f] = (a0 + 4 * a2) - 2 * (a1 + 4 * a3);
                    dj[30 * MS + f] = a3;
                }
            }
        }
    }
}

WINO_DRIVERS(T, S, wino4, W4GEOMETRY, 36)
"""


# appended after WINOGRAD_C in the drivers' library header
WINOGRAD4_C = r"""
/* the F(4x4) geometry, from wg[] as WGEOMETRY's: TH x TW tiles an image, NC = RB TW
   columns an item (no spare); LW a padded input row, HP one row phase of the input
   transform's h, WROWS a thread's scratch of lin and h */
#define W4GEOMETRY                                                                        \
    int64_t C = wg[0], H = wg[1], W = wg[2], O = wg[3], PH = wg[4], PW = wg[5],           \
            OH = wg[6], OW = wg[7], N = wg[8], RB = wg[9], FLIP = wg[10];                 \
    int64_t TH = (OH + 3) / 4, TW = (OW + 3) / 4, TC = TW, NC = RB * TC;                  \
    int64_t LW = 4 * TW + 4, HP = (TH + 1) * TW;                                          \
    int64_t WROWS = (LW + 24 * HP + 15) / 16 * 16;                                        \
    /* the positions' matrices a cache line more than their size apart (see WGEOMETRY) */ \
    int64_t US = O * C + 16, VS = C * NC + 16, MS = O * NC + 16;                          \
    (void)H; (void)PH; (void)PW; (void)FLIP; (void)WROWS; (void)LW; (void)HP; (void)N;    \
    (void)US; (void)VS; (void)MS; (void)TH; (void)OH; (void)TC

""" + _macro("WINOGRAD4(T, S)", _BODY)


def _wrows(th: int, tw: int) -> int:
    """A thread's scratch before its v (WROWS in the C)."""
    return (4 * tw + 4 + 24 * (th + 1) * tw + 15) // 16 * 16


def wide4(c: int, o: int, oh: int, ow: int, n: int, itemsize: int) -> bool:
    """Whether the F(4x4) forward runs wide (the whole batch one block): v and m of the
    whole batch within ``winograd._WIDE_BYTES``, as for F(2x2)."""
    from tessera.codegen.winograd import _WIDE_BYTES
    return 36 * (c + o) * n * ((oh + 3) // 4) * ((ow + 3) // 4) * itemsize <= _WIDE_BYTES


def _rows_per_item(c: int, o: int, th: int, tw: int, n: int, threads: int,
                   itemsize: int) -> int:
    """Tile rows per item, by winograd._rows_per_item's rule (v and m of an item about
    half of L2, at least _MIN_COLS GEMM columns, two items a thread)."""
    from tessera.codegen.winograd import _L2_BYTES, _MIN_COLS
    per_row = 36 * (c + o) * tw * itemsize
    rb = max(_L2_BYTES // 2 // per_row, -(-_MIN_COLS // tw))
    return int(max(1, min(rb, -(-n * th // (2 * threads)))))


def winograd4(x: np.ndarray, w: np.ndarray, b, pads, y: np.ndarray, flip: int) -> None:
    """``y`` = the stride-1 3x3 correlation of C-contiguous ``x`` (N, C, H, W) with the
    filters of ``w`` (O, C, 3, 3; with ``flip`` (C, O, 3, 3) turned, the input gradient),
    low paddings ``pads``, plus ``b``, through F(4x4, 3x3)."""
    from tessera.codegen.conv_kernels import _run, _threads, _workspace
    n, c, h, wd = x.shape
    o, oh, ow = y.shape[1:]
    th, tw = (oh + 3) // 4, (ow + 3) // 4
    threads = _threads(n * o * c * 9 * oh * ow)
    wide = wide4(c, o, oh, ow, n, x.itemsize)
    rb = n * th if wide else _rows_per_item(c, o, th, tw, n, threads, x.itemsize)
    ws = _wrows(th, tw) + (0 if wide else 36 * ((c + o) * rb * tw + 32))
    work = _workspace(ws * threads, x.dtype)
    u = _workspace(36 * (o * c + 16), x.dtype, "winograd")
    geometry = [c, h, wd, o, *pads, oh, ow, n, rb, flip]
    if not wide:
        _run("wino4_fwd", x.dtype, (x, w, u, b, y), work, ws, geometry, threads)
        return
    nc = rb * tw
    vm = _workspace(36 * ((c + o) * nc + 32), x.dtype, "winograd_wide")
    v, m = vm[:36 * (c * nc + 16)], vm[36 * (c * nc + 16):]
    _run("wino4_wide", x.dtype, (x, w, u, v, m, b, y), work, ws, geometry, threads)


def weight_grad4(x: np.ndarray, g: np.ndarray, pads) -> np.ndarray:
    """The weight gradient (O, C, 3, 3) of a stride-1 3x3 convolution with low paddings
    ``pads`` from C-contiguous ``x`` (N, C, H, W) and ``g`` (N, O, OH, OW) through F(4x4):
    per tile position the sum over tiles of (A g A^T)[p] @ (B^T d B)[p]^T, each thread over
    a fixed run of tile rows (a sum whose order does not depend on thread timing), then
    G^T s G."""
    from tessera.codegen.conv_kernels import _run, _threads, _workspace
    from tessera.codegen.winograd import _WGRAD_BYTES
    n, c, h, wd = x.shape
    o, oh, ow = g.shape[1:]
    th, tw = (oh + 3) // 4, (ow + 3) // 4
    threads = min(_threads(n * o * c * 9 * oh * ow), n * th)
    per_row = 36 * (c + o) * tw * x.itemsize
    rb = max(1, min(-(-n * th // threads), _WGRAD_BYTES // per_row))
    ws = _wrows(th, tw) + 36 * ((c + o) * rb * tw + 32)
    work = _workspace(ws * threads, x.dtype)
    s = np.empty((threads, 36, o * c + 16), x.dtype)
    geometry = [c, h, wd, o, *pads, oh, ow, n, rb, 0]
    _run("wino4_wgrad", x.dtype, (x, g, s), work, ws, geometry, threads)
    s = s[:, :, :o * c].sum(0).reshape(6, 6, o, c)   # (the padding columns are not written)
    gt = _G4.T.astype(x.dtype)
    t = np.tensordot(gt, s, axes=(1, 0))                                  # (3, 6, O, C)
    return np.ascontiguousarray(np.tensordot(t, gt, axes=(1, 1)).transpose(1, 2, 0, 3))


_G4 = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])
