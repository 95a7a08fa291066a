"""The models the remat tests and benchmark train: each a (model, loss) maker taking a seed."""
from __future__ import annotations

import numpy as np

import tessera
from tessera import nn


def mlp(width: int = 64, layers: int = 6, batch: int = 256):
    mods: list = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.Tanh(), nn.Dropout(0.1)]
    x = np.random.default_rng(0).standard_normal((batch, width)).astype(np.float32)
    return nn.Sequential(*mods), (tessera.tensor(x),), lambda m, x: m(x).square().mean()


class _ResBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        y = self.drop(self.bn1(self.conv1(x)).relu())
        return (x + self.bn2(self.conv2(y))).relu()


def resnet(channels: int = 8, blocks: int = 4, batch: int = 8, size: int = 16):
    m = nn.Sequential(*[_ResBlock(channels) for _ in range(blocks)])
    x = np.random.default_rng(0).standard_normal((batch, channels, size, size)).astype(np.float32)
    return m, (tessera.tensor(x),), lambda m, x: m(x).mean()


def transformer(d: int = 32, layers: int = 3, batch: int = 4, seq: int = 16):
    m = nn.Sequential(*[nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.1, batch_first=True)
                        for _ in range(layers)])
    x = np.random.default_rng(0).standard_normal((batch, seq, d)).astype(np.float32)
    return m, (tessera.tensor(x),), lambda m, x: m(x).square().mean()


def gpt_mini(layers: int = 2, batch: int = 8, seq: int = 64, vocab: int = 64):
    from tessera.models.gpt2 import gpt
    m = gpt("gpt-mini", n_layer=layers, vocab_size=vocab, block_size=seq, dropout=0.1)
    rng = np.random.default_rng(0)
    idx = tessera.tensor(rng.integers(0, vocab, (batch, seq)))
    tgt = tessera.tensor(rng.integers(0, vocab, (batch, seq)))
    return m, (idx, tgt), lambda m, idx, tgt: m(idx, tgt)[1]


MODELS = {"mlp": mlp, "resnet": resnet, "transformer": transformer, "gpt_mini": gpt_mini}


def train(make, remat=None, steps: int = 2, optimizer: str = "SGD", lr: float = 0.01,
          passes=None, **kw):
    """``steps`` nn.Graph training steps (through ``passes``, by default the pipeline's);
    (losses, parameters after, the graph)."""
    tessera.manual_seed(0)
    model, inputs, loss_fn = make(**kw)
    opt = getattr(tessera.optim, optimizer)(model.parameters(), lr=lr)

    class Step(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, *xs):
            loss = loss_fn(self.model, *xs)
            loss.backward()
            return loss

    g = Step()
    if passes is not None:
        g.config.passes = passes
    if remat is not None:
        g.config.enable_remat(**remat)
    tessera.manual_seed(1)
    losses = [g(*inputs).item() for _ in range(steps)]
    return losses, [p.detach().numpy().copy() for p in model.parameters()], g
