"""Dtype errors: integer-only or float-only ops, casts in place, index and mask dtypes."""
from __future__ import annotations

import pytest

from tests.errors._check import raises_like_torch

# a dtype may be named PyTorch's way ("Long") or tessera's ("int64")
LONG, INT, FLOAT, DOUBLE, BOOL = ("Long", "int64"), ("Int", "int32"), ("Float", "float32"), \
    ("Double", "float64", "double"), ("Bool", "bool")

CASES = [
    ("mean-int", lambda L: L.arange(4).mean(), ("mean", LONG)),
    ("mean-bool", lambda L: L.ones(2, dtype=L.bool).mean(), ("mean", BOOL)),
    ("mean-dtype-int", lambda L: L.ones(2).mean(dtype=L.int64), ("mean", LONG)),
    ("float-index-tensor", lambda L: L.ones(3)[L.tensor([0.0, 1.0])], (FLOAT,)),
    ("float-index-select", lambda L: L.index_select(L.ones(3), 0, L.tensor([0.0])),
     ("index_select",)),
    ("bitwise-and-float", lambda L: L.ones(2) & L.ones(2), ("bitwise_and", FLOAT)),
    ("bitwise-not-float", lambda L: ~L.ones(2), (("bitwise_not", "~"), FLOAT)),
    ("shift-float", lambda L: L.ones(2) << 1, (FLOAT,)),
    ("requires-grad-int", lambda L: L.ones(2, dtype=L.int64).requires_grad_(), (LONG,)),
    ("requires-grad-int-factory", lambda L: L.zeros(2, dtype=L.int32, requires_grad=True),
     (INT,)),
    ("add_-float-into-int", lambda L: L.ones(2, dtype=L.int64).add_(1.5),
     ("add", FLOAT, LONG)),
    ("mul_-float-tensor-into-int", lambda L: L.ones(2, dtype=L.int32).mul_(L.ones(2)),
     ("mul", FLOAT, INT)),
    ("div_-into-int", lambda L: L.ones(2, dtype=L.int64).div_(2), ("div", LONG)),
    ("sub-bools", lambda L: L.ones(2, dtype=L.bool) - L.ones(2, dtype=L.bool),
     (("sub", "Subtraction"), BOOL)),
    ("neg-bool", lambda L: -L.ones(2, dtype=L.bool), ("neg", BOOL)),
    ("where-float-condition", lambda L: L.where(L.ones(2), L.ones(2), L.zeros(2)),
     ("where", FLOAT)),
    ("masked_fill-float-mask", lambda L: L.ones(2).masked_fill(L.ones(2), 0.0),
     ("masked_fill", FLOAT + ("float",))),
    ("masked_fill-tensor-value-dims", lambda L: L.ones(2).masked_fill(L.ones(2) > 0, L.ones(2)),
     ("masked_fill", "1")),
    ("remainder-int-zero", lambda L: L.tensor([1, 2]) % 0, ("ZeroDivisionError",)),
    ("floor-divide-int-zero", lambda L: L.tensor([1, 2]) // L.tensor([1, 0]),
     ("ZeroDivisionError",)),
    ("div-floor-int-zero", lambda L: L.div(L.tensor([3]), 0, rounding_mode="floor"),
     ("ZeroDivisionError",)),
    ("set-default-int", lambda L: L.set_default_dtype(L.int64), ("int64",)),
    ("backward-int-output", lambda L: L.ones(2, requires_grad=True).long().sum().backward(),
     ()),
    ("relu-bool", lambda L: L.relu(L.ones(2, dtype=L.bool)), ("relu", BOOL)),
    ("lerp-mixed-dtypes", lambda L: L.lerp(L.ones(2), L.ones(2, dtype=L.float64), 0.5),
     ("lerp", FLOAT, DOUBLE)),
    ("pow-int-negative-exponent", lambda L: L.tensor([2]) ** -1, ("Integers", "negative")),
    ("matmul-mixed-dtypes", lambda L: L.ones(2, 2) @ L.ones(2, 2, dtype=L.float64),
     ("matmul", ("Float", "float"), DOUBLE)),
    ("index-bool-wrong-shape", lambda L: L.ones(3, 2)[L.tensor([True, False])],
     ("2", "[3, 2]")),
    ("scatter-index-float", lambda L: L.zeros(3).scatter(0, L.tensor([0.0]), 1.0),
     ("scatter",)),
    ("cumsum-bad-dtype-arg", lambda L: L.cumsum(L.ones(2), 0, dtype="x"), ()),
    ("arange-bool", lambda L: L.arange(3, dtype=L.bool), ("arange",)),
    ("sort-complex", lambda L: L.sort(L.tensor([1j, 2j])), ("sort",)),
]


@pytest.mark.parametrize("fn,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_dtype_errors(fn, needles):
    raises_like_torch(fn, *needles)
