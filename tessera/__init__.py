"""Tessera: a deep learning framework with PyTorch's interface and OneFlow's design.

``import tessera as torch`` runs ordinary PyTorch code eagerly on NumPy. Every op is one
``OpDef`` in ``tessera.ops.REGISTRY`` and every call goes through one ``dispatch``.

>>> import tessera as torch
>>> x = torch.randn(3, 4, requires_grad=True)
>>> loss = (x @ x.T).relu().sum()
>>> loss.backward(); x.grad.shape
tessera.Size([3, 4])
"""
from __future__ import annotations

from tessera._runtime.blas_env import tune_openblas as _tune_openblas

_tune_openblas()  # before NumPy loads OpenBLAS: see tessera/_runtime/blas_env.py

from tessera._runtime.malloc import keep_freed_memory as _keep_freed_memory  # noqa: E402

_keep_freed_memory()  # before the first tensors: see tessera/_runtime/malloc.py

from tessera import _dtype  # noqa: E402
from tessera._dtype import (
    bfloat16,
    complex64,
    complex128,
    dtype,
    float16,
    float32,
    float64,
    get_default_dtype,
    int8,
    int16,
    int32,
    int64,
    promote_types,
    set_default_dtype,
    uint8,
)
from tessera._dtype import bool_ as bool  # noqa: A001  (PyTorch's name)
from tessera._tensor import Size, Tensor
from tessera._tensor_str import set_printoptions
from tessera.device import device, register_device
from tessera import autograd, ops  # noqa: E402
from tessera._functions import *  # noqa: F401,F403,E402  (public op functions)
from tessera.autograd import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from tessera.serialization import load, save  # noqa: E402

__version__ = "0.1.0"

half, float, double = float16, float32, float64  # noqa: A001
short, int, long = int16, int32, int64  # noqa: A001
cfloat, cdouble = complex64, complex128
uint8 = uint8


def is_tensor(obj) -> builtins_bool:
    """True for tessera Tensors (and Parameters)."""
    return isinstance(obj, Tensor)


def is_floating_point(input: Tensor) -> builtins_bool:
    return input.dtype.is_floating_point


def is_complex(input: Tensor) -> builtins_bool:
    return input.dtype.is_complex


def numel(input: Tensor) -> builtins_int:
    return input.numel()


def result_type(tensor1, tensor2) -> dtype:
    """The dtype an op on these two operands would produce (PyTorch's rules)."""
    def arg(x):
        return (x.dtype, x.dim()) if isinstance(x, Tensor) else x
    return _dtype.result_type(arg(tensor1), arg(tensor2))


def can_cast(from_: dtype, to: dtype) -> builtins_bool:
    """Whether a value of ``from_`` may be written into ``to`` by an in-place op."""
    return from_.category <= to.category


def get_default_device() -> device:
    return device("cpu")


import builtins as _builtins  # noqa: E402

builtins_bool, builtins_int = _builtins.bool, _builtins.int

from tessera import nn, optim, utils  # noqa: E402  (reachable as attributes, as in PyTorch)
from tessera._dtype import finfo, iinfo  # noqa: E402
from tessera._runtime.threads import get_num_threads, set_num_threads  # noqa: E402
# global tensors (placement + SBP), each OpDef's sbp rule, the process API; MPI is imported
# only by a process that runs under mpiexec
from tessera import distributed  # noqa: E402
from tessera import sbp  # noqa: E402
from tessera.distributed.placement import placement  # noqa: E402
