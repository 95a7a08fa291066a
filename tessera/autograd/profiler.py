"""The profiler's recorder, at PyTorch's ``torch.autograd.profiler`` path: ``profile``
(the context manager that records) and ``record_function`` (a named block).

While a profile records, it is a dispatch mode (``tessera._dispatch.push_mode``, the hook
tracing uses): every op call is timed and recorded as ``tessera::<op>`` (``tessera::add_``
for in-place ones). The ``tessera::`` namespace plays the part of PyTorch's ``aten::``:
tessera's op set is its own (``linear`` is ``matmul`` and ``add`` here), so borrowing ATen's
names would promise a one-to-one match that does not hold. Backward nodes are recorded as
the autograd engine runs them, under PyTorch's name
(``autograd::engine::evaluate_function: MulBackward0``), through the engine's
``BACKWARD_SCOPES`` hook; compiled ``nn.Graph`` steps record each kernel under its node's
module path (``model.fc1``; ``tessera.graph.executor`` asks ``ACTIVE`` once per step).
Nothing is checked per op while no profile records: the C fast path already steps aside for
any dispatch mode, and there is none.

>>> import tessera
>>> from tessera.autograd.profiler import profile, record_function
>>> x = tessera.ones(2, 2, requires_grad=True)
>>> with profile() as prof:
...     with record_function("forward"):
...         y = (x * x).sum()
...     y.backward()
>>> sorted({e.name for e in prof.function_events})[:3]
['autograd::engine::evaluate_function: MulBackward0', \
'autograd::engine::evaluate_function: SumBackward0', 'forward']
>>> [e.count for e in prof.key_averages() if e.key == "tessera::mul"]
[3]
"""
from __future__ import annotations

import functools
import os
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from tessera import _dispatch
from tessera._tensor import Tensor
from tessera.autograd.engine import BACKWARD_SCOPES
from tessera.autograd.profiler_util import EventList, FunctionEvent
from tessera.ops import library as _library
from tessera.ops.registry import Meta

__all__ = ["profile", "record_function", "EventList", "FunctionEvent"]

ACTIVE: _Session | None = None   # the recording session; read once per compiled graph step
_clock = time.perf_counter_ns
_native_id = threading.get_native_id
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Session:
    """One recording: the events so far, and what to record with each."""

    def __init__(self, record_shapes: bool, profile_memory: bool, with_stack: bool,
                 with_flops: bool):
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.events: list[FunctionEvent] = []
        self.base_ns = self.wall_ns = 0
        self.in_graph = False   # a compiled graph's step is running (tessera.graph.executor)

    # ---- switching on and off ----------------------------------------------------
    def start(self) -> None:
        global ACTIVE
        if ACTIVE is not None:
            raise RuntimeError("Profiler is already enabled on this thread")
        self.base_ns, self.wall_ns = _clock(), time.time_ns()
        _dispatch.push_mode(self)
        BACKWARD_SCOPES.append(self)
        ACTIVE = self

    def stop(self) -> None:
        global ACTIVE
        ACTIVE = None
        if self in BACKWARD_SCOPES:
            BACKWARD_SCOPES.remove(self)
        if self in _dispatch._MODES:  # (a mode pushed after this one may still be above it)
            _dispatch._MODES.remove(self)

    def results(self) -> EventList:
        return EventList(self.events, self.profile_memory, self.with_flops, self.base_ns,
                         self.wall_ns).build_tree()

    # ---- the dispatch mode ---------------------------------------------------------
    def dispatch(self, op, args, attrs):
        modes = _dispatch._MODES
        modes.pop()  # the op runs as without a profile (its own dispatches go unrecorded)
        t0 = _clock()
        try:
            out = _dispatch.dispatch(op, *args, **attrs)
        finally:
            modes.append(self)
        self.op(op, "tessera::" + op.name, t0, _clock(), args, attrs, out)
        return out

    def dispatch_inplace(self, op, target, args, attrs):
        modes = _dispatch._MODES
        modes.pop()
        t0 = _clock()
        try:
            out = _dispatch.dispatch_inplace(op, target, *args, **attrs)
        finally:
            modes.append(self)
        self.op(op, f"tessera::{op.name}_", t0, _clock(), args, attrs, None)
        return out

    def op(self, op, name: str, t0: int, t1: int, args, attrs, out) -> None:
        """Record one op call; shapes, bytes allocated, FLOPs and stack as asked."""
        shapes = dtypes = None
        if self.record_shapes:
            shapes = [list(a._shape) if isinstance(a, Tensor) else [] for a in args]
            dtypes = [a._dtype.name if isinstance(a, Tensor) else
                      "Scalar" if a is not None else "" for a in args]
        nbytes = _allocated(args, out) if self.profile_memory and out is not None else 0
        flops = _flops(op, args, attrs, out) if self.with_flops and out is not None else 0
        self.events.append(FunctionEvent(
            len(self.events), name, _native_id(), t0, t1, shapes, nbytes, flops,
            _stack() if self.with_stack else None, input_dtypes=dtypes))

    def block(self, name: str, t0: int, t1: int, category: str, nbytes: int = 0,
              args: dict | None = None) -> None:
        """Record a named span: a ``record_function`` block, a backward node, a kernel."""
        self.events.append(FunctionEvent(
            len(self.events), name, _native_id(), t0, t1, cpu_memory_usage=nbytes,
            category=category, args=args,
            stack=_stack() if self.with_stack and category == "user_annotation" else None))

    # ---- the autograd engine's backward-scope hook ---------------------------------
    def begin(self, node):
        return node.name(), _clock()

    def end(self, token) -> None:
        name, t0 = token
        if ACTIVE is self:
            self.block("autograd::engine::evaluate_function: " + name, t0, _clock(), "cpu_op")


def _root(a: np.ndarray) -> int:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return id(a)


def _allocated(args, out) -> int:
    """Bytes of the outputs' arrays that are new (not views of an input's memory)."""
    outs = out if isinstance(out, tuple) else (out,)
    inputs = {_root(a._data) for a in args
              if isinstance(a, Tensor) and isinstance(a._data, np.ndarray)}
    return sum(t._data.nbytes for t in outs
               if isinstance(t, Tensor) and isinstance(t._data, np.ndarray)
               and _root(t._data) not in inputs)


def _flops(op, args, attrs, out) -> int:
    """The op's ``cost`` rule's FLOPs for these inputs (0 without a rule)."""
    if op.cost is None:
        return 0
    outs = out if isinstance(out, tuple) else (out,)
    ins = [Meta(a._shape, a._dtype) if isinstance(a, Tensor) else a for a in args]
    try:
        return int(op.cost(ins, [Meta(t._shape, t._dtype) for t in outs], **attrs).flops)
    except Exception:  # a cost rule that cannot read these attrs: no figure, not a failure
        return 0


def _stack() -> list[str]:
    """The caller's frames outside tessera, innermost first, as ``file(line): function``."""
    frames = traceback.extract_stack()[:-1]
    return [f"{f.filename}({f.lineno}): {f.name}" for f in reversed(frames)
            if not os.path.abspath(f.filename).startswith(_PKG)]


class record_function:
    """A named block in the profile (PyTorch's ``record_function``): as a context manager
    or a function decorator. Outside a profile it does nothing.

    >>> import tessera
    >>> from tessera.autograd.profiler import profile
    >>> @record_function("double")
    ... def double(x):
    ...     return x * 2
    >>> with profile() as prof:
    ...     _ = double(tessera.ones(3))
    >>> [e.name for e in prof.function_events]
    ['tessera::full', 'double', 'tessera::mul']
    """

    def __init__(self, name: str, args: str | None = None):
        self.name = name
        self.args = args
        self._t0: int | None = None
        self._session: _Session | None = None

    def __enter__(self) -> record_function:
        self._session = ACTIVE
        if self._session is not None:
            self._t0 = _clock()
        return self

    def __exit__(self, *exc) -> None:
        s = self._session
        if s is not None and self._t0 is not None and ACTIVE is s:
            s.block(self.name, self._t0, _clock(), "user_annotation",
                    args=None if self.args is None else {"args": self.args})
        self._session = self._t0 = None

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*a, **kw):
            with record_function(self.name, self.args):
                return fn(*a, **kw)
        return wrapped


# torch.ops.profiler: the functional form of record_function, which code emits where a
# ``with`` block cannot go (an fx graph)
def _record_function_enter_new(name: str, args: str | None = None) -> record_function:
    handle = record_function(name, args)
    handle.__enter__()
    return handle


def _record_function_exit(handle: record_function) -> None:
    handle.__exit__(None, None, None)


for _name, _fn in (("_record_function_enter_new", _record_function_enter_new),
                   ("_record_function_enter", _record_function_enter_new),
                   ("_record_function_exit", _record_function_exit)):
    _library.define("profiler", _name, _fn)


class profile:
    """Record every op, backward node, ``record_function`` block and compiled-graph kernel
    run inside the ``with`` block (PyTorch's ``torch.autograd.profiler.profile``; most
    scripts use ``tessera.profiler.profile``, which adds schedules).

    Tessera runs on the CPU: device options (``use_cuda``, ``use_device``) are accepted
    and record nothing more. ``profile_memory`` counts the bytes of each op's new outputs.

    >>> import tessera
    >>> with profile(record_shapes=True) as prof:
    ...     _ = tessera.ones(2, 3) @ tessera.ones(3, 4)
    >>> [(e.key, e.input_shapes) for e in prof.key_averages(group_by_input_shape=True)][-1]
    ('tessera::matmul', [[2, 3], [3, 4]])
    """

    def __init__(self, enabled: bool = True, *, use_cuda: bool = False,
                 use_device: str | None = None, record_shapes: bool = False,
                 with_flops: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, with_modules: bool = False,
                 use_kineto: bool = False, use_cpu: bool = True,
                 experimental_config: Any = None, acc_events: bool = False,
                 custom_trace_id_callback: Any = None,
                 post_processing_timeout_s: float | None = None,
                 activity_filters: Any = None):
        self.enabled = enabled
        if use_cuda or use_device not in (None, "cpu"):
            warnings.warn("profile: tessera runs on the CPU; device activity is not recorded",
                          stacklevel=2)
        self.record_shapes = record_shapes
        self.with_flops = with_flops
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.use_cpu = use_cpu
        self.acc_events = acc_events
        self._session: _Session | None = None
        self._events: EventList | None = None
        self._past: list[FunctionEvent] = []

    def __enter__(self) -> profile:
        self._start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _start(self) -> None:
        if not self.enabled or not self.use_cpu:
            return
        if self.acc_events and self._events is not None:
            self._past = list(self._events)
        self._session = _Session(self.record_shapes, self.profile_memory, self.with_stack,
                                 self.with_flops)
        self._session.start()
        self._events = None

    def _stop(self) -> None:
        s = self._session
        if s is None:
            return
        s.stop()
        self._session = None
        events = s.results()
        if self._past:
            events = EventList(self._past + list(events), s.profile_memory, s.with_flops,
                               s.base_ns, s.wall_ns)
        self._events = events

    @property
    def function_events(self) -> EventList:
        """Every recorded call, in order of start."""
        if self._events is None:
            if self._session is not None and ACTIVE is self._session:
                raise RuntimeError("Profiler didn't finish running")
            return EventList([], self.profile_memory, self.with_flops)
        return self._events

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0,
                     group_by_overload_name: bool = False) -> EventList:
        """The calls of each name summed (by name and input shapes when asked)."""
        return self.function_events.key_averages(group_by_input_shape, group_by_stack_n,
                                                 group_by_overload_name)

    def table(self, sort_by: str | None = None, row_limit: int = 100,
              max_src_column_width: int = 75, max_name_column_width: int = 55,
              max_shapes_column_width: int = 80, header: str | None = None,
              top_level_events_only: bool = False, time_unit: str | None = None) -> str:
        return self.function_events.table(sort_by, row_limit, max_src_column_width,
                                          max_name_column_width, max_shapes_column_width,
                                          header, top_level_events_only, time_unit)

    def export_chrome_trace(self, path: str) -> None:
        """Write the recorded calls as a Chrome trace (JSON; Perfetto loads it)."""
        self.function_events.export_chrome_trace(path)

    def total_average(self):
        return self.function_events.total_average()

    @property
    def self_cpu_time_total(self) -> float:
        return self.function_events.self_cpu_time_total

    def __str__(self) -> str:
        return self.table()
