"""From an fx graph to tessera's graph compiler.

A ``GraphModule`` is an ``nn.Module`` whose ``forward`` is plain generated code, so
``nn.Graph`` compiles it like any model (assign it in ``__init__``, call it in
``build``). ``to_graph_ir`` gives the IR of ``tessera.graph`` directly: the module's
code run once under tessera's tracer on example inputs, each parameter and buffer a
variable named by its qualified name.

>>> import tessera
>>> from tessera import nn
>>> from tessera.fx import symbolic_trace, to_graph_ir
>>> gm = symbolic_trace(nn.Sequential(nn.Linear(3, 2), nn.ReLU()))
>>> ir = to_graph_ir(gm, tessera.ones(4, 3))
>>> [n.op.name for n in ir.nodes]
['permute', 'matmul', 'add', 'relu']
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.graph.ir import Graph as IRGraph
from tessera.graph.trace import trace
from tessera.nn.modules.module import Module

__all__ = ["to_graph_ir"]


def to_graph_ir(gm: Module, *example_inputs: Tensor) -> IRGraph:
    """tessera's IR (``tessera.graph.ir.Graph``) of ``gm`` traced on inputs shaped like
    ``example_inputs``; parameters and buffers are variables named after them."""
    for i, x in enumerate(example_inputs):
        if not isinstance(x, Tensor):
            raise TypeError(f"to_graph_ir: example input {i} must be a Tensor, got "
                            f"{type(x).__name__}")
    names: dict[int, str] = {}
    for n, p in gm.named_parameters():
        names.setdefault(id(p), n)
    for n, b in gm.named_buffers():
        names.setdefault(id(b), n)
    ir, _ = trace(gm, *example_inputs, names=names)
    return ir
