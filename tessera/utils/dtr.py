"""Dynamic Tensor Rematerialization (Kirisame et al., 2021) in eager mode: under a memory
budget, evict activations and recompute them when an op reads them again.

``enable(budget_bytes=...)`` installs a dispatch mode (``tessera._dispatch.push_mode``).
Every tensor a forward op makes while autograd records (an activation) is tracked with how
to make it again: its op, arguments and attributes, the time its kernel took, its bytes.
While the tracked tensors' resident bytes exceed the budget, the one with the smallest

    h(t) = cost(t) / (bytes(t) * staleness(t))

is evicted (its array dropped), where cost(t) adds the costs of the evicted tensors next to
it (DTR's equivalence-class approximation: evicted neighbours form one class through a
union-find, never split). A later op that reads an evicted tensor first recomputes it by an
ordinary dispatch of its op (recomputing evicted arguments first), so results never change;
autograd's saved values are such reads (a saved output is held as a ``Deferred`` while its
tensor is evicted). Views, tensors written in place (and the tensors made from them), and
random ops that draw from a generator are never evicted; tensors read outside dispatch
(``.numpy()``, ``.item()``) should be read after the ``with`` block or through an op.

>>> import tessera
>>> from tessera.utils import dtr
>>> w = tessera.randn(64, 64, requires_grad=True)
>>> budget = 8 * 64 * 4 * 3           # three of the (8, 64) activations
>>> with dtr.enable(budget_bytes=budget):
...     h = tessera.ones(8, 64)
...     for _ in range(6):
...         h = (h @ w).tanh()
...     h.sum().backward()
>>> s = dtr.stats(); s["evictions"] > 0, s["recomputations"] > 0, s["peak_bytes"] <= budget
(True, True, True)
"""
from __future__ import annotations

import contextlib
import sys
import time
import weakref

from tessera import _dispatch
from tessera._tensor import Tensor
from tessera.autograd import engine, graph as _ag
from tessera.autograd.grad_mode import STATE, no_grad
from tessera.graph.passes.cse import is_impure

__all__ = ["enable", "stats", "reset_stats"]

_STATS = {"evictions": 0, "recomputations": 0, "peak_bytes": 0, "resident_bytes": 0,
          "budget_bytes": 0, "over_budget": 0, "materialized_at_exit": 0}


def stats() -> dict:
    """Counters of the last (or current) ``enable`` block: evictions, recomputations, the
    peak and current resident bytes of tracked tensors, the budget, how many times no
    tensor could be evicted to meet it, and the tensors made again on leaving the block.

    >>> sorted(stats())[:3]
    ['budget_bytes', 'evictions', 'materialized_at_exit']
    """
    return dict(_STATS)


def reset_stats() -> None:
    for k in _STATS:
        _STATS[k] = 0


class _Record:
    """How to make one tracked tensor again, and DTR's bookkeeping for it."""

    __slots__ = ("ref", "op", "args", "attrs", "index", "cost", "nbytes", "last",
                 "pinned", "children", "cls", "resident", "view", "__weakref__")

    def __init__(self, t, op, args, attrs, index, cost):
        self.ref = weakref.ref(t)
        self.op, self.args, self.attrs, self.index = op, args, attrs, index
        self.cost = cost
        self.nbytes = t._data.nbytes
        self.last = time.perf_counter()
        self.pinned = False
        self.children: list = []       # weakrefs to the records made from this tensor
        self.cls = None                # its evicted class (union-find node), once evicted
        self.resident = True
        self.view = False


class _Class:
    """An equivalence class of evicted neighbours: its summed cost (union-find root)."""

    __slots__ = ("parent", "cost")

    def __init__(self, cost: float):
        self.parent, self.cost = self, cost

    def root(self) -> _Class:
        c = self
        while c.parent is not c:
            c.parent = c.parent.parent
            c = c.parent
        return c


class _SavedOutputs(_ag.Deferred):
    """A node's saved outputs while DTR may evict them: rebuilt from the tensors (made
    again if evicted) when backward reads them."""

    __slots__ = ("mode", "tensors", "saved")

    def __init__(self, mode, tensors, saved):
        self.mode, self.tensors, self.saved = mode, tensors, saved

    def restore(self, node) -> None:
        out = []
        for t, (data, meta, version) in zip(self.tensors, self.saved):
            if t is not None and data is not None:
                self.mode.materialize(t)
                data = t._data
            out.append((data, meta, version))
        node._saved_outputs = tuple(out)


class _DTR:
    """The dispatch mode: track, evict, recompute."""

    def __init__(self, budget: int):
        self.budget = budget
        self.records: dict = {}     # id(tensor) -> _Record (while the tensor lives)
        self.resident = 0
        self.locked: set = set()    # ids of tensors the running op reads

    # ---- the dispatch mode ---------------------------------------------------------
    def dispatch(self, op, args, attrs):
        self._prepare(args)
        modes = _dispatch._MODES
        modes.pop()
        t0 = time.perf_counter()
        try:
            out = _dispatch.dispatch(op, *args, **attrs)
        finally:
            modes.append(self)
            self.locked.clear()
        cost = time.perf_counter() - t0
        if STATE.enabled and not engine.TARGETED:   # a forward op: its outputs are tracked
            self._track(op, args, attrs, out, cost)
        self._evict()
        return out

    def dispatch_inplace(self, op, target, args, attrs):
        self._prepare((target,) + tuple(args))
        self._written(target)
        modes = _dispatch._MODES
        modes.pop()
        try:
            return _dispatch.dispatch_inplace(op, target, *args, **attrs)
        finally:
            modes.append(self)
            self.locked.clear()

    # ---- reading ---------------------------------------------------------------------
    def _lock(self, t) -> set:
        """``t`` and, when it is a tracked view, the bases it shares memory with (evicting
        a base drops its views' arrays too)."""
        ids = {id(t)}
        rec = self.records.get(id(t))
        while rec is not None and rec.view:
            base = rec.args[0]
            ids.add(id(base))
            rec = self.records.get(id(base))
        return ids

    def _prepare(self, args) -> None:
        now = time.perf_counter()
        for a in args:
            if isinstance(a, Tensor):
                self.locked |= self._lock(a)
                rec = self.records.get(id(a))
                if rec is not None:
                    if a._data is None:
                        self.materialize(a)
                    rec.last = now

    def materialize(self, t) -> None:
        """Give the evicted ``t`` its array again: recompute it (and its evicted
        arguments, innermost first) by ordinary dispatches of their ops."""
        stack = [t]
        reading = set(self.locked)   # the running op's arguments stay locked throughout
        while stack:
            x = stack[-1]
            if x._data is not None:
                stack.pop()
                continue
            rec = self.records[id(x)]
            missing = [a for a in rec.args if isinstance(a, Tensor) and a._data is None]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            # this step's arguments are locked while it runs; what it makes stays locked
            # until the step that reads it has run (so a long chain always progresses)
            step = {i for a in rec.args if isinstance(a, Tensor) for i in self._lock(a)}
            self.locked |= step
            modes = _dispatch._MODES
            modes.pop()
            try:
                with no_grad():
                    out = _dispatch.dispatch(rec.op, *rec.args, **rec.attrs)
            finally:
                modes.append(self)
            self.locked -= step - reading
            outs = out if isinstance(out, tuple) else (out,)
            x._data = outs[rec.index]._data
            rec.resident = True
            self.resident += rec.nbytes
            _STATS["recomputations"] += 1
            self.locked |= self._lock(x)
            self._evict()
        self.locked |= self._lock(t)

    # ---- tracking ------------------------------------------------------------------
    def _track(self, op, args, attrs, out, cost: float) -> None:
        view = op.aliasing == "view"
        if (op.aliasing != "none" and not view) or ("generator" in attrs) or \
                ("seed" not in attrs and is_impure(op.name, attrs)):
            return
        if view and not (args and isinstance(args[0], Tensor) and id(args[0]) in self.records):
            return   # a view of something untracked (a parameter, an input) stays as it is
        outs = out if isinstance(out, tuple) else (out,)
        tensors = [o for o in outs if isinstance(o, Tensor)]
        if not tensors or any(type(o._data).__name__ != "ndarray" for o in tensors):
            return
        share = cost / len(tensors)
        for k, o in enumerate(outs):
            if not isinstance(o, Tensor) or id(o) in self.records or \
                    (o._base is not None and not view):
                continue
            rec = _Record(o, op, args, attrs, k, share)
            if view:   # shares its base's memory: evicted and made again with the base
                rec.nbytes, rec.pinned, rec.view = 0, True, True
            rec.ref = weakref.ref(o, self._forget(id(o), rec))
            self.records[id(o)] = rec
            self.resident += rec.nbytes
            for a in args:
                parent = self.records.get(id(a)) if isinstance(a, Tensor) else None
                if parent is not None:
                    parent.children.append(weakref.ref(rec))
            node = o.grad_fn
            if node is not None and isinstance(node._saved_outputs, tuple):
                node._saved_outputs = _SavedOutputs(
                    self, [x if isinstance(x, Tensor) else None for x in outs],
                    node._saved_outputs)

    def _forget(self, key: int, rec: _Record):
        def gone(_ref) -> None:
            if self.records.get(key) is rec:
                del self.records[key]
                if rec.resident:
                    self.resident -= rec.nbytes
        return gone

    def _written(self, t) -> None:
        """An in-place write: ``t`` and what was made from it are pinned (made again
        first if evicted), since their recipes would no longer give their values."""
        rec = self.records.get(id(t))
        if rec is None:
            return
        stack = [rec]
        while stack:
            r = stack.pop()
            if r.pinned:
                continue
            x = r.ref()
            if x is not None and x._data is None:
                self.materialize(x)
            r.pinned = True
            stack.extend(c() for c in r.children if c() is not None)

    def close(self) -> None:
        """Leave: tensors still evicted that something outside DTR's records holds (the
        user, an autograd graph) are made again; the records, and the arguments they
        keep alive, are dropped."""
        internal: dict = {}
        for rec in self.records.values():
            for a in rec.args:
                if isinstance(a, Tensor):
                    internal[id(a)] = internal.get(id(a), 0) + 1
            v = rec.ref() if rec.view else None
            if v is not None and v._base is not None:   # a tracked view's hold on its base
                internal[id(v._base)] = internal.get(id(v._base), 0) + 1
            v = None
        _dispatch._MODES.append(self)
        self.budget = sys.maxsize   # what comes back now is no longer under the budget
        try:
            for key, rec in list(self.records.items()):
                t = rec.ref()
                # references: this frame's ``t``, getrefcount's argument, the records' args
                if t is not None and t._data is None and \
                        sys.getrefcount(t) > 2 + internal.get(key, 0):
                    self.materialize(t)
                    _STATS["materialized_at_exit"] += 1
                t = None
        finally:
            _dispatch._MODES.remove(self)
        refs = [r.ref for r in self.records.values() if not r.view]
        self.records.clear()   # (what only the records kept alive goes now)
        _STATS["resident_bytes"] = sum(t._data.nbytes for t in (r() for r in refs)
                                       if t is not None and t._data is not None)

    # ---- eviction ------------------------------------------------------------------
    def _note_peak(self) -> None:
        """The peak counts the resident bytes between ops (after each op's evictions)."""
        _STATS["resident_bytes"] = self.resident
        if self.resident > _STATS["peak_bytes"] and self.budget != sys.maxsize:
            _STATS["peak_bytes"] = self.resident

    def _evict(self) -> None:
        while self.resident > self.budget:
            victim = self._choose()
            if victim is None:
                _STATS["over_budget"] += 1
                break
            t, rec = victim
            t._data = None
            rec.resident = False
            self.resident -= rec.nbytes
            self._drop_views(rec)
            rec.cls = _Class(rec.cost)
            for other in self._neighbours(rec):
                if other.cls is not None:
                    a, b = rec.cls.root(), other.cls.root()
                    if a is not b:
                        b.parent = a
                        a.cost += b.cost
            _STATS["evictions"] += 1
        self._note_peak()

    def _drop_views(self, rec: _Record) -> None:
        """The views of an evicted tensor lose their arrays too (else they keep its
        memory); a read makes them again from the base."""
        stack = [c() for c in rec.children]
        while stack:
            r = stack.pop()
            if r is None or not r.view:
                continue
            v = r.ref()
            if v is not None and v._data is not None:
                v._data = None
                stack.extend(c() for c in r.children)

    def _neighbours(self, rec: _Record) -> list:
        out = [self.records.get(id(a)) for a in rec.args if isinstance(a, Tensor)]
        out += [c() for c in rec.children]
        return [r for r in out if r is not None]

    def _choose(self):
        now = time.perf_counter()
        best, best_h = None, None
        for key, rec in self.records.items():
            if rec.pinned or key in self.locked:
                continue
            t = rec.ref()
            if t is None or t._data is None:
                continue
            cost = rec.cost
            seen: set = set()
            for other in self._neighbours(rec):
                if other.cls is not None:
                    root = other.cls.root()
                    if id(root) not in seen:
                        seen.add(id(root))
                        cost += root.cost
            h = cost / (rec.nbytes * max(now - rec.last, 1e-9))
            if best_h is None or h < best_h:
                best, best_h = (t, rec), h
        return best


@contextlib.contextmanager
def enable(budget_bytes: int):
    """Run the block under DTR: the tracked activations' resident bytes are kept at most
    ``budget_bytes`` where eviction can do it (``stats()`` counts the rest).

    >>> import tessera
    >>> with enable(budget_bytes=1 << 20):
    ...     y = (tessera.ones(4, requires_grad=True) * 2).sum()
    >>> y.item()
    8.0
    """
    if not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise ValueError(f"tessera.utils.dtr.enable: budget_bytes must be a non-negative "
                         f"int, got {budget_bytes!r}")
    reset_stats()
    _STATS["budget_bytes"] = budget_bytes
    mode = _DTR(budget_bytes)
    _dispatch.push_mode(mode)
    try:
        yield mode
    finally:
        if mode in _dispatch._MODES:
            _dispatch._MODES.remove(mode)
        mode.close()
