"""Op-info entries: ``linear``, ``bilinear``, dropout, embeddings and ``one_hot`` of
``nn.functional``.

Dropout masks come from different generators in the two libraries, so the random entries
compare shapes and dtypes only; the deterministic cases (eval mode, ``p=0``, ``p=1``) are
compared by value, and the mask/gradient consistency and statistics are tested in
``tests/nn/test_linear_norm.py``. ``embedding_grad_grad`` differentiates the embedding's
weight gradient (double backward, the ``embedding_backward`` op's own grad rule).
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register

F32 = np.dtype(np.float32)


def fn(name, **fixed):
    def call(L, *args, **kwargs):
        return getattr(L.nn.functional, name)(*args, **fixed, **kwargs)
    return call


def _linear_samples(rng, dt):
    for xs, (o, i) in [((4, 3), (2, 3)), ((3,), (5, 3)), ((2, 5, 3), (4, 3)), ((0, 3), (2, 3)),
                       ((2, 3), (0, 3)), ((2, 1, 2, 3), (1, 3))]:
        x, w = make(rng, xs, dt), make(rng, (o, i), dt)
        yield Sample((x, w, make(rng, (o,), dt)))
        yield Sample((x, w))
        yield Sample((x, w), dict(bias=make(rng, (), dt)))
    yield Sample((make(rng, (2, 3), dt), make(rng, (3,), dt)))        # 1-d weight
    yield Sample((make(rng, (2, 3), dt), make(rng, (4, 3), dt), make(rng, (2, 4), dt)))
    # errors: mismatched features, bias of the wrong size, 0-d input, 3-d weight
    yield Sample((make(rng, (2, 3), dt), make(rng, (4, 5), dt)))
    yield Sample((make(rng, (2, 5, 3), dt), make(rng, (4, 5), dt)))
    yield Sample((make(rng, (2, 3), dt), make(rng, (4, 3), dt), make(rng, (3,), dt)))
    yield Sample((make(rng, (2, 2, 3), dt), make(rng, (4, 3), dt), make(rng, (5, 2, 4), dt)))
    yield Sample((make(rng, (), dt), make(rng, (4, 3), dt)))
    yield Sample((make(rng, (2, 3), dt), make(rng, (4, 3, 1), dt)))


def _bilinear_samples(rng, dt):
    for lead in [(4,), (), (2, 3), (0,)]:
        x1, x2 = make(rng, lead + (3,), dt), make(rng, lead + (2,), dt)
        w = make(rng, (5, 3, 2), dt)
        yield Sample((x1, x2, w, make(rng, (5,), dt)))
        yield Sample((x1, x2, w))
    x1, x2, w = make(rng, (2, 3), dt), make(rng, (2, 2), dt), make(rng, (5, 3, 2), dt)
    yield Sample((x1, make(rng, (3, 2), dt), w))                         # batch mismatch
    yield Sample((x1, make(rng, (2, 4), dt), w))                         # input2 size
    yield Sample((make(rng, (2, 4), dt), x2, w))                         # input1 size
    yield Sample((x1, x2, w, make(rng, (4,), dt)))                       # bias size
    yield Sample((x1, x2, make(rng, (5, 3), dt)))                        # 2-d weight


def _dropout_samples(rng, dt):
    x = make(rng, (6, 5), dt)
    yield Sample((x,), dict(p=0.3, training=False))
    yield Sample((x,), dict(p=0.0))
    yield Sample((x,), dict(p=1.0))
    yield Sample((make(rng, (0, 3), dt),), dict(p=0.5))
    yield Sample((x,), dict(p=1.5))
    yield Sample((x,), dict(p=-0.1))
    if np.dtype(dt) == F32:  # integer inputs: an error in training, the identity in eval
        ints = make(rng, (3, 4), np.int64, -3, 4)
        yield Sample((ints,), dict(p=0.5))
        yield Sample((ints,), dict(p=0.5, training=False))


def _random_dropout_samples(rng, dt):
    for s in [(), (5,), (6, 5), (2, 3, 4)]:
        yield Sample((make(rng, s, dt),), dict(p=0.4))
    yield Sample((make(rng, (3, 4), dt),), dict(p=0.5, training=True))


def _feature_samples(shapes, bad):
    def gen(rng, dt):
        for s in shapes:
            yield Sample((make(rng, s, dt),), dict(p=0.5))
            yield Sample((make(rng, s, dt),), dict(p=1.0))
            yield Sample((make(rng, s, dt),), dict(p=0.5, training=False))
        for s in bad:
            yield Sample((make(rng, s, dt),), dict(p=0.5))
        yield Sample((make(rng, shapes[0], dt),), dict(p=2.0))
    return gen


def _alpha_samples(feature):
    def gen(rng, dt):
        shapes = [(4, 3, 2), (2, 5)] if feature else [(6, 5), (7,)]
        for s in shapes:
            yield Sample((make(rng, s, dt),), dict(p=0.3, training=True))
            yield Sample((make(rng, s, dt),), dict(p=0.3))              # eval by default
            yield Sample((make(rng, s, dt),), dict(p=1.0, training=True))
        yield Sample((make(rng, (3, 2), dt),), dict(p=1.5, training=True))
    return gen


def _inplace(name):
    """``F.<name>(x * 1, ..., inplace=True)``: the in-place path through autograd."""
    def call(L, x, **kwargs):
        return getattr(L.nn.functional, name)(x * 1, inplace=True, **kwargs)
    return call


def _emb_samples(padding_or_freq: bool):
    """Plain lookups (true gradients: finite differences apply), or lookups whose gradient
    is altered on purpose by ``padding_idx`` / ``scale_grad_by_freq``."""
    kws = [dict(padding_idx=2), dict(padding_idx=-1, scale_grad_by_freq=True),
           dict(scale_grad_by_freq=True)] if padding_or_freq else [{}]

    def gen(rng, dt):
        w = make(rng, (6, 3), dt)
        for idx in [np.array([1, 4, 4, 0]), np.array([[0, 5], [2, 2], [5, 5]]), np.array(3),
                    np.zeros((0,), np.int64), np.array([1, 2], np.int32)]:
            for kw in kws:
                yield Sample((idx, w), kw)
        if not padding_or_freq:
            yield Sample((np.array([1, 6]), w))                       # out of range
            yield Sample((np.array([-1, 2]), w))
            yield Sample((np.array([1.0, 2.0], dt), w))               # float indices
            yield Sample((np.array([1, 2]), make(rng, (6,), dt)))      # 1-d weight
    return gen


def _emb_max_norm(L, idx, w, **kw):
    """The lookup with ``max_norm``, and the table after its in-place renormalisation."""
    out = L.nn.functional.embedding(idx, w, **kw)
    return out, w.detach().clone()


def _emb_norm_samples(rng, dt):
    for kw in [dict(max_norm=1.0), dict(max_norm=0.5, norm_type=1.0),
               dict(max_norm=1.2, norm_type=float("inf")), dict(max_norm=10.0),
               dict(max_norm=0.8, padding_idx=1)]:
        yield Sample((np.array([[1, 3], [3, 0]]), make(rng, (5, 4), dt, -1.5, 1.5)), kw)


def _emb_grad_grad(L, w, g, idx, **kw):
    """d/dw of ``embedding`` applied to ``g``, kept differentiable (create_graph)."""
    out = L.nn.functional.embedding(idx, w, **kw)
    return L.autograd.grad(out, w, g, create_graph=True)[0]


def _emb_gg_samples(rng, dt):
    # not with scale_grad_by_freq: PyTorch's double backward leaves the scaling out
    # (embedding_dense_double_backward); tests/nn/test_linear_norm.py checks ours
    for kw in [{}, dict(padding_idx=1), dict(padding_idx=-4)]:
        idx = np.array([[1, 0], [1, 3], [2, 1]])
        yield Sample((make(rng, (4, 3), dt), make(rng, (3, 2, 3), dt), idx), kw)


def _bag_samples(rng, dt):
    w = make(rng, (6, 3), dt)
    for mode in ("sum", "mean", "max"):
        yield Sample((np.array([[1, 4, 4], [0, 5, 2]]), w), dict(mode=mode))
        yield Sample((np.array([[1, 4, 4], [0, 2, 2]]), w), dict(mode=mode, padding_idx=2))
        yield Sample((np.array([1, 4, 4, 0, 5, 2, 3]), w, np.array([0, 2, 2, 5])),
                     dict(mode=mode))
        yield Sample((np.array([1, 4, 4, 0, 5, 2, 3]), w, np.array([0, 2, 2, 7])),
                     dict(mode=mode, include_last_offset=True))
        yield Sample((np.array([1, 2, 4, 2, 0]), w, np.array([0, 3])),
                     dict(mode=mode, padding_idx=2))
        yield Sample((np.zeros((0,), np.int64), w, np.array([0, 0])), dict(mode=mode))
    idx, offs = np.array([1, 4, 4, 0, 5]), np.array([0, 1, 3])
    yield Sample((idx, w, offs), dict(mode="sum", per_sample_weights=make(rng, (5,), dt)))
    # scale_grad_by_freq is left out: PyTorch 2.13's CPU kernel miscounts (index 5 of
    # [1, 4, 4, 0, 5] gets 1/2); tests/nn/test_linear_norm.py checks ours by hand
    # errors
    yield Sample((idx, w, offs), dict(mode="max", per_sample_weights=make(rng, (5,), dt)))
    yield Sample((idx, w), dict(mode="sum"))                               # no offsets
    yield Sample((idx, w, np.array([1, 3])), dict(mode="sum"))             # offsets[0] != 0
    yield Sample((idx, w, np.array([0, 9])), dict(mode="sum"))             # past the end
    yield Sample((idx, w, offs), dict(mode="min"))
    yield Sample((idx, w, offs), dict(mode="max", scale_grad_by_freq=True))
    yield Sample((np.array([[1, 2]]), w, offs), dict(mode="sum"))
    yield Sample((np.zeros((1, 2, 2), np.int64), w), dict(mode="sum"))
    yield Sample((idx, make(rng, (6,), dt), offs), dict(mode="sum"))


def _bag_max_norm_samples(rng, dt):
    w = make(rng, (6, 3), dt, -1.5, 1.5)
    for mode in ("sum", "mean", "max"):
        yield Sample((np.array([1, 4, 4, 0, 5]), w, np.array([0, 1, 3])),
                     dict(mode=mode, max_norm=1.0))


def _one_hot_samples(rng, dt):
    if np.dtype(dt) == F32:
        yield Sample((np.array([0, 3, 1]),))
        yield Sample((np.array([[0, 2], [1, 1]]),), dict(num_classes=4))
        yield Sample((np.array([0, 5]),), dict(num_classes=3))


register(
    OpInfo("linear", fn("linear"), _linear_samples, covers=("matmul", "add")),
    OpInfo("bilinear", fn("bilinear"), _bilinear_samples, covers=("matmul",)),
    # gradcheck=False: tessera's gradcheck does not clone outputs, and eval-mode dropout
    # returns its input itself (the p=1 gradient is still compared with PyTorch's)
    OpInfo("dropout", fn("dropout"), _dropout_samples, covers=("dropout",), gradcheck=False),
    OpInfo("dropout_random", fn("dropout"), _random_dropout_samples, covers=("dropout",),
           random=True),
    OpInfo("dropout_inplace", _inplace("dropout"), _random_dropout_samples,
           covers=("dropout",), random=True),
    OpInfo("dropout1d", fn("dropout1d"), _feature_samples([(2, 3, 4), (3, 4)],
                                                          [(2, 2, 2, 2), (4,)]),
           covers=("dropout",), random=True),
    OpInfo("dropout2d", fn("dropout2d"), _feature_samples([(2, 3, 4, 4)], [(5,)]),
           covers=("dropout",), random=True),
    OpInfo("dropout3d", fn("dropout3d"), _feature_samples([(2, 3, 2, 2, 2), (3, 2, 2, 2)],
                                                          []),
           covers=("dropout",), random=True),
    OpInfo("alpha_dropout", fn("alpha_dropout"), _alpha_samples(False), covers=("dropout",),
           random=True),
    OpInfo("feature_alpha_dropout", fn("feature_alpha_dropout"), _alpha_samples(True),
           covers=("dropout",), random=True),
    OpInfo("embedding", fn("embedding"), _emb_samples(False), covers=("embedding",)),
    OpInfo("embedding_padding_freq", fn("embedding"), _emb_samples(True),
           covers=("embedding",), gradcheck=False),
    OpInfo("embedding_max_norm", _emb_max_norm, _emb_norm_samples,
           covers=("embedding", "embedding_renorm"), gradcheck=False),
    # gradcheck=False: tessera's gradcheck evaluates under no_grad, where autograd.grad
    # inside the function cannot run; double backward is compared with PyTorch here
    OpInfo("embedding_grad_grad", _emb_grad_grad, _emb_gg_samples,
           covers=("embedding_backward",), gradcheck=False),
    OpInfo("embedding_bag", fn("embedding_bag"), _bag_samples,
           covers=("embedding", "index_add", "scatter_reduce"), meta=False),
    OpInfo("embedding_bag_max_norm", fn("embedding_bag"), _bag_max_norm_samples,
           covers=("embedding_renorm",), meta=False, gradcheck=False),
    OpInfo("one_hot", fn("one_hot"), _one_hot_samples, covers=("one_hot",),
           differentiable=False, meta=False),
)
