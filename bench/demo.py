"""The MNIST demo's epoch: LeNet-5, Adam, batch 64, 60,000 images, tessera eager
and PyTorch eager on the same batches in one run, interleaved 50 batches at a time.

MNIST is read from the folder ``$TESSERA_MNIST`` names (nothing downloads); the row is
reported as skipped when it is unset or does not hold the IDX files.
"""
from __future__ import annotations

import os
import time

import numpy as np

BATCH = 64


def _mnist():
    from tessera.datasets import MNIST
    root = os.environ.get("TESSERA_MNIST")
    if not root or not os.path.isdir(root):
        return None
    ds = MNIST(root, train=True)
    # the dataset's arrays, scaled as its __getitem__ does (one pass, not 60,000 calls)
    x = ds._images.astype(np.float32)[:, None] / 255.0
    return x, ds._labels.astype(np.int64)


def _lenet(lib):
    nn, F = lib.nn, lib.nn.functional

    class LeNet5(nn.Module):  # examples/train_digits.py's model
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.fc1 = nn.Linear(16 * 5 * 5, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = F.relu(self.fc1(lib.flatten(x, 1)))
            return self.fc3(F.relu(self.fc2(x)))
    return LeNet5()


def _trainer(lib, x: np.ndarray, y: np.ndarray):
    """``train(batch_starts) -> seconds``: LeNet-5 steps of ``lib`` on those batches."""
    lib.manual_seed(0)
    model = _lenet(lib)
    opt = lib.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = lib.nn.CrossEntropyLoss()
    order = np.random.default_rng(0).permutation(len(x))

    def train(starts) -> float:
        t0 = time.perf_counter()
        for i in starts:
            idx = order[i:i + BATCH]
            xb, yb = lib.from_numpy(x[idx]), lib.from_numpy(y[idx])
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        return time.perf_counter() - t0
    return train


def epoch_seconds(libs: dict, x: np.ndarray, y: np.ndarray, chunk: int = 50) -> dict:
    """One epoch per library, interleaved: every ``chunk`` batches the next library runs
    the same ones, so a machine whose load changes during the epoch slows each alike."""
    trainers = {name: _trainer(lib, x, y) for name, lib in libs.items()}
    starts = range(0, len(x) - BATCH + 1, BATCH)
    seconds = dict.fromkeys(libs, 0.0)
    for c in range(0, len(starts), chunk):
        for name, train in trainers.items():
            seconds[name] += train(starts[c:c + chunk])
    return seconds


def run() -> dict:
    data = _mnist()
    if data is None:
        return {"error": "MNIST not found (set TESSERA_MNIST)"}
    import torch

    import tessera
    x, y = data
    return epoch_seconds({"tessera": tessera, "torch": torch}, x, y)


def render(r: dict) -> str:
    if "error" in r:
        return f"MNIST demo epoch: skipped ({r['error']})"
    return (f"MNIST demo epoch (LeNet-5, Adam, batch 64): tessera {r['tessera']:.1f} s, "
            f"torch {r['torch']:.1f} s, ratio {r['tessera'] / r['torch']:.2f}x")


if __name__ == "__main__":
    print(render(run()))
