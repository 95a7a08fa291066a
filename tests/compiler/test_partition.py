"""Ops without a rule for the backend: the graph is cut into clusters, the rest runs on
tessera's executor (printed by ``debug()``), or ``strict=True`` raises naming them;
``tessera.compile`` and ``set_backend``'s checks."""
from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera import nn
from tessera.compiler.partition import BackendUnsupported, Partitioned
from tests.compiler.test_models import BACKENDS

pytest.importorskip("jax")


class Scan(nn.Module):  # polygamma has no to_jax rule
    def forward(self, x):
        return tessera.polygamma(1, x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scan = Scan()

    def forward(self, x):
        return self.fc(self.scan(self.fc(x).relu())).tanh()


class G(nn.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, x):
        return self.model(x)


def test_cut_runs_and_matches_eager(capsys):
    tessera.manual_seed(0)
    model, x = Net(), tessera.randn(3, 4)
    g = G(model)
    g.config.set_backend("xla")
    g.debug()
    got = g(x)
    with tessera.no_grad():
        np.testing.assert_allclose(got.numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    ex = g._current().executor
    assert isinstance(ex, Partitioned)
    assert [s.side for s in ex.segments] == ["backend", "tessera", "backend"]
    out = capsys.readouterr().out
    assert "backend xla: 3 cluster(s)" in out and "polygamma (model.scan)" in out


def test_strict_names_the_ops_and_paths():
    g = G(Net())
    g.config.set_backend("xla", strict=True)
    with pytest.raises(BackendUnsupported, match=r"'to_jax' rule .*polygamma at model\.scan"):
        g(tessera.randn(3, 4))


def test_set_backend_rejects_unknown_names_and_retraces_on_change():
    g = G(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="unknown backend 'jax'.*tessera, tvm, xla"):
        g.config.set_backend("jax")
    x = tessera.ones(1, 2)
    a = g(x)
    g.config.set_backend("xla")
    b = g(x)
    assert g.debug_log() == ["first call", "changed: backend"]
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-6)


def test_compile_retraces_on_new_shapes():
    tessera.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.GELU())
    fast = tessera.compile(model, backend="xla")
    for n in (2, 4, 2):
        x = tessera.randn(n, 3)
        with tessera.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(fast(x).numpy(), want, rtol=1e-5, atol=1e-6)
    # the third call's shapes were compiled by the first
    assert fast.graph.debug_log() == ["first call", "changed: input shapes/dtypes"]
    with pytest.raises(TypeError, match="expected an nn.Module"):
        tessera.compile(lambda x: x)
    with pytest.raises(ValueError, match="unknown backend"):
        tessera.compile(model, backend="inductor")


class Noisy(nn.Graph):
    def build(self, x):
        return x + tessera.rand(4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strict_names_random_ops(backend):
    g = Noisy()
    g.config.set_backend(backend, strict=True)
    with pytest.raises(BackendUnsupported, match=r"rand \(random: draws from tessera's generator"):
        g(tessera.ones(4))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cut", [False, True])
def test_profile_and_memory_stats_on_a_backend(backend, cut):
    """What tessera's own backend reports: the backend's compiled code under its name, the
    ops left to tessera's executor by op name; the variables' bytes."""
    tessera.manual_seed(0)
    model, x = (Net() if cut else nn.Sequential(nn.Linear(4, 4), nn.ReLU())), tessera.randn(3, 4)
    g = G(model)
    g.config.set_backend(backend)
    g(x)
    prof = g.profile(x, steps=2)
    assert backend in prof and all(v >= 0 for v in prof.values())
    assert ("polygamma" in prof) == cut
    stats = g.memory_stats()
    assert stats["backend"] == backend
    assert stats["variable_bytes"] == sum(p.numel() * 4 for p in model.parameters())
    assert stats["intermediate_bytes_peak"] <= stats["intermediate_bytes_naive"]


def test_xla_compiles_without_ynnpack_reduction_fusions(monkeypatch):
    """Every XLA compile of the backend leaves reductions out of YNNPACK's fusions (where
    this JAX has the option), unless the user's XLA_FLAGS set them, and still matches eager
    on a pooling before a linear layer (the shape VGG's classifier has)."""
    from tessera.compiler import xla
    xla._compiler_options.cache_clear()
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=-reduce")
    assert xla._compiler_options() == {}
    xla._compiler_options.cache_clear()
    monkeypatch.delenv("XLA_FLAGS")
    import inspect

    import jax
    if "compiler_options" in inspect.signature(jax.jit).parameters:
        assert xla._compiler_options() == {xla._YNN_OPTION: xla._YNN_TYPES}
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(8 * 49, 5)).eval()
    x = tessera.randn(2, 3, 4, 4)
    with tessera.no_grad():
        want = model(x).numpy()
    got = tessera.compile(model, backend="xla")(x).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    xla._compiler_options.cache_clear()  # (the next compile reads the restored XLA_FLAGS)
