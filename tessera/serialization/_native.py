"""Tessera's own checkpoint format: one safetensors file.

Its tensors hold the data (a storage once, however many tensors view it, and only the span
of it they view); its metadata holds a JSON description of the saved object (dicts, lists,
tuples, scalars, strings, None, references to tensors) and a SHA-256 digest of the whole
content, so corruption is detected. Loading builds that structure without running any
code from the file. An object that is not plain state (a whole ``nn.Module``, a custom
class) is pickled into a marked entry of the same file, its tensors still stored as
safetensors data, and read back with the restricted unpickler.

>>> import io
>>> data = serialize({"step": 3})
>>> data[8:9]
b'{'
"""
from __future__ import annotations

import base64
import collections
import hashlib
import io
import json
import math
import pickle
import struct
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Size, Tensor
from tessera.device import device as Device
from tessera.ops.creation import empty
from tessera.serialization import _unpickler as U

_FORMAT = "tessera"
_VERSION = "1"
_DIGEST_KEY = "tessera.sha256"
_PICKLE_PROTOCOL = 4

# safetensors dtype codes <-> NumPy dtypes (bfloat16 through ml_dtypes)
_CODE_OF = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
            "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
            "bool": "BOOL", "complex64": "C64", "uint16": "U16", "uint32": "U32",
            "uint64": "U64"}
_NP_OF = {code: (D.bfloat16.np if name == "bfloat16" else np.dtype(name))
          for name, code in _CODE_OF.items()}


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
        """Give every entry its storage: one per group of entries sharing memory, holding
        only the bytes they view (an expanded view keeps its one row, not the expansion)."""
        groups: dict[int, list[tuple[int, np.ndarray]]] = {}
        for i, arr in enumerate(self._arrays):
            if arr is None:
                self.entries[i]["storage"] = None
            else:
                groups.setdefault(id(_root_array(arr)), []).append((i, arr))
        for group in groups.values():
            members = [i for i, _ in group]
            arrs = [a for _, a in group]
            root, first = _root_array(arrs[0]), arrs[0]
            name = self._new_storage_name(self._paths[members[0]])
            if first.flags.c_contiguous and all(_view_key(a) == _view_key(first) for a in arrs):
                # a plain array: stored with its dtype and shape, as safetensors tools expect
                self.storages[name] = _storage_array(first)
                for i in members:
                    self.entries[i].update(storage=name, offset=0, strides=None)
            elif root.flags.c_contiguous or root.flags.f_contiguous:
                spans = [_span(a) for a in arrs if a.size]
                lo = min((s[0] for s in spans), default=0)
                hi = max((s[1] for s in spans), default=0)
                base = root.__array_interface__["data"][0]
                flat = (root if root.flags.c_contiguous else root.T).reshape(-1).view(np.uint8)
                self.storages[name] = flat[lo - base:hi - base] if spans else flat[:0]
                for i, a in zip(members, arrs):
                    self.entries[i].update(
                        storage=name, strides=list(a.strides),
                        offset=a.__array_interface__["data"][0] - lo if a.size else 0)
            else:  # memory we cannot describe as one buffer: store each view on its own
                for n, (i, a) in enumerate(zip(members, arrs)):
                    if n:
                        name = self._new_storage_name(self._paths[i])
                    data, strides = _compact(a)
                    self.storages[name] = data
                    self.entries[i].update(storage=name, offset=0, strides=strides)

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


def _span(a: np.ndarray) -> tuple[int, int]:
    """The byte range [lo, hi) a non-empty array's elements occupy."""
    ptr = a.__array_interface__["data"][0]
    lo = ptr + sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s < 0)
    hi = ptr + sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s > 0) + a.itemsize
    return lo, hi


def _compact(a: np.ndarray) -> tuple[np.ndarray, list[int] | None]:
    """``a``'s data stored once per distinct element: a broadcast (zero-stride) dimension
    keeps one slice and is described by its zero stride."""
    if a.size == 0 or 0 not in a.strides:
        return _storage_array(a), None
    one = np.ascontiguousarray(a[tuple(slice(0, 1) if s == 0 else slice(None)
                                       for s in a.strides)])
    strides = [0 if s == 0 else t for s, t in zip(a.strides, one.strides)]
    return one.reshape(-1).view(np.uint8), strides


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


def digest(metadata: dict, items: Iterable[tuple[str, str, list, Any]]) -> str:
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


def serialize(obj: Any) -> bytes:
    """The checkpoint's bytes."""
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
    metadata[_DIGEST_KEY] = digest(metadata, ((n, _code(a), list(a.shape), _raw_bytes(a))
                                               for n, a in saver.storages.items()))
    return safetensors.numpy.save(saver.storages, metadata=metadata)


# ==== loading =============================================================================

class Corrupt(RuntimeError):
    pass


def parse_header(data: bytes, where: str) -> tuple[dict, dict]:
    if len(data) < 8:
        raise Corrupt(f"{where}: not a checkpoint: the file is {len(data)} bytes long "
                       "(truncated or empty)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise Corrupt(f"{where}: truncated or corrupted checkpoint: the header claims "
                       f"{n} bytes but the file has {len(data) - 8} after the length field")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (UnicodeDecodeError, ValueError) as e:
        raise Corrupt(f"{where}: corrupted checkpoint: unreadable header ({e})") from None
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise Corrupt(f"{where}: corrupted checkpoint: bad metadata")
    return header, meta


def looks_like_safetensors(data: bytes) -> bool:
    if len(data) < 9:
        return False
    (n,) = struct.unpack("<Q", data[:8])
    return n <= len(data) - 8 and data[8:9] == b"{"


def _deserialize(data: bytes, where: str) -> dict[str, tuple[str, list, bytearray]]:
    import safetensors

    try:
        items = safetensors.deserialize(data if isinstance(data, bytes) else bytes(data))
    except Exception as e:  # safetensors raises its own SafetensorError
        raise Corrupt(f"{where}: truncated or corrupted safetensors file: {e}") from None
    return {name: (v["dtype"], list(v["shape"]), v["data"]) for name, v in items}


def _as_plain_array(name: str, code: str, shape: list, buf: bytearray) -> np.ndarray:
    if code not in _NP_OF:
        raise TypeError(f"tensor {name!r} has dtype {code}, which tessera cannot represent")
    return np.frombuffer(buf, dtype=_NP_OF[code]).reshape(shape)


def _ints(v: Any) -> bool:
    return type(v) is list and all(type(x) is int for x in v)


class _Loader:
    """Rebuilds a tessera checkpoint's structure, tensors and pickled entries."""

    def __init__(self, structure: dict, storages: dict, place: Callable,
                 weights_only: bool, where: str) -> None:
        self.table = structure["tensors"]
        if not isinstance(self.table, list):
            raise Corrupt(f"{where}: corrupted checkpoint: bad tensor table")
        self.storages = storages
        self.place = place
        self.weights_only = weights_only
        self.where = where
        self._built: dict[int, Any] = {}

    def entry(self, idx: Any) -> Any:
        if type(idx) is not int or not 0 <= idx < len(self.table):
            raise Corrupt(f"{self.where}: corrupted checkpoint: bad tensor reference {idx!r}")
        if idx not in self._built:
            e = self.table[idx]
            if not isinstance(e, dict):
                raise Corrupt(f"{self.where}: corrupted checkpoint: bad tensor entry")
            try:
                self._built[idx] = self._build(e)
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
                raise Corrupt(f"{self.where}: corrupted checkpoint: bad tensor entry {idx} "
                              f"({type(err).__name__}: {err})") from None
        return self._built[idx]

    def _array(self, e: dict, npdt: np.dtype) -> np.ndarray:
        shape, offset, strides = e["shape"], e.get("offset", 0), e.get("strides")
        buf = self.storages.get(e["storage"]) if isinstance(e["storage"], str) else None
        if buf is None:
            raise Corrupt(f"{self.where}: corrupted checkpoint: missing data {e['storage']!r}")
        if not (_ints(shape) and all(n >= 0 for n in shape) and type(offset) is int and
                0 <= offset <= len(buf) and (strides is None or
                                             (_ints(strides) and len(strides) == len(shape)))):
            raise Corrupt(f"{self.where}: corrupted checkpoint: bad tensor geometry")
        if strides is None:
            count = math.prod(shape)
            if offset < 0 or offset + count * npdt.itemsize > len(buf):
                raise Corrupt(f"{self.where}: corrupted checkpoint: tensor data out of range")
            return np.frombuffer(buf, dtype=npdt, count=count, offset=offset).reshape(shape)
        lo = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0 and n)
        hi = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0 and n)
        if math.prod(shape) and (lo < 0 or hi + npdt.itemsize > len(buf)):
            raise Corrupt(f"{self.where}: corrupted checkpoint: tensor view out of range")
        return np.ndarray(shape, npdt, buffer=buf, offset=offset, strides=strides)

    def _build(self, e: dict) -> Any:
        kind = e.get("kind")
        if kind == "ndarray":
            npdt = np.dtype(e["dtype"])
            if npdt.hasobject or npdt.kind not in "biufcUSmM":
                raise Corrupt(f"{self.where}: corrupted checkpoint: bad array dtype")
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
        return self.place(t, saved)

    def decode(self, node: Any) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if not isinstance(node, dict) or len(node) not in (1, 2, 3):
            raise Corrupt(f"{self.where}: corrupted checkpoint: bad structure node")
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
        raise Corrupt(f"{self.where}: corrupted checkpoint: unknown node {tag!r}")

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
            raise Corrupt(f"{self.where}: corrupted checkpoint: missing entry {name!r}")
        if not self.weights_only:
            return U.FullUnpickler(io.BytesIO(bytes(buf)), self._persistent).load()
        try:
            return U.RestrictedUnpickler(io.BytesIO(bytes(buf)), self._persistent).load()
        except pickle.UnpicklingError as e:
            raise pickle.UnpicklingError(U.weights_only_message(str(e))) from None

    def _persistent(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] in ("tensor", "ndarray")):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self.entry(pid[1])


def load_tessera(meta: dict, data: bytes, place: Callable, weights_only: bool,
                 where: str) -> Any:
    for key in ("tessera.structure", _DIGEST_KEY):
        if not isinstance(meta.get(key), str):
            raise Corrupt(f"{where}: corrupted checkpoint: metadata field {key!r} is missing")
    raw = _deserialize(data, where)
    found = digest(meta, ((n, code, shape, buf) for n, (code, shape, buf) in raw.items()))
    if found != meta[_DIGEST_KEY]:
        raise Corrupt(f"{where}: corrupted checkpoint: the checksum does not match the "
                       "content (the file was modified or damaged)")
    if meta.get("tessera.version") != _VERSION:
        raise RuntimeError(f"{where}: checkpoint format version {meta.get('tessera.version')!r}"
                           f" is not supported by this tessera (it reads version {_VERSION})")
    try:
        structure = json.loads(meta["tessera.structure"])
        root = structure["root"]
        loader = _Loader(structure, {name: buf for name, (_, _, buf) in raw.items()}, place,
                         weights_only, where)
    except (ValueError, KeyError, TypeError) as e:
        raise Corrupt(f"{where}: corrupted checkpoint: bad structure ({e})") from None
    if not weights_only:  # the file is trusted: its own errors propagate as they are
        return loader.decode(root)
    # the checksum is no signature: a crafted file can match it, so check every node
    try:
        return loader.decode(root)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise Corrupt(f"{where}: corrupted checkpoint: bad structure ({type(e).__name__}: "
                      f"{e})") from None


def load_plain(header: dict, data: bytes, place: Callable, where: str) -> dict[str, Tensor]:
    raw = _deserialize(data, where)
    out: dict[str, Tensor] = {}
    for name in header:  # the file's order
        code, shape, buf = raw[name]
        arr = _as_plain_array(name, code, shape, buf)
        out[name] = place(Tensor._from_numpy(arr), "cpu")
    return out
