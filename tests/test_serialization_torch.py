"""PyTorch checkpoint files both ways (real torch is the oracle), crafted pickles that set a
tensor's internals, compact views, and temporaries of dead writers."""
from __future__ import annotations

import collections
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tessera
from tessera import nn

torch = pytest.importorskip("torch")

DTYPES = ["float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
          "uint8", "bool", "complex64", "complex128"]


def as_numpy(t):
    if isinstance(t, tessera.Tensor):
        t = t.detach()
        return (t.float() if t.dtype == tessera.bfloat16 else t).numpy()
    t = t.detach()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def same_tensor(ours, theirs):
    assert str(ours.dtype).rpartition(".")[2] == str(theirs.dtype).rpartition(".")[2]
    assert tuple(ours.shape) == tuple(theirs.shape)
    assert tuple(ours.stride()) == tuple(theirs.stride())
    np.testing.assert_array_equal(as_numpy(ours), as_numpy(theirs))


# ---- torch -> tessera --------------------------------------------------------------------

@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_load_torch_files_of_every_dtype_and_view(tmp_path, legacy):
    base = torch.arange(12.0).view(3, 4)
    obj = {f"d_{n}": (torch.arange(6) % 3).to(getattr(torch, n)).view(2, 3) for n in DTYPES}
    obj.update(base=base, col=base[:, 1], expanded=torch.ones(1).expand(5),
               param=torch.nn.Parameter(torch.ones(2)), size=torch.Size([2, 3]),
               dtype=torch.bfloat16, nested=[{"x": (1, 2.5, "s", None)}],
               od=collections.OrderedDict(k=torch.zeros(1)))
    path = tmp_path / "t.pt"
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    out = tessera.load(path)
    for k, v in obj.items():
        if isinstance(v, torch.Tensor):
            same_tensor(out[k], v)
    assert type(out["param"]) is nn.Parameter and out["param"].requires_grad
    assert out["size"] == tessera.Size([2, 3]) and type(out["size"]) is tessera.Size
    assert out["dtype"] is tessera.bfloat16 and out["nested"] == [{"x": (1, 2.5, "s", None)}]
    assert type(out["od"]) is collections.OrderedDict
    out["base"][0, 1] = 7.0  # a view of the same storage sees the write, as in PyTorch
    assert out["col"][0].item() == 7.0


def test_load_torch_resnet18_state_dict_and_optimizer(tmp_path):
    models = pytest.importorskip("tessera.models")
    ref = models.resnet18()
    theirs = {k: torch.from_numpy(as_numpy(v).copy()) for k, v in ref.state_dict().items()}
    tm = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(tm.parameters(), lr=0.1)
    tm(torch.ones(4, 3)).sum().backward()
    opt.step()
    path = tmp_path / "ckpt.pth"
    torch.save({"model": collections.OrderedDict(theirs), "optim": opt.state_dict()}, path)
    out = tessera.load(path, map_location="cpu")
    net = models.resnet18()
    result = net.load_state_dict(out["model"])
    assert result.missing_keys == [] and result.unexpected_keys == []
    for k, v in theirs.items():
        same_tensor(out["model"][k], v)
    want = opt.state_dict()
    assert out["optim"]["param_groups"] == want["param_groups"]
    for i, st in want["state"].items():
        for name, v in st.items():
            same_tensor(out["optim"]["state"][i][name], v)


def test_map_location_forms_and_mmap(tmp_path):
    path = tmp_path / "m.pt"
    torch.save({"w": torch.arange(4.0)}, path)
    seen = []
    for ml in ["cpu", torch.device("cpu"), tessera.device("cpu"), {"cpu": "cpu"},
               lambda t, loc: seen.append(loc)]:
        assert tessera.load(path, map_location=ml)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert seen == ["cpu"]
    mapped = tessera.load(path, mmap=True)["w"]
    mapped.add_(1)  # copy-on-write: the file keeps its data
    assert tessera.load(path)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match="map_location='cpu'"):
        tessera.load(path, map_location={"cpu": "cuda:7"})


def test_weights_only_refuses_code_in_torch_files(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    for legacy in (False, True):
        path = tmp_path / f"evil{legacy}.pt"
        torch.save({"w": torch.ones(1), "x": Evil()}, path,
                   _use_new_zipfile_serialization=not legacy)
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
            tessera.load(path)
        assert not marker.exists()
        with pytest.raises(pickle.UnpicklingError):
            torch.load(path, weights_only=True)  # the oracle refuses it too


# ---- tessera -> torch --------------------------------------------------------------------

def test_torch_reads_what_tessera_writes(tmp_path):
    base = tessera.arange(12.0).view(3, 4)
    obj = {f"d_{n}": (tessera.arange(6) % 3).to(getattr(tessera, n)).view(2, 3)
           for n in DTYPES}
    obj.update(base=base, col=base[:, 1], t=base.t(), expanded=tessera.ones(1).expand(5),
               param=nn.Parameter(tessera.ones(2)), size=tessera.Size([2, 3]),
               dtype=tessera.complex64, nested=[{"x": (1, 2.5, "s", None)}],
               od=collections.OrderedDict(k=tessera.zeros(1)), empty=tessera.zeros(0, 3))
    path = tmp_path / "w.pt"
    tessera.save(obj, path, format="torch")
    out = torch.load(path, weights_only=True)
    for k, v in obj.items():
        if isinstance(v, tessera.Tensor):
            same_tensor(v, out[k])
    assert type(out["param"]) is torch.nn.Parameter and out["param"].requires_grad
    assert out["size"] == torch.Size([2, 3]) and out["dtype"] is torch.complex64
    assert out["nested"] == [{"x": (1, 2.5, "s", None)}]
    assert out["col"].untyped_storage().data_ptr() == out["base"].untyped_storage().data_ptr()
    assert torch.load(path, weights_only=True, mmap=True)["base"].sum().item() == 66.0


def test_torch_reads_a_tessera_resnet18_and_optimizer_state(tmp_path):
    models = pytest.importorskip("tessera.models")
    net = models.resnet18()
    opt = tessera.optim.Adam(net.fc.parameters(), lr=0.1)
    net.fc(tessera.ones(2, 512)).sum().backward()
    opt.step()
    path = tmp_path / "r.pt"
    tessera.save({"model": net.state_dict(), "optim": opt.state_dict()}, path, format="torch")
    out = torch.load(path, weights_only=True)
    assert list(out["model"]) == list(net.state_dict())
    for k, v in net.state_dict().items():
        same_tensor(v, out["model"][k])
    tv = pytest.importorskip("torchvision")
    ref = tv.models.resnet18()
    assert ref.load_state_dict(out["model"]).missing_keys == []
    for i, st in opt.state_dict()["state"].items():
        for name, v in st.items():
            if isinstance(v, tessera.Tensor):
                same_tensor(v, out["optim"]["state"][i][name])


# ---- crafted pickles that reach a tensor's internals -------------------------------------

CRAFTED = b"".join([
    b"\x80\x02ccopyreg\n_reconstructor\n(ctessera\nTensor\ncbuiltins\nobject\nNtR",
    b"(N}X\x08\x00\x00\x00_versionK\x01\x85stb.",
])
NEWOBJ_BUILD = b"\x80\x02ctessera\nTensor\n)\x81(N}X\x08\x00\x00\x00_versionK\x01\x85stb."


@pytest.mark.parametrize("payload", [CRAFTED, NEWOBJ_BUILD], ids=["reconstructor", "newobj"])
def test_crafted_tensor_state_is_refused_and_never_crashes(tmp_path, payload):
    path = tmp_path / "crafted.pkl"
    path.write_bytes(payload)
    with pytest.raises(pickle.UnpicklingError):
        tessera.load(path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    # the same file, loaded and used, in a child: a clean exception, never a signal
    child = textwrap.dedent(f"""
        import pickle, tessera
        try:
            t = tessera.load({str(path)!r})
            (t + 1, t * t)
        except pickle.UnpicklingError:
            print("refused")
    """)
    run = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(tessera.__file__)), timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "refused"


def test_fast_path_takes_no_slot_it_did_not_make():
    good = tessera.ones(3)
    for slots in [{"_version": (1,)}, {"_version": []}, {"_shape": [3]}, {"_shape": None}]:
        t = object.__new__(tessera.Tensor)
        for k in tessera.Tensor.__slots__[:-2]:
            object.__setattr__(t, k, getattr(good, k))
        for k, v in slots.items():
            object.__setattr__(t, k, v)
        for use in (lambda: t + 1, lambda: t * t):
            try:
                use()
            except (TypeError, IndexError, AttributeError, ValueError):
                pass


# ---- compact views -------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["tessera", "torch"])
def test_expanded_view_is_saved_compactly(tmp_path, fmt):
    x = tessera.ones(1).expand(2 ** 24)
    path = tmp_path / "e.ckpt"
    tessera.save({"x": x}, path, format=fmt)
    assert path.stat().st_size < 4096
    ref = torch.ones(1).expand(2 ** 24)
    torch.save({"x": ref}, tmp_path / "ref.pt")
    same = torch.load(tmp_path / "ref.pt")["x"]
    out = tessera.load(path)["x"]
    assert tuple(out.shape) == tuple(same.shape) and out.stride() == same.stride() == (0,)
    assert out[0].item() == out[-1].item() == 1.0


def test_strided_views_keep_sharing_in_tessera_format(tmp_path):
    base = tessera.arange(20.0).view(4, 5)
    obj = {"rows": base[1:3], "col": base[:, 2], "bcast": base[0].expand(3, 5)}
    path = tmp_path / "v.safetensors"
    tessera.save(obj, path)
    out = tessera.load(path)
    for k, v in obj.items():
        assert out[k].tolist() == v.tolist() and out[k].stride() == v.stride()
    assert path.stat().st_size < 20 * 4 + 4096


# ---- temporaries of dead writers ----------------------------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    dead = tmp_path / f".ckpt.safetensors.tessera-{_dead_pid()}-abc123.tmp"
    fresh_dead = tmp_path / f".ckpt.safetensors.tessera-{_dead_pid()}-new999.tmp"
    live = tmp_path / f".other.pt.tessera-{os.getppid()}-xyz789.tmp"
    unrelated = tmp_path / ".notes.1.tmp"
    for p in (dead, fresh_dead, live, unrelated):
        p.write_bytes(b"partial")
    old = os.stat(dead).st_mtime - 3600
    for p in (dead, live, unrelated):
        os.utime(p, (old, old))
    tessera.save({"w": tessera.ones(2)}, tmp_path / "ckpt.safetensors")
    assert not dead.exists()
    assert fresh_dead.exists()  # may still be written by a writer in another pid namespace
    assert live.exists() and unrelated.exists()
    assert tessera.load(tmp_path / "ckpt.safetensors")["w"].tolist() == [1.0, 1.0]
