"""What the indexing families share (``gather_scatter``, ``index_slices``, ``flat_index``):
PyTorch's argument and bounds checks, and ``op_pair``, which makes an op's out-of-place and
in-place kernels from one function that writes into a target array. Every index is checked
before anything is written, so a bad index raises PyTorch's error and leaves an in-place
target untouched.

>>> import numpy as np
>>> kernel, inplace = op_pair(lambda t, v: t.fill(v))
>>> x = np.zeros(2)
>>> kernel(x, 1.0), x
(array([1., 1.]), array([0., 0.]))
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.ops._util import ensure_tensor
from tessera.ops.creation import zeros
from tessera.ops.getitem import setitem

__all__ = ["INT_INDEX", "require_tensors", "nd", "as1", "index_1d", "first_bad",
           "check_bounds", "array_of", "op_pair", "pad_to"]

INT_INDEX = (D.int32, D.int64)


def require_tensors(op: str, **args) -> None:
    """TypeError naming the argument unless every one of ``args`` is a Tensor."""
    for name, t in args.items():
        ensure_tensor(op, t, name)


def nd(shape) -> int:
    """PyTorch's ``ensure_nonempty_dim``: a 0-d tensor counts as 1-d."""
    return max(len(shape), 1)


def as1(a: np.ndarray) -> np.ndarray:
    """A 0-d array as a 1-element 1-d view (PyTorch treats 0-d as 1-d in these ops)."""
    return a.reshape(1) if a.ndim == 0 else a


def index_1d(index: np.ndarray) -> np.ndarray:
    return index.reshape(-1).astype(np.intp, copy=False)


def first_bad(idx: np.ndarray, bad: np.ndarray) -> int:
    return int(idx[bad].reshape(-1)[0])


def check_bounds(idx, n: int, d: int, exc=RuntimeError, prefix: str = "",
                 allow_negative: bool = False) -> None:
    lo = -n if allow_negative else 0
    bad = (idx < lo) | (idx >= n)
    if bad.any():
        raise exc(f"{prefix}index {first_bad(idx, bad)} is out of bounds for dimension {d} "
                  f"with size {n}")


def array_of(v, dtype) -> np.ndarray:
    return np.asarray(v).astype(dtype)


def op_pair(write):
    """(out-of-place kernel, in-place kernel) from one function that writes into a target."""
    def kernel(x, *rest, **attrs):
        out = np.array(x, copy=True)
        write(out, *rest, **attrs)
        return out

    def inplace(t, x, *rest, **attrs):
        if x is not t:
            np.copyto(t, x, casting="unsafe")
        write(t, *rest, **attrs)
    return kernel, inplace


def pad_to(t: Tensor, shape) -> Tensor:
    """``t`` in the leading corner of zeros of ``shape`` (the gradient of taking that corner)."""
    shape = tuple(shape)
    if tuple(t.shape) == shape:
        return t
    if not shape:
        return t.reshape(())
    if t.dim() == 0:
        t = t.reshape((1,) * len(shape))
    z = zeros(shape, dtype=t.dtype, device=t.device)
    setitem(z, tuple(slice(0, s) for s in t.shape), t)
    return z
