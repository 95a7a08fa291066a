"""Products of tensors: ``matmul`` is the primitive (one BLAS call through ``np.matmul``);
``mm bmm mv dot inner outer addmm addmv addbmm baddbmm tensordot`` are thin composites of it
that keep PyTorch's own, stricter shape checks and error messages. ``vdot`` is its own op
because it conjugates its first argument. Their ``sbp`` rules split rows, columns or the
contracted dim (giving partial sums); their ``cost`` counts a multiply-add as two FLOPs.

Like PyTorch, products do not promote: both operands must have the same dtype.

>>> import tessera
>>> a = tessera.ones(2, 3, 4)
>>> (a @ tessera.ones(4)).shape
tessera.Size([2, 3])
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import _MODES, composite_args, dispatch
from tessera._tensor import Tensor
from tessera.ops import _jax, _relax, _sbp, cost
from tessera.ops._util import call, ensure_tensor, numel, sum_to
from tessera.ops.arithmetic import add, mul
from tessera.ops.reduce import sum as _sum
from tessera.ops.registry import Meta, MissingRule, defop
from tessera.ops.shape import tril, triu
from tessera.ops.sparse import SparseTensor, mm as _sparse_mm
from tessera.ops.views import movedim, permute, reshape, transpose
from tessera.sbp import SbpRule, Signature, broadcast as B, partial_sum as P, split as S

__all__ = ["matmul", "mm", "bmm", "mv", "dot", "vdot", "inner", "outer", "ger", "addmm",
           "addmv", "addbmm", "baddbmm", "tensordot", "cholesky", "triangular_solve"]

# PyTorch names dtypes two ways in these messages: C++ type names and ScalarType names
_CNAME = {"float32": "float", "float64": "double", "float16": "c10::Half",
          "bfloat16": "c10::BFloat16", "int64": "long int", "int32": "int",
          "int16": "short int", "int8": "signed char", "uint8": "unsigned char", "bool": "bool",
          "complex64": "c10::complex<float>", "complex128": "c10::complex<double>"}
_SNAME = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
          "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
          "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}
_HALF = (D.float16, D.bfloat16)


def _s(d: D.dtype) -> str:
    return _SNAME[d.name]


def _x(shape) -> str:
    return "x".join(str(s) for s in shape)


def _no_bool(d: D.dtype, kernel: str) -> None:
    if d is D.bool_:
        raise NotImplementedError(f'"{kernel}" not implemented for \'Bool\'')


# ---- matmul: the primitive -----------------------------------------------------------

def _matmul_infer(a, b):
    if type(a) is not Meta or type(b) is not Meta:
        name, pos, bad = ("input", 1, a) if type(a) is not Meta else ("other", 2, b)
        raise TypeError(f"matmul(): argument '{name}' (position {pos}) must be Tensor, not "
                        f"{type(bad).__name__}")
    sa, sb = a.shape, b.shape
    da, db = len(sa), len(sb)
    dt = a.dtype
    if da == 2 and db == 2:  # the common case first: it is every Linear layer's
        _mm_dtype(dt, b.dtype)
        if sa[1] != sb[0]:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({_x(sa)} and "
                               f"{_x(sb)})")
        return Meta((sa[0], sb[1]), dt)
    if da == 0 or db == 0:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are "
                           f"{da}D and {db}D")
    if da == 1 and db == 1:
        return Meta((), _dot_check(a, b))
    if db == 1:  # matrix (or folded batch of matrices) times vector: PyTorch's mv
        rows = numel(sa[:-1])
        if dt is not b.dtype:
            raise RuntimeError(f"addmv input tensors must have the same dtype, but got "
                               f"{_s(b.dtype)}, {_s(dt)}, and {_s(b.dtype)}")
        _no_bool(dt, "addmv_impl_cpu")
        if sa[-1] != sb[0]:
            raise RuntimeError(f"size mismatch, got input ({rows}), mat ({rows}x{sa[-1]}), "
                               f"vec ({sb[0]})")
        return Meta(sa[:-1], dt)
    if da == 1 and db == 2:
        _mm_dtype(dt, b.dtype)
        if sa[0] != sb[0]:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied (1x{sa[0]} and "
                               f"{_x(sb)})")
        return Meta((sb[1],), dt)
    if db == 2:  # a batch of matrices times one matrix: folded into one mm
        _mm_dtype(dt, b.dtype)
        if sa[-1] != sb[0]:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied "
                               f"({numel(sa[:-1])}x{sa[-1]} and {_x(sb)})")
        return Meta(sa[:-1] + (sb[1],), dt)
    return _batched_infer(a, b)


def _batched_infer(a, b):
    sa, sb = a.shape, b.shape
    ma = sa if len(sa) > 1 else (1,) + sa
    batch = _broadcast_batch(sa[:-2], sb[:-2])
    if a.dtype is not b.dtype:
        raise RuntimeError(f"expected scalar type {_s(a.dtype)} but found {_s(b.dtype)}")
    _no_bool(a.dtype, "bmm")
    if ma[-1] != sb[-2]:
        n = numel(batch)
        raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{n}, {ma[-1]}] but got: [{n}, {sb[-2]}].")
    rows = (sa[-2],) if len(sa) > 1 else ()
    return Meta(batch + rows + (sb[-1],), a.dtype)


def _broadcast_batch(x: tuple, y: tuple) -> tuple:
    n = max(len(x), len(y))
    x, y = (1,) * (n - len(x)) + x, (1,) * (n - len(y)) + y
    out = []
    for i, (p, q) in enumerate(zip(x, y)):
        if p != q and p != 1 and q != 1:
            raise RuntimeError(f"The size of tensor a ({p}) must match the size of tensor b "
                               f"({q}) at non-singleton dimension {i}")
        out.append(q if p == 1 else p)
    return tuple(out)


def _mm_dtype(a: D.dtype, b: D.dtype) -> None:
    if a is not b:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: "
                           f"{_CNAME[a.name]} != {_CNAME[b.name]}")
    _no_bool(a, "addmm_impl_cpu_")


def _dot_check(a, b) -> D.dtype:
    if a.dtype is not b.dtype:
        raise RuntimeError(f"dot : expected both vectors to have same dtype, but found "
                           f"{_s(a.dtype)} and {_s(b.dtype)}")
    _no_bool(a.dtype, "dot")
    if a.shape[0] != b.shape[0]:
        n, m = a.shape[0], b.shape[0]
        raise RuntimeError(f"inconsistent tensor size, expected tensor [{n}] and src [{m}] to "
                           f"have the same number of elements, but got {n} and {m} elements "
                           f"respectively")
    return a.dtype


def _matmul_kernel(a, b, out=None):
    if a.dtype.itemsize == 2 and a.dtype.kind != "i":  # float16/bfloat16: accumulate in fp32
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    if b.ndim == 2 and a.ndim >= 2 and a.dtype == _F32 and b.dtype == _F32:
        res = _own_gemm(a, b, out)
        if res is not None:
            return res
    if a.ndim > 2:
        a = _blasable(a)
    if b.ndim > 2:
        b = _blasable(b)
        if a.ndim > 2 and a.shape[:-2] == b.shape[:-2]:  # a batch of mid-sized products
            from tessera.kernels.bmm import stacked
            res = stacked(a, b, out)
            if res is not None:
                return res
    return np.matmul(a, b, out=out)


_F32 = np.dtype(np.float32)
# multiply-adds below which NumPy's BLAS call costs less than tessera's GEMM's set-up, and
# rows below which OpenBLAS's small-product kernels are faster than packing B (bench gemm:
# lenet5 fc1 batch 8)
OWN_GEMM_MIN, OWN_GEMM_ROWS = 1 << 15, 16


def _own_gemm(a: np.ndarray, b: np.ndarray, out):
    """``a @ b`` by tessera's GEMM (``tessera.kernels.gemm``) for float32 ``a`` (a matrix,
    or a C-contiguous stack of rows) and matrix ``b``, transposed views read in place; None
    where NumPy's BLAS takes it: a small product, code generation off, a CPU without
    AVX-512, an ``out`` that is not float32 or whose rows are not one matrix. Eager products
    and compiled graphs' share this choice, so both give the same values. Unlike OpenBLAS's
    workers, which spin on their core for milliseconds after a call, its threads are the
    pool the generated kernels run on: the elementwise kernels between two products find
    both cores free."""
    k, n = b.shape
    m = a.shape[0] if a.ndim == 2 else a.size // max(k, 1)
    if m < OWN_GEMM_ROWS or m * n * k < OWN_GEMM_MIN:
        return None
    shape = a.shape[:-1] + (n,)
    if a.ndim > 2:
        if not a.flags.c_contiguous:
            return None
        a = a.reshape(m, k)
    if out is None:
        res = np.empty(shape, _F32)
    elif out.dtype != _F32 or (out.ndim > 2 and not out.flags.c_contiguous):
        return None
    else:
        res = out
    from tessera.kernels import gemm
    # AVX-512 only: on AVX2 OpenBLAS's Haswell kernel is the faster on the backward pass's
    # products (a transposed A, k of 2048), and training steps with tessera's ran 3-10%
    # slower (bench --max-isa avx2 training)
    if not gemm.available() or gemm.isa() != "avx512":
        return None
    gemm.gemm_into(res if res.ndim == 2 else res.reshape(m, n), a, b)
    return res


def _blasable(x: np.ndarray) -> np.ndarray:
    """``x`` itself when each of its matrices is one BLAS can read (unit stride along rows
    or columns: attention's permuted q, k, v views are), else a copy that is. NumPy runs
    other strided stacks through a slow non-BLAS loop. The copy follows the smaller of the
    two inner strides, so it reads memory in runs (a plain C-order copy of a transposed
    view gathers with a large stride and costs 3x more)."""
    s = x.itemsize
    r, c = x.strides[-2:]
    m, n = x.shape[-2:]
    if all(t % s == 0 for t in x.strides) and \
            ((c == s and r >= n * s) or (r == s and c >= m * s)):
        return x
    if abs(r) < abs(c):
        return np.ascontiguousarray(x.swapaxes(-1, -2)).swapaxes(-1, -2)
    return np.ascontiguousarray(x)


def _conj(t: Tensor) -> Tensor:
    if not t.dtype.is_complex:
        return t
    from tessera._tensor_methods import _OPS
    if "conj" not in _OPS:
        raise MissingRule("matmul", "grad", "complex gradients need a 'conj' op")
    return _OPS["conj"](t)


def _matmul_grad(ctx, g):
    a, b = ctx.inputs
    need_a, need_b = ctx.needs_input_grad
    da, db = a.dim(), b.dim()
    if da == 1 and db == 1:
        return (g * _conj(b) if need_a else None, _conj(a) * g if need_b else None)
    a2 = a.unsqueeze(0) if da == 1 else a
    b2 = b.unsqueeze(-1) if db == 1 else b
    g2 = g.unsqueeze(-2) if da == 1 else g
    g2 = g2.unsqueeze(-1) if db == 1 else g2
    ga = gb = None
    if need_a:
        bt = _conj(transpose(b2, -1, -2))
        if a2.dim() == 2 and b2.dim() > 2:  # fold the batch into the contraction
            n, k = a2.shape
            r = numel(g2.shape[:-2]) * g2.shape[-1]
            ga = matmul(reshape(movedim(g2, -2, 0), (n, r)), reshape(bt, (r, k)))
        else:
            ga = sum_to(matmul(g2, bt), tuple(a2.shape))
        ga = ga.reshape(a.shape)
    if need_b:
        at = _conj(a2)
        if b2.dim() == 2 and a2.dim() > 2:
            k, m = b2.shape
            r = numel(at.shape[:-1])
            gb = _weight_grad(reshape(at, (r, k)), reshape(g2, (r, m)), b2)
        elif b2.dim() == 2 and a2.dim() == 2:
            gb = _weight_grad(at, g2, b2)
        else:
            gb = sum_to(matmul(transpose(at, -1, -2), g2), tuple(b2.shape))
        gb = gb.reshape(b.shape)
    return ga, gb


def _weight_grad(a: Tensor, g: Tensor, b: Tensor) -> Tensor:
    """``a.T @ g``, the gradient of a 2-d right operand ``b``, laid out like ``b``.

    ``linear`` multiplies by ``weight.t()``, a column-major view: its gradient computed as
    ``a.T @ g`` is row-major, so the weight's own gradient would come out column-major, and
    every later elementwise op mixing it with the row-major weight (the optimizer's update,
    gradient accumulation) would stride across memory (bench training: mlp).
    The same GEMM as ``(g.T @ a).T`` gives ``b``'s layout (PyTorch's gradient layout
    contract). A global tensor's layout is its tile's (``GlobalData.local``; looked up on
    the class: a traced value's array refuses every attribute read)."""
    data = b._data
    if type(data) is not np.ndarray and hasattr(type(data), "local"):
        data = data.local
    if type(data) is np.ndarray and data.ndim == 2 and data.flags.f_contiguous and \
            not data.flags.c_contiguous:
        return transpose(matmul(transpose(g, 0, 1), a), 0, 1)
    return matmul(transpose(a, 0, 1), g)


def _matmul_cost(ins, outs) -> cost.Cost:
    """2 * M * N * K per product (a multiply-add each): the output's elements times the
    contracted size, which is the last dim of the first operand; the product's smallest
    of M, K and N (1 for a vector operand's side)."""
    a, b, out = ins[0].shape, ins[1].shape, outs[0].shape
    k = a[-1] if a else 1
    m = out[-2] if len(out) > 1 and len(a) > 1 else 1
    n = out[-1] if len(b) > 1 else 1
    return cost.Cost(2 * cost.numel(outs[0]) * k, *cost.io(ins, outs), min(m, k, n))


def _matmul_sbp(a, b):
    """S(0)xB->S(0), BxS(1)->S(1), S(1)xS(0)->P (the contracted dim), PxB->P, BxP->P, and a
    batch dim split alike in both (or in the one that has it)."""
    na, nb = len(a.shape), len(b.shape)
    sigs = []
    if na >= 2 and nb >= 2:
        n = max(na, nb)
        sigs += [Signature((S(na - 2), B), (S(n - 2),)),     # S(0) x B -> S(0)
                 Signature((B, S(nb - 1)), (S(n - 1),)),     # B x S(1) -> S(1)
                 Signature((S(na - 1), S(nb - 2)), (P,))]    # S(1) x S(0) -> P
        batch = _sbp.bshape([a.shape[:-2], b.shape[:-2]])
        for d in range(n - 2):
            ka, kb = d - (n - na), d - (n - nb)
            sa = S(ka) if ka >= 0 and a.shape[ka] == batch[d] else B
            sb = S(kb) if kb >= 0 and b.shape[kb] == batch[d] else B
            sigs.append(Signature((sa, sb), (S(d),)))
    elif na >= 2:  # matrix @ vector: (..., n, k) @ (k,) -> (..., n)
        sigs += [Signature((S(d), B), (S(d),)) for d in range(na - 1)]
        sigs.append(Signature((S(na - 1), S(0)), (P,)))
    elif nb >= 2:  # vector @ matrix: (k,) @ (..., k, m) -> (..., m)
        sigs.append(Signature((B, S(nb - 1)), (S(nb - 2),)))
        sigs += [Signature((B, S(d)), (S(d),)) for d in range(nb - 2)]
        sigs.append(Signature((S(0), S(nb - 2)), (P,)))
    else:
        sigs.append(Signature((S(0), S(0)), (P,)))
    sigs += [Signature((P, B), (P,)), Signature((B, P), (P,)), Signature((B, B), (B,))]
    return sigs


_MATMUL = defop("matmul", _matmul_infer, _matmul_kernel, grad=_matmul_grad,
                sbp=SbpRule(_matmul_sbp), cost=_matmul_cost,
                to_relax=_relax.matmul,
                to_jax=lambda jnp, lax, a, at: jnp.matmul(a[0], a[1],
                                                          precision=lax.Precision.HIGHEST))


def matmul(input: Tensor, other: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Matrix product with NumPy's broadcasting rules (``a @ b``).

    1-d operands are vectors (a dot product, or a row/column promoted and dropped again);
    leading batch dims broadcast.

    >>> import tessera
    >>> tessera.matmul(tessera.ones(5, 2, 3), tessera.ones(3, 4)).shape
    tessera.Size([5, 2, 4])
    """
    if out is None:
        if type(input) is SparseTensor or type(other) is SparseTensor:
            return _sparse_mm(input, other)
        return dispatch(_MATMUL, input, other)
    return _call_out(_MATMUL, out, input, other)


def _call_out(op, out: Tensor, a, b) -> Tensor:
    """``out=`` of a primitive: like PyTorch, ``out`` must already have the result dtype."""
    if isinstance(a, Tensor) and out.dtype is not a.dtype:
        raise RuntimeError(f"Expected out tensor to have dtype {_CNAME[a.dtype.name]}, but got "
                           f"{_CNAME[out.dtype.name]} instead")
    return call(op, a, b, out=out)


def _out(result: Tensor, out: Tensor | None) -> Tensor:
    """Write a composite's result into ``out`` (``x.addmm_(...)``, ``out=``)."""
    if out is None:
        return result
    from tessera.ops.creation import copy
    if out.dtype is not result.dtype:
        raise RuntimeError(f"Expected out tensor to have dtype {_CNAME[result.dtype.name]}, "
                           f"but got {_CNAME[out.dtype.name]} instead")
    return copy(out, result, out=out)


# ---- strict 2-d / 3-d / 1-d products -------------------------------------------------

def mm(input: Tensor, mat2: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Product of two matrices; no broadcasting (``tessera.mm(a, b)``); either may be a
    sparse COO matrix (``tessera.sparse.mm``)."""
    ensure_tensor("mm", input)
    ensure_tensor("mm", mat2, "mat2")
    if (type(input) is SparseTensor or type(mat2) is SparseTensor) and out is None:
        return _sparse_mm(input, mat2)
    for name, t in (("self", input), ("mat2", mat2)):
        if t.dim() != 2:
            raise RuntimeError(f"mm: {name} must be a matrix (2D), got a {t.dim()}D tensor")
    if input.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mm: mat1 and mat2 shapes cannot be multiplied ({input.shape[0]}x"
                           f"{input.shape[1]} and {mat2.shape[0]}x{mat2.shape[1]})")
    return matmul(input, mat2, out=out)


def _check_bmm(op: str, b1: Tensor, b2: Tensor, index_error: bool = False) -> None:
    for name, t in (("batch1", b1), ("batch2", b2)):
        if index_error and t.dim() < 3:  # baddbmm/addbmm index dim 2 before checking
            n = max(t.dim(), 1)
            raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, "
                             f"{n - 1}], but got 2)")
        if t.dim() != 3:
            raise RuntimeError(f"{op}: {name} must be a 3D tensor")


def bmm(input: Tensor, mat2: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Batched product of ``(b, n, k)`` and ``(b, k, m)``; batch sizes must be equal."""
    ensure_tensor("bmm", input)
    ensure_tensor("bmm", mat2, "mat2")
    _check_bmm("bmm", input, mat2)
    s1, s2 = input.shape, mat2.shape
    if s1[0] != s2[0] or s1[2] != s2[1]:
        raise RuntimeError(f"bmm: Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{s1[0]}, {s1[2]}] but got: [{s2[0]}, {s2[1]}].")
    return matmul(input, mat2, out=out)


def mv(input: Tensor, vec: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Matrix times vector."""
    ensure_tensor("mv", input)
    ensure_tensor("mv", vec, "vec")
    if input.dim() != 2 or vec.dim() != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got 1, {input.dim()}, "
                           f"{vec.dim()}")
    return matmul(input, vec, out=out)


def _check_1d(da: int, db: int) -> None:
    if da != 1 or db != 1:
        raise RuntimeError(f"1D tensors expected, but got {da}D and {db}D tensors")


def dot(input: Tensor, tensor: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Inner product of two 1-d tensors (no conjugation)."""
    ensure_tensor("dot", input)
    ensure_tensor("dot", tensor, "tensor")
    _check_1d(input.dim(), tensor.dim())
    n, m = input.shape[0], tensor.shape[0]
    if n != m:  # checked here too, so that the error names dot rather than matmul
        raise RuntimeError(f"dot: inconsistent tensor size, expected tensor [{n}] and src [{m}] "
                           f"to have the same number of elements, but got {n} and {m} "
                           "elements respectively")
    return matmul(input, tensor, out=out)


def _vdot_infer(a, b):
    _check_1d(len(a.shape), len(b.shape))
    return Meta((), _dot_check(a, b))


def _vdot_grad(ctx, g):
    a, b = ctx.inputs
    need_a, need_b = ctx.needs_input_grad
    return (_conj(g) * b if need_a else None, g * a if need_b else None)


def _vdot_sbp(a, b):
    return [Signature((S(0), S(0)), (P,)), Signature((P, B), (P,)), Signature((B, P), (P,)),
            Signature((B, B), (B,))]


def _vdot_cost(ins, outs) -> cost.Cost:
    """A multiply-add per element pair (the conjugation moves no data worth counting)."""
    return cost.Cost(2 * cost.numel(ins[0]), *cost.io(ins, outs))


_VDOT = defop("vdot", _vdot_infer,
              lambda a, b: _matmul_kernel(np.conj(a) if a.dtype.kind == "c" else a, b),
              grad=_vdot_grad, sbp=SbpRule(_vdot_sbp), cost=_vdot_cost, to_jax=_jax.vdot,
              to_relax=_relax.vdot)


def vdot(input: Tensor, other: Tensor, *, out: Tensor | None = None) -> Tensor:
    """``sum(conj(input) * other)`` over two 1-d tensors."""
    ensure_tensor("vdot", input)
    ensure_tensor("vdot", other, "other")
    if out is None:
        return dispatch(_VDOT, input, other)
    return _call_out(_VDOT, out, input, other)


def inner(input: Tensor, other: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Contraction over the last dim of both: shape ``input[:-1] + other[:-1]``."""
    ensure_tensor("inner", input)
    ensure_tensor("inner", other, "other")
    if input.dim() == 0 or other.dim() == 0:
        return _out(mul(input, other), out)
    if input.dtype is not other.dtype:
        raise RuntimeError("both inputs should have same dtype")
    sa, sb = tuple(input.shape), tuple(other.shape)
    if sa[-1] != sb[-1]:
        raise RuntimeError(f"inner() the last dimension must match on both input tensors but "
                           f"got shapes {list(sa)} and {list(sb)}")
    if input.dim() == 1 and other.dim() == 1:
        return _out(matmul(input, other), out)
    k = sa[-1]
    a2 = reshape(input, (numel(sa[:-1]), k))
    b2 = reshape(other, (numel(sb[:-1]), k))
    return _out(reshape(matmul(a2, transpose(b2, 0, 1)), sa[:-1] + sb[:-1]), out)


def outer(input: Tensor, vec2: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Outer product of two 1-d tensors; dtypes promote (it is a broadcast multiply)."""
    ensure_tensor("outer", input)
    ensure_tensor("outer", vec2, "vec2")
    for name, t in (("self", input), ("vec2", vec2)):
        if t.dim() != 1:
            raise RuntimeError(f"outer: Expected 1-D argument {name}, but got {t.dim()}-D")
    return _out(mul(reshape(input, (input.shape[0], 1)), vec2), out)


ger = outer


# ---- products with an added term -----------------------------------------------------

def _expand_check(t: Tensor, target: tuple) -> None:
    """PyTorch's ``expand`` rule for the added term: it broadcasts one way only."""
    shape = tuple(t.shape)
    if len(shape) > len(target):
        raise RuntimeError(f"expand(torch.{_s(t.dtype)}Tensor{{{list(shape)}}}, size="
                           f"{list(target)}): the number of sizes provided ({len(target)}) "
                           f"must be greater or equal to the number of dimensions in the "
                           f"tensor ({len(shape)})")
    lead = len(target) - len(shape)
    for i, s in enumerate(shape):
        if s != 1 and s != target[lead + i]:
            raise RuntimeError(f"The expanded size of the tensor ({target[lead + i]}) must "
                               f"match the existing size ({s}) at non-singleton dimension "
                               f"{lead + i}.  Target sizes: {list(target)}.  Tensor sizes: "
                               f"{list(shape)}")


def _scaled_sum(input: Tensor, prod: Tensor, beta, alpha) -> Tensor:
    """``beta * input + alpha * prod``; ``beta == 0`` ignores ``input`` (even nan)."""
    if not prod.dtype.is_floating_point and not prod.dtype.is_complex:
        beta, alpha = int(beta), int(alpha)  # PyTorch truncates scalars for integer tensors
    if alpha != 1:
        prod = mul(prod, alpha)
    if beta == 0:
        return prod
    # add's alpha scales input without saving it, so x.addmm_(...) may overwrite x
    return add(prod, input, alpha=beta)


def _addmm_dtypes(input: Tensor, mat1: Tensor, mat2: Tensor) -> None:
    if input.dtype is not mat2.dtype:
        raise RuntimeError(f"self and mat2 must have the same dtype, but got "
                           f"{_s(input.dtype)} and {_s(mat2.dtype)}")
    if mat1.dtype is not mat2.dtype:
        raise RuntimeError(f"mat1 and mat2 must have the same dtype, but got "
                           f"{_s(mat1.dtype)} and {_s(mat2.dtype)}")
    _no_bool(input.dtype, "addmm_impl_cpu_")


def addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta=1, alpha=1,
          out: Tensor | None = None) -> Tensor:
    """``beta * input + alpha * (mat1 @ mat2)``; ``input`` broadcasts to the product."""
    for name, t in (("input", input), ("mat1", mat1), ("mat2", mat2)):
        ensure_tensor("addmm", t, name)
    if _MODES:  # autocast casts the three inputs as one op
        input, mat1, mat2 = composite_args("addmm", (input, mat1, mat2))
    for name, t in (("mat1", mat1), ("mat2", mat2)):
        if t.dim() != 2:
            raise RuntimeError(f"{name} must be a matrix, got {t.dim()}-D tensor")
    if mat1.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied "
                           f"({_x(mat1.shape)} and {_x(mat2.shape)})")
    _addmm_dtypes(input, mat1, mat2)
    _expand_check(input, (mat1.shape[0], mat2.shape[1]))
    return _out(_scaled_sum(input, matmul(mat1, mat2), beta, alpha), out)


def addmv(input: Tensor, mat: Tensor, vec: Tensor, *, beta=1, alpha=1,
          out: Tensor | None = None) -> Tensor:
    """``beta * input + alpha * (mat @ vec)``."""
    for name, t in (("input", input), ("mat", mat), ("vec", vec)):
        ensure_tensor("addmv", t, name)
    if input.dim() > 1 or mat.dim() != 2 or vec.dim() != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got {input.dim()}, "
                           f"{mat.dim()}, {vec.dim()}")
    if not input.dtype is mat.dtype is vec.dtype:
        raise RuntimeError(f"addmv input tensors must have the same dtype, but got "
                           f"{_s(input.dtype)}, {_s(mat.dtype)}, and {_s(vec.dtype)}")
    _no_bool(input.dtype, "addmv_impl_cpu")
    n, k = mat.shape
    if vec.shape[0] != k or input.numel() not in (1, n):
        raise RuntimeError(f"size mismatch, got input ({input.numel()}), mat ({n}x{k}), "
                           f"vec ({vec.shape[0]})")
    return _out(_scaled_sum(input, matmul(mat, vec), beta, alpha), out)


def _check_batches(b1: Tensor, b2: Tensor) -> None:
    if b1.shape[0] != b2.shape[0] or b1.shape[2] != b2.shape[1]:
        raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{b1.shape[0]}, {b1.shape[2]}] but got: [{b2.shape[0]}, "
                           f"{b2.shape[1]}].")


def baddbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1,
            out: Tensor | None = None) -> Tensor:
    """``beta * input + alpha * bmm(batch1, batch2)``."""
    for name, t in (("input", input), ("batch1", batch1), ("batch2", batch2)):
        ensure_tensor("baddbmm", t, name)
    if _MODES:
        input, batch1, batch2 = composite_args("baddbmm", (input, batch1, batch2))
    _check_bmm("baddbmm", batch1, batch2, index_error=True)
    if input.dtype is not batch1.dtype:
        raise RuntimeError(f"Input dtypes must be the same, got: input "
                           f"{_CNAME[input.dtype.name]}, batch1: {_CNAME[batch1.dtype.name]}, "
                           f"batch2: {_CNAME[batch2.dtype.name]}")
    if batch1.dtype is not batch2.dtype:
        raise RuntimeError(f"expected scalar type {_s(batch1.dtype)} but found "
                           f"{_s(batch2.dtype)}")
    _no_bool(input.dtype, "baddbmm_cpu")
    _check_batches(batch1, batch2)
    _expand_check(input, (batch1.shape[0], batch1.shape[1], batch2.shape[2]))
    return _out(_scaled_sum(input, matmul(batch1, batch2), beta, alpha), out)


def addbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1,
           out: Tensor | None = None) -> Tensor:
    """``beta * input + alpha * sum_b(batch1[b] @ batch2[b])``, as one matrix product."""
    for name, t in (("input", input), ("batch1", batch1), ("batch2", batch2)):
        ensure_tensor("addbmm", t, name)
    if _MODES:
        input, batch1, batch2 = composite_args("addbmm", (input, batch1, batch2))
    _check_bmm("addbmm", batch1, batch2, index_error=True)
    (b, n, k), (b2, k2, m) = batch1.shape, batch2.shape
    if b != b2:
        raise RuntimeError(f"batch1 and batch2 must have same number of batches, got {b} "
                           f"and {b2}")
    if k != k2:
        raise RuntimeError(f"Incompatible matrix sizes for bmm ({n}x{k} and {k2}x{m})")
    _addmm_dtypes(input, batch1, batch2)
    _expand_check(input, (n, m))
    # sum over the batch of products == one product with the batch folded into k
    lhs = reshape(transpose(batch1, 0, 1), (n, b * k))
    prod = matmul(lhs, reshape(batch2, (b * k, m)))
    return _out(_scaled_sum(input, prod, beta, alpha), out)


# ---- tensordot -----------------------------------------------------------------------

def _tensordot_dims(a: Tensor, b: Tensor, dims) -> tuple[list, list]:
    if isinstance(dims, Tensor):
        if dims.numel() > 1:
            return [int(v) for v in dims[0].tolist()], [int(v) for v in dims[1].tolist()]
        dims = int(dims.item())
    if isinstance(dims, (int, np.integer)) and not isinstance(dims, bool):
        if dims < 0:
            raise RuntimeError(f"tensordot expects dims >= 0, but got dims={dims}")
        if dims > min(a.dim(), b.dim()):
            raise RuntimeError(f"tensordot expects dims < ndim_a or ndim_b, but got "
                               f"dims={dims}")
        return list(range(-dims, 0)), list(range(dims))
    if not isinstance(dims, (tuple, list)):
        raise RuntimeError(f"tensordot expects dims to be int or tuple[list[int], list[int]] "
                           f"or list[list[int]] containing two lists, but got dims={dims}")
    da, db = dims
    for name, d in (("dims_self", da), ("dims_other", db)):
        if not isinstance(d, (tuple, list)):
            raise TypeError(f"tensordot(): argument '{name}' must be tuple of ints, not "
                            f"{type(d).__name__}")
    return list(da), list(db)


def _wrap(d: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {d})")
    return d % n


def tensordot(a: Tensor, b: Tensor, dims=2, out: Tensor | None = None) -> Tensor:
    """Contract ``dims`` of ``a`` with ``dims`` of ``b`` (an int n: the last n of ``a`` with
    the first n of ``b``; or a pair of lists), as one matrix product.

    >>> import tessera
    >>> tessera.tensordot(tessera.ones(3, 4, 5), tessera.ones(4, 5, 2), dims=2).shape
    tessera.Size([3, 2])
    """
    ensure_tensor("tensordot", a, "a")
    ensure_tensor("tensordot", b, "b")
    dims_a, dims_b = _tensordot_dims(a, b, dims)
    if len(dims_a) != len(dims_b):
        raise RuntimeError("both dimension lists should have same length")
    if a.dtype is not b.dtype:
        raise RuntimeError("both inputs should have same dtype")
    wa = [_wrap(d, a.dim()) for d in dims_a]
    wb = [_wrap(d, b.dim()) for d in dims_b]
    for w in (wa, wb):
        if len(set(w)) != len(w):
            dup = next(d for d in w if w.count(d) > 1)
            raise RuntimeError(f"dim {dup} appears multiple times in the list of dims")
    sum_a, sum_b = [], []
    for da, db, ia, ib in zip(wa, wb, dims_a, dims_b):
        s1, s2 = a.shape[da], b.shape[db]
        if s2 == 1 and s1 != 1:  # a size-1 dim of b broadcasts: sum a over it first
            sum_a.append(da)
        elif s1 == 1 and s2 != 1:
            sum_b.append(db)
        elif s1 != s2:
            raise RuntimeError(f"contracted dimensions need to match, but first has size {s1} "
                               f"in dim {ia} and second has size {s2} in dim {ib}")
    if sum_a:
        a = _sum(a, tuple(sum_a), keepdim=True)
    if sum_b:
        b = _sum(b, tuple(sum_b), keepdim=True)
    free_a = [d for d in range(a.dim()) if d not in wa]
    free_b = [d for d in range(b.dim()) if d not in wb]
    k = numel([a.shape[d] for d in wa])
    fa, fb = [a.shape[d] for d in free_a], [b.shape[d] for d in free_b]
    pa = reshape(permute(a, tuple(free_a + wa)), (numel(fa), k))
    pb = reshape(permute(b, tuple(wb + free_b)), (k, numel(fb)))
    return _out(reshape(matmul(pa, pb), tuple(fa + fb)), out)


# ---- factorisations and triangular solves ------------------------------------------------

class LinAlgError(RuntimeError):
    """A matrix the algorithm cannot factor (PyTorch's ``torch.linalg.LinAlgError``)."""


def _square_check(fn: str, a: Meta) -> None:
    if len(a.shape) < 2:
        raise RuntimeError(f"{fn}: The input tensor A must have at least 2 dimensions.")
    if a.shape[-1] != a.shape[-2]:
        raise RuntimeError(f"{fn}: A must be batches of square matrices, but they are "
                           f"{a.shape[-2]} by {a.shape[-1]} matrices")


def _cholesky_infer(a, upper, fn):
    _square_check(fn, a)
    if a.dtype.category < 2:
        if fn == "cholesky":
            raise NotImplementedError(f'"cholesky_cpu" not implemented for '
                                      f"'{_SNAME[a.dtype.name]}'")
        raise RuntimeError(f"{fn}: Expected a floating point or complex tensor as input. Got "
                           f"{_SNAME[a.dtype.name]}")
    return Meta(a.shape, a.dtype)


def _cholesky_kernel(a, upper, fn):
    lo = np.tril(a)  # LAPACK reads one triangle: the lower one here
    sym = lo + np.swapaxes(np.tril(a, -1), -1, -2).conj()
    try:
        out = np.linalg.cholesky(sym)
    except np.linalg.LinAlgError:
        raise _not_positive_definite(fn, sym) from None
    return np.swapaxes(out, -1, -2).conj() if upper else out


def _not_positive_definite(fn: str, a: np.ndarray) -> LinAlgError:
    flat = a.reshape((-1,) + a.shape[-2:])
    where = ""
    for i, m in enumerate(flat):
        order = next((k for k in range(1, m.shape[-1] + 1)
                      if not _is_pd(m[:k, :k])), None)
        if order is not None:
            where = f"(Batch element {i}): " if a.ndim > 2 else ""
            break
    return LinAlgError(f"{fn}: {where}The factorization could not be completed because the "
                       f"input is not positive-definite (the leading minor of order {order} "
                       "is not positive-definite).")


def _is_pd(m: np.ndarray) -> bool:
    try:
        np.linalg.cholesky(m)
        return True
    except np.linalg.LinAlgError:
        return False


def _cholesky_grad(ctx, g):
    """``L^-H sym(Phi(L^H gL)) L^-1``, Phi taking the lower triangle with half its diagonal:
    the symmetric gradient PyTorch gives (Murray, 2016)."""
    L = ctx.outputs[0]
    upper = ctx.attrs["upper"]
    if upper:
        L, g = transpose(L, -1, -2), transpose(g, -1, -2)
    phi = tril(matmul(transpose(L, -1, -2), g))
    m = (phi + transpose(tril(phi, -1), -1, -2)) * 0.5
    m = solve_triangular(transpose(L, -1, -2), m, upper=True)
    return (transpose(solve_triangular(transpose(L, -1, -2), transpose(m, -1, -2),
                                       upper=True), -1, -2),)


def _cholesky_cost(ins, outs, **attrs) -> cost.Cost:
    n = ins[0].shape[-1] if len(ins[0].shape) else 0
    return cost.Cost(numel(ins[0].shape[:-2]) * n ** 3 // 3, *cost.io(ins, outs))


_CHOLESKY = defop("cholesky", _cholesky_infer, _cholesky_kernel, grad=_cholesky_grad,
                  save=("outputs",), cost=_cholesky_cost)


def cholesky(input: Tensor, upper: bool = False, *, out: Tensor | None = None) -> Tensor:
    """The Cholesky factor ``L`` (``A = L L^H``, or ``U^H U`` with ``upper``) of symmetric
    positive-definite matrices; the lower triangle of ``input`` is read.

    >>> import tessera
    >>> tessera.cholesky(tessera.tensor([[4.0, 2.0], [2.0, 5.0]]))
    tensor([[2., 0.],
            [1., 2.]])
    """
    ensure_tensor("cholesky", input)
    return call(_CHOLESKY, input, upper=bool(upper), fn="cholesky", out=out)


def linalg_cholesky(A: Tensor, *, upper: bool = False, out: Tensor | None = None) -> Tensor:
    """``torch.linalg.cholesky``: ``cholesky`` with its error messages."""
    ensure_tensor("linalg.cholesky", A)
    return call(_CHOLESKY, A, upper=bool(upper), fn="linalg.cholesky", out=out)


def _solve_infer(a, b, upper, unitriangular):
    fn = "linalg.solve_triangular"
    _square_check(fn, a)
    if len(b.shape) < 2:
        raise RuntimeError(f"{fn}: The input tensor B must have at least 2 dimensions.")
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"{fn}: Incompatible shapes of A and B for the equation AX = B "
                           f"({a.shape[-2]}x{a.shape[-1]} and {b.shape[-2]}x{b.shape[-1]})")
    dt = D.promote_types(a.dtype, b.dtype)
    if dt.category < 2:
        raise NotImplementedError(f'"triangular_solve_cpu" not implemented for '
                                  f"'{_SNAME[dt.name]}'")
    batch = _broadcast_batch(a.shape[:-2], b.shape[:-2])
    return Meta(batch + b.shape[-2:], dt)


def _solve_kernel(a, b, upper, unitriangular):
    from scipy.linalg import solve_triangular as _scipy_solve  # lazily, as NumPy has none
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = np.broadcast_to(a, batch + a.shape[-2:]).reshape((-1,) + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:]).reshape((-1,) + b.shape[-2:])
    out = np.empty(b.shape, b.dtype)
    with np.errstate(all="ignore"):  # a zero pivot gives inf and NaN, as in PyTorch
        for i in range(len(b)):
            out[i] = _scipy_solve(a[i], b[i], lower=not upper, unit_diagonal=unitriangular,
                                  check_finite=False)
    return out.reshape(batch + b.shape[-2:])


def _solve_grad(ctx, g):
    a, b = ctx.inputs
    x = ctx.outputs[0]
    upper, unit = ctx.attrs["upper"], ctx.attrs["unitriangular"]
    gb = solve_triangular(transpose(a, -1, -2), g, upper=not upper, unitriangular=unit)
    ga = None
    if ctx.needs_input_grad[0]:
        ga = -matmul(gb, transpose(x, -1, -2))
        ga = triu(ga, 1 if unit else 0) if upper else tril(ga, -1 if unit else 0)
        ga = sum_to(ga, tuple(a.shape))
    return ga, sum_to(gb, tuple(b.shape)) if ctx.needs_input_grad[1] else None


def _solve_cost(ins, outs, **attrs) -> cost.Cost:
    n = ins[0].shape[-1]
    return cost.Cost(numel(outs[0].shape) * n, *cost.io(ins, outs))


_SOLVE_TRIANGULAR = defop("solve_triangular", _solve_infer, _solve_kernel, grad=_solve_grad,
                          save=("inputs", "outputs"), promote=True, cost=_solve_cost)


def solve_triangular(A: Tensor, B: Tensor, *, upper: bool, left: bool = True,
                     unitriangular: bool = False, out: Tensor | None = None) -> Tensor:
    """``torch.linalg.solve_triangular``: ``X`` with ``A X = B`` (``X A = B`` when not
    ``left``) for triangular ``A``, batched and broadcast.

    >>> import tessera
    >>> A = tessera.tensor([[2.0, 0.0], [1.0, 1.0]])
    >>> solve_triangular(A, tessera.tensor([[2.0], [3.0]]), upper=False)
    tensor([[1.],
            [2.]])
    """
    ensure_tensor("linalg.solve_triangular", A)
    ensure_tensor("linalg.solve_triangular", B)
    if left:
        return call(_SOLVE_TRIANGULAR, A, B, upper=bool(upper),
                    unitriangular=bool(unitriangular), out=out)
    x = call(_SOLVE_TRIANGULAR, transpose(A, -1, -2), transpose(B, -1, -2), upper=not upper,
             unitriangular=bool(unitriangular))
    return _out(transpose(x, -1, -2), out)


def triangular_solve(input: Tensor, A: Tensor, upper: bool = True, transpose: bool = False,
                     unitriangular: bool = False, *, out=None):
    """``torch.triangular_solve``: ``(solution, cloned_coefficient)`` of ``op(A) X = input``;
    ``out=`` a pair of tensors to write them into.

    >>> import tessera
    >>> tessera.triangular_solve(tessera.ones(2, 1), tessera.eye(2)).solution.shape
    tessera.Size([2, 1])
    """
    ensure_tensor("triangular_solve", input)
    ensure_tensor("triangular_solve", A)
    a = _transpose(A, -1, -2) if transpose else A
    x = solve_triangular(a, input, upper=upper != transpose, unitriangular=unitriangular)
    if out is not None:
        sol, coef = out
        return _TriangularSolve(_out(x, sol), _out(A, coef))
    return _TriangularSolve(x, A.clone())


_transpose = transpose
_TriangularSolve = namedtuple(  # type: ignore[name-match]  # PyTorch's class name
    "triangular_solve", ("solution", "cloned_coefficient"))
_TriangularSolve.__module__ = "tessera.return_types"
