"""The threaded convolution driver at batch 1 (fewer images than threads), against PyTorch:
one image split into row blocks whose columns fit in cache (``conv_kernels._plan``), or
into output-channel blocks when its rows are too few, over strides, paddings, dilations,
1x1 and 7x7 filters, odd sizes, float32 and float64; and the plan itself."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tessera.ops import conv as C

# (x shape, w shape, stride, padding, dilation)
CASES = [((1, 3, 45, 37), (16, 3, 7, 7), 2, 3, 1),     # a stem: many row blocks
         ((1, 5, 30, 30), (7, 5, 3, 3), 1, 1, 1),      # odd channel counts
         ((1, 6, 29, 31), (40, 6, 1, 1), 2, 0, 1),     # 1x1 stride 2
         ((1, 4, 26, 26), (8, 4, 1, 1), 1, 0, 1),      # 1x1: the GEMM reads x itself
         ((1, 3, 33, 20), (5, 3, 3, 3), 1, 2, 2),      # dilation
         ((1, 8, 6, 6), (200, 8, 3, 3), 1, 1, 1),      # few rows: channel blocks
         ((1, 8, 3, 3), (200, 8, 1, 1), 1, 0, 1),      # channel blocks reading x itself
         ((2, 5, 5, 5), (300, 5, 3, 3), 1, 1, 1),      # two images' shared columns (3 threads)
         ((1, 2, 5, 5), (3, 2, 3, 3), 1, 0, 1)]        # tiny: one thread


def _matches_torch(xs, ws, stride, pad, dil, dtype) -> tuple:
    """The driver's convolution of random x, w, b against PyTorch's; returns (x, y)."""
    rng = np.random.default_rng(ws[0])
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    expected = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                                          torch.from_numpy(b), stride=stride, padding=pad,
                                          dilation=dil).numpy()
    y = C._conv_kernel(x, w, b, (stride, stride), ((pad, pad), (pad, pad)), (dil, dil), 1)
    tol = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(y, expected, rtol=tol, atol=tol * np.abs(expected).max())
    return x, y


@pytest.mark.parametrize("xs,ws,stride,pad,dil", CASES)
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shared", [False, True])
def test_batch1_splits_match_torch(monkeypatch, xs, ws, stride, pad, dil, threads, dtype,
                                   shared):
    """Channel blocks with each thread building its own columns, and with the columns
    built once and shared (``conv_kernels._SHARED``)."""
    from tessera.kernels import conv as conv_kernels, threadpool as runtime
    if not conv_kernels.threaded(dtype):
        pytest.skip("NumPy's BLAS is not an OpenBLAS the drivers can call")
    monkeypatch.setattr(conv_kernels, "_SHARED", shared)
    monkeypatch.setattr(runtime, "_threads", lambda: threads)
    monkeypatch.setattr(conv_kernels, "_PARALLEL_MACS", 0)  # these sizes would run serially
    monkeypatch.setattr(conv_kernels, "_COLS_BYTES", 4096)  # several row blocks at these sizes
    monkeypatch.setattr(conv_kernels, "_MIN_BLOCK", 16)
    _matches_torch(xs, ws, stride, pad, dil, dtype)


def test_batch1_plan():
    """ResNet-18's stem runs in row blocks of a few rows (columns within _COLS_BYTES) at
    any batch and thread count (an image's columns exceed _IMAGE_COLS_BYTES), its 1x1
    stride-2 convolutions at 14x14 in channel blocks at batch 1; otherwise batches of at
    least the thread count keep whole images (or several side by side) an item."""
    from tessera.kernels.conv import _COLS_BYTES, _plan
    for n, t in ((1, 2), (1, 1), (8, 2)):
        threads, rb, grp, ob = _plan(n, 64, 112, 112, 147, 4, t)
        assert (threads, grp, ob) == (t, 1, 64) and rb * 112 * 147 * 4 <= _COLS_BYTES
    assert _plan(1, 512, 7, 7, 256, 4, 2) == (2, 7, 1, 256)
    assert _plan(8, 128, 28, 28, 576, 4, 2) == (2, 28, 1, 128)
    assert _plan(8, 512, 7, 7, 4608, 4, 2) == (2, 7, 4, 512)


# (x shape, w shape, stride, padding, dilation): output channels split over the threads,
# with no more filters than output columns, so the shared columns go in row items
ROW_ITEM_CASES = [((1, 6, 33, 31), (200, 6, 3, 3), 2, 1, 1),
                  ((1, 4, 20, 19), (200, 4, 1, 1), 1, 0, 1),     # the GEMM reads x itself
                  ((1, 3, 30, 30), (203, 3, 3, 3), 1, 2, 2)]     # dilation, odd channels


@pytest.mark.parametrize("xs,ws,stride,pad,dil", ROW_ITEM_CASES)
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_shared_columns_in_row_items_match_torch(monkeypatch, xs, ws, stride, pad, dil,
                                                 threads, dtype):
    """The batch-1 plan's channel split (row blocks too small) with the shared columns'
    GEMMs in items of output rows (``conv_kernels._SHARED_ROWS``)."""
    from tessera.kernels import conv as conv_kernels, threadpool as runtime
    if not conv_kernels.threaded(dtype):
        pytest.skip("NumPy's BLAS is not an OpenBLAS the drivers can call")
    monkeypatch.setattr(runtime, "_threads", lambda: threads)
    monkeypatch.setattr(conv_kernels, "_PARALLEL_MACS", 0)
    monkeypatch.setattr(conv_kernels, "_MIN_BLOCK", 1 << 20)   # no row blocks of its own
    x, y = _matches_torch(xs, ws, stride, pad, dil, dtype)
    assert conv_kernels._plan(1, ws[0], *y.shape[2:], int(np.prod(ws[1:])), x.itemsize,
                              threads)[3] < ws[0]            # the channel split it replaces
