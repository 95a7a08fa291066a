"""Loss functions of ``tessera.nn.functional``, with PyTorch's signatures, legacy
``size_average``/``reduce`` arguments, reductions, shape checks and messages.

``nll_loss`` and ``binary_cross_entropy`` are ops (``tessera.ops.loss``), ``ctc_loss`` is
one (``tessera.ops.ctc``); cross_entropy is
``log_softmax`` + ``nll_loss`` (plus the label-smoothing and class-probability terms); the
other losses are composites of tessera ops, written as PyTorch's ATen composites are.

>>> import tessera
>>> import tessera.nn.functional as F
>>> F.cross_entropy(tessera.tensor([[0., 0.]]), tessera.tensor([1]))
tensor(0.6931)
"""
from __future__ import annotations

import math
import warnings

from tessera import _dtype as D
from tessera._dtype import promote_types
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.ops import activation as A, ctc as CTC, loss as L, ternary
from tessera.ops._util import call
from tessera.ops.activation import tname
from tessera.ops.arithmetic import minimum
from tessera.ops.broadcast import broadcast_shapes, broadcast_tensors
from tessera.ops.creation import arange, ones_like, tensor, zeros as _zeros, zeros_like
from tessera.ops.ternary import where

__all__ = ["cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
           "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div",
           "poisson_nll_loss", "gaussian_nll_loss", "margin_ranking_loss",
           "hinge_embedding_loss", "soft_margin_loss", "multilabel_soft_margin_loss",
           "multilabel_margin_loss", "multi_margin_loss", "triplet_margin_loss",
           "triplet_margin_with_distance_loss", "cosine_embedding_loss", "ctc_loss"]

EPSILON = 1e-12  # cosine_embedding_loss's guard, as in ATen


# ---- reductions -------------------------------------------------------------------------------

def legacy_reduction(size_average, reduce, emit_warning: bool = True) -> str:
    """The reduction named by the deprecated ``size_average``/``reduce`` pair."""
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    ret = "mean" if size_average and reduce else "sum" if reduce else "none"
    if emit_warning:
        warnings.warn(f"size_average and reduce args will be deprecated, please use "
                      f"reduction='{ret}' instead.", stacklevel=3)
    return ret


def _reduction(size_average, reduce, reduction: str) -> str:
    """Legacy arguments win; the name is validated like ``_Reduction.get_enum``."""
    if size_average is not None or reduce is not None:
        reduction = legacy_reduction(size_average, reduce)
    if reduction == "elementwise_mean":
        warnings.warn("reduction='elementwise_mean' is deprecated. Please use reduction='mean' "
                      "instead.", stacklevel=3)
        return "mean"
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def _reduce(loss, reduction: str):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _warn_size(input, target) -> None:
    if tuple(target.shape) != tuple(input.shape):
        warnings.warn(f"Using a target size ({target.size()}) that is different to the input "
                      f"size ({input.size()}). This will likely lead to incorrect results due "
                      "to broadcasting. Please ensure they have the same size.", stacklevel=3)


def _need_float(kname: str, *tensors) -> None:
    dt = tensors[0].dtype
    for t in tensors[1:]:
        dt = promote_types(dt, t.dtype)
    if dt.category != 2:
        raise NotImplementedError(f"\"{kname}\" not implemented for '{tname(dt)}'")


# ---- classification ---------------------------------------------------------------------------

def nll_loss(input, target, weight=None, size_average=None, ignore_index: int = -100,
             reduce=None, reduction: str = "mean"):
    """Negative log likelihood of ``target`` classes under log-probabilities ``input``
    ((C,), (N, C) or (N, C, d1, ...)); 'mean' divides by the summed target weights."""
    reduction = _reduction(size_average, reduce, reduction)
    return L.nll_loss(input, target, weight, reduction, ignore_index)


def _class_weight(weight, ndim: int, class_dim: int):
    """``weight`` shaped to broadcast along the class dim of an ``ndim``-d input."""
    if ndim <= 1:
        return weight
    shape = [1] * ndim
    shape[class_dim] = weight.shape[0]
    return weight.reshape(shape)


def _ce_probs(input, target, weight, reduction, label_smoothing):
    class_dim = 0 if input.dim() == 1 else 1
    c = input.shape[class_dim]
    if weight is not None and (weight.dim() != 1 or weight.numel() != c):
        raise RuntimeError(f"cross_entropy: weight tensor should be defined either for all {c} "
                           f"classes or no classes but got weight tensor of shape: "
                           f"{list(weight.shape)}")
    logp = A.log_softmax(input, class_dim)
    if label_smoothing > 0.0:
        if label_smoothing > 1.0:
            raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: "
                               f"{label_smoothing}")
        target = target * (1 - label_smoothing) + label_smoothing / c
    prod = logp * target
    if weight is not None:
        prod = prod * _class_weight(weight, input.dim(), class_dim)
    if reduction == "none":
        return -prod.sum(class_dim)
    total = -prod.sum()
    if reduction == "sum":
        return total
    if input.numel() == 0:
        return total * math.nan
    return total / (input.numel() // c)


def _ce_smoothing(input, target, weight, reduction, ignore_index, label_smoothing):
    class_dim = 0 if input.dim() == 1 else 1
    logp = A.log_softmax(input, class_dim)
    nll = L.nll_loss(logp, target, weight, reduction, ignore_index)
    c = logp.shape[class_dim]
    ignore = target == ignore_index
    if weight is not None:
        smooth = -(logp * _class_weight(weight, input.dim(), class_dim)).sum(class_dim)
    else:
        smooth = -logp.sum(class_dim)
    smooth = smooth.masked_fill(ignore, 0.0)
    if reduction == "mean":
        if weight is not None:  # the summed weights of the kept targets (no data-dependent
            # shapes, so it runs on the meta device too)
            safe = target.masked_fill(ignore, 0).reshape(-1).long()
            kept = weight.index_select(0, safe).masked_fill(ignore.reshape(-1), 0)
            ret = smooth.sum() / kept.sum()
        else:
            ret = smooth.sum() / (~ignore).sum()
    else:
        ret = smooth.sum() if reduction == "sum" else smooth
    return (1 - label_smoothing) * nll + ret * (label_smoothing / c)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index: int = -100,
                  reduce=None, reduction: str = "mean", label_smoothing: float = 0.0):
    """Cross entropy between ``input`` logits and class-index or class-probability targets.

    >>> import tessera.nn.functional as F
    >>> F.cross_entropy(tessera.zeros(2, 4), tessera.tensor([0, 3]))
    tensor(1.3863)
    """
    reduction = _reduction(size_average, reduce, reduction)
    if tuple(input.shape) == tuple(target.shape):
        if target.dtype.category != 2:
            raise RuntimeError(f"Expected floating point type for target with class "
                               f"probabilities, got {tname(target.dtype)}")
        if ignore_index >= 0:
            raise RuntimeError("ignore_index is not supported for floating point target")
        return _ce_probs(input, target, weight, reduction, label_smoothing)
    if label_smoothing > 0.0:
        if label_smoothing > 1.0:
            raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: "
                               f"{label_smoothing}")
        return _ce_smoothing(input, target, weight, reduction, ignore_index, label_smoothing)
    class_dim = 0 if input.dim() == 1 else 1
    return L.nll_loss(A.log_softmax(input, class_dim), target, weight, reduction, ignore_index)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction: str = "mean"):
    """``-(t log x + (1 - t) log(1 - x))``, each log clamped at -100 like PyTorch."""
    reduction = _reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Using a target size ({target.size()}) that is different to the input "
                         f"size ({input.size()}) is deprecated. Please ensure they have the "
                         "same size.")
    if weight is not None:
        weight = weight.expand(broadcast_shapes(target.shape, weight.shape))
        if weight.dtype is not input.dtype:
            weight = weight.to(input.dtype)
    return L.binary_cross_entropy(input, target, weight, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction: str = "mean", pos_weight=None):
    """Sigmoid + binary cross entropy in one stable formula (``logsigmoid``)."""
    reduction = _reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Target size ({target.size()}) must be the same as input size "
                         f"({input.size()})")
    # ATen's formula with its in-place products: the weights never widen the dtype
    log_sig = call(A._LOGSIGMOID, input)
    if pos_weight is not None:
        log_sig = (log_sig * ((pos_weight - 1) * target + 1)).to(log_sig.dtype)
    loss = (1 - target) * input - log_sig
    if weight is not None:
        loss = (loss * weight).to(loss.dtype)
    return _reduce(loss, reduction)


def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None,
                                reduction: str = "mean"):
    """Per-class logistic loss averaged over the classes (the last dim)."""
    if size_average is not None or reduce is not None:
        reduction = legacy_reduction(size_average, reduce)
    logsig = call(A._LOGSIGMOID, input)
    logsig_neg = call(A._LOGSIGMOID, -input)
    loss = -(target * logsig + (1 - target) * logsig_neg)
    if weight is not None:
        loss = loss * weight
    class_dim = input.dim() - 1
    loss = loss.sum(dim=class_dim) / input.size(class_dim)
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(reduction + " is not valid")
    return _reduce(loss, reduction)


def _multi_margin_checks(input, target, weight):
    dims = input.dim()
    nframe = 1 if dims <= 1 else input.shape[0]
    dim = 1 if dims == 0 else input.shape[-1]
    if not ((dims <= 1 and input.numel() != 0) or (dims == 2 and input.shape[1] != 0)):
        raise RuntimeError(f"Expected non-empty vector or matrix with optional 0-dim batch "
                           f"size, but got: {list(input.shape)}")
    if target.dim() > 1 or target.numel() != nframe:
        raise RuntimeError(f"multi_margin_loss: target tensor should be 1-D with size equal to "
                           f"the number of input samples (batch size). Expected target size "
                           f"[{nframe}], but got {list(target.shape)}. Input has shape "
                           f"{list(input.shape)}.")
    if target.dtype is not D.int64:
        raise RuntimeError(f"expected scalar type Long but found {tname(target.dtype)}")
    if weight is not None and (weight.dim() > 1 or weight.numel() != dim):
        raise RuntimeError(f"inconsistent weight size, expected {dim} but got "
                           f"{list(weight.shape)}")
    _need_float("multi_margin_loss_cpu_kernel", input)
    return nframe, dim


def multi_margin_loss(input, target, p: int = 1, margin: float = 1.0, weight=None,
                      size_average=None, reduce=None, reduction: str = "mean"):
    """Multi-class hinge loss: ``sum_{j != y} max(0, margin - x[y] + x[j])^p / C``."""
    reduction = _reduction(size_average, reduce, reduction)
    if p != 1 and p != 2:
        raise ValueError("only p == 1 and p == 2 supported")
    if weight is not None and weight.dim() != 1:
        raise ValueError("weight must be one-dimensional")
    nframe, dim = _multi_margin_checks(input, target, weight)
    t = target.reshape(nframe)
    if nframe and ((t < 0) | (t >= dim)).any():
        raise RuntimeError("target out of range")
    x = input.reshape(nframe, dim)
    z = (margin - x.gather(1, t.unsqueeze(1)) + x).clamp_min(0)
    if p == 2:
        z = z * z
    if weight is not None:
        z = z * weight.reshape(dim)[t].unsqueeze(1)
    z = ternary.where(arange(dim) == t.unsqueeze(1), 0.0, z)
    loss = z.sum(1) / dim
    if reduction == "none":
        return loss if target.dim() > 0 else loss.reshape(())
    return _reduce(loss, reduction)


def multilabel_margin_loss(input, target, size_average=None, reduce=None,
                           reduction: str = "mean"):
    """Multi-label hinge loss: target classes (listed in ``target`` up to the first -1)
    against every non-target class."""
    reduction = _reduction(size_average, reduce, reduction)
    dims = input.dim()
    dim = 1 if dims == 0 else input.shape[-1]
    if not ((dims <= 1 and input.numel() != 0) or (dims == 2 and input.shape[1] != 0)):
        raise RuntimeError(f"Expected non-empty vector or matrix with optional 0-dim batch "
                           f"size, but got: {list(input.shape)}")
    if tuple(target.shape) != tuple(input.shape) and not (dims <= 1 and target.numel() == dim):
        raise RuntimeError(f"inconsistent target size: {list(target.shape)} for input of size: "
                           f"{list(input.shape)}")
    _need_float("multilabel_margin_loss_forward_out_frame", input)
    n = 1 if dims <= 1 else input.shape[0]
    x, t = input.reshape(n, dim), target.reshape(n, dim).long()
    listed = (t != -1).long().cumprod(1).bool()
    if ((t < -1) | (t >= dim)).any() or (listed & (t < 0)).any():
        raise RuntimeError(f"Expected all target indices in [-1, {dim - 1}]")
    idx = ternary.where(listed, t, 0)
    is_target = _zeros(n, dim).scatter_add(1, idx, listed.float()) > 0
    xj = x.gather(1, idx)
    z = (1 - xj.unsqueeze(2) + x.unsqueeze(1)).clamp_min(0)
    z = z * (listed.unsqueeze(2) & ~is_target.unsqueeze(1))
    loss = z.sum((1, 2)) / dim
    if reduction == "none":
        return loss if dims == 2 else loss.reshape(())
    return _reduce(loss, reduction)


# ---- regression -------------------------------------------------------------------------------

def _weighted(loss, weight, input, reduction):
    """mse/l1/huber's ``weight=`` path: 'mean' divides by the summed weights."""
    if tuple(weight.shape) != tuple(input.shape):
        raise ValueError("Weights and input must have the same size.")
    loss = loss * weight
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / weight.sum()
    raise ValueError(f"Invalid reduction mode: {reduction}. Expected one of 'none', 'mean', "
                     "'sum'.")


def mse_loss(input, target, size_average=None, reduce=None, reduction: str = "mean",
             weight=None):
    """Mean squared error."""
    _warn_size(input, target)
    if size_average is not None or reduce is not None:
        reduction = legacy_reduction(size_average, reduce)
    x, t = broadcast_tensors(input, target)
    if weight is not None:
        return _weighted((x - t) ** 2, weight, input, reduction)
    reduction = _reduction(None, None, reduction)
    _need_float("mse_cpu", input, target)
    return _reduce((x - t).square(), reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean",
            weight=None):
    """Mean absolute error."""
    _warn_size(input, target)
    if size_average is not None or reduce is not None:
        reduction = legacy_reduction(size_average, reduce)
    x, t = broadcast_tensors(input, target)
    if weight is not None:
        return _weighted((x - t).abs(), weight, input, reduction)
    reduction = _reduction(None, None, reduction)
    return _reduce((x - t).abs(), reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean",
                   beta: float = 1.0):
    """Quadratic below ``beta``, linear above (``0.5 z^2 / beta`` and ``z - beta / 2``)."""
    _warn_size(input, target)
    reduction = _reduction(size_average, reduce, reduction)
    x, t = broadcast_tensors(input, target)
    if beta == 0.0:
        return _reduce((x - t).abs(), reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    _need_float("smooth_l1_cpu", input, target)
    z = (x - t).abs()
    return _reduce(where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta), reduction)


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0, weight=None):
    """Quadratic below ``delta``, linear above (``0.5 z^2`` and ``delta (z - delta / 2)``)."""
    _warn_size(input, target)
    x, t = broadcast_tensors(input, target)
    if weight is None:
        reduction = _reduction(None, None, reduction)
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    _need_float("huber_cpu", input, target)
    z = (x - t).abs()
    loss = where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta))
    if loss.dtype is not input.dtype:  # ATen's huber writes into a tensor like the input
        loss = loss.to(input.dtype)
    if weight is None:
        return _reduce(loss, reduction)
    if tuple(weight.shape) != tuple(input.shape):
        raise ValueError("Weights and input must have the same size.")
    if reduction not in ("none", "mean", "sum"):  # huber's 'mean' is a plain mean
        raise ValueError(f"Invalid reduction mode: {reduction}. Expected one of 'none', "
                         "'mean', 'sum'.")
    return _reduce(loss * weight, reduction)


def _xlogy_self(t):
    """``t * log(t)`` with 0 at ``t == 0`` (``xlogy(t, t)``)."""
    return where(t == 0, 0.0, t * t.log())


def kl_div(input, target, size_average=None, reduce=None, reduction: str = "mean",
           log_target: bool = False):
    """Kullback-Leibler divergence of ``target`` from log-probabilities ``input``;
    'batchmean' divides the sum by the batch size."""
    if size_average is not None or reduce is not None:
        red = legacy_reduction(size_average, reduce)
    else:
        if reduction == "mean":
            warnings.warn("reduction: 'mean' divides the total loss by both the batch size and "
                          "the support size.'batchmean' divides only by the batch size, and "
                          "aligns with the KL div math definition.'mean' will be changed to "
                          "behave the same as 'batchmean' in the next major release.",
                          stacklevel=2)
        red = _reduction(None, None, "sum" if reduction == "batchmean" else reduction)
    if input.dtype.category < 2 or target.dtype.category < 2:
        raise RuntimeError("kl_div: Integral inputs not supported.")
    if log_target:
        out = target.exp() * (target - input)
    else:
        out = _xlogy_self(target) - target * input
    reduced = _reduce(out, red)
    if reduction == "batchmean" and input.dim() != 0:
        reduced = reduced / input.size(0)
    return reduced


def poisson_nll_loss(input, target, log_input: bool = True, full: bool = False,
                     size_average=None, eps: float = 1e-8, reduce=None,
                     reduction: str = "mean"):
    """Negative log likelihood of a Poisson target with mean ``exp(input)`` (``log_input``)
    or ``input``; ``full`` adds the Stirling term."""
    if size_average is not None or reduce is not None:
        reduction = legacy_reduction(size_average, reduce)
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(reduction + " is not a valid value for reduction")
    if log_input:
        loss = input.exp() - target * input
    else:
        loss = input - target * (input + eps).log()
    if full:
        stirling = target * target.log() - target + 0.5 * (2 * math.pi * target).log()
        loss = loss + stirling.masked_fill(target <= 1, 0)
    return _reduce(loss, reduction)


def _gaussian_var(input, var):
    if isinstance(var, float):
        if var < 0:
            raise ValueError("var has negative entry/entries")
        return var * ones_like(input)
    if not isinstance(var, Tensor):
        raise TypeError(f"any(): argument 'input' (position 1) must be Tensor, not "
                        f"{type(var).__name__}")
    if bool((var < 0).any()):
        raise ValueError("var has negative entry/entries")
    if tuple(var.shape) != tuple(input.shape):
        if tuple(input.shape[:-1]) == tuple(var.shape):
            var = var.unsqueeze(-1)
        elif not (input.dim() == var.dim() and
                  sum(y for x, y in zip(input.shape, var.shape) if x != y) == 1):
            raise ValueError("var is of incorrect size")
    return var


def gaussian_nll_loss(input, target, var, full: bool = False, eps: float = 1e-6,
                      reduction: str = "mean"):
    """Negative log likelihood of ``target`` under N(input, var); ``var`` is clamped at
    ``eps`` for the value only (its gradient passes unchanged, like PyTorch)."""
    var = _gaussian_var(input, var)
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(reduction + " is not valid")
    var = var.clone()
    with no_grad():
        var.clamp_(min=eps)
    loss = 0.5 * (var.log() + (input - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)


# ---- margins and embeddings -------------------------------------------------------------------

def margin_ranking_loss(input1, input2, target, margin: float = 0, size_average=None,
                        reduce=None, reduction: str = "mean"):
    """``max(0, -target * (input1 - input2) + margin)``."""
    reduction = _reduction(size_average, reduce, reduction)
    if input1.dim() != input2.dim() or input1.dim() != target.dim():
        raise RuntimeError(f"margin_ranking_loss : All input tensors should have same dimension "
                           f"but got sizes: input1: {input1.size()}, input2: {input2.size()}, "
                           f"target: {target.size()} ")
    return _reduce((-target * (input1 - input2) + margin).clamp_min(0), reduction)


def hinge_embedding_loss(input, target, margin: float = 1.0, size_average=None, reduce=None,
                         reduction: str = "mean"):
    """``x`` where target is 1, ``max(0, margin - x)`` where it is -1."""
    reduction = _reduction(size_average, reduce, reduction)
    zeros = zeros_like(input)
    margin_clamp = (margin - input).clamp_min(0)
    out = where(target != 1, margin_clamp, zeros) + where(target != -1, input, zeros)
    if input.dtype.category < 2:  # ATen keeps an integer input's dtype (its mean then fails)
        out = out.to(input.dtype)
    return _reduce(out, reduction)


def soft_margin_loss(input, target, size_average=None, reduce=None, reduction: str = "mean"):
    """``log(1 + exp(-target * input))``, in the input's dtype."""
    reduction = _reduction(size_average, reduce, reduction)
    z = -input * target
    if z.dtype is not input.dtype:
        z = z.to(input.dtype)
    if tuple(z.shape) != tuple(input.shape):
        raise RuntimeError(f"output with shape {list(input.shape)} doesn't match the broadcast "
                           f"shape {list(z.shape)}")
    return _reduce(z.exp().log1p(), reduction)


def cosine_embedding_loss(input1, input2, target, margin: float = 0, size_average=None,
                          reduce=None, reduction: str = "mean"):
    """``1 - cos(x1, x2)`` where target is 1, ``max(0, cos(x1, x2) - margin)`` where -1."""
    reduction = _reduction(size_average, reduce, reduction)
    td = target.dim()
    if td > 1:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    want = 2 if td == 1 else 1
    if input1.dim() != want or input2.dim() != want:
        raise RuntimeError(f"{td}D target tensor expects {want}D input tensors, but found inputs "
                           f"with sizes {list(input1.shape)} and {list(input2.shape)}.")
    prod_sum = (input1 * input2).sum(td)
    mag1 = (input1 * input1).sum(td) + EPSILON
    mag2 = (input2 * input2).sum(td) + EPSILON
    cos = prod_sum / (mag1 * mag2).sqrt()
    zeros = zeros_like(cos)
    out = where(target == 1, 1 - cos, zeros) + \
        where(target == -1, (cos - margin).clamp_min(0), zeros)
    return _reduce(out, reduction)


def triplet_margin_loss(anchor, positive, negative, margin: float = 1.0, p: float = 2,
                        eps: float = 1e-6, swap: bool = False, size_average=None, reduce=None,
                        reduction: str = "mean"):
    """``max(0, margin + d(a, p) - d(a, n))`` with the pairwise p-norm distance."""
    from tessera.nn.functional.distance import pairwise_distance
    reduction = _reduction(size_average, reduce, reduction)
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    _same_dims(anchor, positive, negative)
    dist_pos = pairwise_distance(anchor, positive, p, eps)
    dist_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        dist_neg = minimum(dist_neg, pairwise_distance(positive, negative, p, eps))
    return _reduce((margin + dist_pos - dist_neg).clamp_min(0), reduction)


def _same_dims(a, p, n) -> None:
    if not (a.dim() == p.dim() == n.dim()):
        raise RuntimeError(f"The anchor, positive, and negative tensors are expected to have the "
                           f"same number of dimensions, but got: anchor {a.dim()}D, positive "
                           f"{p.dim()}D, and negative {n.dim()}D inputs")


def triplet_margin_with_distance_loss(anchor, positive, negative, *, distance_function=None,
                                      margin: float = 1.0, swap: bool = False,
                                      reduction: str = "mean"):
    """``triplet_margin_loss`` with any distance function (pairwise_distance by default)."""
    from tessera.nn.functional.distance import pairwise_distance
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    _same_dims(anchor, positive, negative)
    dist = distance_function if distance_function is not None else pairwise_distance
    dist_pos = dist(anchor, positive)
    dist_neg = dist(anchor, negative)
    if swap:
        dist_neg = minimum(dist_neg, dist(positive, negative))
    return _reduce((margin + dist_pos - dist_neg).clamp_min(0), reduction)


# ---- sequences --------------------------------------------------------------------------------

def _ctc_lengths(input_lengths, target_lengths) -> tuple[tuple[int, ...], ...]:
    """Both lengths as tuples of ints: PyTorch takes two integral tensors or two int lists."""
    both = (input_lengths, target_lengths)
    if all(isinstance(v, Tensor) for v in both):
        for name, v in zip(("input_lengths", "target_lengths"), both):
            if v.dtype.category != 1:
                raise RuntimeError(f"{name} must be integral")
        return tuple(tuple(int(n) for n in v.reshape(-1).tolist()) for v in both)
    if all(isinstance(v, (list, tuple)) for v in both):
        try:
            return tuple(tuple(n.__index__() for n in v) for v in both)
        except AttributeError:
            pass
    raise TypeError("ctc_loss(): expected input_lengths and target_lengths both as tuples of "
                    f"ints or both as Tensors, got {type(input_lengths).__name__} and "
                    f"{type(target_lengths).__name__}")


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank: int = 0,
             reduction: str = "mean", zero_infinity: bool = False):
    """Connectionist temporal classification loss of (T, N, C) (or unbatched (T, C))
    log-probabilities against padded (N, S) or concatenated targets; 'mean' divides each
    sequence's loss by its target length, then averages. ``zero_infinity`` zeroes the
    infinite losses (and their gradients) of impossible alignments.

    >>> lp = tessera.full((2, 1, 2), 0.5).log()
    >>> ctc_loss(lp, tessera.tensor([[1]]), [2], [1])
    tensor(0.2877)
    """
    reduction = _reduction(None, None, reduction)
    il, tl = _ctc_lengths(input_lengths, target_lengths)
    batched = log_probs.dim() == 3
    lp = log_probs if batched else log_probs.unsqueeze(1)
    loss = CTC.ctc_loss(lp, targets, il, tl, blank, zero_infinity)
    if zero_infinity:
        loss = where(loss == math.inf, zeros_like(loss), loss)
    if reduction == "mean":
        lengths = tensor(tl, dtype=loss.dtype, device=loss.device).clamp_min(1)
        return (loss / lengths).mean()
    if reduction == "sum":
        return loss.sum()
    return loss if batched else loss.squeeze(0)
