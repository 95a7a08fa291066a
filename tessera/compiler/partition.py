"""Cutting a graph between a compiler backend and tessera's executor (OneFlow XRT's clusters).

A backend lowers the nodes whose op has its rule (``to_jax`` for XLA, ``to_relax`` for TVM);
a node without one runs on tessera's own executor. The nodes, in the graph's (topological)
order, are cut into maximal runs of the same side; each run becomes a subgraph whose inputs
are the values it reads from earlier runs (or the graph's inputs and variables) and whose
outputs are the values later runs, the graph's outputs or its assignments read. A graph the
backend covers whole is one run, given to it as it is (its variables and assignments kept,
so the backend may update them in place). With ``variables=True`` every backend run keeps
the variables it reads as variables (a backend that prepares its weights once, as a program
packs its matrices), and is called with the step's variable arrays as well.

>>> import tessera
>>> from tessera.graph.trace import trace
>>> g, _ = trace(lambda x: (x * 2).relu() + 1, tessera.ones(3))
>>> [(side, len(ns)) for side, ns in runs(g.nodes, lambda n: n.op.name != "relu")]
[('backend', 1), ('tessera', 1), ('backend', 1)]
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tessera.graph.executor import Executor
from tessera.graph.ir import Graph, Node, Value

__all__ = ["runs", "cut", "Segment", "Partitioned", "BackendUnsupported", "BackendStats",
           "describe"]


class BackendUnsupported(NotImplementedError):
    """``strict=True`` and some nodes have no rule for the backend: names them."""


def runs(nodes: list, supported: Callable[[Node], bool]) -> list[tuple[str, list]]:
    """Maximal runs of consecutive nodes on the same side ("backend" or "tessera")."""
    out: list[tuple[str, list]] = []
    for n in nodes:
        side = "backend" if supported(n) else "tessera"
        if out and out[-1][0] == side:
            out[-1][1].append(n)
        else:
            out.append((side, [n]))
    return out


@dataclass
class Segment:
    """One run as its own graph: ``reads`` / ``writes`` are the outer values its inputs and
    outputs stand for."""

    side: str
    graph: Graph
    reads: list
    writes: list
    nodes: list
    run: Callable | None = None
    executor: Executor | None = None  # tessera's segments
    variables: bool = False  # run(arrays, variables): its graph keeps the variables it reads


def _subgraph(nodes: list, later_reads: set, variables: bool = False
              ) -> tuple[Graph, list, list]:
    """``nodes`` as a graph of their own, with fresh values (so that tessera's memory plan
    never writes over a value another run still reads); ``variables``: the graph's
    variables stay variables of the same names, not inputs."""
    g = Graph()
    made: dict[int, Value] = {}
    reads: list[Value] = []
    inside = {id(v) for n in nodes for v in n.outputs}
    for n in nodes:
        for v in n.inputs:
            if not isinstance(v, Value) or id(v) in inside or id(v) in made:
                continue
            if variables and v.kind == "var":
                made[id(v)] = g.add_variable(v.name, v.shape, v.dtype)
            else:
                made[id(v)] = g.add_input(f"in{len(reads)}", v.shape, v.dtype)
                reads.append(v)
        ins = [made[id(v)] if isinstance(v, Value) else v for v in n.inputs]
        outs = g.add_node(n.op, ins, n.attrs, [(v.shape, v.dtype) for v in n.outputs], n.name)
        g.nodes[-1].notes = dict(n.notes)
        for v, o in zip(n.outputs, outs):
            made[id(v)] = o
    writes = [v for n in nodes for v in n.outputs if id(v) in later_reads]
    g.outputs = [made[id(v)] for v in writes]
    return g, reads, writes


def cut(g: Graph, supported: Callable[[Node], bool], variables: bool = False
        ) -> list[Segment]:
    """``g``'s runs as segments (not compiled yet); ``variables``: the backend's keep the
    variables they read (``Partitioned``).

    >>> import tessera
    >>> from tessera.graph.trace import trace
    >>> g, _ = trace(lambda x: (x * 2).relu() + 1, tessera.ones(3))
    >>> [(s.side, len(s.reads), len(s.writes)) for s in cut(g, lambda n: n.op.name != "relu")]
    [('backend', 1, 1), ('tessera', 1, 1), ('backend', 1, 1)]
    """
    parts = runs(g.nodes, supported)
    roots = {id(v) for v in g.live_roots()}
    out = []
    for k, (side, nodes) in enumerate(parts):
        later = set(roots)
        for _, rest in parts[k + 1:]:
            later |= {id(v) for n in rest for v in n.inputs if isinstance(v, Value)}
        keep = variables and side == "backend"
        sub, reads, writes = _subgraph(nodes, later, keep)
        out.append(Segment(side, sub, reads, writes, nodes, variables=keep))
    return out


class BackendStats:
    """``profile`` and ``memory_stats`` with the executor's signatures, for a step a backend
    runs (whole or in part). The backend's compiled code is opaque: its calls are timed as
    one entry under the backend's name; tessera's segments op by op, as the executor does.
    A backend plans its own buffers, so memory counts the graph's intermediates (their sum
    and the peak alive at once in node order) and the variables; the arena and plan fields
    cover tessera's segments only (0 when the backend runs the whole graph)."""

    backend: str
    graph: Graph

    def _timed(self) -> list[tuple[object, str]]:
        """(object, attribute) of each backend function a step calls."""
        raise NotImplementedError

    def _executors(self) -> list[Executor]:
        return []

    def profile(self, run) -> dict[str, float]:
        import time
        spent: dict[str, float] = {}
        saved = [(obj, attr, getattr(obj, attr)) for obj, attr in self._timed()]

        def timed(fn):
            def call(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    spent[self.backend] = spent.get(self.backend, 0.0) + \
                        time.perf_counter() - t0
            return call
        for obj, attr, fn in saved:
            setattr(obj, attr, timed(fn))
        exs = self._executors()

        def nested(i: int) -> None:  # each tessera segment's executor times its own ops
            if i == len(exs):
                run()
                return
            for k, v in exs[i].profile(lambda: nested(i + 1)).items():
                spent[k] = spent.get(k, 0.0) + v
        try:
            nested(0)
        finally:
            for obj, attr, fn in saved:
                setattr(obj, attr, fn)
        return spent

    def memory_stats(self, tensors: dict, optimizers=()) -> dict:
        from tessera.graph.passes.remat import peak_bytes
        parts = [ex.memory_stats({}) for ex in self._executors()]
        out = {"backend": self.backend,
               "intermediate_bytes_naive": sum(v.nbytes for n in self.graph.nodes
                                               for v in n.outputs),
               "intermediate_bytes_peak": peak_bytes(self.graph),
               "variable_bytes": sum(t.numel() * t.dtype.itemsize for t in tensors.values())}
        for k in ("arena_bytes", "planned_bytes", "inplace_nodes", "written_into_variables"):
            out[k] = sum(p[k] for p in parts)
        return out


class Partitioned(BackendStats):
    """Runs a graph cut into segments: ``compile(subgraph) -> fn(input arrays) -> output
    arrays`` for the backend's (``fn(input arrays, variable arrays)`` with ``variables``),
    tessera's ``Executor`` for the rest. Same ``run`` as the executor."""

    def __init__(self, g: Graph, backend: str, supported: Callable[[Node], bool],
                 compile: Callable[[Graph], Callable], variables: bool = False):
        self.graph, self.backend = g, backend
        self.segments = cut(g, supported, variables)
        for seg in self.segments:
            if seg.side == "backend":
                seg.run = compile(seg.graph)
            else:
                ex = seg.executor = Executor(seg.graph)
                seg.run = lambda arrays, ex=ex: ex.run(arrays, {})[0]

    def run(self, inputs: list, variables: dict):
        g = self.graph
        env: dict[int, object] = {id(v): a for v, a in zip(g.inputs, inputs)}
        for name, v in g.variables.items():
            env[id(v)] = variables[name]
        for seg in self.segments:
            run = seg.run
            assert run is not None
            arrays = [env[id(v)] for v in seg.reads]
            outs = run(arrays, variables) if seg.variables else run(arrays)
            for v, a in zip(seg.writes, outs):
                env[id(v)] = a
        return [env[id(v)] for v in g.outputs], [(n, env[id(v)]) for n, v in g.assigns]

    def describe(self) -> str:
        return describe(self.backend, [(s.side, s.nodes) for s in self.segments])

    def _timed(self) -> list[tuple[object, str]]:
        return [(s, "run") for s in self.segments if s.side == "backend"]

    def _executors(self) -> list[Executor]:
        return [s.executor for s in self.segments if s.executor is not None]


def describe(backend: str, parts: list) -> str:
    """The cut as text: one line per run, the tessera runs with their ops and module paths."""
    lines = [f"backend {backend}: {len(parts)} cluster(s)"]
    at = 0
    for side, nodes in parts:
        where = f"nodes {at}..{at + len(nodes) - 1}"
        at += len(nodes)
        if side == "backend":
            lines.append(f"  {backend:8s} {where} ({len(nodes)} ops)")
        else:
            ops = ", ".join(f"{n.op.name} ({n.name or 'graph'})" for n in nodes[:8])
            more = f", ... {len(nodes) - 8} more" if len(nodes) > 8 else ""
            lines.append(f"  {'tessera':8s} {where}: {ops}{more}")
    return "\n".join(lines)


def unsupported_error(backend: str, rule: str, nodes: list) -> BackendUnsupported:
    seen: dict[str, list] = {}
    for n in nodes:
        # a random op draws from tessera's generator (NumPy's PCG64 stream), which no
        # backend reproduces: without strict it runs on tessera's executor, as eager draws
        why = " (random: draws from tessera's generator)" if "generator" in n.attrs or \
            "seed" in n.attrs else ""
        seen.setdefault(n.op.name + why, []).append(n.name or "graph")
    what = "; ".join(f"{op} at {', '.join(sorted(set(paths))[:4])}"
                     for op, paths in sorted(seen.items()))
    return BackendUnsupported(f"nn.Graph backend '{backend}' (strict): no '{rule}' rule for "
                              f"{len(nodes)} node(s): {what}")
