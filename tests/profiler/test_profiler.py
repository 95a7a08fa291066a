"""tessera.profiler against torch.profiler: schedules record the same steps, tables have
the same columns, and the recorded calls are the calls the code made."""
from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
import torch.profiler as tprof

import tessera
from tessera import _dispatch, nn
from tessera.autograd import profiler as recorder
from tessera.profiler import (
    ProfilerAction,
    ProfilerActivity,
    profile,
    record_function,
    schedule,
    tensorboard_trace_handler,
)


def _headers(table: str) -> list[str]:
    return re.split(r"\s{2,}", table.splitlines()[1].strip())


def _names(events) -> list[str]:
    return [e.name for e in events]


def test_off_by_default_and_cleaned_up():
    assert recorder.ACTIVE is None and not _dispatch._MODES
    with pytest.raises(ValueError):
        with profile():
            raise ValueError("boom")
    assert recorder.ACTIVE is None and not _dispatch._MODES
    with profile():
        with pytest.raises(RuntimeError, match="already enabled"):
            profile().start()
    assert recorder.ACTIVE is None and not _dispatch._MODES


def test_counts_equal_the_calls_made():
    x = tessera.ones(3, 4, requires_grad=True)
    w = tessera.ones(4, 2, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            y = (x @ w).relu()
            loss = (y * y).sum()
            loss.backward()
    counts = {a.key: a.count for a in prof.key_averages()}
    assert counts["tessera::matmul"] >= 3  # the forward's three, plus the backward's
    assert counts["tessera::relu"] == 3
    assert counts["tessera::sum"] == 3
    assert counts["autograd::engine::evaluate_function: MatmulBackward0"] == 3
    assert counts["autograd::engine::evaluate_function: MulBackward0"] == 3
    assert counts["autograd::engine::evaluate_function: ReluBackward0"] == 3
    # each backward node's ops are its children
    for e in prof.events():
        if e.name.startswith("autograd::engine"):
            assert all(c.name.startswith("tessera::") for c in e.cpu_children)
    assert all(e.cpu_time_total >= 0 and e.self_cpu_time_total >= -1e-3
               for e in prof.events())


def test_inplace_ops_and_record_function():
    @record_function("helper")
    def helper(t):
        return t.add_(1)

    t = tessera.zeros(5)
    with profile() as prof:
        with record_function("block"):
            helper(t)
            helper(t)
    names = _names(prof.events())
    assert names.count("helper") == 2 and names.count("block") == 1
    assert names.count("tessera::add_") == 2
    block = next(e for e in prof.events() if e.name == "block")
    assert [c.name for c in block.cpu_children] == ["helper", "helper"]
    assert [c.name for c in block.cpu_children[0].cpu_children] == ["tessera::add_"]
    assert t.tolist() == [2.0] * 5


def test_table_columns_as_torch():
    def run(lib, prof_mod, **kw):
        with prof_mod.profile(activities=[prof_mod.ProfilerActivity.CPU], **kw) as p:
            lib.ones(4, 4).relu()
        return p

    for kw in ({}, {"profile_memory": True}):
        ours = run(tessera, tessera.profiler, **kw).key_averages().table(
            sort_by="cpu_time_total", row_limit=5)
        theirs = run(torch, tprof, **kw).key_averages().table(
            sort_by="cpu_time_total", row_limit=5)
        assert _headers(ours) == _headers(theirs)
        assert ours.splitlines()[-1].startswith("Self CPU time total: ")
    averages = run(tessera, tessera.profiler, record_shapes=True).key_averages(
        group_by_input_shape=True)
    ours = averages.table(row_limit=1)
    theirs = run(torch, tprof, record_shapes=True).key_averages(
        group_by_input_shape=True).table(row_limit=1)
    assert _headers(ours) == _headers(theirs)
    assert len(averages) == 2  # full (ones) and relu
    assert len(ours.splitlines()) == 3 + 1 + 2  # header block, 1 row, rule and total


def test_memory_columns_count_new_outputs():
    x = tessera.ones(10, 10)
    with profile(profile_memory=True, record_shapes=True) as prof:
        y = x * 2          # a new 400-byte array
        _ = y.view(100)    # a view: nothing new
    by = {e.name: e for e in prof.events()}
    assert by["tessera::mul"].self_cpu_memory_usage == 400
    assert by["tessera::view"].self_cpu_memory_usage == 0
    assert by["tessera::mul"].input_shapes == [[10, 10], []]
    assert "CPU Mem" in prof.key_averages().table()


def test_chrome_trace_nests(tmp_path):
    x = tessera.randn(8, 8, requires_grad=True)
    with profile(record_shapes=True) as prof:
        with record_function("step"):
            (x @ x).tanh().sum().backward()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(prof.events())
    for e in spans:
        assert e["dur"] >= 0 and isinstance(e["pid"], int) and isinstance(e["tid"], int)
    # any two spans of a thread are disjoint or one holds the other
    eps = 1e-3
    for a in spans:
        for b in spans:
            a0, a1, b0, b1 = a["ts"], a["ts"] + a["dur"], b["ts"], b["ts"] + b["dur"]
            disjoint = a1 <= b0 + eps or b1 <= a0 + eps
            nested = (a0 <= b0 + eps and b1 <= a1 + eps) or (b0 <= a0 + eps and a1 <= b1 + eps)
            assert disjoint or nested, (a["name"], b["name"])
    step = next(e for e in spans if e["name"] == "step")
    inner = [e for e in spans if e is not step]
    assert all(step["ts"] - eps <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"]
               + eps for e in inner)
    mm = next(e for e in spans if e["name"] == "tessera::matmul")
    assert mm["args"]["Input Dims"] == [[8, 8], [8, 8]]


def _record_steps(lib, n_steps: int, **sched):
    """The steps each on_trace_ready call saw, for a loop of ``n_steps`` steps: step k
    exps a tensor of k elements, so an exp's input shape says which step it ran in."""
    prof_mod = tessera.profiler if lib is tessera else tprof
    exp = "tessera::exp" if lib is tessera else "aten::exp"
    seen: list[list[int]] = []

    def ready(p):
        seen.append(sorted(e.input_shapes[0][0] for e in p.events() if e.name == exp))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with prof_mod.profile(activities=[prof_mod.ProfilerActivity.CPU], record_shapes=True,
                              schedule=prof_mod.schedule(**sched),
                              on_trace_ready=ready) as p:
            for step in range(n_steps):
                lib.zeros(step).exp()
                p.step()
    return seen


@pytest.mark.parametrize("sched,n", [
    (dict(wait=1, warmup=1, active=2), 9),
    (dict(wait=2, warmup=1, active=1, repeat=2), 12),
    (dict(wait=0, warmup=0, active=3, skip_first=2), 10),
    (dict(wait=3, warmup=1, active=2, skip_first=1, skip_first_wait=1), 11),
    (dict(wait=1, warmup=1, active=2), 6),   # ends inside a cycle
])
def test_schedule_records_the_steps_torch_records(sched, n):
    ours = _record_steps(tessera, n, **sched)
    assert ours == _record_steps(torch, n, **sched)
    assert ours  # at least one cycle was saved


def test_schedule_actions_as_torch():
    for kw in (dict(wait=1, warmup=2, active=3, repeat=2, skip_first=1),
               dict(wait=0, warmup=1, active=1, skip_first_wait=1)):
        ours, theirs = schedule(**kw), tprof.schedule(**kw)
        assert [ours(i).name for i in range(20)] == [theirs(i).name for i in range(20)]
    assert ProfilerAction.RECORD_AND_SAVE.name == "RECORD_AND_SAVE"
    with pytest.raises(AssertionError, match="active=0"):
        schedule(wait=1, warmup=1, active=0)


def test_trace_handler_writes_chrome_trace(tmp_path):
    with profile(schedule=schedule(wait=0, warmup=1, active=1),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path), "worker")) as p:
        for _ in range(2):
            tessera.ones(3).exp()
            p.step()
    files = sorted(f.name for f in tmp_path.iterdir())
    assert len(files) == 1 and re.fullmatch(r"worker\.\d+\.pt\.trace\.json", files[0])
    doc = json.loads((tmp_path / files[0]).read_text())
    assert "tessera::exp" in {e["name"] for e in doc["traceEvents"]}


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


class _Step(nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = ((self.model(x) - y) ** 2).mean()
        loss.backward()
        return loss


def test_graph_kernels_by_module_path():
    tessera.manual_seed(0)
    model = _Net()
    g = _Step(model, tessera.optim.SGD(model.parameters(), lr=0.1))
    x, y = tessera.randn(3, 4), tessera.randn(3, 2)
    g(x, y)  # compiles
    with profile() as prof:
        for _ in range(2):
            g(x, y)
    counts = {a.key: a.count for a in prof.key_averages()}
    expect: dict[str, int] = {}
    for n in g.ir.nodes:
        name = n.name or f"tessera::{n.op.name}"
        expect[name] = expect.get(name, 0) + 2
    assert {k: counts.get(k) for k in expect} == expect
    assert "model.fc1" in expect and "model.fc2.grad" in expect
    assert counts["nn.Graph"] == 2
    for e in prof.events():
        if e.name == "nn.Graph":
            assert len(e.cpu_children) == len(g.ir.nodes)


def test_graph_runs_unchanged_without_profile():
    tessera.manual_seed(0)
    model = _Net()
    g = _Step(model, tessera.optim.SGD(model.parameters(), lr=0.1))
    x, y = tessera.randn(3, 4), tessera.randn(3, 2)
    first = g(x, y).item()
    with profile():
        second = g(x, y).item()
    third = g(x, y).item()
    assert first > second > third


def test_autograd_profiler_path():
    with tessera.autograd.profiler.profile(record_shapes=True) as prof:
        with tessera.autograd.profiler.record_function("label"):
            tessera.ones(2) * 3
    assert {"label", "tessera::mul"} <= {e.key for e in prof.key_averages()}
    assert prof.self_cpu_time_total > 0
    assert "Self CPU %" in prof.table()


def test_flops_from_the_cost_rule():
    with profile(with_flops=True) as prof:
        tessera.ones(4, 3) @ tessera.ones(3, 5)
    mm = next(e for e in prof.events() if e.name == "tessera::matmul")
    assert mm.flops == 2 * 4 * 3 * 5
    assert "Total FLOPs" in prof.key_averages().table()


def test_with_stack_names_the_caller():
    with profile(with_stack=True) as prof:
        tessera.ones(3).exp()
    exp = next(e for e in prof.events() if e.name == "tessera::exp")
    assert exp.stack[0].startswith(__file__ + "(")
    assert exp.stack[0].endswith(": test_with_stack_names_the_caller")
    assert "Source Location" in prof.key_averages(group_by_stack_n=1).table()
