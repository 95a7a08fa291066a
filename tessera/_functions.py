"""The public op functions of every family, gathered for ``tessera.*`` and Tensor methods.

Each family module in ``tessera.ops`` registers its ``OpDef``s and lists its public
functions in ``__all__``; importing this module fills the table Tensor methods call. The
neural-network functions PyTorch also has at top level (``tessera.selu``...) sit above the
ops, in ``tessera.nn.functional._toplevel``: ``tessera/__init__.py`` adds those.
"""
from tessera import _fastpath
from tessera._tensor import FAST_OPERATORS, Tensor
from tessera._tensor_methods import _OPS, bind_methods
from tessera.ops import (
    arithmetic,
    comparison,
    creation,
    getitem,
    reduce,
    scan,
    ternary,
    unary,
    views,
)

_FAMILIES = [creation, unary, arithmetic, comparison, ternary, views, getitem, reduce, scan]
for _mod in ("gather_scatter", "index_slices", "flat_index", "shape", "broadcast", "sorting",
             "linalg", "random", "activation", "einsum"):
    try:  # families written in later steps; each is optional until it exists
        _FAMILIES.append(__import__(f"tessera.ops.{_mod}", fromlist=["__all__"]))
    except ModuleNotFoundError as _e:
        if _e.name != f"tessera.ops.{_mod}":
            raise

for _fam in _FAMILIES:
    for _name in _fam.__all__:
        _fn = getattr(_fam, _name)
        globals()[_name] = _fn
        _OPS[_name] = _fn

_OPS["_rebuild_tensor"] = creation._rebuild_tensor  # Tensor.__reduce_ex__ (pickling)
bind_methods()
_fastpath.bind_operators(Tensor, FAST_OPERATORS)  # x + y straight to the C dispatch

__all__ = sorted({n for f in _FAMILIES for n in f.__all__})
