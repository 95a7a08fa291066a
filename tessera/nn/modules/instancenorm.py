"""PyTorch's module path ``torch.nn.modules.instancenorm``: the ``InstanceNorm1d/2d/3d`` layers
(defined in ``tessera.nn.modules.batchnorm``). The classes' ``__module__`` names this path, so a
pickled model refers to them where PyTorch's pickles do.

>>> from tessera.nn.modules.instancenorm import InstanceNorm1d
>>> InstanceNorm1d.__module__
'tessera.nn.modules.instancenorm'
"""
from tessera.nn.modules.batchnorm import (
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
)

__all__ = ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"]

for _cls in (InstanceNorm1d, InstanceNorm2d, InstanceNorm3d):
    _cls.__module__ = __name__
