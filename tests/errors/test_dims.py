"""Dimension errors: out-of-range dims, wrong numbers of dims, repeated dims."""
from __future__ import annotations

import pytest

from tests.errors._check import raises_like_torch

RANGE = "Dimension out of range"

CASES = [
    ("sum-dim", lambda L: L.ones(2, 3).sum(2), ("sum", RANGE, "[-2, 1]", "2")),
    ("sum-neg-dim", lambda L: L.ones(2, 3).sum(-3), ("sum", "[-2, 1]", "-3")),
    ("sum-tuple-dim", lambda L: L.ones(2, 3).sum((0, 5)), ("sum", "5")),
    ("sum-repeated-dim", lambda L: L.ones(2, 3).sum((0, 0)), ("sum", "0", "multiple")),
    ("sum-repeated-neg-dim", lambda L: L.ones(2, 3).sum((1, -1)), ("sum", "multiple")),
    ("mean-dim", lambda L: L.ones(2).mean(1), ("mean", "[-1, 0]")),
    ("size-dim", lambda L: L.ones(2, 3).size(2), (RANGE, "2")),
    ("stride-dim", lambda L: L.ones(2, 3).stride(-3), (RANGE, "-3")),
    ("transpose-dim", lambda L: L.ones(2, 3).transpose(0, 2), ("transpose", "2")),
    ("unsqueeze-dim", lambda L: L.ones(2, 3).unsqueeze(3), ("unsqueeze", "[-3, 2]", "3")),
    ("squeeze-dim", lambda L: L.ones(2, 3).squeeze(2), ("squeeze", "2")),
    ("permute-too-many", lambda L: L.ones(2, 3).permute(0, 1, 2), ("permute", "2", "3")),
    ("permute-too-few", lambda L: L.ones(2, 3, 4).permute(0, 1), ("permute", "3", "2")),
    ("permute-repeated", lambda L: L.ones(2, 3).permute(0, 0), ("permute", "repeated")),
    ("permute-out-of-range", lambda L: L.ones(2, 3).permute(0, 2), ("permute", "2")),
    ("flatten-order", lambda L: L.ones(2, 3, 4).flatten(2, 1), ("flatten",)),
    ("flatten-dim", lambda L: L.ones(2, 3).flatten(0, 3), ("flatten", "3")),
    ("movedim-dim", lambda L: L.ones(2, 3).movedim(0, 2), ("movedim", "2")),
    ("movedim-repeated", lambda L: L.ones(2, 3, 4).movedim((0, 0), (1, 2)), ("movedim",)),
    ("narrow-dim", lambda L: L.ones(2, 3).narrow(2, 0, 1), ("narrow", "2")),
    ("select-dim", lambda L: L.ones(2, 3).select(2, 0), ("select", "2")),
    ("diagonal-same-dims", lambda L: L.ones(2, 3).diagonal(0, 0, 0), ("diagonal", "0")),
    ("cat-dim", lambda L: L.cat([L.ones(2), L.ones(2)], dim=1), ("cat", "1")),
    ("stack-dim", lambda L: L.stack([L.ones(2), L.ones(2)], dim=3), ("stack", "3")),
    ("softmax-dim", lambda L: L.ones(2, 3).softmax(2), ("softmax", "2")),
    ("cumsum-dim", lambda L: L.ones(2, 3).cumsum(-3), ("cumsum", "-3")),
    ("argmax-dim", lambda L: L.ones(2, 3).argmax(2), ("argmax", "2")),
    ("max-dim", lambda L: L.ones(2, 3).max(dim=4), ("max", "4")),
    ("gather-dim", lambda L: L.ones(2, 3).gather(2, L.zeros(2, 3, dtype=L.int64)),
     ("gather", "2")),
    ("index_select-dim", lambda L: L.ones(2, 3).index_select(2, L.tensor([0])),
     ("index_select", "2")),
    ("flip-dim", lambda L: L.ones(2, 3).flip(2), ("flip", "2")),
    ("roll-dim", lambda L: L.ones(2, 3).roll(1, 2), ("roll", "2")),
    ("unbind-dim", lambda L: L.ones(2, 3).unbind(2), ("unbind", "2")),
    ("split-dim", lambda L: L.ones(2, 3).split(1, dim=2), ("split", "2")),
    ("chunk-dim", lambda L: L.ones(2, 3).chunk(2, dim=5), ("chunk", "5")),
    ("sort-dim", lambda L: L.ones(2, 3).sort(dim=2), ("sort", "2")),
    ("topk-dim", lambda L: L.ones(2, 3).topk(1, dim=3), ("topk", "3")),
    ("unfold-dim", lambda L: L.ones(2, 3).unfold(2, 1, 1), ("unfold", "2")),
    ("dim-float", lambda L: L.ones(2, 3).sum(1.0), ("sum", "float")),
    ("dim-str", lambda L: L.ones(2, 3).transpose("a", 1), ("transpose",)),
    ("0d-dim-1", lambda L: L.tensor(1.0).sum(1), ("sum", "[-1, 0]", "1")),
    ("t-3d", lambda L: L.ones(2, 3, 4).t(), ("t", "3")),
    ("mT-1d", lambda L: L.ones(3).mT, ("mT", "1-D")),
]


@pytest.mark.parametrize("fn,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_dim_errors(fn, needles):
    raises_like_torch(fn, *needles)
