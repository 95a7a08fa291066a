"""Rules of the exported program for tiling, rolling, adaptive max pooling and the
extremes the fused regions leave, registered into ``_emit.RULES``: ``repeat`` (``tile``
traces to it: a strided copy reading each input element once per repeat), ``roll`` (along
given dims, or of the flattened tensor), ``adaptive_max_pool`` in 1 to 3 dims (values and
indices: the first maximum of each window, or its last NaN, as PyTorch), and ``amax``/``amin``,
``max``/``min`` of all elements and ``aminmax`` over consecutive dims of any dtype the
library takes (a float ``amax`` or ``amin`` stays the region the code generator renders).

>>> from tessera.deploy._emit import RULES
>>> {"repeat", "roll", "adaptive_max_pool", "aminmax"} <= set(RULES)
True
"""
from __future__ import annotations

import math

from tessera.deploy._emit import (
    MULTI_OUTPUT,
    RULES,
    Program,
    _elementwise_body,
    _region,
    _unsupported,
)
from tessera.deploy._emit_index import _ctype, _once
from tessera.deploy._emit_more import _split
from tessera.graph.ir import Node

__all__: list[str] = []


# ---- repeat (tile) ---------------------------------------------------------------------------

def _repeat(prog: Program, i: int, n: Node) -> None:
    """The output seen as (r0, s0, r1, s1, ...): repeat k of input dim d reads the input
    from its start (stride 0 along r_d)."""
    x, out = n.inputs[0], n.outputs[0]
    reps = tuple(n.attrs["repeats"])
    shape = (1,) * (len(reps) - len(x.shape)) + tuple(x.shape)
    strides, step = [], 1
    for s in reversed(shape):
        strides.append(step)
        step *= s
    strides.reverse()
    dims, st = [], []
    for r, s, t in zip(reps, shape, strides):
        for size, stride in ((r, 0), (s, t)):
            if size != 1:
                dims.append(size)
                st.append(stride)
    if out.numel == 0:
        return
    if len(dims) > 8:
        raise _unsupported(n, "more than 4 repeated dimensions")
    dims, st = dims or [1], st or [0]
    prog.steps.append(
        f"{{ static const int64_t s[] = {{{', '.join(map(str, dims))}}}, "
        f"t[] = {{{', '.join(map(str, st))}}};\n"
        f"  tsr_strided_copy({prog.p(out)}, {prog.p(x)}, {len(dims)}, s, t, 0, "
        f"{out.dtype.itemsize}); }}")


# ---- roll ------------------------------------------------------------------------------------

_ROLL = r"""
/* rows [lo, hi) of y = x rolled by shift[d] (in [0, shape[d])) along each of its nd dims, the
   last one's two parts copied whole (nd in [1, 8]; item: bytes per element) */
static void tsr_roll(const unsigned char* x, unsigned char* y, int64_t nd, const int64_t* shape,
                     const int64_t* shift, int64_t item, int64_t lo, int64_t hi) {
    int64_t L = shape[nd - 1], s = shift[nd - 1];
    for (int64_t q = lo; q < hi; q++) {
        int64_t src = 0, rest = q, scale = 1;
        for (int64_t d = nd - 2; d >= 0; d--) {
            int64_t c = rest % shape[d];
            rest /= shape[d];
            c = c >= shift[d] ? c - shift[d] : c - shift[d] + shape[d];
            src += c * scale;
            scale *= shape[d];
        }
        const unsigned char* xr = x + src * L * item;
        unsigned char* yr = y + q * L * item;
        memcpy(yr, xr + (L - s) * item, (size_t)(s * item));
        memcpy(yr + s * item, xr, (size_t)((L - s) * item));
    }
}"""


def _roll(prog: Program, i: int, n: Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    shifts, dims = tuple(n.attrs["shifts"]), n.attrs.get("dims")
    if out.numel == 0:
        return
    if dims is None or dims == ():
        shape, shift = [x.numel], [shifts[0] % x.numel]
    else:
        shape = list(x.shape)
        shift = [0] * len(shape)
        for s, d in zip(shifts, dims):
            d %= len(shape)
            shift[d] = (shift[d] + s) % shape[d]
    if len(shape) > 8:
        raise _unsupported(n, "more than 8 dimensions")
    shape, shift = shape or [1], shift or [0]
    _once(prog, _ROLL)
    name = f"{prog.name}_roll{i}"
    prog.kernels.append(f"static const int64_t {name}[] = "
                        f"{{{', '.join(map(str, shape + shift))}}};")
    nd = len(shape)
    prog.steps.append(_split(prog, "tsr_roll", [
        ("const unsigned char*", f"(const unsigned char*){prog.p(x)}"),
        ("unsigned char*", f"(unsigned char*){prog.p(out)}"), ("int64_t", str(nd)),
        ("const int64_t*", name), ("const int64_t*", f"{name} + {nd}"),
        ("int64_t", str(out.dtype.itemsize))], out.numel // shape[-1], out.numel))


# ---- adaptive max pooling ----------------------------------------------------------------------

_ADAPTIVE_MAX = r"""
/* adaptive max pooling of planes [lo, hi), (D, H, W) -> (OD, OH, OW): window o of a dim of n
   spans [o n / on, ceil((o + 1) n / on)); y its first maximum (the last NaN), idx that
   element's position in the plane */
static void tsr_adaptive_max(const float* x, float* y, int64_t* idx, const int64_t* g,
                             int64_t lo, int64_t hi) {
    int64_t D = g[0], H = g[1], W = g[2], OD = g[3], OH = g[4], OW = g[5];
    int64_t out = OD * OH * OW;
    for (int64_t q = lo; q < hi; q++) {
        const float* xq = x + q * D * H * W;
        for (int64_t o = 0; o < out; o++) {
            int64_t od = o / (OH * OW), oh = o / OW % OH, ow = o % OW;
            int64_t d0 = od * D / OD, d1 = ((od + 1) * D + OD - 1) / OD;
            int64_t h0 = oh * H / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
            int64_t w0 = ow * W / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
            int64_t at = (d0 * H + h0) * W + w0;
            float best = xq[at];
            for (int64_t d = d0; d < d1; d++)
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) {
                        int64_t p = (d * H + h) * W + w;
                        float v = xq[p];
                        if (v > best || v != v) { best = v; at = p; }
                    }
            y[q * out + o] = best;
            if (idx) idx[q * out + o] = at;
        }
    }
}"""


def _adaptive_max_pool(prog: Program, i: int, n: Node) -> None:
    x = n.inputs[0]
    vals, ids = n.outputs
    osize = tuple(n.attrs["output_size"])
    nd = len(osize)
    if x.dtype.name != "float32" or not 1 <= nd <= 3:
        raise _unsupported(n, "only float32 1-d, 2-d and 3-d adaptive max pooling")
    if vals.numel == 0:
        return
    spatial = (1,) * (3 - nd) + tuple(x.shape[2:])
    outs = (1,) * (3 - nd) + osize
    _once(prog, _ADAPTIVE_MAX)
    name = f"{prog.name}_amp{i}"
    prog.kernels.append(f"static const int64_t {name}[] = "
                        f"{{{', '.join(map(str, spatial + outs))}}};")
    planes = x.shape[0] * x.shape[1]
    prog.steps.append(_split(prog, "tsr_adaptive_max", [
        ("const float*", prog.p(x)), ("float*", prog.p(vals)), ("int64_t*", prog.p(ids)),
        ("const int64_t*", name)], planes, x.numel))


# ---- max, min, amax, amin and aminmax over consecutive dims -------------------------------

def _extreme_helper(prog: Program, n: Node, t: str, floating: bool) -> str:
    fname = f"tsr_extremes_{t.replace(' ', '_')}"
    nan = "if (v != v) { lo_v = hi_v = v; break; }\n            " if floating else ""
    _once(prog, f"""/* the smallest and largest of x[o][k][i] over k (a NaN: NaN), into mn[q] and
   mx[q] (either NULL: not), for the rows q = o inner + i in [lo, hi) */
static void {fname}(const {t}* x, {t}* mn, {t}* mx, int64_t r, int64_t inner, int64_t lo,
                    int64_t hi) {{
    for (int64_t q = lo; q < hi; q++) {{
        const {t}* xs = x + q / inner * r * inner + q % inner;
        {t} lo_v = xs[0], hi_v = xs[0];
        for (int64_t k = {1 if not floating else 0}; k < r; k++) {{
            {t} v = xs[k * inner];
            {nan}if (v < lo_v) lo_v = v;
            if (v > hi_v) hi_v = v;
        }}
        if (mn) mn[q] = lo_v;
        if (mx) mx[q] = hi_v;
    }}
}}""")
    return fname


def _extreme(prog: Program, i: int, n: Node) -> None:
    """amax/amin (a float one: its region), max/min of all elements, aminmax: (min, max)."""
    x = n.inputs[0]
    body = _elementwise_body(n) if n.op.name in ("amax", "amin") else None
    if body is not None:
        return _region(prog, i, body[0], body[1], [n.outputs[0]])
    nd = len(x.shape)
    dim = n.attrs.get("dim")
    dims = sorted({d % nd for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}) \
        if dim is not None and dim != () and nd else list(range(nd))
    if dims and dims != list(range(dims[0], dims[-1] + 1)):
        raise _unsupported(n, "dims that are not consecutive")
    outer = math.prod(x.shape[:dims[0]]) if dims else 1
    r = math.prod(x.shape[d] for d in dims)
    inner = math.prod(x.shape[dims[-1] + 1:]) if dims else 1
    if r == 0:
        raise _unsupported(n, "an empty reduction")
    t = _ctype(n, x)
    if n.op.name == "aminmax":
        mn, mx = n.outputs
    elif n.op.name in ("amin", "min"):
        mn, mx = n.outputs[0], None
    else:
        mn, mx = None, n.outputs[0]
    fname = _extreme_helper(prog, n, t, x.dtype.name.startswith("float"))
    prog.steps.append(_split(prog, fname, [
        (f"const {t}*", prog.p(x)), (f"{t}*", prog.p(mn) if mn else "NULL"),
        (f"{t}*", prog.p(mx) if mx else "NULL"), ("int64_t", str(r)),
        ("int64_t", str(inner))], outer * inner, x.numel))


RULES.update({"repeat": _repeat, "roll": _roll, "adaptive_max_pool": _adaptive_max_pool,
              "amax": _extreme, "amin": _extreme, "max": _extreme, "min": _extreme,
              "aminmax": _extreme})
MULTI_OUTPUT.update({"adaptive_max_pool", "aminmax"})
