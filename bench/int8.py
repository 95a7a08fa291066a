"""int8: INT8 inference against float32 and against its peers.

- GEMM: tessera's INT8 GEMM (``tessera.kernels.int8``, u8 x s8 -> s32 with the fused
  requantization, on the CPU's best path: ``amx``, ``vnni512``, ``avxvnni``, ``avx2`` or
  ``c``, the "int8 path" column) in GOP/s against tessera's float32 GEMM
  (``tessera.kernels.gemm``, weights packed) on ResNet-18's and MiniLM's shapes.
- Models, batch 1, 224x224: quantizable ResNet-18 and MobileNetV2 (torchvision's quantizable
  structure: FloatFunctional residual adds, ReLU for ReLU6), calibrated post-training with
  the x86 qconfig, in milliseconds: tessera float32 eager, tessera INT8 eager, PyTorch float32,
  PyTorch INT8 (``torch.ao`` eager, x86 engine), and onnxruntime running tessera's QDQ export
  (its INT8 kernels) and the float32 export.

Each framework initialises from the same seed-0 weights (tessera's copied into PyTorch), and
calibrates on the same random batches; the timings do not depend on the values. Medians of
``REPEATS`` calls after a warm-up, each framework's float32 and INT8 models interleaved
round by round, all in one process (2 threads for PyTorch and onnxruntime).

Wall times on a shared host move with its load (a model's median can grow several times
while a shorter one's barely does, which once made onnxruntime's INT8 MobileNetV2 look 11x
faster than its float32); the last table is the work itself: CPU milliseconds per
inference with every framework on one thread, in a child process (medians of
``CPU_ROUNDS``, the frameworks interleaved).
"""
from __future__ import annotations

import copy
import statistics
import time
import warnings

import numpy as np

from bench.common import table

TITLE = "## int8: INT8 against float32, PyTorch's x86 INT8 and onnxruntime's"
REPEATS = 5
GEMMS = [("resnet18 conv2 3x3", 3136, 64, 576), ("resnet18 conv4 3x3", 196, 256, 2304),
         ("minilm ffn up", 128, 1536, 384), ("minilm ffn down", 128, 384, 1536)]


def _median_ms(fn, repeats: int = REPEATS) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _interleaved_ms(fns: dict, repeats: int = REPEATS) -> dict:
    """The median milliseconds of each function, called in turn round by round (on a
    shared host, a slow spell then slows every one of them alike)."""
    for f in fns.values():
        f()
    times: dict = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append((time.perf_counter() - t0) * 1000)
    return {k: statistics.median(v) for k, v in times.items()}


# ---- GEMM --------------------------------------------------------------------------------

def _gemm_rows() -> list[dict]:
    from tessera.kernels import gemm, int8
    rng = np.random.default_rng(0)
    rows = []
    for name, m, n, k in GEMMS:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        packed = gemm.pack_b(w, trans_b=True)
        aq = rng.integers(0, 128, (m, k)).astype(np.uint8)
        wq = rng.integers(-127, 128, (n, k)).astype(np.int8)
        mult = np.full(n, 1e-4, np.float32)
        f32 = _median_ms(lambda: gemm.gemm_packed(a, packed))
        i8 = _median_ms(lambda: int8.gemm(aq, wq, a_zp=3, mult=mult, out_zp=5))
        ops = 2.0 * m * n * k / 1e6  # per ms -> GOP/s
        rows.append({"case": name, "fp32_gops": ops / f32, "int8_gops": ops / i8,
                     "speedup": f32 / i8, "isa": int8.isa()})
    return rows


# ---- models --------------------------------------------------------------------------------

def _models(L, FF, QS, DQS):
    """(ResNet-18, MobileNetV2) in library ``L`` (tessera or torch), quantizable."""
    nn = L.nn

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), \
                nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), \
                nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                nn.BatchNorm2d(cout))
            self.skip_add = FF()

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            return self.skip_add.add_relu(out, idt)

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.quant, self.dequant = QS(), DQS()
            self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
            self.relu, self.maxpool = nn.ReLU(), nn.MaxPool2d(3, 2, 1)
            layers, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers.append(nn.Sequential(Basic(cin, cout, stride), Basic(cout, cout, 1)))
                cin = cout
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool, self.flatten = nn.AdaptiveAvgPool2d(1), nn.Flatten()
            self.fc = nn.Linear(512, 1000)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(self.quant(x)))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.dequant(self.fc(self.flatten(self.avgpool(x))))

        def fuse_groups(self):
            g = [["conv1", "bn1", "relu"]]
            for li in range(1, 5):
                for b in range(2):
                    p = f"layer{li}.{b}"
                    g += [[f"{p}.conv1", f"{p}.bn1", f"{p}.relu"], [f"{p}.conv2", f"{p}.bn2"]]
                    if getattr(self, f"layer{li}")[b].downsample is not None:
                        g.append([f"{p}.downsample.0", f"{p}.downsample.1"])
            return g

    def cbr(cin, cout, k, stride, groups, relu=True):
        mods = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                nn.BatchNorm2d(cout)]
        return nn.Sequential(*(mods + [nn.ReLU()] if relu else mods))

    class Inverted(nn.Module):
        def __init__(self, cin, cout, stride, t):
            super().__init__()
            hid = cin * t
            layers = [cbr(cin, hid, 1, 1, 1)] if t != 1 else []
            layers += [cbr(hid, hid, 3, stride, hid), cbr(hid, cout, 1, 1, 1, relu=False)]
            self.conv = nn.Sequential(*layers)
            self.use_res = stride == 1 and cin == cout
            self.skip_add = FF()

        def forward(self, x):
            return self.skip_add.add(x, self.conv(x)) if self.use_res else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            self.quant, self.dequant = QS(), DQS()
            feats, cin = [cbr(3, 32, 3, 2, 1)], 32
            for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                               (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
                for i in range(n):
                    feats.append(Inverted(cin, c, s if i == 0 else 1, t))
                    cin = c
            feats.append(cbr(cin, 1280, 1, 1, 1))
            self.features = nn.Sequential(*feats)
            self.avgpool, self.flatten = nn.AdaptiveAvgPool2d(1), nn.Flatten()
            self.classifier = nn.Linear(1280, 1000)

        def forward(self, x):
            x = self.flatten(self.avgpool(self.features(self.quant(x))))
            return self.dequant(self.classifier(x))

        def fuse_groups(self):
            g = []
            for name, m in self.named_modules():
                if isinstance(m, nn.Sequential) and len(m) in (2, 3) and \
                        isinstance(m[0], nn.Conv2d):
                    g.append([f"{name}.{i}" for i in range(len(m))])
            return g

    return ResNet18, MobileNetV2


def _tessera_int8(model, calib):
    import tessera
    from tessera.ao import quantization as tq
    m = tq.fuse_modules(model.eval(), model.fuse_groups())
    m.qconfig = tq.get_default_qconfig("x86")
    p = tq.prepare(m)
    with tessera.no_grad():
        for x in calib:
            p(tessera.from_numpy(x))
    return tq.convert(p)


def _torch_int8(model, calib):
    import torch
    import torch.ao.quantization as tao
    torch.backends.quantized.engine = "x86"
    m = tao.fuse_modules(model.eval(), model.fuse_groups())
    m.qconfig = tao.get_default_qconfig("x86")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = tao.prepare(m)
        with torch.no_grad():
            for x in calib:
                p(torch.from_numpy(x))
        return tao.convert(p)


def _ort(proto, threads: int = 2):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _calls(threads: int):
    """For each model, its name and the calls of one batch-1 inference per framework and
    precision ({"tessera_fp32": f, ...})."""
    import torch
    from torch.ao.nn.quantized import FloatFunctional as PFF

    import tessera
    import tessera.onnx
    from tessera.ao import quantization as tq
    from tessera.ao.nn.quantized import FloatFunctional as TFF
    torch.set_num_threads(threads)
    ours = _models(tessera, TFF, tq.QuantStub, tq.DeQuantStub)
    theirs = _models(torch, PFF, torch.ao.quantization.QuantStub,
                     torch.ao.quantization.DeQuantStub)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    calib = [rng.standard_normal((2, 3, 224, 224)).astype(np.float32) for _ in range(2)]
    for (name, ocls), tcls in zip((("resnet18", ours[0]), ("mobilenet_v2", ours[1])), theirs):
        tessera.manual_seed(0)
        om = ocls().eval()
        tm = tcls().eval()
        tm.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                            for k, v in om.state_dict().items()})
        tx = tessera.from_numpy(x)
        oq = _tessera_int8(copy.deepcopy(om), calib)
        tq8 = _torch_int8(copy.deepcopy(tm), calib)
        px = torch.from_numpy(x)
        s8 = _ort(tessera.onnx.export(oq, tx), threads)
        s32 = _ort(tessera.onnx.export(om, tx), threads)
        feed8, feed32 = {s8.get_inputs()[0].name: x}, {s32.get_inputs()[0].name: x}

        def ours_(m):
            def call():
                with tessera.no_grad():
                    m(tx)
            return call

        def theirs_(m):
            def call():
                with torch.no_grad():
                    m(px)
            return call
        yield name, {"tessera_fp32": ours_(om), "tessera_int8": ours_(oq),
                     "torch_fp32": theirs_(tm), "torch_int8": theirs_(tq8),
                     "ort_fp32": lambda s=s32, f=feed32: s.run(None, f),
                     "ort_int8": lambda s=s8, f=feed8: s.run(None, f)}


def _model_rows() -> list[dict]:
    rows = []
    for name, c in _calls(2):
        # one framework at a time (PyTorch's and onnxruntime's threads spin on after a
        # call, taking the cores from whatever runs next), its two models interleaved
        row = {"model": name}
        for fw in ("tessera", "torch", "ort"):
            row.update(_interleaved_ms({k: f for k, f in c.items() if k.startswith(fw)}))
        rows.append(row)
    return rows


CPU_ROUNDS = 8


def _cpu_child() -> list[dict]:
    """CPU milliseconds per inference, every framework on one thread (its work all on
    the calling thread), interleaved call by call; medians."""
    import tessera
    tessera.set_num_threads(1)
    rows = []
    for name, c in _calls(1):
        for f in c.values():
            f()
        times: dict = {k: [] for k in c}
        for _ in range(CPU_ROUNDS):
            for k, f in c.items():
                t0 = time.process_time()
                f()
                times[k].append((time.process_time() - t0) * 1000)
        rows.append({"model": name, **{k: statistics.median(v) for k, v in times.items()}})
    return rows


def _cpu_rows() -> list[dict]:
    import json
    import os
    import subprocess
    import sys
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "bench.int8", "--cpu-child"],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        return [{"model": "error: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:90]}]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run() -> dict:
    return {"gemm": _gemm_rows(), "models": _model_rows(), "cpu": _cpu_rows()}


def render(results: dict) -> str:
    g = table([(r["case"], f"{r['fp32_gops']:.1f}", f"{r['int8_gops']:.1f}",
                f"{r['speedup']:.2f}x", r["isa"]) for r in results["gemm"]],
              ("GEMM (M x N x K as inference runs it)", "fp32 GFLOP/s", "int8 GOP/s",
               "int8 / fp32", "int8 path"))
    cols = ("tessera_fp32", "tessera_int8", "torch_fp32", "torch_int8", "ort_fp32",
            "ort_int8")
    m = table([(r["model"], *(f"{r[c]:.1f}" for c in cols),
                f"{r['tessera_fp32'] / r['tessera_int8']:.2f}x") for r in results["models"]],
              ("batch 1, ms", "tessera fp32", "tessera int8", "torch fp32", "torch int8",
               "ort fp32", "ort int8 (QDQ)", "tessera int8 speedup"))
    cpu = results.get("cpu", [])
    c = table([(r["model"], *(f"{r[k]:.1f}" if k in r else "-" for k in cols))
               for r in cpu], ("one thread, CPU ms", *cols))
    return g + "\n\n" + m + "\n\n" + c


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["--cpu-child"]:
        import json
        print(json.dumps(_cpu_child()))
    else:
        print(render(run()))
