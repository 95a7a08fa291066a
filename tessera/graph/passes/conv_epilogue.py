"""Convolution epilogues: a 2-d convolution followed by an activation (relu, hardtanh and
so relu6, clamp by numbers) and a residual add, in either order, each the single reader
of the value before it,

    conv(x, W, b) -> [add r] -> act -> [add r]        (one add at most)

becomes one ``conv_pointwise`` node, whose kernel applies the activation and adds the
residual to each block of the output while it is in cache (``tessera.ops.conv``): the
elementwise pass over the whole output that the code generator would otherwise make of
them is gone. Only where the convolution runs on the drivers that fuse it (ungrouped,
2-d, the im2col or Winograd drivers of ``tessera.kernels``); after ``bnfold``, so that a
folded batch norm's shift is the bias. The replaced nodes are left for DCE.

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%x: float32[1, 32, 16, 16], %r: float32[1, 32, 16, 16]) {
...   var %w: float32[32, 32, 3, 3]
...   %0: float32[1, 32, 16, 16] = conv(%x, %w, None) {stride=(1, 1), pads=((1, 1), (1, 1)), \
dilation=(1, 1), groups=1}
...   %1: float32[1, 32, 16, 16] = add(%0, %r) {alpha=1}
...   %2: float32[1, 32, 16, 16] = relu(%1)
...   return (%2)
... }''')
>>> if run(g, None):    # where the C drivers run this convolution
...     n = g.outputs[0].producer
...     print(n.op.name, n.attrs["activation"], n.attrs["residual_first"])
... else:
...     print("conv_pointwise relu True")
conv_pointwise relu True
"""
from __future__ import annotations

import math

from tessera.graph.ir import Graph, Node, Value
from tessera.ops.conv import epilogue_fusable
from tessera.ops.registry import REGISTRY, Meta

__all__ = ["run"]


def _activation(n: Node):
    """(activation, bounds) of an activation node the epilogue applies, or None."""
    name = n.op.name
    if name == "relu":
        return "relu", (0.0, 0.0)
    if name == "hardtanh":
        return "clamp", (float(n.attrs.get("min_val", -1.0)), float(n.attrs.get("max_val", 1.0)))
    if name == "clamp":
        _, lo, hi = n.inputs
        if isinstance(lo, Value) or isinstance(hi, Value) or isinstance(lo, bool) or \
                isinstance(hi, bool):
            return None
        lo = -math.inf if lo is None else float(lo)
        hi = math.inf if hi is None else float(hi)
        return ("clamp", (lo, hi)) if lo <= hi else None
    return None


def _residual(n: Node, v: Value):
    """The other operand of ``add(v, r)`` / ``add(r, v)`` when it is a plain sum with a
    value of ``v``'s shape and dtype, else None."""
    if n.op.name != "add" or n.attrs.get("alpha", 1) != 1 or len(n.inputs) != 2:
        return None
    a, b = n.inputs
    r = b if a is v else a if b is v else None
    if not isinstance(r, Value) or r is v or r.shape != v.shape or r.dtype is not v.dtype:
        return None
    return r


def _fuse(conv: Node, users: dict, roots: set):
    """(node inputs, attrs, the value it replaces) for the chain after ``conv``, or None."""
    def reader(v: Value) -> Node | None:
        us = users.get(v, [])
        return us[0] if len(us) == 1 and id(v) not in roots else None

    tail = conv.outputs[0]
    act, bounds, r, first = None, (0.0, 0.0), None, False
    n = reader(tail)
    if n is not None and (r := _residual(n, tail)) is not None:
        first, tail = True, n.outputs[0]
        n = reader(tail)
    if n is not None and (found := _activation(n)) is not None \
            and n.outputs[0].dtype is tail.dtype:
        (act, bounds), tail = found, n.outputs[0]
        n = reader(tail)
        if r is None and n is not None and (r := _residual(n, tail)) is not None:
            tail = n.outputs[0]
    if tail is conv.outputs[0]:
        return None
    x, w, b = conv.inputs
    attrs = dict(conv.attrs, activation=act, bounds=bounds, residual_first=first)
    return [x, w, b, r], attrs, tail


def run(g: Graph, ctx) -> bool:
    changed = False
    for conv in [n for n in g.nodes if n.op.name == "conv"]:
        x, w = conv.inputs[:2]
        a = conv.attrs
        if not (isinstance(x, Value) and isinstance(w, Value) and epilogue_fusable(
                x.shape, w.shape, a["stride"], a["pads"], a["dilation"], a["groups"],
                x.dtype, w.dtype)):
            continue
        found = _fuse(conv, g.users(), {id(v) for v in g.live_roots()})
        if found is None:
            continue
        inputs, attrs, tail = found
        op = REGISTRY["conv_pointwise"]
        meta = op.infer(*[Meta(v.shape, v.dtype) if isinstance(v, Value) else v
                          for v in inputs], **attrs)
        node = Node(op, inputs, attrs, [], conv.name)
        node.outputs = [Value(g.fresh(), meta.shape, meta.dtype, node, 0)]
        g.nodes.insert(g.nodes.index(tail.producer), node)
        g.replace_uses(tail, node.outputs[0])
        changed = True
    return changed
