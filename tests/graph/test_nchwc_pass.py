"""The nchwc pass: an inference graph's convolutional trunk in the blocked layout
(``tessera.ops.nchwc``) gives the outputs of the same graph without it, on the zoo's
convolutional models at batch 1 and 8 and on the cases it must leave alone or border
with a ``from_nchwc``; the ops against PyTorch are the op-info entries'."""
from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

import tessera
from tessera import nn
from tessera.graph.ir import Graph
from tessera.graph.passes import PassContext, nchwc as nchwc_pass


@pytest.fixture(params=[8, 16])
def block(request, monkeypatch):
    """Each block size the pass may choose (the NumPy kernels run where C does not)."""
    monkeypatch.setattr(nchwc_pass, "block", lambda: request.param)
    monkeypatch.setenv("TESSERA_NCHWC", "1")
    return request.param


class _G(nn.Graph):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def build(self, *xs):
        return self.m(*xs)


def _run(m, xs, on: bool, monkeypatch):
    monkeypatch.setenv("TESSERA_NCHWC", "1" if on else "0")
    g = _G(m)
    out = g(*xs)
    return (out if isinstance(out, tuple) else (out,)), g.ir


def _ops(ir) -> collections.Counter:
    return collections.Counter(n.op.name for n in ir.nodes)


def _same(m, xs, monkeypatch, rtol=1e-4):
    """The blocked graph's outputs against the plain graph's; its IR."""
    want, _ = _run(m, xs, False, monkeypatch)
    got, ir = _run(m, xs, True, monkeypatch)
    for a, b in zip(got, want):
        b = b.numpy()
        np.testing.assert_allclose(a.numpy(), b, rtol=rtol, atol=rtol * np.abs(b).max())
    assert Graph.parse(str(ir)) == ir    # the text form round-trips
    return ir


ZOO = [("lenet5", (1, 28, 28)), ("resnet18", (3, 64, 64)), ("mobilenet_v2", (3, 64, 64)),
       ("vgg11_bn", (3, 32, 32)), ("resnet50", (3, 64, 64)), ("vit_tiny", (3, 224, 224))]


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("name,shape", ZOO, ids=[z[0] for z in ZOO])
def test_zoo_models_match_the_plain_graph(name, shape, batch, block, monkeypatch):
    if batch == 8 and name in ("resnet50", "vit_tiny"):
        pytest.skip("batch 8 of the large models: resnet18 and mobilenet_v2 cover it")
    tessera.manual_seed(0)
    m = getattr(tessera.models, name)().eval()
    ir = _same(m, (tessera.randn(batch, *shape),), monkeypatch)
    ops = _ops(ir)
    assert ops["conv2d_nchwc"] >= 1 and "conv" not in ops and "conv_pointwise" not in ops, ops
    if name in ("resnet18", "mobilenet_v2", "resnet50"):
        # one region from the stem to the global pool: a single layout change, no to_nchwc
        assert ops["from_nchwc"] == 1 and "to_nchwc" not in ops, ops
        assert "relu" not in ops and "hardtanh" not in ops, ops


class Odd(nn.Module):
    """Channels not a multiple of the block, a grouped convolution, reflect padding, a
    value read by a plain op and returned, pooling with ceil mode and a standalone relu."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 10, 3, padding=1)
        self.b = nn.Conv2d(10, 6, 3, stride=2, padding=1)
        self.grouped = nn.Conv2d(6, 12, 3, padding=1, groups=2)
        self.reflect = nn.Conv2d(12, 5, 3, padding=1, padding_mode="reflect")
        self.dw = nn.Conv2d(5, 5, 3, padding=1, groups=5)

    def forward(self, x):
        a = self.a(x)
        b = torch_like_relu(self.b(a))
        side = b.sigmoid()                      # a plain reader of a blocked value
        c = self.reflect(self.grouped(b))
        d = self.dw(c) + c                      # depthwise, its residual
        p = nn.functional.max_pool2d(d, 3, 2, ceil_mode=True)
        q = nn.functional.avg_pool2d(d, 2, 2, count_include_pad=False)
        return side, b, p, q.relu(), nn.functional.adaptive_avg_pool2d(d, 1), \
            d.mean((2, 3)), d.mean((-1, -2), keepdim=True)


def torch_like_relu(v):
    return v.relu()


def test_a_residual_convolution_takes_over_its_residual(block, monkeypatch):
    """The memory plan puts a residual convolution's output in its residual's buffer (read
    where it is written), never in its input's (read around it): ResNet-18 as without."""
    from tessera.kernels import nchwc as K
    if not K.usable():
        pytest.skip("the C kernels do not run here")
    tessera.manual_seed(0)
    m = tessera.models.resnet18().eval()
    x = tessera.randn(1, 3, 64, 64)
    _same(m, (x,), monkeypatch)
    g = _G(m)
    g(x)
    compiled = g._current()
    convs = {i for i, n in enumerate(compiled.ir.nodes) if n.op.name == "conv2d_nchwc"}
    taken = {i: k for i, k in compiled.executor.plan.inplace.items() if i in convs}
    assert taken and set(taken.values()) == {3}


def test_a_graph_compiles_one_library_of_its_convolutions_tiles(block, monkeypatch):
    """The graph's blocked convolutions run in one library of the register tiles they
    reach (``conv_tiles``), not every tile."""
    from tessera.kernels import nchwc as K
    from tessera.ops import nchwc as ops
    if not K.usable():
        pytest.skip("the C kernels do not run here")
    monkeypatch.setattr(K, "_LIBS", {})
    monkeypatch.setattr(K, "_EXPECTED", {})
    ops._conv_runner.cache_clear()     # (bound earlier for the same shapes: bind again)
    tessera.manual_seed(0)
    ir = _same(Odd().eval(), (tessera.randn(2, 3, 15, 13),), monkeypatch)
    want: set = set()
    for n in ir.nodes:
        if n.op.name == "conv2d_nchwc":
            a, x, y = n.attrs, n.inputs[0].shape, n.outputs[0].shape
            o, cg = a["weight_shape"][:2]
            want |= K.conv_tiles((x[0], cg * a["groups"]) + tuple(x[2:4]), (y[0], o) + y[2:4],
                                 a["weight_shape"], a["stride"], (a["pads"][0][0],
                                 a["pads"][1][0]), a["dilation"], a["groups"], block,
                                 a["plain_input"])[0]
    assert K._EXPECTED == {block: [frozenset(want)]}
    if K._path(K._isa(), block):    # (the portable path runs without tiles)
        assert K._LIBS == {block: [frozenset(want)]}


def test_odd_cases_border_or_stay_plain(block, monkeypatch):
    tessera.manual_seed(1)
    ir = _same(Odd().eval(), (tessera.randn(2, 3, 15, 13),), monkeypatch)
    ops = _ops(ir)
    groups = sorted(n.attrs["groups"] for n in ir.nodes if n.op.name == "conv")
    assert groups == [1, 2], ops                # the grouped and the reflect-padded conv
    blocked = [n for n in ir.nodes if n.op.name == "conv2d_nchwc"]
    assert [n.attrs["plain_input"] for n in blocked] == [True, False, False], ops
    assert blocked[1].attrs["activation"] == "relu"
    assert blocked[2].attrs["groups"] == 5 and blocked[2].inputs[3] is not None
    assert ops["from_nchwc"] >= 2 and ops["to_nchwc"] == 1 and "mean" not in ops, ops


def test_a_graph_with_backward_or_changing_weights_is_left_alone(block):
    g = Graph.parse('''graph(%x: float32[1, 8, 6, 6]) {
  var %w: float32[8, 8, 3, 3]
  %0: float32[1, 8, 6, 6] = conv(%x, %w, None) {stride=(1, 1), pads=((1, 1), (1, 1)), \
dilation=(1, 1), groups=1}
  %1: float32[1, 8, 6, 6] = conv(%0, %w, None) {stride=(1, 1), pads=((1, 1), (1, 1)), \
dilation=(1, 1), groups=1}
  return (%1)
}''')
    vals = {"w": tessera.randn(8, 8, 3, 3)}
    assert not nchwc_pass.run(g, PassContext(True, vals))     # training: weights change
    assert not nchwc_pass.run(g, PassContext(False, {}))      # nothing known
    assert nchwc_pass.run(g, PassContext(False, vals))
    assert [n.op.name for n in g.nodes] == ["to_nchwc", "conv2d_nchwc", "conv2d_nchwc",
                                            "from_nchwc"]
    assert g.outputs[0].producer.op.name == "from_nchwc"


def test_switch(monkeypatch):
    monkeypatch.setattr(nchwc_pass, "block", lambda: 8)
    text = '''graph(%x: float32[1, 8, 6, 6]) {
  var %w: float32[8, 8, 3, 3]
  %0: float32[1, 8, 6, 6] = conv(%x, %w, None) {stride=(1, 1), pads=((1, 1), (1, 1)), \
dilation=(1, 1), groups=1}
  return (%0)
}'''
    vals = {"w": tessera.randn(8, 8, 3, 3)}
    for env, changed in (("0", False), ("auto", False), ("1", True)):
        monkeypatch.setenv("TESSERA_NCHWC", env)    # auto: one convolution is not worth it
        assert nchwc_pass.run(Graph.parse(text), PassContext(False, dict(vals))) == changed
    ctx = PassContext(False, dict(vals), backend="tvm")     # another backend's graph
    assert not nchwc_pass.run(Graph.parse(text), ctx)
    monkeypatch.setattr(nchwc_pass, "block", lambda: None)   # no C kernels here
    assert not nchwc_pass.run(Graph.parse(text), PassContext(False, dict(vals)))


def test_the_ops_have_no_gradient():
    from tessera.ops.nchwc import to_nchwc
    x = tessera.ones(1, 3, 2, 2, requires_grad=True)
    with pytest.raises(RuntimeError, match="to_nchwc: an inference op"):
        to_nchwc(x, 8).sum().backward()


def test_blocked_pooling_against_pytorch(block):
    from tessera.ops.nchwc import from_nchwc, pool2d_nchwc, to_nchwc
    x = np.random.default_rng(0).standard_normal((2, 11, 9, 7)).astype(np.float32)
    xb = to_nchwc(tessera.from_numpy(x), block)
    for kind, k, s, p, inc in (("max", (3, 3), (2, 2), (1, 1), True),
                               ("avg", (3, 2), (2, 1), (1, 0), False),
                               ("avg", (9, 7), (9, 7), (0, 0), True)):
        got = from_nchwc(pool2d_nchwc(xb, kind, k, s, p, count_include_pad=inc), 11).numpy()
        t = torch.from_numpy(x)
        want = torch.nn.functional.max_pool2d(t, k, s, p) if kind == "max" else \
            torch.nn.functional.avg_pool2d(t, k, s, p, count_include_pad=inc)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


class _Residual3x3(nn.Module):
    """3x3 stride-1 layers of 16 and 40 channels at 16x15 (Winograd in auto mode), a
    residual, a stride-2 one (direct) and one of 8 output channels (direct in auto mode)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(16, 40, 3, 1, 1), nn.BatchNorm2d(40), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(40, 40, 3, 1, 1), nn.BatchNorm2d(40))
        self.c = nn.Conv2d(40, 40, 3, 2, 1)
        self.d = nn.Conv2d(40, 8, 3, 1, 1)

    def forward(self, x):
        x = self.a(x)
        x = (self.b(x) + x).relu()
        return self.d(self.c(x).clamp(-1, 1))


@pytest.mark.parametrize("mode,expect", [("auto", [True, True, False, False]),
                                         ("1", [True, True, False, True]),
                                         ("0", [False] * 4)])
def test_winograd_plan_by_layer(mode, expect, block, monkeypatch):
    """``TESSERA_NCHWC_WINOGRAD``: the 3x3 stride-1 layers the rule takes run as blocked
    Winograd (weights packed transformed), with the same outputs as the plain graph."""
    monkeypatch.setenv("TESSERA_NCHWC_WINOGRAD", mode)
    tessera.manual_seed(4)
    m = _Residual3x3().eval()
    with tessera.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.copy_(tessera.randn(mod.num_features) * 0.1)
                mod.running_var.copy_(tessera.rand(mod.num_features) + 0.5)
    ir = _same(m, (tessera.randn(2, 16, 16, 15),), monkeypatch)
    convs = [n for n in ir.nodes if n.op.name == "conv2d_nchwc"]
    assert [n.attrs["winograd"] for n in convs] == expect
    assert convs[1].inputs[3] is not None   # the residual folded into the Winograd layer


def test_winograd_weights_unpack_for_the_numpy_kernel():
    """The NumPy kernel (where the C kernels do not run) reads Winograd-packed weights: the
    filters come back from their transforms."""
    from tessera.ops import nchwc as ops
    w = np.random.default_rng(0).standard_normal((20, 12, 3, 3)).astype(np.float32)
    wp = ops.pack_conv_weight(w, groups=1, block=8, plain_input=False, winograd=True)
    if ops._kernels() is None:
        pytest.skip("the C kernels do not run here: nothing packed")
    np.testing.assert_allclose(ops._unpack(wp, w.shape, 1, 8, False, True), w, atol=1e-5)
