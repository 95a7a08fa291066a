"""A standing fuzz of ONNX import: ``tessera.onnx.load`` of mutated models, then running the
loaded model on a matching input, must either succeed (and, when onnxruntime also runs the
mutated model, agree with it) or raise one of ``EXPECTED`` (an ``OnnxValidationError`` for
an invalid model, an op's own ``RuntimeError``/``ValueError``/``IndexError`` for inputs it
cannot take, ``MemoryError`` for a model asking for more memory than the fuzz allows);
never die of a signal, never raise anything else.

The seeds are ONNX's own node tests (``onnx.backend.test.case.node``, generated in memory:
the installed ``onnx`` package need not ship their ``.onnx`` files) for a spread of the op
types tessera imports, with their ``_expanded`` multi-node forms. A seeded mutator
(``mutate``) edits attributes (arity, type, values: negative, zero, huge, bogus strings),
adds unknown or schema attributes, renames or removes node inputs and outputs and graph
outputs, duplicates and reorders nodes, and changes the dims of inputs and initializers.

Everything runs in one child process (``python -m tests.adversarial.test_onnx_fuzz``) whose
exit status is checked; it reports each example's phase before running it, so a signal
death names the example (seed and index reproduce it: ``mutate(seed_model, Random(...))``).
A death inside onnxruntime is onnxruntime's, not tessera's: the fuzz resumes after it.
The child runs under an address-space limit, so a model asking for huge buffers raises
``MemoryError`` rather than waking the OOM killer.

CI runs ``_CI_EXAMPLES`` examples; set ``TESSERA_FUZZ_EXAMPLES=5000`` (and optionally
``TESSERA_FUZZ_SEED``) for a longer run.
"""
from __future__ import annotations

import copy
import importlib
import json
import os
import random
import subprocess
import sys
import warnings

import numpy as np
import pytest

_CI_EXAMPLES = 300
_SEED = int(os.environ.get("TESSERA_FUZZ_SEED", "0"))
_MEMORY_LIMIT = 6 << 30   # bytes of address space for the child

# node test modules of onnx.backend.test.case.node: a spread of what tessera imports
# (convolution and pooling first: their geometry reaches C kernels)
_SEED_MODULES = ("conv", "convtranspose", "maxpool", "averagepool", "globalaveragepool",
                 "gemm", "matmul", "add", "relu", "leakyrelu", "softmax", "reshape",
                 "transpose", "concat", "slice", "gather", "batch_normalization", "pad",
                 "reducesum", "split", "squeeze", "unsqueeze", "layernormalization", "clip",
                 "where", "expand", "flatten", "depthtospace", "tile", "instance_normalization",
                 "topk", "einsum", "cumsum", "onehot", "scatterelements")


def test_fuzz_load_and_run_never_crashes():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    count = int(os.environ.get("TESSERA_FUZZ_EXAMPLES", _CI_EXAMPLES))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    failures, skipped, start = [], [], 0
    while start < count:
        proc = subprocess.run([sys.executable, "-m", "tests.adversarial.test_onnx_fuzz",
                               str(_SEED), str(start), str(count)], cwd=root,
                              capture_output=True, text=True, timeout=1800)
        events = [json.loads(line) for line in proc.stdout.splitlines()
                  if line.startswith("{")]
        failures += [e for e in events if "fail" in e]
        done = next((e["done"] for e in events if "done" in e), None)
        if proc.returncode == 0 and done is not None:
            break
        last = next((e for e in reversed(events) if "phase" in e), None)
        assert last is not None, f"the fuzz child died before its first example " \
                                 f"(status {proc.returncode}):\n{proc.stderr[-3000:]}"
        if last["phase"] != "onnxruntime":
            failures.append({**last, "fail": f"the child died (status {proc.returncode}) "
                                              f"in {last['phase']}: {proc.stderr[-1500:]}"})
        else:
            skipped.append(last)
        start = last["i"] + 1
    assert not failures, "\n".join(json.dumps(f) for f in failures[:20])


# ---- the seeds -----------------------------------------------------------------------------

def seed_cases() -> list:
    """(name, model, input arrays) of the node tests of ``_SEED_MODULES`` whose ops tessera
    imports, in a fixed order."""
    from onnx.backend.test.case import node as cases

    from tessera.onnx.converters import IMPORT
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in _SEED_MODULES:
            importlib.import_module(f"onnx.backend.test.case.node.{m}")
    out = []
    for c in cases._NodeTestCases:
        if all(n.op_type in IMPORT and n.domain in ("", "ai.onnx") for n in c.model.graph.node):
            inputs = list(c.data_sets[0][0])
            if all(isinstance(a, np.ndarray) for a in inputs):
                out.append((c.name, c.model, inputs))
    return sorted(out, key=lambda c: c[0])


# ---- the mutator -------------------------------------------------------------------------

_INTS = (-(2 ** 31), -7, -1, 0, 1, 2, 3, 5, 2 ** 31, 10 ** 6)
_FLOATS = (float("nan"), float("inf"), -1.0, 0.0, 1e30, 0.5)
_STRINGS = ("BOGUS", "", "SAME_UPPER", "VALID", "NOTSET", "constant", "edge")


def _value(rng: random.Random, kind: str):
    if kind == "int":
        return rng.choice(_INTS)
    if kind == "float":
        return rng.choice(_FLOATS)
    if kind == "string":
        return rng.choice(_STRINGS)
    if kind == "ints":
        return [rng.choice(_INTS) for _ in range(rng.randint(0, 6))]
    return [rng.choice(_FLOATS) for _ in range(rng.randint(0, 4))]


def _set_attr(node, name: str, value, kind: str = "") -> None:
    from onnx import AttributeProto, helper
    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep)
    empty = {"ints": AttributeProto.INTS, "floats": AttributeProto.FLOATS}.get(kind)
    node.attribute.append(helper.make_attribute(name, value, attr_type=empty if value == []
                                                else None))


def _mutate_attr(model, rng: random.Random) -> str:
    from onnx import AttributeProto, defs, helper
    nodes = list(model.graph.node)
    node = rng.choice(nodes)
    attrs = list(node.attribute)
    if not attrs or rng.random() < 0.3:   # add one: from the schema or unknown
        try:
            schema = defs.get_schema(node.op_type, model.opset_import[0].version, "")
            names = sorted(schema.attributes) + ["bogus_attr"]
        except Exception:  # noqa: BLE001
            names = ["bogus_attr"]
        name = rng.choice(names)
        kind = rng.choice(("int", "ints", "float", "string"))
        _set_attr(node, name, _value(rng, kind), kind)
        return f"set {node.op_type}.{name} = {kind}"
    a = rng.choice(attrs)
    v = helper.get_attribute_value(a)
    how = rng.choice(("arity", "type", "value", "value", "drop"))
    if how == "drop":
        node.attribute.remove(a)
        return f"drop {node.op_type}.{a.name}"
    if how == "arity" and a.type in (AttributeProto.INTS, AttributeProto.FLOATS) and v:
        v = list(v)
        if rng.random() < 0.5:
            v.append(v[-1])
        else:
            v.pop()
        _set_attr(node, a.name, v, "ints" if a.type == AttributeProto.INTS else "floats")
        return f"arity {node.op_type}.{a.name} -> {len(v)}"
    if how == "type":
        kind = rng.choice(("int", "ints", "float", "string", "floats"))
        val = _value(rng, kind)
        if kind in ("ints", "floats") and not val:
            val = [1] if kind == "ints" else [1.0]
        _set_attr(node, a.name, val)
        return f"type {node.op_type}.{a.name} -> {kind}"
    kinds = {AttributeProto.INT: "int", AttributeProto.INTS: "ints",
             AttributeProto.FLOAT: "float", AttributeProto.FLOATS: "floats",
             AttributeProto.STRING: "string"}
    kind = kinds.get(a.type)
    if kind is None:
        return "no-op"
    if kind in ("ints", "floats") and v:
        v = list(v)
        v[rng.randrange(len(v))] = _value(rng, kind[:-1])
    else:
        v = _value(rng, kind)
    _set_attr(node, a.name, v, kind)
    return f"value {node.op_type}.{a.name} = {v}"


def _mutate_edges(model, rng: random.Random) -> str:
    g = model.graph
    node = rng.choice(list(g.node))
    how = rng.choice(("rename_in", "remove_in", "extra_in", "rename_out", "remove_out",
                      "graph_out", "empty_in"))
    if how == "rename_in" and node.input:
        k = rng.randrange(len(node.input))
        node.input[k] = rng.choice(["ghost"] + [o for n in g.node for o in n.output])
        return f"{node.op_type} input {k} -> {node.input[k]}"
    if how == "remove_in" and node.input:
        del node.input[rng.randrange(len(node.input))]
        return f"{node.op_type} loses an input"
    if how == "extra_in":
        node.input.append(rng.choice([i.name for i in g.input] or ["ghost"]))
        return f"{node.op_type} gains an input"
    if how == "empty_in" and node.input:
        node.input[rng.randrange(len(node.input))] = ""
        return f"{node.op_type} input emptied"
    if how == "rename_out" and node.output:
        k = rng.randrange(len(node.output))
        node.output[k] = rng.choice(["renamed", g.input[0].name if g.input else "renamed"])
        return f"{node.op_type} output {k} renamed"
    if how == "remove_out" and len(node.output) > 1:
        del node.output[-1]
        return f"{node.op_type} loses its last output"
    if how == "graph_out" and g.output:
        g.output[rng.randrange(len(g.output))].name = rng.choice(["ghost", g.node[0].output[0]])
        return "graph output renamed"
    return "no-op"


def _mutate_nodes(model, rng: random.Random) -> str:
    g = model.graph
    nodes = list(g.node)
    if rng.random() < 0.5 or len(nodes) < 2:
        k = rng.randrange(len(nodes))
        g.node.insert(rng.randrange(len(nodes) + 1), copy.deepcopy(nodes[k]))
        return f"duplicate node {k}"
    rng.shuffle(nodes)
    del g.node[:]
    g.node.extend(nodes)
    return "shuffle nodes"


def _mutate_dims(model, rng: random.Random) -> str:
    from onnx import numpy_helper
    g = model.graph
    if g.initializer and rng.random() < 0.4:
        t = rng.choice(list(g.initializer))
        arr = numpy_helper.to_array(t)
        shape = list(arr.shape) or [1]
        k = rng.randrange(len(shape))
        shape[k] = max(0, shape[k] + rng.choice((-1, 1, 2)))
        if rng.random() < 0.2:
            shape.append(1)
        new = np.resize(arr, shape).astype(arr.dtype)
        t.CopyFrom(numpy_helper.from_array(new, t.name))
        return f"initializer {t.name} -> {shape}"
    if not g.input:
        return "no-op"
    v = rng.choice(list(g.input))
    dims = v.type.tensor_type.shape.dim
    if not dims:
        return "no-op"
    d = dims[rng.randrange(len(dims))]
    if d.HasField("dim_value"):
        d.dim_value = max(0, d.dim_value + rng.choice((-2, -1, 1, 3)))
    if rng.random() < 0.2:
        dims.add().dim_value = 1
    return f"input {v.name} dims changed"


_MUTATORS = (_mutate_attr, _mutate_attr, _mutate_attr, _mutate_edges, _mutate_nodes,
             _mutate_dims)


def mutate(model, rng: random.Random) -> tuple:
    """(a mutated copy of ``model``, what was done)."""
    m = copy.deepcopy(model)
    done = [rng.choice(_MUTATORS)(m, rng) for _ in range(rng.choice((1, 1, 2)))]
    return m, done


def inputs_for(model, given: list) -> list:
    """Arrays for ``model``'s graph inputs: the node test's own where the declared shape
    still matches, else random ones of the declared shape and type."""
    from onnx import helper
    init = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(0)
    out = []
    for k, v in enumerate(i for i in model.graph.input if i.name not in init):
        tt = v.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        a = given[k] if k < len(given) else None
        if a is not None and a.shape == shape or -1 in shape or not tt.elem_type:
            out.append(a if a is not None else np.zeros(0, np.float32))
            continue
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if dt.kind == "f":
            out.append(rng.standard_normal(shape).astype(dt))
        elif dt.kind == "b":
            out.append(rng.random(shape) < 0.5)
        else:
            out.append(rng.integers(0, 3, shape).astype(dt))
    return out


# ---- the child -------------------------------------------------------------------------

EXPECTED = (ValueError, RuntimeError, IndexError, MemoryError)


def _emit(**event) -> None:
    print(json.dumps(event, default=str), flush=True)


def _compare(got: list, want: list) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} outputs, onnxruntime gives {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        if g.shape != w.shape:
            return f"output {k}: shape {g.shape}, onnxruntime {w.shape}"
        if w.dtype.kind in "fc":
            scale = max(1.0, float(np.nanmax(np.abs(w), initial=0.0))) if w.size else 1.0
            if not np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-3,
                               atol=1e-4 * scale, equal_nan=True):
                return f"output {k}: values differ from onnxruntime"
        elif not np.array_equal(g, w):
            return f"output {k}: values differ from onnxruntime"
    return None


def _example(seeds: list, seed: int, i: int) -> None:
    import onnxruntime as ort

    import tessera.onnx
    rng = random.Random(seed * 1_000_003 + i)
    name, model, given = seeds[rng.randrange(len(seeds))]
    m, done = mutate(model, rng)
    tag = dict(i=i, seed=seed, case=name, mutations=done)
    _emit(phase="tessera", **tag)
    try:
        loaded = tessera.onnx.load(m)
        xs = inputs_for(m, given)
        got = [t.numpy() for t in loaded.run(*xs)]
    except EXPECTED:
        return
    except Exception as e:  # noqa: BLE001  (the property: nothing else escapes)
        _emit(fail=f"{type(e).__name__}: {e}", **tag)
        return
    _emit(phase="onnxruntime", **tag)
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 4
        s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        want = s.run(None, {v.name: x for v, x in zip(s.get_inputs(), xs)})
    except Exception as e:  # noqa: BLE001
        if "NOT_IMPLEMENTED" in str(e) or "not implemented" in str(e).lower():
            return   # onnxruntime has no kernel for this type: nothing to compare
        _emit(fail=f"tessera runs a model onnxruntime rejects: {str(e)[:300]}", **tag)
        return
    bad = _compare(got, want)
    if bad:
        _emit(fail=bad, **tag)


def _child(seed: int, start: int, count: int) -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_LIMIT, _MEMORY_LIMIT))
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    seeds = seed_cases()
    for i in range(start, count):
        _example(seeds, seed, i)
    _emit(done=count)


if __name__ == "__main__":
    _child(*(int(a) for a in sys.argv[1:4]))
