"""``torch.testing``: ``assert_close`` and ``assert_allclose``, PyTorch's value comparison
for tests and example scripts (``torch.testing.assert_close(new, expected)``).

Tolerances default by dtype as in PyTorch (float32: ``rtol=1.3e-6, atol=1e-5``); the
failure message counts the mismatched elements and names the greatest differences.

>>> import tessera
>>> tessera.testing.assert_close(tessera.tensor([1.0, 2.0]), tessera.tensor([1.0, 2.0]))
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Tensor

__all__ = ["assert_close", "assert_allclose"]

# (rtol, atol) by dtype, PyTorch's table; exact for the others
_TOLERANCES = {D.float16: (1e-3, 1e-5), D.bfloat16: (1.6e-2, 1e-5), D.float32: (1.3e-6, 1e-5),
               D.float64: (1e-7, 1e-7), D.complex64: (1.3e-6, 1e-5),
               D.complex128: (1e-7, 1e-7)}


def _as_tensor(x: Any) -> Tensor | None:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float, complex, np.ndarray, np.generic)):
        from tessera.ops.creation import as_tensor
        return as_tensor(x)
    return None


def _compare(actual: Tensor, expected: Tensor, rtol: float | None, atol: float | None,
             equal_nan: bool, check_dtype: bool, check_device: bool, msg: Any,
             where: str) -> None:
    def fail(text: str) -> None:
        if callable(msg):
            text = msg(text)
        elif msg is not None:
            text = msg
        raise AssertionError(text)

    for attr, on in (("shape", True), ("device", check_device), ("dtype", check_dtype)):
        a, e = getattr(actual, attr), getattr(expected, attr)
        if on and a != e:
            fail(f"The values for attribute '{attr}' do not match: {a} != {e}.{where}")
    dtype = D.promote_types(actual.dtype, expected.dtype)
    if rtol is None or atol is None:
        rtol, atol = (max(_TOLERANCES.get(t, (0.0, 0.0))[i] for t in (actual.dtype,
                      expected.dtype)) for i in (0, 1))
    a = np.asarray(actual.detach().to(dtype).numpy())
    e = np.asarray(expected.detach().to(dtype).numpy())
    with np.errstate(all="ignore"):
        ok = np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=equal_nan)
    if ok.all():
        return
    exact = rtol == 0 and atol == 0
    kind = ("Scalars" if a.ndim == 0 else "Tensor-likes") + (" are not equal!" if exact
                                                             else " are not close!")
    if a.dtype.kind in "biu":  # differences as PyTorch shows them: exact, relative in float32
        a, e = a.astype(np.int64), e.astype(np.int64)
    with np.errstate(all="ignore"):
        diff = np.where(ok, 0, np.abs(a - e))
        rel = np.where(ok, 0, diff.astype(np.float32 if a.dtype.kind == "i" else diff.dtype)
                       / np.abs(e))
    tol = ("", "") if exact else (f" (up to {atol} allowed)", f" (up to {rtol} allowed)")
    if a.ndim == 0:
        fail(f"{kind}\n\nExpected {e.item()} but got {a.item()}.\n"
             f"Absolute difference: {diff.item()}{tol[0]}\n"
             f"Relative difference: {rel.item()}{tol[1]}{where}")
    n = int((~ok).sum())
    ia = np.unravel_index(int(np.nanargmax(diff)) if not np.isnan(diff).all() else 0, a.shape)
    ir = np.unravel_index(int(np.nanargmax(rel)) if not np.isnan(rel).all() else 0, a.shape)
    fail(f"{kind}\n\nMismatched elements: {n} / {a.size} ({100.0 * n / a.size:.1f}%)\n"
         f"Greatest absolute difference: {diff[ia]} at index {tuple(map(int, ia))}{tol[0]}\n"
         f"Greatest relative difference: {rel[ir]} at index {tuple(map(int, ir))}{tol[1]}"
         f"{where}")


def assert_close(actual: Any, expected: Any, *, allow_subclasses: bool = True,
                 rtol: float | None = None, atol: float | None = None,
                 equal_nan: bool = False, check_device: bool = True,
                 check_dtype: bool = True, check_layout: bool = True,
                 check_stride: bool = False, msg: Any = None, _where: str = "") -> None:
    """Raise ``AssertionError`` unless ``actual`` and ``expected`` (tensors, numbers, or
    sequences and mappings of them) are close: ``|a - e| <= atol + rtol * |e|``.

    >>> import tessera
    >>> tessera.testing.assert_close(tessera.tensor(1.0), tessera.tensor(1.5))
    Traceback (most recent call last):
    ...
    AssertionError: Scalars are not close!
    <BLANKLINE>
    Expected 1.5 but got 1.0.
    Absolute difference: 0.5 (up to 1e-05 allowed)
    Relative difference: 0.3333333432674408 (up to 1.3e-06 allowed)
    """
    if (rtol is None) != (atol is None):
        raise ValueError(f"Both 'rtol' and 'atol' must be either specified or omitted, but "
                         f"got no {'rtol' if rtol is None else 'atol'}.")
    if isinstance(actual, Mapping) and isinstance(expected, Mapping):
        if set(actual) != set(expected):
            raise AssertionError(f"The keys of the mappings do not match{_where}: "
                                 f"{sorted(map(str, actual))} != {sorted(map(str, expected))}")
        for k in expected:
            assert_close(actual[k], expected[k], rtol=rtol, atol=atol, equal_nan=equal_nan,
                         check_device=check_device, check_dtype=check_dtype, msg=msg,
                         _where=f"{_where}\n\nThe failure occurred for item [{k!r}]")
        return
    seqs = (Sequence,)
    if isinstance(actual, seqs) and isinstance(expected, seqs) and \
            not isinstance(actual, str) and not isinstance(expected, str):
        if len(actual) != len(expected):
            raise AssertionError(f"The length of the sequences mismatch{_where}: "
                                 f"{len(actual)} != {len(expected)}")
        for i, (x, y) in enumerate(zip(actual, expected)):
            assert_close(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan,
                         check_device=check_device, check_dtype=check_dtype, msg=msg,
                         _where=f"{_where}\n\nThe failure occurred for item [{i}]")
        return
    a, e = _as_tensor(actual), _as_tensor(expected)
    if a is None or e is None:
        if actual == expected:
            return
        raise TypeError(f"No comparison pair was able to handle inputs of type "
                        f"{type(actual)} and {type(expected)}.")
    if not isinstance(actual, Tensor) or not isinstance(expected, Tensor):
        check_dtype = check_dtype and isinstance(actual, Tensor) == isinstance(expected, Tensor)
    _compare(a, e, rtol, atol, equal_nan, check_dtype, check_device, msg, _where)


def assert_allclose(actual: Any, expected: Any, rtol: float | None = None,
                    atol: float | None = None, equal_nan: bool = True, msg: str = "") -> None:
    """The deprecated form of ``assert_close`` (no dtype check, NaNs equal).

    >>> import tessera
    >>> tessera.testing.assert_allclose(tessera.tensor([1.0]), [1.0])
    """
    if not isinstance(expected, Tensor) and isinstance(actual, Tensor):
        from tessera.ops.creation import tensor
        expected = tensor(expected, dtype=actual.dtype)
    assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=equal_nan,
                 check_device=True, check_dtype=False, msg=msg or None)
