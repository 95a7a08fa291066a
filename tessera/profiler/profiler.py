"""``tessera.profiler.profile``: the recorder of ``tessera.autograd.profiler`` driven by a
schedule of steps, with PyTorch's ``torch.profiler`` API.

A schedule maps each step number to a ``ProfilerAction``; ``profile.step()`` moves to the
next step and acts on the change exactly as PyTorch does (``_ACTIONS``): a cycle of
``wait`` steps unrecorded, ``warmup`` steps run but not kept, ``active`` steps recorded,
and at the last active step ``on_trace_ready(prof)`` is called.

>>> import tessera
>>> from tessera.profiler import profile, schedule
>>> kept = []
>>> with profile(schedule=schedule(wait=1, warmup=1, active=2), record_shapes=True,
...              on_trace_ready=lambda p: kept.append(
...                  [e.input_shapes[0] for e in p.events() if e.name == "tessera::exp"])) as p:
...     for step in range(4):
...         _ = tessera.zeros(step).exp()
...         p.step()
>>> kept   # steps 2 and 3 were recorded
[[[2], [3]]]
"""
from __future__ import annotations

import enum
import gzip
import json
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from tessera.autograd import profiler as _recorder
from tessera.autograd.profiler_util import EventList, chrome_trace

__all__ = ["profile", "schedule", "ProfilerAction", "ProfilerActivity",
           "tensorboard_trace_handler", "supported_activities"]


class ProfilerActivity(enum.Enum):
    """What a profile records. Tessera runs on the CPU; the device groups are accepted
    (PyTorch's scripts name them) and record nothing."""

    CPU = 0
    XPU = 1
    MTIA = 2
    CUDA = 3
    HPU = 4
    PrivateUse1 = 5


class ProfilerAction(enum.Enum):
    """What the profiler does during a step."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def supported_activities() -> set[ProfilerActivity]:
    """The activities tessera records: the CPU's."""
    return {ProfilerActivity.CPU}


def schedule(*, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0,
             skip_first_wait: int = 0) -> Callable[[int], ProfilerAction]:
    """The step -> action function of a profile: ``skip_first`` steps, then cycles of
    ``wait`` + ``warmup`` + ``active`` steps (``repeat`` cycles, 0: until the end); with
    ``skip_first_wait``, the first cycle starts at its warmup.

    >>> f = schedule(wait=1, warmup=1, active=2, repeat=1)
    >>> [f(i).name for i in range(5)]
    ['NONE', 'WARMUP', 'RECORD', 'RECORD_AND_SAVE', 'NONE']
    """
    if wait < 0 or warmup < 0 or active <= 0 or repeat < 0 or skip_first < 0:
        raise AssertionError(
            f"Invalid profiler schedule arguments. Got wait={wait} (need >= 0), "
            f"warmup={warmup} (need >= 0), active={active} (need > 0), repeat={repeat} "
            f"(need >= 0), skip_first={skip_first} (need >= 0).")
    if warmup == 0:
        warnings.warn("Profiler won't be using warmup, this can skew profiler results",
                      stacklevel=2)
    cycle = wait + warmup + active

    def action(step: int) -> ProfilerAction:
        if step < 0:
            raise AssertionError(f"Step must be non-negative. Got {step}.")
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if skip_first_wait:
            step += wait
        if repeat > 0 and step // cycle >= repeat:
            return ProfilerAction.NONE
        k = step % cycle
        if k < wait:
            return ProfilerAction.NONE
        if k < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if k < cycle - 1 else ProfilerAction.RECORD_AND_SAVE
    return action


def _always_record(step: int) -> ProfilerAction:
    return ProfilerAction.RECORD


def tensorboard_trace_handler(dir_name: str, worker_name: str | None = None,
                              use_gzip: bool = False, use_python_export: bool = False):
    """An ``on_trace_ready`` that writes each cycle's Chrome trace into ``dir_name`` as
    ``<worker_name>.<time in ns>.pt.trace.json`` (``.gz`` with ``use_gzip``); the worker
    name is ``<host>_<pid>`` by default."""
    def handler(prof) -> None:
        nonlocal worker_name
        try:
            os.makedirs(dir_name, exist_ok=True)
        except OSError as e:
            raise RuntimeError("Can't create directory: " + dir_name) from e
        if not worker_name:
            worker_name = f"{socket.gethostname()}_{os.getpid()}"
        name = f"{worker_name}.{time.time_ns()}.pt.trace.json" + (".gz" if use_gzip else "")
        prof.export_chrome_trace(os.path.join(dir_name, name))
    return handler


class _KinetoProfile:
    """The recording part of ``profile``: prepare, start and stop one trace."""

    def __init__(self, *, activities: Iterable | None = None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False,
                 with_flops: bool = False, with_modules: bool = False,
                 experimental_config: Any = None, execution_trace_observer: Any = None,
                 acc_events: bool = False, custom_trace_id_callback: Any = None,
                 post_processing_timeout_s: float | None = None):
        acts: set = set()
        for a in (activities if activities is not None else supported_activities()):
            if isinstance(a, dict):
                acts.update(a)
            elif isinstance(a, ProfilerActivity):
                acts.add(a)
            else:
                raise TypeError(f"profile: activities must be ProfilerActivity values, got "
                                f"{type(a).__name__}")
        if not acts:
            raise AssertionError("No valid profiler activities found")
        self.activities = acts
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.with_modules = with_modules
        self.acc_events = acc_events
        self.profiler: _recorder.profile | None = None

    def prepare_trace(self) -> None:
        if self.profiler is None or not self.acc_events:
            self.profiler = _recorder.profile(
                use_cpu=ProfilerActivity.CPU in self.activities,
                record_shapes=self.record_shapes, profile_memory=self.profile_memory,
                with_stack=self.with_stack, with_flops=self.with_flops,
                acc_events=self.acc_events)

    def start_trace(self) -> None:
        if self.profiler is None:
            self.prepare_trace()
        assert self.profiler is not None
        self.profiler._start()

    def stop_trace(self) -> None:
        if self.profiler is not None:
            self.profiler._stop()

    def start(self) -> None:
        self.prepare_trace()
        self.start_trace()

    def stop(self) -> None:
        self.stop_trace()

    def events(self) -> EventList:
        """The recorded calls of the last trace (of every trace with ``acc_events``)."""
        if self.profiler is None:
            raise AssertionError("Profiler must be initialized before getting events")
        return self.profiler.function_events

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0,
                     group_by_overload_name: bool = False) -> EventList:
        """One line per name (and input shapes, when asked): counts and summed times."""
        return self.events().key_averages(group_by_input_shape, group_by_stack_n,
                                          group_by_overload_name)

    def export_chrome_trace(self, path: str) -> None:
        """Write the trace as Chrome trace JSON (gzip-compressed when ``path`` ends in
        ``.gz``); Perfetto and chrome://tracing load it."""
        ev = self.events()
        doc = chrome_trace(ev, ev._base_ns, ev._wall_ns)
        if path.endswith(".gz"):
            with gzip.open(path, "wt") as f:
                json.dump(doc, f)
        else:
            with open(path, "w") as f:
                json.dump(doc, f)


# what each change of action does, as PyTorch's profiler: (previous, next) -> steps
_ACTIONS: dict[tuple, tuple[str, ...]] = {
    (ProfilerAction.NONE, ProfilerAction.WARMUP): ("prepare",),
    (ProfilerAction.NONE, ProfilerAction.RECORD): ("prepare", "start"),
    (ProfilerAction.NONE, ProfilerAction.RECORD_AND_SAVE): ("prepare", "start"),
    (ProfilerAction.WARMUP, ProfilerAction.NONE): ("warn", "start", "stop"),
    (ProfilerAction.WARMUP, ProfilerAction.RECORD): ("start",),
    (ProfilerAction.WARMUP, ProfilerAction.RECORD_AND_SAVE): ("start",),
    (ProfilerAction.RECORD, ProfilerAction.NONE): ("warn", "stop"),
    (ProfilerAction.RECORD, ProfilerAction.WARMUP): ("warn", "stop"),
    (ProfilerAction.RECORD_AND_SAVE, ProfilerAction.NONE): ("stop", "ready"),
    (ProfilerAction.RECORD_AND_SAVE, ProfilerAction.WARMUP): ("stop", "ready", "prepare"),
    (ProfilerAction.RECORD_AND_SAVE, ProfilerAction.RECORD):
        ("stop", "ready", "prepare", "start"),
    (ProfilerAction.RECORD_AND_SAVE, ProfilerAction.RECORD_AND_SAVE):
        ("stop", "ready", "prepare", "start"),
    (ProfilerAction.WARMUP, None): ("start", "stop"),
    (ProfilerAction.RECORD, None): ("stop", "ready"),
    (ProfilerAction.RECORD_AND_SAVE, None): ("stop", "ready"),
}


class profile(_KinetoProfile):
    """Profile the code inside ``with`` (PyTorch's ``torch.profiler.profile``): eager ops
    as ``tessera::<op>``, backward nodes, ``record_function`` blocks and the kernels of
    compiled ``nn.Graph`` steps under their module paths. With a ``schedule``, call
    ``step()`` once per training step; each step is marked ``ProfilerStep#<n>``.

    >>> import tessera
    >>> from tessera.profiler import ProfilerActivity
    >>> with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    ...     _ = tessera.ones(4, 4).relu()
    >>> print(prof.key_averages().table(sort_by="cpu_time_total").splitlines()[1].split())
    ['Name', 'Self', 'CPU', '%', 'Self', 'CPU', 'CPU', 'total', '%', 'CPU', 'total', \
'CPU', 'time', 'avg', '#', 'of', 'Calls']
    """

    def __init__(self, *, activities: Iterable | None = None,
                 schedule: Callable[[int], ProfilerAction] | None = None,
                 on_trace_ready: Callable[..., Any] | None = None,
                 record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config: Any = None,
                 execution_trace_observer: Any = None, acc_events: bool = False,
                 use_cuda: bool | None = None, custom_trace_id_callback: Any = None,
                 post_processing_timeout_s: float | None = None):
        if use_cuda is not None:
            warnings.warn("`use_cuda` is deprecated, use `activities` argument instead",
                          FutureWarning, stacklevel=2)
        super().__init__(activities=activities, record_shapes=record_shapes,
                         profile_memory=profile_memory, with_stack=with_stack,
                         with_flops=with_flops, with_modules=with_modules,
                         acc_events=acc_events)
        self.schedule = schedule or _always_record
        self.record_steps = schedule is not None
        self.on_trace_ready = on_trace_ready
        self.step_num = 0
        self.current_action = self.schedule(0)
        self.step_rec_fn: _recorder.record_function | None = None

    def __enter__(self) -> profile:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._transit(ProfilerAction.NONE, self.current_action)
        self._enter_step()

    def stop(self) -> None:
        self._exit_step()
        self._transit(self.current_action, None)

    def step(self) -> None:
        """The next step begins: act on the schedule's action for it."""
        self._exit_step()
        prev = self.current_action
        self.step_num += 1
        self.current_action = self.schedule(self.step_num)
        self._transit(prev, self.current_action)
        self._enter_step()

    def _enter_step(self) -> None:
        if self.record_steps:
            self.step_rec_fn = _recorder.record_function(f"ProfilerStep#{self.step_num}")
            self.step_rec_fn.__enter__()

    def _exit_step(self) -> None:
        if self.step_rec_fn is not None:
            self.step_rec_fn.__exit__(None, None, None)
            self.step_rec_fn = None

    def _transit(self, prev, new) -> None:
        for what in _ACTIONS.get((prev, new), ()):
            if what == "prepare":
                self.prepare_trace()
            elif what == "start":
                self.start_trace()
            elif what == "stop":
                self.stop_trace()
            elif what == "ready":
                if self.on_trace_ready is not None:
                    self.on_trace_ready(self)
            else:
                warnings.warn(f"Incorrect schedule: {prev.name} followed by {new.name}",
                              stacklevel=3)
