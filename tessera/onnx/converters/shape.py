"""Shape ops, both directions: reshapes, transposes, (un)squeezes, concatenation and
splits, slicing, flips and rolls, tiling, triangles, unfolding, diagonals and padding.

>>> from tessera.onnx.converters.registry import EXPORT, IMPORT
>>> sorted(EXPORT["pad"]), sorted(IMPORT["Squeeze"])
([13, 19], [1, 13])
"""
from __future__ import annotations

import numpy as np

from tessera._dispatch import dispatch
from tessera.onnx.converters.helpers import as_tensor, norm_axis, operand, static_prod
from tessera.onnx.converters.registry import export_rule, import_rule
from tessera.ops.registry import REGISTRY
from tessera.ops.shape import cat, split as _split, tril, triu

# ---- reshapes --------------------------------------------------------------------------

def _reshape(b, x, shape) -> str:
    if 0 in [s for s in shape if isinstance(s, int)]:
        if b.opset < 14:
            raise NotImplementedError("reshaping to a size-0 dim needs opset 14 (allowzero)")
        return b.op("Reshape", [x, b.ints(shape)], allowzero=1)
    return b.op("Reshape", [x, b.ints(shape)])


@export_rule("view")
def _view(b, n):
    return _reshape(b, operand(b, n, 0), n.out_shape())


@import_rule("Shape")
def _import_shape(c, x):
    shape = list(x.shape)
    start, end = c.attr("start", 0), c.attr("end", None)
    return as_tensor(np.array(shape[start:end], np.int64))


@import_rule("Size")
def _import_size(c, x):
    return as_tensor(np.array(x.numel(), np.int64))


@import_rule("Reshape", since=5)
def _import_reshape(c, x, shape):
    s = c.ints(shape)
    if not c.attr("allowzero", 0):
        s = [x.shape[i] if v == 0 else v for i, v in enumerate(s)]
    return x.reshape(s)


@import_rule("Flatten")
def _import_flatten(c, x):
    axis = c.attr("axis", 1)
    # ONNX allows [-r, r] here: negative ones checked against r, the others against r + 1
    c.check_axis(axis, x.dim() + (axis >= 0), "attribute 'axis'")
    axis = axis + x.dim() if axis < 0 else axis
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    return x.reshape(lead, -1) if x.numel() else x.reshape(lead, int(np.prod(x.shape[axis:])))


# ---- transposes, (un)squeezes, broadcasting -----------------------------------------

@export_rule("permute")
def _permute(b, n):
    x = operand(b, n, 0)
    if n.rank(0) == 0:
        return b.op("Identity", [x])
    return b.op("Transpose", [x], perm=[norm_axis(d, n.rank(0)) for d in n.attrs["dims"]])


@import_rule("Transpose")
def _import_transpose(c, x):
    perm = c.attr("perm") or list(reversed(range(x.dim())))
    return x.permute(*perm) if x.dim() else x


@export_rule("expand")
def _expand(b, n):
    return b.op("Expand", [operand(b, n, 0), b.ints(n.out_shape())])


@import_rule("Expand")
def _import_expand(c, x, shape):
    target = c.ints(shape)
    out = np.broadcast_shapes(tuple(x.shape), tuple(target))
    return x.expand(*out)


@export_rule("squeeze")
def _squeeze(b, n):
    x = operand(b, n, 0)
    if n.rank(0) == len(n.out_shape()):
        return b.op("Identity", [x])
    dims = n.attrs.get("dims")
    rank = n.rank(0)
    shape = n.shape(0)
    if dims is None:
        dims = range(rank)
    elif isinstance(dims, int):
        dims = (dims,)
    axes = sorted({norm_axis(d, rank) for d in dims if shape[norm_axis(d, rank)] == 1})
    return b.op("Squeeze", [x, b.ints(axes)])


@import_rule("Squeeze", since=13)
def _import_squeeze13(c, x, axes=None):
    if axes is None:
        return x.squeeze()
    return _squeeze_axes(c, x, c.ints(axes))


@import_rule("Squeeze")
def _import_squeeze1(c, x):
    axes = c.attr("axes")
    return x.squeeze() if not axes else _squeeze_axes(c, x, axes)


def _distinct(c, axes: list) -> list:
    from tessera.onnx.errors import OnnxValidationError
    if len(set(axes)) < len(axes):
        raise OnnxValidationError(f"{c.where}: 'axes' names an axis twice ({axes})")
    return axes


def _squeeze_axes(c, x, axes):
    axes = _distinct(c, [c.check_axis(a, x.dim(), "an entry of 'axes'") for a in axes])
    for a in sorted(axes, reverse=True):
        x = x.squeeze(a)
    return x


@export_rule("unsqueeze")
def _unsqueeze(b, n):
    return b.op("Unsqueeze", [operand(b, n, 0), b.ints([norm_axis(n.attrs["dim"],
                                                          len(n.out_shape()))])])


@import_rule("Unsqueeze", since=13)
def _import_unsqueeze13(c, x, axes):
    return _unsqueeze_axes(c, x, c.ints(axes))


@import_rule("Unsqueeze")
def _import_unsqueeze1(c, x):
    return _unsqueeze_axes(c, x, c.attr("axes"))


def _unsqueeze_axes(c, x, axes):
    rank = x.dim() + len(axes)
    axes = _distinct(c, [c.check_axis(a, rank, "an entry of 'axes'") for a in axes])
    for a in sorted(axes):
        x = x.unsqueeze(a)
    return x


# ---- concatenation and splits -------------------------------------------------------

@export_rule("cat")
def _cat(b, n):
    dt = n.out_dtype()
    rank = len(n.out_shape())
    ins = [operand(b, n, i, dt) for i in range(len(n.ins))
           if not (n.rank(i) == 1 and n.shape(i)[0] == 0 and rank != 1)]
    return b.op("Concat", ins, axis=norm_axis(n.attrs["dim"], rank))


@import_rule("Concat")
def _import_concat(c, *xs):
    return cat(list(xs), dim=c.axis("axis", max(xs[0].dim(), 1)))


@export_rule("split_view")
def _split_view(b, n):
    x = operand(b, n, 0)
    a = n.attrs
    dim = norm_axis(a["dim"], n.rank(0))
    bounds = a["bounds"]
    size = n.shape(0)[dim]
    if len(bounds) > 1 and bounds[0][0] == 0 and bounds[-1][1] == size and \
            all(p[1] == q[0] for p, q in zip(bounds, bounds[1:])):
        outs = b.op("Split", [x, b.ints([hi - lo for lo, hi in bounds])], n_out=len(bounds),
                    axis=dim)
    else:
        outs = [b.op("Slice", [x, b.ints([lo]), b.ints([hi]), b.ints([dim])])
                for lo, hi in bounds]
    if a.get("squeeze"):
        outs = [b.op("Squeeze", [o, b.ints([dim])]) for o in outs]
    return outs


def _split_sizes(c, x, axis, split):
    n = x.shape[axis]
    if split is not None:
        return split
    parts = c.attr("num_outputs") or len(c.node.output)
    if c.attr("num_outputs") is None and n % parts:
        from tessera.onnx.errors import OnnxValidationError
        raise OnnxValidationError(f"{c.where}: without input 'split', {n} elements along "
                                  f"axis {axis} do not split evenly into {parts} outputs")
    size = -(-n // parts)
    return [size] * (n // size) + ([n % size] if n % size else [])


@import_rule("Split", since=13)
def _import_split13(c, x, split=None):
    axis = c.axis("axis", x.dim())
    sizes = _split_sizes(c, x, axis, c.ints(split) if split is not None else None)
    return tuple(_split(x, sizes, dim=axis))


@import_rule("Split")
def _import_split1(c, x):
    axis = c.axis("axis", x.dim())
    sizes = _split_sizes(c, x, axis, c.attr("split"))
    return tuple(_split(x, sizes, dim=axis))


# ---- slicing, flips, rolls -----------------------------------------------------------

@export_rule("slice")
def _slice(b, n):
    x = operand(b, n, 0)
    key = n.attrs["key"]
    shape = n.shape(0)
    nd = len(shape)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    starts, ends, axes, steps, squeeze, new = [], [], [], [], [], []
    dim = out = 0
    for k in key:
        if k is None:
            new.append(out)
            out += 1
        elif k is Ellipsis:
            take = nd - n_real
            dim += take
            out += take
        elif isinstance(k, slice):
            if k != slice(None):
                start, stop, step = k.start, k.stop, k.step or 1
                starts.append(0 if start is None else start)
                ends.append(np.iinfo(np.int64).max if stop is None else stop)
                axes.append(dim)
                steps.append(step)
            dim += 1
            out += 1
        else:
            starts.append(k)
            ends.append(k + 1 if k != -1 else np.iinfo(np.int64).max)
            axes.append(dim)
            steps.append(1)
            squeeze.append(dim)
            dim += 1
    if axes:
        x = b.op("Slice", [x, b.ints(starts), b.ints(ends), b.ints(axes), b.ints(steps)])
    if squeeze:
        x = b.op("Squeeze", [x, b.ints(squeeze)])
    if new:
        x = b.op("Unsqueeze", [x, b.ints(new)])
    if not (axes or squeeze or new):
        x = b.op("Identity", [x])
    return x


@import_rule("Slice", since=10)
def _import_slice(c, x, starts, ends, axes=None, steps=None):
    starts, ends = c.ints(starts), c.ints(ends)
    axes = c.ints(axes) if axes is not None else list(range(len(starts)))
    steps = c.ints(steps) if steps is not None else [1] * len(starts)
    return _slice_impl(x, starts, ends, axes, steps)


def _slice_impl(x, starts, ends, axes, steps):
    key = [slice(None)] * x.dim()
    flips = []
    for s, e, a, st in zip(starts, ends, axes, steps):
        a %= x.dim()
        n = x.shape[a]
        if st > 0:
            key[a] = slice(*slice(s, e, st).indices(n))
        else:  # negative steps: the positions NumPy picks, taken from the flipped dim
            idx = list(range(*slice(s, e, st).indices(n)))
            if idx:
                key[a] = slice(n - 1 - idx[0], n - 1 - idx[-1] + 1, -st)
            else:
                key[a] = slice(0, 0)
            flips.append(a)
    if flips:
        x = x.flip(flips)
    if any(k != slice(None) for k in key):
        x = x[tuple(key)]
    return x


@export_rule("flip")
def _flip(b, n):
    x = operand(b, n, 0)
    dims = [norm_axis(d, n.rank(0)) for d in n.attrs["dims"]]
    if not dims or n.rank(0) == 0:
        return b.op("Identity", [x])
    big = np.iinfo(np.int64)
    return b.op("Slice", [x, b.ints([-1] * len(dims)), b.ints([big.min] * len(dims)),
                          b.ints(dims), b.ints([-1] * len(dims))])


@export_rule("roll")
def _roll(b, n):
    x = operand(b, n, 0)
    shifts, dims = n.attrs["shifts"], n.attrs["dims"]
    shape = n.shape(0)
    if not dims:
        flat = b.op("Reshape", [x, b.ints([-1])])
        size = static_prod(shape)
        return b.op("Reshape", [_roll1(b, flat, shifts[0], 0, size), b.ints(shape)])
    for s, d in zip(shifts, dims):
        d = norm_axis(d, n.rank(0))
        x = _roll1(b, x, s, d, shape[d])
    return x


def _roll1(b, x, shift, axis, size):
    if not isinstance(size, int):
        raise NotImplementedError("roll along a dynamic dim")
    if size == 0 or shift % size == 0:
        return b.op("Identity", [x])
    s = shift % size
    tail = b.op("Slice", [x, b.ints([size - s]), b.ints([size]), b.ints([axis])])
    head = b.op("Slice", [x, b.ints([0]), b.ints([size - s]), b.ints([axis])])
    return b.op("Concat", [tail, head], axis=axis)


# ---- tiling, triangles, windows, diagonals -------------------------------------------

@export_rule("repeat")
def _repeat(b, n):
    x = operand(b, n, 0)
    reps = list(n.attrs["repeats"])
    extra = len(reps) - n.rank(0)
    if extra:
        x = b.op("Reshape", [x, b.ints([1] * extra + list(n.shape(0)))])
    return b.op("Tile", [x, b.ints(reps)])


@import_rule("Tile")
def _import_tile(c, x, reps):
    return x.repeat(*c.ints(reps)) if x.dim() else x


def _trilu(upper: int):
    def conv(b, n):
        k = b.const(np.array(n.attrs.get("diagonal", 0), np.int64))
        return b.op("Trilu", [operand(b, n, 0), k], upper=upper)
    return conv


export_rule("tril", opset=14)(_trilu(0))
export_rule("triu", opset=14)(_trilu(1))


@import_rule("Trilu", since=14)
def _import_trilu(c, x, k=None):
    kk = c.ints(k)[0] if k is not None else 0
    return triu(x, kk) if c.attr("upper", 1) else tril(x, kk)


@export_rule("unfold")
def _unfold(b, n):
    x = operand(b, n, 0)
    a = n.attrs
    if n.rank(0) == 0:
        return b.op("Reshape", [x, b.ints([1])])
    d = norm_axis(a["dimension"], n.rank(0))
    size, step = a["size"], a["step"]
    length = n.shape(0)[d]
    if not isinstance(length, int):
        raise NotImplementedError("unfold along a dynamic dim")
    count = (length - size) // step + 1
    idx = (np.arange(count)[:, None] * step + np.arange(size)[None, :]).astype(np.int64)
    g = b.op("Gather", [x, b.const(idx)], axis=d)   # (..., count, size, ...)
    rank = n.rank(0) + 1
    perm = [i for i in range(rank) if i != d + 1] + [d + 1]
    return b.op("Transpose", [g], perm=perm)


@export_rule("diagonal")
def _diagonal(b, n):
    x = operand(b, n, 0)
    a = n.attrs
    rank = n.rank(0)
    d1, d2 = norm_axis(a["dim1"], rank), norm_axis(a["dim2"], rank)
    shape = n.shape(0)
    off = a.get("offset", 0)
    m = n.out_shape()[-1]
    if not isinstance(m, int):
        raise NotImplementedError("diagonal of dynamic dims")
    rest = [i for i in range(rank) if i not in (d1, d2)]
    t = b.op("Transpose", [x], perm=rest + [d1, d2])
    lead = [shape[i] for i in rest]
    r = np.arange(m) + max(-off, 0)
    c = np.arange(m) + max(off, 0)
    flat = (r * shape[d2] + c).astype(np.int64)
    t = b.op("Reshape", [t, b.ints(lead + [shape[d1] * shape[d2]])])
    return b.op("Gather", [t, b.const(flat)], axis=len(lead))


@import_rule("DepthToSpace")
def _import_depth_to_space(c, x):
    b = c.attr("blocksize")
    n, ch, h, w = x.shape
    if c.attr("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, ch // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, ch // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, ch // (b * b), h * b, w * b)


@import_rule("SpaceToDepth")
def _import_space_to_depth(c, x):
    b = c.attr("blocksize")
    n, ch, h, w = x.shape
    y = x.reshape(n, ch, h // b, b, w // b, b)
    y = y.permute(0, 1, 3, 5, 2, 4) if c.attr("mode", "DCR") == "CRD" else \
        y.permute(0, 3, 5, 1, 2, 4)
    return y.reshape(n, ch * b * b, h // b, w // b)


# ---- padding --------------------------------------------------------------------------

@export_rule("constant_pad")
def _constant_pad(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    pads = n.attrs["pads"]
    lead = n.rank(0) - len(pads)
    lo = [0] * lead + [p[0] for p in pads]
    hi = [0] * lead + [p[1] for p in pads]
    return b.op("Pad", [x, b.ints(lo + hi), b.scalar(n.attrs.get("value", 0), dt)],
                mode="constant")


# tessera padding mode -> ONNX Pad mode (and back, for the import)
_PAD_MODES = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@export_rule("pad")
@export_rule("pad", opset=19)  # circular padding (mode "wrap")
def _pad(b, n):
    x = operand(b, n, 0)
    pads, mode = n.attrs["pads"], n.attrs["mode"]
    lead = n.rank(0) - len(pads)
    if mode == "circular":
        if b.opset < 19:
            raise NotImplementedError("circular padding needs opset 19")
        if any(lo < 0 or hi < 0 for lo, hi in pads):  # crop first, then wrap
            shape = n.shape(0)
            axes = [lead + i for i in range(len(pads))]
            x = b.op("Slice", [x, b.ints([max(-lo, 0) for lo, _ in pads]),
                               b.ints([shape[a] - max(-hi, 0) for a, (_, hi) in
                                       zip(axes, pads)]), b.ints(axes)])
            pads = [(max(lo, 0), max(hi, 0)) for lo, hi in pads]
    lo = [0] * lead + [p[0] for p in pads]
    hi = [0] * lead + [p[1] for p in pads]
    return b.op("Pad", [x, b.ints(lo + hi)], mode=_PAD_MODES[mode])


@import_rule("Pad", since=11)
def _import_pad(c, x, pads, value=None, axes=None):
    p = c.ints(pads)
    rank = x.dim()
    ax = [c.check_axis(a, rank, "an entry of input 'axes'")
          for a in c.ints(axes)] if axes is not None else list(range(rank))
    lo = dict(zip(ax, p[:len(ax)]))
    hi = dict(zip(ax, p[len(ax):]))
    pairs = tuple((lo.get(i, 0), hi.get(i, 0)) for i in range(rank))
    mode = c.attr("mode", "constant")
    if mode == "constant":
        v = c.value(value).item() if value is not None and value.numel() else 0
        return dispatch(REGISTRY["constant_pad"], x, pads=pairs, value=v)
    tmode = {o: t for t, o in _PAD_MODES.items()}[mode]
    return dispatch(REGISTRY["pad"], x, pads=pairs, mode=tmode)
