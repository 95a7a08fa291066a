"""Checkpoints: ``tessera.save`` / ``tessera.load``.

``save`` writes tessera's own format by default: one safetensors file whose metadata
describes the saved object and carries a SHA-256 digest of the content (``_native``).
``save(obj, f, format="torch")`` writes PyTorch's zip format, which ``torch.load`` reads
(``_torch``). ``load`` tells the formats apart by their first bytes and reads tessera
checkpoints, plain ``.safetensors`` files, PyTorch zip checkpoints and PyTorch's legacy
pre-1.6 files, and plain pickles.

Loading runs no code from the file: every pickle goes through a restricted unpickler with
PyTorch's ``weights_only`` rules (``_unpickler``), and tensors are built by tessera from
checked parts (dtype, shape, strides, offset within the saved storage).
``weights_only=False`` uses the full unpickler (only for files you trust).

Saving to a path is atomic: a temporary file ``.<name>.tessera-<pid>-<random>.tmp`` in the
same folder, fsync, then rename. A save also removes temporaries left in that folder by
writers that died (their process is gone and the file has not changed for a minute).

>>> import tessera, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "ckpt.safetensors")
>>> tessera.save({"w": tessera.ones(2), "step": 3}, path)
>>> tessera.load(path)
{'w': tensor([1., 1.]), 'step': 3}
"""
from __future__ import annotations

import contextlib
import os
import pickle
import re
import struct
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from tessera._tensor import Tensor
from tessera.device import device as Device
from tessera.serialization import _native, _torch, _unpickler as U
from tessera.serialization._native import digest as _digest  # noqa: F401  (tests use it)
from tessera.serialization._unpickler import (
    add_safe_globals,
    clear_safe_globals,
    get_safe_globals,
    safe_globals,
)

__all__ = ["save", "load", "save_file", "load_file", "add_safe_globals",
           "get_safe_globals", "clear_safe_globals", "safe_globals"]

FileLike = str | os.PathLike | IO[bytes]

_CHUNK = 1 << 24  # bytes written per call, so a huge checkpoint is not one giant write
_STALE_AFTER = 60.0  # seconds a dead writer's temporary must be unchanged before removal
_TMP_RE = re.compile(r"^\..+\.tessera-(\d+)-[A-Za-z0-9_]+\.tmp$")


# ==== saving ==============================================================================

def _write_payload(fh: IO[bytes], data: bytes) -> None:
    view = memoryview(data)
    for start in range(0, len(view), _CHUNK):
        fh.write(view[start:start + _CHUNK])


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a pid we can judge: keep the file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's live process
        return True
    return True


def _remove_stale_temporaries(folder: str) -> None:
    """Remove temporaries of saves whose writer died: the pid in the name is not running
    and the file has not changed for a minute (a reused pid only keeps a file longer)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    now = time.time()
    for name in names:
        m = _TMP_RE.match(name)
        if m is None or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
            continue
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            if now - os.lstat(path).st_mtime > _STALE_AFTER:
                os.unlink(path)


def _atomic_write(path: str, write: Callable[[IO[bytes]], None]) -> None:
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    _remove_stale_temporaries(folder)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp",
                               prefix=f".{os.path.basename(path)}.tessera-{os.getpid()}-")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
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
         _use_new_zipfile_serialization: bool = True, *, format: str = "tessera") -> None:
    """Save ``obj`` (tensors, state_dicts, optimizer states, or any picklable object) to
    ``f``, a path or a binary file object. Paths are written atomically.

    ``format="tessera"`` (the default) writes tessera's checksummed safetensors file;
    ``format="torch"`` writes PyTorch's zip format, which ``torch.load(f,
    weights_only=True)`` reads (tensors, Parameters, views sharing storage, containers,
    ``Size``, dtypes). ``pickle_module`` / ``pickle_protocol`` are accepted for PyTorch
    compatibility.

    >>> import io, tessera
    >>> buf = io.BytesIO(); tessera.save(tessera.ones(2), buf, format="torch")
    >>> buf.getvalue()[:4]
    b'PK\\x03\\x04'
    """
    if format == "tessera":
        data = _native.serialize(obj)

        def write(fh: IO[bytes]) -> None:
            _write_payload(fh, data)
    elif format == "torch":
        if not _use_new_zipfile_serialization:
            raise ValueError("save(format='torch') writes PyTorch's zip format only "
                             "(_use_new_zipfile_serialization=False is not supported)")
        archive = _torch.archive_name(os.fspath(f) if isinstance(f, (str, os.PathLike))
                                      else None)

        def write(fh: IO[bytes]) -> None:
            _torch.save_zip(obj, fh, archive)
    else:
        raise ValueError(f"save: format must be 'tessera' or 'torch', got {format!r}")
    if isinstance(f, (str, os.PathLike)):
        _atomic_write(os.fspath(f), write)
    elif hasattr(f, "write"):
        write(f)
        if hasattr(f, "flush"):
            f.flush()
    else:
        raise TypeError(f"save expects a path or a writable binary file, got {type(f)}")


def save_file(tensors: dict[str, Tensor], filename: str | os.PathLike,
              metadata: dict[str, str] | None = None) -> None:
    """Write a plain safetensors file (names -> tensors, like ``safetensors.torch``), for
    tools that read safetensors directly. Written atomically.

    >>> import tessera, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "plain.safetensors")
    >>> save_file({"a": tessera.zeros(2)}, path); load_file(path)
    {'a': tensor([0., 0.])}
    """
    import safetensors.numpy

    arrays = {}
    for k, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"save_file: {k!r} is a {type(t).__name__}, not a Tensor")
        arrays[k] = _native._storage_array(t.detach().cpu()._to_numpy())
    data = safetensors.numpy.save(arrays, metadata=metadata)
    _atomic_write(os.fspath(filename), lambda fh: _write_payload(fh, data))


# ==== loading =============================================================================

def _read_all(f: FileLike, mmap: bool) -> tuple[Any, str, str | None]:
    """The file's bytes (writable, so loaded tensors can be written in place), its name,
    and its path if it has one."""
    if isinstance(f, (str, os.PathLike)):
        path = os.fspath(f)
        if mmap:
            if os.path.getsize(path) == 0:
                return bytearray(), path, path
            return np.memmap(path, np.uint8, mode="c"), path, path
        with open(path, "rb") as fh:
            buf = bytearray(os.fstat(fh.fileno()).st_size)
            n = fh.readinto(buf)
        return (buf if n == len(buf) else buf[:n]), path, path
    if mmap:
        raise ValueError("f must be a file path in order to use the mmap argument")
    if hasattr(f, "read"):
        return bytearray(f.read()), getattr(f, "name", "<file object>"), None
    raise TypeError(f"load expects a path or a readable binary file, got {type(f)}")


def _placer(map_location: Any, where: str) -> Callable[[Tensor, str], Tensor]:
    """``place(tensor, saved_location)``: where ``map_location`` puts a loaded tensor (a
    device or string, a dict from saved to wanted locations, or ``fn(tensor, location)``
    returning a tensor or None)."""
    def place(t: Tensor, saved: str) -> Tensor:
        ml = map_location
        if callable(ml) and not isinstance(ml, (str, Device)):
            moved = ml(t, saved)
            return t if moved is None else moved
        if isinstance(ml, dict):
            target = ml.get(saved, saved)
        else:
            target = saved if ml is None else ml
        if type(target).__module__.startswith("torch") and hasattr(target, "type"):
            target = str(target)  # a torch.device given by code written for PyTorch
        try:
            dev = Device(target)
            return t if dev == t.device else t.to(dev)
        except (AssertionError, RuntimeError, TypeError, ValueError) as e:
            # a device this build names but cannot hold data on (cuda) fails in the move
            raise RuntimeError(f"{where}: a tensor was saved on device '{saved}' and mapped "
                               f"to '{target}', which is not available ({e}); pass "
                               "map_location='cpu' to load it on the CPU") from None
    return place


def _looks_like_pickle(data: Any) -> bool:
    return len(data) > 2 and data[0] == 0x80 and 2 <= data[1] <= 5 and data[-1] == ord(".")


def _load_pickle(data: Any, weights_only: bool, where: str) -> Any:
    try:
        if weights_only:
            return U.RestrictedUnpickler(_torch.BufferFile(data), None).load()
        return U.FullUnpickler(_torch.BufferFile(data), None).load()
    except pickle.UnpicklingError as e:
        if not weights_only:
            raise
        raise pickle.UnpicklingError(U.weights_only_message(str(e))) from None
    except (EOFError, ValueError, struct.error) as e:
        raise _native.Corrupt(f"{where}: truncated or corrupted pickle file: {e}") from None


def load(f: FileLike, map_location: Any = None, pickle_module: Any = None, *,
         weights_only: bool | None = None, mmap: bool | None = None,
         **pickle_load_args: Any) -> Any:
    """Load a checkpoint: tessera's own, a PyTorch ``torch.save`` file (zip or legacy), a
    plain ``.safetensors`` file (a dict of tensors) or a plain pickle.

    ``map_location`` moves tensors: a device or string, a dict from saved to wanted
    locations, or ``fn(tensor, saved_location)``. With ``weights_only`` (the default,
    None meaning True) pickles may build only allowed globals (``add_safe_globals``), as
    in ``torch.load``; ``weights_only=False`` trusts the file completely. ``mmap=True``
    maps a path's tensors onto the file (copy-on-write) instead of reading it. Raises
    RuntimeError for a truncated, corrupted or unknown file.

    >>> import io, tessera
    >>> buf = io.BytesIO(); tessera.save([tessera.arange(3)], buf); _ = buf.seek(0)
    >>> tessera.load(buf)
    [tensor([0, 1, 2])]
    """
    weights_only = True if weights_only is None else bool(weights_only)
    if weights_only and pickle_module is not None:
        raise RuntimeError("Can not safely load weights when explicit pickle_module is "
                           "specified")
    data, where, path = _read_all(f, bool(mmap))
    place = _placer(map_location, where)
    head = bytes(data[:16])
    if head[:4] == b"PK\x03\x04":
        return _torch.load_zip(data, where, weights_only, place, check_crc=not mmap)
    if mmap:
        raise RuntimeError("mmap can only be used with files saved in a zip format "
                           "(tessera.save(..., format='torch') or torch.save)")
    if head.startswith(_torch.LEGACY_MAGIC[:-1]):
        return _torch.load_legacy(data, where, weights_only, place)
    if not _native.looks_like_safetensors(data):
        if _looks_like_pickle(data):  # a plain pickle stream
            return _load_pickle(data, weights_only, where)
        _native.parse_header(data, where)  # raises the precise error
        raise _native.Corrupt(f"{where}: not a checkpoint: neither tessera's format, "
                              "safetensors, a PyTorch zip or legacy file, nor a pickle")
    header, meta = _native.parse_header(data, where)
    if meta.get("format") == _native._FORMAT or any(str(k).startswith("tessera")
                                                    for k in meta):
        return _native.load_tessera(meta, data, place, weights_only, where)
    return _native.load_plain(header, data, place, where)


def load_file(filename: str | os.PathLike, device: Any = "cpu") -> dict[str, Tensor]:
    """Read a safetensors file as a dict of tensors (like ``safetensors.torch.load_file``).

    >>> import tessera, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "plain.safetensors")
    >>> save_file({"b": tessera.ones(1)}, path); load_file(path)["b"]
    tensor([1.])
    """
    data, where, _ = _read_all(filename, False)
    header, _ = _native.parse_header(data, where)
    return _native.load_plain(header, data, _placer(device, where), where)
