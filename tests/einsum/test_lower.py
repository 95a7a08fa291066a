"""The einsum kernel's fast paths: the per-layout plan cache, the tuned matrix product
(``_lower._Tuned``) and the C batched product on the kernel threads (``_bmm``)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import tessera
from tessera.kernels import bmm as _bmm
from tessera.ops.einsum import _lower

EQ = "bhqd,bhkd->bhqk"


def _need_bmm():
    """Skip where the small-GEMM kernel cannot exist (no compiler, no OpenBLAS C can call,
    one thread); anywhere else it must have built (it turns itself off quietly, so a
    broken build would otherwise hide behind a skip)."""
    from tessera.kernels import cc
    from tessera.kernels.conv import _blas
    from tessera.kernels.threadpool import _threads
    if cc.compiler() is None or _blas() is None or _threads() < 2:
        pytest.skip("no C compiler, no OpenBLAS C can call, or one thread")
    assert _bmm._lib() is not None, "einsum's small-GEMM kernel failed to build"


def _layouts(shape, dtype, rng):
    """The same values as a contiguous array, a transposed copy seen back in order, a
    reversed view and a strided slice: equal shapes, different strides."""
    x = rng.standard_normal(shape).astype(dtype)
    t = np.ascontiguousarray(np.swapaxes(x, -1, -2)).swapaxes(-1, -2)
    r = np.ascontiguousarray(x[::-1])[::-1]
    wide = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
    wide[..., ::2] = x
    return x, [x, t, r, wide[..., ::2]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.complex64])
def test_plan_cache_follows_strides_and_dtypes(dtype):
    """One equation and one set of shapes, operands laid out four ways and in four
    dtypes, called in turn: every call must use the plan of its own layout."""
    rng = np.random.default_rng(0)
    a, la = _layouts((2, 3, 5, 4), dtype, rng)
    b, lb = _layouts((2, 3, 6, 4), dtype, rng)
    ref = np.einsum(EQ, a, b)
    for _ in range(2):  # the second round hits the cache
        for x in la:
            for y in lb:
                out = tessera.einsum(EQ, tessera.from_numpy(x), tessera.from_numpy(y))
                np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_plan_cache_keys_layouts_apart():
    rng = np.random.default_rng(1)
    a, la = _layouts((4, 8), np.float64, rng)
    b, lb = _layouts((8, 3), np.float64, rng)
    before = len(_lower._RUNNERS)
    _lower._RUNNERS.clear()
    for x in la:
        np.testing.assert_allclose(_lower.run("ij,jk->ik", (x, b), ((0, 1),)), a @ b)
    np.testing.assert_allclose(_lower.run("ij,jk->ik", (a.astype(np.float32), b), ((0, 1),)),
                               a @ b, rtol=1e-5)
    assert len(_lower._RUNNERS) == 5 or before == 0


def test_result_never_aliases_an_input():
    a = np.arange(6.0).reshape(2, 3)
    for _ in range(3):
        out = _lower.run("ij->ij", (a,), ())
        assert not np.shares_memory(out, a)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nb,m,k,n", [(8, 64, 32, 64), (2, 1, 5, 7), (3, 7, 1, 2),
                                      (5, 16, 16, 16), (64, 3, 4, 5), (2, 4, 0, 3),
                                      (0, 4, 2, 3)])
def test_bmm_matches_numpy(dtype, nb, m, k, n):
    _need_bmm()
    rng = np.random.default_rng(2)
    a = rng.standard_normal((nb, m, k)).astype(dtype)
    b = rng.standard_normal((nb, k, n)).astype(dtype)
    at = np.ascontiguousarray(a.swapaxes(1, 2)).swapaxes(1, 2)
    bt = np.ascontiguousarray(b.swapaxes(1, 2)).swapaxes(1, 2)
    for x in (a, at, a[::-1]):
        for y in (b, bt, b[::-1]):
            got = _bmm.matmul(x, y)
            if nb < 2 or m * n <= 1:
                assert got is None
                continue
            np.testing.assert_allclose(got, np.matmul(x, y), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(_bmm.bind(x, y)(x, y), got)


def test_bmm_declines_what_it_cannot_run():
    a = np.ones((4, 8, 8), np.float32)
    assert _bmm.matmul(a.astype(np.int32), a.astype(np.int32)) is None   # not float
    assert _bmm.matmul(a, a.astype(np.float64)) is None                 # mixed dtypes
    assert _bmm.matmul(a[:, ::2, ::2], a[:, :4, :4]) is None            # no unit stride
    big = np.ones((2, 128, 128), np.float32)
    assert _bmm.matmul(big, big) is None                  # OpenBLAS threads each itself


@pytest.mark.parametrize("m,k,n", [(128, 64, 128), (16, 8, 16), (100, 33, 70)])
def test_stacked_products_match_numpy(m, k, n):
    """matmul's batched path: 4-d stacks (batch dims merged without a copy) of strided rows
    and of transposed matrices, into ``out`` or not, products above OpenBLAS's threading threshold
    with BLAS held single-threaded and given back its threads afterwards."""
    _need_bmm()
    from tessera.kernels.conv import _blas
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 4, m, 2 * k)).astype(np.float32)[..., :k]   # rows strided
    b = rng.standard_normal((3, 4, k, n)).astype(np.float32)
    bt = np.ascontiguousarray(b.swapaxes(-1, -2)).swapaxes(-1, -2)       # columns unit
    threads = _blas().get_threads()
    for y in (b, bt):
        ref = np.matmul(a, y)
        got = _bmm.stacked(a, y)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        out = np.empty(ref.shape, np.float32)
        assert _bmm.stacked(a, y, out) is out
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
        t = tessera.matmul(tessera.from_numpy(a), tessera.from_numpy(y))
        np.testing.assert_allclose(t.numpy(), ref, rtol=1e-4, atol=1e-4)
    assert _blas().get_threads() == threads


def test_stacked_output_over_an_operand_is_numpys():
    """A memory plan may put a product's output over an operand that dies there: the C
    product would overwrite what it still reads, so NumPy's matmul (which copies) runs."""
    _need_bmm()
    rng = np.random.default_rng(6)
    buf = rng.standard_normal((2 * 4 * 16 * 16,)).astype(np.float32)
    a = buf.reshape(2, 4, 16, 16)
    b = rng.standard_normal((2, 4, 16, 16)).astype(np.float32)
    want = np.matmul(a, b)
    assert _bmm.stacked(a, b, a) is None
    from tessera.ops.linalg import _matmul_kernel
    np.testing.assert_allclose(_matmul_kernel(a, b, out=a), want, rtol=1e-5, atol=1e-5)


def test_stacked_declines_what_it_cannot_run():
    a = np.ones((2, 3, 8, 8), np.float32)
    assert _bmm.stacked(a, a[:1]) is None                              # broadcast batch
    assert _bmm.stacked(a, np.ones((2, 3, 7, 8), np.float32)) is None   # inner dims differ
    assert _bmm.stacked(a, a, np.empty((2, 3, 8, 8), np.float64)) is None
    assert _bmm.stacked(a, a, np.empty((2, 3, 8, 8), np.float32).transpose(0, 1, 3, 2)) is None
    assert _bmm.stacked(a[:, :, :, ::2], a[:, :, :4]) is None          # no unit stride
    assert _bmm.stacked(a.transpose(1, 0, 2, 3), a) is None            # batch not one view
    assert _bmm.stacked(a[:0], a[:0]) is None                          # empty: NumPy's
    big = np.ones((2, 256, 256), np.float32)
    assert _bmm.stacked(big, big) is None                # above STACK_MAX: OpenBLAS threads


def test_bmm_from_many_python_threads():
    """Concurrent callers: one holds the kernel threads, the others run alone."""
    _need_bmm()
    rng = np.random.default_rng(3)
    a = rng.standard_normal((8, 16, 8)).astype(np.float32)
    b = rng.standard_normal((8, 8, 16)).astype(np.float32)
    ref = np.matmul(a, b)
    bad = []

    def loop():
        for _ in range(300):
            if not np.allclose(_bmm.matmul(a, b), ref, rtol=1e-5, atol=1e-5):
                bad.append(1)

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


@pytest.mark.parametrize("faster", [0, 1])
def test_tuned_takes_the_faster_way_and_both_agree(monkeypatch, faster):
    """A fake clock makes way ``faster`` cheaper: the tuner must settle on it, probe the
    other now and then, and every call must give NumPy's result."""
    _need_bmm()
    ways = []
    alt, default = _bmm.matmul, np.matmul

    def fake_alt(a, b):
        ways.append(0)
        return alt(a, b)

    def fake_default(a, b):
        ways.append(1)
        return default(a, b)

    ticks = iter(range(10**9))

    def clock():  # each call costs 1 tick on the faster way, 10 on the other
        return next(ticks) * (1 if not ways or ways[-1] == faster else 10)

    monkeypatch.setattr(_lower, "_default", lambda a, b: fake_default)
    monkeypatch.setattr(_lower, "_clock", clock)
    monkeypatch.setattr(_lower, "_EXPLORE", 4)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((4, 8, 6)).astype(np.float32)
    b = rng.standard_normal((4, 6, 8)).astype(np.float32)
    tuned = _lower._Tuned()
    monkeypatch.setattr(_lower, "_alternative", lambda a, b: fake_alt)
    for _ in range(200):
        np.testing.assert_allclose(tuned(a, b), np.matmul(a, b), rtol=1e-5, atol=1e-5)
    assert tuned.best == faster
    assert ways[-50:].count(faster) > 40 and 1 - faster in ways[-150:]


def test_single_threaded_gemm_matches():
    if _lower._blas_local() is None:
        pytest.skip("NumPy's BLAS is not OpenBLAS >= 0.3.27")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((1, 200, 100)).astype(np.float32)
    b = rng.standard_normal((1, 100, 200)).astype(np.float32)
    assert _lower._alternative(a, b) is _lower._single_threaded
    np.testing.assert_allclose(_lower._single_threaded(a, b), np.matmul(a, b), rtol=1e-4,
                               atol=1e-4)


def test_broadcast_and_reversed_operands():
    """Stride-0 (expanded) and reversed operands: BLAS cannot read them as they are."""
    rng = np.random.default_rng(6)
    row = rng.standard_normal((1, 1, 6)).astype(np.float32)
    a = np.broadcast_to(row, (4, 5, 6))                  # every row the same, stride 0
    b = rng.standard_normal((4, 6, 3)).astype(np.float32)
    for x, y in ((a, b), (b.transpose(0, 2, 1)[:, ::-1], a.transpose(0, 2, 1)),
                 (a, b[:, ::-1])):
        got = _bmm.matmul(x, y)
        if got is not None:
            np.testing.assert_allclose(got, np.matmul(x, y), rtol=1e-5, atol=1e-5)
        out = tessera.einsum("bij,bjk->bik", tessera.from_numpy(np.ascontiguousarray(x)),
                             tessera.from_numpy(np.ascontiguousarray(y)))
        np.testing.assert_allclose(out.numpy(), np.matmul(x, y), rtol=1e-5, atol=1e-5)
    t = tessera.from_numpy(row).expand(4, 5, 6)
    out = tessera.einsum("bij,bjk->bik", t, tessera.from_numpy(b))
    np.testing.assert_allclose(out.numpy(), np.matmul(a, b), rtol=1e-5, atol=1e-5)
