"""Elements addressed in the tensor's flat (row-major) order: ``take``/``put`` at flat
indices, ``masked_select``/``masked_scatter`` where a bool mask is True, and ``one_hot``
(each class index made a row), with PyTorch's checks and errors.

Negative flat indices count from the end. ``put`` and ``masked_scatter`` have one
``_write_*`` function that the out-of-place kernel runs on a copy and ``x.put_()`` on ``x``
itself; every index is checked before anything is written.

>>> import tessera
>>> x = tessera.tensor([[1., 2.], [3., 4.]])
>>> tessera.take(x, tessera.tensor([0, -1]))
tensor([1., 4.])
>>> tessera.masked_select(x, x > 2)
tensor([3., 4.])
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import _tname
from tessera._tensor import Tensor
from tessera.ops import _jax, _relax, cost
from tessera.ops._indexing import (
    as1,
    first_bad,
    index_1d,
    op_pair,
    pad_to,
    require_tensors,
)
from tessera.ops._util import broadcast_shapes, call, ensure_tensor, numel, sum_to
from tessera.ops.creation import zeros, zeros_like
from tessera.ops.registry import Meta, defop
from tessera.ops.ternary import masked_fill
from tessera.sbp import SbpRule, Signature, broadcast as B, partial_sum as P, split as S

__all__ = ["take", "put", "masked_select", "masked_scatter", "one_hot"]


# ---- take, put -----------------------------------------------------------------------

def _flat_check(op: str, idx: np.ndarray, n: int) -> None:
    if idx.size and n == 0:
        raise IndexError(f"{op}(): tried to take from an empty tensor")
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        raise IndexError(f"out of range: tried to access index {first_bad(idx, bad)} on a "
                         f"tensor of {n} elements.")


def _take_infer(x, index):
    if index.dtype is not D.int64:
        raise RuntimeError(f"take(): Expected a long tensor for index, but got "
                           f"{_tname(index.dtype)}")
    return Meta(index.shape, x.dtype)


def _take_kernel(x, index):
    _flat_check("take", index, x.size)
    return x.reshape(-1)[index.astype(np.intp, copy=False)]


def _take_grad(ctx, g):
    z = zeros(ctx.input_metas[0].shape, dtype=g.dtype, device=g.device)
    return put(z, ctx.inputs[1], g, accumulate=True), None


def _take_sbp(x, index):
    """Flat indices: x whole, the index split anywhere (the output has its shape)."""
    return [Signature((B, S(d)), (S(d),)) for d in range(len(index.shape))] + \
        [Signature((P, B), (P,)), Signature((B, B), (B,))]


_TAKE = defop("take", _take_infer, _take_kernel, grad=_take_grad, sbp=SbpRule(_take_sbp),
              cost=cost.movement(), to_jax=_jax.take, to_relax=_relax.take)


def take(input, index, *, out=None) -> Tensor:
    """``input`` read as 1-d at ``index`` (negative indices count from the end)."""
    require_tensors("take", input=input, index=index)
    return call(_TAKE, input, index, out=out)


def _put_infer(x, index, source, accumulate=False):
    if index.dtype is not D.int64:
        raise RuntimeError(f"put_(): Expected a long tensor for index, but got "
                           f"{_tname(index.dtype)}")
    if source.dtype is not x.dtype:
        raise RuntimeError(f"put_(): self and source expected to have the same dtype, but got "
                           f"self.dtype = {_tname(x.dtype)} and source.dtype = "
                           f"{_tname(source.dtype)}")
    ns, ni = numel(source.shape), numel(index.shape)
    if ns != ni:
        raise IndexError(f"put_(): Expected source and index to have the same number of "
                         f"elements, but got source.numel() = {ns}, index.numel() = {ni}")
    return Meta(x.shape, x.dtype)


def _write_put(t, index, source, accumulate=False):
    t1 = as1(t)
    i = index_1d(index)
    _flat_check("put", i, t1.size)
    key = np.unravel_index(np.where(i < 0, i + t1.size, i), t1.shape)  # any strides work
    if accumulate:
        np.add.at(t1, key, source.reshape(-1))
    else:
        t1[key] = source.reshape(-1)


def _put_grad(ctx, g):
    _, index, source = ctx.inputs
    need = ctx.needs_input_grad
    gx = gs = None
    if need[0]:
        gx = g if ctx.attrs.get("accumulate") else put(g, index, zeros_like(source))
    if need[2]:
        gs = take(g, index).reshape(source.shape)
    return gx, None, gs


def _put_sbp(x, index, source, accumulate=False):
    """Jointly linear in (x, source); accumulating, each rank may add its tile of (index,
    source) into its share of a partial x (``take``'s gradient)."""
    sigs = [Signature((B, B, B), (B,)), Signature((P, B, P), (P,))]
    if accumulate and tuple(index.shape) == tuple(source.shape):
        sigs += [Signature((P, S(d), S(d)), (P,)) for d in range(len(index.shape))]
    return sigs


def _put_cost(ins, outs, accumulate=False) -> cost.Cost:
    """A copy of x with source written; accumulating, an addition per element of source."""
    return cost.Cost(cost.numel(ins[2]) if accumulate else 0, *cost.io(ins, outs))


_put_kernel, _put_inplace = op_pair(_write_put)
_PUT = defop("put", _put_infer, _put_kernel, grad=_put_grad,
             inplace_kernels={"cpu": _put_inplace}, sbp=SbpRule(_put_sbp), cost=_put_cost)


def put(input, index, source, accumulate: bool = False, *, out=None) -> Tensor:
    """``input`` read as 1-d with ``source`` written (or added) at ``index``."""
    require_tensors("put", input=input, index=index, source=source)
    return call(_PUT, input, index, source, accumulate=accumulate, out=out)


# ---- masked_select, masked_scatter ---------------------------------------------------

def _masked_select_infer(x, mask):
    if mask.dtype is not D.bool_:
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    broadcast_shapes("masked_select", x.shape, mask.shape)
    return Meta((-1,), x.dtype)


def _masked_select_kernel(x, mask):
    xb, mb = np.broadcast_arrays(x, mask)
    return xb[mb]


def _masked_select_grad(ctx, g):
    xm, mm = ctx.input_metas
    mask = ctx.inputs[1]
    z = zeros(broadcast_shapes("masked_select", xm.shape, mm.shape), dtype=g.dtype,
              device=g.device)
    return sum_to(masked_scatter(z, mask, g), xm.shape), None


_MASKED_SELECT = defop("masked_select", _masked_select_infer, _masked_select_kernel,
                       grad=_masked_select_grad, dynamic_shape=True, cost=cost.movement())


def masked_select(input, mask, *, out=None) -> Tensor:
    """The elements of ``input`` where the (broadcast) bool ``mask`` is True, as 1-d."""
    require_tensors("masked_select", input=input, mask=mask)
    return call(_MASKED_SELECT, input, mask, out=out)


def _masked_scatter_infer(x, mask, source):
    if mask.dtype is not D.bool_:
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with "
                           f"dtype {_tname(mask.dtype)}")
    if source.dtype is not x.dtype:
        raise RuntimeError(f"masked_scatter: expected self and source to have same dtypes but "
                           f"got{_tname(x.dtype)} and {_tname(source.dtype)}")
    return Meta(broadcast_shapes("masked_scatter", x.shape, mask.shape), x.dtype)


def _write_masked_scatter(t, mask, source):
    m = np.broadcast_to(mask, t.shape)
    k = int(np.count_nonzero(m))
    if source.size < k:
        raise RuntimeError("Number of elements of source < number of ones in mask")
    t[m] = source.reshape(-1)[:k]


def _masked_scatter_kernel(x, mask, source):
    out = np.array(np.broadcast_to(x, np.broadcast_shapes(x.shape, mask.shape)))
    _write_masked_scatter(out, mask, source)
    return out


def _masked_scatter_grad(ctx, g):
    mask = ctx.inputs[1]
    xm, _, sm = ctx.input_metas
    need = ctx.needs_input_grad
    gx = sum_to(masked_fill(g, mask, 0), xm.shape) if need[0] else None
    gs = None
    if need[2]:
        gs = pad_to(masked_select(g, mask), (numel(sm.shape),)).reshape(sm.shape)
    return gx, None, gs


_MASKED_SCATTER = defop("masked_scatter", _masked_scatter_infer, _masked_scatter_kernel,
                        grad=_masked_scatter_grad, cost=cost.movement(),
                        inplace_kernels={"cpu": op_pair(_write_masked_scatter)[1]})


def masked_scatter(input, mask, source, *, out=None) -> Tensor:
    """``input`` with the positions where ``mask`` is True filled, in order, from the
    elements of ``source``."""
    require_tensors("masked_scatter", input=input, mask=mask, source=source)
    return call(_MASKED_SCATTER, input, mask, source, out=out)


# ---- one_hot -------------------------------------------------------------------------

def _one_hot_infer(x, num_classes=-1):
    if x.dtype is not D.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1 and numel(x.shape) == 0:
        raise RuntimeError("Can not infer total number of classes from empty tensor.")
    return Meta(x.shape + (num_classes if num_classes >= 0 else -1,), D.int64)


def _one_hot_kernel(x, num_classes=-1):
    if x.size and x.min() < 0:
        raise RuntimeError("Class values must be non-negative.")
    n = int(x.max()) + 1 if num_classes == -1 else num_classes
    if x.size and x.max() >= n:
        raise RuntimeError("Class values must be smaller than num_classes.")
    return (x[..., None] == np.arange(max(n, 0))).astype(np.int64)


_ONE_HOT = defop("one_hot", _one_hot_infer, _one_hot_kernel, grad=None, save=(),
                 dynamic_shape=True, cost=cost.elementwise(1),  # a comparison per element
                 to_jax=_jax.one_hot, to_relax=_relax.one_hot)


def one_hot(tensor, num_classes: int = -1) -> Tensor:
    """int64 one-hot rows (a new last dim) for the class indices in ``tensor``; with
    ``num_classes=-1`` the count is one more than the largest index."""
    ensure_tensor("one_hot", tensor, "tensor")
    return call(_ONE_HOT, tensor, num_classes=num_classes)
