"""The TVM backend (Relax): not written yet, so every node runs on tessera's executor.

>>> import tessera
>>> from tessera.graph.trace import trace
>>> g, _ = trace(lambda x: x + 1, tessera.zeros(2))
>>> supported(g.nodes[0])
False
"""
from __future__ import annotations

from tessera.graph.ir import Graph, Node

__all__ = ["supported", "compile_graph", "whole_graph"]


def supported(n: Node) -> bool:
    return False


def compile_graph(g: Graph, **options):
    raise NotImplementedError("the TVM backend")


def whole_graph(g: Graph, tensors: dict, **options):
    raise NotImplementedError("the TVM backend")
