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
#define TSR_AVX512 __attribute__((target("avx512f,prefer-vector-width=512")))
#define TSR_AVX2 __attribute__((target("avx2,fma")))
#else
#define TSR_X86 0
#endif

enum { BR = 64, BC = 64, VW = 16 };

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));

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

int tsr_attn_isa_supported(int isa) {
    if (isa == TSR_ATTN_PORTABLE) return 1;
#if TSR_X86
    __builtin_cpu_init();
    if (isa == TSR_ATTN_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (isa == TSR_ATTN_AVX512) return __builtin_cpu_supports("avx512f");
#endif
    return 0;
}

int tsr_attn_isa_best(void) {
    for (int isa = TSR_ATTN_ISAS - 1; isa > 0; isa--)
        if (tsr_attn_isa_supported(isa)) return isa;
    return TSR_ATTN_PORTABLE;
}

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

/* keep[0..n) for the flat elements start.. of the weights */
static void keep_bits(const tsr_attn_t* t, uint64_t start, int64_t n, uint8_t* keep) {
    u128 inc = ((u128)t->rng[3] << 64) | t->rng[2];
    u128 s = pcg_advance(((u128)t->rng[1] << 64) | t->rng[0], inc, start >> 1);
    uint32_t thr = t->thr;
    int64_t i = 0;
    if (start & 1 && n > 0) {
        s = s * PCG_MULT + inc;
        keep[i++] = ((uint32_t)(pcg_out(s) >> 32) >> 8) >= thr;
    }
    while (i < n) {
        s = s * PCG_MULT + inc;
        uint64_t x = pcg_out(s);
        keep[i++] = ((uint32_t)x >> 8) >= thr;
        if (i < n) keep[i++] = ((uint32_t)(x >> 32) >> 8) >= thr;
    }
}

/* ---- tile products: c (m x n, ldc) += op(a) (m x k, a[i * ars + p * acs]) @ b (k x n, ldb);
   n a multiple of VW, b's rows padded to it -------------------------------------------- */

TSR_INLINE void mm_tile(int R, int NV, int64_t k, const float* a, int64_t ars, int64_t acs,
                        const float* b, int64_t ldb, float* c, int64_t ldc) {
    v16 acc[4][2];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < NV; j++) acc[i][j] = (v16){0};
    for (int64_t p = 0; p < k; p++) {
        const float* bp = b + p * ldb;
        v16 b0 = *(const v16u*)bp, b1 = NV > 1 ? (v16)(*(const v16u*)(bp + VW)) : b0;
        for (int i = 0; i < R; i++) {
            float ai = a[i * ars + p * acs];
            acc[i][0] += ai * b0;
            if (NV > 1) acc[i][1] += ai * b1;
        }
    }
    for (int i = 0; i < R; i++)
        for (int j = 0; j < NV; j++) {
            v16u* cp = (v16u*)(c + i * ldc + j * VW);
            *cp = *cp + acc[i][j];
        }
}

TSR_INLINE void mm_acc(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars,
                       int64_t acs, const float* b, int64_t ldb, float* c, int64_t ldc) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
        int64_t j = 0;
        for (; j + 2 * VW <= n; j += 2 * VW)
            mm_tile(4, 2, k, a + i * ars, ars, acs, b + j, ldb, c + i * ldc + j, ldc);
        if (j < n) mm_tile(4, 1, k, a + i * ars, ars, acs, b + j, ldb, c + i * ldc + j, ldc);
    }
    for (; i < m; i++) {
        int64_t j = 0;
        for (; j + 2 * VW <= n; j += 2 * VW)
            mm_tile(1, 2, k, a + i * ars, ars, acs, b + j, ldb, c + i * ldc + j, ldc);
        if (j < n) mm_tile(1, 1, k, a + i * ars, ars, acs, b + j, ldb, c + i * ldc + j, ldc);
    }
}

static inline int64_t pad(int64_t n) { return (n + VW - 1) / VW * VW; }

/* rows [j0, j0 + nc) of x (row stride rs, d columns) as columns of xt (d x BC), zero beyond */
TSR_INLINE void load_t(const float* x, int64_t rs, int64_t j0, int64_t nc, int64_t d,
                       float* xt) {
    for (int64_t e = 0; e < d; e++) {
        float* row = xt + e * BC;
        for (int64_t c = 0; c < nc; c++) row[c] = x[(j0 + c) * rs + e];
        for (int64_t c = nc; c < BC; c++) row[c] = 0.0f;
    }
}

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

/* ---- forward: one part is BR query rows of one batch entry --------------------------- */

TSR_INLINE int fwd_body(const tsr_attn_t* t, int64_t lo, int64_t hi) {
    int64_t L = t->L, S = t->S, E = t->E, Ev = t->Ev, evp = pad(Ev), qblocks = (L + BR - 1) / BR;
    size_t floats = (size_t)(E * BC + BC * evp + BR * BC + BR * evp + 2 * BR);
    float* kt = aligned_alloc(64, sizeof(float) * ((floats + 15) / 16 * 16));
    uint8_t* keep = malloc((size_t)BC);
    if (!kt || !keep) { free(kt); free(keep); return -2; }
    float *vp = kt + E * BC, *s = vp + BC * evp, *acc = s + BR * BC, *m = acc + BR * evp,
          *l = m + BR;
    for (int64_t part = lo; part < hi; part++) {
        int64_t b = part / qblocks, i0 = part % qblocks * BR, nr = L - i0 < BR ? L - i0 : BR;
        const float *q = t->q + t->qoff[b] + i0 * t->qrs, *k = t->k + t->koff[b],
                    *v = t->v + t->voff[b];
        for (int64_t r = 0; r < nr; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
        memset(acc, 0, sizeof(float) * (size_t)(nr * evp));
        int64_t jend = t->causal && i0 + nr < S ? i0 + nr : S;
        for (int64_t j0 = 0; j0 < jend; j0 += BC) {
            int64_t nc = jend - j0 < BC ? jend - j0 : BC;
            load_t(k, t->krs, j0, nc, E, kt);
            load_p(v, t->vrs, j0, nc, Ev, evp, vp);
            memset(s, 0, sizeof(float) * (size_t)(nr * BC));
            mm_acc(nr, BC, E, q, t->qrs, 1, kt, BC, s, BC);
            for (int64_t r = 0; r < nr; r++) {
                float* sr = s + r * BC;
                logits(t, b, i0 + r, j0, nc, sr);
                float mx = m[r];
                for (int64_t c = 0; c < nc; c++) mx = sr[c] > mx ? sr[c] : mx;
                if (mx == -INFINITY) {       /* nothing to attend to yet */
                    for (int64_t c = 0; c < BC; c++) sr[c] = 0.0f;
                    continue;
                }
                float alpha = tsr_expf(m[r] - mx), sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int64_t c = 0; c < nc; c++) {
                    float p = tsr_expf(sr[c] - mx);
                    sr[c] = p;
                    sum += p;
                }
                for (int64_t c = nc; c < BC; c++) sr[c] = 0.0f;
                l[r] = l[r] * alpha + sum;
                m[r] = mx;
                if (alpha != 1.0f) {
                    float* ar = acc + r * evp;
#pragma omp simd
                    for (int64_t e = 0; e < evp; e++) ar[e] *= alpha;
                }
                if (t->dropout) {
                    keep_bits(t, (uint64_t)((b * L + i0 + r) * S + j0), nc, keep);
                    for (int64_t c = 0; c < nc; c++) sr[c] = keep[c] ? sr[c] : 0.0f;
                }
            }
            mm_acc(nr, evp, nc, s, BC, 1, vp, evp, acc, evp);
        }
        float* o = t->o + (b * L + i0) * Ev;
        float* lse = t->lse + b * L + i0;
        for (int64_t r = 0; r < nr; r++) {
            float f = l[r] > 0.0f ? t->dscale / l[r] : 0.0f;
            for (int64_t e = 0; e < Ev; e++) o[r * Ev + e] = acc[r * evp + e] * f;
            lse[r] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
        }
    }
    free(kt);
    free(keep);
    return 0;
}

/* ---- backward: one part is one batch entry (its dK and dV sum over every row) -------- */

TSR_INLINE int bwd_body(const tsr_attn_t* t, int64_t lo, int64_t hi) {
    int64_t L = t->L, S = t->S, E = t->E, Ev = t->Ev, ep = pad(E), evp = pad(Ev);
    size_t floats = (size_t)(E * BC + Ev * BC + BC * ep + 2 * BC * ep + BC * evp +
                             2 * BR * ep + BR * evp + 3 * BR * BC + L);
    float* kt = aligned_alloc(64, sizeof(float) * ((floats + 15) / 16 * 16));
    uint8_t* keep = malloc((size_t)BC);
    if (!kt || !keep) { free(kt); free(keep); return -2; }
    float *vt = kt + E * BC, *kp = vt + Ev * BC, *dk = kp + BC * ep, *dv = dk + BC * ep,
          *qp = dv + BC * evp, *dop = qp + BR * ep, *s = dop + BR * evp, *dp = s + BR * BC,
          *ds = dp + BR * BC, *dqp = ds + BR * BC, *d = dqp + BR * ep;
    float scale = t->scale, dscale = t->dscale;
    for (int64_t b = lo; b < hi; b++) {
        const float *q = t->q + t->qoff[b], *k = t->k + t->koff[b], *v = t->v + t->voff[b],
                    *o = t->o + b * L * Ev, *go = t->dout + b * L * Ev, *lse = t->lse + b * L;
        float *dq = t->dq + b * L * E;
        for (int64_t i = 0; i < L; i++) {
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t e = 0; e < Ev; e++) acc += go[i * Ev + e] * o[i * Ev + e];
            d[i] = acc;
        }
        memset(dq, 0, sizeof(float) * (size_t)(L * E));
        for (int64_t j0 = 0; j0 < S; j0 += BC) {
            int64_t nc = S - j0 < BC ? S - j0 : BC;
            load_t(k, t->krs, j0, nc, E, kt);
            load_t(v, t->vrs, j0, nc, Ev, vt);
            load_p(k, t->krs, j0, nc, E, ep, kp);
            memset(dk, 0, sizeof(float) * (size_t)(BC * ep));
            memset(dv, 0, sizeof(float) * (size_t)(BC * evp));
            for (int64_t i0 = t->causal ? j0 : 0; i0 < L; i0 += BR) {
                int64_t nr = L - i0 < BR ? L - i0 : BR;
                load_p(q, t->qrs, i0, nr, E, ep, qp);
                load_p(go, Ev, i0, nr, Ev, evp, dop);
                memset(s, 0, sizeof(float) * (size_t)(nr * BC));
                memset(dp, 0, sizeof(float) * (size_t)(nr * BC));
                mm_acc(nr, BC, E, qp, ep, 1, kt, BC, s, BC);
                mm_acc(nr, BC, Ev, dop, evp, 1, vt, BC, dp, BC);
                for (int64_t r = 0; r < nr; r++) {
                    int64_t i = i0 + r;
                    float *sr = s + r * BC, *dpr = dp + r * BC, *dsr = ds + r * BC;
                    float li = lse[i], di = d[i];
                    if (li == -INFINITY) {   /* a row with nothing to attend to: no gradient */
                        memset(sr, 0, sizeof(float) * BC);
                        memset(dsr, 0, sizeof(float) * BC);
                        continue;
                    }
                    logits(t, b, i, j0, nc, sr);
                    if (t->dropout) keep_bits(t, (uint64_t)((b * L + i) * S + j0), nc, keep);
#pragma omp simd
                    for (int64_t c = 0; c < nc; c++) {
                        float p = tsr_expf(sr[c] - li);
                        float kd = t->dropout ? (keep[c] ? dscale : 0.0f) : dscale;
                        sr[c] = p * kd;                               /* dropped weights */
                        dsr[c] = p * (dpr[c] * kd - di) * scale;      /* d(scores) */
                    }
                    for (int64_t c = nc; c < BC; c++) { sr[c] = 0.0f; dsr[c] = 0.0f; }
                }
                /* dV += P^T dO, dK += dS^T Q, dQ += dS K */
                mm_acc(nc, evp, nr, s, 1, BC, dop, evp, dv, evp);
                mm_acc(nc, ep, nr, ds, 1, BC, qp, ep, dk, ep);
                memset(dqp, 0, sizeof(float) * (size_t)(nr * ep));
                mm_acc(nr, ep, nc, ds, BC, 1, kp, ep, dqp, ep);
                for (int64_t r = 0; r < nr; r++)   /* dQ's rows are E, not ep, apart */
                    for (int64_t e = 0; e < E; e++) dq[(i0 + r) * E + e] += dqp[r * ep + e];
            }
            float *gk = t->dk + (b * S + j0) * E, *gv = t->dv + (b * S + j0) * Ev;
            for (int64_t c = 0; c < nc; c++) {
                memcpy(gk + c * E, dk + c * ep, sizeof(float) * (size_t)E);
                memcpy(gv + c * Ev, dv + c * evp, sizeof(float) * (size_t)Ev);
            }
        }
    }
    free(kt);
    free(keep);
    return 0;
}

/* ---- one entry point per direction; the isa field picks the compiled body ------------- */

static int fwd_portable(const tsr_attn_t* t, int64_t lo, int64_t hi) {
    return fwd_body(t, lo, hi);
}
static int bwd_portable(const tsr_attn_t* t, int64_t lo, int64_t hi) {
    return bwd_body(t, lo, hi);
}
#if TSR_X86
TSR_AVX2 static int fwd_avx2(const tsr_attn_t* t, int64_t lo, int64_t hi) {
    return fwd_body(t, lo, hi);
}
TSR_AVX2 static int bwd_avx2(const tsr_attn_t* t, int64_t lo, int64_t hi) {
    return bwd_body(t, lo, hi);
}
TSR_AVX512 static int fwd_avx512(const tsr_attn_t* t, int64_t lo, int64_t hi) {
    return fwd_body(t, lo, hi);
}
TSR_AVX512 static int bwd_avx512(const tsr_attn_t* t, int64_t lo, int64_t hi) {
    return bwd_body(t, lo, hi);
}
#endif

int64_t tsr_attn_fwd_range(const tsr_attn_t* t, int64_t lo, int64_t hi) {
#if TSR_X86
    if (t->isa == TSR_ATTN_AVX512) return fwd_avx512(t, lo, hi);
    if (t->isa == TSR_ATTN_AVX2) return fwd_avx2(t, lo, hi);
#endif
    return fwd_portable(t, lo, hi);
}

int64_t tsr_attn_bwd_range(const tsr_attn_t* t, int64_t lo, int64_t hi) {
#if TSR_X86
    if (t->isa == TSR_ATTN_AVX512) return bwd_avx512(t, lo, hi);
    if (t->isa == TSR_ATTN_AVX2) return bwd_avx2(t, lo, hi);
#endif
    return bwd_portable(t, lo, hi);
}

/* the parts each direction splits into (the threads' unit of work) */
int64_t tsr_attn_fwd_parts(const tsr_attn_t* t) { return t->nb * ((t->L + BR - 1) / BR); }
