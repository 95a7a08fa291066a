"""tessera.datasets: MNIST from IDX files (real ones when present, synthetic ones for the
error cases) and scikit-learn's Digits."""
from __future__ import annotations

import gzip
import hashlib
import os
import struct
import sys

import numpy as np
import pytest

import tessera
from tessera.datasets import MNIST, Digits
from tessera.utils.data import DataLoader

MNIST_DIR = os.environ.get("TESSERA_MNIST_DIR") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data",
    "mnist")
FILES = ["train-images.idx3-ubyte", "train-labels.idx1-ubyte", "t10k-images.idx3-ubyte",
         "t10k-labels.idx1-ubyte"]


def _has_real_mnist() -> bool:
    return all(os.path.exists(os.path.join(MNIST_DIR, f + ".gz")) for f in FILES)


real_mnist = pytest.mark.skipif(
    not _has_real_mnist(),
    reason=f"the MNIST IDX files are not in {MNIST_DIR} (set TESSERA_MNIST_DIR to a folder "
           "holding the four .gz files to run these tests)")


# ---- synthetic IDX files -----------------------------------------------------------------

def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write(path, data: bytes, gz: bool) -> None:
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as fh:
            fh.write(data)
    else:
        with open(path, "wb") as fh:
            fh.write(data)


def synthetic(folder, n=5, gz=True, dotted=False, train=True):
    """Write a tiny MNIST-format split; return (images, labels, md5s by file stem)."""
    rng = np.random.RandomState(0)
    images = rng.randint(0, 256, size=(n, 28, 28)).astype(np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    prefix = "train" if train else "t10k"
    md5s = {}
    for kind, arr, magic in (("images-idx3", images, 0x803), ("labels-idx1", labels, 0x801)):
        stem = f"{prefix}-{kind}-ubyte"
        name = stem.replace("-idx", ".idx") if dotted else stem
        data = idx_bytes(arr, magic)
        write(os.path.join(folder, name), data, gz)
        md5s[stem] = hashlib.md5(data).hexdigest()
    return images, labels, md5s


def tiny_mnist(md5s):
    return type("TinyMNIST", (MNIST,), {"md5s": md5s})


@pytest.mark.parametrize("gz,dotted", [(True, False), (False, False), (True, True),
                                       (False, True)])
def test_synthetic_idx_files_load(tmp_path, gz, dotted):
    images, labels, md5s = synthetic(tmp_path, gz=gz, dotted=dotted)
    ds = tiny_mnist(md5s)(tmp_path, train=True)
    assert len(ds) == 5
    img, label = ds[3]
    assert img.shape == (1, 28, 28) and img.dtype == tessera.float32 and label == 3
    np.testing.assert_allclose(img.numpy()[0], images[3] / 255.0, rtol=1e-6)
    assert ds.data.dtype == tessera.uint8 and ds.data.shape == (5, 28, 28)
    assert ds.targets.dtype == tessera.int64 and ds.targets.tolist() == labels.tolist()


def test_transforms_and_dataloader(tmp_path):
    _, labels, md5s = synthetic(tmp_path, n=6)
    ds = tiny_mnist(md5s)(tmp_path, transform=lambda x: x * 2,
                          target_transform=lambda y: y + 100)
    img, label = ds[1]
    assert float(img.max()) > 1.0 and label == 101
    xb, yb = next(iter(DataLoader(ds, batch_size=4)))
    assert xb.shape == (4, 1, 28, 28) and yb.tolist() == [100, 101, 102, 103]


def test_mnist_raw_subfolder_layout(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    _, _, md5s = synthetic(raw, train=False)
    assert len(tiny_mnist(md5s)(tmp_path, train=False)) == 5


def test_missing_file_names_it(tmp_path):
    rng = np.random.RandomState(0)
    write(tmp_path / "train-images-idx3-ubyte", idx_bytes(rng.randint(0, 9, (2, 28, 28)),
                                                          0x803), gz=True)
    with pytest.raises(FileNotFoundError, match="train-labels-idx1-ubyte") as info:
        MNIST(tmp_path)
    assert str(tmp_path) in str(info.value)
    with pytest.raises(FileNotFoundError, match="t10k-images-idx3-ubyte"):
        MNIST(tmp_path / "nowhere", train=False)


def test_checksum_mismatch_is_a_value_error(tmp_path):
    synthetic(tmp_path)  # valid IDX content, but not the real MNIST files
    with pytest.raises(ValueError, match="MD5"):
        MNIST(tmp_path)


def test_truncated_gzip_is_a_value_error(tmp_path):
    _, _, md5s = synthetic(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(ValueError, match="corrupt"):
        tiny_mnist(md5s)(tmp_path)


@pytest.mark.parametrize("damage", ["magic", "size", "label"])
def test_malformed_idx_is_a_value_error(tmp_path, damage):
    rng = np.random.RandomState(0)
    images = idx_bytes(rng.randint(0, 255, (3, 28, 28)), 0x803)
    labels = idx_bytes(np.array([1, 2, 3]), 0x801)
    if damage == "magic":
        images = struct.pack(">I", 0x802) + images[4:]
    elif damage == "size":
        images = images[:-5]
    else:
        labels = idx_bytes(np.array([1, 2, 42]), 0x801)
    write(tmp_path / "train-images-idx3-ubyte", images, gz=False)
    write(tmp_path / "train-labels-idx1-ubyte", labels, gz=False)
    md5s = {"train-images-idx3-ubyte": hashlib.md5(images).hexdigest(),
            "train-labels-idx1-ubyte": hashlib.md5(labels).hexdigest()}
    with pytest.raises(ValueError, match="corrupt"):
        tiny_mnist(md5s)(tmp_path)


# ---- the real MNIST files ----------------------------------------------------------------

@real_mnist
def test_real_mnist_train_and_test():
    train = MNIST(MNIST_DIR, train=True)
    test = MNIST(MNIST_DIR, train=False)
    assert len(train) == 60000 and len(test) == 10000
    assert train.targets[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert test.targets[:5].tolist() == [7, 2, 1, 0, 4]
    img, label = train[0]
    assert img.shape == (1, 28, 28) and label == 5
    assert 0.0 <= float(img.min()) and float(img.max()) == 1.0
    assert np.bincount(train.targets.numpy()).tolist()[:2] == [5923, 6742]
    assert "Number of datapoints: 60000" in repr(train)


@real_mnist
def test_real_mnist_uncompressed_copy_in_raw_folder(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in FILES[2:]:  # the test split, uncompressed, under the dashed names
        with gzip.open(os.path.join(MNIST_DIR, name + ".gz")) as fh:
            (raw / name.replace(".idx", "-idx")).write_bytes(fh.read())
    assert len(MNIST(tmp_path, train=False)) == 10000
    data = bytearray((raw / "t10k-labels-idx1-ubyte").read_bytes())
    data[100] ^= 1  # one flipped bit
    (raw / "t10k-labels-idx1-ubyte").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="MD5"):
        MNIST(tmp_path, train=False)


# ---- Digits ------------------------------------------------------------------------------

def test_digits_all_and_split():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    ref = sklearn_datasets.load_digits()
    full = Digits()
    assert len(full) == 1797
    np.testing.assert_allclose(full.data.numpy()[:, 0], ref.images / 16.0, rtol=1e-6)
    assert full.targets.tolist() == ref.target.tolist()
    img, label = full[10]
    assert img.shape == (1, 8, 8) and img.dtype == tessera.float32 and isinstance(label, int)
    assert full.data.dtype == tessera.float32 and full.targets.dtype == tessera.int64
    assert 0.0 <= float(full.data.min()) and float(full.data.max()) <= 1.0
    train, test = Digits(train=True), Digits(train=False)
    assert (len(train), len(test)) == (1438, 359)
    rows = {r.tobytes() + bytes([t]) for r, t in zip(full.data.numpy(), full.targets.numpy())}
    split = [r.tobytes() + bytes([t]) for ds in (train, test)
             for r, t in zip(ds.data.numpy(), ds.targets.numpy())]
    assert len(split) == 1797 and set(split) == rows
    assert Digits(train=True).targets.tolist() == train.targets.tolist()  # deterministic
    assert len(set(test.targets.tolist())) == 10


def test_digits_transforms_and_loader():
    pytest.importorskip("sklearn")
    ds = Digits(train=False, transform=lambda x: x.flatten(), target_transform=str)
    x, y = ds[0]
    assert x.shape == (64,) and isinstance(y, str)
    xb, yb = next(iter(DataLoader(Digits(train=True), batch_size=32, shuffle=True)))
    assert xb.shape == (32, 1, 8, 8) and yb.dtype == tessera.int64


def test_digits_without_sklearn_is_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match="scikit-learn"):
        Digits()
