"""``nn.utils.rnn``: padding variable-length sequences into one batch tensor and back.

>>> import tessera
>>> from tessera.nn.utils.rnn import pad_sequence
>>> pad_sequence([tessera.ones(2), tessera.ones(3)], batch_first=True).shape
tessera.Size([2, 3])
"""
from __future__ import annotations

from collections.abc import Iterable

import tessera
from tessera._tensor import Tensor

__all__ = ["pad_sequence", "unpad_sequence"]


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
        bool(padding_value) if dtype is tessera.bool else int(padding_value))
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
    return tessera.stack(rows, dim=0 if batch_first else 1)


def unpad_sequence(padded_sequences: Tensor, lengths, batch_first: bool = False) -> list:
    """The inverse of :func:`pad_sequence` (for right padding): a list of the sequences
    ``padded[:lengths[i]]``. Unlike PyTorch, which transposes ``padded_sequences`` in place
    when ``batch_first`` is False, the input is left untouched.
    """
    if not batch_first:
        padded_sequences = padded_sequences.transpose(0, 1)
    return [seq[:int(n)] for seq, n in zip(padded_sequences, lengths, strict=True)]
