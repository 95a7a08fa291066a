"""Version counters and in-place ops under autograd, against PyTorch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tests.autograd._helpers import leaf, same


def test_modifying_saved_tensor_raises():
    def fn(L):
        x = leaf(L)
        y = x * 1
        z = y * y
        y.mul_(2)
        z.sum().backward()
    _, err = same(fn)
    assert "modified by an inplace operation" in str(err)


def test_modifying_saved_output_raises():
    def fn(L):
        x = leaf(L)
        y = x.exp()
        y.add_(1)
        y.sum().backward()
    _, err = same(fn)
    assert "modified by an inplace operation" in str(err)


def test_modifying_tensor_not_saved_is_fine():
    def fn(L):
        x = leaf(L)
        y = x * 1
        z = y + 2
        y.mul_(2)
        (z + y).sum().backward()
        return x.grad
    same(fn)


def test_modifying_saved_through_a_view_raises():
    def fn(L):
        x = leaf(L)
        y = x * 1
        z = y.sin()
        y[1:].mul_(3)
        z.sum().backward()
    same(fn)


def test_inplace_on_leaf_requiring_grad_raises():
    _, err = same(lambda L: leaf(L).add_(1))
    assert "leaf Variable that requires grad" in str(err)
    same(lambda L: leaf(L)[0].mul_(2))
    same(lambda L: leaf(L).view(3, 1).zero_())


def test_inplace_on_leaf_under_no_grad_is_allowed():
    def fn(L):
        x = leaf(L)
        with L.no_grad():
            x.mul_(2)
            x[0] = 5.0
        (x * x).sum().backward()
        return x, x.grad, x.is_leaf
    same(fn)


INPLACE = {
    "add-mul": lambda L, x: (lambda y: (y.add_(1), y.mul_(x), y)[-1])(x * 2),
    "mul-self": lambda L, x: (lambda y: (y.mul_(y), y)[-1])(x * 1),
    "exp-then-use": lambda L, x: (lambda y: (y.exp_(), y * x)[-1])(x + 0),
    "sigmoid-inplace": lambda L, x: (lambda y: (y.sigmoid_(), y)[-1])(x * 3),
    "div-by-input": lambda L, x: (lambda y: (y.div_(x * x + 1), y)[-1])(x.sin()),
    "slice-write": lambda L, x: (lambda y: (y[1:].mul_(x[:2]), y)[-1])(x * 2),
    "setitem-tensor": lambda L, x: (lambda y: (y.__setitem__(0, x[2] * 5), y)[-1])(x * 1),
    "setitem-scalar": lambda L, x: (lambda y: (y.__setitem__(slice(0, 2), 0.0), y * x)[-1])(
        x * 1),
    "view-write-base-read": lambda L, x: (lambda y: (y.view(3, 1)[2].add_(x[0]), y)[-1])(
        x * 1),
    "base-write-view-read": lambda L, x: (lambda y, v: (y.mul_(2), v * x)[-1])(
        *(lambda y: (y, y[:2]))(x * 1)),
    "iadd": lambda L, x: (lambda y: (y.__iadd__(x), y)[-1])(x * x),
    "clamp-inplace": lambda L, x: (lambda y: (y.clamp_(-1, 1), y)[-1])(x * 2),
    "relu-inplace": lambda L, x: (lambda y: (y.relu_(), y * x)[-1])(x - 0.6),
    "copy-into": lambda L, x: (lambda y: (y.copy_(x.exp()), y * x)[-1])(L.zeros(3,
                                                                             dtype=x.dtype)),
    "fill-inplace": lambda L, x: (lambda y: (y.fill_(2.0), y * x)[-1])(x * 1),
    "zero-then-add": lambda L, x: (lambda y: (y.zero_(), y.add_(x * x), y)[-1])(x * 1),
}


@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace_on_non_leaves_gives_torchs_gradients(name):
    def fn(L):
        x = leaf(L)
        y = INPLACE[name](L, x)
        w = L.tensor(np.array([1.0, -2.0, 0.5]))
        (y * w).sum().backward()
        return y, x.grad
    same(fn)


def _version(t):
    # torch's ``_version`` is an int; tessera keeps a shared one-element list in ``_version``
    # and exposes the number as ``_version_value``
    return t._version if isinstance(t, torch.Tensor) else t._version_value


def test_inplace_bumps_version():
    for L in (tessera, torch):
        x = L.ones(3)
        v = _version(x)
        x.add_(1)
        x[0] = 2
        x.mul_(2)
        assert _version(x) == v + 3
        y = x.view(3)
        y.add_(1)
        assert _version(x) == _version(y) == v + 4
        d = x.detach()
        d.add_(1)
        assert _version(x) == v + 5


def test_inplace_on_no_grad_view_of_leaf_then_grad():
    def fn(L):
        x = leaf(L)
        y = x * 1
        v = y[:2]
        v.mul_(x[1:])
        y.sum().backward()
        return y, v, x.grad
    same(fn)


def test_inplace_dtype_rule():
    same(lambda L: L.ones(2, dtype=L.int64).add_(1.5))
    same(lambda L: L.ones(2, dtype=L.float32).add_(L.ones(2, dtype=L.float64)))


@pytest.mark.parametrize("lib", [tessera, torch], ids=["tessera", "torch"])
def test_out_argument_refuses_autograd_like_torch(lib):
    """An explicit out= under autograd is a RuntimeError (the in-place form is not)."""
    a = lib.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="out=... arguments don't support automatic"):
        lib.add(a, 1, out=lib.empty(2))
    with pytest.raises(RuntimeError, match="out=... arguments don't support automatic"):
        lib.mul(lib.ones(2), 2, out=a * 1)
    with lib.no_grad():
        c = lib.empty(2)
        lib.add(a, 1, out=c)
    assert c.tolist() == [2.0, 2.0]
    b = lib.ones(2)
    lib.add(b, 1, out=b)
    assert b.tolist() == [2.0, 2.0]
