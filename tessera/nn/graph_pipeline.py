"""Pipeline parallelism in ``nn.Graph``: stages, and the 1F1B schedule of micro-batches.

OneFlow's API: a module assigned to an ``nn.Graph`` is wrapped in a ``ProxyModule``, and
``self.stage0.to(GraphModule).set_stage(stage_id=0, placement=P0)`` (or the older
``self.stage0.config.set_stage(...)``) puts it on a stage. Its parameters live on the
stage's placement (``module.to_global(P0, sbp.broadcast)``, or split for data parallel
within the stage); the inputs of its calls are moved there automatically
(``to_global(placement=P0)``: point-to-point sends between the stages' ranks).
``config.set_gradient_accumulation_steps(n)`` splits each batch into ``n`` micro-batches.

Every rank traces the whole step and keeps only its stage's nodes, so its program holds
its stage's forward and backward for each micro-batch, with ``recv`` where an activation
(or a gradient) arrives from another stage and ``send`` where one leaves. The trace tags
each node with its micro-batch and direction; ``schedule_1f1b`` then orders this rank's
program as one-forward-one-backward: stage ``s`` of ``S`` runs ``S - s - 1`` warm-up
forwards, then alternates a forward and a backward, then drains the backwards, so at most
``S - s`` micro-batches' activations are alive at once. Within the steady phase, a
backward's receive comes before the forward's send, which keeps blocking sends between
neighbouring stages free of deadlock (``tests`` simulate it for up to 4 stages).

>>> import tessera
>>> from tessera import nn
>>> from tessera.nn.graph import GraphModule
>>> class G(nn.Graph):
...     def __init__(self):
...         super().__init__()
...         self.stage0 = nn.Linear(2, 2)
...         self.stage0.to(GraphModule).set_stage(stage_id=0,
...                                               placement=tessera.placement("cpu", [0]))
...     def build(self, x):
...         return self.stage0(x)
>>> G().stage0.config.stage_id
0
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.nn.modules.module import Module

__all__ = ["GraphModule", "ProxyModule", "schedule_1f1b", "order_1f1b"]


class GraphModule:
    """A module's settings inside an ``nn.Graph`` (OneFlow's ``GraphModule``): its
    pipeline stage. Reached by ``graph.module.to(GraphModule)`` or ``graph.module.config``."""

    def __init__(self, module: Module):
        self.module = module
        self.stage_id: int | None = None
        self.placement = None

    def set_stage(self, stage_id: int | None = None, placement=None) -> GraphModule:
        """Put the module on pipeline stage ``stage_id`` running on ``placement``."""
        from tessera.distributed.placement import placement as Placement
        if stage_id is not None and (not isinstance(stage_id, int) or stage_id < 0):
            raise ValueError(f"set_stage: stage_id must be a non-negative int, got "
                             f"{stage_id!r} ({type(self.module).__name__})")
        if placement is not None and not isinstance(placement, Placement):
            raise TypeError(f"set_stage: placement must be a tessera.placement, got "
                            f"{placement!r} ({type(self.module).__name__})")
        self.stage_id, self.placement = stage_id, placement
        return self

    def to_stage(self, x):
        """``x`` moved onto this stage's placement (its SBP kept where the mesh allows)."""
        if self.placement is None or not isinstance(x, Tensor):
            return x
        if x._device.type != "global":
            raise TypeError(f"pipeline stage {self.stage_id} ({type(self.module).__name__}, "
                            f"{self.placement}) got a local tensor of shape {list(x.shape)}; "
                            "a pipeline's inputs must be global tensors (x.to_global(...))")
        d = x._data
        if d.placement == self.placement:
            return x
        from tessera.sbp import broadcast
        sbp = None if d.placement.ndim == self.placement.ndim else \
            (broadcast,) * self.placement.ndim
        return x.to_global(placement=self.placement, sbp=sbp)

    def __repr__(self) -> str:
        return f"GraphModule({type(self.module).__name__}, stage_id={self.stage_id}, " \
               f"placement={self.placement})"


class ProxyModule:
    """What ``nn.Graph`` holds for an assigned module: it calls and reads through to the
    module (``.origin``), and adds ``to(GraphModule)`` / ``config`` for graph settings."""

    __slots__ = ("_origin", "_settings")

    def __init__(self, module: Module, settings: dict):
        object.__setattr__(self, "_origin", module)
        object.__setattr__(self, "_settings", settings)  # id(module) -> GraphModule

    @property
    def origin(self) -> Module:
        return self._origin

    @property
    def config(self) -> GraphModule:
        m = self._origin
        gm = self._settings.get(id(m))
        if gm is None:
            gm = self._settings[id(m)] = GraphModule(m)
        return gm

    def to(self, *args, **kwargs):
        if len(args) == 1 and args[0] is GraphModule and not kwargs:
            return self.config
        self._origin.to(*args, **kwargs)
        return self

    def __call__(self, *args, **kwargs):
        return self._origin(*args, **kwargs)

    def _wrap(self, v):
        return ProxyModule(v, self._settings) if isinstance(v, Module) else v

    def __getattr__(self, name):
        return self._wrap(getattr(self._origin, name))

    def __setattr__(self, name, value):
        setattr(self._origin, name, value)

    def __getitem__(self, i):
        return self._wrap(self._origin[i])

    def __iter__(self):
        return (self._wrap(m) for m in self._origin)

    def __len__(self) -> int:
        return len(self._origin)

    def __repr__(self) -> str:
        return f"ProxyModule({self._origin!r})"


# ---- the 1F1B schedule ---------------------------------------------------------------------

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


def _parts(nodes: list) -> tuple[list, list, list]:
    """(receives, the rest, sends): a receive reads nothing, a send is read by nothing, so
    both may move to their group's ends."""
    recv = [n for n in nodes if n.op.name == "recv"]
    send = [n for n in nodes if n.op.name == "send"]
    body = [n for n in nodes if n.op.name not in ("recv", "send")]
    return recv, body, send


def schedule_1f1b(ir, stages: dict, m: int) -> None:
    """Reorder this rank's traced program (nodes tagged ``notes["micro_batch"]``) as 1F1B
    over ``m`` micro-batches, when the graph has pipeline stages; the tags go either way."""
    from tessera.distributed import comm as C
    tags = {id(n): n.notes.pop("micro_batch") for n in ir.nodes if "micro_batch" in n.notes}
    placed = [gm for gm in stages.values() if gm.stage_id is not None]
    if m == 1 or not placed:
        return
    ids = sorted({gm.stage_id for gm in placed})
    rank = C.current().rank
    mine = sorted({gm.stage_id for gm in placed
                   if gm.placement is not None and gm.placement.has_rank(rank)})
    if len(mine) != 1:
        return  # not on a stage (or on several): the traced order stands
    stage = ids.index(mine[0])
    pre, post = [], []
    groups: dict = {}
    for n in ir.nodes:
        tag = tags.get(id(n))
        if tag is None:
            (post if groups else pre).append(n)
        else:
            groups.setdefault(tag, []).append(n)

    def part(kind, k):
        recv, body, send = _parts(groups.get((k, kind), []))
        return recv, body, send

    order = list(pre)
    for step, k in order_1f1b(stage, len(ids), m):
        if step in ("F", "B"):
            recv, body, send = part(step, k)
            order += recv + body + send
        elif step == "F-":
            recv, body, _ = part("F", k)
            order += recv + body
        elif step == "B<":
            order += part("B", k)[0]
        elif step == "F>":
            order += part("F", k)[2]
        else:
            _, body, send = part("B", k)
            order += body + send
    order += post
    _check_order(order, ir)
    ir.nodes = order


def _check_order(order: list, ir) -> None:
    from tessera.graph.ir import Value
    if len(order) != len(ir.nodes):
        raise RuntimeError(f"1F1B schedule: {len(order)} nodes scheduled of {len(ir.nodes)}")
    seen = {id(v) for v in ir.inputs} | {id(v) for v in ir.variables.values()}
    for n in order:
        for v in n.inputs:
            if isinstance(v, Value) and id(v) not in seen:
                raise RuntimeError(f"1F1B schedule: {n.op.name} ({n.name}) would run before "
                                   f"its input %{v.name} is computed")
        seen.update(id(v) for v in n.outputs)
