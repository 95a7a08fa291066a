"""``torch.nn.parallel``'s import path: ``DistributedDataParallel`` and tessera's
tensor-parallel layers, re-exported from ``tessera.parallel`` (where they live)."""
from tessera.parallel import (
    ColumnParallelLinear,
    DistributedDataParallel,
    ParallelMLP,
    ParallelMultiheadAttention,
    ParallelTransformerEncoderLayer,
    RowParallelLinear,
)

__all__ = ["DistributedDataParallel", "ColumnParallelLinear", "RowParallelLinear",
           "ParallelMLP", "ParallelMultiheadAttention", "ParallelTransformerEncoderLayer"]
