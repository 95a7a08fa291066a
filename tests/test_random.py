"""Random numbers: reproducibility, generator state, distributions and argument errors.

The statistical bounds are many standard errors wide (a false failure is astronomically
unlikely) yet tight enough to catch a wrong distribution or parameter.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import tessera

N = 100_000


def _np(t):
    return t.detach().numpy()


# ---- reproducibility and generator state ---------------------------------------------

def _draws(gen=None):
    kw = {} if gen is None else {"generator": gen}
    x = tessera.zeros(5)
    return [tessera.rand(3, 4, **kw), tessera.randn(6, **kw), tessera.randint(0, 100, (7,), **kw),
            tessera.randperm(9, **kw), tessera.normal(0.0, 2.0, (4,), **kw),
            tessera.bernoulli(tessera.full((8,), 0.5), **kw),
            tessera.multinomial(tessera.ones(6), 3, **kw),
            tessera.poisson(tessera.full((5,), 3.0), **kw), x.uniform_(**kw).clone(),
            x.normal_(**kw).clone(), x.exponential_(**kw).clone()]


def _same(xs, ys):
    return all(np.array_equal(_np(a), _np(b)) for a, b in zip(xs, ys))


def test_manual_seed_reproduces():
    g = tessera.manual_seed(1234)
    assert g is tessera.default_generator
    a = _draws()
    tessera.manual_seed(1234)
    b = _draws()
    assert _same(a, b)
    tessera.manual_seed(1235)
    assert not _same(a, _draws())
    assert tessera.initial_seed() == 1235


def test_generator_reproduces_and_is_independent():
    g = tessera.Generator(device="cpu")
    assert g.manual_seed(7) is g and g.initial_seed() == 7
    a = _draws(g)
    tessera.rand(10)   # the default generator advancing must not disturb g
    b = _draws(tessera.Generator().manual_seed(7))
    assert _same(a, b)
    g1, g2 = tessera.Generator().manual_seed(1), tessera.Generator().manual_seed(1)
    x1 = tessera.rand(5, generator=g1)
    tessera.rand(100, generator=g2.manual_seed(2))  # other generators do not share state
    g2.manual_seed(1)
    assert np.array_equal(_np(x1), _np(tessera.rand(5, generator=g2)))
    assert not np.array_equal(_np(tessera.rand(5, generator=g1)), _np(x1))


def test_seed_and_negative_seed():
    g = tessera.Generator()
    s = g.seed()
    assert isinstance(s, int) and 0 <= s < 2 ** 64 and g.initial_seed() == s
    assert g.manual_seed(-1).initial_seed() == 2 ** 64 - 1  # kept as uint64 bits, as torch
    assert isinstance(tessera.seed(), int)


def test_state_round_trip():
    g = tessera.Generator().manual_seed(3)
    tessera.randn(17, generator=g)
    state = g.get_state()
    assert state.dtype is tessera.uint8 and state.dim() == 1
    a = _draws(g)
    g.set_state(state)
    assert _same(a, _draws(g))
    # a state moves between generators, and the global functions use the default one
    assert _same(a, _draws(tessera.Generator().set_state(state)))
    s = tessera.get_rng_state()
    x = tessera.rand(4)
    tessera.set_rng_state(s)
    assert np.array_equal(_np(x), _np(tessera.rand(4)))


def test_state_errors():
    g = tessera.Generator()
    with pytest.raises(TypeError):
        g.set_state(tessera.zeros(3))
    with pytest.raises(RuntimeError):
        g.set_state(tessera.zeros(3, dtype=tessera.uint8))
    with pytest.raises(RuntimeError):
        g.manual_seed(1.5)
    with pytest.raises(ValueError):
        g.manual_seed(2 ** 64)
    with pytest.raises(RuntimeError):
        tessera.Generator(device="meta")


def test_meta_device_draws_nothing():
    g = tessera.Generator().manual_seed(5)
    state = g.get_state()
    x = tessera.randn(3, 4, generator=g, device="meta")
    assert x.device.type == "meta" and tuple(x.shape) == (3, 4)
    y = tessera.empty(2, 2, device="meta").uniform_(generator=g)
    assert tuple(y.shape) == (2, 2)
    assert np.array_equal(_np(g.get_state()), _np(state))


def test_factory_keywords():
    x = tessera.rand(2, 3, dtype=tessera.float64, requires_grad=True)
    assert x.dtype is tessera.float64 and x.requires_grad and x.is_leaf
    assert tessera.rand(size=(2, 3)).shape == (2, 3)
    assert tessera.randint(5, (2,)).dtype is tessera.int64
    assert tessera.randint(0, 5, (2,), dtype=tessera.float32).dtype is tessera.float32
    assert tessera.randperm(4, dtype=tessera.float32).dtype is tessera.float32
    out = tessera.empty(3)
    assert tessera.rand(3, out=out) is out
    like = tessera.ones(2, 3, dtype=tessera.float64)
    assert tessera.rand_like(like).dtype is tessera.float64
    assert tessera.randint_like(like, 3, 6).dtype is tessera.float64
    assert tessera.rand(3, dtype=tessera.float16).dtype is tessera.float16


# ---- distributions -------------------------------------------------------------------

def test_randn_moments():
    tessera.manual_seed(0)
    for dt in (tessera.float32, tessera.float64):
        x = _np(tessera.randn(N, dtype=dt)).astype(np.float64)
        assert abs(x.mean()) < 5 / math.sqrt(N)                # se of the mean: 1/sqrt(N)
        assert abs(x.std() - 1) < 5 * math.sqrt(0.5 / N)       # se of the std: sqrt(1/2N)
        assert abs((x ** 3).mean()) < 5 * math.sqrt(15 / N)    # symmetric
        assert abs(np.mean(np.abs(x) < 1) - 0.6827) < 0.01


def test_rand_range_and_moments():
    tessera.manual_seed(1)
    for dt in (tessera.float32, tessera.float64, tessera.float16, tessera.bfloat16):
        x = _np(tessera.rand(N, dtype=dt).to(tessera.float64))
        assert x.min() >= 0 and x.max() < 1
        assert abs(x.mean() - 0.5) < 5 * math.sqrt(1 / 12 / N) + 2 ** -9
    x = _np(tessera.empty(N).uniform_(-2.0, 3.0)).astype(np.float64)
    assert x.min() >= -2 and x.max() < 3
    assert abs(x.mean() - 0.5) < 5 * 5 * math.sqrt(1 / 12 / N)
    counts = np.histogram(x, bins=10, range=(-2, 3))[0]
    assert np.all(np.abs(counts - N / 10) < 6 * math.sqrt(N / 10))


def test_normal_parameters():
    tessera.manual_seed(2)
    mean = tessera.tensor([-3.0, 0.0, 5.0]).reshape(3, 1).expand(3, N // 3)
    std = tessera.tensor([0.5, 1.0, 2.0]).reshape(3, 1).expand(3, N // 3)
    x = _np(tessera.normal(mean, std)).astype(np.float64)
    for i, (m, s) in enumerate([(-3, 0.5), (0, 1), (5, 2)]):
        assert abs(x[i].mean() - m) < 5 * s / math.sqrt(N // 3)
        assert abs(x[i].std() - s) < 5 * s * math.sqrt(0.5 / (N // 3))
    y = _np(tessera.empty(N).normal_(2.0, 3.0)).astype(np.float64)
    assert abs(y.mean() - 2) < 5 * 3 / math.sqrt(N) and abs(y.std() - 3) < 0.05
    z = _np(tessera.normal(1.0, 0.5, (N,))).astype(np.float64)
    assert abs(z.mean() - 1) < 5 * 0.5 / math.sqrt(N)


def test_randint_bounds_and_coverage():
    tessera.manual_seed(3)
    x = _np(tessera.randint(-3, 7, (N,)))
    assert x.min() == -3 and x.max() == 6
    counts = np.bincount(x + 3)
    assert len(counts) == 10 and np.all(np.abs(counts - N / 10) < 6 * math.sqrt(N / 10))
    y = _np(tessera.randint(10, (1000,), dtype=tessera.uint8))
    assert set(y.tolist()) == set(range(10))
    z = _np(tessera.zeros(N, dtype=tessera.int64).random_(2, 5))
    assert set(z.tolist()) == {2, 3, 4}
    u = _np(tessera.zeros(N, dtype=tessera.uint8).random_())
    assert u.min() == 0 and u.max() == 255
    f = _np(tessera.zeros(1000).random_(4))
    assert set(f.tolist()) == {0.0, 1.0, 2.0, 3.0}


def test_randperm_is_permutation():
    tessera.manual_seed(4)
    for n in (0, 1, 2, 17, 1000):
        p = _np(tessera.randperm(n))
        assert np.array_equal(np.sort(p), np.arange(n))
    firsts = [int(tessera.randperm(5)[0]) for _ in range(2000)]
    assert np.all(np.abs(np.bincount(firsts, minlength=5) - 400) < 6 * math.sqrt(400))


def test_bernoulli_frequency():
    tessera.manual_seed(5)
    p = tessera.tensor([0.0, 0.1, 0.5, 0.9, 1.0]).reshape(5, 1).expand(5, N // 5)
    x = _np(tessera.bernoulli(p))
    assert set(np.unique(x).tolist()) <= {0.0, 1.0}
    for i, q in enumerate([0.0, 0.1, 0.5, 0.9, 1.0]):
        assert abs(x[i].mean() - q) <= 6 * math.sqrt(q * (1 - q) / (N // 5))
    assert abs(_np(tessera.bernoulli(tessera.zeros(N), 0.3)).mean() - 0.3) < 0.01
    y = _np(tessera.zeros(N, dtype=tessera.int64).bernoulli_(0.25))
    assert y.dtype == np.int64 and abs(y.mean() - 0.25) < 0.01
    pt = tessera.tensor([0.2, 0.8])
    z = _np(tessera.zeros(N // 2, 2).bernoulli_(pt))
    assert abs(z[:, 0].mean() - 0.2) < 0.015 and abs(z[:, 1].mean() - 0.8) < 0.015


def test_multinomial_frequencies():
    tessera.manual_seed(6)
    probs = tessera.tensor([[1.0, 2.0, 0.0, 7.0], [5.0, 5.0, 5.0, 5.0]])  # unnormalised
    x = _np(tessera.multinomial(probs, N // 2, replacement=True))
    assert x.shape == (2, N // 2) and x.dtype == np.int64
    for row, p in zip(x, [[0.1, 0.2, 0.0, 0.7], [0.25] * 4]):
        freq = np.bincount(row, minlength=4) / row.size
        assert np.all(np.abs(freq - p) < 6 * np.sqrt(np.array(p) * (1 - np.array(p)) /
                                                     row.size) + 1e-12)
    # without replacement: distinct indices, and the first draw follows the probabilities
    w = tessera.tensor([1.0, 2.0, 3.0, 4.0, 0.0])
    draws = _np(tessera.multinomial(w.expand(20000, 5), 4))
    assert all(len(set(r)) == 4 and 4 not in r for r in draws.tolist())
    first = np.bincount(draws[:, 0], minlength=5) / len(draws)
    assert np.all(np.abs(first - [0.1, 0.2, 0.3, 0.4, 0.0]) < 0.02)
    full = _np(tessera.multinomial(tessera.ones(10), 10))
    assert sorted(full.tolist()) == list(range(10))


def test_other_distributions():
    tessera.manual_seed(7)
    e = _np(tessera.empty(N, dtype=tessera.float64).exponential_(2.0))
    assert e.min() >= 0 and abs(e.mean() - 0.5) < 5 * 0.5 / math.sqrt(N)
    g = _np(tessera.empty(N, dtype=tessera.float64).geometric_(0.25))
    assert g.min() >= 1 and np.all(g == np.round(g)) and abs(g.mean() - 4) < 0.1
    ln = _np(tessera.empty(N, dtype=tessera.float64).log_normal_(0.0, 0.5))
    assert ln.min() > 0 and abs(np.log(ln).mean()) < 0.01 and abs(np.log(ln).std() - 0.5) < 0.01
    c = _np(tessera.empty(N, dtype=tessera.float64).cauchy_(1.0, 2.0))
    assert abs(np.median(c) - 1) < 0.05
    assert abs(np.mean(np.abs(c - 1) < 2) - 0.5) < 0.01   # quartiles at median +- sigma
    po = _np(tessera.poisson(tessera.full((N,), 3.0)))
    assert np.all(po == np.round(po)) and abs(po.mean() - 3) < 0.05 and abs(po.var() - 3) < 0.1


# ---- errors and autograd -------------------------------------------------------------

@pytest.mark.parametrize("call,exc", [
    (lambda: tessera.rand(-1, 2), RuntimeError),
    (lambda: tessera.randn(2, -3), RuntimeError),
    (lambda: tessera.randint(5, 5, (3,)), RuntimeError),
    (lambda: tessera.randint(5, 3, (3,)), RuntimeError),
    (lambda: tessera.randint(0, 300, (3,), dtype=tessera.uint8), RuntimeError),
    (lambda: tessera.randint(0, 10), TypeError),
    (lambda: tessera.randperm(-1), RuntimeError),
    (lambda: tessera.rand(3, dtype=tessera.int64), NotImplementedError),
    (lambda: tessera.multinomial(tessera.tensor([0.5, 0.5]), 3), RuntimeError),
    (lambda: tessera.multinomial(tessera.tensor([0.5, -0.1]), 1), RuntimeError),
    (lambda: tessera.multinomial(tessera.tensor([0.0, 0.0]), 1, True), RuntimeError),
    (lambda: tessera.multinomial(tessera.tensor([1.0, float("nan")]), 1), RuntimeError),
    (lambda: tessera.multinomial(tessera.tensor([1.0]), 0), RuntimeError),
    (lambda: tessera.bernoulli(tessera.tensor([1.5])), RuntimeError),
    (lambda: tessera.zeros(2).bernoulli_(-0.1), RuntimeError),
    (lambda: tessera.normal(tessera.zeros(2), -1.0), RuntimeError),
    (lambda: tessera.normal(tessera.zeros(2), -tessera.ones(2)), RuntimeError),
    (lambda: tessera.zeros(2).uniform_(2, 1), RuntimeError),
    (lambda: tessera.zeros(2).exponential_(0), RuntimeError),
    (lambda: tessera.zeros(2).geometric_(1.0), RuntimeError),
    (lambda: tessera.zeros(2).cauchy_(0, -1), RuntimeError),
    (lambda: tessera.poisson(tessera.tensor([-1.0])), RuntimeError),
])
def test_invalid_arguments(call, exc):
    with pytest.raises(exc):
        call()


def test_inplace_on_leaf_requiring_grad():
    w = tessera.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        w.uniform_()
    with tessera.no_grad():
        assert w.normal_() is w
    assert w.requires_grad and w.is_leaf


def test_inplace_sampling_cuts_gradient():
    # PyTorch: overwriting a tensor with samples gives its history zero gradient
    a = tessera.ones(3, requires_grad=True)
    b = a * 2
    b.uniform_()
    b.sum().backward()
    assert np.array_equal(_np(a.grad), np.zeros(3))


def test_inplace_returns_self_and_writes_views():
    x = tessera.zeros(4, 6)
    v = x[:, ::2]
    assert v.uniform_(5.0, 6.0) is v
    arr = _np(x)
    assert np.all(arr[:, ::2] >= 5) and np.all(arr[:, 1::2] == 0)
