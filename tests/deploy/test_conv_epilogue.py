"""tessera.deploy.export_c of convolutions with fused epilogues (``conv_pointwise``: bias,
relu or clamp, a residual inside or after the activation, all in the GEMM's epilogue), run
on every GEMM path the CPU has, against tessera eager."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import tessera
from tessera import nn
from tests.deploy.test_export import build, eager, run_driver

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")


class Net(nn.Module):
    """ResNet's block (relu after the residual), MobileNetV2's (relu6, then a projection
    plus the residual after it) and a 1x1 and a stride-2 layer."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU6())
        self.c1 = nn.Sequential(nn.Conv2d(32, 32, 3, 1, 1), nn.BatchNorm2d(32))
        self.expand = nn.Sequential(nn.Conv2d(32, 64, 1), nn.ReLU())
        self.project = nn.Conv2d(64, 32, 1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.stem(x)
        x = (self.c1(x) + x).relu()
        x = self.project(self.expand(x)) + x
        return self.head(x.mean((2, 3)))


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    tessera.manual_seed(3)
    model = Net().eval()
    with tessera.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(tessera.randn(m.num_features) * 0.1)
                m.running_var.copy_(tessera.rand(m.num_features) + 0.5)
    x = tessera.randn(1, 3, 32, 32)
    mp = pytest.MonkeyPatch()
    mp.setenv("TESSERA_NCHWC", "0")   # the GEMM's epilogues (tests/deploy/test_nchwc.py: blocked)
    try:
        return model, x, build(model, (x,), tmp_path_factory.mktemp("epi"), "epi")
    finally:
        mp.undo()


def test_epilogues_are_in_the_gemm(net):
    _, _, out = net
    src = "".join(p.read_text() for p in out.glob("*.c"))
    assert "tsr_add_row_bias(" not in src.replace("void tsr_add_row_bias(", "")
    if "conv_pointwise" in src:
        assert "TSR_ACT_CLAMP" in src and "TSR_GEMM_RESIDUAL_FIRST" in src


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512"])
def test_every_gemm_path(isa, net):
    from tessera.kernels import gemm
    model, x, out = net
    if not gemm._lib().tsr_gemm_isa_supported(gemm.ISAS.index(isa)):
        pytest.skip(f"this CPU lacks {isa}")
    env = {**os.environ, "TESSERA_GEMM_ISA": isa}
    for threads in (1, 2):
        np.testing.assert_allclose(run_driver(out, "epi", (x,), env=env, threads=threads),
                                   eager(model, (x,)), rtol=1e-4, atol=1e-5)

