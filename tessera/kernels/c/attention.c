/* Fused scaled dot-product attention, forward and backward, in float32 (the Python side:
   tessera/kernels/attention.py). The T x T scores are never written: a block of BR query
   rows meets the keys BC at a time, the scores of one BR x BC tile live in L1, and the
   softmax runs online (the flash-attention recurrence: a running row maximum m and sum l,
   the output accumulator rescaled by e^(m_old - m_new) when the maximum grows). The
   forward keeps only the row's log-sum-exp, m + log l; the backward recomputes each tile's
   probabilities from it, with D_i = dO_i . O_i standing for the softmax's row sums.

   Dropout regenerates the unfused op's mask instead of storing it: tessera's dropout draws
   u from NumPy's PCG64 seeded with the op's seed, as float32 (the top 24 bits of each
   32-bit half of a 64-bit draw), in the row-major order of the weights, and keeps u >= p.
   The kernels run the same generator (its state and increment come from Python), jump to
   a row's first element with PCG's O(log n) advance, and compare the 24 bits to
   ceil(p 2^24): the same mask bit for bit, in the forward and again in the backward.

   The tile products are written with GCC's generic vectors (16 floats) and compiled once
   per instruction set under its target attribute (AVX-512: one register; AVX2 with FMA:
   two; baseline x86-64: four SSE registers), so the file builds for baseline x86-64 and
   picks the path at run time, as gemm.c does. */
#include "prelude.h"

#if defined(__x86_64__) || defined(__i386__)
#define TSR_X86 1
#include <immintrin.h>
#define TSR_AVX512 __attribute__((target("avx512f,prefer-vector-width=512")))
#define TSR_AVX2 __attribute__((target("avx2,fma")))
#else
#define TSR_X86 0
#endif

enum { BR = 64, BC = 64 };

typedef struct {
    int64_t nb, L, S, E, Ev;                     /* batch (all heads), rows, keys, dims */
    const float *q, *k, *v, *mask;               /* mask: additive, NULL for none */
    const int64_t *qoff, *koff, *voff, *moff;    /* each batch entry's first element */
    int64_t qrs, krs, vrs, mrs, mcs;             /* row strides; the mask's column stride */
    float *o, *lse;                              /* (nb, L, Ev) and (nb, L), contiguous */
    const float *dout;                           /* backward: (nb, L, Ev), contiguous */
    float *dq, *dk, *dv;                         /* (nb, L, E), (nb, S, E), (nb, S, Ev) */
    float scale, dscale;                         /* dscale: 1 / (1 - p), or 0 for p = 1 */
    int32_t causal, dropout, isa;
    uint32_t thr;                                /* keep iff (u32 >> 8) >= thr */
    uint64_t rng[4];                             /* PCG64 state lo, hi, increment lo, hi */
} tsr_attn_t;

enum { TSR_ATTN_PORTABLE = 0, TSR_ATTN_AVX2 = 1, TSR_ATTN_AVX512 = 2, TSR_ATTN_ISAS = 3 };

/* the paths are prelude.h's levels */
int tsr_attn_isa_supported(int isa) { return isa < TSR_ATTN_ISAS && tsr_isa_supported(isa); }
int tsr_attn_isa_best(void) { return tsr_isa_best(); }

/* ---- the dropout mask: NumPy's PCG64 (XSL-RR output, 128-bit LCG) ---------------------- */

typedef unsigned __int128 u128;
#define PCG_MULT (((u128)0x2360ED051FC65DA4ULL << 64) | 0x4385DF649FCCF645ULL)

static inline uint64_t pcg_out(u128 s) {
    uint64_t hi = (uint64_t)(s >> 64), x = hi ^ (uint64_t)s;
    unsigned rot = (unsigned)(hi >> 58);
    return (x >> rot) | (x << ((64 - rot) & 63));
}

/* the state delta steps on (Brown's jump: the LCG's affine map squared log2(delta) times) */
static u128 pcg_advance(u128 state, u128 inc, uint64_t delta) {
    u128 am = 1, ap = 0, cm = PCG_MULT, cp = inc;
    while (delta) {
        if (delta & 1) { am *= cm; ap = ap * cm + cp; }
        cp = (cm + 1) * cp;
        cm *= cm;
        delta >>= 1;
    }
    return am * state + ap;
}

/* keep[0..n) for the flat elements start.. of the weights: on where kept, else 0 */
static void keep_bits(const tsr_attn_t* t, uint64_t start, int64_t n, float on, float* keep) {
    u128 inc = ((u128)t->rng[3] << 64) | t->rng[2];
    u128 s = pcg_advance(((u128)t->rng[1] << 64) | t->rng[0], inc, start >> 1);
    uint32_t thr = t->thr;
    int64_t i = 0;
    if (start & 1 && n > 0) {
        s = s * PCG_MULT + inc;
        keep[i++] = ((uint32_t)(pcg_out(s) >> 32) >> 8) >= thr ? on : 0.0f;
    }
    while (i < n) {
        s = s * PCG_MULT + inc;
        uint64_t x = pcg_out(s);
        keep[i++] = ((uint32_t)x >> 8) >= thr ? on : 0.0f;
        if (i < n) keep[i++] = ((uint32_t)(x >> 32) >> 8) >= thr ? on : 0.0f;
    }
}

/* rows [j0, j0 + nc) of x (row stride rs, d columns) as columns of xt (d x BC), zero beyond;
   the columns from c0 and the rows from e0 on (those before: load_t8's blocks) */
TSR_INLINE void load_t_from(const float* x, int64_t rs, int64_t j0, int64_t nc, int64_t d,
                            float* xt, int64_t c0, int64_t e0) {
    for (int64_t c = 0; c < nc; c++) {   /* rows of x read in order */
        const float* row = x + (j0 + c) * rs;
        for (int64_t e = c < c0 ? e0 : 0; e < d; e++) xt[e * BC + c] = row[e];
    }
    for (int64_t e = 0; e < d; e++)
        for (int64_t c = nc; c < BC; c++) xt[e * BC + c] = 0.0f;
}

TSR_INLINE void load_t(const float* x, int64_t rs, int64_t j0, int64_t nc, int64_t d,
                       float* xt) {
    load_t_from(x, rs, j0, nc, d, xt, 0, 0);
}

#if TSR_X86
/* load_t with 8 x 8 blocks transposed in registers (pairs, 4 x 4 within lanes, then the two
   lanes, as gemm.c's transpose8), for the AVX2 and AVX-512 paths: copied a float at a time,
   the blocks of K took a tenth of the forward's time at head size 32 (MiniLM's) */
__attribute__((target("avx2,fma"))) static void load_t8(const float* x, int64_t rs, int64_t j0,
                                                      int64_t nc, int64_t d, float* xt) {
    int64_t c8 = nc / 8 * 8, e8 = d / 8 * 8;
    for (int64_t c0 = 0; c0 < c8; c0 += 8)
        for (int64_t e0 = 0; e0 < e8; e0 += 8) {
            const float* s = x + (j0 + c0) * rs + e0;
            __m256 r[8], t[8], u[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(s + i * rs);
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
            float* o = xt + e0 * BC + c0;
            for (int c = 0; c < 4; c++) {
                _mm256_storeu_ps(o + c * BC, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
                _mm256_storeu_ps(o + (4 + c) * BC, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
            }
        }
    load_t_from(x, rs, j0, nc, d, xt, c8, e8);   /* the columns and rows past the blocks */
}
#endif

/* rows [r0, r0 + nr) of x (row stride rs, d columns) into xp (rows dp apart, zero beyond d) */
TSR_INLINE void load_p(const float* x, int64_t rs, int64_t r0, int64_t nr, int64_t d,
                       int64_t dp, float* xp) {
    for (int64_t r = 0; r < nr; r++) {
        memcpy(xp + r * dp, x + (r0 + r) * rs, (size_t)d * sizeof(float));
        for (int64_t e = d; e < dp; e++) xp[r * dp + e] = 0.0f;
    }
}

/* the scores of row i (keys j0 .. j0 + nc) scaled, masked and made -inf where excluded */
TSR_INLINE void logits(const tsr_attn_t* t, int64_t b, int64_t i, int64_t j0, int64_t nc,
                       float* s) {
    float scale = t->scale;
#pragma omp simd
    for (int64_t c = 0; c < nc; c++) s[c] *= scale;
    if (t->mask) {
        const float* m = t->mask + t->moff[b] + i * t->mrs + j0 * t->mcs;
        int64_t mcs = t->mcs;
        for (int64_t c = 0; c < nc; c++) s[c] += m[c * mcs];
    }
    if (t->causal)
        for (int64_t c = i - j0 + 1 < 0 ? 0 : i - j0 + 1; c < nc; c++) s[c] = -INFINITY;
}

/* ---- the vector code per instruction set; the isa field picks one ------------------- */

#define TSR_CAT2(a, b) a##_##b
#define TSR_CAT(a, b) TSR_CAT2(a, b)
#define TSR_FN(name) TSR_CAT(name, TSR_SFX)

/* register tiles: 4 x 8 (8 of the 16 SSE registers), 6 x 16 (12 of AVX2's 16), 8 x 32 (16
   of AVX-512's 32), the rest for the broadcasts and the loads */
typedef float v4 __attribute__((vector_size(16)));
typedef float v4u __attribute__((vector_size(16), aligned(4), may_alias));
#define TSR_V v4
#define TSR_VU v4u
#define TSR_VW 4
#define TSR_SFX portable
#define TSR_TARGET
#define TSR_RT 4
#define TSR_NVT 2
#include "attention.h"
#undef TSR_V
#undef TSR_VU
#undef TSR_VW
#undef TSR_SFX
#undef TSR_TARGET
#undef TSR_RT
#undef TSR_NVT

#if TSR_X86
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
#define TSR_V v8
#define TSR_VU v8u
#define TSR_VW 8
#define TSR_SFX avx2
#define TSR_TARGET TSR_AVX2
#define TSR_RT 6
#define TSR_NVT 2
#define TSR_LOAD_T load_t8
#include "attention.h"
#undef TSR_LOAD_T
#undef TSR_V
#undef TSR_VU
#undef TSR_VW
#undef TSR_SFX
#undef TSR_TARGET
#undef TSR_RT
#undef TSR_NVT

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
#define TSR_V v16
#define TSR_VU v16u
#define TSR_VW 16
#define TSR_SFX avx512
#define TSR_TARGET TSR_AVX512
#define TSR_RT 8
#define TSR_NVT 2
#define TSR_LOAD_T load_t8
#include "attention.h"
#endif

int64_t tsr_attn_fwd_range(const tsr_attn_t* t, int64_t lo, int64_t hi) {
#if TSR_X86
    if (t->isa == TSR_ATTN_AVX512) return fwd_avx512(t, lo, hi);
    if (t->isa == TSR_ATTN_AVX2) return fwd_avx2(t, lo, hi);
#endif
    return fwd_portable(t, lo, hi);
}

#ifndef TSR_ATTN_FORWARD_ONLY
int64_t tsr_attn_bwd_range(const tsr_attn_t* t, int64_t lo, int64_t hi) {
#if TSR_X86
    if (t->isa == TSR_ATTN_AVX512) return bwd_avx512(t, lo, hi);
    if (t->isa == TSR_ATTN_AVX2) return bwd_avx2(t, lo, hi);
#endif
    return bwd_portable(t, lo, hi);
}
#endif

/* the parts each direction splits into (the threads' unit of work) */
int64_t tsr_attn_fwd_parts(const tsr_attn_t* t) { return t->nb * ((t->L + BR - 1) / BR); }
