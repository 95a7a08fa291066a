"""TESSERA_MAX_ISA in an exported library: read at load, it caps every kernel family (the
GEMM, attention, the fused regions' AVX2 builds, the INT8 and binary layers) as it caps
eager mode's; the results under each cap match eager mode on the same paths, the library
says which paths ran (run_<name> --paths), and forcing a path above the cap, or an unknown
cap, is an error with a message."""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import tessera
import tessera.nn.binary as bnn
import tessera.nn.functional as F
from tessera import nn
from tessera.kernels import binary as KB, gemm, int8 as K8
from tests.deploy.test_export import build, eager, pytestmark
from tests.deploy.test_lowp import LeNet5, ptq

__all__ = ["pytestmark"]

VARS = ("TESSERA_MAX_ISA", "TESSERA_GEMM_ISA", "TESSERA_INT8_ISA", "TESSERA_BINARY_ISA")


class Attention(nn.Module):
    """Products of six rows and of one (the GEMV), attention, a GELU region."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out, self.head = nn.Linear(16, 48), nn.Linear(16, 16), nn.Linear(16, 5)

    def forward(self, x):
        q, k, v = self.qkv(x).reshape(1, 6, 3, 2, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = F.gelu(self.out(y.transpose(1, 2).reshape(1, 6, 16)))
        return tessera.cat([y.reshape(-1), self.head(x[:, 0]).reshape(-1)])


def _flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((ln for ln in f if ln.startswith("flags")), "").split())
    except OSError:
        return set()


def run(out, name, x, cap=None, **forced):
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    if cap is not None:
        env["TESSERA_MAX_ISA"] = cap
    env.update(forced)
    np.save(out / "in0.npy", x.numpy())
    r = subprocess.run([str(out / f"run_{name}"), str(out / f"{name}.weights"),
                        str(out / "in0.npy"), str(out / "out.npy"), "--paths"],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        return None, r.stderr
    line = next(ln for ln in r.stdout.split("\n") if ln.startswith("paths "))
    paths = dict(w.split("=") for w in line.split()[1:])
    return np.load(out / "out.npy"), paths


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("caps")
    tessera.manual_seed(0)
    attn = Attention().eval()
    xa = tessera.randn(1, 6, 16)
    q = ptq(LeNet5(), (1, 1, 28, 28))
    xq = tessera.randn(2, 1, 28, 28)
    tessera.manual_seed(2)
    b = bnn.pack(nn.Sequential(
        bnn.BinaryConv2d(70, 40, 3, padding=1, scale="channel"), nn.Flatten(),
        bnn.BinaryLinear(40 * 9 * 9, 33)).eval())
    xb = tessera.randn(1, 70, 9, 9)
    return {"attn": (attn, xa, build(attn, (xa,), tmp, "attn")),
            "qnet": (q, xq, build(q, (xq,), tmp, "qnet")),
            "bnet": (b, xb, build(b, (xb,), tmp, "bnet"))}


@pytest.fixture(autouse=True)
def _no_caps(monkeypatch):
    for k in VARS:
        monkeypatch.delenv(k, raising=False)


def _expected(cap):
    """(gemm, int8, binary, regions) paths under ``cap``, as eager mode picks them."""
    flags = _flags()
    avx2 = {"avx2", "fma"} <= flags
    if cap == "portable":
        return "portable", "c", "c", "portable"
    if cap == "avx2":
        return "avx2", "avx2", "avx2", "avx2"
    return gemm.isa(), K8.isa(), KB.isa(), "avx2" if avx2 else "portable"


@pytest.mark.parametrize("cap", [None, "avx2", "portable"])
def test_each_cap(libs, cap, monkeypatch):
    if cap == "avx2" and not {"avx2", "fma"} <= _flags():
        pytest.skip("this CPU lacks AVX2 and FMA")
    want_gemm, want_int8, want_bin, want_regions = _expected(cap)
    model, x, out = libs["attn"]
    got, paths = run(out, "attn", x, cap)
    assert got is not None, paths
    assert paths == {"gemm": want_gemm, "regions": want_regions}
    np.testing.assert_allclose(got, eager(model, (x,)), rtol=1e-4, atol=1e-5)
    model, x, out = libs["qnet"]
    got, paths = run(out, "qnet", x, cap)
    assert got is not None, paths
    assert paths == {"gemm": want_gemm, "int8": want_int8, "regions": want_regions}
    monkeypatch.setenv("TESSERA_INT8_ISA", want_int8)   # eager on the same path, bit for bit
    np.testing.assert_array_equal(got, eager(model, (x,)))
    model, x, out = libs["bnet"]
    got, paths = run(out, "bnet", x, cap)
    assert got is not None, paths
    assert paths == {"gemm": want_gemm, "binary": want_bin, "regions": want_regions}
    np.testing.assert_array_equal(got, eager(model, (x,)))


def test_paths_above_the_cap_and_unknown_caps(libs):
    _, x, out = libs["attn"]
    got, err = run(out, "attn", x, "portable", TESSERA_GEMM_ISA="avx2")
    assert got is None
    if {"avx2", "fma"} <= _flags():
        assert "TESSERA_GEMM_ISA=avx2: TESSERA_MAX_ISA=portable excludes it" in err
    got, err = run(out, "attn", x, "sse9")
    assert got is None and "TESSERA_MAX_ISA=sse9: expected portable, avx2, avx512 or none" in err
    got, paths = run(out, "attn", x, " AVX2 " if "avx2" in _flags() else "None")
    assert got is not None and paths["gemm"] in ("avx2", "portable")
    for name, var, path in (("qnet", "TESSERA_INT8_ISA", "avx2"),
                            ("bnet", "TESSERA_BINARY_ISA", "avx2")):
        _, x, out = libs[name]
        got, err = run(out, name, x, "portable", **{var: path})
        assert got is None
        if {"avx2", "fma"} <= _flags():
            assert f"{var}={path}: TESSERA_MAX_ISA=portable excludes it" in err
