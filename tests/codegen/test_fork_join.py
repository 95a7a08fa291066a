"""Kernel parts whose pool thread has not started run on the caller: same results, no wait."""
import threading

import numpy as np
import pytest

import tessera
from tessera.kernels import threadpool as runtime


@pytest.fixture
def busy_pool():
    """Two kernel threads, and every pool thread blocked until the test ends: the parts
    fork_join hands to the pool can only run if the caller takes them back."""
    before = tessera.get_num_threads()
    tessera.set_num_threads(2)
    gate = threading.Event()
    pool = runtime._pool()
    blockers = [pool.submit(gate.wait) for _ in range(pool._max_workers)]
    yield
    gate.set()
    for b in blockers:
        b.result()
    tessera.set_num_threads(before)


def _within(seconds, fn):
    """fn()'s result, failing (not hanging) if it has not returned within ``seconds``: a
    join that waited for the blocked pool would never return."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"did not finish within {seconds} s: waiting for a pool thread that never ran"
    return out[0]


def test_parts_run_in_order_and_return_their_results():
    assert runtime.fork_join(lambda a, b: a * b, [(2, 3), (4, 5), (6, 7)]) == [6, 20, 42]


def test_a_part_whose_thread_never_starts_runs_on_the_caller(busy_pool):
    ran_on = []

    def part(i):
        ran_on.append(threading.get_ident())
        return i * 10
    caller = []

    def run():
        caller.append(threading.get_ident())
        return runtime.fork_join(part, [(0,), (1,), (2,)])
    assert _within(60, run) == [0, 10, 20]
    assert set(ran_on) == set(caller)


def test_split_elementwise_kernel_with_a_busy_pool(busy_pool):
    x = np.random.default_rng(0).standard_normal(1 << 21).astype(np.float32)
    got = _within(60, lambda: tessera.sigmoid(tessera.from_numpy(x)).numpy())
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)


@pytest.mark.parametrize("batch,channels,size,k", [(1, 64, 28, 3), (4, 32, 14, 3), (2, 16, 12, 1)])
def test_threaded_convolution_and_gradients_with_a_busy_pool(busy_pool, batch, channels, size, k):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, channels, size, size)).astype(np.float32)
    w = rng.standard_normal((2 * channels, channels, k, k)).astype(np.float32) / 8
    tx, tw = tessera.tensor(x, requires_grad=True), tessera.tensor(w, requires_grad=True)

    def forward_backward():
        y = tessera.nn.functional.conv2d(tx, tw, padding=k // 2)
        y.sum().backward()
        return y
    y = _within(60, forward_backward)
    rx, rw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ry = torch.nn.functional.conv2d(rx, rw, padding=k // 2)
    ry.sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), ry.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tw.grad.numpy(), rw.grad.numpy(), rtol=1e-4, atol=1e-3)
