"""RMSprop (Hinton), optionally centered and with momentum.

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(2))
>>> opt = tessera.optim.RMSprop([w], lr=0.01)
>>> (w * w).sum().backward(); opt.step(); w.detach()
tensor([0.9000, 0.9000])
"""
from __future__ import annotations

from tessera._tensor import Tensor
from tessera.optim.optimizer import Optimizer, _check_lr, _check_nonneg, _to_scalar

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    """``torch.optim.RMSprop``: ``v = alpha v + (1-alpha) g^2``; ``p -= lr g / (sqrt(v) + eps)``
    (``v - mean(g)^2`` when ``centered``; through a momentum buffer when ``momentum > 0``)."""

    state_scalars = (("step", 0.0),)
    state_keys = ("square_avg",)
    group_defaults = {"momentum": 0, "centered": False, "foreach": None, "maximize": False,
                      "differentiable": False, "capturable": False}

    def __init__(self, params, lr: float | Tensor = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False,
                 capturable: bool = False, foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False) -> None:
        _check_lr(lr)
        _check_nonneg(eps, "epsilon value")
        _check_nonneg(momentum, "momentum value")
        _check_nonneg(weight_decay, "weight_decay value")
        _check_nonneg(alpha, "alpha value")
        defaults = {"lr": lr, "momentum": momentum, "alpha": alpha, "eps": eps,
                    "centered": centered, "weight_decay": weight_decay,
                    "capturable": capturable, "foreach": foreach, "maximize": maximize,
                    "differentiable": differentiable}
        super().__init__(params, defaults)

    def _state_keys(self, group: dict) -> tuple[str, ...]:
        return (self.state_keys + (("momentum_buffer",) if group["momentum"] > 0 else ())
                + (("grad_avg",) if group["centered"] else ()))

    @staticmethod
    def _update(state: dict, param: Tensor, grad: Tensor, group: dict) -> None:
        lr = _to_scalar(group["lr"])
        alpha, eps, momentum = group["alpha"], group["eps"], group["momentum"]
        if group["maximize"]:
            grad = -grad
        square_avg = state["square_avg"]
        state["step"] += 1
        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        if group["centered"]:
            grad_avg = state["grad_avg"]
            grad_avg.lerp_(grad, 1 - alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
        else:
            avg = square_avg.sqrt()
        avg = avg.add(eps) if group["differentiable"] else avg.add_(eps)
        if momentum > 0:
            buf = state["momentum_buffer"]
            buf.mul_(momentum).addcdiv_(grad, avg)
            param.add_(buf, alpha=-lr)
        else:
            param.addcdiv_(grad, avg, value=-lr)
