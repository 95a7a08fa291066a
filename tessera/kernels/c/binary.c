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
#include <stdlib.h>
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

/* tsr_bin_columns for bit-packed images: x (N, H, W, Cw) words, channel-last as
   ``packbits`` lays them out, made planar (the last word's unused high bits cleared) and
   laid out as columns. */
void tsr_bin_columns_bits(const uint64_t* x, int64_t C, const int64_t* g, uint64_t pad,
                          uint64_t padlast, uint64_t* P, uint32_t* A, int64_t i0, int64_t i1) {
    const int64_t HW = g[1] * g[2], Cw = g[0];
    const uint64_t last = C % 64 ? (1ull << (C % 64)) - 1 : ~0ull;
    for (int64_t i = i0; i < i1; i++) {
        const uint64_t* xi = x + i * HW * Cw;
        for (int64_t w = 0; w < Cw; w++) {
            const uint64_t keep = w == Cw - 1 ? last : ~0ull;
            for (int64_t q = 0; q < HW; q++) P[w * HW + q] = xi[q * Cw + w] & keep;
        }
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

/* ---- direct convolution (stride 1) ------------------------------------------------------

   No columns: the input is binarized straight into a padded planar image of words, ``img``
   (Cw planes of Hp x Wp words, the border filled with the padding's bits, 8 words of slack
   at the end), and the kernel reads each tap of 8 neighbouring output pixels as 8
   consecutive words of it: for output (oy, ox), tap (ky, kx) and channel word cw, the word
   at img[cw][oy + ky * dh][ox + kx * dw]. With 64 channels a pixel is one word and a 3x3
   window nine. ``off[k]`` (k = (ky * KW + kx) * Cw + cw, the order of the weights' words)
   is that word's offset from img[0][oy][ox].

   The weights are blocked for the kernels: ``wb[(n / NB * K + k) * NB + n % NB]`` is word k
   of output channel n (O rounded up to NB, the extra channels zero and never stored), so
   that the NB words a tile broadcasts for one k are adjacent. A tile is PV vectors of 8
   output pixels (of any rows: each vector has its own source and destination) by NR output
   channels, whose PV x NR sums stay in registers while k runs: each input vector loaded
   serves NR channels, each weight word broadcast serves PV vectors.

   The plan ``g`` (int64, built once per layer and input size by ``tessera.kernels.binary``):
   Cw, C, H, W, PH, PW, Hp, Wp, OH, OW, O, K, kbits, pad word, last channel word's pad word,
   wb, corr (int32 (O, OH * OW) or null), base (corr + kbits as float32, or null), a copy
   of the packed weights wb was made from and its size in bytes, the AVX2 path's nibble
   tables and its bit planes' plan (``binary_planes.h``; null: the nibble kernel), then K
   offsets. The result
   is ``epilogue``'s: float32(kbits - 2 * sum + corr) * scale[n]. */
enum { D_CW, D_CIN, D_H, D_W, D_PH, D_PW, D_HP, D_WP, D_OH, D_OW, D_O, D_K, D_KBITS, D_PAD,
       D_PADLAST, D_WB, D_CORR, D_BASE, D_SRC, D_SRC_BYTES, D_NIB, D_PLN, D_OFF };
#ifndef NB
#define NB 8
#endif
enum { VW = 8, SLACK = 8 };

int64_t tsr_bin_direct_block(void) { return NB; }

/* the padded image's border, plane cw filled with its pad word */
static void fill_border(const int64_t* g, uint64_t* img) {
    const int64_t Cw = g[D_CW], H = g[D_H], W = g[D_W], PH = g[D_PH], PW = g[D_PW],
                  Hp = g[D_HP], Wp = g[D_WP];
    for (int64_t cw = 0; cw < Cw; cw++) {
        const uint64_t f = cw == Cw - 1 ? (uint64_t)g[D_PADLAST] : (uint64_t)g[D_PAD];
        uint64_t* p = img + cw * Hp * Wp;
        for (int64_t i = 0; i < PH * Wp; i++) p[i] = f;
        for (int64_t i = (PH + H) * Wp; i < Hp * Wp; i++) p[i] = f;
        for (int64_t y = PH; y < PH + H; y++) {
            for (int64_t i = 0; i < PW; i++) p[y * Wp + i] = f;
            for (int64_t i = PW + W; i < Wp; i++) p[y * Wp + i] = f;
        }
    }
    memset(img + Cw * Hp * Wp, 0, SLACK * sizeof(uint64_t));
}

/* 16 pixels at a time: the sign bits of channels c0 + 0..31 in one register of 32-bit
   lanes, of c0 + 32..63 in another, a masked or per channel; then the halves interleaved
   into the pixels' 64-bit words. */
__attribute__((target("avx512f")))
static void dpack_512(const int64_t* g, const float* x, uint64_t* img) {
    const int64_t Cw = g[D_CW], cin = g[D_CIN], H = g[D_H], W = g[D_W], Hp = g[D_HP],
                  Wp = g[D_WP], HW = H * W;
    const __m512 zero = _mm512_setzero_ps();
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i lo_idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22,
                                             7, 23);
    const __m512i hi_idx = _mm512_add_epi32(lo_idx, _mm512_set1_epi32(8));
    for (int64_t w = 0; w < Cw; w++) {
        const int64_t c0 = w * 64, nc = cin - c0 < 64 ? cin - c0 : 64;
        for (int64_t y = 0; y < H; y++) {
            uint64_t* dst = img + (w * Hp + y + g[D_PH]) * Wp + g[D_PW];
            const float* src = x + c0 * HW + y * W;
            for (int64_t i = 0; i < W; i += 16) {
                const __mmask16 live = W - i >= 16 ? 0xffff : (__mmask16)((1u << (W - i)) - 1);
                __m512i half[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
                for (int h = 0; h < 2; h++) {
                    __m512i bit = one, acc = half[h];
                    const int64_t e = nc < 32 * (h + 1) ? nc : 32 * (h + 1);
                    for (int64_t c = 32 * h; c < e; c++) {
                        const __m512 v = _mm512_maskz_loadu_ps(live, src + c * HW + i);
                        acc = _mm512_mask_or_epi32(acc, _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ),
                                                   acc, bit);
                        bit = _mm512_add_epi32(bit, bit);
                    }
                    half[h] = acc;
                }
                _mm512_mask_storeu_epi64(dst + i, (__mmask8)live,
                                         _mm512_permutex2var_epi32(half[0], lo_idx, half[1]));
                _mm512_mask_storeu_epi64(dst + i + 8, (__mmask8)(live >> 8),
                                         _mm512_permutex2var_epi32(half[0], hi_idx, half[1]));
            }
        }
    }
}

/* dpack_512 on 8 pixels a ymm: the sign bits of channels c0 + 0..31 and c0 + 32..63 in
   two registers of 32-bit lanes, interleaved into the pixels' words; the row's last W % 8
   pixels one at a time */
__attribute__((target("avx2")))
static void dpack_avx2(const int64_t* g, const float* x, uint64_t* img) {
    const int64_t Cw = g[D_CW], cin = g[D_CIN], H = g[D_H], W = g[D_W], Hp = g[D_HP],
                  Wp = g[D_WP], HW = H * W;
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t w = 0; w < Cw; w++) {
        const int64_t c0 = w * 64, nc = cin - c0 < 64 ? cin - c0 : 64;
        for (int64_t y = 0; y < H; y++) {
            uint64_t* dst = img + (w * Hp + y + g[D_PH]) * Wp + g[D_PW];
            const float* src = x + c0 * HW + y * W;
            int64_t i = 0;
            for (; i + 8 <= W; i += 8) {
                __m256i half[2];
                for (int h = 0; h < 2; h++) {
                    __m256i bit = _mm256_set1_epi32(1), acc = _mm256_setzero_si256();
                    const int64_t e = nc < 32 * (h + 1) ? nc : 32 * (h + 1);
                    for (int64_t c = 32 * h; c < e; c++) {
                        const __m256 v = _mm256_loadu_ps(src + c * HW + i);
                        acc = _mm256_or_si256(acc, _mm256_and_si256(
                            _mm256_castps_si256(_mm256_cmp_ps(v, zero, _CMP_LT_OQ)), bit));
                        bit = _mm256_add_epi32(bit, bit);
                    }
                    half[h] = acc;
                }
                const __m256i lo = _mm256_unpacklo_epi32(half[0], half[1]);
                const __m256i hi = _mm256_unpackhi_epi32(half[0], half[1]);
                _mm256_storeu_si256((__m256i*)(dst + i), _mm256_permute2x128_si256(lo, hi, 0x20));
                _mm256_storeu_si256((__m256i*)(dst + i + 4),
                                    _mm256_permute2x128_si256(lo, hi, 0x31));
            }
            for (; i < W; i++) {
                uint64_t word = 0;
                for (int64_t c = 0; c < nc; c++)
                    word |= (uint64_t)(src[c * HW + i] < 0.0f) << c;
                dst[i] = word;
            }
        }
    }
}

/* One image x (C, H, W) binarized into the padded planar image ``img``. */
void tsr_bin_direct_pack(const int64_t* g, const float* x, uint64_t* img) {
    static int avx512 = -1, avx2 = -1;
    if (avx512 < 0) {
        __builtin_cpu_init();
        avx512 = __builtin_cpu_supports("avx512f");
        avx2 = __builtin_cpu_supports("avx2");
#if defined(TSR_MAX_ISA) && TSR_MAX_ISA < 2   /* TESSERA_MAX_ISA leaves AVX-512 out */
        avx512 = 0;
#endif
#if defined(TSR_MAX_ISA) && TSR_MAX_ISA < 1
        avx2 = 0;
#endif
    }
    fill_border(g, img);
    if (avx512) {
        dpack_512(g, x, img);
        return;
    }
    if (avx2) {
        dpack_avx2(g, x, img);
        return;
    }
    const int64_t Cw = g[D_CW], cin = g[D_CIN], H = g[D_H], W = g[D_W], Hp = g[D_HP],
                  Wp = g[D_WP];
    for (int64_t w = 0; w < Cw; w++) {
        const int64_t c0 = w * 64, nc = cin - c0 < 64 ? cin - c0 : 64;
        for (int64_t y = 0; y < H; y++) {
            uint64_t* dst = img + (w * Hp + y + g[D_PH]) * Wp + g[D_PW];
            const float* src = x + (c0 * H + y) * W;
            for (int64_t i = 0; i < W; i++) {
                uint64_t word = 0;
                for (int64_t c = 0; c < nc; c++)
                    word |= (uint64_t)(src[c * H * W + i] < 0.0f) << c;
                dst[i] = word;
            }
        }
    }
}

/* One bit-packed image x (H, W, Cw): channel-last words, as ``packbits`` of the channels
   (a binary layer's thresholded output) copied into the padded planar image ``img``; the
   last word's unused high bits are cleared (they must count as nothing). */
void tsr_bin_direct_bits(const int64_t* g, const uint64_t* x, uint64_t* img) {
    const int64_t Cw = g[D_CW], cin = g[D_CIN], H = g[D_H], W = g[D_W], Hp = g[D_HP],
                  Wp = g[D_WP];
    const uint64_t last = cin % 64 ? (1ull << (cin % 64)) - 1 : ~0ull;
    fill_border(g, img);
    for (int64_t w = 0; w < Cw; w++) {
        const uint64_t keep = w == Cw - 1 ? last : ~0ull;
        for (int64_t y = 0; y < H; y++) {
            uint64_t* dst = img + (w * Hp + y + g[D_PH]) * Wp + g[D_PW];
            const uint64_t* src = x + y * W * Cw + w;
            if (Cw == 1 && keep == ~0ull) memcpy(dst, src, sizeof(uint64_t) * (size_t)W);
            else for (int64_t i = 0; i < W; i++) dst[i] = src[i * Cw] & keep;
        }
    }
}

/* where a vector of the output (8 pixels of one row) reads and writes */
typedef struct { int64_t src, pix; int nv; } dvec;

/* Where the results go. Float: out (O, OH, OW), float32(kbits - 2 * sum + corr) * scale[n].
   Bits (th non-null): out (OH, OW, Cwo) words, Cwo = ceil(O / 64), channel-last as
   ``packbits`` lays them out; bit n % 64 of word n / 64 of a pixel is set where
   (D > th[n]) xor flip[n], D = 2 * sum - corr, or the sum alone when there is no corr (th
   is then halved: 2 sum > t is sum > floor(t / 2)). The kernels write one byte (8
   channels) of a word at a time, so that parts of a call that split the channels at
   multiples of 8 never share a byte. */
typedef struct { const float* scale; void* out; const int64_t* th; const uint8_t* flip; } dout;

/* the vector at (*oy, *ox), then moves them on to the next (rows of OW pixels) */
static inline dvec dnext(const int64_t* g, int64_t* oy, int64_t* ox) {
    const int64_t OW = g[D_OW];
    dvec v = {*oy * g[D_WP] + *ox, *oy * OW + *ox, (int)(OW - *ox < VW ? OW - *ox : VW)};
    *ox += VW;
    if (*ox >= OW) {
        *ox = 0;
        ++*oy;
    }
    return v;
}

/* the epilogue of one vector and channel: ``epilogue``'s arithmetic on nv pixels, or the
   channel's bit of each pixel's word */
static inline void dstore_c(const int64_t* g, const dout* o, int64_t n, dvec v,
                            const int64_t* s) {
    const int32_t* corr = (const int32_t*)g[D_CORR];
    const int64_t ohw = g[D_OH] * g[D_OW];
    if (o->th) {
        const int64_t cwo = (g[D_O] + 63) / 64, t = o->th[n];
        const int flip = (o->flip[n / 8] >> (n % 8)) & 1;
        uint8_t* b = (uint8_t*)o->out + (v.pix * cwo + n / 64) * 8 + (n % 64) / 8;
        for (int i = 0; i < v.nv; i++) {
            const int64_t d = corr ? 2 * s[i] - corr[n * ohw + v.pix + i] : s[i];
            const uint8_t bit = (uint8_t)(((d > t) ^ flip) << (n % 8));
            uint8_t* p = b + i * cwo * 8;
            *p = n % 8 ? (uint8_t)(*p | bit) : bit;   /* a byte's first channel starts it */
        }
        return;
    }
    float* out = (float*)o->out;
    for (int i = 0; i < v.nv; i++) {
        int32_t d = (int32_t)g[D_KBITS] - 2 * (int32_t)s[i] +
                    (corr ? corr[n * ohw + v.pix + i] : 0);
        float f = (float)d;
        if (o->scale) f *= o->scale[n];
        out[n * ohw + v.pix + i] = f;
    }
}

static void direct_c(const int64_t* g, const uint64_t* img, const dout* o, int64_t n0,
                     int64_t n1) {
    const int64_t K = g[D_K], V = g[D_OH] * ((g[D_OW] + VW - 1) / VW);
    const uint64_t* wb = (const uint64_t*)g[D_WB];
    const int64_t* off = g + D_OFF;
    for (int64_t n = n0; n < n1; n++) {
        const uint64_t* w = wb + (n / NB) * K * NB + n % NB;
        int64_t oy = 0, ox = 0;
        for (int64_t q = 0; q < V; q++) {
            const dvec v = dnext(g, &oy, &ox);
            int64_t s[VW];
            for (int i = 0; i < VW; i++) {
                int64_t t = 0;
                for (int64_t k = 0; k < K; k++)
                    t += __builtin_popcountll(img[v.src + off[k] + i] ^ w[k * NB]);
                s[i] = t;
            }
            dstore_c(g, o, n, v, s);
        }
    }
}

/* AVX2: byte-sliced nibble planes and per-weight tables.

   AVX2 has no vector popcount; a nibble table (vpshufb) counts 4 bits a byte. Here the xor
   goes into the table: the image is re-laid as nibble planes, plane q = cw * 16 + 2 b + h
   holding nibble h of byte b of channel word cw of every position (one byte each, in the
   padded image's linear order), so that a ymm of a plane is 32 neighbouring positions at
   the same 4 input channels, all multiplied by the same 4 weight bits. For each weight
   nibble w the plan holds the 16-byte table popcount(i xor w), and one vpshufb of the
   table by the plane's bytes plus one vpaddb counts 128 products: 2 operations where the
   nibble popcount of xor-ed words takes 8 for 256. The positions run over the padded width
   (a vector may straddle rows; the Wp - OW positions past a row's end are computed and
   dropped), the tables of channel n, word k, nibble q at ``tab[((n / NB * K + k) * 16 +
   q) * NB + n % NB]`` (16 bytes each, ``D_NIB``). Byte counts (at most 4 a table) are
   widened to 16 bits every NK2 words, to 32 bits every NK16. */
enum { NR2 = 4, PV2 = 2, VW2 = 32, NK2 = 3, NK16 = 1020 };

/* the stride of the nibble planes, in bytes: a tile's vectors read up to Wp + 96 bytes
   past a plane's positions (into lanes that are dropped) */
static inline int64_t nib_stride(const int64_t* g) {
    return (g[D_HP] * g[D_WP] + g[D_WP] + 128 + 31) / 32 * 32;
}

/* where the nibble planes go in the scratch: after the image and the thresholds' table,
   32-byte aligned */
static inline uint8_t* nib_planes(const int64_t* g, uint64_t* img) {
    const int64_t ob = (g[D_O] + NB - 1) / NB * NB;
    const uintptr_t a = (uintptr_t)(img + g[D_CW] * g[D_HP] * g[D_WP] + SLACK + ob +
                                    (ob + 63) / 64);
    return (uint8_t*)((a + 31) & ~(uintptr_t)31);
}

/* the scratch an image needs, in words: the image, its slack, the thresholds' table and
   the nibble planes */
int64_t tsr_bin_direct_scratch(const int64_t* g) {
    const int64_t ob = (g[D_O] + NB - 1) / NB * NB;
    return g[D_CW] * g[D_HP] * g[D_WP] + SLACK + ob + (ob + 63) / 64 + 4 +
           g[D_CW] * 16 * nib_stride(g) / 8;
}

/* the image's words as nibble planes: 32 positions at a time, their words' bytes
   transposed in registers (pairs of positions' bytes side by side, then an 8 x 8
   transposition of 16-bit units in each 128-bit lane: lane 0 holds positions 0..15, lane
   1 16..31) */
__attribute__((target("avx2")))
static void nibbles_avx2(const int64_t* g, const uint64_t* img, uint8_t* nib) {
    const int64_t Cw = g[D_CW], HW = g[D_HP] * g[D_WP], ps = nib_stride(g);
    const __m256i pairs = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7,
                                           15, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14,
                                           7, 15);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t cw = 0; cw < Cw; cw++) {
        const uint64_t* src = img + cw * HW;
        uint8_t* dst = nib + cw * 16 * ps;
        int64_t p = 0;
        for (; p + VW2 <= HW; p += VW2) {
            __m256i r[8], t[8], u[8];
            for (int i = 0; i < 8; i++)
                r[i] = _mm256_shuffle_epi8(_mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(src + p + 2 * i))),
                    _mm_loadu_si128((const __m128i*)(src + p + 16 + 2 * i)), 1), pairs);
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_epi16(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_epi16(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4)
                for (int h = 0; h < 2; h++) {
                    u[i + 2 * h] = _mm256_unpacklo_epi32(t[i + h], t[i + h + 2]);
                    u[i + 2 * h + 1] = _mm256_unpackhi_epi32(t[i + h], t[i + h + 2]);
                }
            /* u[0..3]: bytes 0-1, 2-3, 4-5, 6-7 of positions pairs 0..3; u[4..7] of 4..7 */
            for (int b = 0; b < 8; b++) {
                const __m256i v = b & 1 ? _mm256_unpackhi_epi64(u[b / 2], u[b / 2 + 4])
                                        : _mm256_unpacklo_epi64(u[b / 2], u[b / 2 + 4]);
                _mm256_storeu_si256((__m256i*)(dst + (2 * b) * ps + p), _mm256_and_si256(v, m4));
                _mm256_storeu_si256((__m256i*)(dst + (2 * b + 1) * ps + p),
                                    _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
        }
        for (; p < HW; p++)
            for (int q = 0; q < 16; q++) dst[q * ps + p] = (uint8_t)((src[p] >> (4 * q)) & 15);
    }
}

/* where the lanes of a vector of VW2 positions from p go: runs of lanes inside the rows */
typedef struct { int lane, len; int64_t pix; } nrun;

static inline int nruns(const int64_t* g, int64_t p, nrun* r) {
    const int64_t Wp = g[D_WP], OW = g[D_OW], OH = g[D_OH];
    int64_t oy = p / Wp, ox = p - oy * Wp;
    int n = 0, l = 0;
    while (l < VW2 && oy < OH) {
        if (ox < OW) {
            const int len = (int)(OW - ox < VW2 - l ? OW - ox : VW2 - l);
            r[n++] = (nrun){l, len, oy * OW + ox};
            l += len;
            ox += len;
        } else {
            l += (int)(Wp - ox);
            ox = 0;
            oy++;
        }
    }
    return n;
}

/* a tile's sums: s[u][j][lane], vector u of positions p0 + VW2 u by channel n + j */
__attribute__((target("avx2")))
static inline __attribute__((always_inline)) void ntile_avx2(
        const int64_t* g, const uint8_t* nib, const uint8_t* tab, const int64_t* noff,
        int64_t p0, int pv, int32_t s[PV2][NR2][VW2]) {
    const int64_t K = g[D_K], ps = nib_stride(g);
    const __m256i lo8 = _mm256_set1_epi16(0xff);
    __m256i h[PV2][NR2][2];
    for (int64_t k16 = 0; k16 < K; k16 += NK16) {
        const int64_t k16e = K - k16 < NK16 ? K : k16 + NK16;
        for (int64_t k0 = k16; k0 < k16e; k0 += NK2) {
            const int64_t k1 = k16e - k0 < NK2 ? k16e : k0 + NK2;
            __m256i c[PV2][NR2];
            for (int u = 0; u < PV2; u++)
                for (int j = 0; j < NR2; j++) c[u][j] = _mm256_setzero_si256();
            for (int64_t k = k0; k < k1; k++) {
                const uint8_t* a = nib + noff[k] + p0;
                const uint8_t* t = tab + k * 16 * NB * 16;
#pragma GCC unroll 16
                for (int q = 0; q < 16; q++) {
                    __m256i x[PV2];
                    for (int u = 0; u < pv; u++)
                        x[u] = _mm256_loadu_si256((const __m256i*)(a + q * ps + u * VW2));
                    for (int j = 0; j < NR2; j++) {
                        const __m256i tb = _mm256_broadcastsi128_si256(
                            _mm_loadu_si128((const __m128i*)(t + (q * NB + j) * 16)));
                        for (int u = 0; u < pv; u++) {
                            c[u][j] = _mm256_add_epi8(c[u][j], _mm256_shuffle_epi8(tb, x[u]));
                            /* one chain a sum: GCC otherwise reassociates the adds into
                               trees whose partial results spill */
                            __asm__("" : "+x"(c[u][j]));
                        }
                    }
                }
            }
            /* bytes to 16 bits: even positions, odd positions */
            for (int u = 0; u < pv; u++)
                for (int j = 0; j < NR2; j++) {
                    const __m256i e = _mm256_and_si256(c[u][j], lo8);
                    const __m256i o = _mm256_srli_epi16(c[u][j], 8);
                    h[u][j][0] = k0 == k16 ? e : _mm256_add_epi16(h[u][j][0], e);
                    h[u][j][1] = k0 == k16 ? o : _mm256_add_epi16(h[u][j][1], o);
                }
        }
        /* 16 bits to 32 in order: lane 0 of the interleaves holds positions 0-7 and 8-15,
           lane 1 16-23 and 24-31 */
        for (int u = 0; u < pv; u++)
            for (int j = 0; j < NR2; j++) {
                const __m256i a = _mm256_unpacklo_epi16(h[u][j][0], h[u][j][1]);
                const __m256i b = _mm256_unpackhi_epi16(h[u][j][0], h[u][j][1]);
                __m256i w[4] = {_mm256_cvtepu16_epi32(_mm256_castsi256_si128(a)),
                                _mm256_cvtepu16_epi32(_mm256_castsi256_si128(b)),
                                _mm256_cvtepu16_epi32(_mm256_extracti128_si256(a, 1)),
                                _mm256_cvtepu16_epi32(_mm256_extracti128_si256(b, 1))};
                for (int i = 0; i < 4; i++) {
                    __m256i* d = (__m256i*)(s[u][j] + 8 * i);
                    _mm256_store_si256(d, k16 ? _mm256_add_epi32(_mm256_load_si256(d), w[i])
                                              : w[i]);
                }
            }
    }
}

/* float output: float32(kbits - 2 sum + corr) * scale, 8 lanes at a time; a run's last
   8 may spill past its row's end into the next rows' first outputs, which a later run
   writes, but never past the channel's plane (another thread's channel, or the buffer's
   end): the 8 that would go one at a time */
__attribute__((target("avx2")))
static inline void nstore_avx2(const int64_t* g, const dout* o, int64_t n, int nr,
                               int32_t s[NR2][VW2], const nrun* r, int nrn) {
    const int32_t* corr = (const int32_t*)g[D_CORR];
    const int64_t ohw = g[D_OH] * g[D_OW];
    const __m256i kb = _mm256_set1_epi32((int)g[D_KBITS]);
    for (int j = 0; j < nr; j++) {
        float* out = (float*)o->out + (n + j) * ohw;
        const int32_t* cj = corr ? corr + (n + j) * ohw : 0;
        const float sc = o->scale ? o->scale[n + j] : 1.0f;
        const __m256 vs = _mm256_set1_ps(sc);
        for (int i = 0; i < nrn; i++) {
            const int32_t* sj = s[j] + r[i].lane;
            int l = 0;
            const int64_t room = ohw - r[i].pix - 7;
            const int full = room < r[i].len ? (int)room : r[i].len;
            for (; l < full; l += 8) {
                __m256i d = _mm256_sub_epi32(kb, _mm256_slli_epi32(
                    _mm256_loadu_si256((const __m256i*)(sj + l)), 1));
                if (cj) d = _mm256_add_epi32(d, _mm256_loadu_si256(
                    (const __m256i*)(cj + r[i].pix + l)));
                __m256 f = _mm256_cvtepi32_ps(d);
                if (o->scale) f = _mm256_mul_ps(f, vs);
                _mm256_storeu_ps(out + r[i].pix + l, f);
            }
            for (; l < r[i].len; l++) {
                float f = (float)((int32_t)g[D_KBITS] - 2 * sj[l] + (cj ? cj[r[i].pix + l] : 0));
                if (o->scale) f *= sc;
                out[r[i].pix + l] = f;
            }
        }
    }
}

/* bit-packed output: channel j's comparison as bit (n + j) % 8 of each position's byte,
   the flips applied, the byte set (the first channels of a byte) or or-ed in */
__attribute__((target("avx2")))
static inline void nstore_bits_avx2(const int64_t* g, const dout* o, int64_t n, int nr,
                                    int32_t s[NR2][VW2], const nrun* r, int nrn) {
    const int32_t* corr = (const int32_t*)g[D_CORR];
    const int64_t ohw = g[D_OH] * g[D_OW], step = (g[D_O] + 63) / 64 * 8;
    __m256i acc[VW2 / 8];
    for (int i = 0; i < VW2 / 8; i++) acc[i] = _mm256_setzero_si256();
    int flip = 0;
    for (int j = 0; j < nr; j++) {
        int64_t t = o->th[n + j];
        t = t > INT32_MAX ? INT32_MAX : t < INT32_MIN ? INT32_MIN : t;
        const __m256i th = _mm256_set1_epi32((int32_t)t);
        const __m256i bit = _mm256_set1_epi32(1 << ((n + j) % 8));
        flip |= ((o->flip[(n + j) / 8] >> ((n + j) % 8)) & 1) << ((n + j) % 8);
        if (corr) {   /* per position: the correction's lanes come from the runs */
            int32_t d[VW2];
            for (int l = 0; l < VW2; l++) d[l] = 0;
            for (int i = 0; i < nrn; i++)
                for (int l = 0; l < r[i].len; l++)
                    d[r[i].lane + l] = 2 * s[j][r[i].lane + l] -
                                       corr[(n + j) * ohw + r[i].pix + l];
            for (int i = 0; i < VW2 / 8; i++)
                acc[i] = _mm256_or_si256(acc[i], _mm256_and_si256(bit, _mm256_cmpgt_epi32(
                    _mm256_loadu_si256((const __m256i*)(d + 8 * i)), th)));
        } else {
            for (int i = 0; i < VW2 / 8; i++)
                acc[i] = _mm256_or_si256(acc[i], _mm256_and_si256(bit, _mm256_cmpgt_epi32(
                    _mm256_load_si256((const __m256i*)(s[j] + 8 * i)), th)));
        }
    }
    /* the lanes' bytes in order (the packs interleave 4-lane groups of the 128-bit lanes) */
    const __m256i w = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(
        _mm256_packus_epi32(acc[0], acc[1]), _mm256_packus_epi32(acc[2], acc[3])),
        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    uint8_t b[VW2] __attribute__((aligned(32)));
    _mm256_store_si256((__m256i*)b, _mm256_xor_si256(w, _mm256_set1_epi8((char)flip)));
    uint8_t* ob = (uint8_t*)o->out + (n / 64) * 8 + (n % 64) / 8;
    const int first = n % 8 == 0;
    for (int i = 0; i < nrn; i++) {
        uint8_t* p = ob + r[i].pix * step;
        const uint8_t* bi = b + r[i].lane;
        if (first) for (int l = 0; l < r[i].len; l++) p[l * step] = bi[l];
        else for (int l = 0; l < r[i].len; l++) p[l * step] |= bi[l];
    }
}

__attribute__((target("avx2")))
static void direct_avx2(const int64_t* g, const uint64_t* img, const dout* o, int64_t n0,
                        int64_t n1) {
    const int64_t K = g[D_K], HW = g[D_HP] * g[D_WP], ps = nib_stride(g);
    const int64_t np = (g[D_OH] - 1) * g[D_WP] + g[D_OW];   /* positions up to the last */
    const int64_t nv = (np + VW2 - 1) / VW2;
    const uint8_t* nib = nib_planes(g, (uint64_t*)img);
    const uint8_t* tab = (const uint8_t*)g[D_NIB];
    const int64_t* off = g + D_OFF;
    int64_t noff_s[256];
    int64_t* noff = K <= 256 ? noff_s : (int64_t*)malloc(sizeof(int64_t) * (size_t)K);
    if (!noff) return;
    for (int64_t k = 0; k < K; k++) noff[k] = off[k] / HW * 16 * ps + off[k] % HW;
    int32_t s[PV2][NR2][VW2] __attribute__((aligned(32)));
    nrun r[PV2][VW2 + 1];
    int nrn[PV2];
    for (int64_t n = n0; n < n1; n += NR2) {
        const int nr = n1 - n < NR2 ? (int)(n1 - n) : NR2;
        const uint8_t* t = tab + ((n / NB) * K * 16 * NB + n % NB) * 16;
        for (int64_t v = 0; v < nv; v += PV2) {
            const int pv = nv - v < PV2 ? (int)(nv - v) : PV2;
            if (pv == PV2) ntile_avx2(g, nib, t, noff, v * VW2, PV2, s);
            else ntile_avx2(g, nib, t, noff, v * VW2, 1, s);
            for (int u = 0; u < pv; u++) {
                nrn[u] = nruns(g, (v + u) * VW2, r[u]);
                if (o->th) nstore_bits_avx2(g, o, n, nr, s[u], r[u], nrn[u]);
                else nstore_avx2(g, o, n, nr, s[u], r[u], nrn[u]);
            }
        }
    }
    if (noff != noff_s) free(noff);
}

/* AVX-512 VPOPCNTDQ: 8 pixels a zmm, PV5 vectors by NB channels a tile */
#ifndef PV5
#define PV5 3
#endif
#define T512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512vpopcntdq")))

/* the tile's sums: s[u][j], pixels of vector u by channel n + j */
T512 static inline __attribute__((always_inline)) void dsums_512(
        const int64_t* g, const uint64_t* img, const uint64_t* w, const dvec* v, int pv,
        __m512i s[PV5][NB]) {
    const int64_t K = g[D_K];
    const int64_t* off = g + D_OFF;
    __m512i a[PV5];
    /* the first word's counts start the sums */
    for (int u = 0; u < pv; u++) a[u] = _mm512_loadu_si512(img + v[u].src + off[0]);
    for (int j = 0; j < NB; j++) {
        const __m512i b = _mm512_set1_epi64((long long)w[j]);
        for (int u = 0; u < pv; u++) s[u][j] = _mm512_popcnt_epi64(_mm512_xor_si512(a[u], b));
    }
    for (int64_t k = 1; k < K; k++) {
        for (int u = 0; u < pv; u++) a[u] = _mm512_loadu_si512(img + v[u].src + off[k]);
        for (int j = 0; j < NB; j++) {
            const __m512i b = _mm512_set1_epi64((long long)w[k * NB + j]);
            for (int u = 0; u < pv; u++)
                s[u][j] = _mm512_add_epi64(s[u][j], _mm512_popcnt_epi64(
                    _mm512_xor_si512(a[u], b)));
        }
    }
}

T512 static inline __attribute__((always_inline)) void dtile_512(
        const int64_t* g, const uint64_t* img, const uint64_t* w, const float* scale,
        float* out, int64_t n, int nr, const dvec* v, int pv) {
    __m512i s[PV5][NB];
    dsums_512(g, img, w, v, pv, s);
    /* two channels' sums at once: their low halves (the sums are < 2^24) in one register,
       converted, and kbits - 2 * sum (+ corr) formed in float, exactly, by one fma */
    const float* base = (const float*)g[D_BASE];
    const int64_t ohw = g[D_OH] * g[D_OW];
    const __m512i pair = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    const __m512 kb = _mm512_set1_ps((float)g[D_KBITS]), m2 = _mm512_set1_ps(-2.0f);
    __mmask8 m[PV5];
    for (int u = 0; u < pv; u++) m[u] = (__mmask8)((1u << v[u].nv) - 1);
#pragma GCC unroll 8
    for (int j = 0; j < nr; j += 2) {
        const int both = j + 1 < nr;
        const __m512 sc = scale ? _mm512_insertf32x8(_mm512_set1_ps(scale[n + j]),
                                                     _mm256_set1_ps(scale[n + j + both]), 1)
                                : _mm512_set1_ps(1.0f);
#pragma GCC unroll 4
        for (int u = 0; u < pv; u++) {
            float* o = out + (n + j) * ohw + v[u].pix;
            __m512 b = kb;
            if (base) {
                const float* bp = base + (n + j) * ohw + v[u].pix;
                b = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_maskz_loadu_ps(m[u], bp)),
                                       _mm256_maskz_loadu_ps(m[u], bp + both * ohw), 1);
            }
            __m512 f = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(s[u][j], pair,
                                                                    s[u][j + 1]));
            f = _mm512_mul_ps(_mm512_fmadd_ps(f, m2, b), sc);
            _mm256_mask_storeu_ps(o, m[u], _mm512_castps512_ps256(f));
            if (both) _mm256_mask_storeu_ps(o + ohw, m[u], _mm512_extractf32x8_ps(f, 1));
        }
    }
}

/* the bit-packed epilogue: per vector, channel j's comparison or-ed in as bit j of each
   pixel's lane, the block's flips applied, the lanes narrowed to bytes (vpmovqb) and each
   byte stored into its pixel's word */
T512 static inline __attribute__((always_inline)) void dtile_512_bits(
        const int64_t* g, const uint64_t* img, const uint64_t* w, const dout* o, int64_t n,
        int nr, const dvec* v, int pv) {
    __m512i s[PV5][NB];
    dsums_512(g, img, w, v, pv, s);
    const int32_t* corr = (const int32_t*)g[D_CORR];
    const int64_t ohw = g[D_OH] * g[D_OW], step = (g[D_O] + 63) / 64 * 8;
    uint8_t* ob = (uint8_t*)o->out + (n / 64) * 8 + (n % 64) / 8;
    const __m512i flip = _mm512_set1_epi64(o->flip[n / 8]);
#pragma GCC unroll 4
    for (int u = 0; u < pv; u++) {
        const __mmask8 m = (__mmask8)((1u << v[u].nv) - 1);
        __m512i acc = flip;
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            __m512i d = s[u][j];
            if (corr)
                d = _mm512_sub_epi64(_mm512_slli_epi64(d, 1), _mm512_cvtepi32_epi64(
                    _mm256_maskz_loadu_epi32(m, corr + (n + j) * ohw + v[u].pix)));
            const __mmask8 k = _mm512_cmpgt_epi64_mask(d, _mm512_set1_epi64(o->th[n + j]));
            acc = _mm512_mask_xor_epi64(acc, k, acc, _mm512_set1_epi64(1ll << j));
        }
        uint64_t b = (uint64_t)_mm_cvtsi128_si64(_mm512_cvtepi64_epi8(acc));
        uint8_t* p = ob + v[u].pix * step;
        for (int i = 0; i < v[u].nv; i++, b >>= 8) p[i * step] = (uint8_t)b;
    }
}

/* Bit-packed output without a correction (-1 or +1 padding), blocks of NB channels whole:
   tiles laid the other way, lanes the NB channels of a block and each vector one pixel,
   so that a comparison's mask is the pixel's byte of the output as it is stored. A tile is
   VW pixels of a row by CB blocks (CB vectors of weights, the pixels' words broadcast from
   the image as memory operands of the xors: VW x CB sums, the same three vector operations
   per 512 products); its epilogue is one comparison per sum (vpcmpgtq against the block's
   thresholds, a memory operand) and a store of the mask (kmovb), the flips, where a block
   has any, a kxorb: no permutes, no gathering of bits, and the mask store costs no vector
   operation. */
enum { CB5 = 3 };

T512 static inline __attribute__((always_inline)) void ctile_512(
        const int64_t* g, const uint64_t* img, const uint64_t* w, const int64_t* th,
        uint32_t flips, uint8_t* out, int64_t step, dvec v, int cb) {
    const int64_t K = g[D_K];
    const int64_t* off = g + D_OFF;
    __m512i s[VW][CB5], wv[CB5];
    /* the first word's counts start the sums */
    const uint64_t* x = img + v.src + off[0];
    for (int c = 0; c < cb; c++) wv[c] = _mm512_loadu_si512(w + c * K * NB);
#pragma GCC unroll 8
    for (int i = 0; i < VW; i++) {
        const __m512i a = _mm512_set1_epi64((long long)x[i]);
        for (int c = 0; c < cb; c++) s[i][c] = _mm512_popcnt_epi64(_mm512_xor_si512(wv[c], a));
    }
    for (int64_t k = 1; k < K; k++) {
        x = img + v.src + off[k];
        for (int c = 0; c < cb; c++) wv[c] = _mm512_loadu_si512(w + (c * K + k) * NB);
#pragma GCC unroll 8
        for (int i = 0; i < VW; i++) {
            const __m512i a = _mm512_set1_epi64((long long)x[i]);
            for (int c = 0; c < cb; c++)
                s[i][c] = _mm512_add_epi64(s[i][c], _mm512_popcnt_epi64(
                    _mm512_xor_si512(wv[c], a)));
        }
    }
    uint8_t* o = out + v.pix * step;
    if (v.nv == VW) {
#pragma GCC unroll 8
        for (int i = 0; i < VW; i++)
            for (int c = 0; c < cb; c++) {
                __mmask8 m = _mm512_cmpgt_epi64_mask(s[i][c], _mm512_loadu_si512(th + c * NB));
                if (flips) m = _kxor_mask8(m, _cvtu32_mask8(flips >> (8 * c)));
                _store_mask8((__mmask8*)(o + i * step + c), m);
            }
    } else {
#pragma GCC unroll 8
        for (int i = 0; i < VW; i++)
            for (int c = 0; c < cb; c++) {
                __mmask8 m = _mm512_cmpgt_epi64_mask(s[i][c], _mm512_loadu_si512(th + c * NB));
                if (flips) m = _kxor_mask8(m, _cvtu32_mask8(flips >> (8 * c)));
                if (i < v.nv) _store_mask8((__mmask8*)(o + i * step + c), m);
            }
    }
}

/* channels [n0, n1) (whole blocks) to bits on ctile_512's tiles: for each vector of pixels
   every group of CB5 blocks, so that the vector's window stays in L1 and each pixel's
   output bytes are written while its line is there */
T512 static __attribute__((noinline)) void cblocks_512(
        const int64_t* g, const uint64_t* img, const dout* o, int64_t n0, int64_t n1) {
    const int64_t K = g[D_K], V = g[D_OH] * ((g[D_OW] + VW - 1) / VW);
    const int64_t step = (g[D_O] + 63) / 64 * 8;
    const uint64_t* wb = (const uint64_t*)g[D_WB];
    int64_t oy = 0, ox = 0;
    for (int64_t q = 0; q < V; q++) {
        const dvec v = dnext(g, &oy, &ox);
        for (int64_t n = n0; n < n1; n += CB5 * NB) {
            const int cb = (n1 - n) / NB < CB5 ? (int)((n1 - n) / NB) : CB5;
            const uint64_t* w = wb + (n / NB) * K * NB;
            const int64_t* th = o->th + n;
            /* the blocks' flip bytes, by value: the byte stores could alias a pointer's */
            uint32_t flips = 0;
            for (int c = 0; c < cb; c++) flips |= (uint32_t)o->flip[n / 8 + c] << (8 * c);
            uint8_t* out = (uint8_t*)o->out + n / 8;
            if (cb == 3 && !flips) ctile_512(g, img, w, th, 0, out, step, v, 3);
            else if (cb == 3) ctile_512(g, img, w, th, flips, out, step, v, 3);
            else if (cb == 2) ctile_512(g, img, w, th, flips, out, step, v, 2);
            else ctile_512(g, img, w, th, flips, out, step, v, 1);
        }
    }
}

T512 static void direct_512(const int64_t* g, const uint64_t* img, const dout* o, int64_t n0,
                            int64_t n1) {
    if (o->th && !g[D_CORR]) {   /* the whole blocks on the channel-lane tiles */
        const int64_t whole = n0 + (n1 - n0) / NB * NB;
        cblocks_512(g, img, o, n0, whole);
        n0 = whole;
    }
    const int64_t K = g[D_K], V = g[D_OH] * ((g[D_OW] + VW - 1) / VW);
    const uint64_t* wb = (const uint64_t*)g[D_WB];
    for (int64_t n = n0; n < n1; n += NB) {
        const int nr = n1 - n < NB ? (int)(n1 - n) : NB;
        const uint64_t* w = wb + (n / NB) * K * NB;
        int64_t q = 0, oy = 0, ox = 0;
        for (; q + PV5 <= V; q += PV5) {
            dvec v[PV5];
            for (int u = 0; u < PV5; u++) v[u] = dnext(g, &oy, &ox);
            /* a whole block of channels: the epilogue unrolled, the sums kept in registers */
            if (o->th) {
                if (nr == NB) dtile_512_bits(g, img, w, o, n, NB, v, PV5);
                else dtile_512_bits(g, img, w, o, n, nr, v, PV5);
            } else if (nr == NB) {
                dtile_512(g, img, w, o->scale, (float*)o->out, n, NB, v, PV5);
            } else {
                dtile_512(g, img, w, o->scale, (float*)o->out, n, nr, v, PV5);
            }
        }
        for (; q < V; q++) {
            dvec v[PV5];
            v[0] = dnext(g, &oy, &ox);
            if (o->th) dtile_512_bits(g, img, w, o, n, nr, v, 1);
            else dtile_512(g, img, w, o->scale, (float*)o->out, n, nr, v, 1);
        }
    }
}

#include "binary_planes.h"

/* The bit planes' per-channel lists (``binary_planes.h``'s PL_CH and PL_IDX) of the blocked
   weights wb (O channels of taps * Cw words, C input channels): per channel (mode, |S1|,
   count, start) into chan, mode 1 where its weight bits 1 are at most half of the planes,
   and into idx the byte offsets in V (32 a plane; planes tap-major, then channel) of the
   set it adds, S1 or S0. Returns the lists' total length (with idx null, only that). Made
   where the AVX2 kernel runs: by eager mode for a layer's plan, by a library at load. */
int64_t tsr_bin_planes_lists(const uint64_t* wb, int64_t O, int64_t C, int64_t Cw,
                             int64_t taps, int64_t* chan, int32_t* idx) {
    const int64_t K = taps * Cw, np = taps * C, last = C - 64 * (Cw - 1);
    const uint64_t keep = last == 64 ? ~0ull : (1ull << last) - 1;
    int64_t at = 0;
    for (int64_t n = 0; n < O; n++) {
        const uint64_t* w = wb + n / NB * K * NB + n % NB;   /* word k: w[k * NB] */
        int64_t n1 = 0;
        for (int64_t k = 0; k < K; k++)
            n1 += __builtin_popcountll(w[k * NB] & (k % Cw == Cw - 1 ? keep : ~0ull));
        const int64_t mode = n1 <= np - n1, cnt = mode ? n1 : np - n1;
        int64_t* ch = chan + 4 * n;
        ch[0] = mode, ch[1] = n1, ch[2] = cnt, ch[3] = at;
        if (!idx) {
            at += cnt;
            continue;
        }
        for (int64_t k = 0; k < K; k++) {   /* the set's bits of each word, in order */
            const int64_t t = k / Cw, cw = k % Cw;
            uint64_t x = (mode ? w[k * NB] : ~w[k * NB]) & (cw == Cw - 1 ? keep : ~0ull);
            for (; x; x &= x - 1)
                idx[at++] = (int32_t)((t * C + cw * 64 + __builtin_ctzll(x)) * 32);
        }
    }
    return at;
}

/* The AVX2 path's nibble planes of the packed image in ``img``, or with a planes plan
   (``D_PLN``) its bit planes (before its tsr_bin_direct_conv calls). */
void tsr_bin_direct_nibbles(const int64_t* g, uint64_t* img) {
    if (g[D_PLN]) planes_prep(g, img);
    else nibbles_avx2(g, img, nib_planes(g, img));
}

/* The thresholds of channels [n0, n1) as the kernels compare them, into ``tab`` (O rounded
   up to NB int64, then as many flip bits): T (O, 2) int64 holds, per channel, (t, flip):
   the bit is set where (dot < t) xor flip, dot = kbits - D. */
static void thresholds(const int64_t* g, const int64_t* T, int64_t* tab, int64_t n0,
                       int64_t n1) {
    const int64_t ob = (g[D_O] + NB - 1) / NB * NB, kbits = g[D_KBITS];
    uint8_t* flip = (uint8_t*)(tab + ob);
    const int halve = !g[D_CORR];
    for (int64_t n = n0; n < n1; n++) {
        /* dot < t  <=>  D > kbits - t; clamped so that the constants stay constant */
        int64_t t = T[2 * n];
        t = t > (1ll << 40) ? 1ll << 40 : t < -(1ll << 40) ? -(1ll << 40) : t;
        const int64_t d = kbits - t;
        tab[n] = halve ? d >> 1 : d;   /* arithmetic: floor */
        if (n % 8 == 0) flip[n / 8] = 0;
        flip[n / 8] |= (uint8_t)((T[2 * n + 1] & 1) << (n % 8));
    }
}

/* The output channels [n0, n1) (n0 a multiple of NB) of one image, from its packed image:
   out float (O, OH, OW), or, with thresholds T, bit-packed (OH, OW, ceil(O / 64)) words.
   path: 0 portable C, 1 AVX2, 2 AVX-512 VPOPCNTDQ. The thresholds' table goes after the
   image in ``img`` (its caller's scratch). */
void tsr_bin_direct_conv(const int64_t* g, int64_t path, uint64_t* img, const float* scale,
                         void* out, int64_t n0, int64_t n1, const int64_t* T) {
    dout o = {scale, out, 0, 0};
    if (T) {
        int64_t* tab = (int64_t*)(img + g[D_CW] * g[D_HP] * g[D_WP] + SLACK);
        thresholds(g, T, tab, n0, n1);
        o.th = tab;
        o.flip = (const uint8_t*)(tab + (g[D_O] + NB - 1) / NB * NB);
    }
    if (path == 2) direct_512(g, img, &o, n0, n1);
    else if (path == 1 && g[D_PLN]) planes_avx2(g, img, &o, n0, n1);
    else if (path == 1) direct_avx2(g, img, &o, n0, n1);
    else direct_c(g, img, &o, n0, n1);
    const int64_t O = g[D_O], cwo = (O + 63) / 64, used = (O % 64 + 7) / 8;
    if (T && n1 == O && O % 64 && used < 8) {   /* the last word's unused bytes: zero */
        const int64_t ohw = g[D_OH] * g[D_OW];
        for (int64_t q = 0; q < ohw; q++)
            memset((uint8_t*)out + (q * cwo + cwo - 1) * 8 + used, 0, (size_t)(8 - used));
    }
}

/* Images [i0, i1) of x, each packed into ``img`` (scratch of Cw * Hp * Wp + 8 words, and
   with thresholds ceil(O / 8) * 9 + 1 more) and convolved. mode: the path (as above) plus 4
   when x is bit-packed, (N, H, W, Cw) words, else float (N, C, H, W). The output: float
   (N, O, OH, OW), or with thresholds T bit-packed (N, OH, OW, ceil(O / 64)). One call per
   layer on one thread. With ``words`` (the layer's packed weights as the caller has them
   now), first whether they still hold what the plan was made from: 1 and nothing done if
   not (they were written in place: the caller prepares them again), else 0. */
int64_t tsr_bin_direct(const int64_t* g, int64_t mode, const void* x, const float* scale,
                       void* out, uint64_t* img, int64_t i0, int64_t i1, const void* words,
                       const int64_t* T) {
    if (words && memcmp(words, (const void*)g[D_SRC], (size_t)g[D_SRC_BYTES])) return 1;
    const int64_t ohw = g[D_OH] * g[D_OW];
    const int64_t in_size = mode & 4 ? g[D_H] * g[D_W] * g[D_CW] : g[D_CIN] * g[D_H] * g[D_W];
    const int64_t out_size = T ? ohw * ((g[D_O] + 63) / 64) * 8 : g[D_O] * ohw * 4;
    for (int64_t i = i0; i < i1; i++) {
        if (mode & 4) tsr_bin_direct_bits(g, (const uint64_t*)x + i * in_size, img);
        else tsr_bin_direct_pack(g, (const float*)x + i * in_size, img);
        if ((mode & 3) == 1) tsr_bin_direct_nibbles(g, img);
        tsr_bin_direct_conv(g, mode & 3, img, scale, (char*)out + i * out_size, 0, g[D_O], T);
    }
    return 0;
}
