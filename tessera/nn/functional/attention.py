"""Attention: ``scaled_dot_product_attention`` and ``multi_head_attention_forward``,
composites of matmul, softmax and dropout (so autograd, meta and later tracing come from
those ops' rules).

>>> import tessera
>>> import tessera.nn.functional as F
>>> q = tessera.randn(2, 4, 5, 8)
>>> F.scaled_dot_product_attention(q, q, q, is_causal=True).shape
tessera.Size([2, 4, 5, 8])
"""
from __future__ import annotations

import math

import tessera
from tessera._tensor import Tensor

__all__ = ["scaled_dot_product_attention", "multi_head_attention_forward"]


def _apply_mask(scores: Tensor, attn_mask: Tensor | None) -> Tensor:
    if attn_mask is None:
        return scores
    if attn_mask.dtype is tessera.bool:
        return scores.masked_fill(attn_mask.logical_not(), float("-inf"))
    return scores + attn_mask


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """softmax(q k^T * scale + mask) v, over the last two dims; a bool mask marks the
    positions that may attend (True = keep), a float mask is added."""
    from tessera.nn.functional import dropout, softmax
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise RuntimeError("scaled_dot_product_attention: query, key and value must have at "
                           f"least 2 dims, got {list(query.shape)}, {list(key.shape)}, "
                           f"{list(value.shape)}")
    if query.size(-1) != key.size(-1):
        raise RuntimeError(f"scaled_dot_product_attention: query's last dim "
                           f"({query.size(-1)}) must match key's ({key.size(-1)})")
    if is_causal and attn_mask is not None:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be "
                           "set when is_causal=True")
    if enable_gqa and query.dim() >= 3 and query.size(-3) != key.size(-3):
        rep = query.size(-3) // key.size(-3)
        key = key.repeat_interleave(rep, dim=-3)
        value = value.repeat_interleave(rep, dim=-3)
    L, S = query.size(-2), key.size(-2)
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    scores = query.matmul(key.transpose(-2, -1)) * scale
    if is_causal:
        causal = tessera.ones(L, S, dtype=tessera.bool, device=query.device).tril()
        scores = scores.masked_fill(causal.logical_not(), float("-inf"))
    scores = _apply_mask(scores, attn_mask)
    weights = softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = dropout(weights, p=dropout_p, training=True)
    return weights.matmul(value)


def _in_projection(query, key, value, in_proj_weight, in_proj_bias, q_w, k_w, v_w,
                   use_separate):
    from tessera.nn.functional import linear
    e = query.size(-1)
    if not use_separate:
        w_q, w_k, w_v = in_proj_weight.chunk(3)
    else:
        w_q, w_k, w_v = q_w, k_w, v_w
    if in_proj_bias is not None:
        b_q, b_k, b_v = in_proj_bias.chunk(3)
    else:
        b_q = b_k = b_v = None
    del e
    return linear(query, w_q, b_q), linear(key, w_k, b_k), linear(value, w_v, b_v)


def multi_head_attention_forward(query, key, value, embed_dim_to_check: int, num_heads: int,
                                 in_proj_weight, in_proj_bias, bias_k, bias_v,
                                 add_zero_attn: bool, dropout_p: float, out_proj_weight,
                                 out_proj_bias, training: bool = True, key_padding_mask=None,
                                 need_weights: bool = True, attn_mask=None,
                                 use_separate_proj_weight: bool = False, q_proj_weight=None,
                                 k_proj_weight=None, v_proj_weight=None, static_k=None,
                                 static_v=None, average_attn_weights: bool = True,
                                 is_causal: bool = False):
    """PyTorch's functional multi-head attention on (L, N, E) inputs (or unbatched (L, E))."""
    from tessera.nn.functional import dropout, linear, pad, softmax
    unbatched = query.dim() == 2
    if unbatched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.size(0)
    if embed_dim != embed_dim_to_check:
        raise AssertionError(f"was expecting embedding dimension of {embed_dim_to_check}, but "
                             f"got {embed_dim}")
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise AssertionError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the "
                           "Transformer module method `generate_square_subsequent_mask` to "
                           "create this mask.")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None  # SDPA applies the causal mask itself
    else:
        is_causal = False
    q, k, v = _in_projection(query, key, value, in_proj_weight, in_proj_bias, q_proj_weight,
                             k_proj_weight, v_proj_weight, use_separate_proj_weight)
    if attn_mask is not None:
        if attn_mask.dim() == 2:
            if tuple(attn_mask.shape) != (tgt_len, src_len):
                raise RuntimeError(f"The shape of the 2D attn_mask is {attn_mask.shape}, but "
                                   f"should be {(tgt_len, src_len)}.")
            attn_mask = attn_mask.unsqueeze(0)
        elif attn_mask.dim() == 3:
            if tuple(attn_mask.shape) != (bsz * num_heads, tgt_len, src_len):
                raise RuntimeError(f"The shape of the 3D attn_mask is {attn_mask.shape}, but "
                                   f"should be {(bsz * num_heads, tgt_len, src_len)}.")
        else:
            raise RuntimeError(f"attn_mask's dimension {attn_mask.dim()} is not supported")
    if bias_k is not None and bias_v is not None:
        k = tessera.cat([k, bias_k.repeat(1, bsz, 1)])
        v = tessera.cat([v, bias_v.repeat(1, bsz, 1)])
        if attn_mask is not None:
            attn_mask = pad(attn_mask, (0, 1))
        if key_padding_mask is not None:
            key_padding_mask = pad(key_padding_mask, (0, 1))
    q = q.reshape(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
    k = (static_k if static_k is not None else
         k.reshape(k.size(0), bsz * num_heads, head_dim).transpose(0, 1))
    v = (static_v if static_v is not None else
         v.reshape(v.size(0), bsz * num_heads, head_dim).transpose(0, 1))
    if add_zero_attn:
        k = tessera.cat([k, tessera.zeros((bsz * num_heads, 1, head_dim), dtype=k.dtype)], dim=1)
        v = tessera.cat([v, tessera.zeros((bsz * num_heads, 1, head_dim), dtype=v.dtype)], dim=1)
        if attn_mask is not None:
            attn_mask = pad(attn_mask, (0, 1))
        if key_padding_mask is not None:
            key_padding_mask = pad(key_padding_mask, (0, 1))
    src_len = k.size(1)
    attn_mask = _merge_masks(attn_mask, key_padding_mask, bsz, num_heads, src_len, q.dtype)
    if not training:
        dropout_p = 0.0
    if need_weights:
        scores = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
        if attn_mask is not None:
            scores = scores + attn_mask
        weights = softmax(scores, dim=-1)
        if dropout_p > 0.0:
            weights = dropout(weights, p=dropout_p)
        out = weights.matmul(v)
        out = out.transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
        out = linear(out, out_proj_weight, out_proj_bias).view(tgt_len, bsz, embed_dim)
        weights = weights.view(bsz, num_heads, tgt_len, src_len)
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if unbatched:
            out, weights = out.squeeze(1), weights.squeeze(0)
        return out, weights
    if attn_mask is not None:
        attn_mask = attn_mask.view(bsz, num_heads, -1, src_len) if attn_mask.size(0) != 1 \
            else attn_mask.unsqueeze(0)
    q = q.view(bsz, num_heads, tgt_len, head_dim)
    k = k.view(bsz, num_heads, src_len, head_dim)
    v = v.view(bsz, num_heads, src_len, head_dim)
    out = scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
    out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
    out = linear(out, out_proj_weight, out_proj_bias).view(tgt_len, bsz, embed_dim)
    if unbatched:
        out = out.squeeze(1)
    return out, None


def _merge_masks(attn_mask, key_padding_mask, bsz, num_heads, src_len, dtype):
    """One float mask (0 or -inf) of shape (1 or N*H, L, S) from both masks."""
    def to_float(m):
        if m is None or m.dtype is not tessera.bool:
            return m
        return tessera.zeros(m.shape, dtype=dtype).masked_fill(m, float("-inf"))
    attn_mask = to_float(attn_mask)
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (bsz, src_len):
            raise RuntimeError(f"expecting key_padding_mask shape of {(bsz, src_len)}, but got "
                               f"{tuple(key_padding_mask.shape)}")
        kpm = to_float(key_padding_mask).view(bsz, 1, 1, src_len)
        kpm = kpm.expand(-1, num_heads, -1, -1).reshape(bsz * num_heads, 1, src_len)
        attn_mask = kpm if attn_mask is None else attn_mask + kpm
    return attn_mask
