"""``python -m bench``: every benchmark, side by side with PyTorch, in one run.

Run through ``make bench``, which unsets OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE for this
command only (they halve NumPy's SGEMM on this machine).
"""
from __future__ import annotations

import json
import os
import sys
import time

from bench import demo, models, overhead, training
from bench.common import environment


def main() -> int:
    print(f"# tessera benchmarks, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"# {environment()}")
    import torch
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads")
    results = {"overhead": overhead.run()}
    overhead_rows = results["overhead"]
    from bench.common import table
    print("\nEager per-call overhead (median of 7; target ratio <= 3)")
    print(table([(r["case"], f"{r['tessera_us']:.2f}", f"{r['torch_us']:.2f}",
                  f"{r['ratio']:.2f}x") for r in overhead_rows],
                ("case", "tessera us", "torch us", "ratio")))
    results["training"] = training.run()
    print("\nTraining step: tessera eager, tessera nn.Graph, PyTorch eager (median of 10 "
          "after 2 warm-up; targets: eager/torch <= 1.5, graph faster than eager)")
    print(training.render(results["training"]))
    results["demo"] = demo.run()
    print("\n" + demo.render(results["demo"]))
    results["models"] = models.run()
    print("\nModel zoo (median ms of 5 after a warm-up)")
    print(models.render(results["models"]))
    os.makedirs("bench/results", exist_ok=True)
    path = f"bench/results/{time.strftime('%Y%m%d-%H%M%S')}.json"
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(path + ".tmp", path)
    print(f"\nresults written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
