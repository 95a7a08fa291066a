"""Indexing ops: gather/scatter along a dim, ``index_*`` along a dim, take/put on the flat
tensor, masked_select/masked_scatter and one_hot, with PyTorch's checks and errors.

Kernels are vectorised NumPy (``take_along_axis``, fancy assignment, ``ufunc.at``). Every
index is checked before anything is written, so a bad index raises PyTorch's error and leaves
an in-place target untouched. Each writing op has one ``_write_*`` function that fills a
target array; the out-of-place kernel runs it on a copy, ``x.op_()`` runs it on ``x`` itself.

>>> import tessera
>>> x = tessera.tensor([[1., 2.], [3., 4.]])
>>> tessera.gather(x, 1, tessera.tensor([[1], [0]]))
tensor([[2.],
        [3.]])
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import _tname
from tessera._tensor import Tensor
from tessera.ops._util import broadcast_shapes, call, ensure_tensor, numel, sum_to, wrap_dim
from tessera.ops.arithmetic import remainder
from tessera.ops.comparison import logical_and
from tessera.ops.creation import ones_like, zeros, zeros_like
from tessera.ops.getitem import nonzero, setitem  # noqa: F401  (ternary.where imports it)
from tessera.ops.registry import Meta, defop
from tessera.ops.ternary import masked_fill, where

__all__ = ["gather", "scatter", "scatter_add", "scatter_reduce", "index_select", "index_add",
           "index_copy", "index_fill", "take", "take_along_dim", "masked_select",
           "masked_scatter", "put", "one_hot"]

_INT_INDEX = (D.int32, D.int64)


# ---- shared helpers ------------------------------------------------------------------

def _tensors(op: str, **args) -> None:
    """TypeError naming the argument unless every one of ``args`` is a Tensor."""
    for name, t in args.items():
        ensure_tensor(op, t, name)


def _nd(shape) -> int:
    """PyTorch's ``ensure_nonempty_dim``: a 0-d tensor counts as 1-d."""
    return max(len(shape), 1)


def _sz(shape, d: int) -> int:
    return shape[d] if shape else 1


def _as1(a: np.ndarray) -> np.ndarray:
    """A 0-d array as a 1-element 1-d view (PyTorch treats 0-d as 1-d in these ops)."""
    return a.reshape(1) if a.ndim == 0 else a


def _index_1d(index: np.ndarray) -> np.ndarray:
    return index.reshape(-1).astype(np.intp, copy=False)


def _first_bad(idx: np.ndarray, bad: np.ndarray) -> int:
    return int(idx[bad].reshape(-1)[0])


def _check_bounds(idx, n: int, d: int, exc=RuntimeError, prefix: str = "",
                  allow_negative: bool = False) -> None:
    lo = -n if allow_negative else 0
    bad = (idx < lo) | (idx >= n)
    if bad.any():
        raise exc(f"{prefix}index {_first_bad(idx, bad)} is out of bounds for dimension {d} "
                  f"with size {n}")


def _along(idx: np.ndarray, d: int) -> tuple:
    """The fancy key that addresses ``a[..., idx, ...]`` elementwise along ``d`` (the key of
    ``np.take_along_axis``), usable with ``ufunc.at`` for accumulation."""
    key = list(np.ix_(*[np.arange(s) for s in idx.shape]))
    key[d] = idx
    return tuple(key)


def _at_dim(d: int, idx) -> tuple:
    return (slice(None),) * d + (idx,)


def _value(v, dtype) -> np.ndarray:
    return np.asarray(v).astype(dtype)


def _op_pair(write):
    """(out-of-place kernel, in-place kernel) from one function that writes into a target."""
    def kernel(x, *rest, **attrs):
        out = np.array(x, copy=True)
        write(out, *rest, **attrs)
        return out

    def inplace(t, x, *rest, **attrs):
        if x is not t:
            np.copyto(t, x, casting="unsafe")
        write(t, *rest, **attrs)
    return kernel, inplace


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


def _pad_to(t: Tensor, shape) -> Tensor:
    """``t`` in the leading corner of zeros of ``shape`` (the grad of ``_crop``)."""
    shape = tuple(shape)
    if tuple(t.shape) == shape:
        return t
    if not shape:
        return t.reshape(())
    if t.dim() == 0:
        t = t.reshape((1,) * len(shape))
    z = zeros(shape, dtype=t.dtype, device=t.device)
    setitem(z, tuple(slice(0, s) for s in t.shape), t)
    return z


# ---- gather --------------------------------------------------------------------------

def _gs_check(op: str, x, index, d: int, src=None) -> None:
    """PyTorch's gather/scatter index rules; like PyTorch, an empty index skips them."""
    if numel(index.shape) == 0:
        return
    if index.dtype not in _INT_INDEX:
        raise RuntimeError(f"{op}(): Expected dtype int32/int64 for index")
    n = _nd(x.shape)
    if _nd(index.shape) != n:
        what = "input" if op == "gather" else "self"
        raise RuntimeError(f"Index tensor must have the same number of dimensions as {what} "
                           "tensor")
    if src is not None and _nd(src.shape) != n:
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
    d = dim % _nd(x.shape)
    x1, i1 = _as1(x), _as1(index).astype(np.intp, copy=False)
    _check_bounds(i1, x1.shape[d], d)
    box = tuple(slice(None) if k == d else slice(0, s) for k, s in enumerate(i1.shape))
    return np.take_along_axis(x1[box], i1, axis=d).reshape(index.shape)


def _gather_grad(ctx, g):
    index = ctx.inputs[1]
    z = zeros(ctx.input_metas[0].shape, dtype=g.dtype, device=g.device)
    return scatter_add(z, ctx.attrs["dim"], index, g), None


_GATHER = defop("gather", _gather_infer, _gather_kernel, grad=_gather_grad)


def gather(input, dim, index, *, sparse_grad: bool = False, out=None) -> Tensor:
    """``out[i][j] = input[index[i][j]][j]`` for ``dim=0`` (and so on for other dims)."""
    _tensors("gather", input=input, index=index)
    return call(_GATHER, input, index, dim=dim, out=out)


# ---- scatter, scatter_add, scatter_reduce ---------------------------------------------

def _src_dtype_check(x, src) -> None:
    if type(src) is Meta and src.dtype is not x.dtype:
        raise RuntimeError("scatter(): Expected self.dtype to be equal to src.dtype")


def _scatter_prep(t, index, src, dim):
    """(target view, along-dim key, values) to write ``src`` into ``t`` at ``index``."""
    d = dim % _nd(t.shape)
    t1, i1 = _as1(t), _as1(index).astype(np.intp, copy=False)
    _check_bounds(i1, t1.shape[d], d)
    view = t1[tuple(slice(None) if k == d else slice(0, s) for k, s in enumerate(i1.shape))]
    if isinstance(src, np.ndarray):
        vals = _as1(src)[tuple(slice(0, s) for s in i1.shape)]
    else:
        vals = _value(src, t.dtype)
    return view, _along(i1, d), vals


def _scatter_infer(x, index, src, dim, reduce=None):
    d = wrap_dim(dim, len(x.shape), "scatter")
    if reduce not in (None, "add", "multiply"):
        raise RuntimeError("reduce argument must be either add or multiply.")
    _src_dtype_check(x, src)
    _gs_check("scatter", x, index, d, src if type(src) is Meta else None)
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
    gs = _pad_to(gather(g, dim, index), ctx.input_metas[2].shape) if need[2] else None
    return gx, None, gs


_scatter_kernel, _scatter_inplace = _op_pair(_write_scatter)
_SCATTER = defop("scatter", _scatter_infer, _scatter_kernel, grad=_scatter_grad)
_SCATTER.inplace_kernels["cpu"] = _scatter_inplace


def scatter(input, dim, index, src=None, value=None, *, reduce=None, out=None) -> Tensor:
    """Write ``src`` (a tensor) or ``value`` (a number) into ``input`` at ``index`` along
    ``dim``; ``reduce='add'|'multiply'`` combines instead of overwriting (no gradient)."""
    _tensors("scatter", input=input, index=index)
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
        gs = _pad_to(gather(g, ctx.attrs["dim"], ctx.inputs[1]), ctx.input_metas[2].shape)
    return (g if need[0] else None), None, gs


_scatter_add_kernel, _scatter_add_inplace = _op_pair(_write_scatter_add)
_SCATTER_ADD = defop("scatter_add", _scatter_add_infer, _scatter_add_kernel,
                     grad=_scatter_add_grad)
_SCATTER_ADD.inplace_kernels["cpu"] = _scatter_add_inplace


def scatter_add(input, dim, index, src, *, out=None) -> Tensor:
    """``input`` with ``src`` added at ``index`` along ``dim`` (repeated indices add up)."""
    _tensors("scatter_add", input=input, index=index)
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
    return gx, None, _pad_to(gs, src.shape)


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


_scatter_reduce_kernel, _scatter_reduce_inplace = _op_pair(_write_scatter_reduce)
_SCATTER_REDUCE = defop("scatter_reduce", _scatter_reduce_infer, _scatter_reduce_kernel,
                        grad=_scatter_reduce_grad, save=("inputs", "outputs"))
_SCATTER_REDUCE.inplace_kernels["cpu"] = _scatter_reduce_inplace


def scatter_reduce(input, dim, index, src, reduce, *, include_self: bool = True,
                   out=None) -> Tensor:
    """Reduce ``src`` into ``input`` at ``index`` along ``dim`` with ``reduce`` in
    ``'sum' | 'prod' | 'mean' | 'amax' | 'amin'``; ``include_self=False`` leaves the old
    values of the written positions out of the reduction."""
    _tensors("scatter_reduce", input=input, index=index, src=src)
    return call(_SCATTER_REDUCE, input, index, src, dim=dim, reduce=reduce,
                include_self=include_self, out=out)


# ---- index_select, index_add, index_copy, index_fill ----------------------------------

def _index_select_infer(x, index, dim):
    d = wrap_dim(dim, len(x.shape), "index_select")
    if index.dtype not in _INT_INDEX:
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
    d = dim % _nd(x.shape)
    x1, i = _as1(x), _index_1d(index)
    _check_bounds(i, x1.shape[d], d, IndexError, "index out of range in self: ")
    out = np.take(x1, i, axis=d)
    return out.reshape(()) if x.ndim == 0 else out


def _index_select_grad(ctx, g):
    shape = ctx.input_metas[0].shape
    if not shape:
        return g, None
    z = zeros(shape, dtype=g.dtype, device=g.device)
    return index_add(z, ctx.attrs["dim"], ctx.inputs[1], g), None


_INDEX_SELECT = defop("index_select", _index_select_infer, _index_select_kernel,
                      grad=_index_select_grad)


def index_select(input, dim, index, *, out=None) -> Tensor:
    """The slices of ``input`` along ``dim`` at the positions in the 1-d ``index``."""
    _tensors("index_select", input=input, index=index)
    return call(_INDEX_SELECT, input, index, dim=dim, out=out)


def _source_size(source, d: int) -> int:
    return source.shape[d] if d < len(source.shape) else 1


def _index_add_infer(x, index, source, dim, alpha=1):
    d = wrap_dim(dim, len(x.shape), "index_add")
    if index.dtype not in _INT_INDEX:
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
    d = dim % _nd(t.shape)
    t1, i = _as1(t), _index_1d(index)
    _check_bounds(i, t1.shape[d], d, IndexError, "index out of range in self: ")
    src = _as1(source)
    if alpha != 1 and t.dtype != np.bool_:
        src = src * _value(alpha, t.dtype)  # alpha takes the tensor's type first, as in PyTorch
    np.add.at(t1, _at_dim(d, i), src)


def _index_add_grad(ctx, g):
    need, dim = ctx.needs_input_grad, ctx.attrs["dim"]
    gs = None
    if need[2]:
        alpha = ctx.attrs.get("alpha", 1)
        gs = index_select(g, dim, ctx.inputs[1]).reshape(ctx.input_metas[2].shape)
        gs = gs if alpha == 1 else gs * alpha
    return (g if need[0] else None), None, gs


_index_add_kernel, _index_add_inplace = _op_pair(_write_index_add)
_INDEX_ADD = defop("index_add", _index_add_infer, _index_add_kernel, grad=_index_add_grad)
_INDEX_ADD.inplace_kernels["cpu"] = _index_add_inplace


def index_add(input, dim, index, source, *, alpha=1, out=None) -> Tensor:
    """``input`` with ``alpha * source`` added to the slices at ``index`` along ``dim``."""
    _tensors("index_add", input=input, index=index, source=source)
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
    d = dim % _nd(t.shape)
    t1, i = _as1(t), _index_1d(index)
    _check_bounds(i, t1.shape[d], d, IndexError, "index_copy_(): ")
    t1[_at_dim(d, i)] = _as1(source)


def _index_copy_grad(ctx, g):
    need, dim, index = ctx.needs_input_grad, ctx.attrs["dim"], ctx.inputs[1]
    gx = index_fill(g, dim, index, 0) if need[0] else None
    gs = None
    if need[2]:
        gs = index_select(g, dim, index).reshape(ctx.input_metas[2].shape)
    return gx, None, gs


_index_copy_kernel, _index_copy_inplace = _op_pair(_write_index_copy)
_INDEX_COPY = defop("index_copy", _index_copy_infer, _index_copy_kernel, grad=_index_copy_grad)
_INDEX_COPY.inplace_kernels["cpu"] = _index_copy_inplace


def index_copy(input, dim, index, source, *, out=None) -> Tensor:
    """``input`` with the slices at ``index`` along ``dim`` replaced by those of ``source``."""
    _tensors("index_copy", input=input, index=index, source=source)
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
    return Meta(x.shape, x.dtype)


def _write_index_fill(t, index, value, dim):
    d = dim % _nd(t.shape)
    t1, i = _as1(t), _index_1d(index)
    _check_bounds(i, t1.shape[d], d, IndexError, allow_negative=True)
    t1[_at_dim(d, i)] = _value(value, t.dtype)


def _index_fill_grad(ctx, g):
    need, dim, index = ctx.needs_input_grad, ctx.attrs["dim"], ctx.inputs[1]
    gx = index_fill(g, dim, index, 0) if need[0] else None
    gv = None
    if need[2]:  # each filled position once, however often the index repeats it
        filled = index_fill(zeros_like(g), dim, index, 1)
        gv = (g * filled).sum().to(ctx.input_metas[2].dtype)
    return gx, None, gv


_index_fill_kernel, _index_fill_inplace = _op_pair(_write_index_fill)
_INDEX_FILL = defop("index_fill", _index_fill_infer, _index_fill_kernel, grad=_index_fill_grad)
_INDEX_FILL.inplace_kernels["cpu"] = _index_fill_inplace


def index_fill(input, dim, index, value, *, out=None) -> Tensor:
    """``input`` with the slices at ``index`` along ``dim`` set to ``value`` (a number or a
    0-d tensor)."""
    _tensors("index_fill", input=input, index=index)
    if isinstance(value, np.generic):
        value = value.item()
    return call(_INDEX_FILL, input, index, value, dim=dim, out=out)


# ---- take, put, take_along_dim -------------------------------------------------------

def _flat_check(op: str, idx: np.ndarray, n: int) -> None:
    if idx.size and n == 0:
        raise IndexError(f"{op}(): tried to take from an empty tensor")
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        raise IndexError(f"out of range: tried to access index {_first_bad(idx, bad)} on a "
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


_TAKE = defop("take", _take_infer, _take_kernel, grad=_take_grad)


def take(input, index, *, out=None) -> Tensor:
    """``input`` read as 1-d at ``index`` (negative indices count from the end)."""
    _tensors("take", input=input, index=index)
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
    t1 = _as1(t)
    i = _index_1d(index)
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


_put_kernel, _put_inplace = _op_pair(_write_put)
_PUT = defop("put", _put_infer, _put_kernel, grad=_put_grad)
_PUT.inplace_kernels["cpu"] = _put_inplace


def put(input, index, source, accumulate: bool = False, *, out=None) -> Tensor:
    """``input`` read as 1-d with ``source`` written (or added) at ``index``."""
    _tensors("put", input=input, index=index, source=source)
    return call(_PUT, input, index, source, accumulate=accumulate, out=out)


def take_along_dim(input, indices, dim=None, *, out=None) -> Tensor:
    """``gather`` with ``input`` and ``indices`` broadcast against each other off ``dim``;
    with ``dim=None`` both are read as 1-d. Along a dim, PyTorch wraps indices modulo the
    size (so ``-1`` is the last element); this follows it."""
    _tensors("take_along_dim", input=input, indices=indices)
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
                       grad=_masked_select_grad, dynamic_shape=True)


def masked_select(input, mask, *, out=None) -> Tensor:
    """The elements of ``input`` where the (broadcast) bool ``mask`` is True, as 1-d."""
    _tensors("masked_select", input=input, mask=mask)
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
        gs = _pad_to(masked_select(g, mask), (numel(sm.shape),)).reshape(sm.shape)
    return gx, None, gs


_MASKED_SCATTER = defop("masked_scatter", _masked_scatter_infer, _masked_scatter_kernel,
                        grad=_masked_scatter_grad)
_MASKED_SCATTER.inplace_kernels["cpu"] = _op_pair(_write_masked_scatter)[1]


def masked_scatter(input, mask, source, *, out=None) -> Tensor:
    """``input`` with the positions where ``mask`` is True filled, in order, from the
    elements of ``source``."""
    _tensors("masked_scatter", input=input, mask=mask, source=source)
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
                 dynamic_shape=True)


def one_hot(tensor, num_classes: int = -1) -> Tensor:
    """int64 one-hot rows (a new last dim) for the class indices in ``tensor``; with
    ``num_classes=-1`` the count is one more than the largest index."""
    ensure_tensor("one_hot", tensor, "tensor")
    return call(_ONE_HOT, tensor, num_classes=num_classes)
