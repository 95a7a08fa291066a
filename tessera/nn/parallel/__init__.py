"""Parallel wrappers and layers: ``DistributedDataParallel`` (PyTorch's
``torch.nn.parallel``), built on tessera.distributed's communicator, and tensor-parallel
layers (``tensor_parallel.py``) expressed with SBP on global tensors."""
from tessera.nn.parallel.distributed import DistributedDataParallel
from tessera.nn.parallel.tensor_parallel import (
    ColumnParallelLinear,
    ParallelMLP,
    ParallelMultiheadAttention,
    ParallelTransformerEncoderLayer,
    RowParallelLinear,
)

__all__ = ["DistributedDataParallel", "ColumnParallelLinear", "RowParallelLinear",
           "ParallelMLP", "ParallelMultiheadAttention", "ParallelTransformerEncoderLayer"]
