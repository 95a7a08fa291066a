"""``tessera.backends.opt_einsum``: the switches of ``einsum``'s contraction-path search,
which tessera has built in (``is_available()`` is True without the ``opt_einsum``
package).

>>> import tessera.backends.opt_einsum as oe
>>> oe.enabled, oe.strategy, oe.is_available()
(True, 'auto', True)
"""
from __future__ import annotations

import sys

from tessera.backends._flags import set_flags

enabled = True
strategy = "auto"


def is_available() -> bool:
    return True


def get_opt_einsum():
    """The ``opt_einsum`` package if it is installed, else None."""
    try:
        import opt_einsum
    except ImportError:
        return None
    return opt_einsum


def flags(enabled=None, strategy=None):
    return set_flags(sys.modules[__name__], enabled=enabled, strategy=strategy)
