"""``linear`` and ``bilinear``: composites of one matrix product and a bias add.

>>> import tessera
>>> import tessera.nn.functional as F
>>> F.linear(tessera.ones(2, 3), tessera.ones(4, 3), tessera.zeros(4)).shape
tessera.Size([2, 4])
"""
from __future__ import annotations

from tessera._dispatch import _MODES, composite_args
from tessera._tensor import Tensor
from tessera.ops._util import ensure_tensor
from tessera.ops.linalg import _expand_check, addmm, matmul

__all__ = ["linear", "bilinear"]


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``input @ weight.T + bias``: one GEMM over all leading dims, then the bias add.

    >>> import tessera
    >>> linear(tessera.ones(3), tessera.ones(2, 3)).tolist()
    [3.0, 3.0]
    """
    ensure_tensor("linear", input)
    ensure_tensor("linear", weight, "weight")
    if _MODES:  # autocast casts input, weight and bias as one op
        input, weight, bias = composite_args("linear", (input, weight, bias))
    if input.dim() == 0 or weight.dim() == 0:
        raise RuntimeError(f"both arguments to linear need to be at least 1D, but they are "
                           f"{input.dim()}D and {weight.dim()}D")
    if weight.dim() > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is "
                           f"{weight.dim()}D")
    wt = weight.t()
    if bias is not None:
        ensure_tensor("linear", bias, "bias")
        if input.dim() == 2 and weight.dim() == 2:  # PyTorch's addmm path and its messages
            return addmm(bias, input, wt)
    if input.dim() > 2 and weight.dim() == 2 and input.shape[-1] == weight.shape[1]:
        # one 2-d GEMM over all leading dims: NumPy's batched matmul with a transposed
        # operand does not reach BLAS and is several times slower
        lead = tuple(input.shape[:-1])
        out = matmul(input.reshape(-1, input.shape[-1]), wt).reshape(lead + (wt.shape[1],))
    else:
        out = matmul(input, wt)
    if bias is None:
        return out
    _expand_check(bias, tuple(out.shape))
    if bias.dtype is not out.dtype:
        raise RuntimeError(f"result type {_tname(bias.dtype)} can't be cast to the desired "
                           f"output type {_tname(out.dtype)}")
    return out + bias


def _tname(d) -> str:
    return {"float32": "Float", "float64": "Double", "float16": "Half",
            "bfloat16": "BFloat16"}.get(d.name, d.name)


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor,
             bias: Tensor | None = None) -> Tensor:
    """``y[..., o] = sum_ij x1[..., i] W[o, i, j] x2[..., j] + b[o]``.

    >>> import tessera
    >>> bilinear(tessera.ones(2, 3), tessera.ones(2, 4), tessera.ones(5, 3, 4)).shape
    tessera.Size([2, 5])
    """
    for name, t in (("input1", input1), ("input2", input2), ("weight", weight)):
        ensure_tensor("bilinear", t, name)
    _bilinear_check(input1, input2, weight, bias)
    out_f, in1, in2 = weight.shape
    lead = tuple(input1.shape[:-1])
    x1 = input1.reshape(-1, in1)
    x2 = input2.reshape(-1, in2)
    # (B, in1) @ (in1, out * in2): one GEMM, then a per-row contraction with x2
    t = matmul(x1, weight.permute(1, 0, 2).reshape(in1, out_f * in2))
    y = matmul(t.reshape(-1, out_f, in2), x2.unsqueeze(-1)).squeeze(-1)
    if bias is not None:
        y = y + bias
    return y.reshape(lead + (out_f,))


def _bilinear_check(input1, input2, weight, bias) -> None:
    if input1.dim() != input2.dim():
        raise RuntimeError(f"bilinear(): input dimensions do not match: got {input1.dim()} and "
                           f"{input2.dim()}")
    for i in range(input1.dim() - 1):
        if input1.shape[i] != input2.shape[i]:
            raise RuntimeError(f"bilinear(): input batch dimensions do not match: got "
                               f"{input1.shape[i]} and {input2.shape[i]}")
    if weight.dim() != 3:
        n = weight.dim()
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {n})")
    if input1.shape[-1] != weight.shape[1]:
        raise RuntimeError(f"bilinear(): input1 size does not match weight size: got "
                           f"{input1.shape[-1]} but expected {weight.shape[1]}")
    if input2.shape[-1] != weight.shape[2]:
        raise RuntimeError(f"bilinear(): input2 size does not match weight size: got "
                           f"{input2.shape[-1]} but expected {weight.shape[2]}")
    if bias is not None and (bias.dim() == 0 or bias.shape[0] != weight.shape[0]):
        got = bias.shape[0] if bias.dim() else "()"
        raise RuntimeError(f"bilinear(): bias size does not match weight size: got {got} but "
                           f"expected {weight.shape[0]}")
