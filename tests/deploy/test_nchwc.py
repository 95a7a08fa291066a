"""tessera.deploy.export_c of blocked-layout graphs (``tessera.graph.passes.nchwc``): the
convolutions, pooling and layout changes as calls of kernels/c/nchwc.c, the packed weights
in the weights file; built with -Werror, run on every instruction-set path the CPU has and
on one and two threads, against tessera eager."""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

import tessera
from tessera import nn
from tests.deploy.test_export import build, eager, run_driver

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")


class Net(nn.Module):
    """A plain-input stem, max pooling, a residual block, an inverted residual (depthwise,
    relu6), a plain reader of a blocked value, average and global pooling."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 20, 3, 2, 1), nn.BatchNorm2d(20), nn.ReLU())
        self.c1 = nn.Sequential(nn.Conv2d(20, 20, 3, 1, 1), nn.BatchNorm2d(20))
        self.expand = nn.Sequential(nn.Conv2d(20, 40, 1), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(40, 40, 3, 1, 1, groups=40), nn.ReLU6())
        self.project = nn.Conv2d(40, 20, 1)
        self.head = nn.Linear(20, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(self.stem(x), 3, 2, 1)
        x = (self.c1(x) + x).relu()
        x = self.project(self.dw(self.expand(x))) + x
        side = x.tanh().mean((2, 3))
        x = nn.functional.avg_pool2d(x, 2, 2, ceil_mode=True, count_include_pad=False)
        g = nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(g) + self.head(side)


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    tessera.manual_seed(5)
    model = Net().eval()
    with tessera.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(tessera.randn(m.num_features) * 0.1)
                m.running_var.copy_(tessera.rand(m.num_features) + 0.5)
    x = tessera.randn(2, 3, 33, 31)
    mp = pytest.MonkeyPatch()
    mp.setenv("TESSERA_NCHWC", "1")
    mp.setenv("TESSERA_NCHWC_WINOGRAD", "0")   # (direct convolutions: ``wino`` is Winograd)
    try:
        out = build(model, (x,), tmp_path_factory.mktemp("nchwc"), "blk")
    finally:
        mp.undo()
    return model, x, out


def test_the_program_runs_the_blocked_kernels(net):
    _, _, out = net
    src = (out / "blk.c").read_text()
    for call in ("tsr_nchwc_conv_plan", "tsr_nchwc_pool_plan", "tsr_nchwc_from_blocked"):
        assert call in src, call
    assert "TSR_NCHWC_PLAIN_INPUT" in src and "tsr_gemm_pack_b" in src
    assert "im2col_f32(" not in src.replace("IM2COL_BLOCK(float, im2col_f32)", "")


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512"])
def test_every_path_and_thread_count(isa, net):
    from tessera.kernels import gemm
    model, x, out = net
    if not gemm._lib().tsr_gemm_isa_supported(gemm.ISAS.index(isa)):
        pytest.skip(f"this CPU lacks {isa}")
    env = {**os.environ, "TESSERA_GEMM_ISA": isa}
    for threads in (1, 2, 3, 7):   # (the tiles compiled in serve every split of the rows)
        np.testing.assert_allclose(run_driver(out, "blk", (x,), env=env, threads=threads),
                                   eager(model, (x,)), rtol=1e-4, atol=1e-5)


def test_the_build_compiles_only_the_tiles_its_layers_run(net):
    _, _, out = net
    assert '#define TSR_NCHWC_TILES "nchwc_tiles.h"' in (out / "tsr_nchwc.c").read_text()
    tiles = (out / "nchwc_tiles.h").read_text()
    wide = "p.block = 16;" in (out / "blk.c").read_text()
    assert f"#define TSR_NCHWC_AVX512 {int(wide)}" in tiles
    assert f"#define TSR_NCHWC_AVX2 {int(not wide)}" in tiles
    assert tiles.count("M(") < 60   # of ~350 instances


def test_a_tile_left_out_is_an_error_not_a_crash(net, tmp_path):
    from tessera.kernels import gemm
    _, x, out = net
    folder = tmp_path / "cut"
    shutil.copytree(out, folder)
    subprocess.run(["make", "-s", "-C", str(folder), "clean"], check=True)
    head = folder / "nchwc_tiles.h"
    isa = "avx512" if "TSR_NCHWC_AVX512 1" in head.read_text() else "avx2"
    lines = head.read_text().splitlines()
    kept = "#define TSR_NCHWC_K" + ("512" if isa == "avx512" else "256")
    at = next(i for i, line in enumerate(lines) if line.startswith(kept))
    while lines[at].endswith("\\"):   # the row tiles' list emptied
        del lines[at + 1]
        lines[at] = lines[at].rstrip("\\").rstrip()
    head.write_text("\n".join(lines) + "\n")
    r = subprocess.run(["make", "-s", "-j2", "-C", str(folder)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    np.save(folder / "in0.npy", x.numpy())
    if not gemm._lib().tsr_gemm_isa_supported(gemm.ISAS.index(isa)):
        pytest.skip(f"this CPU lacks {isa}")
    r = subprocess.run([str(folder / "run_blk"), str(folder / "blk.weights"),
                        str(folder / "in0.npy"), str(folder / "out.npy")], capture_output=True,
                       text=True, env={**os.environ, "TESSERA_GEMM_ISA": isa})
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "register tile of the blocked convolution left out of this build" in r.stderr


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512"])
def test_a_model_of_8_channel_blocks(isa, tmp_path, monkeypatch):
    """Exported where the AVX2 path runs (B = 8): its tiles, on every path (avx512 runs the
    AVX2 tiles with B = 8)."""
    from tessera.graph.passes import nchwc as nchwc_pass
    from tessera.kernels import gemm
    if not gemm._lib().tsr_gemm_isa_supported(gemm.ISAS.index(isa)):
        pytest.skip(f"this CPU lacks {isa}")
    monkeypatch.setenv("TESSERA_NCHWC", "1")
    monkeypatch.setattr(nchwc_pass, "block", lambda: 8)
    tessera.manual_seed(3)
    model = Net().eval()
    x = tessera.randn(1, 3, 29, 35)
    out = build(model, (x,), tmp_path, "b8")
    tiles = (out / "nchwc_tiles.h").read_text()
    assert "#define TSR_NCHWC_AVX2 1" in tiles and "#define TSR_NCHWC_AVX512 0" in tiles
    env = {**os.environ, "TESSERA_GEMM_ISA": isa}
    for threads in (1, 2, 5):
        np.testing.assert_allclose(run_driver(out, "b8", (x,), env=env, threads=threads),
                                   eager(model, (x,)), rtol=1e-4, atol=1e-5)


def test_resnet18_matches_eager(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_NCHWC", "1")
    tessera.manual_seed(0)
    model = tessera.models.resnet18().eval()
    x = tessera.randn(1, 3, 64, 64)
    out = build(model, (x,), tmp_path, "r18")
    assert "tsr_nchwc_conv_plan" in (out / "r18.c").read_text()
    # its Winograd layers' filters are made at load: the weights file is the parameters'
    # size (batch norms folded), not 4x theirs
    assert "TSR_NCHWC_WINOGRAD" in (out / "r18.c").read_text()
    assert (out / "r18.weights").stat().st_size <= 1.005 * _state_bytes(model)
    want = eager(model, (x,))
    np.testing.assert_allclose(run_driver(out, "r18", (x,), threads=2), want, rtol=1e-4,
                               atol=1e-4 * np.abs(want).max())


@pytest.fixture(scope="module")
def wino(tmp_path_factory):
    """``Net`` with its blocked 3x3 stride-1 layer run as Winograd (forced: its 9x8 output is
    under the auto rule's size), on a batch whose runs of tiles cross images."""
    tessera.manual_seed(6)
    model = Net().eval()
    x = tessera.randn(3, 3, 33, 31)
    mp = pytest.MonkeyPatch()
    mp.setenv("TESSERA_NCHWC", "1")
    mp.setenv("TESSERA_NCHWC_WINOGRAD", "1")
    try:
        out = build(model, (x,), tmp_path_factory.mktemp("wino"), "win")
    finally:
        mp.undo()
    return model, x, out


def _state_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def test_winograd_filters_are_made_at_load(net, wino):
    """The weights file holds the Winograd layer's plain 3x3 weights (20 x 20 x 9 floats),
    not their transforms (36 x 32 x 32 floats: U of 16-channel blocks): the file is the
    direct convolutions' file (the same model) with that layer's blocked 3x3 weights (32 x 32
    x 9 floats in 16-channel blocks, 24 x 24 x 9 in 8-channel ones) in place of its plain
    ones."""
    _, _, out = wino
    size = (out / "win.weights").stat().st_size
    assert "TSR_NCHWC_WINOGRAD" in (out / "win.c").read_text()
    direct = (net[2] / "blk.weights").stat().st_size
    block = 16 if "p.block = 16;" in (net[2] / "blk.c").read_text() else 8
    c = -(-20 // block) * block
    assert size == direct - c * c * 9 * 4 + (20 * 20 * 9 * 4 + 63) // 64 * 64


def test_winograd_filters_of_a_compiled_graph(wino, tmp_path, monkeypatch):
    """An inference nn.Graph compiled before the export (its passes run then, not within
    it) is compiled again for its Winograd layers' plain weights: the same file."""
    model, x, out = wino
    monkeypatch.setenv("TESSERA_NCHWC", "1")
    monkeypatch.setenv("TESSERA_NCHWC_WINOGRAD", "1")

    class Forward(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, x):
            return self.model(x)
    g = Forward()
    g(x)
    got = build(g, (x,), tmp_path, "wg")
    assert (got / "wg.weights").stat().st_size == (out / "win.weights").stat().st_size
    np.testing.assert_allclose(run_driver(got, "wg", (x,)), eager(model, (x,)), rtol=1e-4,
                               atol=1e-5)


def test_winograd_is_built_only_where_a_layer_runs_it(net, wino):
    assert "TSR_NCHWC_WINOGRAD" not in (net[2] / "blk.c").read_text()
    assert "#define TSR_NCHWC_WINO 0" in (net[2] / "nchwc_tiles.h").read_text()
    assert "TSR_NCHWC_WINOGRAD" in (wino[2] / "win.c").read_text()
    assert "#define TSR_NCHWC_WINO 1" in (wino[2] / "nchwc_tiles.h").read_text()


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512"])
def test_winograd_on_every_path_and_thread_count(isa, wino):
    from tessera.kernels import gemm
    model, x, out = wino
    if not gemm._lib().tsr_gemm_isa_supported(gemm.ISAS.index(isa)):
        pytest.skip(f"this CPU lacks {isa}")
    env = {**os.environ, "TESSERA_GEMM_ISA": isa}
    want = eager(model, (x,))
    for threads in (1, 2, 3):
        np.testing.assert_allclose(run_driver(out, "win", (x,), env=env, threads=threads),
                                   want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_winograd_under_sanitizers(tmp_path, monkeypatch):
    """The Winograd layers' scratch, transforms and tiles under ASan and UBSan."""
    from tests.deploy.test_export import cycles
    monkeypatch.setenv("TESSERA_NCHWC", "1")
    monkeypatch.setenv("TESSERA_NCHWC_WINOGRAD", "1")
    tessera.manual_seed(7)
    cycles(tmp_path, {"model": (Net().eval(), (tessera.randn(2, 3, 33, 31),))}, 20)


def _trunk(nn_, features=False):
    """An inverted-residual trunk in ``nn_`` (tessera.nn or torch.nn): a stem after an
    elementwise op (the trunk reads a buffer made before it), three blocks (a run of blocked
    layers), an early block's output read after the trunk, and a head; or (``features``)
    the last block's output as the result (the trunk writes the caller's buffer)."""

    class Trunk(nn_.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn_.Sequential(nn_.Conv2d(3, 16, 3, 2, 1), nn_.ReLU6())
            self.blocks = nn_.ModuleList(
                nn_.Sequential(nn_.Conv2d(16, 40, 1), nn_.ReLU6(),
                               nn_.Conv2d(40, 40, 3, s, 1, groups=40), nn_.ReLU6(),
                               nn_.Conv2d(40, 16, 1)) for s in (1, 1, 2))
            self.head = nn_.Linear(16, 5)

        def forward(self, x):
            x = self.stem(x * 2 - 1)
            a = self.blocks[0](x) + x
            b = self.blocks[1](a) + a
            c = self.blocks[2](b)
            if features:
                return c
            return self.head(c.mean((2, 3))) + a.tanh().mean((1, 2, 3))[:, None]
    return Trunk()


@pytest.mark.parametrize("features", [False, True])
@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512"])
def test_a_trunk_at_a_batch_runs_sample_by_sample(isa, features, tmp_path, monkeypatch):
    """A run of blocked layers at batch 3 loops over the samples (the buffers it reads from
    before it and leaves to the nodes after it apart from the run's), against PyTorch on
    every path and thread count."""
    import torch

    from tessera.kernels import gemm
    if not gemm._lib().tsr_gemm_isa_supported(gemm.ISAS.index(isa)):
        pytest.skip(f"this CPU lacks {isa}")
    monkeypatch.setenv("TESSERA_NCHWC", "1")
    tessera.manual_seed(8)
    model = _trunk(nn, features).eval()
    ref = _trunk(torch.nn, features).eval()
    ref.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in model.state_dict().items()})
    x = tessera.randn(3, 3, 30, 26)
    out = build(model, (x,), tmp_path, "trk")
    assert "for (int64_t s_ = 0; s_ < 3; s_++)" in (out / "trk.c").read_text()
    with torch.no_grad():
        want = ref(torch.from_numpy(x.numpy())).numpy()
    env = {**os.environ, "TESSERA_GEMM_ISA": isa}
    for threads in (1, 2, 3):
        np.testing.assert_allclose(run_driver(out, "trk", (x,), env=env, threads=threads),
                                   want, rtol=1e-4, atol=1e-5)
