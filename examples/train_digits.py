"""Train a small CNN on handwritten digits with tessera, PyTorch-style.

By default it uses scikit-learn's bundled 8x8 digits (1,797 images); with --data-dir it
trains a LeNet-5-sized model on MNIST's IDX files from that folder. It shows a progress
bar, the loss and accuracy per epoch and the final test accuracy, and saves a checkpoint
that a second run can resume from (--resume).

    python examples/train_digits.py                      # digits, ~97-99% test accuracy
    python examples/train_digits.py --data-dir path/to/mnist --epochs 4
    python examples/train_digits.py --checkpoint ckpt.safetensors --resume
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import tessera as torch
import tessera.nn as nn
import tessera.nn.functional as F
from tessera.utils.data import DataLoader

try:
    from tqdm import tqdm
except ImportError:  # the demo extra installs tqdm; without it, plain iteration
    def tqdm(it, **_):
        return it


class DigitsCNN(nn.Module):
    """For 8x8 digits: two 3x3 convolutions, one pooling, two linear layers."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 4 * 4, 128)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.drop(F.relu(self.fc1(torch.flatten(x, 1))))
        return self.fc2(x)


class LeNet5(nn.Module):
    """For 28x28 MNIST: LeNet-5 with ReLU and max pooling."""

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
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc3(F.relu(self.fc2(x)))


def load_data(data_dir: str | None):
    from tessera.datasets import MNIST, Digits
    if data_dir is None:
        return Digits(train=True), Digits(train=False), DigitsCNN()
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"--data-dir {data_dir!r} is not a folder")
    return (MNIST(data_dir, train=True, transform=normalize_mnist),
            MNIST(data_dir, train=False, transform=normalize_mnist), LeNet5())


def normalize_mnist(img):
    """MNIST's usual standardisation (training set mean 0.1307, std 0.3081)."""
    return (img - 0.1307) / 0.3081


def evaluate(model, loader) -> tuple[float, float]:
    model.eval()
    total, correct, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            loss_sum += F.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
            total += len(y)
    return loss_sum / total, correct / total


def parse_args(argv):
    p = argparse.ArgumentParser(description="Train a small CNN on handwritten digits.")
    p.add_argument("--data-dir", help="folder with MNIST's IDX files (default: sklearn digits)")
    p.add_argument("--epochs", type=int, default=None, help="default 10 (digits) / 4 (MNIST)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--checkpoint", default="checkpoints/digits.safetensors")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    args = p.parse_args(argv)
    if args.epochs is None:
        args.epochs = 10 if args.data_dir is None else 4
    if args.epochs < 0 or args.batch_size < 1 or args.lr <= 0 or args.workers < 0:
        p.error("--epochs, --batch-size and --workers must be non-negative, --lr positive")
    return args


def run(args) -> float:
    torch.manual_seed(args.seed)
    train_set, test_set, model = load_data(args.data_dir)
    gen = torch.Generator().manual_seed(args.seed)
    train = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, generator=gen,
                       num_workers=args.workers)
    test = DataLoader(test_set, batch_size=256)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(args.epochs, 1))
    first_epoch = 0
    if args.resume:
        if not os.path.exists(args.checkpoint):
            raise FileNotFoundError(f"no checkpoint at {args.checkpoint!r} to resume from")
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        first_epoch = state["epoch"]
        print(f"resumed from {args.checkpoint} after epoch {first_epoch}")
    for epoch in range(first_epoch, args.epochs):
        model.train()
        t0, seen, loss_sum = time.perf_counter(), 0, 0.0
        bar = tqdm(train, desc=f"epoch {epoch + 1}/{args.epochs}", leave=False)
        for x, y in bar:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += len(y)
            loss_sum += loss.item() * len(y)
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{loss.item():.3f}")
        sched.step()
        val_loss, val_acc = evaluate(model, test)
        print(f"epoch {epoch + 1:2d}  train loss {loss_sum / max(seen, 1):.4f}  "
              f"test loss {val_loss:.4f}  test acc {val_acc:.4f}  "
              f"({time.perf_counter() - t0:.1f} s)")
        os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "epoch": epoch + 1}, args.checkpoint)
    _, acc = evaluate(model, test)
    print(f"final test accuracy {acc:.4f} ({len(test_set)} images); checkpoint: "
          f"{args.checkpoint}")
    return acc


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
