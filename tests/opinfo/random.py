"""Op-info entries: random ops. Values depend on the generator, so the harness compares only
shapes and dtypes (``random=True``); invalid arguments must raise what PyTorch raises.
Statistics and reproducibility are checked in ``tests/test_random.py``.

Factories take ``x`` only for its device and dtype, so that the meta-device run creates
meta tensors.
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, positive, register

RAND = dict(random=True, differentiable=False)
SHAPES = [(), (1,), (5,), (3, 4), (2, 3, 4), (0, 3)]


def _dt(L, name):
    return None if name is None else getattr(L, name)


def _like(rng, dtype):
    return make(rng, (1,), dtype)


def _factory_samples(sizes, dtypes=(None,), **extra):
    def gen(rng, dtype):
        for size in sizes:
            for d in dtypes:
                yield Sample((_like(rng, dtype), size, d), dict(extra))
    return gen


def _kw(L, x, d):
    return dict(device=x.device, dtype=_dt(L, d) or x.dtype)


def _fill_samples(*param_sets):
    """Each parameter set on every shape, plus int64/bool targets (which PyTorch rejects
    for continuous distributions)."""
    def gen(rng, dtype):
        for params in param_sets:
            for s in SHAPES:
                yield Sample((make(rng, s, dtype),) + tuple(params))
        for dt in (np.int64, np.bool_, np.int32):
            yield Sample((make(rng, (3, 2), dt, 0, 5),) + tuple(param_sets[0]))
    return gen


def _randint_samples(rng, dtype):
    x = _like(rng, dtype)
    for args in [(10, (3, 4)), (-5, 5, (2, 3)), (0, 1, ()), (3, (0, 2)), (5, 5, (2,)),
                 (5, 3, (2,)), (10, (-1,)), (2 ** 40, (3,)), (-(2 ** 40), 0, (3,))]:
        for d in (None, "int32", "uint8", "float32", "bool", "int16", "float64"):
            yield Sample((x, args, d))


def _gamma_grad_samples(rng, dtype):
    for s in SHAPES:
        a = positive(rng, s, dtype, 0.05, 20)
        x = np.maximum(rng.standard_gamma(a), 1e-30).astype(dtype)
        yield Sample((a, x))


def _normal_samples(rng, dtype):
    other = np.float64 if np.dtype(dtype) == np.float32 else np.float32
    for sm, ss in [((3, 4), (3, 4)), ((2, 3), (3,)), ((3, 1), (1, 4)), ((), ()), ((0, 2), (2,)),
                   ((2, 3), (4,)), ((6,), (2, 3))]:
        yield Sample((make(rng, sm, dtype), positive(rng, ss, dtype)))
    yield Sample((make(rng, (2, 3), dtype), positive(rng, (2, 3), other)))
    yield Sample((make(rng, (2, 3), dtype), 2.5))
    yield Sample((make(rng, (2, 3), dtype), -1.0))
    yield Sample((1.5, positive(rng, (2, 3), dtype)))
    yield Sample((make(rng, (2,), dtype), -positive(rng, (2,), dtype)))
    yield Sample((make(rng, (2,), np.int64), 1.0))


def _bernoulli_samples(rng, dtype):
    for s in SHAPES:
        yield Sample((make(rng, s, dtype, 0, 1),))
    yield Sample((make(rng, (3,), dtype, 1.5, 2),))
    yield Sample((make(rng, (3,), np.int64, 0, 2),))


def _multinomial_samples(rng, dtype):
    for shape, n, rep in [((5,), 3, False), ((5,), 5, False), ((5,), 8, True), ((3, 4), 2, False),
                          ((3, 4), 10, True), ((0, 3), 2, False), ((1,), 1, False),
                          ((5,), 6, False), ((5,), 0, True), ((2, 2, 2), 1, True),
                          ((2, 0), 1, False)]:
        yield Sample((positive(rng, shape, dtype), n, rep))
    yield Sample((np.array([0.5, -0.1], dtype), 1, True))
    yield Sample((np.array([0.0, 0.0], dtype), 1, True))
    yield Sample((np.array([1.0, np.inf], dtype), 1, True))
    yield Sample((np.array([1.0, 0.0, 0.0], dtype), 2, False))
    yield Sample((np.ones(3, np.int64), 1, True))
    yield Sample((np.array(1.0, dtype), 1, True))


def _bernoulli_fill_samples(rng, dtype):
    for s in SHAPES:
        yield Sample((make(rng, s, dtype), 0.3))
    yield Sample((make(rng, (2, 3), dtype), make(rng, (3,), dtype, 0, 1)))
    yield Sample((make(rng, (2, 3), dtype), make(rng, (2, 3), dtype, 0, 1)))
    yield Sample((make(rng, (3,), dtype), make(rng, (2, 3), dtype, 0, 1)))
    yield Sample((make(rng, (3,), dtype), make(rng, (3,), dtype, 1.5, 2)))
    yield Sample((make(rng, (3,), dtype), 2.0))
    yield Sample((make(rng, (3,), dtype), -0.5))
    for dt in (np.int64, np.bool_, np.uint8):
        yield Sample((make(rng, (3, 2), dt, 0, 2), 0.5))


def _random_fill_samples(rng, dtype):
    for dt in (dtype, np.int64, np.int32, np.uint8, np.bool_, np.int8):
        for args in [(), (5,), (2, 7), (3, 3), (0, 300), (-1, 3), (4, None)]:
            yield Sample((make(rng, (3, 4), dt, 0, 2),) + args)


register(
    OpInfo("rand", lambda L, x, size, d: L.rand(*size, **_kw(L, x, d)),
           _factory_samples([(2, 3), ((2, 3),), (), (0,), (-1, 3)],
                            (None, "float64", "float16", "bfloat16", "int64", "bool",
                             "complex64")), **RAND),
    OpInfo("randn", lambda L, x, size, d: L.randn(*size, **_kw(L, x, d)),
           _factory_samples([(2, 3), ([4],), (), (0, 5), (2, -3)],
                            (None, "float64", "float16", "int32", "complex128")), **RAND),
    OpInfo("rand_like", lambda L, x, d: (L.rand_like(x, dtype=_dt(L, d)),
                                         L.randn_like(x, dtype=_dt(L, d))),
           lambda rng, dt: [Sample((make(rng, s, dt), d)) for s in SHAPES
                            for d in (None, "float64")]
           + [Sample((make(rng, (2,), np.int64), None))],
           covers=("rand", "randn"), **RAND),
    OpInfo("randint", lambda L, x, args, d: L.randint(*args, device=x.device, dtype=_dt(L, d)),
           _randint_samples, **RAND),
    OpInfo("randint_like", lambda L, x, *a: L.randint_like(x, *a),
           lambda rng, dt: [Sample((make(rng, s, dt), 10)) for s in SHAPES]
           + [Sample((make(rng, (2, 3), np.int32), 3, 10)),
              Sample((make(rng, (2, 3), np.uint8), 3, 300))], covers=("randint",), **RAND),
    OpInfo("randperm", lambda L, x, n, d: L.randperm(n, device=x.device, dtype=_dt(L, d)),
           lambda rng, dt: [Sample((_like(rng, dt), n, d)) for n in (5, 0, 1, -1, 300, 2050)
                            for d in (None, "int32", "uint8", "float32", "float16", "bool")],
           **RAND),
    OpInfo("normal", lambda L, m, s: L.normal(m, s), _normal_samples, **RAND),
    OpInfo("normal_size", lambda L, x, size, d: L.normal(0.5, 2.0, size, **_kw(L, x, d)),
           _factory_samples([(2, 3), (), (0,), (-1,)], (None, "float64", "int64")),
           covers=("normal",), **RAND),
    OpInfo("bernoulli", lambda L, p: L.bernoulli(p), _bernoulli_samples, **RAND),
    OpInfo("bernoulli_p", lambda L, x, p: L.bernoulli(x, p),
           lambda rng, dt: [Sample((make(rng, s, dt), p)) for s in SHAPES
                            for p in (0.0, 0.3, 1.0, 2.0)], covers=("bernoulli",), **RAND),
    OpInfo("multinomial", lambda L, p, n, rep: L.multinomial(p, n, rep), _multinomial_samples,
           **RAND),
    OpInfo("poisson", lambda L, x: L.poisson(x),
           lambda rng, dt: [Sample((positive(rng, s, dt, 0, 5),)) for s in SHAPES]
           + [Sample((np.array([-1.0], dt),)), Sample((np.array([1, 2]),))], **RAND),
    OpInfo("_standard_gamma", lambda L, a: L._standard_gamma(a),
           lambda rng, dt: [Sample((positive(rng, s, dt, 0.1, 5),)) for s in SHAPES]
           + [Sample((np.array([-1.0, 0.0], dt),)), Sample((np.array([1, 2]),)),
              Sample((np.array([1.0], np.float16),))], **RAND),
    # PyTorch's derivative is a rational approximation (relative error up to ~1e-3 where
    # samples fall, more in the far tails): points drawn from the distribution
    OpInfo("_standard_gamma_grad", lambda L, a, x: L._standard_gamma_grad(a, x),
           _gamma_grad_samples,
           differentiable=False, gradcheck=False, atol=1e-6, rtol=2e-3),
    OpInfo("uniform_", lambda L, x, *a: x.uniform_(*a),
           _fill_samples((), (-2.0, 3.0), (1.0, 1.0), (2.0, 1.0)), **RAND),
    OpInfo("normal_", lambda L, x, *a: x.normal_(*a),
           _fill_samples((), (1.0, 3.0), (0.0, 0.0), (0.0, -1.0)), **RAND),
    OpInfo("exponential_", lambda L, x, *a: x.exponential_(*a),
           _fill_samples((), (2.5,), (0.0,), (-1.0,)), **RAND),
    OpInfo("geometric_", lambda L, x, *a: x.geometric_(*a),
           _fill_samples((0.3,), (0.9,), (0.0,), (1.0,)), **RAND),
    OpInfo("log_normal_", lambda L, x, *a: x.log_normal_(*a),
           _fill_samples((), (0.0, 0.5), (1.0, 0.0)), **RAND),
    OpInfo("cauchy_", lambda L, x, *a: x.cauchy_(*a),
           _fill_samples((), (1.0, 2.0), (0.0, 0.0)), **RAND),
    OpInfo("random_", lambda L, x, *a: x.random_(*a), _random_fill_samples, **RAND),
    OpInfo("bernoulli_", lambda L, x, p: x.bernoulli_(p), _bernoulli_fill_samples, **RAND),
)
