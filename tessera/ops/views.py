"""View ops: results share memory with their input (PyTorch's view semantics).

``view`` (and so reshape/flatten/squeeze/unsqueeze), ``permute`` (and transpose/t/movedim),
``expand``, ``slice`` (basic indexing, narrow, select), ``diagonal`` and ``unfold``. A view
records how it was made (``_view_chain``) so that an in-place write to it can be replayed
on its base (``view_assign``) for autograd. Views cost nothing (``cost.view``); on a global
tensor a split dim stays split where the view keeps it whole.

>>> import tessera
>>> x = tessera.zeros(2, 3)
>>> _ = x[0].fill_(1.0); x.sum().item()
3.0
"""
from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.ops import _jax, _relax, _sbp, cost
from tessera.ops._sbp import linear_identity, wrap
from tessera.ops._util import ensure_tensor, missing, numel, sum_to, wrap_dim
from tessera.ops.registry import Meta, defop
from tessera.sbp import SbpRule, Signature, split as S

__all__ = ["view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "ravel",
           "permute", "transpose", "swapaxes", "swapdims", "t", "adjoint", "movedim",
           "moveaxis", "squeeze", "unsqueeze", "expand", "expand_as", "broadcast_to",
           "narrow", "select", "unfold", "diagonal", "view_assign", "squeeze_", "unsqueeze_",
           "t_", "transpose_", "as_strided", "numpy_T", "mT"]

_as_strided = np.lib.stride_tricks.as_strided


def _strided(x: np.ndarray, shape, strides) -> np.ndarray:
    """A view of ``x``'s memory with new shape and strides (bytes). A contiguous ``x`` lends
    its buffer to the ndarray constructor directly, ~6x cheaper than ``as_strided``."""
    if x.flags.c_contiguous:
        try:
            return np.ndarray(shape, x.dtype, x, 0, strides)
        except (ValueError, TypeError, BufferError):  # e.g. a read-only or odd buffer
            pass
    return _as_strided(x, shape, strides)


# ---- view (reshape) ------------------------------------------------------------------

def _resolve_shape(op: str, shape, n: int) -> tuple[int, ...]:
    shape = list(shape)
    neg = [i for i, s in enumerate(shape) if s == -1]
    if len(neg) > 1:
        raise RuntimeError(f"{op}: only one dimension can be inferred (shape {shape})")
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"{op}(): argument 'size' must be tuple of ints, but found element "
                            f"of type {type(s).__name__}")
        if s < -1:
            raise RuntimeError(f"{op}: invalid shape dimension {s} at index {shape.index(s)} "
                               f"of shape {shape}")
    known = numel([s for s in shape if s != -1])
    if neg:
        if known == 0 or n % known:
            raise RuntimeError(f"{op}: shape '{shape}' is invalid for input of size {n}")
        shape[neg[0]] = n // known
    elif known != n:
        raise RuntimeError(f"{op}: shape '{shape}' is invalid for input of size {n}")
    return tuple(int(s) for s in shape)


def _view_infer(x, shape):
    return Meta(_resolve_shape("view", shape, numel(x.shape)), x.dtype)


def _compute_stride(oldshape, oldstride, newshape):
    """PyTorch's ``computeStride``: strides (in elements) that view ``oldshape``/``oldstride``
    as ``newshape``, or None when no view exists. Following it exactly (rather than NumPy's
    reshape) gives the same strides as PyTorch, including those of size-1 dims."""
    if not oldshape:
        return (1,) * len(newshape)
    if numel(oldshape) == 0:
        if tuple(oldshape) == tuple(newshape):
            return tuple(oldstride)
        out, acc = [], 1
        for s in reversed(newshape):
            out.append(acc)
            acc *= max(s, 1)
        return tuple(reversed(out))
    newstride = [0] * len(newshape)
    view_d = len(newshape) - 1
    base = oldstride[-1]
    tensor_numel = view_numel = 1
    for d in range(len(oldshape) - 1, -1, -1):
        tensor_numel *= oldshape[d]
        # a chunk ends where the next dim out is not laid out contiguously after this one
        if d == 0 or (oldshape[d - 1] != 1 and oldstride[d - 1] != tensor_numel * base):
            while view_d >= 0 and (view_numel < tensor_numel or newshape[view_d] == 1):
                newstride[view_d] = view_numel * base
                view_numel *= newshape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                base = oldstride[d - 1]
                tensor_numel = view_numel = 1
    return tuple(newstride) if view_d == -1 else None


def _view_kernel(x, shape):
    if x.flags.c_contiguous and x.size > 1 and 1 not in x.shape:
        # truly C-strided (NumPy's flag ignores the strides of size-1 and empty dims), so
        # NumPy's reshape gives PyTorch's strides; infer has checked the shape
        return x.reshape(shape)
    shape = _resolve_shape("view", shape, x.size)
    st = _compute_stride(x.shape, [s // x.itemsize for s in x.strides], shape)
    if st is None:
        raise RuntimeError("view size is not compatible with input tensor's size and stride "
                           "(at least one dimension spans across two contiguous subspaces). "
                           "Use .reshape(...) instead.")
    return _strided(x, shape, tuple(s * x.itemsize for s in st))


def _view_sbp(x, shape, mesh_size=None):
    """A split dim stays split where it survives whole, or where the dim it starts at in
    the output has the same offset and both sizes divide evenly over the mesh (splitting
    (B, L, H*D) into (B, L, H, D) heads, merging them back): the tiles are then the same
    contiguous blocks."""
    ins = tuple(x.shape)
    out = _sbp.resolve(shape, math.prod(ins))
    n = mesh_size
    sigs = []
    for d, size in enumerate(ins):
        pre = math.prod(ins[:d])
        for e, osize in enumerate(out):
            if math.prod(out[:e]) != pre:
                continue
            if osize == size or (n and size % n == 0 and osize % n == 0):
                sigs.append(Signature((S(d),), (S(e),)))
                break
    return sigs + linear_identity()


_VIEW = defop("view", _view_infer, _view_kernel, aliasing="view", save=(),
              grad=lambda ctx, g: (reshape(g, ctx.input_metas[0].shape),),
              sbp=SbpRule(_view_sbp, shape_attrs=("shape",), mesh=True, contiguous=True),
              cost=cost.view(),
              to_relax=_relax.view, to_jax=lambda jnp, lax, a, at: jnp.reshape(a[0], at["shape"]))


def _as_index(s, op: str, arg: str, pos: int | None):
    """``s`` as an int (also from a NumPy int or an integer 0-d tensor), else PyTorch's
    argument-parser TypeError: ``pos`` is the element's place in a sequence, or None."""
    if not isinstance(s, bool):
        try:
            return int(s.__index__())
        except (AttributeError, TypeError):
            pass
    what = type(s).__name__
    if pos is None:
        raise TypeError(f"{op}(): argument '{arg}' (position 1) must be tuple of ints, not "
                        f"{what}")
    raise TypeError(f"{op}(): argument '{arg}' failed to unpack the object at pos {pos} with "
                    f"error \"type must be tuple of ints,but got {what}\"")


def _shape_args(size, op: str = "view", arg: str = "size") -> tuple:
    """The ``*size`` of ``x.view(2, 3)`` or ``x.view((2, 3))`` as a tuple of ints."""
    flat = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    for s in flat:  # the common case: plain ints, nothing to convert
        if type(s) is not int:
            break
    else:
        return tuple(flat)
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        return tuple(_as_index(s, op, arg, i + 1) for i, s in enumerate(size[0]))
    if len(size) == 1:
        return (_as_index(size[0], op, arg, None),)
    return tuple(_as_index(s, op, arg, i + 1) for i, s in enumerate(size))


def view(input: Tensor, *shape, size=None) -> Tensor:
    """The same data with a new shape; no copy (raises if strides do not allow it)."""
    ensure_tensor("view", input)
    shape = _keyword_shape("view", shape, "size", size)
    if not shape:
        raise TypeError("view() missing 1 required positional arguments: \"size\"")
    if len(shape) == 1 and isinstance(shape[0], D.dtype):
        raise NotImplementedError("view(dtype) reinterpretation is not supported")
    return dispatch(_VIEW, input, shape=_shape_args(shape))


def _keyword_shape(op: str, args: tuple, name: str, value) -> tuple:
    """The sizes given positionally (``x.view(2, 3)``) or as PyTorch's keyword
    (``x.view(size=(2, 3))``), not both."""
    if value is None:
        return args
    if args:
        raise TypeError(f"{op}() got multiple values for argument '{name}'")
    return (value,)


def view_as(input: Tensor, other: Tensor) -> Tensor:
    return view(input, tuple(other.shape))


def _viewable(x: Tensor, shape: tuple[int, ...]) -> bool:
    if x._data is None or x.is_contiguous():
        return True
    return _compute_stride(x._shape, x.stride(), shape) is not None


def reshape(input: Tensor, *args, shape=None) -> Tensor:
    """A view when the strides allow it, else a copy, with the new shape."""
    ensure_tensor("reshape", input)
    shape = _keyword_shape("reshape", args, "shape", shape)
    if not shape:
        raise TypeError("reshape() missing 1 required positional arguments: \"shape\"")
    # resolved here so that a bad shape is reported as reshape's error, not view's
    shape = _resolve_shape("reshape", _shape_args(shape, "reshape", "shape"), input.numel())
    if tuple(shape) == input._shape:
        return dispatch(_VIEW, input, shape=tuple(shape))
    if not _viewable(input, shape):
        from tessera.ops.creation import contiguous
        input = contiguous(input)
    return dispatch(_VIEW, input, shape=tuple(shape))


def reshape_as(input: Tensor, other: Tensor) -> Tensor:
    return reshape(input, tuple(other.shape))


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims ``start_dim..end_dim`` into one."""
    nd = input.dim()
    if nd == 0:
        return reshape(input, (1,))
    s, e = wrap_dim(start_dim, nd, "flatten"), wrap_dim(end_dim, nd, "flatten")
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    shp = input._shape
    return reshape(input, shp[:s] + (numel(shp[s:e + 1]),) + shp[e + 1:])


def unflatten(input: Tensor, dim: int | None = None, sizes=None, *, axis=None) -> Tensor:
    """Split dim ``dim`` into ``sizes`` (one entry may be -1)."""
    dim = dim if axis is None else axis
    if dim is None or sizes is None:
        missing("unflatten", dim=dim, sizes=sizes)
    d = wrap_dim(dim, input.dim(), "unflatten")
    shp = input._shape
    sizes = _resolve_shape("unflatten", tuple(sizes), shp[d])
    return reshape(input, shp[:d] + sizes + shp[d + 1:])


def ravel(input: Tensor) -> Tensor:
    return reshape(input, (-1,))


# squeeze/unsqueeze keep PyTorch's own stride rules (not computeStride's, which differ on
# size-1 dims): squeeze drops dims, unsqueeze gives the new dim size * stride of the next one

def _squeeze_kernel(x, dims):
    keep = [i for i in range(x.ndim) if i not in dims]
    return _strided(x, tuple(x.shape[i] for i in keep), tuple(x.strides[i] for i in keep))


def _squeeze_sbp(x, dims):
    n = len(x.shape)
    gone = {wrap(d, max(n, 1)) for d in (dims if dims is not None else range(n))
            if n and x.shape[wrap(d, n)] == 1}
    return [Signature((S(d),), (S(d - sum(1 for g in gone if g < d)),))
            for d in range(n) if d not in gone] + linear_identity()


_SQUEEZE = defop("squeeze", lambda x, dims: Meta(tuple(
    s for i, s in enumerate(x.shape) if i not in dims), x.dtype), _squeeze_kernel,
    aliasing="view", save=(), grad=lambda ctx, g: (reshape(g, ctx.input_metas[0].shape),),
    sbp=SbpRule(_squeeze_sbp), cost=cost.view(), to_relax=_relax.squeeze, to_jax=_jax.squeeze)


def squeeze(input: Tensor, dim=None, *, axis=None) -> Tensor:
    """Drop size-1 dims (all of them, or those in ``dim``)."""
    dim = dim if axis is None else axis
    shp = ensure_tensor("squeeze", input)._shape
    dims: Collection[int]
    if dim is None:
        dims = {i for i, s in enumerate(shp) if s == 1}
    else:
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        dims = {d for d in (wrap_dim(d, len(shp), "squeeze") for d in dims) if
                len(shp) and shp[d] == 1}
    return dispatch(_SQUEEZE, input, dims=tuple(sorted(dims)))


def _unsqueeze_infer(x, dim):
    if not 0 <= dim <= len(x.shape):
        raise IndexError(f"unsqueeze: dim {dim} out of range for a {len(x.shape)}-d tensor")
    return Meta(x.shape[:dim] + (1,) + x.shape[dim:], x.dtype)


def _unsqueeze_kernel(x, dim):
    st = x.shape[dim] * x.strides[dim] if dim < x.ndim else x.itemsize
    return _strided(x, x.shape[:dim] + (1,) + x.shape[dim:],
                    x.strides[:dim] + (st,) + x.strides[dim:])


def _unsqueeze_sbp(x, dim):
    n = len(x.shape)
    dim = wrap(dim, n + 1)
    return [Signature((S(d),), (S(d if d < dim else d + 1),)) for d in range(n)] + \
        linear_identity()


_UNSQUEEZE = defop("unsqueeze", _unsqueeze_infer, _unsqueeze_kernel, aliasing="view",
                   save=(), grad=lambda ctx, g: (reshape(g, ctx.input_metas[0].shape),),
                   sbp=SbpRule(_unsqueeze_sbp), cost=cost.view(),
                   to_relax=_relax.unsqueeze,
                   to_jax=lambda jnp, lax, a, at: jnp.expand_dims(a[0], at["dim"]))


def unsqueeze(input: Tensor, dim: int | None = None, *, axis=None) -> Tensor:
    """Insert a size-1 dim at ``dim``."""
    dim = dim if axis is None else axis
    if dim is None:
        missing("unsqueeze", dim=dim)
    ensure_tensor("unsqueeze", input)
    return dispatch(_UNSQUEEZE, input, dim=wrap_dim(dim, input.dim() + 1, "unsqueeze"))


def squeeze_(input: Tensor, dim=None, *, axis=None) -> Tensor:
    dim = dim if axis is None else axis
    return _set_view_inplace(input, squeeze(input, dim))


def unsqueeze_(input: Tensor, dim: int | None = None, *, axis=None) -> Tensor:
    dim = dim if axis is None else axis
    if dim is None:
        missing("unsqueeze_", dim=dim)
    return _set_view_inplace(input, unsqueeze(input, dim))


def _set_view_inplace(target: Tensor, v: Tensor) -> Tensor:
    """Metadata-only in-place ops (``squeeze_``): ``target`` takes ``v``'s shape."""
    target._data, target._shape = v._data, v._shape
    target._version[0] += 1  # PyTorch counts metadata changes as writes too
    if v.grad_fn is not None:
        target.grad_fn, target._output_nr = v.grad_fn, v._output_nr
    return target


# ---- permute -------------------------------------------------------------------------

def _permute_infer(x, dims):
    nd = len(x.shape)
    if len(dims) != nd:
        raise RuntimeError(f"permute(sparse_coo): number of dimensions in the tensor input "
                           f"does not match the length of the desired ordering of dimensions "
                           f"i.e. input.dim() = {nd} is not equal to len(dims) = {len(dims)}")
    wd = tuple(wrap_dim(d, nd, "permute") for d in dims)
    if len(set(wd)) != nd:
        raise RuntimeError("permute: repeated dim")
    return Meta(tuple(x.shape[d] for d in wd), x.dtype)


def _permute_grad(ctx, g):
    dims = [d % max(len(ctx.input_metas[0].shape), 1) for d in ctx.attrs["dims"]]
    inv = [0] * len(dims)
    for i, d in enumerate(dims):
        inv[d] = i
    return (permute(g, tuple(inv)),)


def _permute_sbp(x, dims):
    n = len(x.shape)
    dims = [wrap(d, n) for d in dims]
    return [Signature((S(d),), (S(j),)) for j, d in enumerate(dims)] + linear_identity()


_PERMUTE = defop("permute", _permute_infer, lambda x, dims: x.transpose(dims),
                 aliasing="view", save=(), grad=_permute_grad, sbp=SbpRule(_permute_sbp),
                 cost=cost.view(),
                 to_relax=_relax.permute,
                 to_jax=lambda jnp, lax, a, at: jnp.transpose(a[0], at["dims"]))


def permute(input: Tensor, *args, dims=None) -> Tensor:
    """Reorder dims: ``x.permute(2, 0, 1)``, ``tessera.permute(x, dims=(2, 0, 1))``."""
    ensure_tensor("permute", input)
    dims = _keyword_shape("permute", args, "dims", dims)
    return dispatch(_PERMUTE, input, dims=_shape_args(dims, "permute", "dims"))


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    """Swap two dims."""
    nd = input.dim()
    d0, d1 = wrap_dim(dim0, nd, "transpose"), wrap_dim(dim1, nd, "transpose")
    dims = list(range(nd))
    if nd:
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return dispatch(_PERMUTE, input, dims=tuple(dims))


swapdims = transpose


def swapaxes(input: Tensor, axis0: int, axis1: int) -> Tensor:
    """NumPy's name of ``transpose`` (``x.swapaxes(0, 1)``)."""
    return transpose(input, axis0, axis1)


def t(input: Tensor) -> Tensor:
    """Transpose of a tensor with at most 2 dims."""
    nd = len(input._shape)
    if nd > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {nd}D")
    return dispatch(_PERMUTE, input, dims=(1, 0)) if nd == 2 else view(input, input._shape)


def t_(input: Tensor) -> Tensor:
    return _set_view_inplace(input, t(input))


def transpose_(input: Tensor, dim0: int, dim1: int) -> Tensor:
    return _set_view_inplace(input, transpose(input, dim0, dim1))


def adjoint(input: Tensor) -> Tensor:
    return transpose(input, -2, -1)


def numpy_T(input: Tensor) -> Tensor:
    return permute(input, tuple(reversed(range(input.dim()))))


def mT(input: Tensor) -> Tensor:
    if input.dim() < 2:
        raise RuntimeError("tensor.mT is only supported on matrices or batches of matrices. "
                           f"Got {input.dim()}-D tensor.")
    return transpose(input, -2, -1)


def movedim(input: Tensor, source, destination) -> Tensor:
    """Move dims ``source`` to positions ``destination``."""
    nd = input.dim()
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({src} dims)"
                           f" should contain the same number of dims as destination ({dst} "
                           "dims)")
    for name, given in (("source", src), ("destination", dst)):
        wrapped = [wrap_dim(d, nd, "movedim") for d in given]
        if len(set(wrapped)) != len(wrapped):
            raise RuntimeError(f"movedim: repeated dim in `{name}` ({given})")
    src = [wrap_dim(d, nd, "movedim") for d in src]
    dst = [wrap_dim(d, nd, "movedim") for d in dst]
    order = [d for d in range(nd) if d not in src]
    perm: list[int | None] = [None] * nd
    for s, d in zip(src, dst):
        perm[d] = s
    it = iter(order)
    perm = [p if p is not None else next(it) for p in perm]
    return permute(input, tuple(perm))


moveaxis = movedim


# ---- expand --------------------------------------------------------------------------

def _expand_infer(x, shape):
    nd = len(x.shape)
    if len(shape) < nd:
        raise RuntimeError(f"expand(tensor of shape {list(x.shape)}, size={list(shape)}): the "
                           f"number of sizes provided ({len(shape)}) must be greater or equal "
                           f"to the number of dimensions in the tensor ({nd})")
    lead = len(shape) - nd
    out = []
    for i, s in enumerate(shape):
        if i < lead:
            if s < 0:
                raise RuntimeError(f"expand: the expanded size of the tensor ({s}) isn't "
                                   "allowed in a leading, non-existing dimension 0")
            out.append(s)
            continue
        cur = x.shape[i - lead]
        if s == -1:
            out.append(cur)
        elif cur == s or cur == 1:
            out.append(s)
        else:
            raise RuntimeError(f"expand: The expanded size of the tensor ({s}) must match the "
                               f"existing size ({cur}) at non-singleton dimension {i}.  Target "
                               f"sizes: {list(shape)}.  Tensor sizes: {list(x.shape)}")
    return Meta(tuple(out), x.dtype)


def _expand_kernel(x, shape):
    # PyTorch's inferExpandGeometry: broadcast dims get stride 0, and a new leading dim of
    # size 1 the stride an unsqueeze would give it
    if -1 in shape:  # dispatch validated the sizes; only -1 needs resolving here
        # no dtype: the infer rule reads the shape only
        shape = _expand_infer(Meta(x.shape, None), shape).shape  # type: ignore[arg-type]
    nd, lead = len(shape), len(shape) - x.ndim
    strides = [0] * nd
    for i in range(nd - 1, -1, -1):
        if i >= lead:
            size, st = x.shape[i - lead], x.strides[i - lead]
        else:
            size, st = 1, (shape[i + 1] * strides[i + 1] if i + 1 < nd else 0)
        strides[i] = st if size == shape[i] else 0
    return _strided(x, shape, tuple(strides))


def _expand_sbp(x, shape):
    n, nx = len(shape), len(x.shape)
    sigs = []
    for k, size in enumerate(x.shape):
        d = k + n - nx
        if shape[d] in (-1, size):
            sigs.append(Signature((S(k),), (S(d),)))
    return sigs + linear_identity()


_EXPAND = defop("expand", _expand_infer, _expand_kernel, aliasing="view", save=(),
                grad=lambda ctx, g: (sum_to(g, ctx.input_metas[0].shape),),
                sbp=SbpRule(_expand_sbp, shape_attrs=("shape",)), cost=cost.view(),
                to_relax=_relax.expand, to_jax=_jax.expand)


def expand(input: Tensor, *sizes, size=None) -> Tensor:
    """Broadcast size-1 dims to ``sizes`` without copying (-1 keeps a dim)."""
    if size is not None:
        sizes = (size,)
    return dispatch(_EXPAND, input, shape=_shape_args(sizes, "expand", "size"))


def expand_as(input: Tensor, other: Tensor) -> Tensor:
    return expand(input, tuple(other.shape))


def broadcast_to(input: Tensor, size) -> Tensor:
    return expand(input, tuple(size))


# ---- slicing (basic indexing) --------------------------------------------------------

def _slice_infer(x, key):
    shape = []
    dim = 0
    nd = len(x.shape)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > nd:
        raise IndexError(f"too many indices for tensor of dimension {nd}")
    for k in key:
        if k is None:
            shape.append(1)
        elif k is Ellipsis:
            take = nd - n_real
            shape.extend(x.shape[dim:dim + take])
            dim += take
        elif isinstance(k, slice):
            if k.step is not None and k.step <= 0:
                raise ValueError("step must be greater than zero")
            shape.append(len(range(*k.indices(x.shape[dim]))))
            dim += 1
        else:
            size = x.shape[dim]
            if k < -size or k >= size:
                raise IndexError(f"index {k} is out of bounds for dimension {dim} with size "
                                 f"{size}")
            dim += 1
    shape.extend(x.shape[dim:])
    return Meta(tuple(shape), x.dtype)


def _slice_kernel(x, key):
    if not any(k is None for k in key):  # NumPy's strides are PyTorch's
        # a trailing Ellipsis keeps integer-only keys a 0-d view, not a NumPy scalar
        return x[key if any(k is Ellipsis for k in key) else key + (Ellipsis,)]
    # PyTorch applies the key left to right, and a None is an unsqueeze of the tensor so far:
    # its stride is size * stride of the (not yet sliced) dim it lands before, or 1 at the end
    r, d = x, 0
    skip = x.ndim - sum(1 for k in key if k is not None and k is not Ellipsis)
    for k in key:
        if k is None:
            st = r.shape[d] * r.strides[d] if d < r.ndim else r.itemsize
            r = _strided(r, r.shape[:d] + (1,) + r.shape[d:], r.strides[:d] + (st,) +
                         r.strides[d:])
            d += 1
        elif k is Ellipsis:
            d += skip
        elif isinstance(k, slice):
            r = r[(slice(None),) * d + (k,)]
            d += 1
        else:
            r = r[(slice(None),) * d + (k, Ellipsis)]
    return r


def _slice_grad(ctx, g):
    from tessera.ops.creation import zeros
    m = ctx.input_metas[0]
    base = zeros(m.shape, dtype=g.dtype, device=g.device)
    return (view_assign(base, g, ((_SLICE, (), {"key": ctx.attrs["key"]}),)),)


def _slice_sbp(x, key):
    """Basic indexing: a dim that the key leaves whole (``:``) can stay split."""
    n = len(x.shape)
    key = key if isinstance(key, tuple) else (key,)
    if any(k is None or k is Ellipsis for k in key):
        return linear_identity()
    sigs = []
    out = 0
    for d in range(n):
        k = key[d] if d < len(key) else slice(None)
        if isinstance(k, slice):
            if k == slice(None) or k.indices(x.shape[d]) == (0, x.shape[d], 1):
                sigs.append(Signature((S(d),), (S(out),)))
            out += 1
    return sigs + linear_identity()


_SLICE = defop("slice", _slice_infer, _slice_kernel, aliasing="view", save=(),
               grad=_slice_grad, sbp=SbpRule(_slice_sbp), cost=cost.view(),
               to_relax=_relax.slice_, to_jax=lambda jnp, lax, a, at: a[0][at["key"]])


def slice_view(input: Tensor, key: tuple) -> Tensor:
    """Basic indexing (ints, slices, None, Ellipsis) as a view."""
    return dispatch(_SLICE, input, key=key)


def narrow(input: Tensor, dim: int | None = None, start=None, length: int | None = None, *,
           axis=None) -> Tensor:
    """``length`` elements of dim ``dim`` from ``start``, as a view."""
    dim = dim if axis is None else axis
    if dim is None or start is None or length is None:
        missing("narrow", dim=dim, start=start, length=length)
    d = wrap_dim(dim, input.dim(), "narrow")
    size = input._shape[d]
    given = int(start)
    if not -size <= given <= size:
        raise IndexError(f"narrow: start out of range (expected to be in range of [{-size}, "
                         f"{size}], but got {given})")
    start = given + size if given < 0 else given
    if length < 0:
        raise RuntimeError("narrow(): length must be non-negative.")
    if start + length > size:
        raise RuntimeError(f"narrow: start ({start}) + length ({length}) exceeds dimension "
                           f"size ({size}).")
    key = (slice(None),) * d + (slice(start, start + length),)
    return slice_view(input, key)


def select(input: Tensor, dim: int | None = None, index: int | None = None, *,
           axis=None) -> Tensor:
    """Index ``index`` of dim ``dim``, which is removed; a view."""
    dim = dim if axis is None else axis
    if dim is None or index is None:
        missing("select", dim=dim, index=index)
    d = wrap_dim(dim, input.dim(), "select")
    size = input._shape[d]
    if index < -size or index >= size:
        raise IndexError(f"select(): index {index} out of range for tensor of size "
                         f"{list(input.shape)} at dimension {d}")
    return slice_view(input, (slice(None),) * d + (int(index),))


# ---- diagonal, unfold ----------------------------------------------------------------

def _diag_dims(x, offset, dim1, dim2):
    nd = len(x.shape)
    d1, d2 = wrap_dim(dim1, nd, "diagonal"), wrap_dim(dim2, nd, "diagonal")
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    return d1, d2


def _diagonal_infer(x, offset=0, dim1=0, dim2=1):
    d1, d2 = _diag_dims(x, offset, dim1, dim2)
    n1, n2 = x.shape[d1], x.shape[d2]
    n = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    rest = tuple(s for i, s in enumerate(x.shape) if i not in (d1, d2))
    return Meta(rest + (n,), x.dtype)


def _diagonal_kernel(x, offset=0, dim1=0, dim2=1):
    # no dtype: the infer rules read the shape only
    d1, d2 = _diag_dims(Meta(x.shape, None), offset, dim1, dim2)  # type: ignore[arg-type]
    m = _diagonal_infer(Meta(x.shape, None), offset, dim1, dim2)  # type: ignore[arg-type]
    if m.shape[-1] == 0:
        return np.empty(m.shape, x.dtype)
    # start at the first diagonal element, then step along both dims at once (writeable,
    # unlike np.diagonal's read-only view)
    start = [slice(None)] * x.ndim
    if offset >= 0:
        start[d2] = slice(offset, None)
    else:
        start[d1] = slice(-offset, None)
    xs = x[tuple(start)]
    st = xs.strides
    rest = tuple(s for i, s in enumerate(st) if i not in (d1, d2))
    return _strided(xs, m.shape, rest + (st[d1] + st[d2],))


def _diagonal_grad(ctx, g):
    from tessera.ops.creation import zeros
    m = ctx.input_metas[0]
    base = zeros(m.shape, dtype=g.dtype, device=g.device)
    return (view_assign(base, g, ((_DIAGONAL, (), dict(ctx.attrs)),)),)


def _diagonal_sbp(x, offset=0, dim1=0, dim2=1):
    """The dims the diagonal does not run along stay split (they keep their order, the
    diagonal goes last)."""
    n = len(x.shape)
    d1, d2 = wrap(dim1, n), wrap(dim2, n)
    rest = [d for d in range(n) if d not in (d1, d2)]
    return [Signature((S(d),), (S(j),)) for j, d in enumerate(rest)] + linear_identity()


_DIAGONAL = defop("diagonal", _diagonal_infer, _diagonal_kernel, aliasing="view", save=(),
                  grad=_diagonal_grad, sbp=SbpRule(_diagonal_sbp), cost=cost.view(),
                  to_jax=_jax.diagonal, to_relax=_relax.diagonal)


def diagonal(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal over dims (dim1, dim2), appended as the last dim; a view."""
    return dispatch(_DIAGONAL, input, offset=offset, dim1=dim1, dim2=dim2)


def _unfold_infer(x, dimension, size, step):
    nd = len(x.shape)
    d = wrap_dim(dimension, nd, "unfold") if nd else 0
    n = x.shape[d] if nd else 1
    if size > n:
        raise RuntimeError(f"unfold: maximum size for tensor at dimension {d} is {n} but size "
                           f"is {size}")
    if step <= 0:
        raise RuntimeError(f"unfold: step is {step} but must be > 0")
    count = (n - size) // step + 1
    shape = list(x.shape) if nd else []
    if nd:
        shape[d] = count
    return Meta(tuple(shape) + (size,), x.dtype)


def _unfold_kernel(x, dimension, size, step):
    if x.ndim == 0:
        return x.reshape(1)
    d = dimension % x.ndim
    # no dtype: the infer rule reads the shape only
    m = _unfold_infer(Meta(x.shape, None), dimension, size, step)  # type: ignore[arg-type]
    st = list(x.strides)
    st[d] = st[d] * step
    return _strided(x, m.shape, tuple(st) + (x.strides[d],))


def _unfold_backward_kernel(g, input_shape, dimension, size, step):
    out = np.zeros(input_shape, g.dtype)
    if not input_shape:
        return g.reshape(())
    win = _unfold_kernel(out, dimension, size, step)
    # Windows may overlap, so add one in-window offset k at a time: the elements at
    # offset k of distinct windows are distinct, which makes each += exact.
    for k in range(size):
        win[..., k] += g[..., k]
    return out


def _other_dims_sbp(n: int, dimension: int) -> list:
    """unfold and its backward: any dim but the unfolded one may stay split."""
    d0 = wrap(dimension, max(n, 1))
    return [Signature((S(d),), (S(d),)) for d in range(n) if d != d0] + linear_identity()


# the windows' gradients added into the input's shape: an addition per element of g
_UNFOLD_BACKWARD = defop(
    "unfold_backward",
    lambda g, input_shape, dimension, size, step: Meta(tuple(input_shape), g.dtype),
    _unfold_backward_kernel, save=(),
    grad=lambda ctx, gg: (unfold(gg, ctx.attrs["dimension"], ctx.attrs["size"],
                                 ctx.attrs["step"]),),
    sbp=SbpRule(lambda g, input_shape, dimension, size, step:
                _other_dims_sbp(len(input_shape), dimension), shape_attrs=("input_shape",)),
    cost=cost.reduction(1))


_UNFOLD = defop("unfold", _unfold_infer, _unfold_kernel, aliasing="view", save=(),
                grad=lambda ctx, g: (dispatch(_UNFOLD_BACKWARD, g,
                                              input_shape=ctx.input_metas[0].shape,
                                              **ctx.attrs),),
                sbp=SbpRule(lambda x, dimension, size, step:
                            _other_dims_sbp(len(x.shape), dimension)),
                cost=cost.view())


def unfold(input: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """All windows of ``size`` along ``dimension`` with stride ``step``, as a new last dim."""
    return dispatch(_UNFOLD, input, dimension=dimension, size=size, step=step)


def as_strided(input: Tensor, size, stride, storage_offset: int = 0) -> Tensor:
    raise NotImplementedError("as_strided is not supported: tessera views are built from "
                              "shape ops so that autograd and graphs can replay them")


# ---- view_assign: the functional form of writing into a view -------------------------

def _replay_np(arr, chain):
    for op, rest, attrs in chain:
        arr = op.kernels["cpu"](arr, *rest, **attrs)
    return arr


def _view_assign_kernel(base, src, chain):
    out = np.array(base, copy=True)
    v = _replay_np(out, chain)
    v[...] = src
    return out


def _view_assign_infer(base, src, chain):
    return Meta(base.shape, base.dtype)


def _replay(t: Tensor, chain) -> Tensor:
    for op, rest, attrs in chain:
        t = dispatch(op, t, *rest, **attrs)
    return t


def _view_assign_grad(ctx, g):
    from tessera.ops.creation import zeros
    chain = ctx.attrs["chain"]
    src_m = ctx.input_metas[1]
    gb = gs = None
    if ctx.needs_input_grad[0]:
        gb = view_assign(g, zeros(src_m.shape, dtype=g.dtype, device=g.device), chain)
    if ctx.needs_input_grad[1]:
        gs = sum_to(_replay(g, chain), src_m.shape)
    return gb, gs


_VIEW_ASSIGN = defop("view_assign", _view_assign_infer, _view_assign_kernel, save=(),
                     grad=_view_assign_grad,
                     sbp=SbpRule(lambda base, src, chain: linear_identity(2)),
                     cost=cost.movement())


def view_assign(base: Tensor, src: Tensor, chain) -> Tensor:
    """A copy of ``base`` whose view ``chain`` holds ``src``: the out-of-place form of an
    in-place write into a view (autograd's CopySlices)."""
    return dispatch(_VIEW_ASSIGN, base, src, chain=tuple(chain))
