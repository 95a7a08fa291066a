"""Static memory planning: liveness over the schedule, in-place reuse, and offsets for every
planned intermediate in one arena.

A value's *buffer* is shared by the views taken of it (``aliasing="view"`` ops), so a
buffer lives from its producer to the last use of any of its views. Nodes with an
``out``-form kernel (``Executor`` decides which) write into planned buffers:

* in place: the output takes the buffer of an input that dies at this node and has the same
  size (an elementwise chain then runs in one buffer);
* into a variable: a new value of a parameter or optimizer state, when nothing reads the
  old value afterwards, is written straight into the variable's array (no copy-back);
* otherwise at an offset in the arena, chosen greedily by size (largest first, lowest
  offset that no buffer alive at the same time occupies), as TFLite's planner does.

The step's returned values are not planned: their kernels allocate them, so they leave as
tensors without a copy out of the arena.

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%x: float32[256]) {
...   %0: float32[256] = exp(%x)
...   %1: float32[256] = neg(%0)
...   %2: float32[256] = sin(%1)
...   return (%2)
... }''')
>>> p = plan_memory(g, {0, 1, 2}); p.arena_bytes, p.inplace
(1024, {1: 0})
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tessera.graph.ir import Graph, Value

__all__ = ["MemoryPlan", "plan_memory", "ALIGN", "aligned_bytes"]

ALIGN = 64  # bytes: cache-line aligned buffers


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class MemoryPlan:
    arena_bytes: int = 0
    offsets: dict = field(default_factory=dict)     # id(value) -> byte offset in the arena
    inplace: dict = field(default_factory=dict)     # node index -> input position reused
    into_var: dict = field(default_factory=dict)    # node index -> variable name written
    naive_bytes: int = 0                            # sum of all intermediates
    planned_bytes: int = 0                          # sum of the planned buffers' sizes
    # a node with several outputs (a multi-output fused region) writes each one where
    # these say, by id(value): in place of an input, into a variable (else: ``offsets``)
    value_inplace: dict = field(default_factory=dict)   # id(value) -> input position
    value_var: dict = field(default_factory=dict)       # id(value) -> variable name


def _roots(g: Graph, views: frozenset | None = None) -> dict[int, Value]:
    """id(value) -> the value whose buffer it uses (itself unless made by a view op, or by
    a node in ``views`` when that is given)."""
    root: dict[int, Value] = {}
    for v in g.inputs:
        root[id(v)] = v
    for v in g.variables.values():
        root[id(v)] = v
    for i, n in enumerate(g.nodes):
        src = n.inputs[0] if n.inputs else None
        aliases = n.op.aliasing == "view" if views is None else i in views
        for v in n.outputs:
            if aliases and isinstance(src, Value):
                root[id(v)] = root[id(src)]
            else:
                root[id(v)] = v
    return root


def _buffer_ends(g: Graph, root: dict) -> dict[int, int]:
    """id(buffer root) -> index of the last node that reads the buffer (through any view);
    len(nodes) when a step result (output or assign) is in it."""
    end: dict[int, int] = {}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            if isinstance(v, Value):
                r = id(root[id(v)])
                end[r] = max(end.get(r, -1), i)
    for v in g.live_roots():
        end[id(root[id(v)])] = len(g.nodes)
    return end


def plan_memory(g: Graph, out_nodes: set[int], not_inplace: frozenset = frozenset(),
                views: frozenset | None = None, inplace_inputs: dict | None = None,
                unplanned: frozenset = frozenset()) -> MemoryPlan:
    """Plan buffers for the outputs of the nodes in ``out_nodes`` (indices into g.nodes).
    An output may take over the buffer of an input that dies at its node, except at the
    nodes in ``not_inplace``, whose kernels read inputs around what they already wrote (a
    convolution's windows), but for the input positions ``inplace_inputs`` gives such a
    node (node index -> positions: a convolution's residual, read where it is written).
    ``views``: the nodes whose output shares its first input's buffer (default: the ops with
    ``aliasing="view"``; a C program that copies some views into buffers of their own says
    which it keeps). ``unplanned``: ids of outputs written elsewhere (into the buffer of the
    node that reads them), left out."""
    inplace_inputs = inplace_inputs or {}
    root = _roots(g, views)
    end = _buffer_ends(g, root)
    plan = MemoryPlan()
    plan.naive_bytes = sum(v.nbytes for n in g.nodes for v in n.outputs)
    assigned = _assign_targets(g)
    # the step's results leave as tensors: a kernel allocates them, rather than the arena
    # (whose buffers are reused next step, so a result there would have to be copied out)
    returned = {id(root[id(v)]) for v in g.outputs}
    owner: dict[int, int] = {}      # id(buffer root) -> id of the buffer it was merged into
    intervals: dict[int, list] = {}  # id(buffer) -> [start, end, nbytes]
    for i, n in enumerate(g.nodes):
        if i not in out_nodes:
            continue
        single = len(n.outputs) == 1
        taken: set[int] = set()    # buffers an earlier output of the node took over
        for out in n.outputs:
            if out.nbytes == 0 or id(out) in unplanned:
                continue
            name = assigned.get(id(out))
            if name is not None and _var_free_after(g, name, i, root, end) and not (
                    i in not_inplace and g.variables[name] in n.inputs):
                if single:
                    plan.into_var[i] = name
                else:
                    plan.value_var[id(out)] = name
                continue
            if id(out) in returned:
                continue
            only = inplace_inputs.get(i) if i in not_inplace else None
            k = None if i in not_inplace and not only else \
                _reusable_input(n, out, i, root, end, intervals, owner, taken, only)
            if k is not None:
                buf = owner[id(root[id(n.inputs[k])])]
                owner[id(out)] = buf
                intervals[buf][1] = max(intervals[buf][1], end.get(id(out), i))
                taken.add(buf)
                if single:
                    plan.inplace[i] = k
                else:
                    plan.value_inplace[id(out)] = k
                continue
            owner[id(out)] = id(out)
            intervals[id(out)] = [i, end.get(id(out), i), out.nbytes]
    plan.offsets, plan.arena_bytes = _place(intervals)
    plan.planned_bytes = sum(s for _, _, s in intervals.values())
    for vid, buf in owner.items():
        plan.offsets[vid] = plan.offsets[buf]
    return plan


def _assign_targets(g: Graph) -> dict[int, str]:
    out: dict[int, str] = {}
    seen: set[int] = set()
    for name, v in g.assigns:
        if id(v) in seen or v in g.outputs:
            out.pop(id(v), None)  # one value into two variables, or also returned: copy
            continue
        seen.add(id(v))
        out[id(v)] = name
    return out


def _var_free_after(g: Graph, name: str, i: int, root: dict, end: dict) -> bool:
    """Nothing reads variable ``name`` (or a view of it) after node ``i``."""
    var = g.variables[name]
    return end.get(id(var), -1) <= i


def _reusable_input(n, out, i, root, end, intervals, owner, taken, only=None):
    # (only: the positions a kernel that reads its other inputs around its writes may take
    # over, unless one of those others shares the buffer)
    around = set() if only is None else \
        {owner.get(id(root[id(v)])) for k, v in enumerate(n.inputs)
         if isinstance(v, Value) and v.kind == "node" and k not in only}
    for k, v in enumerate(n.inputs):
        if not isinstance(v, Value) or v.kind != "node" or (only is not None and k not in only):
            continue
        r = root[id(v)]
        buf = owner.get(id(r))
        if buf is None or buf in taken or buf in around or end.get(id(r), -1) != i:
            continue  # not a planned buffer, read later or around the writes
        if intervals[buf][2] == out.nbytes and v.dtype is out.dtype and v.shape == out.shape \
                and r is v:
            return k
    return None


def _place(intervals: dict) -> tuple[dict, int]:
    """Greedy by size: offsets such that buffers alive at the same time never overlap."""
    placed: list[tuple[int, int, int, int]] = []   # (offset, size, start, end)
    offsets: dict[int, int] = {}
    total = 0
    for key, (start, stop, size) in sorted(intervals.items(), key=lambda kv: -kv[1][2]):
        size = _aligned(size)
        busy = sorted((o, o + s) for o, s, a, b in placed if a <= stop and start <= b)
        off = 0
        for lo, hi in busy:
            if off + size <= lo:
                break
            off = max(off, hi)
        placed.append((off, size, start, stop))
        offsets[key] = off
        total = max(total, off + size)
    return offsets, total


def aligned_bytes(n: int) -> np.ndarray:
    """``n`` bytes starting on a cache line (NumPy only promises 16-byte alignment): the
    arena (every planned buffer is then aligned too: offsets are multiples of ALIGN) and
    the pooled graph results."""
    raw = np.empty(n + ALIGN, np.uint8)
    skip = -raw.ctypes.data % ALIGN
    return raw[skip:skip + n]
