/* Fused optimizer updates (tessera/kernels/optim.py): one pass over a parameter and its
   state per step. */
#include <math.h>
#include <stdint.h>

enum { MAXIMIZE = 1, DECOUPLED = 2, AMSGRAD = 4 };

/* one element of Adam: the ops of tessera.optim.adam._adam_update, in their order and
   precision. L2 and AMS are constants in each expansion, so the loop has no branches:
   flags tested inside it keep GCC's vectorised loop from running (bench training: cnn) */
#define ADAM_LOOP(T, SQRT, L2, AMS)                                                      \
    _Pragma("omp simd")                                                                  \
    for (int64_t i = lo; i < hi; i++) {                                                  \
        T gi = g[i] * sign, pi = p[i] * decay;                                           \
        if (L2) gi = gi + wd * pi;                                                       \
        T d = gi - m[i];                                                                 \
        T mi = near ? m[i] + d * w : gi - d * w1;                                        \
        T vi = v[i] * b2;                                                                \
        vi = vi + c2 * gi * gi;                                                          \
        m[i] = mi;                                                                       \
        v[i] = vi;                                                                       \
        if (AMS) { vi = vmax[i] > vi || vmax[i] != vmax[i] ? vmax[i] : vi; vmax[i] = vi; } \
        T denom = SQRT(vi) / bc2 + eps;                                                  \
        p[i] = pi + value * mi / denom;                                                  \
    }

/* Adam on [lo, hi). s[]: decay (1 - lr wd), wd, w (1 - beta1), beta2, 1 - beta2, eps,
   -step_size, sqrt(1 - beta2^t), 1 - w. Negating the gradient (maximize) and the decay
   (decoupled weight decay) are multiplications by -1 and 1 - lr wd, exact when off (1) */
#define ADAM(T, S, SQRT)                                                                 \
void tsr_adam_##S(T* restrict p, const T* restrict g, T* restrict m, T* restrict v,      \
                  T* restrict vmax, const double* s, int64_t flags, int64_t lo,          \
                  int64_t hi) {                                                          \
    const int dec = flags & DECOUPLED, on = s[1] != 0, near = fabs(s[2]) < 0.5;          \
    const T sign = flags & MAXIMIZE ? (T)-1 : (T)1, decay = dec && on ? (T)s[0] : (T)1,  \
            wd = (T)s[1], w = (T)s[2], b2 = (T)s[3], c2 = (T)s[4], eps = (T)s[5],        \
            value = (T)s[6], bc2 = (T)s[7], w1 = (T)s[8];                                \
    int l2 = !dec && on, ams = (flags & AMSGRAD) != 0;                                   \
    if (l2 && ams) { ADAM_LOOP(T, SQRT, 1, 1) }                                          \
    else if (l2) { ADAM_LOOP(T, SQRT, 1, 0) }                                            \
    else if (ams) { ADAM_LOOP(T, SQRT, 0, 1) }                                           \
    else { ADAM_LOOP(T, SQRT, 0, 0) }                                                    \
}

ADAM(float, f32, sqrtf)
ADAM(double, f64, sqrt)
