"""``replace_pattern``: find every copy of a small traced function in a graph and put
another traced function in its place.

The pattern's placeholders match any value; its other nodes must match by opcode, target
and arguments (constants equal), from the node it returns backwards. A match whose inner
values are used outside it, or that overlaps an earlier match, is skipped. The
replacement's placeholders take, in order, the values the pattern's matched.

>>> import tessera
>>> from tessera.fx import replace_pattern, symbolic_trace
>>> gm = symbolic_trace(lambda x: tessera.neg(tessera.relu(x)) + 1)
>>> def pattern(a):
...     return tessera.neg(tessera.relu(a))
>>> def replacement(a):
...     return tessera.sigmoid(a)
>>> [m.anchor.name for m in replace_pattern(gm, pattern, replacement)]
['neg']
>>> print(gm.code.strip())
def forward(self, x):
    sigmoid = tessera.sigmoid(x);  x = None
    add = sigmoid + 1;  sigmoid = None
    return add
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from tessera.fx.graph import Graph
from tessera.fx.graph_module import GraphModule, _copy_attr
from tessera.fx.node import Node
from tessera.fx.tracer import symbolic_trace
from tessera.nn.modules.module import Module

__all__ = ["Match", "replace_pattern"]


class Match(NamedTuple):
    """One match: the pattern's returned node, and each pattern node's graph node."""

    anchor: Node
    nodes_map: dict[Node, Node]


def _graph_of(fn: Callable | Graph | GraphModule) -> tuple[Graph, Module | None]:
    if isinstance(fn, Graph):
        return fn, None
    if isinstance(fn, GraphModule):
        return fn.graph, fn
    gm = symbolic_trace(fn)
    return gm.graph, gm


def _match_arg(pa: Any, ga: Any, m: dict[Node, Node]) -> bool:
    if isinstance(pa, Node):
        return isinstance(ga, Node) and _match_node(pa, ga, m)
    if isinstance(pa, (list, tuple)):
        return type(pa) is type(ga) and len(pa) == len(ga) and \
            all(_match_arg(a, b, m) for a, b in zip(pa, ga))
    if isinstance(pa, dict):
        return isinstance(ga, dict) and pa.keys() == ga.keys() and \
            all(_match_arg(pa[k], ga[k], m) for k in pa)
    return not isinstance(ga, Node) and type(pa) is type(ga) and pa == ga


def _match_node(pn: Node, gn: Node, m: dict[Node, Node]) -> bool:
    if pn in m:
        return m[pn] is gn
    if any(v is gn for v in m.values()):
        return False
    if pn.op == "placeholder":
        m[pn] = gn
        return True
    if pn.op != gn.op or pn.target != gn.target or len(pn.args) != len(gn.args) or \
            pn.kwargs.keys() != gn.kwargs.keys():
        return False
    m[pn] = gn
    return _match_arg(pn.args, gn.args, m) and _match_arg(pn.kwargs, gn.kwargs, m)


def _find_matches(graph: Graph, pattern: Graph) -> list[Match]:
    returned = pattern.output_node.args[0]
    if not isinstance(returned, Node):
        raise NotImplementedError("replace_pattern: the pattern must return exactly one value")
    anchor = returned
    matches: list[Match] = []
    taken: set[Node] = set()
    for gn in graph.nodes:
        m: dict[Node, Node] = {}
        if gn.op == "output" or not _match_node(anchor, gn, m):
            continue
        inner = [g for p, g in m.items() if p.op != "placeholder"]
        if taken.intersection(inner):
            continue
        members = set(inner)
        if any(u not in members for g in inner if g is not gn for u in g.users):
            continue  # an inner value is used outside the match
        taken.update(inner)
        matches.append(Match(anchor=anchor, nodes_map=m))
    return matches


def replace_pattern(gm: GraphModule, pattern: Callable | Graph | GraphModule,
                    replacement: Callable | Graph | GraphModule) -> list[Match]:
    """Replace each non-overlapping match of ``pattern`` in ``gm.graph`` by
    ``replacement`` (functions are traced with ``symbolic_trace``), recompile ``gm``, and
    return the matches."""
    pattern_graph, _ = _graph_of(pattern)
    repl_graph, repl_mod = _graph_of(replacement)
    graph = gm.graph
    matches = _find_matches(graph, pattern_graph)
    p_inputs = [n for n in pattern_graph.nodes if n.op == "placeholder"]
    r_inputs = [n for n in repl_graph.nodes if n.op == "placeholder"]
    if len(p_inputs) != len(r_inputs):
        raise ValueError(f"replace_pattern: the pattern takes {len(p_inputs)} inputs but the "
                         f"replacement takes {len(r_inputs)}")
    order = {n: i for i, n in enumerate(graph.nodes)}
    for match in matches:
        m = match.nodes_map
        anchor = m[match.anchor]
        val_map = {r: m[p] for p, r in zip(p_inputs, r_inputs)}
        # right before the first use, where torch.fx puts it
        first_user = next((n for n in graph.nodes if n in anchor.users), anchor)
        with graph.inserting_before(first_user):
            out = graph.graph_copy(repl_graph, val_map)
        if not isinstance(out, Node):
            raise NotImplementedError("replace_pattern: the replacement must return exactly "
                                      "one value")
        anchor.replace_all_uses_with(out)
        inner = sorted((g for p, g in m.items() if p.op != "placeholder"),
                       key=order.__getitem__, reverse=True)
        for g in inner:
            if not g.users:
                graph.erase_node(g)
    if repl_mod is not None:
        for n in repl_graph.nodes:
            if n.op in ("get_attr", "call_module") and not _has(gm, n.target):
                _copy_attr(repl_mod, gm, n.target)
    gm.recompile()
    return matches


def _has(mod: Module, target: str) -> bool:
    try:
        for atom in target.split("."):
            mod = getattr(mod, atom)
    except AttributeError:
        return False
    return True
