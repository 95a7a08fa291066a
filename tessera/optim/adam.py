"""Adam (Kingma & Ba), with AMSGrad, maximize and L2 or decoupled weight decay.

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(2))
>>> opt = tessera.optim.Adam([w], lr=0.1)
>>> (w * w).sum().backward(); opt.step(); w.detach()
tensor([0.9000, 0.9000])
"""
from __future__ import annotations

from tessera._tensor import _CPU as CPU, Tensor
from tessera.graph.trace import is_tracing
from tessera.kernels import optim as _kernels
from tessera.ops.arithmetic import maximum
from tessera.optim.optimizer import (
    Optimizer,
    _check_adam_args,
    _check_fused,
    _get_value,
    _to_scalar,
)

__all__ = ["Adam"]


class Adam(Optimizer):
    """``torch.optim.Adam``: ``m = lerp(m, g, 1-b1)``, ``v = b2 v + (1-b2) g^2``,
    ``p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps)``."""

    state_scalars = (("step", 0.0),)
    state_keys = ("exp_avg", "exp_avg_sq")
    group_defaults = {"amsgrad": False, "maximize": False, "foreach": None,
                      "capturable": False, "differentiable": False,
                      "decoupled_weight_decay": False, "fused": None}

    def __init__(self, params, lr: float | Tensor = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None,
                 decoupled_weight_decay: bool = False) -> None:
        _check_adam_args(lr, betas, eps, weight_decay)
        if not (isinstance(betas[0], float) and isinstance(betas[1], float)
                or isinstance(betas[0], Tensor) and isinstance(betas[1], Tensor)):
            raise ValueError("betas must be either both floats or both Tensors")
        betas = tuple(map(_to_scalar, betas))
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": amsgrad, "maximize": maximize, "foreach": foreach,
                    "capturable": capturable, "differentiable": differentiable, "fused": fused,
                    "decoupled_weight_decay": decoupled_weight_decay}
        super().__init__(params, defaults)
        _check_fused(fused, foreach, differentiable)

    def _state_keys(self, group: dict) -> tuple[str, ...]:
        return self.state_keys + (("max_exp_avg_sq",) if group["amsgrad"] else ())

    @staticmethod
    def _update(state: dict, param: Tensor, grad: Tensor, group: dict) -> None:
        if _fused_group(group) and _fusable(param, state):
            _adam_fused(state, param, grad, group)
        elif group["fused"]:
            raise RuntimeError("`fused=True` requires all the params to be contiguous "
                               "float32/float64 CPU Tensors with gradients of the "
                               f"same layout, got {param.dtype} on {param.device}")
        else:
            _adam_update(state, param, grad, group)


def _fused_group(group: dict) -> bool:
    """Whether this group's update may run as one C kernel per parameter
    (``tessera.kernels.optim``): ``fused`` not False, not differentiable, not
    traced into a graph. PyTorch's CPU default (``fused=None``) is the op-by-op loop; the
    fused kernel computes the same thing with fewer roundings and no per-op dispatch, so
    tessera takes it by default (LeNet-5's Adam step: ~10 ops of dispatch per parameter)."""
    if group["fused"] is False or group["differentiable"] or is_tracing():
        return False
    return not isinstance(_to_scalar(group["lr"]), Tensor)


def _fusable(p: Tensor, state: dict) -> bool:
    g = p.grad
    arrays = [p, g, state["exp_avg"], state["exp_avg_sq"]] + (
        [state["max_exp_avg_sq"]] if "max_exp_avg_sq" in state else [])
    dt = p._data.dtype if p._device is CPU else None
    return dt is not None and _kernels.available(dt) and all(
        t._device is CPU and t._data.dtype == dt and t._data.flags.c_contiguous and
        t._data.shape == p._data.shape for t in arrays)


def _adam_fused(state: dict, param: Tensor, grad: Tensor, group: dict) -> None:
    """``_adam_update`` as one C loop (the same arithmetic, element by element)."""
    beta1, beta2 = group["betas"]
    step_t = state["step"]
    step_t += 1
    vmax = state.get("max_exp_avg_sq") if group["amsgrad"] else None
    _kernels.adam_step(param._data, grad._data, state["exp_avg"]._data,
                       state["exp_avg_sq"]._data, None if vmax is None else vmax._data,
                       lr=_to_scalar(group["lr"]), beta1=beta1, beta2=beta2, eps=group["eps"],
                       weight_decay=group["weight_decay"],
                       decoupled=group["decoupled_weight_decay"], maximize=group["maximize"],
                       step=_get_value(step_t))
    for t in (param, state["exp_avg"], state["exp_avg_sq"], vmax):
        if t is not None:
            t._version[0] += 1


def _adam_moments(state: dict, param: Tensor, grad: Tensor, group: dict, lr) -> Tensor:
    """The first half of Adam, RAdam and NAdam, in PyTorch's order: ``step += 1``, weight
    decay (L2 into the gradient, or decoupled on the parameter), ``m = lerp(m, g, 1-b1)``,
    ``v = b2 v + (1-b2) g^2``. Returns the gradient the rest of the update uses."""
    beta1, beta2 = group["betas"]
    weight_decay = group["weight_decay"]
    if group["maximize"]:
        grad = -grad
    step_t = state["step"]
    step_t += 1
    if weight_decay != 0:
        if group["decoupled_weight_decay"]:
            param.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    state["exp_avg"].lerp_(grad, 1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    return grad


def _adam_update(state: dict, param: Tensor, grad: Tensor, group: dict) -> None:
    lr = _to_scalar(group["lr"])
    beta1, beta2 = group["betas"]
    eps, exp_avg, exp_avg_sq = group["eps"], state["exp_avg"], state["exp_avg_sq"]
    _adam_moments(state, param, grad, group, lr)
    # Python numbers eagerly; tensors when traced in an nn.Graph (PyTorch's capturable
    # math), where step and lr are known only when the graph runs
    step = _get_value(state["step"])
    if isinstance(step, Tensor):
        step = step.double()  # the Python float eager mode computes with
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    bias_correction2_sqrt = bias_correction2 ** 0.5
    if group["amsgrad"]:
        max_sq = state["max_exp_avg_sq"]
        maximum(max_sq, exp_avg_sq, out=max_sq)
        denom = (max_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    else:
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    if isinstance(step_size, Tensor):
        param.sub_(exp_avg * step_size / denom)  # addcdiv computes (value * t1) / t2
    else:
        param.addcdiv_(exp_avg, denom, value=-step_size)
