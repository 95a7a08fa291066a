"""DistributedDataParallel and DistributedSampler, checked against single-process training
on the whole batch."""
import numpy as np
import pytest

import tessera
import tessera.distributed as dist
from tessera import nn
from tessera.nn.parallel import DistributedDataParallel as DDP
from tessera.utils.data import DataLoader, DistributedSampler, TensorDataset
from tests.distributed._helpers import run

rng = np.random.default_rng(0)
X = rng.standard_normal((16, 6)).astype(np.float32)
Y = rng.standard_normal((16, 3)).astype(np.float32)


def _model():
    tessera.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _train(model, batches, steps_per_batch=1, lr=0.1, set_to_none=True):
    opt = tessera.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for x, y in batches:
        for _ in range(steps_per_batch):
            opt.zero_grad(set_to_none=set_to_none)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def _ddp_body(bucket_cap_mb=None, epochs=2, batch=8, as_view=False, set_to_none=True):
    n = dist.get_world_size()
    model = DDP(_model(), bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=as_view)
    data = TensorDataset(tessera.tensor(X), tessera.tensor(Y))
    sampler = DistributedSampler(data, shuffle=False)
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        # contiguous shares: rank r takes rows r, r+n, ...; the whole batch is the same rows
        loader = DataLoader(data, batch_size=batch // n, sampler=sampler)
        for x, y in loader:
            local = _train(model, [(x, y)], set_to_none=set_to_none)[0]
            t = tessera.tensor([local])
            dist.all_reduce(t)
            losses.append(t.item() / n)
    if as_view:  # every gradient is its bucket's memory
        buffers = [b.buffer for b in model._buckets]
        assert all(any(np.shares_memory(p.grad.numpy(), b) for b in buffers)
                   for p in model.module.parameters())
    return losses, [p.detach().numpy().copy() for p in model.module.parameters()], \
        len(model._buckets)


def _single_strided(epochs=2, batch=8, n=2):
    """One process on the same global batches DistributedSampler deals out."""
    model = _model()
    losses = []
    order = [i for r in range(n) for i in range(r, 16, n)]
    per = batch // n
    for _ in range(epochs):
        for k in range(16 // batch):
            rows = [order[r * (16 // n) + k * per + j] for r in range(n) for j in range(per)]
            losses += _train(model, [(tessera.tensor(X[rows]), tessera.tensor(Y[rows]))])
    return losses, [p.detach().numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("bucket_cap_mb, as_view, set_to_none", [
    (None, False, True), (1e-4, False, True),
    # gradient_as_bucket_view: gradients made afresh each step (zero_grad's default), and
    # accumulated into the buckets' memory (zero_grad(set_to_none=False))
    (None, True, True), (None, True, False), (1e-4, True, False)])
def test_ddp_matches_single_process(bucket_cap_mb, as_view, set_to_none):
    want_losses, want_params = _single_strided()
    res = run(2, _ddp_body, bucket_cap_mb, as_view=as_view, set_to_none=set_to_none)
    for losses, params, nbuckets in res:
        np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)
    assert res[0][2] == (1 if bucket_cap_mb is None else 4)


def test_ddp_broadcasts_rank0_parameters_and_averages():
    def body():
        r = dist.get_rank()
        tessera.manual_seed(r)  # different initial weights on each rank
        lin = nn.Linear(2, 1)
        model = DDP(lin)
        w0 = lin.weight.detach().numpy().copy()
        x = tessera.full((1, 2), float(r + 1))
        model(x).sum().backward()
        return w0, lin.weight.grad.numpy()
    (w0, g0), (w1, g1) = run(2, body)
    np.testing.assert_array_equal(w0, w1)
    np.testing.assert_allclose(g0, [[1.5, 1.5]]) and np.testing.assert_allclose(g1, g0)


def test_no_sync_accumulates_then_averages():
    def body():
        r = dist.get_rank()
        lin = nn.Linear(2, 1, bias=False)
        model = DDP(lin)
        with model.no_sync():
            model(tessera.full((1, 2), float(r))).sum().backward()
        local = lin.weight.grad.numpy().copy()
        model(tessera.full((1, 2), 1.0)).sum().backward()
        return local, lin.weight.grad.numpy()
    (l0, g0), (l1, g1) = run(2, body)
    np.testing.assert_allclose(l0, [[0, 0]]) and np.testing.assert_allclose(l1, [[1, 1]])
    np.testing.assert_allclose(g0, [[1.5, 1.5]]) and np.testing.assert_allclose(g1, g0)


class _Layouts(nn.Module):
    """The same function and weight values; with ``transposed`` the weight is stored
    column-major, and its gradient follows the weight's layout (PyTorch's gradient layout
    contract), so DDP sees a transposed gradient."""

    def __init__(self, transposed: bool):
        super().__init__()
        tessera.manual_seed(0)
        w = tessera.randn(3, 4)
        self.w = nn.Parameter(w.t().contiguous().t() if transposed else w)
        self.transposed = transposed

    def forward(self, x):
        return x @ self.w.T


LAYOUT_XS = [np.arange(8.0, dtype=np.float32).reshape(2, 4) + r for r in range(2)]


def _layouts_body(mixed: bool):
    """Two steps; rank 1's gradient is C-contiguous when ``mixed``, transposed otherwise."""
    r = dist.get_rank()
    model = DDP(_Layouts(transposed=r == 0 or not mixed))
    grads, buffers = [], []
    for step in range(2):
        model.module.w.grad = None
        (model(tessera.tensor(LAYOUT_XS[r] * (step + 1))) ** 2).sum().backward()
        grads.append(model.module.w.grad.numpy().copy())
        buffers.append(model._buckets[0].buffer)
    return grads, buffers[0] is buffers[1], model._buckets[0].reversed


def check_layouts(results, mixed: bool):
    for grads, same_buffer, rev in results:
        for step, g in enumerate(grads):
            gs = []
            for r in range(2):
                lin = _Layouts(transposed=True)
                (lin(tessera.tensor(LAYOUT_XS[r] * (step + 1))) ** 2).sum().backward()
                gs.append(lin.w.grad.numpy())
            np.testing.assert_allclose(g, (gs[0] + gs[1]) / 2, rtol=1e-6)
        assert same_buffer and rev == [not mixed]


@pytest.mark.parametrize("mixed", [False, True])
def test_gradient_layouts(mixed):
    """Transposed gradients are averaged in memory order; ranks whose gradients come in
    different layouts still average the same elements, at every step."""
    check_layouts(run(2, _layouts_body, mixed), mixed)


class _Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)

    def forward(self, x, use_b):
        return self.b(self.a(x)) if use_b else self.a(x)


def test_unused_parameters():
    def body(find):
        r = dist.get_rank()
        model = DDP(_Branchy(), find_unused_parameters=find)
        model(tessera.ones(1, 2), use_b=(r == 0)).sum().backward()
        if find:
            return model.module.a.weight.grad.numpy(), model.module.b.weight.grad.numpy()
        model(tessera.ones(1, 2), use_b=True)
    (a0, b0), (a1, b1) = run(2, body, True)
    np.testing.assert_allclose(a0, a1) and np.testing.assert_allclose(b0, b1)
    assert np.abs(b0).sum() > 0
    with pytest.raises(RuntimeError, match="find_unused_parameters=True"):
        run(2, body, False)


def test_distributed_sampler_matches_pytorch():
    torch_data = pytest.importorskip("torch.utils.data")
    for n, reps, shuffle, drop in [(5, 2, False, False), (5, 2, False, True), (3, 4, False, False),
                                   (11, 3, False, True)]:
        for r in range(reps):
            mine = list(DistributedSampler(range(n), reps, r, shuffle=shuffle, drop_last=drop))
            theirs = list(torch_data.DistributedSampler(range(n), reps, r, shuffle=shuffle,
                                                        drop_last=drop))
            assert mine == theirs
    shares = [list(DistributedSampler(range(10), 3, r, seed=4)) for r in range(3)]
    assert len({i for s in shares for i in s}) == 10 and all(len(s) == 4 for s in shares)
    s = DistributedSampler(range(10), 2, 0)
    first = list(s)
    s.set_epoch(1)
    assert list(s) != first
    with pytest.raises(ValueError, match="Invalid rank 2"):
        DistributedSampler(range(4), 2, 2)


def _view_steps_body(transposed: bool):
    """Three steps of gradient_as_bucket_view, gradients set to None before each: a no_sync
    backward and a synchronized one, then a synchronized one alone. Returns the last
    averaged gradient, whether .grad was the bucket's memory after each synchronized
    backward, and whether the last one's gradient was stored straight into it (take)."""
    r = dist.get_rank()
    model = DDP(_Layouts(transposed), gradient_as_bucket_view=True)
    w, out = model.module.w, []
    for step in range(3):
        w.grad = None
        with model.no_sync():
            (model(tessera.tensor(LAYOUT_XS[r] * (step + 1))) ** 2).sum().backward()
        (model(tessera.tensor(LAYOUT_XS[1 - r] + step)) ** 2).sum().backward()
        in_bucket = np.shares_memory(w.grad.numpy(), model._buckets[0].buffer)
        w.grad = None  # a synchronized backward alone: AccumulateGrad hands it to the bucket
        (model(tessera.tensor(LAYOUT_XS[r] - step)) ** 2).sum().backward()
        out.append((w.grad.numpy().copy(), in_bucket, model._buckets[0].held[0] is not None,
                    np.shares_memory(w.grad.numpy(), model._buckets[0].buffer)))
    return out


@pytest.mark.parametrize("transposed", [False, True])
def test_bucket_view_takes_gradients(transposed):
    """With gradient_as_bucket_view the first gradient of a synchronized backward goes
    straight into its bucket (divided there); accumulated gradients (no_sync) still average
    as in one process, in either gradient layout."""
    def grad(x):
        lin = _Layouts(transposed)
        (lin(tessera.tensor(x)) ** 2).sum().backward()
        return lin.w.grad.numpy()
    results = run(2, _view_steps_body, transposed)
    for step in range(3):
        alone = sum(grad(LAYOUT_XS[r] - step) for r in range(2)) / 2
        for out in results:
            g, in_bucket, taken, alone_in_bucket = out[step]
            np.testing.assert_allclose(g, alone, rtol=1e-6)
            # taken from the second reduction on (the first agrees the layouts)
            assert in_bucket and alone_in_bucket and taken
    # the accumulated step's gradient, checked through a second run's first half
    res = run(2, _accumulated_body, transposed)
    for g in res:
        np.testing.assert_allclose(g, sum(grad(x) for x in [LAYOUT_XS[r] for r in range(2)]
                                          + [LAYOUT_XS[1 - r] for r in range(2)]) / 2,
                                   rtol=1e-6)


def _accumulated_body(transposed: bool):
    r = dist.get_rank()
    model = DDP(_Layouts(transposed), gradient_as_bucket_view=True)
    for step in range(2):  # the second step runs with take() on
        model.module.w.grad = None
        with model.no_sync():
            (model(tessera.tensor(LAYOUT_XS[r])) ** 2).sum().backward()
        (model(tessera.tensor(LAYOUT_XS[1 - r])) ** 2).sum().backward()
    return model.module.w.grad.numpy().copy()
