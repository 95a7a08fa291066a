"""``Optimizer``: the base class of every optimizer, with PyTorch's behaviour and formats.

Parameter groups, per-parameter ``state``, ``zero_grad``, step pre/post hooks and a
``state_dict`` in PyTorch's layout (state keyed by the integer index of each parameter,
``param_groups`` holding index lists), so a state_dict converted through NumPy loads into a
``torch.optim`` optimizer of the same class and back.

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(2))
>>> opt = tessera.optim.SGD([w], lr=0.1)
>>> (w * w).sum().backward(); opt.step(); w.detach()
tensor([0.8000, 0.8000])
"""
from __future__ import annotations

import functools
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from copy import deepcopy
from itertools import chain
from typing import Any, ClassVar

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import STATE
from tessera.graph.trace import is_tracing
from tessera.nn.modules.module import RemovableHandle

__all__ = ["Optimizer", "register_optimizer_step_pre_hook",
           "register_optimizer_step_post_hook", "required"]

StateDict = dict[str, Any]


class _RequiredParameter:
    """Marks a hyper-parameter that every param group must give (no default)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()

_global_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
_global_post_hooks: OrderedDict[int, Callable] = OrderedDict()


def register_optimizer_step_pre_hook(hook: Callable) -> RemovableHandle:
    """``hook(optimizer, args, kwargs) -> None | (args, kwargs)`` before every ``step``."""
    handle = RemovableHandle(_global_pre_hooks)
    _global_pre_hooks[handle.id] = hook
    return handle


def register_optimizer_step_post_hook(hook: Callable) -> RemovableHandle:
    """``hook(optimizer, args, kwargs)`` after every optimizer's ``step``."""
    handle = RemovableHandle(_global_post_hooks)
    _global_post_hooks[handle.id] = hook
    return handle


# ---- helpers shared by the optimizers ---------------------------------------------------

def _use_grad_for_differentiable(func):
    """Run ``step`` with grad mode = the ``differentiable`` default (off, normally), so
    updates are not recorded by autograd."""
    @functools.wraps(func)
    def _use_grad(self, *args, **kwargs):
        prev = STATE.enabled
        STATE.enabled = bool(self.defaults.get("differentiable", False))
        try:
            return func(self, *args, **kwargs)
        finally:
            STATE.enabled = prev
    return _use_grad


def _traced(x) -> bool:
    """``x`` is a tensor inside an ``nn.Graph`` trace: its value is known only when the
    graph runs, so the update must stay tensor math (PyTorch's ``capturable`` path)."""
    return isinstance(x, Tensor) and is_tracing()


def _get_value(x):
    """A 0-d tensor's Python number (how PyTorch reads ``step`` outside compilation); a
    traced tensor stays a tensor."""
    return x.item() if isinstance(x, Tensor) and not _traced(x) else x


def _to_scalar(x):
    """A 1-element tensor hyper-parameter as a Python number (plain numbers unchanged); a
    traced tensor (the lr an ``nn.Graph`` feeds each step) stays a tensor."""
    return x.item() if isinstance(x, Tensor) and not _traced(x) else x


def _get_scalar_dtype() -> D.dtype:
    """The dtype of ``state['step']``: float64 under a float64 default, else float32."""
    return D.float64 if D.get_default_dtype() is D.float64 else D.float32


def _step_tensor(value: float = 0.0) -> Tensor:
    from tessera.ops.creation import tensor
    return tensor(float(value), dtype=_get_scalar_dtype())


def _check_lr(lr) -> None:
    if isinstance(lr, Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")


def _check_nonneg(value, what: str) -> None:
    """PyTorch's ``ValueError(f"Invalid {what}: {value}")`` for a negative value."""
    if not 0.0 <= value:
        raise ValueError(f"Invalid {what}: {value}")


def _check_betas(betas) -> None:
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")


def _check_adam_args(lr, betas, eps, weight_decay) -> None:
    """The argument checks of the Adam family, in PyTorch's order (so the same bad
    argument is named first)."""
    _check_lr(lr)
    _check_nonneg(eps, "epsilon value")
    _check_betas(betas)
    _check_nonneg(weight_decay, "weight_decay value")


def _check_fused(fused, foreach, differentiable) -> None:
    """PyTorch's checks of ``fused`` against the other implementation flags."""
    if fused and differentiable:
        raise RuntimeError("`fused` does not support `differentiable`")
    if fused and foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")


def _run_closure(closure):
    """The loss from ``closure`` (re-evaluated with grad mode on), or None."""
    if closure is None:
        return None
    prev = STATE.enabled
    STATE.enabled = True
    try:
        return closure()
    finally:
        STATE.enabled = prev


def _typename(obj) -> str:
    if isinstance(obj, Tensor):
        return obj.type()
    cls = obj if hasattr(obj, "__qualname__") else type(obj)
    module = getattr(cls, "__module__", "") or ""
    return cls.__qualname__ if module in ("", "builtins") else f"{module}.{cls.__qualname__}"


def _with_step_hooks(func):
    """Wrap a subclass's ``step`` so the global and per-instance step hooks run around it
    (once, even when a subclass's ``step`` calls ``super().step()``)."""
    @functools.wraps(func)
    def step(self, *args, **kwargs):
        if getattr(self, "_in_step", False):
            return func(self, *args, **kwargs)
        for pre_hook in chain(_global_pre_hooks.values(),
                              self._optimizer_step_pre_hooks.values()):
            result = pre_hook(self, args, kwargs)
            if result is not None:
                if isinstance(result, tuple) and len(result) == 2:
                    args, kwargs = result
                else:
                    raise RuntimeError(f"{func} must return None or a tuple of "
                                       f"(new_args, new_kwargs), but got {result}.")
        self._in_step = True
        try:
            out = func(self, *args, **kwargs)
        finally:
            self._in_step = False
        self._opt_called = True  # read by lr_scheduler's call-order warning
        for post_hook in chain(self._optimizer_step_post_hooks.values(),
                               _global_post_hooks.values()):
            post_hook(self, args, kwargs)
        return out
    step._hooked = True  # type: ignore[attr-defined]  # read by __init_subclass__
    return step


class Optimizer:
    """Base class for all optimizers (``torch.optim.Optimizer``).

    ``params``: an iterable of Tensors, of ``(name, Tensor)`` pairs, or of dicts (param
    groups, each with a ``"params"`` entry and optional per-group hyper-parameters).
    ``defaults``: the hyper-parameters a group takes when it does not give them.

    A subclass gives its update rule as ``_update(state, param, grad, group)`` (in place, on
    one parameter) and declares its per-parameter state; the shared ``step`` creates that
    state on a parameter's first step and calls ``_update`` on every parameter with a
    gradient. A subclass may instead override ``step`` (``LBFGS``), as in PyTorch.
    """

    #: 0-d tensors of each parameter's state (``step`` and the like) with their initial
    #: values, in state order; ``__setstate__`` turns saved Python numbers back into them.
    state_scalars: ClassVar[tuple[tuple[str, float], ...]] = ()
    #: the state tensors shaped like the parameter (zeros at first), after the scalars.
    state_keys: ClassVar[tuple[str, ...]] = ()
    #: group options that ``__setstate__`` gives a group saved without them (an older
    #: PyTorch's state_dict).
    group_defaults: ClassVar[dict[str, Any]] = {}

    _optimizer_step_pre_hooks: OrderedDict[int, Callable]
    _optimizer_step_post_hooks: OrderedDict[int, Callable]
    _optimizer_state_dict_pre_hooks: OrderedDict[int, Callable]
    _optimizer_state_dict_post_hooks: OrderedDict[int, Callable]
    _optimizer_load_state_dict_pre_hooks: OrderedDict[int, Callable]
    _optimizer_load_state_dict_post_hooks: OrderedDict[int, Callable]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("step")
        if step is not None and not getattr(step, "_hooked", False):
            cls.step = _with_step_hooks(step)  # type: ignore[method-assign]  # wrapped once

    def __init__(self, params, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self._init_hook_dicts()
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            "Tensors or dicts, but got " + _typename(params))
        self.state: defaultdict[Tensor, Any] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        param_groups = list(params)
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for param_group in param_groups:
            self.add_param_group(param_group)

    def _init_hook_dicts(self) -> None:
        for name in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
                     "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
                     "_optimizer_load_state_dict_pre_hooks",
                     "_optimizer_load_state_dict_post_hooks"):
            if name not in self.__dict__:
                setattr(self, name, OrderedDict())

    def __getstate__(self) -> dict[str, Any]:
        return {"defaults": self.defaults, "state": self.state,
                "param_groups": self.param_groups}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_hook_dicts()
        self.defaults.setdefault("differentiable", False)
        for group in self.param_groups:
            for key, value in self.group_defaults.items():
                group.setdefault(key, value)
            for p in group["params"]:
                _scalars_as_tensors(self.state.get(p), self.state_scalars)

    def __repr__(self) -> str:
        s = self.__class__.__name__ + " ("
        for i, group in enumerate(self.param_groups):
            s += f"\nParameter Group {i}\n"
            for key in sorted(group.keys()):
                if key != "params":
                    s += f"    {key}: {group[key]}\n"
        return s + ")"

    # ---- hooks ----------------------------------------------------------------------
    def register_step_pre_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(optimizer, args, kwargs) -> None | (new_args, new_kwargs)``."""
        return _add_hook(self._optimizer_step_pre_hooks, hook)

    def register_step_post_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(optimizer, args, kwargs)`` after ``step``."""
        return _add_hook(self._optimizer_step_post_hooks, hook)

    def register_state_dict_pre_hook(self, hook, prepend: bool = False) -> RemovableHandle:
        return _add_hook(self._optimizer_state_dict_pre_hooks, hook, prepend)

    def register_state_dict_post_hook(self, hook, prepend: bool = False) -> RemovableHandle:
        return _add_hook(self._optimizer_state_dict_post_hooks, hook, prepend)

    def register_load_state_dict_pre_hook(self, hook, prepend: bool = False) -> RemovableHandle:
        return _add_hook(self._optimizer_load_state_dict_pre_hooks, hook, prepend)

    def register_load_state_dict_post_hook(self, hook,
                                           prepend: bool = False) -> RemovableHandle:
        return _add_hook(self._optimizer_load_state_dict_post_hooks, hook, prepend)

    # ---- state_dict -----------------------------------------------------------------
    def state_dict(self) -> StateDict:
        """``{"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]}``.

        The state tensors are the live ones (not copies), as in PyTorch.
        """
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        param_mappings: dict[int, int] = {}
        start_index = 0

        def pack_group(group: dict[str, Any]) -> dict[str, Any]:
            nonlocal start_index
            packed = {k: v for k, v in group.items() if k != "params"}
            param_mappings.update({id(p): i for i, p in enumerate(group["params"], start_index)
                                   if id(p) not in param_mappings})
            packed["params"] = [param_mappings[id(p)] for p in group["params"]]
            start_index += len(packed["params"])
            return packed

        param_groups = [pack_group(g) for g in self.param_groups]
        packed_state = {(param_mappings[id(k)] if isinstance(k, Tensor) else k): v
                        for k, v in self.state.items()}
        state_dict = {"state": packed_state, "param_groups": param_groups}
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def load_state_dict(self, state_dict: StateDict) -> None:
        """Load a ``state_dict()`` (ours, or PyTorch's converted to tessera tensors)."""
        state_dict = state_dict.copy()
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        groups = self.param_groups
        saved_groups = deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match "
                             "the size of optimizer's group")
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in groups)))
        state: defaultdict[Tensor, dict] = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                state[param] = _cast(param, v, k, state_dict["param_groups"])
            else:
                state[k] = v

        def update_group(group, new_group):
            new_group["params"] = group["params"]
            if "param_names" in group and "param_names" not in new_group:
                new_group["param_names"] = group["param_names"]
            return new_group

        param_groups = [update_group(g, ng) for g, ng in zip(groups, saved_groups)]
        self.__setstate__({"state": state, "param_groups": param_groups})
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    # ---- gradients and groups ------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's ``.grad``: to None (default), or to zeros in place."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    @_with_step_hooks
    @_use_grad_for_differentiable
    def step(self, closure: Callable[[], float] | None = None):
        """One optimization step: ``_update`` on every parameter that has a gradient.

        ``closure`` (optional) re-evaluates the model and returns the loss.
        """
        loss = _run_closure(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(self._init_state(p, group), p, p.grad, group)
        return loss

    def _init_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """``p``'s state, created on its first step: ``state_scalars`` then a new buffer
        per name of ``_state_keys(group)``."""
        state = self.state[p]
        if len(state) == 0:
            for key, value in self.state_scalars:
                state[key] = _step_tensor(value)
            for key in self._state_keys(group):
                state[key] = self._new_buffer(p)
        return state

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        """The buffers a parameter of ``group`` keeps (more when an option asks for more)."""
        return self.state_keys

    def _new_buffer(self, p: Tensor) -> Tensor:
        from tessera.ops.creation import zeros_like
        return zeros_like(p)

    @staticmethod
    def _update(state: dict[str, Any], param: Tensor, grad: Tensor,
                group: dict[str, Any]) -> None:
        """The update rule: change ``param`` (and ``state``) in place given ``grad``."""
        raise NotImplementedError

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters, with its own hyper-parameters, to ``param_groups``."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group)}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            param_group["params"] = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        else:
            param_group["params"] = list(params)
        _extract_names(param_group)
        for param in param_group["params"]:
            if not isinstance(param, Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is "
                                + _typename(param))
            if not self.defaults.get("differentiable", None) and not (
                    param.is_leaf or param.retains_grad):
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError("parameter group didn't specify a value of required "
                                 f"optimization parameter {name}")
            param_group.setdefault(name, default)
        params = param_group["params"]
        if len(params) != len(set(params)):
            warnings.warn("optimizer contains a parameter group with duplicate parameters; "
                          "in future, this will cause an error; see "
                          "github.com/pytorch/pytorch/issues/40967 for more information",
                          stacklevel=3)
        param_set: set[Tensor] = set()
        for group in self.param_groups:
            param_set.update(set(group["params"]))
            if ("param_names" in param_group) != ("param_names" in group):
                txt = "with names" if "param_names" in param_group else "without names"
                raise ValueError("all optimizer param groups should be with/without names. "
                                 f"cannot add param group {txt} to the optimizer")
        if not param_set.isdisjoint(set(param_group["params"])):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)


def _add_hook(hooks: OrderedDict, hook: Callable, prepend: bool = False) -> RemovableHandle:
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    return handle


def _scalars_as_tensors(p_state: dict | None, scalars) -> None:
    """Saved Python numbers (``step`` as older PyTorch saved it) as 0-d state tensors."""
    if not p_state:
        return
    for key, _ in scalars:
        if key in p_state and not isinstance(p_state[key], Tensor):
            p_state[key] = _step_tensor(float(p_state[key]))


def _extract_names(param_group: dict[str, Any]) -> None:
    """``[(name, tensor), ...]`` params become tensors plus a ``param_names`` list."""
    tensors, names = [], []
    for param in param_group["params"]:
        if isinstance(param, tuple):
            names.append(param[0])
            tensors.append(param[1])
        else:
            tensors.append(param)
    param_group["params"] = tensors
    if names:
        if len(names) != len(tensors):
            raise ValueError("all optimizer params should be with/without names. Some param "
                             "names are missing")
        param_group["param_names"] = names


def _cast(param: Tensor, value, param_id=None, param_groups=None, key=None):
    """A copy of a loaded state ``value`` with its tensors on ``param``'s device, floating
    ones in ``param``'s dtype, except ``step`` (kept as saved, like PyTorch)."""
    if isinstance(value, np.ndarray):
        from tessera.ops.creation import from_numpy
        value = from_numpy(value)
    if isinstance(value, Tensor):
        if key == "step":
            return value
        if param.is_floating_point():
            return value.to(dtype=param.dtype, device=param.device)
        return value.to(device=param.device)
    if isinstance(value, dict):
        return {k: _cast(param, v, param_id, param_groups, key=k) for k, v in value.items()}
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        return type(value)(_cast(param, v, param_id, param_groups)  # type: ignore[call-arg]
                           for v in value)
    return value
