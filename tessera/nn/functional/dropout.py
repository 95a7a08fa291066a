"""Dropout: element-wise, per channel (1d/2d/3d), and the SELU-preserving alpha variants.

All are the one ``dropout`` op of ``tessera.ops.dropout`` with a different mask shape and
scale. Like PyTorch, ``training=False`` or ``p == 0`` returns ``input`` itself, ``p == 1``
multiplies by zero, and masks come from the default generator (``tessera.manual_seed``).

>>> import tessera
>>> import tessera.nn.functional as F
>>> x = tessera.ones(4)
>>> F.dropout(x, 0.5, training=False) is x
True
"""
from __future__ import annotations

import math
import warnings

from tessera._tensor import Tensor
from tessera.ops import dropout as _dropout_op
from tessera.ops._util import ensure_tensor
from tessera.ops.random import fresh_seed

__all__ = ["dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
           "feature_alpha_dropout"]


def _check_p(p: float) -> None:
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _apply(input: Tensor, p: float, training: bool, inplace: bool, feature: bool | None,
           alpha: bool) -> Tensor:
    """PyTorch's ``_dropout_impl``: the identity when off, ``x * 0`` when ``p == 1``.
    ``feature``: None for element-wise masks, else whether dim 0 is a batch dim."""
    if p == 0 or not training or input.numel() == 0:
        return input
    mask_shape = tuple(input.shape) if feature is None else _feature_shape(input, feature)
    if p == 1:
        scale, shift = 0.0, False
    elif alpha:
        scale = 1.0 / math.sqrt((_dropout_op.ALPHA ** 2 * p + 1) * (1 - p))
        shift = True
    else:
        scale, shift = 1.0 / (1.0 - p), False
    return _dropout_op.dropout(input, p=p, seed=fresh_seed(), mask_shape=mask_shape, scale=scale,
                           alpha_shift=shift, inplace=inplace)


def _feature_shape(input: Tensor, batched: bool) -> tuple[int, ...]:
    """One mask entry per (sample, channel), broadcast over the feature map; an unbatched
    input is one sample."""
    if input.dim() + (0 if batched else 1) < 2:
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    lead = 2 if batched else 1
    return tuple(input.shape[:lead]) + (1,) * (input.dim() - lead)


def dropout(input: Tensor, p: float = 0.5, training: bool = True,
            inplace: bool = False) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``."""
    ensure_tensor("dropout", input)
    _check_p(p)
    return _apply(input, p, training, inplace, None, False)


def alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False,
                  inplace: bool = False) -> Tensor:
    """Dropout for SELU networks: dropped units take SELU's saturation value and an
    affine correction keeps the mean and variance."""
    ensure_tensor("alpha_dropout", input)
    _check_p(p)
    return _apply(input, p, training, inplace, None, True)


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True,
              inplace: bool = False) -> Tensor:
    """Zero whole channels of ``(N, C, L)`` or ``(C, L)`` inputs."""
    ensure_tensor("dropout1d", input)
    _check_p(p)
    if input.dim() not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a "
                           f"{input.dim()}D input. Note that dropout1d exists to provide "
                           "channel-wise dropout on inputs with 1 spatial dimension, a channel "
                           "dimension, and an optional batch dimension (i.e. 2D or 3D inputs).")
    return _apply(input, p, training, inplace, input.dim() == 3, False)


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True,
              inplace: bool = False) -> Tensor:
    """Zero whole channels of ``(N, C, H, W)`` inputs (a 3-d input is read as (N, C, L),
    with PyTorch's warning)."""
    ensure_tensor("dropout2d", input)
    _check_p(p)
    nd = input.dim()
    if nd not in (3, 4):
        warnings.warn(f"dropout2d: Received a {nd}-D input to dropout2d, which is deprecated "
                      "and will result in an error in a future release. To retain the behavior "
                      "and silence this warning, please use dropout instead. Note that "
                      "dropout2d exists to provide channel-wise dropout on inputs with 2 "
                      "spatial dimensions, a channel dimension, and an optional batch "
                      "dimension (i.e. 3D or 4D inputs).", stacklevel=2)
    if nd == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that "
                      "channel-wise 1D dropout behavior is desired - input is interpreted as "
                      "shape (N, C, L), where C is the channel dim. This behavior will change "
                      "in a future release to interpret the input as one without a batch "
                      "dimension, i.e. shape (C, H, W). To maintain the 1D channel-wise "
                      "dropout behavior, please switch to using dropout1d instead.",
                      stacklevel=2)
    return _apply(input, p, training, inplace, True, False)


def dropout3d(input: Tensor, p: float = 0.5, training: bool = True,
              inplace: bool = False) -> Tensor:
    """Zero whole channels of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` inputs."""
    ensure_tensor("dropout3d", input)
    _check_p(p)
    nd = input.dim()
    if nd not in (4, 5):
        warnings.warn(f"dropout3d: Received a {nd}-D input to dropout3d, which is deprecated "
                      "and will result in an error in a future release. To retain the behavior "
                      "and silence this warning, please use dropout instead. Note that "
                      "dropout3d exists to provide channel-wise dropout on inputs with 3 "
                      "spatial dimensions, a channel dimension, and an optional batch "
                      "dimension (i.e. 4D or 5D inputs).", stacklevel=2)
    return _apply(input, p, training, inplace, nd == 5, False)


def feature_alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False,
                          inplace: bool = False) -> Tensor:
    """Alpha dropout of whole channels."""
    ensure_tensor("feature_alpha_dropout", input)
    _check_p(p)
    return _apply(input, p, training, inplace, True, True)
