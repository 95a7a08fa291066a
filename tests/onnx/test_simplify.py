"""The simplifier (tessera's graph passes over an imported model) and the command line."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tessera
import tessera.models
import tessera.onnx
from tessera import nn
from tests.onnx.helpers import ort_run

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(2)
HERE = os.path.dirname(os.path.abspath(__file__))


def _x(*shape):
    return tessera.tensor(RNG.standard_normal(shape), dtype=tessera.float32)


def _bn_stats(model):
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(_x(m.num_features) * 0.1)
            m.running_var.copy_(tessera.rand(m.num_features) + 0.5)
    return model


MODELS = {
    "mlp": lambda: (nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), (_x(4, 6),)),
    "resnet18": lambda: (_bn_stats(tessera.models.resnet18(num_classes=5)),
                         (_x(1, 3, 32, 32),)),
    "mobilenet_v2": lambda: (_bn_stats(tessera.models.mobilenet_v2(num_classes=5)),
                             (_x(1, 3, 32, 32),)),
    "transformer": lambda: (nn.TransformerEncoder(nn.TransformerEncoderLayer(
        16, 4, 32, batch_first=True), 2), (_x(2, 5, 16),)),
    "bert": lambda: (tessera.models.BertModel(tessera.models.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=32)), (tessera.tensor([[2, 7, 9, 3, 4]]),
                                 tessera.tensor([[1, 1, 1, 0, 1]]))),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_simplified_model_computes_the_same(name):
    model, args = MODELS[name]()
    before = tessera.onnx.export(model, args)
    after = tessera.onnx.simplify(before)
    onnx.checker.check_model(after, full_check=True)
    assert len(after.graph.node) < len(before.graph.node)
    assert [i.name for i in after.graph.input] == [i.name for i in before.graph.input]
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]
    arrays = [a.numpy() for a in args]
    for want, got in zip(ort_run(before, arrays), ort_run(after, arrays)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def test_conv_bn_folded_and_weight_transposes_folded():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                      nn.Linear(4 * 6 * 6, 2))
    _bn_stats(m)
    after = tessera.onnx.simplify(tessera.onnx.export(m, (_x(1, 3, 8, 8),)))
    assert [n.op_type for n in after.graph.node] == ["Conv", "Relu", "Reshape", "Gemm"]


def test_simplify_writes_file_and_dynamic_model_needs_shapes(tmp_path):
    m = nn.Linear(3, 2)
    src = tmp_path / "in.onnx"
    tessera.onnx.export(m, (_x(2, 3),), src, dynamic_axes={"input0": {0: "n"}})
    with pytest.raises(ValueError, match="input_shapes"):
        tessera.onnx.simplify(src)
    out = tmp_path / "out.onnx"
    tessera.onnx.simplify(src, out, input_shapes=[(4, 3)])
    onnx.checker.check_model(str(out), full_check=True)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tessera.onnx", *args], capture_output=True,
                          text=True, cwd=os.path.join(HERE, "..", ".."))


def _main(capsys, *args):
    """The command line's ``main`` in this process, as ``_cli``'s result: each command's
    work without a fresh interpreter's start-up (``_cli`` runs the real command line)."""
    from tessera.onnx.__main__ import main
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as e:   # argparse's --help
        code = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def test_cli(tmp_path, capsys):
    path = str(tmp_path / "lenet.onnx")
    r = _cli("export", "tessera.models:lenet5", path, "--input-shape", "1,1,28,28")
    assert r.returncode == 0, r.stderr
    r = _main(capsys, "inspect", path)
    assert r.returncode == 0, r.stderr
    assert "opset 17" in r.stdout and "Conv" in r.stdout and "parameters:" in r.stdout
    simple = str(tmp_path / "s.onnx")
    r = _main(capsys, "simplify", path, simple)
    assert r.returncode == 0 and "nodes ->" in r.stdout, r.stderr
    r = _main(capsys, "run", simple, "--check", "--compiled")
    assert r.returncode == 0 and "onnxruntime" in r.stdout, r.stderr
    for cmd in ("export", "inspect", "simplify", "run"):
        assert _main(capsys, cmd, "--help").returncode == 0


def test_cli_bad_files(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01garbage")
    # the first through the real command line: nothing but the one error line on stderr
    for r in (_cli("inspect", str(bad)), _main(capsys, "run", str(tmp_path / "missing.onnx"))):
        assert r.returncode == 1
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    old = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", 1, [2])],
        [onnx.helper.make_tensor_value_info("y", 1, [2])]),
        opset_imports=[onnx.helper.make_opsetid("", 9)])
    p = tmp_path / "old.onnx"
    onnx.save(old, str(p))
    r = _main(capsys, "run", str(p))
    assert r.returncode == 1 and "opset 9 is not supported" in r.stderr


@pytest.mark.parametrize("name", sorted(MODELS))
def test_never_more_nodes_than_onnxsim(name):
    onnxsim = pytest.importorskip("onnxsim")
    model, args = MODELS[name]()
    proto = tessera.onnx.export(model, args)
    theirs, ok = onnxsim.simplify(proto)
    assert ok
    assert len(tessera.onnx.simplify(proto).graph.node) <= len(theirs.graph.node)
