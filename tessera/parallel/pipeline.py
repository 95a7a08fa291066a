"""Pipeline parallelism in ``nn.Graph``: the 1F1B schedule of micro-batches, a pass.

OneFlow's API: ``self.stage0.to(GraphModule).set_stage(stage_id=0, placement=P0)`` (or
the older ``self.stage0.config.set_stage(...)``) puts a module of an ``nn.Graph`` on a
stage (``tessera.nn.graph_module``). Its parameters live on the stage's placement
(``module.to_global(P0, sbp.broadcast)``, or split for data parallel within the stage);
the inputs of its calls are moved there automatically (``to_global(placement=P0)``:
point-to-point sends between the stages' ranks). ``config.set_gradient_accumulation_steps(n)``
splits each batch into ``n`` micro-batches.

Every rank traces the whole step and keeps only its stage's nodes, so its program holds
its stage's forward and backward for each micro-batch, with ``recv`` where an activation
(or a gradient) arrives from another stage and ``send`` where one leaves. The trace tags
each node with its micro-batch and direction; the pass ``schedule_1f1b`` (first in
``tessera.graph.passes.PIPELINE``) then orders this rank's program as
one-forward-one-backward: stage ``s`` of ``S`` runs ``S - s - 1`` warm-up forwards, then
alternates a forward and a backward, then drains the backwards, so at most ``S - s``
micro-batches' activations are alive at once. Within the steady phase, a backward's
receive comes before the forward's send, which keeps blocking sends between neighbouring
stages free of deadlock (``tests`` simulate it for up to 4 stages).

>>> order_1f1b(stage=0, n_stages=2, m=2)
[('F', 0), ('F-', 1), ('B<', 0), ('F>', 1), ('B-', 0), ('B', 1)]
"""
from __future__ import annotations

from tessera.distributed import comm as C
from tessera.graph.ir import Graph, Value

__all__ = ["run", "order_1f1b"]


def order_1f1b(stage: int, n_stages: int, m: int) -> list[tuple]:
    """This stage's steps: ("F" | "B", micro-batch) and, in the steady phase, the split
    pairs ("F-", j) (forward without its sends), ("B<", k) (the backward's receives),
    ("F>", j) (the forward's sends), ("B-", k) (the rest of the backward)."""
    w = min(n_stages - stage - 1, m)
    steps: list[tuple] = [("F", k) for k in range(w)]
    for k in range(m - w):
        j = w + k
        steps += [("F-", j), ("B<", k), ("F>", j), ("B-", k)]
    return steps + [("B", k) for k in range(m - w, m)]


def run(g: Graph, ctx) -> bool:
    """The pass ``schedule_1f1b``: reorder this rank's traced program (nodes tagged
    ``notes["micro_batch"]``) as 1F1B over ``ctx.micro_batches`` micro-batches, when the
    graph has pipeline stages (``ctx.stages``: (stage id, placement) pairs) and this rank
    is on exactly one of them; the tags go either way. Whether the order changed."""
    tags = {id(n): n.notes.pop("micro_batch") for n in g.nodes if "micro_batch" in n.notes}
    if ctx.micro_batches == 1 or not ctx.stages:
        return False
    ids = sorted({s for s, _ in ctx.stages})
    rank = C.current().rank
    mine = sorted({s for s, p in ctx.stages if p is not None and p.has_rank(rank)})
    if len(mine) != 1:
        return False  # not on a stage (or on several): the traced order stands
    order = _ordered(g.nodes, tags, ids.index(mine[0]), len(ids), ctx.micro_batches)
    _check_order(order, g)
    changed = any(a is not b for a, b in zip(order, g.nodes))
    g.nodes = order
    return changed


def _ordered(nodes: list, tags: dict, stage: int, n_stages: int, m: int) -> list:
    """``nodes`` in 1F1B order: the untagged nodes before the first micro-batch, each
    step's part of its micro-batch's group, the untagged nodes after them."""
    pre: list = []
    post: list = []
    groups: dict = {}
    for n in nodes:
        tag = tags.get(id(n))
        if tag is None:
            (post if groups else pre).append(n)
        else:
            groups.setdefault(tag, []).append(n)
    order = list(pre)
    for step, k in order_1f1b(stage, n_stages, m):
        recv, body, send = _parts(groups.get((k, step[0]), []))
        order += _STEP_PARTS[step](recv, body, send)
    return order + post


# which parts of its micro-batch's group each step runs: (receives, the rest, sends)
_STEP_PARTS = {
    "F": lambda recv, body, send: recv + body + send,
    "B": lambda recv, body, send: recv + body + send,
    "F-": lambda recv, body, send: recv + body,
    "B<": lambda recv, body, send: recv,
    "F>": lambda recv, body, send: send,
    "B-": lambda recv, body, send: body + send,
}


def _parts(nodes: list) -> tuple[list, list, list]:
    """(receives, the rest, sends): a receive reads nothing, a send is read by nothing, so
    both may move to their group's ends."""
    recv = [n for n in nodes if n.op.name == "recv"]
    send = [n for n in nodes if n.op.name == "send"]
    body = [n for n in nodes if n.op.name not in ("recv", "send")]
    return recv, body, send


def _check_order(order: list, g: Graph) -> None:
    if len(order) != len(g.nodes):
        raise RuntimeError(f"1F1B schedule: {len(order)} nodes scheduled of {len(g.nodes)}")
    seen = {id(v) for v in g.inputs} | {id(v) for v in g.variables.values()}
    for n in order:
        for v in n.inputs:
            if isinstance(v, Value) and id(v) not in seen:
                raise RuntimeError(f"1F1B schedule: {n.op.name} ({n.name}) would run before "
                                   f"its input %{v.name} is computed")
        seen.update(id(v) for v in n.outputs)
