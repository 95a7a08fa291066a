/* AVX2 direct convolution by counting bit planes, included by binary.c after its direct
   kernels (it uses their plan ``g``, scratch, ``dout`` and thresholds).

   AVX2 has no vector popcount, and its nibble tables (vpshufb) issue on two of the four
   vector pipes. Here the popcount becomes additions of bit planes by carry-save adders of
   vpand, vpxor and vpor, which issue on all four.

   Layout. A plane is one input channel at one tap, pixel-major: bit i of a word is output
   position i of a run of output columns (one row's 64 columns, or for an output width of
   at most 32, ``s`` rows of ``sw`` columns each, sw the width rounded up to a power of
   two), and a ymm holds 4 such words ("slots"), 256 output positions: a band. A weight bit
   is then one bit for the whole vector: the xor with it is a choice. With T the count of
   set input bits over all KH * KW * C planes of a position (shared by every output
   channel), a channel whose weight bits are 1 on the set S1 and 0 on S0 has
       D = sum_{S0} a + sum_{S1} (1 - a) = 2 sum_{S0} a + |S1| - T = T + |S1| - 2 sum_{S1} a
   disagreements, so it adds only the smaller of its two sets (``mode`` 0: S0, 1: S1): at
   most half the planes. The planes are summed by a Harley-Seal tree of full adders (5
   operations each, about one an input plane) into bit-sliced counters, W bit planes.

   Per image, the packed image (planar words of 64 channels a pixel) is transposed into
   the planes' source rows R: 64 x 64 bit transpositions, four image rows in the lanes.
   For a full-width run (s = 1) R holds, per channel and horizontal tap, the input rows
   already shifted by the tap, so a vertical tap is an offset of whole words; for
   narrower images, per channel and tap (s rows are packed into a word at offsets that a
   vertical tap cannot move). Per band, the KH * KW * C plane vectors are first copied into
   an aligned buffer V, in the weights' order (tap-major, then channel), so that the
   counting reads whole cache lines.

   Epilogues. Bit-packed output without a correction compares in bit-slices: D > th is
   2 S - T >= m (m a per-channel constant), i.e. 2 (S + q) + r >= T with q = floor(-m / 2)
   started in the counter, a borrow chain against T; then 64 channels' result vectors are
   transposed (64 x 64, the four slots in the lanes) into the channel-last words. Float
   output, and bit-packed output with zero padding's correction, turn S and T into
   integers (8 x 8 byte interleaves and bit transpositions) and run the integer epilogue.

   The plan ``pl`` (int64, ``tessera.kernels.binary``): KH, KW, dilations, s, sw, J (words a
   row of output when s = 1), JW (words a padded input row), RS (the length of an R row, in
   words), bands, W, the plane count, KHc (1 when s = 1, else KH), Hp rounded up to 4, the
   per-channel table (int64 mode, |S1|, count, start), the index list (int32 byte offsets
   of planes in V) and the words of R. */
enum { PL_KH, PL_KW, PL_DH, PL_DW, PL_S, PL_SW, PL_J, PL_JW, PL_RS, PL_NBAND, PL_W, PL_NP,
       PL_KHC, PL_HP4, PL_CH, PL_IDX, PL_RWORDS };
enum { PW_MAX = 16 };

#define PT __attribute__((target("avx2")))

static const uint64_t pl_masks[6] = {0x00000000FFFFFFFFull, 0x0000FFFF0000FFFFull,
                                     0x00FF00FF00FF00FFull, 0x0F0F0F0F0F0F0F0Full,
                                     0x3333333333333333ull, 0x5555555555555555ull};

/* 64 x 64 bit transposition, four independent ones in the lanes: bit i of lane l of a[k]
   becomes bit k of lane l of a[i] */
PT static void pl_transpose(__m256i* a) {
    int d = 32;
    for (int st = 0; st < 6; st++, d >>= 1) {
        const __m256i m = _mm256_set1_epi64x((long long)pl_masks[st]);
        const __m128i sh = _mm_cvtsi32_si128(d);
        for (int k = 0; k < 64; k++) {
            if (k & d) continue;
            const __m256i t = _mm256_and_si256(
                _mm256_xor_si256(_mm256_srl_epi64(a[k], sh), a[k + d]), m);
            a[k + d] = _mm256_xor_si256(a[k + d], t);
            a[k] = _mm256_xor_si256(a[k], _mm256_sll_epi64(t, sh));
        }
    }
}

/* 64 bits of a padded input row (JW words and a zero one) from bit x0 on */
static inline uint64_t pl_bits(const uint64_t* row, int64_t x0) {
    const int64_t w = x0 >> 6, sh = x0 & 63;
    return sh ? (row[w] >> sh) | (row[w + 1] << (64 - sh)) : row[w];
}

/* The packed image in ``img`` as the planes' source rows R (in the nibble planes' place of
   the scratch; with RW, the transposed rows, after it when the rows need reassembling). */
PT static void planes_prep(const int64_t* g, uint64_t* img) {
    const int64_t* pl = (const int64_t*)g[D_PLN];
    const int64_t Cw = g[D_CW], C = g[D_CIN], Hp = g[D_HP], Wp = g[D_WP];
    const int64_t KH = pl[PL_KH], KW = pl[PL_KW], dh = pl[PL_DH], dw = pl[PL_DW],
                  s = pl[PL_S], sw = pl[PL_SW], J = pl[PL_J], JW = pl[PL_JW],
                  RS = pl[PL_RS], KHc = pl[PL_KHC], Hp4 = pl[PL_HP4];
    uint64_t* R = (uint64_t*)nib_planes(g, img);
    uint64_t* RW = R + pl[PL_RWORDS];
    const int direct = s == 1 && JW == 1;
    __m256i a[64];
    uint64_t buf[4][64] __attribute__((aligned(32)));
    for (int64_t cw = 0; cw < Cw; cw++) {
        const uint64_t* src = img + cw * Hp * Wp;
        const int64_t nc = C - 64 * cw < 64 ? C - 64 * cw : 64;
        for (int64_t y0 = 0; y0 < Hp4; y0 += 4)
            for (int64_t xb = 0; xb < JW; xb++) {
                const int64_t x0 = xb * 64, nx = Wp - x0 < 64 ? Wp - x0 : 64;
                for (int r = 0; r < 4; r++) {
                    int64_t have = 0;
                    if (y0 + r < Hp) {
                        memcpy(buf[r], src + (y0 + r) * Wp + x0, sizeof(uint64_t) * (size_t)nx);
                        have = nx;
                    }
                    memset(buf[r] + have, 0, sizeof(uint64_t) * (size_t)(64 - have));
                }
                /* 4 x 4 blocks of words: a[x] lane r = pixel x of row y0 + r */
                for (int x = 0; x < 64; x += 4) {
                    const __m256i l0 = _mm256_load_si256((const __m256i*)(buf[0] + x));
                    const __m256i l1 = _mm256_load_si256((const __m256i*)(buf[1] + x));
                    const __m256i l2 = _mm256_load_si256((const __m256i*)(buf[2] + x));
                    const __m256i l3 = _mm256_load_si256((const __m256i*)(buf[3] + x));
                    const __m256i t0 = _mm256_unpacklo_epi64(l0, l1);
                    const __m256i t1 = _mm256_unpackhi_epi64(l0, l1);
                    const __m256i t2 = _mm256_unpacklo_epi64(l2, l3);
                    const __m256i t3 = _mm256_unpackhi_epi64(l2, l3);
                    a[x] = _mm256_permute2x128_si256(t0, t2, 0x20);
                    a[x + 1] = _mm256_permute2x128_si256(t1, t3, 0x20);
                    a[x + 2] = _mm256_permute2x128_si256(t0, t2, 0x31);
                    a[x + 3] = _mm256_permute2x128_si256(t1, t3, 0x31);
                }
                pl_transpose(a);   /* a[c] lane r: channel 64 cw + c along row y0 + r */
                for (int64_t c = 0; c < nc; c++) {
                    const int64_t ch = 64 * cw + c;
                    if (direct) {
                        for (int64_t kx = 0; kx < KW; kx++)
                            _mm256_storeu_si256((__m256i*)(R + (ch * KW + kx) * RS + y0),
                                                _mm256_srl_epi64(a[c], _mm_cvtsi64_si128(
                                                    kx * dw)));
                    } else {
                        uint64_t lanes[4] __attribute__((aligned(32)));
                        _mm256_store_si256((__m256i*)lanes, a[c]);
                        for (int r = 0; r < 4; r++)
                            RW[(ch * Hp4 + y0 + r) * (JW + 1) + xb] = lanes[r];
                    }
                }
            }
    }
    if (direct) return;
    for (int64_t c = 0; c < C; c++)
        for (int64_t y = 0; y < Hp4; y++) RW[(c * Hp4 + y) * (JW + 1) + JW] = 0;
    const uint64_t segmask = sw >= 64 ? ~0ull : (1ull << sw) - 1;
    for (int64_t c = 0; c < C; c++)
        for (int64_t kyc = 0; kyc < KHc; kyc++)
            for (int64_t kx = 0; kx < KW; kx++) {
                uint64_t* dst = R + ((c * KHc + kyc) * KW + kx) * RS;
                const uint64_t* rows = RW + c * Hp4 * (JW + 1);
                int64_t u = 0;
                if (s == 1) {
                    for (int64_t y = 0; y < Hp4; y++)
                        for (int64_t j = 0; j < J; j++)
                            dst[u++] = pl_bits(rows + y * (JW + 1), 64 * j + kx * dw);
                } else {
                    for (; u < RS; u++) {
                        uint64_t word = 0;
                        for (int64_t q = 0; q < s; q++) {
                            const int64_t y = u * s + q + kyc * dh;
                            if (y < Hp)
                                word |= (pl_bits(rows + y * (JW + 1), kx * dw) & segmask)
                                        << (q * sw);
                        }
                        dst[u] = word;
                    }
                }
                for (; u < RS; u++) dst[u] = 0;
            }
    (void)KH;
}

/* a full adder: l = a ^ b ^ c, h = majority(a, b, c) */
#define PL_CSA(h, l, a, b, c) do {                                                       \
        const __m256i a_ = (a), b_ = (b), c_ = (c), u_ = _mm256_xor_si256(a_, b_);       \
        h = _mm256_or_si256(_mm256_and_si256(a_, b_), _mm256_and_si256(u_, c_));        \
        l = _mm256_xor_si256(u_, c_);                                                   \
    } while (0)

/* x added at level L of the counter c, whose levels hold one pending input each */
PT static inline void pl_add(__m256i* c, __m256i* p, int* has, int L, int W, __m256i x) {
    for (; L < W; L++) {
        if (!has[L]) {
            p[L] = x;
            has[L] = 1;
            return;
        }
        __m256i h;
        PL_CSA(h, c[L], p[L], x, c[L]);
        has[L] = 0;
        x = h;
    }
}

/* c (W bit planes, two's complement, its initial value) plus the count of the n planes of
   V at byte offsets idx: Harley-Seal blocks of 16 planes, levels 0-3 in registers */
PT static void pl_count(const uint8_t* V, const int32_t* idx, int64_t n, int W, __m256i* c) {
    __m256i p[PW_MAX];
    int has[PW_MAX] = {0};
    __m256i ones = c[0], twos = c[1], fours = c[2], eights = c[3];
    int64_t i = 0;
#define PL_X(k) _mm256_load_si256((const __m256i*)(V + idx[i + (k)]))
    for (; i + 16 <= n; i += 16) {
        __m256i twosA, twosB, foursA, foursB, eightsA, eightsB, sixteens;
        PL_CSA(twosA, ones, PL_X(0), PL_X(1), ones);
        PL_CSA(twosB, ones, PL_X(2), PL_X(3), ones);
        PL_CSA(foursA, twos, twosA, twosB, twos);
        PL_CSA(twosA, ones, PL_X(4), PL_X(5), ones);
        PL_CSA(twosB, ones, PL_X(6), PL_X(7), ones);
        PL_CSA(foursB, twos, twosA, twosB, twos);
        PL_CSA(eightsA, fours, foursA, foursB, fours);
        PL_CSA(twosA, ones, PL_X(8), PL_X(9), ones);
        PL_CSA(twosB, ones, PL_X(10), PL_X(11), ones);
        PL_CSA(foursA, twos, twosA, twosB, twos);
        PL_CSA(twosA, ones, PL_X(12), PL_X(13), ones);
        PL_CSA(twosB, ones, PL_X(14), PL_X(15), ones);
        PL_CSA(foursB, twos, twosA, twosB, twos);
        PL_CSA(eightsB, fours, foursA, foursB, fours);
        PL_CSA(sixteens, eights, eightsA, eightsB, eights);
        pl_add(c, p, has, 4, W, sixteens);
    }
    c[0] = ones;
    c[1] = twos;
    c[2] = fours;
    c[3] = eights;
    for (; i < n; i++) pl_add(c, p, has, 0, W, PL_X(0));
#undef PL_X
    for (int L = 0; L < W; L++)
        if (has[L]) {
            const __m256i h = _mm256_and_si256(c[L], p[L]);
            c[L] = _mm256_xor_si256(c[L], p[L]);
            has[L] = 0;
            pl_add(c, p, has, L + 1, W, h);
        }
}

/* 8 x 8 bit transposition in each 64-bit lane (byte k, bit i -> byte i, bit k) */
PT static inline __m256i pl_t8(__m256i x) {
    __m256i t;
    t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 7)),
                         _mm256_set1_epi64x(0x00AA00AA00AA00AAll));
    x = _mm256_xor_si256(x, _mm256_xor_si256(t, _mm256_slli_epi64(t, 7)));
    t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 14)),
                         _mm256_set1_epi64x(0x0000CCCC0000CCCCll));
    x = _mm256_xor_si256(x, _mm256_xor_si256(t, _mm256_slli_epi64(t, 14)));
    t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 28)),
                         _mm256_set1_epi64x(0x00000000F0F0F0F0ll));
    return _mm256_xor_si256(x, _mm256_xor_si256(t, _mm256_slli_epi64(t, 28)));
}

/* 8 bit planes P as bytes of positions: E[r] holds, in its 64-bit lanes, the bytes e = 2r,
   2r + 1, 2r + 16, 2r + 17 of the planes, transposed: byte i of lane e is the 8 bits of
   position 8 e + i */
PT static inline void pl_bytes(const __m256i* P, __m256i* E) {
    __m256i a[8], b[8];
    for (int k = 0; k < 4; k++) {
        a[2 * k] = _mm256_unpacklo_epi8(P[2 * k], P[2 * k + 1]);
        a[2 * k + 1] = _mm256_unpackhi_epi8(P[2 * k], P[2 * k + 1]);
    }
    for (int h = 0; h < 2; h++) {
        b[4 * h] = _mm256_unpacklo_epi16(a[h], a[2 + h]);
        b[4 * h + 1] = _mm256_unpackhi_epi16(a[h], a[2 + h]);
        b[4 * h + 2] = _mm256_unpacklo_epi16(a[4 + h], a[6 + h]);
        b[4 * h + 3] = _mm256_unpackhi_epi16(a[4 + h], a[6 + h]);
    }
    for (int h = 0; h < 2; h++)
        for (int q = 0; q < 2; q++) {
            E[4 * h + 2 * q] = pl_t8(_mm256_unpacklo_epi32(b[4 * h + q], b[4 * h + 2 + q]));
            E[4 * h + 2 * q + 1] = pl_t8(_mm256_unpackhi_epi32(b[4 * h + q],
                                                               b[4 * h + 2 + q]));
        }
}

/* the bit-sliced counts c (W <= 16 planes, unsigned) as int32 out[256], position order */
PT static void pl_ints(const __m256i* c, int W, int32_t* out) {
    __m256i P[8], E[8], H[8];
    for (int b = 0; b < 8; b++) P[b] = b < W ? c[b] : _mm256_setzero_si256();
    pl_bytes(P, E);
    if (W > 8) {
        for (int b = 0; b < 8; b++) P[b] = b + 8 < W ? c[b + 8] : _mm256_setzero_si256();
        pl_bytes(P, H);
    } else {
        for (int b = 0; b < 8; b++) H[b] = _mm256_setzero_si256();
    }
    for (int r = 0; r < 8; r++) {
        const __m256i lo = _mm256_unpacklo_epi8(E[r], H[r]);   /* 16 r.. and 128 + 16 r.. */
        const __m256i hi = _mm256_unpackhi_epi8(E[r], H[r]);   /* 16 r + 8.. and 136 + 16 r.. */
        _mm256_store_si256((__m256i*)(out + 16 * r),
                           _mm256_cvtepu16_epi32(_mm256_castsi256_si128(lo)));
        _mm256_store_si256((__m256i*)(out + 16 * r + 8),
                           _mm256_cvtepu16_epi32(_mm256_castsi256_si128(hi)));
        _mm256_store_si256((__m256i*)(out + 128 + 16 * r),
                           _mm256_cvtepu16_epi32(_mm256_extracti128_si256(lo, 1)));
        _mm256_store_si256((__m256i*)(out + 136 + 16 * r),
                           _mm256_cvtepu16_epi32(_mm256_extracti128_si256(hi, 1)));
    }
}

/* the output pixel of each position of a band (slots 4 band.. 4 band + 3), or -1 (past the
   output), and per 8 positions how many from the first are consecutive pixels with none
   after them (pix[256..]; -1: pixels of several rows) */
static void pl_pixels(const int64_t* g, const int64_t* pl, int64_t band, int32_t* pix) {
    const int64_t OH = g[D_OH], OW = g[D_OW], s = pl[PL_S], sw = pl[PL_SW], J = pl[PL_J];
    for (int64_t j = 0; j < 4; j++) {   /* one division a slot: sw is a power of two */
        const int64_t u = 4 * band + j, uy = u / J, ux = (u - uy * J) * 64;
        const int lsw = __builtin_ctzll((unsigned long long)sw);
        for (int64_t i = 0; i < 64; i++) {
            const int64_t oy = s == 1 ? uy : u * s + (i >> lsw);
            const int64_t ox = s == 1 ? ux + i : i & (sw - 1);
            pix[64 * j + i] = oy < OH && ox < OW ? (int32_t)(oy * OW + ox) : -1;
        }
    }
    for (int e = 0; e < 32; e++) {
        const int32_t* px = pix + 8 * e;
        int nv = 0;
        if (px[0] >= 0)
            for (nv = 1; nv < 8 && px[nv] == px[0] + nv; nv++) continue;
        for (int l = nv; l < 8; l++)
            if (px[l] >= 0) nv = -1;   /* positions of several rows: one at a time */
        pix[256 + e] = nv;
    }
}

/* bit-packed output: the 64 channels [G, G + 64)'s result vectors rows (those of channels
   outside [lo, hi) zero) transposed and stored as bytes lo..hi of each position's word */
PT static void pl_store_bits(const int64_t* g, const dout* o, const int32_t* pixels,
                             int64_t G, int64_t lo, int64_t hi, __m256i* rows) {
    pl_transpose(rows);
    const int64_t cwo = (g[D_O] + 63) / 64, b0 = (lo - G) / 8, b1 = (hi - G + 7) / 8;
    uint64_t w[64][4] __attribute__((aligned(32)));
    for (int i = 0; i < 64; i++) _mm256_store_si256((__m256i*)w[i], rows[i]);
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 64; i++) {
            const int64_t pix = pixels[64 * j + i];
            if (pix < 0) continue;
            uint8_t* d = (uint8_t*)o->out + (pix * cwo + G / 64) * 8;
            if (b0 == 0 && b1 == 8) memcpy(d, &w[i][j], 8);
            else memcpy(d + b0, (const uint8_t*)&w[i][j] + b0, (size_t)(b1 - b0));
        }
}

/* the bit-sliced epilogue: (2 S' + r >= T) and S' >= 0, S' the counter started at q */
PT static inline __m256i pl_compare(const __m256i* c, const __m256i* t, int W, int r) {
    __m256i b = r ? _mm256_setzero_si256() : t[0];
    for (int i = 1; i < W; i++) {
        const __m256i a = c[i - 1];
        if (i < W - 1)
            b = _mm256_or_si256(_mm256_andnot_si256(a, t[i]),
                                _mm256_andnot_si256(_mm256_xor_si256(a, t[i]), b));
        else
            b = _mm256_andnot_si256(a, b);
    }
    return _mm256_andnot_si256(_mm256_or_si256(c[W - 1], b), _mm256_set1_epi32(-1));
}

static const int32_t pl_lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

/* the integer epilogue of channel n on a band: D = 2 S + n1 - T (mode 0) or T + n1 - 2 S,
   float32(kbits - 2 D + corr) * scale, or with thresholds the bits (2 D - corr > th) xor
   flip into ``row`` */
PT static void pl_int_epilogue(const int64_t* g, const int64_t* pl, const dout* o, int64_t n,
                               const int32_t* pixels, const int32_t* S, const int32_t* T,
                               __m256i* row) {
    const int64_t* ch = (const int64_t*)pl[PL_CH] + 4 * n;
    const int32_t* corr = (const int32_t*)g[D_CORR];
    const int64_t ohw = g[D_OH] * g[D_OW];
    const int mode = (int)ch[0];
    const __m256i n1 = _mm256_set1_epi32((int32_t)ch[1]);
    const __m256i kb = _mm256_set1_epi32((int32_t)g[D_KBITS]);
    const float sc = o->scale ? o->scale[n] : 1.0f;
    const __m256 vs = _mm256_set1_ps(sc);
    uint8_t bits[32] __attribute__((aligned(32)));
    const __m256i th = _mm256_set1_epi32(o->th ? (int32_t)(o->th[n] > INT32_MAX ? INT32_MAX
                                         : o->th[n] < INT32_MIN ? INT32_MIN : o->th[n]) : 0);
    for (int e = 0; e < 32; e++) {
        const __m256i sv = _mm256_load_si256((const __m256i*)(S + 8 * e));
        const __m256i tv = _mm256_load_si256((const __m256i*)(T + 8 * e));
        const __m256i x = _mm256_sub_epi32(_mm256_add_epi32(sv, sv), tv);
        const __m256i D = mode ? _mm256_sub_epi32(n1, x) : _mm256_add_epi32(n1, x);
        const int32_t* px = pixels + 8 * e;
        if (o->th) {
            __m256i d2 = _mm256_add_epi32(D, D);
            if (corr) {
                int32_t cv[8];
                for (int l = 0; l < 8; l++) cv[l] = px[l] < 0 ? 0 : corr[n * ohw + px[l]];
                d2 = _mm256_sub_epi32(d2, _mm256_loadu_si256((const __m256i*)cv));
            }
            bits[e] = (uint8_t)_mm256_movemask_ps(_mm256_castsi256_ps(
                _mm256_cmpgt_epi32(d2, th)));
            continue;
        }
        const __m256i dot = _mm256_sub_epi32(kb, _mm256_add_epi32(D, D));
        float* out = (float*)o->out + n * ohw;
        const int nv = pixels[256 + e];
        if (nv == 0) continue;
        if (nv > 0) {   /* nv positions of one output row, then none */
            const int64_t pix = px[0];
            const __m256i m = _mm256_loadu_si256((const __m256i*)(pl_lanes + 8 - nv));
            __m256i d = dot;
            if (corr)
                d = _mm256_add_epi32(d, _mm256_maskload_epi32(corr + n * ohw + pix, m));
            __m256 f = _mm256_cvtepi32_ps(d);
            if (o->scale) f = _mm256_mul_ps(f, vs);
            _mm256_maskstore_ps(out + pix, m, f);
        } else {
            int32_t dv[8];
            _mm256_storeu_si256((__m256i*)dv, dot);
            for (int l = 0; l < 8; l++) {
                if (px[l] < 0) continue;
                float f = (float)(dv[l] + (corr ? corr[n * ohw + px[l]] : 0));
                if (o->scale) f *= sc;
                out[px[l]] = f;
            }
        }
    }
    if (o->th) {
        const int flip = (o->flip[n / 8] >> (n % 8)) & 1;
        *row = _mm256_xor_si256(_mm256_load_si256((const __m256i*)bits),
                                _mm256_set1_epi32(flip ? -1 : 0));
    }
}

/* Output channels [n0, n1) of one image on the planes prepared by planes_prep. */
PT static void planes_avx2(const int64_t* g, uint64_t* img, const dout* o, int64_t n0,
                           int64_t n1) {
    const int64_t* pl = (const int64_t*)g[D_PLN];
    const int64_t C = g[D_CIN], KW = pl[PL_KW], dh = pl[PL_DH], J = pl[PL_J],
                  RS = pl[PL_RS], KHc = pl[PL_KHC], NP = pl[PL_NP], s = pl[PL_S];
    const int W = (int)pl[PL_W];
    const int64_t* chan = (const int64_t*)pl[PL_CH];
    const int32_t* idx = (const int32_t*)pl[PL_IDX];
    const uint64_t* R = (const uint64_t*)nib_planes(g, img);
    const int bitsin = o->th && !g[D_CORR];   /* compare in bit-slices */
    const size_t vbytes = (size_t)NP * 32, bytes = vbytes + (size_t)NP * 12 + 2048;
    uint8_t* mem = (uint8_t*)aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!mem) return;
    uint8_t* V = mem;
    int64_t* base = (int64_t*)(mem + vbytes);
    int32_t* all = (int32_t*)(base + NP);
    int32_t Si[256] __attribute__((aligned(32))), Ti[256] __attribute__((aligned(32)));
    int32_t pixels[256 + 32];
    __m256i rows[64];
    for (int64_t p = 0; p < NP; p++) {
        const int64_t c = p % C, tap = p / C, ky = tap / KW, kx = tap % KW;
        base[p] = s == 1 ? (c * KW + kx) * RS + ky * dh * J : ((c * KHc + ky) * KW + kx) * RS;
        all[p] = (int32_t)(32 * p);
    }
    const __m256i ones = _mm256_set1_epi32(-1), zero = _mm256_setzero_si256();
    for (int64_t band = 0; band < pl[PL_NBAND]; band++) {
        for (int64_t p = 0; p < NP; p++)
            _mm256_store_si256((__m256i*)(V + 32 * p),
                               _mm256_loadu_si256((const __m256i*)(R + base[p] + 4 * band)));
        pl_pixels(g, pl, band, pixels);
        __m256i t[PW_MAX];
        for (int L = 0; L < W; L++) t[L] = zero;
        pl_count(V, all, NP, W, t);
        if (!bitsin) pl_ints(t, W, Ti);
        for (int64_t G = n0 / 64 * 64; G < n1; G += 64) {
            const int64_t lo = G > n0 ? G : n0, hi = G + 64 < n1 ? G + 64 : n1;
            if (o->th)
                for (int k = 0; k < 64; k++) rows[k] = zero;
            for (int64_t n = lo; n < hi; n++) {
                const int64_t* ch = chan + 4 * n;
                __m256i c[PW_MAX];
                if (!bitsin) {
                    for (int L = 0; L < W; L++) c[L] = zero;
                    pl_count(V, idx + ch[3], ch[2], W, c);
                    pl_ints(c, W, Si);
                    pl_int_epilogue(g, pl, o, n, pixels, Si, Ti, &rows[n - G]);
                    continue;
                }
                /* D > th  <=>  2 S - T >= m, the result flipped for mode 1 */
                const int64_t th = o->th[n];
                const int64_t m = ch[0] ? ch[1] - th : th - ch[1] + 1;
                const int f = ((o->flip[n / 8] >> (n % 8)) & 1) ^ (int)ch[0];
                __m256i res;
                if (m <= -NP) {
                    res = ones;
                } else if (m > NP) {
                    res = zero;
                } else {
                    const int64_t q = -m >= 0 ? -m / 2 : -((m + 1) / 2);   /* floor(-m / 2) */
                    const int r = (int)(-m - 2 * q);
                    for (int L = 0; L < W; L++) c[L] = (q >> L) & 1 ? ones : zero;
                    pl_count(V, idx + ch[3], ch[2], W, c);
                    res = pl_compare(c, t, W, r);
                }
                rows[n - G] = f ? _mm256_xor_si256(res, ones) : res;
            }
            if (o->th) pl_store_bits(g, o, pixels, G, lo, hi, rows);
        }
    }
    free(mem);
}
