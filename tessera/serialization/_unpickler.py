"""The restricted unpickler behind ``load(weights_only=True)``, with PyTorch's rules.

It follows ``torch/_weights_only_unpickler.py``: GLOBAL builds only allow-listed names
(``sys``, ``os``, ``posix`` and ``nt`` never, whatever is allowed); REDUCE and NEWOBJ call
only allow-listed globals; BUILD sets state only on ``OrderedDict``, tessera modules and
allowed user types (never on a tensor, whose internals only its constructor sets); APPEND
goes to lists, SETITEM to dicts; persistent ids are tuples or ints; opcodes that reach
other objects (INST, OBJ, EXT*, PERSID, out-of-band buffers) are refused. Tensors come
from the file's data through rebuild functions that validate every part.

>>> import pickle, io
>>> RestrictedUnpickler(io.BytesIO(pickle.dumps({"a": [1, 2.0]})), None).load()
{'a': [1, 2.0]}
"""
from __future__ import annotations

import collections
import importlib
import pickle
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["add_safe_globals", "get_safe_globals", "clear_safe_globals", "safe_globals",
           "RestrictedUnpickler", "FullUnpickler", "weights_only_message"]

_user_safe_globals: list = []

# never allowed, even through add_safe_globals (as in PyTorch)
_BLOCKED_MODULES = ("sys", "os", "posix", "nt")

# names -> objects; filled lazily (tessera's own rebuild functions import late)
_DEFAULT_SAFE_NAMES = {
    "collections.OrderedDict", "collections.Counter", "_codecs.encode",
    "builtins.bytearray", "builtins.set", "builtins.frozenset", "builtins.complex",
    "builtins.slice", "builtins.range", "builtins.int", "builtins.float", "builtins.str",
    "builtins.bool", "builtins.tuple", "builtins.list", "builtins.dict", "builtins.bytes",
    "tessera._dtype._by_name", "tessera.ops.creation._rebuild_tensor",
    "tessera.nn.parameter._rebuild_parameter",
}
_NUMPY_NAMES = {
    "numpy.ndarray", "numpy.dtype",
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar",
    "numpy.core.numeric._frombuffer", "numpy._core.numeric._frombuffer",
}
_PY2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}

# extra globals a format adds (PyTorch's names, mapped to tessera's rebuild functions)
_format_globals: dict[str, Any] = {}


def register_globals(table: dict[str, Any]) -> None:
    """Allow these ``module.name`` -> object entries by default (for a file format)."""
    _format_globals.update(table)


def _global_name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def add_safe_globals(safe_globals: list) -> None:
    """Allow these classes/functions in ``load(weights_only=True)``. Items are objects, or
    ``(object, "module.name")`` pairs when the object is pickled under another name.

    >>> class Point: ...
    >>> add_safe_globals([Point]); Point in get_safe_globals()
    True
    >>> clear_safe_globals()
    """
    if not isinstance(safe_globals, list):
        raise TypeError(f"safe_globals must be a list, got {type(safe_globals).__name__}")
    for g in safe_globals:
        if isinstance(g, tuple):
            if len(g) != 2 or not isinstance(g[1], str):
                raise TypeError("a safe global given as a tuple must be (object, "
                                f"'module.name'), got {g!r}")
        elif not callable(g):
            raise TypeError(f"safe globals must be classes or functions, got {g!r}")
    _user_safe_globals.extend(safe_globals)


def get_safe_globals() -> list:
    """The globals added with ``add_safe_globals`` (not the built-in allow-list).

    >>> get_safe_globals()
    []
    """
    return list(_user_safe_globals)


def clear_safe_globals() -> None:
    """Forget every global added with ``add_safe_globals``.

    >>> clear_safe_globals(); get_safe_globals()
    []
    """
    _user_safe_globals.clear()


class safe_globals:
    """Context manager: allow ``safe_globals`` (as in ``add_safe_globals``) inside the block.

    >>> import collections
    >>> with safe_globals([collections.Counter]):
    ...     collections.Counter in get_safe_globals()
    True
    """

    def __init__(self, safe_globals: list) -> None:
        self.safe_globals = safe_globals

    def __enter__(self):
        self._saved = list(_user_safe_globals)
        add_safe_globals(self.safe_globals)

    def __exit__(self, *exc) -> None:
        _user_safe_globals[:] = self._saved


def _user_objects() -> list:
    return [g[0] if isinstance(g, tuple) else g for g in _user_safe_globals]


def _is_tessera_type(obj: Any) -> bool:
    """Tessera classes a checkpoint may name: modules, devices, Size and tensor classes
    (tensor classes are only ever called as constructors, see ``load_newobj``)."""
    from tessera._tensor import Size, Tensor
    from tessera.device import device
    from tessera.nn.modules.module import Module
    return isinstance(obj, type) and issubclass(obj, (Tensor, Module, device, Size))


def _constructible() -> tuple:
    from tessera._tensor import Size
    from tessera.device import device
    return (Size, device)


def _checked_numpy(full: str, obj: Any) -> Any:
    """NumPy's pickling helpers, refusing object dtypes (their items would be arbitrary
    objects handed to NumPy's C code)."""
    if full == "numpy.dtype":
        return _numpy_dtype
    if full.endswith("multiarray.scalar"):
        def scalar(dtype, *args):
            if not isinstance(dtype, np.dtype) or dtype.hasobject:
                raise pickle.UnpicklingError("NumPy scalars of object dtype are not allowed")
            return obj(dtype, *args)
        return scalar
    if full.endswith("multiarray._reconstruct"):
        def reconstruct(cls, shape, dtype):
            if cls is not np.ndarray:
                raise pickle.UnpicklingError(f"can only rebuild numpy.ndarray, got {cls!r}")
            return obj(cls, shape, dtype)
        return reconstruct
    if full.endswith("numeric._frombuffer"):
        def frombuffer(buf, dtype, shape, order):
            if not isinstance(dtype, np.dtype) or dtype.hasobject:
                raise pickle.UnpicklingError("NumPy object dtypes are not allowed")
            return obj(buf, dtype, shape, order)
        return frombuffer
    return obj


def _numpy_dtype(*args: Any) -> np.dtype:
    """``numpy.dtype`` in a restricted pickle, refusing object dtypes (BUILD on the result
    is checked again in ``load_build``)."""
    d = np.dtype(*args)
    if d.hasobject:
        raise pickle.UnpicklingError("NumPy object dtypes are not allowed")
    return d


_numpy_cache: dict[str, Any] = {}


def resolve_safe_global(module: str, name: str) -> Any:
    """The object a restricted pickle may use for GLOBAL ``module.name``, or None."""
    full = f"{module}.{name}"
    for g in _user_safe_globals:
        obj, key = (g if isinstance(g, tuple) else (g, _global_name(g)))
        if key == full:
            return obj
    if full in _format_globals:
        return _format_globals[full]
    if "." in name or "<" in name:  # no attribute paths (they reach arbitrary objects)
        return None
    tessera_module = (module == "tessera" or module.startswith("tessera.")) and \
        "__main__" not in module
    if full in _DEFAULT_SAFE_NAMES or full in _NUMPY_NAMES or tessera_module:
        try:
            obj = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return None
        if full in _NUMPY_NAMES:
            return _numpy_cache.setdefault(full, _checked_numpy(full, obj))
        if full in _DEFAULT_SAFE_NAMES or _is_tessera_type(obj):
            return obj
    return None


def _refuse_global(module: str, name: str) -> pickle.UnpicklingError:
    full = f"{module}.{name}"
    if module in _BLOCKED_MODULES:
        return pickle.UnpicklingError(
            f"Trying to load unsupported GLOBAL {full} whose module {module} is blocked "
            "(add_safe_globals cannot allow it).")
    shown = full.removeprefix("builtins.")
    return pickle.UnpicklingError(
        f"Unsupported global: GLOBAL {shown} was not an allowed global by default. Please "
        f"use `tessera.serialization.add_safe_globals([{shown}])` or the "
        f"`tessera.serialization.safe_globals([{shown}])` context manager to allowlist this "
        "global if you trust this class/function.")


UNSAFE_MESSAGE = ("Re-running `tessera.load` with `weights_only` set to `False` will likely "
                  "succeed, but it can result in arbitrary code execution. Do it only if you "
                  "got the file from a trusted source.")


def weights_only_message(message: str) -> str:
    """PyTorch's wrapping of a weights-only refusal (``torch.load``'s _get_wo_message)."""
    if "was not an allowed global by default" in message:
        return ("Weights only load failed. This file can still be loaded, to do so you have "
                "two options, do those steps only if you trust the source of the checkpoint."
                f"\n\t(1) {UNSAFE_MESSAGE}\n\t(2) Alternatively, to load with "
                "`weights_only=True` please check the recommended steps in the following "
                "error message.\n\tWeightsUnpickler error: " + message)
    return f"Weights only load failed. {UNSAFE_MESSAGE}\n\n{message}"


def _refused_opcode(self: Any) -> None:
    raise pickle.UnpicklingError("Unsupported operand")


# opcodes that only build plain data from the stream (pickle.py's own handlers serve them)
_DATA_OPCODES = [
    pickle.MARK, pickle.STOP, pickle.POP, pickle.POP_MARK, pickle.DUP, pickle.FLOAT,
    pickle.INT, pickle.BININT, pickle.BININT1, pickle.LONG, pickle.BININT2, pickle.NONE,
    pickle.STRING, pickle.BINSTRING, pickle.SHORT_BINSTRING, pickle.UNICODE,
    pickle.BINUNICODE, pickle.EMPTY_DICT, pickle.EMPTY_LIST, pickle.EMPTY_TUPLE,
    pickle.LIST, pickle.DICT, pickle.TUPLE, pickle.TUPLE1, pickle.TUPLE2, pickle.TUPLE3,
    pickle.GET, pickle.BINGET, pickle.LONG_BINGET, pickle.PUT, pickle.BINPUT,
    pickle.LONG_BINPUT, pickle.BINFLOAT, pickle.PROTO, pickle.NEWTRUE, pickle.NEWFALSE,
    pickle.LONG1, pickle.LONG4, pickle.BINBYTES, pickle.SHORT_BINBYTES,
    pickle.SHORT_BINUNICODE, pickle.BINUNICODE8, pickle.BINBYTES8, pickle.EMPTY_SET,
    pickle.FROZENSET, pickle.MEMOIZE, pickle.FRAME,
    pickle.GLOBAL, pickle.STACK_GLOBAL,  # both go through find_class
]
# calls that would consume an iterator or allocate from a count: data arguments only
_CONTAINER_CALLS = (list, tuple, set, frozenset, dict, bytes, bytearray)
_BUILT = (list, tuple, set, frozenset, dict, str, bytes, bytearray)
_SET_TARGETS = (dict, collections.OrderedDict, collections.Counter)
# malformed streams make pickle.py's handlers fail with these; they become UnpicklingError
_STREAM_ERRORS = (IndexError, KeyError, AttributeError, TypeError, struct.error,
                  UnicodeDecodeError, OverflowError, AssertionError)


# pickle.py's unpickler (its opcode handlers can be replaced, unlike the C one's)
_PyUnpickler: Any = getattr(pickle, "_Unpickler")


class RestrictedUnpickler(_PyUnpickler):
    """Builds only allowed globals; tensors come from ``persistent_load`` (the file's
    data), through rebuild functions that check every part."""

    dispatch: dict = {}

    def __init__(self, file, persistent_load: Callable | None, *,
                 encoding: str = "utf-8") -> None:
        super().__init__(file, encoding=encoding)
        self._persistent = persistent_load
        self._allowed: dict[int, Any] = {}  # id -> the globals this stream resolved

    def load(self) -> Any:
        try:
            return super().load()
        except pickle.UnpicklingError as e:
            if str(e) == "Unsupported operand":  # name the opcode, as PyTorch does
                raise pickle.UnpicklingError(f"Unsupported operand {self._last}") from None
            raise
        except _STREAM_ERRORS as e:
            raise pickle.UnpicklingError(
                f"the pickle data is corrupted ({type(e).__name__}: {e})") from None

    def find_class(self, module: str, name: str) -> Any:
        module = _PY2_MODULES.get(module, module)
        obj = None if module in _BLOCKED_MODULES else resolve_safe_global(module, name)
        if obj is None:
            raise _refuse_global(module, name)
        self._allowed[id(obj)] = obj
        return obj

    def _is_allowed(self, obj: Any) -> bool:
        return self._allowed.get(id(obj)) is obj

    def load_reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        if not self._is_allowed(func):
            msg = f"Trying to call reduce for unrecognized function {func!r}"
            if hasattr(func, "__self__"):
                msg += f" which belongs to {func.__self__!r}"
            raise pickle.UnpicklingError(msg)
        if type(args) is not tuple:
            raise pickle.UnpicklingError(f"REDUCE arguments must be a tuple, got {type(args)}")
        if isinstance(func, type) and _is_tessera_type(func) and \
                not issubclass(func, _constructible()):
            # modules and tensors are rebuilt (NEWOBJ, rebuild functions), never constructed
            # from a file's arguments (a constructor could allocate whatever they say)
            raise pickle.UnpicklingError(
                f"Trying to call reduce for unrecognized function {func!r}")
        if func in _CONTAINER_CALLS and not all(isinstance(a, _BUILT) for a in args):
            raise pickle.UnpicklingError(
                f"{func.__name__}() in a checkpoint takes data, not {[type(a) for a in args]}")
        self.stack[-1] = func(*args)

    def _new(self, cls: Any, args: Any, kwargs: dict) -> Any:
        from tessera._tensor import Tensor
        if type(args) is not tuple or type(kwargs) is not dict:
            raise pickle.UnpicklingError("NEWOBJ arguments must be a tuple and a dict")
        if not (isinstance(cls, type) and self._is_allowed(cls)):
            raise pickle.UnpicklingError(
                "Can only create new object for nn.Parameter or classes allowlisted via "
                f"`add_safe_globals` but got {cls!r}")
        if issubclass(cls, Tensor):  # built by the constructor, never a bare object
            from tessera.nn.parameter import Parameter
            if cls is not Parameter:
                raise pickle.UnpicklingError(
                    "Can only create new object for nn.Parameter or classes allowlisted via "
                    f"`add_safe_globals` but got {cls!r}")
            return cls(*args, **kwargs)
        return cls.__new__(cls, *args, **kwargs)

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new(cls, args, {}))

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new(cls, args, kwargs))

    def load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        t = type(inst)
        if t is collections.OrderedDict or t is collections.Counter:
            if not isinstance(state, dict):
                raise pickle.UnpicklingError(f"BUILD state of {t} must be a dict")
            inst.__dict__.update(state)
            return
        if t is np.ndarray or t is np.dtype or isinstance(inst, np.dtype):
            inst.__setstate__(state)
            if inst.dtype.hasobject if t is np.ndarray else inst.hasobject:
                raise pickle.UnpicklingError("NumPy object dtypes are not allowed")
            return
        if not self._buildable(t):
            raise pickle.UnpicklingError(
                "Can only build Tensor, Parameter, OrderedDict or types allowlisted via "
                f"`add_safe_globals`, but got {t}")
        setstate = getattr(inst, "__setstate__", None)
        if setstate is not None:
            setstate(state)
            return
        slotstate = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slotstate = state
        if state:
            inst.__dict__.update(state)
        if slotstate:
            for k, v in slotstate.items():
                setattr(inst, k, v)

    def _buildable(self, t: type) -> bool:
        from tessera._tensor import Size, Tensor
        from tessera.device import device
        from tessera.nn.modules.module import Module
        if t in _user_objects():
            return True
        # a tensor's, device's or Size's internals are set by their constructors only
        if issubclass(t, (Tensor, device, Size)):
            return False
        return self._is_allowed(t) and issubclass(t, Module)

    def load_append(self) -> None:
        item = self.stack.pop()
        target = self.stack[-1]
        if type(target) is not list:
            raise pickle.UnpicklingError(f"Can only append to lists, but got {type(target)}")
        target.append(item)

    def load_appends(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not list:
            raise pickle.UnpicklingError(f"Can only extend lists, but got {type(target)}")
        target.extend(items)

    def _set_target(self, opcode: str) -> dict:
        target = self.stack[-1]
        if type(target) not in _SET_TARGETS:
            raise pickle.UnpicklingError(
                f"Can only {opcode} for dict, collections.OrderedDict, collections.Counter, "
                f"but got {type(target)}")
        return target

    def load_setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        self._set_target("SETITEM")[key] = value

    def load_setitems(self) -> None:
        items = self.pop_mark()
        target = self._set_target("SETITEMS")
        for i in range(0, len(items) - 1, 2):
            target[items[i]] = items[i + 1]

    def load_additems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not set:
            raise pickle.UnpicklingError(f"Can only add items to sets, but got {type(target)}")
        target.update(items)

    def load_bytearray8(self) -> None:
        # pickle.py allocates the length the stream claims before reading: read first
        (n,) = struct.unpack("<Q", self.read(8))
        data = self.read(n)
        if len(data) != n:
            raise pickle.UnpicklingError("pickle data was truncated")
        self.append(bytearray(data))

    def load_binpersid(self) -> None:
        pid = self.stack.pop()
        if type(pid) is not tuple and type(pid) is not int:
            raise pickle.UnpicklingError(
                f"persistent_load id must be tuple or int, but got {type(pid)}")
        if self._persistent is None:
            raise pickle.UnpicklingError("A load persistent id instruction was encountered, "
                                         "but no persistent_load function was specified.")
        self.append(self._persistent(pid))


def _track(handler: Callable, code: int) -> Callable:
    def run(self: RestrictedUnpickler) -> None:
        self._last = code
        handler(self)
    return run


def _build_dispatch() -> dict:
    base = _PyUnpickler.dispatch
    table: dict = {code: _track(_refused_opcode, code) for code in range(256)}
    for op in _DATA_OPCODES:
        table[op[0]] = base[op[0]]
    own = RestrictedUnpickler
    for op, fn in [(pickle.REDUCE, own.load_reduce), (pickle.NEWOBJ, own.load_newobj),
                   (pickle.NEWOBJ_EX, own.load_newobj_ex), (pickle.BUILD, own.load_build),
                   (pickle.APPEND, own.load_append), (pickle.APPENDS, own.load_appends),
                   (pickle.SETITEM, own.load_setitem), (pickle.SETITEMS, own.load_setitems),
                   (pickle.ADDITEMS, own.load_additems), (pickle.BINPERSID, own.load_binpersid),
                   (pickle.BYTEARRAY8, own.load_bytearray8)]:
        table[op[0]] = fn
    return table


RestrictedUnpickler.dispatch = _build_dispatch()


class FullUnpickler(pickle.Unpickler):
    """The unrestricted unpickler of ``weights_only=False`` (runs whatever the file says)."""

    def __init__(self, file, persistent_load: Callable | None, *,
                 encoding: str = "utf-8", find_class: Callable | None = None) -> None:
        super().__init__(file, encoding=encoding)
        self._persistent = persistent_load
        self._find = find_class

    def find_class(self, module: str, name: str) -> Any:
        if self._find is not None:
            obj = self._find(module, name)
            if obj is not None:
                return obj
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise pickle.UnpicklingError("unexpected persistent id in a plain pickle")
        return self._persistent(pid)
