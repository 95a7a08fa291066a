"""Shape and movement ops that copy: joining, splitting, flipping, repeating, triangles.

Primitives with their own ``OpDef`` are ``cat``, ``flip``, ``roll``, ``repeat``,
``repeat_interleave`` (tensor repeats), ``tril``, ``triu`` and ``diag_embed``; the rest are
composites of them and of the views in ``views.py`` (``broadcast.py`` holds the
composites that only give tensors a common or minimum shape). ``split``/``chunk``/``tensor_split``/
``unbind`` are one multi-output view op, ``split_view``, whose backward is one
``split_backward`` (writes into the pieces show through, as in PyTorch). On a global tensor
the dims an op does not work along may stay split; the copies cost their bytes
(``cost.movement``).

>>> import tessera
>>> a, b = tessera.ones(2, 3), tessera.zeros(2, 3)
>>> tessera.cat([a, b], 1).shape, tessera.stack([a, b]).shape
(tessera.Size([2, 6]), tessera.Size([2, 2, 3]))
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import _mark_view, dispatch
from tessera._tensor import Size, Tensor
from tessera.autograd.grad_mode import STATE
from tessera.ops import _jax, _relax, _sbp, cost
from tessera.ops._sbp import linear_identity, wrap
from tessera.ops._util import call, ensure_tensor, wrap_dim, wrap_dims
from tessera.ops.broadcast import atleast_1d, atleast_2d, atleast_3d
from tessera.ops.registry import Meta, OpDef, defop
from tessera.ops.views import (
    _SLICE,
    diagonal,
    expand,
    flatten,
    reshape,
    transpose,
    unsqueeze,
)
from tessera.sbp import SbpRule, Signature, broadcast as B, partial_sum as P, split as S

__all__ = ["cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack",
           "column_stack", "row_stack", "split", "tensor_split", "chunk", "unbind", "flip",
           "fliplr", "flipud", "roll", "rot90", "repeat", "tile", "repeat_interleave", "tril",
           "triu", "diag", "diag_embed", "trace"]


def _tensor_list(op: str, tensors) -> tuple:
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}(): argument 'tensors' (position 1) must be tuple of Tensors, "
                        f"not {type(tensors).__name__}")
    return tuple(tensors)


def _write_out(out: Tensor | None, result: Tensor) -> Tensor:
    """``out=`` for composites: copy the result into ``out``."""
    if out is None:
        return result
    from tessera.ops.creation import copy
    return copy(out, result, out=out)


# ---- cat and the stacks ----------------------------------------------------------------

def _legacy_empty(m) -> bool:
    # PyTorch still accepts 1-d empty tensors of any other rank in cat, and skips them
    return tuple(m.shape) == (0,)


def _cat_dim(metas, dim) -> int | None:
    """``dim`` wrapped against the first tensor that is not a legacy empty (None if all are)."""
    for m in metas:
        if not _legacy_empty(m):
            return wrap_dim(dim, len(m.shape), "cat")
    return None


def _cat_infer(*ts, dim=0):
    if not ts:
        raise ValueError("torch.cat(): expected a non-empty list of Tensors")
    for i, m in enumerate(ts):
        if type(m) is not Meta:
            raise TypeError(f"expected Tensor as element {i} in argument 0, but got "
                            f"{type(m).__name__}")
        if not m.shape:
            raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be "
                               "concatenated")
    dt = D.result_type(*[(m.dtype, 1) for m in ts])
    d = _cat_dim(ts, dim)
    if d is None:
        return Meta((0,), dt)
    ref = next(m.shape for m in ts if not _legacy_empty(m))
    total = 0
    for i, m in enumerate(ts):
        if _legacy_empty(m):
            continue
        if len(m.shape) != len(ref):
            raise RuntimeError(f"Tensors must have same number of dimensions: got {len(ref)} "
                               f"and {len(m.shape)}")
        for k, (a, b) in enumerate(zip(ref, m.shape)):
            if k != d and a != b:
                raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. "
                                   f"Expected size {a} but got size {b} for tensor number {i} "
                                   "in the list.")
        total += m.shape[d]
    return Meta(ref[:d] + (total,) + ref[d + 1:], dt)


def _cat_kernel(*arrays, dim=0):
    keep = [a for a in arrays if a.shape != (0,)]
    if not keep:
        return np.empty((0,), arrays[0].dtype)
    return np.concatenate(keep, axis=dim % keep[0].ndim)


def _cat_grad(ctx, g):
    """The pieces of ``g`` as views from ONE split (so a second backward is one op too)."""
    metas = ctx.input_metas
    d = _cat_dim(metas, ctx.attrs["dim"])
    bounds, offset = [], 0
    for m, need in zip(metas, ctx.needs_input_grad):
        if not _legacy_empty(m):
            if need:
                bounds.append((offset, offset + m.shape[d]))
            offset += m.shape[d]
    # d is None only when every input is a legacy empty: no bounds, and _views makes none
    pieces = iter(_views(g, d, bounds))  # type: ignore[arg-type]
    return tuple(None if not need else g.new_zeros((0,)) if _legacy_empty(m) else next(pieces)
                 for m, need in zip(metas, ctx.needs_input_grad))


def _cat_sbp(*ts, dim=0):
    n = len(ts[0].shape)
    dim = wrap(dim, n)
    k = len(ts)
    sigs = [Signature((S(d),) * k, (S(d),)) for d in range(n) if d != dim]
    return sigs + linear_identity(k)


_CAT = defop("cat", _cat_infer, _cat_kernel, promote=True, save=(), grad=_cat_grad,
             sbp=SbpRule(_cat_sbp), cost=cost.movement(),
             to_relax=_relax.cat,
             to_jax=lambda jnp, lax, a, at: jnp.concatenate(a, axis=at.get("dim", 0)))


def cat(tensors, dim: int = 0, *, out: Tensor | None = None, axis=None) -> Tensor:
    """Join tensors along an existing dim, promoting dtypes (``cat([a, b], 1)``)."""
    dim = dim if axis is None else axis
    return call(_CAT, *_tensor_list("cat", tensors), dim=dim, out=out)


def concat(tensors, dim: int = 0, *, out: Tensor | None = None, axis=None) -> Tensor:
    dim = dim if axis is None else axis
    return cat(tensors, dim, out=out)


def concatenate(tensors, axis: int = 0, out: Tensor | None = None, *,
                dim: int | None = None) -> Tensor:
    return cat(tensors, axis if dim is None else dim, out=out)


def stack(tensors, dim: int = 0, *, out: Tensor | None = None, axis=None) -> Tensor:
    """Join equally shaped tensors along a new dim ``dim``."""
    dim = dim if axis is None else axis
    tensors = _tensor_list("stack", tensors)
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    shp = ensure_tensor("stack", tensors[0])._shape
    for i, t in enumerate(tensors):
        if ensure_tensor("stack", t)._shape != shp:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got "
                               f"{list(shp)} at entry 0 and {list(t._shape)} at entry {i}")
    d = wrap_dim(dim, len(shp) + 1, "stack")
    return cat([unsqueeze(t, d) for t in tensors], d, out=out)


def _nonempty(op: str, tensors) -> tuple:
    tensors = _tensor_list(op, tensors)
    if not tensors:
        raise RuntimeError(f"{op} expects a non-empty TensorList")
    return tensors


def hstack(tensors, *, out: Tensor | None = None) -> Tensor:
    """Concatenate along dim 0 for 1-d inputs, else along dim 1."""
    ts = atleast_1d(_nonempty("hstack", tensors))
    return cat(ts, 0 if ts[0].dim() == 1 else 1, out=out)


def vstack(tensors, *, out: Tensor | None = None) -> Tensor:
    """Concatenate along dim 0 after making every input at least 2-d."""
    return cat(atleast_2d(_nonempty("vstack", tensors)), 0, out=out)


row_stack = vstack


def dstack(tensors, *, out: Tensor | None = None) -> Tensor:
    """Concatenate along dim 2 after making every input at least 3-d."""
    return cat(atleast_3d(_nonempty("dstack", tensors)), 2, out=out)


def column_stack(tensors, *, out: Tensor | None = None) -> Tensor:
    """Stack 0-d and 1-d inputs as columns, concatenating the rest along dim 1."""
    ts = [reshape(t, (t.numel(), 1)) if t.dim() <= 1 else t
          for t in _nonempty("column_stack", tensors)]
    return cat(ts, 1, out=out)


# ---- split, chunk, tensor_split, unbind: one multi-output view op ---------------------------
# ``split_view`` returns every piece at once, and its backward is ONE ``split_backward`` that
# assembles all the piece gradients (cat, stack, or scatter-add for overlapping pieces):
# O(input) work, where a slice grad per piece would fill a full-size buffer each, O(T^2).
# dispatch marks only a multi-output op's first result as a view, and with a chain that
# replays the whole op; ``_views`` re-marks every piece with the single slice it is, so
# writes, version counters and history regeneration work per piece as for other views.

def _split_infer(x, dim, bounds, squeeze):
    s = x.shape
    if squeeze:
        piece = Meta(s[:dim] + s[dim + 1:], x.dtype)
        return tuple(piece for _ in bounds)
    return tuple(Meta(s[:dim] + (b - a,) + s[dim + 1:], x.dtype) for a, b in bounds)


def _split_kernel(x, dim, bounds, squeeze):
    lead = (slice(None),) * dim
    if squeeze:  # the Ellipsis keeps a 1-d input's pieces 0-d views, not NumPy scalars
        return tuple(x[lead + (a, Ellipsis)] for a, _ in bounds)
    return tuple(x[lead + (slice(a, b),)] for a, b in bounds)


def _split_grad(ctx, *grads):
    return (dispatch(_SPLIT_BACKWARD, *grads, shape=ctx.input_metas[0].shape, **ctx.attrs),)


def _split_sbp(x, dim, bounds, squeeze):
    """The pieces along ``dim``: the other dims may stay split."""
    n, k = len(x.shape), len(bounds)
    dim = wrap(dim, n)
    sigs = [Signature((S(d),), (S(d - (1 if squeeze and d > dim else 0)),) * k)
            for d in range(n) if d != dim]
    return sigs + [Signature((B,), (B,) * k), Signature((P,), (P,) * k)]


_SPLIT = defop("split_view", _split_infer, _split_kernel, aliasing="view", save=(),
               grad=_split_grad, sbp=SbpRule(_split_sbp), cost=cost.view(),
               to_relax=_relax.split_view, to_jax=_jax.split_view)


def _split_backward_infer(*gs, shape, dim, bounds, squeeze):
    want = _split_infer(Meta(shape, gs[0].dtype), dim, bounds, squeeze)
    for i, (g, m) in enumerate(zip(gs, want)):
        if tuple(g.shape) != m.shape:
            raise RuntimeError(f"split_backward: gradient {i} has shape {list(g.shape)}, "
                               f"expected {list(m.shape)}")
    return Meta(tuple(shape), D.result_type(*[(g.dtype, 1) for g in gs]))


def _is_partition(bounds, n: int) -> bool:
    """Whether the pieces tile ``[0, n)`` in order, so their gradients just concatenate."""
    at = 0
    for a, b in bounds:
        if a != at:
            return False
        at = b
    return at == n


def _split_backward_kernel(*gs, shape, dim, bounds, squeeze):
    if squeeze:
        return np.stack(gs, axis=dim)
    if _is_partition(bounds, shape[dim]):
        return np.concatenate(gs, axis=dim)
    out = np.zeros(shape, np.result_type(*gs))   # tensor_split with decreasing indices
    lead = (slice(None),) * dim
    for (a, b), g in zip(bounds, gs):
        out[lead + (slice(a, b),)] += g
    return out


def _split_backward_into(out, *gs, shape, dim, bounds, squeeze):
    """The kernel's out-form, for compiled graphs: into a planned buffer, not a new array."""
    if squeeze:
        np.stack(gs, axis=dim, out=out)
    elif _is_partition(bounds, shape[dim]):
        np.concatenate(gs, axis=dim, out=out)
    else:
        np.copyto(out, _split_backward_kernel(*gs, shape=shape, dim=dim, bounds=bounds,
                                              squeeze=squeeze))


def _split_backward_grad(ctx, g):
    a = ctx.attrs
    return dispatch(_SPLIT, g, dim=a["dim"], bounds=a["bounds"], squeeze=a["squeeze"])


def _split_backward_sbp(*gs, shape, dim, bounds, squeeze):
    """The pieces' gradients put back together along ``dim``: other dims may stay split."""
    n, k = len(shape), len(gs)
    dim = wrap(dim, n)
    sigs = [Signature((S(d - (1 if squeeze and d > dim else 0)),) * k, (S(d),))
            for d in range(n) if d != dim]
    return sigs + linear_identity(k)


_SPLIT_BACKWARD = defop("split_backward", _split_backward_infer, _split_backward_kernel,
                        sbp=SbpRule(_split_backward_sbp, shape_attrs=("shape",)),
                        cost=cost.movement(),
                        save=(), grad=_split_backward_grad,
                        traits={"out_form"}, inplace_kernels={"cpu": _split_backward_into},
                        to_relax=_relax.split_backward, to_jax=_jax.split_backward)


def _views(input: Tensor, d: int, bounds, squeeze: bool = False) -> tuple:
    """The pieces ``[a, b)`` of dim ``d`` (or the single indices ``a``, dim removed, when
    ``squeeze``), as views of ``input`` from one ``split_view`` op."""
    if not bounds:  # nothing to return (and nothing for dispatch to mark)
        return ()
    bounds = tuple((int(a), int(b)) for a, b in bounds)
    pieces = dispatch(_SPLIT, input, dim=d, bounds=bounds, squeeze=squeeze)
    lead = (slice(None),) * d
    guard = STATE.enabled and input._requires_grad
    for i, (p, (a, b)) in enumerate(zip(pieces, bounds)):
        _mark_view(p, (input,), _SLICE, {"key": lead + ((a,) if squeeze else (slice(a, b),))})
        if guard:  # PyTorch refuses in-place writes into these (dispatch_inplace checks)
            p._multi_view = (i, "UnbindBackward0" if squeeze else "SplitBackward0")
    return pieces


def _split_dim(op: str, input: Tensor, dim: int) -> int:
    ensure_tensor(op, input)
    if input.dim() == 0:
        raise RuntimeError(f"{op} expects at least a 1-dimensional tensor")
    return wrap_dim(dim, input.dim(), op)


def _narrow_all(input: Tensor, d: int, sizes) -> tuple:
    bounds, start = [], 0
    for s in sizes:
        bounds.append((start, start + s))
        start += s
    return _views(input, d, bounds)


def split(tensor: Tensor, split_size_or_sections=None, dim: int = 0, *, split_size=None,
          axis=None) -> tuple:
    """Views of pieces of ``split_size`` (the last may be smaller) or of the listed sizes."""
    dim = dim if axis is None else axis
    if split_size is not None:   # Tensor.split's keyword in PyTorch
        split_size_or_sections = split_size
    if isinstance(split_size_or_sections, (list, tuple)):
        d = _split_dim("split_with_sizes", tensor, dim)
        sizes = [int(s) for s in split_size_or_sections]
        n = tensor._shape[d]
        if any(s < 0 for s in sizes):
            raise RuntimeError("split_with_sizes expects split_sizes have only non-negative "
                               f"entries, but got split_sizes={sizes}")
        if sum(sizes) != n:
            raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} "
                               f"(input tensor's size at dimension {d}), but got "
                               f"split_sizes={sizes}")
        return _narrow_all(tensor, d, sizes)
    d = _split_dim("split", tensor, dim)
    s, n = int(split_size_or_sections), tensor._shape[d]
    if s < 0:
        raise RuntimeError(f"split expects split_size be non-negative, but got split_size={s}")
    if s == 0 and n != 0:
        raise RuntimeError("split_size can only be 0 if dimension size is 0, but got "
                           f"dimension size of {n}")
    count = max(-(-n // s) if s else 1, 1)
    return _narrow_all(tensor, d, [s] * (count - 1) + [n - s * (count - 1)])


def chunk(input: Tensor, chunks: int, dim: int = 0, *, axis=None) -> tuple:
    """At most ``chunks`` views of (nearly) equal size."""
    dim = dim if axis is None else axis
    d = _split_dim("chunk", input, dim)
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    n = input._shape[d]
    size = -(-n // chunks)
    if size == 0 and n == 0:
        return _narrow_all(input, d, [0] * chunks)
    return split(input, size, d)


def tensor_split(input: Tensor, indices_or_sections=None, dim: int = 0, *, sections=None,
                 indices=None, tensor_indices_or_sections=None, axis=None) -> tuple:
    """Views split into ``sections`` parts (sizes differ by at most one) or at ``indices``."""
    dim = dim if axis is None else axis
    ensure_tensor("tensor_split", input)
    for alias in (sections, indices, tensor_indices_or_sections):   # PyTorch's overloads
        if alias is not None:
            indices_or_sections = alias
    if input.dim() == 0:
        raise RuntimeError("tensor_split expected at least a 1-dimensional tensor, but got a "
                           "tensor with 0 dims")
    ios = indices_or_sections
    if isinstance(ios, Tensor):
        if ios.dtype is not D.int64:
            raise RuntimeError("tensor_split expected tensor_indices_or_sections to have dtype "
                               f"of long, but got {_tname(ios.dtype)}")
        if ios.dim() > 1:
            raise RuntimeError("tensor_split expected tensor_indices_or_sections to be a "
                               "zero-dimensional or one-dimensional tensor, but got a tensor "
                               f"with {ios.dim()} dims")
        ios = ios.item() if ios.dim() == 0 else ios.tolist()
    d = wrap_dim(dim, input.dim(), "tensor_split")
    n = input._shape[d]
    if isinstance(ios, (list, tuple)):
        idx = [int(i) for i in ios]
        bounds = []
        for a, b in zip([0] + idx, idx + [n]):
            a, b, _ = slice(a, b).indices(n)   # Python slice rules: negatives, clamping
            bounds.append((a, max(a, b)))
        return _views(input, d, bounds)
    k = int(ios)
    if k <= 0:
        raise RuntimeError(f"number of sections must be larger than 0, got {k}")
    small, extra = divmod(n, k)
    return _narrow_all(input, d, [small + 1] * extra + [small] * (k - extra))


def unbind(input: Tensor, dim: int = 0, *, axis=None) -> tuple:
    """The slices along ``dim`` as a tuple of views (the dim removed)."""
    dim = dim if axis is None else axis
    ensure_tensor("unbind", input)
    if input.dim() == 0:
        raise IndexError("Dimension specified as 0 but tensor has no dimensions")
    d = wrap_dim(dim, input.dim(), "unbind")
    return _views(input, d, [(i, i + 1) for i in range(input._shape[d])], squeeze=True)


# ---- flip, roll, rot90 ------------------------------------------------------------------

def _no_dims(op: str, nd: int, dims) -> None:
    if nd == 0 and dims:
        raise IndexError(f"{op}: Dimension specified as {dims[0]} but tensor has no dimensions")


def _flip_infer(x, dims):
    nd = len(x.shape)
    if nd:
        wrap_dims(dims, nd, "flip")
    return Meta(x.shape, x.dtype)


def _flip_kernel(x, dims):
    if not dims or x.ndim == 0:
        return x.copy(order="K")
    # like PyTorch, the copy keeps the input's memory layout (order="K")
    return np.flip(x, tuple(d % x.ndim for d in dims)).copy(order="K")


# flip and roll: linear, and any dim they do not move elements along may stay split
_ALONG_DIMS = _sbp.pointwise(each=(0,), skip=("dims",))
_FLIP = defop("flip", _flip_infer, _flip_kernel, save=(),
              grad=lambda ctx, g: (flip(g, ctx.attrs["dims"]),), sbp=_ALONG_DIMS,
              cost=cost.movement(),
              to_relax=_relax.flip, to_jax=lambda jnp, lax, a, at: jnp.flip(a[0], at["dims"]))


def flip(input: Tensor, *args, dims=None) -> Tensor:
    """Reverse the order of elements along ``dims``; a copy."""
    if dims is not None:
        if args:
            raise TypeError("flip() got multiple values for argument 'dims'")
        args = (dims,)
    dims = args
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = tuple(dims[0])
    return dispatch(_FLIP, ensure_tensor("flip", input), dims=tuple(dims))


def fliplr(input: Tensor) -> Tensor:
    """Flip dim 1 (left/right) of a tensor with at least 2 dims."""
    if input.dim() < 2:
        raise RuntimeError("Input must be >= 2-d.")
    return flip(input, (1,))


def flipud(input: Tensor) -> Tensor:
    """Flip dim 0 (up/down) of a tensor with at least 1 dim."""
    if input.dim() < 1:
        raise RuntimeError("Input must be >= 1-d.")
    return flip(input, (0,))


def _roll_infer(x, shifts, dims):
    nd = len(x.shape)
    if not shifts:
        raise RuntimeError("`shifts` required")
    if len(shifts) != len(dims) and not (len(shifts) == 1 and not dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, "
                           f"dims:{len(dims)}")
    _no_dims("roll", nd, dims)
    for d in dims:
        wrap_dim(d, nd, "roll")
    return Meta(x.shape, x.dtype)


def _roll_kernel(x, shifts, dims):
    if not dims:  # roll the flattened tensor
        return np.roll(x, shifts[0])
    return np.roll(x, shifts, [d % x.ndim for d in dims])


def _roll_sbp(x, shifts, dims):
    """Rolling a split dim moves elements across tiles; no dims rolls the flattened tensor."""
    if not dims:
        return linear_identity()
    return _ALONG_DIMS(x, dims=dims)


_ROLL = defop("roll", _roll_infer, _roll_kernel, save=(),
              grad=lambda ctx, g: (roll(g, tuple(-s for s in ctx.attrs["shifts"]),
                                        ctx.attrs["dims"]),),
              sbp=SbpRule(_roll_sbp), cost=cost.movement(), to_relax=_relax.roll,
              to_jax=_jax.roll)


def roll(input: Tensor, shifts, dims=None) -> Tensor:
    """Shift elements cyclically along ``dims`` (the flattened tensor when None)."""
    shifts = (shifts,) if isinstance(shifts, (int, np.integer)) else tuple(shifts)
    dims = () if dims is None else (dims,) if isinstance(dims, (int, np.integer)) \
        else tuple(dims)
    return dispatch(_ROLL, ensure_tensor("roll", input), shifts=tuple(int(s) for s in shifts),
                    dims=dims)


def rot90(input: Tensor, k: int = 1, dims=(0, 1)) -> Tensor:
    """Rotate by 90 degrees ``k`` times in the plane of ``dims`` (from dims[0] to dims[1])."""
    dims = list(dims)
    nd = input.dim()
    if len(dims) != 2:
        raise RuntimeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if nd < 2:
        raise RuntimeError(f"expected total dims >= 2, but got total dims = {nd}")
    d0, d1 = wrap_dim(dims[0], nd, "rot90"), wrap_dim(dims[1], nd, "rot90")
    if d0 == d1:
        raise RuntimeError(f"expected rotation dims to be different, but got dim0 = {d0} and "
                           f"dim1 = {d1}")
    k %= 4
    if k == 1:
        return transpose(flip(input, (d1,)), d0, d1)
    if k == 2:
        return flip(input, (d0, d1))
    if k == 3:
        return transpose(flip(input, (d0,)), d0, d1)
    from tessera.ops.creation import clone
    return clone(input).contiguous()  # PyTorch's rot90(k=0) is a contiguous copy


# ---- repeat, tile, repeat_interleave ----------------------------------------------------

def _repeat_infer(x, repeats):
    nd = len(x.shape)
    if len(repeats) < nd:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number "
                           "of dimensions of tensor")
    padded = (1,) * (len(repeats) - nd) + tuple(x.shape)
    shape = [r * s for r, s in zip(repeats, padded)]
    for s in shape:
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {shape}")
    return Meta(tuple(shape), x.dtype)


def _repeat_grad(ctx, g):
    repeats = ctx.attrs["repeats"]
    shape = ctx.input_metas[0].shape
    if not repeats:
        return (g,)
    padded = (1,) * (len(repeats) - len(shape)) + tuple(shape)
    split_shape = [n for pair in zip(repeats, padded) for n in pair]
    from tessera.ops.reduce import sum as _sum
    g = _sum(reshape(g, split_shape), tuple(range(0, 2 * len(repeats), 2)))
    return (reshape(g, shape),)


def _repeat_sbp(x, repeats):
    """A dim repeated once stays split (a repeated one would interleave tiles)."""
    lead = len(repeats) - len(x.shape)
    return [Signature((S(d),), (S(d + lead),)) for d in range(len(x.shape))
            if repeats[d + lead] == 1] + linear_identity()


_REPEAT = defop("repeat", _repeat_infer, lambda x, repeats: np.tile(x, repeats), save=(),
                grad=_repeat_grad, sbp=SbpRule(_repeat_sbp), cost=cost.movement(),
                to_relax=lambda R, a, at: R.tile(a[0], list(at["repeats"])),
                to_jax=lambda jnp, lax, a, at: jnp.tile(a[0], tuple(at["repeats"])))


def repeat(input: Tensor, *sizes, repeats=None) -> Tensor:
    """``x.repeat(2, 3)``: tile the tensor, adding leading dims if more sizes are given."""
    repeats = sizes if repeats is None else (repeats,)   # x.repeat(repeats=(2, 3)) too
    if not repeats:
        raise TypeError('repeat() missing 1 required positional arguments: "repeats"')
    if len(repeats) == 1 and isinstance(repeats[0], (list, tuple, Size)):
        repeats = tuple(repeats[0])
    return dispatch(_REPEAT, ensure_tensor("repeat", input),
                    repeats=tuple(int(r) for r in repeats))


def tile(input: Tensor, dims) -> Tensor:
    """``repeat`` with ``dims`` padded by leading ones to the tensor's rank."""
    dims = tuple(dims)
    return repeat(input, (1,) * (input.dim() - len(dims)) + dims)


def _rep_infer(x, repeats, dim, output_size=None):
    if repeats.dtype not in (D.int64, D.int32):
        raise NotImplementedError(f'"repeat_interleave_cpu" not implemented for '
                                  f"'{_tname(repeats.dtype)}'")
    if len(repeats.shape) != 1:
        raise RuntimeError("repeats must be 0-dim or 1-dim tensor")
    if repeats.shape[0] != x.shape[dim]:
        raise RuntimeError("repeats must have the same size as input along dim, but got "
                           f"repeats.size(0) = {repeats.shape[0]} and input.size({dim}) = "
                           f"{x.shape[dim]}")
    shape = list(x.shape)
    shape[dim] = -1 if output_size is None else output_size
    return Meta(tuple(shape), x.dtype)


def _rep_kernel(x, repeats, dim, output_size=None):
    if (repeats < 0).any():
        raise RuntimeError("repeats can not be negative")
    total = int(repeats.sum())
    if output_size is not None and output_size != total:
        raise RuntimeError(f"repeat_interleave: Invalid output_size, expected {total} but got "
                           f"{output_size}")
    return np.repeat(x, repeats, axis=dim)


def _rep_grad(ctx, g):
    from tessera.ops.creation import arange, zeros
    from tessera.ops.getitem import T, _index_put
    x, repeats = ctx.inputs
    d = ctx.attrs["dim"]
    # the size is g's: static, so a graph can trace this backward
    src = repeat_interleave(arange(x.shape[d], device=g.device), repeats,
                            output_size=g.shape[d])
    z = zeros(x.shape, dtype=g.dtype, device=g.device)
    return _index_put(z, g, (src,), (slice(None),) * d + (T,), True), None


# Per-element repeats make the output size depend on the data (PyTorch syncs on it too).
def _rep_jax(jnp, lax, a, at):
    """With ``output_size`` the shape is static: element j of the result reads the
    element whose running count of repeats first exceeds j."""
    size = at.get("output_size")
    if size is None:
        raise NotImplementedError("repeat_interleave without output_size")
    return jnp.repeat(a[0], a[1], axis=at["dim"], total_repeat_length=size)


def _rep_relax(R, a, at):
    size = at.get("output_size")
    if size is None:
        raise NotImplementedError("repeat_interleave without output_size")
    x, reps = a
    ends = R.cumsum(R.astype(reps, "int64"), 0)
    j = R.expand_dims(R.arange(0, size, 1, "int64"), 1)
    src = R.sum(R.astype(R.less_equal(R.expand_dims(ends, 0), j), "int64"), [1])
    return R.take(x, src, at["dim"])


_REP = defop("repeat_interleave", _rep_infer, _rep_kernel, grad=_rep_grad,
             dynamic_shape=True, cost=cost.movement(), to_jax=_rep_jax, to_relax=_rep_relax)


def repeat_interleave(input: Tensor, repeats=None, dim: int | None = None, *,
                      output_size: int | None = None, axis=None) -> Tensor:
    """Repeat each element ``repeats`` times (an int, or one count per element) along ``dim``
    (the flattened tensor when None). ``repeat_interleave(counts)`` repeats ``arange``."""
    dim = dim if axis is None else axis
    if repeats is None:
        counts = ensure_tensor("repeat_interleave", input)
        if counts.dim() != 1:
            raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
        from tessera.ops.creation import arange
        return repeat_interleave(arange(counts.shape[0], device=counts.device), counts, 0,
                                 output_size=output_size)
    x = flatten(input) if dim is None else input
    d = 0 if dim is None else wrap_dim(dim, x.dim(), "repeat_interleave")
    if not isinstance(repeats, Tensor):
        r = int(repeats)
        if r < 0:
            raise RuntimeError("Repeats must be non-negative")
        if output_size is not None and x.dim() and output_size != x.shape[d] * r:
            raise RuntimeError(f"repeat_interleave: Invalid output_size, expected "
                               f"{x.shape[d] * r} but got {output_size}")
        y = unsqueeze(x, d + 1)
        shape = list(y.shape)
        shape[d + 1] = r
        from tessera.ops.creation import clone
        return flatten(clone(expand(y, shape)), d, d + 1)
    if repeats.dim() == 0 or tuple(repeats.shape) == (1,):
        repeats = expand(reshape(repeats, (1,)), (x.shape[d] if x.dim() else 1,))
    if x.dim() == 0:
        x = reshape(x, (1,))
    return dispatch(_REP, x, repeats, dim=d, output_size=output_size)


# ---- triangles and diagonals -------------------------------------------------------------

def _tri(name: str, kernel):
    def infer(x, diagonal=0):
        if len(x.shape) < 2:
            raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
        return Meta(x.shape, x.dtype)

    op: OpDef  # its grad rule dispatches it again
    op = defop(name, infer, lambda x, diagonal=0: kernel(x, diagonal), save=(),
               grad=lambda ctx, g: (dispatch(op, g, diagonal=ctx.attrs["diagonal"]),),
               sbp=_sbp.pointwise(each=(0,), skip=(-2, -1)), cost=cost.movement(),
               to_jax=_jax.tri(name), to_relax=_relax.tri(name))

    def fn(input: Tensor, diagonal: int = 0, *, out: Tensor | None = None) -> Tensor:
        return call(op, ensure_tensor(name, input), diagonal=int(diagonal), out=out)
    fn.__name__ = fn.__qualname__ = name
    return fn


tril = _tri("tril", np.tril)
tril.__doc__ = "The lower triangle (on and below diagonal ``diagonal``) of the last two dims."
triu = _tri("triu", np.triu)
triu.__doc__ = "The upper triangle (on and above diagonal ``diagonal``) of the last two dims."


def _diag_embed_dims(nd_out: int, dim1, dim2) -> tuple[int, int]:
    d1, d2 = wrap_dim(dim1, nd_out, "diag_embed"), wrap_dim(dim2, nd_out, "diag_embed")
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    return d1, d2


def _diag_embed_infer(x, offset=0, dim1=-2, dim2=-1):
    nd = len(x.shape) + 1
    d1, d2 = _diag_embed_dims(nd, dim1, dim2)
    n = (x.shape[-1] if x.shape else 1) + abs(offset)
    rest = iter(x.shape[:-1])
    shape = tuple(n if i in (d1, d2) else next(rest) for i in range(nd))
    return Meta(shape, x.dtype)


def _diag_embed_kernel(x, offset=0, dim1=-2, dim2=-1):
    from tessera.ops.views import _diagonal_kernel
    # no dtype: the infer rule reads the shape only
    m = _diag_embed_infer(Meta(x.shape, None), offset, dim1, dim2)  # type: ignore[arg-type]
    out = np.zeros(m.shape, x.dtype)
    _diagonal_kernel(out, offset, dim1 % out.ndim, dim2 % out.ndim)[...] = x
    return out


def _diag_embed_sbp(x, offset=0, dim1=-2, dim2=-1):
    """The batch dims (all but the last) stay split, at the output positions the two new
    dims leave free."""
    n = len(x.shape)
    d1, d2 = wrap(dim1, n + 1), wrap(dim2, n + 1)
    free = [d for d in range(n + 1) if d not in (d1, d2)]
    return [Signature((S(d),), (S(free[d]),)) for d in range(n - 1)] + linear_identity()


def _diag_embed_plan(shape: tuple, offset: int, dim1, dim2):
    """(n, the mask of the diagonal in an (n, n) plane, whether a row takes x by column,
    the permutation from (batch dims, row, column) to the output's dims)."""
    nd = len(shape) + 1
    d1, d2 = _diag_embed_dims(nd, dim1, dim2)
    n = (shape[-1] if shape else 1) + abs(offset)
    mask = np.eye(n, n, k=offset, dtype=bool)
    free = iter(range(nd - 2))
    perm = [nd - 2 if i == d1 else nd - 1 if i == d2 else next(free) for i in range(nd)]
    return n, mask, offset < 0, perm


def _diag_embed_jax(jnp, lax, a, at):
    x = a[0] if a[0].ndim else a[0].reshape(1)
    n, mask, by_col, perm = _diag_embed_plan(a[0].shape, at.get("offset", 0),
                                             at.get("dim1", -2), at.get("dim2", -1))
    xr = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n - x.shape[-1])])
    v = xr[..., None, :] if by_col else xr[..., :, None]
    return jnp.transpose(jnp.where(mask, v, jnp.zeros((), x.dtype)), perm)


def _diag_embed_relax(R, a, at):
    x = a[0]
    shape = R.shape(x)
    if not shape:
        x = R.reshape(x, [1])
    n, mask, by_col, perm = _diag_embed_plan(shape, at.get("offset", 0), at.get("dim1", -2),
                                             at.get("dim2", -1))
    nd = len(R.shape(x))
    m = R.shape(x)[-1]
    xr = R.nn.pad(x, [0, 0] * (nd - 1) + [0, n - m]) if n > m else x
    v = R.expand_dims(xr, nd - 1 if by_col else nd)
    out = R.where(R.const(mask, "bool"), v, R.zeros((), R.dtype(x)))
    return R.permute_dims(out, perm)


_DIAG_EMBED = defop("diag_embed", _diag_embed_infer, _diag_embed_kernel, save=(),
                    grad=lambda ctx, g: (diagonal(g, ctx.attrs["offset"], ctx.attrs["dim1"],
                                                  ctx.attrs["dim2"]),),
                    sbp=SbpRule(_diag_embed_sbp), cost=cost.movement(),
                    to_jax=_diag_embed_jax, to_relax=_diag_embed_relax)


def diag_embed(input: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """A tensor whose diagonals (over ``dim1``, ``dim2``) are the last dim of ``input``."""
    return dispatch(_DIAG_EMBED, ensure_tensor("diag_embed", input), offset=int(offset),
                    dim1=dim1, dim2=dim2)


def diag(input: Tensor, diagonal: int = 0, *, out: Tensor | None = None) -> Tensor:
    """1-d input: a matrix with it on diagonal ``diagonal``; 2-d input: that diagonal."""
    nd = ensure_tensor("diag", input).dim()
    if nd == 1:
        return _write_out(out, diag_embed(input, diagonal, 0, 1))
    if nd != 2:
        raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {nd}D")
    from tessera.ops.creation import clone
    from tessera.ops.views import diagonal as _diagonal
    return _write_out(out, clone(_diagonal(input, diagonal)))


def trace(input: Tensor) -> Tensor:
    """The sum of the main diagonal of a matrix."""
    nd = ensure_tensor("trace", input).dim()
    if nd != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {nd}")
    if input.dtype is D.bool_:
        raise NotImplementedError("\"trace\" not implemented for 'Bool'")
    return diagonal(input).sum()


def _tname(d) -> str:
    from tessera._dispatch import _tname as name
    return name(d)
