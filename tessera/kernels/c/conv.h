/* The threaded convolution drivers (tessera/kernels/conv.py): the header of each driver
   library, after which Python instantiates one family of drivers for one dtype (T, S):
   GEMM_TYPE, then IM2COL_BLOCK, COL2IM and DRIVERS (the im2col drivers), or WINOGRAD and
   the WINO_ drivers (F(2x2)), or WINOGRAD4 and the WINO_ drivers (F(4x4)). -DTSR_BLASINT
   is the CBLAS integer: int, or int64_t for an ILP64 OpenBLAS. */
#include <sched.h>
#include <stdint.h>
#include <string.h>
typedef TSR_BLASINT blasint;
enum { ROW = 101, NT = 111, TR = 112 };

#include "window.h"

/* the geometry g[]: C H W O KH KW SH SW PH PW DH DW OH OW N RB G OB SHARED */
#define GEOMETRY                                                                          \
    int64_t C = g[0], H = g[1], W = g[2], O = g[3], KH = g[4], KW = g[5], SH = g[6],      \
            SW = g[7], PH = g[8], PW = g[9], DH = g[10], DW = g[11], OH = g[12],          \
            OW = g[13], N = g[14], RB = g[15], G = g[16], OB = g[17], SHARED = g[18];     \
    int64_t CK = C * KH * KW, P = OH * OW;                                                \
    int direct = KH == 1 && KW == 1 && SH == 1 && SW == 1 && PH == 0 && PW == 0;          \
    (void)N; (void)RB; (void)G; (void)OB; (void)direct; (void)O; (void)P; (void)SHARED

/* wait until *done reaches total: the passes of one call of a driver (here and in the
   Winograd ones) meet here rather than at the pool's barrier (on a busy host, waking a
   blocked thread takes far longer than a yielding one takes to see the count); every item
   is taken by a running thread, so the count gets there however many threads started */
static inline void conv_wait(int64_t* done, int64_t total) {
    while (__atomic_load_n(done, __ATOMIC_ACQUIRE) < total) sched_yield();
}

/* A forward convolution's epilogue, applied to each item's output while it is in cache:
   y = act(y + b [+ r]) [+ r], the residual r (N, O, OH, OW, as y) inside the activation
   when first, else after it; act is one of gemm.h's TSR_ACT_ codes that the C here
   knows: 0 none, 1 relu, 4 clamp to [lo, hi]. egemm: for float32, tessera's GEMM with that
   epilogue fused (conv_gemm.c's tsr_conv_sgemm_epi), else NULL: the plain GEMM, then the
   loops below. A NULL epilogue: the bias only. */
typedef struct conv_epi {
    const void* r;
    void* egemm;
    int64_t act, first;
    double lo, hi;
} conv_epi;

/* the CBLAS GEMM's type, and the epilogue's loops, in every translation unit of the
   library. egemm_S: C (m x n, rows ldc apart) = A (rows lda apart) @ B (rows ldb apart),
   then the epilogue with bias[i] on row i, r's rows ldr apart; 0, or non-zero when it did
   nothing (no scratch memory) */
#define GEMM_TYPE(T, S)                                                                   \
typedef void (*gemm_##S)(int, int, int, blasint, blasint, blasint, T, const T*, blasint,  \
                         const T*, blasint, T, T*, blasint);                              \
typedef int (*egemm_##S)(int64_t, int64_t, int64_t, const T*, int64_t, const T*, int64_t, \
                         T*, int64_t, const T*, const T*, int64_t, int64_t, int64_t, float, \
                         float);                                                          \
                                                                                          \
/* d[q] = act(s[q] + bo [+ r[q]]) [+ r[q]], q < m (d may be s); NaN passes the act */    \
static inline void conv_epi_row_##S(T* d, const T* s, const T* r, int64_t m, T bo,        \
                                    const conv_epi* e) {                                  \
    int act = e ? (int)e->act : 0, first = e && e->first;                                 \
    T lo = e ? (T)e->lo : 0, hi = e ? (T)e->hi : 0;                                       \
    if (!r) {                                                                             \
        if (act == 1) { _Pragma("omp simd") for (int64_t q = 0; q < m; q++) {            \
            T v = s[q] + bo; d[q] = v < 0 ? 0 : v; } }                                    \
        else if (act == 4) { _Pragma("omp simd") for (int64_t q = 0; q < m; q++) {       \
            T v = s[q] + bo; d[q] = v < lo ? lo : v > hi ? hi : v; } }                    \
        else { _Pragma("omp simd") for (int64_t q = 0; q < m; q++) d[q] = s[q] + bo; }   \
    } else if (first) {                                                                   \
        if (act == 1) { _Pragma("omp simd") for (int64_t q = 0; q < m; q++) {            \
            T v = s[q] + bo + r[q]; d[q] = v < 0 ? 0 : v; } }                             \
        else if (act == 4) { _Pragma("omp simd") for (int64_t q = 0; q < m; q++) {       \
            T v = s[q] + bo + r[q]; d[q] = v < lo ? lo : v > hi ? hi : v; } }             \
        else { _Pragma("omp simd") for (int64_t q = 0; q < m; q++) d[q] = s[q] + bo + r[q]; } \
    } else {                                                                              \
        if (act == 1) { _Pragma("omp simd") for (int64_t q = 0; q < m; q++) {            \
            T v = s[q] + bo; d[q] = (v < 0 ? 0 : v) + r[q]; } }                           \
        else if (act == 4) { _Pragma("omp simd") for (int64_t q = 0; q < m; q++) {       \
            T v = s[q] + bo; d[q] = (v < lo ? lo : v > hi ? hi : v) + r[q]; } }           \
        else { _Pragma("omp simd") for (int64_t q = 0; q < m; q++) d[q] = s[q] + bo + r[q]; } \
    }                                                                                     \
}                                                                                         \
                                                                                          \
/* whether the epilogue does more than add the bias */                                    \
static inline int conv_epi_more_##S(const conv_epi* e) { return e && (e->r || e->act); }  \
                                                                                          \
/* output channels [o0, o1) of yo (rows P apart, m columns each; r at yo's offset in y, or \
   NULL) = their GEMM, w[o0:o1] (rows CK apart) @ src (rows ld apart), then bias b[o] and  \
   the epilogue: fused into tessera's GEMM where given, else after the plain one */        \
static void conv_product_##S(const T* w, const T* src, blasint ld, T* yo, const T* b,     \
                             const T* r, int64_t o0, int64_t o1, int64_t m, int64_t CK,   \
                             int64_t P, void* gemm, const conv_epi* e) {                  \
    if (e && e->egemm && ((egemm_##S)e->egemm)(o1 - o0, m, CK, w + o0 * CK, CK, src, ld,  \
                                                yo, P, b ? b + o0 : NULL, r, P, e->act,    \
                                                e->first, (float)e->lo, (float)e->hi) == 0) \
        return;                                                                           \
    ((gemm_##S)gemm)(ROW, NT, NT, o1 - o0, m, CK, 1, w + o0 * CK, CK, src, ld, 0, yo, P);  \
    if (!b && !conv_epi_more_##S(e)) return;                                              \
    for (int64_t o = o0; o < o1; o++)                                                     \
        conv_epi_row_##S(yo + (o - o0) * P, yo + (o - o0) * P, r ? r + (o - o0) * P : NULL, \
                         m, b ? b[o] : (T)0, e);                                          \
}

#define DRIVERS(T, S)                                                                     \
/* output rows [r0, r1) of image x (C, H, W) -> cols (CK, (r1-r0)*OW), rows LD apart */   \
static void im2col_##S(const T* x, T* cols, const int64_t* g, int64_t r0, int64_t r1,     \
                       int64_t LD) {                                                      \
    GEOMETRY;                                                                             \
    im2col_block_##S(x, cols, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OW, LD, 0, CK, r0, r1); \
}                                                                                         \
                                                                                          \
/* dx (C, H, W) = the sum of each element's window entries in cols (CK, P) */             \
static void col2im_##S(const T* cols, T* dx, const int64_t* g) {                          \
    GEOMETRY;                                                                             \
    col2im_plane_##S(cols, dx, C, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW, P, 0, C); \
}                                                                                         \
                                                                                          \
/* y = w (*) x + b (then the epilogue e) with the columns of all N images built once, in work, shared by the   \
   threads (fewer images than threads, too few rows for row blocks of their own: each     \
   thread building all the columns it multiplies spent an im2col a thread): items of      \
   SHARED rows of the columns, then of OB output channels by RB output rows of an image */ \
static void conv_fwd_shared_##S(const T* x, const T* w, const T* b, T* y,                 \
                                const conv_epi* e, T* work, int64_t* next,                \
                                const int64_t* g, void* gemm) {                           \
    GEOMETRY;                                                                             \
    int64_t chunks = (CK + SHARED - 1) / SHARED, nob = (O + OB - 1) / OB;                 \
    int64_t nrb = (OH + RB - 1) / RB;                                                     \
    for (int64_t it; !direct && (it = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED))      \
                                    < N * chunks;) {                                      \
        int64_t n = it / chunks, lo = it % chunks * SHARED;                              \
        im2col_block_##S(x + n * C * H * W, work + n * CK * P, H, W, KH, KW, SH, SW, PH,   \
                         PW, DH, DW, OW, P, lo, lo + SHARED < CK ? lo + SHARED : CK, 0, OH); \
        __atomic_fetch_add(next + 1, 1, __ATOMIC_RELEASE);                                \
    }                                                                                     \
    if (!direct) conv_wait(next + 1, N * chunks);                                         \
    for (;;) {                                                                            \
        int64_t it = __atomic_fetch_add(next + 2, 1, __ATOMIC_RELAXED);                   \
        if (it >= N * nob * nrb) break;                                                   \
        int64_t n = it / (nob * nrb), o0 = it / nrb % nob * OB, r0 = it % nrb * RB;      \
        int64_t o1 = o0 + OB < O ? o0 + OB : O, m = ((r0 + RB < OH ? r0 + RB : OH) - r0) * OW; \
        const T* src = (direct ? x + n * C * H * W : work + n * CK * P) + r0 * OW;        \
        T* yo = y + (n * O + o0) * P + r0 * OW;                                           \
        const T* r = e && e->r ? (const T*)e->r + (yo - y) : NULL;                        \
        conv_product_##S(w, src, P, yo, b, r, o0, o1, m, CK, P, gemm, e);                 \
    }                                                                                     \
}                                                                                         \
                                                                                          \
/* y = w (*) x + b. Items: G images side by side (when G > 1, through a buffer after     \
   the columns), or OB output channels of RB output rows of one image (a thread keeps     \
   the columns it has for the next item); thread t's buffer is work + t * ws. */          \
void tsr_conv_fwd_##S(const T* x, const T* w, const T* b, T* y, const conv_epi* e,        \
                      T* work, int64_t ws, int64_t* next, const int64_t* g, void* gemm,   \
                      int64_t t, int64_t t1) {                                            \
    GEOMETRY;                                                                             \
    (void)t1;                                                                             \
    int64_t nblk = (OH + RB - 1) / RB, nob = (O + OB - 1) / OB, have = -1;                \
    int64_t items = G > 1 ? (N + G - 1) / G : N * nblk * nob;                             \
    T* cols = work + t * ws;                                                              \
    if (SHARED) {                                                                         \
        conv_fwd_shared_##S(x, w, b, y, e, work, next, g, gemm);                          \
        return;                                                                           \
    }                                                                                     \
    for (;;) {                                                                            \
        int64_t it = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);                       \
        if (it >= items) break;                                                           \
        if (G > 1) {                                                                      \
            int64_t n0 = it * G, k = N - n0 < G ? N - n0 : G, m = k * P;                  \
            T* out = cols + CK * m;                                                       \
            for (int64_t j = 0; j < k; j++)                                               \
                im2col_##S(x + (n0 + j) * C * H * W, cols + j * P, g, 0, OH, m);          \
            ((gemm_##S)gemm)(ROW, NT, NT, O, m, CK, 1, w, CK, cols, m, 0, out, m);        \
            for (int64_t j = 0; j < k; j++)                                               \
                for (int64_t o = 0; o < O; o++) {                                         \
                    T* dst = y + ((n0 + j) * O + o) * P;                                  \
                    const T* r = e && e->r ? (const T*)e->r + (dst - y) : NULL;           \
                    conv_epi_row_##S(dst, out + o * m + j * P, r, P, b ? b[o] : (T)0, e); \
                }                                                                         \
            continue;                                                                     \
        }                                                                                 \
        int64_t blk = it / nob, o0 = it % nob * OB, o1 = o0 + OB < O ? o0 + OB : O;      \
        int64_t n = blk / nblk, r0 = blk % nblk * RB, r1 = r0 + RB < OH ? r0 + RB : OH;  \
        int64_t m = (r1 - r0) * OW;                                                       \
        T* yo = y + n * O * P + r0 * OW + o0 * P;                                         \
        const T* src = x + n * C * H * W + r0 * OW;                                       \
        blasint ld = P;                                                                   \
        if (!direct) {                                                                    \
            if (have != blk) im2col_##S(x + n * C * H * W, cols, g, r0, r1, m);           \
            have = blk; src = cols; ld = m;                                               \
        }                                                                                 \
        const T* r = e && e->r ? (const T*)e->r + (yo - y) : NULL;                        \
        conv_product_##S(w, src, ld, yo, b, r, o0, o1, m, CK, P, gemm, e);                \
    }                                                                                     \
}                                                                                         \
                                                                                          \
/* dx = the input gradient of gy (N, O, P); one image an item */                          \
void tsr_conv_igrad_##S(const T* gy, const T* w, T* dx, T* work, int64_t ws,              \
                        int64_t* next, const int64_t* g, void* gemm, int64_t t,           \
                        int64_t t1) {                                                     \
    GEOMETRY;                                                                             \
    (void)t1;                                                                             \
    T* cols = work + t * ws;                                                              \
    for (;;) {                                                                            \
        int64_t n = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);                        \
        if (n >= N) break;                                                                \
        T* dst = direct ? dx + n * C * H * W : cols;                                      \
        ((gemm_##S)gemm)(ROW, TR, NT, CK, P, O, 1, w, CK, gy + n * O * P, P, 0, dst, P);  \
        if (!direct) col2im_##S(cols, dx + n * C * H * W, g);                             \
    }                                                                                     \
}                                                                                         \
                                                                                          \
/* dw[t] (O, CK) = the weight gradient summed over thread t's images: a fixed block of  \
   them (of nt threads), not items from the counter, so the sum's order, and the result, \
   do not depend on which thread ran first */                                             \
void tsr_conv_wgrad_##S(const T* x, const T* gy, T* dw, T* work, int64_t ws,              \
                        int64_t* next, const int64_t* g, void* gemm, int64_t t,           \
                        int64_t nt) {                                                     \
    GEOMETRY;                                                                             \
    (void)next;                                                                           \
    T* cols = work + t * ws;                                                              \
    T* acc = dw + t * O * CK;                                                             \
    T beta = 0;                                                                           \
    for (int64_t n = N * t / nt; n < N * (t + 1) / nt; n++) {                             \
        const T* src = x + n * C * H * W;                                                 \
        if (!direct) { im2col_##S(src, cols, g, 0, OH, P); src = cols; }                  \
        ((gemm_##S)gemm)(ROW, NT, TR, O, CK, P, 1, gy + n * O * P, P, src, P, beta, acc,  \
                         CK);                                                             \
        beta = 1;                                                                         \
    }                                                                                     \
    if (beta == 0) memset(acc, 0, O * CK * sizeof(T));                                    \
}

#include "winograd.h"
#include "winograd4.h"
