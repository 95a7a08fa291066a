/* gemm.c and the entry through which tessera.kernels.gemm runs its common calls in one C
   call: a batch-1 product takes microseconds, and resolving each array's address, strides
   and shape in Python (then a ctypes call of a dozen arguments) would cost about as much
   as the product. tsr_gemm_py (and tsr_gemm_py_b) read them from the NumPy arrays' object headers instead
   (NumPy's public PyArrayObject_fields: data, nd, dimensions, strides, descr after the
   object header) and returns 1, having written nothing, for anything it does not take (a
   dtype other than float32, a shape that does not fit, strides not whole floats): the
   Python caller then takes its general path, which names the problem. gemm.py checks this
   layout on a few arrays with tsr_gemm_py_probe before it uses the entry. Deployed
   libraries copy gemm.c, not this file. */
#include "gemm.c"

typedef struct {
    intptr_t refcnt; void* type;         /* PyObject_HEAD */
    char* data; int nd; int64_t* dims; int64_t* strides; void* base; const void* descr;
} tsr_ndarray_t;

static const void* f32_descr;            /* numpy.dtype(numpy.float32) */
static tsr_pool_run_fn pool_run;         /* threadpool.c's tsr_pool_run, or NULL */

void tsr_gemm_py_setup(const void* f32, tsr_pool_run_fn run) {
    f32_descr = f32;
    pool_run = run;
}

/* what tsr_gemm_py reads of an array: data, nd, dims[0..1], strides[0..1], descr
   (dims and strides only for nd == 2) */
void tsr_gemm_py_probe(const tsr_ndarray_t* x, int64_t* out) {
    out[0] = (int64_t)(intptr_t)x->data;
    out[1] = x->nd;
    for (int i = 0; i < 2; i++) {
        out[2 + i] = x->nd == 2 ? x->dims[i] : -1;
        out[4 + i] = x->nd == 2 ? x->strides[i] : -1;
    }
    out[6] = (int64_t)(intptr_t)x->descr;
}

/* a 2-d float32 array whose strides are whole floats: its (rows, columns, row stride,
   column stride) in elements, op(x) if trans; 0 for anything else */
static int matrix(const tsr_ndarray_t* x, int trans, int64_t* d) {
    if (x->nd != 2 || x->descr != f32_descr || x->strides[0] % 4 || x->strides[1] % 4) return 0;
    d[0] = x->dims[trans]; d[1] = x->dims[!trans];
    d[2] = x->strides[trans] / 4; d[3] = x->strides[!trans] / 4;
    return 1;
}

/* op(a) @ op(b) into c (a fresh C-contiguous m x n float32 array) as tmpl describes the
   rest (the epilogue; the packed B with its k and n when b is NULL); how = threads * 4 +
   trans_a * 2 + trans_b. tmpl is copied, so one serves concurrent calls. 0, 1 (not taken),
   or tsr_gemm_range's -1, -2 */
int64_t tsr_gemm_py_b(const tsr_gemm_t* tmpl, const tsr_ndarray_t* a, const tsr_ndarray_t* b,
                      const tsr_ndarray_t* c, int64_t how) {
    int64_t da[4], db[4], dc[4];
    if (!matrix(a, (how & 2) != 0, da) || !matrix(c, 0, dc)) return 1;
    tsr_gemm_t g = *tmpl;
    if (b) {
        /* several blocks of rows would each pack B: the general path packs it once first */
        if (!matrix(b, how & 1, db) || (how >> 2 > 1 && da[0] > GEMV_MAX)) return 1;
        g.k = db[0]; g.n = db[1]; g.b = (const float*)b->data; g.rsb = db[2]; g.csb = db[3];
    }
    if (da[0] < 1 || da[1] != g.k || g.k < 1 || g.n < 1 || dc[0] != da[0] || dc[1] != g.n ||
        dc[3] != 1 || dc[2] != g.n)
        return 1;
    g.m = da[0]; g.a = (const float*)a->data; g.rsa = da[2]; g.csa = da[3];
    g.c = (float*)c->data; g.ldc = g.n;
    return tsr_gemm_exec(&g, (int)(how >> 2), pool_run);
}

/* the same by the packed B of tmpl (one argument less to convert) */
int64_t tsr_gemm_py(const tsr_gemm_t* tmpl, const tsr_ndarray_t* a, const tsr_ndarray_t* c,
                    int64_t how) {
    return tsr_gemm_py_b(tmpl, a, NULL, c, how);
}
