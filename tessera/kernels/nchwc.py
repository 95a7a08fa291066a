"""Blocked-layout (NCHWc) inference convolutions and pooling (``c/nchwc.c``), as MLAS runs a
convolutional trunk.

An activation in the blocked layout is a float32 array ``(N, ceil(C/B), H, W, B)`` whose
channels past C are zero; ``B`` is 16 where the AVX-512 path runs, else 8 (``block()``).
Every convolution is then a direct one: a register tile of output pixels x blocks of output
channels, each step broadcasting one input value into a multiply-add with the B weights of
a block, bias, activation (relu, clamp) and residual applied in registers. The weights are
packed once (``pack_weights``); ``conv_bound`` plans a convolution of fixed shapes once and
returns the function a compiled graph calls every step, which runs the plan's work items on
the kernel thread pool. ``pool_bound`` does the same for max and average pooling (a global
average is a window the size of the image); ``to_blocked`` and ``from_blocked`` change the
layout at a blocked region's borders. A first layer of a few channels reads its plain NCHW
input (``plain_input=True``) instead of a blocked copy.

The C compiles in parts, each cached by ``tessera.kernels.cc``: a library without
register tiles (planning, packing, pooling, layout changes and the portable path: about a
second of compiling) and, for the x86 paths, libraries of the tiles some convolutions run
(``conv_tiles``): a compiled graph's layers announce theirs (``expect_tiles``) and share
one; a convolution bound on its own gets one of its own tiles. Every tile at once would be
a 1 MB library and half a minute of compiling.

The instruction set is chosen from the CPU: AVX-512, AVX2 with FMA, or portable C, the widest
within ``TESSERA_MAX_ISA``; ``TESSERA_NCHWC_ISA=avx512|avx2|portable`` forces one
(RuntimeError if the CPU lacks it or the cap excludes it). Any path runs either block size
(B = 16 off AVX-512, or B = 8 on it, in portable C).

>>> import numpy as np
>>> B = block()
>>> x = np.ones((1, 3, 5, 5), np.float32)
>>> w = np.ones((4, 3, 3, 3), np.float32)
>>> run = conv_bound((1, 3, 5, 5), (1, 4, 5, 5), w.shape, (1, 1), (1, 1), (1, 1), 1, B)
>>> xb = to_blocked(x, B)
>>> y = np.empty((1, 1, 5, 5, B), np.float32)
>>> run(xb, pack_weights(w, groups=1, block=B), None, None, y)
>>> from_blocked(y, 4)[0, 0]
array([[12., 18., 18., 18., 12.],
       [18., 27., 27., 27., 18.],
       [18., 27., 27., 27., 18.],
       [18., 27., 27., 27., 18.],
       [12., 18., 18., 18., 12.]], dtype=float32)
"""
from __future__ import annotations

import ctypes
import functools
import threading
import weakref
from collections.abc import Callable

import numpy as np

from tessera.kernels.csource import source

__all__ = ["block", "usable", "isa", "ISAS", "pack_weights", "conv_bound", "pool_bound",
           "to_blocked", "from_blocked", "blocked_shape", "conv_output_size", "conv_tiles",
           "tiles_header", "expect_tiles"]

ISAS = ("portable", "avx2", "avx512")           # c/gemm.h's TSR_GEMM_* in order
_ACTS = {None: 0, "relu": 1, "clamp": 4, "relu6": 4}   # TSR_ACT_*; relu6 is clamp to [0, 6]
_RESIDUAL_FIRST, _PLAIN_INPUT, _WINOGRAD = 1, 16, 32
_F32 = np.dtype(np.float32)


def _conv_fields() -> list:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int32
    return ([(n, i64) for n in ("n", "c", "h", "w", "o", "oh", "ow", "kh", "kw", "sh", "sw",
                                "ph", "pw", "dh", "dw", "groups")]
            + [("block", i32), ("isa", i32)]
            + [(n, ptr) for n in ("x", "wp", "bias", "r", "y")]
            + [("act", i32), ("flags", i32), ("lo", ctypes.c_float), ("hi", ctypes.c_float),
               ("reserved", i64 * 4)])


def _pool_fields() -> list:
    return ([(n, ctypes.c_int64) for n in ("n", "cb", "h", "w", "oh", "ow", "kh", "kw", "sh",
                                           "sw", "ph", "pw")]
            + [(n, ctypes.c_int32) for n in ("block", "isa", "kind", "count_include_pad")]
            + [("x", ctypes.c_void_p), ("y", ctypes.c_void_p)])


class _Conv(ctypes.Structure):
    """c/nchwc.h's ``tsr_nchwc_conv_t``."""
    _fields_ = _conv_fields()


class _Pool(ctypes.Structure):
    """c/nchwc.h's ``tsr_nchwc_pool_t``."""
    _fields_ = _pool_fields()


@functools.lru_cache(maxsize=1)
def _lib():
    """``c/nchwc.c`` without register tiles: the CPU checks, planning (``conv_tiles``),
    weight packing, layout changes, pooling and the portable path's convolutions (about a
    second of compiling, all the tiles 30 times that). An x86 convolution runs in a library
    of the tiles it needs (``_conv_lib``)."""
    return _load(tiles_header({("W", ())}, (8, 16)), pooling=True)


@functools.cache
def _tile_lib(tiles: frozenset, block: int):
    """``c/nchwc.c`` with the register tiles ``tiles`` of the x86 path of ``block`` only,
    and no pooling (``_lib``'s)."""
    return _load(tiles_header(tiles, (block,)), pooling=False)


def _load(header: str, pooling: bool):
    from tessera.kernels.cc import load_dispatching
    if not pooling:
        header += "#define TSR_NCHWC_NO_POOLING 1\n"
    P, I, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    return load_dispatching(header + source("nchwc.c"), (
        ("tsr_nchwc_isa_supported", [i32], i32), ("tsr_nchwc_isa_best", [], i32),
        ("tsr_nchwc_packed_size", [P], I), ("tsr_nchwc_pack_weights", [P, P, P], None),
        ("tsr_nchwc_conv_plan", [P, i32], I), ("tsr_nchwc_conv_range", [P, I, I], None),
        ("tsr_nchwc_to_blocked", [P, P, I, I, I, i32], None),
        ("tsr_nchwc_from_blocked", [P, P, I, I, I, i32], None),
        ("tsr_nchwc_conv_tiles", [P, P], i32)) + ((
        ("tsr_nchwc_pool_plan", [P, i32], I),
        ("tsr_nchwc_pool_range", [P, I, I], None)) if pooling else ()))


def usable() -> bool:
    """Whether the kernels can be built and run here (code generation on, a C compiler).

    >>> isinstance(usable(), bool)
    True
    """
    from tessera import kernels
    if not kernels.enabled():
        return False
    try:
        _lib()
    except Exception:  # a broken toolchain
        return False
    return True


@functools.lru_cache(maxsize=1)
def _isa() -> int:
    from tessera.kernels.gemm import select_isa
    lib = _lib()
    return select_isa("TESSERA_NCHWC_ISA", lib.tsr_nchwc_isa_best, lib.tsr_nchwc_isa_supported)


def isa() -> str:
    """The path in use: ``"avx512"``, ``"avx2"`` or ``"portable"``.

    >>> isa() in ISAS
    True
    """
    return ISAS[_isa()]


def block() -> int:
    """The channel block ``B`` of this CPU within ``TESSERA_MAX_ISA``: 16 on the AVX-512
    path, else 8.

    >>> block() in (8, 16)
    True
    """
    return 16 if _isa() == ISAS.index("avx512") else 8


def blocked_shape(shape, block: int) -> tuple[int, ...]:
    """The blocked shape of a plain ``(N, C, H, W)`` one.

    >>> blocked_shape((2, 17, 5, 5), 8)
    (2, 3, 5, 5, 8)
    """
    n, c, *rest = shape
    return (n, -(-c // block), *rest, block)


def conv_output_size(size: int, kernel: int, stride: int, pad_before: int, pad_after: int,
                     dilation: int) -> int:
    """PyTorch's (and ONNX's floor-mode) output extent of a convolution or pooling window.

    >>> conv_output_size(224, 7, 2, 3, 3, 1)
    112
    """
    return (size + pad_before + pad_after - dilation * (kernel - 1) - 1) // stride + 1


def _aligned(floats: int) -> np.ndarray:
    raw = np.empty(max(floats, 1) + 16, _F32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip:skip + max(floats, 1)]


def _block_arg(block, fn: str) -> int:
    if block not in (8, 16):
        raise ValueError(f"{fn}: block must be 8 or 16, got {block!r}")
    return int(block)


def _pair(v, name: str, fn: str) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    v = tuple(v)
    if len(v) != 2 or not all(isinstance(i, (int, np.integer)) for i in v):
        raise ValueError(f"{fn}: {name} must be an int or a pair of ints, got {v!r}")
    return int(v[0]), int(v[1])


def _pads(pads, fn: str) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from an int, (ph, pw) or ONNX's 4 values."""
    if isinstance(pads, int):
        return pads, pads, pads, pads
    p = tuple(int(i) for i in pads)
    if len(p) == 2:
        return p[0], p[1], p[0], p[1]
    if len(p) == 4:
        return p
    raise ValueError(f"{fn}: pads must be an int, (ph, pw) or (top, left, bottom, right), "
                     f"got {pads!r}")


def _geometry(p: _Conv, wshape, groups: int, block: int, plain_input: bool,
              winograd: bool = False) -> None:
    p.o, cg, p.kh, p.kw = (int(i) for i in wshape)
    p.groups, p.block = groups, block
    p.c = cg * groups
    p.flags = (_PLAIN_INPUT if plain_input else 0) | (_WINOGRAD if winograd else 0)
    p.isa = _isa()


def _check_winograd(wshape, groups: int, plain_input: bool, stride, dilation, fn: str) -> None:
    if groups != 1 or plain_input or tuple(wshape[2:]) != (3, 3) or \
            tuple(stride) != (1, 1) or tuple(dilation) != (1, 1):
        raise ValueError(f"{fn}: winograd is for ungrouped 3x3 stride-1 undilated "
                         f"convolutions of blocked input, got weight {list(wshape)}, groups="
                         f"{groups}, stride {tuple(stride)}, dilation {tuple(dilation)}"
                         + (", plain input" if plain_input else ""))


def pack_weights(w: np.ndarray, *, groups: int, block: int, plain_input: bool = False,
                 winograd: bool = False) -> np.ndarray:
    """PyTorch's convolution weight ``(o, c / groups, kh, kw)`` packed for the blocked
    kernels (1-D float32, 64-byte aligned): for each block of B output channels, its B
    weights contiguous in the order the tile reads them (zeros past o and c). ``groups`` is 1,
    or ``c == o`` (depthwise); ``plain_input`` packs for a first layer reading plain NCHW;
    ``winograd`` (3x3 weights) packs the 36 Winograd F(4x4, 3x3) transforms ``G g G^T``
    of each filter, for ``conv_bound(..., winograd=True)``.

    >>> pack_weights(np.ones((4, 3, 3, 3), np.float32), groups=1, block=8).shape
    (576,)
    """
    fn = "nchwc.pack_weights"
    block = _block_arg(block, fn)
    if not isinstance(w, np.ndarray) or w.dtype != _F32 or w.ndim != 4:
        raise TypeError(f"{fn}: w must be a 4-d float32 NumPy array, got "
                        f"{getattr(w, 'dtype', type(w).__name__)} {getattr(w, 'shape', '')}")
    _check_groups(w.shape, groups, plain_input, fn)
    if winograd:
        _check_winograd(w.shape, groups, plain_input, (1, 1), (1, 1), fn)
    p = _Conv()
    _geometry(p, w.shape, groups, block, plain_input, winograd)
    lib = _lib()
    out = _aligned(int(lib.tsr_nchwc_packed_size(ctypes.byref(p))))
    w = np.ascontiguousarray(w)
    lib.tsr_nchwc_pack_weights(ctypes.byref(p), w.ctypes.data, out.ctypes.data)
    return out


def _check_groups(wshape, groups: int, plain_input: bool, fn: str) -> None:
    o, cg = wshape[0], wshape[1]
    if groups != 1 and not (cg == 1 and groups == o):
        raise ValueError(f"{fn}: groups must be 1 or equal the channels (depthwise, weight "
                         f"(c, 1, kh, kw)), got groups={groups} for weight {tuple(wshape)}")
    if groups != 1 and plain_input:
        raise ValueError(f"{fn}: a depthwise convolution cannot read plain input")
    if min(wshape) < 1:
        raise ValueError(f"{fn}: weight of size {list(wshape)} is empty")


def conv_bound(xshape, oshape, wshape, stride, pads, dilation, groups: int, block: int,
               plain_input: bool = False, activation: str | None = None, bounds=None,
               residual_first: bool = False, *, winograd: bool = False,
               _tiles=None) -> Callable:
    """A convolution of fixed geometry, planned once: ``run(x, wp, bias, residual, y)``.

    ``xshape`` and ``oshape`` are the plain shapes ``(N, C, H, W)`` and ``(N, O, OH, OW)`` (the
    blocked arrays are ``blocked_shape`` of them; ``x`` is plain with ``plain_input``);
    ``wshape`` PyTorch's weight shape, ``wp`` its ``pack_weights``; ``pads`` an int, ``(ph,
    pw)`` or ``(top, left, bottom, right)``. ``bias`` has O values, or ``ceil(O/B)*B`` zero
    padded (or None); ``residual`` (or None) is laid out as ``y``, added after the activation
    or, with ``residual_first``, before it; it may be ``y`` itself (in place: each value is read
    before it is written, in one pass over the input channels; ``run.single_pass()`` says
    whether the plan is one anyway, else in place takes one at some cost in cache).
    ``winograd``: a 3x3 stride-1 convolution run as Winograd F(4x4, 3x3) (``wp`` packed
    with ``winograd=True``; 2.25x fewer products, for an input and an output transform).
    ``activation``: None, ``"relu"``, ``"relu6"`` or ``"clamp"`` to ``bounds``. Each call runs
    the plan's items on the kernel thread pool (``tessera.get_num_threads()`` threads). One
    bound function runs one call at a time; a call with the same arrays as the last one skips
    their checks, and a bias of O values is padded once per array (constant weights: pad it
    yourself if you change it in place).

    >>> run = conv_bound((1, 8, 4, 4), (1, 8, 2, 2), (8, 8, 1, 1), 2, 0, 1, 1, 8)
    >>> callable(run)
    True
    """
    fn = "nchwc.conv_bound"
    block = _block_arg(block, fn)
    sh, sw = _pair(stride, "stride", fn)
    dh, dw = _pair(dilation, "dilation", fn)
    top, left, bottom, right = _pads(pads, fn)
    n, c, h, w = (int(i) for i in xshape)
    n2, o, oh, ow = (int(i) for i in oshape)
    _check_groups(wshape, groups, plain_input, fn)
    if min(sh, sw, dh, dw) < 1:
        raise ValueError(f"{fn}: stride {(sh, sw)} and dilation {(dh, dw)} must be positive")
    if min(top, left, bottom, right) < 0:
        raise ValueError(f"{fn}: negative padding {(top, left, bottom, right)}")
    if c != wshape[1] * groups or o != wshape[0] or n != n2:
        raise RuntimeError(f"{fn}: Given groups={groups}, weight of size {list(wshape)}, "
                           f"expected input{list(xshape)} to have {wshape[1] * groups} "
                           f"channels and output{list(oshape)} {wshape[0]}")
    kh, kw = int(wshape[2]), int(wshape[3])
    want = (conv_output_size(h, kh, sh, top, bottom, dh),
            conv_output_size(w, kw, sw, left, right, dw))
    if min(want) < 1:
        raise RuntimeError(f"{fn}: Calculated padded input size per channel: "
                           f"({h + top + bottom} x {w + left + right}). Kernel size: "
                           f"({dh * (kh - 1) + 1} x {dw * (kw - 1) + 1}). Kernel size can't "
                           "be greater than actual input size")
    if (oh, ow) != want:
        raise RuntimeError(f"{fn}: output{list(oshape)} does not match the geometry "
                           f"(expected {want[0]} x {want[1]})")
    if activation not in _ACTS:
        raise ValueError(f"{fn}: activation must be one of {', '.join(map(repr, _ACTS))}, got "
                         f"{activation!r}")
    lo, hi = (0.0, 6.0) if activation == "relu6" else (0.0, 0.0)
    if activation == "clamp":
        if bounds is None or len(bounds) != 2:
            raise ValueError(f"{fn}: activation 'clamp' needs bounds=(lo, hi), got {bounds!r}")
        lo, hi = (float(b) for b in bounds)
    if winograd:
        _check_winograd(wshape, groups, plain_input, (sh, sw), (dh, dw), fn)
    p = _Conv(n=n, h=h, w=w, oh=oh, ow=ow, sh=sh, sw=sw, ph=top, pw=left, dh=dh, dw=dw,
              act=_ACTS[activation], lo=lo, hi=hi)
    _geometry(p, wshape, groups, block, plain_input, winograd)
    if residual_first:
        p.flags |= _RESIDUAL_FIRST
    if _tiles is not None:          # (bench: the register tile and blocking, 0 = planned)
        for i, v in enumerate(_tiles):
            p.reserved[i] = v
    lib = _conv_lib(p)
    xs = (n, c, h, w) if plain_input else blocked_shape((n, c, h, w), block)
    ys = blocked_shape((n, o, oh, ow), block)
    ob = ys[1] * block
    state: dict = {"threads": 0, "items": 0, "parts": None}
    addr = ctypes.addressof(p)

    from tessera.kernels.threadpool import _threads as pool_threads, fork_join
    packed = int(lib.tsr_nchwc_packed_size(ctypes.byref(p)))

    def plan() -> None:
        threads = pool_threads()
        if _tiles is None:
            p.reserved[:] = (0, 0, 0, 0)
        items = int(lib.tsr_nchwc_conv_plan(addr, threads))
        if items < 0:
            raise RuntimeError(f"{fn}: the {ISAS[p.isa]} kernels cannot run this convolution "
                               f"(input {list(xshape)}, weight {list(wshape)}, block {block})")
        state.update(threads=threads, items=items,
                     parts=[(addr, i, i + 1) for i in range(items)] if threads > 1 else None)

    plan()
    pad_bias: list = [None, None]   # the last bias given with o values, and its padded copy
    last: list = [None] * 5   # weak references to the last call's arrays (None for None)
    call = lib.tsr_nchwc_conv_range

    def same(ref, a) -> bool:
        return a is None if ref is None else ref() is a

    def run(x, wp, bias, residual, y) -> None:
        # a compiled graph passes the same arrays every step: checked once, their
        # addresses already in the structure (shapes compared again: they can be reassigned)
        if not (same(last[0], x) and same(last[1], wp) and same(last[2], bias) and
                same(last[3], residual) and same(last[4], y) and x.shape == xs and
                y.shape == ys):
            bind(x, wp, bias, residual, y)
        if pool_threads() != state["threads"]:
            plan()
        if state["parts"] is None:
            call(addr, 0, state["items"])
        else:
            fork_join(call, state["parts"])

    def bind(x, wp, bias, residual, y) -> None:
        _expect(x, xs, "x", fn)
        _expect(y, ys, "y", fn)
        if residual is not None:
            _expect(residual, ys, "residual", fn)
        if type(wp) is not np.ndarray or wp.dtype != _F32 or wp.size != packed or \
                wp.ctypes.data % 64:
            raise TypeError(f"{fn}: wp must be pack_weights' 64-byte aligned float32 array "
                            f"of {packed} values")
        given = bias
        if bias is not None:
            if getattr(bias, "shape", None) == (o,) and o != ob:   # padded once
                if pad_bias[0] is not bias:
                    padded = np.zeros(ob, _F32)
                    padded[:o] = bias
                    pad_bias[:] = bias, padded
                bias = pad_bias[1]
            elif getattr(bias, "shape", None) not in ((ob,), (o,)):
                raise ValueError(f"{fn}: bias must have {o} or {ob} values, got "
                                 f"{getattr(bias, 'shape', type(bias).__name__)}")
            _expect(bias, bias.shape, "bias", fn)
        alias = p.r is not None and p.r == p.y
        p.x, p.wp, p.y = x.ctypes.data, wp.ctypes.data, y.ctypes.data
        p.bias = None if bias is None else bias.ctypes.data
        p.r = None if residual is None else residual.ctypes.data
        if (p.r is not None and p.r == p.y) != alias:   # (the plan makes one pass then)
            plan()
        last[:] = [None if a is None else weakref.ref(a) for a in (x, wp, given, residual, y)]
    run.items = lambda: state["items"]     # type: ignore[attr-defined]
    run.tiles = lambda: tuple(p.reserved)  # type: ignore[attr-defined]
    cbs = c if plain_input else -(-c // block)
    run.single_pass = lambda: winograd or p.reserved[2] >= cbs  # type: ignore[attr-defined]
    return run


_TILE_IDS = 4 * 2 * 2 * 3 * 5 * 17   # c/nchwc.h's TSR_NCHWC_TILE_IDS
_TILE_LISTS = ("K", "C", "D", "T")    # rows, columns, depthwise, depthwise 3-wide


def conv_tiles(xshape, oshape, wshape, stride, pads, dilation, groups: int, block: int,
               plain_input: bool = False, winograd: bool = False) -> tuple[frozenset, int]:
    """The register tiles a convolution (``conv_bound``'s geometry) can run at any thread
    count on the x86 path of ``block`` (16: AVX-512, 8: AVX2; whatever this CPU has): the
    instances of ``c/nchwc.c`` a build of this layer needs, as ``(list, args)`` pairs for
    ``tiles_header`` (the portable path needs none; ``("W", ())`` stands for the Winograd
    transforms, with ``winograd``); and the plan's passes over the input
    channels (one: its output may take over its residual's buffer at no cost).

    >>> conv_tiles((1, 16, 4, 4), (1, 16, 4, 4), (16, 16, 1, 1), 1, 0, 1, 1, 16)
    (frozenset({('K512', (16, 1, 16, 1))}), 1)
    """
    fn = "nchwc.conv_tiles"
    block = _block_arg(block, fn)
    _check_groups(wshape, groups, plain_input, fn)
    (sh, sw), (dh, dw) = _pair(stride, "stride", fn), _pair(dilation, "dilation", fn)
    top, left, _, _ = _pads(pads, fn)
    p = _Conv(n=int(xshape[0]), h=int(xshape[2]), w=int(xshape[3]), oh=int(oshape[2]),
              ow=int(oshape[3]), sh=sh, sw=sw, ph=top, pw=left, dh=dh, dw=dw)
    if winograd:
        _check_winograd(wshape, groups, plain_input, (sh, sw), (dh, dw), fn)
    _geometry(p, wshape, groups, block, plain_input, winograd)
    tiles, passes = _used(p)
    if passes < 0:
        raise RuntimeError(f"{fn}: the blocked kernels cannot run this convolution (input "
                           f"{list(xshape)}, weight {list(wshape)}, block {block})")
    return tiles, passes


def _used(p: _Conv) -> tuple[frozenset, int]:
    """``conv_tiles`` of a filled structure (its blocking kept where set); passes -1 where
    the geometry is not supported."""
    used = np.zeros(_TILE_IDS, np.uint8)
    passes = int(_lib().tsr_nchwc_conv_tiles(ctypes.byref(p), used.ctypes.data))
    out: set[tuple[str, tuple]] = set()
    for i in np.flatnonzero(used).tolist():
        i, np_ = divmod(i, 17)
        i, nb = divmod(i, 5)
        i, sub = divmod(i, 3)
        i, plain = divmod(i, 2)
        kind, wide = divmod(i, 2)
        name = _TILE_LISTS[kind] + ("512" if wide else "256")
        ci = 1 if plain else (16 if wide else 8)
        # (a depthwise 3-wide tile's nb is 1 + its PAD: its row's padding columns)
        out.add((name, (np_, nb, ci, sub) if kind < 2 else (np_, sub) if kind == 2
                 else (np_, sub, nb - 1)))
    if p.flags & _WINOGRAD and passes > 0:
        out.add(("W", ()))
    return frozenset(out), passes


# the tile sets of the libraries loaded, and those compiled graphs announced, by block
_LIBS: dict[int, list[frozenset]] = {}
_EXPECTED: dict[int, list[frozenset]] = {}
_LOCK = threading.Lock()


def expect_tiles(tiles, block: int) -> None:
    """Say that convolutions of ``block`` whose tiles are among ``tiles`` (a union of
    ``conv_tiles``: a compiled graph's layers) are coming: ``conv_bound`` then runs each of
    them in one library of exactly these tiles, compiled on the first (a second or two, or
    loaded from the kernel cache), instead of one of each layer's own tiles.

    >>> tiles, _ = conv_tiles((1, 16, 4, 4), (1, 16, 4, 4), (16, 16, 1, 1), 1, 0, 1, 1, 16)
    >>> expect_tiles(tiles, 16)
    """
    tiles = frozenset(tiles)
    known = _EXPECTED.setdefault(_block_arg(block, "nchwc.expect_tiles"), [])
    if tiles not in known:
        known.append(tiles)


def _path(isa: int, block: int) -> int:
    """c/nchwc.c's path_of: the isa's own tiles when B is its vector width."""
    if isa == ISAS.index("avx512") and block == 16:
        return isa
    return ISAS.index("avx2") if isa >= ISAS.index("avx2") and block == 8 else 0


def _conv_lib(p: _Conv):
    """The library a convolution runs in: the one without tiles on the portable path; else a
    loaded one holding its tiles, else the smallest set announced holding them
    (``expect_tiles``), else its own tiles (a convolution called on its own)."""
    if _path(p.isa, p.block) == 0:
        return _lib()
    need, passes = _used(p)
    if passes < 0:           # (its plan says so)
        return _lib()
    with _LOCK:              # (one compile of a set, whichever thread binds first)
        loaded = _LIBS.setdefault(p.block, [])
        for tiles in loaded:
            if need <= tiles:
                return _tile_lib(tiles, p.block)
        cover = [t for t in _EXPECTED.get(p.block, ()) if need <= t]
        tiles = min(cover, key=len) if cover else need
        lib = _tile_lib(tiles, p.block)
        loaded.append(tiles)
        return lib


def tiles_header(tiles, blocks) -> str:
    """The header that makes a build of ``c/nchwc.c`` defining ``TSR_NCHWC_TILES`` (or one
    with this text ahead of the file) compile only ``tiles`` (a union of ``conv_tiles``;
    empty: a library of the portable path, pooling and the rest): the X-macro list of each
    kind of tile, and the x86 paths the ``blocks`` (8, 16) used run (the other one is left
    out), and whether the Winograd transforms are (``("W", ())`` among the tiles).

    >>> text = tiles_header({("K512", (16, 1, 16, 1))}, {16})
    >>> text.splitlines()[1:3]
    ['#define TSR_NCHWC_AVX512 1', '#define TSR_NCHWC_AVX2 0']
    >>> text.splitlines()[4].strip()
    'M(16, 1, 16, 1)'
    """
    lines = ["/* the register tiles this build of nchwc.c compiles (nchwc.h: "
             "tsr_nchwc_conv_tiles) */",
             f"#define TSR_NCHWC_AVX512 {int(16 in blocks)}",
             f"#define TSR_NCHWC_AVX2 {int(8 in blocks)}"]
    for kind in _TILE_LISTS:
        for width in ("512", "256"):
            name = kind + width
            args = sorted(a for n, a in tiles if n == name)
            calls = [f"M({', '.join(map(str, a))})" for a in args]
            rows = [" ".join(calls[i:i + 6]) for i in range(0, len(calls), 6)]
            lines.append(f"#define TSR_NCHWC_{name}(M)" +
                         "".join(f" \\\n    {r}" for r in rows))
    lines.append(f"#define TSR_NCHWC_WINO {int(('W', ()) in set(tiles))}")
    return "\n".join(lines) + "\n"


def _expect(a, shape, name: str, fn: str) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype != _F32:
        raise TypeError(f"{fn}: {name} must be a float32 NumPy array, got "
                        f"{getattr(a, 'dtype', type(a).__name__)}")
    if a.shape != tuple(shape):
        raise ValueError(f"{fn}: {name} must have shape {tuple(shape)}, got {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{fn}: {name} must be C-contiguous")
    return a


def pool_bound(xshape, kernel, stride, pads, kind: str, count_include_pad: bool, block: int,
               *, oshape=None) -> Callable:
    """Max or average pooling (``kind`` ``"max"`` or ``"avg"``) of a blocked array of plain
    shape ``xshape`` ``(N, C, H, W)``: ``run(x, y)``, both blocked. ``pads`` is an int or
    ``(ph, pw)``; the output extent is PyTorch's floor mode unless ``oshape`` (plain) says
    otherwise (ceil mode: windows past the padding are clipped). A global average pooling is
    ``kernel == (H, W)``.

    >>> run = pool_bound((1, 8, 4, 4), 2, 2, 0, "max", True, 8)
    >>> x = to_blocked(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4).repeat(8, 1), 8)
    >>> y = np.empty((1, 1, 2, 2, 8), np.float32)
    >>> run(x, y)
    >>> y[0, 0, :, :, 0]
    array([[ 5.,  7.],
           [13., 15.]], dtype=float32)
    """
    fn = "nchwc.pool_bound"
    block = _block_arg(block, fn)
    if kind not in ("max", "avg"):
        raise ValueError(f"{fn}: kind must be 'max' or 'avg', got {kind!r}")
    kh, kw = _pair(kernel, "kernel", fn)
    sh, sw = _pair(stride, "stride", fn)
    ph, pw = _pair(pads, "pads", fn)
    n, c, h, w = (int(i) for i in xshape)
    if min(kh, kw, sh, sw) < 1 or min(ph, pw) < 0:
        raise ValueError(f"{fn}: kernel {(kh, kw)}, stride {(sh, sw)} must be positive and "
                         f"pads {(ph, pw)} non-negative")
    if ph > kh // 2 or pw > kw // 2:
        raise RuntimeError(f"{fn}: pad should be at most half of effective kernel size, but "
                           f"got pad={max(ph, pw)}, kernel_size={max(kh, kw)}")
    if oshape is None:
        oh, ow = conv_output_size(h, kh, sh, ph, ph, 1), conv_output_size(w, kw, sw, pw, pw, 1)
    else:
        oh, ow = int(oshape[2]), int(oshape[3])
    if min(oh, ow) < 1:
        raise RuntimeError(f"{fn}: Given input size: ({c}x{h}x{w}). Calculated output size: "
                           f"({c}x{oh}x{ow}). Output size is too small")
    cb = -(-c // block)
    p = _Pool(n=n, cb=cb, h=h, w=w, oh=oh, ow=ow, kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw,
              block=block, isa=_isa(), kind=1 if kind == "avg" else 0,
              count_include_pad=int(bool(count_include_pad)))
    lib = _lib()
    addr = ctypes.addressof(p)
    items = int(lib.tsr_nchwc_pool_plan(addr, 1))
    if items < 0:
        raise RuntimeError(f"{fn}: the pooling of {list(xshape)} is not supported")
    xs, ys = (n, cb, h, w, block), (n, cb, oh, ow, block)

    from tessera.kernels.threadpool import _threads, split_call
    last: list = [None, None]   # weak references to the last call's arrays
    call = lib.tsr_nchwc_pool_range

    def run(x, y) -> None:
        if not (last[0] is not None and last[0]() is x and last[1]() is y and
                x.shape == xs and y.shape == ys):
            _expect(x, xs, "x", fn)
            _expect(y, ys, "y", fn)
            p.x, p.y = x.ctypes.data, y.ctypes.data
            last[:] = weakref.ref(x), weakref.ref(y)
        if _threads() < 2:
            call(addr, 0, items)
        else:
            split_call(call, (addr,), items, x.size)
    return run


def to_blocked(x: np.ndarray, block: int, out: np.ndarray | None = None) -> np.ndarray:
    """A plain ``(N, C, H, W)`` float32 array in the blocked layout ``(N, ceil(C/B), H, W,
    B)``, channels past C zero; into ``out`` when given.

    >>> to_blocked(np.ones((1, 3, 1, 2), np.float32), 8)[0, 0, 0, 0]
    array([1., 1., 1., 0., 0., 0., 0., 0.], dtype=float32)
    """
    fn = "nchwc.to_blocked"
    block = _block_arg(block, fn)
    if not isinstance(x, np.ndarray) or x.dtype != _F32 or x.ndim != 4:
        raise TypeError(f"{fn}: x must be a 4-d float32 NumPy array, got "
                        f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
    x = np.ascontiguousarray(x)
    shape = blocked_shape(x.shape, block)
    out = np.empty(shape, _F32) if out is None else _expect(out, shape, "out", fn)
    n, c, h, w = x.shape
    _lib().tsr_nchwc_to_blocked(x.ctypes.data, out.ctypes.data, n, c, h * w, block)
    return out


def from_blocked(x: np.ndarray, c: int, out: np.ndarray | None = None) -> np.ndarray:
    """A blocked ``(N, CB, H, W, B)`` array back to plain ``(N, c, H, W)`` (the first ``c``
    channels); into ``out`` when given.

    >>> from_blocked(np.ones((1, 1, 2, 2, 8), np.float32), 3).shape
    (1, 3, 2, 2)
    """
    fn = "nchwc.from_blocked"
    if not isinstance(x, np.ndarray) or x.dtype != _F32 or x.ndim != 5:
        raise TypeError(f"{fn}: x must be a 5-d float32 NumPy array, got "
                        f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
    n, cb, h, w, block = x.shape
    block = _block_arg(block, fn)
    if not (cb - 1) * block < c <= cb * block:
        raise ValueError(f"{fn}: {c} channels do not fit {cb} blocks of {block}")
    x = np.ascontiguousarray(x)
    shape = (n, c, h, w)
    out = np.empty(shape, _F32) if out is None else _expect(out, shape, "out", fn)
    _lib().tsr_nchwc_from_blocked(x.ctypes.data, out.ctypes.data, n, c, h * w, block)
    return out
