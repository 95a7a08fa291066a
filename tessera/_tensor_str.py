"""``repr(tensor)`` in PyTorch's exact format: ``tensor([1., 2.], requires_grad=True)``.

The algorithm follows ``torch/_tensor_str.py`` step by step (one formatter per tensor chosen
from its nonzero finite values; int mode, fixed or scientific; edge items when summarised),
so printed tensors read the same as PyTorch's, with ``torch.`` spelled ``tessera.``.

>>> import tessera
>>> tessera.tensor([1.0, 2.5, 1e-5])
tensor([1.0000e+00, 2.5000e+00, 1.0000e-05])
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tessera import _dtype as D


@dataclass
class _PrintOptions:
    precision: int = 4
    threshold: float = 1000
    edgeitems: int = 3
    linewidth: int = 80
    sci_mode: bool | None = None


PRINT_OPTS = _PrintOptions()


def set_printoptions(precision=None, threshold=None, edgeitems=None, linewidth=None,
                     profile=None, sci_mode=None) -> None:
    """PyTorch's ``set_printoptions``: ``profile`` is 'default', 'short' or 'full'."""
    if profile == "default":
        PRINT_OPTS.precision, PRINT_OPTS.threshold = 4, 1000
        PRINT_OPTS.edgeitems, PRINT_OPTS.linewidth = 3, 80
    elif profile == "short":
        PRINT_OPTS.precision, PRINT_OPTS.threshold = 2, 1000
        PRINT_OPTS.edgeitems, PRINT_OPTS.linewidth = 2, 80
    elif profile == "full":
        PRINT_OPTS.precision, PRINT_OPTS.threshold = 4, math.inf
        PRINT_OPTS.edgeitems, PRINT_OPTS.linewidth = 3, 80
    if precision is not None:
        PRINT_OPTS.precision = precision
    if threshold is not None:
        PRINT_OPTS.threshold = threshold
    if edgeitems is not None:
        PRINT_OPTS.edgeitems = edgeitems
    if linewidth is not None:
        PRINT_OPTS.linewidth = linewidth
    PRINT_OPTS.sci_mode = sci_mode


class _Formatter:
    """Chooses one width and notation for every element of a (summarised) array."""

    def __init__(self, values: np.ndarray, floating: bool):
        self.floating = floating
        self.int_mode, self.sci_mode, self.max_width = True, False, 1
        flat = values.reshape(-1)
        if not floating:
            for v in flat:
                self.max_width = max(self.max_width, len(_plain(v)))
        else:
            self._scan_floats(flat.astype(np.float64))

    def _scan_floats(self, flat: np.ndarray) -> None:
        vals = flat[np.isfinite(flat) & (flat != 0)]
        if vals.size == 0:
            return
        amin, amax = np.abs(vals).min(), np.abs(vals).max()
        p = PRINT_OPTS.precision
        self.int_mode = bool(np.all(vals == np.ceil(vals)))
        forced = PRINT_OPTS.sci_mode
        self.sci_mode = bool(amax / amin > 1000.0 or amax > 1.0e8 or amin < 1.0e-4) \
            if forced is None else forced
        if self.sci_mode:
            widths = [len(f"{v:.{p}e}") for v in vals]
        elif self.int_mode:
            widths = [len(f"{v:.0f}") + 1 for v in vals]
        else:
            widths = [len(f"{v:.{p}f}") for v in vals]
        self.max_width = max(widths)

    def width(self) -> int:
        return self.max_width

    def format(self, value) -> str:
        if self.floating:
            value = float(value)
            p = PRINT_OPTS.precision
            if self.sci_mode:
                ret = f"{value:{self.max_width}.{p}e}"
            elif self.int_mode:
                ret = f"{value:.0f}"
                if not (math.isinf(value) or math.isnan(value)):
                    ret += "."
            else:
                ret = f"{value:.{p}f}"
        else:
            ret = _plain(value)
        return (self.max_width - len(ret)) * " " + ret


def _plain(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "True" if v else "False"
    return str(int(v))


def _summarized(a: np.ndarray) -> np.ndarray:
    """Only the edge items a summarised print shows (they alone decide the format)."""
    e = PRINT_OPTS.edgeitems
    if a.ndim == 0:
        return a
    if a.ndim == 1:
        return np.concatenate([a[:e], a[-e:]]) if a.shape[0] > 2 * e else a
    if not e:
        return a[(slice(0, 0),) * a.ndim]
    rows = list(range(e)) + list(range(a.shape[0] - e, a.shape[0])) \
        if a.shape[0] > 2 * e else range(a.shape[0])
    return np.stack([_summarized(a[i]) for i in rows])


class _Complex:
    """Formats complex values with one formatter for the real and one for the imaginary
    parts, as PyTorch does."""

    def __init__(self, real: _Formatter, imag: _Formatter):
        self.real, self.imag = real, imag

    def width(self) -> int:  # ", " plus the "j"
        return self.real.width() + self.imag.width() + 1

    def format(self, value) -> str:
        re_s = self.real.format(value.real)
        im_s = (self.imag.format(value.imag) + "j").lstrip()
        return re_s + im_s if im_s[0] in "+-" else re_s + "+" + im_s


def _vector_str(a: np.ndarray, indent: int, summarize: bool, fmt) -> str:
    e = PRINT_OPTS.edgeitems
    per_line = max(1, math.floor((PRINT_OPTS.linewidth - indent) / (fmt.width() + 2)))
    if summarize and not e:
        data = ["..."]
    elif summarize and a.shape[0] > 2 * e:
        data = [fmt.format(v) for v in a[:e]] + [" ..."] + [fmt.format(v) for v in a[-e:]]
    else:
        data = [fmt.format(v) for v in a]
    lines = [", ".join(data[i:i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + ("," + "\n" + " " * (indent + 1)).join(lines) + "]"


def _array_str(a: np.ndarray, indent: int, summarize: bool, fmt) -> str:
    if a.ndim == 0:
        return fmt.format(a.item() if a.dtype.kind == "c" else a[()])
    if a.ndim == 1:
        return _vector_str(a, indent, summarize, fmt)
    e = PRINT_OPTS.edgeitems
    if summarize and a.shape[0] > 2 * e:
        slices = [_array_str(a[i], indent + 1, summarize, fmt) for i in range(e)] + ["..."] + \
            [_array_str(a[i], indent + 1, summarize, fmt)
             for i in range(a.shape[0] - e, a.shape[0])]
    else:
        slices = [_array_str(a[i], indent + 1, summarize, fmt) for i in range(a.shape[0])]
    return "[" + ("," + "\n" * (a.ndim - 1) + " " * (indent + 1)).join(slices) + "]"


def _tensor_str(t, indent: int) -> str:
    a = t.detach()._to_numpy()
    if t.dtype is D.bfloat16 or t.dtype is D.float16:
        a = a.astype(np.float32)
    summarize = a.size > PRINT_OPTS.threshold
    shown = _summarized(a) if summarize else a
    fmt: _Complex | _Formatter
    if t.dtype.is_complex:
        fmt = _Complex(_Formatter(shown.real, True), _Formatter(shown.imag, True))
    else:
        fmt = _Formatter(shown, t.dtype.is_floating_point)
    return _array_str(a, indent, summarize, fmt)


def _add_suffixes(text: str, suffixes: list[str], indent: int) -> str:
    parts = [text]
    last_line_len = len(text) - text.rfind("\n") + 1
    for s in suffixes:
        if last_line_len + len(s) + 2 > PRINT_OPTS.linewidth:
            parts.append(",\n" + " " * indent + s)
            last_line_len = indent + len(s)
        else:
            parts.append(", " + s)
            last_line_len += len(s) + 2
    parts.append(")")
    return "".join(parts)


def tensor_repr(t, prefix: str = "tensor(") -> str:
    """The text PyTorch prints for ``t`` (``torch.`` replaced by ``tessera.``)."""
    indent = len(prefix)
    suffixes = []
    if t.device.type not in ("cpu", "global"):
        suffixes.append(f"device='{t.device}'")
    if t.is_global:
        suffixes.append(f"placement={t.placement}")
        suffixes.append(f"sbp={t.sbp}")
    default = D.get_default_dtype()
    has_default_dtype = t.dtype in (default, default.to_complex(), D.int64, D.bool_)
    if t._data is None:
        suffixes.append(f"size={tuple(t.shape)}")
        if t.dtype is not default:
            suffixes.append(f"dtype={t.dtype}")
        body = "..."
    elif t.numel() == 0:
        if t.dim() != 1:
            suffixes.append(f"size={tuple(t.shape)}")
        if t.dtype is not default:
            suffixes.append(f"dtype={t.dtype}")
        body = "[]"
    else:
        if not PRINT_OPTS.edgeitems:
            suffixes.append(f"size={tuple(t.shape)}")
        if not has_default_dtype:
            suffixes.append(f"dtype={t.dtype}")
        body = _tensor_str(t, indent)
    if t.grad_fn is not None:
        suffixes.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return _add_suffixes(prefix + body, suffixes, indent)
