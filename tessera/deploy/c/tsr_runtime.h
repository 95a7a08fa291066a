/* The runtime of an exported model (tessera/deploy): the weights file, the kernel threads,
   and the few kernels that are not the graph compiler's own (adaptive average pooling,
   gathers, strided copies). Copied into every exported folder; each model's build renames
   these symbols with its own prefix (<name>_rename.h), so two models link into one
   program. */
#ifndef TSR_RUNTIME_H
#define TSR_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

/* the weights file: this header, then the payload (64-byte aligned tensors) */
typedef struct tsr_weights_header {
    char magic[8];            /* "TSRWGT1\0" */
    uint64_t fingerprint;     /* of the model's program: a file fits one model only */
    uint64_t payload_bytes;
    uint64_t checksum;        /* tsr_checksum of the payload */
    uint64_t reserved[4];
} tsr_weights_header;

uint64_t tsr_checksum(const void* data, size_t n);
/* the payload of path into a fresh 64-byte aligned buffer (*out), or NULL with why in err
   (missing, truncated, not a weights file, another model's, corrupt) */
void* tsr_read_weights(const char* path, uint64_t fingerprint, uint64_t payload_bytes,
                       char* err, size_t errlen);
/* n bytes on a 64-byte boundary (huge pages for large ones, where the OS has them); freed
   by tsr_aligned_free only */
void* tsr_aligned_alloc(size_t n);
void tsr_aligned_free(void* p);

/* item(ctx, i) for i in [0, n) on the calling thread and up to threads - 1 workers */
typedef int64_t (*tsr_item_fn)(const int64_t* ctx, int64_t i);
int tsr_pool_start(int threads);
void tsr_pool_run(tsr_item_fn item, const int64_t* ctx, int64_t n, int threads);

/* y[i] = x[offset + sum_d idx_d * strides[d]] over shape (ndim <= 8), elements of size bytes */
void tsr_strided_copy(void* y, const void* x, int ndim, const int64_t* shape,
                      const int64_t* strides, int64_t offset, int64_t size);
/* adaptive average pooling of planes (H, W) -> (OH, OW), as PyTorch's area interpolation */
void tsr_adaptive_avg(const float* x, float* y, int64_t planes, int64_t H, int64_t W,
                      int64_t OH, int64_t OW);
/* rows of table (rows x width) picked by ids: 0, or the position of the first id outside
   [0, rows) plus one */
int64_t tsr_gather_rows(const float* table, int64_t rows, int64_t width, const int64_t* ids,
                        int64_t n, float* y);
/* fused attention (tsr_attention.c): o = softmax(q k^T scale + mask) v for nb (batch x
   heads) entries of L query rows and S keys; entry b of x starts at x + xoff[b], its rows xrs
   apart (unit-stride rows: a head's slice of a wider row reads in place); the mask is
   additive, element (i, j) at mask + moff[b] + i mrs + j mcs, or NULL. o is (nb, L, Ev)
   contiguous, lse (nb, L) each row's log-sum-exp. isa: 0 portable, 1 AVX2, 2 AVX-512 (the
   GEMM's numbering). 0, or non-zero when the kernel's tiles could not be allocated. */
typedef struct tsr_attention_args {
    int64_t nb, L, S, E, Ev;
    const float *q, *k, *v, *mask;
    const int64_t *qoff, *koff, *voff, *moff;
    int64_t qrs, krs, vrs, mrs, mcs;
    float *o, *lse;
    float scale;
    int32_t causal, isa;
} tsr_attention_args;
int tsr_attention_run(const tsr_attention_args* a, int threads);
/* y (rows x cols) += b[row] */
void tsr_add_row_bias(float* y, const float* b, int64_t rows, int64_t cols);

#endif
