"""Rules of the exported program for ops along one dimension and for index lookups,
registered into ``_emit.RULES``: ``argmax`` and ``argmin`` (and ``max``/``min`` along a
dim, values and indices), ``cumsum``, ``topk`` (values and indices), ``sort`` (values and
indices; ``argsort`` and ``msort`` trace to it), ``gather`` (and ``take_along_dim``, which
traces to it), ``index_select``, padding by reflection, replication or wrapping (``pad``),
group norm and batch statistics norms (``batch_norm`` in training mode: instance norm), max
pooling of 1-d and 3-d windows, and max pooling's indices (1-d to 3-d).

Each helper is C text for one element type, emitted once into the program that uses it,
with ``(lo, hi)`` bounds over its rows so that ``_emit_more._split`` shares big ones out
over the kernel threads. The results are PyTorch's: the first extreme wins a tie, NaN is
larger than any number (``argmax``/``argmin``/``topk`` pick NaN first, as max pooling does);
``topk`` lists equal values in the order of their indices, as eager does, and ``sort`` is
stable.

>>> from tessera.deploy._emit import RULES
>>> {"argmax", "cumsum", "topk", "sort", "gather", "index_select", "pad", "max_pool"} <= set(RULES)
True
"""
from __future__ import annotations

import math
from typing import Literal

import numpy as np

from tessera.deploy._emit import (
    CTYPES,
    MULTI_OUTPUT,
    RULES,
    Program,
    _elementwise_body,
    _pool_run,
    _region,
    _unsupported,
    _window_unit,
)
from tessera.deploy._emit_more import _geometry, _helper, _split
from tessera.graph.ir import Node, Value

__all__: list[str] = []

_FLOATS = ("float32", "float64")


def _once(prog: Program, text: str) -> None:
    if text not in prog.kernels:
        prog.kernels.append(text)


def _dims(x: Value, dim) -> tuple[int, int, int]:
    """(outer, extent, inner) of x around ``dim`` (None: all of x as one dimension)."""
    if dim is None:
        return 1, x.numel, 1
    nd = len(x.shape)
    if nd == 0:
        return 1, 1, 1
    d = dim % nd
    return math.prod(x.shape[:d]), x.shape[d], math.prod(x.shape[d + 1:])


def _ctype(n: Node, v: Value) -> str:
    t = CTYPES.get(v.dtype.name)
    if t is None or v.dtype.name.startswith("q"):
        raise _unsupported(n, f"a {v.dtype.name} operand")
    return t


# ---- argmax, argmin ------------------------------------------------------------------------

def _arg_helper(prog: Program, kind: str, x: Value, n: Node) -> str:
    t, fname = _ctype(n, x), f"tsr_{kind}_{x.dtype.name}"
    op = ">" if kind == "argmax" else "<"
    # NaN wins (PyTorch's rule): the first NaN ends the search
    nan = "if (v != v) { best = v; at = k; break; }\n            " \
        if x.dtype.name in _FLOATS else ""
    first = "if (best == best)\n        " if x.dtype.name in _FLOATS else ""
    _once(prog, f"""/* y[o][i] = the first k with x[o][k][i] the {kind[3:]} (NaN first), and that
   value in vals[o][i] (vals NULL: not), for the rows q = o inner + i in [lo, hi) */
static void {fname}(const {t}* x, {t}* vals, int64_t* y, int64_t r, int64_t inner, int64_t lo,
                    int64_t hi) {{
    for (int64_t q = lo; q < hi; q++) {{
        const {t}* xs = x + q / inner * r * inner + q % inner;
        {t} best = xs[0];
        int64_t at = 0;
        {first}for (int64_t k = 1; k < r; k++) {{
            {t} v = xs[k * inner];
            {nan}if (v {op} best) {{ best = v; at = k; }}
        }}
        y[q] = at;
        if (vals) vals[q] = best;
    }}
}}""")
    return fname


def _argmax(prog: Program, i: int, n: Node) -> None:
    """argmax, argmin, and max and min along a dim (values and indices: max_dim,
    min_dim)."""
    x = n.inputs[0]
    kind = "argmax" if n.op.name in ("argmax", "max_dim") else "argmin"
    vals, out = (n.outputs if len(n.outputs) == 2 else (None, n.outputs[0]))
    outer, r, inner = _dims(x, n.attrs.get("dim"))
    if r == 0:
        raise _unsupported(n, "an empty dimension")
    t = _ctype(n, x)
    fname = _arg_helper(prog, kind, x, n)
    prog.steps.append(_split(prog, fname, [(f"const {t}*", prog.p(x)),
                                           (f"{t}*", prog.p(vals) if vals else "NULL"),
                                           ("int64_t*", prog.p(out)), ("int64_t", str(r)),
                                           ("int64_t", str(inner))],
                             outer * inner, x.numel))


# ---- cumsum ----------------------------------------------------------------------------------

def _cumsum(prog: Program, i: int, n: Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    tx, ty = _ctype(n, x), _ctype(n, out)
    outer, r, inner = _dims(x, n.attrs.get("dim"))
    # floats add up in double (as PyTorch's CPU kernel does), integers in int64
    acc = "double" if out.dtype.name in _FLOATS else "int64_t"
    fname = f"tsr_cumsum_{x.dtype.name}_{out.dtype.name}"
    _once(prog, f"""/* y[o][k][i] = x[o][0][i] + ... + x[o][k][i] ({acc} sums), rows
   q = o inner + i in [lo, hi) */
static void {fname}(const {tx}* x, {ty}* y, int64_t r, int64_t inner, int64_t lo,
                    int64_t hi) {{
    for (int64_t q = lo; q < hi; q++) {{
        int64_t at = q / inner * r * inner + q % inner;
        {acc} s = 0;
        for (int64_t k = 0; k < r; k++) {{
            s += ({acc})x[at + k * inner];
            y[at + k * inner] = ({ty})s;
        }}
    }}
}}""")
    prog.steps.append(_split(prog, fname, [(f"const {tx}*", prog.p(x)), (f"{ty}*", prog.p(out)),
                                           ("int64_t", str(r)), ("int64_t", str(inner))],
                             outer * inner, x.numel))


# ---- topk ------------------------------------------------------------------------------------

def _topk(prog: Program, i: int, n: Node) -> None:
    x = n.inputs[0]
    values, indices = n.outputs
    t = _ctype(n, x)
    k = n.attrs["k"]
    outer, r, inner = _dims(x, n.attrs.get("dim", -1))
    largest = bool(n.attrs.get("largest", True))
    if not 0 <= k <= r:
        raise _unsupported(n, f"k={k} for a dimension of {r}")
    if k == 0 or x.numel == 0:
        return
    op = ">" if largest else "<"
    if x.dtype.name in _FLOATS:   # NaN counts as the largest value, as in PyTorch
        better = f"((a != a && b == b) || a {op} b)" if largest else \
            f"((a == a && b != b) || a {op} b)"
    else:
        better = f"(a {op} b)"
    which = "largest" if largest else "smallest"
    fname = f"tsr_topk_{which}_{x.dtype.name}"
    # each row's k best so far, kept sorted in its output rows: a value goes in after those
    # it does not beat (equal values keep their indices' order, as eager's stable sort)
    _once(prog, f"""/* the kk {which} x[o][.][i] (NaN the largest), best first, and their
   indices, for the rows q = o inner + i in [lo, hi) */
static void {fname}(const {t}* x, {t}* v, int64_t* ix, int64_t r, int64_t kk, int64_t inner,
                    int64_t lo, int64_t hi) {{
    for (int64_t q = lo; q < hi; q++) {{
        const {t}* xs = x + q / inner * r * inner + q % inner;
        {t}* vs = v + q / inner * kk * inner + q % inner;
        int64_t* is = ix + q / inner * kk * inner + q % inner, have = 0;
        for (int64_t j = 0; j < r; j++) {{
            {t} a = xs[j * inner], b;
            if (have == kk) {{
                b = vs[(kk - 1) * inner];
                if (!{better}) continue;
                have--;
            }}
            int64_t at = have;
            while (at > 0) {{
                b = vs[(at - 1) * inner];
                if (!{better}) break;
                vs[at * inner] = b;
                is[at * inner] = is[(at - 1) * inner];
                at--;
            }}
            vs[at * inner] = a;
            is[at * inner] = j;
            have++;
        }}
    }}
}}""")
    prog.steps.append(_split(prog, fname, [(f"const {t}*", prog.p(x)), (f"{t}*", prog.p(values)),
                                           ("int64_t*", prog.p(indices)), ("int64_t", str(r)),
                                           ("int64_t", str(k)), ("int64_t", str(inner))],
                             outer * inner, x.numel * max(1, min(k, 8))))


# ---- sort, argsort -------------------------------------------------------------------------

def _sort_helper(prog: Program, n: Node, x: Value, descending: bool) -> str:
    t = _ctype(n, x)
    order = "desc" if descending else "asc"
    fname = f"tsr_sort_{order}_{x.dtype.name}"
    # a goes after b: NaN the largest value (all NaNs equal), equal values by their indices
    if x.dtype.name in _FLOATS:
        gt, eq = "(a != a ? b == b : a > b)", "(a != a ? b != b : a == b)"
        lt = "(b != b ? a == a : a < b)"
    else:
        gt, eq, lt = "(a > b)", "(a == b)", "(a < b)"
    after = lt if descending else gt
    _once(prog, f"""/* whether (a, ia) sorts after (b, ib), {order}ending: the index breaks ties */
static int {fname}_after({t} a, int64_t ia, {t} b, int64_t ib) {{
    return {after} || ({eq} && ia > ib);
}}

/* the heap below position root of a heap over [0, end) of a row (elements inner apart)
   restored: the pair that sorts last at the top */
static void {fname}_sift({t}* vs, int64_t* is, int64_t inner, int64_t root, int64_t end) {{
    {t} a = vs[root * inner];
    int64_t ia = is[root * inner];
    for (;;) {{
        int64_t c = 2 * root + 1;
        if (c >= end) break;
        {t} b = vs[c * inner];
        int64_t ib = is[c * inner];
        if (c + 1 < end && {fname}_after(vs[(c + 1) * inner], is[(c + 1) * inner], b, ib)) {{
            c++;
            b = vs[c * inner];
            ib = is[c * inner];
        }}
        if (!{fname}_after(b, ib, a, ia)) break;
        vs[root * inner] = b;
        is[root * inner] = ib;
        root = c;
    }}
    vs[root * inner] = a;
    is[root * inner] = ia;
}}

/* x[o][.][i] sorted ({order}ending, NaN the largest, equal values in the order of their
   indices: a stable sort's result) into v and its indices into ix, for the rows
   q = o inner + i in [lo, hi): a heap sort of (value, index) pairs, whose order is total,
   in the output rows themselves */
static void {fname}(const {t}* x, {t}* v, int64_t* ix, int64_t r, int64_t inner, int64_t lo,
                    int64_t hi) {{
    for (int64_t q = lo; q < hi; q++) {{
        int64_t at = q / inner * r * inner + q % inner;
        {t}* vs = v + at;
        int64_t* is = ix + at;
        for (int64_t j = 0; j < r; j++) {{
            vs[j * inner] = x[at + j * inner];
            is[j * inner] = j;
        }}
        for (int64_t j = r / 2 - 1; j >= 0; j--) {fname}_sift(vs, is, inner, j, r);
        for (int64_t end = r - 1; end > 0; end--) {{
            {t} b = vs[end * inner];
            int64_t ib = is[end * inner];
            vs[end * inner] = vs[0];
            is[end * inner] = is[0];
            vs[0] = b;
            is[0] = ib;
            {fname}_sift(vs, is, inner, 0, end);
        }}
    }}
}}""")
    return fname


def _sort(prog: Program, i: int, n: Node) -> None:
    """sort (values and indices; argsort and msort trace to it): stable, ascending or
    descending, NaN the largest value, as PyTorch's (and eager's) stable sort."""
    x = n.inputs[0]
    values, indices = n.outputs
    if x.numel == 0:
        return
    t = _ctype(n, x)
    outer, r, inner = _dims(x, n.attrs.get("dim", -1))
    fname = _sort_helper(prog, n, x, bool(n.attrs.get("descending", False)))
    prog.steps.append(_split(prog, fname, [(f"const {t}*", prog.p(x)), (f"{t}*", prog.p(values)),
                                           ("int64_t*", prog.p(indices)), ("int64_t", str(r)),
                                           ("int64_t", str(inner))],
                             outer * inner, x.numel * max(1, r.bit_length())))


# ---- gather, index_select ----------------------------------------------------------------

def _check_ids(prog: Program, n: Node, ids: Value, size: int, what: str) -> str:
    """C failing the run when an index of ``ids`` is outside [0, size) (PyTorch raises)."""
    t = _ctype(n, ids)
    fname = f"tsr_first_bad_{ids.dtype.name}"
    _once(prog, f"""/* the position + 1 of the first of ids[0..count) outside [0, size), or 0 */
static int64_t {fname}(const {t}* ids, int64_t count, int64_t size) {{
    for (int64_t j = 0; j < count; j++)
        if (ids[j] < 0 || ids[j] >= size) return j + 1;
    return 0;
}}""")
    return (f"if ({fname}({prog.p(ids)}, {ids.numel}, {size}))\n"
            f"  return fail(m, \"{n.name or what}: {what}: an index is outside [0, {size})\");")


def _gather(prog: Program, i: int, n: Node) -> None:
    """out[p] = x[p with p[dim] = index[p]]: the index's other dims may be shorter than x's."""
    x, index = n.inputs[0], n.inputs[1]
    out = n.outputs[0]
    if not isinstance(index, Value) or len(index.shape) != len(x.shape) or \
            len(x.shape) > 8:
        raise _unsupported(n, "an index of another rank than the input's")
    nd = len(x.shape)
    if out.numel == 0:
        return
    if nd == 0:
        prog.steps.append(_check_ids(prog, n, index, 1, "gather") +
                          f"\n{prog.p(out)}[0] = {prog.p(x)}[0];")
        return
    d = n.attrs["dim"] % nd
    t, ti = _ctype(n, x), _ctype(n, index)
    xst = [math.prod(x.shape[e + 1:]) for e in range(nd)]
    fname = f"tsr_gather_{x.dtype.name}_{index.dtype.name}"
    _once(prog, f"""/* y[p] = x[sum_e p_e xst[e], p_dim replaced by idx[p]] for the positions
   p (of shape, nd dims) in [lo, hi) */
static void {fname}(const {t}* x, const {ti}* idx, {t}* y, int64_t nd, int64_t dim,
                    const int64_t* shape, const int64_t* xst, int64_t lo, int64_t hi) {{
    int64_t p[8], rest = lo, base = 0;
    for (int64_t e = nd - 1; e >= 0; e--) {{
        p[e] = rest % shape[e];
        rest /= shape[e];
        if (e != dim) base += p[e] * xst[e];
    }}
    for (int64_t j = lo; j < hi; j++) {{
        y[j] = x[base + (int64_t)idx[j] * xst[dim]];
        for (int64_t e = nd - 1; e >= 0; e--) {{   /* the next position */
            if (e != dim) base += xst[e];
            if (++p[e] < shape[e]) break;
            if (e != dim) base -= shape[e] * xst[e];
            p[e] = 0;
        }}
    }}
}}""")
    shape = ", ".join(map(str, index.shape))
    strides = ", ".join(map(str, xst))
    prog.steps.append(
        f"{{ static const int64_t shape[] = {{{shape}}}, xst[] = {{{strides}}};\n  " +
        _check_ids(prog, n, index, x.shape[d], "gather").replace("\n", "\n  ") + "\n  " +
        _split(prog, fname, [(f"const {t}*", prog.p(x)), (f"const {ti}*", prog.p(index)),
                             (f"{t}*", prog.p(out)), ("int64_t", str(nd)), ("int64_t", str(d)),
                             ("const int64_t*", "shape"), ("const int64_t*", "xst")],
               out.numel, out.numel) + " }")


def _index_select(prog: Program, i: int, n: Node) -> None:
    x, index = n.inputs[0], n.inputs[1]
    out = n.outputs[0]
    if not isinstance(index, Value) or len(index.shape) > 1:
        raise _unsupported(n, "an index that is not a vector")
    if out.numel == 0:
        return
    outer, r, inner = _dims(x, n.attrs["dim"] if x.shape else None)
    ti = _ctype(n, index)
    size = out.dtype.itemsize
    fname = f"tsr_index_select_{index.dtype.name}"
    _once(prog, f"""/* y[o][j] = x[o][idx[j]], rows of inner elements of size bytes, for the rows
   q = o count + j in [lo, hi) */
static void {fname}(const char* x, const {ti}* idx, char* y, int64_t r, int64_t count,
                    int64_t row, int64_t lo, int64_t hi) {{
    for (int64_t q = lo; q < hi; q++)
        memcpy(y + q * row, x + (q / count * r + (int64_t)idx[q % count]) * row, (size_t)row);
}}""")
    prog.steps.append(
        _check_ids(prog, n, index, r, "index_select") + "\n" +
        _split(prog, fname, [("const char*", f"(const char*){prog.p(x)}"),
                             (f"const {ti}*", prog.p(index)),
                             ("char*", f"(char*){prog.p(out)}"), ("int64_t", str(r)),
                             ("int64_t", str(index.numel)), ("int64_t", str(inner * size))],
               outer * index.numel, out.numel))


def _remainder(prog: Program, i: int, n: Node) -> None:
    """An integer remainder by a constant other than 0 (take_along_dim's wrap of negative
    indices), with the divisor's sign as Python's; others as the elementwise loops have
    them."""
    x, b = n.inputs[0], n.inputs[1]
    out = n.outputs[0]
    if isinstance(b, Value) or not isinstance(x, Value) or \
            x.dtype.name not in ("int32", "int64") or isinstance(b, bool) or \
            not isinstance(b, int) or b == 0:
        body = _elementwise_body(n)
        if body is None:
            raise _unsupported(n, "only an integer tensor by a constant other than 0")
        return _region(prog, i, body[0], body[1], [out])
    t, ty = _ctype(n, x), _ctype(n, out)
    fname = f"tsr_remainder_{x.dtype.name}_{out.dtype.name}"
    _once(prog, f"""/* y[j] = x[j] mod d, with the sign of d (as Python's %), for j in [lo, hi) */
static void {fname}(const {t}* x, {ty}* y, int64_t d, int64_t lo, int64_t hi) {{
    for (int64_t j = lo; j < hi; j++) {{
        int64_t r = (int64_t)x[j] % d;
        y[j] = ({ty})(r != 0 && (r < 0) != (d < 0) ? r + d : r);
    }}
}}""")
    prog.steps.append(_split(prog, fname, [(f"const {t}*", prog.p(x)), (f"{ty}*", prog.p(out)),
                                           ("int64_t", str(b))], out.numel, out.numel))


# ---- reflection, replication and circular padding --------------------------------------------

_NP_MODES: dict[str, Literal["reflect", "edge", "wrap"]] = {
    "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def _pad(prog: Program, i: int, n: Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    mode, pads = n.attrs.get("mode"), n.attrs["pads"]   # (lo, hi) of the last len(pads) dims
    if mode not in _NP_MODES:
        raise _unsupported(n, f"mode {mode!r}")
    if len(pads) > 3 or any(lo < 0 or hi < 0 for lo, hi in pads):
        raise _unsupported(n, "more than 3 padded dims, or negative padding (a crop)")
    t = _ctype(n, x)
    k = len(pads)
    lead = x.shape[:len(x.shape) - k]
    ins = (1,) * (3 - k) + tuple(x.shape[len(lead):])
    outs = (1,) * (3 - k) + tuple(out.shape[len(lead):])
    # where each output coordinate of a padded dim reads the input: np.pad's own modes
    maps = [np.arange(s) for s in ins[:3 - k]]
    maps += [np.pad(np.arange(s), (lo, hi), mode=_NP_MODES[mode])
             for s, (lo, hi) in zip(ins[3 - k:], pads)]
    table = ", ".join(map(str, np.concatenate(maps).tolist()))
    fname = f"tsr_pad_map_{x.dtype.name}"
    _once(prog, f"""/* y[o][a][b][c] = x[o][ma[a]][mb[b]][mc[c]] (maps of the padded dims:
   the output's coordinates in the input), for the rows q = (o OA + a) OB + b in [lo, hi) */
static void {fname}(const {t}* x, {t}* y, const int64_t* in, const int64_t* on,
                    const int64_t* map, int64_t lo, int64_t hi) {{
    const int64_t *ma = map, *mb = map + on[0], *mc = map + on[0] + on[1];
    for (int64_t q = lo; q < hi; q++) {{
        int64_t b = q % on[1], a = q / on[1] % on[0], o = q / on[1] / on[0];
        const {t}* xr = x + ((o * in[0] + ma[a]) * in[1] + mb[b]) * in[2];
        {t}* yr = y + q * on[2];
        for (int64_t c = 0; c < on[2]; c++) yr[c] = xr[mc[c]];
    }}
}}""")
    rows = math.prod(lead) * outs[0] * outs[1]
    prog.steps.append(
        f"{{ static const int64_t pin[] = {{{', '.join(map(str, ins))}}}, "
        f"pon[] = {{{', '.join(map(str, outs))}}}, pmap[] = {{{table}}};\n  " +
        _split(prog, fname, [(f"const {t}*", prog.p(x)), (f"{t}*", prog.p(out)),
                             ("const int64_t*", "pin"), ("const int64_t*", "pon"),
                             ("const int64_t*", "pmap")], rows, out.numel) + " }")


# ---- group norm, batch statistics (instance norm) -------------------------------------------

_NORMS = {
    "group_norm": r"""
/* groups [lo, hi) of a group norm: group q = n G + g is cg channels of s elements, its mean
   and variance (biased, in double) normalise it, then each channel's w and b (or NULL) */
static void tsr_group_norm(const float* x, float* y, const float* w, const float* b,
                           int64_t groups, int64_t cg, int64_t s, const double* eps, int64_t lo,
                           int64_t hi) {
    int64_t len = cg * s;
    for (int64_t q = lo; q < hi; q++) {
        const float* xs = x + q * len;
        float* ys = y + q * len;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < len; j++) mean += xs[j];
        mean /= (double)(len ? len : 1);
        for (int64_t j = 0; j < len; j++) var += (xs[j] - mean) * (xs[j] - mean);
        double rstd = 1.0 / sqrt(var / (double)(len ? len : 1) + *eps);
        for (int64_t c = 0; c < cg; c++) {
            int64_t ch = q % groups * cg + c;
            float sc = (float)rstd * (w ? w[ch] : 1.0f), sh = (b ? b[ch] : 0.0f);
            float mu = (float)mean;
            for (int64_t j = c * s; j < (c + 1) * s; j++) ys[j] = (xs[j] - mu) * sc + sh;
        }
    }
}
""",
    "channel_norm": r"""
/* channels [lo, hi) of a batch norm over x (nb, C, s): each channel's statistics over the
   batch and s (mean, and variance biased, in double), or mean and var given (running
   statistics), normalise it, then w and b (or NULL) */
static void tsr_channel_norm(const float* x, float* y, const float* w, const float* b,
                             const float* mean_in, const float* var_in, int64_t nb, int64_t C,
                             int64_t s, const double* eps, int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; c++) {
        double mean = 0, var = 0, count = (double)(nb * s > 0 ? nb * s : 1);
        if (mean_in) {
            mean = mean_in[c];
            var = var_in[c];
        } else {
            for (int64_t k = 0; k < nb; k++)
                for (int64_t j = 0; j < s; j++) mean += x[(k * C + c) * s + j];
            mean /= count;
            for (int64_t k = 0; k < nb; k++)
                for (int64_t j = 0; j < s; j++) {
                    double d = x[(k * C + c) * s + j] - mean;
                    var += d * d;
                }
            var /= count;
        }
        float sc = (float)(1.0 / sqrt(var + *eps)) * (w ? w[c] : 1.0f), sh = b ? b[c] : 0.0f;
        float mu = (float)mean;
        for (int64_t k = 0; k < nb; k++)
            for (int64_t j = 0; j < s; j++)
                y[(k * C + c) * s + j] = (x[(k * C + c) * s + j] - mu) * sc + sh;
    }
}
""",
}


def _opt(prog: Program, n: Node, v) -> str:
    if v is None:
        return "NULL"
    if not isinstance(v, Value) or v.dtype.name != "float32":
        raise _unsupported(n, f"a parameter {v!r} that is not a float32 tensor")
    return prog.p(v)


def _group_norm(prog: Program, i: int, n: Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    w = n.inputs[1] if len(n.inputs) > 1 else None
    b = n.inputs[2] if len(n.inputs) > 2 else None
    if x.dtype.name != "float32" or len(x.shape) < 2:
        raise _unsupported(n, "only float32 inputs of at least 2 dims")
    N, C = x.shape[:2]
    G = n.attrs["num_groups"]
    s = math.prod(x.shape[2:])
    _once(prog, _NORMS["group_norm"])
    prog.steps.append(f"{{ static const double eps = {float(n.attrs['eps'])!r};\n  " +
                      _split(prog, "tsr_group_norm", [
        ("const float*", prog.p(x)), ("float*", prog.p(out)), ("const float*", _opt(prog, n, w)),
        ("const float*", _opt(prog, n, b)), ("int64_t", str(G)), ("int64_t", str(C // G)),
        ("int64_t", str(s)), ("const double*", "&eps")], N * G, 3 * x.numel) + " }")


def _batch_norm(prog: Program, i: int, n: Node) -> None:
    """A batch norm the export could not fold into an affine map: in training mode (the
    statistics of the input: an instance norm, traced as a batch norm of one sample), or
    with running statistics that are not constants."""
    x, out = n.inputs[0], n.outputs[0]
    w, b, mean, var = (list(n.inputs[1:]) + [None] * 4)[:4]
    if len(n.outputs) != 1:
        raise _unsupported(n, "its statistics read as results")
    if x.dtype.name != "float32" or len(x.shape) < 2:
        raise _unsupported(n, "only float32 inputs of at least 2 dims")
    training = n.attrs.get("training", True) or mean is None or var is None
    if not training and not all(isinstance(v, Value) for v in (mean, var)):
        raise _unsupported(n, "running statistics that are not tensors")
    N, C = x.shape[:2]
    s = math.prod(x.shape[2:])
    _once(prog, _NORMS["channel_norm"])
    prog.steps.append(f"{{ static const double eps = {float(n.attrs['eps'])!r};\n  " +
                      _split(prog, "tsr_channel_norm", [
        ("const float*", prog.p(x)), ("float*", prog.p(out)), ("const float*", _opt(prog, n, w)),
        ("const float*", _opt(prog, n, b)),
        ("const float*", "NULL" if training else _opt(prog, n, mean)),
        ("const float*", "NULL" if training else _opt(prog, n, var)), ("int64_t", str(N)),
        ("int64_t", str(C)), ("int64_t", str(s)), ("const double*", "&eps")],
        C, 3 * x.numel) + " }")


# ---- max pooling of 1-d and 3-d windows -------------------------------------------------------

_MAXPOOL3D = r"""
/* max pooling of planes [lo, hi), (D, H, W) -> (OD, OH, OW): the indexed kernel's values */
static void tsr_maxpool3d(const float* x, float* y, const tsr_geo3* g, int64_t lo,
                          int64_t hi) {
    tsr_maxpool_indices(x, y, NULL, g, lo, hi);
}
"""

_MAX_POOL_2D = RULES["max_pool_values"]


def _max_pool(prog: Program, i: int, n: Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    nd = len(x.shape)
    if nd == 4:
        return _MAX_POOL_2D(prog, i, n)
    if x.dtype.name != "float32" or nd not in (3, 5):
        raise _unsupported(n, "only float32 1-d, 2-d and 3-d max pooling")
    at = n.attrs
    if nd == 3:   # a row of the 2-d window kernel
        N, C, L = x.shape
        (k,), (s,), (p,), (d,) = at["kernel_size"], at["stride"], at["padding"], at["dilation"]
        fname = _window_unit(prog, "mp", 1, k, 1, s, 0, p, 1, d)
        prog.steps.append(_pool_run(fname, [prog.p(x), prog.p(out), "1", str(L), "1",
                                            str(out.shape[2])], N * C, 6))
        return
    geo = _geometry(x.shape[2:], out.shape[2:], at["kernel_size"], at["stride"], at["padding"],
                    at["dilation"])
    _helper(prog, "geometry")
    _once(prog, _MAXPOOL_INDICES)
    _once(prog, _MAXPOOL3D)
    planes = x.shape[0] * x.shape[1]
    prog.steps.append(
        f"{{ static const tsr_geo3 geo = {{1, {geo}}};\n  " +
        _split(prog, "tsr_maxpool3d", [("const float*", prog.p(x)), ("float*", prog.p(out)),
                                       ("const tsr_geo3*", "&geo")], planes,
               out.numel * math.prod(at["kernel_size"])) + " }")


_MAXPOOL_INDICES = r"""
/* max pooling of planes [lo, hi), (D, H, W) -> (OD, OH, OW), with each maximum's position
   in its plane (d H + h) W + w: PyTorch's rule, the window's first element inside the input
   to start, then each larger value and each NaN (the last NaN wins); ix NULL: values only,
   each window clipped to the input (padding never wins), NaN propagating as in PyTorch */
static void tsr_maxpool_indices(const float* x, float* y, int64_t* ix, const tsr_geo3* g,
                                int64_t lo, int64_t hi) {
    for (int64_t q = lo; q < hi; q++) {
        const float* xp = x + q * g->D * g->H * g->W;
        float* yp = y + q * g->OD * g->OH * g->OW;
        int64_t* ip = ix ? ix + q * g->OD * g->OH * g->OW : NULL;
        for (int64_t od = 0; od < g->OD; od++)
            for (int64_t oh = 0; oh < g->OH; oh++)
                for (int64_t ow = 0; ow < g->OW; ow++) {
                    float best = -INFINITY;
                    int64_t at = -1;
                    for (int64_t kd = 0; kd < g->KD; kd++) {
                        int64_t d = od * g->s[0] - g->p[0] + kd * g->d[0];
                        if (d < 0 || d >= g->D) continue;
                        for (int64_t kh = 0; kh < g->KH; kh++) {
                            int64_t h = oh * g->s[1] - g->p[1] + kh * g->d[1];
                            if (h < 0 || h >= g->H) continue;
                            for (int64_t kw = 0; kw < g->KW; kw++) {
                                int64_t w = ow * g->s[2] - g->p[2] + kw * g->d[2];
                                if (w < 0 || w >= g->W) continue;
                                int64_t p = (d * g->H + h) * g->W + w;
                                float v = xp[p];
                                if (at < 0) at = p;
                                if (v > best || v != v) {
                                    best = v;
                                    at = p;
                                }
                            }
                        }
                    }
                    *yp++ = best;
                    if (ip) *ip++ = at;
                }
    }
}
"""


def _max_pool_indices(prog: Program, i: int, n: Node) -> None:
    """max_pool with its indices (``return_indices=True``), 1-d to 3-d: int64 positions in
    each input plane, as PyTorch's."""
    x = n.inputs[0]
    out, idx = n.outputs
    if x.dtype.name != "float32" or len(x.shape) not in (3, 4, 5):
        raise _unsupported(n, "only float32 1-d, 2-d and 3-d max pooling")
    if out.numel == 0:
        return
    at = n.attrs
    geo = _geometry(x.shape[2:], out.shape[2:], at["kernel_size"], at["stride"], at["padding"],
                    at["dilation"])
    _helper(prog, "geometry")
    _once(prog, _MAXPOOL_INDICES)
    prog.steps.append(
        f"{{ static const tsr_geo3 geo = {{1, {geo}}};\n  " +
        _split(prog, "tsr_maxpool_indices", [
            ("const float*", prog.p(x)), ("float*", prog.p(out)), ("int64_t*", prog.p(idx)),
            ("const tsr_geo3*", "&geo")], x.shape[0] * x.shape[1],
            out.numel * math.prod(at["kernel_size"])) + " }")


RULES.update({"argmax": _argmax, "argmin": _argmax, "max_dim": _argmax, "min_dim": _argmax,
              "cumsum": _cumsum, "topk": _topk,
              "gather": _gather, "index_select": _index_select, "remainder": _remainder,
              "pad": _pad,
              "group_norm": _group_norm, "batch_norm": _batch_norm,
              "max_pool_values": _max_pool, "max_pool": _max_pool_indices, "sort": _sort})
MULTI_OUTPUT.update({"max_pool", "sort"})
