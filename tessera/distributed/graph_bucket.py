"""Bucketing the all-reduces of a compiled ``nn.Graph``: many partial_sum -> broadcast
``boxing`` nodes become one per bucket, as DDP's flat buckets do in eager mode.

Under data parallelism every broadcast parameter's gradient is partial_sum after backward
and is all-reduced where it is ready (``Module.to_global``'s gradient hook), one collective
per parameter. This pass walks the program in order and, instead of running such an
all-reduce where it stands, holds it in a pending bucket, which is emitted as one
``all_reduce_bucket`` node (its kernel copies the tiles into one flat buffer, all-reduces
that in place and hands out views of it) at the first of:

* a node that reads one of the bucket's results (so nothing runs on an unreduced value);
* any other collective (``boxing``, ``send``/``recv``, ``sbp_local``, a bucket): each rank's
  sequence of collectives stays the original one with runs of all-reduces merged, and the
  ranks of a group, which run the same program, merge the same runs;
* an all-reduce over another group or of another dtype, or one that would take the bucket
  past ``cap_bytes`` (DDP's ``bucket_cap_mb``, 25 MB by default);
* the end of the program.

Moving an all-reduce later changes no value (the sum of a concatenation is the
concatenation of the sums), only how many collectives a step makes: a data-parallel MLP's
four gradient all-reduces become one. ``nn.Graph`` runs it after the pass pipeline (which
drops the ``clone`` autograd makes of each gradient: a reader that would flush every
bucket at once); ``graph.config.set_bucket_cap_mb(0)`` turns it off.

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%a: float32[2, 3], %b: float32[4]) {
...   %0: float32[2, 3] = boxing(%a) {shape=(2, 3), src='P', dst='B', group=(0, 1), index=0, seq=0}
...   %1: float32[4] = boxing(%b) {shape=(4,), src='P', dst='B', group=(0, 1), index=0, seq=1}
...   return (%0, %1)
... }''')
>>> run(g, 25 << 20)
True
>>> print(g)
graph(%a: float32[2, 3], %b: float32[4]) {
  %2: float32[2, 3], %3: float32[4] = all_reduce_bucket(%a, %b) {group=(0, 1), index=0, seq=0}
  return (%2, %3)
}
"""
from __future__ import annotations

from tessera.graph.ir import Graph, Node, Value
from tessera.ops.registry import REGISTRY

__all__ = ["run", "DEFAULT_CAP_MB"]

DEFAULT_CAP_MB = 25.0
_COLLECTIVES = frozenset({"boxing", "send", "recv", "sbp_local", "all_reduce_bucket"})


def _all_reduce(n: Node) -> bool:
    """A communicating partial_sum -> broadcast over more than one rank."""
    a = n.attrs
    return (n.op.name == "boxing" and a.get("src") == "P" and a.get("dst") == "B"
            and a.get("seq") is not None and len(a.get("group", ())) > 1)


def _merged(g: Graph, bucket: list[Node]) -> tuple[Node, dict[int, Value]]:
    """One ``all_reduce_bucket`` node for ``bucket``, and old output -> new value."""
    first = bucket[0]
    node = Node(REGISTRY["all_reduce_bucket"], [n.inputs[0] for n in bucket],
                {"group": first.attrs["group"], "index": first.attrs["index"],
                 "seq": first.attrs["seq"]}, [], "")
    rename = {}
    for i, n in enumerate(bucket):
        old = n.outputs[0]
        node.outputs.append(Value(g.fresh(), old.shape, old.dtype, node, i))
        rename[id(old)] = node.outputs[-1]
    return node, rename


def run(g: Graph, cap_bytes: int) -> bool:
    """Merge runs of all-reduces of ``g`` into buckets of at most ``cap_bytes`` (a single
    all-reduce bigger than that stays alone); whether ``g`` changed."""
    if cap_bytes <= 0:
        return False
    out: list[Node] = []
    rename: dict[int, Value] = {}
    bucket: list[Node] = []
    held: set[int] = set()  # ids of the pending all-reduces' outputs
    size = 0
    changed = False

    def flush():
        nonlocal changed, size
        if len(bucket) == 1:
            out.append(bucket[0])
        elif bucket:
            node, new = _merged(g, bucket)
            out.append(node)
            rename.update(new)
            changed = True
        bucket.clear()
        held.clear()
        size = 0

    for n in g.nodes:
        merge = _all_reduce(n)
        if bucket and (any(id(v) in held for v in n.tensor_inputs)
                       or (not merge and n.op.name in _COLLECTIVES)
                       or (merge and (_key(n) != _key(bucket[0]) or size + n.outputs[0].nbytes
                                      > cap_bytes))):
            flush()
        n.inputs = [rename.get(id(v), v) if isinstance(v, Value) else v for v in n.inputs]
        if merge:
            bucket.append(n)
            held.add(id(n.outputs[0]))
            size += n.outputs[0].nbytes
        else:
            out.append(n)
    flush()
    g.nodes = out
    if changed:
        g.outputs = [rename.get(id(v), v) for v in g.outputs]
        g.assigns = [(k, rename.get(id(v), v)) for k, v in g.assigns]
    return changed


def _key(n: Node) -> tuple:
    return tuple(n.attrs["group"]), n.outputs[0].dtype
