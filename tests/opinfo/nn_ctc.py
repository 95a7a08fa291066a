"""Op-info entries: ``F.ctc_loss`` (ops ``ctc_loss`` and ``ctc_loss_backward``).

``ctc_loss`` takes log-probabilities; the main entries feed it ``log_softmax`` of random
logits, as real code does. Through log_softmax, PyTorch's gradient (eq. 16 of Graves et al.,
the gradient with respect to the logits) and the exact derivative agree, so the float64
gradcheck is meaningful. ``ctc_loss_raw`` compares the gradient with respect to
``log_probs`` itself, where tessera returns PyTorch's eq.-16 values (no gradcheck there: they
differ from the finite-difference derivative by ``exp(log_probs)``, which log_softmax's
backward cancels). Samples sweep the reductions, padded (N, S) and concatenated targets,
unbatched (T, C) input, sequences shorter than T, empty targets, repeated labels (which
need a blank between them), another blank index, impossible alignments with and without
``zero_infinity``, and PyTorch's argument errors.
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, register

REDUCTIONS = ("none", "mean", "sum")
I64 = np.int64


def _ctc(L, x, targets, input_lengths, target_lengths, **kw):
    return L.nn.functional.ctc_loss(x.log_softmax(-1), targets, input_lengths, target_lengths,
                                    **kw)


def _ctc_raw(L, lp, targets, input_lengths, target_lengths, **kw):
    return L.nn.functional.ctc_loss(lp, targets, input_lengths, target_lengths, **kw)


def _logits(rng, shape, dt):
    return rng.standard_normal(shape).astype(dt)


def _concat(padded, lengths):
    return np.concatenate([row[:n] for row, n in zip(padded, lengths)]).astype(I64)


def ctc_samples(rng, dt):
    T, N, C = 5, 3, 4    # 60 elements: small enough for the gradcheck
    tg = np.array([[1, 2, 2], [3, 1, 0], [2, 0, 0]], I64)    # 2, 2 needs a blank between
    for red in REDUCTIONS:
        yield Sample((_logits(rng, (T, N, C), dt), tg, [5, 4, 3], [3, 2, 1]),
                     {"reduction": red}, grad_args=(0,))
        yield Sample((_logits(rng, (T, N, C), dt), _concat(tg, [3, 2, 1]), [5, 5, 4],
                      [3, 2, 1]), {"reduction": red}, grad_args=(0,), name="concatenated")
    yield Sample((_logits(rng, (T, N, C), dt), tg, [5, 4, 2], [3, 0, 1]), {}, grad_args=(0,),
                 name="empty_target")
    yield Sample((_logits(rng, (T, 2, C), dt), np.array([[0, 1], [2, 0]], I64), [4, 5],
                  [2, 1]), {"blank": 3, "reduction": "sum"}, grad_args=(0,), name="blank_3")
    yield Sample((_logits(rng, (T, 1, 3), dt), np.array([[1, 1, 1]], I64), [5], [3]),
                 {"reduction": "none"}, grad_args=(0,), name="tight_repeats")
    yield Sample((_logits(rng, (T, N, C), dt), tg, [5, 2, 3], [3, 2, 1]),
                 {"reduction": "none", "zero_infinity": True}, grad_args=(0,),
                 name="impossible_zeroed")
    yield Sample((_logits(rng, (T, N, C), dt), tg, [5, 2, 3], [3, 2, 1]),
                 {"reduction": "mean", "zero_infinity": True}, grad_args=(0,),
                 name="impossible_zeroed")
    yield Sample((_logits(rng, (T, C), dt), np.array([1, 3], I64), [4], [2]),
                 {"reduction": "none"}, grad_args=(0,), name="unbatched")
    yield Sample((_logits(rng, (T, C), dt), np.array([[1, 3, 0]], I64), [5], [2]), {},
                 grad_args=(0,), name="unbatched_padded")
    yield Sample((_logits(rng, (40, 2, 6), dt), rng.integers(1, 6, (2, 12)).astype(I64),
                  [40, 31], [12, 9]), {"reduction": "sum"}, grad_args=(0,), name="long")


def ctc_tensor_length_samples(rng, dt):
    T, N, C = 5, 2, 4
    tg = np.array([[1, 2], [3, 3]], I64)
    yield Sample((_logits(rng, (T, N, C), dt), tg, np.array([5, 5], I64),
                  np.array([2, 2], I64)), {"reduction": "none"}, grad_args=(0,))
    yield Sample((_logits(rng, (T, N, C), dt), tg, np.array([5, 4], np.int32),
                  np.array([[2, 1]], I64)), {}, grad_args=(0,), name="int32_2d")
    yield Sample((_logits(rng, (T, C), dt), np.array([1, 2], I64), np.array(5, I64),
                  np.array(2, I64)), {"reduction": "none"}, grad_args=(0,), name="unbatched")
    yield Sample((_logits(rng, (T, N, C), dt), tg, np.array([5.0, 4.0]),
                  np.array([2, 1], I64)), {}, grad_args=(0,), name="float_lengths")
    yield Sample((_logits(rng, (T, N, C), dt), tg, np.array([5, 4], I64), (2, 1)), {},
                 grad_args=(0,), name="mixed_lengths")


def _log_probs(rng, shape, dt):
    x = rng.standard_normal(shape)
    return (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(dt)


def ctc_raw_samples(rng, dt):
    T, N, C = 6, 3, 4
    tg = np.array([[1, 2, 2], [3, 1, 0], [2, 0, 0]], I64)
    for red in REDUCTIONS:
        yield Sample((_log_probs(rng, (T, N, C), dt), tg, [6, 5, 3], [3, 2, 1]),
                     {"reduction": red}, grad_args=(0,))
    yield Sample((_log_probs(rng, (T, N, C), dt), tg, [6, 2, 3], [3, 2, 1]),
                 {"reduction": "sum"}, grad_args=(0,), name="impossible_nan_grads")
    yield Sample((_log_probs(rng, (T, N, C), dt), tg.astype(dt), [6, 5, 3], [3, 2, 1]), {},
                 grad_args=(0,), name="float_targets")
    yield Sample((_log_probs(rng, (T, C), dt), np.array([1, 2], I64), [5], [2]),
                 {"reduction": "none"}, grad_args=(0,), name="unbatched")
    yield Sample((_log_probs(rng, (0, 2, C), dt), tg[:2], [0, 0], [0, 0]), {},
                 grad_args=(0,), name="T_zero_error")
    bad = [
        ("blank_range", tg, [6, 5, 3], [3, 2, 1], {"blank": 4}),
        ("blank_negative", tg, [6, 5, 3], [3, 2, 1], {"blank": -1}),
        ("input_lengths_count", tg, [6, 5], [3, 2, 1], {}),
        ("target_lengths_count", tg, [6, 5, 3], [3, 2], {}),
        ("input_too_long", tg, [7, 5, 3], [3, 2, 1], {}),
        ("input_negative", tg, [6, -1, 3], [3, 2, 1], {}),
        ("target_negative", tg, [6, 5, 3], [3, -2, 1], {}),
        ("padded_too_short", tg[:, :2], [6, 5, 3], [3, 2, 1], {}),
        ("padded_batch", tg[:2], [6, 5, 3], [3, 2, 1], {}),
        ("concat_size", _concat(tg, [3, 2, 1])[:-1], [6, 5, 3], [3, 2, 1], {}),
        ("targets_3d", tg[None], [6, 5, 3], [3, 2, 1], {}),
        ("reduction", tg, [6, 5, 3], [3, 2, 1], {"reduction": "avg"}),
        ("int_lengths", tg, 6, 3, {}),
    ]
    for name, t, il, tl, kw in bad:
        yield Sample((_log_probs(rng, (T, N, C), dt), t, il, tl), kw, grad_args=(0,),
                     name=name)
    yield Sample((_log_probs(rng, (T, N, C, 1), dt), tg, [6, 5, 3], [3, 2, 1]), {},
                 grad_args=(0,), name="log_probs_4d")
    yield Sample((_log_probs(rng, (T,), dt), tg, [6, 5, 3], [3, 2, 1]), {},
                 grad_args=(0,), name="log_probs_1d")


def ctc_int_samples(rng, dt):
    if np.dtype(dt) == np.float32:
        yield Sample((rng.integers(-3, 0, (4, 2, 3)).astype(I64), np.array([[1], [2]], I64),
                      [4, 4], [1, 1]), {}, name="int_log_probs")


_COVERS = ("ctc_loss", "ctc_loss_backward")
register(
    OpInfo("ctc_loss", _ctc, ctc_samples, covers=_COVERS),
    # the lengths are data (read on the host, as in PyTorch): not on meta
    OpInfo("ctc_loss_tensor_lengths", _ctc, ctc_tensor_length_samples, covers=_COVERS,
           meta=False),
    OpInfo("ctc_loss_raw", _ctc_raw, ctc_raw_samples, covers=_COVERS, gradcheck=False),
    OpInfo("ctc_loss_int", _ctc_raw, ctc_int_samples, covers=_COVERS, differentiable=False),
)
