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

__all__ = ["Adamax"]


class Adamax(Optimizer):
    """``torch.optim.Adamax``: ``u = max(b2 u, |g| + eps)``; ``p -= lr / (1-b1^t) m / u``."""

    def __init__(self, params, lr: float | Tensor = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False) -> None:
        _check_lr(lr)
        _check_nonneg(eps, "epsilon value")
        _check_betas(betas)
        _check_nonneg(weight_decay, "weight_decay value")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "foreach": foreach, "maximize": maximize,
                    "differentiable": differentiable, "capturable": capturable}
        super().__init__(params, defaults)

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            for key, value in (("foreach", None), ("maximize", False),
                               ("differentiable", False), ("capturable", False)):
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
            state["exp_inf"] = zeros_like(p)
        return state

    @_use_grad_for_differentiable
    def step(self, closure=None):
        """One Adamax step; ``closure`` (optional) re-evaluates the model."""
        loss = _run_closure(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    _adamax_update(self._init_state(p), p, p.grad, group)
        return loss


def _adamax_update(state: dict, param: Tensor, grad: Tensor, group: dict) -> None:
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
