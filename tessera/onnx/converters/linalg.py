"""Linear algebra, both directions: ``matmul`` (MatMul), ``vdot``, ``einsum`` (Einsum) and
ONNX's ``Gemm``; the fused ``scaled_dot_product_attention`` exports as the composite it
stands for (MatMul, Softmax, MatMul).

>>> from tessera.onnx.converters.registry import EXPORT, IMPORT
>>> "matmul" in EXPORT, "MatMul" in IMPORT, "Gemm" in IMPORT
(True, True, True)
"""
from __future__ import annotations

import numpy as np

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


@export_rule("scaled_dot_product_attention")
def _sdpa(b, n):
    """softmax(q k^T scale + mask) v; the mask's rows with nothing to attend to give zeros,
    as the op's (PyTorch's safe softmax); the second output is each row's log-sum-exp."""
    a = n.attrs
    if a["dropout_p"] > 0:
        raise NotImplementedError("dropout inside attention (export in eval mode)")
    if a["enable_gqa"] and n.shape(1)[-3:-2] != n.shape(0)[-3:-2]:
        raise NotImplementedError("grouped-query heads")
    dt = n.out_dtype()
    q, k, v = (operand(b, n, i, dt) for i in range(3))
    rank = n.rank(1)
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    s = b.op("MatMul", [b.op("Mul", [q, b.const(a["scale"], dt)]),
                        b.op("Transpose", [k], perm=perm)])
    L, S = n.shape(0)[-2], n.shape(1)[-2]
    dead = None
    if a["is_causal"]:
        s = b.op("Add", [s, b.const(np.triu(np.full((L, S), -np.inf, dt.np), 1))])
    elif n.ins[3] is not None:
        m = operand(b, n, 3)
        if n.dtype(3) is not dt:
            zero, ninf = b.const(0.0, dt), b.const(-np.inf, dt)
            m = (b.op("Where", [m, zero, ninf]) if not n.dtype(3).is_floating_point
                 else b.cast(m, n.dtype(3), dt))
        dead = b.op("Equal", [reduce_over(b, "ReduceMax", m, [-1], True),
                              b.const(-np.inf, dt)])
        s = b.op("Add", [s, b.op("Where", [dead, b.const(0.0, dt), m])])
    w = b.op("Softmax", [s], axis=-1)
    lse = reduce_over(b, "ReduceLogSumExp", s, [-1], False)
    if dead is not None:
        w = b.op("Where", [dead, b.const(0.0, dt), w])
    return b.op("MatMul", [w, v]), lse
