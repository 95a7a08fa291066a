"""Type promotion against PyTorch, as tables: ``promote_types`` over every pair of dtypes,
``result_type`` over tensors of both tiers (n-d and 0-d) and Python scalars, the dtypes the
arithmetic operators actually produce, and ``set_default_dtype``'s effect on factories and
on Python floats. Also ``to_device``, which moves data between devices through dispatch."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import tessera
from tessera._dispatch import dispatch, pop_mode, push_mode

NAMES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32",
         "int64", "bool")
SCALARS = (True, 3, -2, 2.5)
PAIRS = list(itertools.product(NAMES, NAMES))


def _pair(name: str, ndim: int):
    shape = (2,) * ndim
    return (tessera.zeros(shape, dtype=getattr(tessera, name)),
            torch.zeros(shape, dtype=getattr(torch, name)))


def _name(dt) -> str:
    return str(dt).split(".")[-1]


@pytest.mark.parametrize("a,b", PAIRS)
def test_promote_types(a, b):
    ours = tessera.promote_types(getattr(tessera, a), getattr(tessera, b))
    assert ours.name == _name(torch.promote_types(getattr(torch, a), getattr(torch, b)))


@pytest.mark.parametrize("a,b", PAIRS)
@pytest.mark.parametrize("da,db", [(1, 1), (1, 0), (0, 1), (0, 0), (2, 0)])
def test_result_type_tensors(a, b, da, db):
    (ta, ra), (tb, rb) = _pair(a, da), _pair(b, db)
    assert tessera.result_type(ta, tb).name == _name(torch.result_type(ra, rb))


@pytest.mark.parametrize("a", NAMES)
@pytest.mark.parametrize("ndim", [0, 1])
@pytest.mark.parametrize("s", SCALARS, ids=repr)
def test_result_type_scalars(a, ndim, s):
    t, r = _pair(a, ndim)
    assert tessera.result_type(t, s).name == _name(torch.result_type(r, s))
    assert tessera.result_type(s, t).name == _name(torch.result_type(s, r))


# ---- what the operators produce --------------------------------------------------------------

OPS = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y, "div": lambda x, y: x / y,
       "floordiv": lambda x, y: x // y, "eq": lambda x, y: x == y}


def _same_outcome(fn, ours_args, ref_args):
    """Both raise, or both give the same dtype."""
    try:
        ref = fn(*ref_args)
    except Exception:
        with pytest.raises(Exception):
            fn(*ours_args)
        return
    assert fn(*ours_args).dtype.name == _name(ref.dtype)


@pytest.mark.parametrize("a,b", PAIRS)
@pytest.mark.parametrize("da,db", [(1, 1), (1, 0), (0, 1)])
@pytest.mark.parametrize("op", ["add", "mul", "div", "floordiv", "eq"])
def test_operator_dtypes_tensors(a, b, da, db, op):
    (ta, ra), (tb, rb) = _pair(a, da), _pair(b, db)
    rb = rb + 1 if rb.dtype != torch.bool else rb | True  # no integer division by zero
    tb = tb + 1 if tb.dtype is not tessera.bool else tb | True
    _same_outcome(OPS[op], (ta, tb), (ra, rb))


@pytest.mark.parametrize("a", NAMES)
@pytest.mark.parametrize("ndim", [0, 1])
@pytest.mark.parametrize("s", (True, 3, 2.5), ids=repr)
@pytest.mark.parametrize("op", ["add", "mul", "div", "eq"])
def test_operator_dtypes_scalars(a, ndim, s, op):
    t, r = _pair(a, ndim)
    _same_outcome(OPS[op], (t, s), (r, s))
    _same_outcome(OPS[op], (s, t), (s, r))


@pytest.mark.parametrize("a,b", [("int8", "uint8"), ("float32", "float64"), ("bool", "int16"),
                                 ("float16", "bfloat16"), ("int64", "float16")])
def test_where_promotes_its_branches(a, b):
    (ta, ra), (tb, rb) = _pair(a, 1), _pair(b, 0)
    c, rc = tessera.tensor([True, False]), torch.tensor([True, False])
    assert tessera.where(c, ta, tb).dtype.name == _name(torch.where(rc, ra, rb).dtype)
    assert tessera.where(c, ta, 2.5).dtype.name == _name(torch.where(rc, ra, 2.5).dtype)


# ---- the default dtype -------------------------------------------------------------------

@pytest.fixture
def float64_default():
    tessera.set_default_dtype(tessera.float64)
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        tessera.set_default_dtype(tessera.float32)
        torch.set_default_dtype(torch.float32)


FACTORIES = {
    "zeros": lambda L: L.zeros(2), "ones": lambda L: L.ones(2, 3), "empty": lambda L: L.empty(1),
    "full-float": lambda L: L.full((2,), 2.5), "full-int": lambda L: L.full((2,), 2),
    "arange-float": lambda L: L.arange(0, 1, 0.25), "arange-int": lambda L: L.arange(3),
    "linspace": lambda L: L.linspace(0, 1, 3), "eye": lambda L: L.eye(2),
    "tensor-float": lambda L: L.tensor([1.5, 2.0]), "tensor-int": lambda L: L.tensor([1, 2]),
    "tensor-mixed": lambda L: L.tensor([1, 2.5]), "tensor-0d": lambda L: L.tensor(2.5),
    "int-plus-float": lambda L: L.tensor([1, 2]) + 2.5,
    "int-div-int": lambda L: L.tensor([1, 2]) / 2,
    "float32-plus-float": lambda L: L.ones(2, dtype=L.float32) + 2.5,
    "float32-plus-0d-default": lambda L: L.ones(2, dtype=L.float32) + L.tensor(2.5),
    "int-exp": lambda L: L.exp(L.tensor([1, 2])),
    "int-sqrt": lambda L: L.tensor([1, 4]).sqrt(),
    "bool-sigmoid": lambda L: L.sigmoid(L.tensor([True, False])),
    "zeros_like-int": lambda L: L.zeros_like(L.tensor([1])),
    "logspace": lambda L: L.logspace(0, 1, 3),
}


@pytest.mark.parametrize("name", list(FACTORIES))
def test_default_dtype_float64(float64_default, name):
    assert tessera.get_default_dtype() is tessera.float64
    ours, ref = FACTORIES[name](tessera), FACTORIES[name](torch)
    assert ours.dtype.name == _name(ref.dtype)
    if name != "empty":
        np.testing.assert_allclose(ours.numpy().astype(np.float64),
                                   ref.numpy().astype(np.float64))


@pytest.mark.parametrize("name", list(FACTORIES))
def test_default_dtype_float32(name):
    ours, ref = FACTORIES[name](tessera), FACTORIES[name](torch)
    assert ours.dtype.name == _name(ref.dtype)


def test_set_default_dtype_rejects_integers():
    with pytest.raises(TypeError):
        tessera.set_default_dtype(tessera.int64)
    assert tessera.get_default_dtype() is tessera.float32


def test_tensor_overflowing_dtype_raises():
    with pytest.raises(RuntimeError):
        torch.tensor(300, dtype=torch.int8)
    with pytest.raises(RuntimeError):
        tessera.tensor(300, dtype=tessera.int8)


# ---- to_device -------------------------------------------------------------------------------

class _Recorder:
    """A dispatch mode that notes every op name and then dispatches normally."""

    def __init__(self):
        self.ops = []

    def dispatch(self, op, args, attrs):
        self.ops.append(op.name)
        pop_mode()
        try:
            return dispatch(op, *args, **attrs)
        finally:
            push_mode(self)


def test_to_device_goes_through_dispatch():
    rec = _Recorder()
    x = tessera.ones(2, 3, requires_grad=True)
    push_mode(rec)
    try:
        m = x.to("meta")
    finally:
        pop_mode()
    assert rec.ops == ["to_device"]
    assert m.device.type == "meta" and m.shape == (2, 3) and m.requires_grad
    assert m.grad_fn is not None
    assert x.to("cpu") is x  # same device: no op at all


def test_to_device_meta_has_no_data():
    m = tessera.arange(4.0).to("meta")
    with pytest.raises(NotImplementedError):
        m.to("cpu")
    with pytest.raises(NotImplementedError):
        torch.arange(4.0).to("meta").to("cpu")


def test_to_device_round_trip_and_gradient():
    from tessera.device.registry import _BACKENDS, Backend, register_device

    class Toy(Backend):  # keeps NumPy arrays, like the CPU, under another name
        def from_numpy(self, array, index):
            return np.array(array, copy=True)

        def to_numpy(self, array):
            return array

    register_device("promotoy", Toy())
    try:
        x = tessera.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = x.to("promotoy")
        assert y.device.type == "promotoy" and y.requires_grad
        back = y.to("cpu")
        assert back.device.type == "cpu"
        np.testing.assert_array_equal(back.detach().numpy(), [1.0, 2.0, 3.0])
        (back * tessera.tensor([1.0, 2.0, 3.0])).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0, 3.0])
    finally:
        del _BACKENDS["promotoy"]
