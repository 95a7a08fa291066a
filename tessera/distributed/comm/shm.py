"""All-reduce through shared memory, for ranks on one machine that reduce the same buffer
step after step (DDP's gradient buckets).

``ShmReducer.allocate`` makes a buffer in an MPI-3 shared window, which every rank of the
group can read and write. Its all-reduce sends no messages:

1. a barrier: every rank has filled its buffer;
2. rank ``r`` sums slice ``r`` (1/n of the buffer) over the ranks' buffers into its own and
   copies the sum into every other rank's buffer at the same place;
3. a barrier: every slice has been written everywhere, so each buffer holds the whole sum.

No rank reads or writes another's buffer after the second barrier, so the caller may
refill its buffer as soon as ``wait()`` returns. A blocking ``all_reduce`` of any other
large array runs the same way through a scratch buffer (``scratch``), copied in and out.
Each slice is summed by one rank and copied, so every rank ends with the same bits (as MPI
guarantees).

Why not MPI's all-reduce: MPICH moves a large buffer between ranks as a message protocol
(copies through shared cells or a single-copy read per piece, each a rendezvous of both
ranks), which costs more CPU per rank than the two barriers, the sum and the copy; under
load every rendezvous also waits for a descheduled peer, and this all-reduce has two
(bench distributed: mlp, DDP).

The windows live as long as the process's communicator; they are freed (a collective
call) at interpreter exit, before mpi4py finalizes MPI.

>>> # under mpiexec: buf = comm.reduce_buffer(n, np.float32); ...; comm.iall_reduce_(buf).wait()
"""
from __future__ import annotations

import atexit
import os

import numpy as np

from tessera.distributed import comm as C

__all__ = ["ShmReducer"]

_UFUNCS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum,
           "min": np.minimum}
_KINDS = "bBhHiIlLqQfdFD"  # dtypes the sum is exact in (no float16 rounding per step)


class ShmReducer:
    """Shared buffers of one group of ranks (all on one node) and their all-reduce."""

    def __init__(self, mpi_comm, group: tuple[int, ...], waiter):
        from mpi4py import MPI
        self.MPI = MPI
        # a communicator of its own: the barriers never interleave with other collectives
        self.comm = mpi_comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.group = group
        self._wait = waiter  # MPICommunicator._wait: polling with TESSERA_COMM_TIMEOUT
        self._windows: dict[int, tuple] = {}  # buffer address -> (window, every rank's bytes)
        self._scratch: np.ndarray | None = None  # for blocking all-reduces of other arrays
        _LIVE.append(self)

    @staticmethod
    def one_node(mpi_comm) -> bool:
        """Every rank of ``mpi_comm`` shares this process's memory node (collective)."""
        from mpi4py import MPI
        node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            local = node.Get_size() == mpi_comm.Get_size()
        finally:
            node.Free()
        return bool(mpi_comm.allreduce(int(local), op=MPI.MIN))

    def allocate(self, count: int, dtype) -> np.ndarray | None:
        """A buffer of ``count`` elements of ``dtype`` every rank can address (collective),
        or None on every rank when /dev/shm has not room for twice the window (containers
        often give it 64 MB; a window larger than what is left fails when first touched)."""
        dtype = np.dtype(dtype)
        total = max(count, 1) * dtype.itemsize * self.size
        if not self.comm.allreduce(int(_room() >= 2 * total), op=self.MPI.MIN):
            return None
        info = self.MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")  # each rank's part on its own pages
        try:
            win = self.MPI.Win.Allocate_shared(max(count, 1) * dtype.itemsize, dtype.itemsize,
                                               info, comm=self.comm)
        finally:
            info.Free()
        win.Lock_all()  # a passive epoch for the whole life: Win.Sync fences memory
        nbytes = count * dtype.itemsize
        # (mpi4py's buffer has the buffer protocol, which NumPy's stubs do not list)
        raw = [np.frombuffer(win.Shared_query(r)[0], np.uint8, nbytes)  # type: ignore[call-overload]
               for r in range(self.size)]
        self._windows[_address(raw[self.rank])] = (win, raw)
        return raw[self.rank].view(dtype)

    def scratch(self, count: int, dtype) -> np.ndarray | None:
        """A shared buffer of ``count`` elements for one all-reduce at a time (collective:
        grown, by a new window, when a larger one is asked for), or None (no room)."""
        dtype = np.dtype(dtype)
        old = self._scratch
        if old is None or old.nbytes < count * dtype.itemsize:
            if old is not None:
                win, _ = self._windows.pop(_address(old))
                win.Unlock_all()
                win.Free()
            self._scratch = old = self.allocate(count * dtype.itemsize, np.uint8)
            if old is None:
                return None
        return old[:count * dtype.itemsize].view(dtype)

    def owns(self, buf: np.ndarray) -> bool:
        """``buf`` is (the start of) one of this reducer's buffers, contiguous."""
        entry = self._windows.get(_address(buf))
        return entry is not None and buf.flags.c_contiguous and \
            buf.nbytes <= entry[1][self.rank].nbytes

    def iall_reduce_(self, buf: np.ndarray, op: str) -> C.Work:
        """Start the all-reduce of ``buf`` (one of this reducer's buffers) in place."""
        win, raw = self._windows[_address(buf)]
        views = [v[:buf.nbytes].view(buf.dtype) for v in raw]
        flat = buf.reshape(-1)
        fn = _UFUNCS[op]
        n, r = self.size, self.rank
        lo, hi = flat.size * r // n, flat.size * (r + 1) // n
        what = f"all_reduce({op}) on ranks {list(self.group)}"
        win.Sync()
        state = {"req": self.comm.Ibarrier(), "phase": 0}

        def advance(block: bool) -> bool:
            """Move on as far as possible (to the end when ``block``); True when done."""
            if state["phase"] == 0:
                if block:
                    self._wait(state["req"], what, self.group)
                elif not state["req"].Test():
                    return False
                win.Sync()
                mine = flat[lo:hi]
                for q in range(n):
                    if q != r:
                        fn(mine, views[q][lo:hi], out=mine)
                if op == "avg":
                    np.divide(mine, n, out=mine, casting="unsafe")
                for q in range(n):
                    if q != r:
                        views[q][lo:hi] = mine
                win.Sync()
                state["req"], state["phase"] = self.comm.Ibarrier(), 1
            if state["phase"] == 1:
                if block:
                    self._wait(state["req"], what, self.group)
                elif not state["req"].Test():
                    return False
                win.Sync()
                state["phase"] = 2
            return True

        def wait():
            advance(True)
            return buf
        return C.Work(wait=wait, test=lambda: advance(False))

    def reduce_scatter_ranges_(self, buf: np.ndarray, ranges: list, op: str,
                               spread: list | None = None) -> np.ndarray:
        """``Communicator.reduce_scatter_ranges_`` on one of this reducer's buffers: after a
        barrier, this rank sums its ``ranges`` over the ranks' buffers into its own (the
        all-reduce's first half, with no copy to the others but of its ``spread`` ranges,
        which it writes into every rank's buffer: the all-reduce's second half), then a
        barrier, so the caller may refill ``buf`` as soon as it returns."""
        views, flat, what = self._views(buf), buf.reshape(-1), \
            f"reduce_scatter({op}) on ranks {list(self.group)}"
        fn, r = _UFUNCS[op], self.rank
        self._fence(buf, what)
        for a, b in ranges[r]:
            mine = flat[a:b]
            for q in range(self.size):
                if q != r:
                    fn(mine, views[q][a:b], out=mine)
            if op == "avg":
                np.divide(mine, self.size, out=mine, casting="unsafe")
        for a, b in spread[r] if spread is not None else ():
            for q in range(self.size):
                if q != r:
                    views[q][a:b] = flat[a:b]
        self._fence(buf, what)
        return buf

    def all_gather_ranges_(self, buf: np.ndarray, ranges: list) -> np.ndarray:
        """``Communicator.all_gather_ranges_`` on one of this reducer's buffers: after a
        barrier, each rank copies every other rank's ranges from that rank's buffer; then a
        barrier (no rank writes its ranges again while another still reads them)."""
        views, flat = self._views(buf), buf.reshape(-1)
        what = f"all_gather on ranks {list(self.group)}"
        self._fence(buf, what)
        for q in range(self.size):
            if q != self.rank:
                for a, b in ranges[q]:
                    flat[a:b] = views[q][a:b]
        self._fence(buf, what)
        return buf

    def _views(self, buf: np.ndarray) -> list[np.ndarray]:
        """Every rank's buffer at ``buf``'s place in the window, flat."""
        raw = self._windows[_address(buf)][1]
        return [v[:buf.nbytes].view(buf.dtype) for v in raw]

    def _fence(self, buf: np.ndarray, what: str) -> None:
        """A barrier between the memory fences of ``buf``'s window: every rank's writes
        before it are seen by every rank after it."""
        win = self._windows[_address(buf)][0]
        win.Sync()
        self._wait(self.comm.Ibarrier(), what, self.group)
        win.Sync()

    def free(self) -> None:
        """Free every window and the communicator (collective)."""
        for win, _ in self._windows.values():
            win.Unlock_all()
            win.Free()
        self._windows.clear()
        self.comm.Free()


def usable(buf: np.ndarray, op: str) -> bool:
    return buf.dtype.char in _KINDS and op in _UFUNCS


def _room() -> int:
    """Bytes free in /dev/shm, where MPICH makes shared windows (unbounded elsewhere)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return 1 << 62
    return st.f_bavail * st.f_frsize


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


_LIVE: list[ShmReducer] = []


@atexit.register
def _free_all() -> None:
    # Python's atexit runs before mpi4py finalizes MPI (Py_AtExit); a window still
    # allocated then makes MPICH warn about pending references on every exit
    while _LIVE:
        _LIVE.pop().free()
