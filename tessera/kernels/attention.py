"""Fused scaled dot-product attention in float32 (``c/attention.c``): forward and backward
without the L x S score matrix (the flash-attention recurrence, tiles of 64 x 64 in L1).

``forward(q, k, v, mask, ...)`` returns ``softmax(q k^T * scale + mask) v`` (dropout
applied to the weights) and each row's log-sum-exp, all the backward keeps;
``backward(...)`` returns the gradients of q, k and v, each of its input's shape. Inputs
are ``(..., L, E)``, ``(..., S, E)``, ``(..., S, Ev)`` arrays whose batch dims broadcast;
``gqa`` lets the head dim (-3) of k and v divide the query's (grouped-query attention). A
mask is additive float32 or boolean (True = may attend), of any shape broadcasting to the
scores'; ``causal`` keeps key j <= query i. Rows with nothing to attend to give zeros
(PyTorch's safe softmax).

Dropout needs no mask in memory: ``seed`` is the seed tessera's ``dropout`` op would get,
and the kernel draws the same numbers (NumPy's PCG64 from that seed, float32, row-major
over the weights of shape ``batch + (L, S)``) and keeps ``u >= p``, in the forward and
again in the backward.

The instruction set is chosen from the CPU: AVX-512, AVX2 with FMA, or portable C, the widest
within ``TESSERA_MAX_ISA``; ``TESSERA_ATTN_ISA=avx512|avx2|portable`` forces one
(RuntimeError if the CPU lacks it or the cap excludes it).

>>> import numpy as np
>>> q = np.ones((1, 3, 4), np.float32); v = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
>>> out, lse = forward(q, q, v, None, scale=0.5, causal=True)
>>> out[0, 0].tolist(), out[0, 2].tolist()
([0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0])
"""
from __future__ import annotations

import ctypes
import functools
import math

import numpy as np

from tessera.kernels.csource import source
from tessera.kernels.gemm import select_isa

__all__ = ["forward", "backward", "available", "isa", "ISAS", "keep_threshold"]

ISAS = ("portable", "avx2", "avx512")            # c/attention.c's TSR_ATTN_* in order (gemm's too)
_F32 = np.dtype(np.float32)
_BR = 64                                         # query rows per forward part


def _fields() -> list:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return ([(n, i64) for n in ("nb", "L", "S", "E", "Ev")]
            + [(n, ptr) for n in ("q", "k", "v", "mask", "qoff", "koff", "voff", "moff")]
            + [(n, i64) for n in ("qrs", "krs", "vrs", "mrs", "mcs")]
            + [(n, ptr) for n in ("o", "lse", "dout", "dq", "dk", "dv")]
            + [("scale", ctypes.c_float), ("dscale", ctypes.c_float),
               ("causal", ctypes.c_int32), ("dropout", ctypes.c_int32),
               ("isa", ctypes.c_int32), ("thr", ctypes.c_uint32),
               ("rng", ctypes.c_uint64 * 4)])


class _Attn(ctypes.Structure):
    """c/attention.c's ``tsr_attn_t``."""
    _fields_ = _fields()


@functools.lru_cache(maxsize=1)
def _lib():
    from tessera.kernels.cc import load_dispatching
    P, I, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    return load_dispatching(source("attention.c"), (
        ("tsr_attn_isa_supported", [i32], i32), ("tsr_attn_isa_best", [], i32),
        ("tsr_attn_fwd_range", [P, I, I], I), ("tsr_attn_bwd_range", [P, I, I], I),
        ("tsr_attn_fwd_parts", [P], I)))


def available() -> bool:
    """Whether the kernels can be built here (code generation on, a C compiler).

    >>> isinstance(available(), bool)
    True
    """
    from tessera import kernels
    if not kernels.enabled():
        return False
    try:
        _lib()
    except Exception:  # a broken toolchain: attention stays a composite
        return False
    return True


@functools.lru_cache(maxsize=1)
def _isa() -> int:
    lib = _lib()
    return select_isa("TESSERA_ATTN_ISA", lib.tsr_attn_isa_best, lib.tsr_attn_isa_supported)


def isa() -> str:
    """The compiled path in use: ``"avx512"``, ``"avx2"`` or ``"portable"``.

    >>> isa() in ISAS
    True
    """
    return ISAS[_isa()]


def keep_threshold(p: float) -> int:
    """The 24-bit integer t with ``u >= float32(p)`` exactly when ``(bits >> 8) >= t``, u
    being NumPy's float32 ``(bits >> 8) * 2**-24``.

    >>> keep_threshold(0.5), keep_threshold(0.0), keep_threshold(1.0)
    (8388608, 0, 16777216)
    """
    return math.ceil(float(np.float32(p)) * 2.0 ** 24)


# ---- the batch: each output batch entry's first element in every operand ------------------

def _batch_offsets(x: np.ndarray, batch: tuple[int, ...], group: int) -> np.ndarray:
    """The element offset of each ``batch`` entry's matrix in ``x`` (broadcast batch dims
    stride 0; with ``group`` > 1 query head h reads head h // group)."""
    shape, strides = x.shape[:-2], [s // x.itemsize for s in x.strides[:-2]]
    if group > 1:
        shape = shape[:-1] + (shape[-1], group)
        strides = strides[:-1] + [strides[-1], 0]
    off = np.zeros(shape, np.int64)
    for d, (n, s) in enumerate(zip(shape, strides)):
        off += (np.arange(n, dtype=np.int64) * s).reshape((n,) + (1,) * (len(shape) - d - 1))
    if group > 1:
        lead: tuple[int, ...] = off.shape[:-2]
        off = off.reshape(lead + (shape[-2] * group,))
    off = off.reshape((1,) * (len(batch) - off.ndim) + off.shape)
    return np.ascontiguousarray(np.broadcast_to(off, batch)).reshape(-1)


def _rows(x: np.ndarray) -> np.ndarray:
    """``x`` as float32 with unit-stride rows (a copy only when they are not)."""
    if x.dtype != _F32:
        x = x.astype(_F32)
    if x.ndim and x.shape[-1] > 1 and x.strides[-1] != 4:
        x = np.ascontiguousarray(x)
    return x


def _group(q: np.ndarray, x: np.ndarray, gqa: bool) -> int:
    if gqa and q.ndim >= 3 and x.ndim >= 3 and x.shape[-3] not in (q.shape[-3], 1):
        return q.shape[-3] // x.shape[-3]
    return 1


def _batch(q, k, v, gk: int, gv: int) -> tuple[int, ...]:
    def heads(x, g):
        return x.shape[:-3] + (x.shape[-3] * g,) if g > 1 else x.shape[:-2]
    return tuple(np.broadcast_shapes(q.shape[:-2], heads(k, gk), heads(v, gv)))


def _setup(q, k, v, mask, scale, causal, p, seed, gqa):
    q, k, v = _rows(q), _rows(k), _rows(v)
    gk, gv = _group(q, k, gqa), _group(q, v, gqa)
    batch = _batch(q, k, v, gk, gv)
    L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    t = _Attn(nb=int(np.prod(batch, dtype=np.int64)), L=L, S=S, E=E, Ev=Ev,
              scale=scale, causal=int(causal), isa=_isa())
    keep = [q, k, v]
    for name, x, g in (("q", q, 1), ("k", k, gk), ("v", v, gv)):
        off = _batch_offsets(x, batch, g)
        keep.append(off)
        setattr(t, name, x.ctypes.data)
        setattr(t, name + "off", off.ctypes.data)
        setattr(t, name + "rs", x.strides[-2] // 4)
    if mask is not None:
        if mask.dtype == np.bool_:
            mask = np.where(mask, np.float32(0), np.float32(-np.inf))
        m = np.broadcast_to(mask.astype(_F32, copy=False), batch + (L, S))
        off = _batch_offsets(m, batch, 1)
        keep += [m, off]
        t.mask, t.moff = m.ctypes.data, off.ctypes.data
        t.mrs, t.mcs = m.strides[-2] // 4, m.strides[-1] // 4
    t.dscale = 1.0
    if p > 0:
        state = np.random.PCG64(seed).state["state"]
        s, inc = state["state"], state["inc"]
        m64 = (1 << 64) - 1
        t.dropout, t.thr = 1, keep_threshold(p)
        t.dscale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
        t.rng[:] = [s & m64, s >> 64, inc & m64, inc >> 64]
    return t, keep, batch, (gk, gv)


def _run(fn, t: _Attn, parts: int, work: int) -> None:
    from tessera.kernels.threadpool import split_call
    code = split_call(fn, (ctypes.addressof(t),), parts, work)
    if code == -2:
        raise MemoryError("scaled_dot_product_attention: no memory for the kernel's tiles")
    if code:
        raise RuntimeError(f"scaled_dot_product_attention: the C kernel failed ({code})")


def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, *,
            scale: float, causal: bool = False, p: float = 0.0, seed: int = 0,
            gqa: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(the attention output ``batch + (L, Ev)``, each row's log-sum-exp ``batch + (L,)``,
    -inf for a row with nothing to attend to).

    >>> q = np.zeros((2, 4), np.float32)
    >>> forward(q, q, np.eye(2, 4, dtype=np.float32), None, scale=1.0)[0].tolist()
    [[0.5, 0.5, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]]
    """
    t, keep, batch, _ = _setup(q, k, v, mask, scale, causal, p, seed, gqa)
    out = np.empty(batch + (t.L, t.Ev), _F32)
    lse = np.empty(batch + (t.L,), _F32)
    t.o, t.lse = out.ctypes.data, lse.ctypes.data
    lib = _lib()
    _run(lib.tsr_attn_fwd_range, t, int(lib.tsr_attn_fwd_parts(ctypes.byref(t))),
         t.nb * t.L * t.S * (t.E + t.Ev) // 16)
    del keep
    return out, lse


def _reduce(g: np.ndarray, shape: tuple[int, ...], group: int) -> np.ndarray:
    """A gradient of the batch's shape summed back to an input's (its group of query heads,
    its broadcast dims)."""
    if group > 1:
        g = g.reshape(g.shape[:-3] + (g.shape[-3] // group, group) + g.shape[-2:]).sum(-3)
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + d for d, n in enumerate(shape)
                                      if n == 1 and g.shape[lead + d] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True).reshape(shape)
    return g


def backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
             out: np.ndarray, lse: np.ndarray, dout: np.ndarray, *, scale: float,
             causal: bool = False, p: float = 0.0, seed: int = 0,
             gqa: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The gradients of q, k and v (each of its input's shape) from ``forward``'s outputs
    and the output's gradient ``dout``.

    >>> q = np.zeros((2, 4), np.float32); v = np.eye(2, 4, dtype=np.float32)
    >>> o, lse = forward(q, q, v, None, scale=1.0)
    >>> backward(q, q, v, None, o, lse, np.ones_like(o), scale=1.0)[2].tolist()
    [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    """
    t, keep, batch, (gk, gv) = _setup(q, k, v, mask, scale, causal, p, seed, gqa)
    out = np.ascontiguousarray(out, _F32)
    lse = np.ascontiguousarray(lse, _F32)
    dout = np.ascontiguousarray(np.broadcast_to(dout, out.shape), _F32)
    dq = np.empty(batch + (t.L, t.E), _F32)
    dk = np.empty(batch + (t.S, t.E), _F32)
    dv = np.empty(batch + (t.S, t.Ev), _F32)
    for name, x in (("o", out), ("lse", lse), ("dout", dout), ("dq", dq), ("dk", dk),
                    ("dv", dv)):
        setattr(t, name, x.ctypes.data)
    _run(_lib().tsr_attn_bwd_range, t, t.nb, t.nb * t.L * t.S * (t.E + t.Ev) // 4)
    del keep
    return (_reduce(dq, q.shape, 1), _reduce(dk, k.shape, gk), _reduce(dv, v.shape, gv))
