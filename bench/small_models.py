"""Small models as users' scripts write them, eager, tessera against PyTorch.

The models of the public small-model scripts users bring, written the way those scripts
write them (``torch`` is whichever framework the child imports), one training step each:

- char GRU: embedding 65 -> 64, 2-layer GRU of 256, seq 64, batch 32, Adam
- word LSTM: PyTorch's word_language_model (2-layer LSTM 200, bptt 35, batch 20, SGD with
  gradient clipping, tied weights off, 10k vocabulary)
- minGPT: 4 layers, 4 heads, 128 wide, block 64, batch 32, vocabulary 65, tanh GELU written
  with ``torch.pow(x, 3.0)``, masked softmax attention, AdamW
- nanoGPT: the same sizes through ``F.scaled_dot_product_attention(is_causal=True)``,
  ``nn.GELU()`` and bias-free LayerNorm, AdamW with weight-decay groups

Each (framework, model) runs in its own process (``bench.common.run_children``); the
table gives median step times and the ratio to PyTorch. Target: no model above 2x PyTorch,
the median ratio at most 1.2x.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time

MODELS = ("char GRU", "word LSTM", "minGPT", "nanoGPT")
FRAMEWORKS = ("tessera", "torch")


def _char_gru(torch):
    nn = torch.nn

    class CharRNN(nn.Module):
        def __init__(self, vocab=65, emb=64, hidden=256, layers=2):
            super().__init__()
            self.embed = nn.Embedding(vocab, emb)
            self.rnn = nn.GRU(emb, hidden, layers, batch_first=True)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, x, h=None):
            out, h = self.rnn(self.embed(x), h)
            return self.head(out), h

    model = CharRNN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    x = torch.randint(0, 65, (32, 64))
    y = torch.randint(0, 65, (32, 64))

    def step():
        logits, _ = model(x)
        loss = nn.functional.cross_entropy(logits.view(-1, 65), y.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def _word_lstm(torch):
    nn = torch.nn

    class RNNModel(nn.Module):
        def __init__(self, ntoken=10000, ninp=200, nhid=200, nlayers=2, dropout=0.2):
            super().__init__()
            self.drop = nn.Dropout(dropout)
            self.encoder = nn.Embedding(ntoken, ninp)
            self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
            self.decoder = nn.Linear(nhid, ntoken)
            self.ntoken = ntoken

        def forward(self, input, hidden):
            emb = self.drop(self.encoder(input))
            output, hidden = self.rnn(emb, hidden)
            output = self.drop(output)
            decoded = self.decoder(output).view(-1, self.ntoken)
            return nn.functional.log_softmax(decoded, dim=1), hidden

    model = RNNModel()
    criterion = nn.NLLLoss()
    data = torch.randint(0, 10000, (35, 20))
    target = torch.randint(0, 10000, (35 * 20,))
    weight = next(model.parameters())
    hidden = [(weight.new_zeros(2, 20, 200), weight.new_zeros(2, 20, 200))]

    def step():
        h = tuple(t.detach() for t in hidden[0])
        model.zero_grad()
        output, h = model(data, h)
        loss = criterion(output, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-20)
        hidden[0] = h
    return step


def _gpt(torch, nano: bool):
    nn, F = torch.nn, torch.nn.functional
    n_layer, n_head, n_embd, block, vocab, batch = 4, 4, 128, 64, 65, 32

    class NewGELU(nn.Module):  # minGPT's
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                               * (x + 0.044715 * torch.pow(x, 3.0))))

    class LayerNorm(nn.Module):  # nanoGPT's, without bias
        def __init__(self, ndim):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(ndim))

        def forward(self, x):
            return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.c_proj = nn.Linear(n_embd, n_embd)
            self.register_buffer("bias", torch.tril(torch.ones(block, block))
                                 .view(1, 1, block, block))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(n_embd, dim=2)
            k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
            q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
            v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
            if nano:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                att = F.softmax(att, dim=-1)
                y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = LayerNorm(n_embd) if nano else nn.LayerNorm(n_embd)
            self.attn = Attention()
            self.ln_2 = LayerNorm(n_embd) if nano else nn.LayerNorm(n_embd)
            self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd),
                                     nn.GELU() if nano else NewGELU(),
                                     nn.Linear(4 * n_embd, n_embd))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, n_embd)
            self.wpe = nn.Embedding(block, n_embd)
            self.h = nn.ModuleList([Block() for _ in range(n_layer)])
            self.ln_f = nn.LayerNorm(n_embd)
            self.lm_head = nn.Linear(n_embd, vocab, bias=False)

        def forward(self, idx, targets):
            pos = torch.arange(0, idx.size(1), dtype=torch.long).unsqueeze(0)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.h:
                x = blk(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)

    model = GPT()
    if nano:
        params = [p for p in model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95))
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.95), weight_decay=0.1)
    x = torch.randint(0, vocab, (batch, block))
    y = torch.randint(0, vocab, (batch, block))

    def step():
        loss = model(x, y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return step


BUILDERS = {"char GRU": _char_gru, "word LSTM": _word_lstm,
            "minGPT": lambda t: _gpt(t, nano=False), "nanoGPT": lambda t: _gpt(t, nano=True)}


def child(framework: str, name: str, steps: int) -> dict:
    if framework == "torch":
        import torch as lib
    else:
        import tessera as lib
    lib.manual_seed(0)
    step = BUILDERS[name](lib)
    for _ in range(2):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000)
    return {"ms": statistics.median(times)}


def run(steps: int = 15) -> list[dict]:
    from bench.common import run_children
    return [{"model": name, **run_children(
        {fw: [sys.executable, "-m", "bench.small_models", "--child", fw, name, str(steps)]
         for fw in FRAMEWORKS})} for name in MODELS]


def render(rows: list[dict]) -> str:
    from bench.common import table
    out, ratios = [], []
    for r in rows:
        t, p = r["tessera"], r["torch"]
        if "ms" in t and "ms" in p:
            ratios.append(t["ms"] / p["ms"])
            out.append((r["model"], f"{t['ms']:.1f}", f"{p['ms']:.1f}", f"{ratios[-1]:.2f}x"))
        else:
            out.append((r["model"], t.get("error", f"{t.get('ms', 0):.1f}"),
                        p.get("error", f"{p.get('ms', 0):.1f}"), "-"))
    text = table(out, ("model", "tessera ms", "torch ms", "ratio"))
    if ratios:
        text += f"\n  median ratio {statistics.median(ratios):.2f}x, worst {max(ratios):.2f}x"
    return text


TITLE = ("Small models as scripts write them, one eager training step (median of 15 after 2 "
         "warm-up; targets: every ratio <= 2, the median <= 1.2)")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        print(TITLE)
        print(render(run()))
