"""Embedding lookups: ``embedding``, ``embedding_bag`` and ``one_hot``.

>>> import tessera
>>> import tessera.nn.functional as F
>>> F.embedding(tessera.tensor([[0, 2]]), tessera.eye(3)).shape
tessera.Size([1, 2, 3])
"""
from __future__ import annotations

import warnings

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.ops import embedding as _embedding_ops
from tessera.ops._util import ensure_tensor
from tessera.ops.flat_index import one_hot

__all__ = ["embedding", "embedding_bag", "one_hot"]


def _padding_index(padding_idx: int | None, num_embeddings: int) -> int:
    """PyTorch's normalisation of ``padding_idx``: negative counts from the end, -1 = none."""
    if padding_idx is None:
        return -1
    if padding_idx > 0 and padding_idx >= num_embeddings:
        raise AssertionError("Padding_idx must be within num_embeddings")
    if padding_idx < 0:
        if padding_idx < -num_embeddings:
            raise AssertionError("Padding_idx must be within num_embeddings")
        padding_idx = num_embeddings + padding_idx
    return padding_idx


def _renorm(weight: Tensor, input: Tensor, max_norm: float, norm_type: float) -> None:
    with no_grad():
        _embedding_ops.embedding_renorm_(weight, input, max_norm, norm_type)


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None,
              max_norm: float | None = None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """The rows of ``weight`` at ``input``. The ``padding_idx`` row gets no gradient;
    with ``max_norm``, the looked-up rows of ``weight`` are first rescaled in place to norm at
    most ``max_norm``; ``scale_grad_by_freq`` divides each row's gradient by its count in
    ``input``. ``sparse`` gradients are dense here.

    >>> import tessera
    >>> embedding(tessera.tensor([1]), tessera.eye(2)).tolist()
    [[0.0, 1.0]]
    """
    ensure_tensor("embedding", input)
    ensure_tensor("embedding", weight, "weight")
    if weight.dim() != 2:
        raise RuntimeError("'weight' must be 2-D")
    pad = _padding_index(padding_idx, weight.shape[0])
    if max_norm is not None:
        _renorm(weight, input, max_norm, norm_type)
    return _embedding_ops.embedding(weight, input, padding_idx=pad,
                             scale_grad_by_freq=scale_grad_by_freq)


_MODES = ("sum", "mean", "max")


def embedding_bag(input: Tensor, weight: Tensor, offsets: Tensor | None = None,
                  max_norm: float | None = None, norm_type: float = 2,
                  scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                  per_sample_weights: Tensor | None = None, include_last_offset: bool = False,
                  padding_idx: int | None = None) -> Tensor:
    """Sums, means or maxima of bags of embeddings, without building the per-index rows'
    tensor for the user: bags are the rows of a 2-d ``input``, or the slices of a 1-d
    ``input`` starting at ``offsets``. Entries equal to ``padding_idx`` are left out.
    """
    ensure_tensor("embedding_bag", input)
    ensure_tensor("embedding_bag", weight, "weight")
    if weight.dtype is D.int64 and input.dtype.is_floating_point:
        warnings.warn("Argument order of nn.functional.embedding_bag was changed. Usage "
                      "`embedding_bag(weight, input, ...)` is deprecated, and should now be "
                      "`embedding_bag(input, weight, ...)`.", stacklevel=2)
        weight, input = input, weight
    if per_sample_weights is not None and tuple(input.shape) != tuple(per_sample_weights.shape):
        raise ValueError(f"embedding_bag: If per_sample_weights ({per_sample_weights.shape}) "
                         f"is not None, then it must have the same shape as the input "
                         f"({input.shape})")
    if weight.dim() != 2:
        raise ValueError(f"weight has to be a 2D Tensor, but got Tensor of dimension "
                         f"{weight.dim()}")
    input, bags, n_bags, valid = _bags(input, offsets, include_last_offset)
    if per_sample_weights is not None:
        per_sample_weights = per_sample_weights.reshape(-1)
    if mode not in _MODES:
        raise ValueError("mode has to be one of sum, mean or max")
    if mode == "max" and scale_grad_by_freq:
        raise ValueError("max mode does not support scaling the gradient by the frequency")
    if mode == "max" and sparse:
        raise ValueError("max mode does not support sparse weights")
    if max_norm is not None:
        _renorm(weight, input, max_norm, norm_type)
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError(f"embedding_bag: per_sample_weights was not None. "
                                  f"per_sample_weights is only supported for mode='sum' (got "
                                  f"mode='{mode}'). Please open a feature request on GitHub.")
    _embedding_ops._check_indices(input, "embedding_bag")
    pad = _padding_index(padding_idx, weight.shape[0])
    return _reduce_bags(input, weight, bags, n_bags, valid, pad, mode, scale_grad_by_freq,
                        per_sample_weights)


def _bags(input: Tensor, offsets, include_last_offset: bool):
    """(flat indices, bag of each index, number of bags, entries inside some bag)."""
    from tessera.ops.creation import arange
    if input.dim() == 2:
        if offsets is not None:
            raise ValueError(f"if input is 2D, then offsets has to be None, as input is "
                             f"treated is a mini-batch of fixed length sequences. However, "
                             f"found offsets of type {type(offsets)}")
        b, length = input.shape
        bags = arange(b).repeat_interleave(length)
        return input.reshape(-1), bags, b, None
    if input.dim() != 1:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension "
                         f"{input.dim()}")
    if offsets is None:
        raise ValueError("offsets has to be a 1D Tensor but got None")
    if offsets.dim() != 1:
        raise ValueError("offsets has to be a 1D Tensor")
    _embedding_ops._check_indices(offsets, "embedding_bag")
    offs = [int(o) for o in offsets.tolist()]
    n = input.shape[0]
    if offs and offs[0] != 0:
        raise RuntimeError(f"offsets[0] has to be 0, i.e., the first sequence in the "
                           f"mini-batch has to start from position 0. However, got {offs[0]}")
    if offs and offs[-1] > n:
        raise RuntimeError(f"offsets[-1] can not be greater than input's length {n} but got "
                           f"offsets[-1] of {offs[-1]}")
    if any(b < a for a, b in zip(offs, offs[1:])):
        raise RuntimeError("embedding_bag: offsets must be non-decreasing")
    n_bags = max(len(offs) - 1, 0) if include_last_offset else len(offs)
    starts = offsets.narrow(0, 0, n_bags).to(D.int64)
    positions = arange(n)
    from tessera.ops.sorting import searchsorted
    bags = searchsorted(starts, positions, right=True) - 1
    valid = None
    if include_last_offset and offs:
        valid = positions < offs[-1]
    if n_bags == 0:
        valid = positions < 0
    return input, bags, n_bags, valid


def _reduce_bags(input, weight, bags, n_bags, valid, pad, mode, freq, psw):
    from tessera.ops.creation import zeros
    from tessera.ops.getitem import nonzero
    keep = valid
    if pad >= 0:
        keep = (input != pad) if keep is None else keep & (input != pad)
    if keep is not None:  # leave padding and out-of-bag entries out of every bag
        kept = nonzero(keep).reshape(-1)
        input, bags = input.index_select(0, kept), bags.index_select(0, kept)
        psw = psw.index_select(0, kept) if psw is not None else None
    rows = _embedding_ops.embedding(weight, input, padding_idx=pad, scale_grad_by_freq=freq)
    d = weight.shape[1]
    out = zeros((n_bags, d), dtype=weight.dtype)
    if mode == "max":
        index = bags.unsqueeze(1).expand(bags.shape[0], d)
        return out.scatter_reduce(0, index, rows, "amax", include_self=False)
    if psw is not None:
        rows = rows * psw.unsqueeze(1)
    out = out.index_add(0, bags, rows)
    if mode == "mean":
        counts = zeros((n_bags,), dtype=weight.dtype).index_add(
            0, bags, zeros(bags.shape, dtype=weight.dtype) + 1)
        out = out / counts.clamp_min(1).unsqueeze(1)
    return out
