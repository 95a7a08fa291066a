"""A row-wise region that carries a value in its output buffer between phases (LayerNorm
after a residual add, as in every BERT layer) must not run in place over its input: the
memory planner is told so, and a compiled graph equals eager."""
from __future__ import annotations

import numpy as np

import tessera
from tessera import nn
from tessera.codegen.rowwise import writes_before_reading
from tessera.graph.ir import Graph


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.n0 = nn.LayerNorm(384)
        self.lin = nn.Linear(384, 384)
        self.n1 = nn.LayerNorm(384)

    def forward(self, x):
        h = self.n0(x)
        # n1's region reads h last and is not the step's result: the planner's candidate
        # for writing over h in place; a linear layer after it keeps it a region of its own
        return self.lin(self.n1(self.lin(h) + h))


class G(nn.Graph):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def build(self, x):
        return self.m(x)


def test_layernorm_after_residual_matches_eager():
    tessera.manual_seed(0)
    m = Block().eval()
    x = tessera.randn(1, 16, 384) * 5 + 2
    with tessera.no_grad():
        ref = m(x).numpy()
    np.testing.assert_allclose(G(m)(x).numpy(), ref, rtol=1e-5, atol=1e-5)


def test_which_bodies_carry_a_value():
    ln = Graph.parse('''graph(%a: float32[2, 4], %b: float32[2, 4]) {
      %0: float32[2, 4] = add(%a, %b) {alpha=1}
      %1: float32[2, 1] = mean(%0) {dim=(1,), keepdim=True, dtype=None}
      %2: float32[2, 4] = sub(%0, %1)
      return (%2)
    }''')
    plain = Graph.parse('''graph(%a: float32[2, 4]) {
      %0: float32[2, 4] = exp(%a)
      return (%0)
    }''')
    assert writes_before_reading(ln) and not writes_before_reading(plain)
