"""Dead-code elimination: drop nodes none of whose outputs reach an output or an assign,
and variables nothing reads.

Random ops are kept only when used: an unused dropout mask costs nothing to drop, because
nothing observes it (the generator state advancing is the one visible difference).

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%x: float32[2]) {
...   %0: float32[2] = exp(%x)
...   %1: float32[2] = neg(%x)
...   return (%1)
... }''')
>>> run(g, None); [n.op.name for n in g.nodes]
True
['neg']
"""
from __future__ import annotations

from tessera.graph.ir import Graph, Value


def run(g: Graph, ctx) -> bool:
    live = {id(v) for v in g.live_roots()}
    keep = []
    for n in reversed(g.nodes):
        if any(id(v) in live for v in n.outputs):
            keep.append(n)
            live.update(id(v) for v in n.inputs if isinstance(v, Value))
    keep.reverse()
    changed = len(keep) != len(g.nodes)
    g.nodes = keep
    assigned = {name for name, _ in g.assigns}
    dead_vars = [k for k, v in g.variables.items() if id(v) not in live and k not in assigned]
    for k in dead_vars:
        del g.variables[k]
    return changed or bool(dead_vars)
