"""PyTorch's module path ``torch.nn.modules.upsampling``: ``Upsample``, ``UpsamplingNearest2d``,
``UpsamplingBilinear2d`` (defined in ``tessera.nn.modules.vision``). The classes' ``__module__``
names this path, so a pickled model refers to them where PyTorch's pickles do.

>>> from tessera.nn.modules.upsampling import Upsample
>>> Upsample.__module__
'tessera.nn.modules.upsampling'
"""
from tessera.nn.modules.vision import (
    Upsample,
    UpsamplingBilinear2d,
    UpsamplingNearest2d,
)

__all__ = ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"]

for _cls in (Upsample, UpsamplingNearest2d, UpsamplingBilinear2d):
    _cls.__module__ = __name__
