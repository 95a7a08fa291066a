"""An inference graph as one C call: the exported library's program, compiled in process.

``nn.Graph`` runs a graph one executor step per node, a Python call and (on two threads or
more) a hand-over to the kernel threads each. For an inference graph this module writes the
nodes that have C rules as the program ``export_c`` would write (``tessera.deploy._emit``:
the same blocked convolutions, GEMM and fused loops), compiles it into a library cached by
its text (``tessera.kernels.cc.load_files``: atomic writes, an entry failing its digest
rebuilt) and calls it once per step, on the inputs, fresh output buffers and the graph's
variables where they are (a table of pointers, no copy; matrices packed for the GEMM when
the program binds them). Its work items run on the process's kernel threads, so it follows
``tessera.set_num_threads``.

A node without a C rule (or whose rule declines its case) runs on the executor: the graph
is cut into runs (``tessera.compiler.partition``), each run of C nodes one program. A run
becomes a program when it has at least ``MIN_KERNELS`` computing nodes: a program saves
the executor's few microseconds per node and the threads' hand-overs, and costs a compile
of seconds the first time its text is seen (``TESSERA_GRAPH_PROGRAM=1`` compiles every run
it can, ``0`` none: ``tessera.graph.backend``).

Weights: ``nn.Graph`` recompiles an inference graph when a variable it read changes (its
version counter, as ``load_state_dict`` and in-place updates bump it), which binds the new
values (the program's library, cached by its text, loads without compiling again). A
variable replaced by another array between steps is bound again at the next step.

``nn.Graph`` asks ``make`` through ``tessera.graph.backend.program``; ``debug()`` prints
the cut. A graph of two kernels is not worth a compile:

>>> import tessera
>>> from tessera.graph.trace import trace
>>> g, _ = trace(lambda x: (x * 2).relu(), tessera.ones(3))
>>> make(g, {}) is None
True
"""
from __future__ import annotations

import ctypes
import operator
import warnings

import numpy as np

from tessera.autograd import profiler as _profiler
from tessera.compiler import partition
from tessera.deploy._capture import _affine_batch_norms, _fold_constants
from tessera.deploy._emit import emit, has_rule, weight_table
from tessera.deploy._files import program_files
from tessera.graph.ir import Graph, Node, Value
from tessera.graph.memory import ALIGN, aligned_bytes
from tessera.kernels import cc, threadpool

__all__ = ["make", "ProgramStep", "MIN_KERNELS"]

# computing nodes (not views) a run needs to become a program without TESSERA_GRAPH_PROGRAM=1
MIN_KERNELS = 16
NAME = "graph"  # the C prefix: one name, so the same graph's program is one cache entry
_IN_DTYPES = ("float32", "int64")  # what a program reads and writes at its boundary
_OUT_DTYPES = ("float32",)


def make(g: Graph, tensors: dict, force: bool = False):
    """``g`` (an inference graph after the passes) as programs and executor runs, with
    the executor's ``run``; None when no run becomes a program. ``tensors``: the
    variables' tensors by name; ``force``: every run that compiles, however short."""
    if cc.compiler() is None:
        return None
    values = {}
    for name, t in tensors.items():
        a = getattr(t, "_data", t)
        if not isinstance(a, np.ndarray):   # a global tensor's tiles: not here
            return None
        values[name] = a
    if any("seed" in n.attrs or "generator" in n.attrs for n in g.nodes):
        return None  # a random draw is tessera's generator's: the executor's
    declined: dict[int, str] = {}
    segments = _choose(g, values, force, declined)
    if not any(s.side == "backend" for s in segments):
        return None
    try:
        if len(segments) == 1:
            return ProgramStep(g, _Program(segments[0].graph, values))
        step = _Partitioned(g, {id(n) for s in segments if s.side == "backend"
                                for n in s.nodes}, values)
    except (cc.CompileError, OSError, RuntimeError) as e:
        if force:
            raise
        warnings.warn(f"nn.Graph: the graph's C program did not build ({e}); the executor "
                      "runs it", RuntimeWarning, stacklevel=3)
        return None
    step.declined = declined
    return step


def _choose(g: Graph, values: dict, force: bool, declined: dict) -> list:
    """The cut: runs of nodes with C rules whose program emits (a node a rule declines, or
    one reading or writing a value the program cannot take at its boundary, goes to the
    executor, and the runs are cut again), long enough unless ``force``."""
    out = {id(n) for n in g.nodes if not has_rule(n)}
    for n in g.nodes:
        if id(n) in out:
            declined[id(n)] = "no C rule"
        elif not force and _winograd(n):
            out.add(id(n))
            declined[id(n)] = "the executor runs it as Winograd"
    while True:
        segments = partition.cut(g, lambda n: id(n) not in out, variables=True)
        more = False
        for seg in segments:
            if seg.side != "backend":
                continue
            bad = _boundary(seg) or _emits(seg, values)
            if not bad and not force and \
                    sum(n.op.aliasing != "view" for n in seg.nodes) < MIN_KERNELS:
                bad = {id(n): f"a run of fewer than {MIN_KERNELS} kernels" for n in seg.nodes}
            if bad:
                declined.update(bad)
                out |= set(bad)
                more = True
        if not more:
            return segments


def _winograd(n: Node) -> bool:
    """A large 3x3 convolution the blocked-layout pass left plain because the executor runs
    it as Winograd, which programs lack (ResNet-18 at batch 8: 67 ms on the executor's
    Winograd against 89 ms as a program; ``bench models``' "resnet18 infer b8")."""
    from tessera.graph.passes.nchwc import _winograd_wins
    if n.op.name != "conv" or len(n.inputs) < 2 or len(n.inputs[1].shape) != 4 or \
            len(n.attrs.get("stride", ())) != 2:
        return False
    return _winograd_wins(n.inputs[0], n.inputs[1], n.outputs[0], n.attrs)


def _boundary(seg) -> dict[int, str]:
    """{id(node): why} of the nodes that read or write what a program cannot take: inputs
    other than float32 and int64, outputs other than float32."""
    bad = {}
    for v in seg.reads:
        if v.kind != "var" and v.dtype.name not in _IN_DTYPES:
            for n in seg.nodes:
                if any(u is v for u in n.inputs):
                    bad[id(n)] = f"reads a {v.dtype.name} value from outside the program"
    for v in seg.writes:
        if v.dtype.name not in _OUT_DTYPES:
            bad[id(v.producer)] = f"its {v.dtype.name} result leaves the program"
    return bad


def _emits(seg, values: dict) -> dict[int, str]:
    """{id(node): why} of the node a C rule declines (every node of the run when emitting
    fails otherwise), or {} when the run's program emits."""
    try:
        emit(NAME, *_prepared(seg.graph, values))
    except Exception as e:  # a case the emitter does not take: the executor runs it
        hit = _origin(seg, getattr(e, "node", None))
        if isinstance(e, NotImplementedError) and hit is not None:
            return {id(hit): str(e)}
        return {id(n): f"{type(e).__name__}: {e}" for n in seg.nodes}
    return {}


def _origin(seg, node) -> Node | None:
    """The node of ``seg`` that ``node`` (of a parsed copy of its graph) stands for: the one
    whose first result has the same name (emit replaces some nodes, never their results)."""
    if not isinstance(node, Node) or not node.outputs:
        return None
    for n, orig in zip(seg.graph.nodes, seg.nodes):
        if n.outputs and n.outputs[0].name == node.outputs[0].name:
            return orig
    return None


def _prepared(sub: Graph, values: dict) -> tuple[Graph, dict]:
    """A private copy of ``sub`` and its variables' values, as ``export_c`` prepares a graph:
    eval batch norms as affine maps, nodes of variables alone computed now."""
    g = Graph.parse(str(sub))
    vals = {name: values[name] for name in g.variables}
    _affine_batch_norms(g, vals)
    _fold_constants(g, vals)
    return g, vals


def _weight(a: np.ndarray, v: Value | None) -> np.ndarray:
    """``a`` as the program reads a weight: C-contiguous, of its variable's dtype, on a
    cache line (a copy only when it is not already)."""
    if v is not None and a.dtype != v.dtype.np:
        a = a.astype(v.dtype.np)
    if a.flags.c_contiguous and a.ctypes.data % ALIGN == 0:
        return a
    out = aligned_bytes(max(a.nbytes, 1))[:a.nbytes].view(a.dtype).reshape(a.shape)
    np.copyto(out, a)
    return out


class _Program:
    """One run's program, bound to its variables: ``run(input arrays, variable arrays)``
    returns its output arrays (new each call)."""

    def __init__(self, sub: Graph, values: dict):
        self.graph = sub
        self.names = list(sub.variables)
        self.inputs = [(v.dtype.np, v.shape) for v in sub.inputs]
        self.outputs = [(v.shape, v.dtype.np) for v in sub.outputs]
        self.model = None
        self.threads = self.pool = -1
        self.seen: dict | None = None  # the variables dict last checked against the bound
        self._bind(values)

    def _bind(self, values: dict) -> None:
        g, vals = _prepared(self.graph, values)
        prog = emit(NAME, g, vals)
        table = weight_table(prog)
        files, units, extra = program_files(prog, table)
        lib = cc.load_files(files, units, extra)
        # the library's cache entry, and whether it was there already (for statistics)
        self.key, self.cached = cc.last_build["key"], cc.last_build["cached"]
        P = ctypes.c_void_p
        lib.graph_bind.argtypes, lib.graph_bind.restype = [P], P
        lib.graph_run.argtypes, lib.graph_run.restype = [P, P, P], ctypes.c_int
        lib.graph_free.argtypes, lib.graph_free.restype = [P], None
        lib.graph_set_num_threads.argtypes = [P, ctypes.c_int]
        lib.graph_set_pool.argtypes, lib.graph_set_pool.restype = [ctypes.c_ssize_t], None
        lib.graph_last_error.argtypes, lib.graph_last_error.restype = [P], ctypes.c_char_p
        lib.graph_load_error.restype = ctypes.c_char_p
        keep = []
        for name in table:
            off_arr = prog.weights[name][1]
            v = g.variables.get(name)
            keep.append(_weight(off_arr if off_arr is not None else vals[name], v))
        ptrs = (ctypes.c_void_p * (len(keep) + 1))(*[a.ctypes.data for a in keep])
        model = lib.graph_bind(ptrs)
        if not model:
            raise RuntimeError(f"nn.Graph program: {lib.graph_load_error().decode()}")
        self._free()
        self.lib, self.model, self.keep = lib, model, keep
        self.bound = [values[name] for name in self.names]
        self.threads = self.pool = -1
        self.ins = (ctypes.c_void_p * max(len(self.inputs), 1))()
        self.outs = (ctypes.c_void_p * max(len(self.outputs), 1))()

    def run(self, arrays: list, variables: dict) -> list:
        # nn.Graph hands over the same dict until a variable holds another array (then a new
        # one): looked through once per dict (MobileNetV2's 106 names, 10 us of a 2 ms step)
        if variables is not self.seen:
            if self.names and any(map(operator.is_not, map(variables.__getitem__,
                                                           self.names), self.bound)):
                self._bind(variables)  # a variable is another array now
            self.seen = variables
        pool, threads = threadpool.c_pool()
        if pool != self.pool:
            self.lib.graph_set_pool(pool)
            self.pool = pool
        if threads != self.threads:
            self.lib.graph_set_num_threads(self.model, threads)
            self.threads = threads
        ins, outs = self.ins, self.outs
        keep = []
        for k, (a, (dtype, _)) in enumerate(zip(arrays, self.inputs)):
            if type(a) is not np.ndarray or a.dtype != dtype or not a.flags.c_contiguous:
                a = np.ascontiguousarray(a, dtype)
                keep.append(a)
            ins[k] = a.ctypes.data
        results = [np.empty(shape, dtype) for shape, dtype in self.outputs]
        for k, r in enumerate(results):
            outs[k] = r.ctypes.data
        if self.lib.graph_run(self.model, ins, outs):
            raise RuntimeError(f"nn.Graph program: "
                               f"{self.lib.graph_last_error(self.model).decode()}")
        return results

    def _free(self) -> None:
        if self.model:
            self.lib.graph_free(self.model)
            self.model = None

    def __del__(self):
        try:
            self._free()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


class ProgramStep(partition.BackendStats):
    """A whole inference graph as one program, with the executor's ``run``, ``profile``
    (the program as one entry, ``program``) and ``memory_stats``."""

    backend = "program"

    def __init__(self, g: Graph, program: _Program):
        self.graph, self.program = g, program
        self.declined: dict = {}

    def run(self, inputs: list, variables: dict):
        session = _profiler.ACTIVE
        if session is None:
            return self.program.run(inputs, variables), []
        # a profile records the step as the executor's does, the program one kernel in it
        clock, outer = _profiler._clock, not session.in_graph
        session.in_graph = True
        t0 = clock()
        try:
            out = self.program.run(inputs, variables)
            session.block("tessera::program", t0, clock(), "cpu_op", 0, {"op": "program"})
        finally:
            if outer:
                session.in_graph = False
                session.block("nn.Graph", t0, clock(), "user_annotation")
        return out, []

    def describe(self) -> str:
        return f"program: the whole graph ({len(self.graph.nodes)} ops) as one C call"

    def _timed(self) -> list[tuple[object, str]]:
        return [(self.program, "run")]


class _Partitioned(partition.Partitioned):
    """Programs for the runs of ``chosen`` nodes, the executor for the rest."""

    def __init__(self, g: Graph, chosen: set, values: dict):
        self.declined: dict = {}
        super().__init__(g, "program", lambda n: id(n) in chosen,
                         lambda sub: _Program(sub, values).run, variables=True)

    def describe(self) -> str:
        text = super().describe().replace("backend program:", "programs:", 1)
        whys = sorted({why for why in self.declined.values()})
        return text + "".join(f"\n  executor: {why}" for why in whys[:8])
