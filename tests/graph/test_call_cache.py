"""nn.Graph's per-call checks: a compiled step is reused while its modules are unchanged
and compiled again when a train/eval mode, a variable's value or a module's parameter,
buffer or submodule changes between calls; each call matches eager mode."""
from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera import nn

RNG = np.random.default_rng(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.act = nn.ReLU()
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(self.act(self.bn(self.conv(x))).flatten(1))


class G(nn.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, x):
        return self.model(x)


def _x(n=2):
    return tessera.from_numpy(RNG.standard_normal((n, 3, 6, 6)).astype(np.float32))


def _check(g, model, x):
    with tessera.no_grad():
        got = g(x).numpy()
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.fixture
def setup():
    tessera.manual_seed(0)
    model = Net().eval()
    with tessera.no_grad():  # running statistics other than the defaults
        model.bn.running_mean.copy_(tessera.from_numpy(RNG.standard_normal(4).astype(np.float32)))
        model.bn.running_var.copy_(tessera.from_numpy(RNG.uniform(0.5, 2, 4).astype(np.float32)))
    g = G(model)
    x = _x()
    _check(g, model, x)
    _check(g, model, x)
    assert len(g.debug_log()) == 1  # the second call reused the first's step
    return g, model, x


def test_mode_switch_recompiles(setup):
    g, model, x = setup
    # train mode: batch statistics, and the running ones updated; a copy runs eagerly
    twin = Net()
    twin.load_state_dict(model.state_dict())
    model.train()
    with tessera.no_grad():
        got = g(x).numpy()
        want = twin(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model.bn.running_mean.numpy(), twin.bn.running_mean.numpy(),
                               rtol=1e-5, atol=1e-6)
    assert "train/eval" in g.debug_log()[-1]
    model.bn.eval()  # one submodule's mode
    _check(g, model, x)
    model.eval()
    _check(g, model, x)


def test_load_state_dict_between_calls(setup):
    g, model, x = setup
    other = Net()
    other.bn.running_var.fill_(3.0)
    model.load_state_dict(other.state_dict())
    _check(g, model, x)
    assert "folded" in g.debug_log()[-1]


def test_replaced_parameter_buffer_and_submodule(setup):
    g, model, x = setup
    w = RNG.standard_normal(tuple(model.conv.weight.shape)).astype(np.float32)
    model.conv.weight = nn.Parameter(tessera.from_numpy(w))
    _check(g, model, x)
    assert "replaced" in g.debug_log()[-1]
    model.bn.running_mean = tessera.from_numpy(RNG.standard_normal(4).astype(np.float32))
    _check(g, model, x)
    model.act = nn.Tanh()  # no parameters: the module itself is another
    _check(g, model, x)
    model.fc.weight.data = tessera.from_numpy(
        RNG.standard_normal(tuple(model.fc.weight.shape)).astype(np.float32))
    _check(g, model, x)
    n = len(g.debug_log())
    model.conv.extra = 1  # not a module, parameter or buffer: the step stays
    _check(g, model, x)
    assert len(g.debug_log()) == n


def test_in_place_update_between_calls(setup):
    g, model, x = setup
    with tessera.no_grad():
        model.conv.weight.mul_(2.0)
    _check(g, model, x)
    with tessera.no_grad():
        model.fc.bias.add_(1.0)
        model.bn.running_var.mul_(0.5)
    _check(g, model, x)


def test_new_input_shape_then_back(setup):
    g, model, x = setup
    _check(g, model, _x(3))
    _check(g, model, x)
    assert len(g.debug_log()) == 2  # the first shape's step was kept


def test_container_edit_recompiles():
    tessera.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3)).eval()
    g = G(model)
    x = tessera.from_numpy(RNG.standard_normal((2, 4)).astype(np.float32))
    _check(g, model, x)
    del model[1]
    _check(g, model, x)
    model.insert(1, nn.Tanh())
    _check(g, model, x)
    model[1] = nn.Sigmoid()
    _check(g, model, x)
