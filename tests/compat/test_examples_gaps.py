"""Gaps found running PyTorch's official examples (pytorch/examples) with tessera as
``torch``: each test checks one behaviour those scripts rely on, against PyTorch."""
import numpy as np
import pytest
import torch

import tessera

ARC = ["arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh"]


@pytest.mark.parametrize("name", ARC)
def test_numpy_named_inverse_trig(name):
    # fx/invert.py pairs torch.sin with torch.arcsin
    x = np.array([0.2, 0.5, 0.9], np.float32) + (1.5 if name == "arccosh" else 0.0)
    want = getattr(torch, name)(torch.tensor(x)).numpy()
    np.testing.assert_allclose(getattr(tessera, name)(tessera.tensor(x)).numpy(), want,
                               rtol=1e-6)
    np.testing.assert_allclose(getattr(tessera.tensor(x), name)().numpy(), want, rtol=1e-6)
    t = tessera.tensor(x)
    assert getattr(t, name + "_")() is t
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-6)


def _fx_graph_code(tt):
    # fx/proxy_based_graph_creation.py: Proxies built around a fresh graph's placeholders,
    # then ordinary torch functions called on them
    g = tt.fx.Graph()
    tracer = tt.fx.proxy.GraphAppendingTracer(g)
    x = tt.fx.Proxy(g.placeholder("x"), tracer)
    y = tt.fx.Proxy(g.placeholder("y"), tracer)
    out = tt.neg(tt.tanh(tt.cat([x, y])))
    g.output(out.node)
    return tt.fx.GraphModule(tt.nn.Module(), g)


def test_torch_functions_record_on_free_proxies():
    a, b = np.ones((2, 3), np.float32), np.full((1, 3), 0.5, np.float32)
    gm, ref = _fx_graph_code(tessera), _fx_graph_code(torch)
    assert [n.op for n in gm.graph.nodes] == [n.op for n in ref.graph.nodes]
    assert [n.target.__name__ for n in gm.graph.nodes if n.op == "call_function"] == \
        ["cat", "tanh", "neg"]
    np.testing.assert_allclose(gm(tessera.tensor(a), tessera.tensor(b)).numpy(),
                               ref(torch.tensor(a), torch.tensor(b)).numpy(), rtol=1e-6)
    assert "tessera.cat" in gm.code


def test_free_proxy_patch_is_released():
    import gc
    before = tessera.cat
    gm = _fx_graph_code(tessera)
    gc.collect()
    assert tessera.cat is before  # no Proxy left: the original function is back
    assert "tessera.cat" in gm.code


def test_leaf_activation_module_on_proxy_inlines():
    # fx/inline_function.py: calling a ReLU module on Proxies of a traced graph
    for tt in (torch, tessera):
        class M(tt.nn.Module):
            def __init__(self):
                super().__init__()
                self.relu = tt.nn.ReLU()

            def forward(self, x):
                return self.relu(x) + 1.0
        m = tt.fx.symbolic_trace(M())
        tracer = tt.fx.proxy.GraphAppendingTracer(m.graph)
        for node in list(m.graph.nodes):
            if (node.op, node.target) == ("call_module", "relu"):
                with m.graph.inserting_before(node):
                    args = tt.fx.node.map_arg(node.args, lambda n: tt.fx.Proxy(n, tracer))
                    node.replace_all_uses_with(m.relu(*args).node)
                    m.graph.erase_node(node)
        m.recompile()
        assert [n.op for n in m.graph.nodes] == \
            ["placeholder", "call_function", "call_function", "output"]
        x = tt.tensor([-1.0, 2.0])
        assert m(x).tolist() == [1.0, 3.0]


def test_testing_assert_close_messages():
    cases = [([1.0, 2.0, 3.0], [1.0, 2.5, 3.1]), ([1.0, 2.0], [1.0, 2.0000001]),
             ([[1, 2]], [[1, 3]])]
    for a, b in cases:
        errors = []
        for tt in (torch, tessera):
            try:
                tt.testing.assert_close(tt.tensor(a), tt.tensor(b))
                errors.append(None)
            except AssertionError as e:
                errors.append(str(e).splitlines()[:3])
        assert errors[0] == errors[1]
    for tt in (torch, tessera):
        with pytest.raises(AssertionError, match="attribute 'dtype' do not match"):
            tt.testing.assert_close(tt.ones(2), tt.ones(2, dtype=tt.float64))
        with pytest.raises(AssertionError, match="attribute 'shape' do not match"):
            tt.testing.assert_close(tt.ones(2), tt.ones(3))
        tt.testing.assert_close({"a": [tt.ones(2)]}, {"a": [tt.ones(2) + 1e-7]})
        tt.testing.assert_close(tt.ones(2), tt.ones(2) + 0.01, rtol=0.1, atol=0.0)
