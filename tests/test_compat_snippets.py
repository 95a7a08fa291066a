"""Typical PyTorch snippets run unchanged with ``import tessera as torch``.

Each snippet is source text; it runs once after ``import torch`` and once after
``import tessera as torch``. What it prints (with ``tessera.`` read as ``torch.`` and autograd
node names compared by kind) and the value it leaves in ``result`` must be the same.
"""
from __future__ import annotations

import contextlib
import io
import re
import textwrap

import numpy as np
import pytest

SNIPPETS = {
    "create-and-print": """
        x = torch.tensor([[1, 2, 3], [4, 5, 6]])
        print(x)
        print(x.shape, x.dtype, x.dim(), x.numel())
        y = x.float() / 2
        print(y)
        print(y.t().contiguous().view(-1))
        result = y
    """,
    "broadcast-and-reduce": """
        x = torch.arange(12.).view(3, 4)
        b = torch.tensor([1., 0., -1., 2.])
        z = x * b + 1
        print(z.sum(0))
        print(z.mean(dim=1, keepdim=True))
        print(z.max(), z.argmax(), z.argmax(dim=1))
        vals, idx = z.max(dim=0)
        print(vals, idx)
        result = z.std(1)
    """,
    "indexing-and-masking": """
        x = torch.arange(20).reshape(4, 5)
        print(x[1], x[:, 2], x[1:3, ::2], x[-1, -1].item())
        mask = x % 3 == 0
        print(mask.sum())
        x[mask] = -1
        print(x)
        x[0, :] = torch.tensor([9, 8, 7, 6, 5])
        print(x[[0, 2], [1, 3]])
        print(x[x > 10].tolist())
        result = x
    """,
    "join-and-split": """
        a = torch.ones(2, 3)
        b = torch.zeros(2, 3)
        c = torch.cat([a, b], dim=0)
        s = torch.stack([a, b], dim=1)
        print(c.shape, s.shape)
        p, q = c.chunk(2)
        print(torch.equal(p, a), torch.equal(q, b))
        parts = torch.split(torch.arange(7), [2, 5])
        print([t.tolist() for t in parts])
        print(s.unsqueeze(0).squeeze().permute(2, 0, 1).shape)
        result = s.flatten(1)
    """,
    "linear-regression": """
        X = torch.linspace(-1, 1, 20).unsqueeze(1)
        Y = 3 * X + 0.5
        w = torch.zeros(1, 1, requires_grad=True)
        b = torch.zeros(1, requires_grad=True)
        for step in range(50):
            pred = X @ w + b
            loss = ((pred - Y) ** 2).mean()
            loss.backward()
            with torch.no_grad():
                w -= 0.3 * w.grad
                b -= 0.3 * b.grad
                w.grad.zero_()
                b.grad.zero_()
            if step % 10 == 0:
                print(f"{step} {loss.item():.4f}")  # float32 sums differ in the last bits
        print(w.detach().round(decimals=3), b.detach().round(decimals=3))
        result = torch.cat([w.detach().flatten(), b.detach()])
    """,
    "softmax-by-hand": """
        logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
        e = (logits - logits.max(dim=-1, keepdim=True).values).exp()
        probs = e / e.sum(-1, keepdim=True)
        print(probs)
        print(probs.sum(-1))
        target = torch.tensor([2, 0])
        nll = -probs.log()[torch.arange(2), target].mean()
        print(f"{nll:.4f}")
        result = probs
    """,
    "autograd-grad": """
        x = torch.tensor([0.5, 1.0, 2.0], requires_grad=True)
        y = (x ** 3 + x.sin()).sum()
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        (h,) = torch.autograd.grad(g.sum(), x)
        print(g)
        print(h)
        print(y.requires_grad, g.requires_grad, h.requires_grad, x.is_leaf)
        result = h
    """,
    "dtypes-and-promotion": """
        i = torch.arange(4)
        f = torch.ones(4)
        print(i.dtype, f.dtype, (i + f).dtype, (i / 2).dtype, (i * 2).dtype, (i + 1.5).dtype)
        print((i > 1).dtype, torch.tensor(3).dtype, torch.tensor(3.0).dtype)
        d = f.double()
        print((d + f).dtype, d.to(torch.float16).dtype, i.to(f).dtype)
        print(torch.tensor([True, False]).sum(), torch.zeros(2, dtype=torch.int32) + 1)
        result = (i.float() / 3).to(torch.float64)
    """,
    "sort-and-topk": """
        x = torch.tensor([3.0, 1.0, 4.0, 1.5, 9.0, 2.6])
        v, i = torch.sort(x, descending=True)
        print(v, i)
        t = x.topk(2)
        print(t.values, t.indices)
        print(x.argsort(), torch.argmax(x).item())
        result = x.cumsum(0)
    """,
    "one-hot-and-scatter": """
        labels = torch.tensor([0, 2, 1, 2])
        oh = torch.zeros(4, 3).scatter_(1, labels.unsqueeze(1), 1.0)
        print(oh)
        counts = oh.sum(0)
        print(counts, counts.long())
        print(torch.where(oh > 0, oh, torch.full_like(oh, -1.0)))
        result = oh.argmax(1)
    """,
    "inplace-and-clone": """
        a = torch.ones(3)
        b = a
        c = a.clone()
        a.add_(1)
        a.mul_(torch.tensor([1.0, 2.0, 3.0]))
        print(b, c)
        d = a.view(3, 1)
        d[0, 0] = 100
        print(a)
        e = a.detach()
        e.zero_()
        print(a)
        result = c
    """,
    "matrix-ops": """
        a = torch.arange(6.0).view(2, 3)
        b = torch.arange(12.0).view(3, 4) / 10
        c = a @ b
        print(c)
        print(c.T.shape, torch.matmul(a, b).allclose(c), a.mm(b).sum())
        batch = torch.ones(5, 2, 3) @ torch.ones(3, 4)
        print(batch.shape, batch[0])
        result = c
    """,
}


def _run(src: str, lib: str):
    header = "import torch\n" if lib == "torch" else "import tessera as torch\n"
    scope: dict = {"__name__": f"snippet_{lib}"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(header + textwrap.dedent(src), f"<{lib} snippet>", "exec"), scope)
    return out.getvalue(), scope.get("result")


def _norm(text: str) -> str:
    return re.sub(r"grad_fn=<\w+>", "grad_fn=<...>", text.replace("tessera.", "torch."))


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_snippet_runs_the_same(name):
    ref_out, ref = _run(SNIPPETS[name], "torch")
    out, ours = _run(SNIPPETS[name], "tessera")
    assert _norm(out) == _norm(ref_out), f"\n--- tessera\n{out}\n--- torch\n{ref_out}"
    assert tuple(ours.shape) == tuple(ref.shape)
    assert ours.dtype.name == str(ref.dtype).removeprefix("torch.")
    np.testing.assert_allclose(ours.detach().numpy(), ref.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
