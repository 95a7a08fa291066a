"""tessera.utils.dtr: eager training under a memory budget gives the same bits as without
it (the single-process oracle) on four models, with the budget met between ops and the
counters reporting evictions and recomputations; in-place writes, tensors read after the
block, and bad arguments."""
from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.utils import dtr
from tests.remat._models import MODELS


def _train(name: str, budget: int | None, steps: int = 2):
    tessera.manual_seed(0)
    model, inputs, loss_fn = MODELS[name]()
    opt = tessera.optim.AdamW(model.parameters(), lr=1e-3)
    tessera.manual_seed(1)
    losses = []
    for _ in range(steps):
        if budget is None:
            loss = loss_fn(model, *inputs)
            loss.backward()
        else:
            with dtr.enable(budget_bytes=budget):
                loss = loss_fn(model, *inputs)
                loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach().numpy().copy() for p in model.parameters()]


def _tracked_peak(name: str) -> int:
    tessera.manual_seed(0)
    model, inputs, loss_fn = MODELS[name]()
    with dtr.enable(budget_bytes=1 << 40):
        loss_fn(model, *inputs).backward()
    return dtr.stats()["peak_bytes"]


@pytest.mark.parametrize("name", list(MODELS))
def test_training_bit_identical_under_budget(name):
    losses0, params0 = _train(name, None)
    budget = _tracked_peak(name) // 2
    losses, params = _train(name, budget)
    assert losses == losses0
    assert all(np.array_equal(a, b) for a, b in zip(params, params0))
    s = dtr.stats()
    assert s["evictions"] > 0 and s["recomputations"] > 0
    assert s["budget_bytes"] == budget
    assert s["over_budget"] > 0 or s["peak_bytes"] <= budget


def _inplace_program(x):
    a = x * 2
    b = a + 1            # made from a before the write: its recipe would now be wrong
    c = b.exp()
    a.add_(1)            # a's recipe no longer gives its value: a, b, c are pinned
    d = (c * a).tanh()
    return (d * b).sum()


def test_inplace_writes_and_reads_after_the_block():
    x0 = tessera.randn(64, 64, requires_grad=True)
    y0 = _inplace_program(x0)
    y0.backward()
    x = x0.detach().clone().requires_grad_(True)
    with dtr.enable(budget_bytes=64 * 64 * 4):
        h = x.exp() * 3            # read after the block
        y = _inplace_program(x)
        y.backward()
    assert dtr.stats()["evictions"] > 0
    assert y.item() == y0.item()
    np.testing.assert_array_equal(x.grad.numpy(), x0.grad.numpy())
    np.testing.assert_array_equal(h.detach().numpy(), (x0.detach().exp() * 3).numpy())


def test_no_grad_block_tracks_nothing():
    with dtr.enable(budget_bytes=0), tessera.no_grad():
        y = tessera.ones(128, 128).exp().sum()
    assert y.item() == pytest.approx(128 * 128 * np.e, rel=1e-6)
    assert dtr.stats()["evictions"] == 0


@pytest.mark.parametrize("bad", [-1, 1.5, "1MB"])
def test_bad_budget(bad):
    with pytest.raises(ValueError, match="budget_bytes must be a non-negative int"):
        with dtr.enable(budget_bytes=bad):
            pass
