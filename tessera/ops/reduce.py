"""Reductions over ``dim`` (an int, a tuple, or None for all) with ``keepdim``.

Sums and means, products, variance, extrema with their indices, norms and the logical
reductions, one ``OpDef`` each; the ops that sort or scan along one dim (median, mode,
kthvalue, quantile, cumsum, cummax, ...) live in ``scan.py``, which builds on the helpers
here. Each op's ``sbp`` rule splits a kept dim (a split reduced dim of ``sum`` gives
partial_sum) and its ``cost`` counts the operations per input element.
Kernels are NumPy calls over the reduced axes; gradients are tessera ops and send ties where
PyTorch sends them (evenly for ``amax`` and ``max()``, to the returned index for
``max(dim)``). Among equal values the index is the first occurrence for max/min/argmax.

>>> import tessera
>>> tessera.ones(2, 3).sum(dim=1)
tensor([3., 3.])
>>> tessera.tensor([[1., 5.], [7., 2.]]).max(1).indices
tensor([1, 0])
"""
from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.ops import _jax, _relax, _sbp, cost, unary
from tessera.ops._util import call, ensure_tensor, float_dtype, missing, numel, wrap_dim, wrap_dims
from tessera.ops.arithmetic import maximum, minimum
from tessera.ops.comparison import isnan, logical_not
from tessera.ops.registry import Meta, defop
from tessera.ops.ternary import where
from tessera.ops.unary import exp, sign
from tessera.sbp import SbpRule, Signature, partial_sum as P, split as S

__all__ = ["sum", "mean", "nansum", "nanmean", "prod", "var", "std", "var_mean", "std_mean",
           "logsumexp", "norm", "all", "any", "count_nonzero", "max", "min", "amax", "amin",
           "aminmax", "argmax", "argmin", "return_types"]

_pyall, _pymax = all, max  # the builtins, before this module's functions shadow them


def _rt(name: str, fields=("values", "indices")):
    cls = namedtuple(name, fields)  # type: ignore[misc]  # one class per op, made here
    cls.__module__ = "tessera.return_types"
    return cls


class return_types:
    """Named results of multi-output ops (``torch.return_types``): ``v, i = x.max(1)`` and
    ``x.max(1).values`` both work."""

    max, min, median, nanmedian = _rt("max"), _rt("min"), _rt("median"), _rt("nanmedian")
    mode, kthvalue, cummax, cummin = _rt("mode"), _rt("kthvalue"), _rt("cummax"), _rt("cummin")
    sort, topk = _rt("sort"), _rt("topk")
    aminmax = _rt("aminmax", ("min", "max"))


def _named(kind, res, out=None):
    """``res`` as ``kind``; with ``out=`` (a pair of tensors) copied into ``out``."""
    if out is not None:
        for o, r in zip(out, res):
            o.copy_(r)
        res = tuple(out)
    return kind(*res)


# ---- shape helpers ---------------------------------------------------------------------

def reduced_shape(shape, dims, keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def expand_back(g: Tensor, in_shape, dims, keepdim: bool) -> Tensor:
    """Broadcast a reduced gradient back over the reduced dims."""
    if not keepdim and len(dims) == len(in_shape):  # a full reduction: expand the 0-d grad
        return g.expand(tuple(in_shape))
    return _kd(g, in_shape, dims, keepdim).expand(tuple(in_shape))


def _kd(t: Tensor, in_shape, dims, keepdim: bool) -> Tensor:
    """A reduced result in its keepdim shape, so it broadcasts against the input."""
    return t if keepdim else t.reshape(reduced_shape(in_shape, dims, True))


def _dims(op: str, dim, ndim: int) -> tuple[int, ...]:
    """The reduced dims, sorted; None or an empty sequence mean all (PyTorch's rule). A 0-d
    tensor takes dim 0 or -1 and has no dims to reduce."""
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        return tuple(range(ndim))
    return tuple(d for d in wrap_dims(dim, ndim, op) if d < ndim)


def _one_dim(op: str, dim, shape, empty_ok=False) -> int | None:
    """``dim`` wrapped (None for a 0-d tensor); IndexError when that dim is empty."""
    d = wrap_dim(dim, len(shape), op)
    if not shape:
        return None
    if shape[d] == 0 and not empty_ok:
        raise IndexError(f"{op}(): Expected reduction dim {d} to have non-zero size.")
    return d


def _at(x: np.ndarray, d):
    """``x`` and its axis ``d``, a 0-d array seen as shape (1,)."""
    return (x.reshape(1), 0) if d is None else (x, d)


_HALF = tuple(np.dtype(t) for t in (np.float16, D.bfloat16.np) if t is not None)


def _acc(x: np.ndarray) -> np.ndarray:
    """Half-precision inputs accumulate in float32, as PyTorch does."""
    return x.astype(np.float32) if x.dtype in _HALF else x


def _acc_np(d: D.dtype):
    return np.float32 if d.np in _HALF else d.np


def _long_dtype(d: D.dtype, dtype=None) -> D.dtype:
    """sum/prod/cumsum: an explicit dtype, else int64 for integers and bools."""
    if dtype is not None:
        return D.as_dtype(dtype)
    return D.int64 if d.category <= 1 else d


def _dname(d: D.dtype) -> str:
    return {"int64": "Long", "int32": "Int", "bool": "Bool", "uint8": "Byte", "int8": "Char",
            "int16": "Short", "float16": "Half", "float32": "Float", "float64": "Double",
            "bfloat16": "BFloat16"}.get(d.name, d.name)


def _ident(d, dtype=None):
    return d


def _reduction(name, kernel, grad, out_dtype=_ident, save=(), check=None, quiet=False,
               plain=None, sbp=None, flops=1, decompose=None):
    """Register a reduction over ``dim``/``keepdim``; ``kernel(x, dims, keepdim, **kw)``.
    ``quiet``: the kernel calls ufuncs from tessera's own frames, whose inf/nan warnings the
    filter in ``_dispatch`` silences, so it needs no ``np.errstate``. ``plain(cpu)``: the
    kernel's form for float32/float64 inputs (dispatch's fast path), given the full one.
    ``sbp``: its rule (by default a kept dim may stay split); ``flops``: its operations per
    input element, or a cost rule; ``decompose``: its rule for the code generator."""
    def infer(x, dim=None, keepdim=False, **kw):
        dims = _dims(name, dim, len(x.shape))
        if check is not None:
            check(x, dims, dim, **kw)
        return Meta(reduced_shape(x.shape, dims, keepdim), out_dtype(x.dtype, **kw))

    def cpu(x, dim=None, keepdim=False, **kw):
        if quiet:
            return kernel(x, _dims(name, dim, x.ndim), keepdim, **kw)
        with np.errstate(all="ignore"):
            return kernel(x, _dims(name, dim, x.ndim), keepdim, **kw)
    if plain is not None:
        cpu.plain = plain(cpu)  # type: ignore[attr-defined]  # read by dispatch
    return defop(name, infer, cpu, grad=grad, save=save,
                 sbp=_sbp.reduction() if sbp is None else sbp,
                 cost=cost.reduction(flops) if isinstance(flops, int) else flops,
                 to_relax=_relax.rule(name), to_jax=_jax.rule(name), decompose=decompose)


def _attrs(ctx):
    m = ctx.input_metas[0]
    dims = _dims(ctx.op.name, ctx.attrs.get("dim"), len(m.shape))
    return m.shape, dims, ctx.attrs.get("keepdim", False)


def _dim_arg(dim):
    return tuple(dim) if isinstance(dim, list) else dim


# ---- sums and means --------------------------------------------------------------------

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _sum_kernel(x, dims, keepdim, dtype=None):
    if len(dims) == x.ndim:
        dims = None  # NumPy reduces over all axes faster given None than the axes' tuple
    if dtype is None and x.dtype in _FLOATS:  # the common case
        return np.add.reduce(x, axis=dims, keepdims=keepdim)
    out = _long_dtype(D.from_numpy_dtype(x.dtype), dtype)
    return np.add.reduce(x, axis=dims, keepdims=keepdim, dtype=_acc_np(out))


def _sum_plain(cpu):
    """sum of a float32/float64 array: over all dims straight to NumPy (the common call)."""
    def plain(x, dim=None, keepdim=False, dtype=None):
        if dim is None and dtype is None:
            return np.add.reduce(x, axis=None, keepdims=keepdim)
        return cpu(x, dim, keepdim, dtype=dtype)
    return plain


def _sum_grad(ctx, g):
    shape, dims, keepdim = _attrs(ctx)
    return (expand_back(g, shape, dims, keepdim),)


def _nansum_kernel(x, dims, keepdim, dtype=None):
    out = _long_dtype(D.from_numpy_dtype(x.dtype), dtype)
    return np.nansum(x, axis=dims, keepdims=keepdim, dtype=_acc_np(out))


def _nansum_grad(ctx, g):
    shape, dims, keepdim = _attrs(ctx)
    return (where(isnan(ctx.inputs[0]), 0.0, _kd(g, shape, dims, keepdim)),)


def _mean_check(name):
    def check(x, dims, dim, dtype=None):
        given = dtype is not None and name == "mean"
        dt = D.as_dtype(dtype) if given else x.dtype
        if dt.category < 2:
            if name == "mean":
                raise RuntimeError(f"mean(): could not infer output dtype. "
                                   f"{'Optional' if given else 'Input'} dtype must be either a "
                                   f"floating point or complex dtype. Got: {_dname(dt)}")
            raise RuntimeError("nanmean(): expected input to have floating point or complex "
                               f"dtype but got {_dname(x.dtype)}")
    return check


def _mean_kernel(x, dims, keepdim, dtype=None):
    x = _acc(x.astype(D.as_dtype(dtype).np) if dtype is not None else x)
    return np.sum(x, axis=dims, keepdims=keepdim) / numel([x.shape[d] for d in dims])


def _nanmean_kernel(x, dims, keepdim, dtype=None):
    x = _acc(x.astype(D.as_dtype(dtype).np) if dtype is not None else x)
    count = np.sum(~np.isnan(x), axis=dims, keepdims=keepdim)
    return np.nansum(x, axis=dims, keepdims=keepdim) / count


def _mean_grad(ctx, g):
    shape, dims, keepdim = _attrs(ctx)
    return (expand_back(g / numel([shape[d] for d in dims]), shape, dims, keepdim),)


def _nanmean_grad(ctx, g):
    shape, dims, keepdim = _attrs(ctx)
    keep = logical_not(isnan(ctx.inputs[0]))
    # a mask product (not where): an all-NaN slice gives NaN gradients, as in PyTorch
    return (_kd(g, shape, dims, keepdim) / sum(keep, dims, True) * keep,)


def _dtype_out(d, dtype=None):
    return D.as_dtype(dtype) if dtype is not None else d


def _mean_local(op, args, attrs, metas, group):
    """``mean`` of a tile split on a reduced dim (its sbp signature's local computation):
    the tile's sum over the logical count, so that the tiles add up to the mean."""
    dims = _sbp.reduced(metas[0], attrs.get("dim"))
    count = math.prod(metas[0].shape[d] for d in dims)
    s = sum(args[0], dim=dims, keepdim=attrs.get("keepdim", False), dtype=attrs.get("dtype"))
    return s / count


_SUM = _reduction("sum", _sum_kernel, _sum_grad, _long_dtype, quiet=True, plain=_sum_plain,
                  sbp=_sbp.reduction(partial=True))
_NANSUM = _reduction("nansum", _nansum_kernel, _nansum_grad, _long_dtype, save=("inputs",),
                     sbp=_sbp.reduction(partial=True))
_MEAN = _reduction("mean", _mean_kernel, _mean_grad, _dtype_out, check=_mean_check("mean"),
                   sbp=_sbp.reduction(mean=_mean_local))
_NANMEAN = _reduction("nanmean", _nanmean_kernel, _nanmean_grad, _dtype_out,
                      save=("inputs",), check=_mean_check("nanmean"), flops=2)


def _dt(dtype):
    return None if dtype is None else D.as_dtype(dtype)


def sum(input, dim=None, keepdim: bool = False, *, dtype=None, out=None, axis=None,
        keepdims=None) -> Tensor:
    """Sum over ``dim`` (all dims when None); integers and bools sum to int64."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    if type(input) is Tensor and out is None and dtype is None and type(dim) is not list:
        return dispatch(_SUM, input, dim=dim, keepdim=keepdim, dtype=None)  # the common call
    ensure_tensor("sum", input)
    return call(_SUM, input, dim=_dim_arg(dim), keepdim=keepdim, dtype=_dt(dtype), out=out)


def nansum(input, dim=None, keepdim: bool = False, *, dtype=None, out=None, axis=None,
           keepdims=None) -> Tensor:
    """Sum treating NaN as zero (``tessera.nansum(tessera.tensor([1., float('nan')]))``)."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    ensure_tensor("nansum", input)
    return call(_NANSUM, input, dim=_dim_arg(dim), keepdim=keepdim, dtype=_dt(dtype), out=out)


def mean(input, dim=None, keepdim: bool = False, *, dtype=None, out=None, axis=None,
         keepdims=None) -> Tensor:
    """Arithmetic mean over ``dim``; needs a floating dtype."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    if type(input) is Tensor and out is None and dtype is None and type(dim) is not list:
        return dispatch(_MEAN, input, dim=dim, keepdim=keepdim, dtype=None)  # the common call
    ensure_tensor("mean", input)
    return call(_MEAN, input, dim=_dim_arg(dim), keepdim=keepdim, dtype=_dt(dtype), out=out)


def nanmean(input, dim=None, keepdim: bool = False, *, dtype=None, out=None, axis=None,
            keepdims=None) -> Tensor:
    """Mean of the non-NaN elements (NaN where there are none)."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    ensure_tensor("nanmean", input)
    return call(_NANMEAN, input, dim=_dim_arg(dim), keepdim=keepdim, dtype=_dt(dtype),
                out=out)


# ---- prod ------------------------------------------------------------------------------

def _prod_kernel(x, dims, keepdim, dtype=None):
    out = _long_dtype(D.from_numpy_dtype(x.dtype), dtype)
    return np.prod(x, axis=dims, keepdims=keepdim, dtype=_acc_np(out))


def _prod_grad(ctx, g):
    # out / x where no zero; the one zero of a slice gets the product of the others
    shape, dims, keepdim = _attrs(ctx)
    x, out = ctx.inputs[0], ctx.outputs[0]
    gk, ok = _kd(g, shape, dims, keepdim), _kd(out, shape, dims, keepdim)
    zero = x == 0
    zeros = sum(zero, dims, True)
    safe = where(zero, 1.0, x)
    others = prod(safe, dims[0], True) if len(dims) == 1 else dispatch(
        _PROD, safe, dim=dims, keepdim=True)
    one_zero = where(zero & (zeros == 1), gk * others, 0.0)
    return (where(zeros == 0, gk * ok / safe, one_zero),)


_PROD = _reduction("prod", _prod_kernel, _prod_grad, _long_dtype, save=("inputs", "outputs"))


def prod(input, dim=None, keepdim: bool = False, *, dtype=None, out=None, axis=None,
         keepdims=None) -> Tensor:
    """Product over one ``dim`` (all elements when None); integers multiply to int64."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    ensure_tensor("prod", input)
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, (int, np.integer))):
        raise TypeError(f"prod(): argument 'dim' must be int, not {type(dim).__name__}")
    return call(_PROD, input, dim=dim, keepdim=keepdim, dtype=_dt(dtype), out=out)


# ---- var, std, var_mean, std_mean ------------------------------------------------------

def _var_np(x, dims, keepdim, correction):
    """(variance, mean) of ``x`` over ``dims``, dividing by max(N - correction, 0)."""
    x = _acc(x)
    n = numel([x.shape[d] for d in dims])
    mu = np.sum(x, axis=dims, keepdims=True) / n
    d = x - mu
    ss = np.sum((d * d.conj()).real if x.dtype.kind == "c" else d * d, axis=dims,
                keepdims=keepdim)
    return ss / _pymax(n - correction, 0), mu if keepdim else mu.reshape(ss.shape)


def _reduced(b, x, dims, keepdim: bool):
    """x's reduced shape: the keepdim result ``x`` viewed without the reduced dims."""
    if keepdim:
        return x
    return b.view(x, shape=tuple(s for d, s in enumerate(x.shape) if d not in dims))


def _var_decompose(root: bool, with_mean: bool):
    """var/std (and with the mean) as the NumPy kernel computes them, in two passes: the
    mean, then the squared differences' sum over max(N - correction, 0); for the code
    generator to fuse (None where a reduced extent is 0: the op's own rule)."""
    def rule(b, x, dim=None, keepdim=False, correction=1):
        dims = _dims("var", dim, len(x.shape))
        n = numel([x.shape[d] for d in dims])
        if n == 0 or x.dtype.is_complex:
            return None
        mu = b.mean(x, dims)
        d = b.sub(x, mu)
        ss = b.sum(b.mul(d, d), dims, keepdim=keepdim)
        # no degree of freedom left: NumPy's 0/0 (NaN) or x/0 (inf) is ss * inf, where a
        # division by a constant 0 is folded as an error by compiler backends (TVM)
        free = n - correction
        v = b.div(ss, float(free)) if free > 0 else b.mul(ss, float("inf"))
        v = b.sqrt(v) if root else v
        return (v, _reduced(b, mu, dims, keepdim)) if with_mean else v
    return rule


def _var_family(name: str, root: bool, with_mean: bool, **rules):
    def infer(x, dim=None, keepdim=False, correction=1):
        if x.dtype.category < 2:
            raise RuntimeError(f"{name}(): std and var only support floating point and "
                               f"complex dtypes, got {_dname(x.dtype)}")
        shape = reduced_shape(x.shape, _dims(name, dim, len(x.shape)), keepdim)
        m = Meta(shape, x.dtype.to_real())
        return (m, Meta(shape, x.dtype)) if with_mean else m

    def cpu(x, dim=None, keepdim=False, correction=1):
        with np.errstate(all="ignore"):
            v, mu = _var_np(x, _dims(name, dim, x.ndim), keepdim, correction)
            v = np.sqrt(v) if root else v
        return (v, mu) if with_mean else v

    def grad(ctx, g, gm=None):
        shape, dims, keepdim = _attrs(ctx)
        x = ctx.inputs[0]
        gk = _kd(g, shape, dims, keepdim)
        if root:  # d std = d var / (2 std); PyTorch sends nothing where std == 0
            sk = _kd(ctx.outputs[0], shape, dims, keepdim)
            gk = where(sk == 0, 0.0, gk / (2 * where(sk == 0, 1.0, sk)))
        gx = _var_backward(gk, x, dims, ctx.attrs.get("correction", 1),
                           ctx.attrs.get("dim") is None or not shape)
        if with_mean:
            gx = gx + _kd(gm, shape, dims, keepdim) / numel([shape[d] for d in dims])
        return (gx,)
    save = ("inputs", "outputs") if root else ("inputs",)
    # a sum for the mean, then a difference, a square and a sum per element
    return defop(name, infer, cpu, grad=grad, save=save,
                 sbp=_sbp.reduction(nout=2 if with_mean else 1), cost=cost.reduction(4),
                 decompose=_var_decompose(root, with_mean), **rules)


def _var_backward(gk, x, dims, correction, full: bool):
    n = numel([x.shape[d] for d in dims])
    dof = n - correction
    mu = mean(x, dims, True)
    if full and dof <= 0:  # PyTorch: NaN where x equals the mean, else inf
        return gk * where(x == mu, math.nan, math.inf)
    return gk * (x - mu) * (2.0 / dof if dof != 0 else math.inf)


_VAR = _var_family("var", False, False, to_relax=_relax.variance(False),
                   to_jax=_jax.variance(False))
_STD = _var_family("std", True, False, to_relax=_relax.variance(True),
                   to_jax=_jax.variance(True))
_VAR_MEAN = _var_family("var_mean", False, True, to_relax=_relax.variance_mean(False),
                        to_jax=_jax.variance_mean(False))
_STD_MEAN = _var_family("std_mean", True, True, to_relax=_relax.variance_mean(True),
                        to_jax=_jax.variance_mean(True))


def _correction(op: str, dim, unbiased, correction):
    """PyTorch's overloads: var(x, unbiased), var(x, dim, unbiased, keepdim), correction=."""
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise TypeError(f"{op}(): pass either 'unbiased' or 'correction', not both")
    if correction is None:
        correction = 0 if unbiased is False else 1
    return _dim_arg(dim), correction


def _var_call(op, name, input, dim, unbiased, keepdim, correction, out=None):
    ensure_tensor(name, input)
    dim, c = _correction(name, dim, unbiased, correction)
    return call(op, input, dim=dim, keepdim=keepdim, correction=c, out=out)


def var(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None, out=None,
        axis=None, keepdims=None):
    """Variance over ``dim`` with Bessel's ``correction`` (1 by default, 0 if not unbiased)."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    return _var_call(_VAR, "var", input, dim, unbiased, keepdim, correction, out)


def std(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None, out=None,
        axis=None, keepdims=None):
    """Standard deviation: the square root of ``var``."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    return _var_call(_STD, "std", input, dim, unbiased, keepdim, correction, out)


def var_mean(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None, axis=None,
             keepdims=None):
    """``(var, mean)`` in one pass."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    return _var_call(_VAR_MEAN, "var_mean", input, dim, unbiased, keepdim, correction)


def std_mean(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None, axis=None,
             keepdims=None):
    """``(std, mean)`` in one pass."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    return _var_call(_STD_MEAN, "std_mean", input, dim, unbiased, keepdim, correction)


# ---- logsumexp and norm ----------------------------------------------------------------

def _lse_kernel(x, dims, keepdim):
    x = _acc(x) if x.dtype.kind in "fc" else x.astype(D.get_default_dtype().np)
    if x.size == 0:
        return np.log(np.sum(np.exp(x), axis=dims, keepdims=keepdim))
    m = np.max(x, axis=dims, keepdims=True)
    m = np.where(np.isinf(m), 0, m)  # all -inf (or an inf) must not turn into NaN
    r = np.log(np.sum(np.exp(x - m), axis=dims, keepdims=True)) + m
    return r if keepdim else r.reshape(reduced_shape(x.shape, dims, False))


def _lse_grad(ctx, g):
    shape, dims, keepdim = _attrs(ctx)
    x, out = ctx.inputs[0], ctx.outputs[0]
    return (_kd(g, shape, dims, keepdim) * exp(x - _kd(out, shape, dims, keepdim)),)


def _lse_decompose(b, x, dim=None, keepdim=False):
    """As the kernel: the shift by the maximum is 0 where that is infinite (all -inf, or an
    inf), so that no inf - inf makes a NaN."""
    dims = _dims("logsumexp", dim, len(x.shape))
    if 0 in [x.shape[d] for d in dims]:
        return None
    m = b.amax(x, dims)
    m = b.where(b.isinf(m), 0.0, m)
    r = b.add(b.log(b.sum(b.exp(b.sub(x, m)), dims)), m)
    return _reduced(b, r, dims, keepdim)


_LSE = _reduction("logsumexp", _lse_kernel, _lse_grad, lambda d: float_dtype(d),
                  save=("inputs", "outputs"), flops=4,   # max, difference, exp, sum
                  decompose=_lse_decompose)


def logsumexp(input, dim=None, keepdim: bool = False, *, out=None, axis=None,
              keepdims=None) -> Tensor:
    """log(sum(exp(input))) over ``dim``, computed without overflow."""
    dim = dim if axis is None else axis
    if dim is None:
        missing("logsumexp", dim=dim)
    keepdim = keepdim if keepdims is None else keepdims
    ensure_tensor("logsumexp", input)
    if dim is None:
        raise TypeError("logsumexp(): argument 'dim' must be tuple of ints, not NoneType")
    return call(_LSE, input, dim=_dim_arg(dim), keepdim=keepdim, out=out)


_NORMS = {
    2.0: lambda a, ax, k: np.sqrt(np.sum(a * a, axis=ax, keepdims=k)),
    1.0: lambda a, ax, k: np.sum(a, axis=ax, keepdims=k),
    math.inf: lambda a, ax, k: np.max(a, axis=ax, keepdims=k),
    -math.inf: lambda a, ax, k: np.min(a, axis=ax, keepdims=k),
    0.0: lambda a, ax, k: np.sum(a != 0, axis=ax, keepdims=k, dtype=a.dtype),
}


def _norm_check(x, dims, dim, ord=2.0, dtype=None):
    if x.dtype.category < 2:
        raise RuntimeError("linalg.vector_norm: Expected a floating point or complex tensor "
                           f"as input. Got {_dname(x.dtype)}")
    if dtype is not None and D.as_dtype(dtype).category < 2:
        raise RuntimeError("linalg.vector_norm: dtype should be floating point or complex, "
                           f"but got {_dname(D.as_dtype(dtype))}")
    if math.isinf(ord) and numel(x.shape) == 0:
        empty = [d for d in dims if x.shape[d] == 0]
        if dim is None or empty:
            raise RuntimeError(f"linalg.vector_norm cannot compute the {ord} norm on an empty "
                               "tensor because the operation does not have an identity")


def _norm_kernel(x, dims, keepdim, ord=2.0, dtype=None):
    a = np.abs(_acc(x.astype(D.as_dtype(dtype).np) if dtype is not None else x))
    k = _NORMS.get(ord)
    if k is not None:
        return k(a, dims, keepdim)
    return np.sum(a ** ord, axis=dims, keepdims=keepdim) ** (1.0 / ord)


def _norm_grad(ctx, g):
    shape, dims, keepdim = _attrs(ctx)
    x, p = ctx.inputs[0], ctx.attrs.get("ord", 2.0)
    if ctx.attrs.get("dtype") is not None:
        x = x.to(ctx.attrs["dtype"])
    gk, nk = _kd(g, shape, dims, keepdim), _kd(ctx.outputs[0], shape, dims, keepdim)
    nz = nk == 0
    if p == 0:
        return (x * 0,)
    if p == 1:
        return (sign(x) * gk,)
    if math.isinf(p):  # like amax of |x|: ties share, NaN counts as the extremum
        ax = unary.abs(x)
        mask = (ax == nk) | isnan(ax)
        return (sign(x) * ((gk / sum(mask, dims, True)) * mask),)
    safe_n = where(nz, 1.0, nk)
    if p < 1:
        ax = unary.abs(where(x == 0, 1.0, x)) ** (p - 1)
        return (sign(x) * where(x == 0, 0.0, ax) * gk * nk ** (1 - p),)
    scale = where(nz, 0.0, gk / safe_n ** (p - 1))
    if p == 2:
        return (x * scale,)
    if p < 2:
        return (sign(x) * unary.abs(x) ** (p - 1) * scale,)
    return (x * unary.abs(x) ** (p - 2) * scale,)


_KEPT = _sbp.reduction()


def _norm_sbp(x, dim=None, keepdim=False, ord=2.0, dtype=None):
    """A kept dim may stay split; a split reduced dim gives partial_sum only for the 1-norm
    (a sum of |x|): the tiles' 2-norms do not add up to the 2-norm. Never partial input."""
    sigs = _KEPT(x, dim=dim, keepdim=keepdim)
    if ord == 1:
        sigs += [Signature((S(d),), (P,)) for d in _sbp.reduced(x, dim)]
    return sigs


def _norm_cost(ins, outs, ord=2.0, **attrs) -> cost.Cost:
    """|x|, then its power (not for the 1- and inf-norms) and the sum, per element."""
    per = 2 if ord in (1.0, math.inf, -math.inf) else 3
    return cost.reduction(per)(ins, outs)


_NORM = _reduction("norm", _norm_kernel, _norm_grad,
                   lambda d, ord=2.0, dtype=None: _dtype_out(d, dtype).to_real(),
                   save=("inputs", "outputs"), check=_norm_check, sbp=SbpRule(_norm_sbp),
                   flops=_norm_cost)


def norm(input, p="fro", dim=None, keepdim: bool = False, out=None, dtype=None) -> Tensor:
    """The vector p-norm over ``dim`` (all elements when None); 'fro' is the 2-norm.

    >>> tessera.norm(tessera.tensor([3., 4.]))
    tensor(5.)
    """
    ensure_tensor("norm", input)
    if isinstance(p, str):
        ndim = 1 if dim is None or isinstance(dim, (int, np.integer)) else len(dim)
        if p != "fro" or ndim > 2:
            try:
                from tessera.ops.linalg import matrix_norm  # type: ignore[attr-defined]
            except ImportError:
                raise NotImplementedError(f"norm(): p='{p}' needs linalg.matrix_norm, which "
                                          "tessera does not provide yet") from None
            d = tuple(range(input.dim())) if dim is None else dim
            return matrix_norm(input, p, d, keepdim, dtype=dtype, out=out)
        p = 2.0
    p = 2.0 if p is None else float(p)
    return call(_NORM, input, dim=_dim_arg(dim), keepdim=keepdim, ord=p, dtype=_dt(dtype),
                out=out)


# ---- all, any, count_nonzero -----------------------------------------------------------

def _logical(name: str, npf):
    def dims_of(dim, ndim):  # dim=() reduces nothing here (PyTorch's rule for all/any)
        return tuple(range(ndim)) if dim is None else wrap_dims(dim, ndim, name)

    def infer(x, dim=None, keepdim=False):
        shape = reduced_shape(x.shape, dims_of(dim, len(x.shape)), keepdim)
        return Meta(shape, D.uint8 if x.dtype is D.uint8 else D.bool_)

    def cpu(x, dim=None, keepdim=False):
        return npf(x, axis=tuple(d for d in dims_of(dim, x.ndim) if d < x.ndim),
                   keepdims=keepdim)
    op = defop(name, infer, cpu, grad=None, sbp=_sbp.reduction(), cost=cost.reduction(1),
               to_jax=_jax.logical(name), to_relax=_relax.logical(name))

    def fn(input, dim=None, keepdim: bool = False, *, out=None, axis=None,
           keepdims=None) -> Tensor:
        dim = dim if axis is None else axis
        keepdim = keepdim if keepdims is None else keepdims
        ensure_tensor(name, input)
        return call(op, input, dim=_dim_arg(dim), keepdim=keepdim, out=out)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Logical ``{name}`` over ``dim``; bool result (uint8 for uint8 input)."
    return fn


all = _logical("all", np.all)
any = _logical("any", np.any)

_COUNT_NONZERO = _reduction(
    "count_nonzero", lambda x, dims, keepdim: np.count_nonzero(x, axis=dims, keepdims=keepdim),
    None, lambda d: D.int64)


def count_nonzero(input, dim=None, *, axis=None) -> Tensor:
    """How many elements are not zero, over ``dim`` (int or tuple; all when None)."""
    dim = dim if axis is None else axis
    ensure_tensor("count_nonzero", input)
    return call(_COUNT_NONZERO, input, dim=_dim_arg(dim))


# ---- selection: max, min, amax, amin, aminmax, argmax, argmin --------------------------

def _no_empty(name: str, x, dim, dims) -> None:
    """PyTorch's errors for extrema of empty tensors (there is no identity to return)."""
    if numel(x.shape) != 0:
        return
    if dim is None or dim == ():
        raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() "
                           "== 0. Specify the reduction dim with the 'dim' argument.")
    for d in dims:
        if x.shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


def _take(x: np.ndarray, argf, dim, keepdim: bool):
    """(values, indices) from ``argf(a, axis) -> indices`` of keepdim shape."""
    a, d = _at(x, None if x.ndim == 0 else dim % x.ndim)
    i = argf(a, d)
    v = np.take_along_axis(a, i, d)
    if not keepdim or x.ndim == 0:
        v, i = v.squeeze(d), i.squeeze(d)
    return v, i


def _evenly(g: Tensor, x: Tensor, value: Tensor) -> Tensor:
    """The whole-tensor max()/median(): elements equal to the result share the gradient."""
    mask = (x == value) | (isnan(x) & isnan(value))
    return where(mask, g / sum(mask), 0.0)


def _share(gk: Tensor, x: Tensor, ok: Tensor, dims) -> Tensor:
    """amax/amin: per slice, the elements equal to the result share the gradient."""
    mask = x == ok
    return (gk / sum(mask, dims, True)) * mask


def _select_grad(g: Tensor, idx: Tensor, shape, dim, keepdim: bool) -> Tensor:
    """A (values, indices) reduction: the gradient goes to the returned index along dim."""
    if not shape:
        return g.reshape(())
    d = wrap_dim(dim, len(shape), "select")
    if not keepdim:
        g, idx = g.unsqueeze(d), idx.unsqueeze(d)
    from tessera.ops.creation import arange
    pos = arange(shape[d], device=g.device).reshape(
        tuple(-1 if i == d else 1 for i in range(len(shape))))
    return where(pos == idx, g, 0.0)


def _indexed(name: str, argf, check=None, flops=cost.reduction(1), **rules):
    """An op returning (values, indices) over one dim; ``argf(a, axis, **attrs)`` gives the
    indices in keepdim shape. The gradient goes to the returned index. ``flops``: its cost
    rule (a comparison per element by default)."""
    def infer(x, dim, keepdim=False, **kw):
        d = _one_dim(name.removesuffix("_dim"), dim, x.shape)
        if check is not None:
            check(x, dim, **kw)
        shape = reduced_shape(x.shape, () if d is None else (d,), keepdim)
        return Meta(shape, x.dtype), Meta(shape, D.int64)

    def cpu(x, dim, keepdim=False, **kw):
        return _take(x, lambda a, d: argf(a, d, **kw), dim, keepdim)

    def grad(ctx, g, gi=None):
        return (_select_grad(g, ctx.outputs[1], ctx.input_metas[0].shape, ctx.attrs["dim"],
                             ctx.attrs.get("keepdim", False)),)
    return defop(name, infer, cpu, grad=grad, save=("outputs",), nondiff_outputs=(1,),
                 sbp=_sbp.reduction(nout=2), cost=flops, **rules)


def _whole_decompose(reduction: str):
    """max/min of all elements as amax/amin over every dim, a reduction regions end in."""
    def rule(b, x):
        if numel(x.shape) == 0:
            return None
        return getattr(b, reduction)(x, tuple(range(len(x.shape))), keepdim=False)
    return rule


def _whole(name: str, kernel, check=None, **rules):
    """The no-dim form of max/min/median: one value; equal elements share the gradient."""
    def infer(x):
        if check is not None:
            check(x, None)
        return Meta((), x.dtype)
    return defop(name, infer, kernel, save=("inputs", "outputs"),
                 grad=lambda ctx, g: (_evenly(g, ctx.inputs[0], ctx.outputs[0]),),
                 sbp=SbpRule(_sbp.full_reduction), cost=cost.reduction(1), **rules)


def _extremum_check(name):
    def check(x, dim):
        _no_empty(name, x, None, ())
    return check


_MAX = _whole("max", np.max, _extremum_check("max"), to_relax=_relax.extremum("max"),
              to_jax=_jax.extremum("max"), decompose=_whole_decompose("amax"))
_MIN = _whole("min", np.min, _extremum_check("min"), to_relax=_relax.extremum("min"),
              to_jax=_jax.extremum("min"), decompose=_whole_decompose("amin"))
_MAX_DIM = _indexed("max_dim", lambda a, d: np.argmax(a, axis=d, keepdims=True),
                    to_relax=_relax.extremum_dim("max"), to_jax=_jax.extremum_dim("max"))
_MIN_DIM = _indexed("min_dim", lambda a, d: np.argmin(a, axis=d, keepdims=True),
                    to_relax=_relax.extremum_dim("min"), to_jax=_jax.extremum_dim("min"))


def _extremum_call(ops, name, kind, binary, input, dim, keepdim, out):
    ensure_tensor(name, input)
    if isinstance(dim, Tensor):  # max(a, b) is maximum(a, b)
        return binary(input, dim, out=out)
    if dim is None:
        if keepdim:
            raise TypeError(f"{name}(): keepdim=True needs a dim to reduce")
        return call(ops[0], input, out=out)
    return _named(kind, dispatch(ops[1], input, dim=dim, keepdim=keepdim), out)


def max(input, dim=None, keepdim: bool = False, *, out=None, other=None, axis=None,
        keepdims=None):
    """The largest element; with ``dim``, ``(values, indices)`` (first index among ties);
    with a tensor, the elementwise ``maximum``."""
    dim = other if other is not None else dim if axis is None else axis   # max(a, other=b)
    keepdim = keepdim if keepdims is None else keepdims
    return _extremum_call((_MAX, _MAX_DIM), "max", return_types.max, maximum, input, dim,
                          keepdim, out)


def min(input, dim=None, keepdim: bool = False, *, out=None, other=None, axis=None,
        keepdims=None):
    """The smallest element; with ``dim``, ``(values, indices)``; with a tensor, ``minimum``."""
    dim = other if other is not None else dim if axis is None else axis   # max(a, other=b)
    keepdim = keepdim if keepdims is None else keepdims
    return _extremum_call((_MIN, _MIN_DIM), "min", return_types.min, minimum, input, dim,
                          keepdim, out)


def _amax_grad(ctx, g):
    shape, dims, keepdim = _attrs(ctx)
    ok = _kd(ctx.outputs[0], shape, dims, keepdim)
    return (_share(_kd(g, shape, dims, keepdim), ctx.inputs[0], ok, dims),)


def _amax_check(name):
    def check(x, dims, dim):
        _no_empty(name, x, dim, dims)
    return check


_AMAX = _reduction("amax", lambda x, dims, k: np.max(x, axis=dims, keepdims=k), _amax_grad,
                   save=("inputs", "outputs"), check=_amax_check("amax"))
_AMIN = _reduction("amin", lambda x, dims, k: np.min(x, axis=dims, keepdims=k), _amax_grad,
                   save=("inputs", "outputs"), check=_amax_check("amin"))


def amax(input, dim=(), keepdim: bool = False, *, out=None, axis=None, keepdims=None) -> Tensor:
    """The maximum over ``dim`` (int or tuple; all when empty); ties share the gradient."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    ensure_tensor("amax", input)
    return call(_AMAX, input, dim=_dim_arg(dim), keepdim=keepdim, out=out)


def amin(input, dim=(), keepdim: bool = False, *, out=None, axis=None, keepdims=None) -> Tensor:
    """The minimum over ``dim`` (int or tuple; all when empty); ties share the gradient."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    ensure_tensor("amin", input)
    return call(_AMIN, input, dim=_dim_arg(dim), keepdim=keepdim, out=out)


def _aminmax_dims(x_shape, dim):
    if dim is None:
        if numel(x_shape) == 0:
            raise RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as "
                               "the operation has no identity.")
        return tuple(range(len(x_shape)))
    d = wrap_dim(dim, len(x_shape), "aminmax")
    if x_shape and x_shape[d] == 0:
        raise IndexError(f"aminmax: Expected reduction dim {d} to have non-zero size.")
    return (d,) if x_shape else ()


def _aminmax_infer(x, dim=None, keepdim=False):
    m = Meta(reduced_shape(x.shape, _aminmax_dims(x.shape, dim), keepdim), x.dtype)
    return m, m


def _aminmax_kernel(x, dim=None, keepdim=False):
    dims = _aminmax_dims(x.shape, dim)
    return np.min(x, axis=dims, keepdims=keepdim), np.max(x, axis=dims, keepdims=keepdim)


def _aminmax_grad(ctx, gmin, gmax):
    shape, keepdim = ctx.input_metas[0].shape, ctx.attrs.get("keepdim", False)
    dims = _aminmax_dims(shape, ctx.attrs.get("dim"))
    x, (lo, hi) = ctx.inputs[0], ctx.outputs
    return (_share(_kd(gmin, shape, dims, keepdim), x, _kd(lo, shape, dims, keepdim), dims) +
            _share(_kd(gmax, shape, dims, keepdim), x, _kd(hi, shape, dims, keepdim), dims),)


_AMINMAX = defop("aminmax", _aminmax_infer, _aminmax_kernel, grad=_aminmax_grad,
                 save=("inputs", "outputs"), sbp=_sbp.reduction(nout=2),
                 cost=cost.reduction(2), to_jax=_jax.aminmax, to_relax=_relax.aminmax)


def aminmax(input, *, dim=None, keepdim: bool = False, out=None, axis=None, keepdims=None):
    """``(min, max)`` over one ``dim`` (all elements when None)."""
    dim = dim if axis is None else axis
    keepdim = keepdim if keepdims is None else keepdims
    ensure_tensor("aminmax", input)
    return _named(return_types.aminmax,
                  dispatch(_AMINMAX, input, dim=dim, keepdim=keepdim), out)


def _arg_op(name: str, argf):
    def infer(x, dim=None, keepdim=False):
        if x.dtype is D.bool_:
            raise RuntimeError(f"{name}(): does not support bool input")
        if dim is None:
            if numel(x.shape) == 0:
                raise IndexError(f"{name}(): Expected reduction dim to be specified for "
                                 "input.numel() == 0.")
            return Meta((1,) * len(x.shape) if keepdim else (), D.int64)
        d = _one_dim(name, dim, x.shape)
        return Meta(reduced_shape(x.shape, () if d is None else (d,), keepdim), D.int64)

    def cpu(x, dim=None, keepdim=False):
        if dim is None:
            return argf(x.reshape(-1)).reshape((1,) * x.ndim if keepdim else ())
        a, d = _at(x, None if x.ndim == 0 else dim % x.ndim)
        i = argf(a, axis=d, keepdims=keepdim)
        return i.reshape(()) if x.ndim == 0 else i
    op = defop(name, infer, cpu, grad=None, sbp=_sbp.reduction(), cost=cost.reduction(1),
               to_jax=_jax.arg(name), to_relax=_relax.arg(name))

    def fn(input, dim=None, keepdim: bool = False, *, out=None, axis=None,
           keepdims=None) -> Tensor:
        dim = dim if axis is None else axis
        keepdim = keepdim if keepdims is None else keepdims
        ensure_tensor(name, input)
        return call(op, input, dim=dim, keepdim=keepdim, out=out)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"The index of the {name[3:]}imum (flattened when dim is None); first of ties."
    return fn


argmax = _arg_op("argmax", np.argmax)
argmin = _arg_op("argmin", np.argmin)

