"""Timing helpers shared by the benchmark scripts: medians of repeated runs."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def per_call_us(fn: Callable[[], object], repeat: int = 7, min_time: float = 0.05) -> float:
    """Median over ``repeat`` rounds of the mean per-call time in microseconds."""
    fn()
    n = 1
    while True:  # grow the inner loop until one round takes ``min_time``
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 >= min_time or n >= 1 << 20:
            break
        n *= 2
    rounds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(rounds)


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
