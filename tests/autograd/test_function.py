"""Custom ``autograd.Function``s against PyTorch: saved tensors, needs_input_grad,
non-differentiable and multiple outputs, non-tensor arguments, double backward."""
from __future__ import annotations

import torch

import tessera
from tests.autograd._helpers import X, leaf, same


def _functions(L):
    class Cube(L.autograd.Function):
        @staticmethod
        def forward(ctx, x, scale):
            ctx.save_for_backward(x)
            ctx.scale = scale
            return x ** 3 * scale

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3 * x ** 2 * ctx.scale, None

    class SplitSum(L.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a + b, a * b

        @staticmethod
        def backward(ctx, g_sum, g_prod):
            a, b = ctx.saved_tensors
            return g_sum + g_prod * b, g_sum + g_prod * a

    class ArgmaxAndValue(L.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            idx = (x > 0).long()
            ctx.mark_non_differentiable(idx)
            ctx.save_for_backward(x)
            return x * 2, idx

        @staticmethod
        def backward(ctx, g, g_idx):
            return g * 2

    class NeedsGrad(L.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.flags = ctx.needs_input_grad
            return a * b

        @staticmethod
        def backward(ctx, g):
            return (g * 2 if ctx.needs_input_grad[0] else None,
                    g * 3 if ctx.needs_input_grad[1] else None)

    return Cube, SplitSum, ArgmaxAndValue, NeedsGrad


def test_function_save_for_backward_and_non_tensor_args():
    def fn(L):
        Cube = _functions(L)[0]
        x = leaf(L)
        y = Cube.apply(x, 2.5)
        y.sum().backward()
        return y, x.grad, y.requires_grad, y.is_leaf
    same(fn)
    Cube = _functions(tessera)[0]
    y = Cube.apply(tessera.ones(1, requires_grad=True), 1.0)
    assert y.grad_fn.name() == "CubeBackward"  # PyTorch's name for a Function's node


def test_function_multiple_outputs():
    def fn(L):
        SplitSum = _functions(L)[1]
        a, b = leaf(L), leaf(L, X * 2)
        s, p = SplitSum.apply(a, b)
        (s * 3 + p).sum().backward()
        return s, p, a.grad, b.grad
    same(fn)


def test_function_one_output_unused():
    def fn(L):
        SplitSum = _functions(L)[1]
        a, b = leaf(L), leaf(L, X * 2)
        s, p = SplitSum.apply(a, b)
        p.sum().backward()
        return a.grad, b.grad
    same(fn)


def test_function_mark_non_differentiable():
    def fn(L):
        F = _functions(L)[2]
        x = leaf(L)
        v, idx = F.apply(x)
        v.sum().backward()
        return v, idx, idx.requires_grad, v.requires_grad, x.grad
    same(fn)


def test_function_needs_input_grad():
    def fn(L):
        F = _functions(L)[3]
        a, b = leaf(L), L.tensor(X)
        y = F.apply(a, b)
        y.sum().backward()
        return a.grad, b.grad
    same(fn)
    seen = {}
    for L in (tessera, torch):
        F = _functions(L)[3]

        class Spy(F):
            @staticmethod
            def forward(ctx, a, b):
                seen[L.__name__] = tuple(ctx.needs_input_grad)
                return a * b
        Spy.apply(L.ones(1, requires_grad=True), L.ones(1))
    assert seen["tessera"] == seen["torch"] == (True, False)


def test_function_double_backward():
    def fn(L):
        Cube = _functions(L)[0]
        x = leaf(L)
        y = Cube.apply(x, 1.5).sum()
        (g,) = L.autograd.grad(y, x, create_graph=True)
        (gg,) = L.autograd.grad(g.sum(), x)
        return g, gg
    same(fn)


def test_function_without_grad_inputs():
    def fn(L):
        Cube = _functions(L)[0]
        y = Cube.apply(L.tensor(X), 2.0)
        return y, y.requires_grad, y.grad_fn is None
    same(fn)


def test_function_wrong_number_of_grads():
    def fn(L):
        class Bad(L.autograd.Function):
            @staticmethod
            def forward(ctx, a, b):
                return a * b

            @staticmethod
            def backward(ctx, g):
                return (g,)
        Bad.apply(leaf(L), leaf(L)).sum().backward()
    same(fn)


def test_function_saved_tensor_modified_in_place():
    def fn(L):
        Cube = _functions(L)[0]
        x = leaf(L)
        h = x * 1
        y = Cube.apply(h, 1.0)
        h.add_(1)
        y.sum().backward()
    _, err = same(fn)
    assert "modified by an inplace operation" in str(err)


def test_function_returning_input_unchanged():
    def fn(L):
        class Ident(L.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x

            @staticmethod
            def backward(ctx, g):
                return g * 2
        x = leaf(L)
        y = Ident.apply(x)
        (y * 3).sum().backward()
        return x.grad, y.is_leaf
    same(fn)


def test_function_inside_no_grad():
    def fn(L):
        Cube = _functions(L)[0]
        with L.no_grad():
            y = Cube.apply(leaf(L), 2.0)
        return y.requires_grad
    same(fn)
