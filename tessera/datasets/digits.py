"""scikit-learn's bundled 8x8 handwritten digits (1,797 images), as a dataset.

>>> from tessera.datasets import Digits
>>> train, test = Digits(train=True), Digits(train=False)
>>> len(train), len(test), train[0][0].shape
(1438, 359, tessera.Size([1, 8, 8]))
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tessera.ops.creation import from_numpy
from tessera.utils.data.dataset import Dataset

_TRAIN_FRACTION = 0.8
_SPLIT_SEED = 0  # fixed: the split must be the same on every machine and every run


class Digits(Dataset):
    """``dataset[i]`` is ``(image, label)``: a float32 tensor (1, 8, 8) in [0, 1] (the raw
    0..16 intensities / 16) and an int in 0..9.

    ``train=None`` gives all 1,797 samples; ``True``/``False`` give a fixed 80/20 split
    (1,438 / 359) drawn once from a seeded permutation. ``data`` (N, 1, 8, 8) float32 and
    ``targets`` (N,) int64 hold the whole split as tensors. Needs scikit-learn.
    """

    classes = [str(i) for i in range(10)]

    def __init__(self, train: bool | None = None, transform: Callable | None = None,
                 target_transform: Callable | None = None) -> None:
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            raise ImportError("tessera.datasets.Digits needs scikit-learn, which is not "
                              "installed: pip install scikit-learn") from None

        bunch = load_digits()
        images = (np.asarray(bunch.images, dtype=np.float32) / 16.0)[:, None]
        labels = np.asarray(bunch.target, dtype=np.int64)
        if train is not None:
            perm = np.random.RandomState(_SPLIT_SEED).permutation(len(labels))
            n_train = int(round(_TRAIN_FRACTION * len(labels)))
            idx = np.sort(perm[:n_train] if train else perm[n_train:])
            images, labels = images[idx], labels[idx]
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        self._images = np.ascontiguousarray(images)
        self._labels = labels
        self.data = from_numpy(self._images)
        self.targets = from_numpy(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __getitem__(self, index: int):
        img = from_numpy(self._images[index].copy())
        target = int(self._labels[index])
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __repr__(self) -> str:
        split = "All" if self.train is None else "Train" if self.train else "Test"
        return (f"Dataset {type(self).__name__}\n    Number of datapoints: {len(self)}\n"
                f"    Split: {split}")
