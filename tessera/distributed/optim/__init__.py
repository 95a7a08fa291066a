"""``torch.distributed.optim``'s import path: ``ZeroRedundancyOptimizer``, re-exported from
``tessera.parallel`` (where it lives)."""
from tessera.parallel import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
