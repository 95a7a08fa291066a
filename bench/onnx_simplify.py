"""Node counts of the model zoo's ONNX exports: as exported, after ``tessera.onnx.simplify``
and after ``onnxsim`` (the onnx-simplifier package; '-' when it is not installed), side by
side, with a check that each simplified model still computes the same in onnxruntime.

    python bench/onnx_simplify.py
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import tessera  # noqa: E402
import tessera.models  # noqa: E402
import tessera.onnx  # noqa: E402
from tessera import nn  # noqa: E402


def _models():
    from train_digits import DigitsCNN
    rng = np.random.default_rng(0)

    def x(*s):
        return tessera.tensor(rng.standard_normal(s), dtype=tessera.float32)
    bert = tessera.models.BertModel(tessera.models.BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128))
    return [
        ("mlp", nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)), (x(8, 64),)),
        ("digits_cnn", DigitsCNN(), (x(8, 1, 8, 8),)),
        ("resnet18", tessera.models.resnet18(), (x(1, 3, 224, 224),)),
        ("mobilenet_v2", tessera.models.mobilenet_v2(), (x(1, 3, 224, 224),)),
        ("transformer_encoder", nn.TransformerEncoder(
            nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2), (x(2, 16, 64),)),
        ("bert_tiny", bert, (tessera.tensor(rng.integers(0, 1000, (2, 16))),
                             tessera.ones(2, 16, dtype=tessera.int64))),
    ]


def _onnxsim(proto):
    try:
        import onnxsim
    except ImportError:
        return None
    simplified, ok = onnxsim.simplify(proto)
    return simplified if ok else None


def _same(a, b, arrays) -> bool:
    import onnxruntime as ort

    def run(p):
        s = ort.InferenceSession(p.SerializeToString(), providers=["CPUExecutionProvider"])
        return s.run(None, {i.name: v for i, v in zip(s.get_inputs(), arrays)})
    return all(np.allclose(x, y, atol=1e-4, rtol=1e-3) for x, y in zip(run(a), run(b)))


def main() -> int:
    print(f"{'model':<22}{'exported':>10}{'tessera':>10}{'onnxsim':>10}  same outputs")
    for name, model, args in _models():
        proto = tessera.onnx.export(model, args)
        ours = tessera.onnx.simplify(proto)
        theirs = _onnxsim(proto)
        same = _same(proto, ours, [a.numpy() for a in args])
        print(f"{name:<22}{len(proto.graph.node):>10}{len(ours.graph.node):>10}"
              f"{len(theirs.graph.node) if theirs is not None else '-':>10}  "
              f"{'yes' if same else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
