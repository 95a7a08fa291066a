/* See tsr_runtime.h. */
#define _POSIX_C_SOURCE 200809L  /* posix_memalign under -std=c11 */
#include "tsr_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t tsr_checksum(const void* data, size_t n) {
    /* sum of (w_i ^ i K) (2i + 1) over 8-byte words, zero-padded, plus n: the factors are
       odd, so any flipped bit changes it; NumPy computes the same when the file is written */
    const unsigned char* p = (const unsigned char*)data;
    uint64_t h = (uint64_t)n, i = 0;
    for (size_t at = 0; at < n; at += 8, i++) {
        uint64_t w = 0;
        memcpy(&w, p + at, n - at < 8 ? n - at : 8);
        h += (w ^ (i * 0x9E3779B97F4A7C15ull)) * (2 * i + 1);
    }
    return h;
}

void* tsr_aligned_alloc(size_t n) {
    void* p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
    return p;
}

void tsr_aligned_free(void* p) { free(p); }

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
    void* buf = NULL;
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
    if (payload_bytes && fread(buf, 1, payload_bytes, f) != payload_bytes) {
        snprintf(err, errlen, "weights file '%s' is truncated (payload shorter than %llu "
                 "bytes)", path, (unsigned long long)payload_bytes);
        goto fail;
    }
    if (fgetc(f) != EOF) {
        snprintf(err, errlen, "weights file '%s' is longer than its header says", path);
        goto fail;
    }
    if (tsr_checksum(buf, payload_bytes) != h.checksum) {
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
