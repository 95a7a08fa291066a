"""Compile time of nn.Graph, cold (empty kernel cache) and warm (second process).

For each workload a fresh cache directory is made; the graph is then built and run in two
processes one after the other, both with ``TESSERA_CACHE_DIR`` pointing at it. The first
finds the cache empty and compiles every kernel; the second should find them all.

A graph's compile time = its first calls (a training graph traces twice: the first step
creates the optimizer's state) minus as many steady steps; the C compiler's column is the
time ``tessera.kernels.cc`` spent in ``load()`` summed over the threads that called it
(convolution libraries compile in background threads while a graph traces), so it may
exceed the compile time itself.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORKLOADS = ("chain 16M", "mlp train", "cnn train", "transformer train", "lenet5 b1",
             "resnet18 b1")


def _step(name: str):
    import numpy as np

    import tessera
    if name == "chain 16M":
        from bench.kernels import _inputs, _tessera
        fns, convert, _ = _tessera(graph=True)
        x = convert(_inputs()["chain"][0])
        return lambda: fns["chain"](x), 1
    if name.endswith(" train"):
        from bench.training import build
        return build(tessera, name.split()[0], graph=True), 2
    import tessera.models
    from bench.models import _inference_graph
    lenet = name.startswith("lenet5")
    model = (tessera.models.lenet5() if lenet else tessera.models.resnet18()).eval()
    g = _inference_graph(tessera, model)
    shape = (1, 1, 28, 28) if lenet else (1, 3, 224, 224)
    x = tessera.from_numpy(np.random.default_rng(0).standard_normal(shape, np.float32))
    return lambda: g(x), 1


def child(name: str) -> dict:
    from tessera.kernels import cc
    step, traces = _step(name)
    t0 = time.perf_counter()
    for _ in range(traces):
        step()
    first = time.perf_counter() - t0
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"compile_s": max(0.0, first - traces * statistics.median(times)),
            "cc_s": cc.totals["seconds"], "kernels": cc.totals["loads"],
            "compiled": cc.totals["compiled"]}


def run() -> list[dict]:
    rows = []
    for name in WORKLOADS:
        row = {"workload": name}
        with tempfile.TemporaryDirectory(prefix="tessera-bench-cache-") as cache:
            env = dict(os.environ, TESSERA_CACHE_DIR=cache)
            for phase in ("cold", "warm"):
                proc = subprocess.run([sys.executable, "-m", "bench.compile", "--child", name],
                                      capture_output=True, text=True, env=env, check=False)
                if proc.returncode != 0:
                    lines = proc.stderr.strip().splitlines() or ["?"]
                    row[phase] = {"error": lines[-1][:100]}
                else:
                    row[phase] = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
    return rows


def render(rows: list[dict]) -> str:
    from bench.common import table
    out = []
    for r in rows:
        c, w = r["cold"], r["warm"]
        if "error" in c or "error" in w:
            out.append((r["workload"], (c.get("error") or w.get("error"))[:60]) + ("-",) * 5)
            continue
        out.append((r["workload"], f"{c['compile_s']:.2f}", f"{c['cc_s']:.2f}",
                    f"{c['compiled']}/{c['kernels']}",
                    f"{w['compile_s']:.2f}", f"{w['cc_s']:.2f}",
                    f"{w['compiled']}/{w['kernels']}"))
    return table(out, ("workload", "cold s", "cc s", "built/loaded", "warm s", "cc s",
                       "built/loaded"))


TITLE = ("nn.Graph compile time: a cold kernel cache, then a second process on the warm "
         "cache (s; 'cc' = time in the C compiler summed over threads compiling side by "
         "side, so it can exceed the compile time)")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
    else:
        print(TITLE)
        print(render(run()))
