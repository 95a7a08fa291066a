"""The exported folder: header, program, runtime sources, weights file, Makefile, driver,
README. Everything the folder needs to build with ``make`` and a C compiler alone."""
from __future__ import annotations

import hashlib
import pathlib
import re
import struct

import numpy as np

from tessera.deploy._emit import Program
from tessera.kernels import cc, nchwc
from tessera.kernels.csource import source

__all__ = ["write_folder", "program_files", "checksum", "RUNTIME_FILES"]

HERE = pathlib.Path(__file__).resolve().parent / "c"
# (file, where it comes from): the kernels' sources as they are, and the deploy runtime
KERNEL_FILES = ("gemm.c", "gemm.h", "prelude.h", "window.h", "depthwise.c", "maxpool.c",
                "threadpool.c", "int8.c", "binary.c", "nchwc.c", "nchwc.h")
RUNTIME_FILES = ("tsr_runtime.c", "tsr_runtime.h", "npy.h")
CFLAGS = "-std=c11 -O2 -Wall -Wextra -Werror -fPIC -fopenmp-simd"
MAGIC = b"TSRWGT1\0"


def _symbols() -> list[str]:
    """The runtime's external symbols, renamed per model so two models link together."""
    names: set[str] = set()
    for f in ("gemm.h", "nchwc.h"):
        names |= set(re.findall(r"\b(tsr_\w+)\s*\(", source(f)))
    for f in ("tsr_runtime.h",):
        names |= set(re.findall(r"\b(tsr_\w+)\s*\(", (HERE / f).read_text()))
    # attention.c's external functions (it has no header: tsr_attention.c includes it)
    names |= set(re.findall(r"^int(?:64_t)? (tsr_\w+)\(", source("attention.c"), re.M))
    names |= {"tsr_pool_start", "tsr_pool_run", "tsr_pool_call_item", "tsr_pool_gemm_item",
              "tsr_pool_range_item"}
    return sorted(names - {"tsr_item_fn"})


def _header(prog: Program) -> str:
    n, g = prog.name, prog.graph
    def shape(v):
        return f"{v.dtype.name}[{', '.join(map(str, v.shape))}]"
    ins = "\n".join(f"   input {k}: {shape(v)}"
                    + (" (int64_t values)" if v.dtype.name == "int64" else "")
                    for k, v in enumerate(g.inputs))
    def returned(v):
        model = v.producer.notes.get("returns") if v.producer is not None else None
        if model is not None:
            return f"{model}[{', '.join(map(str, v.shape))}] (as int64_t values" + \
                (", 0 or 1)" if model == "bool" else ")")
        return shape(v) + (" (int64_t values)" if v.dtype.name == "int64" else "")
    outs = "\n".join(f"   output {k}: {returned(v)}" for k, v in enumerate(g.outputs))
    return f"""/* {n}: a model exported by tessera.deploy, as a C library.

{ins}
{outs}

   Inputs and outputs are C-contiguous; float32 ones are float, int64 ones (token ids) are
   int64_t passed through the const float* const* array, and integer and bool outputs (an
   argmax's indices) int64_t written through the float* const* array. A model may run from
   one thread at a time; distinct models run concurrently. Nothing here aborts the process:
   failures return NULL or non-zero, and the *_error functions say why. */
#ifndef {n.upper()}_H
#define {n.upper()}_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {{
#endif

typedef struct {n}_model {n}_model;

/* the weights file at weights_path, loaded and checked (missing, truncated, corrupt or
   another model's: NULL, and {n}_load_error() says which); matrix weights are packed for
   this CPU's GEMM here, once. Each kernel family runs the widest instruction set the CPU
   has, within TESSERA_MAX_ISA=avx512|avx2|portable (none: portable) when it is set.
   TESSERA_GEMM_ISA=avx512|avx2|portable forces the path of the GEMM and of attention,
   TESSERA_INT8_ISA=amx|vnni512|avxvnni|avx2|c and TESSERA_BINARY_ISA=vpopcnt|avx2|c those of
   the INT8 and binary layers (at the first run, or the binary path at load where its AVX2
   plane lists are made); a path the CPU lacks, one above the cap or an unknown name is an
   error, never an illegal instruction. */
{n}_model *{n}_load(const char *weights_path);
/* the instruction set each kernel family of m runs, e.g. "gemm=avx2 int8=avx2
   regions=avx2" (after a run for the INT8 and binary layers) */
const char *{n}_paths(const {n}_model *m);
/* why the last call on m failed ("" if none); m may be NULL after a failed load */
const char *{n}_last_error(const {n}_model *m);
/* why the last {n}_load returned NULL (per thread) */
const char *{n}_load_error(void);
int {n}_num_inputs(void);
int {n}_num_outputs(void);
/* writes up to 8 dims of input (output) i into dims, returns the rank (-1: no such i) */
int {n}_input_shape(int i, int64_t *dims);
int {n}_output_shape(int i, int64_t *dims);
/* the element type of input i: 0 float32 (float), 1 int64 (int64_t), -1 no such input; for
   bindings that pass typed buffers (a C program reads the list above) */
int {n}_input_dtype(int i);
/* the element type of output i, numbered as the inputs' (integer and bool outputs: 1) */
int {n}_output_dtype(int i);
/* threads for the next runs (>= 1; default 1); 0, or -1 with a message */
int {n}_set_num_threads({n}_model *m, int n);
/* outputs = the model(inputs): 0, or non-zero with a message ({n}_last_error) */
int {n}_run({n}_model *m, const float *const *inputs, float *const *outputs);
void {n}_free({n}_model *m);

#ifdef __cplusplus
}}
#endif
#endif
"""


def _source(prog: Program, fingerprint: int, table: list[str] | None = None) -> str:
    """The program's C. With ``table`` (``tessera.deploy._emit.weight_table``'s names) it
    reads each weight where the caller keeps it (``<name>_bind``, in process) instead of
    loading a weights file."""
    n, g = prog.name, prog.graph
    shapes = []
    for kind, vals in (("in", g.inputs), ("out", g.outputs)):
        rows = ", ".join("{" + ", ".join(map(str, v.shape or (1,))) + "}" for v in vals) or "{0}"
        ranks = ", ".join(str(len(v.shape)) for v in vals) or "0"
        shapes.append(f"static const int64_t {kind}_dims[][8] = {{{rows}}};\n"
                      f"static const int {kind}_rank[] = {{{ranks}}};")
    for kind, vals in (("in", g.inputs), ("out", g.outputs)):
        codes = ", ".join("1" if v.dtype.name == "int64" else "0" for v in vals) or "0"
        shapes.append(f"static const int {kind}_dtype[] = {{{codes}}};")
    width = 3 if table is None else 4   # in a table: (byte offset, k, n, weight)
    packs = ", ".join("{" + ", ".join(map(str, row)) + "}" for row in prog.packed) or \
        "{" + ", ".join(["0"] * width) + "}"
    # where a packed matrix's rows are
    src = "m->w + PACKED[j][0]" if table is None else "m->wt[PACKED[j][3]] + PACKED[j][0]"
    wt = "" if table is None else \
        f"\n    unsigned char *wt[{len(table)} + 1];  /* the weights, the caller's buffers */"
    steps = "\n".join("    " + line.replace("\n", "\n    ") for line in prog.steps)
    protos = "\n".join(prog.prototypes)
    kernels = "\n\n".join(prog.kernels)
    return f"""/* {n}: the program of an exported model (generated by tessera.deploy; see {n}.h) */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "{n}.h"
#include "gemm.h"
#include "prelude.h"
#include "tsr_runtime.h"
#include "window.h"

{"IM2COL_BLOCK(float, im2col_f32)" if prog.scratch_bytes else ""}

enum {{ NUM_INPUTS = {len(g.inputs)}, NUM_OUTPUTS = {len(g.outputs)},
       NUM_PACKED = {len(prog.packed)} }};
static const uint64_t FINGERPRINT = 0x{fingerprint:016x}ull;
static const uint64_t PAYLOAD_BYTES = {prog.payload_bytes}ull;
static const size_t ARENA_BYTES = {prog.arena_bytes}, SCRATCH_BYTES = {prog.scratch_bytes},
    WORK_BYTES = {prog.work_bytes};
{shapes[0]}
{shapes[1]}
{shapes[2]}
{shapes[3]}
/* weights packed at load: (byte offset in the payload, k, n{", weight" if table else ""}) */
static const int64_t PACKED[][{width}] = {{{packs}}};

struct {n}_model {{
    unsigned char *w, *arena, *work, *built, *planes;{wt}
    float *scratch, *packs;
    float *packed[NUM_PACKED + 1];
    int threads, isa;
    char err[512];
}};

static _Thread_local char load_err[512];
static int prepare({n}_model *m);

static int fail({n}_model *m, const char *msg) {{
    snprintf(m->err, sizeof m->err, "{n}: %s", msg);
    return 1;
}}

static int64_t gemm_item(const int64_t *c, int64_t i) {{
    if (tsr_gemm_range((const tsr_gemm_t *)(intptr_t)c[0], i, i + 1) != 0)
        __atomic_store_n((int64_t *)(intptr_t)c[1], 1, __ATOMIC_RELAXED);
    return 0;
}}

/* TESSERA_MAX_ISA (case and spaces aside): the widest instruction set any kernel may use,
   0 portable ("portable", "none"), 1 AVX2 ("avx2"), 2 AVX-512 ("avx512", "native", or
   unset: no cap); -1 another name. Read once (atomic: the kernel threads ask at once). */
static int max_isa(void) {{
    static int known = -2;
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k != -2) return k;
    const char *s = getenv("TESSERA_MAX_ISA");
    char v[16] = "";
    size_t j = 0;
    for (; s && *s && j + 1 < sizeof v; s++)
        if (*s != ' ') v[j++] = (char)(*s >= 'A' && *s <= 'Z' ? *s + 32 : *s);
    v[j] = 0;
    k = s && *s ? -1   /* longer than any name */
        : !*v || !strcmp(v, "avx512") || !strcmp(v, "native") ? 2
        : !strcmp(v, "avx2") ? 1 : !strcmp(v, "portable") || !strcmp(v, "none") ? 0 : -1;
    __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    return k;
}}

static const char *const ISA_NAMES[] = {{"portable", "avx2", "avx512"}};

/* whether the AVX2 builds of the window kernels and regions run here (x86-64 with AVX2 and
   FMA, and TESSERA_MAX_ISA allowing AVX2) */
static inline int has_avx2(void) {{
#if defined(__x86_64__) && defined(__GNUC__)
    static int known = -1;  /* atomic: the kernel threads ask at once */
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k < 0) {{
        __builtin_cpu_init();
        k = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && max_isa() >= 1;
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }}
    return k;
#else
    return 0;
#endif
}}

static inline int run_gemm({n}_model *m, tsr_gemm_t *g) {{
    int64_t blocks = tsr_gemm_plan(g, m->threads), bad = 0;
    if (blocks < 0) return 1;
    int64_t c[] = {{(int64_t)(intptr_t)g, (int64_t)(intptr_t)&bad}};
    tsr_pool_run(gemm_item, c, blocks, m->threads);
    return (int)bad;
}}

{protos}

{kernels}

static int steps({n}_model *m, const float *const *in, float *const *out) {{
    (void)m; (void)in; (void)out;  /* a program may not need each */
{steps}
    return 0;
}}

/* the GEMM's (and attention's) path: TESSERA_GEMM_ISA's, else the widest this CPU runs
   within TESSERA_MAX_ISA; -1 with why in err */
static int pick_isa(char *err, size_t len) {{
    const char *forced = getenv("TESSERA_GEMM_ISA");
    const int cap = max_isa();
    if (cap < 0) {{
        snprintf(err, len, "{n}: TESSERA_MAX_ISA=%s: expected portable, avx2, avx512 or none",
                 getenv("TESSERA_MAX_ISA"));
        return -1;
    }}
    if (!forced || !*forced) {{
        int i = tsr_gemm_isa_best() < cap ? tsr_gemm_isa_best() : cap;
        while (i > 0 && !tsr_gemm_isa_supported(i)) i--;
        return i;
    }}
    for (int i = 0; i < 3; i++)
        if (strcmp(forced, ISA_NAMES[i]) == 0) {{
            if (!tsr_gemm_isa_supported(i))
                snprintf(err, len, "{n}: TESSERA_GEMM_ISA=%s: this CPU lacks it", forced);
            else if (i > cap)
                snprintf(err, len, "{n}: TESSERA_GEMM_ISA=%s: TESSERA_MAX_ISA=%s excludes it",
                         forced, ISA_NAMES[cap]);
            else
                return i;
            return -1;
        }}
    snprintf(err, len, "{n}: TESSERA_GEMM_ISA=%s: expected portable, avx2 or avx512", forced);
    return -1;
}}

const char *{n}_paths(const {n}_model *m) {{
    static _Thread_local char text[96];
    if (!m) return "";
    int at = snprintf(text, sizeof text, "gemm=%s", ISA_NAMES[m->isa]);
#ifdef TSR_USES_INT8
    if (i8_isa() >= 0)
        at += snprintf(text + at, sizeof text - (size_t)at, " int8=%s", I8_NAMES[i8_isa()]);
#endif
#ifdef TSR_USES_BINARY
    if (bin_isa() >= 0)
        at += snprintf(text + at, sizeof text - (size_t)at, " binary=%s", BIN_NAMES[bin_isa()]);
#endif
    snprintf(text + at, sizeof text - (size_t)at, " regions=%s", has_avx2() ? "avx2" : "portable");
    return text;
}}

{_load(n) if table is None else _bind(n, len(table))}
/* the arena, the scratch and the packed matrices (0, or 1 out of memory) */
static int prepare({n}_model *m) {{
    m->arena = tsr_aligned_alloc(ARENA_BYTES);
    m->scratch = tsr_aligned_alloc(SCRATCH_BYTES);
    m->work = tsr_aligned_alloc(WORK_BYTES);
    int ok = m->arena && m->scratch && m->work;
    /* every packed matrix in one buffer (16-float aligned each) */
    size_t floats = 0;
    for (int j = 0; j < NUM_PACKED; j++)
        floats += ((size_t)tsr_gemm_packed_size(m->isa, PACKED[j][1], PACKED[j][2]) + 15) / 16
            * 16;
    m->packs = tsr_aligned_alloc(floats * sizeof(float));
    ok = ok && m->packs;
    size_t at = 0;
    for (int j = 0; ok && j < NUM_PACKED; j++) {{
        int64_t k = PACKED[j][1], nn = PACKED[j][2];
        m->packed[j] = m->packs + at;
        at += ((size_t)tsr_gemm_packed_size(m->isa, k, nn) + 15) / 16 * 16;
        ok = tsr_gemm_pack_b(m->isa, k, nn, (const float *)({src}), nn, 1, m->packed[j]) == 0;
    }}{_made_at_load(prog)}
    return !ok;
}}

const char *{n}_last_error(const {n}_model *m) {{ return m ? m->err : load_err; }}
const char *{n}_load_error(void) {{ return load_err; }}
int {n}_num_inputs(void) {{ return NUM_INPUTS; }}
int {n}_num_outputs(void) {{ return NUM_OUTPUTS; }}

static int shape_of(const int64_t (*dims)[8], const int *rank, int count, int i, int64_t *out) {{
    if (i < 0 || i >= count) return -1;
    if (out)
        for (int d = 0; d < rank[i] && d < 8; d++) out[d] = dims[i][d];
    return rank[i];
}}

int {n}_input_shape(int i, int64_t *dims) {{
    return shape_of(in_dims, in_rank, NUM_INPUTS, i, dims);
}}
int {n}_output_shape(int i, int64_t *dims) {{
    return shape_of(out_dims, out_rank, NUM_OUTPUTS, i, dims);
}}
int {n}_input_dtype(int i) {{
    return i < 0 || i >= NUM_INPUTS ? -1 : in_dtype[i];
}}
int {n}_output_dtype(int i) {{
    return i < 0 || i >= NUM_OUTPUTS ? -1 : out_dtype[i];
}}

int {n}_set_num_threads({n}_model *m, int n) {{
    if (!m) return -1;
    if (n < 1) {{ fail(m, "set_num_threads: the count must be at least 1"); return -1; }}
    m->threads = tsr_pool_start(n) + 1;
    return 0;
}}

int {n}_run({n}_model *m, const float *const *inputs, float *const *outputs) {{
    if (!m) {{ snprintf(load_err, sizeof load_err, "{n}: run: the model is NULL"); return -1; }}
    m->err[0] = 0;
    if (!inputs || !outputs) return fail(m, "run: inputs or outputs is NULL");
    for (int i = 0; i < NUM_INPUTS; i++)
        if (!inputs[i]) return fail(m, "run: an input pointer is NULL");
    for (int i = 0; i < NUM_OUTPUTS; i++)
        if (!outputs[i]) return fail(m, "run: an output pointer is NULL");
    return steps(m, inputs, outputs);
}}

void {n}_free({n}_model *m) {{
    if (!m) return;
    tsr_aligned_free(m->packs);
    tsr_aligned_free(m->built);
    tsr_aligned_free(m->planes);
    tsr_aligned_free(m->scratch);
    tsr_aligned_free(m->work);
    tsr_aligned_free(m->arena);
    tsr_aligned_free(m->w);
    free(m);
}}
"""


def _made_at_load(prog: Program) -> str:
    """The part of ``prepare`` that makes what a library does not store (``Program.wino``,
    ``Program.planes``): the Winograd layers' filters, and where the AVX2 binary kernel runs,
    its bit planes' lists. Tables and loops, so that the code does not grow with the layers."""
    text = ""
    if prog.wino:
        rows = ", ".join("{" + ", ".join(map(str, r)) + "}" for r in prog.wino.values())
        text += f"""
    /* the Winograd layers' filters U = G g G^T from their plain weights: (byte offset of g
       in the payload, of U in built, o, c, block) */
    static const int64_t WINO[][5] = {{{rows}}};
    m->built = tsr_aligned_alloc({prog.built_bytes});
    ok = ok && m->built;
    for (size_t j = 0; ok && j < sizeof WINO / sizeof WINO[0]; j++) {{
        tsr_nchwc_conv_t p;
        memset(&p, 0, sizeof p);
        p.o = WINO[j][2], p.c = WINO[j][3], p.kh = p.kw = 3, p.groups = 1;
        p.block = (int32_t)WINO[j][4], p.flags = TSR_NCHWC_WINOGRAD;
        tsr_nchwc_pack_weights(&p, (const float *)(m->w + WINO[j][0]),
                               (float *)(m->built + WINO[j][1]));
    }}"""
    if prog.planes:
        rows = ", ".join("{" + ", ".join(map(str, r)) + "}" for r in prog.planes)
        text += f"""
    /* the AVX2 binary kernel's bit planes' lists, where it runs: (byte offset of the blocked
       weights in the payload, o, cin, cw, taps, byte offsets of the lists in planes) */
    static const int64_t PLANES[][7] = {{{rows}}};
    if (ok && bin_isa() == 1) {{
        m->planes = tsr_aligned_alloc({prog.planes_bytes});
        ok = m->planes != NULL;
        for (size_t j = 0; ok && j < sizeof PLANES / sizeof PLANES[0]; j++) {{
            const int64_t *r = PLANES[j];
            tsr_bin_planes_lists((const uint64_t *)(m->w + r[0]), r[1], r[2], r[3], r[4],
                                 (int64_t *)(m->planes + r[5]), (int32_t *)(m->planes + r[6]));
        }}
    }}"""
    return text


def _load(n: str) -> str:
    """``<n>_load``: the weights file read, then the model prepared."""
    return f"""{n}_model *{n}_load(const char *weights_path) {{
    char why[400];
{_new_model(n)}
    m->w = tsr_read_weights(weights_path, FINGERPRINT, PAYLOAD_BYTES, why, sizeof why);
    if (!m->w) {{
        snprintf(load_err, sizeof load_err, "{n}: %s", why);
        {n}_free(m);
        return NULL;
    }}
{_prepared(n)}
}}
"""


def _bind(n: str, count: int) -> str:
    """``<n>_bind``: the model on weights the caller keeps (``wt``: ``count`` pointers, each
    64-byte aligned, read while the model lives), its matrices packed now."""
    return f"""{n}_model *{n}_bind(unsigned char *const *wt) {{
{_new_model(n)}
    for (int k = 0; k < {count}; k++) m->wt[k] = wt[k];
{_prepared(n)}
}}
"""


def _new_model(n: str) -> str:
    """The start of ``_load`` and ``_bind``: the instruction set picked, ``m`` allocated."""
    return f"""    load_err[0] = 0;
    int isa = pick_isa(load_err, sizeof load_err);
    if (isa < 0) return NULL;
    {n}_model *m = calloc(1, sizeof *m);
    if (!m) {{ snprintf(load_err, sizeof load_err, "{n}: out of memory"); return NULL; }}
    m->threads = 1;
    m->isa = isa;"""


def _prepared(n: str) -> str:
    """The end of ``_load`` and ``_bind``: ``m`` prepared (its matrices packed) and returned."""
    return f"""    if (prepare(m)) {{
        snprintf(load_err, sizeof load_err, "{n}: out of memory preparing the model");
        {n}_free(m);
        return NULL;
    }}
    return m;"""


def _makefile(prog: Program, units: list[str]) -> str:
    n = prog.name
    extra = ["tsr_attention.c"] if prog.attention else []
    srcs = " ".join([f"{n}.c", "gemm.c", "tsr_runtime.c", "tsr_pool.c", *extra, *units])
    return f"""# builds lib{n}.so, lib{n}.a and the driver run_{n} (a C compiler only)
CC ?= cc
CFLAGS ?= {CFLAGS}
SRCS = {srcs}
OBJS = $(SRCS:.c=.o)

all: lib{n}.so lib{n}.a run_{n}

%.o: %.c *.h
\t$(CC) $(CFLAGS) -include {n}_rename.h -c $< -o $@

lib{n}.so: $(OBJS)
\t$(CC) $(CFLAGS) -shared -o $@ $(OBJS) -lpthread -lm

lib{n}.a: $(OBJS)
\tar rcs $@ $(OBJS)

run_{n}: run_{n}.c lib{n}.a
\t$(CC) $(CFLAGS) -o $@ run_{n}.c lib{n}.a -lpthread -lm

clean:
\trm -f $(OBJS) lib{n}.so lib{n}.a run_{n}

.PHONY: all clean
"""


def _readme(prog: Program) -> str:
    n = prog.name
    return f"""# {n}

A model exported by `tessera.deploy`: a C library with no dependencies beyond libc,
libm and pthreads.

    make                      # lib{n}.so, lib{n}.a, run_{n}
    ./run_{n} {n}.weights in.npy out.npy --threads 2 --repeat 100

The API is in `{n}.h`: `{n}_load` the weights file, `{n}_run` on C-contiguous
buffers of the shapes the header lists, `{n}_free`. Every failure returns NULL or
non-zero and `{n}_load_error()` / `{n}_last_error(m)` say why. `run_{n}.c` is a
complete example.

Each kernel family picks the widest instruction set the CPU has. `TESSERA_MAX_ISA=avx2`
(or `portable`, also `none`) caps them all at load: the GEMM, attention, the INT8 and
binary layers and the fused regions. `TESSERA_GEMM_ISA=portable|avx2|avx512` forces the
path of the GEMM and of attention, `TESSERA_INT8_ISA=vnni512|avxvnni|avx2|c` and
`TESSERA_BINARY_ISA=vpopcnt|avx2|c` those of the INT8 and binary layers; naming a path
the CPU lacks, or one above the cap, is an error (`{n}_load_error()` or
`{n}_last_error(m)`). `{n}_paths(m)` says which paths run.
"""


def checksum(data: bytes) -> int:
    """tsr_checksum of tsr_runtime.c: sum over 8-byte words w_i of (w_i ^ i K) (2i + 1)
    modulo 2^64, plus the length (a flipped bit changes it: the factors are odd).

    >>> checksum(bytes(8)) == 8
    True
    """
    pad = data + bytes(-len(data) % 8)
    w = np.frombuffer(pad, "<u8")
    i = np.arange(len(w), dtype=np.uint64)
    with np.errstate(over="ignore"):
        s = np.sum((w ^ (i * np.uint64(0x9E3779B97F4A7C15))) * (2 * i + np.uint64(1)),
                   dtype=np.uint64)
    return (int(s) + len(data)) % 2 ** 64


def _weights_file(prog: Program, values: dict, fingerprint: int) -> bytes:
    payload = bytearray(prog.payload_bytes)
    for name, (off, arr) in prog.weights.items():
        a = arr if arr is not None else \
            np.ascontiguousarray(values[name], dtype=prog.graph.variables[name].dtype.np)
        payload[off:off + a.nbytes] = a.tobytes()
    header = MAGIC + struct.pack("<QQQ", fingerprint, len(payload),
                                 checksum(bytes(payload))) + bytes(32)
    return header + bytes(payload)


def _sources(prog: Program, files: dict) -> dict:
    """``files`` with the program's units and the kernel and runtime sources they need."""
    files.update(prog.units)
    if "TSR_NCHWC_TILES" in prog.units.get("tsr_nchwc.c", ""):
        files["nchwc_tiles.h"] = nchwc.tiles_header(prog.nchwc_tiles, prog.nchwc_blocks)
    for f in KERNEL_FILES:
        files[f] = source(f)
    if prog.attention:
        files["attention.c"] = source("attention.c")
        files["tsr_attention.c"] = (HERE / "tsr_attention.c").read_text()
    for f in RUNTIME_FILES:
        files[f] = (HERE / f).read_text()
    return files


def _rename(n: str) -> str:
    return "/* the runtime's symbols, prefixed for this model */\n" + \
        "".join(f"#define {s} {n}_{s}\n" for s in _symbols())


def write_folder(prog: Program, values: dict, out_dir: str) -> dict:
    """Write the folder; returns {what: path}."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = prog.name
    body = _source(prog, 0)
    fingerprint = int.from_bytes(hashlib.sha256(body.encode()).digest()[:8], "little")
    files = _sources(prog, {
        f"{n}.h": _header(prog), f"{n}.c": _source(prog, fingerprint),
        f"{n}_rename.h": _rename(n),
        "tsr_pool.c": "/* the kernel threads (threadpool.c) for a C11 build */\n"
                      "#define _GNU_SOURCE\n#define TSR_BLASINT int\n"
                      "#include \"threadpool.c\"\n",
        "Makefile": _makefile(prog, sorted(prog.units)), "README.md": _readme(prog),
        f"run_{n}.c": (HERE / "run_model.c").read_text().replace("MODEL", n)})
    for f, text in files.items():
        (out / f).write_text(text)
    (out / f"{n}.weights").write_bytes(_weights_file(prog, values, fingerprint))
    return {"folder": str(out), "weights": str(out / f"{n}.weights")}


def program_files(prog: Program, table: list[str]) -> tuple[dict, list[str], tuple]:
    """(files, translation units, compiler flags) of the program as a library a process
    loads for itself (``tessera.kernels.cc.load_files``): its weights the caller's buffers
    (``table``, ``<name>_bind``), its work items run on the process's kernel threads
    (``<name>_set_pool`` hands it ``tessera.kernels.threadpool.c_pool``'s function)."""
    n = prog.name
    files = _sources(prog, {
        f"{n}.h": _header(prog), f"{n}.c": _source(prog, 0, table),
        f"{n}_rename.h": _rename(n), "tsr_pool.c": _POOL.replace("MODEL", n)})
    extra = ["tsr_attention.c"] if prog.attention else []
    units = [f"{n}.c", "gemm.c", "tsr_runtime.c", "tsr_pool.c", *extra, *sorted(prog.units)]
    # built as the exported library is (baseline x86-64; each kernel family's paths under
    # their own target attributes): -march=native's -mtune makes GCC schedule the blocked
    # convolutions' register tiles 2% slower (ResNet-18 batch 1, one thread, on Zen;
    # bench models' "resnet18 infer b1")
    return files, units, ("-include", f"{n}_rename.h", *cc.baseline_flags())


# the kernel threads of a program run in process: the process's pool, whose run function
# it is handed (one pool for the graph's kernels and its programs, following
# tessera.set_num_threads; a pool of its own would spin beside it)
_POOL = """/* the kernel threads: the process's (tessera/kernels/threadpool.c), handed over */
#include <stdint.h>
#include "tsr_runtime.h"

typedef void (*run_fn)(tsr_item_fn, const int64_t*, int64_t, int);
static run_fn pool;

void MODEL_set_pool(intptr_t run) { pool = (run_fn)run; }

int tsr_pool_start(int threads) { return threads > 1 ? threads - 1 : 0; }

void tsr_pool_run(tsr_item_fn item, const int64_t* ctx, int64_t n, int threads) {
    if (threads < 2 || !pool) {
        for (int64_t i = 0; i < n; i++) item(ctx, i);
        return;
    }
    pool(item, ctx, n, threads);
}
"""
