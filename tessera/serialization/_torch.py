"""PyTorch checkpoint files without PyTorch: ``torch.save``'s zip format (read and write)
and its legacy pre-1.6 format (read).

A zip checkpoint holds ``<archive>/data.pkl`` (the object, tensors as persistent ids of
storages), ``<archive>/data/<key>`` (each storage's bytes, uncompressed, 64-byte aligned),
``<archive>/version``, ``<archive>/byteorder`` and a few small records. Reading maps each
storage onto the file's bytes (no copy) and rebuilds tensors from checked parts: shape,
strides, offset within the storage, dtype in the known set. The pickle runs under the same
restricted unpickler as tessera's own format, with PyTorch's rebuild functions mapped to
tessera's.

>>> import io, tessera
>>> buf = io.BytesIO()
>>> tessera.save({"w": tessera.ones(2)}, buf, format="torch")
>>> _ = buf.seek(0)
>>> tessera.load(buf)
{'w': tensor([1., 1.])}
"""
from __future__ import annotations

import collections
import io
import math
import os
import pickle
import random
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Size, Tensor
from tessera.device import device as Device
from tessera.serialization import _unpickler as U

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
LEGACY_MAGIC = pickle.dumps(MAGIC_NUMBER, protocol=2)  # how torch's legacy files begin
_ALIGN = 64

_STORAGE_DTYPE = {"DoubleStorage": D.float64, "FloatStorage": D.float32,
                  "HalfStorage": D.float16, "BFloat16Storage": D.bfloat16,
                  "LongStorage": D.int64, "IntStorage": D.int32, "ShortStorage": D.int16,
                  "CharStorage": D.int8, "ByteStorage": D.uint8, "BoolStorage": D.bool_,
                  "ComplexFloatStorage": D.complex64, "ComplexDoubleStorage": D.complex128}
_STORAGE_OF = {dt: name for name, dt in _STORAGE_DTYPE.items()}
# torch dtypes tessera has no counterpart for: loading a tensor of one says so
_FOREIGN_DTYPES = ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2",
                   "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "qint8", "quint8",
                   "qint32", "quint4x2", "quint2x4", "complex32", "bits8", "bits16",
                   "bits1x8", "bits2x4", "bits4x2", "float4_e2m1fn_x2")


class ForeignDtype:
    """A PyTorch dtype tessera lacks (``torch.uint16``...): loads as a value, but a tensor
    of it cannot be built."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class StorageType:
    """``torch.FloatStorage`` and friends as they appear in a checkpoint: a dtype tag."""

    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: D.dtype | None) -> None:
        self.name, self.dtype = name, dtype

    def __repr__(self) -> str:
        return f"StorageType(dtype={self.dtype})"


class Storage:
    """The bytes of one saved storage (made only by the loader, from the file)."""

    __slots__ = ("data", "dtype", "location", "version")

    def __init__(self, data: np.ndarray, dtype: D.dtype | None, location: str) -> None:
        self.data = data            # 1-D uint8 over the file's bytes
        self.dtype = dtype          # None for an untyped (byte) storage
        self.location = location
        self.version = [0]          # tensors of one storage share a version counter


# ==== rebuilding tensors from checked parts ===============================================

class _Context:
    """What the rebuild functions of one load need: where tensors go."""

    place: Callable[[Tensor, str], Tensor] = staticmethod(lambda t, loc: t)


_ctx = _Context()


def _int_tuple(v: Any, what: str) -> tuple[int, ...]:
    if not isinstance(v, (tuple, list)) or not all(type(x) is int for x in v):
        raise RuntimeError(f"corrupted checkpoint: tensor {what} must be a tuple of ints, "
                           f"got {v!r}")
    return tuple(v)


def tensor_from_storage(storage: Any, offset: Any, size: Any, stride: Any,
                        dtype: D.dtype | None = None) -> Tensor:
    """A tensor viewing ``storage`` after checking every part against it."""
    if type(storage) is not Storage:
        raise RuntimeError(f"corrupted checkpoint: a tensor's storage is a "
                           f"{type(storage).__name__}, not a saved storage")
    dt = storage.dtype if dtype is None else dtype
    if dt is None:
        dt = D.uint8
    if isinstance(dt, ForeignDtype):
        raise TypeError(f"the checkpoint holds a tensor of dtype {dt!r}, which tessera cannot "
                        "represent")
    if not isinstance(dt, D.dtype):
        raise RuntimeError(f"corrupted checkpoint: bad tensor dtype {dt!r}")
    size, stride = _int_tuple(size, "size"), _int_tuple(stride, "stride")
    if type(offset) is not int or len(size) != len(stride) or any(n < 0 for n in size):
        raise RuntimeError(f"corrupted checkpoint: bad tensor geometry size={size}, "
                           f"stride={stride}, offset={offset!r}")
    if any(s < 0 for s in stride) or offset < 0:
        raise RuntimeError("as_strided: Negative strides are not supported at the moment, "
                           f"got strides: {list(stride)}, storage offset: {offset}")
    item = dt.itemsize
    n_items = storage.data.shape[0] // item
    numel = math.prod(size)
    if numel == 0:
        arr = np.zeros(size, dt.np)
    else:
        need = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1
        if need > n_items:
            raise RuntimeError(
                f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset "
                f"{offset}, and itemsize {item} requiring a storage size of {need * item} are "
                f"out of bounds for storage of size {n_items * item}")
        arr = np.ndarray(size, dt.np, buffer=storage.data, offset=offset * item,
                         strides=tuple(s * item for s in stride))
    t = Tensor._from_numpy(arr)
    t._version = storage.version
    return _ctx.place(t, storage.location)


def _requires_grad(t: Tensor, flag: Any) -> Tensor:
    if flag is True:
        t.requires_grad_(True)
    elif flag is not False:
        raise RuntimeError(f"corrupted checkpoint: requires_grad is {flag!r}")
    return t


def _rebuild_tensor(storage, storage_offset, size, stride):
    return tensor_from_storage(storage, storage_offset, size, stride)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
    t = tensor_from_storage(storage, storage_offset, size, stride)
    return _requires_grad(t, requires_grad)


def _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks,
                       dtype, metadata=None):
    t = tensor_from_storage(storage, storage_offset, size, stride, dtype)
    return _requires_grad(t, requires_grad)


def _rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad):
    from tessera.ops.creation import empty
    if not isinstance(dtype, D.dtype):
        raise TypeError(f"the checkpoint holds a meta tensor of dtype {dtype!r}, which "
                        "tessera cannot represent")
    return _requires_grad(empty(_int_tuple(size, "size"), dtype=dtype, device="meta"),
                          requires_grad)


def _rebuild_parameter(data, requires_grad, backward_hooks=None):
    from tessera.nn.parameter import Parameter
    if type(data) is not Tensor or type(requires_grad) is not bool:
        raise RuntimeError("corrupted checkpoint: a Parameter must wrap a tensor")
    return Parameter(data, requires_grad)


def _set_state(obj: Any, state: Any) -> Any:
    """PyTorch's _set_obj_state, for plain attributes only: a tensor's internals (its
    class's own names, underscored names) are never set from a file."""
    if state is None:
        return obj
    if isinstance(state, tuple) and len(state) == 2:
        dict_state, slots = state
        state = {**(dict_state or {}), **(slots or {})}
    if not isinstance(state, dict):
        raise RuntimeError(f"corrupted checkpoint: bad tensor state {type(state)}")
    for k, v in state.items():
        if type(k) is not str or not k.isidentifier() or k.startswith("_") or \
                hasattr(type(obj), k):
            raise pickle.UnpicklingError(f"a tensor attribute {k!r} cannot be set from a "
                                         "checkpoint")
        obj.__dict__[k] = v
    return obj


def _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state):
    return _set_state(_rebuild_parameter(data, requires_grad), state)


_REBUILDERS = (_rebuild_tensor, _rebuild_tensor_v2, _rebuild_tensor_v3,
               _rebuild_parameter, _rebuild_parameter_with_state,
               _rebuild_meta_tensor_no_storage)


def _rebuild_from_type_v2(func, new_type, args, state):
    from tessera.nn.parameter import Parameter
    if func not in _REBUILDERS or type(args) is not tuple:
        raise pickle.UnpicklingError(f"Trying to call reduce for unrecognized function {func}")
    if new_type is not Tensor and new_type is not Parameter:
        raise pickle.UnpicklingError(f"cannot rebuild a tensor of type {new_type!r}")
    ret = func(*args)
    if type(ret) is not new_type:
        if new_type is Parameter:
            ret = Parameter(ret, ret.requires_grad)
        else:
            raise RuntimeError(f"corrupted checkpoint: expected a {new_type.__name__}")
    return _set_state(ret, state)


def _device(*args: Any) -> Device:
    return Device(*args)


def _globals() -> dict[str, Any]:
    from tessera.nn.parameter import Parameter
    table: dict[str, Any] = {
        "torch.Size": Size, "torch.device": _device, "torch.Tensor": Tensor,
        "torch.nn.parameter.Parameter": Parameter,
        "torch.storage.UntypedStorage": StorageType("UntypedStorage", None),
        "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
    }
    for fn in _REBUILDERS:
        table[f"torch._utils.{fn.__name__}"] = fn
    for name, dt in _STORAGE_DTYPE.items():
        table[f"torch.{name}"] = StorageType(name, dt)
    for dt in D.ALL:
        table[f"torch.{dt.name}"] = dt
    for name in _FOREIGN_DTYPES:
        table[f"torch.{name}"] = ForeignDtype(name)
    return table


U.register_globals(_globals())


# ==== reading =============================================================================

class BufferFile(io.RawIOBase):
    """A read-only file over a buffer, without copying it (for zipfile and the unpickler)."""

    def __init__(self, buf: Any) -> None:
        self._view = memoryview(buf).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = (0, self._pos, len(self._view))[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def read(self, n: int | None = -1) -> bytes:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._pos + n)
        out = bytes(self._view[self._pos:end])
        self._pos = max(self._pos, end)
        return out

    def readinto(self, b: Any) -> int:
        data = self.read(len(memoryview(b)))
        memoryview(b).cast("B")[:len(data)] = data
        return len(data)

    def readline(self, limit: int | None = -1) -> bytes:
        view, start = self._view, self._pos
        stop = len(view) if limit is None or limit < 0 else min(len(view), start + limit)
        i = bytes(view[start:stop]).find(b"\n")
        return self.read((stop if i < 0 else start + i + 1) - start)


def _unpickle(data: Any, persistent: Callable, weights_only: bool, where: str,
              file: BufferFile | None = None) -> Any:
    file = file or BufferFile(data)
    if weights_only:
        try:
            return U.RestrictedUnpickler(file, persistent).load()
        except pickle.UnpicklingError as e:
            raise pickle.UnpicklingError(U.weights_only_message(str(e))) from None
    try:
        return U.FullUnpickler(file, persistent, find_class=_full_find_class).load()
    except (EOFError, struct.error) as e:
        raise RuntimeError(f"{where}: truncated or corrupted checkpoint ({e})") from None


def _full_find_class(module: str, name: str) -> Any:
    """``weights_only=False``: PyTorch's names still mean tessera's objects."""
    return U._format_globals.get(f"{module}.{name}")


def _storage_pid(pid: Any, legacy: bool) -> tuple[StorageType, str, str, int, Any]:
    if not isinstance(pid, tuple) or not pid or pid[0] not in ("storage", b"storage") or \
            len(pid) != (6 if legacy else 5):
        raise RuntimeError(f"corrupted checkpoint: unknown persistent id {pid!r}")
    stype, key, location, numel = pid[1:5]
    if isinstance(location, bytes):
        location = location.decode("ascii", "replace")
    if type(stype) is not StorageType or type(key) is not str or type(location) is not str \
            or type(numel) is not int or numel < 0:
        raise RuntimeError(f"corrupted checkpoint: bad storage record {pid!r}")
    return stype, key, location, numel, (pid[5] if legacy else None)


def _item_size(stype: StorageType) -> int:
    return 1 if stype.dtype is None else stype.dtype.itemsize


def _member_data(zf: zipfile.ZipFile, info: zipfile.ZipInfo, buf: Any, where: str,
                 check_crc: bool) -> np.ndarray:
    """The member's bytes as a uint8 array over ``buf`` (stored members), else a copy."""
    total = len(buf)
    start = info.header_offset
    head = bytes(memoryview(buf)[start:start + 30]) if 0 <= start < total else b""
    if len(head) != 30 or head[:4] != b"PK\x03\x04":
        raise RuntimeError(f"{where}: corrupted zip checkpoint: bad header of {info.filename}")
    n_name, n_extra = struct.unpack("<HH", head[26:30])
    begin = start + 30 + n_name + n_extra
    if info.compress_type != zipfile.ZIP_STORED:
        return np.frombuffer(bytearray(zf.read(info)), np.uint8)
    if begin + info.file_size > total or info.compress_size != info.file_size:
        raise RuntimeError(f"{where}: truncated or corrupted zip checkpoint: "
                           f"{info.filename} runs past the end of the file")
    arr = np.frombuffer(buf, np.uint8, count=info.file_size, offset=begin)
    if check_crc and zlib.crc32(arr.data) != info.CRC:
        raise RuntimeError(f"{where}: corrupted zip checkpoint: CRC-32 of {info.filename} "
                           "does not match")
    return arr


def load_zip(buf: Any, where: str, weights_only: bool, place: Callable,
             check_crc: bool = True) -> Any:
    """Read a ``torch.save`` zip checkpoint held in ``buf`` (bytes-like, writable)."""
    try:
        zf = zipfile.ZipFile(BufferFile(buf))
        infos = {i.filename: i for i in zf.infolist()}
    except (zipfile.BadZipFile, OSError, ValueError, struct.error, EOFError,
            NotImplementedError, UnicodeDecodeError) as e:
        raise RuntimeError(f"{where}: truncated or corrupted zip checkpoint ({e})") from None
    pkl = [n for n in infos if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pkl) != 1:
        if any(n.endswith("/constants.pkl") for n in infos):
            raise RuntimeError(f"{where}: this is a TorchScript archive (torch.jit.save), not "
                               "a checkpoint; tessera reads torch.save files")
        raise RuntimeError(f"{where}: not a PyTorch checkpoint: the zip archive has no "
                           "<archive>/data.pkl record")
    prefix = pkl[0][:-len("data.pkl")]

    def record(name: str) -> np.ndarray:
        info = infos.get(prefix + name)
        if info is None:
            raise RuntimeError(f"{where}: corrupted zip checkpoint: record {name} is missing")
        try:
            return _member_data(zf, info, buf, where, check_crc)
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as e:
            raise RuntimeError(f"{where}: corrupted zip checkpoint ({e})") from None

    swap = False
    if prefix + "byteorder" in infos:
        order = bytes(record("byteorder"))
        if order not in (b"little", b"big"):
            raise ValueError(f"Unknown endianness type: {order.decode('latin1')}")
        swap = order.decode() != sys.byteorder
    storages: dict[str, Storage] = {}

    def persistent(pid: Any) -> Storage:
        stype, key, location, numel, _ = _storage_pid(pid, legacy=False)
        if key not in storages:
            nbytes = numel * _item_size(stype)
            data = record(f"data/{key}")
            if data.shape[0] < nbytes:
                raise RuntimeError(f"{where}: corrupted zip checkpoint: storage {key} holds "
                                   f"{data.shape[0]} bytes, {nbytes} expected")
            data = data[:nbytes]
            if swap and stype.dtype is not None and stype.dtype.itemsize > 1:
                data = data.view(np.dtype(stype.dtype.np)).byteswap().view(np.uint8)
            storages[key] = Storage(data, stype.dtype, location)
        return storages[key]

    with _placing(place):
        return _unpickle(record("data.pkl"), persistent, weights_only, where)


class _placing:
    def __init__(self, place: Callable) -> None:
        self.place = place

    def __enter__(self) -> None:
        self.saved = _ctx.place
        _ctx.place = self.place

    def __exit__(self, *exc: Any) -> None:
        _ctx.place = self.saved


def _small_pickle(file: BufferFile, where: str) -> Any:
    try:
        return U.RestrictedUnpickler(file, None).load()
    except (pickle.UnpicklingError, EOFError) as e:
        raise RuntimeError(f"{where}: truncated or corrupted legacy PyTorch checkpoint "
                           f"({e})") from None


def load_legacy(buf: Any, where: str, weights_only: bool, place: Callable) -> Any:
    """Read the pre-1.6 format of ``torch.save(..., _use_new_zipfile_serialization=False)``:
    pickles of the magic number, protocol version and system info, the object, the sorted
    storage keys, then each storage as an int64 element count and its bytes."""
    file = BufferFile(buf)
    if _small_pickle(file, where) != MAGIC_NUMBER:
        raise RuntimeError("Invalid magic number; corrupt file?")
    version = _small_pickle(file, where)
    if version != PROTOCOL_VERSION:
        raise RuntimeError(f"Invalid protocol version: {version}")
    info = _small_pickle(file, where)
    little = not isinstance(info, dict) or info.get("little_endian", True) is not False
    storages: dict[str, Storage] = {}
    views: list[tuple[str, str, int, int]] = []
    total = len(buf)

    def persistent(pid: Any) -> Storage:
        stype, key, location, numel, view = _storage_pid(pid, legacy=True)
        if key not in storages:
            nbytes = numel * _item_size(stype)
            if nbytes > total:
                raise RuntimeError(f"{where}: corrupted legacy checkpoint: storage {key} "
                                   f"claims {nbytes} bytes in a file of {total}")
            storages[key] = Storage(np.zeros(nbytes, np.uint8), stype.dtype, location)
        if view is None:
            return storages[key]
        if not (isinstance(view, tuple) and len(view) == 3 and type(view[0]) is str
                and type(view[1]) is int and type(view[2]) is int):
            raise RuntimeError(f"{where}: corrupted legacy checkpoint: bad view {view!r}")
        vkey, off, n = view
        root = storages[key]
        item = _item_size(stype)
        if vkey not in storages:
            if off < 0 or n < 0 or (off + n) * item > root.data.shape[0]:
                raise RuntimeError(f"{where}: corrupted legacy checkpoint: storage view "
                                   "out of range")
            storages[vkey] = Storage(root.data[off * item:(off + n) * item], root.dtype,
                                     location)
            storages[vkey].version = root.version
            views.append((vkey, key, off, n))
        return storages[vkey]

    with _placing(place):
        result = _unpickle(None, persistent, weights_only, where, file=file)
    keys = _small_pickle(file, where)
    if not isinstance(keys, list):
        raise RuntimeError(f"{where}: corrupted legacy checkpoint: bad storage key list")
    pos = file.tell()
    for key in keys:
        st = storages.get(key) if type(key) is str else None
        if st is None:
            raise RuntimeError(f"{where}: corrupted legacy checkpoint: unknown storage "
                               f"{key!r}")
        item = 1 if st.dtype is None else st.dtype.itemsize
        if pos + 8 > total:
            raise RuntimeError(f"{where}: truncated legacy PyTorch checkpoint")
        (numel,) = struct.unpack("<q", bytes(memoryview(buf)[pos:pos + 8]))
        nbytes = numel * item
        if numel < 0 or nbytes != st.data.shape[0] or pos + 8 + nbytes > total:
            raise RuntimeError(f"{where}: truncated or corrupted legacy PyTorch checkpoint: "
                               f"storage {key} size mismatch")
        src = np.frombuffer(buf, np.uint8, count=nbytes, offset=pos + 8)
        if not little and item > 1 and st.dtype is not None:
            src = src.view(np.dtype(st.dtype.np)).byteswap().view(np.uint8)
        st.data[:] = src
        pos += 8 + nbytes
    return result


# ==== writing =============================================================================

class _Global:
    """A PyTorch global named in the pickle (PyTorch need not be importable to write it)."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def __call__(self, *args: Any) -> Any:  # pickle wants a callable; torch.load calls it
        raise TypeError(f"{self.module}.{self.name} is only a name in a PyTorch file")


_G = {name: _Global(*name.rsplit(".", 1)) for name in [
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_meta_tensor_no_storage", "torch.Size", "torch.device",
    *(f"torch.{n}" for n in _STORAGE_DTYPE)]}


class _StorageRef:
    __slots__ = ("key", "dtype", "numel")

    def __init__(self, key: str, dtype: D.dtype, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel


_PyPickler: Any = getattr(pickle, "_Pickler")  # pickle.py's, whose save_global can be replaced


class _TorchPickler(_PyPickler):
    """Pickles tessera objects under the names ``torch.load`` knows."""

    def __init__(self, file: IO[bytes]) -> None:
        super().__init__(file, protocol=2)
        self.storages: dict[int, tuple[_StorageRef, np.ndarray]] = {}
        self._refs: dict[int, _StorageRef] = {}
        self._keep: list = []

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is _StorageRef:
            return ("storage", _G[f"torch.{_STORAGE_OF[obj.dtype]}"], obj.key, "cpu",
                    obj.numel)
        return None

    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)
        if t is _Global or isinstance(obj, D.dtype):
            return "global"  # save_global below writes the name
        if isinstance(obj, Tensor):
            return self._reduce_tensor(obj)
        if t is Size:
            return (_G["torch.Size"], (tuple(obj),))
        if t is Device:
            return (_G["torch.device"], (str(obj),))
        return NotImplemented

    def save_global(self, obj: Any, name: str | None = None) -> None:
        if type(obj) is _Global:
            module, name = obj.module, obj.name
        elif isinstance(obj, D.dtype):
            module, name = "torch", obj.name
        else:
            super().save_global(obj, name)
            return
        self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode())
        self.memoize(obj)

    def _reduce_tensor(self, t: Tensor) -> tuple:
        from tessera.nn.parameter import Parameter
        hooks = collections.OrderedDict()  # type: ignore[var-annotated]
        if isinstance(t, Parameter):
            plain = t.detach()
            self._keep.append(plain)
            return (_G["torch._utils._rebuild_parameter"], (plain, t.requires_grad, hooks))
        if t.is_global:
            raise TypeError("format='torch' saves local tensors; gather a global tensor "
                            "with to_local() or to_global(sbp=broadcast) first")
        if t._data is None:
            return (_G["torch._utils._rebuild_meta_tensor_no_storage"],
                    (t.dtype, tuple(t.shape), tuple(t.stride()), t.requires_grad))
        ref, offset, stride = self._storage(t.detach()._to_numpy(), t.dtype)
        return (_G["torch._utils._rebuild_tensor_v2"],
                (ref, offset, tuple(t.shape), stride, bool(t.requires_grad), hooks))

    def _storage(self, a: np.ndarray, dt: D.dtype) -> tuple[_StorageRef, int, tuple]:
        """The storage a tensor views (shared with the other tensors on the same memory when
        PyTorch can describe the view), its offset and strides in elements."""
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        item = a.itemsize
        ptr, rptr = a.__array_interface__["data"][0], root.__array_interface__["data"][0]
        shareable = (root.dtype == a.dtype and root.flags.c_contiguous and a.size > 0
                     and all(s >= 0 and s % item == 0 for s in a.strides)
                     and (ptr - rptr) % item == 0)
        if not shareable:
            root = np.ascontiguousarray(a)
            self._keep.append(root)
            ptr = rptr = root.__array_interface__["data"][0]
        ref = self._refs.get(id(root))
        if ref is None:
            ref = _StorageRef(str(len(self._refs)), dt, root.size)
            self._refs[id(root)] = ref
            self.storages[id(root)] = (ref, root)
            self._keep.append(root)
        strides = tuple(s // item for s in (a.strides if shareable else root.strides))
        if not shareable and a.size == 0:
            strides = tuple(_contiguous(a.shape))
        return ref, (ptr - rptr) // item, strides


def _contiguous(shape: tuple) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return out[::-1]


def _aligned_info(zf: zipfile.ZipFile, name: str, size: int) -> tuple[zipfile.ZipInfo, bool]:
    """A record whose data starts on a 64-byte boundary (PyTorch maps storages in place),
    padded with an extra field in the local header as PyTorch's writer does."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.file_size = size
    zip64 = size * 1.05 > zipfile.ZIP64_LIMIT
    start = zf.start_dir + 30 + len(name.encode("utf-8")) + 4 + (20 if zip64 else 0)
    pad = -start % _ALIGN
    info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
    return info, zip64


def _write_record(zf: zipfile.ZipFile, name: str, data: Any) -> None:
    view = memoryview(data).cast("B")
    info, zip64 = _aligned_info(zf, name, len(view))
    with zf.open(info, "w", force_zip64=zip64) as out:
        for start in range(0, len(view), 1 << 24):
            out.write(view[start:start + (1 << 24)])


def archive_name(path: str | None) -> str:
    stem = os.path.splitext(os.path.basename(path))[0] if path else ""
    ok = stem and all(c.isalnum() or c in "_-." for c in stem)
    return stem if ok else "archive"


def save_zip(obj: Any, fh: IO[bytes], archive: str = "archive") -> None:
    """Write ``obj`` to ``fh`` as ``torch.save`` does (zip format, pickle protocol 2)."""
    buf = io.BytesIO()
    pickler = _TorchPickler(buf)
    pickler.dump(obj)
    with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED) as zf:
        _write_record(zf, f"{archive}/data.pkl", buf.getvalue())
        _write_record(zf, f"{archive}/.format_version", b"1")
        _write_record(zf, f"{archive}/.storage_alignment", str(_ALIGN).encode())
        _write_record(zf, f"{archive}/byteorder", sys.byteorder.encode())
        for ref, root in sorted(pickler.storages.values(), key=lambda r: int(r[0].key)):
            _write_record(zf, f"{archive}/data/{ref.key}", root.reshape(-1).view(np.uint8))
        _write_record(zf, f"{archive}/version", b"3\n")
        serial = "".join(random.choice("0123456789") for _ in range(40))
        _write_record(zf, f"{archive}/.data/serialization_id", serial.encode())
