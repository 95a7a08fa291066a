"""Eager elementwise ops on large tensors run the ops' C rules (``tessera.kernels.elementwise``):
every case is computed with the C path on and off (the NumPy kernel, itself checked
against PyTorch by the op-info table) on inputs holding NaN, infinities, -0 and large
values, and must agree; each case also checks that its C kernel really ran. A few cases
go against PyTorch directly, with autograd."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera._dispatch import dispatch
from tessera.kernels import cc, elementwise as eager
from tessera.ops.registry import REGISTRY

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")

N = eager.EAGER_MIN + 37          # odd, so the loop's vector tail runs too
SHAPE = (N // 37, 37)


def _values(dtype, rng, special=True):
    x = rng.standard_normal(SHAPE).astype(dtype) * 3
    if special:
        flat = x.reshape(-1)
        flat[:8] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e30, 1e-40]
    return x


@pytest.fixture
def on():
    if not eager.enabled():
        pytest.skip("TESSERA_EAGER_C=0 or code generation off")
    # each op compiles a few numeric attribute sets per process: the cases here start that
    # count from zero, whatever ran in this process before them
    numeric = dict(eager._NUMERIC)
    eager._NUMERIC.clear()
    yield
    eager._STATE[0] = None
    eager._NUMERIC.clear()
    eager._NUMERIC.update(numeric)


def _both(op_name, args, attrs):
    """(C result, NumPy result, whether the C kernel gave the first)."""
    op = REGISTRY[op_name]
    tensors = [tessera.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args]
    ran = []
    run = eager.run

    def recording(*a):
        res = run(*a)
        ran.append(res is not None)
        return res
    eager.run = recording
    try:
        with tessera.no_grad():
            c = dispatch(op, *tensors, **attrs).numpy()
            eager._STATE[0] = False
            ref = dispatch(op, *tensors, **attrs).numpy()
    finally:
        eager.run = run
        eager._STATE[0] = None
    return c, ref, ran == [True]


UNARY = ["relu", "sigmoid", "tanh", "exp", "expm1", "log", "log1p", "erf", "erfc", "silu",
         "mish", "log_sigmoid", "hardsigmoid", "hardswish", "sign", "frac", "rsqrt"]
# (op, attrs) with attributes
UNARY_ATTRS = [("gelu", {}), ("gelu", {"approximate": "tanh"}),
               ("leaky_relu", {"negative_slope": 0.2}), ("elu", {"alpha": 1.5}),
               ("softplus", {"beta": 2.0, "threshold": 10.0}),
               ("hardtanh", {"min_val": -0.5, "max_val": 2.0}),
               ("threshold", {"threshold": 0.1, "value": -3.0})]
# transcendental rules (polynomials within a few ulp of NumPy's) and compound arithmetic
# (the C compiler contracts a + b * c into one fused multiply-add: one rounding fewer)
INEXACT = {"sigmoid", "tanh", "exp", "expm1", "log", "log1p", "erf", "erfc", "silu", "mish",
           "log_sigmoid", "gelu", "elu", "softplus", "gelu_backward", "silu_backward", "rsqrt",
           "lerp", "addcmul", "addcdiv", "hardsigmoid", "hardswish", "add"}
COMPOUND = {"lerp", "addcmul", "addcdiv", "add", "gelu_backward", "silu_backward"}


def _check(name, c, ref, attrs=None):
    assert c.dtype == ref.dtype and c.shape == ref.shape, name
    if name in INEXACT:
        tol = 2e-6 if c.dtype == np.float32 else 1e-14
        # gelu's tanh form computes 1 + tanh(u), which cancels for x < -3 in every
        # implementation (PyTorch's float32 gives exactly 0 there): absolute error only
        atol = tol if (attrs or {}).get("approximate") == "tanh" else tol * 1e-3
        if name in COMPOUND:  # one rounding of an operand-sized term (|operands| < ~16)
            atol = tol * 16
        np.testing.assert_allclose(c, ref, rtol=tol, atol=atol, equal_nan=True, err_msg=name)
    else:
        np.testing.assert_array_equal(c, ref, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", UNARY + UNARY_ATTRS, ids=str)
def test_unary_matches_numpy_kernel(on, case, dtype):
    name, attrs = case if isinstance(case, tuple) else (case, {})
    x = _values(dtype, np.random.default_rng(1))
    c, ref, ran = _both(name, [x], attrs)
    assert ran, f"{name}: the C kernel did not run"
    _check(name, c, ref, attrs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_binary_ternary_and_mixed_dtypes(on, dtype):
    rng = np.random.default_rng(2)
    x, y, z = (_values(dtype, rng, special=k == 0) for k in range(3))
    mask = rng.random(SHAPE) > 0.5
    other = np.float32 if dtype == np.float64 else np.float64
    cases = [
        ("mul", [x, mask], {}),               # float x bool: NumPy would cast the mask
        ("add", [mask, x], {"alpha": 2}),
        ("gt", [x, y.astype(other)], {}),   # one dtype: NumPy's comparison is as fast
        ("where", [mask, x, y], {}), ("where", [mask, x, 0.0], {}),
        ("masked_fill", [x, mask, -7.5], {}),
        ("maximum", [x, y], {}), ("minimum", [x, y], {}),
        ("clamp", [x, -1.0, 2.0], {}), ("clamp", [x, None, 0.5], {}), ("clamp", [x, y, z], {}),
        ("lerp", [x, y, 0.25], {}), ("lerp", [x, y, z], {}),
        ("addcmul", [x, y, z], {"value": 0.5}), ("addcdiv", [x, y, z], {"value": -2.0}),
        ("gelu_backward", [y, x], {"approximate": "none"}), ("silu_backward", [y, x], {}),
        ("div", [x, y.astype(other)], {"rounding_mode": "floor"}), ("remainder", [x, y], {}),
        ("relu", [rng.integers(-5, 5, SHAPE)], {}),     # integer input (float compute skips)
        ("sigmoid", [rng.integers(-5, 5, SHAPE)], {}),  # int64 -> float32
    ]
    for name, args, attrs in cases:
        c, ref, ran = _both(name, args, attrs)
        if name != "relu":   # relu of an int64 tensor computes in int64: NumPy's
            assert ran, f"{name}{[getattr(a, 'dtype', a) for a in args]}: C did not run"
        _check(name, c, ref, attrs)


def test_fallbacks_keep_numpy_semantics(on):
    """Broadcast, non-contiguous and small inputs take the NumPy kernel: nothing compiles."""
    rng = np.random.default_rng(3)
    x = tessera.from_numpy(rng.standard_normal(SHAPE).astype(np.float32))
    row = tessera.from_numpy(rng.standard_normal(SHAPE[1]).astype(np.float32))
    eager._KERNELS.clear()
    for got, want in [
            (tessera.sigmoid(x.t()), 1 / (1 + np.exp(-x.numpy().T))),
            (tessera.where(x > 0, x, row), np.where(x.numpy() > 0, x.numpy(), row.numpy())),
            (tessera.sigmoid(x[:5]), 1 / (1 + np.exp(-x.numpy()[:5])))]:
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-6)
    assert not any(k[0] in ("sigmoid", "where") for k in eager._KERNELS)


def test_numeric_attributes_compile_a_bounded_number_of_kernels(on):
    x = np.random.default_rng(4).standard_normal(SHAPE).astype(np.float32)
    t = tessera.from_numpy(x)
    eager._NUMERIC.pop("leaky_relu", None)
    for k in range(eager._NUMERIC_KEYS + 3):
        slope = 0.01 * (k + 1)
        got = tessera.nn.functional.leaky_relu(t, slope).numpy()
        np.testing.assert_array_equal(got, np.where(x > 0, x, x * np.float32(slope)))
    assert eager._NUMERIC["leaky_relu"] == eager._NUMERIC_KEYS


def test_against_torch_with_autograd(on):
    x = np.random.default_rng(5).standard_normal((64, 6, 28, 28)).astype(np.float32)
    t, r = tessera.from_numpy(x).requires_grad_(), torch.from_numpy(x).requires_grad_()
    for lib, a in ((tessera, t), (torch, r)):
        y = lib.nn.functional.gelu(lib.sigmoid(a) * lib.relu(a))
        y.sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert any(k[0] == "gelu" for k, f in eager._KERNELS.items() if f is not None)


@pytest.mark.parametrize("var", ["TESSERA_EAGER_C", "TESSERA_CODEGEN"])
def test_switch_off(monkeypatch, var):
    x = tessera.from_numpy(np.linspace(-2, 2, N, dtype=np.float32))
    eager._STATE[0] = None
    monkeypatch.setenv(var, "0")
    assert not eager.enabled()
    ran = []
    run = eager.run
    monkeypatch.setattr(eager, "run", lambda *a: ran.append(1) or run(*a))
    np.testing.assert_array_equal(tessera.relu(x).numpy(), np.maximum(x.numpy(), 0))
    assert not ran
