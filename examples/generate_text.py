"""Train a tiny character-level GPT on Shakespeare's sonnets with tessera, then sample.

The text (examples/data/shakespeare_sonnets.txt, public domain) is split 90/10 into train
and validation characters. Training runs for --steps steps or --minutes minutes, whichever
comes first, with AdamW and a cosine learning-rate decay, showing a progress bar; it then
prints the final train and validation loss (nats per character) and a sample generated
with the KV cache (temperature and top-k sampling, seeded).

    python examples/generate_text.py                      # ~3 minutes on a laptop CPU
    python examples/generate_text.py --minutes 1 --prompt "Shall I" --temperature 0.8
"""
from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

import tessera
from tessera.models.gpt2 import GPT, GPTConfig

try:
    from tqdm import tqdm
except ImportError:  # without tqdm: plain iteration
    def tqdm(it, **_):
        return it

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                    "shakespeare_sonnets.txt")


class CharData:
    """The text as int64 ids over its sorted character set, split into train/val."""

    def __init__(self, path: str, val_fraction: float = 0.1) -> None:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        ids = np.array([self.stoi[c] for c in text], dtype=np.int64)
        n = int(len(ids) * (1 - val_fraction))
        self.train, self.val = ids[:n], ids[n:]

    def encode(self, s: str) -> list[int]:
        unknown = sorted({c for c in s if c not in self.stoi})
        if unknown:
            raise SystemExit(f"prompt has characters not in the text: {unknown}")
        return [self.stoi[c] for c in s]

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)

    def batch(self, split: str, batch_size: int, block: int, rng) -> tuple:
        data = self.train if split == "train" else self.val
        starts = rng.integers(0, len(data) - block - 1, size=batch_size)
        x = np.stack([data[s:s + block] for s in starts])
        y = np.stack([data[s + 1:s + block + 1] for s in starts])
        return tessera.from_numpy(x), tessera.from_numpy(y)


@tessera.no_grad()
def estimate_loss(model: GPT, data: CharData, args, rng, iters: int = 8) -> dict:
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = [model(*data.batch(split, args.batch_size, args.block_size, rng))[1].item()
                  for _ in range(iters)]
        out[split] = float(np.mean(losses))
    model.train()
    return out


def lr_at(step: int, progress: float, args) -> float:
    """Linear warm-up, then cosine decay to a tenth as ``progress`` (the larger of the
    step and time fractions used) goes to 1, so the decay ends at whichever limit comes
    first."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = min(1.0, progress)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(model: GPT, data: CharData, args, rng) -> float:
    """Train until --steps or --minutes runs out; returns the last smoothed train loss."""
    opt = tessera.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1,
                              betas=(0.9, 0.99))
    start, budget = time.monotonic(), 60 * args.minutes
    smooth = None
    bar = tqdm(range(args.steps), desc="training", unit="step")
    for step in bar:
        elapsed = time.monotonic() - start
        if elapsed > budget:
            print(f"\ntime limit of {args.minutes} min reached after {step} steps")
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, max(step / args.steps, elapsed / budget), args)
        x, y = data.batch("train", args.batch_size, args.block_size, rng)
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        tessera.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = loss.item()
        smooth = value if smooth is None else 0.95 * smooth + 0.05 * value
        if hasattr(bar, "set_postfix") and step % 10 == 0:
            bar.set_postfix(loss=f"{smooth:.3f}")
    return smooth


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=DATA, help="a UTF-8 text file (default: the sonnets)")
    ap.add_argument("--minutes", type=float, default=3.0, help="training time limit")
    ap.add_argument("--steps", type=int, default=600, help="training step limit")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--block-size", type=int, default=64, help="context length (chars)")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--prompt", default="When ", help="text to continue")
    ap.add_argument("--length", type=int, default=400, help="characters to generate")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args(argv)

    tessera.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    data = CharData(args.data)
    cfg = GPTConfig(block_size=args.block_size, vocab_size=len(data.chars),
                    n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                    dropout=args.dropout)
    model = GPT(cfg)
    print(f"{len(data.train):,} train / {len(data.val):,} val characters, vocabulary "
          f"{len(data.chars)}; GPT with {model.get_num_params():,} parameters")

    t0 = time.monotonic()
    smooth = train(model, data, args, rng)
    losses = estimate_loss(model, data, args, rng)
    print(f"trained for {time.monotonic() - t0:.0f}s: final train loss {losses['train']:.4f}"
          f" (smoothed {smooth:.4f}), val loss {losses['val']:.4f} nats/char")

    model.eval()
    prompt = tessera.tensor([data.encode(args.prompt)], dtype=tessera.int64)
    t0 = time.monotonic()
    out = model.generate(prompt, args.length, temperature=args.temperature,
                         top_k=args.top_k)
    rate = args.length / (time.monotonic() - t0)
    print(f"\n--- sample ({rate:.0f} chars/s, temperature {args.temperature}, "
          f"top-k {args.top_k}) ---")
    print(data.decode(out[0].tolist()))


if __name__ == "__main__":
    main()
