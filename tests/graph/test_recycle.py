"""Large graph outputs reuse the previous step's buffer only once the caller dropped it."""
import numpy as np
import pytest

import tessera
from tessera.graph.recycle import MIN_BYTES, Recycler, recycled

N = MIN_BYTES // 4 * 2  # float32 elements: twice the size that recycling starts at


class Chain(tessera.nn.Graph):
    def build(self, x):
        return tessera.sigmoid(x * 2.0 + 1.0)


def _x(seed):
    return tessera.from_numpy(np.random.default_rng(seed).standard_normal(N, dtype=np.float32))


def _expected(x):
    return 1 / (1 + np.exp(-(x.numpy().astype(np.float64) * 2 + 1)))


def test_kept_outputs_are_never_overwritten():
    g, xs = Chain(), [_x(s) for s in range(4)]
    ys = [g(x) for x in xs]  # every output kept: each step needs fresh memory
    assert len({y.data_ptr() for y in ys}) == len(ys)
    for x, y in zip(xs, ys):
        np.testing.assert_allclose(y.numpy(), _expected(x), rtol=1e-6)


def test_a_dropped_output_lends_its_buffer_to_the_next_step():
    g, x = Chain(), _x(0)
    y = g(x)
    ptr = y.data_ptr()
    del y
    y = g(_x(1))
    assert y.data_ptr() == ptr and recycled(y.numpy())
    np.testing.assert_allclose(y.numpy(), _expected(_x(1)), rtol=1e-6)


def test_a_view_keeps_the_buffer_leased():
    g, x = Chain(), _x(0)
    y = g(x)
    head = y[:10]  # a view: the buffer must stay the caller's
    want = head.numpy().copy()
    del y
    g(_x(1))
    g(_x(2))
    np.testing.assert_array_equal(head.numpy(), want)


def test_small_outputs_are_not_pooled():
    g = Chain()
    y = g(tessera.ones(8))
    assert not recycled(y.numpy())


@pytest.mark.parametrize("shape,dtype", [((3, 4), np.float32), ((5,), np.float64), ((), np.int64)])
def test_recycler_hands_out_arrays_of_its_kind(shape, dtype):
    r = Recycler(shape, dtype)
    a = r.take()
    assert a.shape == shape and a.dtype == dtype and a.flags.writeable and a.flags.c_contiguous
    a[...] = 7
    assert (a == 7).all()


def test_outputs_start_on_a_cache_line():
    r = Recycler((1000,), np.float32)
    assert all(r.take().ctypes.data % 64 == 0 for _ in range(3))


class TwoViews(tessera.nn.Graph):
    def build(self, x):
        y = tessera.exp(x * 0.5)
        return y, y.view(2, -1), y


def test_a_result_returned_with_its_view_and_twice():
    g, x = TwoViews(), _x(0)
    a, b, c = g(x)
    want = np.exp(x.numpy().astype(np.float64) * 0.5)
    for t in (a, b.reshape(-1), c):
        np.testing.assert_allclose(t.numpy(), want, rtol=1e-6)
    keep = a.numpy().copy()
    del b, c
    g(_x(1))   # a is still alive: the next step must not write into its buffer
    np.testing.assert_array_equal(a.numpy(), keep)
