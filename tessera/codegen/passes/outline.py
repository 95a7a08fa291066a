"""Outline each fusion region (``notes["region"]`` from the fuse pass) into one ``fused``
node whose ``body`` is the region as a graph; code generation compiles each body to one C
loop. An elementwise node outside any region is outlined on its own when its NumPy kernel
takes several passes over memory (``sigmoid``, ``gelu``, ``lerp``...); single-ufunc ops
(trait ``single_pass``: ``add``, ``exp``...) stay as they are, NumPy runs them at memory
speed already.

A region is outlined only when the code generator can lower it (float32/float64/bool values,
every op with a ``to_c`` rule); otherwise its nodes stay and run one by one.

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%x: float32[8]) {
...   %0: float32[8] = exp(%x) [region=0]
...   %1: float32[8] = neg(%0) [region=0]
...   return (%1)
... }''')
>>> run(g, None); [n.op.name for n in g.nodes]
True
['fused']
"""
from __future__ import annotations

from tessera.codegen.loops import supported
from tessera.graph.ir import Graph, Node, Value
from tessera.graph.passes.fuse import is_elementwise, regions
from tessera.ops.registry import REGISTRY

__all__ = ["run"]


def _body(nodes: list[Node]) -> tuple[Graph, list[Value], Value]:
    """The region as a graph of its own; the outside values it reads; its result."""
    inside = {id(v) for n in nodes for v in n.outputs}
    users_inside = {id(v) for n in nodes for v in n.inputs if isinstance(v, Value)}
    ext: list[Value]
    body, ext, remap = Graph(), [], {}
    for n in nodes:
        for v in n.inputs:
            if isinstance(v, Value) and id(v) not in inside and id(v) not in remap:
                remap[id(v)] = body.add_input(f"a{len(ext)}", v.shape, v.dtype)
                ext.append(v)
    result = [v for n in nodes for v in n.outputs if id(v) not in users_inside]
    assert len(result) == 1, "a fusion region has one result"
    for n in nodes:
        args = [remap[id(v)] if isinstance(v, Value) else v for v in n.inputs]
        outs = body.add_node(n.op, args, n.attrs, [(v.shape, v.dtype) for v in n.outputs])
        for v, new in zip(n.outputs, outs):
            remap[id(v)] = new
    body.outputs = [remap[id(result[0])]]
    return body, ext, result[0]


def run(g: Graph, ctx) -> bool:
    if ctx is not None and not getattr(ctx, "codegen", True):
        return False  # the NumPy executor runs regions node by node, in one buffer
    groups = list(regions(g).values())
    grouped = {id(n) for grp in groups for n in grp}
    groups += [[n] for n in g.nodes if id(n) not in grouped and is_elementwise(n)
               and "single_pass" not in n.op.traits
               and len(n.outputs) == 1]
    fused = REGISTRY["fused"]
    replaced: dict[int, Node | None] = {}   # id(node) -> its fused node (or None: removed)
    for nodes in groups:
        body, ext, result = _body(nodes)
        if supported(body) is not None:
            continue
        last = result.producer
        node = Node(fused, list(ext), {"body": str(body)}, [result], last.name)
        result.producer, result.index = node, 0
        for n in nodes:
            replaced[id(n)] = None
        replaced[id(last)] = node
    if not replaced:
        return False
    g.nodes = [replaced.get(id(n), n) for n in g.nodes if replaced.get(id(n), n) is not None]
    return True
