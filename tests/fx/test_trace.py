"""symbolic_trace against torch.fx: the same module written with tessera names and with
torch names records the same nodes, prints the same graph, and the generated code
computes what eager mode does."""
from __future__ import annotations

import math
import operator

import numpy as np
import pytest
import torch
import torch.fx

import tessera
import tessera.fx
from tessera.fx.proxy import TraceError


def _models(T):
    """The same modules built with namespace ``T`` (tessera or torch)."""
    F = T.nn.functional

    class Block(T.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = T.nn.Linear(4, 4)
            self.scale = T.nn.Parameter(T.ones(4))
            self.register_buffer("shift", T.zeros(4))

        def forward(self, x):
            return T.relu(self.lin(x)) * self.scale + self.shift

    class Net(T.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.seq = T.nn.Sequential(T.nn.Linear(4, 6), T.nn.Tanh())
            self.norm = T.nn.LayerNorm(6)

        def forward(self, x, y=2):
            a = self.block(x + y)
            b = T.add(a, 1).relu()
            c = F.gelu(b, approximate="tanh") * 2
            d = c[:, 0:2] + c.shape[0]
            e = T.cat([d, -d], dim=1).sum(dim=-1, keepdim=True)
            h = self.norm(self.seq(a)).view(x.size(0), -1)
            q, k = h.chunk(2, dim=1)
            out = T.matmul(q, k.transpose(0, 1)) / math.sqrt(3) - e
            return out.mean(), {"h": h, "pair": (q @ k.T, abs(e))}

    return Net


def _signature(gm):
    out = []
    for n in gm.graph.nodes:
        t = n.target if isinstance(n.target, str) else n.target.__name__
        out.append((n.op, n.name, t, len(n.args), sorted(n.kwargs)))
    return out


def _normalize(text: str) -> str:
    """torch's printed graph in tessera's words (the public paths of the functions)."""
    for a, b in (("torch._C._nn.gelu", "tessera.nn.functional.gelu"),
                 ("torch.nn.functional.relu", "tessera.nn.functional.relu"),
                 ("torch.", "tessera.")):
        text = text.replace(a, b)
    return text


def _copy_params(tmod, tsmod):
    sd = {k: tessera.tensor(v.detach().numpy()) for k, v in tmod.state_dict().items()}
    tsmod.load_state_dict(sd)


def test_nodes_and_printed_graph_match_torch_fx():
    torch.manual_seed(0)
    tm, sm = _models(torch)(), _models(tessera)()
    tg, sg = torch.fx.symbolic_trace(tm), tessera.fx.symbolic_trace(sm)
    assert _signature(sg) == _signature(tg)
    assert str(sg.graph) == _normalize(str(tg.graph))
    assert sg.code == _normalize(tg.code)


def test_generated_code_computes_what_eager_does():
    torch.manual_seed(0)
    tm, sm = _models(torch)(), _models(tessera)()
    _copy_params(tm, sm)
    gm = tessera.fx.symbolic_trace(sm)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    got = gm(tessera.tensor(x))
    eager = sm(tessera.tensor(x))
    ref = tm(torch.tensor(x))
    np.testing.assert_allclose(got[0].detach().numpy(), eager[0].detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(got[0].detach().numpy(), ref[0].detach().numpy(), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(got[1]["pair"][0].detach().numpy(),
                               ref[1]["pair"][0].detach().numpy(), rtol=1e-4, atol=1e-5)
    assert sorted(gm.state_dict()) == sorted(sm.state_dict())


def test_a_function_and_its_name():
    def f(a, b):
        return tessera.add(a, b) * 2
    gm = tessera.fx.symbolic_trace(f)
    assert type(gm).__name__ == "f"
    assert [n.op for n in gm.graph.nodes] == ["placeholder", "placeholder", "call_function",
                                              "call_function", "output"]
    assert gm(tessera.ones(2), tessera.ones(2)).tolist() == [4.0, 4.0]


def test_control_flow_on_a_proxy_is_a_trace_error_with_torch_message():
    def f(x):
        return x if x.sum() > 0 else -x
    with pytest.raises(torch.fx.proxy.TraceError) as ref:
        torch.fx.symbolic_trace(f)
    with pytest.raises(TraceError) as got:
        tessera.fx.symbolic_trace(f)
    assert str(got.value) == str(ref.value)
    with pytest.raises(TraceError, match="cannot be iterated"):
        tessera.fx.symbolic_trace(lambda x: [v for v in x])
    with pytest.raises(RuntimeError, match="'len' is not supported"):
        tessera.fx.symbolic_trace(lambda x: len(x))


def test_unpacking_a_proxy_into_names_is_traced():
    def f(x):
        a, b = x.chunk(2)
        return a - b
    gm = tessera.fx.symbolic_trace(f)
    x = tessera.arange(4.0)
    assert gm(x).tolist() == (x[:2] - x[2:]).tolist()
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"][:2] == \
        [operator.getitem, operator.getitem]


def test_concrete_args_specialise_and_check():
    def f(x, flag):
        return x + 1 if flag else x - 1
    tg = torch.fx.symbolic_trace(f, concrete_args={"flag": True})
    sg = tessera.fx.symbolic_trace(f, concrete_args={"flag": True})
    assert [(n.op, n.name) for n in sg.graph.nodes] == [(n.op, n.name) for n in tg.graph.nodes]
    assert sg(tessera.ones(2), True).tolist() == [2.0, 2.0]
    with pytest.raises(AssertionError, match="flag has been specialized to have value True"):
        sg(tessera.ones(2), False)
    gm = tessera.fx.symbolic_trace(f, concrete_args={"flag": None})
    with pytest.raises(AssertionError, match="specialized to have value None"):
        gm(tessera.ones(2), 1)


def _leaf_helper(x):
    return x.clamp(0, 1)


tessera.fx.wrap("_leaf_helper")


def test_wrap_keeps_a_function_as_one_node_and_retraces():
    def f(x):
        return _leaf_helper(x) + 1
    gm = tessera.fx.symbolic_trace(f)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert calls[0].target is _leaf_helper and calls[0].meta["is_wrapped"]
    assert 'wrap("' in gm.code
    again = tessera.fx.symbolic_trace(gm)
    assert [n.op for n in again.graph.nodes] == [n.op for n in gm.graph.nodes]
    x = tessera.tensor([-1.0, 0.5, 3.0])
    assert again(x).tolist() == [1.0, 1.5, 2.0]


def test_math_functions_are_recorded():
    gm = tessera.fx.symbolic_trace(lambda x: math.sqrt(x.size(0)) * x)
    assert math.sqrt in [n.target for n in gm.graph.nodes]
    assert gm(tessera.ones(4)).tolist() == [2.0] * 4


def test_concrete_tensors_become_attributes():
    class M(tessera.nn.Module):
        def __init__(self):
            super().__init__()
            self.const = tessera.tensor([1.0, 2.0])

        def forward(self, x):
            return self.const + x + tessera.ones(2) * x
    m = M()
    gm = tessera.fx.symbolic_trace(m)
    ops = [(n.op, n.target) for n in gm.graph.nodes if n.op in ("get_attr", "call_method")]
    assert ops == [("get_attr", "const"), ("call_method", "add"),
                   ("get_attr", "_tensor_constant0"), ("call_method", "mul")]
    x = tessera.tensor([3.0, 4.0])
    assert gm(x).tolist() == m(x).tolist()


def test_custom_tracer_keeps_a_user_module_as_a_leaf():
    class Inner(tessera.nn.Module):
        def forward(self, x):
            return x * 3

    class Outer(tessera.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x) + 1

    class LeafTracer(tessera.fx.Tracer):
        def is_leaf_module(self, m, qualname):
            return isinstance(m, Inner) or super().is_leaf_module(m, qualname)

    root = Outer()
    graph = LeafTracer().trace(root)
    assert [(n.op, n.target) for n in graph.nodes][1] == ("call_module", "inner")
    gm = tessera.fx.GraphModule(root, graph)
    assert gm(tessera.ones(2)).tolist() == [4.0, 4.0]
    default = tessera.fx.symbolic_trace(root)
    assert "call_module" not in [n.op for n in default.graph.nodes]


def test_varargs_become_starred_placeholders():
    def f(x, *rest):
        return x + rest[0]
    gm = tessera.fx.symbolic_trace(f)
    assert [n.target for n in gm.graph.nodes if n.op == "placeholder"] == ["x", "*rest"]
    assert gm(tessera.ones(1), tessera.ones(1)).tolist() == [2.0]


def test_patches_are_undone_after_a_trace():
    before = (tessera.relu, tessera.nn.functional.gelu, tessera.Tensor.__add__,
              tessera.nn.Module.__getattr__, tessera.Tensor.__dict__.get("add"))
    with pytest.raises(TraceError):
        tessera.fx.symbolic_trace(lambda x: tessera.relu(x) if x else x)
    after = (tessera.relu, tessera.nn.functional.gelu, tessera.Tensor.__add__,
             tessera.nn.Module.__getattr__, tessera.Tensor.__dict__.get("add"))
    assert all(a is b for a, b in zip(before, after))
    assert not tessera.fx.tracer.is_fx_tracing()
