/* INT8 GEMM: C[m, n] = requant(sum_k A[m, k] * B[n, k] - a_zp * colsum[n] + bias[n]).

   A is uint8 (activations, row-major, rows padded to a multiple of 4 bytes), B int8
   (weights) packed by tsr_int8_pack as [N/16][K/4][16][4]: for each block of 16 output
   columns and each group of 4 k, 64 bytes, one 32-bit lane per column holding its 4
   weights. That is the operand of one vpdpbusd on a zmm (AVX-512 VNNI), of two on ymm
   (AVX-VNNI), and of vpmaddubsw + vpmaddwd on ymm (AVX2, made exact: see tile_avx2);
   16 of those rows are one B tile of tdpbusd (AMX-INT8, int8_amx.h).

   Every instruction set accumulates into an int32 tile, and one epilogue (in plain C, so
   that every path rounds the same way) requantizes it:
     v = (float)acc * mult[n]          (mult = a_scale * w_scale[n] / out_scale)
     q = clamp(rint(v), lo - zp, hi - zp) + zp     -> uint8 or int8
   or, for dynamic quantization, writes the float v = (float)acc * mult[n] + bias_f[n].
   Compiled with -ffp-contract=off, so that the product and sum round as NumPy's do. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

enum { P_M, P_N, P_K, P_A, P_LDA, P_B, P_COLSUM, P_BIAS, P_MULT, P_C, P_LDC, P_AZP, P_ZP,
       P_LO, P_HI, P_MODE, P_BIASF, P_PIX, P_NTOT, P_NOFF };
enum { MR = 8 };

static inline int32_t load4(const uint8_t* p) { int32_t v; memcpy(&v, p, 4); return v; }

/* The requantization of 16 int32 sums into bytes (uint8, or int8's two's complement):
   rint((float)s * mult), clamped to [lo, hi] (relative to the zero point), plus zp. One
   zmm each step where the compiler targets AVX-512 (GCC splits the scalar loop below into
   xmm pieces), the same operations in the same order otherwise. */
static inline void requant16(const int32_t* s, const float* mult, float lo, float hi,
                             int32_t zp, uint8_t* out) {
#if defined(__AVX512F__)
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512((const void*)s)),
                             _mm512_loadu_ps(mult));
    v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(lo)), _mm512_set1_ps(hi));
    _mm_storeu_si128((__m128i*)out, _mm512_cvtepi32_epi8(
        _mm512_add_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(zp))));
#else
    for (int k = 0; k < 16; k++) {
        float v = nearbyintf((float)s[k] * mult[k]);
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
        out[k] = (uint8_t)((int32_t)v + zp);
    }
#endif
}

/* the requantization of one tile of rows x 16 accumulators */
static void epilogue(const int64_t* p, int64_t m0, int64_t rows, int64_t nb,
                     const int32_t* acc) {
    const int64_t n = p[P_N], n0 = nb * 16, ncol = n - n0 < 16 ? n - n0 : 16;
    const int32_t* colsum = (const int32_t*)p[P_COLSUM] + n0;
    const int32_t* bias = p[P_BIAS] ? (const int32_t*)p[P_BIAS] + n0 : 0;
    const float* mult = (const float*)p[P_MULT] + n0;
    const int32_t azp = (int32_t)p[P_AZP], zp = (int32_t)p[P_ZP];
    const float lo = (float)(p[P_LO] - zp), hi = (float)(p[P_HI] - zp);
    const int64_t mode = p[P_MODE], ldc = p[P_LDC], pix = p[P_PIX];
    if (pix > 0) {  /* NCHW output: row m is pixel m % pix of image m / pix */
        /* all 16 lanes (the column arrays are padded to a block), branch-free so that
           it vectorises; the same operations, in the same order, as below */
        uint32_t off[16];
        int32_t q[MR][16];
        for (int j = 0; j < 16; j++)
            off[j] = (uint32_t)(azp * colsum[j]) - (uint32_t)(bias ? bias[j] : 0);
        for (int64_t r = 0; r < rows; r++)
            for (int j = 0; j < 16; j++) {
                float v = nearbyintf((float)(int32_t)((uint32_t)acc[r * 16 + j] - off[j])
                                     * mult[j]);
                v = v < lo ? lo : v;  /* (two selects: a max and a min) */
                v = v > hi ? hi : v;
                q[r][j] = (int32_t)v + zp;
            }
        const int64_t ntot = p[P_NTOT], noff = p[P_NOFF] + n0;
        uint8_t* out = (uint8_t*)p[P_C];
        for (int64_t r = 0; r < rows; r++) {
            const int64_t m = m0 + r, img = m / pix, px = m - img * pix;
            uint8_t* o = out + (img * ntot + noff) * pix + px;
            for (int64_t j = 0; j < ncol; j++) o[j * pix] = (uint8_t)q[r][j];
        }
        return;
    }
    if (mode == 2) {  /* dynamic quantization: float out */
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < ncol; j++) {
                int32_t s = (int32_t)((uint32_t)acc[r * 16 + j] - (uint32_t)(azp * colsum[j])
                                      + (uint32_t)(bias ? bias[j] : 0));
                ((float*)p[P_C])[(m0 + r) * ldc + n0 + j] =
                    (float)s * mult[j] + ((const float*)p[P_BIASF])[n0 + j];
            }
        return;
    }
    /* row-major (NHWC) out, columns from P_NOFF of rows P_LDC wide: all 16 lanes of a
       row at once, then its columns stored */
    int32_t off[16], sum[16];
    uint8_t q[16];
    for (int j = 0; j < 16; j++)
        off[j] = (int32_t)((uint32_t)(azp * colsum[j]) - (uint32_t)(bias ? bias[j] : 0));
    const int64_t noff = p[P_NOFF] + n0;
    for (int64_t r = 0; r < rows; r++) {
        for (int j = 0; j < 16; j++)
            sum[j] = (int32_t)((uint32_t)acc[r * 16 + j] - (uint32_t)off[j]);
        uint8_t* o = (uint8_t*)p[P_C] + (m0 + r) * ldc + noff;  /* (int8: the same bytes) */
        if (ncol == 16) {
            requant16(sum, mult, lo, hi, zp, o);
            continue;
        }
        requant16(sum, mult, lo, hi, zp, q);
        memcpy(o, q, (size_t)ncol);
    }
}

/* ---- portable C ----------------------------------------------------------------------- */
static void tile_c(const int64_t* p, int64_t m0, int64_t rows, int64_t nb, int32_t* acc) {
    const int64_t kq = p[P_K] / 4, lda = p[P_LDA];
    const uint8_t* A = (const uint8_t*)p[P_A] + m0 * lda;
    const int8_t* B = (const int8_t*)p[P_B] + nb * kq * 64;
    memset(acc, 0, sizeof(int32_t) * MR * 16);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < kq; g++)
            for (int j = 0; j < 16; j++) {
                int32_t s = 0;
                for (int t = 0; t < 4; t++)
                    s += (int32_t)A[r * lda + g * 4 + t] * (int32_t)B[g * 64 + j * 4 + t];
                acc[r * 16 + j] += s;
            }
}

/* ---- AVX2: vpmaddubsw + vpmaddwd, exact ----------------------------------------------- */
/* vpmaddubsw saturates each sum of two u8 x s8 products to int16 (255 * -128 * 2 < -32768).
   Activations below 128 cannot reach that; a tile whose rows hold a byte of 128 or more
   splits each byte into its low 7 bits and its top bit, a = lo + 128 * hi: neither part's
   pair sums saturate (127 * 128 * 2 and 1 * 128 * 2), and vpmaddwd multiplies the top
   bit's by 128 in int32. So every activation is exact, at twice the work where needed. */
__attribute__((target("avx2")))
static int high_bit(const uint8_t* A, int64_t lda, int64_t rows, int64_t k) {
    __m256i any = _mm256_setzero_si256();
    uint8_t tail = 0;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t* a = A + r * lda;
        int64_t i = 0;
        for (; i + 32 <= k; i += 32)
            any = _mm256_or_si256(any, _mm256_loadu_si256((const __m256i*)(a + i)));
        for (; i < k; i++) tail |= a[i];
    }
    return _mm256_movemask_epi8(any) != 0 || (tail & 0x80);
}

__attribute__((target("avx2")))
static void tile_avx2(const int64_t* p, int64_t m0, int64_t rows, int64_t nb, int32_t* acc) {
    const int64_t kq = p[P_K] / 4, lda = p[P_LDA];
    const uint8_t* A = (const uint8_t*)p[P_A] + m0 * lda;
    const int8_t* B = (const int8_t*)p[P_B] + nb * kq * 64;
    const __m256i ones = _mm256_set1_epi16(1), k128 = _mm256_set1_epi16(128);
    const int split = high_bit(A, lda, rows, kq * 4);
    __m256i c0[MR], c1[MR];
    for (int r = 0; r < MR; r++) { c0[r] = _mm256_setzero_si256(); c1[r] = c0[r]; }
    for (int64_t g = 0; g < kq; g++) {
        __m256i b0 = _mm256_loadu_si256((const __m256i*)(B + g * 64));
        __m256i b1 = _mm256_loadu_si256((const __m256i*)(B + g * 64 + 32));
        for (int r = 0; r < MR; r++) {
            if (r >= rows) break;
            int32_t v = load4(A + r * lda + g * 4);
            if (!split) {
                __m256i a = _mm256_set1_epi32(v);
                c0[r] = _mm256_add_epi32(c0[r], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b0), ones));
                c1[r] = _mm256_add_epi32(c1[r], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b1), ones));
                continue;
            }
            __m256i lo = _mm256_set1_epi32(v & 0x7f7f7f7f);
            __m256i hi = _mm256_set1_epi32((int32_t)(((uint32_t)v >> 7) & 0x01010101u));
            c0[r] = _mm256_add_epi32(c0[r], _mm256_add_epi32(
                _mm256_madd_epi16(_mm256_maddubs_epi16(lo, b0), ones),
                _mm256_madd_epi16(_mm256_maddubs_epi16(hi, b0), k128)));
            c1[r] = _mm256_add_epi32(c1[r], _mm256_add_epi32(
                _mm256_madd_epi16(_mm256_maddubs_epi16(lo, b1), ones),
                _mm256_madd_epi16(_mm256_maddubs_epi16(hi, b1), k128)));
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_si256((__m256i*)(acc + r * 16), c0[r]);
        _mm256_storeu_si256((__m256i*)(acc + r * 16 + 8), c1[r]);
    }
}

/* ---- AVX-VNNI: vpdpbusd on ymm ---------------------------------------------------------- */
__attribute__((target("avx2,avxvnni")))
static void tile_avxvnni(const int64_t* p, int64_t m0, int64_t rows, int64_t nb, int32_t* acc) {
    const int64_t kq = p[P_K] / 4, lda = p[P_LDA];
    const uint8_t* A = (const uint8_t*)p[P_A] + m0 * lda;
    const int8_t* B = (const int8_t*)p[P_B] + nb * kq * 64;
    __m256i c0[MR], c1[MR];
    for (int r = 0; r < MR; r++) { c0[r] = _mm256_setzero_si256(); c1[r] = c0[r]; }
    for (int64_t g = 0; g < kq; g++) {
        __m256i b0 = _mm256_loadu_si256((const __m256i*)(B + g * 64));
        __m256i b1 = _mm256_loadu_si256((const __m256i*)(B + g * 64 + 32));
        for (int r = 0; r < MR; r++) {
            if (r >= rows) break;
            __m256i a = _mm256_set1_epi32(load4(A + r * lda + g * 4));
            c0[r] = _mm256_dpbusd_avx_epi32(c0[r], a, b0);
            c1[r] = _mm256_dpbusd_avx_epi32(c1[r], a, b1);
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_si256((__m256i*)(acc + r * 16), c0[r]);
        _mm256_storeu_si256((__m256i*)(acc + r * 16 + 8), c1[r]);
    }
}

/* ---- AVX-512 VNNI: vpdpbusd on zmm ------------------------------------------------------ */
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static inline void tile512_rows(const uint8_t* A, int64_t lda, const int8_t* B, int64_t kq,
                                int rows, int32_t* acc) {
    __m512i c[MR];
    for (int r = 0; r < MR; r++) c[r] = _mm512_setzero_si512();
    for (int64_t g = 0; g < kq; g++) {
        __m512i b = _mm512_loadu_si512((const void*)(B + g * 64));
        for (int r = 0; r < MR; r++) {
            if (r >= rows) break;
            c[r] = _mm512_dpbusd_epi32(c[r], _mm512_set1_epi32(load4(A + r * lda + g * 4)), b);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_si512((void*)(acc + r * 16), c[r]);
}

__attribute__((target("avx512f,avx512bw,avx512vnni")))
static void tile_vnni512(const int64_t* p, int64_t m0, int64_t rows, int64_t nb, int32_t* acc) {
    const int64_t kq = p[P_K] / 4, lda = p[P_LDA];
    const uint8_t* A = (const uint8_t*)p[P_A] + m0 * lda;
    const int8_t* B = (const int8_t*)p[P_B] + nb * kq * 64;
    if (rows == MR) tile512_rows(A, lda, B, kq, MR, acc);   /* the common case, unrolled */
    else tile512_rows(A, lda, B, kq, (int)rows, acc);
}

/* Full tiles of 8 rows, unrolled so that the accumulators stay in registers: 8 x 32 on
   zmm (two column blocks, 16 accumulators), 8 x 16 on ymm. */
#define ROWS8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline))
static void full_vnni512(const uint8_t* A, int64_t lda, const int8_t* B0, const int8_t* B1,
                         int64_t kq, int32_t* acc0, int32_t* acc1) {
#define DECL(r) __m512i x##r = _mm512_setzero_si512(), y##r = x##r; \
    const uint8_t* a##r = A + r * lda;
    ROWS8(DECL)
    for (int64_t g = 0; g < kq; g++) {
        __m512i b0 = _mm512_loadu_si512((const void*)(B0 + g * 64));
        __m512i b1 = _mm512_loadu_si512((const void*)(B1 + g * 64));
#define STEP(r) { __m512i v = _mm512_set1_epi32(load4(a##r + g * 4)); \
        x##r = _mm512_dpbusd_epi32(x##r, v, b0); y##r = _mm512_dpbusd_epi32(y##r, v, b1); }
        ROWS8(STEP)
#undef STEP
    }
#define STORE(r) _mm512_storeu_si512((void*)(acc0 + r * 16), x##r); \
    _mm512_storeu_si512((void*)(acc1 + r * 16), y##r);
    ROWS8(STORE)
#undef STORE
#undef DECL
}

/* full_vnni512 with the requantization on the registers (row-major uint8/int8 out, both
   column blocks whole): no int32 tile through memory. The same operations as requant16. */
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static inline void q16(__m512i acc, __m512i off, __m512 mult, __m512 lo, __m512 hi,
                       __m512i zp, uint8_t* o) {
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, off)), mult);
    v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    _mm_storeu_si128((__m128i*)o, _mm512_cvtepi32_epi8(
        _mm512_add_epi32(_mm512_cvtps_epi32(v), zp)));
}

__attribute__((target("avx512f,avx512bw,avx512vnni")))
static void full_vnni512_q(const int64_t* p, int64_t m, int64_t nb) {
    /* (the tile through an L1 array: with the requantization in the same function GCC
       moves the accumulators between registers at every step of the k loop) */
    int32_t acc0[MR * 16] __attribute__((aligned(64)));
    int32_t acc1[MR * 16] __attribute__((aligned(64)));
    const int64_t kq = p[P_K] / 4, lda = p[P_LDA], ldc = p[P_LDC], n0 = nb * 16;
    const int8_t* B0 = (const int8_t*)p[P_B] + nb * kq * 64;
    full_vnni512((const uint8_t*)p[P_A] + m * lda, lda, B0, B0 + kq * 64, kq, acc0, acc1);
    const int32_t azp = (int32_t)p[P_AZP], zpi = (int32_t)p[P_ZP];
    const int32_t* colsum = (const int32_t*)p[P_COLSUM] + n0;
    const int32_t* bias = p[P_BIAS] ? (const int32_t*)p[P_BIAS] + n0 : 0;
    int32_t off[32];
    for (int j = 0; j < 32; j++)
        off[j] = (int32_t)((uint32_t)(azp * colsum[j]) - (uint32_t)(bias ? bias[j] : 0));
    const __m512i off0 = _mm512_loadu_si512((const void*)off),
        off1 = _mm512_loadu_si512((const void*)(off + 16)), zp = _mm512_set1_epi32(zpi);
    const float* mult = (const float*)p[P_MULT] + n0;
    const __m512 mu0 = _mm512_loadu_ps(mult), mu1 = _mm512_loadu_ps(mult + 16),
        lo = _mm512_set1_ps((float)(p[P_LO] - zpi)), hi = _mm512_set1_ps((float)(p[P_HI] - zpi));
    uint8_t* out = (uint8_t*)p[P_C] + m * ldc + p[P_NOFF] + n0;
    for (int r = 0; r < MR; r++) {
        q16(_mm512_load_si512((const void*)(acc0 + r * 16)), off0, mu0, lo, hi, zp,
            out + r * ldc);
        q16(_mm512_load_si512((const void*)(acc1 + r * 16)), off1, mu1, lo, hi, zp,
            out + r * ldc + 16);
    }
}

__attribute__((target("avx2,avxvnni")))
static void full_avxvnni(const uint8_t* A, int64_t lda, const int8_t* B0, const int8_t* B1,
                         int64_t kq, int32_t* acc0, int32_t* acc1) {
    (void)B1; (void)acc1;
#define DECL(r) __m256i x##r = _mm256_setzero_si256(), y##r = x##r; \
    const uint8_t* a##r = A + r * lda;
    ROWS8(DECL)
    for (int64_t g = 0; g < kq; g++) {
        __m256i b0 = _mm256_loadu_si256((const __m256i*)(B0 + g * 64));
        __m256i b1 = _mm256_loadu_si256((const __m256i*)(B0 + g * 64 + 32));
#define STEP(r) { __m256i v = _mm256_set1_epi32(load4(a##r + g * 4)); \
        x##r = _mm256_dpbusd_avx_epi32(x##r, v, b0); y##r = _mm256_dpbusd_avx_epi32(y##r, v, b1); }
        ROWS8(STEP)
#undef STEP
    }
#define STORE(r) _mm256_storeu_si256((__m256i*)(acc0 + r * 16), x##r); \
    _mm256_storeu_si256((__m256i*)(acc0 + r * 16 + 8), y##r);
    ROWS8(STORE)
#undef STORE
#undef DECL
}

/* One part of a GEMM: rows [m0, m1) by column blocks [nb0, nb1). The column blocks are
   the outer loop so that a block of packed weights stays in cache across the rows. */
typedef void (*tile_fn)(const int64_t*, int64_t, int64_t, int64_t, int32_t*);
typedef void (*full_fn)(const uint8_t*, int64_t, const int8_t*, const int8_t*, int64_t,
                        int32_t*, int32_t*);

static void run(tile_fn tile, full_fn full, int width, const int64_t* p, int64_t m0,
                int64_t m1, int64_t nb0, int64_t nb1) {
    /* the VNNI-512 tiles requantize on their registers where the epilogue writes
       row-major integers */
    const int fused = full == full_vnni512 && p[P_MODE] != 2 && p[P_PIX] == 0;
    int32_t acc[MR * 16] __attribute__((aligned(64)));
    int32_t acc1[MR * 16] __attribute__((aligned(64)));
    const int64_t kq = p[P_K] / 4, lda = p[P_LDA];
    const int8_t* B = (const int8_t*)p[P_B];
    for (int64_t nb = nb0; nb < nb1; ) {
        int w = full && nb + width <= nb1 ? width : 1;
        for (int64_t m = m0; m < m1; m += MR) {
            int64_t rows = m1 - m < MR ? m1 - m : MR;
            if (fused && w == 2 && rows == MR && (nb + 2) * 16 <= p[P_N]) {
                full_vnni512_q(p, m, nb);
                continue;
            }
            if (w == width && rows == MR && full) {
                full((const uint8_t*)p[P_A] + m * lda, lda, B + nb * kq * 64,
                     B + (nb + width - 1) * kq * 64, kq, acc, acc1);
                epilogue(p, m, rows, nb, acc);
                if (width == 2) epilogue(p, m, rows, nb + 1, acc1);
                continue;
            }
            for (int j = 0; j < w; j++) {
                tile(p, m, rows, nb + j, acc);
                epilogue(p, m, rows, nb + j, acc);
            }
        }
        nb += w;
    }
}

void tsr_int8_gemm_c(const int64_t* p, int64_t m0, int64_t m1, int64_t nb0, int64_t nb1) {
    run(tile_c, 0, 1, p, m0, m1, nb0, nb1);
}
void tsr_int8_gemm_avx2(const int64_t* p, int64_t m0, int64_t m1, int64_t nb0, int64_t nb1) {
    run(tile_avx2, 0, 1, p, m0, m1, nb0, nb1);
}
void tsr_int8_gemm_avxvnni(const int64_t* p, int64_t m0, int64_t m1, int64_t nb0,
                           int64_t nb1) {
    run(tile_avxvnni, full_avxvnni, 1, p, m0, m1, nb0, nb1);
}
void tsr_int8_gemm_vnni512(const int64_t* p, int64_t m0, int64_t m1, int64_t nb0,
                           int64_t nb1) {
    run(tile_vnni512, full_vnni512, 2, p, m0, m1, nb0, nb1);
}

#include "int8_amx.h"

/* ---- convolution helpers ------------------------------------------------------------------
   The geometry of a convolution, shared by im2col and the depthwise kernel. */
enum { G_CIMG, G_C, G_H, G_W, G_KH, G_KW, G_SH, G_SW, G_PH, G_PW, G_DH, G_DW, G_OH, G_OW,
       G_X, G_FILL, G_COLS, G_LDK,
       /* depthwise only */
       G_WT, G_BIAS, G_MULT, G_OUT, G_ZP, G_LO, G_HI, G_OG, G_MODE };

/* Rows [r0, r1) of an NCHW uint8 input's channels [0, C) (G_X points at the first; an
   image holds G_CIMG) as a padded NHWC copy at G_COLS: row r is image r / HP, padded row
   r % HP, HP = H + 2 PH, each WP = W + 2 PW pixels of C bytes, the border the input's zero
   point G_FILL (which means 0.0). Reading the planes row by row keeps each in cache. */
void tsr_int8_nhwc(const int64_t* p, int64_t r0, int64_t r1) {
    const int64_t cimg = p[G_CIMG], c = p[G_C], h = p[G_H], w = p[G_W], ph = p[G_PH],
        pw = p[G_PW], hp = h + 2 * ph, wp = w + 2 * pw;
    const uint8_t* x = (const uint8_t*)p[G_X];
    const uint8_t fill = (uint8_t)p[G_FILL];
    uint8_t* out = (uint8_t*)p[G_COLS];
    for (int64_t r = r0; r < r1; r++) {
        const int64_t img = r / hp, iy = r - img * hp - ph;
        uint8_t* row = out + r * wp * c;
        if (iy < 0 || iy >= h) { memset(row, fill, (size_t)(wp * c)); continue; }
        memset(row, fill, (size_t)(pw * c));
        memset(row + (pw + w) * c, fill, (size_t)(pw * c));
        const uint8_t* src = x + (img * cimg * h + iy) * w;
        uint8_t* dst = row + pw * c;
        for (int64_t ci = 0; ci < c; ci++) {
            const uint8_t* s = src + ci * h * w;
            for (int64_t ix = 0; ix < w; ix++) dst[ix * c + ci] = s[ix];
        }
    }
}

/* Rows [r0, r1) of the (N*OH*OW) x (KH*KW*C) columns of the padded NHWC copy above (at
   G_X): each tap's C channels are one copy. Rows are G_LDK bytes, the tail zero. */
void tsr_int8_im2col(const int64_t* p, int64_t r0, int64_t r1) {
    const int64_t c = p[G_C], kh = p[G_KH], kw = p[G_KW], sh = p[G_SH], sw = p[G_SW],
        dh = p[G_DH], dw = p[G_DW], oh = p[G_OH], ow = p[G_OW], ldk = p[G_LDK],
        hp = p[G_H] + 2 * p[G_PH], wp = p[G_W] + 2 * p[G_PW];
    const uint8_t* x = (const uint8_t*)p[G_X];
    uint8_t* cols = (uint8_t*)p[G_COLS];
    const int64_t k = c * kh * kw;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t img = r / (oh * ow), rem = r - img * oh * ow, oy = rem / ow,
            ox = rem - oy * ow;
        uint8_t* row = cols + r * ldk;
        for (int64_t i = 0; i < kh; i++) {
            const uint8_t* src = x + ((img * hp + oy * sh + i * dh) * wp + ox * sw) * c;
            if (dw == 1) {
                memcpy(row + i * kw * c, src, (size_t)(kw * c));
                continue;
            }
            for (int64_t j = 0; j < kw; j++)
                memcpy(row + (i * kw + j) * c, src + j * dw * c, (size_t)c);
        }
        if (ldk > k) memset(row + k, 0, (size_t)(ldk - k));
    }
}

/* Depthwise convolution (one input channel per group, G_OG outputs per group) of the
   NCHW uint8 planes [q0, q1) of the output (plane q = image * C * OG + channel): int32
   sums of (x - zero point) * w over the taps inside the input (the padding is the zero
   point, 0 after the shift), plus the int32 bias, requantized as the GEMM's epilogue
   does. Exact integer sums, so bit for bit the GEMM's result. */
void tsr_int8_depthwise(const int64_t* p, int64_t q0, int64_t q1) {
    const int64_t c = p[G_CIMG], h = p[G_H], w = p[G_W], kh = p[G_KH], kw = p[G_KW],
        sh = p[G_SH], sw = p[G_SW], ph = p[G_PH], pw = p[G_PW], dh = p[G_DH], dw = p[G_DW],
        oh = p[G_OH], ow = p[G_OW], og = p[G_OG], mode = p[G_MODE];
    const uint8_t* x = (const uint8_t*)p[G_X];
    const int8_t* wt = (const int8_t*)p[G_WT];
    const int32_t* bias = (const int32_t*)p[G_BIAS];
    const float* mult = (const float*)p[G_MULT];
    const int32_t azp = (int32_t)p[G_FILL], zp = (int32_t)p[G_ZP];
    const float lo = (float)(p[G_LO] - zp), hi = (float)(p[G_HI] - zp);
    /* the padded plane, shifted by the zero point, its columns split by phase modulo the
       stride (phase r holds columns r, r + SW, ...) so that every tap reads contiguous
       int16s across the output row */
    const int64_t hp = (oh - 1) * sh + (kh - 1) * dh + 1, wp = (ow - 1) * sw + (kw - 1) * dw + 1;
    const int64_t wq = (wp + sw - 1) / sw, lq = wq * sw;
    int16_t* pad = (int16_t*)malloc(sizeof(int16_t) * (size_t)(hp * lq));
    int16_t* tmp = (int16_t*)malloc(sizeof(int16_t) * (size_t)lq);
    int32_t* acc = (int32_t*)malloc(sizeof(int32_t) * (size_t)ow);
    int64_t last = -1;
    for (int64_t q = q0; q < q1; q++) {
        const int64_t img = q / (c * og), co = q - img * c * og, ci = co / og;
        const int64_t src = img * c + ci;
        if (src != last) {
            const uint8_t* plane = x + src * h * w;
            /* the input columns that land inside the padded row */
            const int64_t x0 = pw, x1 = pw + w < lq ? pw + w : lq;
            for (int64_t y = 0; y < hp; y++) {
                const int64_t iy = y - ph;
                int16_t* row = pad + y * lq;
                if (iy < 0 || iy >= h) { memset(row, 0, sizeof(int16_t) * (size_t)lq); continue; }
                int16_t* t = sw == 1 ? row : tmp;
                memset(t, 0, sizeof(int16_t) * (size_t)lq);
                const uint8_t* in = plane + iy * w;
                for (int64_t xx = x0; xx < x1; xx++)
                    t[xx] = (int16_t)((int32_t)in[xx - pw] - azp);
                if (sw != 1)
                    for (int64_t r = 0; r < sw; r++)
                        for (int64_t k = 0; k < wq; k++) row[r * wq + k] = tmp[k * sw + r];
            }
            last = src;
        }
        const int8_t* wk = wt + co * kh * kw;
        const int32_t b = bias ? bias[co] : 0;
        const float mu = mult[co];
        uint8_t* out = (uint8_t*)p[G_OUT] + q * oh * ow;
        for (int64_t oy = 0; oy < oh; oy++) {
            for (int64_t ox = 0; ox < ow; ox++) acc[ox] = b;
            for (int64_t i = 0; i < kh; i++)
                for (int64_t j = 0; j < kw; j++) {
                    const int32_t wv = wk[i * kw + j];
                    const int64_t col = j * dw;
                    const int16_t* s = pad + (oy * sh + i * dh) * lq + (col % sw) * wq + col / sw;
                    for (int64_t ox = 0; ox < ow; ox++) acc[ox] += (int32_t)s[ox] * wv;
                }
            for (int64_t ox = 0; ox < ow; ox++) {
                float v = nearbyintf((float)acc[ox] * mu);
                v = v < lo ? lo : v;  /* (two selects: a max and a min) */
                v = v > hi ? hi : v;
                const int32_t r = (int32_t)v + zp;
                if (mode == 0) out[oy * ow + ox] = (uint8_t)r;
                else ((int8_t*)out)[oy * ow + ox] = (int8_t)r;
            }
        }
    }
    free(tmp);
    free(pad);
    free(acc);
}

/* ---- NHWC convolution ------------------------------------------------------------------
   Activations stay NHWC between quantized convolutions: the GEMM's rows are the output
   pixels, its row-major result the next layer's input. */

/* Rows [r0, r1) of the (N*OH*OW) x (KH*KW*C) columns of an unpadded NHWC uint8 input
   (G_X: the group's first channel, pixels G_CIMG bytes apart; G_C channels a tap): each
   tap's channels one copy, a tap outside the input the zero point G_FILL (0.0). Rows are
   G_LDK bytes, the tail zero. */
void tsr_int8_im2col_nhwc(const int64_t* p, int64_t r0, int64_t r1) {
    const int64_t cimg = p[G_CIMG], c = p[G_C], h = p[G_H], w = p[G_W], kh = p[G_KH],
        kw = p[G_KW], sh = p[G_SH], sw = p[G_SW], ph = p[G_PH], pw = p[G_PW], dh = p[G_DH],
        dw = p[G_DW], oh = p[G_OH], ow = p[G_OW], ldk = p[G_LDK];
    const uint8_t* x = (const uint8_t*)p[G_X];
    const uint8_t fill = (uint8_t)p[G_FILL];
    uint8_t* cols = (uint8_t*)p[G_COLS];
    const int64_t k = c * kh * kw;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t img = r / (oh * ow), rem = r - img * oh * ow, oy = rem / ow,
            ox = rem - oy * ow;
        uint8_t* row = cols + r * ldk;
        const int64_t x0 = ox * sw - pw, x1 = x0 + (kw - 1) * dw;
        for (int64_t i = 0; i < kh; i++) {
            const int64_t iy = oy * sh - ph + i * dh;
            if (dw == 1 && c == cimg && iy >= 0 && iy < h && x0 >= 0 && x1 < w) {
                /* the kernel row's taps are adjacent pixels: one copy */
                memcpy(row + i * kw * c, x + ((img * h + iy) * w + x0) * c, (size_t)(kw * c));
                continue;
            }
            for (int64_t j = 0; j < kw; j++) {
                const int64_t ix = x0 + j * dw;
                uint8_t* dst = row + (i * kw + j) * c;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) memset(dst, fill, (size_t)c);
                else memcpy(dst, x + ((img * h + iy) * w + ix) * cimg, (size_t)c);
            }
        }
        if (ldk > k) memset(row + k, 0, (size_t)(ldk - k));
    }
}

/* Depthwise convolution (one input and one output channel per group) of an NHWC uint8
   input into the NHWC output rows [r0, r1) (row = image * OH + oy). G_WT: the weights as
   int32 [KH*KW][C]; G_BIAS: int32 bias - zero point * sum of the channel's weights. A tap
   inside the input adds x * w, one outside adds zero point * w (the padding is the zero
   point), so the int32 sum is the GEMM's exactly; requantized as the GEMM's epilogue does.
   The channels are the inner dimension of every operand: 16 of them are one vector (GCC's
   and Clang's vector extensions, a zmm with AVX-512) whose sums stay in a register across
   the taps; the channels past the last 16 are summed one by one. */
typedef int32_t v16i __attribute__((vector_size(64)));
#if defined(__GNUC__) && !defined(__clang__)
/* 64-byte vectors pass only between static inline helpers of this file, never across a
   library's boundary: GCC's note on their ABI without AVX-512 enabled does not apply */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

static inline v16i ld_i32(const int32_t* s) { v16i v; memcpy(&v, s, sizeof v); return v; }
static inline v16i ld_u8(const uint8_t* s) {
    /* (a loop GCC widens with one vpmovzxbd, where __builtin_convertvector goes lane by
       lane) */
    int32_t t[16];
    for (int k = 0; k < 16; k++) t[k] = s[k];
    v16i v;
    memcpy(&v, t, sizeof v);
    return v;
}

static inline void dw_requant(const int32_t* a, const float* mult, float lo, float hi,
                              int32_t zp, int64_t n, uint8_t* out) {
    for (int64_t k = 0; k < n; k++) {
        float v = nearbyintf((float)a[k] * mult[k]);
        v = v < lo ? lo : v;  /* (two selects: a max and a min) */
        v = v > hi ? hi : v;
        out[k] = (uint8_t)((int32_t)v + zp);
    }
}

static inline void dw_requant16(v16i acc, const float* mult, float lo, float hi, int32_t zp,
                                uint8_t* out) {
    int32_t a[16];
    memcpy(a, &acc, sizeof a);
    requant16(a, mult, lo, hi, zp, out);
}

typedef struct {
    int64_t c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
    const int32_t *wt, *off;
    const float* mult;
    int32_t azp, zp;
    float lo, hi;
} dwgeo;

/* Output pixel (oy, ox) of an image's plane, channels [c0, c1), any taps outside */
static void dw_pixel(const dwgeo* g, const uint8_t* plane, int64_t oy, int64_t ox,
                     int64_t c0, int64_t c1, uint8_t* out) {
    const int64_t c = g->c, x0 = ox * g->sw - g->pw;
    for (; c0 < c1; c0 += 16) {
        int32_t a[16];
        const int64_t nc = c1 - c0 < 16 ? c1 - c0 : 16;
        if (nc == 16) {
            v16i acc = ld_i32(g->off + c0);
            for (int64_t i = 0; i < g->kh; i++) {
                const int64_t iy = oy * g->sh - g->ph + i * g->dh;
                const int inside = iy >= 0 && iy < g->h;
                for (int64_t j = 0; j < g->kw; j++) {
                    const int64_t ix = x0 + j * g->dw;
                    const v16i wv = ld_i32(g->wt + (i * g->kw + j) * c + c0);
                    if (inside && ix >= 0 && ix < g->w)
                        acc += ld_u8(plane + (iy * g->w + ix) * c + c0) * wv;
                    else
                        acc += g->azp * wv;
                }
            }
            dw_requant16(acc, g->mult + c0, g->lo, g->hi, g->zp, out + c0);
            continue;
        }
        for (int64_t k = 0; k < nc; k++) a[k] = g->off[c0 + k];
        for (int64_t i = 0; i < g->kh; i++)
            for (int64_t j = 0; j < g->kw; j++) {
                const int64_t iy = oy * g->sh - g->ph + i * g->dh, ix = x0 + j * g->dw;
                const int32_t* wv = g->wt + (i * g->kw + j) * c + c0;
                const int in = iy >= 0 && iy < g->h && ix >= 0 && ix < g->w;
                const uint8_t* src = plane + (iy * g->w + ix) * c + c0;
                for (int64_t k = 0; k < nc; k++) a[k] += (in ? (int32_t)src[k] : g->azp) * wv[k];
            }
        dw_requant(a, g->mult + c0, g->lo, g->hi, g->zp, nc, out + c0);
    }
}

/* Output pixels ox .. ox + 3 of row oy, every tap inside the input, channels [0, C/16*16):
   each weight vector loaded once for the four pixels, no bounds tests */
static void dw_pixels4(const dwgeo* g, const uint8_t* plane, int64_t oy, int64_t ox,
                       uint8_t* out) {
    const int64_t c = g->c, cv = c / 16 * 16, step = g->sw * c;
    const uint8_t* base = plane + ((oy * g->sh - g->ph) * g->w + ox * g->sw - g->pw) * c;
    for (int64_t c0 = 0; c0 < cv; c0 += 16) {
        v16i a0 = ld_i32(g->off + c0), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < g->kh; i++) {
            const uint8_t* rp = base + i * g->dh * g->w * c + c0;
            const int32_t* wr = g->wt + i * g->kw * c + c0;
            for (int64_t j = 0; j < g->kw; j++) {
                const v16i wv = ld_i32(wr + j * c);
                const uint8_t* src = rp + j * g->dw * c;
                a0 += ld_u8(src) * wv;
                a1 += ld_u8(src + step) * wv;
                a2 += ld_u8(src + 2 * step) * wv;
                a3 += ld_u8(src + 3 * step) * wv;
            }
        }
        dw_requant16(a0, g->mult + c0, g->lo, g->hi, g->zp, out + c0);
        dw_requant16(a1, g->mult + c0, g->lo, g->hi, g->zp, out + c + c0);
        dw_requant16(a2, g->mult + c0, g->lo, g->hi, g->zp, out + 2 * c + c0);
        dw_requant16(a3, g->mult + c0, g->lo, g->hi, g->zp, out + 3 * c + c0);
    }
    for (int q = 0; q < 4 && cv < c; q++)
        dw_pixel(g, plane, oy, ox + q, cv, c, out + q * c);
}

void tsr_int8_dw_nhwc(const int64_t* p, int64_t r0, int64_t r1) {
    dwgeo g = {p[G_CIMG], p[G_H], p[G_W], p[G_KH], p[G_KW], p[G_SH], p[G_SW], p[G_PH],
               p[G_PW], p[G_DH], p[G_DW], p[G_OH], p[G_OW], (const int32_t*)p[G_WT],
               (const int32_t*)p[G_BIAS], (const float*)p[G_MULT], (int32_t)p[G_FILL],
               (int32_t)p[G_ZP], 0, 0};
    g.lo = (float)(p[G_LO] - g.zp);
    g.hi = (float)(p[G_HI] - g.zp);
    const int64_t c = g.c, oh = g.oh, ow = g.ow;
    /* the output columns whose taps all fall inside the input: [xa, xb) */
    const int64_t span = (g.kw - 1) * g.dw;
    int64_t xa = (g.pw + g.sw - 1) / g.sw, xb = g.w - 1 - span + g.pw >= 0 ?
        (g.w - 1 - span + g.pw) / g.sw + 1 : 0;
    if (xb > ow) xb = ow;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t img = r / oh, oy = r - img * oh;
        const uint8_t* plane = (const uint8_t*)p[G_X] + img * g.h * g.w * c;
        uint8_t* out = (uint8_t*)p[G_OUT] + r * ow * c;
        const int64_t y0 = oy * g.sh - g.ph, y1 = y0 + (g.kh - 1) * g.dh;
        const int rows_in = y0 >= 0 && y1 < g.h;
        int64_t ox = 0;
        for (; ox < ow; ox++) {
            if (rows_in && ox >= xa && ox + 4 <= xb) {
                dw_pixels4(&g, plane, oy, ox, out + ox * c);
                ox += 3;
                continue;
            }
            dw_pixel(&g, plane, oy, ox, 0, c, out + ox * c);
        }
    }
}

/* Elements [i0, i1) of the quantized sum of two tensors: the operands dequantized in float
   ((q - zero point) * scale), added, divided by the output's scale, rounded half to even,
   shifted by its zero point and clamped, each step a float32 operation as NumPy's. */
enum { A_A, A_B, A_OUT, A_AZP, A_BZP, A_SCALES, A_ZP, A_LO, A_HI, A_SIGNED };

void tsr_int8_add(const int64_t* p, int64_t i0, int64_t i1) {
    const float* sc = (const float*)p[A_SCALES];
    const float sa = sc[0], sb = sc[1], so = sc[2], zp = (float)p[A_ZP],
        lo = (float)p[A_LO], hi = (float)p[A_HI];
    const int32_t azp = (int32_t)p[A_AZP], bzp = (int32_t)p[A_BZP];
    if (p[A_SIGNED]) {
        const int8_t *a = (const int8_t*)p[A_A], *b = (const int8_t*)p[A_B];
        int8_t* o = (int8_t*)p[A_OUT];
        for (int64_t i = i0; i < i1; i++) {
            float v = nearbyintf(((float)(a[i] - azp) * sa + (float)(b[i] - bzp) * sb) / so) + zp;
            o[i] = (int8_t)(int32_t)(v < lo ? lo : v > hi ? hi : v);
        }
        return;
    }
    const uint8_t *a = (const uint8_t*)p[A_A], *b = (const uint8_t*)p[A_B];
    uint8_t* o = (uint8_t*)p[A_OUT];
    for (int64_t i = i0; i < i1; i++) {
        float v = nearbyintf(((float)(a[i] - azp) * sa + (float)(b[i] - bzp) * sb) / so) + zp;
        o[i] = (uint8_t)(int32_t)(v < lo ? lo : v > hi ? hi : v);
    }
}

/* which instruction sets this CPU has: bit 0 AVX2, 1 AVX-VNNI, 2 AVX-512 VNNI, 3 AMX-INT8
   (with the OS's grant of the tile state, AVX-512 VNNI for the epilogue, and a compiler
   that built the AMX kernel) */
int tsr_int8_cpu(void) {
    __builtin_cpu_init();
    int bits = 0;
    if (__builtin_cpu_supports("avx2")) bits |= 1;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("avxvnni")) bits |= 2;
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")) bits |= 4;
#if defined(TSR_AMX)
    if ((bits & 4) && amx_granted()) bits |= 8;
#endif
    return bits;
}
