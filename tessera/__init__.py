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
from tessera import _tensor_methods, autograd, ops  # noqa: E402
from tessera._functions import *  # noqa: F401,F403,E402  (public op functions)
from tessera.autograd import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from tessera.ops.queries import (
    can_cast,
    get_default_device,
    is_complex,
    is_floating_point,
    is_tensor,
    numel,
    result_type,
)
from tessera.serialization import load, save  # noqa: E402

__version__ = "0.1.0"

half, float, double = float16, float32, float64  # noqa: A001
short, int, long = int16, int32, int64  # noqa: A001
cfloat, cdouble = complex64, complex128
uint8 = uint8



from tessera import nn, optim, utils  # noqa: E402  (reachable as attributes, as in PyTorch)
from tessera.nn.functional._toplevel import (  # noqa: E402  (torch.selu, torch.kl_div...)
    binary_cross_entropy_with_logits,
    cdist,
    celu,
    celu_,
    cosine_embedding_loss,
    cosine_similarity,
    hardshrink,
    hinge_embedding_loss,
    kl_div,
    margin_ranking_loss,
    pairwise_distance,
    pdist,
    poisson_nll_loss,
    prelu,
    relu_,
    rrelu,
    rrelu_,
    selu,
    selu_,
    sigmoid_,
    tanh_,
    threshold,
    threshold_,
    triplet_margin_loss,
)

# the Tensor methods among them (x.prelu(w), x.hardshrink()), bound as the ops' ones are
_tensor_methods._OPS.update(hardshrink=hardshrink, prelu=prelu)
_tensor_methods.bind_methods()
from tessera._dtype import finfo, iinfo  # noqa: E402
from tessera._runtime.threads import get_num_threads, set_num_threads  # noqa: E402
# global tensors (placement + SBP), each OpDef's sbp rule, the process API; MPI is imported
# only by a process that runs under mpiexec
from tessera import distributed  # noqa: E402
from tessera import sbp  # noqa: E402
from tessera.distributed.placement import placement  # noqa: E402
from tessera.distributed import optim as _optim  # noqa: E402,F401  (torch.distributed.optim)
from tessera.nn import parallel as _parallel  # noqa: E402,F401  (torch.nn.parallel)
