/* Tessera's float32 GEMM (gemm.c): C = alpha * op(A) @ op(B) + beta * C, then a fused
   epilogue (bias per column, or per row, activation, residual), row-major C.

   Dependency-free (libc, libm; the threads are the caller's): a compiled model's C library
   copies gemm.h, gemm.c and prelude.h as they are. The micro-kernel is chosen at run time
   from the CPU (AVX-512, AVX2+FMA, portable C); each is compiled with its own
   __attribute__((target)), so one binary built for baseline x86-64 runs on every x86-64.

   Use: fill a tsr_gemm_t (zero it first: unset fields are then "none"), call
   tsr_gemm_plan(&g, threads) for the number of blocks, then tsr_gemm_range(&g, lo, hi)
   over any partition of [0, blocks) on any threads (blocks write disjoint parts of C);
   tsr_gemm_run(&g) does both on the calling thread. A and B are strided views:
   op(A)[i][p] = a[i*rsa + p*csa], so a transpose is a swap of the two strides. A product
   of at most 4 rows (m <= 4: batch-1 inference) takes the GEMV path, its blocks ranges of
   columns: B streams once from where it lies, packed or not. */
#ifndef TSR_GEMM_H
#define TSR_GEMM_H

#include <stdint.h>

enum { TSR_GEMM_PORTABLE = 0, TSR_GEMM_AVX2 = 1, TSR_GEMM_AVX512 = 2, TSR_GEMM_ISAS = 3 };
enum { TSR_ACT_NONE = 0, TSR_ACT_RELU = 1, TSR_ACT_GELU_TANH = 2, TSR_ACT_GELU_ERF = 3,
       TSR_ACT_CLAMP = 4, TSR_ACT_SILU = 5 };   /* CLAMP: to [lo, hi] (relu6, hardtanh) */
/* flags: add the residual before the activation (relu(x @ w + b + r), ResNet's blocks)
   instead of after it (act(x @ w + b) + r, a transformer's); pack A always, or never
   (when its rows are contiguous), instead of the default (A read in place when it meets
   few panels of B: N small); bias per row of C (m values: a convolution's output channels,
   C being (channels, positions)) instead of per column */
enum { TSR_GEMM_RESIDUAL_FIRST = 1, TSR_GEMM_PACK_A = 2, TSR_GEMM_IN_PLACE_A = 4,
       TSR_GEMM_BIAS_ROWS = 8 };

typedef struct tsr_gemm {
    int64_t m, n, k;
    const float* a; int64_t rsa, csa;      /* op(A): m x k */
    const float* b; int64_t rsb, csb;      /* op(B): k x n (unused when bp is set) */
    const float* bp;                       /* B packed by tsr_gemm_pack_b, or NULL */
    float* c; int64_t ldc;                 /* m x n, rows ldc apart */
    const float* bias;                     /* n values (m with BIAS_ROWS), or NULL */
    const float* r; int64_t ldr;           /* residual m x n, rows ldr apart, or NULL */
    float alpha, beta;                     /* beta == 0: C is not read (NaN there is fine) */
    int32_t act, flags, isa;
    int32_t path;                          /* set by tsr_gemm_plan: 0 blocked, 1 GEMV */
    int64_t mc, kc, nc;                    /* cache blocking; 0: tsr_gemm_plan chooses */
    float lo, hi;                          /* TSR_ACT_CLAMP's bounds */
} tsr_gemm_t;

int tsr_gemm_isa_supported(int isa);       /* the CPU (and OS) can run this path */
int tsr_gemm_isa_best(void);               /* the fastest path this CPU runs */
int tsr_gemm_mr(int isa);                  /* the micro-tile: MR rows x NR columns */
int tsr_gemm_nr(int isa);
/* floats of B (k x n) packed for isa: NR-column panels, each k x NR, zero-padded */
int64_t tsr_gemm_packed_size(int isa, int64_t k, int64_t n);
/* op(B)[p][j] = b[p*rsb + j*csb] packed into dst (64-byte aligned, packed_size floats);
   the range form packs panels [q0, q1) only, for threads to share the work. 0, or -1 when
   isa does not run on this CPU. */
int tsr_gemm_pack_b(int isa, int64_t k, int64_t n, const float* b, int64_t rsb, int64_t csb,
                    float* dst);
int tsr_gemm_pack_b_range(int isa, int64_t k, int64_t n, const float* b, int64_t rsb,
                          int64_t csb, float* dst, int64_t q0, int64_t q1);
/* fills the blocking left 0 (splitting the work into at least ``threads`` blocks where it
   can, few blocks into sizes the threads share evenly; a GEMV too small to gain from a
   second thread into one) and returns the number of blocks, or -1 when g->isa does not
   run on this CPU */
int64_t tsr_gemm_plan(tsr_gemm_t* g, int threads);
/* blocks [lo, hi): 0, -1 when not planned (or planned for a path this CPU lacks), -2
   when the thread's scratch (a few MB, kept for its next product) cannot be allocated */
int64_t tsr_gemm_range(const tsr_gemm_t* g, int64_t lo, int64_t hi);
int tsr_gemm_run(tsr_gemm_t* g);           /* tsr_gemm_plan, then tsr_gemm_range: 0, -1, -2 */
/* a pool that runs item(ctx, i) for i in [0, n) on the caller and up to threads - 1 other
   threads, returning when all are done (tessera's threadpool.c: tsr_pool_run) */
typedef int64_t (*tsr_item_fn)(const int64_t* ctx, int64_t i);
typedef void (*tsr_pool_run_fn)(tsr_item_fn item, const int64_t* ctx, int64_t n, int threads);
/* the whole product in one call: tsr_gemm_plan for threads, then the blocks through run
   (NULL: on the caller alone). 0, -1, -2 as tsr_gemm_range */
int64_t tsr_gemm_exec(tsr_gemm_t* g, int threads, tsr_pool_run_fn run);

#endif
