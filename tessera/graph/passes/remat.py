"""Rematerialization under a memory budget: choose which forward values that backward reads
are kept and which are recomputed just before backward needs them, so that the step's peak
of live intermediates is under the budget at the least recomputation cost.

The model. The *forward* is every node the step's returned values depend on; a forward node
whose outputs a later (backward or optimizer) node reads is *saved*. A plan drops some saved
nodes: each dropped node, and the forward nodes its inputs need that are not kept (their own
inputs in turn, down to kept values, graph inputs and variables), is copied once (a node
named ``<path>.remat``, ``notes["remat"]``) and the backward reads the copy; the original
then dies at its last forward use. A copy sits before the first backward reader of any
dropped node that needs it (the earliest place its value can be wanted), so the copies of
one segment run together. Random ops that draw from a generator are never copied (a
dropout's mask is a function of its seed, which the copy keeps).

Memory is the peak of the live intermediates' bytes over the node order (``peak_bytes``:
views share their base's buffer; inputs, variables and their new values are not
intermediates); the cost of a
recomputation is its op's ``cost`` rule (FLOPs, plus one unit per element it moves).
Methods:

* ``milp``: Checkmate's integer program reduced to this two-phase schedule (a keep and a
  recompute variable per forward node; Checkmate's dependency constraints; one memory row per
  distinct set of live spans), and its staged form (a recompute variable per group of
  dropped nodes and forward node, so a value may be recomputed once per backward stage),
  both solved by HiGHS (``scipy.optimize.milp``) within one time limit; the cheaper plan
  wins, and a plan found before the limit is returned with its optimality gap;
* ``sqrt``: Chen et al.'s segments: walk the saved nodes in order and keep one whenever the
  bytes dropped since the last kept one pass a segment size, the size searched over a range
  for the cheapest plan that fits;
* ``greedy``: drop, while the peak is over the budget, the kept node alive at the peak with
  the most bytes per unit of recomputation.

Every plan is checked by rewriting the graph and measuring its peak; a budget below the
peak with everything recomputable dropped raises, naming that smallest feasible budget.

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%x: float32[256]) {
...   %0: float32[256] = exp(%x)
...   %1: float32[256] = sin(%0)
...   %2: float32[] = sum(%1)
...   %3: float32[256] = cos(%0)
...   %4: float32[256] = mul(%3, %0)
...   return (%2, %4)
... }''')
>>> peak_bytes(g)
3076
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from tessera.graph.ir import Graph, Node, Value
from tessera.graph.passes.cse import is_impure
from tessera.ops.registry import Meta

__all__ = ["RematConfig", "run", "peak_bytes", "analyze", "Plan", "METHODS"]

METHODS = ("milp", "sqrt", "greedy")
_COLLECTIVE = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
               "send", "recv", "boxing")


@dataclass
class RematConfig:
    """``nn.Graph.config.enable_remat``'s settings; the pass fills ``stats``."""

    budget: float | None = None          # a fraction of the peak without remat
    budget_bytes: int | None = None
    method: str = "milp"
    time_limit: float = 30.0
    stats: dict = field(default_factory=dict)
    # how many of the graph's first outputs the forward computes (None: all of them); the
    # others (new optimizer state, written inputs) come after the backward
    forward_outputs: int | None = None


# ---- memory ----------------------------------------------------------------------------

def _roots(nodes: list) -> dict:
    """id(value) -> the value owning its buffer (views share their base's)."""
    root: dict = {}
    for n in nodes:
        src = n.inputs[0] if n.inputs and isinstance(n.inputs[0], Value) else None
        for v in n.outputs:
            root[id(v)] = root.get(id(src), src) if n.op.aliasing == "view" and src is not None \
                else v
    return root


def _profile(nodes: list, outputs: list, assigned: list | None = None) -> list[int]:
    """Bytes of live intermediate buffers while each node runs (its outputs included).
    Returned values live to the end; new values of variables (``assigned``) are state,
    counted with the variables (the executor writes them into the variables' storage)."""
    root = _roots(nodes)
    state = {id(root[id(v)]) for v in assigned or () if id(v) in root}
    end: dict = {}
    for i, n in enumerate(nodes):
        for v in n.inputs:
            if isinstance(v, Value) and id(v) in root:
                end[id(root[id(v)])] = i
    for v in outputs:
        if id(v) in root:
            end[id(root[id(v)])] = len(nodes)
    dying: dict = {}
    born = []
    for i, n in enumerate(nodes):
        made = 0
        for v in n.outputs:
            if root[id(v)] is v and id(v) not in state:
                k = max(end.get(id(v), i), i)
                dying[k] = dying.get(k, 0) + v.nbytes
                made += v.nbytes
        born.append(made)
    alive, prof = 0, []
    for i in range(len(nodes)):
        alive += born[i]
        prof.append(alive)
        alive -= dying.get(i, 0)
    return prof


def _live(g: Graph) -> tuple[list, list]:
    """(returned values, assigned values) of ``g``."""
    return list(g.outputs), [v for _, v in g.assigns]


def peak_bytes(g: Graph) -> int:
    """The most bytes of intermediates alive at once when ``g`` runs in its node order."""
    return max(_profile(g.nodes, *_live(g)), default=0)


# ---- analysis --------------------------------------------------------------------------

def _recomputable(n: Node) -> bool:
    op = n.op
    if op.cost is None or op.aliasing not in ("none", "view") or "generator" in n.attrs:
        return False
    if any(c in op.name for c in _COLLECTIVE):
        return False
    # a node drawing from a seed attribute computes the same mask again (dropout)
    return "seed" in n.attrs or not is_impure(op.name, n.attrs)


def _cost(n: Node) -> tuple[int, int]:
    """(the units a recomputation costs, its FLOPs)."""
    ins = [Meta(v.shape, v.dtype) if isinstance(v, Value) else v for v in n.inputs]
    outs = [Meta(v.shape, v.dtype) for v in n.outputs]
    rule = n.op.cost
    assert rule is not None   # _recomputable: only priced ops are copied
    try:
        c = rule(ins, outs, **n.attrs)
    except Exception:   # a rule that cannot price these arguments: count the bytes alone
        return sum(v.numel for v in n.outputs) + 1, 0
    return int(c.flops) + (int(c.bytes_read) + int(c.bytes_written)) // 4 + 1, int(c.flops)


@dataclass
class Analysis:
    """The forward, its saved nodes, and what a recomputation of each forward node needs."""

    g: Graph
    fwd: list            # indices of forward nodes, in order
    saved: list          # indices of saved forward nodes (the decisions)
    recomputable: set    # forward indices that may be copied
    parents: dict        # forward index -> forward indices producing its inputs
    children: dict       # forward index -> forward indices reading it
    late: dict           # saved index -> sorted indices of non-forward readers
    cost: dict           # forward index -> (units, FLOPs)
    size: dict           # forward index -> bytes of its (non-view) outputs
    pinned: set          # saved indices that are kept whatever the plan (not copyable)
    droppable: list      # the decisions: saved, copyable, not views
    follow: dict         # view index -> the forward index owning its buffer (or None)
    early: dict          # forward index -> its last reader running within the forward


def analyze(g: Graph, forward_outputs: int | None = None) -> Analysis:
    """The forward (what the first ``forward_outputs`` outputs depend on), its saved nodes
    and the facts the methods read."""
    index = {id(n): i for i, n in enumerate(g.nodes)}
    fwd_set: set = set()
    outs = g.outputs if forward_outputs is None else g.outputs[:forward_outputs]
    stack = [v.producer for v in outs if isinstance(v, Value) and v.producer is not None]
    while stack:
        n = stack.pop()
        i = index.get(id(n))
        if i is None or i in fwd_set:
            continue
        fwd_set.add(i)
        stack.extend(v.producer for v in n.inputs if isinstance(v, Value) and v.producer)
    fwd = sorted(fwd_set)
    roots = {id(v) for v in g.outputs}
    produced = {id(v): index[id(n)] for n in g.nodes for v in n.outputs}
    parents: dict = {i: [] for i in fwd}
    children: dict = {i: [] for i in fwd}
    late: dict = {}
    early: dict = {}   # forward index -> the last reader outside the forward that runs in it
    end = fwd[-1] if fwd else -1
    for j, n in enumerate(g.nodes):
        for v in n.inputs:
            p = produced.get(id(v)) if isinstance(v, Value) else None
            if p is None or p not in fwd_set:
                continue
            if j in fwd_set:
                if p not in parents[j]:
                    parents[j].append(p)
                    children[p].append(j)
            elif j < end:   # runs with the forward (a batch norm's running statistics)
                early[p] = max(early.get(p, j), j)
            else:
                late.setdefault(p, set()).add(j)
    view_of = _roots(g.nodes)

    def base_of(i):   # the forward node owning node i's buffer (None: an input's, a var's)
        r = view_of[id(g.nodes[i].outputs[0])] if g.nodes[i].outputs else None
        return produced.get(id(r)) if r is not None else None

    # a view read late keeps its base's buffer: the base is saved too, and the view is
    # dropped exactly when its base is (a view of an input or variable frees nothing)
    follow = {i: base_of(i) for i in fwd if g.nodes[i].op.aliasing == "view"}
    for i in list(late):
        b = follow.get(i)
        if b is not None and b in fwd_set:
            late.setdefault(b, set()).update(late[i])
    # a returned value lives to the end whatever is decided (a new value of a variable, such
    # as a batch norm's running mean, is state: its node may still be copied, and the copy's
    # state outputs go unread)
    rootset = {i for i in fwd if any(id(v) in roots for v in g.nodes[i].outputs)}
    rootset |= {follow[i] for i in rootset if follow.get(i) is not None}
    size = {i: sum(v.nbytes for v in g.nodes[i].outputs if view_of[id(v)] is v) for i in fwd}
    recomputable = {i for i in fwd if _recomputable(g.nodes[i])}
    saved = sorted(i for i in late if i not in rootset)
    pinned = {i for i in saved if i not in recomputable}
    droppable = [i for i in saved if i not in pinned and i not in follow]
    return Analysis(g, fwd, saved, recomputable, parents, children,
                    {i: sorted(late[i]) for i in saved}, {i: _cost(g.nodes[i]) for i in fwd},
                    size, pinned, droppable, follow, early)


# ---- plans -----------------------------------------------------------------------------

@dataclass
class Plan:
    dropped: frozenset      # saved forward indices recomputed for backward
    copies: dict            # (forward index, group) -> position (the node it goes before)
    cost: int
    flops: int
    keep: frozenset = frozenset()   # unsaved forward indices kept as checkpoints
    # False: each forward node is copied at most once, its copy shared by every group
    # (group -1); True: each group of dropped nodes (those backward first reads at the
    # same node, the group's key) recomputes what it needs from the kept values, so a
    # value may be recomputed once per group (Checkmate's repeated recomputation)
    multi: bool = False


def closure(a: Analysis, dropped, keep=(), multi: bool = False) -> Plan:
    """The copies a set of dropped saved nodes needs, and where each goes; a copy's
    inputs are copies too, down to kept values: saved nodes not dropped, and the forward
    nodes in ``keep`` (checkpoints that would otherwise die in the forward). With
    ``multi``, each group of dropped nodes first read at the same backward node is
    recomputed there, its copies dying with the group's reads (a dropped node's own copy,
    still alive, is shared)."""
    dropped = frozenset(dropped)
    dropped |= {i for i, b in a.follow.items() if b in dropped and i in a.late}
    kept = (set(a.saved) - dropped) | set(keep)
    groups: dict = {}
    for i in dropped:
        groups.setdefault(a.late[i][0] if multi else -1, []).append(i)
    pos: dict = {}
    for t in sorted(groups):
        need: set = set()
        stack = list(groups[t])
        while stack:
            i = stack.pop()
            if i in need:
                continue
            need.add(i)
            for p in a.parents[i]:
                if p in kept or p not in a.recomputable:
                    continue
                if multi and p in dropped and a.late[p][0] < t <= a.late[p][-1]:
                    continue   # its own copy, made for an earlier group, is still alive
                stack.append(p)
        if multi:
            pos.update({(i, t): t for i in need})
            continue
        for i in sorted(need, reverse=True):   # readers (later in the forward) first
            at = [a.late[i][0]] if i in dropped else []
            at += [pos[(c, t)] for c in a.children[i] if (c, t) in pos]
            pos[(i, t)] = min(at)
    return Plan(dropped, pos, sum(a.cost[i][0] for i, _ in pos),
                sum(a.cost[i][1] for i, _ in pos), frozenset(keep) - dropped, multi)


def _own(a: Analysis, plan: Plan, i: int) -> int:
    """The group of dropped node ``i``'s own copy (the one backward reads)."""
    return a.late[i][0] if plan.multi else -1


def rewrite_nodes(a: Analysis, plan: Plan) -> tuple[list, list]:
    """The node list with the plan's copies in place (the graph itself is not changed), and
    for each entry the original index it runs at (a copy: the node it goes before)."""
    g = a.g
    nodes = g.nodes
    made = {id(v): i for i in a.fwd for v in nodes[i].outputs}
    copy_of: dict = {}    # (id(original value), group) -> copy's value
    clones: dict = {}     # (forward index, group) -> clone

    def source(v, t):
        if not isinstance(v, Value):
            return v
        w = copy_of.get((id(v), t))
        if w is None:
            p = made.get(id(v))
            if p is not None and p in plan.dropped:
                w = copy_of.get((id(v), _own(a, plan, p)))
        return v if w is None else w

    for i, t in sorted(plan.copies, key=lambda k: (k[1], k[0])):   # groups, then forward
        n = nodes[i]
        c = Node(n.op, [source(v, t) for v in n.inputs], dict(n.attrs), [],
                 f"{n.name}.remat" if n.name else "remat", {"remat": True})
        for v in n.outputs:
            w = Value("", v.shape, v.dtype, c, v.index)
            c.outputs.append(w)
            copy_of[(id(v), t)] = w
        clones[(i, t)] = c
    before: dict = {}
    for k, at in plan.copies.items():
        before.setdefault(at, []).append(k)
    redirect = {id(v): copy_of[(id(v), _own(a, plan, i))]
                for i in plan.dropped for v in nodes[i].outputs}
    fwd = set(a.fwd)
    out, orig = [], []
    for j, n in enumerate(nodes):
        for k in sorted(before.get(j, ()), key=lambda k: (k[1], k[0])):
            out.append(clones[k])
            orig.append(j)
        if j not in fwd and redirect and any(id(v) in redirect for v in n.inputs
                                             if isinstance(v, Value)):
            n = _Redirected(n, redirect)
        out.append(n)
        orig.append(j)
    return out, orig


class _Redirected:
    """A node whose inputs read some copies: a lightweight stand-in while plans are
    compared (``apply`` makes the change for real)."""

    __slots__ = ("node", "inputs", "outputs", "op")

    def __init__(self, node, redirect):
        self.node, self.op, self.outputs = node, node.op, node.outputs
        self.inputs = [redirect.get(id(v), v) if isinstance(v, Value) else v
                       for v in node.inputs]


def evaluate(a: Analysis, plan: Plan) -> int:
    """The peak of the graph rewritten by ``plan``."""
    return max(_profile(rewrite_nodes(a, plan)[0], *_live(a.g)), default=0)


def apply(a: Analysis, plan: Plan) -> None:
    """Rewrite ``a.g`` by ``plan``: copies inserted, backward readers moved to them."""
    nodes = rewrite_nodes(a, plan)[0]
    for k, n in enumerate(nodes):
        if isinstance(n, _Redirected):
            n.node.inputs = n.inputs
            nodes[k] = n.node
        else:
            for v in n.outputs:
                if not v.name:
                    v.name = a.g.fresh()
    a.g.nodes = nodes


# ---- methods ---------------------------------------------------------------------------

class Infeasible(ValueError):
    pass


def plan_greedy(a: Analysis, budget: int, start=frozenset(), keep=None,
                multi: bool = False) -> Plan:
    """Drop, while over the budget, the saved node alive at the peak with the most bytes
    per unit of recomputation; recomputations stop at the forward's cuts (or ``keep``)."""
    dropped = set(start)
    stops = frozenset(cuts(a) if keep is None else keep)
    plan = closure(a, dropped, stops - dropped, multi)
    while True:
        nodes, orig = rewrite_nodes(a, plan)
        prof = _profile(nodes, *_live(a.g))
        peak = max(prof, default=0)
        if peak <= budget:
            return plan
        at = orig[prof.index(peak)]
        best, best_score = None, -1.0
        for i in a.droppable:
            if i in dropped or not (_last_fwd(a, i) < at <= a.late[i][-1]):
                continue
            extra = closure(a, dropped | {i}, stops - dropped, multi).cost - plan.cost
            score = a.size[i] / max(extra, 1)
            if score > best_score:
                best, best_score = i, score
        if best is None:
            best = next((i for i in a.droppable if i not in dropped), None)
            if best is None:
                raise Infeasible(peak)
        dropped.add(best)
        plan = closure(a, dropped, stops - dropped, multi)


def _greedy(a: Analysis, budget: int) -> Plan:
    """The cheaper of the greedy plans with each value recomputed once and once per group."""
    plans, smallest = [], None
    for multi in (False, True):
        try:
            plans.append(plan_greedy(a, budget, multi=multi))
        except Infeasible as e:
            smallest = int(e.args[0]) if smallest is None else min(smallest, int(e.args[0]))
    if not plans:
        raise Infeasible(smallest)
    return min(plans, key=lambda p: p.cost)


def _last_fwd(a: Analysis, i: int) -> int:
    """The last reader of forward node ``i`` that runs in the forward."""
    return max(a.children[i] + [a.early.get(i, i)])


def plan_sqrt(a: Analysis, budget: int) -> Plan:
    """Chen et al.'s segments: walk the forward's cuts in order and keep one as a
    checkpoint whenever the saved bytes since the last kept one pass the segment size;
    everything else saved is recomputed from the checkpoints. The segment size is swept
    over a range; the cheapest plan that fits wins."""
    droppable = list(a.droppable)
    if not droppable:
        return closure(a, ())
    cs = cuts(a)
    between: dict = {}   # cut -> saved bytes since the previous cut
    k, acc = 0, 0
    for i in a.fwd:
        if i in a.late and i in set(droppable):
            acc += a.size[i]
        if k < len(cs) and i == cs[k]:
            between[i], acc, k = acc, 0, k + 1
    total = max(sum(between.values()), 1)
    lo = max(min(a.size[i] for i in droppable), 1)
    best, smallest = None, None
    steps = 24
    for step in range(steps + 1):
        seg = lo * (total / lo) ** (step / steps)
        keep, acc = set(), 0
        for c in cs:
            acc += between[c]
            if acc > seg:
                keep.add(c)
                acc = 0
        for multi in (False, True):
            plan = closure(a, [i for i in droppable if i not in keep], keep, multi)
            peak = evaluate(a, plan)
            smallest = peak if smallest is None else min(smallest, peak)
            if peak <= budget and (best is None or plan.cost < best.cost):
                best = plan
    if best is None:
        raise Infeasible(smallest)
    return best


def polish(a: Analysis, plan: Plan, budget: int) -> Plan:
    """Keep again, costliest first, each dropped node whose recomputation the budget does
    not need (a plan from a conservative model may drop more than it must)."""
    dropped = set(plan.dropped)
    for i in sorted(plan.dropped, key=lambda i: -a.cost[i][0]):
        trial = closure(a, dropped - {i}, plan.keep, plan.multi)
        if trial.cost < plan.cost and evaluate(a, trial) <= budget:
            dropped.discard(i)
            plan = trial
    return plan


def _universe(a: Analysis) -> tuple[list, list, list]:
    """(droppable saved nodes, views following them, every forward node a copy may need)."""
    droppable = list(a.droppable)
    dset = set(droppable)
    views = [v for v, b in a.follow.items() if b in dset and v in a.late]
    need: set = set()
    stack = droppable + views
    while stack:
        i = stack.pop()
        if i not in need:
            need.add(i)
            stack.extend(p for p in a.parents[i] if p in a.recomputable)
    return droppable, views, sorted(need)


def _spans(a: Analysis, keepable: list, recompute: list,
           pull: bool = True) -> tuple[dict, dict]:
    """Where each decision adds bytes (inclusive original indices): a kept node from after
    its last forward reader to its last backward reader (or the latest copy reading it);
    a recomputed node from where its copy is made to the latest place it is read. With
    ``pull``, a saved node's copy counts from the earliest place a recomputed reader may
    want it (an upper bound: the plan then fits as the model says); without, from its own
    first backward reader (a lower bound: the plan is measured, and the model tightened)."""
    rset = set(recompute)
    latest: dict = {}
    rec: dict = {}
    for i in sorted(recompute, reverse=True):   # readers first
        kids = [c for c in a.children[i] if c in rset]
        own = a.late.get(i)
        first = min(([own[0]] if own else []) + [rec[c][0] for c in kids if pull or not own])
        latest[i] = own[0] if own else max(latest[c] for c in kids)
        rec[i] = (first, max(([own[-1]] if own else []) + [latest[c] for c in kids]))
    keep = {}
    for i in keepable:
        kids = [latest[c] for c in a.children[i] if c in rset]
        own = a.late.get(i)
        keep[i] = (_last_fwd(a, i) + 1, max(([own[-1]] if own else []) + kids))
    return keep, rec


def _fixed(a: Analysis, droppable: list) -> list[int]:
    """The profile with every droppable saved node dead after its last forward reader: the
    bytes no decision changes."""
    base = _profile(a.g.nodes, *_live(a.g))
    for i in droppable:
        for t in range(_last_fwd(a, i) + 1, a.late[i][-1] + 1):
            base[t] -= a.size[i]
    return base


def _events(spans) -> dict:
    """Original index -> [(column, bytes born (+) or freed (-))] of (first, last, column,
    bytes) spans."""
    events: dict = {}
    for s0, s1, c, b in spans:
        if b and s0 <= s1:
            events.setdefault(s0, []).append((c, b))
            events.setdefault(s1 + 1, []).append((c, -b))
    return events


def _memory_rows(row, events: dict, base: list, budget: int) -> None:
    """One row per run of positions with the same live decisions: their bytes within the
    budget less the run's most fixed bytes (a run that cannot pass the budget gets none)."""
    active: dict = {}
    marks = sorted(events) + [len(base)]
    for m0, m1 in zip(marks, marks[1:]):
        for c, v in events.get(m0, ()):
            active[c] = active.get(c, 0) + v
            if active[c] == 0:
                del active[c]
        seg = base[max(m0, 0):max(m1, 0)]
        if seg and active and max(seg) + sum(active.values()) > budget:
            row(list(active.items()), -float("inf"), float(budget - max(seg)))


def plan_milp(a: Analysis, budget: int, time_limit: float) -> tuple[Plan, dict]:
    """Checkmate's program over this schedule: binary keep ``k_i`` (saved nodes, and the
    unsaved ones a copy may read: checkpoints) and recompute ``r_i``; ``k_i + r_i >= 1``
    for saved nodes, ``r_i <= k_p + r_p`` for each forward input ``p``; one memory row
    per distinct set of live spans; minimise the recomputation cost."""
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix
    except ImportError as e:
        raise ImportError("nn.Graph.config.enable_remat(method='milp') needs SciPy "
                          "(pip install scipy); method='greedy' or 'sqrt' do not") from e
    droppable, views, recompute = _universe(a)
    fol = set(a.follow)
    keepable = droppable + [i for i in recompute if i not in a.late and i not in fol]
    kcol = {i: k for k, i in enumerate(keepable)}
    rcol = {i: len(keepable) + k for k, i in enumerate(recompute)}
    nvar = len(kcol) + len(rcol)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(terms, lb, ub):
        r = len(lo)
        for c, v in terms:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        lo.append(lb)
        hi.append(ub)

    for i in droppable:
        row([(kcol[i], 1.0), (rcol[i], 1.0)], 1.0, np.inf)
    for v in views:   # a view read late is recomputed when its base is dropped
        row([(kcol[a.follow[v]], 1.0), (rcol[v], 1.0)], 1.0, np.inf)
    for i in recompute:
        for p in a.parents[i]:
            if p in kcol:
                row([(kcol[p], 1.0), (rcol[p], 1.0), (rcol[i], -1.0)], 0.0, np.inf)
            elif p in rcol:
                row([(rcol[p], 1.0), (rcol[i], -1.0)], 0.0, np.inf)
    keep, rec = _spans(a, keepable, recompute)
    _, rec_low = _spans(a, keepable, recompute, pull=False)
    base = _fixed(a, droppable)

    def changes(rec) -> dict:
        return _events((s0, s1, col[i], a.size[i]) for spans, col in ((keep, kcol), (rec, rcol))
                       for i, (s0, s1) in spans.items())
    n_dep = len(lo)
    cost = np.zeros(nvar)
    for i, c in rcol.items():
        cost[c] = a.cost[i][0]
    deadline = time.perf_counter() + float(time_limit)
    info: dict = {"status": "optimal", "gap": 0.0, "variables": nvar}
    best = None
    reason = "no MILP plan passed the exact check"
    model_budget = budget
    dep = (len(vals), n_dep)
    # first the model whose copies count from the earliest place they may be made (its plan
    # fits as solved); if that leaves no plan, the optimistic one, tightened until its plan
    # passes the exact measurement
    for attempt in range(7):
        del rows[dep[0]:], cols[dep[0]:], vals[dep[0]:], lo[dep[1]:], hi[dep[1]:]
        _memory_rows(row, changes(rec if attempt == 0 else rec_low), base, model_budget)
        A = coo_matrix((vals, (rows, cols)), shape=(len(lo), nvar)).tocsr()
        left = deadline - time.perf_counter()
        if left <= 0:
            reason = "the MILP found no plan within its time limit"
            break
        res = milp(cost, integrality=np.ones(nvar), bounds=Bounds(0, 1),
                   constraints=LinearConstraint(A, np.array(lo), np.array(hi)),
                   options={"time_limit": left, "disp": False})
        info["rows"] = len(lo)
        if res.x is None:
            reason = "the MILP found no plan within its time limit" if res.status != 2 else \
                "the MILP's model has no plan under the budget"
            if attempt == 0 and res.status == 2:
                continue
            break
        dropped = {i for i in droppable if res.x[kcol[i]] < 0.5}
        kept = {i for i in keepable if i not in a.late and res.x[kcol[i]] > 0.5}
        plan = closure(a, dropped, kept)
        peak = evaluate(a, plan)
        if peak > budget:   # the same checkpoints, each group recomputing its own values
            again = closure(a, dropped, kept, True)
            if evaluate(a, again) <= budget:
                plan, peak = again, evaluate(a, again)
        if peak <= budget:
            best = plan
            info["gap"] = float(getattr(res, "mip_gap", 0.0) or 0.0)
            if res.status != 0:
                info["status"] = "time limit: best plan found"
            if attempt > 1:
                info["status"] += f" (model budget tightened {attempt - 1}x)"
            if plan.multi:
                info["status"] += ", its checkpoints' segments recomputed per group"
            break
        if attempt:
            model_budget -= peak - budget
    staged, sinfo = _staged(a, budget, deadline)
    if staged is not None and (best is None or staged.cost < best.cost):
        best, info = staged, dict(info, **sinfo)
        info["status"] += ", values recomputed per group"
    if best is None:   # no plan of the model fits: the heuristics' best, said so
        info["gap"] = None
        tried, smallest = [], -1
        for name, fn in (("sqrt", plan_sqrt), ("greedy", _greedy)):
            try:
                tried.append((fn(a, budget), name))
            except Infeasible as e:
                smallest = int(e.args[0])
        if not tried:
            raise Infeasible(smallest)
        best, name = min(tried, key=lambda pn: pn[0].cost)
        info["status"] = f"{reason}: {name} plan"
    return polish(a, best, budget), info


def _staged(a: Analysis, budget: int, deadline: float) -> tuple[Plan | None, dict]:
    """Checkmate's staged program with one stage per group: which saved nodes are kept
    (``k_i``; unsaved ones too, as checkpoints) and which forward nodes each group
    recomputes (``r_ti``: group ``t`` is the dropped nodes first read by backward node
    ``t``, as ``closure(..., multi=True)`` forms them). A group's copy of a dropped node it
    owns lives to the node's last backward reader (and serves later groups meanwhile);
    its other copies die within the group. Memory counts a kept node to the latest group
    that may read it and every copy of a group at the group's node (an upper bound, so a
    plan fits as solved unless the tightening loop says otherwise)."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix
    droppable, views, recompute = _universe(a)
    uni = set(recompute)
    fol = set(a.follow)
    keepable = droppable + [i for i in recompute if i not in a.late and i not in fol]
    kcol = {i: k for k, i in enumerate(keepable)}
    owners: dict = {}   # group -> the dropped nodes (and views of them) it owns
    for i in droppable + views:
        owners.setdefault(a.late[i][0], []).append(i)
    anc: dict = {}      # group -> every forward node its copies may need
    for t, own in owners.items():
        need: set = set()
        stack = list(own)
        while stack:
            i = stack.pop()
            if i not in need:
                need.add(i)
                stack.extend(p for p in a.parents[i] if p in uni)
        anc[t] = need
    rcol: dict = {}
    for t in sorted(anc):
        for i in sorted(anc[t]):
            rcol[(t, i)] = len(kcol) + len(rcol)
    nvar = len(kcol) + len(rcol)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(terms, lb, ub):
        for c, v in terms:
            rows.append(len(lo))
            cols.append(c)
            vals.append(v)
        lo.append(lb)
        hi.append(ub)

    def alive_own(p, t):   # the column of p's own copy when it is still alive at group t
        if p in a.late and p in uni and a.late[p][0] < t <= a.late[p][-1] and \
                (p in kcol or a.follow.get(p) in kcol):
            return rcol.get((a.late[p][0], p))
        return None

    for t, own in owners.items():
        for i in own:   # kept, or recomputed by its group (a view: when its base is dropped)
            row([(kcol[a.follow.get(i, i)], 1.0), (rcol[(t, i)], 1.0)], 1.0, np.inf)
    readers: dict = {}  # kept-able node -> the latest group that may read it
    for (t, i), c in rcol.items():
        for p in a.parents[i]:
            if p not in uni:
                continue
            terms = [(rcol[(t, p)], 1.0), (c, -1.0)]
            if p in kcol:
                terms.append((kcol[p], 1.0))
                readers[p] = max(readers.get(p, t), t)
            elif p in a.late and a.follow.get(p) in kcol:   # a view read late: kept with its base
                terms.append((kcol[a.follow[p]], 1.0))
                readers[a.follow[p]] = max(readers.get(a.follow[p], t), t)
            elif p in a.late:   # a view of an input or a variable: always there
                continue
            o = alive_own(p, t)
            if o is not None:
                terms.append((o, 1.0))
            row(terms, 0.0, np.inf)
    n_dep = (len(vals), len(lo))
    spans: list = []    # (first, last, column, bytes)
    for i in keepable:
        end = max([readers.get(i, -1)] + ([a.late[i][-1]] if i in a.late else []))
        spans.append((_last_fwd(a, i) + 1, end, kcol[i], a.size[i]))
    for (t, i), c in rcol.items():
        if t == a.late.get(i, [None])[0]:
            spans.append((t, a.late[i][-1], c, a.size[i]))
        else:
            spans.append((t, t, c, a.size[i]))
    base = _fixed(a, droppable)
    events = _events(spans)
    cost = np.zeros(nvar)
    for (t, i), c in rcol.items():
        cost[c] = a.cost[i][0]
    info: dict = {"status": "optimal", "gap": 0.0, "variables": nvar}
    model_budget = budget
    for attempt in range(5):
        del rows[n_dep[0]:], cols[n_dep[0]:], vals[n_dep[0]:], lo[n_dep[1]:], hi[n_dep[1]:]
        _memory_rows(row, events, base, model_budget)
        left = deadline - time.perf_counter()
        if left <= 0:
            return None, info
        A = coo_matrix((vals, (rows, cols)), shape=(len(lo), nvar)).tocsr()
        res = milp(cost, integrality=np.ones(nvar), bounds=Bounds(0, 1),
                   constraints=LinearConstraint(A, np.array(lo), np.array(hi)),
                   options={"time_limit": left, "disp": False})
        info["rows"] = len(lo)
        if res.x is None:
            return None, info
        dropped = {i for i in droppable if res.x[kcol[i]] < 0.5}
        kept = {i for i in keepable if i not in a.late and res.x[kcol[i]] > 0.5}
        plan = closure(a, dropped, kept, True)
        peak = evaluate(a, plan)
        if peak <= budget:
            info["gap"] = float(getattr(res, "mip_gap", 0.0) or 0.0)
            if res.status != 0:
                info["status"] = "time limit: best plan found"
            if attempt:
                info["status"] += f" (model budget tightened {attempt}x)"
            return plan, info
        model_budget -= peak - budget
    return None, info


def _within(a: Analysis, budget: int) -> Plan | None:
    """The cheapest of the plans ``smallest_peak`` tries that fits ``budget`` (None: none)."""
    try:
        return plan_sqrt(a, budget)
    except Infeasible:
        pass
    fits = [p for p in (closure(a, a.droppable, cuts(a), m) for m in (False, True))
            if evaluate(a, p) <= budget]
    return min(fits, key=lambda p: p.cost) if fits else None


def smallest_peak(a: Analysis) -> int:
    """The lowest peak the plans reach: Chen's segments at every size, and every saved
    node dropped."""
    try:
        plan_sqrt(a, -1)
    except Infeasible as e:
        return min(int(e.args[0]), evaluate(a, closure(a, a.droppable, cuts(a))),
                   evaluate(a, closure(a, a.droppable, cuts(a), True)))
    return 0


def run_method(a: Analysis, method: str, budget: int, time_limit: float) -> tuple[Plan, dict]:
    info: dict = {"status": "optimal" if method == "milp" else "heuristic", "gap": None}
    if method == "greedy":
        return _greedy(a, budget), info
    if method == "sqrt":
        return plan_sqrt(a, budget), info
    if method == "milp":
        return plan_milp(a, budget, time_limit)
    raise ValueError(f"nn.Graph.config.enable_remat: method must be one of {list(METHODS)}, "
                     f"got {method!r}")


def run(g: Graph, ctx) -> bool:
    cfg = getattr(ctx, "remat", None) if ctx is not None else None
    if cfg is None:
        return False
    a = analyze(g, cfg.forward_outputs)
    base = peak_bytes(g)
    budget = int(cfg.budget_bytes) if cfg.budget_bytes is not None else \
        int(math.floor(base * float(cfg.budget)))
    t0 = time.perf_counter()
    stats = cfg.stats
    stats.clear()
    stats.update(method=cfg.method, budget_bytes=budget, peak_bytes_no_remat=base,
                 activation_bytes_no_remat=sum(a.size[i] for i in a.saved))
    plan: Plan | None = None
    floor = 0
    if base <= budget:
        plan, info = closure(a, ()), {"status": "optimal", "gap": 0.0}
    else:
        try:
            plan, info = run_method(a, cfg.method, budget, cfg.time_limit)
        except Infeasible as e:
            floor = min(int(e.args[0]), smallest_peak(a))
            plan = _within(a, budget) if floor <= budget else None
            if plan is not None:   # the method misses a budget Chen's segments reach
                info = {"status": f"{cfg.method} found no plan: sqrt plan", "gap": None}
        if plan is None:
            raise ValueError(
                f"nn.Graph.config.enable_remat: a peak of {budget} bytes cannot be reached "
                f"(without remat the peak is {base} bytes; the smallest feasible budget is "
                f"{floor} bytes, budget={floor / max(base, 1):.3f})") from None
    stats.update(solver_time_s=time.perf_counter() - t0, status=info["status"],
                 optimality_gap=info["gap"], recompute_flops=plan.flops,
                 recompute_cost=plan.cost, recomputed_nodes=len(plan.copies),
                 dropped_nodes=len(plan.dropped), saved_nodes=len(a.saved))
    if not plan.copies:
        stats["peak_bytes"] = base
        return False
    apply(a, plan)
    stats["peak_bytes"] = peak_bytes(g)
    return True


def cuts(a: Analysis) -> list:
    """Droppable forward nodes no forward edge passes over (each separates the forward into
    a before and an after): the checkpoints Chen's segments may end at."""
    pos = {i: k for k, i in enumerate(a.fwd)}
    g = a.g
    static: set = set()   # made from variables and constants alone (weights' views, masks)
    for i in a.fwd:
        if all(p in static for p in a.parents[i]) and not any(
                isinstance(v, Value) and v.kind == "input" for v in g.nodes[i].inputs):
            static.add(i)
    reach = [0] * (len(a.fwd) + 1)   # reach[k]: the furthest reader of nodes before k
    far = -1
    for k, i in enumerate(a.fwd):
        reach[k] = far
        if i not in static:
            far = max([far] + [pos[c] for c in a.children[i]])
    ok = a.recomputable - set(a.follow) - static
    return [i for k, i in enumerate(a.fwd) if i in ok and reach[k] <= k]
