"""The duplicate pass: cheap producers copied into each consumer's fusion region."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera.graph.ir import Graph
from tessera.graph.passes import PassContext, duplicate, fuse

CTX = PassContext(codegen=True)


def _ops(g):
    return [n.op.name for n in g.nodes]


def test_bias_add_is_copied_to_both_users_and_each_copy_fuses():
    g = Graph.parse('''graph(%x: float32[8, 4], %b: float32[4], %g: float32[8, 4]) {
      %0: float32[8, 4] = add(%x, %b) {alpha=1}
      %1: float32[8, 4] = gelu(%0) {approximate='none'}
      %2: float32[8, 4] = gelu_backward(%g, %0) {approximate='none'}
      return (%1, %2)
    }''')
    assert duplicate.run(g, CTX)
    assert _ops(g) == ["add", "gelu", "add", "gelu_backward"]
    assert g.nodes[0].outputs[0] is not g.nodes[2].outputs[0]
    fuse.run(g, CTX)
    regions = [n.notes.get("region") for n in g.nodes]
    assert regions[0] == regions[1] and regions[2] == regions[3] and regions[0] != regions[2]


@pytest.mark.parametrize("text", [
    # two operands as large as the result: keeping both alive would cost memory
    '''graph(%x: float32[8, 4], %y: float32[8, 4]) {
      %0: float32[8, 4] = add(%x, %y) {alpha=1}
      %1: float32[8, 4] = exp(%0)
      %2: float32[8, 4] = neg(%0)
      return (%1, %2)
    }''',
    # a user that is no elementwise op: the value is stored for it anyway
    '''graph(%x: float32[8, 4], %b: float32[4], %w: float32[4, 4]) {
      %0: float32[8, 4] = add(%x, %b) {alpha=1}
      %1: float32[8, 4] = exp(%0)
      %2: float32[8, 4] = matmul(%0, %w)
      return (%1, %2)
    }''',
    # not cheap
    '''graph(%x: float32[8, 4]) {
      %0: float32[8, 4] = exp(%x)
      %1: float32[8, 4] = sin(%0)
      %2: float32[8, 4] = cos(%0)
      return (%1, %2)
    }''',
    # a returned value is stored anyway
    '''graph(%x: float32[8, 4], %b: float32[4]) {
      %0: float32[8, 4] = add(%x, %b) {alpha=1}
      %1: float32[8, 4] = exp(%0)
      %2: float32[8, 4] = neg(%0)
      return (%0, %1, %2)
    }''',
])
def test_left_alone(text):
    g = Graph.parse(text)
    before = str(g)
    assert not duplicate.run(g, CTX)
    assert str(g) == before


def test_not_without_generated_code():
    g = Graph.parse('''graph(%x: float32[8, 4], %b: float32[4]) {
      %0: float32[8, 4] = add(%x, %b) {alpha=1}
      %1: float32[8, 4] = exp(%0)
      %2: float32[8, 4] = neg(%0)
      return (%1, %2)
    }''')
    assert not duplicate.run(g, PassContext(codegen=False))


def test_training_graph_with_gelu_matches_pytorch():
    tessera.manual_seed(0)
    model = tessera.nn.Sequential(tessera.nn.Linear(16, 32), tessera.nn.GELU(),
                                  tessera.nn.Linear(32, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    ref.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in model.state_dict().items()})
    opt = tessera.optim.SGD(model.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)

    class Train(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.model(x).square().mean()
            loss.backward()
            return loss
    g = Train()
    x = np.random.default_rng(1).standard_normal((64, 16)).astype(np.float32)
    for _ in range(3):
        loss = g(tessera.tensor(x))
        ropt.zero_grad()
        rloss = ref(torch.from_numpy(x)).square().mean()
        rloss.backward()
        ropt.step()
        np.testing.assert_allclose(loss.item(), rloss.item(), rtol=1e-5)
    ir = g._cache[g._last_key].ir
    if tessera.codegen.enabled():   # the bias add lives in the gelu and gelu_backward kernels
        bodies = [n.attrs["body"] for n in ir.nodes if n.op.name == "fused"]
        assert any("gelu(" in b and "add(" in b for b in bodies)
        assert any("gelu_backward(" in b and "add(" in b for b in bodies)
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
