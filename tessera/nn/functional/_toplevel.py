"""The neural-network functions PyTorch also has at top level (``torch.selu``,
``torch.cdist``, ``torch.kl_div``, ...), exported as ``tessera.<name>``; ``prelu`` and
``hardshrink`` are Tensor methods too (``x.prelu(w)``).

Each forwards to ``tessera.nn.functional``. Top-level loss functions take PyTorch's
reduction enum (0 none, 1 mean, 2 sum); as PyTorch 2.13's bindings do, they default to 0
(no reduction), unlike ``nn.functional``. (``tessera.softmax`` and ``log_softmax`` are the
ops themselves: ``tessera.ops.activation``.)

>>> import tessera
>>> tessera.kl_div(tessera.tensor([0.]), tessera.tensor([2.]))  # no reduction: 2 log 2
tensor([1.3863])
"""
from __future__ import annotations

from tessera.nn import functional as F
from tessera.nn.functional.distance import cdist as _cdist
from tessera.nn.functional.dropout import _apply as _dropout, _check_p
from tessera.ops._util import ensure_tensor

__all__ = ["relu_", "sigmoid_", "tanh_", "selu", "selu_", "celu", "celu_", "threshold",
           "threshold_", "hardshrink", "prelu", "rrelu", "rrelu_", "cosine_similarity",
           "pairwise_distance", "pdist", "cdist", "binary_cross_entropy_with_logits", "kl_div",
           "poisson_nll_loss", "margin_ranking_loss", "hinge_embedding_loss",
           "triplet_margin_loss", "cosine_embedding_loss", "dropout", "dropout_",
           "alpha_dropout", "alpha_dropout_", "feature_dropout", "feature_dropout_",
           "feature_alpha_dropout", "feature_alpha_dropout_"]

_REDUCTIONS = ("none", "mean", "sum")


def _reduction(enum) -> str:
    if isinstance(enum, bool) or not isinstance(enum, int):
        raise TypeError(f"argument 'reduction' must be int, not {type(enum).__name__}")
    if enum not in (0, 1, 2):
        raise ValueError(f"{enum} is not a valid value for reduction")
    return _REDUCTIONS[enum]


# torch.dropout(input, p, train) and its kin: nn.functional's, with ``train`` required
def dropout(input, p: float, train: bool):
    """``F.dropout(input, p, train)``.

    >>> import tessera
    >>> x = tessera.ones(3)
    >>> tessera.dropout(x, 0.5, False) is x, tessera.dropout_(x, 1.0, True).tolist()
    (True, [0.0, 0.0, 0.0])
    """
    return F.dropout(input, p, train)


def dropout_(input, p: float, train: bool):
    return F.dropout(input, p, train, inplace=True)


def alpha_dropout(input, p: float, train: bool):
    return F.alpha_dropout(input, p, train)


def alpha_dropout_(input, p: float, train: bool):
    return F.alpha_dropout(input, p, train, inplace=True)


def _feature(name: str, input, p: float, train: bool, inplace: bool, alpha: bool):
    ensure_tensor(name, input)
    _check_p(p)
    return _dropout(input, p, train, inplace, True, alpha)


def feature_dropout(input, p: float, train: bool):
    """Dropout of whole channels (dim 1) of a batched input of any rank >= 2."""
    return _feature("feature_dropout", input, p, train, False, False)


def feature_dropout_(input, p: float, train: bool):
    return _feature("feature_dropout_", input, p, train, True, False)


def feature_alpha_dropout(input, p: float, train: bool):
    return _feature("feature_alpha_dropout", input, p, train, False, True)


def feature_alpha_dropout_(input, p: float, train: bool):
    return _feature("feature_alpha_dropout_", input, p, train, True, True)


def relu_(input):
    return F.relu_(input)


def sigmoid_(input):
    return input.sigmoid_()


def tanh_(input):
    return input.tanh_()


def selu(input):
    return F.selu(input)


def selu_(input):
    return F.selu_(input)


def celu(input, alpha: float = 1.0):
    return F.celu(input, alpha)


def celu_(input, alpha: float = 1.0):
    return F.celu_(input, alpha)


def threshold(input, threshold: float, value: float, *, out=None):
    y = F.threshold(input, threshold, value)
    return y if out is None else out.copy_(y)


def threshold_(input, threshold: float, value: float):
    return F.threshold_(input, threshold, value)


def hardshrink(input, lambd: float = 0.5, *, out=None):
    y = F.hardshrink(input, lambd)
    return y if out is None else out.copy_(y)


def prelu(input, weight):
    return F.prelu(input, weight)


def rrelu(input, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False,
          generator=None):
    return F.rrelu(input, lower, upper, training)


def rrelu_(input, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False,
           generator=None):
    return F.rrelu_(input, lower, upper, training)


def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8, *, axis=None):
    dim = dim if axis is None else axis
    return F.cosine_similarity(x1, x2, dim, eps)


def pairwise_distance(x1, x2, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False, *,
                      keepdims=None):
    keepdim = keepdim if keepdims is None else keepdims
    return F.pairwise_distance(x1, x2, p, eps, keepdim)


def pdist(input, p: float = 2.0):
    return F.pdist(input, p)


def cdist(x1, x2, p: float = 2.0, compute_mode: str = "use_mm_for_euclid_dist_if_necessary"):
    return _cdist(x1, x2, p, compute_mode)


def binary_cross_entropy_with_logits(input, target, weight=None, pos_weight=None,
                                     reduction=0):
    return F.binary_cross_entropy_with_logits(input, target, weight,
                                                 reduction=_reduction(reduction),
                                                 pos_weight=pos_weight)


def kl_div(input, target, reduction=0, *, log_target: bool = False):
    return F.kl_div(input, target, reduction=_reduction(reduction), log_target=log_target)


def poisson_nll_loss(input, target, log_input: bool, full: bool, eps: float, reduction):
    return F.poisson_nll_loss(input, target, log_input, full, eps=eps,
                                 reduction=_reduction(reduction))


def margin_ranking_loss(input1, input2, target, margin: float = 0.0, reduction=0):
    return F.margin_ranking_loss(input1, input2, target, margin,
                                    reduction=_reduction(reduction))


def hinge_embedding_loss(input, target, margin: float = 1.0, reduction=0):
    return F.hinge_embedding_loss(input, target, margin, reduction=_reduction(reduction))


def triplet_margin_loss(anchor, positive, negative, margin: float = 1.0, p: float = 2,
                        eps: float = 1e-6, swap: bool = False, reduction=0):
    return F.triplet_margin_loss(anchor, positive, negative, margin, p, eps, swap,
                                    reduction=_reduction(reduction))


def cosine_embedding_loss(input1, input2, target, margin: float = 0.0, reduction=0):
    return F.cosine_embedding_loss(input1, input2, target, margin,
                                      reduction=_reduction(reduction))
