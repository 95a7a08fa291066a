"""One thread each, CPU time: tessera eager, tessera nn.Graph and PyTorch eager on the
training workloads of ``bench.training`` and ResNet-18 inference at batch 1.

Wall times on a shared host move with whatever else runs there (a 2-core host busy with
other jobs gives 2-6x slower and uneven wall times). A step's
CPU time, with every framework held to one thread (BLAS included) so that all its work is
on the calling thread, does not count the time spent waiting for a core: it measures the
work each framework does, the frameworks interleaved in one process, 3 steps each per
round. It leaves out what threads add or lose (the other sections measure that).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

WORKLOADS = ("mlp", "cnn", "transformer", "resnet18 b1")
ROUNDS = 6


def child(workload: str) -> dict:
    import torch

    import tessera
    torch.set_num_threads(1)
    tessera.set_num_threads(1)
    if workload == "resnet18 b1":
        from bench.models import vision
        steps = {fw: vision(fw, "resnet18", 1) for fw in ("tessera", "graph", "torch")}
    else:
        from bench.training import build
        steps = {"tessera": build(tessera, workload), "graph": build(tessera, workload, True),
                 "torch": build(torch, workload)}
    for f in steps.values():
        f()
        f()
    times: dict = {fw: [] for fw in steps}
    for _ in range(ROUNDS):
        for fw, f in steps.items():
            for _ in range(3):
                t0 = time.thread_time()
                f()
                times[fw].append((time.thread_time() - t0) * 1000)
    return {fw: statistics.median(v) for fw, v in times.items()}


def run() -> list[dict]:
    import json
    rows = []
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    for w in WORKLOADS:
        proc = subprocess.run([sys.executable, "-m", "bench.cputime", "--child", w],
                              capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            rows.append({"workload": w, "error": (proc.stderr.strip().splitlines()
                                                  or ["?"])[-1][:90]})
        else:
            rows.append({"workload": w, **json.loads(proc.stdout.strip().splitlines()[-1])})
    return rows


def render(rows) -> str:
    from bench.common import table
    out = []
    for r in rows:
        if "error" in r:
            out.append((r["workload"], "-", "-", "-", "-", r["error"]))
            continue
        t, g, p = r["tessera"], r["graph"], r["torch"]
        out.append((r["workload"], f"{t:.1f}", f"{g:.1f}", f"{p:.1f}", f"{t / p:.2f}x",
                    f"{g / p:.2f}x"))
    return table(out, ("workload", "eager ms", "graph ms", "torch ms", "eager/torch",
                       "graph/torch"))


TITLE = ("CPU time per step, one thread each (BLAS included), interleaved in one process "
         f"({ROUNDS} rounds x 3 steps, medians): the work done, whatever the machine's load")

if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        import json
        print(json.dumps(child(sys.argv[2])))
