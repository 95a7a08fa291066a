"""NAdam (Dozat): Adam with Nesterov momentum and a momentum-decay schedule.

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(2))
>>> opt = tessera.optim.NAdam([w], lr=0.1)
>>> (w * w).sum().backward(); opt.step(); w.detach()
tensor([0.8944, 0.8944])
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.ops.creation import zeros_like
from tessera.optim.optimizer import (
    Optimizer,
    _check_betas,
    _check_lr,
    _check_nonneg,
    _get_value,
    _run_closure,
    _step_tensor,
    _to_scalar,
    _use_grad_for_differentiable,
)

__all__ = ["NAdam"]


class NAdam(Optimizer):
    """``torch.optim.NAdam``: ``mu_t = b1 (1 - 0.5 * 0.96^(t psi))``; the step mixes the
    current gradient and the first moment with the running product of the ``mu``."""

    def __init__(self, params, lr: float | Tensor = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        _check_lr(lr)
        _check_nonneg(eps, "epsilon value")
        _check_betas(betas)
        _check_nonneg(weight_decay, "weight_decay value")
        _check_nonneg(momentum_decay, "momentum_decay value")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "momentum_decay": momentum_decay,
                    "decoupled_weight_decay": decoupled_weight_decay, "maximize": maximize,
                    "foreach": foreach, "capturable": capturable,
                    "differentiable": differentiable}
        super().__init__(params, defaults)

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            for key, value in (("maximize", False), ("foreach", None), ("capturable", False),
                               ("differentiable", False), ("decoupled_weight_decay", False)):
                group.setdefault(key, value)
            for p in group["params"]:
                p_state = self.state.get(p, {})
                if p_state:
                    for key in ("step", "mu_product"):
                        if not isinstance(p_state[key], Tensor):
                            p_state[key] = _step_tensor(float(p_state[key]))

    def _init_state(self, p: Tensor) -> dict:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = _step_tensor()
            state["mu_product"] = _step_tensor(1.0)
            state["exp_avg"] = zeros_like(p)
            state["exp_avg_sq"] = zeros_like(p)
        return state

    @_use_grad_for_differentiable
    def step(self, closure=None):
        """One NAdam step; ``closure`` (optional) re-evaluates the model."""
        loss = _run_closure(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    _nadam_update(self._init_state(p), p, p.grad, group)
        return loss


def _nadam_update(state: dict, param: Tensor, grad: Tensor, group: dict) -> None:
    lr = _to_scalar(group["lr"])
    beta1, beta2 = group["betas"]
    weight_decay, momentum_decay = group["weight_decay"], group["momentum_decay"]
    if group["maximize"]:
        grad = -grad
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    mu_product, step_t = state["mu_product"], state["step"]
    step_t += 1
    step = _get_value(step_t)
    bias_correction2 = 1 - beta2 ** step
    if weight_decay != 0:
        if group["decoupled_weight_decay"]:
            param.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
    mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
    mu_product *= mu  # a float32 0-d tensor, rounded as PyTorch rounds it
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = exp_avg_sq.div(bias_correction2).sqrt()
    mu_product_next = _get_value(mu_product) * mu_next
    denom.add_(group["eps"])
    param.addcdiv_(grad, denom, value=-lr * (1.0 - mu) / (1.0 - _get_value(mu_product)))
    param.addcdiv_(exp_avg, denom, value=-lr * mu_next / (1.0 - mu_product_next))
