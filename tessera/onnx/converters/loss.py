"""Losses, both directions: negative log-likelihood (NegativeLogLikelihoodLoss), binary
cross-entropy (exported as elementary ops) and ONNX's SoftmaxCrossEntropyLoss.

>>> from tessera.onnx.converters.registry import EXPORT, IMPORT
>>> "nll_loss" in EXPORT, "SoftmaxCrossEntropyLoss" in IMPORT
(True, True)
"""
from __future__ import annotations

import tessera.nn.functional as F
from tessera import _dtype as D
from tessera.onnx.converters.helpers import operand, reduce_over
from tessera.onnx.converters.registry import export_rule, import_rule


@export_rule("nll_loss")
def _nll_loss(b, n):
    dt = n.out_dtype()
    x, t = operand(b, n, 0, dt), operand(b, n, 1, D.int64)
    a = n.attrs
    one = n.rank(0) == 1
    if one:  # ONNX wants (N, C): a single sample gets a batch of one
        x = b.op("Unsqueeze", [x, b.ints([0])])
        t = b.op("Unsqueeze", [t, b.ints([0])])
    ins = [x, t] + ([operand(b, n, 2, dt)] if n.ins[2] is not None else [])
    red = a.get("reduction", "mean")
    out = b.op("NegativeLogLikelihoodLoss", ins, reduction=red,
               ignore_index=int(a.get("ignore_index", -100)))
    if one and red == "none":
        out = b.op("Squeeze", [out, b.ints([0])])
    return out


@import_rule("NegativeLogLikelihoodLoss")
def _import_nll(c, x, target, weight=None):
    red = c.attr("reduction", "mean")
    ii = c.attr("ignore_index", None)
    kw = dict(reduction=red)
    if ii is not None:
        kw["ignore_index"] = ii
    return F.nll_loss(x, target.long(), weight=weight, **kw)


@export_rule("binary_cross_entropy")
def _bce(b, n):
    dt = n.out_dtype()
    x, t = operand(b, n, 0, dt), operand(b, n, 1, dt)
    lo = b.const(-100, dt)
    one = b.const(1, dt)
    log_x = b.op("Max", [b.op("Log", [x]), lo])
    log_1x = b.op("Max", [b.op("Log", [b.op("Sub", [one, x])]), lo])
    loss = b.op("Sub", [b.op("Mul", [b.op("Sub", [t, one]), log_1x]), b.op("Mul", [t, log_x])])
    if n.ins[2] is not None:
        loss = b.op("Mul", [loss, operand(b, n, 2, dt)])
    red = n.attrs.get("reduction", "mean")
    if red == "none":
        return loss
    return reduce_over(b, "ReduceSum" if red == "sum" else "ReduceMean", loss, None, False)


@import_rule("SoftmaxCrossEntropyLoss")
def _import_sce(c, x, target, weight=None):
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
