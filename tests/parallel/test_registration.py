"""What ``tessera.parallel`` registers with the layers below it (the graph's pass pipeline,
``nn.Graph``'s ZeRO, ``Module.to_global``'s gradient buckets), and what those layers do
while nothing is registered: nothing where that is correct, an error where it is not."""
import pytest

import tessera
import tessera.parallel as par
from tessera import nn
from tessera.distributed import _module
from tessera.graph import passes
from tessera.graph.ir import Graph
from tessera.graph.passes import PassContext, get_pass
from tessera.nn import graph as nn_graph
from tests.distributed._helpers import run

TWO_ALL_REDUCES = """graph(%a: float32[2, 3], %b: float32[4]) {
  %0: float32[2, 3] = boxing(%a) {shape=(2, 3), src='P', dst='B', group=(0, 1), index=0, seq=0}
  %1: float32[4] = boxing(%b) {shape=(4,), src='P', dst='B', group=(0, 1), index=0, seq=1}
  return (%0, %1)
}"""


def test_the_schedule_and_the_bucketing_are_passes_of_the_pipeline():
    assert get_pass("schedule_1f1b") is par.pipeline.run
    assert get_pass("bucket_all_reduces") is par.graph_buckets.run
    assert passes.PIPELINE[0] == "schedule_1f1b" and passes.PIPELINE[-1] == "bucket_all_reduces"
    g = Graph.parse(TWO_ALL_REDUCES)
    assert not get_pass("bucket_all_reduces")(g, PassContext())  # no cap: no buckets
    assert get_pass("bucket_all_reduces")(g, PassContext(bucket_cap=1 << 20))
    assert [n.op.name for n in g.nodes] == ["all_reduce_bucket"]


def test_unprovided_passes_do_nothing_only_where_that_is_correct(monkeypatch):
    monkeypatch.setattr(passes, "_REGISTERED", {})
    g = Graph.parse(TWO_ALL_REDUCES)
    before = str(g)
    assert not get_pass("bucket_all_reduces")(g, PassContext(bucket_cap=1 << 20))
    assert not get_pass("schedule_1f1b")(g, PassContext(micro_batches=4))
    assert str(g) == before  # merging collectives changes no value; no stages: no schedule
    stages = ((0, tessera.placement("cpu", [0])),)
    with pytest.raises(RuntimeError, match="schedule_1f1b.*tessera.parallel"):
        get_pass("schedule_1f1b")(g, PassContext(stages=stages, micro_batches=4))


class _Step(nn.Graph):
    def __init__(self, zero_stage: int):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.add_optimizer(tessera.optim.SGD(self.lin.parameters(), lr=0.1))
        if zero_stage:
            self.config.enable_zero(True, stage=zero_stage)

    def build(self, x):
        loss = self.lin(x).sum()
        loss.backward()
        return loss


def test_nn_graph_without_zero_registered_compiles_only_with_zero_off(monkeypatch):
    assert nn_graph._ZERO == [par.graph_zero.GraphZero]
    monkeypatch.setattr(nn_graph, "_ZERO", [])
    x = tessera.ones(4, 3)
    assert _Step(0)(x).shape == ()
    with pytest.raises(RuntimeError, match="enable_zero.*tessera.parallel"):
        _Step(1)(x)


def _data_parallel_grads():
    """A Linear's gradients under a batch split over two ranks, and its weight's hook."""
    p = tessera.placement("cpu", [0, 1])
    lin = nn.Linear(3, 2).to_global(p, tessera.sbp.broadcast)
    x = tessera.ones(4, 3).to_global(p, tessera.sbp.broadcast).to_global(sbp=tessera.sbp.split(0))
    lin(x).sum().backward()
    return type(lin.weight.__dict__[_module.GRAD_HOOK]), lin.weight.grad.sbp, lin.bias.grad.sbp


def test_module_to_global_without_grad_buckets_boxes_each_gradient(monkeypatch):
    assert _module._GRAD_BUCKETS == [par.grad_buckets.install]
    bucketed = run(2, _data_parallel_grads)
    monkeypatch.setattr(_module, "_GRAD_BUCKETS", [])
    hooked = run(2, _data_parallel_grads)
    B = (tessera.sbp.broadcast,)
    assert all(r == (par.grad_buckets.BucketHooks, B, B) for r in bucketed)
    assert all(r[0] is not par.grad_buckets.BucketHooks and r[1:] == (B, B) for r in hooked)
