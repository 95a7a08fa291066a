"""The AMX-INT8 path of the INT8 GEMM: its kernel on emulated tiles (``amx-emulated``, a C
model of the tile instructions) bit for bit against the NumPy integer reference on shapes
whose edges cut every tile (M, N, K not multiples of 16, 16, 64), every epilogue (uint8,
int8, float32, NCHW out, ReLU, per-tensor and per-channel multipliers, zero points) and the
threads' splits; the real path where the CPU has AMX; how the path is chosen, capped and
compiled out."""
import itertools

import numpy as np
import pytest

from tessera.kernels import cc, int8

EMULATED = int8.EMULATED
needs_emulation = pytest.mark.skipif(
    int8._cpu_bits() is None or not int8._cpu_bits() & 4,
    reason="the AMX kernel's emulation needs a C compiler and AVX-512 VNNI (its epilogue's "
           "instructions, as on every CPU with AMX)")
needs_amx = pytest.mark.skipif(
    "amx" not in int8.available(),
    reason="hardware: this CPU has no AMX-INT8, or the OS does not grant the tile state, or "
           "the compiler lacks AMX (the emulated kernel's tests cover the logic)")

# rows, columns, depth: whole tiles, one short of them, one past, several with tails
EDGES = [(1, 1, 1), (16, 16, 64), (15, 17, 63), (17, 15, 65), (33, 31, 129), (32, 48, 128),
         (5, 7, 3), (48, 33, 200), (9, 64, 4), (31, 1, 256), (2, 100, 67), (40, 20, 0)]


def _case(m: int, k: int, n: int, per_channel: bool, seed: int = 0):
    rng = np.random.default_rng(seed + m * 10007 + k * 101 + n)
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    mult = ((rng.random(n) if per_channel else np.full(n, rng.random())) * 2e-3 + 1e-5)
    bias = rng.integers(-3000, 3000, n).astype(np.int32)
    return a, w, mult.astype(np.float32), bias


def _check(path: str, m: int, k: int, n: int, per_channel: bool, out, relu: bool,
           a_zp: int, out_zp: int, bias: bool = True) -> None:
    a, w, mult, b = _case(m, k, n, per_channel)
    kw = dict(a_zp=a_zp, mult=mult, out_zp=out_zp, bias=b if bias else None, out_dtype=out,
              relu=relu, bias_f=mult * 3)
    np.testing.assert_array_equal(int8.gemm(a, w, path=path, **kw), int8.reference(a, w, **kw))


@needs_emulation
@pytest.mark.parametrize("m,n,k", EDGES, ids=str)
@pytest.mark.parametrize("out", [np.uint8, np.int8, np.float32], ids=lambda t: t.__name__)
def test_emulated_edges(m, n, k, out):
    for per_channel, relu, (a_zp, out_zp) in itertools.product(
            (False, True), (False, True), ((0, 0), (7, 3), (128, 120) if out != np.int8
                                           else (128, -5))):
        _check(EMULATED, m, k, n, per_channel, out, relu, a_zp, out_zp)


@needs_emulation
@pytest.mark.parametrize("m", [1, 8, 15, 16, 17, 24, 47])
@pytest.mark.parametrize("n", [1, 16, 17, 31, 32, 33])
@pytest.mark.parametrize("k", [4, 60, 64, 68, 127, 192])
def test_emulated_grid(m, n, k):
    """Every mix of whole and partial row tiles, one or two column blocks (a whole pair, a
    pair with a partial block, a lone block) and K tails, without a bias too."""
    _check(EMULATED, m, k, n, True, np.uint8, m % 2 == 0, 5, 2, bias=n % 2 == 0)


@needs_emulation
@pytest.mark.parametrize("m,n,k", [(300, 40, 150), (20, 600, 120)], ids=str)
def test_emulated_parts(m, n, k):
    """Products big enough that the threads split them: by rows (parts of 8-row multiples,
    so row tiles of 8 at each part's end) and by column blocks (odd parts)."""
    for out in (np.uint8, np.float32):
        _check(EMULATED, m, k, n, True, out, True, 9, 4)


@needs_emulation
@pytest.mark.parametrize("pix,imgs,n,noff,ntot", [(7, 3, 20, 4, 30), (16, 2, 16, 0, 16),
                                                 (5, 4, 33, 1, 40)], ids=str)
def test_emulated_nchw_epilogue(pix, imgs, n, noff, ntot):
    """The epilogue that writes NCHW planes (the deployed library's convolutions): column j
    of row m is channel noff + j of pixel m % pix of image m // pix."""
    m, k = pix * imgs, 75
    a, w, mult, b = _case(m, k, n, True)
    ref = int8.reference(a, w, a_zp=6, mult=mult, out_zp=10, bias=b, relu=True)
    want = np.full((imgs, ntot, pix), 99, np.uint8)
    want[:, noff:noff + n, :] = ref.reshape(imgs, pix, n).transpose(0, 2, 1)
    pw = int8.pack(w)
    ap = np.zeros((m, pw.kp), np.uint8)
    ap[:, :k] = a
    got = np.full((imgs, ntot, pix), 99, np.uint8)
    lo, hi = int8._range(np.dtype(np.uint8), None, None, True, 10)
    int8._gemm_packed(EMULATED, ap, pw, got, a_zp=6, mult=mult, out_zp=10, bias=b, lo=lo,
                      hi=hi, pix=pix, ntot=ntot, noff=noff)
    np.testing.assert_array_equal(got, want)


@needs_emulation
def test_emulated_forced_by_name(monkeypatch):
    """``TESSERA_INT8_ISA=amx-emulated`` runs the layers on it (never chosen unforced)."""
    assert EMULATED not in int8.available()
    monkeypatch.setenv("TESSERA_INT8_ISA", EMULATED)
    assert int8.isa() == EMULATED
    a, w, mult, b = _case(21, 90, 18, True)
    kw = dict(a_zp=3, mult=mult, out_zp=1, bias=b)
    np.testing.assert_array_equal(int8.gemm(a, w, **kw), int8.reference(a, w, **kw))


@needs_amx
@pytest.mark.parametrize("m,n,k", EDGES, ids=str)
def test_amx_edges(m, n, k):
    for out, relu in itertools.product((np.uint8, np.int8, np.float32), (False, True)):
        _check("amx", m, k, n, True, out, relu, 7, 3)
    _check("amx", m, k, n, False, np.uint8, True, 0, 0)


@needs_amx
def test_amx_agrees_with_its_emulation():
    a, w, mult, b = _case(70, 333, 50, True)
    kw = dict(a_zp=11, mult=mult, out_zp=4, bias=b)
    np.testing.assert_array_equal(int8.gemm(a, w, path="amx", **kw),
                                  int8.gemm(a, w, path=EMULATED, **kw))


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next(line for line in f if line.startswith("flags")).split()[2:])
    except (OSError, StopIteration):
        return set()


def test_amx_chosen_only_where_the_cpu_has_it():
    """The path is listed only where Linux reports the tile instructions (it reports them
    only where the CPU has them and it saves their state) and the compiler built it; it is
    the first choice where listed."""
    have = int8.available()
    flags = _cpu_flags()
    if "amx" in have:
        assert {"amx_tile", "amx_int8"} <= flags and int8.amx_built()
        assert int8.isa() == "amx" or cc.max_isa() != "avx512"
    elif flags and not {"amx_tile", "amx_int8"} <= flags:
        assert "amx" not in have


def test_forcing_amx(monkeypatch):
    monkeypatch.setenv("TESSERA_INT8_ISA", "amx")
    if "amx" in int8.available():
        assert int8.isa() == "amx"
    else:
        with pytest.raises(RuntimeError, match="TESSERA_INT8_ISA='amx': this CPU"):
            int8.isa()
    monkeypatch.setenv("TESSERA_MAX_ISA", "avx2")
    assert "amx" not in int8.available()
    with pytest.raises(RuntimeError, match="TESSERA_MAX_ISA=avx2 excludes it"):
        int8.isa()


@pytest.mark.skipif(int8._lib() is None, reason="needs a C compiler")
def test_compiled_out():
    """Built as by a compiler without AMX (``-DTSR_NO_AMX``): the library loads, reports no
    AMX, and its AMX entry (which nothing then picks) still computes the product."""
    import ctypes

    from tessera.kernels.csource import source
    lib = cc.load(source("int8.c"), ("-ffp-contract=off", "-DTSR_NO_AMX"))
    assert lib.tsr_int8_amx_built() == 0 and not lib.tsr_int8_cpu() & 8
    a, w, mult, b = _case(19, 70, 21, True)
    pw = int8.pack(w)
    ap = np.zeros((19, pw.kp), np.uint8)
    ap[:, :70] = a
    out = np.empty((19, 21), np.uint8)
    params = int8._gemm_params(pw, 19, np.uint8, a_zp=2, mult=mult, out_zp=1, bias=b, lo=0,
                               hi=255)
    params[int8._P_A], params[int8._P_C] = ap.ctypes.data, out.ctypes.data
    f = lib.tsr_int8_gemm_amx
    f.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 4
    f(params.ctypes.data, 0, 19, 0, pw.np_ // 16)
    np.testing.assert_array_equal(out, int8.reference(a, w, a_zp=2, mult=mult, out_zp=1,
                                                      bias=b))


@needs_emulation
def test_emulated_quantized_network(monkeypatch):
    """A converted network (convolutions, a grouped one, linear layers) on the emulated
    AMX kernel is, bit for bit, the network on the NumPy reference."""
    import tessera
    from tessera import nn
    from tessera.ao import quantization as tq
    tessera.manual_seed(0)
    m = nn.Sequential(tq.QuantStub(), nn.Conv2d(3, 20, 3, padding=1), nn.ReLU(),
                      nn.Conv2d(20, 34, 3, stride=2, groups=2), nn.Flatten(),
                      nn.Linear(34 * 4 * 4, 70), nn.ReLU(), nn.Linear(70, 17),
                      tq.DeQuantStub())
    m.eval().qconfig = tq.get_default_qconfig("x86")
    p = tq.prepare(m)
    x = tessera.randn(3, 3, 10, 10)
    p(x)
    q = tq.convert(p)
    monkeypatch.setenv("TESSERA_INT8_ISA", "numpy")
    with tessera.no_grad():
        ref = q(x).numpy()
    monkeypatch.setenv("TESSERA_INT8_ISA", EMULATED)
    with tessera.no_grad():
        np.testing.assert_array_equal(q(x).numpy(), ref)
