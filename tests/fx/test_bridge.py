"""An fx-transformed module compiled by nn.Graph computes what it computes eagerly, and
to_graph_ir gives tessera's IR of it."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import tessera
import tessera.fx as fx
from tessera import nn
from tessera.graph import interpret


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(6, 16)
        self.act = nn.ReLU()
        self.l2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.l2(tessera.relu(self.act(self.l1(x)) - 0.1))


class _ReluToGelu(fx.Transformer):
    """Every ReLU, module or function, becomes a GELU."""

    def call_module(self, target, args, kwargs):
        if isinstance(self.fetch_attr(target), nn.ReLU):
            return self.call_function(nn.functional.gelu, args, kwargs)
        return super().call_module(target, args, kwargs)

    def call_function(self, target, args, kwargs):
        if target is tessera.relu:
            target = nn.functional.gelu
        return super().call_function(target, args, kwargs)


def _transformed():
    tessera.manual_seed(0)
    gm = _ReluToGelu(fx.symbolic_trace(_Net())).transform()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(nn.functional.gelu) == 2 and tessera.relu not in targets
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["l1", "l2"]
    return gm


def test_nn_graph_compiles_a_transformed_graph_module():
    gm = _transformed()

    class Infer(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = gm

        def build(self, x):
            return self.model(x)

    x = tessera.randn(5, 6)
    eager = gm(x)
    got = Infer()(x)
    np.testing.assert_allclose(got.numpy(), eager.detach().numpy(), rtol=1e-5, atol=1e-6)
    ref = gm.l2(nn.functional.gelu(nn.functional.gelu(gm.l1(x)) - 0.1))
    np.testing.assert_allclose(eager.detach().numpy(), ref.detach().numpy(), rtol=1e-6)


def test_nn_graph_trains_a_graph_module_as_eager_does():
    gm = _transformed()
    twin = copy.deepcopy(gm)
    x, y = tessera.randn(8, 6), tessera.randn(8, 3)
    opt = tessera.optim.SGD(gm.parameters(), lr=0.1)

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = gm
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            return loss

    step = Train()
    eager_opt = tessera.optim.SGD(twin.parameters(), lr=0.1)
    for _ in range(3):
        loss = step(x, y)
        eager_opt.zero_grad()
        eager_loss = nn.functional.mse_loss(twin(x), y)
        eager_loss.backward()
        eager_opt.step()
        np.testing.assert_allclose(loss.numpy(), eager_loss.detach().numpy(), rtol=1e-5)
    for a, b in zip(gm.parameters(), twin.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_to_graph_ir_names_parameters_and_runs():
    gm = _transformed()
    ir = fx.to_graph_ir(gm, tessera.randn(5, 6))
    assert set(ir.variables) >= {"l1.weight", "l1.bias", "l2.weight", "l2.bias"}
    assert [n.op.name for n in ir.nodes].count("gelu") == 2
    x = tessera.randn(5, 6)
    outputs, updates = interpret(ir, [x], dict(gm.state_dict()))
    assert updates == []
    np.testing.assert_allclose(outputs[0].numpy(), gm(x).detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(TypeError, match="example input 0 must be a Tensor"):
        fx.to_graph_ir(gm, np.ones((5, 6)))

