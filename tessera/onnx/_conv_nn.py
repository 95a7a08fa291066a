"""ONNX converters, part 3: convolution, pooling, normalisation, resampling, losses and
creation ops (registered in ``tessera.onnx.converters.RULES``)."""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera.onnx._trace import Sym
from tessera.onnx.converters import _f, _prod, _reduce, _t, rule

# ---- convolution ---------------------------------------------------------------------------


def _conv_pads(pads) -> list[int]:
    return [p[0] for p in pads] + [p[1] for p in pads]


@rule("conv")
def _conv(b, n):
    dt = n.out_dtype()
    ct = dt if dt.is_floating_point else D.float32  # onnxruntime convolves float32 only
    a = n.attrs
    ins = [_t(b, n, 0, ct), _t(b, n, 1, ct)]
    if n.ins[2] is not None:
        ins.append(_t(b, n, 2, ct))
    out = b.op("Conv", ins, kernel_shape=list(n.shape(1)[2:]), strides=list(a["stride"]),
               pads=_conv_pads(a["pads"]), dilations=list(a["dilation"]),
               group=int(a["groups"]))
    return b.cast(out, ct, dt)


@rule("conv_input_grad")
def _conv_transpose(b, n):
    """The adjoint of conv is ConvTranspose; output_padding recovers the exact size."""
    dt = n.out_dtype()
    a = n.attrs
    g, w = _t(b, n, 0, dt), _t(b, n, 1, dt)
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


# ---- pooling --------------------------------------------------------------------------------

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


@rule("max_pool_values")
def _max_pool_values(b, n):
    return b.op("MaxPool", [_t(b, n, 0)], **_max_pool_attrs(n))


def _plane_indices(b, idx, spatial):
    """ONNX MaxPool numbers positions over the whole tensor; PyTorch within each plane."""
    return b.op("Mod", [idx, b.const(np.array(_prod(spatial), np.int64))])


@rule("max_pool")
def _max_pool(b, n):
    v, i = b.op("MaxPool", [_t(b, n, 0)], n_out=2, **_max_pool_attrs(n))
    return v, _plane_indices(b, i, n.shape(0)[2:])


@rule("avg_pool")
def _avg_pool(b, n):
    a = n.attrs
    dt = n.out_dtype()
    ct = dt if dt.is_floating_point else D.float32  # onnxruntime pools float32 only
    x = _t(b, n, 0, ct)
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
    total = b.op("Mul", [mean, _f(b, _prod(a["kernel_size"]), ct)])
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
            parts.append(_reduce(b, red, win, [axis], True))
        x = b.op("Concat", parts, axis=axis) if len(parts) > 1 else parts[0]
    return x


@rule("adaptive_max_pool")
def _adaptive_max_pool(b, n):
    x = _t(b, n, 0)
    in_sp, out_sp = n.shape(0)[2:], n.out_shape()[2:]
    ks = _adaptive_windows(in_sp, out_sp)
    if ks is None:  # the indices output is not exported then (an error if it is used)
        return _adaptive(b, x, in_sp, out_sp, "ReduceMax"), None
    v, i = b.op("MaxPool", [x], n_out=2, kernel_shape=ks, strides=ks)
    return v, _plane_indices(b, i, in_sp)


def _resize(b, n, x, mode, coord, **extra):
    a = n.attrs
    scales = a.get("scales") or ()
    if scales and all(s is not None for s in scales):
        sc = b.const(np.array([1.0, 1.0] + [float(s) for s in scales], np.float32))
        return b.op("Resize", [x, None, sc], mode=mode, coordinate_transformation_mode=coord,
                    **extra)
    return b.op("Resize", [x, None, None, b.ints(n.out_shape())], mode=mode,
                coordinate_transformation_mode=coord, **extra)


@rule("interpolate")
def _interpolate(b, n):
    a = n.attrs
    mode = a["mode"]
    x = _t(b, n, 0)
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


@rule("col2im", opset=18)
def _col2im(b, n):
    a = n.attrs
    p = list(a["padding"])
    return b.op("Col2Im", [_t(b, n, 0), b.ints(a["output_size"]), b.ints(a["kernel_size"])],
                dilations=list(a["dilation"]), pads=p + p, strides=list(a["stride"]))


# ---- normalisation --------------------------------------------------------------------------

def _channel(b, t, rank):
    """A per-channel (C,) tensor shaped to broadcast over (N, C, ...)."""
    return b.op("Reshape", [t, b.ints([-1] + [1] * (rank - 2))])


@rule("batch_norm")
def _batch_norm(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    c = n.shape(0)[1]
    w = _t(b, n, 1, dt) if n.ins[1] is not None else b.const(np.ones(c, dt.np))
    bias = _t(b, n, 2, dt) if n.ins[2] is not None else b.const(np.zeros(c, dt.np))
    eps = float(n.attrs["eps"])
    if not n.attrs["training"]:
        rm, rv = _t(b, n, 3, dt), _t(b, n, 4, dt)
        return b.op("BatchNormalization", [x, w, bias, rm, rv], epsilon=eps), rm, rv
    # batch statistics (instance norm, or a batch norm without running stats)
    axes = [0] + list(range(2, n.rank(0)))
    mean = _reduce(b, "ReduceMean", x, axes, True)
    d = b.op("Sub", [x, mean])
    var = _reduce(b, "ReduceMean", b.op("Mul", [d, d]), axes, True)
    y = b.op("Div", [d, b.op("Sqrt", [b.op("Add", [var, _f(b, eps, dt)])])])
    r = n.rank(0)
    flat = b.ints([-1])
    return (b.op("Add", [b.op("Mul", [y, _channel(b, w, r)]), _channel(b, bias, r)]),
            b.op("Reshape", [mean, flat]), b.op("Reshape", [var, flat]))


def _normalize(b, x, dt, axes, eps):
    mean = _reduce(b, "ReduceMean", x, axes, True)
    d = b.op("Sub", [x, mean])
    var = _reduce(b, "ReduceMean", b.op("Mul", [d, d]), axes, True)
    return b.op("Div", [d, b.op("Sqrt", [b.op("Add", [var, _f(b, eps, dt)])])])


@rule("layer_norm")
def _layer_norm(b, n):
    dt = n.out_dtype()
    k = len(n.attrs["normalized_shape"])
    rank = n.rank(0)
    y = _normalize(b, _t(b, n, 0, dt), dt, list(range(rank - k, rank)), n.attrs["eps"])
    if n.ins[1] is not None:
        y = b.op("Mul", [y, _t(b, n, 1, dt)])
    if n.ins[2] is not None:
        y = b.op("Add", [y, _t(b, n, 2, dt)])
    return y


@rule("layer_norm", opset=17)
def _layer_norm17(b, n):
    dt = n.out_dtype()
    ns = tuple(n.attrs["normalized_shape"])
    w = _t(b, n, 1, dt) if n.ins[1] is not None else b.const(np.ones(ns, dt.np))
    ins = [_t(b, n, 0, dt), w] + ([_t(b, n, 2, dt)] if n.ins[2] is not None else [])
    return b.op("LayerNormalization", ins, axis=-len(ns), epsilon=float(n.attrs["eps"]))


@rule("group_norm")
def _group_norm(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    g = n.attrs["num_groups"]
    shape = n.shape(0)
    grouped = b.op("Reshape", [x, b.ints([shape[0], g, -1])])
    y = _normalize(b, grouped, dt, [2], n.attrs["eps"])
    y = b.op("Reshape", [y, b.ints(shape)])
    r = n.rank(0)
    if n.ins[1] is not None:
        y = b.op("Mul", [y, _channel(b, _t(b, n, 1, dt), r)])
    if n.ins[2] is not None:
        y = b.op("Add", [y, _channel(b, _t(b, n, 2, dt), r)])
    return y


@rule("rms_norm")
def _rms_norm(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    k = len(n.attrs["normalized_shape"])
    rank = n.rank(0)
    eps = n.attrs.get("eps")
    if eps is None:
        eps = float(np.finfo(dt.np).eps)
    ms = _reduce(b, "ReduceMean", b.op("Mul", [x, x]), list(range(rank - k, rank)), True)
    y = b.op("Div", [x, b.op("Sqrt", [b.op("Add", [ms, _f(b, eps, dt)])])])
    if n.ins[1] is not None:
        y = b.op("Mul", [y, _t(b, n, 1, dt)])
    return y


# ---- losses ---------------------------------------------------------------------------------

@rule("nll_loss")
def _nll_loss(b, n):
    dt = n.out_dtype()
    x, t = _t(b, n, 0, dt), _t(b, n, 1, D.int64)
    a = n.attrs
    one = n.rank(0) == 1
    if one:  # ONNX wants (N, C): a single sample gets a batch of one
        x = b.op("Unsqueeze", [x, b.ints([0])])
        t = b.op("Unsqueeze", [t, b.ints([0])])
    ins = [x, t] + ([_t(b, n, 2, dt)] if n.ins[2] is not None else [])
    red = a.get("reduction", "mean")
    out = b.op("NegativeLogLikelihoodLoss", ins, reduction=red,
               ignore_index=int(a.get("ignore_index", -100)))
    if one and red == "none":
        out = b.op("Squeeze", [out, b.ints([0])])
    return out


@rule("binary_cross_entropy")
def _bce(b, n):
    dt = n.out_dtype()
    x, t = _t(b, n, 0, dt), _t(b, n, 1, dt)
    lo = _f(b, -100, dt)
    one = _f(b, 1, dt)
    log_x = b.op("Max", [b.op("Log", [x]), lo])
    log_1x = b.op("Max", [b.op("Log", [b.op("Sub", [one, x])]), lo])
    loss = b.op("Sub", [b.op("Mul", [b.op("Sub", [t, one]), log_1x]), b.op("Mul", [t, log_x])])
    if n.ins[2] is not None:
        loss = b.op("Mul", [loss, _t(b, n, 2, dt)])
    red = n.attrs.get("reduction", "mean")
    if red == "none":
        return loss
    return _reduce(b, "ReduceSum" if red == "sum" else "ReduceMean", loss, None, False)


# ---- creation -------------------------------------------------------------------------------

def _kernel_const(b, n):
    """A creation op with static attributes: its own kernel computes the constant."""
    return b.const(n.node.op.kernels["cpu"](**n.node.attrs))


@rule("arange")
def _arange(b, n):
    a = n.attrs
    dt = n.out_dtype()
    if not any(isinstance(a[k], Sym) for k in ("start", "end", "step")):
        return _kernel_const(b, n)
    # start + step * (cumsum(ones(length)) - 1); not Range: onnxruntime's constant sharing
    # and Gather(Range) -> Slice fusion together break a Range of shared scalars
    length = n.out_shape()[0]
    ct = D.float64 if dt.is_floating_point else D.int64
    ones = b.op("ConstantOfShape", [b.ints([length])],
                value=_tensor_attr(np.ones(1, ct.np)))
    idx = b.op("Sub", [b.op("CumSum", [ones, b.const(np.array(0, np.int64))]),
                       b.const(np.array(1, ct.np))])
    if a["step"] != 1:
        idx = b.op("Mul", [idx, b.scalar(a["step"], ct)])
    if a["start"] != 0:
        idx = b.op("Add", [idx, b.scalar(a["start"], ct)])
    return b.cast(idx, ct, dt)


def _tensor_attr(arr):
    from onnx import numpy_helper
    return numpy_helper.from_array(arr)


rule("linspace")(_kernel_const)
rule("eye")(_kernel_const)


def _fill_shape(b, n, value):
    dt = n.out_dtype()
    v = np.asarray(value)
    if dt is D.bool_:
        v = v.astype(bool)
    return b.op("Expand", [b.const(v.astype(dt.np)), b.ints(n.out_shape())])


rule("full")(lambda b, n: _fill_shape(b, n, n.attrs["value"]))
rule("empty")(lambda b, n: _fill_shape(b, n, 0))

