"""Out-forms of kernels that compiled graphs write into planned buffers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera.graph.executor import Executor
from tessera.ops.registry import REGISTRY


@pytest.mark.parametrize("attrs", [
    dict(shape=(4, 9, 3), dim=1, bounds=((0, 2), (2, 7), (7, 9)), squeeze=False),  # split
    dict(shape=(4, 3, 5), dim=1, bounds=((0, 1), (1, 2), (2, 3)), squeeze=True),   # unbind
    dict(shape=(4, 6), dim=1, bounds=((0, 4), (2, 6)), squeeze=False),             # overlapping
])
def test_split_backward_out_form_equals_its_kernel(attrs):
    op = REGISTRY["split_backward"]
    rng = np.random.default_rng(0)
    shape, dim = attrs["shape"], attrs["dim"]
    pieces = [np.delete(shape, dim) if attrs["squeeze"] else
              tuple(b - a if d == dim else s for d, s in enumerate(shape))
              for a, b in attrs["bounds"]]
    gs = [rng.standard_normal(tuple(p)).astype(np.float32) for p in pieces]
    want = op.kernels["cpu"](*gs, **attrs)
    out = np.full(shape, np.nan, np.float32)
    op.inplace_kernels["cpu"](out, *gs, **attrs)
    np.testing.assert_array_equal(out, want)


def test_qkv_split_gradient_is_written_into_the_arena_and_matches_pytorch():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16, 24)).astype(np.float32)
    w = rng.standard_normal((24, 24)).astype(np.float32)

    def loss_of(x, w):
        q, k, v = (x @ w).chunk(3, dim=-1)
        return ((q * k).sum(-1, keepdim=True) * v).square().mean()

    tw = tessera.nn.Parameter(tessera.tensor(w))
    opt = tessera.optim.SGD([tw], lr=1.0)

    class Step(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.add_optimizer(opt)

        def build(self, x):
            loss = loss_of(x, tw)
            loss.backward()
            return loss
    g = Step()
    loss = g(tessera.tensor(x))
    rw = torch.tensor(w, requires_grad=True)
    rloss = loss_of(torch.tensor(x), rw)
    rloss.backward()
    np.testing.assert_allclose(loss.item(), rloss.item(), rtol=1e-5)
    np.testing.assert_allclose(tw.detach().numpy(), w - rw.grad.numpy(), rtol=1e-4, atol=1e-4)
    ex: Executor = g._cache[g._last_key].executor
    dests = {st[6].op.name: st[7] for st in ex.steps}
    assert dests["split_backward"] is not None, "split_backward allocated its result"
