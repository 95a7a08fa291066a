"""``fused``: a region of elementwise ops run as one op (the outline pass makes them).

Its ``body`` attribute is the region as a graph in the IR's text form, whose inputs are the
op's inputs, in order, and whose outputs are the op's outputs: the region's result first,
then every other value of the region that is used outside it (a value autograd saves for
the backward, a second result; *multi-output fusion*). The CPU kernel here is the
reference: it runs the body's nodes with their own NumPy kernels. ``tessera.codegen``
compiles the same body to one C loop; the two are tested against each other.

>>> import tessera
>>> from tessera._dispatch import dispatch
>>> from tessera.ops.registry import REGISTRY
>>> body = '''graph(%a: float32[2]) {
...   %0: float32[2] = exp(%a)
...   %1: float32[2] = neg(%0)
...   return (%1)
... }'''
>>> dispatch(REGISTRY["fused"], tessera.zeros(2), body=body)
tensor([-1., -1.])
"""
from __future__ import annotations

import functools

import numpy as np

from tessera.graph.executor import Executor
from tessera.graph.ir import Graph, Value
from tessera.ops import cost
from tessera.ops.registry import Meta, defop

__all__: list[str] = []  # no public function: graphs make fused nodes


@functools.lru_cache(maxsize=4096)
def body_graph(text: str):
    """The body graph of a fused node (parsed once per distinct text)."""
    g = Graph.parse(text)
    if not g.outputs or g.variables or g.assigns:
        raise ValueError("fused: the body must have outputs and no variables")
    return g


@functools.lru_cache(maxsize=4096)
def _reference(text: str):
    return Executor(body_graph(text), plan=False)  # results must not share an arena


def _infer(*metas, body: str):
    g = body_graph(body)
    if len(metas) != len(g.inputs):
        raise ValueError(f"fused: the body takes {len(g.inputs)} inputs, got {len(metas)}")
    for i, (m, v) in enumerate(zip(metas, g.inputs)):
        if type(m) is not Meta or tuple(m.shape) != v.shape or m.dtype is not v.dtype:
            got = f"{m.dtype.name}{list(m.shape)}" if type(m) is Meta else type(m).__name__
            raise ValueError(f"fused: input {i} must be {v.type_str()}, got {got}")
    metas = tuple(Meta(v.shape, v.dtype) for v in g.outputs)
    return metas if len(metas) > 1 else metas[0]


def _kernel(*arrays, body: str):
    outs = _reference(body).run(list(arrays), {})[0]
    return tuple(outs) if len(outs) > 1 else outs[0]


def _into(out, *arrays, body: str):
    """``out``: the output array, or a tuple of them for a body with several outputs."""
    res = _kernel(*arrays, body=body)
    if type(out) is tuple:
        for o, r in zip(out, res):
            np.copyto(o, r)
    else:
        np.copyto(out, res)


def _cost(ins, outs, body: str) -> cost.Cost:
    """The body's operations (each node's own cost rule), reading the region's inputs once
    and writing its outputs: the other intermediates stay in registers."""
    flops = 0
    for n in body_graph(body).nodes:
        metas = [Meta(v.shape, v.dtype) if isinstance(v, Value) else v for v in n.inputs]
        flops += cost.cost_of(n.op, *metas, **n.attrs).flops
    return cost.Cost(flops, *cost.io(ins, outs))


FUSED = defop("fused", _infer, _kernel, inplace_kernels={"cpu": _into}, cost=_cost,
              doc="A fused region of elementwise ops (see tessera.codegen.passes.outline).")
