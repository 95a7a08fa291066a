"""Timing helpers shared by the benchmark scripts: medians of repeated runs."""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable


def _inner_loop(fn: Callable[[], object], min_time: float) -> int:
    """Calls per timing round: doubled until one round takes ``min_time``."""
    fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 >= min_time or n >= 1 << 20:
            return n
        n *= 2


def per_call_us(fn: Callable[[], object], repeat: int = 7, min_time: float = 0.05) -> float:
    """Median over ``repeat`` rounds of the mean per-call time in microseconds."""
    return per_call_us_interleaved({"fn": fn}, repeat, min_time)["fn"]


def per_call_us_interleaved(fns: dict, repeat: int = 9, min_time: float = 0.05) -> dict:
    """``per_call_us`` of several functions with their rounds interleaved (a, b, a, b, ...),
    so that load that comes and goes on a shared machine weighs on each alike."""
    loops = {name: _inner_loop(fn, min_time) for name, fn in fns.items()}
    rounds: dict = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            n = loops[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            rounds[name].append((time.perf_counter() - t0) / n * 1e6)
    return {name: statistics.median(r) for name, r in rounds.items()}


def table(rows: list[tuple], headers: tuple) -> str:
    cols = list(zip(*([headers] + [tuple(str(c) for c in r) for r in rows])))
    widths = [max(len(c) for c in col) for col in cols]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*(str(c) for c in r)) for r in rows]
    return "\n".join(lines)


def environment() -> str:
    import os

    import numpy as np
    parts = [f"numpy {np.__version__}"]
    try:
        from threadpoolctl import threadpool_info
        for info in threadpool_info():
            parts.append(f"{info.get('internal_api')} {info.get('version')} "
                         f"({info.get('threading_layer', '')}, {info.get('num_threads')} threads)")
    except ImportError:
        pass
    parts.append(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    return "; ".join(parts)


def rounds() -> int:
    """How many interleaved rounds the per-framework benchmarks run
    (``TESSERA_BENCH_ROUNDS``, default 1): on a busy host, one process per framework at
    different moments sees different loads, and interleaving the frameworks over several
    rounds, keeping each one's median, puts them on the same footing."""
    try:
        return max(1, int(os.environ.get("TESSERA_BENCH_ROUNDS", "1")))
    except ValueError:
        return 1


def run_children(argvs: dict, n_rounds: int | None = None) -> dict:
    """Run ``{framework: argv}`` child processes (each printing one JSON object with
    ``"ms"`` on its last line) in ``n_rounds`` interleaved rounds; per framework, the
    round with the median ``ms`` (or ``{"error": last stderr line}``).

    >>> import sys
    >>> run_children({"a": [sys.executable, "-c", "print('{\\"ms\\": 1.0}')"]}, 1)
    {'a': {'ms': 1.0}}
    """
    import json
    import subprocess
    got: dict = {fw: [] for fw in argvs}
    errors: dict = {}
    for _ in range(n_rounds or rounds()):
        for fw, argv in argvs.items():
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                errors[fw] = {"error": ((proc.stderr.strip().splitlines() or ["?"])[-1])[:90]}
            else:
                got[fw].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    out = {}
    for fw in argvs:
        runs = sorted(got[fw], key=lambda r: r["ms"])
        out[fw] = runs[(len(runs) - 1) // 2] if runs else errors[fw]
    return out

