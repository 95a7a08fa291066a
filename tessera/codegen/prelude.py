"""The C prelude every generated translation unit starts with: headers and the helper
functions the op rules (``tessera.codegen.c_rules``) call.

The float32 transcendental functions are written out as branch-free polynomials so that a
``#pragma omp simd`` loop calling them vectorises (a libm call would keep the loop scalar):

* ``tsr_expf``: e^x = 2^n e^r with n = round(x / ln 2), r reduced in two steps (Cody-Waite)
  and e^r by its degree-7 Taylor polynomial (|r| <= ln2/2, truncation < 1e-8 relative);
  2^n is applied as two exact power-of-two factors so that subnormal results and overflow
  to inf come out right.
* ``tsr_tanhf``: an odd Taylor polynomial below |x| = 0.25, else 1 - 2 / (e^{2|x|} + 1).
* ``tsr_phif``: the standard normal CDF from erfc(z) = t exp(-z^2 + P(t)), t = 1/(1 + z/2)
  (Numerical Recipes' fit, relative error < 1.2e-7 for all z), the same formula as the
  eager float32 gelu kernel, so exact gelu keeps its relative accuracy in the negative tail.

float64 uses libm throughout (exactness over speed).
"""
from __future__ import annotations

PRELUDE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TSR_INLINE static inline __attribute__((always_inline))

TSR_INLINE float tsr_pow2f(int n) {
    int32_t bits = (n + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

TSR_INLINE float tsr_expf(float x) {
    float xc = x != x ? 0.0f : (x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x));
    float n = floorf(xc * 1.44269504088896341f + 0.5f);
    float r = fmaf(n, -0.693359375f, xc);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.98412698e-4f;
    p = fmaf(p, r, 1.38888889e-3f);
    p = fmaf(p, r, 8.33333333e-3f);
    p = fmaf(p, r, 4.16666667e-2f);
    p = fmaf(p, r, 1.66666667e-1f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int ni = (int)n;
    int a = ni >> 1;
    float y = p * tsr_pow2f(a) * tsr_pow2f(ni - a);
    return x != x ? x : y;
}

TSR_INLINE double tsr_exp(double x) { return exp(x); }

TSR_INLINE float tsr_tanhf(float x) {
    float a = fabsf(x);
    float x2 = x * x;
    float small = x + x * x2 * (-3.33333333e-1f + x2 * (1.33333333e-1f
                  + x2 * (-5.39682540e-2f + x2 * 2.18694885e-2f)));
    float big = 1.0f - 2.0f / (tsr_expf(2.0f * a) + 1.0f);
    big = x < 0.0f ? -big : big;
    return a < 0.25f ? small : big;  /* NaN: a < 0.25 is false and big is NaN */
}

TSR_INLINE double tsr_tanh(double x) { return tanh(x); }

TSR_INLINE float tsr_sigmoidf(float x) { return 1.0f / (1.0f + tsr_expf(-x)); }
TSR_INLINE double tsr_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* Phi(x), the standard normal CDF */
TSR_INLINE float tsr_phif(float x) {
    float z = fabsf(x) * 0.7071067811865476f;
    float t = 1.0f / fmaf(z, 0.5f, 1.0f);
    float p = 0.17087277f;
    p = fmaf(p, t, -0.82215223f);
    p = fmaf(p, t, 1.48851587f);
    p = fmaf(p, t, -1.13520398f);
    p = fmaf(p, t, 0.27886807f);
    p = fmaf(p, t, -0.18628806f);
    p = fmaf(p, t, 0.09678418f);
    p = fmaf(p, t, 0.37409196f);
    p = fmaf(p, t, 1.00002368f);
    p = fmaf(p, t, -1.26551223f);
    float q = 0.5f * t * tsr_expf(p - 0.5f * x * x);   /* Phi(-|x|) */
    return x > 0.0f ? 1.0f - q : q;
}

TSR_INLINE double tsr_phi(double x) { return 0.5 * erfc(-x * 0.70710678118654752440); }

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
"""
