/* Binary (1-bit) matrix products and convolutions: xor + popcount on bit-packed operands.

   A value in {-1, +1} is one bit: 1 for -1 (x < 0), 0 for +1, so sign(0) = +1 as in Larq
   and dabnn. 64 values make a word. The dot product of two rows of K bits (K_real of them
   meaningful, the rest zero in both operands) is
       dot = K_real - 2 * popcount(a xor b)
   since each agreeing pair adds +1 and each disagreeing pair -1.

   The kernels work in 32-bit halves of words (a zmm then holds 16 columns, and the sums
   convert to float 16 at a time); a row of 64-bit words read as 32-bit halves is the same
   bits in the same order on a little-endian CPU. The product:
       out[n * ldo + m] = (float)(kbits - 2 * sum_k popcount(A[k][m] ^ B[n][k])
                                  + corr[n * M + m]) * scale[n or m]
   with A of K halves by Mp columns (Mp: M rounded up to 16; the extra columns are zero and
   never stored), B of N rows of K halves, ``corr`` an optional int32 correction (zero
   padding of a convolution) and ``scale`` an optional per-row or per-column multiplier.
   The integer sum is exact; the one float rounding is the final product, the same on every
   instruction set, so that all paths agree bit for bit.

   Tiles are 16 columns (pixels of a convolution, output channels of a linear layer) by NR
   rows, vectorized along the columns: each weight half is broadcast against 16 column
   halves. AVX-512 VPOPCNTDQ counts a zmm at once; AVX2 has no vector popcount and counts
   nibbles through a 16-entry vpshufb table, summing bytes for up to 31 halves before
   vpmaddubsw/vpmaddwd widen them (Mula's method); portable C calls __builtin_popcount. */
#include <stdint.h>
#include <string.h>
#include <immintrin.h>

enum { P_M, P_MP, P_N, P_K, P_A, P_B, P_OUT, P_LDO, P_KBITS, P_CORR, P_SCALE, P_SCALE_M,
       P_MI, P_MIP, P_OSTRIDE };
enum { TW = 16 };

/* Where a tile's results go: its columns m.. are columns pix.. of image img (the columns of
   each image are padded to a multiple of TW, so a tile never straddles two). */
static inline float* dest(const int64_t* p, int64_t m, int64_t* pix, int64_t* left) {
    const int64_t img = m / p[P_MIP];
    *pix = m - img * p[P_MIP];
    *left = p[P_MI] - *pix;
    return (float*)p[P_OUT] + img * p[P_OSTRIDE] + *pix;
}

/* the shared epilogue: a tile of nr rows by TW columns of popcount sums */
static void epilogue(const int64_t* p, int64_t m, int64_t n, int nr, const int32_t* acc) {
    const int64_t MI = p[P_MI], ldo = p[P_LDO], kbits = p[P_KBITS];
    const int32_t* corr = (const int32_t*)p[P_CORR];
    const float* scale = (const float*)p[P_SCALE];
    const int scale_m = (int)p[P_SCALE_M];
    int64_t pix, left;
    float* out = dest(p, m, &pix, &left);
    const int64_t w = left < TW ? left : TW;
    for (int j = 0; j < nr; j++) {
        float* o = out + (n + j) * ldo;
        const int32_t* a = acc + j * TW;
        const int32_t* c = corr ? corr + (n + j) * MI + pix : 0;
        for (int64_t i = 0; i < w; i++) {
            int32_t d = (int32_t)kbits - 2 * a[i] + (c ? c[i] : 0);
            float v = (float)d;
            if (scale) v *= scale_m ? scale[pix + i] : scale[n + j];
            o[i] = v;
        }
    }
}

/* ---- portable C ----------------------------------------------------------------------- */
static void tile_c(const int64_t* p, int64_t m, int64_t n, int nr, int32_t* acc) {
    const int64_t K = p[P_K], Mp = p[P_MP];
    const uint32_t* A = (const uint32_t*)p[P_A] + m;
    const uint32_t* B = (const uint32_t*)p[P_B] + n * K;
    for (int j = 0; j < nr; j++)
        for (int i = 0; i < TW; i++) {
            int32_t s = 0;
            for (int64_t k = 0; k < K; k++)
                s += __builtin_popcount(A[k * Mp + i] ^ B[j * K + k]);
            acc[j * TW + i] = s;
        }
}

/* ---- AVX2: nibble-table popcount, bytes summed then widened ---------------------------- */
enum { NR_AVX2 = 4 };

__attribute__((target("avx2")))
static void tile_avx2(const int64_t* p, int64_t m, int64_t n, int nr, int32_t* acc) {
    const int64_t K = p[P_K], Mp = p[P_MP];
    const uint32_t* A = (const uint32_t*)p[P_A] + m;
    const uint32_t* B = (const uint32_t*)p[P_B] + n * K;
    const __m256i tbl = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4,
                                         0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
    const __m256i m4 = _mm256_set1_epi8(0x0f), zero = _mm256_setzero_si256();
    const __m256i one8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1);
    __m256i q[NR_AVX2][2];
    for (int j = 0; j < NR_AVX2; j++) q[j][0] = q[j][1] = zero;
    for (int64_t k0 = 0; k0 < K; k0 += 31) {   /* 31 words of at most 8 per byte: < 256 */
        const int64_t k1 = K - k0 < 31 ? K : k0 + 31;
        __m256i c[NR_AVX2][2];
        for (int j = 0; j < NR_AVX2; j++) c[j][0] = c[j][1] = zero;
        for (int64_t k = k0; k < k1; k++) {
            const __m256i a0 = _mm256_loadu_si256((const __m256i*)(A + k * Mp));
            const __m256i a1 = _mm256_loadu_si256((const __m256i*)(A + k * Mp + 8));
            for (int j = 0; j < NR_AVX2; j++) {
                const __m256i b = _mm256_set1_epi32((int)B[(j < nr ? j : 0) * K + k]);
                const __m256i x0 = _mm256_xor_si256(a0, b), x1 = _mm256_xor_si256(a1, b);
#define COUNT(x) _mm256_add_epi8(_mm256_shuffle_epi8(tbl, _mm256_and_si256(x, m4)), \
                 _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(x, 4), m4)))
                c[j][0] = _mm256_add_epi8(c[j][0], COUNT(x0));
                c[j][1] = _mm256_add_epi8(c[j][1], COUNT(x1));
#undef COUNT
            }
        }
        /* the four byte counts of each 32-bit lane: u8 pairs to int16, then to int32 */
        for (int j = 0; j < NR_AVX2; j++)
            for (int h = 0; h < 2; h++)
                q[j][h] = _mm256_add_epi32(q[j][h], _mm256_madd_epi16(
                    _mm256_maddubs_epi16(c[j][h], one8), one16));
    }
    for (int j = 0; j < nr; j++) {
        _mm256_storeu_si256((__m256i*)(acc + j * TW), q[j][0]);
        _mm256_storeu_si256((__m256i*)(acc + j * TW + 8), q[j][1]);
    }
}

/* ---- AVX-512 VPOPCNTDQ ----------------------------------------------------------------- */
enum { NR_512 = 16 };

/* the epilogue of ``epilogue`` on registers: the same integer sum, its exact conversion to
   float and the one product, so the result is the same bit for bit */
__attribute__((target("avx512f,avx512dq,avx512vl")))
static inline void store512(const int64_t* p, int64_t m, int64_t n, int nr, const __m512i* s) {
    const int64_t MI = p[P_MI], ldo = p[P_LDO];
    const int32_t* corr = (const int32_t*)p[P_CORR];
    const float* scale = (const float*)p[P_SCALE];
    const int scale_m = (int)p[P_SCALE_M];
    int64_t pix, left;
    float* out = dest(p, m, &pix, &left);
    const __m512i kb = _mm512_set1_epi32((int)p[P_KBITS]);
    const __mmask16 k = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
    const __m512 sm = scale && scale_m ? _mm512_maskz_loadu_ps(k, scale + pix)
                                       : _mm512_set1_ps(1.0f);
    for (int j = 0; j < nr; j++) {
        __m512i d = _mm512_sub_epi32(kb, _mm512_slli_epi32(s[j], 1));
        if (corr) d = _mm512_add_epi32(d, _mm512_maskz_loadu_epi32(k, corr + (n + j) * MI + pix));
        __m512 v = _mm512_cvtepi32_ps(d);
        if (scale) v = _mm512_mul_ps(v, scale_m ? sm : _mm512_set1_ps(scale[n + j]));
        _mm512_mask_storeu_ps(out + (n + j) * ldo, k, v);
    }
}

__attribute__((target("avx512f,avx512dq,avx512vl,avx512vpopcntdq")))
static void tile_vpopcnt(const int64_t* p, int64_t m, int64_t n, int nr, int32_t* acc) {
    (void)acc;  /* the epilogue runs on the registers */
    const int64_t K = p[P_K], Mp = p[P_MP];
    const uint32_t* A = (const uint32_t*)p[P_A] + m;
    const uint32_t* B = (const uint32_t*)p[P_B] + n * K;
    __m512i s[NR_512];
    if (nr == NR_512) {
        for (int j = 0; j < NR_512; j++) s[j] = _mm512_setzero_si512();
        for (int64_t k = 0; k < K; k++) {
            const __m512i a = _mm512_loadu_si512(A + k * Mp);
            for (int j = 0; j < NR_512; j++)
                s[j] = _mm512_add_epi32(s[j], _mm512_popcnt_epi32(
                    _mm512_xor_si512(a, _mm512_set1_epi32((int)B[j * K + k]))));
        }
        store512(p, m, n, NR_512, s);
        return;
    }
    for (int j = 0; j < nr; j++) {
        __m512i t = _mm512_setzero_si512();
        for (int64_t k = 0; k < K; k++)
            t = _mm512_add_epi32(t, _mm512_popcnt_epi32(_mm512_xor_si512(
                _mm512_loadu_si512(A + k * Mp), _mm512_set1_epi32((int)B[j * K + k]))));
        s[j] = t;
    }
    store512(p, m, n, nr, s);
}

/* One part of a product: columns [m0, m1) (multiples of TW) by rows [n0, n1). Rows are the
   outer loop, so that a block of weight rows stays in L1 while the columns stream by. */
typedef void (*tile_fn)(const int64_t*, int64_t, int64_t, int, int32_t*);

static void run(tile_fn tile, int NR, const int64_t* p, int64_t m0, int64_t m1, int64_t n0,
                int64_t n1) {
    int32_t acc[NR_512 * TW] __attribute__((aligned(64)));
    for (int64_t n = n0; n < n1; n += NR) {
        const int nr = n1 - n < NR ? (int)(n1 - n) : NR;
        for (int64_t m = m0; m < m1; m += TW) {
            tile(p, m, n, nr, acc);
            if (tile != tile_vpopcnt) epilogue(p, m, n, nr, acc);
        }
    }
}

void tsr_bin_gemm_c(const int64_t* p, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    run(tile_c, 4, p, m0, m1, n0, n1);
}
void tsr_bin_gemm_avx2(const int64_t* p, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    run(tile_avx2, NR_AVX2, p, m0, m1, n0, n1);
}
void tsr_bin_gemm_vpopcnt(const int64_t* p, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    run(tile_vpopcnt, NR_512, p, m0, m1, n0, n1);
}

/* ---- packing ---------------------------------------------------------------------------- */

/* Planar packing of one image: x (C, HW) floats -> P (ceil(C / 64), HW) words, bit c % 64
   of word c / 64 set where x[c] < 0 (so -0.0 and NaN are +1, as x >= 0 would not say).
   With AVX-512, 16 pixels of a word are built in two registers over its 64 channels and
   stored once. */
__attribute__((target("avx512f")))
static void pack_planar_512(const float* x, int64_t C, int64_t HW, uint64_t* P) {
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t w = 0; w < (C + 63) / 64; w++) {
        const int64_t c0 = w * 64, nc = C - c0 < 64 ? C - c0 : 64;
        for (int64_t i = 0; i < HW; i += 16) {
            const __mmask16 live = HW - i >= 16 ? 0xffff : (__mmask16)((1u << (HW - i)) - 1);
            __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
            for (int64_t c = 0; c < nc; c++) {
                const __m512 v = _mm512_maskz_loadu_ps(live, x + (c0 + c) * HW + i);
                const __mmask16 neg = _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ);
                const __m512i bit = _mm512_set1_epi64((long long)(1ull << c));
                lo = _mm512_mask_or_epi64(lo, (__mmask8)neg, lo, bit);
                hi = _mm512_mask_or_epi64(hi, (__mmask8)(neg >> 8), hi, bit);
            }
            _mm512_mask_storeu_epi64(P + w * HW + i, (__mmask8)live, lo);
            _mm512_mask_storeu_epi64(P + w * HW + i + 8, (__mmask8)(live >> 8), hi);
        }
    }
}

void tsr_bin_pack_planar(const float* x, int64_t C, int64_t HW, uint64_t* P) {
    static int avx512 = -1;
    if (avx512 < 0) {
        __builtin_cpu_init();
        avx512 = __builtin_cpu_supports("avx512f");
#if defined(TSR_MAX_ISA) && TSR_MAX_ISA < 2   /* TESSERA_MAX_ISA leaves AVX-512 out */
        avx512 = 0;
#endif
    }
    if (avx512) {
        pack_planar_512(x, C, HW, P);
        return;
    }
    memset(P, 0, sizeof(uint64_t) * (size_t)(((C + 63) / 64) * HW));
    for (int64_t c = 0; c < C; c++) {
        const float* xc = x + c * HW;
        uint64_t* pw = P + (c / 64) * HW;
        const int sh = (int)(c % 64);
        for (int64_t i = 0; i < HW; i++) pw[i] |= (uint64_t)(xc[i] < 0.0f) << sh;
    }
}

/* Row packing (channel-last, as dabnn): x (R, C) floats -> (R, ceil(C / 64)) words. */
void tsr_bin_pack_rows(const float* x, int64_t R, int64_t C, uint64_t* out) {
    const int64_t Cw = (C + 63) / 64;
    for (int64_t r = 0; r < R; r++) {
        const float* xr = x + r * C;
        for (int64_t w = 0; w < Cw; w++) {
            const int64_t c0 = w * 64, n = C - c0 < 64 ? C - c0 : 64;
            uint64_t word = 0;
            for (int64_t i = 0; i < n; i++) word |= (uint64_t)(xr[c0 + i] < 0.0f) << i;
            out[r * Cw + w] = word;
        }
    }
}

/* The columns of a convolution, in 32-bit halves of words: row ((ky * KW + kx) * Cw + cw) * 2
   + h, column oy * OW + ox, holds half h of the word of P at (cw, oy * sh + ky * dh - ph,
   ox * sw + kx * dw - pw), or of ``pad`` (``padlast`` for the last channel word) outside
   the image: the order of the weights' (O, KH, KW, Cw) words read as 32-bit halves.
   g: Cw, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, MIp (the image's columns padded),
   lda (the row length of A). */
static void im2col(const uint64_t* P, const int64_t* g, uint64_t pad, uint64_t padlast,
                   uint32_t* A) {
    const int64_t Cw = g[0], H = g[1], W = g[2], KH = g[3], KW = g[4], sh = g[5], sw = g[6],
                  ph = g[7], pw = g[8], dh = g[9], dw = g[10], OH = g[11], OW = g[12],
                  MIp = g[13], lda = g[14];
    for (int64_t ky = 0; ky < KH; ky++)
        for (int64_t kx = 0; kx < KW; kx++)
            for (int64_t cw = 0; cw < Cw; cw++) {
                uint32_t* lo = A + ((ky * KW + kx) * Cw + cw) * 2 * lda;
                uint32_t* hi = lo + lda;
                const uint64_t* src = P + cw * H * W;
                const uint64_t fill = cw == Cw - 1 ? padlast : pad;
                /* the columns whose tap falls inside the image: [x0, x1) */
                const int64_t off = kx * dw - pw;
                int64_t x0 = off >= 0 ? 0 : (-off + sw - 1) / sw;
                int64_t x1 = W - 1 - off < 0 ? 0 : (W - 1 - off) / sw + 1;
                x1 = x1 > OW ? OW : x1;
                x0 = x0 > x1 ? x1 : x0;
                const uint32_t flo = (uint32_t)fill, fhi = (uint32_t)(fill >> 32);
                for (int64_t oy = 0; oy < OH; oy++) {
                    const int64_t iy = oy * sh + ky * dh - ph;
                    uint32_t* rl = lo + oy * OW;
                    uint32_t* rh = hi + oy * OW;
                    if (iy < 0 || iy >= H) {
                        for (int64_t ox = 0; ox < OW; ox++) { rl[ox] = flo; rh[ox] = fhi; }
                        continue;
                    }
                    const uint64_t* s = src + iy * W + off;
                    for (int64_t ox = 0; ox < x0; ox++) { rl[ox] = flo; rh[ox] = fhi; }
                    for (int64_t ox = x0; ox < x1; ox++) {
                        const uint64_t v = s[ox * sw];
                        rl[ox] = (uint32_t)v;
                        rh[ox] = (uint32_t)(v >> 32);
                    }
                    for (int64_t ox = x1; ox < OW; ox++) { rl[ox] = flo; rh[ox] = fhi; }
                }
                memset(lo + OH * OW, 0, sizeof(uint32_t) * (size_t)(MIp - OH * OW));
                memset(hi + OH * OW, 0, sizeof(uint32_t) * (size_t)(MIp - OH * OW));
            }
}

/* Images [i0, i1) of x (N, C, H, W) binarized and laid out as columns: image i at column
   i * MIp of A. P: one image's planar words (scratch, one per caller). */
void tsr_bin_columns(const float* x, int64_t C, const int64_t* g, uint64_t pad,
                     uint64_t padlast, uint64_t* P, uint32_t* A, int64_t i0, int64_t i1) {
    const int64_t HW = g[1] * g[2];
    for (int64_t i = i0; i < i1; i++) {
        tsr_bin_pack_planar(x + i * C * HW, C, HW, P);
        im2col(P, g, pad, padlast, A + i * g[13]);
    }
}

/* which instruction sets this CPU has: bit 0 AVX2, bit 1 AVX-512 VPOPCNTDQ (with DQ) */
int tsr_bin_cpu(void) {
    __builtin_cpu_init();
    int bits = 0;
    if (__builtin_cpu_supports("avx2")) bits |= 1;
    if (__builtin_cpu_supports("avx512vpopcntdq") && __builtin_cpu_supports("avx512dq"))
        bits |= 2;
    return bits;
}
