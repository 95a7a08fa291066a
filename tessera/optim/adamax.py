"""Adamax: Adam with the infinity norm in place of the second moment.

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(2))
>>> opt = tessera.optim.Adamax([w], lr=0.1)
>>> (w * w).sum().backward(); opt.step(); w.detach()
tensor([0.9000, 0.9000])
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.ops.arithmetic import maximum
from tessera.optim.optimizer import Optimizer, _check_adam_args, _get_value, _to_scalar

__all__ = ["Adamax"]


class Adamax(Optimizer):
    """``torch.optim.Adamax``: ``u = max(b2 u, |g| + eps)``; ``p -= lr / (1-b1^t) m / u``."""

    state_scalars = (("step", 0.0),)
    state_keys = ("exp_avg", "exp_inf")
    group_defaults = {"foreach": None, "maximize": False, "differentiable": False,
                      "capturable": False}

    def __init__(self, params, lr: float | Tensor = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False) -> None:
        _check_adam_args(lr, betas, eps, weight_decay)
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "foreach": foreach, "maximize": maximize,
                    "differentiable": differentiable, "capturable": capturable}
        super().__init__(params, defaults)

    @staticmethod
    def _update(state: dict, param: Tensor, grad: Tensor, group: dict) -> None:
        lr = _to_scalar(group["lr"])
        beta1, beta2 = group["betas"]
        if group["maximize"]:
            grad = -grad
        exp_avg, exp_inf, step_t = state["exp_avg"], state["exp_inf"], state["step"]
        step_t += 1
        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        exp_avg.lerp_(grad, 1 - beta1)
        maximum(exp_inf.mul_(beta2), grad.abs().add_(group["eps"]), out=exp_inf)
        clr = lr / (1 - beta1 ** _get_value(step_t))
        param.addcdiv_(exp_avg, exp_inf, value=-clr)
