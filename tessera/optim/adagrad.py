"""Adagrad (Duchi et al.), with learning-rate decay and an initial accumulator value.

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(2))
>>> opt = tessera.optim.Adagrad([w], lr=0.1)
>>> (w * w).sum().backward(); opt.step(); w.detach()
tensor([0.9000, 0.9000])
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.ops.creation import full_like
from tessera.optim.optimizer import (
    Optimizer,
    _check_fused,
    _check_lr,
    _check_nonneg,
    _get_value,
    _to_scalar,
)

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    """``torch.optim.Adagrad``: ``s += g^2``; ``p -= lr / (1 + (t-1) lr_decay) g / (sqrt(s)
    + eps)``. State exists for every parameter from construction on, as in PyTorch."""

    state_scalars = (("step", 0.0),)
    state_keys = ("sum",)
    group_defaults = {"foreach": None, "maximize": False, "differentiable": False,
                      "fused": None}

    def __init__(self, params, lr: float | Tensor = 1e-2, lr_decay: float = 0,
                 weight_decay: float = 0, initial_accumulator_value: float = 0,
                 eps: float = 1e-10, foreach: bool | None = None, *, maximize: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        _check_lr(lr)
        _check_nonneg(lr_decay, "lr_decay value")
        _check_nonneg(weight_decay, "weight_decay value")
        _check_nonneg(initial_accumulator_value, "initial_accumulator_value value")
        _check_nonneg(eps, "epsilon value")
        defaults = {"lr": lr, "lr_decay": lr_decay, "eps": eps, "weight_decay": weight_decay,
                    "initial_accumulator_value": initial_accumulator_value,
                    "foreach": foreach, "maximize": maximize,
                    "differentiable": differentiable, "fused": fused}
        super().__init__(params, defaults)
        _check_fused(fused, foreach, differentiable)
        for group in self.param_groups:
            for p in group["params"]:
                self._init_state(p, group)

    def _new_buffer(self, p: Tensor) -> Tensor:
        init = self.defaults["initial_accumulator_value"]
        return full_like(p, complex(init, init) if p.is_complex() else init)

    def share_memory(self) -> None:
        """A no-op: CPU state already lives in ordinary process memory."""

    @staticmethod
    def _update(state: dict, param: Tensor, grad: Tensor, group: dict) -> None:
        lr = _to_scalar(group["lr"])
        step_t, state_sum = state["step"], state["sum"]
        step_t += 1
        step = _get_value(step_t)
        if group["maximize"]:
            grad = -grad
        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        clr = lr / (1 + (step - 1) * group["lr_decay"])
        state_sum.addcmul_(grad, grad, value=1)
        if group["differentiable"]:
            std = state_sum.sqrt() + group["eps"]
        else:
            std = state_sum.sqrt().add_(group["eps"])
        param.addcdiv_(grad, std, value=-clr)
