"""Linear algebra, both directions: ``matmul`` (MatMul), ``vdot``, ``einsum`` (Einsum) and
ONNX's ``Gemm``.

>>> from tessera.onnx.converters.registry import EXPORT, IMPORT
>>> "matmul" in EXPORT, "MatMul" in IMPORT, "Gemm" in IMPORT
(True, True, True)
"""
from __future__ import annotations

from tessera.onnx.converters.helpers import operand, reduce_over
from tessera.onnx.converters.registry import export_rule, import_rule, simple
from tessera.ops.einsum import einsum
from tessera.ops.linalg import matmul

simple("matmul", "MatMul")


@export_rule("vdot")
def _vdot(b, n):
    dt = n.out_dtype()
    return reduce_over(b, "ReduceSum", b.op("Mul", [operand(b, n, 0, dt),
                                                    operand(b, n, 1, dt)]), None, False)


@import_rule("Gemm")
def _import_gemm(c, a, b, bias=None):
    if c.attr("transA", 0):
        a = a.transpose(0, 1)
    if c.attr("transB", 0):
        b = b.transpose(0, 1)
    y = matmul(a, b)
    alpha, beta = c.attr("alpha", 1.0), c.attr("beta", 1.0)
    if alpha != 1:
        y = y * alpha
    if bias is not None:
        y = y + (bias * beta if beta != 1 else bias)
    return y


@export_rule("einsum")
def _einsum(b, n):
    """ONNX Einsum takes the canonical equation as it is (explicit output, '...')."""
    dt = n.out_dtype()
    eq = n.attrs["equation"]
    if not all(ch.isalpha() or ch in ",.->" for ch in eq.replace(" ", "")):
        raise NotImplementedError(f"equation '{eq}'")
    ins = [operand(b, n, i, dt) for i in range(len(n.ins))]
    return b.op("Einsum", ins, equation=eq)


@import_rule("Einsum")
def _import_einsum(c, *xs):
    return einsum(c.attr("equation"), *xs)
