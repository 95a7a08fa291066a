"""The hand-written C kernels (``tessera.kernels.window``: 2-d im2col/col2im convolution
per image, max pooling) against the NumPy kernels the same ops use when code generation is
off (``TESSERA_CODEGEN=0``), over strides, paddings, dilations, ceil mode, ties and NaNs."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from tessera.kernels import cc
from tessera.ops import conv as C, pool as P

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")


def both(monkeypatch, fn):
    """fn() with the C kernels, then with the NumPy ones."""
    monkeypatch.delenv("TESSERA_CODEGEN", raising=False)
    native = fn()
    monkeypatch.setenv("TESSERA_CODEGEN", "0")
    reference = fn()
    monkeypatch.delenv("TESSERA_CODEGEN")
    return native, reference


POOL_CASES = [(k, s, p, d, ceil) for k, s, p, d, ceil in itertools.product(
    (1, 2, 3), (1, 2, 3), (0, 1), (1, 2), (False, True)) if p <= k // 2]


@pytest.mark.parametrize("k,s,p,d,ceil", POOL_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_matches_numpy(monkeypatch, k, s, p, d, ceil, dtype):
    rng = np.random.default_rng(k * 100 + s * 10 + p)
    x = rng.integers(-3, 3, (2, 3, 9, 8)).astype(dtype)   # many ties
    x[0, 0, 1, 1] = np.nan
    x = x.transpose(0, 1, 3, 2)                             # non-contiguous
    args = ((k, k), (s, s), (p, p), (d, d), ceil)
    (y, i), (yr, ir) = both(monkeypatch, lambda: P._max_pool_kernel(x, *args))
    np.testing.assert_array_equal(y, yr)
    np.testing.assert_array_equal(i, ir)
    g = rng.standard_normal(y.shape).astype(dtype)
    dx, dxr = both(monkeypatch, lambda: P._mpb_kernel(g, i, x.shape))
    np.testing.assert_allclose(dx, dxr, rtol=1e-6, atol=1e-6)


def test_max_pool_backward_rejects_bad_indices(monkeypatch):
    g = np.ones((1, 1, 2, 2), np.float32)
    idx = np.array([[[[0, 1], [2, 99]]]])
    with pytest.raises(RuntimeError, match="invalid max index: 99"):
        P._mpb_kernel(g, idx, (1, 1, 3, 3))


CONV_CASES = [((2, 3, 9, 7), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
              ((1, 2, 8, 8), (3, 2, 2, 3), (2, 1), ((0, 0), (2, 1)), (1, 1)),
              ((3, 1, 10, 9), (2, 1, 3, 2), (1, 2), ((2, 0), (0, 1)), (2, 1)),
              ((2, 4, 5, 5), (5, 4, 1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1)),
              ((1, 3, 7, 7), (2, 3, 7, 7), (1, 1), ((3, 3), (3, 3)), (1, 1))]


@pytest.mark.parametrize("xs,ws,stride,pads,dil", CONV_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_forward_and_grads_match_numpy(monkeypatch, xs, ws, stride, pads, dil, dtype):
    rng = np.random.default_rng(len(xs) + ws[0])
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    y, yr = both(monkeypatch, lambda: C._conv_kernel(x, w, b, stride, pads, dil, 1))
    np.testing.assert_allclose(y, yr, rtol=tol, atol=tol)
    g = rng.standard_normal(y.shape).astype(dtype)
    dx, dxr = both(monkeypatch, lambda: C._input_grad_kernel(g, w, xs, stride, pads, dil, 1))
    np.testing.assert_allclose(dx, dxr, rtol=tol, atol=tol)
    dw, dwr = both(monkeypatch, lambda: C._weight_grad_kernel(x, g, ws, stride, pads, dil, 1))
    np.testing.assert_allclose(dw, dwr, rtol=tol * 10, atol=tol * 10)


@pytest.mark.parametrize("n,hw", [(5, 20), (7, 9), (3, 40)])  # 2, 12 and 1 images a GEMM
def test_conv_groups_images_for_small_outputs(monkeypatch, n, hw):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 3, hw, hw)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    args = ((1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    y, yr = both(monkeypatch, lambda: C._conv_kernel(x, w, b, *args))
    np.testing.assert_allclose(y, yr, rtol=1e-5, atol=1e-5)
    out = np.full_like(y, np.nan)
    C.conv_into(out, x, w, b, *args)  # the graph executor's form, into a given buffer
    np.testing.assert_allclose(out, yr, rtol=1e-5, atol=1e-5)


THREADED_CASES = [((1, 3, 40, 36), (5, 3, 3, 3), (1, 1), ((1, 1), (1, 1))),   # row blocks
                  ((1, 3, 64, 60), (4, 3, 7, 7), (2, 2), ((3, 3), (3, 2))),   # ResNet's stem
                  ((3, 6, 12, 12), (4, 6, 1, 1), (1, 1), ((0, 0), (0, 0))),   # GEMM on x
                  ((4, 6, 12, 12), (4, 6, 1, 1), (2, 2), ((0, 0), (0, 0))),   # 1x1, strided
                  ((9, 2, 6, 6), (3, 2, 3, 3), (1, 1), ((1, 1), (1, 1))),     # image groups
                  ((1, 8, 6, 6), (200, 8, 3, 3), (1, 1), ((1, 1), (1, 1)))]   # channel blocks


@pytest.mark.parametrize("xs,ws,stride,pads", THREADED_CASES)
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_threaded_conv_drivers_match_numpy(monkeypatch, xs, ws, stride, pads, threads, dtype):
    """The drivers that split images (or row blocks) across threads, each calling BLAS
    single-threaded, for every work split."""
    from tessera.kernels import conv as kernels, threadpool as runtime
    if not kernels.threaded(dtype):
        pytest.skip("NumPy's BLAS is not an OpenBLAS the drivers can call")
    monkeypatch.setattr(runtime, "_threads", lambda: threads)
    monkeypatch.setattr(kernels, "_PARALLEL_MACS", 0)  # these sizes would run serially
    blas_threads = kernels._blas().get_threads()
    rng = np.random.default_rng(xs[0])
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    args = (stride, pads, (1, 1), 1)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    y, yr = both(monkeypatch, lambda: C._conv_kernel(x, w, b, *args))
    np.testing.assert_allclose(y, yr, rtol=tol, atol=tol)
    g = rng.standard_normal(y.shape).astype(dtype)
    dx, dxr = both(monkeypatch, lambda: C._input_grad_kernel(g, w, xs, *args))
    np.testing.assert_allclose(dx, dxr, rtol=tol, atol=tol)
    dw, dwr = both(monkeypatch, lambda: C._weight_grad_kernel(x, g, ws, *args))
    np.testing.assert_allclose(dw, dwr, rtol=tol * 10, atol=tol * 10)
    assert kernels._blas().get_threads() == blas_threads  # restored after every call


DEPTHWISE_CASES = [((2, 5, 9, 9), (3, 3), (1, 1), (1, 1), (1, 1)),
                   ((1, 4, 10, 7), (3, 5), (2, 1), (1, 2), (1, 2)),
                   ((3, 2, 7, 7), (5, 5), (1, 1), (2, 2), (1, 1)),
                   ((2, 3, 8, 8), (3, 3), (2, 2), (1, 1), (1, 1)),
                   ((1, 6, 4, 4), (1, 1), (1, 1), (0, 0), (1, 1)),
                   # stride 1 through the padded copy: dilation, a padding wider than the
                   # window's reach on one side and none on the other, a 3x5 window
                   ((1, 3, 6, 11), (3, 3), (1, 1), (2, 0), (2, 1)),
                   ((2, 2, 14, 13), (3, 5), (1, 1), (1, 2), (1, 1)),
                   # past the copy's limits (rows too wide, a plane too large): the row path
                   ((1, 2, 9, 70), (3, 3), (1, 1), (1, 1), (1, 1)),
                   ((1, 2, 500, 10), (3, 3), (1, 1), (1, 1), (1, 1))]


@pytest.mark.parametrize("xs,k,s,p,d", DEPTHWISE_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [True, False])
def test_depthwise_conv_matches_numpy(monkeypatch, xs, k, s, p, d, dtype, bias):
    rng = np.random.default_rng(xs[1])
    c = xs[1]
    x = rng.standard_normal(xs[:2] + xs[2:][::-1]).astype(dtype).transpose(0, 1, 3, 2)
    w = rng.standard_normal((c, 1) + k).astype(dtype)
    b = rng.standard_normal(c).astype(dtype) if bias else None
    args = (s, tuple((q, q) for q in p), d, c)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    y, yr = both(monkeypatch, lambda: C._conv_kernel(x, w, b, *args))
    np.testing.assert_allclose(y, yr, rtol=tol, atol=tol)


@pytest.mark.parametrize("k,s,p,d,ceil", POOL_CASES)
def test_max_pool_values_match_numpy(monkeypatch, k, s, p, d, ceil):
    rng = np.random.default_rng(k * 100 + s * 10 + p)
    x = rng.integers(-3, 3, (2, 3, 9, 8)).astype(np.float32)
    x[0, 0, 1, 1] = np.nan
    args = ((k, k), (s, s), (p, p), (d, d), ceil)
    y, yr = both(monkeypatch, lambda: P._max_pool_values_kernel(x, *args))
    np.testing.assert_array_equal(y, yr)


def test_threaded_conv_from_several_python_threads(monkeypatch):
    """Convolutions running at once from several Python threads agree with one run alone,
    and BLAS gets its thread count back when the last of them ends."""
    from concurrent.futures import ThreadPoolExecutor

    from tessera.kernels import conv as kernels, threadpool as runtime
    if not kernels.threaded(np.float32):
        pytest.skip("NumPy's BLAS is not an OpenBLAS the drivers can call")
    monkeypatch.setattr(runtime, "_threads", lambda: 2)
    monkeypatch.setattr(kernels, "_PARALLEL_MACS", 0)
    blas_threads = kernels._blas().get_threads()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    args = ((1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    expect = C._conv_kernel(x, w, None, *args)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: [C._conv_kernel(x, w, None, *args)
                                           for _ in range(20)], range(4)))
    for ys in results:
        for y in ys:
            np.testing.assert_array_equal(y, expect)
    assert kernels._blas().get_threads() == blas_threads
