"""Decompose row-wise ops (softmax, log_softmax, layer_norm and their backwards) into
reductions and elementwise ops (each op's ``decompose`` rule, declared in its defop), for the
fuse pass to regroup into one reduce-then-map kernel each. Only when code is generated:
the NumPy executor runs the undecomposed ops' own kernels faster.

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%x: float32[2, 3]) {
...   %0: float32[2, 3] = softmax(%x) {dim=-1}
...   return (%0)
... }''')
>>> run(g, PassContext(codegen=True)); [n.op.name for n in g.nodes]
True
['amax', 'sub', 'exp', 'sum', 'div']
"""
from __future__ import annotations

from tessera.graph.ir import Graph, Node, Value
from tessera.graph.passes import PassContext  # noqa: F401  (the doctest's)
from tessera.ops.registry import REGISTRY, Meta

__all__ = ["run"]

_REDUCTIONS = {"sum": {"dtype": None}, "mean": {"dtype": None}, "amax": {}, "amin": {}}


class _Builder:
    """``b.<op>(*inputs, **attrs)`` appends a node (types from the op's infer rule) to
    ``nodes`` and returns its output; reductions take ``(x, dims, keepdim=True)``."""

    nodes: list[Node]

    def __init__(self, g: Graph, name: str):
        self.g, self.name, self.nodes = g, name, []

    def __getattr__(self, op: str):
        def emit(*inputs, **attrs):
            if op in _REDUCTIONS:
                x, dims = inputs
                attrs = {"dim": dims, "keepdim": attrs.get("keepdim", True),
                         **_REDUCTIONS[op]}
                inputs = (x,)
            opdef = REGISTRY[op]
            metas = [Meta(v.shape, v.dtype) if isinstance(v, Value) else v for v in inputs]
            m = opdef.infer(*metas, **attrs)
            before = len(self.g.nodes)
            (out,) = self.g.add_node(opdef, inputs, attrs, [(tuple(m.shape), m.dtype)],
                                     self.name)
            self.nodes.append(self.g.nodes.pop(before))
            return out
        return emit


def run(g: Graph, ctx) -> bool:
    if ctx is None or not getattr(ctx, "codegen", False):
        return False
    changed = False
    new_nodes = []
    for n in list(g.nodes):
        rule = n.op.decompose
        if rule is None or any(v.dtype.name not in ("float32", "float64")
                               for v in n.tensor_inputs + n.outputs):
            new_nodes.append(n)
            continue
        b = _Builder(g, n.name)
        outs = rule(b, *n.inputs, **n.attrs)
        if outs is None:   # a case the rule leaves to the op's own kernel
            new_nodes.append(n)
            continue
        outs = outs if isinstance(outs, tuple) else (outs,)
        new_nodes += b.nodes
        for old, new in zip(n.outputs, outs):
            g.replace_uses(old, new)
            for m in new_nodes:  # nodes already placed read the old value too
                m.inputs = [new if v is old else v for v in m.inputs]
        changed = True
    g.nodes = new_nodes
    return changed
