"""Tensor storage in shared memory, and the reducers that send tensors between processes as
views of the same memory (PyTorch's ``file_descriptor`` sharing strategy).

A shared storage is an anonymous file (``memfd`` on Linux, an unlinked temporary file
elsewhere) mapped ``MAP_SHARED``. A forked child inherits the mapping; a spawned child, or a
process a tensor reaches through a ``multiprocessing`` queue or pipe, receives a duplicate
of the file descriptor (``multiprocessing.reduction.DupFd``) and maps the same pages. As in
PyTorch, pickling a tensor for another process moves its storage into shared memory first.
"""
from __future__ import annotations

import ctypes
import mmap
import multiprocessing.reduction as _reduction
import os
import tempfile
import weakref

import numpy as np

from tessera._tensor import Tensor
from tessera.device import device
from tessera.nn.parameter import Buffer, Parameter

_byte_bounds = getattr(np.lib, "array_utils", np).byte_bounds


class _Segment(mmap.mmap):
    """A shared mapping that keeps its file descriptor open, so it can be sent on."""

    fd: int


def _map(fd: int, nbytes: int) -> _Segment:
    seg = _Segment(fd, nbytes)
    seg.fd = fd
    weakref.finalize(seg, os.close, fd)
    return seg


def _new_segment(nbytes: int) -> _Segment:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("tessera-shared", getattr(os, "MFD_CLOEXEC", 0))
    else:
        fd, path = tempfile.mkstemp(prefix="tessera-shared-")
        os.unlink(path)
    os.ftruncate(fd, nbytes)
    return _map(fd, nbytes)


def _segment_of(array) -> _Segment | None:
    """The shared segment ``array``'s memory belongs to, or None."""
    b = array
    while isinstance(b, np.ndarray):
        b = b.base
    if isinstance(b, memoryview):
        b = b.obj
    return b if isinstance(b, _Segment) else None


def _address(seg: _Segment) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(seg))


def _storage_owner(t: Tensor) -> Tensor:
    return t._base if t._base is not None else t


def is_shared(self: Tensor) -> bool:
    """Whether the tensor's storage is in shared memory (``share_memory_``).

    >>> import tessera
    >>> x = tessera.zeros(3)
    >>> x.is_shared(), x.share_memory_().is_shared()
    (False, True)
    """
    return self._data is not None and _segment_of(_storage_owner(self)._data) is not None


def share_memory_(self: Tensor) -> Tensor:
    """Moves the storage into shared memory (a no-op if it is there already, or the
    tensor is not on the CPU) and returns ``self``. Views of the tensor made before the
    move keep the old memory; the tensor itself and its storage owner move.

    >>> import tessera
    >>> x = tessera.arange(4.)
    >>> x.share_memory_() is x, x.is_shared(), x.tolist()
    (True, True, [0.0, 1.0, 2.0, 3.0])
    """
    if self._device.type != "cpu" or self._data is None or is_shared(self):
        return self
    owner = _storage_owner(self)
    old = owner._data
    lo, hi = _byte_bounds(old)
    seg = _new_segment(max(hi - lo, 1))
    if hi > lo:
        src = (ctypes.c_char * (hi - lo)).from_address(lo)
        np.frombuffer(seg, np.uint8, hi - lo)[:] = np.frombuffer(src, np.uint8)

    def moved(a: np.ndarray) -> np.ndarray:
        return np.ndarray(a.shape, a.dtype, buffer=seg, offset=a.ctypes.data - lo,
                          strides=a.strides)
    if self is not owner:
        self._data = moved(self._data)
    owner._data = moved(old)
    return self


def _rebuild(cls, fd_holder, nbytes: int, dtype, shape, strides, offset: int,
             requires_grad: bool) -> Tensor:
    seg = _map(fd_holder.detach(), nbytes)
    np_dtype, tess_dtype = dtype
    arr = np.ndarray(shape, np_dtype, buffer=seg, offset=offset, strides=strides)
    t = Tensor._make(arr, tess_dtype, device("cpu"), tuple(shape))
    if cls is Parameter:
        return Parameter(t, requires_grad)
    if cls is Buffer:
        return Buffer(t)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _reduce_tensor(t: Tensor):
    if t._requires_grad and t.grad_fn is not None:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since "
            "autograd does not support crossing process boundaries.  If you just want to "
            "transfer the data, call detach() on the tensor before serializing (e.g., putting "
            "it on the queue).")
    if t._device.type != "cpu" or t._data is None:
        return t.__reduce_ex__(2)
    share_memory_(t)
    seg = _segment_of(_storage_owner(t)._data)
    assert seg is not None
    arr = t._data
    return (_rebuild, (type(t), _reduction.DupFd(seg.fd), len(seg), (arr.dtype, t._dtype),
                       arr.shape, arr.strides, arr.ctypes.data - _address(seg),
                       t._requires_grad))


def init_reductions() -> None:
    """Registers the tensor reducers with ``multiprocessing``'s pickler (done on import)."""
    for cls in (Tensor, Parameter, Buffer):
        _reduction.ForkingPickler.register(cls, _reduce_tensor)
