"""Communicators: the collectives global tensors and the process API are built on.

``Communicator`` is a small interface over NumPy arrays, with three implementations:

* ``SelfCommunicator`` -- a world of one process (no MPI needed; every collective is local);
* ``MPICommunicator`` (``comm/mpi.py``) -- mpi4py, imported only when a process actually
  runs under ``mpiexec`` or calls ``init_process_group``;
* ``FakeWorld`` (``comm/fake.py``) -- N simulated ranks as cooperative threads in one
  process, for unit tests: deterministic, and a deadlock is reported instead of hanging.

Every collective takes ``group``: the world ranks taking part, in order (None: the whole
world). A collective that does not complete within ``TESSERA_COMM_TIMEOUT`` seconds
(default 1800) raises ``CommTimeout``, so a dead or diverging peer never hangs a job forever;
under MPI, one whose peer has left the job (its script ended or exited, or its process died)
raises ``CommError`` naming that rank at once (``comm/mpi.py``).

>>> from tessera.distributed.comm import current
>>> c = current()
>>> c.world_size, c.all_reduce(np.ones(2)).tolist()
(1, [1.0, 1.0])
"""
from __future__ import annotations

import os
import threading

import numpy as np

__all__ = ["Communicator", "SelfCommunicator", "CommError", "CommTimeout", "Work", "current",
           "timeout", "REDUCE_OPS", "reduce_arrays", "launched_by_mpi", "set_process_comm"]

REDUCE_OPS = ("sum", "prod", "max", "min", "avg")


class CommError(RuntimeError):
    """A collective failed: mismatched calls across ranks, a peer that raised, bad input."""


class CommTimeout(CommError):
    """A collective did not complete within ``TESSERA_COMM_TIMEOUT`` seconds."""


def timeout() -> float:
    """Seconds a collective may wait for its peers (``TESSERA_COMM_TIMEOUT``, default 1800)."""
    text = os.environ.get("TESSERA_COMM_TIMEOUT", "")
    try:
        value = float(text) if text else 1800.0
    except ValueError:
        raise ValueError(f"TESSERA_COMM_TIMEOUT must be a number of seconds, got {text!r}") \
            from None
    return value if value > 0 else 1800.0


def reduce_arrays(arrays: list[np.ndarray], op: str) -> np.ndarray:
    """The elementwise reduction ``op`` of equally shaped arrays (the reference semantics)."""
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r} (expected one of {', '.join(REDUCE_OPS)})")
    dt = arrays[0].dtype
    fn: np.ufunc
    if dt == np.bool_:
        fn = np.logical_and if op in ("prod", "min") else np.logical_or
    else:
        fn = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum,
              "min": np.minimum}[op]
    out = np.array(arrays[0], copy=True)
    for a in arrays[1:]:
        out = fn(out, a).astype(dt, copy=False)
    if op == "avg":
        out = (out / len(arrays)).astype(dt, copy=False)
    return out


class Work:
    """A started collective: ``wait()`` returns its result (``is_completed()`` polls)."""

    def __init__(self, result=None, wait=None, test=None):
        self._result, self._wait, self._test = result, wait, test

    def wait(self, timeout=None):
        if self._wait is not None:
            self._result, self._wait = self._wait(), None
        return self._result

    def is_completed(self) -> bool:
        return self._wait is None or (self._test is not None and self._test())


class Communicator:
    """The collectives, on NumPy arrays, over a ``group`` of world ranks (None: all).

    ``shapes``/``recv_shapes`` give the shape of each group member's array where they may
    differ (uneven splits); every rank knows them from the logical shape and the SBP.
    """

    name = "abstract"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    def _group(self, group) -> tuple[int, ...]:
        g = tuple(range(self.world_size)) if group is None else tuple(int(r) for r in group)
        if self.rank not in g:
            raise CommError(f"rank {self.rank} called a collective on group {list(g)}, which "
                            "does not contain it")
        if any(not 0 <= r < self.world_size for r in g):
            raise CommError(f"group {list(g)} names ranks outside the world of "
                            f"{self.world_size} process(es)")
        return g

    def all_reduce(self, x: np.ndarray, group=None, op: str = "sum") -> np.ndarray:
        raise NotImplementedError

    def iall_reduce(self, x: np.ndarray, group=None, op: str = "sum") -> Work:
        """Start an all-reduce; the default runs it at once."""
        return Work(self.all_reduce(x, group, op))

    def iall_reduce_(self, buf: np.ndarray, group=None, op: str = "sum") -> Work:
        """Start an all-reduce of ``buf`` in place (``buf``: a writable C-contiguous array,
        untouched by the caller until ``wait()``, which returns it). Gradient buckets use it:
        no copy in, no result array out (MPI reduces a 7 MB buffer in place in less than
        half the time it takes out of place). The default runs ``iall_reduce`` and copies."""
        work = self.iall_reduce(buf, group, op)

        def wait():
            np.copyto(buf, work.wait(), casting="unsafe")
            return buf
        return Work(wait=wait, test=work.is_completed)

    def reduce_buffer(self, count: int, dtype, group=None) -> np.ndarray:
        """A buffer of ``count`` elements for repeated ``iall_reduce_`` over ``group``
        (collective: every member asks for the same size, in the same order). Under MPI on
        one machine it is shared memory, which the all-reduce sums without messages
        (``comm/shm.py``); every member must then reduce its own such buffer, never a
        shared one on some ranks and a plain one on others. Here: a plain array."""
        return np.empty(count, dtype)

    def all_gather(self, x: np.ndarray, group=None, shapes=None) -> list[np.ndarray]:
        raise NotImplementedError

    def reduce_scatter_ranges_(self, buf: np.ndarray, ranges: list, group=None,
                               op: str = "sum", spread: list | None = None) -> np.ndarray:
        """A reduce-scatter in place on a reduce buffer: ``ranges[i]`` lists the
        ``(start, stop)`` element ranges of the flat ``buf`` that group member ``i`` gets;
        afterwards this rank's ranges of its ``buf`` hold the reduction of every member's
        values there (the other ranges are left unspecified). ZeRO's flat gradient bucket
        uses it: one member's share is its rows of every gradient, so many ranges.
        ``spread[i]``: those of member ``i``'s ranges whose reduction every rank gets too
        (an all-reduce of those parts within the same collective: the gradients of the
        parameters ZeRO leaves whole). Under MPI on one machine ``buf`` from
        ``reduce_buffer`` is reduced in shared memory, without messages (the reducing rank
        writes a spread range into every rank's buffer); here: the members' ranges packed
        for one ``reduce_scatter``, then the spread ones all-gathered.

        >>> buf = np.arange(5.0)  # a world of one: its ranges hold the sum of one value
        >>> SelfCommunicator().reduce_scatter_ranges_(buf, [[(0, 2), (3, 5)]]).tolist()
        [0.0, 1.0, 2.0, 3.0, 4.0]
        >>> SelfCommunicator().reduce_scatter_ranges_(buf, [[(0, 5)]], spread=[[(3, 5)]]).tolist()
        [0.0, 1.0, 2.0, 3.0, 4.0]
        """
        flat = buf.reshape(-1)
        me = self._group(group).index(self.rank)
        mine = self.reduce_scatter([_packed(flat, rs) for rs in ranges], group, op)
        _unpack(flat, ranges[me], mine)
        if spread is not None and any(spread):
            self.all_gather_ranges_(buf, spread, group)
        return buf

    def all_gather_ranges_(self, buf: np.ndarray, ranges: list, group=None) -> np.ndarray:
        """An all-gather in place on a reduce buffer: each member's ``ranges[i]`` of its
        ``buf`` hold its values; afterwards every rank's ``buf`` holds each member's
        values in that member's ranges (ZeRO's updated shards written into the flat
        parameter bucket). Shared memory under MPI on one machine; here one
        ``all_gather``.

        >>> SelfCommunicator().all_gather_ranges_(np.arange(3.0), [[(0, 3)]]).tolist()
        [0.0, 1.0, 2.0]
        """
        flat = buf.reshape(-1)
        g = self._group(group)
        me = g.index(self.rank)
        sizes = [(sum(b - a for a, b in rs),) for rs in ranges]
        parts = self.all_gather(_packed(flat, ranges[me]), group, sizes)
        for i, part in enumerate(parts):
            if i != me:
                _unpack(flat, ranges[i], part)
        return buf

    def reduce_scatter(self, chunks: list[np.ndarray], group=None, op: str = "sum"
                       ) -> np.ndarray:
        """``chunks[i]`` is this rank's contribution to group member ``i``; returns the
        reduction of everyone's chunk for this rank."""
        raise NotImplementedError

    def all_to_all(self, chunks: list[np.ndarray], group=None, recv_shapes=None
                   ) -> list[np.ndarray]:
        """``chunks[i]`` goes to group member ``i``; returns what each member sent here."""
        raise NotImplementedError

    def broadcast(self, x: np.ndarray, root: int, group=None) -> np.ndarray:
        """``root``'s array on every member (others pass an array of the same shape/dtype)."""
        raise NotImplementedError

    def send(self, x: np.ndarray, dst: int, tag: int = 0) -> None:
        raise NotImplementedError

    def recv(self, shape, dtype, src: int, tag: int = 0) -> np.ndarray:
        raise NotImplementedError

    def barrier(self, group=None) -> None:
        raise NotImplementedError

    def all_gather_object(self, obj, group=None) -> list:
        raise NotImplementedError

    def abort(self, message: str, code: int = 1) -> None:
        """End every rank of the job (a rank that raised)."""
        raise SystemExit(code)


def _packed(flat: np.ndarray, ranges) -> np.ndarray:
    """The ``ranges`` of ``flat`` one after the other, in a new array."""
    if len(ranges) == 1:
        a, b = ranges[0]
        return flat[a:b].copy()
    return np.concatenate([flat[a:b] for a, b in ranges]) if ranges else flat[:0].copy()


def _unpack(flat: np.ndarray, ranges, values: np.ndarray) -> None:
    """``values`` (the ``ranges``' elements one after the other) written into them."""
    values = values.reshape(-1)
    o = 0
    for a, b in ranges:
        flat[a:b] = values[o:o + b - a]
        o += b - a


class SelfCommunicator(Communicator):
    """The world of a single process: every collective is a copy."""

    name = "self"

    def all_reduce(self, x, group=None, op="sum"):
        self._group(group)
        return reduce_arrays([x], op)

    def all_gather(self, x, group=None, shapes=None):
        self._group(group)
        return [np.array(x, copy=True)]

    def reduce_scatter(self, chunks, group=None, op="sum"):
        self._group(group)
        return reduce_arrays([chunks[0]], op)

    def all_to_all(self, chunks, group=None, recv_shapes=None):
        self._group(group)
        return [np.array(chunks[0], copy=True)]

    def broadcast(self, x, root, group=None):
        self._group(group)
        return np.array(x, copy=True)

    def send(self, x, dst, tag=0):
        raise CommError(f"send to rank {dst}: this is a world of one process")

    def recv(self, shape, dtype, src, tag=0):
        raise CommError(f"recv from rank {src}: this is a world of one process")

    def barrier(self, group=None):
        self._group(group)

    def all_gather_object(self, obj, group=None):
        self._group(group)
        return [obj]


# ---- which communicator this code runs under ----------------------------------------------
# A FakeWorld rank (a thread) sees its own communicator; a process sees one communicator,
# made on first use: MPI when the process was started by mpiexec, else a world of one.
class _ThreadComm(threading.local):
    # a class default: reading an unset threading.local attribute raises and catches an
    # AttributeError, and every op on a global tensor asks for the communicator
    comm: Communicator | None = None


_thread = _ThreadComm()
_process: list[Communicator] = []
_explicit: list[bool] = [False]

# environment variables that MPI launchers set in every rank
_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def launched_by_mpi() -> bool:
    return any(k in os.environ for k in _MPI_ENV)


def current() -> Communicator:
    """The communicator of the calling rank."""
    c = _thread.comm
    if c is not None:
        return c
    if not _process:
        if launched_by_mpi():
            from tessera.distributed.comm.mpi import MPICommunicator
            _process.append(MPICommunicator())
        else:
            _process.append(SelfCommunicator())
    return _process[0]


def set_process_comm(comm: Communicator | None, explicit: bool = True) -> None:
    """Install (or with None, forget) the process's communicator."""
    _process.clear()
    if comm is not None:
        _process.append(comm)
    _explicit[0] = explicit and comm is not None


def is_initialized() -> bool:
    """A communicator of more than this process is set up (or ``init_process_group`` ran),
    or this process was started by an MPI launcher (its communicator starts on first use)."""
    if _thread.comm is not None or _explicit[0]:
        return True
    if _process:
        return not isinstance(_process[0], SelfCommunicator)
    return launched_by_mpi()
