"""Duplicate cheap elementwise producers into each of their consumers, so that each copy
fuses into its consumer's region instead of being written to memory once and read by both.

The case it is for: a linear layer's bias add ``h = x @ W + b`` feeds the activation and,
through autograd, the activation's backward (``gelu_backward(g, h)``). Fusion joins a
producer to a region only when all its users are in that region, so ``h`` stays a separate
kernel: a pass that writes ``h`` and two that read it. With the add duplicated, the forward
computes ``gelu(mm + b)`` and the backward ``gelu_backward(g, mm + b)`` in their own loops,
and ``h`` is never stored. XLA's fusion duplicates cheap producers the same way.

A node is duplicated only when that costs no memory or work worth having: it is a cheap
arithmetic op (trait ``cheap``), every user is an elementwise op (or a reduction) over its
own shape, so each copy fuses, and at most one operand is as large as the output (the
others broadcast), so keeping the operands alive instead of the result holds no more memory.

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%x: float32[4, 3], %b: float32[3]) {
...   %0: float32[4, 3] = add(%x, %b) {alpha=1}
...   %1: float32[4, 3] = exp(%0)
...   %2: float32[4, 3] = neg(%0)
...   return (%1, %2)
... }''')
>>> run(g, None); [n.op.name for n in g.nodes]
True
['add', 'exp', 'add', 'neg']
"""
from __future__ import annotations

from tessera.graph.ir import Graph, Node, Value
from tessera.graph.passes.fuse import is_elementwise, is_reduction_root

__all__ = ["run"]


def _worth(n: Node, users: list, roots: set) -> bool:
    if "cheap" not in n.op.traits or len(n.outputs) != 1 or n.op.to_c is None:
        return False
    out = n.outputs[0]
    if len(users) < 2 or id(out) in roots or out.dtype.name not in ("float32", "float64"):
        return False
    for u in users:
        fits = (is_elementwise(u) and len(u.outputs) == 1 and u.outputs[0].shape == out.shape
                ) or (is_reduction_root(u) and u.inputs[0] is out)
        if not fits:
            return False
    full = [v for v in n.tensor_inputs if v.numel == out.numel]
    return len(full) <= 1 and len(users) == len(set(map(id, users)))


def run(g: Graph, ctx) -> bool:
    if ctx is not None and not ctx.codegen:   # NumPy's kernels would only add work
        return False
    users = g.users()
    roots = {id(v) for v in g.live_roots()}
    plan: dict[int, Node] = {}   # id(user) -> the producer it gets a copy of
    for n in g.nodes:
        out = n.outputs[0] if n.outputs else None
        if out is not None and _worth(n, users.get(out, []), roots):
            for u in users[out][1:]:   # the first user keeps the original
                plan[id(u)] = n
    if not plan:
        return False
    nodes = []
    for u in g.nodes:
        n = plan.get(id(u))
        if n is not None:
            old = n.outputs[0]
            copy = Node(n.op, list(n.inputs), dict(n.attrs), [], n.name)
            copy.outputs.append(Value(g.fresh(), old.shape, old.dtype, copy, 0))
            nodes.append(copy)
            u.inputs = [copy.outputs[0] if v is old else v for v in u.inputs]
        nodes.append(u)
    g.nodes = nodes
    return True
