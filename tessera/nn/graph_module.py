"""Module settings inside an ``nn.Graph``: ``GraphModule`` and the ``ProxyModule`` the graph
holds for each module assigned to it.

OneFlow's API: a module assigned to an ``nn.Graph`` is wrapped in a ``ProxyModule``, which
calls and reads through to the module and adds ``to(GraphModule)`` / ``config``: its
settings in this graph. ``self.stage0.to(GraphModule).set_stage(stage_id=0,
placement=P0)`` (or the older ``self.stage0.config.set_stage(...)``) puts the module on a
pipeline stage: while ``build()`` is traced, the inputs of its calls move to the stage's
placement (``GraphModule.to_stage``), and the pass pipeline orders each rank's program by
the stages (``schedule_1f1b``, provided by ``tessera.parallel.pipeline``).

>>> import tessera
>>> from tessera import nn
>>> from tessera.nn.graph import GraphModule
>>> class G(nn.Graph):
...     def __init__(self):
...         super().__init__()
...         self.stage0 = nn.Linear(2, 2)
...         self.stage0.to(GraphModule).set_stage(stage_id=0,
...                                               placement=tessera.placement("cpu", [0]))
...     def build(self, x):
...         return self.stage0(x)
>>> G().stage0.config.stage_id
0
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tessera._tensor import Tensor
from tessera.nn.modules.module import Module

if TYPE_CHECKING:
    from tessera.distributed.placement import placement as Placement

__all__ = ["GraphModule", "ProxyModule"]


class GraphModule:
    """A module's settings inside an ``nn.Graph`` (OneFlow's ``GraphModule``): its
    pipeline stage. Reached by ``graph.module.to(GraphModule)`` or ``graph.module.config``."""

    def __init__(self, module: Module):
        self.module = module
        self.stage_id: int | None = None
        self.placement: Placement | None = None

    def set_stage(self, stage_id: int | None = None, placement=None) -> GraphModule:
        """Put the module on pipeline stage ``stage_id`` running on ``placement``."""
        from tessera.distributed.placement import placement as Placement
        if stage_id is not None and (not isinstance(stage_id, int) or stage_id < 0):
            raise ValueError(f"set_stage: stage_id must be a non-negative int, got "
                             f"{stage_id!r} ({type(self.module).__name__})")
        if placement is not None and not isinstance(placement, Placement):
            raise TypeError(f"set_stage: placement must be a tessera.placement, got "
                            f"{placement!r} ({type(self.module).__name__})")
        self.stage_id, self.placement = stage_id, placement
        return self

    def to_stage(self, x):
        """``x`` moved onto this stage's placement (its SBP kept where the mesh allows)."""
        if self.placement is None or not isinstance(x, Tensor):
            return x
        if x._device.type != "global":
            raise TypeError(f"pipeline stage {self.stage_id} ({type(self.module).__name__}, "
                            f"{self.placement}) got a local tensor of shape {list(x.shape)}; "
                            "a pipeline's inputs must be global tensors (x.to_global(...))")
        d = x._data
        if d.placement == self.placement:
            return x
        from tessera.sbp import broadcast
        sbp = None if d.placement.ndim == self.placement.ndim else \
            (broadcast,) * self.placement.ndim
        return x.to_global(placement=self.placement, sbp=sbp)

    def __repr__(self) -> str:
        return f"GraphModule({type(self.module).__name__}, stage_id={self.stage_id}, " \
               f"placement={self.placement})"


class ProxyModule:
    """What ``nn.Graph`` holds for an assigned module: it calls and reads through to the
    module (``.origin``), and adds ``to(GraphModule)`` / ``config`` for graph settings."""

    __slots__ = ("_origin", "_settings")

    def __init__(self, module: Module, settings: dict):
        object.__setattr__(self, "_origin", module)
        object.__setattr__(self, "_settings", settings)  # id(module) -> GraphModule

    @property
    def origin(self) -> Module:
        return self._origin

    @property
    def config(self) -> GraphModule:
        m = self._origin
        gm = self._settings.get(id(m))
        if gm is None:
            gm = self._settings[id(m)] = GraphModule(m)
        return gm

    def to(self, *args, **kwargs):
        if len(args) == 1 and args[0] is GraphModule and not kwargs:
            return self.config
        self._origin.to(*args, **kwargs)
        return self

    def __call__(self, *args, **kwargs):
        return self._origin(*args, **kwargs)

    def _wrap(self, v):
        return ProxyModule(v, self._settings) if isinstance(v, Module) else v

    def __getattr__(self, name):
        return self._wrap(getattr(self._origin, name))

    def __setattr__(self, name, value):
        setattr(self._origin, name, value)

    def __getitem__(self, i):
        return self._wrap(self._origin[i])

    def __iter__(self):
        return (self._wrap(m) for m in self._origin)

    def __len__(self) -> int:
        return len(self._origin)

    def __repr__(self) -> str:
        return f"ProxyModule({self._origin!r})"
