"""PyTorch's module path ``torch.nn.parallel.distributed`` of ``DistributedDataParallel``
(defined in ``tessera.parallel``), named as the class's home so pickles refer to it where
PyTorch's do.

>>> from tessera.nn.parallel.distributed import DistributedDataParallel
>>> DistributedDataParallel.__module__
'tessera.nn.parallel.distributed'
"""
from tessera.parallel import DistributedDataParallel

__all__ = ["DistributedDataParallel"]

DistributedDataParallel.__module__ = __name__
