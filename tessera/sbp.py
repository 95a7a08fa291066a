"""``tessera.sbp``: how the local tiles of a global tensor make up the whole.

* ``split(dim)``: the tensor is cut along ``dim``; rank *i* of the mesh axis holds tile *i*.
  Uneven sizes follow OneFlow's rule: the first ``n % k`` ranks take one more row.
* ``broadcast``: every rank holds the whole tensor.
* ``partial_sum``: every rank holds a tensor of the full shape; the value is their sum.

A global tensor's ``sbp`` is a tuple with one entry per axis of its placement's mesh.

This module is also the vocabulary of each op's ``sbp`` rule (``Signature``, ``SbpRule``):
it sits below the ops, so every op family declares its rule beside its kernels. What a
rule's local computation needs of the running processes (the communicator of this rank,
the number of the compiled step running) comes through ``communicator()`` and
``step_serial()``, which ``tessera.distributed`` registers.

>>> import tessera
>>> tessera.sbp.split(0), tessera.sbp.broadcast, tessera.sbp.partial_sum
(tessera.sbp.split(dim=0), tessera.sbp.broadcast, tessera.sbp.partial_sum)
>>> tessera.sbp.split(1) == tessera.sbp.split(dim=1)
True
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["sbp", "split", "broadcast", "partial_sum", "as_sbp_tuple", "split_sizes",
           "split_range", "tile_ranges", "Signature", "SbpRule", "communicator",
           "set_communicator", "step_serial", "set_step_serial"]


class sbp:  # noqa: N801  (OneFlow's name for the type)
    """One SBP value: ``kind`` is "S", "B" or "P"; ``dim`` is the split dim (None otherwise)."""

    __slots__ = ("kind", "dim")
    kind: str
    dim: int | None

    def __init__(self, kind: str, dim: int | None = None):
        if kind not in ("S", "B", "P"):
            raise ValueError(f"sbp kind must be 'S', 'B' or 'P', got {kind!r}")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "dim", dim)

    def __setattr__(self, name, value):
        raise AttributeError("sbp values are immutable")

    def is_split(self) -> bool:
        return self.kind == "S"

    def is_broadcast(self) -> bool:
        return self.kind == "B"

    def is_partial_sum(self) -> bool:
        return self.kind == "P"

    def short(self) -> str:
        """``S(0)``, ``B`` or ``P``: the compact form used in error messages."""
        return f"S({self.dim})" if self.kind == "S" else self.kind

    def __eq__(self, other) -> bool:
        return isinstance(other, sbp) and self.kind == other.kind and self.dim == other.dim

    def __hash__(self) -> int:
        return hash((self.kind, self.dim))

    def __repr__(self) -> str:
        if self.kind == "S":
            return f"tessera.sbp.split(dim={self.dim})"
        return "tessera.sbp.broadcast" if self.kind == "B" else "tessera.sbp.partial_sum"

    def __reduce__(self):
        return (sbp, (self.kind, self.dim))


def split(dim: int) -> sbp:
    """The tensor cut along ``dim`` (a negative dim counts from the end, as in PyTorch)."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"sbp.split(): dim must be an int, got {type(dim).__name__}")
    return sbp("S", dim)


broadcast = sbp("B")
partial_sum = sbp("P")


def as_sbp_tuple(value, mesh_ndim: int, ndim: int | None = None, what: str = "sbp"
                 ) -> tuple[sbp, ...]:
    """``value`` (one sbp, or a sequence with one per mesh axis) as a tuple of ``mesh_ndim``
    sbps, split dims wrapped to ``[0, ndim)`` when ``ndim`` is given."""
    items = (value,) if isinstance(value, sbp) else value
    if not isinstance(items, (tuple, list)) or not all(isinstance(s, sbp) for s in items):
        raise TypeError(f"{what}: expected a tessera.sbp value or a tuple of them, got "
                        f"{value!r}")
    items = tuple(items)
    if len(items) != mesh_ndim:
        raise ValueError(f"{what}: {len(items)} sbp value(s) {_fmt(items)} for a placement "
                         f"with a {mesh_ndim}-D mesh (give one per mesh axis)")
    if ndim is None:
        return items
    out = []
    for s in items:
        if s.kind == "S":
            d = s.dim + ndim if s.dim < 0 else s.dim
            if not 0 <= d < ndim:
                raise ValueError(f"{what}: {s.short()} is out of range for a tensor with "
                                 f"{ndim} dim(s)")
            s = split(d)
        out.append(s)
    return tuple(out)


def _fmt(sbps) -> str:
    return "(" + ", ".join(s.short() for s in sbps) + ")"


def split_sizes(n: int, parts: int) -> list[int]:
    """OneFlow's uneven split of ``n`` over ``parts``: the first ``n % parts`` take one more.

    >>> split_sizes(5, 2)
    [3, 2]
    """
    q, r = divmod(n, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


def split_range(n: int, parts: int, i: int) -> tuple[int, int]:
    """(start, stop) of part ``i`` of ``n`` split over ``parts``."""
    q, r = divmod(n, parts)
    start = i * q + min(i, r)
    return start, start + q + (1 if i < r else 0)


def tile_ranges(shape: tuple, sbps: tuple, coords: tuple, hierarchy: tuple) -> list:
    """The ``(start, stop)`` of the tile at mesh ``coords`` in each dim of the logical
    ``shape``, each mesh axis's split applied in mesh order (nested splits of one dim cut the
    outer tile).

    >>> tile_ranges((5, 4), (split(0), split(0)), (1, 0), (2, 2))  # rows 3-4, then row 3
    [(3, 4), (0, 4)]
    """
    ranges = [(0, d) for d in shape]
    for s, c, n in zip(sbps, coords, hierarchy):
        if s.kind == "S":
            lo, hi = ranges[s.dim]
            a, b = split_range(hi - lo, n, c)
            ranges[s.dim] = (lo + a, lo + b)
    return ranges


# ---- the vocabulary of ops' sbp rules ----------------------------------------------------

class Signature(NamedTuple):
    """One way an op runs on tiles: the SBP each input must have (None for a non-tensor
    argument) and the SBP of each output. ``local``, when given, replaces the op's local
    computation for this signature (``mean`` over a split dim sums and divides by the
    logical count): ``local(op, local_args, attrs, metas, group) -> Tensor(s)``, where
    ``group`` is the placement's ranks (for the collectives of synchronised batch norm; on an
    N-D placement, the ranks along the last mesh axis, and ``metas`` the outer axes' tiles)."""

    ins: tuple
    outs: tuple
    local: Callable | None = None

    def __str__(self) -> str:
        ins = ", ".join("-" if s is None else s.short() for s in self.ins)
        return f"({ins}) -> ({', '.join(s.short() for s in self.outs)})"


class SbpRule:
    """An op's ``sbp`` rule: ``rule(*metas, **attrs)`` lists its signatures on a 1-D mesh.

    ``shape_attrs`` names attrs that hold a logical output shape (``view``'s ``shape``):
    the local kernel gets the tile's shape instead. ``mesh``: the rule also takes
    ``mesh_size`` (the ranks on the mesh axis, None when unknown), for signatures that hold
    only when a size divides evenly (``view`` splitting or merging a split dim).
    """

    def __init__(self, signatures, shape_attrs: tuple = (), mesh: bool = False,
                 contiguous: bool = False, elementwise: bool = False,
                 whole: Callable | None = None):
        self.signatures = signatures
        # on an N-D placement: the op's local computation over the whole placement,
        # ``whole(op, local_args, attrs, metas, placement, in_sbps, rank)``, run instead of
        # a signature's (which may see one mesh axis only); every axis may then take any of
        # the signatures (dropout: the seed agreed by every rank, this rank's tile of the
        # one mask whatever splits each axis makes)
        self.whole = whole
        # each output element depends on the same element of each input alone: an in-place
        # write may run on tiles whose SBPs agree (``global_tensor.inplace_kernel``)
        self.elementwise = elementwise
        self.shape_attrs = shape_attrs
        self.mesh = mesh
        # a global tensor reports contiguous strides whatever its tile's layout, so reshape
        # of a transposed global tensor reaches ``view``: its tiles are made contiguous
        self.contiguous = contiguous

    def __call__(self, *metas, mesh_size: int | None = None, **attrs) -> list[Signature]:
        if self.mesh:
            return self.signatures(*metas, mesh_size=mesh_size, **attrs)
        return self.signatures(*metas, **attrs)


_COMMUNICATOR: list[Callable[[], Any]] = []


def set_communicator(getter: Callable[[], Any]) -> None:
    """Register how a rule's local computation finds this rank's communicator (called by
    ``tessera.distributed`` when it is imported)."""
    _COMMUNICATOR[:] = [getter]


def communicator() -> Any:
    """This rank's communicator (``all_reduce``, ``rank``, ...), for a signature's ``local``
    computation (synchronised batch norm, a mean over a split batch).

    >>> import tessera
    >>> communicator().rank
    0
    """
    if not _COMMUNICATOR:
        raise RuntimeError("sbp: no communicator registered (import tessera.distributed)")
    return _COMMUNICATOR[0]()


_STEP_SERIAL: list[Callable[[], int]] = []


def set_step_serial(getter: Callable[[], int]) -> None:
    """Register how a rule's local computation finds the number of the compiled graph step
    running on this thread (called by ``tessera.distributed`` when it is imported)."""
    _STEP_SERIAL[:] = [getter]


def step_serial() -> int:
    """The number of the compiled graph step running on this thread, 0 outside one (and
    before ``tessera.distributed`` registers its counter, when no step can run): a value
    a signature's local computation keeps may be reused within the same step only.

    >>> import tessera
    >>> step_serial()
    0
    """
    return _STEP_SERIAL[0]() if _STEP_SERIAL else 0
