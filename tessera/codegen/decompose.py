"""Decompositions: row-wise ops written as reductions and elementwise ops, so that fusion
turns each into one reduce-then-map loop nest (per row: reduce, reduce again, map).

A rule is ``rule(b, *inputs, **attrs) -> outputs``; ``b`` emits nodes (``b.sum(x, dims)``,
``b.exp(x)``...) into the graph being rewritten. Each rule computes what the op's NumPy
kernel computes, in the same order of operations.

>>> import tessera
>>> from tessera.graph.trace import trace
>>> from tessera.graph.passes import run_pipeline
>>> g, _ = trace(lambda x: tessera.softmax(x, -1), tessera.randn(4, 8))
>>> _ = run_pipeline(g, ["decompose"]); [n.op.name for n in g.nodes]
['amax', 'sub', 'exp', 'sum', 'div']
"""
from __future__ import annotations

__all__ = ["RULES"]


def _row_stats(b, x, d, eps):
    """(x - mean, 1 / sqrt(var + eps)) over dims ``d``, as the NumPy kernel computes them."""
    xc = b.sub(x, b.mean(x, d))
    var = b.mean(b.mul(xc, xc), d)
    return xc, b.reciprocal(b.sqrt(b.add(var, eps)))


def _layer_norm(b, x, w, bias, normalized_shape, eps):
    nd = len(x.shape)
    d = tuple(range(nd - len(normalized_shape), nd))
    xc, rstd = _row_stats(b, x, d, eps)
    y = b.mul(xc, rstd)
    if w is not None:
        y = b.mul(y, w)
    if bias is not None:
        y = b.add(y, bias)
    return y


def _layer_norm_backward(b, g, x, w, normalized_shape, eps):
    nd = len(x.shape)
    k = len(normalized_shape)
    d, lead = tuple(range(nd - k, nd)), tuple(range(nd - k))
    xc, rstd = _row_stats(b, x, d, eps)
    xhat = b.mul(xc, rstd)
    gw = g if w is None else b.mul(g, w)
    c1 = b.mean(gw, d)
    c2 = b.mean(b.mul(gw, xhat), d)
    dx = b.mul(b.sub(b.sub(gw, c1), b.mul(xhat, c2)), rstd)
    gx = b.mul(g, xhat)
    if not lead:  # one row: nothing to sum over
        return dx, gx, g
    return dx, b.sum(gx, lead, keepdim=False), b.sum(g, lead, keepdim=False)


RULES = {
    "layer_norm": _layer_norm,
    "layer_norm_backward": _layer_norm_backward,
}
