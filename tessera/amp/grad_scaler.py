"""``GradScaler``: loss scaling for low-precision training (PyTorch's
``torch.amp.GradScaler``). On a device this build lacks (``"cuda"``) it warns and
disables itself, and then every method passes through, as in PyTorch's CPU build."""
from __future__ import annotations

import enum
import math
import warnings
from collections import defaultdict
from typing import Any

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.autograd import no_grad
from tessera.device.registry import _BACKENDS, Unavailable

__all__ = ["GradScaler", "OptState"]


class OptState(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh_state() -> dict[str, Any]:
    return {"stage": OptState.READY, "found_inf": False}


class GradScaler:
    """Multiplies the loss by a scale before ``backward``, unscales the gradients before
    the optimizer step, skips steps whose gradients overflowed and adapts the scale.

    >>> import tessera
    >>> scaler = tessera.amp.GradScaler("cpu", init_scale=4.0)
    >>> w = tessera.nn.Parameter(tessera.ones(2))
    >>> opt = tessera.optim.SGD([w], lr=0.5)
    >>> scaler.scale((w * 3).sum()).backward()
    >>> w.grad.tolist()
    [12.0, 12.0]
    >>> scaler.step(opt); scaler.update(); w.tolist()
    [-0.5, -0.5]
    """

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        self._device = device
        self._enabled = enabled
        if enabled and isinstance(_BACKENDS.get(device), Unavailable):
            warnings.warn(f"torch.{device}.amp.GradScaler is enabled, but {device.upper()} is "
                          "not available.  Disabling.", stacklevel=2)
            self._enabled = False
        if self._enabled:
            if growth_factor <= 1.0:
                raise AssertionError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise AssertionError("The backoff factor must be < 1.0.")
        self._scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._per_optimizer_states: dict[int, dict[str, Any]] = defaultdict(_fresh_state)

    def scale(self, outputs):
        """``outputs`` (a tensor or an iterable of them) times the current scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)) or hasattr(outputs, "__iter__"):
            scaled = [self.scale(o) for o in outputs]
            return type(outputs)(scaled) if isinstance(outputs, (list, tuple)) else scaled
        raise ValueError("outputs must be a Tensor or an iterable of Tensors")

    def unscale_(self, optimizer) -> None:
        """Divides ``optimizer``'s gradients by the scale in place, noting infs and NaNs."""
        if not self._enabled:
            return
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since "
                               "the last update().")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv = 1.0 / self._scale
        found = False
        with no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if p.grad.dtype == D.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    p.grad.mul_(inv)
                    if not found and not bool(p.grad.isfinite().all()):
                        found = True
        state["found_inf"] = found
        state["stage"] = OptState.UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """``optimizer.step()`` unless the unscaled gradients hold infs or NaNs."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is "
                               "enabled.")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        retval = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        return retval

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Grows the scale after ``growth_interval`` clean steps, backs it off after a step
        that overflowed, or sets it to ``new_scale``."""
        if not self._enabled:
            return
        if new_scale is not None:
            if isinstance(new_scale, Tensor):
                if new_scale.numel() != 1 or new_scale.requires_grad:
                    raise AssertionError(
                        "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                        "torch.FloatTensor with requires_grad=False.")
                new_scale = float(new_scale.item())
            self._scale = float(new_scale)
        else:
            states = self._per_optimizer_states.values()
            if not any(s["stage"] is not OptState.READY for s in states):
                raise AssertionError("No inf checks were recorded prior to update.")
            if any(s["found_inf"] for s in states):
                self._scale *= self._backoff_factor
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    grown = self._scale * self._growth_factor
                    if math.isfinite(grown):
                        self._scale = grown
                    self._growth_tracker = 0
        self._per_optimizer_states = defaultdict(_fresh_state)

    def get_scale(self) -> float:
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = new_interval

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])
