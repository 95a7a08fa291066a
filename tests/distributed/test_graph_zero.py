"""ZeRO in ``nn.Graph`` (``config.enable_zero(True, stage=1|2)``): the same parameters as
one process, a 1/n share of the optimizer state per rank."""
import numpy as np
import pytest

import tessera
from tessera import nn
from tessera.distributed.graph_ops import BOXING_OP
from tests.distributed._helpers import run
from tests.distributed._mpi import outputs, run_mpi
from tests.distributed.test_graph_global import TrainGraph, X, Y, _data_parallel, _mlp


def train(zero_stage: int | None, steps: int = 4, micro_batches: int = 1,
          bucket_cap_mb: float = 25.0, min_size: int = 1):
    """Data parallel over the world with AdamW in an nn.Graph (None: one process);
    ``min_size``: ZeRO's ``shard_min_size``."""
    model = _mlp()
    x, y = tessera.tensor(X[:6]), tessera.tensor(Y[:6])
    if zero_stage is not None:
        x, y = _data_parallel(model, x, y)
    opt = tessera.optim.AdamW(model.parameters(), lr=0.05)
    g = TrainGraph(model, opt)
    if zero_stage:
        g.config.enable_zero(True, stage=zero_stage, shard_min_size=min_size)
    g.config.set_gradient_accumulation_steps(micro_batches)
    g.config.set_bucket_cap_mb(bucket_cap_mb)
    losses = [float(g(x, y).detach().numpy()) for _ in range(steps)]
    params = [q.detach().numpy().copy() for q in model.parameters()]
    state = sum(np.asarray(v._data.local if v.is_global else v._data).nbytes
                for st in opt.state.values() for v in st.values())
    boxing = [(n.attrs["src"], n.attrs["dst"]) for n in g.ir.nodes if n.op is BOXING_OP]
    ops = [(n.op.name, n.attrs.get("src"), n.attrs.get("dst")) for n in g.ir.nodes]
    sbps = [opt.state[p]["exp_avg"].sbp[0].short() if zero_stage is not None else None
            for p in model.parameters()]
    return losses, params, state, boxing, sbps, g.memory_stats(), ops


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_graph_matches_one_process_with_a_share_of_the_state(stage):
    """Without buckets (``set_bucket_cap_mb(0)``): one reduce-scatter and one all-gather
    per parameter."""
    want_losses, want_params, *_ = train(None)
    plain = run(2, train, 0)[0]
    for losses, params, state, boxing, sbps, mem, ops in run(2, train, stage,
                                                               bucket_cap_mb=0):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)
        # AdamW's moments split over the ranks: about half of them each (the 3-row weight
        # and bias split unevenly, 2 + 1)
        assert state < 0.6 * plain[2], (state, plain[2])
        assert sbps == ["S(0)"] * 4 and plain[4] == ["B"] * 4
        assert mem["variable_bytes"] < plain[5]["variable_bytes"]
        # partial gradients reduce-scattered, the shards all-gathered: no all-reduce
        assert boxing.count(("P", "S(0)")) == 4 and boxing.count(("S(0)", "B")) == 4
        assert ("P", "B") not in boxing
        # stage 2 reduce-scatters a gradient as soon as backward has it (before the first
        # layer's backward matmuls); stage 1 at the step, after all of backward
        first_scatter = ops.index(("boxing", "P", "S(0)"))
        last_matmul = max(i for i, o in enumerate(ops) if o[0] == "matmul")
        assert (first_scatter < last_matmul) == (stage == 2), ops


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_graph_buckets_its_reduce_scatters_and_all_gathers(stage):
    """With buckets (the default): one reduce-scatter of every gradient and one all-gather
    of every updated shard a step, the same values."""
    want_losses, want_params, *_ = train(None)
    for losses, params, state, boxing, sbps, mem, ops in run(2, train, stage):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)
        names = [o[0] for o in ops]
        assert names.count("reduce_scatter_bucket") == 1, ops
        assert names.count("all_gather_bucket") == 1, ops
        assert ("P", "S(0)") not in boxing and ("S(0)", "B") not in boxing
        assert ("P", "B") not in boxing and "all_reduce_bucket" not in names
        # the gradients are scattered after all of backward, the shards gathered after
        # the last of the optimizer's arithmetic
        assert names.index("reduce_scatter_bucket") > max(
            i for i, o in enumerate(names) if o == "matmul")
        assert names.index("all_gather_bucket") > max(
            i for i, o in enumerate(names) if o not in ("all_gather_bucket", "copy"))


@pytest.mark.parametrize("n", [2, 3])
def test_zero_all_reduces_the_whole_parameters_within_the_reduce_scatter(n):
    """The biases below ``shard_min_size`` stay whole (their state too) and their gradients
    are all-reduced within the weights' reduce-scatter: one collective of gradients a step,
    the same values as one process."""
    want_losses, want_params, *_ = train(None)
    plain = run(n, train, 0)[0]
    for losses, params, state, boxing, sbps, mem, ops in run(n, train, 2, min_size=10):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)
        assert sbps == ["S(0)", "B", "S(0)", "B"] and state < plain[2]
        names = [o[0] for o in ops]
        assert names.count("reduce_scatter_bucket") == 1, ops
        assert "all_reduce_bucket" not in names and ("P", "B") not in boxing, ops
        assert names.count("all_gather_bucket") == 1, ops


def gathered_in_place(steps: int = 4):
    """ZeRO stage 2 with buckets: the losses and parameters, and per step whether each
    parameter's array stayed the same object, whether the step's assigned value of each
    parameter was that array itself (no copy into it afterwards), the offsets of the
    parameters' arrays from the first one's (bytes), and per step the bytes copied into
    the parameters' buffer before the all-gather (``graph_ops._put``)."""
    from tessera.distributed import comm as C, graph_ops
    real, copied = graph_ops._put, [0]

    def put(place, x):
        homes = C.current().__dict__.get("_graph_homes", {}).values()
        if any(np.shares_memory(place, h) for h in homes) and not (
                x.ctypes.data == place.ctypes.data and x.strides == place.strides):
            copied[0] += place.nbytes
        real(place, x)
    graph_ops._put = put
    try:
        return _gathered_in_place(steps, copied)
    finally:
        graph_ops._put = real


def _gathered_in_place(steps: int, copied: list):
    model = _mlp()
    x, y = _data_parallel(model, tessera.tensor(X[:6]), tessera.tensor(Y[:6]))
    g = TrainGraph(model, tessera.optim.AdamW(model.parameters(), lr=0.05))
    g.config.enable_zero(True, stage=2, shard_min_size=1)
    params = list(model.parameters())
    names = [f"model.{k}" for k, _ in model.named_parameters()]
    losses, same, assigned, copies = [], [], [], []
    for _ in range(steps):
        copied[0] = 0
        tiles = [q._data.local for q in params]
        c = g._cache.get(g._last_key) if g._last_key is not None else None
        run_ = c.executor.run if c is not None else None
        if c is not None:
            def spy(inputs, variables, run_=run_):
                outs, assigns = run_(inputs, variables)
                got = dict(assigns)
                assigned.append([got[k] is variables[k] for k in names])
                return outs, assigns
            c.executor.run = spy
        losses.append(float(g(x, y).detach().numpy()))
        copies.append(copied[0])
        if c is not None:
            c.executor.run = run_
            same.append([q._data.local is t for q, t in zip(params, tiles)])
    start = params[0]._data.local.ctypes.data
    offsets = [q._data.local.ctypes.data - start for q in params]
    return losses, [q.detach().numpy().copy() for q in params], same, assigned, offsets, \
        copies


def test_zero_gathers_the_updated_shards_into_the_parameters():
    """The all-gather bucket gathers straight into the parameters' arrays, segments of one
    buffer laid out as the bucket: each step's new parameter values are those arrays
    themselves, so nothing is copied into the parameters after the step; the same values
    as one process."""
    want_losses, want_params, *_ = train(None)
    for losses, params, same, assigned, offsets, _ in run(2, gathered_in_place):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)
        # the 8x6 weight, its 8 biases, the 3x8 weight, back to back (float64)
        assert offsets == [0, 8 * 48, 8 * 56, 8 * 80], offsets
        assert same and all(all(s) for s in same), same
        assert assigned and all(all(a) for a in assigned), assigned


def test_zero_update_writes_its_shard_into_the_parameter():
    """The optimizer's update of a parameter's shard writes straight into this rank's rows
    of the parameter (the all-gather's ``input_buffers`` entry says where it puts the
    shard), so nothing is copied into the parameters' buffer before the all-gather, from
    the second step on; the same values as one process."""
    want_losses, want_params, *_ = train(None)
    for losses, params, *_, copies in run(2, gathered_in_place):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)
        assert len(copies) == 4 and copies[1:] == [0, 0, 0], copies


def test_zero_stage2_with_micro_batches_on_three_ranks():
    want_losses, want_params, *_ = train(None, micro_batches=2)
    for losses, params, *_ in run(3, train, 2, micro_batches=2):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)


def test_enable_zero_checks_its_arguments():
    g = nn.Graph()
    with pytest.raises(ValueError, match="stage must be 1, 2 or 3"):
        g.config.enable_zero(True, stage=4)
    with pytest.raises(ValueError, match="shard_min_size"):
        g.config.enable_zero(True, shard_min_size=0)
    model = _mlp()
    local = TrainGraph(model, tessera.optim.SGD(model.parameters(), lr=0.1))
    local.config.enable_zero(True, stage=1)
    with pytest.raises(ValueError, match="global data-parallel parameters"):
        local(tessera.tensor(X), tessera.tensor(Y))


def test_mpi_zero_stage2_graph(tmp_path):
    run_mpi(tmp_path, """
        from tests.distributed._mpi import emit
        from tests.distributed.test_graph_zero import train
        emit(train(2)[:3])
    """)
    want_losses, want_params, *_ = train(None)
    for losses, params, state in outputs(tmp_path):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)
        assert state < 0.6 * (2 * 8 * (48 + 8 + 24 + 3))  # half of AdamW's moments, about


def pipeline_zero(zero_stage: int, steps: int = 3):
    """Two stages of two data-parallel ranks each, ZeRO within each stage (None: one
    process). Returns this rank's parameters and optimizer-state bytes."""
    from tessera.distributed.placement import placement
    from tessera.nn.graph import GraphModule
    from tests.distributed._helpers import B, S
    tessera.manual_seed(0)
    first = nn.Sequential(nn.Linear(6, 8), nn.Tanh()).double()
    second = nn.Linear(8, 3).double()
    x, y = tessera.tensor(X[:4]), tessera.tensor(Y[:4])
    if zero_stage is not None:
        p0, p1 = placement("cpu", [0, 1]), placement("cpu", [2, 3])
        first.to_global(p0, B)
        second.to_global(p1, B)
        x = x.to_global(p0, B).to_global(sbp=S(0))
        y = y.to_global(p1, B).to_global(sbp=S(0))
    params = list(first.parameters()) + list(second.parameters())
    opt = tessera.optim.AdamW(params, lr=0.05)

    class Pipe(nn.Graph):
        def __init__(self):
            super().__init__()
            self.first, self.second = first, second
            if zero_stage is not None:
                self.first.to(GraphModule).set_stage(0, p0)
                self.second.to(GraphModule).set_stage(1, p1)
                if zero_stage:
                    self.config.enable_zero(True, stage=zero_stage, shard_min_size=1)
            self.add_optimizer(opt)
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x, y):
            loss = nn.functional.mse_loss(self.second(self.first(x)), y)
            loss.backward()
            return loss
    g = Pipe()
    for _ in range(steps):
        g(x, y)
    held = [v for st in opt.state.values() for v in st.values()
            if not v.is_global or v._data.local is not None]
    state = sum(np.asarray(v._data.local if v.is_global else v._data).nbytes for v in held)
    return [q.detach().to_local().numpy().copy() for q in params], state


def test_zero_within_pipeline_stages():
    want, _ = pipeline_zero(None)
    plain = run(4, pipeline_zero, 0)
    for rank, ((params, state), (_, plain_state)) in enumerate(zip(run(4, pipeline_zero, 2),
                                                                      plain)):
        held = slice(0, 2) if rank < 2 else slice(2, 4)
        for p, q in zip(params[held], want[held]):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)
        # a share of the moments (the second stage's 3-row weight splits 2 + 1)
        assert state < 0.7 * plain_state, (rank, state, plain_state)


# what a bucket node does to each of its members
_BUCKETED = {"all_reduce_bucket": ("P", "B"), "reduce_scatter_bucket": ("P", "S(0)"),
             "all_gather_bucket": ("S(0)", "B")}


def conversions(g) -> list[tuple[int, str, str]]:
    """(node index, src, dst) of each communicating conversion of ``g``'s program, a
    bucket's members one by one."""
    out = []
    for i, n in enumerate(g.ir.nodes):
        if n.op is BOXING_OP and n.attrs["seq"] is not None:
            out.append((i, n.attrs["src"], n.attrs["dst"]))
        elif n.op.name in _BUCKETED:
            out += [(i, *_BUCKETED[n.op.name])] * len(n.inputs)
    return out


def train_stage3(steps: int = 4, micro_batches: int = 1, bucket_cap_mb: float = 25.0):
    """``train`` under ZeRO stage 3; also each parameter's SBP and tile size after it."""
    model = _mlp()
    x, y = _data_parallel(model, tessera.tensor(X[:6]), tessera.tensor(Y[:6]))
    opt = tessera.optim.AdamW(model.parameters(), lr=0.05)
    g = TrainGraph(model, opt)
    g.config.enable_zero(True, stage=3, shard_min_size=1)
    g.config.set_gradient_accumulation_steps(micro_batches)
    g.config.set_bucket_cap_mb(bucket_cap_mb)
    losses = [float(g(x, y).detach().numpy()) for _ in range(steps)]
    params = [q.detach().numpy().copy() for q in model.parameters()]
    held = [(q.sbp[0].short(), q.to_local().numel()) for q in model.parameters()]
    state = sum(np.asarray(v._data.local if v.is_global else v._data).nbytes
                for st in opt.state.values() for v in st.values())
    return losses, params, held, state, conversions(g), g.memory_stats()


@pytest.mark.parametrize("n,cap", [(2, 0), (3, 0), (2, 25.0)])
def test_zero_stage3_keeps_the_parameters_split(n, cap):
    want_losses, want_params, *_ = train(None)
    plain = run(n, train, 0)[0]
    for losses, params, held, state, conv, mem in run(n, train_stage3, bucket_cap_mb=cap):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)
        # each rank holds its rows of every parameter between steps (8 and 3 rows split
        # 4+4 / 2+1 on 2 ranks, 3+3+2 / 1+1+1 on 3), and of the AdamW moments
        assert [s for s, _ in held] == ["S(0)"] * 4
        assert sum(k for _, k in held) < 0.7 * sum(q.size for q in want_params)
        assert state < 0.7 * plain[2]
        assert mem["variable_bytes"] < 0.7 * plain[5]["variable_bytes"]
        # each parameter all-gathered once for forward and backward, its gradient
        # reduce-scattered (in buckets or not); no all-reduce, nothing gathered after the
        # optimizer
        kinds = [(s, d) for _, s, d in conv]
        assert kinds.count(("S(0)", "B")) == 4 and kinds.count(("P", "S(0)")) == 4
        assert len(kinds) == 8, conv
        last_gather = max(i for i, s, d in conv if (s, d) == ("S(0)", "B"))
        first_scatter = min(i for i, s, d in conv if (s, d) == ("P", "S(0)"))
        assert last_gather < first_scatter
        # buckets: the two parameters of each layer gathered together at its first call
        # (the matmul reading them ends the bucket), all four gradients scattered together
        assert len({i for i, *_ in conv}) == (8 if cap == 0 else 3), conv


def test_zero_stage3_with_micro_batches_on_three_ranks():
    want_losses, want_params, *_ = train(None, micro_batches=2)
    for losses, params, *_ in run(3, train_stage3, micro_batches=2):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)


def test_zero_stage3_after_eager_steps_splits_their_state():
    """Two eager AdamW steps, then graph steps under stage 3: the eager state is split
    with its parameters, and training goes on as in one process."""
    def body(glob: bool):
        model = _mlp()
        x, y = tessera.tensor(X[:6]), tessera.tensor(Y[:6])
        if glob:
            x, y = _data_parallel(model, x, y)
        opt = tessera.optim.AdamW(model.parameters(), lr=0.05)
        for _ in range(2):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        g = TrainGraph(model, opt)
        if glob:
            g.config.enable_zero(True, stage=3, shard_min_size=1)
        losses = [float(g(x, y).detach().numpy()) for _ in range(2)]
        sbps = {opt.state[p]["exp_avg"].sbp[0].short() for p in model.parameters()} \
            if glob else None
        return losses, [q.detach().numpy().copy() for q in model.parameters()], sbps
    want_losses, want_params, _ = body(False)
    for losses, params, sbps in run(2, body, True):
        assert sbps == {"S(0)"}
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)


def test_zero_stage3_within_pipeline_stages():
    """Each stage's two data-parallel ranks hold the halves of its parameters; put back
    together they equal one process."""
    want, _ = pipeline_zero(None)
    res = [params for params, _ in run(4, pipeline_zero, 3)]
    for k, q in enumerate(want):
        ranks = (0, 1) if k < 2 else (2, 3)
        halves = [res[r][k] for r in ranks]
        assert all(0 < len(h) < len(q) for h in halves)
        np.testing.assert_allclose(np.concatenate(halves), q, rtol=1e-10, atol=1e-13)


def test_mpi_zero_stage3_graph(tmp_path):
    run_mpi(tmp_path, """
        from tests.distributed._mpi import emit
        from tests.distributed.test_graph_zero import train_stage3
        emit(train_stage3()[:3])
    """)
    want_losses, want_params, *_ = train(None)
    for losses, params, held in outputs(tmp_path):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)
        assert [s for s, _ in held] == ["S(0)"] * 4


@pytest.mark.parametrize("n", [2, 3])
def test_mpi_zero_graph_boxes_rows_in_shared_memory(tmp_path, n):
    """Under mpiexec: a parameter's partial_sum -> split(0) and split(0) -> broadcast nodes
    run on their own shared reduce buffers, or the all-gathers on the parameters' own (a
    reduce-scatter and an all-gather by rows, no messages), with the same values as one
    process, uneven splits (3 and 8 rows on 3 ranks) and micro-batches included."""
    run_mpi(tmp_path, """
        from tessera.distributed import comm as C
        from tests.distributed._mpi import emit
        from tests.distributed.test_graph_zero import train
        got = [train(2)[:2], train(1)[:2], train(2, micro_batches=2)[:2],
               train(2, min_size=10)[:2]]
        comm = C.current()
        shared = [comm._shm[k[0]].owns(b) for k, b in comm._graph_buckets.items()]
        # the gathered parameters' own buffers (home_variables): shared memory too
        shared += [any(r.owns(b) for r in comm._shm.values() if r is not None)
                   for b in comm._graph_homes.values()]
        emit((got, shared))
    """, n=n)
    want = [train(None)[:2], train(None)[:2], train(None, micro_batches=2)[:2],
            train(None)[:2]]
    for got, shared in outputs(tmp_path, n):
        assert len(shared) >= 4 and all(shared)
        for (losses, params), (w_losses, w_params) in zip(got, want):
            np.testing.assert_allclose(losses, w_losses, rtol=1e-12)
            for p, q in zip(params, w_params):
                np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)
