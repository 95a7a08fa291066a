"""Questions about tensors and dtypes that compute nothing: ``is_tensor``,
``is_floating_point``, ``result_type``, ``can_cast``... (PyTorch's top-level functions).

>>> import tessera
>>> result_type(tessera.ones(2, dtype=tessera.int32), 1.5)
tessera.float32
"""
from __future__ import annotations

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.device import device

__all__ = ["is_tensor", "is_floating_point", "is_complex", "numel", "result_type", "can_cast",
           "get_default_device"]


def is_tensor(obj) -> bool:
    """True for tessera Tensors (and Parameters).

    >>> is_tensor(Tensor([1.0]))
    True
    """
    return isinstance(obj, Tensor)


def is_floating_point(input: Tensor) -> bool:
    return input.dtype.is_floating_point


def is_complex(input: Tensor) -> bool:
    return input.dtype.is_complex


def numel(input: Tensor) -> int:
    return input.numel()


_ABSENT = object()


def result_type(tensor1=_ABSENT, tensor2=_ABSENT, *, tensor=_ABSENT, other=_ABSENT,
                scalar=_ABSENT, scalar1=_ABSENT, scalar2=_ABSENT) -> D.dtype:
    """The dtype an op on these two operands would produce (PyTorch's rules); the operands
    by position or by PyTorch's keywords (``tensor``/``other``, ``scalar``, ``scalar1``/
    ``scalar2``).

    >>> import tessera
    >>> result_type(tensor=tessera.ones(1, dtype=tessera.int32), other=2.5)
    tessera.float32
    """
    given = [v for v in (tensor1, tensor, scalar1, tensor2, other, scalar, scalar2)
             if v is not _ABSENT]
    if scalar is not _ABSENT and tensor is not _ABSENT and scalar1 is _ABSENT:
        given = [scalar, tensor] if tensor1 is _ABSENT else given
    if len(given) != 2:
        raise TypeError("result_type() takes two operands")
    tensor1, tensor2 = given

    def arg(x):
        return (x.dtype, x.dim()) if isinstance(x, Tensor) else x
    return D.result_type(arg(tensor1), arg(tensor2))


def can_cast(from_: D.dtype, to: D.dtype) -> bool:
    """Whether a value of ``from_`` may be written into ``to`` by an in-place op.

    >>> can_cast(D.int32, D.float32), can_cast(D.float32, D.int32)
    (True, False)
    """
    return from_.category <= to.category


def get_default_device() -> device:
    return device("cpu")
