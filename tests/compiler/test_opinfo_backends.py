"""The op-info table through each compiler backend: every entry's first small sample in an
inference graph (and its gradient in a second graph, for differentiable entries) compiled
for the backend must equal eager tessera. Nodes whose op has no rule for the backend run on
tessera's executor (the partition), so an entry fails only when a rule exists and
disagrees; the ops without a rule are reported, with the count each backend covers.

TVM compiles each graph with LLVM: by default it runs the smallest prefix-greedy subset of
entries that still reaches every op with a ``to_relax`` rule (each rule checked at least
once); ``TESSERA_TVM_FULL=1`` runs the whole table on TVM as on XLA."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import tessera
from tessera.compiler import partition
from tessera.ops.registry import REGISTRY
from tests.compiler._cases import TVM_FULL
from tests.compiler.test_models import BACKENDS
from tests.opinfo import OP_DB
from tests.ops.test_opinfo import _convert
from tests.ops.test_opinfo_graph import (
    EXPECTED_GRAPH_FAILURES,
    UNCAPTURABLE,
    _closure,
    _compare,
    _FnGraph,
    _samples,
    _tensor_outputs,
)

RULE = {"xla": "to_jax", "tvm": "to_relax"}
# op -> entries whose graphs ran it on the backend
RAN: dict[str, dict[str, set]] = {"xla": {}, "tvm": {}}
SKIP = set(UNCAPTURABLE) | set(EXPECTED_GRAPH_FAILURES)


def _graph(fn, backend):
    g = _FnGraph(fn)
    g.config.set_backend(backend)
    return g


def _note(g, backend, entry):
    ex = g._current().executor
    segments = ex.segments if isinstance(ex, partition.Partitioned) else None
    nodes = [n for s in segments if s.side == "backend" for n in s.nodes] if segments \
        else ([] if segments is not None else g.ir.nodes)
    from tessera.graph.fused import body_graph
    for n in nodes:
        ops = [m.op.name for m in body_graph(n.attrs["body"]).nodes] if n.op.name == "fused" \
            else [n.op.name]
        for op in ops:
            RAN[backend].setdefault(op, set()).add(entry)


def _run(info, backend):
    tol = dict(atol=max(info.atol, 1e-5), rtol=max(info.rtol, 1e-4))
    for sample in _samples(info):
        args, kwargs, _ = _convert(tessera, sample, grad=False)
        try:
            ref = info.fn(tessera, *args, **kwargs)
        except Exception:  # an error sample: the eager tests cover it
            continue
        args, kwargs, _ = _convert(tessera, sample, grad=False)
        tensors, call = _closure(info, args, kwargs)
        g = _graph(lambda *ts: tuple(_tensor_outputs(call(*ts))), backend)
        out = g(*tensors)
        _note(g, backend, info.name)
        _compare(info, list(out), _tensor_outputs(ref), f"{sample!r} output", **tol)
        if info.differentiable and not info.random:
            _run_grad(info, sample, backend, tol)
        return


def _run_grad(info, sample, backend, tol):
    args, kwargs, leaves = _convert(tessera, sample, grad=True)
    if not leaves:
        return
    ref = [o for o in _tensor_outputs(info.fn(tessera, *args, **kwargs)) if o.requires_grad]
    if not ref:
        return
    rng = np.random.default_rng(0)
    cots = [tessera.from_numpy(rng.standard_normal(tuple(o.shape)).astype(o.dtype.np))
            for o in ref]
    try:
        ref_grads = tessera.autograd.grad(ref, leaves, cots, allow_unused=True)
    except Exception:  # eager's own backward rejects the sample: nothing to compare
        return
    tensors, call = _closure(info, args, kwargs)
    pos = [next(i for i, t in enumerate(tensors) if t is leaf) for leaf in leaves]
    n, used = len(tensors), [i for i, gr in enumerate(ref_grads) if gr is not None]

    def build(*ts):
        outs = [o for o in _tensor_outputs(call(*ts[:n])) if o.requires_grad]
        grads = tessera.autograd.grad(outs, [ts[i] for i in pos], list(ts[n:]),
                                      allow_unused=True)
        return tuple(grads[i] for i in used)
    g = _graph(build, backend)
    out = g(*tensors, *cots)
    _note(g, backend, info.name)
    _compare(info, list(out), [ref_grads[i] for i in used], f"{sample!r} grad",
             max(info.grad_atol, tol["atol"]), max(info.grad_rtol, tol["rtol"]))


def _entries():
    seen: dict[str, int] = {}
    for info in OP_DB:
        k = seen.get(info.name, 0)
        seen[info.name] = k + 1
        if info.name in SKIP:
            continue
        yield pytest.param(info, id=f"{info.name}-{k}" if k else info.name)


def _tvm_subset() -> set:
    """Entry ids: in table order, each entry that reaches a ``to_relax`` op no earlier
    chosen entry reached."""
    todo = {n for n, op in REGISTRY.items() if op.to_relax is not None}
    chosen, seen = set(), {}
    for info in OP_DB:
        k = seen.get(info.name, 0)
        seen[info.name] = k + 1
        if info.name in SKIP:
            continue
        ops = set(info.covered_ops()) & todo
        if ops:
            chosen.add(f"{info.name}-{k}" if k else info.name)
            todo -= ops
    return chosen


TVM_SUBSET = None if TVM_FULL else _tvm_subset()


def _with_rule(backend) -> set:
    return {n for n, op in REGISTRY.items() if getattr(op, RULE[backend]) is not None}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("info", _entries())
def test_entry_on_backend(info, backend, request):
    if backend == "tvm" and TVM_SUBSET is not None and \
            request.node.callspec.id.rsplit("-", 1)[0] not in TVM_SUBSET:
        pytest.skip("not in the TVM subset: TESSERA_TVM_FULL=1 runs every entry")
    if not set(info.covered_ops()) & _with_rule(backend):
        pytest.skip(f"no op of this entry has a {RULE[backend]} rule")
    _run(info, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_coverage_report(backend, capsys):
    """How many ops each backend covers; every rule must have run in some entry's graph."""
    have = _with_rule(backend)
    ran = set(RAN[backend])
    with capsys.disabled():
        print(f"\n{backend}: {len(have)} of {len(REGISTRY)} ops have a {RULE[backend]} rule; "
              f"{len(have & ran)} ran on the backend in op-info graphs")
        print(f"  without a rule: {' '.join(sorted(set(REGISTRY) - have))}")
        if have - ran:
            print(f"  with a rule, not reached by an op-info graph: "
                  f"{' '.join(sorted(have - ran))}")
    if not RAN[backend]:
        pytest.skip("run with the entry tests to collect what ran")
    assert importlib.util.find_spec("numpy")
