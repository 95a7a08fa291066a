"""Utilities outside the tensor core, at PyTorch's import paths: ``tessera.utils.data``
(datasets, samplers and the ``DataLoader``), and torchvision's ``save_image`` /
``make_grid`` (``tessera.utils.image``).

These are imported on first use (``from tessera.utils.data import DataLoader``,
``tessera.utils.save_image``), so ``import tessera`` stays fast.
"""
from __future__ import annotations

import importlib

__all__ = ["data", "make_grid", "save_image"]


def __getattr__(name: str):
    if name == "data":
        return importlib.import_module("tessera.utils.data")
    if name in ("make_grid", "save_image"):
        return getattr(importlib.import_module("tessera.utils.image"), name)
    raise AttributeError(f"module 'tessera.utils' has no attribute {name!r}")
