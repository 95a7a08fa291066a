/* Blocked-layout (NCHWc) convolutions and pooling (the API: nchwc.h).

   A convolution's work is a set of register tiles: NP consecutive output pixels of one row
   x NB output-channel blocks (NP * NB vector accumulators). The tile's inner step loads the
   NB weight vectors of one input channel and one tap (packed contiguous, in the order the
   loop reads them), broadcasts the NP pixels' input values of that channel and FMAs. Tiles
   whose taps all lie inside the image run without bounds checks; the border pixels of a
   row (left and right padding) run one at a time over the taps inside; the rows above and
   below narrow the tap rows once per row. A 1x1 stride-1 convolution is a GEMM over the
   pixels: its plane is one long row. A depthwise convolution's tile is NP pixels of one
   channel block, vectorised across the block's B channels. The epilogue (bias, residual
   before or after the activation, relu or clamp, zeros in the padded output channels)
   runs on the accumulators before the one store.

   The x86 tiles are written once (a macro over the vector type and its intrinsics) and
   instantiated per (NB, NP, input channels per step, stride) under their target attribute;
   the portable tile is plain C with B a variable, which the compiler vectorises as it can. */
#include "nchwc.h"
#include "prelude.h"

#if defined(__x86_64__) || defined(__i386__)
#define TSR_X86 1
#include <immintrin.h>
#define TSR_AVX512 __attribute__((target("avx512f,prefer-vector-width=512")))
#define TSR_AVX2 __attribute__((target("avx2,fma")))
#else
#define TSR_X86 0
#endif

/* ---- what the CPU runs -------------------------------------------------------------- */

int tsr_nchwc_isa_supported(int isa) { return isa < TSR_GEMM_ISAS && tsr_isa_supported(isa); }
int tsr_nchwc_isa_best(void) { return tsr_isa_best(); }

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* ---- one register tile -------------------------------------------------------------- */

/* Everything a tile reads, its pointers at the tile's first tap, pixel and block */
typedef struct {
    const float* x;         /* input: first input block, first tap row and column inside */
    const float* w;         /* weights: first output block, input block, tap */
    float* y;               /* output at (first block, row, first pixel) */
    const float* bias;      /* at the first block, or NULL */
    const float* r;         /* residual, as y, or NULL */
    int64_t ncb, cbs;       /* input blocks (plain input: channels) and their stride */
    int64_t nky, rs;        /* tap rows and their stride in x (dilation included) */
    int64_t nkx, cs;        /* tap columns and their stride in x */
    int64_t ps;             /* one output pixel's step in x (stride included) */
    int64_t kw;             /* taps per row of the packed weights */
    int64_t wobs, wcbs;     /* weights: an output block's stride, an input block's */
    int64_t yobs;           /* output and residual: an output block's stride */
    int64_t yps;            /* one output pixel's step (B along a row, a row down a column) */
    int64_t oleft;          /* real output channels from the first block on */
    int add, epi;           /* start from y (a later pass over the input blocks); last pass */
    int act, first;         /* TSR_ACT_*; residual before the activation */
    float lo, hi;
} tile_t;

typedef void (*tile_fn)(const tile_t*);

enum { NB_MAX = 4, NP_MAX = 16, NP_DW_MAX = 16, WEIGHTS_L2 = 640 << 10 };
/* the widest whole-row depthwise 3-wide tile: the rows of 112, 56, 28, 14 and 7 pixels
   (MobileNets', EfficientNets') then all run tiles of 14 and 7 (16 saved a percent on 112
   and cost a model's build three more tiles, 5 KB) */
enum { DW3_NP = 14 };

#if TSR_X86
/* S for each accumulator (p, j), fully unrolled: the accumulators stay in registers */
#define TSR_EACH(NB, NP, S) { _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++)           \
                              _Pragma("GCC unroll 16") for (int p = 0; p < NP; p++) { S; } }

#define TSR_AT(ptr) ((ptr) + j * t->yobs + p * yps_)   /* (pixel p, block j) of y or r */

/* The epilogue on accumulators acc[p][j] (p < NP pixels, j < NB blocks): act(acc [+ r])
   [+ r], then the padded channels of the last block zeroed. max(0, v) and min(hi, v) give v
   itself when v is a NaN, as PyTorch's relu and clamp do. */
#define TSR_EPILOGUE(V, BW, LOADU, STOREU, SET1, ADD, MAX, MIN, KEEP, acc, NB, NP)           \
    if (t->epi) {                                                                          \
        const float* r_ = t->r;                                                            \
        V lo_ = SET1(t->act == TSR_ACT_RELU ? 0.0f : t->lo), hi_ = SET1(t->hi);            \
        if (r_ && t->first) TSR_EACH(NB, NP, acc[p][j] = ADD(acc[p][j], LOADU(TSR_AT(r_))))   \
        if (t->act == TSR_ACT_RELU) TSR_EACH(NB, NP, acc[p][j] = MAX(lo_, acc[p][j]))       \
        else if (t->act == TSR_ACT_CLAMP)                                                  \
            TSR_EACH(NB, NP, acc[p][j] = MIN(hi_, MAX(lo_, acc[p][j])))                    \
        if (r_ && !t->first) TSR_EACH(NB, NP, acc[p][j] = ADD(acc[p][j], LOADU(TSR_AT(r_))))  \
        if (t->oleft < NB * BW)                                                            \
            TSR_EACH(NB, NP, acc[p][j] = KEEP(acc[p][j], t->oleft - j * BW))               \
    }                                                                                      \
    TSR_EACH(NB, NP, STOREU(TSR_AT(t->y), acc[p][j]))

/* a convolution tile: CI input channels per step (BW blocked, 1 plain), pixels SW input
   columns apart (SW 0: t->ps, for single pixels) */
#define TSR_TILE(ATTR, NAME, V, BW, LOADU, STOREU, SET1, FMA, ADD, MAX, MIN, KEEP)            \
ATTR TSR_INLINE void NAME(const tile_t* t, const int NB, const int NP, const int CI,      \
                          const int SW) {                                                \
    V acc[NP_MAX][NB_MAX];                                                               \
    const int64_t yps_ = SW ? BW : t->yps;                                                \
    _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++) {                                \
        V b0 = t->bias ? LOADU(t->bias + j * BW) : SET1(0.0f);                             \
        _Pragma("GCC unroll 16") for (int p = 0; p < NP; p++)                             \
            acc[p][j] = t->add ? LOADU(TSR_AT(t->y)) : b0;                                 \
    }                                                                                    \
    const int64_t ps = SW ? (int64_t)SW * CI : t->ps;                                     \
    for (int64_t cb = 0; cb < t->ncb; cb++)                                               \
        for (int64_t ky = 0; ky < t->nky; ky++)                                           \
            for (int64_t kx = 0; kx < t->nkx; kx++) {                                     \
                const float* xt = t->x + cb * t->cbs + ky * t->rs + kx * t->cs;           \
                const float* wt = t->w + cb * t->wcbs + (ky * t->kw + kx) * (CI * BW);    \
                _Pragma("GCC unroll 16") for (int ci = 0; ci < CI; ci++) {                \
                    V wv[NB_MAX];                                                         \
                    _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++)                  \
                        wv[j] = LOADU(wt + j * t->wobs + ci * BW);                        \
                    _Pragma("GCC unroll 16") for (int p = 0; p < NP; p++) {               \
                        V xb = SET1(xt[p * ps + ci]);                                     \
                        _Pragma("GCC unroll 4") for (int j = 0; j < NB; j++)              \
                            acc[p][j] = FMA(xb, wv[j], acc[p][j]);                        \
                    }                                                                     \
                }                                                                         \
            }                                                                             \
    TSR_EPILOGUE(V, BW, LOADU, STOREU, SET1, ADD, MAX, MIN, KEEP, acc, NB, NP)              \
}

/* a depthwise tile: NP pixels of one channel block, the B channels in the vector */
#define TSR_DW_TILE(ATTR, NAME, V, BW, LOADU, STOREU, SET1, FMA, ADD, MAX, MIN, KEEP)         \
ATTR TSR_INLINE void NAME(const tile_t* t, const int NP, const int SW) {                 \
    V acc[NP_DW_MAX][1];                                                                 \
    const int64_t yps_ = SW ? BW : t->yps;                                                \
    V b0 = t->bias ? LOADU(t->bias) : SET1(0.0f);                                          \
    _Pragma("GCC unroll 16") for (int p = 0; p < NP; p++) acc[p][0] = b0;                 \
    const int64_t ps = SW ? (int64_t)SW * BW : t->ps;                                     \
    for (int64_t ky = 0; ky < t->nky; ky++)                                               \
        for (int64_t kx = 0; kx < t->nkx; kx++) {                                         \
            const float* xt = t->x + ky * t->rs + kx * t->cs;                             \
            V wv = LOADU(t->w + (ky * t->kw + kx) * BW);                                   \
            _Pragma("GCC unroll 16") for (int p = 0; p < NP; p++)                         \
                acc[p][0] = FMA(LOADU(xt + p * ps), wv, acc[p][0]);                       \
        }                                                                                 \
    TSR_EPILOGUE(V, BW, LOADU, STOREU, SET1, ADD, MAX, MIN, KEEP, acc, 1, NP)               \
}

/* a depthwise 3-wide tile (dilation 1): each input vector of a row is loaded once and
   multiplied into the up to 3 pixels that read it, instead of once per pixel and tap
   (loads, not FMAs, bound the plain tile). PAD: the row's first input column (bit 0; x then
   points at the second) and its last (bit 1) are padding, read as zeros: a whole row in
   tiles, its border pixels with it, where the generic tile ran them one column at a time
   (MobileNetV2's 14x14 and 7x7 layers: a seventh and two sevenths of their pixels) */
#define TSR_DW3_TILE(ATTR, NAME, V, BW, LOADU, STOREU, SET1, FMA, ADD, MAX, MIN, KEEP)        \
ATTR TSR_INLINE void NAME(const tile_t* t, const int NP, const int SW, const int PAD) {  \
    V acc[NP_DW_MAX][1];                                                                 \
    const int64_t yps_ = BW;                                                              \
    V b0 = t->bias ? LOADU(t->bias) : SET1(0.0f);                                          \
    _Pragma("GCC unroll 16") for (int p = 0; p < NP; p++) acc[p][0] = b0;                 \
    for (int64_t ky = 0; ky < t->nky; ky++) {                                             \
        const float* xr = t->x + ky * t->rs;                                              \
        const float* wr = t->w + ky * t->kw * BW;                                         \
        V w[3] = {LOADU(wr), LOADU(wr + BW), LOADU(wr + 2 * BW)};                          \
        _Pragma("GCC unroll 40") for (int i = 0; i < (NP - 1) * SW + 3; i++) {            \
            if (((PAD & 1) && i == 0) || ((PAD & 2) && i == (NP - 1) * SW + 2)) continue;  \
            V v = LOADU(xr + (i - (PAD & 1)) * BW);                                       \
            _Pragma("GCC unroll 3") for (int kx = 0; kx < 3; kx++)                        \
                if (i >= kx && (i - kx) % SW == 0 && (i - kx) / SW < NP)                  \
                    acc[(i - kx) / SW][0] = FMA(v, w[kx], acc[(i - kx) / SW][0]);         \
        }                                                                                 \
    }                                                                                     \
    TSR_EPILOGUE(V, BW, LOADU, STOREU, SET1, ADD, MAX, MIN, KEEP, acc, 1, NP)               \
}

TSR_AVX512 TSR_INLINE __m512 keep512(__m512 v, int64_t n) {
    __mmask16 m = n >= 16 ? 0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
    return _mm512_maskz_mov_ps(m, v);
}
static const int32_t KEEP_BITS[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
TSR_AVX2 TSR_INLINE __m256 keep256(__m256 v, int64_t n) {
    n = n < 0 ? 0 : n > 8 ? 8 : n;
    return _mm256_and_ps(v, _mm256_loadu_ps((const float*)(KEEP_BITS + 8 - n)));
}

TSR_TILE(TSR_AVX512, tile512, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps,
         _mm512_fmadd_ps, _mm512_add_ps, _mm512_max_ps, _mm512_min_ps, keep512)
TSR_TILE(TSR_AVX2, tile256, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps,
         _mm256_fmadd_ps, _mm256_add_ps, _mm256_max_ps, _mm256_min_ps, keep256)
TSR_DW_TILE(TSR_AVX512, dw512, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps,
            _mm512_fmadd_ps, _mm512_add_ps, _mm512_max_ps, _mm512_min_ps, keep512)
TSR_DW_TILE(TSR_AVX2, dw256, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps,
            _mm256_fmadd_ps, _mm256_add_ps, _mm256_max_ps, _mm256_min_ps, keep256)

TSR_DW3_TILE(TSR_AVX512, dw3_512, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
             _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_max_ps, _mm512_min_ps,
             keep512)
TSR_DW3_TILE(TSR_AVX2, dw3_256, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps,
             _mm256_fmadd_ps, _mm256_add_ps, _mm256_max_ps, _mm256_min_ps, keep256)

/* The instances: NB output blocks x NP pixels, NP up to what the registers hold (32 on
   AVX-512: NP * NB accumulators, NB weights and a broadcast; 16 on AVX2), for blocked input
   (CI = B) and plain input (CI = 1), strides 1 and 2 (single pixels take any stride) */
#define TSR_UP3(M, ...) M(1, __VA_ARGS__) M(2, __VA_ARGS__) M(3, __VA_ARGS__)
#define TSR_UP4(M, ...) TSR_UP3(M, __VA_ARGS__) M(4, __VA_ARGS__)
#define TSR_UP6(M, ...) TSR_UP4(M, __VA_ARGS__) M(5, __VA_ARGS__) M(6, __VA_ARGS__)
#define TSR_UP7(M, ...) TSR_UP6(M, __VA_ARGS__) M(7, __VA_ARGS__)
#define TSR_UP8(M, ...) TSR_UP7(M, __VA_ARGS__) M(8, __VA_ARGS__)
#define TSR_UP9(M, ...) TSR_UP8(M, __VA_ARGS__) M(9, __VA_ARGS__)
#define TSR_UP12(M, ...) TSR_UP9(M, __VA_ARGS__) M(10, __VA_ARGS__) M(11, __VA_ARGS__) \
                         M(12, __VA_ARGS__)
#define TSR_UP14(M, ...) TSR_UP12(M, __VA_ARGS__) M(13, __VA_ARGS__) M(14, __VA_ARGS__)
#define TSR_UP16(M, ...) TSR_UP14(M, __VA_ARGS__) M(15, __VA_ARGS__) M(16, __VA_ARGS__)
/* depthwise 3-wide tiles of stride SW, every PAD */
#define TSR_DW3_PADS(UP, M, SW) UP(M, SW, 0) UP(M, SW, 1) UP(M, SW, 2) UP(M, SW, 3)

#define TSR_ALL512(M, CI, SW) TSR_UP16(M, 1, CI, SW) TSR_UP14(M, 2, CI, SW) \
                              TSR_UP9(M, 3, CI, SW) TSR_UP7(M, 4, CI, SW)
#define TSR_ALL256(M, CI, SW) TSR_UP12(M, 1, CI, SW) TSR_UP6(M, 2, CI, SW) \
                              TSR_UP4(M, 3, CI, SW) TSR_UP3(M, 4, CI, SW)
/* columns: pixels t->ps apart in x and t->yps in y (the border pixels of consecutive rows,
   whose taps are the same; one pixel is a column of one) */
#define TSR_COL512(M, CI) TSR_UP8(M, 1, CI, 0) TSR_UP8(M, 2, CI, 0) TSR_UP8(M, 3, CI, 0) \
                          TSR_UP7(M, 4, CI, 0)
#define TSR_COL256(M, CI) TSR_UP8(M, 1, CI, 0) TSR_UP6(M, 2, CI, 0) TSR_UP4(M, 3, CI, 0) \
                          TSR_UP3(M, 4, CI, 0)
static const int NP_LIMIT[TSR_GEMM_ISAS][NB_MAX + 1] = {
    [TSR_GEMM_PORTABLE] = {0, 8, 8, 8, 8}, [TSR_GEMM_AVX2] = {0, 12, 6, 4, 3},
    [TSR_GEMM_AVX512] = {0, 16, 14, 9, 7}};
static const int NP_COL_LIMIT[TSR_GEMM_ISAS][NB_MAX + 1] = {
    [TSR_GEMM_PORTABLE] = {0, 8, 8, 8, 8}, [TSR_GEMM_AVX2] = {0, 8, 6, 4, 3},
    [TSR_GEMM_AVX512] = {0, 8, 8, 8, 7}};
static const int NP_DW_LIMIT[TSR_GEMM_ISAS] = {8, 8, 16};

/* Which instances a build compiles: every one, or those the header named by
   TSR_NCHWC_TILES lists, or the same lists defined ahead of this file (an exported model, a
   compiled graph: the tiles its convolutions can reach, tsr_nchwc_conv_tiles; most of the
   code is tiles no layer runs; none at all for the planning, packing, pooling and layout
   changes, and the portable path). Each list applies
   M to the arguments of its instances: rows (K) M(NP, NB, CI, SW), columns (C) M(NP, NB, CI,
   0), depthwise (D: SW 0 for columns) and depthwise 3-wide (T) M(NP, SW, PAD). A tile left out is
   NULL in its table: tsr_nchwc_conv_plan then returns -2 instead of running. TSR_NCHWC_AVX512
   and TSR_NCHWC_AVX2 (0 or 1) say whether the path's code is built at all (a model of one
   block size runs one of them, or portable C): the plans return -2 on one that is not. */
#ifdef TSR_NCHWC_TILES
#include TSR_NCHWC_TILES
#elif !defined(TSR_NCHWC_K512)   /* (lists defined ahead of this file select as well) */
#define TSR_NCHWC_AVX512 1
#define TSR_NCHWC_AVX2 1
#define TSR_NCHWC_K512(M) TSR_ALL512(M, 16, 1) TSR_ALL512(M, 16, 2) TSR_ALL512(M, 1, 1) \
                          TSR_ALL512(M, 1, 2)
#define TSR_NCHWC_K256(M) TSR_ALL256(M, 8, 1) TSR_ALL256(M, 8, 2) TSR_ALL256(M, 1, 1) \
                          TSR_ALL256(M, 1, 2)
#define TSR_NCHWC_C512(M) TSR_COL512(M, 16) TSR_COL512(M, 1)
#define TSR_NCHWC_C256(M) TSR_COL256(M, 8) TSR_COL256(M, 1)
#define TSR_NCHWC_D512(M) TSR_UP8(M, 0) TSR_UP16(M, 1) TSR_UP16(M, 2)
#define TSR_NCHWC_D256(M) TSR_UP8(M, 0) TSR_UP8(M, 1) TSR_UP8(M, 2)
#define TSR_NCHWC_T512(M) TSR_DW3_PADS(TSR_UP16, M, 1) TSR_DW3_PADS(TSR_UP16, M, 2)
#define TSR_NCHWC_T256(M) TSR_DW3_PADS(TSR_UP8, M, 1) TSR_DW3_PADS(TSR_UP8, M, 2)
#endif

#define TSR_K512(NP, NB, CI, SW) \
    TSR_AVX512 static void k512_##CI##_##SW##_##NB##_##NP(const tile_t* t) { \
        tile512(t, NB, NP, CI, SW); }
#define TSR_K256(NP, NB, CI, SW) \
    TSR_AVX2 static void k256_##CI##_##SW##_##NB##_##NP(const tile_t* t) { \
        tile256(t, NB, NP, CI, SW); }
#define TSR_D512(NP, SW) \
    TSR_AVX512 static void d512_##SW##_##NP(const tile_t* t) { dw512(t, NP, SW); }
#define TSR_D256(NP, SW) \
    TSR_AVX2 static void d256_##SW##_##NP(const tile_t* t) { dw256(t, NP, SW); }
#define TSR_T512(NP, SW, PAD) \
    TSR_AVX512 static void t512_##SW##_##NP##_##PAD(const tile_t* t) { dw3_512(t, NP, SW, PAD); }
#define TSR_T256(NP, SW, PAD) \
    TSR_AVX2 static void t256_##SW##_##NP##_##PAD(const tile_t* t) { dw3_256(t, NP, SW, PAD); }
#if TSR_NCHWC_AVX512
TSR_NCHWC_K512(TSR_K512) TSR_NCHWC_C512(TSR_K512) TSR_NCHWC_D512(TSR_D512)
TSR_NCHWC_T512(TSR_T512)
#endif
#if TSR_NCHWC_AVX2
TSR_NCHWC_K256(TSR_K256) TSR_NCHWC_C256(TSR_K256) TSR_NCHWC_D256(TSR_D256)
TSR_NCHWC_T256(TSR_T256)
#endif

/* the tables (first entries NULL: a list may be empty): rows [plain input][stride - 1][NB]
   [NP], columns [plain input][NB][NP], depthwise [columns, stride 1, stride 2][NP],
   depthwise 3-wide [stride - 1][PAD][NP] */
#define TSR_RE512(NP, NB, CI, SW) [(CI) == 1][(SW) - 1][NB][NP] = k512_##CI##_##SW##_##NB##_##NP,
#define TSR_RE256(NP, NB, CI, SW) [(CI) == 1][(SW) - 1][NB][NP] = k256_##CI##_##SW##_##NB##_##NP,
#define TSR_CE512(NP, NB, CI, SW) [(CI) == 1][NB][NP] = k512_##CI##_##SW##_##NB##_##NP,
#define TSR_CE256(NP, NB, CI, SW) [(CI) == 1][NB][NP] = k256_##CI##_##SW##_##NB##_##NP,
#define TSR_DE512(NP, SW) [SW][NP] = d512_##SW##_##NP,
#define TSR_DE256(NP, SW) [SW][NP] = d256_##SW##_##NP,
#define TSR_TE512(NP, SW, PAD) [(SW) - 1][PAD][NP] = t512_##SW##_##NP##_##PAD,
#define TSR_TE256(NP, SW, PAD) [(SW) - 1][PAD][NP] = t256_##SW##_##NP##_##PAD,
#if TSR_NCHWC_AVX512
static const tile_fn TILES512[2][2][NB_MAX + 1][NP_MAX + 1] = {
    [0][0][0][0] = NULL, TSR_NCHWC_K512(TSR_RE512)};
static const tile_fn COLS512[2][NB_MAX + 1][NP_MAX + 1] = {
    [0][0][0] = NULL, TSR_NCHWC_C512(TSR_CE512)};
static const tile_fn DW512[3][NP_DW_MAX + 1] = {[0][0] = NULL, TSR_NCHWC_D512(TSR_DE512)};
static const tile_fn DW3_512[2][4][NP_DW_MAX + 1] = {
    [0][0][0] = NULL, TSR_NCHWC_T512(TSR_TE512)};
#endif
#if TSR_NCHWC_AVX2
static const tile_fn TILES256[2][2][NB_MAX + 1][NP_MAX + 1] = {
    [0][0][0][0] = NULL, TSR_NCHWC_K256(TSR_RE256)};
static const tile_fn COLS256[2][NB_MAX + 1][NP_MAX + 1] = {
    [0][0][0] = NULL, TSR_NCHWC_C256(TSR_CE256)};
static const tile_fn DW256[3][NP_DW_MAX + 1] = {[0][0] = NULL, TSR_NCHWC_D256(TSR_DE256)};
static const tile_fn DW3_256[2][4][NP_DW_MAX + 1] = {
    [0][0][0] = NULL, TSR_NCHWC_T256(TSR_TE256)};
#endif
#else
static const int NP_LIMIT[TSR_GEMM_ISAS][NB_MAX + 1] = {
    {0, 8, 8, 8, 8}, {0, 8, 8, 8, 8}, {0, 8, 8, 8, 8}};
static const int NP_COL_LIMIT[TSR_GEMM_ISAS][NB_MAX + 1] = {
    {0, 8, 8, 8, 8}, {0, 8, 8, 8, 8}, {0, 8, 8, 8, 8}};
static const int NP_DW_LIMIT[TSR_GEMM_ISAS] = {8, 8, 8};
#endif

/* whether the build has the Winograd F(4x4, 3x3) path (a tiles header says; a model's build
   only where a layer runs it) */
#ifndef TSR_NCHWC_WINO
#define TSR_NCHWC_WINO 1
#endif

/* the portable tile: any B (<= 16), NB <= 4, NP <= 8, any stride; the epilogue as above */
static void tile_portable(const tile_t* t, int B, int NB, int NP, int CI, int depthwise) {
    float acc[8][NB_MAX][16];
    for (int j = 0; j < NB; j++)
        for (int p = 0; p < NP; p++)
            for (int k = 0; k < B; k++)
                acc[p][j][k] = t->add ? t->y[j * t->yobs + p * t->yps + k]
                               : t->bias ? t->bias[j * B + k] : 0.0f;
    if (depthwise) {
        for (int64_t ky = 0; ky < t->nky; ky++)
            for (int64_t kx = 0; kx < t->nkx; kx++) {
                const float* xt = t->x + ky * t->rs + kx * t->cs;
                const float* wt = t->w + (ky * t->kw + kx) * B;
                for (int p = 0; p < NP; p++)
                    for (int k = 0; k < B; k++) acc[p][0][k] += xt[p * t->ps + k] * wt[k];
            }
    } else {
        for (int64_t cb = 0; cb < t->ncb; cb++)
            for (int64_t ky = 0; ky < t->nky; ky++)
                for (int64_t kx = 0; kx < t->nkx; kx++) {
                    const float* xt = t->x + cb * t->cbs + ky * t->rs + kx * t->cs;
                    const float* wt = t->w + cb * t->wcbs + (ky * t->kw + kx) * (CI * B);
                    for (int ci = 0; ci < CI; ci++)
                        for (int j = 0; j < NB; j++) {
                            const float* wv = wt + j * t->wobs + ci * B;
                            for (int p = 0; p < NP; p++) {
                                float xv = xt[p * t->ps + ci];
                                for (int k = 0; k < B; k++) acc[p][j][k] += xv * wv[k];
                            }
                        }
                }
    }
    for (int j = 0; j < NB; j++)
        for (int p = 0; p < NP; p++)
            for (int k = 0; k < B; k++) {
                float v = acc[p][j][k];
                if (t->epi) {
                    const float* rp = t->r ? t->r + j * t->yobs + p * t->yps + k : NULL;
                    if (rp && t->first) v += *rp;
                    if (t->act == TSR_ACT_RELU) v = v < 0.0f ? 0.0f : v;
                    else if (t->act == TSR_ACT_CLAMP)
                        v = v < t->lo ? t->lo : v > t->hi ? t->hi : v;
                    if (rp && !t->first) v += *rp;
                    if (j * B + k >= t->oleft) v = 0.0f;
                }
                t->y[j * t->yobs + p * t->yps + k] = v;
            }
}

/* ---- the driver --------------------------------------------------------------------- */

/* the path a convolution runs: the isa's own tiles when B is its vector width */
static int path_of(int isa, int B) {
    if (isa == TSR_GEMM_AVX512 && B == 16) return TSR_GEMM_AVX512;
    if (isa >= TSR_GEMM_AVX2 && B == 8) return TSR_GEMM_AVX2;
    return TSR_GEMM_PORTABLE;
}

/* whether this build has the path's code (TSR_NCHWC_AVX512 / AVX2) */
static int path_built(int path) {
#if TSR_X86
    if (path == TSR_GEMM_AVX512) return TSR_NCHWC_AVX512;
    if (path == TSR_GEMM_AVX2) return TSR_NCHWC_AVX2;
#endif
    return path == TSR_GEMM_PORTABLE;
}

/* The geometry a range works with: a 1x1 stride-1 unpadded convolution's planes are one
   row of h * w pixels (its tiles then cross the image's rows) */
typedef struct {
    int64_t B, CB, OB, H, W, OH, OW, sh, sw, ph, pw, bx, xcb, wobs, wcbs, taps;
    int path, plain, dw, dw3, flat;
} geo_t;

static geo_t geometry(const tsr_nchwc_conv_t* p) {
    geo_t g;
    g.B = p->block;
    g.plain = (p->flags & TSR_NCHWC_PLAIN_INPUT) != 0;
    g.dw = p->groups > 1;
    g.dw3 = g.dw && p->kw == 3 && p->dw == 1;
    g.CB = ceil_div(p->c, g.B);
    g.OB = ceil_div(p->o, g.B);
    g.flat = !g.plain && !g.dw && p->kh == 1 && p->kw == 1 && p->sh == 1 && p->sw == 1 &&
             p->ph == 0 && p->pw == 0 && p->oh == p->h && p->ow == p->w;
    g.H = g.flat ? 1 : p->h;
    g.W = g.flat ? p->h * p->w : p->w;
    g.OH = g.flat ? 1 : p->oh;
    g.OW = g.flat ? p->oh * p->ow : p->ow;
    g.sh = g.flat ? 1 : p->sh;
    g.sw = g.flat ? 1 : p->sw;
    g.ph = g.flat ? 0 : p->ph;
    g.pw = g.flat ? 0 : p->pw;
    g.path = path_of(p->isa, (int)g.B);
    g.taps = p->kh * p->kw;
    g.bx = g.plain ? 1 : g.B;                                /* floats per input pixel */
    g.xcb = p->h * p->w * g.bx;                              /* an input block's stride */
    g.wcbs = g.dw ? g.taps * g.B : g.taps * g.bx * g.B;
    g.wobs = g.dw ? g.wcbs : (g.plain ? p->c : g.CB) * g.wcbs;
    return g;
}

/* A dry run of the driver (dry_t given): the tiles it would run, marked in used[] by
   tile_id (when used is not NULL); missing set when one is not compiled in */
typedef struct {
    unsigned char* used;
    int missing;
} dry_t;

/* kind: 0 a row tile, 1 a column, 2 depthwise, 3 depthwise 3-wide; sub: the stride index
   of the tables (row tiles 1-2, depthwise 0-2 with 0 for a column, 3-wide 1-2; columns 0) */
static int tile_id(int kind, int wide, int plain, int sub, int nb, int np) {
    return ((((kind * 2 + wide) * 2 + plain) * 3 + sub) * (NB_MAX + 1) + nb) * 17 + np;
}

/* np pixels (a row's, or a column's when col) of nb output blocks (a depthwise 3-wide
   row tile: 1 + its PAD) */
static void run_tile(const geo_t* g, const tile_t* t, int nb, int np, int col, dry_t* dry) {
    if (g->path == TSR_GEMM_PORTABLE) {   /* one function for every tile */
        if (!dry) tile_portable(t, (int)g->B, nb, np, (int)g->bx, g->dw);
        return;
    }
    int sub = col ? 0 : g->sw == 1 ? 1 : 2, wide = g->path == TSR_GEMM_AVX512;
    int dw3 = g->dw && !col && g->dw3 && (nb > 1 || t->nkx == 3);
#if TSR_X86
    tile_fn f = NULL;
#if TSR_NCHWC_AVX512
    if (wide)
        f = g->dw ? (dw3 ? DW3_512[sub - 1][nb - 1] : DW512[sub])[np]
            : col ? COLS512[g->plain][nb][np] : TILES512[g->plain][sub - 1][nb][np];
#endif
#if TSR_NCHWC_AVX2
    if (!wide)
        f = g->dw ? (dw3 ? DW3_256[sub - 1][nb - 1] : DW256[sub])[np]
            : col ? COLS256[g->plain][nb][np] : TILES256[g->plain][sub - 1][nb][np];
#endif
    if (!dry) {
        f(t);
        return;
    }
    dry->missing |= f == NULL;
#else
    if (!dry) return;
    dry->missing = 1;
#endif
    if (dry->used) {
        int kind = g->dw ? 2 + dw3 : col;
        dry->used[tile_id(kind, wide, g->plain, sub, g->dw && !dw3 ? 1 : nb, np)] = 1;
    }
}

/* the parts of a tile that stay the same over a pass: output blocks [ob, ob + nb), input
   blocks [cb0, cb0 + ncb) */
static void tile_init(const tsr_nchwc_conv_t* p, const geo_t* g, tile_t* t, int64_t ob,
                      int64_t cb0, int64_t ncb) {
    t->cbs = g->xcb;
    t->ncb = g->dw ? 1 : ncb;
    t->rs = p->dh * g->W * g->bx;
    t->cs = p->dw * g->bx;
    t->ps = g->sw * g->bx;
    t->kw = p->kw;
    t->wobs = g->wobs;
    t->wcbs = g->wcbs;
    t->yobs = g->OH * g->OW * g->B;
    t->yps = g->B;
    t->oleft = p->o - ob * g->B;
    t->add = cb0 > 0;
    t->epi = g->dw || cb0 + ncb >= (g->plain ? p->c : g->CB);
    t->act = p->act;
    t->first = (p->flags & TSR_GEMM_RESIDUAL_FIRST) != 0;
    t->lo = p->lo;
    t->hi = p->hi;
    t->bias = p->bias && !t->add ? p->bias + ob * g->B : NULL;
}

/* the tile's pointers and taps for output pixel (oy, ox) onwards: the taps inside the image */
static void tile_place(const tsr_nchwc_conv_t* p, const geo_t* g, tile_t* t, int64_t b,
                       int64_t ob, int64_t cb0, int64_t oy, int64_t ox) {
    int64_t dh = p->dh, dw = p->dw, iy0 = oy * g->sh - g->ph, ix0 = ox * g->sw - g->pw;
    int64_t ky0 = iy0 < 0 ? ceil_div(-iy0, dh) : 0;
    int64_t ky1 = g->H - iy0 > 0 ? min64(p->kh, ceil_div(g->H - iy0, dh)) : 0;
    int64_t kx0 = ix0 < 0 ? ceil_div(-ix0, dw) : 0;
    int64_t kx1 = g->W - ix0 > 0 ? min64(p->kw, ceil_div(g->W - ix0, dw)) : 0;
    t->nky = ky1 > ky0 ? ky1 - ky0 : 0;
    t->nkx = kx1 > kx0 ? kx1 - kx0 : 0;
    const float* xb = p->x + (b * (g->plain ? p->c : g->CB) + (g->dw ? ob : cb0)) * g->xcb;
    t->x = xb + ((iy0 + ky0 * dh) * g->W + ix0 + kx0 * dw) * g->bx;
    t->w = p->wp + ob * g->wobs + (g->dw ? 0 : cb0 * g->wcbs) +
           (ky0 * p->kw + kx0) * (g->dw ? g->B : g->bx * g->B);
    int64_t yoff = ((b * g->OB + ob) * g->OH + oy) * g->OW * g->B + ox * g->B;
    t->y = p->y + yoff;
    t->r = p->r ? p->r + yoff : NULL;
}

/* the tile np pixels on along its row (the taps the same: interior pixels) */
static inline void tile_step(tile_t* t, int64_t np, int64_t B) {
    t->x += np * t->ps;
    t->y += np * B;
    if (t->r) t->r += np * B;
}

/* whether a depthwise 3-wide convolution's rows run whole in 3-wide tiles: its x86 path,
   at most a column of padding at either end of a row (a tile's first and last input
   columns; the tiles of 1 to NP pixels, stride 1 or 2) */
static int dw3_rows(const geo_t* g) {
    return g->dw3 && g->path != TSR_GEMM_PORTABLE && g->sw <= 2 && g->pw <= 1 &&
           (g->OW - 1) * g->sw - g->pw + 2 <= g->W;
}

/* output rows [oy0, oy1) of depthwise block ob of batch element b whole in 3-wide tiles
   (dw3_rows), the padding columns read as zeros; the pointers placed here, without
   tile_place's divisions (a 7x7 layer's tile is 60 FMAs). MobileNetV2's depthwise layers
   at one thread, against interior tiles and border columns: 14x14 25% and 7x7 45% less
   time on AVX-512, 35% and 55% on AVX2 */
static void dw3_row_tiles(const tsr_nchwc_conv_t* p, const geo_t* g, tile_t* t, int np_tile,
                          int64_t b, int64_t ob, int64_t oy0, int64_t oy1, dry_t* dry) {
    int64_t B = g->B, W = g->W, OW = g->OW, kh = p->kh, dh = p->dh;
    const float* x = p->x + (b * g->CB + ob) * g->xcb;
    const float* w = p->wp + ob * g->wobs;
    int64_t y0 = (b * g->OB + ob) * g->OH * OW * B;
    t->nkx = 3;
    for (int64_t oy = oy0; oy < oy1; oy++) {
        int64_t iy0 = oy * g->sh - g->ph, ky0 = 0, ky1 = kh;
        if (iy0 < 0 || iy0 + (kh - 1) * dh >= g->H) {   /* tap rows outside: narrowed */
            ky0 = iy0 < 0 ? ceil_div(-iy0, dh) : 0;
            ky1 = g->H - iy0 > 0 ? min64(kh, ceil_div(g->H - iy0, dh)) : 0;
        }
        t->nky = ky1 > ky0 ? ky1 - ky0 : 0;
        t->w = w + ky0 * p->kw * B;
        const float* xr = x + (iy0 + ky0 * dh) * W * B;
        for (int64_t ox = 0; ox < OW; ox += np_tile) {
            int np = (int)min64(np_tile, OW - ox);
            int pad = (ox * g->sw < g->pw) | ((ox + np - 1) * g->sw - g->pw + 2 >= W) << 1;
            int64_t yoff = y0 + (oy * OW + ox) * B;
            t->x = xr + max64(ox * g->sw - g->pw, 0) * B;   /* (past a padding column) */
            t->y = p->y + yoff;
            t->r = p->r ? p->r + yoff : NULL;
            run_tile(g, t, 1 + pad, np, 0, dry);
        }
    }
}

/* output rows [oy0, oy1) (pixels [oy0, oy1) of a flat plane) of output blocks [ob, ob + nb)
   over input blocks [cb0, cb0 + ncb) of batch element b. The interior pixels (every tap
   column inside the image) run in tiles along each row; a border column's pixels in the
   rows whose tap rows are all inside run in tiles down the column (they share their taps),
   the rest one at a time. A dry run (dry given) walks only what picks distinct tiles: one
   row (every row's tiles are the same), one border column (likewise), a flat plane's first
   and last tile. */
static void conv_rows(const tsr_nchwc_conv_t* p, const geo_t* g, int np_tile, int64_t b,
                      int64_t ob, int nb, int64_t cb0, int64_t ncb, int64_t oy0, int64_t oy1,
                      dry_t* dry) {
    tile_t t;
    tile_init(p, g, &t, ob, cb0, ncb);
    int64_t KH = p->kh, KW = p->kw, OW = g->OW, OH = g->OH;
    int64_t oxl = min64(ceil_div(g->pw, g->sw), OW), rhs = g->W - 1 + g->pw - (KW - 1) * p->dw;
    int64_t oxr = rhs < 0 ? oxl : max64(oxl, min64(OW, rhs / g->sw + 1));
    int64_t oyl = min64(ceil_div(g->ph, g->sh), OH), bot = g->H - 1 + g->ph - (KH - 1) * p->dh;
    int64_t oyr = bot < 0 ? oyl : max64(oyl, min64(OH, bot / g->sh + 1));
    if (g->sw > 2 && g->path != TSR_GEMM_PORTABLE) np_tile = 1;   /* row tiles: strides 1, 2 */
    if (dw3_rows(g)) {
        dw3_row_tiles(p, g, &t, np_tile, b, ob, oy0, dry ? min64(oy1, oy0 + 1) : oy1, dry);
        return;
    }
    /* the tiles along a row (and a flat plane's) share their taps: placed once, then each
       steps on from the last (tile_place's divisions cost as much as the FMAs of a small
       tile: MobileNetV2's 16-channel 112x112 expansion at one thread 5% faster on AVX-512,
       20% on AVX2's 6-pixel tiles) */
    if (g->flat) {
        tile_place(p, g, &t, b, ob, cb0, 0, oy0);
        for (int64_t ox = oy0; ox < oy1; ox += np_tile) {
            if (dry && ox > oy0 && oy1 - ox >= np_tile)   /* to the last tile */
                ox = oy1 - np_tile - (oy1 - oy0) % np_tile;
            int np = (int)min64(np_tile, oy1 - ox);
            run_tile(g, &t, nb, np, 0, dry);
            tile_step(&t, np_tile, g->B);
        }
        return;
    }
    int col_max = g->dw ? 8 : NP_COL_LIMIT[g->path][nb];
    for (int64_t oy = oy0; oy < (dry ? min64(oy1, oy0 + 1) : oy1); oy++) {
        if (oxl < oxr) tile_place(p, g, &t, b, ob, cb0, oy, oxl);
        for (int64_t ox = oxl; ox < oxr; ox += np_tile) {
            int np = (int)min64(np_tile, oxr - ox);
            run_tile(g, &t, nb, np, 0, dry);
            tile_step(&t, np_tile, g->B);
        }
    }
    t.ps = g->sh * g->W * g->bx;   /* columns */
    t.yps = OW * g->B;
    for (int64_t ox = 0; ox < OW; ox = ox + 1 == oxl ? max64(oxr, oxl) : ox + 1) {
        if (ox >= oxl && ox < oxr) continue;   /* (no interior: every column a border) */
        for (int64_t oy = oy0; oy < oy1;) {
            int np = oy >= oyl && oy < oyr ? (int)min64(col_max, min64(oyr, oy1) - oy) : 1;
            /* the rest of a column in tiles of 4, 2, 1: where an item's rows end varies
               with the threads, and a build of some tiles (an exported model's) then needs
               3 sizes, not col_max (columns are a small part of the work) */
            if (np < col_max) np = np >= 4 ? 4 : np >= 2 ? 2 : 1;
            tile_place(p, g, &t, b, ob, cb0, oy, ox);
            run_tile(g, &t, nb, np, 1, dry);
            oy += np;
        }
        if (dry) break;
    }
}

/* the rows (pixels, for a flat plane) of an item when the extent is cut into `bands` */
static int64_t band_rows(const geo_t* g, int64_t np, int64_t bands) {
    int64_t extent = g->flat ? g->OW : g->OH;
    int64_t rows = ceil_div(extent, min64(extent, max64(1, bands)));
    return g->flat && rows < extent ? min64(extent, ceil_div(rows, np) * np) : rows;
}

/* ---- Winograd F(4x4, 3x3) --------------------------------------------------------- */

/* A 3x3 stride-1 convolution (TSR_NCHWC_WINOGRAD) as Winograd F(4x4, 3x3): each 4x4 block of
   output pixels (a tile) is A^T [(G g G^T) * (B^T d B)] A of the 6x6 input pixels d under it,
   36 products per tile and channel pair where the direct tile makes 144 (2.25x fewer, for
   the transforms' cost). The weights are packed transformed, U (36, O/B, C/B, B, B). A work
   item is T consecutive tiles of the batch (rows of tiles across the images): their input
   transform V (36, C/B, T, B) in the thread's scratch, then per group of NB output blocks
   the 36 products V[pos] U[pos] on the direct convolution's own register tiles (a 1x1
   convolution over T "pixels", NP at a time, into M (36, NB, T, B)) and the output
   transform with bias, residual and activation applied before the one store. T is a
   multiple of NP (so a build needs the tiles of NP pixels and of the last item's rest).
   Each item reads all of U it uses (36 C O floats a layer, 4x the direct weights: 9 MB at
   256 channels), so items are few: T as large as keeps V under WINO_V (the products of
   one position read a slice of it, a fraction of L2), and where that leaves fewer than a
   few items a thread, the output blocks' groups split into parts, each item one part of
   one run of tiles (the input transform then made once per part, a few percent, and each
   part of U read by one item: ResNet-18's 128-channel 28x28 layer at batch 1, 49 tiles,
   reads its 2.4 MB of U once on two threads, half an item, where items of 7 tiles read it
   all 7 times: the whole graph 20% less CPU time). */
enum { WINO_V = 256 << 10 };   /* floats */

#if TSR_NCHWC_WINO
static _Thread_local float* wino_buf;
static _Thread_local int64_t wino_floats;

static float* wino_scratch(int64_t floats) {
    if (floats > wino_floats) {
        free(wino_buf);
        wino_floats = (floats + 4095) / 4096 * 4096;
        wino_buf = aligned_alloc(64, (size_t)wino_floats * sizeof(float));
        if (!wino_buf) wino_floats = 0;
    }
    return wino_buf;
}
#endif


/* B^T d (6 points, a row or a column of an input tile) and A^T m (6 -> 4) */
#define TSR_WINO_BT(d, o) {                                                                 \
    o[0] = 4.0f * d[0] - 5.0f * d[2] + d[4];                                               \
    o[1] = (d[3] + d[4]) - 4.0f * (d[1] + d[2]);                                           \
    o[2] = (d[4] - d[3]) + 4.0f * (d[1] - d[2]);                                           \
    o[3] = (d[4] - d[2]) + 2.0f * (d[3] - d[1]);                                           \
    o[4] = (d[4] - d[2]) - 2.0f * (d[3] - d[1]);                                           \
    o[5] = 4.0f * d[1] - 5.0f * d[3] + d[5]; }
#define TSR_WINO_AT(m, o) {                                                                 \
    o[0] = m[0] + (m[1] + m[2]) + (m[3] + m[4]);                                           \
    o[1] = (m[1] - m[2]) + 2.0f * (m[3] - m[4]);                                           \
    o[2] = (m[1] + m[2]) + 4.0f * (m[3] + m[4]);                                           \
    o[3] = (m[1] - m[2]) + 8.0f * (m[3] - m[4]) + m[5]; }

/* The transforms on vectors V of VW lanes (GCC's vector arithmetic): lanes [l0, l0 + VW) of
   the BW = B channels of a pixel, LOADU/STOREU of VW floats. IN: tiles [t0, t0 + nt) of the
   batch into v (36, CB, T, B), input pixels outside the image zero. OUT: m (36, nb, T, B) of
   tiles [t0, t0 + nt) into output blocks [ob, ob + nb), then the epilogue (as
   TSR_EPILOGUE's), the tile's pixels inside the output stored. */
#define TSR_U6 _Pragma("GCC unroll 6")
#define TSR_WINO(ATTR, SUF, V, VW, BW, LOADU, STOREU, SET1, MAX, MIN, KEEP)                    \
ATTR static void wino_in_##SUF(const tsr_nchwc_conv_t* p, const geo_t* g, float* v,       \
                               int64_t t0, int64_t nt, int64_t T, int64_t l0) {            \
    const int64_t bw_ = BW, TW = ceil_div(p->ow, 4), TT = ceil_div(p->oh, 4) * TW;         \
    const int64_t H = p->h, W = p->w, vs = g->CB * T * bw_;                                 \
    for (int64_t k = 0; k < nt; k++) {                                                    \
        int64_t b = (t0 + k) / TT, tr = (t0 + k) % TT;                                     \
        int64_t iy0 = tr / TW * 4 - p->ph, ix0 = tr % TW * 4 - p->pw;                       \
        int inside = iy0 >= 0 && ix0 >= 0 && iy0 + 6 <= H && ix0 + 6 <= W;                \
        for (int64_t cb = 0; cb < g->CB; cb++) {                                          \
            const float* x = p->x + (((b * g->CB + cb) * H + iy0) * W + ix0) * bw_ + l0;   \
            V d[6][6], r[6][6];                                                           \
            if (inside)                                                                   \
                TSR_U6 for (int i = 0; i < 6; i++)                                        \
                    TSR_U6 for (int j = 0; j < 6; j++)                                    \
                        d[i][j] = LOADU(x + (i * W + j) * bw_);                            \
            else   /* (a border tile: a loop, not 36 checks in line) */                   \
                for (int i = 0; i < 6; i++)                                               \
                    for (int j = 0; j < 6; j++)                                           \
                        d[i][j] = iy0 + i >= 0 && iy0 + i < H && ix0 + j >= 0 &&          \
                                  ix0 + j < W ? LOADU(x + (i * W + j) * bw_) : SET1(0.0f); \
            TSR_U6 for (int j = 0; j < 6; j++) {   /* down the columns, then the rows */  \
                V c[6] = {d[0][j], d[1][j], d[2][j], d[3][j], d[4][j], d[5][j]}, o[6];    \
                TSR_WINO_BT(c, o)                                                         \
                TSR_U6 for (int i = 0; i < 6; i++) r[i][j] = o[i];                        \
            }                                                                             \
            float* out = v + (cb * T + k) * bw_ + l0;                                     \
            TSR_U6 for (int i = 0; i < 6; i++) {                                          \
                V o[6];                                                                   \
                TSR_WINO_BT(r[i], o)                                                      \
                TSR_U6 for (int j = 0; j < 6; j++) STOREU(out + (i * 6 + j) * vs, o[j]);  \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}                                                                                         \
ATTR static void wino_out_##SUF(const tsr_nchwc_conv_t* p, const geo_t* g, const float* m, \
                                int64_t ob, int64_t nb, int64_t t0, int64_t nt,            \
                                int64_t T, int64_t l0) {                                  \
    const int64_t bw_ = BW, TW = ceil_div(p->ow, 4), TT = ceil_div(p->oh, 4) * TW;         \
    const int64_t OH = p->oh, OW = p->ow, ms = nb * T * bw_;                                \
    V lo_ = SET1(p->act == TSR_ACT_RELU ? 0.0f : p->lo), hi_ = SET1(p->hi);               \
    int first = (p->flags & TSR_GEMM_RESIDUAL_FIRST) != 0;                                \
    for (int64_t j = 0; j < nb; j++) {                                                    \
        V bias = p->bias ? LOADU(p->bias + (ob + j) * bw_ + l0) : SET1(0.0f);              \
        int64_t oleft = p->o - (ob + j) * bw_ - l0;                                        \
        for (int64_t k = 0; k < nt; k++) {                                                \
            int64_t b = (t0 + k) / TT, tr = (t0 + k) % TT;                                 \
            int64_t oy0 = tr / TW * 4, ox0 = tr % TW * 4;                                  \
            const float* mk = m + (j * T + k) * bw_ + l0;                                 \
            V r[4][6];                                                                    \
            TSR_U6 for (int c = 0; c < 6; c++) {   /* down the columns, then the rows */  \
                V s[6], o[4];                                                             \
                TSR_U6 for (int i = 0; i < 6; i++) s[i] = LOADU(mk + (i * 6 + c) * ms);   \
                TSR_WINO_AT(s, o)                                                         \
                TSR_U6 for (int i = 0; i < 4; i++) r[i][c] = o[i];                        \
            }                                                                             \
            int64_t off = (((b * g->OB + ob + j) * OH + oy0) * OW + ox0) * bw_ + l0;      \
            int64_t ny = OH - oy0 < 4 ? OH - oy0 : 4, nx = OW - ox0 < 4 ? OW - ox0 : 4;   \
            for (int i = 0; i < ny; i++) {                                                \
                V o[4];                                                                   \
                TSR_WINO_AT(r[i], o)                                                      \
                for (int c = 0; c < nx; c++) {                                            \
                    int64_t at = off + (i * OW + c) * bw_;                                 \
                    V a = o[c] + bias;                                                    \
                    if (p->r && first) a = a + LOADU(p->r + at);                           \
                    if (p->act == TSR_ACT_RELU) a = MAX(lo_, a);                          \
                    else if (p->act == TSR_ACT_CLAMP) a = MIN(hi_, MAX(lo_, a));          \
                    if (p->r && !first) a = a + LOADU(p->r + at);                          \
                    if (oleft < VW) a = KEEP(a, oleft);                                   \
                    STOREU(p->y + at, a);                                                 \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}

#if TSR_NCHWC_WINO
/* the portable transforms: 4 lanes at a time (SSE's width, what every x86-64 has) */
typedef float wv4 __attribute__((vector_size(16)));
static wv4 wv_load(const float* s) { wv4 r; memcpy(&r, s, sizeof r); return r; }
static void wv_store(float* d, wv4 a) { memcpy(d, &a, sizeof a); }
static wv4 wv_set1(float f) { return (wv4){f, f, f, f}; }
static wv4 wv_max(wv4 a, wv4 b) {   /* b where it is a NaN, as max(0, v) in the tiles */
    for (int k = 0; k < 4; k++) b[k] = a[k] > b[k] ? a[k] : b[k];
    return b;
}
static wv4 wv_min(wv4 a, wv4 b) {
    for (int k = 0; k < 4; k++) b[k] = a[k] < b[k] ? a[k] : b[k];
    return b;
}
static wv4 wv_keep(wv4 a, int64_t n) {
    for (int k = 0; k < 4; k++) a[k] = k < n ? a[k] : 0.0f;
    return a;
}
/* (loops, not unrolled, and out of line: the portable path is the fallback, not worth its
   code in every library) */
#undef TSR_U6
#define TSR_U6
TSR_WINO(__attribute__((noinline)), portable, wv4, 4, g->B, wv_load, wv_store, wv_set1, wv_max,
         wv_min, wv_keep)
#undef TSR_U6
#define TSR_U6 _Pragma("GCC unroll 6")
#if TSR_X86 && TSR_NCHWC_AVX512
TSR_WINO(TSR_AVX512, 512, __m512, 16, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps,
         _mm512_max_ps, _mm512_min_ps, keep512)
#endif
#if TSR_X86 && TSR_NCHWC_AVX2
TSR_WINO(TSR_AVX2, 256, __m256, 8, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps,
         _mm256_max_ps, _mm256_min_ps, keep256)
#endif

/* tiles [t0, t0 + nt) into output blocks [ob0, ob1) (an item's), or with dry the register
   tiles they run */
static void wino_tiles(const tsr_nchwc_conv_t* p, const geo_t* g, float* buf, int64_t t0,
                       int64_t nt, int64_t ob0, int64_t ob1, dry_t* dry) {
    int64_t B = g->B, CB = g->CB, OB = g->OB, NB = p->reserved[0], NP = p->reserved[1];
    int64_t T = p->reserved[2];
    if (dry) {   /* NP tiles, the rest of the last item */
        for (int64_t ob = 0; ob < OB; ob += NB) {
            run_tile(g, NULL, (int)min64(NB, OB - ob), (int)min64(NP, nt), 0, dry);
            if (nt % NP) run_tile(g, NULL, (int)min64(NB, OB - ob), (int)(nt % NP), 0, dry);
        }
        return;
    }
    float *v = buf, *m = buf + 36 * CB * T * B;
    {
#if TSR_X86 && TSR_NCHWC_AVX512
        if (g->path == TSR_GEMM_AVX512) wino_in_512(p, g, v, t0, nt, T, 0); else
#endif
#if TSR_X86 && TSR_NCHWC_AVX2
        if (g->path == TSR_GEMM_AVX2) wino_in_256(p, g, v, t0, nt, T, 0); else
#endif
        for (int64_t l0 = 0; l0 < B; l0 += 4) wino_in_portable(p, g, v, t0, nt, T, l0);
    }
    tile_t t;
    memset(&t, 0, sizeof t);
    t.ncb = CB; t.cbs = T * B; t.nky = t.nkx = 1; t.ps = B; t.kw = 1;
    t.wobs = CB * B * B; t.wcbs = B * B; t.yps = B; t.yobs = T * B; t.oleft = p->o;
    for (int64_t ob = ob0; ob < ob1; ob += NB) {
        int nb = (int)min64(NB, ob1 - ob);
        for (int pos = 0; pos < 36; pos++)
            for (int64_t k = 0; k < nt; k += NP) {
                t.x = v + (pos * CB * T + k) * B;
                t.w = p->wp + (pos * OB + ob) * CB * B * B;
                t.y = m + (pos * nb * T + k) * B;
                run_tile(g, &t, nb, (int)min64(NP, nt - k), 0, NULL);
            }
#if TSR_X86 && TSR_NCHWC_AVX512
        if (g->path == TSR_GEMM_AVX512) wino_out_512(p, g, m, ob, nb, t0, nt, T, 0); else
#endif
#if TSR_X86 && TSR_NCHWC_AVX2
        if (g->path == TSR_GEMM_AVX2) wino_out_256(p, g, m, ob, nb, t0, nt, T, 0); else
#endif
        for (int64_t l0 = 0; l0 < B; l0 += 4) wino_out_portable(p, g, m, ob, nb, t0, nt, T, l0);
    }
}
#endif

#if TSR_NCHWC_WINO
static int wino_geometry(const tsr_nchwc_conv_t* p) {
    return p->groups == 1 && !(p->flags & TSR_NCHWC_PLAIN_INPUT) && p->kh == 3 && p->kw == 3 &&
           p->sh == 1 && p->sw == 1 && p->dh == 1 && p->dw == 1;
}

/* the tiles of the batch: 4x4 output pixels each */
static int64_t wino_total(const tsr_nchwc_conv_t* p) {
    return p->n * ceil_div(p->oh, 4) * ceil_div(p->ow, 4);
}

/* T (tiles an item, reserved[2]) and the parts of the output blocks' groups (reserved[3])
   for `threads`: V under WINO_V, T a multiple of NP; from two threads, runs of tiles a
   multiple of the threads when there are 4 a thread or more, else the groups in as many
   parts as make the items a multiple of the threads (as near as the groups allow) */
static int64_t wino_plan(tsr_nchwc_conv_t* p, const geo_t* g, int threads) {
    int64_t NP = p->reserved[1], total = wino_total(p);
    int64_t groups = ceil_div(g->OB, p->reserved[0]);
    int64_t runs = ceil_div(total, max64(NP, WINO_V / (36 * g->CB * g->B) / NP * NP));
    int64_t parts = 1;
    if (threads > 1 && runs >= 4 * threads) {
        runs = ceil_div(runs, threads) * threads;
    } else if (threads > 1) {
        while (parts < groups && (runs * parts) % threads) parts++;
        while (runs * parts < threads && runs < ceil_div(total, NP)) runs++;
    }
    if (p->reserved[2] <= 0) p->reserved[2] = ceil_div(ceil_div(total, runs), NP) * NP;
    if (p->reserved[3] <= 0) p->reserved[3] = parts;
    p->reserved[3] = min64(p->reserved[3], groups);
    return ceil_div(total, p->reserved[2]) * p->reserved[3];
}
#endif

/* the plan without asking the CPU: the checks, then p->reserved (those not already set) */
static int64_t plan(tsr_nchwc_conv_t* p, int threads) {
    int isa = p->isa, B = p->block;
    if (isa < 0 || isa >= TSR_GEMM_ISAS || (B != 8 && B != 16)) return -1;
    if (p->n < 1 || p->c < 1 || p->h < 1 || p->w < 1 || p->o < 1 || p->oh < 1 || p->ow < 1 ||
        p->kh < 1 || p->kw < 1 || p->sh < 1 || p->sw < 1 || p->dh < 1 || p->dw < 1 ||
        p->ph < 0 || p->pw < 0)
        return -1;
    int plain = (p->flags & TSR_NCHWC_PLAIN_INPUT) != 0;
    if (p->groups != 1 && !(p->groups == p->c && p->groups == p->o && !plain)) return -1;
    if (p->act != TSR_ACT_NONE && p->act != TSR_ACT_RELU && p->act != TSR_ACT_CLAMP) return -1;
    geo_t g = geometry(p);
    int64_t *nb = &p->reserved[0], *np = &p->reserved[1], *chunk = &p->reserved[2],
            *rows = &p->reserved[3];
    /* 4 output blocks a tile (2 on AVX2: 4 x 3 pixels, 3 x 4 reach 90-95% of 2 x 6 on
       ResNet-18's 3x3 layers), or 3 where they divide the blocks and those do not (no
       tile of a lone block: MobileNetV2's 144-channel 1x1 convolutions 10% faster) */
    int64_t nb_max = g.path == TSR_GEMM_AVX2 ? 2 : 4;
    /* a plain-input (first) layer on AVX-512: 2 blocks x 14 pixels, since 4 x 7 with its 4
       weights and the broadcast needs 33 vectors and spills an accumulator every step
       (ResNet-18's 7x7/2 stem 5% faster, 2 x 12 and 4 x 6 in between; bench kernels:
       nchwc) */
    if (g.plain && g.path == TSR_GEMM_AVX512) nb_max = 2;
    if (*nb <= 0) *nb = g.dw ? 1 : g.OB % nb_max && g.OB % 3 == 0 ? 3 : min64(g.OB, nb_max);
    if (g.dw) *nb = 1;
    *nb = min64(*nb, NB_MAX);
    int lim = g.dw ? NP_DW_LIMIT[g.path] : NP_LIMIT[g.path][*nb];
    int wino = (p->flags & TSR_NCHWC_WINOGRAD) != 0;
#if TSR_NCHWC_WINO
    if (wino && !wino_geometry(p)) return -1;
#endif
    if (*np <= 0) {
        *np = wino ? lim : min64(lim, g.OW);   /* (Winograd's pixels are tiles) */
        /* whole depthwise rows: tiles of as even a width as DW3_NP allows (fewer sizes, so
           fewer tiles in a model's build: 56 pixels as 4 x 14, not 3 x 16 + 8) */
        if (dw3_rows(&g)) *np = ceil_div(g.OW, ceil_div(g.OW, min64(*np, DW3_NP)));
    }
    *np = min64(*np, lim);
#if TSR_NCHWC_WINO
    if (wino) return wino_plan(p, &g, threads);
#else
    if (wino) return -2;   /* (a build without the Winograd path) */
#endif
    int64_t cbs = plain ? p->c : g.CB;
    if (*chunk <= 0) {
        /* the tile's weights for one pass over the output rows stay in L2 (1 MB a core on
           Zen 5, half of it theirs): ResNet-18's 512-channel 3x3 layer reads 1.2 MB per
           4 output blocks, 16% slower whole than in two passes (bench kernels: nchwc) */
        int64_t per = *nb * g.wcbs * (int64_t)sizeof(float);
        int64_t passes = ceil_div(per * cbs, WEIGHTS_L2);
        *chunk = ceil_div(cbs, passes);
    }
    /* a residual in y's own buffer: a tile reads each residual value into its accumulator
       before it stores there, but a pass over some of the input blocks stores partial sums
       over it, so then one pass over them all */
    if (p->r && p->r == p->y) *chunk = cbs;
    if (*rows <= 0) {
        /* enough items for the threads to share evenly (work comes from one counter): the
           groups of output blocks when they give each thread two or more (each group's
           weights then read by one item: rows cut into bands re-read them per band, 3-9%
           more work on ResNet-18's 14x14 and 7x7 layers, bench kernels: nchwc), else bands
           of rows, several per thread */
        int64_t groups = p->n * ceil_div(g.OB, *nb);
        int64_t want = threads < 2 ? 1 : groups >= 2 * threads ? groups : 8 * threads;
        /* groups that do not divide among the threads, and few a thread, leave one thread
           a group behind at the end (MobileNetV2 b1 on 2 threads: 5, 9 and 15 groups, a
           fifth, ninth and fifteenth of those layers idle): each group cut into as many
           bands as there are threads instead; from 8 a thread the tail is at most 1/16
           (bench models: "mobilenet_v2 infer b1") */
        if (threads >= 2 && groups >= 2 * threads && groups % threads && groups < 8 * threads)
            want = groups * threads;
        *rows = band_rows(&g, *np, ceil_div(want, groups));
    }
    int64_t extent = g.flat ? g.OW : g.OH;
    return p->n * ceil_div(g.OB, *nb) * ceil_div(extent, *rows);
}

/* a dry run of every item's tiles (one batch element, the first and the last group of
   output blocks: the others run the same tiles) */
static void walk_items(const tsr_nchwc_conv_t* p, dry_t* dry) {
    geo_t g = geometry(p);
#if TSR_NCHWC_WINO
    if (p->flags & TSR_NCHWC_WINOGRAD) {
        wino_tiles(p, &g, NULL, 0, wino_total(p), 0, g.OB, dry);
        return;
    }
#endif
    int64_t NB = p->reserved[0], NP = p->reserved[1], rows = p->reserved[3];
    int64_t extent = g.flat ? g.OW : g.OH, last = (ceil_div(g.OB, NB) - 1) * NB;
    for (int64_t e0 = 0; e0 < extent; e0 += rows)
        for (int64_t ob0 = 0;; ob0 = last) {
            int nb = g.dw ? 1 : (int)min64(NB, g.OB - ob0);
            conv_rows(p, &g, (int)NP, 0, ob0, nb, 0, 1, e0, min64(extent, e0 + rows), dry);
            if (ob0 == last) break;
        }
}

int64_t tsr_nchwc_conv_plan(tsr_nchwc_conv_t* p, int threads) {
    if (p->isa < 0 || p->isa >= TSR_GEMM_ISAS || !tsr_nchwc_isa_supported(p->isa)) return -1;
    int64_t items = plan(p, threads);
    if (items > 0 && !path_built(path_of(p->isa, p->block))) return -2;
#if defined(TSR_NCHWC_TILES) || defined(TSR_NCHWC_K512)
    if (items > 0) {   /* a build of some tiles: all this plan runs must be among them */
        dry_t dry = {NULL, 0};
        walk_items(p, &dry);
        if (dry.missing) return -2;
    }
#endif
    return items;
}

int tsr_nchwc_conv_tiles(const tsr_nchwc_conv_t* p, unsigned char* used) {
    tsr_nchwc_conv_t q = *p;
    q.isa = q.block == 16 ? TSR_GEMM_AVX512 : TSR_GEMM_AVX2;
    if (plan(&q, 1) < 0) return -1;   /* (the blocking p->reserved sets kept, as there) */
    geo_t g = geometry(&q);
    if (q.flags & TSR_NCHWC_WINOGRAD) {   /* (the same tiles at any thread count) */
        dry_t wd = {used, 0};
        walk_items(&q, &wd);
        return 1;
    }
    int64_t cbs = g.plain ? q.c : g.CB, passes = ceil_div(cbs, q.reserved[2]);
    dry_t dry = {used, 0};
    /* every split of the rows a thread count can give (any rows per item, a superset) */
    int64_t extent = g.flat ? g.OW : g.OH, prev = 0;
    if (p->reserved[3] > 0) {   /* the rows per item fixed too */
        walk_items(&q, &dry);
        return (int)passes;
    }
    for (int64_t bands = 1; bands <= extent; bands++) {
        q.reserved[3] = band_rows(&g, q.reserved[1], bands);
        if (q.reserved[3] == prev) continue;
        prev = q.reserved[3];
        walk_items(&q, &dry);
    }
    return (int)passes;
}

void tsr_nchwc_conv_range(const tsr_nchwc_conv_t* p, int64_t lo, int64_t hi) {
    geo_t g = geometry(p);
    int64_t NB = p->reserved[0], NP = p->reserved[1], chunk = p->reserved[2],
            rows = p->reserved[3];
    if (NB <= 0 || NP <= 0 || chunk <= 0 || rows <= 0) return;
#if TSR_NCHWC_WINO
    if (p->flags & TSR_NCHWC_WINOGRAD) {
        int64_t total = wino_total(p), T = chunk, parts = rows, groups = ceil_div(g.OB, NB);
        float* buf = wino_scratch(36 * T * g.B * (g.CB + NB));
        for (int64_t item = lo; item < hi; item++) {
            if (!buf) {   /* (no memory for the scratch: NaN, not garbage) */
                int64_t n = g.OB * p->oh * p->ow * g.B;
                for (int64_t i = 0; i < p->n * n; i++) p->y[i] = NAN;
                return;
            }
            int64_t run = item / parts, part = item % parts;
            int64_t ob0 = part * groups / parts * NB, ob1 = (part + 1) * groups / parts * NB;
            wino_tiles(p, &g, buf, run * T, min64(T, total - run * T), ob0, min64(ob1, g.OB),
                       NULL);
        }
        return;
    }
#endif
    int64_t groups = ceil_div(g.OB, NB), extent = g.flat ? g.OW : g.OH;
    int64_t bands = ceil_div(extent, rows), cbs = g.plain ? p->c : g.CB;
    for (int64_t item = lo; item < hi; item++) {
        int64_t b = item / (groups * bands), rest = item % (groups * bands);
        int64_t ob0 = rest / bands * NB, band = rest % bands;
        int64_t ob1 = min64(g.OB, ob0 + NB), e0 = band * rows, e1 = min64(extent, e0 + rows);
        if (g.dw) {   /* one block at a time: each its own input plane */
            for (int64_t ob = ob0; ob < ob1; ob++)
                conv_rows(p, &g, (int)NP, b, ob, 1, 0, 1, e0, e1, NULL);
            continue;
        }
        for (int64_t cb0 = 0; cb0 < cbs; cb0 += chunk)
            conv_rows(p, &g, (int)NP, b, ob0, (int)(ob1 - ob0), cb0, min64(chunk, cbs - cb0),
                      e0, e1, NULL);
    }
}

/* ---- weights ------------------------------------------------------------------------ */

int64_t tsr_nchwc_packed_size(const tsr_nchwc_conv_t* p) {
    int64_t B = p->block, taps = p->kh * p->kw;
    if (B < 1) return -1;
    if (p->flags & TSR_NCHWC_WINOGRAD) return 36 * ceil_div(p->o, B) * ceil_div(p->c, B) * B * B;
    if (p->groups > 1) return ceil_div(p->c, B) * taps * B;
    if (p->flags & TSR_NCHWC_PLAIN_INPUT) return ceil_div(p->o, B) * p->c * taps * B;
    return ceil_div(p->o, B) * ceil_div(p->c, B) * taps * B * B;
}

#if TSR_NCHWC_WINO
/* G (g0, g1, g2), Winograd F(4x4, 3x3)'s filter transform of three values, as v0..v5: rows
   1-4 of G share their sums (10 operations for 18 products and 12 additions) */
#define TSR_WINO_G(g0, g1, g2)                                                              \
    const float s_ = (g0) + (g2), e_ = (g0) * (1.0f / 24) + (g2) * (1.0f / 6);             \
    const float f_ = (g1) * (1.0f / 12);                                                    \
    const float v0 = (g0) * 0.25f, v1 = -(s_ + (g1)) * (1.0f / 6);                          \
    const float v2 = -(s_ - (g1)) * (1.0f / 6), v3 = e_ + f_, v4 = e_ - f_, v5 = (g2);

/* U = G g G^T of each filter (float32, within a few ulps of the exact U), at
   [pos][ob][cb][ci][co]: a block of B x B filters at a time, gathered channel-last so that
   the transforms run across 16 output channel lanes, and U's 36 slices of the block written
   whole, past the cache. A library makes its Winograd layers' U at load, where this is
   memory speed (ResNet-18's 37 MB in 2.5 ms on one core) */
static void wino_filters(const tsr_nchwc_conv_t* p, const float* w, float* dst) {
    const int64_t B = p->block, O = p->o, C = p->c, OB = ceil_div(O, B), CB = ceil_div(C, B);
    float t[9][16][16], ub[36][16] __attribute__((aligned(16)));
    float a[6][3][16];
    for (int64_t ob = 0; ob < OB; ob++)
        for (int64_t cb = 0; cb < CB; cb++) {
            const int64_t no = min64(B, O - ob * B), nc = min64(B, C - cb * B);
            memset(t, 0, sizeof t);
            for (int64_t co = 0; co < no; co++)
                for (int64_t ci = 0; ci < nc; ci++)
                    for (int k = 0; k < 9; k++)
                        t[k][ci][co] = w[((ob * B + co) * C + cb * B + ci) * 9 + k];
            float* d = dst + (ob * CB + cb) * B * B;
            const int64_t pos = OB * CB * B * B;   /* from one position's slice to the next */
            for (int64_t ci = 0; ci < B; ci++, d += B) {
                for (int j = 0; j < 3; j++) {
                    const float *g0 = t[j][ci], *g1 = t[3 + j][ci], *g2 = t[6 + j][ci];
#pragma omp simd
                    for (int co = 0; co < 16; co++) {   /* (16 lanes: a fixed count) */
                        TSR_WINO_G(g0[co], g1[co], g2[co])
                        a[0][j][co] = v0, a[1][j][co] = v1, a[2][j][co] = v2;
                        a[3][j][co] = v3, a[4][j][co] = v4, a[5][j][co] = v5;
                    }
                }
                for (int i = 0; i < 6; i++) {
                    float* u = ub[6 * i];
#pragma omp simd
                    for (int co = 0; co < 16; co++) {
                        TSR_WINO_G(a[i][0][co], a[i][1][co], a[i][2][co])
                        u[co] = v0, u[16 + co] = v1, u[32 + co] = v2;
                        u[48 + co] = v3, u[64 + co] = v4, u[80 + co] = v5;
                    }
                }
                /* (U is written once here and first read by a run: not through the cache;
                   dst is 64-byte aligned) */
                for (int q = 0; q < 36; q++)
                    for (int64_t co = 0; co < B; co += 4)
#if defined(__SSE2__)
                        _mm_stream_ps(d + q * pos + co, _mm_load_ps(ub[q] + co));
#else
                        memcpy(d + q * pos + co, ub[q] + co, 4 * sizeof(float));
#endif
            }
        }
#if defined(__SSE2__)
    _mm_sfence();
#endif
}
#endif

/* blocked: [ob][cb][ky][kx][ci][co]; plain input: [ob][c][ky][kx][co]; depthwise:
   [cb][ky][kx][co] (co the B channels of a block, a vector; zeros past o and c); Winograd:
   each filter's U = G g G^T (wino_filters) */
void tsr_nchwc_pack_weights(const tsr_nchwc_conv_t* p, const float* w, float* dst) {
    int64_t B = p->block, taps = p->kh * p->kw, O = p->o, C = p->c;
    int64_t OB = ceil_div(O, B), CB = ceil_div(C, B);
#if TSR_NCHWC_WINO   /* (a model's build: where a layer runs it) */
    if ((p->flags & TSR_NCHWC_WINOGRAD) && p->kh == 3 && p->kw == 3 && p->groups == 1) {
        wino_filters(p, w, dst);
        return;
    }
#endif
    memset(dst, 0, (size_t)tsr_nchwc_packed_size(p) * sizeof(float));
    if (p->groups > 1) {
        for (int64_t o = 0; o < O; o++)
            for (int64_t t = 0; t < taps; t++)
                dst[(o / B * taps + t) * B + o % B] = w[o * taps + t];
        return;
    }
    int plain = (p->flags & TSR_NCHWC_PLAIN_INPUT) != 0;
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t t = 0; t < taps; t++) {
                float v = w[(o * C + c) * taps + t];
                int64_t at = plain ? (((o / B) * C + c) * taps + t) * B + o % B
                                   : ((((o / B) * CB + c / B) * taps + t) * B + c % B) * B + o % B;
                dst[at] = v;
            }
    (void)OB;
}

/* ---- layout changes ----------------------------------------------------------------- */

void tsr_nchwc_to_blocked(const float* x, float* y, int64_t n, int64_t c, int64_t hw,
                          int block) {
    int64_t B = block, CB = ceil_div(c, B);
    for (int64_t b = 0; b < n; b++)
        for (int64_t cb = 0; cb < CB; cb++) {
            float* d = y + (b * CB + cb) * hw * B;
            int64_t nc = min64(B, c - cb * B);
            const float* s = x + (b * c + cb * B) * hw;
            for (int64_t i = 0; i < hw; i++) {
                for (int64_t k = 0; k < nc; k++) d[i * B + k] = s[k * hw + i];
                for (int64_t k = nc; k < B; k++) d[i * B + k] = 0.0f;
            }
        }
}

void tsr_nchwc_from_blocked(const float* x, float* y, int64_t n, int64_t c, int64_t hw,
                            int block) {
    int64_t B = block, CB = ceil_div(c, B);
    for (int64_t b = 0; b < n; b++)
        for (int64_t cb = 0; cb < CB; cb++) {
            const float* s = x + (b * CB + cb) * hw * B;
            int64_t nc = min64(B, c - cb * B);
            float* d = y + (b * c + cb * B) * hw;
            for (int64_t k = 0; k < nc; k++)
                for (int64_t i = 0; i < hw; i++) d[k * hw + i] = s[i * B + k];
        }
}

/* ---- pooling ------------------------------------------------------------------------ */

/* (left out of a build defining TSR_NCHWC_NO_POOLING: tessera's libraries of some tiles,
   whose pooling is the library without tiles': 70% of its compile time) */
#ifndef TSR_NCHWC_NO_POOLING

int64_t tsr_nchwc_pool_plan(tsr_nchwc_pool_t* p, int threads) {
    (void)threads;
    if (p->block != 8 && p->block != 16) return -1;
    if (p->isa < 0 || p->isa >= TSR_GEMM_ISAS || !tsr_nchwc_isa_supported(p->isa)) return -1;
    if (p->n < 1 || p->cb < 1 || p->h < 1 || p->w < 1 || p->oh < 1 || p->ow < 1 ||
        p->kh < 1 || p->kw < 1 || p->sh < 1 || p->sw < 1 || p->ph < 0 || p->pw < 0 ||
        (p->kind != 0 && p->kind != 1))
        return -1;
    if (!path_built(path_of(p->isa, p->block))) return -2;
    return p->n * p->cb * p->oh;
}

/* output pixels [ox0, ox1) of one row: PyTorch's window (start clipped, end min(start + k,
   size + pad) for the divisor counting padding, then clipped to the image). The x86 rows keep
   the maximum in a vector and whether a NaN went by in a mask (vmaxps alone drops a NaN met
   before a number; PyTorch's max pooling propagates it) */
#define TSR_POOL_ROW(ATTR, NAME, V, BW, M, LOADU, STOREU, SET1, ADD, MAX, DIV, NANS, WITH_NAN) \
ATTR static void NAME(const tsr_nchwc_pool_t* p, int64_t item, int64_t ox0, int64_t ox1) { \
    const int64_t bw_ = BW;                                                               \
    int64_t plane = item / p->oh, oy = item % p->oh;                                      \
    const float* x = p->x + plane * p->h * p->w * bw_;                                     \
    float* y = p->y + (plane * p->oh + oy) * p->ow * bw_;                                  \
    int64_t hs = oy * p->sh - p->ph, he = min64(hs + p->kh, p->h + p->ph);                \
    int64_t hn = he - hs;                                                                 \
    hs = max64(hs, 0);                                                                    \
    he = min64(he, p->h);                                                                 \
    for (int64_t ox = ox0; ox < ox1; ox++) {                                              \
        int64_t ws = ox * p->sw - p->pw, we = min64(ws + p->kw, p->w + p->pw);            \
        int64_t wn = we - ws;                                                             \
        ws = max64(ws, 0);                                                                \
        we = min64(we, p->w);                                                             \
        V acc = SET1(p->kind ? 0.0f : -INFINITY);                                         \
        M nan = 0;                                                                        \
        for (int64_t iy = hs; iy < he; iy++) {                                            \
            const float* s = x + (iy * p->w + ws) * bw_;                                   \
            if (p->kind)                                                                  \
                for (int64_t ix = ws; ix < we; ix++, s += bw_) acc = ADD(acc, LOADU(s));   \
            else                                                                          \
                for (int64_t ix = ws; ix < we; ix++, s += bw_) {                           \
                    V v = LOADU(s);                                                       \
                    acc = MAX(v, acc);                                                    \
                    nan |= NANS(v);                                                       \
                }                                                                         \
        }                                                                                 \
        if (p->kind) {                                                                    \
            int64_t cnt = p->count_include_pad ? hn * wn : (he - hs) * (we - ws);         \
            acc = DIV(acc, SET1(cnt > 0 ? (float)cnt : 1.0f));                            \
        } else {                                                                          \
            acc = WITH_NAN(acc, nan);                                                     \
        }                                                                                 \
        STOREU(y + ox * bw_, acc);                                                         \
    }                                                                                     \
}

/* Max pooling's interior on x86: POOL_NP output pixels of a row whose windows lie inside
   the image's columns, KW taps SW apart (compile-time), over `rows` input rows rs apart.
   Each input vector is loaded once and maxed into every window holding it: 6.4 loads an
   output for 3x3/2 where the window-at-a-time row makes 9, each with its own NaN check.
   Here max(v, acc) keeps a NaN already in acc but drops one in v; instead one unordered
   compare of each pair of loads goes into the masks nan (two, for two short chains), and a
   row whose masks come out set is run again by the exact row. (A checksum of the loads,
   one add each, made a chain as long as the row: 5% slower on ResNet-18's pool.) */
enum { POOL_NP = 8 };
#define TSR_POOL_TILE(ATTR, NAME, V, BW, LOADU, STOREU, SET1, M, UNORD, MOR, MAX)             \
ATTR TSR_INLINE void NAME(const float* x, float* y, int64_t rows, int64_t rs, M* nan,      \
                          const int KW, const int SW) {                                  \
    V acc[POOL_NP];                                                                      \
    _Pragma("GCC unroll 8") for (int o = 0; o < POOL_NP; o++) acc[o] = SET1(-INFINITY);   \
    for (int64_t r = 0; r < rows; r++, x += rs) {                                         \
        V prev = SET1(0.0f);                                                              \
        _Pragma("GCC unroll 24") for (int i = 0; i < (POOL_NP - 1) * SW + KW; i++) {      \
            V v = LOADU(x + i * BW);                                                      \
            if (i % 2) nan[(i / 2) % 2] = MOR(nan[(i / 2) % 2], UNORD(prev, v));           \
            else if (i + 1 == (POOL_NP - 1) * SW + KW)                                    \
                nan[0] = MOR(nan[0], UNORD(v, v));                                        \
            prev = v;                                                                     \
            _Pragma("GCC unroll 4") for (int kx = 0; kx < KW; kx++)                       \
                if (i >= kx && (i - kx) % SW == 0 && (i - kx) / SW < POOL_NP)             \
                    acc[(i - kx) / SW] = MAX(v, acc[(i - kx) / SW]);                      \
        }                                                                                 \
    }                                                                                     \
    _Pragma("GCC unroll 8") for (int o = 0; o < POOL_NP; o++) STOREU(y + o * BW, acc[o]); \
}

/* a max pooling row: the exact row at the borders (and where a NaN was seen), the tiles
   between, the last tile moved back to end with the interior (it writes some pixels twice,
   the same values) */
#define TSR_POOL_MAX_ROW(ATTR, NAME, BW, M, M0, MOR, ANY_NAN, ROW, TILE)                  \
ATTR static void NAME(const tsr_nchwc_pool_t* p, int64_t item) {                          \
    int64_t plane = item / p->oh, oy = item % p->oh, W = p->w, SW = p->sw, KW = p->kw;    \
    int64_t oxl = min64(ceil_div(p->pw, SW), p->ow), end = W + p->pw - KW;                \
    int64_t oxr = end < 0 ? oxl : max64(oxl, min64(p->ow, end / SW + 1));                 \
    /* (the windows of ResNet's, MobileNet's and LeNet's pools; others window at a time) */ \
    int fast = (KW == 3 && (SW == 1 || SW == 2)) || (KW == 2 && SW == 2);                 \
    if (p->kind || !fast || oxr - oxl < POOL_NP) { ROW(p, item, 0, p->ow); return; }      \
    ROW(p, item, 0, oxl);                                                                 \
    ROW(p, item, oxr, p->ow);                                                             \
    int64_t hs = max64(oy * p->sh - p->ph, 0), he = min64(oy * p->sh - p->ph + p->kh, p->h); \
    const float* x = p->x + (plane * p->h + hs) * W * BW;                                  \
    float* y = p->y + (plane * p->oh + oy) * p->ow * BW;                                   \
    M s[2] = {M0, M0};                                                                    \
    for (int64_t ox = oxl; ox < oxr; ox += POOL_NP) {                                     \
        if (ox + POOL_NP > oxr) ox = oxr - POOL_NP;                                       \
        const float* xt = x + (ox * SW - p->pw) * BW;                                     \
        if (KW == 3 && SW == 2) TILE(xt, y + ox * BW, he - hs, W * BW, s, 3, 2);          \
        else if (KW == 3) TILE(xt, y + ox * BW, he - hs, W * BW, s, 3, 1);                \
        else TILE(xt, y + ox * BW, he - hs, W * BW, s, 2, 2);                             \
    }                                                                                     \
    if (ANY_NAN(MOR(s[0], s[1]))) ROW(p, item, oxl, oxr);                              \
}

/* the portable row: the B floats of a pixel (any B <= 16) as a "vector" */
typedef struct { float v[16]; } pv_t;
static pv_t pv_load_n(const float* s, int64_t n) {
    pv_t r = {{0}};
    memcpy(r.v, s, (size_t)n * sizeof(float));
    return r;
}
static void pv_store_n(float* d, pv_t a, int64_t n) { memcpy(d, a.v, (size_t)n * sizeof(float)); }
static pv_t pv_set1(float f) { pv_t r; for (int k = 0; k < 16; k++) r.v[k] = f; return r; }
static pv_t pv_add(pv_t a, pv_t b) { for (int k = 0; k < 16; k++) a.v[k] += b.v[k]; return a; }
static pv_t pv_div(pv_t a, pv_t b) { for (int k = 0; k < 16; k++) a.v[k] /= b.v[k]; return a; }
static pv_t pv_max(pv_t a, pv_t b) {   /* a NaN in a wins, as in PyTorch's */
    for (int k = 0; k < 16; k++) b.v[k] = a.v[k] > b.v[k] || a.v[k] != a.v[k] ? a.v[k] : b.v[k];
    return b;
}
static int pv_nans(pv_t a) { (void)a; return 0; }
static pv_t pv_with_nan(pv_t a, int m) { (void)m; return a; }
#define pv_load(s) pv_load_n(s, bw_)
#define pv_store(d, a) pv_store_n(d, a, bw_)

#if TSR_X86
TSR_AVX512 TSR_INLINE __mmask16 nans512(__m512 v) {
    return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
}
TSR_AVX512 TSR_INLINE __m512 with_nan512(__m512 a, __mmask16 m) {
    return _mm512_mask_mov_ps(a, m, _mm512_set1_ps(NAN));
}
TSR_AVX2 TSR_INLINE int nans256(__m256 v) {
    return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}
TSR_AVX2 TSR_INLINE __m256 with_nan256(__m256 a, int m) {
    __m256i bits = _mm256_and_si256(_mm256_set1_epi32(m),
                                    _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128));
    __m256 lanes = _mm256_castsi256_ps(_mm256_cmpgt_epi32(bits, _mm256_setzero_si256()));
    return _mm256_blendv_ps(a, _mm256_set1_ps(NAN), lanes);
}
#if TSR_NCHWC_AVX512
TSR_POOL_ROW(TSR_AVX512, pool_row512, __m512, 16, __mmask16, _mm512_loadu_ps, _mm512_storeu_ps,
             _mm512_set1_ps, _mm512_add_ps, _mm512_max_ps, _mm512_div_ps, nans512, with_nan512)
TSR_AVX512 TSR_INLINE __mmask16 unord512(__m512 a, __m512 b) {
    return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
}
TSR_AVX512 TSR_INLINE __mmask16 mor512(__mmask16 a, __mmask16 b) { return a | b; }
TSR_AVX512 TSR_INLINE int any512(__mmask16 a) { return a != 0; }
TSR_POOL_TILE(TSR_AVX512, pool_tile512, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
              _mm512_set1_ps, __mmask16, unord512, mor512, _mm512_max_ps)
TSR_POOL_MAX_ROW(TSR_AVX512, pool_max512, 16, __mmask16, 0, mor512, any512, pool_row512,
                 pool_tile512)
#endif
#if TSR_NCHWC_AVX2
TSR_POOL_ROW(TSR_AVX2, pool_row256, __m256, 8, int, _mm256_loadu_ps, _mm256_storeu_ps,
             _mm256_set1_ps, _mm256_add_ps, _mm256_max_ps, _mm256_div_ps, nans256, with_nan256)
TSR_AVX2 TSR_INLINE __m256 unord256(__m256 a, __m256 b) {
    return _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
}
TSR_AVX2 TSR_INLINE int any256(__m256 a) { return _mm256_movemask_ps(a) != 0; }
TSR_POOL_TILE(TSR_AVX2, pool_tile256, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps,
              _mm256_set1_ps, __m256, unord256, _mm256_or_ps, _mm256_max_ps)
TSR_POOL_MAX_ROW(TSR_AVX2, pool_max256, 8, __m256, _mm256_setzero_ps(), _mm256_or_ps, any256,
                 pool_row256, pool_tile256)
#endif
#endif
TSR_POOL_ROW(, pool_row_portable, pv_t, p->block, int, pv_load, pv_store, pv_set1, pv_add,
             pv_max, pv_div, pv_nans, pv_with_nan)

void tsr_nchwc_pool_range(const tsr_nchwc_pool_t* p, int64_t lo, int64_t hi) {
    int path = path_of(p->isa, p->block);
    for (int64_t item = lo; item < hi; item++) {
#if TSR_X86 && TSR_NCHWC_AVX512
        if (path == TSR_GEMM_AVX512) { pool_max512(p, item); continue; }
#endif
#if TSR_X86 && TSR_NCHWC_AVX2
        if (path == TSR_GEMM_AVX2) { pool_max256(p, item); continue; }
#endif
        pool_row_portable(p, item, 0, p->ow);
        (void)path;
    }
}
#endif
