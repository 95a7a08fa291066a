"""nn.Graph inference as programs (tessera.deploy.program): zoo models against eager mode and
PyTorch, new weights between calls, a graph cut around an op without a C rule, a corrupt cache
entry, and the switch."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import tessera
import tessera.models as M
from tessera import nn
from tessera.deploy.program import ProgramStep
from tessera.graph.executor import Executor
from tessera.kernels import cc
from tessera.profiler import profile
from tests.models import test_bert as bert_case, test_vision as vision

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="needs a C compiler")


class Forward(nn.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, *args):
        return self.model(*args)


@pytest.fixture
def forced(monkeypatch):
    monkeypatch.setenv("TESSERA_GRAPH_PROGRAM", "1")


@pytest.fixture(autouse=True)
def _threads():
    n = tessera.get_num_threads()
    yield
    tessera.set_num_threads(n)


def _run(graph, *args):
    with tessera.no_grad():
        return graph(*args)


def _executor(graph):
    return graph._current().executor


@pytest.mark.parametrize("name", ["lenet5", "resnet18", "mobilenet_v2"])
def test_vision_models_match_eager_and_torch(name, forced):
    pair = vision.Pair(name)
    model = pair.tess.eval()
    x, _ = pair.inputs(np.float32)
    g = Forward(model)
    for threads in (1, 2):
        tessera.set_num_threads(threads)
        got = _run(g, tessera.from_numpy(x)).numpy()
        assert isinstance(_executor(g), ProgramStep), _executor(g)
        eager = _run(model, tessera.from_numpy(x)).numpy()
        with torch.no_grad():
            ref = pair.torch.eval()(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4 * np.abs(eager).max())
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


class Bert(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.bert = model

    def forward(self, ids, mask):
        hidden, pooled = self.bert(ids, attention_mask=mask)
        return hidden, pooled


def test_bert_matches_eager_and_torch(forced):
    ref, model = bert_case._pair()
    model = Bert(model).eval()
    ids, mask, _ = bert_case._inputs(True, False)
    args = (tessera.from_numpy(ids), tessera.from_numpy(mask))
    g = Forward(model)
    hidden, pooled = (t.numpy() for t in _run(g, *args))
    assert "program" in _executor(g).describe(), _executor(g).describe()
    e_hidden, e_pooled = (t.numpy() for t in _run(model, *args))
    np.testing.assert_allclose(hidden, e_hidden, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pooled, e_pooled, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        t_hidden, t_pooled = ref(torch.from_numpy(ids), torch.from_numpy(mask))
    np.testing.assert_allclose(hidden, t_hidden.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pooled, t_pooled.numpy(), rtol=1e-4, atol=1e-4)


def test_new_weights_between_calls(forced):
    tessera.manual_seed(0)
    model = M.resnet18(num_classes=10).eval()
    x = tessera.randn(1, 3, 32, 32)
    g = Forward(model)
    first = _run(g, x).numpy()
    tessera.manual_seed(1)
    other = M.resnet18(num_classes=10).eval()
    model.load_state_dict(other.state_dict())
    second = _run(g, x).numpy()
    assert isinstance(_executor(g), ProgramStep)
    np.testing.assert_allclose(second, _run(other, x).numpy(), rtol=1e-4, atol=1e-5)
    assert not np.allclose(first, second)
    with tessera.no_grad():  # an in-place update of one parameter
        model.fc.bias.add_(1.0)
    np.testing.assert_allclose(_run(g, x).numpy(), second + 1.0, rtol=1e-4, atol=1e-4)


def test_replaced_variable_array_is_bound_again(forced):
    tessera.manual_seed(0)
    model = MLP().eval()
    x = tessera.randn(3, 20)
    g = Forward(model)
    _run(g, x)
    c = g._current()
    name = next(n for n, t in c.tensors.items() if t is model.fc2.weight)
    arrays = {n: t._data for n, t in c.tensors.items()}
    arrays[name] = np.zeros_like(arrays[name])  # the step reads another array for it
    out, _ = c.executor.run([x._data], arrays)
    b = model.fc2.bias.detach().numpy().astype(np.float64)
    expect = np.broadcast_to(np.exp(b) / np.exp(b).sum(), out[0].shape)
    np.testing.assert_allclose(out[0], expect, rtol=1e-5)


def test_variables_dict_checked_once_per_dict(forced):
    # a step handed the same dict again skips the look at its arrays; another dict (nn.Graph
    # makes one when a variable holds another array) is looked at, and so is the first again
    tessera.manual_seed(0)
    model = MLP().eval()
    x = tessera.randn(3, 20)
    g = Forward(model)
    _run(g, x)
    c = g._current()
    name = next(n for n, t in c.tensors.items() if t is model.fc2.weight)
    first = {n: t._data for n, t in c.tensors.items()}
    zeroed = dict(first, **{name: np.zeros_like(first[name])})
    runs = [c.executor.run([x._data], d)[0][0] for d in (first, first, zeroed, first)]
    with tessera.no_grad():
        expect = model(x).numpy()
    b = model.fc2.bias.detach().numpy().astype(np.float64)
    flat = np.broadcast_to(np.exp(b) / np.exp(b).sum(), expect.shape)
    for out, want in zip(runs, (expect, expect, flat, expect)):
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def _few_pixel_convs(lib):
    """Convolutions with at most four output pixels (a patch embedding, a last stage, one
    grouped and one without bias) that the program runs as the transposed product."""
    n = lib.nn
    return n.Sequential(n.Conv2d(3, 24, 8, 8), n.ReLU(), n.Conv2d(24, 40, 3, 2, 1),
                        n.Conv2d(40, 40, 3, padding=1, groups=2, bias=False), n.ReLU6(),
                        n.Conv2d(40, 16, 1))


@pytest.mark.parametrize("nchwc", ["0", "auto"])   # "0": every one on the GEMM
def test_convolutions_with_few_output_pixels_match_torch(nchwc, forced, monkeypatch):
    monkeypatch.setenv("TESSERA_NCHWC", nchwc)
    tessera.manual_seed(0)
    model = _few_pixel_convs(tessera).eval()
    ref = _few_pixel_convs(torch).eval()
    ref.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in model.state_dict().items()})
    x = tessera.randn(2, 3, 16, 16)
    g = Forward(model)
    with torch.no_grad():
        want = ref(torch.from_numpy(x.numpy())).numpy()
    for threads in (1, 2):
        tessera.set_num_threads(threads)
        got = _run(g, x).numpy()
        assert isinstance(_executor(g), ProgramStep), _executor(g)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(20, 32), nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu()).softmax(-1)


class Cut(nn.Module):
    """Two convolution stacks around a cummax (no C rule)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(*[nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU())
                                 for _ in range(3)])
        self.b = nn.Sequential(*[nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.Tanh())
                                 for _ in range(3)])

    def forward(self, x):
        y = self.a(x)
        return self.b(y.cummax(2)[0] * 0.1) + y


def test_op_without_c_rule_cuts_the_graph(forced, capsys):
    tessera.manual_seed(0)
    model = Cut().eval()
    x = tessera.randn(1, 4, 12, 12)
    g = Forward(model)
    g.debug(0)
    got = _run(g, x).numpy()
    text = _executor(g).describe()
    assert text.count("program ") == 2 and "cummax" in text, text
    assert "programs:" in capsys.readouterr().out
    np.testing.assert_allclose(got, _run(model, x).numpy(), rtol=1e-4, atol=1e-5)
    assert _executor(g).profile(lambda: _run(g, x)).keys() >= {"program", "cummax"}


def test_short_runs_stay_on_the_executor_unless_forced(monkeypatch):
    model = MLP().eval()
    x = tessera.randn(3, 20)
    monkeypatch.delenv("TESSERA_GRAPH_PROGRAM", raising=False)
    g = Forward(model)
    _run(g, x)
    assert isinstance(_executor(g), Executor)  # a few kernels: not worth a compile
    monkeypatch.setenv("TESSERA_GRAPH_PROGRAM", "1")
    g = Forward(model)
    got = _run(g, x).numpy()
    assert isinstance(_executor(g), ProgramStep)
    np.testing.assert_allclose(got, _run(model, x).numpy(), rtol=1e-5, atol=1e-6)


def test_switch_off_runs_the_executor(monkeypatch):
    monkeypatch.setenv("TESSERA_GRAPH_PROGRAM", "0")
    model = M.resnet18(num_classes=10).eval()
    g = Forward(model)
    _run(g, tessera.randn(1, 3, 32, 32))
    assert isinstance(_executor(g), Executor)
    monkeypatch.setenv("TESSERA_GRAPH_PROGRAM", "sometimes")
    with pytest.raises(ValueError, match="TESSERA_GRAPH_PROGRAM"):
        _run(Forward(model), tessera.randn(1, 3, 32, 32))


def test_auto_mode_runs_a_cnn_as_one_program(monkeypatch):
    monkeypatch.delenv("TESSERA_GRAPH_PROGRAM", raising=False)
    model = M.resnet18(num_classes=10).eval()
    x = tessera.randn(1, 3, 32, 32)
    g = Forward(model)
    got = _run(g, x).numpy()
    assert isinstance(_executor(g), ProgramStep)
    np.testing.assert_allclose(got, _run(model, x).numpy(), rtol=1e-4, atol=1e-5)
    with profile() as prof:
        _run(g, x)
    counts = {a.key: a.count for a in prof.key_averages()}
    assert counts["nn.Graph"] == 1 and counts["tessera::program"] == 1


def _corrupt(path: str) -> None:
    """``path`` truncated to half, as by a crash or a full disk (a new file put in its place:
    this process still maps the old one)."""
    with open(path, "rb") as f:
        data = f.read()
    with open(path + ".new", "wb") as f:
        f.write(data[:len(data) // 2])
    os.replace(path + ".new", path)


def test_corrupt_library_is_rebuilt(forced, monkeypatch):
    model = MLP().eval()
    x = tessera.randn(5, 20)  # a program no other test loads into this process
    expect = _run(model, x).numpy()
    g = Forward(model)
    np.testing.assert_allclose(_run(g, x).numpy(), expect, rtol=1e-5, atol=1e-6)
    key = _executor(g).program.key
    lib = os.path.join(cc._folder(cc.cache_dir()), f"tsr_{key}.so")
    _corrupt(lib)
    monkeypatch.delitem(cc._LOADED, key)  # as in a new process: not loaded yet
    g = Forward(model)
    got = _run(g, x).numpy()
    assert _executor(g).program.key == key and _executor(g).program.cached is False
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)


def test_convolutions_run_as_winograd_stay_on_the_executor(monkeypatch):
    """A 3x3 layer large enough for the executor's Winograd is cut out of the program in
    auto mode (programs have no Winograd), and kept in it when forced."""
    from tessera.deploy import program
    from tessera.graph.passes.nchwc import WINOGRAD_MACS
    from tessera.graph.trace import trace
    w = tessera.randn(64, 64, 3, 3)
    x = tessera.randn(8, 64, 56, 56)
    g, _ = trace(lambda t: tessera.nn.functional.conv2d(t, w, padding=1), x)
    conv = next(n for n in g.nodes if n.op.name == "conv")
    assert 8 * 56 * 56 * 64 * 64 * 9 >= WINOGRAD_MACS and program._winograd(conv)
    small, _ = trace(lambda t: tessera.nn.functional.conv2d(t, w, padding=1), x[:1, :, :8, :8])
    assert not program._winograd(next(n for n in small.nodes if n.op.name == "conv"))
    declined: dict = {}
    program._choose(g, {}, False, declined)
    assert declined[id(conv)] == "the executor runs it as Winograd"
    declined = {}
    program._choose(g, {}, True, declined)
    assert declined.get(id(conv)) != "the executor runs it as Winograd"
