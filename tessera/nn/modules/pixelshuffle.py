"""PyTorch's module path ``torch.nn.modules.pixelshuffle``: ``PixelShuffle``, ``PixelUnshuffle``
(defined in ``tessera.nn.modules.vision``). The classes' ``__module__`` names this path,
so a pickled model refers to them where PyTorch's pickles do.

>>> from tessera.nn.modules.pixelshuffle import PixelShuffle
>>> PixelShuffle.__module__
'tessera.nn.modules.pixelshuffle'
"""
from tessera.nn.modules.vision import (
    PixelShuffle,
    PixelUnshuffle,
)

__all__ = ["PixelShuffle", "PixelUnshuffle"]

for _cls in (PixelShuffle, PixelUnshuffle):
    _cls.__module__ = __name__
