"""The quantized convolution in C (im2col from NHWC, the GEMM writing NHWC, the depthwise
kernels) on every instruction set this CPU has, bit for bit against the NumPy im2col and
integer GEMM reference (and the AMX kernel on emulated tiles, where AVX-512 VNNI runs it);
and a quantized module's packed weights following its weights."""
import numpy as np
import pytest

import tessera
from tessera.kernels import int8
from tessera.ops import quantized as Q

# n, cin, h, w, cout, kh, kw, stride, padding, dilation, groups
CASES = [
    (1, 3, 9, 11, 8, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    (1, 5, 13, 13, 7, 7, 7, (2, 2), (3, 3), (1, 1), 1),       # a stem: 7x7 stride 2
    (2, 12, 6, 7, 20, 1, 1, (1, 1), (0, 0), (1, 1), 1),        # 1x1: the GEMM on NHWC
    (1, 6, 5, 5, 9, 1, 1, (1, 1), (0, 0), (1, 1), 1),          # 1x1, K not a multiple of 4
    (1, 32, 14, 14, 64, 1, 1, (2, 2), (0, 0), (1, 1), 1),      # 1x1 stride 2: downsample
    (1, 6, 8, 8, 9, 3, 2, (1, 2), (0, 1), (1, 1), 3),          # groups, odd kernel
    (1, 8, 9, 10, 8, 3, 3, (1, 1), (2, 1), (2, 3), 2),         # dilation
    (2, 6, 7, 5, 6, 3, 3, (2, 2), (1, 1), (1, 1), 6),          # depthwise, batch 2
    (1, 16, 10, 10, 16, 3, 3, (2, 1), (1, 2), (1, 1), 16),     # depthwise, mixed stride
    (1, 8, 9, 9, 24, 3, 3, (1, 1), (2, 2), (2, 2), 8),         # depthwise x3, dilated
    (1, 4, 1, 1, 4, 3, 3, (1, 1), (1, 1), (1, 1), 4),          # depthwise, 1x1 image
    (1, 40, 9, 11, 40, 3, 3, (1, 1), (1, 1), (1, 1), 40),      # depthwise, 16 + 16 + 8
    (1, 48, 13, 12, 48, 5, 5, (2, 2), (2, 2), (1, 1), 48),     # depthwise 5x5 stride 2
    (1, 3, 2, 3, 5, 3, 3, (2, 2), (2, 2), (1, 1), 1),          # mostly padding
]
PATHS = [p for p in int8.available() if p != "numpy"] + (
    [int8.EMULATED] if (int8._cpu_bits() or 0) & 4 else [])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_conv_bit_exact(monkeypatch, path, case):
    n, c, h, w, co, kh, kw, s, p, d, g = case
    rng = np.random.default_rng(sum(case[:7]))
    # AVX2 saturates int16 pair sums of 8-bit activations: x86's 7 bits (reduce_range)
    x = rng.integers(0, 128 if path == "avx2" else 256, (n, c, h, w)).astype(np.uint8)
    wt = rng.integers(-128, 128, (co, c // g, kh, kw)).astype(np.int8)
    ws = (rng.random(co) * 0.01 + 0.001).astype(np.float32)
    bias = rng.standard_normal(co).astype(np.float32)
    for relu, x_zp, out_zp in ((True, 7, 3), (False, 130, 128)):
        args = (wt, ws, bias, s, p, d, g, 0.05, x_zp, 0.2, out_zp, relu)
        monkeypatch.setenv("TESSERA_INT8_ISA", "numpy")
        ref = Q.conv_reference(x, *args)
        monkeypatch.setenv("TESSERA_INT8_ISA", path)
        got = Q._conv_kernel(x, *args)
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("path", PATHS)
def test_channels_last_chain(monkeypatch, path):
    """A convolution's result is channels-last in memory; the next convolution, the
    quantized add and max pooling read it as it is and agree with a contiguous copy."""
    monkeypatch.setenv("TESSERA_INT8_ISA", path)
    rng = np.random.default_rng(3)
    x = rng.integers(0, 128, (1, 16, 9, 9)).astype(np.uint8)
    ws = np.full(32, 0.01, np.float32)
    w1 = rng.integers(-128, 128, (32, 16, 1, 1)).astype(np.int8)
    w2 = rng.integers(-128, 128, (32, 1, 3, 3)).astype(np.int8)
    y = Q._conv_kernel(x, w1, ws, None, (1, 1), (0, 0), (1, 1), 1, 0.05, 3, 0.2, 4, False)
    assert y.transpose(0, 2, 3, 1).flags.c_contiguous and not y.flags.c_contiguous
    yc = np.ascontiguousarray(y)
    args = (w2, ws, None, (1, 1), (1, 1), (1, 1), 32, 0.2, 4, 0.1, 0, True)
    np.testing.assert_array_equal(Q._conv_kernel(y, *args), Q._conv_kernel(yc, *args))
    add = (0.2, 4, 0.2, 4, 0.3, 2, False)
    z = Q._qadd_kernel(y, y, *add)
    assert z.strides == y.strides
    np.testing.assert_array_equal(z, Q._qadd_kernel(yc, yc, *add))
    pool = ((3, 3), (2, 2), (1, 1))
    np.testing.assert_array_equal(Q._qpool_kernel(y, *pool), Q._qpool_kernel(yc, *pool))


def test_depthwise_never_saturates(monkeypatch):
    """The depthwise kernel sums exactly, so 8-bit activations match the integer
    reference on every path (AVX2 included)."""
    rng = np.random.default_rng(1)
    x = rng.integers(200, 256, (1, 4, 6, 6)).astype(np.uint8)
    wt = np.full((4, 1, 3, 3), 127, np.int8)
    args = (wt, np.full(4, 1e-4, np.float32), None, (1, 1), (1, 1), (1, 1), 4, 0.05, 0,
            0.05, 0, False)
    monkeypatch.setenv("TESSERA_INT8_ISA", "numpy")
    ref = Q.conv_reference(x, *args)
    for path in int8.available():
        monkeypatch.setenv("TESSERA_INT8_ISA", path)
        np.testing.assert_array_equal(Q._conv_kernel(x, *args), ref)


def test_module_repacks_weights_written_in_place():
    from tessera.ao import quantization as tq
    m = tessera.nn.Sequential(tq.QuantStub(), tessera.nn.Conv2d(3, 4, 3), tq.DeQuantStub())
    m.eval().qconfig = tq.get_default_qconfig("x86")
    p = tq.prepare(m)
    x = tessera.randn(1, 3, 5, 5)
    p(x)
    q = tq.convert(p)
    before = q(x).numpy()
    state = {k: v.clone() for k, v in q.state_dict().items()}
    state["1.weight"] = -state["1.weight"]
    q.load_state_dict(state)                 # copies into the same buffers
    after = q(x).numpy()
    fresh = tq.convert(p)
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(after, fresh(x).numpy())
    assert not np.array_equal(before, after)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_add_bit_exact(dtype, monkeypatch):
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max + 1, (2, 3, 17, 19)).astype(dtype)
    b = rng.integers(info.min, info.max + 1, (2, 3, 17, 19)).astype(dtype)
    for relu in (False, True):
        args = (0.0371, 9, 0.0213, -3 if dtype == np.int8 else 140, 0.05, 5, relu)
        ref = Q.add_reference(a, b, *args)
        for path in int8.available():
            monkeypatch.setenv("TESSERA_INT8_ISA", path)
            np.testing.assert_array_equal(Q._qadd_kernel(a, b, *args), ref)
