"""``tessera.backends.openmp``: tessera's kernels run on its own threads
(``tessera.set_num_threads``), so threaded CPU execution is available.

>>> import tessera
>>> tessera.backends.openmp.is_available()
True
"""
from __future__ import annotations


def is_available() -> bool:
    return True
