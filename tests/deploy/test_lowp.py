"""tessera.deploy.export_c of low-precision models: INT8 models converted by
tessera.ao.quantization (post-training static and quantize_dynamic) and packed binary
networks (tessera.nn.binary.pack), each built with the folder's Makefile and run through its
C driver against tessera eager. The INT8 and binary kernels are eager mode's own, so the
library's results are eager's bit for bit on the same instruction set; each path is forced
in the library (TESSERA_INT8_ISA, TESSERA_BINARY_ISA) and in eager mode alike."""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import tessera
import tessera.nn.binary as bnn
from tessera import nn
from tessera.ao import quantization as tq
from tessera.ao.nn import quantized as nnq
from tessera.kernels import binary as KB, int8 as K8
from tests.deploy.test_export import build, eager, pytestmark, run_driver

__all__ = ["pytestmark"]


class LeNet5(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.conv1, self.relu1 = nn.Conv2d(1, 6, 5, padding=2), nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2, self.relu2 = nn.Conv2d(6, 16, 5), nn.ReLU()
        self.pool2, self.flat = nn.MaxPool2d(2), nn.Flatten()
        self.fc1, self.relu3 = nn.Linear(400, 120), nn.ReLU()
        self.fc2, self.relu4 = nn.Linear(120, 84), nn.ReLU()
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool1(self.relu1(self.conv1(self.quant(x))))
        x = self.flat(self.pool2(self.relu2(self.conv2(x))))
        x = self.relu4(self.fc2(self.relu3(self.fc1(x))))
        return self.dequant(self.fc3(x))

    fuse = [["conv1", "relu1"], ["conv2", "relu2"], ["fc1", "relu3"], ["fc2", "relu4"]]


class ResBlock(nn.Module):
    """A residual block and its neighbours: strided and 1x1 convolutions, a quantized add
    with ReLU, a depthwise convolution, a concatenation that requantizes, padded max
    pooling, adaptive average pooling, a linear layer on 18 inputs (not a multiple of 4)."""

    def __init__(self):
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.stem, self.relu0 = nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU()
        self.conv1, self.relu1 = nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.skip = nn.Conv2d(16, 16, 1)
        self.add, self.cat = nnq.FloatFunctional(), nnq.FloatFunctional()
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.narrow = nn.Conv2d(32, 18, 1)
        self.pool, self.avg = nn.MaxPool2d(3, 2, 1), nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(18, 10)

    def forward(self, x):
        x = self.relu0(self.stem(self.quant(x)))
        y = self.conv2(self.relu1(self.conv1(x)))
        y = self.add.add_relu(y, self.skip(x))
        z = self.narrow(self.cat.cat([y, self.dw(y)], 1))
        return self.dequant(self.fc(self.avg(self.pool(z)).flatten(1)))

    fuse = [["stem", "relu0"], ["conv1", "relu1"]]


def ptq(model, shape):
    """``model`` quantized post-training, calibrated on random data."""
    tessera.manual_seed(0)
    m = tq.fuse_modules(model.eval(), model.fuse)
    m.qconfig = tq.get_default_qconfig("x86")
    p = tq.prepare(m)
    with tessera.no_grad():
        for _ in range(4):
            p(tessera.randn(4, *shape[1:]))
    return tq.convert(p)


@pytest.fixture(scope="module")
def lenet_int8(tmp_path_factory):
    model = ptq(LeNet5(), (1, 1, 28, 28))
    x = tessera.randn(2, 1, 28, 28)
    return model, x, build(model, (x,), tmp_path_factory.mktemp("lenet_int8"), "qlenet")


def test_int8_lenet_is_eager_bit_for_bit(lenet_int8):
    model, x, out = lenet_int8
    ref = eager(model, (x,))
    for threads in (1, 2):
        np.testing.assert_array_equal(run_driver(out, "qlenet", (x,), threads=threads), ref)


def test_int8_weights_are_stored_once(lenet_int8):
    """The weights file holds the tensors the program reads and nothing else: a quantized
    layer's int8 weight only as the panels packed from it, not also as stored."""
    import re

    from tessera.deploy._capture import capture
    from tessera.deploy._emit import emit
    from tessera.graph.memory import ALIGN
    model, x, out = lenet_int8
    g, values = capture(model, (x,))
    prog = emit("qlenet", g, values)
    text = "\n".join(prog.steps + prog.kernels)
    reads = {int(r) for r in re.findall(r"\(m->w \+ (\d+)\)", text)}
    reads |= {off for off, _, _ in prog.packed}
    stored = {}   # offset -> bytes of each tensor in the payload
    for name, (off, arr) in prog.weights.items():
        stored[off] = arr.nbytes if arr is not None else g.variables[name].nbytes
    starts = sorted(stored)
    # each tensor stored is read, at its start or inside it, and each read is of one stored
    assert {max(s for s in starts if s <= r) for r in reads} == set(starts)
    assert all(r < s + max(stored[s], 1) for r in reads
               for s in [max(t for t in starts if t <= r)])
    blob = (out / "qlenet.weights").read_bytes()
    payload = sum((b + ALIGN - 1) // ALIGN * ALIGN for b in stored.values())
    assert len(blob) == 64 + payload
    layers = [m for m in model.modules() if isinstance(m, (nnq.Linear, nnq.Conv2d))]
    assert len(layers) == 5
    for m in layers:
        w = m.weight.numpy()
        assert w.tobytes() not in blob
        packed = K8._Conv(w, 1).packed[0] if w.ndim == 4 else K8.Packed(w)
        assert packed.data.tobytes() in blob


def test_int8_residual_block_is_eager_bit_for_bit(tmp_path):
    model = ptq(ResBlock(), (1, 3, 32, 32))
    x = tessera.randn(1, 3, 32, 32)
    out = build(model, (x,), tmp_path, "qres")
    ref = eager(model, (x,))
    for threads in (1, 2):
        np.testing.assert_array_equal(run_driver(out, "qres", (x,), threads=threads), ref)


def test_quantize_dynamic_mlp_is_eager_bit_for_bit(tmp_path):
    tessera.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(18, 64), nn.ReLU(), nn.Linear(64, 40), nn.ReLU(),
                        nn.Linear(40, 10)).eval()
    model = tq.quantize_dynamic(mlp, {nn.Linear}, dtype=tessera.qint8)
    x = tessera.randn(3, 5, 18)
    out = build(model, (x,), tmp_path, "qdyn")
    ref = eager(model, (x,))
    for threads in (1, 2):
        np.testing.assert_array_equal(run_driver(out, "qdyn", (x,), threads=threads), ref)


def binary_net():
    """dabnn's shape of a binary network: a float first convolution, binary inner layers
    (-1 and 0 padding, a stride, per-channel scales), batch norms, a float last layer."""
    tessera.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.PReLU(64),
        bnn.BinaryConv2d(64, 96, 3, padding=1, scale="channel"), nn.BatchNorm2d(96),
        bnn.BinaryConv2d(96, 64, 3, stride=2, padding=1, pad_value=0), nn.BatchNorm2d(64),
        nn.PReLU(), nn.Flatten(), bnn.BinaryLinear(64 * 6 * 6, 100, scale="channel"),
        nn.BatchNorm1d(100), nn.Linear(100, 10))
    for mod in m.modules():  # statistics that are not the identity
        if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)):
            mod.running_mean.copy_(tessera.randn(mod.num_features) * 0.1)
            mod.running_var.copy_(tessera.rand(mod.num_features) + 0.5)
    return bnn.pack(m.eval())


def test_packed_binary_network_matches_eager(tmp_path):
    model = binary_net()
    x = tessera.randn(2, 3, 12, 12)
    out = build(model, (x,), tmp_path, "bnet")
    ref = eager(model, (x,))
    for threads in (1, 2):
        # the float layers round as the float library does; the binary ones are exact
        np.testing.assert_allclose(run_driver(out, "bnet", (x,), threads=threads), ref,
                                   rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def binary_first(tmp_path_factory):
    """Binary layers straight on the input: nothing float rounds before them."""
    tessera.manual_seed(2)
    m = bnn.pack(nn.Sequential(
        bnn.BinaryConv2d(70, 40, 3, padding=2, dilation=2, scale="channel", pad_value=0),
        nn.Flatten(), bnn.BinaryLinear(40 * 9 * 9, 33)).eval())
    x = tessera.randn(1, 70, 9, 9)
    return m, x, build(m, (x,), tmp_path_factory.mktemp("bfirst"), "bfirst")


def test_binary_layers_are_eager_bit_for_bit(binary_first):
    model, x, out = binary_first
    np.testing.assert_array_equal(run_driver(out, "bfirst", (x,), threads=2),
                                  eager(model, (x,)))


@pytest.mark.parametrize("isa", ["amx", "vnni512", "avxvnni", "avx2", "c"])
def test_forced_int8_paths(isa, lenet_int8, monkeypatch):
    model, x, out = lenet_int8
    env = {**os.environ, "TESSERA_INT8_ISA": isa}
    if isa not in K8.available():
        r = _run_refused(out, "qlenet", x, env)
        assert r.returncode != 0 and "lacks" in r.stderr, r.stderr
        return
    monkeypatch.setenv("TESSERA_INT8_ISA", isa)  # AVX2 saturates as eager's AVX2 path does
    np.testing.assert_array_equal(run_driver(out, "qlenet", (x,), env=env), eager(model, (x,)))


def test_int8_library_without_amx(lenet_int8, tmp_path):
    """Built as by a compiler that lacks AMX (its kernel compiled out): the library still
    builds (-Werror), runs eager's arithmetic, and refuses TESSERA_INT8_ISA=amx."""
    from tessera.deploy._files import CFLAGS
    model, x, _ = lenet_int8
    out = build(model, (x,), tmp_path, "qlenet", cflags=CFLAGS + " -DTSR_NO_AMX")
    np.testing.assert_array_equal(run_driver(out, "qlenet", (x,)), eager(model, (x,)))
    r = _run_refused(out, "qlenet", x, {**os.environ, "TESSERA_INT8_ISA": "amx"})
    assert r.returncode != 0 and "TESSERA_INT8_ISA=amx: this CPU lacks it" in r.stderr, r.stderr


def _run_refused(out, name: str, x, env) -> subprocess.CompletedProcess:
    """The driver run on a real input (the path is checked at the first run, after the
    input is read), for a forced path this CPU lacks."""
    np.save(out / "in_refused.npy", x.numpy())
    return subprocess.run([str(out / f"run_{name}"), str(out / f"{name}.weights"),
                           str(out / "in_refused.npy"), str(out / "out_refused.npy")],
                          capture_output=True, text=True, env=env)


@pytest.mark.parametrize("isa", ["vpopcnt", "avx2", "c"])
def test_forced_binary_paths(isa, binary_first):
    model, x, out = binary_first
    env = {**os.environ, "TESSERA_BINARY_ISA": isa}
    if isa not in KB.available():
        r = _run_refused(out, "bfirst", x, env)
        assert r.returncode != 0 and "lacks" in r.stderr, r.stderr
        return
    np.testing.assert_array_equal(run_driver(out, "bfirst", (x,), env=env), eager(model, (x,)))


def test_unknown_paths_fail_the_run(lenet_int8, binary_first):
    for (_, x, out), name, var in ((lenet_int8, "qlenet", "TESSERA_INT8_ISA"),
                                   (binary_first, "bfirst", "TESSERA_BINARY_ISA")):
        np.save(out / "in0.npy", x.numpy())
        r = subprocess.run([str(out / f"run_{name}"), str(out / f"{name}.weights"),
                            str(out / "in0.npy"), str(out / "o.npy")], capture_output=True,
                           text=True, env={**os.environ, var: "sse9"})
        assert r.returncode != 0 and f"{var}=sse9: expected" in r.stderr


def test_qdq_onnx_of_an_int8_model_exports_bit_for_bit(lenet_int8, tmp_path):
    """tessera's QDQ ONNX, read back (QDQ pairs become INT8 ops again), as a C library."""
    import tessera.onnx
    model, x, _ = lenet_int8
    tessera.onnx.export(model, (x,), str(tmp_path / "q.onnx"))
    out = build(str(tmp_path / "q.onnx"), (x,), tmp_path, "qonnx")
    np.testing.assert_array_equal(run_driver(out, "qonnx", (x,)), eager(model, (x,)))


def test_bitpacked_binary_chain_is_eager_bit_for_bit(tmp_path):
    """Binary layers that pass bits on (``pack`` folds the batch norms between them into
    thresholds): the library's signs and outputs are eager's, bit for bit."""
    tessera.manual_seed(4)
    m = nn.Sequential(
        bnn.BinaryConv2d(70, 40, 3, padding=1, scale="channel"), nn.BatchNorm2d(40),
        bnn.BinaryConv2d(40, 66, 3, padding=1, pad_value=0), nn.BatchNorm2d(66),
        bnn.BinaryConv2d(66, 16, 3, stride=2, padding=1, scale="channel"), nn.Flatten(),
        bnn.BinaryLinear(16 * 5 * 5, 80, scale="channel"), nn.BatchNorm1d(80),
        bnn.BinaryLinear(80, 10))
    with tessera.no_grad():
        for mod in m.modules():
            if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)):
                mod.running_mean.copy_(tessera.randn(mod.num_features))
                mod.weight.copy_(tessera.randn(mod.num_features))
    model = bnn.pack(m.eval())
    assert model[2].input_bits and model[8].input_bits
    x = tessera.randn(2, 70, 9, 9)
    out = build(model, (x,), tmp_path, "bchain")
    for threads in (1, 2):
        np.testing.assert_array_equal(run_driver(out, "bchain", (x,), threads=threads),
                                      eager(model, (x,)))
