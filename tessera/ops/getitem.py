"""``x[key]`` and ``x[key] = v``: basic keys give views, advanced keys (integer or bool
tensors, lists) go through the ``index`` and ``index_put`` ops, with NumPy's (= PyTorch's)
rules for where the advanced dims land.

>>> import tessera
>>> x = tessera.arange(6).view(2, 3)
>>> x[:, [0, 2]]
tensor([[0, 2],
        [3, 5]])
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch, dispatch_inplace
from tessera._tensor import Tensor
from tessera.ops._util import broadcast_shapes, sum_to
from tessera.ops.registry import Meta, defop
from tessera.ops.views import slice_view

__all__ = ["getitem", "setitem", "index", "index_put", "nonzero", "argwhere"]


class _Slot:
    """Marks where an index tensor goes in a key (the tensors travel as op inputs)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "T"


T = _Slot()
_strided = np.lib.stride_tricks.as_strided


def _as_int(v, what="index"):
    if isinstance(v, Tensor):
        if v.numel() != 1 or v.dtype.category != 1:
            raise TypeError(f"only integer tensors of a single element can be converted to an "
                            f"{what}")
        return int(v.item())
    return v


def _parse(x: Tensor, key):
    """Split a user key into a template (ints, slices, None, Ellipsis, T) and index tensors."""
    if not isinstance(key, tuple):
        key = (key,)
    template, tensors = [], []
    dim = 0
    for k in key:
        if k is None or k is Ellipsis:
            template.append(k)
            if k is Ellipsis:
                dim = -10**9
            continue
        if isinstance(k, slice):
            template.append(slice(_as_int(k.start), _as_int(k.stop), _as_int(k.step)))
            dim += 1
            continue
        if isinstance(k, bool):
            k = Tensor._from_numpy(np.array(k))
        if isinstance(k, (int, np.integer)):
            template.append(int(k))
            dim += 1
            continue
        if isinstance(k, Tensor) and k.dim() == 0 and k.dtype.category == 1:
            template.append(int(k.item()))
            dim += 1
            continue
        if isinstance(k, (list, tuple, np.ndarray)):
            from tessera.ops.creation import tensor
            try:
                k = tensor(k)
            except (TypeError, ValueError):
                raise IndexError(f"index: could not convert {type(k).__name__} to an index "
                                 "tensor") from None
            if k.numel() == 0:
                k = k.long()
        if not isinstance(k, Tensor):
            raise IndexError("only integers, slices (`:`), ellipsis (`...`), None and long or "
                             f"byte or bool tensors are valid indices (got {type(k).__name__})")
        if k.dtype is D.bool_ or k.dtype is D.uint8:
            k = k.bool()
            if k.dim() == 0:
                template.append(None)
                template.append(T)
                from tessera.ops.creation import zeros
                tensors.append(zeros(int(bool(k.item())), dtype=D.int64, device=x.device))
                continue
            for j, idx in enumerate(nonzero(k, as_tuple=True)):
                template.append(T)
                tensors.append(idx)
            dim += k.dim()
            continue
        if k.dtype.category != 1:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors "
                             f"(got {k.dtype})")
        template.append(T)
        tensors.append(k)
        dim += 1
    return tuple(template), tensors


def _np_key(template, arrays):
    it = iter(arrays)
    return tuple(next(it) if k is T else k for k in template)


# ---- index (advanced getitem) --------------------------------------------------------

def _index_infer(x, *idx, key):
    for m in idx:
        if m.dtype.category != 1:
            raise IndexError(f"index: tensors used as indices must be long or int tensors, got "
                             f"{m.dtype}")
    dummy = _strided(np.zeros(1, np.int8), x.shape, (0,) * len(x.shape))
    dummies = [np.zeros(m.shape, np.intp) for m in idx]
    try:
        shape = dummy[_np_key(key, dummies)].shape
    except IndexError as e:
        raise IndexError(f"index: {e} (tensor of shape {list(x.shape)})") from None
    return Meta(shape, x.dtype)


def _index_kernel(x, *idx, key):
    try:
        return x[_np_key(key, idx)]
    except IndexError as e:
        raise IndexError(f"index: {e} (tensor of shape {list(x.shape)})") from None


def _index_grad(ctx, g):
    from tessera.ops.creation import zeros
    x_m = ctx.input_metas[0]
    idx = ctx.inputs[1:]
    z = zeros(x_m.shape, dtype=g.dtype, device=g.device)
    return (index_put(z, g, idx, key=ctx.attrs["key"], accumulate=True),) + (None,) * len(idx)


_INDEX = defop("index", _index_infer, _index_kernel, grad=_index_grad)


def index(input: Tensor, indices, *, key=None) -> Tensor:
    """Advanced indexing: ``key`` is a template whose ``T`` slots take ``indices``."""
    return dispatch(_INDEX, input, *indices, key=key)


# ---- index_put -----------------------------------------------------------------------

def _index_put_infer(x, values, *idx, key, accumulate=False):
    if type(values) is Meta and values.dtype is not x.dtype:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                           f"{x.dtype} for the destination and {values.dtype} for the source.")
    sub = _index_infer(x, *idx, key=key)
    vshape = values.shape if type(values) is Meta else ()
    try:
        broadcast_shapes("index_put", sub.shape, vshape)
        if len(vshape) > len(sub.shape) and any(s != 1 for s in vshape[:len(vshape) -
                                                                     len(sub.shape)]):
            raise RuntimeError
    except RuntimeError:
        raise RuntimeError(f"index_put: shape mismatch: value tensor of shape {list(vshape)} "
                           f"cannot be broadcast to indexing result of shape "
                           f"{list(sub.shape)}") from None
    return Meta(x.shape, x.dtype)


def _put(out, values, idx, key, accumulate):
    k = _np_key(key, idx)
    sub_shape = out[k].shape
    v = np.asarray(values, out.dtype)
    if v.ndim > len(sub_shape):
        v = v.reshape(v.shape[v.ndim - len(sub_shape):])
    try:
        if accumulate:
            np.add.at(out, k, np.broadcast_to(v, sub_shape))
        else:
            out[k] = v
    except IndexError as e:
        raise IndexError(f"index_put: {e} (tensor of shape {list(out.shape)})") from None
    return out


def _index_put_kernel(x, values, *idx, key, accumulate=False):
    return _put(np.array(x, copy=True), values, idx, key, accumulate)


def _index_put_grad(ctx, g):
    idx = ctx.inputs[2:]
    key = ctx.attrs["key"]
    need = ctx.needs_input_grad
    gx = gv = None
    if need[0]:
        gx = g if ctx.attrs.get("accumulate") else index_put(g, 0.0, idx, key=key)
    if need[1]:
        gv = sum_to(index(g, idx, key=key), ctx.input_metas[1].shape)
    return (gx, gv) + (None,) * len(idx)


_INDEX_PUT = defop("index_put", _index_put_infer, _index_put_kernel, grad=_index_put_grad)
_INDEX_PUT.inplace_kernels["cpu"] = lambda t, x, values, *idx, key, accumulate=False: _put(
    t, values, idx, key, accumulate)


def index_put(input: Tensor, values, indices, *, key=None, accumulate: bool = False,
              out: Tensor | None = None) -> Tensor:
    """``input`` with ``input[indices] = values`` (or ``+=`` when ``accumulate``).

    ``indices`` is a tuple of index tensors, one per leading dim, as in PyTorch; ``key``
    (internal) is a template that places them among slices.
    """
    indices = tuple(indices)
    if key is None:
        key = (T,) * len(indices)
    if not isinstance(values, Tensor):
        values = Tensor._from_numpy(np.array(values, dtype=input.dtype.np), input.device)
    if out is None:
        return dispatch(_INDEX_PUT, input, values, *indices, key=key, accumulate=accumulate)
    return dispatch_inplace(_INDEX_PUT, out, input, values, *indices, key=key,
                            accumulate=accumulate)


# ---- the Python operators ------------------------------------------------------------

def getitem(input: Tensor, key) -> Tensor:
    """``input[key]``: a view for basic keys, a copy for advanced ones."""
    template, tensors = _parse(input, key)
    if not tensors and T not in template:
        return slice_view(input, template)
    return index(input, tensors, key=template)


def setitem(input: Tensor, key, value) -> None:
    """``input[key] = value``: written in place; autograd sees a new version of ``input``."""
    template, tensors = _parse(input, key)
    if isinstance(value, Tensor):
        if value.device != input.device:
            value = value.to(input.device)
        value = value.to(input.dtype)
    else:
        from tessera.ops.creation import tensor
        value = tensor(value, dtype=input.dtype, device=input.device)
    if not tensors and T not in template:
        target = slice_view(input, template)
        from tessera.ops.creation import copy
        copy(target, value, out=target)
        return
    index_put(input, value, tensors, key=template, out=input)


# ---- nonzero (data-dependent shape) --------------------------------------------------

def _nonzero_kernel(x):
    return np.stack(np.nonzero(x), axis=1) if x.ndim else \
        np.zeros((int(bool(x)), 0), np.int64)


_NONZERO = defop("nonzero", lambda x: Meta((-1, len(x.shape)), D.int64), _nonzero_kernel,
                 grad=None, dynamic_shape=True)


def nonzero(input: Tensor, *, as_tuple: bool = False):
    """Indices of non-zero elements: an (n, ndim) int64 tensor, or a tuple of 1-d tensors."""
    out = dispatch(_NONZERO, input)
    if as_tuple:
        if input.dim() == 0:
            return (out.reshape(-1),)
        return tuple(out[:, i] for i in range(input.dim()))
    return out


def argwhere(input: Tensor) -> Tensor:
    return nonzero(input)
