"""``conv_into`` with its output in its input's buffer, against PyTorch.

The graph memory plan hands a node's output the buffer of an input that dies at that node
when the shapes match, so a same-size convolution (3x3 stride 1, padding 1, C == O) can be
asked to overwrite its own input. Every convolution kernel that reads windows of the input
around outputs it has already written (Winograd's tile-row items, images split by rows or
channels over threads, the depthwise stencil) must still give the out-of-place result;
then the same through an ``nn.Graph`` whose second convolution's input dies there."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera.ops.conv import conv_into

# (n, c, groups, h): Winograd at batch 1 and 8, im2col split by rows at batch 1, the
# direct convolution (LeNet-sized), depthwise, and a grouped fallback
CASES = [(1, 64, 1, 56), (8, 32, 1, 20), (1, 16, 1, 40), (3, 4, 1, 13), (2, 24, 24, 17),
         (2, 8, 2, 9)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,c,groups,h", CASES)
def test_conv_into_its_own_input(n, c, groups, h, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, h)).astype(dtype)
    w = (rng.standard_normal((c, c // groups, 3, 3)) / np.sqrt(9 * c / groups)).astype(dtype)
    b = rng.standard_normal(c).astype(dtype)
    expected = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                                          torch.from_numpy(b), padding=1, groups=groups)
    buf = x.copy()
    conv_into(buf, buf, w, b, (1, 1), ((1, 1), (1, 1)), (1, 1), groups)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(buf, expected.numpy(), rtol=tol, atol=tol)


def test_graph_conv_over_its_dying_input():
    """conv -> relu -> conv -> relu: the second convolution's input dies there and has its
    shape, so the plan gives its buffer to the output (the last relu keeps that output out
    of the returned values, which the plan leaves alone); the graph must equal eager."""
    tessera.manual_seed(0)
    nn = tessera.nn
    model = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(32, 32, 3, padding=1), nn.ReLU()).eval()

    class Infer(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, x):
            return self.model(x)

    x = tessera.randn(1, 32, 30, 30)
    with tessera.no_grad():
        eager = model(x).numpy()
    graph = Infer()
    for _ in range(2):
        np.testing.assert_allclose(graph(x).numpy(), eager, rtol=1e-4, atol=1e-4)
