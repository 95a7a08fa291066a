"""``repr(tensor)`` in PyTorch's format: ``tensor([1., 2.], requires_grad=True)``."""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D

PRECISION = 4
THRESHOLD = 1000
EDGEITEMS = 3
LINEWIDTH = 80


def _float_formatter(values: np.ndarray):
    finite = values[np.isfinite(values)] if values.size else values
    if finite.size == 0:
        return lambda v: _special(v) or f"{v:.{PRECISION}f}"
    if np.all(finite == np.round(finite)):
        amax = np.abs(finite).max()
        if amax >= 1e8:
            return lambda v: _special(v) or f"{v:.{PRECISION}e}"
        return lambda v: _special(v) or f"{v:.0f}."
    nonzero = np.abs(finite[finite != 0])
    if nonzero.size and (nonzero.max() / nonzero.min() > 1000 or nonzero.max() > 1e8 or
                         nonzero.min() < 1e-4):
        return lambda v: _special(v) or f"{v:.{PRECISION}e}"
    return lambda v: _special(v) or f"{v:.{PRECISION}f}"


def _special(v) -> str | None:
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return None


def _summary_values(a: np.ndarray, summarize: bool) -> np.ndarray:
    if not summarize or a.ndim == 0:
        return a.reshape(-1)
    parts = []
    if a.shape[0] > 2 * EDGEITEMS:
        for sub in list(a[:EDGEITEMS]) + list(a[-EDGEITEMS:]):
            parts.append(_summary_values(np.asarray(sub), summarize))
    else:
        for sub in a:
            parts.append(_summary_values(np.asarray(sub), summarize))
    return np.concatenate(parts) if parts else a.reshape(-1)


def _fmt_array(a: np.ndarray, fmt, width: int, indent: int, summarize: bool) -> str:
    if a.ndim == 0:
        return fmt(a.item()).rjust(width)
    if a.ndim == 1:
        items = list(a)
        if summarize and len(items) > 2 * EDGEITEMS:
            cells = [fmt(v).rjust(width) for v in items[:EDGEITEMS]] + ["..."] + \
                [fmt(v).rjust(width) for v in items[-EDGEITEMS:]]
        else:
            cells = [fmt(v).rjust(width) for v in items]
        per_line = max(1, (LINEWIDTH - indent) // (width + 2))
        lines = [", ".join(cells[i:i + per_line]) for i in range(0, len(cells), per_line)]
        return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"
    rows = list(range(a.shape[0]))
    if summarize and len(rows) > 2 * EDGEITEMS:
        rows = rows[:EDGEITEMS] + [None] + rows[-EDGEITEMS:]
    sep = "," + "\n" * (a.ndim - 1) + " " * (indent + 1)
    parts = ["..." if r is None else _fmt_array(a[r], fmt, width, indent + 1, summarize)
             for r in rows]
    return "[" + sep.join(parts) + "]"


def _body(t) -> str:
    a = t.detach()._to_numpy()
    if t.dtype is D.bfloat16 or t.dtype is D.float16:
        a = a.astype(np.float32)
    summarize = a.size > THRESHOLD
    vals = _summary_values(a, summarize)
    if t.dtype is D.bool_:
        def fmt(v):
            return "True" if v else "False"
    elif t.dtype.is_floating_point:
        fmt = _float_formatter(vals.astype(np.float64))
    elif t.dtype.is_complex:
        def fmt(v):
            return f"{v.real:.{PRECISION}f}{v.imag:+.{PRECISION}f}j"
    else:
        def fmt(v):
            return str(int(v))
    width = max((len(fmt(v)) for v in vals), default=1)
    return _fmt_array(a, fmt, width, len("tensor("), summarize)


def tensor_repr(t) -> str:
    suffix = []
    if t.device.type != "cpu":
        suffix.append(f"device='{t.device}'")
    if t._data is None:
        body = "..."
        suffix.append(f"size={tuple(t.shape)}")
    elif t.numel() == 0:
        body = "[]"
        if t.dim() != 1:
            suffix.append(f"size={tuple(t.shape)}")
    else:
        body = _body(t)
    default_shown = (D.get_default_dtype(), D.int64, D.bool_)
    if t.dtype not in default_shown or (t.numel() == 0 and t.dtype is not
                                        D.get_default_dtype() and t._data is not None):
        suffix.append(f"dtype={t.dtype}")
    if t.grad_fn is not None:
        suffix.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        suffix.append("requires_grad=True")
    return "tensor(" + ", ".join([body] + suffix) + ")"
