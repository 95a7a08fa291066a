/* The C prelude every generated translation unit starts with (tessera/kernels/prelude.py):
   headers and the helper functions the ops' C rules (OpDef.to_c) call.

   The transcendental functions are written out as branch-free range reduction plus
   polynomial, so that a `#pragma omp simd` loop calling them vectorises (a libm call keeps
   the loop scalar), in float32 and float64 alike; inf, NaN, overflow, subnormal results and
   -0 come out as libm's. Errors against NumPy over a dense sweep
   (tests/codegen/test_prelude_math.py):

   * tsr_exp: e^x = 2^n e^r, n = round(x / ln 2) from a 1.5 * 2^k shifter whose low bits are
     n (no float-to-int conversion), r by Cody-Waite, e^r - 1 by its Taylor polynomial
     (degree 7 / 13), 2^n applied as two normal factors so that subnormal results round once
     (<= 1.1 ulp). tsr_expm1 adds 2^n - 1 to 2^n (e^r - 1), keeping small results' digits
     (<= 2 ulp); tsr_sigmoid is e^-|x| based (<= 3 ulp, subnormal tail kept; float32 carries
     2^64 e^-|x| so that one power of two does and the tail rounds once); tsr_tanh is
     e / (e + 2) with e = expm1(2|x|) (<= 3 ulp, no cancellation near 0).
   * tsr_log: k ln 2 + log m, m in [sqrt(1/2), sqrt(2)) from the bits, Cephes' logf
     polynomial / fdlibm's log series (<= 1 ulp); tsr_log1p corrects log(1 + x) by
     (x - (u - 1)) / u (<= 1.5 ulp).
   * tsr_phif/tsr_erfcf/tsr_erff/tsr_gelu_gradf (float32): Phi(-a) = e^(-a^2/2) Q(a), where
     Q(a) = erfcx(a / sqrt2) / 2 is a degree-10 polynomial in t = 1 / (1 + 0.3 a), our
     float64 minimax fit (relative error 1.2e-8 on [0, 14.6]). Phi and erfc keep their
     relative accuracy far into the tail, where 1 - erf cancels (<= 6 ulp, most of it from
     evaluating Q near t = 1). -a^2/2 enters the exponential's range reduction exactly,
     through an fma, and the exponential and the division of t run side by side, so that
     the gelu loop is bound by its multiplies and fmas, not by an exponential of a
     polynomial with a hi + lo exponent (bench kernels: chain). erfc(z) = 2 Phi(-z sqrt2)
     with -z^2 taken from z; erf below 0.75 by an odd polynomial, our minimax fit
     (<= 2.5 ulp). gelu'(x) = Phi(x) + x phi(x) shares one exponential (<= 6 ulp of the
     larger term; the sum itself cancels near x = -0.75). float64 Phi, erf and erfc use
     libm. The eager NumPy float32 gelu kernel (ops.activation._phi_block) uses Numerical
     Recipes' fit: the same relative accuracy from another formula. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TSR_INLINE static inline __attribute__((always_inline))

/* The instruction sets of the kernel families that pick their path at run time (gemm.c,
   nchwc.c, attention.c; tessera.kernels.cc.ISA_LEVELS): 0 baseline, 1 AVX2 with FMA, 2
   AVX-512F. Whether this CPU runs level isa (libgcc's CPU model checks that the OS saves
   the wider registers, XCR0, too), and the widest level it runs. */
static inline int tsr_isa_supported(int isa) {
    if (isa == 0) return 1;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (isa == 1) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (isa == 2) return __builtin_cpu_supports("avx512f");
#endif
    return 0;
}

static inline int tsr_isa_best(void) {
    int isa = 2;
    while (isa > 0 && !tsr_isa_supported(isa)) isa--;
    return isa;
}

/* bit casts (memcpy: GCC turns these into register moves, in vector loops too) */
TSR_INLINE int32_t tsr_fbits(float f) { int32_t i; memcpy(&i, &f, sizeof i); return i; }
TSR_INLINE float tsr_bitsf(int32_t i) { float f; memcpy(&f, &i, sizeof f); return f; }
TSR_INLINE int64_t tsr_dbits(double f) { int64_t i; memcpy(&i, &f, sizeof i); return i; }
TSR_INLINE double tsr_bitsd(int64_t i) { double f; memcpy(&f, &i, sizeof f); return f; }
/* the power of two whose biased exponent is e (2^(e - 127), 2^(e - 1023)), shifted unsigned:
   a NaN's garbage e must not be a left shift of a negative number or into the sign bit (UB) */
TSR_INLINE float tsr_pow2f(int32_t e) { return tsr_bitsf((int32_t)((uint32_t)e << 23)); }
TSR_INLINE double tsr_pow2d(int64_t e) { return tsr_bitsd((int64_t)((uint64_t)e << 52)); }

/* ---- float32 ---------------------------------------------------------------------------- */

/* e^r - 1 for |r| <= ln2/2 + ulp: r + r^2 (1/2 + r/6 + ...), Taylor to r^7 (< 1e-8
   relative). Polynomials here use Estrin's scheme: a shorter dependency chain than Horner's,
   and these loops are bound by latency as much as by arithmetic */
TSR_INLINE float tsr_em1_polyf(float r) {
    float r2 = r * r;
    float p01 = fmaf(r, 1.66666667e-1f, 0.5f), p23 = fmaf(r, 8.33333333e-3f, 4.16666667e-2f);
    float p45 = fmaf(r, 1.98412698e-4f, 1.38888889e-3f);
    return fmaf(fmaf(r2, fmaf(r2, p45, p23), p01), r2, r);
}

/* e^r for |r| <= ln2/2 (+ rounding): 1 + r + r^2 P(r), P a quartic minimax fit of ours
   (float64 LP on a dense grid; relative error 3.8e-9 with these float32 coefficients, one
   degree below the Taylor polynomial above) */
TSR_INLINE float tsr_exp_polyf(float r) {
    float r2 = r * r;
    float p01 = fmaf(r, 1.66665211e-1f, 4.99999940e-1f);
    float p23 = fmaf(r, 8.36871658e-3f, 4.16683890e-2f);
    return fmaf(r2, fmaf(r2, fmaf(r2, 1.38145988e-3f, p23), p01), r) + 1.0f;
}

/* x = n ln2 + r: n = round(x / ln2) from the 1.5 * 2^23 shifter, whose low bits are n (no
   float-to-int conversion), r in two Cody-Waite steps */
#define TSR_REDUCEF(x, n, ni, r) \
    float n##_j = fmaf(x, 1.44269504088896341f, 12582912.0f); \
    float n = n##_j - 12582912.0f; \
    int32_t ni = tsr_fbits(n##_j) - 0x4B400000; \
    float r = fmaf(n, 2.12194440e-4f, fmaf(n, -0.693359375f, x))

/* p 2^n as two normal factors: subnormal results round once, n = 128 overflows to inf */
TSR_INLINE float tsr_scalef(float p, int32_t n) {
    int32_t a = n >> 1;
    return p * tsr_pow2f(a + 127) * tsr_pow2f(n - a + 127);
}

TSR_INLINE float tsr_expf(float x) {
    /* clamp so that n stays in [-150, 128]; written so a NaN passes through unchanged */
    x = 88.8f < x ? 88.8f : x;
    x = -104.0f > x ? -104.0f : x;
    TSR_REDUCEF(x, n, ni, r);
    return tsr_scalef(tsr_em1_polyf(r) + 1.0f, ni);
}

TSR_INLINE float tsr_expm1f(float x) {
    float xc = 88.8f < x ? 88.8f : x;
    xc = -30.0f > xc ? -30.0f : xc;   /* below -17.4, e^x - 1 rounds to -1 */
    TSR_REDUCEF(xc, n, ni, r);
    float em = tsr_em1_polyf(r);
    int32_t a = ni >> 1;
    float s1 = tsr_pow2f(a + 127), s2 = tsr_pow2f(ni - a + 127);
    float s = s1 * s2;
    /* 2^n (e^r - 1) + (2^n - 1) keeps the digits of small results; past n = 40 the -1 is
       below rounding and the exp form avoids 2^128 */
    float small = fmaf(s, em, s - 1.0f);
    float big = ((em + 1.0f) * s1) * s2;
    return x == 0.0f ? x : (ni > 40 ? big : small);   /* -0 stays -0 */
}

/* 1 / (1 + e^-|x|), times e^-|x| for x < 0. e^-|x| is carried as 2^64 e^-|x| (normal down
   to the clamp at -104, where e^x rounds to 0): one power of two from n's bits instead of
   tsr_scalef's two, and the tail's subnormal results round once, at the last product */
TSR_INLINE float tsr_sigmoidf(float x) {
    float y = -fabsf(x);
    y = -104.0f > y ? -104.0f : y;   /* a NaN passes */
    TSR_REDUCEF(y, n, ni, r);
    float e64 = tsr_exp_polyf(r) * tsr_pow2f(ni + 191);
    float s = 1.0f / fmaf(e64, 0x1p-64f, 1.0f);
    return x < 0.0f ? (e64 * s) * 0x1p-64f : s;
}

/* tanh|x| = e / (e + 2), e = expm1(2|x|): no cancellation near 0; 1 from |x| = 9.1 */
TSR_INLINE float tsr_tanhf(float x) {
    float a = fabsf(x);
    a = 9.1f < a ? 9.1f : a;
    float e = tsr_expm1f(a + a);
    return copysignf(e / (e + 2.0f), x);
}

/* log x = k ln2 + log m with m in [sqrt(1/2), sqrt(2)) taken from the bits (subnormals scaled
   by 2^23 first); log(1 + f) = f - f^2/2 + f^3 P(f), Cephes' logf coefficients */
TSR_INLINE float tsr_logf(float x) {
    int sub = x < 1.17549435e-38f;
    float xs = sub ? x * 8388608.0f : x;
    int32_t i = tsr_fbits(xs);
    int32_t k = (i - 0x3F3504F3) >> 23;
    float f = tsr_bitsf(i - (int32_t)((uint32_t)k << 23)) - 1.0f;   /* k < 0: unsigned shift */
    float e = (float)k - (sub ? 23.0f : 0.0f);
    float z = f * f;
    float z2 = z * z;
    float p01 = fmaf(f, -2.4999993993e-1f, 3.3333331174e-1f);
    float p23 = fmaf(f, -1.6668057665e-1f, 2.0000714765e-1f);
    float p45 = fmaf(f, -1.2420140846e-1f, 1.4249322787e-1f);
    float p67 = fmaf(f, -1.1514610310e-1f, 1.1676998740e-1f);
    float p = fmaf(z2, fmaf(z2, 7.0376836292e-2f, fmaf(z, p67, p45)), fmaf(z, p23, p01));
    float y = fmaf(e, -2.12194440e-4f, p * f * z);
    y = fmaf(-0.5f, z, y);
    float r = fmaf(e, 0.693359375f, f + y);
    return x > 0.0f ? (x < INFINITY ? r : x) : (x == 0.0f ? -INFINITY : NAN);
}

/* log(1 + x) = log u + (x - (u - 1)) / u, u = 1 + x (the quotient restores what rounding u
   lost) */
TSR_INLINE float tsr_log1pf(float x) {
    float u = 1.0f + x;
    float l = tsr_logf(u);
    float y = (u > 0.0f && u < INFINITY) ? l + (x - (u - 1.0f)) / u : l;
    return u == 1.0f ? x : y;
}

/* min(a, c) for a >= 0 and c > 0, compared as integers (a NaN gives c): GCC keeps this one
   integer min, where for a float select it folds the later products of the constant arm into
   a blend each */
TSR_INLINE float tsr_minbitsf(float a, float c) {
    int32_t i = tsr_fbits(a), j = tsr_fbits(c);
    return tsr_bitsf(i < j ? i : j);
}

/* 2^64 e^(h u) for h u in [-106, 0]: the rounded product only chooses n; r takes it exactly
   in an fma (n ln2hi is exact), so that the large exponents of the tail cost no accuracy
   (rounding -x^2/2 would cost up to 100 ulp there). The 2^64 keeps results normal down to
   e^-131: the caller applies 2^-64 last, rounding once */
TSR_INLINE float tsr_exp_hu64f(float h, float u) {
    float j = fmaf(h * u, 1.44269504088896341f, 12582912.0f);
    float n = j - 12582912.0f;
    float r = fmaf(n, 2.12194440e-4f, fmaf(h, u, n * -0.693359375f));
    return tsr_exp_polyf(r) * tsr_pow2f(tsr_fbits(j) - 0x4B400000 + 191);
}

/* s Q(a) with Q(a) = e^(a^2/2) Phi(-a) = erfcx(a / sqrt2) / 2 for a in [0, 14.6], as a
   polynomial in t = 1 / (1 + 0.3 a) (Q falls like 1/a: smooth in t). Our minimax fit (float64
   LP on a dense grid, coefficients rounded to float32 one at a time and the rest refitted):
   relative error 1.2e-8, and 0 at t = 0 (a = inf), so that past the fit Q stays >= 0. The
   power of two s folds into the coefficients and scales every step exactly */
TSR_INLINE float tsr_mills_polyf(float t, float s) {
    float t2 = t * t, t4 = t2 * t2;
    float p01 = t * (s * 0.1196867f), p23 = fmaf(t, s * 0.11023649f, s * 0.119571686f);
    float p45 = fmaf(t, s * 0.09616985f, s * 0.078384936f);
    float p67 = fmaf(t, s * 0.19181125f, s * -0.07944669f);
    float p89 = fmaf(t, s * 0.112443514f, s * -0.22823286f);
    float p = fmaf(t4, fmaf(t2, s * -0.020624876f, p89), fmaf(t2, p67, p45));
    return fmaf(t4, p, fmaf(t2, p23, p01));
}

/* Phi(x), the standard normal CDF: Phi(-|x|) = e^(-x^2/2) Q(|x|) with the exponential and
   the division of Q's t independent of each other (no exp of a polynomial, no hi + lo
   exponent). Phi(-14.5) is below the least subnormal; t takes the unclamped |x|, so that a
   NaN passes */
TSR_INLINE float tsr_phif(float x) {
    float a = fabsf(x), ac = tsr_minbitsf(a, 14.5f);
    float t = 1.0f / fmaf(a, 0.3f, 1.0f);
    float q = tsr_exp_hu64f(-0.5f * ac, ac) * tsr_mills_polyf(t, 0x1p-64f);   /* Phi(-|x|) */
    return x > 0.0f ? 1.0f - q : q;
}

/* gelu'(x) = Phi(x) + x phi(x) with one exponential: e^(-x^2/2) (Q + x / sqrt(2 pi)) for
   x <= 0, 1 + e^(-x^2/2) (x / sqrt(2 pi) - Q) above; +-inf give NaN, as Phi + x phi does */
TSR_INLINE float tsr_gelu_gradf(float x) {
    float a = fabsf(x), ac = tsr_minbitsf(a, 14.5f);
    float t = 1.0f / fmaf(a, 0.3f, 1.0f);
    float e = tsr_exp_hu64f(-0.5f * ac, ac) * 0x1p-64f;
    float q = tsr_mills_polyf(t, 1.0f);
    float v = e * fmaf(x, 0.398942280f, x > 0.0f ? -q : q);
    return x > 0.0f ? 1.0f + v : v + 0.0f;   /* + 0: -0 below -14.4 becomes Phi's +0 */
}

/* erfc(z) = 2 Phi(-z sqrt2) for z >= 0, the exponent -z^2 taken from z (a NaN passes) */
TSR_INLINE float tsr_erfc_posf(float z) {
    float zc = tsr_minbitsf(z, 10.3f);   /* erfc(10.3) is below the least subnormal */
    float t = 1.0f / fmaf(z, 0.424264069f, 1.0f);   /* 0.3 sqrt2 */
    return tsr_exp_hu64f(-zc, zc) * tsr_mills_polyf(t, 0x1p-63f);
}

/* erf: x P(x^2) below |x| = 0.75, P a minimax fit of ours (relative error 5.9e-8, most of it
   the float32 rounding of 2/sqrt(pi)), else 1 - erfc: erfc's error near 0.5 would cost erf
   ~3 ulp */
TSR_INLINE float tsr_erff(float x) {
    float x2 = x * x;
    float p = -1.1654327e-05f;   /* Horner: Estrin's order costs an ulp on this alternating sum */
    p = fmaf(p, x2, 1.1767507e-04f);
    p = fmaf(p, x2, -8.534827e-04f);
    p = fmaf(p, x2, 5.223623e-03f);
    p = fmaf(p, x2, -2.686612e-02f);
    p = fmaf(p, x2, 1.1283791e-01f);
    p = fmaf(p, x2, -3.7612638e-01f);
    p = fmaf(p, x2, 1.1283791e+00f);
    float a = fabsf(x);
    float big = copysignf(1.0f - tsr_erfc_posf(a), x);
    return a < 0.75f ? p * x : big;
}

TSR_INLINE float tsr_erfcf(float x) {
    float q = tsr_erfc_posf(fabsf(x));
    float small = 1.0f - tsr_erff(x);
    float e = x > 0.0f ? q : 2.0f - q;
    return fabsf(x) < 0.5f ? small : e;
}

/* ---- float64 ---------------------------------------------------------------------------- */

/* e^r - 1 for |r| <= ln2/2 + ulp: Taylor to r^13 (< 3e-18 relative) */
TSR_INLINE double tsr_em1_poly(double r) {
    double r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
    double p01 = fma(r, 0.16666666666666666, 0.5);
    double p23 = fma(r, 0.008333333333333333, 0.041666666666666664);
    double p45 = fma(r, 0.0001984126984126984, 0.001388888888888889);
    double p67 = fma(r, 2.7557319223985893e-06, 2.48015873015873e-05);
    double p89 = fma(r, 2.505210838544172e-08, 2.755731922398589e-07);
    double pab = fma(r, 1.6059043836821613e-10, 2.08767569878681e-09);
    double p = fma(r8, fma(r2, pab, p89), fma(r4, fma(r2, p67, p45), fma(r2, p23, p01)));
    return fma(p, r2, r);
}

/* as TSR_REDUCEF with the 1.5 * 2^52 shifter; ln2 split as its double and the remainder */
#define TSR_REDUCE(x, n, ni, r) \
    double n##_j = fma(x, 1.4426950408889634, 6755399441055744.0); \
    double n = n##_j - 6755399441055744.0; \
    int64_t ni = tsr_dbits(n##_j) - 0x4338000000000000LL; \
    double r = fma(n, -2.3190468138462996e-17, fma(n, -0.6931471805599453, x))

/* 2^a and 2^(n - a), a = floor(n / 2), both normal for n in [-1077, 1025] (AVX2 has no
   64-bit arithmetic shift, so a comes from the float n) */
#define TSR_SCALES(n, ni, s1, s2) \
    double s1##_a = floor(n * 0.5); \
    int64_t s1##_i = tsr_dbits(s1##_a + 6755399441055744.0) - 0x4338000000000000LL; \
    double s1 = tsr_pow2d(s1##_i + 1023); \
    double s2 = tsr_pow2d(ni - s1##_i + 1023)

TSR_INLINE double tsr_exp(double x) {
    x = 709.8 < x ? 709.8 : x;
    x = -746.0 > x ? -746.0 : x;
    TSR_REDUCE(x, n, ni, r);
    TSR_SCALES(n, ni, s1, s2);
    return (tsr_em1_poly(r) + 1.0) * s1 * s2;
}

TSR_INLINE double tsr_expm1(double x) {
    double xc = 709.8 < x ? 709.8 : x;
    xc = -40.0 > xc ? -40.0 : xc;    /* below -37.5, e^x - 1 rounds to -1 */
    TSR_REDUCE(xc, n, ni, r);
    double em = tsr_em1_poly(r);
    TSR_SCALES(n, ni, s1, s2);
    double s = s1 * s2;
    double small = fma(s, em, s - 1.0);
    double big = ((em + 1.0) * s1) * s2;
    return x == 0.0 ? x : (ni > 60 ? big : small);
}

TSR_INLINE double tsr_sigmoid(double x) {
    double e = tsr_exp(-fabs(x));
    double s = 1.0 / (1.0 + e);
    return x < 0.0 ? e * s : s;
}

TSR_INLINE double tsr_tanh(double x) {
    double a = fabs(x);
    a = 19.1 < a ? 19.1 : a;
    double e = tsr_expm1(a + a);
    return copysign(e / (e + 2.0), x);
}

/* log x = k ln2 + log(1 + f), 1 + f in [sqrt(1/2), sqrt(2)): fdlibm's
   log(1 + f) = f - (f^2/2 - s (f^2/2 + R(s^2))), s = f / (2 + f), R its series */
TSR_INLINE double tsr_log(double x) {
    int sub = x < 2.2250738585072014e-308;
    double xs = sub ? x * 18014398509481984.0 : x;   /* 2^54 */
    int64_t i = tsr_dbits(xs);
    /* k = (i - bits(sqrt(1/2))) >> 52 with logical shifts (AVX2 has no 64-bit arithmetic
       one): biased by 1023 so the shifted value is never negative for x > 0 */
    int64_t u = (int64_t)((uint64_t)(i - 0x3FE6A09E667F3BCDLL + 0x3FF0000000000000LL) >> 52);
    double k = tsr_bitsd(u | 0x4330000000000000LL) - 4503599627371519.0;  /* u - 1023 */
    k = sub ? k - 54.0 : k;
    double f = tsr_bitsd(i - (int64_t)((uint64_t)(u - 1023) << 52)) - 1.0;
    double s = f / (2.0 + f);
    double z = s * s;
    double z2 = z * z, z4 = z2 * z2;
    double R01 = fma(z, 3.999999999940941908e-01, 6.666666666666735130e-01);
    double R23 = fma(z, 2.222219843214978396e-01, 2.857142874366239149e-01);
    double R45 = fma(z, 1.531383769920937332e-01, 1.818357216161805012e-01);
    double R = z * fma(z4, fma(z2, 1.479819860511658591e-01, R45), fma(z2, R23, R01));
    double hfsq = 0.5 * f * f;
    double r = k * 6.93147180369123816490e-01
               - ((hfsq - (s * (hfsq + R) + k * 1.90821492927058770002e-10)) - f);
    return x > 0.0 ? (x < INFINITY ? r : x) : (x == 0.0 ? -INFINITY : NAN);
}

TSR_INLINE double tsr_log1p(double x) {
    double u = 1.0 + x;
    double l = tsr_log(u);
    double y = (u > 0.0 && u < INFINITY) ? l + (x - (u - 1.0)) / u : l;
    return u == 1.0 ? x : y;
}

/* float64 Phi, erf and erfc: libm (exactness over speed; these loops stay scalar) */
TSR_INLINE double tsr_phi(double x) { return 0.5 * erfc(-x * 0.70710678118654752440); }
TSR_INLINE double tsr_erf(double x) { return erf(x); }
TSR_INLINE double tsr_erfc(double x) { return erfc(x); }
TSR_INLINE double tsr_gelu_grad(double x) {
    return tsr_phi(x) + x * 0.3989422804014327 * tsr_exp(-0.5 * x * x);
}

/* pow with the exponents PyTorch's pow_tensor_scalar computes without libm: products,
   square roots and reciprocals. A literal exponent (a graph's scalar operand) folds to one
   branch, so the loop vectorises; powf keeps other loops scalar. */
TSR_INLINE float tsr_powf(float a, float b) {
    if (b == 2.0f) return a * a;
    if (b == 3.0f) return a * a * a;
    if (b == 0.5f) return sqrtf(a);
    if (b == -0.5f) return 1.0f / sqrtf(a);
    if (b == -1.0f) return 1.0f / a;
    if (b == -2.0f) return 1.0f / (a * a);
    return powf(a, b);
}
TSR_INLINE double tsr_pow(double a, double b) {
    if (b == 2.0) return a * a;
    if (b == 3.0) return a * a * a;
    if (b == 0.5) return sqrt(a);
    if (b == -0.5) return 1.0 / sqrt(a);
    if (b == -1.0) return 1.0 / a;
    if (b == -2.0) return 1.0 / (a * a);
    return pow(a, b);
}

/* Python's and PyTorch's remainder: the result takes the divisor's sign */
TSR_INLINE float tsr_remf(float a, float b) {
    float m = fmodf(a, b);
    return (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) ? m + b : m;
}
TSR_INLINE double tsr_rem(double a, double b) {
    double m = fmod(a, b);
    return (m != 0.0 && ((b < 0.0) != (m < 0.0))) ? m + b : m;
}

/* floor division as PyTorch's div_floor_floating computes it */
TSR_INLINE float tsr_floordivf(float a, float b) {
    if (b == 0.0f) return a / b;
    float m = fmodf(a, b);
    float d = (a - m) / b;
    if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) d -= 1.0f;
    float f = floorf(d);
    if (d - f > 0.5f) f += 1.0f;
    return d == 0.0f ? copysignf(0.0f, a / b) : f;
}
TSR_INLINE double tsr_floordiv(double a, double b) {
    if (b == 0.0) return a / b;
    double m = fmod(a, b);
    double d = (a - m) / b;
    if (m != 0.0 && ((b < 0.0) != (m < 0.0))) d -= 1.0;
    double f = floor(d);
    if (d - f > 0.5) f += 1.0;
    return d == 0.0 ? copysign(0.0, a / b) : f;
}
