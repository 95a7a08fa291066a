"""Binary convolutions of stride 1 in exported libraries and nn.Graph programs run on eager
mode's direct kernels (``tessera.deploy._emit_lowp._direct``): in each of their forms (float
or bit-packed input, float or bit-packed output), with padding -1, 0 and +1, a dilation and
channel counts that are not multiples of 64, on each path the library picks at run time
(AVX-512 VPOPCNTDQ, AVX2 under TESSERA_MAX_ISA=avx2, C under portable), the results are
eager mode's, bit for bit; the emitted C calls the direct kernels where eager does and the
columns where eager does (stride 2)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import tessera
import tessera.nn.binary as bnn
from tessera import nn
from tessera.kernels import binary as KB
from tests.deploy.test_export import build, eager, pytestmark
from tests.deploy.test_max_isa import VARS, _flags

__all__ = ["pytestmark", "forms_net"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def forms_net(pad: int):
    """Every form of a binary convolution, ``pad`` the padding of most: float in, bits out;
    bits in and out (+1 padding, a dilation, 130 channels: three words); bits in, float out;
    float in and out (after a float op); then one of stride 2 (the columns' case)."""
    tessera.manual_seed(5)
    m = nn.Sequential(
        bnn.BinaryConv2d(70, 40, 3, padding=1, scale="channel", pad_value=pad),
        nn.BatchNorm2d(40),
        bnn.BinaryConv2d(40, 130, 3, padding=1, pad_value=pad), nn.BatchNorm2d(130),
        bnn.BinaryConv2d(130, 66, 3, padding=2, dilation=2, pad_value=1), nn.BatchNorm2d(66),
        bnn.BinaryConv2d(66, 20, 3, padding=1, scale="channel", pad_value=pad), nn.PReLU(),
        bnn.BinaryConv2d(20, 24, 3, padding=1, scale="channel", pad_value=pad), nn.PReLU(),
        bnn.BinaryConv2d(24, 8, 3, stride=2, padding=1, pad_value=pad))
    with tessera.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.copy_(tessera.randn(mod.num_features))
                mod.weight.copy_(tessera.randn(mod.num_features))
    model = bnn.pack(m.eval())
    assert [getattr(model[i], "input_bits", False) for i in (0, 2, 4, 6, 8, 10)] == \
        [False, True, True, True, False, False]
    assert [model[i].threshold is not None for i in (0, 2, 4, 6, 8, 10)] == \
        [True, True, True, False, False, False]
    return model


def wide_net():
    """A 1x1 convolution of 32800 channels: too many a sum for the AVX2 bit planes' 16-bit
    counters, so that path runs on its nibble tables."""
    tessera.manual_seed(6)
    return bnn.pack(nn.Sequential(bnn.BinaryConv2d(32800, 12, 1, scale="channel")).eval())


def _env(cap: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    if cap is not None:
        env["TESSERA_MAX_ISA"] = cap
    return env


def _want(cap: str | None) -> str:
    """The binary path eager mode takes under ``cap`` (the library's must be the same)."""
    if cap == "portable":
        return "c"
    if cap == "avx2":
        return "avx2"
    return KB.isa()


def _run(out, name: str, x, cap: str | None, threads: int):
    np.save(out / "in0.npy", x.numpy())
    r = subprocess.run([str(out / f"run_{name}"), str(out / f"{name}.weights"),
                        str(out / "in0.npy"), str(out / "out.npy"), "--threads", str(threads),
                        "--paths"], capture_output=True, text=True, env=_env(cap))
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.split("\n") if ln.startswith("paths "))
    return np.load(out / "out.npy"), dict(w.split("=") for w in line.split()[1:])


@pytest.fixture(scope="module", params=[-1, 0], ids=["pad-1", "pad0"])
def forms(request, tmp_path_factory):
    model = forms_net(request.param)
    x = tessera.randn(2, 70, 9, 10)
    return model, x, build(model, (x,), tmp_path_factory.mktemp("bforms"), "bforms")


@pytest.fixture(autouse=True)
def _no_caps(monkeypatch):
    for k in VARS:
        monkeypatch.delenv(k, raising=False)


def _skip_missing(cap):
    if cap == "avx2" and "avx2" not in _flags():
        pytest.skip("this CPU lacks AVX2")


def test_the_emitted_c_calls_the_direct_kernels(forms):
    """Five convolutions of stride 1 on the direct kernels, the one of stride 2 on the
    columns, as eager runs them."""
    _, _, out = forms
    text = (out / "bforms.c").read_text()
    assert len(re.findall(r"\bbin_direct\(m, ", text)) == 5
    assert len(re.findall(r"\btsr_bin_columns\(", text)) == 2  # its prototype and its call
    assert "tsr_bin_columns_bits(" not in text.split("static int steps(")[1]


@pytest.mark.parametrize("cap", [None, "avx2", "portable"])
def test_library_forms_are_eager_bit_for_bit(forms, cap, monkeypatch):
    _skip_missing(cap)
    model, x, out = forms
    if cap is not None:
        monkeypatch.setenv("TESSERA_MAX_ISA", cap)
    ref = eager(model, (x,))
    for threads in (1, 2):
        got, paths = _run(out, "bforms", x, cap, threads)
        assert paths["binary"] == _want(cap)
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("cap", [None, "avx2", "portable"])
def test_library_on_nibble_tables_is_eager_bit_for_bit(cap, tmp_path, monkeypatch):
    _skip_missing(cap)
    model = wide_net()
    x = tessera.randn(1, 32800, 8, 4)
    out = build(model, (x,), tmp_path, "bwide")
    if cap is not None:
        monkeypatch.setenv("TESSERA_MAX_ISA", cap)
    got, paths = _run(out, "bwide", x, cap, 1)
    assert paths["binary"] == _want(cap)
    np.testing.assert_array_equal(got, eager(model, (x,)))


# the forced program against eager in a process of its own: a program's library picks its
# path once, at its first run, and stays loaded
_PROGRAM = """
import numpy as np, tessera
from tessera import nn
from tessera.deploy.program import ProgramStep
from tests.deploy.test_binary_direct import forms_net

class Forward(nn.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, x):
        return self.model(x)

for pad in (-1, 0):
    model = forms_net(pad)
    x = tessera.randn(2, 70, 9, 10)
    g = Forward(model)
    for threads in (1, 2):
        tessera.set_num_threads(threads)
        with tessera.no_grad():
            ref, got = model(x).numpy(), g(x).numpy()
        assert isinstance(g._current().executor, ProgramStep), g._current().executor
        np.testing.assert_array_equal(got, ref)
print("ok")
"""


@pytest.mark.parametrize("cap", [None, "avx2", "portable"])
def test_forced_program_forms_are_eager_bit_for_bit(cap):
    _skip_missing(cap)
    env = {**_env(cap), "TESSERA_GRAPH_PROGRAM": "1"}
    r = subprocess.run([sys.executable, "-c", _PROGRAM], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-4000:]


def test_plane_lists_are_made_at_load(forms):
    """The AVX2 kernel's plane lists (per channel, up to half its weight bits, as int32
    offsets: 16x the packed bits) are made at load where that path runs, not stored: the
    weights file is the packed model's size, plus the padding's corrections with pad 0."""
    model, _, out = forms
    text = (out / "bforms.c").read_text()
    assert "tsr_bin_planes_lists(" in text and "bin_isa() == 1" in text
    if model[0].pad_value == -1:
        state = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        assert (out / "bforms.weights").stat().st_size <= 1.1 * state + 1024


def test_plane_lists_under_sanitizers(tmp_path, monkeypatch):
    """The plane lists made at load on the AVX2 path, run and freed, under ASan and UBSan."""
    from tests.deploy.test_export import cycles
    _skip_missing("avx2")
    monkeypatch.setenv("TESSERA_MAX_ISA", "avx2")
    cycles(tmp_path, {"model": (forms_net(-1), (tessera.randn(1, 70, 9, 10),))}, 20)
