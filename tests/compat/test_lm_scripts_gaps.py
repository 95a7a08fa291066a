"""What small language-model scripts (char-RNN, GPT, makemore kinds) use and tessera lacked,
each checked against PyTorch."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tessera


def test_variable_import_paths():
    from tessera.autograd import Variable
    from tessera.autograd.variable import Variable as V2
    assert Variable is V2 is tessera.autograd.Variable
    assert torch.autograd.Variable is torch.autograd.variable.Variable


@pytest.mark.parametrize("requires_grad", [False, True])
def test_variable_of_a_leaf(requires_grad):
    for mod in (torch, tessera):
        t = mod.ones(3)
        v = mod.autograd.Variable(t, requires_grad=requires_grad)
        assert type(v) is mod.Tensor
        assert v is not t and v.requires_grad == requires_grad and v.is_leaf
        assert not t.requires_grad
        v.data.add_(1.0)  # shares t's data
        np.testing.assert_array_equal(t.numpy(), np.full(3, 2.0))
        assert isinstance(t, mod.autograd.Variable)
        assert not isinstance(np.ones(2), mod.autograd.Variable)


def test_variable_of_a_non_leaf_is_detached():
    for mod in (torch, tessera):
        x = mod.ones(2, requires_grad=True) * 2
        v = mod.autograd.Variable(x)
        assert v.grad_fn is None and not v.requires_grad
        w = mod.autograd.Variable(x, requires_grad=True)
        assert w.is_leaf and w.requires_grad


def test_variable_training_step_matches():
    """The old idiom: wrap inputs in Variable, train, read the loss back."""
    rng = np.random.default_rng(0)
    xs, ys = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 1))
    w0 = rng.standard_normal((1, 4)).astype(np.float32)
    losses = {}
    for mod in (torch, tessera):
        lin = mod.nn.Linear(4, 1, bias=False)
        with mod.no_grad():
            lin.weight.copy_(mod.tensor(w0))
        x = mod.autograd.Variable(mod.tensor(xs))
        y = mod.autograd.Variable(mod.tensor(ys.astype(np.float32)), requires_grad=False)
        loss = ((lin(x) - y) ** 2).mean()
        loss.backward()
        losses[mod.__name__] = (loss.item(), lin.weight.grad.numpy().copy())
    np.testing.assert_allclose(losses["tessera"][0], losses["torch"][0], rtol=1e-6)
    np.testing.assert_allclose(losses["tessera"][1], losses["torch"][1], rtol=1e-5)


def test_variable_empty_volatile_and_bad_data():
    for mod in (torch, tessera):
        assert tuple(mod.autograd.Variable().shape) == (0,)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            v = mod.autograd.Variable(mod.ones(1), volatile=True)
        assert v.shape == (1,) and any("volatile" in str(x.message) for x in w)
        with pytest.raises(TypeError, match="Variable data has to be a tensor, but got list"):
            mod.autograd.Variable([1, 2])


@pytest.mark.parametrize("key", [0, -1, slice(None), slice(0, 1)])
def test_indexing_a_0d_tensor_names_the_fix(key):
    """``loss.data[0]`` in pre-0.4 scripts: the same exception and message as PyTorch."""
    with pytest.raises(IndexError) as ref:
        torch.tensor(3.0)[key]
    with pytest.raises(IndexError) as got:
        tessera.tensor(3.0)[key]
    assert str(got.value) == str(ref.value)


@pytest.mark.parametrize("key", [None, Ellipsis, True, (None, None)])
def test_keys_that_index_a_0d_tensor(key):
    ref, got = torch.tensor(3.0)[key], tessera.tensor(3.0)[key]
    assert tuple(got.shape) == tuple(ref.shape)
    np.testing.assert_array_equal(got.numpy(), ref.numpy())
