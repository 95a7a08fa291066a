"""TESSERA_MAX_ISA: every kernel family picks its widest path within the cap, the libraries
compiled under it hold no AVX-512 instruction (no zmm register in the disassembly), and the
results still match PyTorch (and the NumPy definitions of the INT8 and binary products).
Each cap runs in a fresh process, since the families choose once per process."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tessera.kernels import cc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [
    pytest.mark.skipif(cc.compiler() is None, reason="no C compiler"),
    pytest.mark.skipif(os.uname().machine not in ("x86_64", "amd64"),
                       reason="the caps name x86-64 instruction sets"),
]

_CHILD = r"""
import os, subprocess
import numpy as np
import torch
import tessera
import tessera.nn.functional as F
from tessera.kernels import attention, binary, cc, gemm, int8

def zmm(key):
    path = os.path.join(cc._folder(cc.cache_dir()), f"tsr_{key}.so")
    text = subprocess.run(["objdump", "-d", path], capture_output=True, text=True).stdout
    return text.count("%zmm")

print("isa", cc.max_isa(), gemm.isa(), attention.isa(), int8.isa(), binary.isa())
rng = np.random.default_rng(0)
t = lambda a: tessera.from_numpy(a)

# GEMM with its epilogue, against PyTorch
a = rng.standard_normal((70, 130)).astype(np.float32)
w = rng.standard_normal((50, 130)).astype(np.float32)
b = rng.standard_normal(50).astype(np.float32)
want = torch.relu(torch.nn.functional.linear(torch.from_numpy(a), torch.from_numpy(w),
                                             torch.from_numpy(b))).numpy()
got = gemm.gemm(a, w, trans_b=True, bias=b, activation="relu")
np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

# attention (causal), convolutions (dense and depthwise), an elementwise chain
q, k, v = (rng.standard_normal((2, 3, 40, 16)).astype(np.float32) for _ in range(3))
want = torch.nn.functional.scaled_dot_product_attention(
    torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), is_causal=True).numpy()
got = F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True).numpy()
np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
x = rng.standard_normal((2, 16, 20, 20)).astype(np.float32)
for groups, cin in ((1, 16), (16, 1)):
    wc = rng.standard_normal((16, cin, 3, 3)).astype(np.float32)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wc), padding=1,
                                      groups=groups).numpy()
    got = F.conv2d(t(x), t(wc), padding=1, groups=groups).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
e = rng.standard_normal(1 << 16).astype(np.float32)
got = (tessera.exp(t(e)) * 2 + 1).numpy()
np.testing.assert_allclose(got, (torch.exp(torch.from_numpy(e)) * 2 + 1).numpy(), rtol=1e-6)
print("zmm elementwise", zmm(cc.last_build["key"]))

# INT8 and binary products against their NumPy definitions
a8 = rng.integers(0, 128, (33, 70), dtype=np.uint8)
w8 = rng.integers(-128, 128, (20, 70), dtype=np.int8)
mult = np.full(20, 1e-3, np.float32)
got = int8.gemm(a8, w8, a_zp=3, mult=mult, out_dtype=np.float32)
np.testing.assert_array_equal(got, int8.reference(a8, w8, a_zp=3, mult=mult,
                                                  out_dtype=np.float32))
xb = rng.standard_normal((9, 200)).astype(np.float32)
wb = binary.packbits(rng.standard_normal((30, 200)))
np.testing.assert_array_equal(binary.linear(xb, wb, 200), binary.reference_linear(xb, wb, 200))
xc = rng.standard_normal((1, 70, 6, 6)).astype(np.float32)
wcb = binary.packbits(rng.standard_normal((8, 3, 3, 70)))
np.testing.assert_array_equal(binary.conv2d(xc, wcb, 70, padding=(1, 1)),
                              binary.reference_conv2d(xc, wcb, 70, padding=(1, 1)))

# a generated graph kernel (nn.Graph's fused MLP)
class G(tessera.nn.Graph):
    def __init__(self, m):
        super().__init__()
        self.m = m
    def build(self, x):
        return self.m(x)

tessera.manual_seed(0)
m = tessera.nn.Sequential(tessera.nn.Linear(64, 32), tessera.nn.GELU(), tessera.nn.Linear(32, 8))
xg = t(rng.standard_normal((16, 64)).astype(np.float32))
from tessera.codegen import build as codegen
yg = G(m)(xg).detach().numpy()
assert codegen.stats.get("kernels"), codegen.stats
print("zmm graph", zmm(cc.last_build["key"]))
np.testing.assert_allclose(yg, m(xg).detach().numpy(), rtol=1e-5, atol=1e-5)

# a 64-byte vector type: one zmm operation wherever AVX-512 is allowed, two ymm ones otherwise
cc.load("typedef float v16 __attribute__((vector_size(64)));\n"
        "void tsr_probe(v16* a, const v16* b) { *a = *a * *b + *b; }\n")
print("zmm probe", zmm(cc.last_build["key"]))
print("ok")
"""


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f
                         if line.startswith("flags")), set())
    except OSError:
        return set()


def _child(cap: str | None, cache: str) -> dict:
    env = dict(os.environ, TESSERA_CACHE_DIR=cache)
    for name in ("TESSERA_MAX_ISA", "TESSERA_GEMM_ISA", "TESSERA_ATTN_ISA", "TESSERA_INT8_ISA",
                 "TESSERA_BINARY_ISA"):
        env.pop(name, None)
    if cap is not None:
        env["TESSERA_MAX_ISA"] = cap
    proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                          text=True, timeout=1200, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.split("\n")
    assert "ok" in lines, proc.stdout
    out = {}
    for line in lines:
        words = line.split()
        if words[:1] == ["isa"]:
            out["cap"], *out["paths"] = words[1:]
        elif words[:1] == ["zmm"]:
            out[words[1]] = int(words[2])
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("kernels"))


needs_objdump = pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump")


@needs_objdump
def test_avx2_cap(cache):
    flags = _cpu_flags()
    if not {"avx2", "fma"} <= flags:
        pytest.skip("this CPU lacks AVX2 and FMA")
    got = _child("avx2", cache)
    assert got["cap"] == "avx2"
    assert got["paths"] == ["avx2", "avx2", "avx2", "avx2"]   # gemm, attention, int8, binary
    assert got["elementwise"] == got["graph"] == got["probe"] == 0


@needs_objdump
def test_portable_cap(cache):
    got = _child("none", cache)
    assert got["cap"] == "portable"
    assert got["paths"] == ["portable", "portable", "c", "c"]
    assert got["elementwise"] == got["graph"] == got["probe"] == 0


@needs_objdump
def test_no_cap_uses_avx512(cache):
    if "avx512f" not in _cpu_flags():
        pytest.skip("this CPU lacks AVX-512F")
    got = _child(None, cache)
    assert got["cap"] == "avx512" and got["paths"][:2] == ["avx512", "avx512"]
    assert got["probe"] > 0    # the probe tells an AVX-512 build from a capped one


def test_flags_and_names(monkeypatch):
    monkeypatch.setenv("TESSERA_MAX_ISA", "AVX2")
    assert cc.max_isa() == "avx2" and "-mno-avx512f" in cc.isa_flags()
    monkeypatch.setenv("TESSERA_MAX_ISA", "none")
    assert cc.max_isa() == "portable" and "-march=x86-64" in cc.isa_flags()
    monkeypatch.setenv("TESSERA_MAX_ISA", "avx512")
    assert cc.isa_flags() == ()
    monkeypatch.setenv("TESSERA_MAX_ISA", "sse9")
    with pytest.raises(ValueError, match="TESSERA_MAX_ISA='sse9': expected one of portable, "
                                         "avx2, avx512"):
        cc.max_isa()


def test_forcing_a_path_above_the_cap(monkeypatch):
    from tessera.kernels import binary, int8
    if "vnni512" not in int8.available() or "vpopcnt" not in binary.available():
        pytest.skip("this CPU lacks AVX-512 VNNI or VPOPCNTDQ")
    monkeypatch.setenv("TESSERA_MAX_ISA", "avx2")
    assert "vnni512" not in int8.available() and "vpopcnt" not in binary.available()
    monkeypatch.setenv("TESSERA_INT8_ISA", "vnni512")
    with pytest.raises(RuntimeError, match="TESSERA_INT8_ISA='vnni512': TESSERA_MAX_ISA=avx2 "
                                           "excludes it"):
        int8.isa()
    monkeypatch.setenv("TESSERA_BINARY_ISA", "vpopcnt")
    with pytest.raises(RuntimeError, match="TESSERA_MAX_ISA=avx2 excludes it"):
        binary.isa()


def test_forcing_gemm_above_the_cap():
    if "avx512f" not in _cpu_flags():
        pytest.skip("this CPU lacks AVX-512F")
    env = dict(os.environ, TESSERA_MAX_ISA="avx2", TESSERA_GEMM_ISA="avx512")
    proc = subprocess.run([sys.executable, "-c", "from tessera.kernels import gemm; gemm.isa()"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 1
    assert "RuntimeError: TESSERA_GEMM_ISA=avx512: TESSERA_MAX_ISA=avx2 excludes it" \
        in proc.stderr
