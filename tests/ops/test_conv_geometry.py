"""The convolution ops (``conv``, ``conv_input_grad``, ``conv_weight_grad``) check the arity
and types of their stride, padding and dilation against the weight's spatial rank on every
path: the C kernels (float32/float64) and the NumPy fallback (integer dtypes, groups, other
ranks), called through dispatch or directly, as PyTorch's ``torch.convolution`` (the oracle)
does: a ``RuntimeError`` naming the op, the argument and the weight's shape."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera.ops import conv as C

OK = dict(stride=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1))
BAD = {
    "padding": dict(pads=((0, 0), (0, 0), (0, 0))),
    "padding[short]": dict(pads=((0, 0),)),
    "dilation": dict(dilation=(1, 1, 1)),
    "dilation[short]": dict(dilation=(1,)),
    "stride": dict(stride=(1, 1, 1)),
    "stride[short]": dict(stride=(1,)),
}


def _torch_rejects(geo) -> None:
    """PyTorch's own convolution refuses the same geometry with a RuntimeError."""
    with pytest.raises(RuntimeError, match="to match the convolution dimensions"):
        torch.convolution(torch.ones(1, 2, 6, 6), torch.ones(4, 2, 3, 3), None, geo["stride"],
                          [lo for lo, _ in geo["pads"]], geo["dilation"], False, (0, 0), 1)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("bad", sorted(BAD))
def test_every_conv_path_checks_the_geometry_arity(bad, dtype):
    geo = OK | BAD[bad]
    if "short" not in bad:  # (PyTorch repeats a single value; these ops take one per dim)
        _torch_rejects(geo)
    name = bad.split("[")[0]
    msg = f"expected {name} to be a list of 2 values .* weight \\[4, 2, 3, 3\\]"
    dt = getattr(tessera, dtype)
    x, w = tessera.ones(1, 2, 6, 6, dtype=dt), tessera.ones(4, 2, 3, 3, dtype=dt)
    g = tessera.ones(1, 4, 4, 4, dtype=dt)
    with pytest.raises(RuntimeError, match="conv: " + msg):
        C.conv(x, w, stride=geo["stride"], pads=geo["pads"], dilation=geo["dilation"], groups=1)
    with pytest.raises(RuntimeError, match="conv_transpose: " + msg):
        C.conv_input_grad(g, w, input_shape=(1, 2, 6, 6), groups=1, **geo)
    with pytest.raises(RuntimeError, match="conv_weight_grad: " + msg):
        C.conv_weight_grad(x, g, weight_shape=(4, 2, 3, 3), groups=1, **geo)
    # the kernels themselves, as an executor or another caller reaches them
    xa, wa, ga = x.numpy(), w.numpy(), g.numpy()
    with pytest.raises(RuntimeError, match="conv: " + msg):
        C._conv_kernel(xa, wa, None, groups=1, **geo)
    with pytest.raises(RuntimeError, match="conv: " + msg):
        C.conv_into(np.empty((1, 4, 4, 4), xa.dtype), xa, wa, None, groups=1, **geo)
    with pytest.raises(RuntimeError, match="conv_transpose: " + msg):
        C._input_grad_kernel(ga, wa, (1, 2, 6, 6), groups=1, **geo)
    with pytest.raises(RuntimeError, match="conv_weight_grad: " + msg):
        C._weight_grad_kernel(xa, ga, (4, 2, 3, 3), groups=1, **geo)


@pytest.mark.parametrize("bad", [dict(stride=(1.5, 1)), dict(dilation=(1, True)),
                                 dict(pads=((0, 0, 0), (0, 0))), dict(pads=((0.0, 0), (0, 0)))])
def test_non_integer_geometry_is_refused(bad):
    geo = OK | bad
    x, w = tessera.ones(1, 2, 6, 6, dtype=tessera.int64), tessera.ones(4, 2, 3, 3,
                                                                        dtype=tessera.int64)
    with pytest.raises(RuntimeError, match="conv: expected integer strides and dilations and "
                                           r"\(low, high\) integer paddings for weight "
                                           r"\[4, 2, 3, 3\]"):
        C.conv(x, w, groups=1, **geo)


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_a_sound_geometry_still_matches_pytorch(dtype):
    rng = np.random.default_rng(0)
    xa = rng.integers(-3, 4, (1, 2, 6, 6)).astype(dtype)
    wa = rng.integers(-3, 4, (4, 2, 3, 3)).astype(dtype)
    got = C.conv(tessera.tensor(xa), tessera.tensor(wa), stride=(2, 1),
                 pads=((1, 1), (0, 0)), dilation=(1, 2), groups=1)
    want = torch.nn.functional.conv2d(torch.tensor(xa, dtype=torch.float64),
                                      torch.tensor(wa, dtype=torch.float64), stride=(2, 1),
                                      padding=(1, 0), dilation=(1, 2))
    np.testing.assert_allclose(got.numpy().astype(np.float64), want.numpy(), rtol=1e-5)
