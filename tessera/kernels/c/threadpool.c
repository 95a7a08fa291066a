/* The kernel threads (tessera/kernels/threadpool.py): a job's items taken from one atomic
   counter by the caller and the pool's workers, which spin a while after a job and then
   sleep on a futex. -DTSR_BLASINT is the CBLAS integer of the batched GEMM items: int, or
   int64_t for an ILP64 OpenBLAS. */
#include <stdint.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <immintrin.h>
typedef TSR_BLASINT blasint;
enum { MAXW = 64 };

typedef int64_t (*item_fn)(const int64_t* ctx, int64_t i);

/* one job: n items, item(ctx, i) each, taken from ``next``; ``limit`` workers may join */
typedef struct {
    item_fn item; const int64_t* ctx; int64_t n; int limit;
    _Atomic int64_t next, done;
} job_t;

static job_t job;
/* odd: a job is open; even: closed. A worker joins only an open job it has seen since its
   last one, and announces itself in ``active`` first, then checks ``gen`` again: the
   caller closes the job before waiting for ``active`` to drop to 0, so a late worker
   either joins while the job's fields are still valid or backs off. */
static _Atomic uint32_t gen;
static _Atomic int sleepers, active;
static pthread_mutex_t busy = PTHREAD_MUTEX_INITIALIZER;
static int nworkers;
/* how long a worker spins after a job before sleeping on the futex (TESSERA_POOL_SPIN_US,
   as GOMP_SPINCOUNT for OpenMP): a job that starts within it finds the worker awake */
static int64_t spin_ns = 50000;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void* worker(void* arg) {
    int index = (int)(intptr_t)arg;
    uint32_t seen = atomic_load(&gen), g;
    for (;;) {
        int64_t t0 = now_ns();
        int k = 0;
        while ((g = atomic_load(&gen)) == seen || !(g & 1)) {
            _mm_pause();
            /* yield now and then: a spinning worker must not keep another thread (an
               OpenBLAS worker starting its share of a GEMM) off this core */
            if (++k % 256 == 0 && (sched_yield(), now_ns() - t0 > spin_ns)) {
                atomic_fetch_add(&sleepers, 1);
                syscall(SYS_futex, &gen, FUTEX_WAIT_PRIVATE, g, NULL, NULL, 0);
                atomic_fetch_sub(&sleepers, 1);
                t0 = now_ns();
            }
        }
        seen = g;
        atomic_fetch_add(&active, 1);
        if (atomic_load(&gen) == g && index < job.limit) {
            for (int64_t i; (i = atomic_fetch_add(&job.next, 1)) < job.n;) {
                job.item(job.ctx, i);
                atomic_fetch_add(&job.done, 1);
            }
        }
        atomic_fetch_sub(&active, 1);
    }
    return NULL;
}

/* start workers up to ``threads`` - 1; returns how many run */
int tsr_pool_start(int threads) {
    pthread_mutex_lock(&busy);
    const char* spin = getenv("TESSERA_POOL_SPIN_US");
    if (spin != NULL && nworkers == 0)
        spin_ns = 1000 * (int64_t)strtol(spin, NULL, 10);
    while (nworkers < threads - 1 && nworkers < MAXW) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, (void*)(intptr_t)nworkers) != 0) break;
        pthread_detach(t);
        nworkers++;
    }
    pthread_mutex_unlock(&busy);
    return nworkers;
}

/* item(ctx, i) for i in [0, n) on the caller (item 0 first) and up to ``threads`` - 1
   workers; a call made while another runs (from another thread) runs its items alone */
void tsr_pool_run(item_fn item, const int64_t* ctx, int64_t n, int threads) {
    int64_t mine = 0;
    if (threads < 2 || pthread_mutex_trylock(&busy) != 0) {
        for (int64_t i = 0; i < n; i++) item(ctx, i);
        return;
    }
    job.item = item; job.ctx = ctx; job.n = n; job.limit = threads - 1;
    atomic_store(&job.done, 0);
    /* item 0 is the caller's: a job of one item per thread (a batch-1 product's halves of
       a weight) then keeps each share on the same core from one call to the next, in its
       cache, where a spinning worker would otherwise take item 0 as often as not */
    atomic_store(&job.next, 1);
    atomic_fetch_add(&gen, 1);                       /* open */
    if (atomic_load(&sleepers) > 0)
        syscall(SYS_futex, &gen, FUTEX_WAKE_PRIVATE, MAXW, NULL, NULL, 0);
    if (n > 0) {
        item(ctx, 0);
        mine++;
    }
    for (int64_t i; (i = atomic_fetch_add(&job.next, 1)) < n; mine++) item(ctx, i);
    int k = 0;                                        /* items a worker still runs */
    while (atomic_load(&job.done) + mine < n)
        if (++k % 1024 == 0) sched_yield(); else _mm_pause();
    atomic_fetch_add(&gen, 1);                       /* closed */
    while (atomic_load(&active) > 0)
        if (++k % 1024 == 0) sched_yield(); else _mm_pause();
    pthread_mutex_unlock(&busy);
}

/* ---- items -------------------------------------------------------------------------- */

/* a call: ctx = [function, nargs, rows of nargs int64 arguments, results]; item i calls
   the function with row i and stores what it returns (int64; meaningful only for a
   function that returns an integer) */
#define A(j) row[j]
#define T int64_t
int64_t tsr_pool_call_item(const int64_t* ctx, int64_t i) {
    intptr_t f = (intptr_t)ctx[0];
    int64_t n = ctx[1];
    const int64_t* row = (const int64_t*)(intptr_t)ctx[2] + i * n;
    int64_t r;
    switch (n) {
    case 0: r = ((T (*)(void))f)(); break;
    case 1: r = ((T (*)(T))f)(A(0)); break;
    case 2: r = ((T (*)(T, T))f)(A(0), A(1)); break;
    case 3: r = ((T (*)(T, T, T))f)(A(0), A(1), A(2)); break;
    case 4: r = ((T (*)(T, T, T, T))f)(A(0), A(1), A(2), A(3)); break;
    case 5: r = ((T (*)(T, T, T, T, T))f)(A(0), A(1), A(2), A(3), A(4)); break;
    case 6: r = ((T (*)(T, T, T, T, T, T))f)(A(0), A(1), A(2), A(3), A(4), A(5)); break;
    case 7: r = ((T (*)(T, T, T, T, T, T, T))f)(A(0), A(1), A(2), A(3), A(4), A(5), A(6));
        break;
    case 8: r = ((T (*)(T, T, T, T, T, T, T, T))f)(A(0), A(1), A(2), A(3), A(4), A(5), A(6),
                                                    A(7)); break;
    case 9: r = ((T (*)(T, T, T, T, T, T, T, T, T))f)(A(0), A(1), A(2), A(3), A(4), A(5),
                                                       A(6), A(7), A(8)); break;
    case 10: r = ((T (*)(T, T, T, T, T, T, T, T, T, T))f)(A(0), A(1), A(2), A(3), A(4), A(5),
                                                           A(6), A(7), A(8), A(9)); break;
    case 11: r = ((T (*)(T, T, T, T, T, T, T, T, T, T, T))f)(A(0), A(1), A(2), A(3), A(4),
                                                              A(5), A(6), A(7), A(8), A(9),
                                                              A(10)); break;
    default: r = ((T (*)(T, T, T, T, T, T, T, T, T, T, T, T))f)(A(0), A(1), A(2), A(3), A(4),
                                                                 A(5), A(6), A(7), A(8), A(9),
                                                                 A(10), A(11)); break;
    }
    ((int64_t*)(intptr_t)ctx[3])[i] = r;
    return r;
}
#undef T
#undef A

/* a kernel's blocks: ctx = [range, arg, error]; item i calls range(arg, i, i + 1), and a
   nonzero result lands in error (the last one written): one C call hands over a job that
   tsr_pool_call_item would need a row of arguments per item for (tsr_gemm_range) */
int64_t tsr_pool_range_item(const int64_t* ctx, int64_t i) {
    int64_t r = ((int64_t (*)(int64_t, int64_t, int64_t))(intptr_t)ctx[0])(ctx[1], i, i + 1);
    if (r) __atomic_store_n((int64_t*)(intptr_t)&ctx[2], r, __ATOMIC_RELAXED);
    return r;
}

/* one product of a batch: ctx = [p, a, b, c, itemsize], p[] = nb M N K transA transB lda
   ldb ldc strideA strideB strideC gemm (pointers and strides in elements) */
#define GEMM(T, S)                                                                        \
typedef void (*gemm_##S)(int, int, int, blasint, blasint, blasint, T, const T*, blasint,  \
                         const T*, blasint, T, T*, blasint);                              \
static void one_##S(const int64_t* p, const char* a, const char* b, char* c, int64_t i) { \
    ((gemm_##S)(intptr_t)p[12])(101, (int)p[4], (int)p[5], p[1], p[2], p[3], (T)1,        \
        (const T*)a + i * p[9], p[6], (const T*)b + i * p[10], p[7], (T)0,                \
        (T*)c + i * p[11], p[8]);                                                         \
}
GEMM(float, f32)
GEMM(double, f64)

int64_t tsr_pool_gemm_item(const int64_t* ctx, int64_t i) {
    const int64_t* p = (const int64_t*)(intptr_t)ctx[0];
    const char *a = (const char*)(intptr_t)ctx[1], *b = (const char*)(intptr_t)ctx[2];
    char* c = (char*)(intptr_t)ctx[3];
    if (ctx[4] == 4) one_f32(p, a, b, c, i);
    else one_f64(p, a, b, c, i);
    return 0;
}
