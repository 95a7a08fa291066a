"""Normalisation ops: ``batch_norm``, ``layer_norm``, ``group_norm`` and ``rms_norm``.

Each is one ``OpDef`` with a fused NumPy kernel: the statistics are computed once over the
normalised axes (sums through ``np.einsum``, which reduces any set of axes in one pass with
no temporary) and the centred input is scaled and shifted in place. Half-precision inputs
compute in float32, as PyTorch does.

The ops save only their inputs (never their output, so an in-place op after a norm, as in
``Conv -> BatchNorm -> ReLU(inplace=True)``, stays legal). A plain backward of batch and
layer norm runs one fused kernel (``batch_norm_backward``, ``layer_norm_backward``); with
``create_graph`` the grad rules instead recompute the statistics with differentiable
tessera ops, so double backward is exact.

Instance norm is ``batch_norm`` over a ``(1, N*C, *)`` view (PyTorch's own decomposition);
local response norm is a composite (``tessera.nn.functional``).

>>> import tessera
>>> from tessera.ops.norm import layer_norm
>>> layer_norm(tessera.tensor([[1., 3.]]), None, None, normalized_shape=(2,), eps=0.0)
tensor([[-1.,  1.]])
"""
from __future__ import annotations

import string

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import STATE
from tessera.ops import _jax, _relax, cost
from tessera.ops._sbp import optional
from tessera.ops.reduce import var_mean
from tessera.ops.registry import Meta, defop
from tessera.sbp import (
    SbpRule,
    Signature,
    broadcast as B,
    communicator,
    partial_sum as P,
    split as S,
)

__all__: list[str] = []

_HALF = tuple(np.dtype(t) for t in (np.float16, D.bfloat16.np) if t is not None)
_SNAME = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
          "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
          "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}


# ---- kernel helpers ----------------------------------------------------------------------

def _acc(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) if x.dtype in _HALF else x


def _subscripts(ndim: int, axes) -> tuple[str, str]:
    """einsum subscripts for ``x`` and for ``x`` reduced over ``axes``."""
    letters = string.ascii_letters[:ndim]
    return letters, "".join(c for i, c in enumerate(letters) if i not in axes)


def _moments(x: np.ndarray, axes: tuple[int, ...]):
    """(centred x, biased variance, mean) over ``axes``; the variance and mean have the
    reduced shape, ``xc`` is a fresh array the caller may overwrite."""
    src, dst = _subscripts(x.ndim, axes)
    n = 1
    for a in axes:
        n *= x.shape[a]
    keep = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    with np.errstate(all="ignore"):  # an empty slice gives NaN statistics, like PyTorch
        mean = np.einsum(f"{src}->{dst}", x) / x.dtype.type(n)
        xc = x - mean.reshape(keep)
        var = np.einsum(f"{src},{src}->{dst}", xc, xc) / x.dtype.type(n)
    return xc, var, mean


def _rstd(var: np.ndarray, eps: float) -> np.ndarray:
    return 1.0 / np.sqrt(var + var.dtype.type(eps))


def _float_only(x, kernel: str) -> None:
    if x.dtype.category < 2 or x.dtype.is_complex:
        raise NotImplementedError(f'"{kernel}" not implemented for \'{_SNAME[x.dtype.name]}\'')


def _same_dtype(x, *params) -> None:
    for p in params:
        if type(p) is Meta and p.dtype is not x.dtype:
            raise RuntimeError(f"mixed dtype (CPU): expect parameter to have scalar type of "
                               f"{_SNAME[x.dtype.name]}")


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _lead(ndim: int, k: int) -> tuple[int, ...]:
    return tuple(range(ndim - k))


def _tail(ndim: int, k: int) -> tuple[int, ...]:
    return tuple(range(ndim - k, ndim))


def _sum_over(t: Tensor, dims: tuple[int, ...]) -> Tensor:
    return t.sum(dims) if dims else t


# ---- batch_norm --------------------------------------------------------------------------

def _bn_infer(x, weight, bias, running_mean, running_var, training, eps):
    _float_only(x, "batch_norm")
    if len(x.shape) < 2:
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[{-max(len(x.shape), 1)}, {max(len(x.shape), 1) - 1}], but got 1)")
    c = x.shape[1]
    for name, m in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                    ("running_var", running_var)):
        if type(m) is Meta and _numel(m.shape) != c:
            raise RuntimeError(f"{name} should contain {c} elements not {_numel(m.shape)}")
    if not training and (running_mean is None or running_var is None):
        which = "running_mean" if running_mean is None else "running_var"
        raise RuntimeError(f"{which} must be defined in evaluation mode")
    _same_dtype(x, weight, bias, running_mean, running_var)
    stat = Meta((c,), x.dtype)
    return Meta(x.shape, x.dtype), stat, stat


def _bn_kernel(x, weight, bias, running_mean, running_var, training, eps):
    dt = x.dtype
    x = _acc(x)
    c = x.shape[1]
    bshape = (1, c) + (1,) * (x.ndim - 2)
    if training:
        out, var, mean = _moments(x, (0,) + tuple(range(2, x.ndim)))
        scale = _rstd(var, eps)
        if weight is not None:
            scale = scale * weight.reshape(c)
        out *= scale.reshape(bshape)
        if bias is not None:
            out += bias.reshape(bshape)
    else:
        mean, var = running_mean.reshape(c).astype(x.dtype), running_var.reshape(c)
        scale = _rstd(var.astype(x.dtype), eps)
        if weight is not None:
            scale = scale * weight.reshape(c)
        shift = -mean * scale
        if bias is not None:
            shift = shift + bias.reshape(c)
        out = x * scale.reshape(bshape).astype(x.dtype)
        out += shift.reshape(bshape).astype(x.dtype)
    return out.astype(dt, copy=False), mean.astype(dt), var.astype(dt)


def _bn_grad(ctx, g, _gmean=None, _gvar=None):
    x, weight, bias, running_mean, running_var = ctx.inputs
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    training, eps = ctx.attrs["training"], ctx.attrs["eps"]
    if not STATE.enabled:  # a plain backward: one fused kernel (create_graph: below)
        dx, dw, db = dispatch(_BATCH_NORM_BACKWARD, g, x, weight, running_mean, running_var,
                              training=training, eps=eps)
        return (dx if need_x else None, dw if need_w else None, db if need_b else None,
                None, None)
    nd = x.dim()
    c = x.shape[1]
    dims = (0,) + tuple(range(2, nd))
    bshape = (1, c) + (1,) * (nd - 2)
    if training:
        var, mean = var_mean(x, dims, correction=0, keepdim=True)
    else:
        mean, var = running_mean.reshape(bshape), running_var.reshape(bshape)
    rstd = (var + eps).rsqrt()
    db = g.sum(dims) if (need_b or (training and need_x)) else None
    xhat = (x - mean) * rstd if (need_w or (training and need_x)) else None
    dwr = (g * xhat).sum(dims) if xhat is not None else None
    dx = None
    if need_x:
        k = rstd if weight is None else rstd * weight.reshape(bshape)
        if training:
            assert db is not None and dwr is not None  # computed whenever training needs dx
            m = x.numel() // max(c, 1)
            dx = k * (g - db.reshape(bshape) / m - xhat * (dwr.reshape(bshape) / m))
        else:
            dx = g * k
    return (dx, dwr if need_w else None, db if need_b else None, None, None)


# Synchronised batch norm: in training a split of any dim but the channels needs the
# statistics of the whole batch. Each tile computes its per-channel sums and they are
# all-reduced over the placement's group (two small all-reduces forward, one more for the
# gradients), so the result equals the single-process one.

def _bn_axes(ndim: int) -> tuple:
    return (0,) + tuple(range(2, ndim))


def _wrap(arr: np.ndarray, like: Tensor) -> Tensor:
    return Tensor._make(arr, like._dtype, like._device, tuple(arr.shape))


def _global_moments(x: np.ndarray, group) -> tuple[np.ndarray, np.ndarray, float]:
    """Mean and biased variance per channel over every tile of the group (two passes, as
    the single-process kernel: the centred sum of squares keeps its accuracy)."""
    comm = communicator()
    axes = _bn_axes(x.ndim)
    c = x.shape[1]
    acc = np.float64 if x.dtype != np.float64 else x.dtype
    local = np.concatenate([x.sum(axes, dtype=acc), [x.size // max(c, 1)]])
    total = comm.all_reduce(local, group)
    count = float(total[c])
    mean = total[:c] / count
    bshape = (1, c) + (1,) * (x.ndim - 2)
    d = x - mean.reshape(bshape).astype(x.dtype)
    var = comm.all_reduce((d * d).sum(axes, dtype=acc), group) / count
    return mean, var, count


def _bn_sync_forward(op, args, attrs, metas, group):
    x, weight, bias = args[0], args[1], args[2]
    xa = x._data
    c = xa.shape[1]
    bshape = (1, c) + (1,) * (xa.ndim - 2)
    mean, var, _ = _global_moments(xa, group)
    scale = 1.0 / np.sqrt(var + attrs["eps"])
    if weight is not None:
        scale = scale * weight._data.reshape(c)
    out = (xa - mean.reshape(bshape)) * scale.reshape(bshape)
    if bias is not None:
        out = out + bias._data.reshape(bshape)
    dt = xa.dtype
    return (_wrap(out.astype(dt, copy=False), x), _wrap(mean.astype(dt), x),
            _wrap(var.astype(dt), x))


def _bn_sbp(x, weight, bias, running_mean, running_var, training, eps):
    """In eval a per-channel affine map: batch or spatial split, or the channels split with
    every per-channel tensor split too. In training a batch or spatial split runs
    synchronised batch norm."""
    per_c = tuple(optional(m, B) for m in (weight, bias, running_mean, running_var))
    split_c = tuple(optional(m, S(0)) for m in (weight, bias, running_mean, running_var))
    dims = [d for d in range(len(x.shape)) if d != 1]
    local = _bn_sync_forward if training else None  # (eval returns the running stats)
    sigs = [Signature((S(d),) + per_c, (S(d), B, B), local) for d in dims]
    if len(x.shape) > 1:
        sigs.append(Signature((S(1),) + split_c, (S(1), S(0), S(0))))
    return sigs + [Signature((B,) + per_c, (B, B, B))]


def _norm_cost(per_element: int, affine=(1, 2)):
    """A normalisation: ``per_element`` operations per element of the input (the statistics'
    sums, centring, squares and scaling), one more for each of the affine parameters at
    input positions ``affine`` that is present (a multiply by the weight, an add of the
    bias)."""
    def rule(ins, outs, **attrs) -> cost.Cost:
        k = per_element + sum(1 for i in affine if ins[i] is not None)
        return cost.Cost(k * cost.numel(ins[0]), *cost.io(ins, outs))
    return rule


def _bn_cost(ins, outs, training, **attrs) -> cost.Cost:
    """Training: the mean (1), centring (1), the squared deviations' sum (2) and the scaling
    (1) per element; eval: one multiply-add per element (the affine parameters fold into
    the per-channel scale and shift)."""
    if training:
        return _norm_cost(5, affine=(2,))(ins, outs)
    return cost.Cost(2 * cost.numel(ins[0]), *cost.io(ins, outs))


_BATCH_NORM = defop("batch_norm", _bn_infer, _bn_kernel, grad=_bn_grad, nondiff_outputs=(1, 2),
                    sbp=SbpRule(_bn_sbp), cost=_bn_cost,
                    to_relax=_relax.batch_norm, to_jax=_jax.batch_norm)


def _bn_backward_infer(g, x, weight, running_mean, running_var, training, eps):
    stat = Meta((x.shape[1],), x.dtype)
    return Meta(x.shape, x.dtype), stat, stat


def _bn_backward_kernel(g, x, weight, running_mean, running_var, training, eps):
    """(dx, dweight, dbias) in one pass family: per-channel coefficients, then
    ``dx = k1 * g + k2 * xhat + k3``."""
    dt = x.dtype
    x, g = _acc(x), _acc(g)
    c = x.shape[1]
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = (1, c) + (1,) * (x.ndim - 2)
    src, dst = _subscripts(x.ndim, axes)
    if training:
        xhat, var, _ = _moments(x, axes)
    else:
        xhat = x - running_mean.reshape(bshape).astype(x.dtype)
        var = running_var.reshape(c).astype(x.dtype)
    rstd = _rstd(var, eps)
    xhat *= rstd.reshape(bshape)
    db = np.einsum(f"{src}->{dst}", g)
    dw = np.einsum(f"{src},{src}->{dst}", g, xhat)
    k = rstd if weight is None else rstd * weight.reshape(c)
    dx = g * k.reshape(bshape)
    if training:
        m = x.dtype.type(max(x.size // max(c, 1), 1))
        xhat *= (-k * dw / m).reshape(bshape)
        dx += xhat
        dx -= (k * db / m).reshape(bshape)
    return dx.astype(dt, copy=False), dw.astype(dt), db.astype(dt)


def _bn_sync_backward(op, args, attrs, metas, group):
    g, x, weight = args[0]._data, args[1]._data, args[2]
    c = x.shape[1]
    axes = _bn_axes(x.ndim)
    bshape = (1, c) + (1,) * (x.ndim - 2)
    mean, var, count = _global_moments(x, group)
    rstd = 1.0 / np.sqrt(var + attrs["eps"])
    xhat = (x - mean.reshape(bshape)) * rstd.reshape(bshape)
    local = np.concatenate([g.sum(axes, dtype=np.float64), (g * xhat).sum(axes,
                                                                            dtype=np.float64)])
    total = communicator().all_reduce(local, group)
    db, dw = total[:c], total[c:]
    k = rstd if weight is None else rstd * weight._data.reshape(c)
    dx = k.reshape(bshape) * (g - (db / count).reshape(bshape) -
                              xhat * (dw / count).reshape(bshape))
    dt = g.dtype
    like = args[0]
    return (_wrap(dx.astype(dt, copy=False), like), _wrap(dw.astype(dt), like),
            _wrap(db.astype(dt), like))


def _bn_backward_sbp(g, x, weight, running_mean, running_var, training, eps):
    """(dx, dweight, dbias): training's batch or spatial split is synchronised; in eval a
    split leaves the parameter gradients partial (and g partial passes through)."""
    per_c = tuple(optional(m, B) for m in (weight, running_mean, running_var))
    split_c = tuple(optional(m, S(0)) for m in (weight, running_mean, running_var))
    dims = [d for d in range(len(x.shape)) if d != 1]
    if training:
        sigs = [Signature((S(d), S(d)) + per_c, (S(d), B, B), _bn_sync_backward)
                for d in dims]
    else:
        sigs = [Signature((S(d), S(d)) + per_c, (S(d), P, P)) for d in dims]
        sigs.append(Signature((P, B) + per_c, (P, P, P)))
    sigs.append(Signature((S(1), S(1)) + split_c, (S(1), S(0), S(0))))
    return sigs + [Signature((B, B) + per_c, (B, B, B))]


def _bn_backward_cost(ins, outs, training, **attrs) -> cost.Cost:
    """xhat (training recomputes the statistics: 5, eval 2), dbias (1) and dweight (2)
    sums, dx = k * g (1) and, in training, the two correction terms (3), per element."""
    k = 12 if training else 6
    return cost.Cost(k * cost.numel(ins[1]), *cost.io(ins, outs))


# Only plain (not create_graph) backwards use it, so it has no derivative of its own.
_BATCH_NORM_BACKWARD = defop("batch_norm_backward", _bn_backward_infer, _bn_backward_kernel,
                             grad=None, sbp=SbpRule(_bn_backward_sbp), cost=_bn_backward_cost,
                             to_jax=_jax.batch_norm_backward,
                             to_relax=_relax.batch_norm_backward)


def batch_norm(x: Tensor, weight, bias, running_mean, running_var, *, training: bool,
               eps: float):
    """``(out, mean, var)``: normalise over every dim but dim 1. In training the batch's
    statistics are used and returned (biased variance); otherwise the running ones."""
    return dispatch(_BATCH_NORM, x, weight, bias, running_mean, running_var,
                    training=bool(training), eps=float(eps))


# ---- layer_norm --------------------------------------------------------------------------

def _check_trailing(x, normalized_shape, sep: str) -> None:
    k = len(normalized_shape)
    if k == 0:
        raise RuntimeError("Expected normalized_shape to be at least 1-dimensional, i.e., "
                           "containing at least one element, but got normalized_shape = []")
    if len(x.shape) < k or tuple(x.shape[len(x.shape) - k:]) != tuple(normalized_shape):
        raise RuntimeError(f"Given normalized_shape={list(normalized_shape)}, expected input "
                           f"with shape [*{sep}{', '.join(map(str, normalized_shape))}], but "
                           f"got input of size{list(x.shape)}")


def _ln_infer(x, weight, bias, normalized_shape, eps):
    _float_only(x, "LayerNormKernelImpl")
    for name, p in (("weight", weight), ("bias", bias)):
        if type(p) is Meta and tuple(p.shape) != tuple(normalized_shape):
            raise RuntimeError(f"Expected {name} to be of same shape as normalized_shape, but "
                               f"got {name} of shape {list(p.shape)} and normalized_shape = "
                               f"{list(normalized_shape)}")
    _check_trailing(x, normalized_shape, ", ")
    _same_dtype(x, weight, bias)
    return Meta(x.shape, x.dtype)


def _ln_kernel(x, weight, bias, normalized_shape, eps):
    dt = x.dtype
    x = _acc(x)
    k = len(normalized_shape)
    if x.size == 0:
        return np.empty(x.shape, dt)
    out, var, _ = _moments(x, _tail(x.ndim, k))
    out *= _rstd(var, eps).reshape(var.shape + (1,) * k)
    if weight is not None:
        out *= weight
    if bias is not None:
        out += bias
    return out.astype(dt, copy=False)


def _normalised_grad(x, gw, dims, eps):
    """d/dx of ``(x - mean) * rstd`` over ``dims`` applied to ``gw``, and ``xhat``."""
    var, mean = var_mean(x, dims, correction=0, keepdim=True)
    rstd = (var + eps).rsqrt()
    xhat = (x - mean) * rstd
    if gw is None:
        return None, xhat
    dx = rstd * (gw - gw.mean(dims, keepdim=True) - xhat * (gw * xhat).mean(dims, keepdim=True))
    return dx, xhat


def _ln_grad(ctx, g):
    x, weight, bias = ctx.inputs
    need_x, need_w, need_b = ctx.needs_input_grad
    if not STATE.enabled:  # a plain backward: one fused kernel (create_graph: below)
        dx, dw, db = dispatch(_LAYER_NORM_BACKWARD, g, x, weight, **ctx.attrs)
        return dx if need_x else None, dw if need_w else None, db if need_b else None
    k = len(ctx.attrs["normalized_shape"])
    nd = x.dim()
    gw = (g if weight is None else g * weight) if need_x else None
    dx, xhat = _normalised_grad(x, gw, _tail(nd, k), ctx.attrs["eps"])
    lead = _lead(nd, k)
    dw = _sum_over(g * xhat, lead) if need_w else None
    db = _sum_over(g, lead) if need_b else None
    return dx, dw, db


def _ln_sbp(x, weight, bias, normalized_shape, eps):
    """Split a leading (non-normalized) dim; weight and bias broadcast."""
    lead = len(x.shape) - len(normalized_shape)
    wb = (optional(weight, B), optional(bias, B))
    return [Signature((S(d),) + wb, (S(d),)) for d in range(lead)] + \
        [Signature((B,) + wb, (B,))]


def _row_stats(b, x, d, eps):
    """(x - mean, 1 / sqrt(var + eps)) over dims ``d``, as the NumPy kernel computes them."""
    xc = b.sub(x, b.mean(x, d))
    var = b.mean(b.mul(xc, xc), d)
    return xc, b.reciprocal(b.sqrt(b.add(var, eps)))


def _ln_decompose(b, x, w, bias, normalized_shape, eps):
    """layer_norm as reductions and elementwise ops (per row: reduce, reduce again, map),
    for the code generator to fuse."""
    nd = len(x.shape)
    d = tuple(range(nd - len(normalized_shape), nd))
    xc, rstd = _row_stats(b, x, d, eps)
    y = b.mul(xc, rstd)
    if w is not None:
        y = b.mul(y, w)
    if bias is not None:
        y = b.add(y, bias)
    return y


_LAYER_NORM = defop("layer_norm", _ln_infer, _ln_kernel, grad=_ln_grad, sbp=SbpRule(_ln_sbp),
                    decompose=_ln_decompose, cost=_norm_cost(5),
                    to_relax=_relax.layer_norm, to_jax=_jax.layer_norm)


def _ln_backward_infer(g, x, weight, normalized_shape, eps):
    stat = Meta(tuple(normalized_shape), x.dtype)
    return Meta(x.shape, x.dtype), stat, stat


def _ln_backward_kernel(g, x, weight, normalized_shape, eps):
    """(dx, dweight, dbias) with the rows of ``x`` flattened to (rows, features)."""
    dt = x.dtype
    n = _numel(normalized_shape)
    x2, g2 = _acc(x).reshape(-1, n), _acc(g).reshape(-1, n)
    xhat, var, _ = _moments(x2, (1,))
    rstd = _rstd(var, eps)[:, None]
    xhat *= rstd
    dw = np.einsum("ij,ij->j", g2, xhat)
    db = np.einsum("ij->j", g2)
    gw = g2 if weight is None else g2 * weight.reshape(n)
    scale = x2.dtype.type(1.0 / max(n, 1))
    c1 = np.einsum("ij->i", gw) * scale
    c2 = np.einsum("ij,ij->i", gw, xhat) * scale
    xhat *= c2[:, None]
    dx = gw - c1[:, None]
    dx -= xhat
    dx *= rstd
    shape = tuple(normalized_shape)
    return (dx.reshape(x.shape).astype(dt, copy=False), dw.reshape(shape).astype(dt),
            db.reshape(shape).astype(dt))


def _ln_backward_sbp(g, x, weight, normalized_shape, eps):
    """(dx, dweight, dbias): a split leading dim leaves the weight and bias grads partial."""
    lead = len(x.shape) - len(normalized_shape)
    w = optional(weight, B)
    return [Signature((S(d), S(d), w), (S(d), P, P)) for d in range(lead)] + \
        [Signature((B, B, w), (B, B, B)), Signature((P, B, w), (P, P, P))]


def _ln_backward_decompose(b, g, x, w, normalized_shape, eps):
    nd = len(x.shape)
    k = len(normalized_shape)
    d, lead = tuple(range(nd - k, nd)), tuple(range(nd - k))
    xc, rstd = _row_stats(b, x, d, eps)
    xhat = b.mul(xc, rstd)
    gw = g if w is None else b.mul(g, w)
    c1 = b.mean(gw, d)
    c2 = b.mean(b.mul(gw, xhat), d)
    dx = b.mul(b.sub(b.sub(gw, c1), b.mul(xhat, c2)), rstd)
    gx = b.mul(g, xhat)
    if not lead:  # one row: nothing to sum over
        return dx, gx, g
    return dx, b.sum(gx, lead, keepdim=False), b.sum(g, lead, keepdim=False)


def _ln_backward_cost(ins, outs, **attrs) -> cost.Cost:
    """xhat (5), dweight (2) and dbias (1) sums, the two row sums (3) and dx (4) per
    element, one more for g * weight."""
    k = 15 + (ins[2] is not None)
    return cost.Cost(k * cost.numel(ins[1]), *cost.io(ins, outs))


# Only plain (not create_graph) backwards use it, so it has no derivative of its own.
_LAYER_NORM_BACKWARD = defop("layer_norm_backward", _ln_backward_infer, _ln_backward_kernel,
                             grad=None, sbp=SbpRule(_ln_backward_sbp),
                             decompose=_ln_backward_decompose, cost=_ln_backward_cost,
                             to_jax=_jax.layer_norm_backward,
                             to_relax=_relax.layer_norm_backward)


def layer_norm(x: Tensor, weight, bias, *, normalized_shape, eps: float) -> Tensor:
    """Normalise over the trailing ``normalized_shape`` dims, then scale and shift."""
    return dispatch(_LAYER_NORM, x, weight, bias,
                    normalized_shape=tuple(int(s) for s in normalized_shape), eps=float(eps))


# ---- group_norm --------------------------------------------------------------------------

def _gn_infer(x, weight, bias, num_groups, eps):
    _float_only(x, "group_norm")
    if len(x.shape) < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received "
                           f"{len(x.shape)}")
    c = x.shape[1]
    if num_groups <= 0 or c % num_groups:
        raise RuntimeError(f"Expected number of channels in input to be divisible by "
                           f"num_groups, but got input of shape {list(x.shape)} and "
                           f"num_groups={num_groups}")
    for name, p in (("weight", weight), ("bias", bias)):
        if type(p) is Meta and (len(p.shape) != 1 or p.shape[0] != c):
            raise RuntimeError(f"Expected {name} to be a vector of size equal to the number "
                               f"of channels in input, but got {name} of shape "
                               f"{list(p.shape)} and input of shape {list(x.shape)}")
    _same_dtype(x, weight, bias)
    return Meta(x.shape, x.dtype)


def _gn_kernel(x, weight, bias, num_groups, eps):
    dt = x.dtype
    n, c = x.shape[:2]
    if x.size == 0:
        return np.empty(x.shape, dt)
    xr = _acc(x).reshape(n, num_groups, _numel(x.shape[1:]) // num_groups)
    out, var, _ = _moments(xr, (2,))
    out *= _rstd(var, eps)[..., None]
    out = out.reshape(n, c, _numel(x.shape[2:]))
    if weight is not None:
        out *= weight[:, None]
    if bias is not None:
        out += bias[:, None]
    return out.reshape(x.shape).astype(dt, copy=False)


def _gn_grad(ctx, g):
    x, weight, bias = ctx.inputs
    need_x, need_w, need_b = ctx.needs_input_grad
    groups = ctx.attrs["num_groups"]
    n, c = x.shape[:2]
    shape4 = (n, groups, c // groups, _numel(x.shape[2:]))
    x4, g4 = x.reshape(shape4), g.reshape(shape4)
    gw = None
    if need_x:
        gw = g4 if weight is None else g4 * weight.reshape(1, groups, c // groups, 1)
    dx, xhat = _normalised_grad(x4, gw, (2, 3), ctx.attrs["eps"])
    dw = (g4 * xhat).sum((0, 3)).reshape(c) if need_w else None
    db = g4.sum((0, 3)).reshape(c) if need_b else None
    return (dx.reshape(x.shape) if dx is not None else None), dw, db


def _gn_sbp(x, weight, bias, num_groups, eps):
    """Each sample is normalised alone: the batch split."""
    wb = (optional(weight, B), optional(bias, B))
    return [Signature((S(0),) + wb, (S(0),)), Signature((B,) + wb, (B,))]


_GROUP_NORM = defop("group_norm", _gn_infer, _gn_kernel, grad=_gn_grad, sbp=SbpRule(_gn_sbp),
                    cost=_norm_cost(5), to_jax=_jax.group_norm,
                    to_relax=_relax.group_norm)


def group_norm(x: Tensor, weight, bias, *, num_groups: int, eps: float) -> Tensor:
    """Normalise each group of ``C / num_groups`` channels of every sample."""
    return dispatch(_GROUP_NORM, x, weight, bias, num_groups=int(num_groups), eps=float(eps))


# ---- rms_norm ----------------------------------------------------------------------------

def _rms_infer(x, weight, normalized_shape, eps):
    _float_only(x, "rms_norm")
    _check_trailing(x, normalized_shape, "")
    if type(weight) is Meta and tuple(weight.shape) != tuple(normalized_shape):
        raise RuntimeError(f"Expected weight to be of same shape as normalized_shape, but got "
                           f"weight of shape {list(weight.shape)} and normalized_shape = "
                           f"{list(normalized_shape)}")
    return Meta(x.shape, x.dtype)


def _rms_kernel(x, weight, normalized_shape, eps):
    dt = x.dtype
    xa = _acc(x)
    k = len(normalized_shape)
    src, dst = _subscripts(xa.ndim, _tail(xa.ndim, k))
    n = _numel(normalized_shape)
    with np.errstate(all="ignore"):
        ms = np.einsum(f"{src},{src}->{dst}", xa, xa) / xa.dtype.type(max(n, 1))
        out = xa * _rstd(ms, eps).reshape(ms.shape + (1,) * k)
    if weight is not None:
        out *= weight
    return out.astype(dt, copy=False)


def _rms_grad(ctx, g):
    x, weight = ctx.inputs
    need_x, need_w = ctx.needs_input_grad
    k = len(ctx.attrs["normalized_shape"])
    dims = _tail(x.dim(), k)
    r = ((x * x).mean(dims, keepdim=True) + ctx.attrs["eps"]).rsqrt()
    dx = dw = None
    if need_x:
        gw = g if weight is None else g * weight
        dx = r * (gw - x * (r * r) * (gw * x).mean(dims, keepdim=True))
    if need_w:
        dw = _sum_over(g * x * r, _lead(x.dim(), k))
    return dx, dw


def _rms_sbp(x, weight, normalized_shape, eps):
    """Split a leading (non-normalized) dim; the weight broadcast."""
    lead = len(x.shape) - len(normalized_shape)
    w = optional(weight, B)
    return [Signature((S(d), w), (S(d),)) for d in range(lead)] + [Signature((B, w), (B,))]


def _rms_decompose(b, x, w, normalized_shape, eps):
    """rms_norm as the kernel computes it (a reduction, then a map), for the code generator
    to fuse."""
    nd = len(x.shape)
    d = tuple(range(nd - len(normalized_shape), nd))
    if _numel(normalized_shape) == 0:
        return None
    y = b.mul(x, b.reciprocal(b.sqrt(b.add(b.mean(b.mul(x, x), d), eps))))
    return y if w is None else b.mul(y, w)


# (the squares' sum (2) and the scaling (1) per element, one more for the weight)
_RMS_NORM = defop("rms_norm", _rms_infer, _rms_kernel, grad=_rms_grad, sbp=SbpRule(_rms_sbp),
                  cost=_norm_cost(3, affine=(1,)), to_relax=_relax.rms_norm,
                  to_jax=_jax.rms_norm, decompose=_rms_decompose)


def rms_norm(x: Tensor, weight, *, normalized_shape, eps: float) -> Tensor:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the trailing ``normalized_shape``."""
    return dispatch(_RMS_NORM, x, weight,
                    normalized_shape=tuple(int(s) for s in normalized_shape), eps=float(eps))
