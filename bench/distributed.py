"""Data-parallel scaling on one host: samples/s of the training workloads of
bench/training.py (MLP 784-1024-1024-10 batch 256 SGD+momentum; Transformer encoder layer
d_model 256, 4 heads, seq 128, batch 16, GELU FFN 1024, AdamW) at 1 rank x 2 threads
against 2 ranks x 1 thread on the same global batch, each started through the launcher
(``python -m tessera.distributed.launch``, which runs ``mpiexec``).

Three data-parallel forms run on 2 ranks: ``DistributedDataParallel`` (local tensors,
bucketed gradient all-reduce; ``gradient_as_bucket_view``, buckets in shared memory, which
the all-reduce sums directly); global tensors (``model.to_global(p, broadcast)``, batch
``split(0)``, the partial_sum gradients of the broadcast parameters summed in backward by
one all-reduce of a shared-memory bucket, as DDP's, the optimizer then local); and global
tensors with ZeRO stage 2 (``parameters_as_bucket_view``: parameters and gradients in
flat shared-memory buckets; the gradients reduce-scattered in place once backward has made
the last, the optimizer on split shards that are views of the parameters' rows, the rows
all-gathered in place).

The same two global forms also run compiled, as an ``nn.Graph`` of the training step
(``graph global``; ``graph global+zero2`` with ``config.enable_zero(stage=2)``); their
``vs 1 rank`` is against the compiled step on one rank x 2 threads (``graph``).

A fourth 2-rank row, ``no-comm``, trains each rank on its share of the batch and exchanges
nothing: the step time no data-parallel form can beat on these cores (half the GEMMs on
one thread each, the whole optimizer on every rank), so the distance from ``single`` to
``no-comm`` is the compute bound and the distance from ``no-comm`` to ``ddp`` is what
communication costs (``graph no-comm`` the same for the compiled step); a note gives one
in-place all-reduce of the gradients alone.

Communication is counted per rank per step at the communicator: the bytes each collective
sends under the ring algorithms (all-reduce 2(n-1)/n of the buffer, all-gather and
reduce-scatter (n-1)/n of the whole, all-to-all the chunks for other ranks), printed beside
the minimum for data parallelism, one ring all-reduce of the gradients: 2(n-1)/n x
gradient bytes.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORKLOADS = ("mlp", "transformer")
# (mode, ranks, threads per rank); "no-comm" trains each rank on its share of the batch with
# no gradient exchange at all: the bound any data-parallel form can reach on these cores
CONFIGS = (("single", 1, 2), ("no-comm", 2, 1), ("ddp", 2, 1), ("global", 2, 1),
           ("global+zero2", 2, 1), ("graph", 1, 2), ("graph no-comm", 2, 1),
           ("graph global", 2, 1), ("graph global+zero2", 2, 1))
# the compiled rows are measured against the compiled step on one rank
BASELINE = {"graph no-comm": "graph", "graph global": "graph", "graph global+zero2": "graph"}
LOCAL = ("ddp", "no-comm", "graph no-comm")  # each rank trains on its share of the batch
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _build(name: str, n: int):
    """(model, loss_fn, optimizer factory, global x, global y) of workload ``name``."""
    import tessera as lib
    nn = lib.nn
    lib.manual_seed(0)
    if name == "mlp":
        model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 10))
        x, y = lib.randn(256, 784), lib.randint(0, 10, (256,))
        return model, nn.CrossEntropyLoss(), \
            (lambda ps: lib.optim.SGD(ps, lr=0.01, momentum=0.9)), x, y
    model = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0,
                                       activation="gelu", batch_first=True)
    x, y = lib.randn(16, 128, 256), lib.randn(16, 128, 256)
    return model, nn.MSELoss(), (lambda ps: lib.optim.AdamW(ps, lr=1e-4)), x, y


class _Counter:
    """Ring-algorithm bytes sent by this rank, counted at the communicator."""

    def __init__(self, comm):
        self.bytes = 0.0
        n = comm.world_size
        f = (n - 1) / n
        rules = {
            "all_reduce": lambda x, *a, **k: 2 * f * x.nbytes,
            "iall_reduce": lambda x, *a, **k: 2 * f * x.nbytes,
            "iall_reduce_": lambda x, *a, **k: 2 * f * x.nbytes,
            "all_gather": lambda x, *a, **k: (n - 1) * x.nbytes,
            # ZeRO's flat buckets: the ranges of every member (a reduce-scatter), this
            # rank's ranges to every other (an all-gather)
            "reduce_scatter_ranges_": lambda buf, ranges, *a, **k: f * buf.itemsize * sum(
                hi - lo for rs in ranges for lo, hi in rs),
            "all_gather_ranges_": lambda buf, ranges, *a, **k: (n - 1) * buf.itemsize * sum(
                hi - lo for lo, hi in ranges[comm.rank]),
            "reduce_scatter": lambda chunks, *a, **k: f * sum(c.nbytes for c in chunks),
            "all_to_all": lambda chunks, *a, **k: sum(c.nbytes for c in chunks) * f,
            "broadcast": lambda x, *a, **k: f * x.nbytes,
            "send": lambda x, *a, **k: x.nbytes,
        }
        rules["all_gather_object"] = lambda *a, **k: 0.0  # metadata (the slowest rank)
        self.depth = 0  # only the outermost call counts (all_reduce waits on iall_reduce)
        for name, rule in rules.items():
            orig = getattr(comm, name)

            def wrapped(*a, _orig=orig, _rule=rule, **k):
                if self.depth == 0:
                    self.bytes += _rule(*a, **k)
                self.depth += 1
                try:
                    return _orig(*a, **k)
                finally:
                    self.depth -= 1
            setattr(comm, name, wrapped)


def child(name: str, mode: str, steps: int) -> dict | None:
    """One rank's run; rank 0 returns the figures."""
    import tessera
    import tessera.distributed as dist
    from tessera.distributed import comm as C
    n, rank = dist.get_world_size(), dist.get_rank()
    model, loss_fn, make_opt, x, y = _build(name, n)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if mode in LOCAL:
        if mode == "ddp":
            from tessera.nn.parallel import DistributedDataParallel as DDP
            # PyTorch's option for speed: each gradient goes straight into its bucket (one
            # copy instead of two) and .grad stays the bucket's memory (no copy back)
            model = DDP(model, gradient_as_bucket_view=True)
        per = x.shape[0] // n
        x, y = x[rank * per:(rank + 1) * per].clone(), y[rank * per:(rank + 1) * per].clone()
    elif "global" in mode:
        p = tessera.placement("cpu", list(range(n)))
        model.to_global(p, tessera.sbp.broadcast)
        x = x.to_global(p, tessera.sbp.broadcast).to_global(sbp=tessera.sbp.split(0))
        y = y.to_global(p, tessera.sbp.broadcast).to_global(sbp=tessera.sbp.split(0))
    if mode == "global+zero2":
        from tessera.distributed.optim import ZeroRedundancyOptimizer
        # PyTorch's option for speed, as DDP's gradient_as_bucket_view above: parameters and
        # gradients in flat buckets, both collectives on them in place
        opt = ZeroRedundancyOptimizer(model.parameters(), lambda ps: make_opt(ps), stage=2,
                                      parameters_as_bucket_view=True)
    else:
        opt = make_opt(model.parameters())
    counter = _Counter(C.current())
    if mode.startswith("graph"):
        step = _graph_step(model, loss_fn, opt, x, y, zero=mode.endswith("zero2"))
    else:
        def step():
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
    for _ in range(2):  # warm-up: kernels compiled, optimizer state made
        step()
    dist.barrier()
    counter.bytes = 0.0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    comm_bytes = counter.bytes / steps
    allreduce_ms = _allreduce_ms(grad_bytes // 4) if mode == "ddp" else None
    if n > 1:  # the slowest rank sets the pace
        times = [max(v) for v in zip(*C.current().all_gather_object(times))]
    if rank != 0:
        return None
    ms = statistics.median(times) * 1000
    local = mode in LOCAL
    return {"ms": ms, "samples_s": x.shape[0] * (n if local else 1) / ms * 1000,
            "comm_bytes": comm_bytes, "grad_bytes": grad_bytes, "ranks": n,
            "min_bytes": 2 * (n - 1) / n * grad_bytes, "allreduce_ms": allreduce_ms}


def _graph_step(model, loss_fn, opt, x, y, zero: bool):
    """The training step as an ``nn.Graph`` (as bench/training.py's ``graph`` mode), with
    ZeRO stage 2 (``config.enable_zero``) when ``zero``."""
    import tessera

    class TrainGraph(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model, self.loss_fn = model, loss_fn
            self.add_optimizer(opt)
            if zero:
                self.config.enable_zero(True, stage=2)

        def build(self, x, y):
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
            return loss
    g = TrainGraph()
    return lambda: g(x, y)


def _allreduce_ms(count: int, reps: int = 10) -> float:
    """Median time of one in-place all-reduce of ``count`` float32 (the gradients alone), in
    a reduce buffer as DDP's buckets are (shared memory under MPI on one machine)."""
    import numpy as np

    import tessera.distributed as dist
    from tessera.distributed import comm as C
    buf, times = C.current().reduce_buffer(count, np.float32), []
    buf.fill(1)
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        C.current().iall_reduce_(buf).wait()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def _launch(name: str, mode: str, ranks: int, threads: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, "-m", "tessera.distributed.launch", "--nproc-per-node",
               str(ranks), "--threads-per-proc", str(threads), "-m", "bench.distributed",
               "--child", name, mode, str(steps), out]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0 or not os.path.exists(out):
            lines = (proc.stderr or "?").strip().splitlines()
            return {"error": next((ln for ln in reversed(lines) if "Error" in ln),
                                  lines[-1] if lines else "?")}
        with open(out) as f:
            return json.load(f)


def run(steps: int = 10, repeats: int | None = None) -> list[dict]:
    """Each configuration ``repeats`` times (``TESSERA_BENCH_ROUNDS``, default 5),
    interleaved round by round. A configuration's figures are from its median run; its
    ratio to one rank is the median of the ratios within each round, where both ran
    under the same load (the host's other work moves a 2-thread process and two 1-thread
    ones differently, and a lucky fastest run of either side decides a best-of-n ratio)."""
    if repeats is None:
        repeats = max(1, int(os.environ.get("TESSERA_BENCH_ROUNDS", "5")))
    rows = []
    for name in WORKLOADS:
        runs: dict[str, list] = {mode: [] for mode, _, _ in CONFIGS}
        for _ in range(repeats):
            for mode, ranks, threads in CONFIGS:
                runs[mode].append(_launch(name, mode, ranks, threads, steps))
        row = {"workload": name}
        for mode, _, _ in CONFIGS:
            ok = sorted((r for r in runs[mode] if "ms" in r), key=lambda r: r["ms"])
            row[mode] = dict(ok[len(ok) // 2], runs_ms=[r.get("ms") for r in runs[mode]]) \
                if ok else runs[mode][0]
        for mode, _, _ in CONFIGS:
            base = runs[BASELINE.get(mode, "single")]
            ratios = sorted(r["samples_s"] / b["samples_s"] for b, r in zip(base, runs[mode])
                            if "ms" in b and "ms" in r)
            if ratios and "ms" in row[mode]:
                row[mode]["ratio"] = statistics.median(ratios)
                row[mode]["ratio_range"] = (ratios[0], ratios[-1])
        rows.append(row)
    return rows


def render(rows) -> str:
    from bench.common import table
    out, notes = [], []
    for r in rows:
        for mode, ranks, threads in CONFIGS:
            base = r[BASELINE.get(mode, "single")]
            res = r[mode]
            if "error" in res:
                notes.append(f"{r['workload']} {mode}: {res['error'][:100]}")
                out.append((r["workload"], mode, f"{ranks} x {threads}") + ("-",) * 6)
                continue
            lo, hi = res.get("ratio_range", (None, None))
            ratio = f"{res['ratio']:.2f} ({lo:.2f}-{hi:.2f})" if "ratio" in res else \
                f"{res['samples_s'] / base['samples_s']:.2f}" if "samples_s" in base else "-"
            mb = 2 ** 20
            comm = res["comm_bytes"] / mb
            low = res["min_bytes"] / mb
            exchanged = ranks > 1 and "no-comm" not in mode
            out.append((r["workload"], mode, f"{ranks} x {threads}", f"{res['ms']:.1f}",
                        f"{res['samples_s']:.0f}", ratio,
                        f"{comm:.2f}" if exchanged else "-", f"{low:.2f}" if exchanged else "-",
                        f"{res['comm_bytes'] / res['min_bytes']:.2f}" if exchanged else "-"))
            if res.get("allreduce_ms") is not None:
                notes.append(f"{r['workload']}: one in-place all-reduce of the "
                             f"{res['grad_bytes'] / mb:.2f} MB of gradients alone takes "
                             f"{res['allreduce_ms']:.1f} ms")
    return (table(out, ("workload", "data parallel", "ranks x threads", "step ms",
                        "samples/s", "vs 1 rank", "comm MB/step/rank", "ring minimum MB",
                        "comm/minimum"))
            + "".join(f"\n  {n}" for n in notes))


TITLE = ("Data-parallel scaling (same global batch; median of 10 steps after 2 warm-up; the "
         "median run of each configuration, runs interleaved in rounds "
         "(TESSERA_BENCH_ROUNDS, default 5); vs 1 rank: the median (and range) of the "
         "ratios within each round; targets: 2 ranks >= 0.85 x 1 rank, communication at the "
         "ring all-reduce minimum)")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        res = child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        if res is not None:
            with open(sys.argv[5], "w") as f:
                json.dump(res, f)
    else:
        print(TITLE)
        print(render(run()))
