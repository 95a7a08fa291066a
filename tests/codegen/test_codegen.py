"""Generated C kernels against the NumPy reference (the ``fused`` op's own kernel).

Every op with a C rule runs on the op-info samples (float32 and float64, broadcasting,
0-d and empty inputs, and transposed inputs that take the strided kernel), all compiled in
one translation unit; Hypothesis draws random chains; fresh processes check the disk cache
and that a corrupt cache entry is rebuilt; the fallbacks give the same results.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tessera
from tessera.codegen import build as runtime
from tessera.codegen.loops import supported
from tessera.codegen.rowwise import is_rowwise
from tessera.graph.fused import _kernel as reference, body_graph
from tessera.graph.ir import Graph, Node
from tessera.graph.trace import trace
from tessera.kernels import cc
from tessera.ops.registry import REGISTRY
from tests.opinfo import OP_DB

# the ops with a C rule (each declares it in its defop)
RULES = {name for name, op in REGISTRY.items() if op.to_c is not None}

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))


def fused_node(body: Graph) -> Node:
    out = body.outputs[0]
    return Node(REGISTRY["fused"], list(body.inputs), {"body": str(body)}, [out])


def _tolerance(dtype):
    if dtype == np.float32:
        return 2e-6, 2e-6
    return (1e-12, 1e-12) if dtype == np.float64 else (0, 0)


def check(kernel, body: Graph, arrays, slack: float = 1):
    """The kernel's outputs (every one of a multi-output body) equal the reference's (to
    ``slack`` times the dtype's tolerance: long chains on random inputs round more)."""
    want = reference(*arrays, body=str(body))
    got = tuple(np.empty(v.shape, v.dtype.np) for v in body.outputs)
    if len(got) == 1:
        want, got = (want,), got
        kernel(got[0], *arrays)
    else:
        kernel(got, *arrays)
    values = [*body.inputs, *(v for n in body.nodes for v in n.outputs)]
    lowest = np.float32 if any(v.dtype is tessera.float32 for v in values) else \
        np.float64 if any(v.dtype is tessera.float64 for v in values) else np.int64
    rtol, atol = (t * slack for t in _tolerance(lowest))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=rtol, atol=atol, equal_nan=True)


# ---- every op with a C rule, on the op-info samples ------------------------------------------

def _op_cases():
    """(name, body, arrays) for each op-info sample whose traced graph is one fusible node."""
    cases = []
    rng = np.random.default_rng(0)
    for info in OP_DB:
        if not set(info.covered_ops()) & set(RULES):
            continue
        for dt in (np.float32, np.float64, np.int32, np.int64, np.bool_):
            if dt not in info.dtypes:
                continue
            for k, sample in enumerate(info.samples(rng, np.dtype(dt))):
                args = [tessera.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray)
                        else a for a in sample.args]
                tensors = [a for a in args if isinstance(a, tessera.Tensor)]
                if not tensors:
                    continue
                pos = [i for i, a in enumerate(args) if isinstance(a, tessera.Tensor)]

                def f(*ts, _args=args, _pos=pos, _kw=sample.kwargs):
                    full = list(_args)
                    for i, t in zip(_pos, ts):
                        full[i] = t
                    return info.fn(tessera, *full, **_kw)
                try:
                    g, _ = trace(f, *tensors)
                except Exception:
                    continue  # an error sample
                if len(g.outputs) != 1 or not g.nodes or g.variables or \
                        supported(g) is not None or g.outputs[0] in g.inputs:
                    continue
                cases.append((f"{info.name}-{np.dtype(dt).name}-{k}", g,
                              [t._data for t in tensors]))
    return cases


CASES = _op_cases()


def test_cases_cover_the_c_rules():
    covered = {n.op.name for _, g, _ in CASES for n in g.nodes}
    missing = sorted(set(RULES) - covered - {"positive", "bitwise_not", "fmax", "fmin",
                                             "gelu_backward", "silu_backward"})
    assert len(CASES) > 300
    assert not missing, f"C rules without a compiled test case: {missing}"


def test_every_rule_matches_the_reference():
    kernels = runtime.build([fused_node(g) for _, g, _ in CASES])
    assert len(kernels) == len(CASES)
    for (name, g, arrays), kernel in zip(CASES, kernels.values()):
        try:
            check(kernel, g, arrays)
            # transposed (non-contiguous) inputs take the strided kernel
            strided = [np.asfortranarray(a) if a.ndim >= 2 else a for a in arrays]
            if any(not a.flags.c_contiguous for a in strided):
                check(kernel, g, strided)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def test_backward_regions_match_the_reference():
    """Gradient formulas (gelu_backward, silu_backward, and what autograd builds from
    sigmoid/tanh/mul) compiled as regions."""
    x = tessera.randn(6, 7, dtype=tessera.float64, requires_grad=True)
    cases = []
    for fn in (lambda t: tessera.nn.functional.gelu(t), lambda t: tessera.nn.functional.silu(t),
               lambda t: tessera.nn.functional.gelu(t, approximate="tanh"),
               lambda t: t.sigmoid() * t.tanh()):
        for dt in (tessera.float32, tessera.float64):
            xd = x.detach().to(dt).requires_grad_()
            g, _ = trace(lambda t: tessera.autograd.grad(fn(t).sum(), t, create_graph=False)[0],
                         xd)
            nodes = [n for n in g.nodes if n.op.to_c is not None]
            for n in nodes:
                body = Graph()
                ins = [body.add_input(f"a{i}", v.shape, v.dtype)
                       for i, v in enumerate(n.tensor_inputs)]
                it = iter(ins)
                args = [next(it) if hasattr(v, "shape") and not isinstance(v, (int, float))
                        else v for v in n.inputs]
                body.outputs = body.add_node(n.op, args, n.attrs,
                                             [(v.shape, v.dtype) for v in n.outputs])
                if supported(body) is None:
                    cases.append(body)
    assert any(b.nodes[0].op.name == "gelu_backward" for b in cases)
    kernels = runtime.build([fused_node(b) for b in cases])
    rng = np.random.default_rng(1)
    for body, kernel in zip(cases, kernels.values()):
        arrays = [rng.standard_normal(v.shape).astype(v.dtype.np) for v in body.inputs]
        check(kernel, body, arrays)


def test_integer_regions_wrap_like_numpy():
    rng = np.random.default_rng(4)
    cases = []
    for dt in (tessera.int32, tessera.int64):
        info = np.iinfo(dt.np)
        x = tessera.from_numpy(rng.integers(info.min, info.max, (6, 5), dtype=dt.np))
        y = tessera.from_numpy(rng.integers(-9, 9, (5,), dtype=dt.np))
        for fn in (lambda a, b: (a * b + a - b).abs(),               # overflows wrap
                   lambda a, b: tessera.maximum(a, b) * (a > b) + tessera.where(a < 0, b, -a),
                   lambda a, b: (a & b) ^ (a | ~b),
                   lambda a, b: (a.clamp(-100, 100) * 2).sign() + (a == 1.5)):
            g, _ = trace(fn, x, y)
            assert supported(g) is None, supported(g)
            cases.append((g, [x._data, y._data]))
    kernels = runtime.build([fused_node(g) for g, _ in cases])
    for (g, arrays), kernel in zip(cases, kernels.values()):
        check(kernel, g, arrays)
        check(kernel, g, [np.asfortranarray(arrays[0]), arrays[1]])


def test_bool_values_in_a_region_are_held_at_the_float_lane_width():
    # relu's backward (x > 0) * g: an 8-bit bool between float lanes made GCC pack and unpack
    # every vector (2.5x slower); values are 32-bit ints, buffers of bool stay 8-bit
    from tessera.codegen.loops import lower, render
    g = Graph.parse("""graph(%x: float32[64], %g: float32[64], %m: bool[64]) {
      %0: bool[64] = gt(%x, 0.0)
      %1: bool[64] = logical_and(%0, %m)
      %2: float32[64] = mul(%g, %1)
      return (%2)
    }""")
    src = render(lower(g, "k")[0])
    assert "int32_t v2 = in2[" in src and "unsigned char" in src.split("{")[0]
    assert "unsigned char v" not in src
    x, gr = np.linspace(-1, 1, 64, dtype=np.float32), np.arange(64, dtype=np.float32)
    m = np.arange(64) % 3 != 0
    (kernel,) = runtime.build([fused_node(g)]).values()
    check(kernel, g, [x, gr, m])


# ---- reductions at the end of a region ---------------------------------------------------

def test_reductions_over_every_dim_set():
    """sum/mean/amax/amin of an elementwise chain over every subset of dims of a 3-d shape,
    keepdim or not, both dtypes; all compiled in one library."""
    import itertools
    cases = []
    rng = np.random.default_rng(2)
    for dt in (tessera.float32, tessera.float64):
        x = tessera.from_numpy(rng.standard_normal((3, 4, 5)).astype(dt.np))
        b = tessera.from_numpy(rng.standard_normal((4, 1)).astype(dt.np))
        for op in ("sum", "mean", "amax", "amin"):
            for r in range(4):
                for dims in itertools.combinations(range(3), r):
                    for keep in (False, True):
                        def f(t, u, _op=op, _d=dims, _k=keep):
                            y = (t * u).tanh() + t
                            if _op in ("amax", "amin") and not _d:
                                return getattr(y, _op)(dim=(0, 1, 2), keepdim=_k)
                            return getattr(y, _op)(dim=_d or None, keepdim=_k) if _d or \
                                _op in ("amax", "amin") else getattr(y, _op)()
                        g, _ = trace(f, x, b)
                        if supported(g) is None:
                            cases.append((f"{op}{dims}{keep}{dt}", g, [x._data, b._data]))
    assert len(cases) >= 60
    kernels = runtime.build([fused_node(g) for _, g, _ in cases])
    for (name, g, arrays), kernel in zip(cases, kernels.values()):
        try:
            check(kernel, g, arrays)
            check(kernel, g, [np.asfortranarray(arrays[0]), arrays[1]])
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def test_graph_fuses_a_chain_into_its_reduction():
    class Loss(tessera.nn.Graph):
        def build(self, x, y):
            return ((x - y) ** 2).mean() + (x * y).sum(0).amax()
    x, y = tessera.randn(64, 32), tessera.randn(64, 32)
    g = Loss()
    got = g(x, y)
    names = [n.op.name for n in g._cache[g._last_key].ir.nodes]
    assert names.count("fused") >= 2 and "mean" not in names, names
    want = ((x - y) ** 2).mean() + (x * y).sum(0).amax()
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)


# ---- reduce-then-map regions (decomposed softmax, layer norm and their backwards) -----------

def _rowwise_cases():
    F = tessera.nn.functional
    fns = []
    for dim in (0, 1, -1):
        fns.append((f"softmax{dim}", lambda x, w, b, d=dim: F.softmax(x, d)))
        fns.append((f"log_softmax{dim}", lambda x, w, b, d=dim: F.log_softmax(x, d)))
    fns += [("layer_norm", lambda x, w, b: F.layer_norm(x, (7,), w, b)),
            ("layer_norm_2d", lambda x, w, b: F.layer_norm(x, (5, 7))),
            ("layer_norm_nw", lambda x, w, b: F.layer_norm(x, (7,)))]
    return fns


@pytest.mark.parametrize("dtype", [tessera.float32, tessera.float64])
def test_rowwise_regions_forward_and_backward(dtype):
    """Each op and its gradients in a graph: the regions are compiled (no softmax or
    layer_norm node is left), each fused kernel equals its NumPy reference on contiguous and
    transposed inputs, and the graph equals eager."""
    from tessera.graph.passes import run_pipeline
    rng = np.random.default_rng(3)
    bodies = []
    for name, fn in _rowwise_cases():
        x = tessera.from_numpy(rng.standard_normal((3, 5, 7)).astype(dtype.np))
        w = tessera.from_numpy(rng.standard_normal(7).astype(dtype.np))
        b = tessera.from_numpy(rng.standard_normal(7).astype(dtype.np))

        def step(x, w, b, fn=fn):
            # (not (y * y).sum(): layer norm's input gradient of that is zero, rounding noise
            # once the loss's broadcast gradient is part of the region)
            y = fn(x, w, b)
            return (y, *tessera.autograd.grad((y * y * y).sum(), [x, w, b], allow_unused=True,
                                              materialize_grads=True))
        for t in (x, w, b):
            t.requires_grad_()
        g, _ = trace(step, x, w, b)
        run_pipeline(g, codegen=True)
        names = [n.op.name for n in g.nodes]
        assert not {"softmax", "log_softmax", "layer_norm", "layer_norm_backward",
                    "softmax_backward", "log_softmax_backward"} & set(names), (name, names)
        bodies += [(name, n) for n in g.nodes if n.op.name == "fused"]
        want = step(x, w, b)
        from tessera.graph.executor import Executor
        got = Executor(g).run([x._data, w._data, b._data], {})[0]
        rtol = 1e-5 if dtype is tessera.float32 else 1e-10
        for a, e in zip(got, want):
            np.testing.assert_allclose(a, e.detach().numpy(), rtol=rtol, atol=rtol, err_msg=name)
    assert any(is_rowwise(body_graph(n.attrs["body"])) for _, n in bodies)
    kernels = runtime.build([n for _, n in bodies])
    assert len(kernels) == len(bodies)
    for name, n in bodies:
        body = body_graph(n.attrs["body"])
        arrays = [rng.standard_normal(v.shape).astype(v.dtype.np) for v in body.inputs]
        try:   # (the loss's gradient is in the region: its chains are long)
            check(kernels[n], body, arrays, slack=8)
            check(kernels[n], body, [np.asfortranarray(a) if a.ndim >= 2 else a
                                     for a in arrays], slack=8)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("text", [
    # softmax: the sum phase's exp is kept in the output and read back by the last loop
    '''graph(%a0: {t}[6, 9]) {{
      %0: {t}[6, 1] = amax(%a0) {{dim=(1,), keepdim=True}}
      %1: {t}[6, 9] = sub(%a0, %0) {{alpha=1}}
      %2: {t}[6, 9] = exp(%1)
      %3: {t}[6, 1] = sum(%2) {{dim=(1,), keepdim=True, dtype=None}}
      %4: {t}[6, 9] = div(%2, %3) {{rounding_mode=None}}
      return (%4)
    }}''',
    # min as a vectorised reduction with its NaN flag, then a map
    '''graph(%a0: {t}[6, 9]) {{
      %0: {t}[6, 1] = amin(%a0) {{dim=(1,), keepdim=True}}
      %1: {t}[6, 9] = sub(%a0, %0) {{alpha=1}}
      return (%1)
    }}''',
])
def test_rowwise_max_min_and_kept_values_on_special_rows(dtype, text):
    """NaN anywhere in a row, infinities, signed zeros, a row of -inf: as the reference."""
    body = Graph.parse(text.format(t=np.dtype(dtype).name))
    x = np.random.default_rng(5).standard_normal((6, 9)).astype(dtype)
    x[0, 0] = np.nan
    x[1, 8] = np.nan
    x[2, 3] = np.inf
    x[3, :] = -np.inf
    x[4, :4], x[4, 4:] = -0.0, 0.0
    x[5, 2] = -np.inf
    (kernel,) = runtime.build([fused_node(body)]).values()
    check(kernel, body, [x])
    check(kernel, body, [np.asfortranarray(x)])


def test_large_regions_split_across_threads_match():
    """Above PARALLEL_MIN elements the outer loop runs in chunks on several threads."""
    from tessera.codegen.loops import lower
    from tessera.kernels.threadpool import SPLIT_MIN as PARALLEL_MIN
    F = tessera.nn.functional
    x = tessera.randn(PARALLEL_MIN // 64 + 3, 128)
    b = tessera.randn(128)
    bodies = []
    for fn in (lambda t, u: F.gelu(t * 2 + u) * t.sigmoid(),
               lambda t, u: F.softmax(t + u, -1)):
        g, _ = trace(fn, x, b)
        from tessera.graph.passes import run_pipeline
        run_pipeline(g, codegen=True)
        (node,) = [n for n in g.nodes if n.op.name == "fused"]
        body = body_graph(node.attrs["body"])
        assert lower(body, "k")[0].split == x.shape[0]
        bodies.append((node, body))
    kernels = runtime.build([n for n, _ in bodies])
    for node, body in bodies:
        check(kernels[node], body, [x._data, b._data])
        check(kernels[node], body, [np.asfortranarray(x._data), b._data])


def test_only_regions_long_enough_for_one_thread_are_split():
    # a cheap region (relu's backward over 256x1024: ~0.3 ms on one thread) runs whole; the
    # same size with a transcendental function, or a cheap one 8x larger, is split
    from tessera.codegen.loops import lower

    def split(shape, op):
        g = Graph.parse(f"""graph(%x: float32{list(shape)}, %g: float32{list(shape)}) {{
          %0: float32{list(shape)} = {op}
          return (%0)
        }}""")
        return lower(g, "k")[0].split
    assert split((256, 1024), "mul(%x, %g)") is None
    assert split((256, 1024), "gelu(%x) {approximate='none'}") is not None
    assert split((2048, 1024), "mul(%x, %g)") is not None


# ---- random chains -----------------------------------------------------------------------

UNARY = ["neg", "abs", "exp", "tanh", "sigmoid", "relu", "gelu", "silu", "sin", "softplus",
         "square", "hardswish", "elu", "log_sigmoid", "mish", "sign"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "remainder", "atan2", "pow"]
SHAPES = [(), (5,), (3, 5), (2, 3, 5), (1, 5), (3, 1), (2, 1, 5)]


def _apply(t, op, other):
    F = tessera.nn.functional
    # exp's input is kept below 2: an ulp of exp(5) = 148 is 1.5e-5, which a following sin
    # passes on whole, beyond the comparison's tolerance however exact both sides are
    fns = {"neg": tessera.neg, "abs": tessera.abs, "exp": lambda a: tessera.exp(a.clamp(max=2)),
           "tanh": tessera.tanh, "sigmoid": tessera.sigmoid, "relu": F.relu, "gelu": F.gelu,
           "silu": F.silu, "sin": tessera.sin, "softplus": F.softplus, "square": tessera.square,
           "hardswish": F.hardswish, "elu": F.elu, "log_sigmoid": F.logsigmoid, "mish": F.mish,
           "sign": tessera.sign}
    if op in fns:
        return fns[op](t)
    if op == "pow":
        return tessera.pow(t.abs() + 0.5, other.clamp(-2, 2))
    if op in ("div", "remainder"):
        other = other.abs() + 0.5
    return getattr(tessera, op)(t, other)


@settings(max_examples=20, deadline=None)
@given(ops=st.lists(st.sampled_from(UNARY + BINARY), min_size=1, max_size=6),
       shapes=st.lists(st.sampled_from(SHAPES), min_size=2, max_size=4),
       dtype=st.sampled_from([tessera.float32, tessera.float64]), seed=st.integers(0, 2**16))
def test_random_chains(ops, shapes, dtype, seed):
    tessera.manual_seed(seed)
    inputs = [tessera.randn(s, dtype=dtype) for s in shapes]

    def chain(*ts):
        y = ts[0]
        for k, op in enumerate(ops):
            y = _apply(y, op, ts[1 + k % (len(ts) - 1)])
        return y
    g, _ = trace(chain, *inputs)
    if supported(g) is not None or any(n.op.to_c is None for n in g.nodes):
        return
    (kernel,) = runtime.build([fused_node(g)]).values()
    arrays = [t._data for t in inputs]
    check(kernel, g, arrays)
    check(kernel, g, [np.asfortranarray(a) if a.ndim >= 2 else a for a in arrays])


# ---- compiled graphs: codegen on == off ------------------------------------------------------

class Chain(tessera.nn.Graph):
    def build(self, x, b):
        return tessera.sigmoid(tessera.nn.functional.gelu(x * 2 + b)) * x


def test_graph_uses_generated_kernels_and_matches_numpy_executor(monkeypatch):
    x, b = tessera.randn(64, 33), tessera.randn(33)
    g = Chain()
    y = g(x, b)
    compiled = g._cache[g._last_key]
    assert [n.op.name for n in compiled.ir.nodes] == ["fused"]
    assert compiled.executor.generated, "the fused region was not compiled to C"
    monkeypatch.setenv("TESSERA_CODEGEN", "0")
    g2 = Chain()
    y2 = g2(x, b)
    assert not g2._cache[g2._last_key].executor.generated
    np.testing.assert_allclose(y.numpy(), y2.numpy(), rtol=2e-6, atol=2e-6)


def test_a_step_creating_optimizer_state_runs_without_generated_code():
    # Adam's first step creates its state, which changes the graph's signature: that step
    # runs once, so it is not worth compiling; the steady step is
    from tests.graph._train import train_mlp_against_torch
    first, *steady = train_mlp_against_torch("GELU", "Adam", lr=1e-2)
    assert not first.executor.generated
    assert all(c is steady[0] and c is not first for c in steady)
    assert steady[0].executor.generated


def test_no_compiler_warns_once_and_runs_numpy(monkeypatch):
    import tessera.codegen as codegen
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr(codegen, "_warned", False)
    cc.compiler.cache_clear()
    try:
        x, b = tessera.randn(8, 3), tessera.randn(3)
        with pytest.warns(RuntimeWarning, match="no C compiler"):
            y = Chain()(x, b)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            Chain()(x, b)  # said once only
        want = tessera.sigmoid(tessera.nn.functional.gelu(x * 2 + b)) * x
        np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    finally:
        cc.compiler.cache_clear()


# ---- the disk cache ----------------------------------------------------------------------

_CHILD = """
import tessera
from tessera.codegen import build as runtime
class Chain(tessera.nn.Graph):
    def build(self, x):
        return tessera.nn.functional.gelu(x * 3 + 1).tanh()
x = tessera.ones(5, 7)
y = Chain()(x)
want = tessera.nn.functional.gelu(x * 3 + 1).tanh()
assert (y - want).abs().max().item() < 1e-6
print(runtime.stats["cached"])
"""


def _child(cache_dir) -> bool:
    # without the C dispatch, whose library would share the cache directory
    env = dict(os.environ, TESSERA_CACHE_DIR=str(cache_dir), TESSERA_FASTPATH="0")
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1] == "True"


def test_second_process_hits_the_disk_cache(tmp_path):
    assert _child(tmp_path) is False
    assert _child(tmp_path) is True


def test_corrupt_cache_entry_is_rebuilt(tmp_path):
    assert _child(tmp_path) is False
    (lib,) = [p for p in tmp_path.iterdir() if p.suffix == ".so"]
    good = lib.read_bytes()
    lib.write_bytes(good[: len(good) // 2] + b"garbage")
    assert _child(tmp_path) is False       # rebuilt, not loaded
    assert lib.read_bytes() == good        # same source, same compiler: same library
    assert _child(tmp_path) is True


def test_cache_files_are_complete(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    cc.load("int tsr_probe(void) { return 7; }")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and names[0].endswith(".so") and names[1].endswith(".so.sha256")
    assert cc.load("int tsr_probe(void) { return 7; }").tsr_probe() == 7


def test_compile_error_names_the_compiler_output(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    with pytest.raises(cc.CompileError, match="failed on generated code"):
        cc.load("this is not C")
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".so"]


def _definitions(n: int, pad: int) -> list[str]:
    # each long enough that the whole exceeds PARALLEL_MIN_CHARS; the header's static helper
    # is used by every unit
    return [f"int tsr_unit{i}(int x) {{ /* {'.' * pad} */ return tsr_twice(x) + {i}; }}"
            for i in range(n)]


def test_large_sources_compile_as_parallel_units(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    header = "static int tsr_twice(int x) { return 2 * x; }"
    defs = _definitions(6, cc.PARALLEL_MIN_CHARS // 4)
    units = cc._units([header, *defs])
    assert len(units) == min(6, len(os.sched_getaffinity(0)))
    assert sorted(d for u in units for d in defs if d in u) == sorted(defs)  # each once
    lib = cc.load([header, *defs])
    assert [getattr(lib, f"tsr_unit{i}")(5) for i in range(6)] == [10 + i for i in range(6)]
    # the same program as one string: the same cache entry
    assert cc._key(cc._text([header, *defs]), ()) == cc._key(header + "\n\n" + "\n\n".join(defs)
                                                            + "\n", ())


def test_small_sources_stay_one_unit_unless_told(tmp_path, monkeypatch):
    source = ["static int tsr_twice(int x) { return 2 * x; }",
              "int tsr_f(void) { return tsr_twice(1); }", "int tsr_g(void) { return 3; }"]
    assert len(cc._units(source)) == 1
    # macro instantiations are short lines that expand to much code: the caller says so
    assert len(cc._units(source, split=True)) == min(2, len(os.sched_getaffinity(0)))
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    lib = cc.load(source, split=True)
    assert (lib.tsr_f(), lib.tsr_g()) == (2, 3)


def test_an_error_in_one_parallel_unit_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    defs = _definitions(4, cc.PARALLEL_MIN_CHARS // 2) + ["this is not C"]
    with pytest.raises(cc.CompileError, match="failed on generated code"):
        cc.load(["static int tsr_twice(int x) { return 2 * x; }", *defs])
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".so"]
