"""One thread each, CPU time: tessera eager, tessera nn.Graph and PyTorch eager on the
training workloads of ``bench.training`` and ResNet-18 inference at batch 1.

Wall times on a shared host move with whatever else runs there (a 2-core host busy with
other jobs gives 2-6x slower and uneven wall times). A step's
CPU time, with every framework held to one thread (BLAS included) so that all its work is
on the calling thread, does not count the time spent waiting for a core: it measures the
work each framework does, the frameworks interleaved in one process, 3 steps each per
round. It leaves out what threads add or lose (the other sections measure that).

A second table times inference graphs (LeNet-5, the ``cnn`` workload's model, ResNet-18)
compiled with the blocked layout (``TESSERA_NCHWC=1``) and without (``=0``), the two
interleaved likewise: where the ``nchwc`` pass's default pays.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

WORKLOADS = ("mlp", "cnn", "transformer", "resnet18 b1")
# inference graphs with the blocked layout (TESSERA_NCHWC=1) against without (=0): the
# nchwc pass's auto rule (tessera/graph/passes/nchwc.py) comes from these
NCHWC = ("lenet5 b1", "lenet5 b64", "cnn b1", "cnn b64", "resnet18 b1")
ROUNDS = 6


def _nchwc_model(workload: str):
    import numpy as np

    import tessera
    import tessera.models as tm
    from bench.training import cnn
    name, batch = workload.split()
    n = int(batch[1:])
    tessera.manual_seed(0)
    model = tm.lenet5() if name == "lenet5" else cnn(tessera) if name == "cnn" else \
        tm.resnet18()
    shape = (n, 3, 224, 224) if name == "resnet18" else (n, 1, 28, 28)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return model.eval(), tessera.from_numpy(x)


def nchwc_child(workload: str) -> dict:
    """One model's inference graph compiled blocked and plain, timed interleaved."""
    import tessera
    from bench.models import _inference_graph
    tessera.set_num_threads(1)
    model, x = _nchwc_model(workload)
    steps = {}
    for mode, key in (("1", "blocked"), ("0", "plain")):
        os.environ["TESSERA_NCHWC"] = mode   # read when the graph compiles (its first call)
        g = _inference_graph(tessera, model)
        g(x)
        steps[key] = (lambda g=g: g(x))
    for f in steps.values():
        f()
    times: dict = {k: [] for k in steps}
    for _ in range(ROUNDS):
        for k, f in steps.items():
            for _ in range(3):
                t0 = time.thread_time()
                f()
                times[k].append((time.thread_time() - t0) * 1000)
    return {k: statistics.median(v) for k, v in times.items()}


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
    for w in WORKLOADS + tuple(f"nchwc {w}" for w in NCHWC):
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
    out, blocked = [], []
    for r in rows:
        if r["workload"].startswith("nchwc "):
            w = r["workload"][6:]
            blocked.append((w, "-", "-", r["error"]) if "error" in r else
                           (w, f"{r['blocked']:.2f}", f"{r['plain']:.2f}",
                            f"{r['blocked'] / r['plain']:.2f}x"))
        elif "error" in r:
            out.append((r["workload"], "-", "-", "-", "-", r["error"]))
        else:
            t, g, p = r["tessera"], r["graph"], r["torch"]
            out.append((r["workload"], f"{t:.1f}", f"{g:.1f}", f"{p:.1f}", f"{t / p:.2f}x",
                        f"{g / p:.2f}x"))
    text = table(out, ("workload", "eager ms", "graph ms", "torch ms", "eager/torch",
                       "graph/torch"))
    if blocked:
        text += ("\n\nInference graphs in the blocked layout (TESSERA_NCHWC=1) and without "
                 "(=0), CPU time per call, interleaved likewise\n\n" +
                 table(blocked, ("model", "blocked ms", "plain ms", "blocked/plain")))
    return text


TITLE = ("CPU time per step, one thread each (BLAS included), interleaved in one process "
         f"({ROUNDS} rounds x 3 steps, medians): the work done, whatever the machine's load")

if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        import json
        w = sys.argv[2]
        print(json.dumps(nchwc_child(w[6:]) if w.startswith("nchwc ") else child(w)))
