"""pow with a Python-number exponent: the products, square roots and reciprocals that
replace libm's pow (eager NumPy kernel and the code generator's C) agree with PyTorch's
pow_tensor_scalar on ordinary and special values."""
import numpy as np
import pytest
import torch

import tessera

EXPONENTS = [2, 2.0, 3, 3.0, 0.5, -0.5, -1, -1.0, -2, 1, 0, 2.5, -3]
SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.0, -2.5, 1e-30, -1e-30, 3e12, np.inf, -np.inf, np.nan]


def _values(dtype):
    rng = np.random.default_rng(0)
    return np.concatenate([np.array(SPECIAL), rng.standard_normal(40) * 3]).astype(dtype)


def _expected(x, e):
    with np.errstate(all="ignore"):
        return torch.pow(torch.from_numpy(x), e).numpy()


def _close(got, want, dtype):
    rtol = 2e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0, equal_nan=True)
    # the sign of a zero result is part of the answer (1 / -0.0 is -inf)
    zero = want == 0
    assert (np.signbit(got[zero]) == np.signbit(want[zero])).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("e", EXPONENTS)
def test_eager_matches_torch(e, dtype):
    x = _values(dtype)
    with np.errstate(all="ignore"):
        got = tessera.pow(tessera.from_numpy(x), e).numpy()
    _close(got, _expected(x, e), dtype)


@pytest.mark.parametrize("e", EXPONENTS)
def test_zero_dim(e):
    x = np.array(1.7, np.float32)
    np.testing.assert_allclose(tessera.pow(tessera.from_numpy(x), e).numpy(), _expected(x, e),
                               rtol=2e-6)


@pytest.mark.parametrize("e", EXPONENTS)
def test_operator_and_inplace(e):
    x = _values(np.float32)
    with np.errstate(all="ignore"):
        a = (tessera.from_numpy(x) ** e).numpy()
        t = tessera.from_numpy(x.copy())
        t.pow_(e)
    _close(a, _expected(x, e), np.float32)
    _close(t.numpy(), _expected(x, e), np.float32)


@pytest.mark.parametrize("e", [2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 2.5])
def test_graph_matches_torch(e):
    """The code generator renders the exponent as a literal; the folded branch agrees."""
    class Pow(tessera.nn.Graph):
        def build(self, x):
            return tessera.pow(x * 1.0, e) + 0.0

    x = np.abs(_values(np.float32)) if e in (0.5, -0.5, 2.5) else _values(np.float32)
    x = np.resize(x, (64, 33))
    with np.errstate(all="ignore"):
        got = Pow()(tessera.from_numpy(x)).numpy()
        want = torch.pow(torch.from_numpy(x) * 1.0, e).numpy() + 0.0
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=0, equal_nan=True)


def test_grad_matches_torch():
    x = np.random.default_rng(1).uniform(0.1, 2, 50).astype(np.float32)
    for e in (2.0, 3.0, 0.5, -0.5, -1.0, -2.0):
        a = tessera.tensor(x, requires_grad=True)
        tessera.pow(a, e).sum().backward()
        b = torch.tensor(x, requires_grad=True)
        torch.pow(b, e).sum().backward()
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5)
