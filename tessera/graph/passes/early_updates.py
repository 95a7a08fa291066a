"""Updates of state as early as they can run: a node whose results are all new values of
variables (the optimizer's step of a parameter, a batch norm's running statistics) moves
to just after the last of its inputs is made, so a parameter's gradient dies as soon as
its update has read it instead of living to the end of the step.

A moved node also waits for every other reader of the variables it updates (the memory
plan then writes the new value into the variable's own storage). Random nodes and
collectives stay where they are (their order is observable), and a graph of pipeline stages,
gradient accumulation or collectives keeps its order (its strategy places its updates).

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%x: float32[4]) {
...   var %w: float32[4]
...   %0: float32[4] = mul(%x, %w)
...   %1: float32[4] = mul(%0, %x)
...   %2: float32[4] = exp(%1)
...   %3: float32[4] = sub(%w, %0)
...   return (%2)
...   assign %w = %3
... }''')
>>> run(g, None); [n.op.name for n in g.nodes]
True
['mul', 'sub', 'mul', 'exp']
"""
from __future__ import annotations

from tessera.graph.ir import Graph, Value
from tessera.graph.passes.cse import is_impure

__all__ = ["run", "schedule"]

_COLLECTIVE = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
               "send", "recv", "boxing")


def _movable(n) -> bool:
    name = n.op.name
    return not is_impure(name, n.attrs) and not any(c in name for c in _COLLECTIVE)


def schedule(nodes: list, outputs: list, assigns: list, variables: dict) -> list:
    """``nodes`` reordered: each node making only new values of variables right after
    the last node it must follow (its inputs' producers; the other readers of the
    variables it updates)."""
    returned = {id(v) for v in outputs}
    state = {id(v) for _, v in assigns}
    readers: dict = {}
    for j, n in enumerate(nodes):
        for v in n.inputs:
            if isinstance(v, Value):
                readers.setdefault(id(v), []).append(j)
    # an update makes nothing but new values of variables (the whole backward also feeds
    # only them, through the gradients: it stays where autograd put it)
    update = {j for j, n in enumerate(nodes) if n.outputs and _movable(n) and all(
        id(v) in state and id(v) not in returned for v in n.outputs)}
    if not update:
        return nodes
    where = {id(v): j for j, n in enumerate(nodes) for v in n.outputs}
    writes: dict = {}   # update index -> variables its results become
    for name, v in assigns:
        k = where.get(id(v))
        if k in update and name in variables:
            writes.setdefault(k, []).append(variables[name])
    anchor: dict = {}
    for j in sorted(update):
        n = nodes[j]
        at = -1
        for v in n.inputs:
            p = where.get(id(v)) if isinstance(v, Value) else None
            if p is not None:
                at = max(at, anchor[p] if p in update else p)
        # the new value goes into the variable's storage: after the variable's readers
        for var in writes.get(j, ()):
            at = max(at, max((k for k in readers.get(id(var), ()) if k not in update),
                             default=-1))
        anchor[j] = at
    after: dict = {}
    for j in sorted(update):
        after.setdefault(anchor[j], []).append(nodes[j])
    out = list(after.get(-1, ()))
    for j, n in enumerate(nodes):
        if j not in update:
            out.append(n)
            out.extend(after.get(j, ()))
    return out


def run(g: Graph, ctx) -> bool:
    if ctx is not None and (ctx.stages or ctx.micro_batches > 1):
        return False
    # a step spread over ranks has its updates placed by its strategy (ZeRO scatters the
    # gradients and gathers the updated shards around them, buckets merge collectives)
    if any(not _movable(n) and not is_impure(n.op.name, n.attrs) for n in g.nodes):
        return False
    nodes = schedule(g.nodes, g.outputs, g.assigns, g.variables)
    changed = any(a is not b for a, b in zip(nodes, g.nodes))
    g.nodes = nodes
    return changed
