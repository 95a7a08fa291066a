"""The kernel threads, in C: a split kernel's parts handed over in about a microsecond.

A kernel split over threads (a fused loop's chunks, a convolution driver's threads, a batch
of small matrix products) is a list of *parts*, each one C call. ``run(f, parts)`` makes the
calls on the calling thread and on the pool's workers: every thread takes part indices from
one atomic counter, so a worker that is asleep or has lost its core costs nothing but its
share, which the caller takes itself (it then waits only for parts a worker has started).
Workers spin for 50 us after a job, as OpenMP's and OpenBLAS's do, and then sleep on a
futex; a job wakes sleeping ones. Python's ``ThreadPoolExecutor`` takes longer to start a
part (a condition variable, then the GIL) than many parts take (bench models: mobilenet_v2
infer b1).

A part is a call of a C function whose parameters are all pointers or integers (they pass
in the same registers on x86-64 and AArch64, so the pool calls it with int64 arguments), or
one product of a batch of matrix multiplications (``tessera.kernels.bmm``), an item type
built in here because cblas takes float scalars.

>>> import ctypes
>>> labs = ctypes.CDLL(None).labs
>>> labs.argtypes, labs.restype = [ctypes.c_long], ctypes.c_long
>>> run(labs, [(-3,), (4,), (-5,)]) if usable() else [3, 4, 5]
[3, 4, 5]
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from tessera._runtime import threads as _runtime_threads

__all__ = ["usable", "run", "gemm_batch", "fork_join", "split_call", "reset_threads",
           "MAX_ARGS", "SPLIT_MIN"]

# elements: below this, handing chunks to threads costs more than it saves
SPLIT_MIN = 1 << 18
MAX_ARGS = 12  # the most arguments a part's function takes (the convolution drivers: 11)

_SOURCE = r"""
#include <stdint.h>
#include <stdatomic.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <immintrin.h>
typedef %(blasint)s blasint;
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
static const int64_t spin_ns = 50000;  /* how long a worker spins before sleeping */

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
            if (++k %% 256 == 0 && (sched_yield(), now_ns() - t0 > spin_ns)) {
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
    while (nworkers < threads - 1 && nworkers < MAXW) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, (void*)(intptr_t)nworkers) != 0) break;
        pthread_detach(t);
        nworkers++;
    }
    pthread_mutex_unlock(&busy);
    return nworkers;
}

/* item(ctx, i) for i in [0, n) on the caller and up to ``threads`` - 1 workers; a call
   made while another runs (from another thread) runs its items alone */
void tsr_pool_run(item_fn item, const int64_t* ctx, int64_t n, int threads) {
    int64_t mine = 0;
    if (threads < 2 || pthread_mutex_trylock(&busy) != 0) {
        for (int64_t i = 0; i < n; i++) item(ctx, i);
        return;
    }
    job.item = item; job.ctx = ctx; job.n = n; job.limit = threads - 1;
    atomic_store(&job.done, 0);
    atomic_store(&job.next, 0);
    atomic_fetch_add(&gen, 1);                       /* open */
    if (atomic_load(&sleepers) > 0)
        syscall(SYS_futex, &gen, FUTEX_WAKE_PRIVATE, MAXW, NULL, NULL, 0);
    for (int64_t i; (i = atomic_fetch_add(&job.next, 1)) < n; mine++) item(ctx, i);
    int k = 0;                                        /* items a worker still runs */
    while (atomic_load(&job.done) + mine < n)
        if (++k %% 1024 == 0) sched_yield(); else _mm_pause();
    atomic_fetch_add(&gen, 1);                       /* closed */
    while (atomic_load(&active) > 0)
        if (++k %% 1024 == 0) sched_yield(); else _mm_pause();
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
"""


@functools.lru_cache(maxsize=1)
def _lib():
    """The pool library (its workers start with the first job of two or more threads);
    None without a C compiler."""
    try:
        from tessera.kernels import cc
        from tessera.kernels.conv import _blas
        if cc.compiler() is None:
            return None
        blas = _blas()
        lib = cc.load(_SOURCE % {"blasint": "int64_t" if blas is not None and blas.ilp64
                                 else "int"})
    except Exception:  # a broken toolchain: the Python pool still works
        return None
    P = ctypes.c_void_p
    lib.tsr_pool_start.argtypes, lib.tsr_pool_start.restype = [ctypes.c_int], ctypes.c_int
    lib.tsr_pool_run.argtypes = [P, P, ctypes.c_int64, ctypes.c_int]
    lib.tsr_pool_run.restype = None
    lib.call_item = ctypes.cast(lib.tsr_pool_call_item, P).value
    lib.gemm_item = ctypes.cast(lib.tsr_pool_gemm_item, P).value
    return lib


_STARTED = [1]  # the thread count the workers were started for


def _threads_now(lib) -> int:
    """The kernel thread count (``tessera.set_num_threads`` may have raised it: the
    missing workers start now; a lowered count leaves the rest out of each job)."""
    t = _threads()
    if t > _STARTED[0]:
        _STARTED[0] = max(lib.tsr_pool_start(t) + 1, _STARTED[0])
    return min(t, _STARTED[0])


def usable() -> bool:
    """Whether the C pool runs (a C compiler, and more than one kernel thread)."""
    return _threads() > 1 and _lib() is not None


_INTEGER = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int,
            ctypes.c_long, ctypes.c_longlong, ctypes.c_ssize_t, ctypes.c_size_t)


_ADDRESSES: dict = {}   # id(f) -> (f, its address or None); f kept so the id stays its own


def _callable(f) -> int | None:
    """``f``'s address when the pool can call it: a ctypes C function of at most MAX_ARGS
    pointer or integer parameters returning nothing or an integer."""
    hit = _ADDRESSES.get(id(f))
    if hit is not None and hit[0] is f:
        return hit[1]
    addr = _address(f)
    if isinstance(f, ctypes._CFuncPtr):
        _ADDRESSES[id(f)] = (f, addr)
    return addr


def _address(f) -> int | None:
    if not isinstance(f, ctypes._CFuncPtr):
        return None
    args = f.argtypes
    if args is None or len(args) > MAX_ARGS or f.restype not in (None, *_INTEGER):
        return None
    if not all(a in _INTEGER or (isinstance(a, type) and issubclass(a, ctypes._Pointer))
               for a in args):
        return None
    return ctypes.cast(f, ctypes.c_void_p).value


def run(f, parts: list[tuple]) -> list | None:
    """``[f(*part) for part in parts]`` on the caller and the pool's workers, or None when
    the pool cannot make these calls (then the caller uses another way). Arguments are
    ints or None (null pointers)."""
    addr = _callable(f)
    lib = _lib()
    if addr is None or lib is None or not parts:
        return None
    n, k = len(parts[0]), len(parts)
    try:
        table = (ctypes.c_int64 * (n * k))(*[0 if a is None else a for p in parts for a in p])
    except TypeError:  # not ints, or parts of different lengths
        return None
    if any(len(p) != n for p in parts):
        return None
    rets = (ctypes.c_int64 * k)()
    ctx = (ctypes.c_int64 * 4)(addr, n, ctypes.addressof(table), ctypes.addressof(rets))
    lib.tsr_pool_run(lib.call_item, ctypes.addressof(ctx), k, _threads_now(lib))
    restype = f.restype
    if restype is None:
        return [None] * k
    if ctypes.sizeof(restype) == 8:
        return list(rets)
    bits = 8 * ctypes.sizeof(restype)   # a narrower int: its low bits, sign-extended
    return [(r + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1)) for r in rets]


def gemm_batch(params: int, a: int, b: int, c: int, itemsize: int, n: int) -> None:
    """The ``n`` products of one batch (``tessera.kernels.bmm``'s parameter block at
    ``params``) on the caller and the workers."""
    lib = _lib()
    ctx = np.array([params, a, b, c, itemsize], np.int64)
    lib.tsr_pool_run(lib.gemm_item, ctx.ctypes.data, n, _threads_now(lib))


_POOL: list = []   # [ThreadPoolExecutor] once a kernel is big enough to split


@functools.lru_cache(maxsize=1)
def _threads() -> int:
    """Kernel threads: as many as BLAS uses (read once; threadpoolctl is slow)."""
    return max(1, _runtime_threads.get_num_threads())


def reset_threads() -> None:
    """Re-read the thread count (after ``tessera.set_num_threads``)."""
    _threads.cache_clear()
    if _POOL:
        _POOL.pop().shutdown(wait=False)


def _pool():
    if not _POOL:
        from concurrent.futures import ThreadPoolExecutor
        _POOL.append(ThreadPoolExecutor(max_workers=max(1, _threads() - 1),
                                        thread_name_prefix="tessera-kernel"))
    return _POOL[0]


def fork_join(f, parts: list[tuple]) -> list:
    """``[f(*part) for part in parts]``, ``parts[0]`` on the calling thread and the others
    on the kernel pool's threads. A part whose pool thread has not started by the time the
    caller is done with its own is taken back and run by the caller: on a busy host a woken
    thread may wait milliseconds for a core, and a join that waited for it would cost the
    whole kernel that much (bench models: mobilenet_v2 infer b1). Each part must give the
    same result on any thread (the kernels that
    share items through a counter find none left and return at once).

    >>> fork_join(lambda a, b: a + b, [(1, 2), (3, 4)])
    [3, 7]

    C functions of pointer and integer parameters run on the C pool of
    this module (a part starts in about a microsecond); anything else on a Python thread
    pool.
    """
    results = run(f, parts)
    if results is not None:
        return results
    futures = [_pool().submit(f, *part) for part in parts[1:]]
    results = [f(*parts[0])]
    for fut, part in zip(futures, parts[1:]):
        results.append(f(*part) if fut.cancel() else fut.result())
    return results


def split_call(f, args: tuple, extent: int, work: int):
    """``f(*args, lo, hi)`` over ``[0, extent)``: in chunks on the kernel threads when
    ``work`` (elements) is large enough, else in one call. ctypes releases the GIL during
    each call; idle pool threads sleep, so BLAS keeps its cores. Returns the first nonzero
    result (kernels report errors that way), else 0."""
    threads = min(_threads(), extent)
    if threads < 2 or work < SPLIT_MIN:
        return f(*args, 0, extent)
    bounds = [extent * k // threads for k in range(threads + 1)]
    results = fork_join(f, [(*args, lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])])
    return next((r for r in results if r), 0)


_runtime_threads.on_change(reset_threads)
