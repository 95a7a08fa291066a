/* The vector part of c/attention.c, instantiated once per instruction set: the file that
   includes it defines TSR_V (a GCC vector of TSR_VW floats, the width of the target's
   registers: wider generic vectors go through memory), TSR_VU (its unaligned alias),
   TSR_FN(name) (the name with the set's suffix), TSR_TARGET (the target attribute) and the
   register tile TSR_RT x TSR_NVT vectors; TSR_LOAD_T, if defined, replaces load_t (the same
   result, faster). */

#ifdef TSR_LOAD_T
#define TSR_LOAD_T_FN TSR_LOAD_T
#else
#define TSR_LOAD_T_FN load_t
#endif

/* ---- tile products: c (m x n, ldc) += op(a) (m x k, a[i * ars + p * acs]) @ b (k x n, ldb);
   n a multiple of TSR_VW, b's rows padded to it -------------------------------------------- */

TSR_INLINE void TSR_FN(mm_tile)(int R, int NV, int64_t k, const float* a, int64_t ars, int64_t acs,
                        const float* b, int64_t ldb, float* c, int64_t ldc) {
    TSR_V acc[8][2];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < NV; j++) acc[i][j] = (TSR_V){0};
    for (int64_t p = 0; p < k; p++) {
        const float* bp = b + p * ldb;
        TSR_V b0 = *(const TSR_VU*)bp, b1 = NV > 1 ? (TSR_V)(*(const TSR_VU*)(bp + TSR_VW)) : b0;
        for (int i = 0; i < R; i++) {
            float ai = a[i * ars + p * acs];
            acc[i][0] += ai * b0;
            if (NV > 1) acc[i][1] += ai * b1;
        }
    }
    for (int i = 0; i < R; i++)
        for (int j = 0; j < NV; j++) {
            TSR_VU* cp = (TSR_VU*)(c + i * ldc + j * TSR_VW);
            *cp = *cp + acc[i][j];
        }
}

/* RT x (NVT * TSR_VW) register tiles (the widest that fit the registers), then single rows and
   single vectors at the edges */
TSR_INLINE void TSR_FN(mm_acc)(int RT, int NVT, int64_t m, int64_t n, int64_t k, const float* a,
                       int64_t ars, int64_t acs, const float* b, int64_t ldb, float* c,
                       int64_t ldc) {
    int64_t i = 0;
    for (; i + RT <= m; i += RT) {
        int64_t j = 0;
        for (; j + NVT * TSR_VW <= n; j += NVT * TSR_VW)
            TSR_FN(mm_tile)(RT, NVT, k, a + i * ars, ars, acs, b + j, ldb, c + i * ldc + j, ldc);
        for (; j < n; j += TSR_VW)
            TSR_FN(mm_tile)(RT, 1, k, a + i * ars, ars, acs, b + j, ldb, c + i * ldc + j, ldc);
    }
    /* the rows past the last full tile as one tile of that many rows (a constant for each
       case, so that its accumulators stay in registers): row by row, two chains of FMAs
       each would wait on the FMA's latency (64 query rows on AVX2: 10 tiles of 6, and 4
       rows that took as long as 16) */
    int64_t rest = m - i;
    if (rest > 0 && rest < RT) {
#define TSR_REST(R)                                                                         \
        case R: {                                                                           \
            int64_t j = 0;                                                                  \
            for (; j + 2 * TSR_VW <= n; j += 2 * TSR_VW)                                    \
                TSR_FN(mm_tile)(R, 2, k, a + i * ars, ars, acs, b + j, ldb, c + i * ldc + j, \
                                ldc);                                                       \
            if (j < n)                                                                      \
                TSR_FN(mm_tile)(R, 1, k, a + i * ars, ars, acs, b + j, ldb, c + i * ldc + j, \
                                ldc);                                                       \
            break;                                                                          \
        }
        switch (rest) {
        TSR_REST(1) TSR_REST(2) TSR_REST(3) TSR_REST(4) TSR_REST(5) TSR_REST(6) TSR_REST(7)
        default: break;
        }
#undef TSR_REST
    }
}

static inline int64_t TSR_FN(pad)(int64_t n) { return (n + TSR_VW - 1) / TSR_VW * TSR_VW; }

/* ---- forward: one part is BR query rows of one batch entry --------------------------- */

TSR_INLINE int TSR_FN(fwd_body)(const tsr_attn_t* t, int64_t lo, int64_t hi, int RT, int NVT) {
    int64_t L = t->L, S = t->S, E = t->E, Ev = t->Ev, evp = TSR_FN(pad)(Ev), qblocks = (L + BR - 1) / BR;
    size_t floats = (size_t)(E * BC + BC * evp + BR * BC + BR * evp + 2 * BR);
    float* kt = aligned_alloc(64, sizeof(float) * ((floats + 15) / 16 * 16));
    float* keep = malloc(sizeof(float) * BC);
    if (!kt || !keep) { free(kt); free(keep); return -2; }
    float *vp = kt + E * BC, *s = vp + BC * evp, *acc = s + BR * BC, *m = acc + BR * evp,
          *l = m + BR, mxs[BR], alphas[BR];
    for (int64_t part = lo; part < hi; part++) {
        int64_t b = part / qblocks, i0 = part % qblocks * BR, nr = L - i0 < BR ? L - i0 : BR;
        const float *q = t->q + t->qoff[b] + i0 * t->qrs, *k = t->k + t->koff[b],
                    *v = t->v + t->voff[b];
        for (int64_t r = 0; r < nr; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
        memset(acc, 0, sizeof(float) * (size_t)(nr * evp));
        int64_t jend = t->causal && i0 + nr < S ? i0 + nr : S;
        for (int64_t j0 = 0; j0 < jend; j0 += BC) {
            int64_t nc = jend - j0 < BC ? jend - j0 : BC;
            TSR_LOAD_T_FN(k, t->krs, j0, nc, E, kt);
            load_p(v, t->vrs, j0, nc, Ev, evp, vp);
            memset(s, 0, sizeof(float) * (size_t)(nr * BC));
            TSR_FN(mm_acc)(RT, NVT, nr, BC, E, q, t->qrs, 1, kt, BC, s, BC);
            for (int64_t r = 0; r < nr; r++) {
                float* sr = s + r * BC;
                logits(t, b, i0 + r, j0, nc, sr);
                float mx = m[r];
#pragma omp simd reduction(max : mx)
                for (int64_t c = 0; c < nc; c++) mx = sr[c] > mx ? sr[c] : mx;
                mxs[r] = mx;
            }
            /* the rescale factors of every row at once: one exponential a row, scalar,
               cost as much as a tenth of the forward at head size 32 */
#pragma omp simd
            for (int64_t r = 0; r < nr; r++) alphas[r] = tsr_expf(m[r] - mxs[r]);
            for (int64_t r = 0; r < nr; r++) {
                float* sr = s + r * BC;
                float mx = mxs[r];
                if (mx == -INFINITY) {       /* nothing to attend to yet */
                    for (int64_t c = 0; c < BC; c++) sr[c] = 0.0f;
                    continue;
                }
                float alpha = alphas[r], sum = 0.0f;
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
                    keep_bits(t, (uint64_t)((b * L + i0 + r) * S + j0), nc, 1.0f, keep);
#pragma omp simd
                    for (int64_t c = 0; c < nc; c++) sr[c] *= keep[c];
                }
            }
            TSR_FN(mm_acc)(RT, NVT, nr, evp, nc, s, BC, 1, vp, evp, acc, evp);
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

#ifndef TSR_ATTN_FORWARD_ONLY   /* an inference build (tessera.deploy) leaves it out */
/* ---- backward: one part is one batch entry (its dK and dV sum over every row) -------- */

TSR_INLINE int TSR_FN(bwd_body)(const tsr_attn_t* t, int64_t lo, int64_t hi, int RT, int NVT) {
    int64_t L = t->L, S = t->S, E = t->E, Ev = t->Ev, ep = TSR_FN(pad)(E), evp = TSR_FN(pad)(Ev);
    size_t floats = (size_t)(E * BC + Ev * BC + BC * ep + 2 * BC * ep + BC * evp +
                             2 * BR * ep + BR * evp + 3 * BR * BC + L);
    float* kt = aligned_alloc(64, sizeof(float) * ((floats + 15) / 16 * 16));
    float* keep = malloc(sizeof(float) * BC);
    if (!kt || !keep) { free(kt); free(keep); return -2; }
    for (int c = 0; c < BC; c++) keep[c] = t->dscale;   /* without dropout: every weight */
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
            TSR_LOAD_T_FN(k, t->krs, j0, nc, E, kt);
            TSR_LOAD_T_FN(v, t->vrs, j0, nc, Ev, vt);
            load_p(k, t->krs, j0, nc, E, ep, kp);
            memset(dk, 0, sizeof(float) * (size_t)(BC * ep));
            memset(dv, 0, sizeof(float) * (size_t)(BC * evp));
            for (int64_t i0 = t->causal ? j0 : 0; i0 < L; i0 += BR) {
                int64_t nr = L - i0 < BR ? L - i0 : BR;
                load_p(q, t->qrs, i0, nr, E, ep, qp);
                load_p(go, Ev, i0, nr, Ev, evp, dop);
                memset(s, 0, sizeof(float) * (size_t)(nr * BC));
                memset(dp, 0, sizeof(float) * (size_t)(nr * BC));
                TSR_FN(mm_acc)(RT, NVT, nr, BC, E, qp, ep, 1, kt, BC, s, BC);
                TSR_FN(mm_acc)(RT, NVT, nr, BC, Ev, dop, evp, 1, vt, BC, dp, BC);
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
                    if (t->dropout) keep_bits(t, (uint64_t)((b * L + i) * S + j0), nc, dscale, keep);
#pragma omp simd
                    for (int64_t c = 0; c < nc; c++) {
                        float p = tsr_expf(sr[c] - li), kd = keep[c];
                        sr[c] = p * kd;                               /* dropped weights */
                        dsr[c] = p * (dpr[c] * kd - di) * scale;      /* d(scores) */
                    }
                    for (int64_t c = nc; c < BC; c++) { sr[c] = 0.0f; dsr[c] = 0.0f; }
                }
                /* dV += P^T dO, dK += dS^T Q, dQ += dS K */
                TSR_FN(mm_acc)(RT, NVT, nc, evp, nr, s, 1, BC, dop, evp, dv, evp);
                TSR_FN(mm_acc)(RT, NVT, nc, ep, nr, ds, 1, BC, qp, ep, dk, ep);
                memset(dqp, 0, sizeof(float) * (size_t)(nr * ep));
                TSR_FN(mm_acc)(RT, NVT, nr, ep, nc, ds, BC, 1, kp, ep, dqp, ep);
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

TSR_TARGET static int TSR_FN(bwd)(const tsr_attn_t* t, int64_t lo, int64_t hi) {
    return TSR_FN(bwd_body)(t, lo, hi, TSR_RT, TSR_NVT);
}
#endif

TSR_TARGET static int TSR_FN(fwd)(const tsr_attn_t* t, int64_t lo, int64_t hi) {
    return TSR_FN(fwd_body)(t, lo, hi, TSR_RT, TSR_NVT);
}
#undef TSR_LOAD_T_FN
