"""ONNX import: exported models come back as IR graphs that run through the reference
interpreter and the compiled executor, and as modules that can be fine-tuned; foreign
models (built with onnx.helper) and bad files give clear errors."""
from __future__ import annotations

import numpy as np
import pytest

import tessera
import tessera.models
import tessera.onnx
from tessera import nn
from tessera.onnx.importer import OnnxImportError
from tests.onnx.helpers import assert_close, flat_tensors

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

RNG = np.random.default_rng(1)


def _x(*shape):
    return tessera.tensor(RNG.standard_normal(shape), dtype=tessera.float32)


MODELS = {
    "mlp": lambda: (nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3)), (_x(4, 6),)),
    "resnet18": lambda: (tessera.models.resnet18(num_classes=5), (_x(1, 3, 32, 32),)),
    "mobilenet_v2": lambda: (tessera.models.mobilenet_v2(num_classes=5), (_x(1, 3, 32, 32),)),
    "transformer": lambda: (nn.TransformerEncoder(nn.TransformerEncoderLayer(
        16, 4, 32, batch_first=True), 2), (_x(2, 5, 16),)),
    "bert": lambda: (tessera.models.BertModel(tessera.models.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=32)), (tessera.tensor([[2, 7, 9, 3, 4]]),
                                 tessera.tensor([[1, 1, 1, 0, 1]]))),
}


@pytest.mark.parametrize("opset", [13, 17, 21])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_roundtrip_interpreter_and_executor(name, opset):
    model, args = MODELS[name]()
    model.eval()
    with tessera.no_grad():
        want = flat_tensors(model(*args))
    m = tessera.onnx.load(tessera.onnx.export(model, args, opset_version=opset))
    m.graph.verify()
    assert_close([t.numpy() for t in m.run(*args)], want, atol=1e-5)
    assert_close([t.numpy() for t in m.run(*args, compiled=True)], want, atol=1e-5)


def test_load_names_parameters_and_folds_shapes():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    proto = tessera.onnx.export(model, (_x(2, 4),), dynamic_axes={"input0": {0: "n"}})
    with pytest.raises(OnnxImportError, match="input_shapes"):
        tessera.onnx.load(proto)
    m = tessera.onnx.load(proto, input_shapes={"input0": (5, 4)})
    assert set(m.graph.variables) == {"0.weight", "0.bias"}
    # the dynamic-shape computation (Shape, Gather, Concat) folded away
    assert [n.op.name for n in m.graph.nodes] == ["permute", "matmul", "add", "relu"]
    x = _x(5, 4)
    with tessera.no_grad():
        assert_close([m.run(x)[0].numpy()], [model(x)], atol=1e-6)


def test_to_module_fine_tunes():
    src = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    m = tessera.onnx.to_module(tessera.onnx.export(src, (_x(3, 4),)))
    assert sorted(m.state_dict()) == sorted(src.state_dict())
    opt = tessera.optim.SGD(m.parameters(), lr=0.1)
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((32, 4)).astype(np.float32)
    x, y = tessera.tensor(xs), tessera.tensor(np.tanh(xs @ rng.standard_normal((4, 1)))
                                               .astype(np.float32))
    losses = []
    for _ in range(50):
        loss = nn.functional.mse_loss(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.5
    assert all(p.grad is not None for p in m.parameters())


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def test_foreign_model_with_gemm_and_shape_arithmetic():
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], RNG.standard_normal(12).tolist())
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"], transB=1, alpha=2.0),
             helper.make_node("Shape", ["h"], ["s"]),
             helper.make_node("Reshape", ["h", "s"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    proto = _model(nodes, [_vi("x", [2, 4])], [_vi("y", [2, 3])], [w])
    m = tessera.onnx.load(proto)
    x = _x(2, 4)
    wn = onnx.numpy_helper.to_array(w)
    h = 2 * x.numpy() @ wn.T
    want = np.exp(h) / np.exp(h).sum(-1, keepdims=True)
    np.testing.assert_allclose(m.run(x)[0].numpy(), want, rtol=1e-5)
    assert "Reshape" not in str(m.graph) and "shape" not in [n.op.name for n in m.graph.nodes]


def test_unsupported_op_and_opset_errors():
    proto = _model([helper.make_node("Det", ["x"], ["y"])], [_vi("x", [2, 2])], [_vi("y", [])])
    with pytest.raises(OnnxImportError, match="'Det' is not supported"):
        tessera.onnx.load(proto)
    old = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])],
                 opset=11)
    with pytest.raises(OnnxImportError, match="opset 11 is not supported"):
        tessera.onnx.load(old)
    attr = _model([helper.make_node("Dropout", ["x", "r", "t"], ["y"])],
                  [_vi("x", [2]), _vi("r", []), _vi("t", [], TensorProto.BOOL)],
                  [_vi("y", [2])])
    with pytest.raises(OnnxImportError, match="Dropout"):
        tessera.onnx.load(attr)


def test_bad_files(tmp_path):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"this is not a protobuf")
    with pytest.raises(OnnxImportError, match="not"):
        tessera.onnx.load(p)
    good = tessera.onnx.export(nn.Linear(3, 3), (_x(1, 3),)).SerializeToString()
    p.write_bytes(good[: len(good) // 2])
    with pytest.raises(OnnxImportError):
        tessera.onnx.load(p)
    with pytest.raises(FileNotFoundError):
        tessera.onnx.load(tmp_path / "missing.onnx")


def test_backend_run_node():
    from tessera.onnx.backend import TesseraBackend
    node = helper.make_node("Add", ["a", "b"], ["c"])
    a, b = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(TesseraBackend.run_node(node, [a, b])[0], a + b)
    assert TesseraBackend.supports_device("CPU") and not TesseraBackend.supports_device("CUDA")
