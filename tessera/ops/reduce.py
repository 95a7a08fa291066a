"""Reductions over ``dim`` (an int, a tuple, or None for all) with ``keepdim``.

>>> import tessera
>>> tessera.ones(2, 3).sum(dim=1)
tensor([3., 3.])
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.ops._util import call, ensure_tensor, numel, wrap_dims
from tessera.ops.registry import Meta, defop

__all__ = ["sum", "mean"]


def reduced_shape(shape, dims, keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def expand_back(g: Tensor, in_shape, dims, keepdim: bool) -> Tensor:
    """Broadcast a reduced gradient back over the reduced dims."""
    if not keepdim and dims:
        g = g.reshape(reduced_shape(in_shape, dims, True))
    return g.expand(tuple(in_shape))


def _np_axis(dims, ndim):
    return None if len(dims) == ndim else dims


def _sum_dtype(d: D.dtype, dtype) -> D.dtype:
    if dtype is not None:
        return D.as_dtype(dtype)
    return D.int64 if d.category <= 1 else d


def _sum_infer(x, dim=None, keepdim=False, dtype=None):
    if type(x) is not Meta:
        raise TypeError(f"sum(): argument 'input' must be Tensor, not {type(x).__name__}")
    dims = wrap_dims(dim, len(x.shape), "sum")
    return Meta(reduced_shape(x.shape, dims, keepdim), _sum_dtype(x.dtype, dtype))


def _sum_kernel(x, dim=None, keepdim=False, dtype=None):
    dims = wrap_dims(dim, x.ndim, "sum")
    out_dt = _sum_dtype(D.from_numpy_dtype(x.dtype), dtype).np
    if x.ndim == 0:
        return x.astype(out_dt)
    return np.sum(x, axis=dims, keepdims=keepdim, dtype=out_dt)


def _sum_grad(ctx, g):
    m = ctx.input_metas[0]
    dims = wrap_dims(ctx.attrs.get("dim"), len(m.shape), "sum")
    return (expand_back(g, m.shape, dims, ctx.attrs.get("keepdim", False)).to(m.dtype),)


_SUM = defop("sum", _sum_infer, _sum_kernel, grad=_sum_grad, save=())


def sum(input, dim=None, keepdim: bool = False, *, dtype=None, out=None) -> Tensor:
    """Sum over ``dim`` (all dims when None); integers sum to int64."""
    ensure_tensor("sum", input)
    if isinstance(dim, list):
        dim = tuple(dim)
    return call(_SUM, input, dim=dim, keepdim=keepdim, dtype=dtype, out=out)


def _mean_infer(x, dim=None, keepdim=False, dtype=None):
    dt = D.as_dtype(dtype) if dtype is not None else x.dtype
    if dt.category < 2:
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a "
                           f"floating point or complex dtype. Got: {_short(x.dtype)}")
    dims = wrap_dims(dim, len(x.shape), "mean")
    return Meta(reduced_shape(x.shape, dims, keepdim), dt)


def _short(d):
    return {"int64": "Long", "int32": "Int", "bool": "Bool", "uint8": "Byte",
            "int8": "Char", "int16": "Short"}.get(d.name, d.name)


def _mean_kernel(x, dim=None, keepdim=False, dtype=None):
    dims = wrap_dims(dim, x.ndim, "mean")
    if dtype is not None:
        x = x.astype(D.as_dtype(dtype).np)
    if x.ndim == 0:
        return x.copy()
    with np.errstate(all="ignore"):
        return np.mean(x, axis=dims, keepdims=keepdim)


def _mean_grad(ctx, g):
    m = ctx.input_metas[0]
    dims = wrap_dims(ctx.attrs.get("dim"), len(m.shape), "mean")
    n = numel([m.shape[d] for d in dims])
    return (expand_back(g / n, m.shape, dims, ctx.attrs.get("keepdim", False)).to(m.dtype),)


_MEAN = defop("mean", _mean_infer, _mean_kernel, grad=_mean_grad, save=())


def mean(input, dim=None, keepdim: bool = False, *, dtype=None, out=None) -> Tensor:
    """Arithmetic mean over ``dim``; needs a floating dtype."""
    ensure_tensor("mean", input)
    if isinstance(dim, list):
        dim = tuple(dim)
    return call(_MEAN, input, dim=dim, keepdim=keepdim, dtype=dtype, out=out)


del dispatch
