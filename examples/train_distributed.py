"""Data-parallel training written as single-device code (OneFlow's global tensors).

The digits CNN of ``train_digits.py`` trains on every process of the job: its parameters
are broadcast over a placement of all ranks and each batch is split over them by rows.
Eager by default; ``--graph`` compiles the training step (``nn.Graph``); ``--zero 1|2``
shards the optimizer state (and, at stage 2, the gradients) over the ranks.

    python -m tessera.distributed.launch --nproc-per-node 2 examples/train_distributed.py
    python -m tessera.distributed.launch --nproc-per-node 2 examples/train_distributed.py \\
        --graph --zero 2
    python examples/train_distributed.py          # one process: the same training

Every rank reads the same batches (one seed) and keeps its rows of each: ``to_global`` of
a broadcast batch to ``split(0)`` is a local slice, no message. Batch norm on the split
batch is synchronised and dropout draws each rank's tile of one mask, so the losses are
one process's up to the order of float sums; the gradients of the broadcast parameters
are summed across the ranks by one all-reduce a step. Only rank 0 prints.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import tessera as torch
import tessera.distributed as dist
import tessera.nn.functional as F
from tessera.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import DigitsCNN  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description="Data-parallel training of a small digits CNN.")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="the global batch")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--graph", action="store_true", help="compile the step (nn.Graph)")
    p.add_argument("--zero", type=int, default=0, choices=(0, 1, 2),
                   help="ZeRO stage: shard the optimizer state (1) and gradients (2)")
    args = p.parse_args(argv)
    if args.epochs < 0 or args.batch_size < 1 or args.lr <= 0:
        p.error("--epochs and --batch-size must be non-negative, --lr positive")
    return args


def _global(t, placement):
    """A batch every rank holds whole, as this rank's rows of it."""
    return t.to_global(placement, torch.sbp.broadcast).to_global(sbp=torch.sbp.split(0))


def _optimizer(model, args):
    if args.zero and not args.graph:
        from tessera.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=args.lr,
                                       stage=args.zero, parameters_as_bucket_view=True)
    return torch.optim.Adam(model.parameters(), lr=args.lr)


def _graph_step(model, opt, zero: int):
    class TrainStep(torch.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            if zero:
                self.config.enable_zero(True, stage=zero)

        def build(self, x, y):
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            return loss
    return TrainStep()


def evaluate(model, loader, placement) -> float:
    model.eval()
    correct, total = 0, 0
    with torch.no_grad():
        for x, y in loader:
            x, y = _global(x, placement), _global(y, placement)
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    return correct / total


def run(args) -> list[float]:
    """Trains; returns each epoch's mean training loss (every rank)."""
    from tessera.datasets import Digits
    torch.manual_seed(args.seed)
    ranks = list(range(dist.get_world_size()))
    placement = torch.placement("cpu", ranks)
    model = DigitsCNN()
    model.to_global(placement, torch.sbp.broadcast)  # every rank holds every parameter
    opt = _optimizer(model, args)
    step = _graph_step(model, opt, args.zero) if args.graph else None
    train_set, test_set = Digits(train=True), Digits(train=False)
    train = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(args.seed))
    test = DataLoader(test_set, batch_size=256)
    rank0 = dist.get_rank() == 0
    if rank0:
        print(f"{len(ranks)} rank(s); {'nn.Graph' if args.graph else 'eager'}"
              f"{f', ZeRO stage {args.zero}' if args.zero else ''}")
    losses = []
    for epoch in range(args.epochs):
        model.train()
        t0, seen, loss_sum = time.perf_counter(), 0, 0.0
        for x, y in train:
            x, y = _global(x, placement), _global(y, placement)
            if step is not None:
                loss = step(x, y)
            else:
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            seen += len(y)
            loss_sum += loss.item() * len(y)
        losses.append(loss_sum / max(seen, 1))
        acc = evaluate(model, test, placement)
        if rank0:
            print(f"epoch {epoch + 1:2d}  train loss {losses[-1]:.4f}  test acc {acc:.4f}  "
                  f"({time.perf_counter() - t0:.1f} s)")
    return losses


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
