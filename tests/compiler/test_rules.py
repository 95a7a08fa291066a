"""Backend rules the op-info graphs do not reach: each graph, compiled whole by the backend
(``strict=True``), must equal eager tessera."""
from __future__ import annotations

import numpy as np
import pytest

import tessera
from tests.compiler.test_models import BACKENDS


class _Fn(tessera.nn.Graph):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def build(self, *ts):
        return self.fn(*ts)


def _extrema(t):
    a, b = t.max(1), t.min(0, keepdim=True)
    return a.values, a.indices, b.values, b.indices


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_min_along_a_dim_first_index_and_nan(backend):
    nan = float("nan")
    x = tessera.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, nan, 5.0, nan], [-1.0, -1.0, -2.0, 7.0]])
    g = _Fn(_extrema)
    g.config.set_backend(backend, strict=True)
    for got, want in zip(g(x), _extrema(x)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def _conv_grads(conv, **kw):
    def fn(x, w, cot):
        y = conv(x, w, **kw)
        return (y,) + tuple(tessera.autograd.grad([y], [x, w], [cot]))
    return fn


CONVS = {
    "grouped 2-d": (tessera.nn.functional.conv2d, (2, 4, 9, 8), (6, 2, 3, 3),
                    dict(stride=2, padding=1, groups=2)),
    "dilated 1-d": (tessera.nn.functional.conv1d, (2, 3, 11), (4, 3, 3),
                    dict(stride=2, padding=2, dilation=2)),
    "transposed grouped 3-d": (tessera.nn.functional.conv_transpose3d, (1, 4, 3, 4, 3),
                               (4, 3, 2, 3, 2), dict(stride=2, padding=1, groups=2)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CONVS))
def test_convolution_and_its_gradients(backend, case):
    conv, xs, ws, kw = CONVS[case]
    rng = np.random.default_rng(0)
    x, w = (tessera.from_numpy(rng.standard_normal(s).astype(np.float32)).requires_grad_()
            for s in (xs, ws))
    fn = _conv_grads(conv, **kw)
    with tessera.no_grad():
        shape = tuple(conv(x, w, **kw).shape)
    cot = tessera.from_numpy(rng.standard_normal(shape).astype(np.float32))
    want = fn(x, w, cot)
    g = _Fn(fn)
    g.config.set_backend(backend, strict=True)
    for got, ref in zip(g(x, w, cot), want):
        np.testing.assert_allclose(got.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
