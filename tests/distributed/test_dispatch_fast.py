"""What keeps eager ops on global tensors cheap: in-place elementwise writes on aligned tiles
(``global_tensor.inplace_kernel``), the remembered signature choice and plan, one count
all-reduce per cross-entropy mean (backward reuses the forward's), ZeRO's packed collectives,
and the column-major weight-gradient product; each against the plain path's values."""
import numpy as np
import pytest

import tessera
from tessera import nn
from tessera.distributed import comm as C, global_tensor as G, sbp_dispatch as D
from tessera.distributed.optim import ZeroRedundancyOptimizer
from tessera.distributed.placement import placement
from tests.distributed._helpers import B, P, S, global_from, run

rng = np.random.default_rng(0)


def _count_calls(names=("all_reduce", "reduce_scatter", "all_gather", "iall_reduce_")):
    """Wraps this rank's communicator; returns the dict of call counts it fills."""
    comm, counts = C.current(), {}
    for name in names:
        orig = getattr(comm, name)

        def wrapped(*a, _orig=orig, _name=name, **k):
            counts[_name] = counts.get(_name, 0) + 1
            return _orig(*a, **k)
        setattr(comm, name, wrapped)
    return counts


@pytest.mark.parametrize("sbp_t, sbp_o", [(B, B), (S(0), S(0)), (S(1), S(1)), (B, S(0)),
                                          (S(0), B), (P, P), (B, P)])
def test_inplace_elementwise_matches_out_of_place(sbp_t, sbp_o):
    t0, o = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))

    def body():
        p = placement("cpu", [0, 1])
        t, other = global_from(t0, p, (sbp_t,)), global_from(o, p, (sbp_o,))
        with tessera.no_grad():
            t.mul_(0.5).add_(other, alpha=-2.0).addcmul_(other, other, value=0.25)
            t.clamp_(-1.0, 1.0)
        return t.sbp, t.numpy()
    want = np.clip((t0 * 0.5 - 2.0 * o) + 0.25 * o * o, -1.0, 1.0)
    for sbp, got in run(2, body):
        assert sbp == (sbp_t,)  # an in-place write keeps the target's SBP
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_inplace_on_aligned_tiles_runs_no_op_dispatch():
    calls = []

    def body():
        p = placement("cpu", [0, 1])
        t = global_from(rng.standard_normal((4, 6)), p, (S(0),))
        other = global_from(rng.standard_normal((4, 6)), p, (S(0),))
        with tessera.no_grad():
            t.add_(other)
            t.add_(other.to_global(sbp=B))  # not aligned: out of place, then boxed
    G._run = lambda *a: calls.append(a[0].name) or D.run(*a)  # (the global device's)
    try:
        run(2, body)
    finally:
        G._run = D.run
    assert calls == ["add", "add"]  # the second add_ on each rank


def test_signature_choice_is_remembered_and_keyed_by_inputs():
    def body():
        p = placement("cpu", [0, 1])
        a = global_from(rng.standard_normal((4, 6)), p, (S(0),))
        b = global_from(rng.standard_normal((4, 6)), p, (B,))
        D._CHOICES.clear()
        D._PLANS.clear()
        s1 = (a + b).sbp
        n1 = len(D._CHOICES), len(D._PLANS)
        s2 = (a + b).sbp
        s3 = (b + b.to_global(sbp=S(1))).sbp  # other input SBPs: another entry
        return s1, s2, s3, n1, (len(D._CHOICES), len(D._PLANS))
    for s1, s2, s3, n1, n2 in run(2, body):
        assert s1 == s2 == (S(0),) and s3 == (S(1),)
        # (a rank's plan holds the choice and its tiles; the other rank's adds a plan)
        assert n1[0] == 1 and n2[0] == 2 and n1[1] >= 1 and n2[1] == n1[1] + 1


def test_cross_entropy_mean_counts_the_targets_once_per_step():
    x, y = rng.standard_normal((6, 4)), rng.integers(0, 4, (6,))
    xt = tessera.tensor(x, requires_grad=True)
    nn.functional.cross_entropy(xt, tessera.tensor(y)).backward()

    def body():
        p = placement("cpu", [0, 1])
        g = global_from(x, p, (S(0),), requires_grad=True)
        t = global_from(y, p, (S(0),))
        counts = _count_calls(("all_reduce",))
        loss = nn.functional.cross_entropy(g, t)
        loss.backward()
        return counts.get("all_reduce", 0), loss.item(), g.grad.numpy()
    for n_reduce, loss, grad in run(2, body):
        assert n_reduce == 1  # the count (the loss itself is read by item(), a gather)
        np.testing.assert_allclose(grad, xt.grad.numpy(), rtol=1e-12)


def test_compiled_cross_entropy_counts_the_targets_once_per_step():
    """In an nn.Graph too: backward reuses the count of its own step's forward, never one of
    an earlier step (other targets in the same input buffer give other counts)."""
    x = rng.standard_normal((3, 6, 4))
    ys = [rng.integers(0, 4, (6,)) for _ in range(3)]
    ys[1][:2] = -100  # ignored targets: this step's count differs from the others'
    want = []
    for xs, y in zip(x, ys):
        xt = tessera.tensor(xs, requires_grad=True)
        loss = nn.functional.cross_entropy(xt, tessera.tensor(y))
        loss.backward()
        want.append((loss.item(), xt.grad.numpy()))

    class Step(nn.Graph):
        def build(self, g, t):
            g = g.detach().requires_grad_()
            loss = nn.functional.cross_entropy(g, t)
            return loss, tessera.autograd.grad(loss, g)[0]

    def body():
        p = placement("cpu", [0, 1])
        step, out = Step(), []
        for xs, y in zip(x, ys):
            g, t = global_from(xs, p, (S(0),)), global_from(y, p, (S(0),))
            step(g, t)  # compiled at the first, then run
            counts = _count_calls(("all_reduce",))
            loss, grad = step(g, t)
            out.append((counts.get("all_reduce", 0), loss.numpy(), grad.numpy()))
            del C.current().all_reduce  # (the wrapper is an instance attribute)
        return out
    for rank in run(2, body):
        for (n_reduce, loss, grad), (want_loss, want_grad) in zip(rank, want):
            assert n_reduce == 1
            np.testing.assert_allclose(loss, want_loss, rtol=1e-12)
            np.testing.assert_allclose(grad, want_grad, rtol=1e-12)


def test_zero_packs_its_collectives():
    def body(stage):
        tessera.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).double()
        p = placement("cpu", [0, 1])
        model.to_global(p, B)
        x = tessera.tensor(rng.standard_normal((8, 6))).to_global(p, B).to_global(sbp=S(0))
        opt = ZeroRedundancyOptimizer(model.parameters(), tessera.optim.SGD, lr=0.1,
                                      stage=stage)
        counts = _count_calls()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        return counts
    for stage in (1, 2):
        for counts in run(2, body, stage):  # every parameter's rows in one of each
            assert counts.get("reduce_scatter") == 1 and counts.get("all_gather") == 1, counts


def test_weight_gradient_of_linear_is_row_major_on_global_tiles():
    def body():
        p = placement("cpu", [0, 1])
        lin = nn.Linear(5, 7).double()
        lin.to_global(p, B)
        x = global_from(rng.standard_normal((6, 5)), p, (S(0),))
        lin(x).sum().backward()
        return lin.weight.grad._data.local.flags.c_contiguous
    assert run(2, body) == [True, True]


ZERO_SCRIPT = """
    import numpy as np
    from tessera.distributed import comm as C
    from tests.distributed._mpi import emit
    from tests.distributed.test_zero import train
    comm = C.current()
    # reduce_scatter of chunks that are consecutive pieces of one buffer (ZeRO's packing)
    buf = np.arange(10.0) * (comm.rank + 1)
    got = comm.reduce_scatter([buf[:6], buf[6:]] if comm.world_size == 2 else
                              [buf[:4], buf[4:7], buf[7:]])
    emit((got, train(2), train(1)))
"""


@pytest.mark.parametrize("n", [2, 3])
def test_zero_under_mpi_matches_one_process(tmp_path, n):
    from tests.distributed._mpi import outputs, run_mpi
    from tests.distributed.test_zero import check
    run_mpi(tmp_path, ZERO_SCRIPT, n=n)
    results = outputs(tmp_path, n)
    total = np.arange(10.0) * sum(range(1, n + 1))
    bounds = [0, 6, 10] if n == 2 else [0, 4, 7, 10]
    for r, (got, stage2, stage1) in enumerate(results):
        np.testing.assert_allclose(got, total[bounds[r]:bounds[r + 1]])
    check([s2 for _, s2, _ in results], n)
    check([s1 for _, _, s1 in results], n)


def _planned_ops():
    """Ops whose plan (``sbp_dispatch._plan``) covers shape attrs (view), a transposed tile made
    contiguous (reshape), two outputs (max over a dim), a 0-d local operand and a boxed
    input, each run twice: the first call makes the plan, the second runs by it."""
    from tessera.distributed import get_world_size
    p = placement("cpu", list(range(get_world_size())))
    x0, y0 = np.arange(35.0).reshape(7, 5) / 7, np.cos(np.arange(35.0)).reshape(7, 5)
    out = []
    for _ in range(2):
        x = global_from(x0, p, (S(0),))
        y = global_from(y0, p, (S(1),))
        v, i = tessera.max(x * tessera.tensor(2.0) + y, 1)
        out.append([(x + y).numpy(), x.view(5, 7).numpy(), x.t().reshape(35).numpy(),
                    v.numpy(), i.numpy(), v.sbp])
    return out


def test_planned_dispatch_equals_the_first_call_and_one_process():
    x0, y0 = np.arange(35.0).reshape(7, 5) / 7, np.cos(np.arange(35.0)).reshape(7, 5)
    z = x0 * 2 + y0
    want = [x0 + y0, x0.reshape(5, 7), x0.T.reshape(35), z.max(1), z.argmax(1)]
    for n in (2, 3):
        for first, second in run(n, _planned_ops):
            for got in (first, second):
                for g, w in zip(got, want):
                    np.testing.assert_allclose(g, w, rtol=1e-12)
            assert first[5] == second[5]


def test_planned_dispatch_under_mpi(tmp_path):
    from tests.distributed._mpi import outputs, run_mpi
    run_mpi(tmp_path, """
        from tests.distributed._mpi import emit
        from tests.distributed.test_dispatch_fast import _planned_ops
        emit(_planned_ops())
    """)
    x0, y0 = np.arange(35.0).reshape(7, 5) / 7, np.cos(np.arange(35.0)).reshape(7, 5)
    z = x0 * 2 + y0
    want = [x0 + y0, x0.reshape(5, 7), x0.T.reshape(35), z.max(1), z.argmax(1)]
    for first, second in outputs(tmp_path):
        for got in (first, second):
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-12)
