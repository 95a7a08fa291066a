"""A bar chart of one benchmark run: every framework's time relative to PyTorch eager.

One horizontal group of bars per workload (lower is faster; the line at 1 is PyTorch
eager), drawn from the JSON that ``python -m bench`` writes. Needs matplotlib (the
``bench`` extra).
"""
from __future__ import annotations

COLORS = {"tessera": "#9ecae1", "graph": "#08519c", "torch.compile": "#fd8d3c",
          "jax": "#74c476", "onnxruntime": "#bcbddc"}
LABELS = {"tessera": "tessera eager", "graph": "tessera nn.Graph",
          "torch.compile": "torch.compile", "jax": "JAX jit",
          "onnxruntime": "onnxruntime (tessera's export)"}


def ratios(results: dict) -> list[tuple[str, dict]]:
    """[(workload, {framework: time / PyTorch eager's time})] from a run's results."""
    rows = []
    k = results.get("kernels")
    if k and "error" not in k.get("torch", {}):
        for name, label in (("gemm", "SGEMM 2048^3"), ("triad", "triad 16M"),
                            ("chain", "gelu chain 16M")):
            base = k["torch"].get(name, {}).get("ms")
            if base:
                rows.append((label, {fw: r[name]["ms"] / base for fw, r in k.items()
                                     if fw in COLORS and "ms" in r.get(name, {})}))
    for section, suffix in (("training", " train"), ("models", "")):
        for r in results.get(section, []):
            base = r["torch"].get("ms")
            if base:
                rows.append((r["workload"] + suffix, {fw: r[fw]["ms"] / base for fw in COLORS
                                                      if "ms" in r.get(fw, {})}))
    return rows


def draw(results: dict, path: str) -> bool:
    """Write the chart to ``path`` (PNG, atomically); False when there is nothing to draw."""
    import os

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = ratios(results)
    if not rows:
        return False
    fws = [fw for fw in COLORS if any(fw in r for _, r in rows)]
    height = 0.8 / len(fws)
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(rows) + 1.5))
    for j, fw in enumerate(fws):
        ys = [i + (j - (len(fws) - 1) / 2) * height for i in range(len(rows))]
        ax.barh(ys, [r.get(fw, 0) for _, r in rows], height, color=COLORS[fw],
                label=LABELS[fw])
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("time relative to PyTorch eager (log scale; < 1 is faster)")
    fig.suptitle(f"tessera benchmarks {results.get('date', '')}")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(fws), fontsize="small",
              frameon=False)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return True
