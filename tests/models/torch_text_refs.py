"""Plain-PyTorch reference models (the test oracle) for tessera.models.bert and .gpt.

Written from the published architectures with the same parameter names (Hugging Face
``BertModel``; nanoGPT's GPT-2), in plain ``torch.nn`` and without tessera, so that
copying a state dict through NumPy must give the same outputs and gradients.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- BERT ------------------------------------------------------------------------------------


class TorchBertEmbeddings(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], h,
                                            padding_idx=cfg.get("pad_token_id", 0))
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], h)
        self.token_type_embeddings = nn.Embedding(cfg["type_vocab_size"], h)
        self.LayerNorm = nn.LayerNorm(h, eps=cfg["layer_norm_eps"])
        self.dropout = nn.Dropout(cfg["hidden_dropout_prob"])

    def forward(self, ids, token_type_ids=None):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(ids)
        pos = torch.arange(ids.shape[1])[None]
        x = (self.word_embeddings(ids) + self.position_embeddings(pos)
             + self.token_type_embeddings(token_type_ids))
        return self.dropout(self.LayerNorm(x))


class TorchBertSelf(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)

    def forward(self, x, ext_mask):
        b, s, h = x.shape
        d = h // self.heads

        def split(t):
            return t.view(b, s, self.heads, d).permute(0, 2, 1, 3)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        if ext_mask is not None:
            scores = scores + ext_mask
        probs = scores.softmax(-1)
        return (probs @ v).permute(0, 2, 1, 3).reshape(b, s, h)


class TorchBertDenseNorm(nn.Module):
    def __init__(self, cfg: dict, n_in: int) -> None:
        super().__init__()
        self.dense = nn.Linear(n_in, cfg["hidden_size"])
        self.LayerNorm = nn.LayerNorm(cfg["hidden_size"], eps=cfg["layer_norm_eps"])

    def forward(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)


class TorchBertAttention(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.self = TorchBertSelf(cfg)
        self.output = TorchBertDenseNorm(cfg, cfg["hidden_size"])

    def forward(self, x, ext_mask):
        return self.output(self.self(x, ext_mask), x)


class TorchBertIntermediate(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg["hidden_size"], cfg["intermediate_size"])

    def forward(self, x):
        return F.gelu(self.dense(x))


class TorchBertLayer(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.attention = TorchBertAttention(cfg)
        self.intermediate = TorchBertIntermediate(cfg)
        self.output = TorchBertDenseNorm(cfg, cfg["intermediate_size"])

    def forward(self, x, ext_mask):
        a = self.attention(x, ext_mask)
        return self.output(self.intermediate(a), a)


class TorchBertEncoder(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.layer = nn.ModuleList(TorchBertLayer(cfg) for _ in range(cfg["num_hidden_layers"]))


class TorchBertPooler(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg["hidden_size"], cfg["hidden_size"])


class TorchBert(nn.Module):
    """Hugging Face ``BertModel`` in eval mode (no dropout), from a config.json dict."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.embeddings = TorchBertEmbeddings(cfg)
        self.encoder = TorchBertEncoder(cfg)
        self.pooler = TorchBertPooler(cfg)

    def forward(self, ids, attention_mask=None, token_type_ids=None):
        x = self.embeddings(ids, token_type_ids)
        ext = None
        if attention_mask is not None:
            keep = attention_mask[:, None, None, :].to(x.dtype)
            ext = (1.0 - keep) * torch.finfo(x.dtype).min
        for layer in self.encoder.layer:
            x = layer(x, ext)
        pooled = torch.tanh(self.pooler.dense(x[:, 0]))
        return x, pooled


def torch_mean_pool(hidden, mask):
    m = mask[..., None].float()
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


# ---- GPT ---------------------------------------------------------------------------------------


class TorchCausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).bool(),
                             persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                   for z in (q, k, v))
        att = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1))
        att = att.masked_fill(~self.bias[:t, :t], float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(b, t, c))


class TorchMLP(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class TorchBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = TorchCausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = TorchMLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TorchGPT(nn.Module):
    """nanoGPT's GPT-2 (no dropout) with a tied ``lm_head``."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int,
                 n_embd: int) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList(TorchBlock(n_embd, n_head, block_size) for _ in range(n_layer)),
            ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss


# ---- copying weights ----------------------------------------------------------------------------


def copy_torch_to_tessera(torch_model: nn.Module, tessera_model) -> None:
    """Load the torch model's state dict into the tessera model, through NumPy."""
    import tessera
    state = {k: tessera.from_numpy(v.detach().numpy().copy())
             for k, v in torch_model.state_dict().items()}
    tessera_model.load_state_dict(state, strict=True)


def to_numpy(t) -> np.ndarray:
    return np.asarray(t.detach().numpy())
