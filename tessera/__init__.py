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

import importlib as _importlib
import sys as _sys
import typing as _typing

from tessera._runtime.blas_env import tune_openblas as _tune_openblas

_tune_openblas()  # before NumPy loads OpenBLAS: see tessera/_runtime/blas_env.py

from tessera._runtime.malloc import keep_freed_memory as _keep_freed_memory  # noqa: E402

_keep_freed_memory()  # before the first tensors: see tessera/_runtime/malloc.py

from tessera import _tensor_methods, _tensor_ops  # noqa: E402,F401  (Tensor's method table)
from tessera._dtype import (  # noqa: E402
    bfloat16,
    complex64,
    complex128,
    dtype,
    finfo,
    float16,
    float32,
    float64,
    get_default_dtype,
    iinfo,
    int8,
    int16,
    int32,
    int64,
    promote_types,
    set_default_dtype,
    uint8,
)
from tessera._dtype import bool_ as bool  # noqa: A001,E402  (PyTorch's name)
from tessera._runtime.threads import get_num_threads, set_num_threads  # noqa: E402
from tessera._tensor import (  # noqa: E402
    Size,
    Tensor,
    channels_last,
    channels_last_3d,
    contiguous_format,
    jagged,
    layout,
    memory_format,
    preserve_format,
    sparse_bsc,
    sparse_bsr,
    sparse_coo,
    sparse_csc,
    sparse_csr,
    strided,
)
from tessera._tensor_str import set_printoptions  # noqa: E402
from tessera.device import device, register_device  # noqa: E402

# every op family's public functions (each module lists them in its __all__)
from tessera.ops.creation import *  # noqa: E402,F403
from tessera.ops.unary import *  # noqa: E402,F403
from tessera.ops.arithmetic import *  # noqa: E402,F403
from tessera.ops.comparison import *  # noqa: E402,F403
from tessera.ops.ternary import *  # noqa: E402,F403
from tessera.ops.views import *  # noqa: E402,F403
from tessera.ops.getitem import *  # noqa: E402,F403
from tessera.ops.reduce import *  # noqa: E402,F403
from tessera.ops.scan import *  # noqa: E402,F403
from tessera.ops.gather_scatter import *  # noqa: E402,F403
from tessera.ops.index_slices import *  # noqa: E402,F403
from tessera.ops.flat_index import *  # noqa: E402,F403
from tessera.ops.shape import *  # noqa: E402,F403
from tessera.ops.broadcast import *  # noqa: E402,F403
from tessera.ops.sorting import *  # noqa: E402,F403
from tessera.ops.linalg import *  # noqa: E402,F403
from tessera.ops.random import *  # noqa: E402,F403
from tessera.ops.activation import *  # noqa: E402,F403
from tessera.ops.einsum import *  # noqa: E402,F403
from tessera.ops.sparse import *  # noqa: E402,F403
from tessera.ops.quantized import *  # noqa: E402,F403
from tessera.ops.inplace import *  # noqa: E402,F403
from tessera.ops.queries import (  # noqa: E402
    can_cast,
    get_default_device,
    is_complex,
    is_floating_point,
    is_tensor,
    numel,
    result_type,
)

from tessera import autograd, ops, sbp  # noqa: E402
from tessera.autograd import (  # noqa: E402
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from tessera.serialization import load, save  # noqa: E402

# the layers above the ops, reachable as attributes as in PyTorch
from tessera import codegen as _codegen  # noqa: E402,F401  (registers the C code generator)
from tessera import distributed, nn, optim, utils  # noqa: E402
from tessera.distributed import optim as _optim  # noqa: E402,F401  (torch.distributed.optim)
from tessera.distributed.placement import placement  # noqa: E402
from tessera.nn import parallel as _parallel  # noqa: E402,F401  (torch.nn.parallel)
from tessera.compiler import compile  # noqa: E402  (and nn.Graph's xla and tvm backends)
from tessera.graph import backend as _graph_backend  # noqa: E402


def _graph_program(*args):
    """nn.Graph's programs (``tessera.deploy.program``): registered here, since deploy is
    above the graph layer, and imported on the first inference graph that compiles."""
    from tessera.deploy.program import make
    return make(*args)


_graph_backend.register_program(_graph_program)
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
    alpha_dropout,
    alpha_dropout_,
    dropout,
    dropout_,
    feature_alpha_dropout,
    feature_alpha_dropout_,
    feature_dropout,
    feature_dropout_,
    selu,
    selu_,
    sigmoid_,
    tanh_,
    threshold,
    threshold_,
    triplet_margin_loss,
)

# PyTorch's device, precision and process namespaces (torch.cuda, torch.backends...);
# multiprocessing registers Tensor.share_memory_ and the tensor reducers
from tessera import accelerator, amp, backends, cuda, multiprocessing, version  # noqa: E402
from tessera import _legacy_types  # noqa: E402
from tessera._legacy_types import CPU_TYPES as _CPU_TYPES  # noqa: E402
from tessera.amp.autocast_mode import (  # noqa: E402
    autocast,
    autocast_decrement_nesting,
    autocast_increment_nesting,
    clear_autocast_cache,
    get_autocast_cpu_dtype,
    get_autocast_dtype,
    get_autocast_gpu_dtype,
    is_autocast_cache_enabled,
    is_autocast_enabled,
    set_autocast_cache_enabled,
    set_autocast_dtype,
    set_autocast_enabled,
)
from tessera.backends import (  # noqa: E402
    are_deterministic_algorithms_enabled,
    get_float32_matmul_precision,
    is_deterministic_algorithms_warn_only_enabled,
    set_float32_matmul_precision,
    use_deterministic_algorithms,
)

from tessera.nn.modules import (  # noqa: E402,F401  (PyTorch's module paths of nn's layers)
    channelshuffle,
    fold,
    instancenorm,
    pixelshuffle,
    upsampling,
)
from tessera.nn.parallel import distributed as _ddp_path  # noqa: E402,F401

# torch.ops.aten.<name>: tessera's function of that name, else the Tensor method, else
# nn.functional's (tessera.ops.library)
ops.library.add_aten_source(_sys.modules[__name__])
ops.library.add_aten_source(Tensor)
ops.library.add_aten_source(nn.functional)

globals().update(_CPU_TYPES)  # tessera.FloatTensor, LongTensor...: PyTorch's legacy types
for _name, _cls in _legacy_types.CUDA_TYPES.items():
    setattr(cuda, _name, _cls)

# the Tensor methods among them (x.prelu(w), x.hardshrink()), bound as the ops' ones are
_tensor_methods._OPS.update(hardshrink=hardshrink, prelu=prelu)
_tensor_methods.bind_methods()



# PyTorch's functional spellings of Tensor predicates
def is_nonzero(input: Tensor):
    """Whether a one-element tensor is nonzero.

    >>> import tessera
    >>> tessera.is_nonzero(tessera.tensor([3])), tessera.is_signed(tessera.ones(1))
    (True, True)
    """
    return input.is_nonzero()


def is_same_size(input: Tensor, other: Tensor):
    return input.is_same_size(other)


def is_signed(input: Tensor):
    return input.is_signed()


def is_neg(input: Tensor):
    return input.is_neg()


def is_conj(input: Tensor):
    return input.is_conj()


def is_distributed(input: Tensor):
    return input.is_distributed()


def is_storage(obj):
    """False: tessera has no separate storage objects (``untyped_storage()`` is an array)."""
    return False

__version__ = "0.1.0"

half, float, double = float16, float32, float64  # noqa: A001
short, int, long = int16, int32, int64  # noqa: A001
cfloat, cdouble = complex64, complex128

# subpackages loaded on first use (PEP 562): ``tessera.models.resnet18()`` works after a
# plain ``import tessera``, which does not pay for them (nor import ``onnx``)
_LAZY = ("models", "datasets", "onnx", "parallel", "kernels", "profiler", "distributions", "fx",
         "sparse", "ao", "testing", "library", "linalg")


def __getattr__(name: str):
    if name in _LAZY:
        return _importlib.import_module(f"tessera.{name}")
    raise AttributeError(f"module 'tessera' has no attribute '{name}'")


if _typing.TYPE_CHECKING:
    from tessera import (  # noqa: F401
        datasets,
        distributions,
        fx,
        kernels,
        library,
        linalg,
        models,
        onnx,
        parallel,
        profiler,
        sparse,
    )
