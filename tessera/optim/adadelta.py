"""Adadelta (Zeiler): per-coordinate step sizes from running averages of g^2 and dx^2.

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(2))
>>> opt = tessera.optim.Adadelta([w])
>>> (w * w).sum().backward(); opt.step(); w.detach()
tensor([0.9968, 0.9968])
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.optim.optimizer import Optimizer, _check_lr, _check_nonneg, _to_scalar

__all__ = ["Adadelta"]


class Adadelta(Optimizer):
    """``torch.optim.Adadelta``: ``v = rho v + (1-rho) g^2``,
    ``dx = sqrt(u + eps) / sqrt(v + eps) * g``, ``u = rho u + (1-rho) dx^2``, ``p -= lr dx``."""

    state_scalars = (("step", 0.0),)
    state_keys = ("square_avg", "acc_delta")
    group_defaults = {"foreach": None, "maximize": False, "differentiable": False,
                      "capturable": False}

    def __init__(self, params, lr: float | Tensor = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0, foreach: bool | None = None, *,
                 capturable: bool = False, maximize: bool = False,
                 differentiable: bool = False) -> None:
        _check_lr(lr)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        _check_nonneg(eps, "epsilon value")
        _check_nonneg(weight_decay, "weight_decay value")
        defaults = {"lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay,
                    "maximize": maximize, "capturable": capturable, "foreach": foreach,
                    "differentiable": differentiable}
        super().__init__(params, defaults)

    @staticmethod
    def _update(state: dict, param: Tensor, grad: Tensor, group: dict) -> None:
        lr = _to_scalar(group["lr"])
        rho, eps = group["rho"], group["eps"]
        square_avg, acc_delta = state["square_avg"], state["acc_delta"]
        state["step"] += 1
        if group["maximize"]:
            grad = -grad
        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
        std = square_avg.add(eps).sqrt_()
        delta = acc_delta.add(eps).sqrt_()
        delta.div_(std).mul_(grad)
        acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
        param.add_(delta, alpha=-lr)
