"""Pooling ops on (N, C, *S) arrays, 1-d to 3-d, as strided window views (no Python loop
over output pixels).

    max_pool(x)                -> (y, indices)    grad: max_pool_backward(g, indices)
    adaptive_max_pool(x)       -> (y, indices)    grad: max_pool_backward(g, indices)
    max_pool_backward(g, idx)  -> dx              grad: gather(gg, idx)  (also max_unpool)
    avg_pool(x)                -> y               grad: avg_pool_backward(g)
    avg_pool_backward(g)       -> dx              grad: avg_pool(gg)

``indices`` are PyTorch's: flat positions in each (n, c) plane of the unpadded input.
Max pooling copies the windows once (K entries per output) and takes one argmax; its
backward is one ``bincount`` scatter-add. Average pooling sums one strided slice per kernel
offset and its backward adds them back the same way (col2im).

>>> import tessera
>>> from tessera.ops.pool import max_pool
>>> y, i = max_pool(tessera.arange(16.).reshape(1, 1, 4, 4), kernel_size=(2, 2),
...                 stride=(2, 2), padding=(0, 0), dilation=(1, 1), ceil_mode=False)
>>> y.flatten().tolist(), i.flatten().tolist()
([5.0, 7.0, 13.0, 15.0], [5, 7, 13, 15])
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.ops import _jax, _relax, cost
from tessera.ops.conv import col2im_add, crop, offset_slices, pad_array
from tessera.ops.registry import Meta, defop
from tessera.sbp import SbpRule, Signature, broadcast as B, partial_sum as P, split as S

__all__: list[str] = []


# ---- shapes --------------------------------------------------------------------------

def pool_out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling_output_shape (the ceil_mode rule: the last window must start
    inside the input or its left padding)."""
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _hi_pads(in_sp, out_sp, kernel, stride, padding, dilation):
    """(lo, hi) per dim so that every window (ceil_mode ones too) lies in the padded array."""
    return tuple((p, max(0, (o - 1) * s + d * (k - 1) + 1 - sz - p))
                 for sz, o, k, s, p, d in zip(in_sp, out_sp, kernel, stride, padding, dilation))


def _pool_check(op, x, kernel, stride, padding, dilation, ceil_mode):
    nd = len(kernel)
    name = f"{op}{nd}d"
    if len(x.shape) != nd + 2 or any(s == 0 for s in x.shape[1:]):
        raise RuntimeError(f"{name}: Expected {nd + 1}D or {nd + 2}D (batch mode) tensor with "
                           f"optional 0 dim batch size for input, but got:{list(x.shape)}")
    if any(k <= 0 for k in kernel):
        raise RuntimeError(f"{name}: kernel size should be greater than zero, but got "
                           f"kernel_size={list(kernel)}")
    if any(s <= 0 for s in stride):
        raise RuntimeError(f"{name}: stride should be greater than zero, but got "
                           f"stride={list(stride)}")
    if any(d <= 0 for d in dilation):
        raise RuntimeError(f"{name}: dilation should be greater than zero, but got "
                           f"dilation={list(dilation)}")
    if any(p < 0 for p in padding):
        raise RuntimeError(f"{name}: pad must be non-negative, but got pad: {list(padding)}")
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise RuntimeError(f"{name}: pad should be at most half of effective kernel size, but "
                           f"got pad={list(padding)}, kernel_size={list(kernel)} and "
                           f"dilation={list(dilation)}")
    out = tuple(pool_out_size(sz, k, s, p, d, ceil_mode) for sz, k, s, p, d in
                zip(x.shape[2:], kernel, stride, padding, dilation))
    if any(o < 1 for o in out):
        raise RuntimeError(f"{name}: Given input size: ({'x'.join(map(str, x.shape[1:]))}). "
                           f"Calculated output size: ({x.shape[1]}x{'x'.join(map(str, out))})."
                           " Output size is too small")
    return out


def _no_bool(op, m):
    if m.dtype is D.bool_ or m.dtype.is_complex:
        raise NotImplementedError(f'"{op}" not implemented for \'{m.dtype}\'')


def _floats_only(op, m):
    if m.dtype.category < 2 or m.dtype.is_complex:
        raise NotImplementedError(f'"{op}" not implemented for \'{m.dtype}\'')


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind in "fc" or dtype.kind == "V" else np.iinfo(dtype).min


def _acc_dtype(dtype: np.dtype) -> np.dtype:
    """Accumulate half precision in float32 (PyTorch's opmath type)."""
    return np.dtype(np.float32) if dtype.itemsize < 4 and dtype.kind != "i" else dtype


# ---- sbp and cost rules ---------------------------------------------------------------

def _pool_sbp(nout: int, linear: bool, shape_attrs: tuple = ()) -> SbpRule:
    """(N, C, *S) pooling: batch or channel split; partial_sum passes through where the op
    is linear (average pooling and its adjoint)."""
    def rule(x, *rest, **attrs):
        sigs = [Signature((S(d),), (S(d),) * nout) for d in (0, 1)]
        sigs.append(Signature((B,), (B,) * nout))
        if linear:
            sigs.append(Signature((P,), (P,) * nout))
        return sigs
    return SbpRule(rule, shape_attrs=shape_attrs)


def _window_cost(extra: int = 0):
    """Pooling over fixed windows: one operation per window element of every output (a
    comparison or an add), ``extra`` more per output (average pooling's division)."""
    def rule(ins, outs, kernel_size, **attrs) -> cost.Cost:
        n = cost.numel(outs[0])
        return cost.Cost(n * (math.prod(kernel_size) + extra), *cost.io(ins, outs))
    return rule


def _adaptive_cost(ins, outs, output_size, **attrs) -> cost.Cost:
    """One comparison per element of every (variable) adaptive window."""
    x = ins[0]
    taps = math.prod(x.shape[:2])
    for size, out in zip(x.shape[2:], output_size):
        taps *= adaptive_taps(size, out)
    return cost.Cost(taps, *cost.io(ins, outs))


def _avg_backward_cost(ins, outs, kernel_size, **attrs) -> cost.Cost:
    """A division per gradient element, then an add per element of its window."""
    n = cost.numel(ins[0])
    return cost.Cost(n * (math.prod(kernel_size) + 1), *cost.io(ins, outs))


def _max_pool_backward_sbp(g, idx, input_shape):
    return [Signature((S(d), S(d)), (S(d),)) for d in (0, 1)] + \
        [Signature((P, B), (P,)), Signature((B, B), (B,))]


# ---- max pooling -----------------------------------------------------------------------

def _flat_indices(arg, ksize, out_sp, in_sp, stride, lo, dilation) -> np.ndarray:
    """Window-local argmax (row-major over the kernel) -> flat input position per plane.

    The flat position is linear in the window's start and the kernel offset, so it is
    start[o] + offset[arg]: a lookup in a K-entry table plus one broadcast add."""
    nd = len(ksize)
    row = [int(np.prod(in_sp[d + 1:])) for d in range(nd)]       # flat stride of each dim
    offset = np.zeros((), np.int64)
    start = np.zeros((), np.int64)
    for d in range(nd):
        offset = np.add.outer(offset, np.arange(ksize[d], dtype=np.int64) * dilation[d] * row[d])
        start = np.add.outer(start, (np.arange(out_sp[d], dtype=np.int64) * stride[d] - lo[d]) *
                             row[d])
    return np.take(offset.reshape(-1), arg) + start


def _max_pool_infer(x, kernel_size, stride, padding, dilation, ceil_mode):
    _no_bool("max_pool", x)
    out = _pool_check("max_pool", x, kernel_size, stride, padding, dilation, ceil_mode)
    shape = tuple(x.shape[:2]) + out
    return Meta(shape, x.dtype), Meta(shape, D.int64)


def _max_pool_kernel(x, kernel_size, stride, padding, dilation, ceil_mode):
    in_sp = x.shape[2:]
    out_sp = tuple(pool_out_size(sz, k, s, p, d, ceil_mode) for sz, k, s, p, d in
                   zip(in_sp, kernel_size, stride, padding, dilation))
    if x.ndim == 4 and x.size and 0 not in out_sp:
        from tessera.kernels import window as kernels
        if kernels.available(x.dtype):  # C: one pass, PyTorch's tie and NaN rule
            return kernels.max_pool2d(np.ascontiguousarray(x), kernel_size, stride, padding,
                                      dilation, out_sp)
    pads = _hi_pads(in_sp, out_sp, kernel_size, stride, padding, dilation)
    low = _lowest(x.dtype)
    xp = pad_array(x, pads, low)
    y, arg = _window_max(xp, kernel_size, out_sp, stride, dilation)
    if any(lo or hi for lo, hi in pads) and (y == low).any():
        # a window of the lowest value only: its first element inside the input, as in
        # PyTorch, not the padding before it (which ties with it)
        inside = pad_array(np.ones((1, 1) + tuple(in_sp), np.float32), pads, 0)
        arg = np.where(y == low, _window_max(inside, kernel_size, out_sp, stride, dilation)[1],
                       arg)
    idx = _flat_indices(arg, kernel_size, out_sp, in_sp, stride, padding, dilation)
    return y, idx


def _window_max(xp, kernel_size, out_sp, stride, dilation):
    """Max over each window and its position (the first maximum; the last NaN, as PyTorch):
    one pass per kernel offset over strided views of the input, each as large as the
    output, instead of gathering every window into a copy."""
    offsets = list(itertools.product(*[range(n) for n in kernel_size]))
    views = [xp[(slice(None), slice(None)) + tuple(
        slice(o * d, o * d + s * (n - 1) + 1, s)
        for o, d, s, n in zip(offs, dilation, stride, out_sp))] for offs in offsets]
    best = views[0].copy()
    arg = np.zeros(best.shape, np.uint8 if len(views) < 256 else np.int64)
    kind = arg.dtype.type
    for k in range(1, len(views)):  # branch-free: masked copies mispredict on random data
        take = views[k] > best
        np.maximum(best, views[k], out=best)
        # offsets grow with k, so the newest strictly larger one is the largest index
        np.maximum(arg, np.multiply(take, kind(k), dtype=arg.dtype), out=arg)
    if xp.dtype.kind in "fcV" and np.isnan(best.sum()):  # rare: windows holding a NaN
        for k, v in enumerate(views):  # PyTorch's ``val > max || isnan(val)``: last NaN
            isnan = np.isnan(v)
            np.copyto(best, v, where=isnan)
            np.copyto(arg, k, where=isnan)
    return best, arg.astype(np.int64)


def _max_grad(ctx, g, _gi):
    x = ctx.input_metas[0]
    return (max_pool_backward(g, ctx.outputs[1], tuple(x.shape)),)


_MAX_POOL = defop("max_pool", _max_pool_infer, _max_pool_kernel, grad=_max_grad,
                  save=("outputs",), nondiff_outputs=(1,), sbp=_pool_sbp(2, False),
                  cost=_window_cost(), to_relax=_relax.max_pool, to_jax=_jax.max_pool)


def _max_pool_values_infer(x, **attrs):
    return _max_pool_infer(x, **attrs)[0]


def _max_pool_values_kernel(x, kernel_size, stride, padding, dilation, ceil_mode):
    in_sp = x.shape[2:]
    out_sp = tuple(pool_out_size(sz, k, s, p, d, ceil_mode) for sz, k, s, p, d in
                   zip(in_sp, kernel_size, stride, padding, dilation))
    if x.ndim == 4 and x.size and 0 not in out_sp:
        from tessera.kernels import window as kernels
        if kernels.available(x.dtype):
            return kernels.max_pool2d_values(np.ascontiguousarray(x), kernel_size, stride,
                                              padding, dilation, out_sp)
    return _max_pool_kernel(x, kernel_size, stride, padding, dilation, ceil_mode)[0]


def _max_values_grad(ctx, g):
    # the indices were not kept: find them again (max_pool's values are this op's)
    x = ctx.inputs[0]
    _, idx = max_pool(x.detach(), **ctx.attrs)
    return (max_pool_backward(g, idx, tuple(x.shape)),)


# max pooling when nobody reads the indices (inference; the graph compiler rewrites
# max_pool into it when its indices are unused): no index bookkeeping, a vectorised kernel
_MAX_POOL_VALUES = defop("max_pool_values", _max_pool_values_infer, _max_pool_values_kernel,
                         grad=_max_values_grad, sbp=_pool_sbp(1, False), cost=_window_cost(),
                         to_relax=_relax.max_pool_values, to_jax=_jax.max_pool_values)


def max_pool(x: Tensor, *, kernel_size, stride, padding, dilation, ceil_mode):
    """(values, indices) of N-d max pooling; x is (N, C, *S)."""
    return dispatch(_MAX_POOL, x, kernel_size=tuple(kernel_size), stride=tuple(stride),
                    padding=tuple(padding), dilation=tuple(dilation), ceil_mode=bool(ceil_mode))


# ---- adaptive max pooling ---------------------------------------------------------------

def adaptive_windows(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's adaptive windows [floor(i*size/out), ceil((i+1)*size/out)) as a tap table:
    (out, kmax) positions (short windows repeat their last position) and window lengths."""
    i = np.arange(out, dtype=np.int64)
    start = (i * size) // out
    end = -((-(i + 1) * size) // out)
    kmax = int((end - start).max()) if out else 1
    taps = np.minimum(start[:, None] + np.arange(kmax), end[:, None] - 1)
    return taps, end - start


def adaptive_taps(size: int, out: int) -> int:
    """The total length of the ``out`` adaptive windows over ``size`` positions (what
    reading every window costs, for the cost rules)."""
    return sum(-(-(i + 1) * size // out) - i * size // out for i in range(out))


def _adaptive_max_infer(x, output_size):
    _floats_only("adaptive_max_pool", x)
    nd = len(output_size)
    name = f"adaptive_max_pool{nd}d"
    if len(x.shape) != nd + 2:
        raise RuntimeError(f"{name}(): Expected {nd + 1}D or {nd + 2}D tensor, but got "
                           f"{list(x.shape)}")
    for i, s in enumerate(x.shape[1:]):
        if s == 0:
            raise RuntimeError(f"{name}(): Expected input to have non-zero size for non-batch "
                               f"dimensions, but input has sizes {list(x.shape)} with "
                               f"dimension {i + 1} being empty")
    if any(o < 0 for o in output_size):
        raise RuntimeError(f"{name}(): Trying to create tensor with negative dimension: "
                           f"{list(output_size)}")
    shape = tuple(x.shape[:2]) + tuple(output_size)
    return Meta(shape, x.dtype), Meta(shape, D.int64)


def _adaptive_max_kernel(x, output_size):
    nd = len(output_size)
    n, c = x.shape[:2]
    in_sp = x.shape[2:]
    if 0 in output_size or n == 0:
        out_shape = (n, c) + tuple(output_size)
        return np.empty(out_shape, x.dtype), np.empty(out_shape, np.int64)
    tables = [adaptive_windows(s, o)[0] for s, o in zip(in_sp, output_size)]
    index = []
    for d, t in enumerate(tables):
        shape = [1] * (2 * nd)
        shape[d], shape[nd + d] = t.shape
        index.append(t.reshape(shape))
    win = x[(slice(None), slice(None)) + tuple(index)]              # (N, C, *O, *K)
    flat = win.reshape((n, c) + tuple(output_size) + (-1,))
    arg = flat.argmax(axis=-1)
    # PyTorch's window scan replaces its maximum with every NaN it meets: the last NaN wins
    nan = np.isnan(flat)
    if nan.any():
        last = flat.shape[-1] - 1 - nan[..., ::-1].argmax(axis=-1)
        arg = np.where(nan.any(axis=-1), last, arg)
    y = np.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
    ksize = [t.shape[1] for t in tables]
    idx = None
    for d, t in enumerate(tables):
        kst = int(np.prod(ksize[d + 1:]))
        shape = [1] * (2 + nd)
        shape[2 + d] = output_size[d]
        o = np.arange(output_size[d]).reshape(shape)
        pos = t[o, arg // kst % ksize[d]]
        idx = pos if idx is None else idx * in_sp[d] + pos
    return y, idx


_ADAPTIVE_MAX = defop("adaptive_max_pool", _adaptive_max_infer, _adaptive_max_kernel,
                      grad=_max_grad, save=("outputs",), nondiff_outputs=(1,),
                      sbp=_pool_sbp(2, False), cost=_adaptive_cost)


def adaptive_max_pool(x: Tensor, output_size):
    """(values, indices) of N-d adaptive max pooling; x is (N, C, *S)."""
    return dispatch(_ADAPTIVE_MAX, x, output_size=tuple(int(o) for o in output_size))


# ---- the scatter of max pooling's gradient (and max_unpool) -------------------------------

def _mpb_infer(g, idx, input_shape):
    if idx.dtype is not D.int64:
        raise RuntimeError(f"max_pool_backward: expected indices of dtype int64, got "
                           f"{idx.dtype}")
    if tuple(g.shape) != tuple(idx.shape):
        raise RuntimeError(f"max_pool_backward: Shape of indices ({list(idx.shape)}) should "
                           f"match shape of input ({list(g.shape)})")
    if len(input_shape) < 3 or tuple(input_shape[:2]) != tuple(g.shape[:2]):
        raise RuntimeError(f"max_pool_backward: cannot scatter {list(g.shape)} into "
                           f"{list(input_shape)}")
    return Meta(tuple(input_shape), g.dtype)


def _mpb_kernel(g, idx, input_shape):
    if len(input_shape) == 4 and g.size and 0 not in input_shape:
        from tessera.kernels import window as kernels
        if kernels.available(g.dtype):
            try:
                return kernels.max_pool2d_backward(np.ascontiguousarray(g),
                                                   np.ascontiguousarray(idx), input_shape)
            except ValueError as e:
                raise RuntimeError(f"max_unpool: Found an invalid max index: {e.args[0]} "
                                   f"(output volumes are of size "
                                   f"{int(np.prod(input_shape[2:]))})") from None
    rows = int(input_shape[0] * input_shape[1])
    plane = int(np.prod(input_shape[2:]))
    idx2 = idx.reshape(rows, int(np.prod(idx.shape[2:])))
    if idx2.size and (idx2.min() < 0 or idx2.max() >= plane):
        bad = idx2.min() if idx2.min() < 0 else idx2.max()
        raise RuntimeError(f"max_unpool: Found an invalid max index: {bad} (output volumes "
                           f"are of size {plane})")
    flat = (idx2 + (np.arange(rows, dtype=np.int64) * plane)[:, None]).ravel()
    # one scatter-add for every window (overlapping windows may share an index)
    dx = np.bincount(flat, weights=g.reshape(-1), minlength=rows * plane)
    return dx.reshape(input_shape).astype(g.dtype, copy=False)


def _mpb_grad(ctx, gg):
    _g, idx = ctx.inputs
    n, c = idx.shape[:2]
    q = int(np.prod(idx.shape[2:]))
    p = int(np.prod(gg.shape[2:]))
    picked = gg.reshape(n, c, p).gather(2, idx.reshape(n, c, q))
    return picked.reshape(tuple(idx.shape)), None


# (one add per gradient element: the scatter-add)
_MAX_POOL_BACKWARD = defop("max_pool_backward", _mpb_infer, _mpb_kernel, grad=_mpb_grad,
                           sbp=SbpRule(_max_pool_backward_sbp, shape_attrs=("input_shape",)),
                           cost=cost.reduction(1),
                           to_relax=_relax.max_pool_backward, to_jax=_jax.max_pool_backward)


def max_pool_backward(g: Tensor, indices: Tensor, input_shape) -> Tensor:
    """Scatter-add ``g`` at the flat per-plane ``indices`` into zeros of ``input_shape``."""
    return dispatch(_MAX_POOL_BACKWARD, g, indices, input_shape=tuple(input_shape))


# ---- average pooling ---------------------------------------------------------------------

def _avg_attrs(a) -> dict:
    return {k: a[k] for k in ("kernel_size", "stride", "padding", "ceil_mode",
                              "count_include_pad", "divisor_override")}


def _avg_check(x, kernel_size, stride, padding, ceil_mode, divisor_override):
    if divisor_override is not None and divisor_override == 0:
        raise RuntimeError("avg_pool: divisor must be not zero")
    return _pool_check("avg_pool", x, kernel_size, stride, padding, (1,) * len(kernel_size),
                       ceil_mode)


def _avg_infer(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
               divisor_override):
    _no_bool("avg_pool", x)
    out = _avg_check(x, kernel_size, stride, padding, ceil_mode, divisor_override)
    return Meta(tuple(x.shape[:2]) + out, x.dtype)


def _divisor(in_sp, out_sp, kernel_size, stride, padding, count_include_pad,
             divisor_override, dtype):
    """Per-output divisor: the window size clipped to the padded input (count_include_pad)
    or to the input; separable, so an outer product of one vector per dim."""
    if divisor_override is not None:
        return dtype.type(divisor_override)
    div = np.ones((), np.int64)
    for sz, o, k, s, p in zip(in_sp, out_sp, kernel_size, stride, padding):
        start = np.arange(o, dtype=np.int64) * s - p
        end = np.minimum(start + k, sz + p)
        if count_include_pad:
            cnt = end - start
        else:
            cnt = np.minimum(end, sz) - np.maximum(start, 0)
        div = np.multiply.outer(div, cnt)
    return div


def _avg_out(in_sp, kernel_size, stride, padding, ceil_mode):
    return tuple(pool_out_size(sz, k, s, p, 1, ceil_mode) for sz, k, s, p in
                 zip(in_sp, kernel_size, stride, padding))


def _divide(acc, div, dtype):
    if dtype.kind in "iu":  # integer pooling truncates, like C++ division
        return np.trunc(acc / div).astype(dtype)
    return acc / np.asarray(div, dtype=acc.dtype)


def _avg_kernel(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                divisor_override):
    nd = len(kernel_size)
    in_sp = x.shape[2:]
    out_sp = _avg_out(in_sp, kernel_size, stride, padding, ceil_mode)
    pads = _hi_pads(in_sp, out_sp, kernel_size, stride, padding, (1,) * nd)
    xp = pad_array(x, pads)
    acc_t = np.int64 if x.dtype.kind in "iub" else _acc_dtype(x.dtype)
    acc = np.zeros(x.shape[:2] + out_sp, acc_t)
    if x.size:
        for offs in np.ndindex(*kernel_size):   # one strided slice per kernel offset
            acc += xp[offset_slices(offs, out_sp, stride, (1,) * nd)]
    div = _divisor(in_sp, out_sp, kernel_size, stride, padding, count_include_pad,
                   divisor_override, np.dtype(acc_t))
    return _divide(acc, div, x.dtype)


def _avg_grad(ctx, g):
    return (avg_pool_backward(g, tuple(ctx.input_metas[0].shape), **_avg_attrs(ctx.attrs)),)


_AVG_POOL = defop("avg_pool", _avg_infer, _avg_kernel, grad=_avg_grad, save=(),
                  sbp=_pool_sbp(1, True), cost=_window_cost(1),
                  to_relax=_relax.avg_pool, to_jax=_jax.avg_pool)


def avg_pool(x: Tensor, *, kernel_size, stride, padding, ceil_mode, count_include_pad,
             divisor_override):
    """N-d average pooling; x is (N, C, *S)."""
    return dispatch(_AVG_POOL, x, kernel_size=tuple(kernel_size), stride=tuple(stride),
                    padding=tuple(padding), ceil_mode=bool(ceil_mode),
                    count_include_pad=bool(count_include_pad),
                    divisor_override=None if divisor_override is None else int(divisor_override))


def _avgb_infer(g, input_shape, kernel_size, stride, padding, ceil_mode, count_include_pad,
                divisor_override):
    out = _avg_check(Meta(tuple(input_shape), g.dtype), kernel_size, stride, padding,
                     ceil_mode, divisor_override)
    if tuple(g.shape) != tuple(input_shape[:2]) + out:
        raise RuntimeError(f"avg_pool_backward: gradient of shape {list(g.shape)} does not "
                           f"match the pooled shape {list(input_shape[:2]) + list(out)}")
    return Meta(tuple(input_shape), g.dtype)


def _avgb_kernel(g, input_shape, kernel_size, stride, padding, ceil_mode, count_include_pad,
                 divisor_override):
    nd = len(kernel_size)
    in_sp = tuple(input_shape[2:])
    out_sp = g.shape[2:]
    div = _divisor(in_sp, out_sp, kernel_size, stride, padding, count_include_pad,
                   divisor_override, g.dtype)
    gd = g / np.asarray(div, dtype=g.dtype)
    pads = _hi_pads(in_sp, out_sp, kernel_size, stride, padding, (1,) * nd)
    padded = tuple(s + lo + hi for s, (lo, hi) in zip(in_sp, pads))
    dxp = np.zeros(tuple(input_shape[:2]) + padded, g.dtype)
    if g.size:   # every kernel offset of every window receives g / divisor
        cols = np.broadcast_to(gd.reshape(g.shape[:2] + (1,) * nd + out_sp),
                               g.shape[:2] + tuple(kernel_size) + out_sp)
        col2im_add(dxp, cols, kernel_size, out_sp, stride, (1,) * nd)
    return np.ascontiguousarray(crop(dxp, pads, in_sp))


def _avgb_grad(ctx, gg):
    return (avg_pool(gg, **_avg_attrs(ctx.attrs)),)


_AVG_POOL_BACKWARD = defop("avg_pool_backward", _avgb_infer, _avgb_kernel, grad=_avgb_grad,
                           save=(), sbp=_pool_sbp(1, True, shape_attrs=("input_shape",)),
                           cost=_avg_backward_cost)


def avg_pool_backward(g: Tensor, input_shape, *, kernel_size, stride, padding, ceil_mode,
                      count_include_pad, divisor_override) -> Tensor:
    """The adjoint of ``avg_pool``: spread each ``g / divisor`` over its window."""
    return dispatch(_AVG_POOL_BACKWARD, g, input_shape=tuple(input_shape),
                    kernel_size=tuple(kernel_size), stride=tuple(stride),
                    padding=tuple(padding), ceil_mode=bool(ceil_mode),
                    count_include_pad=bool(count_include_pad),
                    divisor_override=divisor_override)


def max_pool_values(x: Tensor, *, kernel_size, stride, padding, dilation, ceil_mode):
    """The values of N-d max pooling (``max_pool``'s first output), computed without
    indices. x is (N, C, *S)."""
    return dispatch(_MAX_POOL_VALUES, x, kernel_size=tuple(kernel_size),
                    stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation),
                    ceil_mode=bool(ceil_mode))
