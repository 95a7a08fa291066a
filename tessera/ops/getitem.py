"""``x[key]`` and ``x[key] = v``: basic keys give views, advanced keys (integer or bool
tensors, lists) go through the ``index`` and ``index_put`` ops.

As in PyTorch, the basic part of a key (ints, slices, None, Ellipsis) is applied first as a
view; the index tensors then index that view, with NumPy's rule for where the advanced dims
land (in place when adjacent, else first). So ``x[1, :, idx]`` is ``x[1][:, idx]``. On a
global tensor, a dim the key leaves whole may stay split, or the index tensors may be split
alike.

>>> import tessera
>>> x = tessera.arange(6).view(2, 3)
>>> x[:, [0, 2]]
tensor([[0, 2],
        [3, 5]])
"""
from __future__ import annotations

import warnings

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch, dispatch_inplace
from tessera._tensor import Tensor
from tessera.ops import _jax, _relax, cost
from tessera.ops._elementwise import checked_scalar
from tessera.ops._sbp import bshape
from tessera.ops._util import broadcast_shapes, ensure_tensor, numel, sum_to
from tessera.ops.registry import Meta, defop
from tessera.ops.views import slice_view
from tessera.sbp import SbpRule, Signature, broadcast as B, partial_sum as P, split as S

_NUMBER = (int, float, complex, np.number, np.bool_)

__all__ = ["getitem", "setitem", "index", "index_put", "nonzero", "argwhere"]


class _Slot:
    """Marks where an index tensor goes in a key (the tensors travel as op inputs)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


T = _Slot("T")          # an index tensor over one existing dim
NEW_T = _Slot("NEW_T")  # a 0-d bool key: a new size-1 dim, indexed by [0] (True) or [] (False)


def _as_int(v):
    if isinstance(v, Tensor):
        if v.numel() != 1 or v.dtype.category != 1:
            raise TypeError("only integer tensors of a single element can be converted to an "
                            "index")
        return int(v.item())
    return v


def _to_index_tensor(x: Tensor, k):
    from tessera.ops.creation import tensor
    try:
        k = tensor(list(k) if isinstance(k, range) else k, device=x.device)
    except (TypeError, ValueError):
        raise IndexError(f"index: could not convert {type(k).__name__} to an index "
                         "tensor") from None
    # as PyTorch's indexing_tensor_from_data: a sequence of numbers indexes as long
    return k if _is_mask(k) or (k.dtype is D.int64 and k.numel()) else k.long()


_SEQUENCE_WARNING = (
    "Using a non-tuple sequence for multidimensional indexing is deprecated and will be "
    "changed in pytorch 2.9; use x[tuple(seq)] instead of x[seq]. In pytorch 2.9 this will be "
    "interpreted as tensor index, x[torch.tensor(seq)], which will result either in an error "
    "or a different result")
_SEQUENCES = (list, tuple, range, np.ndarray)


def _sequence_as_tuple(key) -> bool:
    """PyTorch's rule (NumPy's former one) for a list key: it is a tuple of keys when one of
    its fewer than 32 entries is a tensor, a sequence, a slice, ``None`` or ``...``
    (``x[[0, slice(None)]]`` is ``x[0, :]``); otherwise it is one index tensor."""
    if not isinstance(key, (list, range)) or len(key) >= 32:
        return False
    return any(isinstance(k, (Tensor, slice) + _SEQUENCES) or k is None or k is Ellipsis
               for k in key)


def _is_mask(k) -> bool:
    return isinstance(k, Tensor) and (k.dtype is D.bool_ or k.dtype is D.uint8)


def _consumed(k) -> int:
    """How many dims of the indexed tensor a key entry uses up."""
    if k is None or k is Ellipsis or isinstance(k, (bool, np.bool_)):
        return 0
    return k.dim() if _is_mask(k) else 1


def _mask_indices(x: Tensor, k: Tensor, dim: int) -> tuple:
    """The index tensors of bool mask ``k`` applied from dim ``dim`` of ``x``."""
    if dim + k.dim() > x.dim():
        raise IndexError(f"too many indices for tensor of dimension {x.dim()}")
    for j, s in enumerate(k.shape):
        if s != x.shape[dim + j]:
            raise IndexError(f"The shape of the mask {list(k.shape)} at index {j} does not "
                             f"match the shape of the indexed tensor {list(x.shape)} at index "
                             f"{dim + j}")
    return nonzero(k.bool(), as_tuple=True)


def _parse(x: Tensor, key):
    """Split a user key into a template (ints, slices, None, Ellipsis, T, NEW_T) and the
    index tensors that fill its T slots, in order."""
    if not isinstance(key, tuple):
        if _sequence_as_tuple(key):
            warnings.warn(_SEQUENCE_WARNING, UserWarning, stacklevel=4)
            key = tuple(key)
        else:
            key = (key,)
    key = tuple(_to_index_tensor(x, k) if isinstance(k, _SEQUENCES) else k for k in key)
    if sum(1 for k in key if k is Ellipsis) > 1:
        key = _one_ellipsis(x, key)
    skip = max(x.dim() - sum(_consumed(k) for k in key), 0)
    template: list  # None, Ellipsis, slices, ints and the T / NEW_T markers
    template, tensors, dim = [], [], 0
    for k in key:
        if k is None or k is Ellipsis:
            template.append(k)
            dim += skip if k is Ellipsis else 0
        elif isinstance(k, slice):
            template.append(slice(_as_int(k.start), _as_int(k.stop), _as_int(k.step)))
            dim += 1
        elif isinstance(k, (bool, np.bool_)) or (_is_mask(k) and k.dim() == 0 and
                                                  k._data is not None):
            from tessera.ops.creation import zeros
            template.append(NEW_T)
            tensors.append(zeros(int(bool(k)), dtype=D.int64, device=x.device))
        elif isinstance(k, (int, np.integer)) or (
                isinstance(k, Tensor) and k.dim() == 0 and k.dtype.category == 1 and
                k._data is not None):
            template.append(int(k))  # like PyTorch, a 0-d integer tensor selects
            dim += 1
        elif isinstance(k, (str, bytes)):  # PyTorch tries to make a tensor of it
            raise TypeError(f"invalid index: new(): invalid data type '{type(k).__name__}'")
        elif not isinstance(k, Tensor):
            raise IndexError("only integers, slices (`:`), ellipsis (`...`), None and long or "
                             "byte or bool tensors are valid indices (got "
                             f"{type(k).__name__})")
        elif _is_mask(k):
            for idx in _mask_indices(x, k, dim):
                template.append(T)
                tensors.append(idx)
            dim += k.dim()
        elif k.dtype is not D.int64 and k.dtype is not D.int32:  # (byte: a mask, above)
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors "
                             f"(got {k.dtype})")
        else:
            template.append(T)
            tensors.append(k)
            dim += 1
    return tuple(template), tensors


def _one_ellipsis(x: Tensor, key: tuple) -> tuple:
    """PyTorch lets every ``...`` skip the unspecified dims: a later one is a no-op unless
    something indexes past it, which is then out of range."""
    skip = x.dim() - sum(_consumed(k) for k in key)
    first = key.index(Ellipsis)
    rest = key[first + 1:]
    last = max(i for i, k in enumerate(rest) if k is Ellipsis)
    if skip > 0 and any(_consumed(k) for k in rest[last:]):
        raise IndexError(f"too many indices for tensor of dimension {x.dim()}")
    return key[:first + 1] + tuple(k for k in rest if k is not Ellipsis)


def _split(template, ndim: int):
    """(basic key, advanced key, whether the basic key is a no-op): the basic key makes the
    view that the advanced key (only full slices and T) then indexes."""
    used = sum(1 for k in template if k is T or isinstance(k, (int, slice)))
    basic: list
    adv: list
    basic, adv = [], []
    for k in template:
        if k is T:
            basic.append(slice(None))
            adv.append(T)
        elif k is NEW_T:
            basic.append(None)
            adv.append(T)
        elif k is Ellipsis:
            basic.append(k)
            # spelled out: NumPy would treat T's on both sides of an Ellipsis as apart
            adv.extend([slice(None)] * max(ndim - used, 0))
        elif isinstance(k, slice) or k is None:
            basic.append(k)
            adv.append(slice(None))
        else:
            basic.append(k)  # an int: selected away by the view
    trivial = all(k is Ellipsis or k == slice(None) for k in basic)
    return tuple(basic), tuple(adv), trivial


def _index_shape(shape, key, idx_shapes) -> tuple[int, ...]:
    """The shape of ``x[key]`` for a key of full slices and T slots (NumPy's placement: the
    broadcast index shape in place when the T's are adjacent, else first)."""
    if len(key) > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
    key = tuple(key) + (slice(None),) * (len(shape) - len(key))
    pos = [i for i, k in enumerate(key) if k is T]
    if not pos:
        return tuple(shape)
    try:
        b = broadcast_shapes("index", *idx_shapes)
    except RuntimeError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together "
                         "with shapes " + ", ".join(str(list(s)) for s in idx_shapes)) from None
    if pos[-1] - pos[0] == len(pos) - 1:
        return tuple(shape[:pos[0]]) + tuple(b) + tuple(shape[pos[-1] + 1:])
    return tuple(b) + tuple(s for s, k in zip(shape, key) if k is not T)


def _np_key(template, arrays):
    it = iter(arrays)
    return tuple(next(it) if k is T else k for k in template)


# ---- index (advanced getitem) --------------------------------------------------------

def _index_infer(x, *idx, key):
    for m in idx:
        if m.dtype is not D.int64 and m.dtype is not D.int32:
            raise IndexError(f"index: tensors used as indices must be long, int, byte or bool "
                             f"tensors (got {m.dtype})")
    return Meta(_index_shape(x.shape, key, [m.shape for m in idx]), x.dtype)


def _index_kernel(x, *idx, key):
    shape = _index_shape(x.shape, key, [i.shape for i in idx])
    if numel(shape) == 0:  # PyTorch checks the bounds of indices only as it reads
        return np.empty(shape, x.dtype)
    try:
        return x[_np_key(key, idx)]
    except IndexError as e:
        raise IndexError(f"index: {e} (tensor of shape {list(x.shape)})") from None


def _index_grad(ctx, g):
    from tessera.ops.creation import zeros
    x_m = ctx.input_metas[0]
    idx = ctx.inputs[1:]
    z = zeros(x_m.shape, dtype=g.dtype, device=g.device)
    return (_index_put(z, g, idx, ctx.attrs["key"], True),) + (None,) * len(idx)


def _index_layout(x, idx, key):
    """Where ``x[key]`` (a key of full slices and ``T`` slots, one per index tensor) puts
    things: {x dim that is not indexed: its output dim}, the broadcast index shape, and the
    output dim that shape starts at (NumPy: in place when the T's are adjacent, else first)."""
    n = len(x.shape)
    key = tuple(key) + (slice(None),) * (n - len(key))
    pos = [i for i, k in enumerate(key) if not isinstance(k, slice)]
    b = bshape([m.shape for m in idx])
    rest = [d for d in range(n) if d not in pos]
    if pos and pos[-1] - pos[0] == len(pos) - 1:
        at = pos[0]
        out = {d: d if d < at else d - len(pos) + len(b) for d in rest}
    else:
        at = 0
        out = {d: len(b) + j for j, d in enumerate(rest)}
    return out, b, at


def _index_splits(idx, b, j) -> tuple:
    """Each index tensor's SBP when dim ``j`` of their broadcast shape ``b`` is split: split
    where it has that dim at full size, else broadcast."""
    return tuple(S(j - (len(b) - len(m.shape))) if j >= len(b) - len(m.shape) and
                 m.shape[j - (len(b) - len(m.shape))] == b[j] else B for m in idx)


def _index_sbp(x, *idx, key):
    """x split on a dim the key leaves whole (the indices whole); or the indices split alike
    on a dim of their broadcast shape (x whole); linear in x."""
    dims, b, at = _index_layout(x, idx, key)
    whole = (B,) * len(idx)
    sigs = [Signature((S(d),) + whole, (S(e),)) for d, e in dims.items()]
    sigs += [Signature((B,) + _index_splits(idx, b, j), (S(at + j),)) for j in range(len(b))]
    return sigs + [Signature((P,) + whole, (P,)), Signature((B,) + whole, (B,))]


_INDEX = defop("index", _index_infer, _index_kernel, grad=_index_grad,
               sbp=SbpRule(_index_sbp), cost=cost.movement(), to_jax=_jax.index,
               to_relax=_relax.index)


def index(input: Tensor, indices, *, key=None) -> Tensor:
    """Advanced indexing: ``key`` is a template whose ``T`` slots take ``indices``."""
    indices = tuple(indices)
    return dispatch(_INDEX, input, *indices, key=(T,) * len(indices) if key is None else key)


# ---- index_put -----------------------------------------------------------------------

def _index_put_infer(x, values, *idx, key, accumulate=False):
    if type(values) is Meta and values.dtype is not x.dtype:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                           f"{x.dtype} for the destination and {values.dtype} for the source.")
    sub = _index_infer(x, *idx, key=key)
    vshape = values.shape if type(values) is Meta else ()
    try:
        if len(vshape) > len(sub.shape) or \
                broadcast_shapes("index_put", sub.shape, vshape) != sub.shape:
            raise RuntimeError
    except RuntimeError:
        raise RuntimeError(f"index_put: shape mismatch: value tensor of shape {list(vshape)} "
                           f"cannot be broadcast to indexing result of shape "
                           f"{list(sub.shape)}") from None
    return Meta(x.shape, x.dtype)


def _put(out, values, idx, key, accumulate):
    if numel(_index_shape(out.shape, key, [i.shape for i in idx])) == 0:
        return out
    k = _np_key(key, idx)
    try:
        v = np.asarray(values, out.dtype)
        if accumulate:
            np.add.at(out, k, np.broadcast_to(v, out[k].shape))
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
        gx = g if ctx.attrs.get("accumulate") else _index_put(g, g.new_zeros(()), idx, key,
                                                                False)
    if need[1]:
        gv = sum_to(index(g, idx, key=key), ctx.input_metas[1].shape)
    return (gx, gv) + (None,) * len(idx)


def _index_put_sbp(x, values, *idx, key, accumulate=False):
    """``x[key] = values`` (``+=``): x split on a dim the key leaves whole, with values split
    on that dim of the indexed result (or whole where it broadcasts there), the indices
    whole; jointly linear in (x, values). Accumulating, a partial x may take each rank's
    tile of the indices and values (``index``'s gradient without a gather)."""
    dims, b, at = _index_layout(x, idx, key)
    whole = (B,) * len(idx)
    sub = [0] * (len(x.shape) - len(dims) + len(b))  # the indexed result's rank, sizes below
    for d, e in dims.items():
        sub[e] = x.shape[d]
    for j, size in enumerate(b):
        sub[at + j] = size
    vm = values if type(values) is Meta else None

    def vsplit(e):
        if vm is None:
            return None
        k = e - (len(sub) - len(vm.shape))
        return S(k) if k >= 0 and vm.shape[k] == sub[e] else B
    sigs = [Signature((S(d), vsplit(e)) + whole, (S(d),)) for d, e in dims.items()]
    if accumulate:
        for j in range(len(b)):
            ins = _index_splits(idx, b, j)
            if any(s is not B for s in ins):
                sigs.append(Signature((P, vsplit(at + j)) + ins, (P,)))
    v = None if vm is None else B
    sigs.append(Signature((B, v) + whole, (B,)))
    if vm is not None:
        sigs.append(Signature((P, P) + whole, (P,)))
    return sigs


def _index_put_cost(ins, outs, key, accumulate=False) -> cost.Cost:
    """A copy of x with the indexed elements written; accumulating, an addition each."""
    x, _, *idx = ins
    n = numel(_index_shape(x.shape, key, [m.shape for m in idx])) if accumulate else 0
    return cost.Cost(n, *cost.io(ins, outs))


_INDEX_PUT = defop("index_put", _index_put_infer, _index_put_kernel, grad=_index_put_grad,
                   sbp=SbpRule(_index_put_sbp), cost=_index_put_cost, to_jax=_jax.index_put,
                   to_relax=_relax.index_put,
                   inplace_kernels={"cpu": lambda t, x, values, *idx, key, accumulate=False:
                                    _put(t, values, idx, key, accumulate)})


def _index_put(input, values, indices, key, accumulate, out=None):
    if out is None:
        return dispatch(_INDEX_PUT, input, values, *indices, key=key, accumulate=accumulate)
    return dispatch_inplace(_INDEX_PUT, out, input, values, *indices, key=key,
                            accumulate=accumulate)


def index_put(input: Tensor, indices, values: Tensor, accumulate: bool = False, *,
              out: Tensor | None = None) -> Tensor:
    """``input`` with ``input[indices] = values`` (``+=`` when ``accumulate``); ``indices``
    is a tuple of index tensors, one per leading dim (``x.index_put_((i,), v)`` in place)."""
    ensure_tensor("index_put", input)
    if not isinstance(values, Tensor):
        raise TypeError(f"index_put(): argument 'values' (position 2) must be Tensor, not "
                        f"{type(values).__name__}")
    if isinstance(indices, Tensor) or not isinstance(indices, (tuple, list)):
        raise TypeError("index_put(): argument 'indices' (position 1) must be tuple of "
                        f"Tensors, not {type(indices).__name__}")
    key: list  # full slices and T markers
    key, tensors = [], []
    for k in indices:
        if k is None:
            key.append(slice(None))
        elif _is_mask(k):
            for idx in _mask_indices(input, k, len(key)):
                key.append(T)
                tensors.append(idx)
        else:
            key.append(T)
            tensors.append(k if isinstance(k, Tensor) else _to_index_tensor(input, k))
    return _index_put(input, values, tensors, tuple(key), bool(accumulate), out)


# ---- the Python operators ------------------------------------------------------------

def getitem(input: Tensor, key) -> Tensor:
    """``input[key]``: a view for basic keys, a copy for advanced ones."""
    if isinstance(key, (int, slice)) and not isinstance(key, bool) and input.dim() == 0:
        # old scripts write ``loss.data[0]``; PyTorch's message says what to use instead
        if isinstance(key, slice):
            raise IndexError("slice() cannot be applied to a 0-dim tensor.")
        if key < 0:
            raise IndexError(f"index {key} is out of bounds for dimension 0 with size 0")
        raise IndexError("invalid index of a 0-dim tensor. Use `tensor.item()` in Python or "
                         "`tensor.item<T>()` in C++ to convert a 0-dim tensor to a number")
    template, tensors = _parse(input, key)
    if not tensors:
        return slice_view(input, template)
    basic, adv, trivial = _split(template, input.dim())
    return index(input if trivial else slice_view(input, basic), tensors, key=adv)


def _drop_leading_ones(value: Tensor, ndim: int) -> Tensor:
    # PyTorch lets ``x[k] = v`` give v extra leading size-1 dims
    extra = value.dim() - ndim
    if extra > 0 and all(s == 1 for s in value.shape[:extra]):
        return value.reshape(tuple(value.shape[extra:]))
    return value


def _scalar_value(value, dt: D.dtype):
    """A number written by setitem, checked as PyTorch converts it: it must fit 64 bits, then
    ``dt`` (one element of float16 or bfloat16 is written through a double, so overflows
    to inf)."""
    if isinstance(value, (int, np.integer)) and not -(1 << 63) <= value < 1 << 63:
        raise ValueError("Overflow when unpacking long long")
    checked_scalar(value, D.float64 if dt is D.float16 or dt is D.bfloat16 else dt)
    if isinstance(value, (complex, np.complexfloating)) and not dt.is_complex:
        return value.real  # (no imaginary part: checked)
    return value


def setitem(input: Tensor, key, value) -> None:
    """``input[key] = value``: written in place; autograd sees a new version of ``input``."""
    template, tensors = _parse(input, key)
    if isinstance(value, Tensor):
        if value.device != input.device:
            value = value.to(input.device)
        value = value.to(input.dtype)
    else:
        from tessera.ops.creation import tensor
        if isinstance(value, _NUMBER):
            value = _scalar_value(value, input.dtype)
        value = tensor(value, dtype=input.dtype, device=input.device)
    if not tensors:
        target = slice_view(input, template)
        from tessera.ops.creation import copy
        copy(target, _drop_leading_ones(value, target.dim()), out=target)
        return
    basic, adv, trivial = _split(template, input.dim())
    target = input if trivial else slice_view(input, basic)
    sub = _index_infer(target.meta(), *[t.meta() for t in tensors], key=adv)
    _index_put(target, _drop_leading_ones(value, len(sub.shape)), tensors, adv, False, out=target)


# ---- nonzero (data-dependent shape) --------------------------------------------------

def _nonzero_kernel(x):
    return np.stack(np.nonzero(x), axis=1) if x.ndim else \
        np.zeros((int(bool(x)), 0), np.int64)


_NONZERO = defop("nonzero", lambda x: Meta((-1, len(x.shape)), D.int64), _nonzero_kernel,
                 grad=None, dynamic_shape=True, cost=cost.reduction(1))  # a test per element


def nonzero(input: Tensor, *, out=None, as_tuple: bool = False):
    """Indices of non-zero elements: an (n, ndim) int64 tensor, or a tuple of 1-d tensors."""
    ensure_tensor("nonzero", input)
    if out is not None and not as_tuple:
        from tessera.ops.creation import copy
        return copy(out, dispatch(_NONZERO, input), out=out)
    if as_tuple:
        if input.dim() == 0:  # PyTorch treats a 0-d input as 1-d here
            return nonzero(input.reshape(1), as_tuple=True)
        out = dispatch(_NONZERO, input)
        return tuple(out[:, i] for i in range(input.dim()))
    return dispatch(_NONZERO, input)


def argwhere(input: Tensor) -> Tensor:
    """The same as ``nonzero(input)``."""
    return nonzero(input)
