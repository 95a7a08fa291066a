"""The ``flags(...)`` context manager shared by the backend modules."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType


@contextlib.contextmanager
def set_flags(module: ModuleType, **values) -> Iterator[None]:
    """Sets the module's attributes for the block (``None`` leaves one as it is)."""
    values = {k: v for k, v in values.items() if v is not None}
    saved = {k: getattr(module, k) for k in values}
    for k, v in values.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(module, k, v)
