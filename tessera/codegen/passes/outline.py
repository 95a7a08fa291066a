"""Outline each fusion region (``notes["region"]`` from the fuse pass) into one ``fused``
node whose ``body`` is the region as a graph; code generation compiles each body to one C
loop. The fused node has an output for every value of its region that is read outside it
(``tessera.graph.fused``); it stands where the region's root stood (its last node, or the
last before its side sums), before every outside reader of its values (the fuse pass keeps
that so).

An elementwise node outside any region is outlined on its own when its NumPy kernel takes
several passes over memory (``sigmoid``, ``gelu``, ``lerp``...); single-ufunc ops (trait
``single_pass``: ``add``, ``exp``...) stay as they are, NumPy runs them at memory speed
already.

A region is outlined only when the code generator can lower it (float32/float64/bool values,
every op with a ``to_c`` rule); otherwise its nodes stay and run one by one.

A region input that is a broadcast view (``expand``: a loss gradient's scalar, a row's
statistic) comes in as the value it broadcasts, and the body expands it again: the kernel
then reads a C-contiguous array through index arithmetic with stride 0 along the broadcast
dims, instead of taking its strided variant for every operand (a layer norm backward behind
a mean loss ran 1.9x slower so).

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


def _body(nodes: list[Node], used_outside: set, broadcasts: bool = False
          ) -> tuple[Graph, list[Value], list[Value]]:
    """The region as a graph of its own; the outside values it reads; the values it
    produces for the outside: its result (the one value no node of the region reads)
    first, then, in program order, the others that ``used_outside`` holds (by id).
    ``broadcasts``: an outside ``expand`` is read as its source, expanded in the body."""
    inside = {id(v) for n in nodes for v in n.outputs}
    ext: list[Value]
    body, ext, remap = Graph(), [], {}

    def outside(v: Value) -> Value:
        if id(v) not in remap:
            if broadcasts and _is_broadcast(v) and id(v.producer.inputs[0]) not in inside:
                src = outside(v.producer.inputs[0])
                remap[id(v)] = body.add_node(v.producer.op, [src], v.producer.attrs,
                                             [(v.shape, v.dtype)])[0]
            else:
                remap[id(v)] = body.add_input(f"a{len(ext)}", v.shape, v.dtype)
                ext.append(v)
        return remap[id(v)]
    for n in nodes:
        for v in n.inputs:
            if isinstance(v, Value) and id(v) not in inside:
                outside(v)
    # the result: the one value no node of the region reads, its side sums (note ``side``,
    # from the fuse pass) left out
    host = [n for n in nodes if not n.notes.get("side")]
    read = {id(v) for n in host for v in n.inputs if isinstance(v, Value)}
    result = [v for n in host for v in n.outputs if id(v) not in read]
    assert len(result) == 1, "a fusion region has one result"
    result += [v for n in nodes for v in n.outputs
               if id(v) in used_outside and v is not result[0]]
    for n in nodes:
        args = [remap[id(v)] if isinstance(v, Value) else v for v in n.inputs]
        outs = body.add_node(n.op, args, n.attrs, [(v.shape, v.dtype) for v in n.outputs])
        for v, new in zip(n.outputs, outs):
            remap[id(v)] = new
    body.outputs = [remap[id(v)] for v in result]
    return body, ext, result


def _is_broadcast(v: Value) -> bool:
    """Whether ``v`` is an ``expand`` of a value of its dtype (size-1 and missing leading
    dims broadcast: what the loops' stride-0 indexing does for any input)."""
    n = v.producer
    return n is not None and n.op.name == "expand" and isinstance(n.inputs[0], Value) and \
        n.inputs[0].dtype is v.dtype


def _used_outside(g: Graph, groups: list) -> set:
    """id(value) of the values a node outside their region reads, or the step returns."""
    region = {id(n): k for k, grp in enumerate(groups) for n in grp}
    out = {id(v) for v in g.live_roots()}
    for n in g.nodes:
        for v in n.inputs:
            if isinstance(v, Value) and v.producer is not None and \
                    region.get(id(v.producer)) != region.get(id(n), -1):
                out.add(id(v))
    return out


def run(g: Graph, ctx) -> bool:
    if ctx is not None and not getattr(ctx, "codegen", True):
        return False  # the NumPy executor runs regions node by node, in one buffer
    groups = list(regions(g).values())
    grouped = {id(n) for grp in groups for n in grp}
    groups += [[n] for n in g.nodes if id(n) not in grouped and is_elementwise(n)
               and "single_pass" not in n.op.traits
               and len(n.outputs) == 1]
    fused = REGISTRY["fused"]
    used_outside = _used_outside(g, groups)
    replaced: dict[int, Node | None] = {}   # id(node) -> its fused node (or None: removed)
    for nodes in groups:
        body, ext, results = _body(nodes, used_outside, broadcasts=True)
        if supported(body) is not None:
            continue
        last = results[0].producer   # the root (a side sum may come after it)
        node = Node(fused, list(ext), {"body": str(body)}, results, results[0].producer.name)
        for k, v in enumerate(results):
            v.producer, v.index = node, k
        for n in nodes:
            replaced[id(n)] = None
        replaced[id(last)] = node
    if not replaced:
        return False
    g.nodes = [replaced.get(id(n), n) for n in g.nodes if replaced.get(id(n), n) is not None]
    _drop_unread_broadcasts(g)
    return True


def _drop_unread_broadcasts(g: Graph) -> None:
    """Remove the ``expand`` nodes only fused regions read (they now read the source)."""
    read = {id(v) for n in g.nodes for v in n.inputs if isinstance(v, Value)}
    read |= {id(v) for v in g.live_roots()}
    g.nodes = [n for n in g.nodes if n.op.name != "expand" or id(n.outputs[0]) in read]
