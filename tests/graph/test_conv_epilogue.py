"""The conv_epilogue pass and conv_pointwise: a convolution (its batch norm folded) with the
activation and residual add after it, run as one op in an inference nn.Graph, against
PyTorch's ops one by one; on every GEMM path (AVX-512, AVX2, portable through tessera's GEMM
epilogue, and OpenBLAS with the drivers' own epilogue loops); and the chains the pass must
leave alone."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera import nn
from tessera.graph.ir import Graph
from tessera.graph.passes.conv_epilogue import run as conv_epilogue
from tessera.kernels import conv as conv_kernels, gemm

# (in, out, size, kernel, stride): a 1x1 on x itself, a 3x3 the Winograd rule takes, a
# stride-2 3x3 and a 7x7 stem on im2col
LAYERS = [(24, 40, 14, 1, 1), (64, 64, 14, 3, 1), (16, 32, 15, 3, 2), (3, 32, 30, 7, 2)]
# (activation, where the residual goes): the blocks of ResNet and MobileNetV2, and others
CHAINS = [("relu", None), ("relu6", None), ("hardtanh", None), ("clamp", None),
          ("relu", "first"), (None, "after"), ("relu6", "after"), (None, None)]


class Block(nn.Module):
    def __init__(self, c, o, k, s, act, res):
        super().__init__()
        self.conv = nn.Conv2d(c, o, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(o)
        self.act, self.res = act, res

    def forward(self, x, r):
        y = self.bn(self.conv(x))
        if self.res == "first":
            y = y + r
        if self.act == "relu":
            y = tessera.relu(y)
        elif self.act == "relu6":
            y = nn.functional.relu6(y)
        elif self.act == "hardtanh":
            y = nn.functional.hardtanh(y, -0.5, 0.75)
        elif self.act == "clamp":
            y = y.clamp(min=-1.0)
        return y + r if self.res == "after" else y


def _torch(m: Block, x, r):
    """The block in PyTorch, from the same weights and batch statistics."""
    t = {k: torch.from_numpy(v.numpy()) for k, v in m.state_dict().items()}
    y = torch.nn.functional.conv2d(torch.from_numpy(x.numpy()), t["conv.weight"],
                                   stride=m.conv.stride, padding=m.conv.padding)
    y = torch.nn.functional.batch_norm(y, t["bn.running_mean"], t["bn.running_var"],
                                       t["bn.weight"], t["bn.bias"], False, 0.0, m.bn.eps)
    tr = torch.from_numpy(r.numpy())
    if m.res == "first":
        y = y + tr
    y = {"relu": torch.relu, "relu6": torch.nn.functional.relu6,
         "hardtanh": lambda v: torch.nn.functional.hardtanh(v, -0.5, 0.75),
         "clamp": lambda v: v.clamp(min=-1.0), None: lambda v: v}[m.act](y)
    return (y + tr if m.res == "after" else y).numpy()


def _block(c, o, hw, k, s, act, res, seed=0):
    tessera.manual_seed(seed)
    m = Block(c, o, k, s, act, res)
    with tessera.no_grad():   # batch statistics that make the fold do something
        m.bn.running_mean.copy_(tessera.randn(o) * 0.1)
        m.bn.running_var.copy_(tessera.rand(o) + 0.5)
        m.bn.weight.copy_(tessera.randn(o))
        m.bn.bias.copy_(tessera.randn(o))
    m.eval()
    x = tessera.randn(2, c, hw, hw)
    r = tessera.randn(2, o, (hw - 1) // s + 1, (hw - 1) // s + 1)
    return m, x, r


def _graph(m):
    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m

        def build(self, x, r):
            return self.m(x, r)
    return G()


def _check(m, x, r):
    g = _graph(m)
    with tessera.no_grad():
        y = g(x, r).numpy()
    want = _torch(m, x, r)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    return [n.op.name for n in g._current().executor.graph.nodes]


@pytest.mark.parametrize("layer", LAYERS, ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("chain", CHAINS, ids=lambda t: f"{t[0]}-{t[1]}")
def test_graph_matches_torch(layer, chain):
    m, x, r = _block(*layer, *chain)
    ops = _check(m, x, r)
    if conv_kernels.threaded(np.float32) and chain != (None, None):
        assert "conv_pointwise" in ops and "conv" not in ops, ops


@pytest.fixture(params=["avx512", "avx2", "portable", "blas"])
def gemm_path(request, monkeypatch):
    """The convolutions' products forced onto one GEMM path for the test."""
    if not conv_kernels.threaded(np.float32) or not gemm.available():
        pytest.skip("no OpenBLAS the drivers can call, or no C compiler")
    path = request.param
    if path != "blas":
        if not gemm._lib().tsr_gemm_isa_supported(gemm.ISAS.index(path)):
            pytest.skip(f"this CPU lacks {path}")
        monkeypatch.setenv("TESSERA_GEMM_ISA", path)
    monkeypatch.setattr(conv_kernels, "_CONV_GEMM", "blas" if path == "blas" else "tessera")

    def reset():
        gemm._isa.cache_clear()
        conv_kernels._own_sgemm.cache_clear()
        conv_kernels._ONCE.pop(("conv", "own_sgemm"), None)
    reset()
    yield path
    monkeypatch.undo()
    reset()


@pytest.mark.parametrize("layer", LAYERS, ids=lambda t: "x".join(map(str, t)))
def test_every_gemm_path(gemm_path, layer):
    for chain in (("relu", "first"), ("relu6", "after"), ("hardtanh", None)):
        m, x, r = _block(*layer, *chain, seed=1)
        _check(m, x, r)


def test_float64():
    m, x, r = _block(24, 40, 14, 1, 1, "relu", "first")
    m = m.double()
    x, r = x.double(), r.double()
    g = _graph(m)
    with tessera.no_grad():
        y = g(x, r).numpy()
    t = {k: torch.from_numpy(v.numpy()) for k, v in m.state_dict().items()}
    want = torch.relu(torch.nn.functional.batch_norm(
        torch.nn.functional.conv2d(torch.from_numpy(x.numpy()), t["conv.weight"]),
        t["bn.running_mean"], t["bn.running_var"], t["bn.weight"], t["bn.bias"], False, 0.0,
        m.bn.eps) + torch.from_numpy(r.numpy())).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-10)


def test_resnet_and_mobilenet_blocks_equal_eager():
    for name in ("resnet18", "mobilenet_v2"):
        tessera.manual_seed(0)
        model = getattr(tessera.models, name)(num_classes=10).eval()
        x = tessera.randn(1, 3, 64, 64)

        class G(nn.Graph):
            def __init__(self):
                super().__init__()
                self.model = model

            def build(self, x):
                return self.model(x)
        with tessera.no_grad():
            np.testing.assert_allclose(G()(x).numpy(), model(x).numpy(), rtol=1e-4,
                                       atol=1e-5)


_IR = '''graph(%x: float32[1, 32, 16, 16], %r: float32[1, 32, 16, 16], %v: float32[32]) {
  var %w: float32[32, 32, 3, 3]
  %0: float32[1, 32, 16, 16] = conv(%x, %w, None) {stride=(1, 1), pads=((1, 1), (1, 1)), \
dilation=(1, 1), groups=1}
  BODY
}'''


@pytest.mark.parametrize("body,fused", [
    ("%1: float32[1, 32, 16, 16] = relu(%0)\n  return (%1)", True),
    # the convolution's output read twice, or returned: no fusion
    ("%1: float32[1, 32, 16, 16] = relu(%0)\n  return (%1, %0)", False),
    ("%1: float32[1, 32, 16, 16] = relu(%0)\n"
     "  %2: float32[1, 32, 16, 16] = add(%0, %1) {alpha=1}\n  return (%2)", False),
    # a broadcast addend, a scaled one, a tensor bound: not a residual or an activation
    ("%1: float32[1, 32, 16, 16] = add(%0, %v) {alpha=1}\n  return (%1)", False),
    ("%1: float32[1, 32, 16, 16] = add(%0, %r) {alpha=2}\n  return (%1)", False),
    # the residual after an activation that is read twice: the activation alone
    ("%1: float32[1, 32, 16, 16] = relu(%0)\n"
     "  %2: float32[1, 32, 16, 16] = add(%1, %r) {alpha=1}\n  return (%2, %1)", True),
])
def test_pass_fuses_only_single_reader_chains(body, fused):
    if not conv_kernels.threaded(np.float32):
        pytest.skip("the convolution runs on no driver that fuses")
    g = Graph.parse(_IR.replace("BODY", body))
    assert conv_epilogue(g, None) is fused
    if fused:
        pw = [n for n in g.nodes if n.op.name == "conv_pointwise"]
        assert len(pw) == 1 and pw[0].inputs[3] is None


def test_grouped_convolutions_are_left_alone():
    g = Graph.parse('''graph(%x: float32[1, 32, 16, 16]) {
  var %w: float32[32, 1, 3, 3]
  %0: float32[1, 32, 16, 16] = conv(%x, %w, None) {stride=(1, 1), pads=((1, 1), (1, 1)), \
dilation=(1, 1), groups=32}
  %1: float32[1, 32, 16, 16] = relu(%0)
  return (%1)
}''')
    assert conv_epilogue(g, None) is False


def test_bad_epilogue_raises():
    from tessera.ops.conv import conv_pointwise
    x, w = tessera.ones(1, 2, 4, 4), tessera.ones(3, 2, 1, 1)
    a = dict(stride=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1), groups=1)
    with pytest.raises(RuntimeError, match="conv_pointwise: the residual"):
        conv_pointwise(x, w, None, tessera.ones(1, 2, 4, 4), **a)
    with pytest.raises(RuntimeError, match="conv_pointwise: activation"):
        conv_pointwise(x, w, activation="gelu", **a)
    with pytest.raises(RuntimeError, match="conv_pointwise: clamp"):
        conv_pointwise(x, w, activation="clamp", bounds=(1.0, 0.0), **a)
