/* 2-d max pooling (tessera/kernels/window.py), compiled per window geometry and dtype,
   which come as -D flags: TSR_T the element type, TSR_KH ... TSR_DW the kernel, stride,
   padding and dilation, TSR_INDEX whether the argmax is written. As constants they let
   the window loops unroll into straight-line selects (bench training: cnn); each geometry
   compiles once per machine (the disk cache). */
#include <math.h>
#include <stdint.h>
enum { KH = TSR_KH, KW = TSR_KW, SH = TSR_SH, SW = TSR_SW, PH = TSR_PH, PW = TSR_PW,
       DH = TSR_DH, DW = TSR_DW };
#define WITH_INDEX TSR_INDEX  /* 0: values only (idx is not touched) */
typedef TSR_T T;

/* one output: the window scanned in (kh, kw) order with bounds checks */
static inline void edge(const T* xp, T* y, int64_t* idx, int64_t o, int64_t h0, int64_t w0,
                        int64_t H, int64_t W) {
    (void)idx;  /* unread without the argmax (a deployed model builds with -Werror) */
    int64_t hs = h0, ws = w0;
    while (hs < 0) hs += DH;
    while (ws < 0) ws += DW;
    T best = -INFINITY;
    int64_t arg = hs * W + ws;
    for (int kh = 0; kh < KH; kh++) {
        int64_t ih = h0 + kh * DH;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < KW; kw++) {
            int64_t iw = w0 + kw * DW;
            if (iw < 0 || iw >= W) continue;
            T v = xp[ih * W + iw];
            int take = (v > best) | (v != v);
            best = take ? v : best;
            arg = take ? ih * W + iw : arg;
        }
    }
    y[o] = best;
#if WITH_INDEX
    idx[o] = arg;
#endif
}

/* planes [lo, hi) of x (P, H, W): PyTorch's rule, the first maximum and the last NaN.
   Windows wholly inside the image (most of them) take a branch-free loop over ow that
   the compiler unrolls over the window and vectorises; the border ones take edge(). */
void tsr_maxpool(const T* x, T* y, int64_t* idx, int64_t H, int64_t W, int64_t OH,
                 int64_t OW, int64_t lo, int64_t hi) {
    /* interior columns: PW <= ow*SW and ow*SW - PW + (KW-1)*DW < W */
    int64_t a = (PW + SW - 1) / SW;
    int64_t b = W - (KW - 1) * DW + PW > 0 ? (W - (KW - 1) * DW + PW - 1) / SW + 1 : 0;
    if (b > OW) b = OW;
    if (a > b) a = b;
    for (int64_t p = lo; p < hi; p++) {
        const T* xp = x + p * H * W;
        T* yp = y + p * OH * OW;
        int64_t* ip = WITH_INDEX ? idx + p * OH * OW : 0;
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t h0 = oh * SH - PH;
            T* yr = yp + oh * OW;
            int64_t* ir = WITH_INDEX ? ip + oh * OW : 0;
            (void)ir;
            if (h0 < 0 || h0 + (KH - 1) * DH >= H) {
                for (int64_t ow = 0; ow < OW; ow++)
                    edge(xp, yp, ip, oh * OW + ow, h0, ow * SW - PW, H, W);
                continue;
            }
            for (int64_t ow = 0; ow < a; ow++)
                edge(xp, yp, ip, oh * OW + ow, h0, ow * SW - PW, H, W);
            #pragma omp simd
            for (int64_t ow = a; ow < b; ow++) {
                int64_t w0 = ow * SW - PW;
                T best = -INFINITY;
                int64_t arg = h0 * W + w0;
                for (int kh = 0; kh < KH; kh++)
                    for (int kw = 0; kw < KW; kw++) {
                        int64_t at = (h0 + kh * DH) * W + w0 + kw * DW;
                        T v = xp[at];
                        int take = (v > best) | (v != v);
                        best = take ? v : best;
                        arg = take ? at : arg;
                    }
                yr[ow] = best;
#if WITH_INDEX
                ir[ow] = arg;
#endif
            }
            for (int64_t ow = b; ow < OW; ow++)
                edge(xp, yp, ip, oh * OW + ow, h0, ow * SW - PW, H, W);
        }
    }
}
