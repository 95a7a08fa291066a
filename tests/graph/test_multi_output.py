"""Multi-output fusion: a region's values read outside it (saved for the backward, returned,
assigned) are outputs of its one kernel. Each case is checked against the same graph with
multi-output fusion off, the NumPy executor, PyTorch, and eager training."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera.graph import Graph
from tessera.graph.executor import Executor
from tessera.graph.passes import fuse, run_pipeline
from tessera.kernels import cc

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")


def _compile(text: str, multi: bool = True) -> Graph:
    g = Graph.parse(text)
    saved = fuse.MULTI_OUTPUT
    fuse.MULTI_OUTPUT = multi
    try:
        run_pipeline(g, codegen=True)
    finally:
        fuse.MULTI_OUTPUT = saved
    return g


def _fused(g: Graph) -> list:
    return [n for n in g.nodes if n.op.name == "fused"]


def _run(g: Graph, arrays: list, variables: dict | None = None, codegen: bool = True):
    variables = {k: v.copy() for k, v in (variables or {}).items()}
    outs, assigns = Executor(g, codegen=codegen).run(list(arrays), variables)
    return [np.array(o) for o in outs], {k: np.array(v) for k, v in assigns}


TWO = '''graph(%x: float32[64, 33], %y: float32[33]) {
  %0: float32[64, 33] = add(%x, %y) {alpha=1}
  %1: float32[64, 33] = exp(%0)
  %2: float32[64, 33] = mul(%1, %x)
  %3: float32[64, 33] = tanh(%2)
  %4: float32[64, 33] = sin(%1)
  return (%3, %4)
}'''


def test_two_outputs_one_kernel():
    """exp(x + y) feeds the chain and a node after it: one kernel writes both the chain's
    result and exp(x + y); without multi-output fusion that takes two."""
    text = TWO
    g = _compile(text)
    (node,) = _fused(g)
    assert len(node.outputs) == 2
    assert len(_fused(_compile(text, multi=False))) == 2
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 33)).astype(np.float32)
    y = rng.standard_normal(33).astype(np.float32)
    got, _ = _run(g, [x, y])
    ref = torch.exp(torch.from_numpy(x) + torch.from_numpy(y))
    np.testing.assert_allclose(got[0], torch.tanh(ref * torch.from_numpy(x)).numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], torch.sin(ref).numpy(), rtol=1e-5, atol=1e-6)
    # the generated kernel equals the fused op's reference (its body run node by node)
    want, _ = _run(g, [x, y], codegen=False)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_output_also_read_inside_and_returned():
    """A value read inside its region, returned by the step and read by a later node."""
    text = '''graph(%x: float32[7, 5]) {
  %0: float32[7, 5] = sigmoid(%x)
  %1: float32[7, 5] = mul(%0, %x)
  %2: float32[7, 5] = add(%1, %0) {alpha=1}
  %3: float32[7, 5] = relu(%0)
  return (%2, %0, %3)
}'''
    g = _compile(text)
    (node, *rest) = _fused(g)
    assert len(node.outputs) == 2 and g.outputs[1] in node.outputs
    x = np.random.default_rng(1).standard_normal((7, 5)).astype(np.float32)
    got, _ = _run(g, [x])
    s = torch.sigmoid(torch.from_numpy(x))
    for a, b in zip(got, (s * torch.from_numpy(x) + s, s, torch.relu(s))):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-5)


def test_three_outputs_written_into_their_variables():
    """An Adam-like update: the new moments are assigned and read by the parameter's update,
    so the three new values come from one kernel, each written straight into its variable's
    array by the memory plan."""
    text = '''graph(%g: float32[300]) {
  var %p: float32[300]
  var %m: float32[300]
  var %v: float32[300]
  %0: float32[300] = lerp(%m, %g, 0.1)
  %1: float32[300] = mul(%v, 0.999)
  %2: float32[300] = addcmul(%1, %g, %g) {value=0.001}
  %3: float32[300] = sqrt(%2)
  %4: float32[300] = add(%3, 1e-08) {alpha=1}
  %5: float32[300] = div(%0, %4) {rounding_mode=None}
  %6: float32[300] = sub(%p, %5) {alpha=0.01}
  return ()
  assign %p = %6
  assign %m = %0
  assign %v = %2
}'''
    g = _compile(text)
    (node,) = _fused(g)
    assert len(node.outputs) == 3
    assert len(_fused(_compile(text, multi=False))) == 3
    ex = Executor(g)
    assert sorted(ex.plan.value_var.values()) == ["m", "p", "v"]
    rng = np.random.default_rng(2)
    grad = rng.standard_normal(300).astype(np.float32)
    state = {"p": rng.standard_normal(300).astype(np.float32),
             "m": rng.standard_normal(300).astype(np.float32),
             "v": rng.random(300).astype(np.float32)}
    arrays = {k: a.copy() for k, a in state.items()}
    _, assigns = ex.run([grad], arrays)
    assert all(a is arrays[k] for k, a in assigns)   # written in place, no copy back
    p, m, v = (torch.from_numpy(state[k]) for k in ("p", "m", "v"))
    gt = torch.from_numpy(grad)
    m2 = torch.lerp(m, gt, 0.1)
    v2 = torch.addcmul(v * 0.999, gt, gt, value=0.001)
    p2 = p - 0.01 * m2 / (v2.sqrt() + 1e-8)
    for k, want in (("p", p2), ("m", m2), ("v", v2)):
        np.testing.assert_allclose(arrays[k], want.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)


def test_row_statistics_are_outputs():
    """Layer norm's forward as one row-wise kernel that also writes the centred input and
    1 / std (reductions and values of the row's shape) for the backward."""
    rng = np.random.default_rng(3)
    x = tessera.from_numpy(rng.standard_normal((6, 9, 40)).astype(np.float32))
    w = tessera.from_numpy(rng.standard_normal(40).astype(np.float32))
    b = tessera.from_numpy(rng.standard_normal(40).astype(np.float32))
    for t in (x, w, b):
        t.requires_grad_()

    def step(x, w, b):
        y = tessera.nn.functional.layer_norm(x + 1, (40,), w, b)
        return (y, *tessera.autograd.grad((y * y).sum(), [x, w, b]))
    g, _ = tessera.graph.trace(step, x, w, b)
    run_pipeline(g, codegen=True)
    forward = [n for n in _fused(g) if any(len(v.shape) == 3 and v.shape[-1] == 1
                                           for v in n.outputs)]
    assert forward and len(forward[0].outputs) >= 3   # y, a row statistic, a saved value
    xt, wt, bt = (torch.from_numpy(t.detach().numpy()).requires_grad_() for t in (x, w, b))
    yt = torch.nn.functional.layer_norm(xt + 1, (40,), wt, bt)
    want = (yt, *torch.autograd.grad((yt * yt).sum(), [xt, wt, bt]))
    got, _ = _run(g, [x._data, w._data, b._data])
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_reduction_region_with_a_saved_value():
    """A region ending in a sum over the batch (a bias gradient) that also writes the
    product it sums, which a later node reads."""
    text = '''graph(%g: float32[32, 24], %h: float32[32, 24]) {
  %0: float32[32, 24] = mul(%g, %h)
  %1: float32[32, 24] = tanh(%0)
  %2: float32[24] = sum(%1) {dim=(0,), keepdim=False, dtype=None}
  %3: float32[32, 24] = neg(%0)
  return (%2, %3)
}'''
    g = _compile(text)
    rng = np.random.default_rng(4)
    a, h = (rng.standard_normal((32, 24)).astype(np.float32) for _ in range(2))
    got, _ = _run(g, [a, h])
    want, _ = _run(_compile(text, multi=False), [a, h])
    for x, y in zip(got, want):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[0], np.tanh(a * h).sum(0), rtol=1e-5, atol=1e-5)


def test_planner_places_every_output():
    """Every output of a multi-output node the step does not return gets a planned buffer
    (the arena, a dying input's, or a variable's), none shared with another of them."""
    text = '''graph(%x: float32[128, 64], %y: float32[128, 64]) {
  %a: float32[128, 64] = add(%x, %y) {alpha=1}
  %b: float32[128, 64] = exp(%a)
  %c: float32[128, 64] = mul(%b, %a)
  %d: float32[128, 64] = tanh(%c)
  %e: float32[128, 64] = neg(%b)
  %f: float32[128, 64] = sin(%c)
  %g: float32[128, 64] = add(%e, %f) {alpha=1}
  %h: float32[128, 64] = mul(%g, %d)
  %t: float32[64, 128] = permute(%b) {dims=(1, 0)}
  %u: float32[64, 64] = matmul(%t, %c)
  %w: float32[64, 64] = matmul(%u, %u)
  return (%h, %w)
}'''
    g = _compile(text)
    multi = [n for n in _fused(g) if len(n.outputs) > 1]
    assert multi
    ex = Executor(g)
    plan = ex.plan
    for n in multi:
        i = g.nodes.index(n)
        places = [ex._place(v, lambda v: v) for v in n.outputs]
        returned = [any(v is o for o in g.outputs) for v in n.outputs]
        # a returned value leaves as a new array; the others are planned buffers
        assert all((kind == "new") == r for (kind, _), r in zip(places, returned)), places
        assert sum(kind == "arena" for kind, _ in places) >= 1
        arena = [w for kind, w in places if kind == "arena"]
        for p in range(len(arena)):
            for q in range(p + 1, len(arena)):
                assert not np.shares_memory(arena[p], arena[q])
        assert i not in plan.inplace and i not in plan.into_var
    rng = np.random.default_rng(5)
    x, y = (rng.standard_normal((128, 64)).astype(np.float32) for _ in range(2))
    got, _ = _run(g, [x, y])
    want, _ = _run(_compile(text, multi=False), [x, y])
    unplanned = Executor(g, plan=False).run([x, y], {})[0]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[0], unplanned[0], rtol=1e-5, atol=1e-5)


# ---- training trajectories: the graph with and without multi-output fusion, and eager ----

def _workload(name: str):
    nn, F = tessera.nn, tessera.nn.functional
    tessera.manual_seed(0)
    if name == "mlp":
        model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))
        x, y = tessera.randn(16, 20), tessera.randint(0, 5, (16,))
        opt = tessera.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        loss_fn = lambda out, y: F.cross_entropy(out, y)
    elif name == "cnn":
        model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
        x, y = tessera.randn(4, 1, 8, 8), tessera.randint(0, 3, (4,))
        opt = tessera.optim.Adam(model.parameters(), lr=1e-2)
        loss_fn = lambda out, y: F.cross_entropy(out, y)
    elif name == "transformer":
        model = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation="gelu",
                                           batch_first=True)
        x, y = tessera.randn(2, 8, 32), tessera.randn(2, 8, 32)
        opt = tessera.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = F.mse_loss
    else:
        model = tessera.models.gpt("gpt-mini", vocab_size=32, block_size=8)
        x, y = tessera.randint(0, 32, (2, 8)), tessera.randint(0, 32, (2, 8))
        opt = tessera.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = lambda out, y: F.cross_entropy(out[0].reshape(-1, out[0].shape[-1]),
                                                 y.reshape(-1))
    return model, opt, loss_fn, x, y


def _trajectory(name: str, graph: bool, steps: int = 10) -> list[float]:
    model, opt, loss_fn, x, y = _workload(name)
    if not graph:
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses + [p.detach().numpy().copy() for p in model.parameters()]

    class Train(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = loss_fn(self.model(x), y)
            loss.backward()
            return loss
    g = Train()
    losses = [g(x, y).item() for _ in range(steps)]
    return losses + [p.detach().numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "gpt"])
def test_training_equals_single_output_fusion_and_eager(name, monkeypatch):
    multi = _trajectory(name, graph=True)
    monkeypatch.setattr(fuse, "MULTI_OUTPUT", False)
    single = _trajectory(name, graph=True)
    eager = _trajectory(name, graph=False)
    for a, b in zip(multi, single):   # the losses, then the trained parameters
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # against eager, the losses: Adam turns the rounding noise of a gradient that is zero in
    # exact arithmetic (attention's key bias) into whole steps of the learning rate
    np.testing.assert_allclose(multi[:10], eager[:10], rtol=1e-5)


SIDE = ('''graph(%g: float32[{m}, 640], %h: float32[{m}, 640], %b: float32[640], '''
        '''%w: float32[640, 16]) {{
  %0: float32[{m}, 640] = add(%h, %b) {{alpha=1}}
  %1: float32[{m}, 640] = gelu_backward(%g, %0) {{approximate='none'}}
  %2: float32[640] = sum(%1) {{dim=(0,), keepdim=False, dtype=None}}
  %3: float32[{m}, 640] = mul(%g, %h)
  %4: float32[1, 640] = sum(%3) {{dim=(0,), keepdim=True, dtype=None}}
  %5: float32[{m}, 16] = matmul(%1, %w)
  return (%5, %2, %4)
}}''')


@pytest.mark.parametrize("rows", [8, 512])
@pytest.mark.parametrize("threads", [1, 2])
def test_column_sums_are_side_sums_of_a_training_region(rows, threads):
    """In a training step a bias gradient's sum over the rows (and another column sum of
    values the region reads) is accumulated by the region's kernel: one kernel, every chunk
    of its split loop with partial sums of its own, equal to NumPy's sums."""
    text = SIDE.format(m=rows)
    g = Graph.parse(text)
    run_pipeline(g, codegen=True, training=True)
    fused = _fused(g)
    assert len(fused) == 1 and len(fused[0].outputs) == 3
    assert "sum" not in [n.op.name for n in g.nodes]
    rng = np.random.default_rng(6)
    gr, h = (rng.standard_normal((rows, 640)).astype(np.float32) for _ in range(2))
    b = rng.standard_normal(640).astype(np.float32)
    w = rng.standard_normal((640, 16)).astype(np.float32)
    saved = tessera.get_num_threads()
    tessera.set_num_threads(threads)
    try:
        got, _ = _run(g, [gr, h, b, w])
    finally:
        tessera.set_num_threads(saved)
    gt, ht = torch.from_numpy(gr), torch.from_numpy(h)
    d = torch.ops.aten.gelu_backward(gt, ht + torch.from_numpy(b))
    np.testing.assert_allclose(got[1], d.sum(0).numpy(), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got[2], (gt * ht).sum(0, keepdim=True).numpy(), rtol=1e-5,
                               atol=1e-4)
    np.testing.assert_allclose(got[0], (d @ torch.from_numpy(w)).numpy(), rtol=1e-4, atol=1e-3)
    plain = Graph.parse(text)
    run_pipeline(plain, codegen=True)   # (no side sums outside training)
    assert "sum" in [n.op.name for n in plain.nodes]
