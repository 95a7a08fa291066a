"""deploy: an exported model's C library (``tessera.deploy.export_c``) against onnxruntime
on tessera's ONNX export of the same model, PyTorch eager and tessera's nn.Graph, batch 1.

Models: ResNet-18 and MobileNetV2 (224x224) and MiniLM-sized BERT (6 layers, hidden 384,
s=128; random weights: the timing does not depend on them). Latency is the median of
``TESSERA_BENCH_REPEAT`` runs (default 20; the issue's protocol is 100) after one warm-up,
at 1 and 2 threads; the library also reports its load time and the size of its code
(``lib<name>.so`` without the weights).
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
REPEAT = int(os.environ.get("TESSERA_BENCH_REPEAT", "20"))


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


def _median_ms(fn) -> float:
    fn()
    times = []
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _library(name, model, inputs, tmp) -> dict:
    import tessera.deploy
    out = os.path.join(tmp, name)
    tessera.deploy.export_c(model, inputs, out, name=name)
    subprocess.run(["make", "-s", "-j2", "-C", out], check=True)
    paths = []
    for k, x in enumerate(inputs):
        paths.append(os.path.join(out, f"in{k}.npy"))
        np.save(paths[-1], x.numpy())
    res = {"code_kb": os.path.getsize(os.path.join(out, f"lib{name}.so")) / 1024}
    for threads in (1, 2):
        r = subprocess.run([os.path.join(out, f"run_{name}"), os.path.join(out, f"{name}.weights"),
                            *paths, os.path.join(out, "out.npy"), "--threads", str(threads),
                            "--repeat", str(REPEAT)], capture_output=True, text=True, check=True)
        got = dict(line.split() for line in r.stdout.splitlines())
        res[f"lib{threads}"] = float(got["median_ms"])
        res["load_ms"] = float(got["load_ms"])
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
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        feeds = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), inputs)}
        res[f"ort{threads}"] = _median_ms(lambda: sess.run(None, feeds))
        tessera.set_num_threads(threads)
        with tessera.no_grad():
            res[f"graph{threads}"] = _median_ms(lambda: graph(*inputs))
        torch.set_num_threads(threads)
        res[f"torch{threads}"] = _torch_ms(name, inputs)
    return res


def _torch_ms(name, inputs) -> float:
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
    with torch.no_grad():
        return _median_ms(lambda: model(*args))


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
    rows = []
    for name, r in results.items():
        def f(k):
            v = r.get(k)
            return "-" if v is None or v != v else f"{v:.2f}"
        rows.append((name, f("lib1"), f("lib2"), f("ort1"), f("ort2"), f("torch1"), f("torch2"),
                     f("graph1"), f("graph2"), f("load_ms"), f"{r['code_kb']:.0f}"))
    return table(rows, ("model", "lib 1t", "lib 2t", "ort 1t", "ort 2t", "torch 1t",
                        "torch 2t", "nn.Graph 1t", "nn.Graph 2t", "load ms", "code KB"))
