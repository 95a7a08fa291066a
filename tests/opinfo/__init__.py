"""The op-info table: every family's entries, gathered into ``OP_DB``."""
from tests.opinfo import (  # noqa: F401  (each module registers its entries)
    binary,
    collective,
    creation,
    einsum,
    elementwise,
    fused,
    getitem,
    indexing,
    linalg,
    nchwc,
    nn_activation,
    nn_attention,
    nn_conv,
    nn_ctc,
    nn_loss,
    nn_misc,
    nn_norm,
    nn_pool,
    nn_vision,
    quantized,
    random,
    reduce,
    shape,
    sorting,
    sparse,
    views,
)
from tests.opinfo.core import OP_DB, OpInfo, Sample

__all__ = ["OP_DB", "OpInfo", "Sample"]
