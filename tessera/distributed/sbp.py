"""``tessera.sbp``: how the local tiles of a global tensor make up the whole.

* ``split(dim)``: the tensor is cut along ``dim``; rank *i* of the mesh axis holds tile *i*.
  Uneven sizes follow OneFlow's rule: the first ``n % k`` ranks take one more row.
* ``broadcast``: every rank holds the whole tensor.
* ``partial_sum``: every rank holds a tensor of the full shape; the value is their sum.

A global tensor's ``sbp`` is a tuple with one entry per axis of its placement's mesh.

>>> import tessera
>>> tessera.sbp.split(0), tessera.sbp.broadcast, tessera.sbp.partial_sum
(tessera.sbp.split(dim=0), tessera.sbp.broadcast, tessera.sbp.partial_sum)
>>> tessera.sbp.split(1) == tessera.sbp.split(dim=1)
True
"""
from __future__ import annotations

__all__ = ["sbp", "split", "broadcast", "partial_sum", "as_sbp_tuple", "split_sizes",
           "split_range"]


class sbp:  # noqa: N801  (OneFlow's name for the type)
    """One SBP value: ``kind`` is "S", "B" or "P"; ``dim`` is the split dim (None otherwise)."""

    __slots__ = ("kind", "dim")

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
