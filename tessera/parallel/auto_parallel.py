"""Auto-parallel: each op's SBP signature chosen by a cost model, under a memory limit.

``search(step, args, params, placement, ...)`` records the forward ops of a training step
(one eager call under a dispatch mode: each op's input metas, attrs and producers), lists
each node's candidates from its op's ``sbp`` rule (one signature per mesh axis; leaves, the
inputs and parameters, take broadcast or a split of any dim), and prices:

* compute: the op's ``cost`` rule (FLOPs, bytes) on the tiles its signature gives each
  input and output, on the roofline of the machine profile
  (``tessera.distributed.calibrate``: a matrix product at one product's shape class, memory
  at the rate of the bytes moved), times 3 for forward and backward;
* communication: the boxing between a producer's output SBP and the SBP its consumer's
  signature wants, ``boxing.cost``'s bytes priced by the profile's alpha-beta of that
  collective, plus the conversion of the gradient back in backward (and the conversion
  again where backward reads the converted tensor); a broadcast parameter consumed by a
  distributing signature pays its gradient's all-reduce (under ZeRO: the reduce-scatter
  and the all-gather of the updated shard);
* the step's order (``_timeline``): the gradient syncs bucketed as the compiled step
  buckets them, a collective's latency per bucket, and each collective's ``sync`` by the
  computation since the previous one;
* memory per rank: parameters, gradients and optimizer state (sharded by the parameter's
  split, and by ZeRO over the data-parallel axes), the activations kept for backward at
  their tile sizes, and a boxed input that grows a tile (an all-gathered weight).

The assignment minimising time under the memory limit is Alpa's intra-op ILP (a one-hot
variable per node candidate, a pair variable per edge whose row and column sums are its
endpoints' variables) solved by ``scipy.optimize.milp`` (HiGHS) within a time limit; an
exact dynamic programme when the graph is an in-tree (chains, with weights and biases as
side branches); a greedy descent from data parallelism otherwise. The latter two meet the
memory limit by Lagrangian relaxation (bisection on the price of a byte).

The plan applied is the solution's leaves (each parameter's and input's SBP, and whether
optimizer state is sharded): the global-tensor dispatch then picks each op's signature as it
always does, and the plan's prediction is that realised assignment, priced the same way.
Data parallelism (with and without ZeRO) is priced beside it and wins ties, so the applied
plan is never predicted slower. The model cannot separate plans a few percent apart, so the
plan keeps its runners-up (``plan.runners_up``): up to ``_RUNNERS_UP`` other plans predicted
within ``_NEAR`` times its step (the other ZeRO setting's plans, the descent's best other
leaves), each of another kind (``_kind_of``). In ``nn.Graph`` the first call measures the
plan beside data parallelism and the runners-up (``guard``), and keeps another only when
the plan is clearly slower than it, so the plan is not measured slower than data
parallelism either.

>>> import tessera
>>> from tessera import nn
>>> from tessera.distributed.calibrate import DEFAULT
>>> model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
>>> def step(x, y):
...     return nn.functional.mse_loss(model(x), y)
>>> plan = search(step, (tessera.randn(1024, 16), tessera.randn(1024, 4)),
...               dict(model.named_parameters()), tessera.placement("cpu", list(range(8))),
...               solver="dp", profile=DEFAULT)
>>> plan.strategy, plan.input_sbps[0]
('data parallel', ('S(0)',))
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from tessera import _dispatch
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import STATE
from tessera.distributed import boxing
from tessera.distributed.sbp_dispatch import _find, _tiled, choose_index, choose_nd
from tessera.ops.cost import nbytes as meta_bytes
from tessera.ops.registry import Meta, OpDef
from tessera.sbp import Signature, broadcast as B, partial_sum as P, sbp as Sbp, split as S

if TYPE_CHECKING:  # (imported on use: ``python -m tessera.distributed.calibrate`` runs it)
    from tessera.distributed.calibrate import Profile

__all__ = ["OpGraph", "Node", "Plan", "search", "record", "build_costs", "solve",
           "brute_force", "price", "parse_bytes", "SOLVERS"]

SOLVERS = ("ilp", "dp", "greedy")
# optimizer state per parameter element, in parameter sizes
_STATE = {"Adam": 2, "AdamW": 2, "SGD": 1, "none": 0}
# an auto plan's ZeRO shards parameters of at least this many elements, as
# ``enable_zero``'s default (every one when that is what fits): the smaller ones' state is
# a sliver of the whole, and each sharded one is a member of the step's reduce-scatter and
# all-gather buckets (bench autoparallel: GPT-mini's ZeRO step with every parameter sharded
# ran about 5% slower)
ZERO_MIN_SIZE = 1024
# forward + backward compute relative to forward
_TRAIN = 3.0
# the collective a conversion runs, forward and for the gradient in backward
_FWD = {("P", "B"): "all_reduce", ("P", "S"): "reduce_scatter", ("S", "B"): "all_gather",
        ("S", "S"): "all_to_all", ("B", "P"): "local", ("S", "P"): "local"}
_BWD = {("P", "S"): "all_gather", ("S", "B"): "reduce_scatter", ("S", "S"): "all_to_all",
        ("B", "S"): "all_gather"}
# the same as the gradient's conversion, (source, destination) of the forward's (the
# profile's boxing transitions)
_BWD_SBPS = {("P", "S"): lambda a, b: (b, B), ("S", "B"): lambda a, b: (P, a),
             ("S", "S"): lambda a, b: (b, a), ("B", "S"): lambda a, b: (b, B)}


def parse_bytes(v) -> float:
    """``"8GB"``, ``"512MiB"``, ``1e9`` or None (no limit) as bytes.

    >>> parse_bytes("8GB"), parse_bytes("1.5KiB"), parse_bytes(None)
    (8000000000.0, 1536.0, inf)
    """
    if v is None:
        return math.inf
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
        return float(v)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kKmMgGtT]?)(i?)[bB]?\s*", str(v))
    if not m:
        raise ValueError(f"enable_auto_parallel: memory_limit must be a positive number of "
                         f"bytes or a string such as '8GB', got {v!r}")
    base = 1024 if m.group(3) else 1000
    return float(m.group(1)) * base ** " kmgt".index(m.group(2).lower() or " ")


# ---- the graph ------------------------------------------------------------------------------

@dataclasses.dataclass
class Node:
    """One node of the recorded step: an op call, or a leaf (an input or a parameter)."""

    name: str
    kind: str                    # "op", "input", "param", "const"
    op: OpDef | None = None
    metas: list = dataclasses.field(default_factory=list)   # the op's arguments
    attrs: dict = dataclasses.field(default_factory=dict)
    outs: list = dataclasses.field(default_factory=list)    # output metas
    # per argument: (producer node, its output) or None
    inputs: list = dataclasses.field(default_factory=list)
    requires_grad: bool = False


@dataclasses.dataclass
class OpGraph:
    """The recorded forward of a step: nodes in execution order; and its backward, the ops
    the grad rules ran (``Node``s whose inputs name forward outputs as ``(node, output)``
    and backward ones as ``("b", op, output)``), with each gradient a parameter's hooks
    saw: (parameter node, its producer, how many backward ops had run)."""

    nodes: list
    backward: list = dataclasses.field(default_factory=list)
    grads: list = dataclasses.field(default_factory=list)

    def edges(self) -> list[tuple[int, int, int, int]]:
        """(producer, output, consumer, argument) of every tensor an op reads."""
        return [(src[0], src[1], v, i) for v, n in enumerate(self.nodes)
                for i, src in enumerate(n.inputs) if src is not None]


class _Recorder:
    """A dispatch mode noting each forward op call (grad mode on: backward runs with it off)
    with its producers, and running it."""

    def __init__(self, nodes: list, where: dict):
        self.nodes, self.where = nodes, where
        self.keep: list[Tensor] = []
        self.backward: list[Node] = []

    def _run(self, fn, op, args, attrs, target=None):
        _dispatch.pop_mode()
        try:
            out = fn()
        finally:
            _dispatch.push_mode(self)
        if op.sbp is not None:
            if STATE.enabled:
                self._note(op, args, attrs, out, target)
            else:
                self._note_backward(op, args, attrs, out)
        return out

    def _note_backward(self, op, args, attrs, out):
        metas, inputs = [], []
        for a in args:
            if isinstance(a, Tensor):
                metas.append(Meta(tuple(a._shape), a._dtype))
                # a tensor made outside any noted op (backward's seed) is the same on
                # every rank: broadcast
                inputs.append(self.where.get(id(a), "const" if a._shape != () else None))
            else:
                metas.append(a)
                inputs.append(None)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        i = len(self.backward)
        self.backward.append(Node(f"{op.name}.b{i}", "op", op, metas, dict(attrs),
                                  [Meta(tuple(o._shape), o._dtype) for o in outs
                                   if isinstance(o, Tensor)], inputs))
        for k, o in enumerate(outs):
            if isinstance(o, Tensor):
                self.where[id(o)] = ("b", i, k)
                self.keep.append(o)

    def _note(self, op, args, attrs, out, target):
        metas, inputs, rg = [], [], False
        for a in args:
            if isinstance(a, Tensor):
                metas.append(Meta(tuple(a._shape), a._dtype))
                src = self.where.get(id(a))
                if src is None and a._shape != ():
                    src = self._const(a)
                inputs.append(src)
                rg = rg or bool(src is not None and self.nodes[src[0]].requires_grad)
            else:
                metas.append(a)
                inputs.append(None)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        v = len(self.nodes)
        self.nodes.append(Node(f"{op.name}{v}", "op", op, metas, dict(attrs),
                               [Meta(tuple(o._shape), o._dtype) for o in outs
                                if isinstance(o, Tensor)], inputs, rg))
        for k, o in enumerate(outs):
            if isinstance(o, Tensor):
                self.where[id(o)] = (v, k)
                self.keep.append(o)  # ids stay unique while recording

    def _const(self, a: Tensor):
        v = len(self.nodes)
        self.nodes.append(Node(f"const{v}", "const", outs=[Meta(tuple(a._shape), a._dtype)]))
        self.where[id(a)] = (v, 0)
        self.keep.append(a)
        return (v, 0)

    def dispatch(self, op, args, attrs):
        return self._run(lambda: _dispatch.dispatch(op, *args, **attrs), op, args, attrs)

    def dispatch_inplace(self, op, target, args, attrs):
        return self._run(lambda: _dispatch.dispatch_inplace(op, target, *args, **attrs),
                         op, args, attrs, target)


def record(step, args, params: dict) -> OpGraph:
    """The forward ops of ``step(*args)`` (``params``: name -> parameter), and the backward
    ops (the step's own ``backward()``, or else one from what it returns). ``step`` runs
    once, eagerly; parameters' gradients are left as they were."""
    nodes: list[Node] = []
    where: dict = {}
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            where[id(a)] = (len(nodes), 0)
            nodes.append(Node(f"input{i}", "input", outs=[Meta(tuple(a._shape), a._dtype)]))
    for name, p in params.items():
        where[id(p)] = (len(nodes), 0)
        nodes.append(Node(name, "param", outs=[Meta(tuple(p._shape), p._dtype)],
                          requires_grad=bool(p.requires_grad)))
    grads = {id(p): p._grad for p in params.values()}
    rec = _Recorder(nodes, where)
    seen: list = []
    hooks = [p.register_hook(functools.partial(_seen, seen, rec, v))
             for v, p in enumerate(params.values(), len(nodes) - len(params))
             if p.requires_grad]
    _dispatch.push_mode(rec)
    try:
        out = step(*args)
        if not rec.backward and isinstance(out, Tensor) and out.requires_grad:
            out.backward()
    finally:
        _dispatch.pop_mode()
        for h in hooks:
            h.remove()
        for p in params.values():
            p._grad = grads[id(p)]
    return OpGraph(nodes, rec.backward, seen)


def _seen(seen: list, rec: _Recorder, v: int, grad: Tensor) -> None:
    """A parameter hook while recording: parameter node ``v``'s gradient arrived."""
    seen.append((v, rec.where.get(id(grad), "const"), len(rec.backward)))


# ---- candidates and prices ---------------------------------------------------------------

@dataclasses.dataclass
class Costs:
    """Each node's candidates (a tuple of 1-D signatures, one per mesh axis) and their time
    and memory; each edge's time and memory per candidate pair."""

    graph: OpGraph
    hierarchy: tuple
    zero: bool
    cands: list          # per node: [tuple[Signature, ...]]
    node_t: list         # per node: np.ndarray (candidates)
    node_m: list
    edges: list          # (u, ou, v, iv)
    edge_t: list         # per edge: np.ndarray (cands u x cands v)
    edge_m: list
    comm_t: list         # per node: the communication part of node_t (a local collective)
    prof: Any = None     # the profile priced with
    # ZeRO shards a parameter's state only from this many elements (graph.config's
    # ``shard_min_size``); smaller ones are all-reduced as in data parallelism
    zero_min_size: int = 1
    params: list | None = None  # per node: the nodes reading it, made on use
    # the step walk's backward ops priced on their signatures' tiles, by what they depend on
    tiles: dict = dataclasses.field(default_factory=dict)


def _leaf_sbps(meta: Meta, hier: tuple, param: bool) -> list[tuple]:
    one = [B] + [S(d) for d in range(len(meta.shape))]
    out = []
    for combo in itertools.product(one, repeat=len(hier)):
        ok, sizes = True, list(meta.shape)
        for s, n in zip(combo, hier):
            if s.dim is not None:
                if sizes[s.dim] < n:
                    ok = False
                    break
                sizes[s.dim] = -(-sizes[s.dim] // n)
        if ok:
            out.append(combo)
    return out


def _candidates(node: Node, hier: tuple) -> list[tuple]:
    if node.kind != "op":
        sbps = [(B,) * len(hier)] if node.kind == "const" else \
            _leaf_sbps(node.outs[0], hier, node.kind == "param")
        return [tuple(Signature((), (s,)) for s in combo) for combo in sbps]
    assert node.op is not None and node.op.sbp is not None  # (recorded only with a rule)
    rule = node.op.sbp
    # as choose_nd sees them: axis k's rule on the tiles the outer axes' signatures leave
    # (a view of a batch split on axis 0 may split another dim of the tile on axis 1), on
    # every tile shape they make; a local computation on the last axis only
    tensors = [() if isinstance(m, Meta) else None for m in node.metas]
    out: list[tuple] = []

    def extend(chosen: list) -> None:
        axis = len(chosen)
        if axis == len(hier):
            out.append(tuple(chosen))
            return
        last = axis == len(hier) - 1
        sigs: list | None = None
        for coords in itertools.product(*(range(m) for m in hier[:axis])):
            tiled, attrs = _tiled(node.op, node.metas, node.attrs, tensors, chosen, coords,
                                  hier, node.outs)
            got = [s for s in rule(*tiled, mesh_size=hier[axis], **attrs)
                   if last or s.local is None or rule.whole is not None]
            sigs = got if sigs is None else [s for s in sigs if _find(s, got) >= 0]
        for s in sigs or ():
            extend(chosen + [s])
    extend([])
    return out[:64]


def _shard(sbps: tuple, hier: tuple) -> float:
    k = 1.0
    for s, n in zip(sbps, hier):
        if s is not None and s.kind == "S":
            k *= n
    return k


def _distributes(cand: tuple, axis: int) -> bool:
    return any(o.kind != "B" for o in cand[axis].outs)


# ops whose FLOPs are matrix products, one per index of the output's leading dims (a
# batched matmul, attention's per head): priced at the rate of one product's shape class
_PRODUCTS = frozenset({"matmul", "scaled_dot_product_attention",
                       "scaled_dot_product_attention_backward"})


def _roofline(op, c, outs, prof: Profile) -> float:
    # (an op's bytes at the stream's rate, not the caches' of the profile's curve: the
    # compiled step's generated elementwise kernels moved theirs at under half a 64 MB
    # copy's rate, a layer norm's four tensors of 256 KB in 60 us, while the curve's
    # copies of the update's and the buckets' sizes match what those moved)
    products = math.prod(outs[0].shape[:-2]) if op.name in _PRODUCTS and outs and \
        len(outs[0].shape) > 2 else 1
    return max(prof.gemm_seconds(c.flops, products, c.product_dim or None),
               (c.bytes_read + c.bytes_written) / prof.bandwidth)


def _op_seconds(node: Node, prof: Profile) -> float:
    assert node.op is not None and node.op.cost is not None
    c = node.op.cost(list(node.metas), list(node.outs), **node.attrs)
    return _roofline(node.op, c, node.outs, prof)


def _tile_seconds(node: Node, cand: tuple, hier: tuple, prof: Profile) -> float:
    """Seconds of op ``node`` on one rank under signature ``cand`` (one per mesh axis): its
    cost rule on the tiles the signature gives each input and output. A split input shrinks
    the work; a partial-sum or broadcast one does not, so an op reading a partial sum
    (a matmul of a gradient left partial by the next op's backward) does all its FLOPs on
    every rank although its output is not broadcast (dividing by the axes whose output is
    not broadcast charged it half)."""
    assert node.op is not None and node.op.cost is not None
    zero = (0,) * len(hier)
    metas = [m if not isinstance(m, Meta) or any(s.ins[i] is None for s in cand) else
             m._replace(shape=boxing.tile_shape(tuple(m.shape), tuple(s.ins[i] for s in cand),
                                                zero, hier))
             for i, m in enumerate(node.metas)]
    outs = [m._replace(shape=boxing.tile_shape(tuple(m.shape), tuple(s.outs[j] for s in cand),
                                               zero, hier))
            for j, m in enumerate(node.outs)]
    attrs = node.attrs
    names = [k for k in node.op.sbp.shape_attrs if k in attrs] if node.op.sbp else []
    if names and outs:
        attrs = dict(attrs, **{k: tuple(outs[0].shape) for k in names})
    try:
        c = node.op.cost(metas, outs, **attrs)
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError):
        f = math.prod(n for a, n in enumerate(hier) if _distributes(cand, a))
        return _op_seconds(node, prof) / f
    return _roofline(node.op, c, outs, prof)


def _conv_seconds(src: Sbp, dst: Sbp, nbytes: float, n: int, prof: Profile, grad: bool
                  ) -> float:
    """Seconds of converting a tensor of ``nbytes`` from ``src`` to ``dst`` on a mesh axis
    of ``n`` ranks, and (``grad``) its gradient back in backward: the profile's measured
    ``to_global`` of that transition where it has one (copies and dispatch included),
    else the collective's alpha-beta on ``boxing.cost``'s bytes and an op's overhead."""
    if src == dst or n == 1:
        return 0.0
    k = (src.kind, dst.kind)
    # each collective also waits out the ranks' skew (the profile's sync)
    sync = prof.sync_seconds(n, nbytes=nbytes) * ((_FWD.get(k, "local") != "local") +
                                   (grad and k in _BWD))
    fwd = prof.boxing_seconds(src, dst, n, nbytes)
    if fwd is not None:
        back = _BWD_SBPS[k](src, dst) if k in _BWD_SBPS else None
        bwd = prof.boxing_seconds(*back, n, nbytes) if grad and back is not None else 0.0
        if bwd is not None:
            return fwd + bwd + sync
    sent = boxing.cost(src, dst, nbytes, n)
    t = 2 * prof.op_overhead + sync
    kind = _FWD.get(k)
    if kind == "local":
        # a partial result made locally is charged the reduction it defers (boxing.cost)
        t += sent / prof.alpha_beta("reduce_scatter", n)[1]
    elif kind is not None:
        t += prof.comm_seconds(kind, n, sent)
    else:
        t += prof.memory_seconds(sent)  # a local slice
    bk = _BWD.get(k)
    if grad and bk is not None:
        t += prof.comm_seconds(bk, n, boxing.cost(dst, src, nbytes, n) if bk != "all_gather"
                               else (n - 1) / n * nbytes)
    return t


def _zero_shards(meta: Meta, dp: int, min_size: int) -> bool:
    """Whether ZeRO shards a data-parallel parameter of ``meta`` over ``dp`` ranks
    (``graph_zero``: at least ``min_size`` elements and a row for each rank)."""
    return dp > 1 and math.prod(meta.shape) >= min_size and len(meta.shape) > 0 and \
        meta.shape[0] >= dp


def _node_key(node: Node):
    """A hashable key of what a node's candidates and prices depend on (its kind, op,
    argument metas, outputs and attrs), or None (an attr that cannot be hashed)."""
    items = tuple((k, tuple(v) if type(v) is list else v) for k, v in node.attrs.items())
    key = (node.kind, id(node.op), tuple(node.metas), tuple(node.outs), items,
           node.requires_grad)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _node_prices(node: Node, cands: list, hier: tuple, prof: Profile, zero: bool, state: int,
                 zero_min_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seconds, bytes per rank, the seconds' communication) of each of a node's
    candidates."""
    ts, ms, cs = [], [], []
    priced = node.kind == "op" and node.op is not None and node.op.cost is not None
    for cand in cands:
        out_sbps = [tuple(s.outs[j] for s in cand) for j in range(len(node.outs))]
        if node.kind == "op":
            # a signature with its own local computation communicates (a mean over a
            # split dim all-reduces its count, a loss its sum): a collective's latency
            local = sum(prof.alpha_beta("all_reduce", n)[0] + prof.sync_seconds(n)
                        for s, n in zip(cand, hier) if s.local is not None and n > 1)
            op_s = _tile_seconds(node, cand, hier, prof) if priced else 0.0
            ts.append(_TRAIN * (op_s + prof.op_overhead) + local)
            cs.append(local)
            ms.append(sum(meta_bytes(m) / _shard(s, hier)
                          for m, s in zip(node.outs, out_sbps)))
        elif node.kind == "param":
            size = meta_bytes(node.outs[0])
            sh = _shard(out_sbps[0], hier)
            dp = math.prod(n for s, n in zip(out_sbps[0], hier) if s.kind == "B")
            z = dp if zero and _zero_shards(node.outs[0], dp, zero_min_size) else 1
            # the parameter, its gradient (stage 2 shards it too) and the state
            ms.append(size / sh * (1 + (1 + state) / z))
            # the update reads the parameter, its gradient and the state and writes the
            # parameter and the state, of its shard: ZeRO's update runs on 1/z of the
            # elements (the gradient's and the parameter's copies into and out of the
            # reduce-scatter's and the all-gather's buckets are priced with those, as
            # the step's buckets' copies)
            ts.append(prof.update_seconds(size / sh / z * (3 + 2 * state)))
            cs.append(0.0)
        else:
            ms.append(meta_bytes(node.outs[0]) / _shard(out_sbps[0], hier)
                      if node.kind == "input" else 0.0)
            ts.append(0.0)
            cs.append(0.0)
    return np.array(ts), np.array(ms), np.array(cs)


def build_costs(g: OpGraph, hier: tuple, prof: Profile, zero: bool = False,
                optimizer: str = "Adam", zero_min_size: int = 1, like: Costs | None = None
                ) -> Costs:
    """Every node's candidates and prices on a mesh of shape ``hier`` (``zero``: optimizer
    state sharded over the data-parallel ranks, for parameters of at least
    ``zero_min_size`` elements). ``like``: the same problem with the other ZeRO setting
    (the same graph, mesh, profile and optimizer), whose candidates, and the prices ZeRO
    leaves alone, are taken as they are: only the parameters and the edges out of them
    are priced again. A stack's layers repeat their nodes and edges: each distinct one is
    priced once."""
    state = _STATE.get(optimizer, 2)
    cands: list = []
    node_t, node_m, comm_t = [], [], []
    known: dict = {}
    for v, node in enumerate(g.nodes):
        if like is not None and node.kind != "param":
            cands.append(like.cands[v])
            node_t.append(like.node_t[v])
            node_m.append(like.node_m[v])
            comm_t.append(like.comm_t[v])
            continue
        key = _node_key(node)
        hit = known.get(key) if key is not None else None
        if hit is None:
            cs = like.cands[v] if like is not None else _candidates(node, hier)
            hit = (cs, *_node_prices(node, cs, hier, prof, zero, state, zero_min_size))
            if key is not None:
                known[key] = hit
        cands.append(hit[0])
        node_t.append(hit[1])
        node_m.append(hit[2])
        comm_t.append(hit[3])
    edges = g.edges() if like is None else like.edges
    edge_t, edge_m = [], []
    seen: dict = {}
    # each node's output SBPs per candidate, its input SBPs and the axes it distributes
    outs: dict = {}
    ins: dict = {}
    for e, (u, ou, v, iv) in enumerate(edges):
        if like is not None and g.nodes[u].kind != "param":
            edge_t.append(like.edge_t[e])
            edge_m.append(like.edge_m[e])
            continue
        meta = g.nodes[u].outs[ou]
        size = meta_bytes(meta)
        grad = g.nodes[u].requires_grad
        param = g.nodes[u].kind == "param"
        # autograd keeps the tensor as it was before the conversion, so a backward that
        # reads it (for another input's gradient: a matmul's weight) converts it again
        again = _reread(g, v, iv)
        if (u, ou) not in outs:
            outs[(u, ou)] = tuple(tuple(s.outs[ou] for s in cu) for cu in cands[u])
        if (v, iv) not in ins:
            ins[(v, iv)] = (tuple(tuple(s.ins[iv] for s in cv) for cv in cands[v]),
                            tuple(tuple(_distributes(cv, ax) for ax in range(len(hier)))
                                  for cv in cands[v]))
        srcs, (dsts, dist) = outs[(u, ou)], ins[(v, iv)]
        zs = tuple(zero and _zero_shards(meta, n, zero_min_size) for n in hier)
        key = (srcs, dsts, dist, size, grad, param, again, zs)
        if key not in seen:
            seen[key] = _edge_prices(srcs, dsts, dist, size, grad, param, again, zs, hier,
                                     prof)
        et, em = seen[key]
        edge_t.append(et)
        edge_m.append(em)
    return Costs(g, hier, zero, cands, node_t, node_m, edges, edge_t, edge_m, comm_t, prof,
                 zero_min_size)


def _edge_prices(srcs, dsts, dist, size: float, grad: bool, param: bool, again: bool, zs,
                 hier: tuple, prof: Profile) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, bytes grown) of an edge carrying ``size`` bytes per candidate pair: the
    producer's output SBPs ``srcs``, the consumer's input SBPs ``dsts`` and which mesh axes
    its signature distributes (``dist``); ``grad``: the tensor has a gradient, ``param``:
    it is a parameter (``zs``: ZeRO shards it, per axis), ``again``: the consumer's
    backward reads it (converted again)."""
    et = np.zeros((len(srcs), len(dsts)))
    em = np.zeros_like(et)
    for a_i, src in enumerate(srcs):
        for b_i, dst in enumerate(dsts):
            if any(d is None for d in dst):
                et[a_i, b_i] = 1e9  # the signature does not take a tensor here
                continue
            t = 0.0
            for ax, n in enumerate(hier):
                other = _shard(src[:ax] + src[ax + 1:], hier[:ax] + hier[ax + 1:])
                t += _conv_seconds(src[ax], dst[ax], size / other, n, prof, grad)
                if again and _communicates(src[ax], dst[ax], n, _FWD):
                    t += _conv_seconds(src[ax], dst[ax], size / other, n, prof, False)
                if param and src[ax].kind == "B" and dist[b_i][ax]:
                    t += _grad_sync(size / _shard(src, hier), n, prof, zs[ax])
            et[a_i, b_i] = t
            grow = size / _shard(dst, hier) - size / _shard(src, hier)
            if grow > 0:
                em[a_i, b_i] = grow
    return et, em


def _reread(g: OpGraph, v: int, i: int) -> bool:
    """Whether op ``v``'s backward reads its argument ``i``: another argument needs a
    gradient and the op is not linear in it alone (an addition's backward reads neither)."""
    node = g.nodes[v]
    if node.op is None or node.op.name in _LINEAR_OPS:
        return False
    return any(src is not None and k != i and g.nodes[src[0]].requires_grad
               for k, src in enumerate(node.inputs))


# ops whose backward reads none of their inputs
_LINEAR_OPS = frozenset({"add", "sub", "neg", "view", "reshape", "permute", "transpose",
                         "expand", "cast", "clone", "contiguous", "split_view", "slice",
                         "squeeze", "unsqueeze", "cat", "stack", "sum", "mean"})


def _grad_sync(nbytes: float, n: int, prof: Profile, zero: bool) -> float:
    """A broadcast parameter's gradient sync on an axis of ``n`` ranks, bucketed
    (graph_buckets): a step runs one collective for many gradients, so each pays its bytes
    and its copy into the bucket, not a collective's latency (``_timeline``)."""
    t = 2 * prof.memory_seconds(nbytes)
    if zero:
        t += (n - 1) / n * nbytes / prof.alpha_beta("reduce_scatter", n)[1]
        t += (n - 1) / n * nbytes / prof.alpha_beta("all_gather", n)[1]
    else:
        t += 2 * (n - 1) / n * nbytes / prof.alpha_beta("all_reduce", n)[1]
    return t


def _consumers_of(c: Costs) -> list[list[int]]:
    if c.params is None:
        outs: list[list[int]] = [[] for _ in c.cands]
        for u, _, v, _ in c.edges:
            outs[u].append(v)
        c.params = outs
    return c.params


def _partial_grad(c: Costs, assign: list[int], p: int, ax: int) -> int:
    """How parameter ``p``'s gradient is partial on mesh axis ``ax``: 0 not (split there,
    or no consumer distributes), 1 through a consumer that distributes (the edge prices its
    bytes), 2 through views and casts first (a linear layer's transposed weight, which
    the edges do not see)."""
    outs = _consumers_of(c)
    if c.hierarchy[ax] == 1 or c.cands[p][assign[p]][ax].outs[0].kind != "B":
        return 0
    if any(_distributes(c.cands[w][assign[w]], ax) for w in outs[p]):
        return 1
    front = outs[p]
    for _ in range(3):  # views and casts between a parameter and its use
        nxt = [x for w in front for x in outs[w]]
        if any(_distributes(c.cands[x][assign[x]], ax) for x in nxt):
            return 2
        front = [x for x in nxt if not _distributes(c.cands[x][assign[x]], ax)]
    return 0


# the bytes of gradients one bucketed collective takes at most (graph_buckets' default cap)
_BUCKET_BYTES = 25e6


def _communicates(src: Sbp, dst: Sbp | None, n: int, table: dict) -> bool:
    return n > 1 and dst is not None and src != dst and \
        table.get((src.kind, dst.kind), "local") != "local"


def _timeline(c: Costs, assign: list[int]) -> float:
    """What the per-edge prices cannot see, from the order a compiled step runs in: the
    forward's ops, then the backward's in reverse, each conversion a collective where its
    consumer runs (forward) or its consumer's backward (the gradient's conversion).

    * The gradient syncs (the pass ``graph_buckets``): a parameter's gradient is
      synchronised where it is complete (at its first reader's backward) and consecutive
      syncs of one kind share a collective of up to 25 MB, while any other collective in
      between (a conversion's gradient, tensor parallelism's) starts a new one; under ZeRO
      a sharded parameter's gradient is reduce-scattered and a small one's all-reduced, so
      the two kinds alternate along the model, and the updated shards are all-gathered
      after the update. Each such collective pays its latency and ``sync``; the syncs
      whose bytes the edges do not see (``_partial_grad`` 2) their bytes too.
    * ``sync`` by the computation since the previous collective (the profile's
      ``sync_curve``): the edges charge each collective the profile's ``sync`` at a few
      layers' computation; one right after another pays less, one after a long stretch
      of computation more. Seconds added (or taken off)."""
    g, hier, prof = c.graph, c.hierarchy, c.prof
    outs = _consumers_of(c)
    t, now, last = 0.0, 0.0, 0.0
    nominal = [prof.sync_seconds(n) for n in hier]

    def collective(axes, charged: bool) -> None:
        nonlocal t, last
        for ax in axes:
            t += prof.sync_seconds(hier[ax], now - last) - (nominal[ax] if charged else 0.0)
        last = now
    into: list[list[tuple[int, int, int]]] = [[] for _ in g.nodes]
    for u, ou, v, iv in c.edges:
        into[v].append((u, ou, iv))
    # the gradient syncs ready at each node's backward: (axis, kind, bytes)
    ready: list[list[tuple[int, str, float]]] = [[] for _ in g.nodes]
    gathered = [0.0] * len(hier)
    for p, node in enumerate(g.nodes):
        if node.kind != "param" or not node.requires_grad or not outs[p]:
            continue
        for ax, n in enumerate(hier):
            how = _partial_grad(c, assign, p, ax)
            if not how:
                continue
            size = meta_bytes(node.outs[0]) / _shard(
                tuple(s.outs[0] for s in c.cands[p][assign[p]]), hier)
            sharded = c.zero and _zero_shards(node.outs[0], n, c.zero_min_size)
            if how == 2:
                t += _grad_sync(size, n, prof, sharded)
            gathered[ax] += size if sharded else 0.0
            ready[min(outs[p])].append((ax, "reduce_scatter" if sharded else "all_reduce",
                                        size))
    ops = [v for v, node in enumerate(g.nodes) if node.kind == "op"]
    for v in ops:  # forward
        cand = c.cands[v][assign[v]]
        for u, ou, iv in into[v]:
            axes = [ax for ax, n in enumerate(hier) if _communicates(
                c.cands[u][assign[u]][ax].outs[ou], cand[ax].ins[iv], n, _FWD)]
            if axes:
                collective(axes, True)
        local = [ax for ax, n in enumerate(hier) if cand[ax].local is not None and n > 1]
        if local:
            collective(local, True)
        now += float(c.node_t[v][assign[v]]) / _TRAIN
    pending: list[list] = [["", 0.0] for _ in hier]  # per axis: the open bucket's kind, bytes

    def flush(ax: int) -> None:
        kind = pending[ax][0]
        if kind:
            nonlocal t
            t += prof.alpha_beta(kind, hier[ax])[0]
            collective([ax], False)
        pending[ax] = ["", 0.0]
    for v in reversed(ops):  # backward
        now += float(c.node_t[v][assign[v]]) * (_TRAIN - 1) / _TRAIN
        cand = c.cands[v][assign[v]]
        for u, ou, iv in into[v]:
            src = c.cands[u][assign[u]]
            again = [ax for ax, n in enumerate(hier) if _reread(g, v, iv) and _communicates(
                src[ax].outs[ou], cand[ax].ins[iv], n, _FWD)]
            axes = [ax for ax, n in enumerate(hier) if g.nodes[u].requires_grad and
                    _communicates(src[ax].outs[ou], cand[ax].ins[iv], n, _BWD)]
            for each in (again, axes):
                if each:
                    for ax in range(len(hier)):
                        flush(ax)
                    collective(each, True)
        for ax, kind, size in ready[v]:
            if kind != pending[ax][0] or pending[ax][1] + size > _BUCKET_BYTES:
                flush(ax)
                pending[ax][0] = kind
            pending[ax][1] += size
    for ax, n in enumerate(hier):
        flush(ax)
        if gathered[ax]:
            for _ in range(math.ceil(gathered[ax] / _BUCKET_BYTES)):
                t += prof.alpha_beta("all_gather", n)[0]
                collective([ax], False)
    return t


def evaluate(c: Costs, assign: list[int]) -> tuple[float, float]:
    """(seconds, bytes per rank) of an assignment (a candidate index per node)."""
    t = _timeline(c, assign) + sum(float(c.node_t[v][k]) for v, k in enumerate(assign))
    m = sum(float(c.node_m[v][k]) for v, k in enumerate(assign))
    for e, (u, _, v, _) in enumerate(c.edges):
        t += float(c.edge_t[e][assign[u], assign[v]])
        m += float(c.edge_m[e][assign[u], assign[v]])
    return t, m


# ---- solvers ----------------------------------------------------------------------------------

# building the ILP (its constraint matrix, in Python), seconds per nonzero: a loaded host's
# rate, with room (2,000 nodes of a GPT stack: 150,000 nonzeros in 0.2 s)
_ILP_SECONDS_PER_NONZERO = 2e-6


def ilp_nonzeros(c: Costs) -> int:
    """The nonzeros of the ILP's constraints on ``c``: a node's one-hot row, and each edge's
    pair variables twice (its row and column sums) plus its ends' variables."""
    return sum(len(k) for k in c.cands) + sum(
        2 * et.size + et.shape[0] + et.shape[1] for et in c.edge_t)


def solve_ilp(c: Costs, limit: float, time_limit: float) -> list[int] | None:
    """Alpa's intra-op ILP by HiGHS within ``time_limit`` seconds, building included; None
    when no feasible solution is found in time, or at once when building the problem would
    take more than a quarter of the time (``ilp_nonzeros`` at ``_ILP_SECONDS_PER_NONZERO``):
    the caller falls back rather than overrunning."""
    start = time.perf_counter()
    if time_limit <= 0 or ilp_nonzeros(c) * _ILP_SECONDS_PER_NONZERO > 0.25 * time_limit:
        return None
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix
    offs, nvar = [], 0
    for cs in c.cands:
        offs.append(nvar)
        nvar += len(cs)
    eoffs = []
    for et in c.edge_t:
        eoffs.append(nvar)
        nvar += et.size
    cost = np.zeros(nvar)
    mem = np.zeros(nvar)
    for v in range(len(c.cands)):
        cost[offs[v]:offs[v] + len(c.cands[v])] = c.node_t[v]
        mem[offs[v]:offs[v] + len(c.cands[v])] = c.node_m[v]
    for e, et in enumerate(c.edge_t):
        cost[eoffs[e]:eoffs[e] + et.size] = et.ravel()
        mem[eoffs[e]:eoffs[e] + et.size] = c.edge_m[e].ravel()
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    bounds: list[int] = []  # each row's right-hand side (an equality)

    def row(terms, rhs: int) -> None:
        for col, val in terms:
            rows.append(len(bounds))
            cols.append(col)
            vals.append(val)
        bounds.append(rhs)

    for v in range(len(c.cands)):  # one candidate per node
        row([(offs[v] + k, 1.0) for k in range(len(c.cands[v]))], 1)
    for e, (u, _, v, _) in enumerate(c.edges):  # an edge pair's marginals are its ends
        nu, nv = c.edge_t[e].shape
        for a in range(nu):
            row([(eoffs[e] + a * nv + b, 1.0) for b in range(nv)] + [(offs[u] + a, -1.0)], 0)
        for b in range(nv):
            row([(eoffs[e] + a * nv + b, 1.0) for a in range(nu)] + [(offs[v] + b, -1.0)], 0)
    r = len(bounds)
    cons = [LinearConstraint(coo_matrix((vals, (rows, cols)), shape=(r, nvar)).tocsr(),
                             bounds, bounds)]
    if math.isfinite(limit):
        cons.append(LinearConstraint(mem.reshape(1, -1), -np.inf, limit))
    integrality = np.zeros(nvar)
    integrality[:eoffs[0] if eoffs else nvar] = 1  # pair variables follow their ends
    left = time_limit - (time.perf_counter() - start)
    if left <= 0:
        return None
    # in nanoseconds: HiGHS's absolute gap would stop at once on costs of microseconds
    res = milp(cost * 1e9, integrality=integrality, bounds=Bounds(0, 1), constraints=cons,
               options={"time_limit": float(left), "disp": False,
                        "mip_rel_gap": 1e-9})
    if res.x is None:
        return None
    return [int(np.argmax(res.x[offs[v]:offs[v] + len(c.cands[v])]))
            for v in range(len(c.cands))]


def _consumers(c: Costs) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in c.cands]
    for e, (u, _, v, _) in enumerate(c.edges):
        out[u].append(e)
    return out


def is_tree(c: Costs) -> bool:
    """Whether every node feeds at most one edge (chains, with leaves as side branches)."""
    return all(len(es) <= 1 for es in _consumers(c))


def _dp(c: Costs, lam: float) -> list[int]:
    """The exact minimum of time + lam * memory on an in-tree, leaves to root."""
    n = len(c.cands)
    best = [c.node_t[v] + lam * c.node_m[v] for v in range(n)]
    pick: dict = {}
    into: list[list[int]] = [[] for _ in range(n)]
    for e, (u, _, v, _) in enumerate(c.edges):
        into[v].append(e)
    total: list[np.ndarray] = []
    for v in range(n):  # recorded order is topological
        acc = best[v].copy()
        for e in into[v]:
            u = c.edges[e][0]
            m = total[u][:, None] + c.edge_t[e] + lam * c.edge_m[e]
            pick[e] = np.argmin(m, axis=0)
            acc = acc + m.min(axis=0)
        total.append(acc)
    assign = [-1] * n
    for v in reversed(range(n)):
        if assign[v] < 0:
            assign[v] = int(np.argmin(total[v]))  # a root
        for e in into[v]:
            assign[c.edges[e][0]] = int(pick[e][assign[v]])
    return assign


def _greedy(c: Costs, lam: float, start: list[int], sweeps: int = 8,
            deadline: float = math.inf) -> list[int]:
    """Coordinate descent on time + lam * memory from ``start`` (no sweep starts after
    ``deadline``)."""
    assign = list(start)
    incident: list[list[int]] = [[] for _ in c.cands]
    for e, (u, _, v, _) in enumerate(c.edges):
        incident[u].append(e)
        incident[v].append(e)
    for k in range(sweeps):
        if k and time.perf_counter() > deadline:
            break
        changed = False
        for v in range(len(c.cands)):
            tot = c.node_t[v] + lam * c.node_m[v]
            for e in incident[v]:
                u, _, w, _ = c.edges[e]
                m = c.edge_t[e] + lam * c.edge_m[e]
                tot = tot + (m[:, assign[w]] if u == v else m[assign[u], :])
            k = int(np.argmin(tot))
            if tot[k] < tot[assign[v]] - 1e-15:
                assign[v], changed = k, True
        if not changed:
            break
    return assign


def _lagrange(c: Costs, limit: float, fn, deadline: float = math.inf) -> list[int] | None:
    """``fn(lam)`` at the smallest price of a byte whose assignment fits ``limit`` (the
    bisection stops at ``deadline`` with the cheapest fitting price found)."""
    a = fn(0.0)
    if evaluate(c, a)[1] <= limit:
        return a
    lo, hi = 0.0, 1e-9
    while evaluate(c, fn(hi))[1] > limit:
        hi *= 10
        if hi > 1e6:
            return None
    for _ in range(40):
        if time.perf_counter() > deadline:
            break
        mid = (lo + hi) / 2
        if evaluate(c, fn(mid))[1] <= limit:
            hi = mid
        else:
            lo = mid
    return fn(hi)


def solve(c: Costs, limit: float, solver: str, time_limit: float, start: list[int],
          deadline: float = math.inf) -> tuple[list[int] | None, str]:
    """An assignment by ``solver`` (falling back: the ILP, when it finds nothing in time or
    its problem is too large to build in a quarter of ``time_limit``, to the DP on an
    in-tree and to greedy otherwise; the DP to greedy on a graph that is not an in-tree),
    and the solver used."""
    if solver == "ilp":
        a = solve_ilp(c, limit, time_limit)
        if a is not None:
            return a, "ilp"
    if solver != "greedy" and is_tree(c):
        return _lagrange(c, limit, lambda lam: _dp(c, lam), deadline), "dp"
    return _lagrange(c, limit, lambda lam: _greedy(c, lam, start, deadline=deadline),
                     deadline), "greedy"


def brute_force(c: Costs, limit: float = math.inf) -> tuple[list[int], float]:
    """The optimum by enumerating every assignment (small graphs: tests)."""
    best, best_t = None, math.inf
    for assign in itertools.product(*(range(len(cs)) for cs in c.cands)):
        t, m = evaluate(c, list(assign))
        if m <= limit and t < best_t - 1e-15:
            best, best_t = list(assign), t
    assert best is not None, "no assignment fits"
    return best, best_t


# ---- realising a plan through dispatch ------------------------------------------------------

class _FakePlacement:
    """What ``choose_nd`` reads of a placement, for a mesh that exists only in the model."""

    def __init__(self, hier):
        self.hierarchy = tuple(hier)


def realise(c: Costs, leaves: dict[int, int]) -> list[int]:
    """The assignment dispatch makes when the leaves take ``leaves`` (node -> candidate):
    each op's signature is the one ``sbp_dispatch`` chooses from its inputs' SBPs."""
    g, hier = c.graph, c.hierarchy
    assign = [0] * len(g.nodes)
    sbps: dict = {}
    for v, node in enumerate(g.nodes):
        if node.kind != "op":
            assign[v] = leaves.get(v, 0)
            cand = c.cands[v][assign[v]]
            sbps[(v, 0)] = tuple(s.outs[0] for s in cand)
            continue
        current = [None if src is None else sbps[src] for src in node.inputs]
        if len(hier) == 1:
            _, sig = choose_index(node.op, node.metas, node.attrs,
                                  current, hier[0])
            chosen = [sig]
        else:
            chosen = choose_nd(node.op, node.metas, node.attrs, current,
                               _FakePlacement(hier), node.outs)[0]
        k = next((i for i, cand in enumerate(c.cands[v])
                  if all(_find(s, [x]) == 0 for s, x in zip(chosen, cand))), None)
        if k is None:
            raise RuntimeError(f"auto_parallel: {node.name}: dispatch chose "
                               f"{[str(s) for s in chosen]}, not among its candidates")
        assign[v] = k
        for j in range(len(node.outs)):
            sbps[(v, j)] = tuple(s.outs[j] for s in chosen)
    return assign


def realised(c: Costs, assign: list[int]) -> tuple[float, float]:
    """(seconds, bytes per rank) of a realised assignment (each op's signature the one
    dispatch picks): the step walked as the compiled step runs it, forward and backward
    (``auto_parallel_step``), where the recorded graph has its backward; else
    ``evaluate``."""
    t, m = evaluate(c, assign)
    if c.graph.backward:
        from tessera.parallel.auto_parallel_step import price as step_price
        t = step_price(c, assign)
    return t, m


def _score(c: Costs, assign: list[int], limit: float, walk: bool = False
           ) -> tuple[float, float]:
    """Fitting first, then time: ``evaluate``'s (the polish's descent, which tries many
    leaves; ``realised`` costs ten times more) or, ``walk``, ``realised``'s."""
    t, m = realised(c, assign) if walk else evaluate(c, assign)
    return max(m - limit, 0.0), t


def polish(c: Costs, leaves: dict[int, int], limit: float, sweeps: int = 3,
           deadline: float = math.inf, seen: dict | None = None
           ) -> tuple[dict[int, int], list[int]]:
    """Coordinate descent over the leaves' SBPs on the cost of what dispatch realises from
    them (the solver's intermediate choices may differ from dispatch's); returns the leaves
    and the realised assignment. ``seen``, when given, is filled with every distinct
    realised assignment the descent visited (a tuple) and its score (the runners-up come
    from its best)."""
    leaves = dict(leaves)
    best = realise(c, leaves)
    score = _score(c, best, limit)
    if seen is not None:
        seen[tuple(best)] = score
    for _ in range(sweeps):
        changed = False
        for v in leaves:
            for k in range(len(c.cands[v])):
                if k == leaves[v] or time.perf_counter() > deadline:
                    continue
                trial = {**leaves, v: k}
                try:
                    a = realise(c, trial)
                except (RuntimeError, NotImplementedError):
                    continue  # leaves dispatch cannot run (or the model cannot price)
                s = _score(c, a, limit)
                if seen is not None:
                    seen[tuple(a)] = s
                if s < score:
                    leaves, best, score, changed = trial, a, s, True
        if not changed:
            break
    return leaves, best


# ---- the plan -------------------------------------------------------------------------------

# runners-up: plans predicted within this factor of the chosen one's step (the cost model
# does not rank plans a few percent apart, so the measured guard times them as well)
_NEAR = 1.25
# at most this many (each costs the guard's first call two compilations and a step a round)
_RUNNERS_UP = 3

@dataclasses.dataclass
class Plan:
    """The chosen plan: the leaves' SBPs to apply, and what the cost model predicts."""

    strategy: str
    placement: Any
    zero: bool
    param_sbps: dict             # name -> tuple of sbp short forms
    input_sbps: list             # per tensor input: tuple of short forms
    seconds: float               # predicted step
    memory: float                # predicted bytes per rank
    memory_limit: float
    solver: str
    solve_seconds: float
    alternatives: dict           # strategy -> (seconds, memory, fits)
    costs: Costs
    assign: list
    solved: list | None          # the solver's own assignment (before dispatch realises it)
    # data parallelism (with the plan's ZeRO setting) when the plan is another that it
    # could be measured against: what the measured guard times beside it
    baseline: Plan | None = None
    measured: dict = dataclasses.field(default_factory=dict)  # label -> measured step, s
    guard: str = ""              # what the measured guard did
    # the guard's rounds: label -> the slowest rank's step in each round, s
    guard_rounds: dict = dataclasses.field(default_factory=dict)
    # other plans predicted within _NEAR of it, best first: the guard measures them too
    runners_up: list = dataclasses.field(default_factory=list)

    def sbp_of(self, name: str) -> tuple:
        return tuple(_parse(s) for s in self.param_sbps[name])

    def inputs(self, args) -> tuple:
        """Each call's tensors made global as the plan says (each rank's copy of the
        whole, the same on every rank as in one process)."""
        out, k = [], 0
        for a in args:
            if isinstance(a, Tensor) and a._device.type != "global":
                sbps = tuple(_parse(s) for s in self.input_sbps[k])
                a = a.to_global(self.placement, (B,) * len(sbps)).to_global(sbp=sbps)
            if isinstance(a, Tensor):
                k += 1
            out.append(a)
        return tuple(out)

    def table(self) -> str:
        """Per node: the signature, compute ms, bytes moved into it, memory; totals."""
        c, g = self.costs, self.costs.graph
        moved = [0.0] * len(g.nodes)
        for e, (u, ou, v, iv) in enumerate(c.edges):
            src = tuple(s.outs[ou] for s in c.cands[u][self.assign[u]])
            dst = tuple(s.ins[iv] for s in c.cands[v][self.assign[v]])
            size = meta_bytes(g.nodes[u].outs[ou])
            moved[v] += sum(boxing.cost(a, b, size, n)
                            for a, b, n in zip(src, dst, c.hierarchy) if b is not None)
        lines = [f"auto-parallel plan on {self.placement}: {self.strategy}"
                 f"{' + ZeRO' if self.zero else ''} (solver {self.solver}, "
                 f"{self.solve_seconds * 1e3:.0f} ms)",
                 f"{'node':<28}{'signature':<34}{'compute ms':>11}{'moved B':>12}"
                 f"{'memory B':>12}"]
        for v, node in enumerate(g.nodes):
            if node.kind == "const":
                continue
            cand = c.cands[v][self.assign[v]]
            sig = " | ".join(str(s) if node.kind == "op" else s.outs[0].short() for s in cand)
            lines.append(f"{node.name[:27]:<28}{sig[:33]:<34}"
                         f"{c.node_t[v][self.assign[v]] * 1e3:>11.3f}{moved[v]:>12.0f}"
                         f"{c.node_m[v][self.assign[v]]:>12.0f}")
        lim = "no limit" if not math.isfinite(self.memory_limit) else \
            f"limit {_mb(self.memory_limit)}"
        lines.append(f"predicted step {self.seconds * 1e3:.3f} ms, memory per rank "
                     f"{_mb(self.memory)} ({lim})")
        for k, (t, m, fits) in self.alternatives.items():
            lines.append(f"  {k:<22} {t * 1e3:>10.3f} ms {_mb(m):>12}"
                         f"{'' if fits else '  (over the limit)'}")
        if self.runners_up:
            lines.append(f"runners-up (measured by the guard): {self._runners_up()}")
        if self.guard:
            lines.append(f"measured guard: {self.guard}")
        return "\n".join(lines)

    def _runners_up(self) -> str:
        return ", ".join(f"{p.strategy}{' + ZeRO' if p.zero else ''} "
                         f"{p.seconds * 1e3:.3f} ms" for p in self.runners_up)

    __str__ = table

    def explain(self) -> list[str]:
        """Each non-trivial choice with the cost of its runner-up (the best other candidate
        of that node, the rest of the plan unchanged); then the runner-up plans."""
        c, out = self.costs, []
        for v, node in enumerate(c.graph.nodes):
            if len(c.cands[v]) < 2 or node.kind == "const":
                continue
            costs = []
            for k in range(len(c.cands[v])):
                a = list(self.assign)
                a[v] = k
                costs.append(evaluate(c, a))
            k0 = self.assign[v]
            others = [k for k in range(len(costs)) if k != k0]
            r = min(others, key=lambda k: costs[k][0])
            desc = [" | ".join(str(s) if node.kind == "op" else s.outs[0].short()
                               for s in c.cands[v][k]) for k in (k0, r)]
            over = "" if costs[r][1] <= self.memory_limit else " (over the memory limit)"
            out.append(f"{node.name}: {desc[0]} ({costs[k0][0] * 1e3:.3f} ms); runner-up "
                       f"{desc[1]} ({costs[r][0] * 1e3:.3f} ms{over})")
        if self.runners_up:
            out.append(f"runner-up plans, predicted within {_NEAR:g}x and measured by the "
                       f"guard: {self._runners_up()}")
        return out


def _mb(x: float) -> str:
    return f"{x / 1e6:.2f} MB" if x >= 1e5 else f"{x / 1e3:.1f} kB"


def _parse(s: str) -> Sbp:
    return B if s == "B" else S(int(s[2:-1])) if s.startswith("S(") else \
        Sbp("P")


def _dp_leaves(c: Costs) -> dict[int, int]:
    """Data parallelism: inputs split on dim 0 over every axis (broadcast where too small),
    parameters broadcast."""
    out = {}
    for v, node in enumerate(c.graph.nodes):
        if node.kind == "input":
            want = tuple(S(0) for _ in c.hierarchy)
            out[v] = next((k for k, cand in enumerate(c.cands[v])
                           if tuple(s.outs[0] for s in cand) == want), 0)
        elif node.kind == "param":
            out[v] = next(k for k, cand in enumerate(c.cands[v])
                          if all(s.outs[0] == B for s in cand))
    return out


def search(step, args, params: dict, placement, memory_limit=None, solver: str = "ilp",
           time_limit: float = 10.0, optimizer: str = "Adam", profile: Profile | None = None,
           graph: OpGraph | None = None, agree=None) -> Plan:
    """The plan for training ``step(*args)`` (the forward and loss; ``params``: name ->
    parameter) on ``placement``: see the module's docstring. ``placement`` may have more
    ranks than the world (the cost model alone is used here). ``agree``: when every rank
    searches, a collective that returns one rank's copy of what it is given (the search's
    outcome, so that the ranks apply the same plan)."""
    if solver not in SOLVERS:
        raise ValueError(f"enable_auto_parallel: solver must be one of {list(SOLVERS)}, got "
                         f"{solver!r}")
    from tessera.distributed.calibrate import load as load_profile
    limit = parse_bytes(memory_limit)
    prof = profile or load_profile()
    g = graph or record(step, args, params)
    hier = tuple(placement.hierarchy)
    cands: dict[str, tuple] = {}
    priced: dict[str, tuple[float, float]] = {}
    walks: dict = {}

    def walked(c: Costs, a: list[int]) -> tuple[float, float]:
        key = (c.zero, c.zero_min_size, tuple(a))
        if key not in walks:
            walks[key] = realised(c, a)
        return walks[key]

    def zero_problem() -> Costs:
        """The ZeRO problem: parameters of ZERO_MIN_SIZE elements and more sharded, or
        every parameter when data parallelism with those does not fit the limit."""
        c = build_costs(g, hier, prof, True, optimizer, ZERO_MIN_SIZE, like=problems[False])
        if walked(c, realise(c, _dp_leaves(c)))[1] <= limit:
            return c
        return build_costs(g, hier, prof, True, optimizer, 1, like=problems[False])

    t0 = time.perf_counter()
    used_by: list[str] = []
    end = t0 + time_limit  # the whole search's budget, shared by ZeRO off and on
    # data parallelism is priced first, whatever the time: the plan when nothing else is
    # in time; the ZeRO problem is the first with its parameters priced again (cheap), and
    # its data parallelism is priced while there is time or when nothing fits without it
    problems = {False: build_costs(g, hier, prof, False, optimizer)}
    bases: dict[bool, list[int]] = {}
    walk_s = 0.0
    visited: dict[bool, dict] = {}  # per problem: the polish's realised assignments, scored
    for zero in (False, True):
        if zero:
            if time.perf_counter() + walk_s > end and priced["data parallel"][1] <= limit:
                break
            problems[True] = zero_problem()
        c = problems[zero]
        bases[zero] = realise(c, _dp_leaves(c))
        key = "data parallel" + (" + ZeRO" if zero else "")
        tw = time.perf_counter()
        priced[key] = walked(c, bases[zero])
        walk_s = max(walk_s, time.perf_counter() - tw)
        cands[key] = (c, bases[zero], zero, None)
    for i, (zero, c) in enumerate(problems.items()):
        now = time.perf_counter()
        fit = any(m <= limit for _, m in priced.values())
        if now >= end and fit:
            break  # the best plan found so far: nothing more starts past the deadline
        # this pass's share, less the walk of the plan it ends with and half of one for
        # what runs past a deadline (HiGHS stops a little after its limit)
        share = max(end - now, 0.0) / (len(problems) - i)
        deadline = now + max(share - 1.5 * walk_s, 0.0)
        if deadline <= now and fit:
            continue
        dp = _dp_leaves(c)
        a, used = solve(c, limit, solver, 0.75 * (deadline - now), bases[zero], deadline)
        starts = [] if a is None else \
            [{v: a[v] for v, n in enumerate(g.nodes) if n.kind != "op"}]
        if a is not None:
            used_by.append(used)
        if time.perf_counter() < deadline or not fit:
            starts.append(dp)
        seen = visited.setdefault(zero, {})
        polished = [polish(c, s, limit, deadline=deadline, seen=seen)[1] for s in starts
                    if time.perf_counter() < deadline or not fit]
        # each walked while there is time (a plan not walked in time is not taken)
        polished = [x for x in polished if (zero, tuple(x)) in walks or
                    time.perf_counter() < end or not fit]
        if not polished:
            continue
        real = _minor_broadcast(c, min(polished, key=lambda x: (
            max(walked(c, x)[1] - limit, 0.0), walked(c, x)[0])), walked, limit,
            end - walk_s)
        key = "auto" + (" + ZeRO" if zero else "")
        cands[key] = (c, real, zero, a)
        priced[key] = walked(c, real)
    # the runners-up the polish visited: its best other assignments that fit (by the
    # per-edge prices), walked with what is left of the budget
    taken = {(z, tuple(a)) for _, a, z, _ in cands.values()}
    near = sorted(((sc[1], z, a) for z, seen in visited.items() for a, sc in seen.items()
                   if sc[0] == 0 and (z, a) not in taken), key=lambda e: e[0])
    pool: list[tuple[list[int], bool, tuple[float, float]]] = []
    kinds = {_assign_kind(g, c.cands, a, z) for c, a, z, _ in cands.values()}
    for _, z, a in near:  # the best of each kind not priced yet
        kind = _assign_kind(g, problems[z].cands, a, z)
        if kind in kinds:
            continue
        if len(pool) == 2 * _RUNNERS_UP or time.perf_counter() + walk_s > end:
            break
        kinds.add(kind)
        a = _minor_broadcast(problems[z], list(a), walked, limit, end - walk_s)
        pool.append((a, z, walked(problems[z], a)))
    solve_s = time.perf_counter() - t0
    solved_by = "/".join(dict.fromkeys(used_by)) or "none"
    if agree is not None:
        # the search stops at deadlines, so on a loaded host the ranks' searches can end
        # apart: every rank takes one rank's assignments and prices (node and candidate
        # numbers are the same on every rank: the recording and candidates are; a problem
        # this rank had no time for is built now)
        mine = (solved_by, solve_s, {k: (a, z, s) for k, (_, a, z, s) in cands.items()},
                priced, pool)
        solved_by, solve_s, chosen, priced, pool = agree(mine)
        for z in ({z for _, z, _ in chosen.values()} | {z for _, z, _ in pool}) - \
                set(problems):
            problems[z] = zero_problem() if z else \
                build_costs(g, hier, prof, z, optimizer, like=problems[False])
        cands = {k: (problems[z], a, z, s) for k, (a, z, s) in chosen.items()}
    alts = {k: (t, m, m <= limit) for k, (t, m) in priced.items()}
    fits = [k for k in cands if alts[k][2]]
    if not fits:
        need = min(m for _, m, _ in alts.values())
        raise RuntimeError(f"enable_auto_parallel: no plan fits memory_limit {_mb(limit)} "
                           f"per rank on {placement} (the least any candidate needs: "
                           f"{_mb(need)})")
    key = min(fits, key=lambda k: alts[k][0])  # first on ties: data parallelism

    def make(c: Costs, assign: list, zero: bool, solved, t: float, m: float,
             strategy: str) -> Plan:
        psbps, isbps = {}, []
        for v, node in enumerate(g.nodes):
            short = tuple(s.outs[0].short() for s in c.cands[v][assign[v]])
            if node.kind == "param":
                psbps[node.name] = short
            elif node.kind == "input":
                isbps.append(short)
        return Plan(strategy, placement, zero, psbps, isbps, t, m, limit, solved_by,
                    solve_s, alts, c, assign, solved)

    def made(key: str) -> Plan:
        c, assign, zero, solved = cands[key]
        return make(c, assign, zero, solved, alts[key][0], alts[key][1],
                    _describe(c, assign) if key.startswith("auto") else "data parallel")
    plan = made(key)
    dp_key = "data parallel" if alts["data parallel"][2] else "data parallel + ZeRO"
    dp_plan = made(dp_key)
    # the runners-up: the other problem's plans and the polish's, predicted near the plan
    near_plans = [(alts[k][0], made(k)) for k in cands if alts[k][2] and k not in (key, dp_key)]
    near_plans += [(t, make(problems[z], a, z, None, t, m, _describe(problems[z], a)))
                   for a, z, (t, m) in pool if m <= limit]
    # one the walk prices below the plan is the plan (the descent ranks leaves by the
    # per-edge prices, the walk prices the step as it is compiled)
    best = min(near_plans, key=lambda e: e[0], default=None)
    if best is not None and best[0] < plan.seconds:
        near_plans.remove(best)
        near_plans.append((plan.seconds, plan))
        plan = best[1]
    # the measured guard's baseline: data parallelism, with ZeRO only when it must be
    if alts[dp_key][2] and _leaves_of(plan) != _leaves_of(dp_plan):
        plan.baseline = dp_plan
    # (a ZeRO plan whose memory is its twin's without ZeRO shards nothing: the same plan)
    seen_leaves = {_leaves_of(p): p.memory for p in (plan, dp_plan)}
    kinds = {_kind_of(p) for p in (plan, dp_plan)}
    for t, p in sorted(near_plans, key=lambda e: e[0]):
        if t > _NEAR * plan.seconds or len(plan.runners_up) == _RUNNERS_UP:
            break
        twin = seen_leaves.get(_leaves_of(p)[:2] + (not p.zero,))
        if _leaves_of(p) not in seen_leaves and (twin is None or twin != p.memory) and \
                _kind_of(p) not in kinds:
            seen_leaves[_leaves_of(p)] = p.memory
            kinds.add(_kind_of(p))
            plan.runners_up.append(p)
    return plan


# a parameter below this share of the parameters' bytes does not make a plan another kind
_MINOR = 0.01


def _minor(g: OpGraph) -> list[bool]:
    """Per parameter node of ``g`` in order: whether it holds under ``_MINOR`` of the
    parameters' bytes (a bias, a norm's weight)."""
    sizes = [meta_bytes(n.outs[0]) for n in g.nodes if n.kind == "param"]
    total = sum(sizes) or 1.0
    return [b < _MINOR * total for b in sizes]


def _minor_broadcast(c: Costs, a: list[int], walk=realised, limit: float = math.inf,
                    deadline: float = math.inf) -> list[int]:
    """Realised assignment ``a`` with each minor split parameter (under ``_MINOR`` of the
    parameters' bytes: a bias) broadcast instead, one at a time, where ``walk`` (seconds,
    bytes) prices the step lower within ``limit`` bytes, until ``deadline``
    (``time.perf_counter``). The per-edge prices the solvers use cannot see it: a
    row-parallel layer's bias split by features makes the layer's output a reduce-scatter
    and an all-gather where Megatron's broadcast bias leaves one all-reduce (bench
    autoparallel: the MLP's tensor-parallel plan so ran 6-7% slower)."""
    g = c.graph
    params = [v for v, n in enumerate(g.nodes) if n.kind == "param"]
    best = walk(c, a)
    for v, minor in zip(params, _minor(g)):
        whole = [i for i, cand in enumerate(c.cands[v])
                 if all(sg.outs[0].kind == "B" for sg in cand)]
        if not minor or not whole or a[v] in whole:
            continue
        if time.perf_counter() > deadline:
            break
        leaves = {u: a[u] for u, n in enumerate(g.nodes) if n.kind != "op"}
        leaves[v] = whole[0]
        x = realise(c, leaves)
        t = walk(c, x)
        if t[1] <= limit and t[0] < best[0]:
            a, best = x, t
    return a


def _assign_kind(g: OpGraph, cands: list, assign, zero: bool) -> tuple:
    """The kind of plan an assignment is: its inputs' SBPs, those of the parameters of at least
    ``_MINOR`` of the parameters' bytes, and ZeRO."""
    params = [v for v, n in enumerate(g.nodes) if n.kind == "param"]
    inputs = [v for v, n in enumerate(g.nodes) if n.kind == "input"]
    major = [v for v, minor in zip(params, _minor(g)) if not minor]
    return tuple(tuple(s.outs[0].short() for s in cands[v][assign[v]])
                 for v in inputs + major), zero


def _kind_of(p: Plan) -> tuple:
    """What sets plan ``p`` apart as a kind of plan (``_assign_kind`` of its assignment):
    the runners-up are of kinds other than the plan's, data parallelism's and each other's
    (a bias's SBP is settled on the walk's word, ``_minor_broadcast``: the guard's rounds
    are spent on plans of other kinds)."""
    return _assign_kind(p.costs.graph, p.costs.cands, p.assign, p.zero)


def _leaves_of(p: Plan) -> tuple:
    """What applying ``p`` sets: its parameters' and inputs' SBPs and ZeRO."""
    return tuple(sorted(p.param_sbps.items())), tuple(p.input_sbps), p.zero


def price(g: OpGraph, placement, param_sbps: dict, input_sbps: list, zero: bool = False,
          profile: Profile | None = None, optimizer: str = "Adam",
          zero_min_size: int = 1) -> tuple[float, float]:
    """(predicted seconds, bytes per rank) of a plan written by hand on the recorded step
    ``g``: ``param_sbps`` name -> SBP tuple (missing: broadcast), ``input_sbps`` an SBP
    tuple per tensor input, ``zero`` the optimizer state sharded (for parameters of at least
    ``zero_min_size`` elements, ``enable_zero``'s ``shard_min_size``); each op's signature
    is the one dispatch would choose."""
    from tessera.distributed.calibrate import load as load_profile
    hier = tuple(placement.hierarchy)
    c = build_costs(g, hier, profile or load_profile(), zero, optimizer, zero_min_size)
    leaves: dict[int, int] = {}
    k = 0
    for v, node in enumerate(g.nodes):
        if node.kind == "param":
            want = tuple(param_sbps.get(node.name, (B,) * len(hier)))
        elif node.kind == "input":
            want, k = tuple(input_sbps[k]), k + 1
        else:
            continue
        k_v = next((i for i, cand in enumerate(c.cands[v])
                    if tuple(s.outs[0] for s in cand) == want), None)
        if k_v is None:
            raise ValueError(f"auto_parallel.price: {node.name} cannot take "
                             f"{[s.short() for s in want]}")
        leaves[v] = k_v
    return realised(c, realise(c, leaves))


def _describe(c: Costs, assign: list[int]) -> str:
    """A name for the plan's kind, from its parameters' and inputs' SBPs."""
    split_params = split_inputs = False
    for v, node in enumerate(c.graph.nodes):
        sb = [s.outs[0] for s in c.cands[v][assign[v]]]
        if node.kind == "param" and any(s.kind == "S" for s in sb) and len(node.outs[0].shape) > 1:
            split_params = True
        if node.kind == "input" and any(s.kind == "S" for s in sb):
            split_inputs = True
    if split_params and split_inputs:
        return "data + tensor parallel"
    if split_params:
        return "tensor parallel"
    return "data parallel" if split_inputs else "replicated"


# ---- nn.Graph ---------------------------------------------------------------------------------

class _State:
    """What a trial step changes, to put back: parameters, buffers, gradients, optimizer
    state and hyper-parameters, learning-rate schedulers and the random state."""

    def __init__(self, graph):
        from tessera.ops.random import default_generator
        self.params = [p for m in graph._modules.values() for p in m.parameters()]
        self.values = [np.array(_whole(t), copy=True) for t in self.params]
        self.grads = [getattr(t, "_grad", None) for t in self.params]
        # buffers by owner: converting a module to global replaces its buffer objects
        self.buffers = [(mod, k, b, np.array(_whole(b), copy=True))
                        for m in graph._modules.values() for mod in m.modules()
                        for k, b in mod._buffers.items() if b is not None]
        self.rng = default_generator.get_state()
        self.groups = [[{k: v for k, v in grp.items() if k != "params"}
                        for grp in o.param_groups] for o, _ in graph._optimizers]
        self.scheds = [dict(s.__dict__) if s is not None else None
                       for _, s in graph._optimizers]
        self.graph = graph

    def restore(self) -> None:
        """Everything as it was; the parameters keep their current SBPs (the buffers go
        back to their objects, local as they were: the plan applied next converts them)."""
        from tessera.distributed._module import whole_to_global
        from tessera.distributed.global_tensor import is_global
        from tessera.nn.modules.module import tree_changed
        from tessera.ops.creation import tensor
        from tessera.ops.random import default_generator
        for t, v, grad in zip(self.params, self.values, self.grads):
            if is_global(t):
                d = t._data
                new = whole_to_global(tensor(v, dtype=t.dtype), d.placement, d.sbp)
                if d.local is not None:
                    np.copyto(d.local, new._data.local)
            else:
                np.copyto(t._data, v)
            t._grad = grad
        for mod, k, b, v in self.buffers:
            np.copyto(b._data, v)
            mod._buffers[k] = b
        tree_changed()
        default_generator.set_state(self.rng)
        for (o, sch), groups, sd in zip(self.graph._optimizers, self.groups, self.scheds):
            o.state.clear()
            for grp, saved in zip(o.param_groups, groups):
                grp.update(saved)
            if sch is not None and sd is not None:
                sch.__dict__.update(sd)


def _whole(t) -> np.ndarray:
    """The logical value of a local or global tensor (every rank: the whole)."""
    from tessera.distributed.global_tensor import is_global
    if not is_global(t):
        return t._data
    from tessera.sbp import broadcast
    b = t.detach().to_global(sbp=(broadcast,) * t._data.placement.ndim)
    return b._data.local if b._data.local is not None else np.empty(t.shape, t._data.dtype)


def _apply(graph, plan: Plan, params: dict, zero: tuple) -> None:
    """``plan``'s SBPs on the parameters, and ZeRO stage 2 when it shards optimizer state
    (else the graph's own ZeRO setting ``zero``: (stage, shard_min_size))."""
    from tessera.distributed._module import module_to_global
    if plan.zero:
        graph.config.enable_zero(True, stage=2, shard_min_size=plan.costs.zero_min_size)
    else:
        graph.config.zero_stage, graph.config.zero_shard_min_size = zero
    by_id = {id(p): plan.sbp_of(n) for n, p in params.items()}
    b = (B,) * plan.placement.ndim
    for mod in graph._modules.values():
        module_to_global(mod, plan.placement, lambda t: by_id.get(id(t), b))


# the measured guard: rounds of one step of each plan, at least this many before it decides
_GUARD_MIN_ROUNDS = 8
# it overturns the search when the plan's median ratio to data parallelism is at least
# _GUARD_MIN_RATIO and _GUARD_Z robust standard errors above 1 (a clear measurement, not
# noise); it stops early keeping the plan once the ratio is as clearly below _GUARD_WITHIN
_GUARD_MIN_RATIO = 1.02
_GUARD_WITHIN = 1.05
_GUARD_Z = 2.5
_GUARD_EVERY = 4


def guard_decision(plan_s: list[float], base_s: list[float]) -> tuple[str | None, float, float]:
    """The measured guard's verdict on rounds of paired steps (``plan_s[i]`` and
    ``base_s[i]`` timed one after the other in round ``i``): ``"base"`` when the plan is
    clearly slower than the baseline (data parallelism), ``"plan"`` when it is clearly
    within 5% of it or faster, None while the rounds leave it open (after the last round
    the plan is kept: only a clear measurement overturns the search); with the median
    ratio and its z score.

    Each round's ratio compares two steps run moments apart, so the host's load (which
    drifts over seconds) falls on both; the 20%-trimmed mean of the log ratios, with its
    standard error from the winsorized spread (Yuen's: a burst of load on one step moves
    neither much), says whether the difference is more than the rounds' noise. It is
    looked at every ``_GUARD_EVERY`` rounds (each look is a chance of a false alarm).

    >>> guard_decision([1.2, 1.25, 1.18, 1.22] * 2, [1.0] * 8)[0]
    'base'
    >>> guard_decision([1.0, 1.3, 0.8, 1.1] * 2, [1.0, 1.0, 1.0, 1.2] * 2)[0] is None
    True
    """
    mean, se = _paired_log_ratio(plan_s, base_s)
    ratio, z = math.exp(mean), mean / se
    n = len(plan_s)
    g = int(0.2 * n)
    if n < _GUARD_MIN_ROUNDS or n % _GUARD_EVERY:
        return None, ratio, z
    # Student's t for the few rounds (Cornish-Fisher: its quantile from the normal's)
    df = n - 2 * g - 1
    t = _GUARD_Z + (_GUARD_Z ** 3 + _GUARD_Z) / (4 * df)
    if z >= t and ratio >= _GUARD_MIN_RATIO:
        return "base", ratio, z
    if mean + t * se < math.log(_GUARD_WITHIN):
        return "plan", ratio, z
    return None, ratio, z


def _paired_log_ratio(a_s, b_s) -> tuple[float, float]:
    """(the 20%-trimmed mean of ``log(a_s[i] / b_s[i])``, its standard error from the
    winsorized spread): Yuen's robust comparison of paired timings (``guard_decision``).

    >>> m, se = _paired_log_ratio([2.0] * 5, [1.0] * 5)
    >>> round(math.exp(m), 6), se < 1e-3
    (2.0, True)
    """
    logs = np.sort(np.log(np.asarray(a_s, float) / np.asarray(b_s, float)))
    n = len(logs)
    g = int(0.2 * n)
    mean = float(np.mean(logs[g:n - g]))
    wins = np.clip(logs, logs[g], logs[n - 1 - g])
    se = max(float(np.std(wins, ddof=1)) if n > 1 else 1.0, 1e-3) / \
        ((1 - 2 * g / n) * math.sqrt(n))
    return mean, se


def _step_seconds(graph, args) -> float:
    """One call of ``graph``, in seconds on this rank (the tests inject timings here)."""
    t = time.perf_counter()
    graph(*args)
    return time.perf_counter() - t


class _Trial:
    """One plan under trial: its compiled steps and optimizer state, swapped in and out so
    that the guard can alternate plans step by step without compiling again."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.cache: dict = {}
        self.state: list[dict] = []

    def enter(self, graph, params: dict, zero: tuple) -> None:
        _apply(graph, self.plan, params, zero)
        graph.__dict__["_cache"] = self.cache
        graph.__dict__["_auto_plan"] = self.plan
        for (o, _), st in zip(graph._optimizers, self.state or [{}] * len(graph._optimizers)):
            o.state.clear()
            o.state.update(st)

    def leave(self, graph) -> None:
        self.state = [dict(o.state) for o, _ in graph._optimizers]


def guard(graph, args, plan: Plan, params: dict, steps: int, zero: tuple) -> Plan:
    """The measured guard: alternate training steps of ``plan``, of data parallelism
    (``plan.baseline``) and of its runners-up (``plan.runners_up``) on the first call's
    arguments, in rounds of one step of each (the order rotated each round), after two
    compiling calls each; each alternative's verdict is ``guard_decision`` on the rounds
    (the slowest rank's steps, the same on every rank), decided once, at least
    ``_GUARD_MIN_ROUNDS`` and at most ``steps`` rounds. The search's plan is kept unless it
    is clearly slower than an alternative; then the one of those with the least median
    step is (and, with none, the alternative still undecided after the last round with the
    least median below the plan's). Everything the trial steps change is put back, so
    training starts from the same state either way. Skipped when the optimizers already
    hold state (it could not be put back as it was)."""
    from tessera.distributed import comm as C
    others = ([] if plan.baseline is None else [("data parallel", plan.baseline)]) + \
        [(f"runner-up {i + 1}", p) for i, p in enumerate(plan.runners_up)]
    if not others or steps <= 0:
        return plan
    if any(o.state for o, _ in graph._optimizers):
        plan.guard = "skipped (the optimizer already holds state)"
        return plan
    state = _State(graph)
    comm = C.current()
    trials = {"auto": _Trial(plan), **{k: _Trial(p) for k, p in others}}
    for tr in trials.values():
        tr.enter(graph, params, zero)
        for _ in range(2):  # compiles the step that makes the state, then the next
            graph(*args)
        tr.leave(graph)
    labels = list(trials)
    times: dict[str, list[float]] = {k: [] for k in trials}
    verdicts: dict[str, tuple[str | None, float, float]] = {k: (None, 1.0, 0.0)
                                                            for k, _ in others}
    for r in range(max(steps, 1)):
        mine = {}
        for k in labels[r % len(labels):] + labels[:r % len(labels)]:
            trials[k].enter(graph, params, zero)
            comm.barrier()
            mine[k] = _step_seconds(graph, args)
            trials[k].leave(graph)
        every = comm.all_gather_object(mine) if comm.world_size > 1 else [mine]
        for k in times:
            times[k].append(max(e[k] for e in every))
        # (a verdict once decided stands: each pair's test stops at its decision)
        verdicts = {k: v if v[0] is not None else guard_decision(times["auto"], times[k])
                    for k, v in verdicts.items()}
        if all(v[0] is not None for v in verdicts.values()):
            break
    med = {k: float(np.median(v)) for k, v in times.items()}
    faster = [k for k, v in verdicts.items() if v[0] == "base"]
    if not faster:
        # when the rounds ran out with no verdict, the lower median is the better guess:
        # the alternatives are data parallelism and plans the model priced as near as the
        # plan itself (a plan measured at twice data parallelism's step, too noisy for a
        # verdict, gives way to it rather than to a runner-up slower than it)
        faster = [k for k, v in verdicts.items() if v[0] is None and med[k] < med["auto"]]
    best = min(faster, key=lambda k: med[k]) if faster else "auto"
    keep = trials[best].plan
    state.restore()
    _apply(graph, keep, params, zero)
    # the compiled steps hold the trial's optimizer state: the kept plan compiles afresh
    graph.__dict__["_cache"] = {}
    graph.__dict__["_auto_plan"] = None
    keep.measured = med
    keep.guard_rounds = {k: list(v) for k, v in times.items()}

    def name(k: str) -> str:
        p = trials[k].plan
        # (the plan may be a variant of data parallelism: it is named as the plan)
        return {"auto": "plan: ", "data parallel": ""}.get(k, f"{k}: ") + p.strategy + \
            (" + ZeRO" if p.zero else "")
    why = {"base": "clearly slower than", "plan": "not slower than", None: "undecided against"}
    keep.guard = (f"{len(times['auto'])} rounds of {len(trials)} plans in turn: "
                  + ", ".join(f"{name(k)} {med[k] * 1e3:.1f} ms" for k in labels) + "; "
                  + "; ".join(f"{name('auto')} {why[v]} {name(k)} (median ratio {ratio:.3f}, "
                              f"z {z:+.1f})" for k, (v, ratio, z) in verdicts.items())
                  + f": kept {name(best)}")
    keep.alternatives = plan.alternatives
    if keep is not plan:  # (what else was measured beside it; the plan is in the guard's text)
        keep.runners_up = [p for p in plan.runners_up if p is not keep]
    return keep


def plan_graph(graph, args, placement, memory_limit=None, solver: str = "ilp",
               time_limit: float = 10.0, profile: Profile | None = None,
               guard_steps: int = 32) -> Plan:
    """``nn.Graph.config.enable_auto_parallel`` on the first call: record ``build``'s
    forward eagerly (gradients, buffers and the random state put back), search, and apply
    the plan: the modules' parameters made global with their SBPs (``Module.to_global``),
    ZeRO stage 2 switched on when the plan shards optimizer state. When the plan is not
    data parallelism or has runners-up, ``guard`` times them all in alternating rounds (at
    most ``guard_steps``) and keeps another only if the plan is clearly slower than it
    (``guard_steps=0``: the prediction alone decides)."""
    from tessera.ops.random import default_generator
    names = graph._names()
    params = {names.get(id(p), f"param{k}"): p for k, p in enumerate(graph._trainable())}
    buffers = [b for m in graph._modules.values() for b in m.buffers() if b is not None]
    saved = [np.array(b._data, copy=True) for b in buffers]
    rng = default_generator.get_state()
    opts = {type(o).__name__ for o, _ in graph._optimizers}
    optimizer = next(iter(opts)) if len(opts) == 1 else "Adam"
    try:
        g = record(graph.build, args, params)
    finally:
        for b, v in zip(buffers, saved):
            np.copyto(b._data, v)
        default_generator.set_state(rng)
    from tessera.distributed import comm as C
    comm = C.current()
    agree = None if comm.world_size == 1 else \
        (lambda obj: comm.all_gather_object(obj)[0])
    plan = search(None, args, params, placement, memory_limit, solver, time_limit,
                  optimizer, profile, graph=g, agree=agree)
    zero = (graph.config.zero_stage, graph.config.zero_shard_min_size)
    if (plan.baseline is not None or plan.runners_up) and guard_steps > 0:
        return guard(graph, args, plan, params, guard_steps, zero)
    _apply(graph, plan, params, zero)
    return plan

