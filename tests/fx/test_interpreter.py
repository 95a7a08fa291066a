"""Interpreter, Transformer and ShapeProp, against torch.fx on the same module."""
from __future__ import annotations

import numpy as np
import torch
import torch.fx
from torch.fx.passes.shape_prop import ShapeProp as TorchShapeProp

import tessera
import tessera.fx
from tessera.fx.passes.shape_prop import ShapeProp


def _net(T):
    class Net(T.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = T.nn.Conv2d(3, 4, 3, padding=1)
            self.fc = T.nn.Linear(4 * 8 * 8, 5)

        def forward(self, x):
            y = T.relu(self.conv(x))
            return self.fc(T.flatten(y, 1)).softmax(-1)
    return Net()


def test_interpreter_runs_each_opcode_and_frees_values():
    m = _net(tessera)
    gm = tessera.fx.symbolic_trace(m)
    seen = []

    class Recording(tessera.fx.Interpreter):
        def run_node(self, n):
            seen.append((n.op, len(self.env)))
            return super().run_node(n)

    x = tessera.randn(2, 3, 8, 8)
    assert tessera.allclose(Recording(gm).run(x), m(x))
    assert [op for op, _ in seen] == [n.op for n in gm.graph.nodes]
    assert max(live for _, live in seen) <= 2   # a chain holds one value at a time


def test_interpreter_reports_the_failing_node():
    gm = tessera.fx.symbolic_trace(lambda x: tessera.matmul(x, x))
    try:
        tessera.fx.Interpreter(gm).run(tessera.ones(2, 3))
    except RuntimeError as e:
        assert "While executing %matmul" in str(e)
    else:
        raise AssertionError("no error")


def test_shape_prop_records_what_torch_records():
    tm, sm = _net(torch), _net(tessera)
    tg, sg = torch.fx.symbolic_trace(tm), tessera.fx.symbolic_trace(sm)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    TorchShapeProp(tg).propagate(torch.tensor(x))
    ShapeProp(sg).propagate(tessera.tensor(x))
    for t, s in zip(tg.graph.nodes, sg.graph.nodes):
        tm_, sm_ = t.meta.get("tensor_meta"), s.meta.get("tensor_meta")
        assert (tm_ is None) == (sm_ is None), t.name
        if tm_ is not None:
            assert tuple(sm_.shape) == tuple(tm_.shape), t.name
            assert str(sm_.dtype).split(".")[-1] == str(tm_.dtype).split(".")[-1]
            assert sm_.stride == tuple(tm_.stride) and sm_.requires_grad == tm_.requires_grad


def test_transformer_rewrites_every_call():
    class SwapOps(tessera.fx.Transformer):
        def call_function(self, target, args, kwargs):
            if target is tessera.relu:
                target = tessera.sigmoid
            return super().call_function(target, args, kwargs)

        def call_method(self, target, args, kwargs):
            if target == "softmax":
                target = "log_softmax"
            return super().call_method(target, args, kwargs)

    m = _net(tessera)
    gm = tessera.fx.symbolic_trace(m)
    new = SwapOps(gm).transform()
    assert isinstance(new, tessera.fx.GraphModule) and new.conv is m.conv
    assert "tessera.sigmoid(conv)" in new.code and ".log_softmax(-1)" in new.code
    assert "tessera.relu" in gm.code            # the original is unchanged
    x = tessera.randn(2, 3, 8, 8)
    ref = m.fc(tessera.flatten(tessera.sigmoid(m.conv(x)), 1)).log_softmax(-1)
    assert tessera.allclose(new(x), ref)
