"""``tessera.placement``: the devices (ranks) a global tensor lives on, as a 1-D or N-D mesh.

A placement is a device type and an array of ranks. ``ranks=[0, 1]`` is a 1-D mesh of two
processes; ``ranks=[[0, 1], [2, 3]]`` a 2x2 mesh whose global tensors take one SBP per mesh
axis. Placements compare by value, as in OneFlow.

>>> import tessera
>>> p = tessera.placement("cpu", ranks=[0, 1])
>>> p
tessera.placement(type="cpu", ranks=[0, 1])
>>> p.hierarchy, p == tessera.placement(type="cpu", ranks=[0, 1])
((2,), True)
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tessera.device.registry import device as Device

__all__ = ["placement"]

_TYPES = ("cpu",)


class placement:  # noqa: N801  (OneFlow's and the issue's name)
    """Where a global tensor lives: ``placement(type="cpu", ranks=[0, 1])``."""

    __slots__ = ("_type", "_ranks", "_flat", "_key", "_coords", "_hier", "_device", "_groups")

    def __init__(self, type: str = "cpu", ranks=None):
        if not isinstance(type, str):
            raise TypeError(f"placement(): type must be a device type string such as 'cpu', "
                            f"got {type!r}")
        if type not in _TYPES:
            raise ValueError(f"placement(): device type '{type}' is not supported for global "
                             f"tensors (supported: {', '.join(_TYPES)})")
        if ranks is None:
            raise TypeError("placement(): missing the ranks (e.g. ranks=[0, 1])")
        if isinstance(ranks, int):
            ranks = [ranks]
        try:
            arr = np.array(ranks, dtype=object)
        except ValueError:
            arr = None
        if arr is None or arr.ndim == 0 or arr.size == 0 or \
                any(isinstance(r, (list, tuple)) for r in arr.flat):
            raise ValueError(f"placement(): ranks must be a non-empty int list or a "
                             f"rectangular nested list of ints, got {ranks!r}")
        if not all(isinstance(r, (int, np.integer)) and not isinstance(r, bool) and r >= 0
                   for r in arr.flat):
            raise ValueError(f"placement(): ranks must be non-negative ints, got {ranks!r}")
        arr = arr.astype(np.int64)
        if len(set(arr.reshape(-1).tolist())) != arr.size:
            raise ValueError(f"placement(): ranks must be unique, got {arr.tolist()}")
        self._type = type
        self._ranks = arr
        self._flat = tuple(int(r) for r in arr.flat)
        self._key = (type, arr.shape, self._flat)
        # looked up by every op on a global tensor: made once
        self._hier = tuple(arr.shape)
        self._coords = {r: tuple(int(c) for c in np.unravel_index(i, arr.shape))
                        for i, r in enumerate(self._flat)}
        self._device: Device | None = None
        self._groups: dict[tuple[int, int], tuple[int, ...]] = {}  # (rank, axis) -> group

    @classmethod
    def all(cls, type: str = "cpu") -> placement:
        """Every rank of the world as a 1-D mesh (``tessera.placement.all("cpu")``)."""
        from tessera.distributed import get_world_size
        return cls(type, list(range(get_world_size())))

    # ---- what it is -------------------------------------------------------------------
    @property
    def type(self) -> str:
        return self._type

    @property
    def ranks(self) -> np.ndarray:
        """The ranks as an array shaped like the mesh."""
        return self._ranks.copy()

    @property
    def hierarchy(self) -> tuple[int, ...]:
        """The mesh shape: ``(2,)`` for ranks=[0, 1], ``(2, 2)`` for a 2x2 mesh."""
        return self._hier

    @property
    def ndim(self) -> int:
        return self._ranks.ndim

    @property
    def flat_ranks(self) -> tuple[int, ...]:
        """The ranks in mesh order (row-major)."""
        return self._flat

    @property
    def size(self) -> int:
        return len(self._flat)

    @property
    def device(self) -> Device:
        if self._device is None:
            from tessera.device.registry import device
            self._device = device(self._type)
        return self._device

    # ---- a rank's place on the mesh ---------------------------------------------------------
    def has_rank(self, rank: int) -> bool:
        return rank in self._flat

    def coords(self, rank: int) -> tuple[int, ...] | None:
        """``rank``'s index on each mesh axis, or None when it is not on this placement."""
        return self._coords.get(rank)

    def group(self, rank: int, axis: int) -> tuple[int, ...]:
        """The ranks that share ``rank``'s coordinates on every mesh axis but ``axis``
        (asked by every boxing step: made once per rank and axis)."""
        g = self._groups.get((rank, axis))
        if g is None:
            c = self.coords(rank)
            assert c is not None, f"rank {rank} is not on {self}"
            index = tuple(slice(None) if a == axis else c[a] for a in range(self.ndim))
            g = self._groups[(rank, axis)] = tuple(int(r) for r in self._ranks[index].flat)
        return g

    # ---- value semantics ----------------------------------------------------------------
    def __eq__(self, other) -> bool:
        return isinstance(other, placement) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f'tessera.placement(type="{self._type}", ranks={self._ranks.tolist()})'

    def __reduce__(self):
        return (placement, (self._type, self._ranks.tolist()))
