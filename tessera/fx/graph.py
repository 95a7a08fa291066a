"""``Graph``: the fx IR, a doubly linked list of ``Node``s with PyTorch's opcodes.

Nodes are appended at the insert point (the end, or inside ``inserting_before`` /
``inserting_after``), named uniquely after their targets (``add``, ``add_1``...), and
printed as ``print(graph)`` prints in PyTorch. ``python_code`` turns the graph into the
source of a ``forward`` function (``tessera.fx._codegen``); ``lint`` checks it.

>>> from tessera.fx import Graph
>>> import operator
>>> g = Graph()
>>> x = g.placeholder("x")
>>> y = g.call_function(operator.mul, (x, 2))
>>> _ = g.output(y)
>>> print(g)
graph():
    %x : [num_users=1] = placeholder[target=x]
    %mul : [num_users=1] = call_function[target=operator.mul](args = (%x, 2), kwargs = {})
    return mul
"""
from __future__ import annotations

import builtins
import inspect
import keyword
import re
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tessera.fx import _codegen
from tessera.fx.node import Argument, Node, Target, map_aggregate, map_arg

if TYPE_CHECKING:
    from tessera.fx.graph_module import GraphModule

__all__ = ["Graph", "PythonCode"]

PythonCode = _codegen.PythonCode
# a name may not shadow a keyword or a builtin unless it is that builtin
_ILLEGAL = {**{k: object() for k in keyword.kwlist}, **builtins.__dict__,
            "tessera": object(), "inf": object(), "nan": object(), "device": object()}
_NAME = re.compile(r"^([a-zA-Z_][0-9a-zA-Z_]*?)(?:_(\d+))?$")
_NOT_IDENT = re.compile("[^0-9a-zA-Z_]+")
_CAMEL = re.compile(r"(?<=[a-z])([A-Z])")


class _Namespace:
    """Unique Python names for nodes and globals: a name never repeats and never shadows
    a builtin or keyword, and a taken name gets the next ``_<n>`` suffix of its base."""

    def __init__(self):
        self._obj_to_name: dict[Any, str] = {}
        self._used: set[str] = set()
        self._count: dict[str, int] = {}

    def reserve(self, name: str, obj: Any) -> None:
        """Give ``obj`` the name ``name`` (a global every generated function has)."""
        self._used.add(name)
        self._obj_to_name[obj] = name

    def create_name(self, candidate: str, obj: Any | None) -> str:
        if obj is not None and obj in self._obj_to_name:
            return self._obj_to_name[obj]
        m = _NAME.match(candidate)
        if m is None:
            candidate = _NOT_IDENT.sub("_", candidate) or "_unnamed"
            if candidate[0].isdigit():
                candidate = "_" + candidate
            m = _NAME.match(candidate)
            assert m is not None
        base, num = m.group(1, 2)
        if num is None or candidate in self._used:
            n = self._count.get(base, 0)
            if _ILLEGAL.get(candidate, obj) is not obj:
                n += 1
                candidate = f"{base}_{n}"
        else:
            n = int(num)
        while candidate in self._used:
            n += 1
            candidate = f"{base}_{n}"
        self._used.add(candidate)
        self._count[base] = n
        if obj is not None:
            self._obj_to_name[obj] = candidate
        return candidate


class _NodeList:
    """``graph.nodes``: iterable (and reversible) while nodes are erased."""

    def __init__(self, graph: Graph, forward: bool = True):
        self._graph, self._forward = graph, forward

    def __len__(self) -> int:
        return self._graph._len

    def __iter__(self) -> Iterator[Node]:
        root = self._graph._root
        cur = root._next if self._forward else root._prev
        while cur is not root:
            nxt = cur._next if self._forward else cur._prev
            if not cur._erased:
                yield cur
            cur = nxt

    def __reversed__(self) -> Iterator[Node]:
        return iter(_NodeList(self._graph, not self._forward))


class _InsertPoint:
    def __init__(self, graph: Graph, insert: Callable[[Node], None]):
        self.graph, self.orig, graph._insert = graph, graph._insert, insert

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        self.graph._insert = self.orig


def _snake(s: str) -> str:
    return _CAMEL.sub(r"_\1", s).lower()


class Graph:
    """The fx IR: see the module docstring. ``owning_module`` is the ``GraphModule`` whose
    code this graph generates, if any."""

    def __init__(self, owning_module: GraphModule | None = None, tracer_cls: type | None = None,
                 tracer_extras: dict | None = None):
        self._root = Node(self, "", "root", "", (), {})
        self._len = 0
        self._namespace = _Namespace()
        self._insert: Callable[[Node], None] = self._root.prepend
        self.owning_module = owning_module
        self._tracer_cls = tracer_cls
        self._tracer_extras = tracer_extras
        self._codegen = _codegen.CodeGen()
        self._co_fields: dict[str, Any] = {}

    @property
    def nodes(self) -> _NodeList:
        """The nodes in order; ``len``, ``reversed`` and erasing while iterating work."""
        return _NodeList(self)

    @property
    def output_node(self) -> Node:
        """The ``output`` node (the last one)."""
        node = self._root._prev
        if node.op != "output":
            raise RuntimeError("Graph.output_node: the last node is not an output node")
        return node

    def find_nodes(self, *, op: str, target: Target | None = None) -> list[Node]:
        """The nodes with opcode ``op`` (and ``target``, when given), in order."""
        return [n for n in self.nodes if n.op == op and (target is None or n.target == target)]

    # ---- building ------------------------------------------------------------------------
    def create_node(self, op: str, target: Target, args: tuple | None = None,
                    kwargs: dict | None = None, name: str | None = None,
                    type_expr: Any | None = None) -> Node:
        """Make a node and insert it at the insert point; the base of every builder below."""
        candidate = name if name is not None else self._target_to_str(target)
        name = self._namespace.create_name(candidate, None)
        n = Node(self, name, op, target, tuple(args or ()), dict(kwargs or {}), type_expr)
        self._insert(n)
        self._len += 1
        return n

    def placeholder(self, name: str, type_expr: Any | None = None,
                    default_value: Any = inspect.Signature.empty) -> Node:
        """An input of the function named ``name`` (with a default value, if given)."""
        args = () if default_value is inspect.Signature.empty else (default_value,)
        return self.create_node("placeholder", name, args, type_expr=type_expr)

    def get_attr(self, qualified_name: str, type_expr: Any | None = None) -> Node:
        """Read the attribute ``qualified_name`` (``"layer.weight"``) of the module."""
        mod = self.owning_module
        if mod is not None and not _has_attr(mod, qualified_name):
            warnings.warn("Attempted to insert a get_attr Node with no underlying reference "
                          "in the owning GraphModule! Call GraphModule.add_submodule to add "
                          "the necessary submodule, GraphModule.add_parameter to add the "
                          "necessary Parameter, or nn.Module.register_buffer to add the "
                          "necessary buffer", stacklevel=2)
        return self.create_node("get_attr", qualified_name, type_expr=type_expr)

    def call_module(self, module_name: str, args: tuple | None = None,
                    kwargs: dict | None = None, type_expr: Any | None = None) -> Node:
        """Call the submodule ``module_name`` on ``args``/``kwargs``."""
        mod = self.owning_module
        if mod is not None and not _has_attr(mod, module_name):
            warnings.warn(f"Attempted to insert a call_module Node with no underlying "
                          f"reference in the owning GraphModule! Call "
                          f"GraphModule.add_submodule to add the necessary submodule "
                          f"({module_name})", stacklevel=2)
        return self.create_node("call_module", module_name, args, kwargs, type_expr=type_expr)

    def call_method(self, method_name: str, args: tuple | None = None,
                    kwargs: dict | None = None, type_expr: Any | None = None) -> Node:
        """Call ``args[0].<method_name>(*args[1:], **kwargs)``."""
        return self.create_node("call_method", method_name, args, kwargs, type_expr=type_expr)

    def call_function(self, the_function: Callable[..., Any], args: tuple | None = None,
                      kwargs: dict | None = None, type_expr: Any | None = None) -> Node:
        """Call ``the_function(*args, **kwargs)``."""
        return self.create_node("call_function", the_function, args, kwargs,
                                type_expr=type_expr)

    def output(self, result: Argument, type_expr: Any | None = None) -> Node:
        """The value the function returns."""
        return self.create_node("output", "output", (result,), type_expr=type_expr)

    def node_copy(self, node: Node, arg_transform: Callable[[Node], Argument] = lambda x: x
                  ) -> Node:
        """A copy of ``node`` (from any graph) here, its node arguments mapped through
        ``arg_transform``."""
        args = map_arg(node.args, arg_transform)
        kwargs = map_arg(node.kwargs, arg_transform)
        result = self.create_node(node.op, node.target, args, kwargs, node.name, node.type)
        result.meta = dict(node.meta)
        return result

    def graph_copy(self, g: Graph, val_map: dict[Node, Node], return_output_node: bool = False
                   ) -> Any:
        """Copy every node of ``g`` but its output here, filling ``val_map`` (old -> new);
        returns the value ``g`` outputs, mapped (or the output node, if asked)."""
        for node in g.nodes:
            if node in val_map:
                continue
            if node.op == "output":
                rv = map_arg(node.args[0], lambda n: val_map[n])
                return (rv, node) if return_output_node else rv
            val_map[node] = self.node_copy(node, lambda n: val_map[n])
        return None

    def erase_node(self, to_erase: Node) -> None:
        """Remove a node that nothing uses any more."""
        if to_erase.users:
            raise RuntimeError(f"Tried to erase Node {to_erase} but it still had "
                               f"{len(to_erase.users)} users in the graph: {to_erase.users}!")
        if to_erase.graph is not self:
            raise RuntimeError(f"Attempting to remove {to_erase} from wrong graph!")
        if to_erase._erased:
            warnings.warn(f"erase_node({to_erase}) on an already erased node", stacklevel=2)
            return
        to_erase._remove_from_list()
        to_erase._erased = True
        self._len -= 1
        to_erase._update_args_kwargs((), {})  # its inputs lose it as a user

    def inserting_before(self, n: Node | None = None) -> _InsertPoint:
        """``with graph.inserting_before(n):`` new nodes go right before ``n`` (the start
        of the graph when ``n`` is None)."""
        if n is None:
            return self.inserting_after(self._root)
        if n.graph is not self:
            raise RuntimeError("inserting_before: the node belongs to another graph")
        return _InsertPoint(self, n.prepend)

    def inserting_after(self, n: Node | None = None) -> _InsertPoint:
        """``with graph.inserting_after(n):`` new nodes go right after ``n`` (each after
        the previous one; the end of the graph when ``n`` is None)."""
        if n is None:
            return self.inserting_before(self._root)
        if n.graph is not self:
            raise RuntimeError("inserting_after: the node belongs to another graph")

        last = [n]

        def insert(new: Node) -> None:
            last[0].append(new)
            last[0] = new
        return _InsertPoint(self, insert)

    # ---- passes --------------------------------------------------------------------------
    def eliminate_dead_code(self, is_impure_node: Callable[[Node], bool] | None = None) -> bool:
        """Erase the nodes nothing uses (but impure ones); True if the graph changed."""
        self.lint()
        changed = False
        for node in reversed(self.nodes):
            impure = is_impure_node(node) if is_impure_node is not None else node.is_impure()
            if not impure and not node.users:
                self.erase_node(node)
                changed = True
        return changed

    def lint(self) -> None:
        """Check the graph is well formed: known opcodes, nodes owned by this graph, every
        argument defined before use, unique names, and (with an owning module) that
        ``get_attr``/``call_module`` targets exist."""
        seen: set[Node] = set()
        names: set[str] = set()
        for node in self.nodes:
            if node.op not in ("placeholder", "get_attr", "call_function", "call_module",
                               "call_method", "output"):
                raise RuntimeError(f"Node {node} had unknown opcode {node.op}!")
            if node.graph is not self:
                raise RuntimeError(f"Node '{node}' does not belong to this Graph!")
            for arg in node._input_nodes:
                if arg.graph is not self:
                    raise RuntimeError(f"Argument '{arg}' of Node '{node}' does not belong to "
                                       f"this Graph, but was used as an argument! If you are "
                                       f"copying nodes from another graph, make sure to use "
                                       f"``arg_transform`` on node_copy() to remap values\n{self}")
                if arg not in seen:
                    raise RuntimeError(f"Argument '{arg}' of Node '{node}' was used before it "
                                       f"has been defined! Please check that Nodes in the graph "
                                       f"are topologically ordered\n{self}")
            if node.name in names:
                raise RuntimeError(f"Node redefined name {node.name}!")
            seen.add(node)
            names.add(node.name)
        mod = self.owning_module
        if mod is None:
            return
        for node in self.nodes:
            if node.op in ("get_attr", "call_module") and not _has_attr(mod, node.target):
                kind = "module" if node.op == "call_module" else "attribute"
                raise RuntimeError(f"Node {node} target {node.target} references nonexistent "
                                   f"{kind} of the owning module")

    # ---- text ----------------------------------------------------------------------------
    def python_code(self, root_module: str, *, verbose: bool = False) -> _codegen.PythonCode:
        """The source of the ``forward`` this graph stands for, and the globals it needs."""
        return self._codegen.generate(self, root_module, verbose=verbose)

    def __str__(self) -> str:
        ret: list[str] = [""]
        lines = [node.format_node([], ret) for node in self.nodes]
        return "graph()" + ret[0] + ":" + "".join("\n    " + s for s in lines if s)

    def print_tabular(self) -> None:
        """Print the nodes as a table (opcode, name, target, args, kwargs); needs the
        optional ``tabulate`` package, as in PyTorch."""
        try:
            from tabulate import tabulate
        except ImportError:
            print("`print_tabular` relies on the library `tabulate`, which could not be found "
                  "on this machine. Run `pip install tabulate` to install the library.")
            raise
        rows = [[n.op, n.name, n.target, n.args, n.kwargs] for n in self.nodes]
        print(tabulate(rows, headers=["opcode", "name", "target", "args", "kwargs"]))

    def process_inputs(self, *args: Any) -> Any:
        return self._codegen.process_inputs(*args)

    def process_outputs(self, out: Any) -> Any:
        return self._codegen.process_outputs(out)

    @staticmethod
    def _target_to_str(target: Target) -> str:
        if callable(target):
            return _snake(target.__name__)
        if target.startswith("__") and target.endswith("__"):
            target = target[2:-2]
        return _snake(target)

    # ---- copying and pickling ------------------------------------------------------------
    def __getstate__(self) -> dict:
        """Nodes as tuples with other nodes named (``_Ref``), so pickle and deepcopy
        rebuild the list; the owning module is not part of the graph's state."""
        index = {n: i for i, n in enumerate(self.nodes)}
        def ref(n: Node) -> _Ref:
            return _Ref(index[n])
        nodes = [(n.name, n.op, n.target, map_arg(n.args, ref), map_arg(n.kwargs, ref),
                  n.type, n.meta) for n in self.nodes]
        return {"nodes": nodes, "codegen": self._codegen, "tracer_cls": self._tracer_cls,
                "tracer_extras": self._tracer_extras, "co_fields": self._co_fields}

    def __setstate__(self, state: dict) -> None:
        Graph.__init__(self, None, state["tracer_cls"], state["tracer_extras"])
        self._codegen = state["codegen"]
        self._co_fields = state["co_fields"]
        made: list[Node] = []
        def deref(a: Argument) -> Argument:
            return made[a.index] if isinstance(a, _Ref) else a
        for name, op, target, args, kwargs, type_expr, meta in state["nodes"]:
            n = self.create_node(op, target, map_aggregate(args, deref),
                                 map_aggregate(kwargs, deref), name, type_expr)
            n.meta = meta
            made.append(n)


class _Ref:
    """A node argument inside a pickled graph: the index of the node it names."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __reduce__(self):
        return _Ref, (self.index,)


def _has_attr(mod: Any, qualified_name: str) -> bool:
    for atom in qualified_name.split("."):
        if not hasattr(mod, atom):
            return False
        mod = getattr(mod, atom)
    return True
