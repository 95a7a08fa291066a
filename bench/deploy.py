"""deploy: an exported model's C library (``tessera.deploy.export_c``) against onnxruntime
on tessera's ONNX export of the same model, PyTorch eager and tessera's nn.Graph, batch 1.

Models: ResNet-18 and MobileNetV2 (224x224) and MiniLM-sized BERT (6 layers, hidden 384,
s=128; random weights: the timing does not depend on them). Latency is the median of
``TESSERA_BENCH_REPEAT`` runs (default 100, the issue's protocol) after one warm-up, at 1
and 2 threads. On a shared machine a median also counts the time a run waits for a core,
so each framework's CPU time per run at one thread (the process's, over the same runs) is
reported beside it: the cost of a run, which other load does not inflate. The library also
reports its load time (wall and CPU, the lesser of two loads) and the size of its code
(what loading ``lib<name>.so`` maps: code, constants and data, not its symbol table;
the weights are a file of their own).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time

import numpy as np

from bench.common import table

TITLE = "## deploy: the C library vs onnxruntime, PyTorch eager and nn.Graph (batch 1, ms)"
REPEAT = int(os.environ.get("TESSERA_BENCH_REPEAT", "100"))


def _models():
    import tessera
    import tessera.models as M
    from tessera import nn
    from tessera.models.bert import BertConfig, BertModel

    class MiniLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = BertModel(BertConfig(vocab_size=30522, hidden_size=384,
                                          num_hidden_layers=6, num_attention_heads=12,
                                          intermediate_size=1536))

        def forward(self, ids, mask):
            return self.m(ids, attention_mask=mask).last_hidden_state
    ids = tessera.randint(0, 30522, (1, 128))
    mask = tessera.ones(1, 128, dtype=tessera.int64)
    img = tessera.randn(1, 3, 224, 224)
    return [("resnet18", M.resnet18().eval(), (img,)),
            ("mobilenet_v2", M.mobilenet_v2().eval(), (img,)),
            ("minilm", MiniLM().eval(), (ids, mask))]


def _median_ms(fn) -> tuple[float, float]:
    """(median wall ms, CPU ms per run) over REPEAT runs after a warm-up."""
    fn()
    times = []
    c0 = time.process_time()
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), (time.process_time() - c0) * 1e3 / REPEAT


def loaded_bytes(path: str) -> int:
    """The bytes of an ELF-64 library that loading maps from the file: its allocated
    sections with contents (code, constants, initialised data, dynamic symbols), not the
    symbol table or other link-time sections.

    >>> import sys
    >>> loaded_bytes(sys.executable) > 0
    True
    """
    import struct
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"loaded_bytes: {path} is not an ELF-64 file")
    order = "<" if data[5] == 1 else ">"
    shoff, = struct.unpack_from(order + "Q", data, 0x28)
    shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
    total = 0
    for i in range(shnum):
        _, kind, flags, _, _, size = struct.unpack_from(order + "IIQQQQ", data,
                                                        shoff + i * shentsize)
        if flags & 2 and kind != 8:   # SHF_ALLOC, not SHT_NOBITS (.bss)
            total += size
    return total


def _library(name, model, inputs, tmp) -> dict:
    import tessera.deploy
    out = os.path.join(tmp, name)
    tessera.deploy.export_c(model, inputs, out, name=name)
    subprocess.run(["make", "-s", "-j2", "-C", out], check=True)
    paths = []
    for k, x in enumerate(inputs):
        paths.append(os.path.join(out, f"in{k}.npy"))
        np.save(paths[-1], x.numpy())
    res = {"code_kb": loaded_bytes(os.path.join(out, f"lib{name}.so")) / 1024}
    loads = []
    for threads in (1, 2):
        r = subprocess.run([os.path.join(out, f"run_{name}"), os.path.join(out, f"{name}.weights"),
                            *paths, os.path.join(out, "out.npy"), "--threads", str(threads),
                            "--repeat", str(REPEAT)], capture_output=True, text=True, check=True)
        got = dict(line.split() for line in r.stdout.splitlines())
        res[f"lib{threads}"] = float(got["median_ms"])
        if threads == 1:
            res["cpu_lib"] = float(got["cpu_ms"])
        loads.append((float(got["load_ms"]), float(got["load_cpu_ms"])))
    res["load_ms"] = min(w for w, _ in loads)
    res["load_cpu_ms"] = min(c for _, c in loads)
    return res


def _others(name, model, inputs, tmp) -> dict:
    import onnxruntime as ort
    import torch

    import tessera
    from tessera.deploy._capture import _Wrap
    res = {}
    path = os.path.join(tmp, f"{name}.onnx")
    tessera.onnx.export(model, inputs, path)
    feeds = None
    graph = _Wrap(model)
    for threads in (1, 2):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        feeds = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), inputs)}
        tessera.set_num_threads(threads)
        torch.set_num_threads(threads)
        for key, fn in (("ort", lambda: sess.run(None, feeds)),
                        ("graph", lambda: _no_grad(graph, inputs)),
                        ("torch", _torch(name, inputs))):
            res[f"{key}{threads}"], cpu = _median_ms(fn)
            if threads == 1:
                res[f"cpu_{key}"] = cpu
    return res


def _no_grad(graph, inputs):
    import tessera
    with tessera.no_grad():
        return graph(*inputs)


def _torch(name, inputs):
    """PyTorch eager on the same architecture (the tests' plain torch.nn references)."""
    import torch
    torch.manual_seed(0)
    if name == "minilm":
        from bench.models import BERT
        from tests.models.torch_text_refs import TorchBert
        model = TorchBert(BERT).eval()
    else:
        from tests.models import torch_vision_ref as ref
        model = getattr(ref, name)().eval()
    args = [torch.from_numpy(x.numpy()) for x in inputs]

    def call():
        with torch.no_grad():
            return model(*args)
    return call


def run() -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, inputs in _models():
            res = _library(name, model, inputs, tmp)
            try:
                res.update(_others(name, model, inputs, tmp))
            except Exception as e:  # a peer missing here: the library's numbers still stand
                res["error"] = f"{type(e).__name__}: {e}"
            out[name] = res
    return out


def render(results: dict) -> str:
    lat, cpu = [], []
    for name, r in results.items():
        def f(k):
            v = r.get(k)
            return "-" if v is None or v != v else f"{v:.2f}"

        def ratio(k):
            v, lib = r.get(k), r.get("cpu_lib")
            return "-" if not v or lib is None else f"{lib / v:.2f}x"
        lat.append((name, f("lib1"), f("lib2"), f("ort1"), f("ort2"), f("torch1"), f("torch2"),
                    f("graph1"), f("graph2")))
        cpu.append((name, f("cpu_lib"), f("cpu_ort"), f("cpu_torch"), f("cpu_graph"),
                    ratio("cpu_ort"), ratio("cpu_torch"), f("load_ms"), f("load_cpu_ms"),
                    f"{r['code_kb']:.0f}"))
    return (f"median of {REPEAT} runs, ms:\n\n" +
            table(lat, ("model", "lib 1t", "lib 2t", "ort 1t", "ort 2t", "torch 1t",
                        "torch 2t", "nn.Graph 1t", "nn.Graph 2t")) +
            "\n\nCPU time per run at 1 thread, ms (lib/x: the library's time over x's); "
            "the library's load:\n\n" +
            table(cpu, ("model", "lib", "ort", "torch", "nn.Graph", "lib/ort", "lib/torch",
                        "load ms", "load CPU ms", "code KB")))
