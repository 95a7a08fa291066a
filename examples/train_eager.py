"""A short eager training loop: a two-layer MLP on scikit-learn's 8x8 digits, written with
tessera tensors and autograd only (the nn/optim layers arrive with the "nn" issue).

    python examples/train_eager.py [--epochs 30] [--lr 0.1] [--seed 0]

Prints the loss per epoch and the final test accuracy.
"""
from __future__ import annotations

import argparse
import sys
import time

import tessera as torch


def load_digits():
    try:
        from sklearn.datasets import load_digits as _load
    except ImportError:
        sys.exit("error: this demo needs scikit-learn for its bundled digits data "
                 "(pip install scikit-learn)")
    d = _load()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    return x, y


def cross_entropy(logits, y):
    logp = logits - logits.logsumexp(dim=1, keepdim=True)
    return -logp[torch.arange(len(y)), y].mean()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--epochs and --batch-size must be positive and --lr > 0")

    torch.manual_seed(args.seed)
    x, y = load_digits()
    perm = torch.randperm(len(y))
    x, y = x[perm], y[perm]
    n_test = len(y) // 5
    x_test, y_test, x_train, y_train = x[:n_test], y[:n_test], x[n_test:], y[n_test:]

    w1 = (torch.randn(64, args.hidden) * (2 / 64) ** 0.5).requires_grad_()
    b1 = torch.zeros(args.hidden, requires_grad=True)
    w2 = (torch.randn(args.hidden, 10) * (1 / args.hidden) ** 0.5).requires_grad_()
    b2 = torch.zeros(10, requires_grad=True)
    params = [w1, b1, w2, b2]
    velocity = [torch.zeros_like(q) for q in params]

    def model(inp):
        return (inp @ w1 + b1).relu() @ w2 + b2

    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(y_train))
        total = 0.0
        for i in range(0, len(order), args.batch_size):
            idx = order[i:i + args.batch_size]
            loss = cross_entropy(model(x_train[idx]), y_train[idx])
            for q in params:
                q.grad = None
            loss.backward()
            with torch.no_grad():  # SGD with momentum 0.9
                for q, v in zip(params, velocity):
                    v.mul_(0.9).add_(q.grad)
                    q.sub_(v, alpha=args.lr)
            total += loss.item() * len(idx)
        if epoch == 1 or epoch % 5 == 0 or epoch == args.epochs:
            print(f"epoch {epoch:3d}  loss {total / len(y_train):.4f}")
    with torch.no_grad():
        acc = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
    print(f"test accuracy {acc:.4f} on {n_test} held-out digits "
          f"({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
