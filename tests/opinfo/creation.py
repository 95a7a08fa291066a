"""Op-info entries: factories, casts, device moves, clone, copy and fill.

Factories have no tensor inputs, so their entries take a one-element ``like`` tensor only for
its device (``device=like.device``): the same entry then runs on ``meta`` too. Dtypes are
passed by name and looked up in the library (``getattr(L, "int64")``).
"""
import numpy as np

from tests.opinfo.core import UNARY_SHAPES, OpInfo, Sample, make, register

F32 = np.dtype(np.float32)
DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32",
          "int64", "bool")


def once(dtype) -> bool:
    return np.dtype(dtype) == F32


def _dt(L, name):
    return None if name is None else getattr(L, name)


def _like(rng=None):
    return np.zeros((1,), np.float32)


def factory(*cases):
    """Samples ``(like, *args)`` with kwargs; ``dtype`` given by name."""
    def gen(rng, dt):
        if not once(dt):
            return
        for args, kw in cases:
            yield Sample((_like(),) + tuple(args), dict(kw), grad_args=(),
                         name=",".join(map(str, args)) + "".join(f",{k}={v}"
                                                                 for k, v in kw.items()))
    return gen


def _kw(L, like, dtype=None, **kw):
    return dict(kw, dtype=_dt(L, dtype), device=like.device)


SIZES = [((2, 3), {}), (((2, 3),), {}), (([4],), {}), ((), {}), ((0, 3), {}), ((5,), {}),
         ((2, 2), {"dtype": "float64"}), ((3,), {"dtype": "int64"}), ((3,), {"dtype": "bool"}),
         ((2,), {"dtype": "float16"}), ((2,), {"dtype": "bfloat16"}), ((2,), {"dtype": "uint8"}),
         ((-1, 2), {}), ((2.5,), {})]

register(
    OpInfo("zeros", lambda L, like, *size, **k: L.zeros(*size, **_kw(L, like, **k)),
           factory(*SIZES), covers=("full",)),
    OpInfo("ones", lambda L, like, *size, **k: L.ones(*size, **_kw(L, like, **k)),
           factory(*SIZES), covers=("full",)),
    OpInfo("empty", lambda L, like, *size, **k: L.empty(*size, **_kw(L, like, **k)),
           factory(*SIZES), random=True),
    OpInfo("full", lambda L, like, size, v, **k: L.full(size, v, **_kw(L, like, **k)),
           factory((((2, 3), 1.5), {}), (((2, 3), 7), {}), (((4,), True), {}),
                   (((), -2.5), {}), (((0, 2), 1.0), {}), ((3, 2.0), {}),
                   (((2,), 7), {"dtype": "float32"}), (((2,), 2.7), {"dtype": "int32"}),
                   (((2,), 1), {"dtype": "bool"}), (((2,), 300), {"dtype": "uint8"}),
                   (((2,), 1e10), {"dtype": "float16"}), (((2,), float("inf")), {}),
                   (((2, 2), 0.1), {"dtype": "bfloat16"}), (((2,), 0.1), {"dtype": "float64"}),
                   (((-2,), 1.0), {})),
           covers=("full",)),
    OpInfo("factory_like", lambda L, x, **k: (L.zeros_like(x, **k), L.ones_like(x, **k),
                                              L.full_like(x, 2.5, **k), L.empty_like(x, **k)),
           lambda rng, dt: [Sample((make(rng, s, dt),), grad_args=()) for s in UNARY_SHAPES]
           + ([Sample((make(rng, (2, 3), np.int64),), grad_args=(), name="int"),
               Sample((make(rng, (2, 3), np.bool_),), grad_args=(), name="bool")]
              if once(dt) else []),
           skip_value_outputs=(3,), covers=("full", "empty")),
    OpInfo("factory_like_dtype", lambda L, x, d: (L.zeros_like(x, dtype=_dt(L, d)),
                                                  L.full_like(x, 7, dtype=_dt(L, d))),
           lambda rng, dt: [Sample((make(rng, (2, 3), dt), d), grad_args=()) for d in DTYPES]
           if once(dt) else [], covers=("full",)),
    OpInfo("new_factories", lambda L, x: (x.new_zeros(2, 3), x.new_ones((4,)),
                                          x.new_full((2,), 3), x.new_empty(0, 2),
                                          x.new_zeros(2, dtype=L.int64)),
           lambda rng, dt: [Sample((make(rng, (3,), dt),), grad_args=()),
                            Sample((make(rng, (3,), np.int32),), grad_args=(), name="int")],
           skip_value_outputs=(3,), covers=("full", "empty")),
    OpInfo("arange", lambda L, like, *a, **k: L.arange(*a, **_kw(L, like, **k)),
           factory(((5,), {}), ((2, 8), {}), ((0, 1, 0.1), {}), ((10, 0, -3), {}),
                   ((1, 1), {}), ((0, 2.5, 0.5), {}), ((-1.5, 2.3, 0.7), {}),
                   ((5,), {"dtype": "float64"}), ((0, 10, 3), {"dtype": "int32"}),
                   ((0.5, 4), {"dtype": "int64"}), ((0, 1, 0.3), {"dtype": "float64"}),
                   ((0,), {}), ((3, 0, -0.5), {}), ((0, 5, 0), {}), ((0, 5, -1), {}),
                   ((0, float("inf")), {}), ((1e4,), {"dtype": "float16"}),
                   ((0, 3, 0.5), {"dtype": "bfloat16"}), ((-3, 3), {"dtype": "int8"})),
           covers=("arange",)),
    OpInfo("linspace", lambda L, like, *a, **k: L.linspace(*a, **_kw(L, like, **k)),
           factory(((0, 1, 5), {}), ((-2, 3, 1), {}), ((0, 1, 0), {}), ((3, -3, 7), {}),
                   ((0, 10, 5), {"dtype": "int64"}), ((-1, 10, 7), {"dtype": "int64"}),
                   ((0, 1, 5), {"dtype": "int64"}), ((0, 1, 11), {"dtype": "float64"}),
                   ((1.5, 2.5, 4), {"dtype": "float16"}), ((0, 1, -1), {}),
                   ((0, 100, 1000), {}), ((-5, 5, 10), {"dtype": "int32"})),
           covers=("linspace",)),
    OpInfo("logspace", lambda L, like, *a, **k: L.logspace(*a, **_kw(L, like, **k)),
           factory(((0, 2, 5), {}), ((-1, 1, 4), {"base": 2.0}), ((0, 1, 0), {}),
                   ((0, 3, 4), {"dtype": "float64"}), ((0, 3, 4), {"dtype": "int64"})),
           covers=("linspace", "pow", "cast")),
    OpInfo("eye", lambda L, like, *a, **k: L.eye(*a, **_kw(L, like, **k)),
           factory(((3,), {}), ((2, 4), {}), ((4, 2), {}), ((0,), {}), ((1, 0), {}),
                   ((3,), {"dtype": "int64"}), ((2,), {"dtype": "bool"}),
                   ((2, 3), {"dtype": "float64"}), ((-1,), {})),
           covers=("eye",)),
)


# ---- casts -------------------------------------------------------------------------------

def cast_gen(rng, dt):
    """Every source kind to every target dtype; values chosen so that each conversion is
    defined (no negative floats into uint8, no NaN or out-of-range floats into integers)."""
    for target in DTYPES:
        if target in ("float16", "bfloat16", "float32") and not once(dt):
            continue  # finite differences in float64 cannot see through a narrower float
        yield Sample((make(rng, (3, 4), dt, 0, 100), target), name=f"to-{target}")
        yield Sample((make(rng, (), dt, -100, 100) if target != "uint8" else
                      make(rng, (), dt, 0, 100), target), name=f"0-d-to-{target}")
        if once(dt):
            for src in (np.int64, np.int8, np.uint8, np.bool_, np.float16, np.int32):
                yield Sample((make(rng, (2, 3), src, -100, 100), target),
                             name=f"{np.dtype(src).name}-to-{target}")
    if once(dt):
        yield Sample((np.array([-1.5, -0.5, 0.5, 1.5, 2.9, -2.9], dt), "int64"), name="trunc")
        yield Sample((np.array([0.0, -0.0, np.nan, np.inf, 0.1], dt), "bool"), name="to-bool")
        yield Sample((np.array([1e300, -1e300, 1e-300], np.float64), "float32"),
                     name="overflow")
        yield Sample((np.array([70000.0, 1e-8, 65519.0], np.float32), "float16"),
                     name="float16-overflow")
        yield Sample((make(rng, (0, 3), dt), "int32"), name="zero-size")
        yield Sample((make(rng, (2, 3), np.float64), "float32"), name="float64-to-float32")


register(
    OpInfo("cast", lambda L, x, d: x.to(_dt(L, d)), cast_gen),
    OpInfo("cast_kw", lambda L, x, d: x.to(dtype=_dt(L, d)),
           lambda rng, dt: (s for s in cast_gen(rng, dt) if s.name.startswith("to-")),
           covers=("cast",)),
    OpInfo("cast_methods", lambda L, x: (x.double(), x.float(), x.half(), x.long(), x.int(),
                                         x.short(), x.char(), x.byte(), x.bool(),
                                         x.bfloat16(), x.type(L.float64), x.type_as(x.double())),
           lambda rng, dt: [Sample((make(rng, s, dt, 0, 50),)) for s in UNARY_SHAPES],
           covers=("cast",), gradcheck=False),  # half outputs: no finite differences
    OpInfo("cast_roundtrip", lambda L, x: x.to(L.bfloat16).to(L.float32) * x.half(),
           lambda rng, dt: [Sample((make(rng, s, dt),)) for s in UNARY_SHAPES],
           covers=("cast", "mul"), grad_atol=1e-2, grad_rtol=1e-2, atol=1e-2, rtol=1e-2,
           gradcheck=False),
)


# ---- device moves, clone, copy, fill --------------------------------------------------------

register(
    # torch has a meta device too; meta tensors have no values: shapes and dtypes only
    OpInfo("to_device", lambda L, x: x.to("meta"),
           lambda rng, dt: [Sample((make(rng, s, dt),), grad_args=()) for s in UNARY_SHAPES],
           random=True, differentiable=False),
    OpInfo("to_device_same", lambda L, x: x.to("cpu") * 2,
           lambda rng, dt: [Sample((make(rng, s, dt),)) for s in UNARY_SHAPES],
           covers=("to_device", "mul"), meta=False),
    OpInfo("to_device_from_meta", lambda L, x: x.to("meta").to("cpu"),
           lambda rng, dt: [Sample((make(rng, (2,), dt),), grad_args=())],
           differentiable=False, covers=("to_device",)),
    OpInfo("clone", lambda L, x: x.clone(), lambda rng, dt: (
        [Sample((make(rng, s, dt),)) for s in UNARY_SHAPES]
        + ([Sample((make(rng, (3,), t),), name=np.dtype(t).name)
            for t in (np.int64, np.bool_, np.float16, np.uint8)] if once(dt) else []))),
    OpInfo("clone_fn", lambda L, x: L.clone(x) * 2,
           lambda rng, dt: [Sample((make(rng, s, dt),)) for s in UNARY_SHAPES],
           covers=("clone", "mul")),
    OpInfo("contiguous", lambda L, x: x.t().contiguous(),
           lambda rng, dt: [Sample((make(rng, s, dt),)) for s in ((3, 4), (1, 5), (0, 2))],
           covers=("clone",)),
)


def copy_gen(rng, dt):
    """(destination, source): same shape, broadcasting, dtype conversion, bad shapes."""
    for sd, ss in (((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 4), ()), ((3, 4), (3, 1)),
                   ((), ()), ((0, 3), (3,))):
        yield Sample((make(rng, sd, dt), make(rng, ss, dt)))
    yield Sample((make(rng, (3,), dt), make(rng, (2, 3), dt)), name="src-has-more-dims")
    yield Sample((make(rng, (3,), dt), make(rng, (4,), dt)), name="src-does-not-broadcast")
    if once(dt):
        yield Sample((make(rng, (3,), dt), make(rng, (3,), np.float64)), name="float64-src")
        yield Sample((make(rng, (3,), np.float64), make(rng, (3,), dt)), name="float32-src")
        yield Sample((make(rng, (3,), dt), make(rng, (3,), np.int64)), name="int-src")
        yield Sample((make(rng, (3,), np.int64), make(rng, (3,), dt, -5, 5)), name="float-to-int")
        yield Sample((make(rng, (3,), np.bool_), make(rng, (3,), np.int64)), name="int-to-bool")
        yield Sample((make(rng, (3,), np.float16), make(rng, (3,), dt)), name="to-float16")


def fill_gen(rng, dt):
    for s in UNARY_SHAPES:
        yield Sample((make(rng, s, dt), 2.5))
    yield Sample((make(rng, (3, 4), dt), make(rng, (), dt)), name="0-d-tensor-value")
    yield Sample((make(rng, (3, 4), dt), make(rng, (2,), dt)), name="1-d-tensor-value")
    if once(dt):
        yield Sample((make(rng, (3, 4), dt), make(rng, (), np.float64)), name="float64-value")
        yield Sample((make(rng, (3,), np.int64), 2.7), name="int-float-value")
        yield Sample((make(rng, (3,), np.int8), 300), name="int8-overflow")
        yield Sample((make(rng, (3,), np.bool_), 2), name="bool")
        yield Sample((make(rng, (3,), np.float16), 1e5), name="float16-overflow")


register(
    OpInfo("copy", lambda L, dst, src: dst.clone().copy_(src), copy_gen, covers=("copy",
                                                                                  "clone")),
    OpInfo("copy_into_new", lambda L, dst, src: L.zeros_like(dst).copy_(src), copy_gen,
           covers=("copy", "full")),
    OpInfo("fill", lambda L, x, v: x.clone().fill_(v), fill_gen, covers=("fill", "clone")),
    OpInfo("zero_", lambda L, x, v: (x.clone().zero_(), x.clone().fill_(0)),
           lambda rng, dt: (s for s in fill_gen(rng, dt) if "tensor" not in s.name),
           covers=("fill", "clone")),
)
