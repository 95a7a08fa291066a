"""Op-info entries: sort, argsort, msort, topk, unique, unique_consecutive, searchsorted and
bucketize.

Gradient samples use distinct values (a shuffled grid), so the order, and with it the
gradient, is unique; ties and NaN are tested in their own entries, with ``stable=True``
where the tie order matters, and without the finite-difference check (sorting is not
differentiable at a tie).
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, register

F = (np.float32, np.float64)
FI = (np.float32, np.float64, np.int64)
SHAPES = [(), (1,), (5,), (3, 4), (2, 3, 4), (0, 3)]


def distinct(rng, shape, dt):
    """Distinct values in a random order."""
    n = int(np.prod(shape))
    grid = rng.permutation(n) - n // 2
    if np.dtype(dt).kind == "f":
        grid = grid * 0.25
    return grid.astype(dt).reshape(shape)


def ties(rng, shape, dt, nan=False):
    """Small integers (many repeats), plus NaN and infinities for float dtypes when asked."""
    x = rng.integers(0, 3, size=shape).astype(dt)
    if nan and np.dtype(dt).kind == "f" and x.size >= 4:
        flat = x.reshape(-1)
        flat[[0, flat.size // 2]] = np.nan
        flat[1], flat[-1] = np.inf, -np.inf
    return x


def _dims(shape):
    return [0, -1] + ([1] if len(shape) >= 2 else [])


# ---- sort, argsort, msort ------------------------------------------------------------

def sort_samples(rng, dt):
    for s in SHAPES:
        for d in _dims(s):
            for desc in (False, True):
                yield Sample((distinct(rng, s, dt),), dict(dim=d, descending=desc))
    yield Sample((distinct(rng, (3, 4), dt),), dict(stable=True), name="stable")
    yield Sample((distinct(rng, (3, 4), dt),), dict(dim=2), name="dim_out_of_range")
    yield Sample((distinct(rng, (), dt),), dict(dim=1), name="0d_dim_out_of_range")


def ties_samples(rng, dt):
    for s in [(8,), (4, 6), (2, 5, 3)]:
        for d in _dims(s):
            for desc in (False, True):
                yield Sample((ties(rng, s, dt, nan=True),), dict(dim=d, descending=desc,
                                                                 stable=True))
    yield Sample((np.array([0.0, -0.0, 0.0, -0.0], dt) if np.dtype(dt).kind == "f" else
                  np.zeros(4, dt),), dict(stable=True), name="signed_zeros")
    yield Sample((np.array([3, 1, 3, 2, 1], np.int8),), dict(descending=True, stable=True),
                 name="int8")
    yield Sample((np.array([True, False, True, False]),), dict(stable=True), name="bool")


def sort_attrs(L, x, **kw):
    r = L.sort(x, **kw)
    return r.values, r.indices


def argsort_samples(rng, dt):
    for s in [(), (6,), (3, 5), (0, 2)]:
        for d in _dims(s):
            for desc in (False, True):
                yield Sample((ties(rng, s, dt),), dict(dim=d, descending=desc, stable=True))
    yield Sample((distinct(rng, (3, 4), dt), 1, True), name="positional")


def msort_samples(rng, dt):
    for s in [(), (5,), (3, 4), (2, 3, 4), (0, 3)]:
        yield Sample((distinct(rng, s, dt),))


# ---- topk ----------------------------------------------------------------------------

def topk_samples(rng, dt):
    yield Sample((distinct(rng, (5,), dt), 2))
    yield Sample((distinct(rng, (3, 4), dt), 2), dict(dim=0, largest=False))
    yield Sample((distinct(rng, (2, 3, 4), dt), 3), dict(dim=-1))
    yield Sample((distinct(rng, (2, 3, 4), dt), 2), dict(dim=1, largest=False))
    yield Sample((distinct(rng, (3, 4), dt), 4), name="k_is_size")
    yield Sample((distinct(rng, (3, 4), dt), 0), name="k_0")
    yield Sample((distinct(rng, (), dt), 1), name="0d")
    yield Sample((distinct(rng, (), dt), 0), name="0d_k_0")
    yield Sample((distinct(rng, (0, 3), dt), 2), dict(dim=1), name="zero_size")
    yield Sample((distinct(rng, (1,), dt), 1), name="size_1")
    yield Sample((distinct(rng, (3, 4), dt), 5), name="k_too_big")
    yield Sample((distinct(rng, (3, 4), dt), -1), name="k_negative")
    yield Sample((distinct(rng, (), dt), 2), name="0d_k_too_big")
    yield Sample((distinct(rng, (3, 4), dt), 1), dict(dim=2), name="dim_out_of_range")
    yield Sample((np.array([True, False]), 1), name="bool")


def topk_nan_samples(rng, dt):
    yield Sample((np.array([3.0, np.nan, 1.0, -np.inf, 2.0], dt), 2))
    yield Sample((np.array([3.0, np.nan, 1.0, np.inf, 2.0], dt), 5), dict(largest=False))


def topk_unsorted(L, x, k, dim=-1, largest=True):
    """sorted=False leaves the order open: compare the results after sorting them."""
    v, i = L.topk(x, k, dim, largest, sorted=False)
    s = v.sort(dim)
    return s.values, i.gather(dim, s.indices)


def topk_unsorted_samples(rng, dt):
    yield Sample((distinct(rng, (7,), dt), 4))
    yield Sample((distinct(rng, (4, 6), dt), 3, 0, False))
    yield Sample((distinct(rng, (2, 3, 40), dt), 5, -1))


def topk_attrs(L, x, k):
    r = x.topk(k)
    return r.values, r.indices


# ---- unique, unique_consecutive -------------------------------------------------------

FLAGS = [dict(), dict(return_inverse=True), dict(return_counts=True),
         dict(return_inverse=True, return_counts=True)]


def unique_samples(rng, dt):
    for s in [(), (1,), (7,), (3, 4), (2, 3, 4), (0, 3)]:
        for kw in FLAGS:
            yield Sample((ties(rng, s, dt),), dict(kw))
    for s in [(4, 3), (3, 2, 4)]:
        for d in _dims(s):
            for kw in FLAGS[1:]:
                x = ties(rng, s, dt)
                x = np.concatenate([x, np.take(x, [0], axis=d)], axis=d)  # a repeated slice
                yield Sample((x,), dict(kw, dim=d))
    if np.dtype(dt).kind == "f":
        yield Sample((np.array([np.nan, 1.0, np.nan, 1.0], dt),), dict(FLAGS[3]), name="nan")
    yield Sample((np.array([True, False, True]),), dict(return_counts=True), name="bool")
    yield Sample((ties(rng, (0, 3), dt),), dict(FLAGS[3], dim=0), name="zero_size_dim")
    yield Sample((ties(rng, (5,), dt),), dict(sorted=False, return_inverse=True),
                 name="unsorted")
    yield Sample((ties(rng, (), dt),), dict(dim=0), name="0d_dim")
    yield Sample((ties(rng, (0, 3), dt),), dict(dim=1), name="zero_size_other_dim")


def unique_consecutive_samples(rng, dt):
    for s in [(), (1,), (9,), (3, 4), (0, 3)]:
        for kw in FLAGS:
            yield Sample((np.repeat(ties(rng, s, dt), 2, axis=-1) if s else ties(rng, s, dt),),
                         dict(kw))
    for s in [(5, 3), (2, 4, 3)]:
        for d in _dims(s):
            x = np.repeat(rng.integers(0, 2, size=s).astype(dt), 2, axis=d)
            yield Sample((x,), dict(FLAGS[3], dim=d))
    yield Sample((ties(rng, (0, 3), dt),), dict(FLAGS[3], dim=0), name="zero_size_dim")
    yield Sample((ties(rng, (), dt),), dict(dim=0), name="0d_dim")


# ---- searchsorted, bucketize ---------------------------------------------------------

def sorted_seq(rng, shape, dt):
    return np.sort(rng.integers(0, 10, size=shape), axis=-1).astype(dt)


def searchsorted_samples(rng, dt):
    for right in (False, True):
        kw = dict(right=right)
        yield Sample((sorted_seq(rng, (8,), dt), rng.integers(-1, 11, (3, 4)).astype(dt)), kw)
        yield Sample((sorted_seq(rng, (2, 3, 6), dt),
                      rng.integers(-1, 11, (2, 3, 4)).astype(dt)), kw, name="batched")
        yield Sample((sorted_seq(rng, (8,), dt), 4), kw, name="scalar")
        yield Sample((sorted_seq(rng, (8,), dt), np.array(5, dt)), kw, name="0d")
    seq = rng.integers(0, 10, (7,)).astype(dt)
    order = np.argsort(seq, kind="stable").astype(np.int64)
    v = rng.integers(-1, 11, (5,)).astype(dt)
    yield Sample((seq, v), dict(sorter=order, side="right"), name="sorter")
    yield Sample((seq, v), dict(sorter=order, side="left", out_int32=True), name="sorter_left")
    yield Sample((sorted_seq(rng, (6,), dt), rng.integers(-1, 11, (4,))), name="mixed_dtypes")
    yield Sample((sorted_seq(rng, (6,), dt), 4.5), dict(out_int32=True), name="float_scalar")
    if np.dtype(dt).kind == "f":
        yield Sample((np.array([1, 2, 3, np.nan], dt), np.array([np.nan, 2, 0, 5], dt)),
                     name="nan")
    yield Sample((np.zeros(0, dt), v), name="empty_sequence")
    yield Sample((sorted_seq(rng, (6,), dt), np.zeros((0, 3), dt)), name="empty_input")
    yield Sample((np.array(3, dt), v), name="0d_sequence")
    yield Sample((sorted_seq(rng, (2, 6), dt), v), name="leading_dims")
    yield Sample((sorted_seq(rng, (2, 6), dt), 3), name="scalar_with_2d_sequence")
    yield Sample((seq, v), dict(sorter=order.astype(np.int32)), name="int32_sorter")
    yield Sample((seq, v), dict(sorter=order[:3]), name="sorter_shape")
    yield Sample((seq, v), dict(sorter=order + 1), name="sorter_out_of_range")
    yield Sample((seq, v), dict(right=True, side="left"), name="side_conflict")
    yield Sample((seq, v), dict(side="middle"), name="bad_side")
    yield Sample((np.array([False, True]), np.array([True])), name="bool")


def bucketize_samples(rng, dt):
    b = sorted_seq(rng, (6,), dt)
    for right in (False, True):
        yield Sample((rng.integers(-1, 11, (3, 4)).astype(dt), b), dict(right=right))
        yield Sample((7, b), dict(right=right, out_int32=True), name="scalar")
    yield Sample((np.zeros((0, 2), dt), b), name="empty")
    yield Sample((rng.integers(-1, 11, (3,)).astype(dt), b.reshape(2, 3)), name="2d")
    yield Sample((rng.integers(-1, 11, (3,)).astype(dt), np.array(1, dt)), name="0d")


register(
    OpInfo("sort", lambda L, x, **kw: L.sort(x, **kw), sort_samples, dtypes=FI),
    OpInfo("sort_attrs", sort_attrs, sort_samples, covers=("sort",)),
    OpInfo("sort_ties", lambda L, x, **kw: x.sort(**kw), ties_samples, dtypes=FI,
           gradcheck=False, covers=("sort",)),
    OpInfo("argsort", lambda L, x, *a, **kw: L.argsort(x, *a, **kw), argsort_samples,
           dtypes=FI, differentiable=False, covers=("sort",)),
    OpInfo("msort", lambda L, x: L.msort(x), msort_samples, dtypes=FI, covers=("sort",)),
    OpInfo("topk", lambda L, x, k, **kw: L.topk(x, k, **kw), topk_samples, dtypes=FI),
    OpInfo("topk_nan", lambda L, x, k, **kw: L.topk(x, k, **kw), topk_nan_samples,
           gradcheck=False, covers=("topk",)),
    OpInfo("topk_unsorted", topk_unsorted, topk_unsorted_samples, dtypes=FI,
           covers=("topk", "sort", "gather")),
    OpInfo("topk_attrs", topk_attrs, lambda rng, dt: [Sample((distinct(rng, (3, 5), dt), 2))],
           covers=("topk",)),
    # unique's outputs have no gradient (PyTorch marks them requires_grad but cannot
    # backpropagate), and their sizes depend on the data, so no meta run
    OpInfo("unique", lambda L, x, **kw: L.unique(x, **kw), unique_samples,
           dtypes=FI + (np.bool_,), differentiable=False, meta=False),
    OpInfo("unique_method", lambda L, x, **kw: x.unique(**kw), unique_samples,
           differentiable=False, meta=False, covers=("unique",)),
    OpInfo("unique_consecutive", lambda L, x, **kw: L.unique_consecutive(x, **kw),
           unique_consecutive_samples, dtypes=FI, differentiable=False, meta=False),
    OpInfo("searchsorted", lambda L, s, v, **kw: L.searchsorted(s, v, **kw),
           searchsorted_samples, dtypes=FI, differentiable=False),
    OpInfo("bucketize", lambda L, x, b, **kw: L.bucketize(x, b, **kw), bucketize_samples,
           dtypes=FI, differentiable=False, covers=("searchsorted",)),
)
