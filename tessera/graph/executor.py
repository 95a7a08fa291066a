"""The compiled executor: a graph lowered once to a flat list of kernel calls.

Everything eager dispatch decides per call (infer, promotion casts, which kernel, autograd,
Tensor objects) is decided here once, at compile time; a step is then a loop of direct
kernel calls on NumPy arrays held in numbered slots. Each intermediate is dropped after its
last use. Kernels with an ``out``-form (``OpDef.inplace_kernels``) write into buffers of
the memory plan's arena (``tessera.graph.memory``) instead of allocating.

>>> import tessera
>>> from tessera.graph.trace import trace
>>> g, _ = trace(lambda x: (x * 2).exp(), tessera.zeros(2))
>>> Executor(g).run([tessera.zeros(2)._data], {})[0][0]
array([1., 1.], dtype=float32)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import kernel_plan
from tessera.autograd import profiler as _profiler
from tessera.graph import backend
from tessera.graph.ir import Graph, IRError, Value
from tessera.graph.recycle import MIN_BYTES, Recycler
from tessera.ops.random import fresh_seed
from tessera.ops.registry import Meta

__all__ = ["Executor", "compile_kernel"]


def _reshape(x, shape):
    # a view when the layout allows, else a copy: the graph is functional, so both are right
    return np.reshape(x, shape)


_OVERRIDES = {"view": _reshape}


def compile_kernel(node) -> tuple:
    """(function, cast dtypes per input) for ``node`` on the CPU, as dispatch would pick."""
    op = node.op
    metas = [Meta(v.shape, v.dtype) if isinstance(v, Value) else v for v in node.inputs]
    if node.op.name in _OVERRIDES:
        return _OVERRIDES[node.op.name], [None] * len(metas)
    kernel = op.kernels.get("cpu")
    if kernel is None:
        raise IRError(f"op '{op.name}' has no CPU kernel")
    kernel, ct = kernel_plan(op, metas, kernel)  # the choice dispatch makes, made once
    casts = [ct if ct is not None and type(m) is Meta and m.dtype.np != ct else None
             for m in metas]
    return kernel, casts


def out_form(node, kernel, casts):
    """``fn(out, *args, **attrs)`` writing ``node``'s single output into ``out``, or None.
    An op with the trait ``out_form`` has one as its ``inplace_kernels`` entry (it computes
    from its arguments only; checked against the kernels on the op-info samples), usable
    when the node's inputs need no casts."""
    if len(node.outputs) != 1 or any(c is not None for c in casts):
        return None
    out = node.outputs[0]
    tensors = [v for v in node.inputs if isinstance(v, Value)]
    if out.dtype not in (D.float32, D.float64) or any(v.dtype is not out.dtype
                                                     for v in tensors):
        return None
    name = node.op.name
    if "out_form" in node.op.traits:
        fn = node.op.inplace_kernels["cpu"]
        bind = getattr(fn, "bind", None)
        if bind is None:
            return fn
        # an out-form that plans once for fixed metas (a C kernel's blocking):
        # bind(*input metas, output meta, **attrs) -> fn(out, *args), ``bound_attrs``
        metas = [Meta(v.shape, v.dtype) if isinstance(v, Value) else v for v in node.inputs]
        return bind(*metas, Meta(out.shape, out.dtype), **node.attrs)
    if isinstance(kernel, np.ufunc) and kernel.nout == 1 and not node.attrs:
        return lambda t, *a: kernel(*a, out=t)
    if name == "matmul" and all(len(v.shape) >= 2 for v in tensors):
        from tessera.ops.linalg import _matmul_kernel

        def matmul_into(t, a, b):
            _matmul_kernel(a, b, out=t)
        # a GEMM reads all of its operands while writing: over a dying operand's buffer,
        # NumPy would copy that operand first and the batched C path would decline
        matmul_into.reads_around = True  # type: ignore[attr-defined]  # read by getattr
        return matmul_into
    if name == "conv":
        from tessera.ops.conv import conv_into_bound
        x, w, b = (Meta(v.shape, v.dtype) if isinstance(v, Value) else v
                   for v in node.inputs)
        return conv_into_bound(x, w, b, Meta(out.shape, out.dtype), **node.attrs)
    return None


class Executor:
    """Runs a graph: ``run(input arrays, variable arrays) -> (outputs, assigned values)``.

    ``plan=False`` turns the memory plan off (every kernel allocates), for comparison;
    ``codegen=False`` runs fused regions with their NumPy reference kernels.
    """

    def __init__(self, g: Graph, plan: bool = True, codegen: bool = True):
        from tessera.graph.memory import aligned_bytes, plan_memory
        self.graph = g
        slot: dict[int, int] = {}

        def slot_of(v: Value) -> int:
            if id(v) not in slot:
                slot[id(v)] = len(slot)
            return slot[id(v)]

        self.input_slots = [slot_of(v) for v in g.inputs]
        self.var_slots = [(name, slot_of(v)) for name, v in g.variables.items()]
        compiled = [compile_kernel(n) for n in g.nodes]
        outs_fn = [out_form(n, fn, casts) for n, (fn, casts) in zip(g.nodes, compiled)]
        self.generated = _generate(g) if codegen else {}
        for i, n in enumerate(g.nodes):
            if n in self.generated:  # a fused region compiled to C
                outs_fn[i] = self.generated[n]
                compiled[i] = (_allocating(outs_fn[i], n.outputs), compiled[i][1])
        self.planned = plan
        # outputs written straight into the buffer their reader copies them into (a
        # collective's bucket): not the arena's
        self.buffered = _buffered(g, outs_fn) if plan else {}
        unplanned = frozenset(id(g.nodes[i].outputs[k])
                              for i, places in self.buffered.items() for k in places)
        # nodes whose results may go straight into the variables they are assigned to:
        # planned so where the plan puts every result into its variable, else not at all
        into_vars = {i for i, n in enumerate(g.nodes) if "into_variables" in n.op.traits
                     and len(n.outputs) > 1 and all(c is None for c in compiled[i][1])} \
            if plan else set()
        around = frozenset(i for i, f in enumerate(outs_fn) if getattr(f, "reads_around", False))
        while True:
            self.plan = plan_memory(
                g, {i for i, f in enumerate(outs_fn) if f is not None or i in into_vars}
                if plan else set(), around,
                inplace_inputs={i: frozenset(f.inplace_inputs) for i, f in enumerate(outs_fn)
                                if getattr(f, "inplace_inputs", None)}, unplanned=unplanned)
            partly = {i for i in into_vars
                      if not all(id(v) in self.plan.value_var for v in g.nodes[i].outputs)}
            if not partly:
                break
            into_vars -= partly
        for i in into_vars:
            outs_fn[i] = g.nodes[i].op.inplace_kernels["cpu"]
        self._into_variables(around)
        self._buffered_values = {id(g.nodes[i].outputs[k]): place for i, places in
                                 self.buffered.items() for k, (_, place) in places.items()}
        self.arena = aligned_bytes(self.plan.arena_bytes)
        last_use = _last_uses(g)
        steps = []
        for i, n in enumerate(g.nodes):
            fn, casts = compiled[i]
            template: list | None = [None if isinstance(v, Value) else v for v in n.inputs]
            reads: tuple = tuple((k, slot_of(v), casts[k]) for k, v in enumerate(n.inputs)
                                 if isinstance(v, Value))
            if len(reads) == len(n.inputs) and all(c is None for _, _, c in reads):
                template, reads = None, tuple(s for _, s, _ in reads)  # slots, in order
            outs = tuple((slot_of(v), v.dtype.np) for v in n.outputs)
            multi = _is_multi(n)
            frees = tuple(slot[id(v)] for v in _dying(n, i, last_use))
            dest = self._destination(i, n, outs_fn[i], slot_of)
            attrs = n.attrs
            if dest is not None and getattr(dest[0], "bound_attrs", False):
                attrs = {}  # fixed at compile time in the bound kernel
            steps.append((fn, template, reads, attrs, outs, frees, n, dest, multi,
                          "seed" in attrs))
        self.steps = steps
        self.output_slots = [slot_of(v) for v in g.outputs]
        self.assign_slots = [(name, slot_of(v)) for name, v in g.assigns]
        self.n_slots = len(slot)

    def _into_variables(self, around: frozenset) -> None:
        """Turn the buffered places with an ``output`` (``OpDef.input_buffers``) whose
        reader writes that result into a variable into ``_IntoVariable`` places, where
        nothing reads the variable after the producer (which writes it early) and the
        producer's kernel does not read around what it writes."""
        from tessera.graph.memory import _buffer_ends, _roots
        g, plan = self.graph, self.plan
        end = None
        for i, places in self.buffered.items():
            for k, (j, place) in places.items():
                out = getattr(place, "output", None)
                if out is None or i in around:
                    continue
                reader = g.nodes[j]
                result = reader.outputs[out[0]]
                name = plan.value_var.get(id(result)) if len(reader.outputs) > 1 else \
                    plan.into_var.get(j)
                if name is None:
                    continue
                if end is None:
                    end = _buffer_ends(g, _roots(g))
                if end.get(id(g.variables[name]), -1) <= i:
                    v = g.nodes[i].outputs[k]
                    places[k] = (j, _IntoVariable(name, out[1], v.shape, v.dtype.np))

    def _destination(self, i, n, fn, slot_of):
        """Where node i writes: (out-form, kind, where) with kind "arena" (a fixed view),
        "slot" (an input's buffer, in place), "var" (a variable's array), "fresh" (a
        large output the step returns, from its ``Recycler``; or its place in the buffer of
        the node that reads it, ``OpDef.input_buffers``) or "into" (where its reader puts
        it in a variable, ``_IntoVariable``); or None."""
        plan = self.plan
        if fn is not None and len(n.outputs) > 1:
            return fn, "multi", tuple(self._place(v, slot_of) for v in n.outputs)
        if i in self.buffered:
            place = self.buffered[i][0][1]
            return fn, "into" if type(place) is _IntoVariable else "fresh", place
        if i in plan.into_var:
            return fn, "var", plan.into_var[i]
        if i in plan.inplace:
            return fn, "slot", slot_of(n.inputs[plan.inplace[i]])
        v = n.outputs[0] if len(n.outputs) == 1 else None
        if v is not None and id(v) in plan.offsets:
            off = plan.offsets[id(v)]
            view = self.arena[off:off + v.nbytes].view(v.dtype.np).reshape(v.shape)
            return fn, "arena", view
        if fn is not None and self.planned and v is not None and v.nbytes >= MIN_BYTES \
                and any(v is o for o in self.graph.outputs):
            return fn, "fresh", Recycler(v.shape, v.dtype.np)
        return None

    def _place(self, v, slot_of) -> tuple:
        """(kind, where) of one output of a node with several: "var", "slot", "arena",
        "fresh" and "into" as in ``_destination``; "new" (an array made each step, its
        shape and dtype) for an output the plan left out (a step result, an empty one)."""
        plan, n = self.plan, v.producer
        place = self._buffered_values.get(id(v))
        if place is not None:
            return "into" if type(place) is _IntoVariable else "fresh", place
        if id(v) in plan.value_var:
            return "var", plan.value_var[id(v)]
        if id(v) in plan.value_inplace:
            return "slot", slot_of(n.inputs[plan.value_inplace[id(v)]])
        if id(v) in plan.offsets:
            off = plan.offsets[id(v)]
            return "arena", self.arena[off:off + v.nbytes].view(v.dtype.np).reshape(v.shape)
        return "new", (v.shape, v.dtype.np)

    def run(self, inputs: list, variables: dict):
        session = _profiler.ACTIVE
        if session is not None:  # a profile records: each kernel timed (one check a step)
            return self._run_recorded(session, inputs, variables)
        return self._execute(self.steps, inputs, variables)

    def _execute(self, steps: list, inputs: list, variables: dict):
        env: list = [None] * self.n_slots
        seeds: dict = {}  # traced seed -> this step's seed (forward and backward agree)
        for s, a in zip(self.input_slots, inputs):
            env[s] = a
        for name, s in self.var_slots:
            env[s] = variables[name]
        for fn, template, reads, attrs, outs, frees, node, dest, multi, seeded in steps:
            if template is None:
                args = [env[s] for s in reads]
            else:
                args = list(template)
                for k, s, cast in reads:
                    a = env[s]
                    args[k] = a if cast is None else a.astype(cast)
            if seeded:  # dropout masks: a fresh seed every step, as eager draws
                traced = attrs["seed"]
                if traced not in seeds:
                    seeds[traced] = fresh_seed()
                attrs = {**attrs, "seed": seeds[traced]}
            try:
                if dest is not None:
                    ofn, kind, where = dest
                    if kind == "multi":
                        out = tuple(w if k == "arena" else env[w] if k == "slot" else
                                    variables[w] if k == "var" else np.empty(*w) if k == "new"
                                    else w.take() if k == "fresh" else w.take(variables, args)
                                    for k, w in where)
                        ofn(out, *args, **attrs)
                        for (s, _), o in zip(outs, out):
                            env[s] = o
                    else:
                        out = where if kind == "arena" else env[where] if kind == "slot" \
                            else variables[where] if kind == "var" else where.take() \
                            if kind == "fresh" else where.take(variables, args)
                        ofn(out, *args, **attrs)
                        env[outs[0][0]] = out
                    res: Any = None
                else:
                    res = fn(*args, **attrs)
            except Exception as e:
                raise type(e)(f"{node.op.name} ({node.name or 'graph'}): {e}") from e
            if res is not None or dest is None:
                if not multi:
                    res = (res,)
                for (s, dt), r in zip(outs, res):
                    if type(r) is not np.ndarray:
                        r = np.asarray(r)
                    if r.dtype != dt:
                        r = r.astype(dt)
                    env[s] = r
            for s in frees:
                env[s] = None
        return [env[s] for s in self.output_slots], [(n, env[s]) for n, s in self.assign_slots]

    def _wrap_steps(self, wrap) -> list:
        """The steps with each kernel, and each out-form kernel, replaced by
        ``wrap(fn, node, allocates)`` (``allocates``: the kernel returns new arrays)."""
        return [(wrap(fn, n, True), tpl, reads, attrs, outs, frees, n,
                 dest if dest is None else (wrap(dest[0], n, False),) + dest[1:], multi,
                 seeded)
                for fn, tpl, reads, attrs, outs, frees, n, dest, multi, seeded in self.steps]

    def _run_recorded(self, session, inputs: list, variables: dict):
        """``run`` with each kernel recorded in the profiler's ``session`` under its node's
        module path (``tessera::<op>`` for nodes outside any module), the step as a
        whole as ``nn.Graph``."""
        clock = _profiler._clock

        def recorded(fn, node, allocates: bool):
            name = node.name or f"tessera::{node.op.name}"
            info = {"op": node.op.name}

            def call(*args, **attrs):
                t0 = clock()
                res = fn(*args, **attrs)
                nbytes = 0
                if allocates and session.profile_memory:
                    nbytes = sum(r.nbytes for r in (res if type(res) is tuple else (res,))
                                 if isinstance(r, np.ndarray))
                session.block(name, t0, clock(), "cpu_op", nbytes, info)
                return res
            return call
        steps = self._wrap_steps(recorded)
        if session.in_graph:  # a fused region's reference graph, inside a kernel's span
            return self._execute(steps, inputs, variables)
        session.in_graph = True
        t0 = clock()
        try:
            return self._execute(steps, inputs, variables)
        finally:
            session.in_graph = False
            session.block("nn.Graph", t0, clock(), "user_annotation")

    def profile(self, run) -> dict[str, float]:
        """Seconds spent in each op's kernels (by op name; ``fused`` for generated ones)
        while ``run()`` executes steps of this executor; the steps are timed one by one
        for the call only.

        >>> import tessera
        >>> from tessera.graph.trace import trace
        >>> g, _ = trace(lambda x: (x * 2).exp(), tessera.zeros(2))
        >>> ex = Executor(g)
        >>> sorted(ex.profile(lambda: ex.run([tessera.zeros(2)._data], {})))
        ['exp', 'mul']
        """
        import time
        spent: dict[str, float] = {}

        def timed(fn, name):
            def call(*args, **attrs):
                t0 = time.perf_counter()
                try:
                    return fn(*args, **attrs)
                finally:
                    spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
            return call
        steps = self.steps
        self.steps = self._wrap_steps(lambda fn, node, allocates: timed(fn, node.op.name))
        try:
            run()
        finally:
            self.steps = steps
        return spent

    def memory_stats(self, tensors: dict, optimizers=()) -> dict:
        """Bytes: the arena, the sum of all intermediates (what a step without reuse would
        allocate), the planned buffers' sum, the peak of intermediates alive at once, and
        the persistent variables."""
        g = self.graph
        last = _last_uses(g)
        alive, peak = 0, 0
        for i, n in enumerate(g.nodes):
            alive += sum(v.nbytes for v in n.outputs)
            peak = max(peak, alive)
            alive -= sum(v.nbytes for v in _dying(n, i, last))
        params = sum(t.numel() * t.dtype.itemsize for t in tensors.values())
        return {"arena_bytes": self.plan.arena_bytes,
                "intermediate_bytes_naive": self.plan.naive_bytes,
                "planned_bytes": self.plan.planned_bytes,
                "intermediate_bytes_peak": peak, "variable_bytes": params,
                "inplace_nodes": len(self.plan.inplace) + len(self.plan.value_inplace),
                "written_into_variables": len(self.plan.into_var) + len(self.plan.value_var)}


def _generate(g: Graph) -> dict:
    """{fused node: C kernel ``fn(out, *arrays)``} when code generation is on."""
    fused = [n for n in g.nodes if n.op.name == "fused"]
    if not fused:
        return {}
    return backend.compile_fused(fused)


def _allocating(fn, vs: list):
    """``fn(out, *args)`` as a kernel that returns new arrays (``out``: one array, or a
    tuple of them for several outputs ``vs``)."""
    types = [(v.shape, v.dtype.np) for v in vs]
    if len(types) > 1:
        def multi(*args, **attrs):
            outs = tuple(np.empty(shape, dtype) for shape, dtype in types)
            fn(outs, *args)
            return outs
        return multi
    shape, dtype = types[0]

    def kernel(*args, **attrs):
        out = np.empty(shape, dtype)
        fn(out, *args)
        return out
    return kernel


def _is_multi(n) -> bool:
    """Whether the op returns a tuple of outputs (even a tuple of one, like a split into
    one piece)."""
    metas = [Meta(v.shape, v.dtype) if isinstance(v, Value) else v for v in n.inputs]
    return type(n.op.infer(*metas, **n.attrs)) is tuple


class _IntoVariable:
    """Where a producer writes a result that its reader puts into variable ``name`` at a
    flat ``offset`` (``OpDef.input_buffers``: ZeRO's updated shard, this rank's rows of its
    parameter): ``take(variables, args)`` is that part of the variable's array, or a new
    array when the array is not one block of the result's dtype, or when an argument of
    the producer overlaps it other than exactly (an elementwise kernel may write over
    what it reads only element for element)."""

    def __init__(self, name: str, offset: int, shape: tuple, dtype):
        self.name, self.offset, self.shape, self.dtype = name, offset, shape, np.dtype(dtype)
        self.stop = offset + int(np.prod(shape, dtype=np.int64))

    def take(self, variables: dict, args) -> np.ndarray:
        a = variables[self.name]
        if a.dtype == self.dtype and a.flags.c_contiguous and self.stop <= a.size:
            out = a.reshape(-1)[self.offset:self.stop].reshape(self.shape)
            if all(type(x) is not np.ndarray or not np.may_share_memory(x, out) or
                   (x.ctypes.data == out.ctypes.data and x.strides == out.strides and
                    x.shape == out.shape) for x in args):
                return out
        return np.empty(self.shape, self.dtype)


def _buffered(g: Graph, outs_fn: list) -> dict:
    """{producer index: {output position: (reader index, place)}} for node outputs that
    may be written where their reader would copy them (``OpDef.input_buffers``): made by
    an out-form kernel, read by that node once, by no view and by nothing after it (the
    reader may overwrite its buffer), and neither returned nor assigned."""
    index = {id(n): i for i, n in enumerate(g.nodes)}
    readers: dict[int, list] = {}
    for j, n in enumerate(g.nodes):
        for v in n.inputs:
            if isinstance(v, Value):
                readers.setdefault(id(v), []).append(j)
    live = {id(v) for v in g.live_roots()}
    out: dict[int, dict] = {}
    for j, n in enumerate(g.nodes):
        if n.op.input_buffers is None:
            continue
        metas = [Meta(v.shape, v.dtype) if isinstance(v, Value) else v for v in n.inputs]
        for v, place in zip(n.inputs, n.op.input_buffers(*metas, **n.attrs)):
            i = index.get(id(v.producer)) if isinstance(v, Value) and v.producer else None
            if place is None or i is None or outs_fn[i] is None or id(v) in live or \
                    v.nbytes == 0:
                continue
            others = [k for k in readers[id(v)] if k != j]
            if readers[id(v)].count(j) == 1 and all(
                    k < j and g.nodes[k].op.aliasing == "none" for k in others):
                k = next(k for k, o in enumerate(v.producer.outputs) if o is v)
                out.setdefault(i, {})[k] = (j, place)
    return out


def _last_uses(g: Graph) -> dict[int, int]:
    """id(value) -> index of the last node reading it (values the step returns never die)."""
    last: dict[int, int] = {}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            if isinstance(v, Value):
                last[id(v)] = i
    for v in g.live_roots():
        last[id(v)] = len(g.nodes)
    return last


def _dying(n, i: int, last: dict[int, int]) -> list[Value]:
    seen, out = set(), []
    for v in n.inputs:
        if isinstance(v, Value) and v.kind == "node" and last.get(id(v)) == i and \
                id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    for v in n.outputs:  # produced but never read
        if id(v) not in last:
            out.append(v)
    return out
