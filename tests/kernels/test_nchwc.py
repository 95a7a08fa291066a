"""tessera.kernels.nchwc against PyTorch's conv2d, max_pool2d and avg_pool2d (the blocked
result unblocked): channels that are not a multiple of the block, images of 1 to 56 pixels,
strides, padding, dilation, kernels 1 to 7, depthwise and plain-input first layers, every
epilogue, both block sizes on every path the CPU runs (chosen in this process through the
module's path choice), one thread against two, the path forced by TESSERA_NCHWC_ISA in a
child process, and the errors of bad geometry."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from tessera.kernels import cc

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")

ISAS = ("portable", "avx2", "avx512")


@pytest.fixture(scope="module")
def N():
    from tessera.kernels import nchwc
    if not nchwc.usable():
        pytest.skip("code generation is off (TESSERA_CODEGEN=0)")
    return nchwc


@pytest.fixture(params=ISAS)
def path(request, N, monkeypatch):
    """Every path this CPU runs: the binding's choice replaced for the test."""
    index = ISAS.index(request.param)
    if not N._lib().tsr_nchwc_isa_supported(index):
        pytest.skip(f"this CPU lacks the {request.param} path")
    monkeypatch.setattr(N, "_isa", lambda: index)
    return request.param


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def unblocked_pad(y, c):
    """The channels past c of a blocked array, as (n, extra, h, w)."""
    n, cb, h, w, b = y.shape
    return y.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)[:, c:]


def conv(N, x, w, bias, stride, pads, dilation, groups, block, plain=False, act=None,
         bounds=None, residual=None, residual_first=False):
    """The blocked convolution of plain x: (plain result, the blocked output)."""
    n, c, h, wd = x.shape
    t, le, b, r = N._pads(pads, "test")
    oh = N.conv_output_size(h, w.shape[2], stride[0], t, b, dilation[0])
    ow = N.conv_output_size(wd, w.shape[3], stride[1], le, r, dilation[1])
    o = w.shape[0]
    run = N.conv_bound(x.shape, (n, o, oh, ow), w.shape, stride, pads, dilation, groups, block,
                       plain, act, bounds, residual_first)
    wp = N.pack_weights(w, groups=groups, block=block, plain_input=plain)
    xb = np.ascontiguousarray(x) if plain else N.to_blocked(x, block)
    y = np.full(N.blocked_shape((n, o, oh, ow), block), np.nan, np.float32)
    rb = None if residual is None else N.to_blocked(residual, block)
    run(xb, wp, bias, rb, y)
    return N.from_blocked(y, o), y


def reference(x, w, bias, stride, pads, dilation, groups, act=None, bounds=None,
              residual=None, residual_first=False):
    xt = torch.from_numpy(x)
    if len(pads) == 4:   # (top, left, bottom, right): F.pad takes (left, right, top, bottom)
        xt = TF.pad(xt, (pads[1], pads[3], pads[0], pads[2]))
        pads = (0, 0)
    y = TF.conv2d(xt, torch.from_numpy(w), None if bias is None else torch.from_numpy(bias),
                  stride, pads, dilation, groups)
    r = None if residual is None else torch.from_numpy(residual)
    if r is not None and residual_first:
        y = y + r
    if act == "relu":
        y = torch.relu(y)
    elif act == "relu6":
        y = TF.relu6(y)
    elif act == "clamp":
        y = y.clamp(*bounds)
    if r is not None and not residual_first:
        y = y + r
    return y.numpy()


def close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))


# (n, c, h, w, o, k, stride, pads, dilation, groups, plain)
SHAPES = [
    (1, 64, 13, 13, 64, 3, 1, 1, 1, 1, False),
    (1, 17, 13, 11, 24, 3, 2, 1, 1, 1, False),
    (2, 24, 7, 7, 17, 1, 1, 0, 1, 1, False),        # 1x1 stride 1: one long row
    (1, 96, 13, 13, 24, 1, 1, 0, 1, 1, False),
    (1, 24, 13, 13, 40, 1, 2, 0, 1, 1, False),      # 1x1 stride 2 (a downsample)
    (1, 3, 56, 56, 64, 7, 2, 3, 1, 1, True),        # ResNet's first layer, plain input
    (1, 3, 13, 13, 17, 3, 1, 1, 1, 1, True),
    (1, 4, 13, 7, 16, 5, 2, 2, 1, 1, True),
    (1, 17, 1, 1, 17, 1, 1, 0, 1, 1, False),
    (1, 17, 1, 1, 9, 3, 1, 1, 1, 1, False),         # every tap but the centre padding
    (1, 16, 7, 7, 32, 5, 1, 2, 1, 1, False),
    (1, 8, 13, 13, 8, 3, 1, 3, 1, 1, False),        # padding past the kernel's reach
    (1, 17, 13, 13, 20, 3, 1, 2, 2, 1, False),      # dilation 2
    (1, 17, 13, 13, 20, 7, 3, 3, 1, 1, False),      # stride 3
    (1, 32, 56, 56, 32, 3, 1, 1, 1, 1, False),
    (1, 144, 13, 13, 144, 3, 1, 1, 1, 144, False),  # depthwise
    (1, 144, 13, 13, 144, 3, 2, 1, 1, 144, False),
    (1, 17, 7, 7, 17, 5, 1, 2, 1, 17, False),
    (1, 24, 56, 56, 24, 3, 2, 1, 1, 24, False),
    (1, 3, 1, 1, 3, 3, 1, 1, 1, 3, False),
    (1, 24, 13, 13, 24, 3, 1, 1, 2, 24, False),     # depthwise, dilation 2
    # depthwise 3x3 rows whole in tiles, their padding columns read as zeros: both ends,
    # left only (stride 2, even width), none (no padding), a one-pixel row (both in one
    # tile), and padding 2 (the border columns one at a time instead)
    (1, 40, 9, 30, 40, 3, 1, 1, 1, 40, False),
    (2, 24, 14, 14, 24, 3, 2, 1, 1, 24, False),
    (1, 20, 7, 7, 20, 3, 1, 0, 1, 20, False),
    (1, 33, 5, 1, 33, 3, 1, 1, 1, 33, False),
    (1, 20, 8, 9, 20, 3, 1, 2, 1, 20, False),
]
EPILOGUES = [(None, False), ("relu", False), ("relu6", True), ("clamp", True),
             ("relu", "first"), (None, True)]


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("i", range(len(SHAPES)))
def test_conv_shapes(N, path, i, block):
    n, c, h, w, o, k, s, p, d, groups, plain = SHAPES[i]
    act, res = EPILOGUES[i % len(EPILOGUES)]
    x, wt = rand(n, c, h, w, seed=i), rand(o, c // groups, k, k, seed=100 + i)
    bias = rand(o, seed=200 + i) if i % 3 else None
    bounds = (-0.5, 0.7) if act == "clamp" else None
    oh = N.conv_output_size(h, k, s, p, p, d)
    ow = N.conv_output_size(w, k, s, p, p, d)
    residual = rand(n, o, oh, ow, seed=300 + i) if res else None
    kw = dict(act=act, bounds=bounds, residual=residual, residual_first=res == "first")
    got, y = conv(N, x, wt, bias, (s, s), (p, p), (d, d), groups, block, plain, **kw)
    close(got, reference(x, wt, bias, (s, s), (p, p), (d, d), groups, **kw))
    assert not np.any(unblocked_pad(y, o)), "the padded output channels must be zero"


@pytest.mark.parametrize("act,bounds", [(None, None), ("relu", None), ("relu6", None),
                                        ("clamp", (0.25, 1.5))])
@pytest.mark.parametrize("residual", [None, "after", "first"])
@pytest.mark.parametrize("groups", [1, 24])
def test_epilogues(N, path, act, bounds, residual, groups):
    block = N.block() if path == "avx512" else 8
    x, wt = rand(1, 24, 9, 9, seed=1), rand(24, 24 // groups, 3, 3, seed=2)
    bias, r = rand(24, seed=3), rand(1, 24, 9, 9, seed=4)
    kw = dict(act=act, bounds=bounds, residual=None if residual is None else r,
              residual_first=residual == "first")
    got, y = conv(N, x, wt, bias, (1, 1), (1, 1), (1, 1), groups, block, **kw)
    close(got, reference(x, wt, bias, (1, 1), (1, 1), (1, 1), groups, **kw))
    # clamp to [0.25, 1.5] would lift a padded channel to 0.25: it stays 0
    assert not np.any(unblocked_pad(y, 24))


def test_asymmetric_pads_and_padded_bias(N, path):
    x, wt = rand(1, 17, 13, 12, seed=5), rand(20, 17, 3, 3, seed=6)
    bias = rand(20, seed=7)
    block = 8
    padded = np.zeros(24, np.float32)
    padded[:20] = bias
    got, _ = conv(N, x, wt, padded, (2, 2), (0, 1, 1, 0), (1, 1), 1, block)
    close(got, reference(x, wt, bias, (2, 2), (0, 1, 1, 0), (1, 1), 1))


def test_channel_chunks(N, path):
    """Several passes over the input blocks (forced small): the same result."""
    x, wt = rand(1, 40, 7, 7, seed=8), rand(24, 40, 3, 3, seed=9)
    bias, r = rand(24, seed=10), rand(1, 24, 7, 7, seed=11)
    want = reference(x, wt, bias, (1, 1), (1, 1), (1, 1), 1, "relu", residual=r)
    run = N.conv_bound(x.shape, (1, 24, 7, 7), wt.shape, 1, 1, 1, 1, 8, False, "relu",
                       _tiles=(2, 3, 2, 3))
    y = np.empty((1, 3, 7, 7, 8), np.float32)
    run(N.to_blocked(x, 8), N.pack_weights(wt, groups=1, block=8), bias, N.to_blocked(r, 8), y)
    close(N.from_blocked(y, 24), want)


def test_convolutions_run_in_libraries_of_their_own_tiles(N, path, monkeypatch):
    """A convolution bound alone compiles the tiles ``conv_tiles`` names for it, and nothing
    else; a set announced by ``expect_tiles`` is one library for the convolutions it holds
    (a graph's), and one already loaded serves any convolution among its tiles."""
    if path == "portable":
        pytest.skip("the portable path has no register tiles")
    block = 16 if path == "avx512" else 8
    monkeypatch.setattr(N, "_LIBS", {})
    monkeypatch.setattr(N, "_EXPECTED", {})
    a = ((1, 24, 9, 11), (1, 40, 9, 11), (40, 24, 3, 3), 1, 1)
    b = ((1, 40, 9, 11), (1, 40, 5, 6), (40, 40, 3, 3), 2, 1)
    c = ((1, 40, 9, 11), (1, 40, 9, 11), (40, 40, 1, 1), 1, 0)

    def bind(xs, ys, ws, stride, pad):
        x, wt = rand(*xs, seed=40), rand(*ws, seed=41)
        run = N.conv_bound(xs, ys, ws, stride, pad, 1, 1, block)
        y = np.empty(N.blocked_shape(ys, block), np.float32)
        run(N.to_blocked(x, block), N.pack_weights(wt, groups=1, block=block), None, None, y)
        close(N.from_blocked(y, ys[1]), reference(x, wt, None, (stride,) * 2, (pad,) * 2,
                                                    (1, 1), 1))

    tiles = {k: N.conv_tiles(*g[:3], g[3], g[4], 1, 1, block)[0]
             for k, g in (("a", a), ("b", b), ("c", c))}
    assert len({tiles["a"], tiles["b"], tiles["c"]}) == 3
    bind(*c)
    assert N._LIBS == {block: [tiles["c"]]}
    N.expect_tiles(tiles["a"] | tiles["b"], block)
    bind(*a)
    bind(*b)
    bind(*c)
    assert N._LIBS == {block: [tiles["c"], tiles["a"] | tiles["b"]]}


@pytest.mark.parametrize("tiles", [None, (2, 3, 2, 3)], ids=["planned", "chunks"])
@pytest.mark.parametrize("first", [False, True])
def test_residual_in_its_own_buffer(N, path, tiles, first):
    """y over its residual (the same array): each tile reads a residual value before it
    stores there; a plan of several passes over the input blocks makes one instead (partial
    sums would overwrite the residual). On one and two threads."""
    import tessera
    x, wt = rand(1, 40, 9, 11, seed=30), rand(24, 40, 3, 3, seed=31)
    bias, r = rand(24, seed=32), rand(1, 24, 9, 11, seed=33)
    want = reference(x, wt, bias, (1, 1), (1, 1), (1, 1), 1, "relu", residual=r,
                     residual_first=first)
    run = N.conv_bound(x.shape, (1, 24, 9, 11), wt.shape, 1, 1, 1, 1, 8, False, "relu",
                       residual_first=first, _tiles=tiles)
    assert run.single_pass() == (tiles is None)
    before = tessera.get_num_threads()
    try:
        for threads in (1, 2):
            tessera.set_num_threads(threads)
            y = N.to_blocked(r, 8)
            run(N.to_blocked(x, 8), N.pack_weights(wt, groups=1, block=8), bias, y, y)
            close(N.from_blocked(y, 24), want)
    finally:
        tessera.set_num_threads(before)


def test_two_threads_same_bits(N):
    import tessera
    x, wt = rand(1, 64, 14, 14, seed=12), rand(96, 64, 3, 3, seed=13)
    B = N.block()
    before = tessera.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            tessera.set_num_threads(threads)
            out.append(conv(N, x, wt, rand(96, seed=14), (1, 1), (1, 1), (1, 1), 1, B,
                            act="relu")[0])
    finally:
        tessera.set_num_threads(before)
    assert np.array_equal(out[0], out[1])


@pytest.mark.parametrize("o", [64, 48, 17])
def test_plain_input_stem(N, path, o):
    """A first layer reading plain NCHW (ResNet's 7x7/2 stem; on AVX-512 its 2-block x
    14-pixel tiles, 3 blocks for 48 channels): PyTorch's values, the same bits on 1 and 2
    threads."""
    import tessera
    block = 8 if path != "avx512" else 16
    x, wt, bias = rand(1, 3, 61, 66, seed=21), rand(o, 3, 7, 7, seed=22), rand(o, seed=23)
    before = tessera.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            tessera.set_num_threads(threads)
            out.append(conv(N, x, wt, bias, (2, 2), (3, 3), (1, 1), 1, block, True,
                            act="relu")[0])
    finally:
        tessera.set_num_threads(before)
    assert np.array_equal(out[0], out[1])
    close(out[0], reference(x, wt, bias, (2, 2), (3, 3), (1, 1), 1, act="relu"))


@pytest.mark.parametrize("c,o,k,h,groups", [
    (96, 320, 1, 7, 1),      # 20 blocks of 16: 5 groups of 4 (MobileNetV2's last 1x1)
    (96, 576, 1, 14, 1),     # 36 blocks: 9 groups
    (144, 144, 3, 14, 144),  # depthwise, 9 blocks of 16
])
def test_groups_not_dividing_among_threads(N, c, o, k, h, groups):
    """A convolution whose output-block groups do not divide among two threads (its groups
    cut into bands of rows then): the one-thread bits, and PyTorch's values."""
    import tessera
    x, wt = rand(1, c, h, h, seed=21), rand(o, c // groups, k, k, seed=22)
    bias, pad = rand(o, seed=23), (k // 2, k // 2)
    before = tessera.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            tessera.set_num_threads(threads)
            out.append(conv(N, x, wt, bias, (1, 1), pad, (1, 1), groups, N.block(),
                            act="relu")[0])
    finally:
        tessera.set_num_threads(before)
    assert np.array_equal(out[0], out[1])
    want = reference(x, wt, bias, (1, 1), pad, (1, 1), groups, act="relu")
    np.testing.assert_allclose(out[1], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind,k,s,p,cip", [
    ("max", 3, 2, 1, True), ("max", 2, 2, 0, True), ("max", 3, 1, 1, True),
    ("avg", 3, 2, 1, True), ("avg", 3, 2, 1, False), ("avg", 2, 2, 0, True),
    ("avg", 7, 1, 0, True), ("max", (3, 2), (1, 2), (1, 0), True)])
@pytest.mark.parametrize("c,h,w", [(17, 13, 13), (64, 56, 56), (24, 7, 7), (3, 1, 1)])
def test_pool(N, path, kind, k, s, p, cip, c, h, w):
    kk = k if isinstance(k, tuple) else (k, k)
    if kk[0] > h + 2 * (p if isinstance(p, int) else p[0]) or kk[1] > w + 2 * (
            p if isinstance(p, int) else p[1]):
        pytest.skip("window larger than the padded image")
    block = 8 if path != "avx512" else 16
    x = rand(2, c, h, w, seed=c)
    xt = torch.from_numpy(x)
    want = (TF.max_pool2d(xt, k, s, p) if kind == "max"
            else TF.avg_pool2d(xt, k, s, p, count_include_pad=cip)).numpy()
    run = N.pool_bound(x.shape, k, s, p, kind, cip, block)
    y = np.full(N.blocked_shape(want.shape, block), np.nan, np.float32)
    run(N.to_blocked(x, block), y)
    close(N.from_blocked(y, c), want)
    assert not np.any(unblocked_pad(y, c))


def test_global_average(N):
    B = N.block()
    x = rand(1, 512, 7, 7, seed=3)
    run = N.pool_bound(x.shape, (7, 7), 1, 0, "avg", True, B)
    y = np.empty((1, 512 // B, 1, 1, B), np.float32)
    run(N.to_blocked(x, B), y)
    close(N.from_blocked(y, 512), x.mean(axis=(2, 3), keepdims=True))


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("c", [1, 3, 8, 17, 24])
def test_layout_round_trip(N, block, c):
    x = rand(2, c, 5, 3, seed=c)
    b = N.to_blocked(x, block)
    assert b.shape == (2, -(-c // block), 5, 3, block)
    assert np.array_equal(b.transpose(0, 1, 4, 2, 3).reshape(2, -1, 5, 3)[:, :c], x)
    assert not np.any(unblocked_pad(b, c))
    assert np.array_equal(N.from_blocked(b, c), x)


def test_errors(N):
    w = rand(8, 4, 3, 3)
    with pytest.raises(RuntimeError, match="expected input.*to have 4 channels"):
        N.conv_bound((1, 5, 8, 8), (1, 8, 8, 8), w.shape, 1, 1, 1, 1, 8)
    with pytest.raises(RuntimeError, match="Kernel size can't be greater"):
        N.conv_bound((1, 4, 2, 2), (1, 8, 0, 0), (8, 4, 5, 5), 1, 0, 1, 1, 8)
    with pytest.raises(RuntimeError, match="does not match the geometry"):
        N.conv_bound((1, 4, 8, 8), (1, 8, 7, 8), w.shape, 1, 1, 1, 1, 8)
    with pytest.raises(ValueError, match="block must be 8 or 16, got 4"):
        N.conv_bound((1, 4, 8, 8), (1, 8, 8, 8), w.shape, 1, 1, 1, 1, 4)
    with pytest.raises(ValueError, match="groups must be 1 or equal the channels"):
        N.conv_bound((1, 4, 8, 8), (1, 8, 8, 8), (8, 2, 3, 3), 1, 1, 1, 2, 8)
    with pytest.raises(ValueError, match="stride"):
        N.conv_bound((1, 4, 8, 8), (1, 8, 8, 8), w.shape, 0, 1, 1, 1, 8)
    with pytest.raises(ValueError, match="activation must be one of"):
        N.conv_bound((1, 4, 8, 8), (1, 8, 8, 8), w.shape, 1, 1, 1, 1, 8, activation="gelu")
    with pytest.raises(ValueError, match="needs bounds"):
        N.conv_bound((1, 4, 8, 8), (1, 8, 8, 8), w.shape, 1, 1, 1, 1, 8, activation="clamp")
    run = N.conv_bound((1, 4, 8, 8), (1, 8, 8, 8), w.shape, 1, 1, 1, 1, 8)
    wp = N.pack_weights(w, groups=1, block=8)
    y = np.empty((1, 1, 8, 8, 8), np.float32)
    with pytest.raises(ValueError, match=r"x must have shape \(1, 1, 8, 8, 8\)"):
        run(np.zeros((1, 4, 8, 8), np.float32), wp, None, None, y)
    with pytest.raises(TypeError, match="x must be a float32"):
        run(np.zeros((1, 1, 8, 8, 8)), wp, None, None, y)
    run5 = N.conv_bound((1, 4, 8, 8), (1, 5, 8, 8), (5, 4, 3, 3), 1, 1, 1, 1, 8)
    with pytest.raises(ValueError, match="bias must have 5 or 8 values"):
        run5(np.zeros((1, 1, 8, 8, 8), np.float32), N.pack_weights(w[:5], groups=1, block=8),
             np.zeros(3, np.float32), None, y)
    with pytest.raises(TypeError, match="4-d float32"):
        N.pack_weights(w.astype(np.float64), groups=1, block=8)
    with pytest.raises(ValueError, match="cannot read plain input"):
        N.pack_weights(rand(4, 1, 3, 3), groups=4, block=8, plain_input=True)
    with pytest.raises(ValueError, match="kind must be 'max' or 'avg'"):
        N.pool_bound((1, 8, 4, 4), 2, 2, 0, "min", True, 8)
    with pytest.raises(RuntimeError, match="pad should be at most half"):
        N.pool_bound((1, 8, 4, 4), 2, 2, 2, "max", True, 8)
    with pytest.raises(ValueError, match="do not fit"):
        N.from_blocked(np.zeros((1, 2, 1, 1, 8), np.float32), 3)


def _child(env: dict) -> subprocess.CompletedProcess:
    code = ("from tessera.kernels import nchwc; import numpy as np\n"
            "x = np.ones((1, 3, 5, 5), np.float32); w = np.ones((4, 3, 3, 3), np.float32)\n"
            "B = nchwc.block()\n"
            "run = nchwc.conv_bound(x.shape, (1, 4, 5, 5), w.shape, 1, 1, 1, 1, B)\n"
            "y = np.empty((1, 1, 5, 5, B), np.float32)\n"
            "run(nchwc.to_blocked(x, B), nchwc.pack_weights(w, groups=1, block=B), None, "
            "None, y)\n"
            "print(nchwc.isa(), B, nchwc.from_blocked(y, 4)[0, 0, 2, 2])\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.mark.parametrize("isa", ISAS)
def test_path_forced(N, isa):
    env = dict(os.environ, TESSERA_NCHWC_ISA=isa)
    env.pop("TESSERA_MAX_ISA", None)
    proc = _child(env)
    if not N._lib().tsr_nchwc_isa_supported(ISAS.index(isa)):
        assert proc.returncode != 0 and "RuntimeError" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [isa, "16" if isa == "avx512" else "8", "27.0"]


def test_unknown_path_name():
    env = dict(os.environ, TESSERA_NCHWC_ISA="sse9")
    proc = _child(env)
    assert "ValueError: TESSERA_NCHWC_ISA='sse9': expected one of portable, avx2, avx512" \
        in proc.stderr


@pytest.mark.parametrize("k,s,p,w", [(3, 2, 1, 40), (3, 1, 1, 21), (2, 2, 0, 36),
                                     (3, 2, 0, 45), ((3, 2), (2, 1), (1, 0), 23)])
@pytest.mark.parametrize("threads", [1, 2])
def test_max_pool_interior_nan_and_inf(N, path, k, s, p, w, threads):
    """Rows wide enough for the interior tiles (8 windows at once): NaN anywhere in a window
    (its first, middle or last tap) wins over every number, -inf and +inf included; rows
    with a NaN in every column, rows of +inf and -inf, windows of -inf only."""
    import tessera
    block = 8 if path != "avx512" else 16
    rng = np.random.default_rng(7)
    x = rand(2, 19, 9, w, seed=11)
    flat = x.reshape(-1)
    for v, frac in ((np.nan, 0.01), (-np.inf, 0.02), (np.inf, 0.01)):
        flat[rng.choice(flat.size, int(flat.size * frac), replace=False)] = v
    x[1, 2, 3] = np.nan                 # a whole row
    x[1, 4, :, :5] = -np.inf            # windows of -inf only
    x[0, 5, 2, ::2] = np.inf            # +inf and -inf in one row, no NaN
    x[0, 5, 2, 1::2] = -np.inf
    x[0, 5, 3] = -np.inf
    want = TF.max_pool2d(torch.from_numpy(x), k, s, p).numpy()
    run = N.pool_bound(x.shape, k, s, p, "max", True, block)
    y = np.full(N.blocked_shape(want.shape, block), 5.0, np.float32)
    before = tessera.get_num_threads()
    try:
        tessera.set_num_threads(threads)
        run(N.to_blocked(x, block), y)
    finally:
        tessera.set_num_threads(before)
    got = N.from_blocked(y, 19)
    assert np.isnan(want).any() and np.isinf(want).any()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got, want)
    assert not np.any(unblocked_pad(y, 19))


def test_max_pool_propagates_nan(N, path):
    block = 8 if path != "avx512" else 16
    x = rand(1, 17, 9, 9, seed=5)
    x[0, 3, 4, 4] = x[0, 16, 0, 0] = np.nan
    want = TF.max_pool2d(torch.from_numpy(x), 3, 2, 1).numpy()
    y = np.empty(N.blocked_shape(want.shape, block), np.float32)
    N.pool_bound(x.shape, 3, 2, 1, "max", True, block)(N.to_blocked(x, block), y)
    got = N.from_blocked(y, 17)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(want).sum() == 2
    close(got, want)


def test_bound_call_rebinds_new_arrays(N):
    """A bound convolution called again with other arrays (or without the residual) reads
    those, not the last call's."""
    B = N.block()
    wt, bias = rand(24, 17, 3, 3, seed=20), rand(24, seed=21)
    run = N.conv_bound((1, 17, 9, 9), (1, 24, 9, 9), wt.shape, 1, 1, 1, 1, B, False, "relu")
    wp = N.pack_weights(wt, groups=1, block=B)
    r = rand(1, 24, 9, 9, seed=22)
    y = np.empty(N.blocked_shape((1, 24, 9, 9), B), np.float32)
    for seed, residual in ((23, r), (24, r), (24, None)):
        x = rand(1, 17, 9, 9, seed=seed)
        run(N.to_blocked(x, B), wp, bias, None if residual is None else N.to_blocked(r, B), y)
        close(N.from_blocked(y, 24), reference(x, wt, bias, (1, 1), (1, 1), (1, 1), 1, "relu",
                                               residual=residual))


# Winograd F(4x4, 3x3): (n, c, h, w, o, pads); outputs not a multiple of the 4x4 tile, runs
# of tiles crossing images, channels not a multiple of the block, padding 0 to 2
WINOGRAD = [
    (1, 64, 14, 14, 64, 1),
    (2, 20, 13, 11, 37, 1),
    (3, 8, 5, 7, 8, 0),
    (1, 16, 9, 9, 24, 2),
    (2, 40, 6, 9, 17, (0, 1, 1, 0)),
]


def winograd(N, x, w, bias, pads, block, act=None, bounds=None, residual=None,
             residual_first=False, tiles=None, inplace=False):
    n, c, h, wd = x.shape
    t, le, b, r = N._pads(pads, "test")
    oh, ow = h + t + b - 2, wd + le + r - 2
    o = w.shape[0]
    run = N.conv_bound(x.shape, (n, o, oh, ow), w.shape, 1, pads, 1, 1, block, False, act,
                       bounds, residual_first, winograd=True, _tiles=tiles)
    wp = N.pack_weights(w, groups=1, block=block, winograd=True)
    rb = None if residual is None else N.to_blocked(residual, block)
    y = rb if inplace else np.full(N.blocked_shape((n, o, oh, ow), block), np.nan, np.float32)
    run(N.to_blocked(x, block), wp, bias, rb, y)
    return N.from_blocked(y, o), y


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("i", range(len(WINOGRAD)))
def test_winograd(N, path, i, block):
    """The blocked Winograd plan against PyTorch's direct convolution: every epilogue, the
    padded output channels zero."""
    n, c, h, w, o, p = WINOGRAD[i]
    act, res = EPILOGUES[i % len(EPILOGUES)] if i else ("clamp", "first")
    pads = p if isinstance(p, tuple) else (p, p)
    x, wt = rand(n, c, h, w, seed=i), rand(o, c, 3, 3, seed=100 + i)
    bias = rand(o, seed=200 + i) if i % 3 else None
    bounds = (-0.5, 0.7) if act == "clamp" else None
    t, le, b, r = N._pads(pads, "test")
    residual = rand(n, o, h + t + b - 2, w + le + r - 2, seed=300 + i) if res else None
    kw = dict(act=act, bounds=bounds, residual=residual, residual_first=res == "first")
    got, y = winograd(N, x, wt, bias, pads, block, **kw)
    # Winograd's error scales with the sums before the epilogue (a clamp hides their size)
    scale = np.abs(reference(x, wt, bias, (1, 1), pads, (1, 1), 1)).max()
    np.testing.assert_allclose(got, reference(x, wt, bias, (1, 1), pads, (1, 1), 1, **kw),
                               rtol=1e-4, atol=1e-4 * scale)
    assert not np.any(unblocked_pad(y, o)), "the padded output channels must be zero"


@pytest.mark.parametrize("tiles", [None, (1, 3, 6, 2), (2, 2, 4, 3)],
                         ids=["planned", "parts2", "parts3"])
def test_winograd_items_threads_and_in_place(N, path, tiles):
    """Items of runs of tiles and parts of the output groups (forced), y over its residual,
    on one and two threads: PyTorch's values, the same bits."""
    import tessera
    x, wt = rand(2, 24, 10, 13, seed=20), rand(40, 24, 3, 3, seed=21)
    bias, r = rand(40, seed=22), rand(2, 40, 10, 13, seed=23)
    want = reference(x, wt, bias, (1, 1), (1, 1), (1, 1), 1, "relu", residual=r)
    before = tessera.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            tessera.set_num_threads(threads)
            for inplace in (False, True):
                got, _ = winograd(N, x, wt, bias, (1, 1), 8, "relu", residual=r, tiles=tiles,
                                  inplace=inplace)
                close(got, want)
                out.append(got)
    finally:
        tessera.set_num_threads(before)
    assert all(np.array_equal(out[0], o) for o in out[1:])


def test_winograd_tiles_and_errors(N):
    """A Winograd plan names its transforms among its tiles; other geometries are errors."""
    B = N.block()
    tiles, passes = N.conv_tiles((1, 64, 28, 28), (1, 64, 28, 28), (64, 64, 3, 3), 1, 1, 1,
                                 1, B, winograd=True)
    assert ("W", ()) in tiles and passes == 1
    assert ("W", ()) not in N.conv_tiles((1, 64, 28, 28), (1, 64, 28, 28), (64, 64, 3, 3), 1,
                                         1, 1, 1, B)[0]
    assert "#define TSR_NCHWC_WINO 1" in N.tiles_header(tiles, {B})
    assert "#define TSR_NCHWC_WINO 0" in N.tiles_header(tiles - {("W", ())}, {B})
    w = rand(8, 8, 3, 3)
    for kw in (dict(stride=2), dict(dilation=2), dict(groups=8)):
        geo = dict(stride=1, dilation=1, groups=1) | kw
        o = N.conv_output_size(9, 3, geo["stride"], 1, 1, geo["dilation"])
        with pytest.raises(ValueError, match="winograd is for ungrouped 3x3 stride-1"):
            N.conv_bound((1, 8, 9, 9), (1, 8, o, o), (8, 8 // geo["groups"], 3, 3),
                         geo["stride"], 1, geo["dilation"], geo["groups"], B, winograd=True)
    with pytest.raises(ValueError, match="winograd is for ungrouped 3x3 stride-1"):
        N.pack_weights(rand(8, 8, 5, 5), groups=1, block=B, winograd=True)
    with pytest.raises(ValueError, match="plain input"):
        N.pack_weights(w[:, :3], groups=1, block=B, plain_input=True, winograd=True)
