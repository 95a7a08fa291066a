"""``nn.Graph``: the same model, traced once into an IR, optimised and run as a static graph.

OneFlow's API with PyTorch's names: subclass, assign modules as attributes, register an
optimizer with ``add_optimizer``, write the step in ``build()`` (``loss.backward()``
included), and call the graph like a module. The first call per input signature traces
``build()`` through the same ``dispatch`` and ``OpDef`` rules as eager mode (the backward
pass through the ops' ``grad`` rules, the optimizer step as in-place updates of parameters
and state), runs the pass pipeline, plans memory and compiles the executor; later calls
only run it. Parameters, buffers and optimizer state are shared with the eager objects.

>>> import tessera
>>> from tessera import nn
>>> model = nn.Linear(4, 2)
>>> opt = tessera.optim.SGD(model.parameters(), lr=0.1)
>>> class TrainGraph(nn.Graph):
...     def __init__(self):
...         super().__init__()
...         self.model = model
...         self.add_optimizer(opt)
...     def build(self, x, y):
...         loss = nn.functional.mse_loss(self.model(x), y)
...         loss.backward()
...         return loss
>>> g = TrainGraph()
>>> loss = g(tessera.ones(8, 4), tessera.zeros(8, 2))

Global tensors (``tessera.distributed``) trace as their tiles: each rank compiles its own
local program, with the collectives SBP dispatch chooses as nodes
(``tessera.distributed.graph_ops``). ``config.enable_zero(True, stage=1|2|3)`` splits the
optimizer state (and gradients, and parameters) over the data-parallel ranks;
``module.to(GraphModule).set_stage(i, placement)`` with
``config.set_gradient_accumulation_steps(n)`` trains a pipeline with a 1F1B schedule, and
the all-reduces of gradients run in buckets. Those three are ``tessera.parallel``'s
(``graph_zero``, ``pipeline``, ``graph_buckets``), which this layer reaches only through
what that package registers: ZeRO with ``register_zero``, the schedule and the bucketing as
passes of the pipeline (``tessera.graph.passes.PIPELINE``), told the stages, the number of
micro-batches and the bucket size by ``PassContext``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import operator
from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np

from tessera import _dtype as D, sbp as Sbp
from tessera._tensor import DATA_SWAPS, Tensor
from tessera.autograd.grad_mode import STATE
from tessera.distributed.graph_ops import home_variables, in_step
from tessera.graph import backend as graph_backend
from tessera.graph.executor import Executor
from tessera.graph.ir import Graph as IRGraph
from tessera.graph.passes import run_pipeline
from tessera.graph.recycle import recycled
from tessera.graph.trace import GraphTraceError, Tracer, is_symbolic, value_of
from tessera.nn.functional.attention import unfused_attention
from tessera.nn.graph_module import GraphModule, ProxyModule
from tessera.nn.modules import module as _module_mod
from tessera.nn.modules.module import Module
from tessera.ops.random import default_generator

__all__ = ["Graph", "GraphConfig", "GraphModule"]

_SUPPORTED_OPTIMIZERS = ("SGD", "Adam", "AdamW")


class GraphConfig:
    """``graph.config``: OneFlow's switches (those that change what runs here)."""

    def __init__(self):
        self.gradient_accumulation_steps = 1
        # None: the default pipeline (tessera.graph.passes.PIPELINE, the 1F1B schedule
        # first and the bucketing of collectives last); else a list of pass names
        self.passes = None
        self.zero_stage = 0
        self.zero_shard_min_size = 1024
        self.bucket_cap_mb = 25.0
        self.backend = "tessera"
        self.backend_options: dict = {}
        self.remat = None   # tessera.graph.passes.remat.RematConfig (enable_remat)
        self.auto_parallel: dict | None = None   # enable_auto_parallel's settings

    def set_backend(self, name: str = "tessera", *, strict: bool = False, **options) -> None:
        """Which compiler runs the graph after tessera's passes: ``"tessera"`` (its own
        executor and code generator, the default), ``"xla"`` (JAX) or ``"tvm"`` (TVM
        Relax); ``tessera.compiler`` registers the others. Ops without a rule for the
        backend run on tessera's executor between the backend's clusters (``debug()``
        prints the cut); ``strict=True`` raises naming them instead. ``options`` go to the
        backend (TVM: ``tune_trials=64`` tunes with MetaSchedule within that budget).

        >>> g = Graph()
        >>> g.config.set_backend("xla")
        >>> g.config.backend
        'xla'
        """
        if name != "tessera" and name not in _BACKENDS:
            raise ValueError(f"nn.Graph.config.set_backend: unknown backend {name!r} "
                             f"(known: {', '.join(['tessera'] + sorted(_BACKENDS))})")
        self.backend = name
        self.backend_options = dict(options, strict=bool(strict))

    def set_bucket_cap_mb(self, mb: float) -> None:
        """Merge the all-reduces of global gradients into buckets of up to ``mb`` MB (DDP's
        ``bucket_cap_mb``, default 25; 0 turns bucketing off): the pass ``bucket_all_reduces``.
        Set it before the first call (a compiled step keeps its buckets).

        >>> Graph().config.set_bucket_cap_mb(0)  # one all-reduce per gradient
        """
        if not isinstance(mb, (int, float)) or mb < 0:
            raise ValueError(f"bucket_cap_mb must be a non-negative number, got {mb!r}")
        self.bucket_cap_mb = float(mb)

    def set_gradient_accumulation_steps(self, n: int) -> None:
        """Split each input batch into ``n`` micro-batches whose gradients are summed
        before one optimizer step (the loss returned is the micro-batch mean)."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"gradient accumulation steps must be a positive int, got {n!r}")
        self.gradient_accumulation_steps = n

    def enable_zero(self, mode: bool = True, *, stage: int = 1, shard_min_size: int = 1024,
                    shard_restore_level: int = 1) -> None:
        """OneFlow's ZeRO for data-parallel global parameters: the optimizer state (stage
        1), the gradients from backward on (stage 2), and the parameters themselves
        between steps (stage 3: all-gathered for each step) split over the ranks;
        parameters of fewer than ``shard_min_size`` elements stay whole."""
        if not mode:
            self.zero_stage = 0
            return
        if stage not in (1, 2, 3):
            raise ValueError(f"nn.Graph.config.enable_zero: stage must be 1, 2 or 3, got "
                             f"{stage!r}")
        if not isinstance(shard_min_size, int) or shard_min_size < 1:
            raise ValueError("nn.Graph.config.enable_zero: shard_min_size must be a positive "
                             f"int, got {shard_min_size!r}")
        self.zero_stage = stage
        self.zero_shard_min_size = shard_min_size

    def enable_remat(self, mode: bool = True, *, budget: float | None = None,
                     budget_bytes: int | None = None, method: str = "milp",
                     time_limit: float = 30.0) -> None:
        """Recompute forward values for backward instead of keeping them, so the step's
        peak of live intermediates stays under ``budget`` (a fraction of the peak without
        remat) or ``budget_bytes``: the pass ``remat`` (``tessera.graph.passes.remat``)
        with ``method`` ``"milp"`` (SciPy's HiGHS, within ``time_limit`` seconds),
        ``"sqrt"`` or ``"greedy"``. ``memory_stats()`` reports the plan.

        >>> Graph().config.enable_remat(budget=0.5, method="greedy")
        """
        from tessera.graph.passes.remat import METHODS, RematConfig
        if not mode:
            self.remat = None
            return
        if (budget is None) == (budget_bytes is None):
            raise ValueError("nn.Graph.config.enable_remat: give exactly one of budget (a "
                             "fraction of the peak without remat) and budget_bytes")
        if budget is not None and not (isinstance(budget, (int, float)) and 0 < budget <= 1):
            raise ValueError(f"nn.Graph.config.enable_remat: budget must be in (0, 1], got "
                             f"{budget!r}")
        if budget_bytes is not None and (not isinstance(budget_bytes, int) or budget_bytes < 0):
            raise ValueError("nn.Graph.config.enable_remat: budget_bytes must be a "
                             f"non-negative int, got {budget_bytes!r}")
        if method not in METHODS:
            raise ValueError(f"nn.Graph.config.enable_remat: method must be one of "
                             f"{list(METHODS)}, got {method!r}")
        if not isinstance(time_limit, (int, float)) or time_limit <= 0:
            raise ValueError(f"nn.Graph.config.enable_remat: time_limit must be a positive "
                             f"number of seconds, got {time_limit!r}")
        self.remat = RematConfig(budget, budget_bytes, method, float(time_limit))

    def enable_auto_parallel(self, placement=None, *, memory_limit=None, solver: str = "ilp",
                             time_limit: float = 10.0, profile=None,
                             guard_steps: int = 32) -> None:
        """Let the first call choose how the step runs on ``placement``: each parameter's
        and input's SBP and whether optimizer state is sharded (ZeRO), by the cost model
        and search of ``tessera.parallel.auto_parallel`` within ``memory_limit`` per rank
        (bytes or ``"8GB"``), with ``solver`` ``"ilp"`` (HiGHS, within ``time_limit``
        seconds), ``"dp"`` or ``"greedy"``. Inputs are ordinary tensors, the same on
        every rank. The first call also times the plan against data parallelism (when it
        is another) and the plans predicted close to it, alternating one step of each for
        at most ``guard_steps`` rounds (the trial steps' effects put back), and keeps
        another only if the plan is clearly slower (``guard_steps=0``: the prediction alone
        decides).
        ``parallel_plan()`` prints the plan; ``placement=None`` turns it off.

        >>> import tessera
        >>> Graph().config.enable_auto_parallel(tessera.placement("cpu", [0]),
        ...                                      memory_limit="1GB", solver="dp")
        """
        if placement is None:
            self.auto_parallel = None
            return
        if solver not in ("ilp", "dp", "greedy"):
            raise ValueError(f"nn.Graph.config.enable_auto_parallel: solver must be one of "
                             f"['ilp', 'dp', 'greedy'], got {solver!r}")
        if not isinstance(time_limit, (int, float)) or time_limit <= 0:
            raise ValueError("nn.Graph.config.enable_auto_parallel: time_limit must be a "
                             f"positive number of seconds, got {time_limit!r}")
        if not hasattr(placement, "hierarchy"):
            raise TypeError("nn.Graph.config.enable_auto_parallel: placement must be a "
                            f"tessera.placement, got {type(placement).__name__}")
        if not isinstance(guard_steps, int) or isinstance(guard_steps, bool) or guard_steps < 0:
            raise ValueError("nn.Graph.config.enable_auto_parallel: guard_steps must be a "
                             f"non-negative int, got {guard_steps!r}")
        self.auto_parallel = dict(placement=placement, memory_limit=memory_limit,
                                  solver=solver, time_limit=float(time_limit), profile=profile,
                                  guard_steps=guard_steps)

    def enable_amp(self, mode: bool = True) -> None:
        if mode:
            raise NotImplementedError("nn.Graph: automatic mixed precision is not supported")

    def allow_fuse_add_to_output(self, mode: bool = True) -> None:
        """Accepted for OneFlow compatibility; fusion is decided by the pass pipeline."""


_INPUT_TYPES = (Tensor, int, float, bool, str, type(None))


class _Compiled:
    """One traced and compiled step for one input signature."""

    # set by ``Graph._build_executor`` from the trace (``_Traced``)
    written: list
    in_args: list
    specs: list

    def __init__(self, ir, executor, tensors, new_state, n_outputs, treedef):
        self.remat_stats: dict = {}     # the remat pass's plan (config.enable_remat)
        self.ir = ir
        self.executor = executor
        self.tensors = tensors          # variable name -> the eager tensor it reads/writes
        self.new_state = new_state      # [(optimizer, param, key)] created by this step
        self.n_outputs = n_outputs
        self.treedef = treedef
        self.versions: list = []  # tensors whose values were folded in (``watch``)
        # what stale() compares: those tensors, their versions and counters then, and
        # DATA_SWAPS when their counters were last seen to be theirs
        self._checks: tuple = ([], [], [], 0)
        # the graph's module tree (Graph._tree's ids) when compiled, and the positions in it
        # of the tensors this step reads: replacing one of those makes the step stale
        self.tree: tuple = ((), ())
        self._names = list(tensors)
        self._tensors = list(tensors.values())
        self._local = not any(map(_is_global, self._tensors))
        self._arrays: list = []
        self._variables: dict = {}
        self.variable_ids: set = set()
        # every variable is watched (folded in, or a constant the passes made) and none is
        # written: a variable holding another array with the same values changes nothing,
        # and new values make the step stale, so its arrays are looked up once
        self.fixed = False

    def watch(self, tensors: list) -> None:
        """Make the step stale when one of ``tensors`` (folded into it) changes."""
        self.versions = tensors
        self._checks = (tensors, [t._version[0] for t in tensors],
                        [t._version for t in tensors], DATA_SWAPS[0])

    def stale(self) -> bool:
        tensors, folded, counters, swaps = self._checks
        # C-level passes over the counters alone (MobileNetV2 folds 262 tensors in): the
        # tensors themselves, cold in the cache after a step, are looked at only after a
        # ``t.data = ...`` somewhere
        if list(map(_first, counters)) != folded:
            return True
        if swaps != DATA_SWAPS[0]:
            if any(map(operator.is_not, map(_counter, tensors), counters)):
                return True
            self._checks = (tensors, folded, counters, DATA_SWAPS[0])
        return False

    def replaced(self, tree: tuple) -> bool:
        """Whether a submodule, or a module tensor this step reads, is another object in
        ``tree`` now."""
        old, used = self.tree
        if old is tree:
            return False
        if len(old) != len(tree) or any(old[k] != tree[k] for k in used):
            return True
        self.tree = (tree, used)  # the same tensors: no second look until the tree moves
        return False

    def variables(self) -> dict:
        """Each variable's array (a global tensor's tile) by name: the dict is made again
        only when a variable holds another array."""
        if self.fixed and self._arrays:
            return self._variables
        arrays = list(map(_data_of if self._local else _tile, self._tensors))
        if len(arrays) != len(self._arrays) or any(map(operator.is_not, arrays, self._arrays)):
            self._arrays = arrays
            self._variables = dict(zip(self._names, arrays))
            self.variable_ids = set(map(id, arrays))
        return self._variables


_first, _counter = operator.itemgetter(0), operator.attrgetter("_version")
_data_of = operator.attrgetter("_data")


def _tree(roots) -> tuple:
    """The ``training`` flags of ``roots`` and all their submodules, the ids
    of each module and its parameters and buffers, and where the modules' are among them,
    in one walk."""
    seen: set = set()
    modes: list[bool] = []
    ids: list[int] = []
    at: list[int] = []
    stack = list(roots)[::-1]
    while stack:
        m = stack.pop()
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        modes.append(m.training)
        at.append(len(ids))
        ids.append(id(m))
        ids.extend(map(id, m._parameters.values()))
        ids.extend(map(id, m._buffers.values()))
        stack.extend(list(m._modules.values())[::-1])
    return tuple(modes), tuple(ids), tuple(at)


def _modes(roots) -> tuple:
    """The ``training`` flags of ``roots`` and all their submodules, each module once, in
    ``Module.modules()``'s order."""
    return _tree(roots)[0]


class Graph:
    """Subclass, assign modules, optionally ``add_optimizer``, define ``build``, call."""

    # set in ``__init__`` through ``__dict__`` (``__setattr__`` wraps modules)
    _modules: OrderedDict[str, Module]
    _optimizers: list       # [(optimizer, lr_scheduler or None)]
    config: GraphConfig
    _cache: dict            # input signature -> _Compiled
    _last_key: Any
    _debug_log: list
    _debug_level: int
    _stages: dict[int, GraphModule]  # id(module) -> GraphModule (its stage, if any)
    _auto_plan: Any  # config.enable_auto_parallel's plan (tessera.parallel.auto_parallel.Plan)
    _tree_cache: tuple  # (TREE_EPOCH, modes, ids, the modules' places) as last walked
    _homes: dict  # ZeRO's gathered parameters' buffers, by layout

    def __init__(self):
        self.__dict__["_modules"] = OrderedDict()
        self.__dict__["_optimizers"] = []     # [(optimizer, lr_scheduler or None)]
        self.__dict__["config"] = GraphConfig()
        self.__dict__["_cache"] = {}
        self.__dict__["_last_key"] = None
        self.__dict__["_debug_log"] = []
        self.__dict__["_debug_level"] = -1
        self.__dict__["_stages"] = {}  # id(module) -> GraphModule (its stage, if any)
        self.__dict__["_auto_plan"] = None  # config.enable_auto_parallel's plan, once made
        # (TREE_EPOCH, modes, ids, the modules' places) as last walked (``_tree``)
        self.__dict__["_tree_cache"] = (-1, (), (), ())
        # ZeRO's gathered parameters' buffers, by layout (``graph_ops.home_variables``)
        self.__dict__["_homes"] = {}

    def __setattr__(self, name, value):
        _module_mod.TREE_EPOCH[0] += 1
        if isinstance(value, Module):
            self._modules[name] = value
            value = ProxyModule(value, self._stages)  # OneFlow's: .to(GraphModule) works
        object.__setattr__(self, name, value)

    # ---- the user API ---------------------------------------------------------------
    def build(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define build()")

    def add_optimizer(self, optim, *, lr_sch=None, is_sparse: bool = False) -> None:
        """Run ``optim``'s step (and ``lr_sch.step()`` after it) as part of every call."""
        name = type(optim).__name__
        if name not in _SUPPORTED_OPTIMIZERS:
            raise NotImplementedError(f"nn.Graph: the {name} optimizer cannot be traced yet; "
                                      f"supported: {', '.join(_SUPPORTED_OPTIMIZERS)}")
        if is_sparse:
            raise NotImplementedError("nn.Graph: sparse optimizer updates are not supported")
        self._optimizers.append((optim, lr_sch))

    @property
    def training(self) -> bool:
        return bool(self._optimizers)

    def __call__(self, *args):
        for a in args:
            if not isinstance(a, _INPUT_TYPES):
                raise TypeError(f"nn.Graph: inputs must be tensors or Python constants, got "
                                f"{type(a).__name__}")
        if self.config.auto_parallel is not None:
            args = self._auto_parallel(args)
        key = self._signature(args)
        compiled = self._cache.get(key)
        why = None
        if compiled is not None:
            if compiled.replaced(self._tree_cache[2]):
                why, compiled = "parameters, buffers or submodules replaced", None
            elif compiled.stale():
                why, compiled = "variables folded in at compile time changed", None
        if compiled is None:
            self._log_retrace(key, why)
            compiled = self._compile(args)
            _, _, tree, modules = self._tree()  # (as the compile left the modules)
            # (what it reads, and what it folded in)
            used = set(map(id, compiled.tensors.values())) | \
                set(map(id, compiled.versions))
            compiled.tree = (tree, tuple(sorted(
                set(modules) | {k for k, i in enumerate(tree) if i in used})))
            self._cache[key] = compiled
        self.__dict__["_last_key"] = key
        return self._run(compiled, args)

    # ---- signature and debug --------------------------------------------------------
    def _tree(self) -> tuple:
        """(TREE_EPOCH, modes, ids, the modules' places in ids) of the graph's modules
        (``_tree``): walked again only when a module tree changed since the last walk
        (``Module.__setattr__``, ``train()``...)."""
        t = self._tree_cache
        epoch = _module_mod.TREE_EPOCH[0]
        if t[0] != epoch:
            t = (epoch,) + _tree(self._modules.values())
            self.__dict__["_tree_cache"] = t
        return t

    def _signature(self, args) -> tuple:
        inputs = tuple((a._shape, a._dtype, a._device.type) + _global_key(a)
                       if isinstance(a, Tensor) else ("const", type(a).__name__, a)
                       for a in args)
        modes = self._tree()[1]
        state = tuple(tuple(sorted((id(p), tuple(sorted(st))) for p, st in opt.state.items()))
                      for opt, _ in self._optimizers)
        backend = (self.config.backend, tuple(sorted(self.config.backend_options.items())))
        return inputs, modes, state, D.get_default_dtype().name, backend

    def _auto_parallel(self, args) -> tuple:
        """The arguments as the auto-parallel plan takes them (the plan made and applied to
        the parameters on the first call)."""
        if not _AUTO:
            raise RuntimeError("nn.Graph.config.enable_auto_parallel: auto-parallel is "
                               "tessera.parallel's, which is not loaded")
        if self._auto_plan is None:
            settings = self.config.auto_parallel or {}
            plan = _AUTO[0](self, args, **settings)
            self.__dict__["_auto_plan"] = plan
            if self._debug_level >= 0:
                print(f"[nn.Graph {type(self).__name__}] {plan.table()}")
                for line in plan.explain():
                    print(f"[nn.Graph {type(self).__name__}] {line}")
        return self._auto_plan.inputs(args)

    def parallel_plan(self):
        """The auto-parallel plan (``config.enable_auto_parallel``), made on the first call:
        printed, a table of each node's signature, compute, bytes moved and memory, with
        the predicted step and memory per rank, the strategies it was compared with, the
        runner-up plans and what the measured guard timed."""
        if self._auto_plan is None:
            raise RuntimeError("nn.Graph.parallel_plan: no plan yet; enable it with "
                               "config.enable_auto_parallel(placement) and call the graph")
        return self._auto_plan

    def _log_retrace(self, key, why=None) -> None:
        if why is not None:
            pass
        elif self._last_key is None:
            why = "first call"
        else:
            old = self._last_key
            parts = [n for n, a, b in zip(("input shapes/dtypes", "train/eval modes",
                                           "optimizer state", "default dtype", "backend"),
                                          old, key)
                     if a != b]
            why = "changed: " + ", ".join(parts)
        self._debug_log.append(why)
        if self._debug_level >= 0:
            print(f"[nn.Graph {type(self).__name__}] tracing and compiling ({why})")

    def debug(self, v_level: int = 0) -> None:
        """Print why each compile happened (first call, or which part of the signature
        changed), from now on; ``debug_log()`` returns the history. With auto-parallel:
        the plan, each non-trivial choice beside the cost of its runner-up, and the runner-up
        plans the measured guard times."""
        self.__dict__["_debug_level"] = v_level
        if v_level >= 0 and self._auto_plan is not None:
            for line in self._auto_plan.explain():
                print(f"[nn.Graph {type(self).__name__}] {line}")

    def debug_log(self) -> list[str]:
        return list(self._debug_log)

    # ---- compile --------------------------------------------------------------------
    def _names(self) -> dict[int, str]:
        names: dict[int, str] = {}
        for prefix, mod in self._modules.items():
            for n, t in mod.named_parameters(remove_duplicate=True):
                names.setdefault(id(t), f"{prefix}.{n}")
            for n, b in mod.named_buffers(remove_duplicate=True):
                if b is not None:
                    names.setdefault(id(b), f"{prefix}.{n}")
        for k, (opt, _) in enumerate(self._optimizers):
            for p, st in opt.state.items():
                pname = names.get(id(p), f"param{id(p)}")
                for key, v in st.items():
                    if isinstance(v, Tensor):
                        names.setdefault(id(v), f"{pname}.{key}")
        return names

    def _compile(self, args) -> _Compiled:
        """Trace ``build()`` (and the optimizer step) on ``args``, run the pass pipeline on
        the IR, and build the executor."""
        ir = IRGraph()
        tracer = Tracer(ir, self._names())
        sym_args, in_args, lrs = self._graph_inputs(ir, tracer, args)
        params = self._trainable()
        zero = _zero(self, params)  # (stage 3 splits parameters and their state here)
        # other backends lower attention's parts (matmul, softmax...), not tessera's kernel
        fused = contextlib.nullcontext() if self.config.backend == "tessera" \
            else unfused_attention()
        with _TraceSandbox(self._optimizers, params) as sandbox:
            with tracer, _module_scopes(self, tracer), zero, fused:
                out = self._build_traced(sym_args, tracer)
                if self.config.auto_parallel is not None:
                    out = _whole(out)
                if self.training:
                    self._trace_step(tracer, lrs, zero)
            traced = _collect_outputs(ir, tracer, out, sym_args, in_args, self._optimizers)
        originals = {tracer.initial[k].name: t for k, t in tracer.tensors.items()}
        values = {name: _tile_tensor(t) for name, t in originals.items()}  # what passes read
        remat_stats = self._run_passes(ir, values, traced.n_outputs)
        tensors = {name: originals.get(name, values.get(name)) for name in ir.variables}
        compiled = self._build_executor(ir, traced, tensors, originals,
                                        sandbox.created(traced.new_state))
        compiled.remat_stats = remat_stats
        return compiled

    def _graph_inputs(self, ir: IRGraph, tracer: Tracer, args) -> tuple[list, list, list]:
        """build()'s symbolic arguments, which of ``args`` are graph inputs (a tile here),
        and each parameter group's lr as a graph input."""
        sym_args, in_args = [], []
        for i, a in enumerate(args):
            if isinstance(a, Tensor):
                s = _symbolic_input(ir, tracer, f"input{i}", a)
                if s._device.type != "global" or s._data.local is not None:
                    in_args.append(i)
                s._requires_grad = a._requires_grad  # build() may ask for input gradients
                sym_args.append(s)
            else:
                sym_args.append(a)
        # float64, like the Python floats eager mode computes the update's scalars in
        lrs = [ir.add_input(f"lr{k}.{j}", (), D.float64)
               for k, (opt, _) in enumerate(self._optimizers)
               for j in range(len(opt.param_groups))]
        return sym_args, in_args, lrs

    def _pipeline_stages(self) -> tuple:
        """(stage id, placement) of each module put on a pipeline stage."""
        return tuple((gm.stage_id, gm.placement) for gm in self._stages.values()
                     if gm.stage_id is not None)

    def _run_passes(self, ir: IRGraph, values: dict, n_outputs: int | None = None) -> dict:
        """The pass pipeline (``config.passes``, by default ``PIPELINE``), told what the
        graph's configuration means for it; returns the remat plan's statistics."""
        c = self.config
        # the step's forward is what build()'s results (the first n_outputs) depend on
        remat = None if c.remat is None else \
            dataclasses.replace(c.remat, stats={}, forward_outputs=n_outputs)
        run_pipeline(ir, c.passes, training=self.training, values=values,
                     stages=self._pipeline_stages(), micro_batches=c.gradient_accumulation_steps,
                     bucket_cap=int(c.bucket_cap_mb * 2 ** 20), remat=remat,
                     backend=c.backend)
        return {} if remat is None else remat.stats

    def _build_executor(self, ir: IRGraph, traced: _Traced, tensors: dict, originals: dict,
                        created: bool) -> _Compiled:
        # a step that creates optimizer state changes the signature (the state's keys are part
        # of it), so it runs once: generated C would be compiled for nothing (the CNN's
        # training graph spends seconds of a cold compile on it), and NumPy kernels run it
        if self.config.backend == "tessera":
            executor = None
            if not self.training and not created and not ir.assigns:
                # runs of nodes with C rules as one C call each (tessera.deploy registers it)
                executor = graph_backend.program(ir, tensors)
                if executor is not None and self._debug_level >= 0:
                    print(f"[nn.Graph {type(self).__name__}] {executor.describe()}")
            if executor is None:
                executor = Executor(ir, codegen=not created)
                if self.training and not created:
                    home_variables(ir.nodes, executor.plan.value_var, tensors, self._homes)
        else:
            make = _BACKENDS[self.config.backend]
            executor = make(ir, tensors, dict(self.config.backend_options))
            if self._debug_level >= 0 and hasattr(executor, "describe"):
                print(f"[nn.Graph {type(self).__name__}] {executor.describe()}")
        compiled = _Compiled(ir, executor, tensors, traced.new_state, traced.n_outputs,
                             traced.treedef)
        compiled.written = traced.written
        compiled.in_args = traced.in_args
        compiled.specs = traced.specs
        if not self.training:
            # inference graphs may fold variables into constants (conv+bn folding): a later
            # eager change to one of them makes this compiled step stale
            assigned = {name for name, _ in ir.assigns}
            compiled.watch([t for name, t in originals.items()
                            if name not in assigned and t._data is not None])
            watched = set(map(id, compiled.versions))
            compiled.fixed = compiled._local and not assigned and all(
                id(t) in watched or name not in originals for name, t in tensors.items())
        return compiled

    def _build_traced(self, sym_args, tracer):
        n = self.config.gradient_accumulation_steps
        if n == 1:
            return self.build(*sym_args)
        # micro-batches along dim 0; each builds and backwards, gradients accumulate
        parts = [_micro_batches(a, n) if isinstance(a, Tensor) else [a] * n
                 for a in sym_args]
        if any(len(p) != n for p in parts):
            raise ValueError(f"nn.Graph: a batch must split into {n} micro-batches")
        outs = []
        staged = bool(self._pipeline_stages())
        for i in range(n):
            if staged:
                tracer.stage = (i, "F")  # tags nodes for the pipeline schedule
            outs.append(self.build(*[p[i] for p in parts]))
        tracer.stage = None
        for p in self._trainable():  # OneFlow scales the summed gradients by 1/n
            if p._grad is not None:
                p._grad = p._grad / n
        flat = [_flatten(o) for o in outs]
        mean = [sum(f[0][j] for f in flat) / n for j in range(len(flat[0][0]))]
        return _unflatten(mean, flat[0][1])

    def _trainable(self) -> list[Tensor]:
        seen, out = set(), []
        for opt, _ in self._optimizers:
            for g in opt.param_groups:
                for p in g["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        out.append(p)
        return out

    def _trace_step(self, tracer: Tracer, lrs, zero) -> None:
        """The optimizer step on the traced gradients: clipping, then ``opt.step()`` with
        each group's lr a graph input (under ZeRO, on the parameters' shards)."""
        from tessera.nn.utils.clip_grad import clip_grad_norm_
        k = 0
        for opt, _ in self._optimizers:
            for g in opt.param_groups:
                g["lr"] = tracer.symbolic(lrs[k])
                k += 1
                if g.get("clip_grad_max_norm") is not None:
                    clip_grad_norm_(g["params"], g["clip_grad_max_norm"],
                                    g.get("clip_grad_norm_type", 2.0))
            prev = STATE.enabled
            try:
                with zero.sharded(opt):
                    opt.step()
            finally:
                STATE.enabled = prev

    # ---- run ------------------------------------------------------------------------
    def _run(self, c: _Compiled, args):
        inputs = [_tile(args[i]) for i in c.in_args]
        for opt, _ in self._optimizers:
            for g in opt.param_groups:
                lr = g["lr"]
                lr = lr.item() if isinstance(lr, Tensor) else lr
                inputs.append(np.asarray(lr, dtype=np.float64))
        variables = c.variables()
        with in_step():
            outs, assigns = c.executor.run(inputs, variables)
        for name, value in assigns:
            t = c.tensors[name]
            if value is not variables[name]:  # the plan may have computed it in place
                np.copyto(variables[name], value, casting="unsafe")
            t._version[0] += 1
        # an output the step allocated (or took from its recycler) is handed over as is;
        # one that may share memory with the arena, an input or a variable (a view, or the
        # array itself) is copied
        shared, held = set(map(id, inputs)), c.variable_ids
        owned = [o if type(o) is np.ndarray and (o.base is None or recycled(o))
                 and id(o) not in shared and id(o) not in held else np.array(o, copy=True)
                 for o in outs]
        results = _wrap_outputs(owned, c.specs)
        extra = results[c.n_outputs:]
        for i, r in zip(c.written, extra):
            np.copyto(_tile(args[i]), _tile(r), casting="unsafe")
            args[i]._version[0] += 1
        for (opt, p, key), r in zip(c.new_state, extra[len(c.written):]):
            opt.state[p][key] = r
        for opt, sched in self._optimizers:
            opt._opt_called = True
            if sched is not None:
                sched.step()
        outputs = results[:c.n_outputs]
        if self.config.auto_parallel is not None:  # ordinary tensors in, ordinary out
            outputs = [o.to_local() if _is_global(o) else o for o in outputs]
        return _unflatten(outputs, c.treedef)

    # ---- introspection and state ----------------------------------------------------
    def _current(self) -> _Compiled:
        if self._last_key is None:
            raise RuntimeError("nn.Graph: the graph has not been compiled yet; call it once")
        return self._cache[self._last_key]

    @property
    def ir(self) -> IRGraph:
        """The compiled IR of the most recent call's signature."""
        return self._current().ir

    def __repr__(self) -> str:
        head = f"{type(self).__name__}(nn.Graph, {'training' if self.training else 'eval'})"
        if self._last_key is None:
            return head + " [not compiled yet]"
        return f"{head}\n{self.ir}"

    def profile(self, *args, steps: int = 1) -> dict[str, float]:
        """Run ``steps`` calls of this graph on ``args`` and return the seconds spent in
        each op's kernels, by op name (``fused`` for generated kernels, ``matmul`` for
        BLAS), per step; the graph must have run on inputs like these before. Timing each
        kernel adds a little to every step. On another backend (``config.set_backend``) its
        compiled code is one entry under the backend's name ("tvm", "xla"), the ops left to
        tessera's executor by name.

        >>> import tessera
        >>> class G(tessera.nn.Graph):
        ...     def build(self, x):
        ...         return (x @ x).relu()
        >>> g, x = G(), tessera.ones(4, 4)
        >>> _ = g(x)
        >>> sorted(g.profile(x, steps=2))   # relu became a generated kernel
        ['fused', 'matmul']
        """
        c = self._current()

        def run():
            for _ in range(steps):
                self(*args)
        return {k: v / steps for k, v in c.executor.profile(run).items()}

    def memory_stats(self) -> dict:
        """Planned arena bytes, the naive sum of intermediates, and state bytes; the peak
        of live intermediates (``peak_bytes``, views sharing their base), the same without
        rematerialization, and the remat plan (``config.enable_remat``): the bytes of the
        forward values backward reads (saved activations) without it, its method,
        recomputed FLOPs, solver time and status, and the MILP's optimality gap. On another
        backend, which plans its own buffers, ``backend`` names it and the arena and plan
        fields count the ops left to tessera's executor only."""
        from tessera.graph.passes.remat import peak_bytes
        c = self._current()
        tiles = {n: _tile_tensor(t) for n, t in c.tensors.items()}  # this rank's share
        stats = c.executor.memory_stats(tiles, self._optimizers)
        peak = peak_bytes(c.ir)
        r = getattr(c, "remat_stats", {})
        stats.update(peak_bytes=peak, peak_bytes_no_remat=r.get("peak_bytes_no_remat", peak),
                     activation_bytes_no_remat=r.get("activation_bytes_no_remat"),
                     remat_method=r.get("method"), remat_budget_bytes=r.get("budget_bytes"),
                     recompute_flops=r.get("recompute_flops", 0),
                     recomputed_nodes=r.get("recomputed_nodes", 0),
                     remat_solver_time_s=r.get("solver_time_s", 0.0),
                     remat_status=r.get("status"), remat_optimality_gap=r.get("optimality_gap"))
        return stats

    def state_dict(self) -> dict:
        """The modules' state dicts under their attribute names, and each optimizer's."""
        out = {name: m.state_dict() for name, m in self._modules.items()}
        for k, (opt, sched) in enumerate(self._optimizers):
            out[f"_optimizer{k}"] = opt.state_dict()
            if sched is not None:
                out[f"_lr_scheduler{k}"] = sched.state_dict()
        return out

    def load_state_dict(self, state: dict) -> None:
        for name, m in self._modules.items():
            m.load_state_dict(state[name])
        for k, (opt, sched) in enumerate(self._optimizers):
            opt.load_state_dict(state[f"_optimizer{k}"])
            if sched is not None and f"_lr_scheduler{k}" in state:
                sched.load_state_dict(state[f"_lr_scheduler{k}"])
        self._cache.clear()  # optimizer state objects changed: retrace
        self.__dict__["_last_key"] = None


# ---- global tensors: inputs, outputs and variables are this rank's tiles ------------------

def _is_global(t: Tensor) -> bool:
    return t._device.type == "global"


def _global_key(t: Tensor) -> tuple:
    """The part of a global input's signature beyond shape and dtype."""
    return (t._data.placement, t._data.sbp) if _is_global(t) else ()


def _tile(t: Tensor):
    """The array the compiled step reads or writes for ``t`` (a global tensor's tile)."""
    return t._data.local if _is_global(t) else t._data


def _tile_tensor(t: Tensor) -> Tensor:
    """``t``, or for a global tensor its tile as a local tensor (sharing memory): what
    the passes fold and the memory statistics count."""
    if not _is_global(t) or t._data.local is None:
        return t
    return Tensor._from_numpy(t._data.local)


def _symbolic_input(ir: IRGraph, tracer: Tracer, name: str, a: Tensor) -> Tensor:
    """build()'s symbolic argument for ``a``: a graph input of its tile (a global tensor
    held elsewhere has none here)."""
    if not _is_global(a):
        return tracer.symbolic(ir.add_input(name, a._shape, a._dtype), a)
    from tessera.distributed.global_tensor import GlobalData
    from tessera.graph.trace import Symbol
    d = a._data
    local = None
    if d.local is not None:
        local = Symbol(ir.add_input(name, tuple(d.local.shape), a._dtype))
    return Tensor._make(GlobalData(local, d.placement, d.sbp, d.shape, d.dtype), a._dtype,
                        a._device, a._shape)


def _elsewhere(t: Tensor) -> bool:
    """A global tensor whose placement leaves this rank out (a later pipeline stage's)."""
    return _is_global(t) and t._data.local is None


def _add_output(ir: IRGraph, specs: list, t: Tensor) -> None:
    """``t`` becomes a graph output (unless it is held elsewhere), ``specs`` says how."""
    if not _is_global(t):
        ir.outputs.append(value_of(t))
        specs.append(None)
        return
    d = t._data
    specs.append((d.placement, d.sbp, d.shape, t._dtype, d.local is not None))
    if d.local is not None:
        ir.outputs.append(value_of(t))


def _wrap_outputs(arrays: list, specs: list) -> list[Tensor]:
    from tessera.distributed.global_tensor import make_global
    out, k = [], 0
    for spec in specs:
        if spec is None:
            out.append(Tensor._from_numpy(arrays[k]))
            k += 1
            continue
        placement, sbp, shape, dtype, here = spec
        out.append(make_global(arrays[k] if here else None, dtype, placement, sbp, shape))
        k += here
    return out


def _whole(out):
    """build()'s results with each global tensor broadcast (traced: the step converts them,
    a partial loss's all-reduce joining the gradients' bucket), so an auto-parallel graph,
    given ordinary tensors, returns every rank the whole values as ordinary tensors, as
    one process computes them."""
    flat, treedef = _flatten(out)
    return _unflatten([t.to_global(sbp=(Sbp.broadcast,) * t._data.placement.ndim)
                       if _is_global(t) else t for t in flat], treedef)


def _micro_batches(a: Tensor, n: int) -> list[Tensor]:
    """``a`` split into ``n`` micro-batches on dim 0. A batch split over data-parallel
    ranks is chunked on each rank (micro-batch k holds every rank's k-th chunk: no rows
    move, and the summed gradient is the same) when every tile divides evenly."""
    if _is_global(a) and a._data.sbp == (Sbp.split(0),):  # (a 1-D mesh)
        from tessera.distributed.global_tensor import _local_to_global
        from tessera.sbp import split_sizes
        d = a._data
        tiles = split_sizes(a._shape[0], d.placement.size)
        if all(t % n == 0 for t in tiles):
            local = a.to_local().chunk(n, 0) if d.local is not None else [a.to_local()] * n
            shape = (a._shape[0] // n,) + tuple(a._shape[1:])
            return [_local_to_global(t, d.placement, d.sbp, shape) for t in local]
    return list(a.chunk(n, 0))


# ---- compiler backends, by registration -----------------------------------------------------

_BACKENDS: dict = {}  # name -> make(ir, tensors, options) -> an executor (``run``)


def register_backend(name: str, make) -> None:
    """Let ``config.set_backend(name)`` compile graphs with ``make(ir, tensors, options)``:
    the IR after the passes, its variables' tensors by name, and ``set_backend``'s options;
    it returns an object with the executor's ``run(inputs, variables)``. ``tessera.compiler``
    registers ``xla`` and ``tvm``.

    >>> sorted(_BACKENDS)
    ['tvm', 'xla']
    """
    _BACKENDS[name] = make


# ---- auto-parallel, by registration ---------------------------------------------------------

_AUTO: list = []  # the registered planner (tessera.parallel.auto_parallel.plan_graph)


def register_auto_parallel(make) -> None:
    """Let ``make(graph, args, **settings)`` plan ``config.enable_auto_parallel`` on the
    first call and apply the plan to the graph's parameters; it returns the plan, whose
    ``inputs(args)`` converts each call's arguments. ``tessera.parallel`` registers it.

    >>> import tessera
    >>> _AUTO[0].__name__
    'plan_graph'
    """
    _AUTO[:] = [make]


# ---- ZeRO, by registration -----------------------------------------------------------------

_ZERO: list = []  # the registered ZeRO (tessera.parallel.graph_zero.GraphZero)


def register_zero(make) -> None:
    """Let ``make(stage, shard_min_size, params, optimizers)`` say what ZeRO changes in one
    trace of a training step (``config.enable_zero``): a context manager around the trace
    whose ``sharded(opt)`` is one around each optimizer step. ``tessera.parallel``
    registers its ``GraphZero``; without it only stage 0 (ZeRO off) compiles.

    >>> import tessera
    >>> _ZERO[0].__name__
    'GraphZero'
    """
    _ZERO[:] = [make]


class _NoZero:
    """ZeRO off, with no ZeRO registered: nothing changes in the trace."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def sharded(self, opt):
        return contextlib.nullcontext()


def _zero(graph: Graph, params):
    stage = graph.config.zero_stage
    if not _ZERO:
        if stage:
            raise RuntimeError("nn.Graph.config.enable_zero: ZeRO in nn.Graph is "
                               "tessera.parallel's, which is not loaded")
        return _NoZero()
    return _ZERO[0](stage, graph.config.zero_shard_min_size, params,
                    [opt for opt, _ in graph._optimizers])


# ---- one trace ------------------------------------------------------------------------------

class _TraceSandbox:
    """Tracing runs the user's step on symbolic values, which leaves marks on eager objects:
    the parameters' ``.grad``, the optimizers' state and lrs, the random generator's state
    (tracing must not consume random draws). Inside, each parameter starts without a
    gradient; afterwards all of it is as before, except concrete state the step created
    when the trace succeeded (``_restore_state``)."""

    def __init__(self, optimizers: list, params: list):
        self.optimizers = optimizers
        self.params = params

    def __enter__(self):
        self.grads = {id(p): p._grad for p in self.params}
        self.state = [{p: dict(st) for p, st in opt.state.items()} for opt, _ in
                      self.optimizers]
        self.lrs = [[g["lr"] for g in opt.param_groups] for opt, _ in self.optimizers]
        self.rng = default_generator.get_state()
        for p in self.params:
            p._grad = None
        return self

    def __exit__(self, exc_type, exc, tb):
        default_generator.set_state(self.rng)
        for p in self.params:
            p._grad = self.grads[id(p)]
        for (opt, _), st, lrs in zip(self.optimizers, self.state, self.lrs):
            _restore_state(opt, st, keep_concrete=exc_type is None)
            for g, lr in zip(opt.param_groups, lrs):
                g["lr"] = lr
        return False

    def created(self, new_state: list) -> bool:
        """Whether the traced step created optimizer state: a key in ``new_state`` (of
        ``(optimizer, param, key)``) that the state did not have before the trace."""
        before = {id(opt): st for (opt, _), st in zip(self.optimizers, self.state)}
        return any(key not in before[id(opt)].get(p, ()) for opt, p, key in new_state)


class _Traced(NamedTuple):
    """What the trace gives besides the IR: how its outputs become results."""

    n_outputs: int  # build()'s tensors; after them, the written inputs and new state
    treedef: object  # how build()'s result is rebuilt from its tensors
    specs: list  # how each graph output becomes a tensor (global metadata)
    in_args: list  # which arguments are graph inputs
    written: list  # the arguments build() wrote in place (written back after each run)
    new_state: list  # (optimizer, param, key) of the state the step creates


def _collect_outputs(ir: IRGraph, tracer: Tracer, out, sym_args: list, in_args: list,
                     optimizers: list) -> _Traced:
    """The IR's outputs: build()'s tensors, the arguments it wrote in place, the optimizer
    state the step created, and the effects nothing reads; and its assignments."""
    outs, treedef = _flatten(out)
    for o in outs:
        if not (isinstance(o, Tensor) and (is_symbolic(o) or _elsewhere(o))):
            raise GraphTraceError("nn.Graph: build() must return tensors computed "
                                  f"from its inputs (got {type(o).__name__})")
    ir.outputs = []
    specs: list = []
    for o in outs:
        _add_output(ir, specs, o)
    written = []  # in-place writes to build()'s inputs go back to the caller's tensors
    for i, v in zip(in_args, ir.inputs):
        sym = sym_args[i]
        if value_of(sym) is not v:
            written.append(i)
            _add_output(ir, specs, sym)
    new_state = []
    for opt, _ in optimizers:
        for p, st in opt.state.items():
            for key, v in list(st.items()):
                if is_symbolic(v):
                    new_state.append((opt, p, key))
                    _add_output(ir, specs, v)
    ir.outputs += tracer.effects  # sends: nothing reads them, the step must run them
    ir.assigns = tracer.updated()
    return _Traced(len(outs), treedef, specs, in_args, written, new_state)


def _restore_state(opt, saved: dict, keep_concrete: bool) -> None:
    """Undo what tracing ``opt.step()`` did to ``opt.state``: symbolic entries go (the
    graph's run supplies their values); concrete tensors the step created (a ``step``
    counter made from a Python number) stay when the trace succeeded, since the graph's
    assigns update them."""
    for p in list(opt.state):
        st = opt.state[p]
        old = saved.get(p)
        for key in list(st):
            v = st[key]
            if old is not None and key in old:
                st[key] = old[key]
            elif not keep_concrete or is_symbolic(v):
                del st[key]
        if not st and old is None:
            del opt.state[p]


class _module_scopes:
    """While tracing, each module call names the nodes it makes after its module path."""

    def __init__(self, graph: Graph, tracer: Tracer):
        self.stages = {k: gm for k, gm in graph._stages.items() if gm.placement is not None}
        self.paths: dict[int, str] = {}
        for prefix, mod in graph._modules.items():
            for n, m in mod.named_modules():
                self.paths.setdefault(id(m), f"{prefix}.{n}" if n else prefix)
        self.tracer = tracer

    def wrapper(self, module, call, args, kwargs):
        gm = self.stages.get(id(module))
        if gm is not None:  # a pipeline stage: its inputs move to its placement
            args = tuple(gm.to_stage(a) for a in args)
            kwargs = {k: gm.to_stage(v) for k, v in kwargs.items()}
        path = self.paths.get(id(module))
        if path is None:
            return call(*args, **kwargs)
        saved = self.tracer.scope
        self.tracer.scope = [path]
        try:
            return call(*args, **kwargs)
        finally:
            self.tracer.scope = saved

    def __enter__(self):
        _module_mod._CALL_WRAPPERS.append(self.wrapper)
        return self

    def __exit__(self, *exc):
        _module_mod._CALL_WRAPPERS.pop()
        return False


def _flatten(out):
    """Tensors of a (nested tuple/list/dict) build() result, and how to rebuild it."""
    if isinstance(out, Tensor):
        return [out], None
    if isinstance(out, (tuple, list)):
        flat, defs = [], []
        for o in out:
            f, d = _flatten(o)
            flat += f
            defs.append((len(f), d))
        return flat, (type(out), defs)
    if isinstance(out, dict):
        flat, dict_defs = [], []
        for k, o in out.items():
            f, d = _flatten(o)
            flat += f
            dict_defs.append((k, len(f), d))
        return flat, (dict, dict_defs)
    raise GraphTraceError(f"nn.Graph: build() returned a {type(out).__name__}; return "
                          "tensors (or tuples, lists, dicts of them)")


def _unflatten(flat, treedef):
    if treedef is None:
        return flat[0]
    kind, defs = treedef
    out, i = [], 0
    if kind is dict:
        res = {}
        for k, n, d in defs:
            res[k] = _unflatten(flat[i:i + n], d)
            i += n
        return res
    for n, d in defs:
        out.append(_unflatten(flat[i:i + n], d))
        i += n
    # a tuple subclass (the namedtuples of max/min, topk's values-indices pair) takes fields
    return kind(out) if kind in (tuple, list) else kind(*out)

