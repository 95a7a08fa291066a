"""Op-info entries: attention functions of ``nn.functional``.

``scaled_dot_product_attention`` over 2-d to 5-d inputs with broadcast batch dims, boolean
masks (True = may attend) and additive float masks of every broadcastable shape (including
rows with nothing to attend to, which PyTorch's safe softmax turns into zeros), ``is_causal``
for L < S, L == S and L > S, ``scale`` (also negative), grouped-query attention
(``enable_gqa``), zero-size inputs and PyTorch's errors. ``multi_head_attention_forward`` gets a
few packed/separate-projection samples (the MHA module tests cover its options in depth).
Both are composites (matmul, softmax, masked_fill...), so ``covers`` names those ops.
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register


def _sdpa(L, q, k, v, *args, **kwargs):
    return L.nn.functional.scaled_dot_product_attention(q, k, v, *args, **kwargs)


def _qkv(rng, dt, q, k, v):
    return make(rng, q, dt), make(rng, k, dt), make(rng, v, dt)


def _bool(rng, shape, dead_row=None):
    m = rng.random(shape) > 0.4
    if dead_row is not None:
        m[..., dead_row, :] = False
    return m


def _float_mask(rng, shape, dt, neg_inf=False):
    m = make(rng, shape, dt, -1.0, 1.0)
    if neg_inf:
        m[..., ::2] = -np.inf
    return m


def _sdpa_samples(rng, dt):
    shapes = [((2, 3, 5), (2, 4, 5), (2, 4, 6)),            # 3-d, L != S, Ev != E
              ((3, 4), (5, 4), (5, 2)),                      # 2-d
              ((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3)),    # 4-d
              ((2, 1, 2, 3, 4), (2, 1, 2, 3, 4), (2, 1, 2, 3, 4)),
              ((2, 3, 5), (1, 4, 5), (1, 4, 6)),            # broadcast batch
              ((1, 3), (1, 3), (1, 2))]
    for q, k, v in shapes:
        yield Sample(_qkv(rng, dt, q, k, v))
    q, k, v = _qkv(rng, dt, (2, 3, 5), (2, 4, 5), (2, 4, 6))
    # boolean masks, broadcast in every way, with rows that may attend to nothing
    for shape in [(3, 4), (1, 4), (3, 1), (2, 1, 4), (2, 3, 4), (1, 1, 3, 4)]:
        yield Sample((q, k, v), dict(attn_mask=_bool(rng, shape)))
    yield Sample((q, k, v), dict(attn_mask=_bool(rng, (3, 4), dead_row=1)))
    yield Sample((q, k, v), dict(attn_mask=np.zeros((3, 4), bool)))
    # additive float masks (gradients flow to them), -inf entries, float32 mask on float64
    for shape in [(3, 4), (1, 4), (2, 3, 4), (2, 1, 4)]:
        yield Sample((q, k, v), dict(attn_mask=_float_mask(rng, shape, dt)))
    yield Sample((q, k, v), dict(attn_mask=_float_mask(rng, (3, 4), dt, neg_inf=True)))
    dead = _float_mask(rng, (2, 3, 4), dt)
    dead[1, 2] = -np.inf
    yield Sample((q, k, v), dict(attn_mask=dead))
    yield Sample((q, k, v), dict(attn_mask=_float_mask(rng, (3, 4), np.float32)))
    q4, k4, v4 = _qkv(rng, dt, (2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3))
    yield Sample((q4, k4, v4), dict(attn_mask=_bool(rng, (2, 1, 3, 5))))
    yield Sample((q4, k4, v4), dict(attn_mask=_bool(rng, (2, 3, 5))))
    yield Sample((q4, k4, v4), dict(attn_mask=_float_mask(rng, (2, 1, 1, 5), dt)))
    # is_causal: the top-left aligned lower triangle, for L < S, L > S and L == S
    yield Sample((q, k, v), dict(is_causal=True))
    yield Sample(_qkv(rng, dt, (2, 5, 3), (2, 2, 3), (2, 2, 4)), dict(is_causal=True))
    yield Sample(_qkv(rng, dt, (2, 4, 3), (2, 4, 3), (2, 4, 3)), dict(is_causal=True))
    yield Sample((q4, k4, v4), dict(is_causal=True, scale=0.7))
    # scale, positional arguments
    yield Sample((q, k, v), dict(scale=0.3))
    yield Sample((q, k, v), dict(scale=-0.5, attn_mask=_bool(rng, (3, 4))))
    yield Sample((q, k, v, _float_mask(rng, (3, 4), dt), 0.0, False), dict(scale=2.0))
    yield Sample((q, k, v, None, 0.0, False, 2.0))                       # scale is kw-only
    # grouped-query attention: key/value heads divide the query heads (each on its own)
    qg = make(rng, (2, 6, 3, 4), dt)
    yield Sample((qg, make(rng, (2, 2, 5, 4), dt), make(rng, (2, 3, 5, 4), dt)),
                 dict(enable_gqa=True))
    yield Sample((qg, make(rng, (2, 1, 5, 4), dt), make(rng, (2, 1, 5, 2), dt)),
                 dict(enable_gqa=True, is_causal=True))
    yield Sample((qg, make(rng, (1, 2, 5, 4), dt), make(rng, (2, 2, 5, 4), dt)),
                 dict(enable_gqa=True, attn_mask=_bool(rng, (3, 5))))
    yield Sample((qg, make(rng, (2, 6, 5, 4), dt), make(rng, (2, 6, 5, 4), dt)),
                 dict(enable_gqa=True))
    yield Sample(_qkv(rng, dt, (4, 3, 5), (2, 4, 5), (2, 4, 6)), dict(enable_gqa=True))
    # zero-size: no queries, no keys (zeros), no batch, head dim 0
    yield Sample(_qkv(rng, dt, (2, 0, 5), (2, 4, 5), (2, 4, 6)))
    yield Sample(_qkv(rng, dt, (2, 3, 5), (2, 0, 5), (2, 0, 6)))
    yield Sample(_qkv(rng, dt, (0, 3, 5), (0, 4, 5), (0, 4, 6)), dict(is_causal=True))
    yield Sample(_qkv(rng, dt, (2, 3, 0), (2, 4, 0), (2, 4, 6)))
    # dropout_p=1 drops everything (deterministic); negative p means no dropout, as in torch
    yield Sample((q, k, v), dict(dropout_p=1.0))
    yield Sample((q, k, v), dict(dropout_p=-0.5))
    # errors
    yield Sample((q, k.astype(np.float16), v))                           # dtypes differ
    yield Sample((q, k, v), dict(attn_mask=np.zeros((3, 4), np.float16)))
    yield Sample((q, k, v), dict(attn_mask=np.zeros((3, 4), np.int64)))
    yield Sample((q, k, v), dict(attn_mask=_bool(rng, (3, 4)), is_causal=True))
    yield Sample((q, k, v), dict(attn_mask=_bool(rng, (3, 3))))          # not broadcastable
    yield Sample((q, k, v), dict(attn_mask=_bool(rng, (5, 2, 3, 4))))    # too many dims
    yield Sample(_qkv(rng, dt, (5,), (4, 5), (4, 6)))                    # 1-d query
    yield Sample(_qkv(rng, dt, (2, 3, 5), (2, 4, 4), (2, 4, 6)))         # E differs
    yield Sample(_qkv(rng, dt, (2, 3, 5), (2, 4, 5), (2, 3, 6)))         # S differs
    yield Sample(_qkv(rng, dt, (4, 3, 5), (2, 4, 5), (2, 4, 6)))         # batch differs
    yield Sample((qg, make(rng, (2, 4, 5, 4), dt), make(rng, (2, 4, 5, 4), dt)),
                 dict(enable_gqa=True))                                  # 4 does not divide 6
    yield Sample((qg, make(rng, (2, 2, 5, 4), dt), make(rng, (2, 2, 5, 4), dt)))
    yield Sample(_qkv(rng, dt, (3, 5), (4, 5), (4, 6)), dict(enable_gqa=True))
    yield Sample((q, k, v), dict(dropout_p=1.5))
    yield Sample((q.astype(np.int64), k.astype(np.int64), v.astype(np.int64)))


def _sdpa_dropout_samples(rng, dt):
    q, k, v = _qkv(rng, dt, (2, 3, 5), (2, 4, 5), (2, 4, 6))
    yield Sample((q, k, v), dict(dropout_p=0.5))
    yield Sample((q, k, v), dict(dropout_p=0.3, is_causal=True))


def _mha(L, q, k, v, *args, **kwargs):
    return L.nn.functional.multi_head_attention_forward(q, k, v, *args, **kwargs)


def _mha_samples(rng, dt):
    E, H = 6, 2
    w_in, b_in = make(rng, (3 * E, E), dt, -0.5, 0.5), make(rng, (3 * E,), dt)
    w_out, b_out = make(rng, (E, E), dt, -0.5, 0.5), make(rng, (E,), dt)
    q, kv = make(rng, (4, 3, E), dt), make(rng, (5, 3, E), dt)
    base = (E, H, w_in, b_in, None, None, False, 0.0, w_out, b_out)
    yield Sample((q, kv, kv) + base)
    yield Sample((q, kv, kv) + base, dict(need_weights=False))
    yield Sample((q, kv, kv) + base, dict(average_attn_weights=False,
                                          key_padding_mask=_bool(rng, (3, 5))))
    yield Sample((q[:, 0], kv[:, 0], kv[:, 0]) + base, dict(attn_mask=_bool(rng, (4, 5))))
    bias_k, bias_v = make(rng, (1, 1, E), dt), make(rng, (1, 1, E), dt)
    yield Sample((q, kv, kv, E, H, w_in, None, bias_k, bias_v, True, 0.0, w_out, None),
                 dict(attn_mask=_float_mask(rng, (4, 5), dt), need_weights=False))
    k2, v2 = make(rng, (5, 3, 4), dt), make(rng, (5, 3, 3), dt)
    wq, wk, wv = (make(rng, (E, d), dt, -0.5, 0.5) for d in (E, 4, 3))
    yield Sample((q, k2, v2, E, H, None, b_in, None, None, False, 0.0, w_out, b_out),
                 dict(use_separate_proj_weight=True, q_proj_weight=wq, k_proj_weight=wk,
                      v_proj_weight=wv))
    # PyTorch's errors here are mostly AssertionErrors: the module tests check those
    yield Sample((q, kv, kv) + base, dict(attn_mask=_bool(rng, (2, 4, 5))))


register(
    OpInfo("scaled_dot_product_attention", _sdpa, _sdpa_samples,
           covers=("matmul", "softmax", "masked_fill", "scaled_dot_product_attention",
                   "scaled_dot_product_attention_backward"), atol=1e-5, rtol=1e-5),
    OpInfo("scaled_dot_product_attention_dropout", _sdpa, _sdpa_dropout_samples,
           covers=("dropout",), random=True),
    OpInfo("multi_head_attention_forward", _mha, _mha_samples,
           covers=("matmul", "softmax"), atol=1e-5, rtol=1e-5, gradcheck=False),
)
