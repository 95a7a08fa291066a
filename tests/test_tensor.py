"""The Tensor surface: metadata, conversions, constructors and copies, against PyTorch.

Each test runs the same code on ``tessera`` and on ``torch`` (the oracle) where it can, and
compares values, dtypes, shapes and exception types.
"""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import tessera


def _np(t):
    if isinstance(t, torch.Tensor):
        return t.detach().numpy()
    return t.detach().numpy()


def _same(ours, ref):
    """``ours`` (tessera) holds what ``ref`` (torch) holds: shape, dtype name and values."""
    assert isinstance(ours, tessera.Tensor), type(ours)
    assert tuple(ours.shape) == tuple(ref.shape)
    assert ours.dtype.name == str(ref.dtype).removeprefix("torch."), (ours.dtype, ref.dtype)
    np.testing.assert_array_equal(_np(ours), _np(ref))


def _raises_like(fn):
    """``fn(L)`` raises on torch; tessera must raise the same exception type."""
    with pytest.raises(Exception) as ref:
        fn(torch)
    with pytest.raises(type(ref.value)):
        fn(tessera)
    return ref.value


# ---- metadata ----------------------------------------------------------------------------

SHAPES = [(), (0,), (1,), (3,), (2, 3), (2, 0, 4), (2, 3, 4, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_metadata_matches_torch(shape):
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    ours, ref = tessera.tensor(a), torch.tensor(a)
    assert ours.shape == ref.shape and ours.size() == ref.size()
    assert tuple(ours.shape) == tuple(ref.shape)
    assert ours.dim() == ref.dim() == ours.ndim == ref.ndim
    assert ours.numel() == ref.numel() and ours.nelement() == ref.nelement()
    assert ours.stride() == torch.zeros(shape).stride()
    assert ours.is_contiguous() and ref.is_contiguous()
    assert ours.element_size() == ref.element_size()
    assert ours.nbytes == ref.nbytes
    for d in range(-len(shape), len(shape)):
        assert ours.size(d) == ref.size(d)
        assert ours.stride(d) == torch.zeros(shape).stride(d)
    assert str(ours.device) == str(ref.device) == "cpu"
    assert ours.device.type == "cpu" and ours.is_cpu and not ours.is_meta
    assert ours.get_device() == ref.get_device()


def test_size_dim_out_of_range_raises_index_error():
    for d in (2, -3):
        err = _raises_like(lambda L: L.zeros(2, 3).size(d))
        with pytest.raises(IndexError, match="Dimension out of range"):
            tessera.zeros(2, 3).size(d)
        assert err is not None
    _raises_like(lambda L: L.zeros(2, 3).stride(5))


def test_strides_of_views():
    x, y = tessera.arange(24).view(2, 3, 4), torch.arange(24).view(2, 3, 4)
    cases = [lambda t: t.transpose(0, 2), lambda t: t[:, 1], lambda t: t[..., ::2],
             lambda t: t.permute(1, 0, 2), lambda t: t.expand(3, 2, 3, 4),
             lambda t: t[:, :, :1], lambda t: t.unsqueeze(1)]
    for f in cases:
        a, b = f(x), f(y)
        assert a.stride() == b.stride()
        assert a.is_contiguous() == b.is_contiguous()
        assert a.storage_offset() == b.storage_offset()
        _same(a, b)
        _same(a.contiguous(), b.contiguous())
        assert a.contiguous().is_contiguous()


def test_size_is_a_tuple_equal_to_torch_size():
    s = tessera.zeros(2, 3).shape
    assert isinstance(s, tuple) and isinstance(s, tessera.Size)
    assert s == (2, 3) and s == torch.Size([2, 3]) and torch.Size([2, 3]) == s
    assert s != (3, 2)
    assert repr(s) == "tessera.Size([2, 3])" and repr(tessera.zeros(()).shape) == \
        "tessera.Size([])"
    assert s.numel() == 6 and tessera.Size([]).numel() == 1
    assert s[0] == 2 and s[-1] == 3 and list(s) == [2, 3] and len(s) == 2
    assert hash(s) == hash((2, 3))
    assert tessera.zeros(s).shape == s
    assert isinstance(s[0:1], tessera.Size) == isinstance(torch.Size([2, 3])[0:1], torch.Size)
    assert isinstance(s + (4,), tuple) and tuple(s + (4,)) == (2, 3, 4)
    assert tessera.Size([2, 3]) == torch.Size([2, 3])


# ---- item / tolist / numpy -----------------------------------------------------------------

@pytest.mark.parametrize("value", [3, 2.5, True, -7, 1e-3])
def test_item_types(value):
    a, b = tessera.tensor(value).item(), torch.tensor(value).item()
    assert type(a) is type(b) and a == pytest.approx(b)
    a, b = tessera.tensor([[value]]).item(), torch.tensor([[value]]).item()
    assert type(a) is type(b)


def test_item_of_several_elements_raises():
    err = _raises_like(lambda L: L.zeros(2).item())
    assert "2 elements" in str(err)
    _raises_like(lambda L: L.zeros(0).item())


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "bool", "float16",
                                   "uint8", "int8"])
def test_tolist_matches_torch(dtype):
    a = np.array([[0, 1, 2], [3, 4, 5]]).astype(dtype)
    x, y = tessera.tensor(a), torch.tensor(a)
    assert x.tolist() == y.tolist()
    assert [type(v) for v in x.tolist()[0]] == [type(v) for v in y.tolist()[0]]
    assert x[0, 1].tolist() == y[0, 1].tolist()
    assert type(x[0, 1].tolist()) is type(y[0, 1].tolist())


def test_tolist_bfloat16():
    x, y = tessera.tensor([1.5, 2.25]).bfloat16(), torch.tensor([1.5, 2.25]).bfloat16()
    assert x.tolist() == y.tolist()
    assert type(x.tolist()[0]) is float


def test_numpy_shares_memory_on_cpu():
    x = tessera.zeros(3)
    a = x.numpy()
    a[0] = 5
    assert x[0].item() == 5.0
    x.add_(1)
    assert a.tolist() == [6.0, 1.0, 1.0]
    assert a.dtype == np.float32


def test_numpy_of_a_view_is_a_strided_view():
    x = tessera.arange(6.0).view(2, 3)
    a = x.t().numpy()
    assert a.shape == (3, 2) and np.shares_memory(a, x.numpy())
    assert a.tolist() == torch.arange(6.0).view(2, 3).t().numpy().tolist()


def test_numpy_of_requires_grad_raises():
    err = _raises_like(lambda L: L.ones(2, requires_grad=True).numpy())
    x = tessera.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        x.numpy()
    assert x.detach().numpy().tolist() == [1.0, 1.0]
    assert x.numpy(force=True).tolist() == [1.0, 1.0]
    assert err is not None


def test_numpy_array_protocol():
    x = tessera.arange(4)
    assert np.asarray(x).tolist() == [0, 1, 2, 3]
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    assert np.array(tessera.tensor(2.0)).shape == ()


# ---- scalars and numpy arrays mixed with tensors ---------------------------------------------

MIXED = [
    ("t * 2", lambda t: t * 2),
    ("2 * t", lambda t: 2 * t),
    ("2 ** t", lambda t: 2 ** t),
    ("t ** 2", lambda t: t ** 2),
    ("1 - t", lambda t: 1 - t),
    ("1 / t", lambda t: 1 / t),
    ("7 // t", lambda t: 7 // t),
    ("7 % t", lambda t: 7 % t),
    ("2.5 + t", lambda t: 2.5 + t),
    ("True + t", lambda t: True + t),
    ("np.float32(2) * t", lambda t: np.float32(2) * t),
    ("np.float64(2) * t", lambda t: np.float64(2) * t),
    ("np.int64(2) * t", lambda t: np.int64(2) * t),
    ("t * np.float64(2)", lambda t: t * np.float64(2)),
    ("np.float64(1) - t", lambda t: np.float64(1) - t),
    ("np.float32(2) ** t", lambda t: np.float32(2) ** t),
    ("t + np.array([1., 2., 3.])", lambda t: t + np.array([1.0, 2.0, 3.0])),
    ("t * np.array(2.0)", lambda t: t * np.array(2.0)),
    ("t + np.arange(3)", lambda t: t + np.arange(3)),
    ("t < np.float64(2)", lambda t: t < np.float64(2)),
    ("np.float64(2) < t", lambda t: np.float64(2) < t),
]


@pytest.mark.parametrize("name,fn", MIXED, ids=[m[0] for m in MIXED])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_scalars_and_numpy_mix_like_torch(name, fn, dtype):
    a = np.array([1, 2, 3]).astype(dtype)
    try:
        ref = fn(torch.tensor(a))
    except Exception as e:
        with pytest.raises(type(e)):
            fn(tessera.tensor(a))
        return
    ours = fn(tessera.tensor(a))
    assert isinstance(ours, tessera.Tensor), f"{name} gave {type(ours).__name__}"
    _same(ours, ref)


def test_ndarray_on_the_left_of_a_tensor():
    # torch makes ``ndarray + tensor`` a TypeError; tessera computes it. Both are not silent
    # NumPy results: a tessera Tensor comes back, never an ndarray of the wrong dtype.
    out = np.array([1.0, 2.0]) * tessera.tensor([1.0, 2.0])
    assert isinstance(out, (tessera.Tensor, np.ndarray))
    np.testing.assert_allclose(np.asarray(out), [1.0, 4.0])


def test_unsupported_operand_raises_type_error():
    _raises_like(lambda L: L.ones(2) + "a")
    _raises_like(lambda L: "a" + L.ones(2))
    _raises_like(lambda L: L.ones(2) * None)
    _raises_like(lambda L: L.ones(2) - [1, 2])
    _raises_like(lambda L: "a" - L.ones(2))


@pytest.mark.parametrize("fn", [lambda x: 1j - x, lambda x: (1 + 2j) / x],
                         ids=["rsub", "rtruediv"])
def test_complex_scalar_on_the_left(fn):
    ref = fn(torch.tensor([1.0, 2.0]))
    out = fn(tessera.tensor([1.0, 2.0]))
    assert out.dtype.name == str(ref.dtype).split(".")[-1]
    np.testing.assert_allclose(out.numpy(), ref.numpy())


# ---- construction --------------------------------------------------------------------------

DATA = [3, 2.5, True, [1, 2], [1.0, 2], [True, False], [[1, 2], [3, 4]], [], [[]], [1, 2.0, True],
        np.array([1, 2], dtype=np.int32), np.float64(2.0), np.array(3.0), (1, 2),
        [np.float32(1), np.float32(2)], [np.int32(1), 2]]


@pytest.mark.parametrize("data", DATA, ids=repr)
def test_tensor_from_data_dtype_and_values(data):
    _same(tessera.tensor(data), torch.tensor(data))


def test_tensor_from_nested_tensors():
    _same(tessera.tensor([tessera.tensor(1.0), tessera.tensor(2.0)]),
          torch.tensor([torch.tensor(1.0), torch.tensor(2.0)]))


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool", "float16", "uint8"])
def test_tensor_with_dtype(dtype):
    _same(tessera.tensor([0, 1.7, 2], dtype=getattr(tessera, dtype)),
          torch.tensor([0, 1.7, 2], dtype=getattr(torch, dtype)))


def test_tensor_bad_data():
    _raises_like(lambda L: L.tensor([[1, 2], [3]]))
    _raises_like(lambda L: L.tensor("abc"))
    _raises_like(lambda L: L.tensor([1, "a"]))
    _raises_like(lambda L: L.tensor([[1], 2]))
    _raises_like(lambda L: L.tensor(None))


def test_unsupported_numpy_dtypes_raise_type_error():
    # tessera has no uint16/uint32/uint64 (PyTorch 2.3+ has limited support): a clear error
    for dt in (np.uint32, np.uint16, np.uint64, np.object_):
        with pytest.raises(TypeError, match="uint|object"):
            tessera.from_numpy(np.array([1], dtype=dt))
        with pytest.raises(TypeError):
            tessera.tensor(np.array([1], dtype=dt))


def test_tensor_copies_but_as_tensor_and_from_numpy_share():
    a = np.zeros(3, dtype=np.float32)
    t, s, f = tessera.tensor(a), tessera.as_tensor(a), tessera.from_numpy(a)
    a[0] = 1
    assert t[0].item() == 0 and s[0].item() == 1 and f[0].item() == 1
    f[1] = 2.0
    assert a[1] == 2
    # as_tensor with another dtype has to copy
    d = tessera.as_tensor(a, dtype=tessera.float64)
    a[2] = 7
    assert d[2].item() == 0 and d.dtype is tessera.float64
    # as_tensor of a tensor is the tensor itself
    x = tessera.ones(2)
    assert tessera.as_tensor(x) is x
    # tensor of a tensor copies
    y = tessera.tensor(x)
    y.add_(1)
    assert x.tolist() == [1.0, 1.0]


def test_from_numpy_non_contiguous_and_dtypes():
    a = np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2]
    _same(tessera.from_numpy(a), torch.from_numpy(a))
    assert tessera.from_numpy(a).stride() == torch.from_numpy(a).stride()
    _raises_like(lambda L: L.from_numpy([1, 2]))


def test_as_tensor_of_lists_and_scalars():
    for data in ([1, 2], 3.0, [[True]]):
        _same(tessera.as_tensor(data), torch.as_tensor(data))
    _same(tessera.as_tensor([1, 2], dtype=tessera.float64),
          torch.as_tensor([1, 2], dtype=torch.float64))


def test_tensor_constructor_forms():
    _same(tessera.Tensor([1, 2]), torch.Tensor([1, 2]))
    _same(tessera.Tensor([[1.5], [2]]), torch.Tensor([[1.5], [2]]))
    assert tessera.Tensor(2, 3).shape == torch.Tensor(2, 3).shape
    assert tessera.Tensor(2, 3).dtype is tessera.float32
    assert tessera.Tensor().shape == torch.Tensor().shape
    _same(tessera.Tensor(np.array([1, 2])), torch.Tensor(np.array([1, 2])))
    assert tessera.Tensor((2, 3)).shape == torch.Tensor((2, 3)).shape
    assert tessera.Tensor(tessera.Size([2, 3])).shape == torch.Tensor(torch.Size([2, 3])).shape
    assert isinstance(tessera.Tensor([1]), tessera.Tensor)


def test_tensor_is_a_tensor():
    x = tessera.ones(2)
    assert tessera.is_tensor(x) and not tessera.is_tensor(np.ones(2))
    assert isinstance(x, tessera.Tensor)


# ---- dtype and device moves -----------------------------------------------------------------

CASTS = ["float", "double", "half", "bfloat16", "int", "long", "short", "char", "byte", "bool"]


@pytest.mark.parametrize("method", CASTS)
def test_cast_methods(method):
    a = np.array([-1.5, 0.0, 2.7, 3.0], dtype=np.float32)
    if method in ("byte",):
        a = np.abs(a)
    ours, ref = getattr(tessera.tensor(a), method)(), getattr(torch.tensor(a), method)()
    assert ours.dtype.name == str(ref.dtype).removeprefix("torch.")
    np.testing.assert_array_equal(_np(ours).astype(np.float64) if method != "bfloat16" else
                                  _np(ours.float()), _np(ref).astype(np.float64)
                                  if method != "bfloat16" else _np(ref.float()))


def test_to_forms():
    x, y = tessera.arange(3), torch.arange(3)
    _same(x.to(tessera.float64), y.to(torch.float64))
    _same(x.to(dtype=tessera.float16), y.to(dtype=torch.float16))
    _same(x.to("cpu"), y.to("cpu"))
    _same(x.to(tessera.device("cpu"), tessera.float32), y.to(torch.device("cpu"), torch.float32))
    _same(x.to("cpu", dtype=tessera.float32), y.to("cpu", dtype=torch.float32))
    _same(x.to(tessera.ones(1, dtype=tessera.float64)), y.to(torch.ones(1, dtype=torch.float64)))
    _same(x.to(device="cpu", dtype=tessera.bool), y.to(device="cpu", dtype=torch.bool))
    assert x.to(tessera.int64) is x and y.to(torch.int64) is y
    assert x.to("cpu") is x
    c = x.to(tessera.int64, copy=True)
    assert c is not x
    c.add_(1)
    assert x.tolist() == [0, 1, 2]
    assert x.to("meta").device.type == "meta"


def test_to_keeps_autograd():
    x = tessera.tensor([1.0, 2.0], requires_grad=True)
    y = x.to(tessera.float64)
    assert y.requires_grad and y.grad_fn is not None
    (y * y).sum().backward()
    assert x.grad.dtype is tessera.float32 and x.grad.tolist() == [2.0, 4.0]


def test_type():
    for dt, name in [("float32", "FloatTensor"), ("float64", "DoubleTensor"),
                     ("int64", "LongTensor"), ("bool", "BoolTensor"), ("int32", "IntTensor"),
                     ("uint8", "ByteTensor"), ("float16", "HalfTensor")]:
        assert tessera.zeros(1, dtype=getattr(tessera, dt)).type() == f"tessera.{name}"
        assert torch.zeros(1, dtype=getattr(torch, dt)).type() == f"torch.{name}"
    assert tessera.ones(2).type(tessera.int64).dtype is tessera.int64
    assert tessera.ones(2).type("tessera.DoubleTensor").dtype is tessera.float64
    assert tessera.ones(2).type("torch.LongTensor").dtype is tessera.int64
    assert tessera.ones(2).type_as(tessera.ones(1, dtype=tessera.int32)).dtype is tessera.int32


def test_new_factories():
    x = tessera.ones(2, dtype=tessera.float64)
    y = torch.ones(2, dtype=torch.float64)
    _same(x.new_zeros(2, 3), y.new_zeros(2, 3))
    _same(x.new_zeros((2, 3)), y.new_zeros((2, 3)))
    _same(x.new_ones(4), y.new_ones(4))
    _same(x.new_ones((1,), dtype=tessera.int32), y.new_ones((1,), dtype=torch.int32))
    _same(x.new_full((2,), 7), y.new_full((2,), 7))
    _same(x.new_full((2,), 7.5), y.new_full((2,), 7.5))
    _same(x.new_tensor([1, 2]), y.new_tensor([1, 2]))
    _same(x.new_tensor([1, 2], dtype=tessera.int64), y.new_tensor([1, 2], dtype=torch.int64))
    assert x.new_empty(3, 2).shape == (3, 2) and x.new_empty(3).dtype is tessera.float64
    i = tessera.arange(3)
    _same(i.new_full((2,), 3), torch.arange(3).new_full((2,), 3))
    assert x.new_zeros(2, requires_grad=True).requires_grad
    assert x.new_zeros(2, device="meta").device.type == "meta"


# ---- python conversions -----------------------------------------------------------------------

def test_python_conversions():
    assert float(tessera.tensor([2.5])) == 2.5 and int(tessera.tensor(3.9)) == 3
    assert bool(tessera.tensor([0.0])) is False and bool(tessera.tensor(2)) is True
    assert complex(tessera.tensor(2.0)) == 2 + 0j
    assert [1, 2, 3][tessera.tensor(1)] == 2
    assert list(range(10))[tessera.tensor(1):tessera.tensor(3)] == [1, 2]
    assert len(tessera.zeros(4, 2)) == 4
    assert f"{tessera.tensor(2.5):.2f}" == f"{torch.tensor(2.5):.2f}"
    assert format(tessera.tensor(3)) == format(torch.tensor(3))


@pytest.mark.parametrize("fn", [
    lambda L: float(L.zeros(2)), lambda L: int(L.zeros(2)), lambda L: bool(L.zeros(2)),
    lambda L: bool(L.zeros(0)), lambda L: len(L.tensor(1.0)), lambda L: iter(L.tensor(1.0)),
    lambda L: [1, 2][L.tensor(1.0)], lambda L: [1, 2][L.tensor([0, 1])],
    lambda L: float(L.zeros(0)),
], ids=["float", "int", "bool", "bool-empty", "len-0d", "iter-0d", "index-float",
        "index-vector", "float-empty"])
def test_python_conversion_errors(fn):
    _raises_like(fn)


def test_iteration_yields_rows():
    x, y = tessera.arange(6).view(3, 2), torch.arange(6).view(3, 2)
    rows = list(x)
    assert len(rows) == 3
    for a, b in zip(rows, y):
        _same(a, b)
    assert [v.item() for v in tessera.arange(3)] == [0, 1, 2]


def test_iteration_keeps_autograd():
    x = tessera.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    r0, r1 = x
    (r0 * 2 + r1 * 3).sum().backward()
    assert x.grad.tolist() == [[2.0, 2.0], [3.0, 3.0]]


# ---- clone / detach / requires_grad -------------------------------------------------------------

def test_clone_is_a_copy_with_grad():
    x = tessera.tensor([1.0, 2.0], requires_grad=True)
    c = x.clone()
    assert c.grad_fn is not None and c.requires_grad
    assert c.data_ptr() != x.data_ptr()
    (c * 3).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]
    nc = tessera.arange(6).view(2, 3).t()
    assert nc.clone().stride() == torch.arange(6).view(2, 3).t().clone().stride()


def test_detach_shares_storage_and_version():
    x = tessera.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    d = y.detach()
    assert not d.requires_grad and d.grad_fn is None and d.is_leaf
    assert d.data_ptr() == y.data_ptr()
    d.add_(1)
    assert y.tolist() == [3.0, 5.0]
    assert y._version_value == d._version_value == 1


def test_detach_inplace():
    x = tessera.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    assert y.detach_() is y
    assert not y.requires_grad and y.grad_fn is None and y.is_leaf


def test_requires_grad_flags():
    x = tessera.ones(2)
    assert not x.requires_grad and x.is_leaf
    assert x.requires_grad_() is x and x.requires_grad
    x.requires_grad = False
    assert not x.requires_grad
    _raises_like(lambda L: L.ones(2, dtype=L.int64).requires_grad_())
    _raises_like(lambda L: L.ones(2, dtype=L.int64, requires_grad=True))
    _raises_like(lambda L: (L.ones(2, requires_grad=True) * 2).requires_grad_(False))
    y = tessera.ones(2, requires_grad=True) * 2
    assert y.requires_grad_() is y  # True on a non-leaf is allowed


def test_data_attribute():
    x = tessera.tensor([1.0, 2.0], requires_grad=True)
    assert not x.data.requires_grad
    x.data.mul_(2)  # through .data autograd does not see the change
    assert x.tolist() == [2.0, 4.0] and x.requires_grad
    x.data = tessera.zeros(3)
    assert x.shape == (3,) and x.requires_grad


# ---- copies ------------------------------------------------------------------------------------

def test_deepcopy():
    x = tessera.tensor([1.0, 2.0], requires_grad=True)
    x.grad = tessera.tensor([0.5, 0.5])
    c = copy.deepcopy(x)
    assert c is not x and c.requires_grad and c.is_leaf
    assert c.tolist() == [1.0, 2.0] and c.grad.tolist() == [0.5, 0.5]
    c.data.add_(1)
    assert x.tolist() == [1.0, 2.0]
    _raises_like(lambda L: copy.deepcopy(L.ones(2, requires_grad=True) * 2))
    # shared tensors stay shared
    a = tessera.ones(2)
    pair = copy.deepcopy([a, a])
    assert pair[0] is pair[1]


def test_copy_copy_shares_nothing_surprising():
    x = tessera.ones(2)
    c = copy.copy(x)
    assert c.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("make", [
    lambda L: L.arange(6).view(2, 3), lambda L: L.tensor(2.5, dtype=L.float64),
    lambda L: L.ones(2, 3, dtype=L.float16), lambda L: L.zeros(0, 2),
    lambda L: L.tensor([True, False]), lambda L: L.ones(2, requires_grad=True),
    lambda L: L.arange(6.0).view(2, 3).t(), lambda L: L.ones(2, dtype=L.bfloat16),
], ids=["int", "0d", "half", "empty", "bool", "requires_grad", "transposed", "bf16"])
def test_pickle_round_trip(make):
    x = make(tessera)
    y = pickle.loads(pickle.dumps(x))
    assert y.shape == x.shape and y.dtype is x.dtype and y.requires_grad == x.requires_grad
    assert y.tolist() == x.tolist()
    assert y.device == x.device


def test_pickle_meta_tensor():
    x = tessera.zeros(2, 3, device="meta")
    y = pickle.loads(pickle.dumps(x))
    assert y.device.type == "meta" and y.shape == (2, 3)


def test_pickle_dtype_and_device():
    assert pickle.loads(pickle.dumps(tessera.float16)) is tessera.float16
    assert pickle.loads(pickle.dumps(tessera.device("cpu"))) == tessera.device("cpu")
    assert pickle.loads(pickle.dumps(tessera.Size([2, 3]))) == (2, 3)


# ---- default dtype -------------------------------------------------------------------------------

@pytest.fixture
def float64_default():
    tessera.set_default_dtype(tessera.float64)
    torch.set_default_dtype(torch.float64)
    yield
    tessera.set_default_dtype(tessera.float32)
    torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("make", [
    lambda L: L.tensor(1.5), lambda L: L.tensor([1, 2.0]), lambda L: L.zeros(2),
    lambda L: L.ones(1), lambda L: L.arange(0.0, 2.0), lambda L: L.linspace(0, 1, 3),
    lambda L: L.full((2,), 1.5), lambda L: L.tensor([1, 2]), lambda L: L.empty(2) * 0,
    lambda L: L.tensor([1, 2]) / 2, lambda L: L.tensor([1, 2]).float(),
    lambda L: L.tensor([1j]), lambda L: L.Tensor([1, 2]), lambda L: L.arange(3) * 1.5,
    lambda L: L.tensor([1.0], dtype=L.float32) * 2.0, lambda L: L.eye(2),
], ids=["scalar", "list", "zeros", "ones", "arange", "linspace", "full", "int", "empty",
        "int-div", "float()", "complex", "Tensor", "int*float", "f32*float", "eye"])
def test_default_dtype_float64(float64_default, make):
    ours, ref = make(tessera), make(torch)
    assert ours.dtype.name == str(ref.dtype).removeprefix("torch.")
    assert tessera.get_default_dtype() is tessera.float64


def test_set_default_dtype_rejects_ints():
    _raises_like(lambda L: L.set_default_dtype(L.int64))
    assert tessera.get_default_dtype() is tessera.float32


# ---- dtype objects ------------------------------------------------------------------------------

def test_dtype_objects():
    for name in ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                 "uint8", "bool", "complex64", "complex128"):
        ours, ref = getattr(tessera, name), getattr(torch, name)
        assert repr(ours) == repr(ref).replace("torch.", "tessera.")
        assert ours.is_floating_point == ref.is_floating_point
        assert ours.is_complex == ref.is_complex
        assert ours.is_signed == ref.is_signed
        assert ours.itemsize == ref.itemsize
    assert tessera.float is tessera.float32 and tessera.long is tessera.int64
    assert tessera.half is tessera.float16 and tessera.double is tessera.float64


def test_promote_types_matches_torch():
    names = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
             "float32", "float64", "complex64", "complex128"]
    for a in names:
        for b in names:
            ours = tessera.promote_types(getattr(tessera, a), getattr(tessera, b))
            ref = torch.promote_types(getattr(torch, a), getattr(torch, b))
            assert ours.name == str(ref).removeprefix("torch."), (a, b)
