"""Gaps found running PyTorch's official examples (pytorch/examples) with tessera as
``torch``: each test checks one behaviour those scripts rely on, against PyTorch."""
import numpy as np
import pytest
import torch

import tessera

ARC = ["arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh"]


@pytest.mark.parametrize("name", ARC)
def test_numpy_named_inverse_trig(name):
    # fx/invert.py pairs torch.sin with torch.arcsin
    x = np.array([0.2, 0.5, 0.9], np.float32) + (1.5 if name == "arccosh" else 0.0)
    want = getattr(torch, name)(torch.tensor(x)).numpy()
    np.testing.assert_allclose(getattr(tessera, name)(tessera.tensor(x)).numpy(), want,
                               rtol=1e-6)
    np.testing.assert_allclose(getattr(tessera.tensor(x), name)().numpy(), want, rtol=1e-6)
    t = tessera.tensor(x)
    assert getattr(t, name + "_")() is t
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-6)
