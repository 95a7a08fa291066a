"""``python -m bench [section ...]``: the benchmarks, side by side with their peers.

Sections: overhead, kernels, gemm, training, small_models, cputime, compile, demo, models,
einsum, distributed, remat, binary, int8, autoparallel, backends, deploy (all by default, in
that order; ``python -m bench.onnx_simplify`` counts ONNX nodes separately).
Prints one table per section and writes the tables, under a header naming the CPU, NumPy's
BLAS and the versions compared, to ``bench/RESULTS.md`` (the sections run; the file's other
sections are kept, marked as an earlier run's); every figure goes to
``bench/results/<time>.json``, with a bar chart of the ratios to PyTorch eager beside it.

Run through ``make bench``, which unsets OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE for this
command only (a core type forced for another CPU can halve NumPy's SGEMM).

``--max-isa avx2`` (or ``TESSERA_BENCH_MAX_ISA=avx2``; ``make bench MAX_ISA=avx2``) caps
every framework to AVX2 (``bench/isa.py``), and the header says so.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time

from bench import isa
from bench.common import _cpu_model, describe, environment, write_results

RESULTS_MD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")

SECTIONS = ("overhead", "kernels", "gemm", "training", "small_models", "cputime", "compile",
            "demo", "models", "einsum", "distributed", "remat", "binary", "int8",
            "autoparallel", "backends", "deploy")


def _module(name: str):
    try:
        return importlib.import_module(f"bench.{name}")
    except ImportError as e:  # a section whose module is not in this checkout
        if e.name == f"bench.{name}":
            return None
        raise


def _max_isa(argv: list[str]) -> tuple[str | None, list[str]]:
    """``--max-isa NAME`` (or ``--max-isa=NAME``) out of ``argv``: (NAME or None, the rest)."""
    rest, name = [], None
    it = iter(argv)
    for a in it:
        if a == "--max-isa":
            name = next(it, "")
        elif a.startswith("--max-isa="):
            name = a.partition("=")[2]
        else:
            rest.append(a)
    return name, rest


def main(argv: list[str]) -> int:
    name, argv = _max_isa(argv)
    if name is not None and name != isa.cap():
        if name not in isa.CAPS:
            print(f"python -m bench: --max-isa {name!r}: expected one of {isa.CAPS}",
                  file=sys.stderr)
            return 2
        # NumPy and tessera are loaded already (bench/__init__.py): start again capped
        os.environ[isa.VARIABLE] = name
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-m", "bench", *argv])
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
    header = describe() + [f"threads: {torch.get_num_threads()} per framework; "
                           "TESSERA_BENCH_ROUNDS="
                           f"{os.environ.get('TESSERA_BENCH_ROUNDS', '(unset)')}"]
    capped = isa.header_line(_cpu_model())
    if capped is not None:
        header.insert(1, capped)
        print(f"# {capped}")
    results = {"environment": environment(), "date": time.strftime("%Y-%m-%d %H:%M"),
               "host": header, "max_isa": isa.cap()}
    tables = []
    for name in chosen:
        mod = _module(name)
        if mod is None:
            continue
        results[name] = mod.run()
        title = getattr(mod, "TITLE", None)
        text = mod.render(results[name])
        tables.append((name, title, text))
        print("\n" + (title + "\n" if title else "") + text, flush=True)
    if tables:
        write_results(RESULTS_MD, tables, header, tuple(SECTIONS))
        print(f"\ntables written to {os.path.relpath(RESULTS_MD)}")
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
