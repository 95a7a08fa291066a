"""Binary (1-bit) convolution: tessera's xnor-popcount kernels against float32 convolution.

- 3x3 convolutions, stride 1, padding 1, batch 1, 64 and 256 channels on 56x56 and 14x14:
  tessera's packed binary convolution (``PackedBinaryConv2d``: binarizing and packing the
  float input, the xnor-popcount product and the scaled float output, all included) on
  each instruction set this CPU has, against tessera's, PyTorch's and onnxruntime's float32
  convolution of the same shape ("float in/out" rows); and the same convolution as a layer
  inside a binary network runs it ("bits in/out" rows): its input the previous binary
  layer's bit-packed signs, its output its own signs through the thresholds that fold the
  following batch norm, both ``(1, H, W, C / 64)`` words;
- a ResNet-18-shaped binary network at batch 1 (224x224): float stem and classifier, every
  3x3 convolution binary, float 1x1 downsampling shortcuts; once with a Bi-Real shortcut
  around each convolution (every activation is read by a float shortcut: no bit-packed
  chain), once with ResNet's own shortcut around each pair (the first convolution of a
  pair writes bits, the second reads them); the packed networks against the same
  architecture in float32 (tessera, PyTorch, onnxruntime), and checked bit-exact against
  their unpacked models.

GOP/s counts 2 operations per multiply-add (binary ones alike, as dabnn and Larq count).
Everything runs in one process on ``THREADS`` threads, the timings interleaved
(``per_call_us_interleaved``) so that load on a shared host weighs on each alike; the
ratios are of that one run. On one thread the times are CPU time (``time.process_time``:
what other processes take from the wall clock does not count), else wall time.
"""
from __future__ import annotations

import os
import sys

CONVS = [(64, 56), (64, 14), (256, 56), (256, 14)]   # (channels, height = width)
# one thread per framework: the kernels against each other, not the host's scheduling of
# several thread pools (``TESSERA_BENCH_BINARY_THREADS`` to change it)
THREADS = int(os.environ.get("TESSERA_BENCH_BINARY_THREADS", "1"))


def _ort(proto, threads: int):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(proto.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return lambda x: sess.run(None, {name: x})


def _clock(threads: int):
    """CPU time on one thread (a loaded host's other processes do not count), else wall."""
    import time
    return time.process_time if threads == 1 else time.perf_counter


def _forced(fn, path: str):
    """``fn`` on the binary kernels' ``path``: as it is if that is the one they take (setting
    the environment costs more than a small layer's call), else with it forced."""
    from tessera.kernels import binary
    if path == binary.isa():
        return fn

    def call():
        old = os.environ.get("TESSERA_BINARY_ISA")
        os.environ["TESSERA_BINARY_ISA"] = path
        try:
            return fn()
        finally:
            if old is None:
                del os.environ["TESSERA_BINARY_ISA"]
            else:
                os.environ["TESSERA_BINARY_ISA"] = old
    return call


def _conv_case(c: int, hw: int, threads: int) -> dict:
    import numpy as np
    import torch

    import tessera
    import tessera.nn.binary as bnn
    from bench.common import per_call_us_interleaved
    from tessera.kernels import binary as K
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    w = rng.standard_normal((c, c, 3, 3)).astype(np.float32)
    latent = bnn.BinaryConv2d(c, c, 3, padding=1, scale="channel")
    with tessera.no_grad():
        latent.weight.copy_(tessera.tensor(w))
    packed = bnn.pack(latent.eval())
    tx, tw = tessera.tensor(x), tessera.tensor(w)
    px, pw = torch.tensor(x), torch.tensor(w)
    fp32 = tessera.nn.Conv2d(c, c, 3, padding=1, bias=False)
    with tessera.no_grad():
        fp32.weight.copy_(tw)
    ort_run = _ort(tessera.onnx.export(fp32, (tx,)), threads)
    fns = {f"binary_{path}": _forced(lambda: packed(tx), path) for path in K.available()[:-1]}
    # the middle layer of binary conv -> BN -> binary conv -> BN -> binary conv, packed
    layers = [bnn.BinaryConv2d(c, c, 3, padding=1, scale="channel") for _ in range(3)]
    with tessera.no_grad():
        layers[1].weight.copy_(tessera.tensor(w))
    chain = list(bnn.pack(tessera.nn.Sequential(
        layers[0], tessera.nn.BatchNorm2d(c), layers[1], tessera.nn.BatchNorm2d(c),
        layers[2]).eval()).children())[2]
    assert chain.input_bits and chain.threshold is not None
    bx = bnn.packbits(tx.permute(0, 2, 3, 1).contiguous())
    for path in K.available()[:-1]:
        fns[f"bits_{path}"] = _forced(lambda: chain(bx), path)
    fns["tessera"] = lambda: tessera.nn.functional.conv2d(tx, tw, padding=1)
    fns["torch"] = lambda: torch.nn.functional.conv2d(px, pw, padding=1)
    fns["onnxruntime"] = lambda: ort_run(x)
    with tessera.no_grad(), torch.no_grad():
        us = per_call_us_interleaved(fns, clock=_clock(threads))
    ops = 2 * c * c * 9 * hw * hw
    return {"case": f"conv3x3 {c}ch {hw}x{hw}", "ops": ops, "us": us}


def _resnet(nn, conv3, down_conv, pairs: bool = False):
    """ResNet-18's shape: stem, 4 stages of 2 blocks of two 3x3 convolutions, average
    pooling and a linear classifier; a shortcut around each convolution (Bi-Real), or with
    ``pairs`` around each block of two (ResNet's: conv, BN, conv, BN)."""
    class Unit(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(conv3(cin, cout, stride), nn.BatchNorm2d(cout))
            if pairs:
                self.body.extend([conv3(cout, cout, 1), nn.BatchNorm2d(cout)])
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(nn.AvgPool2d(stride), down_conv(cin, cout),
                                           nn.BatchNorm2d(cout))

        def forward(self, x):
            return self.body(x) + (x if self.short is None else self.short(x))

    layers = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
              nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1)]
    cin = 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        units = [Unit(cin, cout, stride), Unit(cout, cout, 1)]
        if not pairs:
            units += [Unit(cout, cout, 1), Unit(cout, cout, 1)]
        layers += units
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)]
    return nn.Sequential(*layers)


def _net_case(threads: int, pairs: bool = False) -> dict:
    import numpy as np
    import torch

    import tessera
    import tessera.nn.binary as bnn
    from bench.common import per_call_us_interleaved
    from tessera import nn
    from tessera.kernels import binary as K
    tessera.manual_seed(0)
    binary = _resnet(nn, lambda i, o, s: bnn.BinaryConv2d(i, o, 3, s, 1, scale="channel"),
                     lambda i, o: nn.Conv2d(i, o, 1, bias=False), pairs).eval()
    packed = bnn.pack(binary)
    chained = sum(1 for m in packed.modules() if getattr(m, "input_bits", False))
    fp32 = _resnet(nn, lambda i, o, s: nn.Conv2d(i, o, 3, s, 1, bias=False),
                   lambda i, o: nn.Conv2d(i, o, 1, bias=False), pairs).eval()
    torch.manual_seed(0)
    tfp32 = _resnet(torch.nn, lambda i, o, s: torch.nn.Conv2d(i, o, 3, s, 1, bias=False),
                    lambda i, o: torch.nn.Conv2d(i, o, 1, bias=False), pairs).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    tx, px = tessera.tensor(x), torch.tensor(x)
    with tessera.no_grad():
        exact = bool(np.array_equal(packed(tx).numpy(), binary(tx).numpy()))
    ort_run = _ort(tessera.onnx.export(fp32, (tx,)), threads)
    fns = {f"binary_{path}": _forced(lambda: packed(tx), path) for path in K.available()[:-1]}
    fns["tessera"] = lambda: fp32(tx)
    fns["torch"] = lambda: tfp32(px)
    fns["onnxruntime"] = lambda: ort_run(x)
    with tessera.no_grad(), torch.no_grad():
        us = per_call_us_interleaved(fns, repeat=5, clock=_clock(threads))
    case = ("binary ResNet-18 b1 224, pair shortcuts (bits between a pair's convs: "
            f"{chained} of 16)" if pairs else "binary ResNet-18 b1 224, Bi-Real shortcuts")
    return {"case": case, "ops": _resnet_binary_ops(), "us": us, "exact": exact}


def _resnet_binary_ops() -> int:
    """Operations of the network's binary 3x3 convolutions (the part the kernels run)."""
    total, hw, cin = 0, 56, 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        for k in range(4):
            s = stride if k == 0 else 1
            hw_out = hw // s
            total += 2 * (cin if k == 0 else cout) * cout * 9 * hw_out * hw_out
            hw = hw_out
        cin = cout
    return total


def run() -> list[dict]:
    import torch

    import tessera
    saved = torch.get_num_threads(), tessera.get_num_threads()
    torch.set_num_threads(THREADS)
    tessera.set_num_threads(THREADS)
    try:
        rows = []
        for c, hw in CONVS:
            r = _conv_case(c, hw, THREADS)
            floats = {k: v for k, v in r["us"].items() if not k.startswith("bits_")}
            bits = {("binary_" + k[5:] if k.startswith("bits_") else k): v
                    for k, v in r["us"].items() if not k.startswith("binary_")}
            rows += [dict(r, case=r["case"] + " float in/out", us=floats),
                     dict(r, case=r["case"] + " bits in/out", us=bits)]
        rows += [_net_case(THREADS), _net_case(THREADS, pairs=True)]
    finally:
        torch.set_num_threads(saved[0])
        tessera.set_num_threads(saved[1])
    for r in rows:
        r["threads"] = THREADS
        r["load_avg"] = os.getloadavg()[0]
    return rows


def render(rows: list[dict]) -> str:
    from bench.common import table
    if not rows:
        return ""
    paths = [k for k in rows[0]["us"] if k.startswith("binary_")]
    best = paths[0]
    out = []
    for r in rows:
        us = r["us"]
        cells = [r["case"]] + [f"{us[p] / 1e3:.3f}" for p in paths] + \
            [f"{us[k] / 1e3:.3f}" for k in ("tessera", "torch", "onnxruntime")] + \
            [f"{r['ops'] / us[best] / 1e3:.0f}", f"{r['ops'] / us['tessera'] / 1e3:.0f}",
             f"{us['tessera'] / us[best]:.1f}x"] + \
            [f"{us['tessera'] / us[p]:.1f}x" for p in paths[1:]] + \
            [f"{us['torch'] / us[best]:.1f}x", f"{us['onnxruntime'] / us[best]:.1f}x"]
        out.append(tuple(cells))
    headers = (("case",) + tuple(f"{p[7:]} ms" for p in paths) +
               ("tessera fp32 ms", "torch fp32 ms", "ort fp32 ms", f"{best[7:]} GOP/s",
                "fp32 GOP/s", f"{best[7:]}/tessera") +
               tuple(f"{p[7:]}/tessera" for p in paths[1:]) +
               (f"{best[7:]}/torch", f"{best[7:]}/ort"))
    text = table(out, headers)
    net = [r for r in rows if "exact" in r]
    exact = bool(net) and all(r["exact"] for r in net)
    loads = [r["load_avg"] for r in rows]
    text += (f"\n\nbinary network bit-exact with its unpacked model: "
             f"{'yes' if exact else 'NO'}; GOP/s of the network counts its "
             f"binary 3x3 convolutions ({_resnet_binary_ops() / 1e9:.2f} GOP); "
             f"{rows[0]['threads']} thread(s) per framework; host load average "
             f"{min(loads):.1f}-{max(loads):.1f}")
    return text


def _title() -> str:
    from bench import isa
    if isa.cap() == "avx2":   # every kernel family capped: the avx2 ratio is the AVX2 target's
        target = ("capped to AVX2 (TESSERA_MAX_ISA=avx2): the avx2/tessera ratio is against "
                  "tessera's fp32 convolution capped to AVX2 too, the target >= 4x")
    else:
        target = ("target >= 10x tessera fp32 on AVX-512 for a layer inside a binary network "
                  "(bits in/out rows); the avx2 column here is against AVX-512 fp32 and its "
                  "kernels compile with the CPU's AVX-512 registers: the AVX2 target (>= 4x) "
                  "is measured with --max-isa avx2")
    return ("binary, batch 1, ms per call (median; CPU time on one thread; ratios > 1: binary "
            f"faster; {target}; float in/out rows also binarize and pack the float input and "
            "write float output)")


TITLE = _title()

if __name__ == "__main__":
    print(TITLE)
    print(render(run()))
    sys.exit(0)
