/* Direct 2-d convolution (tessera/kernels/direct_conv.py): the header of each kernel's
   library. Python follows it with the vector typedefs of one dtype (v_S, and u_S for
   unaligned loads and stores) and COMMON(T, S), then the one kernel's macro call. The
   kernels' macros take T the element type, S its suffix (f32, f64), V and U the vector
   types, L the lanes of a vector, and the tile: OB output channels or CB input channels
   by NV vectors (FWD, IGRAD), OB channels by TB taps (WGRAD), OV vectors of output
   channels by TB taps (WGRADC). */
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

#define COMMON(T, S)                                                                      \
/* image x (C, H, W) -> xp (C, HP, WP), xp[c, r, j] = x[c, r - PH, j - PW] (zero outside  \
   x; negative paddings crop), then SL zeros (read by the last tiles, multiplied by zero  \
   gradients in the weight gradient: they must not be NaN) */                             \
static void pad_##S(const T* x, T* xp, const int64_t* d) {                                \
    DGEOMETRY;                                                                            \
    int64_t ja = PW > 0 ? PW : 0, jb = PW + W < WP ? PW + W : WP;                         \
    for (int64_t c = 0; c < C; c++)                                                       \
        for (int64_t r = 0; r < HP; r++) {                                                \
            T* dst = xp + (c * HP + r) * WP;                                              \
            int64_t ih = r - PH;                                                          \
            if (ih < 0 || ih >= H || ja >= jb) { memset(dst, 0, WP * sizeof(T)); continue; } \
            memset(dst, 0, ja * sizeof(T));                                               \
            memcpy(dst + ja, x + (c * H + ih) * W + ja - PW, (jb - ja) * sizeof(T));      \
            memset(dst + jb, 0, (WP - jb) * sizeof(T));                                   \
        }                                                                                 \
    memset(xp + C * HP * WP, 0, SL * sizeof(T));                                          \
}                                                                                         \
                                                                                          \
/* one image's output gradient g (O, OH, OW) -> gp (rows, QR) in the flat layout (row     \
   pitch WP): zero in the dropped columns, past OH * WP and in rows from O on */          \
static void flat_##S(const T* g, T* gp, int64_t rows, const int64_t* d) {                 \
    DGEOMETRY;                                                                            \
    for (int64_t o = 0; o < rows; o++) {                                                  \
        T* row = gp + o * QR;                                                             \
        if (o >= O) { memset(row, 0, QR * sizeof(T)); continue; }                         \
        for (int64_t oh = 0; oh < OH; oh++) {                                             \
            memcpy(row + oh * WP, g + (o * OH + oh) * OW, OW * sizeof(T));                \
            memset(row + oh * WP + OW, 0, (WP - OW) * sizeof(T));                         \
        }                                                                                 \
        memset(row + OH * WP, 0, (QR - OH * WP) * sizeof(T));                             \
    }                                                                                     \
}

#define FWD(T, S, V, U, L, OB, NV)                                                        \
/* yf (OB, QR) at q0 = sum over taps k of wb (CK, OB) [k] times the scratch at q0 + off[k]; \
   the loops over OB and NV unrolled, so that the tile stays in registers */              \
static inline void fwd_tile_##S##_##OB(const T* xs, const T* wb, const int64_t* off,      \
                                       int64_t CK, T* yf, int64_t QR) {                   \
    V acc[OB][NV];                                                                        \
    UNROLL for (int o = 0; o < OB; o++)                                                   \
        UNROLL for (int v = 0; v < NV; v++) acc[o][v] = (V){0};                           \
    for (int64_t k = 0; k < CK; k++) {                                                    \
        const T* p = xs + off[k];                                                         \
        V xv[NV];                                                                         \
        UNROLL for (int v = 0; v < NV; v++) xv[v] = *(const U*)(p + v * L);               \
        UNROLL for (int o = 0; o < OB; o++) {                                             \
            T wv = wb[k * OB + o];                                                        \
            UNROLL for (int v = 0; v < NV; v++) acc[o][v] += xv[v] * wv;                  \
        }                                                                                 \
    }                                                                                     \
    UNROLL for (int o = 0; o < OB; o++)                                                   \
        UNROLL for (int v = 0; v < NV; v++) *(U*)(yf + o * QR + v * L) = acc[o][v];       \
}                                                                                         \
                                                                                          \
/* y (N, O, OH, OW) = x (*) w + b, w (O, C, KH, KW); with FLIP, w (C, O, KH, KW) turned   \
   (the input gradient). One image an item, from the shared counter; thread t's scratch   \
   is work + t * ws: the padded image, the flat outputs yf and the filters packed         \
   (NB, CK, OB), zero past O */                                                           \
void tsr_dconv_fwd_##S##_##OB(const T* x, const T* w, const T* b, T* y, T* work,          \
                              int64_t ws, int64_t* next, const int64_t* d, int64_t t) {   \
    DGEOMETRY;                                                                            \
    T* xp = work + t * ws;                                                                \
    T* yf = xp + C * HP * WP + SL;                                                        \
    T* wp = yf + NB * OB * QR;                                                            \
    int64_t* off = offsets(d);                                                            \
    if (!off) return;                                                                     \
    for (int64_t o = 0; o < NB * OB; o++)                                                 \
        for (int64_t k = 0; k < CK; k++) {                                                \
            int64_t c = k / (KH * KW), r = k - c * KH * KW;                               \
            T v = o >= O ? (T)0 : FLIP ? w[(c * O + o) * KH * KW + KH * KW - 1 - r]       \
                                       : w[o * CK + k];                                   \
            wp[(o / OB * CK + k) * OB + o - o / OB * OB] = v;                             \
        }                                                                                 \
    for (;;) {                                                                            \
        int64_t n = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);                        \
        if (n >= N) break;                                                                \
        pad_##S(x + n * C * H * W, xp, d);                                                \
        for (int64_t q = 0; q < QR; q += NV * L)                                          \
            for (int64_t ob = 0; ob < NB; ob++)                                           \
                fwd_tile_##S##_##OB(xp + q, wp + ob * CK * OB, off, CK, yf + ob * OB * QR + q, \
                                    QR);                                                  \
        for (int64_t o = 0; o < O; o++) {                                                 \
            T bo = b ? b[o] : (T)0;                                                       \
            for (int64_t oh = 0; oh < OH; oh++) {                                         \
                T* dst = y + ((n * O + o) * OH + oh) * OW;                                \
                const T* src = yf + o * QR + oh * WP;                                     \
                _Pragma("omp simd")                                                       \
                for (int64_t ow = 0; ow < OW; ow++) dst[ow] = src[ow] + bo;               \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    free(off);                                                                            \
}

#define WGRAD(T, S, V, U, L, OB, TB)                                                      \
/* acc (OB, TB taps, L lanes; rows NK * L apart) += the lane-wise dot products of gradient \
   rows gp (OB, QR) with the scratch at off[j] */                                         \
static inline void wgrad_tile_##S##_##OB(const T* gp, const T* xp, const int64_t* off,    \
                                         int64_t QR, T* acc, int64_t NK) {                \
    V s[OB][TB];                                                                          \
    const T* xj[TB];                                                                      \
    UNROLL for (int j = 0; j < TB; j++) xj[j] = xp + off[j];                              \
    UNROLL for (int o = 0; o < OB; o++)                                                   \
        UNROLL for (int j = 0; j < TB; j++) s[o][j] = (V){0};                             \
    for (int64_t q = 0; q < QR; q += L) {                                                 \
        V gv[OB];                                                                         \
        UNROLL for (int o = 0; o < OB; o++) gv[o] = *(const U*)(gp + o * QR + q);         \
        UNROLL for (int j = 0; j < TB; j++) {                                             \
            V xv = *(const U*)(xj[j] + q);                                                \
            UNROLL for (int o = 0; o < OB; o++) s[o][j] += gv[o] * xv;                    \
        }                                                                                 \
    }                                                                                     \
    UNROLL for (int o = 0; o < OB; o++)                                                   \
        UNROLL for (int j = 0; j < TB; j++) *(U*)(acc + (o * NK + j) * L) += s[o][j];     \
}                                                                                         \
                                                                                          \
/* dw[j] (NB * OB, NK, L): the lane sums of the weight gradient over chunk j of the       \
   images (of NJ chunks), each image's sums added to its chunk's: chunks, not threads, own \
   the sums, so their order does not depend on thread timing, and a late thread only      \
   takes fewer chunks from the shared counter. Thread t's scratch: the padded image, then \
   the output gradient in the flat layout gp (NB * OB, QR) */                             \
void tsr_dconv_wgrad_##S##_##OB(const T* x, const T* gy, T* dw, T* work, int64_t ws,      \
                                int64_t NJ, int64_t* next, const int64_t* d, int64_t t) { \
    DGEOMETRY;                                                                            \
    T* xp = work + t * ws;                                                                \
    T* gp = xp + C * HP * WP + SL;                                                        \
    int64_t* off = offsets(d);                                                            \
    if (!off) return;                                                                     \
    for (;;) {                                                                            \
        int64_t j = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);                        \
        if (j >= NJ) break;                                                               \
        T* acc = dw + j * NB * OB * NK * L;                                               \
        memset(acc, 0, NB * OB * NK * L * sizeof(T));                                     \
        for (int64_t n = N * j / NJ; n < N * (j + 1) / NJ; n++) {                         \
            pad_##S(x + n * C * H * W, xp, d);                                            \
            flat_##S(gy + n * O * OH * OW, gp, NB * OB, d);                               \
            for (int64_t ob = 0; ob < NB; ob++)                                           \
                for (int64_t k = 0; k < NK; k += TB)                                      \
                    wgrad_tile_##S##_##OB(gp + ob * OB * QR, xp, off + k, QR,             \
                                          acc + (ob * OB * NK + k) * L, NK);              \
        }                                                                                 \
    }                                                                                     \
    free(off);                                                                            \
}

#define IGRAD(T, S, V, U, L, CB, NV)                                                      \
/* the CB padded input-gradient planes at dst (PS apart), from q0 on, += the sum over     \
   output channels o of wb (O, CB) [o] times the flat output gradient gp (O, QR) at q0 */ \
static inline void igrad_tile_##S##_##CB(const T* gp, const T* wb, int64_t O, int64_t QR, \
                                         T* dst, int64_t PS) {                            \
    V acc[CB][NV];                                                                        \
    UNROLL for (int c = 0; c < CB; c++)                                                   \
        UNROLL for (int v = 0; v < NV; v++) acc[c][v] = (V){0};                           \
    for (int64_t o = 0; o < O; o++) {                                                     \
        V gv[NV];                                                                         \
        UNROLL for (int v = 0; v < NV; v++) gv[v] = *(const U*)(gp + o * QR + v * L);     \
        UNROLL for (int c = 0; c < CB; c++) {                                             \
            T wv = wb[o * CB + c];                                                        \
            UNROLL for (int v = 0; v < NV; v++) acc[c][v] += gv[v] * wv;                  \
        }                                                                                 \
    }                                                                                     \
    UNROLL for (int c = 0; c < CB; c++)                                                   \
        UNROLL for (int v = 0; v < NV; v++) *(U*)(dst + c * PS + v * L) += acc[c][v];     \
}                                                                                         \
                                                                                          \
/* dx (N, C, H, W) = the input gradient of gy (N, O, OH, OW) for filters w (O, C, KH, KW), \
   scattered: each tap adds its products into the padded planes dxp (NB * CB, HP, WP) at  \
   its offset, then dx is cropped out of them. One image an item, from the shared counter; \
   thread t's scratch: dxp and its slack, the flat gradient gp (O, QR) and the filters    \
   packed (NB, KH * KW, O, CB), zero past C */                                            \
void tsr_dconv_igrad_##S##_##CB(const T* gy, const T* w, T* dx, T* work, int64_t ws,      \
                                int64_t* next, const int64_t* d, int64_t t) {             \
    DGEOMETRY;                                                                            \
    int64_t DH = d[17], DW = d[18], KK = KH * KW, PS = HP * WP;                           \
    T* dxp = work + t * ws;                                                               \
    T* gp = dxp + NB * CB * PS + SL;                                                      \
    T* wp = gp + O * QR;                                                                  \
    for (int64_t cb = 0; cb < NB * CB; cb++)                                              \
        for (int64_t k = 0; k < KK; k++)                                                  \
            for (int64_t o = 0; o < O; o++)                                               \
                wp[((cb / CB * KK + k) * O + o) * CB + cb - cb / CB * CB] =               \
                    cb < C ? w[(o * C + cb) * KK + k] : (T)0;                             \
    int64_t ja = PW < 0 ? -PW : 0, jb = WP - PW < W ? WP - PW : W;                        \
    for (;;) {                                                                            \
        int64_t n = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);                        \
        if (n >= N) break;                                                                \
        flat_##S(gy + n * O * OH * OW, gp, O, d);                                         \
        memset(dxp, 0, (NB * CB * PS + SL) * sizeof(T));                                  \
        for (int64_t q = 0; q < QR; q += NV * L)                                          \
            for (int64_t cb = 0; cb < NB; cb++)                                           \
                for (int64_t k = 0; k < KK; k++) {                                        \
                    int64_t kh = k / KW, kw = k - kh * KW;                                \
                    igrad_tile_##S##_##CB(gp + q, wp + (cb * KK + k) * O * CB, O, QR,     \
                                          dxp + cb * CB * PS + q + kh * DH * WP + kw * DW, \
                                          PS);                                            \
                }                                                                         \
        for (int64_t c = 0; c < C; c++)                                                   \
            for (int64_t ih = 0; ih < H; ih++) {                                          \
                T* dst = dx + ((n * C + c) * H + ih) * W;                                 \
                int64_t r = ih + PH;                                                      \
                if (r < 0 || r >= HP || ja >= jb) { memset(dst, 0, W * sizeof(T)); continue; } \
                memset(dst, 0, ja * sizeof(T));                                           \
                memcpy(dst + ja, dxp + (c * HP + r) * WP + ja + PW, (jb - ja) * sizeof(T)); \
                memset(dst + jb, 0, (W - jb) * sizeof(T));                                \
            }                                                                             \
    }                                                                                     \
}

#define WGRADC(T, S, V, U, L, OV, TB)                                                     \
/* acc (TB taps, rows OS apart; OV vectors of output channels) += the sums over one image's \
   outputs q = (oh, ow) of the transposed gradient gt (OH * OW, OS) times the scratch at  \
   oh * WP + ow + off[j] */                                                               \
static inline void wgradc_tile_##S##_##OV##_##TB(const T* gt, const T* xp, const int64_t* off, \
                                          const int64_t* d, int64_t OS, T* acc) {         \
    DGEOMETRY;                                                                            \
    V s[OV][TB];                                                                          \
    const T* xj[TB];                                                                      \
    UNROLL for (int j = 0; j < TB; j++) xj[j] = xp + off[j];                              \
    UNROLL for (int i = 0; i < OV; i++)                                                   \
        UNROLL for (int j = 0; j < TB; j++) s[i][j] = (V){0};                             \
    for (int64_t oh = 0; oh < OH; oh++)                                                   \
        for (int64_t ow = 0; ow < OW; ow++) {                                             \
            const T* gq = gt + (oh * OW + ow) * OS;                                       \
            int64_t p = oh * WP + ow;                                                     \
            V gv[OV];                                                                     \
            UNROLL for (int i = 0; i < OV; i++) gv[i] = *(const U*)(gq + i * L);          \
            UNROLL for (int j = 0; j < TB; j++) {                                         \
                T xs = xj[j][p];                                                          \
                UNROLL for (int i = 0; i < OV; i++) s[i][j] += gv[i] * xs;                \
            }                                                                             \
        }                                                                                 \
    UNROLL for (int i = 0; i < OV; i++)                                                   \
        UNROLL for (int j = 0; j < TB; j++) *(U*)(acc + j * OS + i * L) += s[i][j];       \
}                                                                                         \
                                                                                          \
/* dw[j] (NK, OS): as tsr_dconv_wgrad, vectors over output channels instead of outputs:   \
   each image's gradient transposed into gt (OH * OW, OS), OS its channels rounded up to  \
   blocks of OV vectors (zero past O); no dropped columns, no split loads, and a tile's   \
   loop runs over all the image's outputs */                                              \
void tsr_dconv_wgradc_##S##_##OV##_##TB(const T* x, const T* gy, T* dw, T* work,          \
                                        int64_t ws, int64_t NJ, int64_t* next,            \
                                        const int64_t* d, int64_t t) {                    \
    DGEOMETRY;                                                                            \
    int64_t OS = NB * OV * L;                                                             \
    T* xp = work + t * ws;                                                                \
    T* gt = xp + C * HP * WP + SL;                                                        \
    int64_t* off = offsets(d);                                                            \
    if (!off) return;                                                                     \
    for (;;) {                                                                            \
        int64_t j = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);                        \
        if (j >= NJ) break;                                                               \
        T* acc = dw + j * NK * OS;                                                        \
        memset(acc, 0, NK * OS * sizeof(T));                                              \
        for (int64_t n = N * j / NJ; n < N * (j + 1) / NJ; n++) {                         \
            pad_##S(x + n * C * H * W, xp, d);                                            \
            const T* g = gy + n * O * OH * OW;                                            \
            for (int64_t q = 0; q < OH * OW; q++)                                         \
                for (int64_t o = 0; o < OS; o++) gt[q * OS + o] = o < O ? g[o * OH * OW + q] : 0; \
            for (int64_t ob = 0; ob < NB; ob++)                                           \
                for (int64_t k = 0; k < NK; k += TB)                                      \
                    wgradc_tile_##S##_##OV##_##TB(gt + ob * OV * L, xp, off + k, d, OS,   \
                                           acc + k * OS + ob * OV * L);                   \
        }                                                                                 \
    }                                                                                     \
    free(off);                                                                            \
}
