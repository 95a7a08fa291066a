"""The memory plan and the compiled executor: buffers never overlap while alive, in-place
reuse happens where it is safe, planned execution equals unplanned execution and the
reference interpreter, and the fusion pass groups elementwise chains."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera import nn
from tessera.graph import Graph, interpret, trace
from tessera.graph.executor import Executor, compile_kernel, out_form
from tessera.graph.memory import _buffer_ends, _roots, plan_memory
from tessera.graph.passes import fuse, run_pipeline


def _models():
    tessera.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                        nn.Linear(32, 4))
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    enc = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return {"mlp": (mlp, tessera.randn(8, 16)), "cnn": (cnn, tessera.randn(2, 1, 8, 8)),
            "encoder": (enc, tessera.randn(2, 5, 16))}


def _train_graph(model, x):
    names = {id(p): n for n, p in model.named_parameters()}
    names.update({id(b): n for n, b in model.named_buffers()})

    def step(x):
        loss = (model(x) ** 2).mean()
        loss.backward()
        return (loss,) + tuple(p.grad for p in model.parameters())
    saved = [p.grad for p in model.parameters()]
    g, _ = trace(step, x, names=names)
    for p, s in zip(model.parameters(), saved):
        p.grad = s
    values = dict(model.named_parameters())
    values.update(dict(model.named_buffers()))
    return g, values


@pytest.fixture(params=["mlp", "cnn", "encoder"])
def traced(request):
    model, x = _models()[request.param]
    g, values = _train_graph(model, x)
    run_pipeline(g, training=True, values=values)
    return g, x, values


def _executor_out_nodes(g):
    return {i for i, n in enumerate(g.nodes) if out_form(n, *compile_kernel(n)) is not None}


def test_live_buffers_never_overlap(traced):
    g, _, _ = traced
    plan = plan_memory(g, _executor_out_nodes(g))
    root = _roots(g)
    end = _buffer_ends(g, root)
    spans = {}  # offset interval -> lifetime, per planned value
    for i, n in enumerate(g.nodes):
        for v in n.outputs:
            if id(v) in plan.offsets:
                spans[id(v)] = (plan.offsets[id(v)], plan.offsets[id(v)] + v.nbytes, i,
                                end.get(id(v), i))
    items = list(spans.items())
    inplace_pairs = set()
    for i, k in plan.inplace.items():
        inplace_pairs.add((id(g.nodes[i].inputs[k]), id(g.nodes[i].outputs[0])))
    for a in range(len(items)):
        for b in range(a + 1, len(items)):
            (ka, (lo1, hi1, s1, e1)), (kb, (lo2, hi2, s2, e2)) = items[a], items[b]
            if lo1 < hi2 and lo2 < hi1 and s1 < e2 and s2 < e1:
                # sharing is allowed only along an in-place chain
                assert (ka, kb) in inplace_pairs or (kb, ka) in inplace_pairs or \
                    _same_chain(plan, g, ka, kb)
    assert plan.arena_bytes <= plan.planned_bytes + 64 * len(spans)
    assert plan.arena_bytes < plan.naive_bytes


def _same_chain(plan, g, ka, kb):
    # follow in-place links backwards from each value to its chain's first buffer
    link = {id(g.nodes[i].outputs[0]): id(g.nodes[i].inputs[k]) for i, k in plan.inplace.items()}

    def head(v):
        while v in link:
            v = link[v]
        return v
    return head(ka) == head(kb)


def test_planned_execution_equals_unplanned_and_interpreter(traced):
    g, x, values = traced
    arrays = {k: v.detach().numpy().copy() for k, v in values.items()}
    ref, _ = interpret(g, [x], {k: tessera.tensor(v) for k, v in arrays.items()})
    for plan in (True, False):
        ex = Executor(g, plan=plan)
        for _ in range(2):  # a second run reuses the arena
            outs, _ = ex.run([x.numpy()], {k: v.copy() for k, v in arrays.items()})
            for o, r in zip(outs, ref):
                np.testing.assert_allclose(o, r.numpy(), rtol=1e-5, atol=1e-6)


def test_inplace_reuse_happens_on_elementwise_chains():
    g = Graph.parse("""graph(%x: float32[1024]) {
  %0: float32[1024] = exp(%x)
  %1: float32[1024] = neg(%0)
  %2: float32[1024] = mul(%1, 2.0) {}
  %3: float32[1024] = add(%2, %x) {alpha=1}
  return (%3)
}""")
    plan = plan_memory(g, {0, 1, 2, 3})
    # the returned %3 is allocated by its kernel: an arena buffer would have to be copied out
    assert plan.inplace == {1: 0, 2: 0}
    assert 3 not in plan.inplace and id(g.outputs[0]) not in plan.offsets
    assert plan.arena_bytes == 4096
    out, _ = Executor(g).run([np.ones(1024, np.float32)], {})
    np.testing.assert_allclose(out[0], -2 * np.e + 1, rtol=1e-6)


def test_no_inplace_for_kernels_that_read_around_their_outputs():
    attrs = "{stride=(1, 1), pads=((1, 1), (1, 1)), dilation=(1, 1), groups=1}"
    g = Graph.parse(f"""graph(%x: float32[1, 4, 6, 6], %w: float32[4, 4, 3, 3]) {{
  %0: float32[1, 4, 6, 6] = relu(%x)
  %1: float32[1, 4, 6, 6] = conv(%0, %w, None) {attrs}
  %2: float32[1, 4, 6, 6] = neg(%1)
  %3: float32[1, 4, 6, 6] = relu(%2)
  return (%3)
}}""")
    assert plan_memory(g, {0, 1, 2, 3}).inplace == {1: 0, 2: 0}  # the conv could take %0's
    assert plan_memory(g, {0, 1, 2, 3}, frozenset({1})).inplace == {2: 0}
    ex = Executor(g)
    assert 1 not in ex.plan.inplace  # conv_into says it reads windows around its outputs
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 4, 6, 6), np.float32), rng.standard_normal((4, 4, 3, 3),
                                                                              np.float32)
    out, _ = ex.run([x, w], {})
    want = torch.relu(-torch.nn.functional.conv2d(torch.relu(torch.from_numpy(x)),
                                                  torch.from_numpy(w), padding=1))
    np.testing.assert_allclose(out[0], want.numpy(), rtol=1e-4, atol=1e-5)


def test_no_inplace_into_a_buffer_a_view_still_reads():
    g = Graph.parse("""graph(%x: float32[4, 4]) {
  %0: float32[4, 4] = exp(%x)
  %1: float32[4, 4] = permute(%0) {dims=(1, 0)}
  %2: float32[4, 4] = neg(%0)
  %3: float32[4, 4] = add(%2, %1) {alpha=1}
  return (%3)
}""")
    plan = plan_memory(g, {0, 2, 3})
    assert 2 not in plan.inplace  # %0 is still read through the view %1 at node 3
    x = np.arange(16, dtype=np.float32).reshape(4, 4) / 10
    out, _ = Executor(g).run([x], {})
    np.testing.assert_allclose(out[0], -np.exp(x) + np.exp(x).T, rtol=1e-6)


def test_new_variable_values_are_written_in_place_only_when_safe():
    g = Graph.parse("""graph(%g: float32[8]) {
  var %w: float32[8]
  var %v: float32[8]
  %0: float32[8] = mul(%g, 0.1) {}
  %1: float32[8] = sub(%w, %0) {alpha=1}
  %2: float32[8] = add(%v, 1.0) {alpha=1}
  %3: float32[8] = mul(%v, %2) {}
  return (%2)
  assign %w = %1
  assign %v = %3
}""")
    plan = plan_memory(g, {0, 1, 2, 3})
    assert plan.into_var == {1: "w", 3: "v"}
    w, v = np.ones(8, np.float32), np.full(8, 2.0, np.float32)
    outs, assigns = Executor(g).run([np.ones(8, np.float32)], {"w": w, "v": v})
    assert dict(assigns)["w"] is w and np.allclose(w, 0.9)
    assert np.allclose(dict(assigns)["v"], 6.0) and np.allclose(outs[0], 3.0)


def test_fusion_groups_elementwise_chains_and_round_trips():
    before = """graph(%x: float32[8], %y: float32[8]) {
  %0: float32[8] = exp(%x)
  %1: float32[8] = mul(%0, %y) {}
  %2: float32[8] = relu(%1)
  %3: float32[] = sum(%2) {dim=None, keepdim=False, dtype=None}
  %4: float32[8] = neg(%y)
  return (%3, %4)
}"""
    expected = """graph(%x: float32[8], %y: float32[8]) {
  %0: float32[8] = exp(%x) [region=0]
  %1: float32[8] = mul(%0, %y) [region=0]
  %2: float32[8] = relu(%1) [region=0]
  %3: float32[] = sum(%2) {dim=None, keepdim=False, dtype=None} [region=0]
  %4: float32[8] = neg(%y)
  return (%3, %4)
}"""
    g = Graph.parse(before)
    assert fuse.run(g, None)
    assert str(g) == expected
    assert Graph.parse(str(g)) == g
    g.verify()


def test_fusion_stops_at_multi_use_and_shape_changes():
    g = Graph.parse("""graph(%x: float32[8], %b: float32[4, 8]) {
  %0: float32[8] = exp(%x)
  %1: float32[8] = neg(%0)
  %2: float32[8] = add(%0, %1) {alpha=1}
  %3: float32[4, 8] = mul(%2, %b) {}
  return (%3)
}""")
    fuse.run(g, None)
    regions = [n.notes.get("region") for n in g.nodes]
    assert regions[0] is None or regions[0] != regions[1] or regions.count(regions[0]) == 3
    assert regions[3] is None or regions[3] != regions[2]  # shape changes at %3


def test_memory_stats_report_the_plan():
    model, x = _models()["mlp"]
    opt = tessera.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x):
            loss = (self.model(x) ** 2).mean()
            loss.backward()
            return loss
    g = G()
    g(x)
    g(x)
    st = g.memory_stats()
    assert 0 < st["arena_bytes"] <= 0.6 * st["intermediate_bytes_naive"]
    assert st["variable_bytes"] >= sum(p.numel() * 4 for p in model.parameters())
    assert st["written_into_variables"] >= len(list(model.parameters()))


def test_graph_results_are_fresh_arrays_and_never_alias_the_next_step():
    import tessera

    class Step(tessera.nn.Graph):
        def build(self, x):
            return (x * 2).exp() + 1, x  # a computed result, and the input itself

    g, x = Step(), tessera.ones(8)
    y1, same = g(x)
    y2, _ = g(x * 0)
    # the first result is not overwritten by the second step (no shared arena buffer) ...
    np.testing.assert_allclose(y1.numpy(), np.exp(2) + 1, rtol=1e-6)
    np.testing.assert_allclose(y2.numpy(), 2.0, rtol=1e-6)
    # ... and a returned input is a copy, as eager's results never alias a graph's input
    same.add_(1)
    np.testing.assert_allclose(x.numpy(), 1.0)
