"""Winograd F(2x2, 3x3) convolution for 3x3, stride-1, dilation-1, ungrouped 2-d convolutions
(and their input gradients, which are such convolutions too), in C (``c/winograd.h``) inside
the threaded convolution drivers of ``tessera.kernels.conv``.

Each 2x2 block of outputs (a tile) takes 16 multiplies per (input, output) channel pair
instead of 36: the filters become U = G g G^T (4x4 each, once per call), each 4x4 input
tile V = B^T d B, then for each of the 16 positions of a tile one GEMM
M[p] (O, tiles) = U[p] (O, C) @ V[p] (C, tiles), and each tile's outputs Y = A^T M A
(Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2015). A work item
is a block of tile rows of the whole batch (rows of several images when they are small,
so that its GEMMs are wide); each thread transforms its block's input, runs the 16 GEMMs
on BLAS single-threaded and writes the outputs with the bias, all in its own workspace,
as the im2col drivers do. With few tiles (batch 1), such items would make skinny GEMMs
that each read all of U, so there the whole batch is one block in three passes, the
threads sharing its V and M: the filter and input transforms (items: output channels'
filters, then input channels), the 16 GEMMs (items: positions), the output transform
(items: output channels). In items of tile rows the threads transform the filters first
(items: output channels). The passes of a call meet at counters in C (a thread yields
until the previous pass's items are all done), not at the kernel pool's barrier: on a
busy host waking a blocked thread takes far longer than a yielding one takes to see the
count (bench models: resnet18 infer b1). The GEMMs and the output transform stay separate
passes: in one, each block of output channels would pack all of V again. ``chosen`` is
the rule, measured per layer shape, for when this beats im2col + GEMM.

The input gradient of a 3x3 stride-1 convolution with low padding p is the correlation of
the output gradient with the filters turned 180 degrees and their channels swapped, with
low padding 2 - p; the filter transform does the turn and the swap (FLIP). The weight
gradient sums, per tile position, (A g A^T)[p] @ (B^T d B)[p]^T over the tiles, each
thread over a fixed run of them (a sum that does not depend on thread timing), then
takes G^T s G; ``chosen_weight_grad`` keeps it to the shapes where it measured faster.

Over enough tiles (``four``) the forward, input and weight gradients run as F(4x4, 3x3)
instead (``tessera.kernels.winograd4``: the same drivers with 6x6 tiles).

``TESSERA_WINOGRAD=0`` turns the path off (read once), so benchmarks can compare it with
im2col + GEMM; ``TESSERA_WINOGRAD4=0`` keeps it to F(2x2).

>>> import numpy as np
>>> x, w = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32)
>>> y = np.empty((1, 1, 4, 4), np.float32)
>>> conv2d_winograd(x, w, None, (1, 1), y) if usable(np.float32) else y.fill(9)
>>> float(y[0, 0, 1, 1])
9.0
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from tessera.kernels.window import check_conv

__all__ = ["enabled", "usable", "chosen", "chosen_weight_grad", "conv2d_winograd",
           "conv2d_input_grad_winograd", "conv2d_weight_grad_winograd"]

_ON = os.environ.get("TESSERA_WINOGRAD", "1") not in ("0", "", "false", "off")


def enabled() -> bool:
    """Whether ``TESSERA_WINOGRAD`` (read once, at import) lets the Winograd path run."""
    return _ON


def chosen(n: int, c: int, o: int, oh: int, ow: int, dtype) -> bool:
    """Whether a stride-1 3x3 convolution of ``n`` images, ``c`` -> ``o`` channels and output
    ``oh`` x ``ow`` runs as Winograd rather than im2col + GEMM (bench models: resnet18 infer
    b1 and b8; bench training: cnn).

    >>> chosen(8, 64, 64, 56, 56, np.float32) == usable(np.float32)
    True
    """
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    tiles = n * th * tw
    # transforms cost per channel, GEMM savings per channel pair: below 32 channels on
    # either side the transforms cost more than the GEMMs save (bench training: cnn)
    return (min(c, o) >= 32
            # below 10x10, 4x4 tiles (and each tile row's spare column) waste much of the
            # GEMMs (7x7 computes 80 outputs for 49), unless the forward runs wide, whose
            # GEMMs are fast enough (bench models: resnet18 infer b8)
            and (oh * ow >= 100 or _wide(c, o, th, tw, n, np.dtype(dtype).itemsize))
            # the filter transform and each item's reading of the 16 (o, c) matrices pay off
            # only over enough tiles (bench models: resnet18 infer b1)
            and tiles * 8 >= max(c, o)
            and usable(dtype))


def chosen_weight_grad(n: int, c: int, o: int, oh: int, ow: int, dtype) -> bool:
    """Whether the weight gradient of such a convolution runs as Winograd: only up to 64
    channels, since from 128 on its (O, C) sums over short runs of tiles lose to im2col +
    GEMM (bench training: cnn). As F(4x4) where ``four`` says.

    >>> chosen_weight_grad(64, 32, 64, 28, 28, np.float32) == usable(np.float32)
    True
    """
    return max(c, o) <= 64 and oh * ow >= 100 and chosen(n, c, o, oh, ow, dtype)


def usable(dtype) -> bool:
    """Whether the Winograd kernels can run for ``dtype``: switched on, and the threaded
    convolution drivers (which hold them) built."""
    from tessera.kernels.conv import threaded
    return _ON and threaded(dtype)


class Tiles(NamedTuple):
    """An F(m x m, 3x3) as its Python side sees it: the drivers' prefix, m, the columns
    a tile row keeps in v and m past its last tile (F(2x2): one spare), the filter transform
    G ((m + 2) x 3), and a thread's scratch before its v (WROWS in the C) from (rb, th, tw,
    ow)."""

    name: str
    m: int
    spare: int
    g: np.ndarray
    wrows: Callable[[int, int, int, int], int]

    def shape(self, oh: int, ow: int) -> tuple[int, int, int, int]:
        """(tile rows, tiles a row, columns a tile row in v and m, positions)."""
        th, tw = -(-oh // self.m), -(-ow // self.m)
        return th, tw, tw + self.spare, (self.m + 2) ** 2


_G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]])
F2 = Tiles("wino", 2, 1, _G, lambda rb, th, tw, ow: (2 * (rb + 2) * 2 * (tw + 1) + 8 * (
    rb * (tw + 1) + 1) + ow + 1 + 15) // 16 * 16)


def _tiles(n: int, c: int, o: int, oh: int, ow: int) -> Tiles:
    if four(n, c, o, oh, ow):
        from tessera.kernels.winograd4 import F4
        return F4
    return F2


def _rows_per_item(v: Tiles, c: int, o: int, oh: int, ow: int, n: int, threads: int,
                   itemsize: int) -> int:
    """Tile rows per work item: v and m of an item fill about half of a core's L2 (written,
    read by the GEMMs, read again), but its GEMMs have at least _MIN_COLS columns (each item
    reads all of u: with many channels and few columns that read dominates); at least 2
    items per thread so that a late thread only takes fewer."""
    th, _, tc, p = v.shape(oh, ow)
    rb = max(_L2_BYTES // 2 // (p * (c + o) * tc * itemsize), -(-_MIN_COLS // tc))
    return int(max(1, min(rb, -(-n * th // (2 * threads)))))


_L2_BYTES = 1 << 20
# columns an item's GEMMs get at least: their per-call packing of u and short rows cost more
# than v and m spilling from L2 (bench models: resnet18 infer b8)
_MIN_COLS = 256


def _winograd(x: np.ndarray, w: np.ndarray, b, pads, y: np.ndarray, flip: int,
              epilogue=None) -> None:
    """``y`` = the stride-1 3x3 correlation of ``x`` (N, C, H, W) with the filters of ``w``
    (turned and channel-swapped when ``flip``), low paddings ``pads``, plus ``b``, then
    ``epilogue`` (``tessera.kernels.conv.epilogue``): F(4x4) where ``four`` says, else
    F(2x2)."""
    from tessera.kernels.conv import _run, _threads, _workspace
    n, c, h, wd = x.shape
    o, oh, ow = y.shape[1:]
    v = _tiles(n, c, o, oh, ow)
    th, tw, tc, p = v.shape(oh, ow)
    threads = _threads(n * o * c * 9 * oh * ow)
    wide = _fits_wide(v, c, o, oh, ow, n, x.itemsize)
    rb = n * th if wide else _rows_per_item(v, c, o, oh, ow, n, threads, x.itemsize)
    ws = v.wrows(rb, th, tw, ow) + (0 if wide else p * ((c + o) * rb * tc + 32))
    work = _workspace(ws * threads, x.dtype)
    u = _workspace(p * (o * c + 16), x.dtype, "winograd")
    geometry = [c, h, wd, o, *pads, oh, ow, n, rb, flip]
    if not wide:
        _run(f"{v.name}_fwd", x.dtype, (x, w, u, b, y, epilogue), work, ws, geometry, threads)
        return
    nc = rb * tc
    vm = _workspace(p * ((c + o) * nc + 32), x.dtype, "winograd_wide")
    vv, m = vm[:p * (c * nc + 16)], vm[p * (c * nc + 16):]
    _run(f"{v.name}_wide", x.dtype, (x, w, u, vv, m, b, y, epilogue), work, ws, geometry,
         threads)


def four(n: int, c: int, o: int, oh: int, ow: int) -> bool:
    """Whether a Winograd forward (or input gradient) runs as F(4x4, 3x3)
    (``tessera.kernels.winograd4``) rather than F(2x2): over enough 4x4 tiles to
    amortise its filter transform, 2.25x F(2x2)'s (36 positions of O x C) (bench models:
    resnet18 infer b1; bench training: cnn).

    >>> four(1, 64, 64, 56, 56), four(1, 256, 256, 14, 14)
    (True, False)
    """
    return _FOUR and n * ((oh + 3) // 4) * ((ow + 3) // 4) * 8 >= max(c, o)


def prefetch(kind: str, n: int, c: int, o: int, oh: int, ow: int, dtype) -> None:
    """Start compiling, in the background, the driver that the ``kind`` ("forward", which
    the input gradient is too, or "weight_grad") of a Winograd convolution of ``n`` images,
    ``c`` -> ``o`` channels and output ``oh`` x ``ow`` will run."""
    from tessera.kernels import conv as conv_kernels
    v = _tiles(n, c, o, oh, ow)
    if kind == "weight_grad":
        name = f"{v.name}_wgrad"
    else:
        wide = _fits_wide(v, c, o, oh, ow, n, np.dtype(dtype).itemsize)
        name = f"{v.name}_{'wide' if wide else 'fwd'}"
    conv_kernels.prefetch(name, dtype)


_FOUR = os.environ.get("TESSERA_WINOGRAD4", "1") not in ("0", "", "false", "off")


def _wide(c: int, o: int, th: int, tw: int, n: int, itemsize: int) -> bool:
    """Whether the F(2x2) forward of ``th`` x ``tw`` tiles runs wide (``_fits_wide``)."""
    return _fits_wide(F2, c, o, 2 * th, 2 * tw, n, itemsize)


def _fits_wide(v: Tiles, c: int, o: int, oh: int, ow: int, n: int, itemsize: int) -> bool:
    """Whether the forward runs wide: the whole batch one block, its three passes split
    over input channels, positions and output channels, rather than in items of tile rows.
    Items of a few tile rows make skinny GEMMs, each reading all of u, and at batch 1
    only a few items share out unevenly; one block's v and m (positions' GEMMs of every
    tile) take memory, so only up to _WIDE_BYTES (bench models: resnet18 infer b1)."""
    th, _, tc, p = v.shape(oh, ow)
    return p * (c + o) * n * th * tc * itemsize <= _WIDE_BYTES


_WIDE_BYTES = 32 << 20


def conv2d_weight_grad_winograd(x: np.ndarray, g: np.ndarray, pads) -> np.ndarray:
    """The weight gradient (O, C, 3, 3) of a stride-1 3x3 convolution with low paddings
    ``pads`` from C-contiguous ``x`` (N, C, H, W) and ``g`` (N, O, OH, OW): per tile
    position the sum over tiles of (A g A^T)[p] (O, tiles) @ (B^T d B)[p]^T (tiles, C), each
    thread over a fixed run of tile rows (a sum whose order does not depend on thread
    timing), then G^T s G; F(4x4) where ``four`` says.

    >>> x, g = np.ones((1, 2, 3, 3)), np.ones((1, 1, 1, 1))
    >>> dw = conv2d_weight_grad_winograd(x, g, (0, 0)) if usable(np.float64) else x[None, 0]
    >>> dw.shape, round(float(dw.sum()), 6)   # exact up to the transforms' rounding
    ((1, 2, 3, 3), 18.0)
    """
    from tessera.kernels.conv import _run, _threads, _workspace
    check_conv("conv2d_weight_grad_winograd", x.shape, (g.shape[1], x.shape[1], 3, 3),
               g.shape, (1, 1), pads, (1, 1), (x, g))
    n, c, h, wd = x.shape
    o, oh, ow = g.shape[1:]
    v = _tiles(n, c, o, oh, ow)
    th, tw, tc, p = v.shape(oh, ow)
    threads = min(_threads(n * o * c * 9 * oh * ow), n * th)
    # the GEMMs sum over an item's tiles into an (O, C) block: long sums (many tile rows per
    # item, v and z in L3 rather than L2) run at GEMM speed, short ones at memory speed
    rb = max(1, min(-(-n * th // threads), _WGRAD_BYTES // (p * (c + o) * tc * x.itemsize)))
    ws = v.wrows(rb, th, tw, ow) + p * ((c + o) * rb * tc + 32)
    work = _workspace(ws * threads, x.dtype)
    s = np.empty((threads, p, o * c + 16), x.dtype)
    geometry = [c, h, wd, o, *pads, oh, ow, n, rb, 0]
    _run(f"{v.name}_wgrad", x.dtype, (x, g, s), work, ws, geometry, threads)
    # (the padding columns are not written)
    s = s[:, :, :o * c].sum(0).reshape(v.m + 2, v.m + 2, o, c)
    gt = v.g.T.astype(x.dtype)
    t = np.tensordot(gt, s, axes=(1, 0))                                  # (3, m + 2, O, C)
    return np.ascontiguousarray(np.tensordot(t, gt, axes=(1, 1)).transpose(1, 2, 0, 3))


_WGRAD_BYTES = 1 << 20  # v and z of an item: long sums that stay in cache (bench training: cnn)


def conv2d_winograd(x: np.ndarray, w: np.ndarray, b, pads, y: np.ndarray,
                    epilogue=None) -> None:
    """``y`` (N, O, OH, OW) = the stride-1 3x3 convolution of C-contiguous ``x`` (N, C, H, W)
    with C-contiguous ``w`` (O, C, 3, 3) plus ``b`` (O,) if given, then ``epilogue``
    (``tessera.kernels.conv.epilogue``: activation, residual); ``pads`` are the low
    paddings (the output size gives the high ones); ``y`` C-contiguous.

    >>> x, w = np.ones((1, 2, 3, 3)), np.ones((1, 2, 3, 3))
    >>> y = np.empty((1, 1, 1, 1))
    >>> conv2d_winograd(x, w, None, (0, 0), y) if usable(np.float64) else y.fill(18)
    >>> float(y[0, 0, 0, 0])
    18.0
    """
    _check_3x3("conv2d_winograd", w)
    check_conv("conv2d_winograd", x.shape, w.shape, y.shape, (1, 1), pads, (1, 1), (x, w, y),
               b)
    _winograd(x, w, b, pads, y, 0, epilogue)


def _check_3x3(op: str, w: np.ndarray) -> None:
    if w.shape[2:] != (3, 3):
        raise ValueError(f"{op}: Winograd F(m, 3x3) takes 3x3 filters, got {list(w.shape)}")


def conv2d_input_grad_winograd(g: np.ndarray, w: np.ndarray, pads, dx: np.ndarray) -> None:
    """``dx`` (N, C, H, W) = the input gradient of a stride-1 3x3 convolution with low
    paddings ``pads`` (each at most 2) and filters ``w`` (O, C, 3, 3), from C-contiguous
    ``g`` (N, O, OH, OW): the convolution of ``g`` with the turned, channel-swapped filters
    and low paddings 2 - p.

    >>> g, w = np.ones((1, 1, 1, 1)), np.ones((1, 2, 3, 3))
    >>> dx = np.empty((1, 2, 3, 3))
    >>> conv2d_input_grad_winograd(g, w, (0, 0), dx) if usable(np.float64) else dx.fill(1)
    >>> round(float(dx.sum()), 6)   # exact up to the transforms' rounding
    18.0
    """
    _check_3x3("conv2d_input_grad_winograd", w)
    check_conv("conv2d_input_grad_winograd", dx.shape, w.shape, g.shape, (1, 1), pads, (1, 1),
               (g, w, dx))
    if max(pads) > 2:   # its convolution pads by 2 - p
        raise ValueError(f"conv2d_input_grad_winograd: low paddings {tuple(pads)} above 2")
    _winograd(g, w, None, tuple(2 - p for p in pads), dx, 1)
