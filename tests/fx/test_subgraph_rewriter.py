"""replace_pattern against torch.fx's on the same module: the same matches, the same
rewritten code (in tessera's names), the same values."""
from __future__ import annotations

import torch
import torch.fx

import tessera
import tessera.fx


def _case(T):
    class M(T.nn.Module):
        def forward(self, x, w1, w2):
            m1 = T.cat([w1, w2]).sum()
            m2 = T.cat([w1, w2]).sum()
            return x + T.relu(m1) + T.relu(m2)

    def pattern(w1, w2):
        return T.cat([w1, w2]).sum()

    def replacement(w1, w2):
        return T.stack([w1, w2]).mean()
    return M(), pattern, replacement


def _summary(matches):
    return [(m.anchor.name, {p.name: g.name for p, g in m.nodes_map.items()}) for m in matches]


def test_two_op_pattern_matches_and_rewrites_like_torch():
    tm, tp, tr = _case(torch)
    sm, sp, sr = _case(tessera)
    tg, sg = torch.fx.symbolic_trace(tm), tessera.fx.symbolic_trace(sm)
    t_matches = torch.fx.replace_pattern(tg, tp, tr)
    s_matches = tessera.fx.replace_pattern(sg, sp, sr)
    assert _summary(s_matches) == _summary(t_matches)
    assert sg.code == tg.code.replace("torch.", "tessera.")
    x, w = tessera.ones(2), tessera.tensor([[1.0, -2.0], [3.0, 4.0]])
    expected = x + 2 * tessera.relu(tessera.stack([w, w]).mean())
    assert tessera.allclose(sg(x, w, w), expected)


def test_a_match_whose_inner_value_escapes_is_skipped():
    def f(x):
        r = tessera.relu(x)
        return tessera.neg(r) + r         # relu is used outside the pattern

    def pattern(a):
        return tessera.neg(tessera.relu(a))

    def replacement(a):
        return tessera.sigmoid(a)
    gm = tessera.fx.symbolic_trace(f)
    assert tessera.fx.replace_pattern(gm, pattern, replacement) == []
    tg = torch.fx.symbolic_trace(lambda x: torch.neg(torch.relu(x)) + torch.relu(x))
    assert torch.fx.replace_pattern(tg, lambda a: torch.neg(torch.relu(a)),
                                    lambda a: torch.sigmoid(a)) != []  # separate relus


def test_constants_must_match():
    gm = tessera.fx.symbolic_trace(lambda x: (x + 1) * (x + 2))
    matches = tessera.fx.replace_pattern(gm, lambda a: a + 2, lambda a: a - 2)
    assert len(matches) == 1
    assert gm(tessera.tensor([3.0])).tolist() == [4.0]
