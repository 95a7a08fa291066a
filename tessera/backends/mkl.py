"""``tessera.backends.mkl``: whether MKL is linked (NumPy's BLAS does the work here).

>>> import tessera.backends.mkl as mkl
>>> isinstance(mkl.is_available(), bool)
True
"""
from __future__ import annotations

VERBOSE_OFF, VERBOSE_ON = 0, 1


def is_available() -> bool:
    import numpy as np
    config = np.show_config(mode="dicts") if hasattr(np, "show_config") else {}
    blas = str(config.get("Build Dependencies", {}).get("blas", {})) if config else ""
    return "mkl" in blas.lower()


class verbose:
    def __init__(self, enable: int) -> None:
        self.enable = enable

    def __enter__(self) -> verbose:
        return self

    def __exit__(self, *exc) -> bool:
        return False
