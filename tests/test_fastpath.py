"""The C fast path of dispatch (``tessera/_fastpath.c``) must be the Python dispatch, only
faster: each case runs with the fast path on and off and must give the same values,
dtypes, shapes, autograd graph, gradients, views and errors. The op-info table (against
PyTorch) already runs everything through the fast path, since it is on by default."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tessera
from tessera import _dispatch, _fastpath
from tessera.kernels import cc

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")


@pytest.fixture
def paths():
    """Run ``fn`` with the fast path on, then off; return both results."""
    mod = _fastpath.MODULE

    def run(fn):
        results = []
        for on in (True, False):
            was = mod.set_enabled(on)
            try:
                results.append(fn())
            finally:
                mod.set_enabled(was)
        return results
    return run


def test_dispatch_is_the_c_function_everywhere():
    assert _fastpath.MODULE is not None, "the fast path did not build"
    assert _dispatch.dispatch is _fastpath.MODULE.dispatch
    # every module bound the C function, none kept the Python one by importing too early
    stale = [name for name, mod in list(sys.modules.items())
             if name.startswith("tessera") and name != "tessera._dispatch" and mod is not None
             for attr in ("dispatch", "_dispatch")
             if getattr(mod, attr, None) is _dispatch._py_dispatch]
    assert stale == []


def _describe(t):
    """Everything dispatch decides about a result."""
    if isinstance(t, tuple):
        return tuple(_describe(x) for x in t)
    fn = t.grad_fn
    return (t.detach().numpy().tolist(), t.dtype, tuple(t.shape), t.requires_grad,
            fn.name() if fn is not None else None, t._base is not None, t.is_contiguous())


def _inputs(dtype):
    rng = np.random.default_rng(0)
    x = tessera.tensor(rng.standard_normal((3, 4)), dtype=dtype)
    y = tessera.tensor(rng.standard_normal((4,)), dtype=dtype)
    return x, y


def _packed_conv(x):
    from tessera.ops.binary import binary_pack, packed_binary_conv2d
    words = binary_pack(x.reshape(3, 1, 1, 4)[:, :, :, :2].contiguous().float())
    return packed_binary_conv2d(x.reshape(1, 2, 2, 3), words, x[:, 0].abs(), 2, padding=1)


CASES = {
    "add": lambda x, y: x + y,
    "add alpha": lambda x, y: tessera.add(x, y, alpha=2),
    "sub scalar": lambda x, y: x - 1.5,
    "mul int scalar": lambda x, y: x * 3,
    "rdiv": lambda x, y: 2 / y,
    "pow": lambda x, y: x.abs() ** 0.5,
    "compare": lambda x, y: x > y,
    "sum": lambda x, y: x.sum(),
    "sum dim": lambda x, y: x.sum(1, keepdim=True),
    "sum dims": lambda x, y: x.sum((0, 1)),
    "sum dtype": lambda x, y: x.sum(dtype=tessera.float64),
    "mean": lambda x, y: x.mean(0),
    "argmax": lambda x, y: x.argmax(1),
    "max dim": lambda x, y: tuple(x.max(1)),
    "matmul": lambda x, y: x @ y,
    "view": lambda x, y: x.view(4, 3),
    "transpose": lambda x, y: x.t(),
    "expand": lambda x, y: y.expand(2, 4),
    "index": lambda x, y: x[1:, ::2],
    "exp": lambda x, y: x.exp(),
    "where": lambda x, y: tessera.where(x > 0, x, y),
    "softmax": lambda x, y: tessera.softmax(x, 1),
    "cast": lambda x, y: x.to(tessera.int32),
    "mixed": lambda x, y: x + y.double(),
    # mixed dtypes into ops that do not promote: the C path when nothing requires grad
    "index_select": lambda x, y: x.index_select(1, tessera.tensor([3, 0])),
    "gather": lambda x, y: x.gather(1, tessera.tensor([[0], [2], [1]])),
    "packed binary conv": lambda x, y: _packed_conv(x),
    "cat": lambda x, y: tessera.cat([x, x]),
}


@pytest.mark.parametrize("dtype", [tessera.float32, tessera.float64])
@pytest.mark.parametrize("case", CASES)
def test_same_result(case, dtype, paths):
    fn = CASES[case]
    on, off = paths(lambda: _describe(fn(*_inputs(dtype))))
    assert on == off


@pytest.mark.parametrize("case", ["add", "sum dim", "mean", "matmul", "view", "transpose",
                                  "exp", "softmax", "where", "index", "pow"])
def test_same_graph_and_gradients(case, paths):
    fn = CASES[case]

    def run():
        x, y = _inputs(tessera.float32)
        x.requires_grad_(), y.requires_grad_()
        out = fn(x, y)
        desc = _describe(out)
        out.sum().backward()
        return desc, x.grad.numpy().tolist(), None if y.grad is None else y.grad.numpy().tolist()
    on, off = paths(run)
    assert on == off
    assert on[0][3] is True  # the result requires grad


def test_views_share_storage_and_version(paths):
    def run():
        x, _ = _inputs(tessera.float32)
        v = x.view(12)
        v2 = v.t() if v.dim() == 2 else v.view(3, 4)
        v2[0, 0] = 7.0
        return (x._version[0], v._version is x._version, v2._base is x,
                x[0, 0].item(), len(v2._view_chain))
    on, off = paths(run)
    assert on == off
    assert on[1] and on[2] and on[3] == 7.0


def test_inplace_after_save_is_detected(paths):
    def run():
        x = tessera.ones(3, requires_grad=True)
        y = x * 2
        z = y.exp()   # saves its output
        w = y * y     # saves its inputs
        z.add_(1)
        y.add_(1)
        with pytest.raises(RuntimeError) as e:
            z.sum().backward()
        with pytest.raises(RuntimeError) as e2:
            w.sum().backward()
        assert "modified by an inplace operation" in str(e2.value)
        return "modified by an inplace operation" in str(e.value)
    assert paths(run) == [True, True]


def test_grad_modes(paths):
    def run():
        x = tessera.ones(3, requires_grad=True)
        with tessera.no_grad():
            a = x + x
        with tessera.inference_mode():
            b = x * 2
        return a.requires_grad, a.grad_fn, b.requires_grad, b.is_inference(), \
            (x + x).is_inference()
    on, off = paths(run)
    assert on == off
    assert on == (False, None, False, True, False)


def test_default_dtype_is_part_of_the_memo(paths):
    def run():
        x = tessera.ones(2)
        before = (x * 2).dtype, tessera.arange(3.0).dtype
        prev = tessera.get_default_dtype()
        tessera.set_default_dtype(tessera.float64)
        try:
            after = (x * 2).dtype, (x + tessera.ones(2)).dtype, tessera.arange(3.0).dtype
        finally:
            tessera.set_default_dtype(prev)
        return before, after
    on, off = paths(run)
    assert on == off


@pytest.mark.parametrize("fn, err", [
    (lambda: tessera.ones(2, 3) + tessera.ones(4), RuntimeError),        # infer's error
    (lambda: tessera.ones(3).view(2, 2), RuntimeError),
    (lambda: tessera.ones(3, 2).gather(0, tessera.tensor([[5, 0]])), RuntimeError),  # kernel
    (lambda: tessera.ones(3).sum(4), IndexError),
])
def test_same_errors(fn, err, paths):
    def run():
        with pytest.raises(err) as e:
            fn()
        return type(e.value), str(e.value)
    on, off = paths(run)
    assert on == off


OPERANDS = {
    "tensor": lambda: tessera.tensor([0.5, -2.0]),
    "parameter": lambda: tessera.nn.Parameter(tessera.tensor([0.5, -2.0])),
    "float": lambda: 1.5,
    "int": lambda: 3,
    "bool": lambda: True,
    "numpy scalar": lambda: np.float64(2.0),
    "numpy array": lambda: np.array([1.0, 2.0]),
    "int tensor": lambda: tessera.tensor([1, 2]),
}


@pytest.mark.parametrize("name", ["__add__", "__sub__", "__mul__", "__truediv__"])
@pytest.mark.parametrize("operand", OPERANDS)
def test_operators_match_their_python_methods(name, operand):
    c_method = tessera.Tensor.__dict__[name]
    assert type(c_method).__name__ == "operator"   # the C operator is in place
    x = tessera.tensor([1.0, 4.0], requires_grad=True)
    other = OPERANDS[operand]()

    def outcome(fn):
        try:
            return _describe(fn(x, other))
        except Exception as e:  # x - True raises, as in PyTorch: the same error both ways
            return type(e), str(e)
    assert outcome(lambda a, b: getattr(a, name)(b)) == outcome(c_method.__wrapped__)


def test_operators_keep_python_semantics_for_other_objects():
    x = tessera.ones(2)
    for other in ("a", [1.0, 2.0], None):   # PyTorch raises TypeError for each
        with pytest.raises(TypeError):
            x + other


def test_tracing_still_sees_every_op():
    class Net(tessera.nn.Module):
        def forward(self, x):
            return (x + 1).sum(1).exp()

    class G(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.net = Net()

        def build(self, x):
            return self.net(x)
    x = tessera.ones(2, 3)
    np.testing.assert_allclose(G()(x).numpy(), Net()(x).numpy())


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_switched_off_by_environment():
    r = _python("import tessera; from tessera import _dispatch as d; "
                "print(d.dispatch is d._py_dispatch, (tessera.ones(2) + 1).tolist())",
                TESSERA_FASTPATH="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "[2.0,", "2.0]"]


def test_broken_compiler_falls_back_with_a_warning(tmp_path):
    r = _python("import tessera; from tessera import _dispatch as d; "
                "print(d.dispatch is d._py_dispatch, (tessera.ones(2) + 1).tolist())",
                CC="false", TESSERA_CACHE_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "[2.0,", "2.0]"]
    assert "fast path could not be built" in r.stderr
