"""tessera.utils.checkpoint against torch.utils.checkpoint: values and gradients of the same
model, PyTorch's warnings and errors, and, within tessera, identical dropout masks and
gradients with and without checkpointing (eager and traced in nn.Graph)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.utils.checkpoint as tcp

import tessera
from tessera.utils.checkpoint import CheckpointError, checkpoint, checkpoint_sequential


def _pair(drop: float = 0.0):
    """The same small residual MLP in tessera and in torch (tessera's weights)."""
    def make(lib):
        return lib.nn.Sequential(lib.nn.Linear(8, 16), lib.nn.GELU(), lib.nn.Dropout(drop),
                                 lib.nn.Linear(16, 8), lib.nn.Tanh())
    tessera.manual_seed(0)
    m, r = make(tessera), make(torch)
    r.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in m.state_dict().items()})
    return m, r


def _grads(model, x) -> list:
    return [x.grad] + [p.grad for p in model.parameters()]


def _np(t):
    return t.detach().numpy() if isinstance(t, (tessera.Tensor, torch.Tensor)) else t


@pytest.mark.parametrize("reentrant", [False, True])
def test_matches_torch_checkpoint(reentrant):
    m, r = _pair()
    xs = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    x = tessera.tensor(xs, requires_grad=True)
    rx = torch.tensor(xs, requires_grad=True)
    y = checkpoint(m, x, use_reentrant=reentrant)
    ry = tcp.checkpoint(r, rx, use_reentrant=reentrant)
    (y * y).sum().backward()
    (ry * ry).sum().backward()
    np.testing.assert_allclose(_np(y), _np(ry), rtol=1e-6, atol=1e-6)
    for g, rg in zip(_grads(m, x), _grads(r, rx)):
        np.testing.assert_allclose(_np(g), _np(rg), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reentrant", [False, True])
def test_dropout_masks_and_gradients_identical(reentrant):
    """Recomputation restores the RNG state: the masks, hence every gradient, are the same
    bits as without checkpointing."""
    m, _ = _pair(drop=0.5)
    x = tessera.randn(16, 8, requires_grad=True)

    def run(ck):
        for p in m.parameters():
            p.grad = None
        x.grad = None
        tessera.manual_seed(7)
        y = checkpoint(m, x, use_reentrant=reentrant) if ck else m(x)
        (y * y).sum().backward()
        return [_np(y).copy()] + [_np(g).copy() for g in _grads(m, x)]

    for a, b in zip(run(False), run(True)):
        assert np.array_equal(a, b)


def test_nested_keywords_and_autograd_grad():
    def inner(t, *, scale):
        return checkpoint(lambda u: (u.sin() * scale).exp(), t, use_reentrant=False)

    def outer(t):
        return checkpoint(lambda u, s: inner(u * 2, scale=s).cos(), t, 3.0,
                          use_reentrant=False)

    x = tessera.randn(5, requires_grad=True)
    (g,) = tessera.autograd.grad(outer(x).sum(), x)
    (g0,) = tessera.autograd.grad((((x * 2).sin() * 3.0).exp().cos()).sum(), x)
    assert np.array_equal(g.numpy(), g0.numpy())
    rx = torch.tensor(x.detach().numpy(), requires_grad=True)
    (rg,) = torch.autograd.grad((((rx * 2).sin() * 3.0).exp().cos()).sum(), rx)
    np.testing.assert_allclose(g.numpy(), rg.numpy(), rtol=1e-5)


def test_no_grad_inside_and_retain_graph():
    w = tessera.randn(4, requires_grad=True)

    def f(t):
        with tessera.no_grad():
            c = t.exp()          # a constant for backward, as in PyTorch
        return (t * w * c).sum()

    x = tessera.randn(4, requires_grad=True)
    y = checkpoint(f, x, use_reentrant=False)
    y.backward(retain_graph=True)
    g1 = x.grad.clone()
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * g1.numpy())
    np.testing.assert_allclose(g1.numpy(), (w * x.exp()).detach().numpy(), rtol=1e-6)


def test_checkpoint_sequential_matches_torch():
    m, r = _pair()
    xs = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    x = tessera.tensor(xs, requires_grad=True)
    rx = torch.tensor(xs, requires_grad=True)
    checkpoint_sequential(m, 2, x, use_reentrant=False).sum().backward()
    tcp.checkpoint_sequential(r, 2, rx, use_reentrant=False).sum().backward()
    for g, rg in zip(_grads(m, x), _grads(r, rx)):
        np.testing.assert_allclose(_np(g), _np(rg), rtol=1e-5, atol=1e-6)


def _messages(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fn()
    return [str(i.message) for i in w]


def test_warnings_as_torch():
    m, r = _pair()
    x, rx = tessera.ones(2, 8, requires_grad=True), torch.ones(2, 8, requires_grad=True)
    assert _messages(lambda: checkpoint(m, x)) == _messages(lambda: tcp.checkpoint(r, rx))
    assert _messages(lambda: checkpoint_sequential(m, 2, x)) == \
        _messages(lambda: tcp.checkpoint_sequential(r, 2, rx))
    x0, rx0 = tessera.ones(2, 8), torch.ones(2, 8)
    assert _messages(lambda: checkpoint(m, x0, use_reentrant=True)) == \
        _messages(lambda: tcp.checkpoint(r, rx0, use_reentrant=True))


def _error(fn):
    with pytest.raises(Exception) as e:
        fn()
    return type(e.value).__name__, str(e.value)


def test_errors_as_torch():
    m, r = _pair()
    x, rx = tessera.ones(2, 8, requires_grad=True), torch.ones(2, 8, requires_grad=True)
    assert _error(lambda: checkpoint(m, x, use_reentrant=True, foo=1)) == \
        _error(lambda: tcp.checkpoint(r, rx, use_reentrant=True, foo=1))
    assert _error(lambda: checkpoint(m, x, use_reentrant=False, determinism_check="x")) == \
        _error(lambda: tcp.checkpoint(r, rx, use_reentrant=False, determinism_check="x"))
    assert _error(lambda: checkpoint(m, x, use_reentrant=True, debug=True)) == \
        _error(lambda: tcp.checkpoint(r, rx, use_reentrant=True, debug=True))
    assert _error(lambda: tessera.autograd.grad(
        checkpoint(m, x, use_reentrant=True).sum(), x)) == \
        _error(lambda: torch.autograd.grad(tcp.checkpoint(r, rx, use_reentrant=True).sum(), rx))


def test_determinism_check():
    calls = []

    def f(t):
        calls.append(1)
        return t.exp() if len(calls) == 1 else t.exp().exp()

    x = tessera.randn(3, requires_grad=True)
    # as PyTorch's: an early stop ends the rerun once the one value is saved again, so the
    # extra op is never reached; without it the difference raises
    checkpoint(f, x, use_reentrant=False).sum().backward()
    calls.clear()
    with pytest.raises(CheckpointError, match="A different number of tensors was saved"):
        checkpoint(f, x, use_reentrant=False, early_stop=False).sum().backward()


def test_context_fn():
    seen = []

    class Ctx:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            seen.append(self.name)

        def __exit__(self, *exc):
            return False

    x = tessera.randn(3, requires_grad=True)
    y = checkpoint(lambda t: t.sin(), x, use_reentrant=False,
                   context_fn=lambda: (Ctx("forward"), Ctx("recompute")))
    y.sum().backward()
    assert seen == ["forward", "recompute"]
    np.testing.assert_allclose(x.grad.numpy(), x.detach().cos().numpy(), rtol=1e-6)


class _Block(tessera.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = tessera.nn.Linear(8, 16), tessera.nn.Linear(16, 8)
        self.drop = tessera.nn.Dropout(0.3)

    def forward(self, x):
        return x + self.l2(self.drop(self.l1(x).relu()))


def _graph_step(ck: bool):
    tessera.manual_seed(0)
    blocks = tessera.nn.ModuleList([_Block() for _ in range(3)])
    opt = tessera.optim.SGD(blocks.parameters(), lr=0.1)

    class Step(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.blocks = blocks
            self.add_optimizer(opt)

        def build(self, x):
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=False) if ck else b(x)
            loss = x.square().mean()
            loss.backward()
            return loss

    g = Step()
    x = tessera.tensor(np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32))
    tessera.manual_seed(3)
    losses = [g(x).item() for _ in range(2)]
    return g, losses, [p.detach().numpy().copy() for p in blocks.parameters()]


def test_traced_in_graph():
    """In nn.Graph the recomputation is traced as ``<path>.remat`` nodes (not merged back by
    CSE), and training is bit-for-bit the run without checkpoints."""
    g0, l0, p0 = _graph_step(False)
    g1, l1, p1 = _graph_step(True)
    assert l0 == l1
    assert all(np.array_equal(a, b) for a, b in zip(p0, p1))
    names = [n.name for n in g1.ir.nodes if n.name.endswith(".remat")]
    assert {"blocks.0.l1.remat", "blocks.1.drop.remat", "blocks.2.l1.remat"} <= set(names)
    assert not any(n.name.endswith(".remat") for n in g0.ir.nodes)


def _side_effects(lib, cp, **kw):
    """The calls a block makes in its forward and its recomputation, and x's gradient."""
    calls = []

    def f(t):
        a = t.exp()
        calls.append("mid")
        b = a.sin()
        calls.append("end")
        return b.sum()

    x = lib.ones(3, requires_grad=True)
    cp.checkpoint(f, x, use_reentrant=False, **kw).backward()
    return calls, np.asarray(x.grad.tolist())


@pytest.mark.parametrize("early_stop", [True, False])
def test_early_stop_as_torch(early_stop):
    """The recomputation stops once the last saved value is made again (the rest of the
    block does not run); without early stop it runs whole; the context manager overrides."""
    calls, grad = _side_effects(tessera, tessera.utils.checkpoint, early_stop=early_stop)
    calls_t, grad_t = _side_effects(torch, tcp, early_stop=early_stop)
    assert calls == calls_t and np.allclose(grad, grad_t)
    assert calls == (["mid", "end", "mid"] if early_stop else ["mid", "end", "mid", "end"])
    with tessera.utils.checkpoint.set_checkpoint_early_stop(not early_stop), \
            tcp.set_checkpoint_early_stop(not early_stop):
        calls, _ = _side_effects(tessera, tessera.utils.checkpoint, early_stop=early_stop)
        calls_t, _ = _side_effects(torch, tcp, early_stop=early_stop)
    assert calls == calls_t


def _changing(lib):
    runs = [0]

    def f(t):
        runs[0] += 1
        return (t.exp() if runs[0] == 1 else t[:2].exp()).sum()
    return f


def test_debug_reports_the_ops():
    """A recomputation unlike the forward: with debug (or set_checkpoint_debug_enabled)
    the error lists the ops of both runs under PyTorch's headings; without, it ends with
    PyTorch's tip."""
    cp = tessera.utils.checkpoint
    x = tessera.ones(3, requires_grad=True)
    with pytest.raises(CheckpointError, match="Tip: To see a more detailed error message"):
        checkpoint(_changing(tessera), x, use_reentrant=False).backward()
    with pytest.raises(CheckpointError) as e:
        checkpoint(_changing(tessera), x, use_reentrant=False, debug=True).backward()
    with pytest.raises(CheckpointError) as e2, cp.set_checkpoint_debug_enabled(True):
        checkpoint(_changing(tessera), x, use_reentrant=False).backward()
    rx = torch.ones(3, requires_grad=True)
    with pytest.raises(tcp.CheckpointError) as et:
        tcp.checkpoint(_changing(torch), rx, use_reentrant=False, debug=True).backward()
    for err in (str(e.value), str(e2.value)):
        fwd = err.split("Operations executed during the original forward:")[1]
        fwd, rec = fwd.split("Operations executed during recomputation:")
        assert "exp([3])" in fwd and "exp([2])" in rec
        assert "ERROR: Detected non-determinism while running activation checkpointing" in err
    assert "ERROR: Detected non-determinism while running activation checkpointing" in \
        str(et.value)
