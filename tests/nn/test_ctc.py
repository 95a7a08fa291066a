"""``nn.CTCLoss`` against PyTorch: a small acoustic-model head (Linear + log_softmax) trained
with CTC, compared on the loss and on the gradients of the input and of every parameter; the
module's options, repr and errors. The op itself is in the op-info table
(tests/opinfo/nn_ctc.py).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tests.nn.test_attention_transformer import DTYPES, compare, raises_like_torch

T, N, F_IN, C = 12, 4, 5, 6
TARGETS = np.array([[1, 2, 2, 5], [3, 4, 0, 0], [5, 5, 5, 0], [1, 0, 0, 0]], np.int64)
IN_LENS, TG_LENS = [12, 10, 7, 3], [4, 2, 3, 1]


class _Head:
    """``make(L)``: Linear + log_softmax + CTCLoss, as a module of either library."""

    def __init__(self, **ctc_kw):
        self.ctc_kw = ctc_kw

    def __call__(self, L):
        kw = self.ctc_kw

        class Head(L.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = L.nn.Linear(F_IN, C)
                self.ctc = L.nn.CTCLoss(**kw)

            def forward(self, x, targets, il, tl):
                return self.ctc(self.proj(x).log_softmax(-1), targets, il, tl)
        return Head()


CASES = [
    ("mean", {}, "padded", "lists"),
    ("sum_blank", {"reduction": "sum", "blank": 5}, "padded", "tensors"),
    ("none_concat", {"reduction": "none"}, "concat", "lists"),
    ("zero_infinity", {"zero_infinity": True}, "padded_short", "tensors"),
    ("zero_infinity_none", {"zero_infinity": True, "reduction": "none"}, "padded_short",
     "lists"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name,kw,targets,lengths", CASES, ids=[c[0] for c in CASES])
def test_ctc_loss_module_matches_torch(name, kw, targets, lengths, dtype):
    rng = np.random.default_rng(3)
    arrays = {"x": rng.standard_normal((T, N, F_IN))}
    in_lens = [12, 10, 2, 3] if targets == "padded_short" else IN_LENS  # 2 < 3 labels: inf
    tg = TARGETS if targets != "concat" else np.concatenate(
        [row[:n] for row, n in zip(TARGETS, TG_LENS)])
    if kw.get("blank") == 5:
        tg = np.where(tg == 5, 0, tg)

    def fwd(m, L_, T_):
        lens = (in_lens, TG_LENS) if lengths == "lists" else \
            (L_.tensor(in_lens), L_.tensor(TG_LENS))
        return m(T_("x"), L_.tensor(tg), *lens)
    compare(_Head(**kw), fwd, arrays, dtype)


def test_impossible_alignment_gives_inf_loss_and_nan_grads_like_torch():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((T, N, C))
    res = {}
    for L_ in (torch, tessera):
        lp = L_.tensor(x).log_softmax(-1).detach().requires_grad_(True)
        loss = L_.nn.functional.ctc_loss(lp, L_.tensor(TARGETS), [12, 1, 7, 3], TG_LENS,
                                         reduction="none")
        loss.sum().backward()
        res[L_] = loss.detach().numpy(), lp.grad.numpy()
    for a, b in zip(res[tessera], res[torch]):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True)
    assert np.isinf(res[tessera][0][1]) and np.isnan(res[tessera][1][:1, 1]).all()


def test_double_backward_raises_like_torch():
    for L_ in (torch, tessera):
        lp = L_.randn(4, 1, 3, dtype=L_.float64).log_softmax(-1).detach().requires_grad_(True)
        loss = L_.nn.functional.ctc_loss(lp, L_.tensor([[1, 2]]), [4], [2])
        (g,) = L_.autograd.grad(loss, lp, create_graph=True)
        with pytest.raises(RuntimeError):
            g.sum().backward()


def test_repr_and_attributes():
    for kw in ({}, {"blank": 2, "reduction": "sum", "zero_infinity": True}):
        p, t = torch.nn.CTCLoss(**kw), tessera.nn.CTCLoss(**kw)
        assert repr(t) == repr(p)
        assert (t.blank, t.reduction, t.zero_infinity) == (p.blank, p.reduction,
                                                            p.zero_infinity)


@pytest.mark.parametrize("fn", [
    lambda L_: L_.nn.CTCLoss(blank=6)(L_.randn(4, 2, 6).log_softmax(-1),
                                      L_.tensor([[1], [2]]), [4, 4], [1, 1]),
    lambda L_: L_.nn.CTCLoss()(L_.randn(4, 2, 6).log_softmax(-1), L_.tensor([[1], [2]]),
                               [4, 5], [1, 1]),
    lambda L_: L_.nn.CTCLoss()(L_.randn(4, 2, 6).log_softmax(-1), L_.tensor([[1], [2]]),
                               [4, 4], [1, 2]),
    lambda L_: L_.nn.CTCLoss(reduction="avg")(L_.randn(4, 2, 6).log_softmax(-1),
                                              L_.tensor([[1], [2]]), [4, 4], [1, 1]),
    lambda L_: L_.nn.CTCLoss()(L_.randn(4, 2, 6).log_softmax(-1), L_.tensor([[1], [2]]),
                               L_.tensor([4.0, 4.0]), L_.tensor([1, 1])),
    lambda L_: L_.nn.CTCLoss()(L_.randn(4, 2, 6).half(), L_.tensor([[1], [2]]), [4, 4],
                               [1, 1]),
])
def test_errors_match_torch(fn):
    raises_like_torch(fn)
