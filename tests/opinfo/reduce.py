"""Op-info entries: reductions, order statistics and cumulative ops.

Samples sweep dim=None, int, negative, tuple dims and keepdim over 0-d, size-1, ordinary and
zero-size inputs. Entries whose gradient or indices depend on which of equal values wins use
distinct values (a permutation), and the ``*_ties`` entries test ties on purpose (without the
finite-difference gradcheck, which is undefined at a tie).
"""
import math

import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register

F = (np.float32, np.float64)
FI = F + (np.int64,)
FIB = FI + (np.bool_,)
INF = math.inf

# (shape, dims to try); the sentinel NONE leaves ``dim`` out of the call
NONE = object()
SHAPES = [((), (NONE, 0, -1)), ((1,), (0,)), ((5,), (NONE, 0, -1)),
          ((3, 4), (NONE, 1, -2, (0, 1))), ((2, 3, 4), (NONE, 1, (0, 2), (-1, 0))),
          ((0, 3), (NONE, 0, 1))]
INT_DIMS = [((), (NONE, 0)), ((1,), (0,)), ((5,), (NONE, -1)), ((3, 4), (NONE, 1, -2)),
            ((2, 3, 4), (NONE, 0, -1)), ((0, 3), (NONE, 0, 1))]


def distinct(rng, shape, dtype):
    """Values without ties: a shuffled range, so argmax/median/grads are well defined."""
    n = int(np.prod(shape))
    v = rng.permutation(n).reshape(shape) - n // 2
    return (v * 0.37).astype(dtype) if np.dtype(dtype).kind == "f" else v.astype(dtype)


def ties(rng, shape, dtype):
    """Small integers: many equal values per slice."""
    return rng.integers(0, 3, size=shape).astype(dtype)


def with_nan(rng, shape, dtype):
    x = np.array(make(rng, shape, dtype))
    if x.size and x.dtype.kind == "f":
        x[rng.random(shape) < 0.3] = np.nan
    return x


def away_from_zero(rng, shape, dtype):
    return (make(rng, shape, dtype, 0.5, 2.0) * rng.choice([-1, 1], size=shape)).astype(dtype)


def with_zeros(rng, shape, dtype):
    x = np.array(make(rng, shape, dtype, 0.5, 2.0) if np.dtype(dtype).kind == "f" else
                 make(rng, shape, dtype))
    if x.size:
        x[rng.random(shape) < 0.25] = 0
    return x


def reduce_samples(values=make, shapes=SHAPES, keepdim=True, dim_key="dim", **kw):
    """Every (shape, dim) of ``shapes``, with and without keepdim, plus fixed kwargs."""
    def gen(rng, dtype):
        for shape, dims in shapes:
            for dim in dims:
                for kd in (False, True) if keepdim and dim is not NONE else (False,):
                    kwargs = dict(kw)
                    if dim is not NONE:
                        kwargs[dim_key] = dim
                    if kd:
                        kwargs["keepdim"] = True
                    yield Sample((np.asarray(values(rng, shape, dtype)),), kwargs)
    return gen


def chain(*gens):
    def gen(rng, dtype):
        for g in gens:
            yield from g(rng, dtype)
    return gen


def fixed(*samples):
    """Hand-written (input, kwargs) samples, the input cast to the dtype (inputs holding inf
    or NaN only for floating dtypes)."""
    def gen(rng, dtype):
        for x, kwargs in samples:
            x = np.asarray(x)
            if np.dtype(dtype).kind != "f" and not np.isfinite(x).all():
                continue
            yield Sample((x.astype(dtype),), dict(kwargs))
    return gen


def call(name):
    return lambda L, x, **kw: getattr(L, name)(x, **kw)


def method(name):
    return lambda L, x, **kw: getattr(x, name)(**kw)


def double_backward(fn):
    """The gradient of sum(fn(x)^2) with create_graph: the harness then differentiates it
    again, which checks the grad rules' own backward."""
    def f(L, x, **kw):
        y = fn(L, x, **kw)
        y = y[0] if isinstance(y, tuple) else y
        return L.autograd.grad((y * y).sum(), x, create_graph=True)[0]
    return f


def dbl(name, fn, samples, **kw):
    kw.setdefault("gradcheck", False)  # the first derivative needs inputs requiring grad
    return OpInfo(name, double_backward(fn), samples, dtypes=(np.float64,), meta=False,
                  noncontiguous=False, **kw)


# ---- sums, means, products ---------------------------------------------------------------
register(
    OpInfo("sum", call("sum"), reduce_samples(), dtypes=FIB),
    OpInfo("sum_dtype", lambda L, x, **kw: x.sum(dtype=L.float64, **kw),
           reduce_samples(shapes=INT_DIMS), dtypes=FIB, covers=("sum",)),
    OpInfo("nansum", call("nansum"), chain(reduce_samples(), reduce_samples(with_nan)),
           dtypes=FIB),
    OpInfo("mean", call("mean"), reduce_samples(), dtypes=FI),
    OpInfo("mean_dtype", lambda L, x, **kw: L.mean(x, dtype=L.float64, **kw),
           reduce_samples(shapes=INT_DIMS), dtypes=FI, covers=("mean",)),
    OpInfo("nanmean", method("nanmean"), chain(reduce_samples(), reduce_samples(with_nan)),
           dtypes=FI, gradcheck=False),
    OpInfo("prod", call("prod"), chain(reduce_samples(shapes=INT_DIMS),
                                       reduce_samples(with_zeros, shapes=INT_DIMS)),
           dtypes=FIB),
    OpInfo("prod_zeros", lambda L, x, **kw: L.prod(x, **kw),
           fixed(([[1., 2., 3.], [0., 2., 3.], [0., 0., 3.]], dict(dim=1)),
                 ([[1., 2., 3.], [0., 2., 3.], [0., 0., 3.]], dict(dim=0, keepdim=True)),
                 ([0., 2., 3.], {}), ([0., 0., 3.], {})), covers=("prod",)),
    dbl("prod_double_backward", lambda L, x, **kw: L.prod(x, **kw),
        chain(reduce_samples(shapes=INT_DIMS[:5]), fixed(([[1., 2., 3.], [0., 2., 3.]],
                                                          dict(dim=1)))), covers=("prod",)),
)

# ---- var, std and their _mean forms ------------------------------------------------------
BIG = [((5,), (NONE, -1)), ((3, 4), (NONE, -2)), ((2, 3, 4), (NONE, -1, (0, 2)))]
VAR_SAMPLES = chain(reduce_samples(), reduce_samples(correction=0, shapes=BIG),
                    reduce_samples(correction=2, shapes=BIG),
                    reduce_samples(unbiased=False, shapes=BIG),
                    fixed(([[1., 2., 4.], [3., 3., 3.]], dict(dim=1)),
                          ([5.0], {}), ([5.0], dict(dim=0, correction=0))))
# N - correction <= 0: infinite or NaN results and gradients, as in PyTorch
VAR_DEGENERATE = fixed(([1., 2.], dict(correction=2)), ([1., 2.], dict(correction=3)),
                       ([[1., 2.], [3., 3.]], dict(dim=1, correction=2)),
                       ([[1., 2.], [3., 3.]], dict(dim=1, correction=3)),
                       ([3., 3.], dict(correction=2.5)))
for _name in ("var", "std", "var_mean", "std_mean"):
    register(OpInfo(_name, call(_name), VAR_SAMPLES, dtypes=FI if _name == "var" else F),
             OpInfo(f"{_name}_degenerate", call(_name), VAR_DEGENERATE, covers=(_name,),
                    gradcheck=False))
register(
    OpInfo("var_positional", lambda L, x: (x.var(1, False, True), L.std(x, 0, True),
                                           x.var(False), L.std(x, True)),
           fixed(([[1., 2., 4.], [3., 5., 8.]], {})), covers=("var", "std")),
    dbl("var_double_backward", call("var"), reduce_samples(shapes=BIG), covers=("var",)),
    dbl("std_double_backward", call("std"), reduce_samples(shapes=BIG), covers=("std",)),
)

# ---- logsumexp and norm ------------------------------------------------------------------
LSE_SHAPES = [(s, tuple(d for d in dims if d is not NONE)) for s, dims in SHAPES]
register(
    OpInfo("logsumexp", call("logsumexp"), reduce_samples(shapes=LSE_SHAPES), dtypes=FIB),
    OpInfo("logsumexp_inf", call("logsumexp"),
           fixed(([[-INF, -INF], [INF, 1.0], [INF, INF], [-INF, 0.0]], dict(dim=1))),
           covers=("logsumexp",), gradcheck=False),
    dbl("logsumexp_double_backward", call("logsumexp"), reduce_samples(shapes=LSE_SHAPES[2:5]),
        covers=("logsumexp",)),
)
NORM_SHAPES = [((), (NONE, 0)), ((1,), (0,)), ((5,), (NONE, -1)), ((3, 4), (NONE, 1, (0, 1))),
               ((2, 3, 4), (NONE, -1, (0, 2))), ((0, 3), (1,))]
for _p in (2, 1, INF, -INF, "fro", 0, 3, 0.5, -1, 1.5):
    register(OpInfo(f"norm_p{_p}", lambda L, x, **kw: L.norm(x, **kw),
                    reduce_samples(away_from_zero, shapes=NORM_SHAPES, p=_p),
                    dtypes=FI if _p == 2 else F, covers=("norm",)))
register(
    OpInfo("norm_method", lambda L, x, **kw: x.norm(**kw),
           chain(reduce_samples(with_zeros, shapes=NORM_SHAPES[:4]),
                 fixed(([0.0, 0.0], {}), ([[0.0, 0.0], [3.0, 4.0]], dict(dim=1)),
                       ([[0.0, 0.0], [3.0, 4.0]], dict(dim=1, p=3)),
                       ([[0.0, 0.0], [3.0, 4.0]], dict(dim=1, p=1.5)),
                       ([[1.0, -3.0, 3.0]], dict(dim=1, p=INF)),
                       ([[1.0, -3.0, 3.0]], dict(p=-INF)))),
           dtypes=F, covers=("norm",), gradcheck=False),
    OpInfo("norm_dtype", lambda L, x, **kw: L.norm(x, dtype=L.float64, **kw),
           reduce_samples(shapes=NORM_SHAPES[2:4]), covers=("norm",)),
    OpInfo("norm_empty", lambda L, x, **kw: L.norm(x, **kw),
           fixed((np.zeros((0, 3)), dict(p=INF)), (np.zeros((0, 3)), dict(p=INF, dim=0)),
                 (np.zeros((0, 3)), dict(p=INF, dim=1)), (np.zeros((0, 3)), dict(dim=0)),
                 (np.zeros((0, 3)), dict(p=1))), covers=("norm",)),
    dbl("norm_double_backward", lambda L, x, **kw: L.norm(x, **kw),
        chain(reduce_samples(away_from_zero, shapes=NORM_SHAPES[2:5]),
              reduce_samples(away_from_zero, shapes=NORM_SHAPES[3:4], p=3),
              reduce_samples(away_from_zero, shapes=NORM_SHAPES[3:4], p=1.5),
              reduce_samples(away_from_zero, shapes=NORM_SHAPES[3:4], p=0.5)),
        covers=("norm",)),
)

# ---- all, any, count_nonzero -------------------------------------------------------------
LOGIC = FIB + (np.uint8,)
register(
    OpInfo("all", call("all"), chain(reduce_samples(with_zeros),
                                     fixed(([[1, 0], [2, 3]], dict(dim=())))), dtypes=LOGIC),
    OpInfo("any", method("any"), chain(reduce_samples(with_zeros),
                                       fixed(([[1, 0], [0, 0]], dict(dim=())))), dtypes=LOGIC),
    OpInfo("count_nonzero", call("count_nonzero"),
           chain(reduce_samples(with_zeros, keepdim=False), fixed(([[1, 0], [2, 0]],
                                                                   dict(dim=()))),
                 fixed(([[1, 0], [2, 0]], dict(dim=0, keepdim=True)))),
           dtypes=FIB),
)

# ---- max, min, amax, amin, aminmax, argmax, argmin ---------------------------------------
ONE_DIM = [((), (NONE, 0, -1)), ((1,), (NONE, 0)), ((5,), (NONE, 0, -1)),
           ((3, 4), (NONE, 1, -2)), ((2, 3, 4), (NONE, 0, -1)), ((0, 3), (NONE, 0, 1)),
           ((3, 0), (1,))]
TIES = [((6,), (NONE, 0)), ((3, 4), (NONE, 1, 0)), ((2, 3, 4), (NONE, -1))]
for _name in ("max", "min"):
    register(
        OpInfo(_name, call(_name), reduce_samples(distinct, ONE_DIM), dtypes=FIB),
        OpInfo(f"{_name}_method", method(_name), reduce_samples(distinct, ONE_DIM[3:5]),
               dtypes=FIB, covers=(_name, f"{_name}_dim")),
        OpInfo(f"{_name}_ties", call(_name), chain(reduce_samples(ties, TIES),
                                                   reduce_samples(with_nan, TIES)),
               dtypes=FI, covers=(_name,), gradcheck=False),
        OpInfo(f"{_name}_binary", lambda L, a, b, n=_name: getattr(L, n)(a, b),
               lambda rng, dt: (Sample((make(rng, s1, dt), make(rng, s2, dt)))
                                for s1, s2 in [((3, 4), (3, 4)), ((3, 4), (4,)), ((), (2,))]),
               dtypes=FI, covers=("maximum" if _name == "max" else "minimum",)),
        dbl(f"{_name}_double_backward", call(_name), reduce_samples(distinct, ONE_DIM[2:5]),
            covers=(_name, f"{_name}_dim")),
    )
for _name in ("amax", "amin"):
    register(
        OpInfo(_name, call(_name), chain(reduce_samples(distinct),
                                         fixed(([[1, 2], [3, 4]], dict(dim=())),
                                               (np.zeros((0, 3)), dict(dim=(0, 1))),
                                               (np.zeros((0, 3)), dict(dim=(1,)))
                                               )), dtypes=FIB),
        OpInfo(f"{_name}_ties", call(_name), chain(reduce_samples(ties, TIES),
                                                   reduce_samples(with_nan, TIES)),
               dtypes=FI, covers=(_name,), gradcheck=False),
        dbl(f"{_name}_double_backward", call(_name), reduce_samples(ties, TIES),
            covers=(_name,)),
    )
register(
    OpInfo("aminmax", lambda L, x, **kw: L.aminmax(x, **kw),
           chain(reduce_samples(distinct, ONE_DIM), reduce_samples(ties, TIES)),
           dtypes=FIB, gradcheck=False),
    OpInfo("aminmax_gradcheck", lambda L, x, **kw: x.aminmax(**kw),
           reduce_samples(distinct, ONE_DIM[:5]), dtypes=(np.float64,), covers=("aminmax",)),
)
for _name in ("argmax", "argmin"):
    register(
        OpInfo(_name, call(_name), chain(reduce_samples(distinct, ONE_DIM),
                                         reduce_samples(ties, TIES),
                                         reduce_samples(with_nan, TIES)), dtypes=FIB),
        OpInfo(f"{_name}_method", method(_name), reduce_samples(distinct, ONE_DIM[3:4]),
               dtypes=F, covers=(_name,)),
    )

# ---- median, nanmedian, mode, kthvalue ---------------------------------------------------
for _name in ("median", "nanmedian"):
    register(
        OpInfo(_name, call(_name), chain(reduce_samples(distinct, ONE_DIM),
                                         fixed((np.zeros((0, 3)), {}))),
               dtypes=FIB, covers=(_name, f"{_name}_dim")),
        OpInfo(f"{_name}_ties", method(_name), chain(reduce_samples(ties, TIES),
                                                     reduce_samples(with_nan, TIES)),
               dtypes=FI, covers=(_name, f"{_name}_dim"), gradcheck=False),
        dbl(f"{_name}_double_backward", call(_name), reduce_samples(distinct, ONE_DIM[2:5]),
            covers=(_name, f"{_name}_dim")),
    )
NO_NONE = [(s, tuple(d for d in dims if d is not NONE)) for s, dims in ONE_DIM]
SMALL_TIES = [((6,), (0,)), ((3, 4), (1, 0)), ((2, 3, 4), (-1, 1))]  # rows of <= 16: see mode
register(
    OpInfo("mode", call("mode"), reduce_samples(distinct, NO_NONE), dtypes=FIB),
    OpInfo("mode_ties", call("mode"), reduce_samples(ties, SMALL_TIES), dtypes=FIB,
           covers=("mode",), gradcheck=False),
    OpInfo("kthvalue", lambda L, x, k, **kw: L.kthvalue(x, k, **kw),
           lambda rng, dt: (Sample((np.asarray(distinct(rng, s, dt)), k), kw)
                            for s, k, kw in [((), 1, {}), ((1,), 1, dict(dim=0)),
                                             ((5,), 2, {}), ((5,), 5, dict(dim=-1)),
                                             ((3, 4), 1, dict(dim=0, keepdim=True)),
                                             ((3, 4), 3, {}), ((2, 3, 4), 2, dict(dim=1)),
                                             ((0, 3), 1, dict(dim=1)), ((0, 3), 1, dict(dim=0)),
                                             ((3, 4), 5, {}), ((3, 4), 0, {}), ((), 2, {})]),
           dtypes=FIB),
    OpInfo("kthvalue_nan", lambda L, x, **kw: x.kthvalue(2, **kw),
           fixed(([[3., np.nan, 1.], [np.nan, np.nan, 2.]], dict(dim=1)),), covers=("kthvalue",),
           gradcheck=False),
    OpInfo("mode_method", lambda L, x: x.mode(), fixed(([[1., 3., 3., 1., 2.]], {}),
                                                       ([2., 2., 1., 1.], {})),
           covers=("mode",), gradcheck=False),
)

# ---- quantile, nanquantile ---------------------------------------------------------------
Q_DIMS = [((), (NONE, 0)), ((1,), (0,)), ((5,), (NONE, -1)), ((3, 4), (NONE, 1, -2)),
          ((2, 3, 4), (NONE, 0, -1))]


# PyTorch sorts rows of more than 16 elements unstably, so which of several NaNs (or equal
# values) a quantile lands on is arbitrary there: NaN samples keep rows short
Q_SHORT = Q_DIMS[:4] + [((2, 3, 4), (0, -1))]


def quantile_samples(values, shapes=Q_DIMS):
    """q values whose ranks q * (n - 1) are never whole: at a whole rank the derivative in q
    has a kink, which finite differences cannot check."""
    def gen(rng, dtype):
        q_tensor = np.array([0.1, 0.3, 0.45, 0.77, 0.9], dtype)
        for q in (0.35, q_tensor, np.asarray(0.6, dtype)):
            yield from reduce_samples(values, shapes, q=q)(rng, dtype)
        for mode in ("lower", "higher", "midpoint", "nearest"):
            yield from reduce_samples(values, Q_DIMS[2:4], q=q_tensor,
                                      interpolation=mode)(rng, dtype)
    return gen


def quantile_fn(name):
    def f(L, x, q, **kw):
        return getattr(L, name)(x, q, **kw)
    return f


def q_args(gen):
    """Samples whose kwargs hold q: pass q positionally (and as a tensor when an array)."""
    def g(rng, dtype):
        for s in gen(rng, dtype):
            kw = dict(s.kwargs)
            yield Sample(s.args + (kw.pop("q"),), kw)
    return g


for _name in ("quantile", "nanquantile"):
    register(
        OpInfo(_name, quantile_fn(_name), q_args(quantile_samples(distinct)),
               dtypes=FI if _name == "quantile" else F, covers=("quantile",)),
        OpInfo(f"{_name}_nan", quantile_fn(_name), q_args(quantile_samples(with_nan, Q_SHORT)),
               covers=("quantile",), gradcheck=False),
        OpInfo(f"{_name}_errors", quantile_fn(_name),
               lambda rng, dt: iter([Sample((make(rng, (3,), dt), 1.5)),
                                     Sample((make(rng, (3,), dt), np.array([0.5, 1.5], dt))),
                                     Sample((make(rng, (3,), dt), np.zeros((1, 1), dt))),
                                     Sample((make(rng, (3,), dt), np.array([0.5]))),
                                     Sample((make(rng, (0,), dt), 0.5)),
                                     Sample((make(rng, (3,), dt), 0.5), dict(dim=(0,))),
                                     Sample((make(rng, (3,), dt), 0.5),
                                            dict(interpolation="cubic"))]),
               dtypes=(np.float32,), covers=("quantile",)),
        OpInfo(f"{_name}_ends", quantile_fn(_name),
               q_args(reduce_samples(distinct, Q_DIMS[2:4], q=np.array([0.0, 1.0]))),
               dtypes=(np.float64,), covers=("quantile",), gradcheck=False),
        dbl(f"{_name}_double_backward", quantile_fn(_name),
            q_args(reduce_samples(distinct, Q_DIMS[2:4], q=0.3)), covers=("quantile",)),
    )

# ---- cumsum, cumprod, cummax, cummin -----------------------------------------------------
CUM_DIMS = [((), (0, -1)), ((1,), (0,)), ((5,), (0, -1)), ((3, 4), (1, -2)),
            ((2, 3, 4), (0, -1)), ((0, 3), (0, 1))]
register(
    OpInfo("cumsum", call("cumsum"), reduce_samples(shapes=CUM_DIMS, keepdim=False),
           dtypes=FIB),
    OpInfo("cumsum_dtype", lambda L, x, **kw: x.cumsum(dtype=L.float64, **kw),
           reduce_samples(shapes=CUM_DIMS[2:5], keepdim=False), dtypes=FIB, covers=("cumsum",)),
    OpInfo("cumsum_errors", lambda L, x, **kw: L.cumsum(x, **kw),
           fixed(([1., 2.], dict(dim=None)), ([1., 2.], dict(dim=1))), covers=("cumsum",)),
    dbl("cumsum_double_backward", call("cumsum"),
        reduce_samples(shapes=CUM_DIMS[2:5], keepdim=False), covers=("cumsum",)),
    OpInfo("cumprod", call("cumprod"),
           chain(reduce_samples(shapes=CUM_DIMS, keepdim=False),
                 reduce_samples(with_zeros, shapes=CUM_DIMS[2:5], keepdim=False),
                 fixed(([[2., 0., 3., 0., 5.], [0., 1., 2., 3., 4.]], dict(dim=1)),
                       ([[2., 1., 3., 4., 0.], [1., 0., 2., 3., 4.]], dict(dim=0)))),
           dtypes=FIB),
    OpInfo("cumprod_dtype", lambda L, x, **kw: L.cumprod(x, dtype=L.float64, **kw),
           reduce_samples(shapes=CUM_DIMS[2:5], keepdim=False), dtypes=FI, covers=("cumprod",)),
    dbl("cumprod_double_backward", call("cumprod"),
        reduce_samples(away_from_zero, shapes=CUM_DIMS[2:5], keepdim=False),
        covers=("cumprod",)),
)
for _name in ("cummax", "cummin"):
    register(
        OpInfo(_name, call(_name), reduce_samples(distinct, CUM_DIMS, keepdim=False),
               dtypes=FIB, covers=(_name, "cummaxmin_backward")),
        OpInfo(f"{_name}_ties", method(_name),
               chain(reduce_samples(ties, CUM_DIMS[2:5], keepdim=False),
                     reduce_samples(with_nan, CUM_DIMS[2:5], keepdim=False),
                     fixed(([np.nan, 1.0, np.nan, 2.0],  dict(dim=0)))),
               dtypes=FIB, covers=(_name,), gradcheck=False),
        dbl(f"{_name}_double_backward", call(_name),
            reduce_samples(ties, CUM_DIMS[2:5], keepdim=False),
            covers=(_name, "cummaxmin_backward")),
    )
