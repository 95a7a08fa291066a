"""Vision Transformer with torchvision's structure and parameter names (``conv_proj``,
``class_token``, ``encoder.pos_embedding``, ``encoder.layers.encoder_layer_N.ln_1`` /
``self_attention`` / ``ln_2`` / ``mlp.0`` / ``mlp.3``, ``encoder.ln``, ``heads.head``).

``vit_tiny`` is ViT-Ti/16 (DeiT-Tiny's shape: 192 wide, 12 layers, 3 heads, MLP 768).

>>> import tessera
>>> m = tessera.models.vit_tiny(num_classes=10, image_size=32, num_layers=1).eval()
>>> m(tessera.zeros(1, 3, 32, 32)).shape
tessera.Size([1, 10])
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any

from tessera import nn
from tessera._tensor import Tensor
from tessera.ops.creation import empty, zeros
from tessera.ops.shape import cat

__all__ = ["VisionTransformer", "EncoderBlock", "Encoder", "MLPBlock", "vit_tiny"]

_LayerNorm = partial(nn.LayerNorm, eps=1e-6)


class MLPBlock(nn.Sequential):
    """Linear -> GELU -> Dropout -> Linear -> Dropout ("0" ... "4"), as torchvision.ops.MLP."""

    _version = 2

    def __init__(self, in_dim: int, mlp_dim: int, dropout: float) -> None:
        super().__init__(nn.Linear(in_dim, mlp_dim), nn.GELU(), nn.Dropout(dropout),
                         nn.Linear(mlp_dim, in_dim), nn.Dropout(dropout))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.normal_(m.bias, std=1e-6)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs, *args, **kwargs) -> None:
        # checkpoints from torchvision < 0.13 name the linears linear_1 / linear_2
        version = local_metadata.get("version", None)
        if version is None or version < 2:
            for i in range(2):
                for kind in ("weight", "bias"):
                    old_key = f"{prefix}linear_{i + 1}.{kind}"
                    if old_key in state_dict:
                        state_dict[f"{prefix}{3 * i}.{kind}"] = state_dict.pop(old_key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs, *args, **kwargs)


class EncoderBlock(nn.Module):
    """Pre-norm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, num_heads: int, hidden_dim: int, mlp_dim: int, dropout: float,
                 attention_dropout: float,
                 norm_layer: Callable[..., nn.Module] = _LayerNorm) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = norm_layer(hidden_dim)
        self.self_attention = nn.MultiheadAttention(hidden_dim, num_heads,
                                                    dropout=attention_dropout, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = norm_layer(hidden_dim)
        self.mlp = MLPBlock(hidden_dim, mlp_dim, dropout)

    def forward(self, input: Tensor) -> Tensor:
        if input.dim() != 3:
            raise AssertionError(
                f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}")
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x) + input
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    """Learned position embeddings, ``num_layers`` EncoderBlocks and a final LayerNorm."""

    def __init__(self, seq_length: int, num_layers: int, num_heads: int, hidden_dim: int,
                 mlp_dim: int, dropout: float, attention_dropout: float,
                 norm_layer: Callable[..., nn.Module] = _LayerNorm) -> None:
        super().__init__()
        # batch first: (1, seq, dim), initialised as in BERT
        self.pos_embedding = nn.Parameter(
            empty(1, seq_length, hidden_dim).normal_(std=0.02))
        self.dropout = nn.Dropout(dropout)
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        for i in range(num_layers):
            layers[f"encoder_layer_{i}"] = EncoderBlock(num_heads, hidden_dim, mlp_dim, dropout,
                                                        attention_dropout, norm_layer)
        self.layers = nn.Sequential(layers)
        self.ln = norm_layer(hidden_dim)

    def forward(self, input: Tensor) -> Tensor:
        if input.dim() != 3:
            raise AssertionError(
                f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}")
        return self.ln(self.layers(self.dropout(input + self.pos_embedding)))


class VisionTransformer(nn.Module):
    """ViT (Dosovitskiy et al. 2020) as torchvision builds it, with a patchify convolution
    ``conv_proj``, a class token, and ``heads`` reading the class token's output."""

    def __init__(self, image_size: int, patch_size: int, num_layers: int, num_heads: int,
                 hidden_dim: int, mlp_dim: int, dropout: float = 0.0,
                 attention_dropout: float = 0.0, num_classes: int = 1000,
                 representation_size: int | None = None,
                 norm_layer: Callable[..., nn.Module] = _LayerNorm) -> None:
        super().__init__()
        if image_size % patch_size != 0:
            raise AssertionError("Input shape indivisible by patch size!")
        self.image_size, self.patch_size = image_size, patch_size
        self.hidden_dim, self.mlp_dim = hidden_dim, mlp_dim
        self.attention_dropout, self.dropout = attention_dropout, dropout
        self.num_classes, self.representation_size = num_classes, representation_size
        self.norm_layer = norm_layer
        self.conv_proj = nn.Conv2d(3, hidden_dim, kernel_size=patch_size, stride=patch_size)
        seq_length = (image_size // patch_size) ** 2 + 1  # + the class token
        self.class_token = nn.Parameter(zeros(1, 1, hidden_dim))
        self.encoder = Encoder(seq_length, num_layers, num_heads, hidden_dim, mlp_dim, dropout,
                               attention_dropout, norm_layer)
        self.seq_length = seq_length
        heads: OrderedDict[str, nn.Module] = OrderedDict()
        if representation_size is None:
            heads["head"] = nn.Linear(hidden_dim, num_classes)
        else:
            heads["pre_logits"] = nn.Linear(hidden_dim, representation_size)
            heads["act"] = nn.Tanh()
            heads["head"] = nn.Linear(representation_size, num_classes)
        self.heads = nn.Sequential(heads)
        self._init_weights()

    def _init_weights(self) -> None:
        fan_in = self.conv_proj.in_channels * self.patch_size * self.patch_size
        nn.init.trunc_normal_(self.conv_proj.weight, std=math.sqrt(1 / fan_in))
        nn.init.zeros_(self.conv_proj.bias)
        if hasattr(self.heads, "pre_logits"):
            fan_in = self.heads.pre_logits.in_features
            nn.init.trunc_normal_(self.heads.pre_logits.weight, std=math.sqrt(1 / fan_in))
            nn.init.zeros_(self.heads.pre_logits.bias)
        nn.init.zeros_(self.heads.head.weight)
        nn.init.zeros_(self.heads.head.bias)

    def _process_input(self, x: Tensor) -> Tensor:
        """(n, c, h, w) images -> (n, patches, hidden_dim) tokens."""
        n, _, h, w = x.shape
        if h != self.image_size or w != self.image_size:
            raise AssertionError(f"Wrong image size! Expected {self.image_size}x"
                                 f"{self.image_size} but got {h}x{w}!")
        n_patches = (h // self.patch_size) * (w // self.patch_size)
        x = self.conv_proj(x).reshape(n, self.hidden_dim, n_patches)
        return x.permute(0, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        x = self._process_input(x)
        cls = self.class_token.expand(x.shape[0], -1, -1)
        x = self.encoder(cat([cls, x], dim=1))
        return self.heads(x[:, 0])


def vit_tiny(num_classes: int = 1000, image_size: int = 224, **kwargs) -> VisionTransformer:
    """ViT-Tiny/16: patch 16, 192 wide, 12 layers, 3 heads, MLP 768. ``kwargs`` override
    any of :class:`VisionTransformer`'s arguments (e.g. ``num_layers=2`` for a quick test).

    >>> vit_tiny(num_classes=10, image_size=32, num_layers=2).seq_length
    5
    """
    cfg: dict[str, Any] = {"patch_size": 16, "num_layers": 12, "num_heads": 3,
                           "hidden_dim": 192, "mlp_dim": 768}
    cfg.update(kwargs)
    return VisionTransformer(image_size=image_size, num_classes=num_classes, **cfg)
