"""Vision ops: resampling (interpolate, adaptive average pooling), padding, im2col/col2im.

Each op has an adjoint op, and the two are each other's gradients (so double backward
works):

    interpolate(x)        <-> interpolate_backward(g)   nearest, nearest-exact, linear,
                                                        cubic, area (= adaptive avg pool)
    constant_pad(x, pads) <-> constant_pad(g, -pads)    negative pads crop
    pad(x) reflect/replicate/circular <-> pad_backward(g)
    im2col(x)             <-> col2im(cols)              nn.functional.unfold / fold

Resampling is separable: per spatial dim, each output position reads a few input
positions (its "taps") with weights, exactly PyTorch's index/weight formulas. The forward
gathers whole slices per tap (``np.take``); the adjoint sums runs of equal indices with
``np.add.reduceat`` (tap indices are monotone). Padding gathers with one index table per dim
and its adjoint adds back a handful of contiguous runs per dim.

>>> import tessera
>>> from tessera.ops.vision import interpolate
>>> interpolate(tessera.arange(3.).reshape(1, 1, 3), mode="linear", size=(5,),
...             scales=(None,), align_corners=True).flatten().tolist()
[0.0, 0.5, 1.0, 1.5, 2.0]
"""
from __future__ import annotations

import functools
import math

import numpy as np

from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.ops import _jax, _relax, cost
from tessera.ops.conv import col2im_add, crop, pad_array, window_view
from tessera.ops.pool import adaptive_taps, adaptive_windows
from tessera.ops.registry import Meta, defop
from tessera.sbp import SbpRule, Signature, broadcast as B, partial_sum as P, split as S

__all__: list[str] = []

MODES = ("nearest", "nearest-exact", "linear", "cubic", "area")


# ---- sbp and cost rules ------------------------------------------------------------------

def _batch_channel(linear: bool, channels: bool = True):
    """(N, C, *spatial) ops that treat each sample (and channel) alone: batch or channel
    split; partial_sum passes through where linear (interpolation, im2col, col2im)."""
    def rule(x, *rest, **attrs):
        sigs = [Signature((S(d),), (S(d),)) for d in ((0, 1) if channels else (0,))]
        sigs.append(Signature((B,), (B,)))
        if linear:
            sigs.append(Signature((P,), (P,)))
        return sigs
    return rule


def _unpadded(ndim: int, pads) -> list[int]:
    """Dims that ``pads`` (pairs for the trailing dims) leaves alone."""
    lead = ndim - len(pads)
    return [d for d in range(ndim) if d < lead or not any(pads[d - lead])]


def _pad_sbp(x, pads, mode):
    """Reflect/replicate/circular padding: split an unpadded dim; linear (each output
    element is one input element)."""
    return [Signature((S(d),), (S(d),)) for d in _unpadded(len(x.shape), pads)] + \
        [Signature((B,), (B,)), Signature((P,), (P,))]


def _constant_pad_sbp(x, pads, value):
    sigs = [Signature((S(d),), (S(d),)) for d in _unpadded(len(x.shape), pads)]
    sigs.append(Signature((B,), (B,)))
    if value == 0:  # (a nonzero fill would be counted once per rank)
        sigs.append(Signature((P,), (P,)))
    return sigs


def _pad_backward_sbp(g, input_shape, pads, mode):
    return [Signature((S(d),), (S(d),)) for d in _unpadded(len(input_shape), pads)] + \
        [Signature((B,), (B,)), Signature((P,), (P,))]


def _resample_flops(in_shape, size, mode: str) -> int:
    """The separable passes of ``interpolate`` (its adjoint does the same products backwards):
    each output of a pass is a multiply-add per tap (linear 2, cubic 4), or for ``area``
    the sum of its window and a division; nearest modes only gather."""
    shape = list(in_shape)
    flops = 0
    for d, n_out in enumerate(size):
        n_in = shape[2 + d]
        rest = math.prod(shape[:2 + d] + shape[3 + d:])
        if mode == "area" and n_in != n_out:
            flops += rest * (adaptive_taps(n_in, n_out) + n_out)
        elif (mode == "linear" and n_in != n_out) or mode == "cubic":
            flops += rest * n_out * (4 if mode == "linear" else 8)
        shape[2 + d] = n_out
    return flops


def _interp_cost(ins, outs, mode, size, **attrs) -> cost.Cost:
    return cost.Cost(_resample_flops(ins[0].shape, size, mode), *cost.io(ins, outs))


def _interp_backward_cost(ins, outs, input_shape, mode, size, **attrs) -> cost.Cost:
    return cost.Cost(_resample_flops(input_shape, size, mode), *cost.io(ins, outs))


# ---- per-dim resampling plans ------------------------------------------------------------

def _opmath(dtype: np.dtype) -> type:
    return np.float64 if dtype == np.float64 else np.float32


def _scale(n_in: int, n_out: int, scale, align_corners: bool, ft):
    """PyTorch's area_pixel_compute_scale, in the op's math type ``ft``."""
    if align_corners:
        return ft(n_in - 1) / ft(n_out - 1) if n_out > 1 else ft(0)
    if scale is not None and scale > 0:
        return ft(1.0 / scale)
    return ft(n_in) / ft(n_out)


def _linear_taps(n_in, n_out, scale, align, ft, cubic: bool):
    dst = np.arange(n_out).astype(ft)
    s = _scale(n_in, n_out, scale, align, ft)
    if align:
        src = s * dst
    else:
        src = s * (dst + ft(0.5)) - ft(0.5)
        if not cubic:
            src = np.maximum(src, ft(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam = np.clip(src - i0.astype(ft), ft(0), ft(1)).astype(ft)
    if not cubic:
        i1 = i0 + (i0 < n_in - 1)
        return np.stack([i0, i1]), np.stack([ft(1) - lam, lam]).astype(ft)
    a = ft(-0.75)

    def conv1(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def conv2(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    w = np.stack([conv2(lam + 1), conv1(lam), conv1(1 - lam), conv2(2 - lam)]).astype(ft)
    idx = np.clip(i0[None, :] + np.arange(-1, 3)[:, None], 0, n_in - 1)
    return idx, w


@functools.lru_cache(maxsize=512)
def _plan(mode: str, n_in: int, n_out: int, scale, align: bool, dt: str):
    """How one spatial dim is resampled: ("same",), ("take", idx), ("block", k) or
    ("taps", idx (T, out), w (T, out))."""
    ft = _opmath(np.dtype(dt))
    if mode == "area":
        if n_out and n_in % n_out == 0:
            return ("same",) if n_in == n_out else ("block", n_in // n_out)
        taps, length = adaptive_windows(n_in, n_out)
        t = np.arange(taps.shape[1])[:, None]
        w = (t < length[None, :]) / length[None, :].astype(ft)
        return ("taps", np.ascontiguousarray(taps.T), w.astype(ft))
    if mode == "nearest":
        if n_out == n_in:
            return ("same",)
        if n_out == 2 * n_in:
            return ("take", np.arange(n_out) >> 1)
        s = np.float32(1.0 / scale) if scale is not None and scale > 0 else \
            np.float32(n_in) / np.float32(n_out)
        src = np.floor(np.arange(n_out).astype(np.float32) * s)
        return ("take", np.minimum(src.astype(np.int64), n_in - 1))
    if mode == "nearest-exact":
        s = np.float32(1.0 / scale) if scale is not None and scale > 0 else \
            np.float32(n_in) / np.float32(n_out)
        src = np.floor(((np.arange(n_out) + 0.5) * np.float64(s)).astype(np.float32))
        return ("take", np.minimum(src.astype(np.int64), n_in - 1))
    if mode == "linear" and n_out == n_in:
        return ("same",)
    idx, w = _linear_taps(n_in, n_out, scale, align, ft, cubic=mode == "cubic")
    return ("taps", idx, w)


def _plans(x_shape, dtype, mode, size, scales, align):
    return [_plan(mode, n_in, n_out, sc, align, np.dtype(dtype).str)
            for n_in, n_out, sc in zip(x_shape[2:], size, scales)]


def _apply(y: np.ndarray, axis: int, plan) -> np.ndarray:
    kind = plan[0]
    if kind == "same":
        return y
    if kind == "take":
        return np.take(y, plan[1], axis=axis)
    if kind == "block":
        k = plan[1]
        shp = y.shape
        return y.reshape(shp[:axis] + (shp[axis] // k, k) + shp[axis + 1:]).mean(axis=axis + 1)
    idx, w = plan[1], plan[2]
    tail = (1,) * (y.ndim - axis - 1)
    out = None
    for t in range(idx.shape[0]):
        term = np.take(y, idx[t], axis=axis) * w[t].reshape(w.shape[1:] + tail)
        if out is None:
            out = term
        else:
            out += term
    assert out is not None  # every plan has a tap
    return out


def _scatter_runs(dst: np.ndarray, v: np.ndarray, idx: np.ndarray, axis: int) -> None:
    """dst[idx[j]] += v[j] along ``axis`` for a monotone ``idx``: one reduceat per call."""
    if v.shape[axis] == 0:
        return
    starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
    sums = np.add.reduceat(v, starts, axis=axis)
    dst[(slice(None),) * axis + (idx[starts],)] += sums


def _adjoint(g: np.ndarray, axis: int, plan, n_in: int) -> np.ndarray:
    kind = plan[0]
    if kind == "same":
        return g
    if kind == "block":
        k = plan[1]
        return np.repeat(g / g.dtype.type(k), k, axis=axis)
    shape = g.shape[:axis] + (n_in,) + g.shape[axis + 1:]
    dx = np.zeros(shape, g.dtype)
    if kind == "take":
        _scatter_runs(dx, g, plan[1], axis)
        return dx
    idx, w = plan[1], plan[2]
    tail = (1,) * (g.ndim - axis - 1)
    for t in range(idx.shape[0]):
        _scatter_runs(dx, g * w[t].reshape(w.shape[1:] + tail), idx[t], axis)
    return dx


def _interp_check(x_shape, dtype, mode, size):
    nd = len(size)
    if mode not in MODES:
        raise ValueError(f"interpolate: unknown mode '{mode}'")
    if len(x_shape) != nd + 2:
        raise RuntimeError(f"interpolate: expected a {nd + 2}-D input, got {list(x_shape)}")
    if dtype.category < 2 or dtype.is_complex:
        name = "adaptive_avg_pool" if mode == "area" else f"upsample_{mode}"
        raise NotImplementedError(f'"{name}{nd}d" not implemented for \'{dtype}\'')
    if mode == "area":
        # PyTorch checks the channels too only in 3-d
        first = 1 if nd == 3 else 2
        for i, s in enumerate(x_shape[first:], first - 1):
            if s == 0:
                raise RuntimeError(f"adaptive_avg_pool{nd}d(): Expected input to have non-zero "
                                   f"size for non-batch dimensions, but input has sizes "
                                   f"{list(x_shape)} with dimension {i + 1} being empty")
        if any(o < 0 for o in size):
            raise RuntimeError(f"adaptive_avg_pool{nd}d(): Trying to create tensor with "
                               f"negative dimension: {list(size)}")
        return
    if any(s <= 0 for s in x_shape[2:]) or any(o <= 0 for o in size):
        raise RuntimeError(f"upsample_{mode}: Input and output sizes should be greater than 0, "
                           f"but got input {list(x_shape[2:])} output {list(size)}")
    if x_shape[1] == 0:
        raise RuntimeError(f"Non-empty {nd + 2}D data tensor expected but got a tensor with "
                           f"sizes {list(x_shape)}")


def _interp_infer(x, mode, size, scales, align_corners):
    _interp_check(x.shape, x.dtype, mode, size)
    return Meta(tuple(x.shape[:2]) + tuple(size), x.dtype)


def _interp_kernel(x, mode, size, scales, align_corners):
    plans = _plans(x.shape, x.dtype, mode, size, scales, align_corners)
    if plans and all(p[0] == "block" for p in plans):
        # every dim averaged over whole blocks (adaptive average pooling to a divisor, as
        # the global pooling ending a CNN): one reduction over all the block axes, not one
        # strided mean per dim (1280x7x7 -> 1x1: 0.08x the time)
        shape, axes = list(x.shape[:2]), []
        for n_in, p in zip(x.shape[2:], plans):
            shape += [n_in // p[1], p[1]]
            axes.append(len(shape) - 1)
        return x.reshape(shape).mean(axis=tuple(axes))
    y = x
    for d, plan in enumerate(plans):
        y = _apply(y, 2 + d, plan)
    return y if y is not x else x.copy()


def _iattrs(ctx) -> dict:
    a = ctx.attrs
    return dict(mode=a["mode"], size=a["size"], scales=a["scales"],
                align_corners=a["align_corners"])


def _interp_grad(ctx, g):
    return (interpolate_backward(g, tuple(ctx.input_metas[0].shape), **_iattrs(ctx)),)


_INTERP = defop("interpolate", _interp_infer, _interp_kernel, grad=_interp_grad, save=(),
                sbp=SbpRule(_batch_channel(True)), cost=_interp_cost,
                to_relax=_relax.interpolate, to_jax=_jax.interpolate)


def interpolate(x: Tensor, *, mode: str, size, scales, align_corners: bool) -> Tensor:
    """Resample the spatial dims of (N, C, *S) ``x`` to ``size`` (``scales``: PyTorch's
    per-dim scale factors, or None)."""
    return dispatch(_INTERP, x, mode=mode, size=tuple(int(s) for s in size),
                    scales=tuple(None if s is None else float(s) for s in scales),
                    align_corners=bool(align_corners))


def _interpb_infer(g, input_shape, mode, size, scales, align_corners):
    _interp_check(tuple(input_shape), g.dtype, mode, size)
    if tuple(g.shape) != tuple(input_shape[:2]) + tuple(size):
        raise RuntimeError(f"interpolate_backward: gradient {list(g.shape)} does not match "
                           f"output size {list(size)}")
    return Meta(tuple(input_shape), g.dtype)


def _interpb_kernel(g, input_shape, mode, size, scales, align_corners):
    plans = _plans(input_shape, g.dtype, mode, size, scales, align_corners)
    dx = g
    for d in reversed(range(len(plans))):
        dx = _adjoint(dx, 2 + d, plans[d], input_shape[2 + d])
    return dx if dx is not g else g.copy()


def _interpb_grad(ctx, gg):
    return (interpolate(gg, **_iattrs(ctx)),)


_INTERP_BACKWARD = defop("interpolate_backward", _interpb_infer, _interpb_kernel,
                         grad=_interpb_grad, save=(),
                         sbp=SbpRule(_batch_channel(True), shape_attrs=("input_shape",)),
                         cost=_interp_backward_cost)


def interpolate_backward(g: Tensor, input_shape, *, mode, size, scales,
                         align_corners) -> Tensor:
    """The adjoint of ``interpolate``."""
    return dispatch(_INTERP_BACKWARD, g, input_shape=tuple(input_shape), mode=mode,
                    size=tuple(size), scales=tuple(scales), align_corners=bool(align_corners))


# ---- constant padding --------------------------------------------------------------------

def _cpad_infer(x, pads, value):
    lead = len(x.shape) - len(pads)
    if lead < 0:
        raise RuntimeError(f"constant_pad: Padding length should be less than or equal to two "
                           f"times the input dimension but got padding length {2 * len(pads)} "
                           f"and input of dimension {len(x.shape)}")
    out = list(x.shape)
    for i, (lo, hi) in enumerate(pads):
        n = x.shape[lead + i] + lo + hi
        if x.shape[lead + i] + min(lo, 0) + min(hi, 0) < 0 or n < 0:   # crops come first
            raise RuntimeError("constant_pad: narrow(): length must be non-negative.")
        out[lead + i] = n
    return Meta(tuple(out), x.dtype)


def _cpad_kernel(x, pads, value):
    lead = x.ndim - len(pads)
    sl = (slice(None),) * lead + tuple(slice(max(-lo, 0), x.shape[lead + i] - max(-hi, 0))
                                       for i, (lo, hi) in enumerate(pads))
    y = x[sl]
    grow = tuple((max(lo, 0), max(hi, 0)) for lo, hi in pads)
    if not any(lo or hi for lo, hi in grow):
        return y.copy()
    fill = value
    if x.dtype.kind in "iub" and isinstance(value, float):
        fill = int(value) if x.dtype.kind != "b" else bool(value)
    return pad_array(y, grow, fill)


def _cpad_grad(ctx, g):
    neg = tuple((-lo, -hi) for lo, hi in ctx.attrs["pads"])
    return (constant_pad(g, neg, 0.0),)


_CONSTANT_PAD = defop("constant_pad", _cpad_infer, _cpad_kernel, grad=_cpad_grad, save=(),
                      sbp=SbpRule(_constant_pad_sbp), cost=cost.movement(),
                      to_jax=_jax.constant_pad, to_relax=_relax.constant_pad)


def constant_pad(x: Tensor, pads, value=0.0) -> Tensor:
    """Pad (or crop, for negative sizes) the trailing dims by ((lo, hi), ...) with ``value``."""
    return dispatch(_CONSTANT_PAD, x, pads=tuple((int(lo), int(hi)) for lo, hi in pads),
                    value=value)


# ---- reflect / replicate / circular padding ------------------------------------------------

@functools.lru_cache(maxsize=512)
def _pad_index(mode: str, n: int, lo: int, hi: int) -> np.ndarray:
    """Input position read by every output position of one padded dim."""
    if mode == "circular":
        start, end = max(-lo, 0), n - max(-hi, 0)
        m = end - start
        return np.arange(-max(lo, 0), m + max(hi, 0)) % m + start
    i = np.arange(-lo, n + hi)
    if mode == "replicate":
        return np.clip(i, 0, n - 1)
    i = np.abs(i)
    return np.where(i > n - 1, 2 * (n - 1) - i, i)


@functools.lru_cache(maxsize=512)
def _pad_runs(mode: str, n: int, lo: int, hi: int) -> tuple:
    """The index table as runs (j0, j1, i0, step) with step in {-1, 0, 1}: the adjoint adds
    each run with one slice (a handful per dim, independent of the tensor size)."""
    idx = _pad_index(mode, n, lo, hi).tolist()
    runs, j = [], 0
    while j < len(idx):
        step = idx[j + 1] - idx[j] if j + 1 < len(idx) else 1
        if abs(step) > 1:
            step = 1
        k = j + 1
        while k < len(idx) and idx[k] - idx[k - 1] == step:
            k += 1
        runs.append((j, k, idx[j], step))
        j = k
    return tuple(runs)


def _pad_check(x_shape, pads, mode):
    lead = len(x_shape) - len(pads)
    out = list(x_shape)
    for i, (lo, hi) in enumerate(pads):
        n = x_shape[lead + i]
        if mode == "reflect" and (lo >= n or hi >= n) and n > 0:
            raise RuntimeError(f"Argument #4: Padding size should be less than the "
                               f"corresponding input dimension, but got: padding ({lo}, {hi}) "
                               f"at dimension {lead + i} of input {list(x_shape)}")
        if mode == "circular":
            if lo > n or hi > n:
                raise RuntimeError("Padding value causes wrapping around more than once.")
            if n + lo + hi < 0 or (n + min(lo, 0) + min(hi, 0) <= 0 < n + lo + hi):
                raise RuntimeError("Negative padding value is resulting in an empty dimension")
        elif n + lo + hi < 1:
            raise RuntimeError(f"input (size {n} at dimension {lead + i}) is too small. "
                               f"Calculated output size: {n + lo + hi}")
        out[lead + i] = n + lo + hi
    return tuple(out)


def _pad_infer(x, pads, mode):
    if mode not in ("reflect", "replicate", "circular"):
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    return Meta(_pad_check(tuple(x.shape), pads, mode), x.dtype)


def _pad_kernel(x, pads, mode):
    lead = x.ndim - len(pads)
    y = x
    for i, (lo, hi) in enumerate(pads):
        if lo or hi:
            y = np.take(y, _pad_index(mode, x.shape[lead + i], lo, hi), axis=lead + i)
    return y if y is not x else x.copy()


def _pad_grad(ctx, g):
    a = ctx.attrs
    return (pad_backward(g, tuple(ctx.input_metas[0].shape), a["pads"], a["mode"]),)


def _pad_to_relax(R, a, at):
    """The kernel's gathers: each padded dim read at ``_pad_index``'s positions."""
    x, pads = a[0], at["pads"]
    shape = R.shape(x)
    lead = len(shape) - len(pads)
    for i, (lo, hi) in enumerate(pads):
        if lo or hi:
            idx = _pad_index(at["mode"], shape[lead + i], lo, hi).astype(np.int64)
            x = R.take(x, R.const(idx, "int64"), lead + i)
    return x


_PAD = defop("pad", _pad_infer, _pad_kernel, grad=_pad_grad, save=(), sbp=SbpRule(_pad_sbp),
             cost=cost.movement(), to_jax=_jax.pad, to_relax=_pad_to_relax)


def pad(x: Tensor, pads, mode: str) -> Tensor:
    """Reflect / replicate / circular padding of the trailing dims by ((lo, hi), ...)."""
    return dispatch(_PAD, x, pads=tuple((int(lo), int(hi)) for lo, hi in pads), mode=mode)


def _padb_infer(g, input_shape, pads, mode):
    if _pad_check(tuple(input_shape), pads, mode) != tuple(g.shape):
        raise RuntimeError(f"pad_backward: gradient {list(g.shape)} does not match input "
                           f"{list(input_shape)} padded by {list(pads)}")
    return Meta(tuple(input_shape), g.dtype)


def _padb_kernel(g, input_shape, pads, mode):
    lead = g.ndim - len(pads)
    dx = g
    for i in reversed(range(len(pads))):
        lo, hi = pads[i]
        if not (lo or hi):
            continue
        ax = lead + i
        n = input_shape[ax]
        out = np.zeros(dx.shape[:ax] + (n,) + dx.shape[ax + 1:], dx.dtype)
        pre = (slice(None),) * ax
        for j0, j1, i0, step in _pad_runs(mode, n, lo, hi):
            seg = dx[pre + (slice(j0, j1),)]
            if step == 0:
                out[pre + (slice(i0, i0 + 1),)] += seg.sum(axis=ax, keepdims=True)
            elif step == 1:
                out[pre + (slice(i0, i0 + j1 - j0),)] += seg
            else:
                out[pre + (slice(i0 - (j1 - j0) + 1, i0 + 1),)] += np.flip(seg, axis=ax)
        dx = out
    return dx if dx is not g else g.copy()


def _padb_grad(ctx, gg):
    a = ctx.attrs
    return (pad(gg, a["pads"], a["mode"]),)


# (each gradient element added once into the input position it was read from)
_PAD_BACKWARD = defop("pad_backward", _padb_infer, _padb_kernel, grad=_padb_grad, save=(),
                      sbp=SbpRule(_pad_backward_sbp, shape_attrs=("input_shape",)),
                      cost=cost.reduction(1))


def pad_backward(g: Tensor, input_shape, pads, mode: str) -> Tensor:
    """The adjoint of ``pad``: every padded position adds into the input position it read."""
    return dispatch(_PAD_BACKWARD, g, input_shape=tuple(input_shape),
                    pads=tuple(tuple(p) for p in pads), mode=mode)


# ---- im2col / col2im (nn.functional.unfold / fold) --------------------------------------

def _blocks(spatial, kernel_size, dilation, padding, stride):
    return tuple((s + 2 * p - d * (k - 1) - 1) // st + 1 for s, k, d, p, st in
                 zip(spatial, kernel_size, dilation, padding, stride))


def _im2col_infer(x, kernel_size, dilation, padding, stride):
    nd = len(kernel_size)
    if len(x.shape) != nd + 2:
        raise RuntimeError(f"im2col: Expected {nd + 2}D input, got {list(x.shape)}")
    blocks = _blocks(x.shape[2:], kernel_size, dilation, padding, stride)
    if any(b < 1 for b in blocks):
        raise RuntimeError(f"im2col: Given input with spatial size {list(x.shape[2:])}, "
                           f"kernel_size={list(kernel_size)}, dilation={list(dilation)}, "
                           f"padding={list(padding)}, calculated shape of the array of sliding "
                           f"blocks as {list(blocks)}, but its components must be at least one.")
    k = int(np.prod(kernel_size))
    return Meta((x.shape[0], x.shape[1] * k, int(np.prod(blocks))), x.dtype)


def _im2col_kernel(x, kernel_size, dilation, padding, stride):
    blocks = _blocks(x.shape[2:], kernel_size, dilation, padding, stride)
    win = window_view(pad_array(x, [(p, p) for p in padding]), kernel_size, blocks, stride,
                      dilation)
    n, c = x.shape[:2]
    return np.ascontiguousarray(win).reshape(n, c * int(np.prod(kernel_size)),
                                             int(np.prod(blocks)))


def _fattrs(a) -> dict:
    return {k: a[k] for k in ("kernel_size", "dilation", "padding", "stride")}


def _im2col_grad(ctx, g):
    x = ctx.input_metas[0]
    return (col2im(g, tuple(x.shape[2:]), **_fattrs(ctx.attrs)),)


_IM2COL = defop("im2col", _im2col_infer, _im2col_kernel, grad=_im2col_grad, save=(),
                sbp=SbpRule(_batch_channel(True, channels=False)), cost=cost.movement())


def im2col(x: Tensor, *, kernel_size, dilation, padding, stride) -> Tensor:
    """(N, C, *S) -> (N, C * prod(K), L): every sliding block as a column."""
    return dispatch(_IM2COL, x, kernel_size=tuple(kernel_size), dilation=tuple(dilation),
                    padding=tuple(padding), stride=tuple(stride))


def _col2im_infer(cols, output_size, kernel_size, dilation, padding, stride):
    k = int(np.prod(kernel_size))
    if len(cols.shape) != 3:
        raise RuntimeError(f"col2im: Expected 3D input, got {list(cols.shape)}")
    if cols.shape[1] % k:
        raise RuntimeError(f"col2im: Expected size of input's dimension 1 to be divisible by "
                           f"the product of kernel_size, but got input.size(1)="
                           f"{cols.shape[1]} and kernel_size={list(kernel_size)}")
    blocks = _blocks(output_size, kernel_size, dilation, padding, stride)
    if any(b < 1 for b in blocks) or cols.shape[2] != int(np.prod(blocks)):
        raise RuntimeError(f"col2im: Given output_size={list(output_size)}, kernel_size="
                           f"{list(kernel_size)}, dilation={list(dilation)}, padding="
                           f"{list(padding)}, stride={list(stride)}, expected size of input's "
                           f"dimension 2 to match the calculated number of sliding blocks "
                           f"{' * '.join(map(str, blocks))} = {int(np.prod(blocks))}, but got "
                           f"input.size(2)={cols.shape[2]}.")
    return Meta((cols.shape[0], cols.shape[1] // k) + tuple(output_size), cols.dtype)


def _col2im_kernel(cols, output_size, kernel_size, dilation, padding, stride):
    n = cols.shape[0]
    c = cols.shape[1] // int(np.prod(kernel_size))
    blocks = _blocks(output_size, kernel_size, dilation, padding, stride)
    padded = tuple(s + 2 * p for s, p in zip(output_size, padding))
    acc = np.zeros((n, c) + padded, cols.dtype)
    col2im_add(acc, cols.reshape((n, c) + tuple(kernel_size) + blocks), kernel_size, blocks,
               stride, dilation)
    return np.ascontiguousarray(crop(acc, [(p, p) for p in padding], output_size))


def _col2im_grad(ctx, g):
    return (im2col(g, **_fattrs(ctx.attrs)),)


# (each column entry added once into its place)
_COL2IM = defop("col2im", _col2im_infer, _col2im_kernel, grad=_col2im_grad, save=(),
                sbp=SbpRule(_batch_channel(True, channels=False)), cost=cost.reduction(1))


def col2im(cols: Tensor, output_size, *, kernel_size, dilation, padding, stride) -> Tensor:
    """(N, C * prod(K), L) -> (N, C, *output_size): sum the blocks back into place."""
    return dispatch(_COL2IM, cols, output_size=tuple(output_size),
                    kernel_size=tuple(kernel_size), dilation=tuple(dilation),
                    padding=tuple(padding), stride=tuple(stride))
