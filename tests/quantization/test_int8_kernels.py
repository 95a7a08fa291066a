"""The INT8 GEMM on every instruction set this CPU has, bit for bit against the NumPy
integer reference, and the forced-path rule."""
import numpy as np
import pytest

from tessera.kernels import int8

SHAPES = [(1, 1, 1), (5, 7, 3), (17, 33, 40), (64, 256, 100), (9, 12, 33)]


@pytest.mark.parametrize("path", [p for p in int8.available() if p != "numpy"])
@pytest.mark.parametrize("out", [np.uint8, np.int8, np.float32])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_gemm_bit_exact(path, out, m, k, n):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    mult = (rng.random(n) * 1e-3).astype(np.float32)
    bias = rng.integers(-1000, 1000, n).astype(np.int32)
    kw = dict(a_zp=7, mult=mult, out_zp=3, bias=bias, out_dtype=out, relu=True, bias_f=mult)
    ref = int8.reference(a, w, **kw)
    np.testing.assert_array_equal(int8.gemm(a, w, path=path, **kw), ref)
    # 7-bit activations (reduce_range; AVX2's tiles without the split of the 8th bit), and
    # the extremes, whose pair sums (255 * -128 * 2) are past int16
    for a2, w2 in ((a // 2, w), (np.full_like(a, 255), np.full_like(w, -128)),
                   (np.full_like(a, 255), np.full_like(w, 127))):
        np.testing.assert_array_equal(int8.gemm(a2, w2, path=path, **kw),
                                      int8.reference(a2, w2, **kw))


def test_forcing_a_path(monkeypatch):
    monkeypatch.setenv("TESSERA_INT8_ISA", "bogus")
    with pytest.raises(ValueError, match="TESSERA_INT8_ISA"):
        int8.isa()
    monkeypatch.setenv("TESSERA_INT8_ISA", "c")
    assert int8.isa() == ("c" if "c" in int8.available() else None) or "c" not in \
        int8.available()
