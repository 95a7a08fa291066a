"""One C library per graph, and the Python side of each kernel call.

``build(nodes)`` lowers every fused node it can, renders them all into one translation
unit, loads it through the compile cache, and wraps each kernel as ``fn(out, *arrays)``
(``out`` a tuple of arrays for a region with several outputs): the contiguous variant when
every input is C-contiguous, else the strided one with the inputs' strides (in elements, 0
where they broadcast). A region's side sums (column sums it accumulates beside its result)
come out of each chunk of the split loop as double partial sums, added in chunk order.
"""
from __future__ import annotations

import ctypes
import os
import sys
import time
import warnings
import weakref

import numpy as np

from tessera.codegen.loops import iteration_shape, lower, render, side_sums, supported
from tessera.codegen.rowwise import writes_before_reading
from tessera.graph.fused import body_graph
from tessera.kernels import cc
from tessera.kernels.prelude import PRELUDE
from tessera.kernels.threadpool import chunks, fork_join, split_call

__all__ = ["build", "stats"]

# what the last build did, for nn.Graph's debug output and the benchmark
stats: dict = {}
# schedule before register allocation too: it interleaves the two streams of a jammed loop
# (loops.jam), whose exp/erf chains are otherwise bound by latency
FLAGS = ("-fschedule-insns", "-fsched-pressure")


def build(nodes: list) -> dict:
    t0 = time.perf_counter()
    chunks, plans = [PRELUDE], []
    skipped: dict[str, str] = {}
    # a kernel's C after its name -> that name: regions alike (a model's repeated layers,
    # same ops on the same shapes) share one compiled kernel, each node its own wrapper
    names: dict[tuple[str, ...], str] = {}
    for j, node in enumerate(nodes):
        body = body_graph(node.attrs["body"])
        why = supported(body)
        if why is not None:
            skipped[node.name or f"fused{j}"] = why
            continue
        funcs = lower(body, f"tsr_f{j}")
        texts = [render(f) for f in funcs]
        name = names.setdefault(tuple(t.split("(", 1)[1] for t in texts), f"tsr_f{j}")
        if name == f"tsr_f{j}":
            chunks += texts
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
        if writes_before_reading(body):
            fn.reads_around = True  # the planner reads it (tessera.graph.executor)
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
            size = out[0].size if type(out) is tuple else out.size
            print(f"// {name} ({where or 'graph'}): {(time.perf_counter() - t0) * 1e3:.3f} ms "
                  f"for {size} elements", file=sys.stderr)
    call.reads_around = getattr(fn, "reads_around", False)  # type: ignore[attr-defined]
    call.bound_attrs = True  # type: ignore[attr-defined]
    return call


def _runner(f, extent: int | None, work: int):
    """``run(*pointers)``: ``f`` over its whole split loop, or over chunks of it."""
    if not extent:
        return lambda *ptrs: f(*ptrs, 0, 1)
    return lambda *ptrs: split_call(f, ptrs, extent, work)


def _same(arrays: tuple, seen: list) -> bool:
    """Whether ``arrays`` are the very arrays ``seen`` holds weak references to."""
    if len(arrays) != len(seen):
        return False
    for a, r in zip(arrays, seen):
        if r() is not a:
            return False
    return True


def _refs(arrays) -> list:
    return [weakref.ref(a) for a in arrays]


def _wrap(fc, fs, body, splits):
    """``fn(out, *arrays)`` calling the contiguous or the strided kernel."""
    if len(body.outputs) > 1:
        return _wrap_multi(fc, fs, body, splits)
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
    # a graph passes the same arena views and variables every step: their addresses are
    # looked up once (cc.addresses), and so is whether the contiguous kernel serves them
    address = [cc.addresses() for _ in range(n_in + 1)]
    checked: list = [[], False]   # (out, *inputs) last seen sound (weakly), contiguous?

    def call(out, *arrays, body=None):
        if not _same((out, *arrays), checked[0]):
            # the kernel trusts these shapes: a mismatch must be an error, not a stray read
            if [a.shape for a in arrays] != shapes or out.shape != out_shape:
                raise ValueError(f"fused kernel: expected inputs {shapes} and output "
                                 f"{out_shape}, got {[a.shape for a in arrays]} and "
                                 f"{out.shape}")
            if not out.flags.c_contiguous:
                raise ValueError("fused kernel: the output buffer must be C-contiguous")
            checked[:] = [_refs((out, *arrays)), all(a.flags.c_contiguous for a in arrays)]
        if checked[1]:
            fc(address[0](out), *[address[k + 1](a) for k, a in enumerate(arrays)])
            return
        st = np.array([s for a in arrays for s in strides(a)] or [0], np.int64)
        fs(out.ctypes.data, *[a.ctypes.data for a in arrays], st.ctypes.data)
    call.bound_attrs = True  # type: ignore[attr-defined]  # the executor passes no body
    return call


def _side_runner(f, extent: int | None, work: int, sides: list[int]):
    """``run(outs, *pointers)`` for a kernel with side sums (output ``j`` in ``sides``
    takes each call's double partial sums): every chunk of the split loop gets partial
    buffers of its own, added in chunk order (the same sums on every run) into ``outs[j]``."""
    def run(outs, *ptrs):
        parts = chunks(extent, work) if extent else [(0, 1)]
        partial = {j: np.empty((len(parts), outs[j].size)) for j in sides}
        calls = []
        for c, (lo, hi) in enumerate(parts):
            p = list(ptrs)
            for j in sides:
                p[j] = partial[j][c].ctypes.data
            calls.append((*p, lo, hi))
        if len(calls) == 1:
            f(*calls[0])
        else:
            fork_join(f, calls)
        for j in sides:
            np.copyto(outs[j].reshape(-1), partial[j].sum(0) if len(parts) > 1
                      else partial[j][0], casting="same_kind")
    return run


def _wrap_multi(fc, fs, body, splits):
    """``fn(outs, *arrays)`` for a region with several outputs (``outs``: a tuple of
    C-contiguous arrays, one per output); as ``_wrap`` otherwise."""
    n_in, n_out = len(body.inputs), len(body.outputs)
    for f, extra in ((fc, 0), (fs, 1)):
        f.argtypes = [ctypes.c_void_p] * (n_out + n_in + extra) + [ctypes.c_int64] * 2
        f.restype = None
    work = int(np.prod(iteration_shape(body)))
    sums = side_sums(body)
    sides = [j for j, v in enumerate(body.outputs) if v.producer in sums]
    if sides:
        fc, fs = _side_runner(fc, splits[0], work, sides), _side_runner(fs, splits[1], work,
                                                                        sides)
    else:
        rc, rs = _runner(fc, splits[0], work), _runner(fs, splits[1], work)
        fc, fs = (lambda outs, *ptrs: rc(*ptrs)), (lambda outs, *ptrs: rs(*ptrs))
    full = iteration_shape(body)
    nd = len(full)
    if any(v.numel == 0 for v in body.outputs):
        return lambda outs, *arrays, body=None: None
    dims = [d for d in range(nd) if full[d] != 1]

    def strides(a: np.ndarray) -> list[int]:
        pad = nd - a.ndim
        res = []
        for d in dims:
            j = d - pad
            res.append(0 if j < 0 or a.shape[j] == 1 else a.strides[j] // a.itemsize)
        return res

    shapes = [v.shape for v in body.inputs]
    out_shapes = [v.shape for v in body.outputs]
    address = [cc.addresses() for _ in range(n_out + n_in)]
    checked: list = [[], False]

    def call(outs, *arrays, body=None):
        if not _same((*outs, *arrays), checked[0]):
            if [a.shape for a in arrays] != shapes or [o.shape for o in outs] != out_shapes:
                raise ValueError(f"fused kernel: expected inputs {shapes} and outputs "
                                 f"{out_shapes}, got {[a.shape for a in arrays]} and "
                                 f"{[o.shape for o in outs]}")
            if not all(o.flags.c_contiguous for o in outs):
                raise ValueError("fused kernel: the output buffers must be C-contiguous")
            checked[:] = [_refs((*outs, *arrays)), all(a.flags.c_contiguous for a in arrays)]
        ptrs = [address[k](a) for k, a in enumerate((*outs, *arrays))]
        if checked[1]:
            fc(outs, *ptrs)
            return
        st = np.array([s for a in arrays for s in strides(a)] or [0], np.int64)
        fs(outs, *ptrs, st.ctypes.data)
    call.bound_attrs = True  # type: ignore[attr-defined]  # the executor passes no body
    return call

