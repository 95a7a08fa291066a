"""The rules of tessera/deploy/_emit_more.py, each exported, built with -Werror and run
through the C driver against tessera eager (rtol 1e-4, atol 1e-5): p-norms and
F.normalize, 1-d and 3-d convolutions (grouped, strided, dilated, with a fused ReLU),
transposed convolutions (a DCGAN generator), interpolation in each mode, average pooling,
constant padding."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import tessera
import tessera.models as M
import tessera.nn.functional as F
from tessera import nn
from tests.deploy.test_export import build, eager, run_driver

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")


class Flat(nn.Module):
    """Several results of one input, flattened and concatenated: one output to compare."""

    def __init__(self, *fns, **modules):
        super().__init__()
        self.fns = fns
        for k, m in modules.items():
            setattr(self, k, m)

    def forward(self, x):
        return tessera.cat([f(self, x).reshape(-1) for f in self.fns])


def check(model, shape, tmp_path, name, threads=1):
    tessera.manual_seed(3)
    model = model.eval()
    x = (tessera.randn(*shape),)
    # one library name for every check (its folder is ``name``): the runtime and gemm.c
    # then compile once per run (tests/deploy/_cc_cache.py)
    out = build(model, x, tmp_path, "model", folder=name)
    np.testing.assert_allclose(run_driver(out, "model", x, threads=threads), eager(model, x),
                               rtol=1e-4, atol=1e-5)


def test_norms(tmp_path):
    check(Flat(lambda s, x: F.normalize(x, dim=1),
               lambda s, x: F.normalize(x, p=1.0, dim=-1),
               lambda s, x: x.norm(p=3, dim=(1, 2)),
               lambda s, x: x.norm(p=float("inf"), dim=2, keepdim=True),
               lambda s, x: tessera.linalg.vector_norm(x, ord=0.5, dim=0),
               lambda s, x: x.norm()),
          (2, 6, 5), tmp_path, "norms")


def test_convolutions_1d_and_3d(tmp_path):
    tessera.manual_seed(4)
    c1 = nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2)
    dw = nn.Conv1d(4, 4, 5, padding=2, groups=4, bias=False)
    check(Flat(lambda s, x: s.c1(x).relu(), lambda s, x: s.dw(x), c1=c1, dw=dw),
          (2, 4, 17), tmp_path, "conv1d", threads=2)
    c3 = nn.Conv3d(4, 6, (3, 2, 3), stride=(1, 2, 1), padding=(1, 0, 1), groups=2)
    check(Flat(lambda s, x: s.c3(x), lambda s, x: F.relu(s.c3(x) + 1.0), c3=c3),
          (1, 4, 5, 6, 7), tmp_path, "conv3d")


def test_transposed_convolutions(tmp_path):
    tessera.manual_seed(5)
    t2 = nn.ConvTranspose2d(4, 6, 4, stride=2, padding=1, groups=2)
    t1 = nn.ConvTranspose1d(4, 3, 3, stride=3, padding=1, output_padding=1)
    check(Flat(lambda s, x: s.t2(x), t2=t2), (2, 4, 5, 6), tmp_path, "convt2d", threads=2)
    check(Flat(lambda s, x: s.t1(x[:, :, 0]), t1=t1), (2, 4, 5, 6), tmp_path, "convt1d")
    gen, _ = M.dcgan(nz=16, ngf=8, ndf=8, nc=1)
    check(gen, (1, 16, 1, 1), tmp_path, "dcgan")


MODES = [
    lambda s, x: F.interpolate(x, scale_factor=2, mode="nearest"),
    lambda s, x: F.interpolate(x, size=(7, 11), mode="nearest"),
    lambda s, x: F.interpolate(x, size=(7, 11), mode="nearest-exact"),
    lambda s, x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
    lambda s, x: F.interpolate(x, size=(7, 11), mode="bilinear", align_corners=True),
    lambda s, x: F.interpolate(x, size=(9, 4), mode="bicubic", align_corners=False),
    lambda s, x: F.interpolate(x, size=(9, 4), mode="bicubic", align_corners=True),
    lambda s, x: F.interpolate(x, size=(3, 4), mode="area"),
    lambda s, x: F.interpolate(x[:, 0], size=13, mode="linear"),
    lambda s, x: F.interpolate(x[:, 0], scale_factor=1.5, mode="nearest"),
    lambda s, x: F.interpolate(x[None], size=(5, 8, 9), mode="trilinear"),
    lambda s, x: F.interpolate(x, size=(2, 5), mode="area"),
]


def test_interpolation_modes(tmp_path):
    check(Flat(*MODES), (2, 3, 5, 6), tmp_path, "interp")


def test_average_pooling_and_padding(tmp_path):
    check(Flat(lambda s, x: F.avg_pool2d(x, 3, stride=2, padding=1),
               lambda s, x: F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True,
                                         count_include_pad=False),
               lambda s, x: F.avg_pool2d(x, 2, divisor_override=3),
               lambda s, x: F.avg_pool1d(x[:, 0], 3, stride=1, padding=1),
               lambda s, x: F.avg_pool3d(x[None], (1, 2, 2)),
               lambda s, x: F.pad(x, (1, 2, 0, 3)),
               lambda s, x: F.pad(x, (2, 1), value=-0.5),
               lambda s, x: nn.ConstantPad3d((1, 0, 0, 1, 2, 0), 1.5)(x)),
          (2, 3, 7, 6), tmp_path, "pool")


def test_im2col_split_over_threads(tmp_path):
    """A convolution whose columns are big enough to be built by both threads (each a share
    of the rows), with one thread and two."""
    tessera.manual_seed(6)
    conv = nn.Conv2d(16, 32, 3, padding=1)
    check(Flat(lambda s, x: s.conv(x).relu(), conv=conv), (1, 16, 64, 64), tmp_path, "split",
          threads=2)
    check(Flat(lambda s, x: s.conv(x).relu(), conv=conv), (1, 16, 64, 64), tmp_path, "one")


def test_loops_split_over_threads(tmp_path):
    """1-d convolution's im2col, transposed convolution's col2im, interpolation and average
    pooling big enough to share their rows out over two threads."""
    tessera.manual_seed(7)
    c1 = nn.Conv1d(32, 16, 3, padding=1)
    t1 = nn.ConvTranspose1d(32, 16, 5, stride=2, padding=1)
    model = Flat(lambda s, x: s.c1(x).relu(), lambda s, x: s.t1(x),
                 lambda s, x: F.interpolate(x, scale_factor=2, mode="linear"),
                 lambda s, x: F.avg_pool3d(x[:, None, None], (1, 2, 2), stride=1), c1=c1, t1=t1)
    check(model, (2, 32, 4096), tmp_path, "loops", threads=2)
    text = (tmp_path / "loops" / "model.c").read_text()
    for helper in ("tsr_im2col3d", "tsr_col2im3d", "tsr_resample", "tsr_avgpool3d"):
        assert f"tsr_pool_run({helper}_item" in text, helper
