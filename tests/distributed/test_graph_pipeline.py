"""Pipeline parallelism in ``nn.Graph``: placement changes (send/recv boxing), the 1F1B
schedule, and pipeline-parallel training equal to one process."""
import numpy as np
import pytest

import tessera
from tessera import nn
from tessera.distributed.placement import placement
from tessera.nn.graph import GraphModule
from tessera.parallel.pipeline import order_1f1b
from tests.distributed._helpers import B, P, S, global_from, run
from tests.distributed._mpi import outputs, run_mpi

rng = np.random.default_rng(0)
FULL = rng.standard_normal((5, 4))


# ---- placement changes (eager boxing) ----------------------------------------------------

MOVES = [([0, 1], [1, 0]), ([0], [1]), ([0, 1], [2]), ([0], [1, 2]), ([1, 2], [0, 1])]


@pytest.mark.parametrize("src_ranks,dst_ranks", MOVES)
def test_placement_change_keeps_the_value_and_its_gradient(src_ranks, dst_ranks):
    def body():
        out = []
        for src in (S(0), S(1), B, P):
            for dst in (S(0), S(1), B, P):
                x = global_from(FULL, placement("cpu", src_ranks), src, requires_grad=True)
                y = x.to_global(placement("cpu", dst_ranks), dst)
                assert y.placement == placement("cpu", dst_ranks) and y.sbp == (dst,)
                (y * 2).sum().backward()
                out.append((y.detach().numpy().copy(), x.grad.numpy().copy()))
        return out
    for results in run(3, body):
        for value, grad in results:
            np.testing.assert_allclose(value, FULL, rtol=1e-12)
            np.testing.assert_allclose(grad, np.full_like(FULL, 2.0))


# ---- the schedule ------------------------------------------------------------------------

def _events(stage: int, n_stages: int, m: int) -> list:
    """The point-to-point transfers of one stage, in the order its program makes them."""
    out = []
    for step, k in order_1f1b(stage, n_stages, m):
        recv_a = [("recv", stage - 1, ("act", k))] if stage > 0 else []
        send_a = [("send", stage + 1, ("act", k))] if stage < n_stages - 1 else []
        recv_g = [("recv", stage + 1, ("grad", k))] if stage < n_stages - 1 else []
        send_g = [("send", stage - 1, ("grad", k))] if stage > 0 else []
        out += {"F": recv_a + send_a, "B": recv_g + send_g, "F-": recv_a, "B<": recv_g,
                "F>": send_a, "B-": send_g}[step]
    return out


@pytest.mark.parametrize("n_stages", [2, 3, 4])
def test_1f1b_is_deadlock_free_with_blocking_sends(n_stages):
    """Every send waits for its receive (rendezvous: MPI's protocol for big messages)."""
    for m in range(1, 7):
        queues = [_events(s, n_stages, m) for s in range(n_stages)]
        while any(queues):
            moved = False
            for s, q in enumerate(queues):
                if q and q[0][0] == "send":
                    _, peer, msg = q[0]
                    if queues[peer] and queues[peer][0] == ("recv", s, msg):
                        q.pop(0)
                        queues[peer].pop(0)
                        moved = True
            assert moved, f"deadlock: {n_stages} stages, {m} micro-batches: {queues}"
        # 1F1B: stage s holds at most n_stages - s micro-batches' activations
        for s in range(n_stages):
            alive = peak = 0
            for step, _ in order_1f1b(s, n_stages, m):
                alive += step in ("F", "F-")
                peak = max(peak, alive)
                alive -= step in ("B", "B-")
            assert peak <= min(n_stages - s, m)


# ---- training ------------------------------------------------------------------------------

D_MODEL, HEADS, FF, SEQ, BATCH, MICRO = 8, 2, 16, 4, 8, 4
XP = rng.standard_normal((BATCH, SEQ, D_MODEL))
YP = rng.standard_normal((BATCH, SEQ, D_MODEL))


def _layers():
    tessera.manual_seed(0)
    return [nn.TransformerEncoderLayer(D_MODEL, HEADS, dim_feedforward=FF, dropout=0.0,
                                       activation="gelu", batch_first=True).double()
            for _ in range(2)]


def one_process(steps: int):
    """The oracle: both layers in one process, eager, on the whole batch."""
    model = nn.Sequential(*_layers())
    opt = tessera.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = tessera.tensor(XP), tessera.tensor(YP)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [q.detach().numpy().copy() for q in model.parameters()]


def pipeline(steps: int, dp: int = 1):
    """Two stages of ``dp`` data-parallel ranks each (ranks [0..dp) and [dp..2dp)), four
    micro-batches, 1F1B. Returns (losses on the last stage, this rank's parameters)."""
    stage0, stage1 = _layers()
    p0, p1 = placement("cpu", list(range(dp))), placement("cpu", list(range(dp, 2 * dp)))
    batch = S(0) if dp > 1 else B
    stage0.to_global(p0, B)
    stage1.to_global(p1, B)
    x = tessera.tensor(XP).to_global(p0, B).to_global(sbp=batch)
    y = tessera.tensor(YP).to_global(p1, B).to_global(sbp=batch)
    params = list(stage0.parameters()) + list(stage1.parameters())
    opt = tessera.optim.AdamW(params, lr=1e-2)

    class PipelineGraph(nn.Graph):
        def __init__(self):
            super().__init__()
            self.stage0, self.stage1 = stage0, stage1
            self.stage0.to(GraphModule).set_stage(stage_id=0, placement=p0)
            self.stage1.config.set_stage(stage_id=1, placement=p1)  # OneFlow's older form
            self.add_optimizer(opt)
            self.config.set_gradient_accumulation_steps(MICRO)

        def build(self, x, y):
            loss = nn.functional.mse_loss(self.stage1(self.stage0(x)), y)
            loss.backward()
            return loss

    g = PipelineGraph()
    losses = []
    for _ in range(steps):
        loss = g(x, y).detach().to_global(sbp=B).to_local()  # (the last stage's ranks)
        losses.append(float(loss.numpy()) if loss.numel() else None)
    mine = [q.detach().to_local().numpy().copy() for q in params]
    ops = [n.op.name for n in g.ir.nodes]
    return losses, mine, ops


def check_pipeline(results, steps: int, dp: int = 1):
    want_losses, want_params = one_process(steps)
    n_half = len(want_params) // 2
    for rank, (losses, mine, ops) in enumerate(results):
        stage = rank // dp
        if stage == 1:
            np.testing.assert_allclose(losses, want_losses, rtol=1e-9)
            assert "recv" in ops and ops.count("send") == MICRO  # gradients back, per micro-batch
        else:
            assert losses == [None] * steps
            assert "recv" in ops and ops.count("send") == MICRO  # activations out
        held = mine[:n_half] if stage == 0 else mine[n_half:]
        want = want_params[:n_half] if stage == 0 else want_params[n_half:]
        for p, q in zip(held, want):
            np.testing.assert_allclose(p, q, rtol=1e-8, atol=1e-10)


def test_pipeline_two_stages_equals_one_process():
    check_pipeline(run(2, pipeline, 2), 2)  # (2 stages x 2 data-parallel: under mpiexec)


def four_stages(steps: int = 2, m: int = 4):
    """Four Linear+Tanh stages, one rank each (warm-ups of 3, 2, 1, 0 forwards)."""
    tessera.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(3, 3), nn.Tanh()).double() for _ in range(4)]
    n = tessera.distributed.get_world_size()
    x, y = tessera.tensor(XP[:, 0, :3]), tessera.tensor(YP[:, 0, :3])
    if n > 1:
        places = [placement("cpu", [r]) for r in range(4)]
        for layer, p in zip(layers, places):
            layer.to_global(p, B)
        x, y = x.to_global(places[0], B), y.to_global(places[3], B)
    params = [q for layer in layers for q in layer.parameters()]
    opt = tessera.optim.SGD(params, lr=0.1, momentum=0.9)

    class FourStages(nn.Graph):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(*layers)
            if n > 1:
                for i, p in enumerate(places):
                    self.layers[i].to(GraphModule).set_stage(i, p)
            self.add_optimizer(opt)
            self.config.set_gradient_accumulation_steps(m)

        def build(self, x, y):
            loss = nn.functional.mse_loss(self.layers(x), y)
            loss.backward()
            return loss
    g = FourStages()
    losses = []
    for _ in range(steps):
        loss = g(x, y).detach()
        loss = loss.to_local() if n > 1 else loss
        losses.append(float(loss.numpy()) if loss.numel() else None)
    mine = [q.detach().to_local().numpy().copy() for q in params]
    p2p = [(nd.op.name, nd.attrs.get("dst", nd.attrs.get("src"))) for nd in g.ir.nodes
           if nd.op.name in ("send", "recv")]
    return losses, mine, p2p


def test_four_stages_run_1f1b_and_equal_one_process():
    want_losses, want_params, _ = four_stages()
    for rank, (losses, mine, p2p) in enumerate(run(4, four_stages)):
        if rank == 3:
            np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        held = slice(2 * rank, 2 * rank + 2)  # this stage's weight and bias
        for p, q in zip(mine[held], want_params[held]):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)
        # the compiled program makes its transfers in the 1F1B order
        want = [(kind, peer) for kind, peer, _ in _events(rank, 4, 4)]
        assert p2p == want, (rank, p2p)


def test_a_stage_given_a_local_tensor_names_it():
    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.lin.to(GraphModule).set_stage(0, placement("cpu", [0]))

        def build(self, x):
            return self.lin(x)
    with pytest.raises(TypeError, match=r"pipeline stage 0 \(Linear.*local tensor"):
        G()(tessera.ones(2, 2))
    with pytest.raises(TypeError, match="must be a tessera.placement"):
        G().lin.to(GraphModule).set_stage(0, [0, 1])


MPI_PIPELINE = """
    from tests.distributed._mpi import emit
    from tests.distributed.test_graph_pipeline import pipeline
    emit(pipeline({steps}, {dp}))
"""


def test_mpi_pipeline_transformer_ten_steps(tmp_path):
    run_mpi(tmp_path, MPI_PIPELINE.format(steps=10, dp=1), n=2, timeout=180)
    check_pipeline(outputs(tmp_path, 2), 10)


def test_mpi_four_ranks_two_stages_by_two_data_parallel(tmp_path):
    run_mpi(tmp_path, MPI_PIPELINE.format(steps=3, dp=2), n=4, timeout=240)
    check_pipeline(outputs(tmp_path, 4), 3, dp=2)
