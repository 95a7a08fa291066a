"""``tessera.sparse``: PyTorch's ``torch.sparse`` for sparse COO tensors — ``mm``,
``addmm``, ``sum``, ``softmax``/``log_softmax`` over a dense copy, and the legacy typed
constructors graph-network scripts call (``torch.sparse.FloatTensor(indices, values,
size)``).

>>> import tessera
>>> s = tessera.sparse.FloatTensor(tessera.tensor([[0, 1], [1, 0]]), tessera.tensor([2., 3.]),
...                                tessera.Size([2, 2]))
>>> tessera.sparse.mm(s, tessera.eye(2)).tolist()
[[0.0, 2.0], [3.0, 0.0]]
>>> tessera.sparse.sum(s).item()
5.0
"""
from __future__ import annotations

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.ops.sparse import SparseTensor, mm as _mm, sparse_coo_tensor, sparse_sum as sum

__all__ = ["mm", "addmm", "sum", "softmax", "log_softmax", "FloatTensor", "DoubleTensor",
           "LongTensor", "IntTensor", "ByteTensor", "BoolTensor"]


def mm(mat1, mat2) -> Tensor:
    """``mat1 @ mat2`` with a sparse operand; a sparse leaf's gradient is sparse, at its
    stored entries (``torch.mm`` gives it dense)."""
    return _mm(mat1, mat2, masked_grad=True)


def addmm(mat: Tensor, mat1, mat2, *, beta: float = 1, alpha: float = 1) -> Tensor:
    """``beta * mat + alpha * (mat1 @ mat2)`` with a sparse ``mat1``."""
    prod = mm(mat1, mat2)
    return mat * beta + prod * alpha if (beta, alpha) != (1, 1) else mat + prod


def softmax(input, dim: int, *, dtype=None):
    """Softmax over the stored entries along ``dim``; unstored entries count as -inf (they
    stay zero), as ``torch.sparse.softmax``."""
    return _masked(input, dim, dtype, log=False)


def log_softmax(input, dim: int, *, dtype=None):
    """``log(softmax(input, dim))`` over the stored entries, as ``torch.sparse.log_softmax``."""
    return _masked(input, dim, dtype, log=True)


def _masked(input, dim, dtype, log: bool):
    if type(input) is not SparseTensor:
        raise TypeError("tessera.sparse.softmax expects a sparse COO tensor")
    s = input.coalesce()
    dense = s.to_dense(dtype)
    mask = sparse_coo_tensor(s._indices(), s._values().new_ones(s._values().shape),
                             s.shape).to_dense() != 0
    filled = dense.masked_fill(~mask, float("-inf"))
    out = filled.log_softmax(dim) if log else filled.softmax(dim)
    return _gather_like(out, s)


def _gather_like(dense, s):
    """``dense`` at ``s``'s stored positions, as a sparse tensor with ``s``'s indices."""
    vals = dense[tuple(s._indices())]
    return sparse_coo_tensor(s._indices(), vals, s.shape, is_coalesced=True)


def _legacy(dtype: D.dtype):
    def make(*args, size=None):
        if len(args) >= 2 and isinstance(args[0], Tensor):
            indices, values = args[0], args[1]
            shape = args[2] if len(args) > 2 else size
            return sparse_coo_tensor(indices, values, shape, dtype=dtype)
        shape = tuple(args[0]) if len(args) == 1 and isinstance(args[0], tuple) else args
        from tessera.ops.creation import zeros
        return sparse_coo_tensor(zeros(len(shape), 0, dtype=D.int64), zeros(0, dtype=dtype),
                                 tuple(shape))
    return make


FloatTensor, DoubleTensor = _legacy(D.float32), _legacy(D.float64)
LongTensor, IntTensor = _legacy(D.int64), _legacy(D.int32)
ByteTensor, BoolTensor = _legacy(D.uint8), _legacy(D.bool_)
