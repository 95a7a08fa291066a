"""What the convolution kernel tests share: one ``nn.Graph`` SGD step of a small conv net
against the same step in PyTorch."""
from __future__ import annotations

import numpy as np
import torch

import tessera


def graph_sgd_step_matches_torch(make, x: np.ndarray, close) -> None:
    """``make(lib)`` builds the same net in tessera and PyTorch; one traced SGD step (lr
    0.1, loss mean(out**2)) on ``x`` must give PyTorch's loss and updated weights, each
    compared by ``close(actual, expected, dtype)``."""
    tm, pm = make(tessera), make(torch)
    tm.load_state_dict({k: tessera.tensor(v.detach().numpy()) for k, v in
                        pm.state_dict().items()})

    class Step(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = tm
            self.add_optimizer(tessera.optim.SGD(tm.parameters(), lr=0.1))

        def build(self, t):
            loss = self.m(t).square().mean()
            loss.backward()
            return loss

    loss = Step()(tessera.tensor(x))
    ploss = pm(torch.tensor(x)).square().mean()
    ploss.backward()
    with torch.no_grad():
        for p in pm.parameters():
            p -= 0.1 * p.grad
    close(loss.numpy(), ploss.detach().numpy(), np.float32)
    for p, q in zip(tm.parameters(), pm.parameters()):
        close(p.detach().numpy(), q.detach().numpy(), np.float32)
