"""``tessera.distributed.sbp``: the SBP values, defined in ``tessera.sbp`` (below the ops,
whose rules use them) and re-exported here under the distributed package.

>>> from tessera.distributed.sbp import split
>>> split(0)
tessera.sbp.split(dim=0)
"""
from tessera.sbp import (
    as_sbp_tuple as as_sbp_tuple,
    broadcast as broadcast,
    partial_sum as partial_sum,
    sbp as sbp,
    split as split,
    split_range as split_range,
    split_sizes as split_sizes,
)

__all__ = ["sbp", "split", "broadcast", "partial_sum", "as_sbp_tuple", "split_sizes",
           "split_range"]
