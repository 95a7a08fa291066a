"""Convolution, pooling and resampling, both directions: ``conv`` (Conv) and its adjoint
(ConvTranspose), ``col2im``, max/average/adaptive pooling, ``interpolate`` (Resize), and
Dropout, which imports as the identity (inference).

>>> from tessera.onnx.converters.registry import EXPORT, IMPORT
>>> sorted(EXPORT["conv"]), "ConvTranspose" in IMPORT
([13], True)
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.onnx.converters.helpers import operand, reduce_over, static_prod
from tessera.onnx.converters.registry import export_rule, import_rule
from tessera.ops.creation import arange, ones as _ones, ones_like, tensor
from tessera.ops.linalg import matmul
from tessera.ops.reduce import amax, mean as _mean
from tessera.ops.registry import REGISTRY
from tessera.ops.ternary import where

# ---- convolution -----------------------------------------------------------------------

def _conv_pads(pads) -> list[int]:
    return [p[0] for p in pads] + [p[1] for p in pads]


@export_rule("conv")
def _conv(b, n):
    dt = n.out_dtype()
    ct = dt if dt.is_floating_point else D.float32  # onnxruntime convolves float32 only
    a = n.attrs
    ins = [operand(b, n, 0, ct), operand(b, n, 1, ct)]
    if n.ins[2] is not None:
        ins.append(operand(b, n, 2, ct))
    out = b.op("Conv", ins, kernel_shape=list(n.shape(1)[2:]), strides=list(a["stride"]),
               pads=_conv_pads(a["pads"]), dilations=list(a["dilation"]),
               group=int(a["groups"]))
    return b.cast(out, ct, dt)


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


def _check(c, x, w=None) -> int:
    """The spatial rank of ``x``, the node's geometry checked against it (and ``w``)."""
    from tessera.onnx.validate import check_geometry
    return check_geometry(c.where, c.node.op_type, c.attrs, x.dim() - 2,
                          weight=None if w is None else tuple(w.shape),
                          channels=x.shape[1] if x.dim() > 1 else None)


@import_rule("Conv")
def _import_conv(c, x, w, b=None):
    nd = _check(c, x, w)
    kernel = c.attr("kernel_shape") or list(w.shape[2:])
    strides = c.attr("strides") or [1] * nd
    dil = c.attr("dilations") or [1] * nd
    pads = _pads(c, x, kernel, strides, dil)
    return dispatch(REGISTRY["conv"], x, w, b, stride=tuple(strides), pads=pads,
                    dilation=tuple(dil), groups=c.attr("group", 1))


@export_rule("conv_input_grad")
def _conv_transpose(b, n):
    """The adjoint of conv is ConvTranspose; output_padding recovers the exact size."""
    dt = n.out_dtype()
    a = n.attrs
    g, w = operand(b, n, 0, dt), operand(b, n, 1, dt)
    ks = n.shape(1)[2:]
    in_sp = n.shape(0)[2:]
    target = a["input_shape"][2:]
    extra, pads = [], []
    for i, (s, k) in enumerate(zip(in_sp, ks)):
        lo, hi = a["pads"][i]
        hi = max(hi, 0)  # a negative pad grows the output: output_padding does that
        size = (s - 1) * a["stride"][i] - lo - hi + a["dilation"][i] * (k - 1) + 1
        extra.append(target[i] - size)
        pads.append((lo, hi))
    return b.op("ConvTranspose", [g, w], kernel_shape=list(ks), strides=list(a["stride"]),
                pads=_conv_pads(pads), dilations=list(a["dilation"]),
                group=int(a["groups"]), output_padding=extra if any(extra) else None)


@import_rule("ConvTranspose")
def _import_conv_transpose(c, x, w, b=None):
    nd = _check(c, x, w)
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


@export_rule("col2im", opset=18)
def _col2im(b, n):
    a = n.attrs
    p = list(a["padding"])
    return b.op("Col2Im", [operand(b, n, 0), b.ints(a["output_size"]), b.ints(a["kernel_size"])],
                dilations=list(a["dilation"]), pads=p + p, strides=list(a["stride"]))


# ---- pooling ---------------------------------------------------------------------------

def _pool_attrs(a, with_dilation=True) -> dict:
    p = list(a["padding"])
    out = dict(kernel_shape=list(a["kernel_size"]), strides=list(a["stride"]), pads=p + p,
               ceil_mode=int(bool(a.get("ceil_mode", False))))
    if with_dilation and "dilation" in a:
        out["dilations"] = list(a["dilation"])
    return out


def _max_pool_attrs(n) -> dict:
    """MaxPool attributes; PyTorch's ceil_mode (whose last window must start inside the
    input) becomes explicit right padding, which -inf padding makes exact."""
    a = n.attrs
    out = _pool_attrs(a)
    if out["ceil_mode"]:
        out["ceil_mode"] = 0
        hi = []
        for s, o, k, st, p, d in zip(n.shape(0)[2:], n.out_shape()[2:], a["kernel_size"],
                                     a["stride"], a["padding"], a.get("dilation", [1] * 9)):
            if not isinstance(s, int):
                raise NotImplementedError("ceil_mode pooling over a dynamic dim")
            hi.append(max((o - 1) * st + d * (k - 1) + 1 - s - p, p))
        out["pads"] = list(a["padding"]) + hi
    return out


@export_rule("max_pool_values")
def _max_pool_values(b, n):
    return b.op("MaxPool", [operand(b, n, 0)], **_max_pool_attrs(n))


def _plane_indices(b, idx, spatial):
    """ONNX MaxPool numbers positions over the whole tensor; PyTorch within each plane."""
    return b.op("Mod", [idx, b.const(np.array(static_prod(spatial), np.int64))])


@export_rule("max_pool")
def _max_pool(b, n):
    v, i = b.op("MaxPool", [operand(b, n, 0)], n_out=2, **_max_pool_attrs(n))
    return v, _plane_indices(b, i, n.shape(0)[2:])


@export_rule("avg_pool")
def _avg_pool(b, n):
    a = n.attrs
    dt = n.out_dtype()
    ct = dt if dt.is_floating_point else D.float32  # onnxruntime pools float32 only
    x = operand(b, n, 0, ct)
    if not a.get("ceil_mode") and a.get("divisor_override") is None:
        out = b.op("AveragePool", [x], **_pool_attrs(a, False),
                   count_include_pad=int(bool(a["count_include_pad"])))
        return b.cast(out, ct, dt)
    # window sums (every window padded to full size), divided by PyTorch's divisors
    from tessera.ops.pool import _divisor
    in_sp, out_sp = n.shape(0)[2:], n.out_shape()[2:]
    if not n.static(in_sp):
        raise NotImplementedError("ceil_mode / divisor_override pooling over a dynamic dim")
    hi = [max((o - 1) * st + k - s - p, p) for s, o, k, st, p in
          zip(in_sp, out_sp, a["kernel_size"], a["stride"], a["padding"])]
    attrs = _pool_attrs(a, False)
    attrs.update(ceil_mode=0, pads=list(a["padding"]) + hi)
    mean = b.op("AveragePool", [x], count_include_pad=1, **attrs)
    total = b.op("Mul", [mean, b.const(static_prod(a["kernel_size"]), ct)])
    div = _divisor(in_sp, out_sp, a["kernel_size"], a["stride"], a["padding"],
                   a["count_include_pad"], a.get("divisor_override"), ct.np)
    out = b.op("Div", [total, b.const(np.asarray(div, ct.np))])
    if not dt.is_floating_point:
        out = b.op("Floor", [out])
    return b.cast(out, ct, dt)


def _adaptive_windows(in_sp, out_sp):
    """(kernel, stride) when every adaptive window has the same size, else None."""
    ks = []
    for i, o in zip(in_sp, out_sp):
        if not isinstance(i, int) or not isinstance(o, int) or o == 0 or i % o:
            return None
        ks.append(i // o)
    return ks


def _adaptive(b, x, in_sp, out_sp, red: str):
    """Adaptive pooling with unequal windows, one spatial dim at a time (max and mean over
    a box are separable): per output position a Slice and a reduction, then Concat."""
    for d, (i, o) in enumerate(zip(in_sp, out_sp)):
        if not isinstance(i, int):
            raise NotImplementedError("adaptive pooling over a dynamic dim")
        axis = 2 + d
        parts = []
        for k in range(o):
            lo, hi = (k * i) // o, -((-(k + 1) * i) // o)
            win = b.op("Slice", [x, b.ints([lo]), b.ints([hi]), b.ints([axis])])
            parts.append(reduce_over(b, red, win, [axis], True))
        x = b.op("Concat", parts, axis=axis) if len(parts) > 1 else parts[0]
    return x


@export_rule("adaptive_max_pool")
def _adaptive_max_pool(b, n):
    x = operand(b, n, 0)
    in_sp, out_sp = n.shape(0)[2:], n.out_shape()[2:]
    ks = _adaptive_windows(in_sp, out_sp)
    if ks is None:  # the indices output is not exported then (an error if it is used)
        return _adaptive(b, x, in_sp, out_sp, "ReduceMax"), None
    v, i = b.op("MaxPool", [x], n_out=2, kernel_shape=ks, strides=ks)
    return v, _plane_indices(b, i, in_sp)


def _pool_geometry(c, x):
    nd = _check(c, x)
    kernel = c.attr("kernel_shape")
    strides = c.attr("strides") or [1] * nd
    dil = c.attr("dilations") or [1] * nd
    return kernel, strides, dil, _pads(c, x, kernel, strides, dil)


def _needs_prepad(kernel, dil, pads) -> bool:
    """tessera pools pad symmetrically by at most half the (dilated) kernel."""
    return any(lo != hi or lo > ((k - 1) * d + 1) // 2
               for (lo, hi), k, d in zip(pads, kernel, dil))


@import_rule("MaxPool")
def _import_max_pool(c, x):
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
        base = arange(x.shape[0] * x.shape[1]).reshape(
            [x.shape[0], x.shape[1]] + [1] * len(kernel)) * plane
        return v, i + base
    return dispatch(REGISTRY["max_pool_values"], x, **attrs)


@import_rule("AveragePool")
def _import_avg_pool(c, x):
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
    ones = dispatch(REGISTRY["constant_pad"], ones_like(x), pads=pads, value=0.0)
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
    w = _ones((ch, 1) + tuple(kernel), dtype=x.dtype)
    attrs = dict(stride=tuple(strides), pads=((0, 0),) * nd, dilation=tuple(dil), groups=ch)
    conv = REGISTRY["conv"]
    total = dispatch(conv, dispatch(REGISTRY["constant_pad"], x, pads=full, value=0.0), w,
                     None, **attrs)
    ones = _ones((1, ch) + tuple(x.shape[2:]), dtype=x.dtype)
    if include:  # padding counts, the ceil_mode extension does not
        ones = dispatch(REGISTRY["constant_pad"], ones, pads=pads, value=1.0)
        mask = dispatch(REGISTRY["constant_pad"], ones, pads=tuple((0, e) for e in extra),
                        value=0.0)
    else:
        mask = dispatch(REGISTRY["constant_pad"], ones, pads=full, value=0.0)
    return total / dispatch(conv, mask, w, None, **attrs)


@import_rule("GlobalAveragePool")
def _import_gap(c, x):
    return _mean(x, dim=tuple(range(2, x.dim())), keepdim=True)


@import_rule("GlobalMaxPool")
def _import_gmp(c, x):
    return amax(x, dim=tuple(range(2, x.dim())), keepdim=True)


# ---- resampling ------------------------------------------------------------------------

def _resize(b, n, x, mode, coord, **extra):
    a = n.attrs
    scales = a.get("scales") or ()
    if scales and all(s is not None for s in scales):
        sc = b.const(np.array([1.0, 1.0] + [float(s) for s in scales], np.float32))
        return b.op("Resize", [x, None, sc], mode=mode, coordinate_transformation_mode=coord,
                    **extra)
    return b.op("Resize", [x, None, None, b.ints(n.out_shape())], mode=mode,
                coordinate_transformation_mode=coord, **extra)


@export_rule("interpolate")
def _interpolate(b, n):
    a = n.attrs
    mode = a["mode"]
    x = operand(b, n, 0)
    if mode == "area":
        in_sp, out_sp = n.shape(0)[2:], n.out_shape()[2:]
        if all(o == 1 for o in out_sp):
            return b.op("GlobalAveragePool", [x])
        ks = _adaptive_windows(in_sp, out_sp)
        if ks is None:
            return _adaptive(b, x, in_sp, out_sp, "ReduceMean")
        return b.op("AveragePool", [x], kernel_shape=ks, strides=ks)
    if mode == "nearest":
        return _resize(b, n, x, "nearest", "asymmetric", nearest_mode="floor")
    if mode == "nearest-exact":
        return _resize(b, n, x, "nearest", "half_pixel", nearest_mode="round_prefer_ceil")
    align = a.get("align_corners")
    if mode in ("linear", "bilinear", "trilinear"):
        return _resize(b, n, x, "linear", "align_corners" if align else "pytorch_half_pixel")
    if mode in ("bicubic", "cubic"):
        return _resize(b, n, x, "cubic", "align_corners" if align else "half_pixel",
                       cubic_coeff_a=-0.75)
    raise NotImplementedError(f"interpolate mode '{mode}'")


@import_rule("Resize", since=11)
def _import_resize(c, x, roi=None, scales=None, sizes=None):
    """Every mode of Resize is linear (affine, with tf_crop_and_resize's extrapolation) and
    separable along each axis: the per-axis matrix is computed once from ONNX's reference
    1-d interpolation on unit vectors, and applied as a matmul."""
    from onnx.reference.ops import op_resize as ref
    rank = x.dim()
    axes = [a % rank for a in (c.attr("axes") or range(rank))]
    scale, want = _resize_targets(c, list(x.shape), axes, scales, sizes)
    r = None
    if roi is not None and roi.numel():
        r = [float(v) for v in c.value(roi).reshape(-1)]
    mode = c.attr("mode", "nearest")
    if mode not in _RESIZE_COEFFS:
        raise NotImplementedError(f"mode '{mode}'")
    coeffs = _RESIZE_COEFFS[mode](ref, c)
    kw = dict(coordinate_transformation_mode=c.attr("coordinate_transformation_mode",
                                                    "half_pixel"),
              exclude_outside=bool(c.attr("exclude_outside", 0)))
    ext = float(c.attr("extrapolation_value", 0.0))
    ct = x.dtype if x.dtype.is_floating_point else D.float64
    y = x.to(ct)
    for i, a in enumerate(axes):
        n_in, n_out, sc = x.shape[a], want[i], scale[i]
        ra = None if r is None else [r[i], r[len(axes) + i]]
        if np.isclose(sc, 1.0) and n_out == n_in and ra is None:
            continue
        m, outside = _resize_matrix(ref, coeffs, n_in, n_out, sc, ra, kw)
        mt = Tensor._from_numpy(np.ascontiguousarray(m.T).astype(ct.np))
        y = matmul(y.movedim(a, -1), mt)
        if outside.any():
            y = where(Tensor._from_numpy(outside), tensor(ext, dtype=ct), y)
        y = y.movedim(-1, a)
    return y if ct is x.dtype else y.to(x.dtype)


def _resize_targets(c, shape: list, axes: list, scales, sizes) -> tuple[list, list]:
    """(scale, output size) per resized axis, from ``sizes`` (with the aspect ratio policy)
    or else ``scales``."""
    if sizes is not None and sizes.numel():
        want = c.ints(sizes)
        scale = [want[i] / shape[a] for i, a in enumerate(axes)]
        policy = c.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            one = min(scale) if policy == "not_larger" else max(scale)
            scale = [one] * len(axes)
            want = [int(one * shape[a] + 0.5) for a in axes]
        return scale, want
    scale = [float(v) for v in c.value(scales).reshape(-1)]
    return scale, [int(np.floor(shape[a] * f)) for a, f in zip(axes, scale)]


def _nearest_coeffs(ref, c):
    mode = c.attr("nearest_mode", "round_prefer_floor")
    return lambda ratio, scale: ref._nearest_coeffs(ratio, mode=mode)


def _linear_coeffs(ref, c):
    return ref._linear_coeffs_antialias if c.attr("antialias", 0) else ref._linear_coeffs


def _cubic_coeffs(ref, c):
    base = ref._cubic_coeffs_antialias if c.attr("antialias", 0) else ref._cubic_coeffs
    a = c.attr("cubic_coeff_a", -0.75)
    return lambda ratio, scale: base(ratio, scale, A=a)


# Resize mode -> the reference's interpolation coefficients, coeffs(ratio, scale), for a node
_RESIZE_COEFFS = {"nearest": _nearest_coeffs, "linear": _linear_coeffs,
                  "cubic": _cubic_coeffs}


def _resize_matrix(ref, coeffs, n_in: int, n_out: int, scale: float, roi, kw: dict):
    """(the (n_out, n_in) matrix of one axis's interpolation, the outputs that fall outside
    a tf_crop_and_resize region), from the reference on unit vectors."""
    m = np.zeros((n_out, n_in))
    outside = np.zeros(n_out, bool)
    crop = kw["coordinate_transformation_mode"] == "tf_crop_and_resize"
    for o in range(n_out):
        if crop:
            outside[o] = ref._interpolate_1d_with_x(
                np.zeros(n_in), scale, n_out, o, coeffs, roi=roi, extrapolation_value=1.0,
                **kw) == 1.0
        for j in range(n_in):
            e = np.zeros(n_in)
            e[j] = 1.0
            m[o, j] = ref._interpolate_1d_with_x(e, scale, n_out, o, coeffs, roi=roi,
                                                 extrapolation_value=0.0, **kw)
    return m, outside


# ---- dropout (inference) ---------------------------------------------------------------

@import_rule("Dropout", since=12)
def _import_dropout(c, x, ratio=None, training=None):
    p = float(c.value(ratio).reshape(-1)[0]) if ratio is not None else 0.5
    if training is not None and bool(c.value(training)) and p > 0:
        raise NotImplementedError("training mode (a random mask)")
    return x, _ones(x.shape, dtype=D.bool_)


@import_rule("Dropout")
def _import_dropout_old(c, x):
    return x, _ones(x.shape, dtype=D.bool_)
