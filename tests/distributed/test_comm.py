"""Placement, SBP values and the communicators (the in-process FakeWorld; MPI in
test_mpi.py)."""
import numpy as np
import pytest

from tessera.distributed import comm as C
from tessera.distributed.comm.fake import FakeWorld
from tessera.distributed.placement import placement
from tessera.sbp import (
    as_sbp_tuple,
    broadcast,
    partial_sum,
    split,
    split_range,
    split_sizes,
)


def test_placement_values():
    p = placement("cpu", ranks=[0, 1])
    assert p == placement(type="cpu", ranks=[0, 1]) and hash(p) == hash(placement("cpu", [0, 1]))
    assert p != placement("cpu", [1, 0]) and p != placement("cpu", [[0, 1]])
    assert repr(p) == 'tessera.placement(type="cpu", ranks=[0, 1])'
    m = placement("cpu", [[0, 1], [2, 3]])
    assert m.hierarchy == (2, 2) and m.flat_ranks == (0, 1, 2, 3)
    assert m.coords(2) == (1, 0) and m.coords(7) is None
    assert m.group(2, 0) == (0, 2) and m.group(2, 1) == (2, 3)


@pytest.mark.parametrize("ranks, msg", [([], "non-empty"), ([0, 0], "unique"),
                                        ([-1], "non-negative"), ([[0, 1], [2]], "rectangular"),
                                        ([0.5], "non-negative ints")])
def test_placement_errors(ranks, msg):
    with pytest.raises(ValueError, match=msg):
        placement("cpu", ranks)
    with pytest.raises(ValueError, match="not supported"):
        placement("tpu", [0])


def test_sbp_values():
    assert split(0) == split(0) and split(0) != split(1) and broadcast != partial_sum
    assert repr(split(1)) == "tessera.sbp.split(dim=1)" and split(2).short() == "S(2)"
    assert as_sbp_tuple(split(-1), 1, ndim=3) == (split(2),)
    with pytest.raises(ValueError, match=r"S\(3\) is out of range"):
        as_sbp_tuple(split(3), 1, ndim=2)
    with pytest.raises(ValueError, match="2-D mesh"):
        as_sbp_tuple(broadcast, 2)
    with pytest.raises(TypeError, match="tessera.sbp"):
        as_sbp_tuple("B", 1)


def test_uneven_split_rule():
    # OneFlow's rule: the first n % k parts take one more
    assert split_sizes(5, 2) == [3, 2] and split_sizes(7, 3) == [3, 2, 2]
    assert split_sizes(1, 3) == [1, 0, 0]
    assert [split_range(7, 3, i) for i in range(3)] == [(0, 3), (3, 5), (5, 7)]


def _collectives():
    c = C.current()
    r, n = c.rank, c.world_size
    out = {}
    out["all_reduce"] = c.all_reduce(np.array([r + 1.0, 1.0]))
    out["max"] = c.all_reduce(np.array([r]), op="max")
    out["avg"] = c.all_reduce(np.array([2.0 * r]), op="avg")
    out["gather"] = c.all_gather(np.full(r + 1, r), shapes=[(k + 1,) for k in range(n)])
    out["rs"] = c.reduce_scatter([np.full(2, r * 10 + k) for k in range(n)])
    out["a2a"] = c.all_to_all([np.array([r, k]) for k in range(n)])
    out["bcast"] = c.broadcast(np.array([r]), root=n - 1)
    out["obj"] = c.all_gather_object(("rank", r))
    if r == 0 and n > 1:
        c.send(np.arange(3), 1, tag=7)
    elif r == 1:
        out["recv"] = c.recv((3,), np.int64, 0, tag=7)
    if n > 2:  # a sub-group
        out["sub"] = c.all_reduce(np.array([1]), group=[0, 2]) if r in (0, 2) else None
    # layouts: a transposed array (a weight gradient) is reduced in memory order, and ranks
    # that hold the same values in different layouts still agree
    base = np.arange(12.0).reshape(4, 3) + r
    out["t_sum"] = c.all_reduce(np.ascontiguousarray(base.T).T)
    out["mixed"] = c.all_reduce(base if r == 0 else np.asfortranarray(base))
    out["t_f16_avg"] = c.all_reduce(np.asfortranarray(base.astype(np.float16)), op="avg")
    out["t_max"] = c.all_reduce(np.asfortranarray(base), op="max")
    tall = np.asfortranarray(np.arange(6.0 * n).reshape(2 * n, 3) * (r + 1))
    out["rs_t"] = c.reduce_scatter([tall[2 * k:2 * k + 2] for k in range(n)])
    out["rs_mixed"] = c.reduce_scatter([(tall if r else np.ascontiguousarray(tall))[2 * k:2 * k + 2]
                                        for k in range(n)], op="avg")
    buf = np.full(5, r + 1.0, np.float32)
    out["inplace_same"] = c.iall_reduce_(buf).wait() is buf
    out["inplace"] = buf
    out["inputs_kept"] = bool((base == np.arange(12.0).reshape(4, 3) + r).all())
    c.barrier()
    return out


@pytest.mark.parametrize("n", [1, 2, 3])
def test_fake_collectives(n):
    res = FakeWorld(n).run(_collectives)
    for r, out in enumerate(res):
        assert out["all_reduce"].tolist() == [n * (n + 1) / 2, n]
        assert out["max"].tolist() == [n - 1]
        assert out["avg"].tolist() == [float(n - 1)]
        assert [g.tolist() for g in out["gather"]] == [[k] * (k + 1) for k in range(n)]
        assert out["rs"].tolist() == [sum(k * 10 + r for k in range(n))] * 2
        assert [a.tolist() for a in out["a2a"]] == [[k, r] for k in range(n)]
        assert out["bcast"].tolist() == [n - 1]
        assert out["obj"] == [("rank", k) for k in range(n)]
        base = np.arange(12.0).reshape(4, 3)
        total = n * base + n * (n - 1) / 2
        for k in ("t_sum", "mixed"):
            np.testing.assert_array_equal(out[k], total, err_msg=k)
        assert out["t_f16_avg"].dtype == np.float16
        np.testing.assert_allclose(out["t_f16_avg"], total / n, rtol=1e-3)
        np.testing.assert_array_equal(out["t_max"], base + n - 1)
        tall = np.arange(6.0 * n).reshape(2 * n, 3)[2 * r:2 * r + 2]
        np.testing.assert_array_equal(out["rs_t"], tall * n * (n + 1) / 2)
        np.testing.assert_allclose(out["rs_mixed"], tall * (n + 1) / 2)
        assert out["inplace_same"] and out["inplace"].tolist() == [n * (n + 1) / 2] * 5
        assert out["inputs_kept"]
    if n > 1:
        assert res[1]["recv"].tolist() == [0, 1, 2]
    if n > 2:
        assert res[0]["sub"].tolist() == [2] and res[1]["sub"] is None


def test_self_communicator_matches_fake_world_of_one():
    assert C.current().world_size == 1 and C.current().name == "self"
    out = _collectives()
    assert out["all_reduce"].tolist() == [1.0, 1.0] and out["obj"] == [("rank", 0)]


def test_fake_deadlock_is_reported_not_hung():
    def fn():
        c = C.current()
        if c.rank == 0:
            c.barrier()
    with pytest.raises(C.CommError, match=r"deadlock: rank 0 waits in barrier"):
        FakeWorld(2).run(fn)


def test_fake_mismatched_collectives():
    def fn():
        c = C.current()
        if c.rank == 0:
            c.barrier()
        else:
            c.all_reduce(np.ones(1))
    with pytest.raises(C.CommError, match="mismatch.*barrier.*all_reduce"):
        FakeWorld(2).run(fn)


def test_fake_rank_error_aborts_the_others():
    seen = []

    def fn():
        c = C.current()
        if c.rank == 1:
            raise ValueError("bad data on rank 1")
        try:
            c.barrier()
        except C.CommError as e:
            seen.append(str(e))
            raise
    with pytest.raises(ValueError, match="bad data on rank 1"):
        FakeWorld(2).run(fn)
    assert seen and "rank 1 raised ValueError: bad data on rank 1" in seen[0]


def test_fake_world_keeps_grad_mode_per_rank():
    import tessera

    def fn():
        c = C.current()
        if c.rank == 0:
            with tessera.no_grad():
                c.barrier()
                return tessera.is_grad_enabled()
        c.barrier()
        return tessera.is_grad_enabled()
    assert FakeWorld(2).run(fn) == [False, True]
    assert tessera.is_grad_enabled()


def test_timeout_setting(monkeypatch):
    monkeypatch.setenv("TESSERA_COMM_TIMEOUT", "2.5")
    assert C.timeout() == 2.5
    monkeypatch.setenv("TESSERA_COMM_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="TESSERA_COMM_TIMEOUT"):
        C.timeout()
    monkeypatch.delenv("TESSERA_COMM_TIMEOUT")
    assert C.timeout() == 1800.0


def test_fake_rank_that_never_reaches_a_collective_times_out(monkeypatch):
    import threading
    monkeypatch.setenv("TESSERA_COMM_TIMEOUT", "0.3")
    release = threading.Event()

    def fn():
        c = C.current()
        if c.rank == 0:
            release.wait(5)  # "hangs" past the timeout, then returns
            return None
        c.barrier()
    try:
        with pytest.raises(C.CommTimeout):
            FakeWorld(2).run(fn, timeout=0.5)
    finally:
        release.set()
