"""Graph passes, one per module, run in the order of ``PIPELINE``.

Each pass is ``run(graph, ctx) -> bool`` (whether it changed the graph) and mutates the
graph in place. With ``TESSERA_DEBUG=1`` the verifier runs after every pass.

Most passes are modules of this package. The others belong to the layers above, which
register them when they are imported (an upper layer extends a lower one by
registration): ``decompose`` and ``outline`` prepare regions for the code generator
(``tessera.graph.backend``), ``schedule_1f1b`` and ``bucket_all_reduces`` are
``tessera.parallel``'s (``register_pass``). While its provider is not loaded, such a pass
does nothing where that is correct and fails where it is not (``_WITHOUT_PROVIDER``).

>>> from tessera.graph.passes import PIPELINE
>>> PIPELINE[0], PIPELINE[1], PIPELINE[-1]
('schedule_1f1b', 'dce', 'bucket_all_reduces')
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tessera.graph import backend as codegen_backend
from tessera.graph.ir import Graph

__all__ = ["PIPELINE", "PassContext", "run_pipeline", "get_pass", "register_pass"]

# the default order; a pass module tessera/graph/passes/<name>.py defines run(graph, ctx).
# schedule_1f1b orders a pipeline stage's program first (the other passes keep the order
# of what they do not remove); bucket_all_reduces runs after the passes that drop the
# clone autograd puts after each gradient hook (a reader of each all-reduce at once,
# which would leave nothing to merge); early_updates moves each state update (an optimizer
# step) to just after its inputs, so gradients die early; remat plans recomputation on the
# graph as it will run (a no-op unless nn.Graph.config.enable_remat set
# ``PassContext.remat``); qdq turns
# dequantize-compute-quantize groups into INT8 ops once constants are folded; conv_epilogue
# runs after it (a conv + relu before a quantization is qdq's) and before fuse (which would
# take the activation and residual add into an elementwise region); nchwc blocks the
# convolutional trunk of an inference graph after both (epilogues found, batch norms
# folded) and before fusion (which then fuses the elementwise ops left on blocked values)
PIPELINE = ["schedule_1f1b", "dce", "algebraic", "dce", "cse", "constfold", "bnfold", "qdq",
            "conv_epilogue", "dce", "nchwc", "dce", "decompose", "cse", "layout", "duplicate",
            "fuse", "outline", "early_updates", "remat", "bucket_all_reduces"]


@dataclass
class PassContext:
    """What passes may know beyond the graph: whether it trains (then weights change every
    step, so folding them is not allowed), the variables' current values, and how the
    step is spread over ranks."""

    training: bool = False
    values: dict | None = None   # variable name -> Tensor (read by folding passes)
    codegen: bool = False        # the executor will generate C (decompose, outline need it)
    stages: tuple = ()           # (stage id, placement) of each pipeline stage's module
    micro_batches: int = 1       # gradient accumulation steps of one call
    bucket_cap: int = 0          # bytes of one bucket of merged collectives (0: none)
    remat: Any = None            # passes.remat.RematConfig: the memory budget (None: off)
    backend: str = "tessera"     # who runs the graph (nn.Graph.config.set_backend): passes
                                 # making ops only tessera's executor runs check it


_REGISTERED: dict[str, Callable] = {}


def register_pass(name: str, run: Callable) -> None:
    """Make ``run(graph, ctx) -> bool`` the pass ``name`` (a layer above the graph's; a
    later registration replaces an earlier one).

    >>> register_pass("noop_example", lambda g, ctx: False); get_pass("noop_example")(None, None)
    False
    >>> del _REGISTERED["noop_example"]
    """
    _REGISTERED[name] = run


def _skip(g: Graph, ctx: PassContext) -> bool:
    return False


def _unscheduled(g: Graph, ctx: PassContext) -> bool:
    if ctx.stages and ctx.micro_batches > 1:
        raise RuntimeError("pass schedule_1f1b: the graph has pipeline stages, and the 1F1B "
                           "schedule is tessera.parallel's, which is not loaded")
    return False


# what a registered pass of PIPELINE does while its provider is not loaded: merging
# collectives changes no value; without pipeline stages there is nothing to schedule
# (the trace tags micro-batches only for them); without a code generator nothing is
# decomposed or outlined for it
_WITHOUT_PROVIDER = {"schedule_1f1b": _unscheduled, "bucket_all_reduces": _skip,
                     "decompose": _skip, "outline": _skip}


def get_pass(name: str):
    """The pass ``name``: one a layer above registered (``register_pass``: the code
    generator's, the parallel strategies'), or a module of this package."""
    run = _REGISTERED.get(name) or _WITHOUT_PROVIDER.get(name)
    return run or importlib.import_module(f"tessera.graph.passes.{name}").run


def run_pipeline(g: Graph, names=None, training: bool = False, values=None,
                 codegen: bool | None = None, stages: tuple = (), micro_batches: int = 1,
                 bucket_cap: int = 0, remat: Any = None,
                 backend: str = "tessera") -> list[str]:
    """Run the passes ``names`` (default ``PIPELINE``); returns those that changed g.
    ``codegen`` (default: whether the registered code generator is on) turns on the passes
    that prepare regions for generated kernels; ``stages``, ``micro_batches``,
    ``bucket_cap``, ``remat`` and ``backend`` are ``PassContext``'s."""
    if codegen is None:
        codegen = codegen_backend.enabled()
    ctx = PassContext(training, values, codegen, tuple(stages), micro_batches, bucket_cap,
                      remat, backend)
    debug = os.environ.get("TESSERA_DEBUG", "0") not in ("", "0")
    changed = []
    for name in (PIPELINE if names is None else names):
        if get_pass(name)(g, ctx):
            changed.append(name)
        if debug:
            g.verify()
    return changed
