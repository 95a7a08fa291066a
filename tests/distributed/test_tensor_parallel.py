"""Tensor (model) parallelism with SBP on weights: column/row-parallel Linear, the parallel
MLP and attention, and the Transformer encoder layer trained tensor-parallel for 10 steps
equal to one process (FakeWorld here; mpiexec -n 2 in test_mpi)."""
import numpy as np
import pytest

import tessera
from tessera import nn
from tessera.distributed.placement import placement
from tessera.nn.parallel import (
    ColumnParallelLinear,
    ParallelMultiheadAttention,
    ParallelTransformerEncoderLayer,
    RowParallelLinear,
)
from tests.distributed._helpers import B, P, S, run

rng = np.random.default_rng(0)
X = rng.standard_normal((3, 5, 8))


def _dense_mlp():
    tessera.manual_seed(0)
    return nn.Linear(8, 12).double(), nn.Linear(12, 8).double()


def test_column_then_row_parallel_linear_is_partial_and_equals_dense():
    fc1, fc2 = _dense_mlp()
    x = tessera.tensor(X, requires_grad=True)
    want = fc2(fc1(x).relu())
    want.sum().backward()

    def body():
        c, r = _dense_mlp()
        col = ColumnParallelLinear(8, 12, dtype=tessera.float64)
        row = RowParallelLinear(12, 8, dtype=tessera.float64)
        with tessera.no_grad():
            for mine, dense in ((col, c), (row, r)):
                for name in ("weight", "bias"):
                    t = getattr(mine, name)
                    t.copy_(getattr(dense, name).to_global(t.placement, B))
        h = col(tessera.tensor(X))
        y = row(h.relu())
        y.sum().backward()
        return (h.sbp, y.sbp, col.weight.sbp, row.weight.sbp, row.bias.sbp, y.detach().numpy(),
                col.weight.grad.numpy(), row.weight.grad.numpy(), row.bias.grad.numpy())
    for hs, ys, cw, rw, rb, y, gc, gr, gb in run(2, body):
        assert (hs, ys, cw, rw, rb) == ((S(2),), (P,), (S(0),), (S(1),), (B,))
        np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(gc, fc1.weight.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(gr, fc2.weight.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(gb, fc2.bias.grad.numpy(), rtol=1e-12)


def test_linear_recipe_with_module_to_global():
    """The same layout on plain nn.Linear: weight split(0), then split(1)."""
    fc1, fc2 = _dense_mlp()
    want = fc2(fc1(tessera.tensor(X))).detach().numpy()

    def body():
        a, b = _dense_mlp()
        p = placement("cpu", [0, 1])
        a.to_global(p, S(0))
        b.to_global(p, lambda t: S(1) if t.dim() == 2 else B)
        y = b(a(tessera.tensor(X).to_global(p, B)))
        return y.sbp, y.detach().numpy()
    for sbp, y in run(2, body):
        assert sbp == (P,)
        np.testing.assert_allclose(y, want, rtol=1e-12)


def test_attention_heads_stay_split():
    def body():
        attn = ParallelMultiheadAttention(8, 4, batch_first=True, dtype=tessera.float64)
        seen = []
        orig = tessera.nn.functional.scaled_dot_product_attention

        def spy(q, k, v, *a):
            seen.append((q.sbp, k.sbp, v.sbp))
            return orig(q, k, v, *a)
        tessera.nn.functional.scaled_dot_product_attention = spy
        try:
            out, _ = attn(tessera.tensor(X))
        finally:
            tessera.nn.functional.scaled_dot_product_attention = orig
        return seen[0], out.sbp
    (qkv, out), _ = run(2, body)
    assert qkv == ((S(1),),) * 3 and out == (P,)
    with pytest.raises(ValueError, match="do not split evenly"):
        run(2, lambda: ParallelMultiheadAttention(8, 1))


D_MODEL, HEADS, FF = 16, 4, 32
XT = rng.standard_normal((4, 6, D_MODEL))
YT = rng.standard_normal((4, 6, D_MODEL))


def _dense_layer(norm_first=False):
    tessera.manual_seed(0)
    return nn.TransformerEncoderLayer(D_MODEL, HEADS, dim_feedforward=FF, dropout=0.0,
                                      activation="gelu", batch_first=True,
                                      norm_first=norm_first).double()


def _train(model, steps=10, p=None):
    opt = tessera.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = tessera.tensor(XT), tessera.tensor(YT)
    if p is not None:  # every rank holds the whole batch
        x, y = x.to_global(p, B), y.to_global(p, B)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def single_transformer(norm_first=False):
    layer = _dense_layer(norm_first)
    losses = _train(layer)
    return losses, {k: v.detach().numpy() for k, v in layer.state_dict().items()}


def tensor_parallel_transformer(norm_first=False):
    n = tessera.distributed.get_world_size()
    p = placement("cpu", list(range(n)))
    tp = ParallelTransformerEncoderLayer.from_dense(_dense_layer(norm_first), p)
    sbps = {k: v.sbp[0].short() for k, v in tp.named_parameters()}
    losses = _train(tp, p=p)
    return losses, tp.to_dense(), sbps


def check_transformer(results, norm_first=False):
    want_losses, want = single_transformer(norm_first)
    for losses, params, sbps in results:
        np.testing.assert_allclose(losses, want_losses, rtol=1e-9)
        assert set(params) == set(want)
        for k, v in want.items():
            np.testing.assert_allclose(params[k], v, rtol=1e-8, atol=1e-10, err_msg=k)
        assert sbps["self_attn.q_proj.weight"] == "S(0)" and sbps["mlp.fc2.weight"] == "S(1)"
        assert sbps["mlp.fc2.bias"] == "B" and sbps["norm1.weight"] == "B"


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_tensor_parallel_training_matches_one_process(norm_first):
    check_transformer(run(2, tensor_parallel_transformer, norm_first), norm_first)
