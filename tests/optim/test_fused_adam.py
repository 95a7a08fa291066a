"""Adam and AdamW's fused C update (``tessera.kernels.optim``, the default when
the parameters allow it): the same trajectory as PyTorch's (its op-by-op loop and its own
``fused=True``) and as tessera's op-by-op update (``fused=False``) over 20 steps, for every
option; checks that the kernel ran; ``fused=True`` where it cannot run raises."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera.kernels import cc, optim as optim_kernels
from tests.optim._common import make_params, run_steps, tol

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")

OPTIONS = [{}, {"amsgrad": True}, {"maximize": True}, {"weight_decay": 0.1},
           {"weight_decay": 0.1, "amsgrad": True, "maximize": True},
           {"betas": (0.3, 0.9), "eps": 1e-3}]


@pytest.fixture
def calls(monkeypatch):
    """How many times the fused kernel ran."""
    count = [0]
    step = optim_kernels.adam_step

    def counting(*a, **k):
        count[0] += 1
        return step(*a, **k)
    monkeypatch.setattr(optim_kernels, "adam_step", counting)
    return count


def _trajectory(lib, name, dtype, steps=20, **kw):
    params = make_params(lib, dtype)
    return run_steps(getattr(lib.optim, name)(params, lr=0.05, **kw), params, steps)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
@pytest.mark.parametrize("kw", OPTIONS, ids=str)
def test_fused_matches_torch_and_the_op_by_op_update(calls, name, kw, dtype):
    if not optim_kernels.available(np.float32):
        pytest.skip("code generation is off")
    fused = _trajectory(tessera, name, dtype, **kw)
    assert calls[0] == 20 * 2, "the fused kernel did not run for both parameters"
    loop = _trajectory(tessera, name, dtype, fused=False, **kw)
    assert calls[0] == 20 * 2, "fused=False ran the fused kernel"
    for ref in (_trajectory(torch, name, dtype, **kw),
                _trajectory(torch, name, dtype, fused=True, **kw), loop):
        for step, (a, b) in enumerate(zip(fused, ref)):
            for i, (x, y) in enumerate(zip(a, b)):
                np.testing.assert_allclose(x, y, **tol(dtype), err_msg=f"step {step}, param {i}")


def test_fused_true_on_parameters_it_cannot_take_raises():
    w = tessera.nn.Parameter(tessera.ones(4, dtype=tessera.float16))
    opt = tessera.optim.Adam([w], fused=True)
    (w.float() ** 2).sum().backward()
    with pytest.raises(RuntimeError, match="fused=True"):
        opt.step()


def test_default_falls_back_for_other_layouts(calls):
    """A non-contiguous parameter (a transposed view's storage) takes the op-by-op update
    by default, with the same result as fused=False."""
    base = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    results = []
    for kw in ({}, {"fused": False}):
        w = tessera.nn.Parameter(tessera.from_numpy(base.copy()).t())
        opt = tessera.optim.Adam([w], lr=0.1, **kw)
        for _ in range(3):
            opt.zero_grad()
            (w * w).sum().backward()
            opt.step()
        results.append(w.detach().numpy().copy())
    np.testing.assert_array_equal(results[0], results[1])
    assert calls[0] == 0


def test_fused_step_bumps_versions():
    """Autograd sees the in-place update: a graph that saved the parameter before the
    step refuses to run backward after it, as PyTorch's does."""
    w = tessera.nn.Parameter(tessera.ones(3))
    opt = tessera.optim.Adam([w])
    (w * w).sum().backward()
    y = (w * w).sum()
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
