"""Python source from an fx ``Graph``: the ``forward`` a ``GraphModule`` runs.

One statement per node, in order, PyTorch's layout: operators as operators (``add = x +
y``), ``a.b`` attribute reads, methods as methods, tessera functions by their public names
(``tessera.relu(x)``, with ``tessera`` among the globals), other functions through a
global bound to the function object, and each value set to None after its last use so a
long graph holds no more memory than the code it came from.
"""
from __future__ import annotations

import enum
import math
import operator
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tessera._tensor import Tensor
from tessera.device import device
from tessera.fx.node import Node, _public_path, qualified_name

if TYPE_CHECKING:
    from tessera.fx.graph import Graph

__all__ = ["CodeGen", "PythonCode"]

# operator functions printed as Python operators
_BINARY = {"add": "{} + {}", "sub": "{} - {}", "mul": "{} * {}", "floordiv": "{} // {}",
           "truediv": "{} / {}", "div": "{} / {}", "mod": "{} % {}", "pow": "{} ** {}",
           "lshift": "{} << {}", "rshift": "{} >> {}", "and_": "{} & {}", "or_": "{} | {}",
           "xor": "{} ^ {}", "getitem": "{}[{}]", "matmul": "{} @ {}"}
MAGIC = {"eq": "{} == {}", "ne": "{} != {}", "lt": "{} < {}", "gt": "{} > {}",
         "le": "{} <= {}", "ge": "{} >= {}", "pos": "+{}", "neg": "-{}", "invert": "~{}",
         **_BINARY}
REFLECTABLE = tuple(_BINARY)


@dataclass
class PythonCode:
    """The source of a ``forward`` and the globals it runs with."""

    src: str
    globals: dict[str, Any]


def _format_target(base: str, target: str) -> str:
    for atom in target.split("."):
        base = f"{base}.{atom}" if atom.isidentifier() else f'getattr({base}, "{atom}")'
    return base


class CodeGen:
    """Turns a graph into ``def forward(self, ...)``; subclasses may reshape the inputs and
    outputs (``process_inputs`` / ``process_outputs``), as PyTorch's can."""

    def process_inputs(self, *args: Any) -> Any:
        return args

    def process_outputs(self, outputs: Any) -> Any:
        return outputs

    def generate(self, graph: Graph, root_module: str, *, verbose: bool = False) -> PythonCode:
        from tessera.fx.graph import _Namespace
        # the package namespace the generated code names functions through: loaded, since
        # tessera.fx is reached through it (and importing it here would go up the layers)
        tessera = sys.modules["tessera"]
        namespace = _Namespace()
        for node in graph.nodes:
            namespace.create_name(node.name, node)
        globals_: dict[str, Any] = {}

        def add_global(hint: str, obj: Any) -> str:
            if _public_path(obj) is not None:
                return qualified_name(obj)  # tessera.relu, through the ``tessera`` global
            name = namespace.create_name(hint, obj)
            globals_[name] = obj
            return name

        for name, obj in (("tessera", tessera), ("inf", math.inf), ("nan", math.nan),
                          ("device", device)):
            namespace.reserve(name, obj)
            globals_[name] = obj
        emitter = _Emitter(add_global, root_module)
        last_use: dict[Node, Node] = {}
        freed_by: dict[Node, list[Node]] = {}
        for node in reversed(graph.nodes):
            for inp in node._input_nodes:
                if inp not in last_use:
                    last_use[inp] = node
                    freed_by.setdefault(node, []).append(inp)
        body: list[str] = []
        free_vars: list[str] = []
        wrapped: dict[str, None] = {}
        noted = False
        for node in graph.nodes:
            if verbose and node.op not in ("placeholder", "output") and not noted:
                body.append("# No stacktrace found for following nodes\n")
                noted = True
            body.append(emitter.emit(node, free_vars, wrapped))
            if node.op == "placeholder":
                continue
            if node.op == "output":
                body.append("\n")
                continue
            dead = list(freed_by.get(node, []))
            if not node.users:
                dead.append(node)
            body.append(f";  {' = '.join([repr(n) for n in dead] + ['None'])}\n" if dead
                        else "\n")
        if not body:
            body.append("pass\n")
        wrap_stmts = ""
        if wrapped:
            from tessera.fx.tracer import wrap
            wrap_name = add_global("wrap", wrap)
            wrap_stmts = "\n".join(f'{wrap_name}("{name}")' for name in wrapped)
        code = "".join(body).lstrip("\n")
        code = "\n".join("    " + line for line in code.split("\n"))
        if free_vars[:1] != ["self"]:
            free_vars.insert(0, "self")
        src = f"\n{wrap_stmts}\n\ndef forward({', '.join(free_vars)}):\n{code}"
        return PythonCode(src, globals_)


class _Emitter:
    """One node's statement; ``add_global`` names the objects the code refers to."""

    def __init__(self, add_global, root_module: str):
        self.add_global, self.root = add_global, root_module

    def repr(self, arg: Any) -> str:
        if isinstance(arg, Node):
            return repr(arg)
        if isinstance(arg, tuple) and hasattr(arg, "_fields"):
            return self.add_global(qualified_name(type(arg)), type(arg)) + repr(tuple(arg))
        if isinstance(arg, enum.Enum):
            return f"{self.add_global(type(arg).__name__, type(arg))}.{arg.name}"
        if isinstance(arg, Tensor):
            return f"tessera.Tensor(size={list(arg.shape)}, dtype={arg.dtype})"
        if isinstance(arg, tuple):
            inner = ", ".join(self.repr(a) for a in arg)
            return f"({inner},)" if len(arg) == 1 else f"({inner})"
        if isinstance(arg, list):
            return "[" + ", ".join(self.repr(a) for a in arg) + "]"
        if isinstance(arg, dict):
            return "{" + ", ".join(f"{k!r}: {self.repr(v)}" for k, v in arg.items()) + "}"
        if isinstance(arg, slice):
            return f"slice({self.repr(arg.start)}, {self.repr(arg.stop)}, {self.repr(arg.step)})"
        if isinstance(arg, type):
            return self.add_global(qualified_name(arg), arg)
        return repr(arg)

    def args(self, args: tuple, kwargs: dict) -> str:
        parts = [self.repr(a) for a in args]
        parts += [f"{k} = {self.repr(v)}" for k, v in kwargs.items()]
        return ", ".join(parts)

    def emit(self, node: Node, free_vars: list[str], wrapped: dict[str, None]) -> str:
        op, target, name = node.op, node.target, repr(node)
        if op == "placeholder":
            default = f" = {self.repr(node.args[0])}" if node.args else ""
            free_vars.append(f"{target}{default}")
            raw = target.replace("*", "")
            return f"{name} = {raw}\n" if raw != name else ""
        if op == "call_method":
            return (f"{name} = {_format_target(self.repr(node.args[0]), target)}"
                    f"({self.args(node.args[1:], node.kwargs)})")
        if op == "call_module":
            call = f"{_format_target(self.root, target)}({self.args(node.args, node.kwargs)})"
            return f"{name} = {call}"
        if op == "get_attr":
            return f"{name} = {_format_target(self.root, target)}"
        if op == "output":
            return f"return {self.repr(node.args[0])}"
        fn_name = getattr(target, "__name__", "")
        if getattr(target, "__module__", "") == "_operator" and fn_name in MAGIC and \
                getattr(operator, fn_name, None) is target and not node.kwargs:
            return f"{name} = {MAGIC[fn_name].format(*(self.repr(a) for a in node.args))}"
        global_name = self.add_global(qualified_name(target), target)
        if global_name == "getattr" and len(node.args) == 2 and not node.kwargs and \
                isinstance(node.args[1], str) and node.args[1].isidentifier():
            return f"{name} = {_format_target(self.repr(node.args[0]), node.args[1])}"
        if node.meta.get("is_wrapped", False):
            wrapped.setdefault(global_name)
        return f"{name} = {global_name}({self.args(node.args, node.kwargs)})"
