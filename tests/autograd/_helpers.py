"""Shared helpers of the autograd tests: run one scenario on tessera and on torch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera

X = np.array([0.5, -1.25, 2.0], dtype=np.float64)
M = np.array([[0.3, -0.7], [1.1, 0.25], [-0.4, 0.9]], dtype=np.float64)


def _flat(out):
    if isinstance(out, (tuple, list)):
        return [y for o in out for y in _flat(o)]
    return [out]


def _np(t):
    return t.detach().numpy() if t is not None else None


def same(fn, atol=1e-10, rtol=1e-7):
    """Run ``fn(L)`` on both libraries and compare what comes back (or what is raised)."""
    try:
        ref = fn(torch)
    except Exception as e:  # noqa: BLE001  (any torch error must be matched by type)
        with pytest.raises(type(e)) as ours:
            fn(tessera)
        return e, ours.value
    ours = fn(tessera)
    fo, fr = _flat(ours), _flat(ref)
    assert len(fo) == len(fr)
    for k, (o, r) in enumerate(zip(fo, fr)):
        if isinstance(r, torch.Tensor):
            assert isinstance(o, tessera.Tensor), f"result {k}: {type(o)}"
            assert tuple(o.shape) == tuple(r.shape), f"result {k}: {o.shape} vs {r.shape}"
            assert o.dtype.name == str(r.dtype).removeprefix("torch."), f"result {k}"
            np.testing.assert_allclose(_np(o), _np(r), atol=atol, rtol=rtol,
                                       err_msg=f"result {k}")
        elif r is None:
            assert o is None, f"result {k}: expected None, got {o}"
        else:
            assert o == pytest.approx(r), f"result {k}"
    return ref, ours


def leaf(L, a=X):
    return L.tensor(a, requires_grad=True)
