"""Kernels bound to one graph node at compile time, against PyTorch.

The executor binds each convolution once (``conv_into_bound``: the threaded im2col driver
or the depthwise stencil with their plans made once) and each generated fused kernel
checks its arrays only when they change; array addresses are remembered per argument
(``cc.addresses``). Each must give PyTorch's result for the arrays it is called with, on
every call: the same arrays again, new arrays, arrays of another shape or layout (the
checked path), an output over its own input."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import tessera
from tessera import _dtype as D
from tessera.kernels import window
from tessera.kernels.cc import addresses
from tessera.ops.conv import conv_into, conv_into_bound
from tessera.ops.registry import Meta

pytestmark = pytest.mark.skipif(not window.available(), reason="no C compiler")

# (c, o, groups, k, stride, h): 1x1 and 3x3 im2col convolutions, depthwise stride 1 (a
# small plane and a row-path one) and stride 2, a grouped one (the generic path)
CASES = [(16, 24, 1, 1, 1, 14), (8, 16, 1, 3, 2, 20), (24, 24, 24, 3, 1, 14),
         (12, 12, 12, 3, 1, 70), (32, 32, 32, 3, 2, 15), (8, 8, 2, 3, 1, 9)]


def _meta(a):
    return None if a is None else Meta(a.shape, D.from_numpy_dtype(a.dtype))


def _case(rng, n, c, o, groups, k, stride, h, dtype, bias=True):
    x = rng.standard_normal((n, c, h, h)).astype(dtype)
    w = (rng.standard_normal((o, c // groups, k, k)) / np.sqrt(k * k * c / groups)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype) if bias else None
    return x, w, b


def _torch(x, w, b, stride, pad, groups):
    return torch.nn.functional.conv2d(
        torch.from_numpy(x), torch.from_numpy(w), None if b is None else torch.from_numpy(b),
        stride=stride, padding=pad, groups=groups).numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("c,o,groups,k,stride,h", CASES)
def test_bound_conv_matches_torch_on_every_call(c, o, groups, k, stride, h, bias, dtype):
    rng = np.random.default_rng(0)
    pad = k // 2
    x, w, b = _case(rng, 1, c, o, groups, k, stride, h, dtype, bias)
    expected = _torch(x, w, b, stride, pad, groups)
    fn = conv_into_bound(_meta(x), _meta(w), _meta(b), Meta(expected.shape, _meta(x).dtype),
                         (stride, stride), ((pad, pad), (pad, pad)), (1, 1), groups)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    y = np.empty(expected.shape, dtype)
    for _ in range(2):  # the same arrays again: remembered addresses
        y[...] = np.nan
        fn(y, x, w, b)
        np.testing.assert_allclose(y, expected, rtol=tol, atol=tol)
    # new arrays of the same shapes, and the old ones freed: new addresses
    x2, w2, b2 = _case(rng, 1, c, o, groups, k, stride, h, dtype, bias)
    del x, w, b
    gc.collect()
    y2 = np.empty(expected.shape, dtype)
    fn(y2, x2, w2, b2)
    np.testing.assert_allclose(y2, _torch(x2, w2, b2, stride, pad, groups), rtol=tol,
                               atol=tol)
    # a non-contiguous input takes the checked path
    xt = np.ascontiguousarray(x2.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    assert not xt.flags.c_contiguous
    fn(y2, xt, w2, b2)
    np.testing.assert_allclose(y2, _torch(np.ascontiguousarray(xt), w2, b2, stride, pad,
                                          groups), rtol=tol, atol=tol)


@pytest.mark.parametrize("c,o,groups,k,stride,h", CASES[:5])
def test_bound_conv_checks_arrays_of_another_shape(c, o, groups, k, stride, h):
    """Arrays other than the bound shapes go through the checked kernels: a batch of two
    gives PyTorch's result, an output of another size conv_into's."""
    rng = np.random.default_rng(1)
    pad = k // 2
    x, w, b = _case(rng, 1, c, o, groups, k, stride, h, np.float32)
    out = _torch(x, w, b, stride, pad, groups)
    fn = conv_into_bound(_meta(x), _meta(w), _meta(b), _meta(out), (stride, stride),
                         ((pad, pad), (pad, pad)), (1, 1), groups)
    x2 = rng.standard_normal((2,) + x.shape[1:]).astype(np.float32)
    expected = _torch(x2, w, b, stride, pad, groups)
    y = np.empty(expected.shape, np.float32)
    fn(y, x2, w, b)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    # an output of another size: what the checked conv_into writes, within the output
    small = np.empty(out.shape[:2] + (1, 1), np.float32)
    ref = np.empty_like(small)
    conv_into(ref, x, w, b, (stride, stride), ((pad, pad), (pad, pad)), (1, 1), groups)
    fn(small, x, w, b)
    np.testing.assert_array_equal(small, ref)


@pytest.mark.parametrize("groups", [1, 16])
def test_bound_conv_over_its_own_input(groups):
    rng = np.random.default_rng(2)
    x, w, b = _case(rng, 1, 16, 16, groups, 3, 1, 14, np.float32)
    expected = _torch(x, w, b, 1, 1, groups)
    fn = conv_into_bound(_meta(x), _meta(w), _meta(b), _meta(expected), (1, 1),
                         ((1, 1), (1, 1)), (1, 1), groups)
    buf = x.copy()
    fn(buf, buf, w, b)
    np.testing.assert_allclose(buf, expected, rtol=1e-4, atol=1e-4)


def test_addresses_follow_the_array_given():
    address = addresses()
    a, b = np.zeros(4), np.ones(4)
    assert address(a) == a.ctypes.data and address(b) == b.ctypes.data
    assert address(a) == a.ctypes.data and address(None) is None
    del a
    gc.collect()
    c = np.zeros(4)
    assert address(c) == c.ctypes.data


def test_fused_kernel_follows_new_arrays():
    """A generated kernel's checks are skipped only for the arrays it last checked."""
    from tessera.codegen import compile_fused
    from tessera.graph.trace import trace
    if not tessera.kernels.enabled():
        pytest.skip("code generation off")
    x = tessera.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    g, _ = trace(lambda t: (t * 2).exp() + 1, x)
    from tessera.graph.passes import run_pipeline
    run_pipeline(g, training=False)
    fused = [n for n in g.nodes if n.op.name == "fused"]
    assert fused
    fn = compile_fused(fused)[fused[0]]
    for scale in (1.0, 2.0):
        a = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4) * scale
        out = np.empty((3, 4), np.float32)
        fn(out, a)
        fn(out, a)
        np.testing.assert_allclose(out, np.exp(a * 2) + 1, rtol=1e-6)
    with pytest.raises(ValueError, match="fused kernel"):
        fn(np.empty((4, 3), np.float32), a)
    with pytest.raises(ValueError, match="fused kernel"):
        fn(out, a.reshape(4, 3))


def test_graph_modes_signature_follows_train_and_eval():
    """The call signature's training flags (a walk of the module tree) retrace a graph
    when a submodule changes mode, as ``Module.modules()`` would."""
    from tessera.nn.graph import _modes
    m = tessera.nn.Sequential(tessera.nn.Linear(2, 2), tessera.nn.Sequential(
        tessera.nn.Dropout(0.5), tessera.nn.ReLU()))
    shared = m[0]
    m.append(shared)
    assert _modes([m]) == tuple(x.training for x in m.modules())
    m[1][0].eval()
    assert _modes([m]) == tuple(x.training for x in m.modules())
    assert _modes([m]).count(False) == 1
