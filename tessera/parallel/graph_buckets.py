"""Bucketing the all-reduces of a compiled ``nn.Graph``: many partial_sum -> broadcast
``boxing`` nodes become one per bucket, as DDP's flat buckets do in eager mode.

Under data parallelism every broadcast parameter's gradient is partial_sum after backward
and is all-reduced where it is ready (``Module.to_global``'s gradient hook), one collective
per parameter. This pass walks the program in order and, instead of running such an
all-reduce where it stands, holds it in a pending bucket, which is emitted as one
``all_reduce_bucket`` node (its kernel copies the tiles into one flat buffer, all-reduces
that in place and hands out views of it) at the first of:

* a node that reads one of the bucket's results (so nothing runs on an unreduced value);
* any other collective (a communicating ``boxing``, ``send``/``recv``, ``sbp_local``, a
  bucket): each rank's sequence of collectives stays the original one with runs of
  all-reduces merged, and the ranks of a group, which run the same program, merge the
  same runs;
* a conversion of another kind, over another group or of another dtype, or one that
  would take the bucket past ``cap_bytes`` (DDP's ``bucket_cap_mb``, 25 MB by default);
* the end of the program.

Moving an all-reduce later changes no value (the sum of a concatenation is the
concatenation of the sums), only how many collectives a step makes: a data-parallel MLP's
four gradient all-reduces become one. It is the pass ``bucket_all_reduces``, last in
``tessera.graph.passes.PIPELINE``: after the other passes, which drop the ``clone``
autograd makes of each gradient (a reader that would flush every bucket at once). Its cap
is ``PassContext.bucket_cap``, which ``nn.Graph`` takes from
``graph.config.set_bucket_cap_mb`` (0 turns it off).

ZeRO's conversions are bucketed the same way, as DeepSpeed's ``reduce_bucket_size`` and
``allgather_bucket_size`` do: runs of partial_sum -> split(0) (the gradients) become one
``reduce_scatter_bucket``, runs of split(0) -> broadcast (the updated shards) one
``all_gather_bucket``; each member's share of a bucket is its rows of every tensor in it.
At stage 2 a gradient is then reduce-scattered with its bucket rather than at once, so
the full gradients of up to one bucket live together, as in DDP. The all-reduces of the
gradients of the parameters ZeRO leaves whole (below ``shard_min_size``), which alternate
with the reduce-scatters along a model of weights and biases, join the same run: a
bucket holding any reduce-scatter is one ``reduce_scatter_bucket`` whose ``whole``
members are all-reduced within that collective (each rank sums its share of them and
writes it into every rank's buffer), so a step of ZeRO makes one collective of its
gradients, as data parallelism does.

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%a: float32[2, 3], %b: float32[4]) {
...   %0: float32[2, 3] = boxing(%a) {shape=(2, 3), src='P', dst='B', group=(0, 1), index=0, seq=0}
...   %1: float32[4] = boxing(%b) {shape=(4,), src='P', dst='B', group=(0, 1), index=0, seq=1}
...   return (%0, %1)
... }''')
>>> merge(g, 25 << 20)
True
>>> print(g)
graph(%a: float32[2, 3], %b: float32[4]) {
  %2: float32[2, 3], %3: float32[4] = all_reduce_bucket(%a, %b) {group=(0, 1), index=0, seq=0}
  return (%2, %3)
}
"""
from __future__ import annotations

from tessera.distributed.graph_ops import rows_bucketable
from tessera.graph.ir import Graph, Node, Value
from tessera.ops.registry import REGISTRY, Meta

__all__ = ["run", "merge", "DEFAULT_CAP_MB"]

DEFAULT_CAP_MB = 25.0
_BUCKETS: dict[tuple, str] = {("P", "B"): "all_reduce_bucket",
                              ("P", "S(0)"): "reduce_scatter_bucket",
                              ("S(0)", "B"): "all_gather_bucket"}
_COLLECTIVES = frozenset({"boxing", "send", "recv", "sbp_local", *_BUCKETS.values()})


def _bucket_op(n: Node) -> str | None:
    """The bucket op that may take ``n`` in: a communicating conversion over more than one
    rank of a kind that has one (ZeRO's by rows only where they run on a reduce buffer)."""
    a = n.attrs
    if n.op.name != "boxing" or a.get("seq") is None or len(a.get("group", ())) < 2:
        return None
    name = _BUCKETS.get((a.get("src"), a.get("dst")))
    if name is None or name == "all_reduce_bucket":
        return name
    x = n.inputs[0]
    return name if rows_bucketable(Meta(x.shape, x.dtype), tuple(a["shape"]),
                                   tuple(a["group"])) else None


def _merged(g: Graph, bucket: list[Node], name: str) -> tuple[Node, dict[int, Value]]:
    """One ``name`` node for ``bucket``, and old output -> new value."""
    first = bucket[0]
    attrs = {"group": first.attrs["group"], "index": first.attrs["index"],
             "seq": first.attrs["seq"]}
    if name == "all_gather_bucket":  # (a tile does not tell its tensor's shape)
        attrs = {"shapes": tuple(tuple(n.attrs["shape"]) for n in bucket), **attrs}
    whole = tuple(j for j, n in enumerate(bucket) if n.attrs["dst"] == "B")
    if name == "reduce_scatter_bucket" and whole:  # the all-reduces among the scatters
        attrs["whole"] = whole
    node = Node(REGISTRY[name], [n.inputs[0] for n in bucket], attrs, [], "")
    rename = {}
    for i, n in enumerate(bucket):
        old = n.outputs[0]
        node.outputs.append(Value(g.fresh(), old.shape, old.dtype, node, i))
        rename[id(old)] = node.outputs[-1]
    return node, rename


def run(g: Graph, ctx) -> bool:
    """The pass ``bucket_all_reduces``: ``merge`` with the cap ``ctx.bucket_cap``."""
    return merge(g, ctx.bucket_cap)


def merge(g: Graph, cap_bytes: int) -> bool:
    """Merge runs of all-reduces (and of ZeRO's reduce-scatters, and of its all-gathers)
    of ``g`` into buckets of at most ``cap_bytes`` (a single one bigger than that stays
    alone); whether ``g`` changed."""
    if cap_bytes <= 0:
        return False
    out: list[Node] = []
    rename: dict[int, Value] = {}
    bucket: list[Node] = []
    held: set[int] = set()  # ids of the pending collectives' outputs
    size = 0
    changed = False

    def flush():
        nonlocal changed, size
        if len(bucket) == 1:
            out.append(bucket[0])
        elif bucket:
            kinds = {_bucket_op(n) for n in bucket}
            # (a bucket holds collectives of one bucket op, or all-reduces among scatters)
            kind = "reduce_scatter_bucket" if "reduce_scatter_bucket" in kinds else \
                kinds.pop()
            assert kind is not None
            node, new = _merged(g, bucket, kind)
            out.append(node)
            rename.update(new)
            changed = True
        bucket.clear()
        held.clear()
        size = 0

    for n in g.nodes:
        merge = _bucket_op(n) is not None
        if bucket and (any(id(v) in held for v in n.tensor_inputs)
                       or (not merge and _communicates(n))
                       or (merge and (_key(n) != _key(bucket[0])
                                      or size + _bytes(n) > cap_bytes))):
            flush()
        n.inputs = [rename.get(id(v), v) if isinstance(v, Value) else v for v in n.inputs]
        if merge:
            bucket.append(n)
            held.add(id(n.outputs[0]))
            size += _bytes(n)
        else:
            out.append(n)
    flush()
    g.nodes = out
    if changed:
        g.outputs = [rename.get(id(v), v) for v in g.outputs]
        g.assigns = [(k, rename.get(id(v), v)) for k, v in g.assigns]
    return changed


def _communicates(n: Node) -> bool:
    """A collective (a local boxing, B -> S or -> P, is not one and has no ``seq``)."""
    return n.op.name in _COLLECTIVES and n.attrs.get("seq") is not None


def _key(n: Node) -> tuple:
    """What the members of one bucket share: ZeRO's reduce-scatters and the all-reduces of
    float tensors share one (the parameters ZeRO leaves whole are all-reduced with the
    others' reduce-scatter), and the group and dtype."""
    op = _bucket_op(n)
    if op == "all_reduce_bucket" and n.outputs[0].dtype.np.char in "fd":
        op = "reduce_scatter_bucket"
    return op, tuple(n.attrs["group"]), n.outputs[0].dtype


def _bytes(n: Node) -> int:
    """The bytes ``n`` takes in a bucket: its whole tensor (a reduce-scatter's input, an
    all-gather's result)."""
    return max(n.inputs[0].nbytes, n.outputs[0].nbytes)
