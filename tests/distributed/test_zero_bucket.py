"""ZeRO on flat buckets (``parameters_as_bucket_view=True``, parallel/zero_buckets.py) and the
in-place collectives it runs on (``reduce_scatter_ranges_``, ``all_gather_ranges_``): the
same values as one process and as the unpacked path, on simulated ranks and under MPI
(where the buckets are shared memory)."""
import numpy as np
import pytest

import tessera
from tessera import nn
from tessera.distributed import comm as C
from tessera.distributed.optim import ZeroRedundancyOptimizer
from tessera.distributed.placement import placement
from tessera.sbp import split
from tests.distributed._helpers import B, S, run
from tests.distributed.test_dispatch_fast import _count_calls

rng = np.random.default_rng(0)
X = rng.standard_normal((8, 6))
Y = rng.standard_normal((8, 1))


def _model():
    """Packed: the first layer's weight (8, 6) and bias (8,); not: the last weight (1, 8),
    split on dim 1, and bias (1,), too small to split."""
    tessera.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1)).double()


def train(stage=None, steps=4, bucket=True, accumulate=1, replace_data=False):
    """Data parallel over the world with ZeRO (None: one process, plain AdamW). Returns the
    losses, the parameters, the optimizer-state bytes of this rank and the SBPs of the
    gradients after the first backward."""
    model = _model()
    x, y = tessera.tensor(X), tessera.tensor(Y)
    if stage is not None:
        p = placement("cpu", list(range(tessera.distributed.get_world_size())))
        model.to_global(p, B)
        x, y = x.to_global(p, B).to_global(sbp=S(0)), y.to_global(p, B).to_global(sbp=S(0))
        opt = ZeroRedundancyOptimizer(model.parameters(), tessera.optim.AdamW, lr=0.05,
                                      stage=stage, parameters_as_bucket_view=bucket)
    else:
        opt = tessera.optim.AdamW(model.parameters(), lr=0.05)
    losses, sbps = [], None
    for step in range(steps):
        opt.zero_grad()
        for _ in range(accumulate):  # backward more than once: accumulated gradients
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
        if sbps is None and stage is not None:
            sbps = [q.grad.sbp[0].short() for q in model.parameters()]
        opt.step()
        losses.append(loss.item())
        if replace_data and step == 1:  # the first weight's data replaced: unpacked from now
            with tessera.no_grad():
                w = model[0].weight
                w.data = w.detach() * 1.0
    state = opt.local_state_bytes() if stage is not None else None
    return losses, [q.detach().numpy().copy() for q in model.parameters()], state, sbps


def _check(results, want, n):
    for losses, params, state, _ in results:
        np.testing.assert_allclose(losses, want[0], rtol=1e-10)
        for p, q in zip(params, want[1]):
            np.testing.assert_allclose(p, q, rtol=1e-9, atol=1e-12)
        full = 2 * 8 * (48 + 8 + 8 + 1)  # AdamW's two moments, float64
        assert state < full / n + 400, (state, full)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("stage", [1, 2])
def test_bucketed_zero_matches_one_process_and_the_unpacked_path(n, stage):
    want = train(None)
    res = run(n, train, stage)
    _check(res, want, n)
    unpacked = run(n, train, stage, bucket=False)
    for (l1, p1, _, s1), (l2, p2, _, s2) in zip(res, unpacked):
        np.testing.assert_allclose(l1, l2, rtol=1e-12)
        for a, b in zip(p1, p2):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
        assert s1 == s2 == (["S(0)", "S(0)", "S(1)", "B"] if stage == 2 else ["P"] * 3 + ["B"])


@pytest.mark.parametrize("stage", [1, 2])
def test_accumulated_gradients_and_replaced_data_take_the_unpacked_path(stage):
    want = train(None, accumulate=2)
    _check(run(2, train, stage, accumulate=2), want, 2)
    want = train(None, replace_data=True)
    _check(run(3, train, stage, replace_data=True), want, 3)


def test_the_bucket_is_one_collective_each_way_and_shards_view_the_parameters():
    def body():
        model = _model()
        p = placement("cpu", [0, 1])
        model.to_global(p, B)
        x = tessera.tensor(X).to_global(p, B).to_global(sbp=S(0))
        opt = ZeroRedundancyOptimizer(model.parameters(), tessera.optim.SGD, lr=0.1,
                                      stage=2, parameters_as_bucket_view=True)
        w = model[0].weight
        shard = opt.param_groups[0]["params"][0]
        views = np.shares_memory(shard._data.local, w._data.local)
        counts = _count_calls(("reduce_scatter_ranges_", "all_gather_ranges_",
                               "reduce_scatter", "all_gather"))
        opt.zero_grad()
        model(x).square().mean().backward()
        grad = w.grad
        opt.step()
        return views, counts, grad.sbp, grad._data.local.shape, w._version[0]
    for views, counts, sbp, tile, version in run(2, body):
        assert views
        # the two packed parameters in one of each; the (1, 8) weight through the unpacked
        # reduce-scatter and all-gather (which the ranges' default forms call too)
        assert counts["reduce_scatter_ranges_"] == 1 and counts["all_gather_ranges_"] == 1
        assert counts["reduce_scatter"] == 2 and counts["all_gather"] == 2, counts
        assert sbp == (split(0),) and tile == (4, 6)
        assert version > 0


def _ranges_body(dtype):
    comm = C.current()
    n, r = comm.world_size, comm.rank
    buf = comm.reduce_buffer(20, dtype)
    # member k: two ranges, neither contiguous with the other, and one member's empty
    ranges = [[(2 * k, 2 * k + 2), (10 + 3 * k, 10 + 3 * k + (k % 2))] for k in range(n)]
    out = []
    for step in range(2):
        buf[:] = (np.arange(20) + 10 * r + step).astype(dtype)
        before = buf.copy()
        comm.reduce_scatter_ranges_(buf, ranges)
        reduced = buf.copy()
        buf[:] = -1
        for a, b in ranges[r]:
            buf[a:b] = (np.arange(a, b) * (r + 1) + step).astype(dtype)
        comm.all_gather_ranges_(buf, ranges)
        out.append((before, reduced, buf.copy()))
    return ranges, out


def _check_ranges(results):
    n = len(results)
    ranges = results[0][0]
    for step in range(2):
        total = sum(res[1][step][0] for res in results)
        for r, (_, out) in enumerate(results):
            _, reduced, gathered = out[step]
            for a, b in ranges[r]:
                np.testing.assert_array_equal(reduced[a:b], total[a:b])
            for k in range(n):
                for a, b in ranges[k]:
                    np.testing.assert_array_equal(gathered[a:b], np.arange(a, b) * (k + 1) + step)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_range_collectives_on_simulated_ranks(n):
    _check_ranges(run(n, _ranges_body, np.float64))


RANGES = """
    import numpy as np
    from tests.distributed._mpi import emit
    from tests.distributed.test_zero_bucket import _ranges_body
    from tessera.distributed import comm as C
    comm = C.current()
    got = (_ranges_body(np.float32), _ranges_body(np.float64))
    emit(got + (comm._shm.get(tuple(range(comm.world_size))) is not None,))
"""


@pytest.mark.parametrize("n", [2, 3])
def test_range_collectives_under_mpi(tmp_path, n):
    from tests.distributed._mpi import outputs, run_mpi
    run_mpi(tmp_path, RANGES, n=n)
    results = outputs(tmp_path, n)
    _check_ranges([res[0] for res in results])
    _check_ranges([res[1] for res in results])
    assert all(res[2] for res in results)  # the buffers were shared memory


TRAIN = """
    from tests.distributed._mpi import emit
    from tests.distributed.test_zero_bucket import train
    emit((train(2), train(1), train(2, accumulate=2)))
"""


@pytest.mark.parametrize("n", [2, 3])
def test_bucketed_zero_under_mpi_matches_one_process(tmp_path, n):
    from tests.distributed._mpi import outputs, run_mpi
    run_mpi(tmp_path, TRAIN, n=n)
    results = outputs(tmp_path, n)
    want = train(None)
    _check([res[0] for res in results], want, n)
    _check([res[1] for res in results], want, n)
    _check([res[2] for res in results], train(None, accumulate=2), n)
