/* run_MODEL: the exported model MODEL on .npy files, and an example of its C API.

   run_MODEL MODEL.weights in0.npy [in1.npy ...] out0.npy [out1.npy ...] [--threads N]
             [--repeat R] [--paths]

   The inputs come first (MODEL_num_inputs() of them), then the outputs. With --repeat R the
   model runs R times after one warm-up run and the median time is printed, with the
   process's CPU time per run (all threads': the latency only at one thread, but it does not
   count time spent waiting for a busy machine's cores). --paths prints the instruction set
   each kernel family ran (MODEL_paths). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "MODEL.h"
#include "npy.h"

static double clock_ms(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static double now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }
static double cpu_ms(void) { return clock_ms(CLOCK_PROCESS_CPUTIME_ID); }

static int cmp(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

int main(int argc, char** argv) {
    int threads = 1, repeat = 0, npaths = 0, show_paths = 0;
    const char* paths[64];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--paths")) show_paths = 1;
        else if (npaths < 64) paths[npaths++] = argv[i];
    }
    int ni = MODEL_num_inputs(), no = MODEL_num_outputs();
    if (npaths != 1 + ni + no) {
        fprintf(stderr, "usage: %s MODEL.weights <%d inputs .npy> <%d outputs .npy> "
                "[--threads N] [--repeat R] [--paths]\n", argv[0], ni, no);
        return 2;
    }
    double t0 = now_ms(), c0 = cpu_ms();
    MODEL_model* m = MODEL_load(paths[0]);
    if (!m) { fprintf(stderr, "%s\n", MODEL_load_error()); return 1; }
    printf("load_ms %.3f\nload_cpu_ms %.3f\n", now_ms() - t0, cpu_ms() - c0);
    if (MODEL_set_num_threads(m, threads)) {
        fprintf(stderr, "%s\n", MODEL_last_error(m));
        MODEL_free(m);
        return 1;
    }
    void* ins[64] = {0};
    float* outs[64] = {0};
    int status = 1;
    char err[512];
    for (int i = 0; i < ni; i++) {
        int64_t dims[8], want[8];
        int rank, wrank = MODEL_input_shape(i, want);
        char kind;
        ins[i] = npy_read(paths[1 + i], &kind, dims, &rank, err, sizeof err);
        if (!ins[i]) { fprintf(stderr, "%s\n", err); goto done; }
        if (rank != wrank || memcmp(dims, want, sizeof(int64_t) * (size_t)rank) != 0) {
            fprintf(stderr, "%s: shape differs from input %d's\n", paths[1 + i], i);
            goto done;
        }
    }
    for (int i = 0; i < no; i++) {
        int64_t dims[8];
        int rank = MODEL_output_shape(i, dims);
        int64_t count = 1;
        for (int d = 0; d < rank; d++) count *= dims[d];
        /* integer outputs are int64_t */
        outs[i] = malloc((MODEL_output_dtype(i) == 1 ? 8 : 4) * (size_t)(count ? count : 1));
        if (!outs[i]) goto done;
    }
    if (MODEL_run(m, (const float* const*)ins, outs)) {
        fprintf(stderr, "%s\n", MODEL_last_error(m));
        goto done;
    }
    if (show_paths) printf("paths %s\n", MODEL_paths(m));
    if (repeat > 0) {
        double* t = malloc(sizeof(double) * (size_t)repeat);
        if (!t) goto done;
        double c = cpu_ms();
        for (int r = 0; r < repeat; r++) {
            double a = now_ms();
            MODEL_run(m, (const float* const*)ins, outs);
            t[r] = now_ms() - a;
        }
        qsort(t, (size_t)repeat, sizeof(double), cmp);
        printf("median_ms %.4f\ncpu_ms %.4f\n", t[repeat / 2], (cpu_ms() - c) / repeat);
        free(t);
    }
    for (int i = 0; i < no; i++) {
        int64_t dims[8];
        int rank = MODEL_output_shape(i, dims);
        if (npy_write(paths[1 + ni + i], outs[i], MODEL_output_dtype(i) == 1 ? 'i' : 'f', dims,
                      rank)) {
            fprintf(stderr, "cannot write %s\n", paths[1 + ni + i]);
            goto done;
        }
    }
    status = 0;
done:
    for (int i = 0; i < ni; i++) free(ins[i]);
    for (int i = 0; i < no; i++) free(outs[i]);
    MODEL_free(m);
    return status;
}
