"""tessera.distributions against torch.distributions: values of log_prob, cdf, entropy and
the moments, and the gradients of log_prob in the parameters, over batched parameters."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
import tessera.distributions as D

rng = np.random.default_rng(0)


def _pos(*shape, low=0.5, high=3.0):
    return rng.uniform(low, high, shape)


def _real(*shape):
    return rng.normal(size=shape)


def _spd(*shape):
    a = rng.normal(size=shape)
    return a @ np.swapaxes(a, -1, -2) + np.eye(shape[-1])


def _probs(*shape):
    p = rng.uniform(0.1, 1.0, shape)
    return p / p.sum(-1, keepdims=True)


# name -> (constructor(lib distributions module, *params), params, value, methods)
# values lie in the support; every parameter is differentiable
CASES = {
    "normal": (lambda M, a, b: M.Normal(a, b), (_real(3, 2), _pos(3, 2)), _real(4, 3, 2),
               ("cdf", "icdf")),
    "normal_broadcast": (lambda M, a, b: M.Normal(a, b), (_real(3, 1), _pos(2)), _real(3, 2),
                         ("cdf",)),
    "bernoulli_probs": (lambda M, p: M.Bernoulli(probs=p), (rng.uniform(0.1, 0.9, (3, 2)),),
                        rng.integers(0, 2, (5, 3, 2)).astype(float), ()),
    "bernoulli_logits": (lambda M, z: M.Bernoulli(logits=z), (_real(4),),
                         rng.integers(0, 2, (4,)).astype(float), ()),
    "categorical_probs": (lambda M, p: M.Categorical(probs=p), (_probs(3, 4),),
                          rng.integers(0, 4, (5, 3)), ()),
    "categorical_logits": (lambda M, z: M.Categorical(logits=z), (_real(2, 3, 5),),
                           rng.integers(0, 5, (2, 3)), ()),
    "onehot": (lambda M, p: M.OneHotCategorical(probs=p), (_probs(3, 4),),
               np.eye(4)[rng.integers(0, 4, (2, 3))], ()),
    "uniform": (lambda M, a, b: M.Uniform(a, a + b), (_real(3), _pos(3)), None, ("cdf", "icdf")),
    "gamma": (lambda M, a, b: M.Gamma(a, b), (_pos(3, 2), _pos(3, 2)), _pos(4, 3, 2), ()),
    "exponential": (lambda M, r: M.Exponential(r), (_pos(5),), _pos(2, 5), ("cdf", "icdf")),
    "beta": (lambda M, a, b: M.Beta(a, b), (_pos(3), _pos(3)), rng.uniform(0.05, 0.95, (2, 3)),
             ()),
    "dirichlet": (lambda M, a: M.Dirichlet(a), (_pos(2, 4),), _probs(3, 2, 4), ()),
    "laplace": (lambda M, a, b: M.Laplace(a, b), (_real(3), _pos(3)), _real(2, 3),
                ("cdf", "icdf")),
    "poisson": (lambda M, r: M.Poisson(r), (_pos(4),), rng.integers(0, 6, (3, 4)).astype(float),
                ()),
    "lognormal": (lambda M, a, b: M.LogNormal(a, b), (_real(3), _pos(3)), _pos(2, 3),
                  ("cdf", "icdf")),
    "mvn_cov": (lambda M, m, c: M.MultivariateNormal(m, covariance_matrix=c),
                (_real(2, 3), _spd(2, 3, 3)), _real(4, 2, 3), ()),
    "mvn_tril": (lambda M, m, c: M.MultivariateNormal(m, scale_tril=c),
                 (_real(3), np.linalg.cholesky(_spd(3, 3))), _real(5, 3), ()),
    "mvn_precision": (lambda M, m, c: M.MultivariateNormal(m, precision_matrix=c),
                      (_real(2, 3), _spd(3, 3)), _real(4, 2, 3), ()),
    "mvn_shared_cov": (lambda M, m, c: M.MultivariateNormal(m, covariance_matrix=c),
                       (_real(4, 3), _spd(3, 3)), _real(6, 4, 3), ()),
    "independent": (lambda M, a, b: M.Independent(M.Normal(a, b), 1), (_real(3, 2), _pos(3, 2)),
                    _real(4, 3, 2), ()),
    "tanh_normal": (lambda M, a, b: M.TransformedDistribution(
        M.Normal(a, b), [M.transforms.TanhTransform()]), (_real(3), _pos(3)),
        rng.uniform(-0.9, 0.9, (2, 3)), ()),
    "sigmoid_affine": (lambda M, a, b: M.TransformedDistribution(
        M.Normal(a, b), [M.transforms.AffineTransform(0.5, -2.0),
                         M.transforms.SigmoidTransform()]), (_real(3), _pos(3)),
        rng.uniform(0.1, 0.9, (2, 3)), ("cdf", "icdf")),
    "compose_exp": (lambda M, a, b: M.TransformedDistribution(
        M.Normal(a, b), M.transforms.ComposeTransform([M.transforms.AffineTransform(a, b),
                                                       M.transforms.ExpTransform()])),
        (_real(3), _pos(3)), _pos(2, 3), ()),
}


def _libs(params):
    ts = [tessera.tensor(p, requires_grad=True) for p in params]
    qs = [torch.tensor(p, requires_grad=True) for p in params]
    return ts, qs


def _value(name, value, params):
    if value is None:  # inside [low, low + width)
        return params[0] + params[1] * rng.uniform(0, 1, (4,) + params[0].shape)
    return value


def _close(a, b, what, atol=1e-6, rtol=1e-6):
    a = a.detach().numpy() if hasattr(a, "detach") else np.asarray(a)
    b = b.detach().numpy() if hasattr(b, "detach") else np.asarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} vs {b.shape}"
    np.testing.assert_allclose(a, b, atol=atol, rtol=rtol, err_msg=what, equal_nan=True)


@pytest.mark.parametrize("name", list(CASES))
def test_log_prob_and_gradients(name):
    make, params, value, _ = CASES[name]
    value = _value(name, value, params)
    ts, qs = _libs(params)
    dt, dq = make(D, *ts), make(torch.distributions, *qs)
    assert tuple(dt.batch_shape) == tuple(dq.batch_shape)
    assert tuple(dt.event_shape) == tuple(dq.event_shape)
    vt = tessera.tensor(value)
    vq = torch.tensor(value)
    if name.startswith("categorical"):
        vt, vq = vt.long(), vq.long()
    lt, lq = dt.log_prob(vt), dq.log_prob(vq)
    _close(lt, lq, "log_prob")
    w = rng.normal(size=tuple(lq.shape))
    (lt * tessera.tensor(w)).sum().backward()
    (lq * torch.tensor(w)).sum().backward()
    for i, (a, b) in enumerate(zip(ts, qs)):
        _close(a.grad, b.grad, f"grad of log_prob in parameter {i}", atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_moments_entropy_cdf(name):
    make, params, value, methods = CASES[name]
    ts, qs = _libs(params)
    dt, dq = make(D, *ts), make(torch.distributions, *qs)
    for attr in ("mean", "variance", "stddev", "mode"):
        try:
            want = getattr(dq, attr)
        except NotImplementedError:
            continue
        _close(getattr(dt, attr), want, attr, atol=1e-6, rtol=1e-5)
    try:
        want = dq.entropy()
    except NotImplementedError:
        want = None
    if want is not None:
        got = dt.entropy()
        _close(got, want, "entropy", atol=1e-6, rtol=1e-5)
        got.sum().backward()
        want.sum().backward()
        for i, (a, b) in enumerate(zip(ts, qs)):
            if b.grad is not None:
                _close(a.grad, b.grad, f"grad of entropy in parameter {i}", rtol=1e-5)
    value = _value(name, value, params)
    if "cdf" in methods:
        _close(dt.cdf(tessera.tensor(value)), dq.cdf(torch.tensor(value)), "cdf")
    if "icdf" in methods:
        u = rng.uniform(0.05, 0.95, np.shape(value))
        _close(dt.icdf(tessera.tensor(u)), dq.icdf(torch.tensor(u)), "icdf", rtol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_sample_shapes_and_support(name):
    make, params, _, _ = CASES[name]
    ts, qs = _libs(params)
    dt, dq = make(D, *ts), make(torch.distributions, *qs)
    for shape in ((), (5,), (2, 3)):
        st, sq = dt.sample(shape), dq.sample(shape)
        assert tuple(st.shape) == tuple(sq.shape), shape
        assert st.dtype.name == str(sq.dtype).split(".")[-1]
        assert not st.requires_grad
        assert bool(dt.support.check(st).all())
        if dt.has_rsample:
            r = dt.rsample(shape)
            assert tuple(r.shape) == tuple(sq.shape)
            assert r.requires_grad


@pytest.mark.parametrize("name", ["normal", "bernoulli_probs", "categorical_probs", "gamma",
                                  "beta", "dirichlet", "uniform", "mvn_cov", "exponential",
                                  "laplace", "poisson", "lognormal", "onehot"])
def test_sample_moments(name):
    make, params, _, _ = CASES[name]
    tessera.manual_seed(0)
    ts, _ = _libs(params)
    d = make(D, *ts)
    n = 40000
    x = d.sample((n,)).double()
    if name.startswith("categorical"):
        freq = np.stack([(x.numpy() == k).mean(0) for k in range(ts[0].shape[-1])], -1)
        np.testing.assert_allclose(freq, d.probs.detach().numpy(), atol=0.015)
        return
    mean = x.mean(0).numpy()
    sd = d.stddev.detach().numpy()
    np.testing.assert_allclose(mean, d.mean.detach().numpy(), atol=6 * (sd / n ** 0.5).max())
    if name != "lognormal":  # its sample variance converges too slowly to check
        np.testing.assert_allclose(x.var(0).numpy(), d.variance.detach().numpy(), rtol=0.1)


def test_enumerate_support():
    p = _probs(3, 4)
    for make in (lambda M, t: M.Categorical(probs=t(p)),
                 lambda M, t: M.Bernoulli(probs=t(p[..., 0])),
                 lambda M, t: M.OneHotCategorical(probs=t(p))):
        for expand in (True, False):
            a = make(D, tessera.tensor).enumerate_support(expand)
            b = make(torch.distributions, torch.tensor).enumerate_support(expand)
            _close(a, b, "enumerate_support")


def test_expand():
    for name in ("normal", "gamma", "beta", "categorical_logits", "mvn_tril", "uniform",
                 "bernoulli_probs", "dirichlet", "independent", "lognormal"):
        make, params, _, _ = CASES[name]
        ts, qs = _libs(params)
        dt, dq = make(D, *ts), make(torch.distributions, *qs)
        shape = (2,) + tuple(dq.batch_shape)
        et, eq = dt.expand(shape), dq.expand(shape)
        assert tuple(et.batch_shape) == tuple(eq.batch_shape), name
        assert tuple(et.sample().shape) == tuple(eq.sample().shape), name
        _close(et.mean, eq.mean, f"{name} expanded mean")


def test_precision_and_covariance_of_mvn():
    m, c = _real(2, 3), _spd(2, 3, 3)
    for kw in ("covariance_matrix", "precision_matrix", "scale_tril"):
        arg = np.linalg.cholesky(c) if kw == "scale_tril" else c
        dt = D.MultivariateNormal(tessera.tensor(m), **{kw: tessera.tensor(arg)})
        dq = torch.distributions.MultivariateNormal(torch.tensor(m), **{kw: torch.tensor(arg)})
        for attr in ("covariance_matrix", "precision_matrix", "scale_tril"):
            _close(getattr(dt, attr), getattr(dq, attr), f"{kw}: {attr}", atol=1e-8, rtol=1e-6)
