"""Hand-written C kernels for ops that are not elementwise regions: 2-d im2col/col2im for
convolution, depthwise convolution, and 2-d max pooling with its backward (``c/window.c``,
``c/depthwise.c``, ``c/maxpool.c``), compiled through the same disk cache as generated code
and called on NumPy arrays. im2col, col2im and the backward take sizes as run-time
arguments, one library serving every shape; depthwise convolution and max pooling compile
per window geometry. ``available()`` is False when code generation is off or there is no
compiler, and the ops then use their NumPy kernels.

Why C here: im2col is a strided gather that NumPy does as a multi-dimensional copy with a
poor access order, and col2im a loop of strided adds; in C each is one sequential pass.
Max pooling's window loop with PyTorch's tie/NaN rule is a few selects per element, and
its backward a scatter-add NumPy can only do through ``bincount``.

>>> import numpy as np
>>> if available():
...     x = np.arange(16, dtype=np.float32).reshape(1, 4, 4)
...     cols = np.empty((4, 9), np.float32)
...     im2col(x, cols, (2, 2), (1, 1), (0, 0), (1, 1), (3, 3))
...     print(cols[0])
... else:
...     print([0., 1., 2., 4., 5., 6., 8., 9., 10.])
[ 0.  1.  2.  4.  5.  6.  8.  9. 10.]
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from tessera.kernels.csource import defines, source

__all__ = ["available", "im2col", "col2im", "depthwise_conv2d", "depthwise_conv2d_bound",
           "max_pool2d", "max_pool2d_values", "max_pool2d_backward", "check_geometry", "check_conv"]


# ---- the geometry every C window kernel trusts ------------------------------------------
# The kernels index memory by these numbers: a third dilation shifts the geometry array a
# driver reads positionally, a zero stride divides by zero, a negative padding writes before
# a scratch plane. Every entry point checks them (a few compares, kept on the fast paths),
# so that no caller (an imported ONNX model, a graph, eager code) can make a kernel read or
# write out of bounds.

def check_geometry(op: str, ksize, stride, pads, dilation, out_sp=None) -> None:
    """Raise ``ValueError`` naming ``op`` unless a 2-d window geometry is sound: two kernel
    sizes, strides, low paddings and dilations (and output sizes), kernel sizes, strides and
    dilations positive, paddings and output sizes non-negative.

    >>> check_geometry("max_pool2d", (2, 2), (1, 1), (0, 0), (1, 1, 1))
    Traceback (most recent call last):
        ...
    ValueError: max_pool2d: expected 2 kernel sizes, strides, paddings and dilations (a 2-d
    window), got kernel_size=(2, 2), stride=(1, 1), padding=(0, 0), dilation=(1, 1, 1)
    """
    if len(ksize) != 2 or len(stride) != 2 or len(pads) != 2 or len(dilation) != 2 \
            or out_sp is not None and len(out_sp) != 2:
        raise ValueError(f"{op}: expected 2 kernel sizes, strides, paddings and dilations (a "
                         f"2-d window), got {_geometry_text(ksize, stride, pads, dilation)}"
                         + ("" if out_sp is None else f", output size {tuple(out_sp)}"))
    if min(ksize) < 1 or min(stride) < 1 or min(dilation) < 1 or min(pads) < 0 \
            or out_sp is not None and min(out_sp) < 0:
        raise ValueError(f"{op}: kernel sizes, strides and dilations must be positive and "
                         f"paddings non-negative, got "
                         f"{_geometry_text(ksize, stride, pads, dilation)}"
                         + ("" if out_sp is None else f", output size {tuple(out_sp)}"))


def _geometry_text(ksize, stride, pads, dilation) -> str:
    return (f"kernel_size={tuple(ksize)}, stride={tuple(stride)}, padding={tuple(pads)}, "
            f"dilation={tuple(dilation)}")


def check_conv(op: str, xshape, wshape, yshape, stride, pads, dilation, arrays,
               bias=None) -> None:
    """Raise ``ValueError`` naming ``op`` unless input ``xshape`` (N, C, H, W), filters
    ``wshape`` (O, C, KH, KW) and output ``yshape`` (N, O, OH, OW) form a 2-d convolution
    with a sound geometry (``check_geometry``), ``arrays`` (and ``bias``, (O,)) share one
    dtype and are C-contiguous: what the C convolution drivers assume.

    >>> x, w, y = np.ones((1, 2, 4, 4)), np.ones((1, 3, 3, 3)), np.ones((1, 1, 2, 2))
    >>> check_conv("conv2d", x.shape, w.shape, y.shape, (1, 1), (0, 0), (1, 1), (x, w, y))
    Traceback (most recent call last):
        ...
    ValueError: conv2d: input [1, 2, 4, 4], weight [1, 3, 3, 3] and output [1, 1, 2, 2] are not
    a 2-d convolution's (N, C, H, W), (O, C, KH, KW) and (N, O, OH, OW)
    """
    if len(xshape) != 4 or len(wshape) != 4 or len(yshape) != 4 or xshape[1] != wshape[1] \
            or yshape[0] != xshape[0] or yshape[1] != wshape[0]:
        raise ValueError(f"{op}: input {list(xshape)}, weight {list(wshape)} and output "
                         f"{list(yshape)} are not a 2-d convolution's (N, C, H, W), "
                         "(O, C, KH, KW) and (N, O, OH, OW)")
    check_geometry(op, wshape[2:], stride, pads, dilation, yshape[2:])
    _check_arrays(op, arrays if bias is None else (*arrays, bias))
    if bias is not None and bias.shape != (wshape[0],):
        raise ValueError(f"{op}: bias of shape {list(bias.shape)} for {wshape[0]} output "
                         "channels")


def _check_arrays(op: str, arrays) -> None:
    dt = arrays[0].dtype
    if dt not in _SUFFIX:
        raise ValueError(f"{op}: the C kernels take float32 or float64, got {dt}")
    for a in arrays:
        if a.dtype != dt or not a.flags.c_contiguous:
            raise ValueError(f"{op}: arrays must be C-contiguous {dt}, got "
                             f"{'a non-contiguous' if a.dtype == dt else a.dtype} array of "
                             f"shape {list(a.shape)}")


@functools.lru_cache(maxsize=64)
def _depthwise_fn(dtype: str, ksize, stride, pads, dilation):
    from tessera.kernels.cc import load
    lib = load(source("depthwise.c"), _window_flags(dtype, ksize, stride, pads, dilation))
    f = lib.tsr_depthwise
    f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 7
    f.restype = None
    return f


def depthwise_conv2d(x: np.ndarray, w: np.ndarray, b, stride, pads, dilation, out_sp,
                     out: np.ndarray | None = None) -> np.ndarray:
    """Depthwise 2-d convolution of C-contiguous ``x`` (N, C, H, W) with ``w`` (C, 1, KH,
    KW) and optional bias ``b`` (C,), into ``out`` when given; ``pads`` are the low
    paddings."""
    from tessera.kernels.threadpool import split_call
    n, c, h, wd = x.shape
    y = np.empty((n, c) + tuple(out_sp), x.dtype) if out is None else out
    w = np.ascontiguousarray(w, x.dtype)
    b = None if b is None else np.ascontiguousarray(b, x.dtype)
    if w.ndim != 4 or w.shape[:2] != (c, 1) or tuple(y.shape[2:]) != tuple(out_sp):
        raise ValueError(f"depthwise_conv2d: filters {list(w.shape)} and output "
                         f"{list(y.shape)} for input {list(x.shape)}, output size "
                         f"{tuple(out_sp)}")
    # one filter per channel: checked as the (C, C, KH, KW) convolution it computes
    check_conv("depthwise_conv2d", x.shape, (c, c) + w.shape[2:], y.shape, stride, pads,
               dilation, (x, w, y), b)
    f = _depthwise_fn(_SUFFIX[x.dtype], *(tuple(map(int, a)) for a in
                                           (w.shape[2:], stride, pads, dilation)))
    split_call(f, (x.ctypes.data, w.ctypes.data, None if b is None else b.ctypes.data,
                   y.ctypes.data, c, h, wd, *out_sp), n * c, y.size * w.shape[2] * w.shape[3])
    return y


def depthwise_conv2d_bound(xshape, wshape, stride, pads, dilation, out_sp, dtype):
    """``run(x, w, b, y)``: ``depthwise_conv2d`` for one convolution's shapes and dtype, its
    checks and compiled kernel resolved once (for a compiled graph's node) and the arrays'
    addresses remembered; arrays of other shapes or layouts take ``depthwise_conv2d``."""
    from tessera.kernels.cc import addresses
    from tessera.kernels.threadpool import split_call
    dt = np.dtype(dtype)
    xshape, wshape, out_sp = tuple(xshape), tuple(wshape), tuple(out_sp)
    n, c, h, wd = xshape
    yshape = (n, c, *out_sp)
    if len(wshape) != 4 or wshape[:2] != (c, 1):
        raise ValueError(f"depthwise_conv2d: filters {list(wshape)} for input {list(xshape)}")
    check_conv("depthwise_conv2d", xshape, (c, c) + wshape[2:], yshape, stride, pads,
               dilation, (np.empty(0, dt),))
    f = _depthwise_fn(_SUFFIX[dt], *(tuple(map(int, a)) for a in
                                     (wshape[2:], stride, pads, dilation)))
    sizes = (c, h, wd, *out_sp)
    work = int(np.prod(yshape)) * wshape[2] * wshape[3]
    ptr = [addresses() for _ in range(4)]

    def run(x, w, b, y) -> None:
        if x.shape != xshape or w.shape != wshape or y.shape != yshape or x.dtype != dt \
                or w.dtype != dt or y.dtype != dt or b is not None and (
                    b.shape != (c,) or b.dtype != dt or not b.flags.c_contiguous) or not (
                    x.flags.c_contiguous and w.flags.c_contiguous and y.flags.c_contiguous):
            depthwise_conv2d(np.ascontiguousarray(x), w, b, stride, pads, dilation, y.shape[2:],
                             y)
            return
        split_call(f, (ptr[0](x), ptr[1](w), ptr[2](b), ptr[3](y), *sizes), n * c, work)
    return run


@functools.lru_cache(maxsize=64)
def _maxpool_fn(dtype: str, ksize, stride, pads, dilation, index: bool = True):
    from tessera.kernels.cc import load
    lib = load(source("maxpool.c"), _window_flags(dtype, ksize, stride, pads, dilation) +
               defines(INDEX=int(index)))
    f = lib.tsr_maxpool
    f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 6
    f.restype = None
    return f


def _window_flags(dtype: str, ksize, stride, pads, dilation) -> tuple[str, ...]:
    """The ``-D`` flags of a kernel compiled per window geometry (maxpool.c, depthwise.c)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = ksize, stride, pads, dilation
    return defines(T="float" if dtype == "f32" else "double", KH=kh, KW=kw, SH=sh, SW=sw,
                   PH=ph, PW=pw, DH=dh, DW=dw)


_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


@functools.lru_cache(maxsize=1)
def _lib():
    from tessera.kernels.cc import load
    lib = load(source("window.c"))
    P, I = ctypes.c_void_p, ctypes.c_int64
    for s in ("f32", "f64"):
        f = getattr(lib, f"tsr_im2col_{s}")
        f.argtypes, f.restype = [P, P] + [I] * 16, None
        f = getattr(lib, f"tsr_col2im_{s}")
        f.argtypes, f.restype = [P, P] + [I] * 16, None
        f = getattr(lib, f"tsr_maxpool2d_bwd_{s}")
        f.argtypes, f.restype = [P, P, P] + [I] * 4, ctypes.c_int64
    return lib


def available(dtype=np.float32) -> bool:
    """Whether the C kernels can run for ``dtype`` (code generation on, a compiler found)."""
    if np.dtype(dtype) not in _SUFFIX:
        return False
    from tessera import kernels
    if not kernels.enabled():
        return False
    try:
        _lib()
    except Exception:  # a broken toolchain: the NumPy kernels still work
        return False
    return True


def _geometry(ksize, stride, pads, dilation, out_sp) -> list[int]:
    return [*ksize, *stride, *pads, *dilation, *out_sp]


def im2col(x: np.ndarray, cols: np.ndarray, ksize, stride, pads, dilation, out_sp) -> None:
    """One image ``x`` (C, H, W), C-contiguous -> ``cols`` (C*KH*KW, OH*OW), a C-contiguous
    array or a column block of a wider one (rows keep its stride); ``pads`` are the low
    paddings (the high side follows from ``out_sp``). Rows split across the kernel
    threads when the buffer is large."""
    from tessera.kernels.threadpool import split_call
    _check_columns("im2col", x, cols, ksize, stride, pads, dilation, out_sp)
    f = getattr(_lib(), f"tsr_im2col_{_SUFFIX[x.dtype]}")
    rows = cols.shape[0]
    split_call(f, (x.ctypes.data, cols.ctypes.data, *x.shape,
                   *_geometry(ksize, stride, pads, dilation, out_sp),
                   cols.strides[0] // cols.itemsize), rows, rows * cols.shape[1])


def col2im(cols: np.ndarray, dx: np.ndarray, ksize, stride, pads, dilation, out_sp) -> None:
    """The adjoint of ``im2col``: ``dx`` (C, H, W) = the sum of each input element's window
    entries in ``cols``. Channels split across the kernel threads when large."""
    from tessera.kernels.threadpool import split_call
    _check_columns("col2im", dx, cols, ksize, stride, pads, dilation, out_sp)
    f = getattr(_lib(), f"tsr_col2im_{_SUFFIX[cols.dtype]}")
    split_call(f, (cols.ctypes.data, dx.ctypes.data, *dx.shape,
                   *_geometry(ksize, stride, pads, dilation, out_sp),
                   cols.strides[0] // cols.itemsize), dx.shape[0], cols.size)


def _check_columns(op: str, x: np.ndarray, cols: np.ndarray, ksize, stride, pads, dilation,
                   out_sp) -> None:
    """What im2col and col2im index by: image ``x`` (C, H, W) C-contiguous, ``cols`` (C KH
    KW, OH OW) with unit column stride, a sound geometry."""
    check_geometry(op, ksize, stride, pads, dilation, out_sp)
    if x.ndim != 3 or cols.ndim != 2 \
            or cols.shape != (x.shape[0] * ksize[0] * ksize[1], out_sp[0] * out_sp[1]):
        raise ValueError(f"{op}: columns {list(cols.shape)} for an image {list(x.shape)}, "
                         f"kernel {tuple(ksize)} and output size {tuple(out_sp)}")
    _check_arrays(op, (x,))
    if cols.dtype != x.dtype or cols.strides[1] != cols.itemsize:
        raise ValueError(f"{op}: columns must be {x.dtype} with unit column stride")


def _check_pool(op: str, x: np.ndarray, ksize, stride, pads, dilation, out_sp) -> None:
    check_geometry(op, ksize, stride, pads, dilation, out_sp)
    if x.ndim != 4:
        raise ValueError(f"{op}: expected an (N, C, H, W) input, got {list(x.shape)}")
    _check_arrays(op, (x,))


def max_pool2d(x: np.ndarray, ksize, stride, pads, dilation, out_sp):
    """(values, flat per-plane indices) of 2-d max pooling of C-contiguous ``x`` (N, C, H,
    W), planes split across the kernel threads."""
    from tessera.kernels.threadpool import split_call
    _check_pool("max_pool2d", x, ksize, stride, pads, dilation, out_sp)
    n, c, h, w = x.shape
    y = np.empty((n, c) + tuple(out_sp), x.dtype)
    idx = np.empty((n, c) + tuple(out_sp), np.int64)
    f = _maxpool_fn(_SUFFIX[x.dtype], *(tuple(map(int, a)) for a in
                                         (ksize, stride, pads, dilation)))
    args = (x.ctypes.data, y.ctypes.data, idx.ctypes.data, h, w, *out_sp)
    split_call(f, args, n * c, y.size)
    return y, idx


def max_pool2d_values(x: np.ndarray, ksize, stride, pads, dilation, out_sp) -> np.ndarray:
    """The values of 2-d max pooling of C-contiguous ``x`` (N, C, H, W), without indices;
    planes split across the kernel threads."""
    from tessera.kernels.threadpool import split_call
    _check_pool("max_pool2d", x, ksize, stride, pads, dilation, out_sp)
    n, c, h, w = x.shape
    y = np.empty((n, c) + tuple(out_sp), x.dtype)
    f = _maxpool_fn(_SUFFIX[x.dtype], *(tuple(map(int, a)) for a in
                                         (ksize, stride, pads, dilation)), index=False)
    split_call(f, (x.ctypes.data, y.ctypes.data, None, h, w, *out_sp), n * c, y.size)
    return y


def max_pool2d_backward(g: np.ndarray, idx: np.ndarray, input_shape) -> np.ndarray:
    """Scatter-add of ``g`` at ``idx`` into zeros of ``input_shape``; a ValueError names an
    index outside its plane."""
    from tessera.kernels.threadpool import split_call
    if g.ndim < 3 or idx.shape != g.shape or len(input_shape) != g.ndim \
            or tuple(input_shape[:2]) != g.shape[:2]:
        raise ValueError(f"max_pool2d_backward: gradient {list(g.shape)}, indices "
                         f"{list(idx.shape)} and input shape {list(input_shape)} disagree")
    _check_arrays("max_pool2d_backward", (g,))
    if idx.dtype != np.int64 or not idx.flags.c_contiguous:
        raise ValueError("max_pool2d_backward: indices must be C-contiguous int64")
    n, c = input_shape[:2]
    in_plane = int(np.prod(input_shape[2:]))
    out_plane = int(np.prod(g.shape[2:]))
    dx = np.empty(tuple(input_shape), g.dtype)
    f = getattr(_lib(), f"tsr_maxpool2d_bwd_{_SUFFIX[g.dtype]}")
    bad = split_call(f, (g.ctypes.data, idx.ctypes.data, dx.ctypes.data, in_plane, out_plane),
                     n * c, g.size)
    if bad:
        raise ValueError(bad - 1 if bad > 0 else bad + 1)
    return dx
