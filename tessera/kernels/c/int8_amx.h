/* INT8 GEMM on AMX tiles (Sapphire Rapids and later): tdpbusd, u8 x s8 -> s32, included by
   int8.c after its other paths (it uses their parameters, epilogue and q16).

   The packed weights are already the layout tiles take: a column block's [K/4][16][4]
   bytes are K/4 rows of 64 bytes, each row one group of 4 k for the 16 columns, i.e. B in
   the 4-byte-interleaved (VNNI) form tdpbusd multiplies. So a B tile is 16 of those rows
   (64 k), loaded with a stride of 64 bytes, and nothing is re-packed.

   The tiles (palette 1: 8 tiles of at most 16 rows x 64 bytes), one configuration per
   height of the row tiles (16, and the last rows of the part):
     tmm0, tmm1  C: int32 sums of 16 rows x 2 column blocks (16 x 16 each)
     tmm2        A: 16 rows x 64 k                tmm3  A's K tail: rows x 4 * (K/4 % 16)
     tmm4, tmm5  B: 64 k x the two blocks          tmm6, tmm7  B's K tail: K/4 % 16 rows
   so that no row of A or B past the operands is ever read: the edge tiles are tiles of
   their own size, not padded copies. The sums go to memory (tilestored) and through the
   requantization the other paths use: q16 (AVX-512, which every AMX CPU has) on
   row-major integer outputs of whole column blocks, epilogue() otherwise.

   The tile instructions are the TILE_* macros below: the intrinsics, or, built with
   -DTSR_INT8_AMX_EMULATE, a plain C model of the same instructions (the SDM's pseudocode
   for LDTILECFG, TILELOADD, TILESTORED, TILEZERO and TDPBUSD, faulting where they fault)
   that runs the same kernel on a CPU without AMX, as tsr_int8_gemm_amx_emulated: the
   tests' way of checking the tiling, edges and epilogue bit for bit. */

/* the compilers that know AMX's intrinsics and target names (GCC 11, Clang 12), on
   Linux, where the kernel hands the tile state out on request */
#if !defined(TSR_NO_AMX) && defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define TSR_AMX 1
#endif

#if defined(TSR_AMX)
#include <cpuid.h>
#include <sys/syscall.h>
/* (declared here: unistd.h declares it only with _DEFAULT_SOURCE, which -std=c11 drops) */
extern long syscall(long number, ...);
#ifndef SYS_arch_prctl
#define SYS_arch_prctl 158
#endif
enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

/* Whether tile instructions may run: the CPU has AMX-TILE and AMX-INT8 (CPUID.7.0:EDX bits
   24, 25), the OS saves their state (OSXSAVE, then XCR0 bits 17 XTILECFG and 18
   XTILEDATA), and Linux granted this process the tile data (arch_prctl, asked once: the
   grant is the process's, for every thread). */
static int amx_granted(void) {
    static int known = -1;
    int k = __atomic_load_n(&known, __ATOMIC_ACQUIRE);
    if (k >= 0) return k;
    unsigned a, b, c, d;
    k = 0;
    if (__get_cpuid_max(0, 0) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        const int tiles = (d >> 24 & 1) && (d >> 25 & 1);
        __cpuid(1, a, b, c, d);
        if (tiles && (c >> 27 & 1)) {
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            (void)hi;
            if ((lo & (3u << 17)) == (3u << 17))
                k = syscall(SYS_arch_prctl, (long)ARCH_REQ_XCOMP_PERM,
                            (long)XFEATURE_XTILEDATA) == 0;
        }
    }
    __atomic_store_n(&known, k, __ATOMIC_RELEASE);
    return k;
}
#endif

/* the 64 bytes LDTILECFG reads */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

#if defined(TSR_INT8_AMX_EMULATE)
#include <stdio.h>
/* The tile state of this thread, as the SDM describes it: 8 tiles of 16 rows x 64 bytes,
   each with the rows and bytes per row of the loaded configuration. */
static _Thread_local struct {
    int valid;
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t t[8][16][64];
} amx_emu;

static void amx_fault(const char* insn, const char* why) {
    /* where the instruction raises #GP or #UD: stop, as the process would */
    fprintf(stderr, "int8_amx emulation: %s: %s\n", insn, why);
    abort();
}

static void emu_ldtilecfg(const amx_config* cfg) {
    if (cfg->palette == 0) { memset(&amx_emu, 0, sizeof amx_emu); return; }
    if (cfg->palette != 1) amx_fault("ldtilecfg", "palette other than 0 or 1");
    for (int i = 0; i < 14; i++)
        if (cfg->reserved[i]) amx_fault("ldtilecfg", "reserved byte set");
    for (int t = 8; t < 16; t++)
        if (cfg->colsb[t] || cfg->rows[t]) amx_fault("ldtilecfg", "tile past palette 1's 8");
    if (cfg->start_row) amx_fault("ldtilecfg", "start_row (an interrupted load) set");
    for (int t = 0; t < 8; t++) {
        if (cfg->rows[t] > 16 || cfg->colsb[t] > 64)
            amx_fault("ldtilecfg", "a tile larger than 16 rows x 64 bytes");
        if ((cfg->rows[t] == 0) != (cfg->colsb[t] == 0))
            amx_fault("ldtilecfg", "rows and bytes per row not both zero or both set");
        amx_emu.rows[t] = cfg->rows[t];
        amx_emu.colsb[t] = cfg->colsb[t];
    }
    memset(amx_emu.t, 0, sizeof amx_emu.t);   /* a configuration zeroes every tile */
    amx_emu.valid = 1;
}

static void emu_check(const char* insn, int t) {
    if (!amx_emu.valid) amx_fault(insn, "no tile configuration loaded");
    if (t < 0 || t > 7 || amx_emu.rows[t] == 0) amx_fault(insn, "tile not configured");
}

static void emu_tileloadd(int t, const void* base, int64_t stride) {
    emu_check("tileloadd", t);
    memset(amx_emu.t[t], 0, sizeof amx_emu.t[t]);   /* bytes past rows x colsb are zero */
    for (int r = 0; r < amx_emu.rows[t]; r++)
        memcpy(amx_emu.t[t][r], (const uint8_t*)base + r * stride, amx_emu.colsb[t]);
}

static void emu_tilestored(int t, void* base, int64_t stride) {
    emu_check("tilestored", t);
    for (int r = 0; r < amx_emu.rows[t]; r++)
        memcpy((uint8_t*)base + r * stride, amx_emu.t[t][r], amx_emu.colsb[t]);
}

static void emu_tilezero(int t) {
    emu_check("tilezero", t);
    memset(amx_emu.t[t], 0, sizeof amx_emu.t[t]);
}

/* dst.row[m].dword[n] += sum over k < src1.colsb / 4 of the 4 products of src1.row[m]'s
   unsigned bytes 4k .. 4k+3 with src2.row[k]'s signed bytes 4n .. 4n+3, wrapping in 32 bits */
static void emu_tdpbusd(int dst, int src1, int src2) {
    emu_check("tdpbusd", dst);
    emu_check("tdpbusd", src1);
    emu_check("tdpbusd", src2);
    if (dst == src1 || dst == src2 || src1 == src2) amx_fault("tdpbusd", "tiles not distinct");
    const int rows = amx_emu.rows[dst], kd = amx_emu.colsb[src1] / 4,
        nd = amx_emu.colsb[dst] / 4;
    if (amx_emu.colsb[dst] % 4 || amx_emu.colsb[src1] % 4 || amx_emu.rows[src1] != rows ||
        amx_emu.colsb[src2] != amx_emu.colsb[dst] || amx_emu.rows[src2] != kd)
        amx_fault("tdpbusd", "tile shapes do not agree");
    for (int m = 0; m < rows; m++)
        for (int n = 0; n < nd; n++) {
            uint32_t s;
            memcpy(&s, amx_emu.t[dst][m] + 4 * n, 4);
            for (int k = 0; k < kd; k++)
                for (int i = 0; i < 4; i++)
                    s += (uint32_t)((int32_t)amx_emu.t[src1][m][4 * k + i] *
                                    (int32_t)(int8_t)amx_emu.t[src2][k][4 * n + i]);
            memcpy(amx_emu.t[dst][m] + 4 * n, &s, 4);
        }
}

#define TILE_CONFIG(cfg) emu_ldtilecfg(cfg)
#define TILE_LOAD(t, base, stride) emu_tileloadd(t, base, stride)
#define TILE_STORE(t, base, stride) emu_tilestored(t, base, stride)
#define TILE_ZERO(t) emu_tilezero(t)
#define TILE_DPBUSD(c, a, b) emu_tdpbusd(c, a, b)
#define TILE_RELEASE() memset(&amx_emu, 0, sizeof amx_emu)
/* (AVX-512 for q16, as on the CPUs with AMX: the emulation runs where AVX-512 VNNI does) */
#define AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define AMX_BUILT 1

#elif defined(TSR_AMX)
/* (the tile numbers are literal digits: GCC's intrinsics paste them into the assembly. Its
   tileloadd and ldtilecfg tell the compiler of no memory they read, hence the barriers.) */
#define TILE_CONFIG(cfg) do { __asm__ volatile("" ::: "memory"); \
    _tile_loadconfig(cfg); } while (0)
#define TILE_LOAD(t, base, stride) do { __asm__ volatile("" ::: "memory"); \
    _tile_loadd(t, base, stride); } while (0)
#define TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_DPBUSD(c, a, b) _tile_dpbusd(c, a, b)
#define TILE_RELEASE() _tile_release()
#define AMX_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni")))
#define AMX_BUILT 1
#endif

#if defined(AMX_BUILT)
/* tiles of `rows` rows of A, K/4 % 16 = kt groups in the K tail */
static void amx_configure(amx_config* cfg, int rows, int kt) {
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int t = 0; t < 6; t++) {                  /* C0, C1, A, A tail, B0, B1 */
        cfg->rows[t] = (uint8_t)(t < 4 ? rows : 16);
        cfg->colsb[t] = 64;
    }
    cfg->colsb[3] = (uint16_t)(4 * kt);
    cfg->rows[6] = cfg->rows[7] = (uint8_t)kt;     /* B tails */
    cfg->colsb[6] = cfg->colsb[7] = (uint16_t)(kt ? 64 : 0);
    if (!kt) cfg->rows[3] = 0;
}

/* The int32 sums of A's rows (as configured) times one or two column blocks of packed
   weights B0, B1 (kq groups of 4 k each), into c0, c1 (16 int32 a row). */
AMX_TARGET static void amx_sums(const uint8_t* A, int64_t lda, const int8_t* B0,
                                const int8_t* B1, int64_t kq, int two, int32_t* c0,
                                int32_t* c1) {
    const int64_t kf = kq / 16;
    TILE_ZERO(0);
    if (two) {
        TILE_ZERO(1);
        for (int64_t g = 0; g < kf; g++) {
            TILE_LOAD(2, A + g * 64, lda);
            TILE_LOAD(4, B0 + g * 1024, 64);
            TILE_LOAD(5, B1 + g * 1024, 64);
            TILE_DPBUSD(0, 2, 4);
            TILE_DPBUSD(1, 2, 5);
        }
    } else {
        for (int64_t g = 0; g < kf; g++) {
            TILE_LOAD(2, A + g * 64, lda);
            TILE_LOAD(4, B0 + g * 1024, 64);
            TILE_DPBUSD(0, 2, 4);
        }
    }
    if (kq % 16) {
        TILE_LOAD(3, A + kf * 64, lda);
        TILE_LOAD(6, B0 + kf * 1024, 64);
        TILE_DPBUSD(0, 3, 6);
        if (two) {
            TILE_LOAD(7, B1 + kf * 1024, 64);
            TILE_DPBUSD(1, 3, 7);
        }
    }
    TILE_STORE(0, c0, 64);
    if (two) TILE_STORE(1, c1, 64);
}

/* the requantization of `rows` rows of sums of column block nb: on the registers for
   row-major integers of a whole block, else epilogue() (8 rows a call) */
AMX_TARGET static void amx_requant(const int64_t* p, int64_t m, int rows, int64_t nb,
                                   const int32_t* c) {
    const int64_t n0 = nb * 16;
    if (p[P_MODE] == 2 || p[P_PIX] != 0 || n0 + 16 > p[P_N]) {
        for (int r = 0; r < rows; r += MR)
            epilogue(p, m + r, rows - r < MR ? rows - r : MR, nb, c + r * 16);
        return;
    }
    const int32_t azp = (int32_t)p[P_AZP], zpi = (int32_t)p[P_ZP];
    const int32_t* colsum = (const int32_t*)p[P_COLSUM] + n0;
    const int32_t* bias = p[P_BIAS] ? (const int32_t*)p[P_BIAS] + n0 : 0;
    int32_t off[16];
    for (int j = 0; j < 16; j++)
        off[j] = (int32_t)((uint32_t)(azp * colsum[j]) - (uint32_t)(bias ? bias[j] : 0));
    const __m512i o = _mm512_loadu_si512((const void*)off), zp = _mm512_set1_epi32(zpi);
    const __m512 mu = _mm512_loadu_ps((const float*)p[P_MULT] + n0),
        lo = _mm512_set1_ps((float)(p[P_LO] - zpi)), hi = _mm512_set1_ps((float)(p[P_HI] - zpi));
    const int64_t ldc = p[P_LDC];
    uint8_t* out = (uint8_t*)p[P_C] + m * ldc + p[P_NOFF] + n0;
    for (int r = 0; r < rows; r++)
        q16(_mm512_loadu_si512((const void*)(c + r * 16)), o, mu, lo, hi, zp, out + r * ldc);
}

/* rows [m0, m1) (a multiple of `rows` apart) by column blocks [nb0, nb1), two blocks at a
   time, under one configuration */
AMX_TARGET static void amx_rows(const int64_t* p, int64_t m0, int64_t m1, int rows,
                                int64_t nb0, int64_t nb1) {
    int32_t c0[256] __attribute__((aligned(64)));
    int32_t c1[256] __attribute__((aligned(64)));
    const int64_t kq = p[P_K] / 4, lda = p[P_LDA];
    const uint8_t* A = (const uint8_t*)p[P_A];
    const int8_t* B = (const int8_t*)p[P_B];
    amx_config cfg;
    amx_configure(&cfg, rows, (int)(kq % 16));
    TILE_CONFIG(&cfg);
    for (int64_t nb = nb0; nb < nb1; nb += 2) {
        const int two = nb + 1 < nb1;
        for (int64_t m = m0; m < m1; m += rows) {
            amx_sums(A + m * lda, lda, B + nb * kq * 64, B + (nb + 1) * kq * 64, kq, two,
                     c0, c1);
            amx_requant(p, m, rows, nb, c0);
            if (two) amx_requant(p, m, rows, nb + 1, c1);
        }
    }
}

AMX_TARGET static void amx_gemm(const int64_t* p, int64_t m0, int64_t m1, int64_t nb0,
                                int64_t nb1) {
    const int64_t mf = m0 + (m1 - m0) / 16 * 16;
    if (mf > m0) amx_rows(p, m0, mf, 16, nb0, nb1);
    if (m1 > mf) amx_rows(p, mf, m1, (int)(m1 - mf), nb0, nb1);
    TILE_RELEASE();
}
#endif

/* The AMX path: where this library was built without AMX (a compiler that lacks it), or a
   caller runs it on a CPU tsr_int8_cpu did not report AMX for, the portable path. */
void tsr_int8_gemm_amx(const int64_t* p, int64_t m0, int64_t m1, int64_t nb0, int64_t nb1) {
#if defined(TSR_AMX) && !defined(TSR_INT8_AMX_EMULATE)
    if (amx_granted()) {
        amx_gemm(p, m0, m1, nb0, nb1);
        return;
    }
#endif
    run(tile_c, 0, 1, p, m0, m1, nb0, nb1);
}

#if defined(TSR_INT8_AMX_EMULATE)
/* the AMX kernel on the emulated tiles (tests only) */
void tsr_int8_gemm_amx_emulated(const int64_t* p, int64_t m0, int64_t m1, int64_t nb0,
                                int64_t nb1) {
    amx_gemm(p, m0, m1, nb0, nb1);
}
#endif

/* whether this library holds the AMX kernel (the compiler knows AMX) */
int tsr_int8_amx_built(void) {
#if defined(TSR_AMX)
    return 1;
#else
    return 0;
#endif
}
