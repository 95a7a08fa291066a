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

import numpy as np

from tessera import _dtype as D
from tessera.ops._util import broadcast_shapes, call, numel
from tessera.ops.activation import need_tensor, tname, upcast
from tessera.ops.registry import Meta, defop
from tessera.ops.ternary import clamp
from tessera.ops.unary import logit

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


def _nll_grad(ctx, g):
    x, t, w = ctx.inputs
    a = ctx.attrs
    return (nll_loss_backward(g, t, w, tuple(x.shape), a.get("reduction", "mean"),
                              a.get("ignore_index", -100)), None, None)


_NLL = defop("nll_loss", _nll_infer, _nll_kernel, grad=_nll_grad)


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
                      grad=_nll_backward_grad)


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


_BCE = defop("binary_cross_entropy", _bce_infer, _bce_kernel, grad=_bce_grad)


def binary_cross_entropy(input, target, weight=None, reduction: str = "mean"):
    """``-(t log x + (1 - t) log(1 - x))`` with each log clamped at -100."""
    return call(_BCE, input, target, weight, reduction=reduction)
