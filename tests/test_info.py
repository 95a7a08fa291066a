"""finfo/iinfo against PyTorch, and the BLAS thread count."""
import pytest
import torch

import tessera


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64"])
def test_finfo_matches_torch(name):
    a, b = tessera.finfo(getattr(tessera, name)), torch.finfo(getattr(torch, name))
    for field in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution"):
        assert getattr(a, field) == getattr(b, field), field


@pytest.mark.parametrize("name", ["uint8", "int8", "int16", "int32", "int64"])
def test_iinfo_matches_torch(name):
    a, b = tessera.iinfo(getattr(tessera, name)), torch.iinfo(getattr(torch, name))
    assert (a.bits, a.min, a.max) == (b.bits, b.min, b.max)


def test_info_rejects_the_wrong_kind():
    with pytest.raises(TypeError):
        tessera.finfo(tessera.int32)
    with pytest.raises(TypeError):
        tessera.iinfo(tessera.float32)


def test_set_num_threads_limits_blas():
    before = tessera.get_num_threads()
    try:
        tessera.set_num_threads(1)
        assert tessera.get_num_threads() == 1
    finally:
        tessera.set_num_threads(before)
    with pytest.raises(ValueError):
        tessera.set_num_threads(0)
