"""nn on global tensors: ``Module.to_global``, dropout masks across ranks, and a small CNN
(conv, batch norm in training, pooling, dropout, cross-entropy mean) trained data-parallel
equal to one process."""
import numpy as np
import pytest

import tessera
import tessera.nn.functional as F
from tessera import nn
from tessera.distributed.placement import placement
from tests.distributed._helpers import B, S, global_from, run

rng = np.random.default_rng(0)


def test_module_to_global_converts_in_place():
    def body():
        tessera.manual_seed(tessera.distributed.get_rank())  # different local weights
        m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        params = list(m.parameters())
        m[1].weight.requires_grad_(False)
        p = placement("cpu", [0, 1])
        out = m.to_global(p, lambda t: S(0) if t.dim() == 2 else B)
        assert out is m and [id(q) for q in m.parameters()] == [id(q) for q in params]
        assert isinstance(m[0].weight, nn.Parameter) and m[0].weight.requires_grad
        assert not m[1].weight.requires_grad
        assert m[0].weight.sbp == (S(0),) and m[0].bias.sbp == (B,)
        assert m[1].running_mean.is_global and m[1].num_batches_tracked.is_global
        m.to_global(sbp=B)  # global to global: boxing, placement kept
        return m[0].weight.detach().to_local().numpy().copy(), m[0].weight.sbp
    (w0, s0), (w1, s1) = run(2, body)
    np.testing.assert_array_equal(w0, w1)  # rank 0's value everywhere
    assert s0 == (B,)
    tessera.manual_seed(0)
    np.testing.assert_array_equal(w0, nn.Linear(3, 4).weight.detach().numpy())


def test_module_to_global_needs_placement_and_sbp_for_local_tensors():
    with pytest.raises(ValueError, match="placement= and sbp="):
        nn.Linear(2, 2).to_global(sbp=B)


def test_dropout_masks_agree_across_ranks():
    x = rng.standard_normal((6, 8))
    tessera.manual_seed(3)
    want = F.dropout(tessera.tensor(x), 0.5).numpy()

    def body(sbp, seed):
        tessera.manual_seed(seed)
        g = global_from(x, placement("cpu", [0, 1]), (sbp,), requires_grad=True)
        y = F.dropout(g, 0.5)
        y.sum().backward()
        return y.to_local().detach().numpy(), y.detach().numpy(), g.grad.numpy()
    for sbp in (B, S(0), S(1)):
        # rank 1's generator differs: the first rank's seed is used everywhere
        (l0, y0, g0), (l1, y1, g1) = run(2, body, sbp, 3) if sbp != B else \
            FakeSeeds().run(body, sbp)
        np.testing.assert_allclose(y0, want) and np.testing.assert_allclose(y1, want)
        np.testing.assert_array_equal(g0, (want != 0) * 2.0)
        if sbp == B:
            np.testing.assert_array_equal(l0, l1)


class FakeSeeds:
    """Ranks seeded differently (3 on rank 0, 4 on rank 1)."""

    def run(self, body, sbp):
        return run(2, lambda: body(sbp, 3 + tessera.distributed.get_rank()))


class _CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(F.dropout(x.flatten(1), P_DROP, self.training))


P_DROP = 0.25
XC = rng.standard_normal((6, 2, 4, 4))
YC = rng.integers(0, 3, (6,))


def _train_cnn(glob: bool, steps: int = 3):
    tessera.manual_seed(0)
    model = _CNN().double()
    x, y = tessera.tensor(XC), tessera.tensor(YC)
    if glob:
        p = placement("cpu", list(range(tessera.distributed.get_world_size())))
        model.to_global(p, B)
        x, y = x.to_global(p, B).to_global(sbp=S(0)), y.to_global(p, B).to_global(sbp=S(0))
    opt = tessera.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return losses, state


def test_cnn_data_parallel_training_matches_one_process():
    want_losses, want_state = _train_cnn(False)
    for losses, state in run(2, _train_cnn, True):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-10)
        for k, v in want_state.items():
            np.testing.assert_allclose(state[k], v, rtol=1e-9, atol=1e-12, err_msg=k)


def test_module_gradients_take_their_parameters_sbp():
    """A broadcast weight's partial gradient is all-reduced once, in backward."""
    x = rng.standard_normal((4, 3))
    tessera.manual_seed(0)
    lin = nn.Linear(3, 2).double()
    lin(tessera.tensor(x)).square().mean().backward()

    def body():
        tessera.manual_seed(0)
        m = nn.Linear(3, 2).double()
        p = placement("cpu", [0, 1])
        m.to_global(p, lambda t: S(0) if t.dim() == 2 else B)
        m(global_from(x, p, (S(0),))).square().mean().backward()
        return m.weight.grad.sbp, m.bias.grad.sbp, m.weight.grad.numpy(), m.bias.grad.numpy()
    for ws, bs, gw, gb in run(2, body):
        assert (ws, bs) == ((S(0),), (B,))
        np.testing.assert_allclose(gw, lin.weight.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(gb, lin.bias.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("sbp", [S(0), S(1), B], ids=["batch", "heads", "broadcast"])
def test_attention_on_global_tensors_runs_the_fused_op(sbp, monkeypatch):
    """scaled_dot_product_attention on global tensors of a CPU placement takes the fused
    op (its SBP rule splits the batch and head dims: no conversion for a split of either)
    and equals one process, forward and gradients, as PyTorch computes them."""
    import torch

    from tessera.nn.functional import attention
    fused = []
    real = attention.fused_attention
    monkeypatch.setattr(attention, "fused_attention",
                        lambda *a, **k: fused.append(1) or real(*a, **k))
    q, k, v, w = (rng.standard_normal((4, 3, 5, 8)).astype(np.float32) for _ in range(4))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    (want * torch.tensor(w)).sum().backward()

    def body():
        p = placement("cpu", [0, 1])
        xs = [global_from(a, p, (sbp,), requires_grad=True) for a in (q, k, v)]
        y = F.scaled_dot_product_attention(*xs, is_causal=True)
        (y * tessera.tensor(w).to_global(p, B)).sum().backward()
        return y.sbp, y.detach().numpy(), [x.grad.numpy() for x in xs]
    for out_sbp, y, grads in run(2, body):
        assert out_sbp == (sbp,)
        np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-5, atol=1e-5)
        for g, t in zip(grads, (tq, tk, tv)):
            np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert fused  # (the composite would give the same values)
