"""einsum inside nn.Graph: traced once with its path as a node attr, run by the compiled
executor, trained with the backward traced into the same graph; equal to eager."""
from __future__ import annotations

import numpy as np

import tessera
from tessera import nn
from tessera.graph.text import parse_graph, print_graph
from tessera.graph.trace import trace


class Bilinear(nn.Module):
    """A bilinear layer and attention-style scores, both as einsums."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(tessera.randn(4, 3, 5) * 0.3)
        self.proj = nn.Parameter(tessera.randn(4, 4) * 0.3)

    def forward(self, x, y):
        h = tessera.einsum("bi,oij,bj->bo", x, self.w, y)
        q = tessera.einsum("bo,op->bp", h, self.proj)
        scores = tessera.einsum("bp,cp->bc", q, h)
        return tessera.einsum("bc,cp->bp", scores.softmax(-1), q)


class Train(nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x, y, t):
        loss = ((self.model(x, y) - t) ** 2).mean()
        loss.backward()
        return loss


class Infer(nn.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, x, y):
        return self.model(x, y)


def _data(seed):
    rng = np.random.default_rng(seed)
    return [tessera.from_numpy(rng.standard_normal(s).astype(np.float32))
            for s in [(6, 3), (6, 5), (6, 4)]]


def test_inference_graph_equals_eager_and_keeps_the_path():
    tessera.manual_seed(0)
    model = Bilinear()
    g = Infer(model)
    x, y, _ = _data(0)
    np.testing.assert_allclose(g(x, y).numpy(), model(x, y).detach().numpy(), rtol=1e-5, atol=1e-6)
    nodes = [n for n in g.ir.nodes if n.op.name == "einsum"]
    assert len(nodes) == 4
    assert nodes[0].attrs["equation"] == "bi,oij,bj->bo"
    assert len(nodes[0].attrs["path"]) == 2
    x2, y2, _ = _data(1)  # the compiled plan runs again on new values
    np.testing.assert_allclose(g(x2, y2).numpy(), model(x2, y2).detach().numpy(), rtol=1e-5,
                               atol=1e-6)


def test_training_graph_equals_eager():
    tessera.manual_seed(1)
    m_eager, m_graph = Bilinear(), Bilinear()
    m_graph.load_state_dict(m_eager.state_dict())
    opt_e = tessera.optim.SGD(m_eager.parameters(), lr=0.1)
    g = Train(m_graph, tessera.optim.SGD(m_graph.parameters(), lr=0.1))
    for step in range(4):
        x, y, t = _data(10 + step)
        opt_e.zero_grad()
        loss_e = ((m_eager(x, y) - t) ** 2).mean()
        loss_e.backward()
        opt_e.step()
        loss_g = g(x, y, t)
        np.testing.assert_allclose(loss_g.numpy(), loss_e.detach().numpy(), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(m_eager.named_parameters(), m_graph.parameters()):
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=name)
    # the backward einsums are in the graph too
    assert sum(n.op.name == "einsum" for n in g.ir.nodes) > 4


def test_ir_text_round_trips():
    graph, _ = trace(lambda a, b, c: tessera.einsum("...ij,jk,kl->...il", a, b, c),
                     tessera.ones(2, 3, 4), tessera.ones(4, 5), tessera.ones(5, 6))
    text = print_graph(graph)
    assert "einsum(" in text and "equation='aij,jk,kl->ail'" in text
    assert print_graph(parse_graph(text)) == text
