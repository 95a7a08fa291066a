"""``Interpreter`` runs an fx graph node by node; ``Transformer`` rewrites it into a new one.

``Interpreter(gm).run(*args)`` calls one method per opcode (``placeholder``,
``get_attr``, ``call_function``, ``call_method``, ``call_module``, ``output``), each
overridable, and frees each value after its last use. ``Transformer`` runs the same
methods on Proxies of a new graph, so overriding ``call_function`` to call something else
rewrites every call in one pass; ``transform()`` returns the new ``GraphModule``.

>>> import tessera
>>> from tessera.fx import Transformer, symbolic_trace
>>> class ReluToGelu(Transformer):
...     def call_function(self, target, args, kwargs):
...         if target is tessera.relu:
...             target = tessera.nn.functional.gelu
...         return super().call_function(target, args, kwargs)
>>> gm = ReluToGelu(symbolic_trace(lambda x: tessera.relu(x) * 2)).transform()
>>> [str(n.target) for n in gm.graph.nodes][1].startswith("<function gelu")
True
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tessera.fx.graph import Graph
from tessera.fx.graph_module import GraphModule
from tessera.fx.node import Argument, Node, map_aggregate, map_arg
from tessera.fx.proxy import Proxy
from tessera.fx.tracer import Tracer
from tessera.nn.modules.module import Module

__all__ = ["Interpreter", "Transformer"]


class Interpreter:
    """Run ``module.graph`` (or ``graph``) on concrete values, one overridable method per
    opcode; ``garbage_collect_values`` frees each value after its last use."""

    def __init__(self, module: Module, garbage_collect_values: bool = True,
                 graph: Graph | None = None):
        self.module = module
        self.submodules = dict(module.named_modules())
        if graph is not None:
            self.graph = graph
        elif isinstance(module, GraphModule):
            self.graph = module.graph
        else:
            raise TypeError(f"Interpreter: {type(module).__name__} has no fx graph; pass "
                            "graph= or a GraphModule")
        self.env: dict[Node, Any] = {}
        self.name = "Interpreter"
        self.garbage_collect_values = garbage_collect_values
        self.extra_traceback = True
        if garbage_collect_values:
            last_use: dict[Node, Node] = {}
            self.user_to_last_uses: dict[Node, list[Node]] = {}
            for node in reversed(self.graph.nodes):
                for n in node._input_nodes:
                    if n not in last_use:
                        last_use[n] = node
                        self.user_to_last_uses.setdefault(node, []).append(n)

    def run(self, *args: Any, initial_env: dict[Node, Any] | None = None,
            enable_io_processing: bool = True) -> Any:
        """Run the graph on ``args`` and return what it outputs; ``initial_env`` gives
        values for some nodes in advance (partial evaluation)."""
        self.env = initial_env if initial_env is not None else {}
        if enable_io_processing:
            args = self.graph.process_inputs(*args)
        self.args_iter: Iterator[Any] = iter(args)
        for node in self.graph.nodes:
            if node in self.env:
                continue
            try:
                self.env[node] = self.run_node(node)
            except Exception as e:
                if self.extra_traceback:
                    msg = f"While executing {node.format_node()}"
                    e.args = ((f"{e.args[0]}\n\n{msg}" if e.args else msg),) + e.args[1:]
                raise
            if self.garbage_collect_values:
                for dead in self.user_to_last_uses.get(node, []):
                    del self.env[dead]
            if node.op == "output":
                out = self.env[node]
                return self.graph.process_outputs(out) if enable_io_processing else out
        return None

    def run_node(self, n: Node) -> Any:
        """Run one node: its arguments from the environment, then the opcode's method."""
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        return getattr(self, n.op)(n.target, args, kwargs)

    # ---- one method per opcode -----------------------------------------------------------
    def placeholder(self, target: Any, args: tuple, kwargs: dict) -> Any:
        """The next input (all remaining ones for ``*args``), or the default value."""
        if target.startswith("*"):
            return list(self.args_iter)
        try:
            return next(self.args_iter)
        except StopIteration:
            if args:
                return args[0]
            raise RuntimeError(f"Expected positional argument for parameter {target}, but one "
                               f"was not passed in!") from None

    def get_attr(self, target: Any, args: tuple, kwargs: dict) -> Any:
        return self.fetch_attr(target)

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        return target(*args, **kwargs)

    def call_method(self, target: Any, args: tuple, kwargs: dict) -> Any:
        self_obj, *rest = args
        return getattr(self_obj, target)(*rest, **kwargs)

    def call_module(self, target: Any, args: tuple, kwargs: dict) -> Any:
        return self.fetch_attr(target)(*args, **kwargs)

    def output(self, target: Any, args: tuple, kwargs: dict) -> Any:
        return args[0]

    # ---- helpers -------------------------------------------------------------------------
    def fetch_attr(self, target: str) -> Any:
        """``self.module.<target>`` for a qualified name."""
        obj: Any = self.module
        for i, atom in enumerate(target.split(".")):
            if not hasattr(obj, atom):
                raise RuntimeError(f"Node referenced nonexistent target "
                                   f"{'.'.join(target.split('.')[:i + 1])}")
            obj = getattr(obj, atom)
        return obj

    def fetch_args_kwargs_from_env(self, n: Node) -> tuple[tuple, dict]:
        """``n``'s arguments with each node replaced by its value."""
        return self.map_nodes_to_values(n.args, n), self.map_nodes_to_values(n.kwargs, n)

    def map_nodes_to_values(self, args: Argument, n: Node) -> Any:
        def load(a: Node) -> Any:
            if a not in self.env:
                raise RuntimeError(f"Node {n} referenced nonexistent value {a}! Run "
                                   f"Graph.lint() to diagnose such issues")
            return self.env[a]
        return map_arg(args, load)


class _TransformerTracer(Tracer):
    """Appends to the transformer's new graph; every module is a leaf."""

    def __init__(self, graph: Graph):
        super().__init__()
        self.graph = graph

    def is_leaf_module(self, m: Module, module_qualified_name: str) -> bool:
        return True


class Transformer(Interpreter):
    """An Interpreter over Proxies of a new graph: ``transform()`` returns a
    ``GraphModule`` with whatever the overridden methods recorded."""

    def __init__(self, module: GraphModule):
        super().__init__(module)
        self.new_graph = Graph()
        self.new_graph._codegen = self.graph._codegen
        self.tracer = _TransformerTracer(self.new_graph)
        self.tracer.root = module

    def placeholder(self, target: Any, args: tuple, kwargs: dict) -> Proxy:
        default = args[0] if args else _NO_DEFAULT
        node = self.new_graph.placeholder(target, default_value=default) \
            if default is not _NO_DEFAULT else self.new_graph.placeholder(target)
        return Proxy(node, self.tracer)

    def get_attr(self, target: Any, args: tuple, kwargs: dict) -> Proxy:
        return self.tracer.create_proxy("get_attr", target, args, kwargs)

    def call_module(self, target: Any, args: tuple, kwargs: dict) -> Any:
        submod = self.fetch_attr(target)
        return self.tracer.call_module(submod, submod.forward, args, kwargs)

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        return self.tracer.create_proxy("call_function", target, args, kwargs)

    def transform(self) -> GraphModule:
        """Run the rewrite; the new ``GraphModule`` shares ``module``'s attributes."""
        result = super().run(enable_io_processing=False)
        if result is not None:
            self.new_graph.output(map_aggregate(
                result, lambda a: a.node if isinstance(a, Proxy) else a))
        return GraphModule(self.module, self.new_graph)


_NO_DEFAULT = object()
