"""Indexing, both directions: advanced indexing and ``index_select`` (Gather, GatherND),
``gather`` (GatherElements), scatters (ScatterElements, ScatterND), writes through views,
``index_put`` and one-hot encoding.

>>> from tessera.onnx.converters.registry import EXPORT, IMPORT
>>> "index_put" in EXPORT, sorted(n for n in IMPORT if n.startswith("Scatter"))
(True, ['ScatterElements', 'ScatterND'])
"""
from __future__ import annotations

import numpy as np

import tessera.nn.functional as F
from tessera import _dtype as D
from tessera.onnx.converters.helpers import norm_axis, operand, static_prod
from tessera.onnx.converters.registry import export_rule, import_rule
from tessera.ops.creation import arange, zeros_like
from tessera.ops.gather_scatter import gather
from tessera.ops.getitem import index_put
from tessera.ops.index_slices import index_select
from tessera.ops.ternary import where

# ---- gathers ---------------------------------------------------------------------------

@export_rule("index")
def _index(b, n):
    from tessera.ops.getitem import T
    x = operand(b, n, 0)
    key = list(n.attrs["key"])
    rank = n.rank(0)
    key += [slice(None)] * (rank - len(key))
    pos = [i for i, k in enumerate(key) if k is T]
    idx = [operand(b, n, 1 + j) for j in range(len(pos))]
    if any(k is not T and k != slice(None) for k in key):
        raise NotImplementedError(f"index key {key}")
    if len(pos) == 1:
        return b.op("Gather", [x, idx[0]], axis=pos[0])
    # several index tensors: their dims to the front, GatherND on the broadcast indices
    rest = [i for i in range(rank) if i not in pos]
    if pos != list(range(len(pos))):
        x = b.op("Transpose", [x], perm=pos + rest)
    bshape = n.out_shape()
    adjacent = pos[-1] - pos[0] == len(pos) - 1
    nb = len(bshape) - len(rest)
    bsh = bshape[pos[0]:pos[0] + nb] if adjacent else bshape[:nb]
    parts = [b.op("Unsqueeze", [b.op("Expand", [i, b.ints(bsh)]), b.ints([nb])]) for i in idx]
    out = b.op("GatherND", [x, b.op("Concat", parts, axis=-1)])
    if adjacent and pos[0] != 0:  # NumPy puts adjacent index dims where they were
        perm = list(range(nb, nb + pos[0])) + list(range(nb)) + \
            list(range(nb + pos[0], len(bshape)))
        out = b.op("Transpose", [out], perm=perm)
    return out


@export_rule("index_select")
def _index_select(b, n):
    x, i = operand(b, n, 0), operand(b, n, 1)
    if n.rank(1) == 0:
        i = b.op("Unsqueeze", [i, b.ints([0])])
    if n.rank(0) == 0:
        return b.op("Reshape", [b.op("Gather", [b.op("Reshape", [x, b.ints([1])]), i]),
                                b.ints([])])
    return b.op("Gather", [x, i], axis=norm_axis(n.attrs["dim"], n.rank(0)))


@export_rule("embedding")
def _embedding(b, n):
    return b.op("Gather", [operand(b, n, 0), operand(b, n, 1)], axis=0)


@export_rule("take")
def _take(b, n):
    flat = b.op("Reshape", [operand(b, n, 0), b.ints([-1])])
    return b.op("Gather", [flat, operand(b, n, 1)], axis=0)


@import_rule("Gather")
def _import_gather(c, x, idx):
    axis = c.axis("axis", x.dim())
    if not idx.numel() or idx.dtype not in (D.int64, D.int32):
        idx = where(idx < 0, idx + x.shape[axis], idx) if idx.numel() else idx
        flat = index_select(x, axis, idx.reshape(-1).long())
        shape = list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:])
        return flat.reshape(shape)
    # advanced indexing on one dim is Gather exactly (negative indices wrap)
    return x[(slice(None),) * axis + (idx,)]


@export_rule("gather")
def _gather(b, n):
    if n.rank(0) == 0:
        return b.op("Identity", [operand(b, n, 0)])
    return b.op("GatherElements", [operand(b, n, 0), operand(b, n, 1)],
                axis=norm_axis(n.attrs["dim"], n.rank(0)))


@import_rule("GatherElements")
def _import_gather_elements(c, x, idx):
    axis = c.axis("axis", x.dim())
    idx = where(idx < 0, idx + x.shape[axis], idx).long()
    return gather(x, axis, idx)


@import_rule("GatherND")
def _import_gather_nd(c, x, idx):
    bd = c.attr("batch_dims", 0)
    k = idx.shape[-1]
    if bd:  # the batch dims flattened into one, indexed by an arange of it
        lead = x.shape[:bd]
        nb = int(np.prod(lead, dtype=np.int64))
        x = x.reshape((nb,) + tuple(x.shape[bd:]))
        mid = tuple(idx.shape[bd:-1])
        idx = idx.reshape((nb,) + mid + (k,))
        parts = [idx[..., j] for j in range(k)]
        parts = [where(p < 0, p + x.shape[1 + j], p) for j, p in enumerate(parts)]
        ar = arange(nb).reshape((nb,) + (1,) * len(mid))
        out = x[(ar,) + tuple(parts)]
        return out.reshape(tuple(lead) + mid + tuple(out.shape[1 + len(mid):]))
    parts = [idx[..., j] for j in range(k)]
    parts = [where(p < 0, p + x.shape[j], p) for j, p in enumerate(parts)]
    return x[tuple(parts)]


# ---- scatters --------------------------------------------------------------------------

_SCATTER_REDUCE = {None: "none", "add": "add", "multiply": "mul", "sum": "add",
                   "prod": "mul", "amax": "max", "amin": "min"}


def _scatter(b, n, reduce):
    dt = n.out_dtype()
    x, idx = operand(b, n, 0, dt), operand(b, n, 1)
    ishape = n.shape(1)
    if n.rank(0) == 0:
        raise NotImplementedError("0-d scatter")
    if n.is_tensor(2):
        src = operand(b, n, 2, dt)
        if tuple(n.shape(2)) != tuple(ishape):
            src = b.op("Slice", [src, b.ints([0] * len(ishape)), b.ints(ishape),
                                 b.ints(range(len(ishape)))])
    else:
        src = b.op("Expand", [operand(b, n, 2, dt), b.ints(ishape)])
    red = _SCATTER_REDUCE.get(reduce)
    if red is None:
        raise NotImplementedError(f"scatter reduce={reduce!r}")
    if red in ("max", "min") and b.opset < 18 or red != "none" and b.opset < 16:
        raise NotImplementedError(f"scatter with reduce={reduce!r} needs a newer opset")
    attrs = {"reduction": red} if red != "none" else {}
    return b.op("ScatterElements", [x, idx, src], axis=norm_axis(n.attrs["dim"], n.rank(0)),
                **attrs)


export_rule("scatter")(lambda b, n: _scatter(b, n, n.attrs.get("reduce")))
export_rule("scatter_add")(lambda b, n: _scatter(b, n, "add"))


@export_rule("scatter_reduce")
def _scatter_reduce(b, n):
    if not n.attrs.get("include_self", True):
        raise NotImplementedError("scatter_reduce with include_self=False")
    return _scatter(b, n, n.attrs["reduce"])


@import_rule("ScatterElements")
def _import_scatter_elements(c, x, idx, upd):
    from tessera.onnx.errors import OnnxValidationError
    axis = c.axis("axis", x.dim())
    if idx.shape != upd.shape:   # PyTorch's scatter would take a larger src
        raise OnnxValidationError(f"{c.where}: indices {list(idx.shape)} and updates "
                                  f"{list(upd.shape)} must have one shape")
    idx = where(idx < 0, idx + x.shape[axis], idx).long()
    red = c.attr("reduction", "none")
    if red == "none":
        return x.scatter(axis, idx, upd)
    modes = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}
    if red not in modes:
        raise OnnxValidationError(f"{c.where}: attribute 'reduction' is '{red}'; it must be "
                                  f"one of none, {', '.join(modes)}")
    mode = modes[red]
    return x.scatter_reduce(axis, idx, upd, reduce=mode, include_self=True)


@export_rule("index_put")
def _index_put(b, n):
    """ScatterND on the indexed dims moved to the front (values laid out the same way)."""
    from tessera.ops.getitem import T
    dt = n.out_dtype()
    rank = n.rank(0)
    key = list(n.attrs["key"]) + [slice(None)] * (rank - len(n.attrs["key"]))
    if any(k is not T and k != slice(None) for k in key):
        raise NotImplementedError(f"index_put with key {key}")
    pos = [i for i, k in enumerate(key) if k is T]
    rest = [i for i in range(rank) if i not in pos]
    shape = n.shape(0)
    x = operand(b, n, 0, dt)
    front = pos + rest
    if front != list(range(rank)):
        x = b.op("Transpose", [x], perm=front)
    bshape = tuple(np.broadcast_shapes(*[tuple(n.shape(2 + j)) for j in range(len(pos))]))
    nb = len(bshape)
    parts = [b.op("Unsqueeze", [b.op("Expand", [operand(b, n, 2 + j), b.ints(bshape)]),
                                b.ints([nb])]) for j in range(len(pos))]
    ind = b.op("Concat", parts, axis=-1) if len(parts) > 1 else parts[0]
    # the values broadcast to x[key]'s shape (NumPy's placement of the index dims)
    adjacent = pos[-1] - pos[0] == len(pos) - 1
    rest_shape = [shape[i] for i in rest]
    if adjacent:
        sub = rest_shape[:pos[0]] + list(bshape) + rest_shape[pos[0]:]
    else:
        sub = list(bshape) + rest_shape
    vals = b.op("Expand", [operand(b, n, 1, dt), b.ints(sub)])
    if adjacent and pos[0] != 0:
        perm = list(range(pos[0], pos[0] + nb)) + list(range(pos[0])) + \
            list(range(pos[0] + nb, len(sub)))
        vals = b.op("Transpose", [vals], perm=perm)
    if n.attrs.get("accumulate"):
        if b.opset < 16:
            raise NotImplementedError("index_put(accumulate=True) needs opset 16")
        out = b.op("ScatterND", [x, ind, vals], reduction="add")
    else:
        out = b.op("ScatterND", [x, ind, vals])
    if front != list(range(rank)):
        out = b.op("Transpose", [out], perm=[front.index(i) for i in range(rank)])
    return out


@import_rule("ScatterND")
def _import_scatter_nd(c, x, idx, upd):
    k = idx.shape[-1]
    red = c.attr("reduction", "none")
    if red in ("none", "add"):
        parts = tuple(idx[..., j] for j in range(k))
        return index_put(x, parts, upd, accumulate=red == "add")
    # other reductions: scatter_reduce over the first k dims flattened into one
    lead = x.shape[:k]
    strides = np.cumprod([1] + list(lead[::-1]))[:-1][::-1]
    lin = sum(where(idx[..., j] < 0, idx[..., j] + lead[j], idx[..., j]) *
               int(strides[j]) for j in range(k))
    rest = int(np.prod(x.shape[k:], dtype=np.int64))
    x2 = x.reshape(int(np.prod(lead, dtype=np.int64)), rest)
    u2 = upd.reshape(-1, rest)
    index = lin.reshape(-1, 1).expand(u2.shape[0], rest).long()
    mode = {"mul": "prod", "max": "amax", "min": "amin"}[red]
    return x2.scatter_reduce(0, index, u2, reduce=mode, include_self=True).reshape(x.shape)


@export_rule("view_assign")
def _view_assign(b, n):
    """A write through a chain of views: the chain is applied to a table of flat positions
    (the ops' own kernels on an index array), and the value is scattered there."""
    dt = n.out_dtype()
    shape = n.shape(0)
    if not n.static(shape):
        raise NotImplementedError("writes through views need static shapes")
    pos = np.arange(static_prod(shape), dtype=np.int64).reshape(shape)
    for op, args, attrs in n.attrs["chain"]:
        pos = op.kernels["cpu"](pos, *args, **attrs)
        if isinstance(pos, tuple):
            raise NotImplementedError(f"a write through '{op.name}'")
    pos = np.ascontiguousarray(pos)
    base = b.op("Reshape", [operand(b, n, 0, dt), b.ints([-1])])
    val = b.op("Expand", [operand(b, n, 1, dt), b.ints(pos.shape)])
    out = b.op("ScatterElements", [base, b.const(pos.reshape(-1)),
                                   b.op("Reshape", [val, b.ints([-1])])], axis=0)
    return b.op("Reshape", [out, b.ints(shape)])


# ---- one-hot ---------------------------------------------------------------------------

@import_rule("OneHot")
def _import_one_hot(c, idx, depth, values):
    d = int(c.value(depth).reshape(-1)[0])
    axis = c.axis("axis", idx.dim() + 1, -1)
    i = where(idx < 0, idx + d, idx).long()
    valid = (i >= 0) & (i < d)
    oh = F.one_hot(where(valid, i, zeros_like(i)), d) * valid.unsqueeze(-1)
    rank = oh.dim()
    if axis % rank != rank - 1:
        oh = oh.movedim(-1, axis % rank)
    off, on = values[0], values[1]
    return where(oh.to(D.bool_), on, off)
