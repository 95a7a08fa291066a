"""Sparse COO tensors: ``sparse_coo_tensor``, ``to_sparse``, ``to_dense``, ``coalesce``,
``indices``, ``values``, ``tessera.sparse.mm``/``spmm`` and the sparse-dense arithmetic
graph-network scripts use, with gradients.

A sparse tensor holds two ordinary tensors, ``indices`` (sparse_dim x nnz, int64) and
``values`` (nnz, *dense dims), and its ops are ordinary ops on them: three OpDefs
(``sparse_coo_to_dense``, ``sparse_gather``, ``sparse_mm``, the last SciPy's CSR product)
and the dense ops on ``values``. So autograd needs nothing new: the gradient reaches
``values`` like any other. A sparse tensor's ``device`` is ``cpu``; its data lives on the
``sparse`` device, which has no kernels, so a dense op reached with a sparse tensor raises
PyTorch's error instead of reading what is not there.

>>> import tessera
>>> i = tessera.tensor([[0, 1, 1], [2, 0, 2]])
>>> s = tessera.sparse_coo_tensor(i, tessera.tensor([3., 4., 5.]), (2, 3))
>>> s
tensor(indices=tensor([[0, 1, 1],
                       [2, 0, 2]]),
       values=tensor([3., 4., 5.]),
       size=(2, 3), nnz=3, layout=tessera.sparse_coo)
>>> (s @ tessera.ones(3, 2)).tolist()
[[3.0, 3.0], [9.0, 9.0]]
>>> (tessera.ones(2, 3) + s).tolist()
[[1.0, 1.0, 4.0], [5.0, 1.0, 6.0]]
"""
from __future__ import annotations

import weakref

import numpy as np

from tessera import _dispatch, _dtype as D
from tessera._tensor import _CPU, Tensor, layout, sparse_coo
from tessera._tensor_methods import _OPS
from tessera.autograd.grad_mode import STATE, no_grad
from tessera.device.registry import Backend, device, device as _device, register_device
from tessera.ops import cost
from tessera.ops._util import call
from tessera.ops.registry import Meta, defop

__all__ = ["sparse_coo_tensor", "spmm"]

# The gradient of a sparse leaf: ``torch.sparse.mm`` (and ``sparse.addmm``) give it sparse,
# at the stored entries only; ``torch.mm``, ``matmul``, ``@``, ``spmm`` and ``dense + sparse``
# give it dense, in full. The first reaches the leaf through its values; the second through
# a dense copy whose gradient accumulates into the leaf itself (``_densified``).


# ---- the sparse device: where a sparse tensor's (absent) dense data lives ----------------

def _not_here(op_name: str) -> NotImplementedError:
    return NotImplementedError(f"Could not run 'aten::{op_name}' with arguments from the "
                               "'SparseCPU' backend. This operator has no sparse kernel in "
                               "tessera; use Tensor.to_dense() first.")


class _SparseBackend(Backend):
    """No kernels: every dense op meeting a sparse tensor raises ``_not_here``."""

    def from_numpy(self, array, index):
        raise TypeError("a NumPy array becomes a sparse tensor through "
                        "tessera.sparse_coo_tensor(indices, values, size) or to_sparse()")

    def to_numpy(self, array):
        raise TypeError("can't convert Sparse layout tensor to numpy. Use Tensor.to_dense() "
                        "first.")

    def kernel(self, op):
        def unsupported(*args, **attrs):
            raise _not_here(op.name)
        return unsupported

    def join_error(self, op) -> Exception:
        """The error when a sparse tensor meets dense ones in an op without a sparse rule."""
        return _not_here(op.name)


register_device("sparse", _SparseBackend())
_SPARSE = device("sparse")


# ---- the ops on (indices, values) -------------------------------------------------------

def _sd(indices: Meta) -> int:
    return indices.shape[0] if len(indices.shape) == 2 else 1


def _to_dense_infer(indices, values, *, size):
    return Meta(tuple(size), values.dtype)


def _check_indices(indices, size) -> None:
    """Indices inside ``size``: checked where the values are known (the kernels), so a
    sparse tensor built inside a traced graph is checked when the graph runs."""
    if indices.shape[1] == 0:
        return
    lo, hi = indices.min(1), indices.max(1)
    for d in range(indices.shape[0]):
        if lo[d] < 0:
            raise RuntimeError(f"found negative index {lo[d]} for dim {d}")
        if hi[d] >= size[d]:
            raise RuntimeError(f"size is inconsistent with indices: for dim {d}, size is "
                               f"{size[d]} but found index {hi[d]}")


def _to_dense_kernel(indices, values, *, size):
    _check_indices(indices, size)
    out = np.zeros(tuple(size), values.dtype)
    np.add.at(out, tuple(indices), values)   # repeated indices sum, as coalesce does
    return out


def _to_dense_grad(ctx, g):
    indices = ctx.inputs[0]
    return None, call(_GATHER, g, indices)


def _gather_infer(dense, indices):
    return Meta((indices.shape[1],) + tuple(dense.shape[_sd(indices):]), dense.dtype)


def _gather_kernel(dense, indices):
    _check_indices(indices, dense.shape)
    return dense[tuple(indices)]


def _gather_grad(ctx, g):
    dense_meta = ctx.input_metas[0]
    return call(_TO_DENSE, ctx.inputs[1], g, size=tuple(dense_meta.shape)), None


def _mm_infer(indices, values, dense, *, size):
    if values.dtype is not dense.dtype:
        raise RuntimeError(f"sparse.mm: expected mat1 and mat2 to have the same dtype, but got: "
                           f"{values.dtype} != {dense.dtype}")
    if len(dense.shape) != 2 or dense.shape[0] != size[1]:
        raise RuntimeError(f"sparse.mm: mat1 and mat2 shapes cannot be multiplied ({size[0]}x"
                           f"{size[1]} and {'x'.join(map(str, dense.shape))})")
    return Meta((size[0], dense.shape[1]), dense.dtype)


def _mm_kernel(indices, values, dense, *, size):
    import scipy.sparse
    _check_indices(indices, size)
    a = scipy.sparse.csr_matrix((values, (indices[0], indices[1])), shape=tuple(size))
    return np.asarray(a @ dense, dtype=dense.dtype)


def _mm_grad(ctx, g):
    indices, values, dense = ctx.inputs
    need = ctx.needs_input_grad
    g_values = g_dense = None
    if need[1]:   # d out[r, :] / d values[k] = dense[c, :] where (r, c) = indices[:, k]
        g_values = (call(_GATHER, g, indices[0:1]) * call(_GATHER, dense, indices[1:2])).sum(-1)
    if need[2]:   # A^T g: the same entries with rows and columns swapped
        size = ctx.attrs["size"]
        g_dense = call(_MM, indices.flip(0), values, g, size=(size[1], size[0]))
    return None, g_values, g_dense


def _mm_cost(ins, outs, *, size):
    nnz, n = ins[1].shape[0], outs[0].shape[1]
    return cost.Cost(2 * nnz * n, *cost.io(ins, outs))


_TO_DENSE = defop("sparse_coo_to_dense", _to_dense_infer, _to_dense_kernel, grad=_to_dense_grad,
                  cost=cost.movement())
_GATHER = defop("sparse_gather", _gather_infer, _gather_kernel, grad=_gather_grad,
                cost=cost.movement())
_MM = defop("sparse_mm", _mm_infer, _mm_kernel, grad=_mm_grad, cost=_mm_cost)


# ---- the tensor --------------------------------------------------------------------------

class SparseTensor(Tensor):
    """A sparse COO tensor (``layout == tessera.sparse_coo``). Made by
    ``tessera.sparse_coo_tensor`` or ``Tensor.to_sparse()``; ``to_dense()`` goes back.

    >>> import tessera
    >>> d = tessera.tensor([[0., 2.], [3., 0.]])
    >>> s = d.to_sparse()
    >>> s.indices().tolist(), s.values().tolist(), s.is_sparse
    ([[0, 1], [1, 0]], [2.0, 3.0], True)
    """

    _sp_indices: Tensor     # (sparse_dim, nnz) int64
    _sp_values: Tensor      # (nnz, *dense dims)
    _sp_coalesced: bool     # indices sorted and unique

    @staticmethod
    def _new(indices: Tensor, values: Tensor, size: tuple, coalesced: bool) -> SparseTensor:
        t = object.__new__(SparseTensor)
        t._data = None
        t._shape = tuple(int(s) for s in size)
        t._dtype = values._dtype
        t._device = _SPARSE
        t._requires_grad = values._requires_grad
        t.grad_fn = values.grad_fn
        t._output_nr = 0
        t._version = [0]
        t._sp_indices, t._sp_values, t._sp_coalesced = indices, values, coalesced
        return t

    # -- what it is --
    @property
    def device(self) -> device:
        return _CPU

    @property
    def layout(self) -> layout:
        return sparse_coo

    @property
    def is_sparse(self) -> bool:
        return True

    def is_coalesced(self) -> bool:
        return self._sp_coalesced

    def sparse_dim(self) -> int:
        return self._sp_indices.shape[0]

    def dense_dim(self) -> int:
        return len(self._shape) - self.sparse_dim()

    def _nnz(self) -> int:
        return self._sp_values.shape[0]

    def _indices(self) -> Tensor:
        return self._sp_indices

    def _values(self) -> Tensor:
        return self._sp_values

    def indices(self) -> Tensor:
        if not self.is_coalesced():
            raise RuntimeError("Cannot get indices on an uncoalesced tensor, please call "
                               ".coalesce() first")
        return self._sp_indices

    def values(self) -> Tensor:
        if not self.is_coalesced():
            raise RuntimeError("Cannot get values on an uncoalesced tensor, please call "
                               ".coalesce() first")
        return self._sp_values

    # -- autograd: the values carry it --
    @property
    def requires_grad(self) -> bool:
        return self._sp_values.requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad: bool = True) -> SparseTensor:
        self._sp_values.requires_grad_(requires_grad)
        self._requires_grad = bool(requires_grad)
        return self

    @property
    def grad(self):
        g, dense = self._sp_values.grad, self.__dict__.get("_grad")
        if g is None:
            return dense
        grad = self._masked_grad(g)
        return grad if dense is None else dense + grad.to_dense()

    @grad.setter
    def grad(self, value) -> None:
        if value is None:
            self._sp_values.grad = None
            self.__dict__.pop("_grad", None)
        else:
            raise RuntimeError("assigning the gradient of a sparse tensor is not supported")

    def _masked_grad(self, g: Tensor) -> SparseTensor:
        grad = SparseTensor._new(self._sp_indices, g, self._shape, self.is_coalesced())
        if self.is_coalesced():
            return grad
        # the gradient is per position, as PyTorch's: each copy of a repeated index holds
        # the same value, so the coalesced sum divided by the number of copies
        ones = g.new_ones((g.shape[0],) + (1,) * (g.dim() - 1))
        grad, copies = grad.coalesce(), SparseTensor._new(self._sp_indices, ones, self._shape,
                                                          False).coalesce()
        return SparseTensor._new(grad._sp_indices, grad._sp_values / copies._sp_values,
                                 self._shape, True)

    # -- conversions --
    def to_dense(self, dtype=None, *, masked_grad: bool = True) -> Tensor:
        out = call(_TO_DENSE, self._sp_indices, self._sp_values,
                   size=self._shape)
        return out if dtype is None else out.to(dtype)

    def to_sparse(self, sparse_dim: int | None = None) -> SparseTensor:
        return self

    def coalesce(self) -> SparseTensor:
        """Sorted indices, each once (repeated entries summed)."""
        if self.is_coalesced():
            return self
        idx, vals = self._sp_indices, self._sp_values
        flat = np.ravel_multi_index(tuple(idx.numpy()), self._shape[:self.sparse_dim()]) \
            if idx.shape[1] else np.zeros(0, np.int64)
        uniq, inverse = np.unique(flat, return_inverse=True)
        new_idx = Tensor._from_numpy(np.array(np.unravel_index(
            uniq, self._shape[:self.sparse_dim()]), dtype=np.int64).reshape(self.sparse_dim(), -1))
        summed = _OPS["zeros"]((len(uniq),) + tuple(vals.shape[1:]), dtype=vals.dtype) \
            .index_add(0, Tensor._from_numpy(inverse.astype(np.int64)), vals)
        return SparseTensor._new(new_idx, summed, self._shape, True)

    def detach(self) -> SparseTensor:
        return SparseTensor._new(self._sp_indices, self._sp_values.detach(),
                                 self._shape, self.is_coalesced())

    def clone(self, *, memory_format=None) -> SparseTensor:
        return SparseTensor._new(self._sp_indices.clone(),
                                 self._sp_values.clone(), self._shape,
                                 self.is_coalesced())

    def to(self, *args, **kwargs) -> SparseTensor:
        """Moves between CPU devices are no-ops; a dtype casts the values."""
        dt = kwargs.pop("dtype", None)
        dev = kwargs.pop("device", None)
        kwargs.pop("non_blocking", None)
        kwargs.pop("copy", None)
        for a in args:
            if isinstance(a, D.dtype):
                dt = a
            elif a is not None:
                dev = a
        if dev is not None and device(dev).type != "cpu":
            raise RuntimeError(f"sparse tensors live on the CPU; cannot move to {dev}")
        if dt is None or dt is self._dtype:
            return self
        return SparseTensor._new(self._sp_indices, self._sp_values.to(dt),
                                 self._shape, self.is_coalesced())

    def cpu(self, memory_format=None) -> SparseTensor:
        return self

    def float(self) -> SparseTensor:
        return self.to(D.float32)

    def double(self) -> SparseTensor:
        return self.to(D.float64)

    def numpy(self, *, force: bool = False):
        raise TypeError("can't convert Sparse layout tensor to numpy. Use Tensor.to_dense() "
                        "first.")

    def tolist(self):
        return self.to_dense().tolist()

    # -- shape --
    def t(self) -> SparseTensor:
        if len(self._shape) > 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is "
                               f"{len(self._shape)}D")
        return self.transpose(0, 1) if len(self._shape) == 2 else self

    def transpose(self, dim0: int, dim1: int) -> SparseTensor:
        n, sd = len(self._shape), self.sparse_dim()
        d0, d1 = dim0 % n, dim1 % n
        if d0 >= sd or d1 >= sd:
            raise RuntimeError("transpose of dense dimensions of a sparse tensor is not "
                               "supported")
        order = list(range(sd))
        order[d0], order[d1] = order[d1], order[d0]
        shape = list(self._shape)
        shape[d0], shape[d1] = shape[d1], shape[d0]
        idx = self._sp_indices[order]
        return SparseTensor._new(idx, self._sp_values, tuple(shape), False)

    # -- arithmetic --
    def _with_values(self, values: Tensor) -> SparseTensor:
        return SparseTensor._new(self._sp_indices, values, self._shape,
                                 self.is_coalesced())

    def __neg__(self) -> SparseTensor:
        return self._with_values(-self._sp_values)

    def __mul__(self, other):
        if isinstance(other, SparseTensor):
            return (self.to_dense() * other.to_dense()).to_sparse()
        if isinstance(other, Tensor) and other.dim() > 0:  # sparse * dense: sparse
            dense = other.expand(self._shape) if other._shape != self._shape else other
            return self._with_values(
                self._sp_values * call(_GATHER, dense, self._sp_indices))
        return self._with_values(self._sp_values * other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        if isinstance(other, Tensor) and other.dim() > 0:
            raise RuntimeError("sparse division by a non-scalar tensor is not supported")
        return self._with_values(self._sp_values / other)

    def mul(self, other):
        return self * other

    def div(self, other):
        return self / other

    def __add__(self, other):
        return _add(self, other, 1)

    def __radd__(self, other):
        return _add(other, self, 1)

    def __sub__(self, other):
        return _add(self, other, -1)

    def __rsub__(self, other):
        return _add(other, self, -1)

    def add(self, other, *, alpha=1):
        return _add(self, other, alpha)

    def sub(self, other, *, alpha=1):
        return _add(self, other, -alpha)

    def __matmul__(self, other):
        return mm(self, other)

    def __rmatmul__(self, other):
        return mm(other, self)

    def mm(self, mat2):
        return mm(self, mat2)

    def matmul(self, other):
        return mm(self, other)

    def sum(self, dim=None, keepdim: bool = False, dtype=None):
        return sparse_sum(self, dim, dtype=dtype) if not keepdim else \
            self.to_dense().sum(dim, keepdim=True, dtype=dtype)

    # -- printing --
    def __repr__(self) -> str:
        pad = " " * 7
        ind = repr(self._sp_indices).replace("\n", "\n" + pad + " " * 8)
        val = repr(self._sp_values).replace("\n", "\n" + pad + " " * 7)
        extra = ", requires_grad=True" if self.requires_grad and self.grad_fn is None else ""
        return (f"tensor(indices={ind},\n{pad}values={val},\n{pad}size={self._shape}, "
                f"nnz={self._nnz()}, layout=tessera.sparse_coo{extra})")

    __str__ = __repr__


def _is_sparse(x) -> bool:
    return type(x) is SparseTensor


def to_dense(self, dtype=None, *, masked_grad=None) -> Tensor:
    """``Tensor.to_dense()``: a dense tensor as it is (a sparse one densified)."""
    if _is_sparse(self):
        return self.to_dense(dtype)
    return self if dtype is None else self.to(dtype)


def _densified(s: SparseTensor) -> Tensor:
    """``s.to_dense()``, except that a leaf ``s`` requiring grad gets the dense gradient of
    the result in its ``.grad`` (PyTorch's ``torch.mm(sparse, dense)``, ``dense + sparse``)
    instead of the gradient at its stored entries."""
    v = s._sp_values
    if not (v._requires_grad and v.grad_fn is None and STATE.enabled):
        return s.to_dense()
    with no_grad():
        d = s.to_dense()
    d._requires_grad = True
    # the accumulator lives while ``d`` does, then in the edges of the ops that read ``d``
    d.__dict__["_acc"] = acc = s._grad_accumulator()
    d._grad_acc = weakref.ref(acc)
    return d


def binary(name: str, input, other, alpha=1, out=None):
    """``tessera.add``/``sub``/``mul`` (and their ``out=`` and in-place forms) with a
    sparse operand: the dense ops' functions hand such a call here."""
    if name == "mul":
        res = (other * input) if _is_sparse(other) else input * other
    else:
        res = _add(input, other, alpha if name == "add" else -alpha)
    if out is None:
        return res
    if _is_sparse(out):
        raise RuntimeError(f"{name}: writing into a sparse tensor is not supported")
    return out.copy_(res.to_dense())


def _add(a, b, alpha):
    """``a + alpha * b`` with a sparse operand: sparse + sparse is sparse (entries
    concatenated, coalesced lazily), anything + dense is dense."""
    if _is_sparse(a) and _is_sparse(b):
        if a._shape != b._shape:
            raise RuntimeError(f"add: expected sizes of sparse tensors to match, got {a.shape} "
                               f"and {b.shape}")
        bv = b._values() if alpha == 1 else b._values() * alpha
        idx = _OPS["cat"]([a._indices(), b._indices()], 1)
        vals = _OPS["cat"]([a._values(), bv], 0)
        return SparseTensor._new(idx, vals, a._shape, False).coalesce()
    if _is_sparse(a) and isinstance(b, Tensor):
        raise RuntimeError("add(sparse, dense) is not supported. Use add(dense, sparse) "
                           "instead.")
    da = _densified(a) if _is_sparse(a) else a
    db = _densified(b) if _is_sparse(b) else b
    return _OPS["add"](da, db, alpha=alpha)


def _dense_grad_leaf(x) -> bool:
    return _is_sparse(x) and x._sp_values._requires_grad and \
        x._sp_values.grad_fn is None and STATE.enabled


def mm(input, mat2, *, masked_grad: bool = False) -> Tensor:
    """``input @ mat2`` where either is sparse: a dense result (a product of two sparse
    matrices is sparse). A sparse leaf gets a dense gradient, as from ``torch.mm``; with
    ``masked_grad`` a sparse one at its stored entries, as from ``torch.sparse.mm``."""
    if _is_sparse(input) and _is_sparse(mat2):
        return mm(input, mat2.to_dense(), masked_grad=masked_grad).to_sparse()
    if not masked_grad and (_dense_grad_leaf(input) or _dense_grad_leaf(mat2)):
        a, b = (_densified(x) if _is_sparse(x) else x for x in (input, mat2))
        return _OPS["mm"](a, b)
    if _is_sparse(input):
        if input.dim() != 2 or input.dense_dim():
            raise RuntimeError(f"sparse.mm: expected a 2-d sparse matrix, got {input.dim()}-d "
                               f"with {input.dense_dim()} dense dims")
        if not isinstance(mat2, Tensor) or mat2.dim() != 2:
            raise RuntimeError("sparse.mm: mat2 must be a matrix (2D)")
        return call(_MM, input._indices(), input._values(), mat2, size=input._shape)
    if _is_sparse(mat2):   # dense @ sparse = (sparse^T @ dense^T)^T
        if not isinstance(input, Tensor) or input.dim() != 2:
            raise RuntimeError("mm: self must be a matrix (2D)")
        return mm(mat2.t(), input.t(), masked_grad=masked_grad).t()
    return _OPS["mm"](input, mat2)


def spmm(input, mat2) -> Tensor:
    """PyTorch's ``torch.spmm``: a sparse matrix times a dense one.

    >>> import tessera
    >>> s = tessera.eye(2).to_sparse()
    >>> tessera.spmm(s, tessera.ones(2, 3)).tolist()
    [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    """
    return mm(input, mat2)


def sparse_sum(input, dim=None, dtype=None):
    """``torch.sparse.sum``: all entries (a dense 0-d tensor), or over ``dim``: sparse while
    sparse dims remain, dense once only dense dims are left."""
    if not _is_sparse(input):
        return _OPS["sum"](input, dim, dtype=dtype) if dim is not None else \
            _OPS["sum"](input, dtype=dtype)
    vals = input._values()
    if dim is None:
        return vals.sum(dtype=dtype)
    dims = [d % input.dim() for d in ((dim,) if isinstance(dim, int) else dim)]
    sd = input.sparse_dim()
    dense_dims = [d - sd + 1 for d in dims if d >= sd]
    if dense_dims:
        vals = vals.sum(dense_dims)
    keep = [d for d in range(sd) if d not in dims]
    size = tuple(s for d, s in enumerate(input._shape) if d not in dims)
    if dtype is not None:
        vals = vals.to(dtype)
    if not keep:
        return vals.sum(0)
    idx = input._indices()[keep]
    return SparseTensor._new(idx, vals, size, False).coalesce()


def sparse_coo_tensor(indices, values, size=None, *, dtype=None, device=None,
                      requires_grad: bool = False, check_invariants=None,
                      is_coalesced=None) -> SparseTensor:
    """A sparse COO tensor of ``size`` with ``values`` at ``indices`` (sparse_dim x nnz);
    ``size`` defaults to the smallest that holds the indices. Repeated indices sum.

    >>> import tessera
    >>> s = tessera.sparse_coo_tensor([[0, 1], [1, 0]], [2., 3.], (2, 2))
    >>> s.to_dense().tolist()
    [[0.0, 2.0], [3.0, 0.0]]
    """
    idx = indices if isinstance(indices, Tensor) else _OPS["tensor"](indices)
    vals = values if isinstance(values, Tensor) else _OPS["tensor"](values)
    if idx.dtype not in (D.int64, D.int32, D.int16, D.int8, D.uint8):
        raise RuntimeError(f"indices must be an int64 tensor, got {idx.dtype}")
    if idx.dim() != 2:
        raise RuntimeError(f"indices must be sparse_dim x nnz, but got: {list(idx.shape)}")
    idx = idx.to(D.int64)
    if idx.shape[1] != vals.shape[0] if vals.dim() else idx.shape[1] != 1:
        raise RuntimeError(f"indices and values must have same nnz, but got nnz from indices: "
                           f"{idx.shape[1]}, nnz from values: "
                           f"{vals.shape[0] if vals.dim() else 1}")
    if vals.dim() == 0:
        vals = vals.reshape(1)
    sd = idx.shape[0]
    host = idx._data is not None   # meta tensors carry no values to check
    if size is None:
        if not host:
            raise RuntimeError("sparse_coo_tensor: size is required for meta indices")
        top = idx.numpy().max(1) + 1 if idx.shape[1] else np.zeros(sd, np.int64)
        size = tuple(int(s) for s in top) + tuple(vals.shape[1:])
    size = tuple(int(s) for s in size)
    if len(size) != sd + vals.dim() - 1:
        raise RuntimeError(f"number of dimensions must be sparse_dim ({sd}) + dense_dim "
                           f"({vals.dim() - 1}), but got {len(size)}")
    if tuple(vals.shape[1:]) != size[sd:]:
        raise RuntimeError(f"values has incorrect size, expected {[vals.shape[0], *size[sd:]]}, "
                           f"got {list(vals.shape)}")
    if host and not _dispatch._MODES:   # eager: say so now (the kernels check again)
        _check_indices(idx.numpy(), size)
    if dtype is not None:
        vals = vals.to(dtype)
    if device is not None and _device(device).type != "cpu":
        raise RuntimeError(f"sparse tensors live on the CPU; cannot create one on {device}")
    if requires_grad:
        vals = vals.detach().requires_grad_(True)
    coalesced = idx.shape[1] <= 1 if is_coalesced is None else bool(is_coalesced)
    return SparseTensor._new(idx, vals, size, coalesced)


def to_sparse(self, sparse_dim: int | None = None, *, layout=None, blocksize=None,
              dense_dim=None) -> SparseTensor:
    """``Tensor.to_sparse()``: the nonzero entries as a coalesced sparse COO tensor;
    ``sparse_dim`` (default: every dim) leading dims become sparse, the rest stay dense in
    the values. Gradients flow back to ``self``.

    >>> import tessera
    >>> tessera.tensor([0., 5., 0.]).to_sparse().indices().tolist()
    [[1]]
    """
    if _is_sparse(self):
        return self
    if blocksize is not None or dense_dim is not None:
        raise NotImplementedError("to_sparse: blocksize and dense_dim (compressed layouts) "
                                  "are not supported; tessera has sparse COO tensors")
    if layout is not None and layout is not sparse_coo:
        raise NotImplementedError(f"to_sparse: layout {layout} is not supported")
    sd = self.dim() if sparse_dim is None else int(sparse_dim)
    if not 0 < sd <= self.dim():
        raise RuntimeError(f"sparse_dim must be in [1, {self.dim()}], got {sd}")
    arr = self.detach().numpy()
    mask = arr.reshape(arr.shape[:sd] + (-1,)).any(-1) if sd < arr.ndim else arr != 0
    idx = Tensor._from_numpy(np.array(np.nonzero(mask), dtype=np.int64).reshape(sd, -1))
    vals = call(_GATHER, self, idx)
    return SparseTensor._new(idx, vals, self._shape, True)
