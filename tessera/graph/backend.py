"""The code generator that compiled graphs use, registered by the layer above the graph.

The graph layer traces, optimises, plans and runs graphs; rendering their fused regions as
C is ``tessera.codegen``'s job, one layer up. That layer registers itself here when it is
imported (an upper layer extends a lower one by registration, never the other way), and the
pass pipeline and the executor ask through these functions (its passes, decompose and
outline, join the pipeline through ``tessera.graph.passes.register_pass``). With no
generator registered, or one that is switched off, graphs run every node with its NumPy
kernel.

A *program generator* (``register_program``; ``tessera.deploy`` registers one) goes further
for inference graphs: it turns runs of nodes that all have C rules into one compiled C
function each, called once per step instead of one executor step per node.
``TESSERA_GRAPH_PROGRAM`` switches it: ``auto`` (the default: on with the code generator,
for runs long enough to pay for a compile), ``1`` (every run it can, whatever its length),
``0`` (off: the executor runs every node).

>>> isinstance(enabled(), bool)
True
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CodeGenerator", "register", "enabled", "compile_fused", "register_program",
           "program_mode", "program"]


@dataclass
class CodeGenerator:
    """``enabled()``: whether it generates code now; ``compile_fused(nodes)``: {fused node:
    ``fn(out, *arrays)``}."""

    enabled: Callable[[], bool]
    compile_fused: Callable[[list], dict]


_GENERATOR: list[CodeGenerator] = []


def register(generator: CodeGenerator) -> None:
    """Make ``generator`` the one compiled graphs use (replacing any earlier one)."""
    _GENERATOR[:] = [generator]


def enabled() -> bool:
    """Whether a registered generator will compile fused regions."""
    return bool(_GENERATOR) and _GENERATOR[0].enabled()


def compile_fused(nodes: list) -> dict:
    """{node: C kernel ``fn(out, *arrays)``} for the fused ``nodes`` of one graph; empty when
    no generator is on."""
    return _GENERATOR[0].compile_fused(nodes) if enabled() else {}


_PROGRAM: list[Callable] = []


def register_program(make: Callable) -> None:
    """Let inference graphs run as programs: ``make(graph, tensors, force)`` (the graph after
    the passes, its variables' tensors by name, whether ``TESSERA_GRAPH_PROGRAM=1`` asks for
    every run it can compile) returns an object with the executor's ``run``, ``profile``
    and ``memory_stats`` (and ``describe()``), or None when no run is worth one."""
    _PROGRAM[:] = [make]


def program_mode() -> str:
    """``TESSERA_GRAPH_PROGRAM`` as "auto", "on" or "off" (ValueError for another value).

    >>> program_mode() in ("auto", "on", "off")
    True
    """
    raw = os.environ.get("TESSERA_GRAPH_PROGRAM", "auto").strip().lower()
    modes = {"auto": "auto", "": "auto", "1": "on", "on": "on", "true": "on", "0": "off",
             "off": "off", "false": "off"}
    if raw not in modes:
        raise ValueError(f"TESSERA_GRAPH_PROGRAM={raw!r}: expected auto, 1 or 0")
    return modes[raw]


def program(g, tensors: dict):
    """An inference graph ``g`` as the registered program generator runs it, or None (no
    generator, switched off, or nothing in ``g`` worth a program)."""
    mode = program_mode()
    if mode == "off" or not _PROGRAM or (mode == "auto" and not enabled()):
        return None
    return _PROGRAM[0](g, tensors, mode == "on")
