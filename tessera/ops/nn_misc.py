"""Ops of the nn layer that are not arithmetic families: dropout and embeddings.

``dropout`` draws its mask from a seed attribute instead of saving it: the backward (the
same op on the gradient, since dropout is linear in its input) regenerates the identical
mask, so dropout keeps nothing alive between forward and backward (like a counter-based RNG;
the seed itself comes from a ``tessera.Generator``, so seeded programs reproduce).

``embedding`` gathers rows; its gradient ``embedding_backward`` sums rows per index with one
sparse-dense product (padding rows get nothing, ``scale_grad_by_freq`` divides by counts),
and its own gradient is ``embedding`` again. ``embedding_renorm`` rescales rows in place.

>>> import tessera
>>> from tessera.ops.nn_misc import embedding
>>> embedding(tessera.eye(3), tessera.tensor([2, 0])).tolist()
[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch, dispatch_inplace
from tessera._tensor import Tensor
from tessera.ops.registry import Meta, defop

__all__: list[str] = []

# SELU's negative saturation value (-scale * alpha): where alpha dropout sends dropped units
ALPHA = 1.7580993408473766
_SNAME = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
          "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
          "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}


# ---- dropout -----------------------------------------------------------------------------

def _keep_mask(seed: int, shape, p: float) -> np.ndarray:
    """True with probability 1 - p, a pure function of ``seed``."""
    u = np.random.Generator(np.random.PCG64(seed)).random(tuple(shape), dtype=np.float32)
    return u >= np.float32(p)


def _dropout_infer(x, p, seed, mask_shape, scale, alpha_shift):
    if x.dtype.category < 2:
        raise RuntimeError(f"result type Float can't be cast to the desired output type "
                           f"{_SNAME[x.dtype.name]}")
    return Meta(x.shape, x.dtype)


def _dropout_kernel(x, p, seed, mask_shape, scale, alpha_shift):
    out = np.empty(x.shape, x.dtype)
    _dropout_into(out, x, p, seed, mask_shape, scale, alpha_shift)
    return out


def _dropout_into(out, x, p, seed, mask_shape, scale, alpha_shift):
    keep = _keep_mask(seed, mask_shape, p)
    np.multiply(x, keep, out=out)
    out *= out.dtype.type(scale)
    if alpha_shift:  # dropped units go to -alpha * scale, then every unit shifts
        a = scale
        b = keep.astype(out.dtype)
        b -= 1
        b *= ALPHA * a
        b += ALPHA * a * p
        out += b


def _dropout_inplace(t, x, p, seed, mask_shape, scale, alpha_shift):
    _dropout_into(t, x, p, seed, mask_shape, scale, alpha_shift)


def _dropout_grad(ctx, g):
    a = dict(ctx.attrs)
    a["alpha_shift"] = False  # the shift is a constant: the gradient is the masked scale
    return (dispatch(_DROPOUT, g, **a),)


_DROPOUT = defop("dropout", _dropout_infer, _dropout_kernel, grad=_dropout_grad, save=(),
                 inplace_kernels={"cpu": _dropout_inplace})


def dropout(x: Tensor, *, p: float, seed: int, mask_shape, scale: float,
            alpha_shift: bool = False, inplace: bool = False) -> Tensor:
    """``x * keep * scale`` (``+ shift`` for alpha dropout) with ``keep`` drawn from
    ``seed`` in ``mask_shape`` (which broadcasts against ``x``: per-channel masks for
    feature dropout)."""
    attrs = dict(p=float(p), seed=int(seed), mask_shape=tuple(mask_shape), scale=float(scale),
                 alpha_shift=bool(alpha_shift))
    if inplace:
        return dispatch_inplace(_DROPOUT, x, x, **attrs)
    return dispatch(_DROPOUT, x, **attrs)


# ---- embedding ---------------------------------------------------------------------------

def _check_indices(idx, op: str) -> None:
    if idx.dtype not in (D.int64, D.int32):
        raise RuntimeError(f"Expected tensor for argument #1 'indices' to have one of the "
                           f"following scalar types: Long, Int; but got "
                           f"torch.{_SNAME[idx.dtype.name]}Tensor instead (while checking "
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


_EMBEDDING = defop("embedding", _embedding_infer, _embedding_kernel, grad=_embedding_grad)


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


_EMBEDDING_BACKWARD = defop("embedding_backward", _backward_infer, _backward_kernel,
                            grad=_backward_grad)


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


_EMBEDDING_RENORM = defop("embedding_renorm", _renorm_infer, _renorm_kernel, grad=None,
                          save=(), inplace_kernels={"cpu": _renorm_inplace})


def embedding_renorm_(weight: Tensor, indices: Tensor, max_norm: float,
                      norm_type: float) -> Tensor:
    """Rescale, in place, the rows of ``weight`` named in ``indices`` whose ``norm_type``
    norm exceeds ``max_norm`` to norm ``max_norm`` (PyTorch's ``embedding_renorm_``)."""
    return dispatch_inplace(_EMBEDDING_RENORM, weight, weight, indices,
                            max_norm=float(max_norm), norm_type=float(norm_type))
