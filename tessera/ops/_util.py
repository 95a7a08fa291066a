"""Helpers shared by the op families: shape rules, dim handling, the call convention."""
from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch, dispatch_inplace
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import STATE
from tessera.ops.registry import Meta


def call(op, *args, out: Tensor | None = None, **attrs):
    """Run ``op``; with ``out=`` write the result into ``out`` (this is how ``x.add_(y)``
    and ``add(x, y, out=z)`` work)."""
    if out is None:
        return dispatch(op, *args, **attrs)
    if (not args or out is not args[0]) and STATE.enabled and (
            (isinstance(out, Tensor) and out._requires_grad) or
            any(isinstance(a, Tensor) and a._requires_grad for a in args)):
        # an explicit out= (not the in-place form x.add_(y)): PyTorch refuses autograd
        raise RuntimeError(f"{op.name}(): functions with out=... arguments don't support "
                           "automatic differentiation, but one of the arguments requires "
                           "grad.")
    return dispatch_inplace(op, out, *args, **attrs)


def broadcast_shapes(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy/PyTorch broadcasting; RuntimeError naming the op and both sizes."""
    out = shapes[0]
    for s in shapes[1:]:
        if s == out:
            continue
        n = max(len(out), len(s))
        a = (1,) * (n - len(out)) + tuple(out)
        b = (1,) * (n - len(s)) + tuple(s)
        res = []
        for i, (x, y) in enumerate(zip(a, b)):
            if x == y or y == 1:
                res.append(x)
            elif x == 1:
                res.append(y)
            else:
                raise RuntimeError(f"{op}: The size of tensor a ({x}) must match the size of "
                                   f"tensor b ({y}) at non-singleton dimension {i}")
        out = tuple(res)
    return out


def shape_of(m) -> tuple[int, ...]:
    return m.shape if type(m) is Meta else ()


def dtype_arg(m):
    """A Meta or Python scalar as ``result_type`` takes it."""
    return (m.dtype, len(m.shape)) if type(m) is Meta else m


def promote(*ms) -> D.dtype:
    return D.result_type(*[dtype_arg(m) for m in ms if m is not None])


def bool_arg(fn: str, name: str, v, none: bool = False) -> bool:
    """The bool argument ``name`` of the public function ``fn`` (``requires_grad``, say),
    checked as PyTorch's argument parser checks it: True or False (or None where ``none``),
    never a truthy string or number."""
    if v is True or v is False:
        return v
    if v is None and none:
        return False
    raise TypeError(f"{fn}(): argument '{name}' must be bool, not {D.type_name(v)}")


def wrap_dim(dim, ndim: int, op: str) -> int:
    if type(dim) is int and -ndim <= dim < ndim:  # the common case, first
        return dim + ndim if dim < 0 else dim
    n = max(ndim, 1)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{op}(): argument 'dim' must be int, not {type(dim).__name__}")
    if dim < -n or dim >= n:
        raise IndexError(f"{op}: Dimension out of range (expected to be in range of "
                         f"[{-n}, {n - 1}], but got {dim})")
    return int(dim) + n if dim < 0 else int(dim)


def wrap_dims(dims, ndim: int, op: str) -> tuple[int, ...]:
    """Normalise ``dim`` (None, int or sequence) to a sorted tuple; None means all dims."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, (int, np.integer)) and not isinstance(dims, bool):
        dims = (dims,)
    out = tuple(wrap_dim(d, ndim, op) for d in dims)
    if len(set(out)) != len(out):
        raise RuntimeError(f"{op}: dim {out[0]} appears multiple times in the list of dims")
    return tuple(sorted(out))


def size_args(op: str, size) -> tuple[int, ...]:
    """``zeros(2, 3)``, ``zeros((2, 3))``, ``zeros([2, 3])``, ``zeros(Size)`` -> (2, 3)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    out = []
    for s in size:
        if isinstance(s, Tensor):
            s = s.item() if s.numel() == 1 and s.dtype.category == 1 else s
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"{op}(): argument 'size' must be tuple of ints, but found element "
                            f"of type {type(s).__name__}")
        if s < 0:
            raise RuntimeError(f"{op}: Trying to create tensor with negative dimension {s}: "
                               f"{list(size)}")
        out.append(int(s))
    return tuple(out)


def ensure_tensor(op: str, x, name: str = "input") -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}(): argument '{name}' must be Tensor, not {type(x).__name__}")
    return x


def missing(fn_name: str, **args) -> NoReturn:
    """The TypeError of a required argument left out. Those after a ``dim`` take None as
    their default, so that NumPy's ``axis=`` may stand for ``dim`` as PyTorch allows.

    >>> missing("gather", dim=0, index=None)
    Traceback (most recent call last):
    ...
    TypeError: gather() missing required argument 'index'
    """
    name = next(k for k, v in args.items() if v is None)
    raise TypeError(f"{fn_name}() missing required argument '{name}'")


def numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def float_dtype(d: D.dtype) -> D.dtype:
    """Integer and bool inputs of float functions (exp, sqrt, ...) compute in the default."""
    return d if d.category >= 2 else D.get_default_dtype()


def sum_to(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum a broadcast gradient back to ``shape`` (the grad of broadcasting)."""
    if tuple(g.shape) == tuple(shape):
        return g
    from tessera.ops.reduce import sum as _sum
    lead = g.dim() - len(shape)
    dims = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape)
                                      if s == 1 and g.shape[i + lead] != 1)
    r = _sum(g, dims, keepdim=True) if dims else g
    return r.reshape(shape)
