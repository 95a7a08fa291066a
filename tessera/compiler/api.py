"""How a backend compiles one graph, and ``tessera.compile`` (``torch.compile``'s shape).

>>> import tessera
>>> f = compile(tessera.nn.Linear(3, 2), backend="xla")
>>> f(tessera.ones(4, 3)).shape
tessera.Size([4, 2])
"""
from __future__ import annotations

from tessera.compiler import partition
from tessera.graph.ir import Graph
from tessera.nn.graph import Graph as NNGraph
from tessera.nn.modules.module import Module

__all__ = ["compile", "make_backend"]

_RULE = {"xla": "to_jax", "tvm": "to_relax"}


def _backend(name: str):
    if name == "xla":
        from tessera.compiler import xla
        return xla
    from tessera.compiler import tvm
    return tvm


def make_backend(name: str):
    """``make(ir, tensors, options)`` for ``nn.graph.register_backend``: the whole graph on
    the backend when it covers every node, else the cut."""
    def make(ir: Graph, tensors: dict, options: dict):
        mod = _backend(name)
        options = dict(options)
        strict = options.pop("strict", False)
        missing = [n for n in ir.nodes if not mod.supported(n)]
        if missing and strict:
            raise partition.unsupported_error(name, _RULE[name], missing)
        if not missing:
            return mod.whole_graph(ir, tensors, **options)
        return partition.Partitioned(ir, name, mod.supported,
                                     lambda sub: mod.compile_graph(sub, **options))
    return make


class _Compiled:
    """A module traced through ``nn.Graph`` on first call and retraced on new shapes (the
    graph's cache keys by input signature)."""

    def __init__(self, model: Module, backend: str, options: dict):
        self.model = model

        class _Forward(NNGraph):
            def __init__(self):
                super().__init__()
                self.model = model

            def build(self, *args):
                return self.model(*args)
        self.graph = _Forward()
        if backend != "tessera":
            self.graph.config.set_backend(backend, **options)

    def __call__(self, *args):
        return self.graph(*args)


def compile(model: Module, *, backend: str = "tessera", **options):
    """``model`` as a callable that runs through ``nn.Graph`` compiled by ``backend``
    ("tessera", "xla", "tvm"; ``options`` as ``config.set_backend``'s). The first call
    traces and compiles; a call with new input shapes, dtypes or train/eval mode retraces.
    Inference only: a training step with an optimizer is an ``nn.Graph`` with
    ``add_optimizer``.

    >>> import tessera
    >>> f = compile(tessera.nn.ReLU())
    >>> f(tessera.tensor([-1.0, 2.0]))
    tensor([0., 2.])
    """
    if not isinstance(model, Module):
        raise TypeError(f"tessera.compile: expected an nn.Module, got {type(model).__name__}")
    if backend not in ("tessera", *_RULE):
        raise ValueError(f"tessera.compile: unknown backend {backend!r} (known: tessera, "
                         f"{', '.join(sorted(_RULE))})")
    return _Compiled(model, backend, options)
