"""The step of a realised auto-parallel plan as the compiled step runs it: every collective
from the signatures global dispatch picks, forward and backward.

``auto_parallel.record`` notes the backward's ops too (what the grad rules ran, each
reading forward outputs or other backward ops' results) and where each parameter's
gradient arrived. Given a realised plan (the leaves' SBPs, every forward op's signature
as dispatch picks it), ``walk`` replays dispatch's choice (``sbp_dispatch.choose_index``,
``choose_nd`` on an N-D mesh) on each backward op from the SBPs its inputs have, so a
backward op reading a weight as it was before its forward conversion, a gradient left
partial for the next op, or a partial sum reduce-scattered rather than all-reduced, is
what the compiled step does rather than a mirror of the forward. Then the gradients'
conversions to their parameters' SBPs (``Module.to_global``'s hook at each arrival; under
ZeRO stage 2 a reduce-scatter into the shard once accumulated, and an all-gather of the
updated shard after the step), and the pass ``graph_buckets``'s merging: runs of
partial_sum -> broadcast and partial_sum -> split(0) conversions (one reduce-scatter when
it holds any: ZeRO's whole parameters' all-reduces join its gradients' reduce-scatter),
and of split(0) -> broadcast ones, become one collective until a reader of one of them,
any other collective, another kind or group, or the bucket's cap.

The walk yields the step's events in order: each op's compute (forward: its share of the
recorded node's price; backward: the grad op's own cost rule on the tiles its signature
leaves) and each collective (its kind, mesh axis, bytes and members), priced by
``price`` as ``auto_parallel`` prices conversions, with each collective's ``sync`` by the
computation since the previous one.

>>> import tessera
>>> from tessera import nn
>>> from tessera.distributed.calibrate import DEFAULT
>>> from tessera.parallel import auto_parallel as AP
>>> _ = tessera.manual_seed(0)
>>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
>>> g = AP.record(lambda x, y: nn.functional.mse_loss(model(x), y),
...               (tessera.randn(4, 8), tessera.randn(4, 8)), dict(model.named_parameters()))
>>> c = AP.build_costs(g, (2,), DEFAULT)
>>> dp = AP.realise(c, AP._dp_leaves(c))
>>> [e.what for e in walk(c, dp) if e.what != "compute"]    # the loss's count, one bucket
['local', 'all_reduce bucket']
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from tessera.distributed.graph_ops import rows_bucketable
from tessera.distributed.sbp_dispatch import choose_index, choose_nd
from tessera.ops.cost import nbytes as meta_bytes
from tessera.ops.registry import Meta
from tessera.sbp import broadcast as B, sbp as Sbp, split as S

if TYPE_CHECKING:
    from tessera.parallel.auto_parallel import Costs

__all__ = ["Event", "walk", "price", "collectives"]

# the conversions graph_buckets merges, by (source, destination)
_BUCKETED = {("P", "B"): "all_reduce", ("P", "S(0)"): "reduce_scatter",
             ("S(0)", "B"): "all_gather"}
_BUCKET_BYTES = 25 * 2 ** 20


def _family(kind: str) -> str:
    """What a bucket of ``kind`` may take in: the all-reduces and the reduce-scatters share
    one (``graph_buckets`` all-reduces the gradients ZeRO leaves whole within the
    reduce-scatter)."""
    kind = kind.split()[0]
    return "reduce" if kind in ("all_reduce", "reduce_scatter") else kind


@dataclasses.dataclass
class Event:
    """One thing the step does: ``compute`` (``seconds``), a ``conversion`` (``src`` ->
    ``dst`` of ``nbytes`` per tile before it, on mesh ``axis``), a signature's ``local``
    collective, or a bucket (``"all_reduce bucket"``...; ``members``: its conversions)."""

    what: str
    axis: int = 0
    seconds: float = 0.0
    src: Sbp = B
    dst: Sbp = B
    nbytes: float = 0.0
    members: list = dataclasses.field(default_factory=list)
    op: str = ""  # a compute's op (a backward op's name as its grad rule ran it)
    # a bucket member's tile is copied into the bucket's buffer: the compiled step has a
    # product (a weight's gradient, an updated shard) write its result there, and copies
    # the others (the sums that make 0-d and 1-d gradients: biases, norms' weights)
    copied: bool = True


def _tile_bytes(meta, sbps, hier, skip: int) -> float:
    """The bytes of ``meta``'s tile over every mesh axis but ``skip``."""
    k = 1.0
    for a, (s, n) in enumerate(zip(sbps, hier)):
        if a != skip and s.kind == "S":
            k *= n
    return meta_bytes(meta) / k


def _communicates(src, dst, n: int) -> bool:
    return n > 1 and src != dst and (src.kind, dst.kind) not in (
        ("B", "S"), ("B", "P"), ("S", "P"))


class _Walk:
    """The events of one realised plan, in the order the compiled step makes them."""

    def __init__(self, c: Costs, assign: list[int]):
        from tessera.parallel.auto_parallel import _FakePlacement
        self.c, self.hier = c, c.hierarchy
        self.place = _FakePlacement(self.hier)
        self.events: list[Event] = []
        self.pending: Event | None = None  # the open bucket
        self.read: set = set()  # the conversions of the open bucket an op reads next
        self.sbp: dict = {}
        g = c.graph
        for v, node in enumerate(g.nodes):
            cand = c.cands[v][assign[v]]
            for k in range(len(node.outs)):
                self.sbp[(v, k)] = tuple(s.outs[k] for s in cand)
        self.assign = assign
        self.last: dict = {}  # parameter node -> its gradient's last arrival
        self.gather: list[int] = []  # ZeRO: the parameters whose shards are gathered

    # ---- collectives and the buckets ----------------------------------------------
    def flush(self) -> None:
        if self.pending is not None:
            self.events.append(self.pending)
            self.pending, self.read = None, set()

    def convert(self, meta, src: tuple, dst: tuple, deferred: bool) -> None:
        """``src`` -> ``dst`` SBPs of a tensor of ``meta``, axis by axis; ``deferred``: its
        reader comes at the end of the step (a gradient's conversion, read by the update),
        else right after (the op it is converted for)."""
        for ax, n in enumerate(self.hier):
            a, b = src[ax], dst[ax]
            if not _communicates(a, b, n):
                continue
            nbytes = _tile_bytes(meta, src, self.hier, ax)
            conv = Event("conversion", ax, src=a, dst=b, nbytes=nbytes,
                         copied=len(meta.shape) < 2)
            kind = _BUCKETED.get((a.short(), b.short()))
            if kind in ("reduce_scatter", "all_gather") and \
                    not rows_bucketable(meta, tuple(meta.shape), tuple(range(n))):
                kind = None  # (fewer rows than ranks, or not float: boxed alone)
            if kind is None:
                self.flush()
                self.events.append(conv)
                continue
            p = self.pending
            if p is None or _family(p.what) != _family(kind) or p.axis != ax or \
                    sum(m.nbytes for m in p.members) + nbytes > _BUCKET_BYTES:
                self.flush()
                self.pending = p = Event(kind + " bucket", ax)
            if kind == "reduce_scatter":  # all-reduces among scatters: one reduce-scatter
                p.what = kind + " bucket"
            p.members.append(conv)
            if not deferred:
                self.read.add(id(conv))

    def local(self, cand) -> None:
        for ax, (s, n) in enumerate(zip(cand, self.hier)):
            if s.local is not None and n > 1:
                self.flush()
                self.events.append(Event("local", ax))

    def compute(self, seconds: float, op: str = "") -> None:
        if self.read:  # the op reads its inputs' conversions: their bucket runs first
            self.flush()
        self.events.append(Event("compute", seconds=seconds, op=op))

    # ---- the step -------------------------------------------------------------------
    def forward(self) -> None:
        c, g = self.c, self.c.graph
        from tessera.parallel.auto_parallel import _TRAIN
        for v, node in enumerate(g.nodes):
            if node.kind != "op":
                continue
            cand = c.cands[v][self.assign[v]]
            for i, src in enumerate(node.inputs):
                if src is not None and cand[0].ins[i] is not None:
                    self.convert(node.metas[i], self.sbp[src],
                                 tuple(s.ins[i] for s in cand), False)
            self.local(cand)
            t = float(c.node_t[v][self.assign[v]]) - float(c.comm_t[v][self.assign[v]])
            self.compute(t / _TRAIN, node.op.name if node.op is not None else "")

    def current(self, ref) -> tuple:
        """The SBP of a backward op's tensor argument: a recorded output's, or broadcast
        (a tensor made outside the noted ops, a 0-d one: dispatch takes both as such)."""
        if ref is None or ref == "const":
            return (B,) * len(self.hier)
        return self.sbp[tuple(ref)]

    def backward(self) -> None:
        c, g, hier = self.c, self.c.graph, self.hier
        arrivals: dict[int, list] = {}
        for v, ref, at in g.grads:
            arrivals.setdefault(at, []).append((v, ref))
            self.last[v] = at
        for i, node in enumerate(g.backward):
            for v, ref in arrivals.get(i, ()):
                self.arrive(v, ref, i)
            current = [self.current(r) if isinstance(m, Meta) else None
                       for r, m in zip(node.inputs, node.metas)]
            if len(hier) == 1:
                _, sig = choose_index(node.op, node.metas, node.attrs, current, hier[0])
                chosen = [sig]
            else:
                chosen = choose_nd(node.op, node.metas, node.attrs, current, self.place,
                                   node.outs)[0]
            for k, (cur, m) in enumerate(zip(current, node.metas)):
                if cur is not None and chosen[0].ins[k] is not None:
                    self.convert(m, cur, tuple(s.ins[k] for s in chosen), False)
            self.local(chosen)
            for k in range(len(node.outs)):
                self.sbp[("b", i, k)] = tuple(s.outs[k] for s in chosen)
            if node.op.name == "clone" and node.inputs == ["const"] and i in arrivals:
                continue  # eager autograd's copy of a gradient into .grad: not compiled
            t = self.tile_seconds(node, tuple(chosen)) if node.op.cost is not None else 0.0
            self.compute(t + c.prof.op_overhead, node.op.name)
        for v, ref in arrivals.get(len(g.backward), ()):
            self.arrive(v, ref, len(g.backward))
        self.flush()
        for v in self.gather:  # ZeRO: the updated shards, after the update
            meta = self.c.graph.nodes[v].outs[0]
            self.convert(meta, (S(0),) * len(hier), (B,) * len(hier), True)
        self.flush()

    def tile_seconds(self, node, chosen: tuple) -> float:
        """``_tile_seconds`` of a backward op, once per distinct op, metas, attrs and
        signature (a stack's layers repeat theirs)."""
        from tessera.parallel.auto_parallel import _node_key, _tile_seconds
        key = _node_key(node)
        if key is None:
            return _tile_seconds(node, chosen, self.hier, self.c.prof)
        key = (key, tuple((s.ins, s.outs) for s in chosen))
        t = self.c.tiles.get(key)
        if t is None:
            t = self.c.tiles[key] = _tile_seconds(node, chosen, self.hier, self.c.prof)
        return t

    def sharded(self, v: int) -> bool:
        from tessera.parallel.auto_parallel import _zero_shards
        c = self.c
        meta = c.graph.nodes[v].outs[0]
        sb = self.sbp[(v, 0)]
        dp = math.prod(n for s, n in zip(sb, self.hier) if s.kind == "B")
        return c.zero and all(s.kind == "B" for s in sb) and \
            _zero_shards(meta, dp, c.zero_min_size)

    def arrive(self, v: int, ref, at: int) -> None:
        """Parameter ``v``'s gradient (from ``ref``) arrived: ``Module.to_global``'s hook
        converts it to the parameter's SBP; under ZeRO a sharded parameter's is
        reduce-scattered into its shard once accumulated (at its last arrival) instead."""
        meta = self.c.graph.nodes[v].outs[0]
        grad = self.current(ref)
        if not self.sharded(v):
            self.convert(meta, grad, self.sbp[(v, 0)], True)
        elif self.last[v] == at:
            self.convert(meta, grad, (S(0),) * len(self.hier), True)
            self.gather.append(v)


def walk(c: Costs, assign: list[int]) -> list[Event]:
    """The events of the step of realised assignment ``assign`` (see the module)."""
    w = _Walk(c, assign)
    w.forward()
    w.backward()
    return w.events


def collectives(c: Costs, assign: list[int]) -> int:
    """How many collectives the compiled step of ``assign`` runs."""
    return sum(1 for e in walk(c, assign) if e.what != "compute")


def price(c: Costs, assign: list[int]) -> float:
    """Seconds of the step's events: compute, each collective at the profile's price of
    its conversion (a bucket of several: its latency once, each member's bytes and the
    copy into the bucket of the members the step copies, its results views of the bucket;
    a reduce-scatter's or all-gather's members packed for the collective and unpacked),
    each collective's ``sync`` by the computation since the previous one, and the
    parameters' update."""
    prof = c.prof
    t = sum(float(c.node_t[v][k]) for v, (k, node) in enumerate(zip(assign, c.graph.nodes))
            if node.kind == "param")
    since = 0.0
    for e in walk(c, assign):
        if e.what == "compute":
            t += e.seconds
            since += e.seconds
            continue
        t += event_seconds(prof, c.hierarchy, e, since)
        since = 0.0
    return t


def event_seconds(prof, hier: tuple, e: Event, since: float) -> float:
    """Seconds of collective event ``e`` (not a compute) after ``since`` seconds of
    computation since the previous collective, on a mesh of shape ``hier``."""
    from tessera.parallel.auto_parallel import _conv_seconds
    n = hier[e.axis]
    nbytes = e.nbytes + sum(m.nbytes for m in e.members)
    # (a conversion's measured price holds sync after a nominal gap: this gap's instead)
    sync = prof.sync_seconds(n, since, nbytes)
    nominal = prof.sync_seconds(n, nbytes=nbytes)
    if e.what == "conversion":
        return _conv_seconds(e.src, e.dst, e.nbytes, n, prof, False) - nominal + sync
    if e.what == "local":
        return prof.alpha_beta("all_reduce", n)[0] + sync
    if len(e.members) == 1:
        m = e.members[0]
        return _conv_seconds(m.src, m.dst, m.nbytes, n, prof, False) - nominal + sync
    kind = e.what.split()[0]
    # each member is an array the bucket handles (put into its buffer, or found there;
    # its range summed or copied; its view handed out): an op's overhead each
    handling = len(e.members) * prof.op_overhead
    if kind != "all_reduce":
        rows = _by_rows(prof, n, e.members)
        if rows is not None:
            return rows + sync + handling
    beta = prof.alpha_beta(kind, n)[1]
    t = prof.alpha_beta(kind, n)[0] + sync + handling
    for m in e.members:
        sent = (2 if kind == "all_reduce" else 1) * (n - 1) / n * m.nbytes
        t += sent / beta + (prof.memory_seconds(m.nbytes) if m.copied else 0.0)
        if kind != "all_reduce":  # its members' rows interleave: packed and unpacked
            t += prof.memory_seconds(m.nbytes)
    return t


def _by_rows(prof, n: int, members: list) -> float | None:
    """Seconds of ZeRO's reduce-scatter or all-gather bucket of ``members`` (without its
    sync), or None when the profile has not measured their boxing: it runs on its reduce
    buffer by rows, each member as the compiled step's boxing of that member runs it alone
    (its copy into the buffer and its rows' sums or copies; the all-gather's buffer is the
    parameters, so nothing is copied out of it), which the profile measured (``P->S(0)``,
    ``S->B``, and ``P->B`` for the all-reduced members): each member's bytes at that rate,
    less the copy of its tile into the buffer where its producer writes it there
    (``Event.copied``), the latency once."""
    alpha, t = 0.0, 0.0
    for m in members:
        zero = prof.boxing_seconds(m.src, m.dst, n, 0.0)
        full = prof.boxing_seconds(m.src, m.dst, n, m.nbytes)
        if zero is None or full is None:
            return None
        tile = m.nbytes / n if m.src.kind == "S" else m.nbytes
        put = 0.0 if m.copied else min(prof.memory_seconds(tile), full - zero)
        alpha, t = max(alpha, zero), t + full - zero - put
    return alpha + t
