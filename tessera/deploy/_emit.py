"""The C program of an exported model: one rule per op kind, from the graph to C text.

Every value lives in one of four places: a caller's input or output buffer, the weights
payload (loaded once), or the arena at the offset ``tessera.graph.memory`` plans, so
``run`` allocates nothing. Views that keep their input's layout (a reshape, a contiguous
slice) share its buffer; any other data movement (a transpose, a strided slice) is a copy
into a buffer of its own, read by the kernels as contiguous. Which it is comes from the
op's own CPU kernel run on an index array, so no movement op needs a rule of its own.

The rules (``RULES``, keyed by op name): fused elementwise regions and single elementwise
ops are the C the graph's code generator renders (``tessera.codegen.loops``); matrix
products and convolutions run on tessera's GEMM (``kernels/c/gemm.c``, a weight's panels
packed once at load); depthwise convolution and max pooling are ``kernels/c/depthwise.c``
and ``maxpool.c`` compiled for each window geometry.
"""
from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field

import numpy as np

from tessera.codegen.loops import lower, render, supported
from tessera.codegen.passes.outline import _body
from tessera.codegen.rowwise import writes_before_reading
from tessera.graph.ir import Graph, Node, Value
from tessera.graph.memory import ALIGN, plan_memory
from tessera.graph.passes.nchwc import _conv_plan
from tessera.kernels import nchwc as K
from tessera.kernels.c_expr import CType
from tessera.kernels.threadpool import SPLIT_MIN
from tessera.ops.registry import REGISTRY

__all__ = ["Program", "emit", "weight_table", "has_rule"]

CTYPES = {**CType.NAMES, "uint8": "uint8_t", "int8": "int8_t", "quint8": "uint8_t",
          "qint8": "int8_t", "qint32": "int32_t"}
# ops whose result is their input's elements moved about (read from an index array)
MOVEMENT = frozenset({"clone", "contiguous", "permute", "transpose", "expand", "flip",
                      "repeat", "t", "cat_single"})


@dataclass
class Loc:
    """Where a value's elements are: ``base`` (a C pointer expression to bytes) + offset."""

    base: str
    offset: int = 0

    def ptr(self, v: Value) -> str:
        t = CTYPES[v.dtype.name]
        return f"(({t}*)({self.base} + {self.offset}))"


@dataclass
class Program:
    name: str
    graph: Graph
    weights: dict = field(default_factory=dict)     # name -> (byte offset, array or None:
                                                    # the variable's value)
    values: dict = field(default_factory=dict)      # variable name -> its NumPy value
    payload_bytes: int = 0
    packed: list = field(default_factory=list)      # (weight offset, k, n) packed at load
    kernels: list = field(default_factory=list)     # C text before the run function
    regions: list = field(default_factory=list)     # the regions' C (units of their own)
    units: dict = field(default_factory=dict)       # extra translation unit file -> text
    prototypes: list = field(default_factory=list)
    steps: list = field(default_factory=list)       # C lines of the run function
    scratch_bytes: int = 0                          # im2col columns (0: no im2col)
    work_bytes: int = 0                             # attention's row sums and masks
    attention: bool = False                         # the program calls tsr_attention_run
    strided: dict = field(default_factory=dict)     # id(value) -> element strides (a move
                                                    # its reader takes in place)
    arena_bytes: int = 0
    nchwc_tiles: set = field(default_factory=set)   # the blocked convolutions' register tiles
    nchwc_blocks: set = field(default_factory=set)  # and the blocks (8, 16) of the layout
    loc: dict = field(default_factory=dict)         # id(value) -> Loc
    source: str = ""
    sample: int = 0                                 # the batch a loop over its samples
                                                    # runs the current node for (0: none)
    edges: set = field(default_factory=set)         # id(value) read or written outside
                                                    # such a loop (_sample_boundaries)
    # an exported library (``emit(..., plain=)``) makes some weights at load rather than
    # store them: the Winograd layers' filters from their plain weights (``plain``: packed
    # variable name -> (O, C, 3, 3) weights), into ``m->built``; the AVX2 binary kernel's
    # plane lists, into ``m->planes`` (where that path runs)
    library: bool = False
    plain: dict = field(default_factory=dict)
    wino: dict = field(default_factory=dict)        # packed variable name -> (plain weights'
                                                    # byte offset, byte offset in m->built,
                                                    # o, c, block)
    built_bytes: int = 0
    planes: list = field(default_factory=list)      # (blocked weights' byte offset, o, cin,
                                                    # cw, taps, byte offsets of the channel
                                                    # table and the index list in m->planes)
    planes_bytes: int = 0

    def constant(self, a: np.ndarray) -> int:
        """``a`` appended to the weights payload; its byte offset there."""
        a = np.ascontiguousarray(a)
        off = self.payload_bytes
        self.weights[f"_payload.{off}"] = (off, a)
        self.payload_bytes = off + (a.nbytes + ALIGN - 1) // ALIGN * ALIGN
        return off

    def p(self, v) -> str:
        if not isinstance(v, Value):
            raise NotImplementedError(f"tessera.deploy: a constant operand {v!r}")
        if self.sample and (v.kind == "input" or id(v) in self.edges):
            # (sample s_ of the batch: _sample_runs; a value the loop keeps to itself is
            # one sample's, the same buffer for each)
            return f"({self.loc[id(v)].ptr(v)} + s_ * {v.numel // self.sample})"
        return self.loc[id(v)].ptr(v)

    def batch(self, v: Value) -> int:
        """The batch a node of ``v``'s runs over: 1 in a loop over the samples."""
        return 1 if self.sample else v.shape[0]


def _unsupported(n: Node, why: str = "") -> NotImplementedError:
    where = n.name or "the model"
    err = NotImplementedError(f"tessera.deploy.export_c: op '{n.op.name}' (at {where}) has "
                              f"no C rule{': ' + why if why else ''}")
    err.node = n  # type: ignore[attr-defined]  # which node (a graph's program cuts there)
    return err


# ---- classification: what each node becomes ---------------------------------------------

def _index_maps(n: Node):
    """[(offset, strides)] of each of the node's results as elements of its one tensor
    input, or None when they are not a pure movement of them."""
    ins = n.tensor_inputs
    if len(ins) != 1 or n.inputs[0] is not ins[0]:
        return None
    src = ins[0]
    if any(out.dtype.np != src.dtype.np for out in n.outputs):  # (quint8 viewed as uint8)
        return None
    kernel = n.op.kernels.get("cpu")
    if kernel is None:
        return None
    idx = np.arange(src.numel, dtype=np.int64).reshape(src.shape)
    try:
        res = kernel(idx, *n.inputs[1:], **n.attrs)
    except Exception:  # not an index-preserving kernel
        return None
    results = list(res) if isinstance(res, (tuple, list)) else [res]
    if len(results) != len(n.outputs):
        return None
    maps = []
    for r, out in zip(results, n.outputs):
        one = _strides_of(np.asarray(r), out)
        if one is None:
            return None
        maps.append(one)
    return maps


def _strides_of(res: np.ndarray, out: Value):
    if res.shape != out.shape or res.dtype != np.int64 or res.size == 0:
        return None
    offset = int(res.flat[0])
    strides = []
    for d, size in enumerate(res.shape):
        if size == 1:
            strides.append(0)
            continue
        step = [0] * res.ndim
        step[d] = 1
        strides.append(int(res[tuple(step)]) - offset)
    grid = np.full(res.shape, offset, np.int64)
    for d, s in enumerate(strides):
        shape = [1] * res.ndim
        shape[d] = res.shape[d]
        grid = grid + (np.arange(res.shape[d], dtype=np.int64) * s).reshape(shape)
    if not np.array_equal(grid, res):
        return None
    return offset, strides


def _split_movements(g: Graph) -> None:
    """A movement with several results (a split) becomes one node per result, each a copy
    (or a view) of its part of the input, so that the memory plan sees single results."""
    nodes = []
    clone = REGISTRY["clone"]
    for n in g.nodes:
        # only a view or a movement op: a rule's (sort's, topk's) kernel may also return
        # an index array as a strided one (an integer arange sorts to itself)
        moves = n.op.name not in RULES and (n.op.aliasing == "view" or n.op.name in MOVEMENT)
        maps = _index_maps(n) if len(n.outputs) > 1 and moves else None
        if maps is None:
            nodes.append(n)
            continue
        for out, mv in zip(n.outputs, maps):
            part = Node(clone, [n.inputs[0]], {}, [out], n.name, {"move": mv})
            out.producer, out.index = part, 0
            nodes.append(part)
    g.nodes = nodes


def _contiguous(shape: tuple, strides: list) -> bool:
    expect = 1
    for size, s in reversed(list(zip(shape, strides))):
        if size != 1 and s != expect:
            return False
        expect *= size
    return True


def _elementwise_body(n: Node):
    if len(n.outputs) != 1:
        return None
    body, ext, _ = _body([n], set())
    return (body, ext) if supported(body) is None else None


# ---- the rules -------------------------------------------------------------------------

def _region(prog: Program, i: int, body: Graph, ext: list, outs: list) -> None:
    """A region rendered by the graph's code generator, its split loop over the threads
    (``outs``: its output values, several for a multi-output region)."""
    cname = f"{prog.name}_k{i}"
    func = next(f for f in lower(body, cname) if f.name == cname + "_c")
    # a kernel without a split loop ignores its range (the build has -Werror)
    text = render(func).replace("{\n", "{\n  (void)lo; (void)hi;\n", 1)
    prog.regions.append(text)
    call = f"(has_avx2() ? {cname}_c_avx2 : {cname}_c)"
    out = outs[0]
    args = [prog.p(o) for o in outs] + [prog.p(v) for v in ext]
    extent = func.split
    if not extent or out.numel < SPLIT_MIN // 8:
        prog.steps.append(f"{call}({', '.join(args)}, 0, {extent or 1});")
        return
    casts = [f"({'const ' if q.const else ''}{q.ctype}*)(intptr_t)c[{k}]"
             for k, q in enumerate(func.params)]
    k = len(func.params)
    prog.kernels.append(
        f"static int64_t {cname}_item(const int64_t* c, int64_t i) {{\n"
        f"    int64_t lo = c[{k + 1}] * i / c[{k}], hi = c[{k + 1}] * (i + 1) / c[{k}];\n"
        f"    {call}({', '.join(casts)}, lo, hi);\n    return 0;\n}}")
    ctx = ", ".join(f"(int64_t)(intptr_t){a}" for a in args)
    prog.steps.append(
        f"{{ int64_t n = m->threads < {extent} ? m->threads : {extent};\n"
        f"  int64_t c[] = {{{ctx}, n, {extent}}};\n"
        f"  tsr_pool_run({cname}_item, c, n, m->threads); }}")


def _fused(prog: Program, i: int, n: Node) -> None:
    from tessera.graph.fused import body_graph
    body = body_graph(n.attrs["body"])
    why = supported(body)
    if why is not None:
        raise _unsupported(n, why)
    _region(prog, i, body, n.tensor_inputs, n.outputs)


def _gemm_call(prog: Program, m_: str, n_: str, k_: str, a: str, rsa: str, b: str | None,
               rsb: str, c: str, ldc: str, packed: int | None = None, csa: str = "1",
               epilogue: str = "", csb: str = "1") -> str:
    """One GEMM (c = a b, a's elements rsa and csa apart, b's rsb and csb), ``epilogue``
    setting the bias, activation and residual fields of ``g`` (``_epilogue``)."""
    bpart = f"g.bp = m->packed[{packed}];" if packed is not None else \
        f"g.b = {b}; g.rsb = {rsb}; g.csb = {csb};"
    epi = f"\n  {epilogue}" if epilogue else ""
    return (f"{{ tsr_gemm_t g; memset(&g, 0, sizeof g); g.m = {m_}; g.n = {n_}; g.k = {k_};\n"
            f"  g.a = {a}; g.rsa = {rsa}; g.csa = {csa}; {bpart}\n"
            f"  g.c = {c}; g.ldc = {ldc}; g.alpha = 1; g.beta = 0; g.isa = m->isa;{epi}\n"
            f"  if (run_gemm(m, &g)) return fail(m, \"out of memory in a matrix product\"); }}")


def _epilogue(prog: Program, n: Node, group: str, Og: int, P: int,
              transposed: bool = False) -> str:
    """The GEMM epilogue of a conv or conv_pointwise node whose product for image-group
    ``q`` (weights group ``group``) is Og x P (``transposed``: P x Og, no residual): the
    bias (one value per output channel, a row of the product, or a column), a
    conv_pointwise's activation and residual, applied to each tile while it is in cache."""
    bias = n.inputs[2] if len(n.inputs) > 2 else None
    epi = []
    if isinstance(bias, Value):
        epi.append(f"g.bias = {prog.p(bias)} + {group} * {Og};")
    flags = [] if transposed else ["TSR_GEMM_BIAS_ROWS"]
    act = n.attrs.get("activation")
    if act == "relu":
        epi.append("g.act = TSR_ACT_RELU;")
    elif act == "clamp":
        lo, hi = n.attrs["bounds"]
        epi.append(f"g.act = TSR_ACT_CLAMP; g.lo = {_c_float(lo)}; g.hi = {_c_float(hi)};")
    elif act is not None:
        raise _unsupported(n, f"activation {act!r}")
    r = n.inputs[3] if len(n.inputs) > 3 else None
    if isinstance(r, Value):
        epi.append(f"g.r = {prog.p(r)} + q * {Og * P}; g.ldr = {P};")
        if n.attrs.get("residual_first"):
            flags.append("TSR_GEMM_RESIDUAL_FIRST")
    epi.append(f"g.flags = {' | '.join(flags) or '0'};")
    return " ".join(epi)


def _matmul(prog: Program, i: int, n: Node) -> None:
    a, b = n.inputs[0], n.inputs[1]
    out = n.outputs[0]
    if not all(isinstance(v, Value) and v.dtype.name == "float32" for v in (a, b)) or \
            len(a.shape) < 2 or len(b.shape) < 2:
        raise _unsupported(n, "only float32 products of matrices (or batches of them)")
    if out.numel == 0:   # (an empty batch: no product to run)
        return
    M, K = a.shape[-2:]
    N = b.shape[-1]
    if b.kind == "var" and len(b.shape) == 2:
        off = prog.weights[b.name][0]
        prog.packed.append((off, K, N))
        rows = math.prod(a.shape[:-1])
        prog.steps.append(_gemm_call(prog, str(rows), str(N), str(K), prog.p(a), str(K), None,
                                     "", prog.p(out), str(N), packed=len(prog.packed) - 1))
        return
    batch = out.shape[:-2]
    nb = math.prod(batch)

    def strides(v: Value) -> list[int]:
        # element offset of each batch index into v (0 where v broadcasts)
        vb = (1,) * (len(batch) - len(v.shape[:-2])) + tuple(v.shape[:-2])
        size, res = v.shape[-2] * v.shape[-1], []
        for d in reversed(range(len(batch))):
            res.append(size if vb[d] != 1 else 0)
            size *= vb[d]
        return list(reversed(res))
    sa, sb = strides(a), strides(b)
    dims = ", ".join(map(str, batch)) or "1"
    offs = []
    for name, st in (("oa", sa), ("ob", sb)):
        terms = []
        rem = "q"
        for d in reversed(range(len(batch))):
            terms.append(f"(({rem}) % {batch[d]}) * {st[d]}")
            rem = f"{rem} / {batch[d]}"
        offs.append(f"int64_t {name} = {' + '.join(terms) or '0'};")
    del dims
    prog.steps.append(
        f"for (int64_t q = 0; q < {nb}; q++) {{\n  {offs[0]} {offs[1]}\n  " +
        _gemm_call(prog, str(M), str(N), str(K), f"{prog.p(a)} + oa", str(K),
                   f"{prog.p(b)} + ob", str(N), f"{prog.p(out)} + q * {M * N}", str(N)) +
        "\n}")


# a window kernel or a region compiled twice: for baseline x86-64 and, under GCC, for AVX2
# and FMA (the run picks by CPUID, as the GEMM does), so one binary is fast on every x86-64.
# Without trapping math GCC if-converts the selects of the prelude's erf and exponentials
# (AVX2 has no masked arithmetic): the loops vectorise; no value changes
_AVX2_UNIT = ("#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)\n"
              "#pragma GCC target(\"avx2,fma\")\n"
              "#pragma GCC optimize(\"O3\", \"no-trapping-math\")\n#endif\n")


def _window_unit(prog: Program, kind: str, kh, kw, sh, sw, ph, pw, dh, dw) -> str:
    key = f"{kh}x{kw}s{sh}x{sw}p{ph}x{pw}d{dh}x{dw}"
    fname = f"{prog.name}_{kind}_{key}"
    if f"{fname}.c" in prog.units:
        return fname
    defs = dict(TSR_KH=kh, TSR_KW=kw, TSR_SH=sh, TSR_SW=sw, TSR_PH=ph, TSR_PW=pw,
                TSR_DH=dh, TSR_DW=dw, TSR_T="float", TSR_INDEX=0)
    text = "".join(f"#define {k} {v}\n" for k, v in defs.items())
    src = "depthwise.c" if kind == "dw" else "maxpool.c"
    func = "tsr_depthwise" if kind == "dw" else "tsr_maxpool"
    for suffix, pre in (("", ""), ("_avx2", _AVX2_UNIT)):
        prog.units[f"{fname}{suffix}.c"] = (
            f"/* {func} for one window geometry{suffix and ', AVX2'} */\n{pre}"
            f"#include <stdint.h>\n{text}#define {func} {fname}{suffix}\n#include \"{src}\"\n")
        if kind == "dw":
            prog.prototypes.append(
                f"void {fname}{suffix}(const float* x, const float* w, const float* b, "
                "float* y, int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW, "
                "int64_t lo, int64_t hi);")
        else:
            prog.prototypes.append(
                f"void {fname}{suffix}(const float* x, float* y, int64_t* idx, int64_t H, "
                "int64_t W, int64_t OH, int64_t OW, int64_t lo, int64_t hi);")
    args = ("(const float*)(intptr_t)c[0], (const float*)(intptr_t)c[1], "
            "(const float*)(intptr_t)c[2], (float*)(intptr_t)c[3], c[4], c[5], c[6], "
            "c[7], c[8]") if kind == "dw" else \
        "(const float*)(intptr_t)c[0], (float*)(intptr_t)c[1], NULL, c[2], c[3], c[4], c[5]"
    last = 9 if kind == "dw" else 6
    prog.kernels.append(
        f"static int64_t {fname}_item(const int64_t* c, int64_t i) {{\n"
        f"    int64_t lo = c[{last + 1}] * i / c[{last}], "
        f"hi = c[{last + 1}] * (i + 1) / c[{last}];\n"
        f"    if (has_avx2()) {fname}_avx2({args}, lo, hi);\n"
        f"    else {fname}({args}, lo, hi);\n    return 0;\n}}")
    return fname


def _region_units(prog: Program) -> None:
    """The regions' functions as two units, like the window kernels: baseline x86-64 and
    AVX2 with FMA (without FMA, the prelude's exponentials and erf call libm's fmaf per
    element and stay scalar). The run picks by CPUID (``has_avx2``)."""
    if not prog.regions:
        return
    heads = []   # (name, parameters) of each function
    for text in prog.regions:
        head = re.match(r"void (\w+)\(([^)]*)\)", text)
        assert head is not None, text[:200]
        heads.append((head[1], head[2]))
    for suffix, pre in (("", ""), ("_avx2", _AVX2_UNIT)):
        texts = [text.replace(f"void {h[0]}(", f"void {h[0]}{suffix}(", 1)
                 for text, h in zip(prog.regions, heads)]
        prog.units[f"{prog.name}_regions{suffix}.c"] = (
            f"/* the fused regions of {prog.name}{suffix and ', AVX2'} (tessera's code "
            f"generator) */\n{pre}#include \"prelude.h\"\n\n" + "\n\n".join(texts) + "\n")
        prog.prototypes += [f"void {h[0]}{suffix}({h[1]});" for h in heads]


def _pool_run(fname: str, ctx: list[str], planes: int, last: int) -> str:
    del last
    c = ", ".join(f"(int64_t)(intptr_t)({x})" for x in ctx)
    return (f"{{ int64_t n = m->threads < {planes} ? m->threads : {planes};\n"
            f"  int64_t c[] = {{{c}, n, {planes}}};\n"
            f"  tsr_pool_run({fname}_item, c, n, m->threads); }}")


def _conv(prog: Program, i: int, n: Node) -> None:
    x, w = n.inputs[0], n.inputs[1]
    bias = n.inputs[2] if len(n.inputs) > 2 else None
    out = n.outputs[0]
    if len(x.shape) != 4 or x.dtype.name != "float32" or w.kind != "var" or \
            n.attrs.get("transposed"):
        raise _unsupported(n, "only float32 2-d convolutions with constant weights")
    N, C, H, W = x.shape
    O, Cg, KH, KW = w.shape
    _, _, OH, OW = out.shape
    G = n.attrs.get("groups", 1)
    (sh, sw), (dh, dw) = n.attrs["stride"], n.attrs["dilation"]
    (ph, _), (pw, _) = n.attrs["pads"]
    b = prog.p(bias) if isinstance(bias, Value) else "NULL"
    if G == C == O and Cg == 1:
        if n.op.name != "conv":
            raise _unsupported(n, "a depthwise convolution with an epilogue")
        fname = _window_unit(prog, "dw", KH, KW, sh, sw, ph, pw, dh, dw)
        prog.steps.append(_pool_run(fname, [prog.p(x), prog.p(w), b, prog.p(out), str(C),
                                            str(H), str(W), str(OH), str(OW)], N * C, 9))
        return
    Og, P, CK = O // G, OH * OW, Cg * KH * KW
    direct = (KH, KW, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0)
    if not direct:
        prog.scratch_bytes = max(prog.scratch_bytes, CK * P * 4)
    xg = f"{prog.p(x)} + (q / {G} * {C} + q % {G} * {Cg}) * {H * W}"
    lines = [f"for (int64_t q = 0; q < {N * G}; q++) {{"]
    if direct:
        src = xg
    else:
        lines.append("  " + _im2col(prog, xg, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW,
                                    CK))
        src = "m->scratch"
    yq = f"{prog.p(out)} + q * {Og * P}"
    wq = f"{prog.p(w)} + q % {G} * {Og * CK}"
    if not direct and P <= FEW_PIXELS < Og and not isinstance(_residual(n), Value):
        # few output pixels (a ViT's patch embedding, a small image's last stage): Og x P
        # would be P columns of panels NR wide; its transpose, cols^T W^T, is P rows,
        # which the GEMM runs on its few-rows path streaming W once (a 192 x 768 x 4
        # patch embedding: 44 us -> 10 us), then P x Og back to Og x P
        ct = (CK * P + 15) // 16 * 16
        prog.scratch_bytes = max(prog.scratch_bytes, (ct + P * Og) * 4)
        lines.append("  " + _gemm_call(
            prog, str(P), str(Og), str(CK), src, "1", wq, "1", f"m->scratch + {ct}", str(Og),
            csa=str(P), csb=str(CK), epilogue=_epilogue(prog, n, f"q % {G}", Og, P, True)))
        lines.append(f"  {{ static const int64_t s[] = {{{Og}, {P}}}, t[] = {{1, {Og}}};\n"
                     f"    tsr_strided_copy({yq}, m->scratch + {ct}, 2, s, t, 0, 4); }}")
    else:
        lines.append("  " + _gemm_call(prog, str(Og), str(P), str(CK), wq, str(CK), src,
                                       str(P), yq, str(P),
                                       epilogue=_epilogue(prog, n, f"q % {G}", Og, P)))
    prog.steps.append("\n".join(lines) + "\n}")


# output pixels up to which a convolution's product runs transposed (``_conv``): the rows
# the GEMM's few-rows path takes (GEMV_MAX in kernels/c/gemm.c)
FEW_PIXELS = 4


def _residual(n: Node):
    return n.inputs[3] if len(n.inputs) > 3 else None


_IM2COL_ITEM = """/* rows [lo, hi) of im2col's columns, the threads taking a share each: c = x,
   cols, the geometry (H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW), rows, parts */
static int64_t im2col_item(const int64_t* c, int64_t i) {
    const int64_t rows = c[14], parts = c[15];
    im2col_f32((const float*)(intptr_t)c[0], (float*)(intptr_t)c[1], c[2], c[3], c[4], c[5],
               c[6], c[7], c[8], c[9], c[10], c[11], c[13], c[12] * c[13], rows * i / parts,
               rows * (i + 1) / parts, 0, c[12]);
    return 0;
}"""


def _im2col(prog: Program, x: str, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW,
            CK) -> str:
    """im2col of one image (group) into the scratch, its rows split over the kernel threads
    when it is big enough: it is memory-bound, and a serial share of every convolution
    otherwise (Amdahl's limit on two threads)."""
    if CK * OH * OW < SPLIT_MIN or CK < 2:
        return (f"im2col_f32({x}, m->scratch, {H}, {W}, {KH}, {KW}, {sh}, {sw}, {ph}, {pw}, "
                f"{dh}, {dw}, {OW}, {OH * OW}, 0, {CK}, 0, {OH});")
    if _IM2COL_ITEM not in prog.kernels:
        prog.kernels.append(_IM2COL_ITEM)
    return (f"{{ int64_t parts = m->threads < {CK} ? m->threads : {CK};\n"
            f"    int64_t c[] = {{(int64_t)(intptr_t)({x}), (int64_t)(intptr_t)m->scratch, {H}, "
            f"{W}, {KH}, {KW}, {sh}, {sw}, {ph}, {pw}, {dh}, {dw}, {OH}, {OW}, {CK}, parts}};\n"
            f"    tsr_pool_run(im2col_item, c, parts, m->threads); }}")


def _strides(prog: Program, v: Value) -> list[int]:
    """The element strides of v's buffer: a move read in place keeps its own."""
    if id(v) in prog.strided:
        return list(prog.strided[id(v)])
    st, acc = [], 1
    for size in reversed(v.shape):
        st.append(acc if size != 1 else 0)
        acc *= size
    return st[::-1]


def _padded(v: Value, st: list[int], rank: int) -> tuple[tuple, list[int]]:
    """v's shape and strides with leading dims of size 1 up to ``rank``."""
    pad = rank - len(v.shape)
    return (1,) * pad + tuple(v.shape), [0] * pad + st


def _batch_offsets(v: Value, st: list[int], batch: tuple, group: int) -> list[int]:
    """The first element of each batch entry of the attention in v (whose last two dims
    are the matrix): broadcast dims 0, and with grouped heads query head h reads v's head
    h // group."""
    nd = len(batch)
    shape, full = _padded(v, st, nd + 2)
    vb, vs = shape[:-2], full[:-2]
    off = np.zeros(batch, np.int64)
    for d in range(nd):
        if vb[d] == 1:
            continue
        idx = np.arange(batch[d], dtype=np.int64) // (group if d == nd - 1 else 1)
        off = off + (idx * vs[d]).reshape((batch[d],) + (1,) * (nd - d - 1))
    return [int(x) for x in off.reshape(-1)]


def _attention(prog: Program, i: int, n: Node) -> None:
    q, k, v = n.inputs[:3]
    mask = n.inputs[3] if len(n.inputs) > 3 else None
    out = n.outputs[0]
    at = n.attrs
    if at.get("dropout_p", 0.0) > 0:
        raise _unsupported(n, "dropout")
    if isinstance(mask, Value) and mask.dtype.name not in ("float32", "bool"):
        raise _unsupported(n, f"a {mask.dtype.name} mask")
    batch = out.shape[:-2]
    nb = math.prod(batch)
    L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    args = {"nb": nb, "L": L, "S": S, "E": E, "Ev": Ev}
    consts = []
    for name, x in (("q", q), ("k", k), ("v", v)):
        st = _strides(prog, x)
        if x.shape[-1] > 1 and st[-1] != 1:
            raise AssertionError(f"tessera.deploy: attention operand {x} without unit-stride "
                                 "rows")
        group = 1
        if at.get("enable_gqa") and len(x.shape) >= 3 and x.shape[-3] not in (1, batch[-1]):
            group = batch[-1] // x.shape[-3]
        consts.append(f"{name}o[] = {{{', '.join(map(str, _batch_offsets(x, st, batch, group)))}}}")
        args[name] = prog.p(x)
        args[f"{name}off"] = f"{name}o"
        args[f"{name}rs"] = st[-2]
    lse = prog.work_bytes
    work = lse + (nb * L * 4 + 63) // 64 * 64
    pre = ""
    if isinstance(mask, Value):
        st = _strides(prog, mask)
        mptr = prog.p(mask)
        if mask.dtype.name == "bool":   # True: may attend; the kernel adds a float mask
            pre = (f"for (int64_t j = 0; j < {mask.numel}; j++) "
                   f"((float*)(m->work + {work}))[j] = {mptr}[j] ? 0.0f : -INFINITY;\n  ")
            mptr = f"((float*)(m->work + {work}))"
            work += (mask.numel * 4 + 63) // 64 * 64
        full, fst = _padded(mask, st, len(batch) + 2)
        consts.append(f"mo[] = {{{', '.join(map(str, _batch_offsets(mask, st, batch, 1)))}}}")
        args.update(mask=mptr, moff="mo", mrs=fst[-2] if full[-2] > 1 else 0,
                    mcs=fst[-1] if full[-1] > 1 else 0)
    prog.work_bytes = work
    prog.attention = True
    args.update(o=prog.p(out), lse=f"((float*)(m->work + {lse}))", scale=f"{at['scale']!r}f",
                causal=int(bool(at.get("is_causal"))), isa="m->isa")
    fields = ", ".join(f".{f} = {x}" for f, x in args.items())
    prog.steps.append(
        f"{{ static const int64_t {', '.join(consts)};\n  {pre}"
        f"tsr_attention_args a = {{{fields}}};\n"
        f"  if (tsr_attention_run(&a, m->threads))\n"
        f"    return fail(m, \"out of memory in attention\"); }}")


def _max_pool(prog: Program, i: int, n: Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    if len(x.shape) != 4 or x.dtype.name != "float32":
        raise _unsupported(n, "only float32 2-d max pooling")
    N, C, H, W = x.shape
    _, _, OH, OW = out.shape
    (kh, kw), (sh, sw) = n.attrs["kernel_size"], n.attrs["stride"]
    (ph, pw), (dh, dw) = n.attrs["padding"], n.attrs["dilation"]
    fname = _window_unit(prog, "mp", kh, kw, sh, sw, ph, pw, dh, dw)
    prog.steps.append(_pool_run(fname, [prog.p(x), prog.p(out), str(H), str(W), str(OH),
                                        str(OW)], N * C, 6))


def _interpolate(prog: Program, i: int, n: Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    if n.attrs.get("mode") != "area" or len(x.shape) != 4:
        raise _unsupported(n, f"mode {n.attrs.get('mode')!r} (only 'area', 2-d)")
    N, C, H, W = x.shape
    prog.steps.append(f"tsr_adaptive_avg({prog.p(x)}, {prog.p(out)}, {N * C}, {H}, {W}, "
                      f"{out.shape[2]}, {out.shape[3]});")


def _embedding(prog: Program, i: int, n: Node) -> None:
    w, ids = n.inputs[0], n.inputs[1]
    if w.dtype.name != "float32" or ids.dtype.name != "int64" or len(w.shape) != 2:
        raise _unsupported(n, "only a float32 table looked up by int64 ids")
    prog.steps.append(
        f"if (tsr_gather_rows({prog.p(w)}, {w.shape[0]}, {w.shape[1]}, {prog.p(ids)}, "
        f"{ids.numel}, {prog.p(n.outputs[0])}))\n"
        f"  return fail(m, \"{n.name or 'embedding'}: an input id is outside [0, "
        f"{w.shape[0]})\");")


def _all_any(prog: Program, i: int, n: Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    dim = n.attrs.get("dim")
    nd = len(x.shape) or 1   # a 0-d input reduces as one element
    dims = [d % nd for d in (dim if isinstance(dim, (tuple, list)) else [dim])] \
        if dim is not None else list(range(nd))
    if x.dtype.name != "bool" or sorted(dims) != list(range(min(dims), max(dims) + 1)):
        raise _unsupported(n, "only bool inputs reduced over consecutive dims")
    outer = math.prod(x.shape[:min(dims)])
    r = math.prod(x.shape[min(dims):max(dims) + 1])
    inner = math.prod(x.shape[max(dims) + 1:])
    is_all = n.op.name == "all"
    prog.steps.append(
        f"for (int64_t o = 0; o < {outer}; o++) for (int64_t j = 0; j < {inner}; j++) {{\n"
        f"  unsigned char acc = {1 if is_all else 0};\n"
        f"  for (int64_t k = 0; k < {r}; k++) acc = acc {'&&' if is_all else '||'} "
        f"{prog.p(x)}[(o * {r} + k) * {inner} + j];\n"
        f"  {prog.p(out)}[o * {inner} + j] = acc;\n}}")


def _cat(prog: Program, i: int, n: Node) -> None:
    out = n.outputs[0]
    ins = [v for v in n.inputs if isinstance(v, Value) and v.numel]
    if any(v.dtype is not out.dtype for v in ins):
        raise _unsupported(n, "inputs of mixed dtypes")
    nd = len(out.shape)
    d = n.attrs.get("dim", 0) % nd
    outer, size = math.prod(out.shape[:d]), out.dtype.itemsize
    row = math.prod(out.shape[d:]) * size
    at = 0
    for v in ins:
        chunk = math.prod(v.shape[d:]) * size
        prog.steps.append(
            f"for (int64_t o = 0; o < {outer}; o++)\n"
            f"  memcpy((char*){prog.p(out)} + o * {row} + {at}, "
            f"(const char*){prog.p(v)} + o * {chunk}, {chunk});")
        at += chunk


# ---- the blocked layout (kernels/c/nchwc.c): convolution, pooling, layout changes --------

def _nchwc_selects() -> bool:
    """Whether the folder's nchwc.c compiles only the register tiles its layers can run
    (``nchwc_tiles.h``, from the kernels' own plans: the binding must load here), not all."""
    return K.usable()


def _nchwc_unit(prog: Program, block: int, kind: str = "") -> None:
    """nchwc.c compiled as a unit of the folder and its header (once per program), and the
    work item running a planned ``kind`` ("conv" or "pool") on the kernel threads."""
    prog.nchwc_blocks.add(block)
    if "tsr_nchwc.c" not in prog.units:
        select = "#define TSR_NCHWC_TILES \"nchwc_tiles.h\"\n" if _nchwc_selects() else ""
        prog.units["tsr_nchwc.c"] = ("/* the blocked-layout kernels (nchwc.c), with the "
                                     "register tiles of this model's layers only */\n"
                                     f"{select}#include \"nchwc.c\"\n")
        prog.kernels.append("#include \"nchwc.h\"")
    item = f"static int64_t nchwc_{kind}_item("
    if kind and not any(k.startswith(item) for k in prog.kernels):
        prog.kernels.append(
            f"{item}const int64_t* c, int64_t i) {{\n"
            f"    tsr_nchwc_{kind}_range((const tsr_nchwc_{kind}_t*)(intptr_t)c[0], i, i + 1);\n"
            f"    return 0;\n}}")


def _c_float(v: float) -> str:
    return ("-INFINITY" if v < 0 else "INFINITY") if math.isinf(v) else f"{float(v)!r}f"


def _nchwc_over_residual(n: Node) -> bool:
    """Whether a conv2d_nchwc's output may take over its residual's buffer: each tile reads
    its residual values before it stores there, in a plan of one pass over the input blocks
    (the kernel makes one where they alias; offered where it is one anyway)."""
    return n.op.name == "conv2d_nchwc" and isinstance(n.inputs[3], Value) and \
        _nchwc_selects() and _conv_plan(n)[1] == 1


def _nchwc_conv(prog: Program, i: int, n: Node) -> None:
    x, wp, b, r = n.inputs
    out, a = n.outputs[0], n.attrs
    if not isinstance(wp, Value) or wp.kind != "var":
        raise _unsupported(n, "packed weights that are not a constant")
    _nchwc_unit(prog, a["block"], "conv")
    o, cg, kh, kw = a["weight_shape"]
    (sh, sw), (dh, dw) = a["stride"], a["dilation"]
    (ph, _), (pw, _) = a["pads"]
    flags = ["0"]
    if a["plain_input"]:
        flags.append("TSR_NCHWC_PLAIN_INPUT")
    if isinstance(r, Value) and a["residual_first"]:
        flags.append("TSR_GEMM_RESIDUAL_FIRST")
    if a.get("winograd"):
        flags.append("TSR_NCHWC_WINOGRAD")
    act = {None: "TSR_ACT_NONE", "relu": "TSR_ACT_RELU", "clamp": "TSR_ACT_CLAMP"}
    lo, hi = a["bounds"] if a["activation"] == "clamp" else (0.0, 0.0)
    _, _, H, W = (x.shape if a["plain_input"] else x.shape[:4])
    fields = dict(n=prog.batch(x), c=cg * a["groups"], h=H, w=W, o=o, oh=out.shape[2],
                  ow=out.shape[3], kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw, dh=dh, dw=dw,
                  groups=a["groups"], block=a["block"], isa="m->isa", x=prog.p(x),
                  wp=_nchwc_weights(prog, wp, a),
                  bias=prog.p(b) if isinstance(b, Value) else "NULL",
                  r=prog.p(r) if isinstance(r, Value) else "NULL", y=prog.p(out),
                  act=act[a["activation"]], flags=" | ".join(flags), lo=_c_float(lo),
                  hi=_c_float(hi))
    # the build compiles the tiles its layers can run (nchwc.c has ~350, 0.9 MB of code)
    if _nchwc_selects():
        prog.nchwc_tiles |= _conv_plan(n)[0]
    sets = " ".join(f"p.{k} = {v};" for k, v in fields.items())
    what = n.name or "conv2d_nchwc"
    prog.steps.append(
        f"{{ tsr_nchwc_conv_t p; memset(&p, 0, sizeof p);\n  {sets}\n"
        f"  int64_t items = tsr_nchwc_conv_plan(&p, m->threads);\n"
        f"  if (items == -2) return fail(m, \"{what}: a register tile of the blocked "
        f"convolution left out of this build (nchwc_tiles.h)\");\n"
        f"  if (items < 0) return fail(m, \"{what}: the blocked "
        f"convolution kernels cannot run this geometry\");\n"
        f"  int64_t c[] = {{(int64_t)(intptr_t)&p}};\n"
        f"  tsr_pool_run(nchwc_conv_item, c, items, m->threads); }}")


def _nchwc_weights(prog: Program, wp: Value, a: dict) -> str:
    """Where a blocked convolution reads its packed weights: in a library, a Winograd
    layer's are made at load from its plain weights (4x fewer bytes in the weights file),
    into ``m->built``; else the packed variable itself."""
    if not (prog.library and a.get("winograd") and wp.name in prog.plain):
        return prog.p(wp)
    if wp.name not in prog.wino:
        w = prog.plain[wp.name]
        prog.wino[wp.name] = (prog.constant(w), prog.built_bytes, w.shape[0], w.shape[1],
                              a["block"])
        prog.built_bytes += (wp.nbytes + ALIGN - 1) // ALIGN * ALIGN
    return f"((float*)(m->built + {prog.wino[wp.name][1]}))"


def _nchwc_pool(prog: Program, i: int, n: Node) -> None:
    x, out, a = n.inputs[0], n.outputs[0], n.attrs
    _, CB, H, W, blk = x.shape
    N = prog.batch(x)
    _nchwc_unit(prog, blk, "pool")
    (kh, kw), (sh, sw), (ph, pw) = a["kernel_size"], a["stride"], a["padding"]
    fields = dict(n=N, cb=CB, h=H, w=W, oh=out.shape[2], ow=out.shape[3], kh=kh, kw=kw,
                  sh=sh, sw=sw, ph=ph, pw=pw, block=blk, isa="m->isa",
                  kind=int(a["kind"] == "avg"), count_include_pad=int(a["count_include_pad"]),
                  x=prog.p(x), y=prog.p(out))
    sets = " ".join(f"p.{k} = {v};" for k, v in fields.items())
    prog.steps.append(
        f"{{ tsr_nchwc_pool_t p; memset(&p, 0, sizeof p);\n  {sets}\n"
        f"  int64_t items = tsr_nchwc_pool_plan(&p, m->threads);\n"
        f"  if (items == -2) return fail(m, \"{n.name or 'pool2d_nchwc'}: the blocked "
        f"pooling's instruction set left out of this build (nchwc_tiles.h)\");\n"
        f"  if (items < 0) return fail(m, \"{n.name or 'pool2d_nchwc'}: the blocked pooling "
        f"kernels cannot run this window\");\n"
        f"  int64_t c[] = {{(int64_t)(intptr_t)&p}};\n"
        f"  tsr_pool_run(nchwc_pool_item, c, items, m->threads); }}")


def _nchwc_layout(prog: Program, i: int, n: Node) -> None:
    """to_nchwc / from_nchwc: one pass over the tensor (memory speed: not split)."""
    x, out = n.inputs[0], n.outputs[0]
    if n.op.name == "to_nchwc":
        (_, C, H, W), blk, fn = x.shape, n.attrs["block"], "tsr_nchwc_to_blocked"
    else:
        (_, C, H, W), blk, fn = out.shape, x.shape[4], "tsr_nchwc_from_blocked"
    N = prog.batch(out)
    _nchwc_unit(prog, blk)
    prog.steps.append(f"{fn}({prog.p(x)}, {prog.p(out)}, {N}, {C}, {H * W}, {blk});")


RULES = {"cat": _cat, "all": _all_any, "any": _all_any, "fused": _fused, "matmul": _matmul,
         "conv": _conv, "conv_pointwise": _conv, "max_pool_values": _max_pool,
         "interpolate": _interpolate, "embedding": _embedding,
         "scaled_dot_product_attention": _attention,
         "conv2d_nchwc": _nchwc_conv, "pool2d_nchwc": _nchwc_pool,
         "to_nchwc": _nchwc_layout, "from_nchwc": _nchwc_layout}


# ---- the program -------------------------------------------------------------------------

# A run of at least SAMPLE_RUN blocked-layout nodes at a batch above 1 (a convolutional
# trunk) runs sample by sample: each node over one sample, then the next node, the whole
# run once per sample, so that a sample's activations stay in the caches from one layer to
# the next where the batch's pass each layer through memory (MobileNetV2 at batch 8: its
# 112x112 and 56x56 layers' activations are 5-40 MB a layer). Winograd layers stay out of
# such runs: they amortize their transformed weights over the tiles of the whole batch.
SAMPLE_RUN = 8
_PER_SAMPLE = frozenset({"conv2d_nchwc", "pool2d_nchwc", "to_nchwc", "from_nchwc"})


def _per_sample(n: Node, kind: str) -> int:
    """The batch of a node a loop over the samples can run (every operand not a weight has
    it first), else 0."""
    if kind != "rule" or n.op.name not in _PER_SAMPLE or n.attrs.get("winograd"):
        return 0
    vals = [v for v in n.inputs if isinstance(v, Value) and v.kind != "var"] + n.outputs
    N = n.outputs[0].shape[0] if n.outputs[0].shape else 0
    return N if N > 1 and all(v.shape and v.shape[0] == N for v in vals) else 0


def _sample_runs(g: Graph, kinds: dict) -> list[tuple[int, int, int]]:
    """(first node, end, batch) of each run the program loops over the samples of."""
    runs, start, batch = [], 0, 0
    for i in range(len(g.nodes) + 1):
        N = _per_sample(g.nodes[i], kinds[i]) if i < len(g.nodes) else 0
        if N != batch:
            if batch and i - start >= SAMPLE_RUN:
                runs.append((start, i, batch))
            start, batch = i, N
    return runs


def _sample_boundaries(g: Graph, runs: list, kinds: dict, plan, returned: dict) -> set:
    """Arena space of their own (past the plan's arena, which grows: ``plan.offsets``
    rewritten) for the values a run reads from before it and those it leaves to nodes after
    it: the plan shares a buffer between values whose lifetimes do not meet in the batch's
    order, but in a loop over the samples, sample s of a value read or written outside the
    run would meet the run's other values of the samples before and after it. Only a run
    whose boundary values are buffers of their own (not views of another) loops (the others
    are dropped from ``runs``). Returns the ids of those values (the others of a run are
    each one sample's in the loop: their first sample's part of their planned buffers, the
    same for every sample, which stays in the caches from one sample to the next)."""
    readers: dict[int, list[int]] = {}
    at = {id(n): i for i, n in enumerate(g.nodes)}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            if isinstance(v, Value):
                readers.setdefault(id(v), []).append(i)
    moved: set[int] = set()
    for run in list(runs):
        i0, i1, _ = run
        made = {id(v) for n in g.nodes[i0:i1] for v in n.outputs}
        edge = [v for n in g.nodes[i0:i1] for v in n.inputs
                if isinstance(v, Value) and v.kind == "node" and id(v) not in made]
        edge += [v for n in g.nodes[i0:i1] for v in n.outputs
                 if id(v) in returned or any(not i0 <= r < i1 for r in readers.get(id(v), ()))]
        if any(kinds[at[id(v.producer)]] in ("view", "strided") for v in edge):
            runs.remove(run)
            continue
        for v in edge:
            if id(v) in plan.offsets and id(v) not in returned and id(v) not in moved:
                plan.offsets[id(v)] = -(-plan.arena_bytes // ALIGN) * ALIGN
                plan.arena_bytes = plan.offsets[id(v)] + v.nbytes
            moved.add(id(v))
    return moved


def _plan_layout(prog: Program) -> None:
    """Weights into the payload, then the graph outputs' and the arena's buffers."""
    g = prog.graph
    off = 0
    for name, v in g.variables.items():
        prog.weights[name] = (off, None)
        off += (v.nbytes + ALIGN - 1) // ALIGN * ALIGN
        prog.loc[id(v)] = Loc("m->w", prog.weights[name][0])
    prog.payload_bytes = off
    for k, v in enumerate(g.inputs):
        prog.loc[id(v)] = Loc(f"((unsigned char*)(intptr_t)in[{k}])")


# ops whose later results are kept for a backward (attention's row sums' logarithms, a
# training-mode batch norm's statistics): dropped where nothing reads them, so the node has
# one result like the others
_BACKWARD_RESULTS = frozenset({"scaled_dot_product_attention", "batch_norm"})
# rules that write several results (each planned a buffer of its own)
MULTI_OUTPUT = {"fused", "topk", "max_dim", "min_dim"}
# integer and bool outputs leave as int64_t, as integer inputs come in
_WIDENED = frozenset({"bool", "uint8", "int8", "int16", "int32"})


def _unread_results(g: Graph) -> None:
    read = {id(v) for n in g.nodes for v in n.tensor_inputs} | {id(v) for v in g.outputs}
    for k, n in enumerate(g.nodes):
        if n.op.name in _BACKWARD_RESULTS and len(n.outputs) > 1 and \
                not any(id(v) in read for v in n.outputs[1:]):
            g.nodes[k] = Node(n.op, n.inputs, n.attrs, n.outputs[:1], n.name, n.notes)
            n.outputs[0].producer = g.nodes[k]


def _integer_outputs(g: Graph) -> None:
    """Outputs of a narrower integer dtype or bool become int64 (a cast node each, which
    notes the dtype the model returns, for the header); any other non-float32 output has
    no C rule."""
    from tessera._dtype import int64
    cast = REGISTRY["cast"]
    for k, v in enumerate(list(g.outputs)):
        if v.dtype.name in ("float32", "int64"):
            continue
        if v.dtype.name not in _WIDENED:
            raise NotImplementedError(f"tessera.deploy.export_c: output {k} is {v.dtype.name};"
                                      " outputs must be float32, an integer dtype or bool")
        (new,) = g.add_node(cast, [v], {"dtype": int64}, [(v.shape, int64)], name="output")
        g.nodes[-1].notes["returns"] = v.dtype.name
        g.outputs[k] = new


def _read_in_place(g: Graph, kinds: dict, moves: dict) -> set[int]:
    """The moves (a head transpose) that only attention reads, as query, key or value with
    unit-stride rows: the kernel reads their input in place, through the move's strides."""
    readers: dict[int, list] = {}
    for i, n in enumerate(g.nodes):
        for pos, v in enumerate(n.inputs):
            if isinstance(v, Value):
                readers.setdefault(id(v), []).append((n, pos))
    returned = {id(v) for v in g.outputs}
    found = set()
    for i, n in enumerate(g.nodes):
        if kinds[i] != "move":
            continue
        out = n.outputs[0]
        _, strides = moves[i]
        if id(out) in returned or (out.shape[-1] > 1 and strides[-1] != 1) or \
                len(out.shape) < 2:
            continue
        if all(r.op.name == "scaled_dot_product_attention" and pos < 3
               for r, pos in readers.get(id(out), [None])):
            found.add(i)
    return found


def _copy_outputs(g: Graph) -> None:
    """Outputs the caller's buffers cannot hold in place (a graph input, a weight, a value
    returned twice, part of a larger buffer) get a copy node of their own."""
    seen: set[int] = set()
    clone = REGISTRY["clone"]
    for k, v in enumerate(list(g.outputs)):
        if v.kind == "node" and id(v) not in seen and v.producer.op.aliasing != "view" and \
                v.producer.op.name not in MOVEMENT:
            seen.add(id(v))
            continue
        (new,) = g.add_node(clone, [v], {}, [(v.shape, v.dtype)], name="output")
        g.nodes[-1].notes["copy"] = True
        g.outputs[k] = new
        seen.add(id(new))


def _in_place_ok(n: Node, kind: str) -> bool:
    """Whether the node's kernel may write over a dying input of its output's size: an
    elementwise loop may, unless it carries a value in its output between phases."""
    if kind == "elementwise":
        body = _elementwise_body(n)[0]
    elif n.op.name == "fused":
        from tessera.graph.fused import body_graph
        body = body_graph(n.attrs["body"])
    else:
        return False
    return not writes_before_reading(body)


def has_rule(n: Node) -> bool:
    """Whether ``emit`` has a way to write node ``n`` as C: a rule, a movement of its
    input's elements (a view or a copy), or an elementwise loop. (A rule may still decline
    a case, by dtype or geometry: ``emit`` then raises naming the node.)"""
    if n.op.name in RULES:
        return True
    if (n.op.aliasing == "view" or n.op.name in MOVEMENT) and _index_maps(n) is not None:
        return True
    return _elementwise_body(n) is not None


def emit(name: str, g: Graph, values: dict, plain: dict | None = None) -> Program:
    """The C program of graph ``g`` (its variables' values in ``values``). With ``plain``
    (packed variable name -> the plain weights packed into it), the program of an exported
    library, which makes some weights at load (``Program.library``); without, one bound to
    weights kept in process."""
    for v in g.inputs:
        if v.dtype.name not in ("float32", "int64"):
            raise NotImplementedError(f"tessera.deploy.export_c: input {v.name} is "
                                      f"{v.dtype.name}; inputs must be float32 or int64")
    _integer_outputs(g)
    _split_movements(g)
    _unread_results(g)
    _copy_outputs(g)
    prog = Program(name, g, values=values, library=plain is not None, plain=plain or {})
    _plan_layout(prog)
    views, copies, moves, kinds = set(), set(), {}, {}
    for i, n in enumerate(g.nodes):
        if n.notes.get("copy"):
            copies.add(i)
            kinds[i] = "copy"
            continue
        if n.op.name in RULES:
            kinds[i] = "rule"
            continue
        mv = n.notes.get("move")
        if mv is None and (n.op.aliasing == "view" or n.op.name in MOVEMENT):
            maps = _index_maps(n)
            mv = maps[0] if maps else None
        if mv is not None:
            offset, strides = mv
            if _contiguous(n.outputs[0].shape, strides):
                views.add(i)
                moves[i] = offset
                kinds[i] = "view"
            else:
                moves[i] = (offset, strides)
                kinds[i] = "move"
            continue
        if _elementwise_body(n) is not None:
            kinds[i] = "elementwise"
            continue
        raise _unsupported(n)
    for i in _read_in_place(g, kinds, moves):
        kinds[i] = "strided"
        views.add(i)
    out_nodes = {i for i in range(len(g.nodes)) if kinds[i] not in ("view", "strided")}
    not_inplace = frozenset(i for i in out_nodes if not _in_place_ok(g.nodes[i], kinds[i]))
    plan = plan_memory(g, out_nodes, not_inplace, frozenset(views),
                       {i: frozenset({3}) for i in out_nodes if _nchwc_over_residual(g.nodes[i])})
    returned = {id(v): k for k, v in enumerate(g.outputs)}
    runs = _sample_runs(g, kinds)
    prog.edges = _sample_boundaries(g, runs, kinds, plan, returned)
    prog.arena_bytes = plan.arena_bytes
    starts, ends = {i0: N for i0, _, N in runs}, {i1 - 1 for _, i1, _ in runs}
    for i, n in enumerate(g.nodes):
        if i in starts:
            prog.sample = starts[i]
            prog.steps.append(f"for (int64_t s_ = 0; s_ < {prog.sample}; s_++) {{  "
                              "/* sample by sample (SAMPLE_RUN) */")
        out = n.outputs[0] if len(n.outputs) == 1 else None
        if out is None and n.op.name in MULTI_OUTPUT:   # a region, topk
            for v in n.outputs:
                prog.loc[id(v)] = _planned_loc(v, returned, plan)
            _emit_node(prog, i, n, kinds[i], moves.get(i))
            continue
        if out is None:
            raise _unsupported(n, f"{len(n.outputs)} outputs")
        if kinds[i] == "view":
            src = prog.loc[id(n.inputs[0])]
            prog.loc[id(out)] = Loc(src.base, src.offset + moves[i] * out.dtype.itemsize)
        elif kinds[i] == "strided":
            src = prog.loc[id(n.inputs[0])]
            offset, strides = moves[i]
            prog.loc[id(out)] = Loc(src.base, src.offset + offset * out.dtype.itemsize)
            prog.strided[id(out)] = strides
        else:
            prog.loc[id(out)] = _planned_loc(out, returned, plan)
        _emit_node(prog, i, n, kinds[i], moves.get(i))
        if i in ends:
            prog.steps.append("}")
            prog.sample = 0
    _region_units(prog)
    _compact_payload(prog)
    return prog


def _planned_loc(v: Value, returned: dict, plan) -> Loc:
    """Where the memory plan put node output ``v``: a caller's output buffer, or the
    arena."""
    if id(v) in returned:
        return Loc(f"((unsigned char*)out[{returned[id(v)]}])")
    if id(v) in plan.offsets:
        return Loc("m->arena", plan.offsets[id(v)])
    if v.nbytes == 0:
        return Loc("m->arena", 0)
    raise AssertionError(f"tessera.deploy: no buffer planned for {v.producer}")


_WEIGHT_REF = re.compile(r"\(m->w \+ (\d+)\)")


def _compact_payload(prog: Program) -> None:
    """Only the tensors the program reads stay in the weights payload: a quantized layer's
    int8 weight, say, which the library reads only as the panels packed from it at export,
    is dropped, and the offsets in the C move down accordingly."""
    refs = {int(r) for text in prog.steps + prog.kernels for r in _WEIGHT_REF.findall(text)}
    refs |= {off for off, _, _ in prog.packed}
    refs |= {row[0] for row in prog.wino.values()} | {row[0] for row in prog.planes}
    entries = []
    for name, (off, arr) in prog.weights.items():
        size = arr.nbytes if arr is not None else prog.graph.variables[name].nbytes
        entries.append((off, size, name, arr))
    entries.sort(key=lambda e: e[0])
    starts = [e[0] for e in entries]
    moved, weights, at = {}, {}, 0
    for r in sorted(refs):
        k = bisect.bisect_right(starts, r) - 1
        off, size, name, arr = entries[k]
        assert 0 <= k and r < off + max(size, 1), f"tessera.deploy: no weight at offset {r}"
        if name not in weights:
            weights[name] = (at, arr)
            moved[off] = at
            at += (size + ALIGN - 1) // ALIGN * ALIGN

    def new(r: int) -> int:
        off = starts[bisect.bisect_right(starts, r) - 1]
        return moved[off] + r - off

    def fix(text: str) -> str:
        return _WEIGHT_REF.sub(lambda mt: f"(m->w + {new(int(mt[1]))})", text)
    prog.steps = [fix(t) for t in prog.steps]
    prog.kernels = [fix(t) for t in prog.kernels]
    prog.packed = [(new(off), k, n) for off, k, n in prog.packed]
    prog.wino = {k: (new(row[0]),) + row[1:] for k, row in prog.wino.items()}
    prog.planes = [(new(row[0]),) + row[1:] for row in prog.planes]
    prog.weights = weights
    prog.payload_bytes = at


def weight_table(prog: Program) -> list[str]:
    """Make the program read each weight from a table of pointers (``m->wt[k]``, in the
    order of the names returned) instead of at its offset in one payload: a program run in
    process reads its weights where the process keeps them. ``prog.packed`` rows gain the
    weight's index: (byte offset in it, k, n, index)."""
    assert not prog.wino and not prog.planes, "tessera.deploy: a library's program"
    entries = sorted((off, name) for name, (off, _) in prog.weights.items())
    starts = [off for off, _ in entries]

    def at(r: int) -> tuple[int, int]:
        k = bisect.bisect_right(starts, r) - 1
        assert k >= 0, f"tessera.deploy: no weight at offset {r}"
        return k, r - starts[k]

    def fix(text: str) -> str:
        return _WEIGHT_REF.sub(lambda mt: "(m->wt[{}] + {})".format(*at(int(mt[1]))), text)
    prog.steps = [fix(t) for t in prog.steps]
    prog.kernels = [fix(t) for t in prog.kernels]
    rows = []
    for off, k, n in prog.packed:
        w, d = at(off)
        rows.append((d, k, n, w))
    prog.packed = rows
    return [name for _, name in entries]


def _emit_node(prog: Program, i: int, n: Node, kind: str, move) -> None:
    out = n.outputs[0]
    prog.steps.append(f"/* {n.op.name} {n.name} -> {out.type_str()} */")
    if kind in ("view", "strided"):
        return
    if kind == "copy":
        prog.steps.append(f"memcpy({prog.p(out)}, {prog.p(n.inputs[0])}, {out.nbytes});")
    elif kind == "move":
        offset, strides = move
        nd = len(out.shape)
        if nd > 8:
            raise _unsupported(n, "more than 8 dimensions")
        shape = ", ".join(map(str, out.shape))
        st = ", ".join(map(str, strides))
        prog.steps.append(
            f"{{ static const int64_t s[] = {{{shape}}}, t[] = {{{st}}};\n"
            f"  tsr_strided_copy({prog.p(out)}, {prog.p(n.inputs[0])}, {nd}, s, t, {offset}, "
            f"{out.dtype.itemsize}); }}")
    elif kind == "rule":
        RULES[n.op.name](prog, i, n)
    else:
        body, ext = _elementwise_body(n)
        _region(prog, i, body, ext, [out])


# the INT8 and binary rules, and those of _emit_more, _emit_index and _emit_extra, register
# themselves into RULES
from tessera.deploy import _emit_extra, _emit_index, _emit_lowp, _emit_more  # noqa: E402, F401
