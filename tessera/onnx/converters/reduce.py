"""Reductions and sorting, both directions: ONNX's ``Reduce*`` family (one table row per
ONNX reduction: the tessera ops exported as it and how it is imported), argmax/argmin,
moments and norms, NaN-ignoring sums, cumulative sums, top-k and sorting.

>>> from tessera.onnx.converters.registry import EXPORT, IMPORT
>>> [op for op, onnx_op in [("amax", "ReduceMax"), ("sum", "ReduceSum")]
...  if op in EXPORT and onnx_op in IMPORT]
['amax', 'sum']
"""
from __future__ import annotations

import math

import numpy as np

from tessera import _dtype as D
from tessera.onnx.converters.helpers import (
    axes_input_since,
    norm_axis,
    operand,
    reduce_axes,
    reduce_over,
    static_prod,
)
from tessera.onnx.converters.registry import export_rule, import_rule
from tessera.ops.creation import full
from tessera.ops.gather_scatter import gather
from tessera.ops.reduce import (
    amax,
    amin,
    argmax,
    argmin,
    logsumexp,
    mean as _mean,
    prod,
    sum as _sum,
)
from tessera.ops.scan import cumsum
from tessera.ops.sorting import argsort
from tessera.ops.unary import abs as _abs, exp, log, sqrt

# ---- the Reduce* family ----------------------------------------------------------------


def _export_reduction(onnx_op: str, cast_bool: bool = False):
    def rule(b, n):
        dt = n.out_dtype()
        src = D.int32 if cast_bool else dt
        x = operand(b, n, 0, D.bool_) if cast_bool and n.dtype(0) is not D.bool_ \
            else operand(b, n, 0)
        x = b.cast(x, D.bool_ if cast_bool else n.dtype(0), src)
        a = n.attrs
        out = reduce_over(b, onnx_op, x, reduce_axes(a.get("dim"), n.rank(0)),
                          a.get("keepdim", False))
        return b.cast(out, src, dt)
    rule.__name__ = f"_{onnx_op.lower()}"
    return rule


def _import_axes(c, x, axes_t, from_input: bool):
    if from_input and axes_t is not None:
        axes = c.ints(axes_t)
    else:
        axes = c.attr("axes")
    if not axes:
        if c.attr("noop_with_empty_axes", 0):
            return None
        return list(range(x.dim()))
    return [a % max(x.dim(), 1) for a in axes]


def _import_reduction(fn, axes_input: int):
    def rule(c, x, axes_t=None):
        axes = _import_axes(c, x, axes_t, c.opset >= axes_input)
        if axes is None:
            return x
        keep = bool(c.attr("keepdims", 1))
        if not axes:
            return fn(x, None, keep) if x.dim() == 0 else x
        return fn(x, axes, keep)
    return rule


def _rsum(x, axes, keep):
    return _sum(x, dim=axes, keepdim=keep) if axes else x


def _rmean(x, axes, keep):
    return _mean(x, dim=axes, keepdim=keep) if axes else x


def _rmax(x, axes, keep):
    if x.numel() == 0:
        return _empty_reduce(x, axes, keep, "max")
    return amax(x, dim=axes, keepdim=keep) if axes else x


def _rmin(x, axes, keep):
    if x.numel() == 0:
        return _empty_reduce(x, axes, keep, "min")
    return amin(x, dim=axes, keepdim=keep) if axes else x


def _empty_reduce(x, axes, keep, kind):
    shape = [1 if i in axes else s for i, s in enumerate(x.shape)] if keep else \
        [s for i, s in enumerate(x.shape) if i not in axes]
    if x.dtype.is_floating_point:
        v = -math.inf if kind == "max" else math.inf
    else:
        info = np.iinfo(x.dtype.np) if x.dtype is not D.bool_ else None
        v = (info.min if kind == "max" else info.max) if info else kind == "min"
    return full(shape, v, dtype=x.dtype)


def _rprod(x, axes, keep):
    for a in sorted(axes, reverse=True):
        x = prod(x, dim=a, keepdim=keep)
    return x


def _rlogsumexp(x, axes, keep):
    if x.numel():
        return logsumexp(x, dim=axes, keepdim=keep)
    return log(_rsum(exp(x), axes, keep))


# ONNX reduction -> (tessera ops exported as it, its import: fn(x, axes, keepdim))
REDUCTIONS = {
    "ReduceSum": (("sum",), _rsum),
    "ReduceMean": (("mean",), _rmean),
    "ReduceMax": (("amax", "max"), _rmax),
    "ReduceMin": (("amin", "min"), _rmin),
    "ReduceProd": (("prod",), _rprod),
    "ReduceL1": ((), lambda x, a, k: _rsum(_abs(x), a, k)),
    "ReduceL2": ((), lambda x, a, k: sqrt(_rsum(x * x, a, k))),
    "ReduceSumSquare": ((), lambda x, a, k: _rsum(x * x, a, k)),
    "ReduceLogSum": ((), lambda x, a, k: log(_rsum(x, a, k))),
    "ReduceLogSumExp": (("logsumexp",), _rlogsumexp),
}
for _onnx_op, (_ops, _fn) in REDUCTIONS.items():
    if _ops:
        export_rule(*_ops)(_export_reduction(_onnx_op))
    import_rule(_onnx_op)(_import_reduction(_fn, axes_input_since(_onnx_op)))
export_rule("all")(_export_reduction("ReduceMin", cast_bool=True))
export_rule("any")(_export_reduction("ReduceMax", cast_bool=True))


# ---- arg reductions --------------------------------------------------------------------

def _arg(op: str, onnx_op: str, fn) -> None:
    """``op`` is ``onnx_op`` (tessera's ``dim=None`` flattens first; ONNX's
    ``select_last_index`` picks the last of equal values)."""
    @export_rule(op)
    def export(b, n):
        x = operand(b, n, 0)
        dim, keep = n.attrs.get("dim"), n.attrs.get("keepdim", False)
        if n.rank(0) == 0:
            return b.const(np.zeros(n.out_shape(), np.int64))
        if dim is None:
            flat = b.op("Reshape", [x, b.ints([-1])])
            out = b.op(onnx_op, [flat], axis=0, keepdims=0)
            return b.op("Reshape", [out, b.ints(n.out_shape())]) if keep else out
        return b.op(onnx_op, [x], axis=norm_axis(dim, n.rank(0)), keepdims=int(bool(keep)))

    @import_rule(onnx_op)
    def import_(c, x):
        axis = c.axis("axis", max(x.dim(), 1))
        keep = bool(c.attr("keepdims", 1))
        if c.attr("select_last_index", 0):
            flipped = x.flip(axis)
            i = fn(flipped, dim=axis, keepdim=keep)
            return (x.shape[axis] - 1) - i
        return fn(x, dim=axis, keepdim=keep)


_arg("argmax", "ArgMax", argmax)
_arg("argmin", "ArgMin", argmin)


def _val_idx(red: str, arg: str):
    def rule(b, n):
        x = operand(b, n, 0)
        dim, keep = norm_axis(n.attrs["dim"], n.rank(0)), n.attrs.get("keepdim", False)
        if n.rank(0) == 0:
            return b.op("Identity", [x]), b.const(np.array(0, np.int64))
        return (reduce_over(b, red, x, [dim], keep),
                b.op(arg, [x], axis=dim, keepdims=int(bool(keep))))
    return rule


export_rule("max_dim")(_val_idx("ReduceMax", "ArgMax"))
export_rule("min_dim")(_val_idx("ReduceMin", "ArgMin"))


# ---- moments and norms -----------------------------------------------------------------

def _count(n, axes) -> int:
    shape = n.shape(0)
    return static_prod(shape if axes is None else [shape[a] for a in axes])


def _moments(b, n, std: bool):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    a = n.attrs
    axes = reduce_axes(a.get("dim"), n.rank(0))
    keep = a.get("keepdim", False)
    mean_k = reduce_over(b, "ReduceMean", x, axes, True)
    d = b.op("Sub", [x, mean_k])
    s = reduce_over(b, "ReduceSum", b.op("Mul", [d, d]), axes, keep)
    count = _count(n, axes)
    corr = a.get("correction", 1)
    var = b.op("Div", [s, b.const(max(count - corr, 0), dt)])
    out = b.op("Sqrt", [var]) if std else var
    mean = mean_k if keep else reduce_over(b, "ReduceMean", x, axes, False)
    return out, mean


export_rule("var")(lambda b, n: _moments(b, n, False)[0])
export_rule("std")(lambda b, n: _moments(b, n, True)[0])
export_rule("var_mean")(lambda b, n: _moments(b, n, False))
export_rule("std_mean")(lambda b, n: _moments(b, n, True))


@export_rule("norm")
def _norm(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    a = n.attrs
    axes, keep = reduce_axes(a.get("dim"), n.rank(0)), a.get("keepdim", False)
    p = a.get("ord", 2)
    p = 2.0 if p is None else float(p)
    if p == 2:
        return reduce_over(b, "ReduceL2", x, axes, keep)
    if p == 1:
        return reduce_over(b, "ReduceL1", x, axes, keep)
    ax = b.op("Abs", [x])
    if p == float("inf"):
        return reduce_over(b, "ReduceMax", ax, axes, keep)
    if p == float("-inf"):
        return reduce_over(b, "ReduceMin", ax, axes, keep)
    if p == 0:
        nz = b.cast(b.op("Not", [b.op("Equal", [x, b.const(0, dt)])]), D.bool_, dt)
        return reduce_over(b, "ReduceSum", nz, axes, keep)
    s = reduce_over(b, "ReduceSum", b.op("Pow", [ax, b.const(p, dt)]), axes, keep)
    return b.op("Pow", [s, b.const(1 / p, dt)])


@export_rule("count_nonzero")
def _count_nonzero(b, n):
    x = operand(b, n, 0)
    nz = b.op("Not", [b.op("Equal", [x, b.scalar(0, n.dtype(0))])])
    return reduce_over(b, "ReduceSum", b.cast(nz, D.bool_, D.int64),
                       reduce_axes(n.attrs.get("dim"), n.rank(0)), False)


def _not_nan(b, x, dt):
    return b.op("Where", [b.op("IsNaN", [x]), b.const(0, dt), x])


@export_rule("nansum")
def _nansum(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    if dt.is_floating_point:
        x = _not_nan(b, x, dt)
    return reduce_over(b, "ReduceSum", x, reduce_axes(n.attrs.get("dim"), n.rank(0)),
                       n.attrs.get("keepdim", False))


@export_rule("nanmean")
def _nanmean(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    axes, keep = reduce_axes(n.attrs.get("dim"), n.rank(0)), n.attrs.get("keepdim", False)
    ok = b.cast(b.op("Not", [b.op("IsNaN", [x])]), D.bool_, dt)
    s = reduce_over(b, "ReduceSum", _not_nan(b, x, dt), axes, keep)
    return b.op("Div", [s, reduce_over(b, "ReduceSum", ok, axes, keep)])


# ---- cumulative sums -------------------------------------------------------------------

@export_rule("cumsum")
def _cumsum(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    if n.rank(0) == 0:
        return b.op("Identity", [x])
    return b.op("CumSum", [x, b.const(np.array(norm_axis(n.attrs["dim"], n.rank(0)),
                                               np.int64))])


@import_rule("CumSum")
def _import_cumsum(c, x, axis):
    a = c.ints(axis)[0]
    if c.attr("reverse", 0):
        x = x.flip(a)
    y = cumsum(x, a).to(x.dtype)
    if c.attr("exclusive", 0):
        y = y - x
    if c.attr("reverse", 0):
        y = y.flip(a)
    return y


# ---- top-k and sorting -----------------------------------------------------------------

@export_rule("topk")
def _topk(b, n):
    x = operand(b, n, 0)
    a = n.attrs
    if n.rank(0) == 0:
        return b.op("Identity", [x]), b.const(np.array(0, np.int64))
    return b.op("TopK", [x, b.ints([a["k"]])], n_out=2, axis=norm_axis(a["dim"], n.rank(0)),
                largest=int(bool(a.get("largest", True))), sorted=1)


@import_rule("TopK", since=10)
def _import_topk(c, x, k):
    kk = c.ints(k)[0]
    axis = c.axis("axis", max(x.dim(), 1), -1)
    largest = bool(c.attr("largest", 1))
    # stable order: equal values keep their index order, as ONNX specifies
    idx = argsort(x, dim=axis, descending=largest, stable=True)
    idx = idx.narrow(axis % x.dim(), 0, kk)
    return gather(x, axis, idx), idx


@export_rule("sort")
def _sort(b, n):
    x = operand(b, n, 0)
    if n.rank(0) == 0:
        return b.op("Identity", [x]), b.const(np.array(0, np.int64))
    dim = norm_axis(n.attrs["dim"], n.rank(0))
    return b.op("TopK", [x, b.ints([n.shape(0)[dim]])], n_out=2, axis=dim,
                largest=int(bool(n.attrs.get("descending", False))), sorted=1)


@export_rule("kthvalue")
def _kthvalue(b, n):
    x = operand(b, n, 0)
    a = n.attrs
    if n.rank(0) == 0:
        return b.op("Identity", [x]), b.const(np.array(0, np.int64))
    dim = norm_axis(a["dim"], n.rank(0))
    v, i = b.op("TopK", [x, b.ints([a["k"]])], n_out=2, axis=dim, largest=0, sorted=1)
    pick = b.ints([a["k"] - 1])
    v, i = b.op("Gather", [v, pick], axis=dim), b.op("Gather", [i, pick], axis=dim)
    if not a.get("keepdim", False):
        v, i = (b.op("Squeeze", [t, b.ints([dim])]) for t in (v, i))
    return v, i
