"""Embedding ops: ``embedding``, its gradient ``embedding_backward`` and the in-place
``embedding_renorm``.

``embedding`` gathers rows; ``embedding_backward`` sums rows per index with one
sparse-dense product (padding rows get nothing, ``scale_grad_by_freq`` divides by counts),
and its own gradient is ``embedding`` again. ``embedding_renorm`` rescales rows in place.

>>> import tessera
>>> from tessera.ops.embedding import embedding
>>> embedding(tessera.eye(3), tessera.tensor([2, 0])).tolist()
[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch, dispatch_inplace
from tessera._tensor import Tensor
from tessera.ops import _jax, _relax, cost
from tessera.ops.activation import tname
from tessera.ops.registry import Meta, defop
from tessera.sbp import SbpRule, Signature, broadcast as B, partial_sum as P, split as S

__all__: list[str] = []


def _check_indices(idx, op: str) -> None:
    if idx.dtype not in (D.int64, D.int32):
        raise RuntimeError(f"Expected tensor for argument #1 'indices' to have one of the "
                           f"following scalar types: Long, Int; but got "
                           f"torch.{tname(idx.dtype)}Tensor instead (while checking "
                           f"arguments for {op})")


def _embedding_infer(weight, indices, padding_idx=-1, scale_grad_by_freq=False):
    if len(weight.shape) != 2:
        raise RuntimeError("'weight' must be 2-D")
    _check_indices(indices, "embedding")
    return Meta(tuple(indices.shape) + (weight.shape[1],), weight.dtype)


def _embedding_kernel(weight, indices, padding_idx=-1, scale_grad_by_freq=False):
    if indices.size and (indices.min() < 0 or indices.max() >= weight.shape[0]):
        raise IndexError("index out of range in self")
    return np.take(weight, indices, axis=0)


def _embedding_grad(ctx, g):
    weight, indices = ctx.inputs
    if not ctx.needs_input_grad[0]:
        return None, None
    return embedding_backward(g, indices, num_weights=weight.shape[0], **ctx.attrs), None


def _embedding_sbp(weight, indices, **attrs):
    """Indices split on any dim, or the embedding dim split (weight S(1)); linear in the
    weight."""
    n = len(indices.shape)
    return [Signature((B, S(d)), (S(d),)) for d in range(n)] + \
        [Signature((S(1), B), (S(n),)), Signature((B, B), (B,)), Signature((P, B), (P,))]


_EMBEDDING = defop("embedding", _embedding_infer, _embedding_kernel, grad=_embedding_grad,
                   sbp=SbpRule(_embedding_sbp), cost=cost.movement(),
                   to_relax=_relax.embedding,
                   to_jax=lambda jnp, lax, a, at: jnp.take(a[0], a[1], axis=0))


def embedding(weight: Tensor, indices: Tensor, *, padding_idx: int = -1,
              scale_grad_by_freq: bool = False) -> Tensor:
    """Rows of ``weight`` at ``indices`` (shape ``indices.shape + (D,)``); the attrs shape
    only the gradient (``padding_idx`` < 0 means none)."""
    return dispatch(_EMBEDDING, weight, indices, padding_idx=int(padding_idx),
                    scale_grad_by_freq=bool(scale_grad_by_freq))


def _backward_infer(g, indices, num_weights, padding_idx, scale_grad_by_freq):
    _check_indices(indices, "embedding_backward")
    return Meta((num_weights, g.shape[-1]), g.dtype)


def _row_weights(idx: np.ndarray, num_weights: int, padding_idx: int, freq: bool, dt):
    """What each looked-up row contributes to its weight row's gradient."""
    if freq:
        w = (1.0 / np.bincount(idx, minlength=num_weights)[idx]).astype(dt)
    else:
        w = np.ones(idx.shape, dt)
    if padding_idx >= 0:
        w[idx == padding_idx] = 0
    return w


def _backward_kernel(g, indices, num_weights, padding_idx, scale_grad_by_freq):
    import scipy.sparse  # lazily: only the embedding gradient needs it
    d = g.shape[-1]
    g2 = g.reshape(-1, d)
    ct = np.float32 if g.dtype.itemsize < 4 else g.dtype   # scipy has no half types
    idx = indices.reshape(-1).astype(np.int64)
    n = idx.size
    w = _row_weights(idx, num_weights, padding_idx, scale_grad_by_freq, ct)
    # row n of the (n, V) matrix holds weight w[n] at column idx[n]; its transpose sums
    m = scipy.sparse.csr_matrix((w, idx, np.arange(n + 1)), shape=(n, num_weights))
    return np.asarray(m.T @ g2.astype(ct, copy=False)).astype(g.dtype, copy=False)


def _backward_grad(ctx, gg):
    g, indices = ctx.inputs
    if not ctx.needs_input_grad[0]:
        return None, None
    a = ctx.attrs
    rows = embedding(gg, indices)
    if a["padding_idx"] >= 0 or a["scale_grad_by_freq"]:
        rows = rows * _row_factor(indices, a["num_weights"], a["padding_idx"],
                                  a["scale_grad_by_freq"], gg.dtype)
    return rows, None


def _row_factor(indices: Tensor, num_weights: int, padding_idx: int, freq: bool, dt):
    """``_row_weights`` as a tessera tensor of shape ``indices.shape + (1,)``."""
    from tessera.ops.creation import ones, zeros
    flat = indices.reshape(-1)
    w = ones(flat.shape, dtype=dt)
    if freq:
        counts = zeros((num_weights,), dtype=dt).index_add(0, flat, w)
        w = w / counts.index_select(0, flat)
    if padding_idx >= 0:
        w = w * (flat != padding_idx).to(dt)
    return w.reshape(tuple(indices.shape) + (1,))


def _backward_sbp(g, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The embedding dim split; or g and the indices split alike, each rank summing its
    rows into a partial gradient (not with ``scale_grad_by_freq``: the counts would need
    the whole batch)."""
    n = len(indices.shape)
    sigs = [Signature((S(n), B), (S(1),)), Signature((B, B), (B,)), Signature((P, B), (P,))]
    if not scale_grad_by_freq:
        sigs += [Signature((S(d), S(d)), (P,)) for d in range(n)]
    return sigs


def _backward_cost(ins, outs, **attrs) -> cost.Cost:
    """A multiply-add per element of g (its row's weight, then the sum into its row)."""
    return cost.Cost(2 * cost.numel(ins[0]), *cost.io(ins, outs))


_EMBEDDING_BACKWARD = defop("embedding_backward", _backward_infer, _backward_kernel,
                            grad=_backward_grad, sbp=SbpRule(_backward_sbp),
                            cost=_backward_cost,
                            to_relax=_relax.embedding_backward, to_jax=_jax.embedding_backward)


def embedding_backward(g: Tensor, indices: Tensor, *, num_weights: int, padding_idx: int,
                       scale_grad_by_freq: bool) -> Tensor:
    """The gradient of ``embedding`` with respect to its weight."""
    return dispatch(_EMBEDDING_BACKWARD, g, indices, num_weights=int(num_weights),
                    padding_idx=int(padding_idx), scale_grad_by_freq=bool(scale_grad_by_freq))


# ---- embedding_renorm (in place, no gradient) -------------------------------------------

def _renorm_infer(weight, indices, max_norm, norm_type):
    if len(weight.shape) != 2:
        raise RuntimeError("'weight' must be 2-D")
    _check_indices(indices, "embedding_renorm_")
    return Meta(weight.shape, weight.dtype)


def _renorm_rows(w: np.ndarray, indices: np.ndarray, max_norm, norm_type) -> None:
    if indices.size and (indices.min() < 0 or indices.max() >= w.shape[0]):
        raise IndexError("index out of range in self")
    rows = np.unique(indices)
    sel = w[rows].astype(np.float64)
    norms = np.linalg.norm(sel, ord=norm_type, axis=1) if sel.size else np.zeros(0)
    big = norms > max_norm
    scale = max_norm / (norms[big] + 1e-7)
    w[rows[big]] = (sel[big] * scale[:, None]).astype(w.dtype)


def _renorm_kernel(weight, indices, max_norm, norm_type):
    out = weight.copy()
    _renorm_rows(out, indices, max_norm, norm_type)
    return out


def _renorm_inplace(t, weight, indices, max_norm, norm_type):
    _renorm_rows(t, indices, max_norm, norm_type)


def _renorm_cost(ins, outs, **attrs) -> cost.Cost:
    """Per looked-up row element: its norm's power and sum (2) and the rescaling (1)."""
    weight, indices = ins[:2]
    return cost.Cost(3 * cost.numel(indices) * max(int(weight.shape[1]), 0),
                     *cost.io(ins, outs))


# (each rank would need whole rows' norms and the rows of every index: whole only)
_EMBEDDING_RENORM = defop("embedding_renorm", _renorm_infer, _renorm_kernel, grad=None,
                          save=(), inplace_kernels={"cpu": _renorm_inplace},
                          sbp=SbpRule(lambda w, indices, **attrs: [Signature((B, B), (B,))]),
                          cost=_renorm_cost)


def embedding_renorm_(weight: Tensor, indices: Tensor, max_norm: float,
                      norm_type: float) -> Tensor:
    """Rescale, in place, the rows of ``weight`` named in ``indices`` whose ``norm_type``
    norm exceeds ``max_norm`` to norm ``max_norm`` (PyTorch's ``embedding_renorm_``)."""
    return dispatch_inplace(_EMBEDDING_RENORM, weight, weight, indices,
                            max_norm=float(max_norm), norm_type=float(norm_type))
