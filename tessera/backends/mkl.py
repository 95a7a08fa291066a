"""``tessera.backends.mkl``: whether MKL is linked (NumPy's BLAS does the work here).

>>> import tessera.backends.mkl as mkl
>>> isinstance(mkl.is_available(), bool)
True
"""
from __future__ import annotations

from typing import Literal

VERBOSE_OFF, VERBOSE_ON = 0, 1


def is_available() -> bool:
    import numpy as np
    config: dict = dict(np.show_config(mode="dicts") or {})
    return "mkl" in str(config.get("Build Dependencies", {}).get("blas", {})).lower()


class verbose:
    def __init__(self, enable: int) -> None:
        self.enable = enable

    def __enter__(self) -> verbose:
        return self

    def __exit__(self, *exc) -> Literal[False]:
        return False
