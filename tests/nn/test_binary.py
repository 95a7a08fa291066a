"""tessera.nn.binary and the xnor-popcount kernels: bit-exact against the NumPy reference on
every instruction set, the reference against PyTorch's float convolution of +-1 values,
straight-through gradients against PyTorch, packing, checkpoints, nn.Graph, ONNX (the
standard export through onnxruntime, the custom domain and dabnn's Sign+Conv pattern back
in), and a binary network trained on MNIST."""
import importlib.util
import io
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tessera
import tessera.nn.binary as bnn
from tessera import nn
from tessera.kernels import binary as K

rng = np.random.default_rng(0)
PATHS = K.available()

# (N, C, H, W), (O, KH, KW), stride, padding, dilation
GEOMETRIES = [((2, 3, 5, 6), (5, 3, 3), 1, 1, 1), ((1, 64, 14, 14), (64, 3, 3), 1, 1, 1),
              ((1, 130, 9, 7), (20, 3, 3), 2, 1, 1), ((2, 70, 8, 8), (17, 3, 3), 1, 2, 2),
              ((1, 5, 4, 4), (3, 1, 1), 1, 0, 1), ((3, 256, 6, 6), (33, 3, 3), 1, 1, 1),
              ((1, 64, 11, 19), (9, 3, 3), 1, 1, 1), ((1, 128, 5, 3), (16, 3, 3), 1, 3, 1)]


def _signs(a):
    return np.where(a < 0, -1.0, 1.0).astype(np.float32)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("geo", GEOMETRIES)
def test_conv_kernels_bit_exact_with_reference(path, geo):
    xs, (o, kh, kw), s, p, d = geo
    x = rng.standard_normal(xs).astype(np.float32)
    x[0, 0, 0, :2] = [0.0, -0.0]
    words = K.packbits(rng.standard_normal((o, kh, kw, xs[1])))
    scale = rng.uniform(0.1, 2.0, o).astype(np.float32)
    for pv in K.PAD_VALUES:
        for sc in (None, scale):
            kw_ = dict(stride=(s, s), padding=(p, p), dilation=(d, d), pad_value=pv, scale=sc)
            want = K.reference_conv2d(x, words, xs[1], **kw_)
            got = K.conv2d(x, words, xs[1], path=path, **kw_)
            assert got.dtype == np.float32 and np.array_equal(got, want), (pv, sc is None)


@pytest.mark.parametrize("path", PATHS)
def test_direct_conv_split_over_threads_bit_exact(path):
    # the stride-1 kernels split the images over the threads, or one image's output channels
    x = rng.standard_normal((3, 64, 24, 24)).astype(np.float32)
    words = K.packbits(rng.standard_normal((72, 3, 3, 64)))
    scale = rng.uniform(0.1, 2.0, 72).astype(np.float32)
    threads = tessera.get_num_threads()
    tessera.set_num_threads(2)
    try:
        for xs in (x, x[:1]):
            for pv in K.PAD_VALUES:
                kw_ = dict(padding=(1, 1), pad_value=pv, scale=scale)
                assert np.array_equal(K.conv2d(xs, words, 64, path=path, **kw_),
                                      K.reference_conv2d(xs, words, 64, **kw_))
    finally:
        tessera.set_num_threads(threads)


def test_direct_conv_outputs_the_caller_holds_stay_as_they_were():
    """A layer's next call writes a new output while the last one (or a view of it) is still
    held; each output stays what the reference gives for its own input."""
    xs = [rng.standard_normal((1, 64, 10, 10)).astype(np.float32) for _ in range(3)]
    words = K.packbits(rng.standard_normal((16, 3, 3, 64)))
    kw_ = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), pad_value=-1)
    want = [K.reference_conv2d(x, words, 64, **kw_) for x in xs]
    y0 = K.conv2d(xs[0], words, 64, **kw_)
    view = K.conv2d(xs[1], words, 64, **kw_)[0, 3:]
    y2 = K.conv2d(xs[2], words, 64, **kw_)
    for _ in range(2):   # an output dropped: its buffer may serve the next call
        assert np.array_equal(K.conv2d(xs[1], words, 64, **kw_), want[1])
    assert np.array_equal(y0, want[0]) and np.array_equal(view, want[1][0, 3:])
    assert np.array_equal(y2, want[2])
    layer = bnn.pack(bnn.BinaryConv2d(64, 16, 3, padding=1, scale="channel").eval())
    ts = [layer(tessera.tensor(x)) for x in xs]
    for t, x in zip(ts, xs):
        assert np.array_equal(t.numpy(), layer(tessera.tensor(x)).numpy())


@pytest.mark.parametrize("path", PATHS)
def test_linear_kernels_bit_exact_with_reference(path):
    for b, i, o in [(1, 100, 10), (7, 64, 33), (3, 300, 5), (16, 1, 17)]:
        x = rng.standard_normal((b, i)).astype(np.float32)
        words = K.packbits(rng.standard_normal((o, i)))
        scale = rng.uniform(0.1, 2.0, o).astype(np.float32)
        for sc in (None, scale):
            assert np.array_equal(K.linear(x, words, i, scale=sc, path=path),
                                  K.reference_linear(x, words, i, scale=sc))


@pytest.mark.parametrize("pad_value", [-1, 0, 1])
def test_reference_is_pytorchs_convolution_of_signs(pad_value):
    x = rng.standard_normal((2, 5, 6, 7)).astype(np.float32)
    w = rng.standard_normal((4, 5, 3, 3)).astype(np.float32)
    padded = TF.pad(torch.tensor(_signs(x)), (1, 1, 1, 1), value=float(pad_value))
    want = TF.conv2d(padded, torch.tensor(_signs(w)), stride=2).numpy()
    got = K.reference_conv2d(x, K.packbits(w.transpose(0, 2, 3, 1)), 5, stride=(2, 2),
                             padding=(1, 1), pad_value=pad_value)
    np.testing.assert_array_equal(got, want)


def test_packbits_layout_and_roundtrip():
    x = np.ones((2, 130), np.float32)
    x[0, 0] = x[0, 63] = x[0, 64] = x[1, 129] = -1.0
    w = K.packbits(x)
    assert w.dtype == np.uint64 and w.shape == (2, 3)
    assert w[0].tolist() == [1 | (1 << 63), 1, 0] and w[1].tolist() == [0, 0, 2]
    np.testing.assert_array_equal(K.unpackbits(w, 130), x)
    t = bnn.packbits(tessera.tensor(x))
    assert t.dtype is tessera.int64
    np.testing.assert_array_equal(bnn.unpackbits(t, 130).numpy(), x)


def test_isa_forced_by_environment(monkeypatch):
    monkeypatch.setenv("TESSERA_BINARY_ISA", "c")
    assert K.isa() == ("c" if "c" in PATHS else None)
    monkeypatch.setenv("TESSERA_BINARY_ISA", "sse9")
    with pytest.raises(ValueError, match="TESSERA_BINARY_ISA='sse9'"):
        K.isa()
    monkeypatch.setenv("TESSERA_BINARY_ISA", "numpy")
    x = rng.standard_normal((1, 3, 4, 4)).astype(np.float32)
    y = bnn.BinaryConv2d(3, 2, 3, padding=1)(tessera.tensor(x))
    assert y.shape == (1, 2, 4, 4)


def test_bad_arguments_name_the_op():
    with pytest.raises(ValueError, match="pad_value must be -1, 0 or 1"):
        bnn.BinaryConv2d(3, 2, 3, pad_value=2)
    with pytest.raises(RuntimeError, match=r"binary_conv2d: input \(1, 4, 5, 5\) and weight"):
        tessera.ops.binary.binary_conv2d(tessera.ones(1, 4, 5, 5), tessera.ones(2, 3, 3, 3))
    with pytest.raises(RuntimeError, match="binary_linear: mat1 and mat2"):
        bnn.BinaryLinear(4, 2)(tessera.ones(3, 5))
    with pytest.raises(RuntimeError, match="binary_sign: expected a floating point"):
        bnn.sign(tessera.ones(3, dtype=tessera.int64))
    with pytest.raises(ValueError, match="scale must be None or 'channel'"):
        bnn.BinaryLinear(4, 2, scale="tensor")


# ---- layers against PyTorch -----------------------------------------------------------------

def _torch_ste(x, clip=True):
    s = torch.where(x < 0, -1.0, 1.0)
    xc = x.clamp(-1, 1) if clip else x
    return xc + (s - xc).detach()


@pytest.mark.parametrize("pad_value", [-1, 0, 1])
def test_binary_conv2d_layer_and_gradients_match_pytorch(pad_value):
    conv = bnn.BinaryConv2d(6, 4, 3, stride=1, padding=1, scale="channel", pad_value=pad_value,
                            bias=True)
    x = tessera.tensor(rng.uniform(-2, 2, (2, 6, 5, 5)).astype(np.float32), requires_grad=True)
    y = conv(x)
    (y * y).sum().backward()
    tx = torch.tensor(x.detach().numpy(), requires_grad=True)
    tw = torch.tensor(conv.weight.detach().numpy(), requires_grad=True)
    tb = torch.tensor(conv.bias.detach().numpy(), requires_grad=True)
    alpha = tw.abs().mean((1, 2, 3))
    xs = TF.pad(_torch_ste(tx), (1,) * 4, value=float(pad_value))
    ty = TF.conv2d(xs, _torch_ste(tw)) * alpha.reshape(1, -1, 1, 1) + tb.reshape(1, -1, 1, 1)
    (ty * ty).sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(conv.weight.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(conv.bias.grad.numpy(), tb.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_binary_linear_and_approx_sign_match_pytorch():
    lin = bnn.BinaryLinear(70, 5, scale="channel", estimator="approx")
    x = tessera.tensor(rng.uniform(-2, 2, (3, 70)).astype(np.float32), requires_grad=True)
    lin(x).square().sum().backward()
    tx = torch.tensor(x.detach().numpy(), requires_grad=True)
    tw = torch.tensor(lin.weight.detach().numpy(), requires_grad=True)
    inside = tx.abs() <= 1
    f = torch.where(inside, 2 * tx - tx * tx.abs(), torch.zeros_like(tx))
    sx = torch.where(tx < 0, -1.0, 1.0) + f - f.detach()
    ty = sx @ _torch_ste(tw).T * tw.abs().mean(1)
    ty.square().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(lin.weight.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_bireal_shortcut_adds_the_input():
    body = bnn.BinaryConv2d(4, 4, 3, padding=1)
    block = bnn.BiRealShortcut(body)
    x = tessera.randn(1, 4, 5, 5)
    with tessera.no_grad():
        np.testing.assert_array_equal(block(x).numpy(), (body(x) + x).numpy())


# ---- packing, checkpoints, nn.Graph -----------------------------------------------------------

def _net():
    tessera.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16),
        bnn.BiRealShortcut(bnn.BinaryConv2d(16, 16, 3, padding=1, scale="channel"),
                           nn.BatchNorm2d(16)),
        bnn.BinaryConv2d(16, 70, 3, stride=2, padding=1, pad_value=0), nn.BatchNorm2d(70),
        nn.Flatten(), bnn.BinaryLinear(70 * 16, 32, scale="channel", bias=True),
        nn.BatchNorm1d(32), nn.Linear(32, 10)).eval()


def test_pack_gives_identical_outputs_and_checkpoints():
    model = _net()
    x = tessera.randn(4, 3, 8, 8)
    with tessera.no_grad():
        want = model(x).numpy()
        packed = bnn.pack(model)
        assert isinstance(packed[3], bnn.PackedBinaryConv2d)
        assert isinstance(packed[2].body[0], bnn.PackedBinaryConv2d)
        assert isinstance(model[3], bnn.BinaryConv2d)  # the original is kept
        np.testing.assert_array_equal(packed(x).numpy(), want)
        buf = io.BytesIO()
        tessera.save(packed.state_dict(), buf)
        buf.seek(0)
        fresh = bnn.pack(_net())
        for m in fresh.modules():
            if isinstance(m, bnn.PackedBinaryConv2d | bnn.PackedBinaryLinear):
                m.weight_packed.zero_()
        fresh.load_state_dict(tessera.load(buf))
        np.testing.assert_array_equal(fresh.eval()(x).numpy(), want)
        buf = io.BytesIO()
        tessera.save(packed, buf)
        buf.seek(0)
        np.testing.assert_array_equal(tessera.load(buf, weights_only=False)(x).numpy(), want)
    sd = packed.state_dict()
    assert sd["3.weight_packed"].dtype is tessera.int64
    assert tuple(sd["3.weight_packed"].shape) == (70, 3, 3, 1)


@pytest.mark.parametrize("write", ["copy_", "load_state_dict"])
def test_packed_weights_written_in_place_are_read_again(write):
    """A packed layer's prepared weights follow its buffer: after ``copy_`` or
    ``load_state_dict`` into it, the layer computes what a layer built from the new words
    computes (and what PyTorch's convolution of the signs gives)."""
    tessera.manual_seed(0)
    a, b = (bnn.pack(bnn.BinaryConv2d(64, 64, 3, padding=1)) for _ in range(2))
    x = tessera.randn(1, 64, 14, 14)
    a(x)                                   # prepares a's words
    if write == "copy_":
        a.weight_packed.copy_(b.weight_packed)
    else:
        a.load_state_dict(b.state_dict())
    w = torch.from_numpy(bnn.unpackbits(b.weight_packed, 64).numpy()).permute(0, 3, 1, 2)
    xs = torch.from_numpy(x.numpy()).sign().where(torch.from_numpy(x.numpy()) != 0, 1.0)
    ref = TF.conv2d(TF.pad(xs, (1, 1, 1, 1), value=-1.0), w.float())
    np.testing.assert_array_equal(a(x).numpy(), ref.numpy())
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())


def test_packed_model_in_nn_graph():
    packed = bnn.pack(_net())

    class Infer(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = packed

        def build(self, x):
            return self.m(x)

    x = tessera.randn(2, 3, 8, 8)
    with tessera.no_grad():
        want = packed(x).numpy()
    np.testing.assert_array_equal(Infer()(x).numpy(), want)


def _binary_only():
    """Binary layers only: every value stays an integer times alpha, so a compiler backend
    must agree with the kernels bit for bit."""
    tessera.manual_seed(1)
    return nn.Sequential(
        bnn.BinaryConv2d(3, 70, 3, padding=1, scale="channel", pad_value=0),
        bnn.BinaryConv2d(70, 16, 3, padding=2, dilation=2, pad_value=1),
        bnn.BinaryConv2d(16, 8, 3, stride=2, padding=1), nn.Flatten(),
        bnn.BinaryLinear(8 * 4 * 4, 10, scale="channel")).eval()


@pytest.mark.parametrize("backend", [
    pytest.param(b, marks=pytest.mark.skipif(importlib.util.find_spec(m) is None,
                                             reason=f"{m} is not installed"))
    for b, m in (("xla", "jax"), ("tvm", "tvm"))])
@pytest.mark.parametrize("packed", [False, True], ids=["latent", "packed"])
def test_binary_models_on_compiler_backends(backend, packed):
    model = _binary_only()
    if packed:
        model = bnn.pack(model)

    class Infer(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = model

        def build(self, x):
            return self.m(x)

    x = tessera.randn(2, 3, 8, 8)
    with tessera.no_grad():
        want = model(x).numpy()
    g = Infer()
    g.config.set_backend(backend, strict=True)  # every node on the backend
    np.testing.assert_array_equal(g(x).numpy(), want)


# ---- ONNX ------------------------------------------------------------------------------------

def test_onnx_latent_model_runs_in_onnxruntime():
    """Binary layers back to back, each a sum of an odd number of +-1 products: no dot
    product is 0, so the error of onnxruntime's float convolution (about 1e-6, it is not
    exact on integers) cannot flip the next layer's sign. (Single layers, zero padding
    among them, run through onnxruntime in the op-info table.)"""
    pytest.importorskip("onnxruntime")
    from tests.onnx.helpers import ort_run
    tessera.manual_seed(2)
    model = nn.Sequential(
        bnn.BinaryConv2d(3, 15, 3, padding=1, scale="channel"),
        bnn.BinaryConv2d(15, 71, 3, stride=2, padding=1, pad_value=1),
        bnn.BinaryConv2d(71, 9, 3, padding=1, scale="channel"), nn.Flatten(),
        bnn.BinaryLinear(9 * 16, 10, scale="channel", bias=True)).eval()
    x = tessera.randn(2, 3, 8, 8)
    proto = tessera.onnx.export(model, (x,))
    with tessera.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(ort_run(proto, [x.numpy()])[0], want, rtol=1e-4, atol=1e-4)


def test_onnx_packed_model_custom_domain_round_trip(tmp_path):
    pytest.importorskip("onnx")
    packed = bnn.pack(_net())
    x = tessera.randn(2, 3, 8, 8)
    path = os.path.join(tmp_path, "bnn.onnx")
    proto = tessera.onnx.export(packed, (x,), path)
    ops = {(n.domain, n.op_type) for n in proto.graph.node}
    assert ("ai.tessera.binary", "BinaryConv") in ops
    assert ("ai.tessera.binary", "BinaryGemm") in ops
    assert {o.domain: o.version for o in proto.opset_import}["ai.tessera.binary"] == 1
    back = tessera.onnx.to_module(path)
    with tessera.no_grad():
        np.testing.assert_array_equal(back(x).numpy(), packed(x).numpy())


def test_onnx_sign_conv_pattern_imports_as_binary_conv():
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from tests.onnx.helpers import ort_run
    w = _signs(rng.standard_normal((8, 5, 3, 3)))
    latent = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Sign", ["x"], ["s"]),
         helper.make_node("Conv", ["s", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("Sign", ["y"], ["s2"]),
         helper.make_node("Sign", ["wl"], ["ws"]),
         helper.make_node("Conv", ["s2", "ws"], ["z"], strides=[2, 2])],
        "dabnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 6, 6])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 2, 2])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b"),
         numpy_helper.from_array(latent, "wl")])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(proto)
    from tessera.onnx.converters.binary import fuse_sign_conv
    fused = fuse_sign_conv(proto)
    assert [n.op_type for n in fused.graph.node].count("BinaryConv") == 2
    assert "Conv" not in [n.op_type for n in fused.graph.node]
    x = rng.standard_normal((1, 5, 6, 6)).astype(np.float32)
    want = ort_run(proto, [x])[0]
    with tessera.no_grad():
        got = tessera.onnx.to_module(proto)(tessera.tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


# ---- training on MNIST ------------------------------------------------------------------------

MNIST_DIR = os.environ.get("TESSERA_MNIST_DIR") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "..",
    "shared", "data", "mnist")


@pytest.mark.skipif(not os.path.exists(os.path.join(MNIST_DIR, "t10k-images.idx3-ubyte.gz")),
                    reason=f"the MNIST IDX files are not in {MNIST_DIR} (TESSERA_MNIST_DIR)")
def test_binary_network_learns_mnist_and_packs_exactly():
    """Binary inner layers (a convolution and a linear layer), float first and last layers,
    one epoch of Adam: at least 97% on the test set, and the packed model predicts the same.
    (The smallest network and schedule that clears 97% with a margin: the test's cost.)"""
    from tessera.datasets import MNIST
    tessera.manual_seed(0)
    train, test = MNIST(MNIST_DIR, train=True), MNIST(MNIST_DIR, train=False)

    def prep(ds):
        return (ds.data.numpy().astype(np.float32) / 255.0 - 0.1307) / 0.3081

    xtr, ytr = prep(train)[:, None], train.targets.numpy().astype(np.int64)
    xte, yte = prep(test)[:, None], test.targets.numpy().astype(np.int64)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 5, stride=2, padding=2), nn.BatchNorm2d(32),
        bnn.BinaryConv2d(32, 64, 3, stride=2, padding=1, scale="channel"), nn.BatchNorm2d(64),
        nn.Flatten(), bnn.BinaryLinear(64 * 49, 256, scale="channel"), nn.BatchNorm1d(256),
        nn.Linear(256, 10))
    bs = 128
    steps = len(xtr) // bs
    opt = tessera.optim.Adam(model.parameters(), lr=3e-3)
    sched = tessera.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    perm = np.random.default_rng(0).permutation(len(xtr))
    for i in range(steps):
        idx = perm[i * bs:(i + 1) * bs]
        loss = nn.functional.cross_entropy(model(tessera.tensor(xtr[idx])),
                                           tessera.tensor(ytr[idx]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    with tessera.no_grad():
        logits = model(tessera.tensor(xte)).numpy()
        packed = bnn.pack(model)(tessera.tensor(xte)).numpy()
    accuracy = float((logits.argmax(1) == yte).mean())
    assert accuracy >= 0.97, accuracy
    np.testing.assert_array_equal(packed.argmax(1), logits.argmax(1))
    np.testing.assert_array_equal(packed, logits)


# ---- bit-packed activations between binary layers ------------------------------------------

def _chain_net(with_linear: bool = True):
    """Binary layers separated by batch norms alone (their activations can stay bits), with
    statistics far from the identity: negative and zero scales, shifts that cross zero."""
    tessera.manual_seed(3)
    layers = [nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64),
              bnn.BinaryConv2d(64, 64, 3, padding=1, scale="channel"), nn.BatchNorm2d(64),
              bnn.BinaryConv2d(64, 70, 3, padding=1, pad_value=0, bias=True), nn.BatchNorm2d(70),
              bnn.BinaryConv2d(70, 130, 3, stride=2, padding=1, scale="channel"),
              nn.BatchNorm2d(130),
              bnn.BinaryConv2d(130, 16, 3, padding=1, pad_value=1), nn.BatchNorm2d(16)]
    if with_linear:
        layers += [nn.Flatten(), bnn.BinaryLinear(16 * 16, 100, scale="channel"),
                   nn.BatchNorm1d(100), bnn.BinaryLinear(100, 10)]
    m = nn.Sequential(*layers)
    with tessera.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm1d | nn.BatchNorm2d):
                c = mod.num_features
                mod.running_mean.copy_(tessera.randn(c) * 5)
                mod.running_var.copy_(tessera.rand(c) * 3 + 0.1)
                w = tessera.randn(c)
                w[0], w[1] = 0.0, -1.5
                mod.weight.copy_(w)
                mod.bias.copy_(tessera.randn(c))
    return m.eval()


def test_pack_keeps_activations_as_bits_between_binary_layers():
    model = _chain_net()
    packed = bnn.pack(model)
    convs = [packed[i] for i in (2, 4, 6, 8)]
    assert [c.input_bits for c in convs] == [False, True, True, True]
    assert [c.threshold is not None for c in convs] == [True, True, True, False]
    assert all(type(packed[i]) is nn.Identity for i in (3, 5, 7, 12))
    assert packed[11].threshold is not None and packed[13].input_bits
    x = tessera.randn(3, 3, 8, 8)
    with tessera.no_grad():
        want = model(x).numpy()
        np.testing.assert_array_equal(packed(x).numpy(), want)
        np.testing.assert_array_equal(bnn.pack(model, bitpacked=False)(x).numpy(), want)
        # the bits one layer writes are the signs of the float path's batch norm
        bits = packed[:3](x)
        assert bits.dtype is tessera.int64 and tuple(bits.shape) == (3, 8, 8, 1)
        signs = model[:4](x).permute(0, 2, 3, 1).contiguous()
        np.testing.assert_array_equal(bits.numpy(), bnn.packbits(signs).numpy())


def test_bitpacked_chain_matches_pytorch():
    """The packed chain against PyTorch running the float model on the signs."""
    model = _chain_net(with_linear=False)
    packed = bnn.pack(model)
    x = tessera.randn(2, 3, 8, 8)
    t = torch.from_numpy(x.numpy())

    def sgn(v):
        return torch.where(v < 0, -1.0, 1.0)

    with torch.no_grad(), tessera.no_grad():
        h = TF.batch_norm(TF.conv2d(t, torch.from_numpy(model[0].weight.detach().numpy()),
                                    torch.from_numpy(model[0].bias.detach().numpy()), padding=1),
                          *_bn_args(model[1]))
        for i in (2, 4, 6, 8):
            conv = model[i]
            w = sgn(torch.from_numpy(conv.weight.detach().numpy()))
            p = conv.padding[0]
            y = TF.conv2d(TF.pad(sgn(h), (p,) * 4, value=float(conv.pad_value)), w,
                          stride=conv.stride)
            if conv.scale == "channel":
                y = y * torch.from_numpy(bnn.xnor_alpha(conv.weight).numpy()).reshape(1, -1,
                                                                                      1, 1)
            if conv.bias is not None:
                y = y + torch.from_numpy(conv.bias.detach().numpy()).reshape(1, -1, 1, 1)
            h = TF.batch_norm(y, *_bn_args(model[i + 1]))
    with tessera.no_grad():
        got = packed(x).numpy()
    # PyTorch's batch norm rounds its own way: the signs agree wherever the float path's
    # value is not within rounding of 0, and the last layer's float output with them
    np.testing.assert_allclose(got, h.numpy(), rtol=1e-4, atol=1e-4)


def _bn_args(bn):
    return tuple(torch.from_numpy(t.detach().numpy()) for t in (
        bn.running_mean, bn.running_var, bn.weight, bn.bias)) + (False, 0.0, bn.eps)


def test_thresholds_follow_the_batch_norms_sign_exactly():
    """Each channel's threshold gives the float path's sign for every possible dot product:
    a positive, a negative and a zero batch-norm scale, at and around the boundary."""
    tessera.manual_seed(0)
    conv = bnn.BinaryConv2d(64, 4, 3, padding=1, scale="channel", bias=True)
    bn = nn.BatchNorm2d(4)
    with tessera.no_grad():
        bn.weight.copy_(tessera.tensor([2.0, -0.7, 0.0, 1e-30]))
        bn.bias.copy_(tessera.tensor([0.1, 0.3, -1.0, 0.0]))
        bn.running_mean.copy_(tessera.tensor([3.0, -0.5, 0.0, 0.0]))
        bn.running_var.copy_(tessera.tensor([2.0, 0.5, 1.0, 1.0]))
    model = nn.Sequential(conv, bn, bnn.BinaryConv2d(4, 4, 3, padding=1)).eval()
    layer = bnn.pack(model)[0]
    t = layer.threshold.numpy()
    assert t[2].tolist() == [1 << 40, 0]          # bn(y) = -1 everywhere: always -1
    assert t[1, 1] == 1                            # a negative scale flips the comparison
    kbits = 64 * 9
    dots = np.arange(-kbits, kbits + 1)
    y = tessera.tensor(dots.astype(np.float32)[None, :, None, None].repeat(4, 0).transpose(
        1, 0, 2, 3))
    with tessera.no_grad():
        y = y * bnn.xnor_alpha(conv.weight).reshape(1, -1, 1, 1) + conv.bias.reshape(1, -1, 1, 1)
        want = (bn.eval()(y).numpy() < 0)[:, :, 0, 0]
    got = (dots[:, None] < t[:, 0]) != t[:, 1].astype(bool)
    np.testing.assert_array_equal(got, want)


def test_pack_leaves_float_shortcuts_and_training_batch_norms_float():
    tessera.manual_seed(0)
    shortcut = nn.Sequential(
        bnn.BiRealShortcut(bnn.BinaryConv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)),
        bnn.BinaryConv2d(8, 8, 3, padding=1)).eval()
    packed = bnn.pack(shortcut)
    assert packed[0].body[0].threshold is None and not packed[1].input_bits
    training = nn.Sequential(bnn.BinaryConv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8),
                             bnn.BinaryConv2d(8, 8, 3, padding=1))
    packed = bnn.pack(training)   # a batch norm in training mode: its statistics move
    assert packed[0].threshold is None and isinstance(packed[1], nn.BatchNorm2d)


def test_bitpacked_chain_in_nn_graph_and_checkpoints():
    model = _chain_net()
    packed = bnn.pack(model)

    class Infer(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = packed

        def build(self, x):
            return self.m(x)

    x = tessera.randn(2, 3, 8, 8)
    with tessera.no_grad():
        want = model(x).numpy()
    np.testing.assert_array_equal(Infer()(x).numpy(), want)
    buf = io.BytesIO()
    tessera.save(packed.state_dict(), buf)
    buf.seek(0)
    fresh = bnn.pack(_chain_net())
    for m in fresh.modules():
        if isinstance(m, bnn.PackedBinaryConv2d | bnn.PackedBinaryLinear):
            m.weight_packed.zero_()
            if m.threshold is not None:
                m.threshold.zero_()
    fresh.load_state_dict(tessera.load(buf))
    with tessera.no_grad():
        np.testing.assert_array_equal(fresh(x).numpy(), want)


@pytest.mark.parametrize("path", PATHS)
def test_bitpacked_kernels_bit_exact_with_reference(path):
    for xs, (o, kh, kw), s, p, d in GEOMETRIES:
        x = rng.standard_normal(xs).astype(np.float32)
        bits = K.packbits(x.transpose(0, 2, 3, 1)).view(np.int64)
        words = K.packbits(rng.standard_normal((o, kh, kw, xs[1])))
        kbits = xs[1] * kh * kw
        t = np.stack([rng.integers(-kbits // 4, kbits // 4 + 1, o),
                      rng.integers(0, 2, o)], 1).astype(np.int64)
        t[0] = [1 << 40, 0]
        for pv in K.PAD_VALUES:
            kw_ = dict(stride=(s, s), padding=(p, p), dilation=(d, d), pad_value=pv)
            dot = K.reference_conv2d(x, words, xs[1], **kw_)
            for inp in (x, bits):
                assert np.array_equal(K.conv2d(inp, words, xs[1], path=path, **kw_), dot)
                want = K.reference_conv2d(inp, words, xs[1], threshold=t, **kw_)
                neg = (dot < t[:, 0].reshape(1, -1, 1, 1)) != t[:, 1].astype(bool).reshape(
                    1, -1, 1, 1)
                signs = np.where(neg, -1.0, 1.0).transpose(0, 2, 3, 1)
                assert np.array_equal(want, K.packbits(signs).view(np.int64))
                for _ in range(2):  # the plan's first call and a repeat
                    got = K.conv2d(inp, words, xs[1], path=path, threshold=t, **kw_)
                    assert got.dtype == np.int64 and np.array_equal(got, want), (xs, pv)
    for b, i, o in [(1, 100, 10), (7, 64, 70), (3, 300, 5)]:
        x = rng.standard_normal((b, i)).astype(np.float32)
        words = K.packbits(rng.standard_normal((o, i)))
        t = np.stack([rng.integers(-i // 3, i // 3 + 1, o), rng.integers(0, 2, o)],
                     1).astype(np.int64)
        for inp in (x, K.packbits(x).view(np.int64)):
            assert np.array_equal(K.linear(inp, words, i, path=path),
                                  K.reference_linear(x, words, i))
            assert np.array_equal(K.linear(inp, words, i, path=path, threshold=t),
                                  K.reference_linear(x, words, i, threshold=t))


@pytest.mark.parametrize("path", PATHS)
def test_thresholded_conv_at_the_thresholds_edges(path):
    """Thresholds equal to a dot product the layer produces (the comparison's boundary), one
    above and one below it, flipped and not, and out of reach (a zero batch-norm scale):
    every channel count that tiles the kernels' blocks of 8 channels differently (whole
    groups, a remainder, a partial block, several output words), rows that are not whole
    vectors of 8 pixels, each padding."""
    for o, cin, h, w in [(8, 64, 5, 9), (16, 64, 4, 8), (24, 70, 3, 11), (40, 64, 6, 6),
                         (64, 64, 7, 13), (70, 128, 4, 5), (136, 64, 3, 17), (200, 64, 2, 3)]:
        x = rng.standard_normal((2, cin, h, w)).astype(np.float32)
        bits = K.packbits(x.transpose(0, 2, 3, 1)).view(np.int64)
        words = K.packbits(rng.standard_normal((o, 3, 3, cin)))
        for pv in K.PAD_VALUES:
            kw_ = dict(padding=(1, 1), pad_value=pv)
            dot = K.reference_conv2d(x, words, cin, **kw_).astype(np.int64)
            picked = dot[rng.integers(0, 2, o), np.arange(o), rng.integers(0, h, o),
                         rng.integers(0, w, o)]
            t = np.stack([picked + rng.integers(-1, 2, o), rng.integers(0, 2, o)], 1)
            t[::5] = [1 << 40, 0]
            t[1::7] = [1 << 40, 1]
            t[2::9] = [-(1 << 40), 1]
            t = t.astype(np.int64)
            want = K.reference_conv2d(x, words, cin, threshold=t, **kw_)
            neg = (dot < t[:, 0].reshape(1, -1, 1, 1)) != t[:, 1].astype(bool).reshape(
                1, -1, 1, 1)
            assert np.array_equal(want, K.packbits(np.where(neg, -1.0, 1.0).transpose(
                0, 2, 3, 1)).view(np.int64))
            for inp in (x, bits):
                got = K.conv2d(inp, words, cin, path=path, threshold=t, **kw_)
                assert np.array_equal(got, want), (o, cin, h, w, pv)


@pytest.mark.parametrize("path", PATHS)
def test_bitpacked_conv_split_over_threads_bit_exact(path):
    x = rng.standard_normal((3, 64, 24, 24)).astype(np.float32)
    bits = K.packbits(x.transpose(0, 2, 3, 1)).view(np.int64)
    words = K.packbits(rng.standard_normal((72, 3, 3, 64)))
    t = np.stack([rng.integers(-100, 100, 72), rng.integers(0, 2, 72)], 1).astype(np.int64)
    threads = tessera.get_num_threads()
    tessera.set_num_threads(2)
    try:
        for xs in (bits, bits[:1], x[:1]):
            for pv in K.PAD_VALUES:
                kw_ = dict(padding=(1, 1), pad_value=pv, threshold=t)
                assert np.array_equal(K.conv2d(xs, words, 64, path=path, **kw_),
                                      K.reference_conv2d(xs, words, 64, **kw_))
    finally:
        tessera.set_num_threads(threads)


# the AVX2 bit planes' layouts: rows of up to 32 outputs packed several to a word (widths
# 1-32), a row a word, rows over several words; channels not a multiple of 64; 1x1, 3x3 and
# 5x5 kernels, dilations; output channels over several 64-channel words
PLANE_GEOMETRIES = [((1, 64, 56, 56), (64, 3, 3), 1, 1), ((2, 3, 5, 7), (5, 3, 3), 1, 1),
                    ((1, 70, 9, 13), (65, 3, 3), 0, 1), ((1, 20, 6, 40), (130, 3, 3), 2, 1),
                    ((1, 130, 20, 70), (9, 3, 3), 1, 2), ((1, 65, 33, 33), (8, 5, 5), 2, 1),
                    ((1, 1, 1, 1), (3, 3, 3), 1, 1), ((1, 64, 3, 100), (16, 3, 3), 2, 1),
                    ((1, 8, 5, 3), (8, 1, 1), 0, 1), ((1, 256, 14, 14), (72, 3, 3), 1, 1)]


@pytest.mark.skipif("avx2" not in PATHS, reason="no AVX2")
@pytest.mark.parametrize("geo", PLANE_GEOMETRIES)
def test_avx2_bit_planes_bit_exact_with_reference(geo):
    xs, (o, kh, kw), p, d = geo
    x = rng.standard_normal(xs).astype(np.float32)
    bits = K.packbits(x.transpose(0, 2, 3, 1)).view(np.int64)
    words = K.packbits(rng.standard_normal((o, kh, kw, xs[1])))
    scale = rng.uniform(0.1, 2.0, o).astype(np.float32)
    kbits = xs[1] * kh * kw
    t = np.stack([rng.integers(-kbits // 4, kbits // 4 + 1, o),
                  rng.integers(0, 2, o)], 1).astype(np.int64)
    t[0], t[-1] = [1 << 40, 0], [-(1 << 40), 1]   # constant signs
    for pv in K.PAD_VALUES:
        kw_ = dict(padding=(p, p), dilation=(d, d), pad_value=pv)
        for inp in (x, bits):
            for extra in (dict(scale=scale), dict(threshold=t)):
                want = K.reference_conv2d(x, words, xs[1], **kw_, **extra)
                got = K.conv2d(inp, words, xs[1], path="avx2", **kw_, **extra)
                assert np.array_equal(got, want), (geo, pv, list(extra))
        plan = K._prepared(words, xs[1]).direct(xs[2], xs[3], (p, p), (d, d), pv)
        assert plan.g[K._D_PLN] != 0   # the bit planes ran, not the nibble tables


@pytest.mark.skipif("avx2" not in PATHS, reason="no AVX2")
def test_avx2_bit_planes_split_over_channels_bit_exact():
    # one image's output channels split over the threads at multiples of 8, not of 64: the
    # parts write their own bytes of the channel-last words
    x = rng.standard_normal((1, 64, 30, 30)).astype(np.float32)
    bits = K.packbits(x.transpose(0, 2, 3, 1)).view(np.int64)
    words = K.packbits(rng.standard_normal((200, 3, 3, 64)))
    t = np.stack([rng.integers(-100, 100, 200), rng.integers(0, 2, 200)], 1).astype(np.int64)
    threads = tessera.get_num_threads()
    tessera.set_num_threads(2)
    try:
        for pv in K.PAD_VALUES:
            for extra in (dict(threshold=t), dict(scale=None)):
                kw_ = dict(padding=(1, 1), pad_value=pv, **extra)
                assert np.array_equal(K.conv2d(bits, words, 64, path="avx2", **kw_),
                                      K.reference_conv2d(x, words, 64, **kw_))
    finally:
        tessera.set_num_threads(threads)


_TINY_OUTPUTS = """
import numpy as np
from tessera.kernels import binary as K
rng = np.random.default_rng(3)
# outputs narrower than a vector store: 8 lanes from a row's start must not pass the plane
for c, (h, w) in ((32800, (3, 2)), (32800, (2, 2)), (32800, (5, 1)), (64, (3, 2)), (64, (1, 5))):
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    words = K.packbits(rng.standard_normal((8, 1, 1, c)))
    got = K.conv2d(x, words, c, path="avx2")
    assert np.array_equal(got, K.reference_conv2d(x, words, c)), (c, h, w)
    del got
print("ok")
"""


@pytest.mark.skipif("avx2" not in PATHS, reason="no AVX2")
def test_avx2_tiny_outputs_stay_in_their_buffer():
    # a write past the output's end shows as heap corruption when the arrays are freed
    import subprocess
    import sys
    env = dict(os.environ, MALLOC_CHECK_="3")
    r = subprocess.run([sys.executable, "-c", _TINY_OUTPUTS], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_bitpacked_bad_inputs_name_the_op():
    from tessera.ops.binary import binary_pack, bitpacked_binary_conv2d, bitpacked_binary_linear
    words = binary_pack(tessera.randn(8, 3, 3, 70))
    good = binary_pack(tessera.randn(1, 5, 5, 70))           # (1, 5, 5, 2)
    with pytest.raises(RuntimeError, match=r"bitpacked_binary_conv2d: a bit-packed input "
                                           r"holds 70 channels as int64 words \(N, H, W, 2\)"):
        bitpacked_binary_conv2d(good[..., :1], words, None, None, 70, padding=1)
    with pytest.raises(RuntimeError, match="bitpacked_binary_conv2d: expected a floating point "
                                           "input or int64 bit-packed words, got tessera.int32"):
        bitpacked_binary_conv2d(good.int(), words, None, None, 70, padding=1)
    with pytest.raises(RuntimeError, match=r"threshold must be int64 of shape \(8, 2\)"):
        bitpacked_binary_conv2d(good, words, None, tessera.zeros(8, 2), 70, padding=1)
    with pytest.raises(RuntimeError, match="alpha scales a float output"):
        bitpacked_binary_conv2d(good, words, tessera.ones(8),
                                tessera.zeros(8, 2, dtype=tessera.int64), 70, padding=1)
    lw = binary_pack(tessera.randn(4, 100))
    with pytest.raises(RuntimeError, match=r"bitpacked_binary_linear: a bit-packed input "
                                           r"holds 100 channels as int64 words \(B, 2\)"):
        bitpacked_binary_linear(binary_pack(tessera.randn(3, 64)), lw, None, None, 100)
    layer = bnn.pack(nn.Sequential(bnn.BinaryConv2d(70, 8, 3), nn.BatchNorm2d(8),
                                   bnn.BinaryConv2d(8, 8, 3)).eval())[2]
    with pytest.raises(RuntimeError, match="bitpacked_binary_conv2d"):
        layer(tessera.randn(1, 8, 5, 5).long())
