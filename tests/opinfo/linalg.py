"""Op-info entries: matrix products (matmul and its composites).

BLAS sums in a different order than PyTorch's kernels, so float32 compares at atol=1e-4.
Samples whose shapes or dtypes PyTorch rejects check that tessera raises the same type.
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register

TOL = dict(atol=1e-4, rtol=1e-4)

# (shape a, shape b): every broadcasting case of matmul, sizes 0 and 1, and mismatches
MATMUL_SHAPES = [
    ((3,), (3,)), ((1,), (1,)), ((0,), (0,)),                       # vector . vector
    ((3,), (3, 4)), ((3,), (2, 3, 4)), ((0,), (0, 2)),               # vector @ matrix/batch
    ((2, 3), (3,)), ((2, 2, 3), (3,)), ((0, 3), (3,)),               # matrix/batch @ vector
    ((2, 3), (3, 4)), ((1, 1), (1, 1)), ((2, 0), (0, 3)), ((0, 3), (3, 2)),
    ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (4, 2)), ((0, 3, 4), (4, 2)),  # batch @ matrix
    ((2, 3), (4, 3, 5)), ((2, 3), (1, 3, 5)),                          # matrix @ batch
    ((2, 3, 4), (2, 4, 5)), ((1, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
    ((3, 1, 2, 3), (1, 4, 3, 2)), ((2, 3, 0), (2, 0, 4)),            # broadcast batches
    ((2, 3), (4, 5)), ((3,), (4,)), ((3,), (4, 5)), ((2, 3), (4,)),  # rejected by torch
    ((2, 2, 3), (4,)), ((4,), (2, 3, 5)), ((2, 2, 3), (2, 4, 5)),
    ((2, 2, 3), (3, 3, 5)), ((2, 2, 3), (4, 5)), ((), (3,)), ((3,), ()),
]


def _pairs(shapes):
    def gen(rng, dtype):
        for sa, sb in shapes:
            yield Sample((make(rng, sa, dtype), make(rng, sb, dtype)))
    return gen


def _dtype_mismatch(shapes):
    """PyTorch's products never promote: a float32/float64 pair is an error."""
    def gen(rng, dtype):
        other = np.float64 if np.dtype(dtype) == np.float32 else np.float32
        for sa, sb in shapes:  # where torch accepts the pair (outer), check float64 grads
            yield Sample((make(rng, sa, dtype), make(rng, sb, other)),
                         grad_args=(0,) if np.dtype(dtype) == np.float64 else (1,))
            yield Sample((make(rng, sa, other), make(rng, sb, dtype)),
                         grad_args=(1,) if np.dtype(dtype) == np.float64 else (0,))
    return gen


def _int_pairs(shapes, dtypes=(np.int64, np.int32)):
    def gen(rng, dtype):
        for dt in dtypes:
            for sa, sb in shapes:
                yield Sample((make(rng, sa, dt, -5, 5), make(rng, sb, dt, -5, 5)))
        for sa, sb in shapes[:2]:  # bool is not implemented by PyTorch
            yield Sample((make(rng, sa, np.bool_), make(rng, sb, np.bool_)))
    return gen


INT_SHAPES = [((3,), (3,)), ((2, 3), (3, 4)), ((2, 3), (3,)), ((3,), (3, 2)),
              ((2, 2, 3), (2, 3, 4)), ((2, 2, 3), (3, 4))]


def _chain(*gens):
    def gen(rng, dtype):
        for g in gens:
            yield from g(rng, dtype)
    return gen


def _addmm_samples(rng, dtype):
    for si in [(2, 4), (4,), (1, 4), (2, 1), (), (1,), (0, 4)]:
        n = 0 if si == (0, 4) else 2
        yield Sample((make(rng, si, dtype), make(rng, (n, 3), dtype), make(rng, (3, 4), dtype)))
    x, a, b = make(rng, (2, 4), dtype), make(rng, (2, 3), dtype), make(rng, (3, 4), dtype)
    for beta, alpha in [(0.5, 2.0), (0, 1), (1, 0), (2, -1.5)]:
        yield Sample((x, a, b), dict(beta=beta, alpha=alpha))
    nan = np.full((2, 4), np.nan, dtype)   # beta=0 ignores the added term, even nan
    yield Sample((nan, a, b), dict(beta=0), grad_args=(1, 2))
    yield Sample((make(rng, (2, 4), dtype), make(rng, (2, 0), dtype), make(rng, (0, 4), dtype)))
    other = np.float64 if np.dtype(dtype) == np.float32 else np.float32
    bad = [((2, 4), (2, 3), (4, 4)), ((3, 4), (2, 3), (3, 4)), ((1, 2, 4), (2, 3), (3, 4)),
           ((2, 4), (3,), (3, 4)), ((2, 4), (2, 3), (2, 3, 4))]
    for si, sa, sb in bad:
        yield Sample((make(rng, si, dtype), make(rng, sa, dtype), make(rng, sb, dtype)))
    yield Sample((make(rng, (2, 4), other), a, b))
    yield Sample((x, make(rng, (2, 3), other), b))
    yield Sample((x, a, make(rng, (3, 4), other)))
    ints = [make(rng, s, np.int64, -4, 4) for s in [(2, 4), (2, 3), (3, 4)]]
    yield Sample(tuple(ints), dict(beta=2, alpha=3))
    yield Sample(tuple(ints), dict(beta=0.5, alpha=1.5))  # PyTorch truncates for ints
    yield Sample(tuple(make(rng, s, np.bool_) for s in [(2, 4), (2, 3), (3, 4)]))


def _addmv_samples(rng, dtype):
    for si in [(2,), (1,), ()]:
        yield Sample((make(rng, si, dtype), make(rng, (2, 3), dtype), make(rng, (3,), dtype)))
    x, m, v = make(rng, (2,), dtype), make(rng, (2, 3), dtype), make(rng, (3,), dtype)
    yield Sample((x, m, v), dict(beta=0.5, alpha=-2.0))
    yield Sample((make(rng, (0,), dtype), make(rng, (0, 3), dtype), v))
    yield Sample((x, make(rng, (2, 0), dtype), make(rng, (0,), dtype)))
    bad = [((3,), (2, 3), (3,)), ((2,), (2, 3), (4,)), ((2,), (2, 3), (3, 1)),
           ((1, 2), (2, 3), (3,)), ((2,), (3,), (3,))]
    for si, sm, sv in bad:
        yield Sample((make(rng, si, dtype), make(rng, sm, dtype), make(rng, sv, dtype)))
    other = np.float64 if np.dtype(dtype) == np.float32 else np.float32
    yield Sample((x, m, make(rng, (3,), other)))
    yield Sample((make(rng, (2,), other), m, v))


def _baddbmm_samples(rng, dtype):
    for si in [(2, 3, 4), (3, 4), (4,), (1, 1, 4), ()]:
        yield Sample((make(rng, si, dtype), make(rng, (2, 3, 5), dtype),
                      make(rng, (2, 5, 4), dtype)))
    yield Sample((make(rng, (2, 3, 4), dtype), make(rng, (2, 3, 5), dtype),
                  make(rng, (2, 5, 4), dtype)), dict(beta=0.5, alpha=2.0))
    yield Sample((make(rng, (0, 3, 4), dtype), make(rng, (0, 3, 5), dtype),
                  make(rng, (0, 5, 4), dtype)))
    bad = [((2, 3, 4), (2, 3, 5), (3, 5, 4)), ((2, 3, 4), (2, 3, 5), (2, 4, 4)),
           ((3, 3, 4), (2, 3, 5), (2, 5, 4)), ((3, 4), (3, 5), (5, 4)), ((2, 3, 4), (2, 3, 5),
                                                                        (5, 4))]
    for si, s1, s2 in bad:
        yield Sample((make(rng, si, dtype), make(rng, s1, dtype), make(rng, s2, dtype)))
    other = np.float64 if np.dtype(dtype) == np.float32 else np.float32
    yield Sample((make(rng, (2, 3, 4), other), make(rng, (2, 3, 5), dtype),
                  make(rng, (2, 5, 4), dtype)))
    yield Sample((make(rng, (2, 3, 4), dtype), make(rng, (2, 3, 5), dtype),
                  make(rng, (2, 5, 4), other)))


def _addbmm_samples(rng, dtype):
    for si in [(3, 4), (4,), (1, 4), ()]:
        yield Sample((make(rng, si, dtype), make(rng, (2, 3, 5), dtype),
                      make(rng, (2, 5, 4), dtype)))
    yield Sample((make(rng, (3, 4), dtype), make(rng, (2, 3, 5), dtype),
                  make(rng, (2, 5, 4), dtype)), dict(beta=-1.0, alpha=0.5))
    yield Sample((make(rng, (3, 4), dtype), make(rng, (0, 3, 5), dtype),
                  make(rng, (0, 5, 4), dtype)))
    bad = [((3, 4), (2, 3, 5), (3, 5, 4)), ((3, 4), (2, 3, 5), (2, 4, 4)),
           ((2, 4), (2, 3, 5), (2, 5, 4)), ((3, 4), (3, 5), (5, 4)), ((3, 4), (2, 3, 5),
                                                                      (5, 4))]
    for si, s1, s2 in bad:
        yield Sample((make(rng, si, dtype), make(rng, s1, dtype), make(rng, s2, dtype)))
    other = np.float64 if np.dtype(dtype) == np.float32 else np.float32
    yield Sample((make(rng, (3, 4), other), make(rng, (2, 3, 5), dtype),
                  make(rng, (2, 5, 4), dtype)))


def _tensordot_samples(rng, dtype):
    cases = [((3, 4, 5), (4, 5, 2), 2), ((3, 4), (4, 5), 1), ((2, 3), (4, 5), 0),
             ((3, 4), (3, 4), 2), ((3, 4, 5), (5, 2, 4), ([1, 2], [2, 0])),
             ((3, 4, 5), (5, 2, 4), ([-1], [0])), ((2, 3), (3, 2), [[0, 1], [1, 0]]),
             ((2, 1), (3, 5), 1), ((2, 3), (1, 5), 1), ((0, 3), (3, 2), 1), ((2, 0), (0, 3), 1),
             ((), (3, 4), 0), ((2, 3), (4, 5), 1), ((2, 3), (3, 5), -1), ((2, 3), (3, 5), 3),
             ((2, 3), (3, 5), ([1, 0], [0])), ((3, 3), (3, 3), ([0, 0], [0, 1])),
             ((2, 3), (3, 5), ([2], [0]))]
    for sa, sb, dims in cases:
        yield Sample((make(rng, sa, dtype), make(rng, sb, dtype)), dict(dims=dims))
    other = np.float64 if np.dtype(dtype) == np.float32 else np.float32
    yield Sample((make(rng, (2, 3), dtype), make(rng, (3, 5), other)), dict(dims=1))
    yield Sample((make(rng, (2, 3), np.int64), make(rng, (3, 5), np.int64)), dict(dims=1))


VEC_SHAPES = [((3,), (3,)), ((1,), (1,)), ((0,), (0,)), ((3,), (4,)), ((3, 1), (3,)),
              ((), ())]


def _complex_vectors(rng, dtype):
    c = np.complex128 if np.dtype(dtype) == np.float64 else np.complex64
    for n in (3, 0):
        yield Sample(((make(rng, (n,)) + 1j * make(rng, (n,))).astype(c),
                      (make(rng, (n,)) + 1j * make(rng, (n,))).astype(c)))


register(
    OpInfo("matmul", lambda L, a, b: L.matmul(a, b),
           _chain(_pairs(MATMUL_SHAPES), _dtype_mismatch(MATMUL_SHAPES[:22:3])), **TOL),
    OpInfo("matmul_operator", lambda L, a, b: a @ b, _pairs(MATMUL_SHAPES[:22]),
           covers=("matmul",), **TOL),
    OpInfo("matmul_int", lambda L, a, b: L.matmul(a, b), _int_pairs(INT_SHAPES),
           dtypes=(np.float32,), covers=("matmul",)),
    OpInfo("matmul_half", lambda L, a, b: L.matmul(a.to(L.float16), b.to(L.float16)).to(L.float32),
           _pairs(INT_SHAPES), dtypes=(np.float32,), covers=("matmul",), atol=1e-2,
           rtol=1e-2, differentiable=False),
    OpInfo("mm", lambda L, a, b: L.mm(a, b),
           _chain(_pairs([((2, 3), (3, 4)), ((1, 1), (1, 1)), ((2, 0), (0, 3)), ((0, 3), (3, 1)),
                          ((2, 3), (4, 5)), ((3,), (3, 4)), ((2, 3), (3,)),
                          ((2, 3), (2, 3, 4))]),
                  _dtype_mismatch([((2, 3), (3, 4))]), _int_pairs([((2, 3), (3, 4))])),
           covers=("matmul",), **TOL),
    OpInfo("mm_method", lambda L, a, b: a.mm(b), _pairs([((2, 3), (3, 4))]),
           covers=("matmul",), **TOL),
    OpInfo("bmm", lambda L, a, b: L.bmm(a, b),
           _chain(_pairs([((2, 3, 4), (2, 4, 5)), ((1, 1, 1), (1, 1, 1)), ((0, 3, 4), (0, 4, 2)),
                          ((2, 0, 4), (2, 4, 3)), ((2, 3, 0), (2, 0, 3)), ((2, 3, 4), (2, 5, 5)),
                          ((2, 3, 4), (3, 4, 5)), ((1, 3, 4), (2, 4, 5)), ((3, 4), (4, 5)),
                          ((2, 3, 4), (4, 5))]),
                  _dtype_mismatch([((2, 3, 4), (2, 4, 5))]), _int_pairs([((2, 3, 4), (2, 4, 5))])),
           covers=("matmul",), **TOL),
    OpInfo("mv", lambda L, a, b: L.mv(a, b),
           _chain(_pairs([((2, 3), (3,)), ((1, 1), (1,)), ((0, 3), (3,)), ((2, 0), (0,)),
                          ((2, 3), (4,)), ((3,), (3,)), ((2, 3), (3, 1))]),
                  _dtype_mismatch([((2, 3), (3,))]), _int_pairs([((2, 3), (3,))])),
           covers=("matmul",), **TOL),
    OpInfo("dot", lambda L, a, b: L.dot(a, b),
           _chain(_pairs(VEC_SHAPES), _dtype_mismatch([((3,), (3,))]),
                  _int_pairs([((3,), (3,))]), _complex_vectors), covers=("matmul",), **TOL),
    OpInfo("vdot", lambda L, a, b: L.vdot(a, b),
           _chain(_pairs(VEC_SHAPES), _dtype_mismatch([((3,), (3,))]),
                  _int_pairs([((3,), (3,))]), _complex_vectors), **TOL),
    OpInfo("inner", lambda L, a, b: L.inner(a, b),
           _chain(_pairs([((3,), (3,)), ((2, 3), (4, 3)), ((2, 3), (3,)), ((3,), (2, 2, 3)),
                          ((2, 1, 3), (4, 3)), ((0, 3), (2, 3)), ((2, 0), (3, 0)),
                          ((), (2, 3)), ((2, 3), ()), ((2, 3), (4,)), ((2, 3), (3, 2))]),
                  _dtype_mismatch([((2, 3), (4, 3)), ((3,), (3,))]),
                  _int_pairs([((2, 3), (4, 3))])),
           covers=("matmul", "mul"), **TOL),
    OpInfo("outer", lambda L, a, b: L.outer(a, b),
           _chain(_pairs([((3,), (4,)), ((1,), (1,)), ((0,), (3,)), ((3,), (0,)),
                          ((2, 2), (3,)), ((3,), ()), ((), (3,))]),
                  _dtype_mismatch([((3,), (4,))]), _int_pairs([((3,), (4,))])),
           covers=("mul",), **TOL),
    OpInfo("ger", lambda L, a, b: L.ger(a, b), _pairs([((3,), (4,))]), covers=("mul",),
           **TOL),
    OpInfo("addmm", lambda L, x, a, b, **kw: L.addmm(x, a, b, **kw), _addmm_samples,
           covers=("matmul", "add", "mul"), **TOL),
    OpInfo("addmm_", lambda L, x, a, b, **kw: x.clone().addmm_(a, b, **kw),
           lambda rng, dt: (s for s in _addmm_samples(rng, dt) if s.args[0].shape == (2, 4)),
           covers=("matmul", "add", "mul", "copy"), **TOL),
    OpInfo("addmv", lambda L, x, m, v, **kw: L.addmv(x, m, v, **kw), _addmv_samples,
           covers=("matmul", "add", "mul"), **TOL),
    OpInfo("baddbmm", lambda L, x, a, b, **kw: L.baddbmm(x, a, b, **kw), _baddbmm_samples,
           covers=("matmul", "add", "mul"), **TOL),
    OpInfo("addbmm", lambda L, x, a, b, **kw: x.addbmm(a, b, **kw)
           if hasattr(x, "addbmm") else L.addbmm(x, a, b, **kw), _addbmm_samples,
           covers=("matmul", "add", "mul"), **TOL),
    OpInfo("tensordot", lambda L, a, b, dims: L.tensordot(a, b, dims=dims),
           _tensordot_samples, covers=("matmul", "sum"), **TOL),
)


# ---- factorisations and triangular solves ------------------------------------------------

def _spd(L, a, d):
    """A symmetric positive-definite matrix from any ``a``: gradients flow to both triangles
    alike, so finite differences see what the analytic (symmetric) gradient gives."""
    return a @ a.transpose(-1, -2) + L.diag_embed(d)


def _cholesky_samples(rng, dtype):
    for shape in [(1, 1), (3, 3), (2, 4, 4), (2, 1, 3, 3), (0, 2, 2)]:
        for upper in (False, True):
            yield Sample((make(rng, shape, dtype), make(rng, shape[:-1], dtype, 0.5, 1.5),
                          upper))
    yield Sample((make(rng, (2, 3), dtype), make(rng, (2,), dtype), False))   # not square
    yield Sample((make(rng, (3,), dtype), make(rng, (3,), dtype), False))     # 1-d


def _not_pd_samples(rng, dtype):
    yield Sample((np.array([[1.0, 2.0], [2.0, 1.0]], dtype),), grad_args=())
    yield Sample((np.stack([np.eye(2), [[1.0, 2.0], [2.0, 1.0]]]).astype(dtype),), grad_args=())
    yield Sample((np.ones((2, 2), np.int64),), grad_args=())


def _triangular(rng, shape, dtype, upper):
    a = make(rng, shape, dtype) + 3 * np.eye(shape[-1], dtype=dtype)
    return np.triu(a) if upper else np.tril(a)


def _solve_samples(rng, dtype):
    for sa, sb in [((3, 3), (3, 2)), ((1, 1), (1, 4)), ((2, 3, 3), (2, 3, 1)),
                   ((3, 3), (2, 3, 2)), ((2, 1, 3, 3), (4, 3, 2)), ((0, 2, 2), (2, 1))]:
        for upper, transpose, unit in [(True, False, False), (False, False, False),
                                       (True, True, False), (False, False, True)]:
            yield Sample((make(rng, sb, dtype), _triangular(rng, sa, dtype, upper), upper,
                          transpose, unit))
    yield Sample((make(rng, (4, 2), dtype), _triangular(rng, (3, 3), dtype, True), True, False,
                  False))
    yield Sample((make(rng, (3, 2), dtype), make(rng, (2, 3), dtype), True, False, False))


register(
    OpInfo("cholesky", lambda L, a, d, upper: L.cholesky(_spd(L, a, d), upper),
           _cholesky_samples, covers=("matmul", "add"), **TOL),
    OpInfo("cholesky_method", lambda L, a, d, upper: _spd(L, a, d).cholesky(upper=upper),
           _cholesky_samples, covers=("cholesky",), **TOL),
    OpInfo("cholesky_not_pd", lambda L, a: L.cholesky(a), _not_pd_samples,
           covers=("cholesky",)),
    OpInfo("triangular_solve", lambda L, b, a, up, tr, unit:
           L.triangular_solve(b, a, up, tr, unit)[0], _solve_samples,
           covers=("solve_triangular",), **TOL),
)
