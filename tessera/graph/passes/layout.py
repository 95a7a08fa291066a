"""Make the copies that reshapes imply explicit: a ``view`` of a permuted value (attention's
heads merged back, a batch-first input turned sequence-first and flattened) cannot be a
view of its buffer, so NumPy's reshape copies it into a new array on every step, which the
memory plan cannot place. This pass puts a ``clone`` in front of each such view; the
clone's out-form writes the copy into the arena, and the view becomes a real view of it.

Strides are followed statically from C-contiguous buffers (the layout of graph inputs,
variables and every kernel's result in the arena) through the view ops whose strides are
known (permute, expand, squeeze, unsqueeze, slice, view); a value reached any other way is
left alone. Guessing wrong costs a copy or an allocation, never a wrong value: the graph is
functional, so a view and a copy of it are the same value.

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%x: float32[4, 6, 8]) {
...   %0: float32[6, 4, 8] = permute(%x) {dims=(1, 0, 2)}
...   %1: float32[24, 8] = view(%0) {shape=(24, 8)}
...   return (%1)
... }''')
>>> run(g, None), [n.op.name for n in g.nodes]
(True, ['permute', 'clone', 'view'])
"""
from __future__ import annotations

import numpy as np

from tessera.graph.ir import Graph, Node, Value
from tessera.ops.registry import REGISTRY
from tessera.ops.views import _compute_stride

__all__ = ["run"]

# view ops whose kernels only compute strides: applied to a stand-in array, they give the
# layout of their result without reading memory
STRIDED = frozenset({"permute", "expand", "squeeze", "unsqueeze", "slice"})


def _contiguous(v: Value) -> np.ndarray:
    """A stand-in for a C-contiguous buffer of ``v``'s shape (one real element: only its
    strides are ever read)."""
    item = v.dtype.np.itemsize if v.dtype.np is not None else 1
    strides, acc = [], item
    for s in reversed(v.shape):
        strides.append(acc)
        acc *= max(s, 1)
    return np.lib.stride_tricks.as_strided(np.empty(1, v.dtype.np), v.shape,
                                           tuple(reversed(strides)))


def _strides(a: np.ndarray) -> list[int]:
    return [s // a.itemsize for s in a.strides]


def run(g: Graph, ctx) -> bool:
    layout: dict[int, np.ndarray | None] = {}   # id(value) -> its stand-in, None: unknown
    for v in list(g.inputs) + list(g.variables.values()):
        layout[id(v)] = _contiguous(v) if v.dtype.np is not None else None
    nodes, changed = [], False
    for n in g.nodes:
        src = n.inputs[0] if n.inputs and isinstance(n.inputs[0], Value) else None
        a = layout.get(id(src)) if src is not None else None
        if n.op.aliasing != "view":
            nodes.append(n)
            for v in n.outputs:
                layout[id(v)] = _contiguous(v) if v.dtype.np is not None else None
            continue
        out = n.outputs[0] if len(n.outputs) == 1 else None
        result = None
        if a is not None and out is not None and n.op.name in STRIDED:
            try:
                result = n.op.kernels["cpu"](a, **n.attrs)
            except Exception:   # an attribute form this stand-in does not take: unknown
                result = None
        elif a is not None and out is not None and n.op.name == "view" and a.size > 1:
            st = _compute_stride(a.shape, _strides(a), out.shape)
            if st is None:
                assert src is not None  # ``a`` is the stand-in of ``src``
                copy = Node(REGISTRY["clone"], [src], {"contiguous": True}, [], n.name)
                copy.outputs.append(Value(g.fresh(), src.shape, src.dtype, copy, 0))
                nodes.append(copy)
                n.inputs = [copy.outputs[0]] + list(n.inputs[1:])
                changed = True
                result = _contiguous(out)
            else:
                result = np.lib.stride_tricks.as_strided(
                    a, out.shape, tuple(s * a.itemsize for s in st))
        for v in n.outputs:
            layout[id(v)] = result if v is out else None
        nodes.append(n)
    g.nodes = nodes
    return changed
