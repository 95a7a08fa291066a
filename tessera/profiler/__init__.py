"""Profiling, at PyTorch's ``torch.profiler`` path: ``profile`` records the ops, backward
nodes, ``record_function`` blocks and compiled-graph kernels of a block of code, on a
``schedule`` of steps; ``key_averages().table()`` prints them as PyTorch does and
``export_chrome_trace`` writes a trace Perfetto opens. The recorder itself is
``tessera.autograd.profiler``.

>>> import tessera
>>> from tessera.profiler import ProfilerActivity, profile, record_function
>>> with profile(activities=[ProfilerActivity.CPU]) as prof:
...     with record_function("step"):
...         _ = tessera.ones(3).exp()
>>> [e.name for e in prof.events()]
['step', 'tessera::full', 'tessera::exp']
"""
from __future__ import annotations

from tessera.autograd.profiler import record_function
from tessera.profiler.profiler import (
    ProfilerAction,
    ProfilerActivity,
    _KinetoProfile,
    profile,
    schedule,
    supported_activities,
    tensorboard_trace_handler,
)

__all__ = ["profile", "schedule", "supported_activities", "tensorboard_trace_handler",
           "ProfilerAction", "ProfilerActivity", "record_function", "_KinetoProfile"]
