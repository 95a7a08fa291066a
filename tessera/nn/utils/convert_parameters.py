"""Flatten parameters into one vector and back (``parameters_to_vector`` and
``vector_to_parameters``).

>>> import tessera
>>> ps = [tessera.ones(2, 2), tessera.zeros(3)]
>>> tessera.nn.utils.parameters_to_vector(ps).shape
tessera.Size([7])
"""
from __future__ import annotations

from collections.abc import Iterable

from tessera._tensor import Tensor

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def _check_param_device(param: Tensor, old):
    """All parameters must share one device (PyTorch's rule and error)."""
    dev = param.device
    if old is None:
        return dev
    if dev != old:
        raise TypeError("Found two parameters on different devices, this is currently not "
                        "supported.")
    return old


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """One 1-d tensor holding every parameter, flattened, in order (differentiable)."""
    from tessera.ops.shape import cat
    device = None
    vec = []
    for param in parameters:
        device = _check_param_device(param, device)
        vec.append(param.view(-1))
    return cat(vec)


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Point each parameter's ``.data`` at its slice of ``vec`` (views, no copies)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    device = None
    pointer = 0
    for param in parameters:
        device = _check_param_device(param, device)
        n = param.numel()
        param.data = vec[pointer:pointer + n].view_as(param).data
        pointer += n
