"""Sorting and searching: sort/argsort/msort, topk, unique, unique_consecutive,
searchsorted and bucketize, with PyTorch's orderings and errors.

Every sort is stable (so ``stable=True`` matches PyTorch on ties, and ``stable=False`` is a
valid order too); NaN sorts as the largest value. ``sort`` and ``topk`` return a tuple with
``.values`` and ``.indices``, and their gradient goes back to the chosen elements. On a
global tensor they keep any dim split but the sorted one.

>>> import tessera
>>> tessera.sort(tessera.tensor([3., 1., 2.])).indices
tensor([1, 2, 0])
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import _tname
from tessera._tensor import Tensor
from tessera.ops import _jax, _relax, _sbp, cost
from tessera.ops._util import call, ensure_tensor, promote, wrap_dim
from tessera.ops.creation import copy, zeros
from tessera.ops.gather_scatter import scatter
from tessera.ops.registry import Meta, defop
from tessera.sbp import SbpRule, Signature, broadcast as B, split as S

__all__ = ["sort", "argsort", "msort", "topk", "unique", "unique_consecutive", "searchsorted",
           "bucketize"]


class SortResult(tuple):
    """``(values, indices)`` that also reads as ``.values`` / ``.indices``, like PyTorch's
    ``torch.return_types.sort`` and ``topk``."""

    __slots__ = ()

    def __new__(cls, values: Tensor, indices: Tensor):
        return super().__new__(cls, (values, indices))

    @property
    def values(self) -> Tensor:
        return self[0]

    @property
    def indices(self) -> Tensor:
        return self[1]

    def __repr__(self) -> str:
        return f"SortResult(\nvalues={self[0]!r},\nindices={self[1]!r})"


def _write_out(out, results) -> SortResult:
    """``sort(..., out=(values, indices))``: copy each result into its target."""
    for target, r in zip(out, results):
        copy(target, r, out=target)
    return SortResult(*out)


def _stable_order(x: np.ndarray, d: int, descending: bool) -> np.ndarray:
    """Stable argsort along ``d``; NaN counts as the largest value, as in PyTorch."""
    if not descending:
        return np.argsort(x, axis=d, kind="stable")
    # the ascending stable order of the reversed array, reversed, is the descending stable
    # order: equal values keep their original order and NaN comes first
    idx = np.argsort(np.flip(x, d), axis=d, kind="stable")
    return (x.shape[d] - 1) - np.flip(idx, d)


def _value_grad(ctx, g, gi=None):
    """The gradient of (values, indices) results: ``g`` scattered back to where each value
    came from."""
    if g is None:
        return (None,)
    indices = ctx.outputs[1]
    z = zeros(ctx.input_metas[0].shape, dtype=g.dtype, device=g.device)
    return (scatter(z, ctx.attrs["dim"], indices, g),)


# ---- sort ----------------------------------------------------------------------------

_ALONG_DIM = _sbp.pointwise(nout=2, skip=("dim",))


def _sort_sbp(x, dim=-1, descending=False):
    """``sort``/``topk``: split any dim but the sorted one (their defaults named here: a
    missing attr would otherwise ban nothing)."""
    return _ALONG_DIM(x, dim=dim)


def _topk_sbp(x, k, dim=-1, largest=True):
    return _ALONG_DIM(x, dim=dim)


def _sort_infer(x, dim=-1, descending=False):
    wrap_dim(dim, len(x.shape), "sort")
    if x.dtype.is_complex:  # complex numbers have no order
        raise RuntimeError("sort: Sort does not support complex dtypes on CPU")
    return Meta(x.shape, x.dtype), Meta(x.shape, D.int64)


def _sort_kernel(x, dim=-1, descending=False):
    if x.ndim == 0:
        return x.copy(), np.zeros((), np.int64)
    idx = _stable_order(x, dim % x.ndim, descending)
    return np.take_along_axis(x, idx, dim % x.ndim), idx


_SORT = defop("sort", _sort_infer, _sort_kernel, grad=_value_grad, save=("outputs",),
              nondiff_outputs=(1,), sbp=SbpRule(_sort_sbp), cost=cost.sorting(),
              to_jax=_jax.sort, to_relax=_relax.sort)


def sort(input, dim: int = -1, descending: bool = False, *, stable: bool = False, out=None,
         axis=None) -> SortResult:
    """``(values, indices)`` of ``input`` sorted along ``dim``. Always stable here."""
    dim = dim if axis is None else axis
    ensure_tensor("sort", input)
    res = call(_SORT, input, dim=dim, descending=bool(descending))
    return _write_out(out, res) if out is not None else SortResult(*res)


def argsort(input, dim: int = -1, descending: bool = False, *, stable: bool = False, out=None,
            axis=None) -> Tensor:
    """The indices that sort ``input`` along ``dim``."""
    dim = dim if axis is None else axis
    indices = sort(input, dim, descending, stable=stable)[1]
    return indices if out is None else copy(out, indices, out=out)


def msort(input, *, out=None) -> Tensor:
    """``input`` sorted along its first dim."""
    values = sort(input, 0)[0]
    if out is not None:
        return copy(out, values, out=out)
    return values


# ---- topk ----------------------------------------------------------------------------

def _topk_infer(x, k, dim=-1, largest=True):
    d = wrap_dim(dim, len(x.shape), "topk")
    if x.dtype is D.bool_ or x.dtype.is_complex:
        what = "bool" if x.dtype is D.bool_ else "complex"
        raise RuntimeError(f"topk does not support {what} dtypes on CPU")
    n = x.shape[d] if x.shape else 1
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"topk(): argument 'k' must be int, not {type(k).__name__}")
    if k < 0 or k > n:
        raise RuntimeError("selected index k out of range")
    shape = x.shape[:d] + (k,) + x.shape[d + 1:] if x.shape else ()
    return Meta(shape, x.dtype), Meta(shape, D.int64)


def _topk_kernel(x, k, dim=-1, largest=True):
    if x.ndim == 0:
        return x.copy(), np.zeros((), np.int64)
    d = dim % x.ndim
    idx = np.take(_stable_order(x, d, largest), np.arange(k), axis=d)
    return np.take_along_axis(x, idx, d), idx


_TOPK = defop("topk", _topk_infer, _topk_kernel, grad=_value_grad, save=("outputs",),
              nondiff_outputs=(1,), sbp=SbpRule(_topk_sbp), cost=cost.sorting(),
              to_jax=_jax.topk, to_relax=_relax.topk)


def topk(input, k: int, dim: int = -1, largest: bool = True, sorted: bool = True, *, out=None,
         axis=None) -> SortResult:
    """The ``k`` largest (or smallest) elements along ``dim`` and their indices; the result
    is always in sorted order, which ``sorted=False`` allows."""
    dim = dim if axis is None else axis
    ensure_tensor("topk", input)
    if isinstance(k, Tensor):
        k = int(k)
    res = call(_TOPK, input, k=k, dim=dim, largest=bool(largest))
    return _write_out(out, res) if out is not None else SortResult(*res)


# ---- unique, unique_consecutive ------------------------------------------------------

def _unique_infer(name):
    def infer(x, dim=None):
        if dim is None:
            return Meta((-1,), x.dtype), Meta(x.shape, D.int64), Meta((-1,), D.int64)
        if not x.shape:
            raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
        d = wrap_dim(dim, len(x.shape), name)
        if any(s == 0 for k, s in enumerate(x.shape) if k != d):
            raise RuntimeError(f"There are 0 sized dimensions, and they aren't selected, so "
                               f"{name} cannot be applied")
        shape = x.shape[:d] + (-1,) + x.shape[d + 1:]
        return Meta(shape, x.dtype), Meta((x.shape[d],), D.int64), Meta((-1,), D.int64)
    return infer


def _empty_unique(x, d):
    return x.copy(), np.zeros(x.shape[d] if d is not None else x.shape, np.int64), \
        np.zeros(0, np.int64)


def _unique_kernel(x, dim=None):
    if dim is None:
        if x.size == 0:
            return x.reshape(-1).copy(), np.zeros(x.shape, np.int64), np.zeros(0, np.int64)
        # equal_nan=False: each NaN is its own value, as in PyTorch
        vals, inv, counts = np.unique(x.reshape(-1), return_inverse=True, return_counts=True,
                                      equal_nan=False)
        return vals, inv.reshape(x.shape), counts
    d = dim % x.ndim
    if x.shape[d] == 0:
        return _empty_unique(x, d)
    rows = np.moveaxis(x, d, 0).reshape(x.shape[d], -1)
    _, first, inv, counts = np.unique(rows, axis=0, return_index=True, return_inverse=True,
                                      return_counts=True)
    return np.take(x, first, axis=d), inv.reshape(-1), counts


def _unique_consecutive_kernel(x, dim=None):
    if dim is None:
        flat = x.reshape(-1)
        if flat.size == 0:
            return flat.copy(), np.zeros(x.shape, np.int64), np.zeros(0, np.int64)
        new = np.concatenate([[True], flat[1:] != flat[:-1]])
        vals, inv_shape = flat[new], x.shape
    else:
        d = dim % x.ndim
        if x.shape[d] == 0:
            return _empty_unique(x, d)
        rows = np.moveaxis(x, d, 0).reshape(x.shape[d], -1)
        new = np.concatenate([[True], (rows[1:] != rows[:-1]).any(axis=1)])
        vals, inv_shape = np.compress(new, x, axis=d), (x.shape[d],)
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, new.size))
    return vals, (np.cumsum(new) - 1).reshape(inv_shape), counts


_UNIQUE = defop("unique", _unique_infer("unique"), _unique_kernel, grad=None, save=(),
                dynamic_shape=True, cost=cost.sorting(None))
# one comparison of each element (or slice) with the one before
_UNIQUE_CONSECUTIVE = defop("unique_consecutive", _unique_infer("unique_consecutive"),
                            _unique_consecutive_kernel, grad=None, save=(), dynamic_shape=True,
                            cost=cost.reduction(1))


def _pick(res, return_inverse: bool, return_counts: bool):
    vals, inv, counts = res
    if return_inverse and return_counts:
        return vals, inv, counts
    if return_inverse:
        return vals, inv
    if return_counts:
        return vals, counts
    return vals


def unique(input, sorted: bool = True, return_inverse: bool = False,
           return_counts: bool = False, dim=None):
    """The distinct values (or slices along ``dim``) of ``input``, in ascending order, with
    the inverse mapping and the counts on request. PyTorch's CPU kernel sorts even with
    ``sorted=False``; so does this."""
    ensure_tensor("unique", input)
    return _pick(call(_UNIQUE, input, dim=dim), return_inverse, return_counts)


def unique_consecutive(input, return_inverse: bool = False, return_counts: bool = False,
                       dim=None):
    """``input`` with each run of equal consecutive values (or slices) collapsed to one."""
    ensure_tensor("unique_consecutive", input)
    return _pick(call(_UNIQUE_CONSECUTIVE, input, dim=dim), return_inverse, return_counts)


# ---- searchsorted, bucketize ---------------------------------------------------------

def _searchsorted_infer(seq, v, sorter, right=False, out_int32=False):
    nd = len(seq.shape)
    if nd == 0:
        raise RuntimeError("torch.searchsorted(): boundaries tensor should have positive "
                           "dimension, but got 0 dimension")
    vshape = v.shape if type(v) is Meta else ()
    if type(v) is not Meta and nd != 1:
        raise RuntimeError(f"torch.searchsorted(): input value can be a scalar only when "
                           f"boundaries tensor dimension is 1, but we got boundaries tensor "
                           f"dim({nd}) and input value's dim(0) numel(1)")
    if nd > 1 and (len(vshape) != nd or vshape[:-1] != seq.shape[:-1]):
        raise RuntimeError(f"torch.searchsorted(): boundaries tensor should be 1 dimension or "
                           f"the first N-1 dimensions of boundaries tensor and input value "
                           f"tensor must match, but we got boundaries tensor "
                           f"{list(seq.shape)} and input value tensor {list(vshape)}")
    if sorter is not None:
        if sorter.dtype is not D.int64:
            raise RuntimeError(f"torch.searchsorted(): sorter must be a tensor of long dtype "
                               f"but got dtype {_tname(sorter.dtype)}")
        if sorter.shape != seq.shape:
            raise RuntimeError(f"torch.searchsorted(): boundary and sorter must have the same "
                               f"size, but got boundary tensor {list(seq.shape)}and got sorter "
                               f"tensor {list(sorter.shape)}")
    if promote(seq, v) is D.bool_:
        raise NotImplementedError("\"searchsorted_out_cpu\" not implemented for 'Bool'")
    return Meta(vshape, D.int32 if out_int32 else D.int64)


def _bsearch(rows: np.ndarray, vals: np.ndarray, right: bool) -> np.ndarray:
    """Vectorised binary search of each row of ``vals`` in the same row of ``rows`` (or in
    the one row of ``rows``), with PyTorch's comparisons (NaN goes last)."""
    n = rows.shape[-1]
    lo = np.zeros(vals.shape, np.int64)
    hi = np.full(vals.shape, n, np.int64)
    for _ in range(n.bit_length() + 1):
        active = lo < hi
        if not active.any():
            break
        mid = (lo + hi) >> 1
        mv = np.take_along_axis(rows, np.minimum(mid, n - 1), axis=-1)
        go_right = ~(mv > vals) if right else ~(mv >= vals)
        lo = np.where(active & go_right, mid + 1, lo)
        hi = np.where(active & ~go_right, mid, hi)
    return lo


def _searchsorted_kernel(seq, v, sorter, right=False, out_int32=False):
    scalar = not isinstance(v, np.ndarray)
    ct = D.result_type((D.from_numpy_dtype(seq.dtype), seq.ndim),
                       v if scalar else (D.from_numpy_dtype(v.dtype), v.ndim)).np
    seq, v = seq.astype(ct, copy=False), np.asarray(v).astype(ct, copy=False)
    n = seq.shape[-1]
    if sorter is not None:
        if ((sorter < 0) | (sorter >= n)).any():
            raise RuntimeError("torch.searchsorted(): sorter index out of range")
        seq = np.take_along_axis(seq, sorter, axis=-1)
    if seq.ndim == 1:
        return _bsearch(seq[None], v.reshape(1, -1), right).reshape(v.shape)
    rows = seq.reshape(-1, n)
    return _bsearch(rows, v.reshape(rows.shape[0], -1), right).reshape(v.shape)


def _searchsorted_sbp(seq, v, sorter, right=False, out_int32=False):
    """1-D boundaries: the values split anywhere; N-D: a batch dim split alike in all."""
    if type(v) is not Meta:
        return [Signature((B, None, _sbp.optional(sorter)), (B,))]
    if len(seq.shape) == 1:
        sigs = [Signature((B, S(d), _sbp.optional(sorter)), (S(d),))
                for d in range(len(v.shape))]
    else:
        sigs = [Signature((S(d), S(d), _sbp.optional(sorter, S(d))), (S(d),))
                for d in range(len(seq.shape) - 1)]
    return sigs + [Signature((B, B, _sbp.optional(sorter)), (B,))]


def _searchsorted_cost(ins, outs, **attrs) -> cost.Cost:
    """A binary search per value: ceil(log2(n + 1)) comparisons in a row of n boundaries."""
    n = max(int(ins[0].shape[-1]), 0)
    return cost.Cost(cost.numel(outs[0]) * n.bit_length(), *cost.io(ins, outs))


_SEARCHSORTED = defop("searchsorted", _searchsorted_infer, _searchsorted_kernel, grad=None,
                      save=(), sbp=SbpRule(_searchsorted_sbp), cost=_searchsorted_cost,
                      to_jax=_jax.searchsorted, to_relax=_relax.searchsorted)


def searchsorted(sorted_sequence, input, *, out_int32: bool = False, right: bool = False,
                 side=None, sorter=None, out=None) -> Tensor:
    """Indices where the elements of ``input`` would go in the innermost dim of
    ``sorted_sequence`` to keep it sorted (the first such place, or the last with
    ``right=True`` / ``side='right'``)."""
    ensure_tensor("searchsorted", sorted_sequence, "sorted_sequence")
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but "
                               f"got {side}")
        if right and side == "left":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, "
                               "got side of left while right was True")
        right = side == "right"
    if isinstance(input, np.generic):
        input = input.item()
    return call(_SEARCHSORTED, sorted_sequence, input, sorter, right=bool(right),
                out_int32=bool(out_int32), out=out)


def bucketize(input, boundaries, *, out_int32: bool = False, right: bool = False,
              out=None) -> Tensor:
    """The bucket of each element of ``input`` given sorted 1-d ``boundaries``."""
    ensure_tensor("bucketize", boundaries, "boundaries")
    if boundaries.dim() != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got "
                           f"dim({boundaries.dim()})")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right, out=out)
