"""``torch.library``: Python operators callable as ``tessera.ops.<namespace>.<name>``.

``custom_op`` turns a function into an operator (with ``register_autograd`` for its
gradient and ``register_fake`` accepted for PyTorch's fake tensors); ``Library`` with
``define``/``impl`` is the older spelling. Operators are kept in ``tessera.ops.library``,
the one table ``tessera.ops.<namespace>`` reads. Schemas are accepted but not parsed: an
operator takes the arguments of its Python function.

>>> import tessera
>>> @tessera.library.custom_op("mylib::twice", mutates_args=())
... def twice(x: tessera.Tensor) -> tessera.Tensor:
...     return x * 2
>>> tessera.ops.mylib.twice(tessera.ones(2)).tolist()
[2.0, 2.0]
>>> twice.register_autograd(lambda ctx, g: g * 2)
>>> x = tessera.ones(2, requires_grad=True)
>>> tessera.ops.mylib.twice.default(x).sum().backward(); x.grad.tolist()
[2.0, 2.0]
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

from tessera._tensor import Tensor
from tessera.autograd.function import Function
from tessera.ops import library as _ops
from tessera.ops.library import OpOverload, OpOverloadPacket

__all__ = ["Library", "define", "impl", "custom_op", "CustomOpDef", "register_fake",
           "register_autograd", "register_kernel"]


def _split(qualname: str) -> tuple[str, str]:
    ns, sep, name = qualname.partition("::")
    if not sep or not ns or not name:
        raise ValueError(f"expected a qualified name 'namespace::name', got '{qualname}'")
    return ns, name.split("(", 1)[0].split(".", 1)[0]


class CustomOpDef:
    """The operator ``custom_op`` makes: call it, or reach it as
    ``tessera.ops.<namespace>.<name>``; ``register_autograd`` gives it a gradient."""

    def __init__(self, namespace: str, name: str, fn: Callable, mutates_args) -> None:
        self._namespace, self._name, self._init_fn = namespace, name, fn
        self._mutates_args = mutates_args
        self._backward: Callable | None = None
        self._setup_context: Callable | None = None
        self._fake: Callable | None = None
        self.__name__ = name
        self.__doc__ = fn.__doc__
        _ops.define(namespace, name, self)

    def __repr__(self) -> str:
        return f"<CustomOpDef({self._namespace}::{self._name})>"

    def __call__(self, *args, **kwargs):
        if any(isinstance(a, Tensor) and a.requires_grad for a in args):
            return _function(self).apply(*args, **kwargs)
        return self._init_fn(*args, **kwargs)

    def register_autograd(self, backward: Callable, /, *,
                          setup_context: Callable | None = None) -> None:
        """``backward(ctx, *grads)`` returns one gradient per input; ``setup_context(ctx,
        inputs, output)`` saves what it needs."""
        self._backward, self._setup_context = backward, setup_context

    def register_fake(self, fn: Callable, /) -> Callable:
        """Kept for PyTorch's API: tessera's meta device runs the operator itself."""
        self._fake = fn
        return fn

    def register_kernel(self, device_types, fn: Callable | None = None, /):
        """A kernel for ``device_types``: tessera runs on the CPU, where it replaces the
        function."""
        def register(f: Callable) -> Callable:
            if device_types is None or "cpu" in _device_types(device_types):
                self._init_fn = f
            return f
        return register if fn is None else register(fn)


def _device_types(device_types) -> tuple[str, ...]:
    return (device_types,) if isinstance(device_types, str) else tuple(device_types)


def _function(op: CustomOpDef) -> type[Function]:
    """The autograd Function running ``op`` with its registered gradient."""
    def forward(ctx, *args, **kwargs):
        out = op._init_fn(*args, **kwargs)
        if op._setup_context is not None:
            op._setup_context(ctx, args, out)
        return out

    def backward(ctx, *grads):
        if op._backward is None:
            raise RuntimeError(f"Trying to backward through {op._namespace}.{op._name}."
                               "default but no autograd formula was registered. Please use "
                               "register_autograd to add one.")
        out = op._backward(ctx, *grads)
        return out if isinstance(out, tuple) else (out,)
    return type(op._name, (Function,), {"forward": staticmethod(forward),
                                        "backward": staticmethod(backward)})


def custom_op(name: str, fn: Callable | None = None, /, *, mutates_args: Iterable[str] | str,
              device_types=None, schema: str | None = None):
    """Make ``fn`` the operator ``name`` (``"namespace::name"``); usable as a decorator."""
    ns, op_name = _split(name)

    def make(f: Callable) -> CustomOpDef:
        return CustomOpDef(ns, op_name, f, mutates_args)
    return make if fn is None else make(fn)


def _lookup(op) -> CustomOpDef:
    if isinstance(op, CustomOpDef):
        return op
    if isinstance(op, (OpOverload, OpOverloadPacket)):
        op = op.op
    if isinstance(op, str):
        ns, name = _split(op)
        op = _ops._DEFINED.get(ns, {}).get(name, {}).get("default")
    if not isinstance(op, CustomOpDef):
        raise ValueError(f"expected an operator made by tessera.library.custom_op, got {op!r}")
    return op


def register_autograd(op, backward: Callable, /, *, setup_context: Callable | None = None,
                      lib=None) -> None:
    """``op.register_autograd(backward, setup_context=...)`` by name or object."""
    _lookup(op).register_autograd(backward, setup_context=setup_context)


def register_fake(op, func: Callable | None = None, /, *, lib=None, _stacklevel: int = 1):
    """``op.register_fake(func)`` by name or object; usable as a decorator."""
    target = _lookup(op)
    return target.register_fake if func is None else target.register_fake(func)


def register_kernel(op, device_types, func: Callable | None = None, /, *, lib=None):
    return _lookup(op).register_kernel(device_types, func)


class Library:
    """PyTorch's ``torch.library.Library(ns, kind)``: ``define`` declares an operator of
    the namespace, ``impl`` gives its function. The operators go when the library does."""

    def __init__(self, ns: str, kind: str, dispatch_key: str = "") -> None:
        if kind not in ("IMPL", "DEF", "FRAGMENT"):
            raise ValueError(f"Unsupported kind: {kind}")
        self.ns, self.kind, self.dispatch_key = ns, kind, dispatch_key
        self._names: list[str] = []
        weakref.finalize(self, _undefine, ns, self._names)

    def __repr__(self) -> str:
        return f"Library(kind={self.kind}, ns={self.ns}, dispatch_key={self.dispatch_key})>"

    def define(self, schema: str, alias_analysis: str = "", *, tags=()) -> str:
        """Declare the operator ``schema`` names (``"twice(Tensor x) -> Tensor"``)."""
        if self.kind == "IMPL":
            raise RuntimeError("Cannot define an operator inside of a IMPL library.")
        name = schema.split("(", 1)[0].split(".", 1)[0].strip()
        _ops.define(self.ns, name, _undefined(self.ns, name))
        self._names.append(name)
        return name

    def impl(self, op_name, fn: Callable, dispatch_key: str = "", *,
             with_keyset: bool = False) -> None:
        """Make ``fn`` the function of the operator ``op_name`` of this namespace."""
        name = op_name.__name__ if isinstance(op_name, (OpOverload, OpOverloadPacket)) \
            else str(op_name)
        name = name.split("::")[-1].split(".", 1)[0]
        if self.ns == "aten":
            raise NotImplementedError(
                f"Library('aten').impl('{name}'): tessera's aten operators are its own "
                "functions and cannot be replaced")
        _ops.define(self.ns, name, fn)
        if name not in self._names:
            self._names.append(name)

    def _destroy(self) -> None:
        _undefine(self.ns, self._names)


def _undefined(ns: str, name: str) -> Callable:
    def call(*args: Any, **kwargs: Any):
        raise NotImplementedError(f"{ns}::{name} is defined but has no implementation "
                                  "(Library.impl)")
    return call


def _undefine(ns: str, names: list[str]) -> None:
    for name in names:
        _ops.undefine(ns, name)


def define(qualname: str, schema: str, *, lib: Library | None = None, tags=()) -> None:
    """Declare the operator ``qualname`` (``"mylib::twice"``) with ``schema``."""
    ns, name = _split(qualname)
    _ops.define(ns, name, _undefined(ns, name))


def impl(qualname, types, func: Callable | None = None, *, lib: Library | None = None):
    """Give the operator ``qualname`` its function (for ``types``: tessera runs the CPU
    one); usable as a decorator."""
    ns, name = _split(qualname if isinstance(qualname, str) else qualname.name())

    def register(f: Callable) -> Callable:
        if types is None or _device_types(types) == ("default",) or \
                {"cpu", "CPU", "CompositeImplicitAutograd", "CompositeExplicitAutograd"} & \
                set(_device_types(types)):
            _ops.define(ns, name, f)
        return f
    return register if func is None else register(func)
