"""RAdam (Liu et al.): Adam with a rectified adaptive learning rate.

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(2))
>>> opt = tessera.optim.RAdam([w], lr=0.1)
>>> (w * w).sum().backward(); opt.step(); w.detach()
tensor([0.8000, 0.8000])
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.optim.adam import _adam_moments
from tessera.optim.optimizer import Optimizer, _check_adam_args, _get_value, _to_scalar

__all__ = ["RAdam"]


class RAdam(Optimizer):
    """``torch.optim.RAdam``: plain momentum SGD while the variance estimate is unreliable
    (``rho_t <= 5``), rectified Adam afterwards."""

    state_scalars = (("step", 0.0),)
    state_keys = ("exp_avg", "exp_avg_sq")
    group_defaults = {"foreach": None, "maximize": False, "differentiable": False,
                      "decoupled_weight_decay": False, "capturable": False}

    def __init__(self, params, lr: float | Tensor = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        _check_adam_args(lr, betas, eps, weight_decay)
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "maximize": maximize, "foreach": foreach, "capturable": capturable,
                    "decoupled_weight_decay": decoupled_weight_decay,
                    "differentiable": differentiable}
        super().__init__(params, defaults)

    @staticmethod
    def _update(state: dict, param: Tensor, grad: Tensor, group: dict) -> None:
        lr = _to_scalar(group["lr"])
        beta1, beta2 = group["betas"]
        eps, exp_avg, exp_avg_sq = group["eps"], state["exp_avg"], state["exp_avg_sq"]
        _adam_moments(state, param, grad, group, lr)
        step = _get_value(state["step"])
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        bias_corrected_exp_avg = exp_avg / bias_correction1
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2 ** step) / bias_correction2
        if rho_t > 5.0:
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf
                    / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
            exp_avg_sq_sqrt = exp_avg_sq.sqrt()
            exp_avg_sq_sqrt = (exp_avg_sq_sqrt.add(eps) if group["differentiable"]
                               else exp_avg_sq_sqrt.add_(eps))
            # PyTorch evaluates ``number / tensor`` as ``tensor.reciprocal() * number``
            adaptive_lr = exp_avg_sq_sqrt.reciprocal() * bias_correction2 ** 0.5
            param.add_(bias_corrected_exp_avg * lr * adaptive_lr * rect, alpha=-1.0)
        else:
            param.add_(bias_corrected_exp_avg * lr, alpha=-1.0)
