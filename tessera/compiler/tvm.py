"""The TVM backend (Relax): not written yet; every node runs on tessera's executor."""
from __future__ import annotations

from tessera.graph.ir import Graph, Node

__all__ = ["supported", "compile_graph", "whole_graph"]


def supported(n: Node) -> bool:
    return False


def compile_graph(g: Graph, **options):
    raise NotImplementedError("the TVM backend")


def whole_graph(g: Graph, tensors: dict, **options):
    raise NotImplementedError("the TVM backend")
