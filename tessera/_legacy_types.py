"""PyTorch's legacy tensor types: ``tessera.FloatTensor(2, 3)``, ``LongTensor([1, 2])``,
``isinstance(x, tessera.FloatTensor)``, ``x.type(tessera.LongTensor)``.

Each is a class whose instances are never made: calling it returns a plain ``Tensor`` of
its dtype (uninitialised from sizes, copied from data), and ``isinstance`` asks whether a
tensor has its dtype and lives on its device, as PyTorch answers.

>>> import tessera
>>> x = tessera.FloatTensor([1, 2])
>>> isinstance(x, tessera.FloatTensor), isinstance(x, tessera.LongTensor), x.type()
(True, False, 'tessera.FloatTensor')
>>> tessera.LongTensor(2, 3).shape, x.type(tessera.LongTensor).dtype
(tessera.Size([2, 3]), tessera.int64)
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Size, Tensor
from tessera.device import device as _device
from tessera.ops.creation import empty, tensor

_NAMES = {"FloatTensor": D.float32, "DoubleTensor": D.float64, "HalfTensor": D.float16,
          "BFloat16Tensor": D.bfloat16, "LongTensor": D.int64, "IntTensor": D.int32,
          "ShortTensor": D.int16, "CharTensor": D.int8, "ByteTensor": D.uint8,
          "BoolTensor": D.bool_}


class _TensorType(type):
    dtype: D.dtype
    device_type: str

    def __instancecheck__(cls, obj) -> bool:
        return (isinstance(obj, Tensor) and obj.dtype is cls.dtype and
                obj.device.type == cls.device_type)

    def __call__(cls, *args, device=None, **kwargs) -> Tensor:
        name = f"{cls.__module__}.{cls.__qualname__}"
        if kwargs:
            raise TypeError(f"new() received an invalid combination of arguments - got "
                            f"{', '.join(kwargs)}=..., but {name} takes sizes or data and "
                            "device= only")
        if device is not None and _device(device).type != cls.device_type:
            raise RuntimeError(f"legacy constructor expects device type: {cls.device_type} "
                               f"but device type: {_device(device).type} was passed")
        dev = _device(cls.device_type)
        if len(args) == 1 and isinstance(args[0], Tensor):
            if args[0].dtype is not cls.dtype:
                raise TypeError(f"expected {cls.dtype} (got {args[0].dtype})")
            return args[0].detach()
        if len(args) == 1 and isinstance(args[0], (list, tuple, np.ndarray)) and \
                not isinstance(args[0], Size):
            return tensor(args[0], dtype=cls.dtype, device=dev)
        if len(args) == 1 and isinstance(args[0], (float, complex)):
            raise TypeError(f"new(): data must be a sequence (got {type(args[0]).__name__})")
        return empty(*(args or (0,)), dtype=cls.dtype, device=dev)

    def __repr__(cls) -> str:
        return f"<class '{cls.__module__}.{cls.__qualname__}'>"

    @property
    def is_cuda(cls) -> bool:
        return cls.device_type == "cuda"

    @property
    def is_sparse(cls) -> bool:
        return False


def _make(name: str, dtype: D.dtype, device_type: str, module: str) -> _TensorType:
    cls = _TensorType(name, (), {"__module__": module, "__doc__":
                                 f"A {dtype} tensor on the {device_type} (legacy type)."})
    cls.dtype = dtype
    cls.device_type = device_type
    return cls


CPU_TYPES = {name: _make(name, dt, "cpu", "tessera") for name, dt in _NAMES.items()}
CUDA_TYPES = {name: _make(name, dt, "cuda", "tessera.cuda") for name, dt in _NAMES.items()}


def type_by_name(name: str) -> _TensorType | None:
    """``'torch.LongTensor'``, ``'tessera.cuda.FloatTensor'`` -> the legacy type."""
    head, _, last = name.rpartition(".")
    table = CUDA_TYPES if head.endswith(".cuda") else CPU_TYPES
    return table.get(last)
