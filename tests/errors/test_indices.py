"""Index errors: out-of-range integers and index tensors, too many indices, bad keys."""
from __future__ import annotations

import pytest

from tests.errors._check import raises_like_torch


def _set(x, key, value):
    x[key] = value
    return x


CASES = [
    ("int-out-of-range", lambda L: L.ones(3)[5], ("5", "0", "3")),
    ("negative-out-of-range", lambda L: L.ones(3)[-4], ("-4", "3")),
    ("second-dim-out-of-range", lambda L: L.ones(2, 3)[0, 3], ("3", "1")),
    ("too-many-indices", lambda L: L.ones(2, 3)[0, 0, 0], ("too many indices", "2")),
    ("too-many-indices-0d", lambda L: L.tensor(1.0)[0], ("0",)),
    ("index-tensor-out-of-range", lambda L: L.ones(3)[L.tensor([0, 5])], ("5", "3")),
    ("index-tensor-negative-out", lambda L: L.ones(3)[L.tensor([-4])], ("-4", "3")),
    ("index-tensor-2nd-dim", lambda L: L.ones(2, 3)[:, L.tensor([3])], ("3",)),
    ("float-index", lambda L: L.ones(3)[1.5], ()),
    ("str-index", lambda L: L.ones(3)["a"], ()),
    ("mask-shape", lambda L: L.ones(3)[L.tensor([True, False])], ("[2]", "[3]")),
    ("advanced-broadcast", lambda L: L.ones(3, 3)[L.tensor([0, 1]), L.tensor([0, 1, 2])],
     ("broadcast", "2", "3")),
    ("setitem-out-of-range", lambda L: _set(L.ones(3), 3, 1.0), ("3",)),
    ("setitem-tensor-out-of-range", lambda L: _set(L.ones(3), L.tensor([4]), 1.0), ("4",)),
    ("setitem-value-shape", lambda L: _set(L.ones(2, 3), 0, L.ones(2)), ("3", "2")),
    ("setitem-str-value", lambda L: _set(L.ones(3), 0, "a"), ()),
    ("select-index", lambda L: L.ones(2, 3).select(1, 3), ("select", "3")),
    ("narrow-length", lambda L: L.ones(2, 3).narrow(1, 2, 2), ("narrow",)),
    ("narrow-start", lambda L: L.ones(2, 3).narrow(1, 4, 0), ("narrow", "4")),
    ("index_select-out-of-range", lambda L: L.ones(3).index_select(0, L.tensor([3])),
     ("index_select", "3")),
    ("gather-out-of-range", lambda L: L.ones(2, 3).gather(1, L.tensor([[0], [3]])),
     ("gather", "3")),
    ("scatter-out-of-range", lambda L: L.zeros(3).scatter(0, L.tensor([3]), 1.0),
     ("scatter", "3")),
    ("index_add-out-of-range", lambda L: L.zeros(3).index_add(0, L.tensor([3]), L.ones(1)),
     ("index_add",)),
    ("take-out-of-range", lambda L: L.ones(2, 2).take(L.tensor([4])), ("take", "4")),
    ("index_put-out-of-range", lambda L: L.ones(3).index_put((L.tensor([3]),), L.tensor(1.0)),
     ("3",)),
    ("embedding-like-index", lambda L: L.ones(4, 2)[L.tensor([[0, 4]])], ("4",)),
]


@pytest.mark.parametrize("fn,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_index_errors(fn, needles):
    raises_like_torch(fn, *needles)
