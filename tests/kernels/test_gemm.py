"""tessera.kernels.gemm against NumPy in float64 (activations against PyTorch's): odd
shapes in every dimension (1 to 1000, GEMV-like M=1, K=1, K=0), transposes, strided and
negative-stride views, alpha and beta, each epilogue, a pre-packed B, each micro-kernel
forced by TESSERA_GEMM_ISA in a child process, and one thread against two."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tessera.kernels import cc

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")

U = 2.0 ** -24   # float32's unit roundoff


@pytest.fixture(scope="module")
def G():
    from tessera.kernels import gemm
    if not gemm.available():
        pytest.skip("code generation is off (TESSERA_CODEGEN=0)")
    return gemm


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def check(actual, expected, scale, k):
    """Within float32 summation error of ``k`` terms: (k + 8) u times ``scale`` (the sum
    of the absolute values of the terms) per element, a few ulp for the epilogue."""
    assert actual.dtype == np.float32 and actual.shape == expected.shape
    tol = (k + 8) * U * scale + 8 * U * np.abs(expected) + 1e-30
    err = np.abs(actual.astype(np.float64) - expected)
    assert np.all(err <= tol), (f"max error {err.max():.3g}, "
                                f"at {np.unravel_index(np.argmax(err - tol), err.shape)}")


def reference(a, b, trans_a=False, trans_b=False):
    a64 = a.astype(np.float64).T if trans_a else a.astype(np.float64)
    b64 = b.astype(np.float64).T if trans_b else b.astype(np.float64)
    return a64 @ b64, np.abs(a64) @ np.abs(b64)


SMALL = (1, 7, 17, 63)


@pytest.mark.parametrize("m,n,k", list(itertools.product(SMALL, SMALL, SMALL)))
def test_small_shapes(G, m, n, k):
    a, b = rand(m, k, seed=1), rand(k, n, seed=2)
    ref, scale = reference(a, b)
    check(G.gemm(a, b), ref, scale, k)


@pytest.mark.parametrize("m,n,k", [(1000, 17, 63), (17, 1000, 63), (63, 17, 1000),
                                   (1000, 1000, 7), (1, 1000, 1000), (1000, 1, 1000),
                                   (1000, 63, 1), (7, 1000, 1000), (1000, 1000, 1000)])
def test_large_shapes(G, m, n, k):
    a, b = rand(m, k, seed=3), rand(k, n, seed=4)
    ref, scale = reference(a, b)
    check(G.gemm(a, b), ref, scale, k)


def test_k_zero_is_beta_times_out_plus_epilogue(G):
    out = rand(5, 9)
    bias = rand(9, seed=1)
    got = G.gemm(np.empty((5, 0), np.float32), np.empty((0, 9), np.float32), beta=0.5,
                 bias=bias, out=out.copy())
    check(got, 0.5 * out.astype(np.float64) + bias, np.abs(out) + np.abs(bias), 1)


@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product((False, True), repeat=2)))
@pytest.mark.parametrize("m,n,k", [(1, 63, 17), (63, 7, 1000), (130, 70, 300)])
def test_transposes(G, m, n, k, trans_a, trans_b):
    a = rand(*((k, m) if trans_a else (m, k)), seed=5)
    b = rand(*((n, k) if trans_b else (k, n)), seed=6)
    ref, scale = reference(a, b, trans_a, trans_b)
    check(G.gemm(a, b, trans_a=trans_a, trans_b=trans_b), ref, scale, k)


def test_linear_layer_layout(G):
    """x @ W^T with W (out, in) read in place, as a linear layer needs."""
    x, w = rand(33, 200, seed=7), rand(90, 200, seed=8)
    ref, scale = reference(x, w, trans_b=True)
    check(G.gemm(x, w, trans_b=True), ref, scale, 200)


def _views():
    big_a, big_b = rand(300, 400, seed=9), rand(400, 300, seed=10)
    yield "row slices", big_a[10:110:2, 5:205], big_b[3:203, 7:90]
    yield "column steps", big_a[:50, ::2], big_b[::2, ::3]
    yield "transposed views", big_b[:200, :50].T, big_a[:90, :200].T
    yield "negative strides", big_a[::-3, ::-2][:60, :150], big_b[::-2, 5:40][:150]
    wide = rand(90, 2048, seed=11)      # rows 8 KB apart: A is packed, not read in place
    yield "rows 4 KB apart", wide[:, :300], big_b[:300, :200]
    yield "broadcast row", np.broadcast_to(big_a[0, :100], (20, 100)), big_b[:100, :30]


@pytest.mark.parametrize("label,a,b", list(_views()), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_strided_views_read_in_place(G, label, a, b):
    ref, scale = reference(a, b)
    a_before, b_before = a.copy(), b.copy()
    check(G.gemm(a, b), ref, scale, a.shape[1])
    assert np.array_equal(a, a_before) and np.array_equal(b, b_before)


@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, -2.0), (-1.5, 0.0), (0.0, 1.0),
                                        (2.0, 0.25)])
def test_alpha_beta_into_strided_out(G, alpha, beta):
    a, b = rand(45, 70, seed=11), rand(70, 38, seed=12)
    base = rand(60, 50, seed=13)
    out = base[5:50, 3:41]               # rows 50 apart: C's leading dimension
    old = out.astype(np.float64)
    ref, scale = reference(a, b)
    got = G.gemm(a, b, alpha=alpha, beta=beta, out=out)
    assert got is out
    check(out, alpha * ref + beta * old, abs(alpha) * scale + abs(beta) * np.abs(old), 70)
    fresh = rand(60, 50, seed=13)          # outside the view: untouched
    assert np.array_equal(base[:5], fresh[:5]) and np.array_equal(base[50:], fresh[50:])
    assert np.array_equal(base[5:50, :3], fresh[5:50, :3])
    assert np.array_equal(base[5:50, 41:], fresh[5:50, 41:])


def test_beta_zero_does_not_read_out(G):
    a, b = rand(20, 30), rand(30, 40, seed=1)
    out = np.full((20, 40), np.nan, np.float32)
    ref, scale = reference(a, b)
    check(G.gemm(a, b, out=out), ref, scale, 30)


def test_out_with_column_stride(G):
    a, b = rand(12, 30), rand(30, 16, seed=1)
    big = rand(12, 32, seed=2)
    out = big[:, ::2]
    expected = reference(a, b)[0] + 0.5 * out.astype(np.float64)
    got = G.gemm(a, b, beta=0.5, out=out)
    assert got is out
    check(out, expected, reference(a, b)[1] + np.abs(expected), 30)
    assert np.array_equal(big[:, 1::2], rand(12, 32, seed=2)[:, 1::2])


def _act(x, name):
    t = torch.from_numpy(x)
    if name == "relu":
        return torch.relu(t).numpy()
    if name == "gelu":
        return torch.nn.functional.gelu(t).numpy()
    if name == "gelu_tanh":
        return torch.nn.functional.gelu(t, approximate="tanh").numpy()
    return x


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("with_bias,with_residual,residual_first",
                         [(False, False, False), (True, False, False), (True, True, False),
                          (True, True, True), (False, True, True)])
@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_epilogue(G, activation, with_bias, with_residual, residual_first, packed):
    m, n, k = 37, 75, 130
    x, w = rand(m, k, seed=14), rand(n, k, seed=15) * 0.2
    bias = rand(n, seed=16) if with_bias else None
    res = rand(m, n, seed=17) if with_residual else None
    pre, scale = reference(x, w, trans_b=True)
    if bias is not None:
        pre = pre + bias
    if res is not None and residual_first:
        pre = pre + res
    expected = _act(pre, activation)
    if res is not None and not residual_first:
        expected = expected + res
    kw = dict(bias=bias, activation=activation, residual=res, residual_first=residual_first)
    got = (G.gemm_packed(x, G.pack_b(w, trans_b=True), **kw) if packed
           else G.gemm(x, w, trans_b=True, **kw))
    # an activation's slope is at most 1.13 (gelu), so the product's error passes through
    check(got, expected, 1.13 * scale + (0 if res is None else np.abs(res)), k)


def test_relu_passes_nan(G):
    a = np.array([[np.nan, 1.0]], np.float32)
    got = G.gemm(a, np.ones((2, 3), np.float32), activation="relu")
    assert np.isnan(got).all()


def test_residual_broadcast_and_strided(G):
    a, b = rand(16, 20), rand(20, 24, seed=1)
    row = rand(24, seed=2)
    ref, scale = reference(a, b)
    check(G.gemm(a, b, residual=row), ref + row, scale + np.abs(row), 20)
    big = rand(16, 48, seed=3)
    check(G.gemm(a, b, residual=big[:, ::2]), ref + big[:, ::2], scale + np.abs(big[:, ::2]),
          20)


@pytest.mark.parametrize("m,n,k,trans_b", [(1, 1000, 63, True), (1000, 17, 7, False),
                                           (63, 63, 1000, True), (64, 1024, 784, False),
                                           (5, 3, 1, True), (1, 300, 5000, True),
                                           (3, 2000, 3000, False), (16, 40, 2500, True)])
def test_packed_equals_unpacked(G, m, n, k, trans_b):
    x = rand(m, k, seed=18)
    w = rand(*((n, k) if trans_b else (k, n)), seed=19)
    packed = G.pack_b(w, trans_b=trans_b)
    assert packed.shape == (k, n)
    got = G.gemm_packed(x, packed)
    ref, scale = reference(x, w, trans_b=trans_b)
    check(got, ref, scale, k)
    # the same sums in the same order: bit for bit
    assert np.array_equal(got, G.gemm(x, w, trans_b=trans_b))
    assert np.array_equal(G.gemm_packed(x, packed), got)    # the packing is reusable


# (196, 256, 600) and (201, 1024, 100): few blocks, which two threads share in even sizes
@pytest.mark.parametrize("m,n,k", [(1000, 1000, 300), (49, 512, 2000), (3136, 64, 576),
                                   (7, 17, 63), (1, 1000, 3000), (2, 64, 2100),
                                   (196, 256, 600), (201, 1024, 100)])
def test_threads_give_the_same_result(G, m, n, k):
    x, w = rand(m, k, seed=20), rand(k, n, seed=21)
    one = G.gemm(x, w, threads=1, bias=rand(n, seed=22), activation="gelu")
    two = G.gemm(x, w, threads=2, bias=rand(n, seed=22), activation="gelu")
    assert np.array_equal(one, two)
    packed = G.pack_b(w, threads=2)
    assert np.array_equal(G.gemm_packed(x, packed, threads=2, bias=rand(n, seed=22),
                                        activation="gelu"), one)
    ref, scale = reference(x, w)
    check(G.gemm(x, w, threads=2), ref, scale, k)


@pytest.mark.parametrize("m,n,k", [(1, 1000, 512), (1, 7, 3), (2, 300, 70), (4, 33, 1000),
                                   (5, 64, 17), (200, 96, 130)])
@pytest.mark.parametrize("threads", [1, 2])
def test_plain_products_in_one_call_equal_the_general_path(G, monkeypatch, m, n, k, threads):
    """gemm and gemm_packed with no options run in one C call (c/gemm_py.c, the arrays read
    from their headers): the bits of the general path, for contiguous, transposed, strided
    and negative-stride operands."""
    if sys.implementation.name == "cpython":
        assert G._fast()[0] is not None   # NumPy's headers read as gemm_py.c expects
    x, w = rand(m, 2 * k, seed=30)[:, ::2], rand(n, k, seed=31)
    packed = G.pack_b(w, trans_b=True)
    cases = {
        "packed": lambda: G.gemm_packed(x, packed, threads=threads),
        "packed, a transposed": lambda: G.gemm_packed(np.ascontiguousarray(x.T), packed,
                                                      trans_a=True, threads=threads),
        "transposed": lambda: G.gemm(x, w, trans_b=True, threads=threads),
        "row-major": lambda: G.gemm(x, np.ascontiguousarray(w.T), threads=threads),
        "a transposed": lambda: G.gemm(np.ascontiguousarray(x.T), w, trans_a=True,
                                       trans_b=True, threads=threads),
        "negative strides": lambda: G.gemm(x[::-1], w[::-1], trans_b=True,
                                           threads=threads)[::-1, ::-1],
    }
    fast = {name: run() for name, run in cases.items()}
    ref, scale = reference(x, w, trans_b=True)
    check(fast["packed"], ref, scale, k)
    monkeypatch.setattr(G, "_FAST", [None])   # the general path only
    for name, run in cases.items():
        assert np.array_equal(fast[name], run()), name


def test_plain_products_it_does_not_take_go_the_general_way(G):
    """Operands the one-call path declines (strides not whole floats, another dtype, a
    shape that does not fit) give the general path's result or its error."""
    x, w = rand(3, 20, seed=32), rand(20, 6, seed=33)
    rec = np.zeros((3, 20), dtype=[("v", "<f4"), ("pad", "u1")])   # strides of 5 bytes
    rec["v"] = x
    ref, scale = reference(x, w)
    check(G.gemm(rec["v"], w), ref, scale, 20)
    check(G.gemm_packed(rec["v"], G.pack_b(w)), ref, scale, 20)
    with pytest.raises(TypeError, match="gemm_packed: a must be float32, got float64"):
        G.gemm_packed(x.astype(np.float64), G.pack_b(w))
    with pytest.raises(ValueError, match=r"gemm_packed: a must be 2-d, got shape \(20,\)"):
        G.gemm_packed(x[0], G.pack_b(w))
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied "
                                           r"\(3x20 and 19x6\)"):
        G.gemm_packed(x, G.pack_b(w[:19]))
    with pytest.raises(RuntimeError, match=r"\(3x20 and 6x20\)"):
        G.gemm(x, w, trans_b=True)
    with pytest.raises(TypeError, match="gemm: a must be a NumPy array, got list"):
        G.gemm(x.tolist(), w)
    empty = G.gemm(np.zeros((0, 20), np.float32), w)
    assert empty.shape == (0, 6) and empty.dtype == np.float32


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((ln for ln in f if ln.startswith("flags")), "").split())
    except OSError:
        return set()


_CHILD = """
import numpy as np
from tessera.kernels import gemm
print(gemm.isa())
rng = np.random.default_rng(0)
for m, n, k in [(1, 1, 1), (7, 17, 63), (63, 1000, 17), (1000, 7, 130), (300, 300, 600),
                (1, 64, 1000), (2, 40, 33), (3, 70, 9), (18, 33, 65)]:
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    ref = np.maximum(a.astype(np.float64) @ w.T.astype(np.float64) + bias, 0)
    scale = np.abs(a.astype(np.float64)) @ np.abs(w.T.astype(np.float64)) + np.abs(bias)
    for got in (gemm.gemm(a, w, trans_b=True, bias=bias, activation="relu", threads=2),
                gemm.gemm_packed(a, gemm.pack_b(w, trans_b=True), bias=bias,
                                 activation="relu", threads=1)):
        assert np.all(np.abs(got - ref) <= (k + 8) * 2.0 ** -24 * scale + 1e-30), (m, n, k)
print("ok")
"""

_NEEDS = {"avx512": ({"avx512f"}, "AVX-512F"), "avx2": ({"avx2", "fma"}, "AVX2 and FMA"),
          "portable": (set(), "")}


def _child(isa: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TESSERA_GEMM_ISA=isa)
    env.pop("TESSERA_MAX_ISA", None)   # (tests/kernels/test_max_isa.py checks the cap)
    return subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                          text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(
                              os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable"])
def test_each_micro_kernel_forced(G, isa):
    needs, name = _NEEDS[isa]
    if isa != "portable" and os.uname().machine not in ("x86_64", "amd64"):
        pytest.skip(f"{isa} is an x86-64 path")
    if not needs <= _cpu_flags():
        proc = _child(isa)     # forcing a path the CPU lacks: an error, never SIGILL
        assert proc.returncode == 1 and "RuntimeError" in proc.stderr, proc.stderr
        assert f"lacks {name}" in proc.stderr
        pytest.skip(f"this CPU lacks {name}: the {isa} micro-kernel is not run")
    proc = _child(isa)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == [isa, "ok"]


def test_default_path_is_the_widest_the_cpu_has(G):
    if os.environ.get("TESSERA_GEMM_ISA") or os.environ.get("TESSERA_MAX_ISA"):
        pytest.skip("TESSERA_GEMM_ISA forces a path, or TESSERA_MAX_ISA caps it")
    flags = _cpu_flags()
    if os.uname().machine not in ("x86_64", "amd64") or not flags:
        assert G.isa() == "portable" or flags
        return
    expected = ("avx512" if "avx512f" in flags else
                "avx2" if {"avx2", "fma"} <= flags else "portable")
    assert G.isa() == expected


def test_unknown_isa_name():
    env = dict(os.environ, TESSERA_GEMM_ISA="sse9")
    proc = subprocess.run([sys.executable, "-c", "from tessera.kernels import gemm; gemm.isa()"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "ValueError: TESSERA_GEMM_ISA='sse9': expected one of portable, avx2, avx512" \
        in proc.stderr


def test_bad_input(G):
    a, b = rand(3, 4), rand(5, 6)
    with pytest.raises(RuntimeError, match=r"gemm: mat1 and mat2 shapes cannot be multiplied "
                                           r"\(3x4 and 5x6\)"):
        G.gemm(a, b)
    with pytest.raises(TypeError, match="gemm: a must be float32, got float64"):
        G.gemm(a.astype(np.float64), rand(4, 2))
    with pytest.raises(ValueError, match="gemm: b must be 2-d, got shape"):
        G.gemm(a, rand(4))
    with pytest.raises(ValueError, match="activation must be one of"):
        G.gemm(a, rand(4, 2), activation="tanh")
    with pytest.raises(ValueError, match="gemm: bias must have shape \\(2,\\), got \\(3,\\)"):
        G.gemm(a, rand(4, 2), bias=rand(3))
    with pytest.raises(ValueError, match="beta=0.5 scales out, but no out was given"):
        G.gemm(a, rand(4, 2), beta=0.5)
    with pytest.raises(ValueError, match="out must have shape \\(3, 2\\)"):
        G.gemm(a, rand(4, 2), out=rand(2, 3))
    with pytest.raises(TypeError, match="expected a PackedB"):
        G.gemm_packed(a, rand(4, 2))
    with pytest.raises(RuntimeError, match="3x4 and 5x6"):
        G.gemm_packed(a, G.pack_b(b))
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        G.gemm(a, rand(4, 2), threads=0)


_MAIN_C = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "gemm.h"
/* a pool of one thread taking the items last first: a product's blocks in any order */
static void backwards(tsr_item_fn item, const int64_t* ctx, int64_t n, int threads) {
    (void)threads;
    for (int64_t i = n - 1; i >= 0; i--) item(ctx, i);
}

/* x @ w^T + bias, relu, against plain loops in double: every path this CPU runs */
int main(void) {
    enum { M = 37, N = 75, K = 130 };
    static float x[M * K], w[N * K], bias[N], c[M * N], packed[(N + 31) / 32 * 32 * K];
    (void)packed;   /* its size: the most any path packs */
    for (int i = 0; i < M * K; i++) x[i] = (float)((i * 7919) % 201 - 100) / 50.0f;
    for (int i = 0; i < N * K; i++) w[i] = (float)((i * 104729) % 199 - 99) / 60.0f;
    for (int j = 0; j < N; j++) bias[j] = (float)(j % 13) - 6.0f;
    int ran = 0;
    for (int isa = 0; isa < TSR_GEMM_ISAS; isa++) {
        if (!tsr_gemm_isa_supported(isa)) {
            tsr_gemm_t g = {0};
            g.isa = isa;
            if (tsr_gemm_plan(&g, 1) != -1) return 3;   /* refused, never run */
            continue;
        }
        for (int pre = 0; pre < 2; pre++) {
            tsr_gemm_t g = {0};
            g.m = M; g.n = N; g.k = K; g.a = x; g.rsa = K; g.csa = 1;
            g.b = w; g.rsb = 1; g.csb = K;   /* op(B) = w^T */
            if (pre) {
                if (tsr_gemm_packed_size(isa, K, N) > (int64_t)(sizeof packed / 4)) return 4;
                float* buf = aligned_alloc(64, sizeof packed);
                if (tsr_gemm_pack_b(isa, K, N, w, 1, K, buf)) return 5;
                g.bp = buf;
            }
            g.c = c; g.ldc = N; g.bias = bias; g.alpha = 1.0f; g.act = TSR_ACT_RELU;
            g.isa = isa;
            /* packed: the whole product in one call, its blocks through a pool */
            if (pre ? tsr_gemm_exec(&g, 3, backwards) : tsr_gemm_run(&g)) return 6;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s = bias[j], mag = fabs(bias[j]);
                    for (int p = 0; p < K; p++) {
                        s += (double)x[i * K + p] * w[j * K + p];
                        mag += fabs((double)x[i * K + p] * w[j * K + p]);
                    }
                    if (s < 0) s = 0;
                    if (fabs(c[i * N + j] - s) > (K + 8) * 6e-8 * mag + 1e-30) return 7;
                }
            if (pre) free((void*)g.bp);
        }
        printf("%d\n", isa);
        ran++;
    }
    return ran ? 0 : 8;
}
"""


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX C toolchain")
def test_c_files_build_and_run_alone(tmp_path):
    """gemm.c, gemm.h and prelude.h copied as they are into a C program, built without
    -march (as a deployed library is) and with nothing but libm: every path the CPU runs
    gives relu(x @ w^T + bias), and the ones it lacks are refused."""
    from tessera.kernels import csource
    (tmp_path / "main.c").write_text(_MAIN_C)
    exe = tmp_path / "main"
    proc = subprocess.run([cc.compiler(), "-O2", "-std=c11", "-I", csource.DIRECTORY,
                           str(tmp_path / "main.c"), os.path.join(csource.DIRECTORY, "gemm.c"),
                           "-o", str(exe), "-lm"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.returncode, run.stderr)
    ran = [int(s) for s in run.stdout.split()]
    assert 0 in ran    # the portable path runs everywhere
    flags = _cpu_flags()
    if os.uname().machine in ("x86_64", "amd64") and flags:
        assert (2 in ran) == ("avx512f" in flags)
        assert (1 in ran) == ({"avx2", "fma"} <= flags)


_GEMV_CHILD = r"""
import itertools
import numpy as np
from tessera.kernels import gemm
print(gemm.isa())
rng = np.random.default_rng(0)
SIZES = (1, 7, 17, 63, 1000)
for m, n, k in itertools.product((1, 2, 3, 4, 5), SIZES, SIZES):
    if m == 5 and (n, k) != (63, 17):
        continue   # (the blocked path past GEMV_MAX: one case)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    pre = a.astype(np.float64) @ w.T.astype(np.float64) + bias
    ref = np.maximum(pre, 0) + res
    scale = np.abs(a.astype(np.float64)) @ np.abs(w.T.astype(np.float64)) + np.abs(bias)
    tol = (k + 8) * 2.0 ** -24 * scale + 8 * 2.0 ** -24 * np.abs(ref) + 1e-30
    kw = dict(bias=bias, activation="relu", residual=res)
    wide = np.repeat(w, 2, axis=1)   # (n, 2k): every other column is w
    layouts = {
        "transposed": lambda t: gemm.gemm(a, w, trans_b=True, threads=t, **kw),
        "row-major": lambda t: gemm.gemm(a, np.ascontiguousarray(w.T), threads=t, **kw),
        "packed": lambda t: gemm.gemm_packed(a, gemm.pack_b(w, trans_b=True), threads=t, **kw),
        "strided": lambda t: gemm.gemm(a, wide[:, ::2], trans_b=True, threads=t, **kw),
        "strided rows": lambda t: gemm.gemm(a, np.ascontiguousarray(wide.T)[::2], threads=t,
                                             **kw),
        "a transposed": lambda t: gemm.gemm(np.ascontiguousarray(a.T), w, trans_a=True,
                                             trans_b=True, threads=t, **kw),
    }
    first = None
    for name, run in layouts.items():
        for threads in (1, 2):
            got = run(threads)
            err = np.abs(got - ref)
            assert np.all(err <= tol), (m, n, k, name, threads, err.max())
            if first is None:
                first = got
            # the same sums in the same order, whatever the layout and the threads
            assert np.array_equal(got, first), (m, n, k, name, threads)
print("ok")
"""


@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable"])
def test_gemv_each_path_and_layout(G, isa):
    """A few rows (m <= 4: the GEMV path) against NumPy in float64 over odd shapes, B packed,
    row-major, transposed and strided, with the epilogue, on one and two threads; every
    layout and thread count gives the same bits."""
    needs, name = _NEEDS[isa]
    if isa != "portable" and os.uname().machine not in ("x86_64", "amd64"):
        pytest.skip(f"{isa} is an x86-64 path")
    if not needs <= _cpu_flags():
        pytest.skip(f"this CPU lacks {name}")
    env = dict(os.environ, TESSERA_GEMM_ISA=isa)
    env.pop("TESSERA_MAX_ISA", None)
    proc = subprocess.run([sys.executable, "-c", _GEMV_CHILD], env=env, capture_output=True,
                          text=True, timeout=1200, cwd=os.path.dirname(os.path.dirname(
                              os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == [isa, "ok"]


_ROWS_CHILD = r"""
import numpy as np
from tessera.kernels import gemm
print(gemm.isa())
rng = np.random.default_rng(0)
for m in range(1, 17):
    for n, k in [(33, 65), (192, 300), (40, 1100)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        ref = np.maximum(a.astype(np.float64) @ w.T.astype(np.float64) + bias, 0)
        scale = np.abs(a.astype(np.float64)) @ np.abs(w.T.astype(np.float64)) + np.abs(bias)
        tol = (k + 8) * 2.0 ** -24 * scale + 8 * 2.0 ** -24 * np.abs(ref) + 1e-30
        packed = gemm.pack_b(w, trans_b=True)
        first = None
        for threads in (1, 2):
            for got in (gemm.gemm(a, w, trans_b=True, bias=bias, activation="relu",
                                  threads=threads),
                        gemm.gemm(a, np.ascontiguousarray(w.T), bias=bias, activation="relu",
                                  threads=threads),
                        gemm.gemm_packed(a, packed, bias=bias, activation="relu",
                                         threads=threads),
                        gemm.gemm(np.ascontiguousarray(a.T), w, trans_a=True, trans_b=True,
                                  bias=bias, activation="relu", threads=threads)):
                assert np.all(np.abs(got - ref) <= tol), (m, n, k, threads)
                first = got if first is None else first
                assert np.array_equal(got, first), (m, n, k, threads)
        # the rows past the last full tile sum as the full tile's rows do: each row of a
        # product of 14 (AVX-512) or 6 (AVX2) rows, alone, gives the same bits
        mr = {"avx512": 14, "avx2": 6}.get(gemm.isa())
        if mr and m == mr:
            for i in range(5, m):   # (rows <= 4: the GEMV path sums in two chains)
                part = gemm.gemm_packed(a[:i], packed, bias=bias, activation="relu")
                assert np.array_equal(part, first[:i]), (m, i, n, k)
print("ok")
"""


@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable"])
def test_few_rows_each_path(G, isa):
    """Products of 1 to 16 rows (the GEMV path, the kernels of fewer rows than the tile, a
    tile and a few more) against NumPy in float64 with the epilogue, B transposed, row-major
    and packed, A transposed, on one and two threads: every form gives the same bits."""
    needs, name = _NEEDS[isa]
    if isa != "portable" and os.uname().machine not in ("x86_64", "amd64"):
        pytest.skip(f"{isa} is an x86-64 path")
    if not needs <= _cpu_flags():
        pytest.skip(f"this CPU lacks {name}")
    env = dict(os.environ, TESSERA_GEMM_ISA=isa)
    env.pop("TESSERA_MAX_ISA", None)
    proc = subprocess.run([sys.executable, "-c", _ROWS_CHILD], env=env, capture_output=True,
                          text=True, timeout=1200, cwd=os.path.dirname(os.path.dirname(
                              os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == [isa, "ok"]
