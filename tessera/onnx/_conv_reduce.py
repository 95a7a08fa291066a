"""ONNX converters, part 2: reductions, sorting, shape and indexing ops (registered in
``tessera.onnx.converters.RULES``; see there for the rule signature)."""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera.onnx.converters import _axis, _dims, _f, _prod, _reduce, _t, rule

# ---- reductions ----------------------------------------------------------------------------


def _red(onnx_op: str, cast_bool=False):
    def conv(b, n):
        dt = n.out_dtype()
        src = D.int32 if cast_bool else dt
        x = _t(b, n, 0, D.bool_) if cast_bool and n.dtype(0) is not D.bool_ else _t(b, n, 0)
        x = b.cast(x, D.bool_ if cast_bool else n.dtype(0), src)
        a = n.attrs
        out = _reduce(b, onnx_op, x, _dims(a.get("dim"), n.rank(0)), a.get("keepdim", False))
        return b.cast(out, src, dt)
    conv.__name__ = f"_{onnx_op.lower()}"
    return conv


for _name, _op in {"sum": "ReduceSum", "mean": "ReduceMean", "amax": "ReduceMax",
                   "amin": "ReduceMin", "max": "ReduceMax", "min": "ReduceMin",
                   "prod": "ReduceProd", "logsumexp": "ReduceLogSumExp"}.items():
    rule(_name)(_red(_op))
rule("all")(_red("ReduceMin", cast_bool=True))
rule("any")(_red("ReduceMax", cast_bool=True))


def _arg(onnx_op: str):
    def conv(b, n):
        x = _t(b, n, 0)
        dim, keep = n.attrs.get("dim"), n.attrs.get("keepdim", False)
        if n.rank(0) == 0:
            return b.const(np.zeros(n.out_shape(), np.int64))
        if dim is None:
            flat = b.op("Reshape", [x, b.ints([-1])])
            out = b.op(onnx_op, [flat], axis=0, keepdims=0)
            return b.op("Reshape", [out, b.ints(n.out_shape())]) if keep else out
        return b.op(onnx_op, [x], axis=_axis(dim, n.rank(0)), keepdims=int(bool(keep)))
    return conv


rule("argmax")(_arg("ArgMax"))
rule("argmin")(_arg("ArgMin"))


def _val_idx(red: str, arg: str):
    def conv(b, n):
        x = _t(b, n, 0)
        dim, keep = _axis(n.attrs["dim"], n.rank(0)), n.attrs.get("keepdim", False)
        if n.rank(0) == 0:
            return b.op("Identity", [x]), b.const(np.array(0, np.int64))
        return (_reduce(b, red, x, [dim], keep),
                b.op(arg, [x], axis=dim, keepdims=int(bool(keep))))
    return conv


rule("max_dim")(_val_idx("ReduceMax", "ArgMax"))
rule("min_dim")(_val_idx("ReduceMin", "ArgMin"))


def _count(n, axes) -> int:
    shape = n.shape(0)
    return _prod(shape if axes is None else [shape[a] for a in axes])


def _moments(b, n, std: bool):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    a = n.attrs
    axes = _dims(a.get("dim"), n.rank(0))
    keep = a.get("keepdim", False)
    mean_k = _reduce(b, "ReduceMean", x, axes, True)
    d = b.op("Sub", [x, mean_k])
    s = _reduce(b, "ReduceSum", b.op("Mul", [d, d]), axes, keep)
    count = _count(n, axes)
    corr = a.get("correction", 1)
    var = b.op("Div", [s, _f(b, max(count - corr, 0), dt)])
    out = b.op("Sqrt", [var]) if std else var
    mean = mean_k if keep else _reduce(b, "ReduceMean", x, axes, False)
    return out, mean


rule("var")(lambda b, n: _moments(b, n, False)[0])
rule("std")(lambda b, n: _moments(b, n, True)[0])
rule("var_mean")(lambda b, n: _moments(b, n, False))
rule("std_mean")(lambda b, n: _moments(b, n, True))


@rule("norm")
def _norm(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    a = n.attrs
    axes, keep, p = _dims(a.get("dim"), n.rank(0)), a.get("keepdim", False), a.get("ord", 2)
    p = 2.0 if p is None else float(p)
    if p == 2:
        return _reduce(b, "ReduceL2", x, axes, keep)
    if p == 1:
        return _reduce(b, "ReduceL1", x, axes, keep)
    ax = b.op("Abs", [x])
    if p == float("inf"):
        return _reduce(b, "ReduceMax", ax, axes, keep)
    if p == float("-inf"):
        return _reduce(b, "ReduceMin", ax, axes, keep)
    if p == 0:
        nz = b.cast(b.op("Not", [b.op("Equal", [x, _f(b, 0, dt)])]), D.bool_, dt)
        return _reduce(b, "ReduceSum", nz, axes, keep)
    s = _reduce(b, "ReduceSum", b.op("Pow", [ax, _f(b, p, dt)]), axes, keep)
    return b.op("Pow", [s, _f(b, 1 / p, dt)])


@rule("count_nonzero")
def _count_nonzero(b, n):
    x = _t(b, n, 0)
    nz = b.op("Not", [b.op("Equal", [x, b.scalar(0, n.dtype(0))])])
    return _reduce(b, "ReduceSum", b.cast(nz, D.bool_, D.int64), _dims(n.attrs.get("dim"),
                                                                     n.rank(0)), False)


def _not_nan(b, x, dt):
    return b.op("Where", [b.op("IsNaN", [x]), _f(b, 0, dt), x])


@rule("nansum")
def _nansum(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    if dt.is_floating_point:
        x = _not_nan(b, x, dt)
    return _reduce(b, "ReduceSum", x, _dims(n.attrs.get("dim"), n.rank(0)),
                   n.attrs.get("keepdim", False))


@rule("nanmean")
def _nanmean(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    axes, keep = _dims(n.attrs.get("dim"), n.rank(0)), n.attrs.get("keepdim", False)
    ok = b.cast(b.op("Not", [b.op("IsNaN", [x])]), D.bool_, dt)
    s = _reduce(b, "ReduceSum", _not_nan(b, x, dt), axes, keep)
    return b.op("Div", [s, _reduce(b, "ReduceSum", ok, axes, keep)])


@rule("cumsum")
def _cumsum(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    if n.rank(0) == 0:
        return b.op("Identity", [x])
    return b.op("CumSum", [x, b.const(np.array(_axis(n.attrs["dim"], n.rank(0)), np.int64))])


def _softmax(onnx_op: str):
    def conv(b, n):
        dt = n.out_dtype()
        x = _t(b, n, 0, dt)
        if n.rank(0) == 0:
            return b.op("Identity", [x]) if onnx_op == "Softmax" else b.op("Sub", [x, x])
        return b.op(onnx_op, [x], axis=_axis(n.attrs["dim"], n.rank(0)))
    return conv


rule("softmax")(_softmax("Softmax"))
rule("log_softmax")(_softmax("LogSoftmax"))


@rule("topk")
def _topk(b, n):
    x = _t(b, n, 0)
    a = n.attrs
    if n.rank(0) == 0:
        return b.op("Identity", [x]), b.const(np.array(0, np.int64))
    return b.op("TopK", [x, b.ints([a["k"]])], n_out=2, axis=_axis(a["dim"], n.rank(0)),
                largest=int(bool(a.get("largest", True))), sorted=1)


@rule("sort")
def _sort(b, n):
    x = _t(b, n, 0)
    if n.rank(0) == 0:
        return b.op("Identity", [x]), b.const(np.array(0, np.int64))
    dim = _axis(n.attrs["dim"], n.rank(0))
    return b.op("TopK", [x, b.ints([n.shape(0)[dim]])], n_out=2, axis=dim,
                largest=int(bool(n.attrs.get("descending", False))), sorted=1)


@rule("kthvalue")
def _kthvalue(b, n):
    x = _t(b, n, 0)
    a = n.attrs
    if n.rank(0) == 0:
        return b.op("Identity", [x]), b.const(np.array(0, np.int64))
    dim = _axis(a["dim"], n.rank(0))
    v, i = b.op("TopK", [x, b.ints([a["k"]])], n_out=2, axis=dim, largest=0, sorted=1)
    pick = b.ints([a["k"] - 1])
    v, i = b.op("Gather", [v, pick], axis=dim), b.op("Gather", [i, pick], axis=dim)
    if not a.get("keepdim", False):
        v, i = (b.op("Squeeze", [t, b.ints([dim])]) for t in (v, i))
    return v, i


# ---- shape ops ------------------------------------------------------------------------------

def _reshape(b, x, shape) -> str:
    if 0 in [s for s in shape if isinstance(s, int)]:
        if b.opset < 14:
            raise NotImplementedError("reshaping to a size-0 dim needs opset 14 (allowzero)")
        return b.op("Reshape", [x, b.ints(shape)], allowzero=1)
    return b.op("Reshape", [x, b.ints(shape)])


@rule("view")
def _view(b, n):
    return _reshape(b, _t(b, n, 0), n.out_shape())


@rule("permute")
def _permute(b, n):
    x = _t(b, n, 0)
    if n.rank(0) == 0:
        return b.op("Identity", [x])
    return b.op("Transpose", [x], perm=[_axis(d, n.rank(0)) for d in n.attrs["dims"]])


@rule("expand")
def _expand(b, n):
    return b.op("Expand", [_t(b, n, 0), b.ints(n.out_shape())])


@rule("squeeze")
def _squeeze(b, n):
    x = _t(b, n, 0)
    if n.rank(0) == len(n.out_shape()):
        return b.op("Identity", [x])
    dims = n.attrs.get("dims")
    rank = n.rank(0)
    shape = n.shape(0)
    if dims is None:
        dims = range(rank)
    elif isinstance(dims, int):
        dims = (dims,)
    axes = sorted({_axis(d, rank) for d in dims if shape[_axis(d, rank)] == 1})
    return b.op("Squeeze", [x, b.ints(axes)])


@rule("unsqueeze")
def _unsqueeze(b, n):
    return b.op("Unsqueeze", [_t(b, n, 0), b.ints([_axis(n.attrs["dim"],
                                                          len(n.out_shape()))])])


@rule("cat")
def _cat(b, n):
    dt = n.out_dtype()
    rank = len(n.out_shape())
    ins = [_t(b, n, i, dt) for i in range(len(n.ins))
           if not (n.rank(i) == 1 and n.shape(i)[0] == 0 and rank != 1)]
    return b.op("Concat", ins, axis=_axis(n.attrs["dim"], rank))


@rule("split_view")
def _split_view(b, n):
    x = _t(b, n, 0)
    a = n.attrs
    dim = _axis(a["dim"], n.rank(0))
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


@rule("slice")
def _slice(b, n):
    x = _t(b, n, 0)
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


@rule("index")
def _index(b, n):
    from tessera.ops.getitem import T
    x = _t(b, n, 0)
    key = list(n.attrs["key"])
    rank = n.rank(0)
    key += [slice(None)] * (rank - len(key))
    pos = [i for i, k in enumerate(key) if k is T]
    idx = [_t(b, n, 1 + j) for j in range(len(pos))]
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


@rule("index_select")
def _index_select(b, n):
    x, i = _t(b, n, 0), _t(b, n, 1)
    if n.rank(1) == 0:
        i = b.op("Unsqueeze", [i, b.ints([0])])
    if n.rank(0) == 0:
        return b.op("Reshape", [b.op("Gather", [b.op("Reshape", [x, b.ints([1])]), i]),
                                b.ints([])])
    return b.op("Gather", [x, i], axis=_axis(n.attrs["dim"], n.rank(0)))


@rule("embedding")
def _embedding(b, n):
    return b.op("Gather", [_t(b, n, 0), _t(b, n, 1)], axis=0)


@rule("gather")
def _gather(b, n):
    if n.rank(0) == 0:
        return b.op("Identity", [_t(b, n, 0)])
    return b.op("GatherElements", [_t(b, n, 0), _t(b, n, 1)],
                axis=_axis(n.attrs["dim"], n.rank(0)))


@rule("take")
def _take(b, n):
    return b.op("Gather", [b.op("Reshape", [_t(b, n, 0), b.ints([-1])]), _t(b, n, 1)], axis=0)


_SCATTER_REDUCE = {None: "none", "add": "add", "multiply": "mul", "sum": "add",
                   "prod": "mul", "amax": "max", "amin": "min"}


def _scatter(b, n, reduce):
    dt = n.out_dtype()
    x, idx = _t(b, n, 0, dt), _t(b, n, 1)
    ishape = n.shape(1)
    if n.rank(0) == 0:
        raise NotImplementedError("0-d scatter")
    if n.is_tensor(2):
        src = _t(b, n, 2, dt)
        if tuple(n.shape(2)) != tuple(ishape):
            src = b.op("Slice", [src, b.ints([0] * len(ishape)), b.ints(ishape),
                                 b.ints(range(len(ishape)))])
    else:
        src = b.op("Expand", [_t(b, n, 2, dt), b.ints(ishape)])
    red = _SCATTER_REDUCE.get(reduce)
    if red is None:
        raise NotImplementedError(f"scatter reduce={reduce!r}")
    if red in ("max", "min") and b.opset < 18 or red != "none" and b.opset < 16:
        raise NotImplementedError(f"scatter with reduce={reduce!r} needs a newer opset")
    attrs = {"reduction": red} if red != "none" else {}
    return b.op("ScatterElements", [x, idx, src], axis=_axis(n.attrs["dim"], n.rank(0)),
                **attrs)


rule("scatter")(lambda b, n: _scatter(b, n, n.attrs.get("reduce")))
rule("scatter_add")(lambda b, n: _scatter(b, n, "add"))


@rule("scatter_reduce")
def _scatter_reduce(b, n):
    if not n.attrs.get("include_self", True):
        raise NotImplementedError("scatter_reduce with include_self=False")
    return _scatter(b, n, n.attrs["reduce"])


@rule("view_assign")
def _view_assign(b, n):
    """A write through a chain of views: the chain is applied to a table of flat positions
    (the ops' own kernels on an index array), and the value is scattered there."""
    dt = n.out_dtype()
    shape = n.shape(0)
    if not n.static(shape):
        raise NotImplementedError("writes through views need static shapes")
    pos = np.arange(_prod(shape), dtype=np.int64).reshape(shape)
    for op, args, attrs in n.attrs["chain"]:
        pos = op.kernels["cpu"](pos, *args, **attrs)
        if isinstance(pos, tuple):
            raise NotImplementedError(f"a write through '{op.name}'")
    pos = np.ascontiguousarray(pos)
    base = b.op("Reshape", [_t(b, n, 0, dt), b.ints([-1])])
    val = b.op("Expand", [_t(b, n, 1, dt), b.ints(pos.shape)])
    out = b.op("ScatterElements", [base, b.const(pos.reshape(-1)),
                                   b.op("Reshape", [val, b.ints([-1])])], axis=0)
    return b.op("Reshape", [out, b.ints(shape)])


@rule("index_put")
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
    x = _t(b, n, 0, dt)
    front = pos + rest
    if front != list(range(rank)):
        x = b.op("Transpose", [x], perm=front)
    bshape = tuple(np.broadcast_shapes(*[tuple(n.shape(2 + j)) for j in range(len(pos))]))
    nb = len(bshape)
    parts = [b.op("Unsqueeze", [b.op("Expand", [_t(b, n, 2 + j), b.ints(bshape)]),
                                b.ints([nb])]) for j in range(len(pos))]
    ind = b.op("Concat", parts, axis=-1) if len(parts) > 1 else parts[0]
    # the values broadcast to x[key]'s shape (NumPy's placement of the index dims)
    adjacent = pos[-1] - pos[0] == len(pos) - 1
    rest_shape = [shape[i] for i in rest]
    if adjacent:
        sub = rest_shape[:pos[0]] + list(bshape) + rest_shape[pos[0]:]
    else:
        sub = list(bshape) + rest_shape
    vals = b.op("Expand", [_t(b, n, 1, dt), b.ints(sub)])
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


@rule("flip")
def _flip(b, n):
    x = _t(b, n, 0)
    dims = [_axis(d, n.rank(0)) for d in n.attrs["dims"]]
    if not dims or n.rank(0) == 0:
        return b.op("Identity", [x])
    big = np.iinfo(np.int64)
    return b.op("Slice", [x, b.ints([-1] * len(dims)), b.ints([big.min] * len(dims)),
                          b.ints(dims), b.ints([-1] * len(dims))])


@rule("roll")
def _roll(b, n):
    x = _t(b, n, 0)
    shifts, dims = n.attrs["shifts"], n.attrs["dims"]
    shape = n.shape(0)
    if not dims:
        flat = b.op("Reshape", [x, b.ints([-1])])
        size = _prod(shape)
        return b.op("Reshape", [_roll1(b, flat, shifts[0], 0, size), b.ints(shape)])
    for s, d in zip(shifts, dims):
        d = _axis(d, n.rank(0))
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


@rule("repeat")
def _repeat(b, n):
    x = _t(b, n, 0)
    reps = list(n.attrs["repeats"])
    extra = len(reps) - n.rank(0)
    if extra:
        x = b.op("Reshape", [x, b.ints([1] * extra + list(n.shape(0)))])
    return b.op("Tile", [x, b.ints(reps)])


def _trilu(upper: int):
    def conv(b, n):
        k = b.const(np.array(n.attrs.get("diagonal", 0), np.int64))
        return b.op("Trilu", [_t(b, n, 0), k], upper=upper)
    return conv


rule("tril", opset=14)(_trilu(0))
rule("triu", opset=14)(_trilu(1))


@rule("unfold")
def _unfold(b, n):
    x = _t(b, n, 0)
    a = n.attrs
    if n.rank(0) == 0:
        return b.op("Reshape", [x, b.ints([1])])
    d = _axis(a["dimension"], n.rank(0))
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


@rule("diagonal")
def _diagonal(b, n):
    x = _t(b, n, 0)
    a = n.attrs
    rank = n.rank(0)
    d1, d2 = _axis(a["dim1"], rank), _axis(a["dim2"], rank)
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


@rule("constant_pad")
def _constant_pad(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    pads = n.attrs["pads"]
    lead = n.rank(0) - len(pads)
    lo = [0] * lead + [p[0] for p in pads]
    hi = [0] * lead + [p[1] for p in pads]
    return b.op("Pad", [x, b.ints(lo + hi), b.scalar(n.attrs.get("value", 0), dt)],
                mode="constant")


_PAD_MODES = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@rule("pad")
@rule("pad", opset=19)  # circular padding (mode "wrap")
def _pad(b, n):
    x = _t(b, n, 0)
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

