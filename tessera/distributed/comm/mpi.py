"""The MPI communicator (mpi4py): what global tensors and the process API use under mpiexec.

Every collective is started non-blocking and polled until done, so that a peer that died
or took another path raises ``CommTimeout`` after ``TESSERA_COMM_TIMEOUT`` seconds instead
of hanging (blocking MPI calls cannot time out). Data moves as bytes, so any dtype goes;
reductions run in the array's dtype (float16/bfloat16 in float32, bool as or/and).
Sub-groups get their own MPI communicator, made once per group.
"""
from __future__ import annotations

import os
import pickle
import sys
import time

import numpy as np

from tessera.distributed import comm as C

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
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(0.5)  # let the launcher forward the traceback before the job is torn down
        comm.world.Abort(1)
    sys.excepthook = hook
    _HOOKED.append(hook)


_SPIN_SECONDS = 0.02  # busy polling of a collective before backing off to sleeps

class MPICommunicator(C.Communicator):
    """The world of ``MPI.COMM_WORLD`` (or ``comm``)."""

    name = "mpi"

    def __init__(self, comm=None):
        from mpi4py import MPI  # imported here only: ``import tessera`` never starts MPI
        self.MPI = MPI
        self.world = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.world.Get_rank()
        self.world_size = self.world.Get_size()
        local = os.environ.get("MPI_LOCALRANKID") or \
            os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK")
        if local is None:
            local = self.world.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
        self.local_rank = int(local)
        self._comms: dict = {tuple(range(self.world_size)): self.world}
        self._ops = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX,
                     "min": MPI.MIN}
        if self.world_size > 1:
            _abort_on_uncaught(self)

    # ---- plumbing ---------------------------------------------------------------------------
    def _comm(self, group):
        g = self._group(group)
        c = self._comms.get(g)
        if c is None:  # collective over the members of g only (MPI-3 Comm_create_group)
            c = self.world.Create_group(self.world.Get_group().Incl(list(g)))
            self._comms[g] = c
        return c, g

    def _wait(self, req, what: str) -> None:
        """Until ``req`` completes; CommTimeout after TESSERA_COMM_TIMEOUT seconds."""
        if req.Test():
            return
        limit = C.timeout()
        now = time.monotonic()
        deadline = now + limit
        # MPICH moves a non-blocking collective forward only inside Test: poll without
        # pause while the transfer is likely running (sleeping between polls stretched a
        # 7 MB all-reduce over many milliseconds), then back off, so a rank waiting for a
        # late peer does not take a core from it
        busy_until = now + _SPIN_SECONDS
        delay = 0.0
        while not req.Test():
            now = time.monotonic()
            if now > busy_until:
                time.sleep(delay)
                delay = min(delay * 2 or 1e-5, 1e-3)
            if now > deadline:
                raise C.CommTimeout(f"{what} on rank {self.rank} did not complete within "
                                    f"{limit:g} s (TESSERA_COMM_TIMEOUT): a peer died, hangs, "
                                    "or did not call the same collective")

    def _reducible(self, x: np.ndarray, op: str):
        """A contiguous copy of ``x`` that MPI can reduce with ``op``, the MPI op, and the
        function that turns the result back into ``x``'s dtype."""
        if op not in C.REDUCE_OPS:
            raise ValueError(f"unknown reduce op {op!r} (expected one of "
                             f"{', '.join(C.REDUCE_OPS)})")
        dt = x.dtype
        mop = self._ops[op]
        if dt == np.bool_:
            a = np.ascontiguousarray(x, dtype=np.uint8)
            mop = self.MPI.MIN if op in ("prod", "min") else self.MPI.MAX
            return a, mop, lambda r: r.astype(np.bool_)
        if dt.char in _NATIVE:
            a = np.array(x, order="C", copy=True)
            if op == "avg":
                return a, mop, lambda r: (r / self._n).astype(dt, copy=False)
            return a, mop, lambda r: r
        a = np.ascontiguousarray(x, dtype=np.float32)  # float16, bfloat16
        div = op == "avg"
        return a, mop, lambda r: ((r / self._n) if div else r).astype(dt)

    @staticmethod
    def _bytes(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x).reshape(-1).view(np.uint8)

    # ---- collectives --------------------------------------------------------------------------
    def all_reduce(self, x, group=None, op="sum"):
        return self.iall_reduce(x, group, op).wait()

    def iall_reduce(self, x, group=None, op="sum"):
        c, g = self._comm(group)
        a, mop, back = self._reducible(np.asarray(x), op)
        self._n = len(g)
        out = np.empty_like(a)
        req = c.Iallreduce(a, out, op=mop)

        def wait():
            self._wait(req, f"all_reduce({op}) on ranks {list(g)}")
            return back(out)
        return C.Work(wait=wait, test=req.Test)

    def all_gather(self, x, group=None, shapes=None):
        c, g = self._comm(group)
        x = np.asarray(x)
        shapes = [tuple(x.shape)] * len(g) if shapes is None else [tuple(s) for s in shapes]
        counts = [int(np.prod(s, dtype=np.int64)) * x.itemsize for s in shapes]
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64).tolist()
        recv = np.empty(sum(counts), np.uint8)
        req = c.Iallgatherv(self._bytes(x), [recv, (counts, displs), self.MPI.BYTE])
        self._wait(req, f"all_gather on ranks {list(g)}")
        return [recv[d:d + n].view(x.dtype).reshape(s).copy()
                for d, n, s in zip(displs, counts, shapes)]

    def reduce_scatter(self, chunks, group=None, op="sum"):
        c, g = self._comm(group)
        if len(chunks) != len(g):
            raise C.CommError(f"reduce_scatter: {len(chunks)} chunks for a group of {len(g)}")
        chunks = [np.asarray(k) for k in chunks]
        flat = np.concatenate([k.reshape(-1) for k in chunks])
        a, mop, back = self._reducible(flat, op)
        self._n = len(g)
        mine = chunks[g.index(self.rank)]
        out = np.empty(mine.size, a.dtype)
        req = c.Ireduce_scatter(a, out, [k.size for k in chunks], op=mop)
        self._wait(req, f"reduce_scatter({op}) on ranks {list(g)}")
        return back(out).reshape(mine.shape)

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
        self._wait(req, f"all_to_all on ranks {list(g)}")
        return [recv[d:d + n].view(dt).reshape(s).copy()
                for d, n, s in zip(rdispls, rcounts, recv_shapes)]

    def broadcast(self, x, root, group=None):
        c, g = self._comm(group)
        if root not in g:
            raise C.CommError(f"broadcast: root {root} is not in group {list(g)}")
        x = np.asarray(x)
        buf = np.array(self._bytes(x), copy=True)
        req = c.Ibcast(buf, root=g.index(root))
        self._wait(req, f"broadcast from rank {root} on ranks {list(g)}")
        return buf.view(x.dtype).reshape(x.shape)

    def send(self, x, dst, tag=0):
        req = self.world.Isend(self._bytes(np.asarray(x)).copy(), dest=dst, tag=tag)
        self._wait(req, f"send to rank {dst}")

    def recv(self, shape, dtype, src, tag=0):
        dtype = np.dtype(dtype)
        buf = np.empty(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, np.uint8)
        req = self.world.Irecv(buf, source=src, tag=tag)
        self._wait(req, f"recv from rank {src}")
        return buf.view(dtype).reshape(shape)

    def barrier(self, group=None):
        c, g = self._comm(group)
        self._wait(c.Ibarrier(), f"barrier on ranks {list(g)}")

    def all_gather_object(self, obj, group=None):
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        sizes = self.all_gather(np.array([data.size], np.int64), group)
        parts = self.all_gather(data, group, shapes=[(int(s[0]),) for s in sizes])
        return [pickle.loads(p.tobytes()) for p in parts]

    def abort(self, message, code=1):
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
        self.world.Abort(code)
