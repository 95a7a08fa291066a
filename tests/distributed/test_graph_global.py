"""Global tensors inside ``nn.Graph``: each rank compiles its local program with the
collectives as nodes; training equals eager global mode and one process."""
import numpy as np
import pytest

import tessera
import tessera.nn.functional as F
from tessera import nn
from tessera.distributed.graph_ops import BOXING_OP, in_step
from tessera.distributed.placement import placement
from tessera.nn.parallel import ParallelTransformerEncoderLayer
from tests.distributed._helpers import B, S, run
from tests.distributed.test_nn_global import _CNN, XC, YC
from tests.distributed.test_tensor_parallel import XT, YT, _dense_layer

rng = np.random.default_rng(0)
X = rng.standard_normal((7, 6))  # 7 rows: uneven on 2 and 3 ranks
Y = rng.standard_normal((7, 3))


class TrainGraph(nn.Graph):
    def __init__(self, model, opt, loss_fn=F.mse_loss):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        return loss


def _mlp():
    tessera.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).double()


def _data_parallel(model, x, y):
    """Parameters broadcast, the batch split over every rank of the world."""
    p = placement("cpu", list(range(tessera.distributed.get_world_size())))
    model.to_global(p, B)
    return x.to_global(p, B).to_global(sbp=S(0)), y.to_global(p, B).to_global(sbp=S(0))


def train_mlp(mode: str, steps: int = 4):
    """mode: "local" (one process, eager), "eager" (global, eager), "graph" (global)."""
    model = _mlp()
    x, y = tessera.tensor(X), tessera.tensor(Y)
    if mode != "local":
        x, y = _data_parallel(model, x, y)
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
    params = [q.detach().numpy().copy() for q in model.parameters()]
    boxing = None
    if mode == "graph":
        assert loss.is_global and loss.placement == model[0].weight.placement
        boxing = [(n.attrs["src"], n.attrs["dst"]) if n.op is BOXING_OP else
                  ("bucket", len(n.inputs)) for n in g.ir.nodes
                  if n.op.name in ("boxing", "all_reduce_bucket")]
    return losses, params, boxing


@pytest.mark.parametrize("n", [2, 3])
def test_data_parallel_graph_equals_eager_global_and_one_process(n):
    want_losses, want_params, _ = train_mlp("local")
    eager = run(n, train_mlp, "eager")
    for (losses, params, boxing), (e_losses, e_params, _) in zip(run(n, train_mlp, "graph"),
                                                                   eager):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        np.testing.assert_allclose(losses, e_losses, rtol=1e-12)
        for p, q, e in zip(params, want_params, e_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-13)
            np.testing.assert_allclose(p, e, rtol=1e-12, atol=1e-14)
        # the four weights' partial gradients are all-reduced in the compiled program, as
        # one bucket (tests/distributed/test_graph_bucket.py)
        assert ("P", "B") not in boxing and boxing.count(("bucket", 4)) == 1, boxing


def train_cnn(glob: bool, steps: int = 3):
    """Convolution, synchronised batch norm, dropout and the mean cross-entropy (the
    signatures with their own local computation: one ``sbp_local`` node each)."""
    tessera.manual_seed(0)
    model = _CNN().double()
    x, y = tessera.tensor(XC), tessera.tensor(YC)
    if glob:
        x, y = _data_parallel(model, x, y)
    opt = tessera.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = TrainGraph(model, opt, F.cross_entropy)
    losses = [float(g(x, y).numpy()) for _ in range(steps)]
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    local = sorted({n.attrs["sbp_op"] for n in g.ir.nodes if n.op.name == "sbp_local"})
    return losses, state, local


def test_cnn_graph_with_sync_batch_norm_and_dropout_equals_one_process_graph():
    want_losses, want_state, _ = train_cnn(False)
    for losses, state, local in run(2, train_cnn, True):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-10)
        for k, v in want_state.items():
            np.testing.assert_allclose(state[k], v, rtol=1e-9, atol=1e-12, err_msg=k)
        assert {"batch_norm", "batch_norm_backward", "dropout", "nll_loss"} <= set(local)


def train_transformer(parallel: bool, steps: int = 4):
    layer = _dense_layer()
    x, y = tessera.tensor(XT), tessera.tensor(YT)
    if parallel:
        p = placement("cpu", list(range(tessera.distributed.get_world_size())))
        layer = ParallelTransformerEncoderLayer.from_dense(layer, p)
        x, y = x.to_global(p, B), y.to_global(p, B)
    g = TrainGraph(layer, tessera.optim.AdamW(layer.parameters(), lr=1e-2))
    losses = [float(g(x, y).numpy()) for _ in range(steps)]
    params = layer.to_dense() if parallel else \
        {k: v.detach().numpy() for k, v in layer.state_dict().items()}
    return losses, params


def test_tensor_parallel_transformer_graph_equals_one_process():
    want_losses, want = train_transformer(False)
    for losses, params in run(2, train_transformer, True):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-9)
        for k, v in want.items():
            np.testing.assert_allclose(params[k], v, rtol=1e-8, atol=1e-10, err_msg=k)


def test_passes_keep_every_collective():
    """Two all-reduces of one value stay two (CSE merges no collective), and a collective
    kernel refuses to run outside a graph step (so constant folding leaves it)."""
    class Twice(nn.Graph):
        def build(self, x):
            a = x.to_global(sbp=B)
            b = x.to_global(sbp=B)
            return a + b

    def body():
        from tessera.sbp import partial_sum
        p = placement("cpu", [0, 1])
        x = tessera.ones(3).double().to_global(p, B).to_global(sbp=partial_sum)
        g = Twice()
        g.config.set_bucket_cap_mb(0)  # (bucketing would merge the two after the passes)
        out = g(x).numpy()
        reduces = [n for n in g.ir.nodes if n.op is BOXING_OP]
        node = reduces[0]
        with pytest.raises(RuntimeError, match="only inside a compiled nn.Graph step"):
            node.op.kernels["cpu"](np.ones(3), **node.attrs)
        with in_step():  # inside a step it runs (a lone all-reduce on each rank)
            node.op.kernels["cpu"](np.ones(3), **node.attrs)
        return out.tolist(), len(reduces)
    for out, n_reduces in run(2, body):
        assert out == [2.0, 2.0, 2.0] and n_reduces == 2


def test_a_local_tensor_among_global_inputs_names_the_op():
    class Mixed(nn.Graph):
        def build(self, x, y):
            return x + y

    def body():
        p = placement("cpu", [0, 1])
        x = tessera.ones(2, 3).to_global(p, B)
        Mixed()(x, tessera.ones(2, 3))
    with pytest.raises(RuntimeError, match=r"add: input 1 is a local tensor"):
        run(2, body)


def test_tensor_parallel_inference_graph_equals_one_process():
    """No optimizer: variables may fold at compile time, collectives may not."""
    x = rng.standard_normal((5, 6))

    def body():
        model = _mlp().eval()
        want = model(tessera.tensor(x)).detach().numpy()
        p = placement("cpu", [0, 1])
        model[0].to_global(p, S(0))
        model[2].to_global(p, lambda t: S(1) if t.dim() == 2 else B)

        class Infer(nn.Graph):
            def __init__(self):
                super().__init__()
                self.model = model

            def build(self, x):
                return self.model(x) * 2
        g = Infer()
        outs = [g(tessera.tensor(x).to_global(p, B)) for _ in range(2)]
        return [o.sbp for o in outs], [o.numpy() - 2 * want for o in outs]
    for sbps, errors in run(2, body):
        assert sbps == [(tessera.sbp.partial_sum,)] * 2  # row-parallel output, as eager
        for e in errors:
            np.testing.assert_allclose(e, 0, atol=1e-13)
