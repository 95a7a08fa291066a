"""Output buffers that come back: a compiled graph's large outputs reuse the memory of the
previous step's output once the caller has dropped it.

A graph output cannot live in the arena (the caller keeps it while the next step runs), so
each step allocated it afresh. Above glibc's mmap threshold (at most 32 MiB) every such
array is new pages from the kernel, whose page faults and zeroing can cost as much as the
fused loop that fills them (bench kernels: chain, the graph column). Here the array handed
out is a view of a pooled buffer whose owner (``_Lease``) returns the buffer to its pool
when the last view of it dies, so a loop that drops each output before the next step reuses
one buffer; a caller that keeps every output gets fresh memory every step, as before.

>>> r = Recycler((2, 3), "float32")
>>> a = r.take()
>>> address = a.ctypes.data
>>> del a                     # the caller drops the output ...
>>> r.take().ctypes.data == address   # ... and the next step writes into the same memory
True
"""
from __future__ import annotations

import numpy as np

from tessera.graph.memory import aligned_bytes

__all__ = ["Recycler", "recycled", "MIN_BYTES"]

# below this, malloc serves the output from its heap (no page faults): nothing to recycle
MIN_BYTES = 1 << 20


class _Lease:
    """Owns one pooled buffer while arrays view it (NumPy keeps the object that exported
    ``__array_interface__`` as their base); gives it back to the pool when they are gone."""
    __slots__ = ("buf", "pool", "__array_interface__")

    def __init__(self, buf: np.ndarray, pool: list, shape: tuple, typestr: str):
        self.buf, self.pool = buf, pool
        self.__array_interface__ = {"shape": shape, "typestr": typestr, "version": 3,
                                    "data": (buf.ctypes.data, False)}

    def __del__(self):
        self.pool.append(self.buf)


class Recycler:
    """Hands out arrays of one shape and dtype, reusing a buffer whose last array has died;
    it holds at most ``keep`` idle buffers."""

    def __init__(self, shape: tuple, dtype, keep: int = 1):
        dt = np.dtype(dtype)
        self.shape, self.typestr, self.keep = tuple(shape), dt.str, keep
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * dt.itemsize
        self.pool: list = []

    def take(self) -> np.ndarray:
        """An array of the recycler's shape and dtype, with undefined contents, starting on
        a cache line (as the arena's buffers do)."""
        pool = self.pool
        buf = pool.pop() if pool else aligned_bytes(max(self.nbytes, 1))
        del pool[self.keep:]  # more came back than one step needs: let them go
        return np.asarray(_Lease(buf, pool, self.shape, self.typestr))


def recycled(a: np.ndarray) -> bool:
    """Whether ``a`` views a buffer a ``Recycler`` handed out (memory no one else owns)."""
    return type(a.base) is _Lease
