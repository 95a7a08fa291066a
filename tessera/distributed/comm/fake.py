"""A simulated world: N ranks as cooperative threads in one process, for unit tests.

``FakeWorld(n).run(fn, *args)`` runs ``fn`` once per rank, each in its own thread with its
own ``FakeCommunicator``, and returns the per-rank results. Only one rank runs at a time;
the baton passes at a collective that is still waiting for peers, so runs are deterministic
and the process-wide grad mode is saved and restored per rank at every switch. When every
unfinished rank waits, the run reports the deadlock (naming what each rank waits on)
instead of hanging; when a rank raises, the others are aborted at their next collective and
``run`` re-raises the first error, as ``mpiexec python -m mpi4py`` ends a job.

>>> import numpy as np
>>> from tessera.distributed.comm.fake import FakeWorld
>>> from tessera.distributed.comm import current
>>> FakeWorld(2).run(lambda: current().all_reduce(np.array([current().rank + 1.0])).tolist())
[[3.0], [3.0]]
"""
from __future__ import annotations

import collections
import copy
import threading

import numpy as np

from tessera.autograd.grad_mode import STATE
from tessera.distributed import comm as C

__all__ = ["FakeWorld", "FakeCommunicator", "run"]


class _Aborted(C.CommError):
    pass


class FakeWorld:
    """``world_size`` simulated ranks; ``run(fn, *args, **kwargs)`` returns fn's results."""

    def __init__(self, world_size: int):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"FakeWorld: world_size must be a positive int, got {world_size!r}")
        self.world_size = world_size

    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> list:
        sched = _Scheduler(self.world_size)
        results: list = [None] * self.world_size
        threads = [threading.Thread(target=sched.body, args=(r, fn, args, kwargs, results),
                                    name=f"fake-rank-{r}", daemon=True)
                   for r in range(self.world_size)]
        saved = (STATE.enabled, STATE.inference)
        gen = _generator()
        sched.initial = saved + (gen,)
        try:
            for t in threads:
                t.start()
            limit = C.timeout() if timeout is None else timeout
            for t in threads:
                t.join(limit)
                if t.is_alive():
                    raise C.CommTimeout(f"FakeWorld.run: rank {t.name[10:]} did not finish "
                                        f"within {limit:g} s")
        finally:
            STATE.enabled, STATE.inference = saved
            _set_generator(gen)
        if sched.errors:
            rank, err = sched.errors[0]
            if hasattr(err, "add_note"):
                err.add_note(f"(raised on rank {rank} of a FakeWorld of {self.world_size})")
            raise err
        return results


def run(world_size: int, fn, *args, **kwargs) -> list:
    """``FakeWorld(world_size).run(fn, *args, **kwargs)``."""
    return FakeWorld(world_size).run(fn, *args, **kwargs)


def _generator() -> tuple:
    """The default random generator's stream: each simulated rank has its own, as each
    process would (a rank's draws do not move another's)."""
    from tessera.ops.random import default_generator as g
    return g._seed, g._np


def _set_generator(state: tuple) -> None:
    from tessera.ops.random import default_generator as g
    g._seed, g._np = state


class _Op:
    __slots__ = ("kind", "values", "result", "size")
    kind: str
    values: dict       # rank -> its contribution
    result: list | None  # every contribution in group order, once all have come
    size: int

    def __init__(self, kind: str, size: int):
        self.kind, self.values, self.result, self.size = kind, {}, None, size


class _Scheduler:
    """The baton: ``turn`` is the rank allowed to run; the others wait on ``cv``."""

    def __init__(self, n: int):
        self.n = n
        self.cv = threading.Condition()
        self.turn: int | None = 0
        self.status = ["ready"] * n     # ready | blocked | done
        self.waiting = [""] * n         # what a blocked rank waits on (for deadlock reports)
        self.state: list = [None] * n   # each rank's (grad enabled, inference, generator)
        self.initial: tuple = (True, False, None)  # while switched out
        self.failure: str | None = None
        self.errors: list = []
        self.seq: dict = collections.Counter()
        self.pending: dict = {}
        self.mail: dict = collections.defaultdict(collections.deque)

    # ---- running and switching ------------------------------------------------------------
    def body(self, rank, fn, args, kwargs, results) -> None:
        C._thread.comm = FakeCommunicator(self, rank)
        try:
            with self.cv:
                self._wait_turn(rank)
                STATE.enabled, STATE.inference, gen = self.initial
                _set_generator((gen[0], copy.deepcopy(gen[1])))
            results[rank] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001  (reported by run)
            with self.cv:
                if not isinstance(e, _Aborted):
                    self.errors.append((rank, e))
                    if self.failure is None:
                        self.failure = f"rank {rank} raised {type(e).__name__}: {e}"
                elif not self.errors:
                    self.errors.append((rank, e))
        finally:
            with self.cv:
                self.status[rank] = "done"
                self._switch(rank)
            C._thread.comm = None

    def _wait_turn(self, rank: int) -> None:
        limit = C.timeout()
        if not self.cv.wait_for(lambda: self.turn == rank, limit):
            raise C.CommTimeout(f"rank {rank} waited {limit:g} s (TESSERA_COMM_TIMEOUT) for "
                                "the running rank to reach a collective")

    def _switch(self, rank: int) -> None:
        """Give the baton to the next ready rank; return when it is ``rank``'s turn again
        (or at once when ``rank`` is done). Called with ``cv`` held."""
        if self.status[rank] != "done":
            self.state[rank] = (STATE.enabled, STATE.inference, _generator())
        nxt = None
        for k in range(1, self.n + 1):
            r = (rank + k) % self.n
            if self.status[r] == "ready" or (r == rank and self.status[r] == "ready"):
                nxt = r
                break
        if nxt is None and any(s == "blocked" for s in self.status):
            waits = "; ".join(f"rank {r} waits in {self.waiting[r]}" if s == "blocked"
                              else f"rank {r} has finished" for r, s in enumerate(self.status))
            if self.failure is None:
                self.failure = f"collective deadlock: {waits}"
            for r, s in enumerate(self.status):
                if s == "blocked":
                    self.status[r] = "ready"
            nxt = next(r for r, s in enumerate(self.status) if s == "ready")
        self.turn = nxt
        self.cv.notify_all()
        if self.status[rank] == "done":
            return
        self._wait_turn(rank)
        STATE.enabled, STATE.inference, gen = self.state[rank]
        _set_generator(gen)

    def _check_failure(self) -> None:
        if self.failure is not None:
            raise _Aborted(f"aborted: {self.failure}")

    def _block(self, rank: int, what: str, done) -> None:
        while not done():
            self._check_failure()
            self.status[rank] = "blocked"
            self.waiting[rank] = what
            self._switch(rank)
        self._check_failure()

    # ---- the two primitives every fake collective is made of -----------------------------
    def exchange(self, rank: int, kind: str, group: tuple, value) -> list:
        """Every member of ``group`` contributes ``value``; each gets the list, in group
        order. The k-th collective a rank calls on a group matches the others' k-th."""
        with self.cv:
            self._check_failure()
            key = (group, self.seq[(rank, group)])
            self.seq[(rank, group)] += 1
            op = self.pending.get(key)
            if op is None:
                op = self.pending[key] = _Op(kind, len(group))
            elif op.kind != kind:
                who = next(iter(op.values))
                self.failure = (f"collective mismatch on ranks {list(group)}: rank {who} "
                                f"called {op.kind}, rank {rank} called {kind}")
                self._check_failure()
            op.values[rank] = value
            if len(op.values) == op.size:
                op.result = [op.values[r] for r in group]
                del self.pending[key]
                for r in group:
                    if r != rank and self.status[r] == "blocked":
                        self.status[r] = "ready"
            else:
                self._block(rank, f"{kind} on ranks {list(group)} (call #{key[1]})",
                            lambda: op.result is not None)
            assert op.result is not None  # _block returned: every member contributed
            return op.result

    def send(self, rank: int, dst: int, tag: int, value) -> None:
        with self.cv:
            self._check_failure()
            self.mail[(rank, dst, tag)].append(value)
            if self.status[dst] == "blocked":
                self.status[dst] = "ready"

    def recv(self, rank: int, src: int, tag: int):
        with self.cv:
            box = self.mail[(src, rank, tag)]
            self._block(rank, f"recv from rank {src} (tag {tag})", lambda: bool(box))
            return box.popleft()


class FakeCommunicator(C.Communicator):
    """One rank of a ``FakeWorld``; arrays are copied between ranks, never shared."""

    name = "fake"

    def __init__(self, sched: _Scheduler, rank: int):
        self._s = sched
        self.rank = rank
        self.world_size = sched.n
        self.local_rank = rank

    def _x(self, kind, group, value):
        return self._s.exchange(self.rank, kind, self._group(group), value)

    def all_reduce(self, x, group=None, op="sum"):
        return C.reduce_arrays(self._x(f"all_reduce({op})", group, np.array(x, copy=True)), op)

    def all_gather(self, x, group=None, shapes=None):
        return [np.array(v, copy=True) for v in self._x("all_gather", group, np.array(x))]

    def reduce_scatter(self, chunks, group=None, op="sum"):
        g = self._group(group)
        if len(chunks) != len(g):
            raise C.CommError(f"reduce_scatter: {len(chunks)} chunks for a group of {len(g)}")
        everyone = self._x(f"reduce_scatter({op})", group, [np.array(c) for c in chunks])
        i = g.index(self.rank)
        return C.reduce_arrays([v[i] for v in everyone], op)

    def all_to_all(self, chunks, group=None, recv_shapes=None):
        g = self._group(group)
        if len(chunks) != len(g):
            raise C.CommError(f"all_to_all: {len(chunks)} chunks for a group of {len(g)}")
        everyone = self._x("all_to_all", group, [np.array(c) for c in chunks])
        i = g.index(self.rank)
        return [np.array(v[i], copy=True) for v in everyone]

    def broadcast(self, x, root, group=None):
        g = self._group(group)
        if root not in g:
            raise C.CommError(f"broadcast: root {root} is not in group {list(g)}")
        values = self._x(f"broadcast(root={root})", group, np.array(x) if self.rank == root
                         else None)
        return np.array(values[g.index(root)], copy=True)

    def send(self, x, dst, tag=0):
        if not 0 <= dst < self.world_size or dst == self.rank:
            raise C.CommError(f"send: bad destination rank {dst} from rank {self.rank}")
        self._s.send(self.rank, dst, tag, np.array(x, copy=True))

    def recv(self, shape, dtype, src, tag=0):
        if not 0 <= src < self.world_size or src == self.rank:
            raise C.CommError(f"recv: bad source rank {src} on rank {self.rank}")
        out = self._s.recv(self.rank, src, tag)
        if tuple(out.shape) != tuple(shape):
            raise C.CommError(f"recv: rank {src} sent shape {list(out.shape)}, rank "
                              f"{self.rank} expected {list(shape)}")
        return out.astype(dtype, copy=False)

    def barrier(self, group=None):
        self._x("barrier", group, None)

    def all_gather_object(self, obj, group=None):
        return self._x("all_gather_object", group, obj)

    def abort(self, message, code=1):
        raise _Aborted(message)
