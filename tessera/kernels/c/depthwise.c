/* Depthwise 2-d convolution (tessera/kernels/window.py; groups == in channels == out
   channels), direct: each output plane is a KHxKW stencil over its input plane. Compiled
   per geometry and dtype like max pooling (maxpool.c: the same -D flags but TSR_INDEX);
   interior output columns run without bounds checks, so that a stride-1 row is a
   vectorised sum of shifted rows (bench models: mobilenet_v2 infer b1). Planes split
   across the kernel threads. */
#include <stdint.h>
enum { KH = TSR_KH, KW = TSR_KW, SH = TSR_SH, SW = TSR_SW, PH = TSR_PH, PW = TSR_PW,
       DH = TSR_DH, DW = TSR_DW };
typedef TSR_T T;

/* one output with bounds checks (border windows) */
static inline T edge(const T* xp, const T* wc, T bias, int64_t h0, int64_t w0, int64_t H,
                     int64_t W) {
    T acc = bias;
    for (int kh = 0; kh < KH; kh++) {
        int64_t ih = h0 + kh * DH;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < KW; kw++) {
            int64_t iw = w0 + kw * DW;
            if (iw >= 0 && iw < W) acc += wc[kh * KW + kw] * xp[ih * W + iw];
        }
    }
    return acc;
}

/* planes [lo, hi) of the (N*C) planes: y = x (*) w[c] + b[c] (b may be NULL); windows
   wholly inside the plane accumulate in registers over an unrolled window, vectorised
   across the output row */
void tsr_depthwise(const T* x, const T* w, const T* b, T* y, int64_t C, int64_t H,
                   int64_t W, int64_t OH, int64_t OW, int64_t lo, int64_t hi) {
    int64_t a = (PW + SW - 1) / SW;   /* interior columns: every tap inside [0, W) */
    int64_t e = W - (KW - 1) * DW + PW > 0 ? (W - (KW - 1) * DW + PW - 1) / SW + 1 : 0;
    if (e > OW) e = OW;
    if (a > e) a = e;
    for (int64_t p = lo; p < hi; p++) {
        int64_t c = p % C;
        const T* xp = x + p * H * W;
        T wc[KH * KW];
        for (int k = 0; k < KH * KW; k++) wc[k] = w[c * KH * KW + k];
        T* yp = y + p * OH * OW;
        T bias = b ? b[c] : (T)0;
        for (int64_t oh = 0; oh < OH; oh++) {
            T* yr = yp + oh * OW;
            int64_t h0 = oh * SH - PH;
            if (h0 < 0 || h0 + (KH - 1) * DH >= H) {
                for (int64_t ow = 0; ow < OW; ow++)
                    yr[ow] = edge(xp, wc, bias, h0, ow * SW - PW, H, W);
                continue;
            }
            for (int64_t ow = 0; ow < a; ow++)
                yr[ow] = edge(xp, wc, bias, h0, ow * SW - PW, H, W);
            const T* x0 = xp + h0 * W - PW;
            #pragma omp simd
            for (int64_t ow = a; ow < e; ow++) {
                T acc = bias;
                for (int kh = 0; kh < KH; kh++)
                    for (int kw = 0; kw < KW; kw++)
                        acc += wc[kh * KW + kw] * x0[kh * DH * W + ow * SW + kw * DW];
                yr[ow] = acc;
            }
            for (int64_t ow = e; ow < OW; ow++)
                yr[ow] = edge(xp, wc, bias, h0, ow * SW - PW, H, W);
        }
    }
}
