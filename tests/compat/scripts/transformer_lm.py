"""An ordinary PyTorch training script: a small Transformer language model on synthetic
tokens (next-token prediction over a repeating pattern with noise).

Uses only ``import torch``; see cnn_mnist_style.py for how the compat test runs it.
Dropout is 0 so both frameworks compute the same function.
"""
import math

import numpy as np
import torch
import torch.nn as nn


class TinyLM(nn.Module):
    def __init__(self, vocab=32, d_model=32, nhead=4, layers=2, seq=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=64, dropout=0.0,
                                           batch_first=True, activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        self.seq = seq

    def forward(self, tokens):
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.size(1))
        h = self.embed(tokens) * math.sqrt(self.embed.embedding_dim) + self.pos
        h = self.encoder(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))


def make_tokens(n=256, seq=17, vocab=32, seed=0):
    rng = np.random.default_rng(seed)
    start = rng.integers(0, vocab, (n, 1))
    toks = (start + 3 * np.arange(seq)[None, :]) % vocab
    noise = rng.random((n, seq)) < 0.1
    toks = np.where(noise, rng.integers(0, vocab, (n, seq)), toks)
    return torch.from_numpy(toks.astype(np.int64))


def main(initial_state=None, steps=50):
    torch.manual_seed(0)
    model = TinyLM()
    if initial_state is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in initial_state.items()})
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    data = make_tokens()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for step in range(steps):
        batch = data[(step * 16) % 256:(step * 16) % 256 + 16]
        inp, tgt = batch[:, :-1], batch[:, 1:]
        logits = model(inp)
        loss = loss_fn(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, start, None
