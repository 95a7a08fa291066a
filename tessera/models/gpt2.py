"""A GPT-2 style decoder (nanoGPT's layout and parameter names): token and learned position
embeddings, pre-LayerNorm blocks of causal self-attention and a GELU MLP, a final LayerNorm
and an ``lm_head`` tied to the token embedding. ``generate()`` decodes greedily or by
sampling (temperature, top-k), reusing past keys and values through a KV cache.

>>> import tessera
>>> model = gpt("gpt-nano", vocab_size=11, block_size=16).eval()
>>> idx = tessera.tensor([[1, 2, 3]])
>>> logits, loss = model(idx, targets=tessera.tensor([[2, 3, 4]]))
>>> logits.shape, loss.dim()
(tessera.Size([1, 3, 11]), 0)
>>> model.generate(idx, max_new_tokens=4, do_sample=False).shape
tessera.Size([1, 7])
"""
from __future__ import annotations

import dataclasses
import math

import tessera.nn as nn
import tessera.nn.functional as F
from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.ops.creation import arange, ones, zeros
from tessera.ops.random import multinomial
from tessera.ops.shape import cat
from tessera.ops.sorting import topk

__all__ = ["GPTConfig", "GPT", "KVCache", "gpt"]


@dataclasses.dataclass
class GPTConfig:
    """Sizes of a GPT; the defaults are GPT-2 small (124M) with nanoGPT's padded vocab."""

    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if min(self.block_size, self.vocab_size, self.n_layer, self.n_head) < 1:
            raise ValueError(f"GPTConfig sizes must be positive, got {self}")


# minGPT's model sizes
_PRESETS = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt-mini": dict(n_layer=6, n_head=6, n_embd=192),
    "gpt-micro": dict(n_layer=4, n_head=4, n_embd=128),
    "gpt-nano": dict(n_layer=3, n_head=3, n_embd=48),
}


class KVCache:
    """Keys and values of the positions seen so far, per layer, in buffers preallocated to
    ``block_size`` so that each decoding step writes one slot instead of concatenating."""

    def __init__(self, config: GPTConfig, batch: int, dtype=None, device=None) -> None:
        head_dim = config.n_embd // config.n_head
        shape = (batch, config.n_head, config.block_size, head_dim)
        self.keys = [zeros(shape, dtype=dtype, device=device)
                     for _ in range(config.n_layer)]
        self.values = [zeros(shape, dtype=dtype, device=device)
                       for _ in range(config.n_layer)]
        self.capacity = config.block_size
        self.length = 0  # positions already stored (advanced by GPT.forward)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new (B, H, L, D) keys/values; return all keys/values so far."""
        end = self.length + k.size(2)
        if end > self.capacity:
            raise ValueError(f"KVCache: {end} positions exceed block_size {self.capacity}")
        with no_grad():
            self.keys[layer][:, :, self.length:end] = k
            self.values[layer][:, :, self.length:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.dropout = cfg.dropout

    def forward(self, x: Tensor, cache: KVCache | None = None, layer: int = 0) -> Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                   for z in self.c_attn(x).split(c, dim=2))
        p = self.dropout if self.training else 0.0
        if cache is None or cache.length == 0:
            if cache is not None:
                cache.update(layer, k, v)
            # SDPA multiplies by k.transpose(-2, -1): make that transpose C-contiguous, as
            # NumPy's batched matmul is 2-3x slower on transposed views (see bert.py)
            k_t = k.transpose(-2, -1).contiguous().transpose(-2, -1)
            y = F.scaled_dot_product_attention(q, k_t, v, dropout_p=p, is_causal=True)
        else:
            k, v = cache.update(layer, k, v)
            s = k.size(2)
            # new queries sit at the end: query i sees keys up to s - t + i (bottom-right
            # aligned causal mask; SDPA's is_causal is top-left aligned). One query sees all.
            mask = None if t == 1 else ones(
                (t, s), dtype=D.bool_, device=x.device).tril(diagonal=s - t)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        y = y.transpose(1, 2).reshape(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        # GPT-2's tanh-approximated GELU ("gelu_new")
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, cache: KVCache | None = None, layer: int = 0) -> Tensor:
        x = x + self.attn(self.ln_1(x), cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 style language model. ``model(idx, targets=None)`` on (B, T) token ids returns
    ``(logits (B, T, vocab), loss)``; the loss is the mean cross-entropy against
    ``targets`` (entries -1 ignored), or None without targets.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying: one Parameter, reached under both names
        self.lm_head.weight = self.transformer.wte.weight
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2's init: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer)."""
        with no_grad():
            for name, m in self.named_modules():
                if isinstance(m, (nn.Linear, nn.Embedding)) and m is not self.lm_head:
                    std = 0.02 / math.sqrt(2 * self.config.n_layer) \
                        if name.endswith("c_proj") else 0.02
                    m.weight.normal_(0.0, std)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    m.bias.zero_()

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameter count (the tied head counted once); without position embeddings by
        default, as GPT-2's paper counts."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def _hidden(self, idx: Tensor, cache: KVCache | None = None) -> Tensor:
        if idx.dim() != 2:
            raise ValueError(f"GPT: idx must be (batch, time) token ids, got shape "
                             f"{list(idx.shape)}")
        start = cache.length if cache is not None else 0
        t = idx.size(1)
        if start + t > self.config.block_size:
            raise ValueError(f"GPT: cannot forward a sequence of length {start + t}, the "
                             f"block size is only {self.config.block_size}")
        pos = arange(start, start + t, device=idx.device)
        tr = self.transformer
        x = tr.drop(tr.wte(idx) + tr.wpe(pos))
        for i, block in enumerate(tr.h):
            x = block(x, cache, i)
        if cache is not None:
            cache.length += t
        return tr.ln_f(x)

    def forward(self, idx: Tensor, targets: Tensor | None = None,
                kv_cache: KVCache | None = None) -> tuple[Tensor, Tensor | None]:
        logits = self.lm_head(self._hidden(idx, kv_cache))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                                   ignore_index=-1)
        return logits, loss

    def _next_logits(self, idx: Tensor, cache: KVCache | None) -> Tensor:
        # only the last position's logits: the head is the largest matmul for big vocabs
        return self.lm_head(self._hidden(idx, cache)[:, -1])

    @no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, do_sample: bool = True, use_cache: bool = True,
                 generator=None) -> Tensor:
        """Append ``max_new_tokens`` tokens to ``idx`` (B, T) and return (B, T + new).

        Each token is the argmax when ``do_sample`` is False (or ``temperature`` is 0),
        else drawn from softmax(logits / temperature) restricted to the ``top_k`` most
        likely tokens; ``tessera.manual_seed`` (or ``generator``) makes sampling
        reproducible. Sequences longer than ``block_size`` condition on their last
        ``block_size`` tokens. Call ``model.eval()`` first to switch dropout off.
        """
        _check_generate_args(idx, max_new_tokens, temperature, top_k)
        block = self.config.block_size
        cache = None
        for _ in range(max_new_tokens):
            if not use_cache:
                logits = self._next_logits(idx[:, -block:], None)
            elif cache is None or cache.length + 1 > block:
                # (re)fill the cache from the window; once the window slides, positions
                # shift, so every step refills (the same work as running without a cache)
                cache = KVCache(self.config, idx.size(0), dtype=self.lm_head.weight.dtype,
                                device=idx.device)
                logits = self._next_logits(idx[:, -block:], cache)
            else:
                logits = self._next_logits(idx[:, -1:], cache)
            nxt = _pick(logits, temperature, top_k, do_sample, generator)
            idx = cat([idx, nxt], dim=1)
        return idx


def _check_generate_args(idx, max_new_tokens, temperature, top_k) -> None:
    if idx.dim() != 2 or idx.size(1) == 0:
        raise ValueError(f"GPT.generate: idx must be a non-empty (batch, time) tensor of ids, "
                         f"got shape {list(idx.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"GPT.generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"GPT.generate: temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"GPT.generate: top_k must be >= 1, got {top_k}")


def _pick(logits: Tensor, temperature: float, top_k: int | None, do_sample: bool,
          generator) -> Tensor:
    """The next token (B, 1) from the last-position logits (B, V)."""
    if not do_sample or temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = topk(logits, top_k, dim=-1)[0][:, -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = F.softmax(logits, dim=-1)
    return multinomial(probs, 1, generator=generator)


def gpt(model_type: str = "gpt-mini", **overrides) -> GPT:
    """A GPT of one of minGPT's sizes ("gpt2", "gpt-mini", "gpt-micro", "gpt-nano"); other
    GPTConfig fields (vocab_size, block_size, dropout, bias, or the sizes) as keywords.

    >>> gpt("gpt-nano", vocab_size=65, block_size=32).config.n_embd
    48
    """
    if model_type not in _PRESETS:
        raise ValueError(f"unknown GPT model_type {model_type!r}; expected one of "
                         f"{sorted(_PRESETS)}")
    return GPT(GPTConfig(**{**_PRESETS[model_type], **overrides}))
