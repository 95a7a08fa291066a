"""The physical limits and one fused chain, for every framework in one run.

- SGEMM 2048^3: GFLOP/s (2 n^3 flops per call);
- STREAM-like triad ``a = b + s*c`` on 16M float32: GB/s counting 12 bytes per element
  (read b, read c, write a), the least traffic any implementation can have;
- the chain ``y = gelu(x*a + b) * sigmoid(x)`` (exact, erf GELU) on 16M float32: ms, and
  GB/s counting 8 bytes per element (read x, write y). A framework that fuses the chain
  into one loop approaches the triad's bandwidth; one that writes every intermediate
  moves ~6x more memory.

Every framework runs in its own subprocess (their thread pools never meet) on the same
inputs (NumPy, seed 0), timing the median of ``REPEAT`` calls after warm-up. Frameworks
that are not installed or do not work on the host (torch.compile needs a C++
toolchain; JAX is an optional extra) print "-" and the reason.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time

FRAMEWORKS = ("numpy", "tessera", "graph", "torch", "torch.compile", "jax")
N_GEMM, N_STREAM, REPEAT = 2048, 1 << 24, 10
A, B, S = 1.5, 0.25, 3.0  # the chain's and the triad's scalars


def _inputs():
    import numpy as np
    rng = np.random.default_rng(0)
    f32 = np.float32
    return {"gemm": (rng.standard_normal((N_GEMM, N_GEMM), f32),
                     rng.standard_normal((N_GEMM, N_GEMM), f32)),
            "triad": (rng.standard_normal(N_STREAM, f32), rng.standard_normal(N_STREAM, f32)),
            "chain": (rng.standard_normal(N_STREAM, f32),)}


def _numpy():
    import numpy as np
    from scipy.special import erf

    def chain(x):
        h = x * np.float32(A) + np.float32(B)
        g = np.float32(0.5) * h * (np.float32(1) + erf(h * np.float32(1 / math.sqrt(2))))
        return g / (np.float32(1) + np.exp(-x))
    return {"gemm": np.matmul, "triad": lambda b, c: b + np.float32(S) * c,
            "chain": chain}, (lambda a: a), None


def _tessera(graph: bool):
    import tessera
    F = tessera.nn.functional

    def chain(x):
        return F.gelu(x * A + B) * tessera.sigmoid(x)
    fns = {"gemm": tessera.matmul, "triad": lambda b, c: b + S * c, "chain": chain}
    if graph:
        def compiled(fn):
            class G(tessera.nn.Graph):
                def build(self, *args):
                    return fn(*args)
            return G()
        fns = {k: compiled(f) for k, f in fns.items()}
    return fns, tessera.from_numpy, None


def _torch(compiled: bool):
    import torch
    F = torch.nn.functional

    def chain(x):
        return F.gelu(x * A + B) * torch.sigmoid(x)
    fns = {"gemm": torch.matmul, "triad": lambda b, c: b + S * c, "chain": chain}
    if compiled:
        fns = {k: torch.compile(f) for k, f in fns.items()}
    return fns, torch.from_numpy, None


def _jax():
    import jax
    import jax.numpy as jnp

    def chain(x):
        return jax.nn.gelu(x * A + B, approximate=False) * jax.nn.sigmoid(x)
    fns = {"gemm": jnp.matmul, "triad": lambda b, c: b + S * c, "chain": chain}
    return ({k: jax.jit(f) for k, f in fns.items()}, jax.device_put,
            lambda y: y.block_until_ready())


def _threads(framework: str) -> int:
    if framework.startswith("torch"):
        import torch
        return torch.get_num_threads()
    if framework in ("tessera", "graph"):
        import tessera
        return tessera.get_num_threads()
    if framework == "numpy":
        from threadpoolctl import threadpool_info
        return max((i["num_threads"] for i in threadpool_info()), default=1)
    return os.cpu_count() or 1  # XLA's CPU client: one intra-op thread per core


def child(framework: str) -> dict:
    """Time every kernel in this process for one framework; results as a dict."""
    make = {"numpy": _numpy, "tessera": lambda: _tessera(False),
            "graph": lambda: _tessera(True), "torch": lambda: _torch(False),
            "torch.compile": lambda: _torch(True), "jax": _jax}[framework]
    fns, convert, sync = make()
    sync = sync or (lambda y: y)
    out = {"threads": _threads(framework)}
    for name, arrays in _inputs().items():
        args = [convert(a) for a in arrays]
        try:
            t0 = time.perf_counter()
            sync(fns[name](*args))
            first = time.perf_counter() - t0
            sync(fns[name](*args))
            times = []
            for _ in range(REPEAT):
                t0 = time.perf_counter()
                sync(fns[name](*args))
                times.append(time.perf_counter() - t0)
            out[name] = {"ms": statistics.median(times) * 1e3, "first_s": first}
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
            out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"}
    if framework == "graph" and "ms" in out["chain"]:
        out["chain_ns_in_cache"] = _chain_in_cache(fns["chain"])
    return out


def _chain_in_cache(graph, n: int = 1 << 15) -> float | None:
    """ns per element of the graph's fused chain loop on ``n`` floats that stay in L2, on
    one core (thread CPU time; the loop is too short to be split): the arithmetic alone,
    with no memory traffic to wait for. The time of a call on ``n // 32`` elements is
    subtracted from that on ``n`` (what a call costs besides its loop). Times half the
    cores' count of elements is the least time the chain can take on the host however
    fast its memory."""
    import numpy as np

    import tessera
    per_call = []
    for size in (n // 32, n):
        x = np.random.default_rng(0).standard_normal(size, np.float32)
        graph(tessera.from_numpy(x))  # compiles the chain for this size
        kernels = list(graph._current().executor.generated.values())
        if len(kernels) != 1:
            return None
        kernel, y = kernels[0], np.empty_like(x)
        reps, runs = max(1, (1 << 23) // n), []
        for _ in range(7):
            t0 = time.thread_time()
            for _ in range(reps):
                kernel(y, x)
            runs.append((time.thread_time() - t0) / reps)
        per_call.append(statistics.median(runs))
    return (per_call[1] - per_call[0]) / (n - n // 32) * 1e9


def run() -> dict:
    """Every framework's child, interleaved over ``TESSERA_BENCH_ROUNDS`` rounds; per
    framework and kernel, the round with the median time."""
    from bench.common import rounds
    runs: dict = {fw: [] for fw in FRAMEWORKS}
    res: dict = {}
    for _ in range(rounds()):
        for fw in FRAMEWORKS:
            proc = subprocess.run([sys.executable, "-m", "bench.kernels", "--child", fw],
                                  capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                lines = proc.stderr.strip().splitlines() or ["?"]
                res[fw] = {"error": lines[-1][:100]}
            else:
                runs[fw].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for fw, got in runs.items():
        if not got:
            continue
        res[fw] = out = dict(got[0])
        for name in ("gemm", "triad", "chain"):
            timed = sorted((r[name] for r in got if "ms" in r[name]), key=lambda t: t["ms"])
            if timed:
                out[name] = timed[(len(timed) - 1) // 2]
        ns = sorted(r["chain_ns_in_cache"] for r in got if r.get("chain_ns_in_cache"))
        if ns:
            out["chain_ns_in_cache"] = ns[(len(ns) - 1) // 2]
    return res


def render(res: dict) -> str:
    from bench.common import table
    gemm_flop = 2 * N_GEMM ** 3
    triad_bytes, chain_bytes = 12 * N_STREAM, 8 * N_STREAM
    triads = [r["triad"]["ms"] for r in res.values() if "ms" in r.get("triad", {})]
    best_triad = triad_bytes / min(triads) / 1e6 if triads else float("nan")
    torch_chain = res.get("torch", {}).get("chain", {}).get("ms")
    rows, notes = [], []
    for fw, r in res.items():
        if "error" in r:
            rows.append((fw, "-", "-", "-", "-", "-", "-"))
            notes.append(f"{fw}: {r['error']}")
            continue
        cells = [fw, str(r["threads"])]
        g, t, c = r["gemm"], r["triad"], r["chain"]
        cells.append(f"{gemm_flop / g['ms'] / 1e6:.0f}" if "ms" in g else "-")
        cells.append(f"{triad_bytes / t['ms'] / 1e6:.1f}" if "ms" in t else "-")
        if "ms" in c:
            gbs = chain_bytes / c["ms"] / 1e6
            cells += [f"{c['ms']:.1f}", f"{gbs:.1f} ({100 * gbs / best_triad:.0f}%)",
                      f"{c['ms'] / torch_chain:.2f}x" if torch_chain else "-"]
        else:
            cells += ["-", "-", "-"]
        for name in ("gemm", "triad", "chain"):
            if "error" in r[name]:
                notes.append(f"{fw} {name}: {r[name]['error']}")
        rows.append(tuple(cells))
    text = table(rows, ("framework", "threads", "SGEMM GFLOP/s", "triad GB/s", "chain ms",
                        "chain GB/s (% of triad)", "chain vs torch"))
    g = res.get("graph", {})
    if g.get("chain_ns_in_cache"):
        ns, cores = g["chain_ns_in_cache"], g["threads"]
        notes.append(f"graph chain's loop with its data in L2: {ns:.2f} ns/element on one "
                     f"core, so at least {ns * N_STREAM / cores / 1e6:.1f} ms for "
                     f"{N_STREAM >> 20}M floats on {cores} (arithmetic alone); 60% of the "
                     f"best triad is {chain_bytes / (0.6 * best_triad) / 1e6:.1f} ms")
    return text + "".join(f"\n  {n}" for n in notes)


TITLE = (f"Physical limits and a fused chain (median of {REPEAT}): SGEMM {N_GEMM}^3, "
         f"triad b + s*c and gelu(x*a + b) * sigmoid(x) on {N_STREAM >> 20}M float32")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
    else:
        print(TITLE)
        print(render(run()))
