"""Op-info entries: normalisation functions of ``nn.functional``.

``batch_norm`` (training with running-stat updates, eval, no running stats, momentum and
eps), ``instance_norm`` (with and without running stats), ``layer_norm``, ``group_norm``,
``rms_norm`` and ``local_response_norm``, over 2-d to 5-d inputs, zero-size batches,
optional affine parameters, and PyTorch's errors for bad shapes, sizes and dtypes. Entries
that update running statistics also return them, so the in-place update is compared too.
``*_f16`` entries compare float16 inputs (computed in float32, as PyTorch does).
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register

F32 = np.dtype(np.float32)


def _pure(name):
    """``F.<name>`` on copies of the running statistics, so that repeated calls (gradcheck)
    see the same ones."""
    def call(L, x, rm=None, rv=None, *args, **kw):
        rm, rv = (t.detach().clone() if t is not None else None for t in (rm, rv))
        return getattr(L.nn.functional, name)(x, rm, rv, *args, **kw)
    return call


def _stats(name):
    """The output, and the running statistics after the call (updated in place)."""
    def call(L, x, rm=None, rv=None, *args, **kw):
        out = getattr(L.nn.functional, name)(x, rm, rv, *args, **kw)
        return (out,) + tuple(t.detach().clone() for t in (rm, rv) if t is not None)
    return call


def _bn_samples(rng, dt):
    def stats(c):
        return make(rng, (c,), dt, -0.5, 0.5), make(rng, (c,), dt, 0.5, 2.0)
    for shape in [(4, 3), (2, 3, 5), (2, 3, 2, 3), (2, 3, 2, 1, 2), (3, 1), (0, 3)]:
        c = shape[1]
        x = make(rng, shape, dt)
        w, b = make(rng, (c,), dt), make(rng, (c,), dt)
        rm, rv = stats(c)
        yield Sample((x, rm, rv, w, b), dict(training=True), grad_args=(0, 3, 4))
        yield Sample((x, rm, rv, w, b), dict(training=False), grad_args=(0, 3, 4))
        yield Sample((x, None, None, w, b), dict(training=True), grad_args=(0, 3, 4))
        yield Sample((x,), dict(training=True), grad_args=(0,))
    x = make(rng, (5, 2, 3), dt)
    rm, rv = stats(2)
    yield Sample((x, rm, rv), dict(training=True, momentum=0.5, eps=1e-3), grad_args=(0,))
    yield Sample((x, rm, rv, make(rng, (2,), dt)), dict(training=False, eps=0.1),
                 grad_args=(0, 3))
    yield Sample((x, rm, rv, None, make(rng, (2,), dt)), dict(training=True),
                 grad_args=(0, 4))
    # errors: one value per channel, wrong sizes, no running stats in eval, 1-d input
    yield Sample((make(rng, (1, 3), dt),), dict(training=True), grad_args=(0,))
    yield Sample((x, rm, rv, make(rng, (3,), dt)), dict(training=True), grad_args=(0,))
    yield Sample((x, make(rng, (3,), dt), rv), dict(training=False), grad_args=(0,))
    yield Sample((x,), dict(training=False), grad_args=(0,))
    yield Sample((make(rng, (4,), dt),), dict(training=True), grad_args=(0,))
    yield Sample((x, rm, None), dict(training=True), grad_args=(0,))
    yield Sample((x,), dict(training=True, eps=0.0), grad_args=(0,))


def _in_samples(rng, dt):
    # PyTorch fails on an empty batch with weights (an internal select); without, both work
    yield Sample((make(rng, (0, 3, 4), dt),), {}, grad_args=(0,))
    for shape in [(2, 3, 5), (2, 3, 2, 3), (1, 2, 2, 2, 2)]:
        c = shape[1]
        x = make(rng, shape, dt)
        w, b = make(rng, (c,), dt), make(rng, (c,), dt)
        rm, rv = make(rng, (c,), dt, -0.5, 0.5), make(rng, (c,), dt, 0.5, 2.0)
        yield Sample((x,), {}, grad_args=(0,))
        yield Sample((x, None, None, w, b), {}, grad_args=(0, 3, 4))
        yield Sample((x, rm, rv, w, b), dict(momentum=0.3), grad_args=(0, 3, 4))
        yield Sample((x, rm, rv, w, b), dict(use_input_stats=False), grad_args=(0, 3, 4))
    yield Sample((make(rng, (2, 3, 1), dt),), {}, grad_args=(0,))      # one spatial value
    yield Sample((make(rng, (2, 3, 4), dt), None, None, make(rng, (4,), dt)), {},
                 grad_args=(0,))


def _ln_samples(rng, dt):
    cases = [((4, 5), (5,)), ((2, 3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3,), (3,)),
             ((0, 5), (5,)), ((2, 1), (1,)), ((2, 3, 4), (2, 3, 4))]
    for shape, ns in cases:
        x = make(rng, shape, dt)
        yield Sample((x, ns, make(rng, ns, dt), make(rng, ns, dt)))
        yield Sample((x, ns))
        yield Sample((x, list(ns), make(rng, ns, dt)), dict(eps=1e-2))
        yield Sample((x, ns, None, make(rng, ns, dt)))
    x = make(rng, (2, 3, 4), dt)
    yield Sample((x, (3,)))                                  # not the trailing shape
    yield Sample((x, (4,), make(rng, (5,), dt)))              # weight of the wrong shape
    yield Sample((x, ()))                                     # empty normalized_shape
    yield Sample((x, 4))                                      # an int is a TypeError
    yield Sample((x, (2, 3, 4, 5)))


def _gn_samples(rng, dt):
    for shape, g in [((2, 6, 4), 3), ((2, 4), 2), ((2, 6, 2, 3), 2), ((3, 4, 5), 1),
                     ((2, 4, 3), 4), ((1, 2, 2, 2, 2), 2), ((0, 4, 2), 2)]:
        x = make(rng, shape, dt)
        c = shape[1]
        yield Sample((x, g, make(rng, (c,), dt), make(rng, (c,), dt)))
        yield Sample((x, g))
        yield Sample((x, g, make(rng, (c,), dt)), dict(eps=1e-2))
    yield Sample((make(rng, (2, 3, 4), dt), 2))                  # channels not divisible
    yield Sample((make(rng, (2, 4, 4), dt), 2, make(rng, (3,), dt)))
    yield Sample((make(rng, (4,), dt), 1))
    yield Sample((make(rng, (1, 4), dt), 4))                      # one value per group


def _rms_samples(rng, dt):
    for shape, ns in [((4, 5), (5,)), ((2, 3, 4), (3, 4)), ((3,), (3,)), ((0, 5), (5,))]:
        x = make(rng, shape, dt)
        yield Sample((x, ns, make(rng, ns, dt)))
        yield Sample((x, ns))
        yield Sample((x, ns, make(rng, ns, dt)), dict(eps=1e-3))
    x = make(rng, (2, 3, 4), dt)
    yield Sample((x, (3,)))
    yield Sample((x, (4,), make(rng, (3,), dt)))


def _lrn_samples(rng, dt):
    for shape in [(2, 5, 4), (2, 5, 3, 3), (1, 4, 2, 2, 2), (2, 1, 3), (0, 3, 4)]:
        for size in (1, 2, 3, 5):
            yield Sample((make(rng, shape, dt), size))
    yield Sample((make(rng, (2, 6, 3), dt), 3), dict(alpha=0.5, beta=0.5, k=2.0))
    yield Sample((make(rng, (2, 5), dt), 3))


def _f16(gen_shapes):
    def gen(rng, dt):
        if np.dtype(dt) == F32:
            for args, kw in gen_shapes(rng):
                yield Sample(args, kw)
    return gen


def fn(name):
    def call(L, *args, **kwargs):
        return getattr(L.nn.functional, name)(*args, **kwargs)
    return call


register(
    OpInfo("batch_norm", _pure("batch_norm"), _bn_samples,
           covers=("batch_norm", "batch_norm_backward")),
    OpInfo("batch_norm_running_stats", _stats("batch_norm"), _bn_samples,
           covers=("batch_norm",), gradcheck=False),
    OpInfo("instance_norm", _pure("instance_norm"), _in_samples, covers=("batch_norm",)),
    OpInfo("instance_norm_running_stats", _stats("instance_norm"), _in_samples,
           covers=("batch_norm",), gradcheck=False),
    OpInfo("layer_norm", fn("layer_norm"), _ln_samples,
           covers=("layer_norm", "layer_norm_backward")),
    OpInfo("group_norm", fn("group_norm"), _gn_samples),
    OpInfo("rms_norm", fn("rms_norm"), _rms_samples),
    OpInfo("local_response_norm", fn("local_response_norm"), _lrn_samples,
           covers=("mul", "pow", "div")),
    OpInfo("layer_norm_f16", fn("layer_norm"), _f16(lambda rng: [
        ((make(rng, (4, 8), np.float16), (8,), make(rng, (8,), np.float16),
          make(rng, (8,), np.float16)), {})]),
        covers=("layer_norm",), atol=2e-3, rtol=2e-3, grad_atol=2e-2, grad_rtol=2e-2,
        gradcheck=False),
    OpInfo("batch_norm_f16", _pure("batch_norm"), _f16(lambda rng: [
        ((make(rng, (6, 3, 2), np.float16), None, None, make(rng, (3,), np.float16),
          make(rng, (3,), np.float16)), dict(training=True))]),
        covers=("batch_norm",), atol=2e-3, rtol=2e-3, grad_atol=3e-2, grad_rtol=3e-2,
        gradcheck=False),
)
