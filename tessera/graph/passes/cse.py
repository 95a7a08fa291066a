"""Common-subexpression elimination: two nodes with the same op, the same inputs and the
same attributes compute the same value, so the later one is replaced by the earlier.
Random ops (each call draws new numbers) and recomputations (rematerialization) are never
merged.

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%x: float32[2]) {
...   %0: float32[2] = exp(%x)
...   %1: float32[2] = exp(%x)
...   %2: float32[2] = add(%0, %1) {alpha=1}
...   return (%2)
... }''')
>>> run(g, None); str(g).count("exp(")
True
1
"""
from __future__ import annotations

from tessera.graph.ir import Graph, Value

# ops whose result is not a function of their inputs and attributes
IMPURE = frozenset({"rand", "randn", "randint", "randperm", "bernoulli", "multinomial",
                    "normal", "uniform", "dropout", "rrelu", "empty", "empty_like",
                    "exponential", "geometric", "cauchy", "log_normal", "random"})


def _key(n, rename):
    ins = tuple(("v", id(rename.get(id(v), v))) if isinstance(v, Value) else
                ("c", type(v).__name__, repr(v)) for v in n.inputs)  # repr: -0.0 != 0.0
    try:
        attrs = tuple(sorted((k, repr(v)) for k, v in n.attrs.items()))
        key = (n.op.name, ins, attrs)
        hash(key)
    except TypeError:
        return None
    return key


def is_impure(op_name: str, attrs: dict | None = None) -> bool:
    """Random: a sampler by name (in-place ones too: ``normal_``), or a node drawing from a
    generator or a seed."""
    if attrs and ("generator" in attrs or "seed" in attrs):
        return True
    base = op_name.rstrip("_")
    return base in IMPURE or "rand" in base or "dropout" in base or base == "poisson"


def run(g: Graph, ctx) -> bool:
    seen: dict = {}
    rename: dict[int, Value] = {}
    keep = []
    for n in g.nodes:
        if rename:
            n.inputs = [rename.get(id(v), v) if isinstance(v, Value) else v for v in n.inputs]
        # a recomputation (``notes["remat"]``) is a copy on purpose: it frees memory
        key = None if is_impure(n.op.name, n.attrs) or "remat" in n.notes else _key(n, rename)
        if key is not None and key in seen:
            for old, new in zip(n.outputs, seen[key].outputs):
                rename[id(old)] = new
            continue
        if key is not None:
            seen[key] = n
        keep.append(n)
    if not rename:
        return False
    g.nodes = keep
    g.outputs = [rename.get(id(v), v) for v in g.outputs]
    g.assigns = [(k, rename.get(id(v), v)) for k, v in g.assigns]
    return True
