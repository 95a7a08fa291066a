"""nn.Graph.profile: where a compiled step's time goes, by op."""
from __future__ import annotations

import time

import numpy as np

import tessera
from tessera import nn


class _Train(nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        return loss


def test_profile_times_each_op_and_leaves_the_step_unchanged():
    tessera.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 8))
    g = _Train(model, tessera.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    x, y = tessera.randn(32, 64), tessera.randn(32, 8)
    g(x, y)
    g(x, y)
    ex = g._current().executor
    steps = list(ex.steps)
    t0 = time.perf_counter()
    spent = g.profile(x, y, steps=3)
    wall = (time.perf_counter() - t0) / 3
    assert ex.steps == steps                       # the timers are gone again
    assert {"matmul", "fused"} <= set(spent)       # GEMMs and generated kernels
    assert all(v > 0 for v in spent.values())
    assert sum(spent.values()) <= wall             # kernels' time is part of a step's
    # profiling runs real steps: the parameters moved as three more steps move them
    before = [p.detach().numpy().copy() for p in model.parameters()]
    g.profile(x, y, steps=1)
    assert any(not np.array_equal(b, p.detach().numpy()) for b, p in
               zip(before, model.parameters()))
