"""Arguments PyTorch's parser refuses are refused the same way: a dtype given as a string or
a NumPy type, requires_grad given as something other than a bool, and index tensors of
types other than long and int (and byte/bool masks)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera


def _same_error(fn):
    with pytest.raises(Exception) as want:
        fn(torch)
    with pytest.raises(want.type) as got:
        fn(tessera)
    message = str(want.value).splitlines()[0]
    if "received an invalid combination of arguments" in message:  # an overloaded function:
        message = message.split(" received")[0]                     # its name, at least
    assert message in str(got.value)


FACTORIES = {
    "zeros": lambda L, **kw: L.zeros(2, **kw),
    "ones": lambda L, **kw: L.ones(2, **kw),
    "empty": lambda L, **kw: L.empty(2, **kw),
    "full": lambda L, **kw: L.full((2,), 1.0, **kw),
    "tensor": lambda L, **kw: L.tensor([1.0], **kw),
    "as_tensor": lambda L, **kw: L.as_tensor([1.0], **kw),
    "zeros_like": lambda L, **kw: L.zeros_like(L.zeros(1), **kw),
    "full_like": lambda L, **kw: L.full_like(L.zeros(1), 2.0, **kw),
    "rand": lambda L, **kw: L.rand(2, **kw),
    "randn": lambda L, **kw: L.randn(2, **kw),
    "scalar_tensor": lambda L, **kw: L.scalar_tensor(1.0, **kw),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
@pytest.mark.parametrize("dtype", ["float32", "torch.float32", np.float32, np.dtype("float32"),
                                   1], ids=repr)
def test_a_dtype_that_is_not_a_dtype(name, dtype):
    _same_error(lambda L: FACTORIES[name](L, dtype=dtype))


@pytest.mark.parametrize("dtype", [float, int, bool, complex])
def test_python_types_as_dtypes(dtype):
    assert str(tessera.zeros(2, dtype=dtype).dtype).split(".")[1] == \
        str(torch.zeros(2, dtype=dtype).dtype).split(".")[1]


@pytest.mark.parametrize("name", ["zeros", "full", "tensor", "zeros_like", "randn"])
@pytest.mark.parametrize("flag", ["yes", 1, 0, 1.0, np.bool_(True)], ids=repr)
def test_requires_grad_that_is_not_a_bool(name, flag):
    _same_error(lambda L: FACTORIES[name](L, requires_grad=flag))


@pytest.mark.parametrize("flag", ["yes", "", 1, None, np.bool_(True)], ids=repr)
def test_requires_grad_method_and_attribute(flag):
    _same_error(lambda L: L.zeros(2).requires_grad_(flag))
    _same_error(lambda L: setattr(L.zeros(2), "requires_grad", flag))


def test_requires_grad_none_means_false_in_factories_but_not_in_tensor():
    assert tessera.zeros(2, requires_grad=None).requires_grad is False
    _same_error(lambda L: L.tensor([1.0], requires_grad=None))


_INDEXING = {
    "getitem": lambda L, x, i: x[i],
    "getitem, 2 dims": lambda L, x, i: x.reshape(2, 2)[i, 0],
    "setitem": lambda L, x, i: x.__setitem__(i, 1.0),
    "index_put": lambda L, x, i: x.index_put((i,), L.tensor(1.0)),
    "index_select": lambda L, x, i: x.index_select(0, i),
    "gather": lambda L, x, i: x.gather(0, i),
    "take": lambda L, x, i: x.take(i),
}


@pytest.mark.parametrize("op", sorted(_INDEXING))
@pytest.mark.parametrize("dt", ["int8", "int16"])
def test_small_integer_index_tensors(op, dt):
    _same_error(lambda L: _INDEXING[op](L, L.arange(4.0), L.tensor([0, 1],
                                                                    dtype=getattr(L, dt))))


@pytest.mark.parametrize("op", ["getitem", "getitem, 2 dims", "index_put", "index_select",
                                "gather"])
def test_int32_index_tensors_still_index(op):
    got = _INDEXING[op](tessera, tessera.arange(4.0), tessera.tensor([0, 1],
                                                                     dtype=tessera.int32))
    want = _INDEXING[op](torch, torch.arange(4.0), torch.tensor([0, 1], dtype=torch.int32))
    assert got.tolist() == want.tolist()
