"""``torch.linalg``'s functions tessera has, against torch 2.13: values and gradients."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tessera

A = [[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]]
CALLS = ["vector_norm(A)", "vector_norm(A, ord=math.inf, dim=1)", "vector_norm(A, 0)",
         "vector_norm(A, -math.inf)", "vector_norm(A, 3, dim=0, keepdim=True)",
         "vector_norm(A, 1, dim=(0, 1))", "matrix_norm(A)", "matrix_norm(A, ord=1)",
         "matrix_norm(A, ord=-math.inf, keepdim=True)", "norm(A)", "norm(A, ord=1)",
         "norm(A, dim=1)", "norm(A, dim=(0, 1))", "norm(A[0], ord=math.inf)", "vecdot(A, A)",
         "multi_dot([A, A.T, A])", "diagonal(A)", "cholesky(A @ A.T + L.eye(2))",
         "cholesky(A @ A.T + L.eye(2), upper=True)",
         "solve_triangular(L.tensor([[2.0, 0.0], [1.0, 3.0]]), A, upper=False)",
         "solve_triangular(L.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [0.0, 0.0, 1.0]]), A, "
         "upper=True, left=False)"]


@pytest.mark.parametrize("call", CALLS)
def test_linalg_matches_torch(call):
    outs, grads = [], []
    for L in (torch, tessera):
        a = L.tensor(A, requires_grad=True)
        r = eval("L.linalg." + call, {"L": L, "A": a, "math": math})
        outs.append(np.asarray(r.tolist()))
        if r.requires_grad:   # the count of nonzeros has no gradient in either
            r.sum().backward()
        grads.append(None if a.grad is None else np.asarray(a.grad.tolist()))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    if grads[0] is None or grads[1] is None:
        assert grads[0] is grads[1] is None
    else:
        np.testing.assert_allclose(grads[1], grads[0], rtol=1e-4, atol=1e-5)


def test_missing_decompositions_are_attribute_errors():
    with pytest.raises(AttributeError):
        tessera.linalg.svd  # noqa: B018
    with pytest.raises(NotImplementedError, match="singular value"):
        tessera.linalg.matrix_norm(tessera.ones(2, 2), ord=2)
