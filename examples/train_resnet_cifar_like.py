"""Train a small ResNet with tessera on synthetic CIFAR-sized (32x32 RGB) images.

The data set is generated with NumPy from a seed, so the example needs no download: ten
classes of shapes and textures (disk, square, triangle, ring, plus, cross, and horizontal,
vertical, diagonal and checkerboard stripes) at a random position and size, in a random
colour on a random background, with pixel noise. Colour carries no information about the
class, so the network has to learn shape. It shows a progress bar and the loss and
held-out accuracy per epoch, and ends with the final held-out accuracy (chance: 10%).

The default network is the CIFAR ResNet of He et al. (2016): a 3x3 stem and three stages
of ``tessera.models.resnet.BasicBlock`` with 16, 32 and 64 channels (``--depth 6n+2``);
``--arch resnet18`` trains torchvision's ResNet-18 (``tessera.models.resnet18``) instead.

    python examples/train_resnet_cifar_like.py                 # ResNet-8, ~2-3 minutes
    python examples/train_resnet_cifar_like.py --depth 14 --epochs 6
    python examples/train_resnet_cifar_like.py --arch resnet18 --train-size 2000

On a machine whose cores are busy with other work, OPENBLAS_NUM_THREADS=1 can make this
several times faster (multi-threaded BLAS calls stall when their threads must wait).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import tessera as torch
import tessera.nn as nn
import tessera.nn.functional as F
from tessera.utils.data import DataLoader, TensorDataset

try:
    from tqdm import tqdm
except ImportError:  # the demo extra installs tqdm; without it, plain iteration
    def tqdm(it, **_):
        return it

CLASSES = ("disk", "square", "triangle", "ring", "plus", "cross", "h-stripes", "v-stripes",
           "diagonal", "checker")
SIZE = 32


# ---- data ---------------------------------------------------------------------------------

def _shape_mask(label: int, rng: np.random.Generator) -> np.ndarray:
    """A boolean (32, 32) mask of class ``label`` at a random place, size and phase."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    cx, cy = rng.uniform(11, 21, 2)
    r = rng.uniform(6, 10)
    dx, dy = xx - cx, yy - cy
    dist = np.sqrt(dx * dx + dy * dy)
    inside = (np.abs(dx) < r) & (np.abs(dy) < r)
    period, phase = rng.integers(3, 6), rng.integers(0, 6)
    masks = {
        0: lambda: dist < r,
        1: lambda: (np.abs(dx) < 0.8 * r) & (np.abs(dy) < 0.8 * r),
        2: lambda: (np.abs(dy) < 0.8 * r) & (np.abs(dx) < (dy + 0.8 * r) * 0.6),
        3: lambda: (dist < r) & (dist > 0.55 * r),
        4: lambda: inside & ((np.abs(dx) < r / 3.5) | (np.abs(dy) < r / 3.5)),
        5: lambda: inside & ((np.abs(dx - dy) < r / 3.5) | (np.abs(dx + dy) < r / 3.5)),
        6: lambda: ((yy + phase) // period) % 2 == 0,
        7: lambda: ((xx + phase) // period) % 2 == 0,
        8: lambda: ((xx + yy + phase) // period) % 2 == 0,
        9: lambda: (((xx + phase) // period) + ((yy + phase) // period)) % 2 == 0,
    }
    return masks[label]()


def make_dataset(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images (n, 3, 32, 32) float32 in [0, 1] and their labels, balanced, seeded."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % len(CLASSES))
    images = np.empty((n, 3, SIZE, SIZE), np.float32)
    for i, label in enumerate(labels):
        mask = _shape_mask(int(label), rng)[None]
        fg, bg = rng.uniform(0.45, 1.0, (3, 1, 1)), rng.uniform(0.0, 0.35, (3, 1, 1))
        if rng.random() < 0.5:  # dark shapes on light backgrounds too
            fg, bg = 1.0 - fg, 1.0 - bg
        img = np.where(mask, fg, bg) + rng.normal(0, 0.06, (3, SIZE, SIZE))
        images[i] = np.clip(img, 0, 1)
    return images, labels.astype(np.int64)


# ---- model --------------------------------------------------------------------------------

class CifarResNet(nn.Module):
    """He et al.'s CIFAR ResNet (depth 6n+2): 3x3 stem, three stages of n BasicBlocks with
    16/32/64 channels (stride 2 between stages, 1x1 projection shortcuts), global average
    pooling and a linear classifier."""

    def __init__(self, depth: int = 8, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        from tessera.models.resnet import BasicBlock, conv1x1
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"depth must be 6n+2 >= 8 (8, 14, 20, ...), got {depth}")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        stages, inplanes = [], width
        for i, planes in enumerate((width, 2 * width, 4 * width)):
            stride = 1 if i == 0 else 2
            down = None
            if stride != 1 or inplanes != planes:
                down = nn.Sequential(conv1x1(inplanes, planes, stride), nn.BatchNorm2d(planes))
            blocks = [BasicBlock(inplanes, planes, stride, down)]
            blocks += [BasicBlock(planes, planes) for _ in range(n - 1)]
            stages.append(nn.Sequential(*blocks))
            inplanes = planes
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(inplanes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model(arch: str, depth: int) -> nn.Module:
    if arch == "resnet18":
        import tessera.models
        return tessera.models.resnet18(num_classes=len(CLASSES))
    return CifarResNet(depth=depth, num_classes=len(CLASSES))


# ---- training -----------------------------------------------------------------------------

def evaluate(model, loader) -> tuple[float, float]:
    model.eval()
    total, correct, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            loss_sum += F.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
            total += len(y)
    return loss_sum / max(total, 1), correct / max(total, 1)


def parse_args(argv):
    p = argparse.ArgumentParser(description="Train a small ResNet on synthetic 32x32 images "
                                            "of ten shape/texture classes.")
    p.add_argument("--arch", choices=("cifar", "resnet18"), default="cifar",
                   help="cifar: He et al.'s CIFAR ResNet (default); resnet18: torchvision's")
    p.add_argument("--depth", type=int, default=8, help="CIFAR ResNet depth, 6n+2 (default 8)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--train-size", type=int, default=4000)
    p.add_argument("--test-size", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.epochs < 0 or args.batch_size < 1 or args.lr <= 0 or args.train_size < 1 \
            or args.test_size < 1:
        p.error("--epochs must be non-negative; sizes and --lr positive")
    if args.arch == "cifar" and (args.depth < 8 or (args.depth - 2) % 6):
        p.error(f"--depth must be 6n+2 >= 8 (8, 14, 20, ...), got {args.depth}")
    return args


def load_data(args):
    """Train and held-out splits from different seeds, standardised by train statistics."""
    x_tr, y_tr = make_dataset(args.train_size, args.seed)
    x_te, y_te = make_dataset(args.test_size, args.seed + 10_000)
    mean = x_tr.mean(axis=(0, 2, 3), keepdims=True)
    std = x_tr.std(axis=(0, 2, 3), keepdims=True)
    x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    train = TensorDataset(torch.from_numpy(x_tr), torch.from_numpy(y_tr))
    test = TensorDataset(torch.from_numpy(x_te), torch.from_numpy(y_te))
    return train, test


def run(args) -> float:
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    train_set, test_set = load_data(args)
    print(f"{len(train_set)} training / {len(test_set)} held-out synthetic 32x32 images, "
          f"{len(CLASSES)} classes ({time.perf_counter() - t0:.1f} s to generate)")
    train = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(args.seed))
    test = DataLoader(test_set, batch_size=256)
    model = build_model(args.arch, args.depth)
    print(f"{args.arch if args.arch == 'resnet18' else f'CIFAR ResNet-{args.depth}'}: "
          f"{sum(p.numel() for p in model.parameters()):,} parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    steps = max(args.epochs * len(train), 1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps)
    for epoch in range(args.epochs):
        model.train()
        t0, seen, loss_sum, correct = time.perf_counter(), 0, 0.0, 0
        bar = tqdm(train, desc=f"epoch {epoch + 1}/{args.epochs}", leave=False)
        for x, y in bar:
            out = model(x)
            loss = F.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            seen += len(y)
            loss_sum += loss.item() * len(y)
            correct += (out.argmax(1) == y).sum().item()
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{loss.item():.3f}")
        val_loss, val_acc = evaluate(model, test)
        print(f"epoch {epoch + 1:2d}  train loss {loss_sum / max(seen, 1):.4f}  "
              f"train acc {correct / max(seen, 1):.4f}  held-out loss {val_loss:.4f}  "
              f"held-out acc {val_acc:.4f}  ({time.perf_counter() - t0:.1f} s)")
    _, acc = evaluate(model, test)
    print(f"final held-out accuracy {acc:.4f} on {len(test_set)} images "
          f"(chance {1 / len(CLASSES):.2f})")
    return acc


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except (ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
