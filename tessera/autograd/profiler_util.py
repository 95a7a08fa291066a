"""The profiler's results: ``FunctionEvent`` (one recorded call), ``FunctionEventAvg`` (the
calls of one name, summed) and ``EventList``, with PyTorch's names and its table layout.

Times are microseconds, memory is bytes. An event's *self* figures are its own less its
children's (an op inside a ``record_function`` block is the block's child).

>>> from tessera.autograd.profiler_util import EventList, FunctionEvent
>>> outer = FunctionEvent(0, "step", 0, 0, 10_000)
>>> inner = FunctionEvent(1, "tessera::add", 0, 2_000, 5_000)
>>> events = EventList([outer, inner]).build_tree()
>>> [(a.key, a.count, a.self_cpu_time_total) for a in events.key_averages()]
[('step', 1, 7.0), ('tessera::add', 1, 3.0)]
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable

__all__ = ["FunctionEvent", "FunctionEventAvg", "EventList", "Interval"]


def _format_time(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _format_share(us: float, total: float) -> str:
    return "NaN" if total == 0 else f"{us * 100.0 / total:.2f}%"


def _format_memory(nbytes: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} B"


class Interval:
    """A start and an end, in microseconds."""

    def __init__(self, start: float, end: float):
        self.start, self.end = start, end

    def elapsed_us(self) -> float:
        return self.end - self.start


class _Stats:
    """The figures events and averages share, and their formatted forms."""

    key: str
    cpu_time_total: float
    self_cpu_time_total: float
    count: int
    # no devices: tessera profiles the CPU (device figures are zero, as PyTorch's CPU runs)
    device_time_total = self_device_time_total = 0.0
    device_memory_usage = self_device_memory_usage = 0
    cuda_time = device_time = 0.0
    is_async = is_legacy = is_remote = False
    node_id = -1
    use_device = None
    overload_name = ""
    device_type = "CPU"
    scope = 0

    @property
    def cpu_time(self) -> float:
        """Average time per call."""
        return self.cpu_time_total / max(self.count, 1)

    @property
    def cpu_time_str(self) -> str:
        return _format_time(self.cpu_time)

    @property
    def cpu_time_total_str(self) -> str:
        return _format_time(self.cpu_time_total)

    @property
    def self_cpu_time_total_str(self) -> str:
        return _format_time(self.self_cpu_time_total)


class FunctionEvent(_Stats):
    """One recorded call: an op, a ``record_function`` block, a backward node or a graph
    kernel. ``start_ns``/``end_ns`` are the recorder's clock (``time.perf_counter_ns``)."""

    def __init__(self, id: int, name: str, thread: int, start_ns: int, end_ns: int,
                 input_shapes: list | None = None, cpu_memory_usage: int = 0,
                 flops: int = 0, stack: list | None = None, category: str = "cpu_op",
                 args: dict | None = None, input_dtypes: list | None = None):
        self.id = id
        self.trace_name = name  # the name in the Chrome trace
        if name.startswith("ProfilerStep#"):  # steps average as one line, as in PyTorch
            name = "ProfilerStep*"
        self.name = self.key = name
        self.thread = thread
        self.start_ns, self.end_ns = start_ns, end_ns
        self.input_shapes = input_shapes if input_shapes is not None else []
        self.input_dtypes = input_dtypes if input_dtypes is not None else []
        self.own_memory = cpu_memory_usage   # allocated by the call itself (not children)
        self.flops = flops
        self.stack = stack if stack is not None else []
        self.category = category
        self.args = args or {}
        self.cpu_parent: FunctionEvent | None = None
        self.cpu_children: list[FunctionEvent] = []
        self.count = 1
        self.is_user_annotation = category == "user_annotation"

    @property
    def time_range(self) -> Interval:
        return Interval(self.start_ns / 1e3, self.end_ns / 1e3)

    @property
    def cpu_time_total(self) -> float:  # type: ignore[override]
        return (self.end_ns - self.start_ns) / 1e3

    @property
    def self_cpu_time_total(self) -> float:  # type: ignore[override]
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.cpu_children)

    @property
    def cpu_memory_usage(self) -> int:
        """Bytes allocated by the call and everything it called."""
        return self.own_memory + sum(c.cpu_memory_usage for c in self.cpu_children)

    @property
    def self_cpu_memory_usage(self) -> int:
        return self.own_memory

    def __repr__(self) -> str:
        return (f"<FunctionEvent id={self.id} name={self.name} cpu_time="
                f"{self.cpu_time_total_str} thread={self.thread} input_shapes="
                f"{self.input_shapes} cpu_memory_usage={self.cpu_memory_usage}>")


class FunctionEventAvg(_Stats):
    """The calls of one key (name, and input shapes when grouped by them), summed."""

    def __init__(self) -> None:
        self.key = ""
        self.count = 0
        self.cpu_time_total = 0.0
        self.self_cpu_time_total = 0.0
        self.cpu_memory_usage = 0
        self.self_cpu_memory_usage = 0
        self.flops = 0
        self.input_shapes: list | None = None
        self.stack: list = []
        self.is_user_annotation = False
        self.cpu_parent = None
        self.cpu_children: list = []

    def add(self, other) -> FunctionEventAvg:
        if self.count == 0:
            self.key = other.key
            self.input_shapes = other.input_shapes
            self.stack = other.stack
            self.is_user_annotation = other.is_user_annotation
        elif other.key != self.key:
            raise AssertionError(f"FunctionEventAvg.add: key {other.key!r} is not {self.key!r}")
        self.count += other.count
        self.cpu_time_total += other.cpu_time_total
        self.self_cpu_time_total += other.self_cpu_time_total
        self.cpu_memory_usage += other.cpu_memory_usage
        self.self_cpu_memory_usage += other.self_cpu_memory_usage
        self.flops += other.flops
        return self

    def __iadd__(self, other) -> FunctionEventAvg:
        return self.add(other)

    def __repr__(self) -> str:
        return (f"<FunctionEventAvg key={self.key} self_cpu_time={self.self_cpu_time_total_str}"
                f" cpu_time={self.cpu_time_str} input_shapes={self.input_shapes} "
                f"cpu_memory_usage={self.cpu_memory_usage}>")


class EventList(list):
    """A list of events (or of averages) with PyTorch's ``table``, ``key_averages`` and
    ``export_chrome_trace``."""

    def __init__(self, events: Iterable = (), profile_memory: bool = False,
                 with_flops: bool = False, base_ns: int = 0, wall_ns: int = 0):
        super().__init__(events)
        self._profile_memory = profile_memory
        self._with_flops = with_flops
        self._base_ns = base_ns   # the clock reading the trace's timestamps count from
        self._wall_ns = wall_ns   # the wall-clock time (ns since the epoch) at base_ns

    def build_tree(self) -> EventList:
        """Link each event to the innermost event of its thread that encloses it."""
        self.sort(key=lambda e: (e.start_ns, -e.end_ns))
        open_: dict[int, list] = {}
        for e in self:
            e.cpu_parent, e.cpu_children = None, []
        for e in self:
            stack = open_.setdefault(e.thread, [])
            while stack and stack[-1].end_ns < e.end_ns:
                stack.pop()
            if stack:
                e.cpu_parent = stack[-1]
                stack[-1].cpu_children.append(e)
            stack.append(e)
        return self

    @property
    def self_cpu_time_total(self) -> float:
        return sum(e.self_cpu_time_total for e in self)

    def total_average(self) -> FunctionEventAvg:
        total = FunctionEventAvg()
        for e in self:
            total.count += e.count
            total.cpu_time_total += e.cpu_time_total
            total.self_cpu_time_total += e.self_cpu_time_total
            total.cpu_memory_usage += e.cpu_memory_usage
            total.self_cpu_memory_usage += e.self_cpu_memory_usage
            total.flops += e.flops
        total.key = "Total"
        return total

    def key_averages(self, group_by_input_shapes: bool = False, group_by_stack_n: int = 0,
                     group_by_overload_name: bool = False) -> EventList:
        """One ``FunctionEventAvg`` per name (and per input shapes, or per top stack
        entries, when asked), in order of first appearance."""
        stats: dict[tuple, FunctionEventAvg] = {}
        for e in self:
            key: tuple = (e.key, e.is_user_annotation)
            if group_by_input_shapes:
                key += (str(e.input_shapes),)
            if group_by_stack_n > 0:
                key += tuple(e.stack[:group_by_stack_n])
            avg = stats.get(key)
            if avg is None:
                avg = stats[key] = FunctionEventAvg()
            avg.add(e)
        for avg in stats.values():
            if not group_by_input_shapes:
                avg.input_shapes = None
        return EventList(stats.values(), self._profile_memory, self._with_flops)

    def table(self, sort_by: str | None = None, row_limit: int = 100,
              max_src_column_width: int = 75, max_name_column_width: int = 55,
              max_shapes_column_width: int = 80, header: str | None = None,
              top_level_events_only: bool = False, time_unit: str | None = None) -> str:
        """The events as PyTorch prints them (its column names and widths), sorted by
        ``sort_by`` (``cpu_time_total``, ``self_cpu_time_total``, ``count``, ...) in
        descending order."""
        return _table(self, sort_by, row_limit, max_src_column_width, max_name_column_width,
                      max_shapes_column_width, header, top_level_events_only, time_unit,
                      self._profile_memory, self._with_flops)

    def export_chrome_trace(self, path: str) -> None:
        """Write the events as a Chrome trace (JSON, loadable in Perfetto and
        chrome://tracing): one complete event per call, times in microseconds."""
        with open(path, "w") as f:
            json.dump(chrome_trace(self, self._base_ns, self._wall_ns), f)

    def __str__(self) -> str:
        return self.table()


def chrome_trace(events: Iterable[FunctionEvent], base_ns: int, wall_ns: int) -> dict:
    """The Chrome trace JSON object of ``events``: metadata naming the process and its
    threads, then one ``"ph": "X"`` event per call with ``ts``/``dur`` in microseconds."""
    pid = os.getpid()
    trace: list[dict] = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                          "args": {"name": "python"}},
                         {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0,
                          "args": {"labels": "CPU"}}]
    threads: list[int] = []
    body = []
    for e in events:
        if e.thread not in threads:
            threads.append(e.thread)
        args = dict(e.args)
        if e.input_shapes:
            args["Input Dims"] = e.input_shapes
            args["Input type"] = e.input_dtypes
        if e.own_memory:
            args["Bytes allocated"] = e.own_memory
        if e.flops:
            args["flops"] = e.flops
        if e.stack:
            args["Call stack"] = ";".join(e.stack)
        body.append({"ph": "X", "cat": e.category, "name": e.trace_name, "pid": pid,
                     "tid": e.thread, "ts": (e.start_ns - base_ns) / 1e3,
                     "dur": (e.end_ns - e.start_ns) / 1e3, "args": args})
    for t in threads:
        trace.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t,
                      "args": {"name": f"thread {t} (python)"}})
    return {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": wall_ns,
            "traceEvents": trace + body}


def _table(events, sort_by, row_limit, max_src, max_name, max_shapes, header, top_only,
           time_unit, profile_memory, with_flops) -> str:
    if len(events) == 0:
        return ""
    if sort_by is not None:
        events = sorted(events, key=lambda e: getattr(e, sort_by.replace("cuda", "device")),
                        reverse=True)
    has_shapes = any(e.input_shapes for e in events)
    has_stack = any(e.stack for e in events)
    name_w = max(len(e.key) for e in events) + 4
    if max_name is not None:
        name_w = min(name_w, max_name)
    shapes_w = min(max(len(str(e.input_shapes)) for e in events) + 4, max_shapes or 10 ** 9)
    headers = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if profile_memory:
        headers += ["CPU Mem", "Self CPU Mem"]
    headers.append("# of Calls")
    widths = [name_w] + [12] * (len(headers) - 1)
    align = [">"] * len(headers)
    if has_shapes:
        headers.append("Input Shapes")
        widths.append(shapes_w)
        align.append(">")
    src_w = 0
    if has_stack:
        src_w = max(len(s) for e in events for s in e.stack) + 4
        src_w = min(src_w, max_src) if max_src is not None else src_w
        headers.append("Source Location")
        widths.append(src_w)
        align.append("<")
    flops_scale, flops_unit = 1.0, ""
    positive = [e.flops for e in events if e.flops > 0]
    with_flops = with_flops and bool(positive)
    if with_flops:
        k = max(0, min(int(math.floor(math.log10(min(positive)) / 3)), 5))
        flops_scale, flops_unit = 10.0 ** (-3 * k), ["", "K", "M", "G", "T", "P"][k]
        headers.append(f"Total {flops_unit}FLOPs")
        widths.append(12)
        align.append(">")
    row_format = "".join("{: " + a + str(w) + "}  " for a, w in zip(align, widths))
    sep = "".join("-" * w + "  " for w in widths)
    line_length = sum(w + 2 for w in widths) - 2
    total = sum(e.self_cpu_time_total for e in events)

    def fmt_time(us: float) -> str:
        if time_unit in ("s", "ms", "us"):
            return f"{us / {'s': 1e6, 'ms': 1e3, 'us': 1.0}[time_unit]:.3f}{time_unit}"
        return _format_time(us)

    out = []
    if header is not None:
        out += ["=" * line_length, header]
    if top_only:
        out += ["=" * line_length, "This report only display top-level ops statistics"]
    out += [sep, row_format.format(*headers), sep]
    shown = 0
    for e in events:
        if shown == row_limit:
            break
        if top_only and e.cpu_parent is not None:
            continue
        shown += 1
        name = e.key
        if max_name is not None and len(name) >= max_name - 3:
            name = name[:max_name - 3] + "..."
        row = [name, _format_share(e.self_cpu_time_total, total), fmt_time(e.self_cpu_time_total),
               _format_share(e.cpu_time_total, total), fmt_time(e.cpu_time_total),
               fmt_time(e.cpu_time)]
        if profile_memory:
            row += [_format_memory(e.cpu_memory_usage), _format_memory(e.self_cpu_memory_usage)]
        row.append(e.count)
        if has_shapes:
            row.append(str(e.input_shapes)[:shapes_w])
        if has_stack:
            row.append(_trim(e.stack[0], src_w) if e.stack else "")
        if with_flops:
            row.append("--" if e.flops <= 0 else f"{e.flops * flops_scale:8.3f}")
        out.append(row_format.format(*row))
    out += [sep, f"Self CPU time total: {fmt_time(total)}"]
    return "\n".join(out) + "\n"


def _trim(path: str, width: int) -> str:
    if len(path) > width:
        path = "..." + path[len(path) - width + 3:]
    return path
