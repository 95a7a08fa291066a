"""``Node``: one operation of an fx ``Graph``, and the helpers that walk its arguments.

A node has an opcode (``placeholder``, ``get_attr``, ``call_function``, ``call_module``,
``call_method``, ``output``), a ``target`` (a function for ``call_function``, a name
otherwise), ``args`` and ``kwargs`` that may hold other nodes, and ``users``: the nodes
that read it. Setting ``args``/``kwargs`` keeps both directions of the use lists right,
so a pass edits the graph through these and never by hand.

>>> import tessera
>>> from tessera.fx import symbolic_trace
>>> gm = symbolic_trace(lambda x: tessera.relu(x) + 1)
>>> add = list(gm.graph.nodes)[2]
>>> add.format_node()
'%add : [num_users=1] = call_function[target=operator.add](args = (%relu, 1), kwargs = {})'
>>> [n.name for n in add.all_input_nodes], list(add.users)
(['relu'], [output])
"""
from __future__ import annotations

import builtins
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tessera.fx.graph import Graph

__all__ = ["Node", "Argument", "Target", "map_arg", "map_aggregate", "has_side_effect"]

Target = Callable[..., Any] | str
Argument = Any  # a Node, a base value, or a tuple/list/dict/slice of Arguments

_OPS = frozenset(("placeholder", "get_attr", "call_function", "call_module", "call_method",
                  "output", "root"))
_SIDE_EFFECTS: set = set()  # functions a dead-code pass must keep (``has_side_effect``)
# tessera functions whose result differs per call, kept by dead-code elimination like
# PyTorch keeps its random ops
_RANDOM = frozenset(("rand", "randn", "randint", "randperm", "rand_like", "randn_like",
                     "randint_like", "bernoulli", "multinomial", "normal", "poisson",
                     "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                     "feature_alpha_dropout", "rrelu"))
# the public namespaces whose functions print and generate code by their tessera names
NAMESPACES = ("tessera", "tessera.nn.functional", "tessera.linalg", "tessera.special",
              "tessera.fft")


def has_side_effect(fn: Callable) -> Callable:
    """Mark ``fn`` as side-effectful: ``eliminate_dead_code`` keeps its nodes even unused.

    >>> from tessera.fx import has_side_effect
    >>> def log(x): print(x)
    >>> has_side_effect(log) is log
    True
    """
    _SIDE_EFFECTS.add(fn)
    return fn


def map_aggregate(a: Argument, fn: Callable[[Argument], Argument]) -> Argument:
    """Apply ``fn`` to every leaf of ``a`` (through tuples, lists, dicts and slices).

    >>> map_aggregate((1, [2, {"k": 3}]), lambda v: v * 10)
    (10, [20, {'k': 30}])
    """
    if isinstance(a, tuple):
        t = tuple(map_aggregate(e, fn) for e in a)
        return type(a)(*t) if hasattr(a, "_fields") else t
    if isinstance(a, list):
        return [map_aggregate(e, fn) for e in a]
    if isinstance(a, dict):
        return {k: map_aggregate(v, fn) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(map_aggregate(a.start, fn), map_aggregate(a.stop, fn),
                     map_aggregate(a.step, fn))
    return fn(a)


def map_arg(a: Argument, fn: Callable[[Node], Argument]) -> Argument:
    """Apply ``fn`` to every Node in ``a``, leaving other values as they are.

    >>> map_arg((1, "x"), lambda n: n)
    (1, 'x')
    """
    if not callable(fn):
        raise TypeError("map_arg(a, fn): fn must be a callable")
    return map_aggregate(a, lambda x: fn(x) if isinstance(x, Node) else x)


def _public_path(fn: Any) -> str | None:
    """``tessera.add`` / ``tessera.nn.functional.gelu`` for a function reachable under its
    own name from one of tessera's public namespaces, else None."""
    name = getattr(fn, "__name__", None)
    if name is None or not str(getattr(fn, "__module__", "") or "").startswith("tessera"):
        return None
    for ns in NAMESPACES:
        mod = sys.modules.get(ns)
        if mod is None:
            continue
        v = mod.__dict__.get(name)
        # while Proxies are live the namespace holds fn's recording wrapper (tracer.py)
        if v is fn or (v is not None and getattr(v, "__wrapped__", None) is fn):
            return f"{ns}.{name}"
    return None


def qualified_name(fn: Callable) -> str:
    """The dotted name code refers to ``fn`` by (``getattr``, ``tessera.add``,
    ``operator.add``, ``my_module.helper``)."""
    name = fn.__name__
    if getattr(builtins, name, None) is fn:
        return name
    public = _public_path(fn)
    if public is not None:
        return public
    module = fn.__module__ or ""
    if name == "<lambda>":
        raise RuntimeError(f"cannot refer to the lambda {fn!r} by name in generated code")
    return f"{module}.{getattr(fn, '__qualname__', name)}"


def _pretty_target(target: Any) -> str:
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None)
    if module == "builtins":
        return f"builtins.{target.__name__}"
    if module == "_operator":
        return f"operator.{target.__name__}"
    return qualified_name(target)


def _format_arg(arg: Any) -> str:
    if isinstance(arg, list):
        return "[" + ", ".join(_format_arg(a) for a in arg) + "]"
    if isinstance(arg, tuple):
        return "(" + ", ".join(_format_arg(a) for a in arg) + ("," if len(arg) == 1 else "") + ")"
    if isinstance(arg, dict):
        return "{" + ", ".join(f"{k}: {_format_arg(v)}" for k, v in arg.items()) + "}"
    if isinstance(arg, Node):
        return "%" + str(arg)
    return str(arg)


def _type_repr(t: Any) -> str:
    if isinstance(t, type):
        return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return repr(t)


class Node:
    """One operation in a ``Graph``; see the module docstring for its fields."""

    def __init__(self, graph: Graph, name: str, op: str, target: Target, args: tuple,
                 kwargs: dict, return_type: Any | None = None):
        if op not in _OPS:
            raise ValueError(f"Node: unknown opcode {op!r}; expected one of "
                             f"{sorted(_OPS - {'root'})}")
        if op == "call_function" and not callable(target):
            raise ValueError(f"Node {name}: target {target!r} of call_function must be callable")
        if op in ("placeholder", "get_attr", "call_module", "call_method", "output") and \
                not isinstance(target, str):
            raise ValueError(f"Node {name}: target {target!r} of {op} must be a str")
        self.graph = graph
        self.name = name
        self.op = op
        self.target: Any = target  # a callable for call_function, else a str
        self._input_nodes: dict[Node, None] = {}
        self.users: dict[Node, None] = {}
        self.type = return_type
        self._prev = self._next = self
        self._erased = False
        self._repr_fn: Callable[[Node], str] | None = None
        self.meta: dict[str, Any] = {}
        self._args: tuple = ()
        self._kwargs: dict = {}
        self._update_args_kwargs(args, kwargs)

    # ---- position in the graph's list ----------------------------------------------------
    @property
    def next(self) -> Node:
        """The node after this one."""
        return self._next

    @property
    def prev(self) -> Node:
        """The node before this one."""
        return self._prev

    def prepend(self, x: Node) -> None:
        """Move (or insert) ``x`` right before this node."""
        if self is x:
            raise RuntimeError("Trying to prepend a node to itself")
        if self.graph is not x.graph:
            raise RuntimeError("Attempting to move a Node into a different Graph")
        x._remove_from_list()
        p = self._prev
        p._next, x._prev = x, p
        x._next, self._prev = self, x

    def append(self, x: Node) -> None:
        """Move (or insert) ``x`` right after this node."""
        self._next.prepend(x)

    def _remove_from_list(self) -> None:
        p, n = self._prev, self._next
        p._next, n._prev = n, p
        self._prev = self._next = self

    # ---- arguments and uses --------------------------------------------------------------
    @property
    def args(self) -> tuple:
        """The positional arguments; assigning updates the use lists."""
        return self._args

    @args.setter
    def args(self, a: tuple) -> None:
        self._update_args_kwargs(a, self._kwargs)

    @property
    def kwargs(self) -> dict:
        """The keyword arguments; assigning updates the use lists."""
        return self._kwargs

    @kwargs.setter
    def kwargs(self, k: dict) -> None:
        self._update_args_kwargs(self._args, k)

    @property
    def all_input_nodes(self) -> list[Node]:
        """The nodes among ``args`` and ``kwargs``, in order, once each."""
        return list(self._input_nodes)

    def update_arg(self, idx: int, arg: Argument) -> None:
        """Set ``self.args[idx] = arg``."""
        args = list(self._args)
        args[idx] = arg
        self.args = tuple(args)

    def insert_arg(self, idx: int, arg: Argument) -> None:
        """Insert ``arg`` before position ``idx`` of ``args``."""
        if not 0 <= idx <= len(self._args):
            raise IndexError(f"insert_arg: index {idx} out of range for {len(self._args)} args")
        self.args = self._args[:idx] + (arg,) + self._args[idx:]

    def update_kwarg(self, key: str, arg: Argument) -> None:
        """Set ``self.kwargs[key] = arg``."""
        self.kwargs = {**self._kwargs, key: arg}

    def _update_args_kwargs(self, args: tuple, kwargs: dict) -> None:
        for old in self._input_nodes:
            old.users.pop(self, None)
        self._args = tuple(args)
        self._kwargs = dict(kwargs)
        self._input_nodes = {}
        map_arg((self._args, self._kwargs), self._input_nodes.setdefault)
        for new in self._input_nodes:
            new.users.setdefault(self)

    def replace_all_uses_with(self, replace_with: Node,
                              delete_user_cb: Callable[[Node], bool] | None = None, *,
                              propagate_meta: bool = False) -> list[Node]:
        """Make every user of this node read ``replace_with`` instead (those for which
        ``delete_user_cb`` is true, when given); returns the users changed."""
        if propagate_meta:
            if replace_with.meta:
                raise RuntimeError("replace_all_uses_with(propagate_meta=True): the "
                                   "replacement already has .meta keys")
            replace_with.meta.update(self.meta)
        changed = []
        for user in list(self.users):
            if delete_user_cb is not None and not delete_user_cb(user):
                continue
            user.replace_input_with(self, replace_with)
            changed.append(user)
        return changed

    def replace_input_with(self, old_input: Node, new_input: Node) -> None:
        """Replace every occurrence of ``old_input`` among the arguments by ``new_input``."""
        def swap(n: Node) -> Node:
            return new_input if n is old_input else n
        self._update_args_kwargs(map_arg(self._args, swap), map_arg(self._kwargs, swap))

    # ---- facts ---------------------------------------------------------------------------
    def is_impure(self, impure_random: bool = True) -> bool:
        """Whether dead-code elimination must keep this node though nothing uses it:
        inputs and the output, side-effectful or random functions, in-place functions,
        and modules marked ``_is_impure``."""
        if self.op in ("placeholder", "output"):
            return True
        if self.op == "call_module":
            mod = self.graph.owning_module
            if mod is None:
                raise RuntimeError(f"is_impure: {self} is a call_module of a graph with no "
                                   "owning module")
            return bool(getattr(mod.get_submodule(self.target), "_is_impure", False))
        if self.op == "call_function":
            t = self.target
            name = getattr(t, "__name__", "")
            if t in _SIDE_EFFECTS or (name.endswith("_") and not name.endswith("__")):
                return True
            return impure_random and name in _RANDOM and _public_path(t) is not None
        return False

    @property
    def stack_trace(self) -> str | None:
        """The Python stack recorded while tracing, if any."""
        return self.meta.get("stack_trace")

    @stack_trace.setter
    def stack_trace(self, trace: str | None) -> None:
        self.meta["stack_trace"] = trace

    # ---- printing ------------------------------------------------------------------------
    def __repr__(self) -> str:
        return self._repr_fn(self) if self._repr_fn else self.name

    def format_node(self, placeholder_names: list[str] | None = None,
                    maybe_return_typename: list[str] | None = None) -> str | None:
        """The node as one line of ``print(graph)``; with a non-empty ``placeholder_names``
        a placeholder is appended there instead (None is returned)."""
        typename = f"{_type_repr(self.type)} " if self.type is not None else ""
        head = f"%{self.name} : {typename}[num_users={len(self.users)}] = {self.op}"
        if self.op == "placeholder":
            if placeholder_names:
                placeholder_names.append(self.target)
                return None
            default = f"(default={self.args[0]})" if self.args else ""
            return f"{head}[target={self.target}]{default}"
        if self.op == "get_attr":
            return f"{head}[target={self.target}]"
        if self.op == "output":
            if self.type is not None and maybe_return_typename:
                maybe_return_typename[0] = f" -> {_type_repr(self.type)}"
            return f"return {self.args[0]}"
        return (f"{head}[target={_pretty_target(self.target)}](args = "
                f"{_format_arg(self.args)}, kwargs = {_format_arg(self.kwargs)})")
