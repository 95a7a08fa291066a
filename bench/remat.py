"""Rematerialization: training steps of GPT-mini (8 layers, batch 8, block 128) and ResNet-18
(10 classes, batch 16, 112x112 images), SGD, under memory budgets of 100%, 70%, 50% and 35%.

Rows: ``nn.Graph`` with ``config.enable_remat(budget_bytes=..., method=...)`` for the
MILP, Chen's sqrt segments and the greedy plan, the budget being the graph's peak of live
intermediates without remat less (1 - budget) of its saved activations (gradients and the
backward's own temporaries stay: a budget is a share of the activation memory); the peak
shown is the plan's ``memory_stats()["peak_bytes"]``;
eager DTR (``tessera.utils.dtr``, the budget a fraction of the tracked activations' peak
without eviction, its peak ``dtr.stats()["peak_bytes"]``); and the reference points:
tessera eager and PyTorch eager, each without checkpointing and with every block wrapped in
its ``checkpoint`` (``use_reentrant=False``). The tessera rows of one model run in one
process and PyTorch's in another; within a process the rows take turns, one step each per
round, so the host's load falls on all alike; a row's time is its median over 5 rounds,
after 2 warm-up steps (the first compiles the graph).

Targets: at 50% of the no-remat peak the MILP's step within 1.15x the graph's step without
remat and DTR's within 1.4x the eager step; at 35% the MILP's within 1.3x; the MILP solves
GPT-mini within 30 s.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import numpy as np

MODELS = ("gpt-mini 8L", "resnet18")
BUDGETS = (1.0, 0.7, 0.5, 0.35)
METHODS = ("milp", "sqrt", "greedy")
STEPS, WARMUP = 5, 2


def _inputs(model: str):
    rng = np.random.default_rng(0)
    if model == "resnet18":
        return (rng.standard_normal((16, 3, 112, 112)).astype(np.float32),
                rng.integers(0, 10, (16,)))
    return rng.integers(0, 512, (8, 128)), rng.integers(0, 512, (8, 128))


def _tessera(model: str):
    """(model, its blocks, loss function, inputs) in tessera."""
    import tessera
    tessera.manual_seed(0)
    a, b = (tessera.tensor(v) for v in _inputs(model))
    if model == "resnet18":
        m = tessera.models.resnet18(num_classes=10)
        blocks = [blk for layer in (m.layer1, m.layer2, m.layer3, m.layer4) for blk in layer]
        return m, blocks, lambda m, x, y: tessera.nn.functional.cross_entropy(m(x), y), (a, b)
    from tessera.models.gpt2 import gpt
    m = gpt("gpt-mini", n_layer=8, vocab_size=512, block_size=128)
    return m, list(m.transformer.h), lambda m, i, t: m(i, t)[1], (a, b)


def _torch(model: str):
    import torch
    torch.manual_seed(0)
    a, b = (torch.from_numpy(v) for v in _inputs(model))
    if model == "resnet18":
        from tests.models import torch_vision_ref as ref
        m = ref.resnet18(num_classes=10)
        blocks = [blk for layer in (m.layer1, m.layer2, m.layer3, m.layer4) for blk in layer]
        return m, blocks, lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y), (a, b)
    from tests.models.torch_text_refs import TorchGPT
    m = TorchGPT(512, 128, 8, 6, 192)
    return m, list(m.transformer.h), lambda m, i, t: m(i, t)[1], (a, b)


def _wrap(blocks, checkpoint) -> None:
    """Every block's forward through ``checkpoint`` (non-reentrant)."""
    for blk in blocks:
        blk.forward = (lambda f: lambda *a, **k: checkpoint(f, *a, use_reentrant=False,
                                                            **k))(blk.forward)


def _eager_step(lib, m, loss_fn, inputs):
    opt = lib.optim.SGD(m.parameters(), lr=1e-4)

    def step():
        opt.zero_grad()
        loss = loss_fn(m, *inputs)
        loss.backward()
        opt.step()
    return step


def _graph(m, loss_fn, inputs, method: str, budget_bytes: int | None):
    import tessera
    opt = tessera.optim.SGD(m.parameters(), lr=1e-4)

    class Step(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = m
            self.add_optimizer(opt)

        def build(self, *xs):
            loss = loss_fn(self.model, *xs)
            loss.backward()
            return loss
    g = Step()
    if budget_bytes is None:   # the plan of a budget it already meets: no copies, its stats
        g.config.enable_remat(budget=1.0, method="greedy")
    else:
        g.config.enable_remat(budget_bytes=budget_bytes, method=method, time_limit=30.0)
    return g, (lambda: g(*inputs))


def _tessera_rows(model: str) -> dict:
    """{(run, budget): (step, what it measured)} for every tessera row of ``model``: the
    graphs (one model shared; each graph compiles its own step), eager, DTR, checkpoints."""
    import tessera
    from tessera.utils import dtr
    from tessera.utils.checkpoint import checkpoint
    m, blocks, loss_fn, inputs = _tessera(model)
    rows: dict = {}
    peak = act = 0
    for kind, frac in [("graph none", 1.0)] + [(f"graph {x}", f) for f in BUDGETS[1:]
                                               for x in METHODS]:
        # the budget: the peak less the share (1 - frac) of the saved activations
        budget = None if kind == "graph none" else int(peak - (1 - frac) * act)
        try:
            g, step = _graph(m, loss_fn, inputs, kind.split()[1], budget)
            t0 = time.perf_counter()
            step()
            info = {"compile_s": time.perf_counter() - t0}
            st = g.memory_stats()
            info.update(peak=st["peak_bytes"], peak_no_remat=st["peak_bytes_no_remat"],
                        activations=st["activation_bytes_no_remat"], budget_bytes=budget,
                        solver_s=st["remat_solver_time_s"], status=st["remat_status"],
                        gap=st["remat_optimality_gap"], recompute_flops=st["recompute_flops"])
            if budget is None:
                peak, act = st["peak_bytes"], st["activation_bytes_no_remat"]
                info["status"] = ""
            rows[(kind, frac)] = (step, info)
        except ValueError as e:   # a budget no plan reaches
            rows[(kind, frac)] = (None, {"error": str(e).split("(")[-1].rstrip(")")})
    eager = _eager_step(tessera, m, loss_fn, inputs)
    rows[("eager", 1.0)] = (eager, {})
    with dtr.enable(budget_bytes=1 << 60):
        eager()
    full = dtr.stats()["peak_bytes"]
    for frac in BUDGETS[1:]:
        info: dict = {"peak_no_remat": full}

        def step(budget=int(full * frac), info=info):
            with dtr.enable(budget_bytes=budget):
                eager()
            s = dtr.stats()
            info.update(peak=s["peak_bytes"], evictions=s["evictions"],
                        recomputations=s["recomputations"], over_budget=s["over_budget"])
        rows[("dtr", frac)] = (step, info)
    m2, blocks2, loss_fn2, inputs2 = _tessera(model)
    _wrap(blocks2, checkpoint)
    rows[("eager checkpoint", 1.0)] = (_eager_step(tessera, m2, loss_fn2, inputs2), {})
    return rows


def _torch_rows(model: str) -> dict:
    import torch
    import torch.utils.checkpoint as tcp
    torch.set_num_threads(2)
    rows = {}
    for kind in ("torch", "torch checkpoint"):
        m, blocks, loss_fn, inputs = _torch(model)
        if kind == "torch checkpoint":
            _wrap(blocks, tcp.checkpoint)
        rows[(kind, 1.0)] = (_eager_step(torch, m, loss_fn, inputs), {})
    return rows


def child(model: str, family: str) -> list[dict]:
    """Every row of one framework for ``model`` in this process, interleaved: each row
    warms up, then each takes one step per round (so load on the host falls on all rows
    alike); a row's time is its median step."""
    rows = _tessera_rows(model) if family == "tessera" else _torch_rows(model)
    live = {k: v for k, v in rows.items() if v[0] is not None}
    for step, _ in live.values():
        for _ in range(WARMUP):
            step()
    times: dict = {k: [] for k in live}
    for _ in range(STEPS):
        for k, (step, _) in live.items():
            t0 = time.perf_counter()
            step()
            times[k].append((time.perf_counter() - t0) * 1e3)
    out = []
    for (kind, frac), (_, info) in rows.items():
        r = dict(info, model=model, kind=kind, budget=frac)
        if (kind, frac) in times:
            r["ms"] = statistics.median(times[(kind, frac)])
        out.append(r)
    return out


def run() -> list[dict]:
    results = []
    for model in MODELS:
        for family in ("tessera", "torch"):
            proc = subprocess.run([sys.executable, "-m", "bench.remat", "--child", model,
                                   family], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                err = ((proc.stderr.strip().splitlines() or ["?"])[-1])[:120]
                results.append({"model": model, "kind": family, "budget": 1.0, "error": err})
            else:
                results += json.loads(proc.stdout.strip().splitlines()[-1])
    return results


def _ratio(r: dict, rows: list[dict]) -> str:
    """The step time over the matching baseline's: graph rows over the graph without
    remat, DTR and checkpoint rows over eager, torch checkpoint over torch."""
    base = {"graph": "graph none", "dtr": "eager", "eager": "eager", "torch": "torch"}
    ref = next((x for x in rows if x["model"] == r["model"] and
                x["kind"] == base[r["kind"].split()[0]] and "ms" in x), None)
    return f"{r['ms'] / ref['ms']:.2f}x" if ref and "ms" in r else "-"


def render(rows: list[dict]) -> str:
    from bench.common import table

    def mb(v):
        return f"{v / 2 ** 20:.1f}" if isinstance(v, (int, float)) else "-"

    out = []
    for r in rows:
        if "error" in r:
            out.append((r["model"], r["kind"], f"{r['budget']:.0%}", "-", "-", "-", "-",
                        r["error"]))
            continue
        note = r.get("status") or ""
        if r["kind"] == "dtr":
            note = f"{r['evictions']} evictions, {r['recomputations']} recomputations" + (
                f", over budget {r['over_budget']}x" if r.get("over_budget") else "")
        if r.get("gap"):
            note += f", gap {r['gap']:.2g}"
        peak = f"{mb(r.get('peak'))} / {mb(r.get('peak_no_remat'))}" if "peak" in r else "-"
        if r.get("activations"):
            peak += f" ({mb(r['activations'])} act.)"
        solver = f"{r['solver_s']:.2f}" if r.get("solver_s") else "-"
        out.append((r["model"], r["kind"], f"{r['budget']:.0%}", peak, f"{r['ms']:.0f}",
                    _ratio(r, rows), solver, note))
    return table(out, ("model", "run", "budget", "peak MB / no remat", "step ms", "vs base",
                       "solver s", "plan"))


TITLE = ("rematerialization: training steps under memory budgets, a share of the activations "
         "(peak: live intermediates of the graph's plan, with the saved activations without "
         "remat, or DTR's tracked activations; vs base: the graph without remat, eager without "
         "DTR, torch without checkpoint; targets at 50%: MILP <= 1.15x, DTR <= 1.4x; at 35%: "
         "MILP <= 1.3x; MILP solve <= 30 s)")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
    else:
        rows = run()
        print(TITLE)
        print(render(rows))
