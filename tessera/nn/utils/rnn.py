"""``nn.utils.rnn``: padding variable-length sequences into one batch tensor and back, and
``PackedSequence``, the time-major packing the recurrent layers accept.

A PackedSequence stores the sequences of a batch sorted by decreasing length, time step by
time step: ``data`` holds step 0 of every sequence, then step 1 of those at least 2 long...,
and ``batch_sizes[t]`` says how many sequences are still running at step t. Packing and
unpacking are one ``index_select`` each (gradients flow back through both).

>>> import tessera
>>> from tessera.nn.utils.rnn import pack_sequence, pad_sequence
>>> pad_sequence([tessera.ones(2), tessera.ones(3)], batch_first=True).shape
tessera.Size([2, 3])
>>> pack_sequence([tessera.tensor([1., 2.]), tessera.tensor([3.])]).batch_sizes
tensor([2, 1])
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.ops.creation import full, tensor
from tessera.ops.shape import cat, stack

__all__ = ["PackedSequence", "pack_padded_sequence", "pad_packed_sequence", "pack_sequence",
           "unpack_sequence", "pad_sequence", "unpad_sequence", "invert_permutation"]


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """Stack tensors of shape (L_i, *) into (max L, B, *), or (B, max L, *) with
    ``batch_first``, filling with ``padding_value`` on the ``padding_side``. The result has
    the first sequence's dtype; gradients flow back to every sequence.

    >>> pad_sequence([tessera.ones(1), tessera.ones(2)], padding_side="left").tolist()
    [[0.0, 1.0], [1.0, 1.0]]
    """
    from tessera.nn.functional import pad
    if not isinstance(sequences, Iterable):
        raise RuntimeError(f"pad_sequence: Expected iterable for input sequences, but got arg "
                           f"of type: {type(sequences)}")
    sequences = tuple(sequences)
    if not sequences:
        raise RuntimeError("received an empty list of sequences")
    if padding_side not in ("left", "right"):
        raise RuntimeError(f"Expected padding_side to be one of left or right, but got "
                         f"{padding_side}.")
    first = sequences[0]
    if first.dim() == 0:
        raise RuntimeError("pad_sequence: expected sequences of at least one dimension (the "
                           "sequence length), got a 0-d tensor")
    trailing = tuple(first.shape[1:])
    dtype = first.dtype
    value = padding_value if dtype.is_floating_point else (
        bool(padding_value) if dtype is D.bool_ else int(padding_value))
    max_len = max(s.size(0) for s in sequences)
    rows = []
    for s in sequences:
        if s.dim() == 0 or tuple(s.shape[1:]) != trailing:
            raise RuntimeError(f"pad_sequence: every sequence must have the trailing shape "
                               f"{list(trailing)} of the first one, got {list(s.shape)}")
        s = s.to(dtype) if s.dtype != dtype else s
        n = max_len - s.size(0)
        if n:
            widths = [0, 0] * len(trailing) + ([0, n] if padding_side == "right" else [n, 0])
            s = pad(s, widths, value=value)
        rows.append(s)
    return stack(rows, dim=0 if batch_first else 1)


def unpad_sequence(padded_sequences: Tensor, lengths, batch_first: bool = False) -> list:
    """The inverse of :func:`pad_sequence` (for right padding): a list of the sequences
    ``padded[:lengths[i]]``. Unlike PyTorch, which transposes ``padded_sequences`` in place
    when ``batch_first`` is False, the input is left untouched.
    """
    if not batch_first:
        padded_sequences = padded_sequences.transpose(0, 1)
    return [seq[:int(n)] for seq, n in zip(padded_sequences, lengths, strict=True)]


# ---- PackedSequence ----------------------------------------------------------------------------

class PackedSequence_(NamedTuple):
    data: Tensor
    batch_sizes: Tensor
    sorted_indices: Tensor | None
    unsorted_indices: Tensor | None


def invert_permutation(permutation: Tensor | None) -> Tensor | None:
    """The inverse of a permutation of 0..n-1 (None stays None)."""
    if permutation is None:
        return None
    p = np.asarray(permutation.tolist(), np.int64)
    inv = np.empty_like(p)
    inv[p] = np.arange(p.size)
    return tensor(inv, device=permutation.device)


class PackedSequence(PackedSequence_):
    """A batch of variable-length sequences packed time step by time step (see the module
    docstring). Build it with :func:`pack_padded_sequence` or :func:`pack_sequence`, not
    by hand; ``sorted_indices`` is the order the sequences were sorted into (None if they
    came sorted) and ``unsorted_indices`` its inverse."""

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if unsorted_indices is None:
            unsorted_indices = invert_permutation(sorted_indices)
        if batch_sizes is None:   # PyTorch's old calling form: PackedSequence((data, sizes))
            data, batch_sizes = data[0], data[1]
        if batch_sizes.device.type != "cpu":
            raise ValueError("batch_sizes should always be on CPU. Instances of "
                             "PackedSequence should never be created manually. They should "
                             "be instantiated by functions like pack_sequence and "
                             "pack_padded_sequences in nn.utils.rnn.")
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def to(self, *args, **kwargs) -> PackedSequence:
        """``data`` moved/cast like ``Tensor.to``; the indices follow its device."""
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self
        idx = [None if i is None else i.to(data.device)
               for i in (self.sorted_indices, self.unsorted_indices)]
        return type(self)(data, self.batch_sizes, *idx)

    def cpu(self) -> PackedSequence:
        return self.to("cpu")

    def double(self) -> PackedSequence:
        return self.to(dtype=D.float64)

    def float(self) -> PackedSequence:
        return self.to(dtype=D.float32)

    def half(self) -> PackedSequence:
        return self.to(dtype=D.float16)

    def long(self) -> PackedSequence:
        return self.to(dtype=D.int64)

    def int(self) -> PackedSequence:
        return self.to(dtype=D.int32)

    @property
    def is_cuda(self) -> bool:
        return self.data.device.type == "cuda"

    def is_pinned(self) -> bool:
        return False


def _lengths_array(lengths) -> np.ndarray:
    if isinstance(lengths, Tensor):
        if lengths.dim() != 1:
            raise RuntimeError(f"'lengths' argument should be a 1D CPU int64 tensor, but got "
                               f"{lengths.dim()}D {lengths.device.type} tensor")
        return np.asarray(lengths.tolist()).astype(np.int64)
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise RuntimeError(f"'lengths' argument should be a 1D CPU int64 tensor, but got "
                           f"{arr.ndim}D cpu Long tensor")
    return arr.astype(np.int64)


def _packed_rows(lengths: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """For sorted ``lengths``: the batch size of each time step and, in packed order, the
    row ``t * B + b`` of each (t, b) with t < lengths[b] in a (steps, B) time-major grid."""
    batch_sizes = (lengths[None, :] > np.arange(int(lengths[0]))[:, None]).sum(1)
    t, b = np.nonzero(np.arange(steps)[:, None] < lengths[None, :])
    return batch_sizes.astype(np.int64), t * lengths.size + b


def pack_padded_sequence(input: Tensor, lengths, batch_first: bool = False,
                         enforce_sorted: bool = True) -> PackedSequence:
    """Pack a padded (T, B, *) batch (B, T, * with ``batch_first``) of sequences of the
    given lengths. With ``enforce_sorted`` the lengths must be decreasing; otherwise the
    batch is sorted here and ``sorted_indices`` records how.

    >>> x = tessera.tensor([[1., 3.], [2., 0.]])          # two sequences, time-major
    >>> pack_padded_sequence(x, [2, 1]).data
    tensor([1., 3., 2.])
    """
    lengths = _lengths_array(lengths)
    sorted_indices = None
    if not enforce_sorted:
        order = np.argsort(-lengths, kind="stable")
        lengths = lengths[order]
        sorted_indices = tensor(order, device=input.device)
        input = input.index_select(0 if batch_first else 1, sorted_indices)
    x = input.transpose(0, 1) if batch_first else input
    if x.numel() == 0:
        raise RuntimeError("Cannot pack empty tensors.")
    steps, batch = x.shape[0], x.shape[1]
    if lengths.size != batch:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got "
                           f"{lengths.size} (batch_size={batch})")
    if lengths[-1] <= 0:
        raise RuntimeError("Length of all samples has to be greater than 0, but found an "
                           "element in 'lengths' that is <= 0")
    if np.any(lengths[1:] > lengths[:-1]):
        raise RuntimeError("`lengths` array must be sorted in decreasing order when "
                           "`enforce_sorted` is True. You can pass `enforce_sorted=False` to "
                           "pack_padded_sequence and/or pack_sequence to sidestep this "
                           "requirement if you do not need ONNX exportability.")
    if lengths[0] > steps:   # PyTorch builds an inconsistent PackedSequence here
        raise RuntimeError(f"pack_padded_sequence: a length of {lengths[0]} exceeds the "
                           f"{steps} time steps of the input")
    batch_sizes, rows = _packed_rows(lengths, steps)
    flat = x.reshape((steps * batch,) + tuple(x.shape[2:]))
    data = flat.index_select(0, tensor(rows, device=x.device))
    return PackedSequence(data, tensor(batch_sizes), sorted_indices, None)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False,
                        padding_value: float = 0.0, total_length: int | None = None):
    """The inverse of :func:`pack_padded_sequence`: ``(padded, lengths)``, in the original
    batch order, padded with ``padding_value`` to ``total_length`` steps if given.

    >>> p = pack_sequence([tessera.tensor([1., 2.]), tessera.tensor([3.])])
    >>> pad_packed_sequence(p, batch_first=True)
    (tensor([[1., 2.],
            [3., 0.]]), tensor([2, 1]))
    """
    data, batch_sizes = sequence.data, sequence.batch_sizes
    sizes = np.asarray(batch_sizes.tolist(), np.int64)
    steps = sizes.size
    if total_length is not None:
        if total_length < steps:
            raise ValueError(f"Expected total_length to be at least the length of the longest "
                             f"sequence in input, but got total_length={total_length} and max "
                             f"sequence length being {steps}")
        steps = total_length
    batch = int(sizes[0])
    lengths = (sizes[None, :] > np.arange(batch)[:, None]).sum(1)
    # row of every (t, b) in data, or the appended padding row where t >= lengths[b]
    grid = np.full((steps, batch), data.shape[0], np.int64)
    t, b = np.nonzero(np.arange(steps)[:, None] < lengths[None, :])
    grid[t, b] = np.arange(t.size)
    if batch_first:
        grid = grid.T
    pad = full((1,) + tuple(data.shape[1:]), padding_value, dtype=data.dtype,
                       device=data.device)
    rows = cat([data, pad]).index_select(0, tensor(grid.reshape(-1),
                                                                   device=data.device))
    padded = rows.reshape(grid.shape + tuple(data.shape[1:]))
    lengths_t = tensor(lengths)
    if sequence.unsorted_indices is not None:
        order = sequence.unsorted_indices
        padded = padded.index_select(0 if batch_first else 1, order)
        lengths_t = lengths_t[order.cpu()]
    return padded, lengths_t


def pack_sequence(sequences, enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of (L_i, *) tensors (decreasing lengths unless ``enforce_sorted`` is
    False)."""
    lengths = [v.size(0) for v in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths,
                                enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence) -> list:
    """The list of sequences a PackedSequence holds, in their original order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
