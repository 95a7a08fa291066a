"""Devices: a toy device registered from outside the package, the meta device, mixing
devices, and ``tessera.device`` parsing.

The toy device stores every array in ``ToyArray`` (a wrapper standing in for accelerator
memory) and runs an op by unwrapping to the op's CPU kernel, so any op works on it; it counts
the kernels it ran so the tests can tell that the work happened on the device.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera.device import Backend, register_device, registered_devices


class ToyArray:
    """Device memory: a NumPy array the host only reaches through the backend."""

    __slots__ = ("a",)

    def __init__(self, a: np.ndarray):
        self.a = a

    @property
    def shape(self):
        return self.a.shape

    @property
    def dtype(self):
        return self.a.dtype

    def astype(self, dtype, copy=True):
        return ToyArray(self.a.astype(dtype, copy=copy))


def _wrap(r):
    if isinstance(r, tuple):
        return tuple(_wrap(x) for x in r)
    return r if isinstance(r, ToyArray) else ToyArray(np.asarray(r))


class ToyBackend(Backend):
    def __init__(self):
        self.ran: list[str] = []
        self.uploads = 0

    def from_numpy(self, array, index):
        self.uploads += 1
        return ToyArray(np.array(array, copy=True))

    def to_numpy(self, array):
        return array.a

    def copy_into(self, dst, src):
        np.copyto(dst.a, src.a, casting="unsafe")

    def strides(self, array):
        return tuple(s // array.a.itemsize for s in array.a.strides)

    def kernel(self, op):
        cpu = op.kernels.get("cpu")
        if cpu is None:
            return None

        def run(*args, **attrs):
            self.ran.append(op.name)
            host = [a.a if isinstance(a, ToyArray) else a for a in args]
            return _wrap(cpu(*host, **attrs))
        return run


TOY = ToyBackend()
register_device("toy", TOY)


def _host(t):
    return t.detach().cpu().numpy()


# ---- the toy device -------------------------------------------------------------------------

def test_toy_device_is_registered():
    assert "toy" in registered_devices()
    d = tessera.device("toy")
    assert d.type == "toy" and d.index is None and str(d) == "toy"
    assert str(tessera.device("toy:1")) == "toy:1" and tessera.device("toy", 1).index == 1


@pytest.mark.parametrize("make", [
    lambda dev: tessera.zeros(2, 3, device=dev), lambda dev: tessera.ones(4, device=dev),
    lambda dev: tessera.full((2,), 7, device=dev), lambda dev: tessera.arange(5, device=dev),
    lambda dev: tessera.eye(3, device=dev), lambda dev: tessera.linspace(0, 1, 5, device=dev),
    lambda dev: tessera.tensor([[1.5, 2.0]], device=dev),
    lambda dev: tessera.empty(2, device=dev).zero_(),
], ids=["zeros", "ones", "full", "arange", "eye", "linspace", "tensor", "empty"])
def test_factories_on_toy(make):
    t = make("toy")
    ref = make("cpu")
    assert t.device.type == "toy" and isinstance(t._data, ToyArray)
    assert t.shape == ref.shape and t.dtype is ref.dtype
    np.testing.assert_array_equal(_host(t), ref.numpy())


def test_ops_run_on_the_toy_device():
    x = tessera.tensor([[1.0, -2.0], [3.0, 4.0]], device="toy")
    TOY.ran.clear()
    y = (x * 2 + 1).exp().sum(1)
    assert y.device == tessera.device("toy") and isinstance(y._data, ToyArray)
    assert {"mul", "add", "exp", "sum"} <= set(TOY.ran)
    ref = (torch.tensor([[1.0, -2.0], [3.0, 4.0]]) * 2 + 1).exp().sum(1)
    np.testing.assert_allclose(_host(y), ref.numpy(), rtol=1e-6)


def test_views_and_indexing_on_toy():
    x = tessera.arange(12.0, device="toy").view(3, 4)
    r = torch.arange(12.0).view(3, 4)
    for f in (lambda t: t.t(), lambda t: t[1:, ::2], lambda t: t.permute(1, 0)[0],
              lambda t: t.reshape(2, 6), lambda t: t[t > 5], lambda t: t.unsqueeze(0)):
        out = f(x)
        assert out.device.type == "toy"
        np.testing.assert_array_equal(_host(out), f(r).numpy())
    assert x.t().stride() == r.t().stride() and not x.t().is_contiguous()


def test_inplace_ops_on_toy():
    x = tessera.ones(3, device="toy")
    x.add_(2)
    x.mul_(tessera.tensor([1.0, 2.0, 3.0], device="toy"))
    x[0] = 10.0
    assert isinstance(x._data, ToyArray)
    assert x.tolist() == [10.0, 6.0, 9.0]


def test_moving_between_cpu_and_toy():
    c = tessera.tensor([1.0, 2.0, 3.0])
    t = c.to("toy")
    assert t.device.type == "toy" and c.device.type == "cpu"
    assert t.to("toy") is t
    back = t.to("cpu")
    assert back.device.type == "cpu" and back.tolist() == [1.0, 2.0, 3.0]
    t.add_(1)  # a copy: the cpu tensor is untouched
    assert c.tolist() == [1.0, 2.0, 3.0]
    assert t.cpu().tolist() == [2.0, 3.0, 4.0]
    both = c.to("toy", tessera.float64)
    assert both.device.type == "toy" and both.dtype is tessera.float64
    assert c.to(t).device.type == "toy"
    assert tessera.zeros(2, device=tessera.device("toy")).device.type == "toy"


def test_toy_tensor_conversions():
    t = tessera.tensor([[1.5, 2.0]], device="toy")
    assert t.tolist() == [[1.5, 2.0]]
    assert t[0, 1].item() == 2.0 and float(t[0, 0]) == 1.5
    assert repr(t) == "tensor([[1.5000, 2.0000]], device='toy')"
    with pytest.raises(TypeError, match="toy"):  # like a cuda tensor in PyTorch
        t.numpy()
    assert t.cpu().numpy().tolist() == [[1.5, 2.0]]


def test_autograd_on_toy():
    x = tessera.tensor([1.0, 2.0, 3.0], device="toy", requires_grad=True)
    y = (x * x).exp().sum()
    y.backward()
    assert x.grad.device.type == "toy"
    xr = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (xr * xr).exp().sum().backward()
    np.testing.assert_allclose(_host(x.grad), xr.grad.numpy(), rtol=1e-6)


def test_autograd_across_devices():
    c = tessera.tensor([1.0, 2.0], requires_grad=True)
    t = c.to("toy")
    assert t.requires_grad and t.grad_fn is not None
    z = (t * t).sum().to("cpu") * 3
    z.backward()
    assert c.grad.device.type == "cpu" and c.grad.tolist() == [6.0, 12.0]


def test_double_backward_on_toy():
    x = tessera.tensor([0.5, 1.5], device="toy", requires_grad=True)
    (g,) = tessera.autograd.grad((x ** 3).sum(), x, create_graph=True)
    (gg,) = tessera.autograd.grad(g.sum(), x)
    assert g.device.type == gg.device.type == "toy"
    np.testing.assert_allclose(_host(gg), [3.0, 9.0])


def test_multi_output_grad_with_unused_output_on_toy():
    # the engine fills an unused output's gradient with zeros on the device of the others
    class TwoOut(tessera.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, x * 3

        @staticmethod
        def backward(ctx, g2, g3):
            assert g3.device.type == "toy"
            return g2 * 2 + g3 * 3

    x = tessera.ones(3, device="toy", requires_grad=True)
    a, _ = TwoOut.apply(x)
    a.sum().backward()
    assert x.grad.device.type == "toy" and x.grad.tolist() == [2.0, 2.0, 2.0]
    if hasattr(tessera, "unbind"):
        y = tessera.arange(6.0, device="toy").view(2, 3).requires_grad_()
        r0, _ = y.unbind(0)
        (r0 * 2).sum().backward()
        assert y.grad.device.type == "toy"
        assert y.grad.tolist() == [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]]


def test_zero_dim_cpu_tensor_joins_toy_tensor():
    t = tessera.ones(2, device="toy")
    out = t * tessera.tensor(3.0)
    assert out.device.type == "toy" and out.tolist() == [3.0, 3.0]
    out = tessera.tensor(3.0) * t
    assert out.device.type == "toy"


def test_mixing_devices_raises_naming_devices_and_op():
    t = tessera.ones(2, device="toy")
    c = tessera.ones(2)
    with pytest.raises(RuntimeError) as e:
        t + c
    msg = str(e.value)
    assert "toy" in msg and "cpu" in msg and "add" in msg
    with pytest.raises(RuntimeError, match="mul"):
        tessera.mul(c, t)
    with pytest.raises(RuntimeError, match="meta"):
        tessera.ones(2, device="meta") + c
    # torch raises RuntimeError for cpu + meta too
    with pytest.raises(RuntimeError):
        torch.ones(2, device="meta") + torch.ones(2)


def test_op_without_cpu_kernel_on_toy_names_op_and_device():
    from tessera._dispatch import dispatch
    from tessera.ops.registry import Meta, OpDef
    op = OpDef("only_meta", lambda x: Meta(x.shape, x.dtype), kernels={})
    with pytest.raises(NotImplementedError) as e:
        dispatch(op, tessera.ones(2, device="toy"))
    assert "only_meta" in str(e.value) and "toy" in str(e.value)


def test_register_device_rejects_non_backends():
    with pytest.raises(TypeError):
        register_device("bad", object())
    with pytest.raises(RuntimeError):
        tessera.device("bad")


# ---- the meta device -----------------------------------------------------------------------

META_FACTORIES = {
    "zeros": lambda L: L.zeros(2, 3, device="meta"),
    "ones": lambda L: L.ones((4,), dtype=L.float64, device="meta"),
    "empty": lambda L: L.empty(0, 5, device="meta"),
    "full": lambda L: L.full((2, 2), 3, device="meta"),
    "full-float": lambda L: L.full((2,), 1.5, device="meta"),
    "arange": lambda L: L.arange(10, device="meta"),
    "arange-float": lambda L: L.arange(0, 1, 0.1, device="meta"),
    "linspace": lambda L: L.linspace(0, 1, 7, device="meta"),
    "eye": lambda L: L.eye(3, 4, device="meta"),
    "tensor": lambda L: L.tensor([[1, 2], [3, 4]], device="meta"),
    "zeros_like": lambda L: L.zeros_like(L.ones(2, 5), device="meta"),
    "ones_like": lambda L: L.ones_like(L.ones(2, 5, device="meta")),
    "empty_like": lambda L: L.empty_like(L.ones(3, device="meta")),
    "full_like": lambda L: L.full_like(L.ones(3, device="meta"), 2),
    "scalar_tensor": lambda L: L.scalar_tensor(2.0, device="meta"),
}


@pytest.mark.parametrize("name", list(META_FACTORIES))
def test_meta_factories(name):
    ours, ref = META_FACTORIES[name](tessera), META_FACTORIES[name](torch)
    assert ours.device.type == "meta" and ours.is_meta
    assert ours._data is None  # no memory
    assert tuple(ours.shape) == tuple(ref.shape)
    assert ours.dtype.name == str(ref.dtype).removeprefix("torch.")


META_OPS = {
    "binary-broadcast": lambda L, a, b: a + b,
    "mul-scalar": lambda L, a, b: a * 2.5,
    "int-promote": lambda L, a, b: a.long() + b,
    "compare": lambda L, a, b: a > b,
    "unary": lambda L, a, b: a.exp().sqrt(),
    "sum": lambda L, a, b: a.sum(1),
    "sum-keepdim": lambda L, a, b: a.sum(dim=(0, 2), keepdim=True),
    "mean": lambda L, a, b: a.mean(),
    "view": lambda L, a, b: a.view(6, 4),
    "reshape": lambda L, a, b: a.transpose(0, 1).reshape(-1),
    "permute": lambda L, a, b: a.permute(2, 0, 1),
    "expand": lambda L, a, b: b.expand(5, 2, 3, 4),
    "getitem": lambda L, a, b: a[1, :, ::2],
    "getitem-index": lambda L, a, b: a[L.tensor([0, 1, 1], device="meta")],
    "where": lambda L, a, b: L.where(a > 0, a, b),
    "cast": lambda L, a, b: a.to(L.float16),
    "matmul": lambda L, a, b: a @ b.t(),
    "unsqueeze": lambda L, a, b: a.unsqueeze(-1),
}


@pytest.mark.parametrize("name", list(META_OPS))
def test_ops_on_meta(name):
    fn = META_OPS[name]
    a, b = tessera.empty(2, 3, 4, device="meta"), tessera.empty(3, 4, device="meta")
    ta, tb = torch.empty(2, 3, 4, device="meta"), torch.empty(3, 4, device="meta")
    ours, ref = fn(tessera, a, b), fn(torch, ta, tb)
    assert ours.device.type == "meta" and ours._data is None
    assert tuple(ours.shape) == tuple(ref.shape)
    assert ours.dtype.name == str(ref.dtype).removeprefix("torch.")


def test_meta_autograd_shapes():
    x = tessera.empty(3, 4, device="meta", requires_grad=True)
    y = (x * x).sum()
    y.backward()
    assert x.grad.device.type == "meta" and x.grad.shape == (3, 4)


def test_meta_inplace_ops():
    x = tessera.empty(3, device="meta")
    assert x.add_(1) is x and x.shape == (3,)
    x.zero_()
    x[0] = 2.0
    with pytest.raises(RuntimeError):
        x.add_(tessera.empty(4, device="meta"))


def test_meta_data_access_raises_like_torch():
    def cases(L):
        m, s = L.ones(2, device="meta"), L.ones((), device="meta")
        return [lambda: m.numpy(), lambda: s.item(), lambda: m.tolist(), lambda: float(s),
                lambda: bool(s), lambda: m.to("cpu"), lambda: m.nonzero(), lambda: m.item()]
    for ours, ref in zip(cases(tessera), cases(torch)):
        with pytest.raises(Exception) as r:
            ref()
        with pytest.raises(type(r.value)):
            ours()


def test_meta_repr():
    assert repr(tessera.ones(2, 3, device="meta")) == \
        "tensor(..., device='meta', size=(2, 3))"
    assert repr(tessera.ones(2, dtype=tessera.int64, device="meta")) == \
        "tensor(..., device='meta', size=(2,), dtype=tessera.int64)"


def test_meta_to_and_from():
    c = tessera.ones(2, 3)
    m = c.to("meta")
    assert m.device.type == "meta" and m.shape == (2, 3) and m._data is None
    assert c.to("meta", tessera.float64).dtype is tessera.float64


# ---- device parsing ------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["cpu", "cpu:0", "cpu:1", "meta"])
def test_device_parsing_matches_torch(text):
    ours, ref = tessera.device(text), torch.device(text)
    assert ours.type == ref.type and ours.index == ref.index
    assert str(ours) == str(ref)
    assert repr(ours) == repr(ref)


@pytest.mark.parametrize("args", [("cpu:x",), ("cpu:",), (":0",), ("",), ("cpu:0:1",),
                                  ("cpu:-1",), ("cpu", -1), ("cpu:0", 1), ("foo",),
                                  ("cpu:01",), (" cpu",), ("cpu", "a"), (3.5,)],
                         ids=repr)
def test_bad_device_strings_raise_like_torch(args):
    with pytest.raises(Exception) as ref:
        torch.device(*args)
    with pytest.raises(type(ref.value)):
        tessera.device(*args)


def test_device_equality_and_hash():
    for L in (tessera, torch):
        assert L.device("cpu") == L.device("cpu")
        assert L.device("cpu") != L.device("cpu:0")
        assert L.device("cpu", 0) == L.device("cpu:0")
        assert L.device(L.device("cpu:1")) == L.device("cpu:1")
        assert len({L.device("cpu"), L.device("cpu"), L.device("meta")}) == 2
    assert tessera.device(type="cpu", index=1).index == 1


def test_tensors_on_cpu_index_report_cpu():
    for L in (tessera, torch):
        assert L.ones(2, device="cpu:0").device == L.device("cpu")
        assert (L.ones(2, device="cpu:0") + L.ones(2)).device == L.device("cpu")


def test_tensor_device_properties():
    x = tessera.ones(2)
    assert x.device == tessera.device("cpu") and x.is_cpu and not x.is_cuda
    assert x.get_device() == torch.ones(2).get_device()
    m = tessera.ones(2, device="meta")
    assert m.is_meta and not m.is_cpu
