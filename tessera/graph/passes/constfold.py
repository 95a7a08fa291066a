"""Constant folding: a node whose tensor inputs are all known at compile time is run once,
now, through its op's own kernel (``dispatch``, as the interpreter does), and its result
becomes a new variable ``_folded.N`` whose value is recorded in ``ctx.values``.

Known at compile time are the results of creation ops (no tensor inputs: ``full``,
``arange``, ``eye``...; never random ones, see ``cse.is_impure``) and, in inference graphs
only, the variables the graph does not assign (in a training graph the weights change
every step). Only the frontier becomes a variable: a chain ``exp(arange())`` folds into one
variable holding the final result, not one per step. A result larger than ``LIMIT`` bytes
that is also larger than the folded intermediates it replaces is not folded (folding
``expand`` would turn a small constant into a big array held for the graph's lifetime; a
weight stays alive in its model, so folding ``w * 2`` of a big ``w`` would double it), and
views of variables are not folded (free at run time, a copy once folded).

>>> from tessera.graph.ir import Graph
>>> from tessera.graph.passes import PassContext
>>> g = Graph.parse('''graph(%x: float32[3]) {
...   %0: float32[3] = arange() {start=0, end=3, step=1, dtype=float32, device=device('cpu')}
...   %1: float32[3] = exp(%0)
...   %2: float32[3] = add(%x, %1) {alpha=1}
...   return (%2)
... }''')
>>> ctx = PassContext(training=False, values={})
>>> run(g, ctx), [n.op.name for n in g.nodes], ctx.values["_folded.0"].tolist()[0]
(True, ['arange', 'exp', 'add'], 1.0)
"""
from __future__ import annotations

import numpy as np

from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.graph.ir import Graph, Value
from tessera.graph.passes.cse import is_impure

__all__ = ["run", "LIMIT", "new_variable", "known_variables"]

LIMIT = 1 << 20  # bytes; a bigger result folds only if it is no bigger than its inputs


def new_variable(g: Graph, ctx, tensor: Tensor, prefix: str = "_folded") -> Value:
    """A fresh variable ``<prefix>.N`` of ``g`` holding ``tensor`` (recorded in
    ``ctx.values``, where the executor reads it)."""
    k = 0
    while f"{prefix}.{k}" in g.variables or f"{prefix}.{k}" in ctx.values:
        k += 1
    name = f"{prefix}.{k}"
    ctx.values[name] = tensor
    return g.add_variable(name, tuple(tensor.shape), tensor.dtype)


def known_variables(g: Graph, ctx) -> dict[int, Tensor]:
    """id(variable Value) -> value, for the variables whose value is fixed for the graph's
    lifetime: none in a training graph; in inference, those it does not assign."""
    if ctx is None or ctx.training or not ctx.values:
        return {}
    assigned = {name for name, _ in g.assigns}
    return {id(v): ctx.values[name] for name, v in g.variables.items()
            if name not in assigned and isinstance(ctx.values.get(name), Tensor)
            and ctx.values[name]._data is not None}


def _random(n) -> bool:
    """Whether the node draws random numbers. ``cse.is_impure`` goes by name and misses
    in-place samplers (``normal_``) and ``poisson``; a generator or seed attribute tells."""
    return is_impure(n.op.name) or is_impure(n.op.name.rstrip("_")) or \
        "generator" in n.attrs or "seed" in n.attrs


def _own(t: Tensor, arrays: list) -> Tensor:
    """``t`` as a C-contiguous tensor sharing no memory with ``arrays``."""
    a = t._to_numpy()
    if a.flags.c_contiguous and not any(np.may_share_memory(a, b) for b in arrays):
        return t.detach()
    return Tensor._from_numpy(np.array(a, order="C", copy=True), t._device)


def _evaluate(n, env: dict[int, Tensor]):
    """The node's outputs as tensors, or None when it cannot (or should not) fold."""
    ins = n.tensor_inputs
    if n.op.aliasing == "view" and any(v.kind == "var" for v in ins):
        return None  # a view of a weight is free at run time; a folded copy is not
    # the model keeps its variables alive anyway: only folded intermediates are replaced
    freed = sum(v.nbytes for v in ins if v.kind != "var")
    if any(v.nbytes > max(LIMIT, freed) or any(s < 0 for s in v.shape) for v in n.outputs):
        return None
    # values are contiguous in the graph's semantics (the executor copies where a view
    # cannot be made), so a view of a folded transpose is run on a contiguous copy
    args = [env[id(a)].contiguous() if isinstance(a, Value) else a for a in n.inputs]
    try:
        with no_grad():
            out = dispatch(n.op, *args, **n.attrs)
    except Exception:  # noqa: BLE001 - a node that fails now fails at run time: leave it
        return None
    outs = out if isinstance(out, tuple) else (out,)
    if len(outs) != len(n.outputs) or any(o._data is None for o in outs):
        return None  # e.g. a creation op on the meta device
    # own copies: a folded value must not alias (and so follow) a model's parameter
    arrays = [a._to_numpy() for a in args if isinstance(a, Tensor)]
    owned = [_own(o, arrays) for o in outs]
    for v, o in zip(n.outputs, owned):
        if tuple(o.shape) != v.shape or o.dtype is not v.dtype:
            return None  # the IR's types are the contract; never change them silently
    return owned


def run(g: Graph, ctx) -> bool:
    if ctx is None or ctx.values is None:
        return False  # nowhere to keep folded values
    env = known_variables(g, ctx)
    folded: set[int] = set()   # ids of Values computed here
    for n in g.nodes:
        if _random(n) or n.op.dynamic_shape:
            continue
        if not all(id(v) in env for v in n.tensor_inputs):
            continue
        outs = _evaluate(n, env)
        if outs is None:
            continue
        for v, o in zip(n.outputs, outs):
            env[id(v)] = o
            folded.add(id(v))
    if not folded:
        return False
    # the frontier: folded values read by a node that stays, or returned/assigned
    frontier: dict[int, Value] = {}
    for n in g.nodes:
        if any(id(v) in folded for v in n.outputs):
            continue
        for v in n.tensor_inputs:
            if id(v) in folded:
                frontier.setdefault(id(v), v)
    for v in g.live_roots():
        if id(v) in folded:
            frontier.setdefault(id(v), v)
    for v in frontier.values():
        g.replace_uses(v, new_variable(g, ctx, env[id(v)]))
    return bool(frontier)
