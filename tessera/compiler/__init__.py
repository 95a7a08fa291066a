"""Compiler backends for ``nn.Graph``: the graph after tessera's passes, run by XLA or TVM.

``graph.config.set_backend("xla")`` (JAX) or ``set_backend("tvm")`` (TVM Relax) picks the
compiler that runs a graph; ``tessera.compile(model, backend=...)`` does the same for a
module, like ``torch.compile``. Each op lowers through its own rule (``OpDef.to_jax``,
``OpDef.to_relax``); a graph with ops that have none is cut into clusters
(``tessera.compiler.partition``) and the rest runs on tessera's executor. This package
registers the backends with ``nn.Graph`` (``tessera.nn.graph.register_backend``); JAX and
TVM are imported only when a graph compiles for them (the extras ``tessera[xla]`` and
``tessera[tvm]``).

>>> import tessera
>>> from tessera import nn
>>> class G(nn.Graph):
...     def build(self, x):
...         return (x * 2).relu()
>>> g = G()
>>> g.config.set_backend("xla")
>>> g(tessera.tensor([-1.0, 3.0]))
tensor([0., 6.])
"""
from __future__ import annotations

from tessera.compiler.api import compile, make_backend
from tessera.nn.graph import register_backend

__all__ = ["compile"]

register_backend("xla", make_backend("xla"))
register_backend("tvm", make_backend("tvm"))
