/* Tessera's blocked-layout (NCHWc) inference convolutions and pooling (nchwc.c), as MLAS
   runs a convolutional trunk: activations as (N, C/B, H, W, B) with B = 16 (AVX-512) or 8
   (AVX2, portable C), channels past C zero; every convolution a direct one whose inner step
   broadcasts one input value and multiplies it into vectors of B output channels' weights,
   over a register tile of output pixels x output-channel blocks, bias, activation and
   residual applied in registers. No im2col, no layout copy between layers.

   Dependency-free (libc, libm; gemm.h's enums): a compiled model's C library copies nchwc.h
   and nchwc.c as they are. Each path is compiled under its own __attribute__((target)) and
   chosen at run time by `isa` (TSR_GEMM_PORTABLE/AVX2/AVX512); B = 16 runs the AVX-512 path
   when isa allows it, B = 8 the AVX2 one, anything else portable C (both B, any isa).

   Use: fill a tsr_nchwc_conv_t (zero it first), pack the weights once with
   tsr_nchwc_pack_weights, call tsr_nchwc_conv_plan(&p, threads) for the number of work
   items, then tsr_nchwc_conv_range(&p, lo, hi) over any partition of [0, items) on any
   threads (items write disjoint parts of y; the result does not depend on the partition). */
#ifndef TSR_NCHWC_H
#define TSR_NCHWC_H

#include <stdint.h>

#include "gemm.h"

enum { TSR_NCHWC_PLAIN_INPUT = 16 };  /* flag: x is plain NCHW (a first layer, few channels) */
/* flag: a 3x3 stride-1 ungrouped convolution of blocked input run as Winograd F(4x4, 3x3),
   its weights packed transformed (36 (O/B) (C/B) B B floats) */
enum { TSR_NCHWC_WINOGRAD = 32 };

typedef struct tsr_nchwc_conv {
    int64_t n, c, h, w;            /* input: batch, channels (unpadded), height, width     */
    int64_t o, oh, ow;             /* output channels (unpadded), height, width             */
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t groups;                /* 1, or groups == c == o (depthwise)                    */
    int32_t block, isa;            /* B (8 or 16); TSR_GEMM_PORTABLE/AVX2/AVX512            */
    const float* x;                /* (n, ceil(c/B), h, w, B), or (n, c, h, w) with PLAIN   */
    const float* wp;               /* weights packed by tsr_nchwc_pack_weights              */
    const float* bias;             /* ceil(o/B)*B values, zero padded, or NULL              */
    const float* r;                /* residual laid out like y (or y itself), or NULL       */
    float* y;                      /* (n, ceil(o/B), oh, ow, B)                             */
    int32_t act, flags;            /* TSR_ACT_NONE/RELU/CLAMP; TSR_GEMM_RESIDUAL_FIRST |    */
    float lo, hi;                  /*   TSR_NCHWC_PLAIN_INPUT; CLAMP bounds                 */
    int64_t reserved[4];           /* the plan's own blocking (set by tsr_nchwc_conv_plan)  */
} tsr_nchwc_conv_t;

/* The input taps at row oy * sh - ph + ky * dh (column likewise); those outside the image
   read zero, on every side, so oh and ow may imply more padding below and right than ph and
   pw (ONNX's asymmetric pads, ceil mode). reserved (0: the plan chooses): output-channel
   blocks per register tile, output pixels per register tile, input-channel blocks per pass
   over the output, output rows per work item. */

int tsr_nchwc_isa_supported(int isa);   /* the CPU (and OS) can run this path */
int tsr_nchwc_isa_best(void);           /* the fastest path this CPU runs */

int64_t tsr_nchwc_packed_size(const tsr_nchwc_conv_t* p);   /* floats of packed weights */
/* w: PyTorch's (o, c/groups, kh, kw) float32 weights, into dst (64-byte aligned) */
void tsr_nchwc_pack_weights(const tsr_nchwc_conv_t* p, const float* w, float* dst);
/* number of independent work items for `threads` threads (writes p->reserved), or -1 when
   the geometry or isa is not supported, -2 when this build left out a register tile the plan
   runs (see tsr_nchwc_conv_tiles; the caller then raises) */
int64_t tsr_nchwc_conv_plan(tsr_nchwc_conv_t* p, int threads);
void tsr_nchwc_conv_range(const tsr_nchwc_conv_t* p, int64_t lo, int64_t hi);

/* The register tiles (compiled instances in nchwc.c) a convolution's plans can run at any
   thread count on the x86 path of its block (16: AVX-512, 8: AVX2; p->isa, the pointers and
   the CPU are not consulted; the portable path needs none), or with the blocking p->reserved
   sets (0: planned; rows per item set: that split only): used[id] = 1 for each, id =
   ((((kind * 2 + wide) * 2 + plain) * 3 + sub) * 5 + nb) * 17 + np with kind 0 a row tile,
   1 a column, 2 depthwise, 3 depthwise 3-wide; wide 1 on AVX-512; plain the plain-input
   flag; sub the stride (1, 2; 0 for a column); nb output blocks (1 for depthwise); np
   pixels. Returns the plan's passes over the input blocks (>= 1; more than one: y cannot
   take over the residual's buffer without a slower plan), or -1 when the geometry is not
   supported. A build defining TSR_NCHWC_TILES compiles only the tiles its header lists (an
   exported model: those of its layers). */
enum { TSR_NCHWC_TILE_IDS = 4 * 2 * 2 * 3 * 5 * 17 };
int tsr_nchwc_conv_tiles(const tsr_nchwc_conv_t* p, unsigned char* used);

/* layout changes: plain (n, c, hw) <-> blocked (n, ceil(c/B), hw, B), zero-filling padding */
void tsr_nchwc_to_blocked(const float* x, float* y, int64_t n, int64_t c, int64_t hw, int block);
void tsr_nchwc_from_blocked(const float* x, float* y, int64_t n, int64_t c, int64_t hw, int block);

/* max / average pooling of blocked planes (vectors of B channels); avg counts padding as
   PyTorch's count_include_pad says (flag 1 = include); items over (n * C/B * oh) rows */
typedef struct tsr_nchwc_pool {
    int64_t n, cb, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
    int32_t block, isa, kind, count_include_pad;   /* kind 0 max, 1 average */
    const float* x; float* y;
} tsr_nchwc_pool_t;
int64_t tsr_nchwc_pool_plan(tsr_nchwc_pool_t* p, int threads);
void tsr_nchwc_pool_range(const tsr_nchwc_pool_t* p, int64_t lo, int64_t hi);

#endif
