"""Normalisation, both directions: batch norm (BatchNormalization, or batch statistics in
training mode), instance norm, layer norm (LayerNormalization from opset 17), group and RMS
norm, and ONNX's LpNormalization.

>>> from tessera.onnx.converters.registry import EXPORT, IMPORT
>>> sorted(EXPORT["layer_norm"]), sorted(IMPORT["LayerNormalization"])
([13, 17], [17])
"""
from __future__ import annotations

import numpy as np

import tessera.nn.functional as F
from tessera import _dtype as D
from tessera.onnx.converters.helpers import operand, reduce_over
from tessera.onnx.converters.registry import export_rule, import_rule
from tessera.onnx.validate import check_layer_norm
from tessera.ops.creation import zeros_like
from tessera.ops.reduce import norm
from tessera.ops.ternary import where
from tessera.ops.unary import sqrt


def _channel(b, t, rank):
    """A per-channel (C,) tensor shaped to broadcast over (N, C, ...)."""
    return b.op("Reshape", [t, b.ints([-1] + [1] * (rank - 2))])


@export_rule("batch_norm")
def _batch_norm(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    c = n.shape(0)[1]
    w = operand(b, n, 1, dt) if n.ins[1] is not None else b.const(np.ones(c, dt.np))
    bias = operand(b, n, 2, dt) if n.ins[2] is not None else b.const(np.zeros(c, dt.np))
    eps = float(n.attrs["eps"])
    if not n.attrs["training"]:
        rm, rv = operand(b, n, 3, dt), operand(b, n, 4, dt)
        return b.op("BatchNormalization", [x, w, bias, rm, rv], epsilon=eps), rm, rv
    # batch statistics (instance norm, or a batch norm without running stats)
    axes = [0] + list(range(2, n.rank(0)))
    mean = reduce_over(b, "ReduceMean", x, axes, True)
    d = b.op("Sub", [x, mean])
    var = reduce_over(b, "ReduceMean", b.op("Mul", [d, d]), axes, True)
    y = b.op("Div", [d, b.op("Sqrt", [b.op("Add", [var, b.const(eps, dt)])])])
    r = n.rank(0)
    flat = b.ints([-1])
    return (b.op("Add", [b.op("Mul", [y, _channel(b, w, r)]), _channel(b, bias, r)]),
            b.op("Reshape", [mean, flat]), b.op("Reshape", [var, flat]))


@import_rule("BatchNormalization", since=9)
def _import_batch_norm(c, x, scale, bias, mean, var):
    eps = c.attr("epsilon", 1e-5)
    if c.attr("training_mode", 0):  # batch statistics; running stats updated by momentum
        m = c.attr("momentum", 0.9)
        dims = (0,) + tuple(range(2, x.dim()))
        bmean = x.mean(dim=dims)
        bvar = ((x - bmean.reshape([1, -1] + [1] * (x.dim() - 2))) ** 2).mean(dim=dims)
        y = F.batch_norm(x, None, None, scale, bias, training=True, eps=eps)
        return y, mean * m + bmean * (1 - m), var * m + bvar * (1 - m)
    return F.batch_norm(x, mean, var, scale, bias, training=False, eps=eps)


@import_rule("InstanceNormalization")
def _import_instance_norm(c, x, scale, bias):
    return F.instance_norm(x, weight=scale, bias=bias, eps=c.attr("epsilon", 1e-5))


def _normalize(b, x, dt, axes, eps):
    mean = reduce_over(b, "ReduceMean", x, axes, True)
    d = b.op("Sub", [x, mean])
    var = reduce_over(b, "ReduceMean", b.op("Mul", [d, d]), axes, True)
    return b.op("Div", [d, b.op("Sqrt", [b.op("Add", [var, b.const(eps, dt)])])])


@export_rule("layer_norm")
def _layer_norm(b, n):
    dt = n.out_dtype()
    k = len(n.attrs["normalized_shape"])
    rank = n.rank(0)
    y = _normalize(b, operand(b, n, 0, dt), dt, list(range(rank - k, rank)), n.attrs["eps"])
    if n.ins[1] is not None:
        y = b.op("Mul", [y, operand(b, n, 1, dt)])
    if n.ins[2] is not None:
        y = b.op("Add", [y, operand(b, n, 2, dt)])
    return y


@export_rule("layer_norm", opset=17)
def _layer_norm17(b, n):
    dt = n.out_dtype()
    ns = tuple(n.attrs["normalized_shape"])
    w = operand(b, n, 1, dt) if n.ins[1] is not None else b.const(np.ones(ns, dt.np))
    ins = [operand(b, n, 0, dt), w] + ([operand(b, n, 2, dt)] if n.ins[2] is not None else [])
    return b.op("LayerNormalization", ins, axis=-len(ns), epsilon=float(n.attrs["eps"]))


@import_rule("LayerNormalization", since=17)
def _import_layer_norm(c, x, scale, bias=None):
    axis = c.axis("axis", x.dim(), -1)
    eps = c.attr("epsilon", 1e-5)
    if c.attr("stash_type", 1) != 1:
        raise NotImplementedError("stash_type other than float32")
    dims = tuple(range(axis, x.dim()))
    check_layer_norm(c.where, tuple(x.shape), tuple(scale.shape),
                     None if bias is None else tuple(bias.shape), axis)
    # the scale and bias broadcast to X (checked): within its normalized dims, layer_norm's
    # own affine weights; across its leading dims too, the product and sum below
    inner = x.dim() - axis
    if len([o for o in c.node.output if o]) == 1 and x.dtype is scale.dtype and \
            scale.dim() <= inner and (bias is None or bias.dim() <= inner):
        return F.layer_norm(x, tuple(x.shape[axis:]), scale.expand(x.shape[axis:]),
                            None if bias is None else bias.expand(x.shape[axis:]), eps)
    xf = x.float() if x.dtype is not D.float64 else x
    mean = xf.mean(dim=dims, keepdim=True)
    d = xf - mean
    var = (d * d).mean(dim=dims, keepdim=True)
    rstd = 1 / sqrt(var + eps)
    y = (d * rstd).to(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return y, mean, rstd


@export_rule("group_norm")
def _group_norm(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    g = n.attrs["num_groups"]
    shape = n.shape(0)
    grouped = b.op("Reshape", [x, b.ints([shape[0], g, -1])])
    y = _normalize(b, grouped, dt, [2], n.attrs["eps"])
    y = b.op("Reshape", [y, b.ints(shape)])
    r = n.rank(0)
    if n.ins[1] is not None:
        y = b.op("Mul", [y, _channel(b, operand(b, n, 1, dt), r)])
    if n.ins[2] is not None:
        y = b.op("Add", [y, _channel(b, operand(b, n, 2, dt), r)])
    return y


@export_rule("rms_norm")
def _rms_norm(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    k = len(n.attrs["normalized_shape"])
    rank = n.rank(0)
    eps = n.attrs.get("eps")
    if eps is None:
        eps = float(np.finfo(dt.np).eps)
    ms = reduce_over(b, "ReduceMean", b.op("Mul", [x, x]), list(range(rank - k, rank)), True)
    y = b.op("Div", [x, b.op("Sqrt", [b.op("Add", [ms, b.const(eps, dt)])])])
    if n.ins[1] is not None:
        y = b.op("Mul", [y, operand(b, n, 1, dt)])
    return y


@import_rule("LpNormalization")
def _import_lp_norm(c, x):
    p, axis = c.attr("p", 2), c.axis("axis", max(x.dim(), 1), -1)
    n = norm(x, p=p, dim=axis, keepdim=True)
    return where(n == 0, zeros_like(x), x / n)
