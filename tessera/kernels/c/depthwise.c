/* Depthwise 2-d convolution (tessera/kernels/window.py; groups == in channels == out
   channels), direct: each output plane is a KHxKW stencil over its input plane. Compiled
   per geometry and dtype like max pooling (maxpool.c: the same -D flags but TSR_INDEX);
   interior output columns run without bounds checks, so that a stride-1 row is a
   vectorised sum of shifted rows (bench models: mobilenet_v2 infer b1). Small planes of
   stride 1 (7x7 to 56x56, where border outputs are up to half of the plane and rows too
   short to fill vectors) go through a zero-padded copy instead, as one flat loop with no
   bounds checks.
   Planes split across the kernel threads. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
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

/* stride-1 planes whose padded copy is at most SMALL floats (56x56 and less; two such
   buffers on the stack), rows at most SMALL_OW wide, take the scratch path: 0.6-0.8x the
   row path's time from 56x56 down to 7x7. Strided ones stay on the row path: their padded
   copy cost more than their checks saved (576 planes 14x14 -> 7x7: 0.06 -> 0.09 ms)
   (bench models: mobilenet_v2 infer b1) */
enum { SMALL = 4096, SMALL_OW = 64 };

/* one plane through a zero-padded copy (HP x WP: the rows and columns the outputs read),
   as one flat loop over the padded rows, the columns past OW computed and dropped,
   vectorised across row ends */
static void small_plane(const T* xp, const T* wc, T bias, T* yp, int64_t H, int64_t W,
                        int64_t OH, int64_t OW, int64_t HP, int64_t WP) {
    T pad[SMALL], out[SMALL];
    memset(pad, 0, (size_t)(HP * WP) * sizeof(T));
    int64_t rows = H < HP - PH ? H : HP - PH, cols = W < WP - PW ? W : WP - PW;
    for (int64_t ih = 0; ih < rows && cols > 0; ih++)
        memcpy(pad + (ih + PH) * WP + PW, xp + ih * W, (size_t)cols * sizeof(T));
    int64_t q1 = (OH - 1) * WP + OW;
    #pragma omp simd
    for (int64_t q = 0; q < q1; q++) {
        T acc = bias;
        for (int kh = 0; kh < KH; kh++)
            for (int kw = 0; kw < KW; kw++)
                acc += wc[kh * KW + kw] * pad[q + kh * DH * WP + kw * DW];
        out[q] = acc;
    }
    for (int64_t oh = 0; oh < OH; oh++)
        memcpy(yp + oh * OW, out + oh * WP, (size_t)OW * sizeof(T));
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
    int64_t HP = (OH - 1) * SH + (KH - 1) * DH + 1, WP = (OW - 1) * SW + (KW - 1) * DW + 1;
    int small = SH == 1 && SW == 1 && OH > 0 && OW > 0 && OW <= SMALL_OW && HP * WP <= SMALL;
    for (int64_t p = lo; p < hi; p++) {
        int64_t c = p % C;
        const T* xp = x + p * H * W;
        T wc[KH * KW];
        for (int k = 0; k < KH * KW; k++) wc[k] = w[c * KH * KW + k];
        T* yp = y + p * OH * OW;
        T bias = b ? b[c] : (T)0;
        if (small) {
            small_plane(xp, wc, bias, yp, H, W, OH, OW, HP, WP);
            continue;
        }
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
