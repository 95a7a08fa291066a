"""float32 matrix products on tessera's own GEMM (``ops.linalg._own_gemm``): transposed and
stacked operands, ``out``, the products a compiled MLP training step makes (each GEMM
micro-kernel in a child process), and the classifier loss read after them, against
PyTorch."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import tessera
from tessera.kernels import cc
from tessera.ops import linalg

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def spy(monkeypatch) -> list:
    """The products ``_own_gemm`` takes (True) or leaves to NumPy (False), in order."""
    taken, real = [], linalg._own_gemm

    def own(a, b, out):
        res = real(a, b, out)
        taken.append(res is not None)
        return res
    monkeypatch.setattr(linalg, "_own_gemm", own)
    return taken


@pytest.mark.parametrize("layout", ["plain", "a.T", "b.T", "both.T", "stack", "stack b.T"])
def test_products_equal_pytorch(monkeypatch, layout):
    from tessera.kernels import gemm
    if not gemm.available():
        pytest.skip("code generation is off")
    taken = spy(monkeypatch)
    a = rand(3, 40, 70) if "stack" in layout else rand(70, 40).T if "a.T" in layout \
        or "both" in layout else rand(40, 70)
    b = rand(50, 70, seed=1).T if "b.T" in layout or "both" in layout else rand(70, 50, seed=1)
    got = (tessera.from_numpy(a) @ tessera.from_numpy(b)).numpy()
    want = (torch.from_numpy(np.ascontiguousarray(a)) @ torch.from_numpy(
        np.ascontiguousarray(b))).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert taken == [gemm.isa() == "avx512"]   # (AVX2 and portable leave it to NumPy's BLAS)


def test_small_non_float32_and_strided_stacks_stay_on_numpy(monkeypatch):
    taken = spy(monkeypatch)
    cases = [(rand(4, 8), rand(8, 8)),                                 # too few rows
             (rand(40, 70).astype(np.float64), rand(70, 50).astype(np.float64)),
             (rand(3, 70, 40).swapaxes(1, 2), rand(70, 50))]          # rows not one matrix
    for a, b in cases:
        got = (tessera.from_numpy(a) @ tessera.from_numpy(b)).numpy()
        np.testing.assert_allclose(got, (torch.from_numpy(np.ascontiguousarray(a))
                                         @ torch.from_numpy(b)).numpy(), rtol=1e-5, atol=1e-4)
    assert True not in taken


def test_out_is_written_in_place():
    a, b = rand(2, 32, 64), rand(64, 48, seed=1)
    out = np.full((2, 32, 48), np.nan, np.float32)
    res = linalg._matmul_kernel(a, b, out=out)
    assert res is out
    np.testing.assert_allclose(out, (torch.from_numpy(a) @ torch.from_numpy(b)).numpy(),
                               rtol=1e-5, atol=1e-4)


_CHILD = r"""
import numpy as np, torch, tessera
from tessera.kernels import gemm

def step_losses(lib, steps=3):
    lib.manual_seed(0)
    nn = lib.nn
    model = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    rng = np.random.default_rng(0)
    x = lib.from_numpy(rng.standard_normal((32, 48)).astype(np.float32))
    y = lib.from_numpy(rng.integers(0, 10, 32))
    if lib is tessera:   # the weights PyTorch starts from
        for p, q in zip(model.parameters(), init):
            p.data = tessera.from_numpy(q.copy())
    opt = lib.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    if lib is tessera:
        class Step(tessera.nn.Graph):
            def __init__(self):
                super().__init__()
                self.model = model
                self.add_optimizer(opt)

            def build(self, x, y):
                loss = loss_fn(self.model(x), y)
                loss.backward()
                return loss
        g = Step()
        run = lambda: g(x, y).item()
    else:
        def run():
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            return loss.item()
    losses = [run() for _ in range(steps)]
    return losses, [p.detach().numpy().copy() for p in model.parameters()]

torch.manual_seed(0)
ref = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                          torch.nn.ReLU(), torch.nn.Linear(64, 10))
init = [p.detach().numpy().copy() for p in ref.parameters()]
want, want_w = step_losses(torch)
got, got_w = step_losses(tessera)
np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
for a, b in zip(got_w, want_w):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
print(gemm.isa(), "ok")
"""


@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable"])
def test_mlp_training_graph_on_each_micro_kernel_equals_pytorch(isa):
    """The step's products (X W^T forward, dY W and X^T dY backward, views read in place)
    and its loss, with the GEMM path forced; a path the CPU lacks is skipped."""
    from tessera.kernels import gemm
    if not gemm.available():
        pytest.skip("code generation is off")
    env = dict(os.environ, TESSERA_GEMM_ISA=isa)
    env.pop("TESSERA_MAX_ISA", None)
    proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    if proc.returncode and "lacks" in proc.stderr:
        pytest.skip(f"this CPU lacks the {isa} micro-kernel")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == [isa, "ok"]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [-100, 3])
def test_nll_loss_equals_pytorch(reduction, ignore_index):
    x = torch.from_numpy(rand(64, 10)).log_softmax(1)
    t = torch.from_numpy(np.random.default_rng(2).integers(0, 10, 64))
    got = tessera.nn.functional.nll_loss(tessera.from_numpy(x.numpy()),
                                         tessera.from_numpy(t.numpy()), reduction=reduction,
                                         ignore_index=ignore_index)
    want = torch.nn.functional.nll_loss(x, t, reduction=reduction, ignore_index=ignore_index)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)


def test_nll_loss_target_out_of_range_raises_like_pytorch():
    x, t = rand(4, 10), np.array([0, 1, 10, 2])
    with pytest.raises(IndexError, match="Target 10 is out of bounds"):
        tessera.nn.functional.nll_loss(tessera.from_numpy(x), tessera.from_numpy(t))
    with pytest.raises(IndexError):
        torch.nn.functional.nll_loss(torch.from_numpy(x), torch.from_numpy(t))
