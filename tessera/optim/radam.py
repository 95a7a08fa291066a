"""RAdam (Liu et al.): Adam with a rectified adaptive learning rate.

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(2))
>>> opt = tessera.optim.RAdam([w], lr=0.1)
>>> (w * w).sum().backward(); opt.step(); w.detach()
tensor([0.8000, 0.8000])
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

__all__ = ["RAdam"]


class RAdam(Optimizer):
    """``torch.optim.RAdam``: plain momentum SGD while the variance estimate is unreliable
    (``rho_t <= 5``), rectified Adam afterwards."""

    def __init__(self, params, lr: float | Tensor = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        _check_lr(lr)
        _check_nonneg(eps, "epsilon value")
        _check_betas(betas)
        _check_nonneg(weight_decay, "weight_decay value")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "maximize": maximize, "foreach": foreach, "capturable": capturable,
                    "decoupled_weight_decay": decoupled_weight_decay,
                    "differentiable": differentiable}
        super().__init__(params, defaults)

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            for key, value in (("foreach", None), ("maximize", False), ("differentiable", False),
                               ("decoupled_weight_decay", False), ("capturable", False)):
                group.setdefault(key, value)
            for p in group["params"]:
                p_state = self.state.get(p, {})
                if p_state and not isinstance(p_state["step"], Tensor):
                    p_state["step"] = _step_tensor(float(p_state["step"]))

    def _init_state(self, p: Tensor) -> dict:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = _step_tensor()
            state["exp_avg"] = zeros_like(p)
            state["exp_avg_sq"] = zeros_like(p)
        return state

    @_use_grad_for_differentiable
    def step(self, closure=None):
        """One RAdam step; ``closure`` (optional) re-evaluates the model."""
        loss = _run_closure(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    _radam_update(self._init_state(p), p, p.grad, group)
        return loss


def _radam_update(state: dict, param: Tensor, grad: Tensor, group: dict) -> None:
    lr = _to_scalar(group["lr"])
    beta1, beta2 = group["betas"]
    weight_decay, eps = group["weight_decay"], group["eps"]
    if group["maximize"]:
        grad = -grad
    exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
    step_t += 1
    step = _get_value(step_t)
    if weight_decay != 0:
        if group["decoupled_weight_decay"]:
            param.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
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
