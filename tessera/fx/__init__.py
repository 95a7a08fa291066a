"""``tessera.fx``: PyTorch's ``torch.fx`` — capture a module as a graph, transform it in
Python, and run or compile the result.

Three parts, as in PyTorch. **Symbolic tracing** (``symbolic_trace``, ``Tracer``) runs
``forward`` on ``Proxy`` values and records each operation as a ``Node``. The
**intermediate representation** (``Graph`` of ``Node``s with six opcodes: placeholder,
get_attr, call_function, call_module, call_method, output) prints as text and is edited
in place. **Code generation** (``GraphModule``) turns a graph back into a Python
``forward``, so the result is an ordinary ``nn.Module``: it trains eagerly, and
``nn.Graph`` compiles it (``tessera.fx.bridge``). ``Interpreter`` and ``Transformer``
run or rewrite a graph node by node; ``replace_pattern`` rewrites by example.

>>> import tessera
>>> from tessera import nn
>>> class M(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.linear = nn.Linear(4, 5)
...     def forward(self, x):
...         return self.linear(x + 1).clamp(min=0.0)
>>> gm = tessera.fx.symbolic_trace(M())
>>> print(gm.graph)
graph():
    %x : [num_users=1] = placeholder[target=x]
    %add : [num_users=1] = call_function[target=operator.add](args = (%x, 1), kwargs = {})
    %linear : [num_users=1] = call_module[target=linear](args = (%add,), kwargs = {})
    %clamp : [num_users=1] = call_method[target=clamp](args = (%linear,), kwargs = {min: 0.0})
    return clamp
"""
from tessera.fx import passes  # noqa: F401  (tessera.fx.passes.shape_prop)
from tessera.fx.bridge import to_graph_ir
from tessera.fx.graph import Graph
from tessera.fx.graph_module import GraphModule
from tessera.fx.interpreter import Interpreter, Transformer
from tessera.fx.node import Node, has_side_effect, map_arg
from tessera.fx.proxy import Proxy
from tessera.fx.subgraph_rewriter import replace_pattern
from tessera.fx.tracer import PH, Tracer, symbolic_trace, wrap

__all__ = ["symbolic_trace", "Tracer", "wrap", "Graph", "GraphModule", "Interpreter",
           "Transformer", "Node", "Proxy", "replace_pattern", "has_side_effect", "map_arg",
           "PH", "to_graph_ir"]
