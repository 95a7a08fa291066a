"""Timing helpers shared by the benchmark scripts: medians of repeated runs."""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable


def _inner_loop(fn: Callable[[], object], min_time: float,
                clock: Callable[[], float] = time.perf_counter) -> int:
    """Calls per timing round: doubled until one round takes ``min_time``."""
    fn()
    n = 1
    while True:
        t0 = clock()
        for _ in range(n):
            fn()
        if clock() - t0 >= min_time or n >= 1 << 20:
            return n
        n *= 2


def per_call_us(fn: Callable[[], object], repeat: int = 7, min_time: float = 0.05) -> float:
    """Median over ``repeat`` rounds of the mean per-call time in microseconds."""
    return per_call_us_interleaved({"fn": fn}, repeat, min_time)["fn"]


def per_call_us_interleaved(fns: dict, repeat: int = 9, min_time: float = 0.05,
                            clock: Callable[[], float] = time.perf_counter) -> dict:
    """``per_call_us`` of several functions with their rounds interleaved (a, b, a, b, ...),
    so that load that comes and goes on a shared machine weighs on each alike. ``clock``:
    wall time, or e.g. ``time.process_time`` for the CPU time of single-threaded calls
    (what other processes on a loaded host take from the wall clock does not count)."""
    loops = {name: _inner_loop(fn, min_time, clock) for name, fn in fns.items()}
    rounds: dict = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            n = loops[name]
            t0 = clock()
            for _ in range(n):
                fn()
            rounds[name].append((clock() - t0) / n * 1e6)
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


def _cpu_model() -> str:
    """The CPU's name and vector extensions, from /proc/cpuinfo where there is one.

    >>> isinstance(_cpu_model(), str)
    True
    """
    import platform
    name, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not name:
                    name = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    # the instruction sets tessera's kernels dispatch on (CPUID), named as the results say
    isa = (("avx512f", "AVX-512"), ("avx512_vnni", "AVX512-VNNI"), ("avx512_bf16", "AVX512-BF16"),
           ("amx_tile", "AMX"), ("avx2", "AVX2"), ("fma", "FMA"), ("asimd", "NEON"))
    simd = [label for flag, label in isa if flag in flags]
    return name + (f" ({', '.join(simd)})" if simd else "")


def _numpy_blas() -> str:
    """The BLAS NumPy calls: threadpoolctl's view of the loaded library, else NumPy's
    build configuration."""
    import numpy as np
    try:
        from threadpoolctl import threadpool_info
        for info in threadpool_info():
            if info.get("user_api") == "blas" and "numpy" in info.get("filepath", ""):
                return (f"{info.get('internal_api')} {info.get('version')} "
                        f"({info.get('architecture') or 'generic'} kernels, "
                        f"{info.get('num_threads')} threads)")
    except ImportError:
        pass
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # older NumPy: no dict form of its configuration
        return "unknown"


def _version(dist: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def describe() -> list[str]:
    """The host and the software a run measured: CPU, cores, NumPy's BLAS and the versions
    of the frameworks compared (a peer that is not installed is left out).

    >>> lines = describe()
    >>> [line.split(":")[0] for line in lines]
    ['CPU', 'BLAS (NumPy)', 'software']
    """
    import platform

    import numpy as np
    cores = os.cpu_count()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = cores
    cpu = f"CPU: {_cpu_model()}, {cores} logical cores"
    if usable != cores:
        cpu += f" ({usable} usable by this process)"
    soft = [f"Python {platform.python_version()}", f"NumPy {np.__version__}"]
    for label, dist in (("tessera", "tessera"), ("PyTorch", "torch"), ("JAX", "jax"),
                        ("onnxruntime", "onnxruntime")):
        v = _version(dist)
        if v is not None:
            soft.append(f"{label} {v}")
    return [cpu, f"BLAS (NumPy): {_numpy_blas()}", "software: " + ", ".join(soft)]


def write_results(path: str, sections: list[tuple[str, str | None, str]],
                  header: list[str], order: tuple[str, ...] = ()) -> None:
    """Write a run's tables as Markdown to ``path``, atomically (a temporary file beside it,
    then ``os.replace``): ``header`` lines as a list, then per section its name, its title
    and its table as printed. A section of the file that this run did not run is kept,
    marked with the header of the run that wrote it (a partial ``make bench SECTIONS=...``
    then updates its sections only); ``order`` is the order of sections in the file.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> write_results(os.path.join(d, "R.md"), [("demo", "A title", "a  b")], ["CPU: x"])
    >>> print(open(os.path.join(d, "R.md")).read())  # doctest: +NORMALIZE_WHITESPACE
    # Benchmark results
    <BLANKLINE>
    Written by `make bench` (`python -m bench demo`).
    <BLANKLINE>
    - CPU: x
    <BLANKLINE>
    ## demo
    <BLANKLINE>
    A title
    <BLANKLINE>
    ```text
    a  b
    ```
    <BLANKLINE>
    >>> write_results(os.path.join(d, "R.md"), [("other", None, "c")], ["CPU: y"],
    ...               ("demo", "other"))
    >>> print(open(os.path.join(d, "R.md")).read())  # doctest: +NORMALIZE_WHITESPACE
    # Benchmark results
    <BLANKLINE>
    Written by `make bench` (`python -m bench other`).
    <BLANKLINE>
    - CPU: y
    <BLANKLINE>
    ## demo
    <BLANKLINE>
    Kept from an earlier run (CPU: x).
    <BLANKLINE>
    A title
    <BLANKLINE>
    ```text
    a  b
    ```
    <BLANKLINE>
    ## other
    <BLANKLINE>
    ```text
    c
    ```
    <BLANKLINE>
    """
    names = " ".join(name for name, _, _ in sections)
    blocks = {}
    for name, title, text in sections:
        lines = [f"## {name}", ""]
        if title:
            lines += [title, ""]
        blocks[name] = lines + ["```text", text.rstrip("\n"), "```", ""]
    for name, lines in _earlier_sections(path).items():
        blocks.setdefault(name, lines)
    rank = {name: i for i, name in enumerate(order)}
    lines = ["# Benchmark results", "",
             f"Written by `make bench` (`python -m bench {names}`).", ""]
    lines += [f"- {h}" for h in header] + [""]
    for name in sorted(blocks, key=lambda k: rank.get(k, len(rank))):
        lines += blocks[name]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines))
    os.replace(tmp, path)


def _earlier_sections(path: str) -> dict[str, list[str]]:
    """The sections of an existing results file, each marked with the CPU of the run that
    wrote it (a section kept before keeps its mark)."""
    try:
        with open(path) as f:
            old = f.read().split("\n")
    except OSError:
        return {}
    cpu = next((ln[2:] for ln in old if ln.startswith("- CPU:")), "")
    mark = f"Kept from an earlier run{f' ({cpu})' if cpu else ''}."
    out: dict[str, list[str]] = {}
    name, fenced = None, False
    for ln in old:
        fenced ^= ln.startswith("```")
        # a "## " line right under a section's heading is its title (int8's, deploy's)
        if ln.startswith("## ") and not fenced and (name is None or any(
                x and not x.startswith("Kept from") for x in out[name][1:])):
            name = ln[3:].strip()
            out[name] = [ln, ""]
            continue
        if name is None or (not out[name][-1] and not ln and len(out[name]) == 2):
            continue
        out[name].append(ln)
    for lines in out.values():
        if not any(ln.startswith("Kept from an earlier run") for ln in lines):
            lines[2:2] = [mark, ""]
        while len(lines) > 2 and lines[-1] == "":
            lines.pop()
        lines.append("")
    return out


def rounds(default: int = 1) -> int:
    """How many interleaved rounds the per-framework benchmarks run (``TESSERA_BENCH_ROUNDS``,
    else ``default``; training and the model zoo take 3): on a busy host, one process per
    framework at different moments sees different loads, and interleaving the frameworks over
    several rounds, keeping each one's median and the median of the per-round ratios, puts
    them on the same footing."""
    try:
        return max(1, int(os.environ.get("TESSERA_BENCH_ROUNDS", str(default))))
    except ValueError:
        return default


def run_children(argvs: dict, n_rounds: int | None = None) -> dict:
    """Run ``{framework: argv}`` child processes (each printing one JSON object with
    ``"ms"`` on its last line) in ``n_rounds`` interleaved rounds (a, b, c, a, b, c, ...);
    per framework, the round with the median ``ms`` (or ``{"error": last stderr line}``),
    with every round's ``ms`` in order under ``"rounds_ms"`` (``None`` for a failed round)
    for :func:`round_ratio`.

    >>> import sys
    >>> run_children({"a": [sys.executable, "-c", "print('{\\"ms\\": 1.0}')"]}, 1)
    {'a': {'ms': 1.0, 'rounds_ms': [1.0]}}
    """
    import json
    import subprocess
    got: dict = {fw: [] for fw in argvs}
    per_round: dict = {fw: [] for fw in argvs}
    errors: dict = {}
    for _ in range(n_rounds or rounds()):
        for fw, argv in argvs.items():
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                errors[fw] = {"error": ((proc.stderr.strip().splitlines() or ["?"])[-1])[:90]}
                per_round[fw].append(None)
            else:
                got[fw].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                per_round[fw].append(got[fw][-1]["ms"])
    out = {}
    for fw in argvs:
        runs = sorted(got[fw], key=lambda r: r["ms"])
        out[fw] = ({**runs[(len(runs) - 1) // 2], "rounds_ms": per_round[fw]} if runs
                   else errors[fw])
    return out


def round_ratio(row: dict, num: str, peers: tuple) -> tuple[float, str] | None:
    """The median over rounds of ``row[num]``'s time divided by the best of ``peers`` in
    the same round (rounds where ``num`` or every peer failed are skipped), and the peer
    that was best most often; ``None`` without such a round. A ratio within one round
    compares processes that ran moments apart, under the same load.

    >>> row = {"g": {"rounds_ms": [10.0, 30.0, 12.0]}, "p": {"rounds_ms": [20.0, 20.0, 12.0]},
    ...        "q": {"rounds_ms": [None, 60.0, 24.0]}}
    >>> round_ratio(row, "g", ("p", "q"))
    (1.0, 'p')
    """
    import collections
    ratios, best = [], collections.Counter()
    n = len(row.get(num, {}).get("rounds_ms", []))
    for i in range(n):
        mine = row[num]["rounds_ms"][i]
        theirs = [(row[p]["rounds_ms"][i], p) for p in peers
                  if p in row and i < len(row[p].get("rounds_ms", []))
                  and row[p]["rounds_ms"][i] is not None]
        if mine is None or not theirs:
            continue
        ms, who = min(theirs)
        ratios.append(mine / ms)
        best[who] += 1
    if not ratios:
        return None
    return statistics.median(ratios), best.most_common(1)[0][0]
