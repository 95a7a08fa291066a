"""The shared-memory all-reduce of reduce buffers (comm/shm.py) under real MPI: the same
results as the reference reduction, and DDP on it the same as one process."""
import numpy as np
import pytest

from tests.distributed._mpi import outputs, run_mpi
from tests.distributed.test_ddp import _single_strided

ALL_REDUCE = """
    import numpy as np
    from tessera.distributed import comm as C
    from tests.distributed._mpi import emit
    comm = C.current()
    r, n = comm.rank, comm.world_size
    out = []
    # the whole world and a sub-group; sizes below, at and above the number of ranks
    for group in [None, (0, n - 1)]:
        if group is not None and r not in group:
            continue
        for dtype in (np.float32, np.float64, np.int64):
            for count in (1, 2, 7, 1000):
                buf = comm.reduce_buffer(count, dtype, group)
                for op in ("sum", "avg", "max", "min", "prod"):
                    for step in range(3):  # refilled right after each wait
                        buf[:] = (np.arange(count) % 5 + r + step + 1).astype(dtype)
                        before = buf.copy()
                        got = comm.iall_reduce_(buf, group, op).wait()
                        assert got is buf
                        out.append((group, np.dtype(dtype).name, count, op, step,
                                    before, buf.copy()))
    g = tuple(range(n))
    emit((out, comm.name == "mpi" and comm._shm.get(g) is not None and
          comm._shm[g].owns(comm.reduce_buffer(4, np.float32))))
"""


def _check_all_reduce(results, shared: bool) -> None:
    from tessera.distributed.comm import reduce_arrays
    n = len(results)
    for out, is_shared in results:
        assert is_shared == shared
    by_key: dict = {}
    for rank, (out, _) in enumerate(results):
        for group, dtype, count, op, step, before, after in out:
            by_key.setdefault((group, dtype, count, op, step), []).append((before, after))
    for (group, dtype, count, op, step), pairs in by_key.items():
        assert len(pairs) == (n if group is None else len(group))
        want = reduce_arrays([b for b, _ in pairs], op)
        for _, after in pairs:  # every member holds the same bits
            np.testing.assert_array_equal(after, pairs[0][1])
            np.testing.assert_allclose(after, want, rtol=1e-6)


BLOCKING = """
    import numpy as np
    from tessera.distributed import comm as C
    from tests.distributed._mpi import emit
    comm = C.current()
    r, n = comm.rank, comm.world_size
    out = []
    # 64 KB and more go through the shared scratch buffer: it grows, then serves smaller ones
    for shape in [(100, 200), (300, 300), (17,), (129, 128)]:
        for dtype in (np.float32, np.float16, np.int64):
            for op in ("sum", "avg", "max", "prod"):
                x = ((np.arange(np.prod(shape)) % 7 + r + 1) / (1 if dtype == np.int64 else 4)
                     ).astype(dtype).reshape(shape)
                got = comm.all_reduce(x, None, op)
                out.append((shape, np.dtype(dtype).name, op, x, got))
    # results are the callers' own arrays: a later all-reduce leaves them alone
    assert all(not np.shares_memory(a[4], b[4]) for a, b in zip(out, out[1:]))
    emit(out)
"""


@pytest.mark.parametrize("n", [2, 3])
def test_blocking_all_reduce_through_shared_memory(tmp_path, n):
    from tessera.distributed.comm import reduce_arrays
    run_mpi(tmp_path, BLOCKING, n=n)
    res = outputs(tmp_path, n)
    for k in range(len(res[0])):
        shape, dtype, op, _, got = res[0][k]
        want = reduce_arrays([res[r][k][3] for r in range(n)], op)
        for r in range(n):
            assert res[r][k][4].dtype == want.dtype and res[r][k][4].shape == tuple(shape)
            np.testing.assert_array_equal(res[r][k][4], got)
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=1e-3 if dtype == "float16" else 1e-6)


@pytest.mark.parametrize("n", [2, 3])
def test_shared_all_reduce_matches_the_reference(tmp_path, n):
    run_mpi(tmp_path, ALL_REDUCE, n=n)
    _check_all_reduce(outputs(tmp_path, n), shared=True)


def test_all_reduce_without_shared_memory(tmp_path):
    """TESSERA_SHM_ALLREDUCE=0: plain buffers, MPI's all-reduce, the same results."""
    run_mpi(tmp_path, ALL_REDUCE, n=2, env={"TESSERA_SHM_ALLREDUCE": "0"})
    _check_all_reduce(outputs(tmp_path, 2), shared=False)


@pytest.mark.parametrize("bucket_cap_mb, as_view, set_to_none", [
    (None, False, True), (1e-4, False, True), (None, True, True), (1e-4, True, False)])
def test_ddp_on_shared_buckets_matches_single_process(tmp_path, bucket_cap_mb, as_view,
                                                      set_to_none):
    run_mpi(tmp_path, f"""
        from tessera.distributed import comm as C
        from tests.distributed._mpi import emit
        from tests.distributed import test_ddp
        made = []
        class Keep(test_ddp.DDP):  # the buckets, to check where their buffers live
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                made.append(self)
        test_ddp.DDP = Keep
        losses, params, nb = test_ddp._ddp_body({bucket_cap_mb!r}, as_view={as_view!r},
                                                set_to_none={set_to_none!r})
        red = C.current()._shm[(0, 1)]
        emit((losses, params, nb, all(red.owns(b.buffer) for b in made[0]._buckets)))
    """)
    want_losses, want_params = _single_strided()
    for losses, params, nbuckets, shared in outputs(tmp_path, 2):
        assert shared
        assert nbuckets == (1 if bucket_cap_mb is None else 4)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)


def test_no_room_in_dev_shm_falls_back_to_mpi(tmp_path):
    """When /dev/shm has no room (a container's 64 MB), every rank keeps plain buffers and
    MPI's all-reduce, with the same results."""
    no_room = "\n    from tessera.distributed.comm import shm\n    shm._room = lambda: 0"
    run_mpi(tmp_path, no_room + ALL_REDUCE)
    _check_all_reduce(outputs(tmp_path, 2), shared=False)
    run_mpi(tmp_path, no_room + BLOCKING)
    for a, b in zip(*outputs(tmp_path, 2)):
        np.testing.assert_array_equal(a[4], b[4])
