/* Winograd F(2x2, 3x3) convolution (tessera/kernels/winograd.py), and the drivers it shares
   with F(4x4) (winograd4.h). Included by conv.h, whose blasint, ROW/NT, conv_wait and
   gemm_<S> typedefs it uses. */

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

/* The drivers of F(2x2) and F(4x4) alike: WINO_FWD, WINO_WIDE and WINO_WGRAD (T, S, V,
   GEOM, NP) define tsr_conv_V_fwd_S, tsr_conv_V_wide_S and tsr_conv_V_wgrad_S over the
   transforms V_weight_S, V_in_S, V_out_S and V_gz_S (WINOGRAD(T, S) or WINOGRAD4(T, S)
   before them), geometry GEOM (which gives TC, a tile row's columns in v and m: F(2x2)
   keeps a spare one) and NP tile positions (conv.py's _definitions).
   WINO_WEIGHT(T, S, V, GEOM) defines the filter transform V_weight_S over V_gkg_S, one
   filter's G k G^T. */

/* U (NP, O, C), positions US apart, = G k G^T of output channel o's filters k (O, C, 3, 3);
   with FLIP, of the filters of w (C, O, 3, 3) turned 180 degrees (the input gradient).
   Gathered 64 channels at a time into k (9, 64), so that the transform (V_gkg) runs
   across channels in vector lanes. */
#define WINO_WEIGHT(T, S, V, GEOM)                                                        \
static void V##_weight_##S(const T* w, T* u, const int64_t* wg, int64_t o) {              \
    GEOM;                                                                                 \
    for (int64_t c0 = 0; c0 < C; c0 += 64) {                                              \
        int64_t nc = C - c0 < 64 ? C - c0 : 64;                                           \
        T k[9][64];                                                                       \
        for (int64_t c = 0; c < nc; c++) {                                                \
            const T* f = w + (FLIP ? (c0 + c) * O + o : o * C + c0 + c) * 9;              \
            for (int i = 0; i < 9; i++) k[i][c] = f[FLIP ? 8 - i : i];                    \
        }                                                                                 \
        T* dst = u + o * C + c0;                                                          \
        _Pragma("omp simd")                                                               \
        for (int64_t c = 0; c < nc; c++) V##_gkg_##S(k, c, dst + c, US);                  \
    }                                                                                     \
}

/* y = w (*) x + b through the transformed filters u (NP, O, C). First u (items from
   next[2]: output channels, next[3] counting them done), then blocks of RB tile rows of
   the batch (items from next[0]), each waiting for all of u after its input transform;
   thread t's workspace work + t * ws holds the zeroed scratch of the transforms (WROWS),
   then v (NP, C, NC) and m (NP, O, NC), positions VS and MS apart. */
#define WINO_FWD(T, S, V, GEOM, NP)                                                       \
void tsr_conv_##V##_fwd_##S(const T* x, const T* w, T* u, const T* b, T* y,               \
                            const conv_epi* e, T* work, int64_t ws, int64_t* next,        \
                            const int64_t* wg, void* gemm, int64_t t, int64_t t1) {       \
    GEOM;                                                                                 \
    (void)t1;                                                                             \
    T* rows = work + t * ws;                                                              \
    T* v = rows + WROWS;                                                                  \
    T* m = v + NP * VS;                                                                   \
    memset(rows, 0, WROWS * sizeof(T));                                                   \
    for (;;) {                                                                            \
        int64_t o = __atomic_fetch_add(next + 2, 1, __ATOMIC_RELAXED);                    \
        if (o >= O) break;                                                                \
        V##_weight_##S(w, u, wg, o);                                                      \
        __atomic_fetch_add(next + 3, 1, __ATOMIC_RELEASE);                                \
    }                                                                                     \
    int64_t items = (N * TH + RB - 1) / RB;                                               \
    for (;;) {                                                                            \
        int64_t it = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);                       \
        if (it >= items) break;                                                           \
        int64_t r0 = it * RB, r1 = r0 + RB < N * TH ? r0 + RB : N * TH;                   \
        int64_t cols = (r1 - r0) * TC;                                                    \
        V##_in_##S(x, v, rows, wg, r0, r1, 0, C);                                         \
        conv_wait(next + 3, O);                                                           \
        for (int p = 0; p < NP; p++)                                                      \
            ((gemm_##S)gemm)(ROW, NT, NT, O, cols, C, 1, u + p * US, C, v + p * VS, NC,   \
                             0, m + p * MS, NC);                                          \
        V##_out_##S(m, b, y, e, rows, wg, r0, r1, 0, O);                                  \
    }                                                                                     \
}

/* The wide forward, for few tiles (batch-1 layers), where items of tile rows would make
   skinny GEMMs that each read all of u: the whole batch is one block (RB = N TH) whose v
   and m (positions VS and MS apart) all threads share, in three passes: u = the filter
   transform and v = the input transform (items: output channels' filters, then input
   channels; neither needs the other), the NP GEMMs m[p] (O, NC) = u[p] (O, C) @ v[p]
   (C, NC) (items: positions), the output transform into y plus the bias (items: output
   channels). next[0], next[2] and next[4] hand out the items of passes 1-3, next[1] and
   next[3] count those of passes 1 and 2 done; thread t's scratch (passes 1 and 3) at
   work + t * ws. */
#define WINO_WIDE(T, S, V, GEOM, NP)                                                      \
void tsr_conv_##V##_wide_##S(const T* x, const T* w, T* u, T* v, T* m, const T* b, T* y,  \
                             const conv_epi* e, T* work, int64_t ws, int64_t* next,       \
                             const int64_t* wg, void* gemm, int64_t t, int64_t t1) {      \
    GEOM;                                                                                 \
    (void)t1;                                                                             \
    T* rows = work + t * ws;                                                              \
    memset(rows, 0, WROWS * sizeof(T));                                                   \
    for (;;) {                                                                            \
        int64_t it = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);                       \
        if (it >= O + C) break;                                                           \
        if (it < O) V##_weight_##S(w, u, wg, it);                                         \
        else V##_in_##S(x, v, rows, wg, 0, N * TH, it - O, it - O + 1);                   \
        __atomic_fetch_add(next + 1, 1, __ATOMIC_RELEASE);                                \
    }                                                                                     \
    conv_wait(next + 1, O + C);                                                           \
    for (;;) {                                                                            \
        int64_t p = __atomic_fetch_add(next + 2, 1, __ATOMIC_RELAXED);                    \
        if (p >= NP) break;                                                               \
        ((gemm_##S)gemm)(ROW, NT, NT, O, NC, C, 1, u + p * US, C, v + p * VS, NC, 0,      \
                         m + p * MS, NC);                                                 \
        __atomic_fetch_add(next + 3, 1, __ATOMIC_RELEASE);                                \
    }                                                                                     \
    conv_wait(next + 3, NP);                                                              \
    for (;;) {                                                                            \
        int64_t o = __atomic_fetch_add(next + 4, 1, __ATOMIC_RELAXED);                    \
        if (o >= O) break;                                                                \
        V##_out_##S(m, b, y, e, rows, wg, 0, N * TH, o, o + 1);                           \
    }                                                                                     \
}

/* s[t] (NP, O, C), positions US apart, = the sum over thread t's items of
   z[p] (O, NC) @ v[p]^T (NC, C): the weight gradient before its filter transform
   G^T s G. Thread t of nt takes a fixed run of items, so that the sum's order (and the
   result) does not depend on which thread ran first; v's spare columns, where a tile row
   has one, are zeroed (z's are zero too, and garbage times zero could still be a NaN). */
#define WINO_WGRAD(T, S, V, GEOM, NP)                                                     \
void tsr_conv_##V##_wgrad_##S(const T* x, const T* gy, T* s, T* work, int64_t ws,         \
                              int64_t* next, const int64_t* wg, void* gemm, int64_t t,    \
                              int64_t nt) {                                               \
    GEOM;                                                                                 \
    (void)next;                                                                           \
    T* rows = work + t * ws;                                                              \
    T* v = rows + WROWS;                                                                  \
    T* z = v + NP * VS;                                                                   \
    T* acc = s + t * NP * US;                                                             \
    memset(rows, 0, WROWS * sizeof(T));                                                   \
    int64_t items = (N * TH + RB - 1) / RB;                                               \
    T beta = 0;                                                                           \
    for (int64_t it = items * t / nt; it < items * (t + 1) / nt; it++) {                  \
        int64_t r0 = it * RB, r1 = r0 + RB < N * TH ? r0 + RB : N * TH;                   \
        int64_t cols = (r1 - r0) * TC;                                                    \
        V##_in_##S(x, v, rows, wg, r0, r1, 0, C);                                         \
        for (int p = 0; p < NP && TC > TW; p++)                                           \
            for (int64_t c = 0; c < C; c++)                                               \
                for (int64_t i = TW; i < cols; i += TC) v[p * VS + c * NC + i] = (T)0;    \
        V##_gz_##S(gy, z, rows, wg, r0, r1);                                              \
        for (int p = 0; p < NP; p++)                                                      \
            ((gemm_##S)gemm)(ROW, NT, TR, O, C, cols, 1, z + p * MS, NC, v + p * VS, NC,  \
                             beta, acc + p * US, C);                                      \
        beta = 1;                                                                         \
    }                                                                                     \
    if (beta == 0)                                                                        \
        for (int p = 0; p < NP; p++) memset(acc + p * US, 0, O * C * sizeof(T));          \
}

/* the F(2x2) transforms and the filter transform, instantiated per dtype after
   GEMM_TYPE(T, S) (conv.py's _definitions) */
#define WINOGRAD(T, S)                                                                    \
/* G k G^T of filter c of the gathered k (9, 64) -> d[p * US], p = 0..15 */               \
static inline __attribute__((always_inline)) void wino_gkg_##S(T k[9][64], int64_t c, T* d, \
                                                              int64_t US) {               \
    const T h = (T)0.5;                                                                   \
    T a[4][3];                                                                            \
    for (int j = 0; j < 3; j++) {                                                         \
        a[0][j] = k[j][c];                                                                \
        a[1][j] = h * (k[j][c] + k[3 + j][c] + k[6 + j][c]);                              \
        a[2][j] = h * (k[j][c] - k[3 + j][c] + k[6 + j][c]);                              \
        a[3][j] = k[6 + j][c];                                                            \
    }                                                                                     \
    for (int i = 0; i < 4; i++) {                                                         \
        d[(4 * i + 0) * US] = a[i][0];                                                    \
        d[(4 * i + 1) * US] = h * (a[i][0] + a[i][1] + a[i][2]);                          \
        d[(4 * i + 2) * US] = h * (a[i][0] - a[i][1] + a[i][2]);                          \
        d[(4 * i + 3) * US] = a[i][2];                                                    \
    }                                                                                     \
}                                                                                         \
                                                                                          \
WINO_WEIGHT(T, S, wino, WGEOMETRY)                                                        \
                                                                                          \
/* the tile rows [r0, r1) of the batch (row r: image r / TH, tile row r % TH) -> v (16, C, \
   NC): B^T d B of each 4x4 input tile d, tile tw of the block's row i at column          \
   i * (TW + 1) + tw (the column after each row's last tile is a spare, computed and not  \
   used: so that each pass below is one long unit-stride loop over a channel's rows).     \
   Per (image, channel): the input rows copied into zero-padded planes pe (even rows) and \
   po (odd rows), L = 2 (TW + 1) columns each; the column transform d -> B^T d split into \
   its even and odd columns e and q (4 each); then the row transform, tile f reading      \
   columns f and f + 1 of e and q. Channels [c0, c1) only. */                             \
static void wino_in_##S(const T* x, T* v, T* pe, const int64_t* wg, int64_t r0,           \
                        int64_t r1, int64_t c0, int64_t c1) {                             \
    WGEOMETRY;                                                                            \
    T* po = pe + (RB + 2) * L;                                                            \
    T* e = po + (RB + 2) * L;                                                             \
    T* q = e + 4 * EQ;                                                                    \
    int64_t ja = PW < L ? PW : L, jb = PW + W < L ? PW + W : L;                           \
    for (int64_t r = r0; r < r1;) {                                                       \
        int64_t n = r / TH, th0 = r - n * TH;                                             \
        int64_t R = th0 + (r1 - r) < TH ? r1 - r : TH - th0, F = R * (TW + 1);            \
        for (int64_t c = c0; c < c1; c++) {                                               \
            for (int64_t k = 0; k < 2 * R + 2 && ja < jb; k++) {                          \
                int64_t ih = 2 * th0 - PH + k;                                            \
                T* dst = (k & 1 ? po : pe) + (k >> 1) * L + ja;                           \
                if (ih >= 0 && ih < H)                                                    \
                    memcpy(dst, x + ((n * C + c) * H + ih) * W + ja - PW,                 \
                           (jb - ja) * sizeof(T));                                        \
                else                                                                      \
                    memset(dst, 0, (jb - ja) * sizeof(T));                                \
            }                                                                             \
            _Pragma("omp simd")                                                           \
            for (int64_t f = 0; f <= F; f++) {                                            \
                T a0 = pe[2 * f], a1 = po[2 * f], a2 = pe[2 * f + L], a3 = po[2 * f + L]; \
                T b0 = pe[2 * f + 1], b1 = po[2 * f + 1], b2 = pe[2 * f + 1 + L];         \
                T b3 = po[2 * f + 1 + L];                                                 \
                e[f] = a0 - a2;          q[f] = b0 - b2;                                  \
                e[EQ + f] = a1 + a2;     q[EQ + f] = b1 + b2;                             \
                e[2 * EQ + f] = a2 - a1; q[2 * EQ + f] = b2 - b1;                         \
                e[3 * EQ + f] = a1 - a3; q[3 * EQ + f] = b1 - b3;                         \
            }                                                                             \
            T* dst = v + c * NC + (r - r0) * (TW + 1);                                    \
            for (int i = 0; i < 4; i++) {                                                 \
                const T* ei = e + i * EQ;                                                 \
                const T* qi = q + i * EQ;                                                 \
                T* di = dst + 4 * i * VS;                                                 \
                _Pragma("omp simd")                                                       \
                for (int64_t f = 0; f < F; f++) {                                         \
                    di[f] = ei[f] - ei[f + 1];                                            \
                    di[VS + f] = qi[f] + ei[f + 1];                                       \
                    di[2 * VS + f] = ei[f + 1] - qi[f];                                   \
                    di[3 * VS + f] = qi[f] - qi[f + 1];                                   \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
        r += R;                                                                           \
    }                                                                                     \
}                                                                                         \
                                                                                          \
/* m (16, O, NC) of tile rows [r0, r1) -> y (N, O, OH, OW) + bias, then the epilogue e    \
   on each output row as it is written: A^T m A. First each                               \
   channel's row of m at once (one long vector loop), each tile's 2x2 outputs going in    \
   place to positions 0-3; then row by row into y. The second row of a tile on an odd last \
   row goes to the spare row at the end of the thread's scratch buf, the second column of \
   one on an odd last column is not written. Output channels [o0, o1) only. */            \
static void wino_out_##S(T* m, const T* bias, T* y, const conv_epi* e, T* buf,            \
                         const int64_t* wg, int64_t r0, int64_t r1, int64_t o0,           \
                         int64_t o1) {                                                    \
    WGEOMETRY;                                                                            \
    int more = conv_epi_more_##S(e);                                                      \
    const T* res = more ? (const T*)e->r : NULL;                                          \
    T* spare = buf + WROWS - (OW + 1);                                                    \
    int64_t full = OW / 2, cols = (r1 - r0) * (TW + 1);                                   \
    for (int64_t o = o0; o < o1; o++) {                                                   \
        T* mo = m + o * NC;                                                               \
        _Pragma("omp simd")                                                               \
        for (int64_t i = 0; i < cols; i++) {                                              \
            T a0[4], a1[4];                                                               \
            for (int j = 0; j < 4; j++) {                                                 \
                a0[j] = mo[j * MS + i] + mo[(4 + j) * MS + i] + mo[(8 + j) * MS + i];     \
                a1[j] = mo[(4 + j) * MS + i] - mo[(8 + j) * MS + i] - mo[(12 + j) * MS + i]; \
            }                                                                             \
            mo[i] = a0[0] + a0[1] + a0[2];                                                \
            mo[MS + i] = a0[1] - a0[2] - a0[3];                                           \
            mo[2 * MS + i] = a1[0] + a1[1] + a1[2];                                       \
            mo[3 * MS + i] = a1[1] - a1[2] - a1[3];                                       \
        }                                                                                 \
    }                                                                                     \
    for (int64_t r = r0; r < r1; r++) {                                                   \
        int64_t n = r / TH, th = r - n * TH;                                              \
        for (int64_t o = o0; o < o1; o++) {                                               \
            T bo = bias ? bias[o] : (T)0;                                                 \
            const T* z = m + o * NC + (r - r0) * (TW + 1);                                \
            T* y0 = y + ((n * O + o) * OH + 2 * th) * OW;                                 \
            T* y1 = 2 * th + 1 < OH ? y0 + OW : spare;                                    \
            _Pragma("omp simd")                                                           \
            for (int64_t tw = 0; tw < full; tw++) {                                       \
                y0[2 * tw] = z[tw] + bo;                                                  \
                y0[2 * tw + 1] = z[MS + tw] + bo;                                         \
                y1[2 * tw] = z[2 * MS + tw] + bo;                                         \
                y1[2 * tw + 1] = z[3 * MS + tw] + bo;                                     \
            }                                                                             \
            if (full < TW) {                                                              \
                y0[2 * full] = z[full] + bo;                                              \
                y1[2 * full] = z[2 * MS + full] + bo;                                     \
            }                                                                             \
            if (!more) continue;                                                          \
            conv_epi_row_##S(y0, y0, res ? res + (y0 - y) : NULL, OW, 0, e);              \
            if (y1 != spare) conv_epi_row_##S(y1, y1, res ? res + (y1 - y) : NULL, OW, 0, e); \
        }                                                                                 \
    }                                                                                     \
}                                                                                         \
                                                                                          \
/* one output-gradient tile (a b; c e) -> d[p * MS], p = 0..15: A g A^T */                \
static inline __attribute__((always_inline)) void wino_tile_gz_##S(T a, T b, T c, T e, T* d, \
                                                                   int64_t MS) {          \
    T u[4] = {a, a + b, a - b, -b}, w[4] = {c, c + e, c - e, -e};                         \
    for (int j = 0; j < 4; j++) {                                                         \
        d[j * MS] = u[j];                                                                 \
        d[(4 + j) * MS] = u[j] + w[j];                                                    \
        d[(8 + j) * MS] = u[j] - w[j];                                                    \
        d[(12 + j) * MS] = -w[j];                                                         \
    }                                                                                     \
}                                                                                         \
                                                                                          \
/* the output gradient's tiles of rows [r0, r1) -> z (16, O, NC): A g A^T of each 2x2 tile \
   g (zero past the last row and column; rows past it read the zero row at the end of the \
   thread's zeroed scratch buf), each row's spare column zero */                          \
static void wino_gz_##S(const T* gy, T* z, const T* buf, const int64_t* wg, int64_t r0,   \
                        int64_t r1) {                                                     \
    WGEOMETRY;                                                                            \
    const T* zero = buf + WROWS - (OW + 1);                                               \
    int64_t full = OW / 2;                                                                \
    for (int64_t r = r0; r < r1; r++) {                                                   \
        int64_t n = r / TH, th = r - n * TH;                                              \
        for (int64_t o = 0; o < O; o++) {                                                 \
            const T* g0 = gy + ((n * O + o) * OH + 2 * th) * OW;                          \
            const T* g1 = 2 * th + 1 < OH ? g0 + OW : zero;                               \
            T* d = z + o * NC + (r - r0) * (TW + 1);                                      \
            _Pragma("omp simd")                                                           \
            for (int64_t tw = 0; tw < full; tw++)                                         \
                wino_tile_gz_##S(g0[2 * tw], g0[2 * tw + 1], g1[2 * tw], g1[2 * tw + 1],  \
                                 d + tw, MS);                                             \
            if (full < TW) wino_tile_gz_##S(g0[2 * full], 0, g1[2 * full], 0, d + full, MS); \
            for (int p = 0; p < 16; p++) d[p * MS + TW] = (T)0;                           \
        }                                                                                 \
    }                                                                                     \
}
