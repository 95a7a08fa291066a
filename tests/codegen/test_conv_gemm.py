"""Tessera's GEMM behind the CBLAS sgemm signature of the convolution drivers
(``c/conv_gemm.c``, ``conv_kernels._own_sgemm``): the adapter itself against NumPy over
every transpose, alpha and beta, and the drivers' float32 convolutions (im2col, Winograd)
with it against PyTorch, whichever GEMM the CPU would choose: the forward and input
gradient through it, the weight gradient (on OpenBLAS) beside them."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from tessera.kernels import conv as conv_kernels, gemm
from tessera.ops import conv as C


@pytest.fixture
def own_sgemm(monkeypatch):
    """The adapter's address, forced on (``TESSERA_CONV_GEMM=tessera``) for this test."""
    if not conv_kernels.threaded(np.float32) or not gemm.available():
        pytest.skip("no OpenBLAS the drivers can call, or no C compiler")
    monkeypatch.setattr(conv_kernels, "_CONV_GEMM", "tessera")
    conv_kernels._own_sgemm.cache_clear()
    conv_kernels._ONCE.pop(("conv", "own_sgemm"), None)
    addr = conv_kernels._own_sgemm()
    assert addr
    yield addr
    conv_kernels._own_sgemm.cache_clear()
    conv_kernels._ONCE.pop(("conv", "own_sgemm"), None)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (1.0, 1.0), (0.5, -2.0)])
def test_adapter_matches_numpy(own_sgemm, ta, tb, alpha, beta):
    blas = conv_kernels._blas()
    bi = ctypes.c_int64 if blas.ilp64 else ctypes.c_int
    f = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, bi, bi, bi,
                         ctypes.c_float, ctypes.c_void_p, bi, ctypes.c_void_p, bi,
                         ctypes.c_float, ctypes.c_void_p, bi)(own_sgemm)
    rng = np.random.default_rng(0)
    m, n, k = 37, 53, 29
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c = rng.standard_normal((m, n + 3)).astype(np.float32)   # rows ldc = n + 3 apart
    expected = alpha * ((a.T if ta else a).astype(np.float64)
                        @ (b.T if tb else b).astype(np.float64)) + beta * c[:, :n]
    f(101, 112 if ta else 111, 112 if tb else 111, m, n, k, alpha, a.ctypes.data,
      a.shape[1], b.ctypes.data, b.shape[1], beta, c.ctypes.data, n + 3)
    np.testing.assert_allclose(c[:, :n], expected, rtol=1e-5, atol=1e-4)


# (x shape, w shape, stride, padding): im2col with row blocks, a 1x1 reading x itself,
# a 3x3 stride-1 layer the Winograd rule may take, a batch of images side by side
CASES = [((1, 3, 45, 37), (16, 3, 7, 7), 2, 3), ((2, 24, 9, 9), (40, 24, 1, 1), 1, 0),
         ((1, 64, 14, 14), (64, 64, 3, 3), 1, 1), ((4, 8, 7, 7), (32, 8, 3, 3), 2, 1)]


@pytest.mark.parametrize("xs,ws,stride,pad", CASES)
def test_convolutions_match_torch(own_sgemm, monkeypatch, xs, ws, stride, pad):
    monkeypatch.setattr(conv_kernels, "_PARALLEL_MACS", 0)   # the threaded items too
    rng = np.random.default_rng(ws[0])
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, torch.from_numpy(b), stride=stride, padding=pad)
    g = rng.standard_normal(ty.shape).astype(np.float32)
    ty.backward(torch.from_numpy(g))
    strides, pads, dil = (stride, stride), ((pad, pad), (pad, pad)), (1, 1)
    y = C._conv_kernel(x, w, b, strides, pads, dil, 1)
    dx = C._input_grad_per_image(g, w, x.shape, strides, pads, dil)
    dw = C._weight_grad_per_image(x, g, w.shape, strides, pads, dil)
    for got, want in ((y, ty.detach().numpy()), (dx, tx.grad.numpy()), (dw, tw.grad.numpy())):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
