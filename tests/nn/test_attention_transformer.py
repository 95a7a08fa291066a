"""MultiheadAttention and the Transformer layers against PyTorch.

Every module is built in both libraries with the same constructor arguments; PyTorch's
``state_dict`` is copied into tessera through NumPy (the key lists and shapes must be equal);
the same inputs go through both (the same array name gives the same tensor object, so
self-attention really passes ``x, x, x``); every output, every input gradient and every
parameter gradient is compared, in float64 tightly and in float32. Dropout > 0 is compared in
eval mode only (the random streams differ); in train mode its effect is checked.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import tessera

DTYPES = (np.float64, np.float32)


# ---- helpers (also used by test_rnn.py) ------------------------------------------------------

def npy(t) -> np.ndarray:
    return t.detach().numpy()


def tol(dtype) -> dict:
    return dict(atol=1e-10, rtol=1e-9) if dtype == np.float64 else dict(atol=3e-5, rtol=3e-4)


def build_pair(make, dtype, seed: int = 0):
    """The same module in both libraries, with PyTorch's (random) state copied over."""
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm, tm = make(torch), make(tessera)
    if dtype == np.float64:
        pm, tm = pm.double(), tm.double()
    psd, tsd = pm.state_dict(), tm.state_dict()
    assert list(psd) == list(tsd)
    for k in psd:
        assert tuple(psd[k].shape) == tuple(tsd[k].shape), k
    tm.load_state_dict({k: tessera.tensor(v.detach().numpy()) for k, v in psd.items()})
    return pm, tm


def _flat(out):
    if isinstance(out, (tuple, list)):
        return [x for o in out for x in _flat(o)]
    return [out]


def _run(lib, module, fwd, arrays, dtype, grads):
    made = {}

    def T(name):  # noqa: N802  (reads like a constructor in the test bodies)
        if name not in made:
            a = arrays[name]
            a = a.astype(dtype) if a.dtype.kind == "f" else a
            t = lib.tensor(a.copy())
            if grads and a.dtype.kind == "f":
                t.requires_grad_(True)
            made[name] = t
        return made[name]
    return _flat(fwd(module, lib, T)), made


def compare(make, fwd, arrays, dtype, train=False, grads=True, seed=0, modules=None):
    """Forward (and backward unless ``grads`` is False) in both; compares everything."""
    pm, tm = modules or build_pair(make, dtype, seed)
    pm.train(train)
    tm.train(train)
    po, pin = _run(torch, pm, fwd, arrays, dtype, grads)
    to, tin = _run(tessera, tm, fwd, arrays, dtype, grads)
    assert len(po) == len(to)
    for i, (p, t) in enumerate(zip(po, to)):
        if p is None:
            assert t is None, f"output {i}"
            continue
        assert tuple(t.shape) == tuple(p.shape), f"output {i}: {t.shape} vs {p.shape}"
        assert t.dtype.name == str(p.dtype).split(".")[-1], f"output {i}"
        np.testing.assert_allclose(npy(t), npy(p), **tol(dtype), err_msg=f"output {i}",
                                   equal_nan=True)
    if not grads:
        return pm, tm
    rng = np.random.default_rng(seed + 1)
    pairs = [(p, t) for p, t in zip(po, to) if p is not None and p.requires_grad]
    cots = [rng.standard_normal(tuple(p.shape)).astype(dtype) for p, _ in pairs]
    sum((p * torch.tensor(c)).sum() for (p, _), c in zip(pairs, cots)).backward()
    sum((t * tessera.tensor(c)).sum() for (_, t), c in zip(pairs, cots)).backward()
    for name, p in pin.items():
        if p.requires_grad:
            assert (tin[name].grad is None) == (p.grad is None), name
            if p.grad is not None:
                np.testing.assert_allclose(npy(tin[name].grad), npy(p.grad), **tol(dtype),
                                           err_msg=f"grad of input {name}")
    tparams = dict(tm.named_parameters())
    assert list(tparams) == [n for n, _ in pm.named_parameters()]
    for name, p in pm.named_parameters():
        g = tparams[name].grad
        if p.grad is None:
            assert g is None or not np.any(npy(g)), name
        else:
            np.testing.assert_allclose(npy(g), npy(p.grad), **tol(dtype), err_msg=name)
    return pm, tm


def raises_like_torch(fn):
    """``fn(lib)`` raises in torch; tessera must raise the same exception type."""
    with pytest.raises(Exception) as info:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(torch)
    with pytest.raises(info.type):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(tessera)


def norm_repr(s: str) -> str:
    return s.replace("tessera.", "torch.")


# ---- MultiheadAttention ------------------------------------------------------------------------

E, H, L, S, N = 8, 2, 5, 7, 3


def _kpm(rng, n, s):
    m = rng.random((n, s)) > 0.6
    m[:, 0] = False   # every query keeps at least one key (no NaN rows)
    return m


def _mha_arrays(rng, batch_first=False, kdim=E, vdim=E):
    def seq(n_steps, d):
        return rng.standard_normal((N, n_steps, d) if batch_first else (n_steps, N, d))
    am2 = rng.random((L, S)) > 0.6
    am2[:, 0] = False
    am3 = rng.random((N * H, L, S)) > 0.6
    am3[..., 0] = False
    causal = np.triu(np.full((L, L), -np.inf), 1)
    return {"x": seq(L, E), "q": seq(L, E), "kv": seq(S, E), "k": seq(S, kdim),
            "v": seq(S, vdim), "kpm": _kpm(rng, N, S), "kpm_self": _kpm(rng, N, L),
            "kpmf": np.where(_kpm(rng, N, S), -np.inf, rng.standard_normal((N, S))),
            "am2": am2, "am2f": rng.standard_normal((L, S)), "am3": am3,
            "am3f": np.where(am3, -1e9, rng.standard_normal((N * H, L, S))),
            "causal": causal, "causal_b": np.isinf(causal),
            "ux": rng.standard_normal((L, E)), "ukv": rng.standard_normal((S, E)),
            "ukpm": _kpm(rng, 1, S)[0], "uam3": am3[:H]}


def _self(m, L_, T, **kw):
    return m(T("x"), T("x"), T("x"), **kw)


def _cross(m, L_, T, **kw):
    return m(T("q"), T("kv"), T("kv"), **kw)


def _distinct(m, L_, T, **kw):
    return m(T("q"), T("k"), T("v"), **kw)


def _with(call, **masks):
    """``call`` with mask arrays (by name) and plain keyword values."""
    def fwd(m, L_, T):
        kw = {k: (T(v) if isinstance(v, str) else v) for k, v in masks.items()}
        return call(m, L_, T, **kw)
    return fwd


def _mha(**kw):
    return lambda L_: L_.nn.MultiheadAttention(E, H, **kw)


MHA_CASES = [
    ("self", _mha(), _self, {}),
    ("self_no_weights", _mha(), _with(_self, need_weights=False), {}),
    ("cross_kv", _mha(), _cross, {}),
    ("distinct_qkv", _mha(), _distinct, {}),
    ("batch_first_self", _mha(batch_first=True), _self, {"batch_first": True}),
    ("batch_first_cross", _mha(batch_first=True), _with(_cross, need_weights=False),
     {"batch_first": True}),
    ("batch_first_distinct", _mha(batch_first=True), _distinct, {"batch_first": True}),
    ("per_head_weights", _mha(), _with(_cross, average_attn_weights=False), {}),
    ("kpm_bool", _mha(), _with(_cross, key_padding_mask="kpm"), {}),
    ("kpm_bool_sdpa", _mha(), _with(_cross, key_padding_mask="kpm", need_weights=False), {}),
    ("kpm_float", _mha(), _with(_cross, key_padding_mask="kpmf", need_weights=False), {}),
    ("am2_bool", _mha(), _with(_cross, attn_mask="am2"), {}),
    ("am2_bool_sdpa", _mha(), _with(_cross, attn_mask="am2", need_weights=False), {}),
    ("am2_float", _mha(), _with(_cross, attn_mask="am2f"), {}),
    ("am3_bool", _mha(), _with(_cross, attn_mask="am3", average_attn_weights=False), {}),
    ("am3_float_sdpa", _mha(), _with(_cross, attn_mask="am3f", need_weights=False), {}),
    ("both_masks", _mha(), _with(_cross, attn_mask="am2", key_padding_mask="kpm"), {}),
    ("both_masks_sdpa", _mha(), _with(_cross, attn_mask="am3", key_padding_mask="kpm",
                                      need_weights=False), {}),
    ("causal_hint_sdpa", _mha(), _with(_self, attn_mask="causal", is_causal=True,
                                       need_weights=False), {}),
    ("causal_hint_bool", _mha(), _with(_self, attn_mask="causal_b", is_causal=True,
                                       need_weights=False), {}),
    ("causal_hint_weights", _mha(), _with(_self, attn_mask="causal", is_causal=True), {}),
    ("causal_hint_kpm", _mha(), _with(_self, attn_mask="causal", is_causal=True,
                                      key_padding_mask="kpm_self", need_weights=False), {}),
    ("kdim_vdim", _mha(kdim=6, vdim=4), _distinct, {"kdim": 6, "vdim": 4}),
    ("kdim_vdim_sdpa_masks", _mha(kdim=6, vdim=4),
     _with(_distinct, attn_mask="am2", key_padding_mask="kpm", need_weights=False),
     {"kdim": 6, "vdim": 4}),
    ("kdim_vdim_batch_first", _mha(kdim=6, vdim=4, batch_first=True), _distinct,
     {"kdim": 6, "vdim": 4, "batch_first": True}),
    ("add_bias_kv", _mha(add_bias_kv=True), _with(_cross, attn_mask="am2",
                                                  key_padding_mask="kpm"), {}),
    ("add_bias_kv_sdpa", _mha(add_bias_kv=True), _with(_cross, attn_mask="am3f",
                                                       need_weights=False), {}),
    ("add_zero_attn", _mha(add_zero_attn=True), _with(_cross, attn_mask="am3",
                                                      key_padding_mask="kpm"), {}),
    ("add_zero_attn_sdpa", _mha(add_zero_attn=True), _with(_self, need_weights=False), {}),
    ("bias_kv_and_zero_attn", _mha(add_bias_kv=True, add_zero_attn=True),
     _with(_distinct, key_padding_mask="kpm"), {}),
    ("no_bias", _mha(bias=False), _cross, {}),
    ("no_bias_bias_kv", _mha(bias=False, add_bias_kv=True), _with(_self, need_weights=False),
     {}),
    ("unbatched", _mha(), lambda m, L_, T: m(T("ux"), T("ukv"), T("ukv")), {}),
    ("unbatched_masks", _mha(), lambda m, L_, T: m(T("ux"), T("ukv"), T("ukv"),
                                                   key_padding_mask=T("ukpm"),
                                                   attn_mask=T("uam3")), {}),
    ("unbatched_sdpa", _mha(batch_first=True),
     lambda m, L_, T: m(T("ux"), T("ux"), T("ux"), need_weights=False,
                        key_padding_mask=T("ukpm")[:L]), {}),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name,make,fwd,akw", MHA_CASES, ids=[c[0] for c in MHA_CASES])
def test_multihead_attention_matches_torch(name, make, fwd, akw, dtype):
    arrays = _mha_arrays(np.random.default_rng(len(name)), **akw)
    compare(make, fwd, arrays, dtype, train=True)
    compare(make, fwd, arrays, dtype, train=False)


def test_multihead_attention_fully_masked_rows_nan_like_torch():
    """need_weights=True uses a plain softmax (NaN rows), the SDPA path a safe one (zeros)."""
    arrays = _mha_arrays(np.random.default_rng(0))
    arrays["kpm"][1] = True
    for nw in (True, False):
        compare(_mha(), _with(_cross, key_padding_mask="kpm", need_weights=nw), arrays,
                np.float64, grads=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_multihead_attention_dropout(dtype):
    arrays = _mha_arrays(np.random.default_rng(3))
    make = _mha(dropout=0.4)
    compare(make, _cross, arrays, dtype, train=False)
    compare(make, _with(_cross, need_weights=False), arrays, dtype, train=False)
    m = make(tessera).train()
    x, kv = tessera.tensor(arrays["q"]).float(), tessera.tensor(arrays["kv"]).float()
    out, w = m(x, kv, kv)
    ref, w_ref = m.eval()(x, kv, kv)
    assert out.shape == ref.shape and not np.allclose(npy(out), npy(ref))
    zeros = (npy(w) == 0).mean()   # dropped attention probabilities (averaged over 2 heads)
    assert 0.0 < zeros < 0.5 and (npy(w_ref) > 0).all()


def test_multihead_attention_state_dict_repr_and_init():
    for kw in ({}, {"bias": False}, {"add_bias_kv": True}, {"kdim": 6, "vdim": 4},
               {"add_zero_attn": True, "batch_first": True, "dropout": 0.2}):
        pm, tm = torch.nn.MultiheadAttention(E, H, **kw), tessera.nn.MultiheadAttention(E, H,
                                                                                        **kw)
        assert norm_repr(repr(tm)) == repr(pm)
        ps, ts = pm.state_dict(), tm.state_dict()
        assert list(ps) == list(ts)
        assert [tuple(v.shape) for v in ps.values()] == [tuple(v.shape) for v in ts.values()]
        for attr in ("embed_dim", "kdim", "vdim", "num_heads", "head_dim", "dropout",
                     "batch_first", "add_zero_attn", "_qkv_same_embed_dim"):
            assert getattr(tm, attr) == getattr(pm, attr), attr
    m = tessera.nn.MultiheadAttention(64, 4)
    bound = math.sqrt(6 / (64 + 3 * 64))   # xavier_uniform over the packed (3E, E) weight
    w = npy(m.in_proj_weight)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert not npy(m.in_proj_bias).any() and not npy(m.out_proj.bias).any()
    out_bound = 1 / math.sqrt(64)          # out_proj keeps Linear's kaiming_uniform(a=sqrt(5))
    assert np.abs(npy(m.out_proj.weight)).max() <= out_bound
    kv = tessera.nn.MultiheadAttention(64, 4, add_bias_kv=True)
    std = math.sqrt(2 / (1 + 64))          # xavier_normal_ on (1, 1, E): fans 1*E and 1*E
    assert 0.5 * std < npy(kv.bias_k).std() < 1.6 * std
    assert type(tm.out_proj).__name__ == "NonDynamicallyQuantizableLinear"


def _mha_error_cases():
    def call(L_, q_shape, kv_shape=None, **kw):
        m = L_.nn.MultiheadAttention(E, H)
        q = L_.randn(*q_shape)
        kv = L_.randn(*(kv_shape or q_shape))
        return m(q, kv, kv, **kw)
    return [
        lambda L_: L_.nn.MultiheadAttention(0, 2),
        lambda L_: L_.nn.MultiheadAttention(8, 3),
        lambda L_: call(L_, (2, 3, 4, E)),
        lambda L_: call(L_, (L, N, E), (S, E)),
        lambda L_: call(L_, (L, N, 6)),
        lambda L_: call(L_, (L, N, E), attn_mask=L_.zeros(3, 3, dtype=L_.bool)),
        lambda L_: call(L_, (L, N, E), attn_mask=L_.zeros(2, L, L, dtype=L_.bool)),
        lambda L_: call(L_, (L, N, E), attn_mask=L_.zeros(1, 1, L, L)),
        lambda L_: call(L_, (L, N, E), attn_mask=L_.zeros(L, L, dtype=L_.int64)),
        lambda L_: call(L_, (L, N, E), key_padding_mask=L_.zeros(N, L + 1, dtype=L_.bool)),
        lambda L_: call(L_, (L, N, E), key_padding_mask=L_.zeros(N + 1, L, dtype=L_.bool)),
        lambda L_: call(L_, (L, N, E), key_padding_mask=L_.zeros(L, dtype=L_.bool)),
        lambda L_: call(L_, (L, E), key_padding_mask=L_.zeros(1, L, dtype=L_.bool)),
        lambda L_: call(L_, (L, E), attn_mask=L_.zeros(3, L, L, dtype=L_.bool)),
        lambda L_: call(L_, (L, N, E), is_causal=True),
        lambda L_: L_.nn.MultiheadAttention(E, H)(L_.randn(L, N, E), L_.randn(S, N, E),
                                                  L_.randn(S + 1, N, E)),
        lambda L_: L_.nn.functional.multi_head_attention_forward(
            L_.randn(L, N, E), L_.randn(S, N, E), L_.randn(S, N, E), E + 2, H,
            L_.randn(3 * E, E), None, None, None, False, 0.0, L_.randn(E, E), None),
    ]


@pytest.mark.parametrize("fn", _mha_error_cases())
def test_multihead_attention_errors_match_torch(fn):
    raises_like_torch(fn)


def test_multihead_attention_mismatched_mask_types_warn():
    for L_ in (torch, tessera):
        m = L_.nn.MultiheadAttention(E, H)
        x = L_.randn(L, N, E)
        with pytest.warns(UserWarning, match="mismatched key_padding_mask and attn_mask"):
            m(x, x, x, key_padding_mask=L_.zeros(N, L, dtype=L_.bool),
              attn_mask=L_.zeros(L, L))


# ---- Transformer layers ------------------------------------------------------------------------

D, FF = 8, 16


def _seq_arrays(rng, batch_first=False):
    def seq(n):
        return rng.standard_normal((N, n, D) if batch_first else (n, N, D))
    causal = np.triu(np.full((L, L), -np.inf), 1)
    am = rng.random((L, L)) > 0.7
    np.fill_diagonal(am, False)
    return {"src": seq(S), "tgt": seq(L), "mem": seq(S), "src_kpm": _kpm(rng, N, S),
            "tgt_kpm": _kpm(rng, N, L), "causal": causal, "causal_b": np.isinf(causal),
            "src_causal": np.triu(np.full((S, S), -np.inf), 1), "bool_mask": am,
            "mem_mask": rng.standard_normal((L, S)), "usrc": rng.standard_normal((S, D)),
            "utgt": rng.standard_normal((L, D))}


def _act(name):
    if name == "silu":
        return lambda L_: L_.nn.functional.silu
    if name == "gelu_module":
        return lambda L_: L_.nn.GELU(approximate="tanh")
    return lambda L_: name


def _enc_layer(act="relu", **kw):
    kw = {"dropout": 0.0, **kw}
    return lambda L_: L_.nn.TransformerEncoderLayer(D, H, FF, activation=_act(act)(L_), **kw)


def _dec_layer(act="relu", **kw):
    kw = {"dropout": 0.0, **kw}
    return lambda L_: L_.nn.TransformerDecoderLayer(D, H, FF, activation=_act(act)(L_), **kw)


def _enc(m, L_, T, **kw):
    return m(T("tgt"), **kw)


def _dec(m, L_, T, **kw):
    return m(T("tgt"), T("mem"), **kw)


ENC_LAYER_CASES = [
    ("post_norm_relu", _enc_layer(), _enc, {}),
    ("pre_norm_gelu", _enc_layer("gelu", norm_first=True), _enc, {}),
    ("callable_silu", _enc_layer("silu"), _enc, {}),
    ("module_gelu_tanh", _enc_layer("gelu_module", norm_first=True), _enc, {}),
    ("batch_first", _enc_layer("gelu", batch_first=True), _enc, {"batch_first": True}),
    ("causal_mask", _enc_layer(), _with(_enc, src_mask="causal"), {}),
    ("causal_hint", _enc_layer(norm_first=True), _with(_enc, src_mask="causal",
                                                       is_causal=True), {}),
    ("bool_mask_kpm", _enc_layer(batch_first=True),
     _with(_enc, src_mask="bool_mask", src_key_padding_mask="tgt_kpm"), {"batch_first": True}),
    ("kpm", _enc_layer("gelu"), _with(_enc, src_key_padding_mask="tgt_kpm"), {}),
    ("no_bias_eps", _enc_layer(bias=False, layer_norm_eps=1e-3), _enc, {}),
    ("unbatched", _enc_layer(), lambda m, L_, T: m(T("utgt")), {}),
    ("dropout_eval", _enc_layer(dropout=0.3), _enc, {}),
]

DEC_LAYER_CASES = [
    ("post_norm_relu", _dec_layer(), _dec, {}),
    ("pre_norm_gelu", _dec_layer("gelu", norm_first=True), _dec, {}),
    ("callable_silu", _dec_layer("silu", norm_first=True), _dec, {}),
    ("module_gelu", _dec_layer("gelu_module"), _dec, {}),
    ("batch_first_masks", _dec_layer(batch_first=True),
     _with(_dec, tgt_mask="causal", memory_mask="mem_mask", tgt_key_padding_mask="tgt_kpm",
           memory_key_padding_mask="src_kpm"), {"batch_first": True}),
    ("causal_hint", _dec_layer(), _with(_dec, tgt_mask="causal", tgt_is_causal=True), {}),
    ("bool_masks", _dec_layer(norm_first=True),
     _with(_dec, tgt_mask="causal_b", memory_key_padding_mask="src_kpm"), {}),
    ("unbatched", _dec_layer(), lambda m, L_, T: m(T("utgt"), T("usrc")), {}),
    ("dropout_eval", _dec_layer(dropout=0.3, norm_first=True), _dec, {}),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name,make,fwd,akw", ENC_LAYER_CASES + DEC_LAYER_CASES,
                         ids=["enc_" + c[0] for c in ENC_LAYER_CASES] +
                             ["dec_" + c[0] for c in DEC_LAYER_CASES])
def test_transformer_layers_match_torch(name, make, fwd, akw, dtype):
    arrays = _seq_arrays(np.random.default_rng(len(name)), **akw)
    if "dropout" not in name:
        compare(make, fwd, arrays, dtype, train=True)
    compare(make, fwd, arrays, dtype, train=False)


def _encoder(num_layers=2, final_norm=True, **kw):
    kw = {"dropout": 0.0, **kw}

    def make(L_):
        layer = L_.nn.TransformerEncoderLayer(D, H, FF, **kw)
        norm = L_.nn.LayerNorm(D) if final_norm else None
        return L_.nn.TransformerEncoder(layer, num_layers, norm=norm)
    return make


def _decoder(num_layers=2, final_norm=True, **kw):
    def make(L_):
        layer = L_.nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, **kw)
        norm = L_.nn.LayerNorm(D) if final_norm else None
        return L_.nn.TransformerDecoder(layer, num_layers, norm=norm)
    return make


def _transformer(**kw):
    kw = {"dropout": 0.0, **kw}
    return lambda L_: L_.nn.Transformer(D, H, 2, 2, FF, **kw)


def _full(m, L_, T, **kw):
    return m(T("src"), T("tgt"), **kw)


STACK_CASES = [
    ("encoder", _encoder(), lambda m, L_, T: m(T("src")), {}),
    ("encoder_masks", _encoder(3, activation="gelu"),
     _with(lambda m, L_, T, **kw: m(T("tgt"), **kw), mask="causal",
           src_key_padding_mask="tgt_kpm"), {}),
    ("encoder_causal_hint", _encoder(norm_first=True),
     _with(lambda m, L_, T, **kw: m(T("tgt"), **kw), mask="causal", is_causal=True), {}),
    ("encoder_bool_causal", _encoder(final_norm=False, batch_first=True),
     _with(lambda m, L_, T, **kw: m(T("tgt"), **kw), mask="causal_b"), {"batch_first": True}),
    ("decoder", _decoder(), _with(_dec, tgt_mask="causal"), {}),
    ("decoder_all_masks", _decoder(3, batch_first=True, norm_first=True),
     _with(_dec, tgt_mask="causal", memory_mask="mem_mask", tgt_key_padding_mask="tgt_kpm",
           memory_key_padding_mask="src_kpm"), {"batch_first": True}),
    ("transformer", _transformer(), _full, {}),
    ("transformer_masks", _transformer(batch_first=True),
     _with(_full, src_mask="src_causal", tgt_mask="causal", src_key_padding_mask="src_kpm",
           tgt_key_padding_mask="tgt_kpm", memory_key_padding_mask="src_kpm"),
     {"batch_first": True}),
    ("transformer_norm_first_gelu", _transformer(norm_first=True, activation="gelu"),
     _with(_full, tgt_mask="causal", tgt_is_causal=True), {}),
    ("transformer_no_bias", _transformer(bias=False, layer_norm_eps=1e-4), _full, {}),
    ("transformer_unbatched", _transformer(), lambda m, L_, T: m(T("usrc"), T("utgt")), {}),
    ("transformer_dropout_eval", _transformer(dropout=0.2), _full, {}),
    ("transformer_custom_encoder",
     lambda L_: L_.nn.Transformer(D, H, dim_feedforward=FF, dropout=0.0, num_decoder_layers=1,
                                  custom_encoder=_encoder(1, final_norm=False)(L_)), _full, {}),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name,make,fwd,akw", STACK_CASES, ids=[c[0] for c in STACK_CASES])
def test_transformer_stacks_match_torch(name, make, fwd, akw, dtype):
    arrays = _seq_arrays(np.random.default_rng(len(name)), **akw)
    if "dropout" not in name:
        compare(make, fwd, arrays, dtype, train=True)
    compare(make, fwd, arrays, dtype, train=False)


def _seq2seq(L_):
    """A model class derived from nn.Transformer, the way people write them."""
    class Seq2Seq(L_.nn.Transformer):
        def __init__(self, vocab: int = 11):
            super().__init__(d_model=D, nhead=H, num_encoder_layers=2, num_decoder_layers=1,
                             dim_feedforward=FF, dropout=0.1, batch_first=True)
            self.embed = L_.nn.Embedding(vocab, D)
            self.head = L_.nn.Linear(D, vocab)

        def forward(self, src, tgt):
            mask = self.generate_square_subsequent_mask(tgt.size(1))
            h = super().forward(self.embed(src) * math.sqrt(D), self.embed(tgt),
                                tgt_mask=mask, tgt_is_causal=True,
                                src_key_padding_mask=src == 0)
            return self.head(h)
    return Seq2Seq()


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_transformer_subclass_overriding_forward(dtype):
    rng = np.random.default_rng(5)
    src = rng.integers(1, 11, (N, S))
    src[0, -2:] = 0
    arrays = {"src": src, "tgt": rng.integers(1, 11, (N, L))}
    fwd = lambda m, L_, T: m(T("src"), T("tgt"))  # noqa: E731
    pm, tm = compare(_seq2seq, fwd, arrays, dtype, train=False)
    assert isinstance(tm, tessera.nn.Transformer) and type(tm).__name__ == "Seq2Seq"
    assert norm_repr(repr(tm)) == repr(pm)
    # a few training steps with the same optimizer keep the two in step
    popt = torch.optim.SGD(pm.parameters(), lr=0.1)
    topt = tessera.optim.SGD(tm.parameters(), lr=0.1)
    pm.eval()
    tm.eval()
    for _ in range(3):
        for m, opt, L_ in ((pm, popt, torch), (tm, topt, tessera)):
            opt.zero_grad()
            out = m(L_.tensor(arrays["src"]), L_.tensor(arrays["tgt"]))
            L_.nn.functional.cross_entropy(out.reshape(-1, 11),
                                           L_.tensor(arrays["tgt"]).reshape(-1)).backward()
            opt.step()
    for (k, p), (_, t) in zip(pm.state_dict().items(), tm.state_dict().items()):
        np.testing.assert_allclose(npy(t), npy(p), **tol(dtype), err_msg=k)


def test_generate_square_subsequent_mask():
    for sz in (0, 1, 4):
        p = torch.nn.Transformer.generate_square_subsequent_mask(sz)
        t = tessera.nn.Transformer.generate_square_subsequent_mask(sz)
        assert t.dtype is tessera.float32 and tuple(t.shape) == (sz, sz)
        np.testing.assert_array_equal(npy(t), npy(p))
    t = tessera.nn.Transformer.generate_square_subsequent_mask(3, dtype=tessera.float64,
                                                                device="cpu")
    assert t.dtype is tessera.float64
    np.testing.assert_array_equal(npy(t), np.triu(np.full((3, 3), -np.inf), 1))
    m = tessera.nn.Transformer(D, H, 1, 1, FF)
    np.testing.assert_array_equal(npy(m.generate_square_subsequent_mask(3)),
                                  np.triu(np.full((3, 3), -np.inf), 1))


def test_encoder_inference_zeroes_padding_like_torch_nested_path():
    """In eval mode without autograd, PyTorch's encoder runs padded batches as nested tensors
    and returns zeros at the padded positions (before the final norm); tessera matches."""
    arrays = _seq_arrays(np.random.default_rng(9), batch_first=True)
    kpm = np.zeros((N, S), bool)
    kpm[0, 4:] = True
    kpm[2, 1:] = True
    arrays["src_kpm"] = kpm
    make = _encoder(2, batch_first=True)
    pm, tm = build_pair(make, np.float64)
    pm.eval()
    tm.eval()
    fwd = lambda m, L_, T: m(T("src"), src_key_padding_mask=T("src_kpm"))  # noqa: E731
    with torch.no_grad(), tessera.no_grad():
        compare(make, fwd, arrays, np.float64, grads=False, modules=(pm, tm))
    compare(make, fwd, arrays, np.float64, grads=True, modules=(pm, tm))
    assert tm.use_nested_tensor == pm.use_nested_tensor


def test_transformer_state_dicts_and_reprs():
    makes = [_enc_layer(), _enc_layer("gelu_module", norm_first=True), _dec_layer(bias=False),
             _encoder(), _decoder(3), _transformer(), _transformer(batch_first=True),
             lambda L_: L_.nn.Transformer(nhead=4, num_encoder_layers=1,
                                          num_decoder_layers=1, dim_feedforward=32)]
    for make in makes:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pm, tm = make(torch), make(tessera)
        assert norm_repr(repr(tm)) == repr(pm)
        ps, ts = pm.state_dict(), tm.state_dict()
        assert list(ps) == list(ts)
        assert [tuple(v.shape) for v in ps.values()] == [tuple(v.shape) for v in ts.values()]


def test_transformer_attributes_and_init():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for L_ in (torch, tessera):
            layer = L_.nn.TransformerEncoderLayer(D, H, FF, activation="gelu")
            assert layer.activation_relu_or_gelu == 2 and layer.norm_first is False
            assert L_.nn.TransformerEncoderLayer(D, H, FF).activation_relu_or_gelu == 1
            silu = L_.nn.TransformerEncoderLayer(D, H, FF, activation=L_.nn.functional.silu)
            assert silu.activation_relu_or_gelu == 0
            enc = L_.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            assert enc.num_layers == 2 and enc.norm is None and not enc.use_nested_tensor
            assert enc.layers[0] is not layer and enc.layers[0] is not enc.layers[1]
            t = L_.nn.Transformer(D, H, 1, 1, FF, batch_first=True)
            assert (t.d_model, t.nhead, t.batch_first) == (D, H, True)
    m = tessera.nn.Transformer(64, 4, 1, 1, 128)
    w = npy(m.encoder.layers[0].linear1.weight)   # xavier_uniform_ on every matrix
    bound = math.sqrt(6 / (64 + 128))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    with pytest.warns(UserWarning, match="enable_nested_tensor is True"):
        tessera.nn.TransformerEncoder(tessera.nn.TransformerEncoderLayer(D, H, norm_first=True),
                                      1)


def _transformer_error_cases():
    def full(L_, src, tgt, **kw):
        return L_.nn.Transformer(D, H, 1, 1, FF, **kw)(L_.randn(*src), L_.randn(*tgt))
    return [
        lambda L_: full(L_, (S, N, D), (L, N + 1, D)),
        lambda L_: full(L_, (N, S, D), (N + 1, L, D), batch_first=True),
        lambda L_: full(L_, (S, N, D + 1), (L, N, D + 1)),
        lambda L_: L_.nn.TransformerEncoderLayer(D, H, activation="tanh"),
        lambda L_: L_.nn.TransformerEncoderLayer(D, 3),
        lambda L_: L_.nn.TransformerEncoderLayer(D, H)(L_.randn(S, N, D),
                                                       src_mask=L_.zeros(S, S, dtype=L_.int32)),
        lambda L_: L_.nn.TransformerDecoderLayer(D, H)(L_.randn(L, N, D), L_.randn(S, N, D),
                                                       memory_mask=L_.zeros(L, L)),
    ]


@pytest.mark.parametrize("fn", _transformer_error_cases())
def test_transformer_errors_match_torch(fn):
    raises_like_torch(fn)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_inference_matches_torch_fused_fast_paths(dtype):
    """Eval mode without autograd sends PyTorch through its fused kernels
    (_native_multi_head_attention, _transformer_encoder_layer_fwd); same results here."""
    arrays = {**_mha_arrays(np.random.default_rng(4), batch_first=True),
              **_seq_arrays(np.random.default_rng(5), batch_first=True)}
    cases = [
        (_mha(batch_first=True), _with(_self, key_padding_mask="kpm_self")),
        (_mha(batch_first=True), _with(_self, need_weights=False, attn_mask="causal")),
        (_mha(batch_first=True), _with(_self, average_attn_weights=False)),
        (_enc_layer("gelu", batch_first=True), _with(_enc, src_key_padding_mask="tgt_kpm")),
        (_enc_layer(batch_first=True), _with(_enc, src_mask="causal")),
        (_encoder(2, batch_first=True),
         _with(lambda m, L_, T, **kw: m(T("tgt"), **kw), mask="causal")),
    ]
    for make, fwd in cases:
        pm, tm = build_pair(make, dtype)
        pm.eval()
        tm.eval()
        with torch.no_grad(), tessera.no_grad():
            compare(make, fwd, arrays, dtype, grads=False, modules=(pm, tm))
