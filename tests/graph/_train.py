"""A small graph training run checked step by step against PyTorch (shared by graph tests)."""
from __future__ import annotations

import numpy as np
import torch

import tessera


def train_mlp_against_torch(activation: str, optimizer: str, lr: float, sizes=(16, 32, 4),
                            batch: int = 64, steps: int = 3):
    """A ``Linear - activation - Linear`` model trained by an nn.Graph on a squared loss for
    ``steps`` steps, each loss and the final parameters compared with PyTorch's; returns the
    graph's compiled step after each call (``Graph._cache`` entries)."""
    tessera.manual_seed(0)
    layers = lambda lib: lib.nn.Sequential(lib.nn.Linear(sizes[0], sizes[1]),
                                           getattr(lib.nn, activation)(),
                                           lib.nn.Linear(sizes[1], sizes[2]))
    model, ref = layers(tessera), layers(torch)
    ref.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in model.state_dict().items()})
    opt = getattr(tessera.optim, optimizer)(model.parameters(), lr=lr)
    ropt = getattr(torch.optim, optimizer)(ref.parameters(), lr=lr)

    class Train(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.model(x).square().mean()
            loss.backward()
            return loss
    g = Train()
    x = np.random.default_rng(1).standard_normal((batch, sizes[0])).astype(np.float32)
    compiled = []
    for _ in range(steps):
        loss = g(tessera.tensor(x))
        compiled.append(g._cache[g._last_key])
        ropt.zero_grad()
        rloss = ref(torch.from_numpy(x)).square().mean()
        rloss.backward()
        ropt.step()
        np.testing.assert_allclose(loss.item(), rloss.item(), rtol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
    return compiled
