"""One C library per graph, and the Python side of each kernel call.

``build(nodes)`` lowers every fused node it can, renders them all into one translation
unit, loads it through the compile cache, and wraps each kernel as ``fn(out, *arrays)``:
the contiguous variant when every input is C-contiguous, else the strided one with the
inputs' strides (in elements, 0 where they broadcast).
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
import time
import warnings

import numpy as np

from tessera.codegen import cc
from tessera.codegen.loops import iteration_shape, lower, render, supported
from tessera.codegen.prelude import PRELUDE
from tessera.ops.fused import body_graph

__all__ = ["build", "stats", "fork_join", "split_call"]

# what the last build did, for nn.Graph's debug output and the benchmark
stats: dict = {}
# schedule before register allocation too: it interleaves the two streams of a jammed loop
# (loops.jam), whose exp/erf chains are otherwise bound by latency
FLAGS = ("-fschedule-insns", "-fsched-pressure")


def build(nodes: list) -> dict:
    t0 = time.perf_counter()
    chunks, plans = [PRELUDE], []
    skipped: dict[str, str] = {}
    for j, node in enumerate(nodes):
        body = body_graph(node.attrs["body"])
        why = supported(body)
        if why is not None:
            skipped[node.name or f"fused{j}"] = why
            continue
        name = f"tsr_f{j}"
        funcs = lower(body, name)
        chunks += [render(f) for f in funcs]
        plans.append((node, name, body, [f.split for f in funcs]))
    if not plans:
        return {}
    source = "\n\n".join(chunks) + "\n"
    debug = os.environ.get("TESSERA_DEBUG", "0") == "2"
    if debug:
        print(f"// tessera codegen: {len(plans)} kernels\n{source}", file=sys.stderr)
    try:
        lib = cc.load(chunks, FLAGS)   # [prelude, *kernels]: big graphs compile in parallel
    except cc.CompileError as e:  # a code generator bug: run the reference kernels instead
        warnings.warn(f"tessera codegen: {e}; running these nodes with NumPy kernels",
                      RuntimeWarning, stacklevel=2)
        return {}
    out = {}
    for node, name, body, splits in plans:
        fn = _wrap(getattr(lib, name + "_c"), getattr(lib, name + "_s"), body, splits)
        out[node] = _timed(fn, name, node.name) if debug else fn
    stats.update(kernels=len(plans), skipped=skipped, seconds=time.perf_counter() - t0,
                 cached=cc.last_build.get("cached"), source_lines=source.count("\n"))
    if debug:
        hit = "hit" if stats["cached"] else "miss"
        print(f"// compiled in {stats['seconds']:.3f} s (cache {hit})", file=sys.stderr)
    return out


def _timed(fn, name: str, where: str):
    """``fn`` that prints its run time on its first call (``TESSERA_DEBUG=2``)."""
    first = [True]

    def call(out, *arrays, body=None):
        t0 = time.perf_counter()
        fn(out, *arrays)
        if first[0]:
            first[0] = False
            print(f"// {name} ({where or 'graph'}): {(time.perf_counter() - t0) * 1e3:.3f} ms "
                  f"for {out.size} elements", file=sys.stderr)
    return call


_POOL: list = []   # [ThreadPoolExecutor] once a kernel is big enough to split


@functools.lru_cache(maxsize=1)
def _threads() -> int:
    """Kernel threads: as many as BLAS uses (read once; threadpoolctl is slow)."""
    from tessera._info import get_num_threads
    return max(1, get_num_threads())


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
    ``tessera.codegen.pool`` (a part starts in about a microsecond); anything else on a
    Python thread pool.
    """
    from tessera.codegen import pool
    results = pool.run(f, parts)
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
    from tessera.codegen.loops import PARALLEL_MIN
    threads = min(_threads(), extent)
    if threads < 2 or work < PARALLEL_MIN:
        return f(*args, 0, extent)
    bounds = [extent * k // threads for k in range(threads + 1)]
    results = fork_join(f, [(*args, lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])])
    return next((r for r in results if r), 0)


def _runner(f, extent: int | None, work: int):
    """``run(*pointers)``: ``f`` over its whole split loop, or over chunks of it."""
    if not extent:
        return lambda *ptrs: f(*ptrs, 0, 1)
    return lambda *ptrs: split_call(f, ptrs, extent, work)


def _wrap(fc, fs, body, splits):
    """``fn(out, *arrays)`` calling the contiguous or the strided kernel."""
    n_in = len(body.inputs)
    for f, extra in ((fc, 0), (fs, 1)):
        f.argtypes = [ctypes.c_void_p] * (1 + n_in + extra) + [ctypes.c_int64] * 2
        f.restype = None
    work = int(np.prod(iteration_shape(body)))
    fc, fs = _runner(fc, splits[0], work), _runner(fs, splits[1], work)
    full = iteration_shape(body)
    nd = len(full)
    if body.outputs[0].numel == 0:
        return lambda out, *arrays, body=None: None
    dims = [d for d in range(nd) if full[d] != 1]

    def strides(a: np.ndarray) -> list[int]:
        pad = nd - a.ndim
        res = []
        for d in dims:
            j = d - pad
            res.append(0 if j < 0 or a.shape[j] == 1 else a.strides[j] // a.itemsize)
        return res

    shapes = [v.shape for v in body.inputs]
    out_shape = body.outputs[0].shape

    def call(out, *arrays, body=None):
        # the kernel trusts these shapes: a mismatch must be an error, not a stray read
        if [a.shape for a in arrays] != shapes or out.shape != out_shape:
            raise ValueError(f"fused kernel: expected inputs {shapes} and output {out_shape}, "
                             f"got {[a.shape for a in arrays]} and {out.shape}")
        if not out.flags.c_contiguous:
            raise ValueError("fused kernel: the output buffer must be C-contiguous")
        if all(a.flags.c_contiguous for a in arrays):
            fc(out.ctypes.data, *[a.ctypes.data for a in arrays])
            return
        st = np.array([s for a in arrays for s in strides(a)] or [0], np.int64)
        fs(out.ctypes.data, *[a.ctypes.data for a in arrays], st.ctypes.data)
    return call
