"""The IR verifier: SSA (each value defined once, before its uses), no dangling uses, and
every node's output types equal to what its op's ``infer`` rule says.

Runs after every pass when ``TESSERA_DEBUG=1`` (see ``tessera.graph.passes.run_pipeline``).

>>> from tessera.graph.ir import Graph
>>> Graph.parse("graph(%x: float32[2]) {\\n return (%x)\\n}").verify()
"""
from __future__ import annotations

from tessera.graph.ir import Graph, IRError, Value
from tessera.ops.registry import Meta

__all__ = ["verify"]


def _meta(v):
    return Meta(v.shape, v.dtype) if isinstance(v, Value) else v


def verify(g: Graph) -> None:
    defined: set[int] = set()
    names: set[str] = set()

    def define(v: Value, where: str) -> None:
        if id(v) in defined:
            raise IRError(f"{where}: value %{v.name} is defined twice")
        if v.name in names:
            raise IRError(f"{where}: the name %{v.name} is used by two values")
        defined.add(id(v))
        names.add(v.name)

    for v in g.inputs:
        define(v, "inputs")
    for name, v in g.variables.items():
        if v.name != name or v.kind != "var":
            raise IRError(f"variable '{name}' is recorded as %{v.name} ({v.kind})")
        define(v, "variables")
    for n in g.nodes:
        where = f"{n.op.name} ({n.name or 'unnamed'})"
        for v in n.inputs:
            if isinstance(v, Value) and id(v) not in defined:
                raise IRError(f"{where}: uses %{v.name} before it is defined")
        try:
            out = n.op.infer(*[_meta(v) for v in n.inputs], **n.attrs)
        except Exception as e:  # noqa: BLE001 - any infer failure is a malformed node
            raise IRError(f"{where}: its op rejects the inputs: {e}") from None
        outs = out if type(out) is tuple else (out,)
        if len(outs) != len(n.outputs):
            raise IRError(f"{where}: has {len(n.outputs)} outputs, its op gives {len(outs)}")
        for v, m in zip(n.outputs, outs):
            if v.producer is not n:
                raise IRError(f"{where}: output %{v.name} does not point back to its node")
            dynamic = any(s == -1 for s in m.shape)
            if (tuple(m.shape) != v.shape and not dynamic) or m.dtype is not v.dtype:
                raise IRError(f"{where}: %{v.name} is {v.type_str()} but infer gives "
                              f"{m.dtype.name}{list(m.shape)}")
            define(v, where)
    for v in g.outputs:
        if not isinstance(v, Value) or id(v) not in defined:
            raise IRError(f"return: %{getattr(v, 'name', v)} is not defined")
    for name, v in g.assigns:
        if name not in g.variables:
            raise IRError(f"assign to unknown variable %{name}")
        var = g.variables[name]
        if id(v) not in defined:
            raise IRError(f"assign %{name}: value %{v.name} is not defined")
        if v.shape != var.shape or v.dtype is not var.dtype:
            raise IRError(f"assign %{name}: {v.type_str()} does not match the variable's "
                          f"{var.type_str()}")
