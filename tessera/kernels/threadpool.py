"""The kernel threads, in C (``c/threadpool.c``): a split kernel's parts handed over in about
a microsecond.

A kernel split over threads (a fused loop's chunks, a convolution driver's threads, a batch
of small matrix products) is a list of *parts*, each one C call. ``run(f, parts)`` makes the
calls on the calling thread and on the pool's workers: the caller runs part 0, then every
thread takes part indices from one atomic counter, so a worker that is asleep or has lost
its core costs nothing but its share, which the caller takes itself (it then waits only for
parts a worker has started). A job of one part per thread thus gives each thread the same
part from one call to the next (the share of a weight a core keeps in its cache).
Workers spin for 50 us after a job (``TESSERA_POOL_SPIN_US``, read when the pool starts,
as ``GOMP_SPINCOUNT`` for OpenMP), as OpenMP's and OpenBLAS's do, and then sleep on a
futex; a job wakes sleeping ones. Python's ``ThreadPoolExecutor`` starts a part through a
condition variable and then the GIL, which takes longer than many parts do (bench models:
mobilenet_v2 infer b1).

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
import os

import numpy as np

from tessera._runtime import threads as _runtime_threads
from tessera.kernels.csource import defines, source

__all__ = ["usable", "run", "run_blocks", "gemm_batch", "fork_join", "split_call", "chunks",
           "reset_threads", "c_pool", "MAX_ARGS", "SPLIT_MIN"]

# elements: below this, handing chunks to threads costs more than it saves
SPLIT_MIN = 1 << 18
MAX_ARGS = 12  # the most arguments a part's function takes (the convolution drivers: 11)


@functools.lru_cache(maxsize=1)
def _lib():
    """The pool library (its workers start with the first job of two or more threads);
    None without a C compiler."""
    try:
        from tessera.kernels import cc
        from tessera.kernels.conv import _blasint
        if cc.compiler() is None:
            return None
        lib = cc.load(source("threadpool.c"), defines(BLASINT=_blasint()))
    except Exception:  # a broken toolchain: the Python pool still works
        return None
    P = ctypes.c_void_p
    lib.tsr_pool_start.argtypes, lib.tsr_pool_start.restype = [ctypes.c_int], ctypes.c_int
    lib.tsr_pool_run.argtypes = [P, P, ctypes.c_int64, ctypes.c_int]
    lib.tsr_pool_run.restype = None
    # the work items' addresses, kept on the library object they belong to
    lib.call_item = ctypes.cast(lib.tsr_pool_call_item, P).value  # type: ignore[attr-defined]
    lib.gemm_item = ctypes.cast(lib.tsr_pool_gemm_item, P).value  # type: ignore[attr-defined]
    lib.range_item = ctypes.cast(lib.tsr_pool_range_item, P).value  # type: ignore[attr-defined]
    lib.run_address = ctypes.cast(lib.tsr_pool_run, P).value  # type: ignore[attr-defined]
    return lib


_STARTED = [1]  # the thread count the workers were started for


def _threads_now(lib) -> int:
    """The kernel thread count (``tessera.set_num_threads`` may have raised it: the
    missing workers start now; a lowered count leaves the rest out of each job)."""
    t = _threads()
    if t > _STARTED[0]:
        _STARTED[0] = max(lib.tsr_pool_start(t) + 1, _STARTED[0])
    return min(t, _STARTED[0])


def c_pool() -> tuple[int, int]:
    """(address of the pool's C ``tsr_pool_run(item, ctx, n, threads)``, the thread count
    to pass it) for C code that runs its work items on these threads (a graph's program,
    ``tessera.deploy``), the missing workers started; (0, 1) with one kernel thread or
    without the C pool.

    >>> c_pool()[1] >= 1
    True
    """
    lib = _lib() if _threads() > 1 else None
    if lib is None:
        return 0, 1
    return lib.run_address, _threads_now(lib)


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
    # (ctypes' class of C functions, absent from its stubs)
    if isinstance(f, ctypes._CFuncPtr):  # type: ignore[attr-defined]
        _ADDRESSES[id(f)] = (f, addr)
    return addr


def _address(f) -> int | None:
    if not isinstance(f, ctypes._CFuncPtr):  # type: ignore[attr-defined]
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


def run_blocks(f, arg: int, n: int, threads: int) -> int | None:
    """``f(arg, i, i + 1)`` for ``i`` in ``[0, n)`` on the caller and at most ``threads`` - 1
    of the pool's workers, ``f``
    a C function of three integer or pointer parameters returning an integer (a kernel's
    range of blocks: ``tsr_gemm_range``): a nonzero result if any, else 0; None when the C
    pool cannot make the calls. One C call, where ``run`` builds a row of arguments per part
    first: a batch-1 product's blocks take a few microseconds each."""
    addr = _callable(f)
    lib = _lib()
    if addr is None or lib is None:
        return None
    ctx = (ctypes.c_int64 * 3)(addr, arg, 0)
    lib.tsr_pool_run(lib.range_item, ctypes.addressof(ctx), n, min(threads, _threads_now(lib)))
    return ctx[2]


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


def _after_fork() -> None:
    # a forked child has none of the pool's threads (the executor would wait for them)
    _POOL.clear()


os.register_at_fork(after_in_child=_after_fork)


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
    whole kernel that much (bench models: mobilenet_v2 infer b1, its short 1x1
    convolutions). Each part must give the same result on any thread (the kernels that
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


def chunks(extent: int, work: int) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` chunks ``split_call`` runs ``[0, extent)`` in: one per kernel thread
    when ``work`` (elements) is large enough, else one.

    >>> chunks(10, 1)
    [(0, 10)]
    """
    threads = min(_threads(), extent)
    if threads < 2 or work < SPLIT_MIN:
        return [(0, extent)]
    bounds = [extent * k // threads for k in range(threads + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def split_call(f, args: tuple, extent: int, work: int):
    """``f(*args, lo, hi)`` over ``[0, extent)``: in chunks on the kernel threads when
    ``work`` (elements) is large enough, else in one call. ctypes releases the GIL during
    each call; idle pool threads sleep, so BLAS keeps its cores. Returns the first nonzero
    result (kernels report errors that way), else 0."""
    parts = chunks(extent, work)
    if len(parts) == 1:
        return f(*args, 0, extent)
    results = fork_join(f, [(*args, lo, hi) for lo, hi in parts])
    return next((r for r in results if r), 0)


_runtime_threads.on_change(reset_threads)
