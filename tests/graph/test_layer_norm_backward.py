"""Layer norm's backward as compiled training steps run it (decomposed, fused, generated C),
against PyTorch and eager: the input's, weight's and bias's gradients for several shapes,
behind losses whose gradient is a broadcast (``mean``: an expand of a scalar), and for inputs
that are not contiguous (a transposed view) or broadcast (an expanded row). The weight's and
bias's gradients (column sums) are side sums of the kernel computing the input's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera.graph.executor import Executor
from tessera.graph.passes import run_pipeline
from tessera.kernels import cc

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")

SHAPES = [(4, 6, 32), (3, 5, 7), (2, 1, 130), (64, 48)]
LOSSES = {
    "mean": lambda lib, y, t: y.mean(),
    "mse": lambda lib, y, t: lib.nn.functional.mse_loss(y, t),
    "square": lambda lib, y, t: (y * y).sum(),
}
LAYOUTS = ("contiguous", "transposed", "expanded")


def _input(lib, x, layout: str):
    """The layer norm's input from leaf ``x``: itself, a transposed view of it (``x`` holds
    the transpose), or a row broadcast along dim 0 (``x`` holds one row)."""
    if layout == "transposed":
        return x.transpose(0, 1)
    if layout == "expanded":
        return x.expand(4, *x.shape[1:])
    return x


def _leaf_shape(shape: tuple, layout: str) -> tuple:
    if layout == "transposed":
        return (shape[1], shape[0], *shape[2:])
    if layout == "expanded":
        return (1, *shape[1:])
    return shape


def _step(lib, loss_name: str, layout: str, c: int):
    def step(x, w, b, t):
        y = lib.nn.functional.layer_norm(_input(lib, x, layout), (c,), w, b, eps=1e-5)
        loss = LOSSES[loss_name](lib, y, t)
        return (loss, *lib.autograd.grad(loss, [x, w, b]))
    return step


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradients_match_pytorch_and_eager(shape, loss, layout):
    if layout == "expanded":
        shape = (4, *shape[1:])
    rng = np.random.default_rng(len(shape) * 100 + shape[-1])
    arrays = [rng.standard_normal(_leaf_shape(shape, layout)).astype(np.float32),
              rng.standard_normal(shape[-1]).astype(np.float32),
              rng.standard_normal(shape[-1]).astype(np.float32),
              rng.standard_normal(shape).astype(np.float32)]
    ts = [tessera.from_numpy(a.copy()) for a in arrays]
    for t in ts[:3]:
        t.requires_grad_()
    step = _step(tessera, loss, layout, shape[-1])
    g, _ = tessera.graph.trace(step, *ts)
    run_pipeline(g, codegen=True, training=True)
    fused = [n for n in g.nodes if n.op.name == "fused"]
    if layout != "expanded":   # (there the input's gradient is a sum, a region of its own)
        assert any(sum(v.shape == (shape[-1],) for v in n.outputs) == 2 for n in fused)
    # a broadcast reaches a kernel as the value it broadcasts (its contiguous variant)
    assert not any(v.producer is not None and v.producer.op.name == "expand"
                   for n in fused for v in n.tensor_inputs)
    got = [np.array(o) for o in Executor(g).run([t._data for t in ts], {})[0]]
    tt = [torch.from_numpy(a.copy()) for a in arrays]
    for t in tt[:3]:
        t.requires_grad_()
    want = [w.detach().numpy() for w in _step(torch, loss, layout, shape[-1])(*tt)]
    eager = [e.detach().numpy() for e in step(*ts)]
    for name, a, e, ea in zip(("loss", "x", "weight", "bias"), got, want, eager):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4, err_msg=name)
        np.testing.assert_allclose(a, ea, rtol=1e-4, atol=1e-4, err_msg=name)
