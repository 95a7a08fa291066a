"""einsum: tessera vs torch.einsum vs numpy.einsum(optimize=True), and path quality.

Cases: operand chains where the contraction order matters (4, 5 and 6 operands, and
opt_einsum's tensor-network example), and attention scores ``bhqd,bhkd->bhqk`` at two
sizes, all float32. Every framework runs in its own subprocess (their thread pools never
meet) on the same inputs; times are medians of 7 rounds (``bench.common.per_call_us``).
torch picks its path with opt_einsum when that is installed (it is, in the bench extra),
numpy with its own optimizer.

Path quality: the FLOPs of tessera's path (``tessera.einsum_path``) against the optimum
``opt_einsum.contract_path(..., optimize="optimal")`` finds, counted the same way.
Target: at least as fast as both peers on every case, and the optimal FLOPs.
"""
from __future__ import annotations

import json
import subprocess
import sys

FRAMEWORKS = ("tessera", "torch", "numpy")

CASES = [
    ("chain-4", "ab,bc,cd,de->ae", [(1000, 10), (10, 1000), (1000, 10), (10, 1000)]),
    ("chain-5", "ab,bc,cd,de,ef->af",
     [(64, 512), (512, 8), (8, 512), (512, 512), (512, 64)]),
    ("chain-6", "ab,bc,cd,de,ef,fg->ag",
     [(256, 16), (16, 256), (256, 256), (256, 16), (16, 256), (256, 8)]),
    ("network-5", "ea,fb,abcd,gc,hd->efgh",
     [(16, 24), (16, 24), (24, 24, 24, 24), (16, 24), (16, 24)]),
    ("attention 2x4x64x32", "bhqd,bhkd->bhqk", [(2, 4, 64, 32), (2, 4, 64, 32)]),
    ("attention 8x8x256x64", "bhqd,bhkd->bhqk", [(8, 8, 256, 64), (8, 8, 256, 64)]),
]


def _inputs(shapes):
    import numpy as np
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _framework(name: str):
    """(einsum function, converter from a NumPy array) for one framework."""
    if name == "tessera":
        import tessera
        return tessera.einsum, tessera.from_numpy
    if name == "torch":
        import torch
        return torch.einsum, torch.from_numpy
    import numpy as np
    return (lambda eq, *ops: np.einsum(eq, *ops, optimize=True)), (lambda a: a)


def child(name: str) -> dict:
    """Time every case in this process for one framework: {case: microseconds}."""
    from bench.common import per_call_us
    einsum, convert = _framework(name)
    out = {}
    for case, eq, shapes in CASES:
        ops = [convert(a) for a in _inputs(shapes)]
        out[case] = per_call_us(lambda: einsum(eq, *ops))
    return out


def _flops() -> dict:
    """{case: (tessera's path FLOPs, opt_einsum's optimal FLOPs or None)}."""
    import tessera
    try:
        import opt_einsum
    except ImportError:
        opt_einsum = None
    res = {}
    for case, eq, shapes in CASES:
        metas = [tessera.empty(s, device="meta") for s in shapes]
        _, info = tessera.einsum_path(eq, *metas)
        ref = None
        if opt_einsum is not None:
            import numpy as np
            _, ref_info = opt_einsum.contract_path(eq, *[np.empty(s) for s in shapes],
                                                   optimize="optimal")
            ref = int(ref_info.opt_cost)
        res[case] = (int(info.opt_flops), ref, int(info.naive_flops))
    return res


def _check() -> None:
    """The three frameworks agree on every case (a benchmark of wrong answers is void)."""
    import numpy as np
    import torch

    import tessera
    for case, eq, shapes in CASES:
        arrays = _inputs(shapes)
        ours = tessera.einsum(eq, *map(tessera.from_numpy, arrays)).numpy()
        ref = torch.einsum(eq, *map(torch.from_numpy, arrays)).numpy()
        scale = max(float(np.abs(ref).max()), 1.0)
        if not np.allclose(ours, ref, rtol=1e-3, atol=1e-4 * scale):
            raise AssertionError(f"einsum benchmark: tessera and torch disagree on {case}")


def run() -> list[dict]:
    _check()
    times = {}
    for fw in FRAMEWORKS:
        proc = subprocess.run([sys.executable, "-m", "bench.einsum", "--child", fw],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines() or ["?"]
            raise RuntimeError(f"einsum benchmark, {fw}: {lines[-1]}")
        times[fw] = json.loads(proc.stdout.strip().splitlines()[-1])
    flops = _flops()
    rows = []
    for case, eq, shapes in CASES:
        t, p, n = (times[fw][case] for fw in FRAMEWORKS)
        ours, ref, naive = flops[case]
        rows.append({"case": case, "equation": eq, "shapes": shapes,
                     "tessera_us": t, "torch_us": p, "numpy_us": n,
                     "vs_torch": t / p, "vs_numpy": t / n,
                     "path_flops": ours, "opt_einsum_flops": ref, "naive_flops": naive})
    return rows


def render(rows: list[dict]) -> str:
    from bench.common import table

    def flops(r):
        ref = r["opt_einsum_flops"]
        if ref is None:
            return f"{r['path_flops']:.3g} (opt_einsum not installed)"
        mark = "=" if r["path_flops"] == ref else ("<" if r["path_flops"] < ref else ">")
        return f"{r['path_flops']:.3g} {mark} {ref:.3g}"

    return table([(r["case"], r["equation"], f"{r['tessera_us']:.1f}", f"{r['torch_us']:.1f}",
                   f"{r['numpy_us']:.1f}", f"{r['vs_torch']:.2f}x", f"{r['vs_numpy']:.2f}x",
                   flops(r)) for r in rows],
                 ("case", "equation", "tessera us", "torch us", "numpy us", "vs torch",
                  "vs numpy", "path FLOPs (tessera vs opt_einsum)"))


TITLE = ("einsum, float32 (median of 7; ratio < 1: tessera faster; target <= 1 on every case "
         "and the optimal path)")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
    else:
        print(TITLE)
        print(render(run()))
