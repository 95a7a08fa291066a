"""Composites of views that give tensors a common or a minimum shape: ``broadcast_shapes``,
``broadcast_tensors``, ``meshgrid`` and ``atleast_1d/2d/3d``. They copy nothing: every
result is an ``expand``, ``view`` or ``unsqueeze`` of its input.

>>> import tessera
>>> xs, ys = tessera.meshgrid(tessera.arange(3), tessera.arange(2), indexing="ij")
>>> xs.shape, tessera.broadcast_shapes((3, 1), (2,))
(tessera.Size([3, 2]), tessera.Size([3, 2]))
"""
from __future__ import annotations

import warnings

import numpy as np

from tessera._tensor import Size, Tensor
from tessera.ops._util import ensure_tensor
from tessera.ops.views import expand, reshape, unsqueeze, view

__all__ = ["broadcast_tensors", "broadcast_shapes", "meshgrid", "atleast_1d", "atleast_2d",
           "atleast_3d"]


def broadcast_shapes(*shapes) -> Size:
    """The shape that tensors of ``shapes`` broadcast to (no tensors are made)."""
    given = [(s,) if isinstance(s, (int, np.integer)) else s for s in shapes if s is not None]
    if not given:
        return Size(())
    for s in given:
        if not isinstance(s, (tuple, list)):
            raise RuntimeError("Input shapes should be of type ints, a tuple of ints, or a list "
                               f"of ints, got {s}")
    common: list = [1] * max(len(s) for s in given)
    for arg, s in enumerate(given):
        for i in range(-1, -1 - len(s), -1):
            if s[i] == common[i]:
                continue
            if common[i] == 1:
                if s[i] < 0:
                    raise ValueError("Attempting to broadcast a dimension with negative length!")
                common[i] = s[i]
            elif s[i] != 1:
                raise RuntimeError(f"Attempting to broadcast a dimension of length {s[i]} at "
                                   f"{i}! Mismatching argument at index {arg} had {tuple(s)}; "
                                   f"but expected shape should be broadcastable to {common}")
    return Size(int(c) for c in common)


def broadcast_tensors(*tensors) -> tuple:
    """Views of ``tensors`` expanded to their common broadcast shape."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    from tessera.ops._util import broadcast_shapes as _common
    if not tensors:
        return ()
    shape = _common("broadcast_tensors", *[ensure_tensor("broadcast_tensors", t)._shape
                                           for t in tensors])
    return tuple(expand(t, shape) for t in tensors)


def meshgrid(*tensors, indexing: str | None = None) -> tuple:
    """Coordinate grids from 0-d/1-d tensors: output i varies along dim i (``'ij'``); with
    ``'xy'`` (Cartesian) the first two dims trade places. Outputs are expanded views."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing is None:
        warnings.warn("torch.meshgrid: in an upcoming release, it will be required to pass the "
                      "indexing argument.", UserWarning, stacklevel=2)
        indexing = "ij"
    if not tensors:
        raise RuntimeError("meshgrid expects a non-empty TensorList")
    if indexing not in ("ij", "xy"):
        raise RuntimeError('torch.meshgrid: indexing must be one of "xy" or "ij", but '
                           f"received: {indexing}")
    for t in tensors:
        if ensure_tensor("meshgrid", t).dim() > 1:
            raise RuntimeError("torch.meshgrid: Expected 0D or 1D tensor in the tensor list but "
                               f"got: {t}")
        if t.dtype is not tensors[0].dtype:
            raise RuntimeError("meshgrid expects all tensors to have the same dtype")
    swap = indexing == "xy" and len(tensors) >= 2
    ts = list(tensors)
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    shape = tuple(t.numel() for t in ts)
    n = len(ts)
    grids = [expand(view(t, (1,) * i + (-1,) + (1,) * (n - i - 1)), shape)
             for i, t in enumerate(ts)]
    if swap:
        grids[0], grids[1] = grids[1], grids[0]
    return tuple(grids)


def _atleast(nd: int, fix):
    def fn(*tensors):
        if len(tensors) == 1:
            tensors = tensors[0]
        if isinstance(tensors, Tensor):
            return tensors if tensors.dim() >= nd else fix(tensors)
        return tuple(t if ensure_tensor(f"atleast_{nd}d", t).dim() >= nd else fix(t)
                     for t in tensors)
    fn.__name__ = fn.__qualname__ = f"atleast_{nd}d"
    fn.__doc__ = (f"Each input with fewer than {nd} dims as a view with {nd} dims (others "
                  "as they are); one tensor in, one out.")
    return fn


atleast_1d = _atleast(1, lambda t: reshape(t, (1,)))
atleast_2d = _atleast(2, lambda t: reshape(t, (1, 1)) if t.dim() == 0 else unsqueeze(t, 0))
atleast_3d = _atleast(3, lambda t: reshape(t, (1, 1, 1)) if t.dim() == 0 else
                      unsqueeze(unsqueeze(t, 0), -1) if t.dim() == 1 else unsqueeze(t, -1))
