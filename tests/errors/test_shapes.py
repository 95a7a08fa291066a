"""Shape errors: broadcasting, view/reshape sizes, expand, in-place outputs, joins."""
from __future__ import annotations

import pytest

from tests.errors._check import raises_like_torch

CASES = [
    ("add-broadcast", lambda L: L.ones(2, 3) + L.ones(2, 4), ("add", "3", "4")),
    ("mul-broadcast", lambda L: L.ones(5) * L.ones(3), ("mul", "5", "3")),
    ("sub-broadcast-3d", lambda L: L.sub(L.ones(2, 3, 4), L.ones(3, 3)), ("sub", "4", "3")),
    ("div-broadcast", lambda L: L.ones(2, 1) / L.ones(3, 2), ("div", "2", "3")),
    ("where-broadcast", lambda L: L.where(L.ones(3) > 0, L.ones(3), L.ones(4)),
     ("where", "3", "4")),
    ("maximum-broadcast", lambda L: L.maximum(L.ones(2), L.ones(3)), ("maximum",)),
    ("pow-broadcast", lambda L: L.ones(2) ** L.ones(3), ("pow",)),
    ("eq-broadcast", lambda L: L.ones(2) == L.ones(3), ("eq",)),
    ("view-bad-size", lambda L: L.ones(2, 3).view(4), ("view", "[4]", "6")),
    ("view-bad-size-2d", lambda L: L.ones(2, 3).view(4, 2), ("view", "[4, 2]", "6")),
    ("reshape-bad-size", lambda L: L.ones(2, 3).reshape(5, -1), ("reshape", "[5, -1]", "6")),
    ("reshape-two-minus-one", lambda L: L.ones(2, 3).reshape(-1, -1), ("reshape", "-1")),
    ("reshape-negative", lambda L: L.ones(6).reshape(-2, 3), ("reshape", "-2")),
    ("view-non-contiguous", lambda L: L.ones(2, 3).t().view(6), ("view", "stride")),
    ("expand-bad", lambda L: L.ones(2, 3).expand(4, 3), ("expand", "[4, 3]", "[2, 3]")),
    ("expand-fewer-dims", lambda L: L.ones(2, 3).expand(3), ("expand", "[3]")),
    ("expand-negative-new-dim", lambda L: L.ones(3).expand(-1, 3), ("expand", "-1")),
    ("add_-output-shape", lambda L: L.ones(3).add_(L.ones(2, 3)), ("add", "[3]", "[2, 3]")),
    ("mul_-output-shape", lambda L: L.ones(1, 3).mul_(L.ones(2, 3)), ("mul", "[1, 3]")),
    ("copy_-shape", lambda L: L.ones(3).copy_(L.ones(4)), ("copy", "4", "3")),
    ("masked_fill-mask-shape", lambda L: L.ones(3).masked_fill(L.ones(4) > 0, 0.0),
     ("masked_fill", "3", "4")),
    ("setitem-value-shape", lambda L: L.ones(3).__setitem__(slice(None), L.ones(4)),
     ("3", "4")),
    ("matmul-mismatch", lambda L: L.ones(2, 3) @ L.ones(4, 5), ("matmul", "2x3", "4x5")),
    ("matmul-0d", lambda L: L.matmul(L.ones(()), L.ones(3)), ("matmul", "0")),
    ("mm-1d", lambda L: L.mm(L.ones(3), L.ones(3, 2)), ("mm", "2D")),
    ("bmm-batch-mismatch", lambda L: L.bmm(L.ones(2, 3, 4), L.ones(3, 4, 5)), ("bmm",)),
    ("dot-sizes", lambda L: L.dot(L.ones(3), L.ones(4)), ("dot", "3", "4")),
    ("cat-shapes", lambda L: L.cat([L.ones(2, 3), L.ones(2, 4)]), ("cat", "3", "4")),
    ("cat-dims", lambda L: L.cat([L.ones(2, 3), L.ones(3)]), ("cat",)),
    ("cat-empty-list", lambda L: L.cat([]), ("cat",)),
    ("stack-shapes", lambda L: L.stack([L.ones(2), L.ones(3)]), ("stack", "[2]", "[3]")),
    ("split-sizes", lambda L: L.ones(5).split([2, 2]), ("split", "5")),
    ("unflatten-sizes", lambda L: L.ones(6).unflatten(0, (4, 2)), ("unflatten", "6")),
    ("gather-index-dims", lambda L: L.gather(L.ones(2, 3), 1, L.zeros(3, dtype=L.int64)),
     ("gather",)),
    ("index_put-shape", lambda L: L.ones(3).index_put_((L.tensor([0, 1]),), L.ones(3)),
     ("index_put",)),
    ("repeat-fewer-dims", lambda L: L.ones(2, 3).repeat(2), ("repeat",)),
    ("lerp-broadcast", lambda L: L.lerp(L.ones(2), L.ones(3), 0.5), ("lerp",)),
]


@pytest.mark.parametrize("fn,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_shape_errors(fn, needles):
    raises_like_torch(fn, *needles)
