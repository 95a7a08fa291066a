"""Hypothesis property tests: broadcasting and type promotion of binary ops agree with
PyTorch for random shapes, dtypes and operand kinds (tensor, 0-d tensor, Python scalar)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tessera

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float32", "float64"]


@st.composite
def broadcastable_shapes(draw):
    """Two shapes that broadcast: a common shape, then dims dropped or set to 1 per operand."""
    base = draw(st.lists(st.integers(0, 4), min_size=0, max_size=4))

    def variant():
        drop = draw(st.integers(0, len(base)))
        shape = [s if not draw(st.booleans()) else 1 for s in base[drop:]]
        return tuple(shape)
    return variant(), variant()


def _array(rng, shape, dtype):
    if dtype == "bool":
        return np.asarray(rng.random(shape) > 0.5)
    if dtype.startswith("float"):
        return np.asarray(rng.uniform(-3, 3, shape).astype(dtype))
    lo = 0 if dtype == "uint8" else -5
    return np.asarray(rng.integers(lo, 6, shape).astype(dtype))


OPS = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "sub": lambda a, b: a - b,
    "lt": lambda a, b: a < b,
    "eq": lambda a, b: a == b,
}


@settings(max_examples=150, deadline=None)
@given(shapes=broadcastable_shapes(), da=st.sampled_from(DTYPES), db=st.sampled_from(DTYPES),
       op=st.sampled_from(["add", "mul", "sub", "lt", "eq"]), seed=st.integers(0, 2**16))
def test_binary_broadcast_and_promotion(shapes, da, db, op, seed):
    rng = np.random.default_rng(seed)
    a, b = _array(rng, shapes[0], da), _array(rng, shapes[1], db)
    fn = OPS[op]
    try:
        ref = fn(torch.from_numpy(a), torch.from_numpy(b))
    except RuntimeError:
        with pytest.raises(RuntimeError):
            fn(tessera.from_numpy(a), tessera.from_numpy(b))
        return
    out = fn(tessera.from_numpy(a), tessera.from_numpy(b))
    assert tuple(out.shape) == tuple(ref.shape)
    assert out.dtype.name == str(ref.dtype).split(".")[-1]
    np.testing.assert_allclose(out.numpy().astype(np.float64), ref.numpy().astype(np.float64),
                               rtol=1e-6, atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(shape=st.lists(st.integers(0, 4), max_size=3).map(tuple), dt=st.sampled_from(DTYPES),
       scalar=st.one_of(st.booleans(), st.integers(-3, 3), st.floats(-3, 3, width=32)),
       reflected=st.booleans(), op=st.sampled_from(["add", "mul", "sub"]),
       seed=st.integers(0, 2**16))
def test_scalar_operand_promotion(shape, dt, scalar, reflected, op, seed):
    a = _array(np.random.default_rng(seed), shape, dt)
    fn = OPS[op]

    def run(lib, x):
        return fn(scalar, x) if reflected else fn(x, scalar)
    try:
        ref = run(torch, torch.from_numpy(a))
    except (RuntimeError, TypeError) as e:
        with pytest.raises(type(e)):
            run(tessera, tessera.from_numpy(a))
        return
    out = run(tessera, tessera.from_numpy(a))
    assert out.dtype.name == str(ref.dtype).split(".")[-1], (dt, scalar)
    assert tuple(out.shape) == tuple(ref.shape)
    np.testing.assert_allclose(out.numpy().astype(np.float64), ref.numpy().astype(np.float64),
                               rtol=1e-5, atol=1e-5)


@settings(max_examples=100, deadline=None)
@given(shapes=broadcastable_shapes(), seed=st.integers(0, 2**16))
def test_broadcast_gradients_sum_back(shapes, seed):
    rng = np.random.default_rng(seed)
    a = np.asarray(rng.standard_normal(shapes[0]))
    b = np.asarray(rng.standard_normal(shapes[1]))
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    xa, xb = tessera.tensor(a, requires_grad=True), tessera.tensor(b, requires_grad=True)
    (ta * tb + ta).sum().backward()
    (xa * xb + xa).sum().backward()
    np.testing.assert_allclose(xa.grad.numpy(), ta.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(xb.grad.numpy(), tb.grad.numpy(), rtol=1e-10, atol=1e-12)
