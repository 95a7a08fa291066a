"""SBP rules of the nn ops: convolution, normalisation, pooling, dropout, the mean losses,
padding, resampling and patches.

Filled into ``OpDef.sbp`` by ``sbp_rules`` (one table). The signatures on a 1-D mesh:

* ``conv``: batch split with broadcast weights (data parallel), output channels split with
  the weight split on dim 0 (its bias too), input channels split with the weight split on
  dim 1 giving partial_sum (groups == 1), and partial_sum input or weight (it is linear in
  each); ``conv_input_grad``/``conv_weight_grad`` are the same products read backwards.
* ``batch_norm``: in eval a per-channel affine map (batch/spatial split, or channels split
  with every per-channel tensor split too). In training a split of any dim but the channel
  one needs the statistics of the whole batch: the tile computes its sums and they are
  all-reduced (synchronised batch norm, two small all-reduces per call, and one more for
  the gradients), so the result equals the single-process one. ``group_norm`` and
  ``rms_norm`` normalise within a sample: batch (leading dims) split.
* pooling: batch or channel split.
* ``dropout``: the mask is a pure function of the seed attr and the logical mask shape, so
  the seed is broadcast from the placement's first rank and each rank takes its tile of
  the whole mask: a broadcast input gets one mask everywhere, a split input exactly the
  tiles one process would draw.
* ``nll_loss`` (cross-entropy) with ``reduction="mean"`` on a split batch: each rank sums
  its tile and divides by the global count of (weighted) targets, an all-reduce of one
  number, giving partial_sum; nothing is gathered. ``binary_cross_entropy`` is elementwise:
  any split, ``sum`` partial, ``mean`` the tile's sum over the logical element count.
* ``pad``/``constant_pad`` (and ``pad_backward``): split an unpadded dim; ``interpolate``
  (and its backward): batch or channel split; ``im2col``/``col2im``: batch split; all
  linear (partial_sum passes through; ``constant_pad`` only with a zero fill).
* ``ctc_loss`` (and its backward): the batch split, with padded 2-D targets; each rank
  passes its own sequences' lengths (attrs of the whole batch) to the kernel.
"""
from __future__ import annotations

import threading

import numpy as np

from tessera._tensor import Tensor
from tessera.distributed import comm as C
from tessera.distributed.graph_ops import step_serial
from tessera.sbp import (
    SbpRule,
    Signature,
    broadcast as B,
    partial_sum as P,
    split as S,
    split_range,
)

__all__ = ["NN_RULES"]


def _opt(m, s):
    """``s`` for a tensor argument, None for an absent one (bias=None)."""
    return None if m is None else s


def _wrap(arr: np.ndarray, like: Tensor) -> Tensor:
    return Tensor._make(arr, like._dtype, like._device, tuple(arr.shape))


# ---- convolution ---------------------------------------------------------------------------

def _conv(x, w, b, stride, pads, dilation, groups):
    sigs = [Signature((S(0), B, _opt(b, B)), (S(0),))]
    if groups == 1:
        sigs += [Signature((B, S(0), _opt(b, S(0))), (S(1),)),
                 Signature((S(1), S(1), _opt(b, P)), (P,))]
    return sigs + [Signature((P, B, _opt(b, P)), (P,)), Signature((B, P, _opt(b, P)), (P,)),
                   Signature((B, B, _opt(b, B)), (B,))]


def _conv_input_grad(g, w, input_shape, stride, pads, dilation, groups):
    sigs = [Signature((S(0), B), (S(0),))]
    if groups == 1:
        sigs += [Signature((S(1), S(0)), (P,)), Signature((B, S(1)), (S(1),))]
    return sigs + [Signature((P, B), (P,)), Signature((B, P), (P,)), Signature((B, B), (B,))]


def _conv_weight_grad(x, g, weight_shape, stride, pads, dilation, groups):
    sigs = [Signature((S(0), S(0)), (P,))]
    if groups == 1:
        sigs += [Signature((B, S(1)), (S(0),)), Signature((S(1), B), (S(1),))]
    return sigs + [Signature((P, B), (P,)), Signature((B, P), (P,)), Signature((B, B), (B,))]


# ---- batch norm ----------------------------------------------------------------------------

def _bn_axes(ndim: int) -> tuple:
    return (0,) + tuple(range(2, ndim))


def _global_moments(x: np.ndarray, group) -> tuple[np.ndarray, np.ndarray, float]:
    """Mean and biased variance per channel over every tile of the group (two passes, as
    the single-process kernel: the centred sum of squares keeps its accuracy)."""
    comm = C.current()
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


def _batch_norm(x, weight, bias, running_mean, running_var, training, eps):
    per_c = tuple(_opt(m, B) for m in (weight, bias, running_mean, running_var))
    split_c = tuple(_opt(m, S(0)) for m in (weight, bias, running_mean, running_var))
    dims = [d for d in range(len(x.shape)) if d != 1]
    local = _bn_sync_forward if training else None  # (eval returns the running stats)
    sigs = [Signature((S(d),) + per_c, (S(d), B, B), local) for d in dims]
    if len(x.shape) > 1:
        sigs.append(Signature((S(1),) + split_c, (S(1), S(0), S(0))))
    return sigs + [Signature((B,) + per_c, (B, B, B))]


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
    total = C.current().all_reduce(local, group)
    db, dw = total[:c], total[c:]
    k = rstd if weight is None else rstd * weight._data.reshape(c)
    dx = k.reshape(bshape) * (g - (db / count).reshape(bshape) -
                              xhat * (dw / count).reshape(bshape))
    dt = g.dtype
    like = args[0]
    return (_wrap(dx.astype(dt, copy=False), like), _wrap(dw.astype(dt), like),
            _wrap(db.astype(dt), like))


def _batch_norm_backward(g, x, weight, running_mean, running_var, training, eps):
    per_c = tuple(_opt(m, B) for m in (weight, running_mean, running_var))
    split_c = tuple(_opt(m, S(0)) for m in (weight, running_mean, running_var))
    dims = [d for d in range(len(x.shape)) if d != 1]
    if training:
        sigs = [Signature((S(d), S(d)) + per_c, (S(d), B, B), _bn_sync_backward)
                for d in dims]
    else:
        sigs = [Signature((S(d), S(d)) + per_c, (S(d), P, P)) for d in dims]
        sigs.append(Signature((P, B) + per_c, (P, P, P)))
    sigs.append(Signature((S(1), S(1)) + split_c, (S(1), S(0), S(0))))
    return sigs + [Signature((B, B) + per_c, (B, B, B))]


# ---- per-sample norms ----------------------------------------------------------------------

def _group_norm(x, weight, bias, num_groups, eps):
    wb = (_opt(weight, B), _opt(bias, B))
    return [Signature((S(0),) + wb, (S(0),)), Signature((B,) + wb, (B,))]


def _rms_norm(x, weight, normalized_shape, eps):
    lead = len(x.shape) - len(normalized_shape)
    w = _opt(weight, B)
    return [Signature((S(d), w), (S(d),)) for d in range(lead)] + [Signature((B, w), (B,))]


# ---- pooling -------------------------------------------------------------------------------

def _pool(nout: int, linear: bool):
    """(N, C, *S) pooling: batch or channel split; partial_sum where linear (avg)."""
    def rule(x, *rest, **attrs):
        sigs = [Signature((S(d),), (S(d),) * nout) for d in (0, 1)]
        sigs.append(Signature((B,), (B,) * nout))
        if linear:
            sigs.append(Signature((P,), (P,) * nout))
        return sigs
    return SbpRule(rule)


def _max_pool_backward(g, idx, input_shape):
    return [Signature((S(d), S(d)), (S(d),)) for d in (0, 1)] + \
        [Signature((P, B), (P,)), Signature((B, B), (B,))]


# ---- dropout -------------------------------------------------------------------------------

def _agreed_seed(seed: int, group) -> int:
    """The seed of the group's first rank (ranks whose generators differ still agree)."""
    comm = C.current()
    if len(group) == 1:
        return seed
    return int(comm.broadcast(np.array([seed], np.int64), group[0], group)[0])


def _dropout_local(tile_dim):
    def local(op, args, attrs, metas, group):
        from tessera._dispatch import dispatch
        from tessera.ops.nn_misc import _keep_mask
        x = args[0]
        a = dict(attrs, seed=_agreed_seed(attrs["seed"], group))
        if tile_dim is None:
            return dispatch(op, x, **a)
        # this rank's tile of the whole mask (a broadcast mask dim stays whole)
        mshape, full = tuple(a["mask_shape"]), metas[0].shape
        k = tile_dim - (len(full) - len(mshape))
        keep = _keep_mask(a["seed"], mshape, a["p"])
        if k >= 0 and mshape[k] != 1:
            i = group.index(C.current().rank)
            index = [slice(None)] * len(mshape)
            index[k] = slice(*split_range(full[tile_dim], len(group), i))
            keep = keep[tuple(index)]
        return _apply_mask(x, keep, a)
    return local


def _dropout_whole(op, args, attrs, metas, placement, in_sbps, rank):
    """Dropout on an N-D placement (``SbpRule.whole``): the seed of the placement's first
    rank, agreed by all of its ranks, and this rank's tile of the one mask, cut by every
    split of the input on every mesh axis (a broadcast mask dim stays whole); broadcast and
    partial_sum axes leave the mask whole."""
    from tessera.distributed.boxing import tile_ranges
    from tessera.ops.nn_misc import _keep_mask
    a = dict(attrs, seed=_agreed_seed(attrs["seed"], placement.flat_ranks))
    mshape, full = tuple(a["mask_shape"]), tuple(metas[0].shape)
    keep = _keep_mask(a["seed"], mshape, a["p"])
    lead = len(full) - len(mshape)
    ranges = tile_ranges(full, in_sbps[0], placement.coords(rank), placement.hierarchy)
    index = tuple(slice(None) if mshape[k] == 1 else slice(*ranges[k + lead])
                  for k in range(len(mshape)))
    return _apply_mask(args[0], keep[index], a)


def _apply_mask(x: Tensor, keep: np.ndarray, a: dict) -> Tensor:
    from tessera.ops.nn_misc import ALPHA
    xa = x._data
    out = xa * keep
    out *= out.dtype.type(a["scale"])
    if a["alpha_shift"]:
        s = a["scale"]
        out += (keep.astype(out.dtype) - 1) * (ALPHA * s) + ALPHA * s * a["p"]
    return _wrap(out.astype(xa.dtype, copy=False), x)


def _dropout(x, p, seed, mask_shape, scale, alpha_shift):
    n = len(x.shape)
    sigs = [Signature((S(d),), (S(d),), _dropout_local(d)) for d in range(n)]
    sigs.append(Signature((B,), (B,), _dropout_local(None)))
    if not alpha_shift:  # x * mask * scale is linear in x (the gradient's case)
        sigs.append(Signature((P,), (P,), _dropout_local(None)))
    return sigs


# ---- the mean loss -------------------------------------------------------------------------

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
    count = float(C.current().all_reduce(np.array([local]), group)[0])
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
    from tessera._dispatch import dispatch
    x, t, w = args
    count = _global_count(t._data, w, attrs.get("ignore_index", -100), group)
    total = dispatch(op, x, t, w, **dict(attrs, reduction="sum"))
    return total / count


def _nll_mean_backward_local(op, args, attrs, metas, group):
    from tessera._dispatch import dispatch
    g, t, w = args
    count = _global_count(t._data, w, attrs.get("ignore_index", -100), group, saved=True)
    return dispatch(op, g / count, t, w, **dict(attrs, reduction="sum"))


def nll_mean_signature(w, backward: bool) -> Signature:
    """``reduction="mean"`` on a split batch: local sums over the global count."""
    if backward:
        return Signature((B, S(0), _opt(w, B)), (S(0),), _nll_mean_backward_local)
    return Signature((S(0), S(0), _opt(w, B)), (P,), _nll_mean_local)


# ---- padding, resampling, patches -----------------------------------------------------

def _unpadded(ndim: int, pads) -> list[int]:
    """Dims that ``pads`` (pairs for the trailing dims) leaves alone."""
    lead = ndim - len(pads)
    return [d for d in range(ndim) if d < lead or not any(pads[d - lead])]


def _pad(x, pads, mode):
    """Reflect/replicate/circular padding: split an unpadded dim; linear (each output
    element is one input element)."""
    return [Signature((S(d),), (S(d),)) for d in _unpadded(len(x.shape), pads)] + \
        [Signature((B,), (B,)), Signature((P,), (P,))]


def _constant_pad(x, pads, value):
    sigs = [Signature((S(d),), (S(d),)) for d in _unpadded(len(x.shape), pads)]
    sigs.append(Signature((B,), (B,)))
    if value == 0:  # (a nonzero fill would be counted once per rank)
        sigs.append(Signature((P,), (P,)))
    return sigs


def _pad_backward(g, input_shape, pads, mode):
    return [Signature((S(d),), (S(d),)) for d in _unpadded(len(input_shape), pads)] + \
        [Signature((B,), (B,)), Signature((P,), (P,))]


def _batch_channel(linear: bool, channels: bool = True):
    """(N, C, *spatial) ops that treat each sample (and channel) alone: batch or channel
    split; partial_sum passes through where linear (interpolation, im2col, col2im)."""
    def rule(x, *rest, **attrs):
        sigs = [Signature((S(d),), (S(d),)) for d in ((0, 1) if channels else (0,))]
        sigs.append(Signature((B,), (B,)))
        if linear:
            sigs.append(Signature((P,), (P,)))
        return sigs
    return rule


# ---- binary cross-entropy -----------------------------------------------------------------

def _bce_mean_local(op, args, attrs, metas, group):
    """``reduction="mean"`` on a tile: its sum over the logical element count."""
    from tessera._dispatch import dispatch
    count = int(np.prod(metas[0].shape))
    return dispatch(op, *args, **dict(attrs, reduction="sum")) / count


def _binary_cross_entropy(x, t, w, reduction="mean"):
    """Elementwise in (x, t, w): split any dim (a weight that broadcasts on it whole);
    ``sum`` of a split is partial_sum, ``mean`` the tile's sum over the logical count."""
    n = len(x.shape)
    sigs = []
    for d in range(n):
        k = None if w is None else d - (n - len(w.shape))
        ws = None if w is None else (S(k) if k >= 0 and w.shape[k] == x.shape[d] else B)
        out = S(d) if reduction == "none" else P
        local = _bce_mean_local if reduction == "mean" else None
        sigs.append(Signature((S(d), S(d), ws), (out,), local))
    return sigs + [Signature((B, B, _opt(w, B)), (B,))]


# ---- ctc loss ------------------------------------------------------------------------------

def _ctc_local(op, args, attrs, metas, group):
    """A tile of the batch: its own sequences' lengths (the attrs hold the whole batch's)."""
    from tessera._dispatch import dispatch
    n = len(attrs["input_lengths"])
    lo, hi = split_range(n, len(group), group.index(C.current().rank))
    return dispatch(op, *args, **dict(attrs, input_lengths=attrs["input_lengths"][lo:hi],
                                      target_lengths=attrs["target_lengths"][lo:hi]))


def _ctc_loss(lp, tg, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """Per-sequence losses: the batch split ((T, N, C) log-probs on dim 1, padded (N, S)
    targets on dim 0; concatenated 1-D targets stay whole)."""
    sigs = [Signature((B, B), (B,))]
    if len(tg.shape) == 2:
        sigs.insert(0, Signature((S(1), S(0)), (S(0),), _ctc_local))
    return sigs


def _ctc_loss_backward(g, lp, tg, input_lengths, target_lengths, blank=0,
                       zero_infinity=False):
    sigs = [Signature((B, B, B), (B,)), Signature((P, B, B), (P,))]  # linear in g
    if len(tg.shape) == 2:
        sigs.insert(0, Signature((S(0), S(1), S(0)), (S(1),), _ctc_local))
    return sigs


NN_RULES: dict[str, SbpRule] = {
    "conv": SbpRule(_conv),
    "conv_input_grad": SbpRule(_conv_input_grad, shape_attrs=("input_shape",)),
    "conv_weight_grad": SbpRule(_conv_weight_grad, shape_attrs=("weight_shape",)),
    "batch_norm": SbpRule(_batch_norm),
    "batch_norm_backward": SbpRule(_batch_norm_backward),
    "group_norm": SbpRule(_group_norm),
    "rms_norm": SbpRule(_rms_norm),
    "max_pool": _pool(2, False), "max_pool_values": _pool(1, False),
    "adaptive_max_pool": _pool(2, False), "avg_pool": _pool(1, True),
    "avg_pool_backward": SbpRule(_pool(1, True).signatures, shape_attrs=("input_shape",)),
    "max_pool_backward": SbpRule(_max_pool_backward, shape_attrs=("input_shape",)),
    "dropout": SbpRule(_dropout, whole=_dropout_whole),
    "pad": SbpRule(_pad), "constant_pad": SbpRule(_constant_pad),
    "pad_backward": SbpRule(_pad_backward, shape_attrs=("input_shape",)),
    "interpolate": SbpRule(_batch_channel(True)),
    "interpolate_backward": SbpRule(_batch_channel(True), shape_attrs=("input_shape",)),
    "im2col": SbpRule(_batch_channel(True, channels=False)),
    "col2im": SbpRule(_batch_channel(True, channels=False)),
    "binary_cross_entropy": SbpRule(_binary_cross_entropy),
    "ctc_loss": SbpRule(_ctc_loss), "ctc_loss_backward": SbpRule(_ctc_loss_backward),
}
