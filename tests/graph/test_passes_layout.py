"""The layout pass: reshapes that must copy get an explicit clone written into the arena."""
from __future__ import annotations

import numpy as np
import torch

import tessera
from tessera.graph.ir import Graph
from tessera.graph.passes import layout


def _ops(g):
    return [n.op.name for n in g.nodes]


def test_a_view_that_can_stay_a_view_is_left_alone():
    g = Graph.parse('''graph(%x: float32[4, 6, 8]) {
      %0: float32[6, 4, 8] = permute(%x) {dims=(1, 0, 2)}
      %1: float32[6, 4, 2, 4] = view(%0) {shape=(6, 4, 2, 4)}
      %2: float32[6, 32] = view(%1) {shape=(6, 32)}
      return (%2)
    }''')
    # the first view splits the contiguous last dim; the second merges across the permute
    assert layout.run(g, None)
    assert _ops(g) == ["permute", "view", "clone", "view"]


def test_unknown_layouts_are_left_alone():
    # a diagonal's strides are not followed: its views are not guessed at
    g = Graph.parse('''graph(%x: float32[4, 6, 6]) {
      %0: float32[4, 6] = diagonal(%x) {offset=0, dim1=1, dim2=2}
      %1: float32[24] = view(%0) {shape=(24,)}
      return (%1)
    }''')
    before = str(g)
    assert not layout.run(g, None)
    assert str(g) == before


def _mha_graph(x):
    tessera.manual_seed(0)
    mha = tessera.nn.MultiheadAttention(32, 4, batch_first=True)

    class Attn(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def build(self, x):
            return self.mha(x, x, x, need_weights=False)[0]
    return mha, Attn()


def test_attention_graph_makes_no_copies_in_reshapes_and_matches_pytorch():
    x = np.random.default_rng(0).standard_normal((3, 10, 32)).astype(np.float32)
    mha, g = _mha_graph(x)
    y = g(tessera.tensor(x))
    ref = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    ref.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in mha.state_dict().items()})
    with torch.no_grad():
        want = ref(*(torch.from_numpy(x),) * 3, need_weights=False)[0]
    np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    ex = g._cache[g._last_key].executor
    assert any(st[6].op.name == "clone" and st[7] is not None for st in ex.steps)
    # every view left in the step is a view at run time
    copied = []
    steps = []
    for st in ex.steps:
        fn, node = st[0], st[6]
        if node.op.name == "view":
            def check(*a, _fn=fn, **k):
                r = _fn(*a, **k)
                if not np.shares_memory(r, a[0]):
                    copied.append(a[0].shape)
                return r
            st = (check,) + st[1:]
        steps.append(st)
    ex.steps = steps
    np.testing.assert_allclose(g(tessera.tensor(x)).numpy(), want.numpy(), rtol=1e-5,
                               atol=1e-5)
    assert not copied


def test_non_contiguous_inputs_stay_right():
    # the pass assumes contiguous inputs; a transposed one must still give the right answer
    class Flat(tessera.nn.Graph):
        def build(self, x):
            return x.permute(1, 0, 2).reshape(6, -1) * 2
    x = np.random.default_rng(1).standard_normal((4, 3, 5)).astype(np.float32)
    g = Flat()
    want = np.transpose(x, (1, 0, 2)).reshape(3, -1)
    for arg in (x, np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)):
        y = g(tessera.tensor(arg) if arg.flags.c_contiguous else tessera.from_numpy(arg))
        np.testing.assert_allclose(y.numpy(), (want * 2).reshape(6, -1))
