"""Parallel wrappers of modules: ``DistributedDataParallel`` (PyTorch's
``torch.nn.parallel``), built on tessera.distributed's communicator."""
from tessera.nn.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
