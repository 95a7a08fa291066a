"""INT8 models as QDQ ONNX against onnxruntime: a converted (post-training or
quantization-aware) model exports as QuantizeLinear/DequantizeLinear around float ops,
onnxruntime fuses it into its INT8 kernels and agrees with tessera's INT8 outputs;
dynamically quantized Linear layers export in onnxruntime's dynamic form; QDQ files (ours
and onnxruntime's ``quantize_static`` output, QDQ and QOperator) load back into tessera's
quantized ops."""
from __future__ import annotations

import numpy as np
import pytest

import tessera
import tessera.onnx
from tessera import nn
from tessera.ao import quantization as tq
from tessera.ao.nn import quantized as nnq
from tests.onnx.helpers import ort_run, ort_session

ort = pytest.importorskip("onnxruntime")


class Net(nn.Module):
    """Conv+BN+ReLU, a residual add, max and average pooling, Linear+ReLU, Linear."""

    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.conv1, self.bn1, self.relu1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), \
            nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.add = nnq.FloatFunctional()
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.avg, self.flat = nn.AdaptiveAvgPool2d(1), nn.Flatten()
        self.fc1, self.relu2, self.fc2 = nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(self.quant(x))))
        x = self.pool(self.add.add(x, self.conv2(x)))
        x = self.flat(self.avg(self.conv3(x)))
        return self.dequant(self.fc2(self.relu2(self.fc1(x))))


FUSE = [["conv1", "bn1", "relu1"], ["fc1", "relu2"]]


def _data(n=16, seed=0):
    return tessera.from_numpy(np.random.default_rng(seed).normal(
        size=(n, 3, 12, 12)).astype(np.float32))


def _ptq(seed=0):
    tessera.manual_seed(seed)
    m = Net().eval()
    with tessera.no_grad():  # batch norm statistics that are not the identity
        m.bn1.running_mean.uniform_(-0.2, 0.2)
        m.bn1.running_var.uniform_(0.5, 2.0)
    m = tq.fuse_modules(m, FUSE)
    m.qconfig = tq.get_default_qconfig("x86")
    p = tq.prepare(m)
    with tessera.no_grad():
        for k in range(4):
            p(_data(8, 10 + k))
    return tq.convert(p)


def _optimized_ops(proto, tmp_path) -> list[str]:
    import onnx
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]


def _close_in_steps(got, want, step, frac=0.98):
    """Equal up to one quantization step everywhere, and exactly equal almost everywhere
    (the two runtimes round the float requantization of a few sums differently)."""
    diff = np.abs(np.asarray(got) - np.asarray(want))
    assert diff.max() <= step * 1.01, f"max difference {diff.max()} > one step {step}"
    assert (diff <= step * 1e-3).mean() >= frac


def test_ptq_model_exports_qdq_that_onnxruntime_runs_in_int8(tmp_path):
    import onnx
    q = _ptq()
    x = _data(4, 99)
    path = tmp_path / "m.int8.onnx"
    proto = tessera.onnx.export(q, x, str(path))
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "Gemm"} <= set(ops)
    weight_dq = [n for n in proto.graph.node if n.op_type == "DequantizeLinear"
                 and any(a.name == "axis" for a in n.attribute)]
    assert weight_dq, "per-channel weights dequantize along their output channels"
    with tessera.no_grad():
        want = q(x).numpy()
    got = ort_run(proto, [x.numpy()])[0]
    _close_in_steps(got, want, q.fc2.scale.item())
    fused = _optimized_ops(proto, tmp_path)
    assert "QLinearConv" in fused and ("QGemm" in fused or "QLinearMatMul" in fused), fused


def test_qat_model_exports_fake_quantization_as_qdq_pairs():
    tessera.manual_seed(1)
    m = tq.fuse_modules(Net().eval(), FUSE).train()
    m.qconfig = tq.get_default_qat_qconfig("x86")
    qat = tq.prepare_qat(m)
    opt = tessera.optim.SGD(qat.parameters(), lr=0.01)
    for k in range(3):
        loss = qat(_data(8, k)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    qat.eval().apply(tq.disable_observer)
    x = _data(4, 7)
    proto = tessera.onnx.export(qat, x)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("QuantizeLinear") >= 6 and ops.count("DequantizeLinear") >= 6
    with tessera.no_grad():
        want = qat(x).numpy()
    # onnxruntime divides by the scale where PyTorch's rounding multiplies by its inverse
    _close_in_steps(ort_run(proto, [x.numpy()])[0], want, qat.fc2.activation_post_process
                    .scale.item())
    # and its converted INT8 model gives what onnxruntime gives for that one's export
    q = tq.convert(qat)
    with tessera.no_grad():
        want = q(x).numpy()
    _close_in_steps(ort_run(tessera.onnx.export(q, x), [x.numpy()])[0], want,
                    q.fc2.scale.item())


class _Bert(nn.Module):
    """A Linear-heavy block: attention projections and a feed-forward layer."""

    def __init__(self, d=32):
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        a = (q @ k.transpose(-1, -2) / 32 ** 0.5).softmax(-1) @ v
        x = self.norm(x + self.out(a))
        return x + self.ff2(nn.functional.gelu(self.ff1(x)))


@pytest.mark.parametrize("reduce_range", [True, False])
def test_dynamic_quantized_linear_exports_as_matmulinteger(reduce_range):
    tessera.manual_seed(0)
    m = _Bert().eval()
    dyn = tq.quantize_dynamic(m, {nn.Linear}, dtype=tessera.qint8)
    for mod in dyn.modules():
        if hasattr(mod, "reduce_range"):
            mod.reduce_range = reduce_range
    x = tessera.randn(2, 5, 32)
    proto = tessera.onnx.export(dyn, x)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("MatMulInteger") == 4
    with tessera.no_grad():
        want = dyn(x).numpy()
        ref = m(x).numpy()
    got = ort_run(proto, [x.numpy()])[0]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert np.abs(got - ref).max() < 0.1  # and near the float model


def test_exported_qdq_model_loads_into_int8_ops():
    q = _ptq()
    x = _data(4, 5)
    proto = tessera.onnx.export(q, x)
    m = tessera.onnx.load(proto)
    ops = [n.op.name for n in m.graph.nodes]
    assert ops.count("quantized_conv2d") == 3 and ops.count("quantized_linear") == 2, ops
    assert "conv" not in ops and "matmul" not in ops
    with tessera.no_grad():
        want = q(x).numpy()
    _close_in_steps(m.run(x)[0].numpy(), want, q.fc2.scale.item())
    np.testing.assert_allclose(m.run(x, compiled=True)[0].numpy(), m.run(x)[0].numpy())


class _Reader:
    def __init__(self, name, batches):
        self.it = iter([{name: b} for b in batches])

    def get_next(self):
        return next(self.it, None)


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_onnxruntime_quantize_static_output_runs_in_tessera(tmp_path, fmt):
    from onnxruntime import quantization as oq
    tessera.manual_seed(0)
    m = tq.fuse_modules(Net().eval(), FUSE)
    x = _data(2, 3)
    src, dst = tmp_path / "f32.onnx", tmp_path / f"int8.{fmt}.onnx"
    tessera.onnx.export(m, x, str(src))
    name = ort_session(tessera.onnx.export(m, x)).get_inputs()[0].name
    oq.quantize_static(str(src), str(dst), _Reader(name, [_data(2, k).numpy() for k in range(6)]),
                       quant_format=getattr(oq.QuantFormat, fmt), per_channel=True,
                       activation_type=oq.QuantType.QUInt8, weight_type=oq.QuantType.QInt8)
    import onnx
    proto = onnx.load(str(dst))
    if fmt == "QOperator":  # onnxruntime's own (com.microsoft) operators among them
        assert {"QLinearAdd", "QLinearGlobalAveragePool"} <= \
            {n.op_type for n in proto.graph.node if n.domain == "com.microsoft"}
    want = ort_run(proto, [x.numpy()])[0]
    loaded = tessera.onnx.load(proto)
    got = loaded.run(x)[0].numpy()
    ops = {n.op.name for n in loaded.graph.nodes}
    assert "quantized_conv2d" in ops, ops
    if fmt == "QOperator":
        assert "quantized_add" in ops, ops
    # the runtimes round a few requantizations differently; those steps propagate
    assert np.abs(got - want).max() < 0.05 * (np.abs(want).max() + 1e-3)


class _Heads(nn.Module):
    """Concatenation, sigmoid and leaky ReLU after a convolution (float32)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        z = tessera.cat([y, x], dim=1)
        return tessera.sigmoid(z) + nn.functional.leaky_relu(z, 0.1)


def test_onnxruntime_qoperator_activations_and_concat_run_in_tessera(tmp_path):
    """QLinearConcat, QLinearSigmoid and QLinearLeakyRelu (com.microsoft) import as
    dequantize-compute-quantize and agree with onnxruntime to a quantization step."""
    import onnx
    from onnxruntime import quantization as oq
    tessera.manual_seed(0)
    m = _Heads().eval()
    x = _data(1, 3)
    src, dst = tmp_path / "f32.onnx", tmp_path / "int8.onnx"
    tessera.onnx.export(m, x, str(src))
    name = ort_session(tessera.onnx.export(m, x)).get_inputs()[0].name
    # (7-bit weights: onnxruntime's AVX2 products without VNNI saturate on 8-bit ones)
    oq.quantize_static(str(src), str(dst), _Reader(name, [_data(1, k).numpy() for k in range(4)]),
                       quant_format=oq.QuantFormat.QOperator, reduce_range=True,
                       activation_type=oq.QuantType.QUInt8, weight_type=oq.QuantType.QInt8)
    proto = onnx.load(str(dst))
    contrib = {n.op_type for n in proto.graph.node if n.domain == "com.microsoft"}
    assert {"QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAdd"} <= contrib
    want = ort_run(proto, [x.numpy()])[0]
    got = tessera.onnx.load(proto).run(x)[0].numpy()
    out_q = next(n for n in proto.graph.node if n.op_type == "DequantizeLinear")
    step = float(onnx.numpy_helper.to_array(
        next(t for t in proto.graph.initializer if t.name == out_q.input[1])))
    # a step in each of the three requantizations before the last one
    assert np.abs(got - want).max() <= 3 * step * 1.01


def test_qlinear_matmul_and_dynamic_forms_import():
    """QLinearMatMul of int8 constant weights runs as ``quantized_linear``; the dynamic
    form (DynamicQuantizeLinear, MatMulInteger) as tessera ops; both as onnxruntime."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    # 7-bit weights: onnxruntime's AVX2 products without VNNI saturate on 8-bit ones
    w = rng.integers(-64, 64, (16, 5)).astype(np.int8)
    consts = {"as": np.float32(0.02), "az": np.uint8(120), "bs": np.float32(0.01),
              "bz": np.int8(0), "ys": np.float32(0.05), "yz": np.uint8(100), "w": w}
    g = helper.make_graph(
        [helper.make_node("QLinearMatMul", ["a", "as", "az", "w", "bs", "bz", "ys", "yz"],
                          ["y"])], "qmm",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, 16])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [3, 5])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    a = rng.integers(0, 256, (3, 16)).astype(np.uint8)
    m = tessera.onnx.load(proto)
    assert [n.op.name for n in m.graph.nodes] == ["quantized_linear"]
    got, want = m.run(a)[0].numpy(), ort_run(proto, [a])[0]
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1

    tessera.manual_seed(0)
    dyn = tq.quantize_dynamic(_Bert().eval(), {nn.Linear})
    for mod in dyn.modules():
        if hasattr(mod, "reduce_range"):
            mod.reduce_range = False
    x = tessera.randn(2, 5, 32)
    proto = tessera.onnx.export(dyn, x)
    got = tessera.onnx.load(proto).run(x)[0].numpy()
    np.testing.assert_allclose(got, ort_run(proto, [x.numpy()])[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("requantized", [True, False])
def test_qgemm_imports_as_quantized_linear(requantized):
    """com.microsoft QGemm (per-channel int8 weights, an int32 bias): ``quantized_linear``
    when it requantizes, float32 otherwise; both as onnxruntime computes them."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(1)
    consts = {"as": np.float32(0.02), "az": np.uint8(120),
              "b": rng.integers(-64, 64, (16, 5)).astype(np.int8),   # (as above)
              "bs": (rng.random(5) * 0.01 + 0.005).astype(np.float32),
              "bz": np.zeros(5, np.int8), "c": rng.integers(-500, 500, 5).astype(np.int32),
              "ys": np.float32(0.05), "yz": np.uint8(100)}
    ins = ["a", "as", "az", "b", "bs", "bz", "c"] + (["ys", "yz"] if requantized else [])
    out_t = TensorProto.UINT8 if requantized else TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("QGemm", ins, ["y"], domain="com.microsoft")], "qgemm",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, 16])],
        [helper.make_tensor_value_info("y", out_t, [3, 5])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()
         if k in ins])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.microsoft", 1)])
    a = rng.integers(0, 256, (3, 16)).astype(np.uint8)
    m = tessera.onnx.load(proto)
    got, want = m.run(a)[0].numpy(), ort_run(proto, [a])[0]
    if requantized:
        ops = [n.op.name for n in m.graph.nodes]
        assert "quantized_linear" in ops and "matmul" not in ops, ops
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
