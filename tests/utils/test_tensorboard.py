"""tessera.utils.tensorboard against torch.utils.tensorboard: the same calls write the same
summaries, read back with TensorBoard's own event reader."""
from __future__ import annotations

import importlib
import io
import os
import socket
import sys

import numpy as np
import pytest

pytest.importorskip("tensorboard")
torch = pytest.importorskip("torch")

from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)
from tensorboard.backend.event_processing.event_file_loader import (  # noqa: E402
    LegacyEventFileLoader,
)
from torch.utils.tensorboard import SummaryWriter as TorchWriter  # noqa: E402

import tessera  # noqa: E402
from tessera import nn  # noqa: E402
from tessera.utils.tensorboard import SummaryWriter  # noqa: E402


def _summaries(logdir) -> list:
    """(step, summary value) of every summary in the run's event files, file by file, as
    written (the legacy loader does not migrate old-style summaries to tensors)."""
    out = []
    for name in sorted(os.listdir(logdir)):
        if name.startswith("events.out.tfevents"):
            for ev in LegacyEventFileLoader(os.path.join(logdir, name)).Load():
                if ev.HasField("summary"):
                    out += [(ev.step, v) for v in ev.summary.value]
    return out


def _both(tmp_path, write):
    """Run ``write(writer, lib)`` with tessera's and PyTorch's writers; their summaries."""
    ours, theirs = tmp_path / "tessera", tmp_path / "torch"
    with SummaryWriter(str(ours)) as w:
        write(w, tessera)
    with TorchWriter(str(theirs)) as w:
        write(w, torch)
    return _summaries(ours), _summaries(theirs)


def test_scalars_as_torch(tmp_path):
    def write(w, lib):
        for step in range(4):
            w.add_scalar("loss", 1.0 / (step + 1), step)
            w.add_scalar("lr", lib.tensor(0.1 * step), step)
            w.add_scalar("new", step * 2.5, step, new_style=True)
    ours, theirs = _both(tmp_path, write)
    assert ours == theirs and len(ours) == 12
    acc = EventAccumulator(str(tmp_path / "tessera"))
    acc.Reload()
    assert [(s.step, s.value) for s in acc.Scalars("loss")] == \
        [(i, pytest.approx(1.0 / (i + 1))) for i in range(4)]


def test_add_scalars_runs_as_torch(tmp_path):
    def write(w, lib):
        w.add_scalars("run", {"a": 1.0, "b": 2.0}, 0)
    _both(tmp_path, write)
    for sub in ("run_a", "run_b"):
        assert _summaries(tmp_path / "tessera" / sub) == _summaries(tmp_path / "torch" / sub)


@pytest.mark.parametrize("bins", ["tensorflow", "auto", 7])
def test_histograms_as_torch(tmp_path, bins):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(50, 4)).astype(np.float32)

    def write(w, lib):
        w.add_histogram("w", lib.tensor(data), 3, bins=bins)
        w.add_histogram("np", data[:, 0] * 100, 4, bins=bins, max_bins=5)
    ours, theirs = _both(tmp_path, write)
    assert ours == theirs
    acc = EventAccumulator(str(tmp_path / "tessera"))
    acc.Reload()
    h = acc.Histograms("w")[0]
    assert h.step == 3 and h.histogram_value.num == data.size
    assert sum(h.histogram_value.bucket) == data.size


def test_images_as_torch(tmp_path):
    from PIL import Image
    rng = np.random.default_rng(1)
    chw = rng.random((3, 6, 5)).astype(np.float32)
    batch = rng.random((5, 1, 4, 4)).astype(np.float32)
    hwc = (rng.random((4, 7, 3)) * 255).astype(np.uint8)

    def write(w, lib):
        w.add_image("chw", lib.tensor(chw), 0)
        w.add_image("hwc", hwc, 1, dataformats="HWC")
        w.add_image("hw", lib.tensor(chw[0]), 2, dataformats="HW")
        w.add_images("batch", lib.tensor(batch), 3)
    ours, theirs = _both(tmp_path, write)
    assert len(ours) == len(theirs) == 4
    for (s1, a), (s2, b) in zip(ours, theirs):
        assert s1 == s2 and a.tag == b.tag
        assert (a.image.height, a.image.width, a.image.colorspace) == \
            (b.image.height, b.image.width, b.image.colorspace)
        pa = np.asarray(Image.open(io.BytesIO(a.image.encoded_image_string)))
        pb = np.asarray(Image.open(io.BytesIO(b.image.encoded_image_string)))
        np.testing.assert_array_equal(pa, pb)
    acc = EventAccumulator(str(tmp_path / "tessera"))
    acc.Reload()
    assert sorted(acc.Tags()["images"]) == ["batch", "chw", "hw", "hwc"]
    with SummaryWriter(str(tmp_path / "bad")) as w:
        with pytest.raises(ValueError, match="dataformats"):
            w.add_image("x", chw, 0, dataformats="HW")
        with pytest.raises(TypeError, match="1, 3 or 4 channels"):
            w.add_image("x", chw, 0, dataformats="HWC")


def test_text_as_torch(tmp_path):
    def write(w, lib):
        w.add_text("notes", "**hello** tessera", 5)
    ours, theirs = _both(tmp_path, write)
    assert ours == theirs
    acc = EventAccumulator(str(tmp_path / "tessera"))
    acc.Reload()
    t = acc.Tensors("notes/text_summary")[0]
    assert t.step == 5 and t.tensor_proto.string_val == [b"**hello** tessera"]


def test_hparams_as_torch(tmp_path):
    from tensorboard.plugins.hparams import plugin_data_pb2

    def write(w, lib):
        w.add_hparams({"lr": 0.01, "bs": 32, "opt": "adam", "nesterov": True},
                      {"hparam/acc": 0.75}, hparam_domain_discrete={"opt": ["adam", "sgd"]},
                      run_name="trial")
    _both(tmp_path, write)
    ours = _summaries(tmp_path / "tessera" / "trial")
    theirs = _summaries(tmp_path / "torch" / "trial")
    assert ours == theirs and len(ours) == 4
    start = next(v for _, v in ours if v.tag == "_hparams_/session_start_info")
    data = plugin_data_pb2.HParamsPluginData.FromString(start.metadata.plugin_data.content)
    assert data.session_start_info.hparams["opt"].string_value == "adam"
    assert data.session_start_info.hparams["lr"].number_value == 0.01
    with SummaryWriter(str(tmp_path / "bad")) as w:
        with pytest.raises(TypeError, match="dictionary"):
            w.add_hparams([("lr", 1)], {})


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.fc = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(self.conv(x).relu().flatten(1))


def test_graph_nodes_by_module_path(tmp_path):
    model = _Net()
    with SummaryWriter(str(tmp_path)) as w:
        w.add_graph(model, tessera.randn(2, 1, 6, 6))
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert acc.Tags()["graph"] and acc.Tags()["run_metadata"] == ["step1"]
    nodes = {n.name: n for n in acc.Graph().node}
    assert {"input/input0", "output/output0", "_Net/conv/weight", "_Net/fc/bias"} <= set(nodes)
    assert "_Net/conv/conv" in nodes and nodes["_Net/conv/conv"].op == "conv"
    assert list(nodes["_Net/conv/conv"].input)[:2] == ["input/input0", "_Net/conv/weight"]
    shape = nodes["_Net/conv/conv"].attr["_output_shapes"].list.shape[0]
    assert [d.size for d in shape.dim] == [2, 2, 4, 4]
    # every input names a node of the graph
    assert all(i.split(":")[0] in nodes for n in nodes.values() for i in n.input)
    assert model.training  # add_graph traced in eval mode and put the mode back


def test_graph_of_an_nn_graph(tmp_path):
    class Infer(nn.Graph):
        def __init__(self, m):
            super().__init__()
            self.model = m

        def build(self, x):
            return self.model(x)
    g = Infer(_Net())
    x = tessera.randn(2, 1, 6, 6)
    with SummaryWriter(str(tmp_path)) as w:
        w.add_graph(g, x)  # compiled by the call
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    names = [n.name for n in acc.Graph().node]
    assert any(n.startswith("model/conv/") for n in names)
    assert any(n.startswith("model/fc/") for n in names)


def test_embedding_files(tmp_path):
    from google.protobuf import text_format
    from tensorboard.plugins.projector.projector_config_pb2 import ProjectorConfig
    mat = tessera.randn(6, 3)
    with SummaryWriter(str(tmp_path)) as w:
        w.add_embedding(mat, metadata=list("abcdef"), label_img=tessera.rand(6, 3, 4, 4),
                        global_step=2, tag="emb")
    config = text_format.Parse((tmp_path / "projector_config.pbtxt").read_text(),
                               ProjectorConfig())
    info = config.embeddings[0]
    assert info.tensor_name == "emb:00002" and info.tensor_path == "00002/emb/tensors.tsv"
    rows = (tmp_path / info.tensor_path).read_text().splitlines()
    np.testing.assert_allclose(np.array([r.split("\t") for r in rows], float), mat.numpy(),
                               rtol=1e-6)
    assert (tmp_path / info.metadata_path).read_text().split() == list("abcdef")
    assert (tmp_path / info.sprite.image_path).exists()


def test_purge_step_suffix_and_default_logdir(tmp_path, monkeypatch):
    with SummaryWriter(str(tmp_path / "p"), purge_step=7, filename_suffix=".v1") as w:
        w.add_scalar("x", 1.0, 7)
    (name,) = os.listdir(tmp_path / "p")
    assert name.endswith(".v1")
    events = list(LegacyEventFileLoader(str(tmp_path / "p" / name)).Load())
    logs = [e for e in events if e.HasField("session_log")]
    assert len(logs) == 1 and logs[0].step == 7 and logs[0].session_log.status == 1
    monkeypatch.chdir(tmp_path)
    w = SummaryWriter(comment="_exp")
    w.close()
    assert w.log_dir.startswith("runs" + os.sep)
    assert w.log_dir.endswith("_" + socket.gethostname() + "_exp")
    assert os.path.isdir(w.log_dir)


def test_close_then_write_reopens(tmp_path):
    w = SummaryWriter(str(tmp_path))
    w.add_scalar("x", 1.0, 0)
    w.close()
    w.add_scalar("x", 2.0, 1)
    w.flush()
    w.close()
    assert [s for s, _ in _summaries(tmp_path)] == [0, 1]


def test_import_error_without_tensorboard(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    for name in [m for m in sys.modules if m.startswith("tessera.utils.tensorboard")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match="TensorBoard logging requires TensorBoard version "
                                          "1.15 or above"):
        importlib.import_module("tessera.utils.tensorboard")
