"""``tessera.utils.make_grid`` / ``save_image`` against torchvision's algorithm.

torchvision cannot be imported beside this torch build, so ``ref_make_grid`` below
re-implements ``torchvision.utils.make_grid`` with torch ops, step by step as torchvision
0.28 writes it, and ``ref_png_pixels`` does the same for the uint8 conversion in
``save_image``. Files written are read back with Pillow.
"""
from __future__ import annotations

import io
import math
import os
import stat
import sys

import numpy as np
import pytest
import torch

import tessera
from tessera.utils import make_grid, save_image

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402


def ref_make_grid(tensor, nrow=8, padding=2, normalize=False, value_range=None,
                  scale_each=False, pad_value=0.0):
    """torchvision.utils.make_grid, with torch."""
    if isinstance(tensor, list):
        tensor = torch.stack(tensor, dim=0)
    if tensor.dim() == 2:
        tensor = tensor.unsqueeze(0)
    if tensor.dim() == 3:
        if tensor.size(0) == 1:
            tensor = torch.cat((tensor, tensor, tensor), 0)
        tensor = tensor.unsqueeze(0)
    if tensor.dim() == 4 and tensor.size(1) == 1:
        tensor = torch.cat((tensor, tensor, tensor), 1)
    if normalize is True:
        tensor = tensor.clone()

        def norm_ip(img, low, high):
            img.clamp_(min=low, max=high)
            img.sub_(low).div_(max(high - low, 1e-5))

        def norm_range(t):
            if value_range is not None:
                norm_ip(t, value_range[0], value_range[1])
            else:
                norm_ip(t, float(t.min()), float(t.max()))

        if scale_each is True:
            for t in tensor:
                norm_range(t)
        else:
            norm_range(tensor)
    if tensor.size(0) == 1:
        return tensor.squeeze(0)
    nmaps = tensor.size(0)
    xmaps = min(nrow, nmaps)
    ymaps = int(math.ceil(float(nmaps) / xmaps))
    height, width = int(tensor.size(2) + padding), int(tensor.size(3) + padding)
    grid = tensor.new_full((tensor.size(1), height * ymaps + padding, width * xmaps + padding),
                           pad_value)
    k = 0
    for y in range(ymaps):
        for x in range(xmaps):
            if k >= nmaps:
                break
            grid.narrow(1, y * height + padding, height - padding).narrow(
                2, x * width + padding, width - padding).copy_(tensor[k])
            k = k + 1
    return grid


def ref_png_pixels(tensor, **kwargs) -> np.ndarray:
    """The uint8 (H, W, C) array torchvision's save_image hands to Pillow."""
    grid = ref_make_grid(tensor, **kwargs)
    return grid.mul(255).add_(0.5).clamp_(0, 255).permute(1, 2, 0).to("cpu",
                                                                      torch.uint8).numpy()


def both(a: np.ndarray):
    return tessera.tensor(a.copy()), torch.tensor(a.copy())


def check_grid(a: np.ndarray, **kwargs) -> None:
    t, r = both(a)
    out, ref = make_grid(t, **kwargs), ref_make_grid(r, **kwargs)
    assert tuple(out.shape) == tuple(ref.shape)
    assert out.dtype.name == str(ref.dtype).split(".")[-1]
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6, atol=1e-7)


RNG = np.random.default_rng(0)

GRID_CASES = [  # (shape, kwargs)
    ((8, 3, 5, 6), {}),
    ((10, 3, 4, 4), dict(nrow=4)),                      # last row partly filled
    ((17, 3, 3, 5), dict(nrow=5, padding=0)),
    ((3, 3, 4, 4), dict(nrow=8, padding=3, pad_value=0.5)),   # nrow > batch
    ((6, 3, 4, 4), dict(nrow=1, padding=1, pad_value=-2.0)),  # one column
    ((7, 1, 5, 5), dict(nrow=3)),                       # 1 channel -> 3
    ((4, 2, 3, 3), dict(nrow=2)),                       # 2 channels stay 2
    ((5, 4, 3, 3), dict(nrow=2, pad_value=1.0)),        # 4 channels stay 4
    ((1, 3, 5, 4), dict(padding=4)),                    # one image: returned unpadded
    ((1, 1, 5, 4), {}),
    ((3, 5, 4), {}),                                    # a single (C, H, W) image
    ((1, 5, 4), {}),                                    # a single 1-channel image
    ((5, 4), dict(padding=3)),                          # a single (H, W) image
]


@pytest.mark.parametrize("shape,kwargs", GRID_CASES, ids=[str(c[0]) + str(c[1])
                                                          for c in GRID_CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_make_grid_matches_reference(shape, kwargs, dtype):
    check_grid(RNG.uniform(-3, 3, shape).astype(dtype), **kwargs)


NORM_CASES = [
    dict(normalize=True),
    dict(normalize=True, scale_each=True),
    dict(normalize=True, value_range=(-1.0, 1.0)),
    dict(normalize=True, value_range=(-0.5, 2.0), scale_each=True),
    dict(normalize=True, value_range=(0, 1), nrow=3, padding=1, pad_value=0.25),
    dict(normalize=False, value_range=(-1.0, 1.0)),     # value_range ignored
    dict(normalize=True, value_range=(1.0, 1.0)),       # zero width: divides by 1e-5
]


@pytest.mark.parametrize("kwargs", NORM_CASES, ids=[str(k) for k in NORM_CASES])
@pytest.mark.parametrize("shape", [(6, 3, 4, 5), (5, 1, 4, 4), (1, 3, 4, 4), (3, 4, 4)])
def test_make_grid_normalize_matches_reference(shape, kwargs):
    a = RNG.uniform(-3, 3, shape).astype(np.float32)
    a[0] *= 0.1  # the first image has a much smaller range: scale_each must matter
    check_grid(a, **kwargs)


def test_normalize_with_constant_image():
    check_grid(np.full((4, 3, 2, 2), 0.7, np.float32), normalize=True)
    check_grid(np.full((4, 3, 2, 2), 0.7, np.float32), normalize=True, scale_each=True)


def test_normalize_leaves_input_unchanged():
    a = RNG.uniform(-3, 3, (4, 3, 4, 4)).astype(np.float32)
    t = tessera.tensor(a.copy())
    out = make_grid(t, normalize=True, scale_each=True)
    np.testing.assert_array_equal(t.numpy(), a)
    assert float(out.min()) == 0.0 and float(out.max()) == 1.0


def test_scale_each_gives_every_image_full_range():
    a = np.stack([np.linspace(lo, lo + w, 48, dtype=np.float32).reshape(3, 4, 4)
                  for lo, w in ((0, 1), (5, 0.1), (-3, 10))])
    out = make_grid(tessera.tensor(a), padding=0, normalize=True, scale_each=True).numpy()
    for i in range(3):
        tile = out[:, :, 4 * i:4 * i + 4]
        assert tile.min() == 0.0 and abs(tile.max() - 1.0) < 1e-6


def test_one_channel_becomes_three_identical_channels():
    a = RNG.uniform(0, 1, (5, 1, 3, 3)).astype(np.float32)
    out = make_grid(tessera.tensor(a), nrow=5, padding=1).numpy()
    assert out.shape == (3, 5, 21)
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_array_equal(out[0], out[2])
    np.testing.assert_array_equal(out[0, 1:4, 1:4], a[0, 0])


def test_padding_and_pad_value_layout():
    out = make_grid(tessera.ones(3, 3, 2, 2), nrow=2, padding=1, pad_value=0.5).numpy()
    assert out.shape == (3, 7, 7)
    expected = np.full((7, 7), 0.5, np.float32)
    for y, x in ((1, 1), (1, 4), (4, 1)):
        expected[y:y + 2, x:x + 2] = 1.0
    for c in range(3):
        np.testing.assert_array_equal(out[c], expected)


def test_list_input_and_dtypes():
    imgs = [RNG.uniform(0, 1, (3, 4, 4)).astype(np.float32) for _ in range(5)]
    out = make_grid([tessera.tensor(i) for i in imgs], nrow=2)
    ref = ref_make_grid([torch.tensor(i) for i in imgs], nrow=2)
    np.testing.assert_array_equal(out.numpy(), ref.numpy())
    u8 = RNG.integers(0, 256, (5, 3, 4, 4)).astype(np.uint8)
    out = make_grid(tessera.tensor(u8), nrow=2, pad_value=255)
    assert out.dtype == tessera.uint8
    np.testing.assert_array_equal(out.numpy(), ref_make_grid(torch.tensor(u8), nrow=2,
                                                             pad_value=255).numpy())


def test_requires_grad_input():
    t = tessera.rand(4, 3, 4, 4, requires_grad=True)
    out = make_grid(t * 2, normalize=True)
    assert not out.requires_grad
    assert tuple(out.shape) == (3, 8, 26)


@pytest.mark.parametrize("bad,kwargs,exc,match", [
    (np.zeros((2, 3, 4, 4)), {}, TypeError, "tensor or list of tensors"),
    ([tessera.zeros(3, 4, 4), np.zeros((3, 4, 4))], {}, TypeError, "list containing"),
    ([], {}, ValueError, "empty list"),
    (tessera.zeros(5), {}, ValueError, r"shape \(5,\)"),
    (tessera.zeros(2, 2, 3, 4, 4), {}, ValueError, "B, C, H, W"),
    (tessera.zeros(0, 3, 4, 4), {}, ValueError, "no images"),
    (tessera.zeros(2, 3, 4, 4), dict(nrow=0), ValueError, "nrow"),
    (tessera.zeros(2, 3, 4, 4), dict(padding=-1), ValueError, "padding"),
    (tessera.zeros(2, 3, 4, 4), dict(nrow=2.0), ValueError, "nrow"),
    (tessera.zeros(2, 3, 4, 4), dict(normalize=True, value_range=[0, 1]), TypeError,
     "value_range"),
])
def test_make_grid_bad_input(bad, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        make_grid(bad, **kwargs)


# ---- save_image ---------------------------------------------------------------------------

def read_png(path) -> tuple[np.ndarray, str, str]:
    with Image.open(path) as im:
        return np.asarray(im).copy(), im.mode, im.format


def leftovers(folder) -> list[str]:
    return [f for f in os.listdir(folder) if f.endswith(".tmp") or f.startswith(".")]


@pytest.mark.parametrize("shape,kwargs", [
    ((6, 3, 5, 4), dict(nrow=4)),
    ((6, 1, 5, 4), dict(nrow=3, padding=1, pad_value=1.0)),
    ((4, 3, 4, 4), dict(normalize=True, value_range=(-1, 1))),
    ((4, 3, 4, 4), dict(normalize=True, scale_each=True)),
    ((3, 6, 5), {}),
    ((6, 5), {}),
    ((5, 4, 3, 3), dict(nrow=2)),            # RGBA
])
def test_save_image_png_pixels(tmp_path, shape, kwargs):
    a = RNG.uniform(-0.2, 1.2, shape).astype(np.float32)   # also exercises the clamp
    path = tmp_path / "grid.png"
    save_image(tessera.tensor(a), path, **kwargs)
    pixels, mode, fmt = read_png(path)
    expected = ref_png_pixels(torch.tensor(a), **kwargs)
    assert fmt == "PNG" and mode == {3: "RGB", 4: "RGBA"}[expected.shape[2]]
    np.testing.assert_array_equal(pixels, expected)
    assert leftovers(tmp_path) == []


def test_save_image_rounds_to_nearest():
    a = np.array([0.0, 0.5 / 255, 1.49 / 255, 0.5, 1.0, -1.0, 2.0], np.float32)
    buf = io.BytesIO()
    save_image(tessera.tensor(a.reshape(1, 1, 7)), buf, format="PNG")
    buf.seek(0)
    pixels, mode, _ = read_png(buf)
    assert mode == "RGB"
    np.testing.assert_array_equal(pixels[0, :, 0], [0, 1, 1, 128, 255, 0, 255])


def test_save_image_str_path_and_other_formats(tmp_path):
    t = tessera.rand(2, 3, 8, 8)
    save_image(t, str(tmp_path / "a.jpg"))
    assert read_png(tmp_path / "a.jpg")[2] == "JPEG"
    save_image(t, str(tmp_path / "b.bin"), format="PNG")   # format overrides the extension
    assert read_png(tmp_path / "b.bin")[2] == "PNG"
    save_image([t[0], t[1]], tmp_path / "c.PNG")             # list input, upper-case suffix
    assert read_png(tmp_path / "c.PNG")[0].shape == (12, 22, 3)
    assert leftovers(tmp_path) == []


def test_save_image_overwrite_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "out.png"
    save_image(tessera.zeros(3, 4, 4), path)
    os.chmod(path, 0o640)
    save_image(tessera.ones(3, 4, 4), path)
    assert read_png(path)[0].min() == 255
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640     # an overwrite keeps permissions
    before = path.read_bytes()

    def broken_save(self, fp, format=None, **params):
        fp.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(Image.Image, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_image(tessera.zeros(3, 4, 4), path)
    assert path.read_bytes() == before                       # old file intact
    assert sorted(os.listdir(tmp_path)) == ["out.png"]      # no temp file left


def test_save_image_new_file_mode(tmp_path):
    old = os.umask(0o027)
    try:
        save_image(tessera.zeros(3, 2, 2), tmp_path / "m.png")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "m.png").st_mode) == 0o640


def test_save_image_errors(tmp_path):
    t = tessera.zeros(3, 4, 4)
    with pytest.raises(ValueError, match="cannot tell the image format"):
        save_image(t, tmp_path / "x.unknownext")
    with pytest.raises(ValueError, match="cannot tell the image format"):
        save_image(t, tmp_path / "noextension")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save_image(t, tmp_path / "missing" / "x.png")
    with pytest.raises(TypeError, match="path or a binary file"):
        save_image(t, 3)
    with pytest.raises(TypeError, match="tensor or list of tensors"):
        save_image(np.zeros((3, 4, 4)), tmp_path / "y.png")
    assert os.listdir(tmp_path) == []


def test_save_image_without_pillow(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match="pip install pillow"):
        save_image(tessera.zeros(3, 4, 4), tmp_path / "z.png")
    assert os.listdir(tmp_path) == []


def test_exported_from_tessera_utils():
    import tessera.utils
    import tessera.utils.image as image
    assert tessera.utils.save_image is image.save_image
    assert tessera.utils.make_grid is image.make_grid
    assert {"save_image", "make_grid"} <= set(tessera.utils.__all__)
