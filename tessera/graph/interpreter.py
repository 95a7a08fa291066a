"""The reference interpreter: run a graph node by node through ``dispatch`` (so through each
op's infer rule and kernel exactly as eager mode does). Slow and obviously right; the
compiled executor is tested against it.

>>> import tessera
>>> from tessera.graph.trace import trace
>>> g, _ = trace(lambda x: x * 2 + 1, tessera.ones(2))
>>> interpret(g, [tessera.tensor([1.0, 2.0])], {})[0]
[tensor([3., 5.])]
"""
from __future__ import annotations

from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.graph.ir import Graph, IRError, Value

__all__ = ["interpret"]


def interpret(g: Graph, inputs: list[Tensor], variables: dict[str, Tensor]):
    """Returns (outputs, [(variable name, new value)]) as tensors; writes nothing back."""
    if len(inputs) != len(g.inputs):
        raise IRError(f"graph takes {len(g.inputs)} inputs, got {len(inputs)}")
    env: dict[Value, Tensor] = dict(zip(g.inputs, inputs))
    for name, v in g.variables.items():
        if name not in variables:
            raise IRError(f"no value given for variable %{name}")
        env[v] = variables[name]
    with no_grad():
        for n in g.nodes:
            args = [env[a] if isinstance(a, Value) else a for a in n.inputs]
            if n.op.name == "view":  # traced tensors are contiguous; here they may not be
                out = args[0].reshape(n.attrs["shape"])
            else:
                out = dispatch(n.op, *args, **n.attrs)
            for v, o in zip(n.outputs, out if isinstance(out, tuple) else (out,)):
                env[v] = o
    return [env[v] for v in g.outputs], [(name, env[v]) for name, v in g.assigns]
