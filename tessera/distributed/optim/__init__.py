"""Distributed optimizers (``torch.distributed.optim``'s path): ZeRO over global tensors."""
from tessera.distributed.optim.zero import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
