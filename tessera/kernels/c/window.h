/* The window bounds, im2col and col2im, macros over the element type: in window.c and in
   the convolution drivers (conv.h). The includer brings <stdint.h> and <string.h>. */

/* the output columns ow whose input column ow*SW + off lies inside [0, W): [*a, *b) */
static inline void inside(int64_t off, int64_t SW, int64_t W, int64_t OW, int64_t* a,
                          int64_t* b) {
    int64_t lo = off < 0 ? (-off + SW - 1) / SW : 0;
    int64_t hi = W - 1 - off < 0 ? 0 : (W - 1 - off) / SW + 1;
    if (hi > OW) hi = OW;
    if (lo > hi) lo = hi;
    *a = lo; *b = hi;
}

/* one image x (C, H, W): window rows [lo, hi) of cols (C*KH*KW, ...) for output rows
   [oh0, oh1), each cols row LD apart and starting at output row oh0; zero where the window
   is padding. Row r is (c, kh, kw): c = r / (KH*KW), kh and kw its remainder's row and
   column. */
#define IM2COL_BLOCK(T, NAME)                                                             \
static void NAME(const T* x, T* cols, int64_t H, int64_t W, int64_t KH, int64_t KW,       \
                 int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW,  \
                 int64_t OW, int64_t LD, int64_t lo, int64_t hi, int64_t oh0,             \
                 int64_t oh1) {                                                           \
    for (int64_t r = lo; r < hi; r++) {                                                   \
        int64_t c = r / (KH * KW), k = r - c * KH * KW, kh = k / KW, kw = k - kh * KW;    \
        T* row = cols + r * LD - oh0 * OW;                                                \
        int64_t off = kw * DW - PW, a, b;                                                 \
        inside(off, SW, W, OW, &a, &b);                                                   \
        for (int64_t oh = oh0; oh < oh1; oh++) {                                          \
            int64_t ih = oh * SH - PH + kh * DH;                                          \
            T* dst = row + oh * OW;                                                       \
            if (ih < 0 || ih >= H) { memset(dst, 0, OW * sizeof(T)); continue; }          \
            const T* src = x + (c * H + ih) * W + off;                                    \
            for (int64_t ow = 0; ow < a; ow++) dst[ow] = (T)0;                            \
            if (SW == 1) memcpy(dst + a, src + a, (b - a) * sizeof(T));                   \
            else for (int64_t ow = a; ow < b; ow++) dst[ow] = src[ow * SW];               \
            for (int64_t ow = b; ow < OW; ow++) dst[ow] = (T)0;                           \
        }                                                                                 \
    }                                                                                     \
}

/* one image, channels [lo, hi): dx (C, H, W) = sum of the window columns cols
   (C*KH*KW, OH*OW), rows LD apart */
#define COL2IM(T, NAME)                                                                   \
void NAME(const T* cols, T* dx, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,  \
          int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW,         \
          int64_t OH, int64_t OW, int64_t LD, int64_t lo, int64_t hi) {                   \
    (void)C;                                                                              \
    memset(dx + lo * H * W, 0, (hi - lo) * H * W * sizeof(T));                            \
    for (int64_t c = lo; c < hi; c++)                                                     \
    for (int64_t kh = 0; kh < KH; kh++)                                                   \
    for (int64_t kw = 0; kw < KW; kw++) {                                                 \
        const T* row = cols + ((c * KH + kh) * KW + kw) * LD;                             \
        int64_t off = kw * DW - PW, a, b;                                                 \
        inside(off, SW, W, OW, &a, &b);                                                   \
        for (int64_t oh = 0; oh < OH; oh++) {                                             \
            int64_t ih = oh * SH - PH + kh * DH;                                          \
            if (ih < 0 || ih >= H) continue;                                              \
            T* dst = dx + (c * H + ih) * W + off;                                         \
            const T* src = row + oh * OW;                                                 \
            if (SW == 1) {                                                                \
                _Pragma("omp simd")                                                       \
                for (int64_t ow = a; ow < b; ow++) dst[ow] += src[ow];                    \
            } else {                                                                      \
                for (int64_t ow = a; ow < b; ow++) dst[ow * SW] += src[ow];               \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}

