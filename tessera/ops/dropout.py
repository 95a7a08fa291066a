"""The ``dropout`` op: ``x * keep * scale`` with a mask drawn from a seed attribute.

The mask is a pure function of the seed and the logical mask shape, never saved: the
backward (the same op on the gradient, since dropout is linear in its input) regenerates
the identical mask, so dropout keeps nothing alive between forward and backward (like a
counter-based RNG; the seed itself comes from a ``tessera.Generator``, so seeded programs
reproduce). Alpha dropout is the same op with a shift (``alpha_shift``).

On global tensors the seed is broadcast from the placement's first rank and each rank
takes its tile of the whole mask: a broadcast input gets one mask everywhere, a split
input exactly the tiles one process would draw (on any N-D placement too).

>>> import tessera
>>> from tessera.ops.dropout import dropout
>>> dropout(tessera.ones(4), p=0.0, seed=0, mask_shape=(4,), scale=1.0).tolist()
[1.0, 1.0, 1.0, 1.0]
"""
from __future__ import annotations

import numpy as np

from tessera._dispatch import dispatch, dispatch_inplace
from tessera._tensor import Tensor
from tessera.ops import cost
from tessera.ops.activation import tname
from tessera.ops.registry import Meta, defop
from tessera.sbp import (
    SbpRule,
    Signature,
    broadcast as B,
    communicator,
    partial_sum as P,
    split as S,
    split_range,
    tile_ranges,
)

__all__: list[str] = []

# SELU's negative saturation value (-scale * alpha): where alpha dropout sends dropped units
ALPHA = 1.7580993408473766


def _keep_mask(seed: int, shape, p: float) -> np.ndarray:
    """True with probability 1 - p, a pure function of ``seed``."""
    u = np.random.Generator(np.random.PCG64(seed)).random(tuple(shape), dtype=np.float32)
    return u >= np.float32(p)


def _dropout_infer(x, p, seed, mask_shape, scale, alpha_shift):
    if x.dtype.category < 2:
        raise RuntimeError(f"result type Float can't be cast to the desired output type "
                           f"{tname(x.dtype)}")
    return Meta(x.shape, x.dtype)


def _dropout_kernel(x, p, seed, mask_shape, scale, alpha_shift):
    out = np.empty(x.shape, x.dtype)
    _dropout_into(out, x, p, seed, mask_shape, scale, alpha_shift)
    return out


def _dropout_into(out, x, p, seed, mask_shape, scale, alpha_shift):
    keep = _keep_mask(seed, mask_shape, p)
    np.multiply(x, keep, out=out)
    out *= out.dtype.type(scale)
    if alpha_shift:  # dropped units go to -alpha * scale, then every unit shifts
        a = scale
        b = keep.astype(out.dtype)
        b -= 1
        b *= ALPHA * a
        b += ALPHA * a * p
        out += b


def _dropout_inplace(t, x, p, seed, mask_shape, scale, alpha_shift):
    _dropout_into(t, x, p, seed, mask_shape, scale, alpha_shift)


def _dropout_grad(ctx, g):
    a = dict(ctx.attrs)
    a["alpha_shift"] = False  # the shift is a constant: the gradient is the masked scale
    return (dispatch(_DROPOUT, g, **a),)


# ---- on global tensors -------------------------------------------------------------------

def _agreed_seed(seed: int, group) -> int:
    """The seed of the group's first rank (ranks whose generators differ still agree)."""
    comm = communicator()
    if len(group) == 1:
        return seed
    return int(comm.broadcast(np.array([seed], np.int64), group[0], group)[0])


def _apply_mask(x: Tensor, keep: np.ndarray, a: dict) -> Tensor:
    xa = x._data
    out = xa * keep
    out *= out.dtype.type(a["scale"])
    if a["alpha_shift"]:
        s = a["scale"]
        out += (keep.astype(out.dtype) - 1) * (ALPHA * s) + ALPHA * s * a["p"]
    out = out.astype(xa.dtype, copy=False)
    return Tensor._make(out, x._dtype, x._device, tuple(out.shape))


def _dropout_local(tile_dim):
    """The local computation of a signature splitting dim ``tile_dim`` (None: whole)."""
    def local(op, args, attrs, metas, group):
        x = args[0]
        a = dict(attrs, seed=_agreed_seed(attrs["seed"], group))
        if tile_dim is None:
            return dispatch(op, x, **a)
        # this rank's tile of the whole mask (a broadcast mask dim stays whole)
        mshape, full = tuple(a["mask_shape"]), metas[0].shape
        k = tile_dim - (len(full) - len(mshape))
        keep = _keep_mask(a["seed"], mshape, a["p"])
        if k >= 0 and mshape[k] != 1:
            i = group.index(communicator().rank)
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
    a = dict(attrs, seed=_agreed_seed(attrs["seed"], placement.flat_ranks))
    mshape, full = tuple(a["mask_shape"]), tuple(metas[0].shape)
    keep = _keep_mask(a["seed"], mshape, a["p"])
    lead = len(full) - len(mshape)
    ranges = tile_ranges(full, in_sbps[0], placement.coords(rank), placement.hierarchy)
    index = tuple(slice(None) if mshape[k] == 1 else slice(*ranges[k + lead])
                  for k in range(len(mshape)))
    return _apply_mask(args[0], keep[index], a)


def _dropout_sbp(x, p, seed, mask_shape, scale, alpha_shift):
    """Any split, each rank with its tile of the one mask; broadcast; partial_sum where
    dropout is linear (no shift: the gradient's case)."""
    n = len(x.shape)
    sigs = [Signature((S(d),), (S(d),), _dropout_local(d)) for d in range(n)]
    sigs.append(Signature((B,), (B,), _dropout_local(None)))
    if not alpha_shift:
        sigs.append(Signature((P,), (P,), _dropout_local(None)))
    return sigs


def _dropout_cost(ins, outs, alpha_shift=False, **attrs) -> cost.Cost:
    """Per element: the mask's draw and comparison, the product and the scaling (4), and
    alpha dropout's shift (2)."""
    return cost.Cost((6 if alpha_shift else 4) * cost.numel(outs[0]), *cost.io(ins, outs))


_DROPOUT = defop("dropout", _dropout_infer, _dropout_kernel, grad=_dropout_grad, save=(),
                 inplace_kernels={"cpu": _dropout_inplace},
                 sbp=SbpRule(_dropout_sbp, whole=_dropout_whole), cost=_dropout_cost)


def dropout(x: Tensor, *, p: float, seed: int, mask_shape, scale: float,
            alpha_shift: bool = False, inplace: bool = False) -> Tensor:
    """``x * keep * scale`` (``+ shift`` for alpha dropout) with ``keep`` drawn from
    ``seed`` in ``mask_shape`` (which broadcasts against ``x``: per-channel masks for
    feature dropout)."""
    attrs = dict(p=float(p), seed=int(seed), mask_shape=tuple(mask_shape), scale=float(scale),
                 alpha_shift=bool(alpha_shift))
    if inplace:
        return dispatch_inplace(_DROPOUT, x, x, **attrs)
    return dispatch(_DROPOUT, x, **attrs)
