"""The einsum kernel: a bound equation and a path, lowered to NumPy array operations.

Each operand is first made to have one dim per distinct label it depends on: broadcast
dims (size 1 against a larger size) are indexed away, repeated labels become the diagonal
(a strided view, no copy), and labels no other operand or the output needs are summed.
Then each step of the path contracts two operands as one (batched) matrix product: the
labels both hold and still need are the batch, the labels both hold and no longer need
are the contraction, the rest are the rows and columns::

    A[batch, left, con] -> (nb, nl, nc)    B[batch, con, right] -> (nb, nc, nr)
    C = matmul(A, B)    -> (nb, nl, nr)    -> C[batch, left, right]

The transposes become views whenever the operand's memory allows (BLAS reads a
transposed matrix as it is); only a step without any contracted label is a broadcast
multiply instead, because a matrix product over a dimension of size 1 is the same
product done slower.

``run`` keeps one function per (equation, path, operand shapes, strides and dtypes) with
every choice made, and each product is done whichever way measures faster on the host
at the moment (``_Tuned``: NumPy's matmul, a batch split over C threads, or
single-threaded OpenBLAS).

>>> import numpy as np
>>> a, b = np.ones((2, 3)), np.ones((3, 4))
>>> run("ij,jk->ik", (a, b), ((0, 1),)).tolist()
[[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]]
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from tessera.kernels import bmm as _bmm
from tessera.ops.einsum._parse import bind, parse
from tessera.ops.linalg import _blasable, _matmul_kernel

__all__ = ["run", "plan", "Plan", "contracted"]


class _Prep(NamedTuple):
    """Make one operand's dims its distinct labels."""

    # drops broadcast dims (0 there, slice(None) elsewhere); the field hides tuple.index
    index: tuple | None  # type: ignore[assignment]
    groups: tuple | None     # axes per distinct label, when a label repeats (a diagonal)
    sum_axes: tuple          # labels no one else needs, summed


class _Pair(NamedTuple):
    i: int
    j: int
    a: tuple                 # ((perm, shape, swap), ...) ways to view A as 3-d
    b: tuple
    mode: str                # "mm": matmul; "mul": broadcast multiply (nothing to sum)
    out_shape: tuple


class Plan(NamedTuple):
    preps: tuple
    pairs: tuple
    out_perm: tuple | None


def run(equation: str, arrays, path) -> np.ndarray:
    """einsum of ``arrays`` by the canonical ``equation`` along ``path``."""
    if type(path) is not tuple:
        path = tuple(map(tuple, path))
    # a repeat call (same shapes, strides and dtypes) runs its specialised plan directly
    key = (equation, path, *[(a.shape, a.strides, a.dtype) for a in arrays])
    f = _RUNNERS.get(key)
    if f is None:
        if len(_RUNNERS) >= _RUNNERS_SIZE:
            _RUNNERS.clear()
        f = _RUNNERS[key] = _runner(plan(equation, tuple([a.shape for a in arrays]), path),
                                    arrays)
    return f(arrays)


_RUNNERS: dict = {}
_RUNNERS_SIZE = 4096


def _runner(p: Plan, arrays):
    """``fn(arrays)`` computing plan ``p`` for arrays of exactly these shapes, strides and
    dtypes, each matrix product through its own ``_Tuned``. A plan of one product whose
    operands need no preparation gets a straight-line function, its views (or copies)
    decided once from the strides; every other plan runs through ``execute``."""
    mms = tuple(_Tuned() if s.mode == "mm" else None for s in p.pairs)
    if len(p.pairs) != 1 or p.pairs[0].mode != "mm" or any(
            q.index is not None or q.groups is not None or q.sum_axes for q in p.preps):
        return lambda xs: execute(p, xs, mms)
    step, mm = p.pairs[0], mms[0]
    assert mm is not None  # the one step is a matrix product
    va, vb = _view_fn(arrays[step.i], step.a), _view_fn(arrays[step.j], step.b)
    i, j, shape, perm = step.i, step.j, step.out_shape, p.out_perm

    def fn(xs):
        c = mm(va(xs[i]), vb(xs[j])).reshape(shape)
        return c if perm is None else np.ascontiguousarray(c.transpose(perm))
    return fn


def _view_fn(x: np.ndarray, views: tuple):
    """``_arrange(x, views)`` for arrays laid out as ``x``, as a function with the choice
    made: a view where the strides allow, else a copy BLAS can read."""
    for perm, counts, shape, swap in views:
        y = x.transpose(perm)
        if _mergeable(y, counts):
            if perm == tuple(range(len(perm))):
                return (lambda z: z.reshape(shape).swapaxes(-1, -2)) if swap else \
                    (lambda z: z.reshape(shape))
            return (lambda z: z.transpose(perm).reshape(shape).swapaxes(-1, -2)) if swap \
                else (lambda z: z.transpose(perm).reshape(shape))
    perm, _, shape, _ = views[0]
    return lambda z: z.transpose(perm).reshape(shape)  # a copy


class _Tuned:
    """One step's matrix product, done whichever of two ways has been faster lately: the
    default ``_matmul``, or an alternative where one exists (decided at the first call,
    from the operands):

    * a batch of small products (each below OpenBLAS's threading threshold): split over
      the kernel threads by ``_bmm`` (NumPy runs them one after the other: bench einsum:
      attention 2x4x64x32);
    * one mid-sized GEMM (above that threshold): OpenBLAS single-threaded. Threaded, it
      synchronises its threads, and when other processes hold the cores a thread that
      lost its core stalls the GEMM for a scheduler tick, far longer than the product.

    Which wins depends on the load on the machine, so both are timed. The way in use
    keeps a moving average of its calls; every so often the other way runs twice in a
    row (the first call wakes ``_bmm``'s workers, the second is timed) and takes over if
    it was faster. A probe that loses doubles the wait before the next one (up to
    ``_EXPLORE_MAX`` calls), so a way that stalls on a busy machine costs little."""

    __slots__ = ("calls", "avg", "alt", "dflt", "best", "probe", "gap")
    alt: Callable[[np.ndarray, np.ndarray], np.ndarray] | None
    dflt: Callable[[np.ndarray, np.ndarray], np.ndarray]

    def __init__(self):
        self.calls = 0
        self.avg = [0.0, 0.0]  # seconds: [alternative, default]
        self.alt = self.dflt = None  # type: ignore[assignment]  # both chosen at the first call
        self.best = 1          # the way in use
        self.probe = 2         # the call at which the other way runs next
        self.gap = _EXPLORE

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        n = self.calls = self.calls + 1
        if n == 1:
            self.alt, self.dflt = _alternative(a, b), _default(a, b)
        alt = self.alt
        if alt is None:
            return self.dflt(a, b)
        best, probe = self.best, self.probe
        way = 1 - best if probe <= n <= probe + 1 else best
        t0 = _clock()
        c = alt(a, b) if way == 0 else self.dflt(a, b)
        t = _clock() - t0
        avg = self.avg
        if way == best:
            avg[way] = t if n == 1 else avg[way] + (t - avg[way]) * 0.25
        elif n == probe + 1:
            avg[way] = t
            if t < avg[best]:
                self.best, self.gap = way, _EXPLORE
            else:
                self.gap = min(2 * self.gap, _EXPLORE_MAX)
            self.probe = n + self.gap
        return c


def _alternative(a: np.ndarray, b: np.ndarray):
    """The other way to compute ``_matmul(a, b)`` for operands like these, or None."""
    nb, m, k = a.shape
    macs = m * k * b.shape[2]
    if _bmm.usable(a, b):
        return _bmm.bind(a, b)
    if nb == 1 and _bmm.BLAS_SINGLE < macs <= _SINGLE_MAX and a.dtype == b.dtype and \
            a.dtype.kind in "fc" and a.itemsize >= 4 and _blas_local() is not None:
        return _single_threaded
    return None


def _default(a: np.ndarray, b: np.ndarray):
    """``_matmul`` for operands like these: NumPy's ``matmul`` itself when none of its
    special cases applies (the caller's layout is fixed, so the checks are done once)."""
    nb, m, k = a.shape
    n = b.shape[2]
    if nb > 1 and not (m == 1 and n == 1) and a.dtype == b.dtype and a.dtype.kind in "fc" \
            and a.itemsize >= 4 and nb * m * n * k < _SPLIT_MIN and \
            _blasable(a) is a and _blasable(b) is b:
        return np.matmul
    return _matmul


_SINGLE_MAX = 1 << 24  # multiply-adds: beyond, a stall costs less than a lost core


def _single_threaded(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    local = _blas_local()
    prev = local(1)
    try:
        return _matmul(a, b)
    finally:
        local(prev)


_EXPLORE = 32
_EXPLORE_MAX = 1024
_clock = time.perf_counter


def contracted(b) -> list[str]:
    """The operands' labels as the path steps see them: broadcast dims dropped, each label
    once, and labels summed before any step (held by one operand, not in the output)
    left out. Paths are searched over these."""
    ops = [dict.fromkeys(s) for s in b.reduced()]
    counts: dict[str, int] = {}
    for s in ops:
        for x in s:
            counts[x] = counts.get(x, 0) + 1
    return ["".join(x for x in s if counts[x] > 1 or x in b.output) for s in ops]


@lru_cache(maxsize=2048)
def plan(equation: str, shapes: tuple, path: tuple) -> Plan:
    """Everything about the computation that depends on shapes only, worked out once."""
    b = bind(parse(equation), shapes)
    labels = contracted(b)
    preps = tuple(_operand_prep(b, k, labels[k]) for k in range(len(shapes)))
    pairs = []
    for step, (i, j) in enumerate(path):
        pair, res = _pair(b, labels, i, j, last=step == len(path) - 1)
        pairs.append(pair)
        for k in sorted((i, j), reverse=True):
            del labels[k]
        labels.append(res)
    perm = _perm(labels[0] if labels else "", list(b.output))
    return Plan(preps, tuple(pairs), None if perm == tuple(range(len(perm))) else perm)


def _operand_prep(b, k: int, keep: str) -> _Prep:
    """Operand ``k`` down to the labels in ``keep``: broadcast dims indexed away, repeated
    labels as their diagonal, the others summed."""
    term, shape, red = b.inputs[k], b.shapes[k], b.reduced()[k]
    index = None
    if len(red) != len(term):
        index = tuple(0 if n == 1 and b.sizes[x] != 1 else slice(None)
                      for x, n in zip(term, shape))
    uniq = "".join(dict.fromkeys(red))
    groups = None
    if len(uniq) != len(red):
        groups = tuple(tuple(d for d, y in enumerate(red) if y == x) for x in uniq)
    return _Prep(index, groups, tuple(d for d, x in enumerate(uniq) if x not in keep))


def _pair(b, labels: list, i: int, j: int, last: bool) -> tuple[_Pair, str]:
    """The step contracting operands ``i`` and ``j``, and its result's labels."""
    la, lb = labels[i], labels[j]
    keep = set(b.output).union(*[labels[k] for k in range(len(labels)) if k not in (i, j)])
    batch = [x for x in la if x in lb and x in keep]
    con = [x for x in la if x in lb and x not in keep]
    left = [x for x in la if x not in lb]
    right = [x for x in lb if x not in la]
    if last and _out_order(b.output, batch, left, right):
        # the last step writes the output: in its order when that is only a matter of
        # which operand is the left one and of ordering dims within each group
        # (B @ A instead of A @ B is free for BLAS; a transposed output is a copy)
        key = b.output.index
        batch, left, right = sorted(batch, key=key), sorted(left, key=key), \
            sorted(right, key=key)
        if left and right and key(right[0]) < key(left[0]):
            i, j, la, lb, left, right = j, i, lb, la, right, left
    n = {g: math.prod(b.sizes[x] for x in grp)
         for g, grp in (("b", batch), ("l", left), ("c", con), ("r", right))}
    if con:
        va = _views(la, (batch, left, con), (n["b"], n["l"], n["c"]))
        vb = _views(lb, (batch, con, right), (n["b"], n["c"], n["r"]))
    else:  # nothing to sum: a broadcast multiply
        va = ((_perm(la, batch + left), (len(batch), len(left)), (n["b"], n["l"]), False),)
        vb = ((_perm(lb, batch + right), (len(batch), len(right)), (n["b"], n["r"]),
               False),)
    res = batch + left + right
    return (_Pair(i, j, va, vb, "mm" if con else "mul", tuple(b.sizes[x] for x in res)),
            "".join(res))


def _out_order(output: str, batch: list, left: list, right: list) -> bool:
    """Whether ``output`` is batch, left and right labels in three blocks (in any order
    within each; left and right may trade places)."""
    if len(batch) + len(left) + len(right) != len(output):
        return False
    nb = len(batch)
    head, tail = set(output[:nb]), output[nb:]
    if head != set(batch):
        return False
    return set(tail[:len(left)]) == set(left) or set(tail[:len(right)]) == set(right)


def _perm(labels: str, order: list) -> tuple:
    return tuple(labels.index(x) for x in order)


def _views(labels: str, groups: tuple, shape3: tuple) -> tuple:
    """Two ways to see an operand as ``shape3``: (g0, g1, g2) directly, or (g0, g2, g1)
    then swapping the last two axes (free for BLAS); ``_arrange`` takes the one that needs
    no copy. Each way: (perm, axes merged into each of the 3 dims, shape, swap)."""
    g0, g1, g2 = groups
    n0, n1, n2 = shape3
    return ((_perm(labels, g0 + g1 + g2), (len(g0), len(g1), len(g2)), (n0, n1, n2), False),
            (_perm(labels, g0 + g2 + g1), (len(g0), len(g2), len(g1)), (n0, n2, n1), True))


def _arrange(x: np.ndarray, views: tuple) -> np.ndarray:
    contiguous = x.flags.c_contiguous
    for perm, counts, shape, swap in views:
        if contiguous and perm == tuple(range(len(perm))):  # the common case, quickly
            y = x.reshape(shape)
            return y.swapaxes(-1, -2) if swap else y
    for perm, counts, shape, swap in views:
        y = x.transpose(perm)
        if _mergeable(y, counts):
            y = y.reshape(shape)  # a view
            return y.swapaxes(-1, -2) if swap else y
    perm, _, shape, _ = views[0]
    return x.transpose(perm).reshape(shape)  # a copy


def _mergeable(y: np.ndarray, counts: tuple) -> bool:
    """Whether merging consecutive runs of ``counts`` axes of ``y`` is a view: within each
    run, every axis (of size > 1) steps over exactly the next one."""
    if y.size == 0:
        return True
    k = 0
    for c in counts:
        axes = [a for a in range(k, k + c) if y.shape[a] != 1]
        for a, b in zip(axes, axes[1:]):
            if y.strides[a] != y.strides[b] * y.shape[b]:
                return False
        k += c
    return True


def _prep(x: np.ndarray, p: _Prep) -> tuple[np.ndarray, bool]:
    fresh = False
    if p.index is not None:
        x = x[p.index]
    if p.groups is not None:
        shape = tuple(x.shape[g[0]] for g in p.groups)
        strides = tuple(sum(x.strides[k] for k in g) for g in p.groups)
        x = as_strided(x, shape, strides, writeable=False)
    if p.sum_axes:
        x = np.sum(x, axis=p.sum_axes)
        fresh = True
    return x, fresh


_VECDOT = hasattr(np, "vecdot")  # NumPy >= 2.0


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    nb, m, k = a.shape
    n = b.shape[2]
    if nb == 1:  # no batch: one GEMM (or GEMV), threaded by BLAS
        return _matmul_kernel(a[0], b[0])[None]
    if m == 1 and n == 1 and a.dtype.kind == "f" and a.itemsize >= 4 and _VECDOT:
        # a batch of dot products: NumPy's matmul would call BLAS once per 1x1 product
        return np.vecdot(a[:, 0, :], b[:, :, 0])[:, None, None]
    if a.dtype == b.dtype and a.dtype.kind in "fc" and a.itemsize >= 4 and \
            nb * m * n * k >= _SPLIT_MIN:
        split = _batch_split(nb)
        if split:
            return _split_matmul(a, b, split)
    return _matmul_kernel(a, b)


# Batched products: NumPy calls BLAS once per matrix and OpenBLAS threads each call,
# which synchronises its threads once per matrix (on a busy host a thread that lost its
# core stalls every matrix: bench einsum: attention 8x8x256x64). Like
# PyTorch, split the batch over the kernel threads instead, each running single-threaded
# BLAS (OpenBLAS's per-thread setting, so nothing else in the process changes).
_SPLIT_MIN = 1 << 25   # multiply-adds: below, the Python thread hand-off is not negligible


@lru_cache(maxsize=1)
def _blas_local():
    """OpenBLAS's ``openblas_set_num_threads_local`` (0.3.27+) for NumPy's BLAS, or None."""
    import ctypes
    try:
        from threadpoolctl import threadpool_info
        libs = [i for i in threadpool_info() if i.get("internal_api") == "openblas"]
    except ImportError:
        return None
    libs.sort(key=lambda i: "numpy" not in i.get("filepath", ""))
    for info in libs:
        try:
            f = ctypes.CDLL(info["filepath"]).openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        f.argtypes, f.restype = [ctypes.c_int], ctypes.c_int
        return f
    return None


def _batch_split(nb: int) -> int:
    """Threads to split a batch of ``nb`` products over (0: let BLAS thread each one)."""
    from tessera.kernels.threadpool import _threads
    t = _threads()
    if t < 2 or nb < t or (nb < 2 * t and nb % t) or _blas_local() is None:
        return 0
    return t


def _split_matmul(a: np.ndarray, b: np.ndarray, threads: int) -> np.ndarray:
    from tessera.kernels.threadpool import split_call
    a, b = _blasable(a), _blasable(b)
    out = np.empty((a.shape[0], a.shape[1], b.shape[2]), np.result_type(a, b))
    local = _blas_local()

    def chunk(lo: int, hi: int) -> int:
        prev = local(1)
        try:
            np.matmul(a[lo:hi], b[lo:hi], out=out[lo:hi])
        finally:
            local(prev)
        return 0

    split_call(chunk, (), a.shape[0], 1 << 62)
    return out


def execute(p: Plan, arrays, mms: tuple | None = None) -> np.ndarray:
    """Plan ``p`` on ``arrays``; ``mms`` holds each step's matrix product (default
    ``_matmul``)."""
    ops, fresh = [], False
    for x, prep in zip(arrays, p.preps):
        x, f = _prep(x, prep)
        ops.append(x)
        fresh = f
    for s, step in enumerate(p.pairs):
        a, b = ops[step.i], ops[step.j]
        if step.mode == "mm":
            c = (mms[s] if mms else _matmul)(_arrange(a, step.a), _arrange(b, step.b))
        else:
            a2, b2 = _arrange(a, step.a), _arrange(b, step.b)
            c = a2[:, :, None] * b2[:, None, :]
        for k in sorted((step.i, step.j), reverse=True):
            del ops[k]
        ops.append(c.reshape(step.out_shape))
        fresh = True
    out = ops[0]
    if p.out_perm is not None:
        return np.ascontiguousarray(out.transpose(p.out_perm))
    if not fresh or not out.flags.c_contiguous:  # a view of an input: the op returns new data
        return np.array(out, copy=True, order="C")
    return out
