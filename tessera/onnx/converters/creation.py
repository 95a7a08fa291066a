"""Creation ops, both directions: ``arange`` (a constant, or a computation when it follows a
dynamic axis), ``linspace``, ``eye``, ``full``, ``empty``; ONNX's Constant,
ConstantOfShape, Range and EyeLike.

>>> from tessera.onnx.converters.registry import EXPORT, IMPORT
>>> "arange" in EXPORT, "Range" in IMPORT
(True, True)
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera.onnx._trace import Sym
from tessera.onnx.converters.helpers import as_tensor, tessera_dtype
from tessera.onnx.converters.registry import export_rule, import_rule


def _kernel_const(b, n):
    """A creation op with static attributes: its own kernel computes the constant."""
    return b.const(n.node.op.kernels["cpu"](**n.node.attrs))


@export_rule("arange")
def _arange(b, n):
    a = n.attrs
    dt = n.out_dtype()
    if not any(isinstance(a[k], Sym) for k in ("start", "end", "step")):
        return _kernel_const(b, n)
    # start + step * (cumsum(ones(length)) - 1); not Range: onnxruntime's constant sharing
    # and Gather(Range) -> Slice fusion together break a Range of shared scalars
    length = n.out_shape()[0]
    ct = D.float64 if dt.is_floating_point else D.int64
    ones = b.op("ConstantOfShape", [b.ints([length])],
                value=_tensor_attr(np.ones(1, ct.np)))
    idx = b.op("Sub", [b.op("CumSum", [ones, b.const(np.array(0, np.int64))]),
                       b.const(np.array(1, ct.np))])
    if a["step"] != 1:
        idx = b.op("Mul", [idx, b.scalar(a["step"], ct)])
    if a["start"] != 0:
        idx = b.op("Add", [idx, b.scalar(a["start"], ct)])
    return b.cast(idx, ct, dt)


def _tensor_attr(arr):
    from onnx import numpy_helper
    return numpy_helper.from_array(arr)


export_rule("linspace")(_kernel_const)
export_rule("eye")(_kernel_const)


def _fill_shape(b, n, value):
    dt = n.out_dtype()
    v = np.asarray(value)
    if dt is D.bool_:
        v = v.astype(bool)
    return b.op("Expand", [b.const(v.astype(dt.np)), b.ints(n.out_shape())])


export_rule("full")(lambda b, n: _fill_shape(b, n, n.attrs["value"]))
export_rule("empty")(lambda b, n: _fill_shape(b, n, 0))


@import_rule("Constant")
def _import_constant(c):
    from onnx import numpy_helper
    a = c.attrs
    if "value" in a:
        return as_tensor(numpy_helper.to_array(a["value"]))
    for k, dt in (("value_float", np.float32), ("value_int", np.int64),
                  ("value_floats", np.float32), ("value_ints", np.int64)):
        if k in a:
            return as_tensor(np.array(a[k], dt))
    raise NotImplementedError(f"attribute {sorted(a)}")


@import_rule("ConstantOfShape")
def _import_constant_of_shape(c, shape):
    from onnx import numpy_helper
    v = c.attr("value")
    arr = numpy_helper.to_array(v) if v is not None else np.zeros(1, np.float32)
    return as_tensor(np.full(c.ints(shape), arr.reshape(-1)[0], arr.dtype))


@import_rule("Range")
def _import_range(c, start, limit, delta):
    s, e, d = (c.value(t).item() for t in (start, limit, delta))
    n = max(int(np.ceil((e - s) / d)), 0)
    return as_tensor((s + d * np.arange(n)).astype(c.value(start).dtype))


@import_rule("EyeLike")
def _import_eye_like(c, x):
    dt = tessera_dtype(c.attr("dtype")) if c.attr("dtype") is not None else x.dtype
    return as_tensor(np.eye(x.shape[0], x.shape[1], k=c.attr("k", 0), dtype=dt.np))
