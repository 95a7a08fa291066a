"""AdamW: Adam with decoupled weight decay (Loshchilov & Hutter), default decay 0.01.

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(2))
>>> opt = tessera.optim.AdamW([w], lr=0.1)
>>> (w * w).sum().backward(); opt.step(); w.detach()
tensor([0.8990, 0.8990])
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.optim.adam import Adam

__all__ = ["AdamW"]


class AdamW(Adam):
    """``torch.optim.AdamW``: ``p *= 1 - lr * weight_decay`` before the Adam update."""

    def __init__(self, params, lr: float | Tensor = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True
