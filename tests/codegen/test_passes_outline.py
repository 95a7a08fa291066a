"""The outline pass (tessera/codegen/passes/outline.py): each fusion region becomes one
``fused`` node whose body is the region in IR text, as Before/Expected IR text, and the
graph computes what it did (the reference interpreter runs the fused body's nodes)."""
from __future__ import annotations

from tessera.codegen.passes import outline
from tessera.graph.passes import PassContext, fuse
from tests.graph.test_passes_fold import check

CODEGEN = PassContext(codegen=True)


def test_a_chain_becomes_one_fused_node():
    body = ("graph(%a0: float32[4, 8], %a1: float32[4, 8]) {\\n"
            "  %0: float32[4, 8] = mul(%a0, 2.0)\\n"
            "  %1: float32[4, 8] = add(%0, %a1) {alpha=1}\\n"
            "  %2: float32[4, 8] = sigmoid(%1)\\n"
            "  %3: float32[4, 8] = tanh(%2)\\n"
            "  return (%3)\\n}")
    check("""graph(%x: float32[4, 8], %y: float32[4, 8]) {
      %0: float32[4, 8] = mul(%x, 2.0)
      %1: float32[4, 8] = add(%0, %y) {alpha=1}
      %2: float32[4, 8] = sigmoid(%1)
      %3: float32[4, 8] = tanh(%2)
      return (%3)
    }""", f"""graph(%x: float32[4, 8], %y: float32[4, 8]) {{
      %3: float32[4, 8] = fused(%x, %y) {{body='{body}'}}
      return (%3)
    }}""", [fuse, outline], CODEGEN)


def test_a_region_between_matrix_products_reads_the_product_once():
    body = ("graph(%a0: float32[4, 8]) {\\n"
            "  %0: float32[4, 8] = sigmoid(%a0)\\n"
            "  %1: float32[4, 8] = mul(%0, %a0)\\n"
            "  return (%1)\\n}")
    check("""graph(%x: float32[4, 8], %w: float32[8, 8]) {
      %0: float32[4, 8] = matmul(%x, %w)
      %1: float32[4, 8] = sigmoid(%0)
      %2: float32[4, 8] = mul(%1, %0)
      %3: float32[4, 8] = matmul(%2, %w)
      return (%3)
    }""", f"""graph(%x: float32[4, 8], %w: float32[8, 8]) {{
      %0: float32[4, 8] = matmul(%x, %w)
      %2: float32[4, 8] = fused(%0) {{body='{body}'}}
      %3: float32[4, 8] = matmul(%2, %w)
      return (%3)
    }}""", [fuse, outline], CODEGEN)


def test_single_pass_ops_alone_stay_with_numpy():
    """An op NumPy runs in one pass at memory speed (trait ``single_pass``) is not worth a
    kernel of its own. Without code generation the regions stay marked, not outlined."""
    text = """graph(%x: float32[4, 8]) {
      %0: float32[4, 8] = add(%x, %x) {alpha=1}
      return (%0)
    }"""
    check(text, text, [fuse, outline], CODEGEN)
    chain = """graph(%x: float32[4, 8]) {
      %0: float32[4, 8] = sigmoid(%x)
      %1: float32[4, 8] = tanh(%0)
      return (%1)
    }"""
    check(chain, """graph(%x: float32[4, 8]) {
      %0: float32[4, 8] = sigmoid(%x) [region=0]
      %1: float32[4, 8] = tanh(%0) [region=0]
      return (%1)
    }""", [fuse, outline], PassContext(codegen=False))


def test_a_broadcast_input_comes_in_as_its_source():
    """A region reading an ``expand`` (a loss gradient's scalar, a row's statistic) reads the
    value it broadcasts and expands it in its body, so the kernel indexes a contiguous array
    with stride 0 instead of taking its strided variant; an expand read elsewhere stays."""
    body = ("graph(%a0: float32[], %a1: float32[4, 8], %a2: float32[4, 1]) {\\n"
            "  %0: float32[4, 8] = expand(%a0) {shape=(4, 8)}\\n"
            "  %1: float32[4, 8] = expand(%a2) {shape=(4, 8)}\\n"
            "  %2: float32[4, 8] = mul(%0, %a1)\\n"
            "  %3: float32[4, 8] = sub(%2, %1) {alpha=1}\\n"
            "  %4: float32[4, 8] = exp(%3)\\n"
            "  return (%4)\\n}")
    check("""graph(%s: float32[], %x: float32[4, 8], %r: float32[4, 1]) {
      %0: float32[4, 8] = expand(%s) {shape=(4, 8)}
      %1: float32[4, 8] = mul(%0, %x)
      %2: float32[4, 8] = expand(%r) {shape=(4, 8)}
      %3: float32[4, 8] = sub(%1, %2) {alpha=1}
      %4: float32[4, 8] = exp(%3)
      return (%4, %2)
    }""", f"""graph(%s: float32[], %x: float32[4, 8], %r: float32[4, 1]) {{
      %2: float32[4, 8] = expand(%r) {{shape=(4, 8)}}
      %4: float32[4, 8] = fused(%s, %x, %r) {{body='{body}'}}
      return (%4, %2)
    }}""", [fuse, outline], CODEGEN)
