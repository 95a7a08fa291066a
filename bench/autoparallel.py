"""Auto-parallel against plans written by hand: the measured ``nn.Graph`` training step of
each plan on 2 ranks (``TESSERA_BENCH_AUTOPAR_RANKS``, e.g. ``2,4``) started through the
launcher, beside the cost model's prediction for it.

Workloads: an MLP (512-2048-512, batch 64), a Transformer stack (2 encoder layers, d_model
128, 4 heads, FFN 512, batch 8 x 64) and GPT-mini (minGPT's 6 layers, 6 heads, 192 wide;
vocab 512, batch 8 x 64), each with AdamW. Plans: ``auto`` (``config.enable_auto_parallel``
with the profile measured at the start of its run), and by hand: ``replicated`` (every
rank the whole step), ``dp`` (parameters broadcast, batch split), ``dp+zero`` (the same
with ``config.enable_zero(stage=2)``), ``tp`` (Megatron: the first linear of each MLP and
the attention's input projection split by output features, the second and the
attention's output projection by input features; batch broadcast), and per workload the
mixes: for the MLP the column or row split alone and ``dp+tp`` (batch split as well); for
the Transformer and GPT-mini tensor parallelism on the MLPs only (``tp-mlp``), on the
attention only (``tp-attn``), on the first layer only (``tp-layer0``), and ``dp+tp-mlp``.

Every plan's step starts from the batch as ordinary tensors, as a training loop has it: a
hand-written plan converts it to its global SBP in the step, as the auto plan's graph does.
One run per workload measures every plan in one launch, interleaved: rounds of a few steps
of each plan in turn (the order rotated each round), so a burst of the host's other load
falls on one round of several plans rather than on every step of one. A round's figure for
a plan is the median of its steps (the slowest rank's); each plan's step is the median over
rounds of that figure relative to the round's geometric mean over the plans, on the run's
scale (``round_adjusted``: the load, which moves every plan of a round alike, cancels),
beside the plain median over rounds. The machine
profile is measured (``calibrate``) at the start, the middle and the end of the run, and
the predictions are priced on their median, so the prediction sees the load the steps saw.
Reported per workload: each plan's step, its ratio to the best hand-written plan and its
prediction; the Kendall tau of predicted against measured over the distinct plans
(``auto`` left out when it is one of the hand-written plans), as tau-a and as tau-b with
the pairs of plans the interleaved rounds cannot order (``measured_ties``: their paired
rounds within two robust standard errors, the guard's statistic) counted as ties; the
solver's time; and for
``auto`` what the measured guard did (at the first call it times the plan beside data
parallelism and the plans predicted close to it, and keeps another only when clearly
faster).

``python -m bench.autoparallel --solver`` times the search itself on a graph of about
2,000 nodes with each solver and time limit (``solver_times``).
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
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Megatron's column- and row-parallel parameters, per workload
_COLUMN = {"mlp": ("0.weight", "0.bias"),
           "transformer": ("linear1.weight", "linear1.bias", "in_proj_weight", "in_proj_bias"),
           "gpt-mini": ("c_attn.weight", "c_attn.bias", "c_fc.weight", "c_fc.bias")}
_ROW = {"mlp": ("2.weight",), "transformer": ("linear2.weight", "out_proj.weight"),
        "gpt-mini": ("attn.c_proj.weight", "mlp.c_proj.weight")}
# the parts a mixed plan splits: names containing one of these
_MLP_PART = {"transformer": ("linear1.", "linear2."), "gpt-mini": ("mlp.",)}
_ATTN_PART = {"transformer": ("self_attn.",), "gpt-mini": ("attn.",)}
_LAYER0 = {"transformer": "0.", "gpt-mini": "transformer.h.0."}
# enable_zero's default shard_min_size, what a plan written by hand gets
_ZERO_MIN = 1024


def _ranks() -> tuple[int, ...]:
    return tuple(int(r) for r in os.environ.get("TESSERA_BENCH_AUTOPAR_RANKS", "2").split(","))


def _build(name: str, small: bool = False):
    """(model, loss of (model, x, y), x, y) of workload ``name`` (``small``: the same
    structure at a few percent of the sizes, for tests)."""
    import tessera as lib
    nn = lib.nn
    lib.manual_seed(0)
    if name == "mlp":
        d, h, b = (32, 64, 8) if small else (512, 2048, 64)
        model = nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, d))
        return model, (lambda m, x, y: nn.functional.mse_loss(m(x), y)), \
            lib.randn(b, d), lib.randn(b, d)
    b, t = (2, 8) if small else (8, 64)
    if name == "transformer":
        d, heads, ffn = (16, 2, 32) if small else (128, 4, 512)
        model = nn.Sequential(*[nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0,
                                                           batch_first=True)
                                for _ in range(2)])
        return model, (lambda m, x, y: nn.functional.mse_loss(m(x), y)), \
            lib.randn(b, t, d), lib.randn(b, t, d)
    vocab = 32 if small else 512
    sizes = dict(n_layer=2, n_head=2, n_embd=16) if small else {}
    model = lib.models.gpt("gpt-mini", vocab_size=vocab, block_size=t, **sizes)
    return model, (lambda m, x, y: m(x, y)[1]), lib.randint(0, vocab, (b, t)), \
        lib.randint(0, vocab, (b, t))


def _megatron(w: str, names, part=None, layer=None) -> dict:
    """Megatron's parameter SBPs, on the parameters whose names contain one of ``part``
    and start with ``layer`` (all when None); the rest broadcast."""
    def named(n, keys):
        return any(n == k or n.endswith("." + k) for k in keys)
    out = {}
    for n in names:
        s = "S(0)" if named(n, _COLUMN[w]) else "S(1)" if named(n, _ROW[w]) else "B"
        if (part is not None and not any(p in n for p in part)) or \
                (layer is not None and not n.startswith(layer)):
            s = "B"
        out[n] = s
    return out


def plans(w: str, names) -> dict[str, tuple[dict, str, bool]]:
    """The hand-written plans of workload ``w``: name -> (parameter name -> SBP, the
    inputs' SBP, ZeRO)."""
    bcast = {n: "B" for n in names}
    out = {"replicated": (bcast, "B", False), "dp": (bcast, "S(0)", False),
           "dp+zero": (bcast, "S(0)", True), "tp": (_megatron(w, names), "B", False)}
    if w == "mlp":
        out["col"] = ({**bcast, "0.weight": "S(0)", "0.bias": "S(0)"}, "B", False)
        out["row"] = ({**bcast, "2.weight": "S(1)"}, "B", False)
        out["dp+tp"] = (_megatron(w, names), "S(0)", False)
    else:
        out["tp-mlp"] = (_megatron(w, names, _MLP_PART[w]), "B", False)
        out["tp-attn"] = (_megatron(w, names, _ATTN_PART[w]), "B", False)
        out["tp-layer0"] = (_megatron(w, names, layer=_LAYER0[w]), "B", False)
        out["dp+tp-mlp"] = (_megatron(w, names, _MLP_PART[w]), "S(0)", False)
    return out


def _graph(name: str, plan, placement, profile: str):
    """(graph, step) of workload ``name`` under ``plan`` ((param SBPs, input SBP, ZeRO), or
    "auto"), compiled by two warm-up steps. ``step()`` trains on the workload's batch as a
    training loop gets it, an ordinary tensor: a hand-written plan converts it to its
    global SBP in the step, as the auto plan's graph does."""
    import tessera
    from tessera.parallel.auto_parallel import _parse
    model, loss_fn, x, y = _build(name)
    opt = tessera.optim.AdamW(model.parameters(), lr=1e-4)

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

    def convert(a):
        return a
    if plan == "auto":
        from tessera.distributed.calibrate import load
        g.config.enable_auto_parallel(placement, solver="ilp", time_limit=10,
                                      profile=load(profile))
    else:
        params, inputs, zero = plan
        by_id = {id(t): (_parse(params[k]),) for k, t in model.named_parameters()}
        model.to_global(placement, lambda t: by_id.get(id(t), (tessera.sbp.broadcast,)))

        def convert(a):
            return a.to_global(placement, tessera.sbp.broadcast).to_global(
                sbp=(_parse(inputs),))
        if zero:
            g.config.enable_zero(True, stage=2, shard_min_size=_ZERO_MIN)

    def step():
        return g(convert(x), convert(y))
    for _ in range(2):
        step()
    return g, step


def _calibrate(path: str) -> None:
    """A profile of the launched ranks, saved by rank 0 at ``path``."""
    import tessera.distributed as dist
    from tessera.distributed.calibrate import measure, save
    prof = measure()
    if dist.get_rank() == 0:
        save(prof, path)
    dist.barrier()


def child(name: str, rounds: int, steps: int, out: str) -> None:
    """All plans of workload ``name`` on the launched ranks, interleaved; rank 0 writes the
    figures to ``out`` (JSON)."""
    import tessera
    import tessera.distributed as dist
    from tessera.distributed import comm as C
    n = dist.get_world_size()
    p = tessera.placement("cpu", list(range(n)))
    profiles = [f"{out}.profile{k}.json" for k in range(3)]
    _calibrate(profiles[0])
    before = profiles[0]
    names = [k for k, _ in _build(name)[0].named_parameters()]
    specs: dict = {"auto": "auto", **plans(name, names)}
    graphs = {k: _graph(name, spec, p, before) for k, spec in specs.items()}
    keys = list(graphs)
    times: dict = {k: [] for k in keys}
    for r in range(rounds):
        if r == rounds // 2:
            _calibrate(profiles[1])
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            step = graphs[k][1]
            dist.barrier()
            ts = []
            for _ in range(steps):
                t0 = time.perf_counter()
                step()
                ts.append(time.perf_counter() - t0)
            times[k].append(ts)
    _calibrate(profiles[2])
    every = C.current().all_gather_object(times)
    if dist.get_rank() != 0:
        return
    res: dict = {}
    for k in keys:
        per_round = [statistics.median(max(t[k][r][s] for t in every) for s in range(steps))
                     for r in range(rounds)]
        res[k] = {"median_ms": statistics.median(per_round) * 1000,
                  "rounds": [t * 1000 for t in per_round]}
    for k, ms in round_adjusted({k: v["rounds"] for k, v in res.items()}).items():
        res[k]["ms"] = ms
    ap = graphs["auto"][0].parallel_plan()
    res["auto"].update(strategy=ap.strategy + (" + ZeRO" if ap.zero else ""),
                       predicted_start_ms=ap.seconds * 1000, solve_s=ap.solve_seconds,
                       guard=ap.guard, params={k.removeprefix("model."): v[0]
                                                  for k, v in ap.param_sbps.items()},
                       inputs=ap.input_sbps[0][0], zero=ap.zero)
    for k in keys[1:]:
        res[k].update(params=specs[k][0], inputs=specs[k][1], zero=specs[k][2])
    with open(out, "w") as f:
        json.dump({"plans": res, "profiles": profiles}, f)


def round_adjusted(rounds: dict[str, list[float]]) -> dict[str, float]:
    """Each plan's step with the load of each round taken out (``rounds[plan][r]``: its
    step in round ``r``): the median over rounds of the step over the round's geometric
    mean over the plans, times the geometric mean over the rounds of those means. The
    host's load moves every plan of a round alike (the rounds' steps spread by 20-40%
    on a shared host, their ratios to the round's mean by 6-13%), so plans are compared
    within rounds, as the measured guard and ``measured_ties`` compare them.

    >>> r = round_adjusted({"a": [10, 20, 10], "b": [12, 22, 13]})  # round 2 under load
    >>> round(r["a"], 2), round(r["b"], 2)
    (12.58, 15.1)
    """
    plans_ = list(rounds)
    n = len(rounds[plans_[0]])
    means = [statistics.geometric_mean(rounds[k][r] for k in plans_) for r in range(n)]
    level = statistics.geometric_mean(means)
    return {k: statistics.median(rounds[k][r] / means[r] for r in range(n)) * level
            for k in plans_}


def _launch(name: str, ranks: int, rounds: int, steps: int, tmp: str) -> dict:
    out = os.path.join(tmp, f"{name}-{ranks}.json")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "tessera.distributed.launch", "--nproc-per-node",
           str(ranks), "--threads-per-proc", "1", "-m", "bench.autoparallel",
           "--child", name, str(rounds), str(steps), out]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0 or not os.path.exists(out):
        lines = (proc.stderr or "?").strip().splitlines()
        return {"error": next((ln for ln in reversed(lines) if "Error" in ln),
                              lines[-1] if lines else "?")}
    with open(out) as f:
        return json.load(f)


def median_profile(paths: list[str]):
    """The median of the saved profiles at ``paths``, figure by figure (as the steps are
    medians over rounds: a burst of load during one calibration is left out)."""
    from tessera.distributed.calibrate import Profile, load

    def median(vals):
        if isinstance(vals[0], dict):
            return {k: median([v[k] for v in vals]) for k in vals[0]
                    if all(k in v for v in vals)}
        if isinstance(vals[0], (list, tuple)):
            return [median(list(x)) for x in zip(*vals)]
        if isinstance(vals[0], str):
            return vals[0]
        return statistics.median(vals)
    return Profile.from_json(median([load(p).to_json() for p in paths]))


def predict(name: str, ranks: int, specs: dict, profile) -> dict:
    """The cost model's step (ms) for each plan of ``specs`` (name -> (param SBPs, input
    SBP, ZeRO, ZeRO's shard_min_size)), in this process."""
    import tessera
    from tessera.parallel import auto_parallel as AP
    model, loss_fn, x, y = _build(name)
    names = dict(model.named_parameters())
    g = AP.record(lambda a, b: loss_fn(model, a, b), (x, y), names)
    p = tessera.placement("cpu", list(range(ranks)))
    out: dict[str, float | None] = {}
    for plan, (params, inputs, zero, zmin) in specs.items():
        try:
            t, _ = AP.price(g, p, {k: (AP._parse(s),) for k, s in params.items()},
                            [(AP._parse(inputs),)] * 2, zero=zero, optimizer="AdamW",
                            profile=profile, zero_min_size=zmin)
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
    s, _, _, pairs = _pair_counts(a, b, set())
    return s / pairs if pairs else 0.0


def _pair_counts(a: list[float], b: list[float], tied: set) -> tuple[int, int, int, int]:
    """(concordant - discordant pairs, pairs tied in ``a``, pairs tied in ``b`` or listed in
    ``tied``, pairs)."""
    n, s, ta, tb = len(a), 0, 0, 0
    for i in range(n):
        for j in range(i + 1, n):
            x, y = a[i] - a[j], 0.0 if (i, j) in tied else b[i] - b[j]
            s += (x * y > 0) - (x * y < 0)
            ta, tb = ta + (x == 0), tb + (y == 0)
    return s, ta, tb, n * (n - 1) // 2


def kendall_tau_b(a: list[float], b: list[float], tied: set) -> float:
    """Kendall's tau-b of two rankings where the pairs ``(i, j)`` of ``tied`` (``i < j``)
    count as ties of ``b`` as well as its equal values: (concordant - discordant) over
    the geometric mean of the pairs untied in ``a`` and in ``b``.

    >>> a, b = [1, 2, 3], [10, 30, 20]   # (plans 1 and 2 measured apart by noise alone)
    >>> round(kendall_tau_b(a, b, {(1, 2)}), 3), round(kendall_tau(a, b), 3)
    (0.816, 0.333)
    """
    s, ta, tb, pairs = _pair_counts(a, b, tied)
    return s / ((pairs - ta) * (pairs - tb)) ** 0.5 if pairs > max(ta, tb) else 0.0


# a measured pair whose paired rounds differ by less than this many robust standard errors
# (the guard's statistic) is a tie of the measurement: its order is the host's noise
_TIE_Z = 2.0


def measured_ties(rounds: list[list[float]]) -> set:
    """The pairs ``(i, j)`` of plans whose steps the interleaved rounds cannot order
    (``rounds[i][r]``: plan ``i``'s step in round ``r``; ``|z| < _TIE_Z``).

    >>> sorted(measured_ties([[10, 11, 10, 11, 10], [11, 10, 11, 10, 10], [20] * 5]))
    [(0, 1)]
    """
    from tessera.parallel.auto_parallel import _paired_log_ratio
    out = set()
    for i in range(len(rounds)):
        for j in range(i + 1, len(rounds)):
            mean, se = _paired_log_ratio(rounds[i], rounds[j])
            if abs(mean / se) < _TIE_Z:
                out.add((i, j))
    return out


def run(rounds: int = 0, steps: int = 3) -> list[dict]:
    from tessera.distributed.calibrate import load
    from tessera.parallel.auto_parallel import ZERO_MIN_SIZE
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in _ranks():
            for name in os.environ.get("TESSERA_BENCH_AUTOPAR_WORKLOADS",
                                       ",".join(WORKLOADS)).split(","):
                k = rounds or (16 if name == "gpt-mini" else 24)
                res = _launch(name, ranks, k, steps, tmp)
                row: dict = {"workload": name, "ranks": ranks}
                if "error" in res:
                    row["error"] = res["error"]
                    rows.append(row)
                    continue
                plans_ = res["plans"]
                prof = median_profile(res["profiles"])
                row["profiles"] = [load(p).to_json() for p in res["profiles"]]
                specs = {k: (v["params"], v["inputs"], v["zero"],
                             ZERO_MIN_SIZE if k == "auto" else _ZERO_MIN)
                         for k, v in plans_.items()}
                pred = predict(name, ranks, specs, prof)
                for k, v in plans_.items():
                    v["predicted_ms"] = pred.get(k)
                row["plans"] = plans_
                row["profile"] = prof.to_json()
                row["sync_ms"] = prof.sync_seconds(ranks) * 1000
                row["collective_ms"] = prof.collective_seconds(ranks) * 1000
                # over distinct plans: an auto plan that is a hand plan is that plan (its
                # two measurements differ by the host's noise alone)
                same = [k for k in specs if k != "auto" and specs[k][:3] == specs["auto"][:3]]
                keys = [k for k in plans_ if plans_[k].get("predicted_ms") is not None
                        and not (k == "auto" and same)]
                row["same"] = same[0] if same else None
                pred_ms = [plans_[k]["predicted_ms"] for k in keys]
                meas_ms = [plans_[k]["ms"] for k in keys]
                row["tau"] = kendall_tau(pred_ms, meas_ms) if len(keys) > 1 else None
                row["tau_median"] = kendall_tau(
                    pred_ms, [plans_[k]["median_ms"] for k in keys]) if len(keys) > 1 else None
                tied = measured_ties([plans_[k]["rounds"] for k in keys])
                row["tau_b"] = kendall_tau_b(pred_ms, meas_ms, tied) if len(keys) > 1 else None
                row["ties"] = sorted((keys[i], keys[j]) for i, j in tied)
                rows.append(row)
    return rows


def render(rows) -> str:
    from bench.common import table
    out, notes = [], []
    for r in rows:
        if "error" in r:
            notes.append(f"{r['workload']} x{r['ranks']}: {r['error'][:160]}")
            continue
        ps = r["plans"]
        best = min(v["ms"] for k, v in ps.items() if k != "auto")
        if ps["auto"].get("guard"):
            notes.append(f"{r['workload']} x{r['ranks']} auto: measured guard: "
                         f"{ps['auto']['guard']}")
        ties = r.get("ties") or []
        tau_b = f" (tau-b {r['tau_b']:.2f} with the {len(ties)} pairs the rounds cannot " \
            f"order as ties: " + ", ".join(f"{a} ~ {b}" for a, b in ties) + ")" \
            if r.get("tau_b") is not None and ties else ""
        plain = f"; {r['tau_median']:.2f} on the plain medians" \
            if r.get("tau_median") is not None else ""
        notes.append(f"{r['workload']} x{r['ranks']}: Kendall tau {r['tau']:.2f}{tau_b}{plain}"
                     f" over {len(ps) - (1 if r['same'] else 0)} distinct plans; profile sync "
                     f"{r['sync_ms']:.2f} ms per collective (of which the step's "
                     f"per-collective cost {r.get('collective_ms', 0.0):.2f} ms)")
        for k, v in sorted(ps.items(), key=lambda kv: kv[1]["ms"]):
            label = k + (f" ({v['strategy']}" + (f" = {r['same']}" if r["same"] else "")
                         + ")" if k == "auto" else "")
            pm = v.get("predicted_ms")
            out.append((r["workload"], str(r["ranks"]), label, f"{v['ms']:.1f}",
                        f"{v['median_ms']:.1f}" if "median_ms" in v else "-",
                        f"{v['ms'] / best:.2f}", f"{pm:.1f}" if pm is not None else "-",
                        f"{v['solve_s']:.2f}" if "solve_s" in v else ""))
    return (table(out, ("workload", "ranks", "plan", "step ms", "median ms", "vs best hand",
                        "predicted ms", "solver s"))
            + "".join(f"\n  {n}" for n in notes))


def solver_times(layers: int = 40, limits=(1.0, 3.0, 10.0, 30.0)) -> str:
    """The search on a graph of about 2,000 nodes (GPT of ``layers`` layers, 16 wide, traced)
    on 2 ranks with each solver and time limit: the seconds it took against its limit and
    the solver that gave the plan (the ILP falls back to greedy when its problem is too
    large for its time or finds nothing in time)."""
    import tessera
    from bench.common import table
    from tessera.distributed.calibrate import DEFAULT
    from tessera.parallel import auto_parallel as AP
    tessera.manual_seed(0)
    model = tessera.models.gpt("gpt-mini", vocab_size=64, block_size=8, n_layer=layers,
                               n_head=2, n_embd=16)
    x, y = tessera.randint(0, 64, (8, 8)), tessera.randint(0, 64, (8, 8))
    params = dict(model.named_parameters())
    g = AP.record(lambda a, b: model(a, b)[1], (x, y), params)
    c = AP.build_costs(g, (2,), DEFAULT)
    rows = []
    for solver in AP.SOLVERS:
        for lim in limits:
            t0 = time.perf_counter()
            plan = AP.search(None, (x, y), params, tessera.placement("cpu", [0, 1]),
                             solver=solver, time_limit=lim, profile=DEFAULT, graph=g)
            took = time.perf_counter() - t0
            rows.append((solver, f"{lim:g}", f"{took:.2f}", f"{took / lim:.2f}", plan.solver,
                         plan.strategy, f"{plan.seconds * 1e3:.1f}"))
    return (f"auto-parallel search on {len(g.nodes)} nodes ({AP.ilp_nonzeros(c)} ILP "
            f"nonzeros), 2 ranks, load average {os.getloadavg()[0]:.1f}\n"
            + table(rows, ("solver", "limit s", "took s", "/ limit", "used", "plan",
                           "predicted ms")))


TITLE = ("Auto-parallel vs hand-written plans (nn.Graph training step, AdamW; all plans of a "
         "workload in one launch, interleaved rounds of 3 steps; step: the median over rounds "
         "relative to each round's geometric mean over the plans, beside the plain median; "
         "1 thread per rank; "
         "predicted: the cost model on the median of the profiles measured at the start, "
         "middle and end of the run; targets: auto <= 1.05 x the best hand plan, Kendall "
         "tau >= 0.8, solver within 10 s for GPT-mini)")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--solver":
        print(solver_times())
    elif len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        print(TITLE)
        rows = run()
        print(render(rows))
        if os.environ.get("TESSERA_BENCH_AUTOPAR_SAVE"):  # the raw figures, as JSON
            with open(os.environ["TESSERA_BENCH_AUTOPAR_SAVE"], "w") as f:
                json.dump(rows, f, indent=1)
