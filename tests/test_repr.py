"""``repr(tensor)`` equals PyTorch's with ``torch.`` spelled ``tessera.``.

Autograd node names are compared by kind only (``grad_fn=<...>``): tessera names nodes after
its own ops, so ``x * 2`` may be ``MulBackward0`` in both but a composite can differ.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tessera


def _lib_tensor(L, data, dtype=None):
    arr = np.asarray(data)
    t = L.tensor(arr)
    if dtype is not None:
        t = t.to(getattr(L, dtype))
    return t


def _norm(text: str) -> str:
    return re.sub(r"grad_fn=<\w+>", "grad_fn=<...>", text.replace("torch.", "tessera."))


RNG = np.random.default_rng(0)
NORMAL = RNG.standard_normal((4, 5)).astype(np.float32)
NORMAL4D = RNG.standard_normal((2, 1, 2, 3)).astype(np.float32)

CASES = {
    "ints": lambda L: L.tensor([1, 2, 3]),
    "negative-ints": lambda L: L.tensor([-1, 20, -300]),
    "int-matrix": lambda L: L.tensor([[1, -2], [30, 4]]),
    "int32": lambda L: L.tensor([1, 2], dtype=L.int32),
    "int8": lambda L: L.tensor([-1, 2], dtype=L.int8),
    "uint8": lambda L: L.tensor([1, 255], dtype=L.uint8),
    "int16-0d": lambda L: L.tensor(7, dtype=L.int16),
    "bool": lambda L: L.tensor([True, False, True]),
    "bool-0d": lambda L: L.tensor(False),
    "bool-matrix": lambda L: L.tensor([[True], [False]]),
    "floats": lambda L: L.tensor([1.5, 2.25, -3.125]),
    "int-valued-floats": lambda L: L.tensor([1.0, 2.0, -3.0]),
    "zeros": lambda L: L.zeros(3),
    "neg-zero": lambda L: L.tensor([-0.0, 1.0]),
    "zeros-2d": lambda L: L.zeros(2, 2),
    "ones-float64": lambda L: L.ones(2, dtype=L.float64),
    "float64": lambda L: L.tensor([0.1, 0.2], dtype=L.float64),
    "float16": lambda L: L.tensor([0.1, 2.5], dtype=L.float16),
    "bfloat16": lambda L: L.tensor([0.1, 2.5], dtype=L.bfloat16),
    "float16-ints": lambda L: L.tensor([1.0, 2.0], dtype=L.float16),
    "small": lambda L: L.tensor([1e-5, 1.0]),
    "tiny": lambda L: L.tensor([1e-20, 3e-20]),
    "large": lambda L: L.tensor([1e9, 1.0]),
    "large-int-valued": lambda L: L.tensor([1e10, 2e10]),
    "wide-range-int-valued": lambda L: L.tensor([1.0, 2000.0]),
    "ratio-1000": lambda L: L.tensor([1.0, 1000.0]),
    "ratio-1001": lambda L: L.tensor([1.0, 1001.0]),
    "mixed-magnitudes": lambda L: L.tensor([0.001, 123.456]),
    "nan-inf": lambda L: L.tensor([float("nan"), float("inf"), -float("inf"), 1.5]),
    "nan-int-valued": lambda L: L.tensor([float("nan"), 2.0]),
    "only-nan": lambda L: L.tensor([float("nan")]),
    "inf-sci": lambda L: L.tensor([float("inf"), 1e-7]),
    "0d-float": lambda L: L.tensor(3.25),
    "0d-int-valued": lambda L: L.tensor(3.0),
    "0d-int": lambda L: L.tensor(-5),
    "0d-float64": lambda L: L.tensor(1.0, dtype=L.float64),
    "0d-nan": lambda L: L.tensor(float("nan")),
    "empty": lambda L: L.tensor([]),
    "empty-int": lambda L: L.tensor([], dtype=L.int64),
    "empty-2d": lambda L: L.zeros(0, 3),
    "empty-3d-int": lambda L: L.zeros(2, 0, 1, dtype=L.int32),
    "empty-float64": lambda L: L.zeros(0, dtype=L.float64),
    "empty-bool": lambda L: L.zeros(0, dtype=L.bool),
    "randn-2d": lambda L: L.tensor(NORMAL),
    "randn-3d": lambda L: L.tensor(NORMAL.reshape(2, 5, 2)),
    "randn-4d": lambda L: L.tensor(NORMAL4D),
    "3d-ints": lambda L: L.arange(24).reshape(2, 3, 4),
    "transposed": lambda L: L.arange(6.0).reshape(2, 3).t(),
    "long-row-wraps": lambda L: L.arange(40.0) / 3,
    "long-int-row-wraps": lambda L: L.arange(100),
    "long-int64-row": lambda L: L.arange(30) * 1000000007,
    "summarised-1d": lambda L: L.arange(2000),
    "summarised-1d-float": lambda L: L.arange(2000.0) / 7,
    "summarised-2d": lambda L: L.arange(3000.0).reshape(50, 60),
    "summarised-2d-narrow": lambda L: L.arange(1010).reshape(1010, 1),
    "summarised-2d-wide": lambda L: L.arange(1010).reshape(1, 1010),
    "summarised-3d": lambda L: L.arange(2 * 20 * 30).reshape(2, 20, 30),
    "summarised-3d-tall": lambda L: L.arange(10 * 11 * 12).reshape(10, 11, 12) * 0.5,
    "summarised-edge-format": lambda L: L.cat([L.full((500,), 1e-6), L.ones(3),
                                              L.full((500,), 2.0)])
    if hasattr(L, "cat") else L.tensor([1e-6] * 500 + [1.0] * 3 + [2.0] * 500),
    "exactly-1000": lambda L: L.arange(1000),
    "requires-grad": lambda L: L.tensor([1.0, 2.0], requires_grad=True),
    "requires-grad-0d": lambda L: L.tensor(1.0, requires_grad=True),
    "requires-grad-float64": lambda L: L.ones(2, dtype=L.float64, requires_grad=True),
    "grad-fn-mul": lambda L: L.tensor([1.0, 2.0], requires_grad=True) * 2,
    "grad-fn-sum": lambda L: L.tensor([1.0, 2.0], requires_grad=True).sum(),
    "grad-fn-view": lambda L: L.ones(2, 2, requires_grad=True).view(4),
    "grad-fn-float64": lambda L: L.ones(2, requires_grad=True).double() * 2,
    "grad-fn-empty": lambda L: L.ones(0, 2, requires_grad=True) + 1,
    "grad-fn-long-line": lambda L: (L.arange(12.0).reshape(2, 6) / 7).requires_grad_() * 3,
    "long-suffix-wraps": lambda L: (L.arange(7.0) / 3).to(L.float16).requires_grad_() * 1,
    "detached": lambda L: (L.ones(2, requires_grad=True) * 2).detach(),
    "complex": lambda L: L.tensor([1 + 2j, -3.5 - 0.25j]),
    "complex-int-valued": lambda L: L.tensor([1 + 2j, 3 - 1j]),
    "complex128": lambda L: L.tensor([1 + 2j], dtype=L.complex128),
    "complex-0d": lambda L: L.tensor(1.5 - 2j),
    "neg-int-float": lambda L: L.tensor([[-1.0, 10.0], [100.0, -1000.0]]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_repr_matches_torch(name):
    make = CASES[name]
    ref = repr(make(torch))
    ours = repr(make(tessera))
    assert _norm(ours) == _norm(ref), f"\n--- tessera\n{ours}\n--- torch\n{ref}"
    assert str(make(tessera)) == ours


def test_grad_fn_names_are_backward_nodes():
    x = tessera.tensor([1.0, 2.0], requires_grad=True)
    assert "grad_fn=<MulBackward0>" in repr(x * 2)
    assert "grad_fn=<SumBackward0>" in repr(x.sum())
    assert re.search(r"grad_fn=<\w+Backward\d>", repr(x.exp()))


def test_repr_default_dtype_float64():
    tessera.set_default_dtype(tessera.float64)
    torch.set_default_dtype(torch.float64)
    try:
        for make in (lambda L: L.tensor([1.5, 2.0]), lambda L: L.tensor([1.0], dtype=L.float32),
                     lambda L: L.zeros(0), lambda L: L.zeros(0, dtype=L.float32),
                     lambda L: L.tensor([1j])):
            assert _norm(repr(make(tessera))) == _norm(repr(make(torch)))
    finally:
        tessera.set_default_dtype(tessera.float32)
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("make", [
    lambda L: L.zeros(2, 3, device="meta"), lambda L: L.zeros(2, dtype=L.int64, device="meta"),
    lambda L: L.ones((), device="meta"), lambda L: L.ones(2, device="meta", requires_grad=True),
    lambda L: L.zeros(0, device="meta"),
], ids=["float", "int64", "0d", "requires-grad", "empty"])
def test_repr_meta(make):
    assert _norm(repr(make(tessera))) == _norm(repr(make(torch)))


def test_format_of_tensors():
    for make in (lambda L: L.tensor(2.5), lambda L: L.tensor(3), lambda L: L.tensor(True)):
        assert f"{make(tessera)}" == f"{make(torch)}"
        assert f"{make(tessera):>8}" == f"{make(torch):>8}"
    assert f"{tessera.tensor([1.0, 2.0])}" == f"{torch.tensor([1.0, 2.0])}"


def test_set_printoptions():
    try:
        for kw in ({"precision": 2}, {"threshold": 5}, {"edgeitems": 1, "threshold": 5},
                   {"linewidth": 30}, {"sci_mode": True}, {"sci_mode": False},
                   {"profile": "full"}, {"profile": "short"}):
            tessera.set_printoptions(**kw)
            torch.set_printoptions(**kw)
            for make in (lambda L: L.arange(20.0) / 3, lambda L: L.tensor([1e-6, 1.0]),
                         lambda L: L.arange(2000).reshape(40, 50)):
                assert _norm(repr(make(tessera))) == _norm(repr(make(torch))), kw
    finally:
        tessera.set_printoptions(profile="default", sci_mode=None)
        torch.set_printoptions(profile="default", sci_mode=None)
