"""What ``nn.Graph.build`` may return: tensors, and tuples, lists, dicts and namedtuples of
them, rebuilt in the same structure as eager returns it (PyTorch is the oracle)."""
from __future__ import annotations

import numpy as np
import torch

import tessera
from tessera import nn


class _Build(nn.Graph):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def build(self, x):
        return self.fn(x)


def test_namedtuple_results_keep_their_type_and_fields():
    a = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    for name in ("max", "min", "topk"):
        args = (3,) if name == "topk" else (1,)
        got = _Build(lambda x, n=name, a_=args: getattr(x, n)(*a_))(tessera.from_numpy(a))
        want = getattr(torch.from_numpy(a), name)(*args)
        assert isinstance(got, tuple) and len(got) == len(want) == 2
        np.testing.assert_allclose(got.values.numpy(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())


def test_nested_tuples_lists_and_dicts_round_trip():
    x = tessera.arange(6.0).reshape(2, 3)
    got = _Build(lambda t: {"a": (t + 1, [t * 2]), "b": t.sum()})(x)
    assert set(got) == {"a", "b"} and isinstance(got["a"], tuple) and isinstance(got["a"][1], list)
    np.testing.assert_allclose(got["a"][1][0].numpy(), (x * 2).numpy())
    assert float(got["b"]) == 15.0
