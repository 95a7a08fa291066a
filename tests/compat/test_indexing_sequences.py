"""Indexing with Python ranges, lists, tuples and NumPy arrays, read and written, as
PyTorch 2.13 does it (including its rule that a short list holding a sequence, slice,
tensor, None or ... is a tuple of keys, with its deprecation warning)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tessera

KEYS = ["range(2)", "range(0, 3, 2)", "(0, range(2))", "(range(2), 1)", "[range(2)]",
        "[0, slice(None)]", "[[0, 1], [1, 0]]", "[[0, 1]]", "[None, 0]", "[0, None]",
        "[[True, False, True]]", "[True, False, True]", "[0, 1, Ellipsis]",
        "(Ellipsis, [0, 1])", "[[0], [1]]", "[0, [1, 2]]", "((0, 1),)", "(0, 1)",
        "[(0, 1), (1, 2)]", "[lib.tensor(0), 1]", "[1.0]", "[0, 1] * 20", "[]", "()",
        "np.array([0, 2])", "np.array(1)", "np.int64(1)", "np.array([1.5])",
        "(np.array([0, 1]), np.array([1, 2]))", "[np.int64(0), np.int64(2)]",
        "np.array([True, False, True])", "np.array([[0, 1], [1, 2]])",
        "(slice(None), np.array([True, False, True, False]))", "range(5)", "[5]"]


def _run(lib, key: str):
    x = lib.arange(12).view(3, 4)
    out = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            r = x[eval(key, {"lib": lib, "np": np})]
            out.append((tuple(r.shape), r.flatten().tolist()))
        except Exception as e:  # noqa: BLE001  (the exception type is the outcome)
            out.append(type(e).__name__)
        try:
            x[eval(key, {"lib": lib, "np": np})] = -1
            out.append(x.flatten().tolist())
        except Exception as e:  # noqa: BLE001
            out.append(type(e).__name__)
    out.append(sorted({str(w.message).partition(" (Triggered")[0] for w in caught}))
    return out


@pytest.mark.parametrize("key", KEYS)
def test_sequence_keys_match_torch(key):
    assert _run(tessera, key) == _run(torch, key)


def test_range_index_has_gradient():
    for lib in (torch, tessera):
        w = lib.arange(4.0, requires_grad=True)
        (w[range(1, 3)] * 2).sum().backward()
        assert w.grad.tolist() == [0.0, 2.0, 2.0, 0.0]
