"""Hypothesis: random valid equations (1-4 operands, repeated letters, size-1 broadcasting,
ellipses, implicit and explicit outputs, spaces) agree with torch.einsum, forward and
backward, and give the same shape on the meta device."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings, strategies as st

import tessera

POOL = "abcdeXY"


@st.composite
def equations(draw):
    sizes = {x: draw(st.integers(0, 3)) for x in POOL}
    n_ops = draw(st.integers(1, 4))
    ell = draw(st.lists(st.integers(1, 3), max_size=2))  # the ellipsis dims' full sizes
    terms, shapes = [], []
    for _ in range(n_ops):
        letters = draw(st.lists(st.sampled_from(POOL), max_size=4))
        shape = [sizes[x] for x in letters]
        for k, x in enumerate(letters):  # a dim of size 1 broadcasts (not on a repeat)
            if letters.index(x) == k and letters.count(x) == 1 and draw(st.booleans()) \
                    and draw(st.booleans()):
                shape[k] = 1
        text = "".join(letters)
        if ell and draw(st.booleans()):
            k = draw(st.integers(0, len(letters)))
            n = draw(st.integers(0, len(ell)))
            dims = [1 if draw(st.booleans()) else s for s in ell[len(ell) - n:]]
            text = text[:k] + "..." + text[k:]
            shape = shape[:k] + dims + shape[k:]
        terms.append(text)
        shapes.append(tuple(shape))
    used = sorted(set("".join(terms).replace(".", "")))
    eq = ",".join(terms)
    if draw(st.booleans()):  # explicit output: a subset of the used letters, any order
        out = draw(st.permutations(used))[:draw(st.integers(0, len(used)))]
        out = "".join(out)
        if any("..." in t for t in terms) and draw(st.booleans()):
            k = draw(st.integers(0, len(out)))
            out = out[:k] + "..." + out[k:]
        eq += "->" + out
    if draw(st.booleans()):
        eq = " ".join(eq.replace("...", "_")).replace("_", "...")
    return eq, shapes


@settings(max_examples=150, deadline=None)
@given(equations(), st.integers(0, 2**31 - 1))
def test_random_equations_match_torch(case, seed):
    eq, shapes = case
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in shapes]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    try:
        ref = torch.einsum(eq, *ts)
    except RuntimeError:  # e.g. sizes that do not broadcast: we must refuse it too
        try:
            tessera.einsum(eq, *[tessera.tensor(a) for a in arrays])
        except RuntimeError:
            return
        raise AssertionError(f"torch refuses {eq} {shapes} but tessera accepts it")
    xs = [tessera.tensor(a, requires_grad=True) for a in arrays]
    out = tessera.einsum(eq, *xs)
    assert tuple(out.shape) == tuple(ref.shape), (eq, shapes)
    meta = tessera.einsum(eq, *[tessera.empty(s, device="meta") for s in shapes])
    assert tuple(meta.shape) == tuple(ref.shape), (eq, shapes)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-9,
                               atol=1e-9)
    g = rng.standard_normal(tuple(ref.shape))
    ref.backward(torch.tensor(g))
    out.backward(tessera.tensor(g))
    for x, t in zip(xs, ts):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-9, atol=1e-9,
                                   err_msg=f"{eq} {shapes}")
