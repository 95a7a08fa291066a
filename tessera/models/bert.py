"""BERT encoder with Hugging Face's parameter names, so ``model.safetensors`` files of
``BertModel`` (or of task models with the ``bert.`` prefix) load without renaming, and a
sentence embedder (mean pooling + L2 normalisation, as sentence-transformers does).

>>> import tessera
>>> cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
...                  num_attention_heads=4, intermediate_size=32)
>>> model = BertModel(cfg).eval()
>>> out = model(tessera.tensor([[2, 7, 9, 3]]), attention_mask=tessera.tensor([[1, 1, 1, 0]]))
>>> out.last_hidden_state.shape, out.pooler_output.shape
(tessera.Size([1, 4, 16]), tessera.Size([1, 16]))
>>> hidden, pooled = out
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import tessera.nn as nn
import tessera.nn.functional as F
from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.ops.creation import arange, tensor, zeros
from tessera.ops.shape import cat
from tessera.ops.unary import tanh
from tessera.serialization import load

__all__ = ["BertConfig", "BertModel", "BertOutput", "SentenceEmbedder", "mean_pool"]

# what HF adds to an attention score to mask it (float32's lowest value; not -inf, so a row
# with every key masked still gives a finite, uniform softmax, as in transformers)
_MASK_VALUE = -3.4028234663852886e38

# keys in HF checkpoints that are not parameters of the encoder (registered buffers)
_HF_EXTRAS = ("embeddings.position_ids",)


@dataclasses.dataclass
class BertConfig:
    """The fields of a Hugging Face BERT ``config.json`` that define the encoder."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    add_pooling_layer: bool = True

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; expected one "
                             f"of {sorted(_ACTIVATIONS)}")

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> BertConfig:
        """Take the known fields of a config dict; others (``architectures``...) are ignored."""
        pet = cfg.get("position_embedding_type", "absolute")
        if pet != "absolute":
            raise ValueError(f"position_embedding_type {pet!r} is not supported (only "
                             "'absolute')")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in cfg.items() if k in names})

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> BertConfig:
        """Read a ``config.json`` file (or the one inside a folder)."""
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path, encoding="utf-8") as fh:
            return cls.from_dict(json.load(fh))

    from_pretrained = from_json_file

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),  # BERT's exact erf GELU
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


class BertOutput(tuple):
    """``(last_hidden_state, pooler_output)``, also reachable by those attribute names."""

    def __new__(cls, last_hidden_state: Tensor, pooler_output: Tensor | None = None):
        return super().__new__(cls, (last_hidden_state, pooler_output))

    @property
    def last_hidden_state(self) -> Tensor:
        return self[0]

    @property
    def pooler_output(self) -> Tensor | None:
        return self[1]

    def __repr__(self) -> str:
        return (f"BertOutput(last_hidden_state={self[0]!r}, pooler_output={self[1]!r})")


# ---- modules (class and attribute names follow transformers' modeling_bert) ----------------

class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                            padding_idx=cfg.pad_token_id)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.max_positions = cfg.max_position_embeddings

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        seq = input_ids.size(1)
        if seq > self.max_positions:
            raise ValueError(f"BertModel: sequence length {seq} exceeds "
                             f"max_position_embeddings {self.max_positions}")
        x = self.word_embeddings(input_ids)
        pos = arange(seq, device=input_ids.device)
        x = x + self.position_embeddings(pos)
        if token_type_ids is None:
            # type 0 for every token: one broadcast row instead of a (B, S) lookup
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout_p = cfg.attention_probs_dropout_prob

    def _heads(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        q, v = self._heads(self.query(x)), self._heads(self.value(x))
        k = _keys_for_sdpa(self._heads(self.key(x)))
        p = self.dropout_p if self.training else 0.0
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        b, _, s, _ = ctx.shape
        return ctx.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)


def _keys_for_sdpa(k: Tensor) -> Tensor:
    """(B, H, S, D) keys as a view of a C-contiguous (B, H, D, S) tensor, so that the
    ``key.transpose(-2, -1)`` inside SDPA is contiguous: NumPy's batched matmul runs 2-3x
    slower on a transposed view than on a contiguous copy (measured at 8x12x128x32)."""
    return k.transpose(-2, -1).contiguous().transpose(-2, -1)


class BertSelfOutput(nn.Module):
    def __init__(self, cfg: BertConfig, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


BertOutputLayer = BertSelfOutput  # transformers' "BertOutput" module has the same shape


class BertAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg, cfg.hidden_size)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutputLayer(cfg, cfg.intermediate_size)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        a = self.attention(x, mask)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(cfg) for _ in range(cfg.num_hidden_layers)])

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertPooler(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden: Tensor) -> Tensor:
        return tanh(self.dense(hidden[:, 0]))


class BertModel(nn.Module):
    """The BERT encoder: ``model(input_ids, attention_mask=None, token_type_ids=None)``
    returns a BertOutput ``(last_hidden_state (B, S, H), pooler_output (B, H))``.

    ``attention_mask`` is 1 for real tokens and 0 for padding (any integer, bool or float
    dtype); ``token_type_ids`` default to 0.
    """

    def __init__(self, config: BertConfig | dict, add_pooling_layer: bool | None = None) -> None:
        super().__init__()
        if isinstance(config, dict):
            config = BertConfig.from_dict(config)
        if add_pooling_layer is not None:
            config = dataclasses.replace(config, add_pooling_layer=add_pooling_layer)
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if config.add_pooling_layer else None
        self._init_weights()

    def _init_weights(self) -> None:
        """transformers' init: N(0, initializer_range) weights, zero biases, unit LayerNorms."""
        std = self.config.initializer_range
        with no_grad():
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    m.weight.normal_(0.0, std)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    m.bias.zero_()
                if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                    m.weight[m.padding_idx].zero_()
                if isinstance(m, nn.LayerNorm):
                    m.weight.fill_(1.0)
                    m.bias.zero_()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> BertOutput:
        if input_ids.dim() != 2:
            raise ValueError(f"BertModel: input_ids must be (batch, seq), got shape "
                             f"{list(input_ids.shape)}")
        x = self.embeddings(input_ids, token_type_ids)
        mask = None
        if attention_mask is not None:
            if tuple(attention_mask.shape) != tuple(input_ids.shape):
                raise ValueError(f"BertModel: attention_mask shape {list(attention_mask.shape)}"
                                 f" does not match input_ids shape {list(input_ids.shape)}")
            # (B, S) -> additive (B, 1, 1, S): 0 where attended, a huge negative where padded
            keep = attention_mask.to(D.bool_)[:, None, None, :]
            mask = zeros(keep.shape, dtype=x.dtype, device=x.device).masked_fill(
                keep.logical_not(), _MASK_VALUE)
        hidden = self.encoder(x, mask)
        pooled = self.pooler(hidden) if self.pooler is not None else None
        return BertOutput(hidden, pooled)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, **config_overrides: Any) -> BertModel:
        """Build from a Hugging Face folder: ``config.json`` + ``model.safetensors``.

        Keys may carry the ``bert.`` prefix of task models (whose head weights, outside the
        prefix, are then skipped); ``embeddings.position_ids`` is ignored. Any other missing
        or unexpected key raises a RuntimeError naming it. A checkpoint without pooler weights
        gives a model without a pooler (``pooler_output`` None). Returns it in eval mode.
        """
        folder = os.fspath(folder)
        cfg = BertConfig.from_json_file(os.path.join(folder, "config.json"))
        if config_overrides:
            cfg = dataclasses.replace(cfg, **config_overrides)
        weights = os.path.join(folder, "model.safetensors")
        if not os.path.exists(weights):
            raise FileNotFoundError(f"BertModel.from_pretrained: no model.safetensors in "
                                    f"{folder} (tessera reads safetensors weights only)")
        state = _strip_prefix(load(weights))
        if "add_pooling_layer" not in config_overrides and "pooler.dense.weight" not in state:
            # MLM checkpoints have no pooler: build without one rather than fail
            cfg = dataclasses.replace(cfg, add_pooling_layer=False)
        model = cls(cfg)
        model.load_hf_state_dict(state, where=weights)
        return model.eval()

    def load_hf_state_dict(self, state: dict[str, Tensor], where: str = "state dict") -> None:
        """Load a Hugging Face BERT state dict (see ``from_pretrained`` for the key rules)."""
        state = _strip_prefix(state)
        state = {k: v for k, v in state.items() if k not in _HF_EXTRAS}
        own = self.state_dict()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if missing or unexpected:
            raise RuntimeError(f"BertModel: {where} does not match the model built from its "
                               f"config: missing keys {missing}, unexpected keys {unexpected}")
        self.load_state_dict(state, strict=True)


def _strip_prefix(state: dict[str, Tensor], prefix: str = "bert.") -> dict[str, Tensor]:
    """Keys of a task model (``bert.encoder...``, ``cls.predictions...``) -> encoder keys."""
    if not any(k.startswith(prefix) for k in state):
        return dict(state)
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


# ---- sentence embeddings --------------------------------------------------------------------

def mean_pool(last_hidden_state: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Average of the token vectors that the mask marks as real: (B, S, H) -> (B, H).

    >>> h = tessera.ones(1, 3, 2); h[0, 2] = 5.0
    >>> mean_pool(h, tessera.tensor([[1, 1, 0]]))
    tensor([[1., 1.]])
    """
    if attention_mask is None:
        return last_hidden_state.mean(dim=1)
    m = attention_mask.to(last_hidden_state.dtype).unsqueeze(-1)
    # clamp as sentence-transformers does, so an all-padding row gives 0, not NaN
    return (last_hidden_state * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


class SentenceEmbedder:
    """tokenizer + BertModel + mean pooling (+ L2 normalisation): sentence-transformers'
    ``encode`` for BERT models such as all-MiniLM-L6-v2.

    ``SentenceEmbedder.from_pretrained(folder).encode(["a sentence", ...])`` gives an
    (N, hidden) tensor of unit vectors, so ``e @ e.T`` is the cosine-similarity matrix.
    """

    def __init__(self, model: BertModel, tokenizer, max_length: int = 256,
                 normalize: bool = True) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.normalize = normalize

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, normalize: bool = True,
                        max_length: int | None = None) -> SentenceEmbedder:
        """Model, tokenizer and ``max_seq_length`` (sentence_bert_config.json) of a folder."""
        from tessera.models.tokenizer import load_tokenizer
        folder = os.fspath(folder)
        if max_length is None:
            max_length = 256
            st_cfg = os.path.join(folder, "sentence_bert_config.json")
            if os.path.exists(st_cfg):
                with open(st_cfg, encoding="utf-8") as fh:
                    max_length = int(json.load(fh).get("max_seq_length", 256))
        return cls(BertModel.from_pretrained(folder), load_tokenizer(folder), max_length,
                   normalize)

    def encode(self, sentences: str | Sequence[str], batch_size: int = 32,
               progress: bool = False) -> Tensor:
        """Embeddings of the sentences, (N, hidden) (or (hidden,) for one string)."""
        if isinstance(sentences, str):
            single, items = True, [sentences]
        else:
            single, items = False, list(sentences)
        # sort by length so that each batch pads little, then restore the order
        order = sorted(range(len(items)), key=lambda i: -len(items[i]))
        starts = range(0, len(items), batch_size)
        if progress:
            starts = _maybe_tqdm(starts, total=math.ceil(len(items) / batch_size))
        chunks = []
        with no_grad():
            for s in starts:
                batch = [items[i] for i in order[s:s + batch_size]]
                chunks.append(self._embed(batch))
        if not chunks:
            return zeros(0, self.model.config.hidden_size)
        out = cat(chunks)
        inverse = [0] * len(order)
        for pos, i in enumerate(order):
            inverse[i] = pos
        out = out[tensor(inverse, dtype=D.int64)]
        return out[0] if single else out

    def _embed(self, batch: list[str]) -> Tensor:
        enc = self.tokenizer(batch, padding=True, truncation=True, max_length=self.max_length)
        hidden = self.model(enc["input_ids"], attention_mask=enc["attention_mask"],
                            token_type_ids=enc["token_type_ids"]).last_hidden_state
        emb = mean_pool(hidden, enc["attention_mask"])
        return F.normalize(emb, p=2.0, dim=1) if self.normalize else emb

    __call__ = encode


def _maybe_tqdm(it, **kw):
    try:
        from tqdm import tqdm
    except ImportError:
        return it
    return tqdm(it, **kw)
