"""max_pool_values: max pooling without indices, chosen when nothing reads them (eager
inference, and the graph compiler's rewrite of max_pool whose indices are unused)."""
import numpy as np
import pytest
import torch

import tessera
from tessera.ops.pool import max_pool_values

CASES = [((2, 3, 9, 11), 3, 2, 1, False), ((2, 3, 9, 11), 3, 2, 1, True),
         ((1, 2, 7, 7), 3, 3, 1, True), ((2, 2, 10, 10), (2, 3), (1, 2), (1, 1), False),
         ((3, 4, 28, 28), 2, 2, 0, False), ((1, 1, 5, 5), 5, 1, 2, False)]


def _attrs(k, s, p):
    t = lambda v: (v, v) if isinstance(v, int) else tuple(v)
    return dict(kernel_size=t(k), stride=t(s), padding=t(p), dilation=(1, 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,k,s,p,ceil", CASES)
def test_values_and_gradient_match_torch(shape, k, s, p, ceil, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(dtype)
    x[0, 0, 0, :3] = np.nan  # a NaN wins its windows, as in PyTorch
    x[-1, -1, 1] = 0.5       # ties
    g = rng.standard_normal(torch.nn.functional.max_pool2d(
        torch.from_numpy(x), k, s, p, ceil_mode=ceil).shape).astype(dtype)
    tx = torch.from_numpy(x).requires_grad_()
    ty = torch.nn.functional.max_pool2d(tx, k, s, p, ceil_mode=ceil)
    ty.backward(torch.from_numpy(g))
    xx = tessera.from_numpy(x).requires_grad_()
    y = max_pool_values(xx, **_attrs(k, s, p), ceil_mode=ceil)
    y.backward(tessera.from_numpy(g))
    np.testing.assert_array_equal(y.detach().numpy(), ty.detach().numpy())
    np.testing.assert_allclose(xx.grad.numpy(), tx.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_each_op_records_its_own_backward():
    x = tessera.randn(1, 1, 4, 4)
    xr = x.clone().requires_grad_()
    # with a gradient to come, the op that keeps indices; else the values-only op
    assert repr(tessera.nn.functional.max_pool2d(xr, 2).grad_fn).startswith("<MaxPoolBackward")
    y = tessera.nn.functional.max_pool2d(xr.detach().requires_grad_(), 2, return_indices=True)
    assert repr(y[0].grad_fn).startswith("<MaxPoolBackward")
    y = max_pool_values(xr, **_attrs(2, 2, 0), ceil_mode=False)
    assert repr(y.grad_fn).startswith("<MaxPoolValuesBackward")


def test_graph_rewrites_max_pool_with_unused_indices():
    class Net(tessera.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = tessera.nn.Conv2d(1, 2, 3)

        def forward(self, x):
            return tessera.nn.functional.max_pool2d(self.conv(x).relu(), 2)

    class Infer(tessera.nn.Graph):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def build(self, x):
            return self.m(x)

    class Train(Infer):
        def build(self, x):
            y = self.m(x).sum()
            y.backward()
            return y

    net, x = Net(), tessera.randn(2, 1, 10, 10)
    g = Infer(net.eval())
    np.testing.assert_allclose(g(x).numpy(), net(x).detach().numpy(), rtol=1e-6)
    ops = {n.op.name for n in g.ir.nodes}
    assert "max_pool_values" in ops and "max_pool" not in ops
    t = Train(net.train())
    t.add_optimizer(tessera.optim.SGD(net.parameters(), lr=0.1))  # backward is live
    t(x)
    ops = {n.op.name for n in t.ir.nodes}
    assert "max_pool" in ops and "max_pool_values" not in ops  # backward reads the indices
