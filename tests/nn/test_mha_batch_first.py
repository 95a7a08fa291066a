"""MultiheadAttention's batch-first path (``_mha_batch_first``) against PyTorch.

With ``batch_first=True`` a batched input is projected and split into heads as (N, L, E) ->
(N, H, L, D), never transposed to sequence-first; these cases sweep the masks, weights and
projection forms of that path in train and eval mode, forward and backward, and check that
the path is taken (and that bias_k/bias_v and add_zero_attn still take the other one).
"""
from __future__ import annotations

import numpy as np
import pytest

import tessera
import tessera.nn.functional.attention as fattn
from tests.nn.test_attention_transformer import (
    DTYPES,
    E,
    H,
    L,
    _cross,
    _distinct,
    _mha_arrays,
    _self,
    _with,
    compare,
    raises_like_torch,
)


def _bf(**kw):
    return lambda L_: L_.nn.MultiheadAttention(E, H, batch_first=True, **kw)


BF = {"batch_first": True}
CASES = [
    ("self", _bf(), _self, BF),
    ("self_sdpa", _bf(), _with(_self, need_weights=False), BF),
    ("cross", _bf(), _cross, BF),
    ("distinct", _bf(), _with(_distinct, need_weights=False), BF),
    ("per_head_weights", _bf(), _with(_cross, average_attn_weights=False), BF),
    ("kpm_bool", _bf(), _with(_cross, key_padding_mask="kpm"), BF),
    ("kpm_bool_sdpa", _bf(), _with(_cross, key_padding_mask="kpm", need_weights=False), BF),
    ("kpm_float_sdpa", _bf(), _with(_cross, key_padding_mask="kpmf", need_weights=False), BF),
    ("am2_bool", _bf(), _with(_cross, attn_mask="am2"), BF),
    ("am2_float_sdpa", _bf(), _with(_cross, attn_mask="am2f", need_weights=False), BF),
    ("am3_bool_per_head", _bf(), _with(_cross, attn_mask="am3", average_attn_weights=False),
     BF),
    ("am3_float_sdpa", _bf(), _with(_cross, attn_mask="am3f", need_weights=False), BF),
    ("both_masks", _bf(), _with(_cross, attn_mask="am3", key_padding_mask="kpm"), BF),
    ("both_masks_sdpa", _bf(), _with(_cross, attn_mask="am2", key_padding_mask="kpm",
                                     need_weights=False), BF),
    ("causal_hint_sdpa", _bf(), _with(_self, attn_mask="causal", is_causal=True,
                                      need_weights=False), BF),
    ("causal_hint_bool", _bf(), _with(_self, attn_mask="causal_b", is_causal=True,
                                      need_weights=False), BF),
    ("causal_hint_weights", _bf(), _with(_self, attn_mask="causal", is_causal=True), BF),
    ("causal_hint_kpm", _bf(), _with(_self, attn_mask="causal", is_causal=True,
                                     key_padding_mask="kpm_self", need_weights=False), BF),
    ("separate_weights", _bf(kdim=6, vdim=4),
     _with(_distinct, attn_mask="am2", key_padding_mask="kpm"), {**BF, "kdim": 6, "vdim": 4}),
    ("separate_weights_sdpa", _bf(kdim=6, vdim=4), _with(_distinct, need_weights=False),
     {**BF, "kdim": 6, "vdim": 4}),
    ("no_bias", _bf(bias=False), _with(_cross, key_padding_mask="kpm"), BF),
    ("bias_kv_old_path", _bf(add_bias_kv=True), _with(_cross, attn_mask="am2"), BF),
    ("zero_attn_old_path", _bf(add_zero_attn=True), _with(_self, need_weights=False), BF),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name,make,fwd,akw", CASES, ids=[c[0] for c in CASES])
def test_batch_first_matches_torch(name, make, fwd, akw, dtype):
    arrays = _mha_arrays(np.random.default_rng(len(name)), **akw)
    compare(make, fwd, arrays, dtype, train=True)
    compare(make, fwd, arrays, dtype, train=False)


@pytest.mark.parametrize("kw,taken", [({}, True), ({"kdim": 6, "vdim": 4}, True),
                                      ({"add_bias_kv": True}, False),
                                      ({"add_zero_attn": True}, False)])
def test_batch_first_path_taken(monkeypatch, kw, taken):
    calls = []
    inner = fattn._mha_batch_first
    monkeypatch.setattr(fattn, "_mha_batch_first",
                        lambda *a, **k: calls.append(1) or inner(*a, **k))
    m = tessera.nn.MultiheadAttention(E, H, batch_first=True, **kw)
    q = tessera.randn(3, L, E)
    k, v = tessera.randn(3, 7, kw.get("kdim", E)), tessera.randn(3, 7, kw.get("vdim", E))
    out, w = m(q, k, v)
    assert tuple(out.shape) == (3, L, E) and tuple(w.shape[:2]) == (3, L)
    assert bool(calls) == taken
    calls.clear()
    m(q[0], k[0], v[0])   # unbatched keeps the sequence-first path
    assert not calls


def test_batch_first_self_attention_one_projection_gemm(monkeypatch):
    """q is k is v still gives one packed in-projection (no transposes break identity)."""
    import tessera.nn.functional as F
    shapes = []
    linear = F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: shapes.append(tuple(w.shape))
                        or linear(x, w, b))
    m = tessera.nn.MultiheadAttention(E, H, batch_first=True)
    x = tessera.randn(3, L, E)
    m(x, x, x, need_weights=False)
    assert shapes == [(3 * E, E), (E, E)]


def _bf_error_cases():
    def call(L_, q_shape, kv_shape=None, **kw):
        m = L_.nn.MultiheadAttention(E, H, batch_first=True)
        q = L_.randn(*q_shape)
        kv = L_.randn(*(kv_shape or q_shape))
        return m(q, kv, kv, **kw)
    return [
        lambda L_: call(L_, (3, L, E), attn_mask=L_.zeros(3, 3, dtype=L_.bool)),
        lambda L_: call(L_, (3, L, E), attn_mask=L_.zeros(2, L, L, dtype=L_.bool)),
        lambda L_: call(L_, (3, L, E), key_padding_mask=L_.zeros(3, L + 1, dtype=L_.bool)),
        lambda L_: call(L_, (3, L, E), key_padding_mask=L_.zeros(4, L, dtype=L_.bool)),
        lambda L_: call(L_, (3, L, 6)),
        lambda L_: call(L_, (3, L, E), (2, L, E)),
        lambda L_: call(L_, (3, L, E), is_causal=True),
    ]


@pytest.mark.parametrize("fn", _bf_error_cases())
def test_batch_first_errors_match_torch(fn):
    raises_like_torch(fn)


def test_batch_first_in_graph_matches_torch():
    """nn.Graph traces the batch-first path (masks, weights asked for) like eager PyTorch:
    outputs and parameter gradients."""
    import torch
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, L, E)).astype(np.float32)
    kpm = np.zeros((3, L), bool)
    kpm[1, -2:] = True
    am = np.triu(np.full((L, L), -np.inf, np.float32), 1)
    tessera.manual_seed(0)
    mha = tessera.nn.MultiheadAttention(E, H, batch_first=True)
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True)
    ref.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in mha.state_dict().items()})
    params = list(mha.parameters())

    class Step(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def build(self, x, kpm, am):
            out, w = self.mha(x, x, x, key_padding_mask=kpm, attn_mask=am)
            loss = (out * out).sum() + w.sum()
            return (out, w, *tessera.autograd.grad(loss, params))

    got = Step()(tessera.tensor(x), tessera.tensor(kpm), tessera.tensor(am))
    out, w = ref(*(torch.from_numpy(x),) * 3, key_padding_mask=torch.from_numpy(kpm),
                 attn_mask=torch.from_numpy(am))
    want = (out, w, *torch.autograd.grad((out * out).sum() + w.sum(), list(ref.parameters())))
    assert len(got) == len(want)
    for g, p in zip(got, want):
        np.testing.assert_allclose(g.numpy(), p.detach().numpy(), rtol=1e-4, atol=1e-5)
