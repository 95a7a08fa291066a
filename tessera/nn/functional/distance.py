"""Distances and normalisation of ``tessera.nn.functional``: ``normalize``,
``cosine_similarity``, ``pairwise_distance``, ``pdist`` (and ``cdist``, which PyTorch has
only at top level: ``tessera.cdist``). Composites of tessera ops, written as PyTorch's are,
so values and gradients (including at zero vectors) match.

>>> import tessera
>>> import tessera.nn.functional as F
>>> F.normalize(tessera.tensor([[3., 4.]]))
tensor([[0.6000, 0.8000]])
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dtype import promote_types
from tessera.autograd.grad_mode import no_grad
from tessera.ops.activation import tname
from tessera.ops.arithmetic import div
from tessera.ops.broadcast import broadcast_shapes, broadcast_tensors
from tessera.ops.creation import ones_like, tensor
from tessera.ops.queries import result_type
from tessera.ops.shape import cat

__all__ = ["normalize", "cosine_similarity", "pairwise_distance", "pdist"]

_CDIST_MODES = {"use_mm_for_euclid_dist_if_necessary": 0, "use_mm_for_euclid_dist": 1,
                "donot_use_mm_for_euclid_dist": 2}


def normalize(input, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out=None):
    """``input / max(||input||_p, eps)`` along ``dim``."""
    denom = input.norm(p, dim, keepdim=True).clamp_min(eps).expand_as(input)
    return div(input, denom, out=out)


def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8):
    """``<x1, x2> / (max(||x1||, eps) max(||x2||, eps))`` along ``dim``; as PyTorch, each
    input is divided by its norm first and the clamp does not enter the gradient."""
    common = result_type(x1, x2)
    if common.category != 2:
        raise RuntimeError(f"expected common dtype to be floating point, yet common dtype is "
                           f"{tname(common)}")
    x1 = x1.to(common) if x1.dtype.category < 2 else x1
    x2 = x2.to(common) if x2.dtype.category < 2 else x2
    x1, x2 = broadcast_tensors(x1, x2)
    n1 = x1.norm(2, dim, keepdim=True).clone()
    n2 = x2.norm(2, dim, keepdim=True).clone()
    with no_grad():
        n1.clamp_min_(eps)
        n2.clamp_min_(eps)
    return ((x1 / n1) * (x2 / n2)).sum(dim)


def pairwise_distance(x1, x2, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False):
    """``||x1 - x2 + eps||_p`` over the last dimension."""
    innermost = max(x1.dim(), x2.dim()) - 1
    return (x1 - x2 + eps).norm(p, innermost, keepdim)


def pdist(input, p: float = 2.0):
    """The p-norm distance between every pair of rows ``i < j`` of a 2-D input, as a
    vector of length ``N (N - 1) / 2``."""
    if input.dim() != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {input.dim()}D")
    if input.dtype.category != 2:
        raise RuntimeError("pdist only supports floating-point dtypes")
    if p < 0:
        raise RuntimeError("pdist only supports non-negative p values")
    n = input.shape[0]
    i, j = np.triu_indices(n, 1)
    if i.size == 0:
        return input.new_zeros(0) + input.sum() * 0
    rows_i = input.index_select(0, tensor(i, dtype=D.int64, device=input.device))
    rows_j = input.index_select(0, tensor(j, dtype=D.int64, device=input.device))
    return (rows_i - rows_j).norm(p, 1)


def _check_cdist(x1, x2, p: float, compute_mode: str) -> int:
    if compute_mode not in _CDIST_MODES:
        raise ValueError(f"{compute_mode} is not a valid value for compute_mode")
    for name, x in (("X1", x1), ("X2", x2)):
        if x.dim() < 2:
            raise RuntimeError(f"cdist only supports at least 2D tensors, {name} got: "
                               f"{x.dim()}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: "
                           f"{x1.shape[-1]} X2: {x2.shape[-1]}")
    for name, x in (("X1", x1), ("X2", x2)):
        if x.dtype.category != 2:
            raise RuntimeError(f"cdist only supports floating-point dtypes, {name} got: "
                               f"{tname(x.dtype)}")
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")
    return _CDIST_MODES[compute_mode]


def _euclidean_dist(x1, x2):
    """Squared distances as one matmul (PyTorch's formula), clamped at 1e-30, square root."""
    n1 = x1.pow(2).sum(-1, keepdim=True)
    n2 = x2.pow(2).sum(-1, keepdim=True)
    a = cat([x1 * -2, n1, ones_like(n1)], -1)
    b = cat([x2, ones_like(n2), n2], -1)
    return a.matmul(b.mT).clamp_min(1e-30).sqrt()


def cdist(x1, x2, p: float = 2.0, compute_mode: str = "use_mm_for_euclid_dist_if_necessary"):
    """The p-norm distance between each row of ``x1`` (.., P, M) and of ``x2`` (.., R, M):
    a (.., P, R) tensor; batch dims broadcast. For p=2 a matmul formula is used when
    ``compute_mode`` asks for it (by default when P or R exceeds 25), as in PyTorch."""
    mode = _check_cdist(x1, x2, p, compute_mode)
    batch = broadcast_shapes(tuple(x1.shape[:-2]), tuple(x2.shape[:-2]))
    r1, r2, m = x1.shape[-2], x2.shape[-2], x1.shape[-1]
    x1 = x1.expand(tuple(batch) + (r1, m))
    x2 = x2.expand(tuple(batch) + (r2, m))
    dtype = promote_types(x1.dtype, x2.dtype)
    if r1 == 0 or r2 == 0 or m == 0 or int(np.prod(batch)) == 0:
        zero = (x1.sum() + x2.sum()) * 0
        return x1.new_zeros(tuple(batch) + (r1, r2), dtype=dtype) + zero
    if p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25))):
        return _euclidean_dist(x1, x2)
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    return diff.norm(p, -1)
