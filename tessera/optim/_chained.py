"""Schedulers made of schedulers: ``SequentialLR`` (one after another, switching at
milestones) and ``ChainedScheduler`` (all of them at every step).

>>> import tessera
>>> from tessera.optim.lr_scheduler import ConstantLR, ExponentialLR
>>> w = tessera.nn.Parameter(tessera.ones(1))
>>> opt = tessera.optim.SGD([w], lr=1.0)
>>> sched = SequentialLR(opt, [ConstantLR(opt, factor=0.5, total_iters=2),
...                            ExponentialLR(opt, gamma=0.9)], milestones=[2])
>>> for _ in range(3):
...     opt.step(); sched.step()
>>> [round(lr, 4) for lr in sched.get_last_lr()]
[0.9]
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from tessera.optim._plateau import ReduceLROnPlateau
from tessera.optim._scheduler import (
    LRScheduler,
    _param_groups_val_list,
    _update_param_group_val,
)
from tessera.optim.optimizer import Optimizer

__all__ = ["SequentialLR", "ChainedScheduler"]


class _ComposedStateMixin:
    """state_dict of schedulers made of schedulers: each inner one saves its own."""

    _schedulers: Sequence[LRScheduler]

    def state_dict(self) -> dict[str, Any]:
        sd = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        sd["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _schedulers = state_dict.pop("_schedulers")
        self.__dict__.update(state_dict)
        state_dict["_schedulers"] = _schedulers
        for idx, s in enumerate(_schedulers):
            self._schedulers[idx].load_state_dict(s)


def _check_children(owner: str, optimizer: Optimizer, schedulers) -> None:
    for idx, scheduler in enumerate(schedulers):
        if not hasattr(scheduler, "optimizer"):
            raise TypeError(f"{owner} at index {idx} should have `optimizer` as its attribute.")
        if isinstance(scheduler, ReduceLROnPlateau):
            raise ValueError(f"{owner} does not support `ReduceLROnPlateau` scheduler as it "
                             "requires additional kwargs to be specified when calling `step`, "
                             f"but got one at index {idx} in the given schedulers sequence.")
        if optimizer != scheduler.optimizer:
            raise ValueError(f"{owner} expects all schedulers to belong to the same optimizer, "
                             f"but got scheduler {scheduler.__class__.__name__} at index {idx} "
                             f"has {scheduler.optimizer}, which is different from "
                             f"{optimizer.__class__.__name__}.")


class SequentialLR(_ComposedStateMixin, LRScheduler):
    """Runs ``schedulers[i]`` between ``milestones[i-1]`` and ``milestones[i]``."""

    def __init__(self, optimizer: Optimizer, schedulers: list[LRScheduler],
                 milestones: list[int], last_epoch: int = -1) -> None:
        name = self.__class__.__name__
        if len(schedulers) < 1:
            raise ValueError(f"{name} expects at least one scheduler, but got no scheduler.")
        _check_children(name, optimizer, schedulers)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError("Sequential Schedulers expects number of schedulers provided to be "
                             "one more than the number of milestone points, but got number of "
                             f"schedulers {len(schedulers)} and the number of milestones to be "
                             f"equal to {len(milestones)}")
        self._schedulers = schedulers
        self._milestones = milestones
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        # undo the initial steps the child schedulers took when they were built
        for group in self.optimizer.param_groups:
            _update_param_group_val(group, "lr", group["initial_lr"])
        self.recursive_undo()
        idx = bisect_right(self._milestones, 0)
        self._schedulers[idx]._initial_step()
        self._last_lr = schedulers[idx].get_last_lr()

    def recursive_undo(self, sched=None) -> None:
        scheds = self if sched is None else sched
        if hasattr(scheds, "_schedulers"):
            for s in scheds._schedulers:
                self.recursive_undo(s)
        elif hasattr(scheds, "last_epoch"):
            scheds.last_epoch -= 1

    def step(self) -> None:  # type: ignore[override]
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()


class ChainedScheduler(_ComposedStateMixin, LRScheduler):
    """Steps every scheduler in the list, each on the lr the previous one left."""

    def __init__(self, schedulers: Sequence[LRScheduler],
                 optimizer: Optimizer | None = None) -> None:
        name = self.__class__.__name__
        if len(schedulers) < 1:
            raise ValueError(f"{name} expects at least one scheduler to be chained, but got no "
                             "scheduler.")
        optimizer = optimizer or schedulers[0].optimizer
        _check_children(name, optimizer, schedulers)
        self._schedulers = schedulers
        self.optimizer = optimizer
        self._last_lr = _param_groups_val_list(self._schedulers[-1].optimizer, "lr")

    def step(self) -> None:  # type: ignore[override]
        for scheduler in self._schedulers:
            scheduler.step()
        self._last_lr = _param_groups_val_list(self._schedulers[-1].optimizer, "lr")

