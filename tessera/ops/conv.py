"""Convolution as im2col + one batched GEMM (BLAS), for 1-d, 2-d and 3-d inputs.

Three ops carry every rule, and each one's gradient is written with the other two, so
double backward works:

    conv(x, w)                -> y      grads: conv_input_grad(g, w), conv_weight_grad(x, g)
    conv_input_grad(g, w)     -> dx     (also conv_transpose's forward)
    conv_weight_grad(x, g)    -> dw

Shapes: x (N, C, *S), w (O, C/groups, *K), y (N, O, *S_out). Padding is explicit per side
(``pads`` = ((lo, hi), ...)), so 'same' padding with an even kernel works too.

>>> import tessera
>>> from tessera.ops.conv import conv
>>> conv(tessera.ones(1, 1, 4, 4), tessera.ones(1, 1, 3, 3), stride=(1, 1),
...      pads=((0, 0), (0, 0)), dilation=(1, 1), groups=1).shape
tessera.Size([1, 1, 2, 2])
"""
from __future__ import annotations

import numpy as np

from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.ops.registry import Meta, defop

__all__: list[str] = []
_strided = np.lib.stride_tricks.as_strided


def out_size(size: int, k: int, stride: int, lo: int, hi: int, dil: int) -> int:
    return (size + lo + hi - dil * (k - 1) - 1) // stride + 1


def _check(op, x, w, stride, pads, dilation, groups):
    nd = len(stride)
    if len(x.shape) != nd + 2:
        raise RuntimeError(f"{op}: Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input "
                           f"to conv{nd}d, but got input of size: {list(x.shape)}")
    if len(w.shape) != nd + 2:
        raise RuntimeError(f"{op}: weight should have {nd + 2} dims, got {list(w.shape)}")
    if x.dtype is not w.dtype:
        raise RuntimeError(f"{op}: Input type ({x.dtype}) and weight type ({w.dtype}) should "
                           "be the same")
    if groups < 1 or x.shape[1] % groups or w.shape[0] % groups:
        raise RuntimeError(f"{op}: Given groups={groups}, expected input channels "
                           f"{x.shape[1]} and output channels {w.shape[0]} to be divisible "
                           "by groups")
    if x.shape[1] != w.shape[1] * groups:
        raise RuntimeError(f"{op}: Given groups={groups}, weight of size {list(w.shape)}, "
                           f"expected input{list(x.shape)} to have {w.shape[1] * groups} "
                           f"channels, but got {x.shape[1]} channels instead")
    if any(s < 1 for s in stride) or any(d < 1 for d in dilation):
        raise RuntimeError(f"{op}: non-positive stride or dilation is not supported")
    if any(lo < 0 or hi < 0 for lo, hi in pads):
        raise RuntimeError(f"{op}: negative padding is not supported")


def _conv_infer(x, w, stride, pads, dilation, groups):
    _check("conv", x, w, stride, pads, dilation, groups)
    spatial = []
    for i, s in enumerate(x.shape[2:]):
        k = w.shape[2 + i]
        o = out_size(s, k, stride[i], *pads[i], dilation[i])
        if o <= 0:
            raise RuntimeError(f"conv: Calculated output size {o} is too small at spatial dim "
                               f"{i} (input {list(x.shape)}, kernel {list(w.shape)}, padding "
                               f"{list(pads)}, dilation {list(dilation)})")
        spatial.append(o)
    return Meta((x.shape[0], w.shape[0]) + tuple(spatial), x.dtype)


def _pad(x: np.ndarray, pads) -> np.ndarray:
    if not any(lo or hi for lo, hi in pads):
        return x
    return np.pad(x, ((0, 0), (0, 0)) + tuple(pads))


def im2col(xp: np.ndarray, ksize, out_spatial, stride, dilation) -> np.ndarray:
    """(N, C, *Sp) padded input -> (N, C, *K, *S_out) strided view of every window."""
    nd = len(ksize)
    st = xp.strides
    shape = xp.shape[:2] + tuple(ksize) + tuple(out_spatial)
    strides = st[:2] + tuple(st[2 + i] * dilation[i] for i in range(nd)) + \
        tuple(st[2 + i] * stride[i] for i in range(nd))
    return _strided(xp, shape, strides, writeable=False)


def _cols(x, ksize, out_spatial, stride, pads, dilation, groups):
    """The im2col matrix, grouped: (N, G, C/G * prod(K), prod(S_out)), contiguous."""
    n, c = x.shape[:2]
    win = im2col(_pad(x, pads), ksize, out_spatial, stride, dilation)
    p = int(np.prod(out_spatial))
    k = int(np.prod(ksize))
    return np.ascontiguousarray(win).reshape(n, groups, (c // groups) * k, p)


def _conv_kernel(x, w, stride, pads, dilation, groups):
    n = x.shape[0]
    o = w.shape[0]
    ksize = w.shape[2:]
    out_sp = _out_spatial(x.shape, w.shape, stride, pads, dilation)
    cols = _cols(x, ksize, out_sp, stride, pads, dilation, groups)
    wm = w.reshape(groups, o // groups, -1)                      # (G, O/G, K)
    y = np.matmul(wm[None], cols)                                # (N, G, O/G, P)
    return y.reshape((n, o) + tuple(out_sp))


def _out_spatial(xs, ws, stride, pads, dilation):
    return tuple(out_size(s, ws[2 + i], stride[i], *pads[i], dilation[i])
                 for i, s in enumerate(xs[2:]))


def _attrs(ctx):
    a = ctx.attrs
    return dict(stride=a["stride"], pads=a["pads"], dilation=a["dilation"], groups=a["groups"])


def _conv_grad(ctx, g):
    x, w = ctx.inputs
    need = ctx.needs_input_grad
    a = _attrs(ctx)
    gx = conv_input_grad(g, w, input_shape=tuple(x.shape), **a) if need[0] else None
    gw = conv_weight_grad(x, g, weight_shape=tuple(w.shape), **a) if need[1] else None
    return gx, gw


_CONV = defop("conv", _conv_infer, _conv_kernel, grad=_conv_grad)


def conv(x: Tensor, w: Tensor, *, stride, pads, dilation, groups) -> Tensor:
    """N-d convolution (no bias) with explicit per-side padding."""
    return dispatch(_CONV, x, w, stride=tuple(stride), pads=tuple(map(tuple, pads)),
                    dilation=tuple(dilation), groups=int(groups))


# ---- gradient with respect to the input (= transposed convolution) ------------------

def _input_grad_infer(g, w, input_shape, stride, pads, dilation, groups):
    if g.dtype is not w.dtype:
        raise RuntimeError(f"conv_transpose: Input type ({g.dtype}) and weight type "
                           f"({w.dtype}) should be the same")
    if len(g.shape) != len(w.shape) or len(input_shape) != len(g.shape):
        raise RuntimeError(f"conv_transpose: expected input of {len(w.shape)} dims, got "
                           f"{list(g.shape)}")
    if g.shape[1] != w.shape[0]:
        raise RuntimeError(f"conv_transpose: Given transposed weight of size {list(w.shape)}, "
                           f"expected input {list(g.shape)} to have {w.shape[0]} channels, "
                           f"but got {g.shape[1]} channels instead")
    return Meta(tuple(input_shape), g.dtype)


def _col2im(gcols, x_shape, ksize, out_sp, stride, pads, dilation):
    """Scatter-add (N, C, *K, *S_out) window gradients into the (unpadded) input shape."""
    nd = len(ksize)
    padded = tuple(s + lo + hi for s, (lo, hi) in zip(x_shape[2:], pads))
    dx = np.zeros(x_shape[:2] + padded, gcols.dtype)
    # one vectorised add per kernel offset: windows at a fixed offset never overlap
    for offs in np.ndindex(*ksize):
        sl = tuple(slice(offs[i] * dilation[i], offs[i] * dilation[i] +
                         stride[i] * (out_sp[i] - 1) + 1, stride[i]) for i in range(nd))
        dx[(slice(None), slice(None)) + sl] += gcols[(slice(None), slice(None)) + offs]
    crop = tuple(slice(lo, lo + s) for (lo, hi), s in zip(pads, x_shape[2:]))
    return dx[(slice(None), slice(None)) + crop]


def _input_grad_kernel(g, w, input_shape, stride, pads, dilation, groups):
    n, o = g.shape[:2]
    out_sp = g.shape[2:]
    ksize = w.shape[2:]
    c = input_shape[1]
    p = int(np.prod(out_sp))
    wm = w.reshape(groups, o // groups, -1)                       # (G, O/G, C/G*K)
    gm = g.reshape(n, groups, o // groups, p)                     # (N, G, O/G, P)
    gcols = np.matmul(np.swapaxes(wm, 1, 2)[None], gm)            # (N, G, C/G*K, P)
    gcols = gcols.reshape((n, c) + tuple(ksize) + tuple(out_sp))
    return np.ascontiguousarray(_col2im(gcols, tuple(input_shape), ksize, out_sp, stride,
                                        pads, dilation))


def _input_grad_grad(ctx, gg):
    g, w = ctx.inputs
    need = ctx.needs_input_grad
    a = _attrs(ctx)
    d_g = conv(gg, w, **a) if need[0] else None
    d_w = conv_weight_grad(gg, g, weight_shape=tuple(w.shape), **a) if need[1] else None
    return d_g, d_w


_CONV_INPUT_GRAD = defop("conv_input_grad", _input_grad_infer, _input_grad_kernel,
                         grad=_input_grad_grad)


def conv_input_grad(g: Tensor, w: Tensor, *, input_shape, stride, pads, dilation,
                    groups) -> Tensor:
    """d conv / d input applied to ``g``; with a transposed-conv weight it is
    ``conv_transpose``."""
    return dispatch(_CONV_INPUT_GRAD, g, w, input_shape=tuple(input_shape),
                    stride=tuple(stride), pads=tuple(map(tuple, pads)),
                    dilation=tuple(dilation), groups=int(groups))


# ---- gradient with respect to the weight ----------------------------------------------

def _weight_grad_infer(x, g, weight_shape, stride, pads, dilation, groups):
    if x.dtype is not g.dtype:
        raise RuntimeError(f"conv_weight_grad: dtypes differ ({x.dtype}, {g.dtype})")
    return Meta(tuple(weight_shape), x.dtype)


def _weight_grad_kernel(x, g, weight_shape, stride, pads, dilation, groups):
    n, o = g.shape[:2]
    out_sp = g.shape[2:]
    ksize = tuple(weight_shape[2:])
    cols = _cols(x, ksize, out_sp, stride, pads, dilation, groups)  # (N, G, C/G*K, P)
    gm = g.reshape(n, groups, o // groups, -1)                     # (N, G, O/G, P)
    # one GEMM per (sample, group) on a transposed view (BLAS takes the transpose flag),
    # then a sum over the batch: no copies of the big operands
    gw = np.matmul(gm, cols.swapaxes(-1, -2)).sum(axis=0)          # (G, O/G, C/G*K)
    return gw.reshape(weight_shape)


def _weight_grad_grad(ctx, gg):
    x, g = ctx.inputs
    need = ctx.needs_input_grad
    a = _attrs(ctx)
    d_x = conv_input_grad(g, gg, input_shape=tuple(x.shape), **a) if need[0] else None
    d_g = conv(x, gg, **a) if need[1] else None
    return d_x, d_g


_CONV_WEIGHT_GRAD = defop("conv_weight_grad", _weight_grad_infer, _weight_grad_kernel,
                          grad=_weight_grad_grad)


def conv_weight_grad(x: Tensor, g: Tensor, *, weight_shape, stride, pads, dilation,
                     groups) -> Tensor:
    """d conv / d weight applied to ``g``."""
    return dispatch(_CONV_WEIGHT_GRAD, x, g, weight_shape=tuple(weight_shape),
                    stride=tuple(stride), pads=tuple(map(tuple, pads)),
                    dilation=tuple(dilation), groups=int(groups))
