"""``torch.linalg``: the linear-algebra functions tessera has, under PyTorch's names and
signatures (norms, ``multi_dot``, ``vecdot``, ``cholesky``, ``solve_triangular``...).

Decompositions tessera has no op for (``inv``, ``det``, ``svd``, ``qr``, ``eigh``,
``solve``...) are absent: ``tessera.linalg.inv`` is an ``AttributeError``.

>>> import tessera
>>> tessera.linalg.vector_norm(tessera.tensor([3.0, 4.0]))
tensor(5.)
>>> tessera.linalg.multi_dot([tessera.ones(2, 3), tessera.ones(3, 4), tessera.ones(4, 1)]).tolist()
[[12.0], [12.0]]
"""
from __future__ import annotations

import math

from tessera._tensor import Tensor
from tessera.ops.linalg import cholesky as _cholesky, matmul, triangular_solve
from tessera.ops.reduce import amax, amin, sum as _sum
from tessera.ops.views import diagonal as _diagonal

__all__ = ["vector_norm", "matrix_norm", "norm", "multi_dot", "vecdot", "cholesky",
           "cholesky_ex", "matmul", "diagonal", "solve_triangular"]


def vector_norm(x: Tensor, ord: float = 2, dim=None, keepdim: bool = False, *, dtype=None,
                out=None) -> Tensor:
    """``sum(|x|^ord)^(1/ord)`` over ``dim`` (every element when None); ``ord`` may be
    ``inf``, ``-inf`` or 0 (the count of nonzeros)."""
    if dtype is not None:
        x = x.to(dtype)
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor "
                           f"as input. Got {x.dtype.name.capitalize()}")
    a = x.abs()
    if dim is None:
        dims = tuple(range(x.dim()))
    else:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if ord == math.inf:
        r = amax(a, dims, keepdim)
    elif ord == -math.inf:
        r = amin(a, dims, keepdim)
    elif ord == 0:
        r = _sum((a != 0).to(a.dtype), dims, keepdim)
    elif ord == 1:
        r = _sum(a, dims, keepdim)
    elif ord == 2:
        r = _sum(a * a, dims, keepdim).sqrt()
    else:
        r = _sum(a ** ord, dims, keepdim) ** (1.0 / ord)
    return r if out is None else out.copy_(r)


def matrix_norm(A: Tensor, ord="fro", dim=(-2, -1), keepdim: bool = False, *, dtype=None,
                out=None) -> Tensor:
    """The Frobenius norm, or the largest/smallest absolute row (``inf``) or column (1)
    sum, over the two dims ``dim``. (Spectral and nuclear norms need an SVD, which tessera
    lacks.)"""
    if dtype is not None:
        A = A.to(dtype)
    if A.dim() < 2:
        raise RuntimeError("linalg.matrix_norm: The input tensor A must have at least 2 "
                           "dimensions.")
    d0, d1 = (d % A.dim() for d in dim)
    if ord == "fro":
        r = vector_norm(A, 2, (d0, d1), keepdim)
    elif ord in (math.inf, -math.inf, 1, -1):
        inner, outer = (d1, d0) if ord in (math.inf, -math.inf) else (d0, d1)
        s = _sum(A.abs(), inner, True)
        r = (amax if ord > 0 else amin)(s, outer, True)
        if not keepdim:
            r = r.squeeze((d0, d1))
    else:
        raise NotImplementedError(f"linalg.matrix_norm: ord={ord!r} needs a singular value "
                                  "decomposition, which tessera does not have")
    return r if out is None else out.copy_(r)


def norm(A: Tensor, ord=None, dim=None, keepdim: bool = False, *, out=None,
         dtype=None) -> Tensor:
    """``vector_norm`` for a vector or a 1-d ``dim``, ``matrix_norm`` for a matrix or a
    2-d ``dim``; without ``ord`` and ``dim``, the 2-norm of every element."""
    if dim is not None and not isinstance(dim, int) and len(dim) == 2 or \
            dim is None and ord is not None and A.dim() == 2:
        return matrix_norm(A, "fro" if ord is None else ord, (-2, -1) if dim is None else dim,
                           keepdim, dtype=dtype, out=out)
    return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype, out=out)


def multi_dot(tensors, *, out=None) -> Tensor:
    """The product of a chain of matrices (a first or last 1-d tensor is a vector)."""
    tensors = list(tensors)
    if len(tensors) < 2:
        raise RuntimeError(f"multi_dot(): expected at least 2 tensors but got {len(tensors)}")
    r = tensors[0]
    for t in tensors[1:]:
        r = matmul(r, t)
    return r if out is None else out.copy_(r)


def vecdot(x: Tensor, y: Tensor, *, dim: int = -1, out=None) -> Tensor:
    """``sum(x * y)`` over ``dim`` (real tensors: tessera has no complex conjugate)."""
    r = _sum(x * y, dim)
    return r if out is None else out.copy_(r)


def cholesky(A: Tensor, *, upper: bool = False, out=None) -> Tensor:
    """``L`` with ``A = L @ L.mT`` (``upper``: ``U`` with ``A = U.mT @ U``)."""
    return _cholesky(A, upper, out=out)


def cholesky_ex(A: Tensor, *, upper: bool = False, check_errors: bool = False, out=None):
    """``(L, info)``: tessera raises on a matrix that is not positive definite, so ``info``
    is zero."""
    from tessera._dtype import int32
    from tessera.ops.creation import zeros
    L = cholesky(A, upper=upper)
    return L, zeros(tuple(A.shape[:-2]), dtype=int32)


def diagonal(A: Tensor, *, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    return _diagonal(A, offset, dim1, dim2)


def solve_triangular(A: Tensor, B: Tensor, *, upper: bool, left: bool = True,
                     unitriangular: bool = False, out=None) -> Tensor:
    """``X`` with ``A @ X = B`` (``left=False``: ``X @ A = B``) for triangular ``A``."""
    if left:
        X = triangular_solve(B, A, upper=upper, unitriangular=unitriangular)[0]
    else:   # X A = B  <=>  A^T X^T = B^T
        X = triangular_solve(B.mT, A.mT, upper=not upper, unitriangular=unitriangular)[0].mT
    return X if out is None else out.copy_(X)
