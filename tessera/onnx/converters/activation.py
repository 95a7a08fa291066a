"""Activation functions, both directions: ReLU and its relatives, GELU, ELU/SELU/CELU,
softplus, shrinkage, hard sigmoid/swish, PReLU, and softmax over one axis.

ONNX gained several of them late (HardSwish 14, Mish 18, Gelu 20): before those opsets the
export spells them out in elementary ops.

>>> from tessera.onnx.converters.registry import EXPORT
>>> sorted(EXPORT["mish"]), sorted(EXPORT["hardswish"])
([13, 18], [14])
"""
from __future__ import annotations

import math

import numpy as np

import tessera.nn.functional as F
from tessera.onnx.converters.helpers import norm_axis, operand, static_prod, unary_composite
from tessera.onnx.converters.registry import export_rule, import_rule, simple
from tessera.ops.creation import zeros_like
from tessera.ops.reduce import argmax
from tessera.ops.ternary import clamp, where
from tessera.ops.unary import exp

simple("hardswish", "HardSwish", opset=14)
simple("mish", "Mish", opset=18)
simple("gelu", "Gelu", opset=20, attrs={"approximate": ("approximate", "none")})
simple("leaky_relu", "LeakyRelu", attrs={"negative_slope": ("alpha", 0.01)})

_UNARY_COMPOSITE = {
    "silu": lambda b, x, dt, a: b.op("Mul", [x, b.op("Sigmoid", [x])]),
    "log_sigmoid": lambda b, x, dt, a: b.op("Neg", [b.op("Softplus", [b.op("Neg", [x])])]),
    "hardsigmoid": lambda b, x, dt, a: b.op("HardSigmoid", [x], alpha=1 / 6, beta=0.5),
    "hardtanh": lambda b, x, dt, a: b.op("Clip", [x, b.const(a["min_val"], dt),
                                                  b.const(a["max_val"], dt)]),
    "softshrink": lambda b, x, dt, a: b.op("Shrink", [x], bias=float(a["lambd"]),
                                           lambd=float(a["lambd"])),
    "mish": lambda b, x, dt, a: b.op("Mul", [x, b.op("Tanh", [b.op("Softplus", [x])])]),
}
for _name, _fn in _UNARY_COMPOSITE.items():
    export_rule(_name)(unary_composite(_fn))


@export_rule("relu")
def _relu(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    if dt.is_floating_point:
        return b.op("Relu", [x])
    return b.op("Max", [x, b.const(0, dt)])


@import_rule("Relu")
def _import_relu(c, x):
    return F.relu(x) if x.dtype.is_floating_point else clamp(x, min=0)


@export_rule("gelu")
def _gelu(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    half = b.op("Mul", [x, b.const(0.5, dt)])
    if n.attrs.get("approximate", "none") == "tanh":
        x3 = b.op("Mul", [b.op("Mul", [x, x]), x])
        inner = b.op("Mul", [b.op("Add", [x, b.op("Mul", [x3, b.const(0.044715, dt)])]),
                             b.const(math.sqrt(2 / math.pi), dt)])
        return b.op("Mul", [half, b.op("Add", [b.op("Tanh", [inner]), b.const(1, dt)])])
    erf = b.op("Erf", [b.op("Mul", [x, b.const(1 / math.sqrt(2), dt)])])
    return b.op("Mul", [half, b.op("Add", [erf, b.const(1, dt)])])


@export_rule("elu")
def _elu(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    alpha, scale, iscale = (float(n.attrs[k]) for k in ("alpha", "scale", "input_scale"))
    if scale == 1 and iscale == 1:
        return b.op("Elu", [x], alpha=alpha)
    if iscale == 1 and abs(alpha - 1.6732632423543772) < 1e-6 \
            and abs(scale - 1.0507009873554805) < 1e-6:
        return b.op("Selu", [x], alpha=alpha, gamma=scale)
    neg = b.op("Mul", [b.op("Sub", [b.op("Exp", [b.op("Mul", [x, b.const(iscale, dt)])]),
                                    b.const(1, dt)]), b.const(alpha * scale, dt)])
    pos = b.op("Mul", [x, b.const(scale, dt)])
    return b.op("Where", [b.op("Greater", [x, b.const(0, dt)]), pos, neg])


@import_rule("Elu")
def _import_elu(c, x):
    return F.elu(x, alpha=c.attr("alpha", 1.0))


@import_rule("Selu")
def _import_selu(c, x):
    a, g = c.attr("alpha", 1.67326319217681884765625), c.attr("gamma", 1.05070102214813232421875)
    return g * where(x > 0, x, a * (exp(x) - 1))


@import_rule("Celu")
def _import_celu(c, x):
    return F.celu(x, alpha=c.attr("alpha", 1.0))


@export_rule("softplus")
def _softplus(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    beta, th = float(n.attrs["beta"]), float(n.attrs["threshold"])
    bx = b.op("Mul", [x, b.const(beta, dt)]) if beta != 1 else x
    sp = b.op("Softplus", [bx])
    if beta != 1:
        sp = b.op("Div", [sp, b.const(beta, dt)])
    return b.op("Where", [b.op("Greater", [bx, b.const(th, dt)]), x, sp])


@import_rule("Softplus")
def _import_softplus(c, x):
    return F.softplus(x, threshold=1e30)


@import_rule("Softsign")
def _import_softsign(c, x):
    return F.softsign(x)


@import_rule("HardSigmoid")
def _import_hardsigmoid(c, x):
    a, b = c.attr("alpha", 0.2), c.attr("beta", 0.5)
    return clamp(x * a + b, 0, 1)


@export_rule("threshold")
def _threshold(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    return b.op("Where", [b.op("Greater", [x, b.const(n.attrs["threshold"], dt)]), x,
                          b.const(n.attrs["value"], dt)])


@import_rule("ThresholdedRelu")
def _import_thresholded_relu(c, x):
    return where(x > c.attr("alpha", 1.0), x, zeros_like(x))


@export_rule("hardshrink")
def _hardshrink(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    keep = b.op("Greater", [b.op("Abs", [x]), b.const(n.attrs["lambd"], dt)])
    return b.op("Where", [keep, x, b.const(0, dt)])


@import_rule("Shrink")
def _import_shrink(c, x):
    lambd, bias = c.attr("lambd", 0.5), c.attr("bias", 0.0)
    zero = zeros_like(x)
    out = where(x < -lambd, x + bias, where(x > lambd, x - bias, zero))
    return out.to(x.dtype)


@export_rule("logit")
def _logit(b, n):
    dt = n.out_dtype()
    x = operand(b, n, 0, dt)
    eps = n.attrs.get("eps")
    if eps is not None:
        x = b.op("Clip", [x, b.const(eps, dt), b.const(1 - eps, dt)])
    return b.op("Log", [b.op("Div", [x, b.op("Sub", [b.const(1, dt), x])])])


@export_rule("prelu")
def _prelu(b, n):
    dt = n.out_dtype()
    x, w = operand(b, n, 0, dt), operand(b, n, 1, dt)
    if n.rank(0) >= 2 and static_prod(n.shape(1)) > 1:
        w = b.op("Reshape", [w, b.ints([-1] + [1] * (n.rank(0) - 2))])
    return b.op("PRelu", [x, w])


@import_rule("PRelu")
def _import_prelu(c, x, slope):
    return where(x < 0, x * slope, x)


# ---- softmax over one axis -------------------------------------------------------------

def _softmax(op: str, onnx_op: str, fn) -> None:
    """``op`` is ``onnx_op`` from opset 13; before it, ONNX's softmax ran over the
    flattened dims from ``axis`` on."""
    @export_rule(op)
    def export(b, n):
        dt = n.out_dtype()
        x = operand(b, n, 0, dt)
        if n.rank(0) == 0:
            return b.op("Identity", [x]) if onnx_op == "Softmax" else b.op("Sub", [x, x])
        return b.op(onnx_op, [x], axis=norm_axis(n.attrs["dim"], n.rank(0)))

    @import_rule(onnx_op, since=13)
    def import13(c, x):
        return fn(x, dim=c.axis("axis", max(x.dim(), 1), -1))

    @import_rule(onnx_op)
    def import1(c, x):
        axis = c.axis("axis", max(x.dim(), 1), 1)
        shape = x.shape
        flat = x.reshape(int(np.prod(shape[:axis], dtype=np.int64)), -1)
        return fn(flat, dim=1).reshape(shape)


_softmax("softmax", "Softmax", F.softmax)
_softmax("log_softmax", "LogSoftmax", F.log_softmax)


@import_rule("Hardmax", since=13)
def _import_hardmax(c, x):
    axis = c.axis("axis", max(x.dim(), 1), -1)
    i = argmax(x, dim=axis, keepdim=True)
    return zeros_like(x).scatter(axis, i, 1.0)
