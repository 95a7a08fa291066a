/* Winograd F(4x4, 3x3) (tessera/kernels/winograd4.py): its geometry and transforms, for the
   drivers of winograd.h. Included by conv.h after winograd.h; uses the drivers' gemm_<S>
   typedef, ROW/NT and conv_wait. */

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

/* the F(4x4) transforms and the filter transform, instantiated per dtype after
   GEMM_TYPE(T, S) (conv.py's _definitions) */
#define WINOGRAD4(T, S)                                                                   \
/* G k G^T of filter c of the gathered k (9, 64) -> d[p * US], p = 0..35 */               \
static inline __attribute__((always_inline)) void wino4_gkg_##S(T k[9][64], int64_t c, T* d, \
                                                               int64_t US) {              \
    const T q4 = (T)0.25, q6 = (T)(1.0 / 6), q12 = (T)(1.0 / 12), q24 = (T)(1.0 / 24);    \
    T a[6][3];                                                                            \
    for (int j = 0; j < 3; j++) {                                                         \
        T g0 = k[j][c], g1 = k[3 + j][c], g2 = k[6 + j][c];                               \
        a[0][j] = q4 * g0;                                                                \
        a[1][j] = -q6 * (g0 + g1 + g2);                                                   \
        a[2][j] = -q6 * (g0 - g1 + g2);                                                   \
        a[3][j] = q24 * g0 + q12 * g1 + q6 * g2;                                          \
        a[4][j] = q24 * g0 - q12 * g1 + q6 * g2;                                          \
        a[5][j] = g2;                                                                     \
    }                                                                                     \
    for (int i = 0; i < 6; i++) {                                                         \
        T g0 = a[i][0], g1 = a[i][1], g2 = a[i][2];                                       \
        T* di = d + 6 * i * US;                                                           \
        di[0] = q4 * g0;                                                                  \
        di[US] = -q6 * (g0 + g1 + g2);                                                    \
        di[2 * US] = -q6 * (g0 - g1 + g2);                                                \
        di[3 * US] = q24 * g0 + q12 * g1 + q6 * g2;                                       \
        di[4 * US] = q24 * g0 - q12 * g1 + q6 * g2;                                       \
        di[5 * US] = g2;                                                                  \
    }                                                                                     \
}                                                                                         \
                                                                                          \
WINO_WEIGHT(T, S, wino4, W4GEOMETRY)                                                      \
                                                                                          \
/* B^T d of 6 points d0 .. d5 (a row or a column of an input tile) -> o[i * st], i < 6 */ \
static inline __attribute__((always_inline)) void wino4_bt_##S(T d0, T d1, T d2, T d3, T d4, \
                                                              T d5, T* o, int64_t st) {   \
    o[0] = 4 * d0 - 5 * d2 + d4;                                                          \
    o[st] = (d3 + d4) - 4 * (d1 + d2);                                                    \
    o[2 * st] = (d4 - d3) + 4 * (d1 - d2);                                                \
    o[3 * st] = (d4 - d2) + 2 * (d3 - d1);                                                \
    o[4 * st] = (d4 - d2) - 2 * (d3 - d1);                                                \
    o[5 * st] = 4 * d1 - 5 * d3 + d5;                                                     \
}                                                                                         \
                                                                                          \
/* the tile rows [r0, r1) of the batch (row r: image r / TH, tile row r % TH) -> v (36, C, \
   NC): B^T d B of each 6x6 input tile d, tile f of the block's row i at column i TW + f. \
   Per (image segment, channel): each of the 4R + 2 input rows copied into the zero-padded \
   lin, B^T along it into h (6 values a tile, by row phase: row 4t + k at                 \
   h[jj][k % 4][t + k / 4]), then B^T down the columns, one loop over the segment's tiles. \
   Channels [c0, c1) only; buf: the thread's WROWS scratch. */                            \
static void wino4_in_##S(const T* x, T* v, T* buf, const int64_t* wg, int64_t r0,         \
                         int64_t r1, int64_t c0, int64_t c1) {                            \
    W4GEOMETRY;                                                                           \
    T* lin = buf;                                                                         \
    T* h = buf + LW;                                                                      \
    int64_t ja = PW < LW ? PW : LW, jb = PW + W < LW ? PW + W : LW;                       \
    memset(lin, 0, LW * sizeof(T));                                                       \
    for (int64_t r = r0; r < r1;) {                                                       \
        int64_t n = r / TH, th0 = r - n * TH;                                             \
        int64_t R = th0 + (r1 - r) < TH ? r1 - r : TH - th0;                              \
        for (int64_t c = c0; c < c1; c++) {                                               \
            for (int64_t k = 0; k < 4 * R + 2; k++) {                                     \
                int64_t ih = 4 * th0 - PH + k;                                            \
                if (ja < jb) {                                                            \
                    if (ih >= 0 && ih < H)                                                \
                        memcpy(lin + ja, x + ((n * C + c) * H + ih) * W + ja - PW,        \
                               (jb - ja) * sizeof(T));                                    \
                    else                                                                  \
                        memset(lin + ja, 0, (jb - ja) * sizeof(T));                       \
                }                                                                         \
                T* hk = h + (k & 3) * HP + (k >> 2) * TW;                                 \
                _Pragma("omp simd")                                                       \
                for (int64_t f = 0; f < TW; f++) {                                        \
                    const T* d = lin + 4 * f;                                             \
                    wino4_bt_##S(d[0], d[1], d[2], d[3], d[4], d[5], hk + f, 4 * HP);     \
                }                                                                         \
            }                                                                             \
            T* dst = v + c * NC + (r - r0) * TW;                                          \
            int64_t q1 = R * TW;                                                          \
            for (int jj = 0; jj < 6; jj++) {                                              \
                const T* a = h + 4 * jj * HP;                                             \
                T* d = dst + jj * VS;                                                     \
                _Pragma("omp simd")                                                       \
                for (int64_t q = 0; q < q1; q++)                                          \
                    wino4_bt_##S(a[q], a[HP + q], a[2 * HP + q], a[3 * HP + q], a[TW + q], \
                                 a[HP + TW + q], d + q, 6 * VS);                          \
            }                                                                             \
        }                                                                                 \
        r += R;                                                                           \
    }                                                                                     \
}                                                                                         \
                                                                                          \
/* m (36, O, NC) of tile rows [r0, r1) -> y (N, O, OH, OW) + bias, then the epilogue e    \
   on each output row as it is written: A^T m A, each tile's                              \
   4x4 outputs in place to positions 0-15 (one loop over the item's tiles), then row by   \
   row into y, rows and columns past the output's edge dropped (buf, the thread's scratch, \
   unused: wino_out's signature). Output channels [o0, o1). */                            \
static void wino4_out_##S(T* m, const T* bias, T* y, const conv_epi* e, T* buf,           \
                          const int64_t* wg, int64_t r0, int64_t r1, int64_t o0,          \
                          int64_t o1) {                                                   \
    W4GEOMETRY;                                                                           \
    int more = conv_epi_more_##S(e);                                                      \
    const T* res = more ? (const T*)e->r : NULL;                                          \
    (void)buf;                                                                            \
    int64_t full = OW / 4, cols = (r1 - r0) * TW;                                         \
    for (int64_t o = o0; o < o1; o++) {                                                   \
        T* mo = m + o * NC;                                                               \
        _Pragma("omp simd")                                                               \
        for (int64_t q = 0; q < cols; q++) {                                              \
            T s[4][6];                                                                    \
            for (int j = 0; j < 6; j++) {                                                 \
                T m0 = mo[j * MS + q], m1 = mo[(6 + j) * MS + q], m2 = mo[(12 + j) * MS + q]; \
                T m3 = mo[(18 + j) * MS + q], m4 = mo[(24 + j) * MS + q];                 \
                T m5 = mo[(30 + j) * MS + q];                                             \
                s[0][j] = m0 + (m1 + m2) + (m3 + m4);                                     \
                s[1][j] = (m1 - m2) + 2 * (m3 - m4);                                      \
                s[2][j] = (m1 + m2) + 4 * (m3 + m4);                                      \
                s[3][j] = (m1 - m2) + 8 * (m3 - m4) + m5;                                 \
            }                                                                             \
            for (int i = 0; i < 4; i++) {                                                 \
                T* d = mo + 4 * i * MS + q;                                               \
                d[0] = s[i][0] + (s[i][1] + s[i][2]) + (s[i][3] + s[i][4]);               \
                d[MS] = (s[i][1] - s[i][2]) + 2 * (s[i][3] - s[i][4]);                    \
                d[2 * MS] = (s[i][1] + s[i][2]) + 4 * (s[i][3] + s[i][4]);                \
                d[3 * MS] = (s[i][1] - s[i][2]) + 8 * (s[i][3] - s[i][4]) + s[i][5];      \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    for (int64_t r = r0; r < r1; r++) {                                                   \
        int64_t n = r / TH, th = r - n * TH;                                              \
        for (int64_t o = o0; o < o1; o++) {                                               \
            T bo = bias ? bias[o] : (T)0;                                                 \
            const T* z = m + o * NC + (r - r0) * TW;                                      \
            for (int64_t i = 0; i < 4 && 4 * th + i < OH; i++) {                          \
                T* yr = y + ((n * O + o) * OH + 4 * th + i) * OW;                         \
                const T* zi = z + 4 * i * MS;                                             \
                _Pragma("omp simd")                                                       \
                for (int64_t f = 0; f < full; f++) {                                      \
                    yr[4 * f] = zi[f] + bo;                                               \
                    yr[4 * f + 1] = zi[MS + f] + bo;                                      \
                    yr[4 * f + 2] = zi[2 * MS + f] + bo;                                  \
                    yr[4 * f + 3] = zi[3 * MS + f] + bo;                                  \
                }                                                                         \
                for (int64_t j = 0; j < OW - 4 * full; j++)                               \
                    yr[4 * full + j] = zi[j * MS + full] + bo;                            \
                if (more) conv_epi_row_##S(yr, yr, res ? res + (yr - y) : NULL, OW, 0, e); \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}                                                                                         \
                                                                                          \
/* A g of 4 points g0 .. g3 (a row or a column of an output-gradient tile) -> o[i * st],  \
   i < 6 */                                                                               \
static inline __attribute__((always_inline)) void wino4_ag_##S(T g0, T g1, T g2, T g3, T* o, \
                                                              int64_t st) {               \
    o[0] = g0;                                                                            \
    o[st] = (g0 + g2) + (g1 + g3);                                                        \
    o[2 * st] = (g0 + g2) - (g1 + g3);                                                    \
    o[3 * st] = (g0 + 4 * g2) + 2 * (g1 + 4 * g3);                                        \
    o[4 * st] = (g0 + 4 * g2) - 2 * (g1 + 4 * g3);                                        \
    o[5 * st] = g3;                                                                       \
}                                                                                         \
                                                                                          \
/* the output gradient's tiles of rows [r0, r1) -> z (36, O, NC): A g A^T of each 4x4 tile \
   g (zero past the output's edge), A = (A^T)^T: each row of a tile through A into h (6   \
   values a tile), then down the columns */                                               \
static void wino4_gz_##S(const T* gy, T* z, T* buf, const int64_t* wg, int64_t r0,        \
                         int64_t r1) {                                                    \
    W4GEOMETRY;                                                                           \
    T* lin = buf;                                                                         \
    T* h = buf + LW;                                                                      \
    memset(lin, 0, LW * sizeof(T));                                                       \
    for (int64_t r = r0; r < r1; r++) {                                                   \
        int64_t n = r / TH, th = r - n * TH;                                              \
        for (int64_t o = 0; o < O; o++) {                                                 \
            for (int a = 0; a < 4; a++) {                                                 \
                if (4 * th + a < OH)                                                      \
                    memcpy(lin, gy + ((n * O + o) * OH + 4 * th + a) * OW, OW * sizeof(T)); \
                else                                                                      \
                    memset(lin, 0, OW * sizeof(T));                                       \
                T* ha = h + 6 * a * TW;                                                   \
                _Pragma("omp simd")                                                       \
                for (int64_t f = 0; f < TW; f++)                                          \
                    wino4_ag_##S(lin[4 * f], lin[4 * f + 1], lin[4 * f + 2], lin[4 * f + 3], \
                                 ha + f, TW);                                             \
            }                                                                             \
            T* d = z + o * NC + (r - r0) * TW;                                            \
            for (int j = 0; j < 6; j++) {                                                 \
                const T* hj = h + j * TW;                                                 \
                T* dj = d + j * MS;                                                       \
                _Pragma("omp simd")                                                       \
                for (int64_t f = 0; f < TW; f++)                                          \
                    wino4_ag_##S(hj[f], hj[6 * TW + f], hj[12 * TW + f], hj[18 * TW + f], \
                                 dj + f, 6 * MS);                                         \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}
