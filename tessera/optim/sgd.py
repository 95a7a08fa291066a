"""Stochastic gradient descent, optionally with momentum (heavy ball or Nesterov).

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(2))
>>> opt = tessera.optim.SGD([w], lr=0.1, momentum=0.9)
>>> (w * w).sum().backward(); opt.step(); w.detach()
tensor([0.8000, 0.8000])
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.optim.optimizer import Optimizer, _check_fused, _check_lr, _to_scalar

__all__ = ["SGD"]


class SGD(Optimizer):
    """``torch.optim.SGD``: ``b = momentum * b + (1 - dampening) * g``; ``p -= lr * b``
    (or ``g + momentum * b`` with ``nesterov``); the buffer starts as the first gradient."""

    group_defaults = {"nesterov": False, "maximize": False, "foreach": None,
                      "differentiable": False, "fused": False}

    def __init__(self, params, lr: float | Tensor = 1e-3, momentum: float = 0,
                 dampening: float = 0, weight_decay: float = 0, nesterov: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        _check_lr(lr)
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening,
                    "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize,
                    "foreach": foreach, "differentiable": differentiable, "fused": fused}
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, defaults)
        _check_fused(fused, foreach, differentiable)

    def _init_state(self, p: Tensor, group: dict) -> dict:
        # PyTorch creates state (even empty) only for params with momentum; the momentum
        # buffer itself starts as the first gradient, in _update
        return self.state[p] if group["momentum"] != 0 else {}

    @staticmethod
    def _update(state: dict, param: Tensor, grad: Tensor, group: dict) -> None:
        lr = _to_scalar(group["lr"])
        momentum, weight_decay = group["momentum"], group["weight_decay"]
        if group["maximize"]:
            grad = -grad
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = grad.detach().clone()
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
            state["momentum_buffer"] = buf
            grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
        if isinstance(lr, Tensor):  # traced in an nn.Graph: lr is fed each step
            param.sub_(grad * lr)
        else:
            param.add_(grad, alpha=-lr)
