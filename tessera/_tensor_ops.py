"""The op functions behind Tensor's methods and operators.

``Tensor`` sits below the ops, so its methods (declared on the class, in
``tessera._tensor_methods``) call the public functions of the op families through the table
``_OPS``, which this module fills from each family's ``__all__``; ``bind_methods`` then puts
each function itself in place of its wrapper. The ops that a Python operator stands for
(``OpDef.operator``: ``x + y`` is ``add`` with ``alpha=1``) are bound to the C fast path.

>>> import tessera
>>> tessera.ones(2).sum() == tessera.sum(tessera.ones(2))
tensor(True)
"""
from tessera import _fastpath
from tessera._tensor import FAST_OPERATORS, Tensor
from tessera._tensor_methods import _OPS, bind_methods
from tessera.ops import (
    activation,
    arithmetic,
    binary,
    broadcast,
    comparison,
    creation,
    einsum,
    flat_index,
    gather_scatter,
    getitem,
    index_slices,
    linalg,
    nchwc,
    quantized,
    random,
    reduce,
    scan,
    shape,
    sorting,
    sparse,
    ternary,
    unary,
    views,
)
from tessera.ops.registry import REGISTRY

# registers the binary-network ops (tessera.nn.binary is their public face) and the
# blocked-layout ones (tessera.graph.passes.nchwc makes them)
_ = (binary, nchwc)

# the families whose public functions are tessera.* (the package re-exports each __all__)
FAMILIES = (creation, unary, arithmetic, comparison, ternary, views, getitem, reduce, scan,
            gather_scatter, index_slices, flat_index, shape, broadcast, sorting, linalg, random,
            activation, einsum, sparse, quantized)

for _family in FAMILIES:
    for _name in _family.__all__:
        _OPS[_name] = getattr(_family, _name)
_OPS["_rebuild_tensor"] = creation._rebuild_tensor  # Tensor.__reduce_ex__ (pickling)
_OPS["to_sparse"], _OPS["to_dense"] = sparse.to_sparse, sparse.to_dense  # methods only
bind_methods()

FAST_OPERATORS.update({op.operator[0]: (op, op.operator[1])
                       for op in REGISTRY.values() if op.operator is not None})
_fastpath.bind_operators(Tensor, FAST_OPERATORS)  # x + y straight to the C dispatch
