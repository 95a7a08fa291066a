"""Whole slices along a dim at the positions of a 1-d index: ``index_select`` reads them,
``index_add``/``index_copy``/``index_fill`` write them, with PyTorch's checks and errors.

Kernels are ``np.take`` and fancy assignment or ``np.add.at``; each writing op has one
``_write_*`` function that the out-of-place kernel runs on a copy and ``x.index_add_()`` on
``x`` itself. On a global tensor, a dim other than ``dim`` may stay split (with the source
split alike).

>>> import tessera
>>> x = tessera.arange(6.).reshape(2, 3)
>>> tessera.index_select(x, 1, tessera.tensor([2, 0]))
tensor([[2., 0.],
        [5., 3.]])
>>> tessera.zeros(3).index_add(0, tessera.tensor([0, 2]), tessera.ones(2))
tensor([1., 0., 1.])
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import _tname
from tessera._tensor import Tensor
from tessera.ops import _jax, _relax, cost
from tessera.ops._elementwise import checked_scalar, checked_tensor_scalar
from tessera.ops._indexing import (
    INT_INDEX,
    array_of,
    as1,
    check_bounds,
    index_1d,
    nd,
    op_pair,
    require_tensors,
)
from tessera.ops._sbp import wrap
from tessera.ops._util import call, missing, numel, wrap_dim
from tessera.ops.creation import zeros, zeros_like
from tessera.ops.registry import Meta, defop
from tessera.sbp import SbpRule, Signature, broadcast as B, partial_sum as P, split as S

__all__ = ["index_select", "index_add", "index_copy", "index_fill"]


def _at_dim(d: int, idx) -> tuple:
    return (slice(None),) * d + (idx,)


# ---- index_select ----------------------------------------------------------------------

def _index_select_infer(x, index, dim):
    d = wrap_dim(dim, len(x.shape), "index_select")
    if index.dtype not in INT_INDEX:
        raise RuntimeError("index_select(): Expected dtype int32 or int64 for index")
    if len(index.shape) > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    n = numel(index.shape)
    if not x.shape:
        if n != 1:
            raise RuntimeError(f"index_select(): Index to scalar can have only 1 value, got {n} "
                               "value(s)")
        return Meta((), x.dtype)
    return Meta(x.shape[:d] + (n,) + x.shape[d + 1:], x.dtype)


def _index_select_kernel(x, index, dim):
    d = dim % nd(x.shape)
    x1, i = as1(x), index_1d(index)
    check_bounds(i, x1.shape[d], d, IndexError, "index out of range in self: ")
    out = np.take(x1, i, axis=d)
    return out.reshape(()) if x.ndim == 0 else out


def _index_select_grad(ctx, g):
    shape = ctx.input_metas[0].shape
    if not shape:
        return g, None
    z = zeros(shape, dtype=g.dtype, device=g.device)
    return index_add(z, ctx.attrs["dim"], ctx.inputs[1], g), None


def _index_select_sbp(x, index, dim):
    """x split on a dim it does not select from; or the (1-D) index split, giving the
    output split on ``dim``; linear in x."""
    n = len(x.shape)
    d0 = wrap(dim, max(n, 1))
    sigs = [Signature((S(d), B), (S(d),)) for d in range(n) if d != d0]
    if n and len(index.shape) == 1:
        sigs.append(Signature((B, S(0)), (S(d0),)))
    return sigs + [Signature((P, B), (P,)), Signature((B, B), (B,))]


_INDEX_SELECT = defop("index_select", _index_select_infer, _index_select_kernel,
                      grad=_index_select_grad, sbp=SbpRule(_index_select_sbp),
                      cost=cost.movement(),
                      to_relax=_relax.index_select,
                      to_jax=lambda jnp, lax, a, at: jnp.take(a[0], a[1], axis=at["dim"]))


def index_select(input, dim=None, index=None, *, out=None, axis=None) -> Tensor:
    """The slices of ``input`` along ``dim`` at the positions in the 1-d ``index``."""
    dim = dim if axis is None else axis
    if dim is None or index is None:
        missing("index_select", dim=dim, index=index)
    require_tensors("index_select", input=input, index=index)
    return call(_INDEX_SELECT, input, index, dim=dim, out=out)


# ---- index_add, index_copy, index_fill: writes of whole slices ---------------------------

def _writes_sbp(linear: bool):
    """Writes into x along ``dim``: x (and source) split on another dim, the index whole;
    ``linear``: jointly linear in (x, source) (add and copy)."""
    def rule(x, index, source, dim, **attrs):
        n = len(x.shape)
        d0 = wrap(dim, max(n, 1))
        if type(source) is not Meta or len(source.shape) == 0:  # index_fill's value
            v = None if type(source) is not Meta else B
            return [Signature((S(d), B, v), (S(d),)) for d in range(n) if d != d0] + \
                [Signature((B, B, v), (B,))]
        sigs = [Signature((S(d), B, S(d)), (S(d),)) for d in range(n) if d != d0
                and len(source.shape) == n and source.shape[d] == x.shape[d]]
        sigs.append(Signature((B, B, B), (B,)))
        if linear:
            sigs.append(Signature((P, B, P), (P,)))
        return sigs
    return SbpRule(rule)


def _index_add_cost(ins, outs, alpha=1, **attrs) -> cost.Cost:
    """A copy of x with each element of source added (and scaled by ``alpha`` first)."""
    n = cost.numel(ins[2]) * (1 if alpha == 1 else 2)
    return cost.Cost(n, *cost.io(ins, outs))



def _source_size(source, d: int) -> int:
    return source.shape[d] if d < len(source.shape) else 1


def _index_add_infer(x, index, source, dim, alpha=1):
    d = wrap_dim(dim, len(x.shape), "index_add")
    if index.dtype not in INT_INDEX:
        raise RuntimeError(f"index_add_(): Expected dtype int32/int64 for index but got: "
                           f"{_tname(index.dtype)}")
    if len(index.shape) > 1:
        raise IndexError(f"index_add_(): Index is supposed to be a vector, but got dim: "
                         f"{len(index.shape)} with type: {_tname(index.dtype)} and size: "
                         f"{list(index.shape)}")
    if source.dtype is not x.dtype:
        raise RuntimeError(f"index_add_(): self ({_tname(x.dtype)}) and source "
                           f"({_tname(source.dtype)}) must have the same scalar type")
    n, ns = numel(index.shape), _source_size(source, d)
    if n != ns:
        raise RuntimeError(f"index_add_(): Number of indices ({n}) should be equal to "
                           f"source.size(dim): ({ns}), for dim: {d}")
    same = len(source.shape) == len(x.shape) and all(
        a == b for k, (a, b) in enumerate(zip(x.shape, source.shape)) if k != d)
    if not same:
        raise RuntimeError(f"source tensor shape must match self tensor shape, excluding the "
                           f"specified dimension. Got self.shape = {list(x.shape)} "
                           f"source.shape = {list(source.shape)}")
    return Meta(x.shape, x.dtype)


def _write_index_add(t, index, source, dim, alpha=1):
    d = dim % nd(t.shape)
    t1, i = as1(t), index_1d(index)
    check_bounds(i, t1.shape[d], d, IndexError, "index out of range in self: ")
    src = as1(source)
    if alpha != 1 and t.dtype != np.bool_:
        src = src * array_of(alpha, t.dtype)  # alpha takes the tensor's type first, as in PyTorch
    np.add.at(t1, _at_dim(d, i), src)


def _index_add_grad(ctx, g):
    need, dim = ctx.needs_input_grad, ctx.attrs["dim"]
    gs = None
    if need[2]:
        alpha = ctx.attrs.get("alpha", 1)
        gs = index_select(g, dim, ctx.inputs[1]).reshape(ctx.input_metas[2].shape)
        gs = gs if alpha == 1 else gs * alpha
    return (g if need[0] else None), None, gs


_index_add_kernel, _index_add_inplace = op_pair(_write_index_add)
_INDEX_ADD = defop("index_add", _index_add_infer, _index_add_kernel, grad=_index_add_grad,
                   inplace_kernels={"cpu": _index_add_inplace}, sbp=_writes_sbp(True),
                   cost=_index_add_cost, to_jax=_jax.index_add, to_relax=_relax.index_add)


def index_add(input, dim=None, index=None, source=None, *, alpha=1, out=None, axis=None) -> Tensor:
    """``input`` with ``alpha * source`` added to the slices at ``index`` along ``dim``."""
    dim = dim if axis is None else axis
    if dim is None or index is None or source is None:
        missing("index_add", dim=dim, index=index, source=source)
    require_tensors("index_add", input=input, index=index, source=source)
    return call(_INDEX_ADD, input, index, source, dim=dim, alpha=alpha, out=out)


def _index_copy_infer(x, index, source, dim):
    d = wrap_dim(dim, len(x.shape), "index_copy")
    if index.dtype is not D.int64:
        raise RuntimeError(f"index_copy_(): Expected a long tensor for index, but got "
                           f"{_tname(index.dtype)}")
    if len(index.shape) > 1:
        raise IndexError(f"index_copy_(): Index should have dimension 1 or 0 (got "
                         f"{len(index.shape)})")
    if source.dtype is not x.dtype:
        raise RuntimeError(f"index_copy_(): self and source expected to have the same dtype, "
                           f"but got (self) {_tname(x.dtype)} and (source) "
                           f"{_tname(source.dtype)}")
    if x.shape and source.shape:
        if len(source.shape) != len(x.shape):
            raise IndexError(f"index_copy_(): When source and destination are not scalars, "
                             f"their dimensionality must match. Source dimensionality "
                             f"({len(source.shape)}), destination dimensionality "
                             f"({len(x.shape)})")
        xs = x.shape[:d] + x.shape[d + 1:]
        ss = source.shape[:d] + source.shape[d + 1:]
        for k, (a, b) in enumerate(zip(xs, ss)):
            if a != b:
                raise RuntimeError(f"index_copy_(): Source/destination tensor must have same "
                                   f"slice shapes. Destination slice shape: {a} at dimension "
                                   f"{k} and source slice shape: {b} at dimension {k}.")
    n, ns = numel(index.shape), _source_size(source, d)
    if n != ns:
        raise IndexError(f"index_copy_(): Number of indices ({n}) should be equal to "
                         f"source.size(dim) ({ns})")
    return Meta(x.shape, x.dtype)


def _write_index_copy(t, index, source, dim):
    d = dim % nd(t.shape)
    t1, i = as1(t), index_1d(index)
    check_bounds(i, t1.shape[d], d, IndexError, "index_copy_(): ")
    t1[_at_dim(d, i)] = as1(source)


def _index_copy_grad(ctx, g):
    need, dim, index = ctx.needs_input_grad, ctx.attrs["dim"], ctx.inputs[1]
    gx = index_fill(g, dim, index, 0) if need[0] else None
    gs = None
    if need[2]:
        gs = index_select(g, dim, index).reshape(ctx.input_metas[2].shape)
    return gx, None, gs


_index_copy_kernel, _index_copy_inplace = op_pair(_write_index_copy)
_INDEX_COPY = defop("index_copy", _index_copy_infer, _index_copy_kernel, grad=_index_copy_grad,
                    inplace_kernels={"cpu": _index_copy_inplace}, sbp=_writes_sbp(True),
                    cost=cost.movement(), to_jax=_jax.index_copy, to_relax=_relax.index_copy)


def index_copy(input, dim=None, index=None, source=None, *, out=None, axis=None) -> Tensor:
    """``input`` with the slices at ``index`` along ``dim`` replaced by those of ``source``."""
    dim = dim if axis is None else axis
    if dim is None or index is None or source is None:
        missing("index_copy", dim=dim, index=index, source=source)
    require_tensors("index_copy", input=input, index=index, source=source)
    return call(_INDEX_COPY, input, index, source, dim=dim, out=out)


def _index_fill_infer(x, index, value, dim):
    wrap_dim(dim, len(x.shape), "index_fill")
    if index.dtype is not D.int64:
        raise IndexError("index_fill_(): Expected dtype int64 for index.")
    if len(index.shape) > 1:
        raise RuntimeError("Index has to be a vector/scalar")
    if type(value) is Meta and value.shape:
        raise RuntimeError(f"index_fill_ only supports a 0-dimensional value tensor, but got "
                           f"tensor with {len(value.shape)} dimension(s).")
    if type(value) is not Meta:
        if isinstance(value, complex) and not x.dtype.is_complex:
            raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type is "
                               "not supported")
        checked_scalar(value, x.dtype)
    return Meta(x.shape, x.dtype)


def _write_index_fill(t, index, value, dim):
    d = dim % nd(t.shape)
    t1, i = as1(t), index_1d(index)
    check_bounds(i, t1.shape[d], d, IndexError, allow_negative=True)
    if isinstance(value, np.ndarray):  # a 0-d tensor: PyTorch reads it as a Scalar
        if value.dtype.kind == "c" and t.dtype.kind != "c":
            raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type "
                               "is not supported")
        checked_tensor_scalar(value, t.dtype)
    t1[_at_dim(d, i)] = array_of(value, t.dtype)


def _index_fill_grad(ctx, g):
    need, dim, index = ctx.needs_input_grad, ctx.attrs["dim"], ctx.inputs[1]
    gx = index_fill(g, dim, index, 0) if need[0] else None
    gv = None
    if need[2]:  # each filled position once, however often the index repeats it
        filled = index_fill(zeros_like(g), dim, index, 1)
        gv = (g * filled).sum().to(ctx.input_metas[2].dtype)
    return gx, None, gv


_index_fill_kernel, _index_fill_inplace = op_pair(_write_index_fill)
_INDEX_FILL = defop("index_fill", _index_fill_infer, _index_fill_kernel, grad=_index_fill_grad,
                    inplace_kernels={"cpu": _index_fill_inplace}, sbp=_writes_sbp(False),
                    cost=cost.movement(), to_jax=_jax.index_fill, to_relax=_relax.index_fill)


def index_fill(input, dim=None, index=None, value=None, *, out=None, axis=None) -> Tensor:
    """``input`` with the slices at ``index`` along ``dim`` set to ``value`` (a number or a
    0-d tensor)."""
    dim = dim if axis is None else axis
    if dim is None or index is None or value is None:
        missing("index_fill", dim=dim, index=index, value=value)
    require_tensors("index_fill", input=input, index=index)
    if isinstance(value, np.generic):
        value = value.item()
    return call(_INDEX_FILL, input, index, value, dim=dim, out=out)


