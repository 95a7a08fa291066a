"""ZeRO stage 1 and 2 (optimizer state split over the data-parallel ranks): the same
parameters as one process, a 1/n share of the optimizer state per rank."""
import numpy as np
import pytest

import tessera
from tessera import nn
from tessera.distributed.optim import ZeroRedundancyOptimizer
from tessera.distributed.placement import placement
from tests.distributed._helpers import B, S, run

rng = np.random.default_rng(0)
X = rng.standard_normal((8, 6))
Y = rng.standard_normal((8, 3))


def _model():
    tessera.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).double()


def train(zero_stage=None, steps=5):
    """Data parallel on every rank of the world (one process: plain AdamW)."""
    model = _model()
    x, y = tessera.tensor(X), tessera.tensor(Y)
    n = tessera.distributed.get_world_size()
    if zero_stage is not None:
        p = placement("cpu", list(range(n)))
        model.to_global(p, B)
        x, y = x.to_global(p, B).to_global(sbp=S(0)), y.to_global(p, B).to_global(sbp=S(0))
        opt = ZeroRedundancyOptimizer(model.parameters(), tessera.optim.AdamW, lr=0.05,
                                      stage=zero_stage)
    else:
        opt = tessera.optim.AdamW(model.parameters(), lr=0.05)
    losses, grad_sbps = [], None
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if grad_sbps is None and zero_stage is not None:
            grad_sbps = [q.grad.sbp[0].short() for q in model.parameters()]
        opt.step()
        losses.append(loss.item())
    state_bytes = opt.local_state_bytes() if zero_stage is not None else None
    return losses, [q.detach().numpy().copy() for q in model.parameters()], state_bytes, \
        grad_sbps


def plain_state_bytes() -> int:
    """AdamW's state for the whole model: exp_avg and exp_avg_sq per parameter (+ steps)."""
    model = _model()
    opt = tessera.optim.AdamW(model.parameters(), lr=0.05)
    nn.functional.mse_loss(model(tessera.tensor(X)), tessera.tensor(Y)).backward()
    opt.step()
    return sum(np.asarray(v._data).nbytes for st in opt.state.values() for v in st.values())


def check(results, n):
    want_losses, want_params, _, _ = train(None)
    full = plain_state_bytes()
    for losses, params, state_bytes, _ in results:
        np.testing.assert_allclose(losses, want_losses, rtol=1e-10)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-9, atol=1e-12)
        # each rank keeps about 1/n of the moments (the uneven first ranks a row more)
        assert state_bytes < full / n + 200, (state_bytes, full)


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_matches_one_process_with_a_share_of_the_state(stage):
    res = run(2, train, stage)
    check(res, 2)
    grad_sbps = res[0][3]
    assert grad_sbps == (["S(0)"] * 4 if stage == 2 else ["P"] * 4)


def test_zero_uneven_on_three_ranks():
    check(run(3, train, 2), 3)


def test_zero_needs_global_parameters():
    with pytest.raises(ValueError, match="global parameters"):
        ZeroRedundancyOptimizer(_model().parameters(), tessera.optim.SGD, lr=0.1)
