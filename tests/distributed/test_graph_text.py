"""Global graphs through their text form: a compiled program holding collective nodes
(``boxing``, ``send``/``recv``, ``sbp_local``) prints, parses back to the same program,
keeps the collectives' guarantees through the passes, and runs the same."""
import numpy as np

import tessera
import tessera.nn.functional as F
from tessera import nn
from tessera.distributed.graph_ops import in_step
from tessera.distributed.placement import placement
from tessera.graph.executor import Executor
from tessera.graph.ir import Graph
from tessera.graph.passes import run_pipeline
from tessera.nn.graph import GraphModule, _tile
from tests.distributed._helpers import B, S, run
from tests.distributed.test_graph_global import TrainGraph, X, Y, _data_parallel, _mlp
from tests.distributed.test_nn_global import _CNN, XC, YC

COLLECTIVES = ("boxing", "send", "recv", "sbp_local", "all_reduce_bucket")


def _collectives(g: Graph) -> list:
    return [(n.op.name, n.attrs.get("seq")) for n in g.nodes if n.op.name in COLLECTIVES]


def _step_values(c, args) -> tuple:
    """Inputs and variables of one step of compiled ``c`` on ``args`` (as ``nn.Graph``
    makes them; lr 0.1), copied so the two programs start from equal state."""
    inputs = [np.array(_tile(args[i]), copy=True) for i in c.in_args]
    inputs += [np.asarray(0.1) for v in c.ir.inputs[len(inputs):]]
    variables = {n: np.array(_tile(t), copy=True) for n, t in c.tensors.items()}
    return inputs, variables


def _run(ir: Graph, inputs, variables) -> list:
    tessera.manual_seed(7)  # the same dropout masks in both runs (the same on every rank)
    with in_step():
        outs, assigns = Executor(ir).run([a.copy() for a in inputs],
                                         {k: v.copy() for k, v in variables.items()})
    return [np.array(o, copy=True) for o in outs] + \
        [np.array(v, copy=True) for _, v in assigns]


def round_trip(graph: nn.Graph, *args) -> dict:
    """On one rank: the compiled program, parsed back from its text, compared (one step
    on ``args`` run by each)."""
    c = graph._current()
    text = str(c.ir)
    parsed = Graph.parse(text)
    parsed.verify()
    inputs, variables = _step_values(c, args)
    want, got = _run(c.ir, inputs, variables), _run(parsed, inputs, variables)
    # the passes run again on the parsed program keep every collective (seq attrs keep
    # CSE off, kernels refusing to run outside a step keep constant folding off, send
    # tokens in the outputs keep DCE off)
    again = Graph.parse(text)
    values = {n: tessera.from_numpy(v) for n, v in variables.items()}
    run_pipeline(again, ["dce", "cse", "constfold", "dce"], training=True, values=values)
    seqs = [s for _, s in _collectives(parsed) if s is not None]
    return {"same_text": str(parsed) == text, "collectives": _collectives(c.ir),
            "parsed": _collectives(parsed), "after_passes": _collectives(again),
            "unique_seqs": len(seqs) == len(set(seqs)),
            "equal": all(np.array_equal(a, b, equal_nan=True) for a, b in zip(want, got))
            and len(want) == len(got)}


def _check(results, *ops) -> None:
    for r in results:
        assert r["same_text"] and r["unique_seqs"] and r["equal"]
        assert r["parsed"] == r["collectives"] == r["after_passes"]
        assert {name for name, _ in r["collectives"]} >= set(ops)


def test_data_parallel_mlp_round_trips():
    def body():
        model = _mlp()
        x, y = _data_parallel(model, tessera.tensor(X), tessera.tensor(Y))
        g = TrainGraph(model, tessera.optim.AdamW(model.parameters(), lr=0.05))
        g(x, y)
        return round_trip(g, x, y)
    # the mean loss and the gradients' all-reduce bucket (the B->S part of the loss's
    # gradient is a slice view, no collective)
    _check(run(2, body), "sbp_local", "all_reduce_bucket")


def test_cnn_with_sync_batch_norm_dropout_and_nll_round_trips():
    def body():
        tessera.manual_seed(0)
        model = _CNN().double()
        x, y = _data_parallel(model, tessera.tensor(XC), tessera.tensor(YC))
        g = TrainGraph(model, tessera.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                       F.cross_entropy)
        g(x, y)
        r = round_trip(g, x, y)
        r["local"] = {n.attrs["sbp_op"] for n in g.ir.nodes if n.op.name == "sbp_local"}
        return r
    results = run(2, body)
    _check(results, "all_reduce_bucket", "sbp_local")
    for r in results:
        assert {"batch_norm", "batch_norm_backward", "dropout", "nll_loss"} <= r["local"]


def test_pipeline_sends_and_receives_round_trip():
    def body():
        tessera.manual_seed(0)
        stages = [nn.Sequential(nn.Linear(k, 4), nn.Tanh()).double() for k in (3, 4)]
        places = [placement("cpu", [r]) for r in range(2)]
        for s, p in zip(stages, places):
            s.to_global(p, B)
        x = tessera.tensor(X[:4, :3]).to_global(places[0], B)
        y = tessera.tensor(Y[:4, :1].repeat(4, 1)).to_global(places[1], B)
        params = [q for s in stages for q in s.parameters()]

        class Pipe(nn.Graph):
            def __init__(self):
                super().__init__()
                self.s0, self.s1 = stages
                self.s0.to(GraphModule).set_stage(0, places[0])
                self.s1.to(GraphModule).set_stage(1, places[1])
                self.add_optimizer(tessera.optim.SGD(params, lr=0.1))
                self.config.set_gradient_accumulation_steps(2)

            def build(self, x, y):
                loss = F.mse_loss(self.s1(self.s0(x)), y)
                loss.backward()
                return loss
        g = Pipe()
        g(x, y)
        return round_trip(g, x, y)
    results = run(2, body)
    _check(results, "send", "recv")


def test_dropout_on_a_2d_mesh_round_trips():
    """The whole-placement dropout node keeps its mesh and input SBPs as literals."""
    from tests.distributed.test_ops_sbp_2d import MESH, _dp_tp

    def body():
        dense = _mlp()
        model = nn.Sequential(dense[0], dense[1], nn.Dropout(0.4), dense[2])
        p = placement("cpu", MESH)
        model.to_global(p, _dp_tp)
        x, y = (tessera.tensor(t).to_global(p, (B, B)).to_global(sbp=(S(0), B)) for t in (X, Y))
        g = TrainGraph(model, tessera.optim.AdamW(model.parameters(), lr=0.05))
        g(x, y)
        r = round_trip(g, x, y)
        r["mesh"] = {n.attrs.get("sbp_mesh") for n in g.ir.nodes if n.op.name == "sbp_local"}
        return r
    results = run(4, body)
    _check(results, "sbp_local")
    for r in results:
        assert ((2, 2), (0, 1, 2, 3)) in r["mesh"]
