"""The loop IR: what a fused region becomes before it is C, and its rendering table.

A kernel is a ``Func`` over ``Param`` buffers whose body nests ``Loop``s around the element
program: ``Load`` each input element, ``Let`` one value per body node (the expression comes
from the op's ``to_c`` rule), ``Store`` the result. Each IR kind renders through one entry
of ``RENDER`` (STYLE rule 3: rules as a table per node kind).

Every region becomes two functions:

* ``<name>_c`` for inputs that are C-contiguous in their own shape (the common case): the
  index space is collapsed to as few loops as the broadcast pattern allows, so the inner
  loop reads each input with stride 1 or 0 and vectorises;
* ``<name>_s`` for any strides (transposed, sliced, flipped views): one loop per output
  dimension, each input indexed through strides passed at run time.

The outermost loop of a large region is *split*: it runs over ``[lo, hi)``, arguments every
kernel takes, and the runtime calls the kernel on disjoint chunks from several threads
(``tessera.codegen.build``). Not OpenMP: a process that imported PyTorch first shares
PyTorch's OpenMP runtime, whose spinning threads starved BLAS (5x slower convolutions).

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%a: float32[4, 8], %b: float32[8]) {
...   %0: float32[4, 8] = add(%a, %b) {alpha=1}
...   %1: float32[4, 8] = relu(%0)
...   return (%1)
... }''')
>>> print(render(lower(g, "k")[0]))   # doctest: +ELLIPSIS
void k_c(float* out, const float* in0, const float* in1, int64_t lo, int64_t hi) {
  for (int64_t i0 = 0; i0 < 4; i0++) {
    #pragma omp simd
    for (int64_t i1 = 0; i1 < 8; i1++) {
      float v0 = in0[i0 * 8 + i1];
      float v1 = in1[i1];
      float v2 = (v0 + v1);
      float v3 = (v2 < 0 ? (float)0 : v2);
      out[i0 * 8 + i1] = v3;
    }
  }
}
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tessera.graph.ir import Graph, Value
from tessera.kernels.c_expr import CType, compute_dtype, exact_on_ints, is_logical
from tessera.kernels.threadpool import SPLIT_MIN

__all__ = ["Param", "Load", "Let", "Raw", "Store", "Loop", "If", "Func", "lower", "render",
           "RENDER", "worth_splitting", "supported", "iteration_shape", "jam", "out_params",
           "extra_targets", "side_sums", "side_chain", "core", "output_strides", "side_program",
           "side_init"]

DTYPES = frozenset({"float32", "float64", "bool", "int32", "int64"})


@dataclass
class Param:
    name: str
    ctype: str
    const: bool = True


@dataclass
class Load:
    var: str
    ctype: str
    buf: str
    index: str


@dataclass
class Let:
    var: str
    ctype: str
    expr: str


@dataclass
class Raw:
    text: str


@dataclass
class Store:
    buf: str
    index: str
    value: str


@dataclass
class Loop:
    var: str
    extent: int
    body: list
    parallel: bool = False         # runs over [lo, hi): the caller splits it across threads
    simd: bool = False
    reduction: str | None = None   # e.g. "+:a": the loop sums into scalar a ("max:m |:n": two)
    bounds: tuple[str, str] | None = None   # C expressions [start, stop) instead of 0/lo, extent/hi


@dataclass
class If:
    cond: str
    body: list


@dataclass
class Func:
    name: str
    params: list[Param]
    body: list = field(default_factory=list)

    @property
    def split(self) -> int | None:
        """The extent of the loop callers may split (run over chunks [lo, hi)), if any."""
        return next((s.extent for s in self.body if isinstance(s, Loop) and s.parallel), None)


# ---- rendering: one rule per IR kind -----------------------------------------------------

def _r_func(f: Func, ind: str) -> list[str]:
    params = ", ".join([f"{'const ' if p.const else ''}{p.ctype}* {p.name}" for p in f.params]
                       + ["int64_t lo", "int64_t hi"])
    lines = [f"{ind}void {f.name}({params}) {{"]
    for s in f.body:
        lines += RENDER[type(s)](s, ind + "  ")
    return lines + [f"{ind}}}"]


def _r_loop(loop: Loop, ind: str) -> list[str]:
    pragma = []
    if loop.reduction:   # one clause per space-separated "op:var"
        clauses = " ".join(f"reduction({r})" for r in loop.reduction.split())
        pragma = [f"{ind}#pragma omp simd {clauses}"]
    elif loop.simd:
        pragma = [f"{ind}#pragma omp simd"]
    v = loop.var
    lo, hi = loop.bounds or (("lo", "hi") if loop.parallel else ("0", loop.extent))
    lines = pragma + [f"{ind}for (int64_t {v} = {lo}; {v} < {hi}; {v}++) {{"]
    for s in loop.body:
        lines += RENDER[type(s)](s, ind + "  ")
    return lines + [f"{ind}}}"]


def _r_if(s: If, ind: str) -> list[str]:
    return [f"{ind}if ({s.cond}) {{"] + \
        [line for t in s.body for line in RENDER[type(t)](t, ind + "  ")] + [f"{ind}}}"]


RENDER: dict[type, Callable[[Any, str], list[str]]] = {
    Func: _r_func,
    Loop: _r_loop,
    If: _r_if,
    Load: lambda s, ind: [f"{ind}{s.ctype} {s.var} = {s.buf}[{s.index}];"],
    Let: lambda s, ind: [f"{ind}{s.ctype + ' ' if s.ctype else ''}{s.var} = {s.expr};"],
    Raw: lambda s, ind: [f"{ind}{s.text}"],
    Store: lambda s, ind: [f"{ind}{s.buf}[{s.index}] = {s.value};"],
}


def render(f: Func) -> str:
    """C source of one kernel."""
    return "\n".join(RENDER[type(f)](f, ""))


# ---- lowering ------------------------------------------------------------------------------

def side_sums(body: Graph) -> list:
    """The body's side sums: column sums (``tessera.graph.passes.fuse``) that no node of the
    body reads, which the kernel accumulates beside its result."""
    from tessera.graph.passes.fuse import is_column_sum
    if len(body.outputs) < 2:
        return []
    read = {id(v) for n in body.nodes for v in n.inputs if isinstance(v, Value)}
    return [v.producer for v in body.outputs[1:] if v.producer is not None and
            id(v) not in read and is_column_sum(v.producer, tuple(v.producer.inputs[0].shape))]


def core(body: Graph) -> Graph:
    """``body`` without its side sums and the nodes only they read (their values are
    computed where the sums accumulate): the nodes its other outputs need, its result
    last. The outputs stay all of the body's, in order (their buffers)."""
    sides = side_sums(body)
    if not sides:
        return body
    side_out = {id(n.outputs[0]) for n in sides}
    needed: set[int] = set()
    todo = [v for v in body.outputs if id(v) not in side_out]
    while todo:
        v = todo.pop()
        if id(v) in needed or v.producer is None:
            continue
        needed.add(id(v))
        todo += [a for a in v.producer.inputs if isinstance(a, Value)]
    nodes = [n for n in body.nodes if id(n.outputs[0]) in needed]
    return Graph(inputs=body.inputs, nodes=nodes, outputs=body.outputs)


def side_chain(body: Graph) -> list:
    """The nodes computing the side sums' inputs that ``body`` (a ``core``) leaves out,
    producers first."""
    inside = {id(n) for n in body.nodes}
    out: list = []
    seen: set[int] = set()

    def visit(n) -> None:
        if n is None or id(n) in inside or id(n) in seen:
            return
        seen.add(id(n))
        for a in n.inputs:
            if isinstance(a, Value):
                visit(a.producer)
        out.append(n)
    for n in side_sums(body):
        visit(n.inputs[0].producer)
    return out


def supported(body: Graph) -> str | None:
    """Why ``body`` cannot be lowered (None when it can)."""
    sides = side_sums(body)
    for n in sides:
        if n.outputs[0].dtype.name not in ("float32", "float64"):
            return f"a side sum of {n.outputs[0].dtype.name}"
    body = core(body)
    for v in [*body.inputs, *(o for n in body.nodes for o in n.outputs)]:
        if v.dtype.name not in DTYPES:
            return f"dtype {v.dtype.name} of %{v.name}"
    for k, n in enumerate(body.nodes):
        if n.op.name in REDUCE:
            if n.attrs.get("dtype") is not None or \
                    n.outputs[0].dtype.name not in ("float32", "float64"):
                return f"{n.op.name} with dtype={n.attrs.get('dtype')}"
            if k < len(body.nodes) - 1:
                from tessera.codegen.rowwise import check_rowwise
                why = check_rowwise(body)
                if why is not None:
                    return why
            continue
        if n.op.name in BROADCASTS:
            continue
        if n.op.to_c is None:
            return f"op '{n.op.name}' has no to_c rule"
        ints = [v for v in n.tensor_inputs + n.outputs if v.dtype.name in ("int32", "int64")]
        if ints and not exact_on_ints(n.op):
            return f"op '{n.op.name}' on integers"
        if "checked_value" in n.op.traits and n.outputs[0].dtype.category < 2 and \
                any(v.dtype.category >= 2 for v in n.tensor_inputs):
            return f"op '{n.op.name}' writing a floating value into an integer tensor"
        if len(n.outputs) != 1:
            return f"op '{n.op.name}' has {len(n.outputs)} outputs"
    return None


def _ctype(v) -> str:
    return CType.NAMES[v.dtype.name]


def _var_ctype(v) -> str:
    """The type of a variable holding an element of ``v``: a bool as a 32-bit int, the
    width of a float lane (an 8-bit bool beside float lanes makes the vectoriser pack and
    unpack: relu's backward ``(x > 0) * g`` ran 2.5x slower than ``relu(a + b)``)."""
    return "int32_t" if v.dtype.name == "bool" else CType.NAMES[v.dtype.name]


# views that a body may hold, each output element its input's broadcast element: the loads
# broadcast already (stride 0 along the dims the input lacks), so the value is the input's
BROADCASTS = frozenset({"expand"})


def node_expr(n, names: dict) -> str:
    """The C expression of elementwise node ``n`` over the variables ``names`` holds for
    its inputs (by id), converted to the op's compute type."""
    if n.op.name in BROADCASTS:
        return names[id(n.inputs[0])]
    out = n.outputs[0]
    tensor_dtypes = [a.dtype.name for a in n.inputs if isinstance(a, Value)]
    c = CType(compute_dtype(n.op, tensor_dtypes, out.dtype.name,
                            any(type(a) is float for a in n.inputs)))
    args = []
    for a in n.inputs:
        if isinstance(a, Value):
            var = names[id(a)]
            if a.dtype.name != c.dtype and not _no_convert(n.op):
                var = f"(({c.T}){var})"
            args.append(var)
        else:
            args.append(None if a is None else c.lit(a))
    return n.op.to_c(c, args, n.attrs)


def _element_program(body: Graph, index: list[str], out_index: str | None,
                     extra: dict | None = None) -> list:
    """Load, Let per node, Store (unless ``out_index`` is None): one element of the
    region; ``extra``: id(value) -> (buffer, index) of the other values it writes (a
    multi-output region's, stored after the result)."""
    stmts: list = []
    names: dict[int, str] = {}
    for k, v in enumerate(body.inputs):
        names[id(v)] = f"v{len(names)}"
        stmts.append(Load(names[id(v)], _var_ctype(v), f"in{k}", index[k]))
    for n in body.nodes:
        out = n.outputs[0]
        expr = node_expr(n, names)
        names[id(out)] = f"v{len(names)}"
        stmts.append(Let(names[id(out)], _var_ctype(out), expr))
    if out_index is not None:
        stmts.append(Store("out", out_index, names[id(body.outputs[0])]))
    for vid, (buf, idx) in (extra or {}).items():
        if vid in names:
            stmts.append(Store(buf, idx, names[vid]))
    if extra and side_sums(body):
        def value(v) -> str:   # a side sum's input: its chain computed here
            if id(v) not in names:
                args = {id(a): value(a) for a in v.producer.inputs if isinstance(a, Value)}
                names[id(v)] = f"v{len(names)}"
                stmts.append(Let(names[id(v)], _var_ctype(v), node_expr(v.producer, args)))
            return names[id(v)]
        def fresh() -> str:
            k = len(names)
            names[-1 - k] = f"v{k}"   # the name taken, under a key no value's id is
            return f"v{k}"
        stmts += side_program(body, [i for _, i in extra.values()], value, fresh)
    return stmts


def out_params(body: Graph) -> list[Param]:
    """The kernel's output buffers: ``out`` for the region's result, ``out1``... for the
    other values it writes (a multi-output region); a side sum's is the double partial sums
    of the rows one call runs over (the caller adds those of its calls)."""
    sides = {id(n.outputs[0]) for n in side_sums(body)}
    return [Param("out" if j == 0 else f"out{j}", "double" if id(v) in sides else _ctype(v),
                  const=False) for j, v in enumerate(body.outputs)]


def extra_targets(body: Graph, index: list[str]) -> dict:
    """id(value) -> (buffer, index) for the outputs after the first (``index[j]``: output
    ``j + 1``'s index expression)."""
    return {id(v): (f"out{j + 1}", index[j]) for j, v in enumerate(body.outputs[1:])}


def _contiguous_strides(shape: tuple, nd: int) -> list[int]:
    """Element strides of a C-contiguous array of ``shape`` in an ``nd``-dim broadcast
    index space (0 where it broadcasts)."""
    shape = (1,) * (nd - len(shape)) + tuple(shape)
    strides, acc = [0] * nd, 1
    for d in range(nd - 1, -1, -1):
        strides[d] = 0 if shape[d] == 1 else acc
        acc *= shape[d]
    return strides


def _index(vars_: list[str], strides: list) -> str:
    terms = [v if s == 1 else f"{v} * {s}" for v, s in zip(vars_, strides) if s != 0]
    return " + ".join(terms) if terms else "0"


def _nest(extents: list[int], body: list, total: int) -> list:
    """Loops i0.. over ``extents`` around ``body``: the innermost simd (two streams of it
    when the body is long, see ``jam``), the outermost split across threads when the region
    is large."""
    if not extents:
        return body
    n = len(extents)
    split = worth_splitting(total, body)
    stmts = jam(f"i{n - 1}", extents[-1], body, parallel=n == 1 and split)
    for d in range(n - 2, -1, -1):
        stmts = [Loop(f"i{d}", extents[d], stmts, parallel=d == 0 and split)]
    return stmts


# what makes an element program long enough to run as two streams: the prelude's
# transcendental functions (each a chain of ~20 dependent operations)
_LONG = re.compile(r"\btsr_(exp|expm1|log|log1p|tanh|sigmoid|phi|erf|erfc)f?\(")

# A region's loop is split across threads only when one thread would take long enough for
# the hand-off to pay even when the other core is busy (right after a GEMM, OpenBLAS's
# worker still spins there: bench training: mlp). The one-thread time is estimated from the
# bytes each element moves and the transcendental calls it makes.
SPLIT_MIN_NS = 500_000
NS_PER_BYTE = 0.1    # one core streaming ~10 GB/s (bench kernels: triad)
NS_PER_CALL = 2.0    # one vectorised exp/erf chain, per element
_BYTES = {"float": 4, "double": 8, "int32_t": 4, "int64_t": 8, "unsigned char": 1}


def worth_splitting(elements: int, program: list) -> bool:
    """Whether a loop over ``elements`` runs of the element ``program`` (its Loads, Lets
    and Stores) is worth splitting across threads: its estimated one-thread time is at
    least ``SPLIT_MIN_NS``. A broadcast load counts as a full one (an overestimate)."""
    if elements < SPLIT_MIN:
        return False
    nbytes = sum(_BYTES.get(s.ctype, 4) for s in program if isinstance(s, Load)) + \
        4 * sum(isinstance(s, Store) for s in program)
    calls = sum(len(_LONG.findall(s.expr)) for s in program if isinstance(s, Let))
    return elements * (nbytes * NS_PER_BYTE + calls * NS_PER_CALL) >= SPLIT_MIN_NS
JAM_MIN = 64   # a fixed inner extent below this keeps one stream


def jam(var: str, extent: int, body: list, parallel: bool = False, simd: bool = True) -> list:
    """The simd loop of ``var`` over ``body``, run as two interleaved streams when ``body``
    calls a transcendental function: iteration k computes elements k and k + h of the two
    halves (loads of both first, then both chains, then both stores). A vectorised exp/erf
    chain is bound by its latency, not by arithmetic; with a second independent chain in
    the same iteration the compiler's scheduler (``-fschedule-insns``) interleaves the two.
    (bench kernels: chain, the graph column). An odd element left over runs after the
    loop."""
    long_ = any(isinstance(s, Let) and _LONG.search(s.expr) for s in body)
    plain = all(isinstance(s, (Load, Store)) or isinstance(s, Let) and s.ctype for s in body)
    if not long_ or not plain or not simd or (not parallel and extent < JAM_MIN):
        return [Loop(var, extent, body, parallel=parallel, simd=simd)]
    half = f"{var}_h"
    second = _shifted(body, var, half)
    loads = [s for s in body if isinstance(s, Load)] + [s for s in second if isinstance(s, Load)]
    rest = [s for s in body if not isinstance(s, (Load, Store))] + \
        [s for s in second if not isinstance(s, (Load, Store))]
    stores = [s for s in body if isinstance(s, Store)] + \
        [s for s in second if isinstance(s, Store)]
    if parallel:   # over the chunk [lo, hi) the caller passes
        return [Let(half, "const int64_t", "(hi - lo) / 2"),
                Loop(var, extent, loads + rest + stores, parallel=True, simd=True,
                     bounds=("lo", f"lo + {half}")),
                If("(hi - lo) & 1", [Let(var, "const int64_t", "hi - 1"), *body])]
    odd = [If("1", [Let(var, "const int64_t", str(extent - 1)), *body])] if extent % 2 else []
    return [Let(half, "const int64_t", str(extent // 2)),
            Loop(var, extent // 2, loads + rest + stores, simd=True), *odd]


def _shifted(body: list, var: str, half: str) -> list:
    """``body`` for element ``var + half``: the variables it defines renamed (v3 -> w3;
    values from outside the loop, such as a row's statistics, are shared), its indices
    shifted."""
    defined = {s.var for s in body if isinstance(s, (Load, Let))}

    def rename(text: str) -> str:
        return re.sub(r"\bv(\d+)\b", lambda m: "w" + m[1] if m[0] in defined else m[0], text)
    shift = functools.partial(re.sub, rf"\b{var}\b", f"({var} + {half})")
    out: list[Load | Let | Store] = []
    for s in body:
        if isinstance(s, Load):
            out.append(Load(rename(s.var), s.ctype, s.buf, shift(s.index)))
        elif isinstance(s, Let) and s.ctype:
            out.append(Let(rename(s.var), s.ctype, rename(s.expr)))
        elif isinstance(s, Store):
            out.append(Store(s.buf, shift(s.index), rename(s.value)))
        else:
            raise TypeError(f"cannot run {s} as a second stream")
    return out


# reductions a region may end in: (identity, combine(acc, v), accumulate in double?)
REDUCE = {
    "sum": ("0", "({a} + {v})", True),
    "mean": ("0", "({a} + {v})", True),
    "amax": ("-INFINITY", "(({v} > {a} || {v} != {v}) ? {v} : {a})", False),
    "amin": ("INFINITY", "(({v} < {a} || {v} != {v}) ? {v} : {a})", False),
}


def _reduced_dims(node, nd: int) -> set[int]:
    dim = node.attrs.get("dim")
    if dim is None or dim == () or dim == [] or nd == 0:
        return set(range(nd))
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    return {d % nd for d in dims}


def _reduce_nest(red, extents: list[int], kinds: list[bool], prog: list, value: str,
                 oidx: str) -> list:
    """Loops over ``extents`` (``kinds[g]``: whether group g is reduced) combining the
    element value into ``acc[oidx]``; a trailing run of reduced loops first combines into
    a scalar ``a``, which vectorises (``omp simd reduction``) for sums. Never split: the
    accumulator is initialised and finished around the whole nest."""
    ident, comb, _ = REDUCE[red.op.name]
    n = len(extents)
    tail = n
    while tail > 0 and kinds[tail - 1]:
        tail -= 1
    if tail < n:   # reduce the innermost loops into a register
        stmts = prog + [Let("a", "", comb.format(a="a", v=value))]
        for g in range(n - 1, tail - 1, -1):
            sum_ = red.op.name in ("sum", "mean")
            stmts = [Loop(f"i{g}", extents[g], stmts, simd=g == n - 1 and sum_,
                          reduction="+:a" if g == n - 1 and sum_ else None)]
        stmts = [Let("a", "acc_t", ident)] + stmts + \
            [Store("acc", oidx, comb.format(a=f"acc[{oidx}]", v="a"))]
    else:
        stmts = prog + [Store("acc", oidx, comb.format(a=f"acc[{oidx}]", v=value))]
    for g in range(tail - 1, -1, -1):
        stmts = [Loop(f"i{g}", extents[g], stmts, simd=g == n - 1)]
    return stmts


def _kernel(body: Graph, name: str, extents: list[int], in_idx: list[str], out_idx: str,
            params: list[Param], pre: list, kinds: list[bool] | None = None,
            extra: dict | None = None) -> Func:
    """One kernel: the element program inside loops over ``extents``; for a region ending
    in a reduction (``kinds`` given) the accumulating nest around an init and a final pass.
    ``extra``: where the element program stores the region's other outputs."""
    red = body.nodes[-1] if kinds is not None else None
    if red is None:
        total = body.outputs[0].numel
        prog = _element_program(body, in_idx, out_idx, extra)
        return Func(name, params, pre + _nest(extents, prog, total))
    out = body.outputs[0]
    src = red.inputs[0]
    head = Graph(inputs=body.inputs, nodes=body.nodes[:-1], outputs=[src])
    prog = _element_program(head, in_idx, None, extra)
    value = next((p.var for p in reversed(prog) if isinstance(p, (Let, Load))), None)
    ident, _, wide = REDUCE[red.op.name]
    ct = _ctype(out)
    acc_t = "double" if wide else ct
    count = src.numel // max(out.numel, 1)
    m = out.numel
    stmts: list = [Raw(f"typedef {acc_t} acc_t;")]
    if acc_t == ct and red.op.name != "mean":
        stmts.append(Let("acc", "acc_t*", "out"))
    else:
        stmts.append(Let("acc", "acc_t*", f"(acc_t*)malloc({max(m, 1)} * sizeof(acc_t))"))
    stmts.append(Loop("o", m, [Store("acc", "o", ident)]))
    assert kinds is not None and value is not None  # a region reads one input at least
    stmts += _reduce_nest(red, extents, kinds, prog, value, out_idx)
    if acc_t != ct or red.op.name == "mean":
        scale = f" * {1.0 / count!r}" if red.op.name == "mean" and count else \
            " * NAN" if red.op.name == "mean" else ""
        stmts.append(Loop("o", m, [Store("out", "o", f"({ct})(acc[o]{scale})")]))
        stmts.append(Raw("free(acc);"))
    return Func(name, params, pre + stmts)


def iteration_shape(body: Graph) -> tuple:
    """The shape a region's loops run over: its output's, or a final reduction's input's."""
    red = body.nodes[-1] if body.nodes and body.nodes[-1].op.name in REDUCE else None
    return red.inputs[0].shape if red is not None else body.outputs[0].shape


def lower(body: Graph, name: str) -> list[Func]:
    """The contiguous and the strided kernel of a fused region's body (a row-wise region:
    ``tessera.codegen.rowwise``)."""
    from tessera.codegen.rowwise import is_rowwise, lower_rowwise
    body = core(body)
    if is_rowwise(body):
        return lower_rowwise(body, name)
    out = body.outputs[0]
    red = body.nodes[-1] if body.nodes and body.nodes[-1].op.name in REDUCE else None
    full = iteration_shape(body)
    nd = len(full)
    params = out_params(body) + [Param(f"in{k}", _ctype(v)) for k, v in enumerate(body.inputs)]
    if red is not None:  # where each point of the iteration space accumulates
        dims = _reduced_dims(red, nd)
        ostr = _contiguous_strides(tuple(1 if d in dims else full[d] for d in range(nd)), nd)
    else:
        ostr = _contiguous_strides(out.shape, nd)
    return [_contiguous_kernel(body, name, full, ostr, params, red is not None),
            _strided_kernel(body, name, full, ostr, params, red is not None)]


def output_strides(body: Graph, nd: int) -> list[list[int]]:
    """The contiguous strides of the outputs after the first, in the iteration space (a
    side sum's: 0 along the dims it sums)."""
    full = iteration_shape(body)
    out = []
    for v in body.outputs[1:]:
        n = v.producer
        if n is not None and n in side_sums(body):
            dims = _reduced_dims(n, nd)
            v_shape = tuple(1 if d in dims else full[d] for d in range(nd))
            out.append(_contiguous_strides(v_shape, nd))
        else:
            out.append(_contiguous_strides(v.shape, nd))
    return out


def side_program(body: Graph, index: list[str], value, fresh) -> list:
    """Statements adding each side sum's element into its partial sums (``index[j]``: output
    ``j + 1``'s index); ``value(v)`` gives the variable holding ``v`` (computing it),
    ``fresh()`` a new variable name (``v<k>``: a second stream renames it, see ``jam``)."""
    stmts: list = []
    for j, v in enumerate(body.outputs[1:]):
        n = v.producer
        if n is None or n not in side_sums(body):
            continue
        var = value(n.inputs[0])
        acc = fresh()
        stmts.append(Load(acc, "double", f"out{j + 1}", index[j]))
        stmts.append(Store(f"out{j + 1}", index[j], f"({acc} + (double){var})"))
    return stmts


def side_init(body: Graph) -> list:
    """Zero the partial sums of every side sum (before the loops)."""
    out = []
    for j, v in enumerate(body.outputs[1:]):
        n = v.producer
        if n is not None and n in side_sums(body):
            out.append(Loop("o", max(v.numel, 1), [Store(f"out{j + 1}", "o", "0")]))
    return out


def _collapsed(full: tuple, access: list) -> list[tuple[int, list[int]]]:
    """The iteration space as (extent, stride of each access) groups: adjacent dims that
    every access walks as one are merged, dims of extent 1 dropped."""
    groups: list[tuple[int, list[int]]] = []
    for d, n in enumerate(full):
        if n == 1:
            continue
        st = [a[d] for a in access]
        if groups and all(g == s * n for g, s in zip(groups[-1][1], st)):
            groups[-1] = (groups[-1][0] * n, st)
        else:
            groups.append((n, st))
    return groups


def _contiguous_kernel(body: Graph, name: str, full: tuple, ostr: list[int], params: list,
                       reduces: bool) -> Func:
    """``<name>_c``: every input C-contiguous, its dims collapsed where they line up."""
    nd = len(full)
    n_in = len(body.inputs)
    access = [_contiguous_strides(v.shape, nd) for v in body.inputs] + [ostr] + \
        output_strides(body, nd)
    groups = _collapsed(full, access)
    vars_ = [f"i{d}" for d in range(len(groups))]
    idx = [_index(vars_, [g[1][k] for g in groups]) for k in range(len(access))]
    kinds = [g[1][n_in] == 0 for g in groups] if reduces else None
    return _kernel(body, f"{name}_c", [g[0] for g in groups], idx[:n_in], idx[n_in], params,
                   side_init(body), kinds, extra_targets(body, idx[n_in + 1:]))


def _strided_kernel(body: Graph, name: str, full: tuple, ostr: list[int], params: list,
                    reduces: bool) -> Func:
    """``<name>_s``: the inputs' strides arrive at run time in ``st[k * ndim + d]``."""
    dims_ = [d for d in range(len(full)) if full[d] != 1]
    svars = [f"i{j}" for j in range(len(dims_))]
    pre = [Let(f"s{k}_{j}", "const int64_t", f"st[{k * len(dims_) + j}]")
           for k in range(len(body.inputs)) for j in range(len(dims_))]
    sidx = [" + ".join(f"{v} * s{k}_{j}" for j, v in enumerate(svars)) or "0"
            for k in range(len(body.inputs))]
    oidx = _index(svars, [ostr[d] for d in dims_])
    eidx = [_index(svars, [e[d] for d in dims_]) for e in output_strides(body, len(full))]
    skinds = [ostr[d] == 0 for d in dims_] if reduces else None
    return _kernel(body, f"{name}_s", [full[d] for d in dims_], sidx, oidx,
                   params + [Param("st", "int64_t")], pre + side_init(body), skinds,
                   extra_targets(body, eidx))


def _no_convert(op) -> bool:
    """Logical ops and casts test their inputs against 0 themselves: no conversion first."""
    return is_logical(op) or op.name == "cast"
