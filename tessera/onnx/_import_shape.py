"""Import rules, part 2: shape and indexing ops, creation, convolution, pooling,
normalisation, resampling and losses (registered in ``_import_ops.IMPORTERS``)."""
from __future__ import annotations

import numpy as np

import tessera
import tessera.nn.functional as F
from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.onnx._import_ops import _dt, onnx_op
from tessera.ops.registry import REGISTRY


def _t(arr) -> Tensor:
    return Tensor._from_numpy(np.array(arr, copy=True))


# ---- shape ------------------------------------------------------------------------------------

@onnx_op("Shape")
def _shape(c, x):
    shape = list(x.shape)
    start, end = c.attr("start", 0), c.attr("end", None)
    return _t(np.array(shape[start:end], np.int64))


@onnx_op("Size")
def _size(c, x):
    return _t(np.array(x.numel(), np.int64))


@onnx_op("Reshape", since=5)
def _reshape(c, x, shape):
    s = c.ints(shape)
    if not c.attr("allowzero", 0):
        s = [x.shape[i] if v == 0 else v for i, v in enumerate(s)]
    return x.reshape(s)


@onnx_op("Flatten")
def _flatten(c, x):
    axis = c.attr("axis", 1)
    axis = axis + x.dim() if axis < 0 else axis
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    return x.reshape(lead, -1) if x.numel() else x.reshape(lead, int(np.prod(x.shape[axis:])))


@onnx_op("Transpose")
def _transpose(c, x):
    perm = c.attr("perm") or list(reversed(range(x.dim())))
    return x.permute(*perm) if x.dim() else x


@onnx_op("Squeeze", since=13)
def _squeeze13(c, x, axes=None):
    if axes is None:
        return x.squeeze()
    return _squeeze_axes(x, c.ints(axes))


@onnx_op("Squeeze")
def _squeeze1(c, x):
    axes = c.attr("axes")
    return x.squeeze() if not axes else _squeeze_axes(x, axes)


def _squeeze_axes(x, axes):
    for a in sorted((a % x.dim() for a in axes), reverse=True):
        x = x.squeeze(a)
    return x


@onnx_op("Unsqueeze", since=13)
def _unsqueeze13(c, x, axes):
    return _unsqueeze_axes(x, c.ints(axes))


@onnx_op("Unsqueeze")
def _unsqueeze1(c, x):
    return _unsqueeze_axes(x, c.attr("axes"))


def _unsqueeze_axes(x, axes):
    rank = x.dim() + len(axes)
    for a in sorted(a % rank for a in axes):
        x = x.unsqueeze(a)
    return x


@onnx_op("Concat")
def _concat(c, *xs):
    return tessera.cat(list(xs), dim=c.attr("axis"))


def _split_sizes(c, x, axis, split):
    n = x.shape[axis]
    if split is not None:
        return split
    parts = c.attr("num_outputs") or len(c.node.output)
    size = -(-n // parts)
    return [size] * (n // size) + ([n % size] if n % size else [])


@onnx_op("Split", since=13)
def _split13(c, x, split=None):
    axis = c.attr("axis", 0) % x.dim()
    sizes = _split_sizes(c, x, axis, c.ints(split) if split is not None else None)
    return tuple(tessera.split(x, sizes, dim=axis))


@onnx_op("Split")
def _split1(c, x):
    axis = c.attr("axis", 0) % x.dim()
    sizes = _split_sizes(c, x, axis, c.attr("split"))
    return tuple(tessera.split(x, sizes, dim=axis))


@onnx_op("Slice", since=10)
def _slice(c, x, starts, ends, axes=None, steps=None):
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


@onnx_op("Gather")
def _gather(c, x, idx):
    axis = c.attr("axis", 0) % x.dim()
    if not idx.numel() or idx.dtype not in (D.int64, D.int32):
        idx = tessera.where(idx < 0, idx + x.shape[axis], idx) if idx.numel() else idx
        flat = tessera.index_select(x, axis, idx.reshape(-1).long())
        shape = list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:])
        return flat.reshape(shape)
    # advanced indexing on one dim is Gather exactly (negative indices wrap)
    return x[(slice(None),) * axis + (idx,)]


@onnx_op("GatherElements")
def _gather_elements(c, x, idx):
    axis = c.attr("axis", 0) % x.dim()
    idx = tessera.where(idx < 0, idx + x.shape[axis], idx).long()
    return tessera.gather(x, axis, idx)


@onnx_op("GatherND")
def _gather_nd(c, x, idx):
    bd = c.attr("batch_dims", 0)
    k = idx.shape[-1]
    if bd:  # the batch dims flattened into one, indexed by an arange of it
        lead = x.shape[:bd]
        nb = int(np.prod(lead, dtype=np.int64))
        x = x.reshape((nb,) + tuple(x.shape[bd:]))
        mid = tuple(idx.shape[bd:-1])
        idx = idx.reshape((nb,) + mid + (k,))
        parts = [idx[..., j] for j in range(k)]
        parts = [tessera.where(p < 0, p + x.shape[1 + j], p) for j, p in enumerate(parts)]
        ar = tessera.arange(nb).reshape((nb,) + (1,) * len(mid))
        out = x[(ar,) + tuple(parts)]
        return out.reshape(tuple(lead) + mid + tuple(out.shape[1 + len(mid):]))
    parts = [idx[..., j] for j in range(k)]
    parts = [tessera.where(p < 0, p + x.shape[j], p) for j, p in enumerate(parts)]
    return x[tuple(parts)]


@onnx_op("ScatterElements")
def _scatter_elements(c, x, idx, upd):
    axis = c.attr("axis", 0) % x.dim()
    idx = tessera.where(idx < 0, idx + x.shape[axis], idx).long()
    red = c.attr("reduction", "none")
    if red == "none":
        return x.scatter(axis, idx, upd)
    mode = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[red]
    return x.scatter_reduce(axis, idx, upd, reduce=mode, include_self=True)


@onnx_op("ScatterND")
def _scatter_nd(c, x, idx, upd):
    k = idx.shape[-1]
    red = c.attr("reduction", "none")
    if red in ("none", "add"):
        parts = tuple(idx[..., j] for j in range(k))
        return tessera.index_put(x, parts, upd, accumulate=red == "add")
    # other reductions: scatter_reduce over the first k dims flattened into one
    lead = x.shape[:k]
    strides = np.cumprod([1] + list(lead[::-1]))[:-1][::-1]
    lin = sum(tessera.where(idx[..., j] < 0, idx[..., j] + lead[j], idx[..., j]) *
               int(strides[j]) for j in range(k))
    rest = int(np.prod(x.shape[k:], dtype=np.int64))
    x2 = x.reshape(int(np.prod(lead, dtype=np.int64)), rest)
    u2 = upd.reshape(-1, rest)
    index = lin.reshape(-1, 1).expand(u2.shape[0], rest).long()
    mode = {"mul": "prod", "max": "amax", "min": "amin"}[red]
    return x2.scatter_reduce(0, index, u2, reduce=mode, include_self=True).reshape(x.shape)


@onnx_op("Expand")
def _expand(c, x, shape):
    target = c.ints(shape)
    out = np.broadcast_shapes(tuple(x.shape), tuple(target))
    return x.expand(*out)


@onnx_op("Tile")
def _tile(c, x, reps):
    return x.repeat(*c.ints(reps)) if x.dim() else x


@onnx_op("Constant")
def _constant(c):
    from onnx import numpy_helper
    a = c.attrs
    if "value" in a:
        return _t(numpy_helper.to_array(a["value"]))
    for k, dt in (("value_float", np.float32), ("value_int", np.int64),
                  ("value_floats", np.float32), ("value_ints", np.int64)):
        if k in a:
            return _t(np.array(a[k], dt))
    raise NotImplementedError(f"attribute {sorted(a)}")


@onnx_op("ConstantOfShape")
def _constant_of_shape(c, shape):
    from onnx import numpy_helper
    v = c.attr("value")
    arr = numpy_helper.to_array(v) if v is not None else np.zeros(1, np.float32)
    return _t(np.full(c.ints(shape), arr.reshape(-1)[0], arr.dtype))


@onnx_op("Range")
def _range(c, start, limit, delta):
    s, e, d = (c.value(t).item() for t in (start, limit, delta))
    n = max(int(np.ceil((e - s) / d)), 0)
    return _t((s + d * np.arange(n)).astype(c.value(start).dtype))


@onnx_op("EyeLike")
def _eye_like(c, x):
    dt = _dt(c.attr("dtype")) if c.attr("dtype") is not None else x.dtype
    return _t(np.eye(x.shape[0], x.shape[1], k=c.attr("k", 0), dtype=dt.np))


@onnx_op("Trilu", since=14)
def _trilu(c, x, k=None):
    kk = c.ints(k)[0] if k is not None else 0
    return tessera.triu(x, kk) if c.attr("upper", 1) else tessera.tril(x, kk)


@onnx_op("Dropout", since=12)
def _dropout(c, x, ratio=None, training=None):
    p = float(c.value(ratio).reshape(-1)[0]) if ratio is not None else 0.5
    if training is not None and bool(c.value(training)) and p > 0:
        raise NotImplementedError("training mode (a random mask)")
    return x, tessera.ones(x.shape, dtype=tessera.bool)


@onnx_op("Dropout")
def _dropout_old(c, x):
    return x, tessera.ones(x.shape, dtype=tessera.bool)


@onnx_op("OneHot")
def _one_hot(c, idx, depth, values):
    d = int(c.value(depth).reshape(-1)[0])
    axis = c.attr("axis", -1)
    i = tessera.where(idx < 0, idx + d, idx).long()
    valid = (i >= 0) & (i < d)
    oh = F.one_hot(tessera.where(valid, i, tessera.zeros_like(i)), d) * valid.unsqueeze(-1)
    rank = oh.dim()
    if axis % rank != rank - 1:
        oh = oh.movedim(-1, axis % rank)
    off, on = values[0], values[1]
    return tessera.where(oh.to(tessera.bool), on, off)


@onnx_op("DepthToSpace")
def _depth_to_space(c, x):
    b = c.attr("blocksize")
    n, ch, h, w = x.shape
    if c.attr("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, ch // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, ch // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, ch // (b * b), h * b, w * b)


@onnx_op("SpaceToDepth")
def _space_to_depth(c, x):
    b = c.attr("blocksize")
    n, ch, h, w = x.shape
    y = x.reshape(n, ch, h // b, b, w // b, b)
    y = y.permute(0, 1, 3, 5, 2, 4) if c.attr("mode", "DCR") == "CRD" else \
        y.permute(0, 3, 5, 1, 2, 4)
    return y.reshape(n, ch * b * b, h // b, w // b)


@onnx_op("Einsum")
def _einsum(c, *xs):
    return tessera.einsum(c.attr("equation"), *xs)


# ---- convolution and pooling ------------------------------------------------------------------

def _pads(c, x, kernel, strides, dilations):
    """((lo, hi), ...) per spatial dim from ``pads`` / ``auto_pad``."""
    nd = len(kernel)
    auto = c.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for i in range(nd):
            size = x.shape[2 + i]
            o = -(-size // strides[i])
            total = max((o - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size, 0)
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return tuple(out)
    if auto == "VALID":
        return ((0, 0),) * nd
    p = c.attr("pads") or [0] * (2 * nd)
    return tuple((p[i], p[i + nd]) for i in range(nd))


@onnx_op("Conv")
def _conv(c, x, w, b=None):
    nd = x.dim() - 2
    kernel = c.attr("kernel_shape") or list(w.shape[2:])
    strides = c.attr("strides") or [1] * nd
    dil = c.attr("dilations") or [1] * nd
    pads = _pads(c, x, kernel, strides, dil)
    return dispatch(REGISTRY["conv"], x, w, b, stride=tuple(strides), pads=pads,
                    dilation=tuple(dil), groups=c.attr("group", 1))


@onnx_op("ConvTranspose")
def _conv_transpose(c, x, w, b=None):
    nd = x.dim() - 2
    kernel = c.attr("kernel_shape") or list(w.shape[2:])
    strides = c.attr("strides") or [1] * nd
    dil = c.attr("dilations") or [1] * nd
    group = c.attr("group", 1)
    outpad = c.attr("output_padding") or [0] * nd
    out_shape = c.attr("output_shape")
    auto = c.attr("auto_pad", "NOTSET")
    sizes, pads = [], []
    for i in range(nd):
        full = (x.shape[2 + i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 + outpad[i]
        if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
            target = out_shape[-nd + i] if out_shape is not None else x.shape[2 + i] * strides[i]
            total = full - target
            if auto == "SAME_UPPER":
                pads.append((total // 2, total - total // 2))
            else:
                pads.append((total - total // 2, total // 2))
            sizes.append(target)
        else:
            p = c.attr("pads") or [0] * (2 * nd)
            pads.append((p[i], p[i + nd]))
            sizes.append(full - p[i] - p[i + nd])
    cout = w.shape[1] * group
    y = dispatch(REGISTRY["conv_input_grad"], x, w,
                 input_shape=(x.shape[0], cout) + tuple(sizes), stride=tuple(strides),
                 pads=tuple(pads), dilation=tuple(dil), groups=group)
    if b is not None:
        y = y + b.reshape([-1] + [1] * nd)
    return y


def _pool_geometry(c, x):
    kernel = c.attr("kernel_shape")
    nd = len(kernel)
    strides = c.attr("strides") or [1] * nd
    dil = c.attr("dilations") or [1] * nd
    return kernel, strides, dil, _pads(c, x, kernel, strides, dil)


def _needs_prepad(kernel, dil, pads) -> bool:
    """tessera pools pad symmetrically by at most half the (dilated) kernel."""
    return any(lo != hi or lo > ((k - 1) * d + 1) // 2
               for (lo, hi), k, d in zip(pads, kernel, dil))


@onnx_op("MaxPool")
def _max_pool(c, x):
    kernel, strides, dil, pads = _pool_geometry(c, x)
    orig = x
    if _needs_prepad(kernel, dil, pads):  # pad with the lowest value first
        if len(c.node.output) > 1 and c.node.output[1]:
            raise NotImplementedError("indices with asymmetric or large pads")
        lowest = -np.inf if x.dtype.is_floating_point else np.iinfo(x.dtype.np).min
        x = dispatch(REGISTRY["constant_pad"], x, pads=pads, value=lowest)
        pads = tuple((0, 0) for _ in pads)
    attrs = dict(kernel_size=tuple(kernel), stride=tuple(strides),
                 padding=tuple(lo for lo, _ in pads), dilation=tuple(dil),
                 ceil_mode=bool(c.attr("ceil_mode", 0)))
    if len(c.node.output) > 1 and c.node.output[1]:
        v, i = dispatch(REGISTRY["max_pool"], x, **attrs)
        if c.attr("storage_order", 0):  # column-major positions within the plane
            if len(kernel) != 2:
                raise NotImplementedError("storage_order=1 beyond 2-d")
            h, w = orig.shape[2], orig.shape[3]
            i = (i % w) * h + i // w
        # ONNX numbers positions over the whole tensor; tessera within each plane
        plane = int(np.prod(orig.shape[2:]))
        base = tessera.arange(x.shape[0] * x.shape[1]).reshape(
            [x.shape[0], x.shape[1]] + [1] * len(kernel)) * plane
        return v, i + base
    return dispatch(REGISTRY["max_pool_values"], x, **attrs)


@onnx_op("AveragePool")
def _avg_pool(c, x):
    kernel, strides, dil, pads = _pool_geometry(c, x)
    include = bool(c.attr("count_include_pad", 0))
    ceil = bool(c.attr("ceil_mode", 0))
    if any(d != 1 for d in dil):
        return _avg_pool_conv(x, kernel, strides, dil, pads, include, ceil)
    attrs = dict(kernel_size=tuple(kernel), stride=tuple(strides), ceil_mode=ceil,
                 divisor_override=None)
    if not _needs_prepad(kernel, dil, pads):
        return dispatch(REGISTRY["avg_pool"], x, padding=tuple(lo for lo, _ in pads),
                        count_include_pad=include, **attrs)
    if ceil:
        raise NotImplementedError("ceil_mode with asymmetric or large pads")
    # explicit zero padding; without count_include_pad, divide by the pooled mask
    zero = tuple(0 for _ in pads)
    xp = dispatch(REGISTRY["constant_pad"], x, pads=pads, value=0.0)
    out = dispatch(REGISTRY["avg_pool"], xp, padding=zero, count_include_pad=True, **attrs)
    if include:
        return out
    ones = dispatch(REGISTRY["constant_pad"], tessera.ones_like(x), pads=pads, value=0.0)
    frac = dispatch(REGISTRY["avg_pool"], ones, padding=zero, count_include_pad=True, **attrs)
    return out / frac


def _avg_pool_conv(x, kernel, strides, dil, pads, include, ceil):
    """Average pooling as a depthwise convolution with a ones kernel (dilations, any pads,
    ceil_mode): window sums over the divisors (the windows' real, or real and padded,
    element counts)."""
    nd = len(kernel)
    extra = []
    for i in range(nd):
        span = (kernel[i] - 1) * dil[i] + 1
        size = x.shape[2 + i] + pads[i][0] + pads[i][1]
        out = (size - span) // strides[i] + 1
        if ceil:
            out = -(-(size - span) // strides[i]) + 1
            if (out - 1) * strides[i] >= x.shape[2 + i] + pads[i][0]:
                out -= 1   # the last window must start inside the input or left padding
        extra.append(max((out - 1) * strides[i] + span - size, 0))
    full = tuple((lo, hi + e) for (lo, hi), e in zip(pads, extra))
    ch = x.shape[1]
    w = tessera.ones((ch, 1) + tuple(kernel), dtype=x.dtype)
    attrs = dict(stride=tuple(strides), pads=((0, 0),) * nd, dilation=tuple(dil), groups=ch)
    conv = REGISTRY["conv"]
    total = dispatch(conv, dispatch(REGISTRY["constant_pad"], x, pads=full, value=0.0), w,
                     None, **attrs)
    ones = tessera.ones((1, ch) + tuple(x.shape[2:]), dtype=x.dtype)
    if include:  # padding counts, the ceil_mode extension does not
        ones = dispatch(REGISTRY["constant_pad"], ones, pads=pads, value=1.0)
        mask = dispatch(REGISTRY["constant_pad"], ones, pads=tuple((0, e) for e in extra),
                        value=0.0)
    else:
        mask = dispatch(REGISTRY["constant_pad"], ones, pads=full, value=0.0)
    return total / dispatch(conv, mask, w, None, **attrs)


@onnx_op("GlobalAveragePool")
def _gap(c, x):
    return tessera.mean(x, dim=tuple(range(2, x.dim())), keepdim=True)


@onnx_op("GlobalMaxPool")
def _gmp(c, x):
    return tessera.amax(x, dim=tuple(range(2, x.dim())), keepdim=True)


# ---- normalisation ----------------------------------------------------------------------------

@onnx_op("BatchNormalization", since=9)
def _batch_norm(c, x, scale, bias, mean, var):
    eps = c.attr("epsilon", 1e-5)
    if c.attr("training_mode", 0):  # batch statistics; running stats updated by momentum
        m = c.attr("momentum", 0.9)
        dims = (0,) + tuple(range(2, x.dim()))
        bmean = x.mean(dim=dims)
        bvar = ((x - bmean.reshape([1, -1] + [1] * (x.dim() - 2))) ** 2).mean(dim=dims)
        y = F.batch_norm(x, None, None, scale, bias, training=True, eps=eps)
        return y, mean * m + bmean * (1 - m), var * m + bvar * (1 - m)
    return F.batch_norm(x, mean, var, scale, bias, training=False, eps=eps)


@onnx_op("InstanceNormalization")
def _instance_norm(c, x, scale, bias):
    return F.instance_norm(x, weight=scale, bias=bias, eps=c.attr("epsilon", 1e-5))


@onnx_op("LayerNormalization", since=17)
def _layer_norm(c, x, scale, bias=None):
    axis = c.attr("axis", -1) % x.dim()
    eps = c.attr("epsilon", 1e-5)
    if c.attr("stash_type", 1) != 1:
        raise NotImplementedError("stash_type other than float32")
    dims = tuple(range(axis, x.dim()))
    if len([o for o in c.node.output if o]) == 1 and x.dtype is scale.dtype:
        return F.layer_norm(x, tuple(x.shape[axis:]), scale.expand(x.shape[axis:]),
                            None if bias is None else bias.expand(x.shape[axis:]), eps)
    xf = x.float() if x.dtype is not D.float64 else x
    mean = xf.mean(dim=dims, keepdim=True)
    d = xf - mean
    var = (d * d).mean(dim=dims, keepdim=True)
    rstd = 1 / tessera.sqrt(var + eps)
    y = (d * rstd).to(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return y, mean, rstd


@onnx_op("LpNormalization")
def _lp_norm(c, x):
    p, axis = c.attr("p", 2), c.attr("axis", -1)
    n = tessera.linalg.vector_norm(x, ord=p, dim=axis, keepdim=True) \
        if hasattr(tessera, "linalg") else tessera.norm(x, p=p, dim=axis, keepdim=True)
    return tessera.where(n == 0, tessera.zeros_like(x), x / n)


# ---- resampling, padding ----------------------------------------------------------------------

@onnx_op("Pad", since=11)
def _pad(c, x, pads, value=None, axes=None):
    p = c.ints(pads)
    rank = x.dim()
    ax = [a % rank for a in c.ints(axes)] if axes is not None else list(range(rank))
    lo = dict(zip(ax, p[:len(ax)]))
    hi = dict(zip(ax, p[len(ax):]))
    pairs = tuple((lo.get(i, 0), hi.get(i, 0)) for i in range(rank))
    mode = c.attr("mode", "constant")
    if mode == "constant":
        v = c.value(value).item() if value is not None and value.numel() else 0
        return dispatch(REGISTRY["constant_pad"], x, pads=pairs, value=v)
    tmode = {"reflect": "reflect", "edge": "replicate", "wrap": "circular"}[mode]
    return dispatch(REGISTRY["pad"], x, pads=pairs, mode=tmode)


@onnx_op("Resize", since=11)
def _resize(c, x, roi=None, scales=None, sizes=None):
    """Every mode of Resize is linear (affine, with tf_crop_and_resize's extrapolation) and
    separable along each axis: the per-axis matrix is computed once from ONNX's reference
    1-d interpolation on unit vectors, and applied as a matmul."""
    from onnx.reference.ops import op_resize as ref
    rank = x.dim()
    axes = [a % rank for a in (c.attr("axes") or range(rank))]
    shape = list(x.shape)
    if sizes is not None and sizes.numel():
        want = c.ints(sizes)
        scale = [want[i] / shape[a] for i, a in enumerate(axes)]
        policy = c.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            one = min(scale) if policy == "not_larger" else max(scale)
            scale = [one] * len(axes)
            want = [int(one * shape[a] + 0.5) for a in axes]
    else:
        scale = [float(v) for v in c.value(scales).reshape(-1)]
        want = [int(np.floor(shape[a] * f)) for a, f in zip(axes, scale)]
    r = None
    if roi is not None and roi.numel():
        r = [float(v) for v in c.value(roi).reshape(-1)]
    mode = c.attr("mode", "nearest")
    anti = bool(c.attr("antialias", 0))
    coeff_a = c.attr("cubic_coeff_a", -0.75)
    if mode == "nearest":
        nm = c.attr("nearest_mode", "round_prefer_floor")

        def coeffs(ratio, sc):
            return ref._nearest_coeffs(ratio, mode=nm)
    elif mode == "linear":
        coeffs = ref._linear_coeffs_antialias if anti else ref._linear_coeffs
    elif mode == "cubic":
        base = ref._cubic_coeffs_antialias if anti else ref._cubic_coeffs

        def coeffs(ratio, sc):
            return base(ratio, sc, A=coeff_a)
    else:
        raise NotImplementedError(f"mode '{mode}'")
    kw = dict(coordinate_transformation_mode=c.attr("coordinate_transformation_mode",
                                                    "half_pixel"),
              exclude_outside=bool(c.attr("exclude_outside", 0)))
    ext = float(c.attr("extrapolation_value", 0.0))
    ct = x.dtype if x.dtype.is_floating_point else D.float64
    y = x.to(ct)
    for i, a in enumerate(axes):
        n_in, n_out, sc = shape[a], want[i], scale[i]
        ra = None if r is None else [r[i], r[len(axes) + i]]
        if np.isclose(sc, 1.0) and n_out == n_in and ra is None:
            continue
        m = np.zeros((n_out, n_in))
        outside = np.zeros(n_out, bool)
        for o in range(n_out):
            if kw["coordinate_transformation_mode"] == "tf_crop_and_resize":
                outside[o] = ref._interpolate_1d_with_x(
                    np.zeros(n_in), sc, n_out, o, coeffs, roi=ra, extrapolation_value=1.0,
                    **kw) == 1.0
            for j in range(n_in):
                e = np.zeros(n_in)
                e[j] = 1.0
                m[o, j] = ref._interpolate_1d_with_x(e, sc, n_out, o, coeffs, roi=ra,
                                                     extrapolation_value=0.0, **kw)
        mt = Tensor._from_numpy(np.ascontiguousarray(m.T).astype(ct.np))
        y = tessera.matmul(y.movedim(a, -1), mt)
        if outside.any():
            y = tessera.where(Tensor._from_numpy(outside), tessera.tensor(ext, dtype=ct), y)
        y = y.movedim(-1, a)
    return y if ct is x.dtype else y.to(x.dtype)


# ---- losses -----------------------------------------------------------------------------------

@onnx_op("NegativeLogLikelihoodLoss")
def _nll(c, x, target, weight=None):
    red = c.attr("reduction", "mean")
    ii = c.attr("ignore_index", None)
    kw = dict(reduction=red)
    if ii is not None:
        kw["ignore_index"] = ii
    return F.nll_loss(x, target.long(), weight=weight, **kw)


@onnx_op("SoftmaxCrossEntropyLoss")
def _sce(c, x, target, weight=None):
    red = c.attr("reduction", "mean")
    ii = c.attr("ignore_index", None)
    logp = F.log_softmax(x, dim=1)
    kw = dict(reduction=red)
    if ii is not None:
        kw["ignore_index"] = ii
    loss = F.nll_loss(logp, target.long(), weight=weight, **kw)
    if len(c.node.output) > 1:
        return loss, logp
    return loss


