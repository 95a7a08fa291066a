"""Symbolic tracing: run a module's ``forward`` on Proxies and record a ``Graph``.

``Tracer.trace(root)`` makes one ``placeholder`` per argument of ``forward`` and calls it
on Proxies. While it runs, and only then, the tracer patches:

* module calls (through ``nn.Module``'s call-wrapper registration, the one ``nn.Graph``
  uses): a leaf module (``tessera.nn``'s own layers, by default) becomes one
  ``call_module`` node, any other module is traced through;
* ``nn.Module.__getattr__``: a parameter or buffer read becomes a ``get_attr`` node;
* the functions of tessera's public namespaces (``tessera.relu``,
  ``tessera.nn.functional.gelu``; also where user code imported them by name), of the
  ``autowrap_modules`` (``math``) and the ``wrap``-ped functions: called with a Proxy
  among the arguments they become one ``call_function`` node of the original function;
* ``Tensor``'s methods and operators: a concrete tensor meeting a Proxy (``self.const +
  x``) becomes a ``call_method`` node.

Why patch the namespaces rather than give tessera a ``__torch_function__`` protocol:
tessera's public functions check their inputs (shapes, types) before they reach
``dispatch``, so a hook in dispatch would never see a Proxy, and a check for one in every
public function would cost on the eager hot path. Patching for the duration of a trace,
as PyTorch patches ``math``, costs nothing outside tracing and keeps ``tessera.fx`` out of
the layers below it.

>>> import tessera
>>> from tessera import nn
>>> from tessera.fx import symbolic_trace
>>> class M(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.lin = nn.Linear(4, 4)
...     def forward(self, x):
...         return tessera.relu(self.lin(x)).sum(1)
>>> print(symbolic_trace(M()).code.strip())
def forward(self, x):
    lin = self.lin(x);  x = None
    relu = tessera.relu(lin);  lin = None
    sum_1 = relu.sum(1);  relu = None
    return sum_1
"""
from __future__ import annotations

import builtins
import functools
import inspect
import math
import sys
import types
from collections import OrderedDict
from collections.abc import Callable
from itertools import chain
from typing import Any

from tessera._tensor import Tensor
from tessera.fx.graph import Graph
from tessera.fx.node import NAMESPACES, Argument, has_side_effect, map_aggregate
from tessera.fx.proxy import RECORDING_OF, Proxy, TracerBase
from tessera.nn.modules import module as _module
from tessera.nn.modules.container import Sequential
from tessera.nn.modules.module import Module
from tessera.nn.parameter import Parameter
from tessera.ops.library import OpOverload, OpOverloadPacket

__all__ = ["Tracer", "symbolic_trace", "wrap", "PH", "is_fx_tracing"]

_WRAPPED: dict[tuple[int, str], dict] = {}   # (id(globals), name) -> globals, from wrap()
_TRACING = [False]
# never recorded: a Proxy is not a tensor, as in PyTorch
_NOT_TRACED = frozenset(("is_tensor", "is_storage"))
_TENSOR_DUNDERS = ("__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__mod__",
                   "__pow__", "__matmul__", "__and__", "__or__", "__xor__", "__lshift__",
                   "__rshift__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__")


class _PH:
    """``concrete_args`` value meaning "keep this one an input" (PyTorch's ``fx.PH``)."""

    def __repr__(self) -> str:
        return "PH"


PH = _PH()


def is_fx_tracing() -> bool:
    """Whether a symbolic trace is running.

    >>> is_fx_tracing()
    False
    """
    return _TRACING[0]


def wrap(fn_or_name: str | Callable) -> Any:
    """Keep a module-level function as one ``call_function`` node instead of tracing into
    it; call at the top level of the module that defines (or imports) it.

    >>> import tessera.fx
    >>> def clamp01(x):
    ...     return x.clamp(0, 1)
    >>> _ = tessera.fx.wrap("clamp01")  # doctest: +SKIP
    """
    if callable(fn_or_name):
        name = fn_or_name.__name__
    elif isinstance(fn_or_name, str):
        name = fn_or_name
    else:
        raise RuntimeError("Unsupported type for global function! Must be either a callable or "
                           "string name")
    frame = inspect.currentframe()
    caller = frame.f_back if frame is not None else None
    if caller is None or caller.f_code.co_name != "<module>":
        raise NotImplementedError("wrap must be called at the top level of a module")
    _WRAPPED[(id(caller.f_globals), name)] = caller.f_globals
    return fn_or_name


@has_side_effect
def _assert(condition: Any, message: str) -> None:
    """Checks a specialised ``concrete_args`` value when the traced code runs."""
    if not condition:
        raise AssertionError(message)


def _find_proxy(*objects: Any) -> Proxy | None:
    found: list[Proxy] = []
    map_aggregate(objects, lambda x: found.append(x) if isinstance(x, Proxy) else None)
    return found[0] if found else None


_FN_WRAPPERS: dict[tuple[int, bool], tuple[Callable, Callable]] = {}


def _wrapped_function(fn: Callable, mark: bool) -> Callable:
    """``fn`` recording a ``call_function`` node when a Proxy is among its arguments."""
    key = (id(fn), mark)
    hit = _FN_WRAPPERS.get(key)
    if hit is not None and hit[0] is fn:
        return hit[1]

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        proxy = _find_proxy(args, kwargs)
        if proxy is None:
            return fn(*args, **kwargs)
        out = proxy.tracer.create_proxy("call_function", fn, args, kwargs)
        if mark:
            out.node.meta["is_wrapped"] = True
        return out
    _FN_WRAPPERS[key] = (fn, wrapped)
    RECORDING_OF[id(wrapped)] = fn
    return wrapped


def _wrapped_method(name: str, fn: Callable) -> Callable:
    """A Tensor method recording ``call_method`` when a Proxy is among its arguments."""
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        proxy = _find_proxy(args, kwargs)
        if proxy is None:
            return fn(*args, **kwargs)
        return proxy.tracer.create_proxy("call_method", name, args, kwargs)
    return wrapped


def _wrapped_op_call(call: Callable) -> Callable:
    """An operator of ``tessera.ops`` recording itself as the target of a
    ``call_function`` node when a Proxy is among its arguments."""
    def wrapped(op: Any, *args: Any, **kwargs: Any) -> Any:
        proxy = _find_proxy(args, kwargs)
        if proxy is None:
            return call(op, *args, **kwargs)
        return proxy.tracer.create_proxy("call_function", op, args, kwargs)
    return wrapped


class _Patcher:
    """Patches undone in reverse order when the trace ends (or fails)."""

    def __init__(self):
        self.undo: list[Callable[[], None]] = []
        self.visited: set[int] = set()

    def patch(self, d: dict, name: str, new: Any) -> None:
        if name in d:
            old = d[name]
            self.undo.append(lambda: d.__setitem__(name, old))
        else:
            self.undo.append(lambda: d.pop(name, None))
        d[name] = new

    def patch_method(self, cls: type, name: str, new: Any) -> None:
        if name in cls.__dict__:
            old = cls.__dict__[name]
            self.undo.append(lambda: setattr(cls, name, old))
        else:
            self.undo.append(lambda: delattr(cls, name))
        setattr(cls, name, new)

    def visit_once(self, thing: Any) -> bool:
        if id(thing) in self.visited:
            return False
        self.visited.add(id(thing))
        return True

    def revert(self) -> None:
        while self.undo:
            self.undo.pop()()


def _tessera_namespaces() -> list[types.ModuleType]:
    return [sys.modules[n] for n in NAMESPACES if n in sys.modules]


def _traceable(name: str, value: Any) -> bool:
    return not name.startswith("_") and name not in _NOT_TRACED and \
        isinstance(value, (types.FunctionType, types.BuiltinFunctionType))


# tessera's public functions, swapped for their recording wrappers while anything that
# records Proxies is alive: a running trace, or a Proxy made directly around a node (held
# by its GraphAppendingTracer). Counted, so nested holders share them and the last one out
# puts the originals back; nobody pays for it outside these. While held, ``tessera.relu``
# read as a value is the wrapper (nodes record the original: proxy.RECORDING_OF).
_HELD: dict[str, Any] = {"users": 0, "swapped": []}


def hold_namespaces() -> None:
    """Make calls of tessera's public functions on Proxies record ``call_function`` nodes,
    until the matching ``release_namespaces``."""
    if _HELD["users"] == 0:
        for mod in _tessera_namespaces():
            d = mod.__dict__
            for name, v in list(d.items()):
                if _traceable(name, v):
                    w = _wrapped_function(v, mark=False)
                    _HELD["swapped"].append((d, name, v, w))
                    d[name] = w
    _HELD["users"] += 1


def release_namespaces() -> None:
    """Undo one ``hold_namespaces``; the last release restores the original functions."""
    _HELD["users"] -= 1
    if _HELD["users"] == 0:
        for d, name, v, w in reversed(_HELD["swapped"]):
            if d.get(name) is w:
                d[name] = v
        _HELD["swapped"].clear()


def _tensor_methods() -> dict[str, Callable]:
    """Tensor's public methods and binary operators, by attribute name."""
    out: dict[str, Callable] = {}
    for klass in reversed(Tensor.__mro__[:-1]):
        for name, v in vars(klass).items():
            if isinstance(v, types.FunctionType) and (
                    not name.startswith("_") or name in _TENSOR_DUNDERS):
                out[name] = v
    return out


class Tracer(TracerBase):
    """Symbolic tracing, meant to be subclassed: override ``is_leaf_module``,
    ``call_module``, ``create_proxy``, ``create_node`` or ``create_arg`` to change what is
    recorded. ``Tracer().trace(root)`` returns the ``Graph``."""

    def __init__(self, autowrap_modules: tuple = (math,), autowrap_functions: tuple = (),
                 param_shapes_constant: bool = False):
        super().__init__()
        self._autowrap_function_ids = {
            id(v) for name, v in chain.from_iterable(m.__dict__.items() for m in autowrap_modules)
            if not name.startswith("_") and callable(v)}
        self._autowrap_function_ids.update(id(f) for f in autowrap_functions)
        self._autowrap_search = list(autowrap_modules)
        self.param_shapes_constant = param_shapes_constant
        self.proxy_buffer_attributes = True
        self.traced_func_name = "forward"
        self.submodule_paths: dict[Module, str] | None = None
        self.root_module_name = ""
        self.module_stack: OrderedDict = OrderedDict()
        self.num_calls: dict[str, int] = {}
        self.tensor_attrs: dict[int, str] = {}
        self._tessera_ids: set[int] = set()

    # ---- the overridable decisions -------------------------------------------------------
    def is_leaf_module(self, m: Module, module_qualified_name: str) -> bool:
        """Whether ``m`` is one ``call_module`` node (True for tessera.nn's own layers but
        ``Sequential``) or is traced through."""
        return type(m).__module__.startswith("tessera.nn") and not isinstance(m, Sequential)

    def path_of_module(self, mod: Module) -> str:
        """The qualified name of ``mod`` in the root module (``"layer1.0.conv1"``)."""
        if self.submodule_paths:
            path = self.submodule_paths.get(mod)
            if path is None:
                raise NameError("module is not installed as a submodule")
            return path
        for n, p in self.root.named_modules():
            if mod is p:
                return n
        raise NameError("module is not installed as a submodule")

    def call_module(self, m: Module, forward: Callable[..., Any], args: tuple,
                    kwargs: dict) -> Any:
        """A call of ``m``: a ``call_module`` node for a leaf, else ``forward`` traced."""
        path = self.path_of_module(m)
        calls = self.num_calls.get(path, 0)
        key = f"{path}@{calls}" if calls else path
        self.module_stack[key] = (path, type(m))
        self.num_calls[path] = calls + 1
        try:
            if not self.is_leaf_module(m, path):
                return forward(*args, **kwargs)
            return self.create_proxy("call_module", path, args, kwargs)
        finally:
            self.module_stack.pop(key, None)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Proxy]) -> Any:
        """A module attribute read while tracing: a parameter (or buffer) of the root
        becomes a ``get_attr`` Proxy, cached per name; anything else is returned as is."""
        if isinstance(attr_val, Parameter):
            hit = self._attr_proxy(attr_val, self.root.named_parameters(),
                                   parameter_proxy_cache)
            if hit is not None:
                return hit
        if self.proxy_buffer_attributes and isinstance(attr_val, Tensor):
            hit = self._attr_proxy(attr_val, self.root.named_buffers(), parameter_proxy_cache)
            if hit is not None:
                return hit
        return attr_val

    def _attr_proxy(self, val: Any, named, cache: dict[str, Proxy]) -> Proxy | None:
        for n, p in named:
            if val is p:
                if n not in cache:
                    cache[n] = self.create_proxy("get_attr", n, (), {})
                return cache[n]
        return None

    def create_arg(self, a: Any) -> Argument:
        """Besides what Proxies need: a parameter, a module's tensor attribute or a module
        becomes a ``get_attr`` node; another tensor becomes a ``_tensor_constant<n>``
        attribute of the root."""
        if isinstance(a, Parameter):
            for n, p in self.root.named_parameters():
                if a is p:
                    return self.create_node("get_attr", n, (), {})
            raise NameError("parameter is not a member of this module")
        if isinstance(a, Module):
            for n, mod in self.root.named_modules():
                if a is mod:
                    return self.create_node("get_attr", n, (), {})
            raise NameError("module is not installed as a submodule")
        if isinstance(a, Tensor):
            name = self.tensor_attrs.get(id(a))
            if name is None:
                name = self.get_fresh_qualname("_tensor_constant")
                setattr(self.root, name, a)
                self.tensor_attrs[id(a)] = name
            return self.create_node("get_attr", name, (), {})
        return super().create_arg(a)

    def get_fresh_qualname(self, prefix: str) -> str:
        """A new attribute name of the root starting with ``prefix``."""
        i = 0
        while hasattr(self.root, f"{prefix}{i}"):
            i += 1
        return f"{prefix}{i}"

    # ---- the trace -----------------------------------------------------------------------
    def create_args_for_root(self, root_fn: Callable, is_module: bool,
                             concrete_args: dict | tuple | None = None) -> tuple[Callable, list]:
        """One placeholder (or concrete value) per parameter of ``root_fn``."""
        fn = inspect.unwrap(root_fn)
        co = fn.__code__
        total = co.co_argcount + co.co_kwonlyargcount
        names = list(co.co_varnames)
        args: list[Any] = []
        skip = 0
        if is_module:
            if total == 0:
                raise RuntimeError("``self`` argument cannot be part of *args expansion!")
            skip = 1
            args.append(self.root)
        sig = inspect.signature(fn)
        arg_names = names[skip:total]
        if isinstance(concrete_args, tuple):
            if len(arg_names) != len(concrete_args):
                raise RuntimeError(f"Tracing expected {len(arg_names)} arguments but got "
                                   f"{len(concrete_args)} concrete arguments")
            concrete_args = dict(zip(arg_names, concrete_args))
        args.extend(self._placeholder(n, concrete_args, sig) for n in arg_names)
        has_var = co.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        if co.co_kwonlyargcount or has_var:
            extra = iter(names[total:])
            if co.co_flags & inspect.CO_VARARGS:
                args.append(self._placeholder("*" + next(extra), concrete_args, sig))
            if co.co_flags & inspect.CO_VARKEYWORDS:
                args.append(self._placeholder("**" + next(extra), concrete_args, sig))
            root_fn = _positional(root_fn, len(args))
        return root_fn, args

    def _placeholder(self, name: str, concrete_args: dict | None, sig: inspect.Signature) -> Any:
        default: tuple = ()
        if not name.startswith("*"):
            param = sig.parameters[name]
            default = () if param.default is inspect.Parameter.empty else (param.default,)
        if concrete_args is not None and name in concrete_args:
            value = concrete_args[name]
            out = self.create_proxy("placeholder", f"{name}_1", default, {})
            if isinstance(value, _PH):
                return out
            msg = f"{name} has been specialized to have value {value} but got another value"
            if type(value) in (bool, int, float, str):
                self.create_proxy("call_function", _assert, (out == value, msg), {})
            elif value is None:
                self.create_proxy("call_function", _assert_is_none, (out, msg), {})
            return value
        return self.create_proxy("placeholder", name, default, {})

    def trace(self, root: Module | Callable[..., Any], concrete_args: dict | None = None
              ) -> Graph:
        """Trace ``root`` (a module's ``forward``, or a function) into a new ``Graph``."""
        outer = _TRACING[0]
        _TRACING[0] = True
        try:
            if isinstance(root, Module):
                self.root = root
                fn = getattr(type(root), self.traced_func_name, None)
                if fn is None:
                    raise AttributeError(f"traced_func_name={self.traced_func_name} doesn't "
                                         f"exist in {type(root).__name__}")
                self.root_module_name = root._get_name()
                self.submodule_paths = {mod: name for name, mod in root.named_modules()}
            else:
                self.root = Module()
                fn = root
            self.graph = Graph(tracer_cls=type(self))
            self.tensor_attrs = {}
            self._collect_tensor_attrs(self.root, [])
            if not isinstance(fn, types.FunctionType):
                raise TypeError(f"symbolic_trace: expected a function or an nn.Module, got "
                                f"{type(root).__name__}")
            fn_globals = fn.__globals__
            fn, args = self.create_args_for_root(fn, isinstance(root, Module), concrete_args)
            patcher = _Patcher()
            try:
                self._patch(patcher, fn_globals)
                self.create_node("output", "output", (self.create_arg(fn(*args)),), {})
            finally:
                patcher.revert()
            self.submodule_paths = None
            return self.graph
        finally:
            _TRACING[0] = outer

    def _collect_tensor_attrs(self, m: Module, prefix: list[str]) -> None:
        for k, v in m.__dict__.items():
            if isinstance(v, Tensor):
                self.tensor_attrs[id(v)] = ".".join(prefix + [k])
        for k, v in m.named_children():
            self._collect_tensor_attrs(v, prefix + [k])

    def _patch(self, patcher: _Patcher, fn_globals: dict) -> None:
        cache: dict[str, Proxy] = {}
        orig_getattr = Module.__getattr__
        tracer = self

        def module_getattr(mod: Module, attr: str) -> Any:
            return tracer.getattr(attr, orig_getattr(mod, attr), cache)

        def module_call(mod: Module, call: Callable, args: tuple, kwargs: dict) -> Any:
            self._autowrap_check(patcher, getattr(type(mod).forward, "__globals__", {}))
            return tracer.call_module(mod, call, args, kwargs)

        patcher.patch_method(Module, "__getattr__", module_getattr)
        _module._CALL_WRAPPERS.append(module_call)
        patcher.undo.append(_module._CALL_WRAPPERS.pop)
        for name, method in _tensor_methods().items():
            patcher.patch_method(Tensor, name, _wrapped_method(method.__name__ if
                                 name.startswith("__") else name, method))
        for cls in (OpOverloadPacket, OpOverload):   # tessera.ops.<namespace>.<op>(proxy)
            patcher.patch_method(cls, "__call__", _wrapped_op_call(cls.__call__))
        ids = self._autowrap_function_ids
        self._tessera_ids = {id(v) for m in _tessera_namespaces() for v in m.__dict__.values()}
        hold_namespaces()
        patcher.undo.append(release_namespaces)
        for _, _, v, _ in _HELD["swapped"]:
            ids.add(id(v))
            self._tessera_ids.add(id(v))
        for mod in _tessera_namespaces():
            patcher.visit_once(mod.__dict__)
        for (_, name), frame_dict in list(_WRAPPED.items()):
            orig = frame_dict[name] if name in frame_dict else getattr(builtins, name)
            patcher.patch(frame_dict, name, _wrapped_function(orig, mark=True))
        self._autowrap_check(patcher, fn_globals)
        for mod in self._autowrap_search:
            self._autowrap_check(patcher, mod.__dict__)

    def _autowrap_check(self, patcher: _Patcher, frame_dict: dict) -> None:
        """Patch the names in ``frame_dict`` bound to functions that are recorded, not
        traced (``from tessera import relu``, ``from math import sqrt``)."""
        if not patcher.visit_once(frame_dict):
            return
        for name, v in list(frame_dict.items()):
            if not name.startswith("_") and callable(v) and id(v) in self._autowrap_function_ids:
                mark = id(v) not in self._tessera_ids  # tessera's own print by their names
                patcher.patch(frame_dict, name, _wrapped_function(v, mark=mark))


@has_side_effect
def _assert_is_none(value: Any, message: str) -> None:
    """Checks a ``concrete_args`` value specialised to None when the traced code runs."""
    if value is not None:
        raise AssertionError(message)


def _positional(fn: Callable, nargs: int) -> Callable:
    """``fn`` taking its ``*args``/``**kwargs`` as ordinary positional parameters, so the
    tracer can hand it one Proxy for each."""
    co = fn.__code__
    flags = co.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    code = co.replace(co_argcount=nargs, co_posonlyargcount=0, co_kwonlyargcount=0,
                      co_flags=flags)
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)


def symbolic_trace(root: Module | Callable[..., Any], concrete_args: dict | None = None):
    """Trace ``root`` and return a ``GraphModule`` running the recorded graph.

    >>> import tessera
    >>> from tessera.fx import symbolic_trace
    >>> gm = symbolic_trace(lambda x, y: tessera.add(x, y) * 2)
    >>> gm(tessera.ones(2), tessera.ones(2))
    tensor([4., 4.])
    """
    from tessera.fx.graph_module import GraphModule
    tracer = Tracer()
    graph = tracer.trace(root, concrete_args)
    name = type(root).__name__ if isinstance(root, Module) else root.__name__
    return GraphModule(tracer.root, graph, name)
