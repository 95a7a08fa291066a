"""Gather and scatter along a dim: ``gather`` (and ``take_along_dim``), ``scatter``,
``scatter_add`` and ``scatter_reduce``, with PyTorch's checks and errors.

The index has the rank of the tensor; along ``dim`` it names a position, off ``dim`` it is
its own position (``out[i][j] = input[index[i][j]][j]`` for ``dim=0``). Kernels are
``np.take_along_axis`` and fancy assignment or ``ufunc.at``; each writing op has one
``_write_*`` function that the out-of-place kernel runs on a copy and ``x.scatter_()`` on
``x`` itself. On a global tensor, a dim the index does not address may stay split (with the
index and src split alike).

>>> import tessera
>>> x = tessera.tensor([[1., 2.], [3., 4.]])
>>> tessera.gather(x, 1, tessera.tensor([[1], [0]]))
tensor([[2.],
        [3.]])
>>> tessera.zeros(3).scatter_add(0, tessera.tensor([0, 0, 2]), tessera.ones(3))
tensor([2., 0., 1.])
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import _tname
from tessera._tensor import Tensor
from tessera.ops import _jax, _relax, cost
from tessera.ops._elementwise import checked_scalar
from tessera.ops._indexing import (
    INT_INDEX,
    array_of,
    as1,
    check_bounds,
    nd,
    op_pair,
    pad_to,
    require_tensors,
)
from tessera.ops._sbp import aligned, wrap
from tessera.ops._util import broadcast_shapes, call, missing, numel, wrap_dim
from tessera.ops.arithmetic import remainder
from tessera.ops.comparison import logical_and
from tessera.ops.creation import ones_like, zeros, zeros_like
from tessera.ops.registry import Meta, defop
from tessera.ops.ternary import masked_fill, where
from tessera.sbp import SbpRule, Signature, broadcast as B, partial_sum as P, split as S

__all__ = ["gather", "scatter", "scatter_add", "scatter_reduce", "take_along_dim"]


def _sz(shape, d: int) -> int:
    return shape[d] if shape else 1


def _along(idx: np.ndarray, d: int) -> tuple:
    """The fancy key that addresses ``a[..., idx, ...]`` elementwise along ``d`` (the key of
    ``np.take_along_axis``), usable with ``ufunc.at`` for accumulation."""
    key = list(np.ix_(*[np.arange(s) for s in idx.shape]))
    key[d] = idx
    return tuple(key)


def _crop(t: Tensor, shape) -> Tensor:
    """The leading ``shape`` corner of ``t`` (the part of ``src`` an index reaches)."""
    shape = tuple(shape)
    if tuple(t.shape) == shape:
        return t
    if not shape:
        return t[(0,) * t.dim()]
    if t.dim() == 0:
        return t.reshape(shape)
    return t[tuple(slice(0, s) for s in shape)]


# ---- gather --------------------------------------------------------------------------

def _gs_check(op: str, x, index, d: int, src=None) -> None:
    """PyTorch's gather/scatter index rules; like PyTorch, an empty index skips them."""
    if numel(index.shape) == 0:
        return
    if index.dtype not in INT_INDEX:
        raise RuntimeError(f"{op}(): Expected dtype int32/int64 for index")
    n = nd(x.shape)
    if nd(index.shape) != n:
        what = "input" if op == "gather" else "self"
        raise RuntimeError(f"Index tensor must have the same number of dimensions as {what} "
                           "tensor")
    if src is not None and nd(src.shape) != n:
        raise RuntimeError("Index tensor must have the same number of dimensions as src tensor")
    bad = [k for k in range(n) if k != d and _sz(index.shape, k) > _sz(x.shape, k)]
    ishape, xshape = list(index.shape), list(x.shape)
    if op == "gather":
        if bad:
            raise RuntimeError(f"Size does not match at dimension {bad[0]} expected index "
                               f"{ishape} to be no larger than self {xshape} apart from "
                               f"dimension {d}")
        return
    if src is not None:
        if bad or any(_sz(index.shape, k) > _sz(src.shape, k) for k in range(n)):
            raise RuntimeError(f"Expected index {ishape} to be no larger than self {xshape} "
                               f"apart from dimension {d} and to be no larger size than src "
                               f"{list(src.shape)}")
    elif bad:
        raise RuntimeError(f"Expected index {ishape} to be no larger than self {xshape} apart "
                           f"from dimension {d}")


def _gather_infer(x, index, dim):
    d = wrap_dim(dim, len(x.shape), "gather")
    _gs_check("gather", x, index, d)
    return Meta(index.shape, x.dtype)


def _gather_kernel(x, index, dim):
    if index.size == 0:
        return np.empty(index.shape, x.dtype)
    d = dim % nd(x.shape)
    x1, i1 = as1(x), as1(index).astype(np.intp, copy=False)
    check_bounds(i1, x1.shape[d], d)
    box = tuple(slice(None) if k == d else slice(0, s) for k, s in enumerate(i1.shape))
    return np.take_along_axis(x1[box], i1, axis=d).reshape(index.shape)


def _gather_grad(ctx, g):
    index = ctx.inputs[1]
    z = zeros(ctx.input_metas[0].shape, dtype=g.dtype, device=g.device)
    return scatter_add(z, ctx.attrs["dim"], index, g), None


def _gather_sbp(x, index, dim):
    """x and index split alike on a dim gather does not address; or the index split on
    ``dim`` with x whole (each rank gathers its rows of the output; on another dim the
    index's tile would read x's first columns, not its own); linear in x."""
    sigs = [Signature((S(d), S(d)), (S(d),)) for d in aligned(dim, x, index)]
    if index.shape:
        d = wrap(dim, len(index.shape))
        sigs.append(Signature((B, S(d)), (S(d),)))
    return sigs + [Signature((P, B), (P,)), Signature((B, B), (B,))]


_GATHER = defop("gather", _gather_infer, _gather_kernel, grad=_gather_grad,
                sbp=SbpRule(_gather_sbp), cost=cost.movement(),
                to_relax=_relax.gather,
                to_jax=lambda jnp, lax, a, at: jnp.take_along_axis(a[0], a[1], axis=at["dim"]))


def gather(input, dim=None, index=None, *, sparse_grad: bool = False, out=None,
           axis=None) -> Tensor:
    """``out[i][j] = input[index[i][j]][j]`` for ``dim=0`` (and so on for other dims)."""
    dim = dim if axis is None else axis
    if dim is None or index is None:
        missing("gather", dim=dim, index=index)
    require_tensors("gather", input=input, index=index)
    return call(_GATHER, input, index, dim=dim, out=out)


# ---- scatter, scatter_add, scatter_reduce ---------------------------------------------

def _scatter_sbp(x, index, src, dim, reduce=None, include_self=True, **attrs):
    """Writes into x along ``dim``: x, index and src split alike on a dim they share whole.
    Jointly linear in (x, src) where an element is x's or a sum of src's, so partial x and
    src give partial."""
    if type(src) is not Meta:  # a Python number written where the index says
        sigs = [Signature((S(d), S(d), None), (S(d),)) for d in aligned(dim, x, index)]
        return sigs + [Signature((B, B, None), (B,))]
    sigs = [Signature((S(d),) * 3, (S(d),)) for d in aligned(dim, x, index, src)]
    sigs.append(Signature((B, B, B), (B,)))
    if reduce in (None, "add", "sum", "mean"):
        sigs.append(Signature((P, B, P), (P,)))
    return sigs


def _scatter_cost(ins, outs, reduce=None, **attrs) -> cost.Cost:
    """A copy of x with an element of src written, or combined (one operation), per index;
    ``mean`` then divides each element by its count."""
    n = cost.numel(ins[1]) if reduce is not None else 0
    if reduce == "mean":
        n += cost.numel(outs[0])
    return cost.Cost(n, *cost.io(ins, outs))


_SCATTER_SBP = SbpRule(_scatter_sbp)

def _src_dtype_check(x, src) -> None:
    if type(src) is Meta and src.dtype is not x.dtype:
        raise RuntimeError("scatter(): Expected self.dtype to be equal to src.dtype")


def _scatter_prep(t, index, src, dim):
    """(target view, along-dim key, values) to write ``src`` into ``t`` at ``index``."""
    d = dim % nd(t.shape)
    t1, i1 = as1(t), as1(index).astype(np.intp, copy=False)
    check_bounds(i1, t1.shape[d], d)
    view = t1[tuple(slice(None) if k == d else slice(0, s) for k, s in enumerate(i1.shape))]
    if isinstance(src, np.ndarray):
        vals = as1(src)[tuple(slice(0, s) for s in i1.shape)]
    else:
        vals = array_of(src, t.dtype)
    return view, _along(i1, d), vals


def _scatter_infer(x, index, src, dim, reduce=None):
    d = wrap_dim(dim, len(x.shape), "scatter")
    if reduce not in (None, "add", "multiply"):
        raise RuntimeError("reduce argument must be either add or multiply.")
    _src_dtype_check(x, src)
    _gs_check("scatter", x, index, d, src if type(src) is Meta else None)
    if type(src) is not Meta:  # ``value``, a Scalar: NaN or out of range raises
        checked_scalar(src, x.dtype)
    return Meta(x.shape, x.dtype)


def _write_scatter(t, index, src, dim, reduce=None):
    if index.size == 0:
        return
    view, key, vals = _scatter_prep(t, index, src, dim)
    if reduce is None:
        view[key] = vals
    elif reduce == "add":
        np.add.at(view, key, vals)
    else:
        np.multiply.at(view, key, vals)


def _scatter_grad(ctx, g):
    if ctx.attrs.get("reduce") is not None:
        raise RuntimeError("the derivative for 'scatter' with reduce= is not implemented (as "
                           "in PyTorch); use scatter_reduce")
    _, index, src = ctx.inputs
    dim, need = ctx.attrs["dim"], ctx.needs_input_grad
    gx = scatter(g, dim, index, 0) if need[0] else None
    gs = pad_to(gather(g, dim, index), ctx.input_metas[2].shape) if need[2] else None
    return gx, None, gs


_scatter_kernel, _scatter_inplace = op_pair(_write_scatter)
_SCATTER = defop("scatter", _scatter_infer, _scatter_kernel, grad=_scatter_grad,
                 inplace_kernels={"cpu": _scatter_inplace}, sbp=_SCATTER_SBP,
                 cost=_scatter_cost, to_jax=_jax.scatter, to_relax=_relax.scatter)


def scatter(input, dim=None, index=None, src=None, value=None, *, reduce=None, out=None,
            axis=None) -> Tensor:
    """Write ``src`` (a tensor) or ``value`` (a number) into ``input`` at ``index`` along
    ``dim``; ``reduce='add'|'multiply'`` combines instead of overwriting (no gradient)."""
    dim = dim if axis is None else axis
    if dim is None or index is None:
        missing("scatter", dim=dim, index=index)
    require_tensors("scatter", input=input, index=index)
    s = src if src is not None else value
    if s is None:
        raise TypeError("scatter() missing 1 required argument: 'src' or 'value'")
    if isinstance(value, Tensor) and src is None:
        s = value.item()  # ``value`` is a Number in PyTorch's signature
    elif isinstance(s, np.generic):
        s = s.item()
    return call(_SCATTER, input, index, s, dim=dim, reduce=reduce, out=out)


def _scatter_add_infer(x, index, src, dim):
    d = wrap_dim(dim, len(x.shape), "scatter_add")
    _src_dtype_check(x, src)
    _gs_check("scatter_add", x, index, d, src)
    return Meta(x.shape, x.dtype)


def _write_scatter_add(t, index, src, dim):
    if index.size:
        view, key, vals = _scatter_prep(t, index, src, dim)
        np.add.at(view, key, vals)


def _scatter_add_grad(ctx, g):
    need = ctx.needs_input_grad
    gs = None
    if need[2]:
        gs = pad_to(gather(g, ctx.attrs["dim"], ctx.inputs[1]), ctx.input_metas[2].shape)
    return (g if need[0] else None), None, gs


_scatter_add_kernel, _scatter_add_inplace = op_pair(_write_scatter_add)
_SCATTER_ADD = defop("scatter_add", _scatter_add_infer, _scatter_add_kernel,
                     grad=_scatter_add_grad, inplace_kernels={"cpu": _scatter_add_inplace},
                     sbp=_SCATTER_SBP,
                     cost=lambda ins, outs, **attrs: _scatter_cost(ins, outs, reduce="sum"),
                     to_jax=_jax.scatter_add, to_relax=_relax.scatter_add)


def scatter_add(input, dim=None, index=None, src=None, *, out=None, axis=None) -> Tensor:
    """``input`` with ``src`` added at ``index`` along ``dim`` (repeated indices add up)."""
    dim = dim if axis is None else axis
    if dim is None or index is None or src is None:
        missing("scatter_add", dim=dim, index=index, src=src)
    require_tensors("scatter_add", input=input, index=index)
    if not isinstance(src, Tensor):
        raise TypeError(f"scatter_add(): argument 'src' (position 4) must be Tensor, not "
                        f"{type(src).__name__}")
    return call(_SCATTER_ADD, input, index, src, dim=dim, out=out)


_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def _scatter_reduce_infer(x, index, src, dim, reduce, include_self=True):
    d = wrap_dim(dim, len(x.shape), "scatter_reduce")
    if reduce not in _REDUCTIONS:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got "
                           f"{reduce}")
    _src_dtype_check(x, src)
    _gs_check("scatter_reduce", x, index, d, src)
    return Meta(x.shape, x.dtype)


def _identity(reduce: str, dt: np.dtype):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    big = reduce == "amin"
    if dt.kind == "f" or dt.kind == "V":
        return np.inf if big else -np.inf
    if dt.kind == "b":
        return big
    return np.iinfo(dt).max if big else np.iinfo(dt).min


_UFUNC = {"sum": np.add, "mean": np.add, "prod": np.multiply, "amax": np.maximum,
          "amin": np.minimum}


def _write_scatter_reduce(t, index, src, dim, reduce, include_self=True):
    if index.size == 0:
        return
    view, key, vals = _scatter_prep(t, index, src, dim)
    if not include_self:
        view[key] = _identity(reduce, t.dtype)
    _UFUNC[reduce].at(view, key, vals)
    if reduce == "mean":
        count = np.full(view.shape, int(include_self), np.int64)
        np.add.at(count, key, 1)
        count[count == 0] = 1
        if t.dtype.kind in "fcV":
            view[...] = view / count
        else:  # integer mean rounds toward minus infinity, as in PyTorch
            view[...] = np.floor_divide(view, count)


def _scatter_reduce_grad(ctx, g):
    x, index, src = ctx.inputs
    dim, reduce = ctx.attrs["dim"], ctx.attrs["reduce"]
    incl = ctx.attrs.get("include_self", True)
    s = _crop(src, index.shape)
    if reduce == "sum":
        gx, gs = g, gather(g, dim, index)
    elif reduce == "mean":
        n = scatter_add(ones_like(g) if incl else zeros_like(g), dim, index, ones_like(s))
        n = masked_fill(n, n == 0, 1)
        gx, gs = g / n, gather(g, dim, index) / gather(n, dim, index)
    elif reduce == "prod":
        gx, gs = _prod_grads(ctx, g, x, index, src, s, dim, incl)
    else:  # amax / amin: ties share the gradient evenly, as in PyTorch
        result = ctx.outputs[0]
        x_is = (x == result).to(g.dtype)
        s_is = (s == gather(result, dim, index)).to(g.dtype)
        gd = g / scatter_add(x_is, dim, index, s_is)
        gx, gs = x_is * gd, s_is * gather(gd, dim, index)
    if not incl:
        gx = scatter(gx, dim, index, 0)
    return gx, None, pad_to(gs, src.shape)


def _prod_grads(ctx, g, x, index, src, s, dim, incl):
    # products with the zeros left out, so a single zero still passes a gradient on
    result = ctx.outputs[0]
    masked_x = masked_fill(x, x == 0, 1)
    gx = g * scatter_reduce(masked_x, dim, index, src, "prod", include_self=incl) / masked_x
    s_zero = s == 0
    n_zero = gather(scatter_add(zeros_like(g), dim, index, s_zero.to(g.dtype)), dim, index)
    single = logical_and(s_zero, n_zero == 1)
    without = scatter_reduce(x, dim, index, masked_fill(s, single, 1), "prod",
                             include_self=incl)
    gs = where(single, gather(g * without, dim, index),
               gather(g * result, dim, index) / masked_fill(s, s_zero, 1))
    return gx, gs


_scatter_reduce_kernel, _scatter_reduce_inplace = op_pair(_write_scatter_reduce)
_SCATTER_REDUCE = defop("scatter_reduce", _scatter_reduce_infer, _scatter_reduce_kernel,
                        grad=_scatter_reduce_grad, save=("inputs", "outputs"),
                        inplace_kernels={"cpu": _scatter_reduce_inplace}, sbp=_SCATTER_SBP,
                        cost=_scatter_cost, to_jax=_jax.scatter_reduce,
                        to_relax=_relax.scatter_reduce)


def scatter_reduce(input, dim=None, index=None, src=None, reduce=None, *,
                   include_self: bool = True, out=None, axis=None) -> Tensor:
    """Reduce ``src`` into ``input`` at ``index`` along ``dim`` with ``reduce`` in
    ``'sum' | 'prod' | 'mean' | 'amax' | 'amin'``; ``include_self=False`` leaves the old
    values of the written positions out of the reduction."""
    dim = dim if axis is None else axis
    if dim is None or index is None or src is None or reduce is None:
        missing("scatter_reduce", dim=dim, index=index, src=src, reduce=reduce)
    require_tensors("scatter_reduce", input=input, index=index, src=src)
    return call(_SCATTER_REDUCE, input, index, src, dim=dim, reduce=reduce,
                include_self=include_self, out=out)


def take_along_dim(input, indices, dim=None, *, out=None, axis=None) -> Tensor:
    """``gather`` with ``input`` and ``indices`` broadcast against each other off ``dim``;
    with ``dim=None`` both are read as 1-d. Along a dim, PyTorch wraps indices modulo the
    size (so ``-1`` is the last element); this follows it."""
    dim = dim if axis is None else axis
    require_tensors("take_along_dim", input=input, indices=indices)
    if indices.dtype is not D.int64:
        raise RuntimeError(f"torch.take_along_dim(): dtype of indices should be Long but got "
                           f"{_tname(indices.dtype)}")
    if dim is None:
        return gather(input.reshape(-1), 0, indices.reshape(-1), out=out)
    if input.dim() != indices.dim():
        raise RuntimeError(f"torch.take_along_dim(): input and indices should have the same "
                           f"number of dimensions, but got {input.dim()} dimensions for input, "
                           f"and {indices.dim()} dimensions for indices")
    if input.dim() == 0:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    d = wrap_dim(dim, input.dim(), "take_along_dim")
    if input.dim():
        xs, ix = tuple(input.shape), tuple(indices.shape)
        b = broadcast_shapes("take_along_dim", xs[:d] + (1,) + xs[d + 1:],
                             ix[:d] + (1,) + ix[d + 1:])
        input = input.expand(b[:d] + (xs[d],) + b[d + 1:])
        indices = indices.expand(b[:d] + (ix[d],) + b[d + 1:])
    size = input.shape[d] if input.dim() else 1
    if size:
        indices = remainder(indices, size)
    return gather(input, d, indices, out=out)
