"""tessera.models.gpt2 against nanoGPT's GPT-2 written in plain torch (torch_text_refs.py):
forward, loss and gradients with copied weights; weight tying; KV-cache generation against
recomputing the whole sequence; greedy, top-k and temperature sampling.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tessera.models import GPT, GPTConfig
from tessera.models.gpt2 import KVCache, gpt
from tests.models.torch_text_refs import TorchGPT

SIZES = dict(vocab_size=13, block_size=12, n_layer=2, n_head=2, n_embd=16)


def _pair(seed: int = 0, dtype=torch.float32, logit_scale: float = 1.0):
    torch.manual_seed(seed)
    ref = TorchGPT(**SIZES).to(dtype).eval()
    with torch.no_grad():  # non-trivial LayerNorm affine and biases
        for name, p in ref.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
        # the logits are linear in ln_f's affine output
        ref.transformer.ln_f.weight.mul_(logit_scale)
        ref.transformer.ln_f.bias.mul_(logit_scale)
    model = GPT(GPTConfig(**SIZES)).eval()
    if dtype == torch.float64:
        model = model.double()
    state = {k: tessera.from_numpy(v.detach().numpy().copy())
             for k, v in ref.state_dict().items()}
    model.load_state_dict(state, strict=True)
    return ref, model


def _ids(shape, seed=1, vocab=SIZES["vocab_size"]) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=shape).astype(np.int64)


def test_forward_loss_and_grads_match_torch():
    ref, model = _pair()
    idx, tgt = _ids((3, 10)), _ids((3, 10), seed=2)
    tgt[0, :3] = -1  # ignored positions
    logits_ref, loss_ref = ref(torch.from_numpy(idx), torch.from_numpy(tgt))
    logits, loss = model(tessera.from_numpy(idx), tessera.from_numpy(tgt))
    np.testing.assert_allclose(logits.detach().numpy(), logits_ref.detach().numpy(),
                               atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(loss.item(), loss_ref.item(), rtol=1e-5)
    loss_ref.backward()
    loss.backward()
    grads = dict(model.named_parameters())
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(grads[name].grad.numpy(), p.grad.numpy(), atol=1e-5,
                                   rtol=1e-3, err_msg=name)


def test_forward_without_targets_has_no_loss():
    _, model = _pair()
    logits, loss = model(tessera.from_numpy(_ids((2, 12))))
    assert loss is None and logits.shape == (2, 12, SIZES["vocab_size"])


def test_weights_are_tied():
    _, model = _pair()
    assert model.lm_head.weight is model.transformer.wte.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and "transformer.wte.weight" in names
    assert {"lm_head.weight", "transformer.wte.weight"} <= set(model.state_dict())
    opt = tessera.optim.SGD(model.parameters(), lr=0.1)
    model(tessera.from_numpy(_ids((2, 5))), tessera.from_numpy(_ids((2, 5), 3)))[1].backward()
    opt.step()
    assert model.lm_head.weight is model.transformer.wte.weight
    n_params = sum(p.numel() for p in model.parameters())
    assert model.get_num_params(non_embedding=False) == n_params
    assert model.get_num_params() == n_params - SIZES["block_size"] * SIZES["n_embd"]


def test_too_long_sequences_raise():
    _, model = _pair()
    with pytest.raises(ValueError, match="block size is only 12"):
        model(tessera.zeros(1, 13, dtype=tessera.int64))
    cache = KVCache(model.config, 1)
    model(tessera.zeros(1, 8, dtype=tessera.int64), kv_cache=cache)
    with pytest.raises(ValueError, match="length 13"):
        model(tessera.zeros(1, 5, dtype=tessera.int64), kv_cache=cache)
    with pytest.raises(ValueError, match="idx must be"):
        model.generate(tessera.zeros(1, 0, dtype=tessera.int64), 3)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(tessera.zeros(1, 2, dtype=tessera.int64), 3, top_k=0)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(tessera.zeros(1, 2, dtype=tessera.int64), 3, temperature=-1.0)


def test_kv_cache_forward_matches_full_forward():
    _, model = _pair(dtype=torch.float64)
    idx = tessera.from_numpy(_ids((2, 9)))
    full, _ = model(idx)
    cache = KVCache(model.config, 2, dtype=tessera.float64)
    parts = [model(idx[:, :4], kv_cache=cache)[0], model(idx[:, 4:5], kv_cache=cache)[0],
             model(idx[:, 5:], kv_cache=cache)[0]]  # a multi-token chunk after the prefix
    assert cache.length == 9
    np.testing.assert_allclose(tessera.cat(parts, dim=1).detach().numpy(),
                               full.detach().numpy(), atol=1e-12)


def _torch_greedy(ref, idx: np.ndarray, n: int) -> np.ndarray:
    x = torch.from_numpy(idx)
    with torch.no_grad():
        for _ in range(n):
            logits, _ = ref(x[:, -SIZES["block_size"]:])
            x = torch.cat([x, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return x.numpy()


def test_greedy_generation_matches_torch_and_is_deterministic():
    ref, model = _pair(dtype=torch.float64)
    prompt = _ids((2, 4))
    n = 15  # runs past block_size (12): the window slides
    expected = _torch_greedy(ref, prompt, n)
    for use_cache in (True, False):
        out = model.generate(tessera.from_numpy(prompt), n, do_sample=False,
                             use_cache=use_cache)
        np.testing.assert_array_equal(out.numpy(), expected)
    again = model.generate(tessera.from_numpy(prompt), n, do_sample=False)
    np.testing.assert_array_equal(again.numpy(), expected)
    zero_t = model.generate(tessera.from_numpy(prompt), n, temperature=0.0)
    np.testing.assert_array_equal(zero_t.numpy(), expected)


@pytest.mark.parametrize("top_k", [None, 3])
def test_sampling_with_cache_equals_without_and_is_seeded(top_k):
    _, model = _pair(dtype=torch.float64)
    prompt = tessera.from_numpy(_ids((3, 3)))
    outs = []
    for use_cache in (True, False, True):
        tessera.manual_seed(123)
        outs.append(model.generate(prompt, 14, temperature=1.3, top_k=top_k,
                                   use_cache=use_cache).numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
    tessera.manual_seed(124)
    other = model.generate(prompt, 14, temperature=1.3, top_k=top_k).numpy()
    assert not np.array_equal(other, outs[0])


def _next_token_counts(model, prompt: np.ndarray, n: int, **kw) -> np.ndarray:
    batch = tessera.from_numpy(np.repeat(prompt, n, axis=0))
    tessera.manual_seed(0)
    toks = model.generate(batch, 1, **kw).numpy()[:, -1]
    return np.bincount(toks, minlength=SIZES["vocab_size"]) / n


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_sampling_follows_softmax(temperature):
    ref, model = _pair(logit_scale=0.25)  # logits std ~1, so that temperature matters
    prompt = _ids((1, 5))
    with torch.no_grad():
        logits = ref(torch.from_numpy(prompt))[0][0, -1]
    want = torch.softmax(logits / temperature, -1).numpy()
    got = _next_token_counts(model, prompt, 4000, temperature=temperature)
    assert 0.5 * np.abs(got - want).sum() < 0.05  # total variation distance
    # the temperature visibly changes the distribution
    flat = torch.softmax(logits / (4 * temperature), -1).numpy()
    assert 0.5 * np.abs(want - flat).sum() > 0.1


def test_top_k_restricts_to_the_k_best():
    ref, model = _pair()
    prompt = _ids((1, 5), seed=4)
    with torch.no_grad():
        logits = ref(torch.from_numpy(prompt))[0][0, -1]
    best = set(torch.topk(logits, 3).indices.tolist())
    got = _next_token_counts(model, prompt, 2000, temperature=3.0, top_k=3)
    assert set(np.nonzero(got)[0].tolist()) == best  # high temperature: all 3 show up
    want = torch.softmax(logits / 3.0, -1).numpy()
    want = np.where(np.isin(np.arange(len(want)), list(best)), want, 0.0)
    assert 0.5 * np.abs(got - want / want.sum()).sum() < 0.05
    one = _next_token_counts(model, prompt, 50, top_k=1)
    assert one[int(logits.argmax())] == 1.0


def test_dropout_only_in_training():
    model = gpt("gpt-nano", vocab_size=11, block_size=8, dropout=0.2)
    idx = tessera.from_numpy(_ids((2, 8), vocab=11))
    model.train()
    a, b = model(idx)[0].detach().numpy(), model(idx)[0].detach().numpy()
    assert not np.allclose(a, b)
    model.eval()
    np.testing.assert_array_equal(model(idx)[0].detach().numpy(),
                                  model(idx)[0].detach().numpy())


def test_factory_presets_and_config_checks():
    m = gpt("gpt-micro", vocab_size=7, block_size=4)
    assert (m.config.n_layer, m.config.n_head, m.config.n_embd) == (4, 4, 128)
    assert len(m.transformer.h) == 4
    with pytest.raises(ValueError, match="unknown GPT model_type"):
        gpt("gpt-giant")
    with pytest.raises(ValueError, match="multiple of n_head"):
        GPTConfig(n_embd=10, n_head=3)


def test_small_gpt_learns_a_pattern():
    tessera.manual_seed(0)
    model = gpt("gpt-nano", vocab_size=5, block_size=8)
    data = tessera.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3]] * 4)
    opt = tessera.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(60):
        _, loss = model(data[:, :-1], data[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1
    out = model.eval().generate(tessera.tensor([[0, 1]]), 6, do_sample=False)
    assert out.numpy().tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]


def test_lazy_public_name_stays_the_factory():
    import tessera.models
    assert tessera.models.GPT is GPT
    assert callable(tessera.models.gpt) and tessera.models.gpt is gpt
