"""gemm: tessera's own float32 GEMM (``tessera.kernels.gemm``) against NumPy's BLAS.

Cases: 2048^3 (``a @ b``), and the products of batch-1 inference as a linear layer runs
them, ``x @ W.T`` with W of shape (out, in): ResNet-18's 3x3 convolutions as im2col GEMMs
(one per stage), MiniLM's at sequence length 128 (attention projections, FFN up and down)
and the MLP's first layer (batch 256, and batch 1: a matrix-vector product), and the
products of one row (ResNet-18's classifier, MiniLM's FFN and attention projections on
one token: the last the smallest that tessera's GEMV splits over threads), and products of
a few rows more than the GEMV takes (ViT-Tiny's attention projection at image size 32: a
class token and four patches; LeNet-5's first linear layer at batch 8).
tessera runs each unpacked (``gemm``: W^T packed within each call, as for any two
matrices) and with W packed once beforehand (``gemm_packed``, as inference weights are).

Each framework runs in its own process at 1 and 2 threads, both processes alive at once
and timed in turn, a few milliseconds at a time (NumPy, tessera, tessera packed, NumPy,
...), so that load coming and going on a shared host weighs on each alike. GFLOP/s are
medians of the timings; the ratios are medians of the ratios of timings taken side by
side; "spread" is the interquartile range of the timings over their median, the largest
of the three: how noisy the host was.
Target: tessera at least 90% of NumPy at 2048^3, at least equal with packed weights on the
inference shapes.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

CASES = [  # (name, M, N, K, W stored as (N, K) and used transposed)
    ("square 2048", 2048, 2048, 2048, False),
    ("resnet18 conv2 3x3", 3136, 64, 576, True),
    ("resnet18 conv3 3x3", 784, 128, 1152, True),
    ("resnet18 conv4 3x3", 196, 256, 2304, True),
    ("resnet18 conv5 3x3", 49, 512, 4608, True),
    ("minilm qkv/out", 128, 384, 384, True),
    ("minilm ffn up", 128, 1536, 384, True),
    ("minilm ffn down", 128, 384, 1536, True),
    ("mlp fc1", 256, 1024, 784, True),
    ("mlp fc1 batch 1", 1, 1024, 784, True),
    ("resnet18 fc batch 1", 1, 1000, 512, True),
    ("minilm ffn up row", 1, 1536, 384, True),
    ("minilm ffn down row", 1, 384, 1536, True),
    ("minilm qkv/out row", 1, 384, 384, True),
    ("mlp fc1 batch 2", 2, 1024, 784, True),
    ("vit_tiny qkv 5 rows", 5, 576, 192, True),
    ("lenet5 fc1 batch 8", 8, 120, 400, True),
]
THREADS = (1, 2)
SAMPLE_S = 0.003     # one timing: as many calls as take about this long
SAMPLES = 41         # timings per variant and case (times TESSERA_BENCH_ROUNDS)


def _operands(m: int, n: int, k: int, transposed: bool):
    import numpy as np
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float32)
    return a, w


def _variants(framework: str, a, w, transposed: bool, threads: int) -> dict:
    if framework == "numpy":
        return {"numpy": (lambda: a @ w.T) if transposed else (lambda: a @ w)}
    from tessera.kernels import gemm
    packed = gemm.pack_b(w, trans_b=transposed)
    return {"tessera": lambda: gemm.gemm(a, w, trans_b=transposed, threads=threads),
            "packed": lambda: gemm.gemm_packed(a, packed, threads=threads)}


def child(framework: str, threads: int) -> None:
    """Serve timings on stdin/stdout: a line ``case variant loops`` gets back the seconds
    per call of ``loops`` calls (the parent alternates the processes call by call)."""
    if framework == "numpy":
        from threadpoolctl import threadpool_limits
        threadpool_limits(threads)
    else:
        import tessera
        tessera.set_num_threads(threads)   # starts the kernel threads
    fns: dict = {}
    print("ready", flush=True)
    for line in sys.stdin:
        case, variant, loops = line.split("\t")
        if case not in fns:
            fns.clear()   # one case's operands at a time
            _, m, n, k, transposed = next(c for c in CASES if c[0] == case)
            a, w = _operands(m, n, k, transposed)
            fns[case] = _variants(framework, a, w, transposed, threads)
        fn = fns[case][variant]
        t0 = time.perf_counter()
        for _ in range(int(loops)):
            fn()
        print((time.perf_counter() - t0) / int(loops), flush=True)


class _Child:
    """One framework's process at one thread count, timing on request."""

    def __init__(self, framework: str, threads: int):
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.gemm", "--child", framework,
                                      str(threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"gemm benchmark: the {framework} process did not start")

    def time(self, case: str, variant: str, loops: int) -> float:
        self.proc.stdin.write(f"{case}\t{variant}\t{loops}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"gemm benchmark: a process died on {case} ({variant})")
        return float(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _check() -> None:
    """tessera agrees with NumPy on every case (a benchmark of wrong answers is void)."""
    import numpy as np

    from tessera.kernels import gemm
    for name, m, n, k, transposed in CASES:
        a, w = _operands(m, n, k, transposed)
        ref = a.astype(np.float64) @ (w.T if transposed else w).astype(np.float64)
        tol = (k + 8) * 2.0 ** -24 * (np.abs(a).astype(np.float64)
                                      @ np.abs(w.T if transposed else w).astype(np.float64))
        for got in (gemm.gemm(a, w, trans_b=transposed),
                    gemm.gemm_packed(a, gemm.pack_b(w, trans_b=transposed))):
            if not np.all(np.abs(got - ref) <= tol):
                raise AssertionError(f"gemm benchmark: tessera and NumPy disagree on {name}")


def _case(children: dict, name: str, m: int, n: int, k: int, n_samples: int) -> dict:
    """The timings of one case at one thread count, the variants alternating call by call:
    {variant: [seconds per call]}, and the per-sample ratios to NumPy."""
    plan = [("numpy", "numpy"), ("tessera", "tessera"), ("tessera", "packed")]
    loops = {}
    for fw, v in plan:   # warm up, then as many calls per timing as take SAMPLE_S
        children[fw].time(name, v, 1)
        loops[v] = max(1, int(SAMPLE_S / max(children[fw].time(name, v, 1), 1e-7)))
    times: dict = {v: [] for _, v in plan}
    for _ in range(n_samples):
        for fw, v in plan:
            times[v].append(children[fw].time(name, v, loops[v]))
    return times


def run() -> list[dict]:
    from bench.common import rounds
    from tessera.kernels import gemm
    if not gemm.available():
        raise RuntimeError("gemm benchmark: no C compiler (or TESSERA_CODEGEN=0)")
    _check()
    n_samples = SAMPLES * max(1, rounds())
    rows = []
    for threads in THREADS:
        children = {fw: _Child(fw, threads) for fw in ("numpy", "tessera")}
        try:
            for name, m, n, k, _ in CASES:
                load = os.getloadavg()[0]
                times = _case(children, name, m, n, k, n_samples)
                row = {"case": name, "m": m, "n": n, "k": k, "threads": threads,
                       "isa": gemm.isa(), "load_avg": load, "samples": n_samples}
                spreads = []
                for v, ts in times.items():
                    med = statistics.median(ts)
                    q = statistics.quantiles(ts, n=4)
                    row[f"{v}_gflops"] = 2 * m * n * k / med / 1e9
                    spreads.append((q[2] - q[0]) / med)
                for v in ("tessera", "packed"):   # timings side by side: their ratio's median
                    row[f"{v}_vs_numpy"] = statistics.median(
                        x / y for x, y in zip(times["numpy"], times[v]))
                row["spread"] = max(spreads)
                rows.append(row)
        finally:
            for c in children.values():
                c.close()
    return rows


def render(rows: list[dict]) -> str:
    from bench.common import table
    text = table([(r["case"], f"{r['m']}x{r['n']}x{r['k']}", r["threads"],
                   f"{r['numpy_gflops']:.1f}", f"{r['tessera_gflops']:.1f}",
                   f"{r['packed_gflops']:.1f}", f"{r['tessera_vs_numpy']:.2f}x",
                   f"{r['packed_vs_numpy']:.2f}x", f"{100 * r['spread']:.0f}%")
                  for r in rows],
                 ("case", "MxNxK", "threads", "numpy GFLOP/s", "tessera", "packed",
                  "tessera/numpy", "packed/numpy", "spread"))
    if rows:
        loads = [r["load_avg"] for r in rows]
        text += (f"\n\nmicro-kernel: {rows[0]['isa']}; {rows[0]['samples']} timings of each; "
                 f"host load average {min(loads):.1f}-{max(loads):.1f} during the run")
    return text


TITLE = ("gemm, float32 GFLOP/s (median; ratio > 1: tessera faster; target >= 0.9x at "
         "2048^3 and >= 1x packed on the inference shapes)")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
    else:
        print(TITLE)
        print(render(run()))
