"""The duplicate pass: cheap producers copied into each consumer's fusion region."""
from __future__ import annotations

import pytest

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
    from tests.graph._train import train_mlp_against_torch
    ir = train_mlp_against_torch("GELU", "SGD", lr=0.1)[-1].ir
    if tessera.codegen.enabled():   # the bias add lives in the gelu and gelu_backward kernels
        bodies = [n.attrs["body"] for n in ir.nodes if n.op.name == "fused"]
        assert any("gelu(" in b and "add(" in b for b in bodies)
        assert any("gelu_backward(" in b and "add(" in b for b in bodies)
