"""Model-zoo workloads (issue 4): tessera eager, tessera nn.Graph and PyTorch eager, one run.

- ResNet-18 and MobileNetV2 inference, 224x224, batch 1 and 8 (eval mode)
- BERT MiniLM-L6 inference, batch 8, sequence 128 (the all-MiniLM-L6-v2 sizes)
- GPT training step: gpt-mini (6 layers, 192 wide), batch 8, block 128, AdamW

PyTorch runs the torchvision-structured references from ``tests/models`` (torchvision
itself cannot be imported beside the CPU build of torch here) with the same weights.
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np

REPEATS = 5


def _median_ms(fn, repeats: int = REPEATS) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _copy(src_torch, dst) -> None:
    import tessera
    sd = {k: tessera.tensor(v.detach().numpy().copy()) for k, v in src_torch.state_dict().items()}
    dst.load_state_dict(sd)


def _inference_graph(tessera, model):
    class Infer(tessera.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, *x):
            return self.model(*x)
    return Infer()


def vision(name: str, batch: int) -> dict:
    import torch

    import tessera
    import tessera.models as tm
    from tests.models import torch_vision_ref as ref
    torch.manual_seed(0)
    t_model = getattr(ref, name)().eval()
    model = getattr(tm, name)().eval()
    _copy(t_model, model)
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    xt, xx = torch.from_numpy(x), tessera.tensor(x)
    g = _inference_graph(tessera, model)
    t0 = time.perf_counter()
    g(xx)
    compile_s = time.perf_counter() - t0
    with torch.no_grad():
        torch_ms = _median_ms(lambda: t_model(xt))
    with tessera.no_grad():
        eager_ms = _median_ms(lambda: model(xx))
    graph_ms = _median_ms(lambda: g(xx))
    out = {"tessera": eager_ms, "graph": graph_ms, "torch": torch_ms, "compile_s": compile_s}
    if name == "resnet18":  # the peers of issue 6's ResNet-18 target, each in its own process
        out.update({fw: _peer(fw, name, batch) for fw in ("torch.compile", "jax")})
    return out


def _peer(framework: str, name: str, batch: int) -> float | str:
    """Median ms of ``framework``'s inference of ``name`` in a subprocess, or the error."""
    import json
    import subprocess
    proc = subprocess.run([sys.executable, "-m", "bench.models", "--peer", framework, name,
                           str(batch)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return ((proc.stderr.strip().splitlines() or ["?"])[-1])[:80]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def peer_child(framework: str, name: str, batch: int) -> float:
    if framework == "jax":
        from bench.jax_models import resnet18_infer
        return _median_ms(resnet18_infer(batch))
    import torch

    from tests.models import torch_vision_ref as ref
    torch.manual_seed(0)
    model = torch.compile(getattr(ref, name)().eval())
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((batch, 3, 224, 224),
                                                                  np.float32))
    with torch.no_grad():
        model(x)
        return _median_ms(lambda: model(x))


def bert(batch: int = 8, seq: int = 128) -> dict:
    import torch

    import tessera
    from tessera.models import BertConfig, BertModel
    from tests.models.torch_text_refs import TorchBert
    cfg = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
               intermediate_size=1536, max_position_embeddings=512, type_vocab_size=2,
               layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=0,
               hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    torch.manual_seed(0)
    t_model = TorchBert(cfg).eval()
    model = BertModel(BertConfig.from_dict(cfg)).eval()
    _copy(t_model, model)
    ids = np.random.default_rng(0).integers(1, 30522, (batch, seq))
    mask = np.ones((batch, seq), np.int64)
    it, mt = torch.from_numpy(ids), torch.from_numpy(mask)
    ix, mx = tessera.tensor(ids), tessera.tensor(mask)
    g = _inference_graph(tessera, model)
    t0 = time.perf_counter()
    g(ix, mx)
    compile_s = time.perf_counter() - t0
    with torch.no_grad():
        torch_ms = _median_ms(lambda: t_model(it, mt))
    with tessera.no_grad():
        eager_ms = _median_ms(lambda: model(ix, mx))
    graph_ms = _median_ms(lambda: g(ix, mx))
    return {"tessera": eager_ms, "graph": graph_ms, "torch": torch_ms, "compile_s": compile_s}


def gpt_train(batch: int = 8, block: int = 128) -> dict:
    import torch

    import tessera
    from tessera.models.gpt2 import gpt
    from tests.models.torch_text_refs import TorchGPT
    vocab = 512
    torch.manual_seed(0)
    t_model = TorchGPT(vocab, block, 6, 6, 192)
    model = gpt("gpt-mini", vocab_size=vocab, block_size=block)
    from tests.models.torch_text_refs import copy_torch_to_tessera
    copy_torch_to_tessera(t_model, model)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, vocab, (batch, block))
    tgt = rng.integers(0, vocab, (batch, block))
    t_opt = torch.optim.AdamW(t_model.parameters(), lr=1e-4)
    opt = tessera.optim.AdamW(model.parameters(), lr=1e-4)
    it, tt = torch.from_numpy(idx), torch.from_numpy(tgt)
    ix, tx = tessera.tensor(idx), tessera.tensor(tgt)

    def torch_step():
        t_opt.zero_grad()
        _, loss = t_model(it, tt)
        loss.backward()
        t_opt.step()

    def eager_step():
        opt.zero_grad()
        _, loss = model(ix, tx)
        loss.backward()
        opt.step()

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
    t0 = time.perf_counter()
    g(ix, tx)
    compile_s = time.perf_counter() - t0
    return {"tessera": _median_ms(eager_step), "graph": _median_ms(lambda: g(ix, tx)),
            "torch": _median_ms(torch_step), "compile_s": compile_s}


WORKLOADS = {
    "resnet18 infer b1": lambda: vision("resnet18", 1),
    "resnet18 infer b8": lambda: vision("resnet18", 8),
    "mobilenet_v2 infer b1": lambda: vision("mobilenet_v2", 1),
    "mobilenet_v2 infer b8": lambda: vision("mobilenet_v2", 8),
    "bert minilm infer b8 s128": bert,
    "gpt-mini train step b8 t128": gpt_train,
}


def run() -> list[dict]:
    rows = []
    for name, fn in WORKLOADS.items():
        try:
            rows.append({"workload": name, **fn()})
        except Exception as e:  # noqa: BLE001 - a failing row is reported, not fatal
            rows.append({"workload": name, "error": f"{type(e).__name__}: {e}"[:80]})
    return rows


def render(rows) -> str:
    from bench.common import table
    out, notes = [], []

    def peer(r, fw):
        v = r.get(fw)
        if isinstance(v, str):
            notes.append(f"{r['workload']} {fw}: {v}")
        return f"{v:.1f}" if isinstance(v, float) else "-"
    for r in rows:
        if "error" in r:
            out.append((r["workload"], r["error"]) + ("-",) * 7)
            continue
        out.append((r["workload"], f"{r['tessera']:.1f}", f"{r['graph']:.1f}",
                    f"{r['torch']:.1f}", peer(r, "torch.compile"), peer(r, "jax"),
                    f"{r['tessera'] / r['torch']:.2f}x", f"{r['graph'] / r['torch']:.2f}x",
                    f"{r['compile_s']:.1f}"))
    return (table(out, ("workload", "eager ms", "graph ms", "torch ms", "t.compile ms",
                        "jax ms", "eager/torch", "graph/torch", "first call s"))
            + "".join(f"\n  {n}" for n in notes))


TITLE = "Model zoo (median ms of 5 after a warm-up)"

if __name__ == "__main__":
    if sys.argv[1:2] == ["--peer"]:
        import json
        print(json.dumps(peer_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
        sys.exit(0)
    only = sys.argv[1:]
    if only:
        WORKLOADS = {k: v for k, v in WORKLOADS.items() if any(o in k for o in only)}
    print(TITLE)
    print(render(run()))
