"""Checkpoints: ``tessera.save`` / ``tessera.load`` as safetensors files.

A checkpoint is one safetensors file. Its tensors hold the data (a tensor's storage once,
however many tensors view it); its metadata holds a JSON description of the saved object
(dicts, lists, tuples, scalars, strings, None, references to tensors) and a SHA-256 digest
of the whole content, so corruption is detected. Loading builds that structure without
running any code from the file.

An object that is not plain state (a whole ``nn.Module``, a custom class) is pickled into a
marked entry of the same file, its tensors still stored as safetensors data. ``load`` reads
such entries with a restricted unpickler that builds only allowed globals: tessera's own
tensor, module, dtype and device types, NumPy arrays, dtypes and scalars,
``collections.OrderedDict``, and what ``add_safe_globals`` / ``safe_globals`` allow.
``weights_only=False`` uses the full unpickler (only for files you trust).

Plain ``.safetensors`` files written by PyTorch or Hugging Face load as a dict of tensors.
Saving to a path is atomic: a temporary file in the same folder, fsync, then rename.

>>> import tessera, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "ckpt.safetensors")
>>> tessera.save({"w": tessera.ones(2), "step": 3}, path)
>>> tessera.load(path)
{'w': tensor([1., 1.]), 'step': 3}
"""
from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import importlib
import io
import json
import math
import os
import pickle
import struct
import tempfile
from collections.abc import Callable, Iterable
from typing import IO, Any

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Size, Tensor
from tessera.device import device as Device
from tessera.ops.creation import empty

__all__ = ["save", "load", "save_file", "load_file", "add_safe_globals",
           "get_safe_globals", "clear_safe_globals", "safe_globals"]

FileLike = str | os.PathLike | IO[bytes]

_FORMAT = "tessera"
_VERSION = "1"
_DIGEST_KEY = "tessera.sha256"
_PICKLE_PROTOCOL = 4
_CHUNK = 1 << 24  # bytes written per call, so a huge checkpoint is not one giant write

# safetensors dtype codes <-> NumPy dtypes (bfloat16 through ml_dtypes)
_CODE_OF = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
            "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
            "bool": "BOOL", "complex64": "C64", "uint16": "U16", "uint32": "U32",
            "uint64": "U64"}
_NP_OF = {code: (D.bfloat16.np if name == "bfloat16" else np.dtype(name))
          for name, code in _CODE_OF.items()}


# ==== the allow-list of the restricted unpickler ==========================================

_user_safe_globals: list = []

# Globals that plain NumPy/builtin/collections values need; all build data, none run code.
_DEFAULT_SAFE = {
    "collections.OrderedDict", "builtins.set", "builtins.frozenset", "builtins.complex",
    "builtins.bytearray", "builtins.slice", "builtins.range", "builtins.object",
    "builtins.int", "builtins.float", "builtins.str", "builtins.bool", "builtins.tuple",
    "builtins.list", "builtins.dict", "builtins.bytes", "_codecs.encode",
    "copyreg._reconstructor",
    "numpy.ndarray", "numpy.dtype",
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar",
    "numpy.core.numeric._frombuffer", "numpy._core.numeric._frombuffer",
    "tessera._dtype._by_name", "tessera.ops.creation._rebuild_tensor",
    "tessera.nn.parameter._rebuild_parameter",
}


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
    """The globals added with ``add_safe_globals`` (not the built-in allow-list)."""
    return list(_user_safe_globals)


def clear_safe_globals() -> None:
    """Forget every global added with ``add_safe_globals``."""
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


def _is_tessera_type(obj: Any) -> bool:
    from tessera.nn.modules.module import Module
    return isinstance(obj, type) and (issubclass(obj, (Tensor, Module, D.dtype, Device, Size)))


def _resolve_safe_global(module: str, name: str) -> Any:
    """The object a restricted pickle may use for GLOBAL ``module.name``, or None."""
    full = f"{module}.{name}"
    for g in _user_safe_globals:
        obj, key = (g if isinstance(g, tuple) else (g, _global_name(g)))
        if key == full:
            return obj
    if "." in name or "<" in name:  # no attribute paths (they reach arbitrary objects)
        return None
    tessera_module = (module == "tessera" or module.startswith("tessera.")) and \
        "__main__" not in module
    if full in _DEFAULT_SAFE or tessera_module:
        try:
            obj = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return None
        if full in _DEFAULT_SAFE or _is_tessera_type(obj):
            return obj
    return None


def _refuse(module: str, name: str) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(
        f"Weights only load failed. Unsupported global: GLOBAL {module}.{name} was not an "
        "allowed global by default. Use tessera.serialization.add_safe_globals([{0}]) or "
        "the tessera.serialization.safe_globals([{0}]) context manager to allow it if you "
        "trust it, or load with weights_only=False if you trust the whole file (that can "
        "run arbitrary code).".format(name))


_PY2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}


class _RestrictedUnpickler(pickle.Unpickler):
    """Builds only allowed globals; tensors and arrays come from the checkpoint's data."""

    def __init__(self, file, persistent_load: Callable | None) -> None:
        super().__init__(file)
        self._persistent = persistent_load

    def find_class(self, module: str, name: str) -> Any:
        module = _PY2_MODULES.get(module, module)
        obj = _resolve_safe_global(module, name)
        if obj is None:
            raise _refuse(module, name)
        return obj

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise pickle.UnpicklingError("A load persistent id instruction was encountered, "
                                         "but no persistent_load function was specified.")
        return self._persistent(pid)


class _FullUnpickler(pickle.Unpickler):
    def __init__(self, file, persistent_load: Callable | None) -> None:
        super().__init__(file)
        self._persistent = persistent_load

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise pickle.UnpicklingError("unexpected persistent id in a plain pickle")
        return self._persistent(pid)


# ==== saving ==============================================================================

class _Cycle(Exception):
    """A container contains itself: plain JSON cannot describe it, so it is pickled."""


def _root_array(arr: np.ndarray) -> np.ndarray:
    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root


def _is_raw_ndarray(obj: Any) -> bool:
    return type(obj) is np.ndarray and not obj.dtype.hasobject and obj.dtype.kind in "biufcUSmM"


class _Saver:
    """Turns an object into (JSON structure, named NumPy arrays to store)."""

    def __init__(self) -> None:
        self.entries: list[dict] = []        # the tensor table
        self._arrays: list[np.ndarray | None] = []  # the data of each entry (None for meta)
        self._paths: list[str] = []
        self._by_id: dict[int, int] = {}     # id(tensor or array) -> entry index
        self._keep: list = []                # keeps ids valid while saving
        self._active: set[int] = set()
        self.storages: dict[str, np.ndarray] = {}
        self._n_pickles = 0

    # ---- the structure --------------------------------------------------------------------
    def encode(self, obj: Any, path: str) -> Any:
        if obj is None or type(obj) in (bool, str, int):
            return obj
        if type(obj) is float:
            return obj if math.isfinite(obj) else {"float": repr(obj)}
        if isinstance(obj, Tensor):
            return {"tensor": self.tensor_ref(obj, path)}
        if _is_raw_ndarray(obj):
            return {"ndarray": self.array_ref(obj, path)}
        if type(obj) is complex:
            return {"complex": [self.encode(obj.real, path), self.encode(obj.imag, path)]}
        if type(obj) is bytes:
            return {"bytes": base64.b64encode(obj).decode("ascii")}
        if isinstance(obj, D.dtype):
            return {"dtype": obj.name}
        if type(obj) is Device:
            return {"device": str(obj)}
        if type(obj) is Size:
            return {"size": list(obj)}
        if type(obj) in (list, tuple, dict, collections.OrderedDict):
            return self._encode_container(obj, path)
        return {"pickle": self.pickle_entry(obj)}

    def _encode_container(self, obj: Any, path: str) -> dict:
        if id(obj) in self._active:
            raise _Cycle
        self._active.add(id(obj))
        try:
            if isinstance(obj, (list, tuple)):
                kind = "list" if type(obj) is list else "tuple"
                return {kind: [self.encode(v, f"{path}.{i}" if path else str(i))
                               for i, v in enumerate(obj)]}
            items = [[self.encode(k, path), self.encode(v, _join(path, k))]
                     for k, v in obj.items()]
            node: dict = {"dict": items}
            if type(obj) is collections.OrderedDict:
                node["ordered"] = True
                if hasattr(obj, "_metadata"):  # Module.state_dict's per-module versions
                    node["metadata"] = self.encode(obj._metadata, path)
            return node
        finally:
            self._active.discard(id(obj))

    def pickle_entry(self, obj: Any) -> str:
        buf = io.BytesIO()
        _Pickler(buf, self).dump(obj)
        name = f"__pickle__.{self._n_pickles}"
        self._n_pickles += 1
        self.storages[name] = np.frombuffer(buf.getvalue(), dtype=np.uint8)
        return name

    # ---- tensors --------------------------------------------------------------------------
    def tensor_ref(self, t: Tensor, path: str) -> int:
        if id(t) in self._by_id:
            return self._by_id[id(t)]
        from tessera.nn.parameter import Buffer, Parameter
        kind = "parameter" if isinstance(t, Parameter) else \
            "buffer" if isinstance(t, Buffer) else "tensor"
        entry = {"kind": kind, "dtype": t.dtype.name, "shape": list(t.shape),
                 "device": str(t.device), "requires_grad": bool(t.requires_grad)}
        if kind == "buffer":
            entry["persistent"] = bool(getattr(t, "persistent", True))
        arr = None if t._data is None else t.detach()._to_numpy()
        return self._add(t, entry, arr, path)

    def array_ref(self, a: np.ndarray, path: str) -> int:
        if id(a) in self._by_id:
            return self._by_id[id(a)]
        entry = {"kind": "ndarray", "dtype": a.dtype.str, "shape": list(a.shape)}
        return self._add(a, entry, a, path)

    def _add(self, obj: Any, entry: dict, arr: np.ndarray | None, path: str) -> int:
        self._by_id[id(obj)] = len(self.entries)
        self._keep.append(obj)
        self.entries.append(entry)
        self._arrays.append(arr)
        self._paths.append(path or "tensor")
        return len(self.entries) - 1

    def layout_storages(self) -> None:
        """Give every entry its storage: one per group of entries sharing memory."""
        groups: dict[int, list[tuple[int, np.ndarray]]] = {}
        for i, arr in enumerate(self._arrays):
            if arr is None:
                self.entries[i]["storage"] = None
            else:
                groups.setdefault(id(_root_array(arr)), []).append((i, arr))
        for group in groups.values():
            members = [i for i, _ in group]
            arrs = [a for _, a in group]
            root = _root_array(arrs[0])
            same_view = all(_view_key(a) == _view_key(arrs[0]) for a in arrs)
            if same_view:
                name = self._new_storage_name(self._paths[members[0]])
                self.storages[name] = _storage_array(arrs[0])
                for i in members:
                    self.entries[i].update(storage=name, offset=0, strides=None)
            elif root.flags.c_contiguous or root.flags.f_contiguous:
                name = self._new_storage_name(self._paths[members[0]])
                flat = (root if root.flags.c_contiguous else root.T).reshape(-1)
                self.storages[name] = flat.view(np.uint8)
                base = root.__array_interface__["data"][0]
                for i, a in zip(members, arrs):
                    self.entries[i].update(storage=name,
                                           offset=a.__array_interface__["data"][0] - base,
                                           strides=list(a.strides))
            else:  # memory we cannot describe as one buffer: store each view on its own
                for i, a in zip(members, arrs):
                    name = self._new_storage_name(self._paths[i])
                    self.storages[name] = _storage_array(a)
                    self.entries[i].update(storage=name, offset=0, strides=None)

    def _new_storage_name(self, path: str) -> str:
        name, n = path, 1
        while name in self.storages or name == "__metadata__":
            name, n = f"{path}#{n}", n + 1
        return name


def _join(path: str, key: Any) -> str:
    k = key if isinstance(key, str) else str(key)
    return f"{path}.{k}" if path else k


def _view_key(a: np.ndarray) -> tuple:
    return (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype)


def _storage_array(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous array safetensors can store (raw bytes for dtypes it lacks)."""
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    name = "bfloat16" if a.dtype == D.bfloat16.np else a.dtype.name
    if name in _CODE_OF and a.dtype.isnative:
        return a
    return a.reshape(-1).view(np.uint8) if a.size else np.zeros(0, np.uint8)


class _Pickler(pickle.Pickler):
    """Pickles with tensors and plain arrays moved into the checkpoint's tensor table."""

    def __init__(self, file, saver: _Saver) -> None:
        super().__init__(file, protocol=_PICKLE_PROTOCOL)
        self._saver = saver

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Tensor):
            return ("tensor", self._saver.tensor_ref(obj, "pickled"))
        if _is_raw_ndarray(obj):
            return ("ndarray", self._saver.array_ref(obj, "pickled"))
        return None


def _digest(metadata: dict, items: Iterable[tuple[str, str, list, Any]]) -> str:
    """SHA-256 over the metadata (all but the digest itself: the structure, the format
    fields) and every stored tensor's name, dtype, shape and bytes (``data`` is any
    C-contiguous buffer)."""
    h = hashlib.sha256(b"tessera-checkpoint-1\0")
    fields = sorted((k, v) for k, v in metadata.items() if k != _DIGEST_KEY)
    h.update(json.dumps(fields).encode())
    for name, code, shape, data in sorted(items, key=lambda it: it[0]):
        view = memoryview(data).cast("B")
        h.update(f"\0{name}\0{code}\0{list(shape)}\0{view.nbytes}\0".encode())
        h.update(view)
    return h.hexdigest()


def _raw_bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def _code(a: np.ndarray) -> str:
    return _CODE_OF["bfloat16" if a.dtype == D.bfloat16.np else a.dtype.name]


def _serialize(obj: Any) -> bytes:
    import safetensors.numpy

    saver = _Saver()
    try:
        root = saver.encode(obj, "")
    except _Cycle:
        saver = _Saver()
        root = {"pickle": saver.pickle_entry(obj)}
    saver.layout_storages()
    structure = json.dumps({"version": 1, "root": root, "tensors": saver.entries},
                           separators=(",", ":"), allow_nan=False)
    metadata = {"format": _FORMAT, "tessera.version": _VERSION, "tessera.structure": structure}
    metadata[_DIGEST_KEY] = _digest(metadata, ((n, _code(a), list(a.shape), _raw_bytes(a))
                                               for n, a in saver.storages.items()))
    return safetensors.numpy.save(saver.storages, metadata=metadata)


def _write_payload(fh: IO[bytes], data: bytes) -> None:
    view = memoryview(data)
    for start in range(0, len(view), _CHUNK):
        fh.write(view[start:start + _CHUNK])


def _atomic_write(path: str, data: bytes) -> None:
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            _write_payload(fh, data)
            fh.flush()
            os.fsync(fh.fileno())
        _set_mode(tmp, path)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _set_mode(tmp: str, path: str) -> None:
    # mkstemp makes 0600 files; give the checkpoint the mode a plain open() would
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(tmp, mode)


def save(obj: Any, f: FileLike, pickle_module: Any = None, pickle_protocol: int = 2,
         _use_new_zipfile_serialization: bool = True) -> None:
    """Save ``obj`` (tensors, state_dicts, optimizer states, or any picklable object) to
    ``f``, a path or a binary file object. Paths are written atomically.

    ``pickle_module`` / ``pickle_protocol`` are accepted for PyTorch compatibility; the
    objects that need pickling always use protocol 4.
    """
    data = _serialize(obj)
    if isinstance(f, (str, os.PathLike)):
        _atomic_write(os.fspath(f), data)
    elif hasattr(f, "write"):
        _write_payload(f, data)
        if hasattr(f, "flush"):
            f.flush()
    else:
        raise TypeError(f"save expects a path or a writable binary file, got {type(f)}")


def save_file(tensors: dict[str, Tensor], filename: str | os.PathLike,
              metadata: dict[str, str] | None = None) -> None:
    """Write a plain safetensors file (names -> tensors, like ``safetensors.torch``), for
    tools that read safetensors directly. Written atomically."""
    import safetensors.numpy

    arrays = {}
    for k, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"save_file: {k!r} is a {type(t).__name__}, not a Tensor")
        arrays[k] = _storage_array(t.detach().cpu()._to_numpy())
    _atomic_write(os.fspath(filename), safetensors.numpy.save(arrays, metadata=metadata))


# ==== loading =============================================================================

class _Corrupt(RuntimeError):
    pass


def _read_all(f: FileLike) -> tuple[bytes, str]:
    if isinstance(f, (str, os.PathLike)):
        with open(os.fspath(f), "rb") as fh:
            return fh.read(), os.fspath(f)
    if hasattr(f, "read"):
        return f.read(), getattr(f, "name", "<file object>")
    raise TypeError(f"load expects a path or a readable binary file, got {type(f)}")


def _parse_header(data: bytes, where: str) -> tuple[dict, dict]:
    if len(data) < 8:
        raise _Corrupt(f"{where}: not a checkpoint: the file is {len(data)} bytes long "
                       "(truncated or empty)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise _Corrupt(f"{where}: truncated or corrupted checkpoint: the header claims "
                       f"{n} bytes but the file has {len(data) - 8} after the length field")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (UnicodeDecodeError, ValueError) as e:
        raise _Corrupt(f"{where}: corrupted checkpoint: unreadable header ({e})") from None
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise _Corrupt(f"{where}: corrupted checkpoint: bad metadata")
    return header, meta


def _looks_like_safetensors(data: bytes) -> bool:
    if len(data) < 9:
        return False
    (n,) = struct.unpack("<Q", data[:8])
    return n <= len(data) - 8 and data[8:9] == b"{"


def _deserialize(data: bytes, where: str) -> dict[str, tuple[str, list, bytearray]]:
    import safetensors

    try:
        items = safetensors.deserialize(data)
    except Exception as e:  # safetensors raises its own SafetensorError
        raise _Corrupt(f"{where}: truncated or corrupted safetensors file: {e}") from None
    return {name: (v["dtype"], list(v["shape"]), v["data"]) for name, v in items}


def _as_plain_array(name: str, code: str, shape: list, buf: bytearray) -> np.ndarray:
    if code not in _NP_OF:
        raise TypeError(f"tensor {name!r} has dtype {code}, which tessera cannot represent")
    return np.frombuffer(buf, dtype=_NP_OF[code]).reshape(shape)


class _Loader:
    """Rebuilds a tessera checkpoint's structure, tensors and pickled entries."""

    def __init__(self, structure: dict, storages: dict, map_location: Any,
                 weights_only: bool, where: str) -> None:
        self.table = structure["tensors"]
        self.storages = storages
        self.map_location = map_location
        self.weights_only = weights_only
        self.where = where
        self._built: dict[int, Any] = {}

    def entry(self, idx: Any) -> Any:
        if type(idx) is not int or not 0 <= idx < len(self.table):
            raise _Corrupt(f"{self.where}: corrupted checkpoint: bad tensor reference {idx!r}")
        if idx not in self._built:
            self._built[idx] = self._build(self.table[idx])
        return self._built[idx]

    def _array(self, e: dict, npdt: np.dtype) -> np.ndarray:
        shape = [int(s) for s in e["shape"]]
        buf = self.storages.get(e["storage"])
        if buf is None:
            raise _Corrupt(f"{self.where}: corrupted checkpoint: missing data {e['storage']!r}")
        offset = int(e.get("offset", 0))
        strides = e.get("strides")
        if strides is None:
            count = math.prod(shape)
            if offset < 0 or offset + count * npdt.itemsize > len(buf):
                raise _Corrupt(f"{self.where}: corrupted checkpoint: tensor data out of range")
            return np.frombuffer(buf, dtype=npdt, count=count, offset=offset).reshape(shape)
        lo = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0 and n)
        hi = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0 and n)
        if math.prod(shape) and (lo < 0 or hi + npdt.itemsize > len(buf)):
            raise _Corrupt(f"{self.where}: corrupted checkpoint: tensor view out of range")
        return np.ndarray(shape, npdt, buffer=buf, offset=offset, strides=strides)

    def _build(self, e: dict) -> Any:
        kind = e.get("kind")
        if kind == "ndarray":
            npdt = np.dtype(e["dtype"])
            if npdt.hasobject or npdt.kind not in "biufcUSmM":
                raise _Corrupt(f"{self.where}: corrupted checkpoint: bad array dtype")
            return self._array(e, npdt)
        dt = D.as_dtype(e["dtype"])
        if e.get("storage") is None:  # saved from the meta device: shape and dtype only
            t = empty(e["shape"], dtype=dt, device="meta")
        else:
            t = Tensor._from_numpy(self._array(e, np.dtype(dt.np)))
            t = self._place(t, e.get("device", "cpu"))
        if kind == "parameter":
            from tessera.nn.parameter import Parameter
            return Parameter(t, bool(e.get("requires_grad", True)))
        if kind == "buffer":
            from tessera.nn.parameter import Buffer
            t = Buffer(t, persistent=bool(e.get("persistent", True)))
        if e.get("requires_grad"):
            t.requires_grad_(True)
        return t

    def _place(self, t: Tensor, saved: str) -> Tensor:
        ml = self.map_location
        if callable(ml) and not isinstance(ml, (str, Device)):
            moved = ml(t, saved)
            return t if moved is None else moved
        if isinstance(ml, dict):
            target = ml.get(saved, saved)
        else:
            target = saved if ml is None else ml
        try:
            dev = Device(target)
        except RuntimeError as e:
            raise RuntimeError(f"{self.where}: a tensor was saved on device '{saved}', which "
                               f"is not available ({e}); pass map_location='cpu' to load it "
                               "on the CPU") from None
        return t if dev == t.device else t.to(dev)

    def decode(self, node: Any) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if not isinstance(node, dict) or len(node) not in (1, 2, 3):
            raise _Corrupt(f"{self.where}: corrupted checkpoint: bad structure node")
        (tag, value), *_ = node.items()
        if tag == "tensor" or tag == "ndarray":
            return self.entry(value)
        if tag == "list":
            return [self.decode(v) for v in value]
        if tag == "tuple":
            return tuple(self.decode(v) for v in value)
        if tag == "dict":
            return self._decode_dict(node)
        if tag == "float":
            return float(value)
        if tag == "complex":
            return complex(self.decode(value[0]), self.decode(value[1]))
        if tag == "bytes":
            return base64.b64decode(value)
        if tag == "dtype":
            return D.as_dtype(value)
        if tag == "device":
            return Device(value)
        if tag == "size":
            return Size(int(v) for v in value)
        if tag == "pickle":
            return self.unpickle(value)
        raise _Corrupt(f"{self.where}: corrupted checkpoint: unknown node {tag!r}")

    def _decode_dict(self, node: dict) -> dict:
        out: dict = collections.OrderedDict() if node.get("ordered") else {}
        for k, v in node["dict"]:
            out[self.decode(k)] = self.decode(v)
        if "metadata" in node:
            out._metadata = self.decode(node["metadata"])  # type: ignore[attr-defined]
        return out

    def unpickle(self, name: str) -> Any:
        buf = self.storages.get(name)
        if buf is None:
            raise _Corrupt(f"{self.where}: corrupted checkpoint: missing entry {name!r}")
        cls = _RestrictedUnpickler if self.weights_only else _FullUnpickler
        return cls(io.BytesIO(bytes(buf)), self._persistent).load()

    def _persistent(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] in ("tensor", "ndarray")):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self.entry(pid[1])


def _load_tessera(meta: dict, data: bytes, map_location, weights_only, where) -> Any:
    for key in ("tessera.structure", _DIGEST_KEY):
        if not isinstance(meta.get(key), str):
            raise _Corrupt(f"{where}: corrupted checkpoint: metadata field {key!r} is missing")
    raw = _deserialize(data, where)
    digest = _digest(meta, ((n, code, shape, buf) for n, (code, shape, buf) in raw.items()))
    if digest != meta[_DIGEST_KEY]:
        raise _Corrupt(f"{where}: corrupted checkpoint: the checksum does not match the "
                       "content (the file was modified or damaged)")
    if meta.get("tessera.version") != _VERSION:
        raise RuntimeError(f"{where}: checkpoint format version {meta.get('tessera.version')!r}"
                           f" is not supported by this tessera (it reads version {_VERSION})")
    structure = json.loads(meta["tessera.structure"])
    storages = {name: buf for name, (_, _, buf) in raw.items()}
    # the checksum matched, so errors past this point are not corruption and propagate
    return _Loader(structure, storages, map_location, weights_only, where).decode(
        structure["root"])


def _load_plain(header: dict, data: bytes, map_location, where) -> dict[str, Tensor]:
    raw = _deserialize(data, where)
    out: dict[str, Tensor] = {}
    loader = _Loader({"tensors": []}, {}, map_location, True, where)
    for name in header:  # the file's order
        code, shape, buf = raw[name]
        arr = _as_plain_array(name, code, shape, buf)
        out[name] = loader._place(Tensor._from_numpy(arr), "cpu")
    return out


def _looks_like_pickle(data: bytes) -> bool:
    return len(data) > 2 and data[0] == 0x80 and 2 <= data[1] <= 5 and data[-1:] == b"."


def _load_pickle(data: bytes, weights_only: bool, where: str) -> Any:
    cls = _RestrictedUnpickler if weights_only else _FullUnpickler
    try:
        return cls(io.BytesIO(data), None).load()
    except pickle.UnpicklingError:
        raise
    except (EOFError, ValueError, struct.error) as e:
        raise _Corrupt(f"{where}: truncated or corrupted pickle file: {e}") from None


def load(f: FileLike, map_location: Any = None, pickle_module: Any = None, *,
         weights_only: bool | None = None, mmap: bool | None = None,
         **pickle_load_args: Any) -> Any:
    """Load what ``save`` wrote, or a plain ``.safetensors`` file (a dict of tensors).

    ``map_location`` moves tensors: a device or string, a dict from saved to wanted
    device strings, or ``fn(tensor, saved_location)``. With ``weights_only`` (the
    default, None meaning True) pickled entries may build only allowed globals
    (``add_safe_globals``); ``weights_only=False`` trusts the file completely.
    Raises RuntimeError for a truncated or corrupted file.
    """
    weights_only = True if weights_only is None else bool(weights_only)
    data, where = _read_all(f)
    if data[:4] == b"PK\x03\x04":
        raise RuntimeError(f"{where}: this is a PyTorch zip checkpoint (torch.save), which "
                           "tessera cannot read; save it with safetensors instead "
                           "(safetensors.torch.save_file(model.state_dict(), path))")
    if not _looks_like_safetensors(data):
        if _looks_like_pickle(data):  # a plain pickle stream
            return _load_pickle(data, weights_only, where)
        _parse_header(data, where)  # raises the precise error
        raise _Corrupt(f"{where}: not a tessera checkpoint or safetensors file")
    header, meta = _parse_header(data, where)
    if meta.get("format") == _FORMAT or any(str(k).startswith("tessera") for k in meta):
        return _load_tessera(meta, data, map_location, weights_only, where)
    return _load_plain(header, data, map_location, where)


def load_file(filename: str | os.PathLike, device: Any = "cpu") -> dict[str, Tensor]:
    """Read a safetensors file as a dict of tensors (like ``safetensors.torch.load_file``)."""
    data, where = _read_all(filename)
    header, _ = _parse_header(data, where)
    return _load_plain(header, data, device, where)
