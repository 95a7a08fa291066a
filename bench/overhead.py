"""Per-op overhead of eager mode: tiny ops where the framework, not the math, is the cost,
and the small-tensor expressions small models spend their steps in (GPT's tanh GELU).

Target: tessera's per-op overhead at most 3x PyTorch's.
"""
from __future__ import annotations

import numpy as np

from bench.common import per_call_us_interleaved, table


def cases(lib):
    a, b = lib.ones(1), lib.ones(1)
    m = lib.from_numpy(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32))
    x = lib.ones(16, requires_grad=True)
    y = lib.ones(16, requires_grad=True)

    g = lib.from_numpy(np.random.default_rng(1).standard_normal((64, 512)).astype(np.float32))

    def gelu_tanh():  # GPT-2's GELU as written in minGPT/nanoGPT: pow(x, 3.0) on small tensors
        return 0.5 * g * (1.0 + lib.tanh(0.7978845608 * (g + 0.044715 * lib.pow(g, 3.0))))

    def expr_backward():
        ((x * y + x).exp()).sum().backward()

    return {
        "add, 1 element": lambda: a + b,
        "matmul 64x64": lambda: m @ m,
        "3-op expression + backward": expr_backward,
        "sum of 1 element": lambda: a.sum(),
        "view + transpose": lambda: m.view(32, 128).t(),
        "tanh GELU, 64x512": gelu_tanh,
    }


def run() -> list[dict]:
    import torch

    import tessera
    torch.set_num_threads(max(1, torch.get_num_threads()))
    ours, theirs = cases(tessera), cases(torch)
    results = []
    for name in ours:  # each case's rounds alternate between the two frameworks
        us = per_call_us_interleaved({"tessera": ours[name], "torch": theirs[name]})
        t_us, p_us = us["tessera"], us["torch"]
        results.append({"case": name, "tessera_us": t_us, "torch_us": p_us,
                        "ratio": t_us / p_us})
    return results


def render(res: list[dict]) -> str:
    return table([(r["case"], f"{r['tessera_us']:.2f}", f"{r['torch_us']:.2f}",
                   f"{r['ratio']:.2f}x") for r in res],
                 ("case", "tessera us", "torch us", "ratio"))


TITLE = ("Eager per-call overhead (median of 9 interleaved rounds; lower is better; target "
         "ratio <= 3)")

if __name__ == "__main__":
    print(TITLE)
    print(render(run()))
