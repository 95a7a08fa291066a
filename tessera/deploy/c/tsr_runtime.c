/* See tsr_runtime.h. */
#define _GNU_SOURCE  /* posix_memalign, and mmap's MAP_ANONYMOUS and MADV_HUGEPAGE on Linux */
#include "tsr_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

/* the checksum's words [i, i + n) of p, added to h */
static uint64_t checksum_words(uint64_t h, uint64_t i, const unsigned char* p, size_t n) {
    for (size_t k = 0; k < n; k++, i++) {
        uint64_t w;
        memcpy(&w, p + 8 * k, 8);   /* a fixed size: one load, not a call */
        h += (w ^ (i * 0x9E3779B97F4A7C15ull)) * (2 * i + 1);
    }
    return h;
}

/* the last, partial word (zero-padded) */
static uint64_t checksum_tail(uint64_t h, uint64_t i, const unsigned char* p, size_t n) {
    uint64_t w = 0;
    if (!n) return h;
    memcpy(&w, p, n);
    return h + (w ^ (i * 0x9E3779B97F4A7C15ull)) * (2 * i + 1);
}

uint64_t tsr_checksum(const void* data, size_t n) {
    /* sum of (w_i ^ i K) (2i + 1) over 8-byte words, zero-padded, plus n: the factors are
       odd, so any flipped bit changes it; NumPy computes the same when the file is written */
    const unsigned char* p = (const unsigned char*)data;
    uint64_t h = checksum_words((uint64_t)n, 0, p, n / 8);
    return checksum_tail(h, n / 8, p + n / 8 * 8, n % 8);
}

/* Every buffer of a model (weights, packed panels, arena) is 64-byte aligned and carries
   its origin in the 64 bytes before it. Large ones (2 MB and up) are anonymous mappings on
   2 MB boundaries with transparent huge pages requested: 512x fewer page faults when the
   weights are read (ResNet-18's 47 MB: 4x faster to load) and a faster unmap at free. */
enum { HEAD = 64, HUGE_PAGE = 2 << 20 };
typedef struct { void* base; size_t len; int mapped; } alloc_head;

void* tsr_aligned_alloc(size_t n) {
    unsigned char* p = NULL;
#ifdef __linux__
    if (n >= HUGE_PAGE) {
        size_t len = n + HEAD + HUGE_PAGE;
        void* base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                          -1, 0);
        if (base == MAP_FAILED) return NULL;
        uintptr_t at = ((uintptr_t)base + HEAD + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
        p = (unsigned char*)at;
#ifdef MADV_HUGEPAGE
        madvise(p, (n + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
        alloc_head h = {base, len, 1};
        memcpy(p - HEAD, &h, sizeof h);
        return p;
    }
#endif
    void* raw = NULL;
    if (posix_memalign(&raw, 64, n + HEAD) != 0) return NULL;
    p = (unsigned char*)raw + HEAD;
    alloc_head h = {raw, n + HEAD, 0};
    memcpy(p - HEAD, &h, sizeof h);
    return p;
}

void tsr_aligned_free(void* p) {
    if (!p) return;
    alloc_head h;
    memcpy(&h, (unsigned char*)p - HEAD, sizeof h);
#ifdef __linux__
    if (h.mapped) {
        munmap(h.base, h.len);
        return;
    }
#endif
    free(h.base);
}

void* tsr_read_weights(const char* path, uint64_t fingerprint, uint64_t payload_bytes,
                       char* err, size_t errlen) {
    if (!path) {
        snprintf(err, errlen, "weights path is NULL");
        return NULL;
    }
    FILE* f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open weights file '%s' (missing or unreadable)", path);
        return NULL;
    }
    tsr_weights_header h;
    unsigned char* buf = NULL;
    if (fread(&h, sizeof h, 1, f) != 1) {
        snprintf(err, errlen, "weights file '%s' is truncated (no complete header)", path);
        goto fail;
    }
    if (memcmp(h.magic, "TSRWGT1", 8) != 0) {
        snprintf(err, errlen, "'%s' is not a tessera weights file (bad magic)", path);
        goto fail;
    }
    if (h.fingerprint != fingerprint) {
        snprintf(err, errlen, "weights file '%s' belongs to another model (fingerprint "
                 "%016llx, this model's is %016llx)", path, (unsigned long long)h.fingerprint,
                 (unsigned long long)fingerprint);
        goto fail;
    }
    if (h.payload_bytes != payload_bytes) {
        snprintf(err, errlen, "weights file '%s' declares %llu payload bytes, this model "
                 "needs %llu", path, (unsigned long long)h.payload_bytes,
                 (unsigned long long)payload_bytes);
        goto fail;
    }
    buf = tsr_aligned_alloc(payload_bytes);
    if (!buf) {
        snprintf(err, errlen, "out of memory reading %llu bytes of weights",
                 (unsigned long long)payload_bytes);
        goto fail;
    }
    /* read and checksum a chunk at a time, so that the checksum reads from the cache */
    enum { CHUNK = 256 << 10 };   /* a multiple of 8: whole words until the last chunk */
    uint64_t sum = payload_bytes;
    for (uint64_t at = 0; at < payload_bytes; at += CHUNK) {
        size_t n = payload_bytes - at < CHUNK ? (size_t)(payload_bytes - at) : CHUNK;
        if (fread(buf + at, 1, n, f) != n) {
            snprintf(err, errlen, "weights file '%s' is truncated (payload shorter than %llu "
                     "bytes)", path, (unsigned long long)payload_bytes);
            goto fail;
        }
        sum = checksum_words(sum, at / 8, buf + at, n / 8);
        sum = checksum_tail(sum, at / 8 + n / 8, buf + at + n / 8 * 8, n % 8);
    }
    if (fgetc(f) != EOF) {
        snprintf(err, errlen, "weights file '%s' is longer than its header says", path);
        goto fail;
    }
    if (sum != h.checksum) {
        snprintf(err, errlen, "weights file '%s' is corrupt (checksum mismatch)", path);
        goto fail;
    }
    fclose(f);
    return buf;
fail:
    tsr_aligned_free(buf);
    fclose(f);
    return NULL;
}

void tsr_strided_copy(void* y, const void* x, int ndim, const int64_t* shape,
                      const int64_t* strides, int64_t offset, int64_t size) {
    int64_t idx[8] = {0}, total = 1;
    for (int d = 0; d < ndim; d++) total *= shape[d];
    char* dst = (char*)y;
    const char* src = (const char*)x;
    int64_t inner = ndim ? shape[ndim - 1] : 1, step = ndim ? strides[ndim - 1] : 0;
    for (int64_t done = 0; done < total; done += inner) {
        int64_t at = offset;
        for (int d = 0; d + 1 < ndim; d++) at += idx[d] * strides[d];
        if (step == 1) {
            memcpy(dst, src + at * size, (size_t)(inner * size));
        } else {
            for (int64_t j = 0; j < inner; j++)
                memcpy(dst + j * size, src + (at + j * step) * size, (size_t)size);
        }
        dst += inner * size;
        for (int d = ndim - 2; d >= 0; d--) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
    }
}

void tsr_adaptive_avg(const float* x, float* y, int64_t planes, int64_t H, int64_t W,
                      int64_t OH, int64_t OW) {
    for (int64_t p = 0; p < planes; p++) {
        const float* xp = x + p * H * W;
        for (int64_t i = 0; i < OH; i++) {
            int64_t h0 = i * H / OH, h1 = ((i + 1) * H + OH - 1) / OH;
            for (int64_t j = 0; j < OW; j++) {
                int64_t w0 = j * W / OW, w1 = ((j + 1) * W + OW - 1) / OW;
                float s = 0;
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) s += xp[h * W + w];
                y[(p * OH + i) * OW + j] = s / (float)((h1 - h0) * (w1 - w0));
            }
        }
    }
}

int64_t tsr_gather_rows(const float* table, int64_t rows, int64_t width, const int64_t* ids,
                        int64_t n, float* y) {
    for (int64_t i = 0; i < n; i++) {
        int64_t r = ids[i];
        if (r < 0 || r >= rows) return i + 1;
        memcpy(y + i * width, table + r * width, (size_t)width * sizeof(float));
    }
    return 0;
}

void tsr_add_row_bias(float* y, const float* b, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        float br = b[r], *yr = y + r * cols;
        for (int64_t c = 0; c < cols; c++) yr[c] += br;
    }
}
