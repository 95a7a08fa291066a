"""Graph passes, one per module, run in the order of ``PIPELINE``.

Each pass is ``run(graph, ctx) -> bool`` (whether it changed the graph) and mutates the
graph in place. With ``TESSERA_DEBUG=1`` the verifier runs after every pass.

>>> from tessera.graph.passes import PIPELINE
>>> PIPELINE[0]
'dce'
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from tessera.graph import backend
from tessera.graph.ir import Graph

__all__ = ["PIPELINE", "PassContext", "run_pipeline", "get_pass"]

# the default order; a pass module tessera/graph/passes/<name>.py defines run(graph, ctx)
# (decompose and outline belong to the code generator: tessera/codegen/passes/)
PIPELINE = ["dce", "algebraic", "dce", "cse", "constfold", "bnfold", "dce", "decompose", "cse",
            "layout", "duplicate", "fuse", "outline"]


@dataclass
class PassContext:
    """What passes may know beyond the graph: whether it trains (then weights change every
    step, so folding them is not allowed), and the variables' current values."""

    training: bool = False
    values: dict | None = None   # variable name -> Tensor (read by folding passes)
    codegen: bool = False        # the executor will generate C (decompose, outline need it)


def get_pass(name: str):
    """The pass ``name``: a module of this package, or one the code generator registered
    (``tessera.graph.backend``)."""
    return backend.codegen_pass(name) or importlib.import_module(f"tessera.graph.passes.{name}").run


def run_pipeline(g: Graph, names=None, training: bool = False, values=None,
                 codegen: bool | None = None) -> list[str]:
    """Run the passes ``names`` (default ``PIPELINE``); returns those that changed g.
    ``codegen`` (default: whether the registered code generator is on) turns on the passes
    that prepare regions for generated kernels."""
    if codegen is None:
        codegen = backend.enabled()
    ctx = PassContext(training, values, codegen)
    debug = os.environ.get("TESSERA_DEBUG", "0") not in ("", "0")
    changed = []
    for name in (PIPELINE if names is None else names):
        if get_pass(name)(g, ctx):
            changed.append(name)
        if debug:
            g.verify()
    return changed
