/* Tessera's GEMM (gemm.c) behind the CBLAS sgemm signature the convolution drivers call
   (tessera/kernels/conv.py): each driver thread multiplies its own item single-threaded,
   as it would with OpenBLAS. The GEMM library is another shared object, loaded without
   global symbols, so its entry point comes in as an address (tsr_conv_gemm_init), with
   OpenBLAS's sgemm to fall back on when a product's scratch cannot be allocated. The
   forward drivers' products with a fused epilogue (conv.h's conv_epi) call
   tsr_conv_sgemm_epi instead.
   -DTSR_BLASINT is the CBLAS integer of that OpenBLAS: int, or int64_t for ILP64. */
#include <stdint.h>
#include <string.h>

#include "gemm.h"

typedef TSR_BLASINT blasint;
enum { ROW = 101, TR = 112 };
typedef void (*sgemm_fn)(int, int, int, blasint, blasint, blasint, float, const float*,
                         blasint, const float*, blasint, float, float*, blasint);

static int (*gemm_run)(tsr_gemm_t*);
static sgemm_fn fallback;
static int gemm_isa;

void tsr_conv_gemm_init(void* run, void* blas_sgemm, int isa) {
    gemm_run = (int (*)(tsr_gemm_t*))run;
    fallback = (sgemm_fn)blas_sgemm;
    gemm_isa = isa;
}

/* C = alpha op(A) op(B) + beta C, row-major (the only order the drivers pass) */
void tsr_conv_sgemm(int order, int ta, int tb, blasint m, blasint n, blasint k, float alpha,
                    const float* a, blasint lda, const float* b, blasint ldb, float beta,
                    float* c, blasint ldc) {
    if (order != ROW || k <= 0) {   /* not a case the drivers make: CBLAS's own semantics */
        fallback(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    tsr_gemm_t g;
    memset(&g, 0, sizeof g);
    g.m = m; g.n = n; g.k = k;
    g.a = a; g.rsa = ta == TR ? 1 : lda; g.csa = ta == TR ? lda : 1;
    g.b = b; g.rsb = tb == TR ? 1 : ldb; g.csb = tb == TR ? ldb : 1;
    g.c = c; g.ldc = ldc;
    g.alpha = alpha; g.beta = beta; g.isa = gemm_isa;
    if (gemm_run(&g) != 0)
        fallback(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* C (m x n, rows ldc apart) = A (m x k, rows lda apart) @ B (k x n, rows ldb apart), then
   per row i: act(C + bias[i] [+ R]) [+ R] (R's rows ldr apart; inside the activation when
   first), the tile in cache; 0, or -1 having done nothing (the caller then runs the plain
   product and its own epilogue) */
int tsr_conv_sgemm_epi(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                       const float* b, int64_t ldb, float* c, int64_t ldc, const float* bias,
                       const float* r, int64_t ldr, int64_t act, int64_t first, float lo,
                       float hi) {
    if (k <= 0) return -1;
    tsr_gemm_t g;
    memset(&g, 0, sizeof g);
    g.m = m; g.n = n; g.k = k;
    g.a = a; g.rsa = lda; g.csa = 1;
    g.b = b; g.rsb = ldb; g.csb = 1;
    g.c = c; g.ldc = ldc;
    g.bias = bias; g.r = r; g.ldr = ldr;
    g.alpha = 1; g.isa = gemm_isa;
    g.act = (int32_t)act; g.lo = lo; g.hi = hi;
    g.flags = TSR_GEMM_BIAS_ROWS | (first ? TSR_GEMM_RESIDUAL_FIRST : 0);
    return gemm_run(&g) == 0 ? 0 : -1;
}
