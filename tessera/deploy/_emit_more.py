"""More rules of the exported program, registered into ``_emit.RULES``: vector p-norms
(``F.normalize``), 1-d and 3-d convolutions (im2col, then tessera's GEMM with the bias,
activation and residual in its epilogue), transposed convolutions (the GEMM, then col2im),
interpolation in every mode eager has (nearest, linear, bilinear, trilinear, bicubic, area,
either align_corners: the taps eager computes, taken at export), average pooling and
constant padding.

The C helpers they call are static functions of the program, emitted once where used
(``_helper``). 2-d convolutions stay with ``_emit._conv``.

>>> from tessera.deploy._emit import RULES
>>> {"norm", "interpolate", "conv_input_grad", "avg_pool", "constant_pad"} <= set(RULES)
True
"""
from __future__ import annotations

import math

import numpy as np

from tessera.deploy._emit import RULES, Program, _epilogue, _gemm_call, _unsupported
from tessera.graph.ir import Node, Value
from tessera.kernels.threadpool import SPLIT_MIN

__all__: list[str] = []

# ---- C helpers, each emitted once into the program that uses it ---------------------------

_HELPERS = {
    # g: C, D, H, W, KD, KH, KW, OD, OH, OW, stride (3), padding (3), dilation (3)
    "geometry": r"""
typedef struct { int64_t C, D, H, W, KD, KH, KW, OD, OH, OW, s[3], p[3], d[3]; } tsr_geo3;
""",
    "im2col3d": r"""
/* rows [lo, hi) of cols[(c, kd, kh, kw)][(od, oh, ow)] = x[c][od s - p + kd d]... (0 in
   the padding) */
static void tsr_im2col3d(const float* x, float* cols, const tsr_geo3* g, int64_t lo,
                         int64_t hi) {
    int64_t P = g->OD * g->OH * g->OW;
    for (int64_t row = lo; row < hi; row++) {
        int64_t kw = row % g->KW, kh = row / g->KW % g->KH, kd = row / (g->KW * g->KH) % g->KD;
        int64_t c = row / (g->KW * g->KH * g->KD);
        float* r = cols + row * P;
        for (int64_t od = 0; od < g->OD; od++) {
            int64_t id = od * g->s[0] - g->p[0] + kd * g->d[0];
            for (int64_t oh = 0; oh < g->OH; oh++) {
                int64_t ih = oh * g->s[1] - g->p[1] + kh * g->d[1];
                int inside = id >= 0 && id < g->D && ih >= 0 && ih < g->H;
                const float* xr = x + ((c * g->D + id) * g->H + ih) * g->W;
                for (int64_t ow = 0; ow < g->OW; ow++, r++) {
                    int64_t iw = ow * g->s[2] - g->p[2] + kw * g->d[2];
                    *r = inside && iw >= 0 && iw < g->W ? xr[iw] : 0.0f;
                }
            }
        }
    }
}
""",
    "col2im3d": r"""
/* the adjoint of tsr_im2col3d for channels [lo, hi): x (zeroed first) += cols at the
   positions im2col reads (each channel's planes its own: the threads take channels) */
static void tsr_col2im3d(const float* cols, float* x, const tsr_geo3* g, int64_t lo,
                         int64_t hi) {
    int64_t P = g->OD * g->OH * g->OW, plane = g->D * g->H * g->W;
    memset(x + lo * plane, 0, (size_t)((hi - lo) * plane) * sizeof(float));
    cols += lo * g->KD * g->KH * g->KW * P;
    for (int64_t c = lo; c < hi; c++)
        for (int64_t kd = 0; kd < g->KD; kd++)
            for (int64_t kh = 0; kh < g->KH; kh++)
                for (int64_t kw = 0; kw < g->KW; kw++, cols += P) {
                    const float* r = cols;
                    for (int64_t od = 0; od < g->OD; od++) {
                        int64_t id = od * g->s[0] - g->p[0] + kd * g->d[0];
                        for (int64_t oh = 0; oh < g->OH; oh++) {
                            int64_t ih = oh * g->s[1] - g->p[1] + kh * g->d[1];
                            int inside = id >= 0 && id < g->D && ih >= 0 && ih < g->H;
                            float* xr = x + ((c * g->D + id) * g->H + ih) * g->W;
                            for (int64_t ow = 0; ow < g->OW; ow++, r++) {
                                int64_t iw = ow * g->s[2] - g->p[2] + kw * g->d[2];
                                if (inside && iw >= 0 && iw < g->W) xr[iw] += *r;
                            }
                        }
                    }
                }
}
""",
    "resample": r"""
/* y[o][j][i] = sum_t x[o][idx[t][j]][i] w[t][j] (t in order, as eager sums its taps): one
   dimension of a separable interpolation, (outer, n_in, inner) -> (outer, n_out, inner), for
   the rows o * n_out + j in [lo, hi) */
static void tsr_resample(const float* x, float* y, int64_t n_in, int64_t n_out, int64_t inner,
                         int64_t taps, const int64_t* idx, const float* w, int64_t lo,
                         int64_t hi) {
    for (int64_t oj = lo; oj < hi; oj++) {
        int64_t o = oj / n_out, j = oj % n_out;
        float* yr = y + oj * inner;
        const float* x0 = x + (o * n_in + idx[j]) * inner;
        for (int64_t i = 0; i < inner; i++) yr[i] = x0[i] * w[j];
        for (int64_t t = 1; t < taps; t++) {
            const float* xt = x + (o * n_in + idx[t * n_out + j]) * inner;
            float wt = w[t * n_out + j];
            for (int64_t i = 0; i < inner; i++) yr[i] += xt[i] * wt;
        }
    }
}
""",
    "pnorm": r"""
/* y[o][i] = (sum_r |x[o][r][i]|^p)^(1/p), summed in double; p = inf, -inf: max, min of |x|;
   p = 0: the count of non-zeros */
static void tsr_pnorm(const float* x, float* y, int64_t outer, int64_t r, int64_t inner,
                      double p) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const float* xs = x + o * r * inner + i;
            double s = isinf(p) ? (p > 0 ? 0.0 : INFINITY) : 0.0;
            for (int64_t k = 0; k < r; k++) {
                double a = fabs((double)xs[k * inner]);
                if (isinf(p)) s = p > 0 ? (a > s ? a : s) : (a < s ? a : s);
                else if (p == 0) s += a != 0;
                else if (p == 1) s += a;
                else if (p == 2) s += a * a;
                else s += pow(a, p);
            }
            y[o * inner + i] = (float)(isinf(p) || p == 0 || p == 1 ? s
                                       : p == 2 ? sqrt(s) : pow(s, 1.0 / p));
        }
}
""",
    "avgpool3d": r"""
/* average pooling of planes [lo, hi), (D, H, W) -> (OD, OH, OW): window sums over the input,
   divided by the window clipped to the padded input (include_pad) or to the input, or by
   div > 0 */
static void tsr_avgpool3d(const float* x, float* y, const tsr_geo3* g, int64_t include_pad,
                          int64_t div, int64_t lo, int64_t hi) {
    x += lo * g->D * g->H * g->W;
    y += lo * g->OD * g->OH * g->OW;
    for (int64_t q = lo; q < hi; q++, x += g->D * g->H * g->W)
        for (int64_t od = 0; od < g->OD; od++)
            for (int64_t oh = 0; oh < g->OH; oh++)
                for (int64_t ow = 0; ow < g->OW; ow++) {
                    int64_t a[3] = {od * g->s[0] - g->p[0], oh * g->s[1] - g->p[1],
                                    ow * g->s[2] - g->p[2]};
                    int64_t n[3] = {g->D, g->H, g->W}, k[3] = {g->KD, g->KH, g->KW};
                    int64_t lo[3], hi[3], all = 1, inside = 1;
                    for (int e = 0; e < 3; e++) {
                        int64_t end = a[e] + k[e] < n[e] + g->p[e] ? a[e] + k[e] : n[e] + g->p[e];
                        all *= end - a[e];
                        lo[e] = a[e] > 0 ? a[e] : 0;
                        hi[e] = end < n[e] ? end : n[e];
                        inside *= hi[e] - lo[e];
                    }
                    float s = 0.0f;
                    for (int64_t d = lo[0]; d < hi[0]; d++)
                        for (int64_t h = lo[1]; h < hi[1]; h++)
                            for (int64_t w = lo[2]; w < hi[2]; w++)
                                s += x[(d * g->H + h) * g->W + w];
                    *y++ = s / (float)(div > 0 ? div : include_pad ? all : inside);
                }
}
""",
}


def _helper(prog: Program, *names: str) -> None:
    for name in names:
        text = _HELPERS[name]
        if text not in prog.kernels:
            prog.kernels.append(text)


def _split(prog: Program, func: str, args: list[tuple[str, str]], extent: int,
           work: int) -> str:
    """C running ``func(args..., lo, hi)`` over [0, extent), split into a share per kernel
    thread when ``work`` (elements touched) is worth it (``args``: (C type, expression);
    the helper's work item is emitted once)."""
    call = ", ".join(e for _, e in args)
    if work < SPLIT_MIN or extent < 2:
        return f"{func}({call}, 0, {extent});"
    k = len(args)
    item = f"static int64_t {func}_item("
    if not any(t.startswith(item) for t in prog.kernels):
        casts = ", ".join(f"c[{j}]" if t == "int64_t" else f"({t})(intptr_t)c[{j}]"
                          for j, (t, _) in enumerate(args))
        prog.kernels.append(
            f"{item}const int64_t* c, int64_t i) {{\n"
            f"    {func}({casts}, c[{k + 1}] * i / c[{k}], c[{k + 1}] * (i + 1) / c[{k}]);\n"
            f"    return 0;\n}}")
    ctx = ", ".join(e if t == "int64_t" else f"(int64_t)(intptr_t)({e})" for t, e in args)
    return (f"{{ int64_t n = m->threads < {extent} ? m->threads : {extent};\n"
            f"  int64_t c[] = {{{ctx}, n, {extent}}};\n"
            f"  tsr_pool_run({func}_item, c, n, m->threads); }}")


def _work(prog: Program, nbytes: int) -> str:
    """A region of the model's work buffer for this node's temporaries: its C pointer."""
    off = prog.work_bytes
    prog.work_bytes = off + (nbytes + 63) // 64 * 64
    return f"((float*)(m->work + {off}))"


def _geometry(spatial_in, spatial_out, kernel, stride, pads, dilation) -> str:
    """A tsr_geo3 initialiser (C filled in by the caller) for 1 to 3 spatial dims, padded to
    3 with leading dims of size 1."""
    pad = 3 - len(spatial_in)
    one = (1,) * pad

    def three(v, fill):
        return (fill,) * pad + tuple(v)
    d, h, w = one + tuple(spatial_in)
    kd, kh, kw = three(kernel, 1)
    od, oh, ow = one + tuple(spatial_out)
    return (f"{d}, {h}, {w}, {kd}, {kh}, {kw}, {od}, {oh}, {ow}, "
            f"{{{', '.join(map(str, three(stride, 1)))}}}, "
            f"{{{', '.join(map(str, three(pads, 0)))}}}, "
            f"{{{', '.join(map(str, three(dilation, 1)))}}}")


def _float(v: float) -> str:
    return ("-INFINITY" if v < 0 else "INFINITY") if math.isinf(v) else f"{v!r}f"


# ---- p-norms ---------------------------------------------------------------------------

def _norm(prog: Program, i: int, n: Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    if x.dtype.name != "float32" or out.dtype.name != "float32":
        raise _unsupported(n, "only float32 norms")
    nd = len(x.shape)
    dim = n.attrs.get("dim")
    dims = sorted({d % nd for d in (dim if isinstance(dim, (tuple, list)) else [dim])}) \
        if dim is not None and nd else list(range(nd))
    if dims and dims != list(range(dims[0], dims[-1] + 1)):
        raise _unsupported(n, f"a norm over dims {dims} that are not consecutive")
    lo, hi = (dims[0], dims[-1] + 1) if dims else (0, 0)
    outer, r = math.prod(x.shape[:lo]), math.prod(x.shape[lo:hi])
    inner = math.prod(x.shape[hi:])
    p = float(n.attrs.get("ord", 2.0))
    _helper(prog, "pnorm")
    ps = ("INFINITY" if p > 0 else "-INFINITY") if math.isinf(p) else repr(p)
    prog.steps.append(f"tsr_pnorm({prog.p(x)}, {prog.p(out)}, {outer}, {r}, {inner}, {ps});")


# ---- 1-d and 3-d convolutions, transposed convolutions ------------------------------------

_CONV2D = RULES["conv"]
_CONV2D_POINTWISE = RULES["conv_pointwise"]


def _conv_nd(prog: Program, i: int, n: Node) -> None:
    x, w = n.inputs[0], n.inputs[1]
    if len(x.shape) == 4:
        return (_CONV2D if n.op.name == "conv" else _CONV2D_POINTWISE)(prog, i, n)
    out = n.outputs[0]
    if len(x.shape) not in (3, 5) or x.dtype.name != "float32" or w.kind != "var" or \
            n.attrs.get("transposed"):
        raise _unsupported(n, "only float32 1-d, 2-d and 3-d convolutions with constant "
                              "weights")
    N, C, *sp_in = x.shape
    O, Cg, *kernel = w.shape
    sp_out = out.shape[2:]
    G = n.attrs.get("groups", 1)
    Og, P, CK = O // G, math.prod(sp_out), Cg * math.prod(kernel)
    pads = [p[0] for p in n.attrs["pads"]]
    geo = _geometry(sp_in, sp_out, kernel, n.attrs["stride"], pads, n.attrs["dilation"])
    _helper(prog, "geometry", "im2col3d")
    cols = _work(prog, CK * P * 4)
    S = math.prod(sp_in)
    prog.steps.append(
        f"{{ static const tsr_geo3 geo = {{{Cg}, {geo}}};\n"
        f"for (int64_t q = 0; q < {N * G}; q++) {{\n"
        "  " + _split(prog, "tsr_im2col3d", [
            ("const float*", f"{prog.p(x)} + (q / {G} * {C} + q % {G} * {Cg}) * {S}"),
            ("float*", cols), ("const tsr_geo3*", "&geo")], CK, CK * P) + "\n"
        "  " + _gemm_call(prog, str(Og), str(P), str(CK), f"{prog.p(w)} + q % {G} * {Og * CK}",
                          str(CK), cols, str(P), f"{prog.p(out)} + q * {Og * P}", str(P),
                          epilogue=_epilogue(prog, n, f"q % {G}", Og, P)) + "\n}}")


def _conv_transposed(prog: Program, i: int, n: Node) -> None:
    """conv_input_grad, the op of ConvTranspose: the columns W^T x, folded back (col2im)."""
    x, w, out = n.inputs[0], n.inputs[1], n.outputs[0]
    if x.dtype.name != "float32" or not isinstance(w, Value) or w.kind != "var" or \
            len(x.shape) not in (3, 4, 5):
        raise _unsupported(n, "only float32 transposed convolutions with constant weights")
    N, O, *sp_x = x.shape
    _, Cg, *kernel = w.shape
    sp_y = out.shape[2:]
    C = out.shape[1]
    G = n.attrs.get("groups", 1)
    Og, Px, CK = O // G, math.prod(sp_x), Cg * math.prod(kernel)
    pads = [p[0] for p in n.attrs["pads"]]
    # the forward convolution's geometry: input y (C per group), output x
    geo = _geometry(sp_y, sp_x, kernel, n.attrs["stride"], pads, n.attrs["dilation"])
    _helper(prog, "geometry", "col2im3d")
    cols = _work(prog, CK * Px * 4)
    Sy = math.prod(sp_y)
    prog.steps.append(
        f"{{ static const tsr_geo3 geo = {{{Cg}, {geo}}};\n"
        f"for (int64_t q = 0; q < {N * G}; q++) {{\n"
        "  " + _gemm_call(prog, str(CK), str(Px), str(Og), f"{prog.p(w)} + q % {G} * {Og * CK}",
                          "1", f"{prog.p(x)} + (q / {G} * {O} + q % {G} * {Og}) * {Px}",
                          str(Px), cols, str(Px), csa=str(CK)) + "\n"
        "  " + _split(prog, "tsr_col2im3d", [
            ("const float*", cols),
            ("float*", f"{prog.p(out)} + (q / {G} * {C} + q % {G} * {Cg}) * {Sy}"),
            ("const tsr_geo3*", "&geo")], Cg, CK * Px) + "\n}}")


# ---- interpolation, average pooling, constant padding ---------------------------------------

def _interpolate(prog: Program, i: int, n: Node) -> None:
    from tessera.ops.vision import _plans
    x, out = n.inputs[0], n.outputs[0]
    if x.dtype.name != "float32":
        raise _unsupported(n, "only float32 interpolation")
    at = n.attrs
    plans = _plans(x.shape, x.dtype.np, at["mode"], at["size"], at["scales"],
                   at["align_corners"])
    steps = []   # (dim, taps, idx (taps, n_out), w (taps, n_out))
    for d, plan in enumerate(plans):
        n_in, n_out = x.shape[2 + d], out.shape[2 + d]
        if plan[0] == "same":
            continue
        if plan[0] == "take":
            idx, w = np.asarray(plan[1])[None], np.ones((1, n_out), np.float32)
        elif plan[0] == "block":
            k = plan[1]
            idx = np.arange(n_out)[None] * k + np.arange(k)[:, None]
            w = np.full((k, n_out), 1.0 / k, np.float32)
        else:
            idx, w = np.asarray(plan[1]), np.asarray(plan[2], np.float32)
        steps.append((d, n_in, n_out, idx.astype(np.int64), w))
    shape = list(x.shape)
    src = prog.p(x)
    if not steps:
        prog.steps.append(f"memcpy({prog.p(out)}, {src}, {out.nbytes});")
        return
    _helper(prog, "resample")
    temps = []
    lines = ["{"]
    for k, (d, n_in, n_out, idx, w) in enumerate(steps):
        outer = math.prod(shape[:2 + d])
        inner = math.prod(shape[3 + d:])
        shape[2 + d] = n_out
        if k == len(steps) - 1:
            dst = prog.p(out)
        else:
            dst = _work(prog, math.prod(shape) * 4)
            temps.append(dst)
        ids = ", ".join(map(str, idx.reshape(-1).tolist()))
        ws = ", ".join(f"{float(v)!r}f" for v in w.reshape(-1).tolist())
        lines.append(f"  {{ static const int64_t idx[] = {{{ids}}};\n"
                     f"    static const float w[] = {{{ws}}};\n"
                     "    " + _split(prog, "tsr_resample", [
                         ("const float*", src), ("float*", dst), ("int64_t", str(n_in)),
                         ("int64_t", str(n_out)), ("int64_t", str(inner)),
                         ("int64_t", str(idx.shape[0])), ("const int64_t*", "idx"),
                         ("const float*", "w")], outer * n_out,
                         outer * n_out * inner * idx.shape[0]) + " }")
        src = dst
    prog.steps.append("\n".join(lines) + "\n}")


def _avg_pool(prog: Program, i: int, n: Node) -> None:
    from tessera.ops.pool import _avg_out
    x, out = n.inputs[0], n.outputs[0]
    at = n.attrs
    if x.dtype.name != "float32" or len(x.shape) not in (3, 4, 5):
        raise _unsupported(n, "only float32 1-d, 2-d and 3-d average pooling")
    sp_in = x.shape[2:]
    sp_out = _avg_out(sp_in, at["kernel_size"], at["stride"], at["padding"], at["ceil_mode"])
    assert tuple(sp_out) == tuple(out.shape[2:]), (sp_out, out.shape)
    geo = _geometry(sp_in, sp_out, at["kernel_size"], at["stride"], at["padding"],
                    (1,) * len(sp_in))
    _helper(prog, "geometry", "avgpool3d")
    div = at.get("divisor_override") or 0
    planes = x.shape[0] * x.shape[1]
    prog.steps.append(
        f"{{ static const tsr_geo3 geo = {{1, {geo}}};\n"
        "  " + _split(prog, "tsr_avgpool3d", [
            ("const float*", prog.p(x)), ("float*", prog.p(out)), ("const tsr_geo3*", "&geo"),
            ("int64_t", str(int(bool(at["count_include_pad"])))), ("int64_t", str(div))],
            planes, planes * math.prod(sp_out) * math.prod(at["kernel_size"])) + " }")


def _constant_pad(prog: Program, i: int, n: Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    pads = n.attrs["pads"]       # (lo, hi) of the last len(pads) dims
    if x.dtype.name != "float32":
        raise _unsupported(n, "only float32 padding")
    nd = len(x.shape)
    full = [(0, 0)] * (nd - len(pads)) + list(pads)
    if any(lo < 0 or hi < 0 for lo, hi in full):
        raise _unsupported(n, "negative padding (a crop)")
    value = float(n.attrs.get("value", 0.0))
    # the output filled, then the input copied in row by row (rows of the last dim)
    st = [math.prod(out.shape[d + 1:]) for d in range(nd)]
    start = sum(lo * s for (lo, _), s in zip(full, st))
    rows, width = math.prod(x.shape[:-1]), x.shape[-1] if nd else 1
    idx = np.zeros(rows, np.int64)
    if nd > 1:
        grid = np.indices(x.shape[:-1]).reshape(nd - 1, -1)
        idx = (grid * np.array(st[:-1])[:, None]).sum(0)
    ids = ", ".join(map(str, (idx + start).tolist()))
    fill = f"{_float(value)}" if value == value else "NAN"
    prog.steps.append(
        f"{{ float* y = {prog.p(out)}; const float* x = {prog.p(x)};\n"
        f"  for (int64_t j = 0; j < {out.numel}; j++) y[j] = {fill};\n"
        f"  static const int64_t at[] = {{{ids}}};\n"
        f"  for (int64_t r = 0; r < {rows}; r++)\n"
        f"    memcpy(y + at[r], x + r * {width}, {width * 4}); }}")


_AREA_2D = RULES["interpolate"]


def _interpolate_any(prog: Program, i: int, n: Node) -> None:
    if n.attrs.get("mode") == "area" and len(n.inputs[0].shape) == 4:
        return _AREA_2D(prog, i, n)
    return _interpolate(prog, i, n)


RULES.update({"norm": _norm, "conv": _conv_nd, "conv_pointwise": _conv_nd,
              "conv_input_grad": _conv_transposed, "avg_pool": _avg_pool,
              "constant_pad": _constant_pad, "interpolate": _interpolate_any})
