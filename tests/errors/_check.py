"""The one assertion of the error tests: tessera rejects a call the way PyTorch does.

``raises_like_torch(fn, *needles)`` runs ``fn(torch)`` (which must raise), then ``fn(tessera)``
and checks that tessera raises the same built-in exception type, that its message contains
every needle (the op's name and the offending shapes, dtypes or values; a tuple of strings
means any one of them), and that the error
was raised by tessera itself rather than leaking out of NumPy or a crash in a kernel.
"""
from __future__ import annotations

import os

import pytest
import torch

import tessera

_TESSERA_DIR = os.path.dirname(os.path.abspath(tessera.__file__))
_BUILTIN_ERRORS = (TypeError, ValueError, IndexError, RuntimeError, NotImplementedError,
                   KeyError, AttributeError, ZeroDivisionError, OverflowError)


def _builtin_type(e: BaseException) -> type:
    for cls in type(e).__mro__:
        if cls in _BUILTIN_ERRORS:
            return cls
    return type(e)


def _raising_file(e: BaseException) -> str:
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename)


def raises_like_torch(fn, *needles: str) -> BaseException:
    try:
        fn(torch)
    except Exception as e:  # noqa: BLE001
        ref = e
    else:
        pytest.fail("torch accepts this call: the error case is wrong")
    try:
        fn(tessera)
    except Exception as e:  # noqa: BLE001
        ours = e
    else:
        pytest.fail(f"tessera accepts a call torch rejects with {type(ref).__name__}: {ref}")
    expected = _builtin_type(ref)
    assert isinstance(ours, expected), (
        f"tessera raised {type(ours).__name__}: {ours}\n"
        f"torch raised {type(ref).__name__}: {ref}")
    msg = str(ours)
    for n in needles:  # a tuple of needles: any one of them (e.g. "Long" or "int64")
        alts = n if isinstance(n, tuple) else (n,)
        assert any(a in msg for a in alts), f"message lacks {n!r}: {msg}\n(torch: {ref})"
    where = _raising_file(ours)
    assert where.startswith(_TESSERA_DIR) or "/tests/" in where, \
        f"raised from {where}, not by tessera: {type(ours).__name__}: {msg}"
    return ours
