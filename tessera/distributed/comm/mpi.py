"""The MPI communicator (mpi4py): what global tensors and the process API use under mpiexec.

Every collective is started non-blocking and polled until done, so that a peer that took
another path raises ``CommTimeout`` after ``TESSERA_COMM_TIMEOUT`` seconds instead of
hanging (blocking MPI calls cannot time out), and a peer that left the job (``sys.exit``, the
end of its script, ``os._exit``, a signal) raises ``CommError`` naming it within
milliseconds (``_Peers``). Data moves as bytes, so any dtype goes;
reductions run in the array's dtype (float16/bfloat16 in float32, bool as or/and).
Sub-groups get their own MPI communicator, made once per group.
"""
from __future__ import annotations

import atexit
import os
import pickle
import socket
import sys
import time
import zlib

import numpy as np

from tessera.distributed import comm as C
from tessera.distributed.comm import shm

__all__ = ["MPICommunicator"]

_NATIVE = frozenset("bBhHiIlLqQfdgFDG")  # NumPy type codes MPI reduces natively


_HOOKED: list = []


def _abort_on_uncaught(comm) -> None:
    """An uncaught exception on one rank prints its traceback and aborts every rank (what
    ``python -m mpi4py`` does), also for scripts started as ``mpiexec python script.py``:
    the other ranks would otherwise wait for it until their collectives time out."""
    if _HOOKED:
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        # named here, with the traceback: MPI's own abort message, printed as the job is torn
        # down, can be lost on the way through the launcher
        print(f"tessera: rank {comm.world.Get_rank()} ended with an uncaught "
              f"{kind.__name__}; aborting the job", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(0.5)  # let the launcher forward the traceback before the job is torn down
        _PEERS.clear()  # the job ends here: no exit notices
        comm.world.Abort(1)
    sys.excepthook = hook
    _HOOKED.append(hook)


# all_reduce of arrays from this size on goes through shared memory on one machine (the
# same on every rank: the members of an all-reduce pass arrays of one shape)
_SHM_MIN_BYTES = 1 << 16
_SPIN_SECONDS = 0.02  # busy polling of a collective before backing off to sleeps
_DOZE_SECONDS = 1.0  # waiting this long, a rank sleeps up to 10 ms between polls, not 1 ms
_GLANCE_SECONDS = 1e-3  # how often a waiting rank asks whether its peers' processes exist
_LOOK_SECONDS = 0.05  # how often it reads their exit notices and process start times
_LAST_WORDS_SECONDS = 0.5  # how long a collective may still complete after a peer's notice


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot), or None when no such process
    runs (a zombie has exited) or ``/proc`` cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()  # the name before may hold spaces
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def _machine() -> int:
    """The local host (host name and boot), as a number: pids mean the same only on it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read()
    except OSError:
        boot = ""
    return zlib.crc32((socket.gethostname() + boot).encode())


class _Peers:
    """Which peer ranks have left the job, to tell a peer that left from one that is late.

    A rank that leaves before the others (``sys.exit``, the end of its script, ``os._exit``,
    a signal, a crash) would leave the ranks waiting for it in a collective until
    ``TESSERA_COMM_TIMEOUT``. Two signs tell them at once:

    * a rank whose interpreter exits sends every peer a notice (an exit handler; MPI's
      finalize, which follows, waits for the other ranks, so the process itself stays);
    * a peer process on the same host that no longer runs (``os._exit``, a signal, a crash
      skip exit handlers): its ``/proc/<pid>/stat`` is gone or shows another start.

    A waiting rank glances every millisecond (whether its peers' pids exist: a signal 0
    each), looks every 50 ms (one probe for notices, one read of ``/proc`` per
    peer on the same host), and only at the peers of its collective: a rank that exits after
    its last collective while another still computes alone leaves a normal job.
    """

    def __init__(self, comm: MPICommunicator):
        me = _started(os.getpid())
        mine = np.array([os.getpid(), -1 if me is None else me, _machine()], np.int64)
        table = np.empty((comm.world_size, 3), np.int64)
        comm._wait(comm.world.Iallgather(mine, table), "the start-up exchange of process ids")
        # a pid that does not show the start time its rank sent lives in another pid
        # namespace (another container): not watched
        self.procs = {r: (int(pid), int(start)) for r, (pid, start, machine) in enumerate(table)
                      if r != comm.rank and machine == mine[2] and start >= 0 and
                      _started(int(pid)) == start}
        self.rank, self.size, self.MPI = comm.rank, comm.world_size, comm.MPI
        # a communicator of its own: the notices never match another receive
        dup = comm.world.Idup()
        self.comm = dup[0]
        comm._wait(dup[1], "the start-up duplication of the world communicator")
        self.left: set[int] = set()
        _PEERS.append(self)

    def exited(self, ranks, look: bool) -> tuple[int, str] | None:
        """(rank, how it left) of the first of ``ranks`` that has left, or None. A glance
        (``look`` false) asks only whether their pids exist (a signal 0: about a
        microsecond each); a look also reads the notices and the processes' start times
        (a zombie, a pid reused)."""
        if not look:
            for r in ranks:
                proc = self.procs.get(r)
                if proc is not None:
                    try:
                        os.kill(proc[0], 0)
                    except ProcessLookupError:
                        return r, f"its process {proc[0]} ended without exit handlers"
                    except OSError:
                        pass
            return None
        # probed, not a receive kept posted: that would be pending when a script
        # finalizes MPI itself
        status = self.MPI.Status()
        while self.comm.Iprobe(source=self.MPI.ANY_SOURCE, status=status):
            box = np.zeros(1, np.int64)
            self.comm.Recv(box, source=status.Get_source())
            self.left.add(int(box[0]))
        for r in ranks:
            if r in self.left:
                return r, "its interpreter exited"
            proc = self.procs.get(r)
            if proc is not None and _started(proc[0]) != proc[1]:
                return r, f"its process {proc[0]} ended without exit handlers"
        return None

    def leave(self) -> list[int]:
        """Tell every peer this rank leaves (at interpreter exit); returns the peers on this
        machine whose processes ended without exit handlers (nor MPI's finalize)."""
        self.exited((), True)  # the notices already here
        me = np.array([self.rank], np.int64)
        sends = [self.comm.Isend(me, dest=q) for q in range(self.size) if q != self.rank]
        end = time.monotonic() + 1.0  # a small message leaves at once unless a peer is gone
        while not self.MPI.Request.Testall(sends) and time.monotonic() < end:
            time.sleep(1e-3)
        return [r for r, (pid, start) in self.procs.items()
                if r not in self.left and _started(pid) != start]


_PEERS: list[_Peers] = []


@atexit.register
def _leave() -> None:
    # Python's exit handlers run before mpi4py finalizes MPI (and before shm's windows are
    # freed, registered earlier)
    while _PEERS:
        peers = _PEERS.pop()
        if peers.MPI.Is_finalized():  # the script finalized MPI itself
            continue
        try:
            vanished = peers.leave()
        except Exception:  # an MPI error: a peer already gone, nothing left to tell
            continue
        if vanished:
            # MPI's finalize (and freeing a shared window) waits for every rank, so for
            # ever for one that ended without it once the launcher no longer ends the job
            # (launch.py): end with MPI_Abort after the other exit handlers instead
            from mpi4py.run import set_abort_status
            names = ", ".join(str(r) for r in vanished)
            sys.stderr.write(f"tessera: rank {peers.rank} cannot end the job normally: rank"
                             f"{'s' if len(vanished) > 1 else ''} {names} ended without exit "
                             "handlers (os._exit, a signal or a crash)\n")
            sys.stderr.flush()
            shm._LIVE.clear()
            set_abort_status(1)


def _joined(chunks: list) -> np.ndarray | None:
    """The one 1-d array the ``chunks`` are consecutive pieces of (ZeRO packs its
    gradients so), or None."""
    first = chunks[0]
    if not all(type(k) is np.ndarray and k.ndim == 1 and k.flags.c_contiguous and
               k.dtype == first.dtype for k in chunks):
        return None
    at = first.__array_interface__["data"][0]
    for k in chunks:
        if k.__array_interface__["data"][0] != at:
            return None
        at += k.nbytes
    base = first.base if first.base is not None else first
    if not isinstance(base, np.ndarray) or not base.flags.c_contiguous or \
            base.__array_interface__["data"][0] > first.__array_interface__["data"][0] or \
            base.nbytes < at - base.__array_interface__["data"][0]:
        return None
    start = (first.__array_interface__["data"][0] - base.__array_interface__["data"][0])
    flat = base.reshape(-1).view(np.uint8)[start:at - base.__array_interface__["data"][0]]
    return flat.view(first.dtype)


class MPICommunicator(C.Communicator):
    """The world of ``MPI.COMM_WORLD`` (or ``comm``)."""

    name = "mpi"

    def __init__(self, comm=None):
        from tessera.distributed import launch
        if comm is None and launch.bare_hydra_rank():
            # before MPI starts: this process becomes the rank's supervisor, so that a
            # rank ending without exit handlers fails the job naming it (launch.py)
            launch.supervise_bare_rank()
        from mpi4py import MPI  # imported here only: ``import tessera`` never starts MPI
        self.MPI = MPI
        self.world = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.world.Get_rank()
        self.world_size = self.world.Get_size()
        local: str | int | None = os.environ.get("MPI_LOCALRANKID") or \
            os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK")
        if local is None:
            local = self.world.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
        self.local_rank = int(local)
        self._comms: dict = {tuple(range(self.world_size)): self.world}
        self._shm: dict = {}  # group -> ShmReducer, or None where the group spans nodes
        self._ops = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX,
                     "min": MPI.MIN}
        self._peers: _Peers | None = None
        if self.world_size > 1:
            _abort_on_uncaught(self)
            self._peers = _Peers(self)

    # ---- plumbing ---------------------------------------------------------------------------
    def _comm(self, group):
        g = self._group(group)
        c = self._comms.get(g)
        if c is None:  # collective over the members of g only (MPI-3 Comm_create_group)
            c = self.world.Create_group(self.world.Get_group().Incl(list(g)))
            self._comms[g] = c
        return c, g

    def _wait(self, req, what: str, peers=None) -> None:
        """Until ``req`` completes; CommTimeout after TESSERA_COMM_TIMEOUT seconds, CommError
        as soon as one of ``peers`` (world ranks; None: all) has exited."""
        if req.Test():
            return
        limit = C.timeout()
        now = time.monotonic()
        deadline = now + limit
        # MPICH moves a non-blocking collective forward only inside Test: poll without
        # pause while the transfer is likely running (sleeping between polls stretched a
        # 7 MB all-reduce over many milliseconds), then back off, so a rank waiting for a
        # late peer does not take a core from it. Each poll yields the core first: with
        # more runnable processes than cores, the peer this rank waits for may be queued
        # behind it, and a rank spinning through its time slice kept it there (on 2 cores
        # shared with other work, tensor-parallel MLP steps took half the time yielding);
        # with a core to spare, the yield returns at once
        busy_until = look_at = now + _SPIN_SECONDS
        doze_at = now + _DOZE_SECONDS
        glance_at = now + _GLANCE_SECONDS
        delay = 0.0
        while not req.Test():
            os.sched_yield()
            now = time.monotonic()
            if now > busy_until:
                time.sleep(delay)
                # a peer that is a second late costs the others ~0.2% of a core each
                delay = min(delay * 2 or 1e-5, 1e-3 if now < doze_at else 1e-2)
                now = glance_at = time.monotonic()
            if now >= glance_at:
                # after every sleep: a vanished peer is seen within a few milliseconds,
                # before an MPI launcher that noticed it too ends this process unheard
                glance_at = now + _GLANCE_SECONDS
                look = now >= look_at
                if look:
                    look_at = now + _LOOK_SECONDS
                if self._peer_left(req, what, peers, look):
                    return
            if now > deadline:
                others = [r for r in (range(self.world_size) if peers is None else peers)
                          if r != self.rank]
                who = f"rank {others[0]}" if len(others) == 1 else \
                    f"one of ranks {', '.join(map(str, others))}"
                raise C.CommTimeout(f"{what} on rank {self.rank} did not complete within "
                                    f"{limit:g} s (TESSERA_COMM_TIMEOUT): {who} did not join "
                                    "it (it hangs, died, or called another collective)")

    def _peer_left(self, req, what: str, peers, look: bool) -> bool:
        """Raise CommError when one of ``peers`` has left the job; True when ``req``
        completed meanwhile. A peer that exits right after its last collective has sent its
        part: after its notice, ``req`` may still complete (its process waits in MPI's
        finalize); a process that ended without one is not waited for (see ``_wait``)."""
        live = self._peers
        gone = None if live is None else \
            live.exited(range(self.world_size) if peers is None else peers, look)
        if live is None or gone is None:
            return False
        rank, how = gone
        if rank in live.left:
            end = time.monotonic() + _LAST_WORDS_SECONDS
            while time.monotonic() < end:
                if req.Test():
                    return True
                time.sleep(1e-3)
        raise C.CommError(f"rank {rank} left the job before the others ({how}) while rank "
                          f"{self.rank} was waiting for it in {what}")

    def _plan(self, dt: np.dtype, op: str):
        """(the dtype MPI reduces ``dt`` in, the MPI op)."""
        if op not in C.REDUCE_OPS:
            raise ValueError(f"unknown reduce op {op!r} (expected one of "
                             f"{', '.join(C.REDUCE_OPS)})")
        if dt == np.bool_:
            return np.dtype(np.uint8), self.MPI.MIN if op in ("prod", "min") else self.MPI.MAX
        red = dt if dt.char in _NATIVE else np.dtype(np.float32)  # float16, bfloat16
        return red, self._ops[op]

    @staticmethod
    def _back(r: np.ndarray, dt: np.dtype, op: str, n: int) -> np.ndarray:
        if dt == np.bool_:
            return r.astype(np.bool_)
        return (r / n if op == "avg" else r).astype(dt, copy=False)

    def _pack(self, arrays: list, op: str):
        """``arrays`` copied (in C order) into one new contiguous buffer that MPI reduces in
        place: (buffer, MPI op, element counts)."""
        red, mop = self._plan(arrays[0].dtype, op)
        counts = [a.size for a in arrays]
        buf = np.empty(sum(counts), red)
        o = 0
        for a in arrays:
            np.copyto(buf[o:o + a.size].reshape(a.shape), a, casting="unsafe")
            o += a.size
        return buf, mop, counts

    @staticmethod
    def _bytes(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x).reshape(-1).view(np.uint8)

    # ---- collectives --------------------------------------------------------------------------
    def all_reduce(self, x, group=None, op="sum"):
        x = np.asarray(x)
        if x.nbytes >= _SHM_MIN_BYTES and x.dtype != np.bool_:
            # large arrays (global tensors' partial_sum -> broadcast boxing) through the
            # group's shared scratch buffer: one copy in and one out, and no messages
            c, g = self._comm(group)
            red = self._reducer(c, g)
            dt, _ = self._plan(x.dtype, op)
            buf = red.scratch(x.size, dt) if red is not None and \
                shm.usable(np.empty(0, dt), op) else None
            if buf is not None:
                buf = buf.reshape(x.shape)
                np.copyto(buf, x, casting="unsafe")
                red.iall_reduce_(buf, "sum" if op == "avg" else op).wait()
                return self._back(buf.copy(), x.dtype, op, len(g))
        return self.iall_reduce(x, group, op).wait()

    def iall_reduce(self, x, group=None, op="sum"):
        c, g = self._comm(group)
        x = np.asarray(x)
        a, mop, _ = self._pack([x], op)
        # in place on the copy: MPICH's out-of-place all-reduce first copies the send buffer
        # into the receive buffer and runs slower (bench distributed: mlp)
        req = c.Iallreduce(self.MPI.IN_PLACE, a, op=mop)

        def wait():
            self._wait(req, f"all_reduce({op}) on ranks {list(g)}", g)
            return self._back(a.reshape(x.shape), x.dtype, op, len(g))
        return C.Work(wait=wait, test=req.Test)

    def reduce_buffer(self, count, dtype, group=None):
        c, g = self._comm(group)
        red = self._reducer(c, g)
        buf = None if red is None or not shm.usable(np.empty(0, dtype), "sum") else \
            red.allocate(count, dtype)
        return np.empty(count, dtype) if buf is None else buf

    def _reducer(self, c, g):
        """The group's shared-memory reducer (made collectively on first use), or None
        when its ranks are on several machines or TESSERA_SHM_ALLREDUCE=0."""
        if g not in self._shm:
            off = os.environ.get("TESSERA_SHM_ALLREDUCE", "1") == "0"
            self._shm[g] = None if off or len(g) < 2 or not shm.ShmReducer.one_node(c) \
                else shm.ShmReducer(c, g, self._wait)
        return self._shm[g]

    def iall_reduce_(self, buf, group=None, op="sum"):
        red = self._shm.get(self._group(group))
        if red is not None and isinstance(buf, np.ndarray) and red.owns(buf) and \
                shm.usable(buf, op):
            return red.iall_reduce_(buf, op)
        if not (isinstance(buf, np.ndarray) and buf.flags.c_contiguous and
                buf.flags.writeable and buf.dtype.char in _NATIVE and op in self._ops):
            return super().iall_reduce_(buf, group, op)
        c, g = self._comm(group)
        req = c.Iallreduce(self.MPI.IN_PLACE, buf, op=self._ops[op])

        def wait():
            self._wait(req, f"all_reduce({op}) on ranks {list(g)}", g)
            if op == "avg":
                np.divide(buf, len(g), out=buf, casting="unsafe")
            return buf
        return C.Work(wait=wait, test=req.Test)

    def _shared(self, buf, group, op: str = "sum"):
        """The group's shared-memory reducer when ``buf`` is one of its buffers, else None."""
        red = self._shm.get(self._group(group))
        if red is not None and isinstance(buf, np.ndarray) and red.owns(buf) and \
                shm.usable(buf, op):
            return red
        return None

    def reduce_scatter_ranges_(self, buf, ranges, group=None, op="sum", spread=None):
        red = self._shared(buf, group, op)
        if red is None:
            return super().reduce_scatter_ranges_(buf, ranges, group, op, spread)
        return red.reduce_scatter_ranges_(buf, ranges, op, spread)

    def all_gather_ranges_(self, buf, ranges, group=None):
        red = self._shared(buf, group)
        if red is None:
            return super().all_gather_ranges_(buf, ranges, group)
        return red.all_gather_ranges_(buf, ranges)

    def all_gather(self, x, group=None, shapes=None):
        c, g = self._comm(group)
        x = np.asarray(x)
        shapes = [tuple(x.shape)] * len(g) if shapes is None else [tuple(s) for s in shapes]
        counts = [int(np.prod(s, dtype=np.int64)) * x.itemsize for s in shapes]
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64).tolist()
        recv = np.empty(sum(counts), np.uint8)
        req = c.Iallgatherv(self._bytes(x), [recv, (counts, displs), self.MPI.BYTE])
        self._wait(req, f"all_gather on ranks {list(g)}", g)
        # views of the fresh receive buffer: each part is its own memory, not copied again
        return [recv[d:d + n].view(x.dtype).reshape(s) for d, n, s in zip(displs, counts, shapes)]

    def reduce_scatter(self, chunks, group=None, op="sum"):
        c, g = self._comm(group)
        if len(chunks) != len(g):
            raise C.CommError(f"reduce_scatter: {len(chunks)} chunks for a group of {len(g)}")
        chunks = [np.asarray(k) for k in chunks]
        mine = chunks[g.index(self.rank)]
        a = _joined(chunks)
        if a is not None and a.dtype.char in _NATIVE and op in self._ops:
            mop, counts = self._ops[op], [k.size for k in chunks]  # already one buffer
        else:
            a, mop, counts = self._pack(chunks, op)  # one copy (was: concatenate, then copy)
        out = np.empty(mine.size, a.dtype)
        self._wait(c.Ireduce_scatter(a, out, counts, op=mop),
                   f"reduce_scatter({op}) on ranks {list(g)}", g)
        return self._back(out.reshape(mine.shape), mine.dtype, op, len(g))

    def all_to_all(self, chunks, group=None, recv_shapes=None):
        c, g = self._comm(group)
        if len(chunks) != len(g):
            raise C.CommError(f"all_to_all: {len(chunks)} chunks for a group of {len(g)}")
        chunks = [np.asarray(k) for k in chunks]
        dt = chunks[0].dtype
        recv_shapes = [k.shape for k in chunks] if recv_shapes is None else recv_shapes
        scounts = [k.nbytes for k in chunks]
        rcounts = [int(np.prod(s, dtype=np.int64)) * dt.itemsize for s in recv_shapes]
        sdispls = np.concatenate([[0], np.cumsum(scounts)[:-1]]).astype(np.int64).tolist()
        rdispls = np.concatenate([[0], np.cumsum(rcounts)[:-1]]).astype(np.int64).tolist()
        send = np.concatenate([self._bytes(k) for k in chunks]) if chunks else \
            np.empty(0, np.uint8)
        recv = np.empty(sum(rcounts), np.uint8)
        req = c.Ialltoallv([send, (scounts, sdispls), self.MPI.BYTE],
                           [recv, (rcounts, rdispls), self.MPI.BYTE])
        self._wait(req, f"all_to_all on ranks {list(g)}", g)
        return [recv[d:d + n].view(dt).reshape(s) for d, n, s in zip(rdispls, rcounts, recv_shapes)]

    def broadcast(self, x, root, group=None):
        c, g = self._comm(group)
        if root not in g:
            raise C.CommError(f"broadcast: root {root} is not in group {list(g)}")
        x = np.asarray(x)
        buf = np.array(self._bytes(x), copy=True)
        req = c.Ibcast(buf, root=g.index(root))
        self._wait(req, f"broadcast from rank {root} on ranks {list(g)}", g)
        return buf.view(x.dtype).reshape(x.shape)

    def send(self, x, dst, tag=0):
        req = self.world.Isend(self._bytes(np.asarray(x)).copy(), dest=dst, tag=tag)
        self._wait(req, f"send to rank {dst}", (dst,))

    def recv(self, shape, dtype, src, tag=0):
        dtype = np.dtype(dtype)
        buf = np.empty(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, np.uint8)
        req = self.world.Irecv(buf, source=src, tag=tag)
        self._wait(req, f"recv from rank {src}", (src,))
        return buf.view(dtype).reshape(shape)

    def barrier(self, group=None):
        c, g = self._comm(group)
        self._wait(c.Ibarrier(), f"barrier on ranks {list(g)}", g)

    def all_gather_object(self, obj, group=None):
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        sizes = self.all_gather(np.array([data.size], np.int64), group)
        parts = self.all_gather(data, group, shapes=[(int(s[0]),) for s in sizes])
        return [pickle.loads(p.tobytes()) for p in parts]

    def abort(self, message, code=1):
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
        _PEERS.clear()
        self.world.Abort(code)
