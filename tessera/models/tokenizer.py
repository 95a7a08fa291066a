"""BERT tokenisation: a pure-Python WordPiece tokenizer over ``vocab.txt`` and
``load_tokenizer(folder)``, which prefers the Rust ``tokenizers`` package when installed.

Both return Hugging Face style encodings: a dict of ``input_ids``, ``token_type_ids`` and
``attention_mask`` as tessera int64 tensors of shape (batch, seq).

The WordPiece tokenizer reproduces ``tokenizers``' ``BertNormalizer`` (clean text, CJK
isolation, accent stripping, lower-casing), ``BertPreTokenizer`` (whitespace and
punctuation splitting) and greedy longest-match-first ``WordPiece`` with ``##``
continuation, so both give the same ids (tested in ``tests/models/test_bert.py``).

>>> import tempfile, os
>>> folder = tempfile.mkdtemp()
>>> words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "!", "un", "##aff"]
>>> _ = open(os.path.join(folder, "vocab.txt"), "w").write("\\n".join(words))
>>> tok = WordPieceTokenizer(os.path.join(folder, "vocab.txt"))
>>> tok.tokenize("Hello, WÖRLD! Unaff")
['hello', '[UNK]', 'world', '!', 'un', '##aff']
>>> tok(["Hello world!"])["input_ids"]
tensor([[2, 5, 6, 7, 3]])
"""
from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Sequence

import numpy as np

from tessera.ops.creation import from_numpy

__all__ = ["WordPieceTokenizer", "load_tokenizer"]

_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# the WordPiece decoder's clean-up of tokenization spaces (transformers, tokenizers)
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


# ---- character classes (as BERT and tokenizers define them) ---------------------------------

def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch: str) -> bool:
    # tab/newline/return count as whitespace, not control, so they survive as separators
    return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")


def _is_punctuation(ch: str) -> bool:
    # BERT treats all non-alphanumeric ASCII (e.g. "$", "^", "`") as punctuation, though
    # Unicode puts some of them in the symbol classes
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    """CJK Unified Ideographs blocks (not Hangul or kana, which are space-separated)."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F
            or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


# ---- the tokenizer -------------------------------------------------------------------------

class WordPieceTokenizer:
    """BERT's uncased WordPiece tokenizer over a ``vocab.txt`` (one token per line).

    ``tok(texts, padding=True, truncation=True, max_length=None, text_pair=None)`` returns
    ``{"input_ids", "token_type_ids", "attention_mask"}`` as int64 tensors; ``padding`` is
    True/"longest" (pad to the longest), "max_length" (pad to ``max_length``) or False.
    """

    def __init__(self, vocab_file: str | os.PathLike, do_lower_case: bool = True,
                 strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                 model_max_length: int = 512, max_input_chars_per_word: int = 100) -> None:
        with open(vocab_file, encoding="utf-8") as fh:
            tokens = [line.rstrip("\n").rstrip("\r") for line in fh]
        if tokens and tokens[-1] == "":
            tokens.pop()
        self.vocab = {tok: i for i, tok in enumerate(tokens)}
        self.ids_to_tokens = tokens
        missing = [s for s in ("[UNK]", "[CLS]", "[SEP]", "[PAD]") if s not in self.vocab]
        if missing:
            raise ValueError(f"{vocab_file}: vocabulary lacks the special tokens {missing}")
        self.do_lower_case = do_lower_case
        # tokenizers' BertNormalizer: strip_accents=None follows lowercase
        self.strip_accents = do_lower_case if strip_accents is None else strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.model_max_length = model_max_length
        self.max_input_chars_per_word = max_input_chars_per_word
        self.special_tokens = [s for s in _SPECIALS if s in self.vocab]
        self.unk_token_id = self.vocab["[UNK]"]
        self.cls_token_id = self.vocab["[CLS]"]
        self.sep_token_id = self.vocab["[SEP]"]
        self.pad_token_id = self.vocab["[PAD]"]

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> WordPieceTokenizer:
        """Read ``vocab.txt`` and the options of ``tokenizer_config.json`` if present."""
        cfg = _tokenizer_config(folder)
        return cls(os.path.join(folder, "vocab.txt"),
                   do_lower_case=cfg.get("do_lower_case", True),
                   strip_accents=cfg.get("strip_accents"),
                   tokenize_chinese_chars=cfg.get("tokenize_chinese_chars", True),
                   model_max_length=min(int(cfg.get("model_max_length", 512)), 1 << 20))

    @property
    def vocab_size(self) -> int:
        return len(self.ids_to_tokens)

    def __len__(self) -> int:
        return self.vocab_size

    # -- text -> tokens -----------------------------------------------------------------------
    def normalize(self, text: str) -> str:
        """Clean control characters, isolate CJK ideographs, strip accents, lower-case."""
        out = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or _is_control(ch):
                continue
            if _is_whitespace(ch):
                out.append(" ")
            elif self.tokenize_chinese_chars and _is_cjk(cp):
                out.extend((" ", ch, " "))
            else:
                out.append(ch)
        text = "".join(out)
        if self.strip_accents:
            text = "".join(c for c in unicodedata.normalize("NFD", text)
                           if unicodedata.category(c) != "Mn")
        return text.lower() if self.do_lower_case else text

    @staticmethod
    def pre_tokenize(text: str) -> list[str]:
        """Split on whitespace, and make every punctuation character its own word."""
        words: list[str] = []
        for chunk in text.split():
            cur: list[str] = []
            for ch in chunk:
                if _is_punctuation(ch):
                    if cur:
                        words.append("".join(cur))
                        cur = []
                    words.append(ch)
                else:
                    cur.append(ch)
            if cur:
                words.append("".join(cur))
        return words

    def wordpiece(self, word: str) -> list[str]:
        """Greedy longest-match-first split of one word; [UNK] if any piece is unknown."""
        if len(word) > self.max_input_chars_per_word:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            if end == start:
                return ["[UNK]"]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """Word pieces of ``text`` (special tokens written in the text are kept whole)."""
        tokens: list[str] = []
        for part, special in self._split_specials(text):
            if special:
                tokens.append(part)
                continue
            for word in self.pre_tokenize(self.normalize(part)):
                tokens.extend(self.wordpiece(word))
        return tokens

    def _split_specials(self, text: str) -> list[tuple[str, bool]]:
        # like tokenizers' added tokens: matched verbatim before normalisation
        parts: list[tuple[str, bool]] = []
        i = start = 0
        while i < len(text):
            hit = next((s for s in self.special_tokens if text.startswith(s, i)), None)
            if hit is None:
                i += 1
                continue
            if i > start:
                parts.append((text[start:i], False))
            parts.append((hit, True))
            i = start = i + len(hit)
        if start < len(text):
            parts.append((text[start:], False))
        return parts

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
        return [self.vocab.get(t, self.unk_token_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.ids_to_tokens[int(i)] for i in ids]

    def encode(self, text: str, text_pair: str | None = None, add_special_tokens: bool = True,
               truncation: bool = False, max_length: int | None = None) -> list[int]:
        """Ids of one text (or pair): ``[CLS] a [SEP] (b [SEP])``."""
        ids, _ = self._encode_one(text, text_pair, add_special_tokens, truncation, max_length)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Join word pieces back into text (``##`` pieces glued to the previous one)."""
        toks = [t for t in self.convert_ids_to_tokens(ids)
                if not (skip_special_tokens and t in self.special_tokens)]
        text = " ".join(toks).replace(" ##", "")
        for before, after in _CLEANUP:
            text = text.replace(before, after)
        return text

    def _encode_one(self, text, pair, add_special, truncation, max_length):
        a = self.convert_tokens_to_ids(self.tokenize(text))
        b = self.convert_tokens_to_ids(self.tokenize(pair)) if pair is not None else None
        if truncation:
            limit = max_length if max_length is not None else self.model_max_length
            extra = (3 if b is not None else 2) if add_special else 0
            a, b = _truncate_longest_first(a, b, limit - extra)
        if not add_special:
            ids = a + (b or [])
            return ids, [0] * len(a) + [1] * len(b or [])
        ids = [self.cls_token_id] + a + [self.sep_token_id]
        types = [0] * len(ids)
        if b is not None:
            ids += b + [self.sep_token_id]
            types += [1] * (len(b) + 1)
        return ids, types

    def __call__(self, text: str | Sequence[str], text_pair: str | Sequence[str] | None = None,
                 padding: bool | str = True, truncation: bool = True,
                 max_length: int | None = None, add_special_tokens: bool = True) -> dict:
        """Encode a text or a batch of texts into padded int64 tensors."""
        texts = [text] if isinstance(text, str) else list(text)
        pairs = ([text_pair] if isinstance(text_pair, str) else list(text_pair)
                 if text_pair is not None else [None] * len(texts))
        if len(pairs) != len(texts):
            raise ValueError(f"got {len(texts)} texts but {len(pairs)} text pairs")
        enc = [self._encode_one(t, p, add_special_tokens, truncation, max_length)
               for t, p in zip(texts, pairs)]
        return _to_tensors([e[0] for e in enc], [e[1] for e in enc], padding, max_length,
                           self.pad_token_id)


def _tokenizer_config(folder) -> dict:
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _truncate_longest_first(a: list, b: list | None, budget: int):
    """Cut the ends so that both fit in ``budget``: ``tokenizers``' LongestFirst rule (the
    shorter keeps its length if the longer can absorb the cut, else they split the budget,
    the odd token going to the longer)."""
    budget = max(budget, 0)
    if b is None:
        return a[:budget], None
    if len(a) + len(b) <= budget:
        return a, b
    n1, n2 = sorted((len(a), len(b)))
    n2 = n1 if n1 > budget else max(n1, budget - n1)
    if n1 + n2 > budget:
        n1, n2 = budget // 2, budget // 2 + budget % 2
    if len(a) > len(b):
        n1, n2 = n2, n1
    return a[:n1], b[:n2]


def _to_tensors(ids: list[list[int]], types: list[list[int]], padding, max_length,
                pad_id: int) -> dict:
    """Pad (right) the batch and build input_ids / token_type_ids / attention_mask."""
    lengths = [len(x) for x in ids]
    if padding == "max_length":
        if max_length is None:
            raise ValueError("padding='max_length' needs max_length")
        width = max(max_length, max(lengths, default=0))
    elif padding in (True, "longest"):
        width = max(lengths, default=0)
    elif padding in (False, "do_not_pad"):
        if len(set(lengths)) > 1:
            raise ValueError(f"sequences of different lengths {lengths} cannot be batched "
                             "without padding; pass padding=True")
        width = max(lengths, default=0)
    else:
        raise ValueError(f"padding must be True, False, 'longest' or 'max_length', got "
                         f"{padding!r}")
    out = np.full((len(ids), width), pad_id, dtype=np.int64)
    tt = np.zeros((len(ids), width), dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for i, (x, t) in enumerate(zip(ids, types)):
        out[i, :len(x)], tt[i, :len(t)], mask[i, :len(x)] = x, t, 1
    return {"input_ids": from_numpy(out), "token_type_ids": from_numpy(tt),
            "attention_mask": from_numpy(mask)}


class _FastTokenizer:
    """The ``tokenizers`` package behind the same call interface as WordPieceTokenizer."""

    def __init__(self, tok, model_max_length: int = 512) -> None:
        self._tok = tok
        self.model_max_length = model_max_length
        self.pad_token_id = tok.token_to_id("[PAD]") or 0
        self.unk_token_id = tok.token_to_id("[UNK]")
        self.cls_token_id = tok.token_to_id("[CLS]")
        self.sep_token_id = tok.token_to_id("[SEP]")
        # the file may fix padding/truncation (MiniLM's pads everything to 128); we decide
        # per call instead
        tok.no_padding()
        tok.no_truncation()

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def __len__(self) -> int:
        return self.vocab_size

    def tokenize(self, text: str) -> list[str]:
        return self._tok.encode(text, add_special_tokens=False).tokens

    def encode(self, text: str, text_pair: str | None = None, add_special_tokens: bool = True,
               truncation: bool = False, max_length: int | None = None) -> list[int]:
        self._truncation(truncation, max_length)
        return self._tok.encode(text, text_pair, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
        ids = (self._tok.token_to_id(t) for t in tokens)
        return [self.unk_token_id if i is None else i for i in ids]

    def _truncation(self, truncation: bool, max_length: int | None) -> None:
        if truncation:
            self._tok.enable_truncation(max_length or self.model_max_length)
        else:
            self._tok.no_truncation()

    def __call__(self, text, text_pair=None, padding: bool | str = True, truncation: bool = True,
                 max_length: int | None = None, add_special_tokens: bool = True) -> dict:
        """Encode a text or a batch of texts into padded int64 tensors."""
        texts = [text] if isinstance(text, str) else list(text)
        self._truncation(truncation, max_length)
        if text_pair is None:
            encs = self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)
        else:
            pairs = [text_pair] if isinstance(text_pair, str) else list(text_pair)
            encs = self._tok.encode_batch(list(zip(texts, pairs)),
                                          add_special_tokens=add_special_tokens)
        return _to_tensors([e.ids for e in encs], [e.type_ids for e in encs], padding,
                           max_length, self.pad_token_id)


def load_tokenizer(folder: str | os.PathLike, use_fast: bool = True):
    """The tokenizer of a Hugging Face folder: ``tokenizers`` over ``tokenizer.json`` when
    that package is installed (and ``use_fast``), else WordPieceTokenizer over ``vocab.txt``.
    """
    path = os.path.join(folder, "tokenizer.json")
    if use_fast and os.path.exists(path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            pass
        else:
            max_len = min(int(_tokenizer_config(folder).get("model_max_length", 512)), 1 << 20)
            return _FastTokenizer(Tokenizer.from_file(path), max_len)
    return WordPieceTokenizer.from_pretrained(folder)
