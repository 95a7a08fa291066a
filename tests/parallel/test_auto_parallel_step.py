"""The step walk of auto-parallel's cost model (``tessera.parallel.auto_parallel_step``):
the collectives it counts for a plan are the ones the compiled ``nn.Graph`` step runs,
on every hand-written plan of the bench's workloads (at a few percent of their sizes)."""
import collections
import dataclasses
import math

import pytest

import tessera
from bench import autoparallel as BA
from tessera.distributed.calibrate import DEFAULT, Profile
from tessera.graph.passes import fuse
from tessera.parallel import auto_parallel as AP, auto_parallel_step as W
from tests.distributed._helpers import run

pytest.importorskip("scipy")

# the collective each communicating conversion runs (boxing.box_1d), and the graph ops
_COLLECTIVE = {("P", "B"): "all_reduce", ("P", "S"): "reduce_scatter",
               ("S", "B"): "all_gather", ("S", "S"): "all_to_all"}
_NODES = {"all_reduce_bucket": "all_reduce", "reduce_scatter_bucket": "reduce_scatter",
          "all_gather_bucket": "all_gather", "sbp_local": "local"}


def _kind(src: str, dst: str) -> str | None:
    return _COLLECTIVE.get((src[0], dst[0]))


def _compiled_step(name: str, spec, n: int, multi_output: bool = True):
    """The training step of ``name`` under the hand plan ``spec`` on ``n`` ranks, compiled
    by one call (``multi_output``: with multi-output fusion)."""
    model, loss_fn, x, y = BA._build(name, small=True)
    p = tessera.placement("cpu", list(range(n)))
    opt = tessera.optim.AdamW(model.parameters(), lr=1e-4)

    class Step(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = loss_fn(self.model, x, y)
            loss.backward()
            return loss
    g = Step()
    params, inputs, zero = spec
    by_id = {id(t): (AP._parse(params[k]),) for k, t in model.named_parameters()}
    model.to_global(p, lambda t: by_id.get(id(t), (tessera.sbp.broadcast,)))
    x, y = (a.to_global(p, tessera.sbp.broadcast).to_global(sbp=(AP._parse(inputs),))
            for a in (x, y))
    if zero:
        g.config.enable_zero(True, stage=2, shard_min_size=BA._ZERO_MIN)
    fuse.MULTI_OUTPUT = multi_output
    try:
        g(x, y)
    finally:
        fuse.MULTI_OUTPUT = True
    return g


def _compiled(name: str, spec, n: int) -> list[str]:
    """The collectives of the compiled training step of ``name`` under ``spec``, in order
    (rank 0's program; every rank runs the same ones)."""
    # multi-output fusion can leave a collective dead (one whose value only a region's
    # other outputs needed: 2 of 34 on the Transformer's Megatron plan, same losses), which
    # the walk still counts; the walk models the step without it
    g = _compiled_step(name, spec, n, multi_output=False)
    out = []
    for node in g.ir.nodes:
        if node.op.name == "boxing":
            kind = _kind(node.attrs["src"], node.attrs["dst"])
            if kind is not None:
                out.append(kind)
        elif node.op.name in _NODES:
            out.append(_NODES[node.op.name])
    return out


def _realised(name: str, spec, n: int, prof) -> tuple:
    """(the cost model's problem, the assignment) of the hand plan ``spec`` of ``name`` on
    ``n`` ranks under profile ``prof``."""
    model, loss_fn, x, y = BA._build(name, small=True)
    g = AP.record(lambda a, b: loss_fn(model, a, b), (x, y), dict(model.named_parameters()))
    params, inputs, zero = spec
    c = AP.build_costs(g, (n,), prof, zero, "AdamW", BA._ZERO_MIN)
    leaves = {}
    for v, node in enumerate(g.nodes):
        if node.kind in ("param", "input"):
            want = (AP._parse(params[node.name] if node.kind == "param" else inputs),)
            leaves[v] = next(k for k, cand in enumerate(c.cands[v])
                             if tuple(s.outs[0] for s in cand) == want)
    return c, AP.realise(c, leaves)


def _walked(name: str, spec, n: int) -> list[str]:
    """The collectives the cost model's walk of the same plan counts, in order."""
    c, assign = _realised(name, spec, n, DEFAULT)
    out = []
    for e in W.walk(c, assign):
        if e.what == "conversion":
            out.append(_kind(e.src.short(), e.dst.short()))
        elif e.what == "local":
            out.append("local")
        elif e.what != "compute":
            out.append(e.what.split()[0])
    return out


def _plans():
    for name in BA.WORKLOADS:
        names = [k for k, _ in BA._build(name, small=True)[0].named_parameters()]
        for plan, spec in BA.plans(name, names).items():
            yield pytest.param(name, spec, id=f"{name}-{plan}")


@pytest.mark.parametrize("name,spec", list(_plans()))
def test_collectives_counted_are_the_compiled_steps(name, spec):
    compiled = run(2, _compiled, name, spec, 2)[0]
    walked = _walked(name, spec, 2)
    assert len(walked) == len(compiled), (walked, compiled)
    assert collections.Counter(walked) == collections.Counter(compiled), (walked, compiled)


def _op_names(name: str, spec, n: int) -> list[str]:
    return [node.op.name for node in _compiled_step(name, spec, n).ir.nodes]


@pytest.mark.parametrize("name", ["transformer", "gpt-mini"])
def test_the_step_runs_the_attention_the_walk_records(name):
    # 2 heads over 3 ranks: the input projection split by features leaves no whole head on
    # a rank, so the attention's inputs arrive partial or split off the heads; the step
    # runs the fused op the walk records (global tensors took its composite, whose
    # products made other conversions than the walk counted)
    names = [k for k, _ in BA._build(name, small=True)[0].named_parameters()]
    spec = BA.plans(name, names)["tp-attn"]
    c, _ = _realised(name, spec, 3, DEFAULT)
    recorded = [node.op.name for node in c.graph.nodes if node.kind == "op"] + \
        [node.op.name for node in c.graph.backward]
    ops = run(3, _op_names, name, spec, 3)[0]
    for op in ("scaled_dot_product_attention", "scaled_dot_product_attention_backward"):
        assert recorded.count(op) == ops.count(op) == 2, (op, ops)


def _priced(name: str, spec, n: int, prof) -> tuple[float, int]:
    """(the walk's price, its collectives) of a plan of ``name`` under profile ``prof``."""
    c, assign = _realised(name, spec, n, prof)
    return W.price(c, assign), W.collectives(c, assign)


def test_profile_collective_cost_is_charged_per_collective():
    # the profile's per-collective cost of a step: each collective the walk counts pays it
    # once (the default profile has no skew, so nothing else differs), and one large
    # enough ranks the plan with more collectives below the one with fewer
    names = [k for k, _ in BA._build("gpt-mini", small=True)[0].named_parameters()]
    plans = BA.plans("gpt-mini", names)
    few, many = plans["dp"], plans["tp"]
    (t_few, k_few), (t_many, k_many) = (_priced("gpt-mini", s, 2, DEFAULT) for s in (few, many))
    assert k_many > k_few
    # the cost at which the two plans tie, from the model's own prices; twice that and more
    tie = max((t_few - t_many) / (k_many - k_few), 1e-4)
    cost = 2 * tie
    prof = dataclasses.replace(DEFAULT, collective={2: cost})
    (c_few, _), (c_many, _) = (_priced("gpt-mini", s, 2, prof) for s in (few, many))
    assert c_few == pytest.approx(t_few + cost * k_few, rel=1e-9)
    assert c_many == pytest.approx(t_many + cost * k_many, rel=1e-9)
    assert c_many > c_few
    # a profile saved before the field existed loads with none: the prices as before
    old = {k: v for k, v in prof.to_json().items() if k != "collective"}
    assert _priced("gpt-mini", few, 2, Profile.from_json(old))[0] == pytest.approx(t_few)


def _compiled_matmul_flops(name: str, spec, n: int) -> float:
    """The FLOPs of the matrix products one rank runs in the compiled training step of
    ``name`` under ``spec`` (from the compiled graph's matmul nodes and their tiles)."""
    g = _compiled_step(name, spec, n)
    flops = 0.0
    for node in g.ir.nodes:
        if node.op.name == "matmul":
            a, out = node.tensor_inputs[0], node.outputs[0]
            flops += 2.0 * math.prod(out.shape) * a.shape[-1]
    return flops


@pytest.mark.parametrize("plan", ["replicated", "dp", "tp", "col", "row", "dp+tp"])
def test_walk_prices_each_ranks_matmul_flops(plan):
    # a profile whose GEMMs run at 1 FLOP/s and whose memory and ops cost nothing: the
    # walk's matrix products cost their FLOPs on one rank's tiles, which must be what the
    # compiled step's matmul nodes compute (a gradient left partial by the next op's
    # backward is multiplied whole on every rank: the column split's second linear)
    names = [k for k, _ in BA._build("mlp", small=True)[0].named_parameters()]
    spec = BA.plans("mlp", names)[plan]
    prof = Profile(gemm={"small": 1.0, "medium": 1.0, "large": 1.0}, bandwidth=1e30,
                   op_overhead=0.0)
    c, assign = _realised("mlp", spec, 2, prof)
    walked = sum(e.seconds for e in W.walk(c, assign) if e.op == "matmul")
    assert walked == pytest.approx(run(2, _compiled_matmul_flops, "mlp", spec, 2)[0], rel=1e-9)


def test_zero_buckets_are_priced_at_their_members_boxing():
    # the small MLP under DP+ZeRO with the default shard_min_size: its two weights (2,048
    # elements) are sharded, its biases (64 and 32) are not; the biases' all-reduces run
    # within the weights' reduce-scatter (one collective of gradients), then one all-gather
    # of the updated weights. A bucket by rows costs what its members' boxing steps cost
    # alone (the profile's measured P->S(0), P->B, S->B, copies into the buffer included),
    # its latency once, less the copies of the weights' tiles, which their producers (the
    # weight gradients' products, the update) write into the buffer: the all-gather's
    # buffer is the parameters'; the biases' sums are copied in; each member an op's
    # overhead
    names = [k for k, _ in BA._build("mlp", small=True)[0].named_parameters()]
    spec = BA.plans("mlp", names)["dp+zero"]
    prof = Profile(boxing={"P->S(0)": {2: (3e-5, 1e9)}, "P->B": {2: (5e-5, 2e9)},
                   "S->B": {2: (2e-5, 4e9)}})
    c, assign = _realised("mlp", spec, 2, prof)
    buckets = [e for e in W.walk(c, assign) if e.what.endswith("bucket")]
    assert [e.what for e in buckets] == ["reduce_scatter bucket", "all_gather bucket"]
    scatter, gather = buckets
    got = sorted((m.src.short(), m.dst.short(), m.nbytes) for m in scatter.members)
    assert got == [("P", "B", 32 * 4), ("P", "B", 64 * 4), ("P", "S(0)", 2048 * 4),
                   ("P", "S(0)", 2048 * 4)]
    assert sorted(m.nbytes for m in gather.members) == [2048 * 4, 2048 * 4]
    copy = prof.memory_seconds  # (the default bandwidth: 5e9 bytes/s)
    want = 5e-5 + 2 * (2048 * 4 / 1e9 - copy(2048 * 4)) + (32 + 64) * 4 / 2e9 + \
        4 * prof.op_overhead
    assert W.event_seconds(prof, (2,), scatter, 0.0) == pytest.approx(want, rel=1e-9)
    assert W.event_seconds(prof, (2,), gather, 0.0) == pytest.approx(
        2e-5 + 2 * (2048 * 4 / 4e9 - copy(2048 * 4 / 2)) + 2 * prof.op_overhead, rel=1e-9)


def test_all_reduce_bucket_copies_in_only_the_sums():
    # the small MLP under data parallelism: one all-reduce of its four gradients, in place
    # on the bucket's buffer (the communicator's alpha-beta), its results views of it; the
    # weights' gradients are products written into the buffer, the biases' sums copied in;
    # each member an op's overhead
    names = [k for k, _ in BA._build("mlp", small=True)[0].named_parameters()]
    prof = Profile(comm={"all_reduce": {2: (4e-5, 1e9)}}, bandwidth=2e9, op_overhead=1e-5)
    c, assign = _realised("mlp", BA.plans("mlp", names)["dp"], 2, prof)
    [bucket] = [e for e in W.walk(c, assign) if e.what.endswith("bucket")]
    assert sorted((m.nbytes, m.copied) for m in bucket.members) == [
        (32 * 4, True), (64 * 4, True), (2048 * 4, False), (2048 * 4, False)]
    want = 4e-5 + (2048 + 2048 + 64 + 32) * 4 / 1e9 + (64 + 32) * 4 / 2e9 + 4 * 1e-5
    assert W.event_seconds(prof, (2,), bucket, 0.0) == pytest.approx(want, rel=1e-9)


def test_minor_parameters_are_broadcast_where_the_walk_prices_it_lower():
    # Megatron's MLP with the row-parallel layer's bias split by features: the layer's
    # output is then reduce-scattered and all-gathered (two collectives, each waiting out
    # the ranks' skew) where a broadcast bias leaves one all-reduce; the search's last
    # step puts such a minor parameter back to broadcast on the walk's word
    names = [k for k, _ in BA._build("mlp", small=True)[0].named_parameters()]
    params, inputs, zero = BA.plans("mlp", names)["tp"]
    assert params["2.bias"] == "B"
    # (boxing rates of the kind a 2-core host measures: a reduce-scatter by features
    # moves its bytes at about half an all-reduce's rate)
    prof = Profile(sync={2: 1e-4}, collective={2: 1e-4},
                   boxing={"P->B": {2: (7e-5, 4.6e9)}, "P->S": {2: (7e-5, 2.8e9)},
                           "P->S(0)": {2: (1e-4, 6e9)}, "S->B": {2: (1e-4, 7.2e9)},
                           "B->S": {2: (1e-5, 3.3e10)}})
    c, megatron = _realised("mlp", (params, inputs, zero), 2, prof)
    _, split = _realised("mlp", ({**params, "2.bias": "S(0)"}, inputs, zero), 2, prof)
    assert AP.realised(c, megatron)[0] < AP.realised(c, split)[0]
    assert AP._minor_broadcast(c, split) == megatron
    assert AP._minor_broadcast(c, megatron) == megatron
