/* Tessera's float32 GEMM (the API: gemm.h), organised as BLIS's: op(B) is packed into
   NR-column panels (an L3-sized block at a time, or once for a constant weight), op(A)
   into MR-row panels (an L2-sized block), and a register-blocked micro-kernel multiplies
   one MR x KC panel of A by one KC x NR panel of B, the B panel staying in L1 while the A
   panels stream past it. The micro-kernels are hand-written with intrinsics, each under
   its own target attribute (AVX-512: 14 x 32, AVX2+FMA: 6 x 16, portable C: 4 x 8, the
   compiler vectorising it), so the file compiles for baseline x86-64 (and for any other
   CPU, portable path only) and picks the path at run time.

   The micro-kernel writes a full tile straight into C (C = AB, or C += AB after the first
   KC block); an edge tile, or one that alpha or beta scale, goes through a tile buffer in
   L1 instead. After the last KC block the epilogue (bias, activation, residual) runs on the
   tile while it is in L1, compiled per path too so that gelu's polynomials vectorise.
   A whose rows are contiguous is read in place, not packed (see ``blocks``). */
#include "gemm.h"
#include "prelude.h"

#if defined(__x86_64__) || defined(__i386__)
#define TSR_X86 1
#include <immintrin.h>
#define TSR_AVX512 __attribute__((target("avx512f,prefer-vector-width=512")))
#define TSR_AVX2 __attribute__((target("avx2,fma")))
/* AVX-512 code that also multiplies 256-bit vectors (the GEMV of one row) */
#define TSR_AVX512_FMA __attribute__((target("avx512f,fma,prefer-vector-width=512")))
#else
#define TSR_X86 0
#endif

enum { MR_512 = 14, NR_512 = 32, MR_256 = 6, NR_256 = 16, MR_P = 4, NR_P = 8,
       TILE_MAX = 14 * 32, TILE_NR = 32 };

/* ---- what the CPU runs -------------------------------------------------------------- */

/* the paths are prelude.h's levels */
int tsr_gemm_isa_supported(int isa) { return isa < TSR_GEMM_ISAS && tsr_isa_supported(isa); }
int tsr_gemm_isa_best(void) { return tsr_isa_best(); }

static const int MRS[TSR_GEMM_ISAS] = {MR_P, MR_256, MR_512};
static const int NRS[TSR_GEMM_ISAS] = {NR_P, NR_256, NR_512};

int tsr_gemm_mr(int isa) { return isa >= 0 && isa < TSR_GEMM_ISAS ? MRS[isa] : 0; }
int tsr_gemm_nr(int isa) { return isa >= 0 && isa < TSR_GEMM_ISAS ? NRS[isa] : 0; }

/* ---- the epilogue's state, per tile -------------------------------------------------- */

typedef struct {
    float alpha, beta;
    int overwrite;           /* C is not read (the first KC block with beta == 0) */
    int last;                /* the last KC block: apply the epilogue */
    int act, residual_first;
    const float* bias;       /* at the tile's first column (first row with bias_rows), or
                                NULL */
    const float* r;          /* at the tile's first element, or NULL */
    int64_t ldr;
    int bias_rows;
    float lo, hi;            /* TSR_ACT_CLAMP's bounds */
} epi_t;

/* ---- micro-kernels: c (MR x NR, rows ldc apart) = (add ? c : 0) + a panel (k x MR) @
   b panel (k x NR); c is a full tile of C, or the tile buffer (rows NR apart) */

#define TSR_REP6(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define TSR_REP14(X) TSR_REP6(X) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)

/* The body of each x86 micro-kernel reads op(A)[i][p] at a[i * ars + p * acs]: a packed
   panel (ars 1, acs MR) or, for products whose A is used against few B panels (packing it
   would cost as much as the multiplications), rows of A in place (ars lda, acs 1). */
#if TSR_X86
#define TSR_Z512(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = _mm512_setzero_ps();
#define TSR_STEP512(i) { __m512 ai = _mm512_set1_ps(a[i * ars]);                          \
                         c##i##0 = _mm512_fmadd_ps(ai, b0, c##i##0);                      \
                         c##i##1 = _mm512_fmadd_ps(ai, b1, c##i##1); }
#define TSR_ADD512(i) c##i##0 = _mm512_add_ps(c##i##0, _mm512_loadu_ps(c + i * ldc));     \
                      c##i##1 = _mm512_add_ps(c##i##1, _mm512_loadu_ps(c + i * ldc + 16));
#define TSR_ST512(i) _mm512_storeu_ps(c + i * ldc, c##i##0);                              \
                     _mm512_storeu_ps(c + i * ldc + 16, c##i##1);
#define TSR_Z256(i) __m256 c##i##0 = _mm256_setzero_ps(), c##i##1 = _mm256_setzero_ps();
#define TSR_STEP256(i) { __m256 ai = _mm256_broadcast_ss(a + i * ars);                    \
                         c##i##0 = _mm256_fmadd_ps(ai, b0, c##i##0);                      \
                         c##i##1 = _mm256_fmadd_ps(ai, b1, c##i##1); }
#define TSR_ADD256(i) c##i##0 = _mm256_add_ps(c##i##0, _mm256_loadu_ps(c + i * ldc));     \
                      c##i##1 = _mm256_add_ps(c##i##1, _mm256_loadu_ps(c + i * ldc + 8));
#define TSR_ST256(i) _mm256_storeu_ps(c + i * ldc, c##i##0);                              \
                     _mm256_storeu_ps(c + i * ldc + 8, c##i##1);

/* The epilogue in registers, for a full tile the micro-kernel writes straight into C
   after the last KC block: act(acc + bias [+ r]) [+ r] for act none, relu or clamp, in the
   order tile_update's loops take (so the result is the same either way). max(0, v) and
   min(hi, v) give v itself when v is a NaN, as act_relu and act_clamp do. */
#define TSR_EPI_ROW(V, ADD, MAX, MIN, LOADU, SET1, i, c0, c1, W)                          \
    {                                                                                     \
        V b0 = cb0, b1 = cb1;                                                             \
        if (rowb) b0 = b1 = SET1(e->bias[i]);                                             \
        c0 = ADD(c0, b0);                                                                 \
        c1 = ADD(c1, b1);                                                                 \
        const float* ri = e->r ? e->r + (i) * e->ldr : NULL;                              \
        if (ri && first) { c0 = ADD(c0, LOADU(ri)); c1 = ADD(c1, LOADU(ri + W)); }        \
        if (act == TSR_ACT_RELU) { c0 = MAX(zero, c0); c1 = MAX(zero, c1); }              \
        else if (act == TSR_ACT_CLAMP) {                                                  \
            c0 = MIN(vhi, MAX(vlo, c0));                                                  \
            c1 = MIN(vhi, MAX(vlo, c1));                                                  \
        }                                                                                 \
        if (ri && !first) { c0 = ADD(c0, LOADU(ri)); c1 = ADD(c1, LOADU(ri + W)); }       \
    }
#define TSR_EPI512(i) TSR_EPI_ROW(__m512, _mm512_add_ps, _mm512_max_ps, _mm512_min_ps,    \
                                  _mm512_loadu_ps, _mm512_set1_ps, i, c##i##0, c##i##1, 16)
#define TSR_EPI256(i) TSR_EPI_ROW(__m256, _mm256_add_ps, _mm256_max_ps, _mm256_min_ps,    \
                                  _mm256_loadu_ps, _mm256_set1_ps, i, c##i##0, c##i##1, 8)
/* the registers the rows share: bias by column (or -0, which leaves every value as it is),
   the clamp's bounds, zero */
#define TSR_EPI_SETUP(V, SET1, LOADU, W)                                                  \
    int rowb = e->bias && e->bias_rows, first = e->residual_first, act = e->act;          \
    V cb0 = SET1(-0.0f), cb1 = cb0, zero = SET1(0.0f);                                    \
    V vlo = SET1(e->lo), vhi = SET1(e->hi);                                               \
    if (e->bias && !rowb) { cb0 = LOADU(e->bias); cb1 = LOADU(e->bias + W); }

TSR_AVX512 TSR_INLINE void ukr_avx512_body(int64_t k, const float* restrict a, int64_t ars,
                                           int64_t acs, const float* restrict b,
                                           float* restrict c, int64_t ldc, int add,
                                           const epi_t* e) {
    for (int i = 0; i < MR_512; i++)   /* C's lines on their way while the loop runs */
        for (int j = 0; j < NR_512; j += 16)
            _mm_prefetch((const char*)(c + i * ldc + j), _MM_HINT_T0);
    TSR_REP14(TSR_Z512)
#pragma GCC unroll 4
    for (int64_t p = 0; p < k; p++) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
        if (acs != 1) _mm_prefetch((const char*)(a + 8 * MR_512), _MM_HINT_T0);
        TSR_REP14(TSR_STEP512)
        a += acs;
        b += NR_512;
    }
    if (add) { TSR_REP14(TSR_ADD512) }
    if (e) {
        TSR_EPI_SETUP(__m512, _mm512_set1_ps, _mm512_loadu_ps, 16)
        TSR_REP14(TSR_EPI512)
    }
    TSR_REP14(TSR_ST512)
}

TSR_AVX2 TSR_INLINE void ukr_avx2_body(int64_t k, const float* restrict a, int64_t ars,
                                       int64_t acs, const float* restrict b,
                                       float* restrict c, int64_t ldc, int add,
                                       const epi_t* e) {
    for (int i = 0; i < MR_256; i++) _mm_prefetch((const char*)(c + i * ldc), _MM_HINT_T0);
    TSR_REP6(TSR_Z256)
#pragma GCC unroll 4
    for (int64_t p = 0; p < k; p++) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        if (acs != 1) _mm_prefetch((const char*)(a + 8 * MR_256), _MM_HINT_T0);
        TSR_REP6(TSR_STEP256)
        a += acs;
        b += NR_256;
    }
    if (add) { TSR_REP6(TSR_ADD256) }
    if (e) {
        TSR_EPI_SETUP(__m256, _mm256_set1_ps, _mm256_loadu_ps, 8)
        TSR_REP6(TSR_EPI256)
    }
    TSR_REP6(TSR_ST256)
}

TSR_AVX512 static void ukr_avx512(int64_t k, const float* a, int64_t lda, const float* b,
                                  float* c, int64_t ldc, int add) {
    (void)lda;
    ukr_avx512_body(k, a, 1, MR_512, b, c, ldc, add, NULL);
}
TSR_AVX512 static void ukr_avx512_rows(int64_t k, const float* a, int64_t lda,
                                       const float* b, float* c, int64_t ldc, int add) {
    ukr_avx512_body(k, a, lda, 1, b, c, ldc, add, NULL);
}
TSR_AVX2 static void ukr_avx2(int64_t k, const float* a, int64_t lda, const float* b,
                              float* c, int64_t ldc, int add) {
    (void)lda;
    ukr_avx2_body(k, a, 1, MR_256, b, c, ldc, add, NULL);
}
TSR_AVX2 static void ukr_avx2_rows(int64_t k, const float* a, int64_t lda, const float* b,
                                   float* c, int64_t ldc, int add) {
    ukr_avx2_body(k, a, lda, 1, b, c, ldc, add, NULL);
}
/* the same with the epilogue e in registers (a full tile, the last KC block) */
TSR_AVX512 static void ukr_avx512_epi(int64_t k, const float* a, int64_t lda,
                                      const float* b, float* c, int64_t ldc, int add,
                                      const epi_t* e) {
    (void)lda;
    ukr_avx512_body(k, a, 1, MR_512, b, c, ldc, add, e);
}
TSR_AVX512 static void ukr_avx512_rows_epi(int64_t k, const float* a, int64_t lda,
                                           const float* b, float* c, int64_t ldc, int add,
                                           const epi_t* e) {
    ukr_avx512_body(k, a, lda, 1, b, c, ldc, add, e);
}
TSR_AVX2 static void ukr_avx2_epi(int64_t k, const float* a, int64_t lda, const float* b,
                                  float* c, int64_t ldc, int add, const epi_t* e) {
    (void)lda;
    ukr_avx2_body(k, a, 1, MR_256, b, c, ldc, add, e);
}
TSR_AVX2 static void ukr_avx2_rows_epi(int64_t k, const float* a, int64_t lda,
                                       const float* b, float* c, int64_t ldc, int add,
                                       const epi_t* e) {
    ukr_avx2_body(k, a, lda, 1, b, c, ldc, add, e);
}

/* R <= 4 rows (the last rows of A: a GEMV's one row, batch-1 inference): the full kernel
   would spend 14 rows' multiplications on them. Even and odd k accumulate apart, so that
   one row still has four independent chains of FMAs. */
TSR_AVX512 TSR_INLINE void ukr_avx512_few(int64_t k, const float* restrict a, int64_t ars,
                                          int64_t acs, const float* restrict b,
                                          float* restrict c, int64_t ldc, int add, int R) {
    __m512 s[4][4];   /* [row][half + 2 * parity] */
    for (int r = 0; r < R; r++)
        for (int h = 0; h < 4; h++) s[r][h] = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p + 2 <= k; p += 2, a += 2 * acs, b += 2 * NR_512) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
        __m512 b2 = _mm512_load_ps(b + 32), b3 = _mm512_load_ps(b + 48);
        /* few rows: B streams by faster than the hardware prefetcher ramps up */
        _mm_prefetch((const char*)(b + 1024), _MM_HINT_T0);
        _mm_prefetch((const char*)(b + 1040), _MM_HINT_T0);
        _mm_prefetch((const char*)(b + 1056), _MM_HINT_T0);
        _mm_prefetch((const char*)(b + 1072), _MM_HINT_T0);
        for (int r = 0; r < R; r++) {
            __m512 a0 = _mm512_set1_ps(a[r * ars]), a1 = _mm512_set1_ps(a[r * ars + acs]);
            s[r][0] = _mm512_fmadd_ps(a0, b0, s[r][0]);
            s[r][1] = _mm512_fmadd_ps(a0, b1, s[r][1]);
            s[r][2] = _mm512_fmadd_ps(a1, b2, s[r][2]);
            s[r][3] = _mm512_fmadd_ps(a1, b3, s[r][3]);
        }
    }
    if (p < k) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
        for (int r = 0; r < R; r++) {
            __m512 a0 = _mm512_set1_ps(a[r * ars]);
            s[r][0] = _mm512_fmadd_ps(a0, b0, s[r][0]);
            s[r][1] = _mm512_fmadd_ps(a0, b1, s[r][1]);
        }
    }
    for (int r = 0; r < R; r++) {
        __m512 lo = _mm512_add_ps(s[r][0], s[r][2]), hi = _mm512_add_ps(s[r][1], s[r][3]);
        if (add) {
            lo = _mm512_add_ps(lo, _mm512_loadu_ps(c + r * ldc));
            hi = _mm512_add_ps(hi, _mm512_loadu_ps(c + r * ldc + 16));
        }
        _mm512_storeu_ps(c + r * ldc, lo);
        _mm512_storeu_ps(c + r * ldc + 16, hi);
    }
}

/* one out-of-line copy per row count for both layouts of A (see mid512_ below): NAME_R,
   the kernel KERN at R rows with A's layout (ars, acs) taken at run time */
#define TSR_OUTLINED(ATTR, NAME, KERN, R)                                                 \
ATTR __attribute__((noinline)) static void NAME##_##R(                                   \
        int64_t k, const float* a, int64_t ars, int64_t acs, const float* b, float* c,    \
        int64_t ldc, int add) {                                                           \
    KERN(k, a, ars, acs, b, c, ldc, add, R);                                              \
}
/* a row count's two table entries, A packed (MR apart) and A's rows in place, on FN */
#define TSR_ROW_ENTRIES(ISA, R, FN, MR)                                                   \
static void ukr_##ISA##_few##R(int64_t k, const float* a, int64_t lda, const float* b,    \
                               float* c, int64_t ldc, int add) {                          \
    (void)lda;                                                                            \
    FN(k, a, 1, MR, b, c, ldc, add);                                                      \
}                                                                                         \
static void ukr_##ISA##_few##R##_rows(int64_t k, const float* a, int64_t lda,             \
                                      const float* b, float* c, int64_t ldc, int add) {   \
    FN(k, a, lda, 1, b, c, ldc, add);                                                     \
}
#define TSR_FEW512(R)                                                                     \
    TSR_OUTLINED(TSR_AVX512, few512, ukr_avx512_few, R)                                   \
    TSR_ROW_ENTRIES(avx512, R, few512_##R, MR_512)
TSR_FEW512(1) TSR_FEW512(2) TSR_FEW512(3) TSR_FEW512(4)

/* 4 to 8 rows (a class token and four patches, a small batch; half of 9 to 13): one chain
   per element in the order of p, as the full kernel sums (2R accumulators are chains
   enough to keep the FMAs busy), so these rows get the full kernel's bits (the same as in
   a product of more rows) for a fraction of its work. */
TSR_AVX512 TSR_INLINE void ukr_avx512_mid(int64_t k, const float* restrict a, int64_t ars,
                                          int64_t acs, const float* restrict b,
                                          float* restrict c, int64_t ldc, int add, int R) {
    __m512 s[8][2];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) s[r][0] = s[r][1] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int64_t p = 0; p < k; p++, a += acs, b += NR_512) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
        _mm_prefetch((const char*)(b + 512), _MM_HINT_T0);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++) {
            __m512 ai = _mm512_set1_ps(a[r * ars]);
            s[r][0] = _mm512_fmadd_ps(ai, b0, s[r][0]);
            s[r][1] = _mm512_fmadd_ps(ai, b1, s[r][1]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) {
        if (add) {
            s[r][0] = _mm512_add_ps(s[r][0], _mm512_loadu_ps(c + r * ldc));
            s[r][1] = _mm512_add_ps(s[r][1], _mm512_loadu_ps(c + r * ldc + 16));
        }
        _mm512_storeu_ps(c + r * ldc, s[r][0]);
        _mm512_storeu_ps(c + r * ldc + 16, s[r][1]);
    }
}

/* one out-of-line copy per row count, A's layout (ars, acs) taken at run time: the packed
   and in-place table entries below share it, which keeps an exported library's code small
   (bench deploy: "code KB", under 300 KB a model) */
typedef void (*mid_fn)(int64_t, const float*, int64_t, int64_t, const float*, float*, int64_t,
                       int);
#define TSR_MIDR512(R) TSR_OUTLINED(TSR_AVX512, mid512, ukr_avx512_mid, R)
TSR_MIDR512(4) TSR_MIDR512(5) TSR_MIDR512(6) TSR_MIDR512(7) TSR_MIDR512(8)
static const mid_fn MID512[9] = {[4] = mid512_4, [5] = mid512_5, [6] = mid512_6,
                                 [7] = mid512_7, [8] = mid512_8};

/* 5 <= R < 14 rows of A (at a, ars and acs apart): more than 8 in two halves, the larger
   first (9 = 5 + 4 ... 13 = 7 + 6: a little faster than 8 and the rest, and than the full
   kernel), each summing as the full kernel does */
static void ukr_avx512_split(int64_t k, const float* a, int64_t ars, int64_t acs,
                             const float* b, float* c, int64_t ldc, int add, int R) {
    if (R > 8) {
        int h = (R + 1) / 2;
        MID512[h](k, a, ars, acs, b, c, ldc, add);
        a += h * ars;
        c += h * ldc;
        R -= h;
    }
    MID512[R](k, a, ars, acs, b, c, ldc, add);
}

/* 5 to 13 rows over the two halves: ukr_avx512_split at a fixed R */
#define TSR_SPLIT512(R)                                                                   \
TSR_INLINE void split512_##R(int64_t k, const float* a, int64_t ars, int64_t acs,         \
                            const float* b, float* c, int64_t ldc, int add) {            \
    ukr_avx512_split(k, a, ars, acs, b, c, ldc, add, R);                                  \
}
#define TSR_MID512(R) TSR_SPLIT512(R) TSR_ROW_ENTRIES(avx512, R, split512_##R, MR_512)
TSR_MID512(5) TSR_MID512(6) TSR_MID512(7) TSR_MID512(8) TSR_MID512(9) TSR_MID512(10)
TSR_MID512(11) TSR_MID512(12) TSR_MID512(13)

/* the same for AVX2, 1 or 2 rows (16 registers: 4 R accumulators, 4 of B, 2 of A) */
TSR_AVX2 TSR_INLINE void ukr_avx2_few(int64_t k, const float* restrict a, int64_t ars,
                                      int64_t acs, const float* restrict b, float* restrict c,
                                      int64_t ldc, int add, int R) {
    __m256 s[2][4];
    for (int r = 0; r < R; r++)
        for (int h = 0; h < 4; h++) s[r][h] = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 2 <= k; p += 2, a += 2 * acs, b += 2 * NR_256) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        __m256 b2 = _mm256_load_ps(b + 16), b3 = _mm256_load_ps(b + 24);
        _mm_prefetch((const char*)(b + 512), _MM_HINT_T0);
        _mm_prefetch((const char*)(b + 528), _MM_HINT_T0);
        for (int r = 0; r < R; r++) {
            __m256 a0 = _mm256_broadcast_ss(a + r * ars);
            __m256 a1 = _mm256_broadcast_ss(a + r * ars + acs);
            s[r][0] = _mm256_fmadd_ps(a0, b0, s[r][0]);
            s[r][1] = _mm256_fmadd_ps(a0, b1, s[r][1]);
            s[r][2] = _mm256_fmadd_ps(a1, b2, s[r][2]);
            s[r][3] = _mm256_fmadd_ps(a1, b3, s[r][3]);
        }
    }
    if (p < k) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        for (int r = 0; r < R; r++) {
            __m256 a0 = _mm256_broadcast_ss(a + r * ars);
            s[r][0] = _mm256_fmadd_ps(a0, b0, s[r][0]);
            s[r][1] = _mm256_fmadd_ps(a0, b1, s[r][1]);
        }
    }
    for (int r = 0; r < R; r++) {
        __m256 lo = _mm256_add_ps(s[r][0], s[r][2]), hi = _mm256_add_ps(s[r][1], s[r][3]);
        if (add) {
            lo = _mm256_add_ps(lo, _mm256_loadu_ps(c + r * ldc));
            hi = _mm256_add_ps(hi, _mm256_loadu_ps(c + r * ldc + 8));
        }
        _mm256_storeu_ps(c + r * ldc, lo);
        _mm256_storeu_ps(c + r * ldc + 8, hi);
    }
}

#define TSR_FEW256(R)                                                                     \
    TSR_OUTLINED(TSR_AVX2, few256, ukr_avx2_few, R)                                       \
    TSR_ROW_ENTRIES(avx2, R, few256_##R, MR_256)
TSR_FEW256(1) TSR_FEW256(2)

/* 3 to 5 rows: one chain per element, the full kernel's order (see ukr_avx512_mid) */
TSR_AVX2 TSR_INLINE void ukr_avx2_mid(int64_t k, const float* restrict a, int64_t ars,
                                      int64_t acs, const float* restrict b, float* restrict c,
                                      int64_t ldc, int add, int R) {
    __m256 s[5][2];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) s[r][0] = s[r][1] = _mm256_setzero_ps();
#pragma GCC unroll 2
    for (int64_t p = 0; p < k; p++, a += acs, b += NR_256) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        _mm_prefetch((const char*)(b + 256), _MM_HINT_T0);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++) {
            __m256 ai = _mm256_broadcast_ss(a + r * ars);
            s[r][0] = _mm256_fmadd_ps(ai, b0, s[r][0]);
            s[r][1] = _mm256_fmadd_ps(ai, b1, s[r][1]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) {
        if (add) {
            s[r][0] = _mm256_add_ps(s[r][0], _mm256_loadu_ps(c + r * ldc));
            s[r][1] = _mm256_add_ps(s[r][1], _mm256_loadu_ps(c + r * ldc + 8));
        }
        _mm256_storeu_ps(c + r * ldc, s[r][0]);
        _mm256_storeu_ps(c + r * ldc + 8, s[r][1]);
    }
}

#define TSR_MIDR256(R)                                                                    \
    TSR_OUTLINED(TSR_AVX2, mid256, ukr_avx2_mid, R)                                       \
    TSR_ROW_ENTRIES(avx2, R, mid256_##R, MR_256)
TSR_MIDR256(3) TSR_MIDR256(4) TSR_MIDR256(5)
#endif

static void ukr_portable(int64_t k, const float* restrict a, int64_t lda,
                         const float* restrict b, float* restrict c, int64_t ldc, int add) {
    (void)lda;
    float acc[MR_P][NR_P] = {{0}};
    for (int64_t p = 0; p < k; p++, a += MR_P, b += NR_P)
        for (int i = 0; i < MR_P; i++)
#pragma omp simd
            for (int j = 0; j < NR_P; j++) acc[i][j] += a[i] * b[j];
    for (int i = 0; i < MR_P; i++)
#pragma omp simd
        for (int j = 0; j < NR_P; j++) c[i * ldc + j] = (add ? c[i * ldc + j] : 0.0f) + acc[i][j];
}

/* ---- the tile's write into C -------------------------------------------------------- */


/* gelu(x) = x Phi(x) (erf form) or PyTorch's tanh approximation */
TSR_INLINE float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tsr_tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

TSR_INLINE float act_none(float x) { return x; }
TSR_INLINE float act_relu(float x) { return x < 0.0f ? 0.0f : x; }   /* NaN passes */
TSR_INLINE float act_gelu(float x) { return x * tsr_phif(x); }
TSR_INLINE float act_silu(float x) { return x * tsr_sigmoidf(x); }
/* NaN passes, as through torch.clamp and hardtanh */
#define act_clamp(x) ((x) < lo ? lo : (x) > hi ? hi : (x))

/* what an absent bias or residual adds: -0, which leaves every value as it is (-0 too) */
static const float NEG_ZEROS[TILE_NR] __attribute__((aligned(64))) = {
    -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f,
    -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f, -0.f,
    -0.f, -0.f, -0.f, -0.f};

/* one row of the epilogue in one pass: act(c + bias + pre) + post, pre or post the
   residual (the other NEG_ZEROS) */
#define TSR_EPILOGUE_ROW(F)                                                               \
    _Pragma("omp simd")                                                                   \
    for (int64_t j = 0; j < nr; j++) c[j] = F(c[j] + bias[j] + pre[j]) + post[j];

TSR_INLINE void epilogue_row(float* restrict c, int64_t nr, const float* restrict bias,
                             const float* restrict pre, const float* restrict post, int act,
                             float lo, float hi) {
    switch (act) {
    case TSR_ACT_RELU: TSR_EPILOGUE_ROW(act_relu) break;
    case TSR_ACT_GELU_TANH: TSR_EPILOGUE_ROW(gelu_tanh) break;
    case TSR_ACT_GELU_ERF: TSR_EPILOGUE_ROW(act_gelu) break;
    case TSR_ACT_CLAMP: TSR_EPILOGUE_ROW(act_clamp) break;
    case TSR_ACT_SILU: TSR_EPILOGUE_ROW(act_silu) break;
    default: TSR_EPILOGUE_ROW(act_none)
    }
}

/* C tile (mr x nr, rows ldc apart) from t (rows NR apart), then the epilogue after the
   last KC block; with t NULL, the epilogue only (the micro-kernel wrote C itself). Inlined
   into one function per path so that its loops vectorise for that path. */
TSR_INLINE void tile_update(const float* restrict t, int64_t NR, float* restrict c,
                            int64_t ldc, int64_t mr, int64_t nr, const epi_t* e) {
    float alpha = e->alpha, beta = e->beta;
    int epilogue = e->last && (e->bias || e->r || e->act != TSR_ACT_NONE);
    const float* bias = e->bias && !e->bias_rows ? e->bias : NEG_ZEROS;
    float row_bias[TILE_NR] __attribute__((aligned(64)));   /* a row's one value, spread */
    for (int64_t i = 0; i < mr; i++, t += t ? NR : 0, c += ldc) {
        if (!t) {
        } else if (e->overwrite) {
#pragma omp simd
            for (int64_t j = 0; j < nr; j++) c[j] = alpha * t[j];
        } else if (beta == 1.0f) {
#pragma omp simd
            for (int64_t j = 0; j < nr; j++) c[j] += alpha * t[j];
        } else {
#pragma omp simd
            for (int64_t j = 0; j < nr; j++) c[j] = alpha * t[j] + beta * c[j];
        }
        if (!epilogue) continue;
        const float* r = e->r ? e->r + i * e->ldr : NEG_ZEROS;
        int first = e->residual_first;
        if (e->bias && e->bias_rows) {
            float b = e->bias[i];
            for (int64_t j = 0; j < nr; j++) row_bias[j] = b;
            bias = row_bias;
        }
        epilogue_row(c, nr, bias, first ? r : NEG_ZEROS, first ? NEG_ZEROS : r, e->act,
                     e->lo, e->hi);
    }
}

#if TSR_X86
TSR_AVX512 static void update_avx512(const float* t, float* c, int64_t ldc, int64_t mr,
                                     int64_t nr, const epi_t* e) {
    tile_update(t, NR_512, c, ldc, mr, nr, e);
}
TSR_AVX2 static void update_avx2(const float* t, float* c, int64_t ldc, int64_t mr,
                                 int64_t nr, const epi_t* e) {
    tile_update(t, NR_256, c, ldc, mr, nr, e);
}
#endif
static void update_portable(const float* t, float* c, int64_t ldc, int64_t mr, int64_t nr,
                            const epi_t* e) {
    tile_update(t, NR_P, c, ldc, mr, nr, e);
}

typedef void (*ukr_fn)(int64_t, const float*, int64_t, const float*, float*, int64_t, int);
typedef void (*ukr_epi_fn)(int64_t, const float*, int64_t, const float*, float*, int64_t, int,
                           const epi_t*);
typedef void (*update_fn)(const float*, float*, int64_t, int64_t, int64_t, const epi_t*);

#if TSR_X86
static const ukr_fn UKRS[TSR_GEMM_ISAS] = {ukr_portable, ukr_avx2, ukr_avx512};
static const ukr_fn ROWS[TSR_GEMM_ISAS] = {NULL, ukr_avx2_rows, ukr_avx512_rows};
/* the kernels of 1 to FEW_MAX rows (index R: a tile's rows past the last full one, the
   whole of a product of fewer rows than MR), packed and in place, where a path has them */
enum { FEW_MAX = MR_512 - 1 };
static const ukr_fn FEW[TSR_GEMM_ISAS][FEW_MAX + 1] = {
    [TSR_GEMM_AVX2] = {NULL, ukr_avx2_few1, ukr_avx2_few2, ukr_avx2_few3, ukr_avx2_few4,
                       ukr_avx2_few5},
    [TSR_GEMM_AVX512] = {NULL, ukr_avx512_few1, ukr_avx512_few2, ukr_avx512_few3,
                         ukr_avx512_few4, ukr_avx512_few5, ukr_avx512_few6, ukr_avx512_few7,
                         ukr_avx512_few8, ukr_avx512_few9, ukr_avx512_few10,
                         ukr_avx512_few11, ukr_avx512_few12, ukr_avx512_few13}};
static const ukr_fn FEW_ROWS[TSR_GEMM_ISAS][FEW_MAX + 1] = {
    [TSR_GEMM_AVX2] = {NULL, ukr_avx2_few1_rows, ukr_avx2_few2_rows, ukr_avx2_few3_rows,
                       ukr_avx2_few4_rows, ukr_avx2_few5_rows},
    [TSR_GEMM_AVX512] = {NULL, ukr_avx512_few1_rows, ukr_avx512_few2_rows,
                         ukr_avx512_few3_rows, ukr_avx512_few4_rows, ukr_avx512_few5_rows,
                         ukr_avx512_few6_rows, ukr_avx512_few7_rows, ukr_avx512_few8_rows,
                         ukr_avx512_few9_rows, ukr_avx512_few10_rows, ukr_avx512_few11_rows,
                         ukr_avx512_few12_rows, ukr_avx512_few13_rows}};
static const update_fn UPDATES[TSR_GEMM_ISAS] = {update_portable, update_avx2,
                                                 update_avx512};
/* the full-tile kernels with the epilogue in registers (packed A, A in place) */
static const ukr_epi_fn EPIS[TSR_GEMM_ISAS] = {NULL, ukr_avx2_epi, ukr_avx512_epi};
static const ukr_epi_fn EPI_ROWS[TSR_GEMM_ISAS] = {NULL, ukr_avx2_rows_epi,
                                                   ukr_avx512_rows_epi};
#else
static const ukr_fn UKRS[TSR_GEMM_ISAS] = {ukr_portable, ukr_portable, ukr_portable};
static const ukr_fn ROWS[TSR_GEMM_ISAS] = {NULL, NULL, NULL};
enum { FEW_MAX = MR_512 - 1 };
static const ukr_fn FEW[TSR_GEMM_ISAS][FEW_MAX + 1], FEW_ROWS[TSR_GEMM_ISAS][FEW_MAX + 1];
static const update_fn UPDATES[TSR_GEMM_ISAS] = {update_portable, update_portable,
                                                 update_portable};
static const ukr_epi_fn EPIS[TSR_GEMM_ISAS], EPI_ROWS[TSR_GEMM_ISAS];
#endif

/* ---- packing ------------------------------------------------------------------------ */

/* rows [i0, i0 + mb) x columns [p0, p0 + kb) of op(A) into MR-row panels, each kb x MR,
   rows past mb zero */
static void pack_a(const float* a, int64_t rsa, int64_t csa, int64_t i0, int64_t mb,
                   int64_t p0, int64_t kb, int MR, float* restrict d) {
    for (int64_t ir = 0; ir < mb; ir += MR, d += kb * MR) {
        int64_t mr = mb - ir < MR ? mb - ir : MR;
        const float* src = a + (i0 + ir) * rsa + p0 * csa;
        if (csa == 1) {   /* rows contiguous: 64 columns of one row at a time, the panel's
                             part being written staying in L1 */
            for (int64_t p1 = 0; p1 < kb; p1 += 64) {
                int64_t p2 = p1 + 64 < kb ? p1 + 64 : kb;
                for (int64_t r = 0; r < mr; r++)
                    for (int64_t p = p1; p < p2; p++) d[p * MR + r] = src[r * rsa + p];
            }
        } else {
            for (int64_t p = 0; p < kb; p++)
                for (int64_t r = 0; r < mr; r++) d[p * MR + r] = src[r * rsa + p * csa];
        }
        if (mr < MR)
            for (int64_t p = 0; p < kb; p++)
                for (int64_t r = mr; r < MR; r++) d[p * MR + r] = 0.0f;
    }
}

/* columns [j0, j0 + nb) x rows [p0, p0 + kb) of op(B) into NR-column panels, panel q at
   d + q * stride, kb x NR, columns past nb zero */
#if TSR_X86
/* d[q * ldd + r] = s[r * lds + q] for a 16 x 16 block: unpack pairs, 4 x 4 within lanes,
   then 128-bit lanes across */
TSR_AVX512 static void transpose16(const float* s, int64_t lds, float* d, int64_t ldd) {
    __m512 r[16], t[16], u[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(s + i * lds);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {   /* u[4i + c], lane l: rows 4i..4i+3 of column 4l + c */
        __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
        __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
        __m512 w0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        __m512 w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
        _mm512_storeu_ps(d + c * ldd, _mm512_shuffle_f32x4(v0, w0, 0x88));
        _mm512_storeu_ps(d + (4 + c) * ldd, _mm512_shuffle_f32x4(v1, w1, 0x88));
        _mm512_storeu_ps(d + (8 + c) * ldd, _mm512_shuffle_f32x4(v0, w0, 0xDD));
        _mm512_storeu_ps(d + (12 + c) * ldd, _mm512_shuffle_f32x4(v1, w1, 0xDD));
    }
}

/* the same for an 8 x 8 block with AVX2: pairs, 4 x 4 within lanes, then the two lanes */
TSR_AVX2 static void transpose8(const float* s, int64_t lds, float* d, int64_t ldd) {
    __m256 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(s + i * lds);
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {   /* u[c], lane l: rows 0..3 of column 4l + c; u[4 + c]: 4..7 */
        _mm256_storeu_ps(d + c * ldd, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
        _mm256_storeu_ps(d + (4 + c) * ldd, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
    }
}
#endif

static void pack_b(const float* b, int64_t rsb, int64_t csb, int64_t j0, int64_t nb,
                   int64_t p0, int64_t kb, int NR, int isa, float* restrict d,
                   int64_t stride) {
    for (int64_t jr = 0; jr < nb; jr += NR, d += stride) {
        int64_t nr = nb - jr < NR ? nb - jr : NR;
        const float* src = b + p0 * rsb + (j0 + jr) * csb;
        if (csb == 1) {
            for (int64_t p = 0; p < kb; p++) {
                memcpy(d + p * NR, src + p * rsb, nr * sizeof(float));
                for (int64_t j = nr; j < NR; j++) d[p * NR + j] = 0.0f;
            }
        } else {   /* a weight W used as W^T: 16 x 16 blocks (AVX2: 8 x 8) transposed in
                      registers where the path has them, else a row of the panel at a time
                      (a scalar gather: 16 rows by a 1024 x 1024 W^T on AVX2 took 1.6x
                      as long that way, 1 to 64 rows 1.1-1.9x) */
            int64_t p1 = 0;
#if TSR_X86
            if (rsb == 1 && NR % 16 == 0 && nr == NR && isa == TSR_GEMM_AVX512)
                for (; p1 + 16 <= kb; p1 += 16)
                    for (int64_t j = 0; j < NR; j += 16)
                        transpose16(src + j * csb + p1, csb, d + p1 * NR + j, NR);
            if (rsb == 1 && NR % 8 == 0 && nr == NR && isa == TSR_GEMM_AVX2)
                for (; p1 + 8 <= kb; p1 += 8)
                    for (int64_t j = 0; j < NR; j += 8)
                        transpose8(src + j * csb + p1, csb, d + p1 * NR + j, NR);
#else
            (void)isa;
#endif
            for (int64_t p = p1; p < kb; p++) {
                const float* s = src + p * rsb;
                float* row = d + p * NR;
                for (int64_t j = 0; j < nr; j++) row[j] = s[j * csb];
                for (int64_t j = nr; j < NR; j++) row[j] = 0.0f;
            }
        }
    }
}

int64_t tsr_gemm_packed_size(int isa, int64_t k, int64_t n) {
    int NR = tsr_gemm_nr(isa);
    return NR ? (n + NR - 1) / NR * NR * k : -1;
}

/* panels [q0, q1) of the whole of op(B), for a thread pool to share the packing */
int tsr_gemm_pack_b_range(int isa, int64_t k, int64_t n, const float* b, int64_t rsb,
                          int64_t csb, float* dst, int64_t q0, int64_t q1) {
    if (!tsr_gemm_nr(isa) || !tsr_gemm_isa_supported(isa)) return -1;
    int NR = tsr_gemm_nr(isa);
    int64_t j1 = q1 * NR < n ? q1 * NR : n;
    if (q0 * NR < j1)
        pack_b(b, rsb, csb, q0 * NR, j1 - q0 * NR, 0, k, NR, isa, dst + q0 * NR * k, NR * k);
    return 0;
}

int tsr_gemm_pack_b(int isa, int64_t k, int64_t n, const float* b, int64_t rsb, int64_t csb,
                    float* dst) {
    int NR = tsr_gemm_nr(isa);
    return NR ? tsr_gemm_pack_b_range(isa, k, n, b, rsb, csb, dst, 0, (n + NR - 1) / NR) : -1;
}

/* ---- a few rows: the GEMV path ------------------------------------------------------ */

/* m <= GEMV_MAX (batch-1 inference: a linear layer's one row, a classifier, a token): the
   blocked driver would pack B, or read its panels a tile at a time, for a handful of rows.
   Here B streams once from where it lies, a few vectors of columns at a time: the panels
   of a packed B, the rows of a row-major B, or the rows of a transposed B (a weight
   (out, in) read as W^T). The threads split the columns. With 2 to 4 rows each element of
   C sums its products in two chains, even and odd p, each in the order of p, then adds the
   two (a transposed B is transposed 16 x 16, AVX2: 8 x 8, in registers on the way); one
   row sums in eight chains (see gemv512_tree). Either way the sum is the same whatever the
   layout of B, its packing and the threads. */
enum { GEMV_MAX = 4, GEMV_VMAX = 4, GEMV_STRIPS = 2, GEMV_AHEAD = 32 };
/* multiply-adds below which a second thread saves less than handing it half the columns
   costs: a product of 2^17 takes some 3 us on one thread, the hand-over (tsr_gemm_exec to
   a spinning worker, no Python between) a few tenths; bench gemm's minilm qkv/out row,
   1.1 x 2^17, is the smallest split */
enum { GEMV_SPLIT_MIN = 1 << 17 };

/* the columns [j, j + NR) of op(B) as rows bs apart: in place (a packed panel, or full
   rows of a row-major B), else packed into buf */
TSR_INLINE const float* gemv_strip(const tsr_gemm_t* g, int64_t j, int NR, int isa,
                                   float* buf, int64_t* bs) {
    if (g->bp) { *bs = NR; return g->bp + j * g->k; }
    if (g->csb == 1 && j + NR <= g->n) { *bs = g->rsb; return g->b + j; }
    pack_b(g->b, g->rsb, g->csb, j, g->n - j < NR ? g->n - j : NR, 0, g->k, NR, isa, buf,
           (int64_t)NR * g->k);
    *bs = NR;
    return buf;
}

/* the epilogue of a GEMV's tile (t: R rows ldt apart), as blocks() applies it */
TSR_INLINE epi_t gemv_epi(const tsr_gemm_t* g) {
    epi_t e = {g->alpha, g->beta, g->beta == 0.0f, 1, g->act,
               (g->flags & TSR_GEMM_RESIDUAL_FIRST) != 0, NULL, NULL, g->ldr,
               (g->flags & TSR_GEMM_BIAS_ROWS) != 0, g->lo, g->hi};
    return e;
}

TSR_INLINE void gemv_update(const tsr_gemm_t* g, epi_t* e, const float* t, int64_t ldt,
                            int64_t j, int64_t nc) {
    for (int64_t q = 0; q < nc; q += TILE_NR) {   /* (NEG_ZEROS is a tile wide) */
        e->bias = !g->bias ? NULL : e->bias_rows ? g->bias : g->bias + j + q;
        e->r = g->r ? g->r + j + q : NULL;
        tile_update(t + q, ldt, g->c + j + q, g->ldc, g->m, nc - q < TILE_NR ? nc - q : TILE_NR,
                    e);
    }
}

#if TSR_X86
/* R rows x V vectors of W columns: t[r * ldt + v * W] = sum_p a[r][p] b_v[p], where row p
   of vector v is at bv[v] + p * bs[v] */
#define TSR_GEMV_P(NAME, ATTR, V_T, W, SET1, LOADU, FMADD, ADD, STOREU, ZERO)                \
ATTR TSR_INLINE void NAME(int64_t k, const float* restrict a, int64_t ars, int64_t acs,      \
                          const float* const* bv, const int64_t* bs, float* restrict t,      \
                          int64_t ldt, int R, int V) {                                       \
    V_T s[GEMV_MAX][GEMV_VMAX][2];                                                           \
    const float* b[GEMV_VMAX];                                                               \
    int64_t st[GEMV_VMAX];                                                                   \
    _Pragma("GCC unroll 16")                                                                \
    for (int v = 0; v < V; v++) {                                                            \
        b[v] = bv[v];                                                                        \
        st[v] = bs[v];                                                                       \
        _Pragma("GCC unroll 16")                                                            \
        for (int r = 0; r < R; r++) s[r][v][0] = s[r][v][1] = ZERO();                        \
    }                                                                                        \
    int64_t p = 0;                                                                           \
    for (; p + 2 <= k; p += 2) {                                                             \
        V_T a0[GEMV_MAX], a1[GEMV_MAX];                                                      \
        _Pragma("GCC unroll 16")                                                            \
        for (int r = 0; r < R; r++) {                                                        \
            a0[r] = SET1(a[r * ars + p * acs]);                                              \
            a1[r] = SET1(a[r * ars + (p + 1) * acs]);                                        \
        }                                                                                    \
        _Pragma("GCC unroll 16")                                                            \
        for (int v = 0; v < V; v++) {                                                        \
            V_T x0 = LOADU(b[v]), x1 = LOADU(b[v] + st[v]);                                  \
            _mm_prefetch((const char*)(b[v] + 24 * st[v]), _MM_HINT_T0);                     \
            _Pragma("GCC unroll 16")                                                        \
            for (int r = 0; r < R; r++) {                                                    \
                s[r][v][0] = FMADD(a0[r], x0, s[r][v][0]);                                   \
                s[r][v][1] = FMADD(a1[r], x1, s[r][v][1]);                                   \
            }                                                                                \
            b[v] += 2 * st[v];                                                               \
        }                                                                                    \
    }                                                                                        \
    if (p < k)                                                                               \
        _Pragma("GCC unroll 16")                                                            \
        for (int r = 0; r < R; r++) {                                                        \
            V_T a0 = SET1(a[r * ars + p * acs]);                                             \
            _Pragma("GCC unroll 16")                                                        \
            for (int v = 0; v < V; v++) s[r][v][0] = FMADD(a0, LOADU(b[v]), s[r][v][0]);     \
        }                                                                                    \
    _Pragma("GCC unroll 16")                                                                \
    for (int r = 0; r < R; r++)                                                              \
        _Pragma("GCC unroll 16")                                                            \
        for (int v = 0; v < V; v++)                                                          \
            STOREU(t + r * ldt + v * W, ADD(s[r][v][0], s[r][v][1]));                        \
}
TSR_GEMV_P(gemv512_p, TSR_AVX512, __m512, 16, _mm512_set1_ps, _mm512_loadu_ps,
           _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps, _mm512_setzero_ps)
TSR_GEMV_P(gemv256_p, TSR_AVX2, __m256, 8, _mm256_set1_ps, _mm256_loadu_ps,
           _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps, _mm256_setzero_ps)

/* One row on AVX-512 (m = 1, the commonest case) sums in eight chains, p mod 8, each in
   the order of p, then adds them pairwise: ((c0 + c4) + (c2 + c6)) + ((c1 + c5) + (c3 +
   c7)). Eight chains keep the FMAs of one row busy, and the order suits both forms of the
   product: B's rows (a panel, or a row-major B) multiply a broadcast a[p] into eight
   accumulators of 16 columns; a transposed B's columns are contiguous in p, and multiply
   8 p at a time, a column to a 256-bit register (gemv_dot8), no transposition needed.
   AVX2 sums one row the same way (gemv256_one). */
TSR_AVX512 TSR_INLINE __m512 gemv512_tree(const __m512* c) {
    return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c[0], c[4]), _mm512_add_ps(c[2], c[6])),
                         _mm512_add_ps(_mm512_add_ps(c[1], c[5]), _mm512_add_ps(c[3], c[7])));
}

/* one row (a[p], p < k, a contiguous) x V <= 2 vectors of 16 columns (row p of vector v
   at bv[v] + p * bs[v]) into t[v * 16] */
TSR_AVX512 TSR_INLINE void gemv512_p8(int64_t k, const float* restrict a,
                                      const float* const* bv, const int64_t* bs,
                                      float* restrict t, int V) {
    __m512 s[2][8];
    const float* b[2] = {bv[0], bv[V - 1]};
    int64_t st[2] = {bs[0], bs[V - 1]};
    _Pragma("GCC unroll 16")
    for (int v = 0; v < V; v++)
        _Pragma("GCC unroll 16")
        for (int l = 0; l < 8; l++) s[v][l] = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p + 8 <= k; p += 8) {
        _Pragma("GCC unroll 16")
        for (int l = 0; l < 8; l++) {
            __m512 al = _mm512_set1_ps(a[p + l]);
            _Pragma("GCC unroll 16")
            for (int v = 0; v < V; v++) {
                /* B streams by faster than the hardware prefetcher ramps up */
                _mm_prefetch((const char*)(b[v] + (l + GEMV_AHEAD) * st[v]), _MM_HINT_T0);
                s[v][l] = _mm512_fmadd_ps(al, _mm512_loadu_ps(b[v] + l * st[v]), s[v][l]);
            }
        }
        _Pragma("GCC unroll 16")
        for (int v = 0; v < V; v++) b[v] += 8 * st[v];
    }
    for (int l = 0; p + l < k; l++) {
        __m512 al = _mm512_set1_ps(a[p + l]);
        _Pragma("GCC unroll 16")
        for (int v = 0; v < V; v++)
            s[v][l] = _mm512_fmadd_ps(al, _mm512_loadu_ps(b[v] + l * st[v]), s[v][l]);
    }
    _Pragma("GCC unroll 16")
    for (int v = 0; v < V; v++) _mm512_storeu_ps(t + 16 * v, gemv512_tree(s[v]));
}

/* one row (a: k floats, zero-padded to a multiple of 8) x the nc <= 8 columns whose p are
   contiguous at w + j * csb (a transposed B): 8 p of a column to a 256-bit register, each
   lane one of the column's eight chains (no shuffle in the loop: 256-bit FMAs outrun the
   memory); then the tree of gemv512_tree across the lanes, the columns back in order, into
   t[0..8) */
TSR_AVX2 TSR_INLINE void gemv_dot8(int64_t k, const float* restrict a,
                                       const float* restrict w, int64_t csb, int64_t nc,
                                       float* restrict t) {
    const float* col[8];
    _Pragma("GCC unroll 16")
    for (int j = 0; j < 8; j++) col[j] = w + (j < nc ? j : 0) * csb;
    __m256 s[8];
    _Pragma("GCC unroll 16")
    for (int j = 0; j < 8; j++) s[j] = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 16 <= k; p += 16) {   /* a line of each column per step */
        __m256 a0 = _mm256_loadu_ps(a + p), a1 = _mm256_loadu_ps(a + p + 8);
        _Pragma("GCC unroll 16")
        for (int j = 0; j < 8; j++) {
            _mm_prefetch((const char*)(col[j] + p + 64), _MM_HINT_T0);
            s[j] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(col[j] + p), s[j]);
        }
        _Pragma("GCC unroll 16")
        for (int j = 0; j < 8; j++)
            s[j] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(col[j] + p + 8), s[j]);
    }
    if (p + 8 <= k) {
        __m256 av = _mm256_loadu_ps(a + p);
        _Pragma("GCC unroll 16")
        for (int j = 0; j < 8; j++) s[j] = _mm256_fmadd_ps(av, _mm256_loadu_ps(col[j] + p), s[j]);
        p += 8;
    }
    if (p < k) {   /* the last p, zero-padded (a is too): + 0 leaves each chain as it is */
        float tail[8][8];
        memset(tail, 0, sizeof tail);
        for (int j = 0; j < 8; j++) memcpy(tail[j], col[j] + p, (size_t)(k - p) * sizeof(float));
        __m256 av = _mm256_loadu_ps(a + p);
        _Pragma("GCC unroll 16")
        for (int j = 0; j < 8; j++) s[j] = _mm256_fmadd_ps(av, _mm256_loadu_ps(tail[j]), s[j]);
    }
    /* c_l + c_{l+4}: 128-bit halves added, two columns to a register (u[i]: columns 2i,
       2i + 1 in its halves) */
    __m256 u[4], y[2];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 4; i++)
        u[i] = _mm256_add_ps(_mm256_permute2f128_ps(s[2 * i], s[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(s[2 * i], s[2 * i + 1], 0x31));
    /* + the element two along: half h of y[i] holds columns 4i + h and 4i + 2 + h */
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 2; i++)
        y[i] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44),
                             _mm256_shuffle_ps(u[2 * i], u[2 * i + 1], 0xEE));
    /* + the next element: half h holds columns h, 2 + h, 4 + h, 6 + h */
    __m256 r = _mm256_add_ps(_mm256_shuffle_ps(y[0], y[1], 0x88),
                             _mm256_shuffle_ps(y[0], y[1], 0xDD));
    _mm256_storeu_ps(t, _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3,
                                                                       7)));
}

/* what one row's GEMV starts with on either path: its row of A copied to buf past the
   tile, zero-padded to a multiple of 8 (gemv_dot8 reads 8 p at a time); then a transposed
   B, multiplied 8 columns at a time (gemv_dot8): 1 when that did the columns [j0, j1), 0
   when B's rows are for the path's own loop. Inlined into each path (its target's
   epilogue) */
TSR_AVX2 TSR_INLINE int gemv_one_start(const tsr_gemm_t* g, int64_t j0, int64_t j1,
                                       float* buf, epi_t* e) {
    int64_t K = g->k;
    float *t = buf, *a = buf + TILE_MAX;
    for (int64_t p = 0; p < K; p++) a[p] = g->a[p * g->csa];
    for (int64_t p = K; p % 8; p++) a[p] = 0.0f;
    if (g->bp || g->rsb != 1 || g->csb == 1) return 0;
    for (int64_t j = j0; j < j1; j += 8) {
        int64_t nc = j1 - j < 8 ? j1 - j : 8;
        gemv_dot8(K, a, g->b + j * g->csb, g->csb, nc, t);
        gemv_update(g, e, t, 8, j, nc);
    }
    return 1;
}

/* the columns [j0, j1) of one row (see gemv512_tree) */
TSR_AVX512_FMA static void gemv512_one(const tsr_gemm_t* g, int64_t j0, int64_t j1, float* buf) {
    epi_t e = gemv_epi(g);
    if (gemv_one_start(g, j0, j1, buf, &e)) return;
    int64_t K = g->k;
    float *t = buf, *a = buf + TILE_MAX, *strips = a + (K + 15) / 16 * 16;
    for (int64_t j = j0; j < j1; j += NR_512) {
        int64_t bs, nc = j1 - j < NR_512 ? j1 - j : NR_512;
        const float* src = gemv_strip(g, j, NR_512, TSR_GEMM_AVX512, strips, &bs);
        const float* bv[2] = {src, src + 16};
        int64_t bss[2] = {bs, bs};
        gemv512_p8(K, a, bv, bss, t, nc > 16 ? 2 : 1);
        gemv_update(g, &e, t, NR_512, j, nc);
    }
}


/* AVX2: gemv512_tree's order, 8 columns to a register */
TSR_AVX2 TSR_INLINE __m256 gemv256_tree(const __m256* c) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c[0], c[4]), _mm256_add_ps(c[2], c[6])),
                         _mm256_add_ps(_mm256_add_ps(c[1], c[5]), _mm256_add_ps(c[3], c[7])));
}

/* rows [p0, p1) of one row of A (contiguous) x 8 columns whose row p is at b + p * bs, into
   the eight chains s8 (p0 a multiple of 8): a panel's last 8 columns or fewer */
TSR_AVX2 TSR_INLINE void gemv256_p8(int64_t p0, int64_t p1, const float* restrict a,
                                    const float* restrict b, int64_t bs, __m256* restrict s8) {
    __m256 s[8];
    _Pragma("GCC unroll 16")
    for (int l = 0; l < 8; l++) s[l] = s8[l];
    int64_t p = p0;
    for (b += p0 * bs; p + 8 <= p1; p += 8, b += 8 * bs)
        _Pragma("GCC unroll 16")
        for (int l = 0; l < 8; l++) {
            _mm_prefetch((const char*)(b + (l + GEMV_AHEAD) * bs), _MM_HINT_T0);
            s[l] = _mm256_fmadd_ps(_mm256_set1_ps(a[p + l]), _mm256_loadu_ps(b + l * bs), s[l]);
        }
    for (int l = 0; p + l < p1; l++)
        s[l] = _mm256_fmadd_ps(_mm256_set1_ps(a[p + l]), _mm256_loadu_ps(b + l * bs), s[l]);
    _Pragma("GCC unroll 16")
    for (int l = 0; l < 8; l++) s8[l] = s[l];
}

/* the same for 16 columns (a panel) at once: sixteen chains fill the registers, and the
   broadcast of a[p] is one of B's operands instead */
TSR_AVX2 TSR_INLINE void gemv256_p16(int64_t k, const float* restrict a,
                                     const float* restrict b, int64_t bs,
                                     __m256* restrict lo8, __m256* restrict hi8) {
    __m256 s[16];
    _Pragma("GCC unroll 16")
    for (int l = 0; l < 16; l++) s[l] = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 8 <= k; p += 8, b += 8 * bs)
        _Pragma("GCC unroll 16")
        for (int l = 0; l < 8; l++) {
            _mm_prefetch((const char*)(b + (l + GEMV_AHEAD) * bs), _MM_HINT_T0);
            __m256 al = _mm256_set1_ps(a[p + l]);
            s[l] = _mm256_fmadd_ps(al, _mm256_loadu_ps(b + l * bs), s[l]);
            s[8 + l] = _mm256_fmadd_ps(al, _mm256_loadu_ps(b + l * bs + 8), s[8 + l]);
        }
    for (int l = 0; p + l < k; l++) {
        __m256 al = _mm256_set1_ps(a[p + l]);
        s[l] = _mm256_fmadd_ps(al, _mm256_loadu_ps(b + l * bs), s[l]);
        s[8 + l] = _mm256_fmadd_ps(al, _mm256_loadu_ps(b + l * bs + 8), s[8 + l]);
    }
    _Pragma("GCC unroll 16")
    for (int l = 0; l < 8; l++) {
        lo8[l] = s[l];
        hi8[l] = s[8 + l];
    }
}

/* the columns [j0, j1) of one row on AVX2, a panel (16 columns) at a time */
TSR_AVX2 static void gemv256_one(const tsr_gemm_t* g, int64_t j0, int64_t j1, float* buf) {
    epi_t e = gemv_epi(g);
    if (gemv_one_start(g, j0, j1, buf, &e)) return;
    int64_t K = g->k;
    float *t = buf, *a = buf + TILE_MAX, *strips = a + (K + 15) / 16 * 16;
    for (int64_t j = j0; j < j1; j += NR_256) {
        int64_t bs, nc = j1 - j < NR_256 ? j1 - j : NR_256;
        const float* src = gemv_strip(g, j, NR_256, TSR_GEMM_AVX2, strips, &bs);
        __m256 s[2][8];
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 8; l++) s[h][l] = _mm256_setzero_ps();
        if (nc > 8) gemv256_p16(K, a, src, bs, s[0], s[1]);
        else gemv256_p8(0, K, a, src, bs, s[0]);
        _mm256_storeu_ps(t, gemv256_tree(s[0]));
        _mm256_storeu_ps(t + 8, gemv256_tree(s[1]));
        gemv_update(g, &e, t, NR_256, j, nc);
    }
}

/* 16 x 16 in registers: x[q] lane i = x[i] lane q before (transpose16's shuffles) */
TSR_AVX512 TSR_INLINE void transpose16_regs(__m512* x) {
    __m512 t[16], u[16];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]);
    }
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    _Pragma("GCC unroll 16")
    for (int c = 0; c < 4; c++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
        __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
        __m512 w0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        __m512 w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
        x[c] = _mm512_shuffle_f32x4(v0, w0, 0x88);
        x[4 + c] = _mm512_shuffle_f32x4(v1, w1, 0x88);
        x[8 + c] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
        x[12 + c] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
    }
}

/* R rows x the nc <= 16 columns whose rows (p contiguous) start at w, csb apart: a
   transposed B, 16 x 16 blocks transposed in registers into the order gemv512_p sums in */
TSR_AVX512 TSR_INLINE void gemv512_t(int64_t k, const float* restrict a, int64_t ars,
                                     int64_t acs, const float* restrict w, int64_t csb,
                                     int64_t nc, float* restrict t, int64_t ldt, int R) {
    __m512 s[GEMV_MAX][2];
    _Pragma("GCC unroll 16")
    for (int r = 0; r < R; r++) s[r][0] = s[r][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; p += 16) {
        int64_t kb = k - p < 16 ? k - p : 16;
        __mmask16 mask = (__mmask16)((1u << kb) - 1);
        __m512 x[16];
        _Pragma("GCC unroll 16")
        for (int i = 0; i < 16; i++)
            x[i] = i < nc ? _mm512_maskz_loadu_ps(mask, w + i * csb + p) : _mm512_setzero_ps();
        if (p + 16 < k)
            _Pragma("GCC unroll 16")
            for (int i = 0; i < 16; i++)
                if (i < nc) _mm_prefetch((const char*)(w + i * csb + p + 64), _MM_HINT_T0);
        transpose16_regs(x);
        if (kb == 16) {
            _Pragma("GCC unroll 16")
            for (int q = 0; q < 16; q++)
                _Pragma("GCC unroll 16")
                for (int r = 0; r < R; r++)
                    s[r][q & 1] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * ars + (p + q) * acs]),
                                                  x[q], s[r][q & 1]);
        } else {
            _Pragma("GCC unroll 16")
            for (int q = 0; q < kb; q++)
                _Pragma("GCC unroll 16")
                for (int r = 0; r < R; r++)
                    s[r][q & 1] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * ars + (p + q) * acs]),
                                                  x[q], s[r][q & 1]);
        }
    }
    _Pragma("GCC unroll 16")
    for (int r = 0; r < R; r++) _mm512_storeu_ps(t + r * ldt, _mm512_add_ps(s[r][0], s[r][1]));
}

/* the same with AVX2: 8 x 8 blocks */
TSR_AVX2 TSR_INLINE void gemv256_t(int64_t k, const float* restrict a, int64_t ars,
                                   int64_t acs, const float* restrict w, int64_t csb,
                                   int64_t nc, float* restrict t, int64_t ldt, int R) {
    static const int32_t ramp[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    __m256 s[GEMV_MAX][2];
    _Pragma("GCC unroll 16")
    for (int r = 0; r < R; r++) s[r][0] = s[r][1] = _mm256_setzero_ps();
    for (int64_t p = 0; p < k; p += 8) {
        int64_t kb = k - p < 8 ? k - p : 8;
        __m256i mask = _mm256_loadu_si256((const __m256i*)(ramp + 8 - kb));
        __m256 x[8], u[8], o[8];
        _Pragma("GCC unroll 16")
        for (int i = 0; i < 8; i++)
            x[i] = i >= nc ? _mm256_setzero_ps() : kb == 8 ? _mm256_loadu_ps(w + i * csb + p)
                   : _mm256_maskload_ps(w + i * csb + p, mask);
        _Pragma("GCC unroll 16")
        for (int i = 0; i < 4; i++) {
            u[2 * i] = _mm256_unpacklo_ps(x[2 * i], x[2 * i + 1]);
            u[2 * i + 1] = _mm256_unpackhi_ps(x[2 * i], x[2 * i + 1]);
        }
        _Pragma("GCC unroll 16")
        for (int i = 0; i < 2; i++) {
            x[4 * i] = _mm256_shuffle_ps(u[4 * i], u[4 * i + 2], 0x44);
            x[4 * i + 1] = _mm256_shuffle_ps(u[4 * i], u[4 * i + 2], 0xEE);
            x[4 * i + 2] = _mm256_shuffle_ps(u[4 * i + 1], u[4 * i + 3], 0x44);
            x[4 * i + 3] = _mm256_shuffle_ps(u[4 * i + 1], u[4 * i + 3], 0xEE);
        }
        _Pragma("GCC unroll 16")
        for (int c = 0; c < 4; c++) {
            o[c] = _mm256_permute2f128_ps(x[c], x[4 + c], 0x20);
            o[4 + c] = _mm256_permute2f128_ps(x[c], x[4 + c], 0x31);
        }
        _Pragma("GCC unroll 16")
        for (int q = 0; q < kb; q++)
            _Pragma("GCC unroll 16")
            for (int r = 0; r < R; r++)
                s[r][q & 1] = _mm256_fmadd_ps(_mm256_set1_ps(a[r * ars + (p + q) * acs]), o[q],
                                              s[r][q & 1]);
    }
    _Pragma("GCC unroll 16")
    for (int r = 0; r < R; r++) _mm256_storeu_ps(t + r * ldt, _mm256_add_ps(s[r][0], s[r][1]));
}
#endif

/* the portable path: any strides of B (a packed panel is rows NR_P apart), columns
   [0, nc <= NR_P) */
static void gemv_portable_cols(int64_t k, const float* restrict a, int64_t ars, int64_t acs,
                               int R, const float* restrict b, int64_t rs, int64_t cs,
                               int64_t nc, float* restrict t, int64_t ldt) {
    float s0[GEMV_MAX][NR_P] = {{0}}, s1[GEMV_MAX][NR_P] = {{0}};
    int64_t p = 0;
    for (; p + 2 <= k; p += 2)
        _Pragma("GCC unroll 16")
        for (int r = 0; r < R; r++) {
            float a0 = a[r * ars + p * acs], a1 = a[r * ars + (p + 1) * acs];
            for (int64_t j = 0; j < nc; j++) {
                s0[r][j] += a0 * b[p * rs + j * cs];
                s1[r][j] += a1 * b[(p + 1) * rs + j * cs];
            }
        }
    if (p < k)
        _Pragma("GCC unroll 16")
        for (int r = 0; r < R; r++)
            for (int64_t j = 0; j < nc; j++) s0[r][j] += a[r * ars + p * acs] * b[p * rs + j * cs];
    _Pragma("GCC unroll 16")
    for (int r = 0; r < R; r++)
        for (int64_t j = 0; j < nc; j++) t[r * ldt + j] = s0[r][j] + s1[r][j];
}

/* columns [j0, j1) of C; buf: the tile (TILE_MAX floats), a copy of a row of A (k floats
   rounded up to 16), then GEMV_STRIPS * NR * k floats for strips packed on the way */
static void gemv_portable(const tsr_gemm_t* g, int64_t j0, int64_t j1, float* buf) {
    epi_t e = gemv_epi(g);
    float* t = buf;
    int R = (int)g->m;
    for (int64_t j = j0; j < j1; j += NR_P) {
        int64_t nc = j1 - j < NR_P ? j1 - j : NR_P;
        if (g->bp)
            gemv_portable_cols(g->k, g->a, g->rsa, g->csa, R, g->bp + j * g->k, NR_P, 1, nc, t,
                               NR_P);
        else
            gemv_portable_cols(g->k, g->a, g->rsa, g->csa, R, g->b + j * g->csb, g->rsb,
                               g->csb, nc, t, NR_P);
        gemv_update(g, &e, t, NR_P, j, nc);
    }
}

#if TSR_X86
/* vectors of W columns per call, by rows: as many accumulators as the registers hold */
#define TSR_GEMV_DRIVER(NAME, ATTR, P, T, W, NR, ISA, VECS, ONE)                               \
ATTR static void NAME(const tsr_gemm_t* g, int64_t j0, int64_t j1, float* buf) {            \
    static const int vecs[GEMV_MAX + 1] = VECS;                                              \
    epi_t e = gemv_epi(g);                                                                   \
    int R = (int)g->m;                                                                       \
    int64_t K = g->k;                                                                        \
    float *t = buf, *strips = buf + TILE_MAX + (K + 15) / 16 * 16;                           \
    ONE                                                                                      \
    if (!g->bp && g->rsb == 1 && g->csb != 1) {   /* a transposed B */                       \
        for (int64_t j = j0; j < j1; j += W) {                                               \
            int64_t nc = j1 - j < W ? j1 - j : W;                                            \
            switch (R) {                                                                     \
            case 1: T(K, g->a, g->rsa, g->csa, g->b + j * g->csb, g->csb, nc, t, W, 1); break;\
            case 2: T(K, g->a, g->rsa, g->csa, g->b + j * g->csb, g->csb, nc, t, W, 2); break;\
            case 3: T(K, g->a, g->rsa, g->csa, g->b + j * g->csb, g->csb, nc, t, W, 3); break;\
            default: T(K, g->a, g->rsa, g->csa, g->b + j * g->csb, g->csb, nc, t, W, 4);     \
            }                                                                                \
            gemv_update(g, &e, t, W, j, nc);                                                 \
        }                                                                                    \
        return;                                                                              \
    }                                                                                        \
    int V = vecs[R];                                                                         \
    for (int64_t j = j0; j < j1; j += (int64_t)V * W) {                                      \
        const float* bv[GEMV_VMAX] = {NULL};                                                 \
        int64_t bs[GEMV_VMAX] = {0}, strip = -1, sbs = 0;                                    \
        const float* src = NULL;                                                             \
        _Pragma("GCC unroll 16")                                                            \
        for (int v = 0; v < V; v++) {                                                        \
            int64_t c = j + v * W < j1 ? j + v * W : j;   /* past the end: any vector */     \
            if (c / NR != strip) {                                                           \
                strip = c / NR;                                                              \
                src = gemv_strip(g, strip * NR, NR, ISA, strips + (c - j) / NR * NR * K,          \
                                 &sbs);                                                      \
            }                                                                                \
            bv[v] = src + c % NR;                                                            \
            bs[v] = sbs;                                                                     \
        }                                                                                    \
        int64_t ldt = (int64_t)V * W;                                                        \
        switch (R * 8 + V) {                                                                 \
        case 8 + 4: P(K, g->a, g->rsa, g->csa, bv, bs, t, ldt, 1, 4); break;                \
        case 8 + 2: P(K, g->a, g->rsa, g->csa, bv, bs, t, ldt, 1, 2); break;                \
        case 16 + 4: P(K, g->a, g->rsa, g->csa, bv, bs, t, ldt, 2, 4); break;               \
        case 16 + 2: P(K, g->a, g->rsa, g->csa, bv, bs, t, ldt, 2, 2); break;               \
        case 24 + 2: P(K, g->a, g->rsa, g->csa, bv, bs, t, ldt, 3, 2); break;               \
        case 24 + 1: P(K, g->a, g->rsa, g->csa, bv, bs, t, ldt, 3, 1); break;               \
        case 32 + 2: P(K, g->a, g->rsa, g->csa, bv, bs, t, ldt, 4, 2); break;               \
        default: P(K, g->a, g->rsa, g->csa, bv, bs, t, ldt, 4, 1);                           \
        }                                                                                    \
        gemv_update(g, &e, t, ldt, j, j1 - j < ldt ? j1 - j : ldt);                          \
    }                                                                                        \
}
#define TSR_VECS512 {0, 4, 4, 2, 2}
#define TSR_VECS256 {0, 4, 2, 1, 1}
TSR_GEMV_DRIVER(gemv_avx512, TSR_AVX512, gemv512_p, gemv512_t, 16, NR_512, TSR_GEMM_AVX512,
                TSR_VECS512, if (R == 1) { gemv512_one(g, j0, j1, buf); return; })
TSR_GEMV_DRIVER(gemv_avx2, TSR_AVX2, gemv256_p, gemv256_t, 8, NR_256, TSR_GEMM_AVX2,
                TSR_VECS256, if (R == 1) { gemv256_one(g, j0, j1, buf); return; })
typedef void (*gemv_fn)(const tsr_gemm_t*, int64_t, int64_t, float*);
static const gemv_fn GEMVS[TSR_GEMM_ISAS] = {gemv_portable, gemv_avx2, gemv_avx512};
#else
typedef void (*gemv_fn)(const tsr_gemm_t*, int64_t, int64_t, float*);
static const gemv_fn GEMVS[TSR_GEMM_ISAS] = {gemv_portable, gemv_portable, gemv_portable};
#endif

/* ---- blocking and the driver -------------------------------------------------------- */

/* defaults, per path. BLIS sizes KC for a KC x NR panel of B to stay in L1; measured here
   (Zen 5, AVX-512), KC deeper than that is faster (fewer passes over C, longer runs of the
   micro-kernel) as long as MC x KC of A and the B panel fit L2 (1 MB), which streams them
   fast enough. KC x NC of B is a few MB of L3. */
static const int64_t KCS[TSR_GEMM_ISAS] = {256, 512, 1024};
static const int64_t MCS[TSR_GEMM_ISAS] = {128, 120, 168};
enum { NC_DEFAULT = 4096, IN_PLACE_MAX_PANELS = 4, FEW_B_FLOATS = 1 << 20,
       BALANCE_BLOCKS = 8, BALANCE_THREADS = 64 };

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }

/* when blocks of mc x nc finish if the threads take them in order, each as it comes free
   (the pool's counter): the largest of the threads' sums of block areas */
static int64_t finish(int64_t m, int64_t n, int64_t mc, int64_t nc, int threads) {
    int64_t load[BALANCE_THREADS] = {0}, most = 0;
    for (int64_t j0 = 0; j0 < n; j0 += nc)
        for (int64_t i0 = 0; i0 < m; i0 += mc) {
            int t = 0;
            for (int u = 1; u < threads; u++) t = load[u] < load[t] ? u : t;
            load[t] += (m - i0 < mc ? m - i0 : mc) * (n - j0 < nc ? n - j0 : nc);
            most = load[t] > most ? load[t] : most;
        }
    return most;
}

int64_t tsr_gemm_plan(tsr_gemm_t* g, int threads) {
    int isa = g->isa;
    if (isa < 0 || isa >= TSR_GEMM_ISAS || !tsr_gemm_isa_supported(isa)) return -1;
    int64_t MR = MRS[isa], NR = NRS[isa];
    g->path = 0;
    if (g->m > 0 && g->m <= GEMV_MAX && g->mc <= 0 && g->kc <= 0 && g->nc <= 0) {
        /* the GEMV path: one block of whole panels of columns per thread, which the pool
           gives the same thread from one call to the next (the caller block 0): its share
           of B stays in that core's cache (bench gemm: resnet18 fc batch 1, 2 MB of
           weight, two 1 MB L2s). One block below GEMV_SPLIT_MIN */
        int64_t panels = ceil_div(g->n > 0 ? g->n : 1, NR);
        int split = threads > 1 && g->m * g->n * g->k >= GEMV_SPLIT_MIN;
        int64_t parts = split ? (panels < threads ? panels : threads) : 1;
        g->path = 1;
        g->mc = g->m;
        g->kc = g->k > 0 ? g->k : 1;
        g->nc = ceil_div(panels, parts) * NR;
        return ceil_div(panels * NR, g->nc);
    }
    /* KC blocks of equal depth (no short last one); one block for a few rows (A is small,
       B best streamed whole), then B packed on the fly a narrower NC block at a time. The
       depth depends on the shape only, never on B's packing or the threads: each element
       of C sums its products in one order whatever they are. */
    int few = g->m <= GEMV_MAX && g->kc <= 0;
    if (g->kc <= 0)
        g->kc = g->k <= 0 ? KCS[isa] : few ? g->k : ceil_div(g->k, ceil_div(g->k, KCS[isa]));
    int64_t mc = g->mc > 0 ? round_up(g->mc, MR) : MCS[isa];
    int64_t nc = g->nc > 0 ? round_up(g->nc, NR) : NC_DEFAULT;
    if (few && g->nc <= 0 && !g->bp && nc * g->kc > FEW_B_FLOATS)
        nc = FEW_B_FLOATS / g->kc / NR * NR > NR ? FEW_B_FLOATS / g->kc / NR * NR : NR;
    int64_t m = g->m > 0 ? g->m : 1, n = g->n > 0 ? g->n : 1;
    if (mc > round_up(m, MR)) mc = round_up(m, MR);
    if (nc > round_up(n, NR)) nc = round_up(n, NR);
    if (g->mc <= 0 || g->nc <= 0)   /* enough blocks for the threads: split the longer side */
        while (ceil_div(m, mc) * ceil_div(n, nc) < threads && (mc > MR || nc > NR)) {
            if (nc > NR && (nc >= mc || mc <= MR)) nc = round_up(ceil_div(nc, 2), NR);
            else mc = round_up(ceil_div(mc, 2), MR);
        }
    if (g->mc <= 0 && g->nc <= 0 && threads > 1 && threads <= BALANCE_THREADS &&
        ceil_div(m, mc) * ceil_div(n, nc) < BALANCE_BLOCKS * threads) {
        /* few blocks: the counts of each side, up to threads more, whose even blocks share
           out best. 196 rows as blocks of 168 and 28 leave one of two threads idle for most
           of the product (bench gemm: resnet18 conv4 3x3, 2 threads); blocks of 98 do not.
           More blocks only for a gain of 1 / 32 or more (each packs its part of A) */
        int64_t m0 = ceil_div(m, mc), n0 = ceil_div(n, nc), best = -1;
        for (int64_t bm = m0; bm <= m0 + threads; bm++)
            for (int64_t bn = n0; bn <= n0 + threads; bn++) {
                int64_t mc1 = round_up(ceil_div(m, bm), MR), nc1 = round_up(ceil_div(n, bn), NR);
                int64_t f = finish(m, n, mc1, nc1, threads);
                if (best < 0 || f + f / 32 < best) { best = f; mc = mc1; nc = nc1; }
            }
    }
    g->mc = mc;
    g->nc = nc;
    return ceil_div(m, mc) * ceil_div(n, nc);
}

/* the scratch of one thread: A block, B block, tile; kept for the thread's next product */
static _Thread_local float* scratch;
static _Thread_local int64_t scratch_floats;

static float* scratch_for(int64_t floats) {
    if (floats > scratch_floats) {
        free(scratch);
        scratch_floats = round_up(floats, 16 * 1024);
        scratch = aligned_alloc(64, scratch_floats * sizeof(float));
        if (!scratch) { scratch_floats = 0; return NULL; }
    }
    return scratch;
}

/* output rows of blocks [ib0, ib1) x the columns of block jb */
static void blocks(const tsr_gemm_t* g, int64_t jb, int64_t ib0, int64_t ib1, float* abuf,
                   float* bbuf, float* t) {
    int isa = g->isa;
    int64_t MR = MRS[isa], NR = NRS[isa], mc = g->mc, nc = g->nc, kc = g->kc, K = g->k;
    ukr_fn ukr = UKRS[isa];
    update_fn update = UPDATES[isa];
    int64_t j0 = jb * nc, nb = g->n - j0 < nc ? g->n - j0 : nc;
    int epilogue = g->bias || g->r || g->act != TSR_ACT_NONE;
    /* A read in place, unpacked, when its rows are contiguous: packing costs about as
       much as the multiplications when A meets few panels of B, and measurably more than
       it saves at any width, except where the MR rows read at once lie a multiple of 4 KB
       apart (they would then share one set of L1, and evict each other) */
    ukr_fn rows = ROWS[isa];
    int in_place = rows && g->csa == 1 && !(g->flags & TSR_GEMM_PACK_A) &&
                   ((g->flags & TSR_GEMM_IN_PLACE_A) || nb <= IN_PLACE_MAX_PANELS * NR ||
                    g->rsa % 1024 != 0);
    int bias_rows = (g->flags & TSR_GEMM_BIAS_ROWS) != 0;
    int in_registers = g->act == TSR_ACT_NONE || g->act == TSR_ACT_RELU ||
                       g->act == TSR_ACT_CLAMP;
    epi_t e = {g->alpha, g->beta, 0, 0, g->act, (g->flags & TSR_GEMM_RESIDUAL_FIRST) != 0,
               NULL, NULL, g->ldr, bias_rows, g->lo, g->hi};
    for (int64_t p0 = 0; p0 == 0 || p0 < K; p0 += kc) {
        int64_t kb = K - p0 < kc ? K - p0 : kc;
        const float* bp;
        int64_t bstride;
        if (g->bp) {
            bp = g->bp + j0 * K + p0 * NR;   /* panel j0 / NR of the whole packed B */
            bstride = NR * K;
        } else {
            pack_b(g->b, g->rsb, g->csb, j0, nb, p0, kb, (int)NR, isa, bbuf, NR * kb);
            bp = bbuf;
            bstride = NR * kb;
        }
        e.overwrite = p0 == 0 && g->beta == 0.0f;
        e.beta = p0 == 0 ? g->beta : 1.0f;
        e.last = p0 + kb >= K;
        /* C = acc or C += acc: the micro-kernel writes C, an epilogue follows in cache */
        int direct = g->alpha == 1.0f && (e.overwrite || e.beta == 1.0f);
        for (int64_t ib = ib0; ib < ib1; ib++) {
            int64_t i0 = ib * mc, mb = g->m - i0 < mc ? g->m - i0 : mc;
            /* in place, only the rows past the last full panel are packed (into panel 0),
               unless a kernel of that few rows reads them in place too */
            int64_t full = in_place ? mb / MR * MR : 0, tail = mb % MR;
            ukr_fn few = tail <= FEW_MAX ? (in_place ? FEW_ROWS : FEW)[isa][tail] : NULL;
            if (!(in_place && few))
                pack_a(g->a, g->rsa, g->csa, i0 + full, mb - full, p0, kb, (int)MR, abuf);
            const float* arow = g->a + i0 * g->rsa + p0;
            for (int64_t jr = 0; jr < nb; jr += NR) {
                int64_t nr = nb - jr < NR ? nb - jr : NR;
                const float* bq = bp + jr / NR * bstride;
                e.bias = g->bias && !bias_rows ? g->bias + j0 + jr : NULL;
                for (int64_t ir = 0; ir < mb; ir += MR) {
                    int64_t mr = mb - ir < MR ? mb - ir : MR;
                    if (g->bias && bias_rows) e.bias = g->bias + i0 + ir;
                    float* c = g->c + (i0 + ir) * g->ldc + j0 + jr;
                    e.r = g->r ? g->r + (i0 + ir) * g->ldr + j0 + jr : NULL;
                    ukr_fn f = ir < full ? rows : mr < MR && few ? few : ukr;
                    const float* a = ir < full || (f == few && in_place) ? arow + ir * g->rsa
                                     : abuf + (ir - full) * kb;
                    if (direct && (mr == MR || f == few) && nr == NR) {   /* straight into C */
                        ukr_epi_fn fe = !e.last || !epilogue || !in_registers ? NULL
                                        : f == ukr ? EPIS[isa] : f == rows ? EPI_ROWS[isa]
                                        : NULL;
                        if (fe) {
                            fe(kb, a, g->rsa, bq, c, g->ldc, !e.overwrite, &e);
                            continue;
                        }
                        f(kb, a, g->rsa, bq, c, g->ldc, !e.overwrite);
                        if (e.last && epilogue) update(NULL, c, g->ldc, mr, nr, &e);
                    } else {
                        f(kb, a, g->rsa, bq, t, NR, 0);
                        update(t, c, g->ldc, mr, nr, &e);
                    }
                }
            }
        }
    }
}

int64_t tsr_gemm_range(const tsr_gemm_t* g, int64_t lo, int64_t hi) {
    if (g->m <= 0 || g->n <= 0) return 0;
    /* not planned, or planned for a path this CPU lacks (tsr_gemm_plan said -1) */
    if (g->mc <= 0 || g->kc <= 0 || g->nc <= 0 || g->isa < 0 || g->isa >= TSR_GEMM_ISAS ||
        !tsr_gemm_isa_supported(g->isa)) return -1;
    if (g->path == 1) {
        int isa = g->isa;
        int strips = g->bp || (g->rsb == 1 && g->csb != 1) || isa == TSR_GEMM_PORTABLE ? 0
                     : GEMV_STRIPS;
        int64_t k = g->k > 0 ? g->k : 1;
        float* buf = scratch_for(TILE_MAX + round_up(k, 16) + strips * NRS[isa] * k);
        if (!buf) return -2;
        for (int64_t i = lo; i < hi; i++) {
            int64_t j0 = i * g->nc, j1 = j0 + g->nc < g->n ? j0 + g->nc : g->n;
            if (j0 < j1) GEMVS[isa](g, j0, j1, buf);
        }
        return 0;
    }
    int64_t nmb = ceil_div(g->m, g->mc), kc = g->kc < g->k ? g->kc : (g->k ? g->k : 1);
    int64_t afloats = round_up(g->mc * kc, 16), bfloats = g->bp ? 0 : round_up(g->nc * kc, 16);
    float* buf = scratch_for(afloats + bfloats + TILE_MAX);
    if (!buf) return -2;
    for (int64_t i = lo; i < hi;) {
        int64_t jb = i / nmb, ib0 = i % nmb, ib1 = ib0 + (hi - i) < nmb ? ib0 + (hi - i) : nmb;
        blocks(g, jb, ib0, ib1, buf, buf + afloats, buf + afloats + bfloats);
        i += ib1 - ib0;
    }
    return 0;
}

int tsr_gemm_run(tsr_gemm_t* g) {
    int64_t n = tsr_gemm_plan(g, 1);
    return n < 0 ? -1 : (int)tsr_gemm_range(g, 0, n);
}

/* one block on a pool's thread: ctx = {g, the last nonzero result} */
static int64_t gemm_item(const int64_t* ctx, int64_t i) {
    int64_t r = tsr_gemm_range((const tsr_gemm_t*)(intptr_t)ctx[0], i, i + 1);
    if (r) __atomic_store_n((int64_t*)(intptr_t)&ctx[1], r, __ATOMIC_RELAXED);
    return r;
}

int64_t tsr_gemm_exec(tsr_gemm_t* g, int threads, tsr_pool_run_fn run) {
    if (!run || threads < 1) threads = 1;
    int64_t blocks = tsr_gemm_plan(g, threads);
    if (blocks < 0) return -1;
    if (blocks < 2 || threads < 2) return tsr_gemm_range(g, 0, blocks);
    int64_t ctx[2] = {(int64_t)(intptr_t)g, 0};
    run(gemm_item, ctx, blocks, threads);
    return ctx[1];
}
