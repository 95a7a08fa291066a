"""Tensor (model) parallelism, Megatron style, expressed purely with SBP on the weights.

Nothing here calls a collective: each layer only says how its weights are laid out and
which SBP its input should have, and the ops on global tensors insert the communication
(OneFlow's way):

* ``ColumnParallelLinear``: ``weight`` split(0) and ``bias`` split(0), so each rank holds
  some output features. The input is boxed to broadcast (Megatron's *f*: identity forward,
  all-reduce backward: the gradient of a broadcast input is partial_sum); the output is
  split on its last dim (or broadcast with ``gather_output=True``).
* ``RowParallelLinear``: ``weight`` split(1), ``bias`` broadcast. Its input is split on the
  last dim (``input_is_parallel``), so the product is ``S(1) x S(0) -> partial_sum``
  (Megatron's *g*): the output stays partial_sum and the op that reads it boxes it, e.g.
  a LayerNorm after the residual reduce-scatters it to a batch split, and the next
  column-parallel layer all-gathers it (together the bytes of one all-reduce).
* ``ParallelMLP``: column-parallel, activation, row-parallel (no communication between).
* ``ParallelMultiheadAttention``: q, k, v column-parallel, so each rank holds whole heads
  (``num_heads`` must divide over the ranks); attention runs on the heads split; the output
  projection is row-parallel.
* ``ParallelTransformerEncoderLayer``: ``nn.TransformerEncoderLayer`` with the two blocks
  above; ``from_dense(layer)`` takes a dense layer's weights (the packed ``in_proj``
  becomes q, k, v), ``to_dense()`` gives them back.

The same recipe on a plain ``nn.Linear``: ``fc1.to_global(p, tessera.sbp.split(0))``
(column) and ``fc2.to_global(p, lambda t: split(1) if t.dim() == 2 else broadcast)`` (row).

>>> import tessera
>>> from tessera.nn.parallel import ColumnParallelLinear, RowParallelLinear
>>> fc1, fc2 = ColumnParallelLinear(4, 8), RowParallelLinear(8, 4)
>>> y = fc2(fc1(tessera.ones(2, 4)))      # on 2 ranks: y is partial_sum
>>> fc1.weight.sbp, fc2.weight.sbp, y.shape
((tessera.sbp.split(dim=0),), (tessera.sbp.split(dim=1),), tessera.Size([2, 4]))
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.distributed.placement import placement as Placement
from tessera.nn import functional as F
from tessera.nn.modules.dropout import Dropout
from tessera.nn.modules.linear import Linear
from tessera.nn.modules.module import Module
from tessera.nn.modules.normalization import LayerNorm
from tessera.sbp import broadcast, split

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP",
           "ParallelMultiheadAttention", "ParallelTransformerEncoderLayer"]


def _placement(p) -> Placement:
    if p is None:
        return Placement.all("cpu")
    if not isinstance(p, Placement) or p.ndim != 1:
        raise ValueError(f"tensor parallel layers take a 1-D tessera.placement, got {p!r}")
    return p


def _as_global(x: Tensor, p: Placement, sbp) -> Tensor:
    """``x`` with ``sbp``: a local input is every rank's copy of the whole (broadcast)."""
    if not x.is_global:
        x = x.to_global(p, broadcast)
    return x.to_global(sbp=sbp)


class ColumnParallelLinear(Linear):
    """``y = x W^T + b`` with ``W`` split(0) and ``b`` split(0) over ``placement`` (all
    ranks by default): each rank computes ``out_features / n`` of the outputs."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 placement=None, gather_output: bool = False, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.placement = _placement(placement)
        self.gather_output = gather_output
        self.to_global(self.placement, split(0))

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(_as_global(x, self.placement, broadcast), self.weight, self.bias)
        return y.to_global(sbp=broadcast) if self.gather_output else y

    def extra_repr(self) -> str:
        return super().extra_repr() + f", gather_output={self.gather_output}"


class RowParallelLinear(Linear):
    """``y = x W^T + b`` with ``W`` split(1) and ``b`` broadcast: each rank multiplies its
    share of the input features; the output is partial_sum."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 placement=None, input_is_parallel: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.placement = _placement(placement)
        self.input_is_parallel = input_is_parallel
        self.to_global(self.placement, lambda t: split(1) if t.dim() == 2 else broadcast)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(_as_global(x, self.placement, split(-1)), self.weight, self.bias)


class ParallelMLP(Module):
    """``fc2(act(fc1(x)))`` with ``fc1`` column- and ``fc2`` row-parallel."""

    def __init__(self, d_model: int, dim_feedforward: int, activation="gelu",
                 bias: bool = True, placement=None, device=None, dtype=None):
        super().__init__()
        p = _placement(placement)
        self.fc1 = ColumnParallelLinear(d_model, dim_feedforward, bias, p, device=device,
                                        dtype=dtype)
        self.fc2 = RowParallelLinear(dim_feedforward, d_model, bias, p, device=device,
                                     dtype=dtype)
        self.activation = _activation(activation)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.activation(self.fc1(x)))


def _activation(a):
    if a == "relu":
        return F.relu
    if a == "gelu":
        return F.gelu
    if callable(a):
        return a
    raise RuntimeError(f"activation should be relu/gelu, not {a}")


class ParallelMultiheadAttention(Module):
    """Self-attention with the heads split over the ranks (q, k, v column-parallel, the
    output projection row-parallel). Inputs are ``(N, L, E)`` with ``batch_first``, else
    ``(L, N, E)``; returns ``(output, None)`` like ``nn.MultiheadAttention`` without
    weights."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 bias: bool = True, batch_first: bool = False, placement=None, device=None,
                 dtype=None):
        super().__init__()
        p = _placement(placement)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads "
                             f"({num_heads})")
        if num_heads % p.size:
            raise ValueError(f"ParallelMultiheadAttention: {num_heads} heads do not split "
                             f"evenly over the {p.size} ranks of {p}")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.head_dim = embed_dim // num_heads
        self.batch_first, self.placement = batch_first, p
        kw = dict(device=device, dtype=dtype)
        self.q_proj = ColumnParallelLinear(embed_dim, embed_dim, bias, p, **kw)
        self.k_proj = ColumnParallelLinear(embed_dim, embed_dim, bias, p, **kw)
        self.v_proj = ColumnParallelLinear(embed_dim, embed_dim, bias, p, **kw)
        self.out_proj = RowParallelLinear(embed_dim, embed_dim, bias, p, **kw)

    def forward(self, x: Tensor, attn_mask=None, is_causal: bool = False):
        x = _as_global(x, self.placement, broadcast)  # one all-gather for q, k and v
        if not self.batch_first:
            x = x.transpose(0, 1)
        n, seq = x.shape[0], x.shape[1]

        def heads(t):  # (N, L, E) split(2) -> (N, H, L, D) split(1)
            return t.view(n, seq, self.num_heads, self.head_dim).transpose(1, 2)
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        if attn_mask is not None and not attn_mask.is_global:
            attn_mask = attn_mask.to_global(self.placement, broadcast)
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask, p, is_causal)
        out = self.out_proj(out.transpose(1, 2).reshape(n, seq, self.embed_dim))
        return (out if self.batch_first else out.transpose(0, 1)), None


class ParallelTransformerEncoderLayer(Module):
    """``nn.TransformerEncoderLayer`` (post- or pre-norm) with tensor-parallel attention and
    feed-forward blocks; LayerNorms are broadcast (they run on the batch split the reduced
    block output is scattered to)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 placement=None, device=None, dtype=None):
        super().__init__()
        p = _placement(placement)
        kw = dict(device=device, dtype=dtype)
        self.self_attn = ParallelMultiheadAttention(d_model, nhead, dropout, bias, batch_first,
                                                    p, **kw)
        self.mlp = ParallelMLP(d_model, dim_feedforward, activation, bias, p, **kw)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        for norm in (self.norm1, self.norm2):
            norm.to_global(p, broadcast)
        self.dropout, self.dropout1, self.dropout2 = (Dropout(dropout) for _ in range(3))
        self.norm_first, self.batch_first, self.placement = norm_first, batch_first, p

    def forward(self, src: Tensor, src_mask=None, is_causal: bool = False) -> Tensor:
        x = _as_global(src, self.placement, broadcast) if not src.is_global else src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, is_causal))
        return self.norm2(x + self._ff_block(x))

    def _sa_block(self, x, mask, is_causal):
        return self.dropout1(self.self_attn(x, mask, is_causal)[0])

    def _ff_block(self, x):
        mlp = self.mlp
        return self.dropout2(mlp.fc2(self.dropout(mlp.activation(mlp.fc1(x)))))

    # ---- to and from nn.TransformerEncoderLayer ----------------------------------------
    @classmethod
    def from_dense(cls, layer, placement=None) -> ParallelTransformerEncoderLayer:
        """The tensor-parallel twin of ``layer`` (an ``nn.TransformerEncoderLayer``), with
        its weights (rank 0's copy)."""
        attn = layer.self_attn
        act = layer.activation
        out = cls(attn.embed_dim, attn.num_heads, layer.linear1.out_features,
                  attn.dropout, act, layer.norm1.eps, layer.self_attn.batch_first,
                  layer.norm_first, layer.linear1.bias is not None, placement,
                  dtype=layer.linear1.weight.dtype)
        with no_grad():
            for name, value in _dense_to_parallel(layer).items():
                target = out.get_parameter(name)
                target.copy_(_whole(value, out.placement).to_global(sbp=target.sbp))
        return out

    def to_dense(self) -> dict:
        """The weights as an ``nn.TransformerEncoderLayer`` state dict (NumPy arrays)."""
        whole = {k: v.detach().numpy() for k, v in self.named_parameters()}
        import numpy as np
        a = "self_attn."
        out = {f"{a}in_proj_weight": np.concatenate(
            [whole[f"{a}{x}_proj.weight"] for x in "qkv"]),
            f"{a}out_proj.weight": whole[f"{a}out_proj.weight"],
            "linear1.weight": whole["mlp.fc1.weight"], "linear2.weight": whole["mlp.fc2.weight"]}
        if f"{a}q_proj.bias" in whole:
            out[f"{a}in_proj_bias"] = np.concatenate([whole[f"{a}{x}_proj.bias"] for x in "qkv"])
            out[f"{a}out_proj.bias"] = whole[f"{a}out_proj.bias"]
            out["linear1.bias"], out["linear2.bias"] = whole["mlp.fc1.bias"], whole["mlp.fc2.bias"]
        for k, v in whole.items():
            if k.startswith("norm"):
                out[k] = v
        return out


def _whole(t: Tensor, p: Placement) -> Tensor:
    from tessera.distributed._module import whole_to_global
    return whole_to_global(t.detach(), p, broadcast)


def _dense_to_parallel(layer) -> dict:
    attn = layer.self_attn
    e = attn.embed_dim
    out = {}
    for i, x in enumerate("qkv"):
        out[f"self_attn.{x}_proj.weight"] = attn.in_proj_weight[i * e:(i + 1) * e]
        if attn.in_proj_bias is not None:
            out[f"self_attn.{x}_proj.bias"] = attn.in_proj_bias[i * e:(i + 1) * e]
    out["self_attn.out_proj.weight"] = attn.out_proj.weight
    pairs = [("mlp.fc1", layer.linear1), ("mlp.fc2", layer.linear2),
             ("norm1", layer.norm1), ("norm2", layer.norm2), ("self_attn.out_proj",
                                                              attn.out_proj)]
    for prefix, m in pairs:
        for name, param in m.named_parameters():
            out[f"{prefix}.{name}"] = param
    return out

