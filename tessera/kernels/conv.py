"""Threaded 2-d convolution drivers: im2col -> GEMM -> bias (forward), GEMM -> col2im
(input gradient) and im2col -> GEMM accumulation (weight gradient), in C, calling NumPy's
OpenBLAS through its CBLAS entry points.

Every thread of the kernel pool takes work items (images, a few images side by side, row
blocks or output-channel blocks of one image) from one shared counter and runs the whole
chain on its own column buffer with BLAS single-threaded. Compared with a Python loop of
2-thread BLAS calls: no barrier per GEMM (one per layer, and a late thread only takes fewer
items, which matters on a loaded machine), each column buffer stays in its core's cache,
and im2col/col2im/bias run on every core. ``threaded()`` is False when NumPy's BLAS is not an
OpenBLAS (or code generation is off); ``tessera.ops.conv`` then loops in Python. The same
header (``c/conv.h``) builds the Winograd F(2x2, 3x3) and F(4x4, 3x3) drivers of
``tessera.kernels.winograd`` and ``tessera.kernels.winograd4`` (3x3 stride-1 convolutions
and their gradients). A family of drivers (im2col, F(2x2), F(4x4)) compiles on its first
call, a library each.

>>> import numpy as np
>>> x, w = np.ones((2, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32)
>>> y = np.empty((2, 1, 2, 2), np.float32)
>>> if threaded(np.float32):
...     conv2d_threaded(x, w, None, (1, 1), (0, 0), (1, 1), y)
... else:
...     y[:] = 9
>>> y[0, 0]
array([[9., 9.],
       [9., 9.]], dtype=float32)
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import NamedTuple

import numpy as np

from tessera.kernels.cc import addresses
from tessera.kernels.csource import defines, source
from tessera.kernels.window import _SUFFIX, available, check_conv

__all__ = ["threaded", "conv2d_threaded", "conv2d_input_grad_threaded",
           "conv2d_weight_grad_threaded", "Epilogue", "epilogue", "EPILOGUE_ACTS"]

class _Blas(NamedTuple):
    sgemm: int          # addresses of cblas_sgemm / cblas_dgemm
    dgemm: int
    set_threads: Callable
    get_threads: Callable
    ilp64: bool
    axpy: dict          # dtype -> cblas_?axpy(n, alpha, x, incx, y, incy): y += alpha x


@functools.lru_cache(maxsize=1)
def _blas() -> _Blas | None:
    """The CBLAS GEMMs and thread control of the OpenBLAS NumPy uses, or None (another
    BLAS: the convolutions then call NumPy's matmul)."""
    try:
        from threadpoolctl import threadpool_info
        infos = threadpool_info()
    except Exception:  # pragma: no cover - declared dependency
        return None
    for info in infos:
        if info.get("internal_api") != "openblas":
            continue
        lib = ctypes.CDLL(info["filepath"])
        for pre, suf in (("scipy_", "64_"), ("", "64_"), ("", "")):
            try:
                s, d = (getattr(lib, f"{pre}cblas_{t}gemm{suf}") for t in "sd")
                st = getattr(lib, f"{pre}openblas_set_num_threads{suf}")
                gt = getattr(lib, f"{pre}openblas_get_num_threads{suf}")
            except AttributeError:
                continue
            st.argtypes, st.restype, gt.argtypes, gt.restype = [ctypes.c_int], None, [], \
                ctypes.c_int
            sgemm, dgemm = (ctypes.cast(f, ctypes.c_void_p).value for f in (s, d))
            assert sgemm is not None and dgemm is not None  # symbols found are not NULL
            axpy = {}
            n = ctypes.c_int64 if suf else ctypes.c_int
            for t, dt, real in (("s", np.float32, ctypes.c_float), ("d", np.float64,
                                                                   ctypes.c_double)):
                f = getattr(lib, f"{pre}cblas_{t}axpy{suf}", None)
                if f is not None:
                    f.argtypes = [n, real, ctypes.c_void_p, n, ctypes.c_void_p, n]
                    f.restype = None
                    axpy[np.dtype(dt)] = f
            return _Blas(sgemm, dgemm, st, gt, bool(suf), axpy)
    return None


# Winograd variants: the transforms' macro, the geometry, tile positions
_WINO = {"wino": ("WINOGRAD", "WGEOMETRY", 16), "wino4": ("WINOGRAD4", "W4GEOMETRY", 36)}
_P, _I = ctypes.c_void_p, ctypes.c_int64
# the pointer arguments before (ws, next, g, gemm, t, t1) of each kind of driver
_POINTERS = {"fwd": 6, "igrad": 4, "wgrad": 4, "wino_fwd": 7, "wide": 9}


@functools.cache
def _header(s: str) -> str:
    """Every driver library's header for dtype suffix ``s`` (f32 or f64): the macros and
    types its definitions are built from (``c/conv.h``)."""
    t = {"f32": "float", "f64": "double"}[s]
    return source("conv.h") + f"\nGEMM_TYPE({t}, {s})\n"


def _blasint() -> str:
    """The C type of the CBLAS integer of NumPy's OpenBLAS: ``int64_t`` for an ILP64 one."""
    blas = _blas()
    return "int64_t" if blas is not None and blas.ilp64 else "int"


def _definitions(name: str, s: str) -> str:
    """The C of the library holding driver ``tsr_conv_<name>_<s>``: the im2col drivers
    (fwd, igrad, wgrad), F(2x2)'s (wino_fwd, wino_wide, wino_wgrad) or F(4x4)'s (wino4_...).
    A library a family rather than a driver: the transforms are most of the C, and a
    library a driver would compile them again (bench compile: cnn train)."""
    t = {"f32": "float", "f64": "double"}[s]
    if name in ("fwd", "igrad", "wgrad"):
        return (f"IM2COL_BLOCK({t}, im2col_block_{s})\nCOL2IM({t}, col2im_plane_{s})\n"
                f"DRIVERS({t}, {s})")
    v = name.split("_")[0]
    body, geometry, positions = _WINO[v]
    return f"{body}({t}, {s})\n" + "\n".join(
        f"WINO_{kind}({t}, {s}, {v}, {geometry}, {positions})" for kind in ("FWD", "WIDE", "WGRAD"))


@functools.cache
def _driver(name: str, s: str):
    """The C driver ``tsr_conv_<name>_<s>``, compiled on its first call (or by ``prefetch``)
    with its family (``_definitions``): a graph compiles only the families its layers run,
    not all three (bench compile: cnn train)."""
    f = getattr(once(("conv", _definitions(name, s)), functools.partial(_build, name, s)),
                f"tsr_conv_{name}_{s}")
    kind = "wino_fwd" if name.endswith("_fwd") else name.split("_")[-1]
    f.argtypes, f.restype = [_P] * _POINTERS[kind] + [_I, _P, _P, _P, _I, _I], None
    return f


def _build(name: str, s: str):
    from tessera.kernels.cc import load
    return load([_header(s), _definitions(name, s)], defines(BLASINT=_blasint()))


def prefetch(name: str, dtype) -> None:
    """Start compiling driver ``name`` (as ``_driver``) for ``dtype`` in the background."""
    s = _SUFFIX[np.dtype(dtype)]
    background(("conv", _definitions(name, s)), functools.partial(_build, name, s))
    if s == "f32":
        background(("conv", "own_sgemm"), _own_sgemm)


_ONCE: dict[Hashable, Future] = {}
_ONCE_LOCK = threading.Lock()


def once(key: Hashable, build: Callable):
    """``build()``, run once in this process for ``key`` by whichever thread asks first (the
    others wait for it and get its result or its error): a library compiled in the
    background by ``background`` and asked for by its first kernel call is compiled once."""
    fut = _ONCE.get(key)
    if fut is None or not fut.done():
        with _ONCE_LOCK:
            fut = _ONCE.get(key)
            first = fut is None
            if first:
                fut = _ONCE[key] = Future()
        assert fut is not None  # found, or made just now
        if first:
            try:
                fut.set_result(build())
            except BaseException as e:  # handed to every caller, raised by .result()
                fut.set_exception(e)
    return fut.result()


def background(key: Hashable, build: Callable) -> None:
    """``once(key, build)`` on a thread of its own unless it has begun: a C compiler run at
    trace time, beside the graph's other compiles; its error, if any, is raised by the
    kernel's own ``once`` call."""
    if key not in _ONCE:
        threading.Thread(target=_quietly, args=(key, build), name="tessera-cc").start()


def _quietly(key: Hashable, build: Callable) -> None:
    try:
        once(key, build)
    except BaseException:  # kept in the future for the kernel's call
        pass


def _after_fork() -> None:
    """In a forked child the parent's compiling threads do not exist: their unfinished
    entries would never finish (the child compiles those itself), and the lock may be
    held."""
    global _ONCE_LOCK
    _ONCE_LOCK = threading.Lock()
    for key in [k for k, fut in _ONCE.items() if not fut.done()]:
        del _ONCE[key]


os.register_at_fork(after_in_child=_after_fork)


def threaded(dtype) -> bool:
    """Whether the threaded convolution drivers run for ``dtype`` (C kernels available and
    NumPy's BLAS is an OpenBLAS whose GEMM C can call)."""
    return available(dtype) and _blas() is not None


_WORK = threading.local()


def _workspace(n: int, dtype, slot: str = "") -> np.ndarray:
    """A reusable buffer of at least ``n`` elements (one per calling thread and ``slot``:
    convolutions may run from several Python threads)."""
    key = np.dtype(dtype).str + slot
    cache = _WORK.__dict__
    buf = cache.get(key)
    if buf is None or buf.size < n:
        buf = cache[key] = np.empty(max(n, 1), dtype)
    return buf


def _run(name: str, dtype, arrays: tuple, work: np.ndarray, ws: int, geometry: list,
         threads: int) -> None:
    """``tsr_conv_<name>`` on ``threads`` pool threads taking items from one counter, BLAS
    single-threaded meanwhile (with one thread, BLAS keeps its own threads)."""
    blas = _blas()
    assert blas is not None  # the drivers run only where it was found (``threaded``)
    s = _SUFFIX[np.dtype(dtype)]
    f = _driver(name, s)
    nxt = np.zeros(8, np.int64)  # a driver of several passes takes a pair of counters each
    g = np.array(geometry, np.int64)
    gemm = blas.dgemm
    if np.dtype(dtype) == np.float32:
        # the weight gradients keep OpenBLAS (see _own_sgemm)
        own = None if name.endswith("wgrad") else once(("conv", "own_sgemm"), _own_sgemm)
        gemm = own or blas.sgemm
    args = tuple(None if a is None else ctypes.addressof(a) if isinstance(a, Epilogue)
                 else a.ctypes.data for a in arrays) + (
        work.ctypes.data, ws, nxt.ctypes.data, g.ctypes.data, gemm)
    # the last argument: t + 1 for drivers taking items from the counter, the thread count
    # for the weight gradient, which splits images into fixed blocks (a deterministic sum)
    last = (lambda t: threads) if name.endswith("wgrad") else (lambda t: t + 1)
    if threads < 2:
        f(*args, 0, 1)
        return
    _launch(f, args, threads, last)


def _launch(f, args: tuple, threads: int, last: Callable) -> None:
    """Driver ``f`` on ``threads`` pool threads, BLAS single-threaded meanwhile."""
    from tessera.kernels import threadpool as runtime
    blas = _blas()
    assert blas is not None
    _single_blas(blas, +1)
    try:
        runtime.fork_join(f, [(*args, t, last(t)) for t in range(threads)])
    finally:
        _single_blas(blas, -1)


_CONV_GEMM = os.environ.get("TESSERA_CONV_GEMM", "auto")


class Epilogue(ctypes.Structure):
    """What a forward convolution applies to its output after the bias, in the drivers
    while each item's output is in cache (``c/conv.h``'s ``conv_epi``): made by
    ``epilogue``."""
    _fields_ = [("r", ctypes.c_void_p), ("egemm", ctypes.c_void_p), ("act", ctypes.c_int64),
                ("first", ctypes.c_int64), ("lo", ctypes.c_double), ("hi", ctypes.c_double)]


# the activations the drivers fuse, as c/gemm.h's TSR_ACT_ codes (relu6 and hardtanh are
# clamps)
EPILOGUE_ACTS = {None: 0, "relu": 1, "clamp": 4}


def epilogue(y: np.ndarray, activation: str | None = None, bounds=(0.0, 0.0),
             residual: np.ndarray | None = None, residual_first: bool = False) -> Epilogue:
    """The epilogue ``y = act(y [+ residual]) [+ residual]`` of a forward convolution into
    ``y``: ``activation`` ``"relu"``, ``"clamp"`` (to ``bounds``, lo and hi) or None; the
    C-contiguous ``residual`` of ``y``'s shape and dtype inside the activation with
    ``residual_first``, else after it. Keep ``residual`` alive while the convolution runs.

    >>> e = epilogue(np.zeros((1, 2, 3, 3), np.float32), "clamp", (0.0, 6.0))
    >>> e.act, e.hi, e.r
    (4, 6.0, None)
    """
    if activation not in EPILOGUE_ACTS:
        raise ValueError(f"conv epilogue: activation must be one of "
                         f"{', '.join(map(repr, EPILOGUE_ACTS))}, got {activation!r}")
    if residual is not None and (residual.shape != y.shape or residual.dtype != y.dtype
                                 or not residual.flags.c_contiguous):
        raise ValueError(f"conv epilogue: the residual must be C-contiguous {y.dtype} of the "
                         f"output's shape {y.shape}, got {residual.dtype} {residual.shape}")
    e = Epilogue(r=None if residual is None else residual.ctypes.data,
                 act=EPILOGUE_ACTS[activation], first=int(bool(residual_first)),
                 lo=float(bounds[0]), hi=float(bounds[1]))
    if y.dtype == np.float32:
        e.egemm = _OWN_EPI[0] if once(("conv", "own_sgemm"), _own_sgemm) else None
    return e


@functools.lru_cache(maxsize=1)
def _own_sgemm() -> int | None:
    """The address of tessera's GEMM (``tessera.kernels.gemm``) behind CBLAS's sgemm
    signature (``c/conv_gemm.c``) for the float32 products of the forward and input-gradient
    drivers (im2col and Winograd), where it is the faster one, else None (OpenBLAS's sgemm).
    Chosen on AVX-512, where it takes 0.55-0.81x OpenBLAS's time (SkylakeX kernels) on
    every GEMM shape of ResNet-18 at batch 1, one thread each (bench models: resnet18 infer
    b1); its AVX2 kernels are not measured against OpenBLAS's Haswell ones on an AVX2 CPU,
    so there BLAS stays. The weight-gradient drivers keep OpenBLAS: no gain measured
    (bench training: cnn, 40.2 against 40.8 ms a step at one thread), and their sums in
    the other order moved graph and eager AdamW training of the digits CNN apart within
    ten steps (tests/graph/test_graph_training.py). ``TESSERA_CONV_GEMM=blas|tessera``
    (read at import) forces either.

    >>> _own_sgemm() is None or _own_sgemm() > 0
    True
    """
    from tessera.kernels import gemm
    blas = _blas()
    if _CONV_GEMM == "blas" or blas is None or not gemm.available():
        return None
    if _CONV_GEMM != "tessera" and gemm.isa() != "avx512":
        return None
    from tessera.kernels.cc import load
    lib = load(source("conv_gemm.c"), defines(BLASINT=_blasint()))
    lib.tsr_conv_gemm_init.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.tsr_conv_gemm_init(ctypes.cast(gemm._lib().tsr_gemm_run, ctypes.c_void_p).value,
                           blas.sgemm, gemm._isa())
    _OWN_EPI[0] = ctypes.cast(lib.tsr_conv_sgemm_epi, ctypes.c_void_p).value
    return ctypes.cast(lib.tsr_conv_sgemm, ctypes.c_void_p).value


_OWN_EPI: list = [None]  # tsr_conv_sgemm_epi's address, set with _own_sgemm's


_BLAS_LOCK = threading.Lock()
_BLAS_HELD = [0, 0]  # drivers running now, BLAS threads before the first of them


def _single_blas(blas: _Blas, step: int) -> None:
    """Count a driver in (+1) or out (-1); BLAS is single-threaded while any runs (drivers
    may run from several Python threads at once: the last one out restores the count)."""
    with _BLAS_LOCK:
        if step > 0 and _BLAS_HELD[0] == 0:
            _BLAS_HELD[1] = blas.get_threads()
            blas.set_threads(1)
        _BLAS_HELD[0] += step
        if _BLAS_HELD[0] == 0:
            blas.set_threads(_BLAS_HELD[1])


def _plan(n: int, o: int, oh: int, ow: int, ck: int, itemsize: int,
          threads: int) -> tuple[int, int, int, int]:
    """(threads, rows per item, images per item, output channels per item) for a forward
    convolution with ``ck`` column rows (C KH KW): images split across threads, a few small
    outputs side by side making one wider GEMM. With fewer images than threads (batch-1
    inference), items of output rows whose columns fit in half a core's L2, so that each
    item's im2col is still in cache for its GEMM (ResNet-18's stem: 3 rows, 197 KB,
    rather than two halves of the image, 3.7 MB each), at least _MIN_BLOCK columns and
    two items per thread; small outputs split by output channels, one block a thread. An
    image whose columns exceed _IMAGE_COLS_BYTES is split into row blocks however many
    images there are: the stem at one thread takes 0.75x the time of its whole-image GEMM
    (bench models: resnet18 infer b1, one thread)."""
    p = oh * ow
    whole = threads, oh, max(1, min(-(-n // threads), _WIDE_GEMM // p)), o
    if n >= threads and ck * p * itemsize <= _IMAGE_COLS_BYTES:
        return whole
    rb = max(_COLS_BYTES // (itemsize * ck * ow), -(-_MIN_BLOCK // ow))
    rb = max(1, min(rb, -(-n * oh // (2 * threads))))
    if rb * ow >= _MIN_BLOCK:
        return threads, rb, 1, o
    if n >= threads:
        return whole
    parts = -(-threads // n)
    if o >= 2 * parts * _MIN_CHANNELS:
        # one block a thread, the fewest blocks: each block's GEMM packs all the shared
        # columns again (bench models: resnet18 infer b1)
        return threads, oh, 1, -(-o // parts)
    return 1, oh, max(1, min(n, _WIDE_GEMM // p)), o


def _pool_threads() -> int:
    from tessera.kernels.threadpool import _threads as pool_threads
    return pool_threads()


def _threads(macs: int) -> int:
    """Threads for a convolution of ``macs`` multiply-adds: one below a size where handing
    items to the pool costs more than it saves (tiny images, as in the digits demo)."""
    from tessera.kernels.threadpool import _threads as pool_threads
    return 1 if macs < _PARALLEL_MACS else pool_threads()


_PARALLEL_MACS = 1 << 21
_WIDE_GEMM = 1024  # output columns worth putting several images side by side for
_MIN_BLOCK = 256   # output columns a row block needs to be worth its own GEMM
_MIN_CHANNELS = 32  # output channels (GEMM rows) a block of them needs
_COLS_BYTES = 256 << 10  # a row block's columns: half of a core's L2 (Zen 3: 512 KiB)
# an image's columns past which it is row blocks even with an image per thread: ResNet-18's
# stem (7.4 MB) gains, its 3x3 stride-2 layers (1.8 MB and less) lose 10-20% with row blocks
_IMAGE_COLS_BYTES = 4 << 20
_SHARED = True  # output-channel items share one build of the columns (see conv2d_threaded)
_SHARED_ROWS = True


def conv2d_threaded(x: np.ndarray, w: np.ndarray, b, stride, pads, dilation,
                    y: np.ndarray, epilogue: Epilogue | None = None) -> None:
    """``y`` (N, O, OH, OW) = the 2-d convolution of C-contiguous ``x`` (N, C, H, W) with
    C-contiguous ``w`` (O, C, KH, KW) plus ``b`` (O,) if given, then ``epilogue``'s
    activation and residual (``epilogue``); ``pads`` are the low paddings; ``y``
    C-contiguous."""
    check_conv("conv2d", x.shape, w.shape, y.shape, stride, pads, dilation, (x, w, y), b)
    threads, ws, size, geometry = _fwd_plan(x.shape, w.shape, stride, pads, dilation,
                                            y.shape[2:], x.itemsize)
    _run("fwd", x.dtype, (x, w, b, y, epilogue), _workspace(size, x.dtype), ws, geometry,
         threads)


def _fwd_plan(xshape, wshape, stride, pads, dilation, out_sp, itemsize: int):
    """(threads, column elements an item, workspace elements, geometry) of a forward
    convolution at the current thread count."""
    n, c, h, wd = xshape
    o, _, kh, kw = wshape
    oh, ow = out_sp
    ck = c * kh * kw
    threads, rb, grp, ob = _plan(n, o, oh, ow, ck, itemsize, _threads(n * o * ck * oh * ow))
    ws = (ck + o) * grp * oh * ow if grp > 1 else ck * rb * ow
    # output channels split over threads: the images' columns built once and shared, in
    # items of column rows (four a thread an image)
    shared = -(-ck // (4 * threads)) if _SHARED and threads > 1 and ob < o and rb == oh else 0
    if shared and o <= oh * ow and _SHARED_ROWS:
        # fewer filters than columns: items of output rows rather than channels, so that
        # BLAS packs (copies) the smaller operand, the filters, once an item rather than
        # all the columns (the 64 -> 128 stride-2 3x3 at 28x28: 3 MB packed, not 7.5)
        ob, rb = o, -(-oh // (2 * threads))
    size = n * ck * oh * ow if shared else ws * threads
    geometry = [c, h, wd, o, kh, kw, *stride, *pads, *dilation, oh, ow, n, rb, grp, ob, shared]
    return threads, ws, size, geometry


def conv2d_threaded_bound(xshape, wshape, stride, pads, dilation, out_sp, dtype):
    """``run(x, w, b, y)``: ``conv2d_threaded`` for one convolution's shapes and dtype with
    its checks, plan, driver and geometry made once (again only when the thread count
    changes), for a compiled graph's node; the arrays' addresses are remembered (a graph
    passes the same arena views and variables every step). Arrays of other shapes, or not
    C-contiguous, take ``conv2d_threaded``."""
    dt = np.dtype(dtype)
    xshape, wshape = tuple(xshape), tuple(wshape)
    yshape = (xshape[0], wshape[0], *out_sp)
    check_conv("conv2d", xshape, wshape, yshape, stride, pads, dilation,
               (np.empty(0, dt),))
    blas = _blas()
    assert blas is not None  # bound only where the drivers run (``threaded``)
    f = _driver("fwd", _SUFFIX[dt])
    gemm = blas.dgemm if dt == np.float64 else \
        once(("conv", "own_sgemm"), _own_sgemm) or blas.sgemm
    nxt = np.zeros(8, np.int64)
    state: list = [None, None]   # (pool threads, its plan)
    ptr = [addresses() for _ in range(5)]
    key = dt.str   # _workspace's
    from tessera.kernels.threadpool import _threads as pool_threads

    def run(x, w, b, y) -> None:
        if x.shape != xshape or w.shape != wshape or y.shape != yshape or x.dtype is not dt \
                or w.dtype is not dt or y.dtype is not dt or not (
                    x.flags.c_contiguous and w.flags.c_contiguous and y.flags.c_contiguous) \
                or b is not None and (b.shape != wshape[:1] or b.dtype is not dt):
            conv2d_threaded(x, w, b, stride, pads, dilation, y)  # or its error
            return
        pool = pool_threads()
        if state[0] != pool:
            threads, ws, size, geometry = _fwd_plan(xshape, wshape, stride, pads, dilation,
                                                    out_sp, dt.itemsize)
            g = np.array(geometry, np.int64)
            state[:] = [pool, (threads, ws, size, g, g.ctypes.data, nxt.ctypes.data)]
        threads, ws, size, _, g_at, nxt_at = state[1]
        work = _WORK.__dict__.get(key)
        if work is None or work.size < size:
            work = _workspace(size, dt)
        nxt.fill(0)
        args = (ptr[0](x), ptr[1](w), ptr[2](b), ptr[3](y), None, ptr[4](work), ws, nxt_at,
                g_at, gemm)   # None: no epilogue (``conv_pointwise`` takes conv2d_threaded)
        if threads < 2:
            f(*args, 0, 1)
            return
        _launch(f, args, threads, lambda t: t + 1)
    return run


def conv2d_input_grad_threaded(g: np.ndarray, w: np.ndarray, stride, pads, dilation,
                               dx: np.ndarray) -> None:
    """``dx`` (N, C, H, W) = the input gradient of C-contiguous ``g`` (N, O, OH, OW); one
    image per item (col2im windows overlap, so images are the unit)."""
    check_conv("conv2d_input_grad", dx.shape, w.shape, g.shape, stride, pads, dilation,
               (g, w, dx))
    n, c, h, wd = dx.shape
    o, _, kh, kw = w.shape
    oh, ow = g.shape[2:]
    ws = c * kh * kw * oh * ow
    threads = min(_threads(n * o * ws), n)
    work = _workspace(ws * threads, g.dtype)
    geometry = [c, h, wd, o, kh, kw, *stride, *pads, *dilation, oh, ow, n, oh, 1, o, 0]
    _run("igrad", g.dtype, (g, w, dx), work, ws, geometry, threads)


def conv2d_weight_grad_threaded(x: np.ndarray, g: np.ndarray, wshape, stride, pads,
                                dilation) -> np.ndarray:
    """The weight gradient (O, C, KH, KW) of C-contiguous ``x`` and ``g``: each thread sums
    its images' products into its own slice, then the slices add up."""
    check_conv("conv2d_weight_grad", x.shape, tuple(wshape), g.shape, stride, pads, dilation,
               (x, g))
    n, c, h, wd = x.shape
    o, _, kh, kw = wshape
    oh, ow = g.shape[2:]
    ws = c * kh * kw * oh * ow
    threads = min(_threads(n * o * ws), n)
    work = _workspace(ws * threads, x.dtype)
    dw = np.empty((threads, o, c * kh * kw), x.dtype)
    geometry = [c, h, wd, o, kh, kw, *stride, *pads, *dilation, oh, ow, n, oh, 1, o, 0]
    _run("wgrad", x.dtype, (x, g, dw), work, ws, geometry, threads)
    return (dw[0] if threads == 1 else dw.sum(0)).reshape(wshape)
