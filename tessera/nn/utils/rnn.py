"""``nn.utils.rnn``: padding variable-length sequences into one batch tensor.

>>> import tessera
>>> from tessera.nn.utils.rnn import pad_sequence
>>> pad_sequence([tessera.ones(2), tessera.ones(3)], batch_first=True).shape
tessera.Size([2, 3])
"""
from __future__ import annotations

import tessera

__all__ = ["pad_sequence", "unpad_sequence"]


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right"):
    """Stack tensors of shape (L_i, *) into (max L, B, *) (or (B, max L, *))."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"Expected padding_side to be one of left or right, but got "
                         f"{padding_side}.")
    sequences = list(sequences)
    if not sequences:
        raise RuntimeError("received an empty list of sequences")
    max_len = max(s.size(0) for s in sequences)
    trailing = tuple(sequences[0].shape[1:])
    out = tessera.full((len(sequences), max_len) + trailing, padding_value,
                       dtype=sequences[0].dtype)
    rows = []
    for s in sequences:
        pad = max_len - s.size(0)
        if pad == 0:
            rows.append(s)
            continue
        filler = tessera.full((pad,) + trailing, padding_value, dtype=s.dtype)
        rows.append(tessera.cat([s, filler] if padding_side == "right" else [filler, s]))
    out = tessera.stack(rows)
    return out if batch_first else out.transpose(0, 1)


def unpad_sequence(padded_sequences, lengths, batch_first: bool = False):
    if not batch_first:
        padded_sequences = padded_sequences.transpose(0, 1)
    return [seq[:int(n)] for seq, n in zip(padded_sequences, lengths)]
