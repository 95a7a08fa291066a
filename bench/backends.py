"""nn.Graph's compiler backends side by side: step time and compile time (cold and warm)
per model and training workload, for tessera's own backend, TVM (untuned, and tuned with
MetaSchedule), XLA, and for inference torch.compile and onnxruntime.

Every (workload, backend) pair runs in two child processes one after the other, both with
``TESSERA_CACHE_DIR`` on one fresh folder: the first compiles on an empty cache (cold), the
second finds what the first left (warm: tessera's kernels and TVM's libraries are cached
on disk; XLA and onnxruntime compile again; torch.compile has its own cache). Compile time
= the first calls (a training graph traces twice: the first step makes the optimizer's
state) minus as many steady steps; step time = the median of the steady steps.

The models are the zoo's (``tessera.models``) at small sizes; torch.compile runs the
PyTorch references of the tests (``tests/models``, same architecture and sizes),
onnxruntime the model exported by ``tessera.onnx``. The note flags a row whose warm process
ended with the host's 1-minute load average above its core count. Steady steps stop early after
``STEPS_BUDGET_S`` (the note gives their count); a tuned TVM's note gives the part of its
cold compile spent tuning. ``TESSERA_BENCH_TVM_TRIALS`` (default 64) is the tuned
TVM's trial budget; ``TESSERA_BENCH_BACKENDS`` (comma-separated workload and backend
names, e.g. ``resnet18,cnn train,tvm tuned``) runs a subset; ``TESSERA_BENCH_BACKENDS_TIMEOUT``
(s, default 1800; three times that for tuned TVM) bounds each child process.
Every framework runs on ``TESSERA_BENCH_BACKENDS_THREADS`` kernel threads (default 1): each
runtime's own knob is set, and the child process may run on that many cores only (its CPU
affinity), so no runtime spreads a step over more. Each step is timed twice: wall clock and
the process's CPU time. At one thread the CPU time is the step's own work even when other
processes share the cores (the wall clock then includes waiting for a core), so the table
gives both.
``TESSERA_BENCH_BACKENDS_ROWS`` names a JSON-lines file of finished rows: a row found there
is not run again, and each new one is appended as it finishes, so a long run can stop and
resume, or run in parts (the cheap backends first, tuned TVM later), and the table comes
out whole at the end.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

INFERENCE = ("lenet5", "resnet18", "mobilenet_v2", "vit_tiny", "gpt", "bert")
TRAINING = ("mlp train", "cnn train", "transformer train")
BACKENDS = ("tessera", "tvm", "tvm tuned", "xla", "torch.compile", "onnxruntime")
STEPS = 10
# steady steps stop early past this many seconds (at least one runs): untuned TVM's naive
# loops take seconds to minutes a training step
STEPS_BUDGET_S = 60.0
# a child taking longer (untuned TVM's naive GEMM on the training workloads can take
# minutes a step) is reported as timed out rather than holding up the others
CHILD_TIMEOUT_S = int(os.environ.get("TESSERA_BENCH_BACKENDS_TIMEOUT", "1800"))
THREADS = int(os.environ.get("TESSERA_BENCH_BACKENDS_THREADS", "1"))


def _thread_env() -> dict:
    """Every runtime's own thread-count knob, for a child process (read at its start). XLA's
    CPU client sizes its thread pools by ``NPROC`` (else by the cores it may run on), which
    ``--xla_cpu_multi_thread_eigen`` alone leaves at the core count: a step's independent
    kernels then ran on two threads at once."""
    n = str(THREADS)
    return {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "TVM_NUM_THREADS": n, "NPROC": n,
            "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") +
                          f" --xla_cpu_multi_thread_eigen={'true' if THREADS > 1 else 'false'}"
                          ).strip()}


def _pin() -> None:
    """Holds this child process to ``THREADS`` cores when it may run on more, whatever its
    runtimes' knobs do (a pool sized by the core count, a helper thread): its CPU time per
    step then cannot exceed ``THREADS`` times the wall clock. Called before any runtime loads,
    so those that size their pools by the cores they may run on see ``THREADS``."""
    if not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if THREADS < len(cpus):
        os.sched_setaffinity(0, cpus[:THREADS])


def _trials() -> int:
    return int(os.environ.get("TESSERA_BENCH_TVM_TRIALS", "64"))


def _timeout(backend: str) -> int:
    """A tuned TVM child searches before its first step: three times the bound."""
    return CHILD_TIMEOUT_S * (3 if backend == "tvm tuned" else 1)


def _zoo(name: str):
    """(tessera model in eval mode, NumPy inputs)."""
    import tessera
    import tessera.models as tm
    tessera.manual_seed(0)
    rng = np.random.default_rng(0)
    img = rng.standard_normal((1, 3, 64, 64)).astype(np.float32)
    if name == "lenet5":
        return tm.lenet5(), (rng.standard_normal((8, 1, 28, 28)).astype(np.float32),)
    if name in ("resnet18", "mobilenet_v2"):
        return getattr(tm, name)(num_classes=10), (img,)
    if name == "vit_tiny":
        return tm.vit_tiny(num_classes=10, image_size=32, num_layers=4), (img[:, :, :32, :32],)
    if name == "gpt":
        cfg = tm.GPTConfig(vocab_size=512, block_size=64, n_layer=4, n_head=4, n_embd=128)
        return tm.GPT(cfg), (rng.integers(0, 512, (4, 64)),)
    cfg = tm.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=4,
                        num_attention_heads=4, intermediate_size=512,
                        max_position_embeddings=128)
    return tm.BertModel(cfg), (rng.integers(0, 1000, (4, 64)),)


def _main_output(out):
    if isinstance(out, tuple):
        return out[0]
    return getattr(out, "last_hidden_state", out)


def _torch_model(name: str):
    """The tests' PyTorch reference of zoo model ``name`` at the sizes of ``_zoo``."""
    import dataclasses

    import torch

    import tessera.models as tm
    from tests.models import torch_text_refs as text, torch_vision_ref as ref
    torch.manual_seed(0)
    if name == "lenet5":
        return ref.LeNet5()
    if name in ("resnet18", "mobilenet_v2"):
        return getattr(ref, name)(num_classes=10)
    if name == "vit_tiny":
        return ref.vit_tiny(num_classes=10, image_size=32, num_layers=4)
    if name == "gpt":
        return text.TorchGPT(vocab_size=512, block_size=64, n_layer=4, n_head=4, n_embd=128)
    cfg = tm.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=4,
                        num_attention_heads=4, intermediate_size=512,
                        max_position_embeddings=128)
    return text.TorchBert(dataclasses.asdict(cfg))


def _step(name: str, backend: str):
    """(zero-argument step, how many calls trace)."""
    if name in TRAINING:
        if backend in ("torch.compile", "onnxruntime"):
            raise NotImplementedError("inference only")
        import tessera
        from bench.training import build
        step = build(tessera, name.split()[0], graph=True)
        _configure(step.graph, backend)
        return step, 2
    model, arrays = _zoo(name)
    model = model.eval()
    if backend == "torch.compile":
        import torch
        tm = torch.compile(_torch_model(name).eval())
        ins = [torch.from_numpy(a) for a in arrays]

        def run_torch():
            with torch.no_grad():
                return tm(*ins)
        return run_torch, 1
    import tessera
    ins = [tessera.from_numpy(a) for a in arrays]
    if backend == "onnxruntime":
        return _ort_step(model, ins, arrays), 1

    class Infer(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, *x):
            return _main_output(self.model(*x))
    g = Infer()
    _configure(g, backend)
    return (lambda: g(*ins)), 1


def _ort_step(model, ins, arrays):
    """Export and session creation happen on the first call, as the others compile."""
    state: dict = {}

    def run():
        if "sess" not in state:
            import onnxruntime as ort

            import tessera.onnx

            class Main(tessera.nn.Module):  # the main output, as the graphs return it
                def __init__(self):
                    super().__init__()
                    self.model = model

                def forward(self, *x):
                    return _main_output(self.model(*x))
            proto = tessera.onnx.export(Main().eval(), tuple(ins))
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = THREADS
            state["sess"] = ort.InferenceSession(proto.SerializeToString(), opts,
                                                 providers=["CPUExecutionProvider"])
            state["feed"] = {i.name: a for i, a in zip(state["sess"].get_inputs(), arrays)}
        return state["sess"].run(None, state["feed"])
    return run


def _configure(g, backend: str) -> None:
    if backend == "tvm tuned":
        g.config.set_backend("tvm", tune_trials=_trials())
    elif backend != "tessera":
        g.config.set_backend(backend)


def child(name: str, backend: str) -> dict:
    import torch

    import tessera
    tessera.set_num_threads(THREADS)
    torch.set_num_threads(THREADS)
    step, traces = _step(name, backend)
    t0 = time.perf_counter()
    for _ in range(traces):
        step()
    first = time.perf_counter() - t0
    times: list[float] = []
    cpu: list[float] = []
    while len(times) < STEPS and sum(times) < STEPS_BUDGET_S:
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    med, med_cpu = statistics.median(times), statistics.median(cpu)
    out = {"step_ms": med * 1000, "compile_s": max(0.0, first - traces * med),
           "step_cpu_ms": med_cpu * 1000,
           "steps": len(times), "load": os.getloadavg()[0], "threads": THREADS,
           "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}
    if backend == "tvm tuned":
        from tessera.compiler import tvm
        out["tune_s"] = tvm.stats["tune_seconds"]
    return out


def _available(backend: str) -> str | None:
    """Why ``backend`` cannot run here, or None."""
    import importlib.util
    need = {"tvm": "tvm", "tvm tuned": "tvm", "xla": "jax", "onnxruntime": "onnxruntime",
            "torch.compile": "torch"}.get(backend)
    if need and importlib.util.find_spec(need) is None:
        return f"{need} is not installed"
    return None


def _selection() -> tuple[list[str], list[str]]:
    """The workloads and backends ``TESSERA_BENCH_BACKENDS`` names (all of a kind it names
    none of)."""
    chosen = [c.strip() for c in os.environ.get("TESSERA_BENCH_BACKENDS", "").split(",")
              if c.strip()]
    names = [n for n in INFERENCE + TRAINING if n in chosen] or list(INFERENCE + TRAINING)
    backends = [b for b in BACKENDS if b in chosen] or list(BACKENDS)
    return names, backends


def _done(path: str | None) -> dict:
    """The rows a previous (partial) run left in ``path``, by (workload, backend)."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {(r["workload"], r["backend"]): r for r in rows}


def _measure(name: str, backend: str) -> dict:
    row: dict = {"workload": name, "backend": backend}
    why = _available(backend)
    if why is None and name in TRAINING and backend in ("torch.compile", "onnxruntime"):
        why = "inference only"
    if why is not None:
        row["skip"] = why
        return row
    with tempfile.TemporaryDirectory(prefix="tessera-bench-backends-") as cache:
        env = dict(os.environ, TESSERA_CACHE_DIR=cache, **_thread_env())
        for phase in ("cold", "warm"):
            try:
                proc = subprocess.run([sys.executable, "-m", "bench.backends", "--child", name,
                                       backend], capture_output=True, text=True, env=env,
                                      check=False, timeout=_timeout(backend))
            except subprocess.TimeoutExpired:
                row[phase] = {"error": f"timed out after {_timeout(backend)} s"}
                continue
            if proc.returncode != 0:
                lines = proc.stderr.strip().splitlines() or ["?"]
                row[phase] = {"error": lines[-1][:100]}
            else:
                row[phase] = json.loads(proc.stdout.strip().splitlines()[-1])
    return row


def run() -> list[dict]:
    names, backends = _selection()
    path = os.environ.get("TESSERA_BENCH_BACKENDS_ROWS")
    done = _done(path)
    rows = []
    for name in names:
        for backend in backends:
            row = done.get((name, backend))
            if row is None:
                row = _measure(name, backend)
                if path:
                    with open(path, "a") as f:
                        f.write(json.dumps(row) + "\n")
                print(json.dumps(row), file=sys.stderr, flush=True)  # progress of a long run
            rows.append(row)
    return rows


def render(rows: list[dict]) -> str:
    from bench.common import table
    out = []
    for r in rows:
        if "skip" in r:
            out.append((r["workload"], r["backend"], "-", "-", "-", "-", r["skip"]))
            continue
        c, w = r["cold"], r["warm"]
        note, warm_compile = [], None
        if c.get("error") and not w.get("error"):
            # the cold process left nothing in the cache: the warm one compiled from scratch
            note.append(f"cold: {c['error']}; warm compiled from scratch")
            c, warm_compile = w, "-"
        err = c.get("error") or w.get("error")
        if err:
            out.append((r["workload"], r["backend"], "-", "-", "-", "-", err[:70]))
            continue
        if "tune_s" in c:
            note.append(f"{c['tune_s']:.0f} s of the cold compile tuning")
        if w.get("steps", STEPS) < STEPS:
            note.append(f"median of {w['steps']} steps")
        if w.get("load", 0) > (os.cpu_count() or 1):
            note.append(f"host loaded (load {w['load']:.0f})")
        cpu = f"{w['step_cpu_ms']:.2f}" if "step_cpu_ms" in w else "-"
        out.append((r["workload"], r["backend"], f"{w['step_ms']:.2f}", cpu,
                    f"{c['compile_s']:.2f}", warm_compile or f"{w['compile_s']:.2f}",
                    "; ".join(note)))
    text = table(out, ("workload", "backend", "step ms", "step CPU ms", "compile cold s",
                       "compile warm s", "note"))
    return text + "".join(f"\n\n{line}" for line in _wins(rows))


# why a backend's kernels beat tessera's where they do, from per-kernel profiles at one
# thread: tessera's program timed node by node (clock reads around each node's C), its
# executor with ``nn.Graph.profile``, onnxruntime with ``SessionOptions.enable_profiling``
# and each product alone in a session of its own; CPU microseconds, medians
WHY = {
    ("vit_tiny", "onnxruntime"): (
        "its 17 matrix products have 5 rows (the class token and 4 patches): tessera's GEMM "
        "ran them through its 14-row AVX-512 micro-kernel, 9 rows of zeros (5 x 768 x 192 "
        "packed: 19 us); with kernels of 5-13 rows it takes 7.5 us, as MLAS's 7.7, and the "
        "step went from 0.28 to 0.24 CPU ms. The patch embedding (192 channels x 4 pixels x "
        "768, as the transposed product) takes 17 us against onnxruntime's NCHWc "
        "convolution's 9 us; the rest of the gap is not profiled yet"),
    ("lenet5", "onnxruntime"): (
        "below a program's 16 kernels (deploy.program.MIN_KERNELS: a program's compile "
        "costs seconds) LeNet-5 runs on tessera's executor, a Python call per node: with "
        "TESSERA_GRAPH_PROGRAM=1 it is one C call and takes 0.11 ms (cold compile 6.8 s "
        "instead of 2.2); conv2 in NCHWc blocks takes about 50 us against onnxruntime's "
        "NCHWc convolution's 27 us"),
}


def _wins(rows: list[dict]) -> list[str]:
    """A line for each workload where another backend's step takes less CPU time than
    tessera's: which backend, both times, and why (``WHY``) where profiled."""
    cpu: dict = {}
    for r in rows:
        w = r.get("warm") or {}
        if "step_cpu_ms" in w and not w.get("error"):
            cpu.setdefault(r["workload"], {})[r["backend"]] = w["step_cpu_ms"]
    lines = []
    for name, by in cpu.items():
        own = by.get("tessera")
        if own is None:
            continue
        for backend, ms in sorted(by.items(), key=lambda kv: kv[1]):
            if backend != "tessera" and ms < own:
                why = WHY.get((name, backend), "not profiled yet")
                lines.append(f"{name}: {backend} beats tessera ({ms:.3f} against {own:.3f} "
                             f"CPU ms a step): {why}.")
    return lines


TITLE = ("nn.Graph compiler backends at TESSERA_BENCH_BACKENDS_THREADS threads (1 by default): "
         "step time (ms, median, warm process; wall clock and the process's CPU time) and "
         "compile time (s, wall clock, cold and warm cache); tvm tuned = MetaSchedule with "
         "TESSERA_BENCH_TVM_TRIALS trials (64 by default)")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _pin()
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
    else:
        print(TITLE)
        print(render(run()))
