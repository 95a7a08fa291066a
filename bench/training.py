"""Training-step workloads, tessera eager and nn.Graph against PyTorch eager, torch.compile
and JAX, in one run.

- MLP 784-1024-1024-10, batch 256, SGD with momentum
- small CNN on 1x28x28 (conv 32, conv 64, pool, fc 128, fc 10), batch 64, Adam
- Transformer encoder layer (d_model 256, 4 heads, seq 128, batch 16, GELU FFN 1024), AdamW

Each (framework, workload) runs in its own subprocess, the frameworks one after another in
rounds (``TESSERA_BENCH_ROUNDS``): a row reports each framework's median round and the median
over rounds of graph / the best peer within the round. Peak memory is measured per process: the
peak RSS over the run minus the RSS once model, optimizer and data exist (what training adds:
gradients, optimizer state, activations, workspaces; for a graph also its tracing and compile).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

WORKLOADS = ("mlp", "cnn", "transformer")
FRAMEWORKS = ("tessera", "graph", "torch", "torch.compile", "jax")
PEERS = ("torch", "torch.compile", "jax")


def cnn(lib):
    """The ``cnn`` workload's model (28x28 single-channel images, 10 classes)."""
    nn, F = lib.nn, lib.nn.functional

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(1, 32, 3, padding=1)
            self.c2 = nn.Conv2d(32, 64, 3, padding=1)
            self.f1 = nn.Linear(64 * 14 * 14, 128)
            self.f2 = nn.Linear(128, 10)

        def forward(self, t):
            t = F.relu(self.c2(F.relu(self.c1(t))))
            t = F.max_pool2d(t, 2).flatten(1)
            return self.f2(F.relu(self.f1(t)))
    return CNN()


def build(lib, name, graph: bool = False, compiled: bool = False):
    """A zero-argument training step of workload ``name`` for ``lib`` (tessera or torch):
    eager, as an nn.Graph (``graph``), or with ``torch.compile`` on the model (``compiled``).
    """
    nn = lib.nn
    lib.manual_seed(0)
    if name == "mlp":
        model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 10))
        x, y = lib.randn(256, 784), lib.randint(0, 10, (256,))
        opt = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
    elif name == "cnn":
        model = cnn(lib)
        x, y = lib.randn(64, 1, 28, 28), lib.randint(0, 10, (64,))
        opt = lib.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = nn.CrossEntropyLoss()
    else:
        model = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0,
                                           activation="gelu", batch_first=True)
        x, y = lib.randn(16, 128, 256), lib.randn(16, 128, 256)
        opt = lib.optim.AdamW(model.parameters(), lr=1e-4)
        loss_fn = nn.MSELoss()

    if graph:
        return _graph_step(lib, model, loss_fn, opt, x, y)
    if compiled:
        model = lib.compile(model)

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def _graph_step(lib, model, loss_fn, opt, x, y):
    class TrainGraph(lib.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model, self.loss_fn = model, loss_fn
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
            return loss
    g = TrainGraph()

    def step():
        return g(x, y)
    step.graph, step.inputs = g, (x, y)
    return step


def _maxrss_mb() -> float:
    """Peak resident memory of this process. Linux's VmHWM belongs to the address space,
    which exec replaces; ru_maxrss survives exec, so after a fork it starts at the
    parent's size."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mb() -> float:
    """Resident memory now (Linux /proc; falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except OSError:
        return _maxrss_mb()


def child(framework: str, name: str, steps: int) -> dict:
    if framework == "jax":
        from bench.jax_models import train_step
        step = train_step(name)
    else:
        if framework.startswith("torch"):
            import torch as lib
        else:
            import tessera as lib
        step = build(lib, name, graph=framework == "graph",
                     compiled=framework == "torch.compile")
    base = _rss_mb()  # model, optimizer and data built; no step taken yet
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    step()  # a graph traces twice: the first step creates the optimizer state
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000)
    out = {"ms": statistics.median(times), "peak_mb": _maxrss_mb() - base,
           "threads": _threads(framework), "first_s": first}
    if framework == "torch":
        out["gemm_share"] = _torch_gemm_share(step, steps)
    g = getattr(step, "graph", None)
    if g is not None:
        out["memory"] = g.memory_stats()
        # where a graph step's time goes: its BLAS and convolution kernels against the rest
        t0 = time.perf_counter()
        out["op_ms"] = {k: v * 1000 for k, v in g.profile(*step.inputs, steps=steps).items()}
        out["profiled_ms"] = (time.perf_counter() - t0) / steps * 1000   # a mean, not a median
    return out


# PyTorch's matrix-product kernels: its linear layers and attention's batched products
# (its fused attention kernels, which hold their own products, are not counted)
_TORCH_GEMMS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})


def _torch_gemm_share(step, steps: int) -> float:
    """The fraction of PyTorch's step spent in its matrix products (torch.profiler, over
    ``steps`` more steps): what a framework running the same products at the same speed,
    and nothing else, would take of PyTorch's time."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - t0
    gemm_us = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in _TORCH_GEMMS)
    return gemm_us / 1e6 / wall


def _threads(framework: str) -> int:
    if framework == "jax":
        return os.cpu_count() or 1  # XLA's CPU client: one intra-op thread per core
    if framework.startswith("torch"):
        import torch
        return torch.get_num_threads()
    try:
        from threadpoolctl import threadpool_info
        return max((i["num_threads"] for i in threadpool_info()), default=1)
    except ImportError:
        return os.cpu_count() or 1


def run(steps: int = 10) -> list[dict]:
    from bench.common import rounds, run_children
    rows = []
    for name in WORKLOADS:  # frameworks interleaved over TESSERA_BENCH_ROUNDS (3) rounds
        res = run_children({fw: [sys.executable, "-m", "bench.training", "--child", fw, name,
                                 str(steps)] for fw in FRAMEWORKS}, rounds(3))
        rows.append({"workload": name, **res})
    return rows


def render(rows) -> str:
    from bench.common import round_ratio, table
    from bench.isa import cap, compared, label, uncapped
    out, notes = [], []
    # under an instruction-set cap, the peers that ignore it are shown but not compared
    peers = compared(PEERS)

    def ms(r, fw):
        return f"{r[fw]['ms']:.1f}" if "ms" in r[fw] else "-"
    for r in rows:
        for fw in FRAMEWORKS:
            if "error" in r[fw]:
                notes.append(f"{r['workload']} {fw}: {r[fw]['error'][:90]}")
        t, g, p = r["tessera"], r["graph"], r["torch"]
        if not all("ms" in x for x in (t, g, p)):
            out.append((r["workload"], *(ms(r, fw) for fw in FRAMEWORKS)) + ("-",) * 5)
            continue
        best = round_ratio(r, "graph", peers)
        mem = g.get("memory", {})
        out.append((r["workload"], *(ms(r, fw) for fw in FRAMEWORKS),
                    f"{t['ms'] / p['ms']:.2f}x", f"{g['ms'] / p['ms']:.2f}x",
                    f"{best[0]:.2f}x ({best[1]})" if best else "-",
                    f"{t['peak_mb']:.0f} / {g['peak_mb']:.0f} / {p['peak_mb']:.0f}",
                    f"{mem.get('intermediate_bytes_peak', 0) / 2**20:.0f} / "
                    f"{mem.get('intermediate_bytes_naive', 0) / 2**20:.0f}"))
    for r in rows:  # the part of a graph step no elementwise fusion can shorten
        g, p = r["graph"], r["torch"]
        if "op_ms" in g and "ms" in p and g.get("profiled_ms"):
            ops = g["op_ms"]
            gemm = sum(v for k, v in ops.items() if k in ("matmul", "conv"))
            share = gemm / g["profiled_ms"]   # of the same (profiled) steps' mean time
            notes.append(f"{r['workload']} graph: matmul and convolution kernels "
                         f"{share:.0%} of a step, the other kernels "
                         f"{(sum(ops.values()) - gemm) / g['profiled_ms']:.0%} (timed one by "
                         f"one over {g['profiled_ms']:.1f} ms steps); at the median step "
                         f"the first alone are {share * g['ms'] / p['ms']:.2f}x torch's step")
    for r in rows:  # the same bound on PyTorch's side: the ratio its own GEMMs set
        if "gemm_share" in r["torch"]:
            notes.append(f"{r['workload']} torch: its matrix products (aten::mm, addmm, bmm, "
                         f"baddbmm) {r['torch']['gemm_share']:.0%} of its step "
                         f"(torch.profiler): the same products at the same speed and nothing "
                         f"else would be {r['torch']['gemm_share']:.2f}x torch's step")
    threads = ", ".join(f"{fw} {rows[0][fw].get('threads', '?')}" for fw in FRAMEWORKS)
    n_rounds = max((len(r["graph"].get("rounds_ms", [])) for r in rows), default=0)
    notes.insert(0, f"{n_rounds} round(s); graph/best peer: the median over rounds of graph / "
                    f"the fastest of {', '.join(peers)} in the same round, and the peer "
                    "fastest most often")
    if cap() is not None and any(p in FRAMEWORKS for p in uncapped()):
        notes.insert(1, f"capped to {cap().upper()}: "
                        + "; ".join(f"{p} is not ({why})" for p, why in uncapped().items()
                                    if p in FRAMEWORKS)
                        + ", so its column ran AVX-512 kernels and the best-peer ratio leaves "
                          "it out")
    return (table(out, ("workload", "eager ms", "graph ms", "torch ms", "t.compile ms",
                        label("jax ms", "jax"), "eager/torch", "graph/torch", "graph/best peer",
                        "peak MB e/g/t", "plan MB peak/naive"))
            + f"\n  threads: {threads}" + "".join(f"\n  {n}" for n in notes))


TITLE = ("Training step (median of 10 after 2 warm-up, the median round; one process per "
         "framework and round, frameworks alternating; targets: eager/torch <= 1.2, "
         "graph/best peer <= 1.0, aim 0.8)")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        print(TITLE)
        print(render(run()))
