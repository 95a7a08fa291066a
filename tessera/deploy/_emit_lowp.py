"""The C rules of low-precision models: INT8 (what ``tessera.ao.quantization.convert`` and
``quantize_dynamic`` make) and packed binary layers (what ``tessera.nn.binary.pack`` makes).

They run the kernels eager mode runs, ``kernels/c/int8.c`` and ``kernels/c/binary.c``,
copied into the folder and compiled under the model's prefix; each picks its instruction set
from the CPU once, at the first run (``TESSERA_INT8_ISA=amx|vnni512|avxvnni|avx2|c`` and
``TESSERA_BINARY_ISA=vpopcnt|avx2|c`` force one, as in eager mode; one this CPU lacks makes
``run`` fail with a message). The weights are prepared here, at export, exactly as eager
mode prepares them (``kernels.int8.Packed``, ``ops.quantized._qparams``, the binary
convolutions' plans: where eager mode runs one on the direct kernels (stride 1,
``kernels.binary._Conv.plan``), so does the library, on eager's plan made at export: the
blocked weights, the zero padding's corrections and the AVX2 path's nibble tables), and
stored in the weights file (the AVX2 path's bit planes' index lists, 16x the packed bits,
an exported library makes at load, by eager's C, where that path runs), so the library's
arithmetic is eager mode's, step for step: its results are bit for bit eager's on the same
instruction set. The quantize, dequantize, requantizing concatenation, pooling and ReLU of
quantized tensors are short loops written here, each the same float32 operations in the
same order as the NumPy kernel it stands for.

Scratch (im2col columns, bit-packed activations, the direct kernels' padded images) is the
model's scratch buffer, sized at
export, so ``run`` allocates nothing beyond what the kernels do themselves (the INT8
depthwise kernel's row buffers).

>>> from tessera.deploy._emit import RULES
>>> sorted(k for k in RULES if k.startswith("quantized_"))[:3]
['quantized_adaptive_avg_pool2d', 'quantized_add', 'quantized_cat']
"""
from __future__ import annotations

import math
import re

import numpy as np

from tessera.deploy._emit import RULES, Program, _unsupported
from tessera.graph.ir import Node, Value
from tessera.graph.memory import ALIGN
from tessera.kernels import binary as KB, int8 as K8
from tessera.kernels.csource import source
from tessera.ops.quantized import _qparams

__all__: list[str] = []

_U8 = ("quint8", "uint8")
_S8 = ("qint8", "int8")
_T = {"quint8": "uint8_t", "uint8": "uint8_t", "qint8": "int8_t", "int8": "int8_t"}
_LIMITS = {"uint8_t": (0, 255), "int8_t": (-128, 127)}
# the kernels' parallel split thresholds, as tessera.kernels.int8 and .binary split
_INT8_SPLIT, _BIN_SPLIT = 1 << 20, 1 << 18


# ---- what every rule needs ----------------------------------------------------------------

def _f32(v) -> str:
    """``v`` rounded to float32, as an exact C literal."""
    return f"{float(np.float32(v)).hex()}f"


def _i(ptr: str) -> str:
    """A pointer as an element of an int64 parameter array."""
    return f"(int64_t)(intptr_t)({ptr})"


def _const(prog: Program, array: np.ndarray, ctype: str) -> str:
    """``array`` appended to the weights payload; its C pointer in the loaded model."""
    return f"(({ctype}*)(m->w + {prog.constant(array)}))"


def _scratch(prog: Program, *sizes: int) -> list[str]:
    """Byte buffers of ``sizes`` in the model's scratch (shared by the steps, one at a time)."""
    offs, at = [], 0
    for s in sizes:
        offs.append(at)
        at += (s + ALIGN - 1) // ALIGN * ALIGN
    prog.scratch_bytes = max(prog.scratch_bytes, at)
    # the scratch brings the float im2col with it: referenced, so that -Werror builds
    # without a float convolution
    prog.steps.append("(void)im2col_f32;")
    return [f"((unsigned char*)m->scratch + {o})" for o in offs]


def _maybe(prog: Program, v, n: Node, what: str) -> np.ndarray | None:
    """The export-time value of variable ``v`` (None for an absent input)."""
    return None if v is None else _value(prog, v, n, what)


def _value(prog: Program, v, n: Node, what: str) -> np.ndarray:
    """The export-time value of variable ``v``."""
    if not isinstance(v, Value) or v.kind != "var":
        raise _unsupported(n, f"its {what} must be a constant")
    return np.asarray(prog.values[v.name])


def _ctype(n: Node, v: Value, kinds=_U8 + _S8) -> str:
    if not isinstance(v, Value) or v.dtype.name not in kinds:
        got = v.dtype.name if isinstance(v, Value) else type(v).__name__
        raise _unsupported(n, f"an input of {got} (expected {' or '.join(kinds)})")
    return _T[v.dtype.name]


# ---- the kernels' units and their dispatch --------------------------------------------------

def _symbols(text: str) -> list[str]:
    return re.findall(r"^(?:void|int|int64_t)\s+(tsr_\w+)\s*\(", text, re.M)


_FP_CONTRACT_OFF = ("#if defined(__clang__)\n#pragma STDC FP_CONTRACT OFF\n"
                    "#elif defined(__GNUC__)\n#pragma GCC optimize(\"fp-contract=off\")\n#endif\n")


# The direct binary kernels keep a tile's sums in registers only with their loops unrolled
# whole, which GCC does at -O3: at the library's -O2 they run 3 times slower (a 64-channel
# 3x3 convolution of 56x56). Their unit asks for -O3 (whose deeper inlining also makes GCC
# think a tile's counters may be read unset: they are set before they are read).
_O3 = ("#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC optimize(\"O3\")\n"
       "#pragma GCC diagnostic ignored \"-Wmaybe-uninitialized\"\n#endif\n")


def _unit(prog: Program, kernel: str, helpers: str, head: str = "") -> None:
    """``kernel`` (int8.c or binary.c) compiled once under this model's prefix, and the
    dispatch ``helpers`` in the program, on the first rule that needs them."""
    stem = kernel[:-2]
    fname = f"{prog.name}_{stem}.c"
    if fname in prog.units:
        return
    syms = _symbols(source(kernel))
    renames = "".join(f"#define {s} {prog.name}_{s}\n" for s in syms)
    # products and sums round separately, as NumPy's do (-std=c11 already says so to GCC)
    prog.units[fname] = (f"/* {kernel} under this model's prefix */\n{head}{_FP_CONTRACT_OFF}"
                         f"{renames}#include \"{kernel}\"\n")
    prog.kernels.append(renames + helpers.replace("MODEL", f"{prog.name}_model"))


_INT8_HELPERS = r"""
void tsr_int8_gemm_c(const int64_t*, int64_t, int64_t, int64_t, int64_t);
void tsr_int8_gemm_avx2(const int64_t*, int64_t, int64_t, int64_t, int64_t);
void tsr_int8_gemm_avxvnni(const int64_t*, int64_t, int64_t, int64_t, int64_t);
void tsr_int8_gemm_vnni512(const int64_t*, int64_t, int64_t, int64_t, int64_t);
void tsr_int8_gemm_amx(const int64_t*, int64_t, int64_t, int64_t, int64_t);
void tsr_int8_nhwc(const int64_t*, int64_t, int64_t);
void tsr_int8_im2col(const int64_t*, int64_t, int64_t);
void tsr_int8_depthwise(const int64_t*, int64_t, int64_t);
void tsr_int8_add(const int64_t*, int64_t, int64_t);
int tsr_int8_cpu(void);

#define TSR_USES_INT8 1
static const char *const I8_NAMES[] = {"c", "avx2", "avxvnni", "vnni512", "amx"};

/* the INT8 path: 0 C, 1 AVX2, 2 AVX-VNNI, 3 AVX-512 VNNI, 4 AMX (where the compiler built
   it and the OS grants the tiles: tsr_int8_cpu's bit 8), the best this CPU has within
   TESSERA_MAX_ISA (avx2 stops at AVX2, as eager's cap does) or TESSERA_INT8_ISA's (numpy:
   C, the same arithmetic); -1 an unknown name, -2 one this CPU lacks, -3 one above the cap.
   Chosen once (atomic: the kernel threads ask at once). */
static inline int i8_isa(void) {
    static int known = -4;
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k != -4) return k;
    static const int need[] = {0, 1, 2, 4, 8};
    const int bits = tsr_int8_cpu(), cap = max_isa() <= 0 ? 0 : max_isa() == 1 ? 1 : 4;
    const char *f = getenv("TESSERA_INT8_ISA");
    if (!f || !*f) {
        for (k = cap; k > 0 && (bits & need[k]) != need[k]; k--) continue;
    } else if (strcmp(f, "numpy") == 0) {
        k = 0;
    } else {
        k = -1;
        for (int i = 0; i < 5; i++)
            if (strcmp(f, I8_NAMES[i]) == 0)
                k = (bits & need[i]) != need[i] ? -2 : i > cap ? -3 : i;
    }
    __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    return k;
}

static inline int i8_check(MODEL *m) {
    const int k = i8_isa();
    if (k >= 0) return 0;
    char msg[256];
    if (k == -3)
        snprintf(msg, sizeof msg, "TESSERA_INT8_ISA=%s: TESSERA_MAX_ISA=%s excludes it",
                 getenv("TESSERA_INT8_ISA"), ISA_NAMES[max_isa()]);
    else
        snprintf(msg, sizeof msg, k == -1 ? "TESSERA_INT8_ISA=%s: expected amx, vnni512, "
                 "avxvnni, avx2 or c" : "TESSERA_INT8_ISA=%s: this CPU lacks it",
                 getenv("TESSERA_INT8_ISA"));
    return fail(m, msg);
}

static inline void i8_gemm_part(const int64_t *p, int64_t m0, int64_t m1, int64_t nb0,
                                int64_t nb1) {
    switch (i8_isa()) {
    case 4: tsr_int8_gemm_amx(p, m0, m1, nb0, nb1); break;
    case 3: tsr_int8_gemm_vnni512(p, m0, m1, nb0, nb1); break;
    case 2: tsr_int8_gemm_avxvnni(p, m0, m1, nb0, nb1); break;
    case 1: tsr_int8_gemm_avx2(p, m0, m1, nb0, nb1); break;
    default: tsr_int8_gemm_c(p, m0, m1, nb0, nb1);
    }
}

/* c: the parameters, rows, column blocks, parts, whether the columns are split */
static inline int64_t i8_gemm_item(const int64_t *c, int64_t i) {
    const int64_t *p = (const int64_t *)(intptr_t)c[0];
    const int64_t rows = c[1], nb = c[2], parts = c[3];
    if (c[4]) {
        const int64_t step = (nb + parts - 1) / parts, j0 = i * step;
        const int64_t j1 = j0 + step < nb ? j0 + step : nb;
        if (j0 < j1) i8_gemm_part(p, 0, rows, j0, j1);
    } else {
        const int64_t step = ((rows + parts - 1) / parts + 7) / 8 * 8, r0 = i * step;
        const int64_t r1 = r0 + step < rows ? r0 + step : rows;
        if (r0 < r1) i8_gemm_part(p, r0, r1, 0, nb);
    }
    return 0;
}

/* a product, on the kernel threads when it is big enough (the split eager mode makes:
   the columns when there are enough of them, each part's weights then stay in cache) */
static inline void i8_gemm(MODEL *m, const int64_t *p, int64_t rows, int64_t nb, int64_t k) {
    const int64_t t = m->threads;
    if (t < 2 || rows * nb * 16 * k < INT8_SPLIT) {
        i8_gemm_part(p, 0, rows, 0, nb);
        return;
    }
    const int64_t cols = nb >= 2 * t || rows < 16, have = cols ? nb : (rows + 7) / 8;
    int64_t c[] = {(int64_t)(intptr_t)p, rows, nb, 2 * t < have ? 2 * t : have, cols};
    tsr_pool_run(i8_gemm_item, c, c[3], m->threads);
}

/* c: which kernel (0 nhwc, 1 im2col, 2 depthwise, 3 add), its parameters, items, parts */
static inline int64_t i8_range_item(const int64_t *c, int64_t i) {
    const int64_t *p = (const int64_t *)(intptr_t)c[1];
    const int64_t a = c[2] * i / c[3], b = c[2] * (i + 1) / c[3];
    switch (c[0]) {
    case 0: tsr_int8_nhwc(p, a, b); break;
    case 1: tsr_int8_im2col(p, a, b); break;
    case 2: tsr_int8_depthwise(p, a, b); break;
    default: tsr_int8_add(p, a, b);
    }
    return 0;
}

static inline void i8_range(MODEL *m, int kind, const int64_t *p, int64_t items, int64_t cost) {
    int64_t parts = m->threads < 2 || items < 2 || items * cost < INT8_SPLIT ? 1 : 2 * m->threads;
    parts = parts < items ? parts : items;
    int64_t c[] = {kind, (int64_t)(intptr_t)p, items, parts};
    if (parts <= 1) i8_range_item(c, 0);
    else tsr_pool_run(i8_range_item, c, parts, m->threads);
}
""".replace("INT8_SPLIT", str(_INT8_SPLIT))

_BIN_HELPERS = r"""
void tsr_bin_gemm_c(const int64_t*, int64_t, int64_t, int64_t, int64_t);
void tsr_bin_gemm_avx2(const int64_t*, int64_t, int64_t, int64_t, int64_t);
void tsr_bin_gemm_vpopcnt(const int64_t*, int64_t, int64_t, int64_t, int64_t);
void tsr_bin_pack_rows(const float*, int64_t, int64_t, uint64_t*);
void tsr_bin_columns(const float*, int64_t, const int64_t*, uint64_t, uint64_t, uint64_t*,
                     uint32_t*, int64_t, int64_t);
void tsr_bin_columns_bits(const uint64_t*, int64_t, const int64_t*, uint64_t, uint64_t,
                          uint64_t*, uint32_t*, int64_t, int64_t);
int tsr_bin_cpu(void);
int64_t tsr_bin_planes_lists(const uint64_t*, int64_t, int64_t, int64_t, int64_t, int64_t*,
                             int32_t*);

#define TSR_USES_BINARY 1
static const char *const BIN_NAMES[] = {"c", "avx2", "vpopcnt"};

/* the binary path: 0 C, 1 AVX2, 2 AVX-512 VPOPCNTDQ, the best this CPU has within
   TESSERA_MAX_ISA or TESSERA_BINARY_ISA's (numpy: C); -1 an unknown name, -2 one this CPU
   lacks, -3 one above the cap */
static inline int bin_isa(void) {
    static int known = -4;
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k != -4) return k;
    static const int need[] = {0, 1, 2};
    const int bits = tsr_bin_cpu(), cap = max_isa() < 0 ? 0 : max_isa();
    const char *f = getenv("TESSERA_BINARY_ISA");
    if (!f || !*f) {
        for (k = cap; k > 0 && (bits & need[k]) != need[k]; k--) continue;
    } else if (strcmp(f, "numpy") == 0) {
        k = 0;
    } else {
        k = -1;
        for (int i = 0; i < 3; i++)
            if (strcmp(f, BIN_NAMES[i]) == 0)
                k = (bits & need[i]) != need[i] ? -2 : i > cap ? -3 : i;
    }
    __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    return k;
}

static inline int bin_check(MODEL *m) {
    const int k = bin_isa();
    if (k >= 0) return 0;
    char msg[256];
    if (k == -3)
        snprintf(msg, sizeof msg, "TESSERA_BINARY_ISA=%s: TESSERA_MAX_ISA=%s excludes it",
                 getenv("TESSERA_BINARY_ISA"), ISA_NAMES[max_isa()]);
    else
        snprintf(msg, sizeof msg, k == -1 ? "TESSERA_BINARY_ISA=%s: expected vpopcnt, avx2 "
                 "or c" : "TESSERA_BINARY_ISA=%s: this CPU lacks it",
                 getenv("TESSERA_BINARY_ISA"));
    return fail(m, msg);
}

static inline void bin_gemm_part(const int64_t *p, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    switch (bin_isa()) {
    case 2: tsr_bin_gemm_vpopcnt(p, m0, m1, n0, n1); break;
    case 1: tsr_bin_gemm_avx2(p, m0, m1, n0, n1); break;
    default: tsr_bin_gemm_c(p, m0, m1, n0, n1);
    }
}

/* c: the parameters, columns, rows, parts, whether the rows are split */
static inline int64_t bin_gemm_item(const int64_t *c, int64_t i) {
    const int64_t *p = (const int64_t *)(intptr_t)c[0];
    const int64_t mp = c[1], n = c[2], parts = c[3];
    if (c[4]) {
        const int64_t step = ((n + parts - 1) / parts + 7) / 8 * 8, n0 = i * step;
        const int64_t n1 = n0 + step < n ? n0 + step : n;
        if (n0 < n1) bin_gemm_part(p, 0, mp, n0, n1);
    } else {
        const int64_t step = ((mp / 16) + parts - 1) / parts * 16, m0 = i * step;
        const int64_t m1 = m0 + step < mp ? m0 + step : mp;
        if (m0 < m1) bin_gemm_part(p, m0, m1, 0, n);
    }
    return 0;
}

static inline void bin_gemm(MODEL *m, const int64_t *p, int64_t mp, int64_t n, int64_t k) {
    if (m->threads < 2 || mp * n * k < BIN_SPLIT) {
        bin_gemm_part(p, 0, mp, 0, n);
        return;
    }
    const int64_t t = 2 * (int64_t)m->threads;
    int64_t c[] = {(int64_t)(intptr_t)p, mp, n, t, n >= 8 * t};
    tsr_pool_run(bin_gemm_item, c, t, m->threads);
}

int64_t tsr_bin_direct_block(void);
void tsr_bin_direct_pack(const int64_t*, const float*, uint64_t*);
void tsr_bin_direct_bits(const int64_t*, const uint64_t*, uint64_t*);
void tsr_bin_direct_nibbles(const int64_t*, uint64_t*);
void tsr_bin_direct_conv(const int64_t*, int64_t, uint64_t*, const float*, void*, int64_t,
                         int64_t, const int64_t*);

/* c: the plan, the path, the packed image, the scales, the output, the thresholds, the
   output channels and a part's */
static inline int64_t bin_direct_item(const int64_t *c, int64_t i) {
    const int64_t n0 = i * c[7], n1 = n0 + c[7] < c[6] ? n0 + c[7] : c[6];
    if (n0 < n1)
        tsr_bin_direct_conv((const int64_t *)(intptr_t)c[0], c[1], (uint64_t *)(intptr_t)c[2],
                            (const float *)(intptr_t)c[3], (void *)(intptr_t)c[4], n0, n1,
                            (const int64_t *)(intptr_t)c[5]);
    return 0;
}

/* A stride-1 convolution on the direct kernels, as eager mode runs it, on its plan g (made
   at export by eager's code): each of the n images (float, or with bits bit-packed words;
   in_bytes apart) packed into the padded image img (the model's scratch), the AVX2 path's
   planes made from it, then its o output channels, on the kernel threads in parts of a
   multiple of the kernels' block when the work is as large as eager's split (eager splits
   the images among the threads when there are enough: the same integers) */
static inline void bin_direct(MODEL *m, const int64_t *g, int bits, const void *x,
                              int64_t in_bytes, const float *scale, void *out,
                              int64_t out_bytes, const int64_t *T, uint64_t *img, int64_t n,
                              int64_t o, int64_t work) {
    const int64_t path = bin_isa(), t = m->threads, nb = tsr_bin_direct_block();
    int64_t step = o;
    if (t >= 2 && n * work >= BIN_SPLIT) step = ((o + t - 1) / t + nb - 1) / nb * nb;
    const int64_t parts = (o + step - 1) / step;
    for (int64_t i = 0; i < n; i++) {
        const char *xi = (const char *)x + i * in_bytes;
        char *oi = (char *)out + i * out_bytes;
        if (bits) tsr_bin_direct_bits(g, (const uint64_t *)xi, img);
        else tsr_bin_direct_pack(g, (const float *)xi, img);
        if (path == 1) tsr_bin_direct_nibbles(g, img);
        if (parts < 2) {
            tsr_bin_direct_conv(g, path, img, scale, oi, 0, o, T);
            continue;
        }
        const int64_t c[] = {(int64_t)(intptr_t)g, path, (int64_t)(intptr_t)img,
                             (int64_t)(intptr_t)scale, (int64_t)(intptr_t)oi,
                             (int64_t)(intptr_t)T, o, step};
        tsr_pool_run(bin_direct_item, c, parts, (int)t);
    }
}
""".replace("BIN_SPLIT", str(_BIN_SPLIT))


def _int8(prog: Program) -> None:
    _unit(prog, "int8.c", _INT8_HELPERS)
    prog.steps.append("if (i8_check(m)) return 1;")


def _binary(prog: Program) -> None:
    _unit(prog, "binary.c", _BIN_HELPERS, _O3)
    prog.steps.append("if (bin_check(m)) return 1;")


# ---- quantize, dequantize and the elementwise ops of quantized tensors ---------------------

def _clamp_store(t: str, lo, hi) -> str:
    return f"v = v < {float(lo)!r}f ? {float(lo)!r}f : v > {float(hi)!r}f ? {float(hi)!r}f : v;"


def _quantize(prog: Program, i: int, n: Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    if x.dtype.name != "float32" or out.dtype.name not in _T:
        raise _unsupported(n, f"{x.dtype.name} to {out.dtype.name} (float32 to (q)uint8/int8)")
    t = _T[out.dtype.name]
    lo, hi = _LIMITS[t]
    inv = np.float32(1.0) / np.float32(n.attrs["scale"])
    # x * (1 / scale), rounded half to even, plus the zero point, clamped (as NumPy's)
    prog.steps.append(
        f"{{ const float *x = {prog.p(x)}; {t} *y = {prog.p(out)};\n"
        f"  for (int64_t i = 0; i < {x.numel}; i++) {{\n"
        f"    float v = nearbyintf(x[i] * {_f32(inv)}) + {_f32(n.attrs['zero_point'])};\n"
        f"    {_clamp_store(t, lo, hi)}\n    y[i] = ({t})(int32_t)v;\n  }} }}")


def _dequantize(prog: Program, i: int, n: Node) -> None:
    q, out = n.inputs[0], n.outputs[0]
    t = _ctype(n, q)
    zp, s = int(n.attrs["zero_point"]), _f32(n.attrs["scale"])
    prog.steps.append(
        f"{{ const {t} *q = {prog.p(q)}; float *y = {prog.p(out)};\n"
        f"  for (int64_t i = 0; i < {q.numel}; i++) "
        f"y[i] = (float)((int32_t)q[i] - {zp}) * {s}; }}")


def _dequantize_pc(prog: Program, i: int, n: Node) -> None:
    q, sc, zp = n.inputs[:3]
    out = n.outputs[0]
    t = _ctype(n, q)
    axis = n.attrs["axis"] % len(q.shape)
    s = _const(prog, _value(prog, sc, n, "scales").astype(np.float32), "const float")
    z = _const(prog, _value(prog, zp, n, "zero points").astype(np.int32), "const int32_t")
    inner, ch = math.prod(q.shape[axis + 1:]), q.shape[axis]
    prog.steps.append(
        f"{{ const {t} *q = {prog.p(q)}; float *y = {prog.p(out)};\n"
        f"  for (int64_t i = 0; i < {q.numel}; i++) {{ int64_t c = i / {inner} % {ch};\n"
        f"    y[i] = (float)((int32_t)q[i] - {z}[c]) * {s}[c]; }} }}")


def _qrelu(prog: Program, i: int, n: Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    t = _ctype(n, x)
    zp = int(n.attrs["zero_point"])
    prog.steps.append(
        f"{{ const {t} *x = {prog.p(x)}; {t} *y = {prog.p(out)};\n"
        f"  for (int64_t i = 0; i < {x.numel}; i++) y[i] = x[i] > {zp} ? x[i] : ({t}){zp}; }}")


def _qadd(prog: Program, i: int, n: Node) -> None:
    a, b = n.inputs[:2]
    out, at = n.outputs[0], n.attrs
    t = _ctype(n, a)
    if _ctype(n, b) != t:
        raise _unsupported(n, "operands of two dtypes")
    lo, hi = _LIMITS[t]
    if at["relu"]:
        lo = max(lo, at["out_zp"])
    _int8(prog)
    scales = ", ".join(_f32(at[k]) for k in ("a_scale", "b_scale", "out_scale"))
    prog.steps.append(
        f"{{ static const float sc[3] = {{{scales}}};\n"
        f"  const int64_t p[] = {{{_i(prog.p(a))}, {_i(prog.p(b))}, {_i(prog.p(out))}, "
        f"{at['a_zp']}, {at['b_zp']}, {_i('sc')}, {at['out_zp']}, {lo}, {hi}, "
        f"{int(t == 'int8_t')}}};\n"
        f"  i8_range(m, 3, p, {out.numel}, 8); }}")


def _qcat(prog: Program, i: int, n: Node) -> None:
    out, at = n.outputs[0], n.attrs
    ins = [v for v in n.inputs if isinstance(v, Value)]
    t = _ctype(n, out)
    if any(_ctype(n, v) != t for v in ins):
        raise _unsupported(n, "inputs of mixed dtypes")
    lo, hi = _LIMITS[t]
    d = at["dim"] % len(out.shape)
    outer, row = math.prod(out.shape[:d]), math.prod(out.shape[d:])
    os_, ozp = _f32(at["out_scale"]), _f32(at["out_zp"])
    col = 0
    for v, s, z in zip(ins, at["scales"], at["zero_points"]):
        chunk = math.prod(v.shape[d:])
        # dequantized in float32, divided by the output's scale, rounded, shifted, clamped
        prog.steps.append(
            f"{{ const {t} *x = {prog.p(v)}; {t} *y = {prog.p(out)} + {col};\n"
            f"  for (int64_t o = 0; o < {outer}; o++) for (int64_t j = 0; j < {chunk}; j++) {{\n"
            f"    float v = nearbyintf((float)((int32_t)x[o * {chunk} + j] - {int(z)}) * "
            f"{_f32(s)} / {os_}) + {ozp};\n"
            f"    {_clamp_store(t, lo, hi)}\n    y[o * {row} + j] = ({t})(int32_t)v;\n  }} }}")
        col += chunk


def _qmaxpool(prog: Program, i: int, n: Node) -> None:
    x, out, at = n.inputs[0], n.outputs[0], n.attrs
    t = _ctype(n, x)
    N, C, H, W = x.shape
    _, _, OH, OW = out.shape
    (kh, kw), (sh, sw), (ph, pw) = at["kernel_size"], at["stride"], at["padding"]
    dh, dw = at.get("dilation", (1, 1))
    # the padding is the type's least value, which never wins: the taps inside suffice
    prog.steps.append(
        f"{{ const {t} *x = {prog.p(x)}; {t} *y = {prog.p(out)};\n"
        f"  for (int64_t q = 0; q < {N * C}; q++) for (int64_t oy = 0; oy < {OH}; oy++)\n"
        f"  for (int64_t ox = 0; ox < {OW}; ox++) {{\n"
        f"    {t} best = {_LIMITS[t][0]};\n"
        f"    for (int64_t i = 0; i < {kh}; i++) {{ int64_t iy = oy * {sh} - {ph} + i * {dh};\n"
        f"      if (iy < 0 || iy >= {H}) continue;\n"
        f"      for (int64_t j = 0; j < {kw}; j++) {{ int64_t ix = ox * {sw} - {pw} + j * {dw};\n"
        f"        if (ix < 0 || ix >= {W}) continue;\n"
        f"        {t} v = x[(q * {H} + iy) * {W} + ix]; best = v > best ? v : best; }} }}\n"
        f"    y[(q * {OH} + oy) * {OW} + ox] = best;\n  }} }}")


def _qavgpool(prog: Program, i: int, n: Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    t = _ctype(n, x)
    N, C, H, W = x.shape
    OH, OW = out.shape[2:]
    # the window's integer sum is exact in float32 (as NumPy's float32 sum of it), divided
    # by the count, rounded half to even
    prog.steps.append(
        f"{{ const {t} *x = {prog.p(x)}; {t} *y = {prog.p(out)};\n"
        f"  for (int64_t q = 0; q < {N * C}; q++) for (int64_t i = 0; i < {OH}; i++)\n"
        f"  for (int64_t j = 0; j < {OW}; j++) {{\n"
        f"    int64_t h0 = i * {H} / {OH}, h1 = ((i + 1) * {H} + {OH - 1}) / {OH};\n"
        f"    int64_t w0 = j * {W} / {OW}, w1 = ((j + 1) * {W} + {OW - 1}) / {OW};\n"
        f"    int32_t s = 0;\n"
        f"    for (int64_t a = h0; a < h1; a++) for (int64_t b = w0; b < w1; b++)\n"
        f"      s += x[(q * {H} + a) * {W} + b];\n"
        f"    y[(q * {OH} + i) * {OW} + j] = ({t})(int32_t)nearbyintf((float)s / "
        f"(float)((h1 - h0) * (w1 - w0)));\n  }} }}")


# ---- the INT8 products ---------------------------------------------------------------------

def _pad(v: np.ndarray | None, n: int, dtype) -> np.ndarray:
    out = np.zeros(n, dtype)
    if v is not None:
        out[:len(v)] = v
    return out


def _packed(prog: Program, w: np.ndarray) -> tuple[str, str, K8.Packed]:
    """(weights, column sums, the packing) of int8 ``w`` (N x K) in the GEMM's layout."""
    pw = K8.Packed(np.ascontiguousarray(w, np.int8))
    return _const(prog, pw.data, "const int8_t"), _const(prog, pw.colsum, "const int32_t"), pw


def _gemm_params(rows, pw: K8.Packed, a: str, b: str, colsum: str, bias: str | None,
                 mult: str, c: str, a_zp, zp, lo, hi, mode: int, bias_f: str | None = None,
                 pix: int = 0, ntot: int = 0, noff: int = 0) -> str:
    """int8.c's parameter array (P_M ... P_NOFF) of one product."""
    vals = [rows, pw.n, pw.kp, _i(a), pw.kp, _i(b), _i(colsum), _i(bias) if bias else 0,
            _i(mult), _i(c), pw.n, a_zp, zp, lo, hi, mode, _i(bias_f) if bias_f else 0, pix,
            ntot, noff]
    return "{" + ", ".join(map(str, vals)) + "}"


def _rows_padded(prog: Program, x: str, rows: int, k: int, kp: int) -> tuple[str, str]:
    """(C that copies ``rows`` rows of ``k`` bytes at ``x`` to rows of ``kp``, zero-padded;
    the copy), or ("", x) when ``k`` is already ``kp``."""
    if k == kp:
        return "", x
    (buf,) = _scratch(prog, rows * kp)
    return (f"  for (int64_t r = 0; r < {rows}; r++) {{\n"
            f"    memcpy({buf} + r * {kp}, (const uint8_t*){x} + r * {k}, {k});\n"
            f"    memset({buf} + r * {kp} + {k}, 0, {kp - k}); }}\n", buf)


def _qlinear(prog: Program, i: int, n: Node) -> None:
    x, w, ws, bias = n.inputs[:4]
    out, at = n.outputs[0], n.attrs
    if _ctype(n, x, _U8) != "uint8_t" or _ctype(n, w, _S8) != "int8_t":
        raise _unsupported(n, "expected uint8 activations and int8 weights")
    wv = _value(prog, w, n, "weight")
    mult, b = _qparams(at["x_scale"], _value(prog, ws, n, "weight scales"), at["out_scale"],
                       _maybe(prog, bias, n, "bias"))
    lo, hi = K8._range(np.dtype(np.uint8), None, None, at["relu"], at["out_zp"])
    _int8(prog)
    B, colsum, pw = _packed(prog, wv)
    M = math.prod(x.shape[:-1])
    copy, a = _rows_padded(prog, prog.p(x), M, x.shape[-1], pw.kp)
    bp = _const(prog, _pad(b, pw.np_, np.int32), "const int32_t") if b is not None else None
    mp = _const(prog, _pad(mult, pw.np_, np.float32), "const float")
    prm = _gemm_params(M, pw, a, B, colsum, bp, mp, prog.p(out), at["x_zp"], at["out_zp"], lo,
                       hi, 0)
    prog.steps.append(f"{{\n{copy}  const int64_t p[] = {prm};\n"
                      f"  i8_gemm(m, p, {M}, {pw.np_ // 16}, {pw.kp}); }}")


def _qlinear_dynamic(prog: Program, i: int, n: Node) -> None:
    x, w, ws, bias = n.inputs[:4]
    out = n.outputs[0]
    if x.dtype.name != "float32" or _ctype(n, w, _S8) != "int8_t":
        raise _unsupported(n, "expected float32 activations and int8 weights")
    qmax = 127 if n.attrs["reduce_range"] else 255
    _int8(prog)
    B, colsum, pw = _packed(prog, _value(prog, w, n, "weight"))
    wsp = _const(prog, _pad(_value(prog, ws, n, "weight scales").astype(np.float32), pw.np_,
                            np.float32), "const float")
    bv = _maybe(prog, bias, n, "bias")
    bf = _const(prog, _pad(None if bv is None else bv.astype(np.float32), pw.np_, np.float32),
                "const float")
    K = x.shape[-1]
    M = math.prod(x.shape[:-1])
    a, mult = _scratch(prog, M * pw.kp, pw.np_ * 4)
    prm = _gemm_params(M, pw, a, B, colsum, None, mult, prog.p(out), "zp", 0, 0, 0, 2, bf)
    # the input's range (with 0) in float64, its scale and zero point as PyTorch's
    # choose_qparams, the input quantized to uint8, the product's float epilogue
    prog.steps.append(
        f"{{ const float *x = {prog.p(x)}; float lo = 0.0f, hi = 0.0f;\n"
        f"  for (int64_t i = 0; i < {M * K}; i++) {{ lo = x[i] < lo ? x[i] : lo; "
        f"hi = x[i] > hi ? x[i] : hi; }}\n"
        f"  double sd = ((double)hi - (double)lo) / {qmax}.0;\n"
        f"  if (sd == 0.0) sd = 1.0;\n"
        f"  double zd = nearbyint(-(double)lo / sd);\n"
        f"  zd = zd < 0.0 ? 0.0 : zd > {qmax}.0 ? {qmax}.0 : zd;\n"
        f"  const int64_t zp = (int64_t)zd;\n"
        f"  const float s = (float)sd, inv = 1.0f / s;\n"
        f"  uint8_t *a = {a}; float *mult = (float*){mult};\n"
        f"  for (int64_t r = 0; r < {M}; r++) {{\n"
        f"    for (int64_t k = 0; k < {K}; k++) {{\n"
        f"      float v = nearbyintf(x[r * {K} + k] * inv) + (float)zp;\n"
        f"      {_clamp_store('uint8_t', 0, qmax)}\n"
        f"      a[r * {pw.kp} + k] = (uint8_t)(int32_t)v; }}\n"
        f"    for (int64_t k = {K}; k < {pw.kp}; k++) a[r * {pw.kp} + k] = 0; }}\n"
        f"  for (int64_t j = 0; j < {pw.np_}; j++) mult[j] = s * {wsp}[j];\n"
        f"  const int64_t p[] = {prm};\n"
        f"  i8_gemm(m, p, {M}, {pw.np_ // 16}, {pw.kp}); }}")


def _qconv(prog: Program, i: int, n: Node) -> None:
    x, w, ws, bias = n.inputs[:4]
    out, at = n.outputs[0], n.attrs
    if _ctype(n, x, _U8) != "uint8_t" or _ctype(n, w, _S8) != "int8_t" or len(x.shape) != 4:
        raise _unsupported(n, "expected a 4-d uint8 input and int8 weights")
    wv = np.ascontiguousarray(_value(prog, w, n, "weight"), np.int8)
    mult, b = _qparams(at["x_scale"], _value(prog, ws, n, "weight scales"), at["out_scale"],
                       _maybe(prog, bias, n, "bias"))
    lo, hi = K8._range(np.dtype(np.uint8), None, None, at["relu"], at["out_zp"])
    N, C, H, W = x.shape
    O, Cg, KH, KW = wv.shape
    OH, OW = out.shape[2:]
    G = at["groups"]
    (sh, sw), (ph, pw_), (dh, dw) = at["stride"], at["padding"], at["dilation"]
    _int8(prog)
    xz, oz = at["x_zp"], at["out_zp"]

    def geo(xp: str) -> list:
        return [C, Cg, H, W, KH, KW, sh, sw, ph, pw_, dh, dw, OH, OW, _i(xp), xz]
    if Cg == 1 and G > 1:  # depthwise: exact int32 sums over the taps
        bp = _const(prog, b.astype(np.int32), "const int32_t") if b is not None else None
        mp = _const(prog, mult.astype(np.float32), "const float")
        dwp = geo(prog.p(x)) + [0, 0, _i(prog.p(w)),
                                _i(bp) if bp else 0, _i(mp), _i(prog.p(out)), oz, lo, hi,
                                O // G, 0]
        prog.steps.append(f"{{ const int64_t p[] = {{{', '.join(map(str, dwp))}}};\n"
                          f"  i8_range(m, 2, p, {N * O}, {OH * OW * KH * KW * 4}); }}")
        return
    conv = K8._Conv(wv, G)
    og, M = O // G, N * OH * OW
    hp, wp = H + 2 * ph, W + 2 * pw_
    direct = KH == KW == 1 and (sh, sw) == (1, 1) and (ph, pw_) == (0, 0)
    kp = conv.packed[0].kp
    nhwc, cols = _scratch(prog, N * hp * wp * Cg, 0 if direct and Cg == kp else M * kp)
    lines = []
    for g, pk in enumerate(conv.packed):
        sl = slice(g * og, (g + 1) * og)
        B = _const(prog, pk.data, "const int8_t")
        cs = _const(prog, pk.colsum, "const int32_t")
        bp = _const(prog, _pad(b[sl], pk.np_, np.int32), "const int32_t") \
            if b is not None else None
        mp = _const(prog, _pad(mult[sl], pk.np_, np.float32), "const float")
        # the group's channels as padded NHWC, then its columns (a 1x1 convolution of
        # stride 1 multiplies the copy itself), the product writing NCHW
        xg = f"(const uint8_t*){prog.p(x)} + {g * Cg * H * W}"
        lines.append(f"{{ const int64_t q[] = {{{', '.join(map(str, geo(xg)))}, {_i(nhwc)}, 0}};\n"
                     f"  i8_range(m, 0, q, {N * hp}, {wp * Cg}); }}")
        src = nhwc
        if not (direct and Cg == kp):
            src = cols
            lines.append(f"{{ const int64_t q[] = {{{', '.join(map(str, geo(nhwc)))}, "
                         f"{_i(cols)}, {kp}}};\n  i8_range(m, 1, q, {M}, {kp}); }}")
        prm = _gemm_params(M, pk, src, B, cs, bp, mp, prog.p(out), xz, oz, lo, hi, 0,
                           pix=OH * OW, ntot=O, noff=g * og)
        lines.append(f"{{ const int64_t p[] = {prm};\n"
                     f"  i8_gemm(m, p, {M}, {pk.np_ // 16}, {kp}); }}")
    prog.steps.append("\n".join(lines))


# ---- the packed binary products -------------------------------------------------------------

def _direct(prog: Program, n: Node, wv: np.ndarray, x: Value, out: Value, alpha,
            thr) -> bool:
    """The convolution on the direct kernels, where eager mode runs it there (its rule,
    ``_Conv.plan``): True, the step written; False where the columns run it. The plan is
    eager's, made by its code at export: the blocked weights, the zero padding's corrections
    and the AVX2 path's bit planes (or nibble tables) as constants, the pointers of the
    plan set in the step. The thresholds are the node's own, as eager's kernels read them."""
    at = n.attrs
    if KB._lib() is None:  # no compiler here: eager would not run them either
        return False
    cin, bits_in, bits_out = at["in_channels"], x.dtype.name == "int64", thr is not None
    N, H, W = (x.shape[0], x.shape[1], x.shape[2]) if bits_in else \
        (x.shape[0], x.shape[2], x.shape[3])
    plan = KB._Conv(wv, cin).plan(H, W, at["stride"], at["padding"], at["dilation"],
                                  at["pad_value"])
    if plan is None:
        return False
    plan.nibble_tables()
    g: list = [int(v) for v in plan.g]
    wb = prog.constant(plan.wb)
    g[KB._D_WB] = _i(f"((const uint64_t*)(m->w + {wb}))")
    g[KB._D_CORR] = g[KB._D_BASE] = g[KB._D_SRC] = g[KB._D_SRC_BYTES] = 0
    g[KB._D_NIB] = g[KB._D_PLN] = 0
    if plan.corr is not None and plan.base is not None:  # zero padding's corrections
        g[KB._D_CORR] = _i(_const(prog, plan.corr, "const int32_t"))
        g[KB._D_BASE] = _i(_const(prog, plan.base, "const float"))
    head = ""
    if plan.pl_words:  # the AVX2 path's bit planes: their plan, pointing at its tables
        pl_arr, chan, idx = plan.planes
        pl: list = [int(v) for v in pl_arr]
        if prog.library:  # its lists made at load where the AVX2 path runs (m->planes)
            ch_at = prog.planes_bytes
            idx_at = ch_at + (chan.nbytes + ALIGN - 1) // ALIGN * ALIGN
            prog.planes_bytes = idx_at + (idx.nbytes + ALIGN - 1) // ALIGN * ALIGN
            prog.planes.append((wb, plan.o, cin, wv.shape[3], wv.shape[1] * wv.shape[2],
                                ch_at, idx_at))
            pl[KB._PL_CH] = f"(int64_t)((intptr_t)m->planes + {ch_at})"
            pl[KB._PL_IDX] = f"(int64_t)((intptr_t)m->planes + {idx_at})"
        else:
            pl[KB._PL_CH] = _i(_const(prog, chan, "const int64_t"))
            pl[KB._PL_IDX] = _i(_const(prog, idx, "const int32_t"))
        head = f"const int64_t pl[] = {{{', '.join(map(str, pl))}}};\n  "
        g[KB._D_PLN] = _i("pl")
    elif plan.tables is not None:  # else its nibble tables
        g[KB._D_NIB] = _i(_const(prog, plan.tables, "const uint8_t"))
    (img,) = _scratch(prog, plan.img_words * 8)
    o, ohw = plan.o, plan.oh * plan.ow
    in_bytes = plan.in_bytes[int(bits_in)]
    out_bytes = ohw * -(-o // 64) * 8 if bits_out else o * ohw * 4
    scale = f"(const float*){prog.p(alpha)}" if isinstance(alpha, Value) and not bits_out \
        else "0"
    T = f"(const int64_t*){prog.p(thr)}" if bits_out else "0"
    prog.steps.append(
        f"{{ {head}const int64_t g[] = {{{', '.join(map(str, g))}}};\n"
        f"  bin_direct(m, g, {int(bits_in)}, {prog.p(x)}, {in_bytes}, {scale}, "
        f"{prog.p(out)}, {out_bytes}, {T}, (uint64_t*){img}, {N}, {o}, {plan.work}); }}")
    return True


def _bconv(prog: Program, i: int, n: Node) -> None:
    x, words, alpha = n.inputs[:3]
    out, at = n.outputs[0], n.attrs
    if x.dtype.name != "float32" or len(x.shape) != 4:
        raise _unsupported(n, "only float32 4-d inputs")
    wv = _value(prog, words, n, "packed weight").view(np.uint64)
    _maybe(prog, alpha, n, "alpha")
    cin = at["in_channels"]
    N, C, H, W = x.shape
    O, KH, KW, CW = wv.shape
    OH, OW = out.shape[2:]
    (sh, sw), (ph, pw), (dh, dw) = at["stride"], at["padding"], at["dilation"]
    pad = at["pad_value"]
    _binary(prog)
    if _direct(prog, n, wv, x, out, alpha, None):
        return
    M = OH * OW
    mip = -(-M // 16) * 16
    halves = 2 * KH * KW * CW
    planes, cols = _scratch(prog, CW * H * W * 8, halves * N * mip * 4)
    last = cin - 64 * (CW - 1)
    ones = (1 << 64) - 1
    fill, fill_last = (ones, ones >> (64 - last)) if pad == -1 else (0, 0)
    corr = None
    if pad == 0 and any((ph, pw)):
        c = KB._Conv(wv, cin).corr(H, W, (sh, sw), (ph, pw), (dh, dw), OH, OW)
        corr = _const(prog, c, "const int32_t")
    g = [CW, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, mip, N * mip]
    prm = [M, N * mip, O, halves, _i(cols), _i(prog.p(words)), _i(prog.p(out)), M,
           cin * KH * KW, _i(corr) if corr else 0,
           _i(prog.p(alpha)) if isinstance(alpha, Value) else 0, 0, M, mip, O * M]
    # every image binarized and laid out as the columns, then one product
    prog.steps.append(
        f"{{ static const int64_t g[] = {{{', '.join(map(str, g))}}};\n"
        f"  tsr_bin_columns({prog.p(x)}, {C}, g, {fill}ull, {fill_last}ull, "
        f"(uint64_t*){planes}, (uint32_t*){cols}, 0, {N});\n"
        f"  const int64_t p[] = {{{', '.join(map(str, prm))}}};\n"
        f"  bin_gemm(m, p, {N * mip}, {O}, {halves}); }}")


def _blinear(prog: Program, i: int, n: Node) -> None:
    x, words, alpha = n.inputs[:3]
    out = n.outputs[0]
    if x.dtype.name != "float32":
        raise _unsupported(n, "only float32 inputs")
    wv = np.ascontiguousarray(_value(prog, words, n, "packed weight")).view(np.uint64)
    _maybe(prog, alpha, n, "alpha")
    cin = n.attrs["in_features"]
    O, CW = wv.shape
    rows = math.prod(x.shape[:-1])
    _binary(prog)
    # the weights are the columns (a batch of one still fills the 16-wide tiles)
    op = -(-O // 16) * 16
    a = np.zeros((2 * CW, op), np.uint32)
    a[:, :O] = wv.view(np.uint32).T
    ap = _const(prog, a, "const uint32_t")
    (packed,) = _scratch(prog, rows * CW * 8)
    prm = [O, op, rows, 2 * CW, _i(ap), _i(packed), _i(prog.p(out)), O, cin, 0,
           _i(prog.p(alpha)) if isinstance(alpha, Value) else 0, 1, O, op, 0]
    prog.steps.append(
        f"{{ tsr_bin_pack_rows({prog.p(x)}, {rows}, {cin}, (uint64_t*){packed});\n"
        f"  const int64_t p[] = {{{', '.join(map(str, prm))}}};\n"
        f"  bin_gemm(m, p, {op}, {rows}, {2 * CW}); }}")


# ---- bit-packed activations between binary layers ----------------------------------------
# Stride 1 runs on the direct kernels (``_direct``), as in eager mode; otherwise eager's
# column path: a bit-packed input is made planar and laid out as columns, and a thresholded
# output is the exact dot products' signs, (dot < t) xor flip, packed channel-last.

def _signs_step(prog: Program, n: Node, dot: str, out: Value, images: int, o: int,
                pixels: int) -> str:
    """C that packs the signs of ``dot`` (float, (images, o, pixels): exact integers) into
    ``out`` (int64 words, (images, pixels, ceil(o / 64)))."""
    t = _value(prog, n.inputs[3], n, "threshold")
    tp = _const(prog, t[:, 0].astype(np.int64), "const int64_t")
    fp = _const(prog, (t[:, 1] & 1).astype(np.uint8), "const uint8_t")
    cwo = -(-o // 64)
    return (f"{{ const float *d = (const float*){dot}; uint64_t *y = (uint64_t*){prog.p(out)};\n"
            f"  for (int64_t i = 0; i < {images}; i++) for (int64_t q = 0; q < {pixels}; q++)\n"
            f"    for (int64_t w = 0; w < {cwo}; w++) {{ uint64_t word = 0;\n"
            f"      for (int64_t c = 0; c < 64 && w * 64 + c < {o}; c++) {{\n"
            f"        const int64_t k = w * 64 + c;\n"
            f"        const double v = d[(i * {o} + k) * {pixels} + q];\n"
            f"        word |= (uint64_t)((v < (double){tp}[k]) ^ {fp}[k]) << c; }}\n"
            f"      y[(i * {pixels} + q) * {cwo} + w] = word; }} }}")


def _bbconv(prog: Program, i: int, n: Node) -> None:
    x, words, alpha, thr = n.inputs[:4]
    out, at = n.outputs[0], n.attrs
    bits = isinstance(thr, Value)
    if x.dtype.name not in ("float32", "int64") or len(x.shape) != 4:
        raise _unsupported(n, "only float32 or bit-packed int64 4-d inputs")
    wv = _value(prog, words, n, "packed weight").view(np.uint64)
    _maybe(prog, alpha, n, "alpha")
    cin = at["in_channels"]
    packed_in = x.dtype.name == "int64"
    N, H, W = (x.shape[0], x.shape[1], x.shape[2]) if packed_in else \
        (x.shape[0], x.shape[2], x.shape[3])
    O, KH, KW, CW = wv.shape
    OH, OW = out.shape[1:3] if bits else out.shape[2:]
    (sh, sw), (ph, pw), (dh, dw) = at["stride"], at["padding"], at["dilation"]
    pad = at["pad_value"]
    _binary(prog)
    if _direct(prog, n, wv, x, out, alpha, thr if bits else None):
        return
    M = OH * OW
    mip = -(-M // 16) * 16
    halves = 2 * KH * KW * CW
    planes, cols, dots = _scratch(prog, CW * H * W * 8, halves * N * mip * 4,
                                  N * O * M * 4 if bits else 0)
    last = cin - 64 * (CW - 1)
    ones = (1 << 64) - 1
    fill, fill_last = (ones, ones >> (64 - last)) if pad == -1 else (0, 0)
    corr = None
    if pad == 0 and any((ph, pw)):
        c = KB._Conv(wv, cin).corr(H, W, (sh, sw), (ph, pw), (dh, dw), OH, OW)
        corr = _const(prog, c, "const int32_t")
    g = [CW, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, mip, N * mip]
    dst = dots if bits else prog.p(out)
    scale = _i(prog.p(alpha)) if isinstance(alpha, Value) and not bits else 0
    prm = [M, N * mip, O, halves, _i(cols), _i(prog.p(words)), _i(dst), M, cin * KH * KW,
           _i(corr) if corr else 0, scale, 0, M, mip, O * M]
    columns = (f"tsr_bin_columns_bits((const uint64_t*){prog.p(x)}" if packed_in else
               f"tsr_bin_columns({prog.p(x)}")
    prog.steps.append(
        f"{{ static const int64_t g[] = {{{', '.join(map(str, g))}}};\n"
        f"  {columns}, {cin}, g, {fill}ull, {fill_last}ull, "
        f"(uint64_t*){planes}, (uint32_t*){cols}, 0, {N});\n"
        f"  const int64_t p[] = {{{', '.join(map(str, prm))}}};\n"
        f"  bin_gemm(m, p, {N * mip}, {O}, {halves}); }}")
    if bits:
        prog.steps.append(_signs_step(prog, n, dots, out, N, O, M))


def _bblinear(prog: Program, i: int, n: Node) -> None:
    x, words, alpha, thr = n.inputs[:4]
    out = n.outputs[0]
    bits = isinstance(thr, Value)
    if x.dtype.name not in ("float32", "int64") or len(x.shape) != 2:
        raise _unsupported(n, "only float32 or bit-packed int64 2-d inputs")
    wv = np.ascontiguousarray(_value(prog, words, n, "packed weight")).view(np.uint64)
    _maybe(prog, alpha, n, "alpha")
    cin = n.attrs["in_features"]
    O, CW = wv.shape
    rows = x.shape[0]
    _binary(prog)
    op = -(-O // 16) * 16
    a = np.zeros((2 * CW, op), np.uint32)
    a[:, :O] = wv.view(np.uint32).T
    ap = _const(prog, a, "const uint32_t")
    packed, dots = _scratch(prog, rows * CW * 8, rows * O * 4 if bits else 0)
    dst = dots if bits else prog.p(out)
    scale = _i(prog.p(alpha)) if isinstance(alpha, Value) and not bits else 0
    prm = [O, op, rows, 2 * CW, _i(ap), _i(packed), _i(dst), O, cin, 0, scale, 1, O, op, 0]
    if x.dtype.name == "int64":   # the words, the last one's unused bits cleared
        keep = (1 << (cin % 64)) - 1 if cin % 64 else (1 << 64) - 1
        fill = (f"{{ const uint64_t *s = (const uint64_t*){prog.p(x)}; "
                f"uint64_t *r = (uint64_t*){packed};\n"
                f"  for (int64_t k = 0; k < {rows * CW}; k++) "
                f"r[k] = k % {CW} == {CW - 1} ? s[k] & {keep}ull : s[k]; }}")
    else:
        fill = f"tsr_bin_pack_rows({prog.p(x)}, {rows}, {cin}, (uint64_t*){packed});"
    prog.steps.append(
        f"{{ {fill}\n"
        f"  const int64_t p[] = {{{', '.join(map(str, prm))}}};\n"
        f"  bin_gemm(m, p, {op}, {rows}, {2 * CW}); }}")
    if bits:  # the dots are (rows, O): as images of one pixel
        prog.steps.append(_signs_step(prog, n, dots, out, rows, O, 1))


# ---- float ops binary networks use -----------------------------------------------------------

def _prelu(prog: Program, i: int, n: Node) -> None:
    x, w = n.inputs[:2]
    out = n.outputs[0]
    if x.dtype.name != "float32" or not isinstance(w, Value) or w.dtype.name != "float32":
        raise _unsupported(n, "only float32")
    inner = math.prod(x.shape[2:]) if len(x.shape) > 2 else 1
    ch = w.numel if w.numel > 1 else 1
    prog.steps.append(
        f"{{ const float *x = {prog.p(x)}, *w = {prog.p(w)}; float *y = {prog.p(out)};\n"
        f"  for (int64_t i = 0; i < {x.numel}; i++) {{\n"
        f"    const float a = w[i / {inner} % {ch}];\n"
        f"    y[i] = x[i] > 0.0f ? x[i] : a * x[i]; }} }}")


_FLOAT_MAX_POOL = RULES["max_pool_values"]


def _max_pool(prog: Program, i: int, n: Node) -> None:
    """Max pooling of integers (an imported QDQ model pools its uint8 values) or floats."""
    x = n.inputs[0]
    if isinstance(x, Value) and x.dtype.name in _T and len(x.shape) == 4:
        return _qmaxpool(prog, i, n)
    return _FLOAT_MAX_POOL(prog, i, n)


RULES.update({
    "max_pool_values": _max_pool,
    "prelu": _prelu,
    "quantize_per_tensor": _quantize, "dequantize": _dequantize,
    "dequantize_per_channel": _dequantize_pc, "quantized_relu": _qrelu,
    "quantized_add": _qadd, "quantized_cat": _qcat, "quantized_max_pool2d": _qmaxpool,
    "quantized_adaptive_avg_pool2d": _qavgpool, "quantized_linear": _qlinear,
    "quantized_linear_dynamic": _qlinear_dynamic, "quantized_conv2d": _qconv,
    "packed_binary_conv2d": _bconv, "packed_binary_linear": _blinear,
    "bitpacked_binary_conv2d": _bbconv, "bitpacked_binary_linear": _bblinear,
})
