"""Data loading with PyTorch's ``torch.utils.data`` names: datasets, samplers, collation and
the ``DataLoader`` (single-process or with worker processes).

>>> import tessera
>>> from tessera.utils.data import DataLoader, TensorDataset
>>> loader = DataLoader(TensorDataset(tessera.ones(6, 2)), batch_size=4)
>>> [b[0].shape for b in loader]
[tessera.Size([4, 2]), tessera.Size([2, 2])]
"""
from tessera.utils.data._collate import default_collate, default_convert
from tessera.utils.data._worker import WorkerInfo, get_worker_info
from tessera.utils.data.dataloader import DataLoader
from tessera.utils.data.dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from tessera.utils.data.distributed import DistributedSampler
from tessera.utils.data.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = ["BatchSampler", "ChainDataset", "ConcatDataset", "DataLoader", "Dataset",
           "DistributedSampler",
           "IterableDataset", "RandomSampler", "Sampler", "SequentialSampler", "StackDataset",
           "Subset", "SubsetRandomSampler", "TensorDataset", "WeightedRandomSampler",
           "WorkerInfo", "default_collate", "default_convert", "get_worker_info",
           "random_split"]
