"""The op-info table through ``tessera.deploy.export_c`` (STYLE.md rule 7).

Each entry's first small samples whose inputs the library takes (float32 and int64 tensors)
and whose outputs it returns (float32, integers, bools) are traced as ``export_c`` traces a
model. A sample whose every node has a C rule is built into a library, together with the
others (a few libraries in all, not one per sample), and run on one thread and two: every
output must equal eager tessera (which tests/ops/test_opinfo.py holds to PyTorch). The ops
of the other samples, which have no C rule yet, are printed with the entries that use them
(``pytest -s``).
"""
from __future__ import annotations

import collections
import ctypes
import shutil

import numpy as np
import pytest

import tessera
from tessera import nn
from tessera.deploy import _emit
from tessera.deploy._capture import capture
from tests.deploy.test_export import build
from tests.onnx.helpers import flat_tensors
from tests.opinfo import OP_DB
from tests.ops.test_opinfo import _convert
from tests.ops.test_opinfo_graph import UNCAPTURABLE, _closure, _samples

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")

INPUTS = ("float32", "int64")
OUTPUTS = ("float32", "int64", "int32", "int16", "int8", "uint8", "bool")
PARTS = 6            # libraries the samples are built into


class _Fn(nn.Module):
    def __init__(self, call):
        super().__init__()
        self.call = call

    def forward(self, *ts):
        return tuple(flat_tensors(self.call(*ts)))


class _Many(nn.Module):
    """The samples' calls side by side: each takes its own inputs, all outputs flat."""

    def __init__(self, cases):
        super().__init__()
        self.cases = cases

    def forward(self, *ts):
        outs, at = [], 0
        for case in self.cases:
            k = len(case.tensors)
            outs += flat_tensors(case.call(*ts[at:at + k]))
            at += k
        return tuple(outs)


class _Case:
    def __init__(self, info, k, tensors, call, want):
        self.name, self.info = f"{info.name}#{k}", info
        self.tensors, self.call, self.want = tensors, call, want


def _survey():
    """(cases to build, {op: entries} without a rule, {why: entries} a rule declines)."""
    cases, missing = [], collections.defaultdict(set)
    declined = collections.defaultdict(set)
    for info in OP_DB:
        if info.name in UNCAPTURABLE or info.random:
            continue
        for k, sample in enumerate(_samples(info)[:2]):
            args, kwargs, _ = _convert(tessera, sample, grad=False)
            try:
                with tessera.no_grad():
                    want = [t.numpy() for t in flat_tensors(info.fn(tessera, *args, **kwargs))]
            except Exception:
                continue  # an error sample: eager tests cover it
            args, kwargs, _ = _convert(tessera, sample, grad=False)
            tensors, call = _closure(info, args, kwargs)
            if not tensors or not want or \
                    any(t.dtype.name not in INPUTS for t in tensors) or \
                    any(w.dtype.name not in OUTPUTS for w in want):
                continue
            try:
                g, values = capture(_Fn(call).eval(), tuple(tensors))
            except Exception:
                continue  # not capturable by nn.Graph: tests/ops/test_opinfo_graph.py
            if len(g.outputs) != len(want):
                continue  # it writes to an input too (the graph returns its new value)
            lacking = {n.op.name for n in g.nodes if not _emit.has_rule(n)}
            for op in lacking:
                missing[op].add(info.name)
            if lacking:
                continue
            try:
                _emit.emit("m", g, values)
            except NotImplementedError as e:
                declined[str(e).split(": ", 1)[-1]].add(info.name)
                continue
            cases.append(_Case(info, k, tensors, call, want))
    return cases, missing, declined


@pytest.fixture(scope="module")
def survey():
    return _survey()


def test_coverage_report(survey):
    """How many of the ops the table's samples use have a C rule; those without one."""
    cases, missing, declined = survey
    used = {n for c in cases for n in _ops(c)}
    print(f"\ndeploy: {len(cases)} samples of {len({c.info.name for c in cases})} entries "
          f"export; {len(used)} ops with a C rule appear in them, "
          f"{len(missing)} ops have none:")
    for op, entries in sorted(missing.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"  {op:32} {len(entries):3} entries, e.g. {', '.join(sorted(entries)[:3])}")
    print("cases a rule declines:")
    for why, entries in sorted(declined.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(entries):3} {why} (e.g. {', '.join(sorted(entries)[:3])})")
    # (var, std, logsumexp, rms_norm and max/min of all elements decompose into regions;
    # nan_to_num and round fuse into them; flip is a strided copy)
    for op in ("sort", "max_pool", "nan_to_num", "max", "min", "aminmax", "repeat", "var",
               "std", "var_mean", "std_mean", "logsumexp", "rms_norm", "adaptive_max_pool",
               "roll", "round", "flip"):
        assert op not in missing, f"{op} has no C rule: {sorted(missing[op])}"
    assert {"sort", "max_pool", "repeat", "roll", "adaptive_max_pool", "aminmax",
            "flip"} <= used


def _ops(case) -> set[str]:
    g, _ = capture(_Fn(case.call).eval(), tuple(case.tensors))
    return {n.op.name for n in g.nodes}


def _run(out, arrays: list, wants: list, threads: int) -> list:
    """The library's outputs for ``arrays`` through its C API (the driver takes at most 64
    files): float32 or int64 buffers shaped as eager's results."""
    lib = ctypes.CDLL(str(out / "libops.so"))
    lib.ops_load.restype = ctypes.c_void_p
    lib.ops_last_error.restype = ctypes.c_char_p
    lib.ops_last_error.argtypes = [ctypes.c_void_p]
    for f in (lib.ops_run, lib.ops_free, lib.ops_set_num_threads):
        f.argtypes = [ctypes.c_void_p] + ([ctypes.c_void_p] * 2 if f is lib.ops_run else
                                          [ctypes.c_int] if f is lib.ops_set_num_threads else [])
    m = lib.ops_load(str(out / "ops.weights").encode())
    assert m, "load failed"
    try:
        assert lib.ops_set_num_threads(m, threads) == 0
        ins = [np.ascontiguousarray(a) for a in arrays]
        outs = [np.empty(w.shape, np.int64 if lib.ops_output_dtype(k) == 1 else np.float32)
                for k, w in enumerate(wants)]
        pin = (ctypes.c_void_p * max(1, len(ins)))(*[a.ctypes.data for a in ins])
        pout = (ctypes.c_void_p * max(1, len(outs)))(*[a.ctypes.data for a in outs])
        assert lib.ops_run(m, pin, pout) == 0, lib.ops_last_error(m)
        return outs
    finally:
        lib.ops_free(m)


@pytest.mark.parametrize("part", range(PARTS))
def test_library_matches_eager(survey, part, tmp_path):
    cases = survey[0][part::PARTS]
    if not cases:
        pytest.skip(f"part {part} has no samples: fewer samples export than {PARTS} parts")
    tensors = [t for c in cases for t in c.tensors]
    out = build(_Many(cases).eval(), tuple(tensors), tmp_path, "ops")
    wants = [(c, j, w) for c in cases for j, w in enumerate(c.want)]
    for threads in (1, 2):
        got = _run(out, [t.numpy() for t in tensors], [w for _, _, w in wants], threads)
        for g, (case, j, want) in zip(got, wants):
            if j in case.info.skip_value_outputs:
                continue
            what = f"{case.name} output {j} ({threads} threads)"
            if want.dtype.kind in "biu":
                np.testing.assert_array_equal(g, want.astype(np.int64), err_msg=what)
            else:
                np.testing.assert_allclose(g, want, rtol=max(case.info.rtol, 1e-4),
                                           atol=max(case.info.atol, 1e-5), equal_nan=True,
                                           err_msg=what)
