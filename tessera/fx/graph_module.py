"""``GraphModule``: an ``nn.Module`` whose ``forward`` is Python generated from a ``Graph``.

The submodules and attributes the graph names (``call_module`` / ``get_attr`` targets) are
copied from ``root`` by their qualified names, so parameters are shared with the module
that was traced and ``state_dict`` has the same keys. After editing ``gm.graph``, call
``gm.recompile()`` to regenerate ``gm.code``. Each instance has its own class, so its
``forward`` can change without touching other GraphModules. It is an ordinary module
whose ``forward`` is ordinary code, so ``nn.Graph`` compiles it like any model.

>>> import tessera
>>> from tessera import nn
>>> from tessera.fx import symbolic_trace
>>> gm = symbolic_trace(nn.Sequential(nn.Linear(3, 2), nn.ReLU()))
>>> sorted(gm.state_dict())
['0.bias', '0.weight']
>>> print(gm.code.strip())
def forward(self, input):
    input_1 = input
    _0 = getattr(self, "0")(input_1);  input_1 = None
    _1 = getattr(self, "1")(_0);  _0 = None
    return _1
"""
from __future__ import annotations

import itertools
import linecache
from typing import Any

from tessera._tensor import Tensor
from tessera.fx._codegen import PythonCode
from tessera.fx.graph import Graph
from tessera.nn.modules.module import Module
from tessera.nn.parameter import Parameter

__all__ = ["GraphModule"]

_KEYS = itertools.count()


def _forward_from_src(src: str, globals_: dict[str, Any]):
    """Compile generated source into a function; the source is registered with
    ``linecache`` so tracebacks through it show the generated lines."""
    key = f"<eval_with_key>.{next(_KEYS)}"
    linecache.cache[key] = (len(src), None, src.splitlines(True), key)
    scope = dict(globals_)
    exec(compile(src, key, "exec"), scope)
    return scope["forward"]


def _copy_attr(from_module: Module, to_module: Module, target: str) -> None:
    """Copy ``from_module.<target>`` to the same qualified name under ``to_module``,
    making plain ``Module``s for missing intermediate levels."""
    *prefix, field = target.split(".")
    for item in prefix:
        f = getattr(from_module, item)
        t = getattr(to_module, item, None)
        if f is t:
            return  # a parent already copied whole
        if t is None:
            t = Module()
            setattr(to_module, item, t)
        from_module, to_module = f, t
    orig = getattr(from_module, field)
    if isinstance(orig, Tensor) and not isinstance(orig, Parameter):
        to_module.register_buffer(field, orig)
    else:
        setattr(to_module, field, orig)


def _assign_attr(obj: Any, to_module: Module, target: str) -> None:
    *prefix, field = target.split(".")
    for item in prefix:
        t = getattr(to_module, item, None)
        if t is None:
            t = Module()
            setattr(to_module, item, t)
        to_module = t
    if isinstance(obj, Tensor) and not isinstance(obj, Parameter):
        to_module.register_buffer(field, obj)
    else:
        setattr(to_module, field, obj)


class GraphModule(Module):
    """``GraphModule(root, graph, class_name="GraphModule")``: see the module docstring.
    ``root`` is a module (attributes copied by qualified name) or a dict from qualified
    names to the objects to install."""

    def __new__(cls, *args: Any, **kwargs: Any):
        # a class per instance: ``recompile`` sets ``forward`` on it
        for t in cls.__mro__:
            if t.__qualname__.split(".")[-1] != "GraphModuleImpl":
                cls = t
                break

        class GraphModuleImpl(cls):  # type: ignore[valid-type,misc]
            pass
        return super().__new__(GraphModuleImpl)

    def __init__(self, root: Module | dict[str, Any], graph: Graph,
                 class_name: str = "GraphModule"):
        super().__init__()
        type(self).__name__ = class_name
        if isinstance(root, Module):
            self.training = root.training
            for node in graph.nodes:
                if node.op in ("get_attr", "call_module"):
                    _copy_attr(root, self, node.target)
        elif isinstance(root, dict):
            targets = []
            for node in graph.nodes:
                if node.op in ("get_attr", "call_module"):
                    if node.target not in root:
                        raise RuntimeError(f"Node {node} referenced target {node.target} but "
                                           f"that target was not provided in ``root``!")
                    targets.append(node.target)
            for target in sorted(targets, key=lambda t: t.count(".")):
                _assign_attr(root[target], self, target)
        else:
            raise RuntimeError(f"Unsupported type {root} passed for root!")
        self.meta: dict[str, Any] = {}
        self.graph = graph

    @property
    def graph(self) -> Graph:
        """The graph this module runs; assigning one regenerates ``forward``."""
        return self._graph

    @graph.setter
    def graph(self, g: Graph) -> None:
        if not isinstance(g, Graph):
            raise TypeError(f"GraphModule.graph must be a tessera.fx.Graph, got {type(g)}")
        self._graph = g
        g.owning_module = self
        self.recompile()

    @property
    def code(self) -> str:
        """The generated source of ``forward``."""
        return self._code

    def recompile(self) -> PythonCode:
        """Regenerate ``forward`` from ``self.graph`` (after editing the graph)."""
        python_code = self._graph.python_code(root_module="self")
        self._code = python_code.src
        type(self).forward = _forward_from_src(self._code, python_code.globals)
        for _, mod in self.named_children():
            if isinstance(mod, GraphModule):
                mod.recompile()
        return python_code

    # ---- submodules ----------------------------------------------------------------------
    def add_submodule(self, target: str, m: Module) -> bool:
        """Install ``m`` at the qualified name ``target``, making empty modules on the way;
        False if a name on the way is not a module."""
        *prefix, field = target.split(".")
        mod: Module = self
        for item in prefix:
            sub = getattr(mod, item, None)
            if sub is None:
                sub = Module()
                setattr(mod, item, sub)
            if not isinstance(sub, Module):
                return False
            mod = sub
        mod.add_module(field, m)
        return True

    def delete_submodule(self, target: str) -> bool:
        """Remove the submodule at ``target``; False if there is none."""
        *path, field = target.split(".")
        mod: Any = self
        for item in path:
            if not hasattr(mod, item):
                return False
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                return False
        if not isinstance(getattr(mod, field, None), Module):
            return False
        delattr(mod, field)
        return True

    def delete_all_unused_submodules(self) -> None:
        """Remove every submodule no node calls or reads (a used module's parents and
        children stay)."""
        used: set[str] = set()
        for node in self.graph.nodes:
            if node.op in ("call_module", "get_attr"):
                atoms = node.target.split(".")
                used.update(".".join(atoms[:i]) for i in range(1, len(atoms) + 1))
                if node.op == "call_module":
                    try:
                        sub = self.get_submodule(node.target)
                    except AttributeError:
                        continue
                    used.update(f"{node.target}.{n}" for n, _ in sub.named_modules() if n)
        for name in [n for n, _ in self.named_modules() if n and n not in used]:
            self.delete_submodule(name)

    # ---- printing and copying ------------------------------------------------------------
    def print_readable(self, print_output: bool = True) -> str:
        """``forward`` as a class definition (GraphModule children included), printed
        and returned."""
        out = _readable(self, self._get_name())
        if print_output:
            print(out)
        return out

    def __str__(self) -> str:
        return "\n".join([super().__str__(), self._code,
                          "# To see more debug info, please use `graph_module.print_readable()`"])

    def __reduce__(self):
        # pickle and deepcopy: the attributes with the graph, rebuilt into a fresh class
        return _rebuild, (type(self).__name__, dict(self.__dict__))

    def __copy__(self) -> GraphModule:
        res = GraphModule(self, self.graph, type(self).__name__)
        res.meta = self.meta
        return res


def _rebuild(class_name: str, state: dict[str, Any]) -> GraphModule:
    gm = GraphModule.__new__(GraphModule)
    type(gm).__name__ = class_name
    gm.__dict__.update(state)
    gm.graph = state["_graph"]
    return gm


def _readable(gm: GraphModule, name: str) -> str:
    src = gm.graph.python_code(root_module="self", verbose=True).src.lstrip("\n")
    code = _indent(f"class {name}(tessera.nn.Module):\n" + src, 4)
    subs = [""] + [_readable(m, n) for n, m in gm.named_children() if isinstance(m, GraphModule)]
    return code + _indent("\n".join(subs), 4)


def _indent(s: str, n: int) -> str:
    lines = s.split("\n")
    return lines[0] + "".join("\n" + " " * n + line for line in lines[1:]) if len(lines) > 1 \
        else s
