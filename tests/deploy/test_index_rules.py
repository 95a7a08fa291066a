"""The rules of tessera/deploy/_emit_index.py and integer outputs, each exported, built with
-Werror and run through the C driver (one thread and two) against tessera eager and PyTorch:
argmax/argmin and max/min along a dim (keepdim, negative dims, ties, NaN), cumsum, topk
(values and indices, ties, NaN), gather, index_select, take_along_dim, reflection,
replication and circular padding, group and instance norms, 1-d and 3-d max pooling; int64,
int32 and bool outputs."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tessera
import tessera.deploy
import tessera.nn.functional as F
from tessera import nn
from tests.deploy.test_export import build, cycles

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")

NAN = float("nan")


class Fns(nn.Module):
    """The results of ``fns`` (each ``f(library, functional, *inputs)``, called with
    tessera's or with torch's), as the model's outputs."""

    def __init__(self, *fns, **modules):
        super().__init__()
        self.fns = fns
        for k, m in modules.items():
            setattr(self, k, m)

    def forward(self, *xs):
        return tuple(f(tessera, F, *xs) for f in self.fns)


def run_outputs(out, name, arrays, count, threads=1):
    paths = []
    for k, a in enumerate(arrays):
        paths.append(str(out / f"in{k}.npy"))
        np.save(paths[-1], a)
    outs = [str(out / f"out{k}.npy") for k in range(count)]
    r = subprocess.run([str(out / f"run_{name}"), str(out / f"{name}.weights"), *paths, *outs,
                        "--threads", str(threads)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return [np.load(p) for p in outs]


def same(got, want, what, library=True):
    """got equals want: exactly for integers and bools (which the library returns as
    int64), within rtol 1e-4 and atol 1e-5 for floats (NaN where want has NaN)."""
    want = np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if want.dtype.kind in "biu":
        assert got.dtype == (np.int64 if library else want.dtype), (what, got.dtype)
        np.testing.assert_array_equal(got, want.astype(np.int64), err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True,
                                   err_msg=what)


LIB = "model"   # the library name of check()'s exports


def check(tmp_path, name, arrays, *fns, torch_fns=None, threads=(1, 2), **modules):
    """Export Fns(*fns) for ``arrays``, run the library and compare every output with
    eager and with PyTorch (``torch_fns``: the same results from torch's modules, where
    they differ from ``fns``; None entries are not compared with PyTorch)."""
    model = Fns(*fns, **modules).eval()
    inputs = tuple(tessera.tensor(a) for a in arrays)
    # every check's library has one name (its folder is ``name``): the runtime and gemm.c,
    # whose symbols carry the library's name, then compile once per run (_cc_cache)
    out = build(model, inputs, tmp_path, LIB, folder=name)
    with tessera.no_grad():
        ref = [r.numpy() for r in model(*inputs)]
    tins = [torch.from_numpy(a) for a in arrays]
    with torch.no_grad():
        tref = [None if f is None else f(torch, TF, *tins).numpy()
                for f in (torch_fns or fns)]
    for k, (e, t) in enumerate(zip(ref, tref)):
        if t is not None:
            same(e, t, f"eager vs torch, output {k}", library=False)
    for n in threads:
        got = run_outputs(out, LIB, arrays, len(fns), threads=n)
        for k, (g, e) in enumerate(zip(got, ref)):
            same(g, e, f"library ({n} threads) vs eager, output {k}")
    return out


def _ints(*shape, hi=4, seed=0):
    """Small whole numbers as float32: many ties."""
    return np.random.default_rng(seed).integers(0, hi, shape).astype(np.float32)


def test_integer_and_bool_outputs(tmp_path):
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    out = check(tmp_path, "ints", [x],
                lambda t, F, x: x.argmax(1),
                lambda t, F, x: x > 0,
                lambda t, F, x: (x > 0).int(),
                lambda t, F, x: x * 2)
    header = (out / f"{LIB}.h").read_text()
    assert "output 0: int64[3] (int64_t values)" in header
    assert "output 1: bool[3, 5] (as int64_t values, 0 or 1)" in header
    assert "output 2: int32[3, 5] (as int64_t values)" in header
    assert "output 3: float32[3, 5]\n" in header
    lib = ctypes.CDLL(str(out / f"lib{LIB}.so"))
    assert [lib.model_output_dtype(k) for k in range(5)] == [1, 1, 1, 0, -1]


def test_non_integer_output_dtype_raises(tmp_path):
    class Half(nn.Module):
        def forward(self, x):
            return x.double()
    with pytest.raises(NotImplementedError, match="output 0 is float64"):
        tessera.deploy.export_c(Half().eval(), (tessera.randn(2),), str(tmp_path / "h"))


def test_argmax_argmin(tmp_path):
    x = _ints(4, 6, 5)
    x[0, 2, 1] = x[1, 0, 0] = x[1, 3, 0] = NAN   # NaN wins (the first NaN), as in PyTorch
    x[2, :, 3] = NAN
    check(tmp_path, "arg", [x],
          lambda t, F, x: x.argmax(1),
          lambda t, F, x: x.argmin(-1, keepdim=True),
          lambda t, F, x: x.argmax(),
          lambda t, F, x: x.argmin(0),
          lambda t, F, x: x.argmax(-3, keepdim=True),
          lambda t, F, x: t.argmax(x[3], dim=-2),
          lambda t, F, x: t.where(x != x, 0.0, x).argmin(1),
          lambda t, F, x: x.max(1)[0],
          lambda t, F, x: x.max(1)[1],
          lambda t, F, x: x.min(-1, keepdim=True)[0],
          lambda t, F, x: x.min(-1, keepdim=True)[1])


def test_argmax_of_integers(tmp_path):
    ids = np.random.default_rng(2).integers(-5, 5, (3, 7)).astype(np.int64)
    check(tmp_path, "argi", [ids],
          lambda t, F, x: x.argmax(1),
          lambda t, F, x: x.argmin(0, keepdim=True))


def test_cumsum(tmp_path):
    x = np.random.default_rng(3).standard_normal((2, 5, 7)).astype(np.float32)
    ids = np.random.default_rng(3).integers(0, 3, (2, 9)).astype(np.int64)
    check(tmp_path, "cumsum", [x, ids],
          lambda t, F, x, i: x.cumsum(1),
          lambda t, F, x, i: x.cumsum(-1),
          lambda t, F, x, i: t.cumsum(x, 0),
          lambda t, F, x, i: (x > 0).cumsum(2),
          lambda t, F, x, i: i.cumsum(-1),
          lambda t, F, x, i: (i != 0).int().cumsum(1) * (i != 0).int())


def test_topk(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)   # no ties: PyTorch's indices too
    y = _ints(3, 10, seed=5)                                   # ties: eager's order
    y[0, 2] = y[0, 7] = y[1, 9] = NAN
    fns = [lambda t, F, x, y: x.topk(3, -1),
           lambda t, F, x, y: x.topk(2, 1, largest=False),
           lambda t, F, x, y: x.topk(1, 0),
           lambda t, F, x, y: x.topk(8, -1),
           lambda t, F, x, y: x.topk(3, -2)[1],
           lambda t, F, x, y: y.topk(4, 1),
           lambda t, F, x, y: y.topk(5, 1, largest=False),
           lambda t, F, x, y: y.topk(10, -1)]
    flat = [lambda f: (lambda t, F, x, y: f(t, F, x, y)[0]),
            lambda f: (lambda t, F, x, y: f(t, F, x, y)[1])]
    outs, torch_outs = [], []
    for k, f in enumerate(fns):
        if k == 4:
            outs.append(f)
            torch_outs.append(f)
            continue
        for part, g in enumerate(flat):
            outs.append(g(f))
            # with ties PyTorch's order among equal values is its sort's (not defined):
            # its values are compared, its indices where there are no ties
            torch_outs.append(g(f) if part == 0 or k < 5 else None)
    check(tmp_path, "topk", [x, y], *outs, torch_fns=torch_outs)
    # ties and NaN: the indices eager gives pick the values PyTorch gives
    ty = torch.from_numpy(y)
    for k, largest in ((4, True), (5, False), (10, True)):
        v, i = tessera.tensor(y).topk(k, 1, largest=largest)
        tv = ty.topk(k, 1, largest=largest).values.numpy()
        np.testing.assert_array_equal(np.take_along_axis(y, i.numpy(), 1), tv)
        np.testing.assert_array_equal(v.numpy(), tv)


def test_gather_index_select_take_along_dim(tmp_path):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    idx = rng.integers(0, 4, (3, 2, 5)).astype(np.int64)
    sel = np.array([4, 0, 0, 2], np.int64)
    check(tmp_path, "gather", [x, idx, sel],
          lambda t, F, x, i, s: x.gather(1, i),
          lambda t, F, x, i, s: t.gather(x, -1, i[:, :, :3] % 5),
          lambda t, F, x, i, s: x.gather(0, i[:2, :1, :2] % 3),
          lambda t, F, x, i, s: x.index_select(2, s),
          lambda t, F, x, i, s: x.index_select(-3, s[1:3]),
          lambda t, F, x, i, s: (i * 2).index_select(0, s[1:3]),
          lambda t, F, x, i, s: t.take_along_dim(x, x.argmax(-1, keepdim=True), -1),
          lambda t, F, x, i, s: t.take_along_dim(x, x.topk(2, 1)[1], 1),
          lambda t, F, x, i, s: x.index_select(1, t.tensor([3, 1])))


def test_out_of_range_index_fails_the_run(tmp_path):
    x = np.ones((2, 3), np.float32)
    out = build(Fns(lambda t, F, x, i: x.index_select(1, i)).eval(),
                (tessera.tensor(x), tessera.tensor([0, 2])), tmp_path, "bad")
    np.save(out / "x.npy", x)
    np.save(out / "i.npy", np.array([0, 3], np.int64))
    r = subprocess.run([str(out / "run_bad"), str(out / "bad.weights"), str(out / "x.npy"),
                        str(out / "i.npy"), str(out / "y.npy")], capture_output=True, text=True)
    assert r.returncode != 0 and "index_select: an index is outside [0, 3)" in r.stderr


def test_padding_modes(tmp_path):
    x = np.random.default_rng(7).standard_normal((2, 3, 5, 6)).astype(np.float32)
    check(tmp_path, "pads", [x],
          lambda t, F, x: F.pad(x, (2, 1, 1, 3), mode="reflect"),
          lambda t, F, x: F.pad(x[:, 0], (3, 4), mode="reflect"),
          lambda t, F, x: F.pad(x, (1, 2, 0, 3), mode="replicate"),
          lambda t, F, x: F.pad(x[None], (1, 0, 2, 1, 1, 1), mode="replicate"),
          lambda t, F, x: F.pad(x, (2, 3, 4, 0), mode="circular"),
          lambda t, F, x: F.pad(x[None], (0, 1, 1, 2, 1, 0), mode="reflect"),
          lambda t, F, x: F.pad(x[:, :, 0], (5, 5), mode="replicate"))


def test_group_and_instance_norms(tmp_path):
    tessera.manual_seed(8)
    mods = {"gn": nn.GroupNorm(3, 6), "gn1": nn.GroupNorm(1, 6, affine=False),
            "in2": nn.InstanceNorm2d(6, affine=True), "in1": nn.InstanceNorm1d(6),
            "in3": nn.InstanceNorm3d(6, affine=True)}
    tmods = {"gn": torch.nn.GroupNorm(3, 6), "gn1": torch.nn.GroupNorm(1, 6, affine=False),
             "in2": torch.nn.InstanceNorm2d(6, affine=True), "in1": torch.nn.InstanceNorm1d(6),
             "in3": torch.nn.InstanceNorm3d(6, affine=True)}
    for k, m in mods.items():
        for p, q in zip(m.parameters(), tmods[k].parameters()):
            nn.init.normal_(p)
            q.data = torch.from_numpy(p.detach().numpy().copy())

    def norm(k, shape=lambda x: x):
        return lambda t, F, x: (mods if t is tessera else tmods)[k](shape(x))
    x = (np.random.default_rng(8).standard_normal((2, 6, 4, 5)) * 3 + 1).astype(np.float32)
    check(tmp_path, "norms", [x], norm("gn"), norm("gn1"), norm("in2"),
          norm("in1", lambda x: x[:, :, 0]), norm("in3", lambda x: x[:, :, None]),
          lambda t, F, x: F.group_norm(x, 2, eps=1e-3),
          lambda t, F, x: F.instance_norm(x[:, :3]), **mods)


def test_max_pooling_1d_and_3d(tmp_path):
    x = np.random.default_rng(9).standard_normal((2, 3, 6, 7)).astype(np.float32)
    x[0, 1, 2, 3] = x[1, 0, 0, 0] = NAN
    check(tmp_path, "pools", [x],
          lambda t, F, x: F.max_pool1d(x[:, 0], 3, stride=2, padding=1),
          lambda t, F, x: F.max_pool1d(x[:, :, 1], 2, ceil_mode=True),
          lambda t, F, x: F.max_pool1d(x[:, :, 2], 3, stride=1, padding=1, dilation=2),
          lambda t, F, x: F.max_pool3d(x[None], 2),
          lambda t, F, x: F.max_pool3d(x[None], (2, 3, 2), stride=(1, 2, 2),
                                       padding=(1, 1, 0), ceil_mode=True),
          lambda t, F, x: F.max_pool3d(x[None], 2, dilation=(1, 2, 1)),
          lambda t, F, x: F.max_pool1d(x[0], 3))


def test_split_over_threads(tmp_path):
    """Inputs big enough for each rule to share its rows out over the threads."""
    x = np.random.default_rng(10).standard_normal((4, 16, 64, 80)).astype(np.float32)
    idx = np.random.default_rng(10).integers(0, 80, (4, 16, 64, 80)).astype(np.int64)
    out = check(tmp_path, "split", [x, idx],
                lambda t, F, x, i: x.argmax(-1),
                lambda t, F, x, i: x.cumsum(2),
                lambda t, F, x, i: x.topk(3, 1)[0],
                lambda t, F, x, i: x.gather(3, i),
                lambda t, F, x, i: F.pad(x, (2, 2, 1, 1), mode="reflect"),
                lambda t, F, x, i: F.group_norm(x, 4),
                lambda t, F, x, i: F.instance_norm(x),
                lambda t, F, x, i: F.max_pool3d(x[None], 2))
    text = (out / f"{LIB}.c").read_text()
    for helper in ("tsr_argmax_float32", "tsr_cumsum_float32_float32", "tsr_topk_largest",
                   "tsr_gather_float32_int64", "tsr_pad_map_float32", "tsr_group_norm",
                   "tsr_channel_norm", "tsr_maxpool3d"):
        assert f"tsr_pool_run({helper}" in text, helper


def test_sanitizers(tmp_path):
    """The rules' C under ASan and UBSan: load/run/free cycles on zeros (index 0), one
    thread and two."""
    model = Fns(lambda t, F, x, i: x.topk(3, -1)[1],
                lambda t, F, x, i: x.argmax(1),
                lambda t, F, x, i: x.gather(2, i),
                lambda t, F, x, i: x.index_select(1, i[0, 0]),
                lambda t, F, x, i: F.pad(x, (2, 1), mode="reflect").cumsum(-1),
                lambda t, F, x, i: F.group_norm(x, 2) + F.instance_norm(x),
                lambda t, F, x, i: F.max_pool1d(x, 2) * F.max_pool3d(x[None, None], 2).sum(),
                lambda t, F, x, i: i > 0).eval()
    cycles(tmp_path, {"model": (model, (tessera.randn(2, 4, 6),
                                        tessera.randint(0, 4, (2, 4, 3))))}, 20)
