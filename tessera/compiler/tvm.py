"""The TVM backend: a graph after tessera's passes, lowered directly to one Relax function.

Each node emits its op's ``to_relax`` rule (``tessera.ops._relax``) into a
``relax.BlockBuilder`` dataflow block; a fused region (the outline pass's ``fused`` node) is
lowered through its body graph. Inputs are cast to the compute type tessera's kernel would
use and results to the dtypes ``infer`` gave, so the function computes what the executor
computes. The function takes the graph's inputs, then its variables, and returns its
outputs, then the new values of the variables it assigns (a training step's parameters and
optimizer state). ``tvm.compile`` builds it for the host CPU (LLVM with this CPU's
``mcpu``), after MetaSchedule tuning when ``tune_trials`` is given (that many candidates
built and measured in all, shared out among the fused kernels; a kernel tuned before in the
process is not searched again); the library, and the tuning database, are cached under
the kernel cache (``tessera.kernels.cc.entry``: atomic writes, an entry failing its digest
rebuilt) keyed by the module's text, the target and TVM's version, so a second process, or
the same graph again, loads it without compiling or tuning.

>>> import tessera
>>> from tessera.graph.trace import trace
>>> g, _ = trace(lambda x: (x * 2).exp(), tessera.zeros(2))
>>> supported(g.nodes[0])
True
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import tempfile
import time

import numpy as np

from tessera.compiler.partition import BackendStats
from tessera.graph.executor import compile_kernel
from tessera.graph.fused import body_graph
from tessera.graph.ir import Graph, Node, Value
from tessera.kernels import cc
from tessera.ops.registry import MissingRule

__all__ = ["Builder", "supported", "lower", "build", "target", "compile_graph", "whole_graph",
           "TvmStep", "stats"]

# what build() did in this process: compiles, cache hits, seconds spent, of which tuning
# (MetaSchedule's search; for the bench)
stats: dict = {"compiled": 0, "cached": 0, "seconds": 0.0, "tune_seconds": 0.0, "last": None}


@functools.lru_cache(maxsize=1)
def _modules():
    try:
        import tvm
        from tvm import relax
    except ImportError as e:
        raise ImportError("the TVM backend needs apache-tvm: pip install 'tessera[tvm]'") from e
    return tvm, relax


class Builder:
    """What a ``to_relax`` rule sees as ``R``: ``tvm.relax.op``'s functions as attributes,
    and the few helpers the rules need (see ``tessera.ops._relax``)."""

    def __init__(self, bb):
        _, relax = _modules()
        self.bb, self._relax, self._op = bb, relax, relax.op
        # the constants' bytes: the module's text shows them only as references
        self.consts = hashlib.sha256()

    def __getattr__(self, name: str):
        return _Ops(getattr(self._op, name), self)

    def const(self, value, dtype: str):
        a = np.asarray(value, dtype=dtype, order="C")
        self.consts.update(f"{a.dtype}{a.shape}".encode() + a.tobytes())
        return self._relax.const(a, dtype)

    def emit(self, x):
        return self.bb.emit(x) if isinstance(x, self._relax.Call) else x

    def _ty(self, x):
        return (x if isinstance(x, self._relax.Var) else self.bb.normalize(x)).ty

    def shape(self, x) -> tuple:
        return tuple(int(s) for s in self._ty(x).shape)

    def dtype(self, x) -> str:
        return str(self._ty(x).dtype)

    def pair(self, x, y) -> tuple:
        """``x`` and ``y`` in one dtype: a Python number takes the other's dtype (a float
        number turns an integer tensor into float32, as tessera's promotion does), two
        tensors NumPy's common type."""
        num = (bool, int, float)
        if isinstance(x, num) and isinstance(y, num):
            dt = str(np.result_type(x, y))
            return self.const(x, dt), self.const(y, dt)
        if isinstance(x, num) or isinstance(y, num):
            t, n = (y, x) if isinstance(x, num) else (x, y)
            dt = self.dtype(t)
            if isinstance(n, float) and not dt.startswith("float"):
                t, dt = self._op.astype(t, "float32"), "float32"
            elif isinstance(n, int) and not isinstance(n, bool) and dt == "bool":
                t, dt = self._op.astype(t, "int64"), "int64"
            c = self.const(n, dt)
            return (c, t) if isinstance(x, num) else (t, c)
        dx, dy = self.dtype(x), self.dtype(y)
        if dx != dy:
            dt = str(np.result_type(np.dtype(dx), np.dtype(dy)))
            x = x if dx == dt else self._op.astype(x, dt)
            y = y if dy == dt else self._op.astype(y, dt)
        return x, y


class _Ops:
    """``tvm.relax.op``'s functions (and namespaces, ``R.nn``) with their expression
    arguments bound first: some ops read their operands' shapes when they are built."""

    def __init__(self, target, builder: Builder):
        self._target, self._b = target, builder

    def __getattr__(self, name: str):
        return _Ops(getattr(self._target, name), self._b)

    def __call__(self, *args, **kwargs):
        def bind(a):
            if isinstance(a, self._b._relax.Call):
                return self._b.bb.emit(a)
            if isinstance(a, (list, tuple)) and any(isinstance(x, self._b._relax.Call)
                                                     for x in a):
                return type(a)(bind(x) for x in a)
            return a
        return self._target(*[bind(a) for a in args], **{k: bind(v) for k, v in kwargs.items()})


def _has_rule(n: Node) -> bool:
    if n.op.name == "fused":
        return all(_has_rule(m) for m in body_graph(n.attrs["body"]).nodes)
    return n.op.to_relax is not None and "seed" not in n.attrs


def _ttype(v: Value):
    _, relax = _modules()
    return relax.TensorType(tuple(v.shape), str(v.dtype.np))


_PROBED: dict = {}


def supported(n: Node) -> bool:
    """Whether the TVM backend lowers ``n``: its op (every op of a fused body) has a
    ``to_relax`` rule, and the rule accepts these attrs (built into a scratch function, not
    compiled; a rule may decline a case with ``NotImplementedError``)."""
    if not _has_rule(n):
        return False
    values = [v for v in list(n.inputs) + list(n.outputs) if isinstance(v, Value)]
    if any(0 in v.shape for v in values):
        return False  # TVM's kernels assume non-empty buffers
    if any(v.dtype.name.startswith("complex") for v in values):
        return False  # TVM has no complex dtype
    key = (n.op.name, repr(sorted(n.attrs.items())),
           tuple((v.shape, v.dtype.name) if isinstance(v, Value) else repr(v)
                 for v in n.inputs))
    if key not in _PROBED:
        _, relax = _modules()
        bb = relax.BlockBuilder()
        params = [relax.Var(f"p{i}", _ttype(v)) for i, v in enumerate(n.inputs)
                  if isinstance(v, Value)]
        it = iter(params)
        args = [next(it) if isinstance(v, Value) else v for v in n.inputs]
        try:
            with bb.function("probe", params):
                with bb.dataflow():
                    outs = lower_node(n, args, Builder(bb))
                    out = bb.emit_output(relax.Tuple(list(outs)))
                bb.emit_func_output(out)
            _PROBED[key] = True
        except NotImplementedError:
            _PROBED[key] = False
    return _PROBED[key]


def lower_node(n: Node, args: list, R: Builder) -> tuple:
    """The node's outputs as bound Relax variables, from its inputs' (constants as they
    are)."""
    if n.op.name == "fused":
        body = body_graph(n.attrs["body"])
        env = dict(zip(body.inputs, args))
        run_nodes(body.nodes, env, R)
        outs: tuple = tuple(env[v] for v in body.outputs)
    else:
        rule = n.op.to_relax
        if rule is None:
            raise MissingRule(n.op.name, "to_relax")
        _, casts = compile_kernel(n)
        args = [_cast(R, a, c) for a, c in zip(args, casts)]
        res = rule(R, args, n.attrs)
        outs = tuple(res) if isinstance(res, (tuple, list)) else (res,)
    if len(outs) != len(n.outputs):
        raise ValueError(f"{n.op.name} ({n.name or 'graph'}): its to_relax rule gave "
                         f"{len(outs)} outputs, the op has {len(n.outputs)}")
    res_out = []
    for o, v in zip(outs, n.outputs):
        if isinstance(o, (bool, int, float)):
            o = R.const(o, str(v.dtype.np))
        o = R.emit(o)
        if R.dtype(o) != str(v.dtype.np):
            o = R.emit(R.astype(o, str(v.dtype.np)))
        if R.shape(o) != tuple(v.shape):
            raise ValueError(f"{n.op.name} ({n.name or 'graph'}): its to_relax rule gave "
                             f"shape {R.shape(o)}, infer says {tuple(v.shape)}")
        res_out.append(o)
    return tuple(res_out)


def _cast(R: Builder, a, c):
    if isinstance(a, np.ndarray):
        a = R.const(a, str(a.dtype))
    if c is None or a is None:
        return a
    dt = str(np.dtype(c))
    if isinstance(a, (bool, int, float)):
        return R.const(a, dt)
    return a if R.dtype(a) == dt else R.astype(a, dt)


def run_nodes(nodes: list, env: dict, R: Builder) -> None:
    for n in nodes:
        args = [env[v] if isinstance(v, Value) else v for v in n.inputs]
        for v, o in zip(n.outputs, lower_node(n, args, R)):
            env[v] = o


def lower(g: Graph) -> tuple:
    """(module, key): the graph as an ``IRModule`` whose ``main`` takes the inputs, then
    the variables (in ``g.variables``' order), and returns a tuple of the outputs, then the
    assigned variables' new values; and the text that identifies it (its script and its
    constants' digest)."""
    _, relax = _modules()
    bb = relax.BlockBuilder()
    R = Builder(bb)
    params = [relax.Var(f"in{i}", _ttype(v)) for i, v in enumerate(g.inputs)]
    params += [relax.Var(f"var{i}", _ttype(v)) for i, v in enumerate(g.variables.values())]
    with bb.function("main", params):
        with bb.dataflow():
            env: dict = dict(zip(list(g.inputs) + list(g.variables.values()), params))
            run_nodes(g.nodes, env, R)
            outs = [env[v] for v in g.outputs] + [env[v] for _, v in g.assigns]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod = bb.get()
    return mod, mod.script() + "\n" + R.consts.hexdigest()


@functools.cache
def target(tuning: bool = False):
    """The host CPU as a TVM target: LLVM with this CPU's ``mcpu`` (TVM 0.27 takes targets
    as dicts; the string form with ``-mcpu`` is gone). MetaSchedule also needs the core
    count."""
    tvm, _ = _modules()
    from tvm.target import codegen
    spec: dict = {"kind": "llvm", "mcpu": str(codegen.llvm_get_system_cpu())}
    if tuning:
        spec["num-cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
    return tvm.target.Target(spec)


_PROBE_JSON = """
import tvm
from tvm import relax
bb = relax.BlockBuilder()
x = relax.Var("x", relax.TensorType((2,), "float32"))
with bb.function("main", [x]):
    with bb.dataflow():
        y = bb.emit_output(relax.op.exp(x))
    bb.emit_func_output(y)
tvm.ir.save_json(relax.transform.LegalizeOps()(bb.get()))
"""


@functools.cache
def _tuning_broken() -> str | None:
    """Why MetaSchedule cannot run here, or None. Its worker processes need psutil and
    cloudpickle; it stores each task's module as JSON, and some TVM builds crash there (a
    segfault in ``ToJSONGraph``, reproduced by ``tvm.ir.save_json`` on any module, with
    apache-tvm-ffi 0.1.15): tried once in a child process, so that the crash becomes an
    error instead of ending this one."""
    import importlib.util
    import subprocess
    import sys
    for dep in ("psutil", "cloudpickle"):
        if importlib.util.find_spec(dep) is None:
            return f"MetaSchedule needs {dep}: pip install 'tessera[tvm]'"
    proc = subprocess.run([sys.executable, "-c", _PROBE_JSON], capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0:
        tvm, _ = _modules()
        return (f"this TVM build ({tvm.__version__}) crashes serialising a module to JSON "
                f"(exit status {proc.returncode}), which MetaSchedule does for every task; "
                "apache-tvm-ffi 0.1.14.post1 does not")
    return None


def _ms_builder(workers: int):
    """MetaSchedule's local builder without its default build function's first step,
    importing ``tvm.s_tir.tensor_intrin`` (every target's tensor intrinsics, parsed from
    TVMScript: many seconds in each worker, and its pool is started anew for every batch,
    so on a busy machine every build ran into the builder's timeout). A scheduled module
    holds its intrinsics' bodies already, so the build does not need them registered."""
    from tvm.s_tir import meta_schedule as ms

    def build_fn(mod, target, _params):  # nested: cloudpickle sends it by value
        from tvm.driver import build as tvm_build
        from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
        mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
        return tvm_build(mod, target=target)

    return ms.builder.LocalBuilder(max_workers=workers, timeout_sec=_MS_TIMEOUT,
                                   f_build=build_fn)


@contextlib.contextmanager
def _cpu_intrinsics():
    """While tuning, ``tvm.s_tir.tensor_intrin`` holds the CPU's tensor intrinsics only.
    MetaSchedule imports that package for every task; its ``__init__`` parses every
    target's intrinsics from TVMScript, CUDA's most of it (several seconds of the seconds a
    tiny graph's tuning takes). The package stands in unexecuted while its CPU modules
    load, and is dropped afterwards, so a later import (a GPU's tuning) runs its own
    ``__init__``, which finds the CPU modules loaded. Any surprise: the ordinary import."""
    import importlib
    import importlib.util
    import sys
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        yield
        return
    try:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        for sub in ("x86", "arm_cpu", "riscv_cpu"):
            importlib.import_module(f"{name}.{sub}")
    except Exception:
        sys.modules.pop(name, None)
        importlib.import_module(name)
        yield
        return
    try:
        yield
    finally:
        sys.modules.pop(name, None)


# seconds one candidate may take to build or to run: generous, the cores may be busy
_MS_TIMEOUT = 300.0
_DB_FILES = {"workloads": "database_workload.json", "records": "database_tuning_record.json"}


# every kernel MetaSchedule measured in this process, per target and trial budget: a module
# whose kernels were tuned for an earlier one (a training step's second trace, which adds
# the optimizer's state) searches only the new ones, and its database takes the best known
# record of each
_SEEN: dict = {}


def _search(mod, tgt, trials: int, path: str) -> None:
    """MetaSchedule's search over ``mod``'s (lowered, fused) kernels not yet tuned in this
    process, ``trials`` candidates measured in all, shared out among them; the best record
    of each of ``mod``'s kernels (a ``JSONDatabase``'s two files) written to ``path`` as one
    JSON object."""
    import json
    import logging

    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule import relax_integration as ri
    cores = int(tgt.attrs["num-cores"])
    try:
        import xgboost  # noqa: F401
        cost_model = "xgb"
    except ImportError:  # measured candidates still decide; the model only ranks them
        cost_model = "random"
    seen = _SEEN.setdefault((str(tgt), trials), ms.database.MemoryDatabase())
    log = logging.getLogger("tvm.s_tir.meta_schedule")
    level = log.level
    t0 = time.perf_counter()
    log.setLevel(logging.WARNING)  # its per-round tables are for people tuning by hand
    db = {k: "" for k in _DB_FILES}
    try:
        with tempfile.TemporaryDirectory(prefix="tessera-tvm-tune-") as work:
            tasks = ri.extract_tasks(mod, tgt, {})
            new = [t for t in tasks if not _best(seen, t.dispatched[0])]
            if new:  # none: nothing to tune (a graph of layout ops), or tuned before
                per_iter = max(1, min(64, trials // len(new)))
                with _cpu_intrinsics():
                    contexts, weights = ri.extracted_tasks_to_tune_contexts(
                        new, work, strategy=ms.search_strategy.EvolutionarySearch(
                            population_size=max(64, 4 * per_iter)), num_threads=cores)
                    ms.tune_tasks(
                        tasks=contexts, task_weights=weights, work_dir=work,
                        # it stops once the count reaches its budget, checked before each
                        # round: this one ends the last round within ``trials``
                        max_trials_global=trials - per_iter + 1,
                        num_trials_per_iter=per_iter, builder=_ms_builder(cores),
                        runner=ms.runner.LocalRunner(timeout_sec=_MS_TIMEOUT),
                        cost_model=cost_model)
                files = {k: os.path.join(work, f) for k, f in _DB_FILES.items()}
                if not _read(files["records"]).strip():
                    raise RuntimeError(f"nn.Graph backend 'tvm': tune_trials={trials}: no "
                                       f"candidate was built and measured{_first_error(work)}")
                for rec in ms.database.JSONDatabase(
                        files["workloads"], files["records"]).get_all_tuning_records():
                    _commit(seen, rec.workload.mod, rec)
            if tasks:
                out = os.path.join(work, "out")
                os.mkdir(out)
                files = {k: os.path.join(out, f) for k, f in _DB_FILES.items()}
                mine = ms.database.JSONDatabase(files["workloads"], files["records"])
                for t in tasks:
                    for rec in _best(seen, t.dispatched[0]):
                        # under the kernel it was measured on: structural equality ignores
                        # block names, a record's trace names its blocks (a training
                        # step's second trace calls the bias gradient's reduction
                        # "lv73_red" where the first said "lv69_red"), and the database
                        # replays each trace on its own kernel when it loads, as
                        # MetaScheduleApplyDatabase does to schedule any kernel equal to it
                        _commit(mine, rec.workload.mod, rec)
                db = {k: _read(p) for k, p in files.items()}
    finally:
        log.setLevel(level)
        stats["tune_seconds"] += time.perf_counter() - t0
    with open(path, "w") as f:
        json.dump(db, f)


def _best(db, workload_mod) -> list:
    """The best measured record of kernel ``workload_mod`` in ``db`` (none or one)."""
    if not db.has_workload(workload_mod):
        return []
    return db.get_top_k(db.commit_workload(workload_mod), 1)


def _commit(db, workload_mod, rec) -> None:
    from tvm.s_tir import meta_schedule as ms
    db.commit_tuning_record(ms.database.TuningRecord(
        rec.trace, db.commit_workload(workload_mod), rec.run_secs, rec.target, rec.args_info))


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _first_error(work: str) -> str:
    """The first failed candidate's error in MetaSchedule's task logs, for the message."""
    logs = os.path.join(work, "logs")
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
        lines = _read(os.path.join(logs, name)).splitlines()
        for i, line in enumerate(lines):
            if "Error in" in line:
                return ": " + " ".join(lines[i:i + 2]).split("] ", 1)[-1]
    return ""


def _tuned(mod, tgt, trials: int, key: str):
    """``mod`` lowered and fused, each kernel in the best schedule MetaSchedule measured
    (``static_shape_tuning``'s steps, with the builder and the trial split above). The
    tuning database is a cache entry of its own (``tvm_<key>.tuning.json``): a library
    built again (its entry lost or corrupt) applies it without tuning again."""
    import json

    tvm, relax = _modules()
    why = _tuning_broken()
    if why is not None:
        raise RuntimeError(f"nn.Graph backend 'tvm': tune_trials={trials} cannot tune: "
                           f"{why}; set_backend('tvm') compiles untuned")
    with tgt:
        mod = tvm.transform.Sequential([relax.transform.DecomposeOpsForInference(),
                                        relax.transform.CanonicalizeBindings(),
                                        relax.pipeline.zero_pipeline()])(mod)
    path, _ = cc.entry(f"tvm_{key}.tuning.json", lambda p: _search(mod, tgt, trials, p))
    with open(path) as f:
        db = json.load(f)
    from tvm.s_tir import meta_schedule as ms
    with tempfile.TemporaryDirectory(prefix="tessera-tvm-db-") as work:
        files = {k: os.path.join(work, name) for k, name in _DB_FILES.items()}
        for k, p in files.items():
            with open(p, "w") as f:
                f.write(db[k])
        with tgt, ms.database.JSONDatabase(files["workloads"], files["records"]):
            return relax.transform.MetaScheduleApplyDatabase()(mod)


def build(lowered: tuple, tune_trials: int = 0):
    """A ``relax.VirtualMachine`` running ``lower``'s module on the CPU, compiled (and
    tuned) unless the cache holds it."""
    tvm, relax = _modules()
    tgt = target(tune_trials > 0)
    t0 = time.perf_counter()
    mod, ident = lowered
    text = "\n".join([tvm.__version__, str(tgt), f"trials={tune_trials}", ident])
    key = hashlib.sha256(text.encode()).hexdigest()[:32]

    def make(path: str) -> None:
        m = _tuned(mod, tgt, tune_trials, key) if tune_trials > 0 else mod
        tvm.compile(m, target=tgt).export_library(path)
    path, cached = cc.entry(f"tvm_{key}.so", make)
    try:
        lib = tvm.runtime.load_module(path)
    except Exception:  # a sound digest over a library TVM cannot load: made again
        os.unlink(path)
        path, cached = cc.entry(f"tvm_{key}.so", make)
        lib = tvm.runtime.load_module(path)
    seconds = time.perf_counter() - t0
    stats.update(compiled=stats["compiled"] + (not cached), cached=stats["cached"] + cached,
                 seconds=stats["seconds"] + seconds, last={"cached": cached, "seconds": seconds})
    return relax.VirtualMachine(lib, tvm.cpu())


def _options(tune_trials: int = 0) -> int:
    if not isinstance(tune_trials, int) or tune_trials < 0:
        raise ValueError(f"nn.Graph backend 'tvm': tune_trials must be an int >= 0, got "
                         f"{tune_trials!r}")
    return tune_trials


def _tensor(a):
    tvm, _ = _modules()
    return tvm.runtime.tensor(np.asarray(a, order="C"))


def compile_graph(g: Graph, **options):
    """A segment's function: ``fn(input arrays) -> output arrays`` (NumPy in and out)."""
    vm = build(lower(g), _options(**options))
    fn = vm["main"]

    def run(arrays):
        return [o.numpy() for o in fn(*[_tensor(a) for a in arrays])]
    return run


class TvmStep(BackendStats):
    """A whole graph on TVM, with the executor's ``run``, ``profile`` and ``memory_stats``.
    Variables the step does not assign (an inference graph's weights) stay converted
    between calls while their tensor is unchanged."""

    def __init__(self, g: Graph, tensors: dict, **options):
        self.graph, self.tensors, self.backend = g, tensors, "tvm"
        self.names = list(g.variables)
        self.fn = build(lower(g), _options(**options))["main"]
        self.resident: dict = {}  # name -> (TVM tensor, (id of the tensor's array, version))

    def describe(self) -> str:
        return f"backend tvm: the whole graph ({len(self.graph.nodes)} ops) in one cluster"

    def _timed(self) -> list[tuple[object, str]]:
        return [(self, "fn")]

    def _device(self, name: str, array):
        t = self.tensors.get(name)
        key = None if t is None else (id(t._data), t._version[0])
        held = self.resident.get(name)
        if held is not None and key is not None and held[1] == key:
            return held[0]
        out = _tensor(array)
        if key is not None:
            self.resident[name] = (out, key)
        return out

    def run(self, inputs: list, variables: dict):
        args = [_tensor(a) for a in inputs] + [self._device(k, variables[k])
                                               for k in self.names]
        res = [o.numpy() for o in self.fn(*args)]
        n = len(self.graph.outputs)
        return res[:n], [(k, a) for (k, _), a in zip(self.graph.assigns, res[n:])]


def whole_graph(g: Graph, tensors: dict, **options) -> TvmStep:
    """The backend's form for a graph it covers whole."""
    return TvmStep(g, tensors, **options)
