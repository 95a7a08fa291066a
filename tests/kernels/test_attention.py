"""The fused attention kernel (tessera.kernels.attention, through
F.scaled_dot_product_attention) against PyTorch and against tessera's unfused composite:
forward and gradients for every mask kind (none, boolean, additive, broadcast, rows with
nothing to attend to), causal, scale, grouped-query heads and broadcast batches, at odd
lengths (1, 7, 63, 129) on either side of the 64-row tiles; dropout drawing the composite's
mask from the same seed (p > 0: the same outputs and gradients as the composite, the kept
fraction near 1 - p); each instruction set forced; nn.Graph running the fused op."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

import tessera
import tessera.nn.functional as F
from tessera.kernels import cc

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")


@pytest.fixture(scope="module")
def A():
    from tessera.kernels import attention
    if not attention.available():
        pytest.skip("code generation is off (TESSERA_CODEGEN=0)")
    return attention


def _arrays(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _run(lib, q, k, v, g, mask=None, **kw):
    """(output, dq, dk, dv) of ``lib``'s scaled_dot_product_attention."""
    xs = [lib.tensor(a, requires_grad=True) for a in (q, k, v)]
    m = None if mask is None else lib.tensor(mask)
    out = lib.nn.functional.scaled_dot_product_attention(*xs, attn_mask=m, **kw)
    out.backward(lib.tensor(g))
    return [out.detach().numpy()] + [x.grad.numpy() for x in xs]


def _composite(monkeypatch, fn):
    """``fn()`` with the fused kernel off: the unfused composite runs."""
    with monkeypatch.context() as m:
        m.setenv("TESSERA_CODEGEN", "0")
        return fn()


def _close(got, want, tol=2e-5):
    for a, b in zip(got, want):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


LENGTHS = [(1, 1), (7, 7), (63, 129), (129, 63), (129, 129)]


@pytest.mark.parametrize("L,S", LENGTHS)
@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float", "bool_bcast",
                                  "float_neg_inf"])
def test_against_torch(A, L, S, mask):
    B, H, E, Ev = 2, 3, 16, 24
    q, k, v, g = _arrays(L * S, (B, H, L, E), (B, H, S, E), (B, H, S, Ev), (B, H, L, Ev))
    rng = np.random.default_rng(S)
    kw: dict = {}
    if mask == "causal":
        kw["is_causal"] = True
    elif mask == "bool":
        m = rng.random((B, H, L, S)) > 0.3
        m[..., 0] = True               # torch's math path gives NaN on empty rows
        kw["mask"] = m
    elif mask == "bool_bcast":
        m = rng.random((1, L, S)) > 0.5
        m[..., -1] = True
        kw["mask"] = m
    elif mask == "float":
        kw["mask"] = rng.standard_normal((L, S)).astype(np.float32)
    elif mask == "float_neg_inf":
        m = rng.standard_normal((B, 1, L, S)).astype(np.float32)
        m[..., 1::2] = -np.inf
        kw["mask"] = m
    want = _run(torch, q, k, v, g, **kw, scale=0.3)
    got = _run(tessera, q, k, v, g, **kw, scale=0.3)
    _close(got, want)


def test_uses_the_fused_op(A):
    q = tessera.randn(2, 5, 8, requires_grad=True)
    out = F.scaled_dot_product_attention(q, q, q)
    assert out.grad_fn.name() == "ScaledDotProductAttentionBackward0"
    # float64 (and a mask that needs a gradient) keep the composite
    assert F.scaled_dot_product_attention(*(q.double(),) * 3).grad_fn.name() == \
        "MatmulBackward0"


@pytest.mark.parametrize("case", ["gqa", "gqa_causal", "bcast_batch", "two_d", "dead_rows"])
def test_against_composite(A, monkeypatch, case):
    """Shapes and masks torch's math path handles differently (empty rows: NaN there) or
    that only the composite's definition pins down: the fused op agrees with it."""
    kw: dict = {}
    if case.startswith("gqa"):
        shapes = (2, 6, 63, 16), (2, 2, 129, 16), (2, 3, 129, 8), (2, 6, 63, 8)
        kw = dict(enable_gqa=True, is_causal=case == "gqa_causal")
    elif case == "bcast_batch":
        shapes = (2, 3, 7, 4), (1, 3, 65, 4), (1, 1, 65, 4), (2, 3, 7, 4)
    elif case == "two_d":
        shapes = (7, 5), (129, 5), (129, 3), (7, 3)
    else:
        shapes = (2, 63, 8), (2, 70, 8), (2, 70, 8), (2, 63, 8)
        m = np.random.default_rng(0).random((2, 63, 70)) > 0.5
        m[0, 5] = m[1, 62] = False
        kw["mask"] = m
    q, k, v, g = _arrays(1, *shapes)
    got = _run(tessera, q, k, v, g, **kw)
    want = _composite(monkeypatch, lambda: _run(tessera, q, k, v, g, **kw))
    _close(got, want)
    if case == "dead_rows":
        assert not got[0][0, 5].any() and not got[1][1, 62].any()


@pytest.mark.parametrize("p,causal", [(0.3, False), (0.5, True), (1.0, False)])
def test_dropout_regenerates_the_composite_mask(A, monkeypatch, p, causal):
    """Same RNG state, same mask: the fused op's output and gradients (whose backward draws
    the mask again) equal the composite's."""
    q, k, v, g = _arrays(2, (2, 2, 63, 8), (2, 2, 129, 8), (2, 2, 129, 8), (2, 2, 63, 8))
    tessera.manual_seed(7)
    got = _run(tessera, q, k, v, g, dropout_p=p, is_causal=causal)

    def composite():
        tessera.manual_seed(7)
        return _run(tessera, q, k, v, g, dropout_p=p, is_causal=causal)
    _close(got, _composite(monkeypatch, composite))
    tessera.manual_seed(8)
    other = _run(tessera, q, k, v, g, dropout_p=p, is_causal=causal)
    assert p == 1.0 or not np.allclose(other[0], got[0])


def test_dropout_keeps_one_minus_p(A):
    """Uniform weights (q = 0) on value = identity: each output element is keep / (S (1-p)),
    so the kept fraction is visible; for 64 x 512 draws it is within 4 sigma of 1 - p."""
    S, p = 512, 0.3
    q = tessera.zeros(1, 64, 4)
    out = F.scaled_dot_product_attention(q, tessera.zeros(1, S, 4), tessera.eye(S)[None],
                                         dropout_p=p).numpy()
    scaled = out * S * (1 - p)
    kept = np.isclose(scaled, 1.0, rtol=1e-4)
    assert np.all(kept | (out == 0))
    sigma = np.sqrt(p * (1 - p) / kept.size)
    assert abs(kept.mean() - (1 - p)) < 4 * sigma


def test_keep_threshold_matches_numpy(A):
    """The integer compare the kernel makes equals NumPy's float32 ``u >= p``."""
    bits = np.random.default_rng(0).integers(0, 2 ** 32, 200_000, dtype=np.uint64)
    u = ((bits >> 8).astype(np.float32) * np.float32(2.0 ** -24))
    for p in (0.1, 0.3, 1 / 3, 0.5, 0.9999):
        assert np.array_equal((bits >> 8) >= A.keep_threshold(p), u >= np.float32(p))


@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable"])
def test_each_instruction_set(A, monkeypatch, isa):
    lib = A._lib()
    index = A.ISAS.index(isa)
    if index > A.ISAS.index(cc.max_isa()):   # TESSERA_MAX_ISA=avx2 on an AVX-512 CPU
        monkeypatch.setenv("TESSERA_ATTN_ISA", isa)
        A._isa.cache_clear()
        with pytest.raises(RuntimeError, match="excludes it"):
            A.isa()
        A._isa.cache_clear()
        pytest.skip(f"TESSERA_MAX_ISA={cc.max_isa()} excludes {isa}")
    if not lib.tsr_attn_isa_supported(index):
        monkeypatch.setenv("TESSERA_ATTN_ISA", isa)
        A._isa.cache_clear()
        with pytest.raises(RuntimeError, match="lacks"):
            A.isa()
        A._isa.cache_clear()
        pytest.skip(f"this CPU cannot run {isa}")
    # odd lengths and head sizes; then BERT's head size 32 and 64 values (K and V copied to
    # their blocks 8 x 8 at a time) with 100 query rows, not a multiple of the row tiles
    cases = [(_arrays(3, (2, 2, 63, 24), (2, 2, 129, 24), (2, 2, 129, 20), (2, 2, 63, 20)),
              True),
             (_arrays(4, (2, 3, 100, 32), (2, 3, 77, 32), (2, 3, 77, 64), (2, 3, 100, 64)),
              False)]
    wants = [_run(torch, *xs, is_causal=causal) for xs, causal in cases]
    monkeypatch.setenv("TESSERA_ATTN_ISA", isa)
    A._isa.cache_clear()
    try:
        assert A.isa() == isa
        for (xs, causal), want in zip(cases, wants):
            _close(_run(tessera, *xs, is_causal=causal), want)
    finally:
        monkeypatch.delenv("TESSERA_ATTN_ISA")
        A._isa.cache_clear()


def test_unknown_isa_name(A, monkeypatch):
    monkeypatch.setenv("TESSERA_ATTN_ISA", "sse9")
    A._isa.cache_clear()
    try:
        with pytest.raises(ValueError, match="expected one of portable, avx2, avx512"):
            A.isa()
    finally:
        monkeypatch.delenv("TESSERA_ATTN_ISA")
        A._isa.cache_clear()


def test_second_derivative_names_the_op(A):
    q = tessera.randn(2, 3, 4, requires_grad=True)
    out = F.scaled_dot_product_attention(q, q, q)
    (gq,) = tessera.autograd.grad(out.sum(), [q], create_graph=True)
    with pytest.raises(NotImplementedError, match="scaled_dot_product_attention_backward"):
        gq.sum().backward()


def test_in_graph_matches_torch(A):
    """nn.Graph traces the fused op (forward and its backward op) and matches PyTorch."""
    q, k, v, g = _arrays(4, (2, 4, 65, 16), (2, 4, 65, 16), (2, 4, 65, 16), (2, 4, 65, 16))
    params = [tessera.nn.Parameter(tessera.tensor(a)) for a in (q, k, v)]

    class Step(tessera.nn.Graph):
        def build(self, g):
            out = F.scaled_dot_product_attention(*params, is_causal=True)
            return (out, *tessera.autograd.grad((out * g).sum(), params))

    step = Step()
    got = step(tessera.tensor(g))
    assert "scaled_dot_product_attention_backward" in str(step.ir)
    want = _run(torch, q, k, v, g, is_causal=True)
    _close([t.numpy() for t in got], want)


def test_struct_matches_the_c_layout(A):
    # 5 + 8 + 5 + 6 eight-byte fields, 6 four-byte ones, the RNG's 4 words
    assert ctypes.sizeof(A._Attn) == 24 * 8 + 6 * 4 + 4 * 8


@pytest.mark.parametrize("gqa", [False, True])
def test_sbp_rule_splits_batch_dims_and_each_split_computes_its_shard(gqa):
    """Every split signature of the fused op's rule, run shard by shard on two halves and
    concatenated, equals the whole (what a planner that picks it relies on)."""
    from tessera.ops.attention import _FUSED
    from tessera.ops.registry import Meta
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 5, 8)).astype(np.float32)
    kv = (2, 2 if gqa else 4, 6, 8)
    k, v = (rng.standard_normal(kv).astype(np.float32) for _ in range(2))
    attrs = dict(scale=0.3, is_causal=True, dropout_p=0.0, enable_gqa=gqa)
    metas = [Meta(a.shape, tessera.float32) for a in (q, k, v)] + [None]
    splits = [s for s in _FUSED.sbp(*metas, **attrs) if s.outs[0].is_split()]
    assert [s.outs[0].dim for s in splits] == ([0] if gqa else [0, 1])
    whole = _FUSED.kernels["cpu"](q, k, v, None, **attrs)
    for sig in splits:
        d = sig.outs[0].dim
        parts = []
        for half in (0, 1):
            args = [np.array_split(a, 2, axis=s.dim)[half] if s.is_split() else a
                    for a, s in zip((q, k, v), sig.ins)]
            parts.append(_FUSED.kernels["cpu"](*args, None, **attrs))
        for j in range(2):
            np.testing.assert_allclose(np.concatenate([p[j] for p in parts], axis=d),
                                       whole[j], rtol=1e-6, atol=1e-6)
