"""The graph compiler: IR, tracing, passes, memory planning and the executor.

``tessera.nn.Graph`` is the user-facing entry; this package is the machinery under it.
"""
from tessera.graph import fused  # noqa: F401  (registers the fused op graphs are made of)
from tessera.graph.interpreter import interpret
from tessera.graph.ir import Graph, IRError, Node, Value
from tessera.graph.trace import GraphTraceError, Tracer, trace

__all__ = ["Graph", "Node", "Value", "IRError", "Tracer", "trace", "GraphTraceError",
           "interpret"]
