"""NAdam (Dozat): Adam with Nesterov momentum and a momentum-decay schedule.

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(2))
>>> opt = tessera.optim.NAdam([w], lr=0.1)
>>> (w * w).sum().backward(); opt.step(); w.detach()
tensor([0.8944, 0.8944])
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.optim.adam import _adam_moments
from tessera.optim.optimizer import (
    Optimizer,
    _check_adam_args,
    _check_nonneg,
    _get_value,
    _to_scalar,
)

__all__ = ["NAdam"]


class NAdam(Optimizer):
    """``torch.optim.NAdam``: ``mu_t = b1 (1 - 0.5 * 0.96^(t psi))``; the step mixes the
    current gradient and the first moment with the running product of the ``mu``."""

    state_scalars = (("step", 0.0), ("mu_product", 1.0))
    state_keys = ("exp_avg", "exp_avg_sq")
    group_defaults = {"maximize": False, "foreach": None, "capturable": False,
                      "differentiable": False, "decoupled_weight_decay": False}

    def __init__(self, params, lr: float | Tensor = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        _check_adam_args(lr, betas, eps, weight_decay)
        _check_nonneg(momentum_decay, "momentum_decay value")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "momentum_decay": momentum_decay,
                    "decoupled_weight_decay": decoupled_weight_decay, "maximize": maximize,
                    "foreach": foreach, "capturable": capturable,
                    "differentiable": differentiable}
        super().__init__(params, defaults)

    @staticmethod
    def _update(state: dict, param: Tensor, grad: Tensor, group: dict) -> None:
        lr = _to_scalar(group["lr"])
        beta1, beta2 = group["betas"]
        momentum_decay, mu_product = group["momentum_decay"], state["mu_product"]
        grad = _adam_moments(state, param, grad, group, lr)
        step = _get_value(state["step"])
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
        mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
        mu_product *= mu  # a float32 0-d tensor, rounded as PyTorch rounds it
        denom = state["exp_avg_sq"].div(1 - beta2 ** step).sqrt()
        mu_product_next = _get_value(mu_product) * mu_next
        denom.add_(group["eps"])
        param.addcdiv_(grad, denom, value=-lr * (1.0 - mu) / (1.0 - _get_value(mu_product)))
        param.addcdiv_(state["exp_avg"], denom, value=-lr * mu_next / (1.0 - mu_product_next))
