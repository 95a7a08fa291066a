"""``ShapeProp``: run a ``GraphModule`` on example inputs and record each node's tensor
metadata (``node.meta["tensor_meta"]``: shape, dtype, ...) and result type.

>>> import tessera
>>> from tessera.fx import symbolic_trace
>>> from tessera.fx.passes.shape_prop import ShapeProp
>>> gm = symbolic_trace(lambda x: tessera.cat([x, x], 1))
>>> _ = ShapeProp(gm).propagate(tessera.ones(2, 3))
>>> [(n.name, tuple(n.meta["tensor_meta"].shape)) for n in gm.graph.nodes if n.op != "output"]
[('x', (2, 3)), ('cat', (2, 6))]
"""
from __future__ import annotations

from typing import Any, NamedTuple

from tessera._dtype import dtype as Dtype
from tessera._tensor import Size, Tensor
from tessera.fx.interpreter import Interpreter
from tessera.fx.node import Node, map_aggregate

__all__ = ["TensorMetadata", "ShapeProp"]


class TensorMetadata(NamedTuple):
    """What ``ShapeProp`` records of a tensor (PyTorch's fields; tessera has dense
    row-major tensors only, so ``memory_format`` is None and nothing is quantized)."""

    shape: Size
    dtype: Dtype
    requires_grad: bool
    stride: tuple[int, ...]
    memory_format: Any | None
    is_quantized: bool
    qparams: dict[str, Any]


def _extract_tensor_metadata(t: Tensor) -> TensorMetadata:
    return TensorMetadata(t.shape, t.dtype, t.requires_grad, tuple(t.stride()), None, False,
                          {})


class ShapeProp(Interpreter):
    """An Interpreter that annotates every node with ``meta["tensor_meta"]`` (for nodes
    producing tensors, in the structure of their result) and ``meta["type"]``."""

    def run_node(self, n: Node) -> Any:
        try:
            result = super().run_node(n)
        except Exception as e:
            raise RuntimeError(f"ShapeProp error for: node={n.format_node()} with "
                               f"meta={n.meta}") from e
        found = []

        def extract(obj: Any) -> Any:
            if isinstance(obj, Tensor):
                found.append(True)
                return _extract_tensor_metadata(obj)
            return obj
        meta = map_aggregate(result, extract)
        if found:
            n.meta["tensor_meta"] = meta
        n.meta["type"] = type(result)
        return result

    def propagate(self, *args: Any) -> Any:
        """Run the module on ``args``, recording shapes; returns its result."""
        return super().run(*args)
