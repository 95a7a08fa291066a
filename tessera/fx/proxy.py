"""``Proxy``: the stand-in value that records what symbolic tracing does to it.

Each Proxy wraps a ``Node``. Python operators on it append ``call_function`` nodes of the
``operator`` module (``x + 1`` -> ``operator.add``), attribute reads append
``getattr`` (``x.shape``), and method calls append ``call_method`` (``x.relu()``).
Anything that needs a concrete value (``bool``, ``len``, iteration other than unpacking)
raises ``TraceError``, PyTorch's way of saying the code has data-dependent control flow.

>>> from tessera.fx import Graph, Proxy
>>> g = Graph()
>>> x = Proxy(g.placeholder("x"))
>>> y = (x * 2).relu()
>>> _ = g.output(y.node)
>>> [n.op for n in g.nodes]
['placeholder', 'call_function', 'call_method', 'output']
"""
from __future__ import annotations

import dis
import enum
import inspect
import operator
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from tessera._dtype import dtype as _Dtype
from tessera.device import device as _Device
from tessera.fx._codegen import MAGIC, REFLECTABLE
from tessera.fx.graph import Graph
from tessera.fx.node import Argument, Node, Target

__all__ = ["Proxy", "Attribute", "TraceError", "TracerBase", "GraphAppendingTracer"]

_BASE_TYPES = (str, int, float, bool, complex, _Dtype, _Device, type(None), type(...),
               enum.Enum, range)


# id(recording wrapper) -> the function it records (tracer._wrapped_function fills it)
RECORDING_OF: dict[int, Callable] = {}


class TraceError(ValueError):
    """Symbolic tracing met something it cannot record (control flow on a traced value)."""


class TracerBase:
    """What a Proxy needs of a tracer: a graph to append to and ``create_arg``."""

    graph: Graph
    record_stack_traces: bool = False
    trace_asserts: bool = False
    module_stack: dict

    def create_node(self, kind: str, target: Target, args: tuple, kwargs: dict,
                    name: str | None = None, type_expr: Any | None = None) -> Node:
        """Append a node; subclasses may annotate it (``node.meta``)."""
        # a function read from a namespace while Proxies live is its recording wrapper
        target = RECORDING_OF.get(id(target), target)
        node = self.graph.create_node(kind, target, args, kwargs, name, type_expr)
        stack = getattr(self, "module_stack", None)
        if stack:
            node.meta["nn_module_stack"] = dict(stack)
        return node

    def proxy(self, node: Node) -> Proxy:
        return Proxy(node, self)

    def create_proxy(self, kind: str, target: Target, args: tuple, kwargs: dict,
                     name: str | None = None, type_expr: Any | None = None,
                     proxy_factory_fn=None) -> Proxy:
        """A node for ``target(*args, **kwargs)`` (Proxies in them become their nodes),
        wrapped in a Proxy."""
        args_ = self.create_arg(args)
        kwargs_ = self.create_arg(kwargs)
        node = self.create_node(kind, target, args_, kwargs_, name, type_expr)
        return proxy_factory_fn(node) if proxy_factory_fn else self.proxy(node)

    def create_arg(self, a: Any) -> Argument:
        """Lower a value met while tracing to what a node may hold as an argument."""
        if isinstance(a, Proxy):
            return a.node
        if hasattr(a, "__fx_create_arg__"):
            return a.__fx_create_arg__(self)
        if isinstance(a, tuple):
            items = [self.create_arg(e) for e in a]
            return type(a)(*items) if hasattr(a, "_fields") else tuple(items)
        if isinstance(a, list):
            return [self.create_arg(e) for e in a]
        if isinstance(a, dict):
            out = {}
            for k, v in a.items():
                if not isinstance(k, str) and isinstance(self.create_arg(k), Node):
                    raise RuntimeError(f"Keys for dictionaries used as an argument cannot "
                                       f"contain a Node. Got key: {k}")
                out[k] = self.create_arg(v)
            return out
        if isinstance(a, slice):
            return slice(self.create_arg(a.start), self.create_arg(a.stop),
                         self.create_arg(a.step))
        if isinstance(a, _BASE_TYPES) or a is None or a is ...:
            return a
        raise NotImplementedError(f"argument of type: {type(a)}")

    def to_bool(self, obj: Proxy) -> bool:
        """``bool(proxy)``: unknowable while tracing (a subclass may decide)."""
        raise TraceError("symbolically traced variables cannot be used as inputs to control "
                         "flow")

    def iter(self, obj: Proxy) -> Iterator:
        """``iter(proxy)`` other than unpacking into names: unknowable while tracing."""
        raise TraceError("Proxy object cannot be iterated. This can be attempted when the "
                         "Proxy is used in a loop or as a *args or **kwargs function "
                         "argument. See the torch.fx docs on pytorch.org for a more detailed "
                         "explanation of what types of control flow can be traced, and check "
                         "out the Proxy docstring for help troubleshooting Proxy iteration "
                         "errors")

    def keys(self, obj: Proxy) -> Proxy:
        """``**proxy``: records ``proxy.keys()``."""
        return Attribute(obj, "keys")()


class GraphAppendingTracer(TracerBase):
    """The tracer of a Proxy made directly around a node: appends to that node's graph."""

    def __init__(self, graph: Graph):
        from tessera.fx import tracer  # the layer's upper half: it imports this module
        self.graph = graph
        self.module_stack = {}
        self.scope = None
        # tessera.cat(proxies) records a node for as long as Proxies on this tracer live,
        # PyTorch's __torch_function__ behaviour without a check on every eager call
        tracer.hold_namespaces()
        weakref.finalize(self, tracer.release_namespaces)


class Proxy:
    """A traced value: see the module docstring. ``Proxy(node)`` wraps a node of any graph,
    so a pass can build nodes by writing ordinary arithmetic."""

    __getitem__: Callable[..., Proxy]  # with the other operators, set below the class

    def __init__(self, node: Node, tracer: TracerBase | None = None):
        if tracer is None:
            tracer = GraphAppendingTracer(node.graph)
        self.tracer = tracer
        self.node = node

    def __repr__(self) -> str:
        return f"Proxy({self.node.name})"

    def __getattr__(self, k: str) -> Attribute:
        if k.startswith("__") and k.endswith("__"):
            raise AttributeError(k)  # copy/pickle probe dunders: not a traced attribute
        return Attribute(self, k)

    def __call__(self, *args: Any, **kwargs: Any) -> Proxy:
        return self.tracer.create_proxy("call_method", "__call__", (self,) + args, kwargs)

    def __iter__(self) -> Iterator[Proxy]:
        # ``a, b = proxy`` is fine: the unpacking instruction says how many items
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        if caller is not None:
            insts = list(dis.get_instructions(caller.f_code))
            i = bisect_left(insts, caller.f_lasti, key=lambda ins: ins.offset)
            if i < len(insts) and insts[i].opname == "UNPACK_SEQUENCE":
                return (self[k] for k in range(insts[i].argval))
        return self.tracer.iter(self)

    def __bool__(self) -> bool:
        return self.tracer.to_bool(self)

    def keys(self) -> Proxy:
        return self.tracer.keys(self)

    def __len__(self) -> int:
        raise RuntimeError("'len' is not supported in symbolic tracing by default. If you want "
                           "this call to be recorded, please call tessera.fx.wrap('len') at "
                           "module scope")

    def __abs__(self) -> Proxy:
        return self.tracer.create_proxy("call_function", operator.abs, (self,), {})

    def __deepcopy__(self, memo: dict) -> Proxy:
        import copy
        return Proxy(copy.deepcopy(self.node, memo), self.tracer)

    def __getstate__(self) -> dict:
        return self.__dict__

    def __setstate__(self, d: dict) -> None:
        self.__dict__ = d


class Attribute(Proxy):
    """``proxy.name``: a method call if called (``call_method``), else a ``getattr`` node
    made on first use."""

    def __init__(self, root: Proxy, attr: str):
        self.root = root
        self.attr = attr
        self.tracer = root.tracer
        self._node: Node | None = None

    @property
    def node(self) -> Node:  # type: ignore[override]
        if self._node is None:
            self._node = self.tracer.create_proxy("call_function", getattr,
                                                  (self.root, self.attr), {}).node
        return self._node

    def __call__(self, *args: Any, **kwargs: Any) -> Proxy:
        return self.tracer.create_proxy("call_method", self.attr, (self.root,) + args, kwargs)


def _magic(name: str):
    target = getattr(operator, name)

    def impl(*args: Any) -> Proxy:
        return args[0].tracer.create_proxy("call_function", target, args, {})
    impl.__name__ = f"__{name.strip('_')}__"
    return impl


def _reflected(name: str):
    target = getattr(operator, name)

    def impl(self: Proxy, lhs: Any) -> Proxy:
        return self.tracer.create_proxy("call_function", target, (lhs, self), {})
    impl.__name__ = f"__r{name.strip('_')}__"
    return impl


for _name in MAGIC:
    if not hasattr(operator, _name):
        continue  # "div": Python 2's operator, kept for printing graphs that name it
    setattr(Proxy, f"__{_name.strip('_')}__", _magic(_name))
for _name in REFLECTABLE:
    if _name != "getitem" and hasattr(operator, _name):
        setattr(Proxy, f"__r{_name.strip('_')}__", _reflected(_name))
Proxy.__hash__ = object.__hash__  # type: ignore[method-assign]  # __eq__ is traced
