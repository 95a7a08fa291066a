"""The graph IR: an SSA ``Graph`` of ``Node``s over ``Value``s, with a text form.

A ``Value`` is produced once (by a node, or as a graph input or a variable) and never
changes. Persistent state (parameters, buffers, optimizer state) enters as named
*variables*; a step that updates them ends in ``assigns`` (variable name <- new value),
which the executor writes back after the step. Node names follow module paths
(``model.fc1``), so a printed graph reads like the model.

>>> import tessera
>>> from tessera.graph.ir import Graph
>>> g = Graph()
>>> x = g.add_input("x", (2, 3), tessera.float32)
>>> y = g.add_node("relu", [x], {}, [((2, 3), tessera.float32)], name="act")[0]
>>> g.outputs.append(y)
>>> print(g)
graph(%x: float32[2, 3]) {
  %0: float32[2, 3] = relu(%x)  # act
  return (%0)
}
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tessera import _dtype as D
from tessera.ops.registry import REGISTRY, OpDef

__all__ = ["Value", "Node", "Graph", "IRError"]


class IRError(ValueError):
    """A malformed graph (the verifier's finding) or unparsable IR text."""


class Value:
    """One SSA value: a tensor's shape and dtype, and who produced it."""

    __slots__ = ("name", "shape", "dtype", "producer", "index", "kind")

    def __init__(self, name: str, shape: tuple, dtype: D.dtype, producer=None, index: int = 0,
                 kind: str = "node"):
        self.name = name
        self.shape = tuple(shape)
        self.dtype = dtype
        self.producer = producer    # the Node, or None for inputs and variables
        self.index = index          # which output of the producer
        self.kind = kind            # "node" | "input" | "var"

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def type_str(self) -> str:
        return f"{self.dtype.name}[{', '.join(map(str, self.shape))}]"

    def __repr__(self) -> str:
        return f"%{self.name}"


@dataclass(eq=False)
class Node:
    """``outputs = op(*inputs, **attrs)``. Inputs are Values or constants (Python numbers,
    None); ``name`` is the module path the op was called from."""

    op: OpDef
    inputs: list
    attrs: dict
    outputs: list
    name: str = ""
    # pass annotations that do not change what the node computes, e.g. {"region": 3}
    # (fusion group) or {"inplace": 0} (the output may take input 0's buffer)
    notes: dict = field(default_factory=dict)

    @property
    def tensor_inputs(self) -> list[Value]:
        return [v for v in self.inputs if isinstance(v, Value)]

    def __repr__(self) -> str:
        return f"Node({self.op.name}, {self.name or '-'})"


@dataclass(eq=False)
class Graph:
    """Inputs, variables, nodes in execution order, outputs, and variable updates."""

    inputs: list = field(default_factory=list)
    variables: dict = field(default_factory=dict)   # name -> Value (kind "var")
    nodes: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    assigns: list = field(default_factory=list)     # (variable name, Value)
    _count: int = 0

    # ---- building ------------------------------------------------------------------
    def fresh(self) -> str:
        self._count += 1
        return str(self._count - 1)

    def add_input(self, name: str, shape, dtype) -> Value:
        v = Value(name, shape, dtype, kind="input")
        self.inputs.append(v)
        return v

    def add_variable(self, name: str, shape, dtype) -> Value:
        if name in self.variables:
            raise IRError(f"variable '{name}' is defined twice")
        v = Value(name, shape, dtype, kind="var")
        self.variables[name] = v
        return v

    def add_node(self, op, inputs, attrs, out_types, name: str = "") -> list[Value]:
        op = REGISTRY[op] if isinstance(op, str) else op
        node = Node(op, list(inputs), dict(attrs), [], name)
        for i, (shape, dtype) in enumerate(out_types):
            node.outputs.append(Value(self.fresh(), shape, dtype, node, i))
        self.nodes.append(node)
        return node.outputs

    # ---- queries -------------------------------------------------------------------
    def users(self) -> dict[Value, list[Node]]:
        """Each value's consuming nodes (outputs and assigns are not nodes)."""
        out: dict[Value, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                if isinstance(v, Value):
                    out.setdefault(v, []).append(n)
        return out

    def live_roots(self) -> list[Value]:
        """Values the step must produce: outputs and assigned variable values."""
        return list(self.outputs) + [v for _, v in self.assigns]

    def replace_uses(self, old: Value, new) -> None:
        """Every use of ``old`` (by nodes, outputs, assigns) becomes ``new``."""
        for n in self.nodes:
            n.inputs = [new if v is old else v for v in n.inputs]
        self.outputs = [new if v is old else v for v in self.outputs]
        self.assigns = [(k, new if v is old else v) for k, v in self.assigns]

    # ---- text form -----------------------------------------------------------------
    def __str__(self) -> str:
        from tessera.graph.text import print_graph
        return print_graph(self)

    def __eq__(self, other) -> bool:
        return isinstance(other, Graph) and str(self) == str(other)

    __hash__ = None  # type: ignore[assignment]

    @staticmethod
    def parse(text: str) -> Graph:
        """The graph printed as ``text`` (``Graph.parse(str(g)) == g``)."""
        from tessera.graph.text import parse_graph
        return parse_graph(text)

    def verify(self) -> None:
        """Raise ``IRError`` unless the graph is well formed (see ``tessera.graph.verify``)."""
        from tessera.graph.verify import verify
        verify(self)
