"""tessera.save / tessera.load: safetensors checkpoints, shared storage, restricted
unpickling, corruption detection, atomic writes and files written by PyTorch."""
from __future__ import annotations

import collections
import io
import json
import math
import os
import pickle
import struct

import numpy as np
import pytest

import tessera
import tessera.serialization as ser
from tessera import nn


class TinyNet(nn.Module):
    """A user-defined module (not a tessera class, so not allowed by default)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(tessera.arange(6.0).view(2, 3))
        self.bias = nn.Parameter(tessera.zeros(2))
        self.register_buffer("running", tessera.ones(2))
        self.register_buffer("scratch", tessera.zeros(1), persistent=False)

    def forward(self, x):
        return x @ self.weight.t() + self.bias


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


class Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(autouse=True)
def clean_allow_list():
    ser.clear_safe_globals()
    yield
    ser.clear_safe_globals()


def roundtrip(obj, tmp_path, **load_kwargs):
    path = tmp_path / "ckpt.safetensors"
    tessera.save(obj, path)
    return tessera.load(path, **load_kwargs)


def same(a, b) -> bool:
    """Deep equality, with tensors compared by dtype, shape, values and requires_grad."""
    if isinstance(a, tessera.Tensor):
        return (isinstance(b, tessera.Tensor) and type(a) is type(b) and a.dtype == b.dtype
                and a.shape == b.shape and a.requires_grad == b.requires_grad
                and np.array_equal(a.detach().float().numpy() if a.dtype == tessera.bfloat16
                                   else a.detach().numpy(),
                                   b.detach().float().numpy() if b.dtype == tessera.bfloat16
                                   else b.detach().numpy(), equal_nan=True))
    if isinstance(a, np.ndarray):
        return type(b) is np.ndarray and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


# ---- round trips -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int64",
                                   "int32", "int16", "int8", "uint8", "bool", "complex64",
                                   "complex128"])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 0, 3), (2, 3, 4)])
def test_tensor_roundtrip(tmp_path, dtype, shape):
    dt = getattr(tessera, dtype)
    x = tessera.from_numpy((np.arange(int(np.prod(shape))) % 7).reshape(shape).astype(
        dt.np if dtype != "bfloat16" else np.float32)).to(dt)
    assert same(roundtrip(x, tmp_path), x)


def test_noncontiguous_and_requires_grad_tensors(tmp_path):
    base = tessera.arange(24.0).view(2, 3, 4)
    x = base.permute(2, 0, 1)
    y = tessera.ones(3, requires_grad=True)
    out = roundtrip({"x": x, "y": y, "nonleaf": y * 2}, tmp_path)
    assert out["x"].tolist() == x.tolist() and out["x"].shape == (4, 2, 3)
    assert out["y"].requires_grad and out["y"].is_leaf
    assert out["nonleaf"].tolist() == [2.0] * 3


def test_nested_plain_state_roundtrip(tmp_path):
    sd = collections.OrderedDict(a=tessera.ones(2), b=tessera.zeros(1))
    sd._metadata = collections.OrderedDict({"": {"version": 1}, "b": {"version": 2}})
    obj = {
        "model": sd,
        "epoch": 7, "loss": 0.125, "big": 2 ** 70, "neg": -3, "flag": True, "none": None,
        "name": "run-1", "unicode": "héllo ✓", "bytes": b"\x00\xff",
        "nan": float("nan"), "inf": float("inf"), "ninf": float("-inf"), "c": complex(1, -2),
        "tuple": (1, (2.5, "x")), "list": [[], {}, ()], 3: "int key", (1, 2): "tuple key",
        "dtype": tessera.float16, "device": tessera.device("cpu"), "size": tessera.Size([2, 3]),
        "empty": {},
    }
    out = roundtrip(obj, tmp_path)
    assert same(out, obj)
    assert out["model"]._metadata == sd._metadata
    assert out["dtype"] is tessera.float16 and type(out["size"]) is tessera.Size
    assert same(roundtrip([1, "a", None], tmp_path), [1, "a", None])
    assert roundtrip(3.5, tmp_path) == 3.5 and roundtrip(None, tmp_path) is None


def test_numpy_objects_roundtrip(tmp_path):
    arrs = {"f": np.arange(6.0).reshape(2, 3), "u32": np.arange(4, dtype=np.uint32),
            "be": np.arange(3, dtype=">i4"), "str": np.array(["ab", "c"]),
            "t": np.arange(12).reshape(3, 4).T, "scalar": np.float32(2.5), "i": np.int64(-4),
            "dt": np.dtype("float16")}
    out = roundtrip(arrs, tmp_path)
    for k in ("f", "u32", "be", "str", "t"):
        assert same(out[k], arrs[k]), k
    assert out["scalar"] == np.float32(2.5) and type(out["scalar"]) is np.float32
    assert type(out["i"]) is np.int64 and out["dt"] == np.dtype("float16")
    assert same(roundtrip(np.ones((2, 2)), tmp_path), np.ones((2, 2)))


def test_parameters_and_buffers_keep_their_kind(tmp_path):
    p = nn.Parameter(tessera.ones(2))
    frozen = nn.Parameter(tessera.ones(2), requires_grad=False)
    buf = nn.Buffer(tessera.zeros(3), persistent=False)
    out = roundtrip([p, frozen, buf], tmp_path)
    assert type(out[0]) is nn.Parameter and out[0].requires_grad
    assert type(out[1]) is nn.Parameter and not out[1].requires_grad
    assert type(out[2]) is nn.Buffer and out[2].persistent is False


def test_optimizer_state_roundtrip(tmp_path):
    optim = pytest.importorskip("tessera.optim")
    model = TinyNet()
    opt = optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.9), amsgrad=True)
    x = tessera.ones(4, 3)
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
    ckpt = {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 3}
    out = roundtrip(ckpt, tmp_path)
    assert same(out["opt"], opt.state_dict()) and same(out["model"], model.state_dict())

    model2 = TinyNet()
    model2.load_state_dict(out["model"])
    opt2 = optim.AdamW(model2.parameters(), lr=0.5)
    opt2.load_state_dict(out["opt"])
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        m(x).pow(2).sum().backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters()):
        assert a.tolist() == b.tolist()


def test_identity_and_shared_storage(tmp_path):
    x = tessera.arange(12.0).view(3, 4)
    obj = {"x": x, "again": x, "t": x.t(), "row": x[1], "alias": x.detach()}
    path = tmp_path / "shared.safetensors"
    tessera.save(obj, path)
    stored = _header(path.read_bytes())
    assert [k for k in stored if k != "__metadata__"] == ["x"]  # one storage for all views
    out = tessera.load(path)
    assert out["x"] is out["again"]
    assert out["t"].tolist() == x.t().tolist() and out["row"].tolist() == [4.0, 5, 6, 7]
    out["x"][1, 0] = -1.0  # the views share memory again after loading
    assert out["t"][0, 1].item() == -1.0 and out["row"][0].item() == -1.0
    assert out["alias"][1, 0].item() == -1.0


def test_tied_parameters_are_stored_once(tmp_path):
    model = TinyNet()
    model.tied = model.weight  # the same Parameter registered twice
    sd = model.state_dict()
    path = tmp_path / "tied.safetensors"
    tessera.save(sd, path)
    assert len([k for k in _header(path.read_bytes()) if k != "__metadata__"]) == 3
    out = tessera.load(path)
    assert out["weight"].tolist() == out["tied"].tolist()
    out["weight"][0, 0] = 42.0
    assert out["tied"][0, 0].item() == 42.0


def test_map_location(tmp_path):
    obj = {"a": tessera.ones(2), "b": [tessera.zeros(1)]}
    out = roundtrip(obj, tmp_path, map_location="meta")
    assert out["a"].device.type == "meta" and out["b"][0].shape == (1,)
    out = roundtrip(obj, tmp_path, map_location={"cpu": "meta"})
    assert out["a"].is_meta
    seen = []
    out = roundtrip(obj, tmp_path, map_location=lambda t, loc: seen.append(loc))
    assert seen == ["cpu", "cpu"] and out["a"].device.type == "cpu"
    assert roundtrip(tessera.empty(2, 3, device="meta"), tmp_path).shape == (2, 3)


def test_file_objects(tmp_path):
    buf = io.BytesIO()
    tessera.save({"w": tessera.ones(2)}, buf)
    buf.seek(0)
    assert tessera.load(buf)["w"].tolist() == [1.0, 1.0]
    with open(tmp_path / "f.bin", "wb") as fh:
        tessera.save([1, 2], fh)
    with open(tmp_path / "f.bin", "rb") as fh:
        assert tessera.load(fh) == [1, 2]
    with pytest.raises(TypeError):
        tessera.save(1, 42)


def test_self_referencing_list_is_pickled(tmp_path):
    a: list = [1]
    a.append(a)
    out = roundtrip(a, tmp_path)
    assert out[0] == 1 and out[1] is out


# ---- whole objects and the restricted unpickler ------------------------------------------

def test_user_module_needs_allowing(tmp_path):
    model = TinyNet()
    path = tmp_path / "model.pt"
    tessera.save(model, path)
    with pytest.raises(pickle.UnpicklingError, match="TinyNet") as info:
        tessera.load(path)
    assert "add_safe_globals" in str(info.value) and "safe_globals" in str(info.value)
    with ser.safe_globals([TinyNet]):
        loaded = tessera.load(path)
    assert TinyNet not in ser.get_safe_globals()
    _check_model(loaded, model)
    ser.add_safe_globals([TinyNet])
    assert ser.get_safe_globals() == [TinyNet]
    _check_model(tessera.load(path), model)
    ser.clear_safe_globals()
    _check_model(tessera.load(path, weights_only=False), model)


def _check_model(loaded, model):
    assert type(loaded) is TinyNet
    assert type(loaded.weight) is nn.Parameter and loaded.weight.requires_grad
    assert loaded.state_dict().keys() == model.state_dict().keys()
    x = tessera.ones(1, 3)
    assert loaded(x).tolist() == model(x).tolist()


def test_tessera_classes_load_without_allowing(tmp_path):
    m = nn.Module()
    m.register_parameter("w", nn.Parameter(tessera.ones(3)))
    m.register_buffer("b", tessera.zeros(2, dtype=tessera.int64))
    out = roundtrip({"module": m, "dtype": tessera.int8, "gen_free": tessera.Size([1])},
                    tmp_path)
    assert type(out["module"]) is nn.Module and out["module"].w.tolist() == [1.0] * 3
    if hasattr(nn, "Linear") and hasattr(nn, "Sequential"):
        seq = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
        loaded = roundtrip(seq, tmp_path)
        x = tessera.ones(2, 3)
        assert loaded(x).tolist() == seq(x).tolist()


def test_allowing_by_name_and_argument_checks(tmp_path):
    with pytest.raises(pickle.UnpicklingError, match="Point"):
        roundtrip(Point(1, 2), tmp_path)
    ser.add_safe_globals([(Point, f"{Point.__module__}.Point")])
    p = roundtrip(Point(1, tessera.ones(1)), tmp_path)
    assert p.x == 1 and p.y.tolist() == [1.0]
    with pytest.raises(TypeError):
        ser.add_safe_globals(Point)
    with pytest.raises(TypeError):
        ser.add_safe_globals([(Point, 3)])


def test_malicious_checkpoint_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.safetensors"
    tessera.save({"weights": tessera.ones(2), "payload": Evil(str(marker))}, path)
    with pytest.raises(pickle.UnpicklingError, match=r"GLOBAL (posix|os|nt)\.system") as info:
        tessera.load(path)
    assert "add_safe_globals" in str(info.value)
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError):
        tessera.load(path, weights_only=None)
    assert not marker.exists()
    tessera.load(path, weights_only=False)  # only an explicit opt-out runs the code
    assert marker.exists()


def test_malicious_plain_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned2"
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(Evil(str(marker))))
    with pytest.raises(pickle.UnpicklingError, match="system"):
        tessera.load(path)
    assert not marker.exists()
    path.write_bytes(pickle.dumps({"a": [1, 2.0], "b": collections.OrderedDict(c=None)}))
    assert tessera.load(path) == {"a": [1, 2.0], "b": collections.OrderedDict(c=None)}


@pytest.mark.parametrize("payload", [
    b"cbuiltins\neval\n(S'1'\ntR.",                          # builtins.eval
    b"ctessera\nTensor.__init__\n.",                          # attribute path into a class
    b"ctessera.serialization\nsave\n.",                      # a tessera function, not a type
    b"ctessera\n__builtins__\n.",
    b"cnumpy\nload\n.",                                       # numpy, but not a safe name
    b"ccopyreg\n_reconstructor\n(cos\nsystem\n)R.",
], ids=["eval", "dotted", "tessera-func", "tessera-builtins", "numpy-load", "nested"])
def test_crafted_globals_are_refused(tmp_path, payload):
    path = tmp_path / "crafted.pkl"
    path.write_bytes(b"\x80\x02" + payload)
    with pytest.raises(pickle.UnpicklingError, match="Unsupported global"):
        tessera.load(path)


def test_crafted_pickle_entry_inside_a_checkpoint_is_refused(tmp_path):
    # a checkpoint whose pickled entry was replaced by an attacker (checksum recomputed)
    marker = tmp_path / "pwned3"
    evil = pickle.dumps(Evil(str(marker)), protocol=4)
    structure = json.dumps({"version": 1, "root": {"pickle": "p"}, "tensors": []})
    blob = np.frombuffer(evil, np.uint8)
    import safetensors.numpy
    meta = {"format": "tessera", "tessera.version": "1", "tessera.structure": structure}
    meta["tessera.sha256"] = ser._digest(meta, [("p", "U8", [len(evil)], blob)])
    path = tmp_path / "crafted.safetensors"
    path.write_bytes(safetensors.numpy.save({"p": blob}, metadata=meta))
    with pytest.raises(pickle.UnpicklingError, match="system"):
        tessera.load(path)
    assert not marker.exists()


# ---- damaged files -----------------------------------------------------------------------

def _checkpoint_bytes(tmp_path) -> bytes:
    path = tmp_path / "good.safetensors"
    tessera.save({"w": tessera.arange(8.0).view(2, 4), "lr": 0.001, "names": ["a", "b"],
                  "p": Point(1, 2)}, path)
    return path.read_bytes()


def _header(data: bytes) -> dict:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n])


@pytest.mark.parametrize("keep", [0, 5, 8, 40, -60, -1])
def test_truncated_file_is_a_clear_error(tmp_path, keep):
    data = _checkpoint_bytes(tmp_path)
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
    with pytest.raises(RuntimeError, match="truncated|corrupted|not a"):
        tessera.load(path)


def test_every_single_bit_flip_is_detected(tmp_path):
    data = _checkpoint_bytes(tmp_path)
    ser.add_safe_globals([Point])
    undetected = []
    for pos in range(len(data)):
        damaged = bytearray(data)
        damaged[pos] ^= 1 << (pos % 8)
        try:
            tessera.load(io.BytesIO(bytes(damaged)))
        except (RuntimeError, ValueError):
            continue
        undetected.append(pos)
    assert not undetected, f"bit flips at byte offsets {undetected[:10]} were not detected"


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "junk.txt"
    path.write_bytes(b"hello, this is not a checkpoint at all")
    with pytest.raises(RuntimeError):
        tessera.load(path)
    path.write_bytes(b"PK\x03\x04 a zip that is not one")
    with pytest.raises(RuntimeError, match="corrupted zip checkpoint"):
        tessera.load(path)


# ---- atomic writes -----------------------------------------------------------------------

def test_crash_mid_write_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    tessera.save({"version": 1, "w": tessera.ones(1000)}, path)
    before = path.read_bytes()

    def crash(fh, data):
        fh.write(bytes(data[: len(data) // 2]))
        raise OSError("disk full (simulated)")
    monkeypatch.setattr(ser, "_write_payload", crash)
    with pytest.raises(OSError, match="simulated"):
        tessera.save({"version": 2, "w": tessera.zeros(1000)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert tessera.load(path)["version"] == 1
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]  # no temporary file left behind

    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("fsync")))
    with pytest.raises(OSError, match="fsync"):
        tessera.save({"version": 3}, path)
    monkeypatch.undo()
    assert tessera.load(path)["version"] == 1 and len(os.listdir(tmp_path)) == 1
    tessera.save({"version": 4}, path)
    assert tessera.load(path)["version"] == 4


def test_saved_file_mode_is_not_private(tmp_path):
    path = tmp_path / "mode.safetensors"
    tessera.save(1, path)
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask


# ---- safetensors interop ---------------------------------------------------------------------

def test_load_safetensors_written_by_pytorch(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    tensors = {"weight": torch.randn(2, 3), "bias": torch.randn(2),
               "running": torch.arange(2, dtype=torch.float32),
               "bf": torch.randn(5).to(torch.bfloat16), "idx": torch.arange(4),
               "mask": torch.tensor([True, False]), "half": torch.randn(3).half()}
    path = tmp_path / "model.safetensors"
    st_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    out = tessera.load(path)
    assert set(out) == set(tensors)
    for k, t in tensors.items():
        ours = out[k]
        assert str(ours.dtype).rpartition(".")[2] == str(t.dtype).rpartition(".")[2], k
        np.testing.assert_array_equal(ours.float().numpy() if k == "bf" else ours.numpy(),
                                      t.float().numpy() if k == "bf" else t.numpy())
    model = TinyNet()
    result = model.load_state_dict({k: out[k] for k in ("weight", "bias", "running")})
    assert result.missing_keys == [] and result.unexpected_keys == []
    np.testing.assert_array_equal(model.weight.detach().numpy(), tensors["weight"].numpy())
    assert ser.load_file(path)["idx"].tolist() == [0, 1, 2, 3]


def test_model_load_state_dict_from_tessera_checkpoint(tmp_path):
    model = TinyNet()
    with tessera.no_grad():
        model.weight.mul_(3)
    path = tmp_path / "sd.safetensors"
    tessera.save(model.state_dict(), path)
    fresh = TinyNet()
    fresh.load_state_dict(tessera.load(path))
    assert fresh.weight.tolist() == model.weight.tolist()


def test_tessera_state_dict_is_readable_by_safetensors(tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy")
    model = TinyNet()
    path = tmp_path / "sd.safetensors"
    tessera.save(model.state_dict(), path)
    plain = st_numpy.load_file(str(path))
    assert set(plain) == {"weight", "bias", "running"}
    np.testing.assert_array_equal(plain["weight"], model.weight.detach().numpy())
    ser.save_file({"a": tessera.ones(2).bfloat16()}, tmp_path / "plain.safetensors")
    loaded = tessera.load(tmp_path / "plain.safetensors")
    assert loaded["a"].dtype == tessera.bfloat16 and loaded["a"].float().tolist() == [1.0, 1.0]
