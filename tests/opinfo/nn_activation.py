"""Op-info entries: ``tessera.nn.functional`` activations and the softmax family.

Float samples run in the float32 and float64 passes over every shape of ``UNARY_SHAPES``
(0-d, size-1, zero-size ...) and each argument variant; extreme values (|x| up to 1e4)
check numerical stability. Integer/bool inputs and in-place variants run once, in the
float32 pass. ``*_f16`` entries compare float16 results (computed in float32 and rounded
once, like PyTorch) with a float16 tolerance.
"""
import numpy as np

from tests.opinfo.core import UNARY_SHAPES, OpInfo, Sample, make, register

F32 = np.dtype(np.float32)
EXTREME = [-1e4, -100.0, -30.0, -20.5, -3.5, -1e-3, 2e-3, 0.7, 3.5, 19.5, 30.0, 100.0, 1e4]


def once(dt) -> bool:
    return np.dtype(dt) == F32


def fn(name, **fixed):
    """``F.<name>(x, *args, **kwargs)`` in either library."""
    def call(L, *args, **kwargs):
        return getattr(L.nn.functional, name)(*args, **fixed, **kwargs)
    return call


def inplace(name):
    """``F.<name>(x.clone(), ..., inplace=True)``: the in-place path, autograd included."""
    def call(L, x, **kwargs):
        return getattr(L.nn.functional, name)(x.clone(), inplace=True, **kwargs)
    return call


def act_gen(variants=({},), low=-3.0, high=3.0, ints=(np.int64,), extreme=True):
    """Every shape x every kwargs variant; extremes; (float32 pass) ints and bool."""
    def gen(rng, dt):
        for kw in variants:
            for s in UNARY_SHAPES:
                yield Sample((np.asarray(make(rng, s, dt, low, high)),), dict(kw))
        if extreme:
            yield Sample((np.array(EXTREME, dt),), dict(variants[0]))
        if once(dt):
            for it in ints + (np.bool_,):
                yield Sample((np.asarray(make(rng, (3, 4), it, -4, 5)),), dict(variants[0]))
    return gen


def f16_gen(variants=({},), low=-3.0, high=3.0):
    def gen(rng, dt):
        if once(dt):
            for kw in variants:
                yield Sample((make(rng, (4, 5), np.float16, low, high),), dict(kw))
    return gen


def act(name, variants=({},), covers=None, f16=True, **kw):
    """The entry of ``F.name`` (+ its float16 companion)."""
    low, high = kw.pop("low", -3.0), kw.pop("high", 3.0)
    ints = kw.pop("ints", (np.int64,))
    extreme = kw.pop("extreme", True)
    register(OpInfo(name, fn(name), act_gen(variants, low, high, ints, extreme),
                    covers=covers or (), **kw))
    if f16:
        register(OpInfo(f"{name}_f16", fn(name), f16_gen(variants, low, high),
                        covers=covers or (), atol=2e-3, rtol=2e-3, grad_atol=5e-2,
                        grad_rtol=2e-2, gradcheck=False, **kw))


act("relu", covers=("relu",), ints=(np.int64, np.uint8))
act("relu6", covers=("hardtanh",), ints=(np.int64, np.uint8))
act("hardtanh", ({}, {"min_val": -0.5, "max_val": 2.0}, {"min_val": -2, "max_val": -1}),
    covers=("hardtanh",), ints=(np.int64, np.uint8))
act("leaky_relu", ({}, {"negative_slope": 0.2}, {"negative_slope": -1.5}),
    covers=("leaky_relu",))
act("elu", ({}, {"alpha": 0.5}, {"alpha": -1.0}), covers=("elu",))
act("selu", covers=("elu",))
act("celu", ({}, {"alpha": 0.5}, {"alpha": 2.0}), covers=("elu",))
act("gelu", ({}, {"approximate": "tanh"}), covers=("gelu", "gelu_backward"))


def gelu_blocks(rng, dt):
    """float32 exact gelu runs in blocks of 32768 elements: sizes across block edges."""
    for shape in ((32768,), (3, 32769), (300, 257)):
        yield Sample((make(rng, shape, dt, -6.0, 6.0),), {})


register(OpInfo("gelu_blocks", fn("gelu"), gelu_blocks, covers=("gelu", "gelu_backward")))
act("silu", covers=("silu", "silu_backward"))
act("mish", covers=("mish",))
act("softplus", ({}, {"beta": 2.0}, {"beta": 0.5, "threshold": 1.0}, {"beta": -1.0}),
    covers=("softplus",))
act("softsign", covers=("abs", "div"))
act("softshrink", ({}, {"lambd": 1.2}, {"lambd": 0.0}), covers=("softshrink",))
act("hardshrink", ({}, {"lambd": 1.2}, {"lambd": -0.5}), covers=("hardshrink",))
act("tanhshrink", covers=("tanh", "sub"))
act("hardsigmoid", covers=("hardsigmoid",), low=-5.0, high=5.0)
act("hardswish", covers=("hardswish",), low=-5.0, high=5.0)
act("logsigmoid", covers=("log_sigmoid",))
act("sigmoid", covers=("sigmoid",))
act("tanh", covers=("tanh",))


def _threshold_gen(rng, dt):
    for th, val in ((0.5, -2.0), (-1.0, 7.0), (1.5, 5.5)):
        for s in UNARY_SHAPES:
            yield Sample((np.asarray(make(rng, s, dt, -3, 3)), th, val))
    if once(dt):
        yield Sample((np.asarray(make(rng, (3, 4), np.int64, -4, 5)), 1.5, 5.5))
        yield Sample((np.asarray(make(rng, (3, 4), np.bool_)), 0, 1))


register(OpInfo("threshold", fn("threshold"), _threshold_gen, covers=("threshold",)))


def _inplace_gen(variants=({},)):
    def gen(rng, dt):
        if once(dt):
            for kw in variants:
                for s in ((3, 4), (), (0, 2)):
                    yield Sample((np.asarray(make(rng, s, np.float32, -3, 3)),), dict(kw))
    return gen


for _name, _variants, _covers in (
        ("relu", ({},), "relu"), ("relu6", ({},), "hardtanh"),
        ("hardtanh", ({"min_val": -0.5, "max_val": 0.5},), "hardtanh"),
        ("leaky_relu", ({"negative_slope": 0.3},), "leaky_relu"),
        ("elu", ({"alpha": 0.7},), "elu"), ("selu", ({},), "elu"), ("celu", ({},), "elu"),
        ("silu", ({},), "silu"), ("mish", ({},), "mish"), ("hardsigmoid", ({},), "hardsigmoid"),
        ("hardswish", ({},), "hardswish"), ("rrelu", ({},), "leaky_relu")):
    register(OpInfo(f"{_name}_inplace", inplace(_name), _inplace_gen(_variants),
                    covers=(_covers,), gradcheck=False))


def _threshold_inplace(L, x, th, val):
    return L.nn.functional.threshold(x.clone(), th, val, inplace=True)


register(OpInfo("threshold_inplace", _threshold_inplace,
                lambda rng, dt: iter([Sample((make(rng, (3, 4), dt, -2, 2), 0.1, 9.0))]),
                covers=("threshold",), gradcheck=False))


# ---- prelu, rrelu, glu ------------------------------------------------------------------------

def _prelu_gen(rng, dt):
    for xs, ws in (((3, 4), (4,)), ((3, 4), (1,)), ((2, 3, 4, 5), (3,)), ((2, 3, 4), ()),
                   ((5,), (1,)), ((), (1,)), ((0, 3), (3,)), ((2, 0, 3), (1,)),
                   ((3, 4), (3,)), ((3, 4), (2, 2)), ((5,), (5,))):
        yield Sample((np.asarray(make(rng, xs, dt, -3, 3)), np.asarray(make(rng, ws, dt))))
    if once(dt):
        yield Sample((make(rng, (3, 4), np.float32), make(rng, (4,), np.float64)))
        yield Sample((make(rng, (3, 4), np.int64, -3, 3), make(rng, (4,), np.int64, -3, 3)))


register(OpInfo("prelu", fn("prelu"), _prelu_gen, covers=("prelu",)))
register(OpInfo("rrelu", fn("rrelu"), act_gen(({}, {"lower": 0.2, "upper": 0.6},
                                               {"lower": 0.5, "upper": 0.1}), extreme=False,
                                              ints=()),
                covers=("leaky_relu",)))
register(OpInfo("rrelu_training", fn("rrelu", training=True),
                act_gen(({}, {"lower": 0.3, "upper": 0.4}), extreme=False, ints=()),
                covers=("uniform_",), random=True))


def _glu_gen(rng, dt):
    for shape, dim in (((4, 6), -1), ((4, 6), 0), ((2, 4, 3), 1), ((2,), 0), ((0, 4), 1),
                       ((3, 5), 1), ((3, 4), 2), ((), 0)):
        yield Sample((np.asarray(make(rng, shape, dt)),), {"dim": dim})
    if once(dt):
        yield Sample((make(rng, (4, 6), np.int64, -3, 3),), {"dim": 1})


register(OpInfo("glu", fn("glu"), _glu_gen, covers=("sigmoid", "mul", "slice")))


# ---- softmax family ---------------------------------------------------------------------------

SOFTMAX_SHAPES = [((3, 4), 1), ((3, 4), 0), ((3, 4), -1), ((2, 3, 4), 1), ((2, 3, 4), -3),
                  ((), 0), ((), -1), ((5,), 0), ((1,), -1), ((0, 3), 1), ((2, 0), 1),
                  ((3, 4), 2), ((2, 3, 4, 5), 2)]


def _softmax_gen(with_inf: bool):
    def gen(rng, dt):
        for shape, dim in SOFTMAX_SHAPES:
            yield Sample((np.asarray(make(rng, shape, dt, -4, 4)),), {"dim": dim})
        x = np.array([[1e4, -1e4, 0.0, 3.0], [-1e4, -1e4 + 1, -1e4 + 2, -1e4],
                      [88.0, 89.0, 90.0, -88.0]], dt)
        yield Sample((x,), {"dim": 1})
        yield Sample((x,), {"dim": 0})
        if with_inf:
            yield Sample((np.array([[0.5, -np.inf, 1.0], [-np.inf, 2.0, -np.inf]], dt),),
                         {"dim": 1})
        if once(dt):
            yield Sample((make(rng, (3, 4), np.int64, -3, 3),), {"dim": 1})
            yield Sample((make(rng, (3, 4), np.float32),), {"dim": None})
            yield Sample((make(rng, (2, 3, 4), np.float32),), {"dim": None})
    return gen


def _with_dtype(name):
    def call(L, x, dim):
        return getattr(L.nn.functional, name)(x, dim, dtype=L.float64)
    return call


for _name, _ops, _inf in (("softmax", ("softmax", "softmax_backward"), True),
                          ("log_softmax", ("log_softmax", "log_softmax_backward"), False),
                          ("softmin", ("softmax", "softmax_backward", "neg"), True)):
    register(OpInfo(_name, fn(_name), _softmax_gen(_inf), covers=_ops))
    register(OpInfo(f"{_name}_dtype", _with_dtype(_name),
                    lambda rng, dt: iter([Sample((make(rng, (3, 4), dt),), {"dim": 1}),
                                          Sample((make(rng, (3, 4), np.int64, -3, 3),),
                                                 {"dim": 0})]),
                    covers=(_ops[0], "cast")))
    register(OpInfo(f"{_name}_f16", fn(_name),
                    lambda rng, dt: iter([Sample((make(rng, (4, 5), np.float16, -4, 4),),
                                                 {"dim": 1})] if once(dt) else []),
                    covers=_ops[:1], atol=2e-3, rtol=2e-3, grad_atol=2e-2, grad_rtol=2e-2,
                    gradcheck=False))


def _top_level(name):
    def call(L, x, dim):
        return getattr(L, name)(x, dim)
    return call


def _method(name):
    def call(L, x, dim):
        return getattr(x, name)(dim)
    return call


for _name in ("softmax", "log_softmax"):
    register(OpInfo(f"torch.{_name}", _top_level(_name),
                    lambda rng, dt: iter([Sample((make(rng, (3, 4), dt),), {"dim": 1}),
                                          Sample((make(rng, (2, 3), dt),), {"dim": -2})]),
                    covers=(_name,)))
    register(OpInfo(f"Tensor.{_name}", _method(_name),
                    lambda rng, dt: iter([Sample((make(rng, (3, 4), dt),), {"dim": 0})]),
                    covers=(_name,)))


def _gumbel(L, x, **kw):
    return L.nn.functional.gumbel_softmax(x, **kw)


register(OpInfo("gumbel_softmax", _gumbel,
                lambda rng, dt: iter([Sample((make(rng, (3, 4), dt),), {}),
                                      Sample((make(rng, (3, 4), dt),), {"tau": 0.5, "dim": 0}),
                                      Sample((make(rng, (3, 4), dt),), {"hard": True})]),
                covers=("exponential_", "scatter"), random=True))
