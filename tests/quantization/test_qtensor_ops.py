"""Ops on a quantized tensor that keep it quantized, against PyTorch's quantized CPU
kernels (integers and qparams), and ``dequantize``/``is_quantized`` of a plain tensor."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tessera

_X = np.random.default_rng(0).normal(size=(2, 3, 5, 6)).astype(np.float32)


def _pair():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: quantized tensor creation is deprecated
        t = torch.quantize_per_tensor(torch.from_numpy(_X), 0.03, 60, torch.quint8)
    return t, tessera.quantize_per_tensor(tessera.from_numpy(_X), 0.03, 60, tessera.quint8)


@pytest.mark.parametrize("name, fn", [
    ("relu", lambda L, x: L.nn.functional.relu(x)),
    ("relu_method", lambda L, x: x.relu()),
    ("max_pool2d", lambda L, x: L.nn.functional.max_pool2d(x, 2, 2, 1)),
    ("adaptive_avg_pool2d", lambda L, x: L.nn.functional.adaptive_avg_pool2d(x, 1)),
    ("flatten", lambda L, x: x.flatten(1)),
    ("reshape", lambda L, x: x.reshape(6, -1)),
    ("view", lambda L, x: x.view(2, 90)),
])
def test_stays_quantized_as_in_torch(name, fn):
    t, o = _pair()
    want, got = fn(torch, t), fn(tessera, o)
    assert got.is_quantized and got.dtype is tessera.quint8
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_array_equal(got.int_repr().numpy(), want.int_repr().numpy())
    assert got.q_scale() == pytest.approx(want.q_scale()) and \
        got.q_zero_point() == want.q_zero_point()


def test_plain_tensor_dequantize_is_itself():
    x = tessera.ones(3)
    assert x.dequantize() is x and not x.is_quantized
    assert torch.ones(3).dequantize().is_quantized is False


def test_reshaping_a_per_channel_tensor_is_an_error():
    q = tessera.quantize_per_channel(tessera.ones(2, 3), tessera.tensor([0.1, 0.2]),
                                     tessera.tensor([0, 0]), 0, tessera.qint8)
    with pytest.raises(RuntimeError, match="per-channel"):
        q.flatten()
