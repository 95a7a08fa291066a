"""The blocked activation layout (NCHWc) of inference convolutions: four ops.

A blocked tensor holds a (N, C, H, W) activation as (N, ceil(C/B), H, W, B) float32, C
contiguous, B channels (8 or 16: ``tessera.kernels.nchwc.block``) innermost and the
channels past C zero. Every convolution on it is a direct convolution broadcasting one
input value against a vector of B output channels' weights (no im2col), its bias,
activation and residual applied in registers; pooling and elementwise ops run on it as is.
The graph pass ``tessera.graph.passes.nchwc`` rewrites the convolutional trunk of an
inference graph into these ops:

    to_nchwc(x, block)                     (N, C, H, W) -> (N, C/B, H, W, B)
    from_nchwc(x, channels)                the inverse (the first ``channels``)
    conv2d_nchwc(x, wp, b, r, ...)         act(conv(x, W, b) [+ r]) [+ r], blocked in and
                                           out; ``wp``: W packed once
                                           (``pack_conv_weight``), ``b`` padded to a
                                           multiple of B; with ``plain_input`` x is plain
                                           (N, C, H, W) (a first layer of few channels)
    pool2d_nchwc(x, kind, ...)             max or average pooling of blocked planes

Each one's NumPy kernel states its meaning (unblock, the plain op, block); the C kernels
(``tessera.kernels.nchwc``) run them where a C compiler is. Inference only: asking one
for a gradient is a ``RuntimeError`` naming the op.

>>> import numpy as np, tessera
>>> x = tessera.arange(2 * 3 * 4.0).reshape(1, 3, 2, 4)
>>> xb = to_nchwc(x, 8); tuple(xb.shape)
(1, 1, 2, 4, 8)
>>> bool((from_nchwc(xb, 3) == x).all())
True
"""
from __future__ import annotations

import functools
import math

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.ops import cost
from tessera.ops._sbp import optional
from tessera.ops.registry import Meta, defop
from tessera.sbp import SbpRule, Signature, broadcast as B, split as S

__all__: list[str] = []

ACTIVATIONS = (None, "relu", "clamp")   # as conv_pointwise's


def _kernels():
    """``tessera.kernels.nchwc`` where it runs (a C compiler), else None."""
    try:
        from tessera.kernels import nchwc as K
    except ImportError:  # the kernels are not built into this tree
        return None
    return K if K.usable() else None


def _blocks(c: int, block: int) -> int:
    return -(-c // block)


def _no_grad(ctx, *grads):
    raise RuntimeError(f"{ctx.op.name}: an inference op (the blocked layout of "
                       "tessera.graph.passes.nchwc) has no gradient")


def _float32(op: str, *metas) -> None:
    for m in metas:
        if m is not None and m.dtype is not D.float32:
            raise RuntimeError(f"{op}: expected float32 tensors, got {m.dtype}")


def _check_block(op: str, block) -> None:
    if block not in (8, 16):
        raise RuntimeError(f"{op}: block must be 8 or 16, got {block!r}")


# ---- NumPy layout changes (the reference kernels' own) ----------------------------------

def block_array(x: np.ndarray, block: int) -> np.ndarray:
    """(N, C, H, W) -> (N, ceil(C/B), H, W, B), zeros past C (NumPy).

    >>> block_array(np.ones((1, 3, 1, 1), np.float32), 8)[0, 0, 0, 0].tolist()
    [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    """
    n, c, h, w = x.shape
    cb = _blocks(c, block)
    out = np.zeros((n, cb * block, h, w), x.dtype)
    out[:, :c] = x
    return np.ascontiguousarray(out.reshape(n, cb, block, h, w).transpose(0, 1, 3, 4, 2))


def unblock_array(x: np.ndarray, channels: int) -> np.ndarray:
    """(N, C/B, H, W, B) -> (N, channels, H, W) (NumPy).

    >>> unblock_array(np.ones((1, 1, 2, 2, 8), np.float32), 3).shape
    (1, 3, 2, 2)
    """
    n, cb, h, w, b = x.shape
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)[:, :channels])


# ---- to_nchwc / from_nchwc ---------------------------------------------------------------

def _to_infer(x, block):
    _check_block("to_nchwc", block)
    _float32("to_nchwc", x)
    if len(x.shape) != 4:
        raise RuntimeError(f"to_nchwc: expected a 4-d (N, C, H, W) input, got {list(x.shape)}")
    n, c, h, w = x.shape
    return Meta((n, _blocks(c, block), h, w, block), x.dtype)


def _to_into(out, x, block) -> None:
    K = _kernels()
    if K is not None and x.size and out.flags.c_contiguous:
        K.to_blocked(np.ascontiguousarray(x), block, out)
    else:
        np.copyto(out, block_array(x, block))


def _to_kernel(x, block):
    n, c, h, w = x.shape
    out = np.empty((n, _blocks(c, block), h, w, block), x.dtype)
    _to_into(out, x, block)
    return out


def _batch_sbp(x, **attrs):
    """Batch split, or broadcast."""
    return [Signature((S(0),), (S(0),)), Signature((B,), (B,))]


_TO = defop("to_nchwc", _to_infer, _to_kernel, grad=_no_grad, sbp=SbpRule(_batch_sbp),
            cost=cost.movement(), traits={"out_form"},
            inplace_kernels={"cpu": _to_into})


def to_nchwc(x: Tensor, block: int) -> Tensor:
    """``x`` (N, C, H, W) float32 in the blocked layout (N, ceil(C/B), H, W, B).

    >>> import tessera
    >>> tuple(to_nchwc(tessera.ones(2, 9, 3, 3), 8).shape)
    (2, 2, 3, 3, 8)
    """
    return dispatch(_TO, x, block=int(block))


def _from_infer(x, channels):
    _float32("from_nchwc", x)
    if len(x.shape) != 5 or x.shape[4] not in (8, 16):
        raise RuntimeError(f"from_nchwc: expected a blocked (N, C/B, H, W, B) input, got "
                           f"{list(x.shape)}")
    n, cb, h, w, b = x.shape
    if not (cb - 1) * b < channels <= cb * b:
        raise RuntimeError(f"from_nchwc: {channels} channels do not fill {cb} blocks of {b}")
    return Meta((n, channels, h, w), x.dtype)


def _from_into(out, x, channels) -> None:
    K = _kernels()
    if K is not None and x.size and out.flags.c_contiguous:
        K.from_blocked(np.ascontiguousarray(x), channels, out)
    else:
        np.copyto(out, unblock_array(x, channels))


def _from_kernel(x, channels):
    out = np.empty((x.shape[0], channels) + x.shape[2:4], x.dtype)
    _from_into(out, x, channels)
    return out


_FROM = defop("from_nchwc", _from_infer, _from_kernel, grad=_no_grad, sbp=SbpRule(_batch_sbp),
              cost=cost.movement(), traits={"out_form"}, inplace_kernels={"cpu": _from_into})


def from_nchwc(x: Tensor, channels: int) -> Tensor:
    """A blocked tensor (N, C/B, H, W, B) as (N, channels, H, W).

    >>> import tessera
    >>> tuple(from_nchwc(tessera.ones(2, 2, 3, 3, 8), 9).shape)
    (2, 9, 3, 3)
    """
    return dispatch(_FROM, x, channels=int(channels))


# ---- conv2d_nchwc --------------------------------------------------------------------------

def pack_conv_weight(w: np.ndarray, *, groups: int, block: int,
                     plain_input: bool, winograd: bool = False) -> np.ndarray:
    """PyTorch's (O, C/groups, KH, KW) float32 weights packed for ``conv2d_nchwc`` (1-d,
    64-byte aligned): the C kernels' layout (``tessera.kernels.nchwc.pack_weights``; with
    ``winograd`` the filters' Winograd transforms), or the weights as they are where those
    do not run (the NumPy kernel reads either).

    >>> pack_conv_weight(np.ones((8, 8, 3, 3), np.float32), groups=1, block=8,
    ...                  plain_input=False).ndim
    1
    """
    w = np.ascontiguousarray(w, np.float32)
    K = _kernels()
    if K is None:
        return w.reshape(-1).copy()
    return K.pack_weights(w, groups=groups, block=block, plain_input=plain_input,
                          winograd=winograd)


@functools.lru_cache(maxsize=64)
def _packed_positions(weight_shape, groups, block, plain_input):
    """(positions in the packed array, the weight element each holds): packing moves
    elements, so packing the numbers 1..size (exact in float32 below 2**24) says where."""
    size = math.prod(weight_shape)
    if size >= 1 << 24:
        raise RuntimeError(f"conv2d_nchwc: the NumPy kernel cannot unpack a weight of "
                           f"{size} elements")
    idx = np.arange(1, size + 1, dtype=np.float32).reshape(weight_shape)
    packed = pack_conv_weight(idx, groups=groups, block=block, plain_input=plain_input)
    where = np.flatnonzero(packed)
    return where, packed[where].astype(np.int64) - 1


# Winograd F(4x4, 3x3)'s filter transform G (U = G g G^T) and its rows 0, 1 and 5, which
# give g back from U's positions {0, 1, 5} x {0, 1, 5}: g = Gs^-1 U_s Gs^-T
_G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
               [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])
_GS_INV = np.linalg.inv(_G[[0, 1, 5]])


def _unpack_winograd(wp: np.ndarray, weight_shape, block) -> np.ndarray:
    """The 3x3 weights of a Winograd packing (36, O/B, C/B, B ci, B co)."""
    o, c = weight_shape[:2]
    ob, cb = _blocks(o, block), _blocks(c, block)
    u = wp.reshape(6, 6, ob, cb, block, block).transpose(2, 5, 3, 4, 0, 1)
    u = u.reshape(ob * block, cb * block, 6, 6)[:o, :c].astype(np.float64)
    us = u[:, :, [0, 1, 5]][:, :, :, [0, 1, 5]]
    return np.einsum("ia,ocab,jb->ocij", _GS_INV, us, _GS_INV).astype(np.float32)


def _unpack(wp: np.ndarray, weight_shape, groups, block, plain_input,
            winograd: bool = False) -> np.ndarray:
    if _kernels() is None:
        return wp.reshape(weight_shape)
    if winograd:
        return _unpack_winograd(wp, weight_shape, block)
    where, src = _packed_positions(tuple(weight_shape), groups, block, plain_input)
    w = np.zeros(math.prod(weight_shape), np.float32)
    w[src] = wp[where]
    return w.reshape(weight_shape)


def pad_bias(b: np.ndarray, block: int) -> np.ndarray:
    """A bias of O values zero-padded to a multiple of ``block``.

    >>> pad_bias(np.ones(3, np.float32), 8).tolist()
    [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    """
    out = np.zeros(_blocks(len(b), block) * block, np.float32)
    out[:len(b)] = b
    return out


def _conv_out(x_shape, weight_shape, stride, pads, dilation) -> tuple[int, int]:
    from tessera.ops.conv import out_size
    (t, b), (left, right) = pads
    return (out_size(x_shape[2], weight_shape[2], stride[0], t, b, dilation[0]),
            out_size(x_shape[3], weight_shape[3], stride[1], left, right, dilation[1]))


def _conv_infer(x, wp, b, r, stride, pads, dilation, groups, block, plain_input, activation,
                bounds, residual_first, weight_shape, winograd=False):
    op = "conv2d_nchwc"
    _check_block(op, block)
    _float32(op, x, wp, b, r)
    from tessera.ops.conv import check_geometry
    check_geometry(op, weight_shape, stride, pads, dilation)
    o, cg, kh, kw = weight_shape
    c = cg * groups
    if not (groups == 1 or groups == c == o):
        raise RuntimeError(f"{op}: groups must be 1 or the channel count (depthwise), got "
                           f"groups={groups} for weight {list(weight_shape)}")
    if plain_input and groups != 1:
        raise RuntimeError(f"{op}: a plain input is for ungrouped convolutions only")
    if winograd and (groups != 1 or plain_input or (kh, kw) != (3, 3) or
                     tuple(stride) != (1, 1) or tuple(dilation) != (1, 1)):
        raise RuntimeError(f"{op}: winograd is for ungrouped 3x3 stride-1 undilated "
                           f"convolutions of blocked input, got weight {list(weight_shape)}, "
                           f"groups={groups}, stride {tuple(stride)}, dilation "
                           f"{tuple(dilation)}")
    want = (x.shape[0], c) + tuple(x.shape[2:4]) if plain_input else \
        (x.shape[0], _blocks(c, block)) + tuple(x.shape[2:4]) + (block,)
    if len(x.shape) != (4 if plain_input else 5) or tuple(x.shape) != want:
        raise RuntimeError(f"{op}: weight {list(weight_shape)} with groups={groups} and block "
                           f"{block} needs a{' plain' if plain_input else ' blocked'} input "
                           f"of shape {list(want)}, got {list(x.shape)}")
    if len(wp.shape) != 1:
        raise RuntimeError(f"{op}: expected packed (1-d) weights, got {list(wp.shape)}")
    ob = _blocks(o, block)
    if b is not None and tuple(b.shape) != (ob * block,):
        raise RuntimeError(f"{op}: expected a bias of {ob * block} values (padded to the "
                           f"block), got {list(b.shape)}")
    if activation not in ACTIVATIONS:
        raise RuntimeError(f"{op}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if activation == "clamp" and not (len(bounds) == 2 and bounds[0] <= bounds[1]):
        raise RuntimeError(f"{op}: clamp needs bounds (lo, hi), lo <= hi, got {bounds!r}")
    oh, ow = _conv_out(x.shape, weight_shape, stride, pads, dilation)
    if oh <= 0 or ow <= 0 or any(lo < 0 or hi < 0 for lo, hi in pads):
        raise RuntimeError(f"{op}: input {list(x.shape)} and weight {list(weight_shape)} give "
                           f"an empty output ({oh}x{ow})")
    out = (x.shape[0], ob, oh, ow, block)
    if r is not None and tuple(r.shape) != out:
        raise RuntimeError(f"{op}: the residual must be blocked like the output {list(out)}, "
                           f"got {list(r.shape)}")
    return Meta(out, x.dtype)


def _conv_reference(x, wp, b, r, stride, pads, dilation, groups, block, plain_input,
                    activation, bounds, residual_first, weight_shape, winograd=False):
    """The meaning: unblock, ``conv_pointwise``, block."""
    from tessera.ops.conv import _pointwise_kernel
    o, cg = weight_shape[:2]
    xs = x if plain_input else unblock_array(x, cg * groups)
    w = _unpack(wp, weight_shape, groups, block, plain_input, winograd)
    y = _pointwise_kernel(np.ascontiguousarray(xs), w, None if b is None else b[:o],
                          None if r is None else unblock_array(r, o), stride, pads, dilation,
                          groups, activation, tuple(bounds), residual_first)
    return block_array(y, block)


@functools.lru_cache(maxsize=512)
def _conv_runner(xshape, oshape, weight_shape, stride, pads, dilation, groups, block,
                 plain_input, activation, bounds, residual_first, winograd):
    K = _kernels()
    if K is None:
        return None
    o, cg = weight_shape[:2]
    plain_x = xshape if plain_input else (xshape[0], cg * groups) + xshape[2:4]
    (top, bottom), (left, right) = pads
    return K.conv_bound(plain_x, (oshape[0], o) + oshape[2:4], weight_shape, stride,
                        (top, left, bottom, right), dilation, groups, block, plain_input,
                        activation, bounds, residual_first, winograd=winograd)


def _aligned(a: np.ndarray) -> np.ndarray:
    """``a`` itself when C-contiguous and 64-byte aligned (packed weights are), else a copy
    that is."""
    if a.flags.c_contiguous and a.ctypes.data % 64 == 0:
        return a
    raw = np.empty(a.size + 16, np.float32)
    out = raw[(-raw.ctypes.data % 64) // 4:][:a.size].reshape(a.shape)
    np.copyto(out, a)
    return out


def _conv_bind(x, wp, b, r, out, **attrs):
    """``conv2d_nchwc``'s out-form for fixed metas: the C kernel planned once, called as
    ``fn(out, x, wp, b, r)`` (``bound_attrs``); the NumPy kernel where C does not run."""
    a = attrs
    run = _conv_runner(tuple(x.shape), tuple(out.shape), tuple(a["weight_shape"]),
                       tuple(a["stride"]), tuple(map(tuple, a["pads"])), tuple(a["dilation"]),
                       a["groups"], a["block"], a["plain_input"], a["activation"],
                       tuple(a["bounds"]), a["residual_first"], bool(a.get("winograd")))

    def bound(y, xa, wa, ba, ra) -> None:
        if run is None or not y.flags.c_contiguous:
            np.copyto(y, _conv_reference(xa, wa, ba, ra, **attrs))
            return
        if ra is not None and np.may_share_memory(y, ra) and not (
                ra.ctypes.data == y.ctypes.data and ra.shape == y.shape and
                ra.flags.c_contiguous):   # (the residual's own buffer is fine)
            ra = ra.copy()
        run(np.ascontiguousarray(xa), _aligned(wa), None if ba is None else
            np.ascontiguousarray(ba), None if ra is None else np.ascontiguousarray(ra), y)
    bound.reads_around = True  # type: ignore[attr-defined]  # read by the executor
    # but y may take over the residual's buffer: a tile reads each residual value before it
    # stores there; offered where the plan is one pass over the input blocks anyway (else
    # partial sums would be stored there first, and the kernel takes one pass, slower)
    bound.inplace_inputs = (3,) if run is None or run.single_pass() else ()  # type: ignore
    bound.bound_attrs = True  # type: ignore[attr-defined]
    return bound


def _conv_into(out, x, wp, b, r, **attrs) -> None:
    xm, wm, bm, rm = (None if a is None else Meta(a.shape, D.float32) for a in (x, wp, b, r))
    _conv_bind(xm, wm, bm, rm, Meta(out.shape, D.float32), **attrs)(out, x, wp, b, r)


# the output never takes an input's buffer: the kernel reads windows of x around outputs it
# has written; ``bind`` gives the executor a form planned once for a node's metas
_conv_into.reads_around = True  # type: ignore[attr-defined]
_conv_into.bind = _conv_bind  # type: ignore[attr-defined]


def _conv_kernel(x, wp, b, r, **attrs):
    m = _conv_infer(*[None if a is None else Meta(a.shape, D.float32) for a in (x, wp, b, r)],
                    **attrs)
    out = np.empty(m.shape, np.float32)
    _conv_into(out, x, wp, b, r, **attrs)
    return out


def _conv_sbp(x, wp, b, r, **attrs):
    return [Signature((S(0), B, optional(b, B), optional(r, S(0))), (S(0),)),
            Signature((B, B, optional(b, B), optional(r, B)), (B,))]


def _conv_cost(ins, outs, weight_shape, activation, block, **attrs) -> cost.Cost:
    """The convolution's own work (the padded channels' products are not counted)."""
    y = outs[0]
    real = y.shape[0] * weight_shape[0] * y.shape[2] * y.shape[3]
    macs = real * math.prod(weight_shape[1:])
    extra = real * ((ins[2] is not None) + (activation is not None) + (ins[3] is not None))
    return cost.Cost(2 * macs + extra, *cost.io(ins, outs))


_CONV = defop("conv2d_nchwc", _conv_infer, _conv_kernel, grad=_no_grad, sbp=SbpRule(_conv_sbp),
              cost=_conv_cost, traits={"out_form"}, inplace_kernels={"cpu": _conv_into})


def conv2d_nchwc(x: Tensor, wp: Tensor, b: Tensor | None = None, r: Tensor | None = None, *,
                 stride, pads, dilation, groups: int, block: int, weight_shape,
                 plain_input: bool = False, activation: str | None = None,
                 bounds=(0.0, 0.0), residual_first: bool = False,
                 winograd: bool = False) -> Tensor:
    """``act(conv2d(x, W, b) [+ r]) [+ r]`` on blocked tensors (``conv_pointwise``'s
    epilogue): ``wp`` is W (of ``weight_shape``) packed by ``pack_conv_weight``, ``b`` the
    bias padded by ``pad_bias``; ``groups`` 1 or depthwise; with ``plain_input`` x is
    plain (N, C, H, W); with ``winograd`` (3x3, stride 1, W packed with ``winograd``) it
    runs as Winograd F(4x4, 3x3).

    >>> import numpy as np, tessera
    >>> geo = dict(stride=(1, 1), pads=((1, 1), (1, 1)), dilation=(1, 1))
    >>> w = np.ones((4, 3, 3, 3), np.float32)
    >>> wp = tessera.from_numpy(pack_conv_weight(w, groups=1, block=8, plain_input=True))
    >>> y = conv2d_nchwc(tessera.ones(1, 3, 5, 5), wp, groups=1, block=8,
    ...                  weight_shape=(4, 3, 3, 3), plain_input=True, **geo)
    >>> from_nchwc(y, 4)[0, 0, 2].tolist()
    [18.0, 27.0, 27.0, 27.0, 18.0]
    """
    return dispatch(_CONV, x, wp, b, r, stride=tuple(stride), pads=tuple(map(tuple, pads)),
                    dilation=tuple(dilation), groups=int(groups), block=int(block),
                    plain_input=bool(plain_input), activation=activation,
                    bounds=tuple(float(v) for v in bounds), residual_first=bool(residual_first),
                    weight_shape=tuple(int(d) for d in weight_shape), winograd=bool(winograd))


# ---- pool2d_nchwc --------------------------------------------------------------------------

def _pool_out(x_shape, kernel_size, stride, padding, ceil_mode) -> tuple:
    from tessera.ops.pool import pool_out_size
    return tuple(pool_out_size(x_shape[2 + i], kernel_size[i], stride[i], padding[i], 1,
                               ceil_mode) for i in range(2))


def _pool_infer(x, kind, kernel_size, stride, padding, ceil_mode, count_include_pad):
    op = "pool2d_nchwc"
    _float32(op, x)
    if kind not in ("max", "avg"):
        raise RuntimeError(f"{op}: kind must be 'max' or 'avg', got {kind!r}")
    if len(x.shape) != 5 or x.shape[4] not in (8, 16):
        raise RuntimeError(f"{op}: expected a blocked (N, C/B, H, W, B) input, got "
                           f"{list(x.shape)}")
    if any(len(v) != 2 for v in (kernel_size, stride, padding)) or \
            any(k < 1 for k in kernel_size) or any(s < 1 for s in stride) or \
            any(p < 0 or 2 * p > k for p, k in zip(padding, kernel_size)):
        raise RuntimeError(f"{op}: bad window kernel_size={list(kernel_size)}, "
                           f"stride={list(stride)}, padding={list(padding)}")
    oh, ow = _pool_out(x.shape, kernel_size, stride, padding, ceil_mode)
    if oh <= 0 or ow <= 0:
        raise RuntimeError(f"{op}: input {list(x.shape)} gives an empty output ({oh}x{ow})")
    return Meta((x.shape[0], x.shape[1], oh, ow, x.shape[4]), x.dtype)


def _pool_reference(x, kind, kernel_size, stride, padding, ceil_mode, count_include_pad):
    """The meaning: unblock (every channel of the blocks), pool, block."""
    from tessera.ops.pool import _avg_kernel, _max_pool_values_kernel
    n, cb, h, w, blk = x.shape
    xs = unblock_array(x, cb * blk)
    if kind == "max":
        y = _max_pool_values_kernel(xs, tuple(kernel_size), tuple(stride), tuple(padding),
                                    (1, 1), ceil_mode)
    else:
        y = _avg_kernel(xs, tuple(kernel_size), tuple(stride), tuple(padding), ceil_mode,
                        count_include_pad, None)
    return block_array(y, blk)


@functools.lru_cache(maxsize=256)
def _pool_runner(xshape, oshape, kind, kernel_size, stride, padding, count_include_pad):
    K = _kernels()
    if K is None:
        return None
    n, cb, h, w, blk = xshape
    return K.pool_bound((n, cb * blk, h, w), kernel_size, stride, padding, kind,
                        count_include_pad, blk, oshape=(n, cb * blk) + oshape[2:4])


def _pool_bind(x, out, **attrs):
    """``pool2d_nchwc``'s out-form for fixed metas (``fn(out, x)``, ``bound_attrs``)."""
    a = attrs
    run = _pool_runner(tuple(x.shape), tuple(out.shape), a["kind"], tuple(a["kernel_size"]),
                       tuple(a["stride"]), tuple(a["padding"]), bool(a["count_include_pad"]))

    def bound(y, xa) -> None:
        if run is None or not y.flags.c_contiguous:
            np.copyto(y, _pool_reference(xa, **attrs))
            return
        run(np.ascontiguousarray(xa), y)
    bound.reads_around = True  # type: ignore[attr-defined]
    bound.bound_attrs = True  # type: ignore[attr-defined]
    return bound


def _pool_into(out, x, **attrs) -> None:
    _pool_bind(Meta(x.shape, D.float32), Meta(out.shape, D.float32), **attrs)(out, x)


_pool_into.reads_around = True  # type: ignore[attr-defined]
_pool_into.bind = _pool_bind  # type: ignore[attr-defined]


def _pool_kernel(x, **attrs):
    out = np.empty(_pool_infer(Meta(x.shape, D.float32), **attrs).shape, np.float32)
    _pool_into(out, x, **attrs)
    return out


def _pool_cost(ins, outs, kernel_size, kind, **attrs) -> cost.Cost:
    n = cost.numel(outs[0])
    return cost.Cost(n * (math.prod(kernel_size) + (kind == "avg")), *cost.io(ins, outs))


_POOL = defop("pool2d_nchwc", _pool_infer, _pool_kernel, grad=_no_grad,
              sbp=SbpRule(_batch_sbp), cost=_pool_cost, traits={"out_form"},
              inplace_kernels={"cpu": _pool_into})


def pool2d_nchwc(x: Tensor, kind: str, kernel_size, stride, padding, ceil_mode: bool = False,
                 count_include_pad: bool = True) -> Tensor:
    """Max (``kind="max"``) or average (``"avg"``) pooling of a blocked tensor, as
    ``max_pool2d`` / ``avg_pool2d`` (no dilation, no divisor override) of its channels.

    >>> import tessera
    >>> y = pool2d_nchwc(to_nchwc(tessera.ones(1, 3, 4, 4), 8), "avg", (2, 2), (2, 2), (0, 0))
    >>> tuple(y.shape), y[0, 0, 0, 0, :4].tolist()
    ((1, 1, 2, 2, 8), [1.0, 1.0, 1.0, 0.0])
    """
    return dispatch(_POOL, x, kind=kind, kernel_size=tuple(kernel_size), stride=tuple(stride),
                    padding=tuple(padding), ceil_mode=bool(ceil_mode),
                    count_include_pad=bool(count_include_pad))
