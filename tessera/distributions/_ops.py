"""The tensor functions the distributions are written with, gathered from the op families
(the package sits above the ops and cannot import the ``tessera`` namespace itself).

>>> from tessera.distributions import _ops as T
>>> T.lgamma(T.tensor([3.0]))
tensor([0.6931])
"""
from tessera._dtype import (  # noqa: F401
    bool_ as bool,  # noqa: A001,F401  (PyTorch's name)
    finfo,
    float32,
    float64,
    get_default_dtype,
    int64,
)
from tessera._tensor import Size, Tensor  # noqa: F401
from tessera.autograd import grad  # noqa: F401
from tessera.autograd.grad_mode import enable_grad, no_grad  # noqa: F401
from tessera.nn.functional import binary_cross_entropy_with_logits, one_hot, softplus  # noqa: F401,E501
from tessera.ops.activation import *  # noqa: F403
from tessera.ops.arithmetic import *  # noqa: F403
from tessera.ops.broadcast import *  # noqa: F403
from tessera.ops.comparison import *  # noqa: F403
from tessera.ops.creation import *  # noqa: F403
from tessera.ops.linalg import *  # noqa: F403
from tessera.ops.linalg import linalg_cholesky, solve_triangular  # noqa: F401
from tessera.ops.random import *  # noqa: F403
from tessera.ops.reduce import *  # noqa: F403
from tessera.ops.scan import *  # noqa: F403
from tessera.ops.shape import *  # noqa: F403
from tessera.ops.ternary import *  # noqa: F403
from tessera.ops.unary import *  # noqa: F403
from tessera.ops.views import *  # noqa: F403
