"""Reparameterised gradients (same noise fed to both libraries, or statistics for Gamma),
KL divergences, validation errors, and a REINFORCE policy-gradient loop that learns."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
import tessera.distributions as D

rng = np.random.default_rng(1)


def _pair(*arrays):
    return ([tessera.tensor(a, requires_grad=True) for a in arrays],
            [torch.tensor(a, requires_grad=True) for a in arrays])


def _close(a, b, what, atol=1e-6, rtol=1e-5):
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), atol=atol, rtol=rtol,
                               err_msg=what)


@pytest.mark.parametrize("kind", ["normal", "mvn", "lognormal", "independent"])
def test_rsample_gradient_with_the_same_noise(kind, monkeypatch):
    """tessera's standard normal draws are fed to torch's rsample, so both compute the
    same function of the parameters."""
    loc, scale, cov = rng.normal(size=(3, 2)), rng.uniform(0.5, 2, (3, 2)), None
    a = rng.normal(size=(3, 2, 2))
    cov = a @ np.swapaxes(a, -1, -2) + np.eye(2)
    params = (loc, cov) if kind == "mvn" else (loc, scale)
    ts, qs = _pair(*params)
    noise = []
    import tessera.distributions.utils as tu
    real = tu._standard_normal

    def recording(shape, dtype):
        eps = real(shape, dtype)
        noise.append(eps)
        return eps
    monkeypatch.setattr(tu, "_standard_normal", recording)
    import tessera.distributions.multivariate_normal as tm
    import tessera.distributions.normal as tn
    monkeypatch.setattr(tn, "_standard_normal", recording)
    monkeypatch.setattr(tm, "_standard_normal", recording)
    import torch.distributions.multivariate_normal as qm
    import torch.distributions.normal as qn
    import torch.distributions.utils as qu
    replay = lambda shape, dtype, device: torch.tensor(noise[-1].numpy())  # noqa: E731
    for mod in (qn, qm, qu):
        if hasattr(mod, "_standard_normal"):
            monkeypatch.setattr(mod, "_standard_normal", replay)
    make = {"normal": lambda M, a, b: M.Normal(a, b),
            "lognormal": lambda M, a, b: M.LogNormal(a, b),
            "independent": lambda M, a, b: M.Independent(M.Normal(a, b), 1),
            "mvn": lambda M, a, b: M.MultivariateNormal(a, covariance_matrix=b)}[kind]
    xt = make(D, *ts).rsample((4,))
    xq = make(torch.distributions, *qs).rsample((4,))
    _close(xt, xq, "rsample")
    w = rng.normal(size=tuple(xq.shape))
    (xt * tessera.tensor(w)).sum().backward()
    (xq * torch.tensor(w)).sum().backward()
    for i, (a, b) in enumerate(zip(ts, qs)):
        _close(a.grad, b.grad, f"grad in parameter {i}")


def test_uniform_and_laplace_rsample_gradients():
    (low, width), _ = _pair(rng.normal(size=3), rng.uniform(0.5, 2, 3))
    x = D.Uniform(low, low + width).rsample((5,))
    u = ((x - low) / width).detach()  # the uniform noise drawn
    x.sum().backward()
    _close(low.grad, tessera.full((3,), 5.0, dtype=tessera.float64), "d low")
    _close(width.grad, u.sum(0), "d width")
    (loc, scale), _ = _pair(rng.normal(size=3), rng.uniform(0.5, 2, 3))
    y = D.Laplace(loc, scale).rsample((5,))
    z = ((y - loc) / scale).detach()
    y.sum().backward()
    _close(loc.grad, tessera.full((3,), 5.0, dtype=tessera.float64), "d loc")
    _close(scale.grad, z.sum(0), "d scale")


@pytest.mark.parametrize("alpha", [0.3, 1.0, 4.0])
def test_gamma_rsample_gradient_is_unbiased(alpha):
    """d/d alpha E[f(x)] by pathwise gradients equals the same derivative computed from
    PyTorch's closed form: E[x] = alpha / rate, E[x^2] = alpha (alpha + 1) / rate^2."""
    tessera.manual_seed(0)
    a = tessera.tensor([alpha], dtype=tessera.float64, requires_grad=True)
    r = tessera.tensor([2.0], dtype=tessera.float64, requires_grad=True)
    n = 200000
    x = D.Gamma(a, r).rsample((n,))
    ((x + x * x).mean()).backward()
    aq = torch.tensor([alpha], dtype=torch.float64, requires_grad=True)
    rq = torch.tensor([2.0], dtype=torch.float64, requires_grad=True)
    (aq / rq + aq * (aq + 1) / rq ** 2).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), aq.grad.numpy(), rtol=0.03)
    np.testing.assert_allclose(r.grad.numpy(), rq.grad.numpy(), rtol=0.03)


def test_gamma_rsample_gradient_matches_torch_formula():
    """Draw by draw: tessera's implicit gradient equals torch's _standard_gamma_grad at the
    same sample (to PyTorch's approximation error)."""
    a = tessera.tensor(rng.uniform(0.2, 8, (1000,)), requires_grad=True)
    x = tessera._standard_gamma(a)
    x.sum().backward()
    want = torch._standard_gamma_grad(torch.tensor(a.detach().numpy()),
                                      torch.tensor(x.detach().numpy()))
    np.testing.assert_allclose(a.grad.numpy(), want.numpy(), rtol=2e-3, atol=1e-8)


@pytest.mark.parametrize("kind", ["beta", "dirichlet"])
def test_beta_dirichlet_rsample_gradient_is_unbiased(kind):
    tessera.manual_seed(0)
    conc = np.array([1.5, 0.7, 3.0]) if kind == "dirichlet" else np.array([1.5, 0.7])
    c = tessera.tensor(conc, requires_grad=True)
    n = 200000
    if kind == "dirichlet":
        x = D.Dirichlet(c).rsample((n,))[..., 0]
    else:
        x = D.Beta(c[0], c[1]).rsample((n,))
    x.mean().backward()
    cq = torch.tensor(conc, requires_grad=True)
    (cq[0] / cq.sum()).backward()  # E[x_0]
    np.testing.assert_allclose(c.grad.numpy(), cq.grad.numpy(), rtol=0.05, atol=2e-3)


# ---- KL -----------------------------------------------------------------------------------

def _pos(*s):
    return rng.uniform(0.5, 3, s)


def _spd(n):
    a = rng.normal(size=(2, n, n))
    return a @ np.swapaxes(a, -1, -2) + np.eye(n)


KL_PAIRS = {
    "normal": (lambda M, a, b, c, d: (M.Normal(a, b), M.Normal(c, d)),
               (rng.normal(size=3), _pos(3), rng.normal(size=3), _pos(3))),
    "bernoulli": (lambda M, a, b: (M.Bernoulli(a), M.Bernoulli(b)),
                  (rng.uniform(0.1, 0.9, 4), rng.uniform(0.1, 0.9, 4))),
    "categorical": (lambda M, a, b: (M.Categorical(logits=a), M.Categorical(logits=b)),
                    (rng.normal(size=(2, 5)), rng.normal(size=(2, 5)))),
    "onehot": (lambda M, a, b: (M.OneHotCategorical(logits=a), M.OneHotCategorical(logits=b)),
               (rng.normal(size=(2, 5)), rng.normal(size=(2, 5)))),
    "gamma": (lambda M, a, b, c, d: (M.Gamma(a, b), M.Gamma(c, d)), (_pos(3),) * 2 + (_pos(3),)
              * 2),
    "beta": (lambda M, a, b, c, d: (M.Beta(a, b), M.Beta(c, d)),
             (_pos(3), _pos(3), _pos(3), _pos(3))),
    "dirichlet": (lambda M, a, b: (M.Dirichlet(a), M.Dirichlet(b)), (_pos(2, 4), _pos(2, 4))),
    "exponential": (lambda M, a, b: (M.Exponential(a), M.Exponential(b)), (_pos(3), _pos(3))),
    "laplace": (lambda M, a, b, c, d: (M.Laplace(a, b), M.Laplace(c, d)),
                (rng.normal(size=3), _pos(3), rng.normal(size=3), _pos(3))),
    "poisson": (lambda M, a, b: (M.Poisson(a), M.Poisson(b)), (_pos(3), _pos(3))),
    "uniform": (lambda M, a, b, c, d: (M.Uniform(a, a + b), M.Uniform(c, c + d)),
                (np.zeros(3), _pos(3), -np.ones(3), _pos(3) + 2)),
    "uniform_outside": (lambda M, a, b, c, d: (M.Uniform(a, a + b), M.Uniform(c, c + d)),
                        (np.zeros(3), _pos(3) + 3, np.zeros(3), _pos(3))),
    "mvn": (lambda M, a, b, c, d: (M.MultivariateNormal(a, covariance_matrix=b),
                                   M.MultivariateNormal(c, covariance_matrix=d)),
            (rng.normal(size=(2, 3)), _spd(3), rng.normal(size=(2, 3)), _spd(3))),
    "independent": (lambda M, a, b, c, d: (M.Independent(M.Normal(a, b), 1),
                                           M.Independent(M.Normal(c, d), 1)),
                    (rng.normal(size=(2, 3)), _pos(2, 3), rng.normal(size=(2, 3)), _pos(2, 3))),
    "lognormal": (lambda M, a, b, c, d: (M.LogNormal(a, b), M.LogNormal(c, d)),
                  (rng.normal(size=3), _pos(3), rng.normal(size=3), _pos(3))),
    "exponential_gamma": (lambda M, a, b, c: (M.Exponential(a), M.Gamma(b, c)),
                          (_pos(3), _pos(3), _pos(3))),
    "gamma_exponential": (lambda M, a, b, c: (M.Gamma(a, b), M.Exponential(c)),
                          (_pos(3), _pos(3), _pos(3))),
    "uniform_normal": (lambda M, a, b, c, d: (M.Uniform(a, a + b), M.Normal(c, d)),
                       (rng.normal(size=3), _pos(3), rng.normal(size=3), _pos(3))),
    "normal_laplace": (lambda M, a, b, c, d: (M.Normal(a, b), M.Laplace(c, d)),
                       (rng.normal(size=3), _pos(3), rng.normal(size=3), _pos(3))),
    "exponential_normal": (lambda M, a, b, c: (M.Exponential(a), M.Normal(b, c)),
                           (_pos(3), rng.normal(size=3), _pos(3))),
    "bernoulli_poisson": (lambda M, a, b: (M.Bernoulli(a), M.Poisson(b)),
                          (rng.uniform(0.1, 0.9, 3), _pos(3))),
    "normal_uniform": (lambda M, a, b, c, d: (M.Normal(a, b), M.Uniform(c, c + d)),
                       (rng.normal(size=3), _pos(3), rng.normal(size=3), _pos(3))),
}


@pytest.mark.parametrize("name", list(KL_PAIRS))
def test_kl_divergence(name):
    make, params = KL_PAIRS[name]
    ts, qs = _pair(*params)
    kt = D.kl_divergence(*make(D, *ts))
    kq = torch.distributions.kl_divergence(*make(torch.distributions, *qs))
    np.testing.assert_allclose(kt.detach().numpy(), kq.detach().numpy(), rtol=1e-5, atol=1e-7)
    if np.isfinite(kq.detach().numpy()).all():
        kt.sum().backward()
        kq.sum().backward()
        for i, (a, b) in enumerate(zip(ts, qs)):
            if b.grad is not None:
                _close(a.grad, b.grad, f"grad of KL in parameter {i}")


def test_expfamily_kl_by_bregman_divergence():
    """The generic exponential-family KL (autograd of the log normaliser) equals the
    closed form."""
    from tessera.distributions.kl import _kl_expfamily_expfamily
    p = D.Gamma(tessera.tensor([2.0, 0.7]), tessera.tensor([1.5, 3.0]))
    q = D.Gamma(tessera.tensor([1.0, 2.0]), tessera.tensor([0.5, 1.0]))
    _close(_kl_expfamily_expfamily(p, q), D.kl_divergence(p, q), "Bregman KL")


def test_register_kl_picks_the_most_specific_pair():
    class MyNormal(D.Normal):
        pass

    p, q = MyNormal(0.0, 1.0), D.Normal(1.0, 1.0)
    assert float(D.kl_divergence(p, q)) == pytest.approx(0.5)

    @D.register_kl(MyNormal, D.Normal)
    def _mine(p, q):
        return tessera.tensor(-1.0)
    try:
        assert float(D.kl_divergence(p, q)) == -1.0
        assert float(D.kl_divergence(q, p)) == pytest.approx(0.5)
    finally:
        from tessera.distributions.kl import _KL_MEMOIZE, _KL_REGISTRY
        del _KL_REGISTRY[MyNormal, D.Normal]
        _KL_MEMOIZE.clear()
    with pytest.raises(NotImplementedError, match="No KL\\(p \\|\\| q\\) is implemented for "
                                                  "p type Poisson and q type Laplace"):
        D.kl_divergence(D.Poisson(1.0), D.Laplace(0.0, 1.0))
    with pytest.raises(TypeError):
        D.register_kl(int, D.Normal)


def test_ambiguous_kl_warns_as_pytorch():
    class A(D.Normal):
        pass

    class B(D.Normal):
        pass

    from tessera.distributions.kl import _KL_MEMOIZE, _KL_REGISTRY
    D.register_kl(A, D.Normal)(lambda p, q: tessera.tensor(1.0))
    D.register_kl(D.Normal, B)(lambda p, q: tessera.tensor(2.0))
    try:
        with pytest.warns(RuntimeWarning, match=r"Ambiguous kl_divergence\(A, B\). Please "
                                                r"register_kl\(A, B\)"):
            D.kl_divergence(A(0.0, 1.0), B(0.0, 1.0))
    finally:
        del _KL_REGISTRY[A, D.Normal], _KL_REGISTRY[D.Normal, B]
        _KL_MEMOIZE.clear()


# ---- validation ---------------------------------------------------------------------------

def _errors(fn):
    """(type, message) of the error fn(tessera) raises and fn(torch) raises."""
    out = []
    for lib, mod in ((tessera, D), (torch, torch.distributions)):
        with pytest.raises(Exception) as info:
            fn(lib, mod)
        out.append((type(info.value), str(info.value)))
    return out


def _first_line(msg: str) -> str:
    return msg.split("\n")[0].replace("torch.Size", "tessera.Size")


@pytest.mark.parametrize("case", [
    lambda L, M: M.Normal(L.tensor([0.0, 1.0]), L.tensor([1.0, -1.0])),
    lambda L, M: M.Normal(0.0, 1.0).log_prob(L.tensor([0.0, 1.0]).reshape(2, 1).expand(2, 3)
                                             [:, :2].sum(-1).reshape(2) + L.tensor(
                                                 [float("nan"), 0.0])),
    lambda L, M: M.Bernoulli(probs=L.tensor([0.5, 1.5])),
    lambda L, M: M.Bernoulli(probs=L.tensor([0.5]), logits=L.tensor([0.0])),
    lambda L, M: M.Bernoulli(L.tensor([0.5])).log_prob(L.tensor([0.5])),
    lambda L, M: M.Categorical(probs=L.tensor(0.5)),
    lambda L, M: M.Categorical(probs=L.tensor([0.5, 0.5])).log_prob(L.tensor(2)),
    lambda L, M: M.Categorical(probs=L.tensor([[0.5, 0.5]] * 3)).log_prob(L.tensor([0, 1])),
    lambda L, M: M.Categorical(),
    lambda L, M: M.Gamma(L.tensor([1.0]), L.tensor([0.0])),
    lambda L, M: M.Gamma(L.tensor([1.0]), L.tensor([1.0])).log_prob(L.tensor([-1.0])),
    lambda L, M: M.Beta(L.tensor([1.0]), L.tensor([-1.0])),
    lambda L, M: M.Beta(L.tensor([1.0]), L.tensor([1.0])).log_prob(L.tensor([1.5])),
    lambda L, M: M.Dirichlet(L.tensor([1.0, -1.0])),
    lambda L, M: M.Dirichlet(L.tensor([1.0, 1.0])).log_prob(L.tensor([0.5, 0.6])),
    lambda L, M: M.Dirichlet(L.tensor([1.0, 1.0])).log_prob(L.tensor([0.5, 0.2, 0.3])),
    lambda L, M: M.Uniform(L.tensor([1.0]), L.tensor([0.0])),
    lambda L, M: M.Uniform(L.tensor([0.0]), L.tensor([1.0])).log_prob(L.tensor([2.0])),
    lambda L, M: M.MultivariateNormal(L.tensor(0.0), L.eye(2)),
    lambda L, M: M.MultivariateNormal(L.zeros(2)),
    lambda L, M: M.MultivariateNormal(L.zeros(2), covariance_matrix=L.ones(2)),
    lambda L, M: M.MultivariateNormal(L.zeros(2), scale_tril=L.tensor([[1.0, 1.0], [0.0, 1.0]])),
    lambda L, M: M.MultivariateNormal(L.zeros(2), covariance_matrix=-L.eye(2)),
    lambda L, M: M.Independent(M.Normal(L.zeros(2), 1.0), 2),
    lambda L, M: M.Poisson(L.tensor([-1.0])),
    lambda L, M: M.Poisson(L.tensor([1.0])).log_prob(L.tensor([0.5])),
    lambda L, M: M.Exponential(L.tensor([1.0])).log_prob(L.tensor([-0.5])),
    lambda L, M: M.Normal(0.0, 1.0).log_prob(0.5),
    lambda L, M: M.Normal(L.zeros(3), 1.0).log_prob(L.zeros(2)),
    lambda L, M: M.Distribution.set_default_validate_args(2),
])
def test_validation_errors_as_pytorch(case):
    (tt, tm), (qt, qm) = _errors(case)
    assert tt is qt or issubclass(tt, qt), (tt, qt)
    assert _first_line(tm) == _first_line(qm)


def test_validation_can_be_turned_off():
    d = D.Normal(tessera.tensor([0.0]), tessera.tensor([-1.0]), validate_args=False)
    assert d.scale.item() == -1.0
    assert D.Normal(0.0, 1.0, validate_args=False).log_prob(tessera.tensor(float("nan"))).isnan()
    D.Distribution.set_default_validate_args(False)
    try:
        D.Gamma(tessera.tensor([-1.0]), tessera.tensor([1.0]))
    finally:
        D.Distribution.set_default_validate_args(True)
    with pytest.raises(ValueError):
        D.Gamma(tessera.tensor([-1.0]), tessera.tensor([1.0]))


def test_constraints_as_pytorch():
    from torch.distributions import constraints as qc

    from tessera.distributions import constraints as tc
    x = np.array([[0.2, 0.8], [0.5, 0.6], [-0.1, 1.1], [1.0, 0.0]])
    for name in ("real", "positive", "nonnegative", "unit_interval", "simplex", "boolean",
                 "nonnegative_integer", "positive_integer", "real_vector", "one_hot"):
        a, b = getattr(tc, name), getattr(qc, name)
        assert repr(a) == repr(b)
        assert a.event_dim == b.event_dim and a.is_discrete == b.is_discrete
        np.testing.assert_array_equal(a.check(tessera.tensor(x)).numpy(),
                                      b.check(torch.tensor(x)).numpy())
    for a, b in ((tc.integer_interval(0, 3), qc.integer_interval(0, 3)),
                 (tc.interval(0.0, 1.0), qc.interval(0.0, 1.0)),
                 (tc.greater_than(0.5), qc.greater_than(0.5)),
                 (tc.less_than(0.5), qc.less_than(0.5)),
                 (tc.half_open_interval(0.0, 1.0), qc.half_open_interval(0.0, 1.0)),
                 (tc.independent(tc.positive, 1), qc.independent(qc.positive, 1))):
        assert repr(a) == repr(b)
        np.testing.assert_array_equal(a.check(tessera.tensor(x)).numpy(),
                                      b.check(torch.tensor(x)).numpy())
    m = np.stack([np.eye(2), [[1.0, 2.0], [2.0, 1.0]], [[1.0, 0.0], [3.0, 2.0]]])
    for name in ("lower_cholesky", "lower_triangular", "positive_definite", "symmetric",
                 "square", "positive_semidefinite"):
        np.testing.assert_array_equal(getattr(tc, name).check(tessera.tensor(m)).numpy(),
                                      getattr(qc, name).check(torch.tensor(m)).numpy(), name)
    assert tc.is_dependent(D.Uniform.support) and tc.is_dependent(tc.dependent)
    assert D.Uniform.support.event_dim == 0


# ---- REINFORCE ----------------------------------------------------------------------------

class Corridor:
    """A toy environment: positions 0..6, start in the middle, actions left/right; reaching
    6 pays 1, reaching 0 ends with nothing; at most 20 steps."""

    def __init__(self, rng):
        self.rng = rng

    def reset(self):
        self.pos, self.t = 3, 0
        return self._obs()

    def _obs(self):
        return np.eye(7, dtype=np.float32)[self.pos]

    def step(self, action):
        self.pos += 1 if action == 1 else -1
        self.t += 1
        done = self.pos in (0, 6) or self.t >= 20
        return self._obs(), float(self.pos == 6), done


def test_reinforce_learns():
    """The loop of PyTorch's examples/reinforcement_learning/reinforce.py: a policy network,
    Categorical over its softmax, log_prob of the sampled action, discounted returns."""
    import tessera as torch_
    import tessera.nn as nn
    import tessera.nn.functional as F
    from tessera.distributions import Categorical

    torch_.manual_seed(0)
    env = Corridor(np.random.default_rng(0))

    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.affine1 = nn.Linear(7, 32)
            self.affine2 = nn.Linear(32, 2)
            self.saved_log_probs, self.rewards = [], []

        def forward(self, x):
            return F.softmax(self.affine2(F.relu(self.affine1(x))), dim=1)

    policy = Policy()
    optimizer = torch_.optim.Adam(policy.parameters(), lr=1e-2)
    eps = np.finfo(np.float32).eps.item()

    def select_action(state):
        state = torch_.from_numpy(state).float().unsqueeze(0)
        m = Categorical(policy(state))
        action = m.sample()
        policy.saved_log_probs.append(m.log_prob(action))
        return action.item()

    def finish_episode():
        R, returns = 0, []
        for r in policy.rewards[::-1]:
            R = r + 0.99 * R
            returns.insert(0, R)
        returns = torch_.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + eps) if len(returns) > 1 \
            else returns
        loss = torch_.cat([-lp * R for lp, R in zip(policy.saved_log_probs, returns)]).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        del policy.rewards[:], policy.saved_log_probs[:]

    def success_rate(episodes):
        wins = 0
        with torch_.no_grad():
            for _ in range(episodes):
                state, done, reward = env.reset(), False, 0.0
                while not done:
                    probs = policy(torch_.from_numpy(state).unsqueeze(0))
                    state, reward, done = env.step(int(probs.argmax()))
                wins += reward
        return wins / episodes

    for _ in range(150):
        state, done = env.reset(), False
        while not done:
            state, reward, done = env.step(select_action(state))
            policy.rewards.append(reward)
        finish_episode()
    # the greedy policy walks straight to the reward
    assert success_rate(5) == 1.0
    probs = policy(torch_.from_numpy(np.eye(7, dtype=np.float32)[1:6]))
    assert bool((probs[:, 1] > 0.8).all()), probs
