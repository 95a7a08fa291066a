"""Connectionist temporal classification: the ``ctc_loss`` op and its backward op.

    ctc_loss(log_probs, targets)              -> (N,) negative log likelihoods
        grad: ctc_loss_backward(g, log_probs, targets)
    ctc_loss_backward(g, log_probs, targets)  -> (T, N, C); no derivative (as in PyTorch)

``log_probs`` is (T, N, C); ``targets`` is (N, S) padded or the (sum of target lengths,)
concatenation; the lengths, ``blank`` and ``zero_infinity`` are attrs. The kernels follow
Graves et al. (2006) in log space, vectorised over the batch and the extended label
sequence: the forward (alpha) recursion and the backward (beta) recursion loop over time
only. Like PyTorch's, the gradient is eq. 16 of the paper, ``exp(lp) - exp(lcab + nll - lp)``,
the gradient with respect to the logits under the log_softmax that ``log_probs`` is
documented to come from: it differs from the derivative with respect to ``log_probs`` by
``exp(lp)``, which log_softmax's backward cancels.
Argument handling (unbatched input, length lists or tensors, reductions) lives in
``tessera.nn.functional.ctc_loss``.

>>> import tessera
>>> from tessera.ops.ctc import ctc_loss
>>> lp = tessera.full((2, 1, 2), 0.5).log()
>>> ctc_loss(lp, tessera.tensor([[1]]), input_lengths=(2,), target_lengths=(1,))
tensor([0.2877])
"""
from __future__ import annotations

import numpy as np

from tessera._dispatch import dispatch
from tessera.ops import cost
from tessera.ops._util import call
from tessera.ops.activation import need_tensor, tname
from tessera.ops.registry import Meta, defop
from tessera.sbp import (
    SbpRule,
    Signature,
    broadcast as B,
    communicator,
    partial_sum as P,
    split as S,
    split_range,
)

__all__: list[str] = []

_FROM = " (while checking arguments for ctc_loss_allocate_outputs)"


# ---- checks (PyTorch's, in its order) ----------------------------------------------------------

def _check(lp, tg, input_lengths, target_lengths, blank):
    need_tensor("ctc_loss", lp, "log_probs")
    need_tensor("ctc_loss", tg, "targets", 2)
    if lp.dtype.name not in ("float32", "float64"):
        raise NotImplementedError(f"\"ctc_loss_cpu\" not implemented for '{tname(lp.dtype)}'")
    if len(lp.shape) != 3:
        raise RuntimeError(f"Expected 3-dimensional tensor, but got {len(lp.shape)}-dimensional "
                           f"tensor for argument #1 'log_probs'{_FROM}")
    if not 1 <= len(tg.shape) <= 2:
        raise RuntimeError(f"Expected 1 to 2 dimensions, but got {len(tg.shape)}-dimensional "
                           f"tensor for argument #2 'targets'{_FROM}")
    T, N, C = lp.shape
    if T * N * C == 0:
        raise RuntimeError("log_probs tensor must not be empty")
    if not 0 <= blank < C:
        raise RuntimeError("blank must be in label range")
    if len(input_lengths) != N:
        raise RuntimeError("input_lengths must be of size batch_size")
    if len(target_lengths) != N:
        raise RuntimeError("target_lengths must be of size batch_size")
    for n in target_lengths:
        if n < 0:
            raise RuntimeError(f"Expected target_lengths to have value at least 0, but got "
                               f"value {n}{_FROM}")
    if len(tg.shape) == 1:
        want = sum(target_lengths)
        if tg.shape[0] != want:
            raise RuntimeError(f"Expected tensor to have size {want} at dimension 0, but got "
                               f"size {tg.shape[0]} for argument #2 'targets'{_FROM}")
    else:
        if tg.shape[0] != N:
            raise RuntimeError(f"Expected tensor to have size {N} at dimension 0, but got size "
                               f"{tg.shape[0]} for argument #2 'targets'{_FROM}")
        longest = max(target_lengths, default=0)
        if tg.shape[1] < longest:
            raise RuntimeError(f"Expected tensor to have size at least {longest} at dimension "
                               f"1, but got size {tg.shape[1]} for argument #2 'targets'{_FROM}")
    for n in input_lengths:
        if n < 0:
            raise RuntimeError(f"Expected input_lengths to have value at least 0, but got "
                               f"value {n}{_FROM}")
        if n > T:
            raise RuntimeError(f"Expected input_lengths to have value at most {T}, but got "
                               f"value {n}{_FROM}")


def _ctc_infer(lp, tg, input_lengths, target_lengths, blank=0, zero_infinity=False):
    _check(lp, tg, input_lengths, target_lengths, blank)
    return Meta((lp.shape[1],), lp.dtype)


def _ctc_backward_infer(g, lp, tg, input_lengths, target_lengths, blank=0, zero_infinity=False):
    _check(lp, tg, input_lengths, target_lengths, blank)
    return Meta(lp.shape, lp.dtype)


# ---- the recursions ----------------------------------------------------------------------------

def _extended(lp, tg, input_lengths, target_lengths, blank):
    """The extended label sequences l' (blank, l1, blank, l2, ..., blank) as (N, 2S+1) class
    indices, the log probabilities along them (T, N, 2S+1; -inf past a sequence's 2L+1
    labels), and where a label may be reached from two places back (l'_s != blank and
    l'_s != l'_{s-2})."""
    T, N, C = lp.shape
    lengths = np.asarray(target_lengths, np.int64).reshape(N)
    S = int(lengths.max(initial=0))
    pos = np.arange(S)
    inside = pos[None, :] < lengths[:, None]                      # (N, S)
    tg = np.asarray(tg)
    if tg.ndim == 1:                                              # concatenated targets
        start = np.cumsum(lengths) - lengths
        idx = np.minimum(start[:, None] + pos[None, :], max(tg.shape[0] - 1, 0))
        labels = tg[idx] if tg.size else np.zeros((N, S), np.int64)
    else:
        labels = tg[:, :S]
    labels = np.where(inside, labels, blank).astype(np.int64)
    bad = (labels < 0) | (labels >= C)
    if bad.any():
        raise RuntimeError(f"ctc_loss: target value {labels[bad][0]} is out of bounds for "
                           f"{C} classes")
    ext = np.full((N, 2 * S + 1), blank, np.int64)
    ext[:, 1::2] = labels
    lpl = np.take_along_axis(lp, np.broadcast_to(ext[None], (T,) + ext.shape), axis=2)
    valid = np.arange(2 * S + 1)[None, :] < 2 * lengths[:, None] + 1
    lpl = np.where(valid[None], lpl, -np.inf).astype(lp.dtype, copy=False)
    skip = np.zeros(ext.shape, bool)
    skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
    return ext, lpl, skip, lengths


def _lse3(a, b, c):
    """log(exp(a) + exp(b) + exp(c)), elementwise and stable (all -inf gives -inf)."""
    m = np.maximum(np.maximum(a, b), c)
    m = np.where(np.isfinite(m), m, 0)
    return np.log(np.exp(a - m) + np.exp(b - m) + np.exp(c - m)) + m


def _shift(x, k, neg):
    """``x`` moved ``k`` places along the last axis (right for k > 0), -inf filled."""
    out = np.full_like(x, neg)
    if k > 0:
        out[..., k:] = x[..., :-k]
    else:
        out[..., :k] = x[..., -k:]
    return out


def _alpha(lpl, skip):
    """log alpha (T, N, S'): the forward variables, including the step's own probability."""
    T = lpl.shape[0]
    alpha = np.full(lpl.shape, -np.inf, lpl.dtype)
    alpha[0, :, :2] = lpl[0, :, :2]
    for t in range(1, T):
        a = alpha[t - 1]
        two = np.where(skip, _shift(a, 2, -np.inf), -np.inf)
        alpha[t] = _lse3(a, _shift(a, 1, -np.inf), two) + lpl[t]
    return alpha


def _log_likelihood(alpha, input_lengths, lengths):
    """log p(l | x) of each sequence: its last two alphas at its own last time step."""
    N = alpha.shape[1]
    T_b = np.asarray(input_lengths, np.int64).reshape(N)
    rows = np.arange(N)
    last = alpha[np.maximum(T_b - 1, 0), rows]                    # (N, S')
    end = last[rows, 2 * lengths]
    before = np.where(lengths > 0, last[rows, np.maximum(2 * lengths - 1, 0)], -np.inf)
    ll = np.logaddexp(end, before)
    # no time steps: only the empty target has an alignment (the empty one, probability 1)
    return np.where(T_b == 0, np.where(lengths == 0, 0.0, -np.inf), ll).astype(alpha.dtype)


def _beta(lpl, skip, input_lengths, lengths):
    """log beta (T, N, S'), including the step's own probability; -inf from each sequence's
    own length on."""
    T, N, Sx = lpl.shape
    T_b = np.asarray(input_lengths, np.int64).reshape(N)
    beta = np.full(lpl.shape, -np.inf, lpl.dtype)
    s = np.arange(Sx)[None, :]
    ends = (s == 2 * lengths[:, None]) | (s == 2 * lengths[:, None] - 1)   # (N, S')
    skip_from = _shift(skip, -2, False)          # s -> s + 2 allowed
    for t in range(T - 1, -1, -1):
        init = np.where(ends, lpl[t], -np.inf)
        if t < T - 1:
            b = beta[t + 1]
            two = np.where(skip_from, _shift(b, -2, -np.inf), -np.inf)
            rec = _lse3(b, _shift(b, -1, -np.inf), two) + lpl[t]
        else:
            rec = init
        beta[t] = np.where((T_b == t + 1)[:, None], init,
                           np.where((t + 1 < T_b)[:, None], rec, -np.inf))
    return beta


# ---- kernels -----------------------------------------------------------------------------------

def _ctc_kernel(lp, tg, input_lengths, target_lengths, blank=0, zero_infinity=False):
    with np.errstate(all="ignore"):
        _, lpl, skip, lengths = _extended(lp, tg, input_lengths, target_lengths, blank)
        return -_log_likelihood(_alpha(lpl, skip), input_lengths, lengths)


def _ctc_backward_kernel(g, lp, tg, input_lengths, target_lengths, blank=0,
                         zero_infinity=False):
    T, N, C = lp.shape
    with np.errstate(all="ignore"):
        ext, lpl, skip, lengths = _extended(lp, tg, input_lengths, target_lengths, blank)
        alpha = _alpha(lpl, skip)
        nll = -_log_likelihood(alpha, input_lengths, lengths)
        ab = alpha + _beta(lpl, skip, input_lengths, lengths)     # (T, N, S')
        # lcab[t, b, c] = log sum over s with l'_s = c of alpha beta: one bincount
        m = ab.max(axis=2, keepdims=True, initial=-np.inf)
        m = np.where(np.isfinite(m), m, 0)
        where = (np.arange(T)[:, None, None] * N + np.arange(N)[None, :, None]) * C + ext[None]
        acc = np.bincount(where.ravel(), weights=np.exp(ab - m).ravel(), minlength=T * N * C)
        lcab = np.log(acc.reshape(T, N, C)).astype(lp.dtype) + m
        grad = np.exp(lp) - np.exp(lcab + nll[None, :, None] - lp)
        grad *= np.asarray(g)[None, :, None]
        T_b = np.asarray(input_lengths, np.int64).reshape(N)
        keep = np.arange(T)[:, None] < T_b[None, :]                # (T, N)
        if zero_infinity:
            keep &= ~np.isinf(nll)[None, :]
        grad[~keep] = 0
    return grad


def _ctc_grad(ctx, g):
    lp, tg = ctx.inputs
    return ctc_loss_backward(g, lp, tg, **ctx.attrs), None


# ---- sbp and cost rules ------------------------------------------------------------------------

def _ctc_local(op, args, attrs, metas, group):
    """A tile of the batch: its own sequences' lengths (the attrs hold the whole batch's)."""
    n = len(attrs["input_lengths"])
    lo, hi = split_range(n, len(group), group.index(communicator().rank))
    return dispatch(op, *args, **dict(attrs, input_lengths=attrs["input_lengths"][lo:hi],
                                      target_lengths=attrs["target_lengths"][lo:hi]))


def _ctc_sbp(lp, tg, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """Per-sequence losses: the batch split ((T, N, C) log-probs on dim 1, padded (N, S)
    targets on dim 0; concatenated 1-D targets stay whole)."""
    sigs = [Signature((B, B), (B,))]
    if len(tg.shape) == 2:
        sigs.insert(0, Signature((S(1), S(0)), (S(0),), _ctc_local))
    return sigs


def _ctc_backward_sbp(g, lp, tg, input_lengths, target_lengths, blank=0,
                      zero_infinity=False):
    sigs = [Signature((B, B, B), (B,)), Signature((P, B, B), (P,))]  # linear in g
    if len(tg.shape) == 2:
        sigs.insert(0, Signature((S(0), S(1), S(0)), (S(1),), _ctc_local))
    return sigs


# operations per (time step, sequence, extended label) of one recursion: the stable
# three-term log-sum-exp (two maxima, three subtractions, three exps, two adds, a log, the
# max added back) and the step's own log probability added
_RECURSION = 13


def _lattice(lp: Meta, target_lengths) -> int:
    """Positions of the alignment lattice: (T, N, 2S+1) for the longest target S."""
    return cost.numel(lp) // max(lp.shape[2], 1) * (2 * max(target_lengths, default=0) + 1)


def _ctc_cost(ins, outs, target_lengths, **attrs) -> cost.Cost:
    return cost.Cost(_RECURSION * _lattice(ins[0], target_lengths), *cost.io(ins, outs))


def _ctc_backward_cost(ins, outs, target_lengths, **attrs) -> cost.Cost:
    """Both recursions and alpha * beta summed per class (3 per lattice position), then
    eq. 16 per (T, N, C) element (two exps, a log, three adds, the cotangent's product)."""
    n = _lattice(ins[1], target_lengths)
    return cost.Cost((2 * _RECURSION + 3) * n + 7 * cost.numel(ins[1]), *cost.io(ins, outs))


_CTC = defop("ctc_loss", _ctc_infer, _ctc_kernel, grad=_ctc_grad, sbp=SbpRule(_ctc_sbp),
             cost=_ctc_cost)
# PyTorch has no derivative of its ctc backward either: a second backward raises
_CTC_BACKWARD = defop("ctc_loss_backward", _ctc_backward_infer, _ctc_backward_kernel,
                      sbp=SbpRule(_ctc_backward_sbp), cost=_ctc_backward_cost)


def ctc_loss(log_probs, targets, input_lengths: tuple, target_lengths: tuple, blank: int = 0,
             zero_infinity: bool = False):
    """Per-sequence negative log likelihoods (N,) of (T, N, C) ``log_probs``; no reduction,
    no zeroing of infinite losses (``zero_infinity`` only zeroes their gradients)."""
    return call(_CTC, log_probs, targets, input_lengths=tuple(input_lengths),
                target_lengths=tuple(target_lengths), blank=blank, zero_infinity=zero_infinity)


def ctc_loss_backward(grad, log_probs, targets, input_lengths: tuple, target_lengths: tuple,
                      blank: int = 0, zero_infinity: bool = False):
    """The gradient of :func:`ctc_loss` for the per-sequence cotangent ``grad`` (N,)."""
    return call(_CTC_BACKWARD, grad, log_probs, targets, input_lengths=tuple(input_lengths),
                target_lengths=tuple(target_lengths), blank=blank, zero_infinity=zero_infinity)
