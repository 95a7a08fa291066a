"""The op-info table: every family's entries, gathered into ``OP_DB``."""
import importlib

from tests.opinfo.core import OP_DB, OpInfo, Sample

for _family in ("elementwise", "creation", "views", "getitem", "reduce", "indexing", "shape",
                "sorting", "linalg", "random", "nn_activation", "nn_loss", "nn_conv",
                "nn_pool", "nn_vision", "nn_norm", "nn_misc", "nn_attention", "nn_ctc", "fused",
                "einsum", "collective"):
    try:
        importlib.import_module(f"tests.opinfo.{_family}")
    except ModuleNotFoundError as e:
        if e.name != f"tests.opinfo.{_family}":
            raise

__all__ = ["OP_DB", "OpInfo", "Sample"]
