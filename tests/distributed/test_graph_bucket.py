"""Gradient all-reduce bucketing in ``nn.Graph`` (``tessera.parallel.graph_buckets``):
the pass as IR text, and data-parallel training that makes one all-reduce per step where
it made one per parameter, with the same values as unbucketed and one-process training."""
from contextlib import contextmanager

import numpy as np
import pytest

import tessera
import tessera.nn.functional as F
from tessera.distributed import comm as C
from tessera.graph.ir import Graph
from tessera.parallel.graph_buckets import merge as bucket
from tests.distributed._helpers import run
from tests.distributed._mpi import outputs, run_mpi
from tests.distributed.test_graph_global import TrainGraph, X, Y, _data_parallel, _mlp

# ---- the pass on IR text ------------------------------------------------------------------

BEFORE = """graph(%a: float32[2, 3], %b: float32[4], %c: float32[5]) {
  %0: float32[2, 3] = boxing(%a) {shape=(2, 3), src='P', dst='B', group=(0, 1), index=0, seq=0}
  %1: float32[4] = boxing(%b) {shape=(4,), src='P', dst='B', group=(0, 1), index=0, seq=1}
  %2: float32[4] = neg(%b)
  %3: float32[4] = exp(%1)
  %4: float32[5] = boxing(%c) {shape=(5,), src='P', dst='B', group=(0, 1), index=0, seq=2}
  %5: float32[5] = recv() {shape=(5,), dtype=float32, src=1, tag=0, seq=3}
  %6: float32[5] = add(%4, %5) {alpha=1}
  return (%0, %2, %3, %6)
}"""

# the first two wait past neg (no reader) and go at exp, their first reader; the third
# stays alone before the recv: the order of collectives is kept
EXPECTED = """graph(%a: float32[2, 3], %b: float32[4], %c: float32[5]) {
  %2: float32[4] = neg(%b)
  %7: float32[2, 3], %8: float32[4] = all_reduce_bucket(%a, %b) {group=(0, 1), index=0, \
seq=0}
  %3: float32[4] = exp(%8)
  %4: float32[5] = boxing(%c) {shape=(5,), src='P', dst='B', group=(0, 1), index=0, seq=2}
  %5: float32[5] = recv() {shape=(5,), dtype=float32, src=1, tag=0, seq=3}
  %6: float32[5] = add(%4, %5) {alpha=1}
  return (%7, %2, %3, %6)
}"""


def test_pass_merges_all_reduces_until_a_reader_or_another_collective():
    g = Graph.parse(BEFORE)
    g._count = 7
    assert bucket(g, 25 << 20)
    g.verify()
    assert str(g) == EXPECTED.replace("\\\n", "")


@pytest.mark.parametrize("cap,sizes", [(40, [24, 16]), (23, [24, 16])])
def test_pass_splits_buckets_at_the_cap_and_never_merges_other_groups_or_dtypes(cap, sizes):
    g = Graph.parse("""graph(%a: float32[6], %b: float32[4], %c: float64[4], %d: float64[4]) {
      %0: float32[6] = boxing(%a) {shape=(6,), src='P', dst='B', group=(0, 1), index=0, seq=0}
      %1: float32[4] = boxing(%b) {shape=(4,), src='P', dst='B', group=(0, 1), index=0, seq=1}
      %2: float64[4] = boxing(%c) {shape=(4,), src='P', dst='B', group=(0, 1), index=0, seq=2}
      %3: float64[4] = boxing(%d) {shape=(4,), src='P', dst='B', group=(0, 2), index=0, seq=3}
      return (%0, %1, %2, %3)
    }""")
    bucket(g, cap)
    g.verify()
    boxes = [sum(v.nbytes for v in n.outputs) for n in g.nodes]
    # float32: 24 + 16 bytes fit a 40-byte bucket, not a 23-byte one; the float64 ones
    # (another dtype, then another group) stay alone
    assert boxes == ([40] if cap >= 40 else sizes) + [32, 32]


def test_unbucketable_nodes_are_left_alone():
    # a reduce-scatter of a 1-row tensor over 2 ranks is not by rows: a collective of its
    # own between the two all-reduces, so neither moves
    text = """graph(%a: float32[4], %b: float32[1]) {
  %0: float32[4] = boxing(%a) {shape=(4,), src='P', dst='B', group=(0, 1), index=0, seq=0}
  %1: float32[1] = boxing(%b) {shape=(1,), src='P', dst='S(0)', group=(0, 1), index=0, \
seq=1}
  %2: float32[4] = boxing(%a) {shape=(4,), src='P', dst='B', group=(0, 1), index=0, seq=2}
  return (%0, %1, %2)
}""".replace("\\\n", "")
    g = Graph.parse(text)
    assert not bucket(g, 25 << 20)
    assert str(g) == text


ZERO = """graph(%w: float32[4, 3], %b: float32[4], %s: float32[2, 3], %t: float32[2]) {
  %0: float32[2, 3] = boxing(%w) {shape=(4, 3), src='P', dst='S(0)', group=(0, 1), index=0, seq=0}
  %1: float32[2] = boxing(%b) {shape=(4,), src='B', dst='S(0)', group=(0, 1), index=0, seq=None}
  %2: float32[2] = boxing(%b) {shape=(4,), src='P', dst='S(0)', group=(0, 1), index=0, seq=1}
  %3: float32[2, 3] = sub(%s, %0) {alpha=1}
  %4: float32[2] = sub(%1, %2) {alpha=1}
  %5: float32[4, 3] = boxing(%3) {shape=(4, 3), src='S(0)', dst='B', group=(0, 1), index=0, seq=2}
  %6: float32[2] = neg(%t)
  %7: float32[4] = boxing(%4) {shape=(4,), src='S(0)', dst='B', group=(0, 1), index=0, seq=3}
  return (%5, %6, %7)
}"""

# the reduce-scatters wait past a local slice (not a collective) and go at the first
# reader; the all-gathers, read by nothing, go at the end
ZERO_BUCKETED = """graph(%w: float32[4, 3], %b: float32[4], %s: float32[2, 3], %t: float32[2]) {
  %1: float32[2] = boxing(%b) {shape=(4,), src='B', dst='S(0)', group=(0, 1), index=0, \
seq=None}
  %8: float32[2, 3], %9: float32[2] = reduce_scatter_bucket(%w, %b) {group=(0, 1), \
index=0, seq=0}
  %3: float32[2, 3] = sub(%s, %8) {alpha=1}
  %4: float32[2] = sub(%1, %9) {alpha=1}
  %6: float32[2] = neg(%t)
  %10: float32[4, 3], %11: float32[4] = all_gather_bucket(%3, %4) {shapes=((4, 3), (4,)), \
group=(0, 1), index=0, seq=2}
  return (%10, %6, %11)
}"""


def test_pass_merges_zeros_reduce_scatters_and_all_gathers():
    g = Graph.parse(ZERO)
    g._count = 8
    assert bucket(g, 25 << 20)
    g.verify()
    assert str(g) == ZERO_BUCKETED.replace("\\\n", "")
    again = Graph.parse(str(g))  # the text form holds everything the bucket nodes need
    assert str(again) == str(g)


def test_producers_write_into_the_bucket_unless_read_after_it():
    """``OpDef.input_buffers``: a matmul read only by the bucket writes straight into the
    bucket's buffer from the second step on; one also read after the bucket (which sums in
    place) keeps its own buffer; the values are the same either way."""
    from tessera.distributed.graph_ops import in_step
    from tessera.graph.executor import Executor
    g = Graph.parse("""graph(%a: float32[2, 3], %b: float32[3, 4]) {
      %0: float32[2, 4] = matmul(%a, %b)
      %1: float32[2, 4] = matmul(%a, %b)
      %2: float32[2, 4], %3: float32[2, 4] = all_reduce_bucket(%0, %1) {group=(0,), \
index=0, seq=0}
      %4: float32[2, 4] = exp(%1)
      return (%2, %3, %4)
    }""".replace("\\\n", ""))
    ex = Executor(g)
    assert list(ex.buffered) == [0]
    rng = np.random.default_rng(0)
    for _ in range(3):
        a, b = rng.standard_normal((2, 3), np.float32), rng.standard_normal((3, 4), np.float32)
        with in_step():
            outs, _ = ex.run([a, b], {})
        for o, want in zip(outs, [a @ b, a @ b, np.exp(a @ b)]):
            np.testing.assert_allclose(o, want, rtol=1e-6)


def test_weight_gradients_go_straight_into_the_bucket():
    def body():
        model = _mlp()
        x, y = _data_parallel(model, tessera.tensor(X), tessera.tensor(Y))
        g = TrainGraph(model, tessera.optim.AdamW(model.parameters(), lr=0.05), F.mse_loss)
        g(x, y)
        ex = g._current().executor
        return sorted(ex.graph.nodes[i].op.name for i in ex.buffered)
    # the two weight gradients (matmuls); the biases' are views of sums, copied in
    assert run(2, body) == [["matmul", "matmul"]] * 2


# ---- training -----------------------------------------------------------------------------

def train(cap_mb, steps: int = 4, n_params: int = 4):
    """Data-parallel MLP training in a graph; (losses, params, all-reduce nodes, all-reduce
    calls per step)."""
    model = _mlp()
    x, y = _data_parallel(model, tessera.tensor(X), tessera.tensor(Y))
    g = TrainGraph(model, tessera.optim.AdamW(model.parameters(), lr=0.05), F.mse_loss)
    if cap_mb is not None:
        g.config.set_bucket_cap_mb(cap_mb)
    with _counting(C.current()) as calls:
        losses = [float(g(x, y).numpy()) for _ in range(steps)]
    params = [q.detach().numpy().copy() for q in model.parameters()]
    nodes = [n for n in g.ir.nodes if n.op.name == "all_reduce_bucket" or
             (n.op.name == "boxing" and (n.attrs["src"], n.attrs["dst"]) == ("P", "B"))]
    return losses, params, len(nodes), len(calls) // steps


@contextmanager
def _counting(comm):
    """The all-reduces ``comm`` starts (in place or not), each counted once."""
    calls, depth = [], [0]
    saved = {name: getattr(comm, name) for name in ("all_reduce", "iall_reduce_")}

    def wrap(fn):
        def counted(*a, **k):
            depth[0] += 1
            try:
                if depth[0] == 1:
                    calls.append(a[0].size)
                return fn(*a, **k)
            finally:
                depth[0] -= 1
        return counted
    for name, fn in saved.items():
        setattr(comm, name, wrap(fn))
    try:
        yield calls
    finally:
        for name in saved:
            delattr(comm, name)


def one_process(steps: int = 4):
    model = _mlp()
    opt = tessera.optim.AdamW(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(tessera.tensor(X)), tessera.tensor(Y))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [q.detach().numpy().copy() for q in model.parameters()]


@pytest.mark.parametrize("n", [2, 3])
def test_bucketed_training_equals_unbucketed_and_one_process(n):
    want_losses, want_params = one_process()
    for (losses, params, nodes, calls), (u_losses, u_params, u_nodes, u_calls) in zip(
            run(n, train, None), run(n, train, 0)):
        # four gradient all-reduce nodes against one bucket (a call more per step: the mean
        # loss's global count, inside its sbp_local node)
        assert (u_nodes, u_calls) == (4, 5) and (nodes, calls) == (1, 2)
        np.testing.assert_array_equal(losses, u_losses)  # the same sums, bit for bit
        for p, q in zip(params, u_params):
            np.testing.assert_array_equal(p, q)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-12)


def test_a_small_cap_makes_more_buckets():
    # float64 gradients of 3, 3x8, 8, 8x6 elements, in the order backward makes them:
    # 24 + 192 bytes fit 250, 64 more do not, nor 64 + 384
    want_losses, want_params = one_process()
    for losses, params, nodes, calls in run(2, train, 250 / 2 ** 20):
        assert (nodes, calls) == (3, 4)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-12)


def test_mpi_bucketed_training(tmp_path):
    """Under mpiexec -n 2: one all-reduce call per step for the gradients, the same values
    as unbucketed and one process."""
    run_mpi(tmp_path, """
        from tessera.distributed import comm as C
        from tests.distributed._mpi import emit
        from tests.distributed.test_graph_bucket import train
        bucketed = train(None)
        comm = C.current()
        # the bucket node's buffer: made once, in shared memory
        shared = [comm._shm[k[0]].owns(b) for k, b in comm._graph_buckets.items()]
        emit((bucketed, train(0), shared))
    """)
    want_losses, want_params = one_process()
    for (losses, params, nodes, calls), (u_losses, u_params, u_nodes, u_calls), shared in \
            outputs(tmp_path):
        assert (nodes, calls, u_nodes, u_calls) == (1, 2, 4, 5)
        assert shared == [True]
        np.testing.assert_array_equal(losses, u_losses)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for p, q, u in zip(params, want_params, u_params):
            np.testing.assert_array_equal(p, u)
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-12)
