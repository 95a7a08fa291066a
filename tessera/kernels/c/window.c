/* im2col/col2im for convolution and max pooling's backward (tessera/kernels/window.py):
   one library for every shape, sizes being run-time arguments. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "window.h"

/* one image: x (C, H, W) -> rows [lo, hi) of cols (C*KH*KW, OH*OW), rows LD apart (OH*OW,
   or N*OH*OW when the images' columns sit side by side) */
#define IM2COL(T, NAME, BLOCK)                                                            \
void NAME(const T* x, T* cols, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,   \
          int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW,         \
          int64_t OH, int64_t OW, int64_t LD, int64_t lo, int64_t hi) {                   \
    (void)C;                                                                              \
    BLOCK(x, cols, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OW, LD, lo, hi, 0, OH);          \
}

/* planes [lo, hi): dx = 0, then scatter-add g at idx; returns an invalid index + 1 or 0 */
#define MAXPOOL_BWD(T, NAME)                                                              \
int64_t NAME(const T* g, const int64_t* idx, T* dx, int64_t in_plane, int64_t out_plane,  \
             int64_t lo, int64_t hi) {                                                    \
    int64_t bad = 0;                                                                      \
    for (int64_t p = lo; p < hi; p++) {                                                   \
        T* d = dx + p * in_plane;                                                         \
        memset(d, 0, in_plane * sizeof(T));                                               \
        for (int64_t o = p * out_plane; o < (p + 1) * out_plane; o++) {                   \
            int64_t i = idx[o];                                                           \
            if (i < 0 || i >= in_plane) { bad = i < 0 ? i - 1 : i + 1; continue; }        \
            d[i] += g[o];                                                                 \
        }                                                                                 \
    }                                                                                     \
    return bad;                                                                           \
}

IM2COL_BLOCK(float, im2col_block_f32)
IM2COL_BLOCK(double, im2col_block_f64)
IM2COL(float, tsr_im2col_f32, im2col_block_f32)
IM2COL(double, tsr_im2col_f64, im2col_block_f64)
COL2IM(float, tsr_col2im_f32)
COL2IM(double, tsr_col2im_f64)
MAXPOOL_BWD(float, tsr_maxpool2d_bwd_f32)
MAXPOOL_BWD(double, tsr_maxpool2d_bwd_f64)
