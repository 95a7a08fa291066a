"""The C kernel threads (tessera.kernels.threadpool): every part runs once, with its own result."""
import ctypes
import threading

import numpy as np
import pytest

import tessera
from tessera.kernels import cc, threadpool as pool

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")

_SOURCE = r"""
#include <pthread.h>
#include <stdint.h>
/* adds i + 1 into cell i of a counter array, returns -i: parts that run twice or never,
   or results returned for another part, show */
int64_t mark(int64_t* cells, int64_t i) { cells[i] += i + 1; return -i; }
int neg32(int64_t v) { return (int)-v; }
void twelve(int64_t* out, int64_t a, int64_t b, int64_t c, int64_t d, int64_t e, int64_t f,
            int64_t g, int64_t h, int64_t i, int64_t j, int64_t k) {
    *out = a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h + 9 * i + 10 * j + 11 * k;
}
double half(double x) { return x / 2; }
/* the thread a part runs on */
int64_t thread_of(int64_t unused) { (void)unused; return (int64_t)pthread_self(); }
/* blocks [lo, hi) of a range kernel: cell i gets i + 1; block 5 fails (returns -2) */
int64_t blocks(int64_t* cells, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) cells[i] += i + 1;
    return lo <= 5 && 5 < hi ? -2 : 0;
}
"""


@pytest.fixture(scope="module")
def lib():
    lib = cc.load(_SOURCE)
    lib.mark.argtypes, lib.mark.restype = [ctypes.c_void_p, ctypes.c_int64], ctypes.c_int64
    lib.neg32.argtypes, lib.neg32.restype = [ctypes.c_int64], ctypes.c_int
    lib.twelve.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 11
    lib.twelve.restype = None
    lib.half.argtypes, lib.half.restype = [ctypes.c_double], ctypes.c_double
    lib.blocks.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.blocks.restype = ctypes.c_int64
    lib.thread_of.argtypes, lib.thread_of.restype = [ctypes.c_int64], ctypes.c_int64
    return lib


@pytest.fixture
def two_threads():
    before = tessera.get_num_threads()
    tessera.set_num_threads(2)
    yield
    tessera.set_num_threads(before)


@pytest.mark.parametrize("n", [1, 2, 3, 64, 1000])
def test_every_part_runs_once_with_its_own_result(lib, two_threads, n):
    cells = np.zeros(n, np.int64)
    got = pool.run(lib.mark, [(cells.ctypes.data, i) for i in range(n)])
    assert got == [-i for i in range(n)]
    assert cells.tolist() == list(range(1, n + 1))


@pytest.mark.parametrize("n,error", [(1, 0), (5, 0), (6, -2), (64, -2)])
def test_run_blocks_runs_each_block_once_and_reports_a_failure(lib, two_threads, n, error):
    cells = np.zeros(n, np.int64)
    assert pool.run_blocks(lib.blocks, cells.ctypes.data, n, 2) == error
    assert cells.tolist() == list(range(1, n + 1))


@pytest.mark.parametrize("n", [1, 2, 7])
def test_the_caller_runs_part_zero(lib, two_threads, n):
    # (a product split one part per thread then keeps each share on one core)
    caller = pool.run(lib.thread_of, [(0,)])   # one part: the caller's
    for _ in range(20):
        assert pool.run(lib.thread_of, [(i,) for i in range(n)])[0] == caller[0]


def test_narrow_results_keep_their_sign(lib, two_threads):
    assert pool.run(lib.neg32, [(5,), (-7,), (0,)]) == [-5, 7, 0]


def test_functions_of_many_arguments(lib, two_threads):
    out = np.zeros(2, np.int64)
    parts = [(out.ctypes.data + 8 * j, *range(j, j + 11)) for j in range(2)]
    assert pool.run(lib.twelve, parts) == [None, None]
    want = [sum((k + 1) * (j + k) for k in range(11)) for j in range(2)]
    assert out.tolist() == want


def test_calls_it_cannot_make_are_declined(lib, two_threads):
    assert pool.run(lib.half, [(1.0,), (2.0,)]) is None  # a double parameter
    assert pool.run(lambda a: a, [(1,), (2,)]) is None   # not a C function


def test_concurrent_jobs_from_several_threads(lib, two_threads):
    cells = [np.zeros(200, np.int64) for _ in range(4)]
    errors = []

    def job(c):
        for _ in range(50):
            if pool.run(lib.mark, [(c.ctypes.data, i) for i in range(200)]) != \
                    [-i for i in range(200)]:
                errors.append("wrong results")
    threads = [threading.Thread(target=job, args=(c,)) for c in cells]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for c in cells:
        assert c.tolist() == [50 * (i + 1) for i in range(200)]


def test_one_thread_runs_every_part_on_the_caller(lib):
    before = tessera.get_num_threads()
    tessera.set_num_threads(1)
    try:
        cells = np.zeros(5, np.int64)
        got = pool.run(lib.mark, [(cells.ctypes.data, i) for i in range(5)])
        assert got is None or got == [0, -1, -2, -3, -4]
        if got is not None:
            assert cells.tolist() == [1, 2, 3, 4, 5]
    finally:
        tessera.set_num_threads(before)


def test_batched_products_on_the_pool_match_numpy(two_threads):
    from tessera.kernels import bmm as _bmm
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 16, 24)).astype(np.float32)
    b = rng.standard_normal((37, 24, 8)).astype(np.float32)
    got = _bmm.matmul(a, b)
    if got is not None:
        np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_graph_step_is_the_same_on_any_thread_count(threads):
    """More kernel threads than cores (workers started on demand, parts taken by whoever
    comes first) give the same step as one thread: the parts' results do not depend on
    which thread ran them."""
    before = tessera.get_num_threads()
    nn = tessera.nn

    def run():
        tessera.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 1),
                              nn.GELU(), nn.Flatten(), nn.Linear(32 * 20 * 20, 10))

        class Step(nn.Graph):
            def __init__(self):
                super().__init__()
                self.model = model

            def build(self, x):
                return self.model(x).softmax(-1)
        x = tessera.from_numpy(np.random.default_rng(0).standard_normal(
            (4, 3, 20, 20)).astype(np.float32))
        return Step()(x).numpy()
    try:
        tessera.set_num_threads(1)
        want = run()
        tessera.set_num_threads(threads)
        np.testing.assert_allclose(run(), want, rtol=1e-5, atol=1e-6)
    finally:
        tessera.set_num_threads(before)
