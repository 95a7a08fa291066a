"""Reductions that sort or scan along one dim: order statistics and cumulative ops.

``median``/``nanmedian``/``mode``/``kthvalue`` return ``(values, indices)`` and send the
gradient to the returned index. Among equal values median takes the one at the median's
place in a stable sort and mode the last occurrence of the mode, as PyTorch's CPU kernels do
(for mode exactly so in rows of up to 16 elements; beyond, PyTorch's choice is arbitrary, as
it is for kthvalue, which takes the stable place here too). ``quantile`` interpolates between
two sorted neighbours and sends the gradient to both; ``cumsum``/``cumprod``/``cummax``/
``cummin`` scan along ``dim``. Kernels sort or scan whole arrays at once (no Python loop over
elements). Their ``sbp`` rules split any dim but the one they work along (the order
statistics as reductions).

>>> import tessera
>>> tessera.tensor([1., 2., 3.]).cumsum(0)
tensor([1., 3., 6.])
>>> tessera.quantile(tessera.tensor([1., 2., 3., 4.]), 0.5)
tensor(2.5000)
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.ops import _jax, _relax, _sbp, cost
from tessera.ops._util import call, ensure_tensor, missing, numel, wrap_dim
from tessera.ops.reduce import (
    _acc_np,
    _dt,
    _indexed,
    _long_dtype,
    _named,
    _one_dim,
    _whole,
    reduced_shape,
    return_types,
    sum,
)
from tessera.ops.registry import Meta, OpDef, defop
from tessera.ops.ternary import where
from tessera.sbp import SbpRule, Signature, broadcast as B, split as S

__all__ = ["median", "nanmedian", "mode", "kthvalue", "quantile", "nanquantile", "cumsum",
           "cumprod", "cummax", "cummin"]


# ---- order statistics: median, nanmedian, mode, kthvalue -------------------------------

def _no_bool(name):
    def check(x, dim, **kw):
        if x.dtype is D.bool_ and (dim is not None or numel(x.shape)):
            raise NotImplementedError(f"\"{name}_cpu\" not implemented for 'Bool'")
    return check


def _stable_kth(a, d, k: int):
    """The index (keepdim shape) of the element at place ``k`` of a stable sort along ``d``
    (NaN last), in O(n): a partition finds the value, then the equal values are counted off
    in their original order."""
    v = np.take(np.partition(a, k, axis=d), [k], axis=d)
    eq = a == v
    less = np.sum(a < v, axis=d, keepdims=True)
    if a.dtype.kind == "f":  # a NaN value: place k lies among the NaNs, after all numbers
        v_nan = np.isnan(v)
        eq |= np.isnan(a) & v_nan
        less = np.where(v_nan, np.sum(~np.isnan(a), axis=d, keepdims=True), less)
    return np.argmax(eq & (np.cumsum(eq, axis=d) == k - less + 1), axis=d, keepdims=True)


def _median_idx(ignore_nan: bool):
    # among equal values PyTorch picks the one at the median's place in a stable sort
    def idx(a, d):
        n = a.shape[d]
        nan = np.isnan(a) if a.dtype.kind == "f" else None
        if not ignore_nan:
            i = _stable_kth(a, d, (n - 1) // 2)
            if nan is None:
                return i
            # a slice holding NaN yields its first NaN
            return np.where(nan.any(axis=d, keepdims=True),
                            np.argmax(nan, axis=d, keepdims=True), i)
        # the place depends on each slice's NaN count: sort
        order = np.argsort(a, axis=d, kind="stable")
        count = np.zeros(a.shape[:d] + (1,) + a.shape[d + 1:], np.intp) if nan is None else \
            nan.sum(axis=d, keepdims=True)
        i = np.take_along_axis(order, np.maximum((n - count - 1) // 2, 0), d)
        if n > 3:
            i = np.where(count == n, _all_equal_nth(n), i)
        return i
    return idx


@functools.lru_cache(maxsize=64)
def _all_equal_nth(n: int) -> int:
    """The index libstdc++'s ``nth_element`` (which PyTorch's nanmedian calls) leaves first
    when no element compares less than another, as in an all-NaN slice: its introselect
    loop of median-of-three pivot and unguarded partition, on positions only."""
    idx, first, last = list(range(n)), 0, n
    while last - first > 3:
        mid = first + (last - first) // 2
        idx[first], idx[mid] = idx[mid], idx[first]  # "median" of three equals: the middle
        lo, hi = first + 1, last
        while True:
            hi -= 1
            if lo >= hi:
                break
            idx[lo], idx[hi] = idx[hi], idx[lo]
            lo += 1
        last = lo  # the cut lies past nth = first, so the left part is kept
    return idx[first]


def _median_all(ignore_nan: bool):
    def whole(x):
        f = x.reshape(-1)
        if f.dtype.kind == "f":
            nan = np.isnan(f)
            if ignore_nan:
                f = f[~nan]
            elif nan.any():
                return np.array(np.nan, x.dtype)
        if f.size == 0:  # PyTorch's NaN cast to the dtype
            kind = x.dtype.kind
            return np.array(np.nan if kind == "f" else True if kind == "b" else
                            np.iinfo(x.dtype).min, x.dtype)
        k = (f.size - 1) // 2
        return np.partition(f, k)[k]
    return whole


def _order_rules(kind: str) -> dict:
    return dict(to_jax=_jax.order_statistic(kind, _all_equal_nth),
                to_relax=_relax.order_statistic(kind, _all_equal_nth))


_MEDIAN = _whole("median", _median_all(False), _no_bool("median"),
                 to_jax=_jax.median_all(False), to_relax=_relax.median_all(False))
_NANMEDIAN = _whole("nanmedian", _median_all(True), _no_bool("nanmedian"),
                    to_jax=_jax.median_all(True), to_relax=_relax.median_all(True))
_MEDIAN_DIM = _indexed("median_dim", _median_idx(False), _no_bool("median"),
                       **_order_rules("median_dim"))
_NANMEDIAN_DIM = _indexed("nanmedian_dim", _median_idx(True), _no_bool("nanmedian"),
                          **_order_rules("nanmedian_dim"))


def _median_call(ops, name, kind, input, dim, keepdim, out):
    ensure_tensor(name, input)
    if dim is None:
        if keepdim:
            raise TypeError(f"{name}() missing 1 required positional arguments: \"dim\"")
        return call(ops[0], input, out=out)
    return _named(kind, dispatch(ops[1], input, dim=dim, keepdim=keepdim), out)


def median(input, dim=None, keepdim: bool = False, *, out=None, axis=None, keepdims=None):
    """The lower median; with ``dim``, ``(values, indices)``. NaN if the input holds one."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    return _median_call((_MEDIAN, _MEDIAN_DIM), "median", return_types.median, input, dim,
                        keepdim, out)


def nanmedian(input, dim=None, keepdim: bool = False, *, out=None, axis=None, keepdims=None):
    """The lower median of the non-NaN elements; with ``dim``, ``(values, indices)``."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    return _median_call((_NANMEDIAN, _NANMEDIAN_DIM), "nanmedian", return_types.nanmedian,
                        input, dim, keepdim, out)


def _mode_idx(a, d):
    """Index of the most frequent value (the smallest among equally frequent ones), at its
    last occurrence, as PyTorch's CPU kernel (a sort, then a scan of runs) returns it."""
    a = np.moveaxis(a, d, -1)
    order = np.argsort(a, axis=-1, kind="stable")
    s = np.take_along_axis(a, order, -1)
    end = np.ones(s.shape, bool)
    end[..., :-1] = s[..., 1:] != s[..., :-1]  # NaN != NaN: each NaN is a run of its own
    start = np.ones(s.shape, bool)
    start[..., 1:] = end[..., :-1]
    pos = np.arange(s.shape[-1])
    first = np.maximum.accumulate(np.where(start, pos, 0), axis=-1)
    best = np.argmax(np.where(end, pos - first + 1, 0), axis=-1, keepdims=True)
    return np.moveaxis(np.take_along_axis(order, best, -1), -1, d)


_MODE = _indexed("mode", _mode_idx, flops=cost.sorting(), **_order_rules("mode"))


def mode(input, dim: int = -1, keepdim: bool = False, *, out=None, axis=None, keepdims=None):
    """``(values, indices)``: the most frequent value along ``dim`` and where it occurs."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    ensure_tensor("mode", input)
    return _named(return_types.mode, dispatch(_MODE, input, dim=dim, keepdim=keepdim), out)


def _kth_check(x, dim, k=1):
    if x.shape:  # a 0-d input is its own k-th value, whatever its dtype
        _no_bool("kthvalue")(x, dim)
    d = _one_dim("kthvalue", dim, x.shape)
    n = 1 if d is None else x.shape[d]
    if not 1 <= k <= n:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension "
                           f"{0 if d is None else d}")


def _kth_idx(a, d, k=1):
    return _stable_kth(a, d, k - 1)


_KTHVALUE = _indexed("kthvalue", _kth_idx, _kth_check, **_order_rules("kthvalue"))


def kthvalue(input, k: int, dim: int = -1, keepdim: bool = False, *, out=None, axis=None,
             keepdims=None):
    """``(values, indices)`` of the k-th smallest element along ``dim`` (NaN sorts last)."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    ensure_tensor("kthvalue", input)
    res = dispatch(_KTHVALUE, input, dim=dim, keepdim=keepdim, k=int(k))
    return _named(return_types.kthvalue, res, out)


# ---- quantile ----------------------------------------------------------------------------

_INTERP = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile_infer(x, q, dim=None, keepdim=False, interpolation="linear", ignore_nan=False):
    name = "nanquantile" if ignore_nan else "quantile"
    if x.dtype is not D.float32 and x.dtype is not D.float64:
        raise RuntimeError(f"{name}() input tensor must be either float or double dtype")
    if type(q) is Meta:
        if len(q.shape) > 1:
            raise RuntimeError(f"{name}() q must be a scalar or 1D tensor")
        if q.dtype is not x.dtype:
            raise RuntimeError(f"{name}() q tensor must be same dtype as the input tensor")
    elif not 0 <= q <= 1:
        raise RuntimeError(f"{name}() q must be in the range [0, 1] but got {q}")
    if numel(x.shape) == 0:
        raise RuntimeError(f"{name}() input tensor must be non-empty")
    if interpolation not in _INTERP:
        raise RuntimeError(f"{name}() interpolation must be one of linear, lower, higher, "
                           f"midpoint or nearest, but got {interpolation}")
    shape = _quantile_shape(name, x.shape, q.shape if type(q) is Meta else (), dim, keepdim)
    v, i = Meta(shape, x.dtype), Meta(shape, D.int64)
    # hidden outputs for backward: the two sorted neighbours' indices, their weight, and
    # d rank / d q
    return v, i, i, v, v


def _quantile_shape(name, x_shape, q_shape, dim, keepdim):
    nd = len(x_shape)
    dims = tuple(range(nd)) if dim is None else (wrap_dim(dim, nd, name),) if nd else ()
    return tuple(q_shape) + reduced_shape(x_shape, dims, keepdim)


def _quantile_ranks(s, qv, interpolation, ignore_nan):
    """Fractional sorted positions (Q, ..., 1) of the quantiles, and d rank / d q."""
    n = s.shape[-1]
    nan = np.isnan(s).sum(-1, keepdims=True)
    qv = qv.reshape(qv.shape + (1,) * s.ndim)
    if ignore_nan:  # among the non-NaN values; an all-NaN slice gives its first (NaN) value
        span = (n - nan - 1).astype(s.dtype)
        rank = qv * span
        drank = np.where(rank < 0, 0, span)
        rank = np.maximum(rank, 0)
    else:  # a slice holding NaN gives NaN: its last sorted value
        rank = np.where(nan > 0, np.asarray(n - 1, s.dtype), qv * np.asarray(n - 1, s.dtype))
        drank = np.where(nan > 0, 0, np.asarray(n - 1, s.dtype))
    if interpolation in ("lower", "higher", "nearest"):
        rounding: dict[str, Callable] = {"lower": np.floor, "higher": np.ceil,
                                         "nearest": np.round}
        rank = rounding[interpolation](rank)
    if interpolation != "linear":
        drank = np.zeros_like(drank)
    return rank, drank


def _quantile_kernel(x, q, dim=None, keepdim=False, interpolation="linear", ignore_nan=False):
    name = "nanquantile" if ignore_nan else "quantile"
    qv = np.asarray(q, x.dtype).reshape(-1)
    if np.ndim(q) and ((qv < 0) | (qv > 1)).any():
        raise RuntimeError(f"{name}() q values must be in the range [0, 1]")
    flat = dim is None or x.ndim == 0
    a = x.reshape(-1) if flat else np.moveaxis(x, dim % x.ndim, -1)
    order = np.argsort(a, axis=-1, kind="stable")
    s = np.take_along_axis(a, order, -1)
    rank, drank = _quantile_ranks(s, qv, interpolation, ignore_nan)
    lo, hi = np.floor(rank).astype(np.intp), np.ceil(rank).astype(np.intp)
    w = (rank - lo).astype(x.dtype) if interpolation == "linear" else \
        np.full(rank.shape, 0.5 if interpolation == "midpoint" else 0.0, x.dtype)
    vlo, vhi = np.take_along_axis(s[None], lo, -1), np.take_along_axis(s[None], hi, -1)
    with np.errstate(all="ignore"):  # PyTorch's lerp, exact at both ends
        val = np.where(w < 0.5, vlo + w * (vhi - vlo), vhi - (vhi - vlo) * (1 - w))
    shape = _quantile_shape(name, x.shape, qv.shape if np.ndim(q) else (), dim, keepdim)

    def fin(r):
        r = np.broadcast_to(r, val.shape)
        if not flat and keepdim:
            r = np.moveaxis(r, -1, 1 + dim % x.ndim)
        return r.reshape(shape)
    ilo, ihi = np.take_along_axis(order[None], lo, -1), np.take_along_axis(order[None], hi, -1)
    return tuple(fin(r) for r in (val, ilo, ihi, w, drank))


def _quantile_grad(ctx, g, *_):
    x, q = ctx.inputs
    xm, qm = ctx.input_metas
    dim = ctx.attrs.get("dim")
    lead = tuple(qm.shape) if type(qm) is Meta else ()
    kd: tuple[int, ...]
    if dim is None or not xm.shape:  # indices are into the flattened input
        xs, d, kd = x.reshape(-1), 0, (1,)
    else:
        d = wrap_dim(dim, len(xm.shape), "quantile")
        xs, kd = x, reduced_shape(xm.shape, (d,), True)
    gk, lo, hi, wk, drk = (t.reshape(lead + kd) for t in (g,) + ctx.outputs[1:])
    from tessera.ops.creation import arange
    pos = arange(xs.shape[d], device=g.device).reshape(
        tuple(-1 if i == d else 1 for i in range(len(kd))))
    at_lo, at_hi = pos == lo, pos == hi
    gx = gq = None
    if ctx.needs_input_grad[0]:
        gx = where(at_lo, gk * (1 - wk), 0.0) + where(at_hi, gk * wk, 0.0)
        gx = (sum(gx, 0) if lead else gx).reshape(xm.shape)
    if len(ctx.needs_input_grad) > 1 and ctx.needs_input_grad[1]:
        ax = d + len(lead)
        gap = sum(where(at_hi, xs, 0.0), ax, True) - sum(where(at_lo, xs, 0.0), ax, True)
        gq = sum(where(drk == 0, 0.0, gk * gap * drk), tuple(range(len(lead), gk.dim())))
    return gx, gq


def _quantile_sbp(x, q, dim=None, keepdim=False, **attrs):
    """A kept dim stays split (after q's dim, which leads the outputs); a split q splits
    every output's leading dim; all five outputs (values and backward's hidden ones) alike.
    A split quantile dim would need the whole slice sorted."""
    lead = len(q.shape) if type(q) is Meta else 0
    qs = B if type(q) is Meta else None
    sigs = []
    if dim is not None and x.shape:
        d0 = _sbp.wrap(dim, len(x.shape))
        sigs += [Signature((S(d), qs), (S(lead + (d if keepdim or d < d0 else d - 1)),) * 5)
                 for d in range(len(x.shape)) if d != d0]
    if lead:
        sigs.append(Signature((B, S(0)), (S(0),) * 5))
    return sigs + [Signature((B, qs), (B,) * 5)]


def _quantile_cost(ins, outs, dim=None, **attrs) -> cost.Cost:
    """The sort along ``dim``, then a linear interpolation (3 operations) per quantile."""
    c = cost.sorting(None)(ins, outs, dim=dim)
    return c._replace(flops=c.flops + 3 * cost.numel(outs[0]))


_QUANTILE = defop("quantile", _quantile_infer, _quantile_kernel, grad=_quantile_grad,
                  save=("inputs", "outputs"), nondiff_outputs=(1, 2, 3, 4),
                  sbp=SbpRule(_quantile_sbp), cost=_quantile_cost)


def _quantile_call(name, ignore_nan, input, q, dim, keepdim, interpolation, out):
    ensure_tensor(name, input)
    if not isinstance(q, Tensor):
        if isinstance(q, (list, tuple)) or not isinstance(q, (int, float, np.number)):
            raise TypeError(f"{name}(): argument 'q' must be float or Tensor, not "
                            f"{type(q).__name__}")
        q = float(q)
    res = dispatch(_QUANTILE, input, q, dim=dim, keepdim=keepdim, interpolation=interpolation,
                   ignore_nan=ignore_nan)[0]
    return res if out is None else out.copy_(res)


def quantile(input, q, dim=None, keepdim: bool = False, *, interpolation: str = "linear", out=None,
             axis=None, keepdims=None) -> Tensor:
    """The ``q``-quantiles (a float or a 1-D tensor of them) over ``dim`` (flattened when
    None), interpolating between sorted neighbours; NaN where a slice holds NaN."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    return _quantile_call("quantile", False, input, q, dim, keepdim, interpolation, out)


def nanquantile(input, q, dim=None, keepdim: bool = False, *, interpolation: str = "linear",
                out=None, axis=None, keepdims=None) -> Tensor:
    """``quantile`` of the non-NaN elements."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    return _quantile_call("nanquantile", True, input, q, dim, keepdim, interpolation, out)


# ---- cumulative: cumsum, cumprod, cummax, cummin ---------------------------------------

def _cum_infer(name: str):
    def infer(x, dim, dtype=None, reverse=False):
        wrap_dim(dim, len(x.shape), name)
        out = _long_dtype(x.dtype, dtype)
        if out is D.bool_:
            raise NotImplementedError(f"\"{name}_out_cpu\" not implemented for 'Bool'")
        return Meta(x.shape, out)
    return infer


def _cum_kernel(npf):
    def cpu(x, dim, dtype=None, reverse=False):
        dt = _acc_np(_long_dtype(D.from_numpy_dtype(x.dtype), dtype))
        if x.ndim == 0:
            return x.astype(dt)
        d = dim % x.ndim
        if reverse:  # the gradient of a scan is the scan run backwards
            return np.ascontiguousarray(np.flip(npf(np.flip(x, d), axis=d, dtype=dt), d))
        return npf(x, axis=d, dtype=dt)
    return cpu


def _cumsum_grad(ctx, g):
    return (dispatch(_CUMSUM, g, dim=ctx.attrs["dim"], reverse=not ctx.attrs.get("reverse")),)


def _cumprod_grad(ctx, g):
    # out_j / x_i summed over j >= i where no zero came before; the first zero of a row gets
    # the products that skip it; anything after it gets nothing (PyTorch's cumprod_backward)
    x, d = ctx.inputs[0], ctx.attrs["dim"]
    if x.dim() == 0:
        return (g,)
    x = x.to(g.dtype)
    zero = x == 0
    zeros_so_far = cumsum(zero, d)
    before, first = zeros_so_far == 0, zero & (zeros_so_far == 1)
    t = g * cumprod(where(first, 1.0, x), d)

    def rsum(v):
        return dispatch(_CUMSUM, v, dim=d, reverse=True)
    at_first = where(first, rsum(where(before, 0.0, t)), 0.0)
    return (where(before, rsum(where(before, t, 0.0)) / where(before, x, 1.0),
                  at_first),)


_CUMSUM = defop("cumsum", _cum_infer("cumsum"), _cum_kernel(np.cumsum), grad=_cumsum_grad,
                save=(), sbp=_sbp.pointwise(each=(0,), skip=("dim",)), cost=cost.reduction(1),
                to_jax=_jax.cumulative("cumsum"), to_relax=_relax.cumulative("cumsum"))
_CUMPROD = defop("cumprod", _cum_infer("cumprod"), _cum_kernel(np.cumprod),
                 grad=_cumprod_grad, sbp=_sbp.pointwise(skip=("dim",)), cost=cost.reduction(1),
                 to_jax=_jax.cumulative("cumprod"), to_relax=_relax.cumulative("cumprod"))


def cumsum(input, dim: int | None = None, *, dtype=None, out=None, axis=None) -> Tensor:
    """Running sums along ``dim``; integers and bools sum to int64."""
    dim = dim if axis is None else axis
    if dim is None:
        missing("cumsum", dim=dim)
    ensure_tensor("cumsum", input)
    return call(_CUMSUM, input, dim=dim, dtype=_dt(dtype), out=out)


def cumprod(input, dim: int | None = None, *, dtype=None, out=None, axis=None) -> Tensor:
    """Running products along ``dim``; integers and bools multiply to int64."""
    dim = dim if axis is None else axis
    if dim is None:
        missing("cumprod", dim=dim)
    ensure_tensor("cumprod", input)
    return call(_CUMPROD, input, dim=dim, dtype=_dt(dtype), out=out)


def _scatter_kernel(src, index, dim, gather=False):
    if src.ndim == 0 or src.size == 0:
        return src.copy()
    d = dim % src.ndim
    if gather:
        return np.take_along_axis(src, index, d)
    a, i = np.moveaxis(src, d, -1), np.moveaxis(index, d, -1)
    n = a.shape[-1]
    rows = np.arange(a.size // n).reshape(a.shape[:-1] + (1,)) * n
    out = np.bincount((rows + i).ravel(), weights=a.ravel(), minlength=a.size)
    return np.ascontiguousarray(np.moveaxis(out.reshape(a.shape), -1, d))


# The backward of cummax/cummin adds each gradient into the element its index names
# (scatter-add along dim); its own backward is the gather at those indices, and back.
_CUMEXT_BACKWARD: OpDef  # its grad rule dispatches it again
_CUMEXT_BACKWARD = defop(
    "cummaxmin_backward", lambda g, index, dim, gather=False: Meta(g.shape, g.dtype),
    _scatter_kernel, save=("inputs",),
    grad=lambda ctx, gg, *_: (dispatch(_CUMEXT_BACKWARD, gg, ctx.inputs[1], dim=ctx.attrs[
        "dim"], gather=not ctx.attrs.get("gather", False)), None),
    sbp=_sbp.pointwise(each=(0,), skip=("dim",)), cost=cost.reduction(1))


def _cum_extremum(name: str, ufunc):
    def infer(x, dim):
        wrap_dim(dim, len(x.shape), name)
        return Meta(x.shape, x.dtype), Meta(x.shape, D.int64)

    def cpu(x, dim):
        if x.ndim == 0:
            return x.copy(), np.zeros((), np.int64)
        d = dim % x.ndim
        v = ufunc.accumulate(x, axis=d)
        # PyTorch takes a later element equal to the running extremum, and every NaN
        hit = (x == v) | np.isnan(x) if x.dtype.kind == "f" else x == v
        pos = np.arange(x.shape[d]).reshape(tuple(-1 if i == d else 1 for i in range(x.ndim)))
        return v, np.maximum.accumulate(np.where(hit, pos, 0), axis=d)

    def grad(ctx, g, gi=None):
        return (dispatch(_CUMEXT_BACKWARD, g, ctx.outputs[1], dim=ctx.attrs["dim"]),)
    return defop(name, infer, cpu, grad=grad, save=("outputs",), nondiff_outputs=(1,),
                 sbp=_sbp.pointwise(nout=2, skip=("dim",)), cost=cost.reduction(1),
                 to_jax=_jax.cumulative_extremum(name),
                 to_relax=_relax.cumulative_extremum(name))


_CUMMAX = _cum_extremum("cummax", np.maximum)
_CUMMIN = _cum_extremum("cummin", np.minimum)


def cummax(input, dim: int | None = None, *, out=None, axis=None):
    """``(values, indices)`` of the running maximum along ``dim``."""
    dim = dim if axis is None else axis
    if dim is None:
        missing("cummax", dim=dim)
    ensure_tensor("cummax", input)
    return _named(return_types.cummax, dispatch(_CUMMAX, input, dim=dim), out)


def cummin(input, dim: int | None = None, *, out=None, axis=None):
    """``(values, indices)`` of the running minimum along ``dim``."""
    dim = dim if axis is None else axis
    if dim is None:
        missing("cummin", dim=dim)
    ensure_tensor("cummin", input)
    return _named(return_types.cummin, dispatch(_CUMMIN, input, dim=dim), out)
