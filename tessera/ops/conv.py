"""Convolution as im2col + one GEMM per group (BLAS), for 1-d, 2-d and 3-d inputs.

Three ops carry every rule, and each one's gradient is written with the other two, so
double backward works:

    conv(x, w, b)             -> y      grads: conv_input_grad(g, w), conv_weight_grad(x, g),
                                               sum(g) for the bias
    conv_input_grad(g, w)     -> dx     (also conv_transpose's forward)
    conv_weight_grad(x, g)    -> dw

Shapes: x (N, C, *S), w (O, C/groups, *K), y (N, O, *S_out). Padding is explicit per side
(``pads`` = ((lo, hi), ...)), so 'same' padding with an even kernel works too.

The column matrix is laid out channel-major, (G, C/G * prod(K), N * prod(S_out)), so each
of the three ops is ONE large GEMM per group (BLAS threads well on one big product and
badly on N small ones); only the (N, O) <-> (O, N) transposes of the output-sized arrays
are paid on top.

>>> import tessera
>>> from tessera.ops.conv import conv
>>> conv(tessera.ones(1, 1, 4, 4), tessera.ones(1, 1, 3, 3), stride=(1, 1),
...      pads=((0, 0), (0, 0)), dilation=(1, 1), groups=1).shape
tessera.Size([1, 1, 2, 2])
"""
from __future__ import annotations

import functools
import math
import weakref

import numpy as np

from tessera._dispatch import _MODES, dispatch
from tessera._tensor import Tensor
from tessera.ops import _jax, _relax, cost
from tessera.ops._sbp import optional
from tessera.ops.registry import Meta, defop
from tessera.sbp import SbpRule, Signature, broadcast as B, partial_sum as P, split as S

__all__: list[str] = []
_Pads = tuple[tuple[int, int], ...]  # (low, high) padding per spatial dim
_strided = np.lib.stride_tricks.as_strided


def out_size(size: int, k: int, stride: int, lo: int, hi: int, dil: int) -> int:
    return (size + lo + hi - dil * (k - 1) - 1) // stride + 1


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_geometry(op: str, wshape, stride, pads, dilation) -> None:
    """Raise ``RuntimeError`` naming ``op`` unless ``stride``, ``pads`` ((low, high) per dim)
    and ``dilation`` each hold ints for the spatial dims of a weight of shape ``wshape``: the
    NumPy kernels index and pad by position, and would read a dim too few or ignore one too
    many. Every entry point of the three ops checks it (the C kernels again, in
    ``tessera.kernels.window.check_geometry``).

    >>> check_geometry("conv", (1, 1, 3, 3), (1, 1), ((0, 0), (0, 0), (0, 0)), (1, 1))
    Traceback (most recent call last):
        ...
    RuntimeError: conv: expected padding to be a list of 2 values to match the convolution
    dimensions of weight [1, 1, 3, 3], but got padding=[(0, 0), (0, 0), (0, 0)]
    """
    nd = len(wshape) - 2
    for name, vals in (("stride", stride), ("padding", pads), ("dilation", dilation)):
        if len(vals) != nd:
            raise RuntimeError(f"{op}: expected {name} to be a list of {nd} values to match "
                               f"the convolution dimensions of weight {list(wshape)}, but got "
                               f"{name}={list(vals)}")
    if not all(_is_int(v) for v in (*stride, *dilation)) or \
            not all(type(p) in (tuple, list) and len(p) == 2 and _is_int(p[0]) and _is_int(p[1])
                    for p in pads):
        raise RuntimeError(f"{op}: expected integer strides and dilations and (low, high) "
                           f"integer paddings for weight {list(wshape)}, got "
                           f"stride={list(stride)}, padding={list(pads)}, "
                           f"dilation={list(dilation)}")


def _check(op, x, w, stride, pads, dilation, groups):
    if len(w.shape) >= 3:
        check_geometry(op, w.shape, stride, pads, dilation)
    nd = len(stride)
    if len(x.shape) != nd + 2:
        raise RuntimeError(f"{op}: Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input "
                           f"to conv{nd}d, but got input of size: {list(x.shape)}")
    if len(w.shape) != nd + 2:
        raise RuntimeError(f"{op}: weight should have {nd + 2} dims, got {list(w.shape)}")
    if x.dtype is not w.dtype:
        raise RuntimeError(f"{op}: Input type ({x.dtype}) and weight type ({w.dtype}) should "
                           "be the same")
    if groups < 1:
        raise RuntimeError(f"{op}: non-positive groups is not supported")
    if w.shape[0] == 0 or w.shape[0] % groups:
        raise RuntimeError(f"{op}: Given groups={groups}, expected weight to be at least "
                           f"{groups} at dimension 0 and divisible by it, but got weight of "
                           f"size {list(w.shape)} instead")
    if x.shape[1] != w.shape[1] * groups:
        raise RuntimeError(f"{op}: Given groups={groups}, weight of size {list(w.shape)}, "
                           f"expected input{list(x.shape)} to have {w.shape[1] * groups} "
                           f"channels, but got {x.shape[1]} channels instead")
    if any(s < 1 for s in stride):
        raise RuntimeError(f"{op}: non-positive stride is not supported")
    if any(d < 1 for d in dilation):
        raise RuntimeError(f"{op}: non-positive dilation is not supported")
    # a negative high-side pad crops (conv_transpose's output_padding above the padding)
    if any(lo < 0 for lo, hi in pads):
        raise RuntimeError(f"{op}: negative padding is not supported")


def _conv_infer(x, w, b, stride, pads: _Pads, dilation, groups):
    _check("conv", x, w, stride, pads, dilation, groups)
    if b is not None:
        if len(b.shape) != 1 or b.shape[0] != w.shape[0]:
            raise RuntimeError(f"conv: Given weight of size {list(w.shape)}, expected bias to "
                               f"be 1-dimensional with {w.shape[0]} elements, but got bias of "
                               f"size {list(b.shape)} instead")
        if b.dtype is not x.dtype:
            raise RuntimeError(f"conv: Input type ({x.dtype}) and bias type ({b.dtype}) should "
                               "be the same")
    spatial = []
    for i, s in enumerate(x.shape[2:]):
        k = w.shape[2 + i]
        padded = s + pads[i][0] + pads[i][1]
        if padded < dilation[i] * (k - 1) + 1:
            raise RuntimeError(f"conv: Calculated padded input size per channel: {padded} at "
                               f"spatial dim {i}. Kernel size: {dilation[i] * (k - 1) + 1}. "
                               "Kernel size can't be greater than actual input size")
        spatial.append(out_size(s, k, stride[i], *pads[i], dilation[i]))
    if _MODES and groups == 1 and w.dtype is x.dtype:
        _prefetch("forward", tuple(x.shape), tuple(w.shape), stride, pads, dilation, x.dtype)
    return Meta((x.shape[0], w.shape[0]) + tuple(spatial), x.dtype)


# ---- im2col / col2im on NumPy arrays (shared with pooling and nn.functional.unfold) ----

def pad_array(x: np.ndarray, pads, value=0) -> np.ndarray:
    """Pad the trailing ``len(pads)`` dims of ``x`` by ((lo, hi), ...) with ``value``;
    negative sizes crop."""
    if not any(lo or hi for lo, hi in pads):
        return x
    nl = x.ndim - len(pads)
    if any(lo < 0 or hi < 0 for lo, hi in pads):
        x = x[(slice(None),) * nl + tuple(slice(max(-lo, 0), n - max(-hi, 0)) for (lo, hi), n
                                          in zip(pads, x.shape[nl:]))]
        pads = tuple((max(lo, 0), max(hi, 0)) for lo, hi in pads)
        if not any(lo or hi for lo, hi in pads):
            return x
    return np.pad(x, ((0, 0),) * nl + tuple(tuple(p) for p in pads), constant_values=value)


def window_view(xp: np.ndarray, ksize, out_spatial, stride, dilation,
                kernel_last: bool = False) -> np.ndarray:
    """(A, B, *Sp) padded array -> a strided view of every window, (A, B, *K, *S_out)
    (or (A, B, *S_out, *K) with ``kernel_last``). No copy."""
    nd = len(ksize)
    st = xp.strides
    kst = tuple(st[2 + i] * dilation[i] for i in range(nd))
    ost = tuple(st[2 + i] * stride[i] for i in range(nd))
    if kernel_last:
        shape = xp.shape[:2] + tuple(out_spatial) + tuple(ksize)
        strides = st[:2] + ost + kst
    else:
        shape = xp.shape[:2] + tuple(ksize) + tuple(out_spatial)
        strides = st[:2] + kst + ost
    return _strided(xp, shape, strides, writeable=False)


def offset_slices(offs, out_spatial, stride, dilation) -> tuple:
    """The slice of a padded (A, B, *Sp) array read by kernel offset ``offs`` of every
    window (one strided slice per spatial dim)."""
    return (slice(None), slice(None)) + tuple(
        slice(o * d, o * d + s * (n - 1) + 1, s)
        for o, n, s, d in zip(offs, out_spatial, stride, dilation))


def col2im_add(dst: np.ndarray, cols: np.ndarray, ksize, out_spatial, stride, dilation):
    """Add (A, B, *K, *S_out) window values into the padded (A, B, *Sp) ``dst``.

    One vectorised add per kernel offset: the windows at a fixed offset never overlap."""
    if 0 in out_spatial:
        return dst
    for offs in np.ndindex(*ksize):
        dst[offset_slices(offs, out_spatial, stride, dilation)] += \
            cols[(slice(None), slice(None)) + offs]
    return dst


def crop(xp: np.ndarray, pads, spatial) -> np.ndarray:
    return xp[(slice(None), slice(None)) + tuple(slice(lo, lo + s)
                                                 for (lo, _), s in zip(pads, spatial))]


def _out_spatial(xs, ks, stride, pads: _Pads, dilation) -> tuple[int, ...]:
    return tuple(out_size(s, ks[i], stride[i], *pads[i], dilation[i])
                 for i, s in enumerate(xs[2:]))


def _cols(x, ksize, out_sp, stride, pads, dilation, groups):
    """The channel-major im2col matrix (G, C/G * prod(K), N * prod(S_out)), contiguous."""
    n, c = x.shape[:2]
    nd = len(ksize)
    win = window_view(pad_array(x, pads), ksize, out_sp, stride, dilation)
    # (N, C, *K, *S_out) -> (C, *K, N, *S_out): the copy is the im2col
    perm = (1,) + tuple(range(2, 2 + nd)) + (0,) + tuple(range(2 + nd, 2 + 2 * nd))
    cols = np.ascontiguousarray(win.transpose(perm))
    return cols.reshape(groups, (c // groups) * int(np.prod(ksize)), n * int(np.prod(out_sp)))


def _gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Grouped product (G, m, k) @ (G, k, n); a single 2-D GEMM when G == 1."""
    if a.shape[0] == 1:
        return (a[0] @ b[0])[None]
    return np.matmul(a, b)


def _channel_major(g: np.ndarray, groups: int) -> np.ndarray:
    """(N, O, *S) -> (G, O/G, N * prod(S)) contiguous."""
    n, o = g.shape[:2]
    return np.ascontiguousarray(np.swapaxes(g, 0, 1)).reshape(groups, o // groups, -1)


def _native(x, w, groups) -> bool:
    """2-d, ungrouped, float32/64 convolutions run image by image on the C im2col/col2im of
    ``tessera.kernels.window``: one image's column buffer stays in cache between im2col and
    its GEMM (faster than one batch-wide buffer). With NumPy's OpenBLAS the C drivers
    of ``tessera.kernels.conv`` run it, images split across the kernel
    threads, each calling BLAS single-threaded; else a Python loop with threaded BLAS. Per-
    image GEMMs round differently from a batch-wide one (equally accurate). Small stride-1
    ones (``_direct``), whose GEMMs would be skinny, run as direct C convolutions instead,
    and 3x3 stride-1 ones with many channels (``_winograd``) as Winograd."""
    if x.ndim != 4 or groups != 1 or x.dtype != w.dtype or 0 in x.shape or 0 in w.shape:
        return False
    from tessera.kernels import window as kernels
    return kernels.available(x.dtype)


def _lows(pads) -> tuple:
    return tuple(lo for lo, _ in pads)


def _conv_per_image(x, w, b, stride, pads, dilation, out_sp, y=None):
    """Into ``y`` (a new array when None; C-contiguous): each image's GEMM, then its bias
    while that image's output is still in cache."""
    from tessera.kernels.conv import conv2d_threaded
    from tessera.kernels.window import im2col
    n, o = x.shape[0], w.shape[0]
    p = int(np.prod(out_sp))
    x = np.ascontiguousarray(x)
    wm = np.ascontiguousarray(w.reshape(o, -1))
    if y is None:
        y = np.empty((n, o) + tuple(out_sp), x.dtype)
    path = _path("forward", x.shape, w.shape, stride, pads, dilation, out_sp, x.dtype)
    if path == "direct":
        from tessera.kernels.direct_conv import conv2d_direct
        b = None if b is None else np.ascontiguousarray(b, x.dtype)
        conv2d_direct(x, np.ascontiguousarray(w), b, _lows(pads), dilation, y)
        return y
    if path == "winograd":
        from tessera.kernels.winograd import conv2d_winograd
        b = None if b is None else np.ascontiguousarray(b, x.dtype)
        conv2d_winograd(x, np.ascontiguousarray(w), b, _lows(pads), y)
        return y
    if path == "threaded":
        # batch 1 too (its rows or channels split over the threads): a BLAS-threaded GEMM
        # per image leaves OpenBLAS's worker spinning into the next kernels, and on a busy
        # host each such GEMM waits for a descheduled worker (bench models: resnet18 infer b1)
        b = None if b is None else np.ascontiguousarray(b, x.dtype)
        conv2d_threaded(x, np.ascontiguousarray(w), b, stride, _lows(pads), dilation, y)
        return y
    bias = None if b is None else b.reshape(o, 1).astype(y.dtype, copy=False)
    # small outputs (late layers) make skinny GEMMs BLAS runs slowly: a few images' columns
    # side by side make one wider GEMM (bench models: resnet18 infer b8)
    group = min(n, max(1, _WIDE_GEMM // p))
    cols = np.empty((wm.shape[1], group * p), x.dtype)
    if group == 1:
        for i in range(n):
            im2col(x[i], cols, w.shape[2:], stride, _lows(pads), dilation, out_sp)
            yi = y[i].reshape(o, p)
            np.matmul(wm, cols, out=yi)
            if bias is not None:
                yi += bias
        return y
    yg = np.empty((o, group * p), x.dtype)
    for s in range(0, n, group):
        g = min(group, n - s)
        for j in range(g):
            im2col(x[s + j], cols[:, j * p:(j + 1) * p], w.shape[2:], stride, _lows(pads),
                   dilation, out_sp)
        part = np.matmul(wm, cols[:, :g * p], out=yg[:, :g * p] if g == group else None)
        dst = y[s:s + g].reshape(g, o, p)
        src = part.reshape(o, g, p).transpose(1, 0, 2)
        if bias is None:
            np.copyto(dst, src)
        else:
            np.add(src, bias, out=dst)
    return y


_WIDE_GEMM = 1024  # columns per convolution GEMM worth grouping images for


def _winograd(xshape, wshape, stride, dilation, out_sp: tuple[int, int], dtype, lows=(0, 0),
              weight_grad: bool = False) -> bool:
    """Whether a 2-d ungrouped convolution (``_native``) runs as Winograd F(2x2, 3x3)
    (``tessera.kernels.winograd``): 3x3, stride 1, dilation 1, and the measured rule of
    ``winograd.chosen`` (``chosen_weight_grad`` for its weight gradient). ``lows``: the
    input gradient's low paddings, each at most 2 (its convolution pads by 2 - p)."""
    if tuple(wshape[2:]) != (3, 3) or tuple(stride) != (1, 1) or tuple(dilation) != (1, 1) \
            or max(lows) > 2:
        return False
    from tessera.kernels import winograd
    rule = winograd.chosen_weight_grad if weight_grad else winograd.chosen
    return rule(xshape[0], xshape[1], wshape[0], *out_sp, dtype)


def _direct(xshape, wshape: tuple[int, int, int, int], stride, out_sp: tuple[int, int], dtype,
            kind: str = "forward") -> bool:
    """Whether the ``kind`` ("forward", "input_grad", "weight_grad") of a 2-d ungrouped
    convolution (``_native``) of ``xshape`` with filters ``wshape`` (the layer's shapes)
    runs as the direct C convolution of ``tessera.kernels.direct_conv``: stride 1 and the
    measured rule of ``direct_conv.chosen``."""
    if tuple(stride) != (1, 1):
        return False
    from tessera.kernels import direct_conv
    return direct_conv.chosen(xshape[0], xshape[1], wshape[0], *out_sp, *wshape[2:], dtype,
                              kind)


def _path(kind: str, xshape, wshape, stride, pads, dilation, out_sp, dtype) -> str | None:
    """Which C kernel the ``kind`` ("forward", "input_grad", "weight_grad") of a 2-d
    ungrouped convolution of ``xshape`` with filters ``wshape``, giving ``out_sp``, runs:
    "direct", "winograd" or "threaded" (the first that applies), or None (the NumPy loop).
    The input gradient of a stride-1 3x3 convolution is one too: g (N, O) -> dx (N, C)."""
    from tessera.kernels.conv import threaded
    if _direct(xshape, wshape, stride, out_sp, dtype, kind):
        return "direct"
    if kind == "input_grad":
        wino = _winograd((xshape[0], wshape[0], *out_sp), (wshape[1], wshape[0], *wshape[2:]),
                         stride, dilation, xshape[2:], dtype, _lows(pads))
    else:
        wino = _winograd(xshape, wshape, stride, dilation, out_sp, dtype,
                         weight_grad=kind == "weight_grad")
    if wino:
        return "winograd"
    return "threaded" if threaded(dtype) else None


@functools.lru_cache(maxsize=256)
def _prefetch(kind: str, xshape: tuple[int, int, int, int], wshape: tuple, stride, pads: _Pads,
              dilation, dtype) -> None:
    """Start compiling, in the background, the C kernel that the ``kind`` ("forward",
    "input_grad", "weight_grad") of an ungrouped convolution of ``xshape`` with filters
    ``wshape`` will run where ``_native``'s 2-d paths take it. Called by the infer rules
    while a dispatch mode (a graph's tracer) is active: a graph's convolution kernels then
    compile side by side at trace time, beside the graph's other compiles, instead of one
    after another as its first step reaches them. (Eagerly the kernel runs right after its
    infer: nothing to gain, and a meta-device model would compile for nothing.)"""
    from tessera.kernels import conv as conv_kernels, direct_conv, window as kernels, winograd
    dt = dtype.np
    if len(xshape) != 4 or 0 in xshape or 0 in wshape or dt is None \
            or not kernels.available(dt):
        return
    out_sp = _out_spatial(xshape, wshape[2:], stride, pads, dilation)
    if 0 in out_sp:
        return
    (n, c, *in_sp), o = xshape, wshape[0]
    path = _path(kind, xshape, wshape, stride, pads, dilation, out_sp, dt)
    if path == "direct":
        direct_conv.prefetch(kind, c, o, wshape[2:], out_sp, in_sp, dilation, dt)
    elif path == "winograd" and kind == "input_grad":
        winograd.prefetch("forward", n, o, c, *xshape[2:], dt)   # g (N, O) -> dx (N, C)
    elif path == "winograd":
        oh, ow = out_sp
        winograd.prefetch(kind, n, c, o, oh, ow, dt)
    elif path == "threaded":
        conv_kernels.prefetch({"forward": "fwd", "input_grad": "igrad",
                               "weight_grad": "wgrad"}[kind], dt)


def _depthwise(x, w, groups) -> bool:
    """2-d depthwise convolutions (one filter per channel) run as a direct C stencil."""
    if x.ndim != 4 or groups == 1 or groups != x.shape[1] or w.shape[0] != groups \
            or x.dtype != w.dtype or 0 in x.shape:
        return False
    from tessera.kernels import window as kernels
    return kernels.available(x.dtype)


def conv_into(out, x, w, b, stride, pads, dilation, groups) -> None:
    """``conv``'s kernel writing into ``out`` (the graph executor's arena buffer), which may
    be ``x``'s own buffer: the memory plan hands a dying input's buffer to an output of its
    shape."""
    check_geometry("conv", w.shape, stride, pads, dilation)
    out_sp = out.shape[2:]
    if 0 not in out_sp and out.flags.c_contiguous:
        if np.may_share_memory(out, x) and (_native(x, w, groups) or _depthwise(x, w, groups)):
            # the C kernels read windows of x around outputs they have already written
            # (Winograd's and split images' items, stencils): they read a copy instead
            x = _private_copy(x)
        if _native(x, w, groups):
            _conv_per_image(x, w, b, stride, pads, dilation, out_sp, out)
            return
        if _depthwise(x, w, groups):
            from tessera.kernels.window import depthwise_conv2d
            depthwise_conv2d(np.ascontiguousarray(x), w, b, stride, _lows(pads), dilation,
                             out_sp, out)
            return
    np.copyto(out, _conv_kernel(x, w, b, stride, pads, dilation, groups))


# the graph's memory plan gives conv's output no input's buffer (tessera/graph/memory.py):
# the copy above then only guards other callers
conv_into.reads_around = True  # type: ignore[attr-defined]  # read by the executor


def conv_into_bound(x: Meta, w: Meta, b: Meta | None, out: Meta, stride, pads, dilation,
                    groups):
    """``conv_into`` for one node's input and output metas (a compiled graph's): the kernel
    it would choose on every call, chosen once, with its plan and checks made once
    (``conv2d_threaded_bound``, ``depthwise_conv2d_bound``); ``conv_into`` itself where no
    bound form applies. Called as ``fn(out, x, w, b)``: ``bound_attrs`` tells the executor
    to pass no attributes.

    >>> import numpy as np
    >>> from tessera import _dtype as D
    >>> m = lambda *s: Meta(s, D.float32)
    >>> fn = conv_into_bound(m(1, 2, 4, 4), m(2, 1, 3, 3), None, m(1, 2, 4, 4), (1, 1),
    ...                      ((1, 1), (1, 1)), (1, 1), 2)
    >>> y = np.empty((1, 2, 4, 4), np.float32)
    >>> fn(y, np.ones((1, 2, 4, 4), np.float32), np.ones((2, 1, 3, 3), np.float32), None)
    >>> y[0, 0, 1]
    array([6., 9., 9., 6.], dtype=float32)
    """
    def generic(y, xa, wa, ba) -> None:
        conv_into(y, xa, wa, ba, stride, pads, dilation, groups)
    generic.reads_around = True  # type: ignore[attr-defined]  # as conv_into's
    generic.bound_attrs = True  # type: ignore[attr-defined]
    dt = x.dtype.np
    out_sp = tuple(out.shape[2:])
    if len(x.shape) != 4 or dt is None or w.dtype is not x.dtype or out.dtype is not x.dtype \
            or b is not None and b.dtype is not x.dtype or 0 in x.shape or 0 in w.shape \
            or 0 in out_sp:
        return generic
    from tessera.kernels import conv as conv_kernels, window
    if not window.available(dt):
        return generic
    if groups == 1 and _path("forward", x.shape, w.shape, stride, pads, dilation, out_sp,
                             dt) == "threaded":
        kernel = conv_kernels.conv2d_threaded_bound(x.shape, w.shape, stride, _lows(pads),
                                                    dilation, out_sp, dt)
    elif groups > 1 and groups == x.shape[1] and w.shape[0] == groups:
        kernel = window.depthwise_conv2d_bound(x.shape, w.shape, stride, _lows(pads),
                                               dilation, out_sp, dt)
    else:
        return generic
    # the last (x, out) pair, held weakly (cc.addresses), and whether they overlap
    seen: list = [lambda: None, lambda: None, False]

    def bound(y, xa, wa, ba) -> None:
        if not (xa.flags.c_contiguous and wa.flags.c_contiguous and y.flags.c_contiguous):
            conv_into(y, xa, wa, ba, stride, pads, dilation, groups)
            return
        if seen[0]() is not xa or seen[1]() is not y:
            seen[:] = [weakref.ref(xa), weakref.ref(y), np.may_share_memory(y, xa)]
        if seen[2]:  # the stencils and im2col read windows of x around written outputs
            xa = _private_copy(xa)
        kernel(xa, wa, ba, y)
    bound.reads_around = True  # type: ignore[attr-defined]
    bound.bound_attrs = True  # type: ignore[attr-defined]
    return bound


def _private_copy(x: np.ndarray) -> np.ndarray:
    """A copy of ``x`` in a reusable per-thread buffer (no allocation per call)."""
    from tessera.kernels.conv import _workspace
    buf = _workspace(x.size, x.dtype, "conv_input")[:x.size].reshape(x.shape)
    np.copyto(buf, x)
    return buf


def _input_grad_per_image(g, w, input_shape, stride, pads, dilation):
    from tessera.kernels.conv import conv2d_input_grad_threaded
    from tessera.kernels.window import col2im
    n, o = g.shape[:2]
    out_sp = g.shape[2:]
    p = int(np.prod(out_sp))
    dx = np.empty(tuple(input_shape), g.dtype)
    path = _path("input_grad", input_shape, w.shape, stride, pads, dilation, out_sp, g.dtype)
    if path == "direct":
        from tessera.kernels.direct_conv import conv2d_input_grad_direct
        conv2d_input_grad_direct(np.ascontiguousarray(g), np.ascontiguousarray(w),
                                 _lows(pads), dilation, dx)
        return dx
    if path == "winograd":
        from tessera.kernels.winograd import conv2d_input_grad_winograd
        conv2d_input_grad_winograd(np.ascontiguousarray(g), np.ascontiguousarray(w),
                                   _lows(pads), dx)
        return dx
    if path == "threaded":
        conv2d_input_grad_threaded(np.ascontiguousarray(g), np.ascontiguousarray(w), stride,
                                   _lows(pads), dilation, dx)
        return dx
    wt = np.ascontiguousarray(w.reshape(o, -1).T)                # (C*K, O)
    g2 = np.ascontiguousarray(g).reshape(n, o, p)
    gcols = np.empty((wt.shape[0], p), g.dtype)
    for i in range(n):
        np.matmul(wt, g2[i], out=gcols)
        col2im(gcols, dx[i], w.shape[2:], stride, _lows(pads), dilation, out_sp)
    return dx


def _weight_grad_per_image(x, g, weight_shape, stride, pads, dilation):
    from tessera.kernels.conv import conv2d_weight_grad_threaded
    from tessera.kernels.window import im2col
    n, o = g.shape[:2]
    out_sp = g.shape[2:]
    p = int(np.prod(out_sp))
    x = np.ascontiguousarray(x)
    path = _path("weight_grad", x.shape, weight_shape, stride, pads, dilation, out_sp,
                 x.dtype)
    if path == "direct":
        from tessera.kernels.direct_conv import conv2d_weight_grad_direct
        return conv2d_weight_grad_direct(x, np.ascontiguousarray(g), tuple(weight_shape),
                                         _lows(pads), dilation)
    if path == "winograd":
        from tessera.kernels.winograd import conv2d_weight_grad_winograd
        return conv2d_weight_grad_winograd(x, np.ascontiguousarray(g), _lows(pads))
    if path == "threaded":
        return conv2d_weight_grad_threaded(x, np.ascontiguousarray(g), tuple(weight_shape),
                                           stride, _lows(pads), dilation)
    g2 = np.ascontiguousarray(g).reshape(n, o, p)
    ck = int(np.prod(weight_shape[1:]))
    cols = np.empty((ck, p), x.dtype)
    gw = np.zeros((o, ck), x.dtype)
    part = np.empty((o, ck), x.dtype)
    for i in range(n):
        im2col(x[i], cols, weight_shape[2:], stride, _lows(pads), dilation, out_sp)
        np.matmul(g2[i], cols.T, out=part)
        gw += part
    return gw.reshape(weight_shape)


def _conv_kernel(x, w, b, stride, pads, dilation, groups):
    check_geometry("conv", w.shape, stride, pads, dilation)
    n, o = x.shape[0], w.shape[0]
    ksize = w.shape[2:]
    out_sp = _out_spatial(x.shape, ksize, stride, pads, dilation)
    if _native(x, w, groups) and 0 not in out_sp:
        return _conv_per_image(x, w, b, stride, pads, dilation, out_sp)
    if _depthwise(x, w, groups) and 0 not in out_sp:
        from tessera.kernels.window import depthwise_conv2d
        return depthwise_conv2d(np.ascontiguousarray(x), w, b, stride, _lows(pads), dilation,
                                out_sp)
    cols = _cols(x, ksize, out_sp, stride, pads, dilation, groups)
    ym = _gemm(w.reshape(groups, o // groups, -1), cols)         # (G, O/G, N*P)
    ym = ym.reshape((o, n) + tuple(out_sp))
    y = np.empty((n, o) + tuple(out_sp), ym.dtype)
    yt = np.swapaxes(ym, 0, 1)
    if b is None:
        np.copyto(y, yt)
    else:  # the transpose copy and the bias add in one pass
        np.add(yt, b.reshape((1, o) + (1,) * len(out_sp)).astype(ym.dtype, copy=False), out=y)
    return y


def _attrs(ctx):
    a = ctx.attrs
    return dict(stride=a["stride"], pads=a["pads"], dilation=a["dilation"], groups=a["groups"])


def _conv_grad(ctx, g):
    x, w, b = ctx.inputs
    need = ctx.needs_input_grad
    a = _attrs(ctx)
    gx = conv_input_grad(g, w, input_shape=tuple(x.shape), **a) if need[0] else None
    gw = conv_weight_grad(x, g, weight_shape=tuple(w.shape), **a) if need[1] else None
    gb = None
    if b is not None and need[2]:
        from tessera.ops.reduce import sum as _sum
        gb = _sum(g, (0,) + tuple(range(2, g.dim())))
    return gx, gw, gb


def _conv_sbp(x, w, b, stride, pads, dilation, groups):
    """Batch split with broadcast weights (data parallel); output channels split with the
    weight (and bias) split on dim 0; input channels split with the weight split on dim 1,
    giving partial_sum (groups == 1); partial_sum input or weight (conv is linear in each)."""
    sigs = [Signature((S(0), B, optional(b, B)), (S(0),))]
    if groups == 1:
        sigs += [Signature((B, S(0), optional(b, S(0))), (S(1),)),
                 Signature((S(1), S(1), optional(b, P)), (P,))]
    return sigs + [Signature((P, B, optional(b, P)), (P,)),
                   Signature((B, P, optional(b, P)), (P,)),
                   Signature((B, B, optional(b, B)), (B,))]


def _macs(g: Meta, weight_shape) -> int:
    """Multiply-adds of a convolution whose output (or output gradient) is ``g``: each of
    its elements is a dot product over C/groups * prod(K) inputs. Its two gradients are the
    same products read backwards, so they do exactly as many."""
    return cost.numel(g) * math.prod(max(int(d), 0) for d in weight_shape[1:])


def _conv_cost(ins, outs, **attrs) -> cost.Cost:
    x, w, b = ins[:3]
    flops = 2 * _macs(outs[0], w.shape) + (cost.numel(outs[0]) if b is not None else 0)
    return cost.Cost(flops, *cost.io(ins, outs))


_CONV = defop("conv", _conv_infer, _conv_kernel, grad=_conv_grad, sbp=SbpRule(_conv_sbp),
              cost=_conv_cost, to_relax=_relax.conv, to_jax=_jax.conv)


def conv(x: Tensor, w: Tensor, b: Tensor | None = None, *, stride, pads, dilation,
         groups) -> Tensor:
    """N-d convolution (optional bias) with explicit per-side padding."""
    return dispatch(_CONV, x, w, b, stride=tuple(stride), pads=tuple(map(tuple, pads)),
                    dilation=tuple(dilation), groups=int(groups))


# ---- a convolution with its elementwise epilogue (inference graphs) ---------------------

# the activations the epilogue applies: relu, and clamp to bounds (relu6, hardtanh)
POINTWISE_ACTS = (None, "relu", "clamp")


def epilogue_fusable(xshape, wshape, stride, pads, dilation, groups, xdtype, wdtype) -> bool:
    """Whether a convolution of these shapes and dtypes (tessera dtypes) runs on the C
    drivers that apply ``conv_pointwise``'s epilogue in cache (2-d, ungrouped, the im2col
    or Winograd drivers): where the graph pass ``conv_epilogue`` makes one.

    >>> from tessera import float32
    >>> epilogue_fusable((1, 8, 9, 9), (8, 8, 1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1,
    ...                  float32, float32) in (True, False)
    True
    """
    dt = xdtype.np
    if len(xshape) != 4 or len(wshape) != 4 or groups != 1 or xdtype is not wdtype or \
            dt not in (np.float32, np.float64) or 0 in xshape or 0 in wshape:
        return False
    from tessera.kernels import window as kernels
    if not kernels.available(dt):
        return False
    out_sp = _out_spatial(xshape, wshape[2:], stride, pads, dilation)
    if 0 in out_sp or any(s <= 0 for s in out_sp):
        return False
    return _path("forward", tuple(xshape), tuple(wshape), stride, pads, dilation, out_sp,
                 dt) in ("threaded", "winograd")


def _pointwise_infer(x, w, b, r, stride, pads, dilation, groups, activation, bounds,
                     residual_first):
    out = _conv_infer(x, w, b, stride, pads, dilation, groups)
    if activation not in POINTWISE_ACTS:
        raise RuntimeError(f"conv_pointwise: activation must be one of {POINTWISE_ACTS}, "
                           f"got {activation!r}")
    if activation == "clamp" and not (len(bounds) == 2 and bounds[0] <= bounds[1]):
        raise RuntimeError(f"conv_pointwise: clamp needs bounds (lo, hi), lo <= hi, got "
                           f"{bounds!r}")
    if r is not None and (tuple(r.shape) != tuple(out.shape) or r.dtype is not out.dtype):
        raise RuntimeError(f"conv_pointwise: the residual must be {out.dtype} of the output's "
                           f"shape {list(out.shape)}, got {r.dtype} {list(r.shape)}")
    return out


def _epilogue_numpy(y: np.ndarray, r, activation, bounds, residual_first) -> None:
    """The epilogue on ``y`` in place, in NumPy (the paths without it in C)."""
    if r is not None and residual_first:
        y += r
    if activation == "relu":
        np.maximum(y, 0, out=y)
    elif activation == "clamp":
        np.clip(y, bounds[0], bounds[1], out=y)
    if r is not None and not residual_first:
        y += r


def conv_pointwise_into(out, x, w, b, r, stride, pads, dilation, groups, activation, bounds,
                        residual_first) -> None:
    """``conv_pointwise``'s kernel writing into ``out``: a 2-d ungrouped convolution on the
    im2col or Winograd drivers applies the epilogue to each item's output while it is in
    cache (through tessera's GEMM epilogue where that runs the products); any other
    convolution runs as ``conv`` and then the epilogue in NumPy."""
    check_geometry("conv_pointwise", w.shape, stride, pads, dilation)
    if r is not None and np.may_share_memory(out, r):
        r = r.copy()  # the products write tiles of out before reading r's
    out_sp = out.shape[2:]
    path = None
    if 0 not in out_sp and out.flags.c_contiguous and _native(x, w, groups):
        path = _path("forward", x.shape, w.shape, stride, pads, dilation, out_sp, x.dtype)
    if path in ("threaded", "winograd"):
        from tessera.kernels.conv import conv2d_threaded, epilogue
        if np.may_share_memory(out, x):
            x = _private_copy(x)
        x, w = np.ascontiguousarray(x), np.ascontiguousarray(w)
        b = None if b is None else np.ascontiguousarray(b, x.dtype)
        r = None if r is None else np.ascontiguousarray(r, x.dtype)
        e = epilogue(out, activation, bounds, r, residual_first)
        if path == "winograd":
            from tessera.kernels.winograd import conv2d_winograd
            conv2d_winograd(x, w, b, _lows(pads), out, e)
        else:
            conv2d_threaded(x, w, b, stride, _lows(pads), dilation, out, e)
        return
    conv_into(out, x, w, b, stride, pads, dilation, groups)
    _epilogue_numpy(out, r, activation, bounds, residual_first)


# the memory plan gives the output no input's buffer: the products write tiles of it while
# windows of x and elements of the residual around them are still to be read
conv_pointwise_into.reads_around = True  # type: ignore[attr-defined]  # read by the executor


def _pointwise_kernel(x, w, b, r, stride, pads, dilation, groups, activation, bounds,
                      residual_first):
    out_sp = _out_spatial(x.shape, w.shape[2:], stride, pads, dilation)
    y = np.empty((x.shape[0], w.shape[0]) + tuple(out_sp), np.result_type(x, w))
    conv_pointwise_into(y, x, w, b, r, stride, pads, dilation, groups, activation, bounds,
                        residual_first)
    return y


def _pointwise_sbp(x, w, b, r, stride, pads, dilation, groups, activation, bounds,
                   residual_first):
    """Batch split with broadcast weights, or everything broadcast."""
    return [Signature((S(0), B, optional(b, B), optional(r, S(0))), (S(0),)),
            Signature((B, B, optional(b, B), optional(r, B)), (B,))]


def _pointwise_cost(ins, outs, **attrs) -> cost.Cost:
    c = _conv_cost(ins[:3], outs, **attrs)
    n = cost.numel(outs[0])
    extra = n * ((attrs["activation"] is not None) + (ins[3] is not None))
    return cost.Cost(c.flops + extra, *cost.io(ins, outs))


_CONV_POINTWISE = defop(
    "conv_pointwise", _pointwise_infer, _pointwise_kernel, grad=None,
    sbp=SbpRule(_pointwise_sbp), cost=_pointwise_cost, traits={"out_form"},
    inplace_kernels={"cpu": conv_pointwise_into}, to_jax=_jax.conv_pointwise,
    to_relax=_relax.conv_pointwise)


def conv_pointwise(x: Tensor, w: Tensor, b: Tensor | None = None, r: Tensor | None = None, *,
                   stride, pads, dilation, groups, activation: str | None = None,
                   bounds=(0.0, 0.0), residual_first: bool = False) -> Tensor:
    """``act(conv(x, w, b) [+ r]) [+ r]`` as one op: the convolution with its elementwise
    epilogue (PyTorch's ``mkldnn._convolution_pointwise``), which inference graphs make of
    a convolution and the activation and residual add after it
    (``tessera.graph.passes.conv_epilogue``). ``activation``: None, ``"relu"`` or
    ``"clamp"`` (to ``bounds``: ReLU6, hardtanh); the residual ``r`` (the output's shape)
    is added inside the activation with ``residual_first``, else after it.

    >>> import tessera
    >>> conv_pointwise(tessera.ones(1, 1, 3, 3), tessera.ones(1, 1, 1, 1), tessera.ones(1),
    ...                stride=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1), groups=1,
    ...                activation="clamp", bounds=(0.0, 1.5)).flatten().tolist()[:3]
    [1.5, 1.5, 1.5]
    """
    return dispatch(_CONV_POINTWISE, x, w, b, r, stride=tuple(stride),
                    pads=tuple(map(tuple, pads)), dilation=tuple(dilation), groups=int(groups),
                    activation=activation, bounds=tuple(float(v) for v in bounds),
                    residual_first=bool(residual_first))


# ---- gradient with respect to the input (= transposed convolution) ------------------

def _input_grad_infer(g, w, input_shape, stride, pads, dilation, groups):
    op = "conv_transpose"
    if len(w.shape) >= 3:
        check_geometry(op, w.shape, stride, pads, dilation)
    if g.dtype is not w.dtype:
        raise RuntimeError(f"{op}: Input type ({g.dtype}) and weight type ({w.dtype}) should "
                           "be the same")
    if len(g.shape) != len(w.shape) or len(input_shape) != len(g.shape) or len(g.shape) < 3:
        raise RuntimeError(f"{op}: expected input of {len(w.shape)} dims, got {list(g.shape)}")
    if groups < 1 or w.shape[0] % groups:
        raise RuntimeError(f"{op}: Given groups={groups}, expected weight to be divisible by "
                           f"{groups} at dimension 0, but got weight of size {list(w.shape)}")
    if g.shape[1] != w.shape[0]:
        raise RuntimeError(f"{op}: Given transposed=1, weight of size {list(w.shape)}, "
                           f"expected input{list(g.shape)} to have {w.shape[0]} channels, "
                           f"but got {g.shape[1]} channels instead")
    if input_shape[1] != w.shape[1] * groups or input_shape[0] != g.shape[0]:
        raise RuntimeError(f"{op}: output shape {list(input_shape)} does not match weight "
                           f"{list(w.shape)} with groups={groups}")
    if any(s <= 0 for s in input_shape[2:]):
        raise RuntimeError(f"{op}: Given input size per channel: {list(g.shape[2:])}. "
                           f"Calculated output size per channel: {list(input_shape[2:])}. "
                           "Output size is too small")
    expect = _out_spatial(input_shape, w.shape[2:], stride, pads, dilation)
    if expect != tuple(g.shape[2:]):
        raise RuntimeError(f"{op}: an input of spatial size {list(g.shape[2:])} cannot give "
                           f"an output of spatial size {list(input_shape[2:])}")
    if _MODES and groups == 1:
        _prefetch("input_grad", tuple(input_shape), tuple(w.shape), stride, pads, dilation,
                  g.dtype)
    return Meta(tuple(input_shape), g.dtype)


def _input_grad_kernel(g, w, input_shape, stride, pads, dilation, groups):
    check_geometry("conv_transpose", w.shape, stride, pads, dilation)
    n, o = g.shape[:2]
    out_sp = g.shape[2:]
    ksize = w.shape[2:]
    nd = len(ksize)
    c = input_shape[1]
    wm = w.reshape(groups, o // groups, -1)                        # (G, O/G, C/G*K)
    if _native(g, w, groups) and 0 not in input_shape:
        return _input_grad_per_image(g, w, input_shape, stride, pads, dilation)
    gcols = _gemm(np.swapaxes(wm, 1, 2), _channel_major(g, groups))  # (G, C/G*K, N*P)
    gcols = gcols.reshape((c,) + tuple(ksize) + (n,) + tuple(out_sp))
    # (C, *K, N, *S_out) viewed as (C, N, *K, *S_out); accumulate in (C, N, *Sp)
    gcols = np.moveaxis(gcols, 1 + nd, 1)
    padded = tuple(s + lo + max(hi, 0) for s, (lo, hi) in zip(input_shape[2:], pads))
    dxp = col2im_add(np.zeros((c, n) + padded, gcols.dtype), gcols, ksize, out_sp, stride,
                     dilation)
    dx = crop(dxp, pads, input_shape[2:])
    return np.ascontiguousarray(np.swapaxes(dx, 0, 1))


def _input_grad_grad(ctx, gg):
    g, w = ctx.inputs
    need = ctx.needs_input_grad
    a = _attrs(ctx)
    d_g = conv(gg, w, **a) if need[0] else None
    d_w = conv_weight_grad(gg, g, weight_shape=tuple(w.shape), **a) if need[1] else None
    return d_g, d_w


def _input_grad_sbp(g, w, input_shape, stride, pads, dilation, groups):
    """conv's signatures read backwards: g's output channels split with the weight's dim 0
    gives partial_sum; the weight's input channels split give dx split on its channels."""
    sigs = [Signature((S(0), B), (S(0),))]
    if groups == 1:
        sigs += [Signature((S(1), S(0)), (P,)), Signature((B, S(1)), (S(1),))]
    return sigs + [Signature((P, B), (P,)), Signature((B, P), (P,)), Signature((B, B), (B,))]


def _input_grad_cost(ins, outs, **attrs) -> cost.Cost:
    g, w = ins[:2]
    return cost.Cost(2 * _macs(g, w.shape), *cost.io(ins, outs))


_CONV_INPUT_GRAD = defop("conv_input_grad", _input_grad_infer, _input_grad_kernel,
                         grad=_input_grad_grad,
                         sbp=SbpRule(_input_grad_sbp, shape_attrs=("input_shape",)),
                         cost=_input_grad_cost,
                         to_relax=_relax.conv_input_grad, to_jax=_jax.conv_input_grad)


def conv_input_grad(g: Tensor, w: Tensor, *, input_shape, stride, pads, dilation,
                    groups) -> Tensor:
    """d conv / d input applied to ``g``; with a transposed-conv weight it is
    ``conv_transpose`` (``input_shape`` then carries the output padding)."""
    return dispatch(_CONV_INPUT_GRAD, g, w, input_shape=tuple(input_shape),
                    stride=tuple(stride), pads=tuple(map(tuple, pads)),
                    dilation=tuple(dilation), groups=int(groups))


# ---- gradient with respect to the weight ----------------------------------------------

def _weight_grad_infer(x, g, weight_shape, stride, pads, dilation, groups):
    if x.dtype is not g.dtype:
        raise RuntimeError(f"conv_weight_grad: dtypes differ ({x.dtype}, {g.dtype})")
    if len(x.shape) != len(g.shape) or len(weight_shape) != len(x.shape) or len(x.shape) < 3:
        raise RuntimeError(f"conv_weight_grad: ranks differ ({list(x.shape)}, "
                           f"{list(g.shape)}, weight {list(weight_shape)})")
    check_geometry("conv_weight_grad", weight_shape, stride, pads, dilation)
    expect = _out_spatial(x.shape, weight_shape[2:], stride, pads, dilation)
    if expect != tuple(g.shape[2:]) or g.shape[1] != weight_shape[0]:
        raise RuntimeError(f"conv_weight_grad: gradient {list(g.shape)} does not match input "
                           f"{list(x.shape)} and weight {list(weight_shape)}")
    if _MODES and groups == 1:
        _prefetch("weight_grad", tuple(x.shape), tuple(weight_shape), stride, pads, dilation,
                  x.dtype)
    return Meta(tuple(weight_shape), x.dtype)


def _weight_grad_kernel(x, g, weight_shape, stride, pads, dilation, groups):
    check_geometry("conv_weight_grad", weight_shape, stride, pads, dilation)
    out_sp = g.shape[2:]
    ksize = tuple(weight_shape[2:])
    if _native(x, g, groups) and 0 not in g.shape and 0 not in weight_shape:
        return _weight_grad_per_image(x, g, weight_shape, stride, pads, dilation)
    cols = _cols(x, ksize, out_sp, stride, pads, dilation, groups)   # (G, C/G*K, N*P)
    # cols @ g^T (BLAS takes the transposed operand by flag, no copy): OpenBLAS is much
    # faster with the long N*P dimension as the inner one of this orientation
    gwt = _gemm(cols, np.swapaxes(_channel_major(g, groups), 1, 2))  # (G, C/G*K, O/G)
    return np.ascontiguousarray(np.swapaxes(gwt, 1, 2)).reshape(weight_shape)


def _weight_grad_grad(ctx, gg):
    x, g = ctx.inputs
    need = ctx.needs_input_grad
    a = _attrs(ctx)
    d_x = conv_input_grad(g, gg, input_shape=tuple(x.shape), **a) if need[0] else None
    d_g = conv(x, gg, **a) if need[1] else None
    return d_x, d_g


def _weight_grad_sbp(x, g, weight_shape, stride, pads, dilation, groups):
    """A split batch sums to partial_sum; g's channels split give dw split on dim 0, x's
    channels split give dw split on dim 1 (groups == 1)."""
    sigs = [Signature((S(0), S(0)), (P,))]
    if groups == 1:
        sigs += [Signature((B, S(1)), (S(0),)), Signature((S(1), B), (S(1),))]
    return sigs + [Signature((P, B), (P,)), Signature((B, P), (P,)), Signature((B, B), (B,))]


def _weight_grad_cost(ins, outs, weight_shape, **attrs) -> cost.Cost:
    return cost.Cost(2 * _macs(ins[1], weight_shape), *cost.io(ins, outs))


_CONV_WEIGHT_GRAD = defop("conv_weight_grad", _weight_grad_infer, _weight_grad_kernel,
                          grad=_weight_grad_grad,
                          sbp=SbpRule(_weight_grad_sbp, shape_attrs=("weight_shape",)),
                          cost=_weight_grad_cost,
                          to_relax=_relax.conv_weight_grad, to_jax=_jax.conv_weight_grad)


def conv_weight_grad(x: Tensor, g: Tensor, *, weight_shape, stride, pads, dilation,
                     groups) -> Tensor:
    """d conv / d weight applied to ``g``."""
    return dispatch(_CONV_WEIGHT_GRAD, x, g, weight_shape=tuple(weight_shape),
                    stride=tuple(stride), pads=tuple(map(tuple, pads)),
                    dilation=tuple(dilation), groups=int(groups))
