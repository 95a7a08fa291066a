"""The XLA backend: a graph after tessera's passes, as one function under ``jax.jit``.

Each node runs its op's ``to_jax`` rule (``tessera.ops._jax``) on the values before it; a
fused region (the outline pass's ``fused`` node) is lowered through its body graph. Inputs
are cast to the compute type tessera's kernel would use and results to the dtypes ``infer``
gave, so the function computes what the executor computes. JAX runs in 64-bit mode here
(tessera's int64 indices, float64 optimizer scalars) without changing the process-wide
setting. A training step keeps parameters and optimizer state on XLA's side between steps
and passes them as donated buffers, so the update happens in place; tessera's tensors get
the new values after each step (and a tensor changed meanwhile is read again).

>>> import tessera
>>> from tessera.graph.trace import trace
>>> g, _ = trace(lambda x: (x * 2).exp(), tessera.zeros(2))
>>> supported(g.nodes[0])
True
"""
from __future__ import annotations

import functools
import os

import numpy as np

from tessera.compiler.partition import BackendStats
from tessera.graph.executor import compile_kernel
from tessera.graph.fused import body_graph
from tessera.graph.ir import Graph, Node, Value
from tessera.ops.registry import MissingRule

__all__ = ["supported", "lower", "compile_graph", "whole_graph", "XlaStep"]


@functools.lru_cache(maxsize=1)
def _modules():
    try:
        import jax
        import jax.numpy as jnp
        from jax import lax
    except ImportError as e:
        raise ImportError("the XLA backend needs JAX: pip install 'tessera[xla]'") from e
    return jax, jnp, lax


# XLA's CPU compiler (jax 0.10) hands reductions to YNNPACK fused with the library calls
# around them: VGG-11's pooling before its 25088-wide product then ran about 90 times slower
# than with the products and convolutions alone handed over (a 32x32 batch: 13 s, not 0.14;
# tests/compiler/test_models.py's vgg11_bn on xla). A user's own XLA_FLAGS setting wins.
_YNN_OPTION = "xla_cpu_experimental_ynn_fusion_type"
_YNN_TYPES = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"


@functools.lru_cache(maxsize=1)
def _compiler_options() -> dict:
    """The options every ``jax.jit`` of this backend compiles with: YNNPACK's fusions
    without reductions, where this JAX knows the option (probed once: older versions
    reject it) and ``XLA_FLAGS`` does not set it."""
    if _YNN_OPTION in os.environ.get("XLA_FLAGS", ""):
        return {}
    jax, jnp, _ = _modules()
    options = {_YNN_OPTION: _YNN_TYPES}
    try:
        jax.jit(lambda x: x.sum(), compiler_options=options)(jnp.ones(2, jnp.float32))
    except (TypeError, ValueError, RuntimeError):  # no such keyword, option or value
        return {}
    return options


def _jit(fn, **kw):
    """``jax.jit(fn, **kw)`` with the backend's compiler options."""
    jax, _, _ = _modules()
    options = _compiler_options()
    return jax.jit(fn, **kw, **({"compiler_options": options} if options else {}))


def _has_rule(n: Node) -> bool:
    if n.op.name == "fused":
        return all(_has_rule(m) for m in body_graph(n.attrs["body"]).nodes)
    return n.op.to_jax is not None and "seed" not in n.attrs


_PROBED: dict = {}


def supported(n: Node) -> bool:
    """Whether the XLA backend lowers ``n``: its op (every op of a fused body) has a
    ``to_jax`` rule, and the rule accepts these attrs (abstract evaluation, no compute; a
    rule may decline a case with ``NotImplementedError``)."""
    if not _has_rule(n):
        return False
    key = (n.op.name, repr(sorted(n.attrs.items())),
           tuple((v.shape, v.dtype.name) if isinstance(v, Value) else repr(v)
                 for v in n.inputs))
    if key not in _PROBED:
        jax, jnp, lax = _modules()
        specs = [jax.ShapeDtypeStruct(v.shape, v.dtype.np) for v in n.inputs
                 if isinstance(v, Value)]

        def one(*arrays):
            it = iter(arrays)
            args = [next(it) if isinstance(v, Value) else v for v in n.inputs]
            return lower_node(n, args, jnp, lax)
        try:
            with jax.enable_x64(True):
                jax.eval_shape(one, *specs)
            _PROBED[key] = True
        except NotImplementedError:
            _PROBED[key] = False
    return _PROBED[key]


def lower_node(n: Node, args: list, jnp, lax) -> tuple:
    """The node's outputs as JAX arrays, from its inputs' (constants passed as they are)."""
    if n.op.name == "fused":
        body = body_graph(n.attrs["body"])
        env = dict(zip(body.inputs, args))
        run_nodes(body.nodes, env, jnp, lax)
        outs: tuple = tuple(env[v] for v in body.outputs)
    else:
        rule = n.op.to_jax
        if rule is None:
            raise MissingRule(n.op.name, "to_jax")
        _, casts = compile_kernel(n)
        args = [a if c is None or a is None else jnp.asarray(a).astype(c)
                for a, c in zip(args, casts)]
        res = rule(jnp, lax, args, n.attrs)
        outs = tuple(res) if isinstance(res, (tuple, list)) else (res,)
    if len(outs) != len(n.outputs):
        raise ValueError(f"{n.op.name} ({n.name or 'graph'}): its to_jax rule gave "
                         f"{len(outs)} outputs, the op has {len(n.outputs)}")
    res_out = []
    for o, v in zip(outs, n.outputs):
        o = jnp.asarray(o)
        if o.dtype != v.dtype.np:
            o = o.astype(v.dtype.np)
        if tuple(o.shape) != v.shape:
            raise ValueError(f"{n.op.name} ({n.name or 'graph'}): its to_jax rule gave shape "
                             f"{tuple(o.shape)}, infer says {v.shape}")
        res_out.append(o)
    return tuple(res_out)


def run_nodes(nodes: list, env: dict, jnp, lax) -> None:
    for n in nodes:
        args = [env[v] if isinstance(v, Value) else v for v in n.inputs]
        for v, o in zip(n.outputs, lower_node(n, args, jnp, lax)):
            env[v] = o


def lower(g: Graph):
    """``fn(inputs, variables) -> (outputs, new values of the assigned variables)`` in JAX
    (lists of arrays, variables in ``g.variables``' order)."""
    names = list(g.variables)

    def fn(inputs, variables):
        _, jnp, lax = _modules()
        env: dict = dict(zip(g.inputs, inputs))
        env.update((g.variables[k], a) for k, a in zip(names, variables))
        run_nodes(g.nodes, env, jnp, lax)
        return [env[v] for v in g.outputs], [env[v] for _, v in g.assigns]
    return fn


def compile_graph(g: Graph):
    """A segment's function: ``fn(input arrays) -> output arrays`` (NumPy in and out)."""
    jax, _, _ = _modules()
    with jax.enable_x64(True):
        jitted = _jit(lambda ins: lower(g)(ins, [])[0])

    def run(arrays):
        with jax.enable_x64(True):
            return [np.asarray(o) for o in jitted(arrays)]
    return run


class XlaStep(BackendStats):
    """A whole graph on XLA, with the executor's ``run``, ``profile`` and ``memory_stats``.
    Variables live on XLA's side between steps; those the step assigns are donated to it."""

    def __init__(self, g: Graph, tensors: dict):
        jax, _, _ = _modules()
        self.graph, self.tensors, self.backend = g, tensors, "xla"
        self.names = list(g.variables)
        assigned = {k for k, _ in g.assigns}
        self.donated = [k for k in self.names if k in assigned]
        self.kept = [k for k in self.names if k not in assigned]
        fn = lower(g)
        order = self.donated + self.kept
        pos = {k: i for i, k in enumerate(order)}

        def step(inputs, donated, kept):
            vs = list(donated) + list(kept)
            return fn(inputs, [vs[pos[k]] for k in self.names])
        with jax.enable_x64(True):
            self.jitted = _jit(step, donate_argnums=(1,))
        self.resident: dict = {}  # name -> (device array, (id of the tensor's array, version))

    def describe(self) -> str:
        return f"backend xla: the whole graph ({len(self.graph.nodes)} ops) in one cluster"

    def _timed(self) -> list[tuple[object, str]]:
        return [(self, "jitted")]

    def _device(self, name: str, array):
        jax, _, _ = _modules()
        t = self.tensors.get(name)
        key = None if t is None else (id(t._data), t._version[0])
        held = self.resident.get(name)
        if held is not None and key is not None and held[1] == key and not held[0].is_deleted():
            return held[0]
        return jax.device_put(array)

    def run(self, inputs: list, variables: dict):
        jax, _, _ = _modules()
        with jax.enable_x64(True):
            donated = [self._device(k, variables[k]) for k in self.donated]
            kept = [self._device(k, variables[k]) for k in self.kept]
            outs, new = self.jitted(list(inputs), donated, kept)
        for k, a in zip(self.kept, kept):
            t = self.tensors.get(k)
            if t is not None:
                self.resident[k] = (a, (id(t._data), t._version[0]))
        assigns = []
        for (k, _), a in zip(self.graph.assigns, new):
            t = self.tensors.get(k)
            if t is not None:  # nn.Graph writes the value back and bumps the version once
                self.resident[k] = (a, (id(t._data), t._version[0] + 1))
            assigns.append((k, np.asarray(a)))
        return [np.array(o) for o in outs], assigns


def whole_graph(g: Graph, tensors: dict) -> XlaStep:
    """The backend's form for a graph it covers whole."""
    return XlaStep(g, tensors)
