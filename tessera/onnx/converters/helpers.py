"""What the converter families share: reading a node's operands and axes on the export side,
and the context an import rule receives (``ImportContext``).

An export rule is ``rule(b, n)``: ``b`` the ``Builder`` (``b.op``, ``b.const``, ``b.ints``,
``b.cast``), ``n`` the ``NodeView`` (``n.ins``: ONNX names of tensor inputs, Python values of
the others; ``n.attrs``; symbolic shapes and dtypes). An import rule is ``rule(c, *inputs)``
with tessera tensors (None for an omitted optional input); ``c.attr(name, default)`` reads
attributes, ``c.ints(t)`` the value of a constant tensor. A rule that meets a case it cannot
express raises ``NotImplementedError`` with the reason; the exporter or importer adds the op
and where it is.

>>> norm_axis(-1, 3), reduce_axes((0, -1), 3), reduce_axes(None, 3)
(2, [0, 2], None)
>>> axes_input_since("ReduceSum"), axes_input_since("ReduceMax")
(13, 18)
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Tensor

__all__ = ["operand", "common_dtype", "norm_axis", "reduce_axes", "static_prod",
           "unary_composite", "axes_input_since", "reduce_over", "ImportContext",
           "tessera_dtype", "same_dtype", "as_tensor"]

# ---- export side -----------------------------------------------------------------------


def operand(b, n, i: int, dtype=None) -> str:
    """Input ``i`` as an ONNX tensor of tessera dtype ``dtype`` (a Python number becomes a
    constant)."""
    x = n.ins[i]
    if n.is_tensor(i):
        return b.cast(x, n.dtype(i), dtype) if dtype is not None else x
    if x is None:
        raise NotImplementedError(f"input {i} is None")
    return b.scalar(x, dtype if dtype is not None else D.scalar_dtype(x))


def common_dtype(n, idx) -> D.dtype:
    """The dtype PyTorch's promotion gives inputs ``idx`` of node ``n``."""
    args = []
    for i in idx:
        if n.is_tensor(i):
            args.append((n.dtype(i), n.rank(i)))
        elif n.ins[i] is not None:
            args.append(n.ins[i])
    return D.result_type(*args)


def norm_axis(d: int, rank: int) -> int:
    """Axis ``d`` (maybe negative) of a rank-``rank`` tensor as a non-negative axis."""
    return d % rank if rank else 0


def reduce_axes(dim, rank: int) -> list[int] | None:
    """Reduction dims as sorted non-negative axes; None for all dims."""
    if dim is None or dim == () or dim == [] or rank == 0:
        return None
    if isinstance(dim, int):
        dim = (dim,)
    return sorted(norm_axis(d, rank) for d in dim)


def static_prod(shape) -> int:
    """The product of ``shape``, which must not have dynamic dims."""
    out = 1
    for s in shape:
        if not isinstance(s, int):
            raise NotImplementedError("needs a static size of a dynamic dimension")
        out *= s
    return out


def unary_composite(fn):
    """An export rule from ``fn(b, x, dtype, attrs) -> name``, ``x`` being input 0 in the
    output dtype."""
    def rule(b, n):
        dt = n.out_dtype()
        return fn(b, operand(b, n, 0, dt), dt, n.attrs)
    rule.__name__ = getattr(fn, "__name__", "rule")
    return rule


def axes_input_since(reduction: str) -> int:
    """The opset from which ONNX reduction ``reduction`` takes its axes as an input."""
    return 13 if reduction == "ReduceSum" else 18


def reduce_over(b, op: str, x: str, axes, keepdims: bool) -> str:
    """ONNX reduction ``op`` of ``x`` over ``axes`` (None: all)."""
    keep = int(bool(keepdims))
    if axes is None:
        return b.op(op, [x], keepdims=keep)
    if b.opset >= axes_input_since(op):
        return b.op(op, [x, b.ints(axes)], keepdims=keep)
    return b.op(op, [x], axes=list(axes), keepdims=keep)


# ---- import side -----------------------------------------------------------------------

class ImportContext:
    """What an import rule knows about its ONNX node: attributes, the model's opset and how
    error messages name the node (``where``)."""

    def __init__(self, node, opset: int, index: int | None = None):
        from onnx import helper

        from tessera.onnx.validate import describe
        self.node = node
        self.opset = opset
        self.where = describe(node, index)
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        for k, v in self.attrs.items():
            if isinstance(v, bytes):
                self.attrs[k] = v.decode()

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def axis(self, name: str, rank: int, default: int = 0) -> int:
        """Attribute ``name`` as an axis of a rank-``rank`` tensor, in [0, rank); ONNX
        allows [-rank, rank - 1] and anything else is an invalid model (wrapping it
        would run a different one)."""
        return self.check_axis(self.attr(name, default), rank, f"attribute '{name}'")

    def check_axis(self, a: int, rank: int, what: str) -> int:
        """``a`` (``what``: how the message names it) as an axis in [0, rank)."""
        from tessera.onnx.errors import OnnxValidationError
        if not -rank <= a < rank:
            raise OnnxValidationError(f"{self.where}: {what} is {a}; a rank-{rank} tensor "
                                      f"takes an axis from {-rank} to {rank - 1}")
        return a % rank

    def ints(self, t) -> list[int]:
        """The value of a (constant) integer tensor as a list."""
        return [int(v) for v in np.asarray(t.numpy()).reshape(-1)]

    def value(self, t) -> np.ndarray:
        return np.asarray(t.numpy())


# onnx.TensorProto data type -> tessera dtype
DTYPES = {1: D.float32, 2: D.uint8, 3: D.int8, 5: D.int16, 6: D.int32, 7: D.int64,
          9: D.bool_, 10: D.float16, 11: D.float64, 14: D.complex64, 15: D.complex128,
          16: D.bfloat16}


def tessera_dtype(onnx_type: int) -> D.dtype:
    """The tessera dtype of an ``onnx.TensorProto`` data type.

    >>> tessera_dtype(1)
    tessera.float32
    """
    dt = DTYPES.get(onnx_type)
    if dt is None:
        raise NotImplementedError(f"data type {onnx_type} is not supported")
    return dt


def same_dtype(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``(a, b)``; inputs ONNX requires to share a type must (tessera would promote)."""
    if a.dtype is not b.dtype:
        raise NotImplementedError(f"inputs of types {a.dtype} and {b.dtype}")
    return a, b


def as_tensor(arr) -> Tensor:
    """A tessera tensor owning a copy of ``arr``."""
    return Tensor._from_numpy(np.array(arr, copy=True))
