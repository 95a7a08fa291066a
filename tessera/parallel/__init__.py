"""tessera.parallel: the parallel training strategies, built on global tensors and nn.

* data parallel: ``DistributedDataParallel`` (``ddp.py``, PyTorch's), and the bucketed
  gradient all-reduce of a global module (``grad_buckets.py``, for ``Module.to_global``);
* tensor parallel: ``ColumnParallelLinear``, ``RowParallelLinear`` and the layers made of
  them (``tensor_parallel.py``), expressed with SBP;
* ZeRO: ``ZeroRedundancyOptimizer`` (``zero.py``, ``zero_buckets.py``) eagerly, and
  ``graph_zero.py`` for ``nn.Graph.config.enable_zero``;
* auto-parallel (``auto_parallel.py``): a cost model and a search over SBP signatures
  choosing data, tensor and ZeRO-style plans, for ``nn.Graph.config.enable_auto_parallel``;
* in ``nn.Graph``: the 1F1B pipeline schedule (``pipeline.py``) and the merging of
  collectives into buckets (``graph_buckets.py``), passes of the graph pipeline.

The layers below reach these only by registration, made here when the package is
imported: the two passes with ``tessera.graph.passes``, ZeRO and auto-parallel with
``nn.Graph``, the
gradient bucketing with ``Module.to_global``. PyTorch's import paths are thin re-exports
of this package: ``tessera.nn.parallel`` and ``tessera.distributed.optim``.

>>> import tessera
>>> from tessera.graph.passes import get_pass
>>> get_pass("schedule_1f1b") is pipeline.run
True
"""
from __future__ import annotations

from tessera.distributed._module import register_grad_buckets as _register_grad_buckets
from tessera.graph.passes import register_pass as _register_pass
from tessera.nn.graph import (
    register_auto_parallel as _register_auto_parallel,
    register_zero as _register_zero,
)
from tessera.parallel import auto_parallel, grad_buckets, graph_buckets, graph_zero, pipeline
from tessera.parallel.ddp import DistributedDataParallel
from tessera.parallel.tensor_parallel import (
    ColumnParallelLinear,
    ParallelMLP,
    ParallelMultiheadAttention,
    ParallelTransformerEncoderLayer,
    RowParallelLinear,
)
from tessera.parallel.zero import ZeroRedundancyOptimizer

__all__ = ["DistributedDataParallel", "ColumnParallelLinear", "RowParallelLinear",
           "ParallelMLP", "ParallelMultiheadAttention", "ParallelTransformerEncoderLayer",
           "ZeroRedundancyOptimizer"]

_register_pass("schedule_1f1b", pipeline.run)
_register_pass("bucket_all_reduces", graph_buckets.run)
_register_zero(graph_zero.GraphZero)
_register_auto_parallel(auto_parallel.plan_graph)
_register_grad_buckets(grad_buckets.install)
