"""The folding passes: constant folding, algebraic simplification and batch-norm
folding, as Before/Expected IR text, plus numeric checks through the reference interpreter
(and, for batch-norm folding, against eager mode and PyTorch)."""
from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.graph import Graph, interpret, trace
from tessera.graph.executor import Executor
from tessera.graph.passes import PassContext, algebraic, bnfold, constfold, dce

RNG = np.random.default_rng(0)


def _norm(text: str) -> str:
    return str(Graph.parse(text))


def _run(before: str, passes, ctx=None) -> tuple[Graph, Graph]:
    """(the graph before, the graph after ``passes`` then DCE); both verified."""
    g0, g = Graph.parse(before), Graph.parse(before)
    g0.verify()
    for p in passes:
        p.run(g, ctx)
        g.verify()
    dce.run(g, ctx)
    g.verify()
    return g0, g


def _random(v) -> tessera.Tensor:
    if v.dtype.is_floating_point:
        a = RNG.standard_normal(v.shape)
    else:
        a = RNG.integers(-5, 5, v.shape)
    return tessera.tensor(a, dtype=v.dtype)


def _same_outputs(g0: Graph, g: Graph, values=None) -> None:
    """Both graphs give the same outputs on the same random inputs and variables."""
    values = dict(values or {})
    for name, v in g0.variables.items():
        values.setdefault(name, _random(v))
    inputs = [_random(v) for v in g0.inputs]
    want, _ = interpret(g0, inputs, {k: values[k] for k in g0.variables})
    got, _ = interpret(g, inputs, {k: values[k] for k in g.variables})
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype is b.dtype and tuple(a.shape) == tuple(b.shape)
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)


def check(before: str, expected: str, passes, ctx=None, values=None) -> Graph:
    g0, g = _run(before, passes, ctx)
    assert str(g) == _norm(expected)
    _same_outputs(g0, g, values if values is not None else (ctx.values if ctx else None))
    return g


# ==== constant folding ==================================================================

ARANGE = "arange() {start=0, end=3, step=1, dtype=float32, device=device('cpu')}"


def test_constfold_creation_chain_becomes_one_variable():
    ctx = PassContext(training=True, values={})
    check(f"""graph(%x: float32[3]) {{
      %0: float32[3] = {ARANGE}
      %1: float32[3] = exp(%0)
      %2: float32[3] = mul(%1, 2.0)
      %3: float32[3] = add(%x, %2) {{alpha=1}}
      return (%3)
    }}""", """graph(%x: float32[3]) {
      var %_folded.0: float32[3]
      %3: float32[3] = add(%x, %_folded.0) {alpha=1}
      return (%3)
    }""", [constfold], ctx)
    assert list(ctx.values) == ["_folded.0"]   # one variable, not one per folded node
    np.testing.assert_allclose(ctx.values["_folded.0"].numpy(), np.exp(np.arange(3.0)) * 2,
                               rtol=1e-6)


def test_constfold_multi_output_and_returned_constant():
    ctx = PassContext(training=False, values={})
    check(f"""graph(%x: float32[3]) {{
      %0: float32[3] = {ARANGE}
      %1: float32[], %2: float32[] = var_mean(%0) {{dim=None, correction=1, keepdim=False}}
      %3: float32[3] = sub(%x, %2) {{alpha=1}}
      return (%3, %1)
    }}""", """graph(%x: float32[3]) {
      var %_folded.0: float32[]
      var %_folded.1: float32[]
      %3: float32[3] = sub(%x, %_folded.0) {alpha=1}
      return (%3, %_folded.1)
    }""", [constfold], ctx)
    assert ctx.values["_folded.0"].item() == 1.0 and ctx.values["_folded.1"].item() == 1.0


def test_constfold_never_folds_random_ops():
    before = """graph(%x: float32[3]) {
      %0: float32[3] = randn() {shape=(3,), dtype=float32, generator=None, device=None}
      %1: float32[3] = mul(%0, 2.0)
      %2: float32[3] = add(%x, %1) {alpha=1}
      %3: float32[3] = dropout(%x) {p=0.5, seed=7, mask_shape=(3,), scale=2.0, alpha_shift=False}
      %4: float32[3] = full() {shape=(3,), dtype=float32, value=1, device=device('cpu')}
      %5: float32[3] = normal_(%4) {generator=None, mean=0.0, std=1.0}
      %6: float32[3] = poisson(%4) {generator=None}
      %7: float32[3] = add(%5, %6) {alpha=1}
      return (%2, %3, %7)
    }"""
    ctx = PassContext(training=False, values={})
    _, g = _run(before, [constfold], ctx)
    # the constant input of the samplers folds; the samplers stay
    assert [n.op.name for n in g.nodes] == ["randn", "mul", "add", "dropout", "normal_",
                                            "poisson", "add"]
    assert list(ctx.values) == ["_folded.0"] and ctx.values["_folded.0"].tolist() == [1, 1, 1]


def test_constfold_traced_samplers_stay_random():
    def f(x):
        return x + tessera.zeros(3).normal_() + tessera.poisson(tessera.ones(3)) * \
            tessera.empty(3).uniform_()

    g, _ = trace(f, tessera.ones(3))
    ctx = PassContext(training=False, values={})
    constfold.run(g, ctx)
    dce.run(g, ctx)
    g.verify()
    assert {"normal_", "poisson", "uniform_"} <= {n.op.name for n in g.nodes}
    a, b = (interpret(g, [tessera.zeros(3)], ctx.values)[0][0] for _ in range(2))
    assert not np.array_equal(a.numpy(), b.numpy())


def test_constfold_variables_only_in_inference_graphs():
    before = """graph(%x: float32[2]) {
      var %w: float32[2]
      %0: float32[2] = exp(%w)
      %1: float32[2] = mul(%x, %0)
      return (%1)
    }"""
    w = tessera.tensor([0.5, -1.0])
    train = PassContext(training=True, values={"w": w})
    _, g = _run(before, [constfold], train)
    assert str(g) == _norm(before) and list(train.values) == ["w"]
    infer = PassContext(training=False, values={"w": w})
    check(before, """graph(%x: float32[2]) {
      var %_folded.0: float32[2]
      %1: float32[2] = mul(%x, %_folded.0)
      return (%1)
    }""", [constfold], infer)
    np.testing.assert_allclose(infer.values["_folded.0"].numpy(), np.exp([0.5, -1.0]),
                               rtol=1e-6)


def test_constfold_skips_assigned_variables_and_views_of_variables():
    before = """graph(%x: float32[2, 2]) {
      var %w: float32[2, 2]
      var %step: float32[]
      %0: float32[2, 2] = permute(%w) {dims=(1, 0)}
      %1: float32[2, 2] = matmul(%x, %0)
      %2: float32[] = add(%step, 1) {alpha=1}
      %3: float32[2, 2] = mul(%1, %step)
      return (%3)
      assign %step = %2
    }"""
    ctx = PassContext(False, {"w": tessera.eye(2), "step": tessera.tensor(0.0)})
    _, g = _run(before, [constfold], ctx)
    assert str(g) == _norm(before) and set(ctx.values) == {"w", "step"}


def test_constfold_size_limit():
    # expand of a small constant to 2 MB: the small constant folds, the expand stays
    ctx = PassContext(training=False, values={})
    check("""graph(%x: float32[512, 1024]) {
      %0: float32[1] = full() {shape=(1,), dtype=float32, value=0.5, device=device('cpu')}
      %1: float32[1] = exp(%0)
      %2: float32[512, 1024] = expand(%1) {shape=(512, 1024)}
      %3: float32[512, 1024] = add(%x, %2) {alpha=1}
      return (%3)
    }""", """graph(%x: float32[512, 1024]) {
      var %_folded.0: float32[1]
      %2: float32[512, 1024] = expand(%_folded.0) {shape=(512, 1024)}
      %3: float32[512, 1024] = add(%x, %2) {alpha=1}
      return (%3)
    }""", [constfold], ctx)
    assert tuple(ctx.values["_folded.0"].shape) == (1,)


def test_constfold_needs_somewhere_to_keep_values():
    before = f"""graph(%x: float32[3]) {{
      %0: float32[3] = {ARANGE}
      %1: float32[3] = add(%x, %0) {{alpha=1}}
      return (%1)
    }}"""
    g = Graph.parse(before)
    assert not constfold.run(g, PassContext(training=False, values=None))
    assert not constfold.run(g, None)
    assert str(g) == _norm(before)


def test_constfold_traced_function_matches_eager():
    def f(x):
        c = tessera.full((2, 3), 2.0) * tessera.eye(3)[:2] + tessera.arange(3.0)
        return x * c.exp().sum(0) + tessera.linspace(0, 1, 3)

    x = tessera.randn(2, 3)
    g, _ = trace(f, x)
    ctx = PassContext(training=True, values={})
    assert constfold.run(g, ctx)
    dce.run(g, ctx)
    g.verify()
    assert [n.op.name for n in g.nodes] == ["mul", "add"]
    (got,), _ = interpret(g, [x], ctx.values)
    np.testing.assert_allclose(got.numpy(), f(x).numpy(), rtol=1e-6)


# ==== algebraic simplification ============================================================

def test_algebraic_arithmetic_identities():
    check("""graph(%x: float32[2, 3]) {
      %0: float32[2, 3] = mul(%x, 1)
      %1: float32[2, 3] = mul(1.0, %0)
      %2: float32[2, 3] = add(%1, 0) {alpha=3}
      %3: float32[2, 3] = add(0.0, %2) {alpha=1}
      %4: float32[2, 3] = sub(%3, 0.0) {alpha=1}
      %5: float32[2, 3] = div(%4, 1) {rounding_mode=None}
      %6: float32[] = full() {shape=(), dtype=float32, value=1.0, device=device('cpu')}
      %7: float32[2, 3] = mul(%5, %6)
      return (%7)
    }""", """graph(%x: float32[2, 3]) {
      return (%x)
    }""", [algebraic])


def test_algebraic_keeps_what_is_not_an_identity():
    # x*0 (NaN/inf), broadcasting, promotion, 0 + alpha*x, x - alpha*0 with inf alpha,
    # 0 - x, floor division
    before = """graph(%x: float32[3], %i: int64[3]) {
      %0: float32[3] = mul(%x, 0)
      %1: float32[2, 3] = full() {shape=(2, 3), dtype=float32, value=1.0, device=device('cpu')}
      %2: float32[2, 3] = mul(%x, %1)
      %3: float32[3] = mul(%i, 1.0)
      %4: float32[3] = add(0, %x) {alpha=2}
      %5: float32[3] = sub(%x, 0) {alpha=inf}
      %6: float32[3] = sub(0, %x) {alpha=1}
      %7: float32[3] = div(%x, 1) {rounding_mode='floor'}
      %8: float32[3] = div(%i, 1) {rounding_mode=None}
      return (%0, %2, %3, %4, %5, %6, %7, %8)
    }"""
    g = Graph.parse(before)
    g.verify()
    text = str(g)
    assert not algebraic.run(g, None)
    assert str(g) == text


def test_algebraic_integer_and_bool_identities():
    check("""graph(%i: int32[4], %b: bool[4]) {
      %0: int32[4] = mul(%i, 1)
      %1: int32[4] = add(%0, 0) {alpha=1}
      %2: bool[4] = mul(%b, True)
      return (%1, %2)
    }""", """graph(%i: int32[4], %b: bool[4]) {
      return (%i, %b)
    }""", [algebraic])


def test_algebraic_neg_clone_positive():
    check("""graph(%x: float32[3]) {
      %0: float32[3] = neg(%x)
      %1: float32[3] = neg(%0)
      %2: float32[3] = clone(%1)
      %3: float32[3] = positive(%2)
      %4: float32[3] = neg(%3)
      %5: float32[3] = neg(%4)
      %6: float32[3] = neg(%5)
      return (%6, %0)
    }""", """graph(%x: float32[3]) {
      %0: float32[3] = neg(%x)
      %6: float32[3] = neg(%x)
      return (%6, %0)
    }""", [algebraic])


def test_algebraic_concatenates_merged_heads_before_merging_them():
    """Attention's q, k, v gradients, each (B, H, T, D) permuted to (B, T, H, D) and viewed as
    (B, T, H*D), concatenated along the last dim: one concatenation of the permuted values
    along H, viewed once (the views of permuted values would each need a copy); pieces
    that are not such views, or split off unevenly, stay."""
    head = "graph(%q: float32[2, 3, 5, 4], %k: float32[2, 3, 5, 4], %v: float32[2, 3, 5, 4]) {"
    perms = [f"  %p{i}: float32[2, 5, 3, 4] = permute(%{x}) {{dims=(0, 2, 1, 3)}}"
             for i, x in enumerate("qkv")]
    views = [f"  %v{i}: float32[2, 5, 12] = view(%p{i}) {{shape=(2, 5, 12)}}" for i in range(3)]
    before = [head, *perms, *views,
              "  %c: float32[2, 5, 36] = split_backward(%v0, %v1, %v2) {shape=(2, 5, 36), "
              "dim=2, bounds=((0, 12), (12, 24), (24, 36)), squeeze=False}",
              "  return (%c)", "}"]
    after = [head, *perms,
             "  %0: float32[2, 5, 9, 4] = split_backward(%p0, %p1, %p2) {shape=(2, 5, 9, 4), "
             "dim=2, bounds=((0, 3), (3, 6), (6, 9)), squeeze=False}",
             "  %1: float32[2, 5, 36] = view(%0) {shape=(2, 5, 36)}",
             "  return (%1)", "}"]
    check("\n".join(before), "\n".join(after), [algebraic, dce])
    uneven = "\n".join([
        "graph(%x: float32[2, 5, 12], %y: float32[2, 5, 2, 3]) {",
        "  %0: float32[2, 5, 6] = view(%y) {shape=(2, 5, 6)}",
        "  %1: float32[2, 5, 18] = split_backward(%x, %0) {shape=(2, 5, 18), dim=2, "
        "bounds=((0, 12), (12, 18)), squeeze=False}",
        "  return (%1)", "}"])
    check(uneven, uneven, [algebraic, dce])


def test_algebraic_copy_is_its_source_when_it_neither_broadcasts_nor_casts():
    check("""graph(%x: float32[2, 3], %y: float32[2, 3], %r: float32[3], %h: float64[2, 3]) {
      %0: float32[2, 3] = neg(%y)
      %1: float32[2, 3] = copy(%x, %0)
      %2: float32[2, 3] = copy(%x, %r)
      %3: float32[2, 3] = copy(%x, %h)
      %4: float32[2, 3] = copy(%x, %y)
      %5: float32[3, 2] = permute(%0) {dims=(1, 0)}
      %6: float32[3, 2] = copy(%5, %5)
      return (%1, %2, %3, %4, %6)
    }""", """graph(%x: float32[2, 3], %y: float32[2, 3], %r: float32[3], %h: float64[2, 3]) {
      %0: float32[2, 3] = neg(%y)
      %2: float32[2, 3] = copy(%x, %r)
      %3: float32[2, 3] = copy(%x, %h)
      %4: float32[2, 3] = copy(%x, %y)
      %5: float32[3, 2] = permute(%0) {dims=(1, 0)}
      %6: float32[3, 2] = copy(%5, %5)
      return (%0, %2, %3, %4, %6)
    }""", [algebraic])


def test_copy_between_variables_in_a_graph_swaps_them_as_eager_does():
    """``a.copy_(b); b.copy_(t)``: a copy from a variable stays a copy (were a's new value
    b's own array, b's assignment could overwrite it before a's is made)."""
    class Pair(tessera.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = tessera.nn.Parameter(tessera.tensor([1.0, 2.0]))
            self.b = tessera.nn.Parameter(tessera.tensor([3.0, 4.0]))

    def swap(m):
        with tessera.no_grad():
            t = m.a.clone()
            m.a.copy_(m.b)
            m.b.copy_(t)

    class Swap(tessera.nn.Graph):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def build(self, x):
            swap(self.m)
            return x + 1
    compiled, eager = Pair(), Pair()
    Swap(compiled)(tessera.zeros(1))
    swap(eager)
    for name in ("a", "b"):
        np.testing.assert_array_equal(getattr(compiled, name).detach().numpy(),
                                      getattr(eager, name).detach().numpy())
    assert eager.b.detach().numpy().tolist() == [1.0, 2.0]


def test_algebraic_permutes_compose():
    check("""graph(%x: float32[2, 3, 4]) {
      %0: float32[3, 2, 4] = permute(%x) {dims=(1, 0, 2)}
      %1: float32[2, 3, 4] = permute(%0) {dims=(1, 0, 2)}
      %2: float32[4, 2, 3] = permute(%x) {dims=(2, 0, 1)}
      %3: float32[3, 2, 4] = permute(%2) {dims=(2, 1, 0)}
      %4: float32[2, 3, 4] = permute(%x) {dims=(0, 1, 2)}
      %5: float32[4, 3, 2] = permute(%3) {dims=(-1, 0, 1)}
      return (%1, %3, %4, %5)
    }""", """graph(%x: float32[2, 3, 4]) {
      %6: float32[3, 2, 4] = permute(%x) {dims=(1, 0, 2)}
      %7: float32[4, 3, 2] = permute(%x) {dims=(2, 1, 0)}
      return (%x, %6, %x, %7)
    }""", [algebraic])


def test_algebraic_reshapes_and_expands():
    check("""graph(%x: float32[2, 3]) {
      %0: float32[3, 2] = view(%x) {shape=(3, 2)}
      %1: float32[6] = view(%0) {shape=(6,)}
      %2: float32[2, 3] = view(%x) {shape=(2, 3)}
      %3: float32[1, 2, 3] = unsqueeze(%x) {dim=0}
      %4: float32[2, 3] = squeeze(%3) {dims=(0,)}
      %5: float32[6, 1] = unsqueeze(%1) {dim=1}
      %6: float32[2, 3] = expand(%x) {shape=(2, 3)}
      %7: float32[3] = full() {shape=(3,), dtype=float32, value=2.0, device=device('cpu')}
      %8: float32[2, 3] = expand(%7) {shape=(2, 3)}
      %9: float32[4, 2, 3] = expand(%8) {shape=(4, 2, 3)}
      return (%1, %2, %4, %5, %6, %9)
    }""", """graph(%x: float32[2, 3]) {
      %10: float32[6] = view(%x) {shape=(6,)}
      %11: float32[6, 1] = view(%x) {shape=(6, 1)}
      %7: float32[3] = full() {shape=(3,), dtype=float32, value=2.0, device=device('cpu')}
      %12: float32[4, 2, 3] = expand(%7) {shape=(4, 2, 3)}
      return (%10, %x, %x, %11, %x, %12)
    }""", [algebraic])


def test_algebraic_casts():
    check("""graph(%x: float32[3], %i: int8[3], %j: int32[3]) {
      %0: float32[3] = cast(%x) {dtype=float32}
      %1: float64[3] = cast(%x) {dtype=float64}
      %2: float32[3] = cast(%1) {dtype=float32}
      %3: float16[3] = cast(%x) {dtype=float16}
      %4: float32[3] = cast(%3) {dtype=float32}
      %5: int32[3] = cast(%i) {dtype=int32}
      %6: int16[3] = cast(%5) {dtype=int16}
      %7: float32[3] = cast(%j) {dtype=float32}
      %8: int32[3] = cast(%7) {dtype=int32}
      %9: float16[3] = cast(%1) {dtype=float16}
      %10: float32[3] = cast(%i) {dtype=float32}
      %11: int16[3] = cast(%10) {dtype=int16}
      return (%0, %2, %4, %6, %8, %9, %11)
    }""", """graph(%x: float32[3], %i: int8[3], %j: int32[3]) {
      %3: float16[3] = cast(%x) {dtype=float16}
      %4: float32[3] = cast(%3) {dtype=float32}
      %12: int16[3] = cast(%i) {dtype=int16}
      %7: float32[3] = cast(%j) {dtype=float32}
      %8: int32[3] = cast(%7) {dtype=int32}
      %13: float16[3] = cast(%x) {dtype=float16}
      %10: float32[3] = cast(%i) {dtype=float32}
      %11: int16[3] = cast(%10) {dtype=int16}
      return (%x, %x, %4, %12, %8, %13, %11)
    }""", [algebraic])


def test_algebraic_rewrites_assigns():
    check("""graph(%x: float32[2]) {
      var %v: float32[2]
      %0: float32[2] = add(%v, %x) {alpha=1}
      %1: float32[2] = mul(%0, 1)
      %2: float32[2] = clone(%1)
      return (%2)
      assign %v = %1
    }""", """graph(%x: float32[2]) {
      var %v: float32[2]
      %0: float32[2] = add(%v, %x) {alpha=1}
      return (%0)
      assign %v = %0
    }""", [algebraic])


def test_algebraic_traced_function_matches_eager():
    def f(x):
        y = (x * 1 + 0).t().t().reshape(3, 4).reshape(12).clone() / 1 - 0
        z = -(-x.permute(1, 0).permute(1, 0).unsqueeze(0).squeeze(0)).double().float()
        return y.exp(), z.expand(4, 3) * 2

    x = tessera.randn(4, 3)
    g, _ = trace(f, x)
    n_before = len(g.nodes)
    assert algebraic.run(g, None)
    dce.run(g, None)
    g.verify()
    assert [n.op.name for n in g.nodes] == ["view", "exp", "mul"] and n_before > 10
    got, _ = interpret(g, [x], {})
    for a, b in zip(got, f(x)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# ==== batch-norm folding ==================================================================

CONV_BN = """graph(%x: float32[2, 2, 4, 4]) {
  var %w: float32[3, 2, 3, 3]
  var %b: float32[3]
  var %gamma: float32[3]
  var %beta: float32[3]
  var %rm: float32[3]
  var %rv: float32[3]
  %0: float32[2, 3, 4, 4] = conv(%x, %w, %b) {stride=(1, 1), pads=((1, 1), (1, 1)), \
dilation=(1, 1), groups=1}
  %1: float32[2, 3, 4, 4], %2: float32[3], %3: float32[3] = batch_norm(%0, %gamma, %beta, \
%rm, %rv) {training=False, eps=1e-05}
  %4: float32[2, 3, 4, 4] = relu(%1)
  return (%4)
}"""


def _bn_values(c: int = 3, **shapes) -> dict:
    vals = {"gamma": RNG.uniform(0.5, 2, c), "beta": RNG.uniform(-1, 1, c),
            "rm": RNG.uniform(-1, 1, c), "rv": RNG.uniform(0.5, 2, c)}
    vals.update({k: RNG.standard_normal(s) for k, s in shapes.items()})
    return {k: tessera.tensor(v, dtype=tessera.float32) for k, v in vals.items()}


def test_bnfold_conv():
    ctx = PassContext(False, _bn_values(w=(3, 2, 3, 3), b=(3,)))
    check(CONV_BN, """graph(%x: float32[2, 2, 4, 4]) {
      var %_folded.0: float32[3, 2, 3, 3]
      var %_folded.1: float32[3]
      %5: float32[2, 3, 4, 4] = conv(%x, %_folded.0, %_folded.1) {stride=(1, 1), \
pads=((1, 1), (1, 1)), dilation=(1, 1), groups=1}
      %4: float32[2, 3, 4, 4] = relu(%5)
      return (%4)
    }""", [bnfold], ctx)
    v = {k: t.numpy().astype(np.float64) for k, t in ctx.values.items()}
    s = v["gamma"] / np.sqrt(v["rv"] + 1e-5)
    np.testing.assert_allclose(v["_folded.0"], v["w"] * s[:, None, None, None], rtol=1e-6)
    np.testing.assert_allclose(v["_folded.1"], (v["b"] - v["rm"]) * s + v["beta"], rtol=1e-5,
                               atol=1e-6)


def test_bnfold_linear_with_and_without_bias():
    ctx = PassContext(False, _bn_values(w=(3, 5), b=(3,)))
    check("""graph(%x: float32[4, 5]) {
      var %w: float32[3, 5]
      var %b: float32[3]
      var %gamma: float32[3]
      var %beta: float32[3]
      var %rm: float32[3]
      var %rv: float32[3]
      %0: float32[5, 3] = permute(%w) {dims=(1, 0)}
      %1: float32[4, 3] = matmul(%x, %0)
      %2: float32[4, 3] = add(%1, %b) {alpha=1}
      %3: float32[4, 3], %4: float32[3], %5: float32[3] = batch_norm(%2, %gamma, %beta, %rm, \
%rv) {training=False, eps=1e-05}
      %6: float32[4, 3] = matmul(%x, %0)
      %7: float32[4, 3], %8: float32[3], %9: float32[3] = batch_norm(%6, None, None, %rm, \
%rv) {training=False, eps=0.001}
      return (%3, %7)
    }""", """graph(%x: float32[4, 5]) {
      var %_folded.0: float32[5, 3]
      var %_folded.1: float32[3]
      var %_folded.2: float32[5, 3]
      var %_folded.3: float32[3]
      %10: float32[4, 3] = matmul(%x, %_folded.0)
      %11: float32[4, 3] = add(%10, %_folded.1) {alpha=1}
      %12: float32[4, 3] = matmul(%x, %_folded.2)
      %13: float32[4, 3] = add(%12, %_folded.3) {alpha=1}
      return (%11, %13)
    }""", [bnfold], ctx)


@pytest.mark.parametrize("add", ["add(%1, %b) {alpha=2.5}", "add(%b, %1) {alpha=1}"])
def test_bnfold_linear_bias_forms(add):
    # a (1, C) bias, either operand order, alpha; the weight stored as (in, out)
    ctx = PassContext(False, _bn_values(w=(5, 3), b=(1, 3)))
    check(f"""graph(%x: float32[4, 5]) {{
      var %w: float32[5, 3]
      var %b: float32[1, 3]
      var %gamma: float32[3]
      var %beta: float32[3]
      var %rm: float32[3]
      var %rv: float32[3]
      %1: float32[4, 3] = matmul(%x, %w)
      %2: float32[4, 3] = {add}
      %3: float32[4, 3], %4: float32[3], %5: float32[3] = batch_norm(%2, %gamma, %beta, %rm, \
%rv) {{training=False, eps=1e-05}}
      return (%3)
    }}""", """graph(%x: float32[4, 5]) {
      var %_folded.0: float32[5, 3]
      var %_folded.1: float32[3]
      %6: float32[4, 3] = matmul(%x, %_folded.0)
      %7: float32[4, 3] = add(%6, %_folded.1) {alpha=1}
      return (%7)
    }""", [bnfold], ctx)


BN_NOT_FOLDED = {
    "training graph": (True, CONV_BN),
    "batch statistics": (False, CONV_BN.replace("training=False", "training=True")),
    "conv output used twice": (False, CONV_BN.replace("return (%4)", "return (%4, %0)")),
    "statistics used": (False, CONV_BN.replace("return (%4)", "return (%4, %2)")),
    "running stats assigned": (False, CONV_BN.replace("return (%4)",
                                                      "return (%4)\n  assign %rm = %2")),
    "not a conv": (False, CONV_BN.replace(
        "%0: float32[2, 3, 4, 4] = conv(%x, %w, %b) {stride=(1, 1), pads=((1, 1), (1, 1)), "
        "dilation=(1, 1), groups=1}", "%0: float32[2, 3, 4, 4] = relu(%x)").replace(
        "%x: float32[2, 2, 4, 4]", "%x: float32[2, 3, 4, 4]")),
}


@pytest.mark.parametrize("case", list(BN_NOT_FOLDED))
def test_bnfold_leaves_what_it_must(case):
    training, before = BN_NOT_FOLDED[case]
    ctx = PassContext(training, _bn_values(w=(3, 2, 3, 3), b=(3,)))
    g = Graph.parse(before)
    text = str(g)
    assert not bnfold.run(g, ctx)
    assert str(g) == text and not any(k.startswith("_folded") for k in ctx.values)


def test_bnfold_unknown_weight_is_left():
    ctx = PassContext(False, _bn_values(b=(3,)))   # no value for %w
    g = Graph.parse(CONV_BN)
    assert not bnfold.run(g, ctx)


# ---- models: folded graph == eager == PyTorch ------------------------------------------

def _build(L):
    m = L.nn.Module()
    m.conv1 = L.nn.Conv2d(3, 4, 3, padding=1)
    m.bn1 = L.nn.BatchNorm2d(4)
    m.conv2 = L.nn.Conv2d(4, 6, 3, stride=2, groups=2, bias=False)
    m.bn2 = L.nn.BatchNorm2d(6, affine=False, eps=1e-3)
    m.fc = L.nn.Linear(6 * 2 * 2, 5)
    m.bn3 = L.nn.BatchNorm1d(5)
    m.fc2 = L.nn.Linear(5, 3, bias=False)
    m.bn4 = L.nn.BatchNorm1d(3)
    return m


def _forward(m, x):
    x = m.bn1(m.conv1(x)).relu()
    x = m.bn2(m.conv2(x)).relu()
    x = m.bn3(m.fc(x.flatten(1)))
    return m.bn4(m.fc2(x))


def test_bnfold_model_matches_eager_and_pytorch():
    import torch

    ours = _build(tessera)
    state = {}
    for name, t in list(ours.named_parameters()) + list(ours.named_buffers()):
        if name.endswith("num_batches_tracked"):
            continue
        a = RNG.standard_normal(tuple(t.shape)).astype(np.float32)
        if name.endswith("running_var"):
            a = RNG.uniform(0.5, 2.0, tuple(t.shape)).astype(np.float32)
        state[name] = a
        with tessera.no_grad():
            t.copy_(tessera.tensor(a))
    ours.eval()
    ref = _build(torch)
    ref.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=False)
    ref.eval()

    named = dict(list(ours.named_parameters()) + list(ours.named_buffers()))
    x = tessera.tensor(RNG.standard_normal((2, 3, 5, 5)).astype(np.float32))
    g, _ = trace(lambda inp: _forward(ours, inp), x, names={id(t): n for n, t in named.items()})
    g0 = Graph.parse(str(g))
    ctx = PassContext(training=False, values=dict(named))
    assert bnfold.run(g, ctx)
    g.verify()
    dce.run(g, ctx)
    g.verify()
    assert "batch_norm" not in {n.op.name for n in g.nodes}
    assert sorted(n.op.name for n in g.nodes) == sorted(
        ["conv", "relu", "conv", "relu", "view", "matmul", "add", "matmul", "add"])
    (got,), _ = interpret(g, [x], {k: ctx.values[k] for k in g.variables})
    (before,), _ = interpret(g0, [x], {k: ctx.values[k] for k in g0.variables})
    eager = _forward(ours, x).detach()
    with torch.no_grad():
        want = _forward(ref, torch.tensor(x.numpy())).numpy()
    np.testing.assert_allclose(before.numpy(), eager.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got.numpy(), eager.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
    # the compiled executor reads the folded variables the same way
    (arr,), _ = Executor(g).run([x.numpy()], {k: ctx.values[k].detach().numpy()
                                             for k in g.variables})
    np.testing.assert_allclose(arr, got.numpy(), rtol=1e-6, atol=1e-6)


def test_bnfold_model_in_training_graph_is_left():
    ours = _build(tessera)
    named = dict(list(ours.named_parameters()) + list(ours.named_buffers()))
    ours.eval()
    x = tessera.randn(2, 3, 5, 5)
    g, _ = trace(lambda inp: _forward(ours, inp), x, names={id(t): n for n, t in named.items()})
    text = str(g)
    ctx = PassContext(training=True, values=dict(named))
    for p in (constfold, bnfold):
        assert not p.run(g, ctx)
    assert str(g) == text


def test_pipeline_of_all_three():
    ours = _build(tessera).eval()
    named = dict(list(ours.named_parameters()) + list(ours.named_buffers()))
    x = tessera.randn(2, 3, 5, 5)

    def f(inp):
        y = _forward(ours, inp * 1)
        return y * tessera.arange(3.0).exp() + tessera.zeros(3)

    g, _ = trace(f, x, names={id(t): n for n, t in named.items()})
    ctx = PassContext(training=False, values=dict(named))
    from tessera.graph.passes import run_pipeline
    run_pipeline(g, ["dce", "algebraic", "dce", "cse", "constfold", "bnfold", "dce"],
                 training=False, values=ctx.values)
    g.verify()
    ops = [n.op.name for n in g.nodes]
    assert "batch_norm" not in ops and "arange" not in ops and ops.count("mul") == 1
    (got,), _ = interpret(g, [x], ctx.values)
    np.testing.assert_allclose(got.numpy(), f(x).detach().numpy(), rtol=1e-4, atol=1e-5)
