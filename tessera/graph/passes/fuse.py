"""Fusion grouping: mark chains of elementwise nodes as regions (``notes["region"]``).

A producer joins its consumer's region when it is elementwise, has the shape the region
iterates over and the consumer's dtype, and the consumer is its only user, so the whole
region can run as one loop without materialising the intermediates. A region iterates over
its root's output shape, or, when the root is a reduction (``sum``, ``mean``, ``amax``,
``amin`` over any dims), over the reduction's input: the chain feeding a reduction fuses
into it. On the NumPy executor a region runs in one buffer (the memory plan's in-place
reuse); code generation compiles each region to one C kernel.

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%x: float32[8]) {
...   %0: float32[8] = exp(%x)
...   %1: float32[8] = neg(%0)
...   %2: float32[] = sum(%1) {dim=None, keepdim=False, dtype=None}
...   return (%2)
... }''')
>>> run(g, None); [n.notes.get("region") for n in g.nodes]
True
[0, 0, 0]
"""
from __future__ import annotations

from tessera.graph.ir import Graph


def is_elementwise(n) -> bool:
    """Fusible: the op has a C rule (``tessera.codegen.c_rules``), so it computes each output
    element from the same element of its (broadcast) inputs."""
    return n.op.to_c is not None


# reductions that can end a region (their input chain fuses into them)
REDUCTIONS = frozenset({"sum", "mean", "amax", "amin"})


def is_reduction_root(n) -> bool:
    return n.op.name in REDUCTIONS and n.attrs.get("dtype") is None and \
        len(n.outputs) == 1 and n.outputs[0].dtype.name in ("float32", "float64")


def run(g: Graph, ctx) -> bool:
    users = g.users()
    roots = {id(v) for v in g.live_roots()}
    region_of: dict[int, int] = {}
    shape_of: dict[int, tuple] = {}   # region -> the shape it iterates over
    count = 0
    changed = False
    for n in reversed(g.nodes):  # consumers first: a producer joins its consumer's region
        reduction = is_reduction_root(n)
        if not (reduction or is_elementwise(n)) or len(n.outputs) != 1:
            continue
        out = n.outputs[0]
        region = None
        us = users.get(out, [])
        if not reduction and len(us) == 1 and id(out) not in roots and \
                id(us[0]) in region_of:
            c = us[0]
            r = region_of[id(c)]
            if shape_of[r] == out.shape and c.outputs[0].dtype is out.dtype:
                region = r
        if region is None:
            region = count
            count += 1
            shape_of[region] = n.inputs[0].shape if reduction else out.shape
        region_of[id(n)] = region
    # singleton regions are not fusion; renumber the rest in program order
    sizes: dict[int, int] = {}
    for r in region_of.values():
        sizes[r] = sizes.get(r, 0) + 1
    renum: dict[int, int] = {}
    for n in g.nodes:
        r = region_of.get(id(n))
        if r is None or sizes[r] < 2:
            if n.notes.pop("region", None) is not None:
                changed = True
            continue
        r = renum.setdefault(r, len(renum))
        if n.notes.get("region") != r:
            n.notes["region"] = r
            changed = True
    return changed


def regions(g: Graph) -> dict[int, list]:
    """region id -> its nodes, in program order."""
    out: dict[int, list] = {}
    for n in g.nodes:
        r = n.notes.get("region")
        if r is not None:
            out.setdefault(r, []).append(n)
    return out


__all__ = ["run", "regions", "is_elementwise"]
