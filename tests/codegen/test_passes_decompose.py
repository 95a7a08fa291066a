"""The decompose pass (tessera/codegen/passes/decompose.py): row-wise ops become the
reductions and elementwise ops of their ``decompose`` rule, as Before/Expected IR text,
and the graph computes what it did (the reference interpreter runs both)."""
from __future__ import annotations

from tessera.codegen.passes import decompose
from tessera.graph import Graph
from tessera.graph.passes import PassContext
from tests.graph.test_passes_fold import check

CODEGEN = PassContext(codegen=True)


def test_softmax_is_max_sub_exp_sum_div():
    check("""graph(%x: float32[2, 3]) {
      %0: float32[2, 3] = softmax(%x) {dim=-1}
      return (%0)
    }""", """graph(%x: float32[2, 3]) {
      %1: float32[2, 1] = amax(%x) {dim=(1,), keepdim=True}
      %2: float32[2, 3] = sub(%x, %1)
      %3: float32[2, 3] = exp(%2)
      %4: float32[2, 1] = sum(%3) {dim=(1,), keepdim=True, dtype=None}
      %5: float32[2, 3] = div(%3, %4)
      return (%5)
    }""", [decompose], CODEGEN)


def test_layer_norm_with_weight_and_bias():
    check("""graph(%x: float32[4, 8], %w: float32[8], %b: float32[8]) {
      %0: float32[4, 8] = layer_norm(%x, %w, %b) {normalized_shape=[8], eps=1e-05}
      return (%0)
    }""", """graph(%x: float32[4, 8], %w: float32[8], %b: float32[8]) {
      %1: float32[4, 1] = mean(%x) {dim=(1,), keepdim=True, dtype=None}
      %2: float32[4, 8] = sub(%x, %1)
      %3: float32[4, 8] = mul(%2, %2)
      %4: float32[4, 1] = mean(%3) {dim=(1,), keepdim=True, dtype=None}
      %5: float32[4, 1] = add(%4, 1e-05)
      %6: float32[4, 1] = sqrt(%5)
      %7: float32[4, 1] = reciprocal(%6)
      %8: float32[4, 8] = mul(%2, %7)
      %9: float32[4, 8] = mul(%8, %w)
      %10: float32[4, 8] = add(%9, %b)
      return (%10)
    }""", [decompose], CODEGEN)


def test_log_softmax_backward():
    check("""graph(%g: float32[2, 3], %y: float32[2, 3]) {
      %0: float32[2, 3] = log_softmax_backward(%g, %y) {dim=1}
      return (%0)
    }""", """graph(%g: float32[2, 3], %y: float32[2, 3]) {
      %1: float32[2, 3] = exp(%y)
      %2: float32[2, 1] = sum(%g) {dim=(1,), keepdim=True, dtype=None}
      %3: float32[2, 3] = mul(%1, %2)
      %4: float32[2, 3] = sub(%g, %3)
      return (%4)
    }""", [decompose], CODEGEN)


def test_nothing_changes_without_code_generation_or_on_other_dtypes():
    """The NumPy executor runs the undecomposed ops' own kernels faster; float64 rows
    decompose too, integer ones cannot."""
    text = """graph(%x: float32[2, 3]) {
      %0: float32[2, 3] = softmax(%x) {dim=-1}
      return (%0)
    }"""
    check(text, text, [decompose], PassContext(codegen=False))
    g = Graph.parse(text.replace("float32", "float64"))
    assert decompose.run(g, CODEGEN)
    assert [n.op.name for n in g.nodes] == ["amax", "sub", "exp", "sum", "div"]
