"""Loss ops with their own kernels: nll_loss (the core of cross_entropy) and
binary_cross_entropy (PyTorch's log clamp at -100 and its exact gradients).

``nll_loss`` is linear in its input, so its backward op's gradient is ``nll_loss`` again:

    nll_loss(x, t, w)              grad: nll_loss_backward(g, t, w)
    nll_loss_backward(g, t, w)     grad: nll_loss(gg, t, w)

Inputs are (C,), (N, C) or (N, C, d1, ...) with targets (), (N,) or (N, d1, ...). Argument
handling (legacy size_average/reduce, reduction names) lives in ``tessera.nn.functional``.

>>> import tessera
>>> from tessera.ops.loss import nll_loss
>>> nll_loss(tessera.tensor([[-1., -2.]]), tessera.tensor([1]), None, reduction="mean")
tensor(2.)
"""
from __future__ import annotations

import threading

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera.ops import _jax, _relax, cost
from tessera.ops._sbp import optional
from tessera.ops._util import broadcast_shapes, call, numel
from tessera.ops.activation import need_tensor, tname, upcast
from tessera.ops.registry import Meta, defop
from tessera.ops.ternary import clamp
from tessera.ops.unary import logit
from tessera.sbp import (
    SbpRule,
    Signature,
    broadcast as B,
    communicator,
    partial_sum as P,
    split as S,
    step_serial,
)

__all__: list[str] = []


# ---- nll_loss ---------------------------------------------------------------------------------

def _check_nll_2d(x, t, w):
    """PyTorch's checks for (C,) and (N, C) inputs."""
    if len(t.shape) > 1:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if len(x.shape) == 1 and len(t.shape) == 1 and t.shape[0] != 1:
        raise ValueError(f"For 1D input, 1D target must have size 1, but got target size: "
                         f"{t.shape[0]}")
    c = x.shape[-1]
    if w is not None and (len(w.shape) != 1 or w.shape[0] != c):
        raise RuntimeError(f"weight tensor should be defined either for all {c} classes or no "
                           f"classes but got weight tensor of shape: {list(w.shape)}")
    return () if len(x.shape) == 1 else (x.shape[0],)


def _check_nll_nd(x, t, w):
    """PyTorch's checks for (N, C, d1, ...) inputs (nll_loss2d and its N-d reshape)."""
    if len(x.shape) == 4 and len(t.shape) != 3:
        raise RuntimeError("only batches of spatial targets supported (3D tensors) but got "
                           f"targets of dimension: {len(t.shape)}")
    out = (x.shape[0],) + tuple(x.shape[2:])
    if tuple(t.shape) != out:
        if len(x.shape) == 4:
            raise RuntimeError(f"size mismatch (got input: {list(x.shape)} , target: "
                               f"{list(t.shape)}")
        raise RuntimeError(f"Expected target size {list(out)}, got {list(t.shape)}")
    if w is not None and numel(w.shape) != x.shape[1]:
        raise RuntimeError("weight tensor should be defined either for all or no classes")
    return out


def _nll_infer(x, t, w, reduction="mean", ignore_index=-100):
    need_tensor("nll_loss", x)
    need_tensor("nll_loss", t, "target", 2)
    nd = len(x.shape)
    if nd < 1:
        raise ValueError(f"Expected 1 or more dimensions (got {nd})")
    if nd != 1 and x.shape[0] != (t.shape[0] if t.shape else 0):
        raise ValueError(f"Expected input batch_size ({x.shape[0]}) to match target batch_size "
                         f"({t.shape[0] if t.shape else 0}).")
    if t.dtype is not D.int64 and t.dtype is not D.uint8:
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {tname(t.dtype)}")
    if x.dtype.category != 2:
        raise NotImplementedError(f"\"nll_loss_out_frame\" not implemented for "
                                  f"'{tname(x.dtype)}'")
    out = _check_nll_2d(x, t, w) if nd <= 2 else _check_nll_nd(x, t, w)
    if w is not None and w.dtype is not x.dtype:
        raise RuntimeError(f"expected scalar type {tname(x.dtype)} but found {tname(w.dtype)}")
    return Meta(out if reduction == "none" else (), x.dtype)


def _layout(shape, t: np.ndarray):
    """(N, C, K) view sizes of an input of ``shape`` and the (N, K) targets."""
    if len(shape) == 1:
        return 1, shape[0], 1, t.reshape(1, 1)
    n, c = shape[0], shape[1]
    k = numel(shape[2:])
    return n, c, k, t.reshape(n, k)


def _picks(t2: np.ndarray, c: int, w, ignore_index: int, dtype):
    """Valid mask, safe class indices and per-element weights (0 where ignored)."""
    t2 = t2.astype(np.int64, copy=False)
    valid = t2 != ignore_index
    bad = valid & ((t2 < 0) | (t2 >= c))
    if bad.any():
        raise IndexError(f"Target {int(t2[bad][0])} is out of bounds.")
    safe = np.where(valid, t2, 0)
    if w is None:
        wt = valid.astype(dtype)
    else:
        wt = np.where(valid, upcast(w).reshape(-1)[safe] if c else 0, 0).astype(dtype)
    return valid, safe, wt


def _nll_kernel(x, t, w, reduction="mean", ignore_index=-100):
    x = upcast(x)
    if w is None and x.ndim == 2 and t.ndim == 1 and x.shape[1] and t.shape[0] == x.shape[0] \
            and t.shape[0] and not 0 <= ignore_index < x.shape[1]:
        picked = _picked_rows(x, t)
        if picked is not None:   # every target a class: no mask, no weights
            loss = np.negative(picked)
            if reduction == "none":
                return loss
            total = loss.sum(dtype=np.float64 if x.dtype == np.float32 else None)
            return total if reduction == "sum" else total / loss.shape[0]
    n, c, k, t2 = _layout(x.shape, t)
    valid, safe, wt = _picks(t2, c, w, ignore_index, x.dtype)
    if c and n * k:
        picked = np.take_along_axis(x.reshape(n, c, k), safe[:, None, :], axis=1)[:, 0, :]
    else:
        picked = np.zeros((n, k), x.dtype)
    with np.errstate(all="ignore"):
        loss = np.where(valid, -(picked * wt), 0).astype(x.dtype, copy=False)
        if reduction == "none":
            return loss.reshape(t.shape if x.ndim > 1 else ())
        total = loss.sum(dtype=np.float64 if x.dtype == np.float32 else None)
        if reduction == "sum":
            return total
        return total / wt.sum(dtype=np.float64 if x.dtype == np.float32 else None)


def _picked_rows(x: np.ndarray, t: np.ndarray):
    """``x[i, t[i]]`` for each row when every target is a class index of ``x``, else None
    (an ignored or out-of-range target: the general path masks or raises). A classifier's
    loss, in as few NumPy calls as it takes: in a compiled step it runs right after the
    last matrix product, with the caches full of that product's operands."""
    lo, hi = t.min(), t.max()
    if lo < 0 or hi >= x.shape[1]:
        return None
    return x[np.arange(x.shape[0]), t]


def _nll_grad(ctx, g):
    x, t, w = ctx.inputs
    a = ctx.attrs
    return (nll_loss_backward(g, t, w, tuple(x.shape), a.get("reduction", "mean"),
                              a.get("ignore_index", -100)), None, None)


# ---- nll_loss on a split batch --------------------------------------------------------------
# With reduction="mean" each rank sums its tile and divides by the global count of
# (weighted) targets, an all-reduce of one number, giving partial_sum: nothing is gathered.

def _global_count(t: np.ndarray, w, ignore_index: int, group, saved: bool = False) -> float:
    """The count (or the weight sum) of the targets that are not ``ignore_index`` over
    every rank of ``group``. ``saved``: backward's, the forward's value when it counted
    these very targets (PyTorch's nll_loss_backward takes the forward's total_weight too),
    instead of another all-reduce, which is a point where the ranks wait for each other.

    In a compiled step only a count of the same step is reused: its targets are alive
    until backward reads them, so their buffer holds them still; the next step may have
    other targets in that buffer."""
    wd = None if w is None else w._data
    key = (ignore_index, tuple(group), step_serial())
    cacheable = type(t) is np.ndarray
    counts = _counts()
    if saved and cacheable:
        for tt, ww, k, count in counts:
            if tt is t and ww is wd and k == key:
                return count
    valid = t != ignore_index
    if w is None:
        local = float(valid.sum())
    else:
        safe = np.where(valid, t, 0)
        local = float(np.where(valid, w._data.reshape(-1)[safe], 0).sum())
    count = float(communicator().all_reduce(np.array([local]), group)[0])
    if cacheable and not saved:
        counts.insert(0, (t, wd, key, count))
        del counts[4:]
    return count


_COUNTS = threading.local()


def _counts() -> list:
    """(targets, weights, key, count) of this thread's latest forwards, newest first (a
    thread's own: the simulated ranks of ``FakeWorld`` are threads, and one rank's entries
    must not push out another's, or that rank alone would all-reduce); the arrays are held
    so that an identity match cannot be a new array at a freed one's address."""
    if not hasattr(_COUNTS, "entries"):
        _COUNTS.entries = []
    return _COUNTS.entries


def _nll_mean_local(op, args, attrs, metas, group):
    x, t, w = args
    count = _global_count(t._data, w, attrs.get("ignore_index", -100), group)
    total = dispatch(op, x, t, w, **dict(attrs, reduction="sum"))
    return total / count


def _nll_mean_backward_local(op, args, attrs, metas, group):
    g, t, w = args
    count = _global_count(t._data, w, attrs.get("ignore_index", -100), group, saved=True)
    return dispatch(op, g / count, t, w, **dict(attrs, reduction="sum"))


def _nll_sbp(x, t, w, reduction="mean", ignore_index=-100):
    """``none``: the batch stays split; ``sum``: a split batch sums to partial_sum; ``mean``:
    each tile's sum over the global count of targets (one all-reduced number), partial."""
    wsig = optional(w, B)
    sigs = [Signature((B, B, wsig), (B,))]
    if len(x.shape) >= 2 and reduction in ("none", "sum"):
        sigs.insert(0, Signature((S(0), S(0), wsig), (S(0) if reduction == "none" else P,)))
    elif len(x.shape) >= 2:
        sigs.insert(0, Signature((S(0), S(0), wsig), (P,), _nll_mean_local))
    return sigs


def _nll_backward_sbp(g, t, w, shape, reduction="mean", ignore_index=-100):
    wsig = optional(w, B)
    sigs = [Signature((B, B, wsig), (B,)), Signature((P, B, wsig), (P,))]
    if len(shape) >= 2 and reduction in ("none", "sum"):
        sigs.insert(0, Signature((S(0) if reduction == "none" else B, S(0), wsig), (S(0),)))
    elif len(shape) >= 2:
        sigs.insert(0, Signature((B, S(0), wsig), (S(0),), _nll_mean_backward_local))
    return sigs


def _nll_cost(ins, outs, **attrs) -> cost.Cost:
    """Per target: the pick's weight and sign (2) and its share of the sum (1)."""
    return cost.Cost(3 * cost.numel(ins[1]), *cost.io(ins, outs))


def _nll_backward_cost(ins, outs, **attrs) -> cost.Cost:
    """Per target: its coefficient (2); the rest of the output is zeros."""
    return cost.Cost(2 * cost.numel(ins[1]), *cost.io(ins, outs))


_NLL = defop("nll_loss", _nll_infer, _nll_kernel, grad=_nll_grad, sbp=SbpRule(_nll_sbp),
             cost=_nll_cost, to_relax=_relax.nll_loss, to_jax=_jax.nll_loss)


def _nll_backward_infer(g, t, w, shape, reduction="mean", ignore_index=-100):
    return Meta(tuple(shape), g.dtype)


def _nll_backward_kernel(g, t, w, shape, reduction="mean", ignore_index=-100):
    g = upcast(g)
    n, c, k, t2 = _layout(shape, t)
    valid, safe, wt = _picks(t2, c, w, ignore_index, g.dtype)
    out = np.zeros((n, c, k), g.dtype)
    if not (c and n * k):
        return out.reshape(shape)
    with np.errstate(all="ignore"):
        if reduction == "none":
            coef = -g.reshape(n, k) * wt
        elif reduction == "sum":
            coef = -g * wt
        else:
            coef = (-g / wt.sum()) * wt
        coef = np.where(valid, coef, 0).astype(g.dtype, copy=False)
    np.put_along_axis(out, safe[:, None, :], coef[:, None, :], axis=1)
    return out.reshape(shape)


def _nll_backward_grad(ctx, gg):
    g, t, w = ctx.inputs
    a = ctx.attrs
    return (nll_loss(gg, t, w, a.get("reduction", "mean"), a.get("ignore_index", -100)),
            None, None)


_NLL_BACKWARD = defop("nll_loss_backward", _nll_backward_infer, _nll_backward_kernel,
                      grad=_nll_backward_grad,
                      sbp=SbpRule(_nll_backward_sbp, shape_attrs=("shape",)),
                      cost=_nll_backward_cost,
                      to_relax=_relax.nll_loss_backward, to_jax=_jax.nll_loss_backward)


def nll_loss(input, target, weight=None, reduction: str = "mean", ignore_index: int = -100):
    """The negative log likelihood of ``target`` classes under log-probabilities ``input``."""
    return call(_NLL, input, target, weight, reduction=reduction, ignore_index=ignore_index)


def nll_loss_backward(grad, target, weight, shape, reduction: str = "mean",
                      ignore_index: int = -100):
    """The gradient of ``nll_loss`` for an input of ``shape``: ``-weight[t] * grad`` at each
    target class (divided by the total weight for 'mean'), zero elsewhere."""
    return call(_NLL_BACKWARD, grad, target, weight, shape=tuple(shape), reduction=reduction,
                ignore_index=ignore_index)


# ---- binary_cross_entropy ---------------------------------------------------------------------

def _bce_infer(x, t, w, reduction="mean"):
    need_tensor("binary_cross_entropy", x)
    need_tensor("binary_cross_entropy", t, "target", 2)
    if x.dtype.category != 2:
        raise NotImplementedError(f"\"binary_cross_entropy\" not implemented for "
                                  f"'{tname(x.dtype)}'")
    if t.dtype is not x.dtype:
        raise RuntimeError(f"Found dtype {tname(t.dtype)} but expected {tname(x.dtype)}")
    if tuple(t.shape) != tuple(x.shape):
        raise RuntimeError(f"binary_cross_entropy: target shape {list(t.shape)} doesn't match "
                           f"input shape {list(x.shape)}")
    if w is not None:
        shape = broadcast_shapes("binary_cross_entropy", x.shape, w.shape)
        if shape != tuple(x.shape):
            raise RuntimeError(f"output with shape {list(x.shape)} doesn't match the broadcast "
                               f"shape {list(shape)}")
    return Meta(x.shape if reduction == "none" else (), x.dtype)


def _bce_kernel(x, t, w, reduction="mean"):
    x, t = upcast(x), upcast(t)
    if not ((x >= 0) & (x <= 1)).all():
        raise RuntimeError("all elements of input should be between 0 and 1")
    with np.errstate(all="ignore"):
        loss = (t - 1) * np.maximum(np.log1p(-x), -100) - t * np.maximum(np.log(x), -100)
        if w is not None:
            loss *= upcast(w).astype(loss.dtype, copy=False)
        if reduction == "none":
            return loss
        total = loss.sum()
        return total if reduction == "sum" else total / loss.size


def _bce_grad(ctx, g):
    """PyTorch's rules: d/dx = (x - t) / max(x (1 - x), 1e-12); d/dt = -logit(x)."""
    x, t, w = ctx.inputs
    reduction = ctx.attrs.get("reduction", "mean")
    scale = g / x.numel() if reduction == "mean" else g
    if w is not None:
        scale = scale * w
    need = ctx.needs_input_grad
    gx = scale * (x - t) / clamp((1 - x) * x, 1e-12) if need[0] else None
    gt = -logit(x) * scale if need[1] else None
    if gx is not None and tuple(gx.shape) != tuple(x.shape):
        gx = gx.expand(x.shape)
    if gt is not None and tuple(gt.shape) != tuple(t.shape):
        gt = gt.expand(t.shape)
    return gx, gt, None


def _bce_mean_local(op, args, attrs, metas, group):
    """``reduction="mean"`` on a tile: its sum over the logical element count."""
    count = int(np.prod(metas[0].shape))
    return dispatch(op, *args, **dict(attrs, reduction="sum")) / count


def _bce_sbp(x, t, w, reduction="mean"):
    """Elementwise in (x, t, w): split any dim (a weight that broadcasts on it whole);
    ``sum`` of a split is partial_sum, ``mean`` the tile's sum over the logical count."""
    n = len(x.shape)
    sigs = []
    for d in range(n):
        ws = None
        if w is not None:
            k = d - (n - len(w.shape))
            ws = S(k) if k >= 0 and w.shape[k] == x.shape[d] else B
        out = S(d) if reduction == "none" else P
        local = _bce_mean_local if reduction == "mean" else None
        sigs.append(Signature((S(d), S(d), ws), (out,), local))
    return sigs + [Signature((B, B, optional(w, B)), (B,))]


def _bce_cost(ins, outs, reduction="mean", **attrs) -> cost.Cost:
    """Per element: two logs, two clamps, two products and a sum (7), one more for the
    weight and one for the reduction."""
    k = 7 + (ins[2] is not None) + (reduction != "none")
    return cost.Cost(k * cost.numel(ins[0]), *cost.io(ins, outs))


_BCE = defop("binary_cross_entropy", _bce_infer, _bce_kernel, grad=_bce_grad,
             sbp=SbpRule(_bce_sbp), cost=_bce_cost, to_jax=_jax.binary_cross_entropy,
             to_relax=_relax.binary_cross_entropy)


def binary_cross_entropy(input, target, weight=None, reduction: str = "mean"):
    """``-(t log x + (1 - t) log(1 - x))`` with each log clamped at -100."""
    return call(_BCE, input, target, weight, reduction=reduction)
