"""Utilities outside the tensor core, at PyTorch's import paths: ``tessera.utils.data``
(datasets, samplers and the ``DataLoader``).

``tessera.utils.data`` is imported on first use (``from tessera.utils.data import
DataLoader`` or ``tessera.utils.data``), so ``import tessera`` stays fast.
"""
from __future__ import annotations

import importlib

__all__ = ["data"]


def __getattr__(name: str):
    if name == "data":
        return importlib.import_module("tessera.utils.data")
    raise AttributeError(f"module 'tessera.utils' has no attribute {name!r}")
