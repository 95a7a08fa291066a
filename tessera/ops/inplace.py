"""PyTorch's top-level in-place functions: ``torch.sin_(x)``, ``torch.clamp_(x, min=0)``,
``torch.zero_(x)``... Each is the Tensor method of the same name called on its first
argument, so the two spellings cannot differ.

>>> import tessera
>>> x = tessera.tensor([-1.0, 0.5, 2.0])
>>> tessera.clamp_(x, min=0.0, max=1.0) is x, x.tolist()
(True, [0.0, 0.5, 1.0])
>>> tessera.zero_(x).tolist()
[0.0, 0.0, 0.0]
"""
from __future__ import annotations

from collections.abc import Callable

from tessera.ops._util import ensure_tensor

# the in-place functions PyTorch exposes at top level whose Tensor method tessera has
# (relu_, sigmoid_, tanh_, selu_, celu_, rrelu_, threshold_ and the dropouts come with
# nn.functional's top-level names)
NAMES = (
    "abs_", "acos_", "acosh_", "addmv_", "arccos_", "arccosh_", "arcsin_", "arcsinh_",
    "arctan_", "arctanh_", "asin_", "asinh_", "atan_", "atanh_", "ceil_", "clamp_",
    "clamp_max_", "clamp_min_", "clip_", "cos_", "cosh_", "detach_", "erf_", "erfc_",
    "exp2_", "exp_", "expm1_", "fill_", "fix_", "floor_", "frac_", "index_put_", "log10_",
    "log1p_", "log2_", "log_", "logit_", "nan_to_num_", "neg_", "negative_", "reciprocal_",
    "round_", "rsqrt_", "sin_", "sinh_", "sqrt_", "square_", "tan_", "trunc_", "zero_",
)

__all__ = list(NAMES)


def _form(name: str) -> Callable:
    def fn(input, *args, **kwargs):
        # looked up on the tensor: a subclass's own method (a sparse tensor's) applies
        return getattr(ensure_tensor(name, input), name)(*args, **kwargs)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``input.{name}(...)``: in-place, returns ``input`` (PyTorch's torch.{name})."
    return fn


globals().update({name: _form(name) for name in NAMES})
