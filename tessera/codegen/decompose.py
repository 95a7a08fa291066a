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


def _dims(x, dim) -> tuple[int, ...]:
    return (dim % len(x.shape),) if x.shape else ()


def _softmax(b, x, dim):
    d = _dims(x, dim)
    e = b.exp(b.sub(x, b.amax(x, d)))
    return b.div(e, b.sum(e, d))


def _log_softmax(b, x, dim):
    d = _dims(x, dim)
    z = b.sub(x, b.amax(x, d))
    return b.sub(z, b.log(b.sum(b.exp(z), d)))


def _softmax_backward(b, g, y, dim):
    return b.mul(b.sub(g, b.sum(b.mul(g, y), _dims(y, dim))), y)


def _log_softmax_backward(b, g, y, dim):
    return b.sub(g, b.mul(b.exp(y), b.sum(g, _dims(y, dim))))


RULES = {
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "softmax_backward": _softmax_backward,
    "log_softmax_backward": _log_softmax_backward,
}
