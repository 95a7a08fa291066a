"""Direct C convolution (``tessera.kernels.direct_conv``) against PyTorch: the kernels
directly over paddings (0 to above the filter, so that the input gradient crops), dilations,
odd widths, one and several channels, batches of 1 and above the thread count, forward
(with and without bias), input and weight gradients, float32 and float64; the weight
gradient's sum repeating bit for bit; then through the conv ops (eager ``F.conv2d`` with
backward on non-contiguous inputs, and an ``nn.Graph``), checking that the direct path ran
where its rule picks it and not elsewhere."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera.kernels import cc
from tests.codegen._conv_common import graph_sgd_step_matches_torch

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")


def _direct_module():
    from tessera.kernels import direct_conv
    if not direct_conv.enabled():
        pytest.skip("TESSERA_DIRECT_CONV=0")
    return direct_conv


def close(actual, expected, dtype):
    """Equal up to rounding, relative to the size of ``expected`` (a wrong tap or edge is
    off by the order of the output itself)."""
    scale = float(np.abs(expected).max()) or 1.0
    tol = 1e-11 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale)


def test_direct_kernels_build():
    """Where C kernels exist every direct kernel must build (a compile error must fail
    here, not only in the layer that first takes that tile), and LeNet's layers must
    choose the direct path."""
    direct_conv = _direct_module()
    from tessera.kernels import window as kernels
    if not kernels.available(np.float32):
        pytest.skip("C kernels unavailable")
    names = [*direct_conv._instances("f32"), *direct_conv._instances("f64")]
    assert len(names) == 2 * (2 * len(direct_conv._FWD_TILES) + len(direct_conv._WGRAD_TILES)
                              + len(direct_conv._WGRADC_TILES))
    for name in names:
        assert direct_conv._kernel(name)   # raises on a compile error
    for kind in ("forward", "weight_grad"):
        assert direct_conv.chosen(64, 1, 6, 28, 28, 5, 5, np.float32, kind)
    for kind in ("forward", "input_grad"):
        assert direct_conv.chosen(64, 6, 16, 10, 10, 5, 5, np.float32, kind)


# (n, c, o, h, w, (kh, kw), (ph, pw), (dh, dw)); h, w the input size
KERNEL_CASES = [
    (2, 1, 6, 28, 28, (5, 5), (2, 2), (1, 1)),     # LeNet's first layer
    (5, 6, 16, 14, 14, (5, 5), (0, 0), (1, 1)),    # its second, batch above the threads
    (1, 1, 1, 1, 1, (1, 1), (0, 0), (1, 1)),       # one tap, one output
    (1, 3, 5, 7, 9, (3, 3), (1, 1), (1, 1)),       # odd sizes, 5 outputs (tile padding)
    (3, 2, 7, 9, 6, (3, 2), (1, 0), (2, 1)),       # dilation, a 3x2 filter
    (4, 17, 3, 11, 13, (3, 3), (2, 1), (1, 1)),    # more inputs than outputs
    (3, 4, 9, 5, 5, (3, 3), (4, 3), (1, 1)),       # padding above the filter: crops
    (2, 2, 13, 6, 31, (1, 5), (0, 2), (1, 3)),     # a wide row, 13 outputs
    (7, 3, 4, 8, 3, (4, 2), (3, 1), (1, 2)),       # outputs wider than the input
]


@pytest.mark.parametrize("n,c,o,h,w,ks,pads,dil", KERNEL_CASES)
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_direct_kernels_match_torch(monkeypatch, n, c, o, h, w, ks, pads, dil, threads,
                                    dtype):
    from tessera.kernels import conv as conv_kernels, threadpool as runtime
    direct_conv = _direct_module()
    monkeypatch.setattr(runtime, "_threads", lambda: threads)
    monkeypatch.setattr(conv_kernels, "_PARALLEL_MACS", 0)  # these sizes would run serially
    rng = np.random.default_rng(n * 1000 + c * 10 + o)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((o, c, *ks)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    tx, tw = torch.from_numpy(x), torch.from_numpy(wt)
    for bias in (b, None):
        ref = torch.nn.functional.conv2d(tx, tw, None if bias is None else torch.from_numpy(b),
                                         padding=pads, dilation=dil).numpy()
        y = np.full_like(ref, np.nan)
        direct_conv.conv2d_direct(x, wt, bias, pads, dil, y)
        close(y, ref, dtype)
    g = rng.standard_normal(ref.shape).astype(dtype)
    gt = torch.from_numpy(g)
    dref = torch.nn.grad.conv2d_input(x.shape, tw, gt, padding=pads, dilation=dil).numpy()
    for scatter in (0.0, np.inf):   # gathered, scattered
        monkeypatch.setattr(direct_conv, "_SCATTER", scatter)
        dx = np.full_like(x, np.nan)
        direct_conv.conv2d_input_grad_direct(g, wt, pads, dil, dx)
        close(dx, dref, dtype)
    wref = torch.nn.grad.conv2d_weight(tx, wt.shape, gt, padding=pads, dilation=dil).numpy()
    for taps in (0, 10 ** 9):   # vectors over output channels, over flat outputs
        monkeypatch.setattr(direct_conv, "_CHANNEL_TAPS", taps)
        dw = direct_conv.conv2d_weight_grad_direct(x, g, wt.shape, pads, dil)
        assert dw.dtype == dtype
        close(dw, wref, dtype)


def test_weight_grad_repeats_bit_for_bit(monkeypatch):
    """Fixed chunks of images own the partial sums, which add up in a fixed order: the
    same inputs give the same bits whichever thread took which chunk."""
    from tessera.kernels import conv as conv_kernels, threadpool as runtime
    direct_conv = _direct_module()
    monkeypatch.setattr(runtime, "_threads", lambda: 3)
    monkeypatch.setattr(conv_kernels, "_PARALLEL_MACS", 0)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((37, 6, 14, 14)).astype(np.float32)
    g = rng.standard_normal((37, 16, 10, 10)).astype(np.float32)
    for taps in (0, 10 ** 9):
        monkeypatch.setattr(direct_conv, "_CHANNEL_TAPS", taps)
        first = direct_conv.conv2d_weight_grad_direct(x, g, (16, 6, 5, 5), (0, 0), (1, 1))
        for _ in range(5):
            again = direct_conv.conv2d_weight_grad_direct(x, g, (16, 6, 5, 5), (0, 0), (1, 1))
            assert np.array_equal(first, again)


class Spy:
    """Counts the direct runs: forward (0), input gradient (1: gathered or scattered) and
    weight gradient (2)."""

    def __init__(self, monkeypatch, direct_conv):
        self.calls = {0: 0, 1: 0, 2: 0}
        forward, weight_grad = direct_conv._forward, direct_conv.conv2d_weight_grad_direct
        scatter = direct_conv._scatter

        def spy(x, w, b, pads, dilation, y, flip):
            self.calls[flip] += 1
            return forward(x, w, b, pads, dilation, y, flip)

        def spy_scatter(*args):
            self.calls[1] += 1
            return scatter(*args)

        def spy_weight_grad(*args):
            self.calls[2] += 1
            return weight_grad(*args)
        monkeypatch.setattr(direct_conv, "_forward", spy)
        monkeypatch.setattr(direct_conv, "_scatter", spy_scatter)
        monkeypatch.setattr(direct_conv, "conv2d_weight_grad_direct", spy_weight_grad)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_ops_choose_direct(monkeypatch, dtype):
    """The conv kernels take the direct path where the rule picks it (LeNet's second layer,
    forward and both gradients; the first's weight gradient), not for a stride, a 1x1
    filter, many channels or a narrow weight gradient of few taps, and agree with it
    switched off."""
    from tessera.ops import conv as C
    direct_conv = _direct_module()
    spy = Spy(monkeypatch, direct_conv)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 6, 14, 14)).astype(dtype)
    w = rng.standard_normal((16, 6, 5, 5)).astype(dtype)
    b = rng.standard_normal(16).astype(dtype)
    args = ((1, 1), ((0, 0), (0, 0)), (1, 1), 1)
    y = C._conv_kernel(x, w, b, *args)
    g = rng.standard_normal(y.shape).astype(dtype)
    dx = C._input_grad_kernel(g, w, x.shape, *args)
    dw = C._weight_grad_kernel(x, g, w.shape, *args)
    assert spy.calls == {0: 1, 1: 1, 2: 1}
    monkeypatch.setattr(direct_conv, "_ON", False)
    close(y, C._conv_kernel(x, w, b, *args), dtype)
    close(dx, C._input_grad_kernel(g, w, x.shape, *args), dtype)
    close(dw, C._weight_grad_kernel(x, g, w.shape, *args), dtype)
    assert spy.calls == {0: 1, 1: 1, 2: 1}
    monkeypatch.setattr(direct_conv, "_ON", True)
    # LeNet's first layer: its 28x28 weight gradient of 25 taps runs directly, at 8x8 not
    x1 = rng.standard_normal((2, 1, 28, 28)).astype(dtype)
    g1 = rng.standard_normal((2, 6, 28, 28)).astype(dtype)
    C._weight_grad_kernel(x1, g1, (6, 1, 5, 5), args[0], ((2, 2), (2, 2)), *args[2:])
    C._weight_grad_kernel(x1[:, :, :12, :12], g1[:, :, :8, :8], (6, 1, 5, 5), *args)
    assert spy.calls == {0: 1, 1: 1, 2: 2}
    C._conv_kernel(x, w, b, (2, 2), *args[1:])
    C._conv_kernel(x, w[:, :, :1, :1], b, *args)
    C._conv_kernel(rng.standard_normal((1, 64, 8, 8)).astype(dtype),
                   rng.standard_normal((64, 64, 3, 3)).astype(dtype), None, *args)
    assert spy.calls == {0: 1, 1: 1, 2: 2}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_eager_lenet_convs_match_torch(monkeypatch, dtype):
    """LeNet's two convolutions with F.conv2d and backward, on non-contiguous inputs (a
    transposed input, a strided slice of the first layer's output), through the direct
    kernels: forwards, input and weight gradients."""
    direct_conv = _direct_module()
    spy = Spy(monkeypatch, direct_conv)
    rng = np.random.default_rng(2)
    xt = rng.standard_normal((3, 1, 28, 28)).astype(dtype)
    w1 = rng.standard_normal((6, 1, 5, 5)).astype(dtype)
    w2 = rng.standard_normal((16, 6, 5, 5)).astype(dtype)
    b1, b2 = (rng.standard_normal(k).astype(dtype) for k in (6, 16))
    outs = []
    for lib in (torch, tessera):
        F = lib.nn.functional
        leaf, t1, t2, c1, c2 = (lib.tensor(a.copy()).requires_grad_(True)
                                for a in (xt, w1, w2, b1, b2))
        h = F.conv2d(leaf.transpose(2, 3), t1, c1, padding=2)
        y = F.conv2d(h[:, :, ::2, ::2].relu(), t2, c2)
        weights = np.linspace(-1, 1, y.numel()).reshape(tuple(y.shape)).astype(dtype)
        (y * lib.tensor(weights)).sum().backward()
        outs.append([t.detach().numpy() for t in (y, leaf.grad, t1.grad, t2.grad, c1.grad,
                                                  c2.grad)])
    for got, want in zip(outs[1], outs[0]):
        close(got, want, dtype)
    assert spy.calls == {0: 2, 1: 2, 2: 2}


def test_graph_matches_torch(monkeypatch):
    """An nn.Graph training step of LeNet's convolutions runs the direct kernels (the
    executor's conv_into included) and updates the weights as PyTorch does."""
    direct_conv = _direct_module()
    spy = Spy(monkeypatch, direct_conv)

    def make(lib):
        nn = lib.nn
        return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(6, 16, 5))

    x = np.random.default_rng(3).standard_normal((4, 1, 28, 28)).astype(np.float32)
    graph_sgd_step_matches_torch(make, x, close)
    assert spy.calls[0] >= 2 and spy.calls[1] >= 1 and spy.calls[2] >= 2


@pytest.mark.parametrize("padding,dilation,output_padding", [(0, 1, 0), (1, 2, 1), (2, 1, 0)])
def test_conv_transpose_matches_torch(monkeypatch, padding, dilation, output_padding):
    """conv_transpose2d runs the input-gradient kernel as its forward (scattered or
    gathered; with an output padding, the high side past the last window stays zero) and
    the forward kernel as its input gradient."""
    direct_conv = _direct_module()
    spy = Spy(monkeypatch, direct_conv)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 8, 9, 11)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    outs = []
    for lib in (torch, tessera):
        tx, tw = lib.tensor(x).requires_grad_(True), lib.tensor(w).requires_grad_(True)
        y = lib.nn.functional.conv_transpose2d(tx, tw, lib.tensor(b), padding=padding,
                                               dilation=dilation,
                                               output_padding=output_padding)
        y.square().sum().backward()
        outs.append([t.detach().numpy() for t in (y, tx.grad, tw.grad)])
    for got, want in zip(outs[1], outs[0]):
        close(got, want, np.float32)
    assert spy.calls[0] == 1 and spy.calls[1] == 1
