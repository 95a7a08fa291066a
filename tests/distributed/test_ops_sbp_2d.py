"""Ops on a 2x2 mesh (4 simulated ranks), OneFlow's N-D SBP: each input gets one SBP per
mesh axis, dispatch picks one 1-D signature per axis, and the forward value and input
gradients must equal the single-process run. Every combination of a case's input SBPs is
too many to run (two 2-d inputs: 256), so a case with more than ``EVERY`` runs a fixed
sample of ``SAMPLE`` of them, drawn with a seed of its own, beside the combination that
keeps every input whole. Splits of 5 rows over 2 then 2 ranks are uneven (3 + 2, then 2 +
1 and 1 + 1)."""
import itertools
import zlib

import numpy as np
import pytest

import tessera
import tessera.nn.functional as F
from tessera.distributed.placement import placement
from tests.distributed._helpers import B, P, S, global_from, run, sbps_nd
from tests.distributed.test_graph_global import TrainGraph, X, Y, _mlp
from tests.distributed.test_ops_sbp import CASES, _single
from tests.distributed.test_ops_sbp_more import CASES as MORE

MESH = [[0, 1], [2, 3]]
EVERY, SAMPLE = 64, 16

NAMES = ["add", "add_broadcast", "mul", "where", "sum_all", "sum_dim", "sum_keepdim",
         "mean_all", "mean_dim", "matmul", "matmul_batched", "bmm", "linear", "softmax",
         "log_softmax", "view", "view_split_heads", "reshape_flat", "reshape_merge_heads",
         "transpose", "expand", "cat", "slice", "layer_norm", "layer_norm_3d", "rms_norm",
         "conv2d", "embedding", "cross_entropy_sum", "cross_entropy_mean",
         "cross_entropy_mean_3d", "batch_norm_train", "max_pool2d_4c", "mse"]

# (max_pool2d refuses an empty tile, as PyTorch refuses 0 channels: S(1) of 2 channels on
# both axes leaves one rank in each row none, so the 2-D case has 4)
CASES = dict(CASES, max_pool2d_4c=(lambda x: F.max_pool2d(x, 2), [(3, 4, 4, 4)]))


def _inputs(name, shapes):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    out = []
    for s in shapes:
        if s[0] == "i":
            out.append(rng.integers(0, 6, s[1:]))
        elif s[0] == "+":
            out.append(np.abs(rng.standard_normal(s[1:])) + 0.5)
        else:
            out.append(rng.standard_normal(s))
    return out


def _combos(name, arrays):
    every = list(itertools.product(*[sbps_nd(a.ndim, 2, a.dtype.kind == "f")
                                     for a in arrays]))
    if len(every) <= EVERY:
        return every
    rng = np.random.default_rng(zlib.crc32(name.encode()) + 1)
    pick = rng.choice(len(every), SAMPLE, replace=False)
    return [tuple((B, B) for _ in arrays)] + [every[i] for i in sorted(pick)]


def sweep_body(fn, arrays, combos, rtol=1e-10, atol=1e-12) -> list:
    """On one rank of the 2x2 mesh (simulated, or under ``mpiexec -n 4``): ``fn`` on every
    combination of input SBPs, forward and input gradients checked against one process;
    returns the (input SBPs, output SBP) each combination ran with."""
    want, w, grads = _single(fn, arrays)
    p = placement("cpu", MESH)
    seen = []
    for sbps in combos:
        label = [tuple(s.short() for s in nd) for nd in sbps]
        xs = [global_from(a, p, nd, requires_grad=a.dtype.kind == "f")
              for a, nd in zip(arrays, sbps)]
        y = fn(*xs)
        assert y.is_global and y.shape == want.shape and len(y.sbp) == 2, (label, y.shape)
        np.testing.assert_allclose(y.detach().numpy(), want, rtol=rtol, atol=atol,
                                   err_msg=f"forward with {label}")
        (y * tessera.tensor(w).to_global(p, (B, B))).sum().backward()
        for x, g in zip(xs, grads):
            if g is not None:
                assert len(x.grad.sbp) == 2
                np.testing.assert_allclose(x.grad.numpy(), g, rtol=rtol, atol=atol,
                                           err_msg=f"grad with {label}")
        seen.append((label, tuple(s.short() for s in y.sbp)))
    return seen


def _sweep_2d(fn, arrays, combos, rtol=1e-10, atol=1e-12):
    return run(4, sweep_body, fn, arrays, combos, rtol, atol)


def mesh_case(name: str, n: int | None = None) -> list:
    """``sweep_body`` of case ``name`` (its first ``n`` combinations) on this rank."""
    fn, shapes, *tol = CASES[name]
    arrays = _inputs(name, shapes)
    return sweep_body(fn, arrays, _combos(name, arrays)[:n], rtol=tol[0] if tol else 1e-10,
                      atol=tol[0] if tol else 1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_op_on_a_2x2_mesh(name):
    fn, shapes, *tol = CASES[name]
    arrays = _inputs(name, shapes)
    seen = _sweep_2d(fn, arrays, _combos(name, arrays), rtol=tol[0] if tol else 1e-10,
                     atol=tol[0] if tol else 1e-12)
    assert all(s == seen[0] for s in seen)  # every rank chose the same signatures


def _chosen(fn, arrays, sbps):
    """Each rank's output SBP of ``fn`` on inputs with the N-D ``sbps``, and whether the
    value equals one process."""
    want = _single(fn, arrays)[0]

    def body():
        p = placement("cpu", MESH)
        y = fn(*[global_from(a, p, nd) for a, nd in zip(arrays, sbps)])
        ok = np.allclose(y.numpy(), want, rtol=1e-10, atol=1e-12)
        return tuple(s.short() for s in y.sbp), ok
    return run(4, body)


def test_signatures_that_fit_move_nothing():
    """Inputs that already fit a signature on each axis keep it: matmul's S(0)xB->S(0)
    then S(1)xS(0)->P, and B x S(1) -> S(1) beside a batch split."""
    a, b = _inputs("matmul_choice", [(4, 6), (6, 4)])
    mm = CASES["matmul"][0]
    assert _chosen(mm, [a, b], [(S(0), S(1)), (B, S(0))])[0] == (("S(0)", "P"), True)
    assert _chosen(mm, [a, b], [(S(0), B), (B, S(1))])[0] == (("S(0)", "S(1)"), True)
    assert _chosen(mm, [a, b], [(P, B), (B, B)])[0] == (("P", "B"), True)


def test_communicating_signatures_run_on_the_last_axis():
    """Synchronised batch norm and the mean loss's global count run within the ranks of
    the last mesh axis (a batch split there stays); on the first axis they would not
    commute with the second's signature, so a batch split there is gathered first."""
    x, w, b = _inputs("bn", [(6, 3, 2, 2), (3,), (3,)])
    bn = CASES["batch_norm_train"][0]
    assert _chosen(bn, [x, w, b], [(B, S(0)), (B, B), (B, B)])[0] == (("B", "S(0)"), True)
    (sbps, ok), = set(_chosen(bn, [x, w, b], [(S(0), B), (B, B), (B, B)]))
    assert ok and sbps[0] != "S(0)"
    logits, t = _inputs("ce", [(6, 5), ("i", 6)])
    ce = CASES["cross_entropy_mean"][0]
    assert _chosen(ce, [logits, t], [(B, S(0)), (B, S(0))])[0] == (("B", "P"), True)
    a = _inputs("mean", [(6, 4)])
    assert _chosen(lambda x: x.mean(), a, [(S(0), S(0))])[0] == (("B", "P"), True)
    ctc, shapes = MORE["ctc_loss_sum"]
    lp = _inputs("ctc", [shapes[0]])[0]
    tg = np.random.default_rng(1).integers(0, 4, (4, 3))
    assert _chosen(ctc, [lp, tg], [(B, S(1)), (B, S(0))])[0] == (("B", "P"), True)


DROPOUTS = {"dropout": lambda t: F.dropout(t, 0.5),
            "alpha_dropout": lambda t: F.alpha_dropout(t, 0.3, True),
            "dropout2d": lambda t: F.dropout2d(t, 0.5)}


@pytest.mark.parametrize("name", list(DROPOUTS))
@pytest.mark.parametrize("sbps", [(S(0), S(1)), (S(0), S(0)), (S(2), S(3)), (B, S(1)),
                                  (P, S(0)), (S(1), P), (B, B)])
def test_dropout_on_a_2d_mesh_equals_one_process(name, sbps):
    """Every rank takes its tile of the one mask one process draws, with the seed of the
    placement's first rank (the others' generators differ), whatever each axis splits;
    partial_sum stays partial where dropout is linear (alpha dropout's shift is not: its
    input is reduced first). The gradient goes through the same rule."""
    fn = DROPOUTS[name]
    x = _inputs(name, [(5, 6, 3, 3)])[0]
    tessera.manual_seed(3)
    xt = tessera.tensor(x, requires_grad=True)
    want = fn(xt)
    (want * want).sum().backward()

    def body():
        rank = tessera.distributed.get_rank()
        tessera.manual_seed(3 if rank == 0 else 10 + rank)
        g = global_from(x, placement("cpu", MESH), sbps, requires_grad=True)
        y = fn(g)
        (y * y).sum().backward()
        return y.detach().numpy(), g.grad.numpy()
    for y, grad in run(4, body):
        np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(grad, xt.grad.numpy(), rtol=1e-12, atol=1e-14)


def _train_dropout_2d(mode: str, steps: int = 3):
    """The 2-D parallel MLP of ``_train_2d`` with dropout after its hidden layer (the
    hidden activations split on both axes: batch rows, Megatron's columns)."""
    dense = _mlp()
    model = tessera.nn.Sequential(dense[0], dense[1], tessera.nn.Dropout(0.4), dense[2])
    x, y = tessera.tensor(X), tessera.tensor(Y)
    if mode != "local":
        p = placement("cpu", MESH)
        model.to_global(p, _dp_tp)
        x, y = (t.to_global(p, (B, B)).to_global(sbp=(S(0), B)) for t in (x, y))
    g = TrainGraph(model, tessera.optim.AdamW(model.parameters(), lr=0.05))
    rank = tessera.distributed.get_rank() if mode != "local" else 0
    tessera.manual_seed(5 if rank == 0 else 20 + rank)
    losses = [float(g(x, y).detach().numpy()) for _ in range(steps)]
    local = [n.attrs["sbp_op"] for n in g.ir.nodes if n.op.name == "sbp_local"]
    return losses, model[0].weight.detach().numpy(), local


def test_dropout_in_a_graph_on_a_2d_mesh_equals_one_process():
    """nn.Graph: one sbp_local node per dropout over the whole placement (a fresh seed each
    step, the first rank's), the same losses and weights as one process's graph."""
    losses, w, _ = _train_dropout_2d("local")
    for got, gw, local in run(4, _train_dropout_2d, "graph"):
        np.testing.assert_allclose(got, losses, rtol=1e-10)
        np.testing.assert_allclose(gw, w, rtol=1e-10, atol=1e-12)
        assert local.count("dropout") == 2  # forward, and the gradient's mask


def _dp_tp(t):
    """Mesh axis 0 data parallel; axis 1 Megatron: fc1 column-parallel, fc2 row-parallel."""
    if t.shape in ((8, 6), (8,)):
        return (B, S(0))
    return (B, S(1)) if t.shape == (3, 8) else (B, B)


def _train_2d(mode: str, steps: int = 3):
    model = _mlp()
    x, y = tessera.tensor(X), tessera.tensor(Y)
    if mode != "local":
        p = placement("cpu", MESH)
        model.to_global(p, _dp_tp)
        x, y = (t.to_global(p, (B, B)).to_global(sbp=(S(0), B)) for t in (x, y))
    opt = tessera.optim.AdamW(model.parameters(), lr=0.05)
    g = TrainGraph(model, opt)
    losses = []
    for _ in range(steps):
        if mode == "graph":
            loss = g(x, y)
        else:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        losses.append(float(loss.detach().numpy()))
    w = model[0].weight.detach()
    return losses, w.numpy(), None if mode == "local" else w.sbp


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_data_and_tensor_parallel_mlp_on_a_2x2_mesh(mode):
    """2-D parallelism (batch split on axis 0, Megatron on axis 1) trains like one process,
    in eager mode and in nn.Graph; the weights keep their N-D SBP."""
    losses, w, _ = _train_2d("local")
    for got, gw, sbps in run(4, _train_2d, mode):
        np.testing.assert_allclose(got, losses, rtol=1e-10)
        np.testing.assert_allclose(gw, w, rtol=1e-10, atol=1e-12)
        assert sbps == (B, S(0))


class _NormLoss(tessera.nn.Graph):
    def build(self, x, t):
        return F.cross_entropy(F.batch_norm(x, None, None, training=True), t)


def test_communicating_signatures_in_a_graph():
    """nn.Graph records the last axis's synchronised batch norm and mean loss as
    sbp_local nodes on that axis's ranks; two steps equal one process."""
    x, t = _inputs("graph_bn", [(6, 5), ("i", 6)])
    want = _single(lambda a, b: _NormLoss.build(None, a, b), [x, t])[0]

    def body():
        p = placement("cpu", MESH)
        g = _NormLoss()
        args = global_from(x, p, (B, S(0))), global_from(t, p, (B, S(0)))
        y1, y2 = g(*args), g(*args)
        return y1.sbp, float(y1.numpy()), float(y2.numpy())
    for sbps, y1, y2 in run(4, body):
        assert sbps == (B, P)
        np.testing.assert_allclose([y1, y2], [want, want], rtol=1e-10)
