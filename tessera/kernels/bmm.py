"""Small batched matrix products split over two threads, with a hand-off of about a microsecond.

NumPy's ``matmul`` runs a batch of small matrices (attention scores: 8 products of
64x32 by 32x64) one after the other on one core: OpenBLAS threads a GEMM only above
~262k multiply-adds, and handing the products to Python threads costs more than the whole
batch (bench einsum: attention 2x4x64x32). PyTorch splits such a batch over its threads.
Here the products are the parts of one job of the C kernel threads of
``tessera.kernels.threadpool``: the caller and the workers take them from one atomic counter, so
a worker that is asleep or has lost its core costs nothing but its share of the work.

Each product is one ``cblas_?gemm`` of NumPy's own OpenBLAS (the address that
``tessera.kernels.conv`` finds), single-threaded because each is below OpenBLAS's
threading threshold (``run`` is used only there).

>>> import numpy as np
>>> a, b = np.ones((4, 3, 2), np.float32), np.ones((4, 2, 5), np.float32)
>>> r = matmul(a, b)
>>> r is None or r.tolist() == np.matmul(a, b).tolist()
True
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

__all__ = ["matmul", "bind", "usable", "stacked", "BLAS_SINGLE", "STACK_MAX"]

# OpenBLAS threads one GEMM above 65536 * GEMM_MULTITHREAD_THRESHOLD (4) multiply-adds
BLAS_SINGLE = 65536 * 4
# ``stacked`` takes products up to this many multiply-adds, BLAS held single-threaded: a
# product a thread rather than OpenBLAS's fork and join over the cores for each of them, as
# for attention's 128x64x128 products (bench training: transformer)
STACK_MAX = 1 << 22


@functools.lru_cache(maxsize=1)
def _lib():
    """(the batch runner, the sgemm and dgemm addresses) or None: no compiler, no OpenBLAS
    that C can call, or one thread."""
    try:
        from tessera.kernels import threadpool as pool
        from tessera.kernels.conv import _blas
        blas = _blas()
        if blas is None or pool._lib() is None:
            return None
    except Exception:  # a broken toolchain: NumPy's matmul still works
        return None

    def run(params: int, a: int, b: int, c: int, itemsize: int) -> None:
        pool.gemm_batch(params, a, b, c, itemsize, int(ctypes.c_int64.from_address(params).value))
    return run, {np.dtype(np.float32): blas.sgemm, np.dtype(np.float64): blas.dgemm}


def usable(a: np.ndarray, b: np.ndarray, limit: int = BLAS_SINGLE) -> bool:
    """Whether ``matmul`` takes this (nb, m, k) @ (nb, k, n) batch: float32/float64, at
    least two products, each of at most ``limit`` multiply-adds (by default below
    OpenBLAS's own threading threshold) and more than a dot product, matrices BLAS can
    read."""
    from tessera.kernels import threadpool as pool
    nb, m, k = a.shape
    n = b.shape[2]
    if not (nb >= 2 and m * n > 1 and a.dtype == b.dtype and a.dtype.kind == "f"
            and a.itemsize >= 4 and m * k * n <= limit and _lib() is not None
            and pool.usable()):
        return False
    return k == 0 or _params(a.dtype, a.strides, a.shape, b.strides, b.shape) is not None


def _layout(strides: tuple, shape: tuple, item: int) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) of each matrix of a 3-d stack, in elements, or
    None when BLAS cannot read it: no dim of unit stride, or rows (columns) that overlap
    or run backwards (broadcast and reversed views)."""
    if any(s % item for s in strides):
        return None
    _, r, c = (s // item for s in strides)
    m, n = shape[1:]
    if (c == 1 or n == 1) and (m == 1 or r >= max(n, 1)):
        return 111, max(r, n, 1) if m > 1 else max(n, 1)
    if (r == 1 or m == 1) and (n == 1 or c >= max(m, 1)):
        return 112, max(c, m, 1) if n > 1 else max(m, 1)
    return None


@functools.lru_cache(maxsize=1024)
def _params(dtype, sa: tuple, sha: tuple, sb: tuple, shb: tuple):
    """The int64 parameter block of one batch (see the C source), or None."""
    item = dtype.itemsize
    la, lb = _layout(sa, sha, item), _layout(sb, shb, item)
    if la is None or lb is None:
        return None
    nb, m, k = sha
    n = shb[2]
    p = np.array([nb, m, n, k, la[0], lb[0], la[1], lb[1], max(n, 1),
                  sa[0] // item, sb[0] // item, m * n, _lib()[1][dtype]], np.int64)
    return p, p.ctypes.data


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``np.matmul(a, b)`` of (nb, m, k) and (nb, k, n) stacks on the kernel threads, or None
    when this path does not apply (then the caller runs NumPy's)."""
    if not usable(a, b):
        return None
    nb, m, k = a.shape
    if k == 0:  # an empty sum
        return np.zeros((nb, m, b.shape[2]), a.dtype)
    _, ptr = _params(a.dtype, a.strides, a.shape, b.strides, b.shape)
    out = np.empty((nb, m, b.shape[2]), a.dtype)
    _lib()[0](ptr, a.ctypes.data, b.ctypes.data, out.ctypes.data, a.itemsize)
    return out


def stacked(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray | None:
    """``np.matmul(a, b, out=out)`` of two stacks with the same batch dims (any number of
    them, viewed as one without copying), each product of up to ``STACK_MAX`` multiply-adds,
    on the kernel threads with BLAS single-threaded meanwhile; None when this path does not
    apply (a broadcast batch, a batch that cannot be one view, an ``out`` that is not
    C-contiguous, one thread).

    >>> x = np.ones((2, 3, 4, 5), np.float32)
    >>> r = stacked(x, np.ones((2, 3, 5, 2), np.float32))
    >>> r is None or r.tolist() == np.full((2, 3, 4, 2), 5.0).tolist()
    True
    """
    if a.ndim < 3 or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        return None
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    shape = a.shape[:-1] + (n,)
    if out is not None and (out.shape != shape or out.dtype != a.dtype
                            or not out.flags.c_contiguous or np.may_share_memory(out, a)
                            or np.may_share_memory(out, b)):
        return None   # (NumPy's matmul copies an operand that overlaps its output)
    a3, b3 = _flat(a), _flat(b)
    if a3 is None or b3 is None or k == 0 or not usable(a3, b3, STACK_MAX):
        return None
    from tessera.kernels.conv import _blas, _single_blas
    blas = _blas()
    assert blas is not None  # usable() found it
    _, ptr = _params(a.dtype, a3.strides, a3.shape, b3.strides, b3.shape)
    res = np.empty(shape, a.dtype) if out is None else out
    single = m * k * n > BLAS_SINGLE
    if single:
        _single_blas(blas, +1)
    try:
        _lib()[0](ptr, a3.ctypes.data, b3.ctypes.data, res.ctypes.data, a.itemsize)
    finally:
        if single:
            _single_blas(blas, -1)
    return res


def _flat(x: np.ndarray) -> np.ndarray | None:
    """``x``'s batch dims as one, a view (None when that would copy)."""
    if x.size == 0:
        return None
    v = x.view()
    try:
        v.shape = (-1,) + x.shape[-2:]   # raises instead of copying
    except AttributeError:
        return None
    return v


def bind(a: np.ndarray, b: np.ndarray):
    """``matmul`` for operands of exactly these shapes, strides and dtype, with the checks
    and the parameter block done once (``usable(a, b)`` must hold)."""
    nb, m, k = a.shape
    shape, dtype, item = (nb, m, b.shape[2]), a.dtype, a.itemsize
    if k == 0:
        return lambda x, y: np.zeros(shape, dtype)
    block, ptr = _params(a.dtype, a.strides, a.shape, b.strides, b.shape)
    f = _lib()[0]

    def run(x: np.ndarray, y: np.ndarray, block=block) -> np.ndarray:  # block: kept alive
        out = np.empty(shape, dtype)
        f(ptr, x.ctypes.data, y.ctypes.data, out.ctypes.data, item)
        return out
    return run
