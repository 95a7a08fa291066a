"""Winograd F(2x2, 3x3) convolution (``tessera.kernels.winograd``) against PyTorch: the C
kernels directly over paddings, odd and 1x1 outputs, batches, channel counts and thread
counts, forward, input and weight gradients, float32 and float64; then through the conv ops, eager
``F.conv2d`` with backward and an ``nn.Graph``, checking that the Winograd path ran.

Tolerances are relative to the output's scale: float32 Winograd rounds a little worse
than a direct sum (its transforms add and subtract up to 16 terms), but a wrong tile or a
wrong edge is off by the order of the output itself."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera.kernels import cc
from tests.codegen._conv_common import graph_sgd_step_matches_torch

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")


def _winograd_module():
    from tessera.kernels import conv as conv_kernels, window as kernels, winograd
    if not kernels.available(np.float32):
        pytest.skip("code generation is off (TESSERA_CODEGEN=0) or there is no compiler")
    if conv_kernels._blas() is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS the drivers can call")
    if not winograd.enabled():
        pytest.skip("TESSERA_WINOGRAD=0")
    return winograd


def close(actual, expected, dtype):
    """Equal up to Winograd's rounding, relative to the size of ``expected``."""
    scale = float(np.abs(expected).max()) or 1.0
    tol = 1e-10 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale)


def test_winograd_kernels_build():
    """Where the threaded drivers can exist every one of them must build (a compile error
    must fail here, not only in the layer that first runs that driver)."""
    from tessera.kernels import conv as conv_kernels
    winograd = _winograd_module()
    for s in ("f32", "f64"):
        for name in ("fwd", "igrad", "wgrad", *(f"{v}_{k}" for v in ("wino", "wino4")
                                                for k in ("fwd", "wide", "wgrad"))):
            assert conv_kernels._driver(name, s)   # raises on a compile error
    assert winograd.usable(np.float32) and winograd.usable(np.float64)
    assert winograd.chosen(8, 64, 64, 56, 56, np.float32)
    # batch-1 layers run wide, the benchmark CNN's 32 -> 64 at batch 64 (82 MB) in rows
    assert winograd._wide(64, 64, 28, 28, 1, 4) and winograd._wide(256, 256, 7, 7, 8, 4)
    assert not winograd._wide(32, 64, 14, 14, 64, 4)
    # 7x7 outputs only wide and over enough tiles; never for the weight gradient
    assert winograd.chosen(8, 512, 512, 7, 7, np.float32)
    assert not winograd.chosen(1, 512, 512, 7, 7, np.float32)
    assert not winograd.chosen_weight_grad(8, 64, 64, 7, 7, np.float32)


# (n, c, o, h, w, (ph, pw)); h, w the input size
KERNEL_CASES = [
    (1, 1, 1, 3, 3, (0, 0)),        # one 1x1 output
    (2, 3, 2, 1, 1, (1, 1)),        # 1x1 input, 1x1 output through padding
    (1, 2, 3, 4, 4, (1, 1)),
    (5, 3, 4, 7, 5, (0, 0)),        # odd outputs (5x3), batch above the thread count
    (3, 5, 6, 9, 8, (2, 2)),        # outputs larger than the input
    (2, 17, 19, 13, 11, (1, 1)),    # channel counts not multiples of anything
    (1, 33, 7, 10, 15, (1, 2)),     # different paddings per dim
    (4, 6, 5, 6, 7, (3, 1)),        # a forward padding above 2 (no input gradient)
    (3, 40, 36, 23, 21, (1, 1)),    # several items per image
    (2, 9, 8, 18, 17, (0, 1)),      # F(4x4): 16x15 and 18x17 outputs, one tile row short
]


@pytest.mark.parametrize("n,c,o,h,w,pads", KERNEL_CASES)
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("four", [False, True])
def test_winograd_kernels_match_torch(monkeypatch, n, c, o, h, w, pads, threads, dtype, wide,
                                      four):
    """Forward and input gradient, F(2x2) and F(4x4), in items of tile rows and wide
    (``winograd._wide``: the whole batch one block, three passes), and the weight
    gradient."""
    from tessera.kernels import conv as conv_kernels, threadpool as runtime
    winograd = _winograd_module()
    monkeypatch.setattr(runtime, "_threads", lambda: threads)
    monkeypatch.setattr(conv_kernels, "_PARALLEL_MACS", 0)  # these sizes would run serially
    monkeypatch.setattr(winograd, "_WIDE_BYTES", 1 << 62 if wide else 0)
    monkeypatch.setattr(winograd, "four", lambda *shape: four)
    rng = np.random.default_rng(n * 1000 + c * 10 + o)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((o, c, 3, 3)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    tx, tw = torch.from_numpy(x), torch.from_numpy(wt)
    ref = torch.nn.functional.conv2d(tx, tw, torch.from_numpy(b), padding=pads).numpy()
    y = np.full_like(ref, np.nan)
    winograd.conv2d_winograd(x, wt, b, pads, y)
    close(y, ref, dtype)
    ref = torch.nn.functional.conv2d(tx, tw, None, padding=pads).numpy()
    y = np.full_like(ref, np.nan)
    winograd.conv2d_winograd(x, wt, None, pads, y)
    close(y, ref, dtype)
    g = rng.standard_normal(ref.shape).astype(dtype)
    gt = torch.from_numpy(g)
    wref = torch.nn.grad.conv2d_weight(tx, wt.shape, gt, padding=pads).numpy()
    dw = winograd.conv2d_weight_grad_winograd(x, g, pads)
    assert dw.dtype == dtype
    close(dw, wref, dtype)
    if max(pads) > 2:
        return
    dref = torch.nn.grad.conv2d_input(x.shape, tw, torch.from_numpy(g), padding=pads).numpy()
    dx = np.full_like(x, np.nan)
    winograd.conv2d_input_grad_winograd(g, wt, pads, dx)
    close(dx, dref, dtype)


class Spy:
    """Counts the Winograd runs: forward (0), input gradient (1) and weight gradient (2)."""

    def __init__(self, monkeypatch, winograd):
        self.calls = {0: 0, 1: 0, 2: 0}
        original, weight_grad = winograd._winograd, winograd.conv2d_weight_grad_winograd

        def spy(x, w, b, pads, y, flip, *epilogue):
            self.calls[flip] += 1
            return original(x, w, b, pads, y, flip, *epilogue)

        def spy_weight_grad(*args):
            self.calls[2] += 1
            return weight_grad(*args)
        monkeypatch.setattr(winograd, "_winograd", spy)
        monkeypatch.setattr(winograd, "conv2d_weight_grad_winograd", spy_weight_grad)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_ops_choose_winograd(monkeypatch, dtype):
    """The conv kernels take the Winograd path for an eligible shape (and not for 1 input
    channel, a stride or a 5x5 filter), and agree with it switched off."""
    from tessera.ops import conv as C
    winograd = _winograd_module()
    spy = Spy(monkeypatch, winograd)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 32, 12, 11)).astype(dtype)
    w = rng.standard_normal((40, 32, 3, 3)).astype(dtype)
    b = rng.standard_normal(40).astype(dtype)
    args = ((1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    y = C._conv_kernel(x, w, b, *args)
    g = rng.standard_normal(y.shape).astype(dtype)
    dx = C._input_grad_kernel(g, w, x.shape, *args)
    dw = C._weight_grad_kernel(x, g, w.shape, *args)
    assert spy.calls == {0: 1, 1: 1, 2: 1}
    monkeypatch.setattr(winograd, "_ON", False)
    close(y, C._conv_kernel(x, w, b, *args), dtype)
    close(dx, C._input_grad_kernel(g, w, x.shape, *args), dtype)
    close(dw, C._weight_grad_kernel(x, g, w.shape, *args), dtype)
    assert spy.calls == {0: 1, 1: 1, 2: 1}
    monkeypatch.setattr(winograd, "_ON", True)
    C._conv_kernel(x[:, :1], w[:, :1], b, *args)
    C._conv_kernel(x, w, b, (2, 2), *args[1:])
    C._conv_kernel(x, rng.standard_normal((40, 32, 5, 5)).astype(dtype), b, *args)
    C._input_grad_kernel(g[:, :, 1:-1, 1:-1], w, x.shape, args[0], ((3, 3), (3, 3)),
                         *args[2:])   # padding 3: its input gradient pads by -1
    w128 = rng.standard_normal((128, 32, 3, 3)).astype(dtype)
    C._weight_grad_kernel(x, C._conv_kernel(x, w128, None, *args), w128.shape, *args)
    assert spy.calls == {0: 2, 1: 1, 2: 1}    # 128 channels: forward only


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_eager_conv2d_backward_matches_torch(monkeypatch, dtype):
    """F.conv2d and its backward on a non-contiguous input, through Winograd."""
    winograd = _winograd_module()
    spy = Spy(monkeypatch, winograd)
    rng = np.random.default_rng(2)
    xt = rng.standard_normal((2, 32, 14, 13)).astype(dtype)
    w = rng.standard_normal((33, 32, 3, 3)).astype(dtype)
    b = rng.standard_normal(33).astype(dtype)
    outs = []
    for lib in (torch, tessera):
        leaf, tw, tb = (lib.tensor(a.copy()).requires_grad_(True) for a in (xt, w, b))
        y = lib.nn.functional.conv2d(leaf.transpose(2, 3), tw, tb, padding=1)
        weights = np.linspace(-1, 1, y.numel()).reshape(tuple(y.shape)).astype(dtype)
        (y * lib.tensor(weights)).sum().backward()
        outs.append([t.detach().numpy() for t in (y, leaf.grad, tw.grad, tb.grad)])
    for got, want in zip(outs[1], outs[0]):
        close(got, want, dtype)
    assert spy.calls == {0: 1, 1: 1, 2: 1}


def test_graph_matches_torch(monkeypatch):
    """An nn.Graph training step (two 3x3 convolutions, so the second's input gradient is
    needed) runs Winograd forward and backward and updates the weights as PyTorch does."""
    winograd = _winograd_module()
    spy = Spy(monkeypatch, winograd)

    def make(lib):
        nn = lib.nn
        return nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(32, 36, 3, padding=1))

    x = np.random.default_rng(3).standard_normal((2, 32, 12, 12)).astype(np.float32)
    graph_sgd_step_matches_torch(make, x, close)
    assert spy.calls[0] >= 2 and spy.calls[1] >= 1 and spy.calls[2] >= 2


@pytest.mark.parametrize("wide", [False, True])
def test_winograd_from_several_python_threads(monkeypatch, wide):
    """Forwards running at once from several Python threads (their pool tasks queue behind
    each other's) agree with one run alone: a pass waits only for items some running thread
    has taken, so the counters in C cannot wait for a task still in the queue."""
    from concurrent.futures import ThreadPoolExecutor

    from tessera.kernels import conv as conv_kernels, threadpool as runtime
    winograd = _winograd_module()
    monkeypatch.setattr(runtime, "_threads", lambda: 2)
    monkeypatch.setattr(conv_kernels, "_PARALLEL_MACS", 0)
    monkeypatch.setattr(winograd, "_WIDE_BYTES", 1 << 62 if wide else 0)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 8, 11, 13)).astype(np.float32)
    w = rng.standard_normal((9, 8, 3, 3)).astype(np.float32)

    def run(_):
        y = np.empty((2, 9, 11, 13), np.float32)
        winograd.conv2d_winograd(x, w, None, (1, 1), y)
        return y
    expect = run(0)
    with ThreadPoolExecutor(4) as pool:
        for y in pool.map(run, range(40)):
            np.testing.assert_array_equal(y, expect)
