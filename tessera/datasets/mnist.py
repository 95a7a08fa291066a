"""MNIST from the four standard IDX files, gzip-compressed or raw.

The files are looked up in ``root`` and in ``root/MNIST/raw`` (torchvision's layout), under
either spelling of their names (``train-images-idx3-ubyte`` or ``train-images.idx3-ubyte``),
with or without ``.gz``. The MD5 of each file's uncompressed content is checked against the
published checksums.

>>> from tessera.datasets import MNIST
>>> train = MNIST("/path/to/mnist", train=True)  # doctest: +SKIP
>>> image, label = train[0]; image.shape, label  # doctest: +SKIP
(tessera.Size([1, 28, 28]), 5)
"""
from __future__ import annotations

import gzip
import hashlib
import os
import struct
import zlib
from collections.abc import Callable

import numpy as np

from tessera.ops.creation import from_numpy
from tessera.utils.data.dataset import Dataset

# IDX magic numbers: unsigned bytes, with 3 (images) or 1 (labels) dimensions
_IMAGES_MAGIC, _LABELS_MAGIC = 0x803, 0x801


def _find(folders: list[str], stem: str) -> str | None:
    dotted = stem.replace("-idx", ".idx")
    for folder in folders:
        for name in (stem, stem + ".gz", dotted, dotted + ".gz"):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                return path
    return None


def _read(path: str) -> bytes:
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                return fh.read()
        with open(path, "rb") as fh:
            return fh.read()
    except (OSError, EOFError, zlib.error) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"MNIST: {path} is corrupt: cannot read or decompress it ({e})") \
            from None


def _parse_idx(data: bytes, path: str, magic: int, ndim: int) -> np.ndarray:
    if len(data) < 4 + 4 * ndim:
        raise ValueError(f"MNIST: {path} is corrupt: {len(data)} bytes is too short for an "
                         "IDX header")
    (found,) = struct.unpack(">I", data[:4])
    if found != magic:
        raise ValueError(f"MNIST: {path} is corrupt: IDX magic number {found:#x}, expected "
                         f"{magic:#x}")
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"MNIST: {path} is corrupt: the header says shape {shape} "
                         f"({int(np.prod(shape))} bytes of data) but it holds {body.size}")
    return body.reshape(shape)


class MNIST(Dataset):
    """The MNIST digits: 60,000 training and 10,000 test images of 28x28 pixels.

    ``root`` is the folder holding the IDX files (or ``root/MNIST/raw``). ``dataset[i]``
    is ``(image, label)``: a float32 tensor of shape (1, 28, 28) in [0, 1] and an int.
    ``data`` is the uint8 tensor (N, 28, 28) and ``targets`` the int64 labels.
    A missing file raises FileNotFoundError naming it; a corrupt one ValueError.
    ``download=True`` is not supported (this framework fetches nothing from the network).
    """

    # file stem -> MD5 of the uncompressed file (subclasses for look-alike datasets
    # such as Fashion-MNIST override this)
    md5s = {
        "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
        "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
        "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
        "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
    }
    classes = ["0 - zero", "1 - one", "2 - two", "3 - three", "4 - four", "5 - five",
               "6 - six", "7 - seven", "8 - eight", "9 - nine"]

    def __init__(self, root: str | os.PathLike, train: bool = True,
                 transform: Callable | None = None, target_transform: Callable | None = None,
                 download: bool = False) -> None:
        self.root = os.path.expanduser(os.fspath(root))
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        prefix = "train" if train else "t10k"
        stems = (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte")
        paths = [self._locate(stem, download) for stem in stems]  # all present, then read
        images = self._load(paths[0], stems[0], _IMAGES_MAGIC, 3)
        labels = self._load(paths[1], stems[1], _LABELS_MAGIC, 1)
        if len(images) != len(labels):
            raise ValueError(f"MNIST: {len(images)} images but {len(labels)} labels in "
                             f"{self.root}")
        if labels.size and labels.max() > 9:
            raise ValueError(f"MNIST: labels file in {self.root} is corrupt: label "
                             f"{int(labels.max())} is not a digit")
        self._images = images
        self._labels = labels.astype(np.int64)
        self.data = from_numpy(images)
        self.targets = from_numpy(self._labels)

    def _folders(self) -> list[str]:
        return [self.root, os.path.join(self.root, "MNIST", "raw")]

    def _locate(self, stem: str, download: bool) -> str:
        folders = self._folders()
        path = _find(folders, stem)
        if path is None:
            hint = " (download=True is not supported: tessera does not fetch data)" \
                if download else ""
            raise FileNotFoundError(
                f"MNIST: file {stem!r} (or {stem.replace('-idx', '.idx')!r}, raw or .gz) not "
                f"found in {' or '.join(folders)}; put the four MNIST IDX files there{hint}")
        return path

    def _load(self, path: str, stem: str, magic: int, ndim: int) -> np.ndarray:
        data = _read(path)
        expected = self.md5s.get(stem)
        if expected is not None:
            found = hashlib.md5(data).hexdigest()
            if found != expected:
                raise ValueError(f"MNIST: {path} is corrupt or not the MNIST file: MD5 of its "
                                 f"data is {found}, expected {expected}")
        return _parse_idx(data, path, magic, ndim)

    def __len__(self) -> int:
        return len(self._labels)

    def __getitem__(self, index: int):
        img = from_numpy(self._images[index].astype(np.float32)[None] / 255.0)
        target = int(self._labels[index])
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __repr__(self) -> str:
        return (f"Dataset {type(self).__name__}\n    Number of datapoints: {len(self)}\n"
                f"    Root location: {self.root}\n    Split: "
                f"{'Train' if self.train else 'Test'}")
