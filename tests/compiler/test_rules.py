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


def _order_stats(x):
    nm, md, mo, kv = x.nanmedian(1), x.median(1), x.mode(1), x.kthvalue(2, 1)
    return (nm.values, nm.indices, md.values, md.indices, mo.values, mo.indices, kv.values,
            kv.indices, x.nanmedian(), x.median())


@pytest.mark.parametrize("backend", BACKENDS)
def test_order_statistics_with_nan_and_ties(backend):
    """All-NaN rows (the index libstdc++'s selection leaves), NaN among numbers, ties."""
    nan = float("nan")
    x = tessera.tensor([[nan, nan, nan, nan, nan], [3.0, nan, 1.0, 3.0, 1.0],
                        [2.0, 2.0, 5.0, 5.0, 0.0], [1.0, 4.0, 4.0, 1.0, 4.0]])
    g = _Fn(_order_stats)
    g.config.set_backend(backend, strict=True)
    for got, want in zip(g(x), _order_stats(x)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def _int_ops(a, b, v, seq):
    return (a << b, a >> b, ~a, tessera.nn.functional.one_hot(v, 6),
            tessera.searchsorted(seq, v.float()), tessera.searchsorted(seq, v.float(), right=True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_shifts_one_hot_and_searchsorted(backend):
    """Shifts by negative amounts and past the bit width, one_hot with its class count
    given, searchsorted with ties and NaN."""
    a = tessera.tensor([-8, 5, 1, -1, 7, 3], dtype=tessera.int32)
    b = tessera.tensor([1, 40, -2, 31, 0, 32], dtype=tessera.int32)
    v = tessera.tensor([0, 2, 5, 2, 1, 3])
    seq = tessera.tensor([0.0, 1.0, 2.0, 2.0, 3.0, float("nan")])
    g = _Fn(_int_ops)
    g.config.set_backend(backend, strict=True)
    for got, want in zip(g(a, b, v, seq), _int_ops(a, b, v, seq)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def _repeat(x, r):
    return (x.repeat_interleave(r, 1, output_size=7), x.repeat_interleave(r, 1, output_size=7)
            .sum())


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeat_interleave_with_output_size(backend):
    """A count of zero, and the gradient (the repeats summed back)."""
    x = tessera.randn(2, 4).requires_grad_()
    r = tessera.tensor([2, 0, 3, 2])

    def fn(x, r):
        y, total = _repeat(x, r)
        return (y,) + tuple(tessera.autograd.grad([total], [x]))
    want = fn(x, r)
    g = _Fn(fn)
    g.config.set_backend(backend)
    for got, ref in zip(g(x, r), want):
        np.testing.assert_allclose(got.numpy(), ref.detach().numpy(), rtol=1e-6)


def _fused_attention(q, k, v, mask, cot, causal, gqa):
    from tessera.ops.attention import fused_attention
    k2, v2 = (k, v) if gqa else (k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    y = fused_attention(q, k2, v2, None if causal else mask, scale=0.35, is_causal=causal,
                        enable_gqa=gqa)
    return (y,) + tuple(tessera.autograd.grad([y], [q, k, v], [cot]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal,gqa", [(False, False), (True, True)])
def test_fused_attention_and_its_backward(backend, causal, gqa):
    """The fused op (other backends trace attention's composite, so only a direct call
    reaches it): a boolean mask with a row that allows nothing, causal, grouped queries."""
    rng = np.random.default_rng(0)
    q, k, v = (tessera.from_numpy(rng.standard_normal(s).astype(np.float32)).requires_grad_()
               for s in ((2, 4, 5, 8), (2, 2, 6, 8), (2, 2, 6, 8)))
    mask = tessera.from_numpy(rng.random((5, 6)) > 0.3)
    mask[1] = False
    cot = tessera.from_numpy(rng.standard_normal((2, 4, 5, 8)).astype(np.float32))
    want = _fused_attention(q, k, v, mask, cot, causal, gqa)
    g = _Fn(lambda *a: _fused_attention(*a, causal, gqa))
    g.config.set_backend(backend, strict=True)
    for got, ref in zip(g(q, k, v, mask, cot), want):
        np.testing.assert_allclose(got.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-5)
