"""``torch.ops``: operators by namespace and name, ``tessera.ops.aten.add.Tensor(a, b)``.

A namespace is an ``OpNamespace``; an op in it an ``OpOverloadPacket`` (callable, and the
parent of its overloads); ``packet.<overload>`` an ``OpOverload``. Three kinds of namespace:

* ``aten``: PyTorch's native operators, answered by tessera's own functions of the same
  name (``aten.add`` is ``tessera.add``, ``aten.view`` is ``Tensor.view``; a few aten-only
  names are spelled out in ``_ATEN``). The namespaces searched are registered by the layers
  that define them (``add_aten_source``). A tessera function parses every Python overload of
  its op, so each overload name (``add.Tensor``, ``add.Scalar``, ``mm.default``, ``.out``)
  calls the same function. ``packet.opdef`` is the op's ``OpDef`` when one has the name.
* namespaces of Python operators defined with ``tessera.library`` (``custom_op``,
  ``Library.define``/``impl``) or by tessera's layers (``profiler``, registered by the
  autograd profiler): ``define(namespace, name, fn)``.
* any other name is an empty namespace, as in PyTorch: its ops raise ``AttributeError``.

>>> import tessera
>>> tessera.ops.aten.mm.default(tessera.ones(2, 3), tessera.ones(3, 1)).tolist()
[[3.0], [3.0]]
>>> tessera.ops.aten.add.Tensor
<OpOverload(op='aten.add', overload='Tensor')>
>>> tessera.ops.aten.add.opdef
OpDef(add)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tessera.ops.registry import REGISTRY, OpDef

# where aten names are looked up, in order (tessera's namespace, Tensor, nn.functional)
_ATEN_SOURCES: list[Any] = []
# the namespaces of Python operators: {namespace: {name: {overload: fn}}}
_DEFINED: dict[str, dict[str, dict[str, Callable]]] = {}
loaded_libraries: set[str] = set()


def add_aten_source(source: Any) -> None:
    """Look aten names up as attributes of ``source`` too (after the earlier sources)."""
    _ATEN_SOURCES.append(source)


def define(namespace: str, name: str, fn: Callable, overload: str = "default") -> None:
    """Make ``fn`` the operator ``tessera.ops.<namespace>.<name>.<overload>``."""
    if namespace == "aten":
        raise RuntimeError("the aten namespace is tessera's own functions; define the "
                           "operator in a namespace of your own")
    _DEFINED.setdefault(namespace, {}).setdefault(name, {})[overload] = fn


def undefine(namespace: str, name: str) -> None:
    """Remove an operator ``define`` made (``Library`` objects do so when collected)."""
    ops = _DEFINED.get(namespace, {})
    ops.pop(name, None)
    if not ops:
        _DEFINED.pop(namespace, None)


def _softmax(input, dim: int, half_to_float: bool = False):
    return input.softmax(dim)


def _log_softmax(input, dim: int, half_to_float: bool = False):
    return input.log_softmax(dim)


def _to_copy(input, *, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking: bool = False, memory_format=None):
    return input.to(device=device, dtype=dtype, copy=True)


def _embedding(weight, indices, padding_idx: int = -1, scale_grad_by_freq: bool = False,
               sparse: bool = False):
    from tessera.ops.embedding import embedding
    return embedding(weight, indices, padding_idx=padding_idx,
                     scale_grad_by_freq=scale_grad_by_freq)


# aten operators whose name is no tessera function's, or whose arguments come in another
# order than the tessera function's of that name
_ATEN: dict[str, Callable] = {
    "_softmax": _softmax, "_log_softmax": _log_softmax, "_to_copy": _to_copy,
    "_unsafe_view": lambda input, size: input.view(size), "embedding": _embedding,
}


def _aten(name: str) -> Callable | None:
    fn = _ATEN.get(name)
    if fn is not None:
        return fn
    for source in _ATEN_SOURCES:
        fn = getattr(source, name, None)
        if callable(fn) and not isinstance(fn, type):
            return fn
    return None


class OpOverload:
    """One overload of an operator (``tessera.ops.aten.add.Tensor``): call it as the op."""

    def __init__(self, packet: OpOverloadPacket, overload: str, fn: Callable) -> None:
        self.overloadpacket, self._overloadname, self._op = packet, overload, fn
        self.namespace = packet.namespace
        self.__name__ = f"{packet.__name__}.{overload}"
        self.__qualname__ = self.__name__
        self.__module__ = packet.__module__

    def __call__(self, *args, **kwargs):
        return self._op(*args, **kwargs)

    def name(self) -> str:
        return f"{self.namespace}::{self.__name__}"

    @property
    def op(self) -> Callable:
        return self._op

    def __repr__(self) -> str:
        return f"<OpOverload(op='{self.overloadpacket}', overload='{self._overloadname}')>"

    def __str__(self) -> str:
        return f"{self.namespace}.{self.__name__}"

    def __hash__(self) -> int:
        return hash((str(self.overloadpacket), self._overloadname))

    def __eq__(self, other) -> bool:
        return isinstance(other, OpOverload) and str(other) == str(self)


class OpOverloadPacket:
    """An operator with all its overloads (``tessera.ops.aten.add``): calling it calls the
    op; ``packet.<overload>`` is one overload."""

    def __init__(self, namespace: str, name: str, fn: Callable,
                 overloads: dict[str, Callable] | None) -> None:
        self.namespace, self._fn, self._overloads = namespace, fn, overloads
        self.__name__ = self.__qualname__ = name
        self.__module__ = f"tessera.ops.{namespace}"

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)

    def __getattr__(self, overload: str) -> OpOverload:
        if overload.startswith("_"):
            raise AttributeError(overload)
        if self._overloads is None:   # aten: the function parses every overload
            return OpOverload(self, overload, self._fn)
        if overload not in self._overloads:
            raise AttributeError(f"The underlying op of '{self}' has no overload name "
                                 f"'{overload}'")
        return OpOverload(self, overload, self._overloads[overload])

    def overloads(self) -> list[str]:
        """The overload names (aten's: those tessera knows to be called differently, none:
        each name calls the one function)."""
        return ["default"] if self._overloads is None else list(self._overloads)

    @property
    def op(self) -> Callable:
        return self._fn

    @property
    def opdef(self) -> OpDef | None:
        """The ``OpDef`` of this name in ``tessera.ops.REGISTRY`` (aten ops only)."""
        return REGISTRY.get(self.__name__) if self.namespace == "aten" else None

    def __repr__(self) -> str:
        return f"<OpOverloadPacket(op='{self}')>"

    def __str__(self) -> str:
        return f"{self.namespace}.{self.__name__}"


class OpNamespace:
    """``tessera.ops.<namespace>``: its operators as attributes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.__name__ = f"tessera.ops.{name}"

    def __getattr__(self, op: str) -> OpOverloadPacket:
        if op.startswith("__"):
            raise AttributeError(op)
        defined = _DEFINED.get(self.name, {}).get(op)
        if defined is not None:
            return OpOverloadPacket(self.name, op, defined.get("default") or
                                    next(iter(defined.values())), defined)
        fn = _aten(op) if self.name == "aten" else None
        if fn is None:
            raise AttributeError(f"'_OpNamespace' '{self.name}' object has no attribute "
                                 f"'{op}'")
        return OpOverloadPacket(self.name, op, fn, None)

    def __repr__(self) -> str:
        return f"<module 'tessera.ops.{self.name}'>"


def namespace(name: str) -> OpNamespace:
    """``tessera.ops.<name>`` for a name that is no submodule of ``tessera.ops``."""
    return OpNamespace(name)


def load_library(path: str) -> None:
    """PyTorch loads a C++ extension's ``TORCH_LIBRARY`` operators; tessera runs no
    PyTorch C++ code, so this says so.

    >>> import tessera
    >>> tessera.ops.load_library("libmyops.so")
    Traceback (most recent call last):
    ...
    OSError: Could not load this library: libmyops.so. tessera cannot load PyTorch C++ ...
    """
    raise OSError(f"Could not load this library: {path}. tessera cannot load PyTorch C++ "
                  "operator libraries; define the operators in Python with "
                  "tessera.library.custom_op")


def import_module(module: str) -> None:
    """``torch.ops.import_module``: import a Python module that defines operators."""
    import importlib
    importlib.import_module(module)
