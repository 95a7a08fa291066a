"""Op-info entries: elementwise ops (unary math, binary arithmetic, comparisons, logic,
clamp, where, lerp, addcmul/addcdiv, masked_fill).

Float samples run in both the float32 and float64 passes. Samples with other dtypes (ints,
bool, float16, mixed-dtype promotion, special values) run once, in the float32 pass, so
the float64 pass stays a clean numerical gradcheck.
"""
import numpy as np

from tests.opinfo.core import (
    BINARY_SHAPES,
    OP_DB,
    UNARY_SHAPES,
    OpInfo,
    Sample,
    make as _make,
    register,
)

_FIRST = len(OP_DB)  # this family's entries start here (for the float16 companions)

F32 = np.dtype(np.float32)
INTS = (np.int64, np.int32, np.int16, np.int8, np.uint8)
SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 3.0, -3.0, 1e-20, 50.0, -50.0, 100.0,
                    np.inf, -np.inf, np.nan], np.float32)


def make(rng, shape, dtype=np.float32, low=-2.0, high=2.0) -> np.ndarray:
    """``core.make``, but 0-d results stay arrays (NumPy gives scalars for 0-d bools)."""
    return np.asarray(_make(rng, shape, dtype, low, high))


def once(dtype) -> bool:
    """Extra-dtype samples are generated in the float32 pass only."""
    return np.dtype(dtype) == F32


def away(rng, shape, dtype=np.float32, low=0.25, high=2.0):
    """Values with |x| in [low, high) and a random sign: away from poles and kinks at 0."""
    mag = make(rng, shape, np.float64, low, high)
    sign = np.where(rng.random(tuple(shape)) < 0.5, -1.0, 1.0)
    return np.asarray((mag * sign).astype(dtype))


def nonzero_ints(rng, shape, dtype=np.int64, low=-6, high=7):
    a = make(rng, shape, dtype, low, high)
    return np.asarray(np.where(a == 0, np.array(3, dtype), a).astype(dtype))


def with_zeros(rng, a, p=0.3):
    return np.where(rng.random(a.shape) < p, np.zeros((), a.dtype), a).astype(a.dtype)


# ---- unary -------------------------------------------------------------------------------

def unary_gen(low, high, ilow, ihigh, ints=INTS + (np.bool_,), maker=None, specials=True,
              kwargs=None):
    """Float samples over [low, high) in every shape, then (float32 pass) integer and bool
    inputs over [ilow, ihigh) and special values (no grad)."""
    kw = kwargs or {}

    def gen(rng, dt):
        for s in UNARY_SHAPES:
            a = maker(rng, s, dt) if maker else make(rng, s, dt, low, high)
            yield Sample((a,), dict(kw))
        if not once(dt):
            return
        for idt in ints:
            yield Sample((make(rng, (2, 3), idt, ilow, ihigh),), dict(kw), name=np.dtype(idt).name)
        if specials:
            yield Sample((SPECIAL.copy(),), dict(kw), grad_args=(), name="special")
    return gen


def _away_maker(rng, s, dt):
    return away(rng, s, dt)


# name: (float low, float high, int low, int high)
UNARY_FLOAT = {
    "exp": (-2, 2, -3, 4), "exp2": (-2, 2, -3, 4), "expm1": (-2, 2, -3, 4),
    "log": (0.1, 3, 1, 6), "log2": (0.1, 3, 1, 6), "log10": (0.1, 3, 1, 6),
    "log1p": (-0.9, 3, 0, 6), "sqrt": (0.1, 3, 0, 9), "rsqrt": (0.1, 3, 1, 9),
    "sin": (-3, 3, -3, 4), "cos": (-3, 3, -3, 4), "tan": (-1.2, 1.2, -1, 2),
    "asin": (-0.95, 0.95, -1, 2), "acos": (-0.95, 0.95, -1, 2), "atan": (-3, 3, -3, 4),
    "sinh": (-2, 2, -3, 4), "cosh": (-2, 2, -3, 4), "tanh": (-2, 2, -3, 4),
    "asinh": (-3, 3, -3, 4), "acosh": (1.1, 3, 1, 5), "atanh": (-0.95, 0.95, -1, 2),
    "sigmoid": (-4, 4, -3, 4), "erf": (-2, 2, -2, 3), "erfc": (-2, 2, -2, 3),
    "erfinv": (-0.95, 0.95, -1, 2), "lgamma": (0.2, 4, -3, 6), "digamma": (0.2, 4, 1, 6),
}

for _name, (_lo, _hi, _ilo, _ihi) in UNARY_FLOAT.items():
    register(OpInfo(_name, lambda L, x, n=_name: getattr(L, n)(x),
                    unary_gen(_lo, _hi, _ilo, _ihi)))

register(
    OpInfo("reciprocal", lambda L, x: x.reciprocal(), unary_gen(0, 0, -3, 4, maker=_away_maker)),
    OpInfo("logit", lambda L, x: L.logit(x), unary_gen(0.05, 0.95, 0, 2)),
    OpInfo("logit_eps", lambda L, x, eps: L.logit(x, eps),
           lambda rng, dt: (Sample((make(rng, s, dt, 0.0, 1.0), e)) for s in UNARY_SHAPES[:4]
                            for e in (0.2, 0.45)),
           covers=("logit",), gradcheck=False),
    OpInfo("lgamma_negative", lambda L, x: L.lgamma(x), unary_gen(-3.9, -0.1, -3, 0, ints=()),
           covers=("lgamma",), grad_rtol=1e-3),
    OpInfo("digamma_negative", lambda L, x: x.digamma(), unary_gen(-3.9, -0.1, -3, 0, ints=()),
           covers=("digamma",), atol=1e-4, rtol=1e-5, grad_rtol=1e-3),
    OpInfo("polygamma", lambda L, n, x: L.polygamma(n, x),
           lambda rng, dt: [Sample((n, make(rng, s, dt, 0.3, 4.0))) for n in (0, 1, 2, 3)
                            for s in UNARY_SHAPES[:5]]
           + ([Sample((1, make(rng, (2, 3), np.int64, 1, 6))), Sample((-1, make(rng, (2,), dt)))]
              if once(dt) else []),
           atol=1e-4, rtol=1e-5),
    OpInfo("square", lambda L, x: L.square(x), unary_gen(-2, 2, -5, 6)),
    OpInfo("frac", lambda L, x: x.frac(), unary_gen(-3, 3, -5, 6)),
    OpInfo("neg", lambda L, x: -x, unary_gen(-2, 2, -5, 6)),
    OpInfo("negative", lambda L, x: L.negative(x), unary_gen(-2, 2, -5, 6, ints=(np.bool_,)),
           covers=("neg",)),
    OpInfo("positive", lambda L, x: L.positive(x), unary_gen(-2, 2, -5, 6)),
    OpInfo("abs", lambda L, x: L.abs(x), unary_gen(0, 0, -5, 6, maker=_away_maker)),
    OpInfo("abs_op", lambda L, x: abs(x), unary_gen(0, 0, -5, 6, ints=(np.int8,),
                                                     maker=_away_maker), covers=("abs",)),
    OpInfo("sign", lambda L, x: L.sign(x), unary_gen(-2, 2, -5, 6)),
    # torch's sgn gradient is a ZeroTensor, which the harness cannot read: values only
    OpInfo("sgn", lambda L, x: x.sgn(), unary_gen(-2, 2, -5, 6, ints=()), covers=("sign",),
           differentiable=False),
    OpInfo("floor", lambda L, x: L.floor(x), unary_gen(-3, 3, -5, 6)),
    OpInfo("ceil", lambda L, x: x.ceil(), unary_gen(-3, 3, -5, 6)),
    OpInfo("trunc", lambda L, x: L.trunc(x), unary_gen(-3, 3, -5, 6)),
    OpInfo("fix", lambda L, x: L.fix(x), unary_gen(-3, 3, -5, 6, ints=()), covers=("trunc",)),
    OpInfo("round", lambda L, x: L.round(x), unary_gen(-3, 3, -5, 6)),
    OpInfo("round_half", lambda L, x: L.round(x),
           lambda rng, dt: [Sample((np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997],
                                             dt),), grad_args=())],
           covers=("round",)),
    OpInfo("round_decimals", lambda L, x, d: L.round(x, decimals=d),
           lambda rng, dt: [Sample((make(rng, s, dt, -300, 300), d))
                            for s in ((), (3, 4), (0, 2)) for d in (0, 1, 2, 3, -1, -2)]
           + ([Sample((make(rng, (4,), np.int64, -300, 300), 1))] if once(dt) else []),
           covers=("round",), atol=1e-4),
    OpInfo("relu", lambda L, x: L.relu(x), unary_gen(0, 0, -5, 6, maker=_away_maker)),
    OpInfo("nan_to_num", lambda L, x: L.nan_to_num(x), unary_gen(-2, 2, -5, 6)),
    OpInfo("nan_to_num_values", lambda L, x, **k: L.nan_to_num(x, **k),
           lambda rng, dt: [Sample((np.array([1.0, np.nan, np.inf, -np.inf, -2.0], dt),), k,
                                   grad_args=())
                            for k in ({}, {"nan": 1.5}, {"posinf": 9.0}, {"neginf": -9.0},
                                      {"nan": -1.0, "posinf": 2.0, "neginf": -2.0})]
           + [Sample((np.where(make(rng, (3, 4), dt) > 1, np.inf, make(rng, (3, 4), dt)),),
                     {"posinf": 5.0})],
           covers=("nan_to_num",)),
)


def bool_unary_gen(rng, dt):
    for s in UNARY_SHAPES:
        yield Sample((make(rng, s, dt),))
    yield Sample((SPECIAL.astype(dt),))
    if once(dt):
        for idt in INTS + (np.bool_,):
            yield Sample((make(rng, (2, 3), idt, -5, 6),), name=np.dtype(idt).name)


for _name in ("isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit", "logical_not"):
    register(OpInfo(_name, lambda L, x, n=_name: getattr(L, n)(x), bool_unary_gen,
                    differentiable=False))


def int_unary_gen(rng, dt):
    for idt in INTS + (np.bool_,):
        for s in ((), (5,), (3, 4), (0, 2)):
            yield Sample((make(rng, s, idt, -100, 100),), name=np.dtype(idt).name)
    yield Sample((make(rng, (3,), dt),), name="float")


register(OpInfo("bitwise_not", lambda L, x: ~x, int_unary_gen, dtypes=(F32,),
                differentiable=False))


# ---- binary ------------------------------------------------------------------------------

def _pairs(rng, dt, low, high, rlow, rhigh, rmaker=None):
    for sa, sb in BINARY_SHAPES:
        b = rmaker(rng, sb, dt) if rmaker else make(rng, sb, dt, rlow, rhigh)
        yield Sample((make(rng, sa, dt, low, high), b))


def mixed_samples(rng, low, high, rlow, rhigh, rmaker=None, int_rhs=None):
    """Promotion between different input dtypes (and the 0-d tensor / n-d tensor rule)."""
    def rhs(shape, dtype):
        if rmaker and np.dtype(dtype).kind == "f":
            return rmaker(rng, shape, dtype)
        if int_rhs and np.dtype(dtype).kind in "iub":
            return int_rhs(rng, shape, dtype)
        return make(rng, shape, dtype, rlow, rhigh)
    cases = [
        (np.float32, (3, 4), np.float64, (3, 4)), (np.float64, (4,), np.float32, (3, 4)),
        (np.int64, (3, 4), np.float32, (4,)), (np.float32, (3,), np.int64, (3,)),
        (np.int32, (3,), np.int64, (2, 3)), (np.uint8, (3,), np.int8, (3,)),
        (np.int16, (3,), np.uint8, (3,)), (np.bool_, (3,), np.int32, (3,)),
        (np.int64, (3,), np.bool_, (3,)), (np.bool_, (2, 3), np.bool_, (2, 3)),
        (np.float16, (3,), np.float32, (3,)), (np.float32, (3,), np.float64, ()),
        (np.float64, (), np.float32, (3,)), (np.int64, (3,), np.float64, ()),
        (np.int32, (2, 3), np.int64, ()), (np.float32, (), np.int64, (2, 2)),
        (np.int64, (2, 2), np.int64, (2, 2)), (np.int8, (4,), np.int8, (4,)),
        (np.uint8, (2, 3), np.uint8, (3,)),
    ]
    for ta, sa, tb, sb in cases:
        grad = tuple(i for i, t in enumerate((ta, tb)) if np.dtype(t) != np.float16)
        yield Sample((make(rng, sa, ta, low, high), rhs(sb, tb)), grad_args=grad,
                     name=f"{np.dtype(ta).name}-{np.dtype(tb).name}")


def binary_gen(low=-2.0, high=2.0, rlow=None, rhigh=None, scalars=(2.5, 3, -1.5, True),
               lscalars=(2.5, 3, -2), rmaker=None, int_rhs=None, int_scalars=(3, -2, 300),
               mixed=True, kwargs=None, lscalar_grad=True):
    """Broadcast pairs, tensor-scalar and scalar-tensor samples, then (float32 pass) integer,
    bool, mixed-dtype and Python-int-overflow samples. ``lscalar_grad=False``: PyTorch has no
    derivative for ``scalar op tensor`` (remainder), so those samples compare values only."""
    rlow = low if rlow is None else rlow
    rhigh = high if rhigh is None else rhigh
    kw = kwargs or {}

    def gen(rng, dt):
        for s in _pairs(rng, dt, low, high, rlow, rhigh, rmaker):
            yield Sample(s.args, dict(kw))
        for sc in scalars:
            yield Sample((make(rng, (3, 2), dt, low, high), sc), dict(kw), name="rscalar")
        for sc in lscalars:
            b = rmaker(rng, (2, 3), dt) if rmaker else make(rng, (2, 3), dt, rlow, rhigh)
            yield Sample((sc, b), dict(kw), None if lscalar_grad else (), name="lscalar")
        if not once(dt) or not mixed:
            return
        for s in mixed_samples(rng, low, high, rlow, rhigh, rmaker, int_rhs):
            yield Sample(s.args, dict(kw), s.grad_args, s.name)
        for idt in (np.int64, np.int8, np.uint8, np.bool_):
            for sc in int_scalars + (2.5,):
                a = make(rng, (4,), idt, -100, 100)
                yield Sample((a, sc), dict(kw), name=f"{np.dtype(idt).name}-scalar")
                yield Sample((sc, int_rhs(rng, (4,), idt) if int_rhs else a), dict(kw),
                             name=f"scalar-{np.dtype(idt).name}")
    return gen


def _fn2(name):
    return lambda L, a, b, **k: getattr(L, name)(a, b, **k)


register(
    OpInfo("add", _fn2("add"), binary_gen()),
    OpInfo("add_alpha", lambda L, a, b, alpha: L.add(a, b, alpha=alpha),
           binary_gen(kwargs={"alpha": 2}, mixed=False), covers=("add",)),
    OpInfo("add_alpha_float", lambda L, a, b, alpha: L.add(a, b, alpha=alpha),
           lambda rng, dt: [Sample((make(rng, (3,), dt), make(rng, (3,), dt)), {"alpha": 0.5})]
           + ([Sample((make(rng, (3,), t), make(rng, (3,), t)), {"alpha": al}, name=str(al))
               for t in (np.int64, np.bool_) for al in (0.5, True, 2)] if once(dt) else []),
           covers=("add",)),
    OpInfo("add_op", lambda L, a, b: a + b, binary_gen(), covers=("add",)),
    OpInfo("sub", _fn2("sub"), binary_gen()),
    OpInfo("sub_op", lambda L, a, b: a - b, binary_gen(), covers=("sub",)),
    OpInfo("sub_alpha", lambda L, a, b: L.subtract(a, b, alpha=3),
           binary_gen(mixed=False), covers=("sub",)),
    OpInfo("mul", _fn2("mul"), binary_gen()),
    OpInfo("mul_op", lambda L, a, b: a * b, binary_gen(), covers=("mul",)),
    OpInfo("div", _fn2("div"), binary_gen(rmaker=away, int_rhs=nonzero_ints)),
    OpInfo("div_op", lambda L, a, b: a / b, binary_gen(rmaker=away, int_rhs=nonzero_ints),
           covers=("div",)),
    OpInfo("div_trunc", lambda L, a, b: L.div(a, b, rounding_mode="trunc"),
           binary_gen(-5, 5, rmaker=away, int_rhs=nonzero_ints), covers=("div",)),
    OpInfo("div_floor", lambda L, a, b: L.div(a, b, rounding_mode="floor"),
           binary_gen(-5, 5, rmaker=away, int_rhs=nonzero_ints), covers=("div",)),
    # PyTorch has no derivative for floor_divide (tessera's is zero, as for rounding_mode)
    OpInfo("floor_divide", lambda L, a, b: a // b,
           binary_gen(-5, 5, rmaker=away, int_rhs=nonzero_ints), covers=("div",),
           differentiable=False),
    OpInfo("remainder", lambda L, a, b: L.remainder(a, b),
           binary_gen(-5, 5, rmaker=away, int_rhs=nonzero_ints, lscalar_grad=False),
           covers=("remainder",)),
    OpInfo("remainder_op", lambda L, a, b: a % b,
           binary_gen(-5, 5, rmaker=away, int_rhs=nonzero_ints, mixed=False,
                      lscalar_grad=False), covers=("remainder",)),
    OpInfo("fmod", _fn2("fmod"), binary_gen(-5, 5, rmaker=away, int_rhs=nonzero_ints)),
    OpInfo("atan2", _fn2("atan2"), binary_gen(rmaker=away, int_rhs=nonzero_ints)),
    OpInfo("arctan2", lambda L, a, b: a.arctan2(b), binary_gen(mixed=False, lscalars=()),
           covers=("atan2",)),
    OpInfo("hypot", _fn2("hypot"), binary_gen(rmaker=away)),
    OpInfo("logaddexp", _fn2("logaddexp"), binary_gen(-30, 30)),
    OpInfo("logaddexp2", _fn2("logaddexp2"), binary_gen(-30, 30)),
    OpInfo("logaddexp_extremes", lambda L, a, b: (L.logaddexp(a, b), a.logaddexp2(b)),
           lambda rng, dt: [Sample((np.array([0, 800, -800, np.inf, -np.inf, np.inf, np.nan, 2],
                                             dt),
                                    np.array([0, 799, -801, np.inf, -np.inf, 5, 1, np.nan],
                                             dt)))],
           covers=("logaddexp", "logaddexp2"), gradcheck=False, noncontiguous=False),
    OpInfo("maximum", _fn2("maximum"), binary_gen()),
    OpInfo("minimum", _fn2("minimum"), binary_gen()),
    OpInfo("fmax", _fn2("fmax"), binary_gen()),
    OpInfo("fmin", _fn2("fmin"), binary_gen()),
)


def exact_rounding_gen(rng, dt):
    """Signed dividends and divisors, floats whose quotient rounds across an integer, and
    division by zero (integers raise ZeroDivisionError, floats give inf/nan)."""
    a = np.array([7, -7, 7, -7, 0, 5, -5, 1], dt)
    b = np.array([2, 2, -2, -2, 3, 5, 5, 3], dt)
    yield Sample((a, b))
    yield Sample((np.array([1.0, -1.0, 0.3, -0.3], dt), np.array([0.1, 0.1, -0.1, 0.1], dt)))
    yield Sample((np.array([1.0, -1.0, 0.0, 2.5], dt), np.zeros(4, dt)), grad_args=())
    if once(dt):
        for t in INTS:
            x = np.array([7, -7, 7, -7, 0, 5], t) if np.dtype(t).kind == "i" else \
                np.array([7, 8, 200, 0, 5, 9], t)
            y = np.array([2, 2, -2, -2, 3, 5], t) if np.dtype(t).kind == "i" else \
                np.array([2, 3, 7, 3, 5, 2], t)
            yield Sample((x, y), name=np.dtype(t).name)
        yield Sample((np.array([1, 2, 3]), np.array([1, 0, 2])), name="int-zero-division")
        yield Sample((np.array([1, 2, 3]), 0), name="int-zero-scalar")
        yield Sample((np.array([1, 2, 3], np.uint8), 256), name="uint8-scalar-wraps-to-0")
        yield Sample((np.array([True, False]), np.array([True, True])), name="bool")


for _name, _fn in (("div", lambda L, a, b: a / b),
                   ("div_trunc", lambda L, a, b: L.div(a, b, rounding_mode="trunc")),
                   ("div_floor", lambda L, a, b: L.div(a, b, rounding_mode="floor")),
                   ("floor_divide", lambda L, a, b: L.floor_divide(a, b)),
                   ("remainder", lambda L, a, b: a % b), ("fmod", lambda L, a, b: L.fmod(a, b))):
    register(OpInfo(_name + "_exact", _fn, exact_rounding_gen, gradcheck=False,
                    covers=("remainder",) if _name == "remainder" else
                    ("fmod",) if _name == "fmod" else ("div",),
                    differentiable=_name != "floor_divide"))

register(OpInfo("div_bad_mode", lambda L, a, b: L.div(a, b, rounding_mode="round"),
                lambda rng, dt: [Sample((make(rng, (3,), dt), make(rng, (3,), dt, 1, 2)))],
                covers=("div",)))


def pow_gen(rng, dt):
    """Positive bases with any exponent, any base with integral exponents, scalar either
    side, integer powers (negative exponents: a Python int raises, a tensor gives 0/±1)."""
    for sa, sb in BINARY_SHAPES:
        yield Sample((make(rng, sa, dt, 0.2, 2.0), make(rng, sb, dt, -2.0, 2.0)))
    yield Sample((make(rng, (3, 4), dt, -2, 2), np.array([0, 1, 2, 3], dt)))
    yield Sample((make(rng, (3, 4), dt, -2, 2), np.array([-1, -2, 2, 3], dt)))
    for e in (2, 3, 0, 1, -1, -2, 0.5, -0.5, 2.5, True):
        lo = 0.2 if isinstance(e, float) else -2.0
        x = make(rng, (3, 2), dt, lo, 2.0)
        if e in (-1, -2):
            x = away(rng, (3, 2), dt)
        yield Sample((x, e), name=f"exponent={e}")
    for base in (2, 2.5, 0.5):
        yield Sample((base, make(rng, (2, 3), dt, -2.0, 2.0)), name=f"base={base}")
    if not once(dt):
        return
    yield Sample((np.array([0.0, 0.0, 0.0, 1.0, -1.0], dt),
                  np.array([0.0, 1.0, 2.0, 0.0, 2.0], dt)), name="zero-base")
    yield Sample((np.array([0.0, 0.0, 2.0], dt), 0), name="zero-base-0-exponent")
    yield Sample((np.array([0.0, 0.0, 2.0], dt), 2), name="zero-base-2-exponent")
    yield Sample((0.0, np.array([0.0, 1.0, 2.0], dt)), name="zero-scalar-base")
    ints = np.array([-3, -1, 0, 1, 2, 3])
    yield Sample((ints, np.array([2, 3, 2, 5, 10, 3])), name="int-int")
    yield Sample((ints, np.array([-1, -2, -1, -3, -1, 0])), name="int-negative-tensor")
    yield Sample((ints, -1), name="int-negative-scalar")
    yield Sample((ints, 2), name="int-scalar")
    yield Sample((ints, 0.5), name="int-float-scalar")
    yield Sample((2, ints), name="int-scalar-base")
    yield Sample((ints.astype(np.int8), 7), name="int8-overflow")
    yield Sample((np.array([True, False]), 2), name="bool-int")
    yield Sample((ints.astype(np.float32), np.array([2, 3, 2, 1, 0, 3])), grad_args=(0,),
                 name="float-int")
    yield Sample((make(rng, (3,), np.float32, 0.2, 2), make(rng, (3,), np.float64, -2, 2)),
                 name="float32-float64")
    yield Sample((make(rng, (3,), np.float32, 0.2, 2), make(rng, (), np.float64, -2, 2)),
                 name="float32-0d-float64")


register(
    OpInfo("pow", lambda L, a, b: L.pow(a, b), pow_gen),
    OpInfo("pow_op", lambda L, a, b: a ** b, pow_gen, covers=("pow",)),
    OpInfo("float_power", lambda L, a, b: L.float_power(a, b), pow_gen, covers=("pow",)),
)


# ---- comparisons and logic ---------------------------------------------------------------

def rounded(a):
    return np.asarray(np.round(a))


def compare_gen(rng, dt):
    for sa, sb in BINARY_SHAPES:
        a = rounded(make(rng, sa, dt, -2, 2))  # rounded: equal elements occur
        yield Sample((a, rounded(make(rng, sb, dt, -2, 2))))
    yield Sample((rounded(make(rng, (3, 2), dt)), 1.0))
    yield Sample((rounded(make(rng, (3, 2), dt)), 1))
    yield Sample((1.0, make(rng, (3, 2), dt)), name="lscalar")
    yield Sample((SPECIAL.astype(dt), SPECIAL[::-1].astype(dt)), name="special")
    if once(dt):
        for s in mixed_samples(rng, -2, 2, -2, 2):
            yield Sample(tuple(rounded(a) if a.dtype.kind == "f" else a for a in s.args),
                         name=s.name)
        yield Sample((make(rng, (4,), np.int64, -3, 3), 1.5), name="int-float-scalar")
        yield Sample((make(rng, (4,), np.uint8, 0, 3), -1), name="uint8-negative-scalar")
        yield Sample((make(rng, (4,), np.bool_), True), name="bool-scalar")


for _name in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"):
    register(OpInfo(_name, _fn2(_name), compare_gen, differentiable=False))

register(
    OpInfo("compare_ops", lambda L, a, b: (a == b, a != b, a < b, a <= b, a > b, a >= b),
           compare_gen, differentiable=False, covers=("eq", "ne", "lt", "le", "gt", "ge")),
    OpInfo("compare_aliases", lambda L, a, b: (L.not_equal(a, b), L.less(a, b),
                                               L.less_equal(a, b), L.greater(a, b),
                                               L.greater_equal(a, b)),
           compare_gen, differentiable=False, covers=("ne", "lt", "le", "gt", "ge")),
)


def bitwise_gen(shift=False):
    def gen(rng, dt):
        for idt in INTS + (np.bool_,):
            if shift and idt is np.bool_:
                continue
            for sa, sb in BINARY_SHAPES[:6]:
                lo, hi = (0, 9) if shift else (-100, 100)
                yield Sample((make(rng, sa, idt, -100, 100), make(rng, sb, idt, lo, hi)),
                             name=np.dtype(idt).name)
        yield Sample((make(rng, (4,), np.int64, -100, 100), 3), name="scalar")
        yield Sample((3, make(rng, (4,), np.int64, 0, 5)), name="lscalar")
        yield Sample((make(rng, (4,), np.uint8, 0, 100), make(rng, (4,), np.int8, 0, 5)),
                     name="uint8-int8")
        yield Sample((make(rng, (4,), np.bool_), make(rng, (4,), np.int32, 0, 5)),
                     name="bool-int32")
        yield Sample((make(rng, (4,), np.int16, -100, 100), True), name="bool-scalar")
        yield Sample((make(rng, (3,), dt), make(rng, (3,), dt)), name="float-error")
        yield Sample((make(rng, (3,), np.int64), 2.5), name="float-scalar-error")
        if shift:
            yield Sample((np.array([1, -8, 5, -5, 3]), np.array([1, 2, 70, 64, -1])),
                         name="wide-and-negative-shifts")
            yield Sample((np.array([1, -8, 5, 64], np.int8), np.array([1, 7, 9, 1], np.int8)),
                         name="int8-overflow")
            yield Sample((np.array([1, 200, 5], np.uint8), np.array([1, 7, 9], np.uint8)),
                         name="uint8")
    return gen


for _name, _op in (("bitwise_and", lambda a, b: a & b), ("bitwise_or", lambda a, b: a | b),
                   ("bitwise_xor", lambda a, b: a ^ b),
                   ("bitwise_left_shift", lambda a, b: a << b),
                   ("bitwise_right_shift", lambda a, b: a >> b)):
    register(
        OpInfo(_name, _fn2(_name), bitwise_gen("shift" in _name), dtypes=(F32,),
               differentiable=False),
        OpInfo(_name + "_op", lambda L, a, b, f=_op: f(a, b), bitwise_gen("shift" in _name),
               dtypes=(F32,), differentiable=False, covers=(_name,)),
    )


def isclose_gen(rng, dt):
    a = make(rng, (3, 4), dt)
    near = a + np.asarray(rng.uniform(-1e-5, 1e-5, a.shape), dt)
    yield Sample((a, near), {})
    yield Sample((a, a + np.asarray(1e-3, dt)), {})
    yield Sample((a, a + np.asarray(1e-3, dt)), {"rtol": 1e-2})
    yield Sample((a, a[0] + np.asarray(1e-3, dt)), {"atol": 1e-2})
    yield Sample((SPECIAL.astype(dt), SPECIAL.astype(dt)), {})
    yield Sample((SPECIAL.astype(dt), SPECIAL.astype(dt)), {"equal_nan": True})
    yield Sample((np.zeros((0, 3), dt), np.zeros((1, 3), dt)), {})
    if once(dt):
        yield Sample((np.array([1, 2, 3]), np.array([1, 3, 5])), {"atol": 1}, name="int")
        yield Sample((np.array([1, 2, 200], np.uint8), np.array([3, 1, 199], np.uint8)),
                     {"atol": 1}, name="uint8")
        yield Sample((np.array([True, False]), np.array([True, True])), {}, name="bool")
        yield Sample((a, a.astype(np.float64)), {}, name="dtype-mismatch")


def equal_gen(rng, dt):
    a = make(rng, (3, 4), dt)
    return [Sample((a, a.copy())), Sample((a, a + 1)), Sample((a, a[:1])), Sample((a, a[0]))]


register(
    OpInfo("isclose", lambda L, a, b, **k: L.isclose(a, b, **k), isclose_gen,
           differentiable=False),
    OpInfo("allclose", lambda L, a, b, **k: L.allclose(a, b, **k),
           lambda rng, dt: (s for s in isclose_gen(rng, dt) if s.name != "dtype-mismatch"),
           differentiable=False, covers=("isclose",), meta=False),  # Python bools
    OpInfo("equal", lambda L, a, b: L.equal(a, b), lambda rng, dt: equal_gen(rng, dt),
           differentiable=False, covers=("eq",), meta=False),
)


# ---- ternary -------------------------------------------------------------------------------

def where_gen(rng, dt):
    def cond(s):
        return make(rng, s, np.bool_)
    for sc, sa, sb in (((3, 4), (3, 4), (3, 4)), ((3, 4), (4,), (3, 1)), ((4,), (3, 4), ()),
                       ((), (2, 3), (2, 3)), ((0, 3), (0, 3), (3,)), ((2, 1, 3), (4, 1), (3,))):
        yield Sample((cond(sc), make(rng, sa, dt), make(rng, sb, dt)))
    yield Sample((cond((3, 2)), make(rng, (3, 2), dt), 0.5), name="scalar-other")
    yield Sample((cond((3, 2)), -1.5, make(rng, (3, 2), dt)), name="scalar-input")
    yield Sample((cond((3, 2)), 1.0, 0), name="both-scalars")
    if once(dt):
        yield Sample((cond((3,)), 1, 2), name="int-scalars")
        yield Sample((cond((3,)), True, False), name="bool-scalars")
        yield Sample((cond((3,)), make(rng, (3,), np.int32), 2.5), name="int32-float-scalar")
        yield Sample((cond((3,)), make(rng, (3,), np.int64), make(rng, (3,), np.float32)),
                     name="int64-float32")
        yield Sample((cond((3,)), make(rng, (3,), np.float32), make(rng, (), np.float64)),
                     name="float32-0d-float64")
        yield Sample((cond((3,)), make(rng, (3,), np.int8), 300), name="int8-int-overflow")
        yield Sample((make(rng, (3,), np.float32), 1.0, 2.0), name="float-condition")
        yield Sample((make(rng, (3,), np.uint8, 0, 2), 1.0, 2.0), name="uint8-condition")


def lerp_gen(rng, dt):
    for sa, sb, sw in (((3, 4), (3, 4), (3, 4)), ((3, 4), (4,), (3, 1)), ((), (2, 3), ()),
                       ((0, 3), (3,), (1, 3))):
        yield Sample((make(rng, sa, dt), make(rng, sb, dt), make(rng, sw, dt, -0.5, 1.5)))
    for w in (0.25, 0.75, 1.5, -0.5):
        yield Sample((make(rng, (3, 2), dt), make(rng, (3, 2), dt), w), name=f"weight={w}")
    if once(dt):
        yield Sample((make(rng, (3,), dt), make(rng, (3,), np.float64), 0.5), name="end-dtype")
        yield Sample((make(rng, (3,), dt), make(rng, (3,), dt), make(rng, (3,), np.float64)),
                     name="weight-dtype")
        yield Sample((make(rng, (3,), dt), make(rng, (3,), dt), make(rng, (), np.float64)),
                     name="0d-weight-dtype")
        yield Sample((make(rng, (3,), np.int64), make(rng, (3,), np.int64), 0.5), name="int")


def addc_gen(div):
    def gen(rng, dt):
        rhs = (lambda s, t=dt: away(rng, s, t)) if div else (lambda s, t=dt: make(rng, s, t))
        for sa, s1, s2 in (((3, 4), (3, 4), (3, 4)), ((3, 4), (4,), (3, 1)), ((), (2, 3), ()),
                           ((0, 3), (3,), (1, 3))):
            for v in (1, 0.5, -2):
                yield Sample((make(rng, sa, dt), make(rng, s1, dt), rhs(s2)), {"value": v})
        if once(dt):
            yield Sample((make(rng, (3,), dt), make(rng, (3,), np.float64),
                          rhs((3,), np.float64)), {"value": 2}, name="float64-tensors")
            yield Sample((make(rng, (3,), np.int64, -5, 5), make(rng, (3,), np.int64, -5, 5),
                          nonzero_ints(rng, (3,))), {"value": 2}, name="ints")
            yield Sample((make(rng, (3,), np.int64, -5, 5), make(rng, (3,), np.int64, -5, 5),
                          nonzero_ints(rng, (3,))), {"value": 1.5}, name="ints-float-value")
            yield Sample((make(rng, (3,), dt), make(rng, (3,), np.int64, -5, 5),
                          rhs((3,), np.float32)), {"value": 2}, name="int-tensor1")
            yield Sample((make(rng, (3,), dt), make(rng, (3,), np.int64, -5, 5),
                          nonzero_ints(rng, (3,))), {"value": 2}, name="int-tensors")
    return gen


def clamp_gen(rng, dt):
    x = make(rng, (3, 4), dt, -3, 3)
    for lo, hi in ((-1.0, 1.0), (-1.0, None), (None, 0.5), (2.0, -2.0), (0, 1)):
        yield Sample((x, lo, hi), name=f"[{lo}, {hi}]")
    yield Sample((make(rng, (), dt, -3, 3), -1.0, 1.0), name="0-d")
    yield Sample((make(rng, (0, 3), dt), -1.0, 1.0), name="zero-size")
    lo_t, hi_t = make(rng, (3, 4), dt, -2, 0), make(rng, (4,), dt, 0, 2)
    yield Sample((x, lo_t, hi_t), name="tensor-bounds")
    yield Sample((x, lo_t, None), name="tensor-min")
    yield Sample((x, None, hi_t), name="tensor-max")
    yield Sample((x, make(rng, (3, 4), dt, 0, 2), make(rng, (3, 1), dt, -2, 0)),
                 name="crossed-tensor-bounds")
    yield Sample((make(rng, (4,), dt), make(rng, (3, 1), dt, -2, 0), None),
                 name="broadcasting-bound")
    yield Sample((x, None, None), name="no-bounds")
    if once(dt):
        nan = np.array([1.0, np.nan, -3.0, 5.0], dt)
        yield Sample((nan, -1.0, 1.0), grad_args=(), name="nan-input")
        yield Sample((nan, np.nan, None), grad_args=(), name="nan-min")
        yield Sample((nan, None, np.array(np.nan, dt)), grad_args=(), name="nan-max-tensor")
        yield Sample((make(rng, (4,), np.int64, -5, 5), -2, 2), name="int")
        yield Sample((make(rng, (4,), np.int64, -5, 5), 0.5, 2), name="int-float-bound")
        yield Sample((make(rng, (4,), np.int64, -5, 5), make(rng, (4,), dt, -1, 0), None),
                     name="int-float-tensor-bound")
        yield Sample((make(rng, (4,), np.uint8, 0, 9), 2, 300), name="uint8-overflow-bound")
        yield Sample((make(rng, (4,), dt), make(rng, (4,), dt, -2, -1), 1.0),
                     name="tensor-and-number-bounds")
        yield Sample((make(rng, (4,), dt), make(rng, (), np.float64, -1, 0),
                      make(rng, (), np.float64, 0, 1)), name="0-d-float64-bounds")


def masked_fill_gen(rng, dt):
    x = make(rng, (3, 4), dt)
    yield Sample((x, make(rng, (3, 4), np.bool_), 2.5))
    yield Sample((x, make(rng, (4,), np.bool_), -1.0), name="broadcast-mask")
    yield Sample((make(rng, (4,), dt), make(rng, (3, 1), np.bool_), 0.0), name="mask-grows")
    yield Sample((x, make(rng, (), np.bool_), 7), name="0-d-mask")
    yield Sample((x, make(rng, (3, 4), np.bool_), make(rng, (), dt)), name="0-d-tensor-value")
    yield Sample((make(rng, (0, 4), dt), make(rng, (4,), np.bool_), 1.0), name="zero-size")
    if once(dt):
        yield Sample((x, make(rng, (3, 4), np.bool_), make(rng, (), np.float64)),
                     name="float64-value")
        yield Sample((make(rng, (4,), np.int64), make(rng, (4,), np.bool_), 2.5),
                     name="int-float-value")
        yield Sample((make(rng, (4,), np.bool_), make(rng, (4,), np.bool_), True), name="bool")
        yield Sample((x, make(rng, (3, 4), np.uint8, 0, 2), 1.0), name="uint8-mask")
        yield Sample((x, make(rng, (3, 4), np.int64, 0, 2), 1.0), name="int-mask")
        yield Sample((x, make(rng, (3, 4), np.bool_), make(rng, (2,), dt)), name="1-d-value")


register(
    OpInfo("where", lambda L, c, a, b: L.where(c, a, b), where_gen),
    OpInfo("where_method", lambda L, c, a, b: a.where(c, b),
           lambda rng, dt: (s for s in where_gen(rng, dt)
                            if hasattr(s.args[1], "shape") and s.args[1].dtype.kind != "u"),
           covers=("where",)),
    OpInfo("lerp", lambda L, a, b, w: L.lerp(a, b, w), lerp_gen),
    OpInfo("addcmul", lambda L, a, t1, t2, **k: L.addcmul(a, t1, t2, **k), addc_gen(False)),
    OpInfo("addcdiv", lambda L, a, t1, t2, **k: L.addcdiv(a, t1, t2, **k), addc_gen(True)),
    OpInfo("clamp", lambda L, x, lo, hi: L.clamp(x, lo, hi), clamp_gen),
    OpInfo("clamp_kw", lambda L, x, lo, hi: x.clip(min=lo, max=hi), clamp_gen,
           covers=("clamp",)),
    OpInfo("clamp_min", lambda L, x, lo, hi: L.clamp_min(x, lo if lo is not None else 0.0),
           clamp_gen, covers=("clamp",)),
    OpInfo("clamp_max", lambda L, x, lo, hi: x.clamp_max(hi if hi is not None else 0.0),
           clamp_gen, covers=("clamp",)),
    OpInfo("masked_fill", lambda L, x, m, v: L.masked_fill(x, m, v), masked_fill_gen),
    OpInfo("masked_fill_", lambda L, x, m, v: (x * 1).masked_fill_(m, v),
           masked_fill_gen, covers=("masked_fill",)),
)


# ---- in-place and out= forms -----------------------------------------------------------------

def inplace_gen(rng, dt):
    """Same-shape and broadcast right-hand sides; a right-hand side that would grow the
    target, and a result dtype that cannot be written back (both raise)."""
    yield Sample((make(rng, (3, 4), dt, 0.5, 2), make(rng, (3, 4), dt, 0.5, 2)))
    yield Sample((make(rng, (3, 4), dt, 0.5, 2), make(rng, (4,), dt, 0.5, 2)))
    yield Sample((make(rng, (3, 4), dt, 0.5, 2), 1.5), name="scalar")
    yield Sample((make(rng, (4,), dt, 0.5, 2), make(rng, (3, 4), dt, 0.5, 2)), name="grows")
    if once(dt):
        yield Sample((make(rng, (3,), np.int64, 1, 5), make(rng, (3,), np.int64, 1, 5)),
                     name="int")
        yield Sample((make(rng, (3,), np.int8, 1, 5), 300), name="int8-overflow")
        yield Sample((make(rng, (3,), np.int64, 1, 5), 2.5), name="int-float-error")
        yield Sample((make(rng, (3,), dt, 0.5, 2), make(rng, (3,), np.float64, 0.5, 2)),
                     name="float64-into-float32")


_INPLACE = {
    "add": lambda a, b: a.add_(b), "sub": lambda a, b: a.sub_(b, alpha=2),
    "mul": lambda a, b: a.mul_(b), "div": lambda a, b: a.div_(b),
    "remainder": lambda a, b: a.remainder_(b), "fmod": lambda a, b: a.fmod_(b),
    "pow": lambda a, b: a.pow_(b), "clamp": lambda a, b: a.clamp_(max=b),
    "addcmul": lambda a, b: a.addcmul_(b, b, value=2),
    "addcdiv": lambda a, b: a.addcdiv_(b, b + 1),
    "lerp": lambda a, b: a.lerp_(b, 0.3),
}
for _name, _f in _INPLACE.items():
    register(OpInfo(_name + "_inplace", lambda L, a, b, f=_f: f(a * 1, b), inplace_gen,
                    covers=(_name,)))

# one in-place unary each: a chain would overwrite values that backward needs
_UNARY_INPLACE = ("exp", "log", "log1p", "sqrt", "rsqrt", "square", "reciprocal", "sin", "cos",
                  "tanh", "sigmoid", "erf", "floor", "ceil", "round", "trunc", "frac", "relu",
                  "neg", "abs", "sign", "nan_to_num")
for _name in _UNARY_INPLACE:
    register(OpInfo(_name + "_", lambda L, x, n=_name: getattr(x * 1, n + "_")(),
                    unary_gen(0.1, 2, 0, 3, ints=(np.int64,)), covers=(_name,)))


def _iadd(a, b):
    a += b
    return a


register(
    OpInfo("iadd", lambda L, a, b: _iadd(a * 1, b), inplace_gen, covers=("add",)),
    OpInfo("out_arg", lambda L, a, b: L.add(a, b, out=L.empty(3, 4, dtype=L.float64)),
           lambda rng, dt: [Sample((make(rng, (3, 4), dt), make(rng, (4,), dt)))],
           differentiable=False, meta=False, covers=("add",)),
    OpInfo("out_arg_dtype_error", lambda L, a: L.floor(a, out=L.zeros(a.shape, dtype=L.int64)),
           lambda rng, dt: [Sample((make(rng, (3,), dt),))],
           differentiable=False, meta=False, covers=("floor",)),
)


# ---- float16: the same samples in half precision, compared to within one half-precision ulp
# (PyTorch's half kernels round differently from op to op: some cast a Python scalar to half
# first, some keep it in float32, some compute a reciprocal; no single rule matches them all)

def _half_samples(info):
    def gen(rng, dt):
        for s in info.samples(rng, F32):
            if any(isinstance(a, np.ndarray) and a.dtype == F32 for a in s.args):
                args = tuple(a.astype(np.float16) if isinstance(a, np.ndarray) and
                             a.dtype == F32 else a for a in s.args)
                yield Sample(args, s.kwargs, (), s.name)
    return gen


for _info in list(OP_DB[_FIRST:]):
    if F32 in map(np.dtype, _info.dtypes):
        register(OpInfo(_info.name + "_float16", _info.fn, _half_samples(_info), dtypes=(F32,),
                        covers=_info.covered_ops(), differentiable=False, atol=1e-3,
                        rtol=2e-3, meta=_info.meta))
