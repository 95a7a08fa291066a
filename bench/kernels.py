"""The physical limits and one fused chain, for every framework in one run.

- SGEMM 2048^3: GFLOP/s (2 n^3 flops per call);
- STREAM-like triad ``a = b + s*c`` on 16M float32: GB/s counting 12 bytes per element
  (read b, read c, write a), the least traffic any implementation can have;
- the chain ``y = gelu(x*a + b) * sigmoid(x)`` (exact, erf GELU) on 16M float32: ms, and
  GB/s counting 8 bytes per element (read x, write y). A framework that fuses the chain
  into one loop approaches the triad's bandwidth; one that writes every intermediate
  moves ~6x more memory.

The ``nchwc_winograd`` case (``python -m bench.kernels nchwc_winograd``) times ResNet-18's
3x3 stride-1 layers at batch 1 and 8 as the blocked direct convolution and as its Winograd
F(4x4, 3x3) plan (the nchwc pass's rule comes from it).

The ``nchwc`` case (``python -m bench.kernels nchwc`` alone) times tessera's blocked-layout
convolutions (``tessera.kernels.nchwc``) layer by layer on ResNet-18's and MobileNetV2's
convolutions at batch 1, against tessera's current path (``tessera.nn.functional.conv2d``)
and PyTorch's, and then ResNet-18's whole trunk as a chain of them: CPU time, one thread,
the three interleaved in one process (medians).

Every framework runs in its own subprocess (their thread pools never meet) on the same
inputs (NumPy, seed 0), timing the median of ``REPEAT`` calls after warm-up. Frameworks
that are not installed or do not work on the host (torch.compile needs a C++
toolchain; JAX is an optional extra) print "-" and the reason.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time

FRAMEWORKS = ("numpy", "tessera", "graph", "torch", "torch.compile", "jax")
N_GEMM, N_STREAM, REPEAT = 2048, 1 << 24, 10
A, B, S = 1.5, 0.25, 3.0  # the chain's and the triad's scalars


def _inputs():
    import numpy as np
    rng = np.random.default_rng(0)
    f32 = np.float32
    return {"gemm": (rng.standard_normal((N_GEMM, N_GEMM), f32),
                     rng.standard_normal((N_GEMM, N_GEMM), f32)),
            "triad": (rng.standard_normal(N_STREAM, f32), rng.standard_normal(N_STREAM, f32)),
            "chain": (rng.standard_normal(N_STREAM, f32),)}


def _numpy():
    import numpy as np
    from scipy.special import erf

    def chain(x):
        h = x * np.float32(A) + np.float32(B)
        g = np.float32(0.5) * h * (np.float32(1) + erf(h * np.float32(1 / math.sqrt(2))))
        return g / (np.float32(1) + np.exp(-x))
    return {"gemm": np.matmul, "triad": lambda b, c: b + np.float32(S) * c,
            "chain": chain}, (lambda a: a), None


def _tessera(graph: bool):
    import tessera
    F = tessera.nn.functional

    def chain(x):
        return F.gelu(x * A + B) * tessera.sigmoid(x)
    fns = {"gemm": tessera.matmul, "triad": lambda b, c: b + S * c, "chain": chain}
    if graph:
        def compiled(fn):
            class G(tessera.nn.Graph):
                def build(self, *args):
                    return fn(*args)
            return G()
        fns = {k: compiled(f) for k, f in fns.items()}
    return fns, tessera.from_numpy, None


def _torch(compiled: bool):
    import torch
    F = torch.nn.functional

    def chain(x):
        return F.gelu(x * A + B) * torch.sigmoid(x)
    fns = {"gemm": torch.matmul, "triad": lambda b, c: b + S * c, "chain": chain}
    if compiled:
        fns = {k: torch.compile(f) for k, f in fns.items()}
    return fns, torch.from_numpy, None


def _jax():
    import jax
    import jax.numpy as jnp

    def chain(x):
        return jax.nn.gelu(x * A + B, approximate=False) * jax.nn.sigmoid(x)
    fns = {"gemm": jnp.matmul, "triad": lambda b, c: b + S * c, "chain": chain}
    return ({k: jax.jit(f) for k, f in fns.items()}, jax.device_put,
            lambda y: y.block_until_ready())


def _threads(framework: str) -> int:
    if framework.startswith("torch"):
        import torch
        return torch.get_num_threads()
    if framework in ("tessera", "graph"):
        import tessera
        return tessera.get_num_threads()
    if framework == "numpy":
        from threadpoolctl import threadpool_info
        return max((i["num_threads"] for i in threadpool_info()), default=1)
    return os.cpu_count() or 1  # XLA's CPU client: one intra-op thread per core


def child(framework: str) -> dict:
    """Time every kernel in this process for one framework; results as a dict."""
    make = {"numpy": _numpy, "tessera": lambda: _tessera(False),
            "graph": lambda: _tessera(True), "torch": lambda: _torch(False),
            "torch.compile": lambda: _torch(True), "jax": _jax}[framework]
    fns, convert, sync = make()
    sync = sync or (lambda y: y)
    out = {"threads": _threads(framework)}
    for name, arrays in _inputs().items():
        args = [convert(a) for a in arrays]
        try:
            t0 = time.perf_counter()
            sync(fns[name](*args))
            first = time.perf_counter() - t0
            sync(fns[name](*args))
            times = []
            for _ in range(REPEAT):
                t0 = time.perf_counter()
                sync(fns[name](*args))
                times.append(time.perf_counter() - t0)
            out[name] = {"ms": statistics.median(times) * 1e3, "first_s": first}
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
            out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"}
    if framework == "graph" and "ms" in out["chain"]:
        out["chain_ns_in_cache"] = _chain_in_cache(fns["chain"])
    return out


def _chain_in_cache(graph, n: int = 1 << 15) -> float | None:
    """ns per element of the graph's fused chain loop on ``n`` floats that stay in L2, on
    one core (thread CPU time; the loop is too short to be split): the arithmetic alone,
    with no memory traffic to wait for. The time of a call on ``n // 32`` elements is
    subtracted from that on ``n`` (what a call costs besides its loop). Times half the
    cores' count of elements is the least time the chain can take on the host however
    fast its memory."""
    import numpy as np

    import tessera
    per_call = []
    for size in (n // 32, n):
        x = np.random.default_rng(0).standard_normal(size, np.float32)
        graph(tessera.from_numpy(x))  # compiles the chain for this size
        kernels = list(graph._current().executor.generated.values())
        if len(kernels) != 1:
            return None
        kernel, y = kernels[0], np.empty_like(x)
        reps, runs = max(1, (1 << 23) // n), []
        for _ in range(7):
            t0 = time.thread_time()
            for _ in range(reps):
                kernel(y, x)
            runs.append((time.thread_time() - t0) / reps)
        per_call.append(statistics.median(runs))
    return (per_call[1] - per_call[0]) / (n - n // 32) * 1e9


def run() -> dict:
    """Every framework's child, interleaved over ``TESSERA_BENCH_ROUNDS`` rounds; per
    framework and kernel, the round with the median time."""
    from bench.common import rounds
    runs: dict = {fw: [] for fw in FRAMEWORKS}
    res: dict = {}
    for _ in range(rounds()):
        for fw in FRAMEWORKS:
            proc = subprocess.run([sys.executable, "-m", "bench.kernels", "--child", fw],
                                  capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                lines = proc.stderr.strip().splitlines() or ["?"]
                res[fw] = {"error": lines[-1][:100]}
            else:
                runs[fw].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for fw, got in runs.items():
        if not got:
            continue
        res[fw] = out = dict(got[0])
        for name in ("gemm", "triad", "chain"):
            timed = sorted((r[name] for r in got if "ms" in r[name]), key=lambda t: t["ms"])
            if timed:
                out[name] = timed[(len(timed) - 1) // 2]
        ns = sorted(r["chain_ns_in_cache"] for r in got if r.get("chain_ns_in_cache"))
        if ns:
            out["chain_ns_in_cache"] = ns[(len(ns) - 1) // 2]
    res["nchwc"] = nchwc_run()
    return res


# ---- nchwc: the blocked-layout convolutions, per layer and as ResNet-18's trunk ---------

# (name, c, h, o, k, stride, pad, groups, plain input, activation): each layer at batch 1;
# activation as the network's (the blocked kernel applies it in registers, the others run
# the convolution with its bias only)
NCHWC_LAYERS = (
    ("resnet18 conv1 7x7/2", 3, 224, 64, 7, 2, 3, 1, True, "relu"),
    ("resnet18 3x3 64 56", 64, 56, 64, 3, 1, 1, 1, False, "relu"),
    ("resnet18 3x3/2 64-128", 64, 56, 128, 3, 2, 1, 1, False, "relu"),
    ("resnet18 3x3 128 28", 128, 28, 128, 3, 1, 1, 1, False, "relu"),
    ("resnet18 1x1/2 64-128", 64, 56, 128, 1, 2, 0, 1, False, None),
    ("resnet18 3x3/2 128-256", 128, 28, 256, 3, 2, 1, 1, False, "relu"),
    ("resnet18 3x3 256 14", 256, 14, 256, 3, 1, 1, 1, False, "relu"),
    ("resnet18 3x3/2 256-512", 256, 14, 512, 3, 2, 1, 1, False, "relu"),
    ("resnet18 3x3 512 7", 512, 7, 512, 3, 1, 1, 1, False, "relu"),
    ("resnet18 1x1/2 256-512", 256, 14, 512, 1, 2, 0, 1, False, None),
    ("mobilenetv2 3x3/2 3-32", 3, 224, 32, 3, 2, 1, 1, True, "relu6"),
    ("mobilenetv2 dw 32 112", 32, 112, 32, 3, 1, 1, 32, False, "relu6"),
    ("mobilenetv2 1x1 32-16 112", 32, 112, 16, 1, 1, 0, 1, False, None),
    ("mobilenetv2 1x1 16-96 112", 16, 112, 96, 1, 1, 0, 1, False, "relu6"),
    ("mobilenetv2 dw/2 96 112", 96, 112, 96, 3, 2, 1, 96, False, "relu6"),
    ("mobilenetv2 1x1 96-24 56", 96, 56, 24, 1, 1, 0, 1, False, None),
    ("mobilenetv2 1x1 24-144 56", 24, 56, 144, 1, 1, 0, 1, False, "relu6"),
    ("mobilenetv2 dw 144 56", 144, 56, 144, 3, 1, 1, 144, False, "relu6"),
    ("mobilenetv2 dw/2 144 56", 144, 56, 144, 3, 2, 1, 144, False, "relu6"),
    ("mobilenetv2 1x1 144-32 28", 144, 28, 32, 1, 1, 0, 1, False, None),
    ("mobilenetv2 dw 384 14", 384, 14, 384, 3, 1, 1, 384, False, "relu6"),
    ("mobilenetv2 1x1 384-64 14", 384, 14, 64, 1, 1, 0, 1, False, None),
    ("mobilenetv2 1x1 576-96 14", 576, 14, 96, 1, 1, 0, 1, False, None),
    ("mobilenetv2 dw 960 7", 960, 7, 960, 3, 1, 1, 960, False, "relu6"),
    ("mobilenetv2 1x1 960-160 7", 960, 7, 160, 1, 1, 0, 1, False, None),
    ("mobilenetv2 1x1 320-1280 7", 320, 7, 1280, 1, 1, 0, 1, False, "relu6"),
)
NCHWC_REPEAT = 15


def _cpu_ms(fn, seconds: float = 0.02):
    """A timer of ``fn``: each call returns one sample of its CPU time in ms (process time,
    so a loaded host's waiting is not counted), averaged over enough calls for ``seconds``."""
    fn()
    t0 = time.process_time()
    fn()
    reps = max(1, int(seconds / max(time.process_time() - t0, 1e-6)))

    def sample() -> float:
        t0 = time.process_time()
        for _ in range(reps):
            fn()
        return (time.process_time() - t0) / reps * 1e3
    return sample


def _interleaved(timers: dict) -> dict:
    """Each timer's median over NCHWC_REPEAT rounds, the timers taking turns."""
    runs: dict = {k: [] for k in timers}
    for _ in range(NCHWC_REPEAT):
        for k, sample in timers.items():
            runs[k].append(sample())
    return {k: statistics.median(v) for k, v in runs.items()}


def _nchwc_layer(N, torch, tessera, layer, rng) -> dict:
    import numpy as np
    name, c, h, o, k, s, p, g, plain, act = layer
    B = N.block()
    x = rng.standard_normal((1, c, h, h), np.float32)
    w = rng.standard_normal((o, c // g, k, k), np.float32) * (2.0 / (c // g * k * k)) ** 0.5
    b = rng.standard_normal(o, np.float32)
    oh = N.conv_output_size(h, k, s, p, p, 1)
    run = N.conv_bound(x.shape, (1, o, oh, oh), w.shape, s, p, 1, g, B, plain, act)
    wp = N.pack_weights(w, groups=g, block=B, plain_input=plain)
    xb = x if plain else N.to_blocked(x, B)
    y = np.empty(N.blocked_shape((1, o, oh, oh), B), np.float32)
    tx, tw, tb = (tessera.from_numpy(a) for a in (x, w, b))
    px, pw, pb = (torch.from_numpy(a) for a in (x, w, b))
    F, TF = tessera.nn.functional, torch.nn.functional
    got = _cpu_ms(lambda: run(xb, wp, b, None, y))
    return {"name": name, "gflop": 2 * o * (c // g) * k * k * oh * oh / 1e9,
            **_interleaved({"nchwc": got,
                            "tessera": _cpu_ms(lambda: F.conv2d(tx, tw, tb, s, p, 1, g)),
                            "torch": _cpu_ms(lambda: TF.conv2d(px, pw, pb, s, p, 1, g))})}


def _resnet18_spec() -> list:
    """ResNet-18's convolutional trunk (batch norm folded into the convolutions' bias) as
    steps for ``_trunk``: ("conv", source, c, o, k, stride, pad, groups, activation,
    residual source), ("maxpool", source, k, stride, pad), ("gap", source); a source is a
    step's index, -1 the input."""
    steps: list = [("conv", -1, 3, 64, 7, 2, 3, 1, "relu", None), ("maxpool", 0, 3, 2, 1)]
    c = 64
    for o, s in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
                 (512, 1)):
        src, ident = len(steps) - 1, len(steps) - 1
        if s != 1 or c != o:
            steps.append(("conv", src, c, o, 1, s, 0, 1, None, None))   # the downsample
            ident = len(steps) - 1
        steps.append(("conv", src, c, o, 3, s, 1, 1, "relu", None))
        # relu(conv + bias + identity): the residual before the activation
        steps.append(("conv", len(steps) - 1, o, o, 3, 1, 1, 1, "relu", ident))
        c = o
    steps.append(("gap", len(steps) - 1))
    return steps


def _mobilenet_v2_spec() -> list:
    """MobileNetV2's convolutional trunk, as ``_resnet18_spec``: inverted residual blocks
    (1x1 expansion, 3x3 depthwise, 1x1 projection with the block's input added after it)."""
    steps: list = [("conv", -1, 3, 32, 3, 2, 1, 1, "relu6", None)]
    c = 32
    for t, o, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride, src, hidden = s if i == 0 else 1, len(steps) - 1, c * t
            if t != 1:
                steps.append(("conv", len(steps) - 1, c, hidden, 1, 1, 0, 1, "relu6", None))
            steps.append(("conv", len(steps) - 1, hidden, hidden, 3, stride, 1, hidden,
                          "relu6", None))
            res = src if stride == 1 and c == o else None
            steps.append(("conv", len(steps) - 1, hidden, o, 1, 1, 0, 1, None, res))
            c = o
    steps.append(("conv", len(steps) - 1, c, 1280, 1, 1, 0, 1, "relu6", None))
    steps.append(("gap", len(steps) - 1))
    return steps


def _trunk(N, torch, tessera, rng, steps: list) -> dict:
    """A network's trunk at batch 1 (224 x 224) three ways: blocked kernels (buffers
    allocated once, as a compiled graph's arena; the first layer reads the plain input, the
    residuals and activations run in the convolutions' registers), tessera's functional ops
    and PyTorch's. Returns {way: timer}, after checking the blocked result against PyTorch."""
    import numpy as np
    B = N.block()
    shapes, params, calls = [], [], []   # (c, h) per step; (w, b); the blocked calls
    x = rng.standard_normal((1, 3, 224, 224), np.float32)
    for step in steps:
        kind, src = step[0], step[1]
        c, h = (3, 224) if src < 0 else shapes[src]
        if kind == "conv":
            _, _, ci, o, k, s, p, g, act, res = step
            w = rng.standard_normal((o, ci // g, k, k), np.float32) * (2 / (ci // g * k * k)) ** .5
            b = rng.standard_normal(o, np.float32) * 0.1
            oh = N.conv_output_size(h, k, s, p, p, 1)
            run = N.conv_bound((1, ci, h, h), (1, o, oh, oh), w.shape, s, p, 1, g, B, src < 0,
                               act, residual_first=act == "relu")
            params.append((w, b))
            calls.append((run, N.pack_weights(w, groups=g, block=B, plain_input=src < 0), b))
            shapes.append((o, oh))
        else:
            k, s, p = (h, 1, 0) if kind == "gap" else step[2:]
            oh = N.conv_output_size(h, k, s, p, p, 1)
            params.append(None)
            calls.append((N.pool_bound((1, c, h, h), k, s, p, "avg" if kind == "gap" else "max",
                                       True, B),))
            shapes.append((c, oh))
    # an arena's reuse: a step's output takes a buffer of its shape freed by the steps
    # before it (its sources' last use). A fresh buffer per step would make every layer
    # write cold memory (MobileNetV2's trunk 8% slower)
    last = {}
    for i, step in enumerate(steps):
        for src in (step[1], step[9] if step[0] == "conv" else None):
            if src is not None and src >= 0:
                last[src] = i
    free: dict = {}
    outs = []
    for i, (c, h) in enumerate(shapes):
        shape = N.blocked_shape((1, c, h, h), B)
        outs.append(free.get(shape, []).pop() if free.get(shape) else
                    np.empty(shape, np.float32))
        for src, end in last.items():
            if end == i:
                free.setdefault(outs[src].shape, []).append(outs[src])

    def blocked():
        for i, step in enumerate(steps):
            src = x if step[1] < 0 else outs[step[1]]
            if step[0] == "conv":
                run, wp, b = calls[i]
                run(src, wp, b, None if step[9] is None else outs[step[9]], outs[i])
            else:
                calls[i][0](src, outs[i])
        return outs[-1]

    def functional(F, asarray):
        ws = [None if q is None else (asarray(q[0]), asarray(q[1])) for q in params]
        xt = asarray(x)

        def net():
            vals: list = []
            for i, step in enumerate(steps):
                src = xt if step[1] < 0 else vals[step[1]]
                if step[0] == "conv":
                    _, _, _, _, _, s, p, g, act, res = step
                    t = F.conv2d(src, *ws[i], s, p, 1, g)
                    if res is not None and act == "relu":
                        t = t + vals[res]
                    t = F.relu(t) if act == "relu" else F.relu6(t) if act == "relu6" else t
                    if res is not None and act != "relu":
                        t = t + vals[res]
                elif step[0] == "maxpool":
                    t = F.max_pool2d(src, *step[2:])
                else:
                    t = F.adaptive_avg_pool2d(src, 1)
                vals.append(t)
            return vals[-1]
        return net
    torch_net = functional(torch.nn.functional, torch.from_numpy)
    tessera_net = functional(tessera.nn.functional, tessera.from_numpy)
    want = torch_net().numpy()
    got = N.from_blocked(blocked(), shapes[-1][0])
    if not np.allclose(got, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max())):
        raise AssertionError("the blocked trunk differs from PyTorch's")
    return {"nchwc": _cpu_ms(blocked, 0.1), "tessera": _cpu_ms(tessera_net, 0.1),
            "torch": _cpu_ms(torch_net, 0.1)}


def nchwc_child() -> dict:
    """Every layer and the trunk, one thread, in this process."""
    import numpy as np
    import torch

    import tessera
    from tessera.kernels import nchwc as N
    torch.set_num_threads(1)
    tessera.set_num_threads(1)
    rng = np.random.default_rng(0)
    out = {"isa": N.isa(), "block": N.block(),
           "layers": [_nchwc_layer(N, torch, tessera, layer, rng) for layer in NCHWC_LAYERS]}
    for name, spec in (("resnet18 trunk", _resnet18_spec()),
                       ("mobilenetv2 trunk", _mobilenet_v2_spec())):
        out[name] = _interleaved(_trunk(N, torch, tessera, rng, spec))
    return out


def nchwc_run() -> dict:
    proc = subprocess.run([sys.executable, "-m", "bench.kernels", "--nchwc-child"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": ((proc.stderr.strip().splitlines() or ["?"])[-1])[:100]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def nchwc_render(res: dict) -> str:
    from bench.common import table
    if "error" in res:
        return f"nchwc: {res['error']}"
    rows = []
    for r in res["layers"]:
        gf = r["gflop"]
        rows.append((r["name"], f"{gf:.3f}", *(f"{r[k]:.3f}" for k in ("nchwc", "tessera",
                                                                       "torch")),
                     *(f"{gf / r[k] * 1e3:.0f}" for k in ("nchwc", "tessera", "torch")),
                     f"{r['tessera'] / r['nchwc']:.2f}x", f"{r['torch'] / r['nchwc']:.2f}x"))
    for name, gflop in (("resnet18 trunk", 3.63), ("mobilenetv2 trunk", 0.60)):
        t = res[name]
        rows.append((name, f"{gflop:.2f}", *(f"{t[k]:.2f}" for k in ("nchwc", "tessera",
                                                                    "torch")),
                     *(f"{gflop / t[k] * 1e3:.0f}" for k in ("nchwc", "tessera", "torch")),
                     f"{t['tessera'] / t['nchwc']:.2f}x", f"{t['torch'] / t['nchwc']:.2f}x"))
    return (f"blocked kernels: {res['isa']}, B = {res['block']}\n" +
            table(rows, ("layer (batch 1)", "GFLOP", "nchwc ms", "tessera ms", "torch ms",
                         "nchwc GFLOP/s", "tessera", "torch", "tessera / nchwc",
                         "torch / nchwc")))


# ResNet-18's 3x3 stride-1 layers (channels, size), at batch 1 and 8: the blocked direct
# convolution against its Winograd F(4x4, 3x3) plan (the nchwc pass's rule, WINOGRAD_MIN_*)
WINOGRAD_LAYERS = ((64, 56), (128, 28), (256, 14), (512, 7))


def winograd_child() -> dict:
    """Each layer direct and as Winograd (planned, and with the products' other register
    tiles), one thread, CPU time, interleaved."""
    import numpy as np

    import tessera
    from tessera.kernels import nchwc as N
    tessera.set_num_threads(1)
    rng = np.random.default_rng(0)
    B = N.block()
    tiles = ((2, 14), (1, 16)) if B == 16 else ((1, 12), (4, 3))
    rows = []
    for n in (1, 8):
        for c, h in WINOGRAD_LAYERS:
            x = rng.standard_normal((n, c, h, h), np.float32)
            w = rng.standard_normal((c, c, 3, 3), np.float32) * (2.0 / (9 * c)) ** 0.5
            b = rng.standard_normal(c, np.float32)
            xb = N.to_blocked(x, B)
            y = np.empty(N.blocked_shape(x.shape, B), np.float32)
            timers = {}
            for name, wino, tile in [("direct", False, None), ("winograd", True, None)] + \
                    [(f"{a}x{t}", True, (a, t, 0, 0)) for a, t in tiles]:
                run = N.conv_bound(x.shape, x.shape, w.shape, 1, 1, 1, 1, B, False, "relu",
                                   winograd=wino, _tiles=tile)
                wp = N.pack_weights(w, groups=1, block=B, winograd=wino)
                timers[name] = _cpu_ms(lambda run=run, wp=wp: run(xb, wp, b, None, y))
            rows.append({"layer": f"b{n} {c}ch {h}x{h}", **_interleaved(timers)})
    return {"isa": N.isa(), "block": B, "rows": rows}


def winograd_render(res: dict) -> str:
    from bench.common import table
    keys = [k for k in res["rows"][0] if k != "layer"]
    rows = [(r["layer"], *(f"{r[k]:.3f}" for k in keys),
             f"{r['direct'] / r['winograd']:.2f}x") for r in res["rows"]]
    return (f"blocked kernels: {res['isa']}, B = {res['block']}\n" +
            table(rows, ("layer", *(f"{k} ms" for k in keys), "direct / winograd")))


NCHWC_TITLE = ("Blocked-layout (NCHWc) convolutions, one thread, CPU time (median of "
               f"{NCHWC_REPEAT} interleaved): per layer (convolution + bias; the blocked "
               "kernel also applies the activation) and the ResNet-18 and MobileNetV2 trunks")


def render(res: dict) -> str:
    from bench.common import table
    nchwc = res.get("nchwc")
    res = {k: v for k, v in res.items() if k != "nchwc"}
    gemm_flop = 2 * N_GEMM ** 3
    triad_bytes, chain_bytes = 12 * N_STREAM, 8 * N_STREAM
    triads = [r["triad"]["ms"] for r in res.values() if "ms" in r.get("triad", {})]
    best_triad = triad_bytes / min(triads) / 1e6 if triads else float("nan")
    torch_chain = res.get("torch", {}).get("chain", {}).get("ms")
    rows, notes = [], []
    for fw, r in res.items():
        if "error" in r:
            rows.append((fw, "-", "-", "-", "-", "-", "-"))
            notes.append(f"{fw}: {r['error']}")
            continue
        cells = [fw, str(r["threads"])]
        g, t, c = r["gemm"], r["triad"], r["chain"]
        cells.append(f"{gemm_flop / g['ms'] / 1e6:.0f}" if "ms" in g else "-")
        cells.append(f"{triad_bytes / t['ms'] / 1e6:.1f}" if "ms" in t else "-")
        if "ms" in c:
            gbs = chain_bytes / c["ms"] / 1e6
            cells += [f"{c['ms']:.1f}", f"{gbs:.1f} ({100 * gbs / best_triad:.0f}%)",
                      f"{c['ms'] / torch_chain:.2f}x" if torch_chain else "-"]
        else:
            cells += ["-", "-", "-"]
        for name in ("gemm", "triad", "chain"):
            if "error" in r[name]:
                notes.append(f"{fw} {name}: {r[name]['error']}")
        rows.append(tuple(cells))
    text = table(rows, ("framework", "threads", "SGEMM GFLOP/s", "triad GB/s", "chain ms",
                        "chain GB/s (% of triad)", "chain vs torch"))
    g = res.get("graph", {})
    if g.get("chain_ns_in_cache"):
        ns, cores = g["chain_ns_in_cache"], g["threads"]
        notes.append(f"graph chain's loop with its data in L2: {ns:.2f} ns/element on one "
                     f"core, so at least {ns * N_STREAM / cores / 1e6:.1f} ms for "
                     f"{N_STREAM >> 20}M floats on {cores} (arithmetic alone); 60% of the "
                     f"best triad is {chain_bytes / (0.6 * best_triad) / 1e6:.1f} ms")
    text += "".join(f"\n  {n}" for n in notes)
    if nchwc is not None:
        text += "\n\n" + NCHWC_TITLE + "\n" + nchwc_render(nchwc)
    return text


TITLE = (f"Physical limits and a fused chain (median of {REPEAT}): SGEMM {N_GEMM}^3, "
         f"triad b + s*c and gelu(x*a + b) * sigmoid(x) on {N_STREAM >> 20}M float32")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
    elif sys.argv[1:] == ["--nchwc-child"]:
        print(json.dumps(nchwc_child()))
    elif sys.argv[1:] == ["--winograd-child"]:
        print(json.dumps(winograd_child()))
    elif sys.argv[1:] == ["nchwc_winograd"]:
        print("ResNet-18's 3x3 stride-1 layers blocked, direct and as Winograd F(4x4, 3x3) "
              f"(relu epilogue), one thread, CPU time (median of {NCHWC_REPEAT} interleaved)")
        proc = subprocess.run([sys.executable, "-m", "bench.kernels", "--winograd-child"],
                              capture_output=True, text=True, check=True)
        print(winograd_render(json.loads(proc.stdout.strip().splitlines()[-1])))
    elif sys.argv[1:] == ["nchwc"]:
        print(NCHWC_TITLE)
        print(nchwc_render(nchwc_run()))
    else:
        print(TITLE)
        print(render(run()))
