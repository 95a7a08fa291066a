"""Model-zoo workloads: tessera eager, tessera nn.Graph, PyTorch eager,
torch.compile, (for ResNet-18) JAX and (for inference) onnxruntime on tessera's own ONNX
export, one subprocess per framework and workload.

- ResNet-18 and MobileNetV2 inference, 224x224, batch 1 and 8 (eval mode)
- BERT MiniLM-L6 inference, batch 8, sequence 128 (the all-MiniLM-L6-v2 sizes)
- one BERT-base-sized encoder layer (768 wide, 12 heads, FFN 3072) inference, batch 8,
  sequence 128 (a one-layer BertModel: embeddings, the layer and the pooler)
- GPT training step: gpt-mini (6 layers, 192 wide), batch 8, block 256, AdamW

The frameworks run one after another in rounds (``TESSERA_BENCH_ROUNDS``); a row reports
each framework's median and the median over rounds of graph / best peer within the round.
onnxruntime gets as many intra-op threads as tessera has.

PyTorch runs the torchvision-structured references from ``tests/models`` (torchvision
itself cannot be imported beside the CPU build of torch the tests use). Each framework
initialises its own weights from seed 0 (the timings do not depend on their values), so no
process imports another framework: their thread pools never meet.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

REPEATS = 5
FRAMEWORKS = ("tessera", "graph", "torch", "torch.compile", "jax", "onnxruntime")
PEERS = ("torch", "torch.compile", "jax", "onnxruntime")


def _median_ms(fn, repeats: int = REPEATS) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _inference_graph(tessera, model):
    class Infer(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, *x):
            return self.model(*x)
    return Infer()


def _ort_step(tessera, model, inputs):
    """onnxruntime on tessera's ONNX export of ``model``, as many intra-op threads as
    tessera uses (one session, inputs converted once, as a deployment would)."""
    import onnxruntime as ort

    import tessera.onnx
    proto = tessera.onnx.export(model, inputs)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = tessera.get_num_threads()
    sess = ort.InferenceSession(proto.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    feed = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), inputs)}
    return lambda: sess.run(None, feed)


def _infer_step(fw: str, model, inputs):
    """A zero-argument inference call of ``model`` for framework ``fw``."""
    if fw == "onnxruntime":
        import tessera
        return _ort_step(tessera, model, inputs)
    if fw == "graph":
        import tessera
        g = _inference_graph(tessera, model)
        return lambda: g(*inputs)
    if fw == "tessera":
        import tessera

        def run():
            with tessera.no_grad():
                return model(*inputs)
        return run
    import torch
    if fw == "torch.compile":
        model = torch.compile(model)

    def run():
        with torch.no_grad():
            return model(*inputs)
    return run


def vision(fw: str, name: str, batch: int):
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    if fw == "jax":
        if name != "resnet18":
            raise NotImplementedError("no JAX version of this model in the benchmark")
        from bench.jax_models import resnet18_infer
        return resnet18_infer(batch)
    if fw.startswith("torch"):
        import torch

        from tests.models import torch_vision_ref as ref
        torch.manual_seed(0)
        return _infer_step(fw, getattr(ref, name)().eval(), (torch.from_numpy(x),))
    import tessera
    import tessera.models as tm
    tessera.manual_seed(0)
    return _infer_step(fw, getattr(tm, name)().eval(), (tessera.tensor(x),))


BERT = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
            intermediate_size=1536, max_position_embeddings=512, type_vocab_size=2,
            layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=0,
            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


# one encoder layer at BERT-base's sizes
BERT_BASE_LAYER = dict(BERT, hidden_size=768, num_hidden_layers=1, intermediate_size=3072)


def bert(fw: str, batch: int = 8, seq: int = 128, cfg: dict = BERT):
    if fw == "jax":
        raise NotImplementedError("no JAX version of this model in the benchmark")
    ids = np.random.default_rng(0).integers(1, 30522, (batch, seq))
    mask = np.ones((batch, seq), np.int64)
    if fw.startswith("torch"):
        import torch

        from tests.models.torch_text_refs import TorchBert
        torch.manual_seed(0)
        return _infer_step(fw, TorchBert(cfg).eval(),
                           (torch.from_numpy(ids), torch.from_numpy(mask)))
    import tessera
    from tessera.models import BertConfig, BertModel
    tessera.manual_seed(0)
    return _infer_step(fw, BertModel(BertConfig.from_dict(cfg)).eval(),
                       (tessera.tensor(ids), tessera.tensor(mask)))


def gpt_train(fw: str, batch: int = 8, block: int = 256):
    if fw in ("jax", "onnxruntime"):
        raise NotImplementedError("no JAX version of this model in the benchmark")
    vocab = 512
    rng = np.random.default_rng(0)
    idx = rng.integers(0, vocab, (batch, block))
    tgt = rng.integers(0, vocab, (batch, block))
    if fw.startswith("torch"):
        import torch

        from tests.models.torch_text_refs import TorchGPT
        torch.manual_seed(0)
        model = TorchGPT(vocab, block, 6, 6, 192)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        fwd = torch.compile(model) if fw == "torch.compile" else model
        it, tt = torch.from_numpy(idx), torch.from_numpy(tgt)

        def step():
            opt.zero_grad()
            _, loss = fwd(it, tt)
            loss.backward()
            opt.step()
        return step
    import tessera
    from tessera.models.gpt2 import gpt
    tessera.manual_seed(0)
    model = gpt("gpt-mini", vocab_size=vocab, block_size=block)
    opt = tessera.optim.AdamW(model.parameters(), lr=1e-4)
    ix, tx = tessera.tensor(idx), tessera.tensor(tgt)
    if fw == "tessera":
        def eager_step():
            opt.zero_grad()
            _, loss = model(ix, tx)
            loss.backward()
            opt.step()
        return eager_step

    class Train(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, i, t):
            _, loss = self.model(i, t)
            loss.backward()
            return loss
    g = Train()
    return lambda: g(ix, tx)


WORKLOADS = {
    "resnet18 infer b1": lambda fw: vision(fw, "resnet18", 1),
    "resnet18 infer b8": lambda fw: vision(fw, "resnet18", 8),
    "mobilenet_v2 infer b1": lambda fw: vision(fw, "mobilenet_v2", 1),
    "mobilenet_v2 infer b8": lambda fw: vision(fw, "mobilenet_v2", 8),
    "bert minilm infer b8 s128": bert,
    "bert-base layer infer b8 s128": lambda fw: bert(fw, cfg=BERT_BASE_LAYER),
    "gpt-mini train step b8 t256": gpt_train,
}


def child(fw: str, workload: str) -> dict:
    step = WORKLOADS[workload](fw)
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    return {"ms": _median_ms(step), "first_s": first}


def run(only: tuple = ()) -> list[dict]:
    from bench.common import rounds, run_children
    rows = []
    for name in WORKLOADS:
        if only and not any(o in name for o in only):
            continue
        # frameworks interleaved over TESSERA_BENCH_ROUNDS (3) rounds
        row = {"workload": name, **run_children(
            {fw: [sys.executable, "-m", "bench.models", "--child", fw, name]
             for fw in FRAMEWORKS}, rounds(3))}
        rows.append(row)
    return rows


def render(rows) -> str:
    from bench.common import round_ratio, table
    from bench.isa import cap, compared, label, uncapped
    out, notes = [], []
    # under an instruction-set cap, the peers that ignore it are shown but not compared
    capped = cap()
    peers = compared(PEERS)

    def ms(r, fw):
        return f"{r[fw]['ms']:.1f}" if "ms" in r[fw] else "-"
    for r in rows:
        for fw in FRAMEWORKS:
            err = r[fw].get("error", "")
            if err and not err.startswith("NotImplementedError"):
                notes.append(f"{r['workload']} {fw}: {err}")
        t, g, p = r["tessera"], r["graph"], r["torch"]
        ok = all("ms" in x for x in (t, g, p))
        best = round_ratio(r, "graph", peers)
        out.append((r["workload"], *(ms(r, fw) for fw in FRAMEWORKS),
                    f"{t['ms'] / p['ms']:.2f}x" if ok else "-",
                    f"{g['ms'] / p['ms']:.2f}x" if ok else "-",
                    f"{best[0]:.2f}x ({best[1]})" if best else "-",
                    f"{g['first_s']:.1f}" if "first_s" in g else "-"))
    n_rounds = max((len(r["graph"].get("rounds_ms", [])) for r in rows), default=0)
    return (table(out, ("workload", "eager ms", "graph ms", "torch ms", "t.compile ms",
                        label("jax ms", "jax"), label("ort ms", "onnxruntime"),
                        "eager/torch", "graph/torch",
                        "graph/best peer", "graph 1st call s"))
            + f"\n  {n_rounds} round(s); graph/best peer: the median over rounds of graph / the "
              f"fastest of {', '.join(peers)} (ort: onnxruntime on tessera's ONNX "
              "export) in the same round, and the peer fastest most often"
            + ("" if capped is None or not uncapped() else f"\n  capped to {capped.upper()}: "
               + "; ".join(f"{p} is not ({why})" for p, why in uncapped().items())
               + ", so their columns ran AVX-512 kernels and the best-peer ratio leaves them "
               "out")
            + "".join(f"\n  {n}" for n in notes))


TITLE = (f"Model zoo (median ms of {REPEATS} after a warm-up, the median round; one process "
         "per framework and round, frameworks alternating; target: graph/best peer <= 1.0, "
         "aim 0.8)")

if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
        sys.exit(0)
    print(TITLE)
    print(render(run(tuple(sys.argv[1:]))))
