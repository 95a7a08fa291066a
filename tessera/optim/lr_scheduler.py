"""Learning-rate schedulers, ported from ``torch.optim.lr_scheduler`` formula for formula
(the recursive "chainable" forms included), so the lr sequences equal PyTorch's.

This module only gathers them at PyTorch's import path: ``LRScheduler`` and the one-formula
schedulers live in ``_scheduler``, the cyclic ones in ``_cyclic``, ``ReduceLROnPlateau`` in
``_plateau`` and the composed ones in ``_chained``. The parts build on ``_scheduler`` and
none imports this module, so no part imports one that imports it back.

>>> import tessera
>>> w = tessera.nn.Parameter(tessera.ones(1))
>>> opt = tessera.optim.SGD([w], lr=1.0)
>>> sched = StepLR(opt, step_size=2, gamma=0.5)
>>> lrs = []
>>> for _ in range(4):
...     opt.step(); sched.step(); lrs.append(sched.get_last_lr()[0])
>>> lrs
[1.0, 0.5, 0.5, 0.25]
"""
from tessera.optim._chained import ChainedScheduler, SequentialLR
from tessera.optim._cyclic import CosineAnnealingWarmRestarts, CyclicLR, OneCycleLR
from tessera.optim._plateau import ReduceLROnPlateau
from tessera.optim._scheduler import (
    ConstantLR,
    CosineAnnealingLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    MultiplicativeLR,
    MultiStepLR,
    PolynomialLR,
    StepLR,
)

__all__ = ["LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
           "ExponentialLR", "SequentialLR", "CosineAnnealingLR", "ChainedScheduler",
           "ReduceLROnPlateau", "CyclicLR", "CosineAnnealingWarmRestarts", "OneCycleLR",
           "PolynomialLR", "LRScheduler"]


class _LRScheduler(LRScheduler):
    """PyTorch's former name of ``LRScheduler``, still subclassed by older scripts."""


# this is the schedulers' home as PyTorch names it: pickles and ``add_safe_globals`` refer
# to ``tessera.optim.lr_scheduler.StepLR`` as PyTorch's refer to ``torch.optim.lr_scheduler``
for _name in __all__:
    globals()[_name].__module__ = __name__
