"""PyTorch's module path ``torch.nn.modules.fold``: ``Fold``, ``Unfold``
(defined in ``tessera.nn.modules.vision``). The classes' ``__module__`` names this path,
so a pickled model refers to them where PyTorch's pickles do.

>>> from tessera.nn.modules.fold import Fold
>>> Fold.__module__
'tessera.nn.modules.fold'
"""
from tessera.nn.modules.vision import (
    Fold,
    Unfold,
)

__all__ = ["Fold", "Unfold"]

for _cls in (Fold, Unfold):
    _cls.__module__ = __name__
