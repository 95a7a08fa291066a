"""``python -m bench [section ...]``: the benchmarks, side by side with their peers.

Sections: overhead, kernels, training, cputime, compile, demo, models, einsum, distributed
(all by default, in that order; ``python -m bench.onnx_simplify`` counts ONNX nodes separately).
Prints one table per section, writes every figure to ``bench/results/<time>.json`` and a
bar chart of the ratios to PyTorch eager beside it.

Run through ``make bench``, which unsets OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE for this
command only (they halve NumPy's SGEMM on this machine).
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time

from bench.common import environment

SECTIONS = ("overhead", "kernels", "training", "cputime", "compile", "demo", "models", "einsum",
            "distributed")


def _module(name: str):
    try:
        return importlib.import_module(f"bench.{name}")
    except ImportError as e:  # a section whose module is not in this checkout
        if e.name == f"bench.{name}":
            return None
        raise


def main(argv: list[str]) -> int:
    unknown = [a for a in argv if a not in SECTIONS]
    if unknown:
        print(f"python -m bench: unknown section(s) {unknown}; choose from {SECTIONS}",
              file=sys.stderr)
        return 2
    chosen = [s for s in SECTIONS if s in argv] if argv else list(SECTIONS)
    print(f"# tessera benchmarks, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"# {environment()}")
    import torch
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{os.cpu_count()} cores")
    results = {"environment": environment(), "date": time.strftime("%Y-%m-%d %H:%M")}
    for name in chosen:
        mod = _module(name)
        if mod is None:
            continue
        results[name] = mod.run()
        title = getattr(mod, "TITLE", None)
        print("\n" + (title + "\n" if title else "") + mod.render(results[name]), flush=True)
    os.makedirs("bench/results", exist_ok=True)
    path = f"bench/results/{time.strftime('%Y%m%d-%H%M%S')}"
    with open(path + ".json.tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(path + ".json.tmp", path + ".json")
    print(f"\nresults written to {path}.json")
    try:
        from bench.chart import draw
        if draw(results, path + ".png"):
            print(f"chart written to {path}.png")
    except ImportError:
        print("no chart: matplotlib is not installed (pip install -e '.[bench]')")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
