"""Attention: ``scaled_dot_product_attention`` and ``multi_head_attention_forward``,
composites of matmul, softmax, masked_fill and dropout (so autograd, meta and later tracing
come from those ops' rules). Where the fused op (``tessera.ops.attention``) computes the
same function (float32 on the CPU, a mask without a gradient, C kernels available),
``scaled_dot_product_attention`` dispatches it instead: one kernel that never writes the
L x S scores, with the same dropout mask for the same seed.

>>> import tessera
>>> import tessera.nn.functional as F
>>> q = tessera.randn(2, 4, 5, 8)
>>> F.scaled_dot_product_attention(q, q, q, is_causal=True).shape
tessera.Size([2, 4, 5, 8])
"""
from __future__ import annotations

import contextlib
import math
import warnings

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.ops.attention import fused_attention
from tessera.ops.broadcast import broadcast_shapes
from tessera.ops.comparison import isneginf
from tessera.ops.creation import ones, zeros
from tessera.ops.random import fresh_seed
from tessera.ops.shape import cat

__all__ = ["scaled_dot_product_attention", "multi_head_attention_forward"]

_UNFUSED = [0]  # depth of unfused_attention() blocks


@contextlib.contextmanager
def unfused_attention():
    """Within the block, ``scaled_dot_product_attention`` runs as its composite (matmul,
    softmax, masks), for consumers that have rules for those ops but not the fused one
    (``tessera.deploy``'s C library traces through it).

    >>> q = tessera.randn(1, 3, 4)
    >>> with unfused_attention():
    ...     torch_like = F.scaled_dot_product_attention(q, q, q)
    >>> tessera.testing.assert_close(torch_like, F.scaled_dot_product_attention(q, q, q))
    """
    _UNFUSED[0] += 1
    try:
        yield
    finally:
        _UNFUSED[0] -= 1


# ---- scaled dot-product attention -----------------------------------------------------------

def _check_sdpa(query, key, value, attn_mask, dropout_p, is_causal) -> None:
    """PyTorch's ``validate_sdpa_input`` plus the checks its kernels make."""
    if not (query.dtype == key.dtype == value.dtype):
        raise RuntimeError(f"Expected query, key, and value to have the same dtype, but got "
                           f"query.dtype: {query.dtype} key.dtype: {key.dtype} and "
                           f"value.dtype: {value.dtype} instead.")
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise RuntimeError(f"Expected query, key, and value to all be  at least 2 dimensional, "
                           f"but got query.dim: {query.dim()} key.dim: {key.dim()} and "
                           f"value.dim: {value.dim()} instead.")
    if not query.dtype.is_floating_point:
        raise RuntimeError(f"scaled_dot_product_attention: expected a floating-point query, "
                           f"got {query.dtype}")
    if attn_mask is not None and attn_mask.dtype not in (D.bool_, D.float32,
                                                         query.dtype):
        raise RuntimeError(f"Expected attn_mask dtype to be bool or float or to match query "
                           f"dtype, but got attn_mask.dtype: {attn_mask.dtype} and  "
                           f"query.dtype: {query.dtype} instead.")
    if is_causal and attn_mask is not None:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be "
                           "set when is_causal=True")
    if dropout_p > 1.0:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got "
                           f"{dropout_p}")


def _check_gqa(query, key, value) -> bool:
    """Whether key/value heads (dim -3) differ from the query's; PyTorch's errors when they
    do not divide them."""
    if query.dim() < 3 or key.dim() < 3 or value.dim() < 3:
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[{-min(query.dim(), key.dim(), value.dim())}, "
                         f"{min(query.dim(), key.dim(), value.dim()) - 1}], but got -3)")
    hq, hk, hv = query.size(-3), key.size(-3), value.size(-3)
    if hq == hk == hv:
        return False
    if hk == 0 or hv == 0 or hq % hk or hq % hv:
        raise RuntimeError("Number of heads in key and value must divide the number of heads "
                           f"in query ({hq} query heads, {hk} key heads, {hv} value heads)")
    return True


def _expand_gqa(query, key, value):
    """Repeat key/value heads (dim -3) so that they match the query's heads."""
    if not _check_gqa(query, key, value):
        return key, value
    hq, hk, hv = query.size(-3), key.size(-3), value.size(-3)
    if hk != hq:
        key = key.repeat_interleave(hq // hk, dim=-3)
    if hv != hq:
        value = value.repeat_interleave(hq // hv, dim=-3)
    return key, value


def _kv_batch(x, query, gqa: bool) -> tuple[int, ...]:
    """The batch dims of key or value ``x`` once its heads are repeated to the query's."""
    if gqa and x.dim() >= 3:
        return tuple(x.shape[:-3]) + (query.size(-3),)
    return tuple(x.shape[:-2])


def _check_mask_shape(attn_mask, query, key, gqa: bool = False) -> None:
    """The mask is added in place in PyTorch: it must broadcast *to* the scores' shape."""
    batch = tuple(broadcast_shapes(tuple(query.shape[:-2]), _kv_batch(key, query, gqa)))
    scores = batch + (query.size(-2), key.size(-2))
    mask = tuple(attn_mask.shape)
    ok = len(mask) <= len(scores) and all(
        m in (1, s) for m, s in zip(reversed(mask), reversed(scores)))
    if not ok:
        raise RuntimeError(f"scaled_dot_product_attention: attn_mask of shape {list(mask)} "
                           f"does not broadcast to the attention scores' shape {list(scores)}")


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, *, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """softmax(q k^T * scale + mask) v over the last two dims.

    A boolean ``attn_mask`` marks the positions that may be attended to (True = keep); a
    float mask is added to the scores. Rows with nothing to attend to give zeros (PyTorch's
    safe softmax), not NaN. ``is_causal`` applies the top-left aligned lower-triangular mask.

    >>> q = tessera.randn(2, 3, 4)
    >>> scaled_dot_product_attention(q, q, q, is_causal=True).shape
    tessera.Size([2, 3, 4])
    """
    from tessera.nn.functional import dropout, softmax
    _check_sdpa(query, key, value, attn_mask, dropout_p, is_causal)
    L, S, E = query.size(-2), key.size(-2), query.size(-1)
    if scale is None:
        scale = 1.0 / math.sqrt(E) if E > 0 else math.inf
    gqa = enable_gqa and _check_gqa(query, key, value)
    if attn_mask is not None and not is_causal:
        _check_mask_shape(attn_mask, query, key, gqa)
    if _fusable(query, key, value, attn_mask, dropout_p, gqa):
        return fused_attention(query, key, value, None if is_causal else attn_mask,
                               scale=scale, is_causal=is_causal,
                               dropout_p=max(dropout_p, 0.0),
                               seed=fresh_seed() if dropout_p > 0 else 0, enable_gqa=gqa)
    if gqa:
        key, value = _expand_gqa(query, key, value)
    # scaling q costs L*E multiplies instead of L*S for the scores
    q = query * scale if scale != 1.0 else query
    scores = q.matmul(key.transpose(-2, -1))
    dead = None
    if is_causal:
        keep = ones((L, S), dtype=D.bool_, device=query.device).tril()
        scores = scores.masked_fill(keep.logical_not(), -math.inf)
    elif attn_mask is not None:
        if attn_mask.dtype is D.bool_:
            attn_mask = zeros(attn_mask.shape, dtype=query.dtype,
                                      device=query.device).masked_fill(
                                          attn_mask.logical_not(), -math.inf)
        # rows whose every entry is -inf would give 0/0: softmax them unmasked (finite, and
        # no NaN in the backward either), then zero them, as PyTorch's safe softmax does
        dead = isneginf(attn_mask).all(-1, keepdim=True)
        scores = scores + attn_mask.masked_fill(dead, 0.0)
    weights = softmax(scores, dim=-1)
    if dead is not None:
        weights = weights.masked_fill(dead, 0.0)
    if dropout_p > 0.0:
        weights = dropout(weights, p=dropout_p, training=True)
    return weights.matmul(value)


def _fusable(query, key, value, attn_mask, dropout_p, gqa) -> bool:
    """Whether the fused op computes what the composite would: float32 on the CPU, no
    gradient for the mask, nothing empty, and (with dropout) weights of the batch shape
    the composite's dropout draws its mask in."""
    from tessera.kernels import attention
    if _UNFUSED[0] or not (query.dtype is key.dtype is value.dtype is D.float32):
        return False
    tensors = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
    # (a global tensor on a CPU placement runs the op on its tiles: the fused op's SBP
    # rule splits attention's batch and head dims)
    if any((t.placement.type if t.is_global else t.device.type) != "cpu" for t in tensors):
        return False
    if attn_mask is not None and (attn_mask.requires_grad or attn_mask.dtype not in
                                  (D.bool_, D.float32)):
        return False
    if min(query.numel(), key.numel(), value.numel()) == 0:
        return False
    if dropout_p > 0 and value.dim() > 2:
        # the composite's mask has the shape of the weights: batch of query and key only
        qk = tuple(broadcast_shapes(tuple(query.shape[:-2]), _kv_batch(key, query, gqa)))
        if tuple(broadcast_shapes(qk, _kv_batch(value, query, gqa))) != qk:
            return False
    return attention.available()


# ---- multi-head attention -------------------------------------------------------------------

def _none_or_dtype(input):
    if input is None:
        return None
    if isinstance(input, Tensor):
        return input.dtype
    raise RuntimeError("input to _none_or_dtype() must be None or torch.Tensor")


def _canonical_mask(mask, mask_name: str, other_type, other_name: str, target_type,
                    check_other: bool = True):
    """A boolean mask (True = masked) becomes an additive float mask (-inf where True)."""
    if mask is None:
        return None
    is_float = mask.dtype.is_floating_point
    if mask.dtype is not D.bool_ and not is_float:
        raise AssertionError(f"only bool and floating types of {mask_name} are supported")
    if check_other and other_type is not None and mask.dtype != other_type:
        warnings.warn(f"Support for mismatched {mask_name} and {other_name} is deprecated. "
                      "Use same type for both instead.", stacklevel=2)
    if not is_float:
        mask = zeros(mask.shape, dtype=target_type,
                             device=mask.device).masked_fill(mask, -math.inf)
    return mask


def _mha_shape_check(query, key, value, key_padding_mask, attn_mask, num_heads) -> bool:
    """PyTorch's checks of the input ranks; returns whether the input is batched."""
    if query.dim() not in (2, 3):
        raise AssertionError(f"query should be unbatched 2D or batched 3D tensor but received "
                             f"{query.dim()}-D query tensor")
    batched = query.dim() == 3
    kind = "batched (3-D)" if batched else "unbatched (2-D)"
    if key.dim() != query.dim() or value.dim() != query.dim():
        raise AssertionError(f"For {kind} `query`, expected `key` and `value` to be "
                             f"{query.dim()}-D but found {key.dim()}-D and {value.dim()}-D "
                             "tensors respectively")
    if key_padding_mask is not None and key_padding_mask.dim() != query.dim() - 1:
        raise AssertionError(f"For {kind} `query`, expected `key_padding_mask` to be `None` "
                             f"or {query.dim() - 1}-D but found {key_padding_mask.dim()}-D "
                             "tensor instead")
    if attn_mask is not None:
        if attn_mask.dim() not in (2, 3):
            raise AssertionError(f"For {kind} `query`, expected `attn_mask` to be `None`, 2-D "
                                 f"or 3-D but found {attn_mask.dim()}-D tensor instead")
        if not batched and attn_mask.dim() == 3:
            expected = (num_heads, query.shape[0], key.shape[0])
            if tuple(attn_mask.shape) != expected:
                raise AssertionError(f"Expected `attn_mask` shape to be {expected} but got "
                                     f"{attn_mask.shape}")
    return batched


def _in_projection_packed(q, k, v, w, b):
    """q, k, v projected by the packed (3E, E) weight: one GEMM for self-attention, two for
    encoder-decoder attention (k is v), three otherwise. Results are views of the GEMM
    output, split along the feature dim."""
    from tessera.nn.functional import linear
    E = q.size(-1)
    if k is v:
        if q is k:
            return linear(q, w, b).chunk(3, -1)
        w_q, w_kv = w.split([E, 2 * E], 0)
        b_q, b_kv = b.split([E, 2 * E], 0) if b is not None else (None, None)
        return (linear(q, w_q, b_q),) + linear(k, w_kv, b_kv).chunk(2, -1)
    w_q, w_k, w_v = w.chunk(3, 0)
    b_q, b_k, b_v = b.chunk(3, 0) if b is not None else (None, None, None)
    return linear(q, w_q, b_q), linear(k, w_k, b_k), linear(v, w_v, b_v)


def _in_projection(q, k, v, w_q, w_k, w_v, b):
    """Separate projection weights (``kdim``/``vdim`` != ``embed_dim``)."""
    from tessera.nn.functional import linear
    Eq, Ek, Ev = q.size(-1), k.size(-1), v.size(-1)
    for name, w, shape in (("query", w_q, (Eq, Eq)), ("key", w_k, (Eq, Ek)),
                           ("value", w_v, (Eq, Ev))):
        if tuple(w.shape) != shape:
            raise AssertionError(f"expecting {name} weights shape of {shape}, but got "
                                 f"{w.shape}")
    b_q, b_k, b_v = b.chunk(3, 0) if b is not None else (None, None, None)
    for name, bias in (("query", b_q), ("key", b_k), ("value", b_v)):
        if bias is not None and tuple(bias.shape) != (Eq,):
            raise AssertionError(f"expecting {name} bias shape of {(Eq,)}, but got "
                                 f"{bias.shape}")
    return linear(q, w_q, b_q), linear(k, w_k, b_k), linear(v, w_v, b_v)


def _heads(x, bsz: int, num_heads: int, head_dim: int):
    """(S, N, E) -> (N, H, S, head_dim), a view (no copy)."""
    return x.view(x.size(0), bsz, num_heads, head_dim).permute(1, 2, 0, 3)


def _static(t, name: str, bsz: int, num_heads: int, head_dim: int):
    """A user-given (N*H, S, head_dim) key or value as (N, H, S, head_dim)."""
    if t.size(0) != bsz * num_heads:
        raise AssertionError(f"expecting {name}.size(0) of {bsz * num_heads}, but got "
                             f"{t.size(0)}")
    if t.size(2) != head_dim:
        raise AssertionError(f"expecting {name}.size(2) of {head_dim}, but got {t.size(2)}")
    return t.view(bsz, num_heads, t.size(1), head_dim)


def _check_attn_mask(attn_mask, tgt_len, src_len, bsz, num_heads):
    """The 2-D (L, S) or 3-D (N*H, L, S) attention mask, made 3-D."""
    if attn_mask.dim() == 2:
        if tuple(attn_mask.shape) != (tgt_len, src_len):
            raise RuntimeError(f"The shape of the 2D attn_mask is {attn_mask.shape}, but "
                               f"should be {(tgt_len, src_len)}.")
        return attn_mask.unsqueeze(0)
    if attn_mask.dim() == 3:
        if tuple(attn_mask.shape) != (bsz * num_heads, tgt_len, src_len):
            raise RuntimeError(f"The shape of the 3D attn_mask is {attn_mask.shape}, but "
                               f"should be {(bsz * num_heads, tgt_len, src_len)}.")
        return attn_mask
    raise RuntimeError(f"attn_mask's dimension {attn_mask.dim()} is not supported")


def _merge_masks(attn_mask, kpm, bsz: int, num_heads: int, src_len: int):
    """One additive mask broadcastable to (N, H, L, S) from the (1 or N*H, L, S) attention
    mask and the (N, S) key-padding mask."""
    if attn_mask is not None:
        attn_mask = attn_mask.view(-1 if attn_mask.size(0) != 1 else 1,
                                   num_heads if attn_mask.size(0) != 1 else 1,
                                   attn_mask.size(1), src_len)
    if kpm is not None:
        if kpm.size(0) != bsz:
            raise AssertionError(f"Expected key_padded_mask.shape[0] to be {bsz}, but got "
                                 f"{kpm.size(0)}")
        if kpm.size(1) != src_len:
            raise AssertionError(f"Expected key_padded_mask.shape[1] to be {src_len}, but got "
                                 f"{kpm.size(1)}")
        kpm = kpm.view(bsz, 1, 1, src_len)
        attn_mask = kpm if attn_mask is None else attn_mask + kpm
    return attn_mask


def _attend_with_weights(q, k, v, mask, dropout_p, average: bool):
    """The need_weights path: plain softmax (NaN for fully masked rows, as in PyTorch)."""
    from tessera.nn.functional import dropout, softmax
    head_dim = q.size(-1)
    scores = (q * math.sqrt(1.0 / head_dim)).matmul(k.transpose(-2, -1))
    if mask is not None:
        scores = scores + mask
    weights = softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = dropout(weights, p=dropout_p)
    out = weights.matmul(v)
    return out, (weights.mean(dim=1) if average else weights)


def multi_head_attention_forward(query, key, value, embed_dim_to_check: int, num_heads: int,
                                 in_proj_weight, in_proj_bias, bias_k, bias_v,
                                 add_zero_attn: bool, dropout_p: float, out_proj_weight,
                                 out_proj_bias, training: bool = True, key_padding_mask=None,
                                 need_weights: bool = True, attn_mask=None,
                                 use_separate_proj_weight: bool = False, q_proj_weight=None,
                                 k_proj_weight=None, v_proj_weight=None, static_k=None,
                                 static_v=None, average_attn_weights: bool = True,
                                 is_causal: bool = False):
    """PyTorch's functional multi-head attention on (L, N, E) inputs (or unbatched (L, E)).

    Returns ``(attn_output, attn_weights)``; the weights are None unless ``need_weights``.
    """
    batched = _mha_shape_check(query, key, value, key_padding_mask, attn_mask, num_heads)
    if not batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.size(0)
    key_padding_mask, attn_mask, is_causal = _prepare_masks(
        key_padding_mask, attn_mask, is_causal, need_weights, query.dtype)
    q, k, v, head_dim = _project(query, key, value, embed_dim_to_check, num_heads,
                                 in_proj_weight, in_proj_bias, use_separate_proj_weight,
                                 q_proj_weight, k_proj_weight, v_proj_weight)
    if attn_mask is not None:
        attn_mask = _check_attn_mask(attn_mask, tgt_len, src_len, bsz, num_heads)
    q = _heads(q, bsz, num_heads, head_dim)
    k, v, attn_mask, key_padding_mask = _keys_values(
        k, v, attn_mask, key_padding_mask, bias_k, bias_v, static_k, static_v,
        add_zero_attn, bsz, num_heads, head_dim)
    mask = _merge_masks(attn_mask, key_padding_mask, bsz, num_heads, k.size(2))
    out, weights = _attend(q, k, v, mask, dropout_p if training else 0.0, need_weights,
                           average_attn_weights, is_causal)
    out = _out_projection(out, out_proj_weight, out_proj_bias, tgt_len, bsz, embed_dim)
    if not batched:
        out = out.squeeze(1)
        weights = weights.squeeze(0) if weights is not None else None
    return out, weights


def _mha_batch_first(query, key, value, embed_dim_to_check: int, num_heads: int,
                     in_proj_weight, in_proj_bias, dropout_p: float, out_proj_weight,
                     out_proj_bias, training: bool = True, key_padding_mask=None,
                     need_weights: bool = True, attn_mask=None,
                     use_separate_proj_weight: bool = False, q_proj_weight=None,
                     k_proj_weight=None, v_proj_weight=None,
                     average_attn_weights: bool = True, is_causal: bool = False):
    """``multi_head_attention_forward`` of batch-first (N, L, E) inputs, giving (N, L, E),
    without bias_k/bias_v, static keys or the zero attention position (``MultiheadAttention``
    with ``batch_first=True`` takes the sequence-first path for those).

    The projections take (N, L, E) as it is and heads are split as (N, L, H, D) ->
    (N, H, L, D), so the batch stays the leading dim from input to output. PyTorch's layout
    transposes to (L, N, E) first and splits heads out of the merged (L, N*H) dims: on a
    batch-split global tensor that merge needs an all-to-all and all-gathers of K and V
    (this way a data-parallel Transformer step sends the ring minimum: bench distributed:
    transformer), and in nn.Graph two copies per layer (the input's and the output's
    transposes). The values are the same.
    """
    from tessera.nn.functional import linear
    _mha_shape_check(query, key, value, key_padding_mask, attn_mask, num_heads)
    if query.dim() != 3:
        raise AssertionError(f"_mha_batch_first expects a batched (N, L, E) query, got "
                             f"{query.dim()}-D")
    bsz, tgt_len, embed_dim = query.shape
    if key.size(0) != bsz or value.size(0) != bsz:
        # PyTorch's (sequence-first) head split fails on the view: a RuntimeError
        raise RuntimeError(f"key and value batch sizes {key.size(0)} and {value.size(0)} "
                           f"do not match the query's {bsz}")
    src_len = key.size(1)
    key_padding_mask, attn_mask, is_causal = _prepare_masks(
        key_padding_mask, attn_mask, is_causal, need_weights, query.dtype)
    q, k, v, head_dim = _project(query, key, value, embed_dim_to_check, num_heads,
                                 in_proj_weight, in_proj_bias, use_separate_proj_weight,
                                 q_proj_weight, k_proj_weight, v_proj_weight)
    if attn_mask is not None:
        attn_mask = _check_attn_mask(attn_mask, tgt_len, src_len, bsz, num_heads)
    q, k, v = (x.view(bsz, x.size(1), num_heads, head_dim).transpose(1, 2)
               for x in (q, k, v))
    mask = _merge_masks(attn_mask, key_padding_mask, bsz, num_heads, src_len)
    out, weights = _attend(q, k, v, mask, dropout_p if training else 0.0, need_weights,
                           average_attn_weights, is_causal)
    out = linear(out.transpose(1, 2).reshape(bsz * tgt_len, embed_dim), out_proj_weight,
                 out_proj_bias)
    return out.view(bsz, tgt_len, out.size(1)), weights


def _prepare_masks(key_padding_mask, attn_mask, is_causal: bool, need_weights: bool,
                   dtype):
    """Both masks made additive floats, and whether SDPA may build the causal mask itself
    (only with no key-padding mask and no weights asked for, as in PyTorch)."""
    key_padding_mask = _canonical_mask(key_padding_mask, "key_padding_mask",
                                       _none_or_dtype(attn_mask), "attn_mask", dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the "
                           "Transformer module method `generate_square_subsequent_mask` to "
                           "create this mask.")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None  # the hint lets SDPA build the causal mask itself
    else:
        attn_mask = _canonical_mask(attn_mask, "attn_mask", None, "", dtype,
                                    check_other=False)
        if key_padding_mask is not None:
            is_causal = False
    return key_padding_mask, attn_mask, is_causal


def _attend(q, k, v, mask, dropout_p: float, need_weights: bool, average: bool,
            is_causal: bool):
    """(N, H, L, D) attention output and the weights (None unless ``need_weights``)."""
    if need_weights:
        return _attend_with_weights(q, k, v, mask, dropout_p, average)
    return scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal), None


def _project(query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias,
             use_separate, q_proj_weight, k_proj_weight, v_proj_weight):
    """Shape checks and the input projections; returns q, k, v in the inputs' layout
    ((L, N, E) or (N, L, E)) and head_dim."""
    embed_dim = query.size(-1)
    if embed_dim != embed_dim_to_check:
        raise AssertionError(f"was expecting embedding dimension of {embed_dim_to_check}, but "
                             f"got {embed_dim}")
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise AssertionError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")
    if use_separate:
        if tuple(key.shape[:2]) != tuple(value.shape[:2]):
            raise AssertionError(f"key's sequence and batch dims {key.shape[:2]} do not match "
                                 f"value's {value.shape[:2]}")
        for name, w in (("q", q_proj_weight), ("k", k_proj_weight), ("v", v_proj_weight)):
            if w is None:
                raise AssertionError(f"use_separate_proj_weight is True but {name}_proj_weight "
                                     "is None")
        q, k, v = _in_projection(query, key, value, q_proj_weight, k_proj_weight,
                                 v_proj_weight, in_proj_bias)
    else:
        if tuple(key.shape) != tuple(value.shape):
            raise AssertionError(f"key shape {key.shape} does not match value shape "
                                 f"{value.shape}")
        if in_proj_weight is None:
            raise AssertionError("use_separate_proj_weight is False but in_proj_weight is None")
        q, k, v = _in_projection_packed(query, key, value, in_proj_weight, in_proj_bias)
    return q, k, v, head_dim


def _keys_values(k, v, attn_mask, kpm, bias_k, bias_v, static_k, static_v, add_zero_attn,
                 bsz, num_heads, head_dim):
    """Keys and values as (N, H, S, head_dim), with bias_k/bias_v, static_k/static_v and the
    zero attention position applied, and the masks padded to match."""
    if bias_k is not None and bias_v is not None:
        if static_k is not None:
            raise AssertionError("bias cannot be added to static key.")
        if static_v is not None:
            raise AssertionError("bias cannot be added to static value.")
        k = cat([k, bias_k.expand(1, bsz, -1)])
        v = cat([v, bias_v.expand(1, bsz, -1)])
        attn_mask = _pad_last(attn_mask)
        kpm = _pad_last(kpm)
    elif bias_k is not None:
        raise AssertionError("bias_k is set but bias_v is None")
    elif bias_v is not None:
        raise AssertionError("bias_v is set but bias_k is None")
    k = (_heads(k, bsz, num_heads, head_dim) if static_k is None
         else _static(static_k, "static_k", bsz, num_heads, head_dim))
    v = (_heads(v, bsz, num_heads, head_dim) if static_v is None
         else _static(static_v, "static_v", bsz, num_heads, head_dim))
    if add_zero_attn:
        k = cat([k, zeros((bsz, num_heads, 1, head_dim), dtype=k.dtype,
                                          device=k.device)], dim=2)
        v = cat([v, zeros((bsz, num_heads, 1, head_dim), dtype=v.dtype,
                                          device=v.device)], dim=2)
        attn_mask = _pad_last(attn_mask)
        kpm = _pad_last(kpm)
    return k, v, attn_mask, kpm


def _pad_last(mask):
    from tessera.nn.functional import pad
    return pad(mask, (0, 1)) if mask is not None else None


def _out_projection(out, weight, bias, tgt_len: int, bsz: int, embed_dim: int):
    """(N, H, L, head_dim) -> (L, N, E) through the output projection."""
    from tessera.nn.functional import linear
    out = out.permute(2, 0, 1, 3).reshape(tgt_len * bsz, embed_dim)
    out = linear(out, weight, bias)
    return out.view(tgt_len, bsz, out.size(1))
