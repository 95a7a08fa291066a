"""Reduce-then-map kernels: regions whose reductions (``keepdim=True``, all over the same
dims D) feed later elementwise ops, as softmax and layer norm do once decomposed.

The loops run over the kept dims outside and D inside. For each kept index (a *row*), each
reduction gets a phase: a loop over D that recomputes the elementwise chain it reads and
accumulates into a register (max and min as OpenMP reductions beside a NaN flag, so that
they vectorise); values of the row's shape (``rsqrt(var + eps)``) are computed between
phases; a last loop over D computes and stores the output (or, when the region ends in a
reduction, one more phase stores it). A phase whose input the last loop needs again
(softmax's exp) stores it in the output as it goes, and the last loop reads it back. Nothing
but the output touches memory, and each row stays in cache across its phases.

>>> from tessera.graph.ir import Graph
>>> from tessera.codegen.loops import render
>>> g = Graph.parse('''graph(%a0: float32[4, 8]) {
...   %0: float32[4, 1] = amax(%a0) {dim=(1,), keepdim=True}
...   %1: float32[4, 8] = sub(%a0, %0) {alpha=1}
...   %2: float32[4, 8] = exp(%1)
...   %3: float32[4, 1] = sum(%2) {dim=(1,), keepdim=True, dtype=None}
...   %4: float32[4, 8] = div(%2, %3) {rounding_mode=None}
...   return (%4)
... }''')
>>> print(render(lower_rowwise(g, "softmax")[0]))
void softmax_c(float* out, const float* in0, int64_t lo, int64_t hi) {
  for (int64_t i0 = 0; i0 < 4; i0++) {
    float r1 = -INFINITY;
    int r1n = 0;
    #pragma omp simd reduction(max:r1) reduction(|:r1n)
    for (int64_t i1 = 0; i1 < 8; i1++) {
      float v2 = in0[i0 * 8 + i1];
      r1 = (v2 > r1 ? v2 : r1);
      r1n = (r1n | (v2 != v2));
    }
    float v3 = (float)((r1n ? NAN : r1));
    double r4 = 0;
    #pragma omp simd reduction(+:r4)
    for (int64_t i1 = 0; i1 < 8; i1++) {
      float v7 = in0[i0 * 8 + i1];
      float v6 = (v7 - v3);
      float v5 = tsr_expf(v6);
      out[i0 * 8 + i1] = v5;
      r4 = (r4 + v5);
    }
    float v8 = (float)(r4);
    #pragma omp simd
    for (int64_t i1 = 0; i1 < 8; i1++) {
      float v9 = out[i0 * 8 + i1];
      float v10 = (v9 / v8);
      out[i0 * 8 + i1] = v10;
    }
  }
}
"""
from __future__ import annotations

from tessera.codegen.loops import (
    REDUCE,
    Func,
    Let,
    Load,
    Loop,
    Param,
    Store,
    _contiguous_strides,
    _ctype,
    _index,
    _reduced_dims,
    _var_ctype,
    core,
    iteration_shape,
    jam,
    node_expr,
    out_params,
    output_strides,
    side_chain,
    side_init,
    side_program,
    side_sums,
)
from tessera.graph.ir import Graph, Value
from tessera.kernels.threadpool import SPLIT_MIN

__all__ = ["is_rowwise", "lower_rowwise", "writes_before_reading"]


def writes_before_reading(body: Graph) -> bool:
    """Whether the kernel of ``body`` stores into its output while a later phase still reads
    its inputs (a reduction phase carrying a value in the output buffer, ``_kept``): its
    output must not share an input's buffer. Found by LayerNorm after a residual add
    (MiniLM) running in place on the add's input.

    >>> g = Graph.parse('''graph(%a: float32[2, 4], %b: float32[2, 4]) {
    ...   %0: float32[2, 4] = add(%a, %b) {alpha=1}
    ...   %1: float32[2, 1] = mean(%0) {dim=(1,), keepdim=True, dtype=None}
    ...   %2: float32[2, 4] = sub(%0, %1)
    ...   return (%2)
    ... }''')
    >>> writes_before_reading(g)
    True
    """
    body = core(body)
    return is_rowwise(body) and _kept(body, body.nodes[-1]) is not None


def is_rowwise(body: Graph) -> bool:
    """Whether ``body`` has a reduction before its last node."""
    return any(n.op.name in REDUCE for n in body.nodes[:-1])


def check_rowwise(body: Graph) -> str | None:
    """Why a body with inner reductions cannot be lowered (None when it can)."""
    full = iteration_shape(body)
    nd = len(full)
    dims = None
    for n in body.nodes:
        if n.op.name not in REDUCE:
            continue
        if n.attrs.get("dtype") is not None:
            return f"{n.op.name} with a dtype"
        if n is not body.nodes[-1] and not n.attrs.get("keepdim"):
            return f"{n.op.name} without keepdim inside a region"
        if tuple(n.inputs[0].shape) != tuple(full):
            return f"{n.op.name} over a value of another shape"
        d = _reduced_dims(n, nd)
        if dims is not None and d != dims:
            return "reductions over different dims"
        dims = d
    return None


def _kinds(body: Graph, full: tuple, dims: set[int]) -> dict[int, bool]:
    """id(value) -> whether it varies along the reduced dims (a full value) or is one per
    row (a reduced value)."""
    nd = len(full)
    real = {d for d in dims if full[d] != 1}

    def varies(v) -> bool:
        shape = (1,) * (nd - len(v.shape)) + tuple(v.shape)
        return any(shape[d] != 1 for d in real)
    out = {id(v): varies(v) for v in body.inputs}
    for n in body.nodes + side_chain(body):   # (the side sums' chains too)
        out[id(n.outputs[0])] = False if n.op.name in REDUCE else varies(n.outputs[0])
    return out


class _Emitter:
    """Emits the statements computing a value, hoisting per-row values out of inner loops."""

    def __init__(self, body: Graph, in_idx: list[str], full_kind: dict[int, bool]):
        self.body, self.in_idx, self.full = body, in_idx, full_kind
        self.inputs = {id(v): k for k, v in enumerate(body.inputs)}
        self.count = 0

    def fresh(self, prefix="v") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def value(self, v: Value, scope: dict, stmts: list, outer: tuple[dict, list]) -> str:
        """The variable holding ``v`` in ``scope``; statements go to ``stmts``, or for a
        per-row value needed inside a row loop, to the row's statements ``outer``."""
        if id(v) in scope:
            return scope[id(v)]
        if not self.full[id(v)] and outer is not None and scope is not outer[0]:
            name = self.value(v, outer[0], outer[1], outer)
            scope[id(v)] = name
            return name
        name = self.fresh()
        if id(v) in self.inputs:
            k = self.inputs[id(v)]
            stmts.append(Load(name, _var_ctype(v), f"in{k}", self.in_idx[k]))
        else:
            n = v.producer
            assert n.op.name not in REDUCE, "a reduction is computed by its phase"
            names = {id(a): self.value(a, scope, stmts, outer) for a in n.inputs
                     if isinstance(a, Value)}
            stmts.append(Let(name, _var_ctype(v), node_expr(n, names)))
        scope[id(v)] = name
        return name


def _variant(body: Graph, name: str, groups: list[tuple[int, bool]], in_idx: list[str],
             out_idx: str, params: list[Param], pre: list, extra_idx: list[str]) -> Func:
    """``groups``: (extent, reduced?) per loop, kept loops first; ``extra_idx``: the index
    of each output after the first (a multi-output region's: the values of a row's shape
    are stored once the row is done, the full ones by the final loop over the row)."""
    full = iteration_shape(body)
    dims = next(_reduced_dims(n, len(full)) for n in body.nodes if n.op.name in REDUCE)
    em = _Emitter(body, in_idx, _kinds(body, full, dims))
    kept = [(e, k) for e, k in groups if not k]
    inner = [(e, k) for e, k in groups if k]
    nk = len(kept)
    row: list = []
    scope: dict = {}
    outer = (scope, row)
    count = 1
    for e, _ in inner:
        count *= e

    def inner_loops(body_stmts: list, reduction: str | None, simd: bool) -> list:
        """Loops over the reduced dims; the innermost is simd (with the phase's reduction
        clauses)."""
        stmts = body_stmts
        for j in range(len(inner) - 1, -1, -1):
            last = j == len(inner) - 1
            if last and simd and reduction is None:   # the final map: two streams if long
                stmts = jam(f"i{nk + j}", inner[j][0], stmts)
                continue
            stmts = [Loop(f"i{nk + j}", inner[j][0], stmts, simd=last and simd,
                          reduction=reduction if last else None)]
        return stmts

    last = body.nodes[-1]
    kept_value = _kept(body, last)
    for n in body.nodes:
        if n.op.name not in REDUCE:
            continue
        ident, comb, wide = REDUCE[n.op.name]
        acc = em.fresh("r")
        acc_t = "double" if wide else _ctype(n.outputs[0])
        row.append(Let(acc, acc_t, ident))
        loop_scope = dict(scope)
        stmts: list = []
        v = em.value(n.inputs[0], loop_scope, stmts, outer)
        if n.inputs[0] is kept_value:   # the map reads it back instead of recomputing it
            stmts.append(Store("out", out_idx, v))
        if wide:
            stmts.append(Let(acc, "", comb.format(a=acc, v=v)))
            row += inner_loops(stmts, f"+:{acc}", simd=True)
            value = f"{acc} * {1.0 / count!r}" if n.op.name == "mean" and count else \
                f"{acc} * NAN" if n.op.name == "mean" else acc
        else:
            # max/min as an OpenMP reduction over the non-NaN values, and a flag for NaNs
            # (the reference propagates them): both vectorise, NaN-propagating selects do not
            nan = acc + "n"
            row.append(Let(nan, "int", "0"))
            cmp = ">" if n.op.name == "amax" else "<"
            stmts.append(Let(acc, "", f"({v} {cmp} {acc} ? {v} : {acc})"))
            stmts.append(Let(nan, "", f"({nan} | ({v} != {v}))"))
            row += inner_loops(stmts, f"{'max' if cmp == '>' else 'min'}:{acc} |:{nan}",
                               simd=True)
            value = f"({nan} ? NAN : {acc})"
        res = em.fresh()
        row.append(Let(res, _ctype(n.outputs[0]), f"({_ctype(n.outputs[0])})({value})"))
        scope[id(n.outputs[0])] = res
        if n is last:
            row.append(Store("out", out_idx, res))
    sides = side_sums(body)
    extras = [(v, f"out{j + 1}", idx) for j, (v, idx) in enumerate(zip(body.outputs[1:],
                                                                         extra_idx))
              if v.producer not in sides]
    full_extras = [e for e in extras if em.full[id(e[0])]]
    if last.op.name not in REDUCE or full_extras or sides:
        loop_scope = dict(scope)
        stmts = []
        stores = []
        if last.op.name not in REDUCE:
            if kept_value is not None:
                var = em.fresh()
                stmts.append(Load(var, _ctype(kept_value), "out", out_idx))
                loop_scope[id(kept_value)] = var
            v = em.value(last.outputs[0], loop_scope, stmts, outer)
            stores.append(Store("out", out_idx, v))
        for e, buf, idx in full_extras:   # after the result's: loads before stores
            stores.append(Store(buf, idx, em.value(e, loop_scope, stmts, outer)))
        stores += side_program(body, extra_idx,
                               lambda v: em.value(v, loop_scope, stmts, outer), em.fresh)
        row += inner_loops(stmts + stores, None, simd=True)
    for e, buf, idx in extras:
        if not em.full[id(e)]:   # the row's statistics, once nothing of the row is read
            row.append(Store(buf, idx, em.value(e, scope, row, outer)))
    total = 1
    for e, _ in groups:
        total *= e
    nest = row
    for j in range(nk - 1, -1, -1):
        nest = [Loop(f"i{j}", kept[j][0], nest, parallel=j == 0 and total >= SPLIT_MIN)]
    # (each row is independent: the outer loop may be split across threads)
    return Func(name, params, pre + side_init(body) + nest)


def _kept(body: Graph, last) -> Value | None:
    """A value the output buffer can carry from a reduction phase to the final map: the
    input of the last phase whose input the map also needs (softmax's exp), when it is
    computed (not an input), has the output's shape and type, and the region ends in a map.
    The phase stores it as it goes; the map loads it back instead of computing it again."""
    if last.op.name in REDUCE:
        return None
    out = last.outputs[0]
    needed, todo = set(), [out]
    while todo:   # the values the map's expression reads, up to the reductions
        v = todo.pop()
        if id(v) in needed or v.producer is None or v.producer.op.name in REDUCE:
            continue
        needed.add(id(v))
        todo += [a for a in v.producer.inputs if isinstance(a, Value)]
    kept = None
    for n in body.nodes:
        v = n.inputs[0] if n.op.name in REDUCE else None
        if v is not None and id(v) in needed and v.producer is not None and \
                tuple(v.shape) == tuple(out.shape) and _ctype(v) == _ctype(out):
            kept = v
    return kept


def _strided_index(v: Value, nd: int, dims_: list[int], k: int, pos: dict) -> str:
    """Input k's index from runtime strides, leaving out the dims it broadcasts along (a
    per-row input is loaded outside the loops over the reduced dims)."""
    shape = (1,) * (nd - len(v.shape)) + tuple(v.shape)
    terms = [f"i{pos[j]} * s{k}_{j}" for j, d in enumerate(dims_) if shape[d] != 1]
    return " + ".join(terms) or "0"


def lower_rowwise(body: Graph, name: str) -> list[Func]:
    """The contiguous and the strided kernel of a reduce-then-map region."""
    full = iteration_shape(body)
    nd = len(full)
    dims = next(_reduced_dims(n, nd) for n in body.nodes if n.op.name in REDUCE)
    params = out_params(body) + [Param(f"in{k}", _ctype(v)) for k, v in enumerate(body.inputs)]
    final_red = body.nodes[-1].op.name in REDUCE
    rstr = _contiguous_strides(tuple(1 if d in dims else full[d] for d in range(nd)), nd)
    ostr = rstr if final_red else _contiguous_strides(full, nd)
    reduced = [d in dims for d in range(nd)]
    return [_contiguous_rows(body, name, full, ostr, reduced, params),
            _strided_rows(body, name, full, ostr, reduced, params)]


def _row_groups(full: tuple, reduced: list, access: list) -> list[list]:
    """[extent, reduced?, stride of each access] groups: neighbouring dims of one kind that
    every access walks as one are merged; kept loops go outside (a stable sort keeps the
    order)."""
    groups: list[list] = []
    for d, n in enumerate(full):
        if n == 1:
            continue
        st = [a[d] for a in access]
        if groups and groups[-1][1] == reduced[d] and \
                all(g == s * n for g, s in zip(groups[-1][2], st)):
            groups[-1][0] *= n
            groups[-1][2] = st
        else:
            groups.append([n, reduced[d], st])
    groups.sort(key=lambda g: g[1])
    return groups


def _contiguous_rows(body: Graph, name: str, full: tuple, ostr: list[int], reduced: list,
                     params: list) -> Func:
    """``<name>_c``: every input C-contiguous."""
    nd = len(full)
    n_in = len(body.inputs)
    access = [_contiguous_strides(v.shape, nd) for v in body.inputs] + [ostr] + \
        output_strides(body, nd)
    groups = _row_groups(full, reduced, access)
    vars_ = [f"i{j}" for j in range(len(groups))]
    idx = [_index(vars_, [g[2][k] for g in groups]) for k in range(len(access))]
    return _variant(body, f"{name}_c", [(g[0], g[1]) for g in groups], idx[:n_in], idx[n_in],
                    params, [], idx[n_in + 1:])


def _strided_rows(body: Graph, name: str, full: tuple, ostr: list[int], reduced: list,
                  params: list) -> Func:
    """``<name>_s``: run-time strides ``st[k * ndim + j]`` over the dims of extent > 1."""
    nd = len(full)
    dims_ = [d for d in range(nd) if full[d] != 1]
    order = sorted(range(len(dims_)), key=lambda j: reduced[dims_[j]])
    pos = {j: p for p, j in enumerate(order)}      # dim j runs as loop i<pos>
    pre = [Let(f"s{k}_{j}", "const int64_t", f"st[{k * len(dims_) + j}]")
           for k in range(len(body.inputs)) for j in range(len(dims_))]
    sidx = [_strided_index(v, nd, dims_, k, pos) for k, v in enumerate(body.inputs)]
    def index(strides: list[int]) -> str:
        return " + ".join(f"i{pos[j]} * {strides[d]}" for j, d in enumerate(dims_)
                          if strides[d]) or "0"
    eidx = [index(st) for st in output_strides(body, nd)]
    return _variant(body, f"{name}_s", [(full[dims_[j]], reduced[dims_[j]]) for j in order],
                    sidx, index(ostr), params + [Param("st", "int64_t")], pre, eidx)
