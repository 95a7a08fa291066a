"""Fusion grouping: mark chains of elementwise nodes as regions (``notes["region"]``).

A producer joins its consumers' region when it fits the region's loops and either all its
users are in that one region (and it is no step result), or (*multi-output fusion*) every
other use comes after the region's last node: a reader outside the region (a value autograd
saves for the backward, a second result), or the step's results and assigns (an optimizer's
new parameter and moments). The region's kernel then writes that value too, as one of its
outputs; outside readers after the region keep regions in program order, so outlining them
makes no cycle. A producer fits the loops when it is an elementwise op of the shape the
region iterates over, or a ``keepdim`` reduction over it (a per-row statistic, like
softmax's max and sum or layer norm's mean), or an elementwise op of the per-row shape. A
region iterates over its root's output shape, or, when the root is a reduction (``sum``,
``mean``, ``amax``, ``amin`` over any dims), over the reduction's input: the chain feeding
a reduction fuses into it. All reductions of a region reduce the same dims. The outline
pass turns each region into one ``fused`` node, which code generation compiles to one C
kernel. ``MULTI_OUTPUT = False`` turns multi-output fusion off (a region then ends at every
value used outside it).

In a training step, a ``sum`` over leading dims (keeping the last: a bias or layer norm
weight gradient, *a column sum*) whose region reads values of another region of the same
shape, or values that region reads too, joins that region as a *side sum*, when everything
it reads exists where that region stands and everything reading it comes later: the
region's kernel accumulates the column sums as it goes, instead of a second kernel reading
the values back (``SIDE_SUMS``).

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
    """Fusible: the op has a C rule (``OpDef.to_c``), so it computes each output element
    from the same element of its (broadcast) inputs."""
    return n.op.to_c is not None


# reductions that can end a region (their input chain fuses into them)
REDUCTIONS = frozenset({"sum", "mean", "amax", "amin"})


def is_reduction_root(n) -> bool:
    return n.op.name in REDUCTIONS and n.attrs.get("dtype") is None and \
        len(n.outputs) == 1 and n.outputs[0].dtype.name in ("float32", "float64")


def _dims(n, nd: int) -> frozenset:
    dim = n.attrs.get("dim")
    if dim is None or dim == () or dim == [] or nd == 0:
        return frozenset(range(nd))
    return frozenset(d % nd for d in (dim if isinstance(dim, (tuple, list)) else (dim,)))


# whether a producer also read outside a region may join it (its kernel writes the value)
MULTI_OUTPUT = True
# whether a column sum in a training step joins the region whose values it reads
SIDE_SUMS = True


def _candidate(n, users, roots, region_of, root_at, index) -> int | None:
    """The region ``n`` may join: its users' one region; or, with other uses, the region
    of its first user, when every use outside that region comes after the region's last
    node and that node is no reduction. (A chain that feeds a reduction over other dims,
    such as a bias gradient's sum over the batch, and is read elsewhere too, is better the
    root of its own region: it can then take in its own per-row statistics, as layer
    norm's backward does.)"""
    out = n.outputs[0]
    us = users.get(out, [])
    rs = {region_of.get(id(u)) for u in us}
    if len(rs) == 1 and None not in rs and id(out) not in roots:
        return rs.pop()
    if not MULTI_OUTPUT or not us:
        return None
    first = min(us, key=lambda u: index[id(u)])
    r = region_of.get(id(first))
    if r is None:
        return None
    end = root_at[r]
    if end < 0:
        return None
    if all(region_of.get(id(u)) == r or index[id(u)] > end for u in us):
        return r
    return None


def _join(n, reduction: bool, users, roots, region_of, info, root_at, index) -> int | None:
    """The region ``n`` joins (``_candidate``), when ``n`` fits its loops."""
    out = n.outputs[0]
    r = _candidate(n, users, roots, region_of, root_at, index)
    if r is None:
        return None
    shape, dims = info[r]
    if reduction:  # a per-row statistic (softmax's max and sum, layer norm's mean)
        if not n.attrs.get("keepdim") or tuple(n.inputs[0].shape) != shape:
            return None
        d = _real(_dims(n, len(shape)), shape)
        if dims is not None and d != dims:
            return None
        info[r][1] = d
        return r
    if out.shape == shape:
        return r
    if len(out.shape) == len(shape):  # one value per row, computed between the row's loops
        d = frozenset(i for i, (a, b) in enumerate(zip(out.shape, shape)) if a != b)
        if all(out.shape[i] == 1 for i in d) and d and (dims is None or d == dims):
            info[r][1] = d
            return r
    return None


def _real(dims: frozenset, shape: tuple) -> frozenset:
    """The reduced dims that have more than one element."""
    return frozenset(d for d in dims if shape[d] != 1)


def run(g: Graph, ctx) -> bool:
    users = g.users()
    roots = {id(v) for v in g.live_roots()}
    index = {id(n): i for i, n in enumerate(g.nodes)}
    region_of: dict[int, int] = {}
    info: dict[int, list] = {}   # region -> [the shape it iterates over, reduced dims]
    root_at: dict[int, int] = {}  # region -> index of its root (-1: a reduction)
    count = 0
    changed = False
    for n in g.nodes:
        if n.notes.pop("side", None) is not None:
            changed = True
    for n in reversed(g.nodes):  # consumers first: a producer joins its consumers' region
        reduction = is_reduction_root(n)
        if not (reduction or is_elementwise(n)) or len(n.outputs) != 1:
            continue
        region = _join(n, reduction, users, roots, region_of, info, root_at, index)
        if region is None:
            region = count
            root_at[region] = -1 if reduction else index[id(n)]
            count += 1
            src = n.inputs[0]
            info[region] = [tuple(src.shape), _real(_dims(n, len(src.shape)), src.shape)] \
                if reduction else [n.outputs[0].shape, None]
        region_of[id(n)] = region
    if SIDE_SUMS and ctx is not None and getattr(ctx, "training", False):
        _side_sums(g, region_of, info, root_at, index, users)
    # singleton regions are not fusion; renumber the rest in program order
    sizes: dict[int, int] = {}
    for rid in region_of.values():
        sizes[rid] = sizes.get(rid, 0) + 1
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


def is_column_sum(n, shape: tuple) -> bool:
    """Whether ``n`` sums a value of ``shape`` over leading dims only, keeping the last dim
    of more than one element (so the loops' innermost dim is never summed)."""
    if n.op.name != "sum" or not is_reduction_root(n) or tuple(n.inputs[0].shape) != shape:
        return False
    dims = _real(_dims(n, len(shape)), shape)
    last = max((d for d in range(len(shape)) if shape[d] != 1), default=None)
    return bool(dims) and last is not None and last not in dims


def _side_sums(g: Graph, region_of: dict, info: dict, root_at: dict, index: dict,
               users: dict) -> None:
    """Each column-sum region (its root a ``sum`` over leading dims) joins a region it reads
    values of, or one reading the same values: one that ends in a map over the same shape,
    at whose root everything the sum's region reads exists and after which everything
    reading the sum comes (the fused node stands at that root). Its nodes get the note
    ``side`` (they are not the root)."""
    members: dict[int, list] = {}
    for n in g.nodes:
        r = region_of.get(id(n))
        if r is not None:
            members.setdefault(r, []).append(n)
    for r, nodes in members.items():
        root = nodes[-1]
        if root_at[r] >= 0 or not is_column_sum(root, info[r][0]):
            continue
        mine = {id(n) for n in nodes}
        hosts: list[int] = []   # regions making what it reads, then regions reading it too
        for pass_ in (0, 1):
            for n in nodes:
                for v in n.tensor_inputs:
                    near = [v.producer] if pass_ == 0 else users.get(v, [])
                    for m in near:
                        h = region_of.get(id(m)) if m is not None else None
                        if h is not None and h != r and h not in hosts:
                            hosts.append(h)
        for h in hosts:
            end = root_at[h]
            if end < 0 or info[h][0] != info[r][0]:
                continue
            ok = all(v.producer is None or id(v.producer) in mine or
                     region_of.get(id(v.producer)) == h or index[id(v.producer)] < end
                     for n in nodes for v in n.tensor_inputs)
            ok = ok and all(index[id(u)] > end for u in users.get(root.outputs[0], []))
            if ok:
                for n in nodes:
                    region_of[id(n)] = h
                    n.notes["side"] = True   # not the region's root (outline)
                break


def regions(g: Graph) -> dict[int, list]:
    """region id -> its nodes, in program order."""
    out: dict[int, list] = {}
    for n in g.nodes:
        r = n.notes.get("region")
        if r is not None:
            out.setdefault(r, []).append(n)
    return out


__all__ = ["run", "regions", "is_elementwise", "is_column_sum", "MULTI_OUTPUT", "SIDE_SUMS"]
