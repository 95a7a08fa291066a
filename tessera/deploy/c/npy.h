/* Reading and writing .npy files (version 1.0, little-endian '<f4' and '<i8', C order): the
   driver's input and output format. */
#ifndef TSR_NPY_H
#define TSR_NPY_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the array in path: its data (malloc'd), element kind 'f' (float32) or 'i' (int64), dims
   and rank; NULL with a message in err */
static void* npy_read(const char* path, char* kind, int64_t* dims, int* rank, char* err,
                      size_t errlen) {
    FILE* f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "cannot open %s", path); return NULL; }
    unsigned char pre[10];
    void* data = NULL;
    char hdr[4096];
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0 || pre[6] != 1) {
        snprintf(err, errlen, "%s: not a version 1.0 .npy file", path);
        goto fail;
    }
    size_t hl = (size_t)pre[8] | ((size_t)pre[9] << 8);
    if (hl >= sizeof hdr || fread(hdr, 1, hl, f) != hl) {
        snprintf(err, errlen, "%s: bad header", path);
        goto fail;
    }
    hdr[hl] = 0;
    if (strstr(hdr, "'fortran_order': True")) {
        snprintf(err, errlen, "%s: Fortran order", path);
        goto fail;
    }
    if (strstr(hdr, "'<f4'")) *kind = 'f';
    else if (strstr(hdr, "'<i8'")) *kind = 'i';
    else { snprintf(err, errlen, "%s: dtype is not <f4 or <i8", path); goto fail; }
    const char* s = strstr(hdr, "'shape': (");
    if (!s) { snprintf(err, errlen, "%s: no shape", path); goto fail; }
    s += 10;
    int r = 0;
    int64_t count = 1;
    while (*s && *s != ')' && r < 8) {
        char* e;
        long long d = strtoll(s, &e, 10);
        if (e == s) break;
        dims[r++] = d;
        count *= d;
        s = e;
        while (*s == ',' || *s == ' ') s++;
    }
    *rank = r;
    size_t bytes = (size_t)count * (*kind == 'f' ? 4 : 8);
    data = malloc(bytes ? bytes : 1);
    if (!data || fread(data, 1, bytes, f) != bytes) {
        snprintf(err, errlen, "%s: truncated data", path);
        goto fail;
    }
    fclose(f);
    return data;
fail:
    free(data);
    fclose(f);
    return NULL;
}

/* data (kind 'f': float32, 'i': int64) as a .npy file: 0, or -1 */
static int npy_write(const char* path, const void* data, char kind, const int64_t* dims,
                     int rank) {
    char shape[256] = "", hdr[512];
    int64_t count = 1;
    for (int d = 0; d < rank; d++) {
        char one[32];
        snprintf(one, sizeof one, "%lld%s", (long long)dims[d], rank == 1 ? "," : d + 1 < rank ? ", " : "");
        strcat(shape, one);
        count *= dims[d];
    }
    int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     kind == 'i' ? "<i8" : "<f4", shape);
    int total = 10 + n + 1, pad = (64 - total % 64) % 64;
    FILE* f = fopen(path, "wb");
    if (!f) return -1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
    int hl = n + pad + 1;
    pre[8] = (unsigned char)(hl & 0xff);
    pre[9] = (unsigned char)(hl >> 8);
    fwrite(pre, 1, 10, f);
    fwrite(hdr, 1, (size_t)n, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    size_t wrote = fwrite(data, kind == 'i' ? 8 : 4, (size_t)count, f);
    return fclose(f) == 0 && wrote == (size_t)count ? 0 : -1;
}

#endif
