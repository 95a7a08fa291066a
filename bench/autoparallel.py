"""Auto-parallel against plans written by hand: the measured ``nn.Graph`` training step of
each plan on 2 (and 4, oversubscribed on a small host) ranks started through the launcher,
beside the cost model's prediction for it.

Workloads: an MLP (512-2048-512, batch 64), a Transformer stack (2 encoder layers, d_model
128, 4 heads, FFN 512, batch 8 x 64) and GPT-mini (minGPT's 6 layers, 6 heads, 192 wide;
vocab 512, batch 8 x 64), each with AdamW. Plans: ``auto`` (``config.enable_auto_parallel``
with the saved machine profile, ``python -m tessera.distributed.calibrate``, or the default
one), ``dp`` (parameters broadcast, batch split), ``dp+zero`` (the same with
``config.enable_zero(stage=2)``), and ``tp`` (Megatron by hand: the first linear of each
MLP and the attention's input projection split by output features, the second and the
attention's output projection by input features; batch broadcast).

Per workload and rank count: each plan's step (median of the measured steps after two
warm-up steps), its ratio to the best hand-written plan, its prediction, the Kendall tau of
predicted against measured over the distinct plans (``auto`` left out when it is one of
the hand-written plans), and the solver's time; for ``auto``, what the
measured guard did (it times the plan and data parallelism at the first call and keeps the
faster, so ``auto`` is the kept plan). The profile is the saved one, else one measured at
the start of the run under the launcher (the host's load then is the one the steps see).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORKLOADS = ("mlp", "transformer", "gpt-mini")
PLANS = ("auto", "dp", "dp+zero", "tp")
HAND = ("dp", "dp+zero", "tp")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# column- and row-parallel parameter names (Megatron by hand)
_COLUMN = ("0.weight", "0.bias", "linear1.weight", "linear1.bias", "in_proj_weight",
           "in_proj_bias", "c_attn.weight", "c_attn.bias", "c_fc.weight", "c_fc.bias")
_ROW = ("2.weight", "linear2.weight", "out_proj.weight", "c_proj.weight")


def _ranks() -> tuple[int, ...]:
    return tuple(int(r) for r in os.environ.get("TESSERA_BENCH_AUTOPAR_RANKS", "2,4").split(","))


def _build(name: str):
    """(model, loss of (model, x, y), x, y) of workload ``name``."""
    import tessera as lib
    nn = lib.nn
    lib.manual_seed(0)
    if name == "mlp":
        model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
        return model, (lambda m, x, y: nn.functional.mse_loss(m(x), y)), \
            lib.randn(64, 512), lib.randn(64, 512)
    if name == "transformer":
        model = nn.Sequential(*[nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0,
                                                           batch_first=True)
                                for _ in range(2)])
        return model, (lambda m, x, y: nn.functional.mse_loss(m(x), y)), \
            lib.randn(8, 64, 128), lib.randn(8, 64, 128)
    model = lib.models.gpt("gpt-mini", vocab_size=512, block_size=64)
    return model, (lambda m, x, y: m(x, y)[1]), lib.randint(0, 512, (8, 64)), \
        lib.randint(0, 512, (8, 64))


def _hand(plan: str, names) -> tuple[dict, list]:
    """Parameter SBPs (name -> short forms) and input SBPs of a hand-written plan."""
    if plan == "tp":
        def named(n, keys):
            return any(n == k or n.endswith("." + k) for k in keys)
        sbps = {n: ("S(0)",) if named(n, _COLUMN) else ("S(1)",) if named(n, _ROW)
                else ("B",) for n in names}
        return sbps, [("B",), ("B",)]
    return {n: ("B",) for n in names}, [("S(0)",), ("S(0)",)]


def child(name: str, plan: str, steps: int) -> dict | None:
    """One rank's run of ``plan``; rank 0 returns the figures."""
    import tessera
    import tessera.distributed as dist
    from tessera.distributed import comm as C
    from tessera.parallel.auto_parallel import _parse
    n, rank = dist.get_world_size(), dist.get_rank()
    model, loss_fn, x, y = _build(name)
    opt = tessera.optim.AdamW(model.parameters(), lr=1e-4)
    p = tessera.placement("cpu", list(range(n)))

    class TrainGraph(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = loss_fn(self.model, x, y)
            loss.backward()
            return loss
    g = TrainGraph()
    if plan == "auto":
        g.config.enable_auto_parallel(p, solver="ilp", time_limit=10)
    else:
        names = dict(model.named_parameters())
        params, inputs = _hand(plan, names)
        by_id = {id(t): tuple(_parse(s) for s in params[k]) for k, t in names.items()}
        model.to_global(p, lambda t: by_id.get(id(t), (tessera.sbp.broadcast,)))
        x, y = (a.to_global(p, tessera.sbp.broadcast).to_global(
            sbp=tuple(_parse(s) for s in sb)) for a, sb in zip((x, y), inputs))
        if plan == "dp+zero":
            g.config.enable_zero(True, stage=2)
    for _ in range(2):
        g(x, y)
    dist.barrier()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        g(x, y)
        times.append(time.perf_counter() - t0)
    times = [max(v) for v in zip(*C.current().all_gather_object(times))]
    if rank != 0:
        return None
    out = {"ms": statistics.median(times) * 1000}
    if plan == "auto":
        ap = g.parallel_plan()
        out.update(strategy=ap.strategy + (" + ZeRO" if ap.zero else ""),
                   predicted_ms=ap.seconds * 1000, solve_s=ap.solve_seconds,
                   guard=ap.guard)
    return out


def _launch(name: str, plan: str, ranks: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1",
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, "-m", "tessera.distributed.launch", "--nproc-per-node",
               str(ranks), "--threads-per-proc", "1", "-m", "bench.autoparallel",
               "--child", name, plan, str(steps), out]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0 or not os.path.exists(out):
            lines = (proc.stderr or "?").strip().splitlines()
            return {"error": next((ln for ln in reversed(lines) if "Error" in ln),
                                  lines[-1] if lines else "?")}
        with open(out) as f:
            return json.load(f)


def _predict(name: str, ranks: int) -> dict:
    """The cost model's step for each hand-written plan, in this process."""
    import tessera
    from tessera.parallel import auto_parallel as AP
    model, loss_fn, x, y = _build(name)
    names = dict(model.named_parameters())
    g = AP.record(lambda a, b: loss_fn(model, a, b), (x, y), names)
    p = tessera.placement("cpu", list(range(ranks)))
    out = {}
    for plan in HAND:
        params, inputs = _hand(plan, names)
        parse = AP._parse
        try:
            t, _ = AP.price(g, p, {k: tuple(parse(s) for s in v) for k, v in params.items()},
                            [tuple(parse(s) for s in sb) for sb in inputs],
                            zero=plan == "dp+zero", optimizer="AdamW")
            out[plan] = t * 1000
        except (ValueError, RuntimeError) as e:
            out[plan] = None
            print(f"autoparallel: {name} {plan}: no prediction ({e})", file=sys.stderr)
    return out


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two rankings (ties count as neither agreeing nor disagreeing).

    >>> kendall_tau([1, 2, 3], [10, 20, 30]), kendall_tau([1, 2, 3], [3, 2, 1])
    (1.0, -1.0)
    """
    n, s = len(a), 0
    for i in range(n):
        for j in range(i + 1, n):
            x, y = a[i] - a[j], b[i] - b[j]
            s += (x * y > 0) - (x * y < 0)
    return s / (n * (n - 1) / 2) if n > 1 else 0.0


def _profile() -> str:
    """The saved machine profile, or one measured now under the launcher on the most ranks
    benchmarked (saved to a temporary file for this run)."""
    from tessera.distributed.calibrate import profile_path
    path = profile_path()
    if os.path.exists(path):
        return path
    path = os.path.join(tempfile.mkdtemp(), "profile.json")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-m", "tessera.distributed.launch", "--nproc-per-node",
                    str(max(_ranks())), "--threads-per-proc", "1", "-m",
                    "tessera.distributed.calibrate", "--quick", "--out", path],
                   cwd=ROOT, env=env, capture_output=True, check=False)
    return path


def run(steps: int = 5) -> list[dict]:
    os.environ["TESSERA_PROFILE"] = _profile()  # the children and the predictions read it
    rows = []
    for ranks in _ranks():
        for name in WORKLOADS:
            row: dict = {"workload": name, "ranks": ranks}
            for plan in PLANS:
                row[plan] = _launch(name, plan, ranks, steps)
            pred = _predict(name, ranks)
            for plan in HAND:
                if "ms" in row[plan]:
                    row[plan]["predicted_ms"] = pred.get(plan)
            # over distinct plans: an auto plan predicted as a hand plan is that plan
            # (its two measurements differ by the host's noise alone)
            same = [k for k in HAND if "ms" in row[k] and "ms" in row["auto"] and
                    row[k].get("predicted_ms") == row["auto"].get("predicted_ms")]
            pairs = [(row[k]["predicted_ms"], row[k]["ms"]) for k in PLANS
                     if "ms" in row[k] and row[k].get("predicted_ms") is not None
                     and not (k == "auto" and same)]
            row["tau"] = kendall_tau([p for p, _ in pairs], [m for _, m in pairs]) \
                if len(pairs) > 1 else None
            rows.append(row)
    return rows


def render(rows) -> str:
    from bench.common import table
    out, notes = [], []
    for r in rows:
        hand = [r[k]["ms"] for k in HAND if "ms" in r[k]]
        best = min(hand) if hand else None
        for plan in PLANS:
            res = r[plan]
            if "error" in res:
                notes.append(f"{r['workload']} x{r['ranks']} {plan}: {res['error'][:120]}")
                out.append((r["workload"], str(r["ranks"]), plan, "-", "-", "-", "-", "-"))
                continue
            if res.get("guard"):
                notes.append(f"{r['workload']} x{r['ranks']} auto: measured guard: "
                             f"{res['guard']}")
            pm = res.get("predicted_ms")
            out.append((r["workload"], str(r["ranks"]), plan + (f" ({res['strategy']})"
                                                               if "strategy" in res else ""),
                        f"{res['ms']:.1f}", f"{res['ms'] / best:.2f}" if best else "-",
                        f"{pm:.1f}" if pm is not None else "-",
                        f"{r['tau']:.2f}" if plan == "auto" and r["tau"] is not None else "",
                        f"{res['solve_s']:.2f}" if "solve_s" in res else ""))
    return (table(out, ("workload", "ranks", "plan", "step ms", "vs best hand",
                        "predicted ms", "Kendall tau", "solver s"))
            + "".join(f"\n  {n}" for n in notes))


TITLE = ("Auto-parallel vs hand-written plans (nn.Graph training step, median of 5 steps after "
         "2 warm-up; 1 thread per rank; predicted: the cost model with the saved profile; "
         "targets: auto <= 1.05 x the best hand plan, Kendall tau >= 0.8, solver within 10 s "
         "for GPT-mini)")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        res = child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        if res is not None:
            with open(sys.argv[5], "w") as f:
                json.dump(res, f)
    else:
        print(TITLE)
        print(render(run()))
