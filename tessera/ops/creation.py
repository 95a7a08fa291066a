"""Factories (tensor, zeros, arange, ...), dtype casts, device moves, fill and copy.

Factories are ops too: they have no tensor inputs, take ``device`` as an attribute, and
so run on ``meta`` (shape only) like every other op.

>>> import tessera
>>> tessera.arange(0, 1, 0.25)
tensor([0.0000, 0.2500, 0.5000, 0.7500])
"""
from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor, _contiguous_strides
from tessera.device.registry import _BACKENDS, device as Device
from tessera.ops import _jax, _relax, cost
from tessera.ops._sbp import pointwise
from tessera.ops._util import bool_arg, broadcast_shapes, call, size_args, sum_to
from tessera.ops.registry import Meta, defop
from tessera.sbp import SbpRule, partial_sum as P

_Complex = complex  # the builtin: this module defines tessera.complex below

__all__ = ["tensor", "as_tensor", "asarray", "from_numpy", "scalar_tensor", "zeros", "ones",
           "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like", "arange",
           "linspace", "logspace", "eye", "fill", "zero", "copy", "clone", "contiguous",
           "cast", "to_device", "scalar_like", "empty_strided", "complex", "polar"]


def _dev(device) -> Device:
    return device if isinstance(device, Device) else Device(device or "cpu")


class GlobalFactories(NamedTuple):
    """How factories make global tensors, registered by ``tessera.distributed`` (above the
    ops): ``make(make, placement, sbp, requires_grad, random, generator, name)`` for a
    factory called with ``placement=``/``sbp=``, ``like(input, value, dtype, requires_grad)``
    for ``*_like`` of a global tensor."""

    make: Callable
    like: Callable


_GLOBAL_FACTORIES: list[GlobalFactories] = []


def register_global_factories(factories: GlobalFactories) -> None:
    """Called by ``tessera.distributed`` on import (a placement exists only after it)."""
    _GLOBAL_FACTORIES[:] = [factories]


def _global(make, placement, sbp, requires_grad: bool, name: str, random: bool = False,
            generator=None) -> Tensor:
    """A factory called with ``placement=``/``sbp=``: a global tensor whose tiles come from
    ``make()``, the whole tensor (tessera.distributed)."""
    return _GLOBAL_FACTORIES[0].make(make, placement, sbp, requires_grad, random, generator, name)


def _finish(t: Tensor, requires_grad: bool) -> Tensor:
    if requires_grad:
        t.requires_grad_(True)
    return t


# ---- data -> tensor ------------------------------------------------------------------

def _infer_data_dtype(data) -> D.dtype:
    """The dtype PyTorch gives nested data: the promotion of its elements' dtypes, where a
    Python bool/int/float/complex is bool/int64/the default float/its complex, and a NumPy
    scalar, array or tensor keeps its own dtype (``tensor(np.float64(2.0))`` is float64)."""
    best = None
    stack = [data]
    while stack:
        x = stack.pop()
        if isinstance(x, Tensor):
            d = x.dtype
        elif isinstance(x, (np.ndarray, np.generic)):  # before scalar_dtype: np.float64 is a
            d = D.from_numpy_dtype(x.dtype)              # float subclass
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
            continue
        else:
            d = D.scalar_dtype(x)
        best = d if best is None else D.promote_types(best, d)
    return best or D.get_default_dtype()


def _to_numpy_data(data, dt: D.dtype) -> np.ndarray:
    if isinstance(data, Tensor):
        return data.detach()._to_numpy().astype(dt.np, copy=True)
    if isinstance(data, (list, tuple)) and any(isinstance(x, Tensor) for x in _flat(data)):
        data = _nested_tolist(data)
    if dt.category == 1 and not isinstance(data, np.ndarray):
        checked = _integer_data(data, dt)
        if checked is not None:
            return checked
    try:
        arr = np.array(data, dtype=dt.np)
    except OverflowError:
        raise RuntimeError(f"value cannot be converted to type {dt.name} without "
                           "overflow") from None
    except (ValueError, TypeError) as e:
        raise (_ragged_error(data) or
               ValueError(f"tensor(): could not build a tensor from the data: {e}")) from None
    if arr.dtype == object:
        raise TypeError("tensor(): data must be numbers or nested sequences of numbers")
    return arr


def _integer_data(data, dt: D.dtype) -> np.ndarray | None:
    """Numbers read into an integer dtype as PyTorch reads them one by one: NaN, inf and
    numbers out of range raise (an int down to -max fits an unsigned type, wrapping), floats
    truncate; None for data NumPy cannot read as numbers (the caller reports it)."""
    from tessera.ops._elementwise import int_bounds
    lo, hi = int_bounds(dt)
    if type(data) is int and lo <= data <= hi:  # the common scalar, at once
        return np.array(data).astype(dt.np)  # (negative into unsigned: wraps)
    try:
        raw = np.array(data)
    except (ValueError, TypeError, OverflowError):
        return None
    kind = raw.dtype.kind
    if kind in "uO":
        return _integer_data_exact(data, dt, lo)
    if kind == "c":
        raise TypeError("'complex' object cannot be interpreted as an integer")
    if kind not in "fi":
        return None
    if not raw.size or kind == "i" and dt is D.int64:
        return raw.astype(dt.np, copy=False)
    low, high = raw.min(), raw.max()  # NaN if any is NaN
    if kind == "f":
        if max(-low, high) >= 2.0**53:  # big ints read as floats lose digits (inf too)
            return _integer_data_exact(data, dt, lo)
        ok = float(lo if dt.is_signed else 0) <= low and high <= float(hi)  # False for NaN
    else:
        ok = lo <= low and high <= hi
    if not ok:
        raise RuntimeError(f"value cannot be converted to type {dt.name} without overflow")
    return raw.astype(dt.np)


def _integer_data_exact(data, dt: D.dtype, lo: int) -> np.ndarray | None:
    """``_integer_data`` number by number, for ints beyond what a float64 holds exactly."""
    hi = int(np.iinfo(dt.np).max)
    try:
        objs = np.array(data, dtype=object)
    except (ValueError, TypeError):
        return None
    out = []
    for v in objs.flat:
        if isinstance(v, (bool, np.bool_)):
            v = int(v)
        elif isinstance(v, (int, np.integer)):
            v = int(v)
            if not -(1 << 63) <= v < 1 << 63:
                raise ValueError("Overflow when unpacking long long")
        elif isinstance(v, (float, np.floating)):
            if not float(-(1 << 63)) <= v < float(1 << 63):  # NaN too
                raise RuntimeError(f"value cannot be converted to type {dt.name} without "
                                   "overflow")
            v = int(v)
        elif isinstance(v, (_Complex, np.complexfloating)):
            raise TypeError("'complex' object cannot be interpreted as an integer")
        else:
            return None
        if not lo <= v <= hi:
            raise RuntimeError(f"value cannot be converted to type {dt.name} without overflow")
        out.append(v)
    return np.array(out, np.int64).astype(dt.np).reshape(objs.shape)


def _ragged_error(data) -> Exception | None:
    """PyTorch's error for nested sequences of uneven depth or length: the shape is read off
    the first element at each depth, then every element is checked against it in order."""
    seq = (list, tuple, np.ndarray)
    sizes, x = [], data
    while isinstance(x, seq):
        sizes.append(len(x))
        if not len(x):
            break
        x = x[0]

    def walk(x, dim: int) -> Exception | None:
        if dim == len(sizes):
            if isinstance(x, seq):
                return TypeError(f"tensor(): expected a number at dim {dim}, got a "
                                 f"{type(x).__name__}")
            return None
        if not isinstance(x, seq):
            return TypeError(f"tensor(): not a sequence: expected a sequence of length "
                             f"{sizes[dim]} at dim {dim}, got {type(x).__name__}")
        if len(x) != sizes[dim]:
            return ValueError(f"tensor(): expected sequence of length {sizes[dim]} at dim "
                              f"{dim} (got {len(x)})")
        return next((e for e in (walk(y, dim + 1) for y in x) if e is not None), None)
    return walk(data, 0)


def _flat(data):
    for x in data:
        if isinstance(x, (list, tuple)):
            yield from _flat(x)
        else:
            yield x


def _nested_tolist(data):
    if isinstance(data, Tensor):
        return data.tolist()
    if isinstance(data, (list, tuple)):
        return [_nested_tolist(x) for x in data]
    return data


def tensor(data, *, dtype=None, device=None, requires_grad: bool = False,
           pin_memory: bool = False, placement=None, sbp=None) -> Tensor:
    """A new tensor holding a copy of ``data`` (nested lists, scalars, arrays, tensors).

    >>> tensor([[1, 2], [3, 4]]).dtype
    tessera.int64
    """
    if placement is not None or sbp is not None:
        return _global(lambda: tensor(data, dtype=dtype), placement, sbp, requires_grad,
                       "tensor")
    if data is None or isinstance(data, dict):
        raise RuntimeError(f"tensor(): Could not infer dtype of {type(data).__name__}")
    if isinstance(data, str):
        raise TypeError(f"tensor(): data must be a number or a sequence, not "
                        f"{type(data).__name__}")
    bool_arg("tensor", "requires_grad", requires_grad)
    dt = D.dtype_arg("tensor", dtype) if dtype is not None else _infer_data_dtype(data)
    arr = _to_numpy_data(data, dt)
    dev = _dev(device if device is not None else
               (data.device if isinstance(data, Tensor) else None))
    if dev.type != "cpu":
        return _finish(to_device(Tensor._from_numpy(arr), dev), requires_grad)
    if not arr.flags.c_contiguous:
        arr = arr.copy()
    return _finish(Tensor._from_numpy(arr), requires_grad)


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """Like ``tensor`` but shares memory with a tensor or a NumPy array when it can."""
    if dtype is not None:
        dtype = D.dtype_arg("as_tensor", dtype)
    if isinstance(data, Tensor):
        out = data
        if dtype is not None:
            out = out.to(dtype)
        if device is not None:
            out = out.to(device)
        return out
    if isinstance(data, np.ndarray) and (dtype is None or dtype.np == data.dtype) \
            and _dev(device).type == "cpu":
        return from_numpy(data)
    return tensor(data, dtype=dtype, device=device)


def asarray(obj, *, dtype=None, device=None, copy: bool | None = None,
            requires_grad: bool = False) -> Tensor:
    """A tensor of ``obj`` sharing its memory where it can (``copy=True`` always copies,
    ``copy=False`` refuses to), as ``torch.asarray``.

    >>> import numpy as np
    >>> a = np.zeros(2, np.float32)
    >>> asarray(a)[0] = 1.0; a.tolist()
    [1.0, 0.0]
    """
    out = as_tensor(obj, dtype=dtype, device=device)
    src = obj._data if isinstance(obj, Tensor) else obj
    shared = isinstance(src, np.ndarray) and isinstance(out._data, np.ndarray) and \
        np.shares_memory(out._data, src)
    if copy is False and not shared:
        raise ValueError("asarray(copy=False): obj cannot become a tensor of this dtype and "
                         "device without a copy")
    if copy and shared:
        out = out.clone()
    if requires_grad:
        out = (out.detach() if out is obj else out).requires_grad_(True)
    return out


def from_numpy(ndarray: np.ndarray) -> Tensor:
    """A tensor sharing memory with ``ndarray`` (writes show through both ways)."""
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(ndarray).__name__})")
    return Tensor._from_numpy(ndarray)


def scalar_tensor(s, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    """A 0-d tensor of the number ``s`` (of the default dtype unless told), converted as a
    fill value is.

    >>> scalar_tensor(3)
    tensor(3.)
    """
    dt = D.dtype_arg("scalar_tensor", dtype) if dtype is not None else D.get_default_dtype()
    return scalar_fill("scalar_tensor", s, dt, device, bool_arg("scalar_tensor", "requires_grad",
                                                                requires_grad, none=True))


def scalar_fill(op_name: str, value, dt: D.dtype, device=None, requires_grad=False) -> Tensor:
    """A 0-d tensor of ``value`` converted to ``dt`` as PyTorch writes one element: checked
    like any fill, except that float16 and bfloat16 overflow to inf instead of raising."""
    if dt is D.float16 or dt is D.bfloat16:
        return _make_full(op_name, ((),), value, D.float64, device, False).to(dt) \
            .requires_grad_(requires_grad)
    return _make_full(op_name, ((),), value, dt, device, requires_grad)


def scalar_like(value, like: Tensor):
    """The left operand of a reflected operator (``2.5 - x``) checked: a Python number stays
    a number, so promotion treats it as a wrapped scalar as PyTorch does (``300 - int8``
    wraps like ``int8 - 300``, never overflows a 0-d tensor)."""
    if isinstance(value, Tensor):
        return value
    # (builtins.complex: this module's ``complex`` is the tensor function)
    if not isinstance(value, (int, float, bool, builtins.complex, np.generic)):
        raise TypeError(f"unsupported operand type: '{type(value).__name__}' and 'Tensor'")
    return value


# ---- shape factories -----------------------------------------------------------------

def _factory_infer(shape, dtype, device=None, value=None):
    return Meta(shape, dtype)


def _fill_value(value, dt: np.dtype):
    from tessera.ops.ternary import _fill_value as fv
    return fv(value, dt)


def _full_kernel(shape, dtype, value, device=None):
    return np.full(shape, _fill_value(value, dtype.np), dtype.np)


_FULL = defop("full", lambda shape, dtype, value, device=None: Meta(shape, dtype), _full_kernel,
              grad=None, cost=cost.output_only(),
              to_jax=_jax.constant(_full_kernel), to_relax=_relax.constant(_full_kernel))
_EMPTY = defop("empty", lambda shape, dtype, device=None: Meta(shape, dtype),
               lambda shape, dtype, device=None: np.empty(shape, dtype.np), grad=None,
               cost=cost.output_only())


def _make_full(op_name, size, value, dtype, device, requires_grad):
    if not size:
        raise TypeError(f'{op_name}() missing 1 required positional arguments: "size"')
    shape = size_args(op_name, size)
    requires_grad = bool_arg(op_name, "requires_grad", requires_grad, none=True)
    if dtype is not None:
        dtype = D.dtype_arg(op_name, dtype)
    if value is None:
        dt = dtype if dtype is not None else D.get_default_dtype()
        out = dispatch(_EMPTY, shape=shape, dtype=dt, device=_dev(device))
    else:
        if isinstance(value, np.generic):  # PyTorch reads a NumPy scalar as a Python number
            value = value.item()
        dt = dtype if dtype is not None else (
            D.scalar_dtype(value) if not isinstance(value, Tensor) else value.dtype)
        if isinstance(value, Tensor):
            value = value.item()
        from tessera.ops._elementwise import checked_scalar
        checked_scalar(value, dt)
        out = dispatch(_FULL, shape=shape, dtype=dt, value=value, device=_dev(device))
    return _finish(out, requires_grad)


def zeros(*sizes, size=None, dtype=None, device=None, requires_grad=False, out=None, layout=None,
          placement=None, sbp=None) -> Tensor:
    """A tensor of zeros: ``zeros(2, 3)`` or ``zeros((2, 3))``."""
    size = sizes if size is None else (size,)   # zeros(size=(2, 3)) too
    if placement is not None or sbp is not None:
        return _global(lambda: zeros(*size, dtype=dtype), placement, sbp, requires_grad,
                       "zeros")
    return _make_full("zeros", size, 0, dtype or D.get_default_dtype(), device, requires_grad)


def ones(*sizes, size=None, dtype=None, device=None, requires_grad=False, out=None, layout=None,
         placement=None, sbp=None) -> Tensor:
    """A tensor of ones."""
    size = sizes if size is None else (size,)   # zeros(size=(2, 3)) too
    if placement is not None or sbp is not None:
        return _global(lambda: ones(*size, dtype=dtype), placement, sbp, requires_grad, "ones")
    return _make_full("ones", size, 1, dtype or D.get_default_dtype(), device, requires_grad)


def full(size, fill_value, *, dtype=None, device=None, requires_grad=False, out=None,
         layout=None, placement=None, sbp=None) -> Tensor:
    """A tensor filled with ``fill_value``; its dtype follows the value (int64 for ints)."""
    if placement is not None or sbp is not None:
        return _global(lambda: full(size, fill_value, dtype=dtype), placement, sbp,
                       requires_grad, "full")
    if not isinstance(size, (tuple, list)):
        raise TypeError(f"full(): argument 'size' (position 1) must be tuple of ints, not "
                        f"{type(size).__name__}")
    if not isinstance(fill_value, (int, float, _Complex, np.number, np.bool_, Tensor)):
        raise TypeError(f"full(): argument 'fill_value' (position 2) must be Number, not "
                        f"{type(fill_value).__name__}")
    return _make_full("full", (tuple(size),), fill_value, dtype, device, requires_grad)


def empty(*sizes, size=None, dtype=None, device=None, requires_grad=False, out=None, layout=None,
          pin_memory=False, memory_format=None, placement=None, sbp=None) -> Tensor:
    """An uninitialised tensor."""
    size = sizes if size is None else (size,)   # zeros(size=(2, 3)) too
    if placement is not None or sbp is not None:
        return _global(lambda: zeros(*size, dtype=dtype), placement, sbp, requires_grad,
                       "empty")
    return _make_full("empty", size, None, dtype, device, requires_grad)


def empty_strided(size, stride, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    return empty(tuple(size), dtype=dtype, device=device, requires_grad=requires_grad)


def _like(fn_name, input, value, dtype, device, requires_grad):
    if not isinstance(input, Tensor):
        raise TypeError(f"{fn_name}(): argument 'input' must be Tensor, not "
                        f"{type(input).__name__}")
    if input._device.type == "global" and device is None:  # like a global tensor: global
        dt = D.dtype_arg(fn_name, dtype) if dtype is not None else input.dtype
        return _GLOBAL_FACTORIES[0].like(input, value, dt, requires_grad)
    return _make_full(fn_name, (tuple(input.shape),), value, dtype or input.dtype,
                      device or input.device, requires_grad)


def zeros_like(input, *, dtype=None, device=None, requires_grad=False, layout=None,
               memory_format=None) -> Tensor:
    return _like("zeros_like", input, 0, dtype, device, requires_grad)


def ones_like(input, *, dtype=None, device=None, requires_grad=False, layout=None,
              memory_format=None) -> Tensor:
    return _like("ones_like", input, 1, dtype, device, requires_grad)


def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False,
              layout=None, memory_format=None) -> Tensor:
    return _like("full_like", input, fill_value, dtype, device, requires_grad)


def empty_like(input, *, dtype=None, device=None, requires_grad=False, layout=None,
               memory_format=None) -> Tensor:
    return _like("empty_like", input, None, dtype, device, requires_grad)


def _arange_infer(start, end, step, dtype, device=None):
    if dtype is D.bool_ or dtype.is_complex:
        from tessera.ops.activation import tname
        raise NotImplementedError(f"\"arange_cpu\" not implemented for '{tname(dtype)}'")
    if step == 0:
        raise RuntimeError("arange: step must be nonzero")
    if (end - start) * step < 0 and end != start:
        raise RuntimeError(f"arange: upper bound and larger bound inconsistent with step sign "
                           f"(start={start}, end={end}, step={step})")
    for v in (start, end, step):
        if isinstance(v, float) and not math.isfinite(v):
            raise RuntimeError(f"arange: unsupported range: {start} -> {end}")
    n = max(0, math.ceil((end - start) / step))
    return Meta((n,), dtype)


def _arange_kernel(start, end, step, dtype, device=None):
    n = _arange_infer(start, end, step, dtype).shape[0]
    if dtype.category == 1:
        return (start + step * np.arange(n, dtype=np.int64)).astype(dtype.np)
    return (start + step * np.arange(n, dtype=np.float64)).astype(dtype.np)


# start + step * i: two operations per element
_ARANGE = defop("arange", _arange_infer, _arange_kernel, grad=None, cost=cost.output_only(2),
                to_jax=_jax.constant(_arange_kernel), to_relax=_relax.constant(_arange_kernel))


def arange(start=0, end=None, step=1, *, dtype=None, device=None, requires_grad=False,
           out=None, placement=None, sbp=None) -> Tensor:
    """``[start, end)`` in steps; int64 for integer arguments, else the default float."""
    if placement is not None or sbp is not None:
        return _global(lambda: arange(start, end, step, dtype=dtype), placement, sbp,
                       requires_grad, "arange")
    if end is None:
        start, end = 0, start
    vals = [v.item() if isinstance(v, Tensor) else v for v in (start, end, step)]
    for v in vals:
        if not isinstance(v, (int, float, np.number)) or isinstance(v, bool):
            raise TypeError(f"arange(): expected numbers for start, end and step, got "
                            f"{type(v).__name__}")
    start, end, step = vals
    if dtype is None:
        dtype = D.int64 if all(isinstance(v, (int, np.integer)) for v in vals) \
            else D.get_default_dtype()
    out = dispatch(_ARANGE, start=start, end=end, step=step,
                   dtype=D.dtype_arg("arange", dtype), device=_dev(device))
    return _finish(out, bool_arg("arange", "requires_grad", requires_grad, none=True))


def _linspace_infer(start, end, steps, dtype, device=None):
    if steps < 0:
        raise RuntimeError(f"linspace: number of steps must be non-negative, got {steps}")
    return Meta((steps,), dtype)


def _linspace_kernel(start, end, steps, dtype, device=None):
    return np.linspace(start, end, steps).astype(dtype.np)


_LINSPACE = defop("linspace", _linspace_infer, _linspace_kernel, grad=None,
                  cost=cost.output_only(2), to_jax=_jax.constant(_linspace_kernel),
                  to_relax=_relax.constant(_linspace_kernel))


def linspace(start, end, steps, *, dtype=None, device=None, requires_grad=False,
             out=None) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end`` inclusive."""
    start, end = (v.item() if isinstance(v, Tensor) else v for v in (start, end))
    if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool):
        raise TypeError(f"linspace(): argument 'steps' must be int, not {type(steps).__name__}")
    dt = D.dtype_arg("linspace", dtype) if dtype is not None else D.get_default_dtype()
    out = dispatch(_LINSPACE, start=start, end=end, steps=int(steps), dtype=dt,
                   device=_dev(device))
    return _finish(out, bool_arg("linspace", "requires_grad", requires_grad, none=True))


def logspace(start, end, steps, base=10.0, *, dtype=None, device=None,
             requires_grad=False, out=None) -> Tensor:
    from tessera.ops.arithmetic import pow as _pow
    lin = linspace(start, end, steps, dtype=D.float64, device=device)
    dt = D.dtype_arg("logspace", dtype) if dtype is not None else D.get_default_dtype()
    if out is not None:
        return copy(out, _pow(base, lin).to(out.dtype if dtype is None else dt), out=out)
    return _finish(_pow(base, lin).to(dt),
                   bool_arg("logspace", "requires_grad", requires_grad, none=True))


def _eye_infer(n, m, dtype, device=None):
    if n < 0 or m < 0:
        raise RuntimeError(f"eye: n and m must be non-negative, got n={n}, m={m}")
    return Meta((n, m), dtype)


def _eye_kernel(n, m, dtype, device=None):
    return np.eye(n, m, dtype=dtype.np)


_EYE = defop("eye", _eye_infer, _eye_kernel, grad=None, cost=cost.output_only(),
             to_jax=_jax.constant(_eye_kernel), to_relax=_relax.constant(_eye_kernel))


def eye(n, m=None, *, dtype=None, device=None, requires_grad=False, out=None) -> Tensor:
    """The identity matrix, ``n`` x ``m`` (``m`` defaults to ``n``)."""
    dt = D.dtype_arg("eye", dtype) if dtype is not None else D.get_default_dtype()
    out = dispatch(_EYE, n=int(n), m=int(n if m is None else m), dtype=dt, device=_dev(device))
    return _finish(out, bool_arg("eye", "requires_grad", requires_grad, none=True))


# ---- casts, moves, copies ------------------------------------------------------------

def _cast_kernel(x, dtype):
    with np.errstate(invalid="ignore", over="ignore"):  # NaN to int, 1e300 to float32: inf
        return x.astype(dtype.np)


def _cast_c(c, a, at):
    if c.dtype == "bool":
        return f"({a[0]} != 0)"
    return f"(({c.T}){a[0]})"


_ANY_SPLIT = pointwise(each=(0,))


def _cast_sbp(x, dtype):
    """Any split; partial_sum only between float types (rounding to ints is not linear)."""
    sigs = _ANY_SPLIT(x, dtype=dtype)
    if not (x.dtype.is_floating_point and dtype.is_floating_point):
        sigs = [s for s in sigs if P not in s.ins]
    return sigs


_CAST = defop("cast", lambda x, dtype: Meta(x.shape, dtype), _cast_kernel,
              grad=lambda ctx, g: (g.to(ctx.input_metas[0].dtype),), save=(),
              sbp=SbpRule(_cast_sbp), cost=cost.movement(), to_c=_cast_c,
              traits={"single_pass", "c_int"},
              to_relax=_relax.cast, to_jax=lambda jnp, lax, a, at: a[0].astype(at["dtype"].np))


def cast(input: Tensor, dtype) -> Tensor:
    """``input`` converted to ``dtype`` (``tensor.to(dtype)``)."""
    return dispatch(_CAST, input, dtype=D.as_dtype(dtype))


def _to_device_kernel(x, device, src):
    """Runs on the source device and hands the data over as a NumPy copy (a zero-stride
    placeholder when the destination keeps no data)."""
    if not _BACKENDS[device.type].has_storage:
        return np.broadcast_to(np.zeros((), x.dtype), x.shape)
    return np.array(_BACKENDS[src.type].to_numpy(x), copy=True)


class _EveryDevice(dict):
    """to_device's kernel is one function for every source device: it goes through the
    backends' NumPy conversions, so plug-in devices need not register it."""

    def get(self, key, default=None):
        return super().get(key, _to_device_kernel)


_TO_DEVICE = defop("to_device", lambda x, device, src: Meta(x.shape, x.dtype),
                   _to_device_kernel, grad=lambda ctx, g: (to_device(g, ctx.attrs["src"]),),
                   save=(), kernels=_EveryDevice(), cost=cost.movement())


def to_device(input: Tensor, device) -> Tensor:
    """``input`` copied to ``device`` (``x.to("meta")``), through NumPy between devices."""
    dst = _dev(device)
    src = input.device
    if dst == src:
        return input
    dst_backend = _BACKENDS[dst.type]
    if dst_backend.has_storage and not _BACKENDS[src.type].has_storage:
        raise NotImplementedError(f"Cannot copy out of {src.type} tensor; no data!")
    out = dispatch(_TO_DEVICE, input, device=dst, src=src)
    if isinstance(out, Tensor) and out._device != dst:
        # dispatch puts results on the inputs' device; this op's result belongs on ``dst``
        out._data = dst_backend.from_numpy(out._data, dst.index) \
            if dst_backend.has_storage else None
        out._device = dst
    return out


def _fill_infer(x, value):
    if type(value) is Meta and value.shape != ():
        raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with "
                           f"{len(value.shape)} dimensions.")
    if type(value) is not Meta:
        from tessera.ops._elementwise import checked_scalar
        checked_scalar(value, x.dtype)
    return Meta(x.shape, x.dtype)


def _fill_kernel(t, x, value):
    t[...] = _fill_value(value, t.dtype)


def _fill_cost(ins, outs, **attrs):
    """Writes the result; reads a tensor ``value`` (the destination's old values are
    overwritten, not read)."""
    value = ins[1] if len(ins) > 1 and type(ins[1]) is Meta else None
    return cost.Cost(0, cost.nbytes(value) if value is not None else 0, cost.nbytes(outs[0]))


def _fill_jax(jnp, lax, a, at):
    x, value = a
    if np.isscalar(value):  # a Python number (creation.py names dtypes float, int, ...)
        return jnp.full(x.shape, _fill_value(value, np.dtype(str(x.dtype))), x.dtype)
    return jnp.broadcast_to(value.astype(x.dtype), x.shape)


def _fill_relax(R, a, at):
    x, value = a
    dt = R.dtype(x)
    if np.isscalar(value):  # a Python number (creation.py names dtypes float, int, ...)
        return R.const(np.full(R.shape(x), _fill_value(value, np.dtype(dt))), dt)
    return R.broadcast_to(R.astype(value, dt), list(R.shape(x)))


_FILL = defop("fill", _fill_infer,
              lambda x, value: np.full(x.shape, _fill_value(value, x.dtype), x.dtype),
              grad=lambda ctx, g: (g * 0, g.sum() if ctx.needs_input_grad[1] else None),
              save=(), sbp=pointwise(), cost=_fill_cost,
              inplace_kernels={"cpu": _fill_kernel}, to_jax=_fill_jax, to_relax=_fill_relax)


def fill(input: Tensor, value, *, out=None) -> Tensor:
    """A tensor like ``input`` filled with ``value`` (``x.fill_(v)`` writes in place)."""
    return call(_FILL, input, value, out=out)


def zero(input: Tensor, *, out=None) -> Tensor:
    return call(_FILL, input, 0, out=out)


def _copy_infer(x, src, non_blocking=False):
    if type(src) is not Meta:
        raise TypeError(f"copy_(): argument 'src' must be Tensor, not {type(src).__name__}")
    broadcast_shapes("copy_", x.shape, src.shape)
    if len(src.shape) > len(x.shape) or broadcast_shapes("copy_", x.shape, src.shape) != x.shape:
        raise RuntimeError(f"copy_: the size of src {list(src.shape)} does not broadcast to "
                           f"the destination shape {list(x.shape)}")
    return Meta(x.shape, x.dtype)


def _copy_kernel(x, src, non_blocking=False):
    return np.broadcast_to(src, x.shape).astype(x.dtype, copy=True)


def _copy_grad(ctx, g):
    src_meta = ctx.input_metas[1]
    gs = sum_to(g, src_meta.shape).to(src_meta.dtype) if ctx.needs_input_grad[1] else None
    return g * 0 if ctx.needs_input_grad[0] else None, gs


def _copy_cost(ins, outs, **attrs):
    """Reads ``src`` only: the destination's old values are overwritten."""
    return cost.Cost(0, cost.nbytes(ins[1]), cost.nbytes(outs[0]))


_COPY = defop("copy", _copy_infer, _copy_kernel, grad=_copy_grad, save=(),
              sbp=pointwise(each=(1,)), cost=_copy_cost,
              inplace_kernels={"cpu": lambda t, x, src, non_blocking=False: np.copyto(
                  t, src, casting="unsafe")},
              to_relax=_relax.copy,
              to_jax=lambda jnp, lax, a, at: jnp.broadcast_to(a[1], a[0].shape))


def copy(input: Tensor, src: Tensor, non_blocking: bool = False, *, out=None) -> Tensor:
    """``src`` broadcast and cast to ``input``'s shape and dtype (``x.copy_(src)``)."""
    if isinstance(src, Tensor) and out is not None and src.device != out.device:
        src = to_device(src, out.device)
    return call(_COPY, input, src, out=out)


def _dense_non_overlapping(shape, strides) -> bool:
    """PyTorch's ``is_non_overlapping_and_dense``: some order of the dims is contiguous."""
    expected = 1
    for st, size in sorted((st, size) for size, st in zip(shape, strides) if size > 1):
        if st != expected:
            return False
        expected *= size
    return True


def _infer_dense_strides(shape, strides) -> tuple[int, ...]:
    """PyTorch's ``infer_dense_strides``: dense strides in the dim order of ``strides``
    (a stable insertion sort in which a 0 stride compares equal to anything)."""
    nd = len(shape)
    perm = list(range(nd - 1, -1, -1))  # innermost first

    def should_swap(d0: int, d1: int) -> int:
        s0, s1 = strides[d0], strides[d1]
        if s0 == 0 or s1 == 0:
            return 0
        if s0 != s1:
            return 1 if s0 > s1 else -1
        return 1 if shape[d0] > shape[d1] else 0

    for i in range(1, nd):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    out, acc = [0] * nd, 1
    for d in perm:
        out[d] = acc
        acc *= max(shape[d], 1)
    return tuple(out)


def _clone_kernel(x, contiguous=False):
    # PyTorch's preserve_format: a dense tensor keeps its strides (a transpose stays one),
    # any other gets dense strides in the same dim order
    if not contiguous and x.ndim > 1 and x.size and min(x.strides) >= 0:
        st = tuple(s // x.itemsize for s in x.strides)
        if not (x.flags.c_contiguous or _dense_non_overlapping(x.shape, st)):
            st = _infer_dense_strides(x.shape, st)
        if st != _contiguous_strides(x.shape):
            out = np.lib.stride_tricks.as_strided(np.empty(x.size, x.dtype), x.shape,
                                                  tuple(s * x.itemsize for s in st))
            out[...] = x
            return out
    return np.array(x, copy=True, order="C")


_CLONE = defop("clone", lambda x, contiguous=False: Meta(x.shape, x.dtype), _clone_kernel,
               grad=lambda ctx, g: (g,), save=(), sbp=pointwise(each=(0,)),
               cost=cost.movement(), traits={"out_form"},
               # out-form, for compiled graphs: the copy into a planned buffer
               inplace_kernels={"cpu": lambda out, x, contiguous=False: np.copyto(out, x)},
               to_relax=_relax.identity, to_jax=lambda jnp, lax, a, at: a[0])


def clone(input: Tensor, *, memory_format=None) -> Tensor:
    """A copy of ``input`` in new memory with the same strides when it is dense (PyTorch's
    ``preserve_format``); gradients flow back to ``input``.

    >>> clone(arange(6).view(2, 3).t()).stride()
    (1, 3)
    """
    return dispatch(_CLONE, input)


def contiguous(input: Tensor, memory_format=None) -> Tensor:
    """``input`` itself when already contiguous, else a contiguous copy."""
    if input.is_contiguous():
        return input
    return dispatch(_CLONE, input, contiguous=True)


def complex(real: Tensor, imag: Tensor, *, out=None) -> Tensor:
    from tessera.ops.arithmetic import mul
    z = real.to(real.dtype.to_complex()) + mul(imag.to(imag.dtype.to_complex()), 1j)
    return z if out is None else copy(out, z, out=out)


def polar(abs: Tensor, angle: Tensor, *, out=None) -> Tensor:
    from tessera.ops.unary import cos, sin
    return complex(abs * cos(angle), abs * sin(angle), out=out)


def _rebuild_tensor(array, dtype_name, device, shape, requires_grad):
    """Unpickling (and the restricted checkpoint loader) rebuild tensors through here."""
    dt = D.as_dtype(dtype_name)
    if array is None:
        t = empty(shape, dtype=dt, device=device)
    else:
        t = tensor(np.asarray(array, dtype=dt.np), dtype=dt, device=device)
    return t.requires_grad_(requires_grad) if requires_grad else t
