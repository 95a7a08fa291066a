"""Autograd against PyTorch: accumulation, retain_graph, higher derivatives, grad modes,
hooks, graph shapes, gradcheck and the ``.grad`` attribute (custom Functions are in
``test_function.py``, version counters and in-place ops in ``test_inplace.py``).

Most tests write one scenario as ``fn(L)`` and run it with ``L = tessera`` and ``L = torch``,
comparing every returned tensor (or the exception type raised).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tests.autograd._helpers import M, X, _np, leaf, same

# ---- .grad accumulation, backward(gradient=), retain_graph --------------------------------

def test_grad_accumulates_across_backward_calls():
    def fn(L):
        x = leaf(L)
        (x * x).sum().backward()
        g1 = x.grad.clone()
        (x * 3).sum().backward()
        (x.sin()).sum().backward()
        return g1, x.grad
    same(fn)


def test_grad_zeroing_and_none():
    def fn(L):
        x = leaf(L)
        (x ** 2).sum().backward()
        x.grad.zero_()
        (x * 2).sum().backward()
        g = x.grad.clone()
        x.grad = None
        (x * 5).sum().backward()
        return g, x.grad
    same(fn)


def test_backward_with_gradient():
    def fn(L):
        x = leaf(L)
        y = x * x
        y.backward(gradient=L.tensor([1.0, 0.5, -2.0], dtype=L.float64))
        z = leaf(L, M)
        (z.exp() * 2).backward(L.ones(3, 2, dtype=L.float64) * 0.25)
        return x.grad, z.grad
    same(fn)


def test_backward_gradient_shape_mismatch():
    same(lambda L: (leaf(L) * 2).backward(L.ones(2, dtype=L.float64)))


def test_backward_of_non_scalar_needs_gradient():
    ref, ours = same(lambda L: (leaf(L) * 2).backward())
    assert "grad can be implicitly created only for scalar outputs" in str(ours)
    same(lambda L: L.autograd.grad(leaf(L) * 2, leaf(L)))


def test_backward_of_tensor_without_grad():
    same(lambda L: L.ones(2).sum().backward())
    same(lambda L: L.autograd.grad(L.ones(2).sum(), L.ones(2, requires_grad=True)))


def test_backward_on_single_element_non_scalar():
    same(lambda L: (lambda x: ((x * 3).reshape(1, 1).backward(), x.grad)[1])(leaf(L, X[:1])))


@pytest.mark.parametrize("make", [
    lambda L, x: (x * x).sum(),
    lambda L, x: x.exp().sum(),
    lambda L, x: (x * 2).sum(),
    lambda L, x: (x + 1).sum(),
    lambda L, x: x.sum(),
    lambda L, x: (x / 3).sum(),
    lambda L, x: (x ** 2).sum(),
    lambda L, x: x.sigmoid().sum(),
    lambda L, x: x.view(3, 1).sum(),
    lambda L, x: x.relu().sum(),
], ids=["mul", "exp", "mul-scalar", "add-scalar", "sum", "div-scalar", "pow", "sigmoid",
        "view", "relu"])
def test_second_backward_without_retain_graph(make):
    # PyTorch raises only when a node needs saved tensors that were freed
    def fn(L):
        x = leaf(L)
        y = make(L, x)
        y.backward()
        y.backward()
        return x.grad
    _, ours = same(fn)
    if isinstance(ours, RuntimeError):
        assert "Trying to backward through the graph a second time" in str(ours)


def test_retain_graph_allows_second_backward():
    def fn(L):
        x = leaf(L)
        y = (x * x).exp().sum()
        y.backward(retain_graph=True)
        g1 = x.grad.clone()
        y.backward()
        return g1, x.grad
    same(fn)


def test_autograd_grad_frees_graph_too():
    def fn(L):
        x = leaf(L)
        y = (x * x).sum()
        L.autograd.grad(y, x)
        return L.autograd.grad(y, x)
    _, ours = same(fn)
    assert "second time" in str(ours)


def test_backward_inputs_argument():
    def fn(L):
        x, w = leaf(L), leaf(L, X * 2)
        (x * w).sum().backward(inputs=[w])
        return x.grad, w.grad
    same(fn)


# ---- higher derivatives ----------------------------------------------------------------

def _derivs(f, order):
    def fn(L):
        x = leaf(L)
        out = []
        y = f(L, x).sum()
        for _ in range(order):
            (g,) = L.autograd.grad(y, x, create_graph=True)
            out.append(g)
            y = g.sum()
        return out
    return fn


HIGHER = {
    "cube": lambda L, x: x ** 3,
    "sin": lambda L, x: x.sin(),
    "exp-times-x": lambda L, x: x.exp() * x,
    "tanh": lambda L, x: x.tanh(),
    "sigmoid": lambda L, x: x.sigmoid(),
    "div": lambda L, x: 1 / (x * x + 1),
    "log": lambda L, x: (x * x + 1).log(),
    "sqrt": lambda L, x: (x * x + 1).sqrt(),
    "pow-tensor": lambda L, x: (x * x + 1) ** x,
    "cos-sum-mean": lambda L, x: x.cos().mean() * x,
    "atan2": lambda L, x: L.atan2(x, x * x + 1),
    "where": lambda L, x: L.where(x > 0, x ** 3, x.exp()),
    "reshape-expand": lambda L, x: (x.view(3, 1).expand(3, 2) ** 2).sum(1) * x,
}


@pytest.mark.parametrize("name", list(HIGHER))
def test_double_and_triple_backward(name):
    same(_derivs(HIGHER[name], 3), atol=1e-9, rtol=1e-7)


def test_double_backward_through_two_inputs():
    def fn(L):
        x, w = leaf(L), leaf(L, X[::-1].copy())
        y = (x * x * w).sum()
        gx, gw = L.autograd.grad(y, (x, w), create_graph=True)
        gxx = L.autograd.grad(gx.sum(), (x, w), create_graph=True)
        gww = L.autograd.grad((gw * gw).sum(), (x, w), allow_unused=True)
        return gx, gw, gxx, gww
    same(fn)


def test_double_backward_with_backward_create_graph():
    def fn(L):
        x = leaf(L)
        (x ** 3).sum().backward(create_graph=True)
        g = x.grad
        x.grad = None
        g.sum().backward()
        return g, x.grad
    same(fn)


def test_matmul_chain_higher_derivatives():
    def fn(L):
        a = leaf(L, M)
        b = leaf(L, M.T.copy())
        y = ((a @ b).tanh() @ a).sum()
        ga, gb = L.autograd.grad(y, (a, b), create_graph=True)
        gga = L.autograd.grad((ga * ga).sum() + gb.sum(), (a, b))
        return ga, gb, gga
    same(fn)


def test_grad_with_grad_outputs_and_multiple_outputs():
    def fn(L):
        x = leaf(L)
        y1, y2 = x * 2, x.exp()
        v1, v2 = L.ones(3, dtype=L.float64), L.tensor(X * 3)
        return L.autograd.grad((y1, y2), x, grad_outputs=(v1, v2))
    same(fn)


def test_grad_does_not_touch_dot_grad():
    x = tessera.tensor(X, requires_grad=True)
    tessera.autograd.grad((x * x).sum(), x)
    assert x.grad is None


# ---- allow_unused / materialize_grads ------------------------------------------------------

def test_allow_unused():
    def unused(L):
        x, z = leaf(L), leaf(L)
        return L.autograd.grad((x * 2).sum(), (x, z))
    _, err = same(unused)
    assert "allow_unused" in str(err)

    def allowed(L):
        x, z = leaf(L), leaf(L)
        return L.autograd.grad((x * 2).sum(), (x, z), allow_unused=True)
    same(allowed)

    def materialized(L):
        x, z = leaf(L), leaf(L)
        return L.autograd.grad((x * 2).sum(), (x, z), materialize_grads=True)
    same(materialized)


def test_grad_of_input_that_does_not_require_grad():
    same(lambda L: L.autograd.grad((leaf(L) * 2).sum(), L.ones(3)))


# ---- grad modes ----------------------------------------------------------------------------

def test_no_grad_context_and_decorator():
    def fn(L):
        x = leaf(L)
        with L.no_grad():
            a = x * 2
            with L.enable_grad():
                b = x * 2
        @L.no_grad()
        def f(t):
            return t * 3
        c = f(x)
        d = x * 4
        return [a.requires_grad, b.requires_grad, c.requires_grad, d.requires_grad,
                L.is_grad_enabled()]
    ref, ours = same(fn)
    assert list(ours) == list(ref)


def test_no_grad_decorator_without_call():
    # ``@torch.no_grad`` without parentheses also works
    @tessera.no_grad
    def f(t):
        return t * 3
    assert not f(tessera.ones(2, requires_grad=True)).requires_grad
    assert tessera.is_grad_enabled()


def test_set_grad_enabled_forms():
    for L in (tessera, torch):
        x = L.ones(2, requires_grad=True)
        L.set_grad_enabled(False)
        try:
            assert not L.is_grad_enabled()
            assert not (x * 2).requires_grad
        finally:
            L.set_grad_enabled(True)
        assert L.is_grad_enabled()
        with L.set_grad_enabled(False):
            assert not (x * 2).requires_grad
        assert L.is_grad_enabled()
        with L.no_grad():
            with L.set_grad_enabled(True):
                assert (x * 2).requires_grad
            assert not L.is_grad_enabled()

        @L.set_grad_enabled(False)
        def f(t):
            return t * 2
        assert L.is_grad_enabled()
        assert not f(x).requires_grad
        assert L.is_grad_enabled()


def test_grad_mode_restored_after_exception():
    for L in (tessera, torch):
        with pytest.raises(ValueError):
            with L.no_grad():
                raise ValueError
        assert L.is_grad_enabled()


def test_enable_grad_decorator_inside_no_grad():
    for L in (tessera, torch):
        @L.enable_grad()
        def f(t):
            return t * 2
        with L.no_grad():
            assert f(L.ones(1, requires_grad=True)).requires_grad


def test_inference_mode():
    for L in (tessera, torch):
        x = L.ones(2, requires_grad=True)
        with L.inference_mode():
            y = x * 2
            assert L.is_inference_mode_enabled()
            assert not L.is_grad_enabled()
        assert not y.requires_grad and y.is_inference()
        assert not x.is_inference() and L.is_grad_enabled()
        assert not L.is_inference_mode_enabled()
        with L.inference_mode(False):
            assert (x * 2).requires_grad

        @L.inference_mode()
        def f(t):
            return t * 2
        assert f(x).is_inference()


def test_no_grad_results_can_be_used_later():
    def fn(L):
        x = leaf(L)
        with L.no_grad():
            c = x * 2
        y = (c * x).sum()
        y.backward()
        return x.grad
    same(fn)


# ---- detach / retain_grad / is_leaf ------------------------------------------------------------

def test_detach_stops_gradient():
    def fn(L):
        x = leaf(L)
        y = x * x
        z = y.detach() * x + y
        z.sum().backward()
        return x.grad
    same(fn)


def test_retain_grad():
    def fn(L):
        x = leaf(L)
        y = x * 2
        y.retain_grad()
        z = y * y
        w = z.sum()
        w.backward()
        return x.grad, y.grad, z.grad, y.retains_grad, z.retains_grad, y.is_leaf
    with pytest.warns(UserWarning):
        ref = fn(torch)
    ours = fn(tessera)
    for a, b in zip(ours, ref):
        if isinstance(b, torch.Tensor):
            np.testing.assert_allclose(_np(a), _np(b))
        else:
            assert a == b


def test_retain_grad_accumulates_and_create_graph():
    def fn(L):
        x = leaf(L)
        y = x * 3
        y.retain_grad()
        (y * y).sum().backward(retain_graph=True)
        (y * 2).sum().backward()
        return y.grad, x.grad
    same(fn)


def test_retain_grad_errors():
    same(lambda L: L.ones(2).retain_grad())


def test_non_leaf_grad_is_none():
    x = tessera.ones(2, requires_grad=True)
    y = x * 2
    y.sum().backward()
    with pytest.warns(UserWarning):
        assert y.grad is None
    assert x.grad is not None


# ---- hooks ---------------------------------------------------------------------------------

def test_hooks_on_leaves_and_non_leaves():
    def fn(L):
        x = leaf(L)
        seen = []
        x.register_hook(lambda g: g * 10)
        y = x * x
        y.register_hook(lambda g: seen.append(g.clone()))
        h = y.register_hook(lambda g: g + 1)
        z = y.exp()
        z.register_hook(lambda g: g * 0.5)
        z.sum().backward(retain_graph=True)
        g1 = x.grad.clone()
        h.remove()
        x.grad = None
        z.sum().backward()
        return g1, x.grad, seen
    same(fn)


def test_hook_returning_none_keeps_gradient():
    def fn(L):
        x = leaf(L)
        calls = []
        x.register_hook(lambda g: calls.append(1))
        (x * 2).sum().backward()
        return x.grad, float(len(calls))
    same(fn)


def test_hook_on_tensor_used_twice():
    def fn(L):
        x = leaf(L)
        y = x * 2
        y.register_hook(lambda g: g * 3)
        (y * y + y).sum().backward()
        return x.grad
    same(fn)


def test_register_hook_requires_grad():
    same(lambda L: L.ones(2).register_hook(lambda g: g))


def test_post_accumulate_grad_hook():
    for L in (tessera, torch):
        x = L.ones(2, requires_grad=True)
        got = []
        x.register_post_accumulate_grad_hook(lambda t: got.append(t.grad.sum().item()))
        (x * 3).sum().backward()
        assert got == [6.0]


# ---- requires_grad flags ---------------------------------------------------------------------

def test_requires_grad_false_on_non_leaf_raises():
    _, err = same(lambda L: (leaf(L) * 2).requires_grad_(False))
    assert "leaf" in str(err)
    same(lambda L: setattr(leaf(L) * 2, "requires_grad", False))


def test_requires_grad_propagation():
    def fn(L):
        a, b = L.ones(2), L.ones(2, requires_grad=True)
        return [(a * 2).requires_grad, (a * b).requires_grad, (b > 0).requires_grad,
                (a + b).is_leaf, b.sum().is_leaf, (b * 2).long().requires_grad,
                b.detach().requires_grad]
    ref, ours = same(fn)


def test_integer_outputs_do_not_require_grad():
    def fn(L):
        x = leaf(L)
        return [x.long().requires_grad, (x > 0).requires_grad, x.floor().requires_grad,
                x.isnan().requires_grad, x.sign().requires_grad]
    same(fn)


# ---- graph shapes --------------------------------------------------------------------------

def test_diamond_graph():
    def fn(L):
        x = leaf(L)
        a = x * 2
        b = a.sin()
        c = a.exp()
        d = b * c + a
        d.sum().backward()
        return x.grad
    same(fn)


def test_reused_tensor_many_times():
    def fn(L):
        x = leaf(L)
        y = x
        for _ in range(5):
            y = y * x + x
        y.sum().backward()
        return x.grad
    same(fn)


def test_same_tensor_both_operands():
    def fn(L):
        x = leaf(L)
        (x * x + x / x - x ** x).sum().backward()
        return x.grad
    same(fn)


def test_multiple_roots_backward():
    def fn(L):
        x = leaf(L)
        y1, y2 = (x * 2).sum(), (x * x).sum()
        L.autograd.backward([y1, y2])
        return x.grad
    same(fn)


def test_multiple_roots_with_grad_tensors():
    def fn(L):
        x = leaf(L)
        y1, y2 = x * 2, x.exp()
        L.autograd.backward([y1, y2], [L.ones(3, dtype=L.float64), L.tensor(X)])
        return x.grad
    same(fn)


def test_deep_chain_has_no_recursion_error():
    x = tessera.tensor([1.0], requires_grad=True)
    y = x
    for _ in range(10000):
        y = y * 1.0001 + 0.0
    (g,) = tessera.autograd.grad(y.sum(), x, retain_graph=True)
    y.sum().backward()
    assert x.grad.item() == pytest.approx(1.0001 ** 10000, rel=1e-3)
    assert g.item() == x.grad.item()


def test_deep_chain_double_backward():
    x = tessera.tensor([0.3], dtype=tessera.float64, requires_grad=True)
    y = x
    for _ in range(3000):
        y = y + x * x * 0.001
    (g,) = tessera.autograd.grad(y.sum(), x, create_graph=True)
    (gg,) = tessera.autograd.grad(g.sum(), x)
    assert g.item() == pytest.approx(1 + 3000 * 0.002 * 0.3)
    assert gg.item() == pytest.approx(3000 * 0.002)


def test_deep_graph_repr_and_deletion():
    x = tessera.ones(1, requires_grad=True)
    y = x
    for _ in range(20000):
        y = y + 1
    assert "grad_fn" in repr(y)
    del y  # freeing a long chain must not overflow the stack


def test_grad_fn_and_next_functions():
    x = tessera.ones(2, requires_grad=True)
    y = x * 2
    z = y.sum()
    assert z.grad_fn is not None and z.grad_fn.name() == "SumBackward0"
    (nxt, nr), = z.grad_fn.next_functions
    assert nxt is y.grad_fn and nr == 0
    acc = y.grad_fn.next_functions[0][0]
    assert acc.name() == "AccumulateGrad" and acc.variable is x
    assert x.grad_fn is None and x.is_leaf


def test_gradient_dtype_follows_input():
    def fn(L):
        x = L.tensor([1.0, 2.0], requires_grad=True)
        (x.double() * 3).sum().backward()
        h = L.tensor([1.0, 2.0], dtype=L.float64, requires_grad=True)
        (h.float() * 3).sum().backward()
        return x.grad, h.grad
    same(fn)


def test_broadcast_gradients_reduce_to_input_shapes():
    def fn(L):
        a = leaf(L, M)
        b = leaf(L, X[:2].copy())
        c = L.tensor(np.array(2.0), requires_grad=True)
        (a * b + c).exp().sum().backward()
        return a.grad, b.grad, c.grad
    same(fn)


# ---- gradcheck -----------------------------------------------------------------------------

GRADCHECK = [
    lambda x: (x * x).sin(),
    lambda x: x.exp() / (x * x + 1),
    lambda x: (x.sigmoid() * x.tanh()).sum(),
    lambda x: x.view(3, 1).expand(3, 2) * x.view(3, 1),
    lambda x: tessera.where(x > 0, x ** 2, -x),
]


@pytest.mark.parametrize("f", GRADCHECK)
def test_gradcheck_and_gradgradcheck(f):
    x = tessera.tensor(X, requires_grad=True)
    assert tessera.autograd.gradcheck(f, (x,))
    assert tessera.autograd.gradgradcheck(f, (x,))


def test_gradcheck_two_inputs():
    a = tessera.tensor(X, requires_grad=True)
    b = tessera.tensor(X[::-1].copy(), requires_grad=True)
    assert tessera.autograd.gradcheck(lambda p, q: p * q.exp() + p / (q * q + 2), (a, b))
    assert tessera.autograd.gradgradcheck(lambda p, q: p * q.exp(), (a, b))


def test_gradcheck_detects_a_wrong_gradient():
    class Wrong(tessera.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, g):
            return g  # should be 2 x g
    x = tessera.tensor(X, requires_grad=True)
    with pytest.raises(RuntimeError):
        tessera.autograd.gradcheck(Wrong.apply, (x,))
    assert tessera.autograd.gradcheck(Wrong.apply, (x,), raise_exception=False) is False


# ---- the .grad attribute --------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    lambda L: L.ones(3), lambda L: L.ones(2, dtype=L.int64), lambda L: 3,
    lambda L: L.ones(2, dtype=L.float64), lambda L: L.ones(1, 2),
    lambda L: L.ones(2, device="meta"),
], ids=["size", "int-dtype", "not-a-tensor", "double", "shape", "device"])
def test_assigning_a_bad_grad_raises(value):
    def fn(L):
        x = L.ones(2, requires_grad=True)
        x.grad = value(L)
    same(fn)


def test_assigning_grad():
    x = tessera.ones(2, requires_grad=True)
    x.grad = tessera.tensor([1.0, 2.0])
    (x * 3).sum().backward()
    assert x.grad.tolist() == [4.0, 5.0]
    x.grad = None
    assert x.grad is None


def test_non_leaf_grad_access_warns_like_torch():
    for L in (tessera, torch):
        y = L.ones(2, requires_grad=True) * 2
        with pytest.warns(UserWarning, match="not a leaf"):
            assert y.grad is None
        y.retain_grad()
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert y.grad is None
