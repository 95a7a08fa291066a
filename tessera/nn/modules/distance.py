"""Distance modules: ``PairwiseDistance`` and ``CosineSimilarity`` (PyTorch's arguments).

>>> import tessera
>>> import tessera.nn as nn
>>> nn.CosineSimilarity(dim=0)(tessera.tensor([1., 0.]), tessera.tensor([1., 0.]))
tensor(1.)
"""
from __future__ import annotations

from tessera.nn import functional as F
from tessera.nn.modules.module import Module

__all__ = ["PairwiseDistance", "CosineSimilarity"]


class PairwiseDistance(Module):
    """``||x1 - x2 + eps||_p`` over the last dimension."""

    def __init__(self, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> None:
        super().__init__()
        self.norm, self.eps, self.keepdim = p, eps, keepdim

    def forward(self, x1, x2):
        return F.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)


class CosineSimilarity(Module):
    """Cosine of the angle between ``x1`` and ``x2`` along ``dim``."""

    def __init__(self, dim: int = 1, eps: float = 1e-8) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1, x2):
        return F.cosine_similarity(x1, x2, self.dim, self.eps)
