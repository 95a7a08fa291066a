"""The code generator that compiled graphs use, registered by the layer above the graph.

The graph layer traces, optimises, plans and runs graphs; rendering their fused regions as
C is ``tessera.codegen``'s job, one layer up. That layer registers itself here when it is
imported (an upper layer extends a lower one by registration, never the other way), and the
pass pipeline and the executor ask through these functions (its passes, decompose and
outline, join the pipeline through ``tessera.graph.passes.register_pass``). With no
generator registered, or one that is switched off, graphs run every node with its NumPy
kernel.

>>> isinstance(enabled(), bool)
True
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CodeGenerator", "register", "enabled", "compile_fused"]


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
