"""Convolution, pooling, padding and vision layers against PyTorch.

Every module is built in both libraries with the same constructor arguments; PyTorch's
``state_dict`` is copied into tessera through NumPy; then the output, the input gradient
and every parameter gradient are compared (float64 tightly, float32 loosely), in train and
in eval mode, along with ``repr`` and PyTorch's errors. Double backward of the conv, pool,
interpolate and pad ops is compared with PyTorch's too (op-info covers first order).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tessera

LIBS = (torch, tessera)


def npy(t) -> np.ndarray:
    return t.detach().numpy()


def tol(dtype) -> dict:
    return dict(atol=1e-10, rtol=1e-9) if dtype == np.float64 else dict(atol=5e-5, rtol=2e-4)


def build_pair(make, dtype):
    """The same module in both libraries, with PyTorch's (random) state copied over."""
    pm, tm = make(torch), make(tessera)
    if dtype == np.float64:
        pm, tm = pm.double(), tm.double()
    sd = pm.state_dict()
    assert list(sd) == list(tm.state_dict())
    tm.load_state_dict({k: tessera.tensor(v.detach().numpy()) for k, v in sd.items()})
    return pm, tm


def _convert(arrays, lib, grad):
    out = []
    for a in arrays:
        if isinstance(a, np.ndarray):
            t = lib.tensor(a.copy())
            if grad and a.dtype.kind == "f":
                t.requires_grad_(True)
            out.append(t)
        else:
            out.append(a)
    return out


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def run_step(pm, tm, arrays, dtype, rng, kwargs=None):
    """One forward/backward in both; compares outputs, input and parameter gradients."""
    kwargs = kwargs or {}
    px, tx = _convert(arrays, torch, True), _convert(arrays, tessera, True)
    po, to = pm(*px, **kwargs), tm(*tx, **kwargs)
    if isinstance(po, tuple):   # (values, indices)
        np.testing.assert_array_equal(npy(to[1]), npy(po[1]), err_msg="indices")
    po, to = _first(po), _first(to)
    assert tuple(to.shape) == tuple(po.shape)
    assert to.dtype.name == str(po.dtype).split(".")[-1]
    np.testing.assert_allclose(npy(to), npy(po), **tol(dtype), err_msg="output")
    if not po.requires_grad:
        return
    cot = rng.standard_normal(tuple(po.shape)).astype(npy(po).dtype)
    po.backward(torch.tensor(cot))
    to.backward(tessera.tensor(cot))
    for a, b in zip(px, tx):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            np.testing.assert_allclose(npy(b.grad), npy(a.grad), **tol(dtype),
                                       err_msg="input grad")
    tp = dict(tm.named_parameters())
    for name, p in pm.named_parameters():
        np.testing.assert_allclose(npy(tp[name].grad), npy(p.grad), **tol(dtype), err_msg=name)
    pm.zero_grad()
    tm.zero_grad()


# (id, factory(L) -> module, input shapes)
CONV = [
    ("conv1d", lambda L: L.nn.Conv1d(3, 4, 3), (2, 3, 9)),
    ("conv1d_s2_p1_nobias", lambda L: L.nn.Conv1d(3, 4, 4, stride=2, padding=1, bias=False),
     (2, 3, 9)),
    ("conv1d_unbatched", lambda L: L.nn.Conv1d(3, 4, 3, padding="same"), (3, 9)),
    ("conv1d_reflect", lambda L: L.nn.Conv1d(2, 4, 4, padding="same", padding_mode="reflect"),
     (2, 2, 8)),
    ("conv2d", lambda L: L.nn.Conv2d(3, 6, 3), (2, 3, 8, 7)),
    ("conv2d_full", lambda L: L.nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 2),
                                          dilation=(1, 2), groups=2), (2, 4, 9, 8)),
    ("conv2d_depthwise", lambda L: L.nn.Conv2d(4, 8, 3, padding=1, groups=4), (2, 4, 6, 6)),
    ("conv2d_same_even", lambda L: L.nn.Conv2d(3, 2, (2, 4), padding="same"), (1, 3, 6, 7)),
    ("conv2d_valid", lambda L: L.nn.Conv2d(3, 2, 3, padding="valid", bias=False),
     (2, 3, 5, 5)),
    ("conv2d_replicate", lambda L: L.nn.Conv2d(2, 3, 3, padding=(1, 2),
                                               padding_mode="replicate"), (2, 2, 5, 6)),
    ("conv2d_circular", lambda L: L.nn.Conv2d(2, 3, 3, padding=2, padding_mode="circular"),
     (2, 2, 5, 6)),
    ("conv2d_unbatched", lambda L: L.nn.Conv2d(3, 2, 3, stride=2), (3, 7, 7)),
    ("conv3d", lambda L: L.nn.Conv3d(2, 3, (2, 3, 2), stride=(1, 2, 1), padding=1),
     (2, 2, 4, 5, 4)),
    ("conv3d_groups", lambda L: L.nn.Conv3d(4, 4, 3, padding="same", groups=2, dilation=2),
     (1, 4, 5, 5, 5)),
    ("convt1d", lambda L: L.nn.ConvTranspose1d(3, 4, 3, stride=2, padding=1,
                                               output_padding=1), (2, 3, 5)),
    ("convt2d", lambda L: L.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1,
                                               groups=2), (2, 4, 4, 5)),
    ("convt2d_dil", lambda L: L.nn.ConvTranspose2d(3, 2, (2, 3), stride=1, padding=1,
                                                   output_padding=1, dilation=2,
                                                   bias=False), (2, 3, 4, 4)),
    ("convt2d_unbatched", lambda L: L.nn.ConvTranspose2d(3, 2, 3, stride=3), (3, 3, 2)),
    ("convt3d", lambda L: L.nn.ConvTranspose3d(2, 3, 2, stride=2), (1, 2, 2, 3, 2)),
]
POOL = [
    ("maxpool1d", lambda L: L.nn.MaxPool1d(3, 2, 1, ceil_mode=True), (2, 3, 10)),
    ("maxpool2d", lambda L: L.nn.MaxPool2d(2), (2, 3, 6, 7)),
    ("maxpool2d_full", lambda L: L.nn.MaxPool2d((3, 2), (2, 1), (1, 0), dilation=(1, 2),
                                                ceil_mode=True), (2, 3, 7, 8)),
    ("maxpool2d_indices", lambda L: L.nn.MaxPool2d(2, return_indices=True), (2, 3, 6, 6)),
    ("maxpool3d", lambda L: L.nn.MaxPool3d(2, 1, 1), (1, 2, 3, 4, 3)),
    ("avgpool1d", lambda L: L.nn.AvgPool1d(3, 2, 1, count_include_pad=False), (2, 3, 10)),
    ("avgpool2d", lambda L: L.nn.AvgPool2d(3, 2, 1, ceil_mode=True), (2, 3, 7, 8)),
    ("avgpool2d_div", lambda L: L.nn.AvgPool2d(2, divisor_override=3), (2, 3, 6, 6)),
    ("avgpool3d", lambda L: L.nn.AvgPool3d((2, 3, 2), padding=1), (1, 2, 4, 5, 4)),
    ("aap1d", lambda L: L.nn.AdaptiveAvgPool1d(4), (2, 3, 10)),
    ("aap2d", lambda L: L.nn.AdaptiveAvgPool2d((3, None)), (2, 3, 7, 5)),
    ("aap2d_global", lambda L: L.nn.AdaptiveAvgPool2d(1), (2, 3, 7, 5)),
    ("aap3d", lambda L: L.nn.AdaptiveAvgPool3d((2, 3, 1)), (1, 2, 5, 4, 3)),
    ("amp1d", lambda L: L.nn.AdaptiveMaxPool1d(4), (2, 3, 10)),
    ("amp2d", lambda L: L.nn.AdaptiveMaxPool2d((3, 4), return_indices=True), (2, 3, 7, 5)),
    ("amp3d", lambda L: L.nn.AdaptiveMaxPool3d(2), (1, 2, 5, 4, 3)),
    ("lppool1d", lambda L: L.nn.LPPool1d(2, 3, 2), (2, 3, 9)),
    ("lppool2d", lambda L: L.nn.LPPool2d(1.5, (2, 3), ceil_mode=True), (2, 3, 7, 8)),
    ("lppool3d", lambda L: L.nn.LPPool3d(3, 2), (1, 2, 4, 4, 4)),
]
PAD = [
    ("zeropad1d", lambda L: L.nn.ZeroPad1d((2, -1)), (2, 3, 6)),
    ("zeropad2d", lambda L: L.nn.ZeroPad2d(2), (2, 3, 4, 5)),
    ("zeropad3d", lambda L: L.nn.ZeroPad3d((1, 0, 2, 1, 0, 1)), (1, 2, 3, 3, 3)),
    ("constpad1d", lambda L: L.nn.ConstantPad1d(2, 3.5), (2, 3, 6)),
    ("constpad2d", lambda L: L.nn.ConstantPad2d((1, 2, 0, -1), -1.0), (2, 3, 4, 5)),
    ("constpad3d", lambda L: L.nn.ConstantPad3d(1, 0.5), (1, 2, 3, 3, 3)),
    ("reflpad1d", lambda L: L.nn.ReflectionPad1d((3, 1)), (2, 3, 6)),
    ("reflpad2d", lambda L: L.nn.ReflectionPad2d((1, 2, 3, 0)), (2, 3, 4, 5)),
    ("reflpad3d", lambda L: L.nn.ReflectionPad3d(1), (1, 2, 3, 3, 3)),
    ("replpad1d", lambda L: L.nn.ReplicationPad1d(3), (2, 3, 6)),
    ("replpad2d", lambda L: L.nn.ReplicationPad2d((0, 2, 3, 1)), (3, 4, 5)),
    ("replpad3d", lambda L: L.nn.ReplicationPad3d((1, 2, 0, 1, 2, 0)), (1, 2, 3, 3, 3)),
    ("circpad1d", lambda L: L.nn.CircularPad1d((2, 3)), (2, 3, 6)),
    ("circpad2d", lambda L: L.nn.CircularPad2d((1, 2, -1, 3)), (2, 3, 4, 5)),
    ("circpad3d", lambda L: L.nn.CircularPad3d(1), (1, 2, 3, 3, 3)),
]
VISION = [
    ("upsample_nearest", lambda L: L.nn.Upsample(scale_factor=2), (2, 3, 4, 5)),
    ("upsample_size", lambda L: L.nn.Upsample(size=(7, 3), mode="nearest-exact"),
     (2, 3, 4, 5)),
    ("upsample_bilinear", lambda L: L.nn.Upsample(scale_factor=1.5, mode="bilinear"),
     (2, 3, 4, 5)),
    ("upsample_bicubic", lambda L: L.nn.Upsample(size=(6, 9), mode="bicubic",
                                                 align_corners=True), (2, 3, 4, 5)),
    ("upsample_linear", lambda L: L.nn.Upsample(scale_factor=(2.5,), mode="linear"),
     (2, 3, 5)),
    ("upsample_trilinear", lambda L: L.nn.Upsample(scale_factor=(2, 1, 1.5), mode="trilinear",
                                                   recompute_scale_factor=True),
     (1, 2, 3, 4, 3)),
    ("upsample_area", lambda L: L.nn.Upsample(size=5, mode="area"), (2, 3, 7, 8)),
    ("upsampling_nearest2d", lambda L: L.nn.UpsamplingNearest2d(scale_factor=3), (1, 2, 3, 3)),
    ("upsampling_bilinear2d", lambda L: L.nn.UpsamplingBilinear2d(size=(5, 7)), (1, 2, 3, 3)),
    ("pixel_shuffle", lambda L: L.nn.PixelShuffle(2), (2, 8, 3, 4)),
    ("pixel_unshuffle", lambda L: L.nn.PixelUnshuffle(2), (2, 2, 4, 6)),
    ("channel_shuffle", lambda L: L.nn.ChannelShuffle(3), (2, 6, 3, 3)),
    ("unfold", lambda L: L.nn.Unfold((2, 3), dilation=1, padding=1, stride=2), (2, 3, 6, 7)),
    ("fold", lambda L: L.nn.Fold((6, 7), (2, 3), padding=1, stride=2), (2, 18, 16)),
]
ALL = CONV + POOL + PAD + VISION


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name,make,shape", ALL, ids=[c[0] for c in ALL])
def test_module_matches_torch(name, make, shape, dtype):
    rng = np.random.default_rng(0)
    pm, tm = build_pair(make, dtype)
    assert repr(tm) == repr(pm)
    x = rng.uniform(0.2, 2.0, size=shape).astype(dtype)   # positive: lp_pool's x ** p
    if name.startswith("maxpool") or name.startswith("amp"):
        x = (rng.permutation(x.size).reshape(shape) * 0.37).astype(dtype)   # no ties
    for mode in ("train", "eval"):
        getattr(pm, mode)()
        getattr(tm, mode)()
        run_step(pm, tm, [x], dtype, rng)


def test_conv_default_init_matches_torch_distribution():
    for make in (lambda L: L.nn.Conv2d(16, 32, 3), lambda L: L.nn.Conv1d(6, 4, 5, groups=2),
                 lambda L: L.nn.ConvTranspose2d(8, 12, 3, groups=4),
                 lambda L: L.nn.Conv3d(4, 8, (1, 2, 3))):
        torch.manual_seed(0)
        tessera.manual_seed(0)
        pm, tm = make(torch), make(tessera)
        w = npy(pm.weight)
        fan_in = w.shape[1] * int(np.prod(w.shape[2:]))
        for name in ("weight", "bias"):
            p, t = npy(getattr(pm, name)), npy(getattr(tm, name))
            assert p.shape == t.shape and t.dtype == np.float32
            bound = 1 / math.sqrt(fan_in)   # kaiming_uniform_(a=sqrt(5)) and the bias rule
            assert np.abs(t).max() <= bound + 1e-7
            if t.size > 100:
                assert np.abs(t).max() > 0.9 * bound
                assert abs(t.std() - bound / math.sqrt(3)) < 0.1 * bound


def test_parameter_shapes_and_attributes():
    for L in LIBS:
        c = L.nn.Conv2d(4, 6, 3, groups=2)
        assert tuple(c.weight.shape) == (6, 2, 3, 3) and tuple(c.bias.shape) == (6,)
        assert c.kernel_size == (3, 3) and c.stride == (1, 1) and c.padding == (0, 0)
        assert c.dilation == (1, 1) and c.output_padding == (0, 0) and not c.transposed
        t = L.nn.ConvTranspose1d(4, 6, 3, groups=2)
        assert tuple(t.weight.shape) == (4, 3, 3) and t.transposed
        assert t.kernel_size == (3,) and t.output_padding == (0,)
        assert L.nn.Conv1d(2, 2, 3, padding="same")._reversed_padding_repeated_twice == [1, 1]
        assert L.nn.Conv2d(2, 2, (2, 4), padding="same")._reversed_padding_repeated_twice == \
            [1, 2, 0, 1]
        assert L.nn.Conv2d(2, 2, 3, bias=False).bias is None
        assert L.nn.AvgPool1d(3).kernel_size == (3,) and L.nn.AvgPool2d(3).stride == 3
        assert L.nn.MaxUnpool2d(2).kernel_size == (2, 2)
        assert L.nn.ReflectionPad2d(1).padding == (1, 1, 1, 1)


CONSTRUCTOR_ERRORS = [
    lambda L: L.nn.Conv2d(4, 6, 3, groups=0),
    lambda L: L.nn.Conv2d(4, 6, 3, groups=3),
    lambda L: L.nn.Conv2d(3, 6, 3, groups=2),
    lambda L: L.nn.Conv2d(4, 6, 3, padding="full"),
    lambda L: L.nn.Conv2d(4, 6, 3, padding="same", stride=2),
    lambda L: L.nn.Conv2d(4, 6, 3, padding_mode="mirror"),
    lambda L: L.nn.ConvTranspose2d(4, 6, 3, padding_mode="reflect"),
]


@pytest.mark.parametrize("make", CONSTRUCTOR_ERRORS)
def test_constructor_errors_match_torch(make):
    with pytest.raises(Exception) as ref:
        make(torch)
    with pytest.raises(type(ref.value)):
        make(tessera)


FORWARD_ERRORS = [
    (lambda L: L.nn.Conv2d(3, 4, 3), (3, 5)),
    (lambda L: L.nn.Conv2d(3, 4, 3), (2, 2, 5, 5)),
    (lambda L: L.nn.Conv2d(3, 4, 3), (2, 3, 2, 2)),
    (lambda L: L.nn.Conv1d(3, 4, 3), (2, 3, 5, 5)),
    (lambda L: L.nn.ConvTranspose2d(3, 4, 3), (2, 4, 5, 5)),
    (lambda L: L.nn.MaxPool2d(3), (2, 3, 2, 2)),
    (lambda L: L.nn.MaxPool2d(2, padding=2), (2, 3, 6, 6)),
    (lambda L: L.nn.AvgPool1d(2), (2, 3, 4, 4)),
    (lambda L: L.nn.AdaptiveAvgPool2d(2), (4, 4)),
    (lambda L: L.nn.ReflectionPad1d(5), (2, 3, 4)),
    (lambda L: L.nn.CircularPad2d(1), (4, 4)),
    (lambda L: L.nn.Upsample(size=3, mode="bilinear"), (2, 3, 4)),
    (lambda L: L.nn.PixelShuffle(2), (2, 6, 3, 3)),
    (lambda L: L.nn.Fold((4, 4), 2), (2, 7, 9)),
]


@pytest.mark.parametrize("make,shape", FORWARD_ERRORS)
def test_forward_errors_match_torch(make, shape):
    x = np.ones(shape, np.float32)
    with pytest.raises(Exception) as ref:
        make(torch)(torch.tensor(x))
    with pytest.raises(type(ref.value)):
        make(tessera)(tessera.tensor(x))


@pytest.mark.parametrize("output_size", [(9, 11), [2, 6, 10, 10], (8, 10), (12, 10), (9,)])
def test_conv_transpose_output_size(output_size):
    rng = np.random.default_rng(1)
    pm, tm = build_pair(lambda L: L.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1), np.float64)
    x = rng.standard_normal((2, 4, 5, 6))
    try:
        ref = pm(torch.tensor(x), output_size=output_size)
    except Exception as e:
        with pytest.raises(type(e)):
            tm(tessera.tensor(x), output_size=output_size)
        return
    out = tm(tessera.tensor(x), output_size=output_size)
    np.testing.assert_allclose(npy(out), npy(ref), atol=1e-12)


def test_maxpool_unpool_round_trip():
    rng = np.random.default_rng(2)
    x = (rng.permutation(2 * 3 * 7 * 8).reshape(2, 3, 7, 8) * 0.1)
    outs = []
    for L in LIBS:
        pool = L.nn.MaxPool2d(2, return_indices=True)
        unpool = L.nn.MaxUnpool2d(2)
        t = L.tensor(x, requires_grad=True)
        y, idx = pool(t)
        r = unpool(y, idx, output_size=t.shape)
        r.sum().backward()
        outs.append((npy(r), npy(t.grad), npy(idx)))
        assert repr(unpool) == "MaxUnpool2d(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0))"
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b)


# ---- double backward against PyTorch -----------------------------------------------------

F_CASES = [
    ("conv2d", lambda L, x, w: L.nn.functional.conv2d(x, w, stride=2, padding=1, groups=2),
     [(2, 4, 5, 5), (4, 2, 3, 3)]),
    ("conv1d_dil", lambda L, x, w: L.nn.functional.conv1d(x, w, padding="same", dilation=2),
     [(2, 3, 7), (2, 3, 2)]),
    ("conv_transpose2d", lambda L, x, w: L.nn.functional.conv_transpose2d(
        x, w, stride=2, padding=1, output_padding=1), [(2, 3, 3, 4), (3, 2, 3, 3)]),
    ("conv_transpose1d_dil", lambda L, x, w: L.nn.functional.conv_transpose1d(
        x, w, stride=1, padding=1, output_padding=1, dilation=2), [(2, 3, 5), (3, 2, 3)]),
    ("max_pool2d", lambda L, x: L.nn.functional.max_pool2d(x, 3, 2, 1, ceil_mode=True),
     [(2, 3, 6, 7)]),
    ("adaptive_max_pool2d", lambda L, x: L.nn.functional.adaptive_max_pool2d(x, (3, 2)),
     [(2, 3, 7, 5)]),
    ("avg_pool2d", lambda L, x: L.nn.functional.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
     [(2, 3, 6, 7)]),
    ("adaptive_avg_pool2d", lambda L, x: L.nn.functional.adaptive_avg_pool2d(x, (3, 4)),
     [(2, 3, 7, 5)]),
    ("interpolate_bicubic", lambda L, x: L.nn.functional.interpolate(
        x, size=(7, 4), mode="bicubic"), [(2, 3, 4, 5)]),
    ("interpolate_nearest", lambda L, x: L.nn.functional.interpolate(x, scale_factor=1.6),
     [(2, 3, 4, 5)]),
    ("pad_reflect", lambda L, x: L.nn.functional.pad(x, (2, 1, -1, 3), mode="reflect"),
     [(2, 3, 4, 5)]),
    ("pad_circular", lambda L, x: L.nn.functional.pad(x, (2, -1, 1, 3), mode="circular"),
     [(2, 3, 4, 5)]),
    ("pad_replicate", lambda L, x: L.nn.functional.pad(x, (2, 1), mode="replicate"),
     [(2, 3, 5)]),
    ("pad_constant", lambda L, x: L.nn.functional.pad(x, (2, -1), value=1.5), [(2, 3, 5)]),
    ("unfold", lambda L, x: L.nn.functional.unfold(x, 2, padding=1, stride=2), [(2, 3, 5, 6)]),
    ("fold", lambda L, x: L.nn.functional.fold(x, (4, 5), 2, padding=1, stride=2),
     [(2, 12, 9)]),
    ("grid_sample_bilinear", lambda L, x, g: L.nn.functional.grid_sample(
        x, g, padding_mode="reflection", align_corners=False), [(2, 3, 4, 5), (2, 3, 2, 2)]),
    ("grid_sample_bicubic", lambda L, x, g: L.nn.functional.grid_sample(
        x, g, mode="bicubic", padding_mode="border", align_corners=True),
     [(1, 2, 4, 5), (1, 3, 2, 2)]),
]


@pytest.mark.parametrize("name,fn,shapes", F_CASES, ids=[c[0] for c in F_CASES])
def test_double_backward_matches_torch(name, fn, shapes):
    """d/d(inputs, cotangent) of <grad(f)(inputs; v), u> in both libraries."""
    rng = np.random.default_rng(3)
    arrays = [rng.uniform(-1, 1, s) for s in shapes]
    if name.startswith(("max", "adaptive_max")):
        arrays[0] = rng.permutation(arrays[0].size).reshape(shapes[0]) * 0.1
    results = []
    for L in LIBS:
        xs = [L.tensor(a, requires_grad=True) for a in arrays]
        y = fn(L, *xs)
        v = L.tensor(np.random.default_rng(4).standard_normal(tuple(y.shape)),
                     requires_grad=True)
        gs = L.autograd.grad(y, xs, v, create_graph=True)
        us = [L.tensor(np.random.default_rng(5 + i).standard_normal(tuple(g.shape)))
              for i, g in enumerate(gs)]
        total = sum((g * u).sum() for g, u in zip(gs, us))
        second = L.autograd.grad(total, xs + [v], allow_unused=True)
        results.append([npy(g) for g in gs] + [None if s is None else npy(s) for s in second])
    for ours, ref in zip(results[1], results[0]):
        if ref is None or ours is None:
            assert ref is None or not np.any(ref) or ours is not None
            assert ours is None or not np.any(ours) or ref is not None
            continue
        np.testing.assert_allclose(ours, ref, atol=1e-10, rtol=1e-9)


# ---- behaviour notes ---------------------------------------------------------------------

def test_antialias_is_not_supported():
    x = tessera.ones(1, 1, 4, 4)
    with pytest.raises(NotImplementedError):
        tessera.nn.functional.interpolate(x, size=(2, 2), mode="bilinear", antialias=True)
    with pytest.raises(ValueError):   # PyTorch's own check comes first
        tessera.nn.functional.interpolate(x, size=(2, 2), mode="nearest", antialias=True)


def test_pixel_unshuffle_of_an_empty_batch_has_the_documented_shape():
    # PyTorch 2.13 returns the input's shape here (a bug); the documented shape is this
    out = tessera.nn.functional.pixel_unshuffle(tessera.ones(0, 2, 4, 4), 2)
    assert tuple(out.shape) == (0, 8, 2, 2)


def test_shuffles_never_alias_their_input():
    x = tessera.ones(2, 2, 4, 3, 1)
    for y in (tessera.nn.functional.pixel_shuffle(x, 1),
              tessera.nn.functional.channel_shuffle(x, 2)):
        y.add_(1.0)
    assert float(x.sum()) == x.numel()


def test_ops_run_on_meta_device():
    x = tessera.empty(2, 4, 9, 8, device="meta")
    w = tessera.empty(6, 2, 3, 3, device="meta")
    F = tessera.nn.functional
    assert tuple(F.conv2d(x, w, stride=2, padding=1, groups=2).shape) == (2, 6, 5, 4)
    y, i = F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True)
    assert tuple(y.shape) == (2, 4, 5, 5) and i.dtype is tessera.int64
    assert tuple(F.interpolate(x, scale_factor=1.5, mode="bilinear").shape) == (2, 4, 13, 12)
    assert tuple(F.pad(x, (1, 2, 3, -4), mode="reflect").shape) == (2, 4, 8, 11)


@pytest.mark.parametrize("k,s,p,d", [(2, 2, 0, 1), (3, 1, 1, 1), (3, 2, 1, 2)])
def test_max_pool_nan_and_tie_indices_match_torch(k, s, p, d):
    """Ties keep the first maximum, a NaN wins over numbers and the last NaN is taken."""
    x = np.round(np.random.default_rng(0).standard_normal((2, 3, 8, 8)), 1).astype(np.float32)
    x[0, 0, 0, 1] = x[0, 0, 1, 0] = x[1, 2, 5, 5] = np.nan
    a, ia = tessera.nn.functional.max_pool2d(tessera.tensor(x), k, s, p, d,
                                             return_indices=True)
    b, ib = torch.nn.functional.max_pool2d(torch.tensor(x), k, s, p, d, return_indices=True)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(ia.numpy(), ib.numpy())
