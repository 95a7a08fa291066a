"""Op-info entries: ``tessera.nn.functional`` losses and distances.

Each loss sweeps reduction none/mean/sum and its options (class weights, ignore_index,
label smoothing with weights, class-probability targets, K-dim (N, C, d1, ...) inputs,
zero-size batches, extreme logits); error samples (bad shapes, dtypes, values) must raise
what PyTorch raises. Class-index targets and class weights of nll_loss/cross_entropy get no
gradient (``grad_args``), as in PyTorch. Entries whose checks read tensor values run with
``meta=False``.
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register

F32 = np.dtype(np.float32)
REDUCTIONS = ("none", "mean", "sum")


def once(dt) -> bool:
    return np.dtype(dt) == F32


def fn(name, **fixed):
    def call(L, *args, **kwargs):
        return getattr(L.nn.functional, name)(*args, **fixed, **kwargs)
    return call


def ints(rng, shape, high, low=0):
    return np.asarray(rng.integers(low, high, size=shape).astype(np.int64))


def probs(rng, shape, dt, axis=1):
    e = np.exp(rng.uniform(-2, 2, size=shape))
    return np.asarray((e / e.sum(axis=axis, keepdims=True)).astype(dt))


def signs(rng, shape, dt):
    return np.asarray(np.where(rng.random(shape) < 0.5, -1.0, 1.0).astype(dt))


def grads_for(gen, args):
    """``gen`` with only the inputs ``args`` differentiable (PyTorch rejects requires_grad
    on the others, e.g. bce_with_logits' weights or soft_margin_loss' target)."""
    def wrapped(rng, dt):
        for s in gen(rng, dt):
            s.grad_args = args
            yield s
    return wrapped


# ---- nll_loss and cross_entropy ----------------------------------------------------------------

C = 5
LOGITS = 0  # grad_args: only the input gets a gradient


def _class_index_samples(rng, dt, logp: bool):
    def x(shape):
        a = make(rng, shape, dt, -3, 3)
        if logp and a.size:
            a = a - np.log(np.exp(a).sum(axis=1 if a.ndim > 1 else 0, keepdims=True))
        return np.asarray(a.astype(dt))
    w = make(rng, (C,), dt, 0.2, 2.0)
    for red in REDUCTIONS:
        t = ints(rng, (4,), C)
        yield Sample((x((4, C)), t), {"reduction": red}, grad_args=(LOGITS,))
        yield Sample((x((4, C)), t, w), {"reduction": red}, grad_args=(LOGITS,))
        ti = t.copy()
        ti[[0, 2]] = -100
        yield Sample((x((4, C)), ti, w), {"reduction": red}, grad_args=(LOGITS,))
        yield Sample((x((4, C)), t), {"reduction": red, "ignore_index": int(t[1])},
                     grad_args=(LOGITS,))
        # K-dim inputs: (N, C, d1), (N, C, d1, d2), (N, C, d1, d2, d3)
        for sp in ((3,), (3, 2), (2, 2, 2)):
            tk = ints(rng, (2,) + sp, C)
            tk.reshape(-1)[0] = 3 if red == "none" else -100
            yield Sample((x((2, C) + sp), tk, w), {"reduction": red}, grad_args=(LOGITS,))
        yield Sample((x((C,)), np.asarray(np.int64(2))), {"reduction": red}, grad_args=(LOGITS,))
        # (PyTorch's backward rejects a (1,) target of a 1-D input: forward only)
        yield Sample((x((C,)), np.array([4])), {"reduction": red}, grad_args=())
        yield Sample((x((0, C)), np.zeros((0,), np.int64)), {"reduction": red},
                     grad_args=(LOGITS,))
        yield Sample((x((2, C, 0)), np.zeros((2, 0), np.int64)), {"reduction": red},
                     grad_args=(LOGITS,))
    # everything ignored: 'mean' divides 0 by 0 (NaN; > 60 elements: no finite differences)
    yield Sample((x((13, C)), np.full((13,), 1, np.int64)), {"ignore_index": 1},
                 grad_args=(LOGITS,))
    yield Sample((x((3, C)), np.array([1, 2, 3], np.uint8)), {}, grad_args=(LOGITS,))
    yield Sample((x((3, C)), np.array([1, 2, 6])), {"ignore_index": 6, "reduction": "sum"},
                 grad_args=(LOGITS,))
    yield Sample((x((3, C)), np.array([1, 2, -7])), {"ignore_index": -7}, grad_args=(LOGITS,))
    yield Sample((x((3, C)), t[:3]), {"size_average": False}, grad_args=(LOGITS,))
    yield Sample((x((3, C)), t[:3]), {"reduce": False}, grad_args=(LOGITS,))


def _class_index_errors(rng, dt):
    if not once(dt):
        return
    x = make(rng, (3, C), dt)
    t = ints(rng, (3,), C)
    for args, kw in (((x, ints(rng, (4,), C)), {}),            # batch mismatch
                     ((x, t.astype(np.int32)), {}),             # target dtype
                     ((x, t.astype(np.float32)), {}),
                     ((x, np.array([1, 0, C])), {}),            # out of bounds
                     ((x, np.array([1, -1, 0])), {}),
                     ((x, t, make(rng, (C - 1,), dt)), {}),     # weight size
                     ((x, t, make(rng, (C, 1), dt)), {}),
                     ((x, t, make(rng, (C,), np.float64)), {}),  # weight dtype
                     ((x, t), {"reduction": "bogus"}),
                     ((make(rng, (3, C), np.int64, 0, 3), t), {}),
                     ((make(rng, (C,), dt), np.array([1, 2])), {}),
                     ((x, t.reshape(3, 1)), {}),
                     ((make(rng, (2, C, 3), dt), ints(rng, (2,), C)), {}),
                     ((make(rng, (2, C, 3, 4), dt), ints(rng, (2, 3), C)), {}),
                     ((make(rng, (2, C, 3, 4), dt), ints(rng, (2, 4, 3), C)), {}),
                     ((make(rng, (2, C, 3), dt), ints(rng, (2, 3), C), make(rng, (4,), dt)),
                      {}),
                     ((np.asarray(np.float32(1.0)).astype(dt), np.asarray(np.int64(0))), {}),
                     ((x, np.asarray(np.int64(1))), {})):
        yield Sample(args, kw, grad_args=(LOGITS,))


def _nll_gen(rng, dt):
    yield from _class_index_samples(rng, dt, logp=True)
    yield from _class_index_errors(rng, dt)


register(OpInfo("nll_loss", fn("nll_loss"), _nll_gen, covers=("nll_loss", "nll_loss_backward")))


def _ce_gen(rng, dt):
    yield from _class_index_samples(rng, dt, logp=False)
    yield from _class_index_errors(rng, dt)
    w = make(rng, (C,), dt, 0.2, 2.0)
    for red in REDUCTIONS:
        t = ints(rng, (4,), C)
        t[1] = -100
        for ls in (0.1, 1.0):
            yield Sample((make(rng, (4, C), dt), t), {"reduction": red, "label_smoothing": ls},
                         grad_args=(LOGITS,))
            yield Sample((make(rng, (4, C), dt), t, w),
                         {"reduction": red, "label_smoothing": ls}, grad_args=(LOGITS,))
        tk = ints(rng, (2, 3, 2), C)
        tk[0, 1, 1] = 2
        yield Sample((make(rng, (2, C, 3, 2), dt), tk, w),
                     {"reduction": red, "label_smoothing": 0.25, "ignore_index": 2},
                     grad_args=(LOGITS,))
        yield Sample((make(rng, (C,), dt), np.asarray(np.int64(3))),
                     {"reduction": red, "label_smoothing": 0.2}, grad_args=(LOGITS,))
        # class probabilities (target and weight differentiable, as in PyTorch)
        yield Sample((make(rng, (4, C), dt), probs(rng, (4, C), dt)), {"reduction": red})
        yield Sample((make(rng, (4, C), dt), probs(rng, (4, C), dt), w), {"reduction": red})
        yield Sample((make(rng, (2, C, 3), dt), probs(rng, (2, C, 3), dt), w),
                     {"reduction": red, "label_smoothing": 0.3})
        yield Sample((make(rng, (C,), dt), probs(rng, (C,), dt, axis=0)), {"reduction": red})
        yield Sample((make(rng, (0, C), dt), np.zeros((0, C), dt)), {"reduction": red})
    # extreme logits: log_softmax must stay finite
    big = np.array([[1e4, -1e4, 0.0, 50.0, -50.0], [-1e4, -1e4, -1e4, -1e4, 1e4],
                    [88.0, 89.0, 90.0, -88.0, 0.0]], dt)
    for red in REDUCTIONS:
        yield Sample((big, np.array([1, 4, 3])), {"reduction": red}, grad_args=(LOGITS,))
        yield Sample((big, np.array([0, 0, 0])), {"reduction": red, "label_smoothing": 0.1},
                     grad_args=(LOGITS,))
        yield Sample((big, probs(rng, (3, C), dt)), {"reduction": red}, grad_args=(LOGITS,))
    if once(dt):
        yield Sample((make(rng, (3, C), dt), ints(rng, (3,), C)), {"label_smoothing": 1.5},
                     grad_args=(LOGITS,))
        yield Sample((make(rng, (3, C), dt), ints(rng, (3,), C)), {"label_smoothing": -0.1},
                     grad_args=(LOGITS,))
        yield Sample((make(rng, (3, C), dt), probs(rng, (3, C), dt)), {"ignore_index": 1})
        yield Sample((make(rng, (3, C), dt), ints(rng, (3, C), C)), {})
        yield Sample((make(rng, (3, C), dt), probs(rng, (3, C), dt), make(rng, (4,), dt)), {})
        yield Sample((make(rng, (3, C), dt), probs(rng, (3, 4), dt, 1)), {})
        yield Sample((make(rng, (3, C), dt), probs(rng, (3, C), np.float64)), {})


register(OpInfo("cross_entropy", fn("cross_entropy"), _ce_gen,
                covers=("nll_loss", "log_softmax", "log_softmax_backward")))


def _f16_ce(rng, dt):
    if once(dt):
        yield Sample((make(rng, (4, C), np.float16), ints(rng, (4,), C)), {},
                     grad_args=(LOGITS,))
        yield Sample((make(rng, (4, C), np.float16), ints(rng, (4,), C)), {"reduction": "none"},
                     grad_args=(LOGITS,))


register(OpInfo("cross_entropy_f16", fn("cross_entropy"), _f16_ce, covers=("nll_loss",),
                atol=2e-3, rtol=2e-3, grad_atol=1e-2, grad_rtol=1e-2, gradcheck=False))


# ---- binary cross entropy ---------------------------------------------------------------------

def _bce_gen(rng, dt):
    for red in REDUCTIONS:
        for shape in ((3, 4), (5,), (), (0, 3)):
            x, t = make(rng, shape, dt, 0.02, 0.98), make(rng, shape, dt, 0, 1)
            yield Sample((np.asarray(x), np.asarray(t)), {"reduction": red}, grad_args=(0, 1))
        x, t = make(rng, (3, 4), dt, 0.02, 0.98), make(rng, (3, 4), dt, 0, 1)
        yield Sample((x, t, make(rng, (4,), dt, 0.1, 2)), {"reduction": red}, grad_args=(0, 1))
        yield Sample((x, t, make(rng, (3, 4), dt, 0.1, 2)), {"reduction": red},
                     grad_args=(0, 1))
    if once(dt):
        x = make(rng, (3, 4), dt, 0.02, 0.98)
        for args in ((x * 3, x), (x, x[0]), (x, x.astype(np.float64)),
                     (x, x, make(rng, (5,), dt)), (x, x, make(rng, (2, 3, 4), dt)),
                     (make(rng, (3,), np.int64, 0, 2), make(rng, (3,), np.int64, 0, 2)),
                     (np.array([0.5, np.nan], dt), np.array([1.0, 0.0], dt))):
            yield Sample(args, {}, grad_args=(0, 1))
        yield Sample((x, x, make(rng, (4,), np.float64, 0.1, 2)), {}, grad_args=(0, 1))


register(OpInfo("binary_cross_entropy", fn("binary_cross_entropy"), _bce_gen,
                covers=("binary_cross_entropy",)))


def _bce_extreme_gen(rng, dt):
    x = np.array([0.0, 1.0, 1e-30, 1 - 1e-7, 0.5, 0.0, 1.0], dt)
    t = np.array([1.0, 0.0, 1.0, 0.0, 0.5, 0.0, 1.0], dt)
    for red in REDUCTIONS:
        yield Sample((x, t), {"reduction": red}, grad_args=(0,))


register(OpInfo("binary_cross_entropy_extreme", fn("binary_cross_entropy"), _bce_extreme_gen,
                covers=("binary_cross_entropy",), gradcheck=False))


def _bce_logits_gen(rng, dt):
    for red in REDUCTIONS:
        for shape in ((3, 4), (5,), (), (0, 4)):
            yield Sample((np.asarray(make(rng, shape, dt, -3, 3)),
                          np.asarray(make(rng, shape, dt, 0, 1))), {"reduction": red})
        x, t = make(rng, (3, 4), dt, -3, 3), make(rng, (3, 4), dt, 0, 1)
        yield Sample((x, t, make(rng, (4,), dt, 0.1, 2)), {"reduction": red})
        yield Sample((x, t), {"reduction": red, "pos_weight": make(rng, (4,), dt, 0.1, 3)})
        yield Sample((x, t, make(rng, (3, 1), dt, 0.1, 2)),
                     {"reduction": red, "pos_weight": make(rng, (4,), dt, 0.1, 3)})
        big = np.array([-1e4, -100.0, -30.0, 30.0, 100.0, 1e4], dt)
        yield Sample((big, np.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], dt)), {"reduction": red})
    if once(dt):
        x = make(rng, (3, 4), dt)
        yield Sample((x, x[0]), {})
        yield Sample((x, x), {"pos_weight": make(rng, (3,), dt)})
        yield Sample((x, x.astype(np.float64)), {})
        yield Sample((make(rng, (3,), np.int64, 0, 2), make(rng, (3,), np.int64, 0, 2)), {})


register(OpInfo("binary_cross_entropy_with_logits", fn("binary_cross_entropy_with_logits"),
                grads_for(_bce_logits_gen, (0, 1)), covers=("log_sigmoid",)))


# ---- regression losses ------------------------------------------------------------------------

def _regression_gen(extra=({},), weight=True, low=-2.0, high=2.0, mixed_grad=True):
    """``mixed_grad=False``: mixed-dtype samples are forward only (PyTorch's huber backward
    rejects a target of another dtype)."""
    mixed = None if mixed_grad else ()

    def gen(rng, dt):
        for kw in extra:
            for red in REDUCTIONS:
                for xs, ts in (((3, 4), (3, 4)), ((5,), (5,)), ((), ()), ((0, 3), (0, 3)),
                               ((3, 4), (4,))):
                    yield Sample((np.asarray(make(rng, xs, dt, low, high)),
                                  np.asarray(make(rng, ts, dt, low, high))),
                                 dict(kw, reduction=red))
                if weight:
                    yield Sample((make(rng, (3, 4), dt), make(rng, (3, 4), dt)),
                                 dict(kw, reduction=red, weight=make(rng, (3, 4), dt, 0.1, 2)))
        if once(dt):
            x = make(rng, (3, 4), dt)
            yield Sample((x, make(rng, (5,), dt)), dict(extra[0]))
            yield Sample((x, make(rng, (3, 4), np.int64, -2, 3)), dict(extra[0]), grad_args=mixed)
            yield Sample((x, make(rng, (3, 4), np.float64)), dict(extra[0]), grad_args=mixed)
            yield Sample((make(rng, (3, 4), np.int64, -2, 3), make(rng, (3, 4), np.int64, -2, 3)),
                         dict(extra[0]))
            yield Sample((make(rng, (3, 4), np.int64, -2, 3), make(rng, (3, 4), np.int64, -2, 3)),
                         dict(extra[0], reduction="sum"))
            yield Sample((x, x), dict(extra[0], reduction="bogus"))
            yield Sample((x, x), dict(extra[0], size_average=False))
            if weight:
                yield Sample((x, x), dict(extra[0], weight=make(rng, (4,), dt)))
                yield Sample((x, x), dict(extra[0], weight=make(rng, (3, 4), dt),
                                          reduction="bogus"))
    return gen


register(OpInfo("mse_loss", fn("mse_loss"), _regression_gen(), covers=("square",)))
register(OpInfo("l1_loss", fn("l1_loss"), _regression_gen(), covers=("abs",)))
register(OpInfo("smooth_l1_loss", fn("smooth_l1_loss"),
                _regression_gen(({}, {"beta": 0.5}, {"beta": 0.0}, {"beta": 3.0}),
                                weight=False),
                covers=("where",)))
register(OpInfo("huber_loss", fn("huber_loss"),
                _regression_gen(({}, {"delta": 0.5}, {"delta": 3.0}), mixed_grad=False),
                covers=("where",)))


def _bad_beta(rng, dt):
    if once(dt):
        x = make(rng, (3,), dt)
        yield Sample((x, x), {"beta": -1.0})


register(OpInfo("smooth_l1_loss_errors", fn("smooth_l1_loss"), _bad_beta, covers=("abs",)))
register(OpInfo("huber_loss_errors", fn("huber_loss"),
                lambda rng, dt: iter([Sample((make(rng, (3,), dt), make(rng, (3,), dt)),
                                             {"delta": d}) for d in (0.0, -1.0)]
                                     if once(dt) else []), covers=("abs",)))


# ---- distributions: kl_div, poisson, gaussian ---------------------------------------------

def _kl_gen(rng, dt):
    for red in REDUCTIONS + ("batchmean",):
        for log_target in (False, True):
            x = np.log(probs(rng, (3, 4), dt))
            t = probs(rng, (3, 4), dt)
            yield Sample((x, np.log(t) if log_target else t),
                         {"reduction": red, "log_target": log_target})
        yield Sample((np.asarray(np.log(dt.type(0.3)), dt), np.asarray(0.6, dt)),
                     {"reduction": red})
        yield Sample((make(rng, (0, 3), dt), make(rng, (0, 3), dt, 0.1, 1)), {"reduction": red})
        t = probs(rng, (2, 5), dt)
        t[0, 1] = 0
        yield Sample((np.log(probs(rng, (2, 5), dt)), t), {"reduction": red}, grad_args=(0,))
    if once(dt):
        yield Sample((make(rng, (3,), np.int64, 0, 3), make(rng, (3,), dt)), {})
        yield Sample((make(rng, (3,), dt), make(rng, (3,), np.float64, 0.1, 1)),
                     {"reduction": "batchmean"})
        yield Sample((make(rng, (3,), dt), make(rng, (3,), dt, 0.1, 1)), {"size_average": False})


register(OpInfo("kl_div", fn("kl_div"), _kl_gen, covers=("where", "log")))


def _poisson_gen(rng, dt):
    for red in REDUCTIONS:
        for log_input in (True, False):
            for full in (False, True):
                x = make(rng, (3, 4), dt, -1, 1) if log_input else make(rng, (3, 4), dt, 0.1, 3)
                t = make(rng, (3, 4), dt, 0.1, 4)
                yield Sample((x, t), {"log_input": log_input, "full": full, "reduction": red})
        yield Sample((make(rng, (0,), dt), make(rng, (0,), dt)), {"reduction": red})
    if once(dt):
        yield Sample((make(rng, (3,), dt), make(rng, (3,), dt, 0.1, 2)), {"reduction": "bogus"})
        yield Sample((make(rng, (3, 4), dt), make(rng, (4,), np.float64, 0.1, 2)), {})


register(OpInfo("poisson_nll_loss", fn("poisson_nll_loss"), _poisson_gen,
                covers=("exp", "masked_fill")))


def _gaussian_gen(rng, dt):
    for red in REDUCTIONS:
        for full in (False, True):
            x, t = make(rng, (3, 4), dt), make(rng, (3, 4), dt)
            yield Sample((x, t, make(rng, (3, 4), dt, 0.1, 2)), {"full": full, "reduction": red})
        yield Sample((x, t, make(rng, (3,), dt, 0.1, 2)), {"reduction": red})
        yield Sample((x, t, make(rng, (3, 1), dt, 0.1, 2)), {"reduction": red})
        yield Sample((x, t, 0.7), {"reduction": red})
        # var below eps: clamped for the value, the gradient passes unchanged (not a true
        # derivative, so > 60 elements: no finite differences)
        v = make(rng, (8, 8), dt, 0.1, 2)
        v[0, :2] = 1e-9
        yield Sample((make(rng, (8, 8), dt), make(rng, (8, 8), dt), v),
                     {"reduction": red, "eps": 1e-3})
    if once(dt):
        x = make(rng, (3, 4), dt)
        for var in (make(rng, (3, 4), dt, -1, 1), make(rng, (4,), dt, 0.1, 1), -1.0,
                    make(rng, (2, 4), dt, 0.1, 1)):
            yield Sample((x, x, var), {})
        yield Sample((x, x, make(rng, (3, 4), dt, 0.1, 1)), {"reduction": "bogus"})


register(OpInfo("gaussian_nll_loss", fn("gaussian_nll_loss"), _gaussian_gen,
                covers=("clamp", "clone"), meta=False))


# ---- margins ---------------------------------------------------------------------------------

def _ranking_gen(rng, dt):
    for red in REDUCTIONS:
        for margin in (0.0, 0.5):
            for s in ((6,), (), (0,), (2, 3)):
                yield Sample((np.asarray(make(rng, s, dt)), np.asarray(make(rng, s, dt)),
                              np.asarray(signs(rng, s, dt))), {"margin": margin, "reduction": red})
    if once(dt):
        yield Sample((make(rng, (3, 4), dt), make(rng, (4,), dt), signs(rng, (4,), dt)), {})
        yield Sample((make(rng, (4,), dt), make(rng, (4,), dt), np.ones(4, np.int64)), {})
        yield Sample((make(rng, (4,), dt), make(rng, (4,), dt), np.ones(1, dt)), {})


register(OpInfo("margin_ranking_loss", fn("margin_ranking_loss"), _ranking_gen,
                covers=("clamp",)))


def _hinge_gen(rng, dt):
    for red in REDUCTIONS:
        for margin in (1.0, 0.3):
            yield Sample((make(rng, (3, 4), dt), signs(rng, (3, 4), dt)),
                         {"margin": margin, "reduction": red})
        yield Sample((make(rng, (3, 4), dt), signs(rng, (4,), dt)), {"reduction": red})
        yield Sample((np.asarray(make(rng, (), dt)), np.asarray(dt.type(-1))), {"reduction": red})
        yield Sample((make(rng, (0, 2), dt), make(rng, (0, 2), dt)), {"reduction": red})
    if once(dt):
        yield Sample((make(rng, (3,), np.int64, -2, 3), signs(rng, (3,), np.int64)), {})
        yield Sample((make(rng, (3,), dt), make(rng, (3,), dt)), {})


register(OpInfo("hinge_embedding_loss", fn("hinge_embedding_loss"), _hinge_gen,
                covers=("where",)))


def _soft_margin_gen(rng, dt):
    for red in REDUCTIONS:
        yield Sample((make(rng, (3, 4), dt), signs(rng, (3, 4), dt)), {"reduction": red})
        yield Sample((make(rng, (3, 4), dt), signs(rng, (4,), dt)), {"reduction": red})
        # exp overflows to inf (NaN gradients, as in PyTorch; > 60 elements: no gradcheck)
        yield Sample((np.resize(np.array([-100.0, 50.0, 1e3, -1e3], dt), 64),
                      np.resize(np.array([1.0, -1.0, 1, 1], dt), 64)), {"reduction": red})
        yield Sample((make(rng, (0,), dt), make(rng, (0,), dt)), {"reduction": red})
    if once(dt):
        yield Sample((make(rng, (3, 4), dt), signs(rng, (3, 4), np.float64)), {})
        yield Sample((make(rng, (4,), dt), signs(rng, (3, 4), dt)), {})


register(OpInfo("soft_margin_loss", fn("soft_margin_loss"), grads_for(_soft_margin_gen, (0,)),
                covers=("log1p", "exp")))


def _ml_soft_gen(rng, dt):
    for red in REDUCTIONS:
        t = (make(rng, (3, 4), dt, 0, 1) > 0.5).astype(dt)
        yield Sample((make(rng, (3, 4), dt), t), {"reduction": red})
        yield Sample((make(rng, (3, 4), dt), t, make(rng, (4,), dt, 0.1, 2)), {"reduction": red})
        yield Sample((make(rng, (4,), dt), t[0]), {"reduction": red})
    if once(dt):
        yield Sample((make(rng, (3, 4), dt), make(rng, (3, 4), np.float64, 0, 1)), {})
        yield Sample((make(rng, (3, 4), dt), make(rng, (3, 4), dt, 0, 1)), {"reduction": "x"})


register(OpInfo("multilabel_soft_margin_loss", fn("multilabel_soft_margin_loss"), _ml_soft_gen,
                covers=("log_sigmoid",)))


def _distinct_rows(rng, shape, dt):
    """Values without ties inside a row, so hinge kinks are not hit."""
    n = int(np.prod(shape))
    return np.asarray((rng.permutation(n).reshape(shape) * 0.173 - n * 0.08).astype(dt))


def _multi_margin_gen(rng, dt):
    for red in REDUCTIONS:
        for p in (1, 2):
            x, t = _distinct_rows(rng, (4, 5), dt), ints(rng, (4,), 5)
            yield Sample((x, t), {"p": p, "reduction": red}, grad_args=(0,))
            yield Sample((x, t), {"p": p, "margin": 0.5, "weight": make(rng, (5,), dt, 0.1, 2),
                                  "reduction": red}, grad_args=(0,))
        yield Sample((_distinct_rows(rng, (5,), dt), np.asarray(np.int64(2))),
                     {"reduction": red}, grad_args=(0,))
        yield Sample((_distinct_rows(rng, (5,), dt), np.array([3])), {"reduction": red},
                     grad_args=(0,))
    # an empty batch: PyTorch's 'mean'/'sum' return uninitialised memory, so 'none' only
    yield Sample((make(rng, (0, 3), dt), np.zeros(0, np.int64)), {"reduction": "none"},
                 grad_args=(0,))
    if once(dt):
        x = make(rng, (3, 4), dt)
        for t, kw in ((np.array([0, 1, 5]), {}), (np.array([0, 1]), {}),
                      (np.array([0, 1, 2]), {"weight": make(rng, (3,), dt)}),
                      (np.array([0, 1, 2]), {"weight": make(rng, (1, 4), dt)}),
                      (np.array([0, 1, 2], np.int32), {}), (np.array([[0, 1, 2]]), {}),
                      (np.array([0, 1, 2]), {"p": 3})):
            yield Sample((x, t), kw, grad_args=(0,))
        yield Sample((make(rng, (2, 3, 4), dt), np.array([0, 1])), {}, grad_args=(0,))
        yield Sample((make(rng, (3, 0), dt), np.zeros(3, np.int64)), {}, grad_args=(0,))


register(OpInfo("multi_margin_loss", fn("multi_margin_loss"), _multi_margin_gen,
                covers=("gather", "clamp"), meta=False))


def _ml_margin_gen(rng, dt):
    for red in REDUCTIONS:
        t = np.array([[3, 0, -1, 1], [0, 1, 2, 3], [-1, 1, 0, 0], [2, -1, 3, 3]])
        yield Sample((_distinct_rows(rng, (4, 4), dt), t), {"reduction": red}, grad_args=(0,))
        yield Sample((_distinct_rows(rng, (4,), dt), np.array([1, 3, -1, 0])),
                     {"reduction": red}, grad_args=(0,))
    if once(dt):
        x = make(rng, (2, 3), dt)
        yield Sample((x, np.array([[0, 5, -1], [1, -1, 0]])), {}, grad_args=(0,))
        yield Sample((x, np.array([0, 1, -1])), {}, grad_args=(0,))


register(OpInfo("multilabel_margin_loss", fn("multilabel_margin_loss"), _ml_margin_gen,
                covers=("scatter_add", "cumprod"), meta=False))


def _triplet_gen(rng, dt):
    for red in REDUCTIONS:
        for kw in ({}, {"margin": 0.5, "p": 1.0}, {"p": 3.0, "swap": True}, {"eps": 1e-3}):
            a, p, n = (make(rng, (4, 3), dt) for _ in range(3))
            yield Sample((a, p, n), dict(kw, reduction=red))
        yield Sample(tuple(make(rng, (3,), dt) for _ in range(3)), {"reduction": red})
        yield Sample(tuple(make(rng, (0, 3), dt) for _ in range(3)), {"reduction": red})
    if once(dt):
        a = make(rng, (4, 3), dt)
        yield Sample((a, a, a), {"margin": 0.0})
        yield Sample((a, a, a[0]), {})


register(OpInfo("triplet_margin_loss", fn("triplet_margin_loss"), _triplet_gen,
                covers=("norm", "minimum")))


def _l1_dist(x, y):
    return (x - y).abs().sum(-1)


def _triplet_dist(L, a, p, n, custom=False, **kw):
    f = _l1_dist if custom else None
    return L.nn.functional.triplet_margin_with_distance_loss(a, p, n, distance_function=f, **kw)


def _triplet_dist_gen(rng, dt):
    for red in REDUCTIONS:
        for kw in ({}, {"custom": True}, {"swap": True, "margin": 0.3}):
            yield Sample(tuple(make(rng, (4, 3), dt) for _ in range(3)), dict(kw, reduction=red))
    if once(dt):
        yield Sample(tuple(make(rng, (4, 3), dt) for _ in range(3)), {"margin": -1.0})
        yield Sample(tuple(make(rng, (4, 3), dt) for _ in range(3)), {"reduction": "x"})


register(OpInfo("triplet_margin_with_distance_loss", _triplet_dist, _triplet_dist_gen,
                covers=("norm",)))


def _cos_emb_gen(rng, dt):
    for red in REDUCTIONS:
        for margin in (0.0, 0.4, -0.5):
            yield Sample((make(rng, (4, 3), dt), make(rng, (4, 3), dt), signs(rng, (4,), dt)),
                         {"margin": margin, "reduction": red})
        yield Sample((make(rng, (3,), dt), make(rng, (3,), dt), np.asarray(dt.type(-1))),
                     {"reduction": red})
        yield Sample((make(rng, (0, 3), dt), make(rng, (0, 3), dt), make(rng, (0,), dt)),
                     {"reduction": red})
    if once(dt):
        x = make(rng, (3, 4), dt)
        for t in (np.ones((3, 1), dt), np.asarray(dt.type(1)), np.ones(2, dt),
                  np.ones(3, np.int64)):
            yield Sample((x, x, t), {})
        yield Sample((x, x[0], np.ones(3, dt)), {})


register(OpInfo("cosine_embedding_loss", fn("cosine_embedding_loss"), _cos_emb_gen,
                covers=("sqrt", "where")))


# ---- distances --------------------------------------------------------------------------------

def _normalize_gen(rng, dt):
    for p, dim in ((2.0, 1), (1.0, 0), (3.0, -1), (float("inf"), 1), (0.5, 1)):
        yield Sample((make(rng, (3, 4), dt),), {"p": p, "dim": dim})
    yield Sample((make(rng, (2, 3, 4), dt),), {"dim": -2})
    yield Sample((make(rng, (5,), dt),), {"dim": 0})
    yield Sample((make(rng, (0, 3), dt),), {})
    # norms below eps (the clamp's kink: > 60 elements, no finite differences)
    x = make(rng, (8, 8), dt)
    x[1] = 0
    x[2] = 1e-14
    yield Sample((x,), {})
    if once(dt):
        yield Sample((make(rng, (3, 4), dt),), {"dim": 2})
        yield Sample((make(rng, (3, 4), np.int64, -2, 3),), {})


register(OpInfo("normalize", fn("normalize"), _normalize_gen, covers=("norm", "clamp", "div")))


def _cos_sim_gen(rng, dt):
    for s1, s2, dim in (((3, 4), (3, 4), 1), ((3, 4), (3, 4), 0), ((3, 4), (4,), -1),
                        ((2, 3, 4), (3, 1), 1), ((5,), (5,), 0), ((0, 3), (0, 3), 1),
                        ((3, 4), (3, 4), 2)):
        yield Sample((make(rng, s1, dt), make(rng, s2, dt)), {"dim": dim})
    # norms below eps (the clamp's kink: > 60 elements, no finite differences)
    x = make(rng, (8, 8), dt)
    x[0] = 0
    x[1] *= 1e-9
    yield Sample((x, make(rng, (8, 8), dt)), {"dim": 1, "eps": 1e-6})
    if once(dt):
        yield Sample((make(rng, (3, 4), np.int64, -3, 4), make(rng, (3, 4), dt)), {})
        yield Sample((make(rng, (3, 4), np.int64, -3, 4), make(rng, (3, 4), np.int64, -3, 4)),
                     {})
        yield Sample((make(rng, (3, 4), dt), make(rng, (2, 4), dt)), {})


register(OpInfo("cosine_similarity", fn("cosine_similarity"), _cos_sim_gen,
                covers=("norm", "clamp", "clone", "sum")))


def _pairwise_gen(rng, dt):
    for s1, s2, kw in (((3, 4), (3, 4), {}), ((3, 4), (4,), {"p": 1.0}),
                       ((2, 3, 4), (3, 4), {"keepdim": True}), ((5,), (5,), {"p": 3.0}),
                       ((3, 4), (3, 4), {"p": float("inf")}), ((3, 4), (1, 4), {"eps": 0.1}),
                       ((0, 4), (0, 4), {}), ((3, 4), (3, 4), {"p": 0.5})):
        yield Sample((make(rng, s1, dt), make(rng, s2, dt)), kw)
    if once(dt):
        yield Sample((make(rng, (3, 4), dt), make(rng, (2, 4), dt)), {})
        yield Sample((make(rng, (3,), np.int64, -3, 3), make(rng, (3,), np.int64, -3, 3)), {})


register(OpInfo("pairwise_distance", fn("pairwise_distance"), _pairwise_gen, covers=("norm",)))


def _pdist_gen(rng, dt):
    for shape, p in (((4, 3), 2.0), ((5, 2), 1.0), ((4, 3), 3.0), ((4, 3), float("inf")),
                     ((1, 3), 2.0), ((3, 0), 2.0), ((4, 3), 0.0), ((4, 3), 0.5)):
        yield Sample((make(rng, shape, dt),), {"p": p})
    # PyTorch's pdist backward crashes on an empty input: forward only
    yield Sample((make(rng, (0, 3), dt),), {}, grad_args=())
    if once(dt):
        yield Sample((make(rng, (2, 3, 4), dt),), {})
        yield Sample((make(rng, (4,), dt),), {})
        yield Sample((make(rng, (3, 4), dt),), {"p": -1.0})
        yield Sample((make(rng, (3, 4), np.int64, -3, 3),), {})


register(OpInfo("pdist", fn("pdist"), _pdist_gen, covers=("index_select", "norm")))


def _cdist(L, x1, x2, **kw):
    return L.cdist(x1, x2, **kw)


def _cdist_gen(rng, dt):
    for s1, s2, kw in (((3, 4), (5, 4), {}), ((3, 4), (5, 4), {"p": 1.0}),
                       ((2, 3, 4), (5, 4), {"p": 3.0}), ((2, 1, 3, 2), (4, 5, 2), {}),
                       ((3, 4), (2, 4), {"p": float("inf")}), ((3, 4), (2, 4), {"p": 0.0}),
                       ((27, 3), (4, 3), {}), ((3, 3), (4, 3), {"compute_mode":
                                                                "use_mm_for_euclid_dist"}),
                       ((30, 3), (4, 3), {"compute_mode": "donot_use_mm_for_euclid_dist"}),
                       ((0, 3), (2, 3), {}), ((3, 0), (2, 0), {}), ((3, 2), (2, 2), {"p": 0.5})):
        yield Sample((make(rng, s1, dt), make(rng, s2, dt)), kw)
    if once(dt):
        for s1, s2, kw in (((3,), (2, 3), {}), ((3, 4), (2, 3), {}), ((3, 4), (2, 4), {"p": -1}),
                           ((3, 4), (2, 4), {"compute_mode": "bogus"})):
            yield Sample((make(rng, s1, dt), make(rng, s2, dt)), kw)
        yield Sample((make(rng, (3, 2), np.int64, 0, 3), make(rng, (2, 2), dt)), {})


register(OpInfo("cdist", _cdist, _cdist_gen, covers=("matmul", "cat", "sqrt", "norm")))
