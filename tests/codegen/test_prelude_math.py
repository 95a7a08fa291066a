"""The prelude's vectorisable transcendental functions, against NumPy/SciPy.

Each ``tsr_*`` function runs in a ``#pragma omp simd`` loop over a dense sweep of inputs:
float32 bit patterns spread over every binade of both signs, fine ranges around the
overflow/underflow thresholds and around 0, and the special values (±0, ±inf, NaN,
subnormals, the largest finite). Errors are measured in ulps of the correctly rounded
float64 reference and must stay within each function's documented bound; special values
must match exactly (sign of zero included). The loops must vectorise (GCC's
``-fopt-info-vec``), and compiled graphs must agree with the NumPy reference executor on
the same edge values, for the ops whose rules call these functions and for their jammed
(two-stream) loops at odd, small and split extents.
"""
from __future__ import annotations

import ctypes
import os
import subprocess

import numpy as np
import pytest
import scipy.special as sp

import tessera
from tessera.codegen import build as runtime
from tessera.graph.fused import body_graph
from tessera.graph.passes import run_pipeline
from tessera.graph.trace import trace
from tessera.kernels import cc
from tessera.kernels.c_expr import CType
from tessera.kernels.prelude import PRELUDE
from tessera.ops.registry import REGISTRY
from tests.codegen.test_codegen import check, fused_node

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return np.where(x < 0, np.exp(x) / (1 + np.exp(x)), sp.expit(x))


PHI_ULP = 6.0
# name -> (reference in float64, max ulp in float32, max ulp in float64 or None: libm)
FUNCS = {
    "exp": (np.exp, 1.5, 1.5),
    "expm1": (np.expm1, 2.0, 2.5),
    "sigmoid": (_sigmoid, 3.0, 3.5),
    "tanh": (np.tanh, 3.0, 3.5),
    "log": (np.log, 1.0, 1.5),
    "log1p": (np.log1p, 2.0, 1.5),
    # e^(-x^2/2) times erfcx(|x| / sqrt2) / 2 as a polynomial in 1 / (1 + 0.3|x|): relative
    # accuracy into the negative tail (7 ulp with Numerical Recipes' fit, before)
    "phi": (lambda x: 0.5 * sp.erfc(-x * np.sqrt(0.5)), PHI_ULP, None),
    "erf": (sp.erf, 2.5, None),
    "erfc": (sp.erfc, PHI_ULP, None),
}
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0]


def _wrappers() -> str:
    lines = []
    for name in FUNCS:
        for t, suffix in (("float", "f"), ("double", "")):
            lines.append(f"void w_{name}{suffix}(const {t}* x, {t}* y, long n) {{\n"
                         f"#pragma omp simd\n"
                         f"  for (long i = 0; i < n; i++) y[i] = tsr_{name}{suffix}(x[i]);\n}}")
    return PRELUDE + "\n" + "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))
        return cc.load(_wrappers())


def _call(lib, name: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x)
    y = np.empty_like(x)
    fn = getattr(lib, f"w_{name}{'f' if x.dtype == np.float32 else ''}")
    fn(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data), ctypes.c_long(x.size))
    return y


def _sweep(dtype) -> np.ndarray:
    if dtype == np.float32:
        bits = np.arange(0, 1 << 32, 4093, dtype=np.uint64).astype(np.uint32)
        tiny, big = np.finfo(np.float32).tiny, np.finfo(np.float32).max
        extra = [np.linspace(-110, 110, 400_001), np.linspace(-2, 2, 200_001),
                 [tiny, -tiny, tiny / 3, 1e-45, -1e-45, big, -big, 88.72284, 88.72285,
                  -87.33655, -103.97208, -103.97209, 9.1, 10.5]]
        return np.concatenate([bits.view(np.float32),
                               *[np.asarray(e, np.float32) for e in extra],
                               np.asarray(SPECIAL, np.float32)])
    rng = np.random.default_rng(0)
    tiny, big = np.finfo(np.float64).tiny, np.finfo(np.float64).max
    extra = [np.linspace(-760, 760, 400_001), np.linspace(-3, 3, 200_001),
             rng.standard_normal(100_000) * 1e-5,
             [tiny, -tiny, tiny / 3, 5e-324, -5e-324, big, -big, 709.782712893384,
              709.7827128933841, -708.3964185322641, -745.1332191019411, -745.1332191019412]]
    return np.concatenate([rng.integers(0, 1 << 64, 500_000, dtype=np.uint64).view(np.float64),
                           *[np.asarray(e, np.float64) for e in extra],
                           np.asarray(SPECIAL, np.float64)])


def _ulps(got: np.ndarray, ref: np.ndarray, dtype) -> np.ndarray:
    """|got - ref| in ulps of the rounded reference; 0 where both are the same inf or NaN."""
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = ref.astype(dtype)
        err = np.abs(got.astype(np.float64) - ref) / np.spacing(np.abs(rounded)).astype(
            np.float64)
    same = (np.isnan(got) & np.isnan(rounded)) | (np.isinf(rounded) & (got == rounded))
    err[same] = 0
    err[np.isnan(err)] = np.inf
    return err


# (name, dtype) pairs with a polynomial of ours (float64 erf/erfc/Phi call libm: no bound)
_SWEPT = [pytest.param(name, dt, id=f"{name}-{dt.__name__}") for name in FUNCS
          for dt, bound in ((np.float32, FUNCS[name][1]), (np.float64, FUNCS[name][2]))
          if bound is not None]


@pytest.mark.parametrize("name,dtype", _SWEPT)
def test_dense_sweep_within_bound(lib, name, dtype):
    ref_fn, bound32, bound64 = FUNCS[name]
    bound = bound32 if dtype == np.float32 else bound64
    x = _sweep(dtype)
    got = _call(lib, name, x)
    with np.errstate(all="ignore"):
        ref = ref_fn(x.astype(np.float64))
    err = _ulps(got, ref, dtype)
    k = int(np.argmax(err))
    assert err[k] <= bound, f"tsr_{name} ({np.dtype(dtype).name}): {err[k]:.2f} ulp at " \
                            f"x={x[k]!r}: got {got[k]!r}, want {ref[k]!r}"
    # zeros keep their sign (exp(-inf) = +0, log1p(-0) = -0, tanh(-0) = -0, ...)
    rounded = ref.astype(dtype)
    zeros = (got == 0) & (rounded == 0)
    assert np.array_equal(np.signbit(got[zeros]), np.signbit(rounded[zeros])), name


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_special_values_exact(lib, dtype):
    x = np.asarray(SPECIAL, dtype)
    for name, (ref_fn, *_) in FUNCS.items():
        got = _call(lib, name, x)
        with np.errstate(all="ignore"):
            want = ref_fn(x.astype(np.float64)).astype(dtype)
        exact = (~np.isfinite(want) | (want == 0)) & (np.abs(x) != 1)
        np.testing.assert_array_equal(got[exact], want[exact], err_msg=f"tsr_{name}")
        assert np.array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0])), name


@pytest.mark.skipif("gcc" not in os.path.basename(cc.compiler() or "") and
                    "cc" != os.path.basename(cc.compiler() or ""), reason="GCC's -fopt-info")
def test_every_wrapper_loop_vectorises(tmp_path):
    src = tmp_path / "m.c"
    src.write_text(_wrappers())
    proc = subprocess.run([cc.compiler(), *[f for f in cc.FLAGS if f != "-shared"],
                           *runtime.FLAGS, "-c", str(src), "-o", str(tmp_path / "m.o"),
                           "-fopt-info-vec-optimized"], capture_output=True, text=True)
    if "unrecognized" in proc.stderr or proc.returncode != 0:
        pytest.skip("not GCC")
    lines = _wrappers().splitlines()
    loops = [i + 1 for i, line in enumerate(lines) if line.startswith("  for (long i")]
    vectorised = {int(m.split(":")[1]) for m in proc.stderr.splitlines()
                  if "loop vectorized" in m}
    missed = [lines[i - 3] for i in loops if i not in vectorised]
    assert len(loops) == 2 * len(FUNCS)
    # float64 Phi/erf/erfc call libm and stay scalar
    assert all("w_phi(" in m or "w_erf(" in m or "w_erfc(" in m for m in missed), missed


def _gelu_lib():
    """float32 loops over gelu's and gelu_backward's C rules (the expressions graphs fuse)."""
    c = CType("float32")
    exprs = {"gelu": REGISTRY["gelu"].to_c(c, ["x[i]"], {}),
             "gelu_grad": REGISTRY["gelu_backward"].to_c(c, ["1.0f", "x[i]"], {})}
    return cc.load(PRELUDE + "".join(
        f"void w_{name}f(const float* x, float* y, long n) {{\n#pragma omp simd\n"
        f"  for (long i = 0; i < n; i++) y[i] = {e};\n}}\n" for name, e in exprs.items()))


def test_gelu_rules_within_bound():
    """gelu(x) = x Phi(x) to PHI_ULP + 1 ulp wherever Phi(x) is normal, the far negative
    tail included (where 0.5 (1 + erf) cancels to garbage); below x = -13.2, where Phi is
    subnormal, the result carries Phi's rounding times |x|. gelu'(x) = Phi(x) + x phi(x) is
    measured in ulps of the larger term: the sum cancels near x = -0.75, as it does in any
    formula from the two."""
    lib = _gelu_lib()
    x = np.concatenate([_sweep(np.float32), np.linspace(-15, 15, 1_000_001, dtype=np.float32)])
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        phi = sp.ndtr(x64)
        xpdf = x64 * np.exp(-0.5 * x64 * x64) / np.sqrt(2 * np.pi)
        gelu, grad = x64 * phi, phi + xpdf
    got = _call(lib, "gelu", x)
    err = _ulps(got, gelu, np.float32)
    normal = ~(phi < np.finfo(np.float32).tiny)   # Phi(x) normal: x > -13.2 (or NaN)
    k = int(np.argmax(np.where(normal, err, 0)))
    assert err[k] <= PHI_ULP + 1, f"gelu: {err[k]:.2f} ulp at x={x[k]!r}: got {got[k]!r}"
    sub = ~normal & np.isfinite(x)
    within = np.abs(x64[sub]) * 2.0 ** -150 + (PHI_ULP + 1) * np.spacing(
        np.abs(gelu[sub]).astype(np.float32))
    assert np.all(np.abs(got[sub] - gelu[sub]) <= within)
    assert np.array_equal(np.signbit(got[got == 0]), np.signbit(x[got == 0]))
    got = _call(lib, "gelu_grad", x)
    with np.errstate(all="ignore"):
        scale = np.maximum(np.abs(phi), np.abs(xpdf)).astype(np.float32)
        err = np.abs(got - grad) / np.spacing(scale).astype(np.float64)
    finite = np.isfinite(grad)
    k = int(np.argmax(np.where(finite, err, 0)))
    assert err[k] <= PHI_ULP, f"gelu': {err[k]:.2f} ulp at x={x[k]!r}: got {got[k]!r}"
    assert np.array_equal(np.isnan(got), np.isnan(grad))   # +-inf: inf * 0, as x phi(x) gives


# ---- compiled graphs on edge values --------------------------------------------------------

EDGE32 = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, -1e-38, 1e-30,
                   -1e-30, 3.4e38, -3.4e38, 1e30, -1e30, 88.7, 88.8, -87.4, -103.9, -104.1,
                   20.0, -20.0, 9.0, -9.0, 0.5, -0.5, 0.25, 1e-8, -1e-8, 1.0, -1.0, 2.5],
                  np.float32)


def _edge(dtype) -> np.ndarray:
    if dtype == np.float32:
        return EDGE32
    extra = np.array([5e-324, -5e-324, 1e-310, 1.7e308, -1.7e308, 709.7, 709.8, -745.0,
                      -746.0, 40.0, -40.0], np.float64)
    return np.concatenate([EDGE32.astype(np.float64), extra])


def _unary_ops():
    F = tessera.nn.functional
    return {"exp": tessera.exp, "expm1": tessera.expm1, "log": tessera.log,
            "log1p": tessera.log1p, "sigmoid": tessera.sigmoid, "tanh": tessera.tanh,
            "erf": tessera.erf, "erfc": tessera.erfc, "gelu": F.gelu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu,
            "softplus": F.softplus, "log_sigmoid": F.logsigmoid, "mish": F.mish, "elu": F.elu}


@pytest.mark.parametrize("dtype", [tessera.float32, tessera.float64], ids=["f32", "f64"])
def test_graph_ops_on_edge_values_match_the_reference(dtype):
    x = tessera.from_numpy(_edge(dtype.np))
    bodies = []
    for name, fn in _unary_ops().items():
        g, _ = trace(fn, x)
        run_pipeline(g, codegen=True)
        fused = [n for n in g.nodes if n.op.name == "fused"]
        if not fused:   # a single op is wrapped as its own region
            g, _ = trace(fn, x)
            (n,) = [n for n in g.nodes if n.op.to_c is not None]
            fused = [fused_node(g)]
        bodies.append((name, fused[0]))
    kernels = runtime.build([n for _, n in bodies])
    for name, node in bodies:
        body = body_graph(node.attrs["body"])
        with np.errstate(all="ignore"):
            try:
                check(kernels[node], body, [x._data])
            except AssertionError as e:
                raise AssertionError(f"{name}: {e}") from None


@pytest.mark.parametrize("dtype", [tessera.float32, tessera.float64], ids=["f32", "f64"])
def test_backward_regions_on_edge_values(dtype):
    """gelu/silu/sigmoid/tanh backward regions, with the edge values as inputs."""
    F = tessera.nn.functional
    xv = _edge(dtype.np)
    xv = xv[np.isfinite(xv) & (np.abs(xv) < 1e4)]
    x = tessera.from_numpy(xv).requires_grad_()
    bodies = []
    for fn in (F.gelu, F.silu, lambda t: F.gelu(t, approximate="tanh"),
               lambda t: t.sigmoid() * t.tanh()):
        g, _ = trace(lambda t: tessera.autograd.grad(fn(t).sum(), t)[0], x)
        run_pipeline(g, codegen=True)
        bodies += [n for n in g.nodes if n.op.name == "fused"]
    kernels = runtime.build(bodies)
    assert kernels
    for node, kernel in kernels.items():
        body = body_graph(node.attrs["body"])
        arrays = [np.broadcast_to(xv, v.shape).astype(v.dtype.np) if v.shape else
                  np.asarray(1, v.dtype.np) for v in body.inputs]
        with np.errstate(all="ignore"):
            check(kernel, body, arrays)


@pytest.mark.parametrize("shape", [(1,), (2,), (63,), (64,), (65,), (1001,), (3, 64),
                                   (5, 129), (2, 3, 67), ((1 << 18) + 3,)])
def test_jammed_loops_at_odd_small_and_split_extents(shape):
    """Two-stream loops (a transcendental call in the body): every element once, the odd
    one after the loop, on the contiguous and the strided kernel, split across threads."""
    from tessera.codegen.loops import lower, render
    F = tessera.nn.functional
    x = tessera.randn(*shape)
    b = tessera.randn(shape[-1])
    g, _ = trace(lambda t, u: F.gelu(t * 1.5 + u) * t.sigmoid(), x, b)
    run_pipeline(g, codegen=True)
    (node,) = [n for n in g.nodes if n.op.name == "fused"]
    body = body_graph(node.attrs["body"])
    c = render(lower(body, "k")[0])
    assert ("_h = " in c) == (shape[-1] >= 64), c
    kernels = runtime.build([node])
    check(kernels[node], body, [x._data, b._data])
    if len(shape) >= 2:
        check(kernels[node], body, [np.asfortranarray(x._data), b._data])
